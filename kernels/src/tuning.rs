//! The kernels' performance switches (`MEMRA_MMA`, `MEMRA_PDL`, `MEMRA_MMA_RESIDENT`,
//! `MEMRA_SMALL_BATCH`, `MEMRA_CLAIM_SM`, `MEMRA_PROLOGUES`, `MEMRA_PROMPT_TILE`), read once
//! into one [`Tuning`]
//! value that a device is opened with.
//!
//! Every switch promises the same bits either way: it picks between kernel forms or launch
//! arrangements whose float composition is identical. The engine reads them beside its
//! numeric doors and reports them in every gate's doors row, so a battery cell that sets one
//! is told apart from one that does not, and pin attestation can check the promise. This
//! module only parses; [`crate::cuda::Gpu::open`] applies the value.

/// A performance switch between kernel forms with an automatic default: `0` never takes the
/// form, `1` always where it can run, `auto` (or unset) leaves the choice to the launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormSwitch {
    Never,
    Auto,
    Always,
}

impl FormSwitch {
    /// The value as the doors row and the variable spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            FormSwitch::Never => "0",
            FormSwitch::Auto => "auto",
            FormSwitch::Always => "1",
        }
    }

    /// The switch stored as `self as u8`.
    pub(crate) fn from_index(index: u8) -> Self {
        match index {
            0 => FormSwitch::Never,
            2 => FormSwitch::Always,
            _ => FormSwitch::Auto,
        }
    }
}

/// Every performance switch, as read when the process starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// `MEMRA_MMA`: batched mmvq matvecs take the int8 tensor-core forms where the device
    /// has the MMA (sm_80 and newer); off, the warp form runs.
    pub mma: bool,
    /// `MEMRA_PDL`: launches carry the programmatic-dependent-launch attribute.
    pub pdl: bool,
    /// `MEMRA_MMA_RESIDENT`: when batched tensor-core matvecs keep their activations
    /// resident in shared memory.
    pub mma_resident: FormSwitch,
    /// `MEMRA_SMALL_BATCH`: when batches of two to four rows take the small-batch warp forms.
    pub small_batch: FormSwitch,
    /// `MEMRA_CLAIM_SM`: short latency-bound single-row launches hold their multiprocessors
    /// alone.
    pub claim_sm: bool,
    /// `MEMRA_PROLOGUES`: single-row matvecs compute their norm step as a prologue, and rows
    /// too wide for that take the norm step split over blocks (the engine applies it).
    pub prologues: bool,
    /// `MEMRA_PROMPT_TILE`: split-K attention of rows that read one cache (a prompt pass's)
    /// copies each chunk of K and V rows into shared memory once per tile of rows instead of
    /// every row reading it from L2.
    pub prompt_tile: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            mma: true,
            pdl: true,
            mma_resident: FormSwitch::Auto,
            small_batch: FormSwitch::Auto,
            claim_sm: true,
            prologues: true,
            prompt_tile: true,
        }
    }
}

/// A switch set to a value it does not accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TuningIssue {
    pub variable: &'static str,
    pub value: String,
    /// What it accepts, as a sentence fragment: "accepted values are 0, 1".
    pub problem: &'static str,
}

const ON_OFF: &str = "accepted values are 0, 1";
const FORM: &str = "accepted values are 0, 1, auto";

impl Tuning {
    /// The variables, in the order the doors row lists them.
    pub const VARIABLES: [&'static str; 7] = [
        "MEMRA_MMA",
        "MEMRA_PDL",
        "MEMRA_MMA_RESIDENT",
        "MEMRA_SMALL_BATCH",
        "MEMRA_CLAIM_SM",
        "MEMRA_PROLOGUES",
        "MEMRA_PROMPT_TILE",
    ];

