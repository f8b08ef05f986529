//! The 16-byte arena entry of the FIFO-based policies (`strata`, `s3fifo`): a block number
//! sharing its word with the queue the entry is on and a 2-bit frequency, and one list link.
//! A cache's block numbers are byte offsets over a block size of at least 512 bytes, far
//! below 2^60, so 60 bits hold them.

use crate::list::Link;

/// A queue an entry can be on: two bits.
pub(crate) trait Queue: Copy {
    fn bits(self) -> u8;
    fn from_bits(bits: u8) -> Self;
}

/// An arena entry: bits 0–59 the block number, 60–61 the queue, 62–63 the frequency.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry<Q> {
    word: u64,
    link: Link,
    queue: std::marker::PhantomData<Q>,
}

const BLOCK_BITS: u32 = 60;
const BLOCK_MASK: u64 = (1 << BLOCK_BITS) - 1;
/// The largest block number an entry holds (an origin of 2^60 blocks is past 2^64 bytes).
pub(crate) const MAX_BLOCK: u64 = BLOCK_MASK;
/// The largest frequency an entry holds.
pub(crate) const MAX_FREQ: u8 = 3;

impl<Q: Queue> Entry<Q> {
    pub fn new(block: u64, at: Q) -> Self {
        assert!(block <= BLOCK_MASK, "block number {block} is past the policy's 2^60");
        Entry { word: block | (at.bits() as u64) << BLOCK_BITS, link: Link::NONE, queue: std::marker::PhantomData }
    }

    #[inline]
    pub fn block(&self) -> u64 {
        self.word & BLOCK_MASK
    }

    #[inline]
    pub fn at(&self) -> Q {
        Q::from_bits((self.word >> BLOCK_BITS) as u8 & 3)
    }

    #[inline]
    pub fn set_at(&mut self, at: Q) {
        self.word = (self.word & !(3 << BLOCK_BITS)) | (at.bits() as u64) << BLOCK_BITS;
    }

    #[inline]
    pub fn freq(&self) -> u8 {
        (self.word >> (BLOCK_BITS + 2)) as u8
    }

    #[inline]
    pub fn set_freq(&mut self, freq: u8) {
        debug_assert!(freq <= MAX_FREQ);
        self.word = (self.word & !(3 << (BLOCK_BITS + 2))) | (freq as u64) << (BLOCK_BITS + 2);
    }
}

impl<Q: Queue> crate::hash::Keyed for Entry<Q> {
    #[inline]
    fn key(&self) -> u64 {
        self.block()
    }
}

crate::list::linked_by_field!(generic [Q] Entry<Q>);

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Q(u8);

    impl Queue for Q {
        fn bits(self) -> u8 {
            self.0
        }
        fn from_bits(bits: u8) -> Self {
            Q(bits)
        }
    }

    #[test]
    fn an_entry_keeps_its_fields_apart_in_16_bytes() {
        assert_eq!(std::mem::size_of::<Entry<Q>>(), 16);
        let mut n = Entry::new(BLOCK_MASK, Q(3));
        for at in 0..4 {
            for freq in 0..=MAX_FREQ {
                n.set_at(Q(at));
                n.set_freq(freq);
                assert_eq!((n.block(), n.at(), n.freq()), (BLOCK_MASK, Q(at), freq));
            }
        }
        assert_eq!(Entry::new(7, Q(1)).block(), 7);
        assert_eq!(Entry::new(7, Q(2)).at(), Q(2));
    }
}
