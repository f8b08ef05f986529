//! `strata thin`: make a pool (a metadata device in dm-thin's format and a data device),
//! create, snapshot and delete its thin volumes, grow its space, list them, and check or
//! dump the pool. Create, snapshot, delete, extend and set go through a server's admin
//! endpoint (`--admin`) when that server serves the pool; otherwise they work offline, and a
//! pool another process has open is refused (its devices are claimed).

use crate::cmd::cache::Bytes;
use crate::open::{cache_device, open, open_to_format};
use crate::spec::{NewFiles, Spec};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use strata_io::units::{format_size, format_size_exact, parse_size, parse_volume_size};
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
    /// Grow the pool's data or metadata space (its devices first, if files).
    Extend(ExtendArgs),
    /// Change a served pool's low-water mark or commit period.
    Set(SetArgs),
    /// List a pool's volumes: size, and the bytes mapped and held by that volume alone.
    #[command(after_help = "Example:\n  strata thin list /var/tmp/pool.meta")]
    List(PoolPath),
    /// Check a pool's metadata (the checks thin_check makes); exits 1 if it is damaged, 2 if
    /// it cannot be opened (missing, in use by a server, not a pool, or using features strata
    /// does not know).
    #[command(after_help = "Example:\n  strata thin check /var/tmp/pool.meta")]
    Check(CheckArgs),
    /// Print a pool's metadata as thin_dump's XML.
    #[command(after_help = "Example:\n  strata thin dump /var/tmp/pool.meta > pool.xml")]
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
    /// Format even if the metadata device holds data, or the data device holds anything
    /// recognised (a file system, a strata cache, ...).
    #[arg(long)]
    pub force: bool,
}

/// The server serving a pool, for the live commands.
#[derive(Args, Debug, Clone)]
pub struct AdminArg {
    /// The admin endpoint of a server that may serve the pool (`strata serve --admin`): if
    /// it serves a volume of the pool, the change is made there, live; otherwise offline.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: Option<String>,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  strata thin create /var/tmp/pool.meta 1 --size 1TiB
  strata thin create /var/tmp/pool.meta 3 --size 10GiB --admin 127.0.0.1:9810   (live)")]
pub struct CreateArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// The new volume's id (0 to 16777215).
    pub id: DevId,
    /// The volume's size (recorded by strata; dm-thin keeps none).
    #[arg(long, value_parser = parse_volume_size)]
    pub size: u64,
    #[command(flatten)]
    pub admin: AdminArg,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  strata thin snapshot /var/tmp/pool.meta 1 2
  strata thin snapshot /var/tmp/pool.meta 1 2 --admin 127.0.0.1:9810
      (live: the snapshot holds every write completed before it; serve it with
       strata export add --admin 127.0.0.1:9810 snap=thin:/var/tmp/pool.meta?id=2)")]
pub struct SnapshotArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// The volume to snapshot.
    pub origin: DevId,
    /// The snapshot's id.
    pub id: DevId,
    #[command(flatten)]
    pub admin: AdminArg,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  strata thin delete /var/tmp/pool.meta 2
  strata thin delete /var/tmp/pool.meta 2 --admin 127.0.0.1:9810
      (live; a volume that is served is refused: strata export remove it first)")]
pub struct DeleteArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// The volume to delete.
    pub id: DevId,
    #[command(flatten)]
    pub admin: AdminArg,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  strata thin extend /var/tmp/pool.meta --data 200GiB --admin 127.0.0.1:9810
  strata thin extend /var/tmp/pool.meta --metadata 128MiB
A data or metadata device that is a file is lengthened; a block device must be grown first
(lvextend). Writes that failed for want of space succeed after it.")]
pub struct ExtendArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// The data space's new size (rounded down to whole data blocks).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub data: Option<u64>,
    /// The metadata space's new size (at most 15.9 GiB is used).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub metadata: Option<u64>,
    #[command(flatten)]
    pub admin: AdminArg,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:
  strata thin set /var/tmp/pool.meta --admin 127.0.0.1:9810 --low-water-blocks 1000 --commit-period 1s
Both last while the pool is open; thin: specs set them too (low_water_blocks=N,
commit_period_ms=N).")]
pub struct SetArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// The server serving the pool (`strata serve --admin`).
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// Free data blocks at or below which status and /metrics report the pool low, and a
    /// line is logged (dm-thin's low_water_mark; 0: none).
    #[arg(long)]
    pub low_water_blocks: Option<u64>,
    /// How long provisioning may wait for a commit without a FLUSH (dm-thin's
    /// commit_period; 0 commits only on FLUSH and FUA; at most an hour), with its unit: 1s, 500ms.
    #[arg(long, value_parser = humantime_ms, value_name = "DURATION")]
    pub commit_period: Option<u64>,
}

