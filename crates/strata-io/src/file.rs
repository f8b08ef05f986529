//! `PATH` — a regular file or a block device. Opened with O_DIRECT where the file system
//! allows it (the page cache would otherwise hide the device's real behaviour and double the
//! memory used), falling back to buffered IO with a message where it does not. Requests the
//! direct path cannot take as they are (not aligned to the device's direct-IO alignment) go
//! through an aligned bounce buffer; a read-modify-write holds off other writes meanwhile.
//!
//! Every open claims its file for the life of the device: `flock(LOCK_EX)` when writable,
//! `flock(LOCK_SH)` when read-only, and O_EXCL on a writable block device. The lock belongs to
//! the open file description, so a second open of the same file is refused within one process
//! as well as from another. `Claim::Unclaimed` (a spec's `?ro&shared`) reads without a lock.

use crate::depth::QueueDepth;
use crate::engine::{self, EngineKind, IoEngine, Op};
use crate::rwlock::RwLock;
use crate::{check_range, BlockDev, BoxFut, Buf, Error, ErrorKind, Extent, Geometry, Result, ZeroFlags};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Try O_DIRECT (falls back to buffered IO where refused).
    pub direct: bool,
    pub engine: EngineKind,
    /// Create a sparse file of this size if the path does not exist.
    pub create_size: Option<u64>,
    /// A file made for `create_size` is allocated in full rather than sparse (for a device a
    /// format lives on, whose writes must not meet a full file system later).
    pub allocate: bool,
    pub read_only: bool,
}

/// Gives a new file its `size`: allocated in full if `allocate` (where the file system cannot
/// allocate ahead, sparse as without it), else sparse.
fn size_new_file(f: &std::fs::File, size: u64, allocate: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if allocate && size > 0 {
        // SAFETY: a valid open descriptor; mode 0 allocates and extends the file.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size as libc::off_t) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
    }
    f.set_len(size)
}

impl Default for FileOptions {
    fn default() -> FileOptions {
        FileOptions {
            direct: true,
            engine: engine::DEFAULT_ENGINE,
            create_size: None,
            allocate: false,
            read_only: false,
        }
    }
}

/// How an open claims its file against other opens of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Claim {
    /// `LOCK_EX` (and O_EXCL on a block device) when writable, `LOCK_SH` when read-only.
    #[default]
    Default,
    /// No lock: a read-only open beside a writer. Refused for a writable open.
    Unclaimed,
}

pub struct FileDev {
    file: Arc<File>,
    path: PathBuf,
    /// Grows (`grow`) while open.
    size: AtomicU64,
    direct: bool,
    block_device: bool,
    rotational: bool,
    /// Offset and length alignment the direct path needs (1 when buffered).
    align: u64,
    read_only: bool,
    engine: Arc<dyn IoEngine>,
    /// Operations handed to the engine and not yet completed, over time (reads and writes
    /// that the page cache answers inline never reach it).
    depth: Arc<QueueDepth>,
    /// Aligned writes share it; a read-modify-write takes it alone.
    rmw: RwLock,
    /// Why the device stopped taking writes: an fdatasync or FUA write failed, and the kernel
    /// may have dropped what it covered (a later fdatasync would succeed without it).
    stopped: parking_lot::Mutex<Option<String>>,
    /// Writes, discards, zeroings and growths completed since the open, from 1 (what an
    /// earlier opener left in the page cache counts as one), and how many of them the last
    /// fdatasync covered. A flush with nothing new is answered without one.
    changes: AtomicU64,
    flushed: AtomicU64,
    fdatasyncs: AtomicU64,
    flushes_skipped: AtomicU64,
    _claimed: Option<Claimed>,
}

const BLKGETSIZE64: libc::c_ulong = 0x80081272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;

impl FileDev {
    /// Opens and claims `path` (see `Claim::Default`).
    pub fn open(path: &Path, opts: &FileOptions) -> Result<FileDev> {
        FileDev::open_claimed(path, opts, Claim::Default)
    }

