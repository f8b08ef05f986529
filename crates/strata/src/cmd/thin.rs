//! `strata thin`: make a pool (a metadata device in dm-thin's format and a data device),
//! create, snapshot and delete its thin volumes, list them, and check or dump the pool
//! offline. The pool must not be served meanwhile (its devices are claimed).

use crate::cmd::cache::Bytes;
use crate::open::{cache_device, open, open_file};
use crate::spec::Spec;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use strata_io::units::{format_size, format_size_exact, parse_size};
use strata_thin::format::{DATA_BLOCK_DEFAULT, DATA_BLOCK_MAX, DATA_BLOCK_MIN};
use strata_thin::meta::{DevId, Metadata};

#[derive(Args, Debug)]
pub struct ThinArgs {
    #[command(subcommand)]
    pub command: ThinCommand,
}

#[derive(Subcommand, Debug)]
pub enum ThinCommand {
    /// Make a pool: format its metadata device for a data device.
    Pool(PoolArgs),
    /// Create an empty thin volume in a pool.
    Create(CreateArgs),
    /// Snapshot a thin volume (O(1): the snapshot shares the origin's blocks).
    Snapshot(SnapshotArgs),
    /// Delete a thin volume or snapshot, freeing the blocks no other volume maps.
    Delete(DeleteArgs),
    /// List a pool's volumes: size, mapped and exclusive blocks.
    List(PoolPath),
    /// Check a pool's metadata (the checks thin_check makes).
    Check(PoolPath),
    /// Print a pool's metadata as thin_dump's XML.
    Dump(PoolPath),
}

#[derive(Args, Debug)]
pub struct PoolArgs {
    #[command(subcommand)]
    pub command: PoolCommand,
}

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Format a metadata device for a pool over a data device.
    Create(PoolCreateArgs),
}

#[derive(Args, Debug)]
#[command(after_help = "\
Example:
  strata thin pool create --metadata /var/tmp/pool.meta?size=64MiB --data /var/tmp/pool.data?size=100GiB
  strata thin create /var/tmp/pool.meta 1 --size 1TiB
  strata serve --unix /tmp/strata.sock vol=thin:/var/tmp/pool.meta?id=1")]
pub struct PoolCreateArgs {
    /// The metadata device (a file or block device; PATH?size=64MiB creates a file). dm-thin
    /// uses at most 15.9 GiB of it; about 48 bytes per data block is enough.
    #[arg(long, value_name = "SPEC")]
    pub metadata: Spec,
    /// The data device (any device spec; recorded in the pool's superblock).
    #[arg(long, value_name = "SPEC")]
    pub data: Spec,
    #[arg(long, default_value_t = Bytes(DATA_BLOCK_DEFAULT), help = format!(
        "Data block size ({} to {}, a multiple of {})",
        format_size_exact(DATA_BLOCK_MIN),
        format_size_exact(DATA_BLOCK_MAX),
        format_size_exact(DATA_BLOCK_MIN)
    ))]
    pub block_size: Bytes,
    /// Format even if the metadata device holds data.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata thin create /var/tmp/pool.meta 1 --size 1TiB")]
pub struct CreateArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// The new volume's id (0 to 16777215).
    pub id: DevId,
    /// The volume's size (recorded by strata; dm-thin keeps none).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata thin snapshot /var/tmp/pool.meta 1 2")]
pub struct SnapshotArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// The volume to snapshot.
    pub origin: DevId,
    /// The snapshot's id.
    pub id: DevId,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata thin delete /var/tmp/pool.meta 2")]
pub struct DeleteArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// The volume to delete.
    pub id: DevId,
}

#[derive(Args, Debug)]
pub struct PoolPath {
    /// The pool's metadata device.
    pub pool: PathBuf,
}

pub fn run(args: ThinArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        match args.command {
            ThinCommand::Pool(PoolArgs { command: PoolCommand::Create(a) }) => pool_create(a).await,
            ThinCommand::Create(a) => {
                change(&a.pool, |m| {
                    m.create_thin(a.id)?;
                    m.set_volume_size(a.id, a.size)
                })
                .await?;
                println!("created thin volume {} of {} in {}", a.id, format_size(a.size), a.pool.display());
                Ok(())
            }
            ThinCommand::Snapshot(a) => {
                change(&a.pool, |m| {
                    m.create_snapshot(a.id, a.origin)?;
                    match m.record().sizes.get(&a.origin).copied() {
                        Some(size) => m.set_volume_size(a.id, size),
                        None => Ok(()),
                    }
                })
                .await?;
                println!("created snapshot {} of thin volume {} in {}", a.id, a.origin, a.pool.display());
                Ok(())
            }
            ThinCommand::Delete(a) => {
                change(&a.pool, |m| m.delete(a.id)).await?;
                println!("deleted thin volume {} of {}", a.id, a.pool.display());
                Ok(())
            }
            ThinCommand::List(a) => list(a).await,
            ThinCommand::Check(a) => check(a).await,
            ThinCommand::Dump(a) => {
                let m = load(&a.pool, true).await?;
                print!("{}", strata_thin::dump::xml(&m)?);
                Ok(())
            }
        }
    })
}

