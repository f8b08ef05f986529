//! Full 2Q (Johnson & Shasha, VLDB'94). A first reference lands in `A1in`, a FIFO of a
//! quarter of the cache; blocks leaving it are remembered (not cached) in `A1out`, a ghost
//! FIFO half the cache long. A miss on a remembered block goes straight to `Am`, an LRU of
//! blocks seen at least twice. Hits in `A1in` change nothing: correlated references right
//! after the first one do not prove a block is hot.

use super::{dirty_methods, Arena};
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::list::{Link, List};
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    A1in,
    Am,
    A1out,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    block: u64,
    link: Link,
    at: Where,
}

super::keyed_by_block!(Node);

crate::list::linked_by_field!(Node);

#[derive(Debug)]
pub struct TwoQ {
    capacity: usize,
    kin: usize,
    kout: usize,
    arena: Arena<Node>,
    map: BlockMap,
    a1in: List<0>,
    am: List<0>,
    a1out: List<0>,
    dirty: Dirty,
}

impl TwoQ {
    pub fn new(capacity: usize) -> Self {
        let kout = (capacity / 2).max(1);
        TwoQ {
            capacity,
            kin: (capacity / 4).max(1),
            kout,
            arena: Arena::with_capacity(capacity + kout + 1),
            map: block_map(capacity + kout + 1),
            a1in: List::new(),
            am: List::new(),
            a1out: List::new(),
            dirty: Dirty::new(capacity + kout + 1),
        }
    }

    fn resident(&self, block: u64) -> Option<u32> {
        let i = self.map.get(block, &self.arena.nodes)?;
        (self.arena.nodes[i as usize].at != Where::A1out).then_some(i)
    }

    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block
    }

    fn cached(&self) -> usize {
        self.a1in.len() + self.am.len()
    }

    fn list(&mut self, at: Where) -> &mut List<0> {
        match at {
            Where::A1in => &mut self.a1in,
            Where::Am => &mut self.am,
            Where::A1out => &mut self.a1out,
        }
    }

    fn oldest_clean(&self, list: &List<0>) -> Option<u32> {
        let mut cur = list.front();
        while let Some(i) = cur {
            if !self.dirty.is_dirty(i) {
                return Some(i);
            }
            cur = List::<0>::next(&self.arena.nodes, i);
        }
        None
    }

    /// The paper's `reclaimfor`: page out the tail of A1in while it is over its share, else the
    /// tail of Am. Dirty blocks are skipped, falling back to the other queue.
    fn victim(&self) -> Option<u32> {
        let from_a1in = self.oldest_clean(&self.a1in);
        if self.a1in.len() > self.kin && from_a1in.is_some() {
            return from_a1in;
        }
        self.oldest_clean(&self.am).or(from_a1in)
    }

    fn unlink(&mut self, i: u32) {
        let at = self.arena.nodes[i as usize].at;
        let mut list = *self.list(at);
        list.remove(&mut self.arena.nodes, i);
        *self.list(at) = list;
    }

    fn place(&mut self, i: u32, at: Where) {
        self.arena.nodes[i as usize].at = at;
        let mut list = *self.list(at);
        list.push_back(&mut self.arena.nodes, i);
        *self.list(at) = list;
    }

    fn forget(&mut self, i: u32) {
        self.unlink(i);
        let block = self.block_of(i);
        self.map.remove(block, &self.arena.nodes);
        self.arena.free(i);
    }

    /// Evict `i`; blocks leaving A1in are remembered in A1out.
    fn evict(&mut self, i: u32) -> u64 {
        let block = self.block_of(i);
        self.dirty.set_clean(i);
        if self.arena.nodes[i as usize].at == Where::A1in {
            self.unlink(i);
            self.place(i, Where::A1out);
            if self.a1out.len() > self.kout {
                let z = self.a1out.front().expect("A1out is not empty");
                self.forget(z);
            }
        } else {
            self.forget(i);
        }
        block
    }

    fn add(&mut self, block: u64, at: Where) -> u32 {
        let i = self.arena.alloc(Node { block, link: Link::NONE, at });
        self.place(i, at);
        self.map.insert(block, i, &self.arena.nodes);
        i
    }
}

impl Policy for TwoQ {
    fn name(&self) -> &'static str {
        "2q"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.cached()
    }

    dirty_methods!();

    fn access(&mut self, a: Access) -> Outcome {
        let ghost = match self.map.get(a.block, &self.arena.nodes) {
            Some(i) => match self.arena.nodes[i as usize].at {
                Where::Am => {
                    self.am.move_to_back(&mut self.arena.nodes, i);
                    return Outcome::Hit;
                }
                Where::A1in => return Outcome::Hit,
                Where::A1out => Some(i),
            },
            None => None,
        };
        let evict = if self.cached() < self.capacity {
            None
        } else {
            match self.victim() {
                Some(v) => Some(self.evict(v)),
                None => return Outcome::Miss,
            }
        };
        // The ghost may have been pushed out of A1out by the eviction just now.
        match ghost {
            Some(g) if self.map.get(a.block, &self.arena.nodes) == Some(g) => {
                self.unlink(g);
                self.place(g, Where::Am);
            }
            Some(_) => {
                self.add(a.block, Where::Am);
            }
            None => {
                self.add(a.block, Where::A1in);
            }
        }
        Outcome::Promote { evict }
    }

    fn remove(&mut self, block: u64) -> bool {
        match self.resident(block) {
            Some(i) => {
                self.dirty.set_clean(i);
                self.forget(i);
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        if self.resident(block).is_some() {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.cached() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        if let Some(g) = self.map.get(block, &self.arena.nodes) {
            self.forget(g);
        }
        let i = self.add(block, Where::Am);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }

    fn save_hints(&self) -> Vec<u8> {
        let nodes = &self.arena.nodes;
        let order: Vec<(u64, u8)> = self
            .a1in
            .iter(nodes)
            .map(|i| (nodes[i as usize].block, 0))
            .chain(self.am.iter(nodes).map(|i| (nodes[i as usize].block, 1)))
            .collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        let skip = entries.len().saturating_sub(self.capacity);
        for (block, tag) in entries.into_iter().skip(skip) {
            if !self.map.contains_key(block, &self.arena.nodes) {
                self.add(block, if tag == 1 { Where::Am } else { Where::A1in });
            }
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let n = self.capacity + self.kout + 1;
        let bytes = self.arena.bytes(n) + map_bytes(&self.map) + self.dirty.bytes();
        bytes as f64 / self.capacity as f64
    }
}
