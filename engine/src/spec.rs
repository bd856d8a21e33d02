//! Speculative decoding over the engine API: a prompt-lookup (n-gram) drafter, greedy
//! acceptance of one verify forward, and the loop that drives draft → verify → accept →
//! rewind over a batch of sequences, each with its own draft.
//!
//! This module owns the drafting rule, the acceptance rule and the bookkeeping of a round
//! (what the cache holds, which token is pending). The numbers come from
//! [`Backend::verify_batch`], which runs the batched path's composition, so the greedy stream
//! here is the one plain greedy decoding on the batched path produces, token for token.

use memra_kernels::twin;

use crate::backend::{Backend, Walk};
use crate::error::EngineError;
use crate::seq::SeqId;

/// The longest suffix the drafter looks up.
pub const NGRAM_MAX: usize = 3;

/// Up to `k` tokens continuing `history`: the tokens that followed an earlier occurrence of
/// its longest recurring suffix (of [`NGRAM_MAX`] tokens down to one), the most recent
/// occurrence that is followed by `k` tokens, else the most recent one (whose continuation
/// the end of the history clips). Empty when no suffix recurs.
pub fn propose(history: &[u32], k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let len = history.len();
    for n in (1..=NGRAM_MAX.min(len.saturating_sub(1))).rev() {
        let suffix = &history[len - n..];
        // Starts before the suffix itself whose n tokens equal it, latest first.
        let mut starts = (0..len - n).rev().filter(|&i| &history[i..i + n] == suffix);
        let Some(latest) = starts.next() else {
            continue;
        };
        let full = std::iter::once(latest)
            .chain(starts)
            .find(|&i| len - (i + n) >= k);
        let from = full.unwrap_or(latest) + n;
        return history[from..(from + k).min(len)].to_vec();
    }
    Vec::new()
}

/// Greedy acceptance: how many leading draft tokens equal the verify's choice at the column
/// before them (`argmax[j]` is the choice after verify input `j`; input 0 is the pending
/// token, input `j + 1` is `draft[j]`).
pub fn accept(draft: &[u32], argmax: &[u32]) -> usize {
    draft.iter().zip(argmax).take_while(|(d, a)| d == a).count()
}

/// How a round's draft is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafting {
    /// [`propose`], at most `k` tokens and never more than the stream still needs (so a
    /// round may verify the pending token alone).
    Lookup,
    /// [`propose`] filled up to exactly `k` tokens with the pending token, so every round
    /// verifies `k + 1` columns (the ppspec gate's fixed T).
    Fixed,
    /// [`Drafting::Lookup`] with sequence `i`'s draft capped at `k - i % k` tokens, so a
    /// batch of two or more sequences verifies drafts of different lengths in one forward
    /// whenever the drafter fills them (for `k` of 2 or more): the column offsets of a mixed
    /// batch are exercised by construction, not left to what the prompts happen to repeat.
    Staggered,
}

/// Counters of a speculative run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify forwards (one per round, whatever the batch).
    pub rounds: usize,
    /// Sequence-verifies: each sequence's part of each round.
    pub verifies: usize,
    /// Columns verified (ΣT over every sequence-verify).
    pub columns: usize,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Tokens emitted (accepted drafts plus one choice per sequence-verify).
    pub emitted: usize,
}

impl SpecStats {
    /// Emitted tokens per sequence-verify (1 without speculation).
    pub fn tokens_per_verify(&self) -> f64 {
        self.emitted as f64 / self.verifies.max(1) as f64
    }

