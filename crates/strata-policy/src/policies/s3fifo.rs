//! S3-FIFO (Yang et al., SOSP'23): three static FIFO queues. New blocks enter a small queue
//! `S` (10% of the cache); most are read once and leave it quickly into the ghost queue `G`
//! (which remembers 90% of a cache's worth of block numbers, no data, or as many as
//! [`S3Fifo::with_ghosts`] is given: `optgate` gives half a cache). Blocks hit at least
//! twice while in `S` move to the main queue `M`; a miss on a ghost goes straight to `M`.
//! `M` is a FIFO with reinsertion: a block with a non-zero 2-bit frequency is reinserted
//! with one less. Thresholds follow the authors' reference implementation in libCacheSim
//! (move to `M` at frequency 2, evict from `S` while it holds at least its 10% share).
//! Entries are 16 bytes, and the ghosts are block numbers in a ring ([`GhostFifo`]) rather
//! than entries: about 36 bytes per cached block in all, ghosts included.
//!
//! Beyond the paper, blocks cached at start-up (from the mapping, or from saved hints) carry
//! no credit, as in `strata`: they wait on a *restored* queue in their saved order, make room
//! before any block admitted since, and a restored block that is hit joins `S` as a newly
//! admitted block would (with that hit counted). A cache full of another workload's blocks
//! so empties in one cache's worth of admissions, and [`Policy::untouched`] tells a gate in
//! front (`optgate`) to admit every miss until then.
//!
//! [`S3Fifo::adaptive`], which `optgate` runs in miniature, sizes `S` as ARC sizes its recency
//! list: one block larger on a miss on one of its ghosts, one smaller on a miss on a block a
//! second ghost queue (of evictions from `M`, about 10 bytes a ghost as `G`'s) remembers.
//! Its size can be given to a fixed one ([`S3Fifo::set_small_cap`]).

use super::{dirty_methods, Arena};
use crate::dirty::Dirty;
use crate::entry::{Entry, Queue, MAX_FREQ};
use crate::ghost::GhostFifo;
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::list::List;
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Small,
    Main,
    /// Cached at start-up and not accessed since.
    Restored,
}

impl Queue for Where {
    fn bits(self) -> u8 {
        self as u8
    }
    fn from_bits(bits: u8) -> Self {
        match bits {
            0 => Where::Small,
            1 => Where::Main,
            _ => Where::Restored,
        }
    }
}

type Node = Entry<Where>;

const MOVE_TO_MAIN_FREQ: u8 = 2;

#[derive(Debug, Clone)]
pub struct S3Fifo {
    capacity: usize,
    small_cap: usize,
    arena: Arena<Node>,
    /// The cached blocks; the ghosts are in `ghost`.
    map: BlockMap,
    /// front = oldest for all three queues.
    small: List<0>,
    main: List<0>,
    restored: List<0>,
    ghost: GhostFifo,
    /// Where `S`'s size adapts: the blocks evicted from `M` (see [`S3Fifo::adaptive`]).
    main_ghost: Option<GhostFifo>,
    dirty: Dirty,
    /// Whether any access has come yet: until then an inserted block is restored.
    accessed: bool,
}

impl S3Fifo {
    pub fn new(capacity: usize) -> Self {
        Self::with_ghosts(capacity, capacity * 9 / 10)
    }

    /// An S3-FIFO whose ghost queue remembers `ghosts` blocks rather than 90% of a cache.
    pub fn with_ghosts(capacity: usize, ghosts: usize) -> Self {
        let n = capacity + 1;
        S3Fifo {
            capacity,
            small_cap: (capacity / 10).max(1),
            arena: Arena::with_capacity(n),
            map: block_map(n),
            small: List::new(),
            main: List::new(),
            restored: List::new(),
            ghost: GhostFifo::new(ghosts),
            main_ghost: None,
            dirty: Dirty::new(n),
            accessed: false,
        }
    }

    /// An S3-FIFO whose small queue's size adapts as ARC's recency list does: one block
    /// larger (up to half the cache) on a miss on a ghost of `S`, one smaller (down to 1%) on
    /// a miss on a block `M` evicted, which a second ghost queue of `ghosts` blocks
    /// remembers and which then goes back to `M`.
    pub(crate) fn adaptive(capacity: usize, ghosts: usize) -> Self {
        S3Fifo { main_ghost: Some(GhostFifo::new(ghosts)), ..Self::with_ghosts(capacity, ghosts) }
    }

    /// The small queue's size, in blocks: what it holds at the least before `M` gives up a
    /// block to make room.
    pub(crate) fn small_cap(&self) -> usize {
        self.small_cap
    }

