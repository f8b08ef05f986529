//! IO engines: how file and block-device IO is carried out, behind one interface. `uring`
//! owns an io_uring on a dedicated thread; `pool` runs blocking pread/pwrite on a pool of
//! threads. Both take owned buffers and hand them back with the completion, so an operation
//! the caller stopped waiting for still owns its memory until the kernel is done with it.
//! Which one is faster depends on the machine; `docs/BENCHMARKS.md` has the measurements.

use crate::{BoxFut, Buf};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::oneshot;

/// One operation on an open file. The file is shared so it stays open while in flight.
pub enum Op {
    Read { offset: u64, buf: Buf },
    Write { offset: u64, buf: Buf, dsync: bool },
    Fdatasync,
    /// fallocate(2) with `mode` (PUNCH_HOLE, ZERO_RANGE, KEEP_SIZE ...).
    Fallocate { mode: i32, offset: u64, len: u64 },
}

/// The result: the buffer (for reads and writes) and the byte count or error.
pub type Completion = (Option<Buf>, io::Result<usize>);

pub trait IoEngine: Send + Sync {
    fn name(&self) -> &'static str;
    fn submit(&self, file: Arc<File>, op: Op) -> BoxFut<'static, Completion>;
}

/// Engine kinds by name, as used in specs (`?engine=uring`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Uring,
    Pool,
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uring" | "io_uring" => Ok(EngineKind::Uring),
            "pool" | "threads" => Ok(EngineKind::Pool),
            _ => Err(format!("unknown IO engine {s:?} (expected uring or pool)")),
        }
    }
}

/// The process-wide engine of each kind, started on first use. `Uring` falls back to the
/// pool, with a message, where the kernel refuses io_uring.
pub fn shared(kind: EngineKind) -> Arc<dyn IoEngine> {
    static URING: OnceLock<Arc<dyn IoEngine>> = OnceLock::new();
    static POOL: OnceLock<Arc<dyn IoEngine>> = OnceLock::new();
    let pool = || POOL.get_or_init(|| Arc::new(PoolEngine::new(POOL_THREADS))).clone();
    match kind {
        EngineKind::Pool => pool(),
        EngineKind::Uring => URING
            .get_or_init(|| match UringEngine::new(URING_ENTRIES) {
                Ok(e) => Arc::new(e),
                Err(err) => {
                    eprintln!("strata: io_uring unavailable ({err}); using the thread pool engine");
                    pool()
                }
            })
            .clone(),
    }
}

/// The default engine kind (the one that measured faster here).
pub const DEFAULT_ENGINE: EngineKind = EngineKind::Uring;
const POOL_THREADS: usize = 32;
const URING_ENTRIES: u32 = 256;

/// Runs one operation synchronously on the calling thread.
pub fn run_blocking(file: &File, op: Op) -> Completion {
    let fd = file.as_raw_fd();
    match op {
        Op::Read { offset, mut buf } => {
            let mut done = 0usize;
            let res = loop {
                if done == buf.len() {
                    break Ok(done);
                }
                let rest = &mut buf[done..];
                // SAFETY: rest is a valid writable slice.
                let n = unsafe {
                    libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), (offset + done as u64) as i64)
                };
                match n {
                    n if n > 0 => done += n as usize,
                    0 => {
                        // Past end of file: the rest reads as zeroes.
                        buf[done..].fill(0);
                        break Ok(buf.len());
                    }
                    _ => {
                        let e = io::Error::last_os_error();
                        if e.kind() != io::ErrorKind::Interrupted {
                            break Err(e);
                        }
                    }
                }
            };
            (Some(buf), res)
        }
        Op::Write { offset, buf, dsync } => {
            let flags = if dsync { libc::RWF_DSYNC } else { 0 };
            let mut done = 0usize;
            let res = loop {
                if done == buf.len() {
                    break Ok(done);
                }
                let rest = &buf[done..];
                let iov = libc::iovec { iov_base: rest.as_ptr() as *mut _, iov_len: rest.len() };
                // SAFETY: iov points into buf, valid for the call.
                let n = unsafe { libc::pwritev2(fd, &iov, 1, (offset + done as u64) as i64, flags) };
                match n {
                    n if n > 0 => done += n as usize,
                    0 => break Err(io::Error::from_raw_os_error(libc::ENOSPC)),
                    _ => {
                        let e = io::Error::last_os_error();
                        if e.kind() != io::ErrorKind::Interrupted {
                            break Err(e);
                        }
                    }
                }
            };
            (Some(buf), res)
        }
        Op::Fdatasync => (None, file.sync_data().map(|()| 0)),
        Op::Fallocate { mode, offset, len } => {
            // SAFETY: plain syscall on a valid fd.
            let r = unsafe { libc::fallocate(fd, mode, offset as i64, len as i64) };
            (None, if r == 0 { Ok(0) } else { Err(io::Error::last_os_error()) })
        }
    }
}

