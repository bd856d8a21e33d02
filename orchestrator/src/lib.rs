//! memra-orch: the declarative gate orchestrator.
//!
//! Data flows one way, one folder per stage, each using only the stages listed before it:
//!
//! - [`words`]: the vocabulary every stage shares (digests, exit codes, verdicts, a run's
//!   outcome, located errors, redaction, escaping);
//! - [`machine`]: the GPUs, their health and the machine-wide leases;
//! - [`plan`]: the validated plan (cells, pins, resources, dependencies) with what it
//!   requires and declares;
//! - [`gate`]: what a gate leaves (its attempt folder, `checks.jsonl`, artifacts) and how it
//!   is judged;
//! - [`receipt`]: the receipt tree and the commit runs are filed under;
//! - [`load`]: manifest text → raw serde structs → matrix expansion → the plan;
//! - [`run`]: the runner, its scheduler, events and executors;
//! - [`history`], [`diff`], [`report`] (listeners, summaries, the HTML report, notify) and
//!   [`bisect`]: reading runs back;
//! - [`cmd`]: the command line (`cmd::cli` holds the clap types) and one module per
//!   subcommand that turns them into the library's options; nothing below `cmd` knows the
//!   command line exists.

pub mod bisect;
pub mod cmd;
pub mod diff;
pub mod gate;
pub mod history;
pub mod load;
pub mod machine;
pub mod plan;
pub mod receipt;
pub mod report;
pub mod run;
pub mod words;
