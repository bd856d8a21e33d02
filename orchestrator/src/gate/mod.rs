//! What a gate leaves and how it is judged: the files of an attempt folder opened safely
//! ([`attempt_file`], [`packed`] for packed runs), its `checks.jsonl` read by the protocol
//! ([`checks`]), the planted defect's expected failures ([`canary`]) and the safetensors
//! artifacts read as numbers ([`tensors`]) and compared under a policy ([`judge`]).

pub mod attempt_file;
pub mod canary;
pub mod checks;
pub mod judge;
pub mod packed;
pub mod tensors;