    /// Sets the small queue's size, in blocks (at least one, at most the cache). An adaptive
    /// one moves on from there, back within its bounds.
    pub(crate) fn set_small_cap(&mut self, blocks: usize) {
        self.small_cap = blocks.clamp(1, self.capacity.max(1));
    }

    fn resident(&self, block: u64) -> Option<u32> {
        self.map.get(block, &self.arena.nodes)
    }

    /// A cached block's frequency.
    #[cfg(test)]
    pub(crate) fn freq(&self, block: u64) -> Option<u8> {
        self.resident(block).map(|i| self.arena.nodes[i as usize].freq())
    }

    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block()
    }

    fn cached(&self) -> usize {
        self.small.len() + self.main.len() + self.restored.len()
    }

    /// The list an entry at `at` is on.
    fn queue(&mut self, at: Where) -> &mut List<0> {
        match at {
            Where::Small => &mut self.small,
            Where::Main => &mut self.main,
            Where::Restored => &mut self.restored,
        }
    }

    fn move_to_main(&mut self, i: u32) {
        self.arena.nodes[i as usize].set_at(Where::Main);
        self.main.push_back(&mut self.arena.nodes, i);
    }

    /// Take entry `i` (off every queue) out of the cache.
    fn drop_entry(&mut self, i: u32) -> u64 {
        let block = self.block_of(i);
        self.map.remove(block, &self.arena.nodes);
        self.arena.free(i);
        block
    }

    /// Evict one block from S: promote the frequently hit ones to M on the way.
    fn evict_small(&mut self) -> Option<u64> {
        while let Some(t) = self.small.pop_front(&mut self.arena.nodes) {
            if self.arena.nodes[t as usize].freq() >= MOVE_TO_MAIN_FREQ || self.dirty.is_dirty(t) {
                // Like the reference implementation, a block starts over in M with no credit.
                self.arena.nodes[t as usize].set_freq(0);
                self.move_to_main(t);
            } else {
                let block = self.drop_entry(t);
                self.ghost.remember(block);
                return Some(block);
            }
        }
        None
    }

    /// Evict one block from M, reinserting those with frequency left. Dirty blocks are
    /// reinserted unchanged; the step limit ends the sweep if M holds only dirty blocks.
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
                self.main.remove(&mut self.arena.nodes, t);
                let block = self.drop_entry(t);
                if let Some(g) = &mut self.main_ghost {
                    g.remember(block);
                }
                return Some(block);
            }
        }
        None
    }

    /// Evict the oldest clean restored block; dirty ones on the way move to M.
    fn evict_restored(&mut self) -> Option<u64> {
        while let Some(t) = self.restored.pop_front(&mut self.arena.nodes) {
            if self.dirty.is_dirty(t) {
                self.move_to_main(t);
            } else {
                return Some(self.drop_entry(t));
            }
        }
        None
    }

    fn evict(&mut self) -> Option<u64> {
        if self.dirty.count() >= self.cached() {
            return None;
        }
        if let Some(b) = self.evict_restored() {
            return Some(b);
        }
        if self.small.len() >= self.small_cap || self.main.is_empty() {
            self.evict_small().or_else(|| self.evict_main())
        } else {
            self.evict_main().or_else(|| self.evict_small())
        }
    }

    fn add(&mut self, block: u64, at: Where) -> u32 {
        let i = self.arena.alloc(Node::new(block, at));
        let mut queue = *self.queue(at);
        queue.push_back(&mut self.arena.nodes, i);
        *self.queue(at) = queue;
        self.map.insert(block, i, &self.arena.nodes);
        i
    }

    /// [`Policy::access_admitting`] in one look-up (the hottest path of `optgate`'s gate),
    /// where a hit raises the block's frequency only if `counts` (a restored block's first
    /// hit aside): `optgate` says not for a hit on the block the access just before touched,
    /// which it takes for one reference going on rather than a re-use.
    pub(crate) fn access_counting(&mut self, a: Access, counts: bool, admit: impl FnOnce(&Self) -> bool) -> Outcome {
        let found = self.resident(a.block);
        if found.is_none() && !admit(self) {
            return Outcome::Miss;
        }
        self.accessed = true;
        if let Some(i) = found {
            let node = &mut self.arena.nodes[i as usize];
            if node.at() == Where::Restored {
                // Its first hit since the start-up: into S, as if just admitted and hit.
                node.set_at(Where::Small);
                node.set_freq(1);
                self.restored.remove(&mut self.arena.nodes, i);
                self.small.push_back(&mut self.arena.nodes, i);
                return Outcome::Hit;
            }
            // The main queue only uses two bits; S counts on up to the move threshold.
            if counts {
                node.set_freq((node.freq() + 1).min(MAX_FREQ));
            }
            return Outcome::Hit;
        }
        let evict = if self.cached() >= self.capacity {
            match self.evict() {
                Some(b) => Some(b),
                None => return Outcome::Miss,
            }
        } else {
            None
        };
        // The eviction may have pushed this block's own ghost out of G.
        let at = if self.ghost.forget(a.block) {
            if self.main_ghost.is_some() {
                self.small_cap = (self.small_cap + 1).min((self.capacity / 2).max(1));
            }
            Where::Main
        } else if self.main_ghost.as_mut().is_some_and(|g| g.forget(a.block)) {
            self.small_cap = self.small_cap.saturating_sub(1).max((self.capacity / 100).max(1));
            Where::Main
        } else {
            Where::Small
        };
        self.add(a.block, at);
        Outcome::Promote { evict }
    }

    /// Caches `block` without an access, on queue `at` (insert and adopt).
    fn place(&mut self, block: u64, dirty: bool, at: Where) -> Result<(), InsertError> {
        if self.resident(block).is_some() {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.cached() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        self.ghost.forget(block);
        if let Some(g) = &mut self.main_ghost {
            g.forget(block);
        }
        let i = self.add(block, at);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }
}

