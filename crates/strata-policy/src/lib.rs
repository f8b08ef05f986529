//! Block cache policies as pure state machines.
//!
//! A policy decides, for a cache of a fixed number of cache blocks, whether an access hits,
//! whether a missed block is promoted (copied into the cache), and which cached block makes
//! room for it. The cache target (`strata-cache`) and the simulator (`strata-sim`) drive the
//! same [`Policy`] trait, so a policy measured in the simulator is the policy that serves IO.
//!
//! What a policy must never do: IO, threads, reading a clock (time is passed in with every
//! access), or anything non-deterministic beyond its seed. Policies work on origin block
//! numbers only; the engine keeps its own origin-block → cache-slot mapping and performs the
//! copies the policy asks for.
//!
//! ```
//! use strata_policy::{build, Access, Op, Outcome, Params};
//!
//! let mut p = build("lru", 2, &Params::default()).unwrap();
//! let t = 0;
//! assert_eq!(p.access(Access::read(1, t)), Outcome::Promote { evict: None });
//! assert_eq!(p.access(Access::read(2, t)), Outcome::Promote { evict: None });
//! assert_eq!(p.access(Access::read(1, t)), Outcome::Hit);
//! // 2 is now the least recently used block, so it makes room for 3.
//! assert_eq!(p.access(Access::read(3, t)), Outcome::Promote { evict: Some(2) });
//! ```

mod dirty;
mod entry;
mod ghost;
mod hash;
mod hints;
mod list;
pub mod pacing;
pub mod policies;

use std::fmt;

pub use hints::HintError;
pub use policies::opt::Opt;

/// Name of the policy strata uses when none is given.
pub const DEFAULT_POLICY: &str = "optgate";

/// A constructor in the [`POLICIES`] table: capacity in cache blocks, shared parameters.
pub type Constructor = fn(usize, &Params) -> Box<dyn Policy + Send>;

/// One row of the [`POLICIES`] table.
#[derive(Clone, Copy, Debug)]
pub struct PolicyInfo {
    /// The name [`build`] accepts and `--policy` options take.
    pub name: &'static str,
    /// One line for `--help` and error messages.
    pub summary: &'static str,
    /// How [`build`] makes it; `None` for a policy that needs more than a capacity (`opt`
    /// needs the whole future trace and is built with [`Opt::new`]).
    pub new: Option<Constructor>,
    /// The most its state takes per cached block ([`Policy::bytes_per_entry`]) in a cache of
    /// a million blocks or more: what the cache target asks the system for before it builds
    /// one (a test holds every policy to it). 0 for `opt`, which [`build`] does not make.
    pub bytes_per_block: u32,
}

