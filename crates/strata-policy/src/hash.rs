//! The map every policy uses to find an entry by block number, and the hashes around it.
//!
//! Block numbers are `u64`s that are often dense or strided (every 16th block), and a policy
//! looks one up on every access, so the map is the hottest data structure in the simulator.
//! [`BlockMap`] is an open-addressing table with linear probing, specialised for `u64` keys and
//! `u32` entry indices: 12 bytes a slot, the key and value side by side so a lookup costs one
//! cache line (hashbrown keeps a separate control byte array, two lines per lookup), at most
//! half full so probes stay short, and deletion by backward shift so no tombstones build up.
//! Slots are found by Fibonacci hashing (multiply by the golden ratio, keep the top bits),
//! which spreads dense and strided block numbers evenly. Not for untrusted keys.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply by the 64-bit golden ratio, then fold the high half down so both the bucket index
/// (low bits) and hashbrown's tag (top 7 bits) depend on every input bit. For the std maps
/// that need more than [`BlockMap`] offers (OPT's iteration).
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

/// A std `HashMap` keyed by block number with [`BlockHasher`].
pub(crate) type StdBlockMap<V> = HashMap<u64, V, BuildHasherDefault<BlockHasher>>;

/// Bytes a std map allocated for `capacity` items really takes: hashbrown rounds buckets up
/// to a power of two at 7/8 load and keeps one control byte per bucket.
pub(crate) fn std_map_bytes<V>(map: &StdBlockMap<V>) -> usize {
    let cap = map.capacity().max(1);
    let buckets = (cap * 8 / 7).next_power_of_two();
    buckets * (std::mem::size_of::<(u64, V)>() + 1)
}

/// The value that marks an empty slot; entry indices stay far below it.
const EMPTY: u32 = u32::MAX;
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const MIN_SLOTS: usize = 8;

/// One slot: the key's low and high halves and the value. Three `u32`s rather than a
/// `(u64, u32)` so a slot takes 12 bytes, not 16.
type Slot = [u32; 3];
const EMPTY_SLOT: Slot = [0, 0, EMPTY];

#[inline]
fn key_of(s: &Slot) -> u64 {
    s[0] as u64 | (s[1] as u64) << 32
}

/// Block number → entry index (any `u32` but `u32::MAX`).
#[derive(Clone)]
pub(crate) struct BlockMap {
    slots: Box<[Slot]>,
    mask: usize,
    /// 64 minus log2 of the slot count: the shift that keeps a hash's top bits.
    shift: u32,
    len: usize,
}

impl std::fmt::Debug for BlockMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockMap").field("len", &self.len).field("slots", &self.slots.len()).finish()
    }
}

/// A map sized for `capacity` entries without growing.
pub(crate) fn block_map(capacity: usize) -> BlockMap {
    BlockMap::with_capacity(capacity)
}

/// Bytes the map has allocated.
pub(crate) fn map_bytes(map: &BlockMap) -> usize {
    map.slots.len() * std::mem::size_of::<Slot>()
}

impl BlockMap {
    pub fn with_capacity(capacity: usize) -> Self {
        let n = capacity.saturating_mul(2).next_power_of_two().max(MIN_SLOTS);
        BlockMap { slots: vec![EMPTY_SLOT; n].into_boxed_slice(), mask: n - 1, shift: 64 - n.trailing_zeros(), len: 0 }
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(GOLDEN) >> self.shift) as usize
    }

    /// The slot holding `key`, or the empty slot where it would go.
    #[inline]
    fn probe(&self, key: u64) -> (usize, bool) {
        let mut i = self.home(key);
        loop {
            let s = &self.slots[i];
            if s[2] == EMPTY {
                return (i, false);
            }
            if key_of(s) == key {
                return (i, true);
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, key: &u64) -> Option<&u32> {
        match self.probe(*key) {
            (i, true) => Some(&self.slots[i][2]),
            _ => None,
        }
    }

    #[inline]
    pub fn contains_key(&self, key: &u64) -> bool {
        self.probe(*key).1
    }

    /// Insert or replace; returns the previous value.
    #[inline]
    pub fn insert(&mut self, key: u64, val: u32) -> Option<u32> {
        debug_assert_ne!(val, EMPTY);
        let (i, found) = self.probe(key);
        if found {
            return Some(std::mem::replace(&mut self.slots[i][2], val));
        }
        self.slots[i] = [key as u32, (key >> 32) as u32, val];
        self.len += 1;
        if self.len * 2 > self.slots.len() {
            self.grow();
        }
        None
    }

    #[inline]
    pub fn remove(&mut self, key: &u64) -> Option<u32> {
        let (mut hole, found) = self.probe(*key);
        if !found {
            return None;
        }
        let val = self.slots[hole][2];
        // Backward shift: pull later members of the cluster into the hole when the hole lies
        // between their home slot and where they sit, so every key stays reachable from its
        // home without tombstones.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let s = self.slots[j];
            if s[2] == EMPTY {
                break;
            }
            let home = self.home(key_of(&s));
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY_SLOT;
        self.len -= 1;
        Some(val)
    }

    /// Start loading the slot where `key` would be found, without waiting for it.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        prefetch(&self.slots[self.home(key)]);
    }

    /// Every value, in slot order.
    pub fn values(&self) -> impl Iterator<Item = &u32> {
        self.slots.iter().map(|s| &s[2]).filter(|&&v| v != EMPTY)
    }

    #[cold]
    fn grow(&mut self) {
        let old = std::mem::replace(self, BlockMap::with_capacity(self.slots.len()));
        for s in old.slots.iter().filter(|s| s[2] != EMPTY) {
            self.insert(key_of(s), s[2]);
        }
    }
}

/// Ask the CPU to start loading `*p` into its caches. A hint: it changes no result.
#[inline(always)]
pub(crate) fn prefetch<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint to the cache; it never faults and has no visible effect,
    // and `p` is a valid reference anyway.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p as *const T as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A 64-bit mix (splitmix64's finaliser), for seeded pseudo-random choices and sketches.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a std map under random inserts and removes of dense, strided and wide keys,
    /// starting small so the table grows.
    #[test]
    fn agrees_with_std_map() {
        let mut ours = BlockMap::with_capacity(4);
        let mut std: HashMap<u64, u32> = HashMap::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        for step in 0..200_000u32 {
            x = mix64(x);
            let key = match x % 3 {
                0 => x >> 50,
                1 => (x >> 52) * 16,
                _ => x.rotate_left(7) | 1 << 40,
            };
            match (x >> 8) % 5 {
                0 | 1 => assert_eq!(ours.insert(key, step), std.insert(key, step)),
                2 => assert_eq!(ours.remove(&key), std.remove(&key)),
                _ => assert_eq!(ours.get(&key), std.get(&key)),
            }
            assert_eq!(ours.len(), std.len());
        }
        for (k, v) in &std {
            assert_eq!(ours.get(k), Some(v));
        }
        assert!(ours.len() * 2 <= ours.slots.len());
    }
}
