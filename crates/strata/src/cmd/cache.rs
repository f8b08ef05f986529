//! `strata cache`: create a cache, change a running one, write back its dirty blocks, detach
//! it, and check or dump its metadata offline.

use crate::http;
use crate::open::{cache_device, open, open_to_format};
use crate::spec::{NewFiles, Spec};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;
use strata_cache::format::{Superblock, MAX_ORIGIN_ID, MAX_ORIGIN_SPEC};
use strata_cache::meta::Meta;
use strata_cache::options::{
    DEFAULT_BLOCK_BYTES, DEFAULT_MIGRATION_BUDGET_BYTES_PER_S, DEFAULT_MODE, DEFAULT_READAHEAD_BYTES,
    DEFAULT_SEQUENTIAL_CUTOFF_BYTES, DEFAULT_WRITEBACK_PERCENT, MAX_BLOCK_BYTES, MAX_READAHEAD_BYTES,
    MAX_WRITEBACK_PERCENT, MIN_BLOCK_BYTES,
};
use strata_cache::{offline, CreateOptions, Mode};
use strata_io::units::{format_size, format_size_exact, parse_rate, parse_size};

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
    #[command(
        after_help = "Example:\n  strata cache set --admin 127.0.0.1:9810 vol mode=writethrough migration-budget=64MiB/s"
    )]
    Set(SetArgs),
    /// Write back every dirty block of a running cache and wait, with progress.
    #[command(after_help = "Example:\n  strata cache flush --admin 127.0.0.1:9810 vol")]
    Flush(ControlArgs),
    /// Switch a running cache to cleaner mode and wait until the origin is complete.
    #[command(after_help = "Example:\n  strata cache detach --admin 127.0.0.1:9810 vol")]
    Detach(ControlArgs),
    /// Drop every clean block of a running cache (dirty ones stay); reads go to the origin
    /// until blocks are promoted again.
    #[command(after_help = "Example:\n  strata cache invalidate --admin 127.0.0.1:9810 vol")]
    Invalidate(VolumeArgs),
    /// Record another device as a cache's origin (offline): after the origin moved, was
    /// restored from a backup or copied to another disk. Its size must match; the cache's
    /// dirty blocks are written back to it once the cache is served again.
    #[command(
        after_help = "Example:\n  strata cache origin /var/tmp/cache.img --origin /dev/disk/by-id/wwn-0x5000c500a1b2c3d4"
    )]
    Origin(OriginArgs),
    /// Verify a cache device's metadata (offline); exits 1 if it is damaged, 2 if it cannot
    /// be opened (missing, or in use by a server).
    #[command(
        after_help = "Example:\n  strata cache check /var/tmp/cache.img\n  strata cache check --repair /var/tmp/cache.img"
    )]
    Check(CheckArgs),
    /// Print a cache device's superblock and mappings (offline).
    #[command(after_help = "Example:\n  strata cache dump /var/tmp/cache.img")]
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
    #[arg(long, default_value_t = Bytes(DEFAULT_BLOCK_BYTES as u64), help = format!(
        "Cache block size ({} to {}, a power of two)",
        format_size_exact(MIN_BLOCK_BYTES as u64),
        format_size_exact(MAX_BLOCK_BYTES as u64)
    ))]
    pub block_size: Bytes,
    /// writeback, writethrough, writearound or passthrough.
    #[arg(long, default_value = DEFAULT_MODE.name())]
    pub mode: Mode,
    #[arg(long, default_value = strata_policy::DEFAULT_POLICY,
        help = format!("Replacement policy ({}; `strata sim --help` describes each)", strata_policy::POLICY_NAMES.join(", ")))]
    pub policy: String,
    /// Streams that run contiguously beyond this bypass the cache (0 disables); a write stream counts from its last flush or FUA write.
    #[arg(long, default_value_t = Bytes(DEFAULT_SEQUENTIAL_CUTOFF_BYTES))]
    pub sequential_cutoff: Bytes,
    #[arg(long, default_value_t = Bytes(DEFAULT_READAHEAD_BYTES as u64), help = format!(
        "While the cache has unused blocks, read misses are rounded out to this aligned window \
         and the neighbours fill free blocks, so an empty cache warms at the origin's streaming \
         rate (0 disables; at most {})",
        format_size_exact(MAX_READAHEAD_BYTES)
    ))]
    pub readahead: Bytes,
    /// Bytes per second that promotions and write-backs may move (0 = unlimited; a flush or
    /// a detach writes back flat out past it).
    #[arg(long, default_value_t = Rate(DEFAULT_MIGRATION_BUDGET_BYTES_PER_S))]
    pub migration_budget: Rate,
    #[arg(long, default_value_t = DEFAULT_WRITEBACK_PERCENT, help = format!(
        "Dirty share of the cache the write-back controller holds (writeback mode; at most {MAX_WRITEBACK_PERCENT})"
    ))]
    pub writeback_percent: u32,
    /// Format even if the cache device holds data (a recognised format, or anything but
    /// zeroes in its first 4 KiB), or the origin holds a strata cache, write log or pool
    /// metadata.
    #[arg(long)]
    pub force: bool,
    /// Print the new cache's superblock as JSON (for scripts).
    #[arg(long)]
    pub json: bool,
}

