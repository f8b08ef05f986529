//! The cache target: where a hit is served, a miss promoted, a write absorbed, a dirty block
//! written back. A read always returns the last completed write, whatever state its block is
//! in: foreground IO to a block holds its lock shared, a migration of that block holds it
//! exclusively; a slot leaves the mapping and the policy together, under the state lock, and
//! is reused only after the commit that records it free and once no IO still reads it.

use crate::format::{Mode, Superblock};
use crate::meta::Meta;
use crate::meter::{Budget, Counters, Kind, OriginMeter, Streams, Windows};
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_io::{BlockDev, BoxFut, Buf, Error, ErrorKind, Extent, Geometry, Result, ZeroFlags};
use strata_policy::{Access, Op, Outcome, Params, Policy};
use tokio::sync::{Notify, OwnedRwLockWriteGuard, RwLock};

const SHARDS: usize = 1024;
/// Most blocks one write-back batch takes (one origin flush per batch).
const WRITEBACK_BATCH_MAX: usize = 256;
/// Write-backs in flight at once.
const WRITEBACK_DEPTH: usize = 8;
/// How often the background task looks at the dirty count and the clock.
const TICK: Duration = Duration::from_millis(100);
/// Periodic commit, like dm-thin's: mappings never lag the data by more than this.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// Below this foreground share of origin time the origin counts as idle.
const IDLE_SHARE: f64 = 0.05;

pub struct State {
    pub policy: Box<dyn Policy + Send>,
    pub map: FxHashMap<u64, u32>,
    pub meta: Meta,
    /// Slots free on the device (their release is committed).
    free: Vec<u32>,
    /// Slots freed in memory, reusable after the next commit.
    freed: Vec<u32>,
    /// Per slot: bumped by every write, so a write-back knows whether it is still current.
    write_gen: Vec<u32>,
    streams: Streams,
    /// Origin blocks zeroed whole (by a write-zeroes the origin carried out) since start:
    /// promoting them needs no copy. A discard does not count: it need not zero anything.
    zeroed: FxHashSet<u64>,
    /// Blocks unmapped in memory whose old mapping may still be durable, with the number of
    /// the table change that unmapped them. Nothing may write such a block on the origin
    /// until that change is durable: after a crash the old mapping would come back over it
    /// (see `Inner::settle`).
    pending: FxHashMap<u64, u64>,
    /// Table changes up to this number are durable.
    durable_changes: u64,
    /// Clean mappings made since the last full commit, not in the table yet: a clean slot
    /// copies origin data that may not be durable, so each enters the table at a full
    /// commit, whose origin flush comes first. Every other change depends on the cache
    /// device alone, so a commit that waits for one needs no origin flush (`commit_upto`).
    unrecorded: Vec<(u64, u32)>,
    /// Write back everything dirty (cache flush, detach).
    flush_all: bool,
    /// Faults that put the volume in a degraded state.
    pub faults: Vec<String>,
    /// Why the volume stopped acknowledging writes: a flush or commit failed, so data it
    /// covered may be gone from a device however later flushes fare. Latched until restart.
    failed: Option<String>,
    /// The failure was the cache device's: a slot written since its last good flush may
    /// hold older data, another block's, so no read is served from the cache any more.
    cache_suspect: bool,
}

pub struct Inner {
    pub origin: Arc<dyn BlockDev>,
    pub cache: Arc<dyn BlockDev>,
    block: u64,
    data_offset: u64,
    origin_bytes: u64,
    pub state: Mutex<State>,
    shards: Vec<Arc<RwLock<()>>>,
    refs: Vec<AtomicU32>,
    commit_lock: tokio::sync::Mutex<()>,
    pub counters: Counters,
    windows: Windows,
    budget: Budget,
    meter: OriginMeter,
    wake: Notify,
    stop: AtomicBool,
    epoch: Instant,
    describe: String,
    share_cap: Mutex<f64>,
}

/// The cache target as a `BlockDev`. Background tasks (write-back, periodic commit) stop
/// when it is shut down or dropped.
pub struct CacheDev {
    inner: Arc<Inner>,
}

enum ReadPlan {
    Hit(u32),
    /// The cache device lost writes in a failed flush: its slots are not to be trusted.
    Refused,
    Miss,
    Promote(u32),
    /// The policy admitted the block but every free slot's release still awaits a commit.
    NeedSlot,
}

enum WritePlan {
    /// Write a dirty block's slot in place (no durable clean mapping names that slot).
    Cache(u32),
    /// Writethrough of a dirty block: the origin and its slot.
    Both(u32),
    Origin,
    /// Promote by writing the whole block into a new slot.
    Promote(u32),
    /// A clean cached block is written: it moves to a new slot (see `Inner::replace`).
    Replace(u32),
    /// As `ReadPlan::NeedSlot`.
    NeedSlot,
}

impl State {
    /// Latches a failed flush or commit: data it covered may be gone from a device however
    /// later flushes fare (a buffered file drops pages whose write-back failed), so the
    /// volume stops acknowledging writes and flushes until an operator restarts it, which
    /// recovers from what is durable.
    fn fail(&mut self, why: String, cache_device: bool) {
        self.cache_suspect |= cache_device;
        if self.failed.is_none() {
            self.failed = Some(why.clone());
        }
        self.fault(format!("stopped: {why}"));
    }

    /// Records a fault and goes to the safe mode: no new dirty data (writeback becomes
    /// writethrough), while dirty data stays readable where it is and keeps being written
    /// back. The mode change is in memory; an operator sets it for good with `cache set`.
    fn fault(&mut self, what: String) {
        if self.faults.len() >= 64 {
            self.faults.remove(0);
        }
        self.faults.push(what);
        if self.meta.sb.mode == Mode::Writeback {
            self.meta.sb.mode = Mode::Writethrough;
        }
    }

    /// Removes `b` from the mapping. If the table holds the mapping, its slot is reusable
    /// after the next commit and the origin copy of `b` is not written before then
    /// (`pending`); an unrecorded one's slot is free at once.
    fn unmap(&mut self, b: u64) -> Option<u32> {
        let s = self.map.remove(&b)?;
        if self.meta.entries[s as usize].valid {
            self.meta.set(s, 0, false, false);
            self.freed.push(s);
            self.pending.insert(b, self.meta.changes());
        } else {
            // Unrecorded, never in the table: nothing of it can come back after a crash.
            self.free.push(s);
        }
        Some(s)
    }

    /// `unmap`, counted as a demotion (the policy already forgot `b`).
    fn demote(&mut self, b: u64, counters: &Counters) -> Option<u32> {
        let s = self.unmap(b)?;
        Counters::bump(&counters.demotions);
        Some(s)
    }

    /// Maps `b` to `s`: dirty, as one table change; clean, in memory until the next full
    /// commit records it (`unrecorded`).
    fn map_to(&mut self, b: u64, s: u32, dirty: bool) {
        self.map.insert(b, s);
        if dirty {
            self.meta.set(s, b, true, true);
        } else {
            self.unrecorded.push((b, s));
        }
        self.write_gen[s as usize] = self.write_gen[s as usize].wrapping_add(1);
    }

    /// Puts the clean mappings still current into the table (before a full commit).
    fn record_clean(&mut self) {
        for (b, s) in std::mem::take(&mut self.unrecorded) {
            if self.map.get(&b) == Some(&s) && !self.meta.entries[s as usize].valid {
                self.meta.set(s, b, true, false);
            }
        }
    }

    /// Unmaps every clean block (dm-cache's `invalidate_cblocks` for the whole cache):
    /// the next reads go to the origin. Returns how many were dropped.
    fn invalidate_clean(&mut self, counters: &Counters) -> usize {
        let clean: Vec<u64> =
            self.map.iter().filter(|&(_, &s)| !self.meta.entries[s as usize].dirty).map(|(&b, _)| b).collect();
        for &b in &clean {
            self.policy.remove(b);
            self.demote(b, counters);
        }
        clean.len()
    }

