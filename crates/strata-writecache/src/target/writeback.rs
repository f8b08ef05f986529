//! Write-back: copying dirty slots to the origin, a batch at a time: the oldest dirty blocks
//! are taken, sorted by origin address, runs of adjacent blocks merged into one origin write
//! each (a few in flight at once, in address order), and the origin flushed once per batch
//! before the blocks count as clean. The
//! background task writes back continuously at the pace of bcache's controller
//! (`strata_policy::pacing`) while the dirty share is above `low_watermark`: flat out when
//! the origin is idle (no read missed the log and no write went around since the last
//! round), when the log is full, or with `cleaner` (everything); blocks dirty longer than
//! `max_age` go whatever the share; a batch takes at most `writeback_jobs` blocks. It evicts
//! the oldest clean blocks to keep `100 - high_watermark` percent of the slots free, and
//! commits at least every `autocommit_time` and after `autocommit_blocks` changes. A failed
//! origin write leaves its blocks dirty and the volume serving.

use super::state::SlotState;
use super::{lock_all, relaxed, Inner};
use crate::status::Tunables;
use futures::StreamExt;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Weak;
use std::time::{Duration, Instant};
use strata_io::{Buf, Error, Result, ZeroFlags};
use strata_policy::pacing::Pacer;

/// Most blocks one paced batch takes (one origin flush per batch), and most adjacent blocks
/// merged into one origin write.
pub(crate) const BATCH_MAX: usize = 256;
/// Most blocks one batch of a sweep in address order takes: the cleaner and `flush` drain
/// with one origin flush per this many blocks (128 MiB of 4 KiB blocks), so the origin's
/// flushes, and the queue emptying before each, do not bound the drain's rate.
const SWEEP_BATCH: usize = 32768;
/// Runs of one batch written to the origin at once.
const RUNS_IN_FLIGHT: usize = 4;
/// How often the background task looks when nothing wakes it.
const TICK: Duration = Duration::from_millis(20);

/// A dirty slot taken for write-back, with what its entry said when it was taken.
pub(super) struct Pick {
    pub block: u64,
    pub slot: u32,
    pub seq: u64,
    pub crc: u32,
    pub zero: bool,
}

/// Checks data read from slot `s` against its entry's checksum `crc` before it goes to the
/// origin: after a failed flush of the fast device a slot may hold another block's older
/// data, and copying that to the origin would make it permanent.
pub(super) fn verify_slot(b: u64, s: u32, crc: u32, data: &[u8]) -> Result<()> {
    if crc32c::crc32c(data) != crc {
        return Err(strata_io::Error::new(
            strata_io::ErrorKind::Corrupt,
            format!(
                "writecache: slot {s} does not hold block {b}'s data (the fast device lost a write); not written back"
            ),
        ));
    }
    Ok(())
}

/// Slots to write back in origin-address order (the cleaner and `flush` drain a log this
/// way, so a log full of blocks written at random offsets goes to the origin as one sweep of
/// large sequential writes); 4 bytes a dirty slot while it lasts.
#[derive(Default)]
pub(super) struct Sweep(VecDeque<u32>);

