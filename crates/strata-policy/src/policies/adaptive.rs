//! adaptive: serve with whichever of several whole policies does best on this workload, as
//! measured by miniature simulations running beside the live policy.
//!
//! * Candidates. S3-FIFO, ARC, LIRS, W-TinyLFU and 2Q, each as it is, behind a
//!   [`Doorkeeper`] of 1, 4 or 16 cache capacities, and behind one that stops only the misses
//!   of sequential runs of at least 256, 1,024 or 4,096 blocks (the blocks from there on;
//!   [`Runs`] follows the runs over every access, sampled or not); and `strata`. No one of
//!   them is within a point of the best on every trace and size (see `docs/BENCHMARKS.md`).
//!   The doorkeeper variants trade a block's first hit for a fraction of the promotions;
//!   the run variants make that trade for the blocks of long runs alone, which on some
//!   workloads are read once (a scan) and on others read again soon.
//! * Miniatures. Every candidate, and LRU as the yardstick, runs on a spatial sample of the
//!   blocks (a block is sampled when a hash of its number falls under a threshold, so it is
//!   sampled on every access): a cache of `capacity / rate` blocks fed one block in `rate`,
//!   which tracks the full-size cache's hit ratio (Waldspurger et al., "Cache Modeling and
//!   Optimization using Miniature Simulations", USENIX ATC 2017). The rate keeps each
//!   miniature near [`MINI_BLOCKS`] blocks; a smaller cache is simulated at full size.
//! * Choice. Every [`EPOCH_CAPACITIES`] miniature capacities of sampled accesses the scores
//!   (hits and promotions) are multiplied by [`DECAY`], so they follow the workload's phases.
//!   The best candidate is the one with the most hits among those promoting at most
//!   [`PROMOTION_BUDGET`] of what LRU promotes (every promotion is an origin read and a cache
//!   write), unless that costs more than [`BUDGET_HIT_COST`] of the sampled accesses in hits:
//!   then the one with the most hits, whatever it promotes. It replaces the live policy when
//!   it is ahead by more than [`SWITCH_MARGIN`] of the sampled accesses in the window, or when
//!   the live one is over the budget and the best is within it.
//! * Switch. The live policy is rebuilt as the winner: the cached blocks move over in the old
//!   policy's order (coldest first) with their dirty flags; nothing is read or written, but
//!   the old policy's history (ghosts, frequencies) is lost, which the margin pays for. It
//!   costs time in proportion to the cached blocks, under the caller's lock. The blocks are
//!   handed over as the workload's own ([`Policy::adopt`]) when the outgoing candidate's
//!   miniature hit at least [`ADOPT_SHARE`] as often as the winner's, and as after a restart
//!   otherwise, for the winner to replace first: strata treats restored blocks as free room
//!   and admits every miss until they are gone, which after a switch between two good
//!   candidates threw away a good cache (P2 at 10%: 47.95% of hits against 52.00%).

use crate::hash::mix64;
use crate::{build, hints, Access, HintError, InsertError, Outcome, Params, Policy};

/// One candidate: a policy by [`build`] name, behind a doorkeeper of `doorkeeper` cache
/// capacities (0: none) that stops the misses of sequential runs of at least `run` blocks
/// (0: every miss).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub policy: &'static str,
    pub doorkeeper: u32,
    pub run: u32,
}

const fn c(policy: &'static str, doorkeeper: u32) -> Candidate {
    Candidate { policy, doorkeeper, run: 0 }
}

/// A candidate whose doorkeeper (of [`RUN_DOORKEEPER`] capacities) only stops the misses
/// of sequential runs of at least `run` blocks.
const fn seq(policy: &'static str, run: u32) -> Candidate {
    Candidate { policy, doorkeeper: RUN_DOORKEEPER, run }
}

