//! optgate: S3-FIFO behind an admission gate learnt from what Belady would have done.
//!
//! * [`OptGen`] (Jain and Lin, "Back to the Future: Leveraging Belady's Algorithm for
//!   Improved Cache Replacement", ISCA 2016) follows a window of recent accesses and, for
//!   each re-access, says whether Belady with bypass, at a given capacity, would have kept
//!   the block since its previous access. It keeps, per access time, how many blocks OPT
//!   holds across that time (the occupancy); a block re-accessed at `t` after `p` was kept
//!   when every time in `[p, t)` still had room, and then takes a place in each. Taking the
//!   intervals in the order they end is the optimal schedule, so with a window as long as
//!   the trace its count of kept blocks is OPT's hit count (the tests check this against
//!   [`Opt`](crate::Opt)). It runs on a spatial sample of the blocks, at the capacity
//!   divided by the sampling rate (up to [`TRAINING_SAMPLES`] times the miniatures' sample
//!   below: about 6,144 blocks, or a 128th of the cache's where that is more), over a window
//!   of [`WINDOW_CAPACITIES`] of those capacities (rounded up to a power of two).
//! * A [`Predictor`] learns from those verdicts, in 3-bit counters, under the signature of
//!   the access that opened each interval: the block's region ([`REGION_BLOCKS`] blocks) and
//!   whether it was a read or a write. A signature with no verdict yet follows its class (read
//!   or write) as a whole. Nothing in it needs the block's own history, which the gate only
//!   knows for sampled blocks: a signature that told re-accessed sampled blocks apart (they
//!   had been seen within the window) let the miniatures admit re-accesses the live gate, for
//!   which every other block looks new, declined; it chose stricter levels than it could
//!   serve (in sample 15 of 24 cells held the rule, 17 without it; held out 48 of 60, 49).
//! * The gate lets a miss through to S3-FIFO at a *level*: level 0 lets every miss through
//!   (S3-FIFO alone), level `l` those whose signature's counter is at least `l - 1`. Each
//!   level comes without a *doorkeeper* (a two-generation Bloom filter of the blocks missed
//!   within about [`DOOR`] cache capacities), with one for every miss, and with one for the
//!   misses of long sequential runs alone (from a run's [`LONG_RUN`]th block on: a scan's
//!   blocks, often read once, knock twice, and the short requests around them do not pay
//!   for it). Behind it, a whole-block miss it stops goes in only on the block's second
//!   recent miss, a partial one at once (the rest of its stream is about to touch the block:
//!   `strata`'s second-reference and partial-access admission, which the predictor cannot
//!   learn where one-touch and reused blocks share regions and the sample does not see the
//!   block's history). While the cache has room, every miss goes in, whatever the level
//!   (smq's and `strata`'s "promote readily"): an empty block costs no eviction, and a gate
//!   that keeps a filling cache empty loses hits. Blocks cached at a restart and untouched
//!   since count as room (S3-FIFO evicts them first), so a cache full of another workload's
//!   blocks fills as an empty one would.
//! * How strict to be depends on the workload (where OPT declines what S3-FIFO would hit
//!   soon after, a strict gate loses hits; where S3-FIFO's promotions are mostly wasted, it
//!   saves them), so the level is chosen the way `adaptive` chooses a policy: S3-FIFO in
//!   miniature behind the gate at every level with each kind of doorkeeper, and LRU, run
//!   on the sampled blocks, and at the end of each epoch (one miniature capacity of sampled
//!   accesses) the live gate takes the level whose miniature hits most within the promotion
//!   budget, unless that is more than [`BUDGET_HIT_COST`] of the sampled accesses behind the
//!   one with the most (`adaptive`'s choice and allowance). Changing level costs
//!   nothing: S3-FIFO's state stays as it is, and the live doorkeeper remembers every miss
//!   whether or not it is in use.
//! * The miniatures run free, each with its own contents, and a strict level's miniature can
//!   hold blocks the live cache, which ran at a laxer level, lacks: it hits them, draws the
//!   choice, and the strict gate then keeps them out of the live cache (on P12 at 1% the
//!   choice did worse than any of levels 0–2 held alone). So a second set of the same
//!   miniatures is started at each epoch's end from the state of the level in force, the live
//!   cache's contents in miniature, and a switch to a stricter level (one that lets in no
//!   miss the level in force would not) goes ahead unless, in that set's scores (decayed as
//!   the others are), the level in force hits more than [`BUDGET_HIT_COST`] of the sampled
//!   accesses more than the one chosen (a lead the choice between the two would keep
//!   whatever their promotions). A switch to a level that lets in some
//!   misses the one in force does not is never vetoed: there the live cache takes in what
//!   that level's miniature holds. Started from one state every epoch, the second set alone
//!   chooses worse (it cannot see what a level would hold after a long stretch at it), so
//!   it only vetoes.
//! * A hit on the block the access just before touched is taken for one reference going
//!   on, not a re-use: S3-FIFO behind the gate, live and in miniature, does not count it
//!   towards the block's frequency. Where cache blocks are larger than requests that is
//!   mostly a stream's next request starting inside the block its last one ended in, so a
//!   block a stream reads through in several requests, with no other access between them,
//!   leaves the small queue as a block read once does rather than passing for a frequently
//!   used one. The check is that one block number, whatever the stream and whether or not
//!   the access covers the whole block. With it 205 of the 258 cells out of sample held
//!   against 201, and 23 of the 24 in sample as before (`docs/BENCHMARKS.md`).
//! * Where the miniatures are the cache itself (a cache of up to [`OPT_BLOCKS`] blocks, not
//!   sampled), two more run at the level in force: S3-FIFO with its small queue a tenth of
//!   the cache, and S3-FIFO with it adapting as ARC's recency list does
//!   ([`S3Fifo::adaptive`]). At each epoch's end the live cache's small queue takes the
//!   adapting one's size while that one hits more than [`BUDGET_HIT_COST`] of the sampled
//!   accesses more and promotes no more than the fixed one or the budget allows, and a
//!   tenth of the cache otherwise (set dueling). The live cache takes the size alone: it has
//!   no second ghost queue, so a miss on a block its main queue evicted goes to the small
//!   queue there. In a small cache of large blocks many streams read through blocks at
//!   once, and a block can leave a small queue of a few dozen blocks before its stream comes
//!   back to it. In sampled miniatures the adapting one's lead did not carry over to the
//!   live cache (CloudPhysics at 13,461 blocks: 15.82% of hits fell to 14.56), so larger
//!   caches keep a tenth.
//!
//! Its state beside S3-FIFO's (31.5 bytes per cached block with its ghosts at half a cache,
//! see [`s3fifo`]): the predictor's counters take 256 KiB whatever the cache's size, the
//! live doorkeeper 2 bytes per cached block, and OPTgen and the fifty-five miniatures (two
//! sets of twenty-seven S3-FIFOs, and an LRU; two more in a cache too small to sample) and
//! the table of sequential runs (4,096 slots, 64 KiB; every access looks its run up there)
//! the rest: about 3.4 MB in all up to three quarters of a million cached blocks, and under
//! 5 bytes per cached block beyond (3.81 at a million), so the whole policy takes about 37
//! to 38.5 bytes per cached block from a million blocks up. An access OPTgen follows costs a
//! segment-tree walk, and one the miniatures see an access to each of them; the
//! miniatures' sample is at most one access in [`SAMPLE_SHARE`] once the cache holds more
//! than that many times [`OPT_BLOCKS`] blocks, and about one in ninety for the simulator's
//! throughput benchmark, where the policy runs below S3-FIFO alone since the doorkeeper for
//! long runs (`docs/BENCHMARKS.md`).

