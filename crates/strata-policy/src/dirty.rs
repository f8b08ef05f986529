//! Dirty-block bookkeeping shared by the policies that have no dirty ordering of their own.
//!
//! Entry `i` of a policy's arena is dirty here at index `i`. Dirty blocks wait on a FIFO in
//! the order they became dirty: under recency-driven policies the block dirtied longest ago
//! is the one nearest eviction, so writing it back first frees a victim soonest. A block
//! handed to the engine for write-back leaves the FIFO but stays dirty, so it is neither
//! evicted nor handed out twice.
//!
//! The FIFO is a ring of entry indices with one state byte per entry, about 5 bytes an entry
//! (a doubly linked list took 9). An entry cleaned while queued is not searched out of the
//! ring: its position goes stale and is skipped when it reaches the front. An entry is pushed
//! only when it holds no position in the ring, stale or live, so the ring never holds more
//! than one position per entry and never outgrows its first allocation. The price is in the
//! order: an entry cleaned and dirtied again before its stale position reaches the front
//! takes that position back instead of joining the end, and so may be written back earlier
//! than a list would have. The same goes for an entry freed and reused for another block
//! that is dirtied in that time. Either way the block handed out is dirty, and nothing else
//! of the order changes.

use std::collections::VecDeque;

/// Dirtiness: `CLEAN`, `QUEUED` (waiting in the ring) or `WRITING` (handed out, not in the
/// ring), plus `IN_RING` while the entry holds a position there, live or stale.
const CLEAN: u8 = 0;
const QUEUED: u8 = 1;
const WRITING: u8 = 2;
const IN_RING: u8 = 4;
const DIRTINESS: u8 = 3;

#[derive(Debug, Clone)]
pub(crate) struct Dirty {
    state: Vec<u8>,
    /// front = the oldest position.
    ring: VecDeque<u32>,
    count: usize,
}

impl Dirty {
    pub fn new(entries: usize) -> Self {
        Dirty { state: vec![CLEAN; entries], ring: VecDeque::with_capacity(entries), count: 0 }
    }

    #[inline]
    pub fn is_dirty(&self, i: u32) -> bool {
        self.state[i as usize] & DIRTINESS != CLEAN
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn set_dirty(&mut self, i: u32) {
        let s = self.state[i as usize];
        if s & DIRTINESS == QUEUED {
            return;
        }
        if s & DIRTINESS == CLEAN {
            self.count += 1;
        }
        if s & IN_RING == 0 {
            self.ring.push_back(i);
        }
        self.state[i as usize] = QUEUED | IN_RING;
    }

    /// Mark clean, also used when the entry leaves the cache.
    pub fn set_clean(&mut self, i: u32) {
        let s = &mut self.state[i as usize];
        if *s & DIRTINESS != CLEAN {
            self.count -= 1;
        }
        *s &= IN_RING;
    }

    /// Hand out the longest-dirty block for write-back.
    pub fn take(&mut self) -> Option<u32> {
        while let Some(i) = self.ring.pop_front() {
            let s = &mut self.state[i as usize];
            if *s & DIRTINESS == QUEUED {
                *s = WRITING;
                return Some(i);
            }
            *s = CLEAN;
        }
        None
    }

    pub fn bytes(&self) -> usize {
        self.ring.capacity() * std::mem::size_of::<u32>() + self.state.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::mix64;

    /// Against the FIFO semantics spelled out in the module doc: a list of positions where
    /// a clean entry leaves its position behind and takes it back if dirtied again before it
    /// is skipped. Random set_dirty, set_clean and take on a few entries, so every path
    /// (re-dirtying a queued, a stale and a handed-out entry) comes up often.
    #[test]
    fn agrees_with_a_reference_fifo() {
        const ENTRIES: usize = 12;
        let mut ours = Dirty::new(ENTRIES);
        let ring_capacity = ours.ring.capacity();
        // The reference: positions in order, and each entry's dirtiness.
        let mut positions: Vec<u32> = Vec::new();
        let mut state = [CLEAN; ENTRIES];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x = mix64(x);
            let i = (x % ENTRIES as u64) as u32;
            match (x >> 8) % 3 {
                0 => {
                    if state[i as usize] != QUEUED && !positions.contains(&i) {
                        positions.push(i);
                    }
                    state[i as usize] = QUEUED;
                    ours.set_dirty(i);
                }
                1 => {
                    state[i as usize] = CLEAN;
                    ours.set_clean(i);
                }
                _ => {
                    // Stale positions at the front are dropped on the way.
                    let k = positions.iter().position(|&j| state[j as usize] == QUEUED);
                    let expected = k.map(|k| positions[k]);
                    positions.drain(..k.map_or(positions.len(), |k| k + 1));
                    if let Some(j) = expected {
                        state[j as usize] = WRITING;
                    }
                    assert_eq!(ours.take(), expected);
                }
            }
            for j in 0..ENTRIES as u32 {
                assert_eq!(ours.is_dirty(j), state[j as usize] != CLEAN);
            }
            assert_eq!(ours.count(), state.iter().filter(|&&s| s != CLEAN).count());
        }
        assert_eq!(ours.ring.capacity(), ring_capacity, "the ring never reallocates");
    }

    /// Without cleaning, the order is exactly that of first becoming dirty, and an entry
    /// written back and dirtied again joins the end.
    #[test]
    fn hands_out_the_longest_dirty_first() {
        let mut d = Dirty::new(8);
        for i in [3, 1, 4, 1, 5] {
            d.set_dirty(i);
        }
        assert_eq!(d.count(), 4);
        assert_eq!(d.take(), Some(3));
        d.set_dirty(3);
        assert_eq!((d.take(), d.take(), d.take(), d.take(), d.take()), (Some(1), Some(4), Some(5), Some(3), None));
        // Handed out, still dirty until cleaned.
        assert!(d.is_dirty(3));
        for i in [1, 3, 4, 5] {
            d.set_clean(i);
        }
        assert_eq!(d.count(), 0);
        // Cleaned while queued: skipped.
        d.set_dirty(6);
        d.set_dirty(7);
        d.set_clean(6);
        assert_eq!((d.take(), d.take()), (Some(7), None));
    }
}