/// A duration with its unit (`1s`, `500ms`), in milliseconds, at most an hour.
fn humantime_ms(s: &str) -> std::result::Result<u64, String> {
    use strata_io::units::{parse_duration, DurationError};
    let out_of_range = || format!("{s} is out of range (0 to an hour; 0 commits only on FLUSH and FUA)");
    match parse_duration(s, None) {
        Ok(d) if d.as_millis() <= strata_thin::pool::COMMIT_PERIOD_MAX_MS as u128 => Ok(d.as_millis() as u64),
        Ok(_) | Err(DurationError::OutOfRange(_)) => Err(out_of_range()),
        Err(_) => Err(format!("bad duration {s:?}: a number and a unit (e.g. 1s, 500ms)")),
    }
}

#[derive(Args, Debug)]
pub struct PoolPath {
    /// The pool's metadata device.
    pub pool: PathBuf,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The pool's metadata device.
    pub pool: PathBuf,
    /// If the pool checks clean, clear its needs_check flag (set by dm-thin when the pool's
    /// metadata failed; neither dm-thin nor strata writes the pool while it is set)
    #[arg(long)]
    pub clear_needs_check_flag: bool,
}

pub fn run(args: ThinArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        match args.command {
            ThinCommand::Pool(PoolArgs { command: PoolCommand::Create(a) }) => pool_create(a).await,
            ThinCommand::Create(a) => {
                let msg = format!("create {} {}", a.id, a.size);
                let live = live(&a.admin, &a.pool, &msg).await?;
                if !live {
                    change(&a.pool, |m| m.create_volume(a.id, a.size)).await?;
                }
                println!("created thin volume {} of {} in {}", a.id, format_size(a.size), a.pool.display());
                Ok(())
            }
            ThinCommand::Snapshot(a) => {
                if !live(&a.admin, &a.pool, &format!("snapshot {} {}", a.origin, a.id)).await? {
                    change(&a.pool, |m| m.create_snapshot_sized(a.id, a.origin)).await?;
                }
                println!("created snapshot {} of thin volume {} in {}", a.id, a.origin, a.pool.display());
                Ok(())
            }
            ThinCommand::Delete(a) => {
                if live(&a.admin, &a.pool, &format!("delete {}", a.id)).await? {
                    println!(
                        "deleted thin volume {} of {} (its space is freed in the background)",
                        a.id,
                        a.pool.display()
                    );
                    return Ok(());
                }
                delete_offline(&a.pool, a.id).await?;
                println!("deleted thin volume {} of {}", a.id, a.pool.display());
                Ok(())
            }
            ThinCommand::Extend(a) => extend(a).await,
            ThinCommand::Set(a) => {
                let mut msgs = Vec::new();
                if let Some(n) = a.low_water_blocks {
                    msgs.push(format!("low_water_blocks {n}"));
                }
                if let Some(ms) = a.commit_period {
                    msgs.push(format!("commit_period_ms {ms}"));
                }
                let each = |answer: Result<String>| {
                    print!("{}", answer?);
                    Ok(())
                };
                // Whether the pool is served is checked first, then whether there is anything to set.
                if !send_live(&a.admin, &a.pool, &msgs, each).await? {
                    bail!("the server at {} serves no volume of {}", a.admin, a.pool.display());
                }
                if msgs.is_empty() {
                    bail!("nothing to set: give --low-water-blocks or --commit-period");
                }
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
    let new = NewFiles::to_format(&[("--metadata", &a.metadata), ("--data", &a.data)])?;
    let data = open(&a.data, true).await.with_context(|| format!("cannot open the data device {}", a.data))?;
    let m = super::closing_after(&*data, async {
        if !a.force {
            if let Some(what) = strata_io::signature::recognise(&strata_io::signature::head(&*data).await?) {
                bail!(
                    "the data device {} holds {what}; its blocks would be written over (--force uses it anyway)",
                    a.data
                );
            }
        }
        let md = open_to_format(file).with_context(|| format!("cannot open the metadata device {}", a.metadata))?;
        Metadata::format(&md, data.size(), a.block_size.0, &a.data.recordable().to_string(), a.force)
            .await
            .with_context(|| format!("cannot create a pool on {}", file.path.display()))
    })
    .await?;
    new.keep();
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

/// The name of a volume of the pool at `pool` that the server at `admin` serves, if any.
async fn served_by(admin: &str, pool: &Path) -> Result<Option<String>> {
    let path = std::fs::canonicalize(pool).with_context(|| format!("cannot find {}", pool.display()))?;
    let path = path.display().to_string();
    let status = crate::http::status(admin).await?;
    Ok(status.volumes.into_iter().find_map(|v| {
        let t = strata_qos::status::below_qos(v.target?);
        (t["target"] == "thin" && t["pool"]["metadata_path"] == path.as_str()).then_some(v.name)
    }))
}

/// Sends `msgs` in order to the server at `addr` if it serves a volume of the pool, giving
/// each answer (or the error sending it) to `each`, which stops the sending with an error;
/// false if it serves none (nothing is sent).
async fn send_live(
    addr: &str,
    pool: &Path,
    msgs: &[String],
    mut each: impl FnMut(Result<String>) -> Result<()>,
) -> Result<bool> {
    let Some(name) = served_by(addr, pool).await? else { return Ok(false) };
    for m in msgs {
        each(crate::http::message(addr, &name, m).await)?;
    }
    Ok(true)
}

/// Sends `msg` to the server at `admin` if it serves the pool; false if it does not (or no
/// server was named): the change is then made offline.
async fn live(admin: &AdminArg, pool: &Path, msg: &str) -> Result<bool> {
    let Some(addr) = &admin.admin else { return Ok(false) };
    let each =
        |answer: Result<String>| answer.map(drop).with_context(|| format!("{} (served at {addr})", pool.display()));
    send_live(addr, pool, &[msg.to_string()], each).await
}

/// Opens the pool's metadata device for an offline change, saying what to do when a server
/// holds it.
fn claim(path: &Path) -> Result<std::sync::Arc<dyn strata_io::BlockDev>> {
    cache_device(path, false).map_err(|e| {
        let hint = if e.kind == strata_io::ErrorKind::Busy {
            "; if a server serves the pool, give its admin endpoint: --admin HOST:PORT"
        } else {
            ""
        };
        anyhow::anyhow!("{}{hint}", e)
    })
}

/// Grows the pool's data or metadata space: live through the server serving it, else
/// offline (its data device opened from the recorded spec).
async fn extend(a: ExtendArgs) -> Result<()> {
    if a.data.is_none() && a.metadata.is_none() {
        bail!("nothing to extend: give --data SIZE or --metadata SIZE");
    }
    let mut msgs = Vec::new();
    if let Some(b) = a.data {
        msgs.push(format!("extend data {b}"));
    }
    if let Some(b) = a.metadata {
        msgs.push(format!("extend metadata {b}"));
    }
    if let Some(addr) = &a.admin.admin {
        let each = |answer: Result<String>| {
            println!("extended {}: {}", a.pool.display(), answer?.trim());
            Ok(())
        };
        if send_live(addr, &a.pool, &msgs, each).await? {
            return Ok(());
        }
    }
    let md = claim(&a.pool)?;
    let mut m = Metadata::open(&*md).await.with_context(|| format!("cannot read the pool {}", a.pool.display()))?;
    // Refused before a device grows (the commit would refuse after).
    if let Some(why) = m.sb.not_writable() {
        bail!("{}: {why}", a.pool.display());
    }
    if let Some(bytes) = a.data {
        let spec = &m.record().data_spec;
        if spec.is_empty() {
            bail!(
                "{}: the pool records no data device (made by other tools?): extend it while served",
                a.pool.display()
            );
        }
        let spec = Spec::parse(spec).with_context(|| format!("{}: the recorded data device", a.pool.display()))?;
        let data = open(&spec, false).await.with_context(|| format!("cannot open the data device {spec}"))?;
        super::closing_after(&*data, async { Ok(data.grow(bytes).await?) }).await?;
        m.extend_data(bytes / m.data_block_bytes())?;
    }
    if let Some(bytes) = a.metadata {
        let bytes = strata_thin::format::metadata_bytes_used(bytes);
        md.grow(bytes).await?;
        m.extend_metadata(bytes / strata_thin::format::BLOCK as u64)?;
    }
    m.commit(&*md).await.with_context(|| format!("cannot commit to {}", a.pool.display()))?;
    println!(
        "extended {}: {} data blocks, {} metadata blocks",
        a.pool.display(),
        m.tm.data.nr_blocks(),
        m.tm.md.nr_blocks()
    );
    Ok(())
}

/// Applies `f` to the pool's metadata and commits.
async fn change(path: &Path, f: impl FnOnce(&mut Metadata) -> strata_io::Result<()>) -> Result<()> {
    let dev = claim(path)?;
    let mut m = Metadata::open(&*dev).await.with_context(|| format!("cannot read the pool {}", path.display()))?;
    f(&mut m).with_context(|| path.display().to_string())?;
    m.commit(&*dev).await.with_context(|| format!("cannot commit to {}", path.display()))
}

/// Deletes volume `id` of the pool at `path` (not served): marked as being deleted and
/// committed, then its space freed a step at a time, each step committed (a deletion left
/// unfinished, by this or by a server, is finished too).
async fn delete_offline(path: &Path, id: u32) -> Result<()> {
    let dev = claim(path)?;
    let mut m = Metadata::open(&*dev).await.with_context(|| format!("cannot read the pool {}", path.display()))?;
    m.start_delete(id).with_context(|| path.display().to_string())?;
    m.commit(&*dev).await.with_context(|| format!("cannot commit to {}", path.display()))?;
    m.finish_deletions(&*dev, strata_thin::pool::DELETE_STEP_NODES)
        .await
        .with_context(|| format!("cannot free the space of thin volume {id} of {}", path.display()))
}

async fn list(a: PoolPath) -> Result<()> {
    let m = load(&a.pool, true).await?;
    let bs = m.data_block_bytes();
    let usage = m.usage()?;
    println!("{:>8} {:>10} {:>12} {:>12} {:>8} {:>8}", "ID", "SIZE", "MAPPED", "EXCLUSIVE", "CREATED", "SNAPPED");
    for (id, d) in m.volumes() {
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
    if !m.deleting().is_empty() {
        println!("deleting: {:?} (their space is being freed)", m.deleting().iter().collect::<Vec<_>>());
    }
    Ok(())
}

async fn check(a: CheckArgs) -> Result<()> {
    let read_only = !a.clear_needs_check_flag;
    let dev = super::device_to_check(&a.pool, read_only, strata_io::signature::THIN_METADATA).await?;
    let shown = a.pool.display();
    // Another format is not a damaged pool (nor one for a repair tool to rewrite), and
    // neither is a device without dm-thin's magic.
    if strata_io::signature::recognise(&strata_io::signature::head(&*dev).await?).is_none() {
        let e = anyhow::anyhow!("{shown} is not a thin pool's metadata device: it holds no dm-thin superblock");
        return Err(e.context(super::NotChecked));
    }
    // Nor is one that uses features strata does not know (whose checks it cannot make).
    if let Some(why) = strata_thin::meta::read_superblock(&*dev).await.ok().and_then(|sb| sb.unknown_features()) {
        return Err(anyhow::anyhow!("{shown}: {why}").context(super::NotChecked));
    }
    let r = strata_thin::check::check(&*dev).await;
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
    if a.clear_needs_check_flag && strata_thin::meta::clear_needs_check(&*dev).await? {
        println!("{shown}: the needs_check flag is cleared");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::humantime_ms;

    /// A bare number was read as milliseconds though the help shows units, and 2^64-1s
    /// saturated to a period of 584 million years.
    #[test]
    fn a_commit_period_has_its_unit_and_is_at_most_an_hour() {
        assert_eq!(humantime_ms("500ms"), Ok(500));
        assert_eq!(humantime_ms("1.5s"), Ok(1500));
        assert_eq!(humantime_ms("0s"), Ok(0));
        assert_eq!(humantime_ms("60m"), Ok(3_600_000));
        for s in ["1", "soon", "1h"] {
            assert!(humantime_ms(s).unwrap_err().contains("a number and a unit"), "{s}");
        }
        for s in ["3601s", "18446744073709551615s", "61m", "-1s"] {
            assert!(humantime_ms(s).unwrap_err().contains("out of range (0 to an hour"), "{s}");
        }
    }
}
