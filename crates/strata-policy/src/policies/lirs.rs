//! LIRS (Jiang & Zhang, SIGMETRICS'02). Blocks are ranked by inter-reference recency (IRR):
//! the number of distinct blocks touched between their last two references. Blocks with
//! low IRR (LIR) own 99% of the cache; the other 1% holds resident HIR blocks, evicted FIFO
//! from queue `Q`. Stack `S` records recency for LIR blocks, resident HIR blocks and recently
//! evicted (non-resident) HIR blocks; a HIR block re-referenced while still in `S` has a
//! lower IRR than the oldest LIR block, so the two swap roles. This is what lets LIRS keep a
//! stable working set through loops and scans larger than the cache.
//!
//! Non-resident entries in `S` are bounded (to the capacity) by dropping the oldest ones,
//! as practical implementations do; otherwise `S` grows without limit on scans.

use super::Arena;
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, BlockMap};
use crate::list::{Link, Linked, List};
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};

const LIR: u8 = 0;
const HIR: u8 = 1;
const NONRES: u8 = 2;

#[derive(Clone, Copy, Debug)]
struct Node {
    block: u64,
    /// Link in stack S.
    s: Link,
    /// Link in queue Q (resident HIR) or, for non-resident entries, in the ghost FIFO.
    q: Link,
    state: u8,
    in_s: bool,
}

super::keyed_by_block!(Node);

impl Linked<0> for Node {
    fn link(&self) -> &Link {
        &self.s
    }
    fn link_mut(&mut self) -> &mut Link {
        &mut self.s
    }
}

impl Linked<1> for Node {
    fn link(&self) -> &Link {
        &self.q
    }
    fn link_mut(&mut self) -> &mut Link {
        &mut self.q
    }
}

#[derive(Debug)]
pub struct Lirs {
    capacity: usize,
    lir_cap: usize,
    nonres_cap: usize,
    lir_count: usize,
    arena: Arena<Node>,
    map: BlockMap,
    /// front = bottom (oldest), back = top (most recent).
    stack: List<0>,
    /// Resident HIR blocks; front is evicted first.
    queue: List<1>,
    /// Non-resident HIR entries, oldest first, to bound the stack.
    ghosts: List<1>,
    dirty: Dirty,
}

impl Lirs {
    pub fn new(capacity: usize) -> Self {
        let hir_cap = (capacity / 100).max(1);
        let lir_cap = if capacity >= 2 { capacity - hir_cap } else { 0 };
        let n = 2 * capacity + 1;
        Lirs {
            capacity,
            lir_cap,
            nonres_cap: capacity,
            lir_count: 0,
            arena: Arena::with_capacity(n),
            map: block_map(n),
            stack: List::new(),
            queue: List::new(),
            ghosts: List::new(),
            dirty: Dirty::new(n),
        }
    }

