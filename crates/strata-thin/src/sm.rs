//! A space map held in memory: one reference count per block, with the bookkeeping a
//! copy-on-write commit needs (which bitmaps changed, and which blocks were freed since the
//! last durable commit and so must not be reused yet). `meta` writes it out in dm-thin's
//! format at each commit: 2-bit counts in bitmap blocks, 3 and more in an overflow tree.

use crate::format::{put64, ENTRIES_PER_BITMAP};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeSet;

/// Counts up to 254 live in a byte; 255 means "see `big`".
const BIG: u8 = u8::MAX;

pub struct SpaceMap {
    nr_blocks: u64,
    small: Vec<u8>,
    big: FxHashMap<u64, u32>,
    /// Blocks counted 3 or more: the overflow tree's keys.
    over: BTreeSet<u64>,
    allocated: u64,
    /// Blocks whose count fell to zero since the last commit was prepared.
    pending_free: FxHashSet<u64>,
    /// Blocks freed by the commit being written; reusable once it is durable.
    committing_free: FxHashSet<u64>,
    /// Bitmaps whose counts changed since the last commit.
    pub dirty: BTreeSet<usize>,
    /// Where each bitmap lies on the metadata device (0: not written yet).
    pub bitmaps: Vec<u64>,
    /// Each bitmap's index figures as last written: (free entries, first free entry).
    pub summary: Vec<(u32, u32)>,
    cursor: u64,
}

impl SpaceMap {
    /// A space map of `nr_blocks` free blocks, every bitmap to be written.
    pub fn new(nr_blocks: u64) -> SpaceMap {
        let n = nr_bitmaps(nr_blocks);
        SpaceMap {
            nr_blocks,
            small: vec![0; nr_blocks as usize],
            big: FxHashMap::default(),
            over: BTreeSet::new(),
            allocated: 0,
            pending_free: FxHashSet::default(),
            committing_free: FxHashSet::default(),
            dirty: (0..n).collect(),
            bitmaps: vec![0; n],
            summary: vec![(0, 0); n],
            cursor: 0,
        }
    }

    pub fn nr_blocks(&self) -> u64 {
        self.nr_blocks
    }

    /// Grows the map to `nr_blocks` free-counted blocks (never shrinks): the last bitmap and
    /// every new one are written at the next commit.
    pub fn grow(&mut self, nr_blocks: u64) {
        if nr_blocks <= self.nr_blocks {
            return;
        }
        let (old, n) = (nr_bitmaps(self.nr_blocks), nr_bitmaps(nr_blocks));
        self.small.resize(nr_blocks as usize, 0);
        self.bitmaps.resize(n, 0);
        self.summary.resize(n, (0, 0));
        self.dirty.extend(old.saturating_sub(1)..n);
        self.nr_blocks = nr_blocks;
    }

    /// Blocks with a non-zero count.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Blocks free now (some of them not reusable before the next commit is durable).
    pub fn free(&self) -> u64 {
        self.nr_blocks - self.allocated
    }

    pub fn count(&self, b: u64) -> u32 {
        match self.small[b as usize] {
            BIG => self.big[&b],
            c => c as u32,
        }
    }

    /// Sets a count as read from disk (no bookkeeping of changes).
    pub fn load(&mut self, b: u64, c: u32) {
        self.store(b, c);
    }

    fn store(&mut self, b: u64, c: u32) {
        let old = self.count(b);
        if old == 0 && c > 0 {
            self.allocated += 1;
        } else if old > 0 && c == 0 {
            self.allocated -= 1;
        }
        if c >= 3 && old < 3 {
            self.over.insert(b);
        } else if c < 3 && old >= 3 {
            self.over.remove(&b);
        }
        if c >= BIG as u32 {
            self.small[b as usize] = BIG;
            self.big.insert(b, c);
        } else {
            if self.small[b as usize] == BIG {
                self.big.remove(&b);
            }
            self.small[b as usize] = c as u8;
        }
    }

    fn set(&mut self, b: u64, c: u32) {
        self.store(b, c);
        self.dirty.insert((b / ENTRIES_PER_BITMAP) as usize);
    }

    pub fn inc(&mut self, b: u64) {
        let c = self.count(b);
        self.set(b, c + 1);
    }

    /// Drops one reference; returns the count left. A block reaching zero is not handed out
    /// again before the commit that frees it is durable.
    pub fn dec(&mut self, b: u64) -> Result<u32, String> {
        let c = self.count(b);
        if c == 0 {
            return Err(format!("block {b}: reference count already zero"));
        }
        self.set(b, c - 1);
        if c == 1 {
            self.pending_free.insert(b);
        }
        Ok(c - 1)
    }

    /// A block free now and in the last durable commit, with its count set to one.
    pub fn alloc(&mut self) -> Option<u64> {
        if self.allocated == self.nr_blocks {
            return None;
        }
        for pass in 0..2 {
            let (from, to) = if pass == 0 { (self.cursor, self.nr_blocks) } else { (0, self.cursor) };
            for b in from..to {
                if self.small[b as usize] == 0 && !self.pending_free.contains(&b) && !self.committing_free.contains(&b)
                {
                    self.set(b, 1);
                    self.cursor = b + 1;
                    return Some(b);
                }
            }
        }
        None
    }

    /// Blocks `alloc` can hand out now.
    pub fn allocatable(&self) -> u64 {
        self.free() - self.held()
    }

    /// Blocks freed but not reusable until the next commit is durable.
    pub fn held(&self) -> u64 {
        (self.pending_free.len() + self.committing_free.len()) as u64
    }

