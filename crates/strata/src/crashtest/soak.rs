//! The soak behind `strata crashtest --mode soak`: a long run of mixed fio load against a
//! writeback cache served by `strata serve`, killed with SIGKILL at random moments and
//! restarted, checking after every restart that nothing acknowledged and flushed was lost.
//!
//! The volume (a 384 MiB file origin behind a 64 MiB cache, 64 KiB blocks, so blocks are
//! evicted and written back all the time) is split in three regions:
//! - A (0-128 MiB): each cycle runs one fio job to completion (`randwrite` of 64 MiB, block
//!   sizes from 4 KiB to 256 KiB, crc32c verify reading it all back, a final flush); after the next crash, `fio
//!   --verify_only` of the same job must still find every block it wrote.
//! - C (128-320 MiB): fio `randrw` load with inline verification (`verify_backlog`), running
//!   when the server is killed.
//! - B (320-384 MiB): the crash oracle's workload (writes from 512 B to 256 KiB, some FUA,
//!   flushes, trims, write-zeroes; see `crashtest`), also running at the kill: after the
//!   restart every sector must hold its last durable value or something written later.
//!
//! Each cycle: the oracle's load on B starts, job A runs, fio's load on C joins, and after a
//! seeded 3-30 s the server gets SIGKILL; then `strata cache check`, restart, verify B and A. fio runs are rate-limited so the soak takes little CPU.

use super::{apply_at, create_cache, read_region, target_check, workload, Killed, Oracle, ServerProc};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const ORIGIN_BYTES: u64 = 384 * MIB;
const CACHE_BYTES: u64 = 64 * MIB;
const REGION_A: (u64, u64) = (0, 128 * MIB);
const REGION_C: (u64, u64) = (128 * MIB, 192 * MIB);
const REGION_B: (u64, u64) = (320 * MIB, 64 * MIB);
/// Oracle workload steps generated per cycle (the kill comes long before the end).
const ORACLE_STEPS: usize = 200_000;
/// Pause between oracle steps, so the oracle's client stays a light load.
const ORACLE_PAUSE: Duration = Duration::from_millis(2);

pub struct SoakSetup {
    pub strata: PathBuf,
    pub dir: PathBuf,
    pub duration: Duration,
    /// fio's IOPS cap (reads and writes together).
    pub rate_iops: u32,
    pub seed: u64,
}

#[derive(Debug, Default)]
pub struct SoakReport {
    pub kills: u64,
    pub lost: u64,
    /// Cache check failures, sectors holding bytes never written, fio verify failures.
    pub check_failures: u64,
    pub fio_jobs: u64,
    pub fio_verify_only: u64,
    pub oracle_steps: u64,
    pub sectors_verified: u64,
}

fn fio_base(sock: &Path, rate_iops: u32, rw: &str) -> Command {
    let mut c = Command::new("fio");
    // Jobs as threads: a forked job process starts its own session and would outlive a
    // killed fio.
    c.arg(format!("--rw={rw}"))
        .args(["--thread", "--ioengine=nbd", "--iodepth=8", "--bssplit=4k/40:8k/20:16k/20:64k/15:256k/5"])
        .arg(format!("--uri=nbd+unix:///vol?socket={}", sock.display()))
        // One cap per direction: reads and writes together stay under rate_iops.
        .arg(format!("--rate_iops={}", (rate_iops / 2).max(1)))
        // No verify state files (fio leaves them in its working directory when killed).
        .arg("--verify_state_save=0")
        .current_dir(sock.parent().expect("the socket is in the soak's directory"))
        .stdin(Stdio::null());
    c
}

/// The job on region A; `verify_only` replays it to check what it wrote. Random writes only:
/// fio 3.33's `--verify_only` replay of a `randrw` job assigns the blocks' verify seeds
/// differently from the original run and reports "bad header" on intact data.
fn fio_job_a(sock: &Path, rate_iops: u32, seed: u64, verify_only: bool) -> Command {
    let mut c = fio_base(sock, rate_iops, "randwrite");
    c.arg(format!("--name=a{seed}"))
        .arg(format!("--offset={}", REGION_A.0))
        .arg(format!("--size={}", REGION_A.1))
        .arg(format!("--io_size={}", REGION_A.1 / 2))
        .arg(format!("--randseed={seed}"))
        .args(["--verify=crc32c", "--verify_fatal=1", "--end_fsync=1"]);
    if verify_only {
        c.arg("--verify_only");
    }
    c
}

