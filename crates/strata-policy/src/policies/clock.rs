//! CLOCK (second chance): cached blocks sit in a ring of slots with a reference bit; a hit
//! sets the bit, and the hand clears set bits until it finds a clear one to evict. The
//! newcomer takes the victim's slot with its bit clear and the hand moves past it, so the
//! order is FIFO with one reprieve per reference.

use super::dirty_methods;
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};

const EMPTY: u64 = u64::MAX;

#[derive(Debug)]
pub struct Clock {
    capacity: usize,
    /// Slot → cached block (`EMPTY` when free).
    blocks: Vec<u64>,
    referenced: Vec<bool>,
    free: Vec<u32>,
    map: BlockMap,
    hand: usize,
    dirty: Dirty,
}

impl Clock {
    pub fn new(capacity: usize) -> Self {
        Clock {
            capacity,
            blocks: vec![EMPTY; capacity],
            referenced: vec![false; capacity],
            // Pop order fills slot 0 first, so the ring order is the insertion order.
            free: (0..capacity as u32).rev().collect(),
            map: block_map(capacity),
            hand: 0,
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

    fn advance(&mut self) {
        self.hand += 1;
        if self.hand == self.capacity {
            self.hand = 0;
        }
    }

    /// Sweep to the first clean, unreferenced slot. Two full turns always suffice: the first
    /// clears every bit it passes.
    fn victim(&mut self) -> Option<u32> {
        if self.dirty.count() >= self.map.len() {
            return None;
        }
        loop {
            let s = self.hand;
            if self.blocks[s] != EMPTY && !self.dirty.is_dirty(s as u32) {
                if !self.referenced[s] {
                    return Some(s as u32);
                }
                self.referenced[s] = false;
            }
            self.advance();
        }
    }

    fn drop_slot(&mut self, s: u32) -> u64 {
        let block = self.blocks[s as usize];
        self.map.remove(block, &self.blocks);
        self.dirty.set_clean(s);
        self.blocks[s as usize] = EMPTY;
        self.referenced[s as usize] = false;
        block
    }

    fn fill(&mut self, s: u32, block: u64) {
        self.blocks[s as usize] = block;
        self.referenced[s as usize] = false;
        self.map.insert(block, s, &self.blocks);
    }
}

impl Policy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    dirty_methods!();

    fn access(&mut self, a: Access) -> Outcome {
        if let Some(s) = self.map.get(a.block, &self.blocks) {
            self.referenced[s as usize] = true;
            return Outcome::Hit;
        }
        if let Some(s) = self.free.pop() {
            self.fill(s, a.block);
            return Outcome::Promote { evict: None };
        }
        let Some(s) = self.victim() else {
            return Outcome::Miss;
        };
        let old = self.drop_slot(s);
        self.fill(s, a.block);
        self.advance();
        Outcome::Promote { evict: Some(old) }
    }

    fn remove(&mut self, block: u64) -> bool {
        match self.resident(block) {
            Some(s) => {
                self.drop_slot(s);
                self.free.push(s);
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        if self.map.contains_key(block, &self.blocks) {
            return Err(InsertError::AlreadyCached(block));
        }
        let Some(s) = self.free.pop() else {
            return Err(InsertError::Full(self.capacity));
        };
        self.fill(s, block);
        if dirty {
            self.dirty.set_dirty(s);
        }
        Ok(())
    }

    fn save_hints(&self) -> Vec<u8> {
        // Ring order starting at the hand, so a restore sweeps in the same order.
        let order: Vec<(u64, u8)> = (0..self.capacity)
            .map(|k| (self.hand + k) % self.capacity)
            .filter(|&s| self.blocks[s] != EMPTY)
            .map(|s| (self.blocks[s], self.referenced[s] as u8))
            .collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        for (block, referenced) in entries {
            if self.map.contains_key(block, &self.blocks) {
                continue;
            }
            let Some(s) = self.free.pop() else { break };
            self.fill(s, block);
            self.referenced[s as usize] = referenced != 0;
        }
        self.hand = 0;
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let bytes = self.blocks.capacity() * 8
            + self.referenced.capacity()
            + self.free.capacity() * 4
            + map_bytes(&self.map)
            + self.dirty.bytes();
        bytes as f64 / self.capacity as f64
    }
}
