//! The sequences a backend holds, as the engine API sees them (length, capacity, where the
//! last prompt ended), and the rows of every kind of pass, checked against them before any
//! cache moves.
//!
//! Every backend keeps one [`Sequences`] and its own caches keyed by the same [`SeqId`]; the
//! checks, the canary rule ([`canary_token`]) and the planted bookkeeping defects live here
//! once, so a backend only allocates caches and computes rows ([`super::Backend::run_rows`]).

use std::collections::BTreeMap;

use super::{RowSpec, TokenSite, canary_token};
use crate::doors::{Doors, GateDefect};
use crate::error::EngineError;
use crate::seq::SeqId;

/// What the engine API knows of one open sequence.
#[derive(Debug, Clone, Copy)]
struct SeqLen {
    len: usize,
    capacity: usize,
    /// The length after the last prefill or prime (the canary's single-path site).
    prompt_end: usize,
}

/// The open sequences of one backend: their lengths and capacities, never their caches.
#[derive(Debug, Default)]
pub struct Sequences {
    open: BTreeMap<SeqId, SeqLen>,
}

impl Sequences {
    /// Whether `seq` may be opened with room for `capacity` positions of a model with context
    /// `n_ctx`: called before the backend allocates its caches.
    pub(crate) fn check_open(
        &self,
        seq: SeqId,
        capacity: usize,
        n_ctx: usize,
    ) -> Result<(), EngineError> {
        if self.open.contains_key(&seq) {
            return Err(EngineError::SequenceExists(seq));
        }
        if capacity == 0 || capacity > n_ctx {
            return Err(EngineError::BadCapacity { capacity, n_ctx });
        }
        Ok(())
    }

    /// Records `seq` open and empty, once the backend holds its caches.
    pub(crate) fn insert(&mut self, seq: SeqId, capacity: usize) {
        self.open.insert(
            seq,
            SeqLen {
                len: 0,
                capacity,
                prompt_end: 0,
            },
        );
    }

    /// Forgets `seq`; the backend frees its caches after.
    pub(crate) fn remove(&mut self, seq: SeqId) -> Result<(), EngineError> {
        self.open
            .remove(&seq)
            .map(|_| ())
            .ok_or(EngineError::UnknownSequence(seq))
    }

    fn get(&self, seq: SeqId) -> Result<&SeqLen, EngineError> {
        self.open.get(&seq).ok_or(EngineError::UnknownSequence(seq))
    }

    /// Number of positions `seq` holds.
    pub fn len(&self, seq: SeqId) -> Result<usize, EngineError> {
        self.get(seq).map(|s| s.len)
    }

    /// Room for `adding` more positions in `seq`: the first new position, or why there is
    /// none.
    pub(crate) fn reserve(&self, seq: SeqId, adding: usize) -> Result<usize, EngineError> {
        let st = self.get(seq)?;
        if st.len + adding > st.capacity {
            return Err(EngineError::CacheFull {
                seq,
                len: st.len,
                capacity: st.capacity,
                adding,
            });
        }
        Ok(st.len)
    }

    /// Appends `added` positions to `seq` after a pass computed them.
    pub(crate) fn commit(&mut self, seq: SeqId, added: usize) {
        if let Some(st) = self.open.get_mut(&seq) {
            st.len += added;
        }
    }

    /// [`Sequences::commit`] of a prompt's rows: all of them, except under
    /// `MEMRA_GATE_DEFECT=chunk-cache`, where a prompt that continues the sequence (its first
    /// row is not position 0) commits one too few. Marks where the prompt ended.
    pub(crate) fn commit_prompt(&mut self, doors: &Doors, rows: &[RowSpec]) {
        let Some(first) = rows.first() else { return };
        let continues = first.pos > 0;
        let added =
            if continues && rows.len() > 1 && doors.gate_defect == Some(GateDefect::ChunkCache) {
                rows.len() - 1
            } else {
                rows.len()
            };
        if let Some(st) = self.open.get_mut(&first.seq) {
            st.len += added;
            st.prompt_end = st.len;
        }
    }