    /// The commit being prepared takes the blocks freed so far; they stay unusable until
    /// `durable`.
    pub fn begin_commit(&mut self) {
        let pending = std::mem::take(&mut self.pending_free);
        self.committing_free.extend(pending);
        self.dirty.clear();
    }

    /// The commit prepared last is on disk: what it freed may be reused.
    pub fn durable(&mut self) {
        self.committing_free.clear();
    }

    /// Blocks with counts of 3 and more, in order: the overflow tree's entries.
    pub fn overflow(&self) -> Vec<(u64, u32)> {
        self.over.iter().map(|&b| (b, self.count(b))).collect()
    }

    /// Bitmap `i`'s 2-bit entries (the block after its 16-byte header) and its index entry's
    /// figures: (free entries, first free entry).
    pub fn encode_bitmap(&self, i: usize, out: &mut [u8]) -> (u32, u32) {
        let first = i as u64 * ENTRIES_PER_BITMAP;
        let last = (first + ENTRIES_PER_BITMAP).min(self.nr_blocks);
        let (mut nr_free, mut first_free) = (0u32, None);
        let mut words = vec![0u64; out.len() / 8];
        for b in first..last {
            let e = (b - first) as usize;
            let c = self.small[b as usize].min(3) as u64;
            if c == 0 {
                nr_free += 1;
                first_free.get_or_insert(e as u32);
            }
            // Entry e: bit 2e holds the high bit of the count, bit 2e+1 the low bit.
            let bits = ((c >> 1) & 1) | ((c & 1) << 1);
            words[e / 32] |= bits << ((e % 32) * 2);
        }
        for (k, w) in words.iter().enumerate() {
            put64(out, k * 8, *w);
        }
        (nr_free, first_free.unwrap_or((last - first) as u32))
    }

    /// Loads bitmap `i`'s counts from its entries into a map just made (counts of 3 are
    /// fixed up from the overflow tree afterwards, then `loaded`).
    pub fn decode_bitmap(&mut self, i: usize, entries: &[u8]) {
        let first = i as u64 * ENTRIES_PER_BITMAP;
        let last = (first + ENTRIES_PER_BITMAP).min(self.nr_blocks);
        let small = &mut self.small[first as usize..last as usize];
        for (counts, word) in small.chunks_mut(32).zip(entries.chunks_exact(8)) {
            let w = u64::from_le_bytes(word.try_into().unwrap());
            if w == 0 {
                continue;
            }
            for (e, count) in counts.iter_mut().enumerate() {
                // Entry e: bit 2e holds the high bit of the count, bit 2e+1 the low bit.
                let bits = (w >> (e * 2)) & 3;
                let c = ((bits & 1) << 1) | (bits >> 1);
                debug_assert_eq!(*count, 0, "a bitmap loaded into a map just made");
                *count = c as u8;
                self.allocated += (c != 0) as u64;
            }
        }
    }

    /// Every count is loaded: the blocks counted 3 and more are indexed (at once, in order).
    pub fn loaded(&mut self) {
        self.over = (0..self.nr_blocks).filter(|&b| self.small[b as usize] >= 3).collect();
    }
}

/// How many bitmaps cover `nr_blocks`.
pub fn nr_bitmaps(nr_blocks: u64) -> usize {
    nr_blocks.div_ceil(ENTRIES_PER_BITMAP).max(1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{BITMAP_HEADER, BLOCK};

    #[test]
    fn counts_survive_the_bitmap_encoding() {
        let mut sm = SpaceMap::new(20000);
        for (b, c) in [(0u64, 1u32), (1, 2), (2, 3), (16319, 1), (16320, 2), (19999, 1)] {
            for _ in 0..c {
                sm.inc(b);
            }
        }
        let mut back = SpaceMap::new(20000);
        for i in 0..2 {
            let mut out = vec![0u8; BLOCK - BITMAP_HEADER];
            let (free, first) = sm.encode_bitmap(i, &mut out);
            if i == 0 {
                assert_eq!((free, first), (16320 - 4, 3));
            }
            back.decode_bitmap(i, &out);
        }
        back.loaded();
        for b in [0, 1, 2, 3, 16319, 16320, 19999] {
            assert_eq!(back.count(b), sm.count(b).min(3), "block {b}");
        }
        assert_eq!(sm.overflow(), vec![(2, 3)]);
        assert_eq!(back.overflow(), vec![(2, 3)]);
        assert_eq!(back.allocated(), 6);
    }

    #[test]
    fn a_grown_map_keeps_its_counts_and_marks_the_new_bitmaps() {
        let mut sm = SpaceMap::new(20000);
        sm.inc(19999);
        sm.begin_commit();
        sm.grow(40000);
        assert_eq!((sm.nr_blocks(), sm.allocated(), sm.count(19999)), (40000, 1, 1));
        assert_eq!(sm.bitmaps.len(), 3);
        assert_eq!(sm.dirty.iter().copied().collect::<Vec<_>>(), [1, 2]);
        sm.grow(100);
        assert_eq!(sm.nr_blocks(), 40000, "never shrinks");
    }

    #[test]
    fn freed_blocks_wait_for_a_durable_commit() {
        let mut sm = SpaceMap::new(3);
        let a = sm.alloc().unwrap();
        let b = sm.alloc().unwrap();
        sm.dec(a).unwrap();
        assert_eq!(sm.alloc(), Some(2));
        assert_eq!(sm.alloc(), None, "a freed block is not reused in its transaction");
        sm.begin_commit();
        assert_eq!(sm.alloc(), None, "nor while the commit that frees it is written");
        sm.durable();
        assert_eq!(sm.alloc(), Some(a));
        assert!(sm.dec(b).is_ok() && sm.dec(b).is_err());
    }
}