fn engine_gone() -> Completion {
    (None, Err(io::Error::other("IO engine stopped")))
}

// ---------------------------------------------------------------------------------------
// Thread pool engine

type Job = (Arc<File>, Op, oneshot::Sender<Completion>);

pub struct PoolEngine {
    tx: crossbeam_channel::Sender<Job>,
}

impl PoolEngine {
    pub fn new(threads: usize) -> PoolEngine {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("strata-io-{i}"))
                .spawn(move || {
                    for (file, op, done) in rx {
                        let _ = done.send(run_blocking(&file, op));
                    }
                })
                .expect("spawn IO thread");
        }
        PoolEngine { tx }
    }
}

impl IoEngine for PoolEngine {
    fn name(&self) -> &'static str {
        "pool"
    }

    fn submit(&self, file: Arc<File>, op: Op) -> BoxFut<'static, Completion> {
        let (done, wait) = oneshot::channel();
        let sent = self.tx.send((file, op, done)).is_ok();
        Box::pin(async move {
            if !sent {
                return engine_gone();
            }
            wait.await.unwrap_or_else(|_| engine_gone())
        })
    }
}

// ---------------------------------------------------------------------------------------
// io_uring engine: one ring on one thread. Submitters queue jobs and wake the thread through
// an eventfd only when it sleeps; the thread keeps a read armed on the eventfd, so a wake-up
// is just another completion.

pub struct UringEngine {
    tx: crossbeam_channel::Sender<Job>,
    shared: Arc<UringShared>,
}

struct UringShared {
    eventfd: std::os::fd::OwnedFd,
    sleeping: AtomicBool,
}

