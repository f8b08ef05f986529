//! Opening a `Spec` into a stack of `BlockDev`s: the one place that knows how each kind of
//! device and target opens, and what each stacks on. `serve`, `demo`, `cache create` and a
//! cache's origin all open through `open`; a target's constructor gets devices already
//! opened. A new target adds one arm here (see `crate::spec`).
//!
//! An `Opener` lives as long as a server (or a command) and holds what several specs share:
//! exports whose specs name one pool or one scheduled device get one open object, made the
//! first time a spec names it (`Opener::shared`) and dropped with the last export using it.
//! Slices (`slice:`) of one device share its open device this way, each through a lease on
//! it (`strata_io::shared`), so that only the last of them to close shuts the device down;
//! and the `Opener` keeps the ranges of the slices it opened on each device, to refuse
//! overlapping ones.
//!
//! What it must never do: open a cache over an origin other than the one it was made for
//! (the superblock's recorded size and identity are checked), or create a missing origin
//! (recorded specs carry no `size=`).

use crate::spec::{FileSpec, Spec};
use parking_lot::Mutex;
use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Weak};
use strata_cache::meta::Meta;
use strata_cache::{CacheDev, OpenOptions};
use strata_io::fault::{FaultDev, Rule};
use strata_io::file::{Claim, FileDev, FileOptions};
use strata_io::latency::LatencyDev;
use strata_io::mem::MemDev;
use strata_io::shared::{Lease, Shared};
use strata_io::slice::Slice;
use strata_io::{BlockDev, Error, ErrorKind, Result};
use strata_nbd::remote::RemoteDev;
use strata_qos::{Qos, QosOptions};
use strata_thin::{Pool, PoolOptions, ThinDev};
use strata_writecache::WritecacheDev;

/// Opens the device or stack `spec` names, sharing nothing with other opens (see `Opener`).
pub async fn open(spec: &Spec, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    Opener::new().open(spec, read_only).await
}

/// Opens specs, keeping one open object for what several of them share.
#[derive(Default)]
pub struct Opener {
    /// Shared objects by key; weak, so the last export to drop one closes it.
    shared: Mutex<HashMap<String, Weak<dyn Any + Send + Sync>>>,
    /// Serialises the making of each shared object, so two specs naming one never make two
    /// (one lock per key: making one object may need another, e.g. a scheduler its device).
    making: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The slices opened on each device (by the device's recordable spec), live or not.
    slices: Mutex<HashMap<String, Vec<OpenSlice>>>,
}

/// A slice an `Opener` opened, for the overlap check.
struct OpenSlice {
    range: std::ops::Range<u64>,
    overlap: bool,
    /// A volume over the whole device, not a slice of it.
    whole: bool,
    dev: Weak<dyn BlockDev>,
}

impl Opener {
    pub fn new() -> Opener {
        Opener::default()
    }

    /// Opens the device or stack `spec` names. `read_only` opens files read-only whatever
    /// their spec says (a cache's own device and its origin stay writable: the export is
    /// what refuses writes).
    pub async fn open(&self, spec: &Spec, read_only: bool) -> Result<Arc<dyn BlockDev>> {
        open_with(self, spec, read_only).await
    }

    /// The object shared under `key` (for instance `thin-pool:` and the metadata device's
    /// canonical path), made by `make` if no live one is held. A key names one type: asking
    /// for another type under it is refused.
    pub async fn shared<T, F, Fut>(&self, key: &str, make: F) -> Result<Arc<T>>
    where
        T: Any + Send + Sync,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Arc<T>>>,
    {
        let lock = self.making.lock().entry(key.to_string()).or_default().clone();
        let _making = lock.lock().await;
        if let Some(held) = self.shared.lock().get(key).and_then(Weak::upgrade) {
            return held.downcast::<T>().map_err(|_| {
                Error::new(ErrorKind::Invalid, format!("{key} is already open as another kind of device"))
            });
        }
        let made = make().await?;
        let erased: Arc<dyn Any + Send + Sync> = made.clone();
        let mut shared = self.shared.lock();
        shared.retain(|_, w| w.strong_count() > 0);
        shared.insert(key.to_string(), Arc::downgrade(&erased));
        Ok(made)
    }

