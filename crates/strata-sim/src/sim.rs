//! The simulation core: split requests into cache-block accesses, replay them through
//! policies, and run a policy × cache-size matrix in parallel.
//!
//! Everything here works on a trace already in memory, so a run measures the policies and
//! not the parser. A replay is single-threaded and deterministic; parallelism is across the
//! independent (policy, size) pairs.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_policy::{readahead_place, readahead_window, Access, Op, Opt, Outcome, Params, Policy};

use crate::cost::{CostReport, CostSpec, CostState};
use crate::trace::{IoKind, Request, TraceError};

/// One access to one cache block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockAccess {
    pub block: u64,
    pub time_ns: u64,
    /// Bytes of the request that fall in this block.
    pub bytes: u32,
    pub op: Op,
    /// The request covers the whole block.
    pub full: bool,
}

impl BlockAccess {
    #[inline]
    pub fn to_access(self) -> Access {
        Access::new(self.block, self.op, self.full, self.time_ns)
    }
}

/// Which requests to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Ops {
    /// Reads only (writes are skipped)
    Read,
    /// Reads and writes
    All,
}

/// A trace turned into block accesses.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    pub accesses: Vec<BlockAccess>,
    /// Requests kept after the `--ops` filter.
    pub requests: u64,
    pub block_size: u64,
    /// Distinct blocks accessed.
    pub footprint: u64,
    /// Largest block number accessed (0 for an empty workload).
    pub max_block: u64,
}

impl Workload {
    pub fn blocks(&self) -> Vec<u64> {
        self.accesses.iter().map(|a| a.block).collect()
    }
}

/// The most block accesses a workload holds (6 GiB of them): past it a trace is refused, not
/// split until memory runs out (one 4 GiB request in 1-byte blocks is 2^32 accesses).
pub const MAX_ACCESSES: u64 = 1 << 28;

/// Split requests into `block_size` accesses. Requests without a time get one from a
/// synthetic clock of `interval_ns` per request, continuing after the last real time seen.
pub fn split_requests<I>(requests: I, block_size: u64, ops: Ops, interval_ns: u64) -> Result<Workload, TraceError>
where
    I: IntoIterator<Item = Result<Request, TraceError>>,
{
    assert!(block_size > 0);
    let mut w = Workload { block_size, ..Default::default() };
    let mut clock = 0u64;
    for r in requests {
        let r = r?;
        if ops == Ops::Read && r.kind == IoKind::Write {
            continue;
        }
        if r.len == 0 {
            continue;
        }
        clock = match r.time_ns {
            Some(t) => t,
            None => clock + interval_ns,
        };
        w.requests += 1;
        let op = match r.kind {
            IoKind::Read => Op::Read,
            IoKind::Write => Op::Write,
        };
        // In 128 bits: a request may end at 2^64 exactly (the last namespace's last byte),
        // where a block's end would wrap.
        let (bs, start) = (block_size as u128, r.offset as u128);
        let end = start + r.len as u128;
        let spans = ((end - 1) / bs - start / bs + 1) as u64;
        if w.accesses.len() as u64 + spans > MAX_ACCESSES {
            return Err(TraceError::TooManyAccesses(MAX_ACCESSES, block_size));
        }
        let mut pos = start;
        while pos < end {
            let block = pos / bs;
            let chunk = end.min((block + 1) * bs) - pos;
            let block = block as u64;
            w.accesses.push(BlockAccess { block, time_ns: clock, bytes: chunk as u32, op, full: chunk == bs });
            w.max_block = w.max_block.max(block);
            pos += chunk;
        }
    }
    w.footprint = count_distinct(w.accesses.iter().map(|a| a.block));
    Ok(w)
}

pub fn count_distinct(blocks: impl Iterator<Item = u64>) -> u64 {
    let mut seen = std::collections::HashSet::<u64>::new();
    for b in blocks {
        seen.insert(b);
    }
    seen.len() as u64
}

/// What one replay counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    pub accesses: u64,
    pub hits: u64,
    pub bytes: u64,
    pub hit_bytes: u64,
    pub promotions: u64,
    /// Accesses and hits per window, when windows were asked for.
    pub windows: Vec<(u64, u64)>,
}

