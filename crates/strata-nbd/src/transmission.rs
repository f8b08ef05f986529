//! The transmission phase. One task per connection reads requests, runs them and writes the
//! replies. A request that completes on its first poll (RAM and page-cache hits) has its reply
//! queued right there, without a task spawn or a hop to another thread; one that has to wait
//! for the device joins the connection's pending set and its reply is queued when it
//! completes, so replies go out in completion order. Whatever is queued goes out in one
//! vectored write.
//!
//! Bounds: a connection stops reading once it holds `max_inflight_per_connection` requests
//! whose replies are not yet written, and payload buffers come out of a server-wide budget,
//! of which each connection may hold only its share, so a client that stops reading replies
//! stalls only itself, with bounded memory; one that moves no byte for `stall_timeout` while
//! the server waits on it (or for `closing_grace` once the server stops) is closed. Pending
//! requests always run to completion, even after the client has gone, so no device ever sees
//! a request abandoned halfway.
//!
//! Payload buffers come from the connection's pool and go back to it once their reply is
//! out (or, for a write, once it completed): a steady stream of large requests neither
//! zeroes nor faults in a buffer per request. A pooled buffer is only ever handed out to be
//! overwritten whole, by a device read or by a write's payload, so no request's bytes can
//! reach another's reply.

use crate::errno;
use crate::export::{block_sizes, stopped, Negotiated, Shared};
use crate::proto::*;
use futures::stream::{FuturesUnordered, StreamExt};
use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use strata_io::{BlockDev, Buf, BufPool, Error, ErrorKind, Extent, ZeroFlags};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Write payloads beyond the limit but below this are drained to keep framing and refused;
/// larger ones close the connection.
const WRITE_DRAIN_MAX_BYTES: u32 = 256 << 20;
/// Most extents in one BLOCK_STATUS reply.
const EXTENTS_MAX: usize = 1 << 16;
/// Request bytes read from the socket at once.
const INPUT_BYTES: usize = 256 << 10;
/// Buffers handed to one vectored write.
const IOV_MAX: usize = 64;
/// Payload buffers a connection keeps for reuse, at most.
const POOL_BYTES: usize = 16 << 20;

/// A reply ready to be written, with the payload budget it holds until then.
struct Reply {
    head: Vec<u8>,
    data: Option<Buf>,
    /// A write's payload, which the request no longer needs: back to the pool as soon as
    /// the reply is queued.
    spare: Option<Buf>,
    _budget: Option<Budget>,
}

impl Reply {
    fn len(&self) -> usize {
        self.head.len() + self.data.as_ref().map_or(0, |d| d.len())
    }
}

type Running = Pin<Box<dyn Future<Output = Reply> + Send + 'static>>;

#[derive(Clone, Copy)]
struct Conn {
    structured: bool,
    base_allocation: bool,
    read_only: bool,
    size: u64,
    /// Alignment requests must honour (1 unless the client agreed to our block sizes).
    align: u64,
    max_request: u32,
}

/// Where the request stream stands.
enum Input {
    /// Expecting a request header.
    Header,
    /// The request needs payload budget before it can be taken.
    Budget(Request),
    /// Reading a WRITE payload into its buffer.
    Payload { req: Request, buf: Buf, filled: usize, budget: Budget },
    /// Discarding the payload of a refused WRITE, to keep framing.
    Drain { req: Request, left: u64 },
    /// No more requests: disconnect, end of stream, lost framing or shutdown.
    Closed,
}

/// Bytes read from the client and not yet parsed: `data[lo..hi]`.
struct Inbox {
    data: Vec<u8>,
    lo: usize,
    hi: usize,
}

impl Inbox {
    fn ready(&self) -> &[u8] {
        &self.data[self.lo..self.hi]
    }

    fn consume(&mut self, n: usize) {
        self.lo += n;
        if self.lo == self.hi {
            (self.lo, self.hi) = (0, 0);
        }
    }

    /// Room to read into, moving a partial header to the front when the end is near.
    fn spare(&mut self) -> &mut [u8] {
        if self.data.len() - self.hi < REQUEST_BYTES * 64 {
            self.data.copy_within(self.lo..self.hi, 0);
            (self.lo, self.hi) = (0, self.hi - self.lo);
        }
        &mut self.data[self.hi..]
    }
}

/// Replies waiting to be written; `off` bytes of the first are already out.
#[derive(Default)]
struct Outbox {
    queue: VecDeque<Reply>,
    off: usize,
}