/// Every policy there is, in the order `--help` lists them: the one table the name list
/// ([`POLICY_NAMES`]), the help text ([`help`], [`describe`]) and [`build`] come from. A new
/// policy is a module in [`policies`] and a row here.
pub const POLICIES: &[PolicyInfo] = &[
    PolicyInfo {
        name: "optgate",
        summary: "default: s3fifo behind a gate that admits a miss where Belady (OPTgen, on a sample) kept blocks like it, behind no doorkeeper or one (second recent miss, or a partial access) for every miss or for long sequential runs, its strictness chosen by miniature simulations",
        new: Some(|c, p| Box::new(policies::optgen::OptGate::new(c, p))),
        bytes_per_block: 40,
    },
    PolicyInfo {
        name: "strata",
        summary:
            "smq-style clean/dirty queues with frequency-gated admission and a ghost history (few promotions; the default before optgate)",
        new: Some(|c, p| Box::new(policies::strata::Strata::new(c, p))),
        bytes_per_block: 37,
    },
    PolicyInfo {
        name: "smq",
        summary: "dm-cache's stochastic multiqueue, with the Linux 4.12 (2017) fixes",
        new: Some(|c, p| Box::new(policies::smq::Smq::new(c, p))),
        bytes_per_block: 37,
    },
    PolicyInfo {
        name: "lru",
        summary: "least recently used; promotes every miss",
        new: Some(|c, _| Box::new(policies::lru::Lru::new(c))),
        bytes_per_block: 27,
    },
    PolicyInfo {
        name: "fifo",
        summary: "first in, first out; promotes every miss",
        new: Some(|c, _| Box::new(policies::lru::Fifo::new(c))),
        bytes_per_block: 27,
    },
    PolicyInfo {
        name: "clock",
        summary: "second-chance CLOCK",
        new: Some(|c, _| Box::new(policies::clock::Clock::new(c))),
        bytes_per_block: 24,
    },
    PolicyInfo {
        name: "2q",
        summary: "Johnson & Shasha's full 2Q (A1in 25%, A1out ghost 50%, Am)",
        new: Some(|c, _| Box::new(policies::twoq::TwoQ::new(c))),
        bytes_per_block: 52,
    },
    PolicyInfo {
        name: "arc",
        summary: "Megiddo & Modha's adaptive replacement cache",
        new: Some(|c, _| Box::new(policies::arc::Arc::new(c))),
        bytes_per_block: 69,
    },
    PolicyInfo {
        name: "lirs",
        summary: "Jiang & Zhang's low inter-reference recency set (1% HIR)",
        new: Some(|c, _| Box::new(policies::lirs::Lirs::new(c))),
        bytes_per_block: 85,
    },
    PolicyInfo {
        name: "s3fifo",
        summary: "Yang et al.'s S3-FIFO (10% small FIFO, main FIFO with 2-bit reinsertion, ghost)",
        new: Some(|c, _| Box::new(policies::s3fifo::S3Fifo::new(c))),
        bytes_per_block: 36,
    },
    PolicyInfo {
        name: "sieve",
        summary: "Zhang et al.'s SIEVE",
        new: Some(|c, _| Box::new(policies::sieve::Sieve::new(c))),
        bytes_per_block: 35,
    },
    PolicyInfo {
        name: "tinylfu",
        summary:
            "W-TinyLFU: 1% LRU window, frequency-sketch admission into a segmented LRU, window sized by hill climbing",
        new: Some(|c, p| Box::new(policies::tinylfu::TinyLfu::new(c, p))),
        bytes_per_block: 51,
    },
    PolicyInfo {
        name: "adaptive",
        summary: "serves with the best of strata and of s3fifo, arc, lirs, tinylfu, 2q as they are and behind doorkeepers (for every miss, or for long sequential runs), chosen by miniature simulations",
        new: Some(|c, p| Box::new(policies::adaptive::Adaptive::new(c, p))),
        bytes_per_block: 47,
    },
    PolicyInfo {
        name: "opt",
        summary: "Belady's offline optimum with bypass (simulator only: needs the future)",
        new: None,
        bytes_per_block: 0,
    },
];

const BUILDABLE: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < POLICIES.len() {
        n += POLICIES[i].new.is_some() as usize;
        i += 1;
    }
    n
};

const BUILDABLE_NAMES: [&str; BUILDABLE] = {
    let mut out = [""; BUILDABLE];
    let (mut i, mut n) = (0, 0);
    while i < POLICIES.len() {
        if POLICIES[i].new.is_some() {
            out[n] = POLICIES[i].name;
            n += 1;
        }
        i += 1;
    }
    out
};

/// The names [`build`] knows, in table order: the rows of [`POLICIES`] with a constructor.
pub const POLICY_NAMES: &[&str] = &BUILDABLE_NAMES;

/// The row of [`POLICIES`] called `name`, if any (`default` is not resolved here).
pub fn find(name: &str) -> Option<&'static PolicyInfo> {
    POLICIES.iter().find(|p| p.name == name)
}