/// The candidates; the first serves until the miniatures have spoken.
pub const CANDIDATES: &[Candidate] = &[
    c("strata", 0),
    c("s3fifo", 0),
    c("arc", 0),
    c("lirs", 0),
    c("tinylfu", 0),
    c("2q", 0),
    c("s3fifo", 1),
    c("arc", 1),
    c("lirs", 1),
    c("tinylfu", 1),
    c("2q", 1),
    c("s3fifo", 4),
    c("arc", 4),
    c("lirs", 4),
    c("tinylfu", 4),
    c("2q", 4),
    c("s3fifo", 16),
    c("arc", 16),
    c("lirs", 16),
    c("tinylfu", 16),
    c("2q", 16),
    seq("s3fifo", 256),
    seq("arc", 256),
    seq("lirs", 256),
    seq("tinylfu", 256),
    seq("2q", 256),
    seq("s3fifo", 1024),
    seq("arc", 1024),
    seq("lirs", 1024),
    seq("tinylfu", 1024),
    seq("2q", 1024),
    seq("s3fifo", 4096),
    seq("arc", 4096),
    seq("lirs", 4096),
    seq("tinylfu", 4096),
    seq("2q", 4096),
];
/// Cache capacities a sequential-run doorkeeper remembers.
const RUN_DOORKEEPER: u32 = 4;
/// Target size of a miniature cache, in blocks.
const MINI_BLOCKS: usize = 4096;
/// Sampled accesses per epoch, in miniature capacities.
const EPOCH_CAPACITIES: u64 = 8;
/// What an epoch's end keeps of the scores.
const DECAY: f64 = 0.9;
/// How far ahead (hits per sampled access in the window) a candidate must be to take over.
const SWITCH_MARGIN: f64 = 0.005;
/// Promotions allowed, as a fraction of what LRU's miniature promotes.
pub(crate) const PROMOTION_BUDGET: f64 = 0.75;
/// The most the budget may cost, in hits per sampled access: when every candidate within it
/// is further behind the one with the most hits, that one serves, whatever it promotes. A
/// point, as the rule the default is held to allows a point behind the best policy (`optgate`
/// chooses its level with the same allowance).
pub(crate) const BUDGET_HIT_COST: f64 = 0.01;
/// At a switch, the outgoing candidate's hits (in miniature), as a share of the incoming
/// one's, from which the cached blocks are taken over as they are rather than as a restart's.
const ADOPT_SHARE: f64 = 0.9;
/// Bits of a block's hash compared with the sampling threshold.
const SAMPLE_BITS: u32 = 24;

struct Mini {
    policy: Gated,
    score: Score,
}

impl Mini {
    fn new(policy: Gated) -> Self {
        Mini { policy, score: Score::default() }
    }

    fn access(&mut self, access: Access, run: u32) {
        self.score.count(self.policy.access(access, run));
    }
}

/// A miniature's hits and promotions, decayed at each epoch's end.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Score {
    pub hits: f64,
    pub promotions: f64,
}

impl Score {
    pub fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Hit => self.hits += 1.0,
            Outcome::Promote { .. } => self.promotions += 1.0,
            Outcome::Miss => {}
        }
    }

    pub fn decay(&mut self, by: f64) {
        self.hits *= by;
        self.promotions *= by;
    }
}

/// Which of the miniatures `scores` is best: the one with the most hits among those
/// promoting at most [`PROMOTION_BUDGET`] of `lru_promotions`, unless every such one is more
/// than `hit_cost` of `sampled` accesses in hits behind the one with the most; then that one.
/// Among equals the later one: `optgate` lists its levels without the doorkeeper, then with
/// it for long runs, then with it for every miss, each from level 0 up, so where every level
/// scores alike (a cache still filling lets every miss in at any level) it takes the
/// strictest, the top level with the doorkeeper for every miss. Keeping the level in force
/// on such a tie held fewer of the rule's cells out of sample (`docs/BENCHMARKS.md`).
pub(crate) fn choose(scores: &[Score], lru_promotions: f64, sampled: f64, hit_cost: f64) -> usize {
    let budget = PROMOTION_BUDGET * lru_promotions;
    let most_hits = |filter: &dyn Fn(&Score) -> bool| {
        let ms = scores.iter().enumerate().filter(|(_, m)| filter(m));
        ms.max_by(|a, b| a.1.hits.total_cmp(&b.1.hits)).map(|(i, _)| i)
    };
    let most = most_hits(&|_| true).expect("there are miniatures");
    match most_hits(&|m| m.promotions <= budget) {
        Some(frugal) if scores[most].hits - scores[frugal].hits <= hit_cost * sampled => frugal,
        _ => most,
    }
}