    pub fn open_claimed(path: &Path, opts: &FileOptions, claim: Claim) -> Result<FileDev> {
        let ctx = |what: &str| format!("{}: {what}", path.display());
        if claim == Claim::Unclaimed && !opts.read_only {
            return Err(Error::new(ErrorKind::Invalid, ctx("only a read-only open may go unclaimed")));
        }
        if let Some(size) = opts.create_size {
            match std::fs::metadata(path) {
                Ok(meta) if meta.is_file() && meta.len() != size => {
                    return Err(Error::new(
                        ErrorKind::Invalid,
                        ctx(&format!(
                            "exists with size {} but size={} was asked for; refusing to resize it",
                            meta.len(),
                            size
                        )),
                    ));
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let f = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(path)
                        .map_err(|e| Error::from_os(e, ctx("cannot create")))?;
                    if let Err(e) = size_new_file(&f, size, opts.allocate) {
                        // Not left behind empty: the next try would find a file of the wrong size.
                        let _ = std::fs::remove_file(path);
                        return Err(Error::from_os(e, ctx("cannot size")));
                    }
                }
                Err(e) => return Err(Error::from_os(e, ctx("cannot stat"))),
            }
        }
        // A writable block device is opened O_EXCL: EBUSY while mounted or held by the kernel
        // (md, dm, bcache) or by another exclusive opener.
        let node = std::fs::metadata(path).ok();
        // Refused before the open: a read-only open of a FIFO waits for a writer.
        if node.as_ref().is_some_and(|m| !m.is_file() && !m.file_type().is_block_device()) {
            return Err(Error::new(ErrorKind::Invalid, ctx(NOT_A_DEVICE)));
        }
        let excl = claim == Claim::Default
            && !opts.read_only
            && node.as_ref().is_some_and(|m| m.file_type().is_block_device());
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(!opts.read_only);
            let mut flags = if excl { libc::O_EXCL } else { 0 };
            if direct {
                flags |= libc::O_DIRECT;
            }
            o.custom_flags(flags);
            o.open(path)
        };
        let busy = |e: &std::io::Error| excl && e.raw_os_error() == Some(libc::EBUSY);
        let (file, direct) = match open(opts.direct) {
            Ok(f) => (f, opts.direct),
            Err(e) if busy(&e) => return Err(device_busy(path, node.as_ref())),
            Err(e) if opts.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("strata: {}: the file system refuses O_DIRECT; using buffered IO", path.display());
                match open(false) {
                    Ok(f) => (f, false),
                    Err(e) if busy(&e) => return Err(device_busy(path, node.as_ref())),
                    Err(e) => return Err(Error::from_os(e, ctx("cannot open"))),
                }
            }
            Err(e) => return Err(Error::from_os(e, ctx("cannot open"))),
        };
        let meta = file.metadata().map_err(|e| Error::from_os(e, ctx("cannot stat")))?;
        let claimed = match claim {
            Claim::Default => Some(lock(&file, path, &meta, opts.read_only)?),
            Claim::Unclaimed => None,
        };
        let block_device = meta.file_type().is_block_device();
        let fd = file.as_raw_fd();
        let (size, sector) = if block_device {
            let mut size: u64 = 0;
            let mut sector: libc::c_int = 512;
            // SAFETY: ioctls that fill the given integers.
            unsafe {
                if libc::ioctl(fd, BLKGETSIZE64, &mut size) != 0 {
                    return Err(Error::from_os(std::io::Error::last_os_error(), ctx("BLKGETSIZE64")));
                }
                libc::ioctl(fd, BLKSSZGET, &mut sector);
            }
            (size, sector.max(512) as u64)
        } else if meta.is_file() {
            (meta.len(), dio_alignment(path))
        } else {
            return Err(Error::new(ErrorKind::Invalid, ctx(NOT_A_DEVICE)));
        };
        let rotational = block_device && sysfs_rotational(&meta);
        Ok(FileDev {
            file: Arc::new(file),
            path: path.to_owned(),
            size: AtomicU64::new(size),
            direct,
            block_device,
            rotational,
            align: if direct { sector } else { 1 },
            read_only: opts.read_only,
            engine: engine::shared(opts.engine),
            depth: Arc::new(QueueDepth::new()),
            rmw: RwLock::new(),
            stopped: parking_lot::Mutex::new(None),
            changes: AtomicU64::new(1),
            flushed: AtomicU64::new(0),
            fdatasyncs: AtomicU64::new(0),
            flushes_skipped: AtomicU64::new(0),
            _claimed: claimed,
        })
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    fn aligned(&self, offset: u64, len: u64) -> bool {
        offset.is_multiple_of(self.align) && len.is_multiple_of(self.align)
    }

    fn os_err(&self, e: std::io::Error, what: &str, offset: u64) -> Error {
        Error::from_os(e, format!("{} {what} at offset {offset}", self.path.display()))
    }

    fn writable(&self, what: &str) -> Result<()> {
        if self.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{}: {what} on a read-only device", self.path.display()),
            ));
        }
        if let Some(why) = &*self.stopped.lock() {
            let msg =
                format!("{}: {what} refused: a flush failed earlier ({why}); reopen the device", self.path.display());
            return Err(Error::new(ErrorKind::Io, msg));
        }
        Ok(())
    }

    /// Latches a failed flush or FUA write (see `stopped`) and passes the error on.
    fn durability_failed(&self, e: Error) -> Error {
        if !matches!(e.kind, ErrorKind::Invalid | ErrorKind::OutOfRange) {
            self.stopped.lock().get_or_insert_with(|| e.context.clone());
        }
        e
    }

    /// Counts a change to the device, once it completed (failed ones too: part of it may have
    /// reached the file).
    fn changed<T>(&self, r: T) -> T {
        self.changes.fetch_add(1, Ordering::AcqRel);
        r
    }

    async fn do_flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.writable("flush")?;
        // Every change completed before this flush was asked for is counted by now.
        let seen = self.changes.load(Ordering::Acquire);
        if self.flushed.load(Ordering::Acquire) == seen {
            self.flushes_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
        let (_, res) = self.engine.submit(self.file.clone(), Op::Fdatasync, self.depth.clone()).await;
        res.map_err(|e| self.durability_failed(self.os_err(e, "flush", 0)))?;
        self.flushed.fetch_max(seen, Ordering::AcqRel);
        Ok(())
    }

    async fn raw_read(&self, offset: u64, buf: Buf) -> Result<Buf> {
        let buf = if self.direct {
            buf
        } else {
            match try_read_nowait(&self.file, offset, buf) {
                Ok(done) => return Ok(done),
                Err(buf) => buf,
            }
        };
        self.engine_read(offset, buf).await
    }

    async fn engine_read(&self, offset: u64, buf: Buf) -> Result<Buf> {
        let (buf, res) = self.engine.submit(self.file.clone(), Op::Read { offset, buf }, self.depth.clone()).await;
        res.map_err(|e| self.os_err(e, "read", offset))?;
        Ok(buf.expect("read returns its buffer"))
    }

    async fn raw_write(&self, offset: u64, buf: Buf, fua: bool) -> Result<Buf> {
        if !self.direct && !fua {
            // A buffered write only copies into the page cache: doing it right here costs less
            // than handing it to another thread (many file systems refuse RWF_NOWAIT writes, so
            // there is no cheaper non-blocking probe). It can block only under dirty-page
            // throttling, which slows every writer of this file alike.
            let (buf, res) = engine::run_blocking(&self.file, Op::Write { offset, buf, dsync: false });
            res.map_err(|e| self.os_err(e, "write", offset))?;
            return Ok(buf.expect("write returns its buffer"));
        }
        let (buf, res) =
            self.engine.submit(self.file.clone(), Op::Write { offset, buf, dsync: fua }, self.depth.clone()).await;
        res.map_err(|e| self.os_err(e, "write", offset))?;
        Ok(buf.expect("write returns its buffer"))
    }

    /// The aligned span covering `[offset, offset+len)`, clipped to the device.
    fn covering(&self, offset: u64, len: u64) -> (u64, u64) {
        let start = offset / self.align * self.align;
        let end = (offset + len).div_ceil(self.align) * self.align;
        (start, end.min(self.size().div_ceil(self.align) * self.align) - start)
    }

    async fn do_read(&self, offset: u64, mut buf: Buf) -> Result<Buf> {
        check_range("read", offset, buf.len() as u64, self.size())?;
        if self.aligned(offset, buf.len() as u64) {
            return self.raw_read(offset, buf).await;
        }
        let (start, span) = self.covering(offset, buf.len() as u64);
        let bounce = self.raw_read(start, Buf::zeroed(span as usize)).await?;
        let at = (offset - start) as usize;
        let n = buf.len();
        buf.copy_from_slice(&bounce[at..at + n]);
        Ok(buf)
    }

    async fn do_write(&self, offset: u64, buf: Buf, fua: bool) -> Result<Buf> {
        self.writable("write")?;
        let r = self.write_checked(offset, buf, fua).await;
        if fua {
            // A write with O_DIRECT the file system refused for want of space (it allocates
            // before it writes) left no page of the file's cache behind it, so a later flush
            // claims nothing it lost: a full disk fails that write and latches nothing. A
            // buffered file's FUA write can report another page's failed write-back (the
            // file's error sequence, ENOSPC included), and latches.
            return r
                .map_err(|e| if self.direct && e.kind == ErrorKind::NoSpace { e } else { self.durability_failed(e) });
        }
        r
    }

    async fn write_checked(&self, offset: u64, buf: Buf, fua: bool) -> Result<Buf> {
        check_range("write", offset, buf.len() as u64, self.size())
            .map_err(|e| Error::new(ErrorKind::NoSpace, e.context))?;
        if self.aligned(offset, buf.len() as u64) {
            let _shared = self.rmw.read().await;
            return self.raw_write(offset, buf, fua).await;
        }
        let _alone = self.rmw.write().await;
        let (start, span) = self.covering(offset, buf.len() as u64);
        let mut bounce = self.raw_read(start, Buf::zeroed(span as usize)).await?;
        let at = (offset - start) as usize;
        bounce[at..at + buf.len()].copy_from_slice(&buf);
        self.raw_write(start, bounce, fua).await?;
        let size = self.size();
        if !self.block_device && start + span > size {
            // The bounce covered the last, partial sector of a file whose size is not a
            // multiple of it, and so lengthened the file: cut it back, durably with FUA.
            let cut = self.file.set_len(size).and_then(|()| if fua { self.file.sync_data() } else { Ok(()) });
            cut.map_err(|e| self.os_err(e, "ftruncate after a write to the last sector", offset))?;
        }
        Ok(buf)
    }

    async fn fallocate(&self, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
        let (_, res) =
            self.engine.submit(self.file.clone(), Op::Fallocate { mode, offset, len }, self.depth.clone()).await;
        res.map(|_| ())
    }

    async fn blk_ioctl(&self, req: libc::c_ulong, offset: u64, len: u64) -> std::io::Result<()> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || {
            let range: [u64; 2] = [offset, len];
            // SAFETY: the ioctl reads a two-u64 range.
            let r = unsafe { libc::ioctl(file.as_raw_fd(), req, range.as_ptr()) };
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }

    async fn do_discard(&self, offset: u64, len: u64) -> Result<()> {
        self.writable("discard")?;
        check_range("discard", offset, len, self.size())?;
        let res = if self.block_device {
            // Only whole sectors can be discarded; the rest keeps its contents.
            let start = offset.div_ceil(self.align.max(512)) * self.align.max(512);
            let end = (offset + len) / self.align.max(512) * self.align.max(512);
            if end <= start {
                return Ok(());
            }
            self.blk_ioctl(BLKDISCARD, start, end - start).await
        } else {
            let _alone = self.rmw.write().await;
            self.fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len).await
        };
        match res {
            // Discard is advisory: a device that cannot free space has still done its job.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            r => r.map_err(|e| self.os_err(e, "discard", offset)),
        }
    }

    async fn do_write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.writable("write_zeroes")?;
        check_range("write_zeroes", offset, len, self.size()).map_err(|e| Error::new(ErrorKind::NoSpace, e.context))?;
        if len == 0 {
            return Ok(());
        }
        let fast = if self.block_device {
            if flags.fast_only {
                Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
            } else if self.aligned(offset, len) && offset.is_multiple_of(512) && len.is_multiple_of(512) {
                self.blk_ioctl(BLKZEROOUT, offset, len).await
            } else {
                Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
            }
        } else {
            let mode = if flags.may_unmap {
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
            } else {
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
            };
            let _alone = self.rmw.write().await;
            self.fallocate(mode, offset, len).await
        };
        match fast {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                if flags.fast_only {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!("{}: cannot zero quickly", self.path.display()),
                    ));
                }
                self.write_zero_buffers(offset, len).await
            }
            Err(e) => Err(self.os_err(e, "write_zeroes", offset)),
        }
    }

    async fn write_zero_buffers(&self, offset: u64, len: u64) -> Result<()> {
        const STEP: u64 = 1 << 20;
        let mut pos = offset;
        let mut zeros = Buf::zeroed(STEP as usize);
        while pos < offset + len {
            let n = STEP.min(offset + len - pos);
            zeros.set_len(n as usize);
            zeros = self.do_write(pos, zeros, false).await?;
            pos += n;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range("block_status", offset, len, self.size())?;
        if self.block_device || len == 0 {
            return Ok(vec![Extent::data(len)]);
        }
        let fd = self.file.as_raw_fd();
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let mut pos = offset;
        while pos < end {
            // SAFETY: lseek on our fd; we never rely on the file position elsewhere.
            let data = unsafe { libc::lseek(fd, pos as i64, libc::SEEK_DATA) };
            let (hole_end, data_start) = if data < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENXIO) {
                    (end, end) // no data after pos
                } else {
                    return Ok(vec![Extent::data(len)]); // SEEK_DATA unsupported: say "data"
                }
            } else {
                ((data as u64).min(end), data as u64)
            };
            if hole_end > pos {
                out.push(Extent::hole(hole_end - pos));
                pos = hole_end;
                continue;
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data_start as i64, libc::SEEK_HOLE) };
            let data_end = if hole < 0 { end } else { (hole as u64).min(end) };
            out.push(Extent::data(data_end - pos));
            pos = data_end;
        }
        Ok(out)
    }
}