    fn stopped(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(Error::new(
                ErrorKind::Io,
                format!(
                    "cache stopped after a failed flush ({why}); it accepts no writes or flushes{} until restarted",
                    if self.cache_suspect { ", nor reads of cached blocks," } else { "" }
                ),
            )),
        }
    }

    /// A free slot that no IO still uses.
    fn reserve(&mut self, refs: &[AtomicU32]) -> Option<u32> {
        let pos = self.free.iter().rposition(|&s| refs[s as usize].load(Relaxed) == 0)?;
        Some(self.free.swap_remove(pos))
    }

    /// Applies a promotion decision's eviction. False if the victim turned out dirty (a
    /// policy bug the engine refuses to act on: the victim is put back).
    fn evict(&mut self, victim: Option<u64>, counters: &Counters) -> bool {
        let Some(v) = victim else { return true };
        if let Some(&s) = self.map.get(&v) {
            if self.meta.entries[s as usize].dirty {
                let _ = self.policy.insert(v, true);
                return false;
            }
        }
        self.demote(v, counters);
        true
    }
}

impl Inner {
    fn shard(&self, b: u64) -> &Arc<RwLock<()>> {
        &self.shards[(b.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % SHARDS]
    }

    fn slot_offset(&self, s: u32) -> u64 {
        self.data_offset + s as u64 * self.block
    }

    /// Bytes of origin block `b` (the last block may be short).
    fn block_len(&self, b: u64) -> u64 {
        self.block.min(self.origin_bytes - b * self.block)
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// `[offset, offset+len)` as (block, offset within block, length) pieces.
    fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64, u64)> {
        let mut v = Vec::with_capacity((len / self.block + 2) as usize);
        let mut pos = offset;
        while pos < offset + len {
            let b = pos / self.block;
            let within = pos % self.block;
            let n = (self.block - within).min(offset + len - pos);
            v.push((b, within, n));
            pos += n;
        }
        v
    }

    async fn origin_read(&self, offset: u64, buf: Buf, kind: Kind) -> Result<Buf> {
        let _busy = self.meter.start(kind);
        self.origin.read(offset, buf).await
    }

    async fn origin_write(&self, offset: u64, buf: Buf, fua: bool, kind: Kind) -> Result<Buf> {
        let _busy = self.meter.start(kind);
        self.origin.write(offset, buf, fua).await
    }

    // ---------------------------------------------------------------------------- reads

    async fn read(self: &Arc<Self>, offset: u64, mut buf: Buf) -> Result<Buf> {
        strata_io::check_range("cache read", offset, buf.len() as u64, self.origin_bytes)?;
        let bypass = {
            let mut st = self.state.lock();
            let cutoff = st.meta.sb.sequential_cutoff_bytes;
            st.streams.observe(offset, buf.len() as u64, cutoff)
        };
        let pieces = self.pieces(offset, buf.len() as u64);
        if pieces.len() == 1 {
            let (b, within, n) = pieces[0];
            return self.read_piece(b, within, n, bypass).await;
        }
        let parts = futures_join(pieces.iter().map(|&(b, w, n)| self.read_piece(b, w, n, bypass))).await?;
        let mut pos = 0;
        for p in parts {
            buf[pos..pos + p.len()].copy_from_slice(&p);
            pos += p.len();
        }
        Ok(buf)
    }

    fn read_piece(self: &Arc<Self>, b: u64, within: u64, n: u64, bypass: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            let shard = self.shard(b).clone();
            let guard = shard.clone().read_owned().await;
            let plan = match self.plan_read(b, within, n, bypass) {
                ReadPlan::NeedSlot => match self.slot_after_commit(b).await {
                    Some(s) => ReadPlan::Promote(s),
                    None => ReadPlan::Miss,
                },
                plan => plan,
            };
            match plan {
                ReadPlan::Hit(s) => {
                    let r = self.cache.read(self.slot_offset(s) + within, Buf::zeroed(n as usize)).await;
                    self.refs[s as usize].fetch_sub(1, Relaxed);
                    match r {
                        Ok(data) => Ok(data),
                        Err(e) => {
                            drop(guard);
                            if self.cache_read_failed(b, s, e).await? {
                                // Dropped from the cache: the origin holds the block.
                                let _g = shard.read_owned().await;
                                self.origin_read(b * self.block + within, Buf::zeroed(n as usize), Kind::Foreground).await
                            } else {
                                self.read_piece(b, within, n, bypass).await
                            }
                        }
                    }
                }
                ReadPlan::Miss => self.origin_read(b * self.block + within, Buf::zeroed(n as usize), Kind::Foreground).await,
                ReadPlan::Promote(s) => {
                    drop(guard);
                    let exclusive = shard.write_owned().await;
                    self.promote_on_read(b, within, n, s, exclusive, bypass).await
                }
                ReadPlan::Refused => Err(self.state.lock().stopped().expect_err("refused only once stopped")),
                ReadPlan::NeedSlot => unreachable!("resolved above"),
            }
        })
    }

    fn plan_read(&self, b: u64, within: u64, n: u64, bypass: bool) -> ReadPlan {
        let mut st = self.state.lock();
        let now = self.now_ns();
        if let Some(&s) = st.map.get(&b) {
            if st.cache_suspect {
                return ReadPlan::Refused;
            }
            if !bypass {
                st.policy.access(Access::new(b, Op::Read, within == 0 && n == self.block, now));
            }
            self.refs[s as usize].fetch_add(1, Relaxed);
            Counters::bump(&self.counters.read_hits);
            return ReadPlan::Hit(s);
        }
        Counters::bump(&self.counters.read_misses);
        if bypass || st.failed.is_some() {
            Counters::bump(&self.counters.bypassed);
            return ReadPlan::Miss;
        }
        if matches!(st.meta.sb.mode, Mode::Passthrough | Mode::Cleaner) {
            return ReadPlan::Miss;
        }
        match st.policy.access(Access::new(b, Op::Read, within == 0 && n == self.block, now)) {
            Outcome::Promote { evict } => {
                if !st.evict(evict, &self.counters) {
                    st.policy.remove(b);
                    return ReadPlan::Miss;
                }
                if !self.budget.try_take(self.block) {
                    st.policy.remove(b);
                    Counters::bump(&self.counters.promotions_skipped);
                    return ReadPlan::Miss;
                }
                match st.reserve(&self.refs) {
                    Some(s) => ReadPlan::Promote(s),
                    None => ReadPlan::NeedSlot,
                }
            }
            _ => ReadPlan::Miss,
        }
    }

    /// Commits to make freed slots reusable, then takes one, waiting for promotions in
    /// flight to hand theirs back if need be; if none comes (every slot still in use), the
    /// promotion of `b` is given up.
    async fn slot_after_commit(&self, b: u64) -> Option<u32> {
        if let Some(s) = self.free_slot().await {
            return Some(s);
        }
        let mut st = self.state.lock();
        st.policy.remove(b);
        Counters::bump(&self.counters.promotions_skipped);
        None
    }

    /// A free slot, committing to make freed slots reusable and waiting for promotions in
    /// flight to hand theirs back if need be; `None` if every slot stays in use.
    async fn free_slot(&self) -> Option<u32> {
        if let Some(s) = self.state.lock().reserve(&self.refs) {
            return Some(s);
        }
        for _ in 0..200 {
            // Freed slots come back with any commit; a light one will do.
            {
                let guard = self.commit_lock.lock().await;
                let _ = self.commit_locked(&guard, false).await;
            }
            let waiting = {
                let mut st = self.state.lock();
                if let Some(s) = st.reserve(&self.refs) {
                    return Some(s);
                }
                self.slots_in_flight(&st) > 0
            };
            if !waiting {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        None
    }

    /// Slots neither mapped nor free: promotions under way.
    fn slots_in_flight(&self, st: &State) -> usize {
        st.meta.slots() - st.map.len() - st.free.len() - st.freed.len()
    }

    /// A read miss the policy promotes: read the whole block from the origin once (with
    /// its readahead neighbours, see `fill_ahead`), answer from it, and fill the cache slots
    /// in the background while still holding the blocks.
    async fn promote_on_read(
        self: &Arc<Self>,
        b: u64,
        within: u64,
        n: u64,
        s: u32,
        exclusive: OwnedRwLockWriteGuard<()>,
        bypass: bool,
    ) -> Result<Buf> {
        let still_wanted = {
            let st = self.state.lock();
            !st.map.contains_key(&b) && st.policy.contains(b)
        };
        if !still_wanted {
            self.state.lock().free.push(s);
            drop(exclusive);
            return self.read_piece(b, within, n, bypass).await;
        }
        let known_zero = self.state.lock().zeroed.contains(&b);
        let mut fills = vec![(b, s, exclusive)];
        if !known_zero {
            fills.extend(self.fill_ahead(b));
        }
        let first = fills.iter().map(|f| f.0).min().expect("b is there");
        let end = fills.iter().map(|f| f.0 * self.block + self.block_len(f.0)).max().expect("b is there");
        let data = if known_zero {
            Buf::zeroed(self.block_len(b) as usize)
        } else {
            match self.origin_read(first * self.block, Buf::zeroed((end - first * self.block) as usize), Kind::Foreground).await {
                Ok(d) => d,
                Err(e) => {
                    let mut st = self.state.lock();
                    for &(fb, fs, _) in &fills {
                        st.policy.remove(fb);
                        st.free.push(fs);
                    }
                    return Err(e);
                }
            }
        };
        let range = |fb: u64| {
            let at = ((fb - first) * self.block) as usize;
            at..at + self.block_len(fb) as usize
        };
        let at_b = range(b).start;
        let answer = Buf::from_slice(&data[at_b + within as usize..at_b + (within + n) as usize]);
        let writes: Vec<(u64, u32, OwnedRwLockWriteGuard<()>, Buf)> = if fills.len() == 1 {
            let (fb, fs, g) = fills.pop().expect("b is there");
            vec![(fb, fs, g, data)]
        } else {
            fills.into_iter().map(|(fb, fs, g)| (fb, fs, g, Buf::from_slice(&data[range(fb)]))).collect()
        };
        let me = self.clone();
        tokio::spawn(async move {
            let done = futures_collect(writes.into_iter().map(|(fb, fs, g, d)| {
                let me = &me;
                async move { (fb, fs, g, me.cache.write(me.slot_offset(fs), d, false).await) }
            }))
            .await;
            let mut st = me.state.lock();
            for (fb, fs, guard, r) in done {
                match r {
                    Ok(_) if st.policy.contains(fb) && !st.map.contains_key(&fb) => {
                        st.map_to(fb, fs, false);
                        Counters::bump(&me.counters.promotions);
                        if fb != b {
                            Counters::bump(&me.counters.readahead_blocks);
                        }
                        me.counters.migration_bytes.fetch_add(me.block_len(fb), Relaxed);
                    }
                    Ok(_) => st.free.push(fs),
                    Err(e) => {
                        st.policy.remove(fb);
                        st.free.push(fs);
                        st.fault(format!("promotion of block {fb} into slot {fs} failed: {e}"));
                    }
                }
                drop(guard);
            }
        });
        Ok(answer)
    }

    /// While the cache has unused blocks, a promoted read miss brings its neighbours along:
    /// the origin read is rounded out to the aligned `readahead` window around the block (as
    /// bcache's `readahead` does), and each neighbour that is not cached, not being promoted
    /// and not in use by other IO takes a free slot, within the migration budget. For a disk
    /// one longer read costs little more than the seek it needed anyway, so an empty cache
    /// fills at the origin's streaming rate rather than its seek rate. Neighbours never evict
    /// anything and leave the slot reserve alone: a full cache promotes the missed block only.
    fn fill_ahead(&self, b: u64) -> Vec<(u64, u32, OwnedRwLockWriteGuard<()>)> {
        let mut st = self.state.lock();
        let per = st.meta.sb.readahead_bytes as u64 / self.block;
        let mut got = Vec::new();
        if per <= 1 {
            return got;
        }
        let keep_free = slot_reserve(st.meta.slots());
        let first = b / per * per;
        for nb in first..(first + per).min(st.meta.sb.origin_blocks()) {
            if nb == b || st.map.contains_key(&nb) || st.policy.contains(nb) {
                continue;
            }
            if st.policy.len() >= st.policy.capacity() || st.free.len() <= keep_free {
                break;
            }
            // Only a neighbour nobody is using: its shard is taken without waiting.
            let Ok(guard) = self.shard(nb).clone().try_write_owned() else { continue };
            if !self.budget.try_take(self.block) {
                break;
            }
            let Some(s) = st.reserve(&self.refs) else { break };
            if st.policy.insert(nb, false).is_err() {
                st.free.push(s);
                break;
            }
            got.push((nb, s, guard));
        }
        got
    }

    /// A cached block could not be read from the cache device. A clean one is dropped and
    /// served from the origin; a dirty one exists nowhere else: report it.
    /// Returns whether the block was dropped (serve it from the origin) rather than moved
    /// meanwhile (retry).
    async fn cache_read_failed(&self, b: u64, s: u32, e: Error) -> Result<bool> {
        Counters::bump(&self.counters.cache_read_errors);
        let mut st = self.state.lock();
        if st.map.get(&b) != Some(&s) {
            return Ok(false);
        }
        if st.meta.entries[s as usize].dirty {
            st.fault(format!("dirty block {b} unreadable in cache slot {s}: {e}"));
            return Err(Error::new(ErrorKind::Io, format!("cache block {b} (dirty, slot {s}) unreadable: {e}")));
        }
        st.policy.remove(b);
        st.demote(b, &self.counters);
        Ok(true)
    }

    // --------------------------------------------------------------------------- writes

    async fn write(self: &Arc<Self>, offset: u64, buf: Buf, fua: bool) -> Result<Buf> {
        strata_io::check_range("cache write", offset, buf.len() as u64, self.origin_bytes)
            .map_err(|e| Error::new(ErrorKind::NoSpace, e.context))?;
        let bypass = {
            let mut st = self.state.lock();
            st.stopped()?;
            let cutoff = st.meta.sb.sequential_cutoff_bytes;
            st.streams.observe(offset, buf.len() as u64, cutoff)
        };
        let pieces = self.pieces(offset, buf.len() as u64);
        let needs = futures_join(pieces.iter().map(|&(b, within, n)| {
            let start = (b * self.block + within - offset) as usize;
            let data = Buf::from_slice(&buf[start..start + n as usize]);
            self.write_piece(b, within, data, fua, bypass)
        }))
        .await?;
        // A FUA write is durable only together with the mapping that finds its data.
        if let Some(n) = needs.into_iter().flatten().max() {
            self.commit_upto(n).await?;
        }
        Ok(buf)
    }

    /// Writes one piece. With `fua`, returns the table change that must be durable before
    /// the write is acknowledged (the mapping of the slot that holds its data), if any.
    fn write_piece(self: &Arc<Self>, b: u64, within: u64, data: Buf, fua: bool, bypass: bool) -> BoxFut<'_, Result<Option<u64>>> {
        Box::pin(async move {
            let shard = self.shard(b).clone();
            let guard = shard.clone().read_owned().await;
            let n = data.len() as u64;
            let plan = match self.plan_write(b, within, n, bypass) {
                WritePlan::NeedSlot => match self.slot_after_commit(b).await {
                    Some(s) => WritePlan::Promote(s),
                    None => WritePlan::Origin,
                },
                plan => plan,
            };
            let slot_change = |s: u32| fua.then(|| self.state.lock().meta.slot_changed(s));
            match plan {
                WritePlan::Cache(s) => {
                    let r = self.cache.write(self.slot_offset(s) + within, data, fua).await;
                    self.refs[s as usize].fetch_sub(1, Relaxed);
                    r?;
                    Ok(slot_change(s))
                }
                WritePlan::Both(s) => {
                    // The slot stays the block's current copy: with FUA it must be durable too.
                    let copy = Buf::from_slice(&data);
                    let (a, c) = tokio::join!(
                        self.write_origin(b, within, data, fua),
                        self.cache.write(self.slot_offset(s) + within, copy, fua)
                    );
                    self.refs[s as usize].fetch_sub(1, Relaxed);
                    a?;
                    c?;
                    Ok(slot_change(s))
                }
                WritePlan::Origin => self.write_origin(b, within, data, fua).await.map(|_| None),
                WritePlan::NeedSlot => unreachable!("resolved above"),
                WritePlan::Replace(old) => {
                    drop(guard);
                    let exclusive = shard.write_owned().await;
                    self.replace(b, within, data, fua, bypass, old, exclusive).await
                }
                WritePlan::Promote(s) => {
                    drop(guard);
                    let _exclusive = shard.write_owned().await;
                    let (ok, writeback) = {
                        let st = self.state.lock();
                        (!st.map.contains_key(&b) && st.policy.contains(b), st.meta.sb.mode == Mode::Writeback)
                    };
                    if !ok {
                        self.state.lock().free.push(s);
                        drop(_exclusive);
                        return self.write_piece(b, within, data, fua, bypass).await;
                    }
                    // A partial write fills the rest of the block from the origin first (one
                    // read, as a read-miss promotion costs), so the slot holds the whole block.
                    let len = self.block_len(b);
                    let (block_data, partial) = if within == 0 && n == len {
                        (data, None)
                    } else {
                        let known_zero = self.state.lock().zeroed.contains(&b);
                        let read = if known_zero {
                            Ok(Buf::zeroed(len as usize))
                        } else {
                            self.origin_read(b * self.block, Buf::zeroed(len as usize), Kind::Foreground).await
                        };
                        let mut full = match read {
                            Ok(full) => full,
                            Err(e) => {
                                let mut st = self.state.lock();
                                st.policy.remove(b);
                                st.free.push(s);
                                return Err(e);
                            }
                        };
                        full[within as usize..(within + n) as usize].copy_from_slice(&data);
                        (full, Some(data))
                    };
                    // Writeback keeps the data (to fall back on); writethrough has it in the origin.
                    let r: Result<Option<Buf>> = if writeback {
                        self.cache.write(self.slot_offset(s), block_data, fua).await.map(Some)
                    } else {
                        let (to_origin, at) = match partial {
                            Some(d) => (d, within),
                            None => (Buf::from_slice(&block_data), 0),
                        };
                        let (a, c) = tokio::join!(
                            self.write_origin(b, at, to_origin, fua),
                            self.cache.write(self.slot_offset(s), block_data, false)
                        );
                        a.and(c).map(|_| None)
                    };
                    let homeless = {
                        let mut st = self.state.lock();
                        match r {
                            Ok(_) if st.policy.contains(b) => {
                                st.map_to(b, s, writeback);
                                if writeback {
                                    st.policy.set_dirty(b);
                                }
                                st.zeroed.remove(&b);
                                Counters::bump(&self.counters.promotions);
                                return Ok((writeback && fua).then(|| st.meta.changes()));
                            }
                            // The policy dropped the block while its data was on the way (it
                            // was chosen as another promotion's victim): the slot goes back,
                            // and data that lives only there goes to the origin instead.
                            Ok(Some(data)) => {
                                st.free.push(s);
                                data
                            }
                            Ok(None) => {
                                st.free.push(s);
                                return Ok(None);
                            }
                            Err(e) => {
                                st.policy.remove(b);
                                st.free.push(s);
                                return Err(e);
                            }
                        }
                    };
                    // `homeless` is the whole block (merged if the write was partial).
                    self.write_origin(b, 0, homeless, fua).await.map(|_| None)
                }
            }
        })
    }

    /// A write to clean cached block `b` in slot `old`. A clean slot is never overwritten in
    /// place: its mapping may be durable, and after a crash a clean slot that differs from
    /// the origin reads one way until it is evicted and another way after. So the block
    /// moves to a new slot with the write merged in. In writeback the new slot is dirty; in
    /// writethrough the old mapping's removal is made durable first, then the origin and the
    /// new slot are written, and the new slot is mapped clean once both hold the data.
    #[allow(clippy::too_many_arguments)]
    async fn replace(
        self: &Arc<Self>,
        b: u64,
        within: u64,
        data: Buf,
        fua: bool,
        bypass: bool,
        old: u32,
        exclusive: OwnedRwLockWriteGuard<()>,
    ) -> Result<Option<u64>> {
        let release_old = || self.refs[old as usize].fetch_sub(1, Relaxed);
        let (current, writeback) = {
            let st = self.state.lock();
            (st.map.get(&b) == Some(&old) && !st.meta.entries[old as usize].dirty, st.meta.sb.mode == Mode::Writeback)
        };
        let new = match current {
            true => self.free_slot().await,
            false => None,
        };
        let Some(new) = new else {
            release_old();
            if current {
                // No slot to move to: drop the cached copy and write the origin only.
                let mut st = self.state.lock();
                if st.map.get(&b) == Some(&old) {
                    st.policy.remove(b);
                    st.demote(b, &self.counters);
                }
            }
            drop(exclusive);
            return self.write_piece(b, within, data, fua, bypass).await;
        };
        let len = self.block_len(b);
        let n = data.len() as u64;
        let block_data = if within == 0 && n == len {
            Buf::from_slice(&data)
        } else {
            let mut full = match self.cache.read(self.slot_offset(old), Buf::zeroed(len as usize)).await {
                Ok(d) => Ok(d),
                Err(_) => {
                    // A clean block: the origin holds the same data.
                    Counters::bump(&self.counters.cache_read_errors);
                    self.origin_read(b * self.block, Buf::zeroed(len as usize), Kind::Foreground).await
                }
            };
            if let Ok(full) = &mut full {
                full[within as usize..(within + n) as usize].copy_from_slice(&data);
            }
            full.inspect_err(|_| {
                release_old();
                self.state.lock().free.push(new);
            })?
        };
        release_old();
        if writeback {
            let r = self.cache.write(self.slot_offset(new), block_data, fua).await;
            let homeless = {
                let mut st = self.state.lock();
                match r {
                    Err(e) => {
                        st.free.push(new);
                        return Err(e);
                    }
                    Ok(d) if st.map.get(&b) != Some(&old) => {
                        // Evicted or invalidated meanwhile: the data lives only in `new`.
                        st.free.push(new);
                        d
                    }
                    Ok(_) => {
                        st.unmap(b);
                        st.map_to(b, new, true);
                        st.policy.set_dirty(b);
                        return Ok(fua.then(|| st.meta.changes()));
                    }
                }
            };
            return self.write_origin(b, 0, homeless, fua).await.map(|_| None);
        }
        self.state.lock().unmap(b);
        let (a, c) = tokio::join!(
            self.write_origin(b, within, data, fua),
            self.cache.write(self.slot_offset(new), block_data, false)
        );
        let mut st = self.state.lock();
        let keep = a.is_ok() && c.is_ok() && st.policy.contains(b) && !st.map.contains_key(&b);
        if keep {
            st.map_to(b, new, false);
        } else {
            st.free.push(new);
            if !st.map.contains_key(&b) {
                st.policy.remove(b);
            }
        }
        a.map(|_| None)
    }

    /// Writes part of block `b` on the origin, once no mapping of `b` that was removed in
    /// memory can come back over it after a crash (see `settle`).
    async fn write_origin(&self, b: u64, within: u64, data: Buf, fua: bool) -> Result<Buf> {
        self.settle(b).await?;
        self.origin_write(b * self.block + within, data, fua, Kind::Foreground).await
    }

    fn plan_write(&self, b: u64, within: u64, n: u64, bypass: bool) -> WritePlan {
        let mut st = self.state.lock();
        let now = self.now_ns();
        let full = within == 0 && n == self.block_len(b);
        let mode = st.meta.sb.mode;
        st.zeroed.remove(&b);
        if let Some(&s) = st.map.get(&b) {
            Counters::bump(&self.counters.write_hits);
            let dirty = st.meta.entries[s as usize].dirty;
            if !bypass {
                st.policy.access(Access::new(b, Op::Write, full, now));
            }
            let plan = match (mode, dirty) {
                // A dirty block's newest data is in its slot: keep writing it there.
                (Mode::Writethrough, true) => WritePlan::Both(s),
                (_, true) => WritePlan::Cache(s),
                (Mode::Writeback | Mode::Writethrough, false) => WritePlan::Replace(s),
                (Mode::Writearound | Mode::Passthrough | Mode::Cleaner, false) => {
                    st.policy.remove(b);
                    st.demote(b, &self.counters);
                    return WritePlan::Origin;
                }
            };
            if dirty {
                st.write_gen[s as usize] = st.write_gen[s as usize].wrapping_add(1);
            }
            self.refs[s as usize].fetch_add(1, Relaxed);
            return plan;
        }
        Counters::bump(&self.counters.write_misses);
        if bypass {
            Counters::bump(&self.counters.bypassed);
            return WritePlan::Origin;
        }
        if !matches!(mode, Mode::Writeback | Mode::Writethrough) {
            return WritePlan::Origin;
        }
        match st.policy.access(Access::new(b, Op::Write, full, now)) {
            Outcome::Promote { evict } => {
                let evicted = st.evict(evict, &self.counters);
                // Whole-block writes are cached without reading the origin; a partial one
                // reads the rest of its block first (see the promotion in `write_piece`).
                if !(evicted && self.budget.try_take(self.block)) {
                    st.policy.remove(b);
                    return WritePlan::Origin;
                }
                match st.reserve(&self.refs) {
                    Some(s) => WritePlan::Promote(s),
                    None => WritePlan::NeedSlot,
                }
            }
            _ => WritePlan::Origin,
        }
    }

    // ------------------------------------------------------------- discard and zeroes

    /// Drops the cached copy of `b` before part of it is discarded; false if the origin is
    /// to be left alone (part of a dirty block: the cache holds the only good copy of the
    /// rest, and will write it all back).
    fn uncache_for_discard(&self, b: u64, whole: bool) -> bool {
        let mut st = self.state.lock();
        st.zeroed.remove(&b);
        match st.map.get(&b).copied() {
            Some(s) if !whole && st.meta.entries[s as usize].dirty => false,
            Some(_) => {
                st.policy.remove(b);
                st.demote(b, &self.counters);
                true
            }
            None => true,
        }
    }

    /// Drops the cached copies a request is about to replace on the origin, and makes that
    /// durable with one commit for the whole range rather than one per block (`settle`).
    async fn uncache_range(&self, pieces: &[(u64, u64, u64)], drop_block: impl Fn(&Self, u64, bool) -> bool) -> Result<()> {
        for &(b, within, n) in pieces {
            let _x = self.shard(b).clone().write_owned().await;
            drop_block(self, b, within == 0 && n == self.block_len(b));
        }
        let upto = {
            let st = self.state.lock();
            pieces.iter().filter_map(|(b, _, _)| st.pending.get(b).copied()).max()
        };
        match upto {
            Some(n) => self.commit_upto(n).await,
            None => Ok(()),
        }
    }

    async fn discard(self: &Arc<Self>, offset: u64, len: u64) -> Result<()> {
        strata_io::check_range("cache discard", offset, len, self.origin_bytes)?;
        self.state.lock().stopped()?;
        let pieces = self.pieces(offset, len);
        self.uncache_range(&pieces, |me, b, whole| me.uncache_for_discard(b, whole)).await?;
        for (b, within, n) in pieces {
            let _x = self.shard(b).clone().write_owned().await;
            if self.uncache_for_discard(b, within == 0 && n == self.block_len(b)) {
                self.settle(b).await?;
                self.origin.discard(b * self.block + within, n).await?;
            }
        }
        Ok(())
    }

    /// Drops the cached copy of `b` if it is clean and about to be zeroed whole on the origin;
    /// true if the zeroes go to the origin, false if they are written like data (a dirty
    /// block, whose slot is its only current copy, or part of a clean one).
    fn uncache_for_zeroes(&self, b: u64, whole: bool) -> bool {
        let mut st = self.state.lock();
        match st.map.get(&b).copied() {
            Some(s) if st.meta.entries[s as usize].dirty || !whole => false,
            Some(_) => {
                st.policy.remove(b);
                st.demote(b, &self.counters);
                true
            }
            None => true,
        }
    }

    async fn write_zeroes(self: &Arc<Self>, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        strata_io::check_range("cache write_zeroes", offset, len, self.origin_bytes)
            .map_err(|e| Error::new(ErrorKind::NoSpace, e.context))?;
        self.state.lock().stopped()?;
        let pieces = self.pieces(offset, len);
        self.uncache_range(&pieces, |me, b, whole| me.uncache_for_zeroes(b, whole)).await?;
        for (b, within, n) in pieces {
            let x = self.shard(b).clone().write_owned().await;
            let whole = within == 0 && n == self.block_len(b);
            if self.uncache_for_zeroes(b, whole) {
                self.settle(b).await?;
                self.origin.write_zeroes(b * self.block + within, n, flags).await?;
                if whole {
                    self.state.lock().zeroed.insert(b);
                }
            } else {
                if flags.fast_only {
                    return Err(Error::new(ErrorKind::Unsupported, "zeroing a cached block is not fast"));
                }
                drop(x);
                self.write_piece(b, within, Buf::zeroed(n as usize), false, false).await?;
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------------- durability

    /// Makes every completed write durable: origin flush, cache data flush, then the
    /// changed table pages and another cache flush.
    pub async fn commit(&self) -> Result<()> {
        self.state.lock().stopped()?;
        let guard = self.commit_lock.lock().await;
        self.commit_locked(&guard, true).await
    }

    /// Makes table changes up to number `n` durable, sharing a commit with everyone who
    /// waits for one meanwhile.
    async fn commit_upto(&self, n: u64) -> Result<()> {
        let done = |me: &Self| {
            let st = me.state.lock();
            st.stopped().map(|_| st.durable_changes >= n)
        };
        if done(self)? {
            return Ok(());
        }
        let guard = self.commit_lock.lock().await;
        if done(self)? {
            return Ok(());
        }
        self.commit_locked(&guard, false).await
    }

    /// Waits until no durable mapping of `b` can outlive a crash, if it was unmapped lately:
    /// the origin copy of `b` may be written from then on. (A clean mapping that came back
    /// after a crash would hide the new origin data, and read differently once evicted.)
    async fn settle(&self, b: u64) -> Result<()> {
        let pending = self.state.lock().pending.get(&b).copied();
        match pending {
            Some(n) => self.commit_upto(n).await,
            None => Ok(()),
        }
    }

    /// A full commit (`full`) also records the clean mappings made since the last one and
    /// flushes the origin first; a light one flushes the cache device only.
    async fn commit_locked(&self, _guard: &tokio::sync::MutexGuard<'_, ()>, full: bool) -> Result<()> {
        let (batch, freed) = {
            let mut st = self.state.lock();
            st.stopped()?;
            if full {
                st.record_clean();
            }
            if st.meta.has_changes() {
                let freed = std::mem::take(&mut st.freed);
                (Some(st.meta.prepare_commit()), freed)
            } else {
                (None, Vec::new())
            }
        };
        let origin_flush = async {
            match full {
                true => self.origin.flush().await,
                false => Ok(()),
            }
        };
        let (o, c) = tokio::join!(origin_flush, self.cache.flush());
        // On failure: the error, and whether the cache device failed (whatever else did).
        let result: std::result::Result<(), (Error, bool)> = async {
            c.map_err(|e| (during(e, "cache flush"), true))?;
            o.map_err(|e| (during(e, "origin flush"), false))?;
            if let Some(batch) = &batch {
                let writes = batch.pages.iter().map(|(_, off, _, bytes)| self.cache.write(*off, Buf::from_slice(bytes), false));
                futures_join(writes).await.map_err(|e| (during(e, "metadata write"), true))?;
                self.cache.flush().await.map_err(|e| (during(e, "metadata flush"), true))?;
            }
            Ok(())
        }
        .await;
        let mut st = self.state.lock();
        match (&batch, &result) {
            (Some(b), Ok(())) => {
                st.meta.commit_done(b);
                st.free.extend(freed);
                st.durable_changes = b.upto;
                st.pending.retain(|_, n| *n > b.upto);
                Counters::bump(&self.counters.commits);
            }
            (Some(b), Err(_)) => {
                st.meta.commit_failed(b);
                st.freed.extend(freed);
            }
            _ => {}
        }
        result.map_err(|(e, cache_device)| {
            st.fail(format!("{e}"), cache_device);
            e
        })
    }

    // ------------------------------------------------------------------ write-back

    /// Writes back one dirty block; returns what to mark clean once the origin is flushed.
    async fn writeback_one(&self, b: u64) -> Option<(u64, u32, u32)> {
        let exclusive = self.shard(b).clone().write_owned().await;
        let (s, generation) = {
            let mut st = self.state.lock();
            let s = *st.map.get(&b)?;
            if !st.meta.entries[s as usize].dirty {
                st.policy.set_clean(b);
                return None;
            }
            (s, st.write_gen[s as usize])
        };
        self.refs[s as usize].fetch_add(1, Relaxed);
        let len = self.block_len(b);
        let data = self.cache.read(self.slot_offset(s), Buf::zeroed(len as usize)).await;
        self.refs[s as usize].fetch_sub(1, Relaxed);
        {
            let mut st = self.state.lock();
            if st.cache_suspect {
                // The cache device lost writes in a failed flush: the slot may hold older
                // data, another block's; copying it to the origin would make that permanent.
                st.policy.set_dirty(b);
                return None;
            }
        }
        let data = match data {
            Ok(d) => d,
            Err(e) => {
                let mut st = self.state.lock();
                st.fault(format!("write-back of block {b}: cache slot {s} unreadable: {e}"));
                st.policy.set_dirty(b);
                return None;
            }
        };
        // The block stays locked until the origin has the data, so a later write, discard or
        // write-zeroes of it can never be overtaken by this older copy.
        let written = match self.settle(b).await {
            Ok(()) => self.origin_write(b * self.block, data, false, Kind::Migration).await,
            Err(e) => Err(e),
        };
        drop(exclusive);
        match written {
            Ok(_) => {
                self.counters.migration_bytes.fetch_add(len, Relaxed);
                Some((b, s, generation))
            }
            Err(e) => {
                let mut st = self.state.lock();
                st.fault(format!("write-back of block {b} to the origin failed: {e}"));
                st.policy.set_dirty(b);
                None
            }
        }
    }

    /// Writes back up to `max` dirty blocks, then flushes the origin and marks them clean.
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
        let mut done = Vec::new();
        for chunk in picked.chunks(WRITEBACK_DEPTH) {
            let results = futures_collect(chunk.iter().map(|&b| self.writeback_one(b))).await;
            done.extend(results.into_iter().flatten());
        }
        // Under the commit lock, as every flush is: two flushes of one device in flight at
        // once can split a failure between them (only one sees the error, as with two fsyncs
        // of one file), and the other would acknowledge what the failure lost. Latched before
        // the lock is released, so no commit after it acknowledges anything.
        let commit_guard = self.commit_lock.lock().await;
        let flushed = {
            let _busy = self.meter.start(Kind::Migration);
            self.origin.flush().await
        };
        let mut st = self.state.lock();
        if let Err(e) = &flushed {
            st.fail(format!("origin flush after write-back: {e}"), false);
        }
        drop(commit_guard);
        let mut cleaned = 0;
        for (b, s, generation) in done {
            let current = st.map.get(&b) == Some(&s) && st.write_gen[s as usize] == generation;
            if flushed.is_ok() && current {
                st.meta.set_dirty(s, false);
                st.policy.set_clean(b);
                Counters::bump(&self.counters.writebacks);
                cleaned += 1;
            } else if st.map.get(&b) == Some(&s) {
                st.policy.set_dirty(b); // written again meanwhile: offer it again later
            }
        }
        cleaned
    }
}

/// `e`, saying what it happened during.
fn during(e: Error, what: &str) -> Error {
    Error::new(e.kind, format!("{what}: {}", e.context))
}

/// Runs futures concurrently and collects their results in order (first error wins).
async fn futures_join<T, F>(futs: impl Iterator<Item = F>) -> Result<Vec<T>>
where
    F: std::future::Future<Output = Result<T>>,
{
    futures_collect(futs).await.into_iter().collect()
}

async fn futures_collect<T, F>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T>,
{
    futures::future::join_all(futs).await
}

/// Slots kept out of the policy's reach: a promotion takes a slot whose release is already
/// durable while the slot it evicted waits for the next commit, so the policy manages all
/// but a small reserve (1/64 of the slots, 1 to 256).
pub fn slot_reserve(slots: usize) -> usize {
    (slots / 64).clamp(1, 256).min(slots.saturating_sub(1))
}

/// What the policy is given to manage.
pub fn policy_capacity(slots: usize) -> usize {
    (slots - slot_reserve(slots)).max(1)
}

/// The settings a cache is opened with beyond its superblock.
pub struct OpenOptions {
    pub seed: u64,
    /// Most share of origin time migration may take (0..1).
    pub migration_share_max: f64,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { seed: 0, migration_share_max: 0.5 }
    }
}

impl CacheDev {
    /// Opens a formatted cache over `origin`: recovers the mapping (cost: reading the table),
    /// restores policy hints after a clean shutdown, and starts the background tasks.
    pub async fn open(
        cache: Arc<dyn BlockDev>,
        origin: Arc<dyn BlockDev>,
        meta: Meta,
        opts: OpenOptions,
    ) -> Result<CacheDev> {
        let sb: Superblock = meta.sb.clone();
        if origin.size() != sb.origin_bytes {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "origin size changed: the cache was made for {} bytes, {} has {}",
                    sb.origin_bytes,
                    origin.describe(),
                    origin.size()
                ),
            ));
        }
        let slots = sb.slots as usize;
        let params = Params { seed: opts.seed, origin_blocks: Some(sb.origin_blocks()), ..Params::default() };
        let mut policy = strata_policy::build(&sb.policy, policy_capacity(slots), &params)
            .map_err(|e| Error::new(ErrorKind::Invalid, e.to_string()))?;
        let mut map = FxHashMap::default();
        let mut free = Vec::new();
        for (s, e) in meta.entries.iter().enumerate() {
            if e.valid {
                map.insert(e.origin_block, s as u32);
            } else {
                free.push(s as u32);
            }
        }
        free.reverse(); // hand out low slots first
        let hints = if sb.clean_shutdown && sb.hints_len > 0 {
            let b = cache.read(sb.hints_offset, Buf::zeroed(sb.hints_len.div_ceil(4096) as usize * 4096)).await?;
            let h = b[..sb.hints_len as usize].to_vec();
            (crc32c::crc32c(&h) == sb.hints_crc).then_some(h)
        } else {
            None
        };
        if let Some(h) = hints {
            if policy.load_hints(&h).is_err() {
                policy = strata_policy::build(&sb.policy, policy_capacity(slots), &params).expect("built above");
            }
        }
        // The mapping is authoritative: reconcile the policy with it.
        for (&b, &s) in &map {
            let dirty = meta.entries[s as usize].dirty;
            if !policy.contains(b) {
                let _ = policy.insert(b, dirty);
            }
            if dirty {
                policy.set_dirty(b);
            }
        }
        let stale: Vec<u64> = (0..sb.origin_blocks()).filter(|b| policy.contains(*b) && !map.contains_key(b)).collect();
        for b in stale {
            policy.remove(b);
        }
        let describe = format!("cache ({}, {} blocks of {} KiB, policy {}) of {} on {}", sb.mode.name(), sb.slots, sb.block_bytes >> 10, sb.policy, origin.describe(), cache.describe());
        let inner = Arc::new(Inner {
            block: sb.block_bytes as u64,
            data_offset: sb.data_offset,
            origin_bytes: sb.origin_bytes,
            refs: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            shards: (0..SHARDS).map(|_| Arc::new(RwLock::new(()))).collect(),
            commit_lock: tokio::sync::Mutex::new(()),
            counters: Counters::default(),
            windows: Windows::new(),
            budget: Budget::new(sb.migration_budget_bytes_per_s),
            meter: OriginMeter::new(),
            wake: Notify::new(),
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
            describe,
            share_cap: Mutex::new(opts.migration_share_max),
            state: Mutex::new(State {
                policy,
                map,
                write_gen: vec![0; slots],
                meta,
                free,
                freed: Vec::new(),
                streams: Streams::new(),
                zeroed: FxHashSet::default(),
                pending: FxHashMap::default(),
                durable_changes: 0,
                unrecorded: Vec::new(),
                flush_all: false,
                faults: Vec::new(),
                failed: None,
                cache_suspect: false,
            }),
            origin,
            cache,
        });
        // From now on a crash is not a clean shutdown: hints must not be trusted.
        {
            let mut st = inner.state.lock();
            st.meta.sb.clean_shutdown = false;
            st.meta.sb.hints_len = 0;
        }
        inner.write_superblock().await?;
        inner.commit().await?;
        tokio::spawn(background(Arc::downgrade(&inner)));
        Ok(CacheDev { inner })
    }

    pub fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The origin blocks whose clean cached copy differs from the origin (there should be
    /// none: a clean slot is a copy of its block, before and after a crash).
    pub async fn verify_clean(&self) -> Result<Vec<u64>> {
        let me = &self.inner;
        let clean: Vec<u64> = {
            let st = me.state.lock();
            st.map.iter().filter(|&(_, &s)| !st.meta.entries[s as usize].dirty).map(|(&b, _)| b).collect()
        };
        let mut differ = Vec::new();
        for b in clean {
            let _g = me.shard(b).clone().read_owned().await;
            let s = {
                let st = me.state.lock();
                match st.map.get(&b) {
                    Some(&s) if !st.meta.entries[s as usize].dirty => s,
                    _ => continue,
                }
            };
            let len = me.block_len(b) as usize;
            let (c, o) = tokio::join!(me.cache.read(me.slot_offset(s), Buf::zeroed(len)), me.origin.read(b * me.block, Buf::zeroed(len)));
            if c?[..] != o?[..] {
                differ.push(b);
            }
        }
        differ.sort_unstable();
        Ok(differ)
    }
}