    fn resident(&self, block: u64) -> Option<u32> {
        let i = self.map.get(block, &self.arena.nodes)?;
        (self.arena.nodes[i as usize].state != NONRES).then_some(i)
    }

    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block
    }

    fn cached(&self) -> usize {
        self.lir_count + self.queue.len()
    }

    fn node(&mut self, i: u32) -> &mut Node {
        &mut self.arena.nodes[i as usize]
    }

    fn stack_top(&mut self, i: u32) {
        if self.arena.nodes[i as usize].in_s {
            self.stack.move_to_back(&mut self.arena.nodes, i);
        } else {
            self.stack.push_back(&mut self.arena.nodes, i);
            self.node(i).in_s = true;
        }
    }

    fn stack_out(&mut self, i: u32) {
        if self.arena.nodes[i as usize].in_s {
            self.stack.remove(&mut self.arena.nodes, i);
            self.node(i).in_s = false;
        }
    }

    fn forget(&mut self, i: u32) {
        self.stack_out(i);
        match self.arena.nodes[i as usize].state {
            HIR => self.queue.remove(&mut self.arena.nodes, i),
            NONRES => self.ghosts.remove(&mut self.arena.nodes, i),
            _ => self.lir_count -= 1,
        }
        let block = self.block_of(i);
        self.map.remove(block, &self.arena.nodes);
        self.arena.free(i);
    }

    /// Pop HIR entries off the bottom of S until a LIR block is at the bottom.
    fn prune(&mut self) {
        while let Some(b) = self.stack.front() {
            match self.arena.nodes[b as usize].state {
                LIR => break,
                HIR => self.stack_out(b),
                _ => self.forget(b),
            }
        }
    }

    /// The bottom LIR block becomes a resident HIR block at the end of Q.
    fn demote_bottom_lir(&mut self) {
        self.prune();
        if let Some(b) = self.stack.front() {
            self.stack_out(b);
            self.node(b).state = HIR;
            self.lir_count -= 1;
            self.queue.push_back(&mut self.arena.nodes, b);
            self.prune();
        }
    }

    fn make_lir(&mut self, i: u32) {
        match self.arena.nodes[i as usize].state {
            HIR => self.queue.remove(&mut self.arena.nodes, i),
            NONRES => self.ghosts.remove(&mut self.arena.nodes, i),
            _ => return,
        }
        self.node(i).state = LIR;
        self.lir_count += 1;
        self.stack_top(i);
        if self.lir_count > self.lir_cap {
            self.demote_bottom_lir();
        }
    }

    /// Evict the first clean resident HIR block; if all are dirty, the lowest clean LIR block.
    fn evict(&mut self) -> Option<u64> {
        let nodes = &self.arena.nodes;
        let mut victim = None;
        let mut cur = self.queue.front();
        while let Some(i) = cur {
            if !self.dirty.is_dirty(i) {
                victim = Some(i);
                break;
            }
            cur = List::<1>::next(nodes, i);
        }
        if victim.is_none() {
            let mut cur = self.stack.front();
            while let Some(i) = cur {
                if nodes[i as usize].state == LIR && !self.dirty.is_dirty(i) {
                    victim = Some(i);
                    break;
                }
                cur = List::<0>::next(nodes, i);
            }
        }
        let v = victim?;
        let block = self.block_of(v);
        self.dirty.set_clean(v);
        if self.arena.nodes[v as usize].state == HIR && self.arena.nodes[v as usize].in_s {
            self.queue.remove(&mut self.arena.nodes, v);
            self.node(v).state = NONRES;
            self.ghosts.push_back(&mut self.arena.nodes, v);
            if self.ghosts.len() > self.nonres_cap {
                let g = self.ghosts.front().expect("ghosts is not empty");
                self.forget(g);
            }
        } else {
            self.forget(v);
            self.prune();
        }
        Some(block)
    }

    fn add(&mut self, block: u64) -> u32 {
        let i = self.arena.alloc(Node { block, s: Link::NONE, q: Link::NONE, state: HIR, in_s: false });
        self.map.insert(block, i, &self.arena.nodes);
        self.stack_top(i);
        if self.lir_count < self.lir_cap {
            self.node(i).state = LIR;
            self.lir_count += 1;
        } else {
            self.queue.push_back(&mut self.arena.nodes, i);
        }
        i
    }
}

impl Policy for Lirs {
    fn name(&self) -> &'static str {
        "lirs"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.cached()
    }

    super::dirty_methods!();

    fn access(&mut self, a: Access) -> Outcome {
        let found = self.map.get(a.block, &self.arena.nodes);
        if let Some(i) = found {
            match self.arena.nodes[i as usize].state {
                LIR => {
                    let was_bottom = self.stack.front() == Some(i);
                    self.stack_top(i);
                    if was_bottom {
                        self.prune();
                    }
                    return Outcome::Hit;
                }
                HIR => {
                    if self.arena.nodes[i as usize].in_s {
                        self.make_lir(i);
                    } else {
                        self.stack_top(i);
                        self.queue.move_to_back(&mut self.arena.nodes, i);
                    }
                    return Outcome::Hit;
                }
                _ => {}
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
        // Eviction may have dropped the ghost of this very block from the stack.
        match self.map.get(a.block, &self.arena.nodes) {
            Some(g) => self.make_lir(g),
            None => {
                self.add(a.block);
            }
        }
        Outcome::Promote { evict }
    }

    fn remove(&mut self, block: u64) -> bool {
        match self.resident(block) {
            Some(i) => {
                self.dirty.set_clean(i);
                self.forget(i);
                self.prune();
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
            self.prune();
        }
        let i = self.add(block);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }

    fn save_hints(&self) -> Vec<u8> {
        // Stack order (bottom to top) for blocks in S, then resident HIR blocks not in S.
        let nodes = &self.arena.nodes;
        let order: Vec<(u64, u8)> = self
            .stack
            .iter(nodes)
            .filter(|&i| nodes[i as usize].state != NONRES)
            .map(|i| (nodes[i as usize].block, nodes[i as usize].state))
            .chain(self.queue.iter(nodes).filter(|&i| !nodes[i as usize].in_s).map(|i| (nodes[i as usize].block, 2)))
            .collect();
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
            if self.map.contains_key(block, &self.arena.nodes) {
                continue;
            }
            let i = self.arena.alloc(Node { block, s: Link::NONE, q: Link::NONE, state: HIR, in_s: false });
            self.map.insert(block, i, &self.arena.nodes);
            if tag == LIR && self.lir_count < self.lir_cap {
                self.node(i).state = LIR;
                self.lir_count += 1;
                self.stack_top(i);
            } else {
                if tag != 2 {
                    self.stack_top(i);
                }
                self.queue.push_back(&mut self.arena.nodes, i);
            }
        }
        self.prune();
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let n = 2 * self.capacity + 1;
        let bytes = self.arena.bytes(n) + map_bytes(&self.map) + self.dirty.bytes();
        bytes as f64 / self.capacity as f64
    }
}
