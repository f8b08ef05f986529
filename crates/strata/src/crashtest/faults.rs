//! The fault matrix behind `strata crashtest --mode faults`: every fault class (EIO, ENOSPC,
//! latency spike; once or persistent) injected on each device under a target (the origin,
//! and the fast device's data area and metadata area: for a thin pool, the data device and
//! the metadata device), while the crash oracle's workload runs through the NBD server with
//! reads checked as they go. The targets are those of the power-cut runs (`CrashTarget`), in
//! their first mode: a writeback cache, a write log, a thin volume with block zeroing.
//!
//! Each case serves a fresh volume over RAM devices wrapped in `strata_io::fault` (in this
//! process, so the rules can be steered), runs 120 workload steps, adds the fault, runs 200
//! more (a persistent fault is removed after them: the device answers again), runs 80 more,
//! flushes, then reads the whole volume and shuts it down. The devices' content is then
//! opened again, as an operator's restart would, read whole and checked (the target's own
//! metadata checks included).
//! Counted:
//! - a **server crash**: a request that got no reply (the connection broke), or a server
//!   that no longer accepts a connection;
//! - a **silent data loss**: a read that succeeded with content other than the sector's
//!   latest value (or, after a failed write, its value before or the failed write's; after a
//!   failed trim, zeroes or anything ever written there), or a sector whose final content is
//!   not its last durable value or later (the crash oracle), before or after the restart;
//! - a check failure: metadata errors after the restart, or a flush still failing once the
//!   devices answer again; but once a flush has failed, a flush that succeeds before the
//!   volume is restarted.
//!
//! A request that fails is fine when it is the fault's doing: it is counted, and the sectors
//! it touched may hold the old or the new content from then on.

use super::{decode, payload, workload, CrashTarget, Oracle, Step, Val, SECTOR};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use strata_io::fault::{Effect, FaultDev, Faults, Ops, Rule};
use strata_io::mem::MemDev;
use strata_io::{BlockDev, ErrorKind};

/// The volume's size.
const VOLUME_BYTES: u64 = 16 << 20;
const CACHE_BYTES: u64 = 4 << 20;
const STEPS_BEFORE: usize = 120;
const STEPS_FAULTY: usize = 200;
const STEPS_AFTER: usize = 80;

/// Where the fault is: the origin (a thin pool's data device), or the fast device's data
/// area or metadata area (a thin pool's metadata device is all metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Origin,
    CacheData,
    Metadata,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Eio,
    Enospc,
    Latency,
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub target: Target,
    pub class: Class,
    pub persistent: bool,
}

/// Every cell: 3 devices (2 for a target whose fast device is all metadata) x 3 classes x
/// once/persistent.
pub fn matrix<T: CrashTarget>(t: &T) -> Vec<Case> {
    let mut v = Vec::new();
    let targets: &[Target] = match t.fast_data_area() {
        true => &[Target::Origin, Target::CacheData, Target::Metadata],
        false => &[Target::Origin, Target::Metadata],
    };
    for &target in targets {
        for class in [Class::Eio, Class::Enospc, Class::Latency] {
            for persistent in [false, true] {
                v.push(Case { target, class, persistent });
            }
        }
    }
    v
}

#[derive(Debug, Default, Clone)]
pub struct CaseOutcome {
    pub requests: u64,
    /// Requests that got an error reply.
    pub errors: u64,
    /// Faults the device injected (errors and delays).
    pub injected: u64,
    pub server_crashes: u64,
    /// Sectors read back (during the run and at the end) with content they may not hold.
    pub silent_losses: u64,
    pub check_failures: u64,
    pub detail: String,
}

/// What a read of each sector may return now.
struct Current(Vec<Vec<Val>>);

impl Current {
    fn range(offset: u64, len: u64) -> std::ops::Range<usize> {
        (offset / SECTOR) as usize..((offset + len) / SECTOR) as usize
    }

