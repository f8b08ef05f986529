//! ARC (Megiddo & Modha, FAST'03). Two LRU lists of cached blocks, `T1` (seen once recently)
//! and `T2` (seen at least twice), each shadowed by a ghost list of blocks recently evicted
//! from it (`B1`, `B2`). A ghost hit in `B1` says recency deserved more room, one in `B2` that
//! frequency did; the target size `p` of `T1` moves accordingly. The cases below follow the
//! paper's Figure 4; the only addition is that a dirty block is never the victim.

use super::{dirty_methods, Arena};
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::list::{Link, List};
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    T1,
    T2,
    B1,
    B2,
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
pub struct Arc {
    c: usize,
    /// Target size of T1.
    p: usize,
    arena: Arena<Node>,
    map: BlockMap,
    /// front = LRU end, back = MRU end, for all four lists.
    t1: List<0>,
    t2: List<0>,
    b1: List<0>,
    b2: List<0>,
    dirty: Dirty,
}

impl Arc {
    pub fn new(capacity: usize) -> Self {
        let n = 2 * capacity + 1;
        Arc {
            c: capacity,
            p: 0,
            arena: Arena::with_capacity(n),
            map: block_map(n),
            t1: List::new(),
            t2: List::new(),
            b1: List::new(),
            b2: List::new(),
            dirty: Dirty::new(n),
        }
    }

    /// The adaptation target `p`, exposed for tests.
    pub fn target_t1(&self) -> usize {
        self.p
    }

    fn resident(&self, block: u64) -> Option<u32> {
        let i = self.map.get(block, &self.arena.nodes)?;
        matches!(self.arena.nodes[i as usize].at, Where::T1 | Where::T2).then_some(i)
    }

    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block
    }

    fn cached(&self) -> usize {
        self.t1.len() + self.t2.len()
    }

    fn list(&mut self, at: Where) -> &mut List<0> {
        match at {
            Where::T1 => &mut self.t1,
            Where::T2 => &mut self.t2,
            Where::B1 => &mut self.b1,
            Where::B2 => &mut self.b2,
        }
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

    /// REPLACE(x, p): the LRU of T1 if T1 is over its target (or at it, when x is a B2 ghost),
    /// else the LRU of T2; with dirty blocks skipped and the other list as a fallback.
    fn replace_victim(&self, p: usize, x_in_b2: bool) -> Option<u32> {
        let t1 = self.t1.len();
        let prefer_t1 = t1 >= 1 && ((x_in_b2 && t1 == p) || t1 > p);
        let (first, second) = if prefer_t1 { (&self.t1, &self.t2) } else { (&self.t2, &self.t1) };
        self.oldest_clean(first).or_else(|| self.oldest_clean(second))
    }

    /// Evict `v` into the ghost list matching its list.
    fn demote(&mut self, v: u32) -> u64 {
        let block = self.block_of(v);
        self.dirty.set_clean(v);
        let ghost = if self.arena.nodes[v as usize].at == Where::T1 { Where::B1 } else { Where::B2 };
        self.unlink(v);
        self.place(v, ghost);
        block
    }

    fn add(&mut self, block: u64, at: Where) -> u32 {
        let i = self.arena.alloc(Node { block, link: Link::NONE, at });
        self.place(i, at);
        self.map.insert(block, i, &self.arena.nodes);
        i
    }

    fn miss_on_ghost(&mut self, g: u32, in_b1: bool) -> Outcome {
        let (b1, b2) = (self.b1.len().max(1), self.b2.len().max(1));
        let p = if in_b1 { (self.p + (b2 / b1).max(1)).min(self.c) } else { self.p.saturating_sub((b1 / b2).max(1)) };
        let evict = if self.cached() >= self.c {
            match self.replace_victim(p, !in_b1) {
                Some(v) => Some(self.demote(v)),
                None => return Outcome::Miss,
            }
        } else {
            None
        };
        self.p = p;
        self.unlink(g);
        self.place(g, Where::T2);
        Outcome::Promote { evict }
    }

    fn miss_new(&mut self, block: u64) -> Outcome {
        let l1 = self.t1.len() + self.b1.len();
        let total = l1 + self.t2.len() + self.b2.len();
        let full = self.cached() >= self.c;
        let mut evict = None;
        if l1 >= self.c {
            if self.t1.len() < self.c {
                let v = if full {
                    match self.replace_victim(self.p, false) {
                        Some(v) => Some(v),
                        None => return Outcome::Miss,
                    }
                } else {
                    None
                };
                let lru_b1 = self.b1.front().expect("B1 holds the rest of L1");
                self.forget(lru_b1);
                evict = v.map(|v| self.demote(v));
            } else {
                // T1 alone fills the cache: its LRU leaves without a ghost.
                let Some(v) = self.oldest_clean(&self.t1).or_else(|| self.oldest_clean(&self.t2)) else {
                    return Outcome::Miss;
                };
                let b = self.block_of(v);
                self.dirty.set_clean(v);
                self.forget(v);
                evict = Some(b);
            }
        } else if total >= self.c {
            let v = if full {
                match self.replace_victim(self.p, false) {
                    Some(v) => Some(v),
                    None => return Outcome::Miss,
                }
            } else {
                None
            };
            if total >= 2 * self.c {
                let lru_b2 = self.b2.front().expect("B2 holds the rest of the directory");
                self.forget(lru_b2);
            }
            evict = v.map(|v| self.demote(v));
        }
        self.add(block, Where::T1);
        Outcome::Promote { evict }
    }
}

impl Policy for Arc {
    fn name(&self) -> &'static str {
        "arc"
    }

    fn capacity(&self) -> usize {
        self.c
    }

    fn len(&self) -> usize {
        self.cached()
    }

    dirty_methods!();

    fn access(&mut self, a: Access) -> Outcome {
        match self.map.get(a.block, &self.arena.nodes).map(|i| (i, self.arena.nodes[i as usize].at)) {
            Some((i, Where::T1 | Where::T2)) => {
                self.unlink(i);
                self.place(i, Where::T2);
                Outcome::Hit
            }
            Some((g, Where::B1)) => self.miss_on_ghost(g, true),
            Some((g, Where::B2)) => self.miss_on_ghost(g, false),
            None => self.miss_new(a.block),
        }
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
        if self.cached() >= self.c {
            return Err(InsertError::Full(self.c));
        }
        if let Some(g) = self.map.get(block, &self.arena.nodes) {
            self.forget(g);
        }
        if self.t1.len() + self.b1.len() >= self.c {
            if let Some(g) = self.b1.front() {
                self.forget(g);
            }
        }
        let i = self.add(block, Where::T1);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }

    fn save_hints(&self) -> Vec<u8> {
        let nodes = &self.arena.nodes;
        let order: Vec<(u64, u8)> = self
            .t1
            .iter(nodes)
            .map(|i| (nodes[i as usize].block, 0))
            .chain(self.t2.iter(nodes).map(|i| (nodes[i as usize].block, 1)))
            .collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        let skip = entries.len().saturating_sub(self.c);
        for (block, tag) in entries.into_iter().skip(skip) {
            if !self.map.contains_key(block, &self.arena.nodes) {
                self.add(block, if tag == 1 { Where::T2 } else { Where::T1 });
            }
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let n = 2 * self.c + 1;
        let bytes = self.arena.bytes(n) + map_bytes(&self.map) + self.dirty.bytes();
        bytes as f64 / self.c as f64
    }
}
