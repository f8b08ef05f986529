//! smq: dm-cache's stochastic multiqueue policy (drivers/md/dm-cache-policy-smq.c), as it
//! behaves since the Linux 4.12 fixes, rewritten as a synchronous state machine.
//!
//! * Admission: a *hotspot* queue tracks coarse regions (16 cache blocks, halved until the
//!   table fits the origin; max(cache/4, 1024) of them) in a 64-level multiqueue. Only misses
//!   touch it; a region climbs `level_jump` levels at most once per tick (1 s). A missed block
//!   is promoted when its region's level reaches the promote level, which depends on how
//!   often lookups land in the top quarter of the hotspot levels (confidence POOR / FAIR /
//!   WELL → level ≥ 48 / 32 / 0). A full-block write is promoted at once while the cache has
//!   free blocks.
//! * Ordering: cached blocks sit on a clean or a dirty 64-level multiqueue. A hit moves a block
//!   up one level at most once per cache period (60 s), swapping with the oldest block of the
//!   level above; every period the levels are redistributed to even sizes.
//! * The 2017 fixes: newly promoted blocks enter at the top level, and demotion only takes
//!   from the bottom half of the clean queue, so a cache full of stale (junk) blocks is
//!   replaced promptly. No pre-emptive demotion: a block is demoted only to admit another.
//!
//! Differences from the kernel, all forced by the synchronous interface: a promotion that
//! needs room demotes and promotes in the same call (the kernel queues the demotion and
//! promotes on a later miss); the writeback sentinels are not modelled, so
//! `writeback_candidate` always offers the coldest dirty block (the kernel's idle
//! behaviour) and the engine's writeback controller decides the pace; the period clock is the
//! `now_ns` of accesses rather than a timer.

use crate::hash::{block_map, map_bytes, mix64, BlockMap};
use crate::list::{Link, Linked, List};
use crate::{hints, Access, HintError, InsertError, Op, Outcome, Params, Policy};

pub(crate) const NR_LEVELS: usize = 64;
const NS_PER_S: u64 = 1_000_000_000;
const TICK_NS: u64 = NS_PER_S;
const HOTSPOT_PERIOD_NS: u64 = NS_PER_S;
const CACHE_PERIOD_NS: u64 = 60 * NS_PER_S;

/// An entry that lives on a [`MultiQueue`].
pub(crate) trait Leveled: Linked<0> {
    fn level(&self) -> usize;
    fn set_level(&mut self, level: usize);
}

/// 64 FIFO lists stacked into levels; level 0 is the coldest. dm-cache's `struct queue`.
#[derive(Debug, Clone)]
pub(crate) struct MultiQueue {
    levels: [List<0>; NR_LEVELS],
    nr_elts: usize,
    nr_top_levels: usize,
    nr_in_top_levels: usize,
    last_target_nr_elts: usize,
    target: [usize; NR_LEVELS],
}

impl MultiQueue {
    pub fn new(nr_top_levels: usize, nr_in_top_levels: usize) -> Self {
        MultiQueue {
            levels: [List::new(); NR_LEVELS],
            nr_elts: 0,
            nr_top_levels,
            nr_in_top_levels,
            last_target_nr_elts: usize::MAX,
            target: [0; NR_LEVELS],
        }
    }

    pub fn push<N: Leveled>(&mut self, nodes: &mut [N], i: u32) {
        let level = nodes[i as usize].level();
        self.levels[level].push_back(nodes, i);
        self.nr_elts += 1;
    }

    pub fn push_front<N: Leveled>(&mut self, nodes: &mut [N], i: u32) {
        let level = nodes[i as usize].level();
        self.levels[level].push_front(nodes, i);
        self.nr_elts += 1;
    }

    pub fn del<N: Leveled>(&mut self, nodes: &mut [N], i: u32) {
        let level = nodes[i as usize].level();
        self.levels[level].remove(nodes, i);
        self.nr_elts -= 1;
    }

