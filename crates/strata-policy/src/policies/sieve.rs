//! SIEVE (Zhang et al., NSDI'24): a FIFO queue with a visited bit and a hand that moves from
//! the old end towards the new end, clearing visited bits and evicting the first unvisited
//! block. Unlike CLOCK, survivors stay where they are instead of moving behind the newest
//! block, so new blocks are examined (and dropped) quickly: lazy promotion, quick demotion.

use super::{dirty_methods, Arena};
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::list::{Link, List};
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};

#[derive(Clone, Copy, Debug)]
struct Node {
    block: u64,
    link: Link,
    visited: bool,
}

super::keyed_by_block!(Node);

crate::list::linked_by_field!(Node);

#[derive(Debug)]
pub struct Sieve {
    capacity: usize,
    arena: Arena<Node>,
    map: BlockMap,
    /// front = oldest, back = newest.
    queue: List<0>,
    hand: Option<u32>,
    dirty: Dirty,
}

impl Sieve {
    pub fn new(capacity: usize) -> Self {
        Sieve {
            capacity,
            arena: Arena::with_capacity(capacity),
            map: block_map(capacity),
            queue: List::new(),
            hand: None,
            dirty: Dirty::new(capacity),
        }
    }

    #[inline]
    fn resident(&self, block: u64) -> Option<u32> {
        self.map.get(block, &self.arena.nodes)
    }

    #[inline]
    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block
    }

    fn victim(&mut self) -> Option<u32> {
        if self.dirty.count() >= self.map.len() {
            return None;
        }
        let nodes = &mut self.arena.nodes;
        let mut o = self.hand.or(self.queue.front())?;
        loop {
            if self.dirty.is_dirty(o) {
                // Not evictable: pass over it and leave its bit for when it is clean.
            } else if nodes[o as usize].visited {
                nodes[o as usize].visited = false;
            } else {
                break;
            }
            o = List::<0>::next(nodes, o).or(self.queue.front())?;
        }
        self.hand = List::<0>::next(nodes, o);
        Some(o)
    }

    fn drop_entry(&mut self, i: u32) -> u64 {
        if self.hand == Some(i) {
            self.hand = List::<0>::next(&self.arena.nodes, i);
        }
        let block = self.block_of(i);
        self.queue.remove(&mut self.arena.nodes, i);
        self.map.remove(block, &self.arena.nodes);
        self.dirty.set_clean(i);
        self.arena.free(i);
        block
    }

    fn add(&mut self, block: u64, visited: bool) -> u32 {
        let i = self.arena.alloc(Node { block, link: Link::NONE, visited });
        self.queue.push_back(&mut self.arena.nodes, i);
        self.map.insert(block, i, &self.arena.nodes);
        i
    }
}

impl Policy for Sieve {
    fn name(&self) -> &'static str {
        "sieve"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    dirty_methods!();

    fn access(&mut self, a: Access) -> Outcome {
        if let Some(i) = self.map.get(a.block, &self.arena.nodes) {
            self.arena.nodes[i as usize].visited = true;
            return Outcome::Hit;
        }
        let evict = if self.map.len() < self.capacity {
            None
        } else {
            match self.victim() {
                Some(v) => Some(self.drop_entry(v)),
                None => return Outcome::Miss,
            }
        };
        self.add(a.block, false);
        Outcome::Promote { evict }
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
        if self.map.contains_key(block, &self.arena.nodes) {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.map.len() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        let i = self.add(block, false);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }

    fn save_hints(&self) -> Vec<u8> {
        let nodes = &self.arena.nodes;
        let order: Vec<(u64, u8)> =
            self.queue.iter(nodes).map(|i| (nodes[i as usize].block, nodes[i as usize].visited as u8)).collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        let skip = entries.len().saturating_sub(self.capacity);
        for (block, visited) in entries.into_iter().skip(skip) {
            if !self.map.contains_key(block, &self.arena.nodes) {
                self.add(block, visited != 0);
            }
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let bytes = self.arena.bytes(self.capacity) + map_bytes(&self.map) + self.dirty.bytes();
        bytes as f64 / self.capacity as f64
    }
}
