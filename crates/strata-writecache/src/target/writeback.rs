//! Write-back: copying dirty slots to the origin, a batch at a time: the oldest dirty blocks
//! are taken, sorted by origin address, runs of adjacent blocks merged into one origin write
//! each, and the origin flushed once per batch before the blocks count as clean. The
//! background task writes back continuously while the dirty share is above
//! `low_watermark` (everything with `cleaner`), evicts the oldest clean blocks to keep
//! `100 - high_watermark` percent of the slots free, and commits at least every
//! `autocommit_time`. A failed origin write leaves its blocks dirty and the volume serving.

use super::state::SlotState;
use super::{relaxed, Inner};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Weak;
use std::time::{Duration, Instant};
use strata_io::{Buf, Result, ZeroFlags};

/// Most blocks one batch takes (one origin flush per batch).
pub(crate) const BATCH_MAX: usize = 256;
/// How often the background task looks when nothing wakes it.
const TICK: Duration = Duration::from_millis(20);

impl Inner {
    /// Writes back up to `max` of the oldest dirty blocks; returns how many became clean.
    pub(super) async fn writeback_batch(&self, max: usize) -> Result<usize> {
        {
            let st = self.state.lock();
            st.check_running()?;
            if st.log_suspect {
                return Ok(0);
            }
        }
        let mut picks: Vec<(u64, u32, u64, bool)> = {
            let mut st = self.state.lock();
            let mut picks = Vec::new();
            let candidates: Vec<(u64, u32)> =
                st.dirty.iter().filter(|(_, s)| !st.writing_back.contains(s)).take(max).copied().collect();
            for (seq, s) in candidates {
                st.writing_back.insert(s);
                let slot = &mut st.slots[s as usize];
                slot.pins += 1;
                picks.push((slot.entry.block, s, seq, slot.entry.flags & crate::format::FLAG_ZERO != 0));
            }
            picks
        };
        if picks.is_empty() {
            return Ok(0);
        }
        picks.sort_unstable();
        let mut stripes: Vec<usize> = picks.iter().map(|p| self.stripe(p.0)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for i in stripes {
            guards.push(self.stripes[i].lock().await);
        }
        let result = self.copy_out(&picks).await;
        drop(guards);
        let mut st = self.state.lock();
        let mut cleaned = 0;
        for &(_, s, seq, _) in &picks {
            st.writing_back.remove(&s);
            st.slots[s as usize].pins -= 1;
            if result.is_ok() && st.mark_clean(s, seq) {
                cleaned += 1;
            }
        }
        drop(st);
        match result {
            Ok(()) => {
                self.counters.writebacks.fetch_add(cleaned as u64, Relaxed);
                Ok(cleaned)
            }
            Err(e) => {
                relaxed(&self.counters.writeback_errors);
                *self.last_error.lock() = Some(format!("write-back: {e}"));
                Err(e)
            }
        }
    }

    /// Copies the picked slots (sorted by block, block locks held) to the origin, adjacent
    /// blocks as one write, then flushes the origin.
    async fn copy_out(&self, picks: &[(u64, u32, u64, bool)]) -> Result<()> {
        // Skip what changed since it was picked (superseded copies are not written back).
        let current: Vec<_> = {
            let st = self.state.lock();
            picks
                .iter()
                .filter(|&&(_, s, seq, _)| {
                    let slot = &st.slots[s as usize];
                    slot.state == (SlotState::Live { dirty: true }) && slot.entry.seq == seq
                })
                .copied()
                .collect()
        };
        let mut i = 0;
        while i < current.len() {
            let (b0, _, _, zero) = current[i];
            let mut j = i + 1;
            while j < current.len()
                && current[j].0 == current[j - 1].0 + 1
                && current[j].3 == zero
                && (j - i) < BATCH_MAX
            {
                j += 1;
            }
            let run = &current[i..j];
            let at = b0 * self.block;
            let len: u64 = run.iter().map(|p| self.block_len(p.0)).sum();
            if zero {
                self.origin.write_zeroes(at, len, ZeroFlags::default()).await?;
            } else {
                let reads = run
                    .iter()
                    .map(|p| self.cache.read(self.slot_offset(p.1), Buf::zeroed(self.block_len(p.0) as usize)));
                let mut buf = Buf::zeroed(len as usize);
                let mut pos = 0usize;
                for (p, r) in run.iter().zip(futures::future::join_all(reads).await) {
                    let d = r?;
                    self.verify_slot(p.0, p.1, &d)?;
                    buf[pos..pos + d.len()].copy_from_slice(&d);
                    pos += d.len();
                }
                self.origin.write(at, buf, false).await?;
            }
            self.origin_writes.fetch_add(1, Relaxed);
            i = j;
        }
        self.origin_flush().await
    }

    /// Checks data read from slot `s` against its entry's checksum before it goes to the
    /// origin: after a failed flush of the fast device a slot may hold another block's older
    /// data, and copying that to the origin would make it permanent.
    pub(super) fn verify_slot(&self, b: u64, s: u32, data: &[u8]) -> Result<()> {
        let want = self.state.lock().slots[s as usize].entry.data_crc;
        if crc32c::crc32c(data) != want {
            return Err(strata_io::Error::new(
                strata_io::ErrorKind::Checksum,
                format!("writecache: slot {s} does not hold block {b}'s data (the fast device lost a write); not written back"),
            ));
        }
        Ok(())
    }

    /// Writes back until nothing is dirty (detach, `flush` message).
    pub(crate) async fn writeback_all(&self) -> Result<()> {
        loop {
            if self.state.lock().dirty.is_empty() {
                return Ok(());
            }
            if self.writeback_batch(BATCH_MAX).await? == 0 {
                tokio::task::yield_now().await;
            }
        }
    }

    /// Evicts the oldest clean blocks until `want` slots are free or being freed.
    pub(super) fn evict(&self, want: u64) -> usize {
        let mut st = self.state.lock();
        let (free, _) = st.counts();
        let pending = st.stale.values().map(|v| v.len() as u64).sum::<u64>();
        let mut n = 0;
        let mut have = free + pending;
        while have < want {
            let Some(&(_, s)) = st.clean.iter().next() else { break };
            st.retire(s);
            have += 1;
            n += 1;
        }
        self.counters.evictions.fetch_add(n as u64, Relaxed);
        n
    }

    /// One round of the background task: what the tunables ask for now.
    /// Returns false when a write-back failed (the task then waits a tick before retrying).
    async fn background_round(&self, last_commit: &mut Instant) -> bool {
        let mut ok = true;
        let t = *self.tunables.lock();
        let slots = self.sb.slots;
        let (_, dirty) = self.state.lock().counts();
        if !t.pause_writeback {
            let target = if t.cleaner { 0 } else { slots * t.low_watermark as u64 / 100 };
            if dirty > target {
                let n = ((dirty - target) as usize).clamp(1, BATCH_MAX);
                ok = self.writeback_batch(n).await.is_ok();
            }
        }
        let reserve = (slots * (100 - t.high_watermark as u64)).div_ceil(100).max(1);
        let evicted = self.evict(reserve);
        let stale = !self.state.lock().stale.is_empty();
        let due = last_commit.elapsed() >= Duration::from_millis(t.autocommit_time_ms);
        let pending = {
            let st = self.state.lock();
            st.write_gen > st.durable_gen
        };
        if evicted > 0 || (stale && due) || (pending && due) {
            let _ = self.commit_force().await;
            *last_commit = Instant::now();
        }
        ok
    }
}

/// The background task: runs until the target is dropped.
pub(super) async fn background(weak: Weak<Inner>) {
    let mut last_commit = Instant::now();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let ok = inner.background_round(&mut last_commit).await;
        let busy = ok && {
            let t = *inner.tunables.lock();
            let (_, dirty) = inner.state.lock().counts();
            !t.pause_writeback && dirty > if t.cleaner { 0 } else { inner.sb.slots * t.low_watermark as u64 / 100 }
        };
        if busy {
            drop(inner);
            tokio::task::yield_now().await;
            continue;
        }
        let wait = tokio::time::timeout(TICK, inner.kick.notified());
        let _ = wait.await;
    }
}
