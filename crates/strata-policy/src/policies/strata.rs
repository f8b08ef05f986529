//! strata: the default policy before `optgate`. dm-cache's smq taught that a promotion is not
//! free (a read of the origin and a write to the cache device), so admission is a decision of
//! its own, separate from ordering what is cached. strata keeps that discipline and changes
//! the parts:
//!
//! * Admission. A missed block is promoted only on evidence that it will be used again
//!   soon: the cache still has free blocks, or blocks no access has touched since a restart
//!   (smq's "promote readily"); or the block is in the *ghost history*, a FIFO of block
//!   numbers (no data) recently missed or evicted, 40% of a cache long, so this is its
//!   second reference within a short window; or the access covered only part of the block,
//!   which means the rest of its stream is about to touch the same block (on real traces,
//!   over half of partial accesses are followed by another access to the block within a
//!   thousand accesses, against under 2% of whole-block accesses). Every other miss is
//!   served from the origin and only remembered in the ghost history. This is what cuts
//!   promotions to a fraction of LRU's. A longer history admits more blocks on their
//!   second reference, and measured that costs more than it gains: a history as long as the
//!   cache loses four points of hit ratio at half the footprint of the CloudPhysics sample
//!   and up to three on the scan mix, for under a point gained at the smallest sizes.
//! * Ordering. Blocks admitted without a ghost hit wait in a *probation* FIFO of a fifth of
//!   the cache; hit twice there, they move to the *main* queue, otherwise they leave into
//!   the ghost history. Ghost hits enter main directly. Main is a FIFO with reinsertion and a
//!   2-bit frequency (S3-FIFO's main queue): a block with credit goes round again with one
//!   less. Scans and loops larger than the cache therefore neither get in nor flush it.
//! * Restored blocks. Blocks restored at start-up (from hints, or inserted from the mapping)
//!   carry no credit: they wait on a *restored* queue, in their saved order (most valuable
//!   last), and while any is left untouched the cache counts as having free space: every
//!   miss is admitted and the oldest untouched restored block makes room, before any block
//!   admitted since the restart. A restored block that is hit joins probation as a newly
//!   admitted block would, and earns its place in main the same way. A cache full of
//!   another workload's blocks therefore empties in one cache's worth of admissions
//!   (dm-cache's 2017 warm-up failure), while the blocks the new workload does want stay.
//! * Dirty blocks are never evicted: they go round again; write-back offers the block dirty
//!   the longest first.
//!
//! The constants were chosen on the CloudPhysics sample and on fio-style synthetic traces
//! (zipf 0.8 and 1.2, pareto, zoned, scan + hot mix, loop) at 1 to 50% of the footprint:
//! there strata stays within 2 points of the best of ARC, LIRS and S3-FIFO (often above
//! it), above LRU, with at most 55% of LRU's promotions. On uniform traffic every policy gets
//! the same expected hit ratio (cache / footprint) and strata is within noise of LRU.

use super::{dirty_methods, Arena};
use crate::dirty::Dirty;
use crate::entry::{Entry, Queue, MAX_FREQ};
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::list::List;
use crate::{hints, Access, HintError, InsertError, Outcome, Params, Policy};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Where {
    Small = 0,
    Main = 1,
    Ghost = 2,
    /// Restored at start-up and not accessed since.
    Restored = 3,
}

impl Queue for Where {
    fn bits(self) -> u8 {
        self as u8
    }
    fn from_bits(bits: u8) -> Self {
        match bits {
            0 => Where::Small,
            1 => Where::Main,
            2 => Where::Ghost,
            _ => Where::Restored,
        }
    }
}

/// An entry: 16 bytes (see [`Entry`]), so a cached block's whole state, ghosts and map
/// included, stays under 40 bytes.
type Node = Entry<Where>;

/// The frequency bits of a restored entry, which carries no credit, mark one inserted
/// before the first access (restored at start-up) rather than a readahead neighbour.
const STARTUP: u8 = 1;