    /// Reads the switches from the process environment; see [`Tuning::from_lookup`].
    pub fn from_env() -> (Tuning, Vec<TuningIssue>) {
        Tuning::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the switches through `lookup` (a variable name to its value, `None` when
    /// unset). An empty value counts as unset. A value a switch does not accept leaves that
    /// switch at its default and is returned as an issue, so the caller decides whether it
    /// refuses to start (the engine does, as for its doors) or reports it.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Tuning, Vec<TuningIssue>) {
        let mut tuning = Tuning::default();
        let mut issues = Vec::new();
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let flags: [(&'static str, &mut bool); 5] = [
            ("MEMRA_MMA", &mut tuning.mma),
            ("MEMRA_PDL", &mut tuning.pdl),
            ("MEMRA_CLAIM_SM", &mut tuning.claim_sm),
            ("MEMRA_PROLOGUES", &mut tuning.prologues),
            ("MEMRA_PROMPT_TILE", &mut tuning.prompt_tile),
        ];
        for (name, slot) in flags {
            if let Some(v) = get(name) {
                match v.trim() {
                    "0" => *slot = false,
                    "1" => *slot = true,
                    _ => issues.push(TuningIssue {
                        variable: name,
                        value: v,
                        problem: ON_OFF,
                    }),
                }
            }
        }
        let forms: [(&'static str, &mut FormSwitch); 2] = [
            ("MEMRA_MMA_RESIDENT", &mut tuning.mma_resident),
            ("MEMRA_SMALL_BATCH", &mut tuning.small_batch),
        ];
        for (name, slot) in forms {
            if let Some(v) = get(name) {
                match v.trim() {
                    "0" => *slot = FormSwitch::Never,
                    "1" => *slot = FormSwitch::Always,
                    "auto" => *slot = FormSwitch::Auto,
                    _ => issues.push(TuningIssue {
                        variable: name,
                        value: v,
                        problem: FORM,
                    }),
                }
            }
        }
        (tuning, issues)
    }

    /// The switches as `(doors-row key, value)` pairs, in [`Tuning::VARIABLES`] order: the
    /// key is the variable's name without `MEMRA_`, lower-cased. On/off switches are
    /// booleans; form switches are `"0"`, `"1"` or `"auto"`.
    pub fn fields(&self) -> [(&'static str, serde_json::Value); 7] {
        use serde_json::Value;
        [
            ("mma", Value::Bool(self.mma)),
            ("pdl", Value::Bool(self.pdl)),
            ("mma_resident", Value::from(self.mma_resident.as_str())),
            ("small_batch", Value::from(self.small_batch.as_str())),
            ("claim_sm", Value::Bool(self.claim_sm)),
            ("prologues", Value::Bool(self.prologues)),
            ("prompt_tile", Value::Bool(self.prompt_tile)),
        ]
    }

    /// One line for logs and headers: `mma=1 pdl=1 mma_resident=auto …`.
    pub fn summary(&self) -> String {
        self.fields()
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::Bool(b) => format!("{k}={}", u8::from(*b)),
                serde_json::Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(pairs: &[(&str, &str)]) -> (Tuning, Vec<TuningIssue>) {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Tuning::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn unset_switches_are_the_defaults() {
        assert_eq!(read(&[]), (Tuning::default(), vec![]));
        assert_eq!(read(&[("MEMRA_PDL", "  ")]), (Tuning::default(), vec![]));
    }

    #[test]
    fn every_switch_is_read() {
        let (t, issues) = read(&[
            ("MEMRA_MMA", "0"),
            ("MEMRA_PDL", "0"),
            ("MEMRA_MMA_RESIDENT", "1"),
            ("MEMRA_SMALL_BATCH", "0"),
            ("MEMRA_CLAIM_SM", "0"),
            ("MEMRA_PROLOGUES", " 0 "),
            ("MEMRA_PROMPT_TILE", "0"),
        ]);
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(
            t,
            Tuning {
                mma: false,
                pdl: false,
                mma_resident: FormSwitch::Always,
                small_batch: FormSwitch::Never,
                claim_sm: false,
                prologues: false,
                prompt_tile: false,
            }
        );
        assert_eq!(
            t.summary(),
            "mma=0 pdl=0 mma_resident=1 small_batch=0 claim_sm=0 prologues=0 prompt_tile=0"
        );
        let keys: Vec<&str> = t.fields().iter().map(|(k, _)| *k).collect();
        let from_vars: Vec<String> = Tuning::VARIABLES
            .iter()
            .map(|v| v.trim_start_matches("MEMRA_").to_lowercase())
            .collect();
        assert_eq!(keys, from_vars);
    }

    #[test]
    fn bad_values_are_reported_and_leave_the_default() {
        let (t, issues) = read(&[("MEMRA_PDL", "off"), ("MEMRA_SMALL_BATCH", "2")]);
        assert_eq!(t, Tuning::default());
        assert_eq!(
            issues,
            vec![
                TuningIssue {
                    variable: "MEMRA_PDL",
                    value: "off".into(),
                    problem: ON_OFF,
                },
                TuningIssue {
                    variable: "MEMRA_SMALL_BATCH",
                    value: "2".into(),
                    problem: FORM,
                },
            ]
        );
    }
}