/// How long a claim waits for a lock whose holder is gone: the kernel drops a lock only when
/// the last reference to its file goes, and io_uring lets go of its files a moment after the
/// process that used them has been reaped, or after a device of this process has closed one.
const DEAD_HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The files this process's devices hold claims on, as (device, inode), once per claim.
static CLAIMS: parking_lot::Mutex<Vec<(u64, u64)>> = parking_lot::Mutex::new(Vec::new());

/// A device's entry in `CLAIMS`, for the device's life. A lock this process holds on a file
/// with no entry is a claim being let go: the kernel drops a file's lock with its last
/// reference, and io_uring lets go of its reference a moment after the device has closed it.
struct Claimed((u64, u64));

impl Drop for Claimed {
    fn drop(&mut self) {
        let mut claims = CLAIMS.lock();
        if let Some(i) = claims.iter().position(|&c| c == self.0) {
            claims.swap_remove(i);
        }
    }
}

/// Takes the advisory lock of a claim on `file`: shared when read-only, exclusive otherwise.
/// Fails at once while a live holder has it (another process, or a device of this one);
/// waits up to `DEAD_HOLDER_WAIT` while it has none (a process killed a moment ago, a device
/// of this process just closed).
fn lock(file: &File, path: &Path, meta: &std::fs::Metadata, read_only: bool) -> Result<Claimed> {
    use std::os::unix::fs::MetadataExt;
    let op = if read_only { libc::LOCK_SH } else { libc::LOCK_EX };
    let key = (meta.dev(), meta.ino());
    let claimed = || {
        CLAIMS.lock().push(key);
        Claimed(key)
    };
    let me = std::process::id();
    let start = std::time::Instant::now();
    loop {
        // SAFETY: flock on our own fd.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(claimed());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            // A file system without locks (some FUSE ones) must not make the file unusable.
            eprintln!("strata: {}: cannot lock it ({e}); nothing stops a second writer", path.display());
            return Ok(claimed());
        }
        let holders = flock_holders(meta.dev(), meta.ino());
        let live = holders.iter().any(|h| match h.pid {
            0 => true,
            pid if pid == me => CLAIMS.lock().contains(&key),
            pid => std::path::Path::new(&format!("/proc/{pid}")).exists(),
        });
        if live || start.elapsed() >= DEAD_HOLDER_WAIT {
            let who = describe_holders(&holders)
                .unwrap_or_else(|| "in use by another open of it (no holder found in /proc/locks)".to_string());
            return Err(Error::new(ErrorKind::Busy, format!("cannot claim {}: {who}", path.display())));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A process holding a `flock` on a file, from /proc/locks.
struct Holder {
    /// 0 when the holder is outside this pid namespace.
    pid: u32,
    write: bool,
}

/// The holders of `flock` locks on the file with this device and inode.
fn flock_holders(dev: u64, ino: u64) -> Vec<Holder> {
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let text = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let mut out: Vec<Holder> = Vec::new();
    for line in text.lines() {
        // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; waiters have "->" after the number.
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" || f[5] != want {
            continue;
        }
        let pid = f[4].parse::<i64>().ok().filter(|p| *p > 0).unwrap_or(0) as u32;
        if !out.iter().any(|h| h.pid == pid) {
            out.push(Holder { pid, write: f[3] == "WRITE" });
        }
    }
    out
}

/// "in use by pid 1234 (strata serve ...)", or that this process holds it; None if no holder.
fn describe_holders(holders: &[Holder]) -> Option<String> {
    let me = std::process::id();
    if holders.iter().any(|h| h.pid == me) {
        return Some(format!(
            "already open in this process (pid {me}) as another volume or as a cache's origin or cache device"
        ));
    }
    if holders.is_empty() {
        return None;
    }
    let each: Vec<String> = holders
        .iter()
        .map(|h| {
            let role = if h.write { "" } else { ", reading" };
            match h.pid {
                0 => format!("a process outside this pid namespace{role}"),
                pid => format!("pid {pid} ({}){role}", cmdline(pid)),
            }
        })
        .collect();
    Some(format!("in use by {}", each.join(", ")))
}

/// The command line of `pid`, its program without the directory, shortened.
fn cmdline(pid: u32) -> String {
    const MAX: usize = 80;
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut args: Vec<String> =
        raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    if let Some(prog) = args.first_mut() {
        if let Some((_, base)) = prog.rsplit_once('/') {
            *prog = base.to_string();
        }
    }
    let mut s = args.join(" ");
    if s.is_empty() {
        return "command unknown".to_string();
    }
    if s.chars().count() > MAX {
        s = s.chars().take(MAX).collect::<String>() + " ...";
    }
    s
}

/// Why a block device refused O_EXCL: a strata holder from /proc/locks, else a mount or a
/// kernel holder (dm, md, bcache) from /proc/self/mountinfo and sysfs.
fn device_busy(path: &Path, node: Option<&std::fs::Metadata>) -> Error {
    use std::os::unix::fs::MetadataExt;
    let mut who = node.and_then(|m| describe_holders(&flock_holders(m.dev(), m.ino())));
    if who.is_none() {
        if let Some(m) = node {
            let id = format!("{}:{}", libc::major(m.rdev()), libc::minor(m.rdev()));
            let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() > 4 && f[2] == id).then(|| f[4].to_string())
                })
                .collect();
            let held: Vec<String> = std::fs::read_dir(format!("/sys/dev/block/{id}/holders"))
                .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            if !mounts.is_empty() {
                who = Some(format!("mounted at {}", mounts.join(", ")));
            } else if !held.is_empty() {
                who = Some(format!("held by {}", held.join(", ")));
            }
        }
    }
    let who = who.unwrap_or_else(|| "busy: mounted, or held open exclusively by another program".to_string());
    Error::new(ErrorKind::Busy, format!("cannot claim {}: {who}", path.display()))
}

