//! strata: the default policy. dm-cache's smq taught that a promotion is not free (a read
//! of the origin and a write to the cache device), so admission is a decision of its own,
//! separate from ordering what is cached. strata keeps that discipline and changes the parts:
//!
//! * Admission. A missed block is promoted only on evidence that it will be used again
//!   soon: the cache still has free blocks (smq's "promote readily"); or the block is in the
//!   *ghost history*, a FIFO of block numbers (no data) recently missed or evicted, three
//!   quarters of a cache long, so this is its second reference within a short window; or
//!   the access covered only part of the block, which means the rest of its stream is about
//!   to touch the same block (on real traces, over half of partial accesses are followed by
//!   another access to the block within a thousand accesses, against under 2% of whole-block
//!   accesses). Every other miss is served from the origin and only remembered in the
//!   ghost history. This is what cuts promotions to a fraction of LRU's.
//! * Ordering. Blocks admitted without a ghost hit wait in a *probation* FIFO of a fifth of
//!   the cache; hit twice there, they move to the *main* queue, otherwise they leave into
//!   the ghost history. Ghost hits enter main directly. Main is a FIFO with reinsertion and a
//!   2-bit frequency (S3-FIFO's main queue): a block with credit goes round again with one
//!   less. Scans and loops larger than the cache therefore neither get in nor flush it.
//! * Set dueling decides whether ghost hits are admitted at all. On traces where most blocks
//!   are read exactly twice, admitting at the second reference only replaces blocks that
//!   still have a hit coming with blocks that have none, and holding on to the cache is
//!   better (the way LIRS keeps its LIR set). One block in 32 always follows the eager rule,
//!   one in 32 the strict rule (admit one ghost hit in 16), and the rest follow whichever
//!   of those two samples misses less, through a saturating counter, as in the dynamic
//!   insertion policies of CPU caches (Qureshi et al., ISCA'07). Partial accesses and free
//!   space admit under both rules.
//! * Dirty blocks are never evicted: they go round again; write-back offers the block dirty
//!   the longest first.
//!
//! The constants were chosen on the CloudPhysics sample and on fio-style synthetic traces
//! (zipf 0.8 and 1.2, pareto, zoned, scan + hot mix, loop) at 1 to 25% of the footprint:
//! there strata stays within 1.5 points of the best of ARC, LIRS and S3-FIFO (often above
//! it), above LRU, with 1 to 45% of LRU's promotions.

use super::{dirty_methods, Arena};
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::list::{Link, Linked, List};
use crate::{hints, Access, HintError, InsertError, Outcome, Params, Policy};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Small,
    Main,
    Ghost,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    block: u64,
    link: Link,
    at: Where,
    freq: u8,
}

impl Linked<0> for Node {
    fn link(&self) -> &Link {
        &self.link
    }
    fn link_mut(&mut self) -> &mut Link {
        &mut self.link
    }
}

const MAX_FREQ: u8 = 3;
/// Ghost history length, in cache capacities.
const GHOST_FRACTION: f64 = 0.75;
/// Probation queue target, as a fraction of the cache.
const PROBATION_FRACTION: f64 = 0.2;
/// Hits in probation that earn a place in main.
const MOVE_TO_MAIN_HITS: u8 = 2;
/// One block in this many leads for each admission rule (set dueling).
const LEADER_SPACING: u64 = 32;
/// Saturating selector between the two rules: above the midpoint, followers are strict.
const PSEL_MAX: u32 = 1023;
/// The strict rule still admits one ghost hit in this many, so it can adapt.
const STRICT_ADMIT_ONE_IN: u64 = 16;

#[derive(Debug)]
pub struct Strata {
    capacity: usize,
    /// Probation target size.
    small_cap: usize,
    ghost_cap: usize,
    arena: Arena<Node>,
    map: BlockMap,
    /// front = oldest for all three queues.
    small: List<0>,
    main: List<0>,
    ghost: List<0>,
    dirty: Dirty,
    seed: u64,
    psel: u32,
    rng: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    LeadEager,
    LeadStrict,
    Follower,
}

