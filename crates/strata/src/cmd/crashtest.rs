//! `strata crashtest`: crash a cache at seeded points and count what was lost.

use anyhow::Result;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

use crate::crashtest::soak::{soak, SoakSetup};
use crate::crashtest::thin::ThinTarget;
use crate::crashtest::{ext4, faults};
use crate::crashtest::{
    kill_point, powercut_run, CacheTarget, CrashTarget, KillSetup, Killed, PowercutSetup, WritecacheTarget,
};

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum CrashMode {
    /// Cut power to the cache and origin devices mid-request (in process), with --clients
    /// clients issuing reads and writes at once, devices that complete requests after a
    /// delay and out of order, background write-back, live mode switches, and in some points
    /// a flush that fails and loses what it covered. Unflushed writes are kept, dropped or
    /// torn at sector granularity, as the seed decides. After recovery, clean cached blocks
    /// must equal the origin, and the volume must read the same before and after write-back
    /// and eviction (else: unstable reads). Runs --points points per --cache-mode.
    Powercut,
    /// Kill -9 the server mid-request, restart it, verify (one client).
    Kill,
    /// A long run (--minutes) of rate-limited mixed fio load plus the oracle's workload on a
    /// served writeback cache, killed with SIGKILL at random moments and restarted; each
    /// restart is checked (cache check, oracle, fio --verify_only). A point is one kill.
    Soak,
    /// Record an ext4 workload (mkfs, files written and fsynced, renames, deletes) through
    /// nbdfuse + loop on devices that record every write, then cut it at its flush points
    /// (--points of them, every one for 0) on a plain volume, a writeback cache and a write log: after
    /// the journal replay `e2fsck -fn` must be clean and every fsynced file intact. Needs
    /// root, FUSE, loop devices, nbdfuse and e2fsprogs.
    Ext4,
    /// The fault matrix: EIO, ENOSPC and latency spikes, once and persistent, on the origin,
    /// the fast device's data area and its metadata area (--target thin: the pool's data and
    /// metadata devices) of a served volume (a writeback cache, a write log, a thin volume),
    /// under the oracle's workload with reads checked as they go, then the volume opened again
    /// and checked. Counts server crashes (requests without a reply) and silent data losses
    /// (wrong content read without an error). A point is one cell of the matrix (18 in all,
    /// 12 for thin; --points is ignored).
    Faults,
}

#[derive(Args, Debug)]
#[command(after_help = "\
In the powercut and kill modes, each point formats a small cache, drives it with a mix of
writes (some FUA), flushes, trims and write-zeroes (and in powercut mode reads, checked as
they complete, from several clients at once), crashes it, checks the metadata, restarts, and
verifies every sector: it must hold a value no flushed (or FUA) write superseded, never an
older value (a lost write) and never bytes no write produced.
--target thin: volume 1 of a pool (64 KiB blocks, three volumes' worth of data space) is
snapshotted at flush boundaries while it is written (powercut: with every client quiet;
kill: offline, the server stopped), and a snapshot is deleted at some points; every snapshot
must hold what the volume held when it was taken. strata's checker and thin_check (from
thin-provisioning-tools, required) run after the crash and after recovery.
The modes ext4, faults and soak are described above.
Powercut prints a line per cache mode, then the unstable reads (also check failures).
The last line reads: N points, L lost writes, C check failures.

Example:
  strata crashtest --points 200 --seed 1 --mode powercut --cache-mode all --clients 4
  strata crashtest --points 400 --seed 1 --mode powercut --target writecache
  strata crashtest --points 200 --seed 1 --mode kill
  strata crashtest --points 500 --seed 1 --mode powercut --target thin --clients 4
  strata crashtest --points 250 --seed 1 --mode kill --target thin
  strata crashtest --mode ext4 --points 0 --seed 1
  nice -n 19 strata crashtest --mode soak --minutes 30 --rate-iops 1500")]
pub struct CrashtestArgs {
    /// Points to run [default: 20] (powercut: per mode; ext4: flush points, 0 for every
    /// one). Not for faults (always every cell) or soak (one point per kill).
    #[arg(long)]
    pub points: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "powercut")]
    pub mode: CrashMode,
    /// Scratch directory (points that fail are kept there).
    #[arg(long, default_value = "/var/tmp/strata-crashtest")]
    pub dir: PathBuf,
    /// Powercut and kill: workload steps per point (powercut: requests of all clients
    /// together) [default: 400].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Powercut, kill and faults: the target: the cache, the write log (writecache), or a thin
    /// volume of a pool (in powercut, snapshotted at flush boundaries while it is written).
    #[arg(long, default_value = "cache", value_parser = ["cache", "writecache", "thin"])]
    pub target: String,
    /// The mode the target is created in (all: each in turn, --points each). Cache:
    /// writeback, writethrough, writearound, passthrough, cleaner; writecache: default, eager
    /// (no headroom, everything written back), paused (no write-back, writes go around);
    /// thin: zeroing, skip-zeroing (new blocks not zeroed). Kill runs only thin's modes (all:
    /// alternately).
    #[arg(long, default_value = "all", value_parser = ["writeback", "writethrough", "writearound", "passthrough", "cleaner", "default", "eager", "paused", "zeroing", "skip-zeroing", "all"])]
    pub cache_mode: String,
    /// Powercut: clients issuing requests at once [default: 4].
    #[arg(long)]
    pub clients: Option<usize>,
    /// Powercut: most a device takes to complete a write or flush, in microseconds
    /// [default: 1500].
    #[arg(long)]
    pub max_delay_us: Option<u64>,
    /// Soak: how long it runs [default: 30].
    #[arg(long)]
    pub minutes: Option<u64>,
    /// Soak: fio's IOPS cap, reads and writes together [default: 1500].
    #[arg(long)]
    pub rate_iops: Option<u32>,
}