impl Outbox {
    /// Fills `v` with what is still to be written, in order; returns how many it used.
    fn slices<'a>(&'a self, v: &mut [IoSlice<'a>]) -> usize {
        let (mut n, mut skip) = (0, self.off);
        for r in &self.queue {
            for part in [&r.head[..], r.data.as_deref().unwrap_or(&[])] {
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                v[n] = IoSlice::new(&part[skip..]);
                skip = 0;
                n += 1;
                if n == v.len() {
                    return n;
                }
            }
        }
        n
    }

    /// Marks `n` bytes written; returns how many replies are now wholly out. Their payload
    /// buffers go back to `pool`.
    fn advance(&mut self, mut n: usize, pool: &mut BufPool) -> usize {
        let mut done = 0;
        while let Some(r) = self.queue.front() {
            let left = r.len() - self.off;
            if n < left {
                self.off += n;
                break;
            }
            n -= left;
            self.off = 0;
            if let Some(data) = self.queue.pop_front().and_then(|r| r.data) {
                pool.give(data);
            }
            done += 1;
        }
        done
    }
}

/// One connection's requests in flight and replies on their way.
struct Session {
    conn: Conn,
    dev: Arc<dyn BlockDev>,
    shared: Arc<Shared>,
    /// This connection's share of the payload budget (`connection_budget`).
    own: Arc<Semaphore>,
    running: FuturesUnordered<Running>,
    out: Outbox,
    /// Requests taken whose replies are not yet written (running or queued).
    held: usize,
    pool: BufPool,
    /// Written since the last flush: a stream that buffers (TLS) holds the last replies
    /// until it is flushed.
    unflushed: bool,
    /// Whether the stream buffers (TLS) and so needs flushing; plain sockets do not.
    buffered: bool,
}