impl Inner {
    async fn write_superblock(&self) -> Result<()> {
        let _g = self.commit_lock.lock().await;
        let (bytes, at) = {
            let mut st = self.state.lock();
            st.meta.sb.seq += 1;
            (st.meta.sb.encode(), (st.meta.sb.seq % 2) * 4096)
        };
        self.cache.write(at, Buf::from_slice(&bytes), true).await.map(|_| ())
    }

    /// Clean shutdown: write back nothing extra, commit, save hints, mark clean.
    async fn shutdown(&self) -> Result<()> {
        self.stop.store(true, Relaxed);
        self.wake.notify_waiters();
        self.commit().await?;
        let (hints, offset, capacity) = {
            let st = self.state.lock();
            (st.policy.save_hints(), st.meta.sb.hints_offset, st.meta.sb.hints_capacity)
        };
        if (hints.len() as u64) <= capacity && !hints.is_empty() {
            let mut b = Buf::zeroed(hints.len().div_ceil(4096) * 4096);
            b[..hints.len()].copy_from_slice(&hints);
            self.cache.write(offset, b, true).await?;
            let mut st = self.state.lock();
            st.meta.sb.hints_len = hints.len() as u64;
            st.meta.sb.hints_crc = crc32c::crc32c(&hints);
        }
        self.state.lock().meta.sb.clean_shutdown = true;
        self.write_superblock().await
    }

