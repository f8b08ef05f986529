//! W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission
//! Policy", ACM TOS 2017), with the adaptive window of Caffeine's hill climber (Einziger et
//! al., "Adaptive Software Cache Management", Middleware 2018). Written here from those
//! descriptions; no code was taken from Caffeine.
//!
//! * Frequency. A count-min sketch ([`FrequencySketch`]) of 4-bit counters estimates how
//!   often each block was accessed recently; every access (hit or miss) counts. Each block
//!   hashes to one 64-byte line of the table and to one counter in each of four rows inside
//!   it (a row is two words of the line), so an increment or an estimate touches one cache
//!   line. Updates are conservative: only the counters at the current minimum go up, which
//!   keeps every estimate at least the true count while colliding blocks inflate it less.
//!   Aging: after `10 × capacity` recorded accesses (the *sample period*) every counter is
//!   halved, so old popularity fades and a new hot set can overtake it. No doorkeeper.
//! * Window. A missed block is always admitted into the *window*, an LRU that starts at 1%
//!   of the cache (at least one block). Recency-driven bursts live there.
//! * Main. The rest of the cache is a segmented LRU: *probation* (new arrivals from the
//!   window) and *protected* (blocks hit while on probation), protected at most 80% of main;
//!   a block pushed out of protected goes back to probation's newest end.
//! * Admission. When the cache is full and the window must give up its oldest block (the
//!   *candidate*), the candidate enters probation only if the sketch estimates it more
//!   frequent than probation's oldest block (the *victim*, or protected's oldest when
//!   probation is empty); the loser of the comparison is evicted, ties keep the victim. So
//!   a one-pass scan churns through the window and never displaces a frequent main set,
//!   while a shifted hot set is admitted once aging has cut the old set's counts.
//!   While the cache has free blocks the window's oldest block moves to probation freely.
//! * Adaptive window (hill climbing). Every sample period the policy compares the hit ratio
//!   of the period that just ended with the one before. If it did not fall, the last
//!   resize of the window is repeated in the same direction; if it fell, the direction
//!   reverses. The step starts at 6.25% of the cache and shrinks by 2% every period, so
//!   the window settles; a change of the hit ratio of 5 points or more between two periods
//!   means the workload changed, and the step restarts at 6.25% in its current direction.
//!   The first period ends with a step that grows the window. The window stays between one
//!   block and all but one block of the cache. Shrinking the window moves its oldest
//!   blocks to probation at once; growing it lets the next misses take their room from
//!   main. Steps are kept as fractions of a block and accumulate.
//! * Dirty blocks are never evicted: a dirty candidate enters probation unconditionally,
//!   dirty victims are skipped (the oldest clean block of probation, then protected, then
//!   the window is taken), and when every cached block is dirty a miss is not promoted.
//!   Write-back hands out the block dirty the longest first.
//! * Hints record each block's region and its sketch estimate; loading them restores the
//!   regions as far as their sizes allow and raises the sketch's counters to the saved
//!   estimates, so a restarted cache keeps defending its frequent blocks.
//!
//! Every miss is promoted (into the window), so tinylfu promotes as much as LRU does; what
//! it changes is which blocks stay.

use super::Arena;
use crate::dirty::Dirty;
use crate::hash::{block_map, map_bytes, mix64, prefetch, BlockMap};
use crate::list::{Link, List};
use crate::{hints, Access, HintError, InsertError, Outcome, Params, Policy};

/// Words of the sketch per line: 8 × 8 bytes, one CPU cache line.
const LINE_WORDS: usize = 8;
/// Counters in a row per word.
const NIBBLES: usize = 16;
/// A counter's ceiling.
pub const MAX_COUNT: u8 = 15;
/// Accesses between two agings of the sketch (and between two hill-climbing steps), in
/// cache capacities.
const SAMPLE_FACTOR: u64 = 10;

