//! The index from origin block to the slot of its newest copy, in 4 bytes a cell: an
//! open-addressing table (linear probing, deletion by backward shift) of slot numbers, whose
//! keys are read from the slots themselves. A quarter larger than the most blocks it can
//! hold, so probes stay short and it never fills.

use super::state::{filled, Slot, NONE};

#[derive(Default)]
pub struct SlotIndex {
    cells: Vec<u32>,
    len: u64,
}

impl SlotIndex {
    /// An index for at most `slots` blocks; `None` where its memory cannot be had.
    pub fn with_capacity(slots: usize) -> Option<SlotIndex> {
        Some(SlotIndex { cells: filled(slots.saturating_add(slots / 4).max(8), NONE)?, len: 0 })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn heap_bytes(&self) -> usize {
        self.cells.capacity() * 4
    }

    fn home(&self, block: u64) -> usize {
        let h = block.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((h as u128 * self.cells.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.cells.len() {
            0
        } else {
            i + 1
        }
    }

    /// The cell holding `block`, or the empty cell where it would go.
    fn find(&self, slots: &[Slot], block: u64) -> (usize, bool) {
        let mut i = self.home(block);
        loop {
            match self.cells[i] {
                NONE => return (i, false),
                s if slots[s as usize].block == block => return (i, true),
                _ => i = self.next(i),
            }
        }
    }

    pub fn get(&self, slots: &[Slot], block: u64) -> Option<u32> {
        let (i, found) = self.find(slots, block);
        found.then(|| self.cells[i])
    }

    /// Maps `block` to slot `s` (whose block is already `block`); returns the slot it mapped
    /// to before. `slots` must hold the previous slot's block unchanged.
    pub fn insert(&mut self, slots: &[Slot], block: u64, s: u32) -> Option<u32> {
        let (i, found) = self.find(slots, block);
        let old = std::mem::replace(&mut self.cells[i], s);
        if found {
            Some(old)
        } else {
            self.len += 1;
            assert!(self.len < self.cells.len() as u64, "slot index full");
            None
        }
    }

    /// Unmaps `block`; returns its slot.
    pub fn remove(&mut self, slots: &[Slot], block: u64) -> Option<u32> {
        let (mut hole, found) = self.find(slots, block);
        if !found {
            return None;
        }
        let s = self.cells[hole];
        self.len -= 1;
        // Backward shift: pull later cells of the probe run into the hole when their home
        // is not between the hole and them.
        let mut j = self.next(hole);
        while self.cells[j] != NONE {
            let home = self.home(slots[self.cells[j] as usize].block);
            let n = self.cells.len();
            let dist = |from: usize, to: usize| (to + n - from) % n;
            if dist(home, j) >= dist(hole, j) {
                self.cells[hole] = self.cells[j];
                hole = j;
            }
            j = self.next(j);
        }
        self.cells[hole] = NONE;
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    #[test]
    fn it_agrees_with_a_hash_map_under_random_inserts_replacements_and_removals() {
        for seed in 0..20 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let n = rng.gen_range(1..300usize);
            let mut slots = vec![Slot::default(); n];
            let mut free: Vec<u32> = (0..n as u32).collect();
            let mut index = SlotIndex::with_capacity(n).unwrap();
            let mut model: HashMap<u64, u32> = HashMap::new();
            // Few distinct blocks, so probe runs collide and wrap.
            let blocks = rng.gen_range(1..4 * n as u64);
            for _ in 0..5_000 {
                let b = rng.gen_range(0..blocks);
                if rng.gen_bool(0.6) && !free.is_empty() {
                    let s = free.swap_remove(rng.gen_range(0..free.len()));
                    slots[s as usize].block = b;
                    let old = index.insert(&slots, b, s);
                    assert_eq!(old, model.insert(b, s), "seed {seed}: insert {b}");
                    if let Some(o) = old {
                        free.push(o);
                    }
                } else {
                    let got = index.remove(&slots, b);
                    assert_eq!(got, model.remove(&b), "seed {seed}: remove {b}");
                    if let Some(s) = got {
                        free.push(s);
                    }
                }
                assert_eq!(index.len(), model.len() as u64);
            }
            for b in 0..blocks {
                assert_eq!(index.get(&slots, b), model.get(&b).copied(), "seed {seed}: block {b}");
            }
        }
    }
}