/// A spatial sample of the blocks: a block is sampled when the top [`SAMPLE_BITS`] bits of
/// a hash of its number fall under a threshold, so it is sampled on every access.
pub(crate) struct Sampler {
    threshold: u64,
}

impl Sampler {
    /// The sample that scales a cache of `capacity` blocks to miniatures of about `target`
    /// blocks, and the miniatures' capacity (a smaller cache is not sampled).
    pub fn new(capacity: usize, target: usize) -> (Sampler, usize) {
        let rate = capacity.div_ceil(target).max(1);
        (Sampler { threshold: (1u64 << SAMPLE_BITS) / rate as u64 }, capacity.div_ceil(rate).max(1))
    }

    #[inline]
    pub fn sampled(&self, block: u64) -> bool {
        (mix64(block) >> (64 - SAMPLE_BITS)) < self.threshold
    }
}

fn make(c: Candidate, capacity: usize, params: &Params) -> Gated {
    let inner = build(c.policy, capacity, params).expect("candidates are built-in policies");
    let door = (c.doorkeeper > 0).then(|| Doorkeeper::new(capacity * c.doorkeeper as usize));
    Gated { inner, door, run: c.run }
}

/// A policy behind its candidate's [`Doorkeeper`], if it has one: a miss on a block not
/// missed recently (in a sequential run of at least `run` blocks) is only remembered, so the
/// policy sees such a block's misses from its second recent one on.
struct Gated {
    inner: Box<dyn Policy + Send>,
    door: Option<Doorkeeper>,
    run: u32,
}

impl Gated {
    /// `access`, the `run`th block of its sequential run.
    fn access(&mut self, access: Access, run: u32) -> Outcome {
        if let Some(door) = &mut self.door {
            if run >= self.run && !self.inner.contains(access.block) && !door.check_and_remember(access.block) {
                return Outcome::Miss;
            }
        }
        self.inner.access(access)
    }

    fn bytes_per_entry(&self) -> f64 {
        let door = self.door.as_ref().map_or(0, Doorkeeper::bytes);
        self.inner.bytes_per_entry() + door as f64 / self.inner.capacity() as f64
    }
}

/// Sequential runs, as a direct-mapped table of the block each recent run expects next and
/// how long it is: an access continuing a run lengthens it, an access again to a run's last
/// block while its slot lasts (a request ending inside a block and the next one starting
/// there) keeps its place, and any other starts one. A stream in flight holds the slot of
/// the block it expects; another stream's write there starts its run again. With 4,096
/// slots 97% of the accesses of 200 interleaved streams are followed, with 256 only 62%.
pub(crate) struct Runs {
    next: Box<[(u64, u32)]>,
}

impl Runs {
    const SLOTS: usize = 4096;
    const EMPTY: (u64, u32) = (u64::MAX, 0);

    pub fn new() -> Self {
        Runs { next: vec![Self::EMPTY; Self::SLOTS].into_boxed_slice() }
    }

    fn slot(block: u64) -> usize {
        mix64(block) as usize % Self::SLOTS
    }

    /// Which block of its run `block` is (1: it starts one).
    pub fn access(&mut self, block: u64) -> u32 {
        let after = block.wrapping_add(1);
        let here = Self::slot(block);
        let len = match self.next[here] {
            (next, len) if next == block && len > 0 => {
                self.next[here] = Self::EMPTY;
                len.saturating_add(1)
            }
            _ => match self.next[Self::slot(after)] {
                (next, len) if next == after && len > 0 => return len,
                _ => 1,
            },
        };
        self.next[Self::slot(after)] = (after, len);
        len
    }

    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.next)
    }
}

/// The blocks missed recently, about the last `len` of them, as two generations of a Bloom
/// filter (16 bits and 4 probes per block): a block is remembered while it is in either, and
/// the older one is cleared when the newer one has taken `len / 2` blocks. False positives
/// (about 0.3% with both generations full) let a block through a turn early, and matter
/// more than their share suggests: at 2.4% (10 bits a block) `optgate` lost up to 2.9 points
/// of hits on several traces. The filters are sized to the bit, not to a power of two:
/// `len * 2` bytes in all, probes placed by multiply-shift.
#[derive(Debug)]
pub struct Doorkeeper {
    generations: [Vec<u64>; 2],
    current: usize,
    added: usize,
    per_generation: usize,
}