pub async fn transmit<R, W>(mut rd: R, mut wr: W, early: &[u8], neg: Negotiated, shared: Arc<Shared>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let export = neg.export;
    let (min, _, max) = block_sizes(&export, shared.limits.max_request_bytes);
    let conn = Conn {
        structured: neg.structured,
        base_allocation: neg.base_allocation,
        read_only: export.read_only,
        size: export.dev.size(),
        align: if neg.block_size_agreed { min as u64 } else { 1 },
        max_request: max,
    };
    let held_max = shared.limits.max_inflight_per_connection;
    let mut s = Session {
        conn,
        // A device that tells connections apart gives this one its own handle.
        dev: export.dev.connect().unwrap_or_else(|| export.dev.clone()),
        shared: shared.clone(),
        own: Arc::new(Semaphore::new(connection_budget(&shared))),
        running: FuturesUnordered::new(),
        out: Outbox::default(),
        held: 0,
        pool: BufPool::new(POOL_BYTES),
        unflushed: false,
        buffered: neg.tls,
    };
    // `early`: what the handshake read ahead into the first requests, at most its reader's
    // 64 KiB buffer.
    let mut inbox = Inbox { data: vec![0; INPUT_BYTES], lo: 0, hi: early.len() };
    inbox.data[..inbox.hi].copy_from_slice(early);
    let mut input = Input::Header;
    let mut stop = shared.shutdown_rx.clone();
    let mut retired = neg.retired;
    let mut client_gone = false;
    // The stall watchdog: bytes moved either way, as of its last tick; and whether the
    // connection is closing (server stopping or export removed), which shortens its period.
    let (mut moved, mut moved_at_tick, mut closing) = (0u64, 0u64, false);
    // Whether the device was told this connection is closing (`BlockDev::disconnect`).
    let mut disconnected = false;
    let stall = tokio::time::sleep(shared.limits.stall_timeout);
    tokio::pin!(stall);

    loop {
        {
            // The requests of one read from the socket reach the devices as one batch.
            let _plug = strata_io::engine::Plug::new();
            while !client_gone && s.held < held_max && !(closing && matches!(input, Input::Header)) {
                if !s.take(&mut input, &mut inbox) {
                    break;
                }
            }
        }
        if closing && matches!(input, Input::Header) {
            input = Input::Closed;
        }
        if matches!(input, Input::Closed) && !disconnected {
            // What still runs must end soon: a device that paces requests lets them go.
            s.dev.disconnect();
            disconnected = true;
        }
        if matches!(input, Input::Closed) && s.held == 0 {
            break;
        }
        let budget_wanted = match &input {
            Input::Budget(req) => Some(budget_bytes(&shared, req.length)),
            _ => None,
        };
        let reading = !matches!(input, Input::Closed | Input::Budget(_)) && s.held < held_max;
        // A payload larger than what is buffered is read straight into its own buffer.
        let direct = inbox.ready().is_empty() && matches!(input, Input::Payload { .. });
        // Replies to write or a payload to read: the client is the one to move.
        let waiting_on_client = !s.out.queue.is_empty() || matches!(input, Input::Payload { .. } | Input::Drain { .. });
        let target: &mut [u8] = match &mut input {
            Input::Payload { buf, filled, .. } if direct => &mut buf[*filled..],
            _ => inbox.spare(),
        };
        tokio::select! {
            biased;
            // Also seen when not reading: a client that reads no replies holds its maximum.
            _ = stopped_either(&mut stop, &mut retired), if !closing => {
                closing = true;
                moved_at_tick = moved;
                stall.as_mut().reset(tokio::time::Instant::now() + shared.limits.closing_grace);
                // A request waiting for its budget still runs; no other is taken.
                if !matches!(input, Input::Budget(_)) {
                    input = Input::Closed;
                }
            }
            Some(reply) = s.running.next(), if !s.running.is_empty() => {
                if client_gone {
                    s.held -= 1;
                } else {
                    s.queue(reply);
                }
            }
            written = write_out(&mut wr, &s.out), if !s.out.queue.is_empty() || s.unflushed => match written {
                Ok(Some(n)) if n > 0 => {
                    s.held -= s.out.advance(n, &mut s.pool);
                    s.unflushed = s.buffered;
                    moved += n as u64;
                }
                Ok(None) => s.unflushed = false,
                _ => {
                    s.unflushed = false;
                    // The client is gone: what is running still runs to completion.
                    client_gone = true;
                    s.drop_replies();
                    input = Input::Closed;
                }
            },
            () = &mut stall, if waiting_on_client => {
                let period = if closing { shared.limits.closing_grace } else { shared.limits.stall_timeout };
                if moved != moved_at_tick {
                    moved_at_tick = moved;
                    stall.as_mut().reset(tokio::time::Instant::now() + period);
                } else {
                    eprintln!(
                        "strata-nbd: the client moved no data for {period:?} with replies to read or a write's \
                         payload to send; closing the connection"
                    );
                    client_gone = true;
                    s.drop_replies();
                    input = Input::Closed;
                }
            }
            permit = take_budget(&shared, &s.own, budget_wanted.unwrap_or(0)), if budget_wanted.is_some() => {
                if let Input::Budget(req) = std::mem::replace(&mut input, Input::Header) {
                    input = s.start(req, permit);
                }
            }
            got = rd.read(target), if reading => match got {
                Ok(n) if n > 0 => {
                    moved += n as u64;
                    if direct {
                        if let Input::Payload { filled, .. } = &mut input {
                            *filled += n;
                        }
                    } else {
                        inbox.hi += n;
                    }
                }
                // End of stream, possibly mid-request.
                _ => input = Input::Closed,
            },
        }
    }
    // Let go of the export before the client can see the connection end: a removal waiting
    // on this connection (`Removed::closed`) then finds the device released, and one the
    // client makes next finds no connection left.
    drop(s);
    drop(export);
    drop(retired);
    let _ = wr.shutdown().await;
}

impl Session {
    /// Forgets the replies not yet written (the client is gone or stalled).
    fn drop_replies(&mut self) {
        self.held -= self.out.queue.len();
        self.out = Outbox::default();
    }

