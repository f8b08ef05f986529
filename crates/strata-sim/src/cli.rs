//! The `strata sim` command line. The `strata` binary mounts [`SimArgs`] as a subcommand and
//! calls [`run`]; everything else about the simulator is reachable from here.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use strata_policy::{Params, DEFAULT_POLICY, POLICIES};

use crate::cost::CostSpec;
use crate::report;
use crate::sim::{self, BlockAccess, MatrixOptions, Ops, Workload};
use crate::synthetic::{Generator, Pattern, Taus88};
use crate::trace::{self, Format, Requests};

const AFTER_HELP: &str = "\
Policies:
  strata  default: smq-style clean/dirty queues with frequency-gated admission (few promotions)
  smq     dm-cache's stochastic multiqueue, with the Linux 4.12 (2017) fixes
  tinylfu W-TinyLFU: LRU window, frequency-sketch admission, SLRU main, hill-climbed window
  lru, fifo, clock, sieve, 2q, arc, lirs, s3fifo   the classics, for comparison
  opt     Belady's offline optimum with bypass: the bound every table is read against

Sizes: blocks (5000), percentages of the trace's footprint (10%), or bytes (64MiB, 2GiB).
Hit ratios count cache-block accesses: a 64 KiB request over 4 KiB blocks is 16 accesses.
Traces may be gzip or zstd compressed. Requests without a timestamp (lis, fio v2,
synthetic) get one from a clock of --iops requests per second; smq uses time for its
periods.

Cost model (--cost ORIGIN,CACHE): each of hdd or ssd, optionally with the options of the
hdd:/ssd: device specs after '?' (hdd: seek_min_ms, seek_max_ms, rpm, mib_s; ssd: read_us,
write_us, channels, mib_s), e.g. --cost 'hdd?rpm=5400,ssd?channels=4'. Adds each policy's
mean read latency (per block read, no queueing, mean rotational delay) and each device's
busy time: origin reads for misses, an origin read plus a cache write for each promotion,
cache reads for hits; writes are charged as writethrough (no dirty data is simulated).

Examples:
  strata sim ../shared/testdata/cloudphysics-w.csv --policy strata,smq,lru,arc --size 1%,5%,10%
  strata sim trace.csv.zst --format msr --ops read --size 64MiB,256MiB,1GiB --plot mrc.png
  strata sim --synthetic zipf:1.2 --blocks 262144 --requests 2000000 --seed 1 --csv
  strata sim trace.lis --policy smq,strata --size 10% --prefill junk --windows 20
  strata sim ../shared/testdata/arc/P6.lis.zst --policy tinylfu,lru,arc --cost hdd,ssd";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Prefill {
    /// Start with the cache full of blocks the trace never touches
    Junk,
}

/// Replay a block trace through cache policies and report hit ratios.
#[derive(Debug, Clone, Args)]
#[command(after_help = AFTER_HELP)]
pub struct SimArgs {
    /// Trace file (plain, .gz or .zst). Omit when using --synthetic.
    #[arg(value_name = "TRACE", required_unless_present = "synthetic")]
    pub trace: Option<PathBuf>,

    /// Trace format; guessed from the first lines when omitted.
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,

    /// Comma-separated policies (see below), or "all".
    #[arg(short, long, default_value = "strata,smq,lru,arc,lirs,s3fifo")]
    pub policy: String,

    /// Comma-separated cache sizes: blocks, % of footprint, or bytes (KiB, MiB, GiB, TiB).
    #[arg(short, long, default_value = "1%,5%,10%,25%")]
    pub size: String,

    /// Cache block size (default 4KiB, or the trace's own page for page traces such as .lis).
    #[arg(short, long, value_name = "BYTES")]
    pub block_size: Option<String>,

    /// Simulate reads only, or all requests.
    #[arg(long, value_enum, default_value = "all")]
    pub ops: Ops,

    /// Print CSV instead of a table.
    #[arg(long)]
    pub csv: bool,

    /// Draw hit ratio against cache size (a miss-ratio curve) into this PNG.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,

    /// Also report hit ratio over time in N equal windows of the trace.
    #[arg(long, value_name = "N")]
    pub windows: Option<usize>,

    /// Start with a prefilled cache (dm-cache's 2017 warm-up failure).
    #[arg(long, value_enum)]
    pub prefill: Option<Prefill>,