impl Doorkeeper {
    const PROBES: usize = 4;
    const BITS_PER_BLOCK: usize = 16;

    pub fn new(len: usize) -> Self {
        let per_generation = (len / 2).max(1);
        let words = (per_generation * Self::BITS_PER_BLOCK).div_ceil(64);
        Doorkeeper { generations: [vec![0; words], vec![0; words]], current: 0, added: 0, per_generation }
    }

    /// The bits `block` sets, by double hashing of one 64-bit hash.
    fn probes(&self, block: u64) -> [u64; Self::PROBES] {
        let h = mix64(block);
        // Multiply-shift keeps a probe's high bits, so the step must have high bits too.
        let (a, b) = (h, h.rotate_left(32) | 1);
        let bits = self.generations[0].len() as u128 * 64;
        std::array::from_fn(|i| ((a.wrapping_add((i as u64).wrapping_mul(b)) as u128 * bits) >> 64) as u64)
    }

    fn in_generation(&self, g: usize, bits: &[u64; Self::PROBES]) -> bool {
        bits.iter().all(|&bit| self.generations[g][(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }

    /// Whether `block` was remembered; remembers it either way.
    pub fn check_and_remember(&mut self, block: u64) -> bool {
        let bits = self.probes(block);
        let in_current = self.in_generation(self.current, &bits);
        let seen = in_current || self.in_generation(self.current ^ 1, &bits);
        if !in_current {
            if self.added >= self.per_generation {
                self.current ^= 1;
                self.generations[self.current].fill(0);
                self.added = 0;
            }
            let g = &mut self.generations[self.current];
            for bit in bits {
                g[(bit / 64) as usize] |= 1 << (bit % 64);
            }
            self.added += 1;
        }
        seen
    }

    pub fn bytes(&self) -> usize {
        self.generations.iter().map(|g| g.len() * 8).sum()
    }
}

/// The [`Policy`] methods a wrapper hands to the policy in its field `$inner` unchanged.
macro_rules! delegate {
    ($($inner:ident).+) => {
        fn len(&self) -> usize {
            self.$($inner).+.len()
        }
        fn contains(&self, block: u64) -> bool {
            self.$($inner).+.contains(block)
        }
        fn remove(&mut self, block: u64) -> bool {
            self.$($inner).+.remove(block)
        }
        fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
            self.$($inner).+.insert(block, dirty)
        }
        fn adopt(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
            self.$($inner).+.adopt(block, dirty)
        }
        fn evict_untouched(&mut self) -> Option<u64> {
            self.$($inner).+.evict_untouched()
        }
        fn untouched(&self) -> usize {
            self.$($inner).+.untouched()
        }
        fn set_dirty(&mut self, block: u64) -> bool {
            self.$($inner).+.set_dirty(block)
        }
        fn set_clean(&mut self, block: u64) -> bool {
            self.$($inner).+.set_clean(block)
        }
        fn is_dirty(&self, block: u64) -> bool {
            self.$($inner).+.is_dirty(block)
        }
        fn dirty_len(&self) -> usize {
            self.$($inner).+.dirty_len()
        }
        fn writeback_candidate(&mut self, now_ns: u64) -> Option<u64> {
            self.$($inner).+.writeback_candidate(now_ns)
        }
    };
}
pub(crate) use delegate;

pub struct Adaptive {
    capacity: usize,
    params: Params,
    live: Gated,
    live_idx: usize,
    runs: Runs,
    minis: Vec<Mini>,
    /// LRU in miniature: the promotion budget's yardstick.
    lru: Mini,
    sample: Sampler,
    /// Decayed count of sampled accesses.
    sampled: f64,
    epoch_len: u64,
    in_epoch: u64,
    switches: u64,
}

impl Adaptive {
    pub fn new(capacity: usize, params: &Params) -> Self {
        let (sample, mini_cap) = Sampler::new(capacity, MINI_BLOCKS);
        Adaptive {
            capacity,
            params: params.clone(),
            live: make(CANDIDATES[0], capacity, params),
            live_idx: 0,
            runs: Runs::new(),
            minis: CANDIDATES.iter().map(|&c| Mini::new(make(c, mini_cap, params))).collect(),
            lru: Mini::new(make(c("lru", 0), mini_cap, params)),
            sample,
            sampled: 0.0,
            epoch_len: EPOCH_CAPACITIES * mini_cap as u64,
            in_epoch: 0,
            switches: 0,
        }
    }

    /// The candidate serving now.
    pub fn live(&self) -> Candidate {
        CANDIDATES[self.live_idx]
    }

    /// How many times the live policy was replaced.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    fn end_epoch(&mut self) {
        let scores: Vec<Score> = self.minis.iter().map(|m| m.score).collect();
        let best = choose(&scores, self.lru.score.promotions, self.sampled, BUDGET_HIT_COST);
        let within = |m: &Score| m.promotions <= PROMOTION_BUDGET * self.lru.score.promotions;
        let (live, next) = (&scores[self.live_idx], &scores[best]);
        let ahead = next.hits - live.hits > SWITCH_MARGIN * self.sampled;
        if best != self.live_idx && (ahead || (!within(live) && within(next))) {
            self.switch_to(best);
        }
        for m in &mut self.minis {
            m.score.decay(DECAY);
        }
        self.lru.score.decay(DECAY);
        self.sampled *= DECAY;
    }

    /// Rebuild the live policy as candidate `idx`, keeping the cached blocks and their dirty
    /// flags.
    pub fn switch_to(&mut self, idx: usize) {
        let mut next = make(CANDIDATES[idx], self.capacity, &self.params);
        // The blocks are as good as the outgoing policy's record says: when its miniature
        // hit nearly as often as the incoming one's, they are handed over as the workload's
        // own; otherwise as after a restart, for the incoming policy to replace at once.
        let warm = self.minis[self.live_idx].score.hits >= ADOPT_SHARE * self.minis[idx].score.hits;
        for (block, _) in self.order() {
            let dirty = self.live.inner.is_dirty(block);
            let placed = if warm { next.inner.adopt(block, dirty) } else { next.inner.insert(block, dirty) };
            placed.expect("same capacity, distinct blocks");
        }
        self.live = next;
        self.live_idx = idx;
        self.switches += 1;
    }

    /// The cached blocks, coldest first, as the live policy orders them.
    fn order(&self) -> Vec<(u64, u8)> {
        hints::decode(self.live.inner.name(), &self.live.inner.save_hints()).expect("a policy decodes its own hints")
    }
}

impl Policy for Adaptive {
    delegate!(live.inner);

