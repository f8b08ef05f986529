//! The policy simulator behind `strata sim`: replay block traces (or fio-compatible synthetic
//! workloads) through the cache policies of `strata-policy` and report hit ratios, promotions
//! and metadata cost.
//!
//! The policies here are the very code the cache target runs; this crate only feeds them.
//! Modules: [`trace`] reads and parses trace files, [`synthetic`] generates fio's random
//! distributions, [`sim`] splits requests into cache-block accesses and runs the
//! policy × size matrix, [`cost`] charges each decision to HDD/SSD latency models
//! (`--cost`), and [`report`] formats tables, CSV and plots. The command line is the `strata`
//! binary's (`crates/strata/src/cmd/sim.rs`).

pub mod cost;
pub mod report;
pub mod sim;
pub mod synthetic;
pub mod trace;

pub use sim::{replay, replay_hits, run_matrix, split_requests, BlockAccess, Counts, Ops, RunResult, Workload};