/// Reads from the page cache without blocking (RWF_NOWAIT): the filled buffer when it was
/// all there, the buffer back otherwise (then the engine does the read).
fn try_read_nowait(file: &File, offset: u64, mut buf: Buf) -> std::result::Result<Buf, Buf> {
    let len = buf.len();
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
    // SAFETY: iov covers buf, valid for the call.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset as i64, libc::RWF_NOWAIT) };
    if n == len as isize {
        Ok(buf)
    } else {
        Err(buf)
    }
}

/// The offset alignment O_DIRECT needs on this file, from statx where the kernel reports it.
fn dio_alignment(path: &Path) -> u64 {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    const STATX_DIOALIGN: u32 = 0x2000;
    let Ok(cpath) = CString::new(path.as_os_str().as_bytes()) else { return 512 };
    // SAFETY: statx fills the zeroed struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statx(libc::AT_FDCWD, cpath.as_ptr(), 0, STATX_DIOALIGN, &mut stx) };
    if r == 0 && stx.stx_mask & STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0 {
        (stx.stx_dio_offset_align as u64).max(512)
    } else {
        4096
    }
}

fn sysfs_rotational(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/queue/rotational"))
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

impl BlockDev for FileDev {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn grow(&self, bytes: u64) -> BoxFut<'_, Result<u64>> {
        Box::pin(async move {
            let ctx = |what: &str| format!("{}: {what}", self.path.display());
            if self.size() >= bytes {
                return Ok(self.size());
            }
            let size = if self.block_device {
                let mut size: u64 = 0;
                // SAFETY: an ioctl that fills the given integer.
                if unsafe { libc::ioctl(self.file.as_raw_fd(), BLKGETSIZE64, &mut size) } != 0 {
                    return Err(Error::from_os(std::io::Error::last_os_error(), ctx("BLKGETSIZE64")));
                }
                size
            } else if self.read_only {
                return Err(Error::new(ErrorKind::ReadOnly, ctx("opened read-only, cannot grow")));
            } else {
                self.file.set_len(bytes).map_err(|e| Error::from_os(e, ctx("cannot lengthen")))?;
                bytes
            };
            if size < bytes {
                return Err(Error::new(ErrorKind::Invalid, ctx(&format!("holds {size} bytes, fewer than {bytes}"))));
            }
            self.size.fetch_max(size, Ordering::AcqRel);
            Ok(self.changed(self.size()))
        })
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            min_block_bytes: self.align.clamp(1, 65536) as u32,
            preferred_block_bytes: 4096.max(self.align as u32),
            rotational: self.rotational,
            can_discard: true,
            can_fast_zero: !self.block_device,
            read_only: self.read_only,
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} ({}, {}, engine {})",
            self.path.display(),
            if self.block_device { "block device" } else { "file" },
            if self.direct { "O_DIRECT" } else { "buffered" },
            self.engine.name()
        )
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        Box::pin(self.do_read(offset, buf))
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move { self.changed(self.do_write(offset, buf, fua).await) })
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.do_flush())
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(async move { self.changed(self.do_discard(offset, len).await) })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        Box::pin(async move { self.changed(self.do_write_zeroes(offset, len, flags).await) })
    }

    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        crate::ready(self.extents(offset, len))
    }

    fn metrics(&self) -> Vec<crate::metrics::Sample> {
        use crate::metrics::{MetricKind, Sample};
        let mut out = self.depth.samples();
        out.push(Sample::new(
            "strata_device_fdatasyncs_total",
            MetricKind::Counter,
            "Flushes that reached the file or block device (fdatasync).",
            self.fdatasyncs.load(Ordering::Relaxed) as f64,
        ));
        out.push(Sample::new(
            "strata_device_flushes_skipped_total",
            MetricKind::Counter,
            "Flushes answered without an fdatasync: nothing was written since the last one.",
            self.flushes_skipped.load(Ordering::Relaxed) as f64,
        ));
        out
    }
}