impl UringShared {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to an eventfd we own.
        unsafe { libc::write(self.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

impl UringEngine {
    pub fn new(entries: u32) -> io::Result<UringEngine> {
        let ring = io_uring::IoUring::new(entries)?;
        // SAFETY: plain syscall; the fd is owned below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: efd is a fresh fd we own.
        let eventfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(efd) };
        let shared = Arc::new(UringShared { eventfd, sleeping: AtomicBool::new(false) });
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("strata-uring".into())
            .spawn(move || uring_loop(ring, rx, thread_shared))?;
        Ok(UringEngine { tx, shared })
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn submit(&self, file: Arc<File>, op: Op) -> BoxFut<'static, Completion> {
        let (done, wait) = oneshot::channel();
        let sent = self.tx.send((file, op, done)).is_ok();
        if sent && self.shared.sleeping.swap(false, Ordering::AcqRel) {
            self.shared.wake();
        }
        Box::pin(async move {
            if !sent {
                return engine_gone();
            }
            wait.await.unwrap_or_else(|_| engine_gone())
        })
    }
}

/// An operation in flight in the ring, with how much of it is done (short reads and writes
/// are resubmitted for the rest).
struct InFlight {
    file: Arc<File>,
    op: Op,
    done_bytes: usize,
    reply: oneshot::Sender<Completion>,
}

const WAKE_TOKEN: u64 = u64::MAX;

fn uring_loop(mut ring: io_uring::IoUring, rx: crossbeam_channel::Receiver<Job>, shared: Arc<UringShared>) {
    use io_uring::{opcode, types};
    let mut slots: Vec<Option<InFlight>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut inflight = 0usize;
    let mut wake_buf = Box::new(0u64);
    let capacity = ring.params().sq_entries() as usize - 1;
    let mut wake_armed = false;
    let mut disconnected = false;

    let sqe_for = |f: &InFlight, token: u64| {
        let fd = types::Fd(f.file.as_raw_fd());
        match &f.op {
            Op::Read { offset, buf } => {
                let rest = buf.len() - f.done_bytes;
                // SAFETY (for the pointer): buf lives in `slots` until its completion arrives.
                opcode::Read::new(fd, unsafe { buf.as_ptr().add(f.done_bytes) as *mut u8 }, rest as u32)
                    .offset(offset + f.done_bytes as u64)
                    .build()
            }
            Op::Write { offset, buf, dsync } => {
                let rest = buf.len() - f.done_bytes;
                opcode::Write::new(fd, unsafe { buf.as_ptr().add(f.done_bytes) }, rest as u32)
                    .offset(offset + f.done_bytes as u64)
                    .rw_flags(if *dsync { libc::RWF_DSYNC } else { 0 })
                    .build()
            }
            Op::Fdatasync => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            Op::Fallocate { mode, offset, len } => {
                opcode::Fallocate::new(fd, *len).offset(*offset).mode(*mode).build()
            }
        }
        .user_data(token)
    };

    loop {
        // Queue new work while the ring has room.
        let mut queued = 0;
        while inflight < capacity {
            let job = match rx.try_recv() {
                Ok(job) => job,
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            };
            let (file, op, reply) = job;
            let slot = free.pop().unwrap_or_else(|| {
                slots.push(None);
                slots.len() - 1
            });
            let f = InFlight { file, op, done_bytes: 0, reply };
            let sqe = sqe_for(&f, slot as u64);
            slots[slot] = Some(f);
            // SAFETY: the buffers referenced by the entry live in `slots` until completion.
            unsafe { ring.submission().push(&sqe).expect("ring has room") };
            inflight += 1;
            queued += 1;
        }
        if disconnected && inflight == 0 {
            return;
        }
        let mut wait_for = 0;
        if queued == 0 && inflight < capacity {
            // Nothing new: sleep until a completion or a wake-up. Announce the sleep first,
            // then look once more so a job queued in between is not missed.
            if !wake_armed {
                let sqe = opcode::Read::new(
                    types::Fd(shared.eventfd.as_raw_fd()),
                    (&mut *wake_buf as *mut u64).cast(),
                    8,
                )
                .build()
                .user_data(WAKE_TOKEN);
                // SAFETY: wake_buf outlives the ring loop.
                unsafe { ring.submission().push(&sqe).expect("ring has room") };
                wake_armed = true;
            }
            shared.sleeping.store(true, Ordering::Release);
            if !rx.is_empty() {
                shared.sleeping.store(false, Ordering::Release);
            } else {
                wait_for = 1;
            }
        } else if queued == 0 {
            wait_for = 1; // ring full: wait for room
        }
        match ring.submit_and_wait(wait_for) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => panic!("io_uring submit failed: {e}"),
        }
        shared.sleeping.store(false, Ordering::Release);

        let cqes: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (token, res) in cqes {
            if token == WAKE_TOKEN {
                wake_armed = false;
                continue;
            }
            let slot = token as usize;
            let mut f = slots[slot].take().expect("completion for a live slot");
            let total = match &f.op {
                Op::Read { buf, .. } | Op::Write { buf, .. } => buf.len(),
                _ => 0,
            };
            let outcome: Option<io::Result<usize>> = if res < 0 {
                if -res == libc::EINTR || -res == libc::EAGAIN {
                    None // retry as is
                } else {
                    Some(Err(io::Error::from_raw_os_error(-res)))
                }
            } else {
                let n = res as usize;
                match &mut f.op {
                    Op::Read { buf, .. } if n == 0 && f.done_bytes < total => {
                        buf[f.done_bytes..].fill(0); // past end of file reads as zeroes
                        Some(Ok(total))
                    }
                    Op::Write { .. } if n == 0 && f.done_bytes < total => {
                        Some(Err(io::Error::from_raw_os_error(libc::ENOSPC)))
                    }
                    Op::Read { .. } | Op::Write { .. } => {
                        f.done_bytes += n;
                        if f.done_bytes < total { None } else { Some(Ok(total)) }
                    }
                    _ => Some(Ok(n)),
                }
            };
            match outcome {
                None => {
                    let sqe = sqe_for(&f, token);
                    slots[slot] = Some(f);
                    // SAFETY: as above. Completions were drained, so there is room.
                    unsafe { ring.submission().push(&sqe).expect("ring has room") };
                }
                Some(result) => {
                    inflight -= 1;
                    free.push(slot);
                    let buf = match f.op {
                        Op::Read { buf, .. } | Op::Write { buf, .. } => Some(buf),
                        _ => None,
                    };
                    let _ = f.reply.send((buf, result));
                }
            }
        }
        if disconnected && inflight == 0 {
            return;
        }
    }
}