    /// `shared`, for an object its last user closes (a device under slices, a thin pool),
    /// `take`n for one more user (a lease on it, a volume of it). One closed but not gone yet
    /// (an `export remove` finishing), or closed before `take` had it (by another open,
    /// refused meanwhile), is waited out for up to 10 s in all, and then made anew. The
    /// object comes back with `take`'s answer, for the caller to close one no user holds.
    async fn shared_live<T, R, F, Fut, G, GFut>(
        &self,
        key: &str,
        make: F,
        closed: impl Fn(&T) -> bool,
        take: G,
    ) -> Result<(Arc<T>, Result<R>)>
    where
        T: Any + Send + Sync,
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Arc<T>>>,
        G: Fn(Arc<T>) -> GFut,
        GFut: Future<Output = Result<R>>,
    {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let held = self.shared(key, &make).await?;
            let late = std::time::Instant::now() >= deadline;
            if late || !closed(&held) {
                let taken = take(held.clone()).await;
                if late || taken.is_ok() || !closed(&held) {
                    return Ok((held, taken));
                }
            }
            drop(held);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

async fn open_with(opener: &Opener, spec: &Spec, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    let open = |spec, read_only| Box::pin(open_with(opener, spec, read_only));
    Ok(match spec {
        Spec::File(f) => Arc::new(open_file(f, read_only)?),
        Spec::Mem { bytes } => Arc::new(MemDev::new(*bytes)),
        Spec::Hdd { file, params } => Arc::new(LatencyDev::hdd(open_file(file, read_only)?, *params)),
        Spec::Ssd { file, params } => Arc::new(LatencyDev::ssd(open_file(file, read_only)?, *params)),
        Spec::Fault { rules, inner } => with_faults(open(inner, read_only).await?, rules),
        Spec::Cache { path, origin } => Arc::new(
            open_cache(opener, path, origin.as_deref())
                .await
                .map_err(|e| Error::new(e.kind, format!("opening cache {}: {}", path.display(), e.context)))?,
        ),
        Spec::Writecache { path, origin } => Arc::new(
            open_writecache(opener, path, origin.as_deref())
                .await
                .map_err(|e| Error::new(e.kind, format!("opening writecache {}: {}", path.display(), e.context)))?,
        ),
        Spec::Thin { pool, id, .. } => Arc::new(open_thin(opener, spec).await.map_err(|e| {
            Error::new(e.kind, format!("opening thin volume {id} of {}: {}", pool.display(), e.context))
        })?),
        Spec::Slice { .. } => open_slices(opener, spec, read_only, None).await?,
        Spec::Qos { group, options, inner } => open_qos(opener, group, options, inner, read_only).await?,
        Spec::Nbd(remote) => Arc::new(RemoteDev::open((**remote).clone()).await?),
    })
}

/// Opens a volume in a qos group: the device below `inner`'s slices is opened once, with one
/// scheduler, for every `qos:` spec ending in it; the slices go over the group's handle.
async fn open_qos(
    opener: &Opener,
    group: &str,
    options: &QosOptions,
    inner: &Spec,
    read_only: bool,
) -> Result<Arc<dyn BlockDev>> {
    let mut base = inner;
    while let Spec::Slice { inner, .. } = base {
        base = inner;
    }
    let hdd = match base {
        Spec::Hdd { params, .. } => Some(*params),
        _ => None,
    };
    let key = &format!("qos:{}", base.recordable());
    let join = |shared: Arc<Shared>| async move {
        let qos = opener.shared(key, || async { Ok(Qos::new(shared.dev().clone(), &options.device, hdd)) }).await?;
        shared.lease(Arc::new(qos.join(group, options)?))
    };
    let handle = shared_device(opener, base, read_only, join).await?;
    open_slices(opener, inner, read_only, Some(Arc::new(handle))).await
}

/// A lease, taken by `lease`, on the device `spec` names, opened once for every slice (and
/// scheduler) over it in this server, under its recordable spec. Only the last volume to
/// close shuts the device down.
async fn shared_device<Fut>(
    opener: &Opener,
    spec: &Spec,
    read_only: bool,
    lease: impl Fn(Arc<Shared>) -> Fut,
) -> Result<Lease>
where
    Fut: Future<Output = Result<Lease>>,
{
    let key = format!("device:{}", spec.recordable());
    let make = || async { Ok(Shared::new(Box::pin(open_with(opener, spec, read_only)).await?)) };
    opener.shared_live(&key, make, |s: &Shared| s.closed(), lease).await?.1
}

/// Opens `spec`'s slices (`slice:..@slice:..@DEV`) over the shared device `DEV`, or over
/// `base` in its place (an IO controller's handle onto it), checking each range against
/// the device below it and against the other volumes on that device. A volume over the
/// whole device (a `qos:` group over it) counts as a slice of all of it that says no
/// `overlap`.
async fn open_slices(
    opener: &Opener,
    spec: &Spec,
    read_only: bool,
    base: Option<Arc<dyn BlockDev>>,
) -> Result<Arc<dyn BlockDev>> {
    // The device itself: `base`, or a lease on the shared device.
    let device = |spec, base: Option<Arc<dyn BlockDev>>| async move {
        match base {
            Some(b) => Ok::<_, Error>(b),
            None => {
                let lease = |shared: Arc<Shared>| async move { shared.lease(shared.dev().clone()) };
                Ok(Arc::new(shared_device(opener, spec, read_only, lease).await?) as Arc<dyn BlockDev>)
            }
        }
    };
    let Spec::Slice { offset, len, overlap, inner } = spec else {
        let dev = device(spec, base).await?;
        let whole = 0..dev.size();
        return take_range(opener, spec, spec, whole, false, dev, |d| d).await;
    };
    let below = match **inner {
        Spec::Slice { .. } => Box::pin(open_slices(opener, inner, read_only, base)).await?,
        _ => device(inner, base).await?,
    };
    let (offset, len) = (*offset, *len);
    take_range(opener, spec, inner, offset..offset + len, *overlap, below, |below| {
        Arc::new(Slice { inner: below, offset, len })
    })
    .await
}

/// Makes the volume `spec` (`make` over `below`) once its `range` of `inner` is checked
/// against `below`'s size and the other volumes open on `inner`, and records it there. A
/// volume refused gives its place on the device up as a closing one does, so a device
/// that no other volume holds is shut down, not dropped.
async fn take_range(
    opener: &Opener,
    spec: &Spec,
    inner: &Spec,
    range: std::ops::Range<u64>,
    overlap: bool,
    below: Arc<dyn BlockDev>,
    make: impl FnOnce(Arc<dyn BlockDev>) -> Arc<dyn BlockDev>,
) -> Result<Arc<dyn BlockDev>> {
    let whole = !matches!(spec, Spec::Slice { .. });
    let refused = {
        let mut slices = opener.slices.lock();
        let open = slices.entry(inner.recordable().to_string()).or_default();
        open.retain(|s| s.dev.strong_count() > 0);
        let clash =
            open.iter().find(|s| s.range.start < range.end && range.start < s.range.end && !(s.overlap && overlap));
        let to_share = "serve slices of it instead, each with ?overlap, to let them overlap";
        match clash {
            _ if range.end > below.size() => {
                format!(
                    "{spec}: the slice ends at byte {}, past the end of {inner} ({} bytes)",
                    range.end,
                    below.size()
                )
            }
            Some(other) if other.whole => {
                format!("{spec}: a volume over the whole of {inner} is already open ({to_share})")
            }
            Some(other) => {
                let (start, len) = (other.range.start, other.range.end - other.range.start);
                match whole {
                    true => format!("{spec}: the slice {start}+{len} of {inner} is already open ({to_share})"),
                    false => format!(
                        "{spec}: overlaps the slice {start}+{len} of {inner} already open (give both ?overlap to allow it)"
                    ),
                }
            }
            None => {
                let dev = make(below);
                open.push(OpenSlice { range, overlap, whole, dev: Arc::downgrade(&dev) });
                return Ok(dev);
            }
        }
    };
    let _ = below.shutdown().await;
    Err(Error::new(ErrorKind::Invalid, refused))
}

/// Opens and claims a file or block device with its spec's options.
pub fn open_file(f: &FileSpec, read_only: bool) -> Result<FileDev> {
    open_file_with(f, FileOptions { read_only, ..FileOptions::default() })
}

/// Opens and claims, writable, the file or block device a create command formats (a cache
/// device, write log or pool's metadata): a file it makes for `size=` is allocated in full,
/// so that the format's writes never meet a full file system later.
pub fn open_to_format(f: &FileSpec) -> Result<FileDev> {
    open_file_with(f, FileOptions { allocate: true, ..FileOptions::default() })
}

/// `open_file` with `base`'s `allocate` and `read_only` (the spec's own `ro` added).
fn open_file_with(f: &FileSpec, base: FileOptions) -> Result<FileDev> {
    let read_only = base.read_only || f.ro;
    let opts = FileOptions { direct: f.direct, engine: f.engine, create_size: f.size, read_only, ..base };
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
async fn open_cache(opener: &Opener, path: &Path, origin: Option<&Spec>) -> Result<CacheDev> {
    let shown = path.display();
    let invalid = |msg: String| Error::new(ErrorKind::Invalid, msg);
    let cache = cache_device(path, false)?;
    let (meta, findings) =
        Meta::load(&*cache).await.map_err(|e| Error::new(e.kind, format!("{shown}: {}", e.context)))?;
    if !findings.errors.is_empty() {
        return Err(invalid(format!(
            "{shown}: metadata is damaged ({}); `strata cache check {shown}` shows it, and `--repair` accepts the loss and rewrites it",
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
    if let Some(id) = origin.identity_mismatch(&meta.sb.origin_id) {
        return Err(invalid(format!(
            "{shown}: wrong origin: {origin} is not the device this cache was created for (identity {id}, expected {})",
            meta.sb.origin_id
        )));
    }
    let origin = Box::pin(opener.open(origin, false)).await;
    let origin = origin.map_err(|e| Error::new(e.kind, format!("origin of {shown}: {}", e.context)))?;
    CacheDev::open(cache, origin, meta, OpenOptions::default()).await
}

/// Opens a write log for serving: reads its superblock, opens the origin `origin` names or
/// else the one the superblock records, after checking it is the device the log was made
/// for, and recovers the log.
async fn open_writecache(opener: &Opener, path: &Path, origin: Option<&Spec>) -> Result<WritecacheDev> {
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
    if let Some(id) = origin.identity_mismatch(&sb.origin_id) {
        return Err(invalid(format!(
            "{shown}: wrong origin: {origin} is not the device this log was created for (identity {id}, expected {})",
            sb.origin_id
        )));
    }
    let origin = Box::pin(opener.open(origin, false)).await;
    let origin = origin.map_err(|e| Error::new(e.kind, format!("origin of {shown}: {}", e.context)))?;
    WritecacheDev::open(cache, origin, strata_writecache::OpenOptions::default()).await
}

/// Opens volume `id` of the pool on `path`: one pool per metadata device for all the
/// volumes an opener opens, its data device the one `data` names or else the one recorded
/// in the pool's superblock. The last of them to shut down shuts the pool's devices down.
async fn open_thin(opener: &Opener, spec: &Spec) -> Result<ThinDev> {
    let Spec::Thin { pool: path, id, size, skip_zeroing, data, .. } = spec else {
        unreachable!("open_thin of a thin: spec")
    };
    let (id, size, skip_zeroing, data) = (*id, *size, *skip_zeroing, data.as_deref());
    let shown = path.display();
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string();
    let key = format!("thin-pool:{canonical}");
    let make = || async {
        let md = cache_device(path, false)?;
        let recorded;
        let data = match data {
            Some(d) => d,
            None => {
                let sb = strata_thin::meta::read_superblock(&*md).await?;
                if sb.record.data_spec.is_empty() {
                    return Err(Error::new(
                        ErrorKind::Invalid,
                        format!("{shown}: the pool records no data device; give thin:{shown}?id={id}&data=SPEC"),
                    ));
                }
                recorded = Spec::parse(&sb.record.data_spec)
                    .map_err(|e| Error::new(e.kind, format!("the recorded data device: {}", e.context)))?;
                &recorded
            }
        };
        let dev = Box::pin(opener.open(data, false)).await;
        let dev = dev.map_err(|e| Error::new(e.kind, format!("data device of {shown}: {}", e.context)))?;
        let opts = PoolOptions { skip_block_zeroing: skip_zeroing, ..PoolOptions::default() };
        match Pool::open(md, dev.clone(), &data.to_string(), opts).await {
            Ok(pool) => {
                pool.set_path(&canonical);
                Ok(pool)
            }
            Err(e) => {
                let _ = dev.shutdown().await;
                Err(e)
            }
        }
    };
    let volume =
        |pool: Arc<Pool>| async move { with_settings(&pool, spec).and_then(|()| ThinDev::new(pool, id, size)) };
    let (pool, volume) = opener.shared_live(&key, make, |p: &Pool| p.closed(), volume).await?;
    if volume.is_err() {
        // A pool no volume holds (this open made it) is closed cleanly, not dropped.
        let _ = pool.close_unused().await;
    }
    volume
}

/// Checks that an open pool is the one `spec` names it as, and applies the spec's settings.
fn with_settings(pool: &Pool, spec: &Spec) -> Result<()> {
    let Spec::Thin { pool: path, skip_zeroing, low_water, commit_period_ms, data, .. } = spec else {
        unreachable!("with_settings of a thin: spec")
    };
    let shown = path.display();
    if let Some(d) = data {
        if d.to_string() != pool.data_spec {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{shown} is already open with data device {}, not {d}", pool.data_spec),
            ));
        }
    }
    if pool.options().skip_block_zeroing != *skip_zeroing {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!("{shown} is already open with skip_block_zeroing {}", if *skip_zeroing { "off" } else { "on" }),
        ));
    }
    // The spec's settings apply to the pool as it is from now on (as `strata thin set`).
    if low_water.is_some() || commit_period_ms.is_some() {
        let t = pool.tunables();
        pool.set_tunables(strata_thin::pool::Tunables {
            low_water_blocks: low_water.unwrap_or(t.low_water_blocks),
            commit_period: commit_period_ms.map(std::time::Duration::from_millis).unwrap_or(t.commit_period),
        });
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pool's metadata in `dir` (`pool.meta`), for a data device of 4 MiB, with volumes 1
    /// and 2: its path.
    pub(crate) async fn pool_meta(dir: &Path) -> std::path::PathBuf {
        let meta = dir.join("pool.meta");
        let Spec::File(file) = format!("{}?size=4MiB", meta.display()).parse().unwrap() else { unreachable!() };
        let md = open_to_format(&file).unwrap();
        let mut m = strata_thin::meta::Metadata::format(&md, 4 << 20, 64 << 10, "mem:4MiB", false).await.unwrap();
        m.create_thin(1).unwrap();
        m.create_thin(2).unwrap();
        m.commit(&md).await.unwrap();
        meta
    }

    #[tokio::test]
    async fn a_shared_object_is_made_once_while_held_and_anew_after_the_last_drop() {
        let opener = Opener::new();
        let made = std::sync::atomic::AtomicUsize::new(0);
        let make = || async {
            made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Arc::new(7u32))
        };
        let a = opener.shared("pool:/x", make).await.unwrap();
        let b = opener.shared("pool:/x", make).await.unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 1);
        let other = opener.shared("pool:/y", make).await.unwrap();
        assert!(!Arc::ptr_eq(&a, &other));
        let wrong = opener.shared("pool:/x", || async { Ok(Arc::new("text")) }).await;
        assert_eq!(wrong.unwrap_err().kind, ErrorKind::Invalid);
        drop((a, b));
        let c = opener.shared("pool:/x", make).await.unwrap();
        assert_eq!(*c, 7);
        assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    /// A slice opened while the shared device's last volume is closing it waits for that
    /// volume to go and opens the device anew, rather than failing with Busy.
    #[tokio::test]
    async fn a_slice_opened_as_its_device_closes_waits_and_opens_it_anew() {
        let opener = Opener::new();
        let open = |s: &str| {
            let spec: Spec = s.parse().unwrap();
            let opener = &opener;
            async move { opener.open(&spec, false).await }
        };
        let a = open("slice:0+1MiB@mem:4MiB").await.unwrap();
        a.shutdown().await.unwrap();
        let (b, ()) = tokio::join!(open("slice:1MiB+1MiB@mem:4MiB"), async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            drop(a);
        });
        let b = b.expect("opened once the closing volume was gone");
        b.write(0, strata_io::Buf::from_slice(&[1u8; 4096]), false).await.unwrap();
    }

    /// The same for a thin pool: a volume opened while the pool's last volume is shutting
    /// it down waits for that volume to go, and opens the pool anew.
    #[tokio::test]
    async fn a_thin_volume_opened_as_its_pool_closes_waits_and_opens_it_anew() {
        let dir = tempfile::tempdir().unwrap();
        let meta = pool_meta(dir.path()).await;
        let opener = Opener::new();
        let open = |id: u32| {
            let spec: Spec = format!("thin:{}?id={id}&size=1MiB", meta.display()).parse().unwrap();
            let opener = &opener;
            async move { opener.open(&spec, false).await }
        };
        let a = open(1).await.unwrap();
        a.shutdown().await.unwrap();
        let (b, ()) = tokio::join!(open(2), async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            drop(a);
        });
        let b = b.expect("opened once the closing volume was gone");
        b.write(0, strata_io::Buf::from_slice(&[1u8; 4096]), false).await.unwrap();
        b.shutdown().await.unwrap();
    }
}