const NOT_A_DEVICE: &str = "is neither a regular file nor a block device";

#[cfg(test)]
mod tests {
    use super::*;

    /// A file created for `size=` that the file system cannot make that large is not left
    /// behind empty (a second try found it and refused: "exists with size 0").
    #[test]
    fn a_file_that_cannot_take_its_size_is_not_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("z.img");
        for size in [1u64 << 63, u64::MAX] {
            let opts = FileOptions { create_size: Some(size), ..FileOptions::default() };
            let e = FileDev::open(&path, &opts).err().expect("no file system holds 8 EiB");
            assert!(e.context.contains("cannot size"), "{e}");
            assert!(!path.exists(), "{size}: the empty file stayed");
        }
    }

    /// A FIFO, a directory and a character device are refused, the FIFO without waiting
    /// for a writer (its read-only open blocked the offline tools for good).
    #[test]
    fn what_is_not_a_file_or_block_device_is_refused_before_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for (path, read_only) in
                [(fifo.as_path(), true), (&fifo, false), (dir.path(), true), (Path::new("/dev/null"), true)]
            {
                let opts = FileOptions { read_only, ..FileOptions::default() };
                let e = FileDev::open(path, &opts).err().expect("refused");
                tx.send((path.to_owned(), e)).unwrap();
            }
        });
        for _ in 0..4 {
            // A guard against the hang, not a timing figure: the refusal takes no IO.
            let (path, e) = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the open returned");
            assert_eq!(e.kind, ErrorKind::Invalid, "{}: {e}", path.display());
            assert!(e.context.ends_with(NOT_A_DEVICE), "{}: {e}", path.display());
        }
    }

    /// A lock this process holds on a file none of its devices claims (a closed device's
    /// file that io_uring still references for a moment) is waited for; a device's claim is
    /// refused.
    #[test]
    fn a_claim_being_let_go_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.img");
        let opts = FileOptions { create_size: Some(1 << 20), direct: false, ..FileOptions::default() };
        drop(FileDev::open(&path, &opts).unwrap());
        // The lock as a lingering reference holds it: taken by this process, no device's.
        let lingering = File::open(&path).unwrap();
        // SAFETY: flock on our own fd.
        assert_eq!(unsafe { libc::flock(lingering.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(lingering);
        });
        let dev = FileDev::open(&path, &opts).expect("waited for the lingering lock");
        letting_go.join().unwrap();
        let e = FileDev::open(&path, &opts).err().expect("a device's claim refuses a second open");
        assert!(e.context.contains("already open in this process"), "{e}");
        drop(dev);
        FileDev::open(&path, &opts).expect("the claim went with its device");
    }

    /// After a failed flush the device refuses flushes and writes (reads go on) until it is
    /// reopened: a retried fdatasync on a buffered file succeeds after the kernel dropped
    /// the pages the failed one covered.
    #[test]
    fn a_failed_flush_is_latched() {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f.img");
            let opts = FileOptions { create_size: Some(1 << 20), direct: false, ..FileOptions::default() };
            let dev = FileDev::open(&path, &opts).unwrap();
            dev.write(0, Buf::from_slice(&[7; 4096]), false).await.unwrap();
            dev.flush().await.unwrap();
            let e = dev.durability_failed(Error::new(ErrorKind::Io, "fdatasync: EIO"));
            assert_eq!(e.kind, ErrorKind::Io);
            assert!(dev.flush().await.unwrap_err().context.contains("a flush failed earlier"));
            assert!(dev.write(0, Buf::from_slice(&[8; 4096]), false).await.is_err());
            assert!(dev.write(0, Buf::from_slice(&[8; 4096]), true).await.is_err());
            assert_eq!(&dev.read(0, Buf::zeroed(4096)).await.unwrap()[..], &[7; 4096][..]);
            drop(dev);
            let dev = FileDev::open(&path, &opts).unwrap();
            dev.write(0, Buf::from_slice(&[9; 4096]), true).await.unwrap();
            dev.flush().await.unwrap();
            // A request the device refused before touching anything latches nothing.
            dev.durability_failed(Error::new(ErrorKind::OutOfRange, "beyond the end"));
            dev.flush().await.unwrap();
        });
    }

    /// A write into the last, partial sector of a file whose size is not a multiple of the
    /// sector (with O_DIRECT, written as a whole sector) leaves the file its size.
    #[test]
    fn a_write_to_the_partial_last_sector_keeps_the_size() {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
            let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
            let path = dir.path().join("odd.img");
            std::fs::write(&path, vec![1u8; 1000]).unwrap();
            let dev = FileDev::open(&path, &FileOptions::default()).unwrap();
            if !dev.is_direct() {
                eprintln!("SKIP: the file system here refuses O_DIRECT, so no write is a whole sector");
                return;
            }
            for fua in [false, true] {
                dev.write(996, Buf::from_slice(&[2; 4]), fua).await.unwrap();
                dev.write(500, Buf::from_slice(&[3; 20]), fua).await.unwrap();
                let mut want = vec![1u8; 1000];
                want[996..].fill(2);
                want[500..520].fill(3);
                assert_eq!(std::fs::read(&path).unwrap(), want, "fua {fua}");
                assert_eq!(&dev.read(0, Buf::zeroed(1000)).await.unwrap()[..], &want[..]);
            }
        });
    }

    /// A flush reaches the file only when something changed since the last one that did; the
    /// first flush after an open always does (an earlier opener may have left dirty pages).
    #[test]
    fn a_flush_with_nothing_new_skips_the_fdatasync() {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let opts = FileOptions { create_size: Some(1 << 20), direct: false, ..FileOptions::default() };
            let dev = FileDev::open(&dir.path().join("f.img"), &opts).unwrap();
            let syncs =
                |dev: &FileDev| (dev.fdatasyncs.load(Ordering::Relaxed), dev.flushes_skipped.load(Ordering::Relaxed));
            dev.flush().await.unwrap();
            dev.flush().await.unwrap();
            assert_eq!(syncs(&dev), (1, 1));
            dev.write(0, Buf::from_slice(&[7; 4096]), false).await.unwrap();
            dev.flush().await.unwrap();
            dev.flush().await.unwrap();
            assert_eq!(syncs(&dev), (2, 2));
            dev.discard(0, 4096).await.unwrap();
            dev.flush().await.unwrap();
            dev.write_zeroes(4096, 4096, ZeroFlags::default()).await.unwrap();
            dev.flush().await.unwrap();
            dev.grow(2 << 20).await.unwrap();
            dev.flush().await.unwrap();
            dev.flush().await.unwrap();
            assert_eq!(syncs(&dev), (5, 3));
            let names: Vec<_> = dev.metrics().iter().map(|m| m.name).collect();
            assert!(names.contains(&"strata_device_fdatasyncs_total"), "{names:?}");
        });
    }
}
