//! The books kept under the state lock: a slot is free, reserved by a promotion under way,
//! mapped, or freed in memory and reusable once a commit records it free. Also the faults
//! that degrade or stop the volume, and `State::check`, the invariants that tie the books,
//! the mapping table and the policy together.

use super::{CacheDev, Inner, State};
use crate::format::Mode;
use crate::meter::Counters;
use rustc_hash::FxHashSet;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;
use strata_io::{Error, ErrorKind, Result};

impl State {
    /// Latches a failed flush or commit: data it covered may be gone from a device however
    /// later flushes fare (a buffered file drops pages whose write-back failed), so the
    /// volume stops acknowledging writes and flushes until an operator restarts it, which
    /// recovers from what is durable.
    pub(super) fn fail(&mut self, why: String, cache_device: bool) {
        self.cache_suspect |= cache_device;
        if self.failed.is_none() {
            self.failed = Some(why.clone());
            self.record(format!("stopped: {why}"), true);
        }
    }

    /// Records a fault and goes to the safe mode: no new dirty data (writeback becomes
    /// writethrough), while dirty data stays readable where it is and keeps being written
    /// back. The mode change is in memory (the superblock keeps the mode set, see
    /// [`State::superblock`]); an operator sets it for good with `cache set`.
    /// The first fault and the change of mode are said on stderr too; the status keeps the
    /// last 64.
    pub(super) fn fault(&mut self, what: String) {
        self.record(what, false);
    }

    /// [`State::fault`], said on stderr whatever came before if `say` (a stop).
    fn record(&mut self, what: String, say: bool) {
        let to_writethrough = self.meta.sb.mode == Mode::Writeback;
        if say || self.faults.is_empty() || to_writethrough {
            let then = if to_writethrough { "; writethrough until restart or a mode is set" } else { "" };
            eprintln!("strata: cache of {}: {what}{then}", self.meta.sb.origin_spec);
        }
        if self.faults.len() >= 64 {
            self.faults.remove(0);
        }
        self.faults.push(what);
        if to_writethrough {
            self.safe_mode = true;
            self.meta.sb.mode = Mode::Writethrough;
        }
    }

    /// The mode an operator set, which the superblock keeps: not the safe mode a fault put
    /// the running volume in.
    pub(super) fn saved_mode(&self) -> Mode {
        if self.safe_mode {
            Mode::Writeback
        } else {
            self.meta.sb.mode
        }
    }

    /// The superblock to write, next in sequence, with [`State::saved_mode`].
    pub(super) fn superblock(&mut self) -> crate::format::Superblock {
        self.meta.sb.seq += 1;
        let mode = self.saved_mode();
        crate::format::Superblock { mode, ..self.meta.sb.clone() }
    }

