//! Write-back: copying dirty blocks to the origin (a batch in origin-address order, adjacent
//! blocks merged into one origin write, one origin flush per batch) and the background task that paces it (bcache's controller), commits periodically and
//! keeps the windowed statistics.

use super::{futures_collect, slot_reserve, Inner};
use crate::format::Mode;
use crate::meter::{Counters, Kind};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use strata_io::{Buf, ErrorKind};

/// Most blocks one write-back batch takes (one origin flush per batch).
const WRITEBACK_BATCH_MAX: usize = 256;
/// Write-backs (runs of adjacent blocks) in flight at once.
const WRITEBACK_DEPTH: usize = 8;
/// Most adjacent blocks merged into one origin write.
const WRITEBACK_RUN_MAX: usize = 32;
/// Bytes of dirty blocks a batch has in flight at once (at least one block): the runs are
/// shortened and fewer go at once for blocks larger than 64 KiB, so large blocks do not
/// take gigabytes of buffers.
const WRITEBACK_BYTES: u64 = 16 << 20;
/// How often the background task looks at the dirty count and the clock.
const TICK: Duration = Duration::from_millis(100);
/// Periodic commit, like dm-thin's: mappings never lag the data by more than this.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Below this foreground share of origin time the origin counts as idle.
const IDLE_SHARE: f64 = 0.05;
/// On an idle origin, write-back goes flat out while the dirty share is over its target, and
/// below it only once the volume has served nothing for this long (as bcache's, once its
/// cache set is idle): a volume busy with hits leaves the origin idle, and writing back the
/// blocks its writer keeps writing only has each next write move its block to a new slot.
const QUIET: Duration = Duration::from_secs(1);
/// Points of the cache above `writeback_percent` where writeback stops making new dirty
/// data while the origin is busy (see `Inner::write_mode`).
const DIRTY_SLACK_PERCENT: usize = 5;

const _: () =
    assert!(0 < WRITEBACK_DEPTH && WRITEBACK_DEPTH <= WRITEBACK_BATCH_MAX, "a batch is written in chunks of the depth");
const _: () = assert!(TICK.as_millis() < COMMIT_INTERVAL.as_millis(), "the task that commits looks more often");
const _: () = assert!(0.0 < IDLE_SHARE && IDLE_SHARE < 1.0);

impl Inner {
    /// Writes back a run of dirty blocks adjacent on the origin (ascending, at most
    /// `WRITEBACK_RUN_MAX`), from its first block on, as one origin write. Returns how many
    /// blocks of `run` it dealt with (at least one) and what to mark clean once the origin is
    /// flushed. It locks every block of the run, taking the shard locks in ascending order
    /// (write-back is the only path that holds more than one while waiting for another, so
    /// no two tasks can wait for each other), and stops after a block no longer dirty.
    async fn writeback_run(&self, run: &[u64]) -> (usize, Vec<(u64, u32, u32)>) {
        let mut shards: Vec<usize> = run.iter().map(|&b| self.shard_index(b)).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut guards = Vec::with_capacity(shards.len());
        for i in shards {
            guards.push(self.shards[i].clone().write_owned().await);
        }
        let mut picked = Vec::with_capacity(run.len());
        let mut fresh = Vec::with_capacity(run.len());
        let mut used = 0;
        for &b in run {
            used += 1;
            let mut st = self.state.lock();
            match st.map.get(&b).copied() {
                Some(s) if st.meta.entries[s as usize].dirty => {
                    self.refs[s as usize].fetch_add(1, Relaxed);
                    picked.push((b, s, st.write_gen[s as usize]));
                    fresh.push(st.is_fresh(s));
                }
                Some(_) => {
                    st.policy.set_clean(b);
                    break;
                }
                None => break,
            }
        }
        if picked.is_empty() {
            return (used, picked);
        }
        let reads = picked.iter().zip(fresh).map(|(&(b, s, _), fresh)| {
            let len = self.block_len(b) as usize;
            self.read_slot(s, 0, Buf::zeroed(len), fresh)
        });
        let parts = futures_collect(reads).await;
        for &(_, s, _) in &picked {
            self.refs[s as usize].fetch_sub(1, Relaxed);
        }
        let put_back = |picked: &[(u64, u32, u32)], fault: Option<String>| {
            let mut st = self.state.lock();
            if let Some(f) = fault {
                Counters::bump(&self.counters.writeback_errors);
                st.fault(f);
            }
            for &(b, _, _) in picked {
                st.policy.set_dirty(b);
            }
        };
        if self.state.lock().cache_suspect {
            // The cache device lost writes in a failed flush: a slot may hold older data,
            // another block's; copying it to the origin would make that permanent.
            put_back(&picked, None);
            return (used, Vec::new());
        }
        let mut data = Buf::zeroed(parts.iter().map(|p| p.as_ref().map_or(0, |d| d.len())).sum());
        let mut at = 0;
        for (part, &(b, s, _)) in parts.into_iter().zip(&picked) {
            match part {
                Ok(d) => {
                    data[at..at + d.len()].copy_from_slice(&d);
                    at += d.len();
                }
                Err(e) => {
                    put_back(&picked, Some(format!("write-back of block {b}: cache slot {s} unreadable: {e}")));
                    return (used, Vec::new());
                }
            }
        }
        // The blocks stay locked until the origin has the data, so a later write, discard or
        // write-zeroes of one can never be overtaken by this older copy.
        let mut settled = Ok(());
        for &(b, _, _) in &picked {
            settled = settled.and(self.settle(b).await);
        }
        let bytes = data.len() as u64;
        let first = picked[0].0;
        let written = match settled {
            Ok(()) => self.origin_write(first * self.block, data, false, Kind::Migration).await,
            Err(e) => Err(e),
        };
        drop(guards);
        match written {
            Ok(_) => {
                self.counters.migration_bytes.fetch_add(bytes, Relaxed);
                self.counters.writeback_writes.fetch_add(1, Relaxed);
                (used, picked)
            }
            Err(e) if e.kind == ErrorKind::Unavailable => {
                // An origin away for now lost nothing: no fault, the blocks go again later.
                Counters::bump(&self.counters.writeback_errors);
                put_back(&picked, None);
                (used, Vec::new())
            }
            Err(e) => {
                let n = picked.len();
                put_back(&picked, Some(format!("write-back of blocks {first}..+{n} to the origin failed: {e}")));
                (used, Vec::new())
            }
        }
    }