use std::collections::HashMap;

use super::adaptive::{choose, Doorkeeper, Runs, Sampler, Score, BUDGET_HIT_COST, PROMOTION_BUDGET};
use super::lru::Lru;
use super::s3fifo::S3Fifo;
use crate::hash::{mix64, StdBlockMap};
use crate::{hints, Access, HintError, InsertError, Op, Outcome, Params, Policy};

/// A segment tree over a ring of `2^k` time slots: add to a range, read a range's maximum,
/// set one slot to zero. A node's maximum counts its own pending add and those below it, so
/// the root's is every slot's; a range's read first pushes the pending adds above its two
/// ends down to their children, and every walk is a loop, leaves to root or root to leaves.
struct MaxTree {
    leaves: usize,
    max: Vec<i32>,
    /// Pending adds; only an inner node's are read (a leaf's maximum is its value).
    add: Vec<i32>,
}

impl MaxTree {
    fn new(leaves: usize) -> Self {
        assert!(leaves.is_power_of_two());
        MaxTree { leaves, max: vec![0; 2 * leaves], add: vec![0; 2 * leaves] }
    }

    fn apply(&mut self, n: usize, v: i32) {
        self.max[n] += v;
        self.add[n] += v;
    }

    /// Recomputes the maxima above node `n`.
    fn pull(&mut self, mut n: usize) {
        while n > 1 {
            n /= 2;
            self.max[n] = self.add[n] + self.max[2 * n].max(self.max[2 * n + 1]);
        }
    }

    /// Moves the pending adds above node `n` down, root first, so its maximum is its slots'.
    fn push(&mut self, n: usize) {
        for shift in (1..=self.leaves.trailing_zeros()).rev() {
            let a = n >> shift;
            let v = std::mem::take(&mut self.add[a]);
            if v != 0 {
                self.apply(2 * a, v);
                self.apply(2 * a + 1, v);
            }
        }
    }

    /// Adds `v` to every slot of `[lo, hi)` (not empty).
    fn add_range(&mut self, lo: usize, hi: usize, v: i32) {
        let (mut l, mut r) = (lo + self.leaves, hi + self.leaves);
        while l < r {
            if l & 1 == 1 {
                self.apply(l, v);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.apply(r, v);
            }
            l /= 2;
            r /= 2;
        }
        self.pull(lo + self.leaves);
        self.pull(hi - 1 + self.leaves);
    }

    /// The largest slot of `[lo, hi)` (not empty).
    fn max_range(&mut self, lo: usize, hi: usize) -> i32 {
        let (mut l, mut r) = (lo + self.leaves, hi + self.leaves);
        self.push(l);
        self.push(r - 1);
        let mut max = i32::MIN;
        while l < r {
            if l & 1 == 1 {
                max = max.max(self.max[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                max = max.max(self.max[r]);
            }
            l /= 2;
            r /= 2;
        }
        max
    }

    /// The largest slot.
    fn max(&self) -> i32 {
        self.max[1]
    }

    /// Sets slot `i` to zero.
    fn clear(&mut self, i: usize) {
        let leaf = self.leaves + i;
        self.push(leaf);
        self.max[leaf] = 0;
        self.pull(leaf);
    }
}

/// One access in the window: the block, its signature, and whether its interval is still
/// open (the block not accessed again yet).
#[derive(Clone, Copy)]
struct Slot {
    block: u64,
    sig: Sig,
    open: bool,
}

/// What the predictor learns under: an index into its counters, and the class a signature
/// without a verdict follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sig {
    index: u32,
    class: u8,
}

/// OPTgen over a window of `window` accesses for a cache of `capacity` blocks.
pub struct OptGen {
    capacity: i32,
    mask: u64,
    tree: MaxTree,
    ring: Vec<Slot>,
    last: StdBlockMap<u64>,
    now: u64,
}

impl OptGen {
    /// A window of at least `window` accesses (rounded up to a power of two).
    pub fn new(capacity: usize, window: usize) -> Self {
        let slots = window.max(2).next_power_of_two();
        let empty = Slot { block: u64::MAX, sig: Sig::default(), open: false };
        OptGen {
            capacity: capacity.min(i32::MAX as usize) as i32,
            mask: slots as u64 - 1,
            tree: MaxTree::new(slots),
            ring: vec![empty; slots],
            last: HashMap::with_capacity_and_hasher(slots, Default::default()),
            now: 0,
        }
    }

    /// Records an access to `block` under `sig`, and calls `verdict(sig, kept)` for each
    /// interval closed by it: the one `block`'s previous access opened (kept or not), and
    /// the one leaving the window unclosed (not kept).
    pub fn access(&mut self, block: u64, sig: Sig, mut verdict: impl FnMut(Sig, bool)) {
        let slot = (self.now & self.mask) as usize;
        let old = self.ring[slot];
        if old.open {
            verdict(old.sig, false);
            self.last.remove(&old.block);
        }
        self.tree.clear(slot);
        if let Some(prev) = self.last.insert(block, self.now) {
            let p = (prev & self.mask) as usize;
            let ranges = if p < slot { [(p, slot), (0, 0)] } else { [(p, self.ring.len()), (0, slot)] };
            // No slot of the window is full where the whole window's maximum is below capacity.
            let full = self.tree.max() >= self.capacity
                && ranges.iter().any(|&(lo, hi)| lo < hi && self.tree.max_range(lo, hi) >= self.capacity);
            if !full {
                for (lo, hi) in ranges {
                    if lo < hi {
                        self.tree.add_range(lo, hi, 1);
                    }
                }
            }
            self.ring[p].open = false;
            verdict(self.ring[p].sig, !full);
        }
        self.ring[slot] = Slot { block, sig, open: true };
        self.now += 1;
    }

