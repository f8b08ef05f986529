//! LRU and FIFO: one queue of cached blocks, evicting from the old end. They differ only in
//! whether a hit moves the block to the new end. Both promote every miss, which is what
//! makes them the baseline every other policy's promotion count is read against.
//!
//! These are the policies the simulator's speed is judged by, so the entry is split in two
//! arrays: the queue links (8 bytes an entry) and the block numbers (the keys the map reads).
//! The links of a cache of a hundred thousand blocks then fit in a core's L2 cache, and a
//! hit costs one map probe, one block number and L2 accesses.

use super::dirty_methods;
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, prefetch, BlockMap};
use crate::list::{Link, List};
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};

/// A single-queue policy; `MOVE_ON_HIT` makes it LRU, otherwise FIFO.
#[derive(Debug)]
pub struct Queue<const MOVE_ON_HIT: bool> {
    capacity: usize,
    /// Entry `i`'s place in `queue`.
    links: Vec<Link>,
    /// Entry `i`'s block number.
    blocks: Vec<u64>,
    /// Entries freed by `remove`, reused first.
    free: Vec<u32>,
    map: BlockMap,
    /// front = next victim, back = most recently inserted (or used, for LRU).
    queue: List<0>,
    dirty: Dirty,
}

/// Least recently used.
pub type Lru = Queue<true>;
/// First in, first out.
pub type Fifo = Queue<false>;

impl<const MOVE_ON_HIT: bool> Queue<MOVE_ON_HIT> {
    pub fn new(capacity: usize) -> Self {
        Queue {
            capacity,
            links: Vec::with_capacity(capacity),
            blocks: Vec::with_capacity(capacity),
            free: Vec::new(),
            map: block_map(capacity),
            queue: List::new(),
            dirty: Dirty::new(capacity),
        }
    }

    #[inline]
    fn resident(&self, block: u64) -> Option<u32> {
        self.map.get(block, &self.blocks)
    }

    #[inline]
    fn block_of(&self, i: u32) -> u64 {
        self.blocks[i as usize]
    }

    /// The oldest clean entry.
    fn victim(&self) -> Option<u32> {
        let mut cur = self.queue.front();
        while let Some(i) = cur {
            if !self.dirty.is_dirty(i) {
                return Some(i);
            }
            cur = List::<0>::next(&self.links, i);
        }
        None
    }

    fn drop_entry(&mut self, i: u32) -> u64 {
        let block = self.block_of(i);
        self.queue.remove(&mut self.links, i);
        self.map.remove(block, &self.blocks);
        self.dirty.set_clean(i);
        self.free.push(i);
        block
    }

    fn add(&mut self, block: u64) -> u32 {
        let i = match self.free.pop() {
            Some(i) => {
                self.blocks[i as usize] = block;
                i
            }
            None => {
                self.links.push(Link::NONE);
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        };
        self.queue.push_back(&mut self.links, i);
        self.map.insert(block, i, &self.blocks);
        i
    }
}

impl<const MOVE_ON_HIT: bool> Policy for Queue<MOVE_ON_HIT> {
    fn name(&self) -> &'static str {
        if MOVE_ON_HIT {
            "lru"
        } else {
            "fifo"
        }
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    dirty_methods!();

    #[inline]
    fn access(&mut self, a: Access) -> Outcome {
        // A miss needs the oldest entry's block and its map slot: start those loads now, so
        // they overlap the lookup's own cache miss instead of following it.
        if let Some(f) = self.queue.front() {
            self.map.prefetch(self.blocks[f as usize]);
        }
        if let Some(i) = self.map.get(a.block, &self.blocks) {
            if MOVE_ON_HIT {
                self.queue.move_to_back(&mut self.links, i);
            }
            return Outcome::Hit;
        }
        if self.map.len() < self.capacity {
            self.add(a.block);
            return Outcome::Promote { evict: None };
        }
        // Reuse the victim's entry in place: one list move instead of an unlink, a free, an
        // allocation and a link. The victim is clean, so the dirty tracker has nothing to drop.
        let victim = if self.dirty.count() == 0 { self.queue.front() } else { self.victim() };
        let Some(v) = victim else {
            return Outcome::Miss;
        };
        // The map finds the victim by the block number in `blocks`: out of the map first.
        let old = self.blocks[v as usize];
        self.map.remove(old, &self.blocks);
        self.blocks[v as usize] = a.block;
        self.queue.move_to_back(&mut self.links, v);
        self.map.insert(a.block, v, &self.blocks);
        if let Some(f) = self.queue.front() {
            prefetch(&self.blocks[f as usize]);
        }
        Outcome::Promote { evict: Some(old) }
    }

    fn remove(&mut self, block: u64) -> bool {
        match self.resident(block) {
            Some(i) => {
                self.drop_entry(i);
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        if self.map.contains_key(block, &self.blocks) {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.map.len() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        let i = self.add(block);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }

    fn save_hints(&self) -> Vec<u8> {
        let order: Vec<(u64, u8)> = self.queue.iter(&self.links).map(|i| (self.block_of(i), 0)).collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        // Keep the hottest end when the saved cache was larger.
        let skip = entries.len().saturating_sub(self.capacity);
        for (block, _) in entries.into_iter().skip(skip) {
            if !self.map.contains_key(block, &self.blocks) {
                self.add(block);
            }
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let entries = self.capacity.max(self.blocks.capacity());
        let bytes = entries * (std::mem::size_of::<Link>() + 8)
            + self.free.capacity() * 4
            + map_bytes(&self.map)
            + self.dirty.bytes();
        bytes as f64 / self.capacity as f64
    }
}