    /// Writes back `run` (adjacent blocks, ascending) in as few origin writes as its locks
    /// allow.
    async fn writeback_adjacent(&self, mut run: &[u64]) -> Vec<(u64, u32, u32)> {
        let mut done = Vec::new();
        while !run.is_empty() {
            let (used, d) = self.writeback_run(run).await;
            done.extend(d);
            run = &run[used.max(1)..];
        }
        done
    }

    /// Writes back up to `max` dirty blocks, in origin-address order with adjacent blocks
    /// merged into one origin write, then flushes the origin and marks them clean.
    async fn writeback_batch(&self, max: usize) -> usize {
        let mut picked = Vec::new();
        {
            let mut st = self.state.lock();
            let now = self.now_ns();
            while picked.len() < max {
                match st.policy.writeback_candidate(now) {
                    Some(b) => picked.push(b),
                    None => break,
                }
            }
        }
        if picked.is_empty() {
            return 0;
        }
        let in_flight = (WRITEBACK_BYTES / self.block).max(1) as usize;
        let run_max = WRITEBACK_RUN_MAX.min(in_flight);
        let runs = adjacent_runs(picked, run_max);
        let mut done = Vec::new();
        for chunk in runs.chunks((in_flight / run_max).clamp(1, WRITEBACK_DEPTH)) {
            let results = futures_collect(chunk.iter().map(|r| self.writeback_adjacent(r))).await;
            done.extend(results.into_iter().flatten());
        }
        // If it fails, the blocks stay dirty and go again later.
        let flushed = self.flush_origin(Kind::Migration, "after write-back").await;
        let mut st = self.state.lock();
        let mut cleaned = 0;
        for (b, s, generation) in done {
            let current = st.map.get(&b) == Some(&s) && st.write_gen[s as usize] == generation;
            if flushed.is_ok() && current {
                st.meta.set_dirty(s, false);
                st.policy.set_clean(b);
                Counters::bump(&self.counters.writebacks);
                cleaned += 1;
            } else if st.map.get(&b) == Some(&s) && st.meta.entries[s as usize].dirty {
                // Written again meanwhile, or the flush failed: offer it again later. (A block
                // discarded and promoted again since, even into this slot, is clean now.)
                st.policy.set_dirty(b);
            }
        }
        st.debug_check();
        cleaned
    }
}