    /// Cuts `seq` back to its first `to` positions. Refused ([`EngineError::RewindPast`])
    /// when `to` exceeds what the sequence holds. Under the test-only `rewind-slot` defect a
    /// rewind that drops anything keeps one rejected slot.
    pub(crate) fn rewind(
        &mut self,
        doors: &Doors,
        seq: SeqId,
        to: usize,
    ) -> Result<(), EngineError> {
        let st = self
            .open
            .get_mut(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        if to > st.len {
            return Err(EngineError::RewindPast {
                seq,
                len: st.len,
                to,
            });
        }
        st.len = if to < st.len && doors.gate_defect == Some(GateDefect::RewindSlot) {
            to + 1
        } else {
            to
        };
        Ok(())
    }

    /// The rows of a prompt appended to `seq`: checked against the vocabulary and the
    /// sequence's capacity, the canary rule applied at each [`TokenSite::Prompt`].
    pub(crate) fn prompt_rows(
        &self,
        doors: &Doors,
        n_vocab: usize,
        seq: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<RowSpec>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Empty { what: "prompt" });
        }
        for &t in tokens {
            check_token(t, n_vocab)?;
        }
        let start = self.reserve(seq, tokens.len())?;
        Ok(tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| {
                let site = TokenSite::Prompt { pos: start + i };
                RowSpec {
                    seq,
                    pos: start + i,
                    token: canary_token(doors, token, n_vocab, site),
                }
            })
            .collect())
    }

    /// The row of one single-sequence step of `seq` fed `token`, the canary rule applied at
    /// its [`TokenSite::Single`].
    pub(crate) fn single_row(
        &self,
        doors: &Doors,
        n_vocab: usize,
        seq: SeqId,
        token: u32,
    ) -> Result<RowSpec, EngineError> {
        check_token(token, n_vocab)?;
        let pos = self.reserve(seq, 1)?;
        let prompt_end = self.get(seq)?.prompt_end;
        let site = TokenSite::Single { pos, prompt_end };
        Ok(RowSpec {
            seq,
            pos,
            token: canary_token(doors, token, n_vocab, site),
        })
    }

    /// The rows of one batched decode step: one token per sequence, no sequence twice, every
    /// token in the vocabulary, and room in every cache. The canary rule applies to each row
    /// as a [`TokenSite::BatchRow`].
    pub(crate) fn batch_rows(
        &self,
        doors: &Doors,
        n_vocab: usize,
        seqs: &[SeqId],
        tokens: &[u32],
    ) -> Result<Vec<RowSpec>, EngineError> {
        if seqs.len() != tokens.len() {
            return Err(EngineError::BatchShape {
                seqs: seqs.len(),
                tokens: tokens.len(),
            });
        }
        if seqs.is_empty() {
            return Err(EngineError::Empty { what: "batch" });
        }
        let mut rows = Vec::with_capacity(seqs.len());
        for (b, (&seq, &token)) in seqs.iter().zip(tokens).enumerate() {
            check_token(token, n_vocab)?;
            if seqs[..b].contains(&seq) {
                return Err(EngineError::DuplicateInBatch { seq });
            }
            let pos = self.reserve(seq, 1)?;
            let site = TokenSite::BatchRow {
                row: b,
                rows: seqs.len(),
            };
            let token = canary_token(doors, token, n_vocab, site);
            rows.push(RowSpec { seq, pos, token });
        }
        Ok(rows)
    }

    /// The rows of one verify forward: one draft per sequence, no sequence twice, no empty
    /// draft, every token in the vocabulary, and room in every cache. Rows go sequence by
    /// sequence, each draft's positions in order. Verify rows are no canary site: the
    /// plumbing canary belongs to the prompt and decode paths.
    pub(crate) fn verify_rows(
        &self,
        n_vocab: usize,
        seqs: &[SeqId],
        drafts: &[Vec<u32>],
    ) -> Result<Vec<RowSpec>, EngineError> {
        if seqs.len() != drafts.len() {
            return Err(EngineError::BatchShape {
                seqs: seqs.len(),
                tokens: drafts.len(),
            });
        }
        if seqs.is_empty() {
            return Err(EngineError::Empty {
                what: "verify batch",
            });
        }
        let mut rows = Vec::with_capacity(drafts.iter().map(Vec::len).sum());
        for (b, (&seq, draft)) in seqs.iter().zip(drafts).enumerate() {
            if seqs[..b].contains(&seq) {
                return Err(EngineError::DuplicateInBatch { seq });
            }
            if draft.is_empty() {
                return Err(EngineError::Empty {
                    what: "verify draft",
                });
            }
            for &t in draft {
                check_token(t, n_vocab)?;
            }
            let start = self.reserve(seq, draft.len())?;
            rows.extend(draft.iter().enumerate().map(|(i, &token)| RowSpec {
                seq,
                pos: start + i,
                token,
            }));
        }
        Ok(rows)
    }
}

