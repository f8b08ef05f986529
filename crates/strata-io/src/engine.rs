//! IO engines: how file and block-device IO is carried out, behind one interface. `uring`
//! shares one io_uring: submitters enter the kernel themselves (or, under a [`Plug`], once for
//! a batch) and a reaper (a thread, or a task on the server's runtime) collects completions;
//! `pool` runs blocking pread/pwrite on a pool of threads. Both take owned buffers and hand
//! them back with the completion, so an operation the caller stopped waiting for still owns
//! its memory until the kernel is done with it.
//! Which one is faster depends on the machine; `docs/BENCHMARKS.md` has the measurements.

use crate::depth::QueueDepth;
use crate::{BoxFut, Buf};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};
use tokio::sync::oneshot;

/// One operation on an open file. The file is shared so it stays open while in flight.
pub enum Op {
    Read {
        offset: u64,
        buf: Buf,
    },
    Write {
        offset: u64,
        buf: Buf,
        dsync: bool,
    },
    Fdatasync,
    /// fallocate(2) with `mode` (PUNCH_HOLE, ZERO_RANGE, KEEP_SIZE ...).
    Fallocate {
        mode: i32,
        offset: u64,
        len: u64,
    },
}

/// The result: the buffer (for reads and writes) and the byte count or error.
pub type Completion = (Option<Buf>, io::Result<usize>);

pub trait IoEngine: Send + Sync {
    fn name(&self) -> &'static str;
    /// Runs `op` on `file`; `depth` counts it while the kernel has it.
    fn submit(&self, file: Arc<File>, op: Op, depth: Arc<QueueDepth>) -> BoxFut<'static, Completion>;
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
                let n = unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), (offset + done as u64) as i64) };
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

type Job = (Arc<File>, Op, Arc<QueueDepth>, oneshot::Sender<Completion>);

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
                    for (file, op, depth, done) in rx {
                        depth.enter();
                        let completion = run_blocking(&file, op);
                        depth.leave();
                        // Let go of the file first: once the caller has its completion, the
                        // device may close the file, and its claim must go with it.
                        drop(file);
                        let _ = done.send(completion);
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

    fn submit(&self, file: Arc<File>, op: Op, depth: Arc<QueueDepth>) -> BoxFut<'static, Completion> {
        let (done, wait) = oneshot::channel();
        let sent = self.tx.send((file, op, depth, done)).is_ok();
        Box::pin(async move {
            if !sent {
                return engine_gone();
            }
            wait.await.unwrap_or_else(|_| engine_gone())
        })
    }
}

// ---------------------------------------------------------------------------------------
// io_uring engine: one ring shared by every submitter. A submitter puts its operation in the
// ring and enters the kernel itself (a plugged thread once for all it put in), so starting
// an IO costs no hop to another thread; one reaper waits for completions, resubmits short
// transfers and hands results back.
// Operations beyond the ring's capacity wait in a queue the reaper feeds in as room frees.

pub struct UringEngine {
    ring: Arc<Ring>,
}

struct Ring {
    uring: io_uring::IoUring,
    state: parking_lot::Mutex<RingState>,
}

/// Operations in flight, by the token their ring entries carry.
struct RingState {
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    inflight: usize,
    capacity: usize,
    waiting: VecDeque<InFlight>,
}

/// An operation in flight in the ring, with how much of it is done (short reads and writes
/// are resubmitted for the rest).
struct InFlight {
    file: Arc<File>,
    op: Op,
    depth: Arc<QueueDepth>,
    done_bytes: usize,
    reply: oneshot::Sender<Completion>,
}

/// The runtime whose reactor collects io_uring completions, if the process chose one.
static REAP_ON: OnceLock<tokio::runtime::Handle> = OnceLock::new();

/// Lets the current tokio runtime (it must have IO enabled and live as long as the process)
/// collect the io_uring engine's completions, instead of a thread of its own: a completion
/// then wakes the task waiting for it on the worker that is already awake, with no hop
/// between threads. Call it before the first file device is opened; later calls do nothing.
pub fn reap_on_current_runtime() {
    let _ = REAP_ON.set(tokio::runtime::Handle::current());
}

