//! `strata writecache`: create a write log in front of an origin, tune a running one, write
//! back its dirty blocks, detach it, and check or dump its entries offline.

use crate::cmd::cache::{send_settings, wait_written_back, Bytes, Drain, SetArgs};
use crate::http;
use crate::open::{cache_device, open, open_to_format};
use crate::spec::{NewFiles, Spec};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use strata_io::units::{format_size, format_size_exact};
use strata_writecache::format::{
    Superblock, BLOCK_BYTES_DEFAULT, BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, ORIGIN_TEXT_BYTES_MAX,
};
use strata_writecache::offline::{self, CreateOptions};
use strata_writecache::WritecacheStatus;

#[derive(Args, Debug)]
pub struct WritecacheArgs {
    #[command(subcommand)]
    pub command: WritecacheCommand,
}

#[derive(Subcommand, Debug)]
pub enum WritecacheCommand {
    /// Format a fast device as a write log in front of an origin.
    Create(CreateArgs),
    /// Change a running log (kept for its next start): high_watermark=, low_watermark=, writeback_jobs=,
    /// autocommit_blocks=, autocommit_time= (ms), max_age= (ms), pause_writeback= (ms), writeback_running=on|off,
    /// cleaner=on|off, readahead= (bytes a read miss keeps in free slots; 0: none).
    #[command(
        after_help = "Example:\n  strata writecache set --admin 127.0.0.1:9810 vol low_watermark=10 writeback_running=off"
    )]
    Set(SetArgs),
    /// Write back every dirty block of a running log and wait.
    #[command(after_help = "Example:\n  strata writecache flush --admin 127.0.0.1:9810 vol")]
    Flush(ControlArgs),
    /// Turn on the cleaner and wait until the origin holds everything (then the log can go).
    #[command(after_help = "Example:\n  strata writecache detach --admin 127.0.0.1:9810 vol")]
    Detach(ControlArgs),
    /// Record another device as a log's origin (offline): after the origin moved, was restored
    /// from a backup or copied to another disk. Its size must match; the log's dirty blocks
    /// are written back to it once the log is served again.
    #[command(
        after_help = "Example:\n  strata writecache origin /var/tmp/log.img --origin /var/tmp/origin-restored.img"
    )]
    Origin(crate::cmd::cache::OriginArgs),
    /// Verify a log's superblock and entries (offline); exits 1 if an entry is damaged, 2 if
    /// it cannot be opened (missing, or in use by a server).
    #[command(
        after_help = "Example:\n  strata writecache check /var/tmp/log.img\n  strata writecache check --repair /var/tmp/log.img"
    )]
    Check(CheckArgs),
    /// Print a log's superblock and entries as JSON (offline).
    #[command(after_help = "Example:\n  strata writecache dump /var/tmp/log.img")]
    Dump(PathArgs),
}

#[derive(Args, Debug)]
#[command(after_help = "\
Example:
  strata writecache create --origin hdd:/var/tmp/origin.img --cache /var/tmp/log.img?size=1GiB
  strata serve --unix /tmp/strata.sock vol=writecache:/var/tmp/log.img")]
pub struct CreateArgs {
    /// The slow device (any device spec, a cache: too; recorded in the superblock).
    #[arg(long, value_name = "SPEC")]
    pub origin: Spec,
    /// The fast device to format (a file or block device; PATH?size=1GiB creates a file).
    #[arg(long, value_name = "SPEC")]
    pub cache: Spec,
    #[arg(long, default_value_t = Bytes(BLOCK_BYTES_DEFAULT as u64), help = format!(
        "Log block size ({} to {}, a power of two)",
        format_size_exact(BLOCK_BYTES_MIN as u64),
        format_size_exact(BLOCK_BYTES_MAX as u64)
    ))]
    pub block_size: Bytes,
    /// Format even if the device holds data, or the origin holds a strata cache, write log or
    /// pool metadata.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ControlArgs {
    /// The server's admin endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// Volume name.
    pub name: String,
}

#[derive(Args, Debug)]
pub struct PathArgs {
    /// The log's device.
    pub path: String,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The log's device.
    pub path: String,
    /// Clear damaged entries, so the log opens again: the logged data of the blocks they held
    /// is lost (those blocks read as the log's older copy, or the origin's).
    #[arg(long)]
    pub repair: bool,
}

pub fn run(args: WritecacheArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        match args.command {
            WritecacheCommand::Create(a) => run_create(a).await,
            WritecacheCommand::Set(a) => send_settings(&a.admin, &a.name, "", &a.settings).await,
            WritecacheCommand::Flush(a) => {
                print!("{}: {}", a.name, http::message_unbounded(&a.admin, &a.name, "flush").await?);
                Ok(())
            }
            WritecacheCommand::Detach(a) => detach(a).await,
            WritecacheCommand::Origin(a) => {
                let dev = cache_device(a.path.as_ref(), false)?;
                let mut sb = offline::superblock(&*dev, None).await.with_context(|| a.path.clone())?;
                let (spec, id) = crate::cmd::cache::origin_record(&a.origin, sb.origin_bytes, a.force).await?;
                if spec.len() + id.len() > ORIGIN_TEXT_BYTES_MAX {
                    bail!("the origin's spec and identity exceed {ORIGIN_TEXT_BYTES_MAX} bytes; nothing changed");
                }
                (sb.origin_spec, sb.origin_id) = (spec, id);
                dev.write(0, strata_io::Buf::from_slice(&sb.encode()), true).await?;
                println!("{}: origin {} (identity {})", a.path, sb.origin_spec, sb.origin_id);
                Ok(())
            }
            WritecacheCommand::Check(a) => run_check(a).await,
            WritecacheCommand::Dump(a) => run_dump(a).await,
        }
    })
}