    /// Accepted share of the drafted tokens.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// One round as the loop saw it, for gates that hold every column.
#[derive(Debug, Clone)]
pub struct Round {
    /// The sequences verified this round, in row order.
    pub seqs: Vec<SeqId>,
    /// Each sequence's verify input: the pending token, then the draft.
    pub inputs: Vec<Vec<u32>>,
    /// The verify logits, `[ΣT, n_vocab]`, sequence by sequence.
    pub logits: Vec<f32>,
    /// Each sequence's accepted draft tokens.
    pub accepted: Vec<usize>,
    /// Each sequence's length after the rewind.
    pub kept: Vec<usize>,
}

/// One sequence of a speculative run: primed with its prompt by the caller, with the token
/// the prompt's last logits chose (`first`, the stream's first token, not yet in the cache).
#[derive(Debug, Clone)]
pub struct SpecSeq {
    pub seq: SeqId,
    /// The prompt, for the drafter's history.
    pub prompt: Vec<u32>,
    pub first: u32,
}

/// Greedy speculative decoding of `seqs` until each has emitted `n_new` tokens (the first
/// included) or `on_token` returns true for a token it emitted (that token ends the stream
/// and is kept). `on_token(i, token)` sees every token of sequence `i`'s stream in order, the
/// first included, as it is decided. Each round drafts per sequence under `drafting` with at most `k` tokens, verifies
/// every unfinished sequence in one [`Backend::verify_batch`], accepts greedily and rewinds
/// each cache to the pending token plus its accepted drafts. `observe` sees every round.
/// Returns each sequence's stream and the counters. `verify` picks the walk: the backend's
/// `verify_batch` or `verify_batch_walk(Walk::Unsplit, …)`.
#[allow(clippy::too_many_arguments)]
pub fn speculate(
    be: &mut dyn Backend,
    seqs: &[SpecSeq],
    k: usize,
    n_new: usize,
    drafting: Drafting,
    unsplit: bool,
    on_token: &mut dyn FnMut(usize, u32) -> bool,
    observe: &mut dyn FnMut(&Round),
) -> Result<(Vec<Vec<u32>>, SpecStats), EngineError> {
    let n_vocab = be.config().n_vocab;
    let mut streams: Vec<Vec<u32>> = seqs.iter().map(|s| vec![s.first]).collect();
    if n_new == 0 {
        streams.iter_mut().for_each(Vec::clear);
        return Ok((streams, SpecStats::default()));
    }
    let mut done: Vec<bool> = seqs
        .iter()
        .enumerate()
        .map(|(i, s)| on_token(i, s.first) || n_new == 1)
        .collect();
    let mut stats = SpecStats {
        emitted: seqs.len(),
        ..SpecStats::default()
    };
    while done.iter().any(|d| !d) {
        let live: Vec<usize> = (0..seqs.len()).filter(|&i| !done[i]).collect();
        let mut inputs = Vec::with_capacity(live.len());
        for &i in &live {
            let stream = &streams[i];
            let pending = *stream.last().expect("a stream starts with its first token");
            let history: Vec<u32> = seqs[i].prompt.iter().chain(stream).copied().collect();
            let left = n_new - stream.len() - 1;
            let room = match drafting {
                Drafting::Lookup => k.min(left),
                Drafting::Fixed => k,
                Drafting::Staggered => (k - i % k.max(1)).min(left),
            };
            let mut draft = propose(&history, room);
            if drafting == Drafting::Fixed {
                draft.resize(k, pending);
            }
            stats.drafted += draft.len();
            let mut input = Vec::with_capacity(draft.len() + 1);
            input.push(pending);
            input.extend(draft);
            inputs.push(input);
        }
        let ids: Vec<SeqId> = live.iter().map(|&i| seqs[i].seq).collect();
        let before: Vec<usize> = ids
            .iter()
            .map(|&s| be.seq_len(s))
            .collect::<Result<_, _>>()?;
        let logits = if unsplit {
            be.verify_batch_walk(Walk::Unsplit, &ids, &inputs)?
        } else {
            be.verify_batch(&ids, &inputs)?
        };
        let mut accepted = Vec::with_capacity(live.len());
        let mut kept = Vec::with_capacity(live.len());
        let mut col = 0;
        for (j, &i) in live.iter().enumerate() {
            let t = inputs[j].len();
            let choice: Vec<u32> = logits[col * n_vocab..(col + t) * n_vocab]
                .chunks_exact(n_vocab)
                .map(twin::argmax)
                .collect();
            col += t;
            let m = accept(&inputs[j][1..], &choice);
            let len = before[j] + 1 + m;
            be.rewind(ids[j], len)?;
            let mut emit: Vec<u32> = inputs[j][1..=m].to_vec();
            emit.push(choice[m]);
            for tok in emit {
                if streams[i].len() == n_new {
                    break;
                }
                streams[i].push(tok);
                stats.emitted += 1;
                if on_token(i, tok) {
                    done[i] = true;
                    break;
                }
            }
            if streams[i].len() == n_new {
                done[i] = true;
            }
            stats.verifies += 1;
            stats.columns += t;
            stats.accepted += m;
            accepted.push(m);
            kept.push(len);
        }
        stats.rounds += 1;
        observe(&Round {
            seqs: ids,
            inputs,
            logits,
            accepted,
            kept,
        });
    }
    Ok((streams, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drafter_continues_the_latest_full_occurrence_of_the_longest_recurring_suffix() {
        // "1 2 3" recurs: its latest earlier occurrence is followed by 9 8.
        assert_eq!(propose(&[1, 2, 3, 7, 1, 2, 3, 9, 8, 5, 1, 2, 3], 2), [9, 8]);
        // Only a 1-gram recurs.
        assert_eq!(propose(&[4, 6, 5, 4], 3), [6, 5, 4]);
        // Clipped at the history's end when no occurrence has k tokens after it.
        assert_eq!(propose(&[1, 2, 1], 4), [2, 1]);
        // A repeating stream: the latest occurrence followed by k tokens, not the latest.
        assert_eq!(propose(&[7, 7, 7, 7, 7, 7, 7], 3), [7, 7, 7]);
        assert_eq!(propose(&[1, 2, 9, 1, 2, 8, 8, 1, 2], 2), [8, 8]);
        assert_eq!(propose(&[1, 2, 9, 1, 2, 8, 1, 2], 2), [8, 1]);
        assert_eq!(propose(&[1, 2, 9, 1, 2], 3), [9, 1, 2]);
        assert!(propose(&[1, 2, 3], 4).is_empty());
        assert!(propose(&[1, 1], 0).is_empty());
        assert!(propose(&[], 3).is_empty());
        assert!(propose(&[5], 3).is_empty());
    }

    #[test]
    fn acceptance_is_the_longest_agreeing_prefix() {
        assert_eq!(accept(&[4, 5, 6], &[4, 5, 7, 1]), 2);
        assert_eq!(accept(&[4, 5, 6], &[4, 5, 6, 1]), 3);
        assert_eq!(accept(&[4, 5, 6], &[3, 5, 6, 1]), 0);
        assert_eq!(accept(&[], &[3]), 0);
    }
}
