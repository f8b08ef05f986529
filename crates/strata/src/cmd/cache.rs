//! `strata cache`: create a cache, change a running one, write back its dirty blocks, detach
//! it, and check or dump its metadata offline.

use crate::http;
use crate::open::{cache_device, open, open_file};
use crate::spec::Spec;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::time::Duration;
use strata_cache::admin::CreateOptions;
use strata_cache::format::Superblock;
use strata_cache::Mode;
use strata_io::units::{format_size, parse_rate, parse_size};

#[derive(Args, Debug)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
}

#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Format a cache device in front of an origin.
    Create(CreateArgs),
    /// Change a running cache: mode=, policy=, migration-budget=, sequential-cutoff=, readahead=, writeback-percent=.
    Set(SetArgs),
    /// Write back every dirty block of a running cache and wait, with progress.
    Flush(ControlArgs),
    /// Switch a running cache to cleaner mode and wait until the origin is complete.
    Detach(ControlArgs),
    /// Drop every clean block of a running cache (dirty ones stay); reads go to the origin
    /// until blocks are promoted again.
    Invalidate(ControlArgs),
    /// Verify a cache device's metadata (offline).
    Check(PathArgs),
    /// Print a cache device's superblock and mappings (offline).
    Dump(PathArgs),
}

#[derive(Args, Debug)]
#[command(after_help = "\
Example:
  strata cache create --origin hdd:/var/tmp/origin.img --cache /var/tmp/cache.img?size=1GiB
  strata serve --unix /tmp/strata.sock vol=cache:/var/tmp/cache.img")]
