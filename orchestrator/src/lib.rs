//! memra-orch: the declarative gate orchestrator.
//!
//! Data flows one way: manifest text → raw serde structs ([`manifest`]) → validated
//! [`plan::Plan`] (cells and their DAG, [`graph`]) → [`schedule`] → runner events ([`run`],
//! [`events`]) → listeners ([`report`], which files the [`receipt`] tree) → [`diff`].
//!
//! The command line is two layers on top: [`cli`] holds the clap types and [`cmd`] one
//! module per subcommand that turns them into the library's options; nothing below `cmd`
//! knows the command line exists.

pub mod attempt_file;
pub mod attest;
pub mod bisect;
pub mod canary;
pub mod cli;
pub mod cmd;
pub mod commit;
pub mod compare;
pub mod declared_inputs;
pub mod diagnostics;
pub mod diff;
pub mod digest;
pub mod diskfull;
pub mod events;
pub mod executor;
pub mod exit;
pub mod fingerprint;
pub mod gpus;
pub mod graph;
pub mod health;
pub mod history;
pub mod lease;
pub mod load;
pub mod manifest;
pub mod matrix;
pub mod name_clash;
pub mod notify;
pub mod outcome;
pub mod packed;
pub mod plan;
pub mod protocol;
pub mod receipt;
pub mod redact;
pub mod report;
pub mod require;
pub mod run;
pub mod schedule;
pub mod subst;
pub mod tensors;
pub mod verdict;