    /// Removes `b` from the mapping. If the table holds the mapping, its slot is reusable
    /// after the next commit and the origin copy of `b` is not written before then
    /// (`pending`); an unrecorded one's slot is free at once.
    pub(super) fn unmap(&mut self, b: u64) -> Option<u32> {
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
    pub(super) fn demote(&mut self, b: u64, counters: &Counters) -> Option<u32> {
        let s = self.unmap(b)?;
        Counters::bump(&counters.demotions);
        Some(s)
    }

    /// Whether slot `s` was mapped since the last good cache flush started (its data is lost
    /// if the flush under way, or the next, fails).
    pub(super) fn is_fresh(&self, s: u32) -> bool {
        self.fresh.contains(&s) || self.flushing.contains(&s)
    }

    /// Maps `b` to `s`, a slot `reserve` gave out: dirty, as one table change; clean, in
    /// memory until the next full commit records it (`unrecorded`).
    pub(super) fn map_to(&mut self, b: u64, s: u32, dirty: bool) {
        self.reserved -= 1;
        self.map.insert(b, s);
        self.fresh.insert(s);
        if dirty {
            self.meta.set(s, b, true, true);
        } else {
            self.unrecorded.push((b, s));
        }
        self.write_gen[s as usize] = self.write_gen[s as usize].wrapping_add(1);
    }

    /// Puts the clean mappings still current into the table (before a full commit).
    pub(super) fn record_clean(&mut self) {
        for (b, s) in std::mem::take(&mut self.unrecorded) {
            if self.map.get(&b) == Some(&s) && !self.meta.entries[s as usize].valid {
                self.meta.set(s, b, true, false);
            }
        }
    }

    /// Unmaps every clean block (dm-cache's `invalidate_cblocks` for the whole cache):
    /// the next reads go to the origin. Returns how many were dropped.
    pub(super) fn invalidate_clean(&mut self, counters: &Counters) -> usize {
        let clean: Vec<u64> =
            self.map.iter().filter(|&(_, &s)| !self.meta.entries[s as usize].dirty).map(|(&b, _)| b).collect();
        for &b in &clean {
            self.policy.remove(b);
            self.demote(b, counters);
        }
        clean.len()
    }

    pub(super) fn stopped(&self) -> Result<()> {
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

    /// A free slot that no IO still uses, reserved until `map_to` or `release`.
    pub(super) fn reserve(&mut self, refs: &[AtomicU32]) -> Option<u32> {
        let pos = self.free.iter().rposition(|&s| refs[s as usize].load(Relaxed) == 0)?;
        self.reserved += 1;
        Some(self.free.swap_remove(pos))
    }

    /// Hands back a slot `reserve` gave out and that was not mapped after all.
    pub(super) fn release(&mut self, s: u32) {
        self.reserved -= 1;
        self.free.push(s);
    }

    /// Applies a promotion decision's eviction. False if the victim turned out dirty: a
    /// policy bug (a policy never picks a dirty victim), which fails debug builds and is
    /// counted in `dirty_victims_refused`; the engine refuses to act on it and puts the
    /// victim back.
    pub(super) fn evict(&mut self, victim: Option<u64>, counters: &Counters) -> bool {
        let Some(v) = victim else { return true };
        if let Some(&s) = self.map.get(&v) {
            if self.meta.entries[s as usize].dirty {
                Counters::bump(&counters.dirty_victims_refused);
                let _ = self.policy.insert(v, true);
                debug_assert!(false, "policy {} chose dirty block {v} (slot {s}) as a victim", self.policy.name());
                return false;
            }
        }
        self.demote(v, counters);
        true
    }

    /// Checks, by walking every slot and mapping, what must hold whenever the state lock is
    /// free: each slot is exactly one of mapped, free, freed, being committed free, or
    /// reserved; a valid table entry
    /// is the mapping of its block, and a mapped slot's entry is valid unless it is a clean
    /// mapping awaiting a full commit; only valid entries are dirty; every mapped block is
    /// known to the policy, dirty there exactly when its entry is. `Err` names the first
    /// broken one.
    pub(super) fn check(&self) -> std::result::Result<(), String> {
        let slots = self.meta.slots();
        let mut place: Vec<Option<&str>> = vec![None; slots];
        let lists = [
            ("mapped", self.map.values().copied().collect()),
            ("free", self.free.clone()),
            ("freed", self.freed.clone()),
            ("being committed free", self.committing.clone()),
        ];
        for (what, list) in &lists {
            for &s in list {
                let at =
                    place.get_mut(s as usize).ok_or_else(|| format!("{what} slot {s} is beyond the {slots} slots"))?;
                if let Some(before) = at.replace(what) {
                    return Err(format!("slot {s} is both {before} and {what}"));
                }
            }
        }
        let (mapped, free, freed, committing) =
            (self.map.len(), self.free.len(), self.freed.len(), self.committing.len());
        if mapped + free + freed + committing + self.reserved != slots {
            return Err(format!(
                "{mapped} mapped + {free} free + {freed} freed + {committing} being committed free + {} reserved \
                 slots, but there are {slots}",
                self.reserved
            ));
        }
        for (s, e) in self.meta.entries.iter().enumerate() {
            if e.valid && self.map.get(&e.origin_block) != Some(&(s as u32)) {
                return Err(format!("slot {s}'s table entry maps block {}, the map does not", e.origin_block));
            }
            if e.dirty && !e.valid {
                return Err(format!("slot {s}'s table entry is dirty but not valid"));
            }
        }
        let unrecorded: FxHashSet<(u64, u32)> = self.unrecorded.iter().copied().collect();
        for (&b, &s) in &self.map {
            let e = &self.meta.entries[s as usize];
            if !e.valid && !unrecorded.contains(&(b, s)) {
                return Err(format!("block {b} is mapped to slot {s}, which is neither in the table nor awaiting it"));
            }
            if !self.policy.contains(b) {
                return Err(format!("block {b} is mapped to slot {s} but unknown to the policy"));
            }
            if self.policy.is_dirty(b) != e.dirty {
                return Err(format!(
                    "block {b} in slot {s} is dirty {} in the table, {} in the policy",
                    e.dirty, !e.dirty
                ));
            }
        }
        let dirty = self.meta.entries.iter().filter(|e| e.dirty).count();
        if self.policy.dirty_len() != dirty {
            return Err(format!("{dirty} dirty table entries, {} dirty blocks in the policy", self.policy.dirty_len()));
        }
        Ok(())
    }

    /// `check` where it costs nothing that matters: debug builds (tests) panic on a broken
    /// invariant; release builds do not check.
    pub(super) fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if let Err(e) = self.check() {
            panic!("cache state: {e}");
        }
    }
}

impl CacheDev {
    /// Checks the invariants of the cache's in-memory state (see `State::check`); for tests,
    /// in any build.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner.state.lock().check()
    }
}