impl Inner {
    /// Writes back up to `max` of the oldest dirty blocks, or with `sweep` the next ones in
    /// origin-address order; returns how many became clean. Without a sweep it stops early
    /// when a stream is waiting to go around the log (see `copy_out`).
    pub(super) async fn writeback_batch(&self, max: usize, sweep: Option<&mut Sweep>) -> Result<usize> {
        let yield_to_streams = sweep.is_none();
        {
            let st = self.state.lock();
            st.check_running()?;
            if st.log_suspect {
                return Ok(0);
            }
        }
        let mut picks: Vec<Pick> = {
            let mut st = self.state.lock();
            let mut picks = Vec::new();
            let candidates: Vec<(u64, u32)> = match sweep {
                None => st.dirty_oldest().filter(|(_, s)| !st.writing_back.contains(s)).take(max).collect(),
                Some(Sweep(order)) => {
                    if order.is_empty() {
                        let mut all: Vec<(u64, u32)> = st.dirty_oldest().map(|(_, s)| (st.slot(s).block, s)).collect();
                        all.sort_unstable();
                        order.extend(all.into_iter().map(|(_, s)| s));
                    }
                    let mut out = Vec::with_capacity(max);
                    while out.len() < max {
                        let Some(s) = order.pop_front() else { break };
                        if st.state(s) == (SlotState::Live { dirty: true }) && !st.writing_back.contains(&s) {
                            out.push((st.slot(s).seq, s));
                        }
                    }
                    out
                }
            };
            for (seq, s) in candidates {
                st.writing_back.insert(s);
                st.pin(s);
                let sl = st.slot(s);
                picks.push(Pick { block: sl.block, slot: s, seq, crc: sl.data_crc, zero: st.zero(s) });
            }
            picks
        };
        if picks.is_empty() {
            return Ok(0);
        }
        picks.sort_unstable_by_key(|p| p.block);
        let guards = lock_all(&self.origin_locks, &self.stripes_of(picks.iter().map(|p| p.block))).await;
        let (written, failed) = self.copy_out(&picks, yield_to_streams).await;
        drop(guards);
        let mut st = self.state.lock();
        let mut cleaned = 0;
        for p in &picks {
            st.writing_back.remove(&p.slot);
            st.unpin(p.slot);
        }
        for (s, seq) in written {
            if st.mark_clean(s, seq) {
                cleaned += 1;
            }
        }
        drop(st);
        self.counters.writebacks.fetch_add(cleaned as u64, Relaxed);
        match failed {
            None => Ok(cleaned),
            Some(e) => {
                relaxed(&self.counters.writeback_errors);
                *self.last_error.lock() = Some(format!("write-back: {e}"));
                Err(e)
            }
        }
    }

    /// Copies the picked slots (sorted by block, pinned, their origin-write locks held) to the
    /// origin, adjacent blocks as one write, then flushes the origin; returns the (slot,
    /// sequence) of those written. A slot superseded by a newer copy after this starts still
    /// holds the data it was picked with (it is pinned): the newer copy goes to the origin
    /// later, and no write around the log can come between. With `yield_to_streams` it stops
    /// between runs once a large write waits to go around the log (the rest stays dirty and
    /// the locks are released when this returns). A run that fails stays dirty, and no run
    /// starts after it; those written are flushed and returned all the same, with the
    /// failure (an origin that fails some writes still drains, a run at a time).
    async fn copy_out(&self, picks: &[Pick], yield_to_streams: bool) -> (Vec<(u32, u64)>, Option<Error>) {
        // Skip what changed since it was picked (superseded copies are not written back).
        let current: Vec<&Pick> = {
            let st = self.state.lock();
            picks
                .iter()
                .filter(|p| st.state(p.slot) == (SlotState::Live { dirty: true }) && st.slot(p.slot).seq == p.seq)
                .collect()
        };
        let mut written = Vec::with_capacity(current.len());
        let seen = self.last_stream.load(Relaxed);
        let mut runs =
            current.chunk_by(|a, b| b.block == a.block + 1 && b.zero == a.zero).flat_map(|r| r.chunks(BATCH_MAX));
        // Up to RUNS_IN_FLIGHT runs at once, started in address order, so the origin sees a
        // queue of sequential writes rather than one write at a time with gaps between.
        let mut in_flight = futures::stream::FuturesOrdered::new();
        let mut failed = None;
        loop {
            while in_flight.len() < RUNS_IN_FLIGHT && failed.is_none() {
                if yield_to_streams && self.last_stream.load(Relaxed) != seen {
                    break;
                }
                let Some(run) = runs.next() else { break };
                in_flight.push_back(async move { self.copy_run(run).await.map(|()| run) });
            }
            // After a failure the runs in flight are still awaited: none may land after the
            // origin-write locks are released.
            match in_flight.next().await {
                None => break,
                Some(Ok(run)) => written.extend(run.iter().map(|p| (p.slot, p.seq))),
                Some(Err(e)) => failed = failed.or(Some(e)),
            }
        }
        if failed.is_some() && written.is_empty() {
            return (written, failed);
        }
        match self.origin_flush().await {
            Ok(()) => (written, failed),
            Err(e) => (Vec::new(), Some(failed.unwrap_or(e))),
        }
    }

