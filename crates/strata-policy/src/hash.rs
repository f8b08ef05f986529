//! The hash map every policy uses to find an entry by block number.
//!
//! Block numbers are `u64`s that are often dense or strided (every 16th block), so the
//! hasher must spread low bits without costing more than a multiply: SipHash, the std
//! default, would be a third of the simulator's time. Not for untrusted keys.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply by the 64-bit golden ratio, then fold the high half down so both the bucket index
/// (low bits) and hashbrown's tag (top 7 bits) depend on every input bit.
#[derive(Default, Clone, Copy)]
pub(crate) struct BlockHasher(u64);

impl Hasher for BlockHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64)
    }
}

/// Block number → entry index.
pub(crate) type BlockMap<V = u32> = HashMap<u64, V, BuildHasherDefault<BlockHasher>>;

pub(crate) fn block_map<V>(capacity: usize) -> BlockMap<V> {
    HashMap::with_capacity_and_hasher(capacity, Default::default())
}

/// Bytes a map allocated for `capacity` items really takes: hashbrown rounds buckets up to a
/// power of two at 7/8 load and keeps one control byte per bucket.
pub(crate) fn map_bytes<V>(map: &BlockMap<V>) -> usize {
    let cap = map.capacity().max(1);
    let buckets = (cap * 8 / 7).next_power_of_two();
    buckets * (std::mem::size_of::<(u64, V)>() + 1)
}

/// A 64-bit mix (splitmix64's finaliser), for seeded pseudo-random choices and sketches.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