    fn prefetch(&self, block: u64) {
        self.live.inner.prefetch(block)
    }

    fn prefetch_entry(&self, block: u64) {
        self.live.inner.prefetch_entry(block)
    }

    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn access(&mut self, access: Access) -> Outcome {
        let run = self.runs.access(access.block);
        if self.sample.sampled(access.block) {
            for m in &mut self.minis {
                m.access(access, run);
            }
            self.lru.access(access, run);
            self.sampled += 1.0;
            self.in_epoch += 1;
            if self.in_epoch >= self.epoch_len {
                self.in_epoch = 0;
                self.end_epoch();
            }
        }
        self.live.access(access, run)
    }

    /// The live policy's order, under this policy's name (the tags are dropped: they mean
    /// something only to the candidate that wrote them).
    fn save_hints(&self) -> Vec<u8> {
        hints::encode(self.name(), self.order().into_iter().map(|(b, _)| (b, 0)))
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        if !self.live.inner.is_empty() {
            return Err(HintError::NotEmpty);
        }
        for (block, _) in entries.into_iter().take(self.capacity) {
            // A duplicate in a blob that passed its checksum is skipped, not fatal.
            let _ = self.live.inner.insert(block, false);
        }
        Ok(())
    }

    fn bytes_per_entry(&self) -> f64 {
        let minis: f64 = self
            .minis
            .iter()
            .chain([&self.lru])
            .map(|m| m.policy.bytes_per_entry() * m.policy.inner.capacity() as f64)
            .sum();
        self.live.bytes_per_entry() + (minis + self.runs.bytes() as f64) / self.capacity as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of miniatures that score alike, the later one is chosen, with or without a promotion
    /// budget to keep (see [`choose`]).
    #[test]
    fn a_tie_goes_to_the_later_miniature() {
        let (lavish, frugal) = (Score { hits: 10.0, promotions: 10.0 }, Score { hits: 10.0, promotions: 5.0 });
        assert_eq!(choose(&[lavish, lavish, lavish], 10.0, 100.0, BUDGET_HIT_COST), 2);
        assert_eq!(choose(&[frugal, frugal, lavish], 10.0, 100.0, BUDGET_HIT_COST), 1);
    }

    #[test]
    fn a_doorkeeper_remembers_about_its_length() {
        let mut d = Doorkeeper::new(1000);
        assert!(!d.check_and_remember(7));
        assert!(d.check_and_remember(7));
        // 499 others: 7 is still in a generation.
        for b in 100..599 {
            d.check_and_remember(b);
        }
        assert!(d.check_and_remember(7));
        // Two generations later it is gone.
        for b in 1000..2100 {
            d.check_and_remember(b);
        }
        assert!(!d.check_and_remember(7));
        let false_positives = (1_000_000..1_010_000).filter(|&b| d.check_and_remember(b)).count();
        assert!(false_positives < 100, "{false_positives} false positives in 10,000");
        for len in [1_000, 1 << 20, 1_677_722] {
            let bytes = Doorkeeper::new(len).bytes();
            assert!(bytes <= len * 2 + 16, "{len}: {bytes} bytes");
        }
    }

    #[test]
    fn a_doorkept_policy_promotes_on_the_second_recent_miss() {
        let mut p = make(c("lru", 4), 4, &Params::default());
        assert_eq!(p.access(Access::read(1, 0), 1), Outcome::Miss);
        assert_eq!(p.access(Access::read(1, 0), 1), Outcome::Promote { evict: None });
        assert_eq!(p.access(Access::read(1, 0), 1), Outcome::Hit);
    }

    /// A run doorkeeper stops only the misses from the `run`th block of a sequential run on:
    /// the first blocks of a long run and every block of a short one are promoted at once.
    #[test]
    fn a_run_doorkeeper_stops_only_long_runs() {
        let mut runs = Runs::new();
        let mut p = make(seq("lru", 4), 64, &Params::default());
        let mut outcomes = |blocks: std::ops::Range<u64>| -> Vec<bool> {
            blocks.map(|b| p.access(Access::read(b, 0), runs.access(b)) != Outcome::Miss).collect()
        };
        assert_eq!(outcomes(100..106), [true, true, true, false, false, false]);
        // Short runs, interleaved with others: each block promoted on its first miss.
        for start in [200, 300, 400] {
            assert_eq!(outcomes(start..start + 3), [true; 3]);
        }
        // The long run read again: its first blocks hit, the ones stopped are promoted now.
        assert_eq!(outcomes(100..106), [true; 6]);
        assert!((100..106).all(|b| p.inner.contains(b)));
    }

    #[test]
    fn runs_follow_interleaved_streams() {
        let mut runs = Runs::new();
        let got: Vec<u32> = [10, 500, 11, 501, 12, 502, 503, 7, 13].iter().map(|&b| runs.access(b)).collect();
        assert_eq!(got, [1, 1, 2, 2, 3, 3, 4, 1, 4]);
        // A run's last block read again keeps its place, and the run goes on after it.
        assert_eq!([13, 13, 14, 504].map(|b| runs.access(b)), [4, 4, 5, 5]);
        // Any other block read again starts a run.
        assert_eq!(runs.access(11), 1);
        // Block numbers wrap, and an empty slot is no run, not even one expecting u64::MAX.
        let mut runs = Runs::new();
        assert_eq!(runs.access(u64::MAX - 1), 1);
        let got = [u64::MAX - 1, u64::MAX, u64::MAX, 0, 0, 1].map(|b| runs.access(b));
        assert_eq!(got, [1, 2, 2, 3, 3, 4]);
        assert_eq!(Runs::new().access(u64::MAX), 1);
    }

    /// Two hundred streams read in turn, a block of each at a time, some blocks twice: nearly
    /// every access is seen to go on from its stream's last one (a collision in the table
    /// starts the stream's run again).
    #[test]
    fn runs_follow_many_interleaved_streams() {
        let mut runs = Runs::new();
        let mut last = [0u32; 200];
        let (mut followed, mut total) = (0, 0);
        for i in 0..20u64 {
            for (s, last) in last.iter_mut().enumerate() {
                let block = s as u64 * 1_000_000 + i;
                for again in 0..1 + (s as u64 + i) % 3 / 2 {
                    let len = runs.access(block);
                    followed += (len == *last + (again == 0) as u32) as u32;
                    total += 1;
                    *last = len;
                }
            }
        }
        assert!(followed * 10 >= total * 9, "{followed} of {total} accesses followed their stream");
    }

    #[test]
    fn a_switch_keeps_the_cached_blocks_and_their_dirt() {
        let mut p = Adaptive::new(64, &Params::default());
        for b in 0..64 {
            p.insert(b, b % 3 == 0).unwrap();
        }
        for (idx, &candidate) in CANDIDATES.iter().enumerate().skip(1) {
            p.switch_to(idx);
            assert_eq!(p.live(), candidate);
            assert_eq!(p.len(), 64);
            assert_eq!(p.dirty_len(), 22);
            assert!((0..64).all(|b| p.contains(b) && p.is_dirty(b) == (b % 3 == 0)));
        }
        assert_eq!(p.switches(), CANDIDATES.len() as u64 - 1);
    }

    /// Blocks handed over at a switch are the workload's own, not a restart's leftovers:
    /// strata, switched to with a full cache, admits a new block only on its usual evidence
    /// and keeps every block it took over, where after a restart (insert) it would admit
    /// every miss until the restored blocks were gone.
    #[test]
    fn a_switch_to_strata_does_not_restart_its_warm_up() {
        let mut p = Adaptive::new(64, &Params::default());
        p.switch_to(CANDIDATES.iter().position(|&x| x == c("s3fifo", 0)).unwrap());
        for b in 0..64 {
            p.insert(b, false).unwrap();
        }
        p.switch_to(CANDIDATES.iter().position(|&x| x == c("strata", 0)).unwrap());
        for b in 1000..1016 {
            assert_eq!(p.access(Access::read(b, 0)), Outcome::Miss, "block {b}");
        }
        assert!((0..64).all(|b| p.contains(b)));
    }

    /// The budget holds while it costs at most a point of hits: a frugal candidate 0.5 point
    /// behind the best is chosen, one 2 points behind is not.
    #[test]
    fn the_budget_may_cost_at_most_a_point_of_hits() {
        let plain = CANDIDATES.iter().position(|&x| x == c("s3fifo", 0)).unwrap();
        let frugal = CANDIDATES.iter().position(|&x| x == c("arc", 4)).unwrap();
        for (frugal_hits, chosen) in [(495.0, frugal), (480.0, plain)] {
            let mut p = Adaptive::new(1000, &Params::default());
            (p.sampled, p.lru.score.promotions) = (1000.0, 100.0);
            for (i, m) in p.minis.iter_mut().enumerate() {
                (m.score.hits, m.score.promotions) = match i {
                    _ if i == plain => (500.0, 95.0),
                    _ if i == frugal => (frugal_hits, 50.0),
                    _ => (100.0, 50.0),
                };
            }
            p.end_epoch();
            assert_eq!(p.live(), CANDIDATES[chosen], "frugal candidate at {frugal_hits} hits");
        }
    }

    /// A hot set a fifth of the cache, hit between long scans of blocks read once: S3-FIFO
    /// promotes every scanned block, over the budget, so the live policy must end behind a
    /// doorkeeper (or be strata, which admits on a second reference).
    #[test]
    fn scans_between_hot_blocks_choose_a_doorkeeper() {
        let mut p = Adaptive::new(1000, &Params::default());
        p.switch_to(CANDIDATES.iter().position(|&x| x == c("s3fifo", 0)).unwrap());
        let mut scan = 1_000_000u64;
        for _ in 0..400 {
            for b in 0..200 {
                p.access(Access::read(b, 0));
            }
            for _ in 0..2000 {
                p.access(Access::read(scan, 0));
                scan += 1;
            }
        }
        assert!(p.live().doorkeeper > 0 || p.live().policy == "strata", "{:?}", p.live());
        let hot = (0..200).filter(|&b| p.contains(b)).count();
        assert!(hot >= 190, "{:?}: {hot} of the 200 hot blocks cached", p.live());
    }
}
