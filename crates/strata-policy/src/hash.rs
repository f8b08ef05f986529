//! The map every policy uses to find an entry by block number, and the hashes around it.
//!
//! Block numbers are `u64`s that are often dense or strided (every 16th block), and a policy
//! looks one up on every access, so the map is the hottest data structure in the simulator;
//! it also holds every cached block and every ghost, so at scale it is one of the largest.
//! [`BlockMap`] is an open-addressing table of `u32` slots that hold an entry's index, not
//! its block number: the block number already lives in the policy's arena, and the map reads
//! it there through [`Keyed`] (each operation takes the arena as a slice). Kept at most three
//! quarters full, the table costs 5⅓ bytes per entry, where slots that held the key beside
//! the index took 12 bytes at most half full, 24–48 bytes per entry. Fuller tables make
//! probes and the shifts below longer: on the simulator's throughput benchmark, 80% full
//! took about 15% more time than 75% for LRU, 70% about 12% less.
//!
//! Reading a key in the arena is a cache miss of its own, and most of those reads are spared
//! by the bits of a slot that its index does not need (an index needs as many bits as the
//! arena's size; a cache of a hundred thousand blocks leaves 15):
//!
//! * Four of them hold the entry's distance from its home slot (saturated: the highest value
//!   means that far or further). The table is ordered Robin Hood style: an insert takes the
//!   slot of the first entry nearer its own home and moves that one on, so along a probe the
//!   entries' distances never fall below the probe's own until the key is passed. A lookup
//!   gives up at the first entry nearer its home than the key would be, and only an entry at
//!   exactly the key's distance can be the key. A deletion shifts the entries after it back
//!   one slot each until an empty slot or an entry at its home (no tombstones), all without
//!   reading keys.
//! * The rest hold more bits of the key's hash (the tag), which a candidate must match before
//!   its key is read: 11 bits for that hundred-thousand-block cache, so a lookup reads the
//!   arena about once, for the entry it finds. The tag shrinks as the arena grows: none is
//!   left from 2^27 entries (an ARC or LIRS cache of 64 Mi blocks with its ghosts), and from
//!   2^28 the distance loses bits too. The map stays exact, and reads a key wherever a bit is
//!   missing; indices only have to differ from `u32::MAX`.
//!
//! Slots are found by Fibonacci hashing (multiply by the golden ratio), which spreads dense
//! and strided block numbers evenly; the home slot is the hash's top bits scaled to the slot
//! count (multiply, keep the high word), so the slot count need not be a power of two and the
//! load stays near its limit whatever the size. Not for untrusted keys.

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

/// An arena entry the map can read a block number from.
pub(crate) trait Keyed {
    fn key(&self) -> u64;
}

/// A bare block-number array is an arena too.
impl Keyed for u64 {
    #[inline]
    fn key(&self) -> u64 {
        *self
    }
}

/// And so is an array of 32-bit keys (the ghosts' fingerprints).
impl Keyed for u32 {
    #[inline]
    fn key(&self) -> u64 {
        *self as u64
    }
}

/// The value of an empty slot; a live slot never equals it because its index is never all
/// ones.
const EMPTY: u32 = u32::MAX;
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const MIN_SLOTS: usize = 8;
/// Bits of a slot that hold the distance from home, when the index leaves room for them.
const DIST_BITS: u32 = 4;
/// At most `LOAD_NUM / LOAD_DEN` of the slots are used.
const LOAD_NUM: usize = 3;
const LOAD_DEN: usize = 4;

#[inline]
fn hash(key: u64) -> u64 {
    key.wrapping_mul(GOLDEN)
}

/// Bits that hold every index below `n` and leave the all-ones index unused.
fn bits_for(n: usize) -> u32 {
    (usize::BITS - n.leading_zeros()).clamp(1, 32)
}

/// Block number → entry index, the block number of entry `i` being `keys[i].key()` in the
/// arena every operation is given. The arena must hold an entry's key from its insertion to
/// its removal.
#[derive(Clone)]
pub(crate) struct BlockMap {
    /// From the low bits up: the entry's index, its saturated distance from home, the tag.
    slots: Box<[u32]>,
    len: usize,
    /// How many entries the slots may hold before the table grows.
    max_len: usize,
    index_bits: u32,
    index_mask: u32,
    /// The highest distance a slot records; it means "this far or further".
    dist_max: u32,
    tag_mask: u32,
}

impl std::fmt::Debug for BlockMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockMap").field("len", &self.len).field("slots", &self.slots.len()).finish()
    }
}