impl Policy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.cached()
    }

    dirty_methods!(without_prefetch);

    #[inline]
    fn prefetch(&self, block: u64) {
        self.map.prefetch(block);
        self.ghost.prefetch(block);
    }

    #[inline]
    fn prefetch_entry(&self, block: u64) {
        self.map.prefetch_entry(block, &self.arena.nodes);
    }

    fn access(&mut self, a: Access) -> Outcome {
        self.access_admitting(a, |_| true)
    }

    /// One look-up where the default takes two ([`S3Fifo::access_counting`]).
    fn access_admitting(&mut self, a: Access, admit: impl FnOnce(&Self) -> bool) -> Outcome {
        self.access_counting(a, true, admit)
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
        self.drop_entry(i);
        true
    }

    /// Before the first access (a start-up), a clean block is restored: no credit, first to
    /// make room. Later (readahead's neighbours) and dirty, it joins M without credit.
    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        let at = if self.accessed || dirty { Where::Main } else { Where::Restored };
        self.place(block, dirty, at)
    }

    /// A block taken over from the policy that served before (see [`Policy::adopt`]): into
    /// M without credit, in the order given.
    fn adopt(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        self.place(block, dirty, Where::Main)
    }

    fn evict_untouched(&mut self) -> Option<u64> {
        self.evict_restored()
    }

    fn untouched(&self) -> usize {
        self.restored.len()
    }

    /// The cached blocks, least valuable first (restored, `S`, then `M`); no tags, since
    /// a restart carries no credit over (see the module doc).
    fn save_hints(&self) -> Vec<u8> {
        let nodes = &self.arena.nodes;
        let order: Vec<u32> =
            self.restored.iter(nodes).chain(self.small.iter(nodes)).chain(self.main.iter(nodes)).collect();
        hints::encode(self.name(), order.into_iter().map(|i| (nodes[i as usize].block(), 0)))
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() || !self.ghost.is_empty() || self.main_ghost.as_ref().is_some_and(|g| !g.is_empty()) {
            return Err(HintError::NotEmpty);
        }
        // Restored in saved order, least valuable first; the most valuable are kept when
        // there are too many.
        let skip = entries.len().saturating_sub(self.capacity);
        for (block, _) in entries.into_iter().skip(skip) {
            if !self.map.contains_key(block, &self.arena.nodes) {
                self.add(block, Where::Restored);
            }
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let bytes = self.arena.bytes(self.capacity + 1)
            + map_bytes(&self.map)
            + self.dirty.bytes()
            + self.ghost.bytes()
            + self.main_ghost.as_ref().map_or(0, GhostFifo::bytes);
        bytes as f64 / self.capacity as f64
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::hash::mix64;

    const CAP: usize = 100;

    /// A cache restarted with blocks `0..CAP` cached (inserted before any access).
    fn restarted() -> S3Fifo {
        let mut p = S3Fifo::new(CAP);
        for b in 0..CAP as u64 {
            p.insert(b, false).unwrap();
        }
        assert_eq!(p.untouched(), CAP);
        p
    }

    /// New misses evict the restored blocks, oldest first, before anything admitted since;
    /// a restored block that is hit stays, and is no longer untouched.
    #[test]
    fn restored_blocks_make_room_first() {
        let mut p = restarted();
        assert!(p.access(Access::read(7, 0)).is_hit());
        let mut evicted = Vec::new();
        for b in 1_000..1_000 + CAP as u64 - 1 {
            match p.access(Access::read(b, 0)) {
                Outcome::Promote { evict } => evicted.push(evict.expect("the cache is full")),
                other => panic!("{b}: {other:?}"),
            }
        }
        let expected: Vec<u64> = (0..CAP as u64).filter(|&b| b != 7).collect();
        assert_eq!(evicted, expected);
        assert_eq!(p.untouched(), 0);
        assert!(p.contains(7));
    }

    /// Blocks inserted once accesses have begun (readahead's neighbours) are not restored.
    #[test]
    fn inserts_after_the_first_access_are_not_untouched() {
        let mut p = S3Fifo::new(CAP);
        p.access(Access::read(1, 0));
        p.insert(2, false).unwrap();
        assert_eq!(p.untouched(), 0);
        assert_eq!(p.evict_untouched(), None);
    }

    /// A miss a gate in front refuses leaves no trace: nothing evicted, the block's ghost
    /// kept, and before any access admitted a later insert is still restored. A hit asks no
    /// gate.
    #[test]
    fn a_refused_miss_leaves_no_trace() {
        let mut p = S3Fifo::new(CAP);
        assert_eq!(p.access_admitting(Access::read(1_000, 0), |_| false), Outcome::Miss);
        p.insert(0, false).unwrap();
        assert_eq!(p.untouched(), 1);
        for b in 1..=CAP as u64 + 1 {
            p.access(Access::read(b, 0));
        }
        // Block 0 (restored) made room first, then block 1 went to the ghosts.
        assert!(!p.contains(1) && p.ghost.contains(1));
        let before = (p.small.len(), p.main.len());
        for b in [1, 5_000] {
            assert_eq!(p.access_admitting(Access::read(b, 0), |_| false), Outcome::Miss);
            assert!(!p.contains(b));
        }
        assert_eq!((p.small.len(), p.main.len()), before);
        assert!(p.ghost.contains(1));
        assert!(p.access_admitting(Access::read(2, 0), |_| panic!("a hit asks no gate")).is_hit());
        assert!(matches!(p.access_admitting(Access::read(1, 0), |_| true), Outcome::Promote { evict: Some(_) }));
        assert_eq!(p.main.len(), before.1 + 1, "a ghost's block goes to the main queue");
    }

    /// Hits that do not count leave a block's frequency as it was: read once and re-touched
    /// three times without counting, block 0 is the first to leave `S`, for the ghosts, as a
    /// block read once is; with the re-touches counted it moves to `M` instead.
    #[test]
    fn uncounted_hits_leave_the_frequency_alone() {
        for counts in [false, true] {
            let mut p = S3Fifo::new(CAP);
            for _ in 0..4 {
                p.access_counting(Access::read(0, 0), counts, |_| true);
            }
            for b in 1..=CAP as u64 {
                p.access(Access::read(b, 0));
            }
            let at = p.resident(0).map(|i| p.arena.nodes[i as usize].at());
            assert_eq!(at, counts.then_some(Where::Main), "counted: {counts}");
            assert_eq!(p.ghost.contains(0), !counts, "counted: {counts}");
        }
    }

    /// A cache full of blocks the workload never reads serves it exactly as an empty one:
    /// the same hits and promotions, access by access.
    #[test]
    fn a_cache_full_of_junk_behaves_as_an_empty_one() {
        let trace: Vec<u64> = (0..20_000u64).map(|i| mix64(i) % 400).map(|x| x * x / 400).collect();
        let mut empty = S3Fifo::new(CAP);
        let mut junk = S3Fifo::new(CAP);
        for b in 0..CAP as u64 {
            junk.insert(1_000_000 + b, false).unwrap();
        }
        for (n, &b) in trace.iter().enumerate() {
            let (e, j) = (empty.access(Access::read(b, 0)), junk.access(Access::read(b, 0)));
            assert_eq!(e.is_hit(), j.is_hit(), "access {n}");
            assert_eq!(matches!(e, Outcome::Promote { .. }), matches!(j, Outcome::Promote { .. }), "access {n}");
        }
    }

    /// Whether block 0, read once and pushed out of `S` by new blocks, then read again
    /// after `gap` more blocks went out after it, came back into `M`: there it outlives a
    /// long run of blocks read once, which pass through `S`. Its own miss pushes one more
    /// block out first, so with `g` ghosts it comes back while `gap + 2 <= g`.
    pub(crate) fn comes_back_to_main(mut p: S3Fifo, gap: usize) -> bool {
        let mut next = 1u64;
        let mut miss = |p: &mut S3Fifo| {
            next += 1;
            match p.access(Access::read(next, 0)) {
                Outcome::Promote { evict } => evict,
                other => panic!("{next}: {other:?}"),
            }
        };
        p.access(Access::read(0, 0));
        while miss(&mut p) != Some(0) {}
        for _ in 0..gap {
            miss(&mut p);
        }
        assert!(!p.access(Access::read(0, 0)).is_hit());
        for _ in 0..3 * p.capacity() {
            miss(&mut p);
        }
        p.contains(0)
    }

    /// The ghost queue remembers as many blocks as it is given: 90% of the cache by default.
    #[test]
    fn a_ghost_is_remembered_for_as_many_evictions_as_the_queue_holds() {
        assert!(comes_back_to_main(S3Fifo::new(CAP), 88));
        assert!(!comes_back_to_main(S3Fifo::new(CAP), 89));
        assert!(comes_back_to_main(S3Fifo::with_ghosts(CAP, 50), 48));
        assert!(!comes_back_to_main(S3Fifo::with_ghosts(CAP, 50), 49));
    }

    /// An adaptive small queue grows by a block on a miss on one of its ghosts and shrinks
    /// by one on a miss on a block the main queue evicted, which goes back to `M`; a fixed
    /// one stays a tenth of the cache.
    #[test]
    fn an_adaptive_small_queue_follows_both_ghost_queues() {
        for adapts in [true, false] {
            let mut p = if adapts { S3Fifo::adaptive(CAP, CAP / 2) } else { S3Fifo::with_ghosts(CAP, CAP / 2) };
            // Blocks 0..90 read three times, the rest of the cache read once.
            for _ in 0..3 {
                for b in 0..90 {
                    p.access(Access::read(b, 0));
                }
            }
            for b in 90..CAP as u64 {
                p.access(Access::read(b, 0));
            }
            // The first miss moves 0..90 to M and sends 90 to the ghosts; 90 comes back.
            p.access(Access::read(1_000, 0));
            assert!(p.ghost.contains(90));
            p.access(Access::read(90, 0));
            assert_eq!(p.small_cap(), if adapts { 11 } else { 10 });
            // Misses until M evicts one of 0..90, which then comes back.
            let evicted = (2_000..).find_map(|b| match p.access(Access::read(b, 0)) {
                Outcome::Promote { evict: Some(e) } if e < 90 => Some(e),
                _ => None,
            });
            let e = evicted.expect("M evicts");
            p.access(Access::read(e, 0));
            assert_eq!(p.small_cap(), 10);
            let at = p.resident(e).map(|i| p.arena.nodes[i as usize].at());
            assert_eq!(at, Some(if adapts { Where::Main } else { Where::Small }));
        }
    }

    /// An adaptive small queue at half the cache stays there on a miss on one of its ghosts;
    /// a size set is kept within one block and the cache.
    #[test]
    fn an_adaptive_small_queue_grows_to_half_the_cache_at_most() {
        let mut p = S3Fifo::adaptive(CAP, CAP / 2);
        for b in 0..=CAP as u64 {
            p.access(Access::read(b, 0));
        }
        assert!(p.ghost.contains(0));
        p.set_small_cap(CAP / 2);
        p.access(Access::read(0, 0));
        assert_eq!(p.small_cap(), CAP / 2);
        p.set_small_cap(0);
        assert_eq!(p.small_cap(), 1);
        p.set_small_cap(CAP + 1);
        assert_eq!(p.small_cap(), CAP);
    }

    /// Saved hints come back as restored blocks in their saved order.
    #[test]
    fn hints_restore_blocks_without_credit() {
        let mut p = S3Fifo::new(CAP);
        for round in 0..3 {
            for b in 0..CAP as u64 {
                assert_eq!(p.access(Access::read(b, 0)).is_hit(), round > 0);
            }
        }
        let mut q = S3Fifo::new(CAP);
        q.load_hints(&p.save_hints()).unwrap();
        assert_eq!((q.len(), q.untouched()), (CAP, CAP));
        let first = q.access(Access::read(5_000, 0));
        assert!(matches!(first, Outcome::Promote { evict: Some(_) }), "{first:?}");
    }
}