    /// Records a step's outcome: done, it replaces what the sectors hold; failed, it may
    /// have landed or not, sector by sector. A failed trim may have dropped a cached copy
    /// and not yet the origin's: the sectors may then read as anything ever written there
    /// (`Val::Trimmed`, as in the crash oracle).
    fn apply(&mut self, step: &Step, ok: bool) {
        let (val, offset, len) = match *step {
            Step::Write { id, offset, len, .. } => (Val::Id(id), offset, len),
            Step::Trim { offset, len } => (Val::Trimmed, offset, len),
            Step::Zero { offset, len } => (Val::Zero, offset, len),
            Step::Flush => return,
        };
        for s in &mut self.0[Self::range(offset, len)] {
            if ok {
                // A trimmed sector reads as zeroes or as what it held.
                if val == Val::Trimmed {
                    s.push(Val::Zero);
                } else {
                    s.clear();
                    s.push(val);
                }
            } else {
                s.push(val);
            }
        }
    }

    /// Sectors of a successful read holding something they may not. `rolled_back`: a flush
    /// failed and the volume serves what it last committed (a thin pool, as dm-thin's does):
    /// a sector may also hold what a crash now could leave.
    fn wrong(&self, offset: u64, data: &[u8], oracle: &Oracle, rolled_back: bool) -> u64 {
        let first = offset / SECTOR;
        data.chunks(SECTOR as usize)
            .enumerate()
            .filter(|(i, d)| {
                let sector = first + *i as u64;
                let may = &self.0[sector as usize];
                let fits = matches!(decode(sector, d), Some(v) if may.contains(&v)
                    || (may.contains(&Val::Trimmed) && oracle.ever_written(sector, v)));
                !(fits || (rolled_back && oracle.verify_sector(sector, d)))
            })
            .count() as u64
    }
}

fn rule(case: Case, data_offset: Option<u64>) -> Rule {
    // No data offset: the fast device is all metadata, and has no data-area cells.
    let data_offset = data_offset.unwrap_or(CACHE_BYTES);
    let range = match case.target {
        Target::Origin => None,
        Target::CacheData => Some(data_offset..CACHE_BYTES),
        Target::Metadata => Some(0..data_offset),
    };
    let ops = Ops::READ | Ops::WRITE | Ops::FLUSH;
    let mut r = match case.class {
        Class::Eio => Rule::new(ops, Effect::Fail(ErrorKind::Io)),
        Class::Enospc => Rule::new(ops, Effect::Fail(ErrorKind::NoSpace)),
        Class::Latency if case.persistent => Rule::delay(Ops::ANY, Duration::from_millis(20)).probability(0.2, 7),
        Class::Latency => Rule::delay(Ops::ANY, Duration::from_millis(300)),
    };
    if let Some(range) = range {
        r = r.range(range);
    }
    if case.persistent {
        r
    } else {
        r.once()
    }
}

type UnixClient = strata_nbd::client::Client<tokio::net::UnixStream>;

fn server_errno(e: &std::io::Error) -> Option<u32> {
    e.get_ref()?.downcast_ref::<strata_nbd::client::ServerError>().map(|s| s.0)
}

/// The content of `dev`, in RAM: what a restart would open.
async fn image(dev: &dyn BlockDev) -> anyhow::Result<Arc<MemDev>> {
    let copy = MemDev::new(dev.size());
    let data = dev.read(0, strata_io::Buf::zeroed(dev.size() as usize)).await?;
    copy.write(0, data, false).await?;
    Ok(Arc::new(copy))
}