    fn bytes(&self) -> usize {
        // Per slot: the ring's entry and the tree's two arrays of two `i32`s per leaf.
        self.ring.len() * (std::mem::size_of::<Slot>() + 16) + crate::hash::std_map_bytes(&self.last)
    }
}

/// 3-bit counters of OPT's verdicts per signature, and per class a wider one over every
/// verdict of the class, for signatures with none yet.
pub struct Predictor {
    counters: Vec<u8>,
    classes: [u8; 2],
}

/// A counter with no verdict yet.
const UNTRAINED: u8 = u8::MAX;
const COUNTER_MAX: u8 = 7;
/// Where a counter's first verdict puts it: just on the side of that verdict.
const FIRST_KEPT: u8 = 4;
const CLASS_MAX: u8 = 63;
/// A class lets its untrained signatures through from here (it starts here).
const CLASS_ADMITS: u8 = 32;
const COUNTER_BITS: u32 = 18;
/// Blocks per region of a signature.
const REGION_BLOCKS: u64 = 256;

impl Predictor {
    pub fn new() -> Self {
        Predictor { counters: vec![UNTRAINED; 1 << COUNTER_BITS], classes: [CLASS_ADMITS; 2] }
    }

    /// The signature of an access to `block` by `op`.
    pub fn sig(&self, block: u64, op: Op) -> Sig {
        let class = (op == Op::Write) as u8;
        let index = (mix64((block / REGION_BLOCKS) << 1 | class as u64) >> (64 - COUNTER_BITS)) as u32;
        Sig { index, class }
    }

    /// Whether the gate at `level` lets a miss under `sig` through.
    pub fn admits(&self, sig: Sig, level: u8) -> bool {
        if level == 0 {
            return true;
        }
        match self.counters[sig.index as usize] {
            UNTRAINED => self.classes[sig.class as usize] >= CLASS_ADMITS,
            c => c >= level - 1,
        }
    }

    pub fn train(&mut self, sig: Sig, kept: bool) {
        let c = &mut self.counters[sig.index as usize];
        *c = match (*c, kept) {
            (UNTRAINED, true) => FIRST_KEPT,
            (UNTRAINED, false) => FIRST_KEPT - 1,
            (c, true) => (c + 1).min(COUNTER_MAX),
            (c, false) => c.saturating_sub(1),
        };
        let k = &mut self.classes[sig.class as usize];
        *k = if kept { (*k + 1).min(CLASS_MAX) } else { k.saturating_sub(1) };
    }
}

impl Default for Predictor {
    fn default() -> Self {
        Self::new()
    }
}

/// Target size of the miniatures, in blocks, at the least.
const OPT_BLOCKS: usize = 1_024;
/// The miniatures are at least this fraction (`1 / SAMPLE_SHARE`) of the cache: a larger
/// cache sees its sample's blocks fewer times in a given stretch of accesses.
const SAMPLE_SHARE: usize = 768;
/// How many times the miniatures' sample OPTgen follows (where the cache is large enough to
/// be sampled that thinly): a signature's counter learns from the verdicts on its region's
/// sampled blocks, and at a 768th of a large cache only about one region of
/// [`REGION_BLOCKS`] in four holds a sampled block.
const TRAINING_SAMPLES: usize = 6;
/// OPTgen's window, in its capacities.
const WINDOW_CAPACITIES: usize = 2;
/// The gate's levels: 0 (every miss) to this.
const TOP_LEVEL: u8 = 8;
/// The level before the first epoch ends.
const FIRST_LEVEL: u8 = 3;
/// What an epoch's end keeps of the miniatures' scores.
const DECAY: f64 = 0.8;
/// Capacities the doorkeeper remembers.
const DOOR: usize = 1;
/// Where a sequential run becomes long: the doorkeeper for long runs stops the misses of a
/// run's blocks from this one on. At cache blocks of 64 KiB that is 4 MiB, bcache's
/// `sequential_cutoff` and the cache target's own default one, past which a stream's
/// requests bypass the policy altogether; there the cutoff does this doorkeeper's work, and
/// the doorkeeper matters at smaller blocks (from 256 KiB of a stream at 4 KiB blocks) or
/// with the cutoff off, as in the simulator. 32 or 128 blocks held as many of the rule's
/// cells or one fewer (`docs/BENCHMARKS.md`).
const LONG_RUN: u32 = 64;

/// Which misses a level's doorkeeper stops (a whole-block miss on a block not missed
/// recently), from the laxest to the strictest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Door {
    Off,
    /// The misses of a sequential run's blocks from the [`LONG_RUN`]th on: a long run's
    /// blocks are often read once (a scan, a backup, a copy), the rest more often again.
    LongRuns,
    Every,
}

impl Door {
    const ALL: [Door; 3] = [Door::Off, Door::LongRuns, Door::Every];

    /// Whether it stops a miss on the `run`th block of its sequential run.
    fn stops(self, run: u32) -> bool {
        match self {
            Door::Off => false,
            Door::LongRuns => run >= LONG_RUN,
            Door::Every => true,
        }
    }

    /// A miss on `block`, the `run`th of its run, knocks at `door`, which remembers every
    /// miss whether this kind stops it or not: where it does, whether `door` had seen the
    /// block miss before.
    fn knock(self, door: &mut Doorkeeper, block: u64, run: u32) -> Option<bool> {
        let knocked = door.check_and_remember(block);
        self.stops(run).then_some(knocked)
    }
}

/// The S3-FIFO behind the gate, live and in miniature. Its ghost queue remembers half a
/// cache of blocks, as 2Q's does, rather than S3-FIFO's 90%: a block missed again within
/// that span goes to the main queue, and a longer span, letting in blocks of longer reuse,
/// held fewer of the rule's cells out of sample (`docs/BENCHMARKS.md`, "ghosts for half a
/// cache").
fn s3fifo(capacity: usize) -> S3Fifo {
    S3Fifo::with_ghosts(capacity, capacity / 2)
}

/// Whether a miss on `access` goes into `policy`: always while it has room (it is filling,
/// or holds blocks untouched since a restart, which make room first); otherwise when the
/// gate at `level` lets `sig` through and, where a doorkeeper stops the miss (`knocked` is
/// whether it had seen the block miss; `None` where none stops it), the access covers part
/// of the block or is the block's second recent miss.
fn lets_in(
    policy: &dyn Policy,
    predictor: &Predictor,
    level: u8,
    knocked: Option<bool>,
    access: Access,
    sig: Sig,
) -> bool {
    policy.len() < policy.capacity()
        || policy.untouched() > 0
        || (knocked.is_none_or(|k| k || !access.full_block) && predictor.admits(sig, level))
}

/// A policy behind the gate, told whether an access re-touches the block the access just
/// before touched (taken for one reference going on rather than a re-use). S3-FIFO does
/// not count such a hit towards the block's frequency; LRU keeps none.
trait Behind: Policy + Sized {
    fn access_behind(&mut self, access: Access, retouch: bool, admit: impl FnOnce(&Self) -> bool) -> Outcome;
}

impl Behind for S3Fifo {
    fn access_behind(&mut self, access: Access, retouch: bool, admit: impl FnOnce(&Self) -> bool) -> Outcome {
        self.access_counting(access, !retouch, admit)
    }
}