    /// Advances the request stream by what is buffered; false when it needs more input (or
    /// budget, or has ended).
    fn take(&mut self, input: &mut Input, inbox: &mut Inbox) -> bool {
        match std::mem::replace(input, Input::Closed) {
            Input::Header => {
                let Some(header) = inbox.ready().first_chunk::<REQUEST_BYTES>().copied() else {
                    *input = Input::Header;
                    return false;
                };
                inbox.consume(REQUEST_BYTES);
                let Some(req) = Request::parse(&header) else {
                    eprintln!("strata-nbd: bad request magic; closing the connection");
                    return false;
                };
                *input = self.admit(req);
                true
            }
            Input::Budget(req) => match try_budget(&self.shared, &self.own, budget_bytes(&self.shared, req.length)) {
                Some(permit) => {
                    *input = self.start(req, permit);
                    true
                }
                None => {
                    *input = Input::Budget(req);
                    false
                }
            },
            Input::Payload { req, mut buf, mut filled, budget } => {
                let n = inbox.ready().len().min(buf.len() - filled);
                buf[filled..filled + n].copy_from_slice(&inbox.ready()[..n]);
                inbox.consume(n);
                filled += n;
                if filled < buf.len() {
                    *input = Input::Payload { req, buf, filled, budget };
                    return false;
                }
                self.write(req, buf, budget);
                *input = Input::Header;
                true
            }
            Input::Drain { req, left } => {
                let n = (inbox.ready().len() as u64).min(left);
                inbox.consume(n as usize);
                if n < left {
                    *input = Input::Drain { req, left: left - n };
                    return false;
                }
                let msg = format!("write of {} bytes exceeds the maximum {}", req.length, self.conn.max_request);
                self.reply(error_reply(&self.conn, &req, EINVAL, &msg, None));
                *input = Input::Header;
                true
            }
            Input::Closed => false,
        }
    }

    /// What a fresh request header leads to.
    fn admit(&mut self, req: Request) -> Input {
        if req.kind == CMD_DISC {
            return Input::Closed;
        }
        if req.kind == CMD_WRITE {
            // The payload follows whatever we think of the request: read it to keep framing.
            if req.length <= self.conn.max_request {
                return Input::Budget(req);
            }
            if req.length > WRITE_DRAIN_MAX_BYTES {
                eprintln!("strata-nbd: write of {} bytes is absurd; closing the connection", req.length);
                return Input::Closed;
            }
            return Input::Drain { req, left: req.length as u64 };
        }
        if let Err((errno, msg)) = validate(&self.conn, &req) {
            self.reply(error_reply(&self.conn, &req, errno, &msg, None));
        } else if req.kind == CMD_READ {
            return Input::Budget(req);
        } else {
            self.run(Box::pin(execute(self.dev.clone(), self.conn, req, None, None)));
        }
        Input::Header
    }

    /// A READ or WRITE that has its payload budget.
    fn start(&mut self, req: Request, budget: Budget) -> Input {
        // Overwritten whole before anyone reads it: by the payload or by the device.
        let buf = self.pool.take(req.length as usize);
        if req.kind == CMD_WRITE {
            return Input::Payload { req, buf, filled: 0, budget };
        }
        self.run(Box::pin(execute(self.dev.clone(), self.conn, req, Some(budget), Some(buf))));
        Input::Header
    }

    /// A WRITE whose payload has arrived.
    fn write(&mut self, req: Request, buf: Buf, budget: Budget) {
        if let Err((errno, msg)) = validate(&self.conn, &req) {
            self.pool.give(buf);
            self.reply(error_reply(&self.conn, &req, errno, &msg, Some(budget)));
            return;
        }
        let (dev, conn) = (self.dev.clone(), self.conn);
        self.run(Box::pin(async move {
            let fua = req.flags & CMD_FLAG_FUA != 0;
            match dev.write(req.offset, buf, fua).await {
                Ok(buf) => Reply { spare: Some(buf), ..ok_reply(&req, Some(budget)) },
                Err(e) => io_error_reply(&conn, &req, &e, Some(budget)),
            }
        }));
    }

    /// Polls a request once on the connection's task: RAM and page-cache hits complete right
    /// there. What has to wait for the device joins the running set.
    fn run(&mut self, mut fut: Running) {
        self.held += 1;
        match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(reply) => self.queue(reply),
            Poll::Pending => self.running.push(fut),
        }
    }

    fn reply(&mut self, reply: Reply) {
        self.held += 1;
        self.queue(reply);
    }

    /// Queues a reply to be written; a buffer it no longer needs goes back to the pool.
    fn queue(&mut self, mut reply: Reply) {
        if let Some(b) = reply.spare.take() {
            self.pool.give(b);
        }
        self.out.queue.push_back(reply);
    }
}

/// Completes once the server stops or the export is removed.
async fn stopped_either(a: &mut watch::Receiver<bool>, b: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = stopped(a) => {}
        _ = stopped(b) => {}
    }
}

/// A request's share of the payload budget: of the server's and of its connection's.
struct Budget {
    _shared: OwnedSemaphorePermit,
    _own: OwnedSemaphorePermit,
}

