//! The machine a run uses: its GPUs ([`gpus`], from NVML or `--gpus`), their health around
//! every attempt ([`health`]) and the machine-wide leases that keep two runs off one GPU
//! ([`lease`]).

pub mod gpus;
pub mod health;
pub mod lease;
