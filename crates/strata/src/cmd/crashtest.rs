//! `strata crashtest`: crash a writeback cache at seeded points and count what was lost.

use anyhow::Result;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

use crate::crashtest::{kill_point, powercut_point, KillSetup};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CrashMode {
    /// Cut power to the cache and origin devices mid-request (in process): unflushed writes
    /// are kept, dropped or torn at sector granularity, as the seed decides.
    Powercut,
    /// Kill -9 the server mid-request, restart it, verify.
    Kill,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Each point formats a small writeback cache over a file origin, drives it with a random mix of
writes (some FUA), flushes, trims and write-zeroes, crashes it, checks the metadata, restarts,
and verifies every sector: it must hold its last flushed (or FUA) value or something written
later, never an older value (a lost write) and never bytes no write produced.
The last line reads: N points, L lost writes, C check failures.

Example:
  strata crashtest --points 1000 --seed 1 --mode powercut
  strata crashtest --points 200 --seed 1 --mode kill")]
pub struct CrashtestArgs {
    #[arg(long, default_value_t = 20)]
    pub points: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "powercut")]
    pub mode: CrashMode,
    /// Scratch directory (points that fail are kept there).
    #[arg(long, default_value = "/var/tmp/strata-crashtest")]
    pub dir: PathBuf,
    /// Workload steps per point.
    #[arg(long, default_value_t = 400)]
    pub steps: usize,
}

pub fn run(a: CrashtestArgs) -> Result<()> {
    let setup = KillSetup {
        strata: std::env::current_exe()?,
        dir: a.dir.clone(),
        origin_bytes: 16 << 20,
        cache_bytes: 8 << 20,
        steps: a.steps,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (mut lost, mut failures) = (0u64, 0u64);
    for i in 0..a.points {
        let seed = a.seed + i;
        let out = match a.mode {
            CrashMode::Kill => rt.block_on(kill_point(&setup, seed))?,
            CrashMode::Powercut => rt.block_on(powercut_point(setup.origin_bytes, setup.cache_bytes, a.steps, seed))?,
        };
        let bad = out.verdict.lost + out.verdict.garbage;
        lost += out.verdict.lost;
        failures += out.check_failures as u64 + out.verdict.garbage;
        if bad > 0 || out.check_failures > 0 {
            eprintln!("seed {seed}: {:?}, {} check failures\n{}", out.verdict, out.check_failures, out.detail);
        } else {
            eprintln!("seed {seed}: ok ({} sectors verified)", out.verdict.sectors);
        }
    }
    println!("{} points, {lost} lost writes, {failures} check failures", a.points);
    if lost > 0 || failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}