impl Behind for Lru {
    fn access_behind(&mut self, access: Access, _retouch: bool, admit: impl FnOnce(&Self) -> bool) -> Outcome {
        self.access_admitting(access, admit)
    }
}

/// A policy in miniature behind the gate at one level and one kind of doorkeeper.
struct Mini<P> {
    level: u8,
    kind: Door,
    /// The blocks missed recently (every miss, whichever it stops); none without a door.
    door: Option<Doorkeeper>,
    policy: P,
    score: Score,
}

impl<P: Behind> Mini<P> {
    fn new(level: u8, kind: Door, policy: P) -> Self {
        let door = (kind != Door::Off).then(|| Doorkeeper::new(policy.capacity() * DOOR));
        Mini { level, kind, door, policy, score: Score::default() }
    }

    /// Feeds it a sampled access, the `run`th block of its sequential run (`retouch`: see
    /// [`Behind`]).
    fn access(&mut self, predictor: &Predictor, access: Access, sig: Sig, run: u32, retouch: bool) {
        let (kind, level, door) = (self.kind, self.level, &mut self.door);
        self.score.count(self.policy.access_behind(access, retouch, |policy| {
            let knocked = door.as_mut().and_then(|d| kind.knock(d, access.block, run));
            lets_in(policy, predictor, level, knocked, access, sig)
        }));
    }

    /// A miniature that follows the level in force ([`Mini::follow`]): its doorkeeper
    /// remembers every miss from the start, as the live one does, whichever kind is in use.
    fn following(policy: P) -> Self {
        let door = Some(Doorkeeper::new(policy.capacity() * DOOR));
        Mini { door, ..Mini::new(FIRST_LEVEL, Door::Off, policy) }
    }

    /// Takes `other`'s level and kind of doorkeeper.
    fn follow(&mut self, other: &Self) {
        (self.level, self.kind) = (other.level, other.kind);
    }

    /// Whether every miss it lets in, `other` would let in too.
    fn no_laxer_than(&self, other: &Self) -> bool {
        self.level >= other.level && self.kind >= other.kind
    }

    fn bytes(&self) -> usize {
        (self.policy.bytes_per_entry() * self.policy.capacity() as f64) as usize
            + self.door.as_ref().map_or(0, Doorkeeper::bytes)
    }
}

/// The gate's levels in miniature, each with every kind of doorkeeper: the doorless ones
/// first, then those for long runs, then those for every miss, each from level 0 up (see
/// [`level_index`]).
fn levels(capacity: usize) -> Vec<Mini<S3Fifo>> {
    Door::ALL
        .into_iter()
        .flat_map(|kind| (0..=TOP_LEVEL).map(move |level| Mini::new(level, kind, s3fifo(capacity))))
        .collect()
}

/// Where [`levels`] puts a level with a kind of doorkeeper.
fn level_index(level: u8, kind: Door) -> usize {
    kind as usize * (TOP_LEVEL as usize + 1) + level as usize
}

pub struct OptGate {
    inner: S3Fifo,
    /// The blocks the miniatures see.
    sample: Sampler,
    /// The blocks OPTgen sees (every block `sample` holds, and more).
    training: Sampler,
    optgen: OptGen,
    predictor: Predictor,
    /// The level in force: its miniature's index in `minis` (and in `from_live`).
    in_force: usize,
    live_door: Doorkeeper,
    /// The sequential runs of every access (the doorkeeper for long runs needs them).
    runs: Runs,
    minis: Vec<Mini<S3Fifo>>,
    /// The same levels started each epoch from the state of the level in force (the live
    /// cache's contents, in miniature): they may veto a switch to a stricter level.
    from_live: Vec<Mini<S3Fifo>>,
    /// LRU in miniature: the promotion budget's yardstick.
    lru: Mini<Lru>,
    /// S3-FIFO in miniature at the level in force, with its small queue a tenth of the cache
    /// and with it adapting ([`S3Fifo::adaptive`]): while the adapting one hits clearly more,
    /// the live cache's small queue takes its size. Only where the miniatures are the cache
    /// itself (not sampled).
    duel: Vec<Mini<S3Fifo>>,
    /// Decayed count of sampled accesses.
    sampled: f64,
    epoch_len: u64,
    in_epoch: u64,
    /// The block the previous access touched.
    last: u64,
}

impl OptGate {
    pub fn new(capacity: usize, _params: &Params) -> Self {
        let (sample, mini_cap) = Sampler::new(capacity, OPT_BLOCKS.max(capacity / SAMPLE_SHARE));
        let (training, opt_cap) = Sampler::new(capacity, TRAINING_SAMPLES * mini_cap);
        OptGate {
            inner: s3fifo(capacity),
            sample,
            training,
            optgen: OptGen::new(opt_cap, WINDOW_CAPACITIES * opt_cap),
            predictor: Predictor::new(),
            in_force: level_index(FIRST_LEVEL, Door::Off),
            live_door: Doorkeeper::new(capacity * DOOR),
            runs: Runs::new(),
            minis: levels(mini_cap),
            from_live: levels(mini_cap),
            lru: Mini::new(0, Door::Off, Lru::new(mini_cap)),
            duel: if mini_cap == capacity {
                vec![Mini::following(s3fifo(mini_cap)), Mini::following(S3Fifo::adaptive(mini_cap, mini_cap / 2))]
            } else {
                Vec::new()
            },
            sampled: 0.0,
            epoch_len: mini_cap as u64,
            in_epoch: 0,
            last: u64::MAX,
        }
    }

    /// The gate's level now (0: every miss goes through).
    pub fn level(&self) -> u8 {
        self.minis[self.in_force].level
    }

    /// The doorkeeper in use now.
    #[cfg(test)]
    fn door(&self) -> Door {
        self.minis[self.in_force].kind
    }

    /// Feeds a sampled access (the `run`th block of its sequential run) to the miniatures; at
    /// an epoch's end, sets the level.
    fn sample(&mut self, access: Access, sig: Sig, run: u32, retouch: bool) {
        for m in self.minis.iter_mut().chain(&mut self.from_live) {
            m.access(&self.predictor, access, sig, run, retouch);
        }
        self.lru.access(&self.predictor, access, sig, run, retouch);
        self.sampled += 1.0;
        self.in_epoch += 1;
        if self.in_epoch == self.epoch_len {
            self.in_epoch = 0;
            self.end_epoch();
        }
        // At the level the live cache takes this access at, an epoch's end just now included.
        for m in &mut self.duel {
            m.access(&self.predictor, access, sig, run, retouch);
        }
    }