/// One indented entry per policy, `name  summary`, names padded to a column and summaries
/// wrapped under themselves to fit [`HELP_COLUMNS`].
pub fn describe<'a>(policies: impl IntoIterator<Item = &'a PolicyInfo>) -> String {
    let rows: Vec<&PolicyInfo> = policies.into_iter().collect();
    let width = rows.iter().map(|p| p.name.len()).max().unwrap_or(0);
    let indent = 2 + width + 2;
    let mut out = String::new();
    for p in rows {
        let mut line = format!("  {:width$} ", p.name);
        for word in p.summary.split(' ') {
            if line.len() + 1 + word.len() > HELP_COLUMNS && line.len() > indent {
                out.push_str(&line);
                out.push('\n');
                line = " ".repeat(indent - 1);
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Width [`describe`] wraps to: clap's help width when it cannot ask the terminal.
pub const HELP_COLUMNS: usize = 100;

/// The policies [`build`] knows, described as by [`describe`], for `--help` of commands that
/// run a policy on a live cache (where `opt` cannot run).
pub fn help() -> String {
    describe(POLICIES.iter().filter(|p| p.new.is_some()))
}

/// Data direction of an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
}

/// One access to one cache block, as the policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Origin block number, in cache blocks.
    pub block: u64,
    pub op: Op,
    /// The request covers the whole cache block. A *partial* access of either kind predicts
    /// that the next request of its stream lands in the same block.
    pub full_block: bool,
    /// The block can be cached without reading the origin and without waiting for a hotspot
    /// to form: a whole-block write in writeback mode (dm-cache's `optimisable_bio`, which
    /// gates its fast promotion). `new` and `write` set it for every whole-block write; a
    /// cache in another mode clears it.
    pub fast_promote: bool,
    /// Monotonic time in nanoseconds, any epoch. Policies with periods (smq) use it; the
    /// others ignore it.
    pub now_ns: u64,
}

impl Access {
    pub fn new(block: u64, op: Op, full_block: bool, now_ns: u64) -> Self {
        Access { block, op, full_block, fast_promote: op == Op::Write && full_block, now_ns }
    }

    /// A read of the whole of `block` at `now_ns`.
    pub fn read(block: u64, now_ns: u64) -> Self {
        Access::new(block, Op::Read, true, now_ns)
    }

    /// A write of `block` at `now_ns`; `full` when it covers the whole cache block.
    pub fn write(block: u64, full: bool, now_ns: u64) -> Self {
        Access::new(block, Op::Write, full, now_ns)
    }
}

/// Read misses round out to this while a cache has unused blocks (the cache target's and
/// the write log's default `readahead`).
pub const DEFAULT_READAHEAD_BYTES: u64 = 1 << 20;
/// The largest readahead: one origin read of this size is still short next to a seek train.
pub const MAX_READAHEAD_BYTES: u64 = 16 << 20;

/// The aligned window of `per` blocks (at least one) that holds `block`, below `limit` (the
/// origin's size in blocks).
pub fn readahead_range(block: u64, per: u64, limit: u64) -> std::ops::Range<u64> {
    let per = per.max(1);
    let first = block / per * per;
    first..(first + per).min(limit)
}

/// The blocks a promoted read miss of `block` may bring along (readahead, as bcache's): the
/// others of its window (`readahead_range`), in address order. The cache target and the
/// simulator both take them where [`readahead_place`] finds room for them.
pub fn readahead_window(block: u64, per: u64, limit: u64) -> impl Iterator<Item = u64> {
    readahead_range(block, per, limit).filter(move |&b| b != block)
}

/// Makes room for readahead neighbour `block` (not cached) in `policy` and inserts it: into
/// free room, or else in place of an untouched restored block (`evict_untouched`), never
/// of a block the workload has used. `Ok(victim)` when placed, the victim to demote if
/// any; `Err` when there is no such room. The cache target and the simulator both place
/// neighbours this way: a cache full of another workload's blocks then warms like an
/// empty one.
pub fn readahead_place(policy: &mut dyn Policy, block: u64) -> Result<Option<u64>, InsertError> {
    if policy.len() < policy.capacity() {
        return policy.insert(block, false).map(|_| None);
    }
    let victim = policy.evict_untouched().ok_or(InsertError::Full(policy.capacity()))?;
    policy.insert(block, false).map(|_| Some(victim))
}

/// What the policy decided for one access. Its own state already reflects the decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The block is cached: serve it from the cache.
    Hit,
    /// The block is not cached and stays that way: serve it from the origin.
    Miss,
    /// The block is not cached, and the policy now counts it as cached: the engine must copy
    /// it in, after demoting `evict` (always a clean block) if there is one. If the copy
    /// fails the engine calls [`Policy::remove`].
    Promote { evict: Option<u64> },
}

impl Outcome {
    pub fn is_hit(self) -> bool {
        matches!(self, Outcome::Hit)
    }

    pub fn is_promote(self) -> bool {
        matches!(self, Outcome::Promote { .. })
    }

    pub fn evicted(self) -> Option<u64> {
        match self {
            Outcome::Promote { evict } => evict,
            _ => None,
        }
    }
}

/// Why [`Policy::insert`] refused a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InsertError {
    #[error("cache is full ({0} blocks)")]
    Full(usize),
    #[error("block {0} is already cached")]
    AlreadyCached(u64),
}