/// Ghost history length, in cache capacities.
const GHOST_FRACTION: f64 = 0.4;
/// Probation queue target, as a fraction of the cache.
const PROBATION_FRACTION: f64 = 0.2;
/// Hits in probation that earn a place in main.
const MOVE_TO_MAIN_HITS: u8 = 2;

#[derive(Debug)]
pub struct Strata {
    capacity: usize,
    /// Probation target size.
    small_cap: usize,
    ghost_cap: usize,
    arena: Arena<Node>,
    map: BlockMap,
    /// front = oldest (next out) for all four queues.
    small: List<0>,
    main: List<0>,
    ghost: List<0>,
    restored: List<0>,
    dirty: Dirty,
    /// An access has been seen: blocks inserted from now on (readahead neighbours) are not
    /// from the start-up (see `STARTUP`).
    accessed: bool,
}

impl Strata {
    pub fn new(capacity: usize, _params: &Params) -> Self {
        let ghost_cap = ((capacity as f64 * GHOST_FRACTION) as usize).max(1);
        let n = capacity + ghost_cap + 1;
        Strata {
            capacity,
            small_cap: ((capacity as f64 * PROBATION_FRACTION) as usize).max(1),
            ghost_cap,
            arena: Arena::with_capacity(n),
            map: block_map(n),
            small: List::new(),
            main: List::new(),
            ghost: List::new(),
            restored: List::new(),
            dirty: Dirty::new(n),
            accessed: false,
        }
    }