/// A byte count as the flags take it and show their defaults: `64KiB`.
#[derive(Clone, Copy, Debug)]
pub struct Bytes(pub u64);

impl FromStr for Bytes {
    type Err = String;
    fn from_str(s: &str) -> Result<Bytes, String> {
        parse_size(s).map(Bytes)
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size_exact(self.0))
    }
}

/// Bytes per second, as the flags take them and show their defaults: `32MiB/s`.
#[derive(Clone, Copy, Debug)]
pub struct Rate(pub u64);

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Rate, String> {
        parse_rate(s).map(Rate)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", Bytes(self.0))
    }
}

/// `set` of a running cache or write log (`strata cache set`, `strata writecache set`).
#[derive(Args, Debug)]
pub struct SetArgs {
    /// The server's admin endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// Volume name.
    pub name: String,
    /// Settings as KEY=VALUE, taken together: if one is refused, none changes.
    #[arg(required = true)]
    pub settings: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ControlArgs {
    /// The server's admin endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// Volume name.
    pub name: String,
    /// Return at once instead of waiting until every dirty block is written back.
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Args, Debug)]
pub struct VolumeArgs {
    /// The server's admin endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// Volume name.
    pub name: String,
}

#[derive(Args, Debug)]
pub struct OriginArgs {
    /// The cache's own device.
    pub path: String,
    /// The origin now (any device spec; recorded with its identity).
    #[arg(long, value_name = "SPEC")]
    pub origin: Spec,
    /// Record it even if it holds a strata cache, write log or thin pool's metadata.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct PathArgs {
    /// The cache device.
    pub path: String,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The cache device.
    pub path: String,
    /// Print the verdict as JSON.
    #[arg(long)]
    pub json: bool,
    /// Accept the damage found, so the cache opens again: slots whose entries are wrong are
    /// unmapped (their blocks read as the origin's copy, losing what only the cache held)
    /// and both copies of every table page are rewritten.
    #[arg(long, conflicts_with = "json")]
    pub repair: bool,
}

pub fn run(args: CacheArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        match args.command {
            CacheCommand::Create(a) => run_create(a).await,
            CacheCommand::Set(a) => send_settings(&a.admin, &a.name, "", &a.settings).await,
            CacheCommand::Flush(a) => control(a, "flush").await,
            CacheCommand::Detach(a) => control(a, "detach").await,
            CacheCommand::Invalidate(a) => {
                println!("{}: {}", a.name, http::message(&a.admin, &a.name, "invalidate").await?);
                Ok(())
            }
            CacheCommand::Origin(a) => {
                let dev = cache_device(a.path.as_ref(), false)?;
                let (mut meta, findings) = Meta::load(&*dev).await.with_context(|| a.path.clone())?;
                if !findings.errors.is_empty() {
                    bail!("{}: metadata is damaged ({}); nothing changed", a.path, findings.errors.join("; "));
                }
                let (spec, id) = origin_record(&a.origin, meta.sb.origin_bytes, a.force).await?;
                if spec.len() > MAX_ORIGIN_SPEC || id.len() > MAX_ORIGIN_ID {
                    bail!("the origin's spec or identity is too long to record; nothing changed");
                }
                meta.sb.origin_spec = spec;
                meta.sb.origin_id = id;
                meta.write_superblock(&*dev).await?;
                println!("{}: origin {} (identity {})", a.path, meta.sb.origin_spec, meta.sb.origin_id);
                Ok(())
            }
            CacheCommand::Check(a) => run_check(a).await,
            CacheCommand::Dump(a) => {
                let dev = cache_device(a.path.as_ref(), true)?;
                let d = offline::dump(&*dev).await.with_context(|| a.path.clone())?;
                println!("{}", serde_json::to_string_pretty(&d)?);
                Ok(())
            }
        }
    })
}