impl UringEngine {
    fn new(entries: u32) -> io::Result<UringEngine> {
        let uring = io_uring::IoUring::new(entries)?;
        let capacity = uring.params().sq_entries() as usize;
        let state = RingState { slots: Vec::new(), free: Vec::new(), inflight: 0, capacity, waiting: VecDeque::new() };
        let ring = Arc::new(Ring { uring, state: parking_lot::Mutex::new(state) });
        let reaper = ring.clone();
        match REAP_ON.get() {
            Some(rt) => {
                // SAFETY: plain syscall; the fd is owned below.
                let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
                if efd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: efd is a fresh fd we own.
                let efd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(efd) };
                ring.uring.submitter().register_eventfd(efd.as_raw_fd())?;
                let _guard = rt.enter();
                // SAFETY: the AsyncFd owns the fd, which stays open as long as it does.
                let efd =
                    unsafe { tokio::io::unix::AsyncFd::register_with_interest(efd, tokio::io::Interest::READABLE) }?;
                rt.spawn(async move { reaper.reap_task(efd).await });
            }
            None => {
                std::thread::Builder::new().name("strata-uring".into()).spawn(move || reaper.reap_thread())?;
            }
        }
        Ok(UringEngine { ring })
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn submit(&self, file: Arc<File>, op: Op, depth: Arc<QueueDepth>) -> BoxFut<'static, Completion> {
        let (reply, wait) = oneshot::channel();
        let f = InFlight { file, op, depth, done_bytes: 0, reply };
        let queued = self.ring.state.lock().queue(&self.ring.uring, f);
        if queued && !Plug::hold(&self.ring) {
            self.ring.enter();
        }
        Box::pin(async move { wait.await.unwrap_or_else(|_| engine_gone()) })
    }
}

impl Ring {
    /// Has the kernel take what is in the submission queue.
    fn enter(&self) {
        if let Err(e) = self.uring.submit() {
            // The entries stay in the ring; the next enter (a submitter's or the reaper's) takes them.
            if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) {
                panic!("io_uring submit failed: {e}");
            }
        }
    }
}

thread_local! {
    /// The rings this thread put entries in while plugged, or None when it is not plugged.
    static PLUGGED: std::cell::RefCell<Option<Vec<Arc<Ring>>>> = const { std::cell::RefCell::new(None) };
}