    fn resident(&self, block: u64) -> Option<u32> {
        let i = self.map.get(block, &self.arena.nodes)?;
        (self.arena.nodes[i as usize].at() != Where::Ghost).then_some(i)
    }

    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block()
    }

    fn cached(&self) -> usize {
        self.small.len() + self.main.len() + self.restored.len()
    }

    fn move_to_ghost(&mut self, i: u32) {
        self.arena.nodes[i as usize].set_at(Where::Ghost);
        self.ghost.push_back(&mut self.arena.nodes, i);
        if self.ghost.len() > self.ghost_cap {
            let g = self.ghost.pop_front(&mut self.arena.nodes).expect("ghost is not empty");
            let block = self.block_of(g);
            self.map.remove(block, &self.arena.nodes);
            self.arena.free(g);
        }
    }

    fn move_to_main(&mut self, i: u32) {
        self.arena.nodes[i as usize].set_at(Where::Main);
        self.main.push_back(&mut self.arena.nodes, i);
    }

    /// Evict one block from probation, moving those hit enough to main on the way.
    fn evict_small(&mut self) -> Option<u64> {
        while let Some(t) = self.small.pop_front(&mut self.arena.nodes) {
            let node = self.arena.nodes[t as usize];
            if node.freq() >= MOVE_TO_MAIN_HITS || self.dirty.is_dirty(t) {
                self.arena.nodes[t as usize].set_freq(0);
                self.move_to_main(t);
            } else {
                self.move_to_ghost(t);
                return Some(node.block());
            }
        }
        None
    }

    /// Evict one block from main; blocks with credit (or dirty) go round again. The step
    /// limit ends the sweep when main holds only dirty blocks.
    fn evict_main(&mut self) -> Option<u64> {
        let mut steps = 4 * self.main.len() + 4;
        while let Some(t) = self.main.front() {
            if steps == 0 {
                return None;
            }
            steps -= 1;
            let dirty = self.dirty.is_dirty(t);
            let node = &mut self.arena.nodes[t as usize];
            if node.freq() > 0 || dirty {
                if !dirty {
                    node.set_freq(node.freq() - 1);
                }
                self.main.move_to_back(&mut self.arena.nodes, t);
            } else {
                let block = node.block();
                self.main.remove(&mut self.arena.nodes, t);
                self.move_to_ghost(t);
                return Some(block);
            }
        }
        None
    }

    /// Evict the oldest untouched restored block (with `startup_only`, only if it came
    /// from the start-up); dirty ones cannot leave and join main. They were never accessed
    /// here, so they leave no ghost behind.
    fn evict_restored(&mut self, startup_only: bool) -> Option<u64> {
        while let Some(t) = self.restored.front() {
            if startup_only && self.arena.nodes[t as usize].freq() != STARTUP {
                return None;
            }
            self.restored.pop_front(&mut self.arena.nodes);
            if self.dirty.is_dirty(t) {
                self.arena.nodes[t as usize].set_freq(0);
                self.move_to_main(t);
            } else {
                let block = self.block_of(t);
                self.map.remove(block, &self.arena.nodes);
                self.arena.free(t);
                return Some(block);
            }
        }
        None
    }

    fn evict(&mut self) -> Option<u64> {
        if self.dirty.count() >= self.cached() {
            return None;
        }
        if let Some(b) = self.evict_restored(false) {
            return Some(b);
        }
        if self.small.len() >= self.small_cap || self.main.is_empty() {
            self.evict_small().or_else(|| self.evict_main())
        } else {
            self.evict_main().or_else(|| self.evict_small())
        }
    }

    fn add(&mut self, block: u64, at: Where) -> u32 {
        let mut node = Node::new(block, at);
        if at == Where::Restored && !self.accessed {
            node.set_freq(STARTUP);
        }
        let i = self.arena.alloc(node);
        let mut queue = *self.queue(at);
        queue.push_back(&mut self.arena.nodes, i);
        *self.queue(at) = queue;
        self.map.insert(block, i, &self.arena.nodes);
        i
    }

    /// Caches `block` without an access, on queue `at` (insert and adopt).
    fn place(&mut self, block: u64, dirty: bool, at: Where) -> Result<(), InsertError> {
        if self.resident(block).is_some() {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.cached() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        if let Some(g) = self.map.remove(block, &self.arena.nodes) {
            self.ghost.remove(&mut self.arena.nodes, g);
            self.arena.free(g);
        }
        let i = self.add(block, at);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }

    /// The list an entry at `at` is on.
    fn queue(&mut self, at: Where) -> &mut List<0> {
        match at {
            Where::Small => &mut self.small,
            Where::Main => &mut self.main,
            Where::Ghost => &mut self.ghost,
            Where::Restored => &mut self.restored,
        }
    }

    /// A restored block's first hit: it joins probation as if admitted now, this hit counted.
    fn touch_restored(&mut self, i: u32) {
        self.restored.remove(&mut self.arena.nodes, i);
        let node = &mut self.arena.nodes[i as usize];
        node.set_at(Where::Small);
        node.set_freq(1);
        self.small.push_back(&mut self.arena.nodes, i);
    }
}