    /// Generate a fio-compatible workload instead of reading a trace: zipf:THETA, pareto:H,
    /// zoned:ACCESS/SIZE:..., uniform, loop, or scanmix:THETA:SCAN_FRACTION.
    #[arg(long, value_name = "PATTERN", conflicts_with = "trace")]
    pub synthetic: Option<Pattern>,

    /// Synthetic: device size in blocks (fio's nranges).
    #[arg(long, default_value_t = 262_144)]
    pub blocks: u64,

    /// Synthetic: number of requests; for traces, stop after this many requests.
    #[arg(long)]
    pub requests: Option<u64>,

    /// Seed for the synthetic generator (fio's zipf/pareto seed) and the policies.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Synthetic: percentage of reads (fio's rwmixread).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmix_read: u8,

    /// Request rate of the clock given to requests without timestamps.
    #[arg(long, default_value_t = 10_000)]
    pub iops: u64,

    /// Worker threads (default: all cores).
    #[arg(short, long)]
    pub jobs: Option<usize>,

    /// Show a progress bar even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,

    /// Model the origin and cache devices (hdd or ssd, each optionally `?key=value&...`)
    /// and report mean read latency and device busy time (see below).
    #[arg(long, value_name = "ORIGIN,CACHE")]
    pub cost: Option<CostSpec>,
}

/// Parse a byte size: `4096`, `4KiB`, `64MiB`, `1GiB`, `4k`, `64M`, `512B`.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .with_context(|| format!("'{s}' is not a size"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => bail!("unknown size unit '{u}' in '{s}' (use B, KiB, MiB, GiB or TiB)"),
    };
    Ok((num * mult as f64).round() as u64)
}

/// Parse `--size` into cache sizes in blocks, keeping the user's spelling for the table.
pub fn parse_sizes(spec: &str, footprint: u64, block_size: u64) -> Result<Vec<(usize, String)>> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let blocks = if let Some(pct) = part.strip_suffix('%') {
            let pct: f64 = pct
                .trim()
                .parse()
                .with_context(|| format!("bad percentage '{part}'"))?;
            if pct.is_nan() || pct <= 0.0 {
                bail!("cache size '{part}' must be positive");
            }
            ((footprint as f64 * pct / 100.0).round() as u64).max(1)
        } else if part.bytes().all(|b| b.is_ascii_digit()) {
            part.parse::<u64>()?
        } else {
            parse_bytes(part)? / block_size
        };
        if blocks == 0 {
            bail!("cache size '{part}' is smaller than one {block_size}-byte block");
        }
        if blocks >= (u32::MAX / 4) as u64 {
            bail!("cache size '{part}' ({blocks} blocks) is too large");
        }
        if !out.iter().any(|(b, _)| *b == blocks as usize) {
            out.push((blocks as usize, part.to_string()));
        }
    }
    if out.is_empty() {
        bail!("no cache sizes given");
    }
    Ok(out)
}