async fn pool_create(a: PoolCreateArgs) -> Result<()> {
    let Spec::File(file) = &a.metadata else {
        bail!("the metadata device must be a file or block device path, not {:?}", a.metadata.to_string());
    };
    let data = open(&a.data, true).await.with_context(|| format!("cannot open the data device {}", a.data))?;
    let md = open_file(file, false).with_context(|| format!("cannot open the metadata device {}", a.metadata))?;
    let m = Metadata::format(&md, data.size(), a.block_size.0, &a.data.recordable().to_string(), a.force)
        .await
        .with_context(|| format!("cannot create a pool on {}", file.path.display()))?;
    let (blocks, bs) = (m.tm.data.nr_blocks(), m.data_block_bytes());
    println!(
        "created thin pool {}: {blocks} data blocks of {} ({}) on {}, {} metadata blocks",
        file.path.display(),
        format_size(bs),
        format_size(blocks * bs),
        a.data,
        m.tm.md.nr_blocks()
    );
    println!("add a volume with: strata thin create {} ID --size SIZE", file.path.display());
    Ok(())
}

async fn load(path: &Path, read_only: bool) -> Result<Metadata> {
    let dev = cache_device(path, read_only)?;
    Metadata::open(&*dev).await.with_context(|| format!("cannot read the pool {}", path.display()))
}

/// Applies `f` to the pool's metadata and commits.
async fn change(path: &Path, f: impl FnOnce(&mut Metadata) -> strata_io::Result<()>) -> Result<()> {
    let dev = cache_device(path, false)?;
    let mut m = Metadata::open(&*dev).await.with_context(|| format!("cannot read the pool {}", path.display()))?;
    f(&mut m).with_context(|| path.display().to_string())?;
    m.commit(&*dev).await.with_context(|| format!("cannot commit to {}", path.display()))
}

async fn list(a: PoolPath) -> Result<()> {
    let m = load(&a.pool, true).await?;
    let bs = m.data_block_bytes();
    let usage = m.usage()?;
    println!("{:>8} {:>10} {:>12} {:>12} {:>8} {:>8}", "ID", "SIZE", "MAPPED", "EXCLUSIVE", "CREATED", "SNAPPED");
    for (&id, d) in m.devices() {
        let size = m.record().sizes.get(&id).map(|&s| format_size(s)).unwrap_or_else(|| "-".into());
        let (mapped, exclusive) = usage[&id];
        println!(
            "{id:>8} {size:>10} {:>12} {:>12} {:>8} {:>8}",
            format_size(mapped * bs),
            format_size(exclusive * bs),
            d.creation_time,
            d.snapshotted_time
        );
    }
    let (used, total) = (m.tm.data.allocated(), m.tm.data.nr_blocks());
    println!(
        "pool: {} of {} data used ({used} of {total} blocks of {}), {} of {} metadata blocks, transaction {}",
        format_size(used * bs),
        format_size(total * bs),
        format_size(bs),
        m.tm.md.allocated(),
        m.tm.md.nr_blocks(),
        m.transaction_id()
    );
    Ok(())
}

async fn check(a: PoolPath) -> Result<()> {
    let dev = cache_device(&a.pool, true)?;
    let r = strata_thin::check::check(&*dev).await;
    let shown = a.pool.display();
    for w in &r.warnings {
        println!("{shown}: warning: {w}");
    }
    for e in &r.errors {
        println!("{shown}: error: {e}");
    }
    if !r.clean() {
        bail!("{shown}: the pool's metadata is damaged: {}", r.errors.join("; "));
    }
    println!(
        "{shown}: ok: {} volumes, {} mappings, {} data blocks and {} metadata blocks referenced",
        r.devices, r.mapped_blocks, r.data_blocks_used, r.metadata_blocks_used
    );
    Ok(())
}