    /// Takes the level for the next epoch, starts the second set from the live cache's
    /// contents, and decays the scores.
    fn end_epoch(&mut self) {
        let scores: Vec<Score> = self.minis.iter().map(|m| m.score).collect();
        let now = self.in_force;
        let mut pick = choose(&scores, self.lru.score.promotions, self.sampled, BUDGET_HIT_COST);
        if pick != now && self.minis[pick].no_laxer_than(&self.minis[now]) {
            // A stricter gate is chosen, yet started from the live cache's contents the level
            // in force does clearly better: what drew the choice there is what that level's
            // miniature holds and the live cache does not, which the stricter gate would keep
            // out. (A gate that lets in everything the one in force does lets the live cache
            // take in what its miniature holds.)
            let (stay, go) = (self.from_live[now].score, self.from_live[pick].score);
            if stay.hits - go.hits > BUDGET_HIT_COST * self.sampled {
                pick = now;
            }
        }
        let (before, rest) = self.from_live.split_at_mut(now);
        let (live, after) = rest.split_first_mut().expect("the level in force has its miniature");
        for m in before.iter_mut().chain(after) {
            m.policy.clone_from(&live.policy);
        }
        self.in_force = pick;
        if let [fixed, adapting] = &self.duel[..] {
            // The adapting queue's size while it hits clearly more, and promotes no more than
            // the fixed one or the budget allows; the fixed one's (a tenth) otherwise.
            let (f, a) = (fixed.score, adapting.score);
            let adapt = a.hits - f.hits > BUDGET_HIT_COST * self.sampled
                && a.promotions <= f.promotions.max(PROMOTION_BUDGET * self.lru.score.promotions);
            self.inner.set_small_cap(if adapt { adapting } else { fixed }.policy.small_cap());
        }
        for m in &mut self.duel {
            m.follow(&self.minis[pick]);
        }
        for m in self.minis.iter_mut().chain(&mut self.from_live).chain(&mut self.duel) {
            m.score.decay(DECAY);
        }
        self.lru.score.decay(DECAY);
        self.sampled *= DECAY;
    }
}

impl Policy for OptGate {
    super::adaptive::delegate!(inner);

    fn name(&self) -> &'static str {
        "optgate"
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    /// The live cache's map slot and, for a block of the miniatures' sample, theirs: a
    /// sampled access looks its block up in every miniature.
    fn prefetch(&self, block: u64) {
        self.inner.prefetch(block);
        if self.sample.sampled(block) {
            for m in self.minis.iter().chain(&self.from_live) {
                m.policy.prefetch(block);
            }
            self.lru.policy.prefetch(block);
        }
    }

    fn prefetch_entry(&self, block: u64) {
        self.inner.prefetch_entry(block);
        if self.sample.sampled(block) {
            for m in self.minis.iter().chain(&self.from_live) {
                m.policy.prefetch_entry(block);
            }
        }
    }

    fn access(&mut self, access: Access) -> Outcome {
        let retouch = std::mem::replace(&mut self.last, access.block) == access.block;
        let sig = self.predictor.sig(access.block, access.op);
        let run = self.runs.access(access.block);
        if self.training.sampled(access.block) {
            let predictor = &mut self.predictor;
            self.optgen.access(access.block, sig, |s, kept| predictor.train(s, kept));
            // The miniatures' sample lies within OPTgen's: most accesses are checked against one.
            if self.sample.sampled(access.block) {
                self.sample(access, sig, run, retouch);
            }
        }
        let (gate, live_door, predictor) = (&self.minis[self.in_force], &mut self.live_door, &self.predictor);
        self.inner.access_behind(access, retouch, |inner| {
            let knocked = gate.kind.knock(live_door, access.block, run);
            lets_in(inner, predictor, gate.level, knocked, access, sig)
        })
    }

    fn save_hints(&self) -> Vec<u8> {
        let entries =
            hints::decode(self.inner.name(), &self.inner.save_hints()).expect("a policy decodes its own hints");
        hints::encode(self.name(), entries.into_iter())
    }

    fn load_hints(&mut self, bytes: &[u8]) -> Result<(), HintError> {
        let entries = hints::decode(self.name(), bytes)?;
        self.inner.load_hints(&hints::encode(self.inner.name(), entries.into_iter()))
    }

    fn bytes_per_entry(&self) -> f64 {
        let minis: usize = self.minis.iter().chain(&self.from_live).chain(&self.duel).map(Mini::bytes).sum::<usize>()
            + self.lru.bytes();
        let own =
            self.optgen.bytes() + self.predictor.counters.len() + minis + self.live_door.bytes() + self.runs.bytes();
        self.inner.bytes_per_entry() + own as f64 / self.capacity() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build, Opt};

    fn opt_hits(capacity: usize, blocks: &[u64]) -> u64 {
        let mut opt = Opt::new(capacity, blocks);
        blocks.iter().filter(|&&b| opt.access(Access::read(b, 0)).is_hit()).count() as u64
    }

    fn optgen_kept(capacity: usize, blocks: &[u64]) -> u64 {
        let mut g = OptGen::new(capacity, blocks.len() + 1);
        let sig = Predictor::new().sig(0, Op::Read);
        let mut kept = 0;
        for &b in blocks {
            g.access(b, sig, |_, k| kept += k as u64);
        }
        kept
    }

    /// The bound for the default policy's state: at most 40 bytes per cached block
    /// from a million blocks up (S3-FIFO's entries, ghosts and map, the live doorkeeper, and
    /// the samples' OPTgen, miniatures and predictor spread over the blocks); that last part
    /// at most 3.4 MB, or 5 bytes per cached block in caches large enough to sample more
    /// (the most where the samples start to grow and where OPTgen's window doubles).
    #[test]
    fn a_cached_block_costs_at_most_40_bytes_at_scale() {
        for capacity in [1_000, 100_000, 796_659, 1 << 20, 1_049_088, 1_677_722, 3 << 20] {
            let p = OptGate::new(capacity, &Params::default());
            let per_block = p.inner.bytes_per_entry() + p.live_door.bytes() as f64 / capacity as f64;
            let fixed = (p.bytes_per_entry() - per_block) * capacity as f64;
            assert!(fixed <= 3.4e6f64.max(5.0 * capacity as f64), "{capacity} blocks: {fixed} bytes of samples");
            if capacity >= 1 << 20 {
                let bound = crate::find("optgate").unwrap().bytes_per_block;
                assert!(bound <= 40, "the issue's bound for the default is 40 bytes, not {bound}");
                assert!(p.bytes_per_entry() <= bound as f64, "{capacity} blocks: {} B each", p.bytes_per_entry());
            }
        }
    }

    /// Through a cache of 1,000 blocks (its miniatures are the cache itself): 900 blocks read
    /// three times, which fill the main queue, then 100,000 new blocks each read again
    /// `gap` new blocks later. The live cache's small queue (blocks), and the hits on the
    /// second reads.
    fn small_cap_and_rereads_hit(gap: u64) -> (usize, u64) {
        let mut p = OptGate::new(1_000, &Params::default());
        assert_eq!(p.duel.len(), 2, "a cache of 1,000 blocks is not sampled");
        for _ in 0..3 {
            for b in 0..900 {
                p.access(Access::read(b, 0));
            }
        }
        let mut hits = 0;
        for b in 1_000..101_000u64 {
            p.access(Access::read(b, 0));
            hits += p.access(Access::read(b - gap, 0)).is_hit() as u64;
        }
        (p.inner.small_cap(), hits)
    }