/// The load on region C, until killed with the server.
fn fio_load_c(sock: &Path, rate_iops: u32, seed: u64) -> Command {
    let mut c = fio_base(sock, rate_iops, "randrw");
    c.arg(format!("--name=c{seed}"))
        .arg(format!("--offset={}", REGION_C.0))
        .arg(format!("--size={}", REGION_C.1))
        .arg(format!("--randseed={seed}"))
        .args(["--time_based", "--runtime=3600", "--verify=crc32c", "--verify_backlog=64", "--verify_fatal=1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// Whether fio's error output reports a verification failure (as opposed to the lost
/// connection every killed run ends with).
fn fio_verify_failed(stderr: &str) -> bool {
    ["verify: bad", "verify failed", "bad magic header", "bad header", "crc32c: verify"]
        .iter()
        .any(|m| stderr.contains(m))
}

/// Collects a fio run whose server was killed: fio's nbd engine can spin on the dead
/// connection instead of exiting, so it gets a few seconds, then SIGKILL (its jobs are
/// threads, see `fio_base`, so nothing is left behind).
fn stop_fio(mut fio: std::process::Child) -> std::io::Result<std::process::Output> {
    for _ in 0..50 {
        if fio.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if fio.try_wait()?.is_none() {
        fio.kill()?;
    }
    fio.wait_with_output()
}

async fn run_fio(mut c: Command) -> anyhow::Result<std::process::Output> {
    Ok(tokio::task::spawn_blocking(move || c.output()).await??)
}

/// Runs the oracle's workload over region B until the connection breaks (the kill), with
/// the step in flight at that moment issued but not completed. Returns the oracle and how
/// many steps completed.
async fn oracle_load(sock: PathBuf, mut oracle: Oracle, seed: u64) -> (Oracle, u64) {
    let steps = workload(seed, ORACLE_STEPS, REGION_B.1);
    let Ok(mut c) = strata_nbd::client::Client::connect_unix(&sock, "vol").await else { return (oracle, 0) };
    let mut done = 0;
    for step in &steps {
        oracle.issue(step);
        if apply_at(&mut c, step, REGION_B.0).await.is_err() {
            break;
        }
        oracle.complete(step);
        done += 1;
        tokio::time::sleep(ORACLE_PAUSE).await;
    }
    (oracle, done)
}

pub async fn soak(s: &SoakSetup) -> anyhow::Result<SoakReport> {
    let _ = std::fs::remove_dir_all(&s.dir);
    std::fs::create_dir_all(&s.dir)?;
    let (origin, cache, sock, log) =
        (s.dir.join("origin.img"), s.dir.join("cache.img"), s.dir.join("s.sock"), s.dir.join("server.log"));
    create_cache(&s.strata, &origin, ORIGIN_BYTES, &cache, CACHE_BYTES, "64KiB")?;
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed ^ 0x50a4);
    let mut report = SoakReport::default();
    let mut oracle = Oracle::new(REGION_B.1);
    // The last job A that ran to completion: verified again after each crash.
    let mut last_a: Option<u64> = None;
    let started = Instant::now();
    let mut server = ServerProc::start(&s.strata, &sock, Killed::Cache, &cache, &log)?;
    for cycle in 0.. {
        let seed = s.seed * 10_000 + cycle;
        let load = tokio::spawn(oracle_load(sock.clone(), oracle, seed));
        let a = run_fio(fio_job_a(&sock, s.rate_iops, seed, false)).await?;
        report.fio_jobs += 1;
        if a.status.success() {
            last_a = Some(seed);
        } else {
            report.check_failures += 1;
            eprintln!("cycle {cycle}: fio job on region A failed:\n{}", String::from_utf8_lossy(&a.stderr));
        }
        let c_load = fio_load_c(&sock, s.rate_iops, seed).spawn()?;
        let hold = Duration::from_millis(rng.gen_range(3_000..30_000));
        tokio::time::sleep(hold).await;
        server.kill();
        report.kills += 1;
        let (o, steps) = load.await?;
        oracle = o;
        report.oracle_steps += steps;
        let c_out = tokio::task::spawn_blocking(move || stop_fio(c_load)).await??;
        let c_err = String::from_utf8_lossy(&c_out.stderr);
        if fio_verify_failed(&c_err) {
            report.check_failures += 1;
            eprintln!("cycle {cycle}: fio load on region C found bad data:\n{c_err}");
        }

        let mut problems = Vec::new();
        if let Some(r) = target_check(&s.strata, Killed::Cache, &cache)? {
            report.check_failures += 1;
            problems.push(format!("cache check after the kill: {r}"));
        }
        server = ServerProc::start(&s.strata, &sock, Killed::Cache, &cache, &log)?;
        let image = {
            let mut c = strata_nbd::client::Client::connect_unix(&sock, "vol").await?;
            let image = read_region(&mut c, REGION_B.0, REGION_B.1).await?;
            c.disconnect().await?;
            image
        };
        let v = oracle.verify(&image);
        report.lost += v.lost;
        report.check_failures += v.garbage;
        report.sectors_verified += v.sectors;
        if v.lost + v.garbage > 0 {
            problems.push(format!("region B after the kill: {v:?}"));
        }
        oracle = Oracle::from_image(&image);
        if let Some(a_seed) = last_a {
            let out = run_fio(fio_job_a(&sock, s.rate_iops, a_seed, true)).await?;
            report.fio_verify_only += 1;
            if !out.status.success() {
                report.check_failures += 1;
                problems.push(format!("fio --verify_only of job a{a_seed}: {}", String::from_utf8_lossy(&out.stderr)));
            }
        }
        let elapsed = started.elapsed();
        eprintln!(
            "cycle {cycle}: killed after {:.1} s of load, {steps} oracle steps; {} ({:.0} of {:.0} min)",
            hold.as_secs_f64(),
            if problems.is_empty() { "verified".to_string() } else { problems.join("; ") },
            elapsed.as_secs_f64() / 60.0,
            s.duration.as_secs_f64() / 60.0
        );
        if elapsed >= s.duration {
            break;
        }
    }
    server.stop()?;
    if let Some(r) = target_check(&s.strata, Killed::Cache, &cache)? {
        report.check_failures += 1;
        eprintln!("cache check after the final clean stop: {r}");
    }
    if report.lost == 0 && report.check_failures == 0 {
        let _ = std::fs::remove_dir_all(&s.dir);
    } else {
        eprintln!("kept {} for inspection", s.dir.display());
    }
    Ok(report)
}