impl Counts {
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits, self.accesses)
    }

    pub fn byte_hit_ratio(&self) -> f64 {
        ratio(self.hit_bytes, self.bytes)
    }
}

pub fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Readahead as the cache target does it: a promoted read miss brings along the other
/// blocks of its aligned window of `per` blocks (below `limit`, the origin's size in blocks)
/// that the policy does not hold, while [`readahead_place`] finds room for them (see
/// [`strata_policy::readahead_window`]). `per` of 0 or 1 is none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readahead {
    pub per: u64,
    pub limit: u64,
}

impl Readahead {
    pub const OFF: Readahead = Readahead { per: 0, limit: 0 };

    /// Inserts `block`'s neighbours into `policy`; returns how many.
    fn fill(&self, policy: &mut dyn Policy, block: u64, observer: &mut impl Observer) -> u64 {
        if self.per <= 1 {
            return 0;
        }
        let mut n = 0;
        for nb in readahead_window(block, self.per, self.limit) {
            if policy.contains(nb) {
                continue;
            }
            // Not cached, so only a full policy refuses it. A victim is clean: it costs
            // nothing to drop.
            if readahead_place(policy, nb).is_err() {
                break;
            }
            observer.neighbour(nb);
            n += 1;
        }
        n
    }
}

/// Replay `accesses` through `policy` and count hits. This is the function to compare with
/// the live cache target: replaying the same accesses there (with the same readahead) must
/// give the same hit count.
pub fn replay_hits(policy: &mut dyn Policy, accesses: &[BlockAccess], readahead: Readahead) -> u64 {
    replay_observed(policy, accesses, 0, None, readahead, &mut ()).hits
}

/// Replay with full counts, `windows` equal slices of hit ratio over time (0 for none), and
/// progress reported into `progress` every few thousand accesses.
pub fn replay(
    policy: &mut dyn Policy,
    accesses: &[BlockAccess],
    windows: usize,
    progress: Option<&AtomicU64>,
) -> Counts {
    replay_observed(policy, accesses, windows, progress, Readahead::OFF, &mut ())
}

/// [`replay`] with `readahead`, and when `cost` is given, every access and decision charged
/// to that cost model.
pub fn replay_with(
    policy: &mut dyn Policy,
    accesses: &[BlockAccess],
    windows: usize,
    progress: Option<&AtomicU64>,
    readahead: Readahead,
    cost: Option<&mut CostState>,
) -> Counts {
    match cost {
        Some(c) => replay_observed(policy, accesses, windows, progress, readahead, c),
        None => replay_observed(policy, accesses, windows, progress, readahead, &mut ()),
    }
}

/// Something told of every access and the policy's decision (the cost model, or nothing).
trait Observer {
    fn observe(&mut self, a: &BlockAccess, out: Outcome);
    /// `block` came into the cache as the previous access's readahead neighbour.
    fn neighbour(&mut self, block: u64);
}

impl Observer for () {
    #[inline(always)]
    fn observe(&mut self, _: &BlockAccess, _: Outcome) {}
    fn neighbour(&mut self, _: u64) {}
}

impl Observer for CostState {
    #[inline]
    fn observe(&mut self, a: &BlockAccess, out: Outcome) {
        self.charge(a, out)
    }
    fn neighbour(&mut self, block: u64) {
        self.readahead(block)
    }
}