    /// The oldest entry of the lowest populated level below `max_level`.
    pub fn peek(&self, max_level: usize) -> Option<u32> {
        self.levels[..max_level.min(NR_LEVELS)].iter().find_map(|l| l.front())
    }

    pub fn pop<N: Leveled>(&mut self, nodes: &mut [N]) -> Option<u32> {
        let i = self.peek(NR_LEVELS)?;
        self.del(nodes, i);
        Some(i)
    }

    /// Entries from the coldest level to the hottest, oldest first within a level.
    pub fn iter<'a, N: Leveled>(&'a self, nodes: &'a [N]) -> impl Iterator<Item = u32> + 'a {
        self.levels.iter().flat_map(move |l| l.iter(nodes))
    }

    fn set_targets_subrange(&mut self, nr_elts: usize, lbegin: usize, lend: usize) {
        let nr_levels = lend - lbegin;
        if nr_levels == 0 {
            return;
        }
        let per_level = nr_elts / nr_levels;
        let remainder = nr_elts % nr_levels;
        for level in lbegin..lend {
            self.target[level] = if level < lbegin + remainder { per_level + 1 } else { per_level };
        }
    }

    /// Few entries in the top levels, the rest spread evenly below them.
    fn set_targets(&mut self) {
        if self.last_target_nr_elts == self.nr_elts {
            return;
        }
        self.last_target_nr_elts = self.nr_elts;
        if self.nr_top_levels > NR_LEVELS {
            self.set_targets_subrange(self.nr_elts, 0, NR_LEVELS);
        } else {
            let split = NR_LEVELS - self.nr_top_levels;
            self.set_targets_subrange(self.nr_in_top_levels, split, NR_LEVELS);
            let rest = self.nr_elts.saturating_sub(self.nr_in_top_levels);
            self.set_targets_subrange(rest, 0, split);
        }
    }

    /// Pull entries down into levels under their target and push surplus up.
    pub fn redistribute<N: Leveled>(&mut self, nodes: &mut [N]) {
        self.set_targets();
        for level in 0..NR_LEVELS - 1 {
            let target = self.target[level];
            while self.levels[level].len() < target {
                let Some(above) = (level + 1..NR_LEVELS).find(|&l| !self.levels[l].is_empty()) else {
                    break;
                };
                let e = self.levels[above].pop_front(nodes).expect("level is not empty");
                nodes[e as usize].set_level(level);
                self.levels[level].push_back(nodes, e);
            }
            while self.levels[level].len() > target {
                let e = self.levels[level].pop_back(nodes).expect("level is over target");
                nodes[e as usize].set_level(level + 1);
                self.levels[level + 1].push_back(nodes, e);
            }
        }
    }

    /// Move `e` up `extra` levels, swapping the oldest entry of the destination level down
    /// into `e`'s old level so level sizes stay put; `e` goes to the back of its new level.
    pub fn requeue<N: Leveled>(&mut self, nodes: &mut [N], e: u32, extra: usize) {
        let level = nodes[e as usize].level();
        let new_level = (level + extra).min(NR_LEVELS - 1);
        if extra > 0 && level < NR_LEVELS - 1 {
            if let Some(de) = self.levels[new_level].front() {
                self.del(nodes, de);
                nodes[de as usize].set_level(level);
                self.push(nodes, de);
            }
        }
        self.del(nodes, e);
        nodes[e as usize].set_level(new_level);
        self.push(nodes, e);
    }
}

/// dm-cache's `struct stats`: how many lookups land in the top quarter of the levels.
#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    hits: u32,
    misses: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Confidence {
    Poor,
    Fair,
    Well,
}

impl Stats {
    const HIT_THRESHOLD: usize = NR_LEVELS * 3 / 4;