    /// Where blocks come back after longer than a small queue of a tenth of the cache holds
    /// them but within the cache, the small queue that adapts to its ghosts wins in
    /// miniature and the live cache takes its size, and the second reads hit. Where they
    /// come back within a tenth, it hits them there and stays a tenth of the cache.
    #[test]
    fn the_small_queue_takes_the_size_that_wins_in_miniature() {
        let (small, hits) = small_cap_and_rereads_hit(300);
        assert!(small > 300, "{small}");
        assert!(hits > 80_000, "{hits} of 100,000 second reads hit");
        let (small, hits) = small_cap_and_rereads_hit(30);
        assert_eq!(small, 100);
        assert!(hits > 95_000, "{hits}");
    }

    /// At an epoch's end the live cache's small queue takes the adapting miniature's size,
    /// to the block, only where it leads the fixed one by more than the allowance and
    /// promotes no more than the fixed one or the budget; the miniatures then follow the
    /// level in force.
    #[test]
    fn the_live_small_queue_takes_the_adapting_size_on_a_clear_lead_within_the_budget() {
        let mut p = OptGate::new(165, &Params::default());
        p.duel[1].policy.set_small_cap(40);
        let tenth = p.duel[0].policy.small_cap();
        assert_eq!(tenth, 16);
        // Hits and promotions of the adapting miniature, against 500 and 100 for the fixed one
        // and 200 promotions for LRU's, over 1,000 sampled accesses (a point: 10 hits).
        let mut small_after = |hits: f64, promotions: f64| {
            p.duel[0].score = Score { hits: 500.0, promotions: 100.0 };
            p.duel[1].score = Score { hits, promotions };
            p.lru.score.promotions = 200.0;
            p.sampled = 1_000.0;
            p.end_epoch();
            let in_force = (p.minis[p.in_force].level, p.minis[p.in_force].kind);
            assert!(p.duel.iter().all(|m| (m.level, m.kind) == in_force));
            p.inner.small_cap()
        };
        assert_eq!(small_after(510.0, 100.0), tenth, "within the allowance");
        assert_eq!(small_after(520.0, 100.0), 40);
        assert_eq!(small_after(520.0, 140.0), 40, "within the budget (150)");
        assert_eq!(small_after(520.0, 160.0), tenth, "over the fixed one's and the budget");
    }

    /// The S3-FIFO behind the gate, live and in miniature, remembers half a cache of ghosts
    /// (its state's size tells it from S3-FIFO's own, with 90%).
    #[test]
    fn the_s3fifo_behind_the_gate_remembers_half_a_cache_of_ghosts() {
        use crate::policies::s3fifo::tests::comes_back_to_main;
        assert!(comes_back_to_main(s3fifo(100), 48));
        assert!(!comes_back_to_main(s3fifo(100), 49));
        let gate = OptGate::new(100_000, &Params::default());
        let size = |p: &dyn Policy| p.bytes_per_entry() * p.capacity() as f64;
        assert_eq!(size(&gate.inner), size(&s3fifo(100_000)));
        assert!(size(&s3fifo(100_000)) < size(&S3Fifo::new(100_000)));
        let mini = gate.minis[0].policy.capacity();
        for m in gate.minis.iter().chain(&gate.from_live) {
            assert_eq!(size(&m.policy), size(&s3fifo(mini)));
        }
    }

    /// Where the cache is sampled thinly, OPTgen follows every block the miniatures see and
    /// about [`TRAINING_SAMPLES`] times as many, and a block only it follows trains the
    /// predictor.
    #[test]
    fn the_predictor_learns_from_more_blocks_than_the_miniatures_see() {
        let mut gate = OptGate::new(1 << 20, &Params::default());
        let (trained, seen): (Vec<u64>, Vec<u64>) = (0..1_000_000u64)
            .filter(|&b| gate.training.sampled(b) || gate.sample.sampled(b))
            .partition(|&b| !gate.sample.sampled(b));
        assert!(seen.iter().all(|&b| gate.training.sampled(b)));
        let share = (trained.len() + seen.len()) as f64 / seen.len() as f64;
        assert!((5.5..=6.5).contains(&share), "OPTgen follows {share} times the miniatures' blocks");
        let block = trained[0];
        let sig = gate.predictor.sig(block, Op::Read);
        assert_eq!(gate.predictor.counters[sig.index as usize], UNTRAINED);
        gate.access(Access::read(block, 0));
        gate.access(Access::read(block, 0));
        assert_eq!(gate.predictor.counters[sig.index as usize], FIRST_KEPT, "OPT keeps a block re-read at once");
    }

    /// The second set's miniatures are copied at every epoch's end, the first times before
    /// they are full: the copies keep the room the miniatures reserved, so while they fill
    /// (and after) the policy's state is what it was when all were empty.
    #[test]
    fn copies_of_filling_miniatures_take_no_more_room() {
        let mut gate = OptGate::new(100_000, &Params::default());
        let empty = gate.bytes_per_entry();
        for i in 0..500_000u64 {
            gate.access(Access::read(mix64(i) % 1_000_000, 0));
            if i % 1_000 == 0 {
                let now = gate.bytes_per_entry();
                assert!(now - empty < 0.01, "{empty} bytes per cached block when empty, {now} after {i} accesses");
            }
        }
    }

    /// A cache restarted full of blocks the workload never reads (dm-cache's 2017 warm-up
    /// failure) serves it exactly as an empty one, access by access: the gate admits every
    /// miss while untouched blocks are left, and they make room first.
    #[test]
    fn a_cache_full_of_junk_behaves_as_an_empty_one() {
        let capacity = 3_000;
        let trace: Vec<u64> = (0..200_000u64).map(|i| mix64(i) % 20_000).map(|x| x * x / 20_000).collect();
        let mut empty = OptGate::new(capacity, &Params::default());
        let mut junk = OptGate::new(capacity, &Params::default());
        for b in 0..capacity as u64 {
            junk.insert(1 << 40 | b, false).unwrap();
        }
        let mut hits = 0;
        for (n, &b) in trace.iter().enumerate() {
            let (e, j) = (empty.access(Access::read(b, 0)), junk.access(Access::read(b, 0)));
            assert_eq!(e.is_hit(), j.is_hit(), "access {n}");
            assert_eq!(matches!(e, Outcome::Promote { .. }), matches!(j, Outcome::Promote { .. }), "access {n}");
            hits += e.is_hit() as usize;
        }
        assert_eq!(junk.untouched(), 0);
        assert!(hits > trace.len() / 10 && junk.level() > 0, "{hits} hits, level {}", junk.level());
    }