    fn status(&self) -> serde_json::Value {
        use std::sync::atomic::Ordering::Relaxed as R;
        let c = &self.counters;
        let st = self.state.lock();
        let sb = &st.meta.sb;
        let up = self.epoch.elapsed().as_secs_f64().max(1e-9);
        serde_json::json!({
            "mode": sb.mode.name(),
            "policy": sb.policy,
            "block_size": sb.block_bytes,
            "read_hits": c.read_hits.load(R),
            "read_misses": c.read_misses.load(R),
            "write_hits": c.write_hits.load(R),
            "write_misses": c.write_misses.load(R),
            "promotions": c.promotions.load(R),
            "demotions": c.demotions.load(R),
            "writebacks": c.writebacks.load(R),
            "dirty_blocks": st.policy.dirty_len(),
            "cached_blocks": st.map.len(),
            "cache_blocks": sb.slots,
            "free_blocks": st.free.len() + st.freed.len(),
            "migration_bytes": c.migration_bytes.load(R),
            "migration_budget_bytes_per_s": self.budget.rate(),
            "sequential_cutoff_bytes": sb.sequential_cutoff_bytes,
            "writeback_percent": sb.writeback_percent,
            "readahead_bytes": sb.readahead_bytes,
            "readahead_blocks": c.readahead_blocks.load(R),
            "bypassed": c.bypassed.load(R),
            "promotions_skipped": c.promotions_skipped.load(R),
            "commits": c.commits.load(R),
            "hit_ratio_10s": self.windows.ratio(c, Duration::from_secs(10)),
            "hit_ratio_1m": self.windows.ratio(c, Duration::from_secs(60)),
            "hit_ratio_1h": self.windows.ratio(c, Duration::from_secs(3600)),
            "hit_ratio_total": Windows::total(c),
            "origin_busy_foreground_s": self.meter.busy(Kind::Foreground).as_secs_f64(),
            "origin_busy_migration_s": self.meter.busy(Kind::Migration).as_secs_f64(),
            "origin_busy_share": (self.meter.busy(Kind::Foreground) + self.meter.busy(Kind::Migration)).as_secs_f64() / up,
            "flushing": st.flush_all,
            "faults": st.faults.iter().rev().take(8).cloned().collect::<Vec<_>>(),
            "degraded": !st.faults.is_empty(),
            "stopped": st.failed,
        })
    }

