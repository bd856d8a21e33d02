//! The gates: programs that check exactness properties of the engine and report through the
//! gate protocol (DESIGN §5). `decode-batch-gate` ([`decode_batch`]) proves batched decode
//! and the pipeline split exact; `reference-gate` ([`reference`]) holds every backend to the
//! host f32 oracle and the loader to its banked goldens; `exact-gate` ([`exact`]) holds the
//! engine statistically to the exact float64 model of its weights; `sampling-gate`
//! ([`sampling`], its statistics in [`chi_square`]) holds the sampled tokens to an
//! independent reference sampler; `spec-gate` ([`spec`]) holds speculative decoding (draft,
//! verify, rewind) to plain greedy decoding; `cuda-check` ([`cuda_check`]) holds
//! the CUDA backend to the oracle, the CPU backend and itself on a GPU.
//!
//! This module tree owns the gates' logic; the binaries in `src/bin/` only call `main`. The
//! rows, the checks-file writer and the exit codes are `memra-protocol`'s; [`output`]
//! keeps what is the engine's own (the printed report, the doors header, logit dumps). The
//! engine under test (backends, doors, oracle) lives elsewhere and is used through its public
//! API, so a gate checks exactly what users run. `docs/gates.md` is the user's guide.

pub mod chi_square;
pub mod cuda_check;
pub mod decode_batch;
pub mod exact;
pub mod goldens;
pub mod ledger;
pub mod output;
pub mod reference;
pub mod sampling;
pub mod spec;
pub mod workload;