/// Sends the `KEY=VALUE`s to a running volume as one message of `{prefix}KEY VALUE` lines
/// (`-` in keys read as `_`), which it takes all or none of, and prints the answer.
pub async fn send_settings(admin: &str, name: &str, prefix: &str, settings: &[String]) -> Result<()> {
    let lines: Vec<String> = settings.iter().map(|kv| setting_line(prefix, kv)).collect::<Result<_>>()?;
    // One message: the volume takes every setting or none.
    let answer = http::message(admin, name, &lines.join("\n")).await?;
    print!("{name}: {answer}");
    Ok(())
}

/// `KEY=VALUE` as the line `{prefix}KEY VALUE`; a missing key or value, or a space or line
/// break in either (which would split the line), is refused here rather than sent.
fn setting_line(prefix: &str, kv: &str) -> Result<String> {
    let (k, v) = kv.split_once('=').with_context(|| format!("expected KEY=VALUE, got {kv:?}"))?;
    let what = if k.is_empty() {
        "no key before '='"
    } else if v.is_empty() {
        "no value after '='"
    } else if kv.contains(char::is_whitespace) {
        "a space or line break in it"
    } else {
        return Ok(format!("{prefix}{} {v}", k.replace('-', "_")));
    };
    bail!("expected KEY=VALUE, got {kv:?}: {what}")
}