    fn level_accessed(&mut self, level: usize) {
        if level >= Self::HIT_THRESHOLD {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }

    fn miss(&mut self) {
        self.misses += 1;
    }

    fn assess(&self) -> Confidence {
        let total = self.hits as u64 + self.misses as u64;
        let confidence = ((self.hits as u64) << 8).checked_div(total).unwrap_or(0);
        if confidence < 16 {
            Confidence::Poor
        } else if confidence < 32 {
            Confidence::Fair
        } else {
            Confidence::Well
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    block: u64,
    link: Link,
    level: u8,
    dirty: bool,
    /// Handed out for write-back: off both queues until `set_clean`/`set_dirty`.
    pending: bool,
    /// Generation in which this entry last counted a hit (dm-cache's hit bitsets).
    hit_gen: u32,
}

super::keyed_by_block!(Entry);

crate::list::linked_by_field!(Entry);

impl Leveled for Entry {
    fn level(&self) -> usize {
        self.level as usize
    }
    fn set_level(&mut self, level: usize) {
        self.level = level as u8;
    }
}

#[derive(Debug)]
pub struct Smq {
    capacity: usize,
    seed: u64,
    cache_blocks_per_hotspot_block: u64,

    entries: Vec<Entry>,
    free: Vec<u32>,
    map: BlockMap,
    clean: MultiQueue,
    dirty: MultiQueue,
    nr_dirty: usize,

    hotspot: Vec<Entry>,
    nr_hotspot_blocks: usize,
    hotspot_map: BlockMap,
    hotspot_queue: MultiQueue,
    hotspot_level_jump: usize,

    hotspot_stats: Stats,
    cache_stats: Stats,
    hotspot_gen: u32,
    cache_gen: u32,

    read_promote_level: usize,
    write_promote_level: usize,

    next_tick_ns: Option<u64>,
    next_hotspot_period_ns: u64,
    next_cache_period_ns: u64,
}

impl Smq {
    pub fn new(capacity: usize, params: &Params) -> Self {
        let factor = params.hotspot_factor.max(1) as u64;
        let nr_hotspot_blocks = (capacity / 4).max(1024);
        // dm-cache halves the hotspot block until the table no longer covers more than the
        // origin.
        let mut hotspot_size = factor;
        if let Some(origin) = params.origin_blocks {
            while hotspot_size > 1 && hotspot_size * nr_hotspot_blocks as u64 > origin {
                hotspot_size /= 2;
            }
        }
        let nr_in_top = (nr_hotspot_blocks / NR_LEVELS).min(capacity / hotspot_size as usize);
        Smq {
            capacity,
            seed: params.seed,
            cache_blocks_per_hotspot_block: hotspot_size,
            entries: Vec::with_capacity(capacity),
            free: Vec::new(),
            map: block_map(capacity),
            clean: MultiQueue::new(0, 0),
            dirty: MultiQueue::new(0, 0),
            nr_dirty: 0,
            hotspot: Vec::with_capacity(nr_hotspot_blocks),
            nr_hotspot_blocks,
            hotspot_map: block_map(nr_hotspot_blocks),
            hotspot_queue: MultiQueue::new(8, nr_in_top),
            hotspot_level_jump: 1,
            hotspot_stats: Stats::default(),
            cache_stats: Stats::default(),
            // Generation 0 is "never hit": entries start there and the counters start at 1.
            hotspot_gen: 1,
            cache_gen: 1,
            read_promote_level: NR_LEVELS,
            write_promote_level: NR_LEVELS,
            next_tick_ns: None,
            next_hotspot_period_ns: 0,
            next_cache_period_ns: 0,
        }
    }

    fn resident(&self, block: u64) -> Option<u32> {
        self.map.get(block, &self.entries)
    }

    fn has_free(&self) -> bool {
        self.map.len() < self.capacity
    }

    fn push_queue(&mut self, i: u32) {
        if self.entries[i as usize].dirty {
            self.dirty.push(&mut self.entries, i);
        } else {
            self.clean.push(&mut self.entries, i);
        }
    }

    fn del_queue(&mut self, i: u32) {
        let e = self.entries[i as usize];
        if e.pending {
            return;
        }
        if e.dirty {
            self.dirty.del(&mut self.entries, i);
        } else {
            self.clean.del(&mut self.entries, i);
        }
    }

    /// dm-cache's `default_promote_level` table, kept although the `max` below (as in the
    /// kernel) always overrides it.
    fn default_promote_level(&self) -> usize {
        const TABLE: [usize; 17] = [1, 1, 1, 2, 4, 6, 7, 8, 7, 6, 4, 4, 3, 3, 2, 2, 1];
        let (h, m) = (self.cache_stats.hits as u64, self.cache_stats.misses as u64);
        let index = (h << 4).checked_div(h + m).unwrap_or(0) as usize;
        TABLE[index.min(16)]
    }

    fn update_promote_levels(&mut self) {
        let mut threshold = if self.has_free() { NR_LEVELS / 2 } else { self.default_promote_level() };
        threshold = threshold.max(NR_LEVELS);
        match self.hotspot_stats.assess() {
            Confidence::Poor => threshold /= 4,
            Confidence::Fair => threshold /= 2,
            Confidence::Well => {}
        }
        self.read_promote_level = NR_LEVELS - threshold;
        self.write_promote_level = NR_LEVELS - threshold;
    }

    fn update_level_jump(&mut self) {
        self.hotspot_level_jump = match self.hotspot_stats.assess() {
            Confidence::Poor => 4,
            Confidence::Fair => 2,
            Confidence::Well => 1,
        };
    }

    /// The core's once-a-second `policy_tick`.
    fn tick(&mut self, now_ns: u64) {
        // end_hotspot_period
        self.hotspot_gen += 1;
        self.update_promote_levels();
        if now_ns >= self.next_hotspot_period_ns {
            self.update_level_jump();
            self.hotspot_queue.redistribute(&mut self.hotspot);
            self.hotspot_stats = Stats::default();
            self.next_hotspot_period_ns = now_ns + HOTSPOT_PERIOD_NS;
        }
        // end_cache_period
        if now_ns >= self.next_cache_period_ns {
            self.cache_gen += 1;
            self.dirty.redistribute(&mut self.entries);
            self.clean.redistribute(&mut self.entries);
            self.cache_stats = Stats::default();
            self.next_cache_period_ns = now_ns + CACHE_PERIOD_NS;
        }
    }

    fn advance_clock(&mut self, now_ns: u64) {
        match self.next_tick_ns {
            None => {
                self.next_tick_ns = Some(now_ns + TICK_NS);
                self.next_hotspot_period_ns = now_ns;
                self.next_cache_period_ns = now_ns;
            }
            Some(t) if now_ns >= t => {
                // The kernel ticks every second whether requests come or not: after an idle
                // gap, the seconds missed tick too (three at most: after two ticks without
                // requests nothing changes any more).
                let missed = ((now_ns - t) / TICK_NS + 1).min(3);
                for k in (0..missed).rev() {
                    self.tick(now_ns - k * TICK_NS);
                }
                self.next_tick_ns = Some(now_ns + TICK_NS);
            }
            _ => {}
        }
    }

    /// Record a miss in the hotspot queue and return the hotspot level of `block`'s region.
    fn update_hotspot_queue(&mut self, block: u64) -> usize {
        let hb = block / self.cache_blocks_per_hotspot_block;
        if let Some(i) = self.hotspot_map.get(hb, &self.hotspot) {
            let e = &mut self.hotspot[i as usize];
            self.hotspot_stats.level_accessed(e.level as usize);
            let jump = if e.hit_gen == self.hotspot_gen { 0 } else { self.hotspot_level_jump };
            e.hit_gen = self.hotspot_gen;
            self.hotspot_queue.requeue(&mut self.hotspot, i, jump);
            return self.hotspot[i as usize].level as usize;
        }
        self.hotspot_stats.miss();
        let i = if self.hotspot.len() < self.nr_hotspot_blocks {
            self.hotspot.push(Entry {
                block: hb,
                link: Link::NONE,
                level: 0,
                dirty: false,
                pending: false,
                hit_gen: 0,
            });
            (self.hotspot.len() - 1) as u32
        } else {
            let i = self.hotspot_queue.pop(&mut self.hotspot).expect("a full hotspot queue");
            let old = self.hotspot[i as usize].block;
            self.hotspot_map.remove(old, &self.hotspot);
            let e = &mut self.hotspot[i as usize];
            e.block = hb;
            e.hit_gen = 0;
            i
        };
        self.hotspot_queue.push(&mut self.hotspot, i);
        self.hotspot_map.insert(hb, i, &self.hotspot);
        self.hotspot[i as usize].level as usize
    }

    fn alloc(&mut self, block: u64, level: usize, dirty: bool) -> u32 {
        let e = Entry { block, link: Link::NONE, level: level as u8, dirty, pending: false, hit_gen: 0 };
        let i = match self.free.pop() {
            Some(i) => {
                self.entries[i as usize] = e;
                i
            }
            None => {
                self.entries.push(e);
                (self.entries.len() - 1) as u32
            }
        };
        self.map.insert(block, i, &self.entries);
        if dirty {
            self.nr_dirty += 1;
        }
        i
    }

    fn free_entry(&mut self, i: u32) {
        let e = self.entries[i as usize];
        self.map.remove(e.block, &self.entries);
        if e.dirty {
            self.nr_dirty -= 1;
        }
        self.free.push(i);
    }

    /// dm-cache's `random_level` for mappings loaded without a hint.
    fn random_level(&self, block: u64) -> usize {
        (mix64(block ^ self.seed) as usize) & (NR_LEVELS - 1)
    }
}

impl Policy for Smq {
    fn name(&self) -> &'static str {
        "smq"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    #[inline]
    fn prefetch(&self, block: u64) {
        self.map.prefetch(block)
    }

    fn contains(&self, block: u64) -> bool {
        self.map.contains_key(block, &self.entries)
    }

    fn access(&mut self, a: Access) -> Outcome {
        self.advance_clock(a.now_ns);
        if let Some(i) = self.map.get(a.block, &self.entries) {
            let e = self.entries[i as usize];
            self.cache_stats.level_accessed(e.level as usize);
            if !e.pending && e.hit_gen != self.cache_gen {
                self.entries[i as usize].hit_gen = self.cache_gen;
                if e.dirty {
                    self.dirty.requeue(&mut self.entries, i, 1);
                } else {
                    self.clean.requeue(&mut self.entries, i, 1);
                }
            }
            return Outcome::Hit;
        }
        self.cache_stats.miss();
        // The hotspot queue only sees misses.
        let hs_level = self.update_hotspot_queue(a.block);
        let promote = match a.op {
            Op::Write if self.has_free() && a.fast_promote => true,
            Op::Write => hs_level >= self.write_promote_level,
            Op::Read => hs_level >= self.read_promote_level,
        };
        if !promote {
            return Outcome::Miss;
        }
        let evict = if self.has_free() {
            None
        } else {
            // Demote only from the bottom half of the clean queue.
            let Some(v) = self.clean.peek(NR_LEVELS / 2) else {
                return Outcome::Miss;
            };
            self.clean.del(&mut self.entries, v);
            let block = self.entries[v as usize].block;
            self.free_entry(v);
            Some(block)
        };
        let i = self.alloc(a.block, NR_LEVELS - 1, false);
        self.push_queue(i);
        Outcome::Promote { evict }
    }

    fn remove(&mut self, block: u64) -> bool {
        let Some(i) = self.resident(block) else {
            return false;
        };
        self.del_queue(i);
        self.free_entry(i);
        true
    }

    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        if self.map.contains_key(block, &self.entries) {
            return Err(InsertError::AlreadyCached(block));
        }
        if !self.has_free() {
            return Err(InsertError::Full(self.capacity));
        }
        let level = self.random_level(block);
        let i = self.alloc(block, level, dirty);
        // Loaded mappings go to the front of their level so they can be demoted at once.
        if dirty {
            self.dirty.push_front(&mut self.entries, i);
        } else {
            self.clean.push_front(&mut self.entries, i);
        }
        Ok(())
    }

    fn set_dirty(&mut self, block: u64) -> bool {
        let Some(i) = self.resident(block) else {
            return false;
        };
        let e = self.entries[i as usize];
        if e.dirty && !e.pending {
            return true;
        }
        self.del_queue(i);
        if !e.dirty {
            self.nr_dirty += 1;
        }
        let e = &mut self.entries[i as usize];
        e.dirty = true;
        e.pending = false;
        self.push_queue(i);
        true
    }

    fn set_clean(&mut self, block: u64) -> bool {
        let Some(i) = self.resident(block) else {
            return false;
        };
        let e = self.entries[i as usize];
        if !e.dirty {
            return true;
        }
        self.del_queue(i);
        self.nr_dirty -= 1;
        let e = &mut self.entries[i as usize];
        e.dirty = false;
        e.pending = false;
        self.push_queue(i);
        true
    }

    fn is_dirty(&self, block: u64) -> bool {
        self.resident(block).is_some_and(|i| self.entries[i as usize].dirty)
    }

    fn dirty_len(&self) -> usize {
        self.nr_dirty
    }

    fn writeback_candidate(&mut self, now_ns: u64) -> Option<u64> {
        self.advance_clock(now_ns);
        let i = self.dirty.peek(NR_LEVELS)?;
        self.dirty.del(&mut self.entries, i);
        self.entries[i as usize].pending = true;
        Some(self.entries[i as usize].block)
    }

    fn save_hints(&self) -> Vec<u8> {
        // Like dm-cache, the hint is the level. Pending entries (on no queue) are saved at
        // their level, in arena order; an entry freed while pending is no longer in the map.
        let entries = &self.entries;
        let pending = (0..entries.len() as u32).filter(|&i| {
            let e = &entries[i as usize];
            e.pending && self.map.get(e.block, entries) == Some(i)
        });
        let order: Vec<(u64, u8)> = self
            .clean
            .iter(entries)
            .chain(self.dirty.iter(entries))
            .chain(pending)
            .map(|i| (entries[i as usize].block, entries[i as usize].level))
            .collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let saved = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        for (block, level) in saved {
            if !self.has_free() {
                break;
            }
            if self.map.contains_key(block, &self.entries) {
                continue;
            }
            let i = self.alloc(block, (level as usize).min(NR_LEVELS - 1), false);
            self.push_queue(i);
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let e = std::mem::size_of::<Entry>();
        let bytes = self.capacity * e
            + self.nr_hotspot_blocks * e
            + self.free.capacity() * 4
            + map_bytes(&self.map)
            + map_bytes(&self.hotspot_map);
        bytes as f64 / self.capacity as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Access;

    const S: u64 = NS_PER_S;

    fn levels(p: &Smq) -> Vec<(u64, u8)> {
        crate::hints::decode("smq", &p.save_hints()).unwrap()
    }

    #[test]
    fn nothing_is_promoted_before_the_first_tick_except_full_writes_in_writeback() {
        // dm-cache starts with both promote levels at 64: no read can qualify until the
        // first tick has assessed the hotspot queue; a full-block write into free space can.
        let mut p = Smq::new(8, &Params::default());
        for b in 0..20 {
            assert_eq!(p.access(Access::read(b, 0)), Outcome::Miss);
        }
        assert_eq!(p.access(Access::write(3, false, 0)), Outcome::Miss);
        assert_eq!(p.access(Access::write(3, true, 0)), Outcome::Promote { evict: None });
        // Not in writethrough: the write waits for its hotspot like any other.
        let slow = Access { fast_promote: false, ..Access::write(4, true, 0) };
        assert_eq!(p.access(slow), Outcome::Miss);
    }

    #[test]
    fn promoted_blocks_enter_at_the_top_level() {
        let mut p = Smq::new(8, &Params::default());
        p.access(Access::write(5, true, 0));
        assert_eq!(levels(&p), vec![(5, (NR_LEVELS - 1) as u8)]);
    }

    #[test]
    fn a_hot_region_is_promoted_after_some_ticks() {
        let mut p = Smq::new(64, &Params::default());
        let mut promoted_at = None;
        for t in 0..40u64 {
            // Misses on block 100's region, once a second.
            if p.access(Access::read(100 + (t % 2), t * S)).is_promote() {
                promoted_at = Some(t);
                break;
            }
        }
        let t = promoted_at.expect("a block hit every second must be promoted eventually");
        assert!(t >= 1, "promoted before the first tick");
    }

    #[test]
    fn idle_seconds_tick_too() {
        // After an idle gap the hotspot statistics are empty, as the kernel's once-a-second
        // ticks leave them: confidence is poor, and a cold miss is not promoted.
        let mut p = Smq::new(64, &Params::default());
        p.access(Access::read(1, 0));
        p.hotspot_stats = Stats { hits: 100, misses: 0 };
        p.read_promote_level = 0;
        assert!(p.access(Access::read(500, S / 2)).is_promote(), "confident: a cold miss is promoted");
        assert_eq!(p.access(Access::read(900, 10 * S)), Outcome::Miss, "after 10 idle seconds");
    }

    #[test]
    fn demotes_only_from_the_bottom_half_of_the_clean_queue() {
        let mut p = Smq::new(2, &Params::default());
        let blob = hints::encode("smq", vec![(1u64, 40u8), (2, 50)].into_iter());
        p.load_hints(&blob).unwrap();
        // Pretend the hotspot queue is confident, without letting a tick redistribute.
        p.next_tick_ns = Some(u64::MAX);
        p.read_promote_level = 0;
        assert_eq!(p.access(Access::read(3, 0)), Outcome::Miss, "no clean block below level 32");
        let mut p = Smq::new(2, &Params::default());
        let blob = hints::encode("smq", vec![(1u64, 40u8), (2, 10)].into_iter());
        p.load_hints(&blob).unwrap();
        p.next_tick_ns = Some(u64::MAX);
        p.read_promote_level = 0;
        assert_eq!(p.access(Access::read(3, 0)), Outcome::Promote { evict: Some(2) });
        // Dirty blocks are never demoted, even from the bottom half.
        assert!(p.set_dirty(3));
        let mut q = Smq::new(1, &Params::default());
        q.load_hints(&hints::encode("smq", vec![(7u64, 0u8)].into_iter())).unwrap();
        q.set_dirty(7);
        q.next_tick_ns = Some(u64::MAX);
        q.read_promote_level = 0;
        assert_eq!(q.access(Access::read(8, 0)), Outcome::Miss);
        assert_eq!(q.writeback_candidate(0), Some(7));
        assert!(q.set_clean(7));
        assert_eq!(q.access(Access::read(8, 0)), Outcome::Promote { evict: Some(7) });
    }

    #[test]
    fn hits_climb_once_per_cache_period() {
        let mut p = Smq::new(4, &Params::default());
        p.load_hints(&hints::encode("smq", vec![(1u64, 5u8), (2, 6)].into_iter())).unwrap();
        p.next_tick_ns = Some(u64::MAX);
        for _ in 0..10 {
            assert_eq!(p.access(Access::read(1, 0)), Outcome::Hit);
        }
        // One level up (swapping with block 2, the oldest at level 6), not ten.
        let l: std::collections::HashMap<u64, u8> = levels(&p).into_iter().collect();
        assert_eq!(l[&1], 6);
        assert_eq!(l[&2], 5);
    }

    #[test]
    fn redistribute_spreads_levels_evenly() {
        let mut p = Smq::new(128, &Params::default());
        for b in 0..128 {
            p.access(Access::write(b, true, 0));
        }
        assert!(levels(&p).iter().all(|&(_, l)| l == 63));
        p.clean.redistribute(&mut p.entries);
        let mut per_level = [0usize; NR_LEVELS];
        for (_, l) in levels(&p) {
            per_level[l as usize] += 1;
        }
        assert!(per_level.iter().all(|&n| n == 2), "{per_level:?}");
        // The oldest promotions sink to the bottom: block 0 is now at level 0.
        assert_eq!(levels(&p)[0], (0, 0));
    }
}