pub struct CreateArgs {
    /// The slow device to cache (any device spec; recorded in the superblock).
    #[arg(long, value_name = "SPEC")]
    pub origin: Spec,
    /// The fast device to format (a file or block device; PATH?size=1GiB creates a file).
    #[arg(long, value_name = "SPEC")]
    pub cache: Spec,
    /// Cache block size (32KiB to 1GiB, a power of two).
    #[arg(long, default_value = "64KiB", value_parser = |s: &str| parse_size(s))]
    pub block_size: u64,
    /// writeback, writethrough, writearound or passthrough.
    #[arg(long, default_value = "writeback")]
    pub mode: Mode,
    /// Replacement policy (strata, smq, lru, fifo, clock, 2q, arc, lirs, s3fifo, sieve, tinylfu).
    #[arg(long, default_value = strata_policy::DEFAULT_POLICY)]
    pub policy: String,
    /// Streams that run contiguously beyond this bypass the cache (0 disables).
    #[arg(long, default_value = "4MiB", value_parser = |s: &str| parse_size(s))]
    pub sequential_cutoff: u64,
    /// While the cache has unused blocks, read misses are rounded out to this aligned window
    /// and the neighbours fill free blocks, so an empty cache warms at the origin's streaming
    /// rate (0 disables; at most 16MiB).
    #[arg(long, default_value = "1MiB", value_parser = |s: &str| parse_size(s))]
    pub readahead: u64,
    /// Bytes per second that promotions and write-backs may move (0 = unlimited).
    #[arg(long, default_value = "32MiB/s", value_parser = |s: &str| parse_rate(s))]
    pub migration_budget: u64,
    /// Dirty share of the cache the write-back controller holds (writeback mode).
    #[arg(long, default_value_t = 10)]
    pub writeback_percent: u32,
    /// Format even if the cache device holds recognisable data.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata cache set --admin 127.0.0.1:9810 vol mode=writethrough migration-budget=64MiB/s")]
pub struct SetArgs {
    /// The server's admin endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// Volume name.
    pub name: String,
    /// Settings as KEY=VALUE.
    #[arg(required = true)]
    pub settings: Vec<String>,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata cache flush --admin 127.0.0.1:9810 vol")]
pub struct ControlArgs {
    /// The server's admin endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// Volume name.
    pub name: String,
    /// Return at once instead of waiting for the dirty count to reach zero.
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata cache check /var/tmp/cache.img")]
pub struct PathArgs {
    /// The cache device.
    pub path: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CacheArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        match args.command {
            CacheCommand::Create(a) => run_create(a).await,
            CacheCommand::Set(a) => {
                for kv in &a.settings {
                    let (k, v) = kv.split_once('=').with_context(|| format!("expected KEY=VALUE, got {kv:?}"))?;
                    let answer = http::message(&a.admin, &a.name, &format!("{} {v}", k.replace('-', "_"))).await?;
                    print!("{}: {answer}", a.name);
                }
                Ok(())
            }
            CacheCommand::Flush(a) => control(a, "flush").await,
            CacheCommand::Detach(a) => control(a, "detach").await,
            CacheCommand::Invalidate(a) => {
                println!("{}: {}", a.name, http::message(&a.admin, &a.name, "invalidate").await?);
                Ok(())
            }
            CacheCommand::Check(a) => run_check(a).await,
            CacheCommand::Dump(a) => {
                let dev = cache_device(a.path.as_ref(), true)?;
                let d = strata_cache::admin::dump(&*dev).await.with_context(|| a.path.clone())?;
                println!("{}", serde_json::to_string_pretty(&d)?);
                Ok(())
            }
        }
    })
}

async fn run_create(a: CreateArgs) -> Result<()> {
    if a.mode == Mode::Cleaner {
        bail!("a cache cannot be created in cleaner mode");
    }
    let opts = CreateOptions {
        block_bytes: u32::try_from(a.block_size).unwrap_or(u32::MAX),
        mode: a.mode,
        policy: a.policy,
        sequential_cutoff_bytes: a.sequential_cutoff,
        migration_budget_bytes_per_s: a.migration_budget,
        writeback_percent: a.writeback_percent,
        readahead_bytes: u32::try_from(a.readahead).unwrap_or(u32::MAX),
        force: a.force,
        ..CreateOptions::default()
    };
    let sb = create(&a.origin, &a.cache, opts).await?;
    let path = a.cache.path().expect("create refuses a cache spec without a path").display();
    println!(
        "created cache {path}: {} blocks of {} ({}) for origin {} ({}), mode {}, policy {}",
        sb.slots,
        format_size(sb.block_bytes as u64),
        format_size(sb.slots * sb.block_bytes as u64),
        sb.origin_spec,
        format_size(sb.origin_bytes),
        sb.mode.name(),
        sb.policy
    );
    println!("serve it with: strata serve --unix /tmp/strata.sock NAME=cache:{path}");
    Ok(())
}

/// Formats the file or block device `cache` as a cache of `origin`, recording the origin's
/// spec (without `size=`) and identity in the superblock so that serving reopens it.
pub async fn create(origin: &Spec, cache: &Spec, mut opts: CreateOptions) -> Result<Superblock> {
    let Spec::File(file) = cache else {
        bail!("the cache device must be a file or block device path, not {:?}", cache.to_string());
    };
    let origin_dev = open(origin, true).await.with_context(|| format!("cannot open the origin {origin}"))?;
    let cache_dev = open_file(file, false).with_context(|| format!("cannot open the cache device {cache}"))?;
    opts.origin_spec = origin.recordable().to_string();
    opts.origin_id = origin.identity();
    let sb = strata_cache::admin::create(&cache_dev, &*origin_dev, &opts).await;
    sb.with_context(|| format!("cannot create a cache on {}", file.path.display()))
}

async fn control(a: ControlArgs, what: &str) -> Result<()> {
    let answer = http::message(&a.admin, &a.name, what).await?;
    print!("{}: {answer}", a.name);
    if a.no_wait {
        return Ok(());
    }
    let dirty = |v: http::ServerStatus| -> Option<u64> {
        let target = v.volumes.into_iter().find(|x| x.name == a.name)?.target?;
        Some(strata_cache::CacheStatus::from_json(target)?.dirty_blocks)
    };
    let start = dirty(http::status(&a.admin).await?).context("that volume is not a cache")?;
    let bar = ProgressBar::new(start.max(1));
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} blocks written back  {msg}")?);
    loop {
        let d = dirty(http::status(&a.admin).await?).unwrap_or(0);
        bar.set_position(start.saturating_sub(d));
        if d == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bar.finish_with_message("done");
    if what == "detach" {
        println!("{}: the origin is complete; stop the server and remove the cache device, or serve the origin directly", a.name);
    } else {
        println!("{}: no dirty blocks", a.name);
    }
    Ok(())
}

async fn run_check(a: PathArgs) -> Result<()> {
    let dev = cache_device(a.path.as_ref(), true)?;
    let (sb, findings) = strata_cache::admin::check(&*dev).await.with_context(|| a.path.clone())?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"ok": findings.errors.is_empty(), "errors": findings.errors, "repairable": findings.repaired, "cache_blocks": sb.slots})
        );
    } else {
        println!("{}: superblock ok (seq {}, {} blocks of {}, {})", a.path, sb.seq, sb.slots, format_size(sb.block_bytes as u64), if sb.clean_shutdown { "clean shutdown" } else { "not shut down cleanly" });
        for r in &findings.repaired {
            println!("{}: repairable on open: {r}", a.path);
        }
        for e in &findings.errors {
            println!("{}: ERROR: {e}", a.path);
        }
        if findings.errors.is_empty() {
            println!("{}: metadata ok", a.path);
        }
    }
    if !findings.errors.is_empty() {
        bail!("{}: {} metadata error(s)", a.path, findings.errors.len());
    }
    Ok(())
}