/// What a connection may hold of the budget: its own share, at least one largest request,
/// at most the server's whole budget.
fn connection_budget(shared: &Shared) -> usize {
    let l = &shared.limits;
    l.connection_budget_bytes.max(l.max_request_bytes as usize).min(l.buffer_budget_bytes)
}

/// The budget a request of `len` payload bytes takes (a larger one than the budget is
/// refused anyway, but must not wait for ever).
fn budget_bytes(shared: &Shared, len: u32) -> u32 {
    (len as usize).min(connection_budget(shared)) as u32
}

/// Waits for `bytes` of the connection's share (`own`), then of the server's.
async fn take_budget(shared: &Shared, own: &Arc<Semaphore>, bytes: u32) -> Budget {
    let own = own.clone().acquire_many_owned(bytes).await.expect("semaphore never closed");
    let shared = shared.buffers.clone().acquire_many_owned(bytes).await.expect("semaphore never closed");
    Budget { _shared: shared, _own: own }
}

/// `take_budget` if both shares have room now.
fn try_budget(shared: &Shared, own: &Arc<Semaphore>, bytes: u32) -> Option<Budget> {
    let own = own.clone().try_acquire_many_owned(bytes).ok()?;
    let shared = shared.buffers.clone().try_acquire_many_owned(bytes).ok()?;
    Some(Budget { _shared: shared, _own: own })
}

/// Writes what is queued (`Some(bytes written)`), or with nothing queued flushes what the
/// stream may still hold (`None`).
async fn write_out<W: AsyncWrite + Unpin>(wr: &mut W, out: &Outbox) -> std::io::Result<Option<usize>> {
    if out.queue.is_empty() {
        return wr.flush().await.map(|()| None);
    }
    let mut slices = [IoSlice::new(&[]); IOV_MAX];
    let n = out.slices(&mut slices);
    wr.write_vectored(&slices[..n]).await.map(Some)
}

/// Flags each command may carry. FUA is accepted on every command, as the protocol asks
/// (clients are known to set it on others than writes), and means nothing on reads.
fn allowed_flags(kind: u16, structured: bool) -> Option<u16> {
    let own = match kind {
        CMD_READ if structured => CMD_FLAG_DF,
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_FLUSH | CMD_CACHE => 0,
        CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        _ => return None,
    };
    Some(own | CMD_FLAG_FUA)
}

fn validate(c: &Conn, req: &Request) -> Result<(), (u32, String)> {
    let Some(allowed) = allowed_flags(req.kind, c.structured) else {
        return Err((EINVAL, format!("unknown command {}", req.kind)));
    };
    if req.flags & !allowed != 0 {
        return Err((EINVAL, format!("flags {:#x} not valid for command {}", req.flags, req.kind)));
    }
    let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && c.read_only {
        return Err((EPERM, "export is read-only".into()));
    }
    if req.kind == CMD_FLUSH {
        return Ok(());
    }
    if req.kind == CMD_BLOCK_STATUS && !c.base_allocation {
        return Err((EINVAL, "no metadata context was negotiated".into()));
    }
    if req.length == 0 {
        return Err((EINVAL, "zero-length request".into()));
    }
    if req.offset.checked_add(req.length as u64).is_none_or(|end| end > c.size) {
        let errno = errno::for_command(ErrorKind::OutOfRange, req.kind);
        return Err((errno, format!("{} bytes at {} pass the end of the export ({})", req.length, req.offset, c.size)));
    }
    if (!req.offset.is_multiple_of(c.align) || !(req.length as u64).is_multiple_of(c.align))
        && matches!(req.kind, CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE)
    {
        return Err((EINVAL, format!("request not aligned to the agreed {} bytes", c.align)));
    }
    if req.kind == CMD_READ && req.length > c.max_request {
        return Err((EINVAL, format!("read of {} bytes exceeds the maximum {}", req.length, c.max_request)));
    }
    Ok(())
}