/// Refuses a token outside the vocabulary.
fn check_token(token: u32, n_vocab: usize) -> Result<(), EngineError> {
    if (token as usize) < n_vocab {
        Ok(())
    } else {
        Err(EngineError::BadToken { token, n_vocab })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(lens: &[(u32, usize)]) -> Sequences {
        let mut s = Sequences::default();
        for &(id, cap) in lens {
            s.check_open(SeqId(id), cap, 64).unwrap();
            s.insert(SeqId(id), cap);
        }
        s
    }

    #[test]
    fn opening_twice_or_past_the_context_is_refused() {
        let s = open(&[(0, 8)]);
        assert!(matches!(
            s.check_open(SeqId(0), 8, 64),
            Err(EngineError::SequenceExists(_))
        ));
        assert!(matches!(
            s.check_open(SeqId(1), 65, 64),
            Err(EngineError::BadCapacity { .. })
        ));
        assert!(matches!(
            s.check_open(SeqId(1), 0, 64),
            Err(EngineError::BadCapacity { .. })
        ));
    }

    #[test]
    fn rows_are_refused_before_any_position_is_taken() {
        let d = Doors::default();
        let mut s = open(&[(0, 4), (1, 4)]);
        let p = s.prompt_rows(&d, 10, SeqId(0), &[1, 2, 3]).unwrap();
        assert_eq!(p.iter().map(|r| r.pos).collect::<Vec<_>>(), [0, 1, 2]);
        s.commit_prompt(&d, &p);
        assert_eq!(s.len(SeqId(0)).unwrap(), 3);
        assert!(matches!(
            s.prompt_rows(&d, 10, SeqId(0), &[1, 2]),
            Err(EngineError::CacheFull { .. })
        ));
        assert!(matches!(
            s.batch_rows(&d, 10, &[SeqId(1), SeqId(1)], &[1, 2]),
            Err(EngineError::DuplicateInBatch { .. })
        ));
        assert!(matches!(
            s.batch_rows(&d, 10, &[SeqId(1)], &[10]),
            Err(EngineError::BadToken { .. })
        ));
        assert!(matches!(
            s.verify_rows(10, &[SeqId(1)], &[vec![]]),
            Err(EngineError::Empty { .. })
        ));
        let v = s
            .verify_rows(10, &[SeqId(0), SeqId(1)], &[vec![4], vec![5, 6]])
            .unwrap();
        assert_eq!(
            v.iter().map(|r| (r.seq.0, r.pos)).collect::<Vec<_>>(),
            [(0, 3), (1, 0), (1, 1)]
        );
        assert_eq!(s.len(SeqId(1)).unwrap(), 0, "rows alone move nothing");
    }

    #[test]
    fn the_single_row_canary_hits_the_first_step_after_the_prompt() {
        let on = Doors {
            gate_canary: true,
            ..Doors::default()
        };
        let mut s = open(&[(0, 8)]);
        let p = s.prompt_rows(&on, 10, SeqId(0), &[1, 1]).unwrap();
        assert_eq!(p[1].token, 2, "prompt position 1");
        s.commit_prompt(&on, &p);
        assert_eq!(s.single_row(&on, 10, SeqId(0), 9).unwrap().token, 0);
        s.commit(SeqId(0), 1);
        assert_eq!(s.single_row(&on, 10, SeqId(0), 9).unwrap().token, 9);
    }

    #[test]
    fn the_bookkeeping_defects_move_one_position() {
        let chunk = Doors {
            gate_defect: Some(GateDefect::ChunkCache),
            ..Doors::default()
        };
        let mut s = open(&[(0, 8)]);
        let first = s.prompt_rows(&chunk, 10, SeqId(0), &[1, 2]).unwrap();
        s.commit_prompt(&chunk, &first);
        assert_eq!(s.len(SeqId(0)).unwrap(), 2, "a first prompt commits all");
        let more = s.prompt_rows(&chunk, 10, SeqId(0), &[3, 4]).unwrap();
        s.commit_prompt(&chunk, &more);
        assert_eq!(
            s.len(SeqId(0)).unwrap(),
            3,
            "a continuing one commits one too few"
        );
        let slot = Doors {
            gate_defect: Some(GateDefect::RewindSlot),
            ..Doors::default()
        };
        s.rewind(&Doors::default(), SeqId(0), 2).unwrap();
        assert_eq!(s.len(SeqId(0)).unwrap(), 2);
        s.commit(SeqId(0), 2);
        s.rewind(&slot, SeqId(0), 2).unwrap();
        assert_eq!(
            s.len(SeqId(0)).unwrap(),
            3,
            "the planted defect keeps one slot"
        );
        assert!(matches!(
            s.rewind(&slot, SeqId(0), 9),
            Err(EngineError::RewindPast { .. })
        ));
    }
}