async fn run_create(a: CreateArgs) -> Result<()> {
    let Spec::File(file) = &a.cache else {
        bail!("the log device must be a file or block device path, not {:?}", a.cache.to_string());
    };
    let new = NewFiles::to_format(&[("--origin", &a.origin), ("--cache", &a.cache)])?;
    let origin = open(&a.origin, true).await.with_context(|| format!("cannot open the origin {}", a.origin))?;
    let cache = open_to_format(file).with_context(|| format!("cannot open the log device {}", a.cache))?;
    let opts = CreateOptions {
        block_bytes: u32::try_from(a.block_size.0).unwrap_or(u32::MAX),
        force: a.force,
        origin_spec: a.origin.recordable().to_string(),
        origin_id: a.origin.identity(),
    };
    let sb = super::closing_after(&*origin, async {
        let sb = offline::create(&cache, &*origin, &opts).await;
        sb.with_context(|| format!("cannot create a writecache on {}", file.path.display()))
    })
    .await?;
    new.keep();
    let path = file.path.display();
    println!(
        "created writecache {path}: {} blocks of {} ({}) for origin {} ({})",
        sb.slots,
        format_size(sb.block_bytes as u64),
        format_size(sb.slots * sb.block_bytes as u64),
        sb.origin_spec,
        format_size(sb.origin_bytes)
    );
    println!("serve it with: strata serve --unix /tmp/strata.sock NAME=writecache:{path}");
    Ok(())
}

async fn detach(a: ControlArgs) -> Result<()> {
    // The cleaner writes back in the background, which a log switched off holds (the
    // setting is kept across restarts).
    http::message(&a.admin, &a.name, "cleaner on").await?;
    http::message(&a.admin, &a.name, "writeback_running on").await?;
    wait_written_back(&a.admin, &a.name, |target| {
        let s: WritecacheStatus = serde_json::from_value(target).context("that volume is not a writecache")?;
        Ok(Drain { dirty: s.dirty_blocks, errors: s.writeback_errors, stopped: s.stopped, last_error: s.last_error })
    })
    .await?;
    http::message_unbounded(&a.admin, &a.name, "flush").await?;
    println!("{}: the origin is complete; stop the server and serve the origin directly", a.name);
    Ok(())
}

fn describe(sb: &Superblock) -> String {
    format!(
        "{} blocks of {}, origin {} ({} bytes)",
        sb.slots,
        format_size(sb.block_bytes as u64),
        if sb.origin_spec.is_empty() { "not recorded" } else { &sb.origin_spec },
        sb.origin_bytes
    )
}

async fn run_check(a: CheckArgs) -> Result<()> {
    let dev = super::device_to_check(a.path.as_ref(), !a.repair, "a strata write log").await?;
    let sb = offline::superblock(&*dev, None).await.with_context(|| a.path.clone())?;
    let scan = offline::scan(&*dev, &sb).await.with_context(|| a.path.clone())?;
    println!("{}: superblock ok ({})", a.path, describe(&sb));
    for f in &scan.findings {
        println!("{}: cleared on open: {f}", a.path);
    }
    for (_, why) in &scan.damaged {
        println!("{}: damaged: {why}", a.path);
    }
    if !scan.damaged.is_empty() {
        if !a.repair {
            bail!(
                "{}: {} damaged entries: the log does not open; `--repair` clears them, losing the logged data of the blocks they held",
                a.path,
                scan.damaged.len()
            );
        }
        offline::clear_damaged(&*dev, &sb, &scan).await.with_context(|| a.path.clone())?;
        println!("{}: cleared {} damaged entries", a.path, scan.damaged.len());
    }
    println!(
        "{}: entries ok: {} blocks logged, {} older copies awaiting clearing, last commit {}",
        a.path,
        scan.newest.len(),
        scan.older.len(),
        scan.max_commit
    );
    Ok(())
}

async fn run_dump(a: PathArgs) -> Result<()> {
    let dev = cache_device(a.path.as_ref(), true)?;
    let sb = offline::superblock(&*dev, None).await.with_context(|| a.path.clone())?;
    let scan = offline::scan(&*dev, &sb).await.with_context(|| a.path.clone())?;
    let mut newest: Vec<_> = scan.newest.iter().map(|(b, (s, e))| (*b, *s, e.seq, e.commit, e.flags)).collect();
    newest.sort_unstable();
    let entry = |(b, s, seq, commit, flags): (u64, u32, u64, u64, u32)| serde_json::json!({"block": b, "slot": s, "seq": seq, "commit": commit, "zero": flags & 1 != 0});
    let out = serde_json::json!({
        "block_bytes": sb.block_bytes,
        "slots": sb.slots,
        "origin_bytes": sb.origin_bytes,
        "origin_spec": sb.origin_spec,
        "origin_id": sb.origin_id,
        "last_commit": scan.max_commit,
        "blocks": newest.into_iter().map(entry).collect::<Vec<_>>(),
        "older": scan.older.iter().map(|(s, e)| entry((e.block, *s, e.seq, e.commit, e.flags))).collect::<Vec<_>>(),
        "untrusted": scan.findings,
        "damaged": scan.damaged.iter().map(|(_, why)| why).collect::<Vec<_>>(),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
