//! Activation traces: the q8_1 blocks a backend produced at every quantization site of a
//! forward pass, so the tie-following oracle (`crate::reference::forward_following`) can
//! adopt the backend's side of a rounding tie instead of counting a flip as error.
//!
//! It owns the record types and the lookup by (sequence, position, layer, site). It does
//! not record anything itself (the backend does, only when tracing was enabled) and it does
//! not judge anything (the oracle does).

use std::collections::BTreeMap;
use std::fmt;

use memra_kernels::blocks::BlockQ8_1;

use crate::seq::SeqId;

/// Where in a layer the activations are quantized to q8_1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Site {
    /// The normed residual feeding `wq`, `wk` and `wv`.
    AttnIn,
    /// The attention output feeding `wo`.
    AttnOut,
    /// The normed residual feeding `w_gate` and `w_up`.
    FfnIn,
    /// The SwiGLU output feeding `w_down`.
    FfnDownIn,
    /// The final normed residual feeding the output head (recorded with layer `n_layer`).
    HeadIn,
}

impl Site {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Site::AttnIn => "attn-in",
            Site::AttnOut => "attn-out",
            Site::FfnIn => "ffn-in",
            Site::FfnDownIn => "ffn-down-in",
            Site::HeadIn => "head-in",
        }
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which composition produced a site's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Composition {
    /// rmsnorm applied first, the normed values quantized (and every site without a norm).
    Separate,
    /// `x·g` quantized, the norm factor `r` applied after the matvec.
    Fused,
}

/// The identity of one recorded site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SiteKey {
    pub seq: SeqId,
    pub pos: usize,
    /// The layer index; `n_layer` for [`Site::HeadIn`].
    pub layer: usize,
    pub site: Site,
}

/// What the backend produced at one site of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteRecord {
    pub composition: Composition,
    /// The row's q8_1 blocks, `width / 32` of them.
    pub blocks: Vec<BlockQ8_1>,
    /// The fused tier's norm factor, applied after the matvec (`None` when separate).
    pub r: Option<f32>,
}

/// Every site recorded since tracing was enabled or the trace was last taken. A site
/// computed twice (a sequence closed and reopened under the same id) keeps the later record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActivationTrace {
    sites: BTreeMap<SiteKey, SiteRecord>,
}

impl ActivationTrace {
    /// An empty trace.
    pub fn new() -> ActivationTrace {
        ActivationTrace::default()
    }

    /// Records one site, replacing an earlier record of the same key.
    pub fn record(&mut self, key: SiteKey, rec: SiteRecord) {
        self.sites.insert(key, rec);
    }

    /// The record of one site, if the backend produced it.
    pub fn get(&self, key: &SiteKey) -> Option<&SiteRecord> {
        self.sites.get(key)
    }

    /// Mutable access to one record (tests plant defects in traces this way).
    pub fn get_mut(&mut self, key: &SiteKey) -> Option<&mut SiteRecord> {
        self.sites.get_mut(key)
    }

    /// How many sites are recorded.
    pub fn len(&self) -> usize {
        self.sites.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }

    /// Every record in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&SiteKey, &SiteRecord)> {
        self.sites.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn a_recomputed_site_keeps_the_later_record() {
        let key = SiteKey {
            seq: SeqId(0),
            pos: 3,
            layer: 1,
            site: Site::FfnIn,
        };
        let block = |d: f32| BlockQ8_1 {
            d: f16::from_f32(d),
            s: f16::ZERO,
            qs: [0; 32],
        };
        let mut t = ActivationTrace::new();
        for d in [1.0, 2.0] {
            t.record(
                key,
                SiteRecord {
                    composition: Composition::Separate,
                    blocks: vec![block(d)],
                    r: None,
                },
            );
        }
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(&key).unwrap().blocks[0].d, f16::from_f32(2.0));
        assert!(
            t.get(&SiteKey {
                site: Site::AttnIn,
                ..key
            })
            .is_none()
        );
    }
}
