//! The orchestrator's integration tests, one test binary (as just's `tests/lib.rs`): every
//! file here is a module of it, and the shared harnesses (`run_support`, `diff_support`)
//! are plain modules the others use. One binary links the library once instead of once per
//! file. Insta names snapshots after the module path, `integration__<module>__<name>.snap`.

mod diff_support;
mod run_support;

mod any_engine_manifest;
mod any_engine_verdicts;
mod attest_pins;
mod bisect_commits;
mod compare_artifacts;
mod compare_cells;
mod contrib_nightly;
mod declared_inputs;
mod device_faults;
mod diff_quantify;
mod diff_trees;
mod gpu_leases;
mod gpus_cli;
mod history_nights;
mod history_parts;
mod history_steps;
mod hostile_input;
mod hostile_receipts;
mod housekeeping_cli;
mod index_concurrency;
mod isolation_env;
mod isolation_timeout;
mod isolation_tmp;
mod layers;
mod manifest_batteries;
mod manifest_errors;
mod manifest_matrix;
mod manifests_gpu;
mod output_cap;
mod output_memory;
mod packed_runs;
mod plan_output;
mod process_lifetime;
mod python_gates;
mod receipts_tree;
mod report_html;
mod run_cron;
mod run_diskfull;
mod run_events;
mod run_exec_node;
mod run_filter;
mod run_history;
mod run_interrupt;
mod run_metrics;
mod run_reps;
mod run_require;
mod run_verdicts;
mod schedule_gpus;
mod secret_ids;
mod slurm_cluster;
mod smoke_manifest;
mod summary_notify;
mod supervisor_attacks;
mod verdict_truth;
