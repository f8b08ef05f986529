//! S3-FIFO (Yang et al., SOSP'23): three static FIFO queues. New blocks enter a small queue
//! `S` (10% of the cache); most are read once and leave it quickly into the ghost queue `G`
//! (which remembers 90% of a cache's worth of block numbers, no data). Blocks hit at least
//! twice while in `S` move to the main queue `M`; a miss on a ghost goes straight to `M`.
//! `M` is a FIFO with reinsertion: a block with a non-zero 2-bit frequency is reinserted
//! with one less. Thresholds follow the authors' reference implementation in libCacheSim
//! (move to `M` at frequency 2, evict from `S` while it holds at least its 10% share).

use super::{dirty_methods, Arena};
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::list::{Link, Linked, List};
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};

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

super::keyed_by_block!(Node);

impl Linked<0> for Node {
    fn link(&self) -> &Link {
        &self.link
    }
    fn link_mut(&mut self) -> &mut Link {
        &mut self.link
    }
}

const MOVE_TO_MAIN_FREQ: u8 = 2;
const MAX_FREQ: u8 = 3;

#[derive(Debug)]
pub struct S3Fifo {
    capacity: usize,
    small_cap: usize,
    ghost_cap: usize,
    arena: Arena<Node>,
    map: BlockMap,
    /// front = oldest for all three queues.
    small: List<0>,
    main: List<0>,
    ghost: List<0>,
    dirty: Dirty,
}

impl S3Fifo {
    pub fn new(capacity: usize) -> Self {
        let ghost_cap = (capacity * 9 / 10).max(1);
        let n = capacity + ghost_cap + 1;
        S3Fifo {
            capacity,
            small_cap: (capacity / 10).max(1),
            ghost_cap,
            arena: Arena::with_capacity(n),
            map: block_map(n),
            small: List::new(),
            main: List::new(),
            ghost: List::new(),
            dirty: Dirty::new(n),
        }
    }

    fn resident(&self, block: u64) -> Option<u32> {
        let i = self.map.get(block, &self.arena.nodes)?;
        (self.arena.nodes[i as usize].at != Where::Ghost).then_some(i)
    }

    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block
    }

    fn cached(&self) -> usize {
        self.small.len() + self.main.len()
    }

    fn move_to_main(&mut self, i: u32) {
        self.arena.nodes[i as usize].at = Where::Main;
        self.main.push_back(&mut self.arena.nodes, i);
    }

    fn move_to_ghost(&mut self, i: u32) {
        self.arena.nodes[i as usize].at = Where::Ghost;
        self.ghost.push_back(&mut self.arena.nodes, i);
        if self.ghost.len() > self.ghost_cap {
            let g = self.ghost.pop_front(&mut self.arena.nodes).expect("ghost is not empty");
            let block = self.block_of(g);
            self.map.remove(block, &self.arena.nodes);
            self.arena.free(g);
        }
    }

    /// Evict one block from S: promote the frequently hit ones to M on the way.
    fn evict_small(&mut self) -> Option<u64> {
        while let Some(t) = self.small.pop_front(&mut self.arena.nodes) {
            let node = self.arena.nodes[t as usize];
            if node.freq >= MOVE_TO_MAIN_FREQ || self.dirty.is_dirty(t) {
                // Like the reference implementation, a block starts over in M with no credit.
                self.arena.nodes[t as usize].freq = 0;
                self.move_to_main(t);
            } else {
                self.move_to_ghost(t);
                return Some(node.block);
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
            if node.freq > 0 || dirty {
                if !dirty {
                    node.freq = node.freq.min(MAX_FREQ) - 1;
                }
                self.main.move_to_back(&mut self.arena.nodes, t);
            } else {
                let block = node.block;
                self.main.remove(&mut self.arena.nodes, t);
                self.map.remove(block, &self.arena.nodes);
                self.arena.free(t);
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
        let i = self.arena.alloc(Node { block, link: Link::NONE, at, freq: 0 });
        match at {
            Where::Main => self.main.push_back(&mut self.arena.nodes, i),
            _ => self.small.push_back(&mut self.arena.nodes, i),
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

    dirty_methods!();

    fn access(&mut self, a: Access) -> Outcome {
        let found = self.map.get(a.block, &self.arena.nodes);
        if let Some(i) = found {
            let node = &mut self.arena.nodes[i as usize];
            if node.at != Where::Ghost {
                // The main queue only uses two bits; S counts on up to the move threshold.
                node.freq = (node.freq + 1).min(MAX_FREQ);
                return Outcome::Hit;
            }
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
        match self.map.get(a.block, &self.arena.nodes) {
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
        self.map.remove(block, &self.arena.nodes);
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
        if let Some(g) = self.map.remove(block, &self.arena.nodes) {
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
        let order: Vec<(u64, u8)> = self.small.iter(nodes).map(tag).chain(self.main.iter(nodes).map(tag)).collect();
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
            if !self.map.contains_key(block, &self.arena.nodes) {
                let i = self.add(block, if tag & 4 != 0 { Where::Main } else { Where::Small });
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