    async fn message(&self, msg: &str) -> Result<String> {
        let invalid = |m: String| Error::new(ErrorKind::Invalid, m);
        let (key, value) = msg.split_once([' ', '=']).map(|(k, v)| (k.trim(), v.trim())).unwrap_or((msg.trim(), ""));
        let answer = {
            let mut st = self.state.lock();
            st.stopped()?;
            match key {
                "mode" => {
                    let m: Mode = value.parse().map_err(invalid)?;
                    st.meta.sb.mode = m;
                    format!("mode {}", m.name())
                }
                "policy" => {
                    let params = Params { origin_blocks: Some(st.meta.sb.origin_blocks()), ..Params::default() };
                    let mut p = strata_policy::build(value, policy_capacity(st.meta.slots()), &params)
                        .map_err(|e| invalid(e.to_string()))?;
                    let st = &mut *st;
                    for (&b, &s) in &st.map {
                        let _ = p.insert(b, st.meta.entries[s as usize].dirty);
                    }
                    st.policy = p;
                    st.meta.sb.policy = value.to_string();
                    format!("policy {value}")
                }
                "migration_budget" | "migration-budget" => {
                    let r = strata_io::units::parse_rate(value).map_err(invalid)?;
                    st.meta.sb.migration_budget_bytes_per_s = r;
                    self.budget.set_rate(r);
                    format!("migration budget {r} bytes/s")
                }
                "sequential_cutoff" | "sequential-cutoff" => {
                    let c = strata_io::units::parse_size(value).map_err(invalid)?;
                    st.meta.sb.sequential_cutoff_bytes = c;
                    format!("sequential cutoff {c} bytes")
                }
                "readahead" => {
                    let r = strata_io::units::parse_size(value).map_err(invalid)?;
                    crate::admin::check_readahead(r)?;
                    st.meta.sb.readahead_bytes = r as u32;
                    format!("readahead {r} bytes")
                }
                "writeback_percent" | "writeback-percent" => {
                    let p: u32 = value.parse().ok().filter(|p| *p <= 100).ok_or_else(|| invalid(format!("bad percent {value:?}")))?;
                    st.meta.sb.writeback_percent = p;
                    format!("writeback percent {p}")
                }
                "flush" => {
                    st.flush_all = true;
                    self.wake.notify_one();
                    return Ok(format!("writing back {} dirty blocks", st.policy.dirty_len()));
                }
                "invalidate" => {
                    let n = st.invalidate_clean(&self.counters);
                    return Ok(format!("dropped {n} clean blocks"));
                }
                "detach" => {
                    st.meta.sb.mode = Mode::Cleaner;
                    st.flush_all = true;
                    self.wake.notify_one();
                    format!("cleaner mode: writing back {} dirty blocks", st.policy.dirty_len())
                }
                _ => {
                    return Err(invalid(format!(
                        "unknown message {key:?} (mode, policy, migration_budget, sequential_cutoff, readahead, writeback_percent, flush, invalidate, detach)"
                    )))
                }
            }
        };
        self.write_superblock().await?;
        Ok(answer)
    }
}

