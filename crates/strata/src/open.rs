//! Opening a `Spec` into a stack of `BlockDev`s: the one place that knows how each kind of
//! device and target opens, and what each stacks on. `serve`, `demo`, `cache create` and a
//! cache's origin all open through `open`; a target's constructor gets devices already
//! opened. A new target adds one arm here (see `crate::spec`).
//!
//! What it must never do: open a cache over an origin other than the one it was made for
//! (the superblock's recorded size and identity are checked), or create a missing origin
//! (recorded specs carry no `size=`).

use crate::spec::{FileSpec, Spec};
use std::path::Path;
use std::sync::Arc;
use strata_cache::meta::Meta;
use strata_cache::{CacheDev, OpenOptions};
use strata_io::fault::{FaultDev, Rule};
use strata_io::file::{Claim, FileDev, FileOptions};
use strata_io::latency::LatencyDev;
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Error, ErrorKind, Result};
use strata_writecache::WritecacheDev;

/// Opens the device or stack `spec` names. `read_only` opens files read-only whatever their
/// spec says (a cache's own device and its origin stay writable: the export is what refuses
/// writes).
pub async fn open(spec: &Spec, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    Ok(match spec {
        Spec::File(f) => Arc::new(open_file(f, read_only)?),
        Spec::Mem { bytes } => Arc::new(MemDev::new(*bytes)),
        Spec::Hdd { file, params } => Arc::new(LatencyDev::hdd(open_file(file, read_only)?, *params)),
        Spec::Ssd { file, params } => Arc::new(LatencyDev::ssd(open_file(file, read_only)?, *params)),
        Spec::Fault { rules, inner } => with_faults(Box::pin(open(inner, read_only)).await?, rules),
        Spec::Cache { path, origin } => Arc::new(
            open_cache(path, origin.as_deref())
                .await
                .map_err(|e| Error::new(e.kind, format!("opening cache {}: {}", path.display(), e.context)))?,
        ),
        Spec::Writecache { path, origin } => Arc::new(
            open_writecache(path, origin.as_deref())
                .await
                .map_err(|e| Error::new(e.kind, format!("opening writecache {}: {}", path.display(), e.context)))?,
        ),
    })
}

/// Opens and claims a file or block device with its spec's options.
pub fn open_file(f: &FileSpec, read_only: bool) -> Result<FileDev> {
    let opts = FileOptions { direct: f.direct, engine: f.engine, create_size: f.size, read_only: read_only || f.ro };
    let claim = if f.shared { Claim::Unclaimed } else { Claim::Default };
    FileDev::open_claimed(&f.path, &opts, claim).map_err(|e| claim_hint(e, opts.read_only))
}

/// Adds to a refused claim how to read beside the holder.
fn claim_hint(e: Error, read_only: bool) -> Error {
    if e.kind != ErrorKind::Busy {
        return e;
    }
    let hint = if read_only { "add shared (?ro&shared)" } else { "open it read-only with ?ro&shared" };
    Error::new(ErrorKind::Busy, format!("{}; {hint} to read beside it", e.context))
}

/// Wraps `dev` in a fault-injection device that starts with `rules`.
fn with_faults(dev: Arc<dyn BlockDev>, rules: &[Rule]) -> Arc<dyn BlockDev> {
    let (dev, faults) = FaultDev::new(dev);
    for r in rules {
        faults.add(r.clone());
    }
    Arc::new(dev)
}

/// Opens the device a cache lives on (a file or block device, O_DIRECT where possible), for
/// serving or, `read_only`, for `cache check` and `cache dump`.
pub fn cache_device(path: &Path, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    let opts = FileOptions { read_only, ..FileOptions::default() };
    Ok(Arc::new(FileDev::open(path, &opts)?))
}

/// Opens a cache for serving: loads its metadata (reporting what recovery repaired), opens
/// the origin `origin` names or else the one its superblock records, after checking that
/// it is the device the cache was made for.
async fn open_cache(path: &Path, origin: Option<&Spec>) -> Result<CacheDev> {
    let shown = path.display();
    let invalid = |msg: String| Error::new(ErrorKind::Invalid, msg);
    let cache = cache_device(path, false)?;
    let (meta, findings) =
        Meta::load(&*cache).await.map_err(|e| Error::new(e.kind, format!("{shown}: {}", e.context)))?;
    if !findings.errors.is_empty() {
        return Err(invalid(format!(
            "{shown}: metadata is damaged ({}); run `strata cache check {shown}`",
            findings.errors.join("; ")
        )));
    }
    for r in &findings.repaired {
        eprintln!("strata: {shown}: recovery: {r}");
    }
    let recorded;
    let origin = match origin {
        Some(o) => o,
        None if meta.sb.origin_spec.is_empty() => {
            return Err(invalid(format!("{shown}: the superblock names no origin; give cache:{shown}?origin=SPEC")))
        }
        None => {
            recorded = Spec::parse(&meta.sb.origin_spec)
                .map_err(|e| Error::new(e.kind, format!("{shown}: the recorded origin: {}", e.context)))?;
            &recorded
        }
    };
    let id = origin.identity();
    if !meta.sb.origin_id.is_empty() && !id.is_empty() && id != meta.sb.origin_id {
        return Err(invalid(format!(
            "{shown}: wrong origin: {origin} is not the device this cache was created for (identity {id}, expected {})",
            meta.sb.origin_id
        )));
    }
    let origin = Box::pin(open(origin, false)).await;
    let origin = origin.map_err(|e| Error::new(e.kind, format!("origin of {shown}: {}", e.context)))?;
    CacheDev::open(cache, origin, meta, OpenOptions::default()).await
}

/// Opens a write log for serving: reads its superblock, opens the origin `origin` names or
/// else the one the superblock records, after checking it is the device the log was made
/// for, and recovers the log.
async fn open_writecache(path: &Path, origin: Option<&Spec>) -> Result<WritecacheDev> {
    let shown = path.display();
    let invalid = |msg: String| Error::new(ErrorKind::Invalid, msg);
    let cache = cache_device(path, false)?;
    let sb = strata_writecache::offline::superblock(&*cache, None).await?;
    let recorded;
    let origin = match origin {
        Some(o) => o,
        None if sb.origin_spec.is_empty() => {
            return Err(invalid(format!(
                "{shown}: the superblock names no origin; give writecache:{shown}?origin=SPEC"
            )))
        }
        None => {
            recorded = Spec::parse(&sb.origin_spec)
                .map_err(|e| Error::new(e.kind, format!("{shown}: the recorded origin: {}", e.context)))?;
            &recorded
        }
    };
    let id = origin.identity();
    if !sb.origin_id.is_empty() && !id.is_empty() && id != sb.origin_id {
        return Err(invalid(format!(
            "{shown}: wrong origin: {origin} is not the device this log was created for (identity {id}, expected {})",
            sb.origin_id
        )));
    }
    let origin = Box::pin(open(origin, false)).await;
    let origin = origin.map_err(|e| Error::new(e.kind, format!("origin of {shown}: {}", e.context)))?;
    WritecacheDev::open(cache, origin, strata_writecache::OpenOptions::default()).await
}
