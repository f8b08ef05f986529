//! One module per policy. Each keeps its entries in a flat arena threaded onto index-linked
//! lists (see `list.rs`) and finds them through a `BlockMap` (see `hash.rs`), which keeps only
//! entry indices and reads the block numbers in the arena.

pub mod adaptive;
pub mod arc;
pub mod clock;
pub mod lirs;
pub mod lru;
pub mod opt;
pub mod optgen;
pub mod s3fifo;
pub mod sieve;
pub mod smq;
pub mod strata;
pub mod tinylfu;
pub mod twoq;

/// The [`Policy`](crate::Policy) methods that only look up a resident entry and defer to the
/// shared [`Dirty`](crate::dirty::Dirty) tracker. The policy type must provide
/// `fn resident(&self, block: u64) -> Option<u32>`, `fn block_of(&self, i: u32) -> u64`, a
/// `dirty: Dirty` field and a `map: BlockMap` field (for [`prefetch`](crate::Policy::prefetch)).
/// `dirty_methods!(without_prefetch)` leaves `prefetch` to the policy.
macro_rules! dirty_methods {
    () => {
        #[inline]
        fn prefetch(&self, block: u64) {
            self.map.prefetch(block)
        }

        $crate::policies::dirty_methods!(without_prefetch);
    };
    (without_prefetch) => {
        fn contains(&self, block: u64) -> bool {
            self.resident(block).is_some()
        }

        fn set_dirty(&mut self, block: u64) -> bool {
            match self.resident(block) {
                Some(i) => {
                    self.dirty.set_dirty(i);
                    true
                }
                None => false,
            }
        }

        fn set_clean(&mut self, block: u64) -> bool {
            match self.resident(block) {
                Some(i) => {
                    self.dirty.set_clean(i);
                    true
                }
                None => false,
            }
        }

        fn is_dirty(&self, block: u64) -> bool {
            self.resident(block).is_some_and(|i| self.dirty.is_dirty(i))
        }

        fn dirty_len(&self) -> usize {
            self.dirty.count()
        }

        fn writeback_candidate(&mut self, _now_ns: u64) -> Option<u64> {
            self.dirty.take().map(|i| self.block_of(i))
        }
    };
}
pub(crate) use dirty_methods;

/// Lets a [`BlockMap`](crate::hash::BlockMap) read an arena entry's block number from its
/// `block` field.
macro_rules! keyed_by_block {
    ($node:ty) => {
        impl $crate::hash::Keyed for $node {
            #[inline]
            fn key(&self) -> u64 {
                self.block
            }
        }
    };
}
pub(crate) use keyed_by_block;

/// A free-list arena: indices stay stable while an entry lives, and freed slots are reused,
/// so the arena never grows past the most entries ever live at once.
#[derive(Debug)]
pub(crate) struct Arena<N> {
    pub nodes: Vec<N>,
    free: Vec<u32>,
}

/// A copy keeps the room reserved for its entries: a copy of a filling arena that then
/// fills would otherwise grow by doubling, past the room the original reserved.
impl<N: Clone> Clone for Arena<N> {
    fn clone(&self) -> Self {
        let mut nodes = Vec::with_capacity(self.nodes.capacity());
        nodes.extend_from_slice(&self.nodes);
        Arena { nodes, free: self.free.clone() }
    }
}

impl<N> Arena<N> {
    pub fn with_capacity(n: usize) -> Self {
        Arena { nodes: Vec::with_capacity(n), free: Vec::new() }
    }

    #[inline]
    pub fn alloc(&mut self, node: N) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    #[inline]
    pub fn free(&mut self, i: u32) {
        self.free.push(i);
    }

    /// Bytes allocated, assuming the arena reaches `max_entries` live entries.
    pub fn bytes(&self, max_entries: usize) -> usize {
        max_entries.max(self.nodes.capacity()) * std::mem::size_of::<N>() + self.free.capacity() * 4
    }
}