    /// With a window as long as the trace, OPTgen keeps exactly as many re-accesses as OPT
    /// (with bypass) hits, on skewed random traces at several sizes.
    #[test]
    fn optgen_counts_opts_hits() {
        for seed in 0..20u64 {
            let blocks: Vec<u64> =
                (0..3000u64).map(|i| mix64(seed * 10_000 + i) % (50 + seed * 20)).map(|x| x * x % 997).collect();
            for capacity in [1, 3, 10, 40, 200] {
                assert_eq!(
                    optgen_kept(capacity, &blocks),
                    opt_hits(capacity, &blocks),
                    "seed {seed}, capacity {capacity}"
                );
            }
        }
    }

    /// Verdicts move a signature's counter, and a class's untrained signatures follow the
    /// class's verdicts: a region OPT keeps is let through at every level, one whose blocks
    /// OPT never keeps only at levels 0 and 1 (a counter at 0), and an untrained region of a
    /// class that OPT mostly declined is stopped from level 1.
    #[test]
    fn the_predictor_follows_opts_verdicts() {
        let mut p = Predictor::new();
        let kept = p.sig(0, Op::Read);
        let declined = p.sig(10 * REGION_BLOCKS, Op::Read);
        let untrained = p.sig(99 * REGION_BLOCKS, Op::Read);
        let other_class = p.sig(99 * REGION_BLOCKS, Op::Write);
        assert!((0..=TOP_LEVEL).all(|l| p.admits(untrained, l)), "a class starts letting misses through");
        for _ in 0..10 {
            p.train(kept, true);
        }
        for _ in 0..50 {
            p.train(declined, false);
        }
        assert!((0..=TOP_LEVEL).all(|l| p.admits(kept, l)));
        assert!(p.admits(declined, 1) && (2..=TOP_LEVEL).all(|l| !p.admits(declined, l)));
        assert!(!p.admits(untrained, 1), "the class declined 50 of 60");
        assert!(p.admits(other_class, 1), "the write class has no verdicts");
    }

    /// A hot set a fifth of the cache, read between long scans of blocks read once: OPT keeps
    /// the hot blocks and none of the scanned, so the gate stops the scans (S3-FIFO alone
    /// would promote every scanned block) and the hot set stays cached.
    #[test]
    fn scans_between_hot_blocks_are_stopped_at_the_gate() {
        let mut gate = OptGate::new(1000, &Params::default());
        let mut lru = build("lru", 1000, &Params::default()).unwrap();
        let (mut promoted, mut lru_promoted) = (0, 0);
        let mut scan = 1_000_000u64;
        for round in 0..400 {
            let blocks = (0..200).chain(scan..scan + 2000);
            scan += 2000;
            for b in blocks {
                let a = Access::read(b, 0);
                if round >= 100 {
                    promoted += gate.access(a).is_promote() as u64;
                    lru_promoted += lru.access(a).is_promote() as u64;
                } else {
                    gate.access(a);
                    lru.access(a);
                }
            }
        }
        let hot = (0..200).filter(|&b| gate.contains(b)).count();
        assert!(hot >= 190, "level {}: {hot} of the 200 hot blocks cached", gate.level());
        assert!(
            promoted * 10 < lru_promoted,
            "level {}: {promoted} promotions against LRU's {lru_promoted}",
            gate.level()
        );
    }

    #[test]
    fn a_filling_cache_takes_every_miss_whatever_the_gate() {
        let mut gate = OptGate::new(1000, &Params::default());
        gate.epoch_len = u64::MAX; // the choice stays where the test puts it
        gate.in_force = level_index(TOP_LEVEL, Door::Every);
        for b in 0..1000 {
            assert!(gate.access(Access::read(b * 7, 0)).is_promote(), "miss {b} of a filling cache not taken");
        }
        assert!(!gate.access(Access::read(1_000_000, 0)).is_promote(), "a full cache behind a closed gate took a miss");
    }

    /// Behind the doorkeeper for long runs, a sequential run's first [`LONG_RUN`] - 1 blocks
    /// go in at their first miss and the rest at their second, and a block whose earlier miss
    /// it let through (alone, out of any run; gone since) has knocked already. The cache is
    /// sampled, so most accesses reach neither OPTgen nor the miniatures, and they count in
    /// their runs all the same. A run broken by a gap starts over.
    #[test]
    fn behind_the_doorkeeper_for_long_runs_a_runs_blocks_from_the_long_runth_knock_twice() {
        let capacity = 20_000;
        let mut gate = OptGate::new(capacity, &Params::default());
        assert!(gate.minis[0].policy.capacity() < capacity, "the cache is sampled");
        gate.epoch_len = u64::MAX; // the choice stays where the test puts it
        for b in 0..capacity as u64 {
            gate.access(Access::read(b * 3, 0));
        }
        gate.in_force = level_index(0, Door::LongRuns);
        let long = LONG_RUN as u64;
        let run = 1_000_000..1_000_000 + 2 * long;
        let early = run.start + long + 10;
        assert!(gate.access(Access::read(early, 0)).is_promote(), "a miss out of any run stayed out");
        assert!(gate.remove(early), "the block missed early is not cached");
        let short = LONG_RUN as usize - 1;
        for (i, b) in run.clone().enumerate() {
            let promoted = gate.access(Access::read(b, 0)).is_promote();
            assert_eq!(promoted, i < short || b == early, "block {i} of a run, missed once");
        }
        for (i, b) in run.enumerate() {
            let outcome = gate.access(Access::read(b, 0));
            let want = if i < short || b == early { outcome.is_hit() } else { outcome.is_promote() };
            assert!(want, "block {i} of the run read again: {outcome:?}");
        }
        let broken = (3_000_000..3_000_000 + long - 1).chain(3_000_000 + long..3_000_000 + 2 * long - 1);
        for b in broken {
            assert!(gate.access(Access::read(b, 0)).is_promote(), "block {b} of a run broken by a gap stayed out");
        }
    }

    /// A hit on the block the access just before touched (a miss or a hit) is a re-touch,
    /// which S3-FIFO behind the gate, live and in miniature, does not count; a hit after
    /// another block's access is a re-use, which it does.
    #[test]
    fn a_re_touch_of_the_block_just_accessed_is_not_a_re_use() {
        let mut g = OptGate::new(100, &Params::default());
        // Each block missed, re-touched at once (after its miss too), then re-used once.
        for b in [0, 0, 1, 1, 0, 1] {
            g.access(Access::read(b, 0));
        }
        assert_eq!((g.inner.freq(0), g.inner.freq(1)), (Some(1), Some(1)));
        for m in g.minis.iter().chain(&g.from_live) {
            assert_eq!((m.policy.freq(0), m.policy.freq(1)), (Some(1), Some(1)), "level {} {:?}", m.level, m.kind);
        }
    }

