//! A ghost queue: a FIFO of blocks (no data, no other state) that remembers the last
//! `capacity` blocks put into it, and forgets a block early when asked (a ghost hit).
//!
//! Kept as an arena entry with links, a ghost costs as much as a cached block (16–24 bytes,
//! a map slot and a dirty slot); here it is a 32-bit fingerprint of the block number in a
//! ring and a map slot, about 10 bytes. A fingerprint stands for every block that hashes to
//! it, so a block whose fingerprint a remembered one shares is taken as remembered: with `g`
//! ghosts, one lookup in `2^32 / g` (one in 4,800 for the 900,000 ghosts of a cache of a
//! million blocks). A ghost only steers where a missed block starts out, so such a mistake
//! costs at most one block's placement; the block numbers themselves took twice the ring.
//!
//! The ring is a little longer than the queue: a block forgotten early leaves a hole in it
//! (`GONE`), skipped when the oldest end reaches it, and when the holes fill the spare length
//! the live blocks are packed together again and the map rebuilt. Packing happens at most
//! once per [`SPARE`] of the capacity of blocks put in, so it costs a few map inserts per
//! block at worst, and nothing where ghosts are rarely hit.

use crate::hash::{block_map_indexed, map_bytes, mix64, BlockMap};

/// A ring position holding no block (no fingerprint is this).
const GONE: u32 = u32::MAX;
/// The ring's spare length, as a fraction of the capacity (`1 / SPARE`).
const SPARE: usize = 4;

#[derive(Debug, Clone)]
pub(crate) struct GhostFifo {
    /// Position `p` (counted from the first block ever put in) is at `ring[p % ring.len()]`:
    /// the fingerprint of the block put in there.
    ring: Vec<u32>,
    /// Fingerprint → its index in `ring`.
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

    #[cfg(test)]
    pub fn contains(&self, block: u64) -> bool {
        self.map.contains_key(fingerprint(block) as u64, &self.ring)
    }

    /// Start loading where `block` would be found.
    #[inline]
    pub fn prefetch(&self, block: u64) {
        self.map.prefetch(fingerprint(block) as u64)
    }

    /// Put `block` in as the newest, forgetting the oldest when full. A block already
    /// remembered (or one sharing its fingerprint) moves to the newest end.
    pub fn remember(&mut self, block: u64) {
        let key = fingerprint(block);
        self.forget_key(key);
        if self.len == self.capacity {
            self.forget_oldest();
        }
        if self.tail - self.head == self.ring.len() {
            self.pack();
        }
        let at = self.tail % self.ring.len();
        self.ring[at] = key;
        self.map.insert(key as u64, at as u32, &self.ring);
        self.tail += 1;
        self.len += 1;
    }

    /// Forget `block`; whether it was remembered.
    pub fn forget(&mut self, block: u64) -> bool {
        self.forget_key(fingerprint(block))
    }

    fn forget_key(&mut self, key: u32) -> bool {
        match self.map.remove(key as u64, &self.ring) {
            Some(at) => {
                self.ring[at as usize] = GONE;
                self.len -= 1;
                true
            }
            None => false,
        }
    }

    /// Forget the oldest block; whether there was one.
    pub fn forget_oldest(&mut self) -> bool {
        while self.head < self.tail {
            let at = self.head % self.ring.len();
            self.head += 1;
            let key = self.ring[at];
            if key != GONE {
                self.map.remove(key as u64, &self.ring);
                self.ring[at] = GONE;
                self.len -= 1;
                return true;
            }
        }
        false
    }

    /// Move the live blocks together (in order, from the oldest's place on) and rebuild the
    /// map.
    fn pack(&mut self) {
        let n = self.ring.len();
        let mut to = self.head;
        for from in self.head..self.tail {
            let key = self.ring[from % n];
            if key != GONE {
                self.ring[from % n] = GONE;
                self.ring[to % n] = key;
                to += 1;
            }
        }
        self.tail = to;
        self.map.clear();
        for p in self.head..self.tail {
            self.map.insert(self.ring[p % n] as u64, (p % n) as u32, &self.ring);
        }
    }

    /// The fingerprints of the blocks remembered, oldest first.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (self.head..self.tail).map(|p| self.ring[p % self.ring.len()]).filter(|&k| k != GONE)
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.ring.len() * std::mem::size_of::<u32>() + map_bytes(&self.map)
    }
}

/// The 32 bits a ghost keeps of `block`: the high half of its hash, never `GONE`.
#[inline]
fn fingerprint(block: u64) -> u32 {
    ((mix64(block) >> 32) as u32).min(GONE - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::mix64;
    use std::collections::VecDeque;

    /// Against a plain FIFO with removal: random remembers (of blocks new or already
    /// remembered, which move to the newest end), forgets and forgets of the oldest over a
    /// few dozen blocks, at capacities where the ring wraps and packs often.
    #[test]
    fn it_is_a_fifo_that_forgets_on_request() {
        for capacity in [1, 2, 3, 7, 16, 50] {
            let mut ghost = GhostFifo::new(capacity);
            let mut model: VecDeque<u64> = VecDeque::new();
            for step in 0..20_000u64 {
                let r = mix64(capacity as u64 * 1_000_003 + step);
                let block = r % 60;
                let known = model.iter().position(|&b| b == block);
                match r >> 60 {
                    0..=9 => {
                        ghost.remember(block);
                        if let Some(i) = known {
                            model.remove(i);
                        }
                        model.push_back(block);
                        if model.len() > capacity {
                            model.pop_front();
                        }
                    }
                    10..=14 => {
                        assert_eq!(ghost.forget(block), known.is_some(), "step {step}: forget {block}");
                        if let Some(i) = known {
                            model.remove(i);
                        }
                    }
                    _ => assert_eq!(ghost.forget_oldest(), model.pop_front().is_some(), "step {step}"),
                }
                assert_eq!(ghost.len(), model.len());
                assert!(ghost.iter().eq(model.iter().map(|&b| fingerprint(b))), "capacity {capacity}, step {step}");
                assert!((0..60).all(|b| ghost.contains(b) == model.contains(&b)), "step {step}");
            }
        }
    }

    /// Two blocks with one fingerprint are one ghost: the second is taken as remembered, and
    /// remembering it does not make two.
    #[test]
    fn blocks_sharing_a_fingerprint_are_one_ghost() {
        let mut first = std::collections::HashMap::new();
        let (a, b) = (0u64..)
            .find_map(|b| first.insert(fingerprint(b), b).map(|a| (a, b)))
            .expect("32-bit fingerprints collide within a few hundred thousand blocks");
        let mut ghost = GhostFifo::new(4);
        ghost.remember(a);
        assert!(ghost.contains(b));
        ghost.remember(b);
        assert_eq!(ghost.len(), 1);
        assert!(ghost.forget(a) && !ghost.contains(b));
    }

    /// A ghost costs its ring position and its map slot: under 11 bytes.
    #[test]
    fn a_ghost_costs_under_11_bytes() {
        for capacity in [1_000, 1 << 20] {
            let ghost = GhostFifo::new(capacity);
            assert!(ghost.bytes() < 11 * capacity, "{capacity}: {} bytes", ghost.bytes());
        }
    }
}