async fn run_create(a: CreateArgs) -> Result<()> {
    if a.mode == Mode::Cleaner {
        bail!("a cache cannot be created in cleaner mode");
    }
    let opts = CreateOptions {
        block_bytes: u32::try_from(a.block_size.0).unwrap_or(u32::MAX),
        mode: a.mode,
        policy: a.policy,
        sequential_cutoff_bytes: a.sequential_cutoff.0,
        migration_budget_bytes_per_s: a.migration_budget.0,
        writeback_percent: a.writeback_percent,
        readahead_bytes: u32::try_from(a.readahead.0).unwrap_or(u32::MAX),
        force: a.force,
        ..CreateOptions::default()
    };
    let sb = create(&a.origin, &a.cache, opts).await?;
    let path = a.cache.path().expect("create refuses a cache spec without a path").display();
    if a.json {
        let mut facts = offline::superblock_json(&sb);
        facts["path"] = path.to_string().into();
        println!("{facts}");
        return Ok(());
    }
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

/// Checks that `origin` can be recorded as the origin of a target made for `bytes` bytes
/// (it opens, has that size, and holds no strata format unless `force`); returns its spec as
/// recorded and its identity.
pub async fn origin_record(origin: &Spec, bytes: u64, force: bool) -> Result<(String, String)> {
    let dev = open(origin, true).await.with_context(|| format!("cannot open the origin {origin}"))?;
    super::closing_after(&*dev, async {
        if dev.size() != bytes {
            bail!("{origin} has {} bytes; the origin must have the {bytes} it was made for", dev.size());
        }
        strata_io::signature::check_origin(&*dev, force).await?;
        Ok((origin.recordable().to_string(), origin.identity()))
    })
    .await
}

/// Formats the file or block device `cache` as a cache of `origin`, recording the origin's
/// spec (without `size=`) and identity in the superblock so that serving reopens it.
pub async fn create(origin: &Spec, cache: &Spec, mut opts: CreateOptions) -> Result<Superblock> {
    let Spec::File(file) = cache else {
        bail!("the cache device must be a file or block device path, not {:?}", cache.to_string());
    };
    let new = NewFiles::to_format(&[("--origin", origin), ("--cache", cache)])?;
    let origin_dev = open(origin, true).await.with_context(|| format!("cannot open the origin {origin}"))?;
    let cache_dev = open_to_format(file).with_context(|| format!("cannot open the cache device {cache}"))?;
    opts.origin_spec = origin.recordable().to_string();
    opts.origin_id = origin.identity();
    let sb = super::closing_after(&*origin_dev, async {
        let sb = offline::create(&cache_dev, &*origin_dev, &opts).await;
        sb.with_context(|| format!("cannot create a cache on {}", file.path.display()))
    })
    .await?;
    new.keep();
    Ok(sb)
}

async fn control(a: ControlArgs, what: &str) -> Result<()> {
    let answer = http::message(&a.admin, &a.name, what).await?;
    print!("{}: {answer}", a.name);
    if a.no_wait {
        return Ok(());
    }
    wait_written_back(&a.admin, &a.name, |target| {
        let s = strata_cache::CacheStatus::from_json(target).context("that volume is not a cache")?;
        Ok(Drain {
            dirty: s.dirty_blocks,
            errors: s.writeback_errors,
            stopped: s.stopped,
            last_error: s.faults.into_iter().next(),
        })
    })
    .await?;
    if what == "detach" {
        println!(
            "{}: the origin is complete; stop the server and remove the cache device, or serve the origin directly",
            a.name
        );
    } else {
        println!("{}: no dirty blocks", a.name);
    }
    Ok(())
}

/// Where a volume's write-back stands, from its status.
pub struct Drain {
    pub dirty: u64,
    /// Write-backs failed since the volume opened.
    pub errors: u64,
    /// Why the volume stopped serving, if it did.
    pub stopped: Option<String>,
    pub last_error: Option<String>,
}

/// Waits, with a progress bar, until volume `name` (or the target under its qos layer) has no
/// dirty block. Fails once write-back fails (its error count rises; the volume keeps its
/// blocks dirty and tries again in the background) or the volume stops, rather than wait for
/// what may never come.
pub async fn wait_written_back(
    admin: &str,
    name: &str,
    read: impl Fn(serde_json::Value) -> Result<Drain>,
) -> Result<()> {
    let drain = || async {
        let v = http::status(admin).await?;
        let target = v.volumes.into_iter().find(|x| x.name == name).and_then(|x| x.target);
        // A cache or write log under qos shows its status under the scheduler's.
        read(strata_qos::status::below_qos(target.with_context(|| format!("no volume {name:?} with a target"))?))
    };
    let first = drain().await?;
    let bar = ProgressBar::new(first.dirty.max(1));
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} blocks written back  {msg}")?);
    loop {
        let d = drain().await?;
        bar.set_position(first.dirty.saturating_sub(d.dirty));
        if d.dirty == 0 {
            break;
        }
        if let Some(why) = d.stopped {
            bar.abandon();
            bail!("{name}: stopped ({why}); {} blocks still dirty", d.dirty);
        }
        if d.errors > first.errors {
            bar.abandon();
            bail!(
                "{name}: write-back failed: {}; {} blocks still dirty, tried again in the background (see `strata status`)",
                d.last_error.as_deref().unwrap_or("no error recorded"),
                d.dirty
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bar.finish_with_message("done");
    Ok(())
}

async fn run_check(a: CheckArgs) -> Result<()> {
    let dev = super::device_to_check(a.path.as_ref(), !a.repair, "a strata cache").await?;
    let (sb, findings) = offline::check(&*dev).await.with_context(|| a.path.clone())?;
    if a.repair && !findings.errors.is_empty() {
        for e in &findings.errors {
            println!("{}: damaged: {e}", a.path);
        }
        let unmapped = offline::repair(&*dev).await.with_context(|| a.path.clone())?;
        println!(
            "{}: repaired: {unmapped} slots unmapped (their blocks read as the origin's copy), every table page rewritten",
            a.path
        );
        return Ok(());
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({"ok": findings.errors.is_empty(), "errors": findings.errors, "repairable": findings.repaired, "cache_blocks": sb.slots})
        );
    } else {
        println!(
            "{}: superblock ok (seq {}, {} blocks of {}, {})",
            a.path,
            sb.seq,
            sb.slots,
            format_size(sb.block_bytes as u64),
            if sb.clean_shutdown { "clean shutdown" } else { "not shut down cleanly" }
        );
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

#[cfg(test)]
mod tests {
    use super::setting_line;

    /// `=1` was sent as the line " 1" and answered "unknown message \"1\"", `weight=` as
    /// "weight " and answered "unknown message \"weight\"".
    #[test]
    fn a_setting_without_its_key_or_value_is_refused_before_it_is_sent() {
        assert_eq!(setting_line("", "migration-budget=64MiB/s").unwrap(), "migration_budget 64MiB/s");
        assert_eq!(setting_line("group a ", "weight=200").unwrap(), "group a weight 200");
        for (kv, why) in [
            ("=1", "no key"),
            ("weight=", "no value"),
            ("mode", "expected KEY=VALUE"),
            ("mode=writeback\nflush", "line break"),
            ("mode =writeback", "space"),
        ] {
            let e = setting_line("", kv).unwrap_err().to_string();
            assert!(e.contains(why), "{kv:?}: {e}");
        }
    }
}