/// A count-min sketch of 4-bit counters with four rows, aged by halving every counter after
/// each sample period of `10 × capacity` recorded accesses.
///
/// The table has `next_power_of_two(capacity)` 64-bit words (at least one line of eight):
/// four counters of table per block of capacity in each row, 8 bytes per cache block.
#[derive(Clone, Debug)]
pub struct FrequencySketch {
    words: Box<[u64]>,
    line_mask: u64,
    seed: u64,
    samples: u64,
    sample_size: u64,
    resets: u64,
}

impl FrequencySketch {
    /// A sketch for a cache of `capacity` blocks; `seed` chooses the hash functions.
    pub fn new(capacity: usize, seed: u64) -> Self {
        let words = capacity.max(1).next_power_of_two().max(LINE_WORDS);
        FrequencySketch {
            words: vec![0u64; words].into_boxed_slice(),
            line_mask: (words / LINE_WORDS - 1) as u64,
            seed: mix64(seed ^ 0x7f4a_7c15_9e37_79b9),
            samples: 0,
            sample_size: SAMPLE_FACTOR * capacity.max(1) as u64,
            resets: 0,
        }
    }

    /// The four (word, bit shift) places of `block`'s counters, one per row, all in the
    /// block's line. Row `r` is words `2r` and `2r + 1` of the line.
    #[inline]
    fn places(&self, block: u64) -> [(usize, u32); 4] {
        let h = mix64(block ^ self.seed);
        let base = ((h & self.line_mask) as usize) * LINE_WORDS;
        let mut out = [(0usize, 0u32); 4];
        for (r, slot) in out.iter_mut().enumerate() {
            // Five hash bits per row from the high half: one picks the word, four the nibble.
            let bits = (h >> (32 + 5 * r)) as usize;
            let word = base + 2 * r + (bits & 1);
            let shift = (((bits >> 1) % NIBBLES) * 4) as u32;
            *slot = (word, shift);
        }
        out
    }

    /// Count one access to `block`. Ages the table at the end of a sample period.
    #[inline]
    pub fn increment(&mut self, block: u64) {
        let places = self.places(block);
        let counts = places.map(|(w, s)| ((self.words[w] >> s) & 0xf) as u8);
        let min = counts.iter().copied().min().expect("four rows");
        if min < MAX_COUNT {
            for (&(w, s), &c) in places.iter().zip(&counts) {
                if c == min {
                    self.words[w] += 1 << s;
                }
            }
        }
        self.samples += 1;
        if self.samples >= self.sample_size {
            self.age();
        }
    }

    /// The estimated count of `block`: at least the number of its accesses since the last
    /// aging (up to [`MAX_COUNT`]), plus what aging left of earlier ones, plus collisions.
    #[inline]
    pub fn estimate(&self, block: u64) -> u8 {
        self.places(block).iter().map(|&(w, s)| ((self.words[w] >> s) & 0xf) as u8).min().expect("four rows")
    }

    /// Raise `block`'s counters to at least `count` (restoring saved estimates). Not counted
    /// as samples.
    pub fn raise(&mut self, block: u64, count: u8) {
        let count = count.min(MAX_COUNT) as u64;
        for (w, s) in self.places(block) {
            let c = (self.words[w] >> s) & 0xf;
            if c < count {
                self.words[w] += (count - c) << s;
            }
        }
    }

    /// Halve every counter.
    fn age(&mut self) {
        for w in self.words.iter_mut() {
            *w = (*w >> 1) & 0x7777_7777_7777_7777;
        }
        self.samples = 0;
        self.resets += 1;
    }

    /// Start loading `block`'s line.
    #[inline]
    pub fn prefetch(&self, block: u64) {
        let h = mix64(block ^ self.seed);
        prefetch(&self.words[((h & self.line_mask) as usize) * LINE_WORDS]);
    }

    /// Recorded accesses per sample period.
    pub fn sample_size(&self) -> u64 {
        self.sample_size
    }

    /// How many times the table has been aged.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    Window,
    Probation,
    Protected,
}