/// [`build`] was given a name it does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy '{name}' (known: {})", POLICY_NAMES.join(", "))]
pub struct UnknownPolicy {
    pub name: String,
}

/// Construction parameters shared by all policies. Each policy uses the ones that concern it
/// and ignores the rest.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// Seed for any pseudo-random choice; the same seed gives the same decisions.
    pub seed: u64,
    /// Size of the origin in cache blocks, when known. smq sizes its hotspot blocks so the
    /// hotspot table does not cover more than the origin.
    pub origin_blocks: Option<u64>,
    /// Cache blocks per hotspot block for the smq family (dm-cache uses 16).
    pub hotspot_factor: u32,
}

impl Default for Params {
    fn default() -> Self {
        Params { seed: 0, origin_blocks: None, hotspot_factor: 16 }
    }
}

/// A block cache policy of fixed capacity, in cache blocks.
///
/// Dirty blocks: the engine reports writes it absorbed with [`set_dirty`](Policy::set_dirty)
/// and completed write-backs with [`set_clean`](Policy::set_clean). A dirty block is never
/// chosen as an eviction victim; when no clean victim exists, a miss is not promoted and the
/// engine should write back what [`writeback_candidate`](Policy::writeback_candidate) offers.
pub trait Policy {
    /// The policy's name, as [`build`] accepts it.
    fn name(&self) -> &'static str;

    /// Capacity in cache blocks.
    fn capacity(&self) -> usize;

    /// Blocks currently cached (resident), including dirty ones.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `block` is cached. Does not count as an access.
    fn contains(&self, block: u64) -> bool;

    /// Record one access and decide hit, miss or promotion.
    fn access(&mut self, access: Access) -> Outcome;

    /// [`Policy::access`] behind a gate: a miss goes in only where `admit` says so, and one
    /// refused leaves no trace. `contains` then `access`, or one look-up where a policy
    /// overrides it (`S3Fifo`, behind `optgate`'s gate).
    fn access_admitting(&mut self, access: Access, admit: impl FnOnce(&Self) -> bool) -> Outcome
    where
        Self: Sized,
    {
        if self.contains(access.block) || admit(self) {
            self.access(access)
        } else {
            Outcome::Miss
        }
    }

    /// A hint that `block` will be accessed soon: the policy may start loading what the
    /// access will look at (its map slot) into the CPU's caches. Changes no decision. The
    /// simulator, which holds the whole trace, calls it a few accesses ahead.
    #[inline]
    fn prefetch(&self, block: u64) {
        let _ = block;
    }

    /// A second hint for `block`, nearer its access than [`Policy::prefetch`]'s: the policy may
    /// follow what the first brought in (the map slot) to the entry behind it. Changes no
    /// decision.
    #[inline]
    fn prefetch_entry(&self, block: u64) {
        let _ = block;
    }

    /// Drop `block` from the cache (a failed promotion, a discard, an IO error). Returns
    /// whether it was cached. The policy may remember it in its history.
    fn remove(&mut self, block: u64) -> bool;