impl CrashtestArgs {
    fn points(&self) -> u64 {
        self.points.unwrap_or(20)
    }

    fn steps(&self) -> usize {
        self.steps.unwrap_or(400)
    }

    fn clients(&self) -> usize {
        self.clients.unwrap_or(4).max(1)
    }

    /// Refuses an option the mode does not use, or a target's mode another target has, so a
    /// run never reports on something it did not test.
    fn check(&self, target_modes: &[String]) -> Result<()> {
        let mode = self.mode.to_possible_value().expect("every mode has a name");
        let mode = mode.get_name();
        let given = |name: &str, set: bool, modes: &[CrashMode]| match set && !modes.contains(&self.mode) {
            true => Err(anyhow::anyhow!("--{name} does not apply to --mode {mode}")),
            false => Ok(()),
        };
        use CrashMode::*;
        given("points", self.points.is_some(), &[Powercut, Kill, Ext4])?;
        given("steps", self.steps.is_some(), &[Powercut, Kill])?;
        given("clients", self.clients.is_some(), &[Powercut])?;
        given("max-delay-us", self.max_delay_us.is_some(), &[Powercut])?;
        given("minutes", self.minutes.is_some(), &[Soak])?;
        given("rate-iops", self.rate_iops.is_some(), &[Soak])?;
        given("target", self.target != "cache", &[Powercut, Kill, Faults])?;
        given("cache-mode", self.cache_mode != "all", &[Powercut, Kill])?;
        if self.cache_mode != "all" && !target_modes.contains(&self.cache_mode) {
            anyhow::bail!(
                "--mode {mode} --target {} runs {}, not {}",
                self.target,
                match target_modes.is_empty() {
                    true => "one mode only (leave --cache-mode out)".to_string(),
                    false => format!("the modes {}", target_modes.join(", ")),
                },
                self.cache_mode
            );
        }
        Ok(())
    }
}