fn replay_observed<O: Observer>(
    policy: &mut dyn Policy,
    accesses: &[BlockAccess],
    windows: usize,
    progress: Option<&AtomicU64>,
    readahead: Readahead,
    observer: &mut O,
) -> Counts {
    const CHUNK: usize = 1 << 16;
    // Far enough ahead that a map slot arrives from memory before its access, near enough
    // that it is still cached then.
    const PREFETCH_AHEAD: usize = 8;
    // Half as far, the entry behind the slot: by then the slot has arrived.
    const PREFETCH_NEAR: usize = 4;
    let mut c = Counts::default();
    let n = accesses.len();
    let nwin = windows.max(1);
    let mut win = vec![(0u64, 0u64); nwin];
    for (w, slot) in win.iter_mut().enumerate() {
        let (start, end) = (w * n / nwin, (w + 1) * n / nwin);
        let mut hits = 0u64;
        let mut hit_bytes = 0u64;
        let mut bytes = 0u64;
        let mut promotions = 0u64;
        for (c, chunk) in accesses[start..end].chunks(CHUNK).enumerate() {
            let base = start + c * CHUNK;
            for (j, a) in chunk.iter().enumerate() {
                if let Some(next) = accesses.get(base + j + PREFETCH_AHEAD) {
                    policy.prefetch(next.block);
                }
                if let Some(near) = accesses.get(base + j + PREFETCH_NEAR) {
                    policy.prefetch_entry(near.block);
                }
                bytes += a.bytes as u64;
                let out = policy.access(a.to_access());
                match out {
                    Outcome::Hit => {
                        hits += 1;
                        hit_bytes += a.bytes as u64;
                    }
                    Outcome::Promote { .. } => promotions += 1,
                    Outcome::Miss => {}
                }
                observer.observe(a, out);
                if a.op == Op::Read && out.is_promote() {
                    promotions += readahead.fill(policy, a.block, observer);
                }
            }
            if let Some(p) = progress {
                p.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        }
        *slot = ((end - start) as u64, hits);
        c.accesses += (end - start) as u64;
        c.hits += hits;
        c.bytes += bytes;
        c.hit_bytes += hit_bytes;
        c.promotions += promotions;
    }
    if windows > 0 {
        c.windows = win;
    }
    c
}

/// Fill the cache with blocks the trace never touches (`first_junk` upwards), as a cache
/// left full of another workload's data would be. Returns how many were inserted.
pub fn prefill_junk(policy: &mut dyn Policy, first_junk: u64) -> usize {
    let mut b = first_junk;
    while policy.len() < policy.capacity() {
        if policy.insert(b, false).is_err() {
            break;
        }
        b += 1;
    }
    (b - first_junk) as usize
}

/// One cell of the matrix.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub policy: String,
    pub size_blocks: usize,
    pub counts: Counts,
    pub bytes_per_entry: f64,
    pub elapsed: Duration,
    /// What the cost model charged, when one was asked for.
    pub cost: Option<CostReport>,
}

/// How to run a matrix.
#[derive(Debug, Clone)]
pub struct MatrixOptions {
    pub params: Params,
    pub windows: usize,
    pub prefill_junk: bool,
    pub jobs: usize,
    pub progress: bool,
    /// Also run the cost model (`--cost`).
    pub cost: Option<CostSpec>,
    pub readahead: Readahead,
}

/// Parse a list of cache sizes such as `1000,10%,64MiB` into sizes in blocks, each with the
/// spelling it was given (for the table), duplicates dropped. A plain number counts blocks, a
/// percentage is of `footprint` blocks, and anything else is bytes as
/// [`strata_io::units::parse_size`] reads them (`64M` = `64MiB`, `10MB` = 10,000,000 bytes),
/// rounded down to whole blocks of `block_size`.
pub fn parse_cache_sizes(spec: &str, footprint: u64, block_size: u64) -> Result<Vec<(usize, String)>, String> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let blocks = if let Some(pct) = part.strip_suffix('%') {
            let pct: f64 = pct.trim().parse().map_err(|_| format!("bad percentage '{part}'"))?;
            if pct.is_nan() || pct <= 0.0 {
                return Err(format!("cache size '{part}' must be positive"));
            }
            ((footprint as f64 * pct / 100.0).round() as u64).max(1)
        } else if part.bytes().all(|b| b.is_ascii_digit()) {
            part.parse::<u64>().map_err(|e| format!("cache size '{part}': {e}"))?
        } else {
            strata_io::units::parse_size(part)? / block_size
        };
        if blocks == 0 {
            return Err(format!("cache size '{part}' is smaller than one {block_size}-byte block"));
        }
        if blocks >= (u32::MAX / 4) as u64 {
            return Err(format!("cache size '{part}' ({blocks} blocks) is too large"));
        }
        if !out.iter().any(|(b, _)| *b == blocks as usize) {
            out.push((blocks as usize, part.to_string()));
        }
    }
    if out.is_empty() {
        return Err("no cache sizes given".into());
    }
    Ok(out)
}