impl Region {
    fn tag(self) -> u8 {
        match self {
            Region::Window => 0,
            Region::Probation => 1,
            Region::Protected => 2,
        }
    }

    fn from_tag(tag: u8) -> Region {
        match tag & 3 {
            0 => Region::Window,
            2 => Region::Protected,
            _ => Region::Probation,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Node {
    block: u64,
    link: Link,
    at: Region,
}

super::keyed_by_block!(Node);

crate::list::linked_by_field!(Node);

/// Initial window, as a fraction of the cache.
const WINDOW_FRACTION: f64 = 0.01;
/// Protected's share of main.
const PROTECTED_FRACTION: f64 = 0.8;
/// The hill climber's initial (and restart) step, as a fraction of the cache.
const STEP_FRACTION: f64 = 0.0625;
/// The step's decay per sample period.
const STEP_DECAY: f64 = 0.98;
/// A change of the hit ratio between two periods that restarts the climb.
const RESTART_THRESHOLD: f64 = 0.05;

/// The hill climber that sizes the window (see the module docs).
#[derive(Clone, Debug)]
struct Climber {
    period: u64,
    accesses: u64,
    hits: u64,
    prev_rate: Option<f64>,
    /// Signed step in blocks, applied at the end of each period.
    step: f64,
    initial_step: f64,
    /// The window target, fractional so small steps accumulate.
    target: f64,
    min: f64,
    max: f64,
}

impl Climber {
    fn new(capacity: usize, period: u64, window: usize) -> Self {
        let initial_step = (capacity as f64 * STEP_FRACTION).max(1.0);
        Climber {
            period,
            accesses: 0,
            hits: 0,
            prev_rate: None,
            step: initial_step,
            initial_step,
            target: window as f64,
            min: 1.0,
            max: (capacity.saturating_sub(1)).max(1) as f64,
        }
    }

    /// Count one access; at the end of a period, the new window size.
    #[inline]
    fn record(&mut self, hit: bool) -> Option<usize> {
        self.accesses += 1;
        self.hits += hit as u64;
        if self.accesses < self.period {
            return None;
        }
        Some(self.climb())
    }

    fn climb(&mut self) -> usize {
        let rate = self.hits as f64 / self.accesses as f64;
        self.accesses = 0;
        self.hits = 0;
        if let Some(prev) = self.prev_rate {
            let delta = rate - prev;
            let direction = if delta >= 0.0 { self.step.signum() } else { -self.step.signum() };
            let magnitude =
                if delta.abs() >= RESTART_THRESHOLD { self.initial_step } else { self.step.abs() * STEP_DECAY };
            self.step = direction * magnitude;
        }
        self.prev_rate = Some(rate);
        self.target = (self.target + self.step).clamp(self.min, self.max);
        self.target.round() as usize
    }
}

/// W-TinyLFU with a hill-climbing window (see the module docs).
#[derive(Debug)]
pub struct TinyLfu {
    capacity: usize,
    window_cap: usize,
    protected_cap: usize,
    arena: Arena<Node>,
    map: BlockMap,
    /// front = least recently used, for all three lists.
    window: List<0>,
    probation: List<0>,
    protected: List<0>,
    dirty: Dirty,
    sketch: FrequencySketch,
    climber: Climber,
}

fn protected_cap(main: usize) -> usize {
    (main as f64 * PROTECTED_FRACTION) as usize
}

impl TinyLfu {
    pub fn new(capacity: usize, params: &Params) -> Self {
        let window_cap = ((capacity as f64 * WINDOW_FRACTION).round() as usize).max(1);
        let sketch = FrequencySketch::new(capacity, params.seed);
        let period = sketch.sample_size();
        TinyLfu {
            capacity,
            window_cap,
            protected_cap: protected_cap(capacity.saturating_sub(window_cap)),
            arena: Arena::with_capacity(capacity),
            map: block_map(capacity),
            window: List::new(),
            probation: List::new(),
            protected: List::new(),
            dirty: Dirty::new(capacity),
            sketch,
            climber: Climber::new(capacity, period, window_cap),
        }
    }

    /// The window's current size target, in blocks.
    pub fn window_target(&self) -> usize {
        self.window_cap
    }

    /// The frequency sketch, for inspection.
    pub fn sketch(&self) -> &FrequencySketch {
        &self.sketch
    }

    #[inline]
    fn resident(&self, block: u64) -> Option<u32> {
        self.map.get(block, &self.arena.nodes)
    }

    #[inline]
    fn block_of(&self, i: u32) -> u64 {
        self.arena.nodes[i as usize].block
    }

    #[inline]
    fn main_len(&self) -> usize {
        self.probation.len() + self.protected.len()
    }

    fn main_cap(&self) -> usize {
        self.capacity - self.window_cap
    }

    fn push(&mut self, i: u32, at: Region) {
        self.arena.nodes[i as usize].at = at;
        let nodes = &mut self.arena.nodes;
        match at {
            Region::Window => self.window.push_back(nodes, i),
            Region::Probation => self.probation.push_back(nodes, i),
            Region::Protected => self.protected.push_back(nodes, i),
        }
    }

    fn unlink(&mut self, i: u32) {
        let nodes = &mut self.arena.nodes;
        match nodes[i as usize].at {
            Region::Window => self.window.remove(nodes, i),
            Region::Probation => self.probation.remove(nodes, i),
            Region::Protected => self.protected.remove(nodes, i),
        }
    }

    /// Move `i` to the newest end of `to`.
    fn relocate(&mut self, i: u32, to: Region) {
        self.unlink(i);
        self.push(i, to);
    }

    /// Drop entry `i` from the cache entirely.
    fn drop_entry(&mut self, i: u32) -> u64 {
        let block = self.block_of(i);
        self.unlink(i);
        self.map.remove(block, &self.arena.nodes);
        self.dirty.set_clean(i);
        self.arena.free(i);
        block
    }

    fn add(&mut self, block: u64, at: Region) -> u32 {
        let i = self.arena.alloc(Node { block, link: Link::NONE, at });
        self.push(i, at);
        self.map.insert(block, i, &self.arena.nodes);
        i
    }

    /// The oldest clean entry of `list`.
    fn first_clean(&self, list: &List<0>) -> Option<u32> {
        let mut cur = list.front();
        while let Some(i) = cur {
            if !self.dirty.is_dirty(i) {
                return Some(i);
            }
            cur = List::<0>::next(&self.arena.nodes, i);
        }
        None
    }

    /// Main's eviction victim: probation's oldest clean entry, else protected's.
    #[inline]
    fn main_victim(&self) -> Option<u32> {
        if self.dirty.count() == 0 {
            self.probation.front().or_else(|| self.protected.front())
        } else {
            self.first_clean(&self.probation).or_else(|| self.first_clean(&self.protected))
        }
    }

    /// Make room for one block in a full cache. The caller made sure a clean block exists.
    fn evict(&mut self) -> Option<u64> {
        loop {
            if !self.window.is_empty() && self.window.len() >= self.window_cap {
                // The window overflows: its oldest block is the admission candidate.
                let c = self.window.front().expect("window is not empty");
                if self.dirty.is_dirty(c) {
                    self.relocate(c, Region::Probation);
                    continue;
                }
                return match self.main_victim() {
                    Some(v) if self.sketch.estimate(self.block_of(c)) > self.sketch.estimate(self.block_of(v)) => {
                        let b = self.drop_entry(v);
                        self.relocate(c, Region::Probation);
                        Some(b)
                    }
                    _ => Some(self.drop_entry(c)),
                };
            }
            // The window has room (it grew): main gives up a block.
            if let Some(v) = self.main_victim() {
                return Some(self.drop_entry(v));
            }
            return self.first_clean(&self.window).map(|w| self.drop_entry(w));
        }
    }

    fn on_hit(&mut self, i: u32) {
        match self.arena.nodes[i as usize].at {
            Region::Window => self.window.move_to_back(&mut self.arena.nodes, i),
            Region::Protected => self.protected.move_to_back(&mut self.arena.nodes, i),
            Region::Probation => {
                self.probation.remove(&mut self.arena.nodes, i);
                self.push(i, Region::Protected);
                if self.protected.len() > self.protected_cap {
                    let d = self.protected.pop_front(&mut self.arena.nodes).expect("protected is not empty");
                    self.push(d, Region::Probation);
                }
            }
        }
    }

    fn on_miss(&mut self, block: u64) -> Outcome {
        let evict = if self.len() >= self.capacity {
            if self.dirty.count() >= self.len() {
                return Outcome::Miss;
            }
            let v = self.evict();
            debug_assert!(v.is_some(), "a clean block existed");
            v
        } else {
            None
        };
        self.add(block, Region::Window);
        if evict.is_none() && self.window.len() > self.window_cap {
            // Free room in main: the window's oldest block moves there without a contest.
            let c = self.window.front().expect("window is not empty");
            self.relocate(c, Region::Probation);
        }
        Outcome::Promote { evict }
    }

    /// Apply a new window size from the climber.
    fn resize_window(&mut self, window: usize) {
        self.window_cap = window.clamp(1, self.capacity.max(1));
        self.protected_cap = protected_cap(self.main_cap());
        while self.window.len() > self.window_cap {
            let c = self.window.front().expect("window is not empty");
            self.relocate(c, Region::Probation);
        }
        while self.protected.len() > self.protected_cap {
            let d = self.protected.pop_front(&mut self.arena.nodes).expect("protected is not empty");
            self.push(d, Region::Probation);
        }
    }
}

impl Policy for TinyLfu {
    fn name(&self) -> &'static str {
        "tinylfu"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.window.len() + self.main_len()
    }

    #[inline]
    fn prefetch(&self, block: u64) {
        self.map.prefetch(block);
        self.sketch.prefetch(block);
    }

    #[inline]
    fn prefetch_entry(&self, block: u64) {
        self.map.prefetch_entry(block, &self.arena.nodes);
    }

    super::dirty_methods!(without_prefetch);

    #[inline]
    fn access(&mut self, a: Access) -> Outcome {
        self.sketch.increment(a.block);
        let out = match self.map.get(a.block, &self.arena.nodes) {
            Some(i) => {
                self.on_hit(i);
                Outcome::Hit
            }
            None => self.on_miss(a.block),
        };
        if let Some(w) = self.climber.record(out.is_hit()) {
            if w != self.window_cap {
                self.resize_window(w);
            }
        }
        out
    }

    fn remove(&mut self, block: u64) -> bool {
        match self.resident(block) {
            Some(i) => {
                self.drop_entry(i);
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        if self.map.contains_key(block, &self.arena.nodes) {
            return Err(InsertError::AlreadyCached(block));
        }
        if self.len() >= self.capacity {
            return Err(InsertError::Full(self.capacity));
        }
        let at = if self.main_len() < self.main_cap() { Region::Probation } else { Region::Window };
        let i = self.add(block, at);
        if dirty {
            self.dirty.set_dirty(i);
        }
        Ok(())
    }

    /// Coldest to hottest: probation, window, protected, each oldest first. The tag holds
    /// the region (bits 0-1) and the sketch estimate (bits 2-5).
    fn save_hints(&self) -> Vec<u8> {
        let nodes = &self.arena.nodes;
        let tag = |i: u32| {
            let n = nodes[i as usize];
            (n.block, n.at.tag() | self.sketch.estimate(n.block) << 2)
        };
        let order: Vec<(u64, u8)> = self
            .probation
            .iter(nodes)
            .chain(self.window.iter(nodes))
            .chain(self.protected.iter(nodes))
            .map(tag)
            .collect();
        hints::encode(self.name(), order.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.map.is_empty() {
            return Err(HintError::NotEmpty);
        }
        // Keep the hottest end when the saved cache was larger.
        let skip = entries.len().saturating_sub(self.capacity);
        for (block, tag) in entries.into_iter().skip(skip) {
            if self.map.contains_key(block, &self.arena.nodes) {
                continue;
            }
            let at = match Region::from_tag(tag) {
                Region::Window if self.window.len() < self.window_cap => Region::Window,
                Region::Protected if self.protected.len() < self.protected_cap => Region::Protected,
                _ => Region::Probation,
            };
            self.add(block, at);
            self.sketch.raise(block, tag >> 2);
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let bytes = self.arena.bytes(self.capacity) + map_bytes(&self.map) + self.dirty.bytes() + self.sketch.bytes();
        bytes as f64 / self.capacity as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// xorshift64, so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Property: within an aging period, no block's estimate falls below its true count
    /// (capped at the counter ceiling), whatever the stream: uniform over few or many keys,
    /// skewed, strided, for tables from one line to thousands, many seeds.
    #[test]
    fn sketch_never_underestimates_within_an_aging_period() {
        for case in 0..70u64 {
            let mut rng = Rng(0x9e37_79b9 ^ (case * 0x1234_5679 + 1));
            let capacity = [1usize, 3, 8, 64, 100, 1000, 5000][(case % 7) as usize];
            let mut sketch = FrequencySketch::new(capacity, rng.next());
            let keys = 1 + rng.below(20 * capacity as u64 + 50);
            let stride = [1u64, 16, 4096, 0x9E37_79B9][(case % 4) as usize];
            let skew = case % 3;
            let mut truth: HashMap<u64, u64> = HashMap::new();
            let mut resets = sketch.resets();
            let steps = 3 * sketch.sample_size() + 500;
            for step in 0..steps {
                let k = match skew {
                    0 => rng.below(keys),
                    // Popularity ~ 1/rank.
                    1 => {
                        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
                        ((keys as f64).powf(u) as u64).min(keys - 1)
                    }
                    _ => rng.below(1 + keys / 10),
                };
                let block = k.wrapping_mul(stride);
                sketch.increment(block);
                if sketch.resets() != resets {
                    // This increment closed the period; counting starts over.
                    resets = sketch.resets();
                    truth.clear();
                } else {
                    *truth.entry(block).or_default() += 1;
                }
                let want = |b: u64, t: &HashMap<u64, u64>| t.get(&b).copied().unwrap_or(0).min(15);
                assert!(sketch.estimate(block) as u64 >= want(block, &truth), "case {case} step {step}: block {block}");
                if step % 331 == 0 {
                    for (&b, &n) in &truth {
                        assert!(
                            sketch.estimate(b) as u64 >= n.min(15),
                            "case {case} step {step}: block {b} estimate {} < {n}",
                            sketch.estimate(b)
                        );
                    }
                }
            }
            assert!(sketch.resets() >= 3, "case {case}: aging never ran");
        }
    }

    /// Aging halves: a block counted 15 times reads at most 7 after one period of others,
    /// plus whatever the others added to its counters.
    #[test]
    fn aging_halves_counts() {
        let mut s = FrequencySketch::new(1000, 1);
        for _ in 0..15 {
            s.increment(42);
        }
        assert_eq!(s.estimate(42), 15);
        s.increment(42);
        assert_eq!(s.estimate(42), 15, "counters saturate");
        let n = s.sample_size() - s.samples;
        for b in 0..n {
            s.increment(1_000_000 + b);
        }
        assert_eq!(s.resets(), 1);
        assert!(s.estimate(42) <= 8, "estimate {}", s.estimate(42));
        assert!(s.estimate(42) >= 7, "estimate {}", s.estimate(42));
    }

    fn check_regions(p: &TinyLfu) {
        assert!(p.window.len() <= p.window_cap, "window over its target");
        assert!(p.protected.len() <= p.protected_cap, "protected over its cap");
        assert_eq!(p.len(), p.map.len());
        assert!(p.len() <= p.capacity);
        assert!(p.window_cap >= 1 && p.window_cap <= p.capacity.max(1));
        for (list, at) in
            [(&p.window, Region::Window), (&p.probation, Region::Probation), (&p.protected, Region::Protected)]
        {
            for i in list.iter(&p.arena.nodes) {
                let n = p.arena.nodes[i as usize];
                assert_eq!(n.at, at);
                assert_eq!(p.map.get(n.block, &p.arena.nodes), Some(i));
            }
        }
    }

    /// The regions keep their bounds through climbing, dirty blocks, removals and inserts.
    #[test]
    fn regions_stay_within_bounds() {
        for (cap, seed) in [(1usize, 1u64), (2, 2), (10, 3), (100, 4), (1000, 5)] {
            let mut p = TinyLfu::new(cap, &Params { seed, ..Params::default() });
            let mut rng = Rng(seed * 7919 + 1);
            let span = 3 * cap as u64 + 5;
            for step in 0..60 * cap as u64 + 2000 {
                let r = rng.below(100);
                // Phases of different locality so the climber moves both ways.
                let block = if (step / (5 * cap as u64 + 50)).is_multiple_of(2) {
                    rng.below(span)
                } else {
                    rng.below(cap as u64 / 2 + 1) + 10 * span
                };
                if r < 90 {
                    p.access(Access::read(block, step));
                } else if r < 94 {
                    p.set_dirty(block);
                } else if r < 98 {
                    if let Some(b) = p.writeback_candidate(step) {
                        p.set_clean(b);
                    }
                } else {
                    p.remove(block);
                    let _ = p.insert(block + 1, rng.below(2) == 0);
                }
                check_regions(&p);
            }
        }
    }

    /// Recency beats frequency when every block is read exactly twice, at a reuse distance
    /// spread evenly up to the cache size: a 1% window drops most blocks before their second
    /// read and admission rejects them (their counts tie with main's), while every block the
    /// window grows by catches more second reads. The climber must grow the window.
    #[test]
    fn climber_grows_the_window_when_recency_pays() {
        let cap = 1000;
        let mut p = TinyLfu::new(cap, &Params::default());
        let mut rng = Rng(5);
        // (time, block): block k read at 2k and again up to 2 × cap accesses later.
        let mut events: Vec<(u64, u64)> = Vec::new();
        for k in 0..200_000u64 {
            events.push((4 * k, k));
            events.push((4 * k + 1 + 4 * rng.below(cap as u64), k));
        }
        events.sort_unstable();
        let n = events.len();
        let (mut early, mut late) = (0u64, 0u64);
        for (t, &(_, block)) in events.iter().enumerate() {
            let hit = p.access(Access::read(block, t as u64)).is_hit();
            if t < n / 10 {
                early += hit as u64;
            } else if t >= n - n / 10 {
                late += hit as u64;
            }
        }
        assert!(p.window_target() > cap / 4, "window stayed at {}", p.window_target());
        assert!(late > 2 * early, "hits in the first tenth {early}, last tenth {late}");
    }

    /// Hints restore regions and frequencies, so a restarted cache still refuses to let a
    /// once-seen block displace a frequent one.
    #[test]
    fn hints_restore_frequencies() {
        let mut p = TinyLfu::new(100, &Params::default());
        for _ in 0..5 {
            for b in 0..90 {
                p.access(Access::read(b, 0));
            }
        }
        let mut q = TinyLfu::new(100, &Params::default());
        q.load_hints(&p.save_hints()).unwrap();
        assert_eq!(q.len(), 90);
        assert!(q.sketch.estimate(5) >= 5);
        check_regions(&q);
        for b in 1000..1300 {
            q.access(Access::read(b, 0));
        }
        for b in 0..90 {
            assert!(q.contains(b), "restored frequent block {b} was flushed by a scan");
        }
    }
}