/// The background task: periodic commits, windowed statistics, and paced write-back.
async fn background(weak: std::sync::Weak<Inner>) {
    let mut last_commit = Instant::now();
    let mut integral = 0.0f64;
    let mut last_busy = (Duration::ZERO, Duration::ZERO, Instant::now());
    let mut credit = 0.0f64;
    loop {
        let Some(me) = weak.upgrade() else { return };
        if me.stop.load(Relaxed) {
            return;
        }
        let woken = tokio::time::timeout(TICK, me.wake.notified()).await.is_ok();
        if me.stop.load(Relaxed) {
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
        if (need_slots || last_commit.elapsed() >= COMMIT_INTERVAL || woken)
            && me.commit().await.is_ok() {
                last_commit = Instant::now();
            }
        // Origin time used since the last tick, by foreground and by migration.
        let (fg, mg) = (me.meter.busy(Kind::Foreground), me.meter.busy(Kind::Migration));
        let dt = last_busy.2.elapsed().as_secs_f64().max(1e-3);
        let fg_share = (fg - last_busy.0).as_secs_f64() / dt;
        let mg_share = (mg - last_busy.1).as_secs_f64() / dt;
        last_busy = (fg, mg, Instant::now());

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
        if dirty == 0.0 {
            if flush_all {
                me.state.lock().flush_all = false;
            }
            integral = 0.0;
            credit = 0.0;
            continue;
        }
        // bcache's controller, in blocks per second: proportional to how far above target
        // the dirty count is, plus an integral term; flat out when the origin is idle or a
        // flush was asked for.
        let error = dirty - target;
        let idle = fg_share < IDLE_SHARE;
        let budget_blocks = match me.budget.rate() {
            0 => f64::INFINITY,
            r => r as f64 / me.block as f64,
        };
        let rate = if flush_all || idle {
            budget_blocks
        } else if error > 0.0 {
            integral = (integral + error * dt / 10_000.0).max(0.0);
            (error / 40.0 + integral).max(1.0).min(budget_blocks)
        } else {
            integral = 0.0;
            0.0
        };
        // Migration's own share of origin time stays under the cap unless flushing.
        let cap = *me.share_cap.lock();
        if mg_share > cap && !flush_all && !idle {
            continue;
        }
        // At most one second of credit, and at most one batch per tick.
        credit = (credit + rate * dt).min(rate.max(1.0)).min(WRITEBACK_BATCH_MAX as f64);
        let n = credit.floor() as usize;
        if n == 0 {
            continue;
        }
        let mut allowed = 0;
        while allowed < n && me.budget.try_take(me.block) {
            allowed += 1;
        }
        if allowed == 0 {
            continue;
        }
        credit -= allowed as f64;
        me.writeback_batch(allowed).await;
    }
}

impl BlockDev for CacheDev {
    fn size(&self) -> u64 {
        self.inner.origin_bytes
    }

    fn geometry(&self) -> Geometry {
        let o = self.inner.origin.geometry();
        let c = self.inner.cache.geometry();
        Geometry {
            min_block_bytes: o.min_block_bytes.max(c.min_block_bytes),
            preferred_block_bytes: o.preferred_block_bytes.max(c.preferred_block_bytes),
            rotational: false,
            can_discard: true,
            can_fast_zero: o.can_fast_zero,
        }
    }

    fn describe(&self) -> String {
        self.inner.describe.clone()
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        Box::pin(self.inner.read(offset, buf))
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(self.inner.write(offset, buf, fua))
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.commit())
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.discard(offset, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.write_zeroes(offset, len, flags))
    }

    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        Box::pin(async move {
            let any_cached = {
                let st = self.inner.state.lock();
                self.inner.pieces(offset, len).iter().any(|(b, _, _)| st.map.contains_key(b))
            };
            if any_cached {
                Ok(vec![Extent::data(len)])
            } else {
                self.inner.origin.block_status(offset, len).await
            }
        })
    }

    fn cache(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        // A prefetch hint: read the range through the cache so the policy sees it.
        Box::pin(async move {
            strata_io::check_range("cache prefetch", offset, len, self.inner.origin_bytes)?;
            let mut pos = offset;
            while pos < offset + len {
                let n = (offset + len - pos).min(4 << 20);
                self.inner.read(pos, Buf::zeroed(n as usize)).await?;
                pos += n;
            }
            Ok(())
        })
    }

    fn status(&self) -> Option<serde_json::Value> {
        Some(self.inner.status())
    }

    fn message(&self, msg: &str) -> BoxFut<'_, Result<String>> {
        let msg = msg.to_string();
        Box::pin(async move { self.inner.message(&msg).await })
    }

    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.shutdown())
    }
}

impl Drop for CacheDev {
    fn drop(&mut self) {
        self.inner.stop.store(true, Relaxed);
        self.inner.wake.notify_waiters();
    }
}
