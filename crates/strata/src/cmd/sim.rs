//! `strata sim`: the command line of the policy simulator. The simulation itself, the trace
//! parsers, the reports and the cost model are the `strata-sim` library; this module turns
//! options into its calls and prints what they return.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use strata_io::units::parse_size;
use strata_policy::{Params, POLICIES};
use strata_sim::cost::CostSpec;
use strata_sim::report;
use strata_sim::sim::{self, MatrixOptions, Ops, Workload};
use strata_sim::synthetic::{self, Pattern};
use strata_sim::trace::{self, Format, Requests};

/// What `--help` prints after the options: the policy table, how sizes read, the cost model.
fn after_help() -> String {
    format!(
        "\
Policies (--policy: a comma-separated list, or all):
{}
Sizes: cache sizes are blocks (5000), percentages of the trace's footprint (10%), or bytes
(64MiB, 2GiB). K, M, G, T, P and KiB, MiB, GiB, TiB, PiB are powers of 1024 (64M = 64MiB, as qemu-img
and fio read 64M); KB, MB, GB, TB are powers of 1000 (10MB = 10,000,000 bytes), as everywhere
in strata. A byte size is rounded down to whole blocks; --block-size reads the same units.
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
  strata sim ../shared/testdata/cloudphysics-w.csv --policy optgate,strata,lru,arc --size 1%,5%,10%
  strata sim trace.csv.zst --format msr --ops read --size 64MiB,256MiB,1GiB --plot mrc.png
  strata sim --synthetic zipf:1.2 --blocks 262144 --requests 2000000 --seed 1 --csv
  strata sim trace.lis --policy smq,strata --size 10% --prefill junk --windows 20
  strata sim ../shared/testdata/arc/P6.lis.zst --policy tinylfu,lru,arc --cost hdd,ssd",
        strata_policy::describe(POLICIES)
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Prefill {
    /// Start with the cache full of blocks the trace never touches
    Junk,
}

/// Replay a block trace through cache policies and report hit ratios.
#[derive(Debug, Clone, Args)]
#[command(after_help = after_help())]
pub struct SimArgs {
    /// Trace file (plain, .gz or .zst). Omit when using --synthetic.
    #[arg(value_name = "TRACE", required_unless_present = "synthetic")]
    pub trace: Option<PathBuf>,

    /// Trace format; guessed from the first lines when omitted.
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,

    /// Comma-separated policies (see below), or "all".
    #[arg(short, long, default_value = "optgate,strata,smq,lru,arc,lirs,s3fifo")]
    pub policy: String,

    /// Comma-separated cache sizes: blocks, % of footprint, or bytes (64MiB; MB is 10^6 bytes,
    /// see Sizes below).
    #[arg(short, long, default_value = "1%,5%,10%,25%")]
    pub size: String,

    /// Cache block size (default 4KiB, or the trace's own page for page traces such as .lis).
    #[arg(short, long, value_name = "BYTES")]
    pub block_size: Option<String>,

    /// Simulate reads only, or all requests.
    #[arg(long, value_enum, default_value = "all")]
    pub ops: Ops,

    /// Print CSV instead of a table (its `requests` column counts cache-block accesses, as the
    /// hit ratios do; with --windows, one row per policy, size and window: a run's totals are
    /// the sums of its windows).
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

    /// Readahead as the cache target's `readahead`: a promoted read miss also brings in the
    /// other blocks of its aligned window of BYTES that are not cached, while the cache has
    /// free room or (with `--prefill`, policies `optgate`, `strata` and `s3fifo`) prefilled
    /// blocks nothing has read yet to replace (they count as promotions; nothing else is
    /// evicted for them). 0 or one block: none.
    #[arg(long, value_name = "BYTES", default_value = "0")]
    pub readahead: String,
}

/// `--block-size` in bytes (units as [`parse_size`] reads them), or `default`.
fn block_size(args: &SimArgs, default: u64) -> Result<u64> {
    let bytes = match &args.block_size {
        Some(b) => parse_size(b).map_err(|e| anyhow!(e))?,
        None => default,
    };
    if bytes == 0 || bytes > u32::MAX as u64 {
        bail!("block size must be between 1 byte and 4 GiB - 1 byte ({} bytes)", u32::MAX);
    }
    Ok(bytes)
}

/// Read and split the trace of `args`.
fn trace_workload(path: &Path, args: &SimArgs) -> Result<(Workload, Format)> {
    let reader = trace::open_reader(path).with_context(|| format!("opening {}", path.display()))?;
    let (requests, format) =
        Requests::new(reader, args.format).with_context(|| format!("reading {}", path.display()))?;
    let block_size = block_size(args, format.native_block_size().unwrap_or(4096))?;
    let limit = args.requests.unwrap_or(u64::MAX);
    let interval = 1_000_000_000 / args.iops.max(1);
    let w = sim::split_requests(requests.take(limit.min(usize::MAX as u64) as usize), block_size, args.ops, interval)
        .with_context(|| format!("{} ({} format)", path.display(), format))?;
    Ok((w, format))
}

/// Run `strata sim`.
pub fn run(args: SimArgs) -> Result<()> {
    let policies = sim::parse_policy_list(&args.policy).map_err(|e| anyhow!(e))?;
    // What the summary line names, and the shorter name a plot's title carries.
    let (workload, source, title) = match (&args.synthetic, &args.trace) {
        (Some(p), _) => {
            if args.ops != Ops::All {
                bail!("--ops filters a trace's requests; a synthetic workload's mix is --rwmix-read");
            }
            let bs = block_size(&args, 4096)?;
            if args.blocks == 0 {
                bail!("--blocks must be at least 1");
            }
            // Each request is one access, held in memory as a trace's are.
            let requests = args.requests.unwrap_or(1_000_000);
            if requests > sim::MAX_ACCESSES {
                bail!("--requests {requests}: a replay holds at most {} accesses", sim::MAX_ACCESSES);
            }
            let options = synthetic::WorkloadOptions {
                blocks: args.blocks,
                requests,
                seed: args.seed,
                read_percent: args.rwmix_read,
                interval_ns: 1_000_000_000 / args.iops.max(1),
                block_size: bs,
            };
            let source = format!("synthetic {p} over {} blocks, seed {}", args.blocks, args.seed);
            (synthetic::workload(p, &options), source.clone(), source)
        }
        (None, Some(path)) => {
            let (w, format) = trace_workload(path, &args)?;
            let how = format!("({format}, {:?} ops)", args.ops).to_lowercase();
            let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into());
            (w, format!("{} {how}", path.display()), format!("{name} {how}"))
        }
        (None, None) => bail!("give a TRACE file or --synthetic PATTERN"),
    };
    if workload.accesses.is_empty() {
        bail!("the trace has no {} requests", if args.ops == Ops::Read { "read" } else { "read or write" });
    }
    let sizes = sim::parse_cache_sizes(&args.size, workload.footprint, workload.block_size).map_err(|e| anyhow!(e))?;
    // A cache larger than the footprint holds what one of the footprint's size does: the
    // policies are built at most that large (some allocate their whole capacity at once).
    // Prefilled with junk, the extra room matters, up to a bound.
    let footprint = workload.footprint as usize;
    let prefill = args.prefill == Some(Prefill::Junk);
    if prefill && sizes.iter().any(|&(b, _)| b > 4 * footprint) {
        bail!("with --prefill junk, sizes are at most 4 times the footprint ({} blocks)", 4 * footprint);
    }
    let params = Params { seed: args.seed, origin_blocks: Some(workload.max_block + 1), ..Params::default() };
    let readahead_bytes = parse_size(&args.readahead).map_err(|e| anyhow!("--readahead: {e}"))?;
    let readahead = sim::Readahead { per: readahead_bytes / workload.block_size, limit: workload.max_block + 1 };
    let opts = MatrixOptions {
        params,
        // No more windows than accesses (an empty window says nothing).
        windows: args.windows.unwrap_or(0).min(workload.accesses.len()),
        prefill_junk: prefill,
        jobs: args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
        progress: args.progress || std::io::stderr().is_terminal(),
        cost: args.cost,
        readahead,
    };
    let size_blocks: Vec<usize> = sizes.iter().map(|&(b, _)| if prefill { b } else { b.min(footprint) }).collect();
    let mut summary = report::summary(&source, &workload);
    if let Some(c) = &args.cost {
        summary.push_str(&format!("\ncost model: {c}"));
    }
    if !prefill && sizes.iter().any(|&(b, _)| b > footprint) {
        summary.push_str(&format!(
            "\nsizes above the footprint are simulated at it ({footprint} blocks): a larger cache holds the same"
        ));
    }
    if readahead.per > 1 {
        summary.push_str(&format!("\nreadahead: {} blocks per window", readahead.per));
    }
    if args.csv {
        eprintln!("{summary}");
    } else {
        println!("{summary}");
    }
    let results = sim::run_matrix(&workload, &policies, &size_blocks, &opts)?;
    if args.csv {
        // One table per stream, whatever reads it.
        match opts.windows {
            0 => print!("{}", report::csv(&results)),
            _ => print!("{}", report::windows_csv(&results)),
        }
    } else {
        print!("{}", report::table(&results, &workload, &sizes));
        if opts.windows > 0 {
            println!("\nhit ratio over time ({} windows):", opts.windows);
            print!("{}", report::windows_table(&results));
        }
    }
    if let Some(path) = &args.plot {
        report::plot(path, &format!("Hit ratio vs cache size — {title}"), &results, workload.block_size)
            .with_context(|| format!("plotting {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