/// Parse a list of policy names such as `lru, ARC,opt` (case-insensitive, duplicates
/// dropped): names from [`strata_policy::POLICIES`], `default`, or `all` for every row.
pub fn parse_policy_list(spec: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for p in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let p = p.to_ascii_lowercase();
        let names: Vec<String> = match p.as_str() {
            "all" => strata_policy::POLICIES.iter().map(|p| p.name.to_string()).collect(),
            "default" => vec![strata_policy::DEFAULT_POLICY.to_string()],
            _ => vec![p],
        };
        for n in names {
            if strata_policy::find(&n).is_none() {
                let known: Vec<&str> = strata_policy::POLICIES.iter().map(|p| p.name).collect();
                return Err(format!("unknown policy '{n}'; known: {}, or all or default", known.join(", ")));
            }
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    if out.is_empty() {
        return Err("no policies given".into());
    }
    Ok(out)
}

/// Build a policy for the matrix; `opt` needs the shared next-use table.
pub fn make_policy(
    name: &str,
    size: usize,
    params: &Params,
    next_use: Option<&Arc<[u32]>>,
) -> Result<Box<dyn Policy + Send>, strata_policy::UnknownPolicy> {
    if name == "opt" {
        let table = next_use.expect("next-use table for opt");
        return Ok(Box::new(Opt::with_next_use(size, table.clone())));
    }
    strata_policy::build(name, size, params)
}

/// Run every (policy, size) pair over the workload, `jobs` at a time. Results come back in
/// the order of `policies` × `sizes`.
pub fn run_matrix(
    workload: &Workload,
    policies: &[String],
    sizes: &[usize],
    opts: &MatrixOptions,
) -> Result<Vec<RunResult>, strata_policy::UnknownPolicy> {
    for p in policies {
        if p != "opt" {
            strata_policy::build(p, 1, &opts.params)?;
        }
    }
    let next_use: Option<Arc<[u32]>> =
        policies.iter().any(|p| p == "opt").then(|| strata_policy::policies::opt::next_use(&workload.blocks()).into());
    let tasks: Vec<(usize, &String, usize)> = policies
        .iter()
        .flat_map(|p| sizes.iter().map(move |&s| (p, s)))
        .enumerate()
        .map(|(i, (p, s))| (i, p, s))
        .collect();
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let total = (tasks.len() * workload.accesses.len()) as u64;
    let results = std::sync::Mutex::new(Vec::with_capacity(tasks.len()));
    let junk_base = workload.max_block + 1;
    let layout = opts.cost.as_ref().map(|_| {
        Arc::new(crate::cost::OriginLayout::of(workload.accesses.iter().map(|a| a.block), workload.block_size))
    });
    let jobs = opts.jobs.clamp(1, tasks.len().max(1));
    let finished = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(i, name, size)) = tasks.get(k) else {
                    break;
                };
                let start = Instant::now();
                let mut policy = make_policy(name, size, &opts.params, next_use.as_ref()).expect("names checked above");
                let junk = if opts.prefill_junk { prefill_junk(policy.as_mut(), junk_base) } else { 0 };
                let mut cost = opts.cost.as_ref().map(|spec| {
                    let mut c = CostState::new(spec, layout.clone().expect("made with the cost spec"), size);
                    c.prefilled(junk_base, junk);
                    c
                });
                let counts = replay_with(
                    policy.as_mut(),
                    &workload.accesses,
                    opts.windows,
                    Some(&done),
                    opts.readahead,
                    cost.as_mut(),
                );
                let r = RunResult {
                    policy: name.clone(),
                    size_blocks: size,
                    counts,
                    bytes_per_entry: policy.bytes_per_entry(),
                    elapsed: start.elapsed(),
                    cost: cost.map(|c| c.report()),
                };
                results.lock().expect("no worker panics holding the lock").push((i, r));
                finished.fetch_add(1, Ordering::Relaxed);
            });
        }
        if opts.progress {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {percent}% {human_pos}/{human_len} accesses ({per_sec}, eta {eta})",
                )
                .expect("valid template"),
            );
            while finished.load(Ordering::Relaxed) < tasks.len() {
                bar.set_position(done.load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        }
    });
    let mut results = results.into_inner().expect("workers finished");
    results.sort_by_key(|(i, _)| *i);
    Ok(results.into_iter().map(|(_, r)| r).collect())
}