    /// Copies one run of adjacent picked blocks to the origin as one write.
    pub(super) async fn copy_run(&self, run: &[&Pick]) -> Result<()> {
        let at = run[0].block * self.block;
        let len: u64 = run.iter().map(|p| self.block_len(p.block)).sum();
        if run[0].zero {
            self.origin.write_zeroes(at, len, ZeroFlags::default()).await?;
        } else {
            let reads = run
                .iter()
                .map(|p| self.cache.read(self.slot_offset(p.slot), Buf::zeroed(self.block_len(p.block) as usize)));
            let mut buf = Buf::zeroed(len as usize);
            let mut pos = 0usize;
            for (p, r) in run.iter().zip(futures::future::join_all(reads).await) {
                let d = r?;
                verify_slot(p.block, p.slot, p.crc, &d)?;
                buf[pos..pos + d.len()].copy_from_slice(&d);
                pos += d.len();
            }
            self.origin.write(at, buf, false).await?;
        }
        self.origin_writes.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Writes back until nothing is dirty (`flush` message, shutdown checks), in
    /// origin-address order.
    pub(crate) async fn writeback_all(&self) -> Result<()> {
        let mut sweep = Sweep::default();
        loop {
            if self.state.lock().counts().1 == 0 {
                return Ok(());
            }
            if self.writeback_batch(SWEEP_BATCH, Some(&mut sweep)).await? == 0 {
                tokio::task::yield_now().await;
            }
        }
    }

    /// Evicts the oldest clean blocks until `want` slots are free or being freed. Returns how
    /// many it evicted, and whether clean blocks it could not evict yet wait for a commit
    /// (`State::evictable`) while it is short of `want`.
    pub(super) fn evict(&self, want: u64) -> (usize, bool) {
        let mut st = self.state.lock();
        let (free, _) = st.counts();
        let pending = st.stale.values().map(|v| v.len() as u64).sum::<u64>();
        let short = want.saturating_sub(free + pending);
        let picks: Vec<u32> = st.evictable().take(usize::try_from(short).unwrap_or(usize::MAX)).collect();
        for &s in &picks {
            st.retire(s);
        }
        self.counters.evictions.fetch_add(picks.len() as u64, Relaxed);
        (picks.len(), (picks.len() as u64) < short && st.has_clean())
    }

    /// Drops every clean block from the log and clears their entries on disk; fails if some
    /// are left (writes kept coming, or a block has more old copies than commits allowed).
    pub(super) async fn evict_all_clean(&self) -> Result<()> {
        // A clean block whose entry is not on disk waits for a commit to write it, and stale
        // copies clear one per block per commit, oldest first.
        let mut left = 0;
        for _ in 0..64 {
            self.evict(u64::MAX);
            {
                let st = self.state.lock();
                left = st.stale.len() + st.has_clean() as usize;
                if left == 0 {
                    return Ok(());
                }
            }
            self.commit_force().await?;
        }
        Err(strata_io::Error::new(
            strata_io::ErrorKind::Busy,
            format!("the log still holds entries of {left} or more blocks after 64 commits (writes still coming?)"),
        ))
    }

    /// Origin requests made for clients so far (reads that missed the log, writes around it).
    fn foreground_origin_requests(&self) -> u64 {
        self.counters.read_misses.load(Relaxed) + self.counters.writes_around.load(Relaxed)
    }

    /// One round of the background task: what the tunables ask for now.
    /// Returns false when a write-back failed (the task then waits a tick before retrying).
    async fn background_round(&self, r: &mut Rounds) -> bool {
        let mut ok = true;
        let t = *self.tunables.lock();
        let slots = self.sb.slots;
        let now = Instant::now();
        let dt = now.duration_since(r.last).as_secs_f64();
        r.last = now;
        let foreground = self.foreground_origin_requests();
        let idle = foreground == r.foreground;
        r.foreground = foreground;
        let (free, dirty, overdue) = {
            let st = self.state.lock();
            let (free, dirty) = st.counts();
            (free, dirty, r.overdue(st.dirty_oldest(), st.seq, t.max_age_ms, now))
        };
        let target = if t.cleaner { 0 } else { slots * t.low_watermark as u64 / 100 };
        let full = free * 100 < slots * (100 - t.high_watermark as u64).max(1);
        let flat_out = t.cleaner || idle || full;
        let held = self.held(&t).is_some();
        let rate = if held {
            r.pacer.update(0.0, 0.0, dt, false, 0.0)
        } else {
            r.pacer.update(dirty as f64, target as f64, dt, flat_out, f64::INFINITY)
        };
        self.writeback_rate.store(if overdue > 0 && !held { f64::INFINITY } else { rate }.to_bits(), Relaxed);
        if !held {
            let jobs = if t.writeback_jobs == 0 { BATCH_MAX } else { (t.writeback_jobs as usize).min(BATCH_MAX) };
            let paced = r.pacer.earn(dt, jobs);
            let n = paced.max(overdue.min(jobs));
            if n > 0 {
                // The cleaner drains in address order; otherwise the oldest go first.
                if !t.cleaner {
                    r.sweep.0.clear();
                }
                ok = if t.cleaner && overdue == 0 {
                    self.writeback_batch(SWEEP_BATCH, Some(&mut r.sweep)).await.is_ok()
                } else {
                    self.writeback_batch(n, None).await.is_ok()
                };
                r.pacer.spend(paced.min(n));
            }
        }
        let (evicted, waiting) = self.evict(self.reserve(&t));
        let (stale, pending) = {
            let st = self.state.lock();
            (!st.stale.is_empty(), st.write_gen - st.durable_gen)
        };
        let due = r.last_commit.elapsed() >= Duration::from_millis(t.autocommit_time_ms);
        if evicted > 0 || waiting || ((stale || pending > 0) && due) || pending >= t.autocommit_blocks {
            let _ = self.commit_force().await;
            r.last_commit = Instant::now();
        }
        ok
    }

    /// Why background write-back is held, if it is: switched off, or paused after a stream
    /// went around a full log (dm-writecache's pause: the stream has the origin to itself, as
    /// write-back's seeks would cost it more than the slots they free are worth). The cleaner
    /// is never paused by a stream.
    pub(super) fn held(&self, t: &Tunables) -> Option<Held> {
        if !t.writeback_running {
            return Some(Held::Off);
        }
        if !t.cleaner && t.pause_writeback_ms > 0 && self.streamed_within(t.pause_writeback_ms) {
            return Some(Held::Paused(t.pause_writeback_ms));
        }
        None
    }

    /// Whether the background task has write-back to do at once (no tick's wait).
    fn behind(&self, r: &Rounds) -> bool {
        let t = *self.tunables.lock();
        if self.held(&t).is_some() {
            return false;
        }
        let st = self.state.lock();
        let (free, dirty) = st.counts();
        let full = free * 100 < self.sb.slots * (100 - t.high_watermark as u64).max(1);
        dirty > 0 && (t.cleaner || full || r.pacer.rate() == f64::INFINITY)
    }
}

/// Why background write-back waits (`writeback_held` in status).
pub(super) enum Held {
    Off,
    /// Paused for `pause_writeback` (ms) after a stream went around the full log.
    Paused(u64),
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::Off => write!(f, "writeback_running is off"),
            Held::Paused(ms) => {
                write!(f, "a stream went around the full log less than pause_writeback ({ms} ms) ago")
            }
        }
    }
}

