//! A ghost queue: a FIFO of block numbers (no data, no other state) that remembers the last
//! `capacity` blocks put into it, and forgets a block early when asked (a ghost hit).
//!
//! Kept as an arena entry with links, a ghost costs as much as a cached block (16–24 bytes,
//! a map slot and a dirty slot); here it is a block number in a ring and a map slot, about
//! 15 bytes. The ring is a little longer than the queue: a block forgotten early leaves a
//! hole in it (`GONE`), skipped when the oldest end reaches it, and when the holes fill the
//! spare length the live blocks are packed together again and the map rebuilt. Packing
//! happens at most once per [`SPARE`] of the capacity of blocks put in, so it costs a few map
//! inserts per block at worst, and nothing where ghosts are rarely hit.

use crate::hash::{block_map_indexed, map_bytes, BlockMap};

/// A ring position holding no block.
const GONE: u64 = u64::MAX;
/// The ring's spare length, as a fraction of the capacity (`1 / SPARE`).
const SPARE: usize = 4;

#[derive(Debug)]
pub(crate) struct GhostFifo {
    /// Position `p` (counted from the first block ever put in) is at `ring[p % ring.len()]`.
    ring: Vec<u64>,
    /// Block → its index in `ring`.
    map: BlockMap,
    /// Positions of the oldest block (or hole) and of the next block in.
    head: usize,
    tail: usize,
    len: usize,
    capacity: usize,
}

impl GhostFifo {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let slots = capacity + capacity / SPARE + 1;
        GhostFifo {
            ring: vec![GONE; slots],
            map: block_map_indexed(capacity, slots),
            head: 0,
            tail: 0,
            len: 0,
            capacity,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn contains(&self, block: u64) -> bool {
        self.map.contains_key(block, &self.ring)
    }

    /// Start loading where `block` would be found.
    #[inline]
    pub fn prefetch(&self, block: u64) {
        self.map.prefetch(block)
    }

    /// Put `block` (not in the queue) in as the newest, forgetting the oldest when full.
    pub fn remember(&mut self, block: u64) {
        debug_assert!(block != GONE && !self.contains(block));
        if self.len == self.capacity {
            self.forget_oldest();
        }
        if self.tail - self.head == self.ring.len() {
            self.pack();
        }
        let at = self.tail % self.ring.len();
        self.ring[at] = block;
        self.map.insert(block, at as u32, &self.ring);
        self.tail += 1;
        self.len += 1;
    }

    /// Forget `block`; whether it was remembered.
    pub fn forget(&mut self, block: u64) -> bool {
        match self.map.remove(block, &self.ring) {
            Some(at) => {
                self.ring[at as usize] = GONE;
                self.len -= 1;
                true
            }
            None => false,
        }
    }

    /// Forget the oldest block; returns it.
    pub fn forget_oldest(&mut self) -> Option<u64> {
        while self.head < self.tail {
            let at = self.head % self.ring.len();
            self.head += 1;
            let block = self.ring[at];
            if block != GONE {
                self.map.remove(block, &self.ring);
                self.ring[at] = GONE;
                self.len -= 1;
                return Some(block);
            }
        }
        None
    }

    /// Move the live blocks together (in order, from the oldest's place on) and rebuild the
    /// map.
    fn pack(&mut self) {
        let n = self.ring.len();
        let mut to = self.head;
        for from in self.head..self.tail {
            let block = self.ring[from % n];
            if block != GONE {
                self.ring[from % n] = GONE;
                self.ring[to % n] = block;
                to += 1;
            }
        }
        self.tail = to;
        self.map.clear();
        for p in self.head..self.tail {
            self.map.insert(self.ring[p % n], (p % n) as u32, &self.ring);
        }
    }

    /// The blocks remembered, oldest first.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (self.head..self.tail).map(|p| self.ring[p % self.ring.len()]).filter(|&b| b != GONE)
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.ring.len() * std::mem::size_of::<u64>() + map_bytes(&self.map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::mix64;
    use std::collections::VecDeque;

    /// Against a plain FIFO with removal: random remembers, forgets and forgets of the
    /// oldest over a few dozen blocks, at capacities where the ring wraps and packs often.
    #[test]
    fn it_is_a_fifo_that_forgets_on_request() {
        for capacity in [1, 2, 3, 7, 16, 50] {
            let mut ghost = GhostFifo::new(capacity);
            let mut model: VecDeque<u64> = VecDeque::new();
            for step in 0..20_000u64 {
                let r = mix64(capacity as u64 * 1_000_003 + step);
                let block = r % 60;
                match r >> 60 {
                    0..=9 => {
                        if !model.contains(&block) {
                            ghost.remember(block);
                            model.push_back(block);
                            if model.len() > capacity {
                                model.pop_front();
                            }
                        }
                    }
                    10..=14 => {
                        let known = model.iter().position(|&b| b == block);
                        assert_eq!(ghost.forget(block), known.is_some(), "step {step}: forget {block}");
                        if let Some(i) = known {
                            model.remove(i);
                        }
                    }
                    _ => assert_eq!(ghost.forget_oldest(), model.pop_front(), "step {step}"),
                }
                assert_eq!(ghost.len(), model.len());
                assert!(ghost.iter().eq(model.iter().copied()), "capacity {capacity}, step {step}");
                assert!((0..60).all(|b| ghost.contains(b) == model.contains(&b)), "step {step}");
            }
        }
    }

    /// A ghost costs its ring position and its map slot: under 16 bytes.
    #[test]
    fn a_ghost_costs_under_16_bytes() {
        for capacity in [1_000, 1 << 20] {
            let ghost = GhostFifo::new(capacity);
            assert!(ghost.bytes() < 16 * capacity, "{capacity}: {} bytes", ghost.bytes());
        }
    }
}
