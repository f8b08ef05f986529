//! Dirty-block bookkeeping shared by the policies that have no dirty ordering of their own.
//!
//! Entry `i` of a policy's arena is dirty here at index `i`. Dirty blocks wait on a FIFO in
//! the order they first became dirty: under recency-driven policies the block dirtied longest
//! ago is the one nearest eviction, so writing it back first frees a victim soonest.
//! A block handed to the engine for write-back leaves the FIFO but stays dirty, so it is
//! neither evicted nor handed out twice.

use crate::list::{Link, List};

const CLEAN: u8 = 0;
const QUEUED: u8 = 1;
const WRITING: u8 = 2;

#[derive(Debug)]
pub(crate) struct Dirty {
    links: Vec<Link>,
    state: Vec<u8>,
    queue: List<0>,
    count: usize,
}

impl Dirty {
    pub fn new(entries: usize) -> Self {
        Dirty { links: vec![Link::NONE; entries], state: vec![CLEAN; entries], queue: List::new(), count: 0 }
    }

    #[inline]
    pub fn is_dirty(&self, i: u32) -> bool {
        self.state[i as usize] != CLEAN
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn set_dirty(&mut self, i: u32) {
        match self.state[i as usize] {
            CLEAN => {
                self.count += 1;
                self.state[i as usize] = QUEUED;
                self.queue.push_back(&mut self.links, i);
            }
            WRITING => {
                self.state[i as usize] = QUEUED;
                self.queue.push_back(&mut self.links, i);
            }
            _ => {}
        }
    }

    /// Mark clean, also used when the entry leaves the cache.
    pub fn set_clean(&mut self, i: u32) {
        match self.state[i as usize] {
            QUEUED => {
                self.queue.remove(&mut self.links, i);
                self.count -= 1;
            }
            WRITING => self.count -= 1,
            _ => {}
        }
        self.state[i as usize] = CLEAN;
    }

    /// Hand out the longest-dirty block for write-back.
    pub fn take(&mut self) -> Option<u32> {
        let i = self.queue.pop_front(&mut self.links)?;
        self.state[i as usize] = WRITING;
        Some(i)
    }

    pub fn bytes(&self) -> usize {
        self.links.capacity() * std::mem::size_of::<Link>() + self.state.capacity()
    }
}