impl Policy for Strata {
    fn name(&self) -> &'static str {
        "strata"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.cached()
    }

    dirty_methods!();

    fn access(&mut self, a: Access) -> Outcome {
        self.accessed = true;
        let found = self.map.get(a.block, &self.arena.nodes);
        if let Some(i) = found {
            let node = &mut self.arena.nodes[i as usize];
            match node.at() {
                Where::Ghost => {}
                Where::Restored => {
                    self.touch_restored(i);
                    return Outcome::Hit;
                }
                _ => {
                    node.set_freq((node.freq() + 1).min(MAX_FREQ));
                    return Outcome::Hit;
                }
            }
        }
        let full = self.cached() >= self.capacity;
        // Untouched restored blocks count as free space for admission.
        if full && a.full_block && self.restored.is_empty() && found.is_none() {
            // A second reference within the ghost window is admitted. Otherwise there is no
            // evidence of reuse yet: serve from the origin, remember the block.
            let i = self.arena.alloc(Node::new(a.block, Where::Ghost));
            self.map.insert(a.block, i, &self.arena.nodes);
            self.move_to_ghost(i);
            return Outcome::Miss;
        }
        let evict = if full {
            match self.evict() {
                Some(b) => Some(b),
                None => return Outcome::Miss,
            }
        } else {
            None
        };
        // The eviction may have pushed this block's own ghost out of the history.
        match self.map.get(a.block, &self.arena.nodes) {
            Some(g) => {
                self.ghost.remove(&mut self.arena.nodes, g);
                self.arena.nodes[g as usize].set_freq(0);
                self.move_to_main(g);
            }
            None => {
                self.add(a.block, Where::Small);
            }
        }
        Outcome::Promote { evict }
    }

    fn remove(&mut self, block: u64) -> bool {
        let Some(i) = self.resident(block) else {
            return false;
        };
        self.dirty.set_clean(i);
        let at = self.arena.nodes[i as usize].at();
        let mut queue = *self.queue(at);
        queue.remove(&mut self.arena.nodes, i);
        *self.queue(at) = queue;
        self.map.remove(block, &self.arena.nodes);
        self.arena.free(i);
        true
    }

    /// Known only from the mapping: no credit, first to make room (see the module doc).
    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        self.place(block, dirty, Where::Restored)
    }

    /// Only blocks from the start-up, still untouched: readahead neighbours inserted since
    /// stay (they leave through `evict` like any block without credit).
    fn evict_untouched(&mut self) -> Option<u64> {
        self.evict_restored(true)
    }

    fn untouched(&self) -> usize {
        self.restored.len()
    }

    /// A block taken over from the policy that served before (see [`Policy::adopt`]): it
    /// joins main without credit, in the order given, so the coldest go first and nothing
    /// is admitted on their account.
    fn adopt(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        self.place(block, dirty, Where::Main)
    }

    /// Least valuable first: untouched restored blocks, probation, then main by rising
    /// frequency (FIFO order within a frequency). The tag keeps the queue (bit 2: main) and
    /// the frequency for inspection; loading gives no credit for either.
    fn save_hints(&self) -> Vec<u8> {
        let nodes = &self.arena.nodes;
        let tag = |i: u32| {
            let n = nodes[i as usize];
            (n.block(), (((n.at() == Where::Main) as u8) << 2) | n.freq())
        };
        let mut main: Vec<(u64, u8)> = self.main.iter(nodes).map(tag).collect();
        main.sort_by_key(|&(_, t)| t & 3);
        let order: Vec<(u64, u8)> =
            self.restored.iter(nodes).chain(self.small.iter(nodes)).map(tag).chain(main).collect();
        hints::encode(self.name(), order.into_iter())
    }

    /// Every block starts untouched on the restored queue in saved order, so the most
    /// valuable leave last; when the saved cache was larger the least valuable are dropped.
    /// Blobs written before restored blocks lost their credit load the same way.
    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        let skip = entries.len().saturating_sub(self.capacity);
        for (block, _) in entries.into_iter().skip(skip) {
            if !self.map.contains_key(block, &self.arena.nodes) {
                self.add(block, Where::Restored);
            }
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let n = self.capacity + self.ghost_cap + 1;
        let bytes = self.arena.bytes(n) + map_bytes(&self.map) + self.dirty.bytes();
        bytes as f64 / self.capacity as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = 100;

    /// The bound for a default policy's state: at most 40 bytes per cached block,
    /// ghosts, map and dirty bookkeeping included, at any size.
    #[test]
    fn a_cached_block_costs_at_most_40_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 16);
        for capacity in [1_000, 100_000, 1 << 20, 3 << 20] {
            let p = Strata::new(capacity, &Params::default());
            assert!(p.bytes_per_entry() <= 40.0, "{capacity} blocks: {} B each", p.bytes_per_entry());
        }
    }

    /// A cache of `CAP` blocks `0..CAP`, each hit a few times so they earn credit, whose
    /// hints are then loaded into a fresh policy.
    fn restarted() -> Strata {
        let mut p = Strata::new(CAP, &Params::default());
        for round in 0..4 {
            for b in 0..CAP as u64 {
                let out = p.access(Access::read(b, 0));
                assert_eq!(out.is_hit(), round > 0);
            }
        }
        let mut q = Strata::new(CAP, &Params::default());
        q.load_hints(&p.save_hints()).unwrap();
        assert_eq!(q.len(), CAP);
        q
    }

    #[test]
    fn restored_blocks_make_room_first() {
        let mut p = restarted();
        let mut admitted = Vec::new();
        let mut b = 1_000u64;
        while admitted.len() < CAP {
            match p.access(Access::read(b, 0)) {
                Outcome::Promote { evict } => {
                    let v = evict.expect("the cache is full");
                    assert!(v < CAP as u64, "evicted {v}, admitted since the restart");
                    admitted.push(b);
                }
                out => panic!("{b}: {out:?}: a new block waited behind restored ones"),
            }
            b += 1;
        }
        for old in 0..CAP as u64 {
            assert!(!p.contains(old), "restored block {old} outlived {CAP} admissions");
        }
        assert!(admitted.iter().all(|&n| p.contains(n)));
    }

    #[test]
    fn readahead_takes_the_place_of_untouched_start_up_blocks_only() {
        let mut p = restarted();
        p.set_dirty(3);
        assert!(p.access(Access::read(5, 0)).is_hit(), "5 is touched: no longer untouched");
        // Readahead neighbours go in place of the start-up blocks, oldest first, never the
        // dirty one (it stays, in main) or the one read since the restart.
        let mut victims = Vec::new();
        for nb in 10_000..10_000 + CAP as u64 {
            match crate::readahead_place(&mut p, nb) {
                Ok(v) => victims.push(v.expect("the cache is full")),
                Err(_) => break,
            }
        }
        let expect: Vec<u64> = (0..CAP as u64).filter(|&b| b != 3 && b != 5).collect();
        assert_eq!(victims, expect);
        assert!(p.contains(3) && p.is_dirty(3) && p.contains(5));
        // The neighbours themselves carry no credit but are never displaced by readahead:
        // only by admissions, through eviction.
        assert!(crate::readahead_place(&mut p, 20_000).is_err());
        assert_eq!(p.evict_untouched(), None);
        assert!(p.access(Access::read(20_001, 0)).evicted().is_some_and(|v| v >= 10_000));
    }

    #[test]
    fn blocks_inserted_after_the_first_access_are_not_from_the_start_up() {
        let mut p = Strata::new(CAP, &Params::default());
        p.access(Access::read(99_999, 0));
        for b in 0..CAP as u64 - 1 {
            p.insert(b, false).unwrap();
        }
        assert_eq!(p.evict_untouched(), None);
    }

    #[test]
    fn restored_block_that_is_hit_stays() {
        let mut p = restarted();
        assert!(p.access(Access::read(7, 0)).is_hit());
        for b in 1_000..1_000 + CAP as u64 {
            p.access(Access::read(b, 0));
        }
        assert!(p.contains(7), "the block hit after the restart was evicted");
        // From here it is an ordinary block: kept in use, it outlives waves of blocks read
        // twice (each admitted on its second reference).
        for b in 2_000..2_000 + 4 * CAP as u64 {
            if b % 20 == 0 {
                assert!(p.access(Access::read(7, 0)).is_hit(), "before {b}");
            }
            for _ in 0..2 {
                p.access(Access::read(b, 0));
            }
        }
        assert!(p.contains(7));
    }

    #[test]
    fn hints_keep_the_most_valuable_when_the_cache_shrank() {
        let p = restarted();
        let mut small = Strata::new(CAP / 2, &Params::default());
        small.load_hints(&p.save_hints()).unwrap();
        assert_eq!(small.len(), CAP / 2);
        // Restored order is saved order: the first to leave is the least valuable kept.
        let first_out = match small.access(Access::read(5_000, 0)) {
            Outcome::Promote { evict: Some(v) } => v,
            out => panic!("{out:?}"),
        };
        assert!(small.save_hints().len() < p.save_hints().len());
        assert!(!small.contains(first_out));
    }
}