/// The background task: periodic commits, windowed statistics, and paced write-back.
pub(super) async fn background(weak: std::sync::Weak<Inner>) {
    let mut last_commit = Instant::now();
    let mut pacer = strata_policy::pacing::Pacer::default();
    let mut last_busy = (Duration::ZERO, Duration::ZERO, Instant::now());
    let mut last_access = (0, Instant::now());
    loop {
        let Some(me) = weak.upgrade() else { return };
        if me.background.stopping() {
            return;
        }
        let woken = tokio::time::timeout(TICK, me.wake.notified()).await.is_ok();
        if me.background.stopping() {
            return;
        }
        me.windows.tick(&me.counters);
        if me.state.lock().failed.is_some() {
            continue;
        }
        let need_slots = {
            let st = me.state.lock();
            !st.freed.is_empty() && st.free.len() <= slot_reserve(st.meta.slots()) / 2
        };
        if (need_slots || last_commit.elapsed() >= COMMIT_INTERVAL || woken) && me.commit().await.is_ok() {
            last_commit = Instant::now();
        }
        // Origin time used since the last tick, by foreground and by migration.
        let (fg, mg) = (me.meter.busy(Kind::Foreground), me.meter.busy(Kind::Migration));
        let dt = last_busy.2.elapsed().as_secs_f64().max(1e-3);
        let fg_share = (fg - last_busy.0).as_secs_f64() / dt;
        let mg_share = (mg - last_busy.1).as_secs_f64() / dt;
        last_busy = (fg, mg, Instant::now());

        let idle = fg_share < IDLE_SHARE;
        me.origin_busy.store(!idle, Relaxed);
        let accesses = me.counters.accesses();
        if accesses != last_access.0 {
            last_access = (accesses, Instant::now());
        }
        let quiet = last_access.1.elapsed() >= QUIET;
        let (dirty, target, flush_all) = {
            let st = me.state.lock();
            let slots = st.meta.slots() as f64;
            let target = if st.meta.sb.mode == Mode::Writeback && !st.flush_all {
                slots * st.meta.sb.writeback_percent as f64 / 100.0
            } else {
                0.0
            };
            (st.policy.dirty_len() as f64, target, st.flush_all)
        };
        // bcache's controller (`strata_policy::pacing`), capped by the migration budget; flat
        // out when a flush was asked for (the budget aside: a flush of a budget of a few bytes
        // a second would never end), or on an idle origin over the target or once the volume
        // is quiet.
        let budget_blocks = match me.budget.rate() {
            _ if flush_all => f64::INFINITY,
            0 => f64::INFINITY,
            r => r as f64 / me.block as f64,
        };
        let drain = flush_all || (idle && quiet);
        pacer.update(dirty, target, dt, drain || (idle && dirty > target), budget_blocks);
        if dirty == 0.0 {
            if flush_all {
                me.state.lock().flush_all = false;
            }
            continue;
        }
        // Migration's own share of origin time stays under the cap unless flushing.
        let cap = *me.share_cap.lock();
        if mg_share > cap && !flush_all && !idle {
            continue;
        }
        // Short of draining, no further than the target: below it, the blocks written back
        // would be the ones the writer keeps writing.
        // (A float cast saturates: no excess is 0.)
        let batch = if drain { WRITEBACK_BATCH_MAX } else { WRITEBACK_BATCH_MAX.min((dirty - target).ceil() as usize) };
        let n = pacer.earn(dt, batch);
        let mut allowed = if flush_all { n } else { 0 };
        while allowed < n && me.budget.try_take(me.block) {
            allowed += 1;
        }
        if allowed == 0 {
            continue;
        }
        pacer.spend(allowed);
        me.writeback_batch(allowed).await;
    }
}

/// Whether writeback should make no new dirty data: on a busy origin, with `dirty` blocks of
/// `slots` at or past `percent` + `DIRTY_SLACK_PERCENT` points (at least one block).
pub(super) fn dirty_limited(dirty: usize, slots: usize, percent: u32, busy: bool) -> bool {
    busy && dirty >= (slots * (percent as usize + DIRTY_SLACK_PERCENT) / 100).max(1)
}

/// `blocks` sorted, without repeats, cut into runs of consecutive numbers of at most `max`.
fn adjacent_runs(mut blocks: Vec<u64>, max: usize) -> Vec<Vec<u64>> {
    blocks.sort_unstable();
    blocks.dedup();
    let mut runs: Vec<Vec<u64>> = Vec::new();
    for b in blocks {
        match runs.last_mut() {
            Some(r) if r.len() < max && r.last() == Some(&(b - 1)) => r.push(b),
            _ => runs.push(vec![b]),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::{adjacent_runs, dirty_limited};

    #[test]
    fn new_dirty_data_stops_at_five_points_over_target_on_a_busy_origin() {
        assert!(!dirty_limited(149, 1000, 10, true));
        assert!(dirty_limited(150, 1000, 10, true));
        assert!(!dirty_limited(1000, 1000, 10, false), "an idle origin takes write-back flat out instead");
        assert!(dirty_limited(1, 10, 0, true), "at least one block");
        assert!(!dirty_limited(0, 10, 0, true));
    }

    #[test]
    fn runs_are_sorted_adjacent_and_capped() {
        let runs = adjacent_runs(vec![9, 3, 4, 0, 5, 10, 11, 12, 4, 20], 3);
        assert_eq!(runs, vec![vec![0], vec![3, 4, 5], vec![9, 10, 11], vec![12], vec![20]]);
        assert!(adjacent_runs(Vec::new(), 4).is_empty());
    }
}