    /// Make `block` cached without an access, e.g. when loading the mapping at start-up.
    fn insert(&mut self, block: u64, dirty: bool) -> Result<(), InsertError>;

    /// Evict a clean block that was `insert`ed at start-up and that nothing has accessed
    /// since, if the policy keeps such blocks apart (strata's restored queue) and has one
    /// left; `None` otherwise. Readahead takes their room as it takes free room (see
    /// [`readahead_place`]).
    fn evict_untouched(&mut self) -> Option<u64> {
        None
    }

    /// How many cached blocks the policy holds as free room: `insert`ed without an access and
    /// not accessed since (S3-FIFO's from the start-up; `strata`'s also readahead's), if it
    /// keeps such blocks apart (0 otherwise). They make room first, so a gate in front of
    /// the policy admits every miss while there are any: it costs no block anyone has used.
    fn untouched(&self) -> usize {
        0
    }

    /// Take `block` over from another policy that was serving the same workload until now,
    /// coldest blocks first (`adaptive` switching candidates). Unlike [`Policy::insert`]
    /// after a restart, the blocks are the workload's current ones in a known order, so a
    /// policy that treats inserted blocks as stale (strata's restored queue) should not here.
    fn adopt(&mut self, block: u64, dirty: bool) -> Result<(), InsertError> {
        self.insert(block, dirty)
    }

    /// Mark a cached block dirty. Returns false if it is not cached.
    fn set_dirty(&mut self, block: u64) -> bool;

    /// Mark a cached block clean (its write-back completed). Returns false if not cached.
    fn set_clean(&mut self, block: u64) -> bool;

    /// Whether a cached block is dirty (including while being written back).
    fn is_dirty(&self, block: u64) -> bool;

    /// Number of dirty cached blocks.
    fn dirty_len(&self) -> usize;

    /// The dirty block best written back next, handed out once: it stays dirty (and so is
    /// never evicted) until [`set_clean`](Policy::set_clean). If the write-back fails, or the
    /// block was written again meanwhile, call [`set_dirty`](Policy::set_dirty) and it will be
    /// offered again later.
    fn writeback_candidate(&mut self, now_ns: u64) -> Option<u64>;

    /// Serialise what a restart needs to be warm: the cached blocks in the policy's order
    /// with a per-block hint, self-checking. The engine's mapping stays authoritative.
    fn save_hints(&self) -> Vec<u8>;

    /// Restore from [`save_hints`](Policy::save_hints) output of a policy with the same name,
    /// into an empty policy. Blocks beyond the capacity are dropped. The engine then
    /// reconciles with its mapping using `contains`, `insert`, `remove` and `set_dirty`.
    fn load_hints(&mut self, hints: &[u8]) -> Result<(), HintError>;

    /// Metadata bytes the policy holds per cache block of capacity (its allocated tables,
    /// ghost history included, divided by the capacity).
    fn bytes_per_entry(&self) -> f64;
}

impl fmt::Debug for dyn Policy + Send {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish()
    }
}

/// The policy `name` stands for: [`DEFAULT_POLICY`] for `default`, else itself (what a
/// cache records, so that its superblock and status name the policy it runs).
pub fn resolve(name: &str) -> &str {
    if name == "default" {
        DEFAULT_POLICY
    } else {
        name
    }
}

/// Build a policy by name from the [`POLICIES`] table (see [`POLICY_NAMES`]; `default` means
/// [`DEFAULT_POLICY`]).
/// `capacity_blocks` must be at least 1.
pub fn build(name: &str, capacity_blocks: usize, params: &Params) -> Result<Box<dyn Policy + Send>, UnknownPolicy> {
    assert!(capacity_blocks >= 1, "a cache needs at least one block");
    assert!(capacity_blocks < u32::MAX as usize / 4, "capacity exceeds the 32-bit entry index");
    let name = resolve(name);
    match find(name).and_then(|p| p.new) {
        Some(new) => Ok(new(capacity_blocks, params)),
        None => Err(UnknownPolicy { name: name.to_string() }),
    }
}