/// Runs one cell of the matrix on a volume of `t`, serving in `dir`.
pub async fn run_case<T: CrashTarget>(t: &T, case: Case, seed: u64, dir: &Path) -> anyhow::Result<CaseOutcome> {
    let (origin, origin_faults) = FaultDev::new(MemDev::new(t.origin_bytes(VOLUME_BYTES)));
    let (cache, cache_faults) = FaultDev::new(MemDev::new(CACHE_BYTES));
    let (origin, cache) = (Arc::new(origin), Arc::new(cache));
    let mode = t.modes().into_iter().next().expect("a target has a mode");
    let dev = Arc::new(t.create(cache.clone(), origin.clone(), &mode, seed).await?);
    let size = dev.size();
    let data_offset = t.data_offset(&*cache).await?;
    let faults: &Faults = if case.target == Target::Origin { &origin_faults } else { &cache_faults };

    std::fs::create_dir_all(dir)?;
    let sock = dir.join(format!("f{seed}.sock"));
    let _ = std::fs::remove_file(&sock);
    let export = strata_nbd::Export {
        name: "vol".into(),
        description: dev.describe(),
        dev: dev.clone() as Arc<dyn BlockDev>,
        read_only: false,
    };
    let server = strata_nbd::Server::new(vec![export], strata_nbd::Limits::default()).map_err(anyhow::Error::msg)?;
    let serving = {
        let (server, listener) = (server.clone(), tokio::net::UnixListener::bind(&sock)?);
        tokio::spawn(async move { server.serve_unix(listener).await })
    };

    let mut out = CaseOutcome::default();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfa17);
    let steps = workload(seed, STEPS_BEFORE + STEPS_FAULTY + STEPS_AFTER, size);
    let mut oracle = Oracle::new(size);
    if t.stale_reads(&mode) {
        oracle.allow_stale();
    }
    let mut current = Current(vec![vec![Val::Zero]; (size / SECTOR) as usize]);
    let mut c = UnixClient::connect_unix(&sock, "vol").await?;
    for (i, step) in steps.iter().enumerate() {
        if i == STEPS_BEFORE {
            faults.add(rule(case, data_offset));
        }
        if i == STEPS_BEFORE + STEPS_FAULTY {
            faults.clear();
        }
        oracle.issue(step);
        out.requests += 1;
        let r = match *step {
            Step::Write { id, offset, len, fua } => {
                c.write(offset, &payload(id, offset / SECTOR, len / SECTOR), fua).await
            }
            Step::Flush => c.flush().await,
            Step::Trim { offset, len } => c.trim(offset, len as u32).await,
            Step::Zero { offset, len } => c.write_zeroes(offset, len as u32, false).await,
        };
        let ok = r.is_ok();
        match r {
            Ok(()) => oracle.complete(step),
            Err(e) if server_errno(&e).is_some() => {
                out.errors += 1;
                oracle.fail(step);
            }
            Err(e) => {
                out.server_crashes += 1;
                out.detail.push_str(&format!("step {i}: no reply: {e}\n"));
                oracle.fail(step);
                c = UnixClient::connect_unix(&sock, "vol").await?;
            }
        }
        current.apply(step, ok);
        // A read after most steps, checked against what the sectors may hold now.
        if rng.gen_bool(0.5) {
            let sectors = rng.gen_range(1..=256);
            let offset = rng.gen_range(0..=size / SECTOR - sectors) * SECTOR;
            out.requests += 1;
            match c.read(offset, (sectors * SECTOR) as u32).await {
                Ok(d) => {
                    let rolled_back = t.serves_last_commit_when_stopped() && t.stopped(&dev);
                    let wrong = current.wrong(offset, &d, &oracle, rolled_back);
                    if wrong > 0 {
                        out.silent_losses += wrong;
                        out.detail.push_str(&format!("step {i}: read at {offset}: {wrong} sectors wrong\n"));
                    }
                }
                Err(e) if server_errno(&e).is_some() => out.errors += 1,
                Err(e) => {
                    out.server_crashes += 1;
                    out.detail.push_str(&format!("step {i}: read got no reply: {e}\n"));
                    c = UnixClient::connect_unix(&sock, "vol").await?;
                }
            }
        }
    }
    // The devices answer again: a flush must now succeed, and everything reads back; unless
    // a flush failed meanwhile: then the volume has stopped acknowledging anything (what the
    // failed flush covered may be gone) and must go on refusing until it is restarted.
    let stopped = t.stopped(&dev);
    oracle.issue(&Step::Flush);
    match (c.flush().await, stopped) {
        (Ok(()), false) => oracle.complete(&Step::Flush),
        (Err(_), true) => {}
        (Err(e), false) => {
            out.check_failures += 1;
            out.detail.push_str(&format!("flush after the fault was gone: {e}\n"));
        }
        (Ok(()), true) => {
            out.check_failures += 1;
            out.detail.push_str("a volume stopped by a failed flush acknowledged a flush\n");
        }
    }
    // A stopped volume may refuse reads of cached blocks; it is read after the restart.
    if !stopped {
        match super::read_region(&mut c, 0, size).await {
            Ok(image) => {
                let v = oracle.verify(&image);
                out.silent_losses += v.lost + v.garbage + current.wrong(0, &image, &oracle, false);
                if v.lost + v.garbage > 0 {
                    out.detail.push_str(&format!("final read: {v:?}\n"));
                }
            }
            Err(e) => {
                out.check_failures += 1;
                out.detail.push_str(&format!("final read: {e}\n"));
            }
        }
    }
    c.disconnect().await?;
    server.shutdown();
    let _ = serving.await;
    server.wait_idle().await;
    let shut_down = !stopped
        && match dev.shutdown().await {
            Ok(()) => true,
            Err(e) => {
                out.check_failures += 1;
                out.detail.push_str(&format!("shutdown: {e}\n"));
                false
            }
        };
    drop(dev);
    // The operator's restart: open what the devices hold, and check it all again.
    let (cache, origin) = (image(&*cache).await?, image(&*origin).await?);
    if shut_down && t.marked_clean(&*cache).await? == Some(false) {
        out.check_failures += 1;
        out.detail.push_str("a shutdown that succeeded left the volume marked unclean\n");
    }
    let (vol, mut problems) = t.reopen(cache.clone(), origin).await?;
    match vol.read(0, strata_io::Buf::zeroed(size as usize)).await {
        Ok(again) => {
            let v = oracle.verify(&again);
            out.silent_losses += v.lost + v.garbage;
            if v.lost + v.garbage > 0 {
                out.detail.push_str(&format!("read after the restart: {v:?}\n"));
            }
        }
        Err(e) => problems.push(format!("read after the restart: {e}")),
    }
    problems.extend(t.check(&vol).await);
    problems.extend(t.close(vol, cache).await);
    if !problems.is_empty() {
        out.check_failures += 1;
        out.detail.push_str(&format!("after the restart: {problems:?}\n"));
    }
    let counters = faults.counters();
    out.injected = counters.errors() + counters.delayed;
    let _ = std::fs::remove_file(&sock);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `steps` (with their outcomes) on one sector and says which of `reads` (write ids,
    /// 0 for zeroes) the checker takes as wrong.
    fn wrong_reads(steps: &[(Step, bool)], reads: &[u64]) -> Vec<u64> {
        wrong_reads_in(steps, reads, false)
    }

    fn wrong_reads_in(steps: &[(Step, bool)], reads: &[u64], stopped: bool) -> Vec<u64> {
        let (mut oracle, mut current) = (Oracle::new(SECTOR), Current(vec![vec![Val::Zero]]));
        for (step, ok) in steps {
            oracle.issue(step);
            if *ok {
                oracle.complete(step)
            } else {
                oracle.fail(step)
            }
            current.apply(step, *ok);
        }
        let data = |id: u64| if id == 0 { vec![0; SECTOR as usize] } else { payload(id, 0, 1) };
        reads.iter().copied().filter(|&id| current.wrong(0, &data(id), &oracle, stopped) > 0).collect()
    }

    #[test]
    fn a_failed_trim_may_leave_anything_written_there_and_a_done_one_zeroes_or_the_latest() {
        let write = |id| (Step::Write { id, offset: 0, len: SECTOR, fua: true }, true);
        let trim = |ok| (Step::Trim { offset: 0, len: SECTOR }, ok);
        assert_eq!(wrong_reads(&[write(1), write(2)], &[0, 1, 2, 3]), [0, 1, 3]);
        assert_eq!(wrong_reads(&[write(1), write(2), trim(true)], &[0, 1, 2, 3]), [1, 3]);
        assert_eq!(wrong_reads(&[write(1), write(2), trim(false)], &[0, 1, 2, 3]), [3]);
        assert_eq!(wrong_reads(&[write(1), trim(false), write(2)], &[0, 1, 2]), [0, 1]);
        let failed_write = (Step::Write { id: 3, offset: 0, len: SECTOR, fua: false }, false);
        assert_eq!(wrong_reads(&[write(1), write(2), failed_write], &[0, 1, 2, 3, 4]), [0, 1, 4]);
    }

    #[test]
    fn a_volume_rolled_back_by_a_failed_flush_may_read_what_a_crash_would_leave() {
        let write = |id, fua| (Step::Write { id, offset: 0, len: SECTOR, fua }, true);
        let steps = [write(1, true), write(2, false), (Step::Flush, false)];
        assert_eq!(wrong_reads_in(&steps, &[0, 1, 2, 3], false), [0, 1, 3]);
        assert_eq!(wrong_reads_in(&steps, &[0, 1, 2, 3], true), [0, 3], "write 2 may be lost, not write 1");
    }
}