/// Parse `--policy`.
pub fn parse_policies(spec: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for p in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let names: Vec<String> = match p {
            "all" => POLICIES.iter().map(|p| p.name.to_string()).collect(),
            "default" => vec![DEFAULT_POLICY.to_string()],
            _ => vec![p.to_ascii_lowercase()],
        };
        for n in names {
            if n != "opt" && !strata_policy::POLICY_NAMES.contains(&n.as_str()) {
                bail!(
                    "unknown policy '{n}'; known: {}, opt",
                    strata_policy::POLICY_NAMES.join(", ")
                );
            }
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    if out.is_empty() {
        bail!("no policies given");
    }
    Ok(out)
}

/// Build the synthetic workload of `args`.
pub fn synthetic_workload(pattern: &Pattern, args: &SimArgs, block_size: u64) -> Workload {
    let n = args.requests.unwrap_or(1_000_000);
    let interval = 1_000_000_000 / args.iops.max(1);
    let seed = args.seed as u32;
    let mut mix = Taus88::new(seed.wrapping_add(0x9e37));
    let accesses: Vec<BlockAccess> = Generator::new(pattern, args.blocks, seed)
        .take(n as usize)
        .enumerate()
        .map(|(i, block)| {
            let write = args.rwmix_read < 100 && mix.between(1, 100) > args.rwmix_read as u64;
            BlockAccess {
                block,
                time_ns: i as u64 * interval,
                bytes: block_size as u32,
                op: if write {
                    strata_policy::Op::Write
                } else {
                    strata_policy::Op::Read
                },
                full: true,
            }
        })
        .collect();
    let footprint = sim::count_distinct(accesses.iter().map(|a| a.block));
    let max_block = accesses.iter().map(|a| a.block).max().unwrap_or(0);
    Workload {
        requests: n,
        block_size,
        footprint,
        max_block,
        accesses,
    }
}

/// Read and split the trace of `args`.
pub fn trace_workload(path: &std::path::Path, args: &SimArgs) -> Result<(Workload, Format)> {
    let reader = trace::open_reader(path).with_context(|| format!("opening {}", path.display()))?;
    let (requests, format) = Requests::new(reader, args.format)
        .with_context(|| format!("reading {}", path.display()))?;
    let block_size = match &args.block_size {
        Some(b) => parse_bytes(b)?,
        None => format.native_block_size().unwrap_or(4096),
    };
    if block_size == 0 || block_size > u32::MAX as u64 {
        bail!("block size must be between 1 byte and 4 GiB");
    }
    let limit = args.requests.unwrap_or(u64::MAX);
    let interval = 1_000_000_000 / args.iops.max(1);
    let w = sim::split_requests(
        requests.take(limit.min(usize::MAX as u64) as usize),
        block_size,
        args.ops,
        interval,
    )
    .with_context(|| format!("{} ({} format)", path.display(), format))?;
    Ok((w, format))
}

/// Run `strata sim`.
pub fn run(args: SimArgs) -> Result<()> {
    let policies = parse_policies(&args.policy)?;
    let (workload, source) = match (&args.synthetic, &args.trace) {
        (Some(p), _) => {
            let bs = match &args.block_size {
                Some(b) => parse_bytes(b)?,
                None => 4096,
            };
            if args.blocks == 0 {
                bail!("--blocks must be at least 1");
            }
            (
                synthetic_workload(p, &args, bs),
                format!(
                    "synthetic {p} over {} blocks, seed {}",
                    args.blocks, args.seed
                ),
            )
        }
        (None, Some(path)) => {
            let (w, format) = trace_workload(path, &args)?;
            (
                w,
                format!("{} ({format}, {:?} ops)", path.display(), args.ops).to_lowercase(),
            )
        }
        (None, None) => bail!("give a TRACE file or --synthetic PATTERN"),
    };
    if workload.accesses.is_empty() {
        bail!(
            "the trace has no {} requests",
            if args.ops == Ops::Read {
                "read"
            } else {
                "read or write"
            }
        );
    }
    let sizes = parse_sizes(&args.size, workload.footprint, workload.block_size)?;
    let params = Params {
        seed: args.seed,
        origin_blocks: Some(workload.max_block + 1),
        ..Params::default()
    };
    let opts = MatrixOptions {
        params,
        windows: args.windows.unwrap_or(0),
        prefill_junk: args.prefill == Some(Prefill::Junk),
        jobs: args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }),
        progress: args.progress || std::io::stderr().is_terminal(),
        cost: args.cost,
    };
    let size_blocks: Vec<usize> = sizes.iter().map(|(b, _)| *b).collect();
    let mut summary = report::summary(&source, &workload);
    if let Some(c) = &args.cost {
        summary.push_str(&format!("\ncost model: {c}"));
    }
    if args.csv {
        eprintln!("{summary}");
    } else {
        println!("{summary}");
    }
    let results = sim::run_matrix(&workload, &policies, &size_blocks, &opts)?;
    if args.csv {
        print!("{}", report::csv(&results));
        if opts.windows > 0 {
            println!();
            print!("{}", report::windows_csv(&results));
        }
    } else {
        print!("{}", report::table(&results, &workload, &sizes));
        if opts.windows > 0 {
            println!("\nhit ratio over time ({} windows):", opts.windows);
            print!("{}", report::windows_table(&results));
        }
    }
    if let Some(path) = &args.plot {
        report::plot(
            path,
            &format!("Hit ratio vs cache size — {source}"),
            &results,
            workload.block_size,
        )
        .with_context(|| format!("plotting {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