/// What the background task carries from one round to the next.
struct Rounds {
    pacer: Pacer,
    last: Instant,
    last_commit: Instant,
    /// `foreground_origin_requests` at the last round.
    foreground: u64,
    /// (when, last sequence number handed out then), oldest first: for `max_age`.
    ages: VecDeque<(Instant, u64)>,
    /// The cleaner's sweep in address order.
    sweep: Sweep,
}

impl Rounds {
    /// How many dirty blocks are older than `max_age_ms` (0: no limit), counting at most a
    /// batch. A sample `(t, seq)` taken each tick says every block up to `seq` was written by
    /// `t`; the newest sample at least `max_age` old is the cutoff.
    fn overdue(
        &mut self,
        mut dirty: impl Iterator<Item = (u64, u32)>,
        seq: u64,
        max_age_ms: u64,
        now: Instant,
    ) -> usize {
        if max_age_ms == 0 {
            self.ages.clear();
            return 0;
        }
        if !matches!(self.ages.back(), Some(&(t, _)) if now.duration_since(t) < TICK) {
            self.ages.push_back((now, seq));
        }
        let old = |&(t, _): &(Instant, u64)| now.duration_since(t) >= Duration::from_millis(max_age_ms);
        while self.ages.len() >= 2 && old(&self.ages[1]) {
            self.ages.pop_front();
        }
        match self.ages.front() {
            Some(&(_, cut)) if old(&self.ages[0]) => {
                dirty.by_ref().take_while(|&(s, _)| s <= cut).take(BATCH_MAX).count()
            }
            _ => 0,
        }
    }
}