    /// A miniature behind the doorkeeper for long runs stops the misses at a long run's
    /// positions as the live gate does, and remembers every miss: a block let through at a
    /// short run's position and gone since goes in at its next miss, wherever in a run.
    #[test]
    fn a_miniature_behind_the_doorkeeper_for_long_runs_knocks_as_the_live_gate_does() {
        let predictor = Predictor::new();
        let sig = predictor.sig(0, Op::Read);
        let mut m = Mini::new(0, Door::LongRuns, s3fifo(100));
        let miss = |m: &mut Mini<S3Fifo>, b: u64, run: u32| {
            m.access(&predictor, Access::read(b, 0), sig, run, false);
            m.policy.contains(b)
        };
        for b in 0..100 {
            miss(&mut m, b, 1);
        }
        assert!(!miss(&mut m, 1_000, LONG_RUN), "a first miss at a long run's position went in");
        assert!(miss(&mut m, 1_000, LONG_RUN), "a second miss stayed out");
        assert!(miss(&mut m, 2_000, LONG_RUN - 1), "a miss at a short run's position stayed out");
        assert!(m.policy.remove(2_000), "the block let through is not cached");
        miss(&mut m, 2_001, 1); // the room it left: a full miniature judges the next miss
        assert!(miss(&mut m, 2_000, LONG_RUN), "a block that had knocked stayed out");

        // The gate hands its miniatures each access's place in its run.
        let mut gate = OptGate::new(1_000, &Params::default());
        gate.epoch_len = u64::MAX;
        for b in 0..1_000 {
            gate.access(Access::read(b * 3, 0));
        }
        let run = 1_000_000..1_000_000 + 2 * LONG_RUN as u64;
        for b in run.clone() {
            gate.access(Access::read(b, 0));
        }
        let m = &gate.minis[level_index(0, Door::LongRuns)];
        for (i, b) in run.enumerate() {
            assert_eq!(m.policy.contains(b), i + 1 < LONG_RUN as usize, "block {i} of a run in miniature");
        }
    }

    #[test]
    fn behind_the_doorkeeper_a_block_goes_in_on_its_second_miss_or_a_partial_one() {
        let mut gate = OptGate::new(100, &Params::default());
        gate.epoch_len = u64::MAX; // the choice stays where the test puts it
        for b in 0..100 {
            gate.access(Access::read(b, 0));
        }
        gate.in_force = level_index(0, Door::Every);
        assert!(!gate.access(Access::read(500, 0)).is_promote(), "a first whole-block miss went in");
        assert!(gate.access(Access::read(500, 0)).is_promote(), "a second miss stayed out");
        let partial = Access { full_block: false, ..Access::read(600, 0) };
        assert!(gate.access(partial).is_promote(), "a partial miss stayed out");
        gate.in_force = level_index(0, Door::Off);
        assert!(gate.access(Access::read(700, 0)).is_promote(), "without the doorkeeper a miss stayed out");
    }

    /// The free-running miniatures draw the choice to a stricter level whose miniature holds
    /// blocks the live cache lacks; started from the live cache's contents, that level does
    /// clearly worse than the one in force, and the switch is vetoed. Where the two sets agree
    /// within the choice's allowance, or the level chosen lets in some misses the one in force
    /// does not, it goes ahead.
    #[test]
    fn a_switch_to_a_stricter_level_the_live_contents_refute_is_vetoed() {
        // (level in force, its doorkeeper), (level chosen, its doorkeeper), the chosen
        // level's hits from the live contents, whether the switch stands.
        use Door::{Every, LongRuns, Off};
        let cases = [
            ((1, Off), (TOP_LEVEL, Every), 20.0, false),
            ((1, Off), (TOP_LEVEL, Off), 20.0, false),
            ((1, Every), (TOP_LEVEL, Every), 20.0, false),
            ((1, Off), (1, LongRuns), 20.0, false),
            ((1, LongRuns), (1, Every), 20.0, false),
            ((1, Off), (TOP_LEVEL, Every), 98.0, true),
            ((1, Off), (0, Off), 20.0, true),
            ((1, Off), (0, Every), 20.0, true),
            ((1, Every), (TOP_LEVEL, Off), 20.0, true),
            ((1, Every), (TOP_LEVEL, LongRuns), 20.0, true),
        ];
        for (now, (level, door), lure_from_live, switched) in cases {
            let mut gate = OptGate::new(1000, &Params::default());
            gate.in_force = level_index(now.0, now.1);
            gate.sampled = 1000.0;
            gate.lru.score = Score { hits: 100.0, promotions: 500.0 };
            let lure = gate.minis.iter().position(|m| (m.level, m.kind) == (level, door)).unwrap();
            for (i, (free, live)) in gate.minis.iter_mut().zip(&mut gate.from_live).enumerate() {
                free.score = Score { hits: if i == lure { 300.0 } else { 100.0 }, promotions: 300.0 };
                live.score = Score { hits: if i == lure { lure_from_live } else { 100.0 }, promotions: 300.0 };
            }
            gate.end_epoch();
            let want = if switched { (level, door) } else { now };
            let case =
                format!("{now:?} to level {level}, doorkeeper {door:?}, from the live contents {lure_from_live} hits");
            assert_eq!((gate.level(), gate.door()), want, "{case}");
        }
    }

    #[test]
    fn the_tree_adds_clears_and_reads_maxima() {
        let mut t = MaxTree::new(8);
        let mut model = [0i32; 8];
        for (i, (lo, hi, v)) in [(0, 8, 2), (2, 5, 3), (4, 7, -1), (1, 2, 9), (3, 8, 1)].into_iter().enumerate() {
            t.add_range(lo, hi, v);
            model[lo..hi].iter_mut().for_each(|m| *m += v);
            t.clear(i);
            model[i] = 0;
            for lo in 0..8 {
                for hi in lo + 1..=8 {
                    assert_eq!(t.max_range(lo, hi), *model[lo..hi].iter().max().unwrap(), "[{lo}, {hi})");
                }
            }
        }
    }

    /// Random adds, clears and reads (of a range, and of every slot) on a 64-slot tree agree
    /// with a plain array.
    #[test]
    fn the_tree_agrees_with_a_model_over_random_operations() {
        const N: usize = 64;
        let (mut t, mut model) = (MaxTree::new(N), [0i32; N]);
        for i in 0..20_000u64 {
            let r = mix64(i);
            let (a, b) = ((r % N as u64) as usize, ((r >> 8) % N as u64) as usize);
            let (lo, hi) = (a.min(b), a.max(b) + 1);
            match (r >> 16) % 3 {
                0 => {
                    let v = ((r >> 24) % 7) as i32 - 3;
                    t.add_range(lo, hi, v);
                    model[lo..hi].iter_mut().for_each(|m| *m += v);
                }
                1 => {
                    t.clear(a);
                    model[a] = 0;
                }
                _ => assert_eq!(t.max_range(lo, hi), *model[lo..hi].iter().max().unwrap(), "step {i}: [{lo}, {hi})"),
            }
            assert_eq!(t.max(), *model.iter().max().unwrap(), "step {i}: every slot");
        }
    }
}