/// A map sized for `capacity` entries with indices below `capacity`, without growing.
pub(crate) fn block_map(capacity: usize) -> BlockMap {
    BlockMap::with_capacity(capacity)
}

/// A map sized for `capacity` entries with indices below `indices`, without growing.
pub(crate) fn block_map_indexed(capacity: usize, indices: usize) -> BlockMap {
    BlockMap::with_layout(capacity, bits_for(indices), DIST_BITS)
}

/// Bytes the map has allocated.
pub(crate) fn map_bytes(map: &BlockMap) -> usize {
    map.slots.len() * std::mem::size_of::<u32>()
}

impl BlockMap {
    pub fn with_capacity(capacity: usize) -> Self {
        Self::with_layout(capacity, bits_for(capacity), DIST_BITS)
    }

    /// A map of `capacity` entries whose indices take `index_bits` bits, with up to
    /// `dist_bits` bits of distance.
    fn with_layout(capacity: usize, index_bits: u32, dist_bits: u32) -> Self {
        let n = capacity.saturating_mul(LOAD_DEN).div_ceil(LOAD_NUM).max(MIN_SLOTS);
        let dist_bits = dist_bits.min(32 - index_bits);
        let low_bits = index_bits + dist_bits;
        BlockMap {
            slots: vec![EMPTY; n].into_boxed_slice(),
            len: 0,
            max_len: n / LOAD_DEN * LOAD_NUM + n % LOAD_DEN * LOAD_NUM / LOAD_DEN,
            index_bits,
            index_mask: (u64::MAX >> (64 - index_bits)) as u32,
            dist_max: (1u32 << dist_bits) - 1,
            tag_mask: !(u64::MAX >> (64 - low_bits)) as u32,
        }
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        ((h as u128 * self.slots.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, pos: usize) -> usize {
        if pos + 1 == self.slots.len() {
            0
        } else {
            pos + 1
        }
    }

    #[inline]
    fn index(&self, s: u32) -> u32 {
        s & self.index_mask
    }

    /// The distance a slot records, saturated at `dist_max`.
    #[inline]
    fn dist(&self, s: u32) -> u32 {
        s.wrapping_shr(self.index_bits) & self.dist_max
    }

    /// `s` recording distance `d` (saturated) instead of its own.
    #[inline]
    fn with_dist(&self, s: u32, d: u32) -> u32 {
        let field = self.dist_max.wrapping_shl(self.index_bits);
        (s & !field) | d.min(self.dist_max).wrapping_shl(self.index_bits)
    }

    /// The true distance of the entry in slot `pos`, from its key when the slot's is saturated.
    #[inline]
    fn exact_dist<K: Keyed>(&self, s: u32, pos: usize, keys: &[K]) -> u32 {
        let d = self.dist(s);
        if d < self.dist_max {
            return d;
        }
        let home = self.home(hash(keys[self.index(s) as usize].key()));
        (if pos >= home { pos - home } else { pos + self.slots.len() - home }) as u32
    }

    /// The slot holding `key`.
    #[inline]
    fn find<K: Keyed>(&self, key: u64, keys: &[K]) -> Option<usize> {
        self.probe(key, |s| keys[self.index(s) as usize].key() == key)
    }

    /// The first slot along `key`'s probe whose distance and tag are those `key` would have
    /// there and whose entry `is_key` accepts; none once an empty slot or an entry nearer its
    /// home shows `key` would have been placed before.
    #[inline]
    fn probe(&self, key: u64, is_key: impl Fn(u32) -> bool) -> Option<usize> {
        let h = hash(key);
        let tag = h as u32 & self.tag_mask;
        let mut pos = self.home(h);
        // The distance a slot holding `key` would record here.
        let mut d = 0;
        loop {
            let s = self.slots[pos];
            if s == EMPTY {
                return None;
            }
            let sd = self.dist(s);
            if sd < d {
                // Nearer its home than `key` would be: `key` would have taken this slot.
                return None;
            }
            if sd == d && s & self.tag_mask == tag && is_key(s) {
                return Some(pos);
            }
            pos = self.next(pos);
            if d < self.dist_max {
                d += 1;
            }
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

    /// Forget every entry.
    pub fn clear(&mut self) {
        self.slots.fill(EMPTY);
        self.len = 0;
    }

    #[inline]
    pub fn get<K: Keyed>(&self, key: u64, keys: &[K]) -> Option<u32> {
        self.find(key, keys).map(|pos| self.index(self.slots[pos]))
    }

    #[inline]
    pub fn contains_key<K: Keyed>(&self, key: u64, keys: &[K]) -> bool {
        self.find(key, keys).is_some()
    }

    /// Map `key`, which must not be in the map, to `i`, whose key in `keys` must already be
    /// `key`.
    #[inline]
    pub fn insert<K: Keyed>(&mut self, key: u64, i: u32, keys: &[K]) {
        debug_assert_eq!(keys[i as usize].key(), key);
        debug_assert_ne!(i, EMPTY);
        debug_assert!(self.find(key, keys).is_none(), "{key} is in the map already");
        if i >= self.index_mask || self.len == self.max_len {
            self.grow(i, keys);
        }
        let h = hash(key);
        self.place(self.home(h), 0, (h as u32 & self.tag_mask) | i, keys);
        self.len += 1;
    }

    /// Put `cur` (an entry's index and tag) at distance `d` from its home in slot `pos` or
    /// further on, where Robin Hood order wants it, and move on the entries it displaces.
    fn place<K: Keyed>(&mut self, mut pos: usize, mut d: u32, mut cur: u32, keys: &[K]) {
        loop {
            let s = self.slots[pos];
            if s == EMPTY {
                self.slots[pos] = self.with_dist(cur, d);
                return;
            }
            // Below `dist_max`, a saturated distance is known to be the larger; past it, the
            // key tells.
            let sd = if d < self.dist_max { self.dist(s) } else { self.exact_dist(s, pos, keys) };
            if sd < d {
                self.slots[pos] = self.with_dist(cur, d);
                cur = s;
                d = sd;
            }
            pos = self.next(pos);
            d += 1;
        }
    }

    /// Remove `key`, which must still be the key of its entry in `keys`; returns its index.
    #[inline]
    pub fn remove<K: Keyed>(&mut self, key: u64, keys: &[K]) -> Option<u32> {
        let mut hole = self.find(key, keys)?;
        let i = self.index(self.slots[hole]);
        // Backward shift: the entries after the hole that are not at home move back one.
        loop {
            let next = self.next(hole);
            let s = self.slots[next];
            if s == EMPTY {
                break;
            }
            let d = self.exact_dist(s, next, keys);
            if d == 0 {
                break;
            }
            self.slots[hole] = self.with_dist(s, d - 1);
            hole = next;
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        Some(i)
    }

    /// Start loading the slot where `key`'s probe starts, without waiting for it.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        prefetch(&self.slots[self.home(hash(key))]);
    }

    /// Start loading the arena entry `key`'s lookup will read first, found from the slots
    /// alone (so best once [`BlockMap::prefetch`] has brought them in).
    #[inline]
    pub fn prefetch_entry<K: Keyed>(&self, key: u64, keys: &[K]) {
        if let Some(entry) = self.first_candidate(key).and_then(|i| keys.get(i as usize)) {
            prefetch(entry);
        }
    }

    /// The index of the first entry whose key a lookup of `key` reads: the key's own where
    /// the tag tells it from the entries before it.
    #[inline]
    fn first_candidate(&self, key: u64) -> Option<u32> {
        self.probe(key, |_| true).map(|pos| self.index(self.slots[pos]))
    }

    /// Make room for one more entry, with index `i`: twice the slots when the table is full,
    /// more index bits when `i` does not fit.
    #[cold]
    fn grow<K: Keyed>(&mut self, i: u32, keys: &[K]) {
        let capacity = if self.len == self.max_len { self.max_len.max(1) * 2 } else { self.max_len };
        let index_bits = self.index_bits.max(bits_for(capacity)).max(bits_for(i as usize + 1));
        let mut grown = BlockMap::with_layout(capacity, index_bits, self.dist_max.count_ones());
        for &s in self.slots.iter().filter(|&&s| s != EMPTY) {
            let i = self.index(s);
            let h = hash(keys[i as usize].key());
            grown.place(grown.home(h), 0, (h as u32 & grown.tag_mask) | i, keys);
        }
        grown.len = self.len;
        *self = grown;
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

    /// Every slot records its entry's tag and true distance (saturated), and the distances
    /// along the table keep the Robin Hood order lookups rely on: an entry away from home
    /// follows an entry at most one slot nearer its own.
    fn check(map: &BlockMap, keys: &[u64]) {
        let n = map.slots.len();
        let dist = |pos: usize| {
            let h = hash(keys[map.index(map.slots[pos]) as usize]);
            (pos + n - map.home(h)) % n
        };
        let mut len = 0;
        for pos in 0..n {
            let s = map.slots[pos];
            if s == EMPTY {
                continue;
            }
            len += 1;
            let d = dist(pos);
            assert_eq!(map.dist(s), (d as u32).min(map.dist_max));
            assert_eq!(s & map.tag_mask, hash(keys[map.index(s) as usize]) as u32 & map.tag_mask);
            if d > 0 {
                let prev = (pos + n - 1) % n;
                assert_ne!(map.slots[prev], EMPTY);
                assert!(dist(prev) + 1 >= d);
            }
        }
        assert_eq!(len, map.len());
        assert!(map.len() <= map.max_len && map.max_len < n);
    }

    /// Against a std map under random inserts, moves to another entry and removes of dense,
    /// strided and wide keys, their indices drawn from an arena that reuses freed ones and sometimes
    /// jumps ahead. Each map starts small, so its table grows and its indices outgrow their
    /// bits; besides the usual layout, one records no distances (every key is read), one
    /// saturates its distances at 1, and one spends all 32 bits on the index.
    #[test]
    fn agrees_with_std_map() {
        for (index_bits, dist_bits) in [(bits_for(4), DIST_BITS), (3, 0), (3, 1), (32, DIST_BITS)] {
            let mut ours = BlockMap::with_layout(4, index_bits, dist_bits);
            let mut std: HashMap<u64, u32> = HashMap::new();
            let mut keys: Vec<u64> = Vec::new();
            let mut free: Vec<u32> = Vec::new();
            let mut x = 0x1234_5678_9abc_def1u64;
            for step in 0..200_000u32 {
                x = mix64(x);
                let key = match x % 3 {
                    0 => x >> 50,
                    1 => (x >> 52) * 16,
                    _ => x.rotate_left(7) | 1 << 40,
                };
                match (x >> 8) % 5 {
                    0 | 1 => {
                        let i = match free.pop() {
                            Some(i) if !(x >> 16).is_multiple_of(64) => i,
                            _ => {
                                keys.resize(keys.len() + 1 + (x >> 24) as usize % 3, u64::MAX);
                                keys.len() as u32 - 1
                            }
                        };
                        // A key already in the map moves to the new entry.
                        let old = ours.remove(key, &keys);
                        assert_eq!(old, std.remove(&key));
                        keys[i as usize] = key;
                        ours.insert(key, i, &keys);
                        std.insert(key, i);
                        free.extend(old);
                    }
                    2 => {
                        let old = ours.remove(key, &keys);
                        assert_eq!(old, std.remove(&key));
                        free.extend(old);
                    }
                    _ => {
                        let found = ours.get(key, &keys);
                        assert_eq!(found, std.get(&key).copied());
                        // The entry the lookup reads first: its own, or one whose tag is
                        // the key's (a key missing may find one too).
                        let first = ours.first_candidate(key);
                        assert!(found.is_none() || first.is_some(), "{key}: no candidate");
                        if let Some(f) = first.filter(|&f| Some(f) != found) {
                            let tag = |k: u64| hash(k) as u32 & ours.tag_mask;
                            assert_eq!(tag(keys[f as usize]), tag(key), "{key}: entry {f} read first");
                        }
                        ours.prefetch_entry(key, &keys);
                    }
                }
                assert_eq!(ours.len(), std.len());
                if step % 4096 == 0 {
                    check(&ours, &keys);
                }
            }
            check(&ours, &keys);
            for (&k, &v) in &std {
                assert_eq!(ours.get(k, &keys), Some(v));
            }
        }
    }

    /// Sized for its capacity, a map takes that many entries without growing, at its load
    /// limit's cost (a slot more at most).
    #[test]
    fn holds_its_capacity_without_growing() {
        for capacity in [0, 1, 7, 100, 93_938, 1 << 20] {
            let keys: Vec<u64> = (0..capacity as u64).map(|b| b * 16).collect();
            let mut map = block_map(capacity);
            let slots = map.slots.len();
            for (i, &b) in keys.iter().enumerate() {
                map.insert(b, i as u32, &keys);
            }
            assert_eq!(map.slots.len(), slots);
            let most = capacity as f64 * 4.0 * LOAD_DEN as f64 / LOAD_NUM as f64 + 4.0;
            assert!(capacity < 8 || map_bytes(&map) as f64 <= most, "{capacity}: {}", map_bytes(&map));
            check(&map, &keys);
        }
    }
}