pub fn run(a: CrashtestArgs) -> Result<()> {
    let target_modes = match (a.mode, a.target.as_str()) {
        (CrashMode::Powercut, "writecache") => WritecacheTarget.modes(),
        (CrashMode::Powercut, "thin") | (CrashMode::Kill, "thin") => ThinTarget::MODES.map(String::from).to_vec(),
        (CrashMode::Powercut, _) => CacheTarget.modes(),
        _ => Vec::new(),
    };
    a.check(&target_modes)?;
    let setup = KillSetup {
        target: match a.target.as_str() {
            "writecache" => Killed::Writecache,
            "thin" => Killed::Thin,
            _ => Killed::Cache,
        },
        strata: std::env::current_exe()?,
        dir: a.dir.clone(),
        origin_bytes: 16 << 20,
        cache_bytes: 8 << 20,
        steps: a.steps(),
        skip_zeroing: match a.cache_mode.as_str() {
            "zeroing" => Some(false),
            "skip-zeroing" => Some(true),
            _ => None,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    if let CrashMode::Ext4 = a.mode {
        return run_ext4(&a, &rt);
    }
    if let CrashMode::Faults = a.mode {
        return match a.target.as_str() {
            "writecache" => run_faults(&a, &rt, &WritecacheTarget),
            "thin" => run_faults(&a, &rt, &ThinTarget::new()?),
            _ => run_faults(&a, &rt, &CacheTarget),
        };
    }
    if let CrashMode::Powercut = a.mode {
        if a.target == "writecache" {
            return run_powercut(&a, &rt, &WritecacheTarget);
        }
        if a.target == "thin" {
            return run_powercut(&a, &rt, &ThinTarget::new()?);
        }
        return run_powercut(&a, &rt, &CacheTarget);
    }
    if let CrashMode::Soak = a.mode {
        let s = SoakSetup {
            strata: setup.strata,
            dir: a.dir.join("soak"),
            duration: std::time::Duration::from_secs(a.minutes.unwrap_or(30) * 60),
            rate_iops: a.rate_iops.unwrap_or(1500),
            seed: a.seed,
        };
        let r = rt.block_on(soak(&s))?;
        eprintln!("{r:?}");
        return finish(r.kills, r.lost, r.check_failures);
    }
    if setup.target == Killed::Thin {
        ThinTarget::new()?;
    }
    let (mut lost, mut failures) = (0u64, 0u64);
    for i in 0..a.points() {
        let seed = a.seed + i;
        let out = match a.mode {
            CrashMode::Kill => rt.block_on(kill_point(&setup, seed))?,
            CrashMode::Powercut | CrashMode::Soak | CrashMode::Ext4 | CrashMode::Faults => {
                unreachable!("handled above")
            }
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
    finish(a.points(), lost, failures)
}

fn run_powercut<T: CrashTarget>(a: &CrashtestArgs, rt: &tokio::runtime::Runtime, target: &T) -> Result<()> {
    let modes = if a.cache_mode == "all" { target.modes() } else { vec![a.cache_mode.clone()] };
    let setup = PowercutSetup {
        clients: a.clients(),
        steps: (a.steps() / a.clients()).max(4),
        max_delay: std::time::Duration::from_micros(a.max_delay_us.unwrap_or(1500)),
        ..PowercutSetup::default()
    };
    let (mut points, mut lost, mut failures, mut unstable) = (0, 0, 0, 0);
    let mut lines = Vec::new();
    for mode in &modes {
        let (mut m_lost, mut m_failures, mut m_unstable) = (0, 0, 0);
        let started = std::time::Instant::now();
        for i in 0..a.points() {
            let seed = a.seed + i;
            let out = rt.block_on(powercut_run(target, &setup, mode, seed))?;
            m_lost += out.verdict.lost;
            m_failures += out.check_failures as u64 + out.verdict.garbage;
            m_unstable += out.unstable;
            if out.verdict.lost + out.verdict.garbage > 0 || out.check_failures > 0 {
                eprintln!(
                    "{mode} seed {seed}: {:?}, {} check failures, {} unstable\n{}",
                    out.verdict, out.check_failures, out.unstable, out.detail
                );
            } else {
                let status = out.detail.lines().find(|l| l.starts_with("status")).unwrap_or_default();
                eprintln!("{mode} seed {seed}: ok ({} sectors verified; {status})", out.verdict.sectors);
                if std::env::var_os("STRATA_CRASHTEST_VERBOSE").is_some() {
                    eprintln!("{}", out.detail);
                }
            }
        }
        let per = started.elapsed().as_secs_f64() / a.points().max(1) as f64;
        let line = format!("{mode}: {} points, {m_lost} lost writes, {m_failures} check failures, {m_unstable} unstable reads ({per:.2} s per point)", a.points());
        eprintln!("{line}");
        lines.push(line);
        points += a.points();
        lost += m_lost;
        failures += m_failures;
        unstable += m_unstable;
    }
    for line in lines {
        println!("{line}");
    }
    println!("{unstable} unstable reads");
    finish(points, lost, failures)
}

fn run_faults<T: CrashTarget>(a: &CrashtestArgs, rt: &tokio::runtime::Runtime, t: &T) -> Result<()> {
    let (mut points, mut silent, mut failures, mut crashes) = (0, 0, 0, 0);
    let (mut requests, mut errors, mut injected) = (0, 0, 0);
    for (i, case) in faults::matrix(t).into_iter().enumerate() {
        let out = rt.block_on(faults::run_case(t, case, a.seed + i as u64, &a.dir))?;
        eprintln!(
            "{case:?}: {} requests, {} faults injected, {} error replies, {} server crashes, {} silent data losses, {} check failures",
            out.requests, out.injected, out.errors, out.server_crashes, out.silent_losses, out.check_failures
        );
        if !out.detail.is_empty() {
            eprintln!("{}", out.detail);
        }
        points += 1;
        requests += out.requests;
        errors += out.errors;
        injected += out.injected;
        crashes += out.server_crashes;
        silent += out.silent_losses;
        failures += out.check_failures;
    }
    eprintln!("{requests} requests, {injected} faults injected, {errors} error replies, {crashes} server crashes, {silent} silent data losses");
    finish(points, silent, failures + crashes)
}

fn run_ext4(a: &CrashtestArgs, rt: &tokio::runtime::Runtime) -> Result<()> {
    if let Some(why) = ext4::unavailable() {
        anyhow::bail!("--mode ext4 cannot run here: {why}");
    }
    let (mut points, mut lost, mut failures) = (0, 0, 0);
    for stack in ext4::Stack::ALL {
        let s = ext4::Ext4Setup {
            dir: a.dir.join(format!("ext4-{}", stack.name())),
            volume_bytes: 64 << 20,
            ops: 60,
            seed: a.seed,
            stack,
        };
        let sum = rt.block_on(ext4::replay(&s, a.points() as usize))?;
        eprintln!(
            "{} volume: {} flush points, {} cut, {} fsynced paths checked",
            stack.name(),
            sum.flush_points,
            sum.points,
            sum.paths
        );
        points += sum.points;
        lost += sum.lost;
        failures += sum.check_failures;
    }
    finish(points, lost, failures)
}

/// Prints the last line and fails the command if anything was lost or failed.
fn finish(points: u64, lost: u64, failures: u64) -> Result<()> {
    println!("{points} points, {lost} lost writes, {failures} check failures");
    if lost > 0 || failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}
