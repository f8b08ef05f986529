//! S3-FIFO (Yang et al., SOSP'23): three static FIFO queues. New blocks enter a small queue
//! `S` (10% of the cache); most are read once and leave it quickly into the ghost queue `G`
//! (which remembers 90% of a cache's worth of block numbers, no data). Blocks hit at least
//! twice while in `S` move to the main queue `M`; a miss on a ghost goes straight to `M`.
//! `M` is a FIFO with reinsertion: a block with a non-zero 2-bit frequency is reinserted
//! with one less. Thresholds follow the authors' reference implementation in libCacheSim
//! (move to `M` at frequency 2, evict from `S` while it holds at least its 10% share).
//! Entries are 16 bytes, and the ghosts are block numbers in a ring ([`GhostFifo`]) rather
//! than entries: about 36 bytes per cached block in all, ghosts included.

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
}

impl Queue for Where {
    fn bits(self) -> u8 {
        self as u8
    }
    fn from_bits(bits: u8) -> Self {
        if bits == 0 {
            Where::Small
        } else {
            Where::Main
        }
    }
}

type Node = Entry<Where>;

const MOVE_TO_MAIN_FREQ: u8 = 2;

#[derive(Debug)]
pub struct S3Fifo {
    capacity: usize,
    small_cap: usize,
    arena: Arena<Node>,
    /// The cached blocks; the ghosts are in `ghost`.
    map: BlockMap,
    /// front = oldest for both queues.
    small: List<0>,
    main: List<0>,
    ghost: GhostFifo,
    dirty: Dirty,
}

impl S3Fifo {
    pub fn new(capacity: usize) -> Self {
        let n = capacity + 1;
        S3Fifo {
            capacity,
            small_cap: (capacity / 10).max(1),
            arena: Arena::with_capacity(n),
            map: block_map(n),
            small: List::new(),
            main: List::new(),
            ghost: GhostFifo::new(capacity * 9 / 10),
            dirty: Dirty::new(n),
        }
    }

    fn resident(&self, block: u64) -> Option<u32> {
        self.map.get(block, &self.arena.nodes)
    }

    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block()
    }

    fn cached(&self) -> usize {
        self.small.len() + self.main.len()
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
                return Some(self.drop_entry(t));
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
        let i = self.arena.alloc(Node::new(block, at));
        match at {
            Where::Main => self.main.push_back(&mut self.arena.nodes, i),
            Where::Small => self.small.push_back(&mut self.arena.nodes, i),
        }
        self.map.insert(block, i, &self.arena.nodes);
        i
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

    fn access(&mut self, a: Access) -> Outcome {
        if let Some(i) = self.resident(a.block) {
            // The main queue only uses two bits; S counts on up to the move threshold.
            let node = &mut self.arena.nodes[i as usize];
            node.set_freq((node.freq() + 1).min(MAX_FREQ));
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
        let at = if self.ghost.forget(a.block) { Where::Main } else { Where::Small };
        self.add(a.block, at);
        Outcome::Promote { evict }
    }

    fn remove(&mut self, block: u64) -> bool {
        let Some(i) = self.resident(block) else {
            return false;
        };
        self.dirty.set_clean(i);
        match self.arena.nodes[i as usize].at() {
            Where::Small => self.small.remove(&mut self.arena.nodes, i),
            Where::Main => self.main.remove(&mut self.arena.nodes, i),
        }
        self.drop_entry(i);
        true
    }

    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        if self.resident(block).is_some() {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.cached() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        self.ghost.forget(block);
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
            (n.block(), (((n.at() == Where::Main) as u8) << 2) | n.freq())
        };
        let order: Vec<(u64, u8)> = self.small.iter(nodes).map(tag).chain(self.main.iter(nodes).map(tag)).collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() || !self.ghost.is_empty() {
            return Err(HintError::NotEmpty);
        }
        for (block, tag) in entries {
            if self.cached() >= self.capacity {
                break;
            }
            if !self.map.contains_key(block, &self.arena.nodes) {
                let i = self.add(block, if tag & 4 != 0 { Where::Main } else { Where::Small });
                self.arena.nodes[i as usize].set_freq((tag & 3).min(MAX_FREQ));
            }
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let bytes =
            self.arena.bytes(self.capacity + 1) + map_bytes(&self.map) + self.dirty.bytes() + self.ghost.bytes();
        bytes as f64 / self.capacity as f64
    }
}