impl Inner {
    /// Commits to make freed slots reusable, then takes one, waiting for promotions in
    /// flight to hand theirs back if need be; if none comes (every slot still in use), the
    /// promotion of `b` is given up.
    pub(super) async fn slot_after_commit(&self, b: u64) -> Option<u32> {
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
    pub(super) async fn free_slot(&self) -> Option<u32> {
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

    /// Slots neither mapped nor free nor freed: promotions under way, and freed slots whose
    /// release a commit is making durable.
    fn slots_in_flight(&self, st: &State) -> usize {
        st.reserved + st.committing.len()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::format::{Layout, Superblock};
    use crate::meta::Meta;
    use crate::target::OpenOptions;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::Arc;
    use strata_io::mem::MemDev;
    use strata_io::{BlockDev, Buf, ZeroFlags};

    const ORIGIN: u64 = 8 << 20;
    const BLOCK: u32 = 32 << 10;

    /// A cache of a few dozen slots (on a 2 MiB `cache`) over 256 origin blocks (an 8 MiB
    /// `origin`), formatted in memory.
    pub(in crate::target) async fn small_cache<C, O>(
        mode: Mode,
        cache: &Arc<C>,
        origin: &Arc<O>,
        fresh: bool,
    ) -> Arc<CacheDev>
    where
        C: BlockDev + 'static,
        O: BlockDev + 'static,
    {
        let meta = if fresh {
            let slots = Layout::fit(cache.size(), BLOCK);
            let l = Layout::new(slots, BLOCK);
            Meta::fresh(Superblock {
                seq: 0,
                uuid: [7; 16],
                block_bytes: BLOCK,
                mode,
                clean_shutdown: false,
                slots,
                origin_bytes: ORIGIN,
                data_offset: l.data_offset,
                table_offset: l.table_offset,
                table_pages: l.table_pages,
                hints_offset: l.hints_offset,
                hints_capacity: l.hints_capacity,
                hints_len: 0,
                hints_crc: 0,
                sequential_cutoff_bytes: 512 << 10,
                migration_budget_bytes_per_s: 0,
                writeback_percent: 0,
                readahead_bytes: 128 << 10,
                policy: strata_policy::DEFAULT_POLICY.into(),
                origin_spec: "mem:test".into(),
                origin_id: String::new(),
            })
        } else {
            Meta::load(&**cache).await.unwrap().0
        };
        Arc::new(CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap())
    }

    async fn random_ops(dev: Arc<CacheDev>, seed: u64, ops: usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..ops {
            let offset = rng.gen_range(0..ORIGIN / 512) * 512;
            let len = rng.gen_range(1..=(ORIGIN - offset).min(160 << 10) / 512) * 512;
            match rng.gen_range(0..10) {
                0..=3 => drop(dev.read(offset, Buf::zeroed(len as usize)).await.unwrap()),
                4..=6 => drop(
                    dev.write(offset, Buf::from_slice(&vec![rng.gen(); len as usize]), rng.gen_bool(0.1))
                        .await
                        .unwrap(),
                ),
                7 => dev.discard(offset, len).await.unwrap(),
                8 => dev.write_zeroes(offset, len, ZeroFlags::default()).await.unwrap(),
                _ => dev.flush().await.unwrap(),
            }
        }
    }

    /// `policy default` is recorded and shown as the policy it stands for.
    #[tokio::test]
    async fn the_default_policy_is_named_as_what_it_is() {
        let (cache, origin) = (Arc::new(MemDev::new(2 << 20)), Arc::new(MemDev::new(ORIGIN)));
        let dev = small_cache(Mode::Writeback, &cache, &origin, true).await;
        dev.message("policy lru").await.unwrap();
        let answer = dev.message("policy default").await.unwrap();
        assert!(answer.contains(strata_policy::DEFAULT_POLICY), "{answer}");
        assert_eq!(dev.status().unwrap()["policy"], strata_policy::DEFAULT_POLICY);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn random_workloads_keep_the_invariants() {
        for (seed, mode) in [Mode::Writeback, Mode::Writethrough, Mode::Writearound].into_iter().enumerate() {
            let (cache, origin) = (Arc::new(MemDev::new(2 << 20)), Arc::new(MemDev::new(ORIGIN)));
            let dev = small_cache(mode, &cache, &origin, true).await;
            let clients: Vec<_> =
                (0..3).map(|c| tokio::spawn(random_ops(dev.clone(), seed as u64 * 10 + c, 300))).collect();
            let disturber = {
                let dev = dev.clone();
                tokio::spawn(async move {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed as u64);
                    let msgs = [
                        "mode writeback",
                        "mode writethrough",
                        "mode cleaner",
                        "flush",
                        "invalidate",
                        "policy lru",
                        "policy strata",
                    ];
                    for _ in 0..30 {
                        tokio::time::sleep(std::time::Duration::from_millis(rng.gen_range(1..10))).await;
                        dev.message(msgs[rng.gen_range(0..msgs.len())]).await.unwrap();
                        dev.check_invariants().unwrap();
                    }
                })
            };
            for c in clients {
                c.await.unwrap();
            }
            disturber.await.unwrap();
            dev.check_invariants().unwrap();
            let s = dev.status().unwrap();
            assert!(s["promotions"].as_u64().unwrap() > 0, "the workload never promoted: {s}");
            // The same holds of the state recovered after a clean shutdown.
            dev.shutdown().await.unwrap();
            drop(dev);
            let dev = small_cache(mode, &cache, &origin, false).await;
            dev.check_invariants().unwrap();
        }
    }

    /// Writes whole blocks until some are cached dirty; returns one of them and its slot.
    async fn a_dirty_block(dev: &CacheDev) -> (u64, u32) {
        for round in 0..20u8 {
            for b in 0..8u64 {
                dev.write(b * BLOCK as u64, Buf::from_slice(&vec![round; BLOCK as usize]), false).await.unwrap();
            }
            let st = dev.inner.state.lock();
            if let Some((&b, &s)) = st.map.iter().find(|&(_, &s)| st.meta.entries[s as usize].dirty) {
                return (b, s);
            }
        }
        panic!("no block was cached dirty");
    }

    #[tokio::test]
    async fn check_names_each_broken_invariant() {
        let (cache, origin) = (Arc::new(MemDev::new(2 << 20)), Arc::new(MemDev::new(ORIGIN)));
        let dev = small_cache(Mode::Writeback, &cache, &origin, true).await;
        let (b, s) = a_dirty_block(&dev).await;
        let mut st = dev.inner.state.lock();
        st.check().unwrap();
        type Corruption = (&'static str, fn(&mut State, u64, u32), fn(&mut State, u64, u32));
        let corruptions: [Corruption; 5] = [
            ("is both mapped and free", |st, _, s| st.free.push(s), |st, _, _| _ = st.free.pop()),
            ("reserved slots, but there are", |st, _, _| st.reserved += 1, |st, _, _| st.reserved -= 1),
            (
                "unknown to the policy",
                |st, b, _| _ = st.policy.remove(b),
                |st, b, _| st.policy.insert(b, true).unwrap(),
            ),
            (
                "dirty false in the table, true in the policy",
                |st, _, s| st.meta.set_dirty(s, false),
                |st, _, s| st.meta.set_dirty(s, true),
            ),
            (
                "is both mapped and mapped",
                |st, b, s| _ = st.map.insert(b + 1000, s),
                |st, b, _| _ = st.map.remove(&(b + 1000)),
            ),
        ];
        for (what, corrupt, repair) in corruptions {
            corrupt(&mut st, b, s);
            let e = st.check().expect_err(what);
            assert!(e.contains(what), "expected {what:?}, got {e:?}");
            if cfg!(debug_assertions) {
                assert!(catch_unwind(AssertUnwindSafe(|| st.debug_check())).is_err(), "debug builds panic on {what:?}");
            }
            repair(&mut st, b, s);
            st.check().unwrap();
        }
    }

    #[tokio::test]
    async fn a_dirty_victim_is_refused_and_counted() {
        let (cache, origin) = (Arc::new(MemDev::new(2 << 20)), Arc::new(MemDev::new(ORIGIN)));
        let dev = small_cache(Mode::Writeback, &cache, &origin, true).await;
        let (b, s) = a_dirty_block(&dev).await;
        let counters = &dev.inner.counters;
        let mut st = dev.inner.state.lock();
        let evicted = catch_unwind(AssertUnwindSafe(|| st.evict(Some(b), counters)));
        // Debug builds stop at it; release builds go on without evicting.
        assert_eq!(evicted.ok(), if cfg!(debug_assertions) { None } else { Some(false) });
        assert_eq!(st.map.get(&b), Some(&s), "the dirty block stays mapped");
        assert_eq!(counters.dirty_victims_refused.load(Relaxed), 1);
        st.check().unwrap();
        drop(st);
        assert_eq!(dev.status().unwrap()["dirty_victims_refused"], 1);
    }

    /// While dirty-limited, writeback makes no new dirty data: whole and partial writes to
    /// uncached blocks and writes to clean cached blocks go through (clean), writes to a block
    /// already dirty stay in its slot; every write succeeds and reads back; lifted, writes
    /// make dirty data again.
    #[tokio::test]
    async fn dirty_limited_writes_go_through() {
        let (cache, origin) = (Arc::new(MemDev::new(2 << 20)), Arc::new(MemDev::new(ORIGIN)));
        let dev = small_cache(Mode::Writeback, &cache, &origin, true).await;
        let (b, _) = a_dirty_block(&dev).await;
        let bs = BLOCK as u64;
        let clean = b + 100;
        dev.read(clean * bs, Buf::zeroed(BLOCK as usize)).await.unwrap();
        let dirty_before = dev.inner.state.lock().policy.dirty_len();
        dev.inner.origin_busy.store(true, Relaxed);
        assert!(dev.status().unwrap()["dirty_limited"] == true, "{} dirty blocks", dirty_before);
        for (k, (blk, within, len)) in
            [(b, 512, 4096), (clean, 0, bs), (clean, 4096, 512), (b + 103, 0, bs), (b + 105, 8192, 4096)]
                .into_iter()
                .enumerate()
        {
            let at = blk * bs + within;
            let data = vec![k as u8 + 1; len as usize];
            dev.write(at, Buf::from_slice(&data), false).await.unwrap();
            let got = dev.read(at, Buf::zeroed(data.len())).await.unwrap();
            assert!(got[..] == data[..], "write {k} at {at} reads back");
        }
        {
            let st = dev.inner.state.lock();
            assert_eq!(st.policy.dirty_len(), dirty_before, "no new dirty block while limited");
            let s = st.map[&b];
            assert!(st.meta.entries[s as usize].dirty, "the dirty block stays dirty");
            st.check().unwrap();
        }
        let mut on_origin = vec![0u8; 4096];
        origin.read_into(b * bs + 512, &mut on_origin).unwrap();
        assert!(on_origin != vec![1u8; 4096], "the write to the dirty block stayed in its slot");
        dev.inner.origin_busy.store(false, Relaxed);
        let at = (b + 107) * bs;
        dev.write(at, Buf::from_slice(&vec![9u8; BLOCK as usize]), false).await.unwrap();
        assert!(dev.inner.state.lock().policy.dirty_len() > dirty_before, "writeback again once lifted");
    }

    /// An origin away for now (`Unavailable`: a remote server's outage) lifts the dirty
    /// limit: a write sent through would wait the outage out and fail, where the cache can
    /// keep it. Once the origin answers again the limit is back.
    #[tokio::test]
    async fn an_origin_away_lifts_the_dirty_limit() {
        use strata_io::fault::{FaultDev, Rule};
        use strata_io::ErrorKind;
        let cache = Arc::new(MemDev::new(2 << 20));
        let (origin, faults) = FaultDev::new(MemDev::new(ORIGIN));
        let origin = Arc::new(origin);
        let dev = small_cache(Mode::Writeback, &cache, &origin, true).await;
        let (b, _) = a_dirty_block(&dev).await;
        let bs = BLOCK as u64;
        dev.inner.origin_busy.store(true, Relaxed);
        let limited = || dev.status().unwrap()["dirty_limited"] == true;
        assert!(limited());
        faults.add(Rule::read_error(0..ORIGIN).kind(ErrorKind::Unavailable));
        faults.add(Rule::write_error(0..ORIGIN).kind(ErrorKind::Unavailable));
        let away = dev.read((b + 100) * bs, Buf::zeroed(BLOCK as usize)).await.unwrap_err();
        assert_eq!(away.kind, ErrorKind::Unavailable);
        assert!(!limited(), "an origin away is not a busy one");
        let dirty_before = dev.inner.state.lock().policy.dirty_len();
        for k in 0..4u64 {
            let data = vec![k as u8 + 1; BLOCK as usize];
            dev.write((b + 103 + k) * bs, Buf::from_slice(&data), false).await.unwrap();
            assert!(dev.read((b + 103 + k) * bs, Buf::zeroed(data.len())).await.unwrap()[..] == data[..]);
        }
        assert_eq!(dev.inner.state.lock().policy.dirty_len(), dirty_before + 4, "kept in the cache, dirty");
        faults.clear();
        dev.read((b + 100) * bs, Buf::zeroed(BLOCK as usize)).await.unwrap();
        assert!(limited(), "back, and busy: the limit holds again");
        dev.inner.state.lock().check().unwrap();
    }
}