impl Strata {
    pub fn new(capacity: usize, params: &Params) -> Self {
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
            dirty: Dirty::new(n),
            seed: params.seed,
            psel: PSEL_MAX / 2,
            rng: crate::hash::mix64(params.seed ^ 0x5354_5241_5441),
        }
    }

    fn group(&self, block: u64) -> Group {
        match crate::hash::mix64(block ^ self.seed) % LEADER_SPACING {
            0 => Group::LeadEager,
            1 => Group::LeadStrict,
            _ => Group::Follower,
        }
    }

    /// Whether a ghost hit on `block` is admitted, and the duel's bookkeeping for a miss.
    fn admit_ghost_hit(&mut self, block: u64) -> bool {
        let strict = match self.group(block) {
            Group::LeadEager => {
                self.psel = (self.psel + 1).min(PSEL_MAX);
                false
            }
            Group::LeadStrict => {
                self.psel = self.psel.saturating_sub(1);
                true
            }
            Group::Follower => self.psel > PSEL_MAX / 2,
        };
        if !strict {
            return true;
        }
        self.rng = crate::hash::mix64(self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15));
        self.rng.is_multiple_of(STRICT_ADMIT_ONE_IN)
    }

    fn note_miss(&mut self, block: u64) {
        match self.group(block) {
            Group::LeadEager => self.psel = (self.psel + 1).min(PSEL_MAX),
            Group::LeadStrict => self.psel = self.psel.saturating_sub(1),
            Group::Follower => {}
        }
    }

    fn resident(&self, block: u64) -> Option<u32> {
        let &i = self.map.get(&block)?;
        (self.arena.nodes[i as usize].at != Where::Ghost).then_some(i)
    }

    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block
    }

    fn cached(&self) -> usize {
        self.small.len() + self.main.len()
    }

    fn move_to_ghost(&mut self, i: u32) {
        self.arena.nodes[i as usize].at = Where::Ghost;
        self.ghost.push_back(&mut self.arena.nodes, i);
        if self.ghost.len() > self.ghost_cap {
            let g = self
                .ghost
                .pop_front(&mut self.arena.nodes)
                .expect("ghost is not empty");
            let block = self.block_of(g);
            self.map.remove(&block);
            self.arena.free(g);
        }
    }

    fn move_to_main(&mut self, i: u32) {
        self.arena.nodes[i as usize].at = Where::Main;
        self.main.push_back(&mut self.arena.nodes, i);
    }

    /// Evict one block from probation, moving those hit enough to main on the way.
    fn evict_small(&mut self) -> Option<u64> {
        while let Some(t) = self.small.pop_front(&mut self.arena.nodes) {
            let node = self.arena.nodes[t as usize];
            if node.freq >= MOVE_TO_MAIN_HITS || self.dirty.is_dirty(t) {
                self.arena.nodes[t as usize].freq = 0;
                self.move_to_main(t);
            } else {
                self.move_to_ghost(t);
                return Some(node.block);
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
            if node.freq > 0 || dirty {
                if !dirty {
                    node.freq -= 1;
                }
                self.main.move_to_back(&mut self.arena.nodes, t);
            } else {
                let block = node.block;
                self.main.remove(&mut self.arena.nodes, t);
                self.move_to_ghost(t);
                return Some(block);
            }
        }
        None
    }

    fn evict(&mut self) -> Option<u64> {
        if self.dirty.count() >= self.cached() {
            return None;
        }
        if self.small.len() >= self.small_cap || self.main.is_empty() {
            self.evict_small().or_else(|| self.evict_main())
        } else {
            self.evict_main().or_else(|| self.evict_small())
        }
    }

    fn add(&mut self, block: u64, at: Where) -> u32 {
        let i = self.arena.alloc(Node {
            block,
            link: Link::NONE,
            at,
            freq: 0,
        });
        match at {
            Where::Main => self.main.push_back(&mut self.arena.nodes, i),
            _ => self.small.push_back(&mut self.arena.nodes, i),
        }
        self.map.insert(block, i);
        i
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
        let found = self.map.get(&a.block).copied();
        if let Some(i) = found {
            let node = &mut self.arena.nodes[i as usize];
            if node.at != Where::Ghost {
                node.freq = (node.freq + 1).min(MAX_FREQ);
                return Outcome::Hit;
            }
        }
        let full = self.cached() >= self.capacity;
        if full && a.full_block {
            match found {
                // Second reference within the ghost window: admit, unless the duel says
                // the cache does better holding on to what it has.
                Some(g) => {
                    if !self.admit_ghost_hit(a.block) {
                        self.ghost.move_to_back(&mut self.arena.nodes, g);
                        return Outcome::Miss;
                    }
                }
                // No evidence of reuse yet: serve from the origin, remember the block.
                None => {
                    self.note_miss(a.block);
                    let i = self.arena.alloc(Node {
                        block: a.block,
                        link: Link::NONE,
                        at: Where::Ghost,
                        freq: 0,
                    });
                    self.map.insert(a.block, i);
                    self.move_to_ghost(i);
                    return Outcome::Miss;
                }
            }
        } else {
            self.note_miss(a.block);
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
        match self.map.get(&a.block).copied() {
            Some(g) => {
                self.ghost.remove(&mut self.arena.nodes, g);
                self.arena.nodes[g as usize].freq = 0;
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
        match self.arena.nodes[i as usize].at {
            Where::Small => self.small.remove(&mut self.arena.nodes, i),
            _ => self.main.remove(&mut self.arena.nodes, i),
        }
        self.map.remove(&block);
        self.arena.free(i);
        true
    }

    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        if self.resident(block).is_some() {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.cached() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        if let Some(g) = self.map.remove(&block) {
            self.ghost.remove(&mut self.arena.nodes, g);
            self.arena.free(g);
        }
        let i = self.add(block, Where::Main);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }

    fn save_hints(&self) -> Vec<u8> {
        let nodes = &self.arena.nodes;
        let tag = |i: u32| {
            let n = nodes[i as usize];
            (n.block, (((n.at == Where::Main) as u8) << 2) | n.freq)
        };
        let order: Vec<(u64, u8)> = self
            .small
            .iter(nodes)
            .map(tag)
            .chain(self.main.iter(nodes).map(tag))
            .collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        for (block, tag) in entries {
            if self.cached() >= self.capacity {
                break;
            }
            if !self.map.contains_key(&block) {
                let i = self.add(
                    block,
                    if tag & 4 != 0 {
                        Where::Main
                    } else {
                        Where::Small
                    },
                );
                self.arena.nodes[i as usize].freq = (tag & 3).min(MAX_FREQ);
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
