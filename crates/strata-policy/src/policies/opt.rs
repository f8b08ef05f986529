//! Belady's offline optimum, in the version that may bypass: on a miss it keeps whichever
//! blocks (the cached ones or the newcomer) are next used soonest, so the newcomer is not
//! admitted when it is needed later than every cached block. That is the true upper bound
//! for any policy that may decline to promote (smq and strata do), which plain demand-paging
//! MIN is not.
//!
//! OPT needs the future, so it is built from the whole sequence of block accesses and must
//! then be fed exactly that sequence, in order. It exists for the simulator; the engine never
//! uses it.

use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::hash::{std_map_bytes, BlockHasher, StdBlockMap};
use crate::{hints, Access, HintError, InsertError, Outcome, Policy};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

/// Position used for "never accessed again".
const NEVER: u32 = u32::MAX;

#[derive(Debug)]
pub struct Opt {
    capacity: usize,
    next_use: Arc<[u32]>,
    pos: usize,
    /// Cached block → position of its next access.
    resident: StdBlockMap<u32>,
    /// Max-heap on next use; stale entries (not matching `resident`) are skipped lazily.
    heap: BinaryHeap<(u32, u64)>,
    dirty: HashSet<u64, BuildHasherDefault<BlockHasher>>,
    handed_out: HashSet<u64, BuildHasherDefault<BlockHasher>>,
}

impl Opt {
    /// Prepare OPT for `capacity` blocks over the access sequence `blocks`.
    pub fn new(capacity: usize, blocks: &[u64]) -> Self {
        Self::with_next_use(capacity, next_use(blocks).into())
    }

    /// Build from a next-use table computed once with [`next_use`] and shared between sizes.
    pub fn with_next_use(capacity: usize, next_use: Arc<[u32]>) -> Self {
        Opt {
            capacity,
            next_use,
            pos: 0,
            resident: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            heap: BinaryHeap::with_capacity(2 * capacity + 1024),
            dirty: HashSet::default(),
            handed_out: HashSet::default(),
        }
    }

    fn compact(&mut self) {
        self.heap = self.resident.iter().map(|(&b, &n)| (n, b)).collect();
    }

    /// The cached clean block used farthest in the future.
    fn farthest(&mut self) -> Option<(u32, u64)> {
        let mut skipped = Vec::new();
        let found = loop {
            let Some(&(n, b)) = self.heap.peek() else {
                break None;
            };
            if self.resident.get(&b) != Some(&n) {
                self.heap.pop();
                continue;
            }
            if self.dirty.contains(&b) {
                skipped.push(self.heap.pop().expect("peeked"));
                continue;
            }
            break Some((n, b));
        };
        self.heap.extend(skipped);
        found
    }
}

/// For each position in `blocks`, the position of the next access to the same block
/// (`u32::MAX` if none). Panics past 2^32 - 1 accesses.
pub fn next_use(blocks: &[u64]) -> Vec<u32> {
    assert!(blocks.len() < NEVER as usize, "OPT supports fewer than 2^32 - 1 accesses");
    let mut next = vec![NEVER; blocks.len()];
    let mut seen: HashMap<u64, u32, BuildHasherDefault<BlockHasher>> = HashMap::default();
    for (i, &b) in blocks.iter().enumerate().rev() {
        if let Some(j) = seen.insert(b, i as u32) {
            next[i] = j;
        }
    }
    next
}

impl Policy for Opt {
    fn name(&self) -> &'static str {
        "opt"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.resident.len()
    }

    fn contains(&self, block: u64) -> bool {
        self.resident.contains_key(&block)
    }

    fn access(&mut self, a: Access) -> Outcome {
        let nu = *self.next_use.get(self.pos).expect("OPT fed more accesses than it was built for");
        self.pos += 1;
        if self.heap.len() > 2 * self.capacity + 1024 {
            self.compact();
        }
        if let Some(n) = self.resident.get_mut(&a.block) {
            *n = nu;
            self.heap.push((nu, a.block));
            return Outcome::Hit;
        }
        let evict = if self.resident.len() < self.capacity {
            None
        } else {
            match self.farthest() {
                Some((far, victim)) if nu < far => {
                    self.resident.remove(&victim);
                    Some(victim)
                }
                _ => return Outcome::Miss,
            }
        };
        self.resident.insert(a.block, nu);
        self.heap.push((nu, a.block));
        Outcome::Promote { evict }
    }

    fn remove(&mut self, block: u64) -> bool {
        self.dirty.remove(&block);
        self.handed_out.remove(&block);
        self.resident.remove(&block).is_some()
    }

    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        if self.resident.contains_key(&block) {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.resident.len() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        // The block's future is unknown to the table until its first access: treat it as
        // never used, which is exact for the simulator's junk prefill.
        self.resident.insert(block, NEVER);
        self.heap.push((NEVER, block));
        if dirty {
            self.dirty.insert(block);
        }
        Ok(())
    }

    fn set_dirty(&mut self, block: u64) -> bool {
        if !self.resident.contains_key(&block) {
            return false;
        }
        self.handed_out.remove(&block);
        self.dirty.insert(block);
        true
    }

    fn set_clean(&mut self, block: u64) -> bool {
        if !self.resident.contains_key(&block) {
            return false;
        }
        self.handed_out.remove(&block);
        self.dirty.remove(&block);
        true
    }

    fn is_dirty(&self, block: u64) -> bool {
        self.dirty.contains(&block)
    }

    fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    fn writeback_candidate(&mut self, _now_ns: u64) -> Option<u64> {
        // The dirty block needed last is the one whose write-back blocks nothing soon.
        let b = self
            .dirty
            .iter()
            .filter(|b| !self.handed_out.contains(*b))
            .max_by_key(|b| (self.resident.get(*b).copied(), **b))
            .copied()?;
        self.handed_out.insert(b);
        Some(b)
    }

    fn save_hints(&self) -> Vec<u8> {
        let mut blocks: Vec<u64> = self.resident.keys().copied().collect();
        blocks.sort_unstable();
        hints::encode(self.name(), blocks.into_iter().map(|b| (b, 0)))
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let saved = hints::decode(self.name(), bytes)?;
        if !self.resident.is_empty() {
            return Err(HintError::NotEmpty);
        }
        for (block, _) in saved {
            if self.insert(block, false).is_err() {
                break;
            }
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let bytes = std_map_bytes(&self.resident) + self.heap.capacity() * 16;
        bytes as f64 / self.capacity as f64
    }
}