/// Runs a validated request other than WRITE; `buf` is a READ's buffer of its length (and
/// `None` for the others).
async fn execute(dev: Arc<dyn BlockDev>, c: Conn, req: Request, budget: Option<Budget>, buf: Option<Buf>) -> Reply {
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let (off, len) = (req.offset, req.length as u64);
    let result: Result<(), Error> = match req.kind {
        CMD_READ => match dev.read(off, buf.expect("a READ comes with its buffer")).await {
            Ok(buf) => {
                let mut head = Vec::with_capacity(32);
                if c.structured {
                    chunk_header(&mut head, REPLY_FLAG_DONE, CHUNK_OFFSET_DATA, req.cookie, 8 + req.length);
                    head.extend_from_slice(&off.to_be_bytes());
                } else {
                    simple_reply(&mut head, 0, req.cookie);
                }
                return Reply { head, data: Some(buf), spare: None, _budget: budget };
            }
            Err(e) => Err(e),
        },
        CMD_FLUSH => dev.flush().await,
        CMD_TRIM => {
            let r = dev.discard(off, len).await;
            if r.is_ok() && fua {
                dev.flush().await
            } else {
                r
            }
        }
        CMD_WRITE_ZEROES => {
            let flags = ZeroFlags {
                may_unmap: req.flags & CMD_FLAG_NO_HOLE == 0,
                fast_only: req.flags & CMD_FLAG_FAST_ZERO != 0,
            };
            let r = dev.write_zeroes(off, len, flags).await;
            if r.is_ok() && fua {
                dev.flush().await
            } else {
                r
            }
        }
        CMD_CACHE => dev.cache(off, len).await,
        CMD_BLOCK_STATUS => match dev.block_status(off, len).await {
            Ok(extents) => {
                let head = block_status_reply(&req, &extents, len);
                return Reply { head, data: None, spare: None, _budget: budget };
            }
            Err(e) => Err(e),
        },
        _ => unreachable!("validated command {}", req.kind),
    };
    match result {
        Ok(()) => ok_reply(&req, budget),
        Err(e) => io_error_reply(&c, &req, &e, budget),
    }
}

/// One BLOCK_STATUS chunk for `base:allocation`, clipped to the request (and to a single
/// descriptor with REQ_ONE).
fn block_status_reply(req: &Request, extents: &[Extent], len: u64) -> Vec<u8> {
    const DESC_MAX: u64 = 0xFFFF_F000; // a u32 length that stays 4 KiB aligned
    let req_one = req.flags & CMD_FLAG_REQ_ONE != 0;
    let mut descs: Vec<(u32, u32)> = Vec::new();
    let mut covered = 0u64;
    'outer: for e in extents {
        let flags = (if e.hole { STATE_HOLE } else { 0 }) | (if e.zero { STATE_ZERO } else { 0 });
        let mut left = e.len.min(len - covered);
        while left > 0 {
            let n = left.min(DESC_MAX);
            match descs.last_mut() {
                Some(last) if last.1 == flags && last.0 as u64 + n <= DESC_MAX => last.0 += n as u32,
                _ => descs.push((n as u32, flags)),
            }
            covered += n;
            left -= n;
            if covered >= len || descs.len() >= EXTENTS_MAX || (req_one && !descs.is_empty() && left == 0) {
                break 'outer;
            }
        }
    }
    if descs.is_empty() {
        // A device that described nothing: call it allocated data, never a false hole.
        descs.push((len.min(DESC_MAX) as u32, 0));
    }
    if req_one {
        descs.truncate(1);
    }
    let mut head = Vec::with_capacity(24 + 8 * descs.len());
    chunk_header(&mut head, REPLY_FLAG_DONE, CHUNK_BLOCK_STATUS, req.cookie, 4 + 8 * descs.len() as u32);
    head.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    for (l, f) in descs {
        head.extend_from_slice(&l.to_be_bytes());
        head.extend_from_slice(&f.to_be_bytes());
    }
    head
}

fn ok_reply(req: &Request, budget: Option<Budget>) -> Reply {
    let mut head = Vec::with_capacity(16);
    simple_reply(&mut head, 0, req.cookie);
    Reply { head, data: None, spare: None, _budget: budget }
}

fn io_error_reply(c: &Conn, req: &Request, e: &Error, budget: Option<Budget>) -> Reply {
    error_reply(c, req, errno::for_command(e.kind, req.kind), &e.to_string(), budget)
}

fn error_reply(c: &Conn, req: &Request, errno: u32, msg: &str, budget: Option<Budget>) -> Reply {
    let mut head = Vec::with_capacity(64);
    // With structured replies, READ and BLOCK_STATUS errors must be structured too.
    if c.structured && matches!(req.kind, CMD_READ | CMD_BLOCK_STATUS) {
        error_chunk(&mut head, req.cookie, errno, msg);
    } else {
        simple_reply(&mut head, errno, req.cookie);
    }
    Reply { head, data: None, spare: None, _budget: budget }
}