/// Holds back the io_uring submissions this thread makes until it is dropped, then enters
/// the kernel once per ring for all of them, as the kernel's `blk_start_plug` does for a
/// batch of bios: the operations reach the device as one batch, which it is told of once.
/// A caller that starts several operations in one go (the NBD server, for the requests of
/// one read from its socket) plugs around them. It cannot be held across an `.await` in a
/// task that may move between threads (it is not `Send`); a plug inside a plug does nothing.
pub struct Plug {
    outer: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Plug {
    pub fn new() -> Plug {
        let outer = PLUGGED.with(|p| {
            let mut p = p.borrow_mut();
            let outer = p.is_none();
            if outer {
                *p = Some(Vec::new());
            }
            outer
        });
        Plug { outer, _not_send: std::marker::PhantomData }
    }

    /// Whether this thread is plugged; if so, `ring` is entered when the plug goes.
    fn hold(ring: &Arc<Ring>) -> bool {
        PLUGGED.with(|p| match p.borrow_mut().as_mut() {
            Some(rings) => {
                if !rings.iter().any(|r| Arc::ptr_eq(r, ring)) {
                    rings.push(ring.clone());
                }
                true
            }
            None => false,
        })
    }
}

impl Default for Plug {
    fn default() -> Plug {
        Plug::new()
    }
}

impl Drop for Plug {
    fn drop(&mut self) {
        if self.outer {
            for ring in PLUGGED.with(|p| p.borrow_mut().take()).unwrap_or_default() {
                ring.enter();
            }
        }
    }
}

impl RingState {
    /// Puts `f` in the ring (true) or, when the ring is at capacity, in the waiting queue.
    fn queue(&mut self, uring: &io_uring::IoUring, f: InFlight) -> bool {
        if self.inflight >= self.capacity {
            self.waiting.push_back(f);
            return false;
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.inflight += 1;
        f.depth.enter();
        self.push(uring, slot, f);
        true
    }

    /// Writes the ring entry for `f` (whole or the rest of it) and parks `f` in its slot.
    fn push(&mut self, uring: &io_uring::IoUring, slot: usize, f: InFlight) {
        let sqe = sqe_for(&f, slot as u64);
        self.slots[slot] = Some(f);
        // SAFETY: this lock is the only way to the submission queue, and at most `capacity`
        // entries are in flight, so there is room. The buffers the entry points into live in
        // `slots` until its completion is reaped.
        unsafe { uring.submission_shared().push(&sqe).expect("ring has room") };
    }
}

fn sqe_for(f: &InFlight, token: u64) -> io_uring::squeue::Entry {
    use io_uring::{opcode, types};
    let fd = types::Fd(f.file.as_raw_fd());
    match &f.op {
        Op::Read { offset, buf } => {
            let rest = buf.len() - f.done_bytes;
            // SAFETY (for the pointer): buf lives in its slot until its completion arrives.
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
        Op::Fallocate { mode, offset, len } => opcode::Fallocate::new(fd, *len).offset(*offset).mode(*mode).build(),
    }
    .user_data(token)
}

impl Ring {
    /// The reaper thread: waits for completions and finishes what they complete.
    fn reap_thread(&self) {
        loop {
            // Also submits whatever a resubmission left in the ring.
            match self.uring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                Err(e) => panic!("io_uring wait failed: {e}"),
            }
            self.reap();
        }
    }

    /// The reaper task: the ring signals `efd` for every completion.
    async fn reap_task(&self, efd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>) {
        loop {
            let mut ready = efd.readable().await.expect("eventfd registered with the reactor");
            let mut count = 0u64;
            // SAFETY: reading the 8-byte counter of an eventfd we own.
            let n = unsafe { libc::read(efd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            if n < 0 {
                ready.clear_ready();
            }
            if self.reap() {
                if let Err(e) = self.uring.submit() {
                    if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) {
                        panic!("io_uring submit failed: {e}");
                    }
                }
            }
        }
    }

    /// Finishes what the completions in the ring complete, resubmits short transfers and
    /// moves waiting operations into the room freed. True if it put entries in the ring.
    fn reap(&self) -> bool {
        let mut done: Vec<(oneshot::Sender<Completion>, Completion)> = Vec::new();
        let mut pushed = false;
        let mut st = self.state.lock();
        // SAFETY: only the reaper takes completions.
        let cqes: Vec<(u64, i32)> =
            unsafe { self.uring.completion_shared() }.map(|c| (c.user_data(), c.result())).collect();
        for (token, res) in cqes {
            let slot = token as usize;
            let mut f = st.slots[slot].take().expect("completion for a live slot");
            match outcome(&mut f, res) {
                None => {
                    st.push(&self.uring, slot, f);
                    pushed = true;
                }
                Some(result) => {
                    st.inflight -= 1;
                    f.depth.leave();
                    st.free.push(slot);
                    let buf = match f.op {
                        Op::Read { buf, .. } | Op::Write { buf, .. } => Some(buf),
                        _ => None,
                    };
                    done.push((f.reply, (buf, result)));
                }
            }
        }
        while st.inflight < st.capacity {
            let Some(f) = st.waiting.pop_front() else { break };
            st.queue(&self.uring, f);
            pushed = true;
        }
        drop(st);
        for (reply, completion) in done {
            let _ = reply.send(completion);
        }
        pushed
    }
}

/// What a completion means for its operation: finished (with its result) or to be
/// resubmitted for the rest (None).
fn outcome(f: &mut InFlight, res: i32) -> Option<io::Result<usize>> {
    let total = match &f.op {
        Op::Read { buf, .. } | Op::Write { buf, .. } => buf.len(),
        _ => 0,
    };
    if res < 0 {
        if -res == libc::EINTR || -res == libc::EAGAIN {
            return None; // retry as is
        }
        return Some(Err(io::Error::from_raw_os_error(-res)));
    }
    let n = res as usize;
    match &mut f.op {
        Op::Read { buf, .. } if n == 0 && f.done_bytes < total => {
            buf[f.done_bytes..].fill(0); // past end of file reads as zeroes
            Some(Ok(total))
        }
        Op::Write { .. } if n == 0 && f.done_bytes < total => Some(Err(io::Error::from_raw_os_error(libc::ENOSPC))),
        Op::Read { .. } | Op::Write { .. } => {
            f.done_bytes += n;
            if f.done_bytes < total {
                None
            } else {
                Some(Ok(total))
            }
        }
        _ => Some(Ok(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine lets go of the file before it hands back the completion: a device closed
    /// right after its last request then closes the file (and releases its claim) at once.
    #[test]
    fn an_engine_holds_the_file_no_longer_once_its_request_completes() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let engines: [(&str, Box<dyn IoEngine>); 2] =
            [("pool", Box::new(PoolEngine::new(2))), ("uring", Box::new(UringEngine::new(8).unwrap()))];
        for (name, engine) in engines {
            let file = Arc::new(File::create(dir.path().join(name)).unwrap());
            for i in 0..4000u64 {
                let op = Op::Write { offset: i * 4096, buf: Buf::from_slice(&[7; 4096]), dsync: false };
                let (_, r) = rt.block_on(engine.submit(file.clone(), op, Arc::new(QueueDepth::new())));
                assert_eq!(r.unwrap(), 4096);
                assert_eq!(Arc::strong_count(&file), 1, "{name}, request {i}: the engine still holds the file");
            }
        }
    }
}