/// The background task: runs until the target is dropped.
pub(super) async fn background(weak: Weak<Inner>) {
    let now = Instant::now();
    let mut r = Rounds {
        pacer: Pacer::default(),
        last: now,
        last_commit: now,
        foreground: 0,
        ages: VecDeque::new(),
        sweep: Sweep::default(),
    };
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.background.stopping() {
            return;
        }
        let ok = inner.background_round(&mut r).await;
        if ok && inner.behind(&r) {
            drop(inner);
            tokio::task::yield_now().await;
            continue;
        }
        let wait = tokio::time::timeout(TICK, inner.kick.notified());
        let _ = wait.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::{test_log, OpenOptions, WritecacheDev};
    use std::sync::Arc;
    use strata_io::mem::MemDev;
    use strata_io::BlockDev;

    /// A block written three times, flushed after the first two: two entries on disk, the
    /// third copy only in memory. Written back and evicted before any commit writes its
    /// entry, then flushed: what the disk holds then must recover the third write, not the
    /// second (the flush's one commit clears only the oldest entry).
    #[tokio::test]
    async fn an_eviction_never_leaves_an_older_entry_to_win_after_a_flush() {
        const BLOCK: usize = 4096;
        let origin = Arc::new(MemDev::new(1 << 20));
        let cache = Arc::new(MemDev::new(96 << 10));
        let dev = test_log(cache.clone(), origin.clone(), Tunables::default()).await;
        for v in [1u8, 2] {
            dev.write(0, Buf::from_slice(&[v; BLOCK]), false).await.unwrap();
            dev.flush().await.unwrap();
        }
        dev.write(0, Buf::from_slice(&[3; BLOCK]), false).await.unwrap();
        dev.writeback_all().await.unwrap();
        dev.inner.evict(u64::MAX);
        dev.flush().await.unwrap();
        dev.check_state().unwrap();
        drop(dev);
        let dev = WritecacheDev::open(cache, origin, OpenOptions { no_background: true, ..OpenOptions::default() })
            .await
            .unwrap();
        let got = dev.read(0, Buf::zeroed(BLOCK)).await.unwrap();
        assert!(got.iter().all(|&b| b == 3), "the recovered block holds write {}, not 3", got[0]);
    }

    #[test]
    fn blocks_past_max_age_are_the_ones_written_before_the_newest_old_sample() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut r = Rounds {
            pacer: Pacer::default(),
            last: t0,
            last_commit: t0,
            foreground: 0,
            ages: VecDeque::new(),
            sweep: Sweep::default(),
        };
        // Blocks written with sequence numbers 1..=10 by 0 ms, 11..=20 by 100 ms.
        let dirty: Vec<(u64, u32)> = (1..=20u64).map(|s| (s, s as u32)).collect();
        assert_eq!(r.overdue(dirty.iter().copied(), 10, 500, at(0)), 0);
        assert_eq!(r.overdue(dirty.iter().copied(), 20, 500, at(100)), 0);
        assert_eq!(r.overdue(dirty.iter().copied(), 20, 500, at(499)), 0, "nothing is 500 ms old yet");
        assert_eq!(r.overdue(dirty.iter().copied(), 20, 500, at(500)), 10, "the first ten are");
        assert_eq!(r.overdue(dirty.iter().copied(), 20, 500, at(600)), 20, "then all twenty");
        // Samples are taken at most once a tick, and dropped once a newer one is old enough.
        assert!(r.ages.len() <= 3, "{:?}", r.ages.len());
        // Written back, they are no longer counted; no limit counts nothing.
        let rest: Vec<(u64, u32)> = dirty.iter().copied().filter(|&(s, _)| s > 15).collect();
        assert_eq!(r.overdue(rest.iter().copied(), 20, 500, at(700)), 5);
        assert_eq!(r.overdue(rest.iter().copied(), 20, 0, at(800)), 0);
        assert!(r.ages.is_empty());
    }
}
