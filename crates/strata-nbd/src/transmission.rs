//! The transmission phase: read requests, run each as its own task so replies go out in
//! completion order, and write replies in batches. A request holds an in-flight permit (and
//! buffer budget for its payload) until its reply has been written, so a client that stops
//! reading replies stalls only itself, with bounded memory.

use crate::handshake::{block_sizes, Negotiated};
use crate::proto::*;
use crate::server::{stopped, Shared};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use strata_io::{BlockDev, Buf, Error, ErrorKind, Extent, ZeroFlags};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Write payloads beyond the limit but below this are drained to keep framing and refused;
/// larger ones close the connection.
const WRITE_DRAIN_MAX_BYTES: u32 = 256 << 20;
/// Most extents in one BLOCK_STATUS reply.
const EXTENTS_MAX: usize = 1 << 16;

/// A reply ready to be written, with what it keeps alive until then.
struct Reply {
    head: Vec<u8>,
    data: Option<Buf>,
    _permits: Permits,
}

struct Permits {
    _inflight: OwnedSemaphorePermit,
    _buffer: Option<OwnedSemaphorePermit>,
}

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

pub async fn transmit<R, W>(mut rd: R, wr: W, neg: Negotiated, shared: Arc<Shared>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let export = neg.export.clone();
    let (min, _, max) = block_sizes(&export, shared.limits.max_request_bytes);
    let conn = Conn {
        structured: neg.structured,
        base_allocation: neg.base_allocation,
        read_only: export.read_only,
        size: export.dev.size(),
        align: if neg.block_size_agreed { min as u64 } else { 1 },
        max_request: max,
    };
    let inflight_max = shared.limits.max_inflight_per_connection;
    let inflight = Arc::new(Semaphore::new(inflight_max));
    let (tx, rx) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(write_replies(wr, rx));
    let mut stop = shared.shutdown_rx.clone();

    loop {
        let permit = tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            p = inflight.clone().acquire_owned() => p.expect("semaphore never closed"),
        };
        let mut header = [0u8; REQUEST_BYTES];
        let read = tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            r = rd.read_exact(&mut header) => r,
        };
        if read.is_err() {
            break; // client went away (possibly mid-request)
        }
        let Some(req) = Request::parse(&header) else {
            eprintln!("strata-nbd: bad request magic; closing the connection");
            break;
        };
        if req.kind == CMD_DISC {
            break;
        }
        let mut permits = Permits { _inflight: permit, _buffer: None };

        if req.kind == CMD_WRITE {
            // The payload follows whatever we think of the request: read it to keep framing.
            if req.length > conn.max_request {
                if req.length > WRITE_DRAIN_MAX_BYTES {
                    eprintln!("strata-nbd: write of {} bytes is absurd; closing the connection", req.length);
                    break;
                }
                let mut limited = (&mut rd).take(req.length as u64);
                if tokio::io::copy(&mut limited, &mut tokio::io::sink()).await.ok() != Some(req.length as u64) {
                    break;
                }
                let msg = format!("write of {} bytes exceeds the maximum {}", req.length, conn.max_request);
                send_error(&tx, &conn, &req, EINVAL, &msg, permits);
                continue;
            }
            permits._buffer = Some(buffer_permit(&shared, req.length).await);
            let mut buf = Buf::zeroed(req.length as usize);
            if rd.read_exact(&mut buf).await.is_err() {
                break;
            }
            if let Err((errno, msg)) = validate(&conn, &req) {
                send_error(&tx, &conn, &req, errno, &msg, permits);
                continue;
            }
            let dev = export.dev.clone();
            let tx = tx.clone();
            run_inline_or_spawn(Box::pin(async move {
                let fua = req.flags & CMD_FLAG_FUA != 0;
                match dev.write(req.offset, buf, fua).await {
                    Ok(_) => send_ok(&tx, &req, permits),
                    Err(e) => send_io_error(&tx, &conn, &req, &e, permits),
                }
            }));
            continue;
        }

        if let Err((errno, msg)) = validate(&conn, &req) {
            send_error(&tx, &conn, &req, errno, &msg, permits);
            continue;
        }
        if req.kind == CMD_READ {
            permits._buffer = Some(buffer_permit(&shared, req.length).await);
        }
        let dev = export.dev.clone();
        let tx = tx.clone();
        run_inline_or_spawn(Box::pin(execute(dev, conn, req, tx, permits)));
    }

    // Let every request already taken finish and its reply go out, then close.
    let _all = inflight.acquire_many(inflight_max as u32).await;
    drop(tx);
    let _ = writer.await;
}

/// Polls a request once on the reader's own task: RAM and page-cache hits complete right
/// there, without a task spawn and a hop to another thread. Only what has to wait for the
/// device becomes a task of its own (and then completes out of order).
fn run_inline_or_spawn(mut fut: Pin<Box<dyn Future<Output = ()> + Send + 'static>>) {
    let mut cx = Context::from_waker(Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        tokio::spawn(fut);
    }
}

async fn buffer_permit(shared: &Shared, len: u32) -> OwnedSemaphorePermit {
    let want = (len as usize).min(shared.limits.buffer_budget_bytes) as u32;
    shared.buffers.clone().acquire_many_owned(want).await.expect("semaphore never closed")
}

/// Flags each command may carry.
fn allowed_flags(kind: u16, structured: bool) -> Option<u16> {
    Some(match kind {
        CMD_READ => {
            if structured {
                CMD_FLAG_DF
            } else {
                0
            }
        }
        CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
        CMD_FLUSH | CMD_CACHE => 0,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        _ => return None,
    })
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
        let errno = if matches!(req.kind, CMD_WRITE | CMD_WRITE_ZEROES) { ENOSPC } else { EINVAL };
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

async fn execute(dev: Arc<dyn BlockDev>, c: Conn, req: Request, tx: mpsc::UnboundedSender<Reply>, permits: Permits) {
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let (off, len) = (req.offset, req.length as u64);
    let result: Result<(), Error> = match req.kind {
        CMD_READ => match dev.read(off, Buf::zeroed(len as usize)).await {
            Ok(buf) => {
                let mut head = Vec::with_capacity(32);
                if c.structured {
                    chunk_header(&mut head, REPLY_FLAG_DONE, CHUNK_OFFSET_DATA, req.cookie, 8 + req.length);
                    head.extend_from_slice(&off.to_be_bytes());
                } else {
                    simple_reply(&mut head, 0, req.cookie);
                }
                let _ = tx.send(Reply { head, data: Some(buf), _permits: permits });
                return;
            }
            Err(e) => Err(e),
        },
        CMD_FLUSH => dev.flush().await,
        CMD_TRIM => {
            let r = dev.discard(off, len).await;
            if r.is_ok() && fua { dev.flush().await } else { r }
        }
        CMD_WRITE_ZEROES => {
            let flags = ZeroFlags {
                may_unmap: req.flags & CMD_FLAG_NO_HOLE == 0,
                fast_only: req.flags & CMD_FLAG_FAST_ZERO != 0,
            };
            let r = dev.write_zeroes(off, len, flags).await;
            if r.is_ok() && fua { dev.flush().await } else { r }
        }
        CMD_CACHE => dev.cache(off, len).await,
        CMD_BLOCK_STATUS => match dev.block_status(off, len).await {
            Ok(extents) => {
                let head = block_status_reply(&req, &extents, len);
                let _ = tx.send(Reply { head, data: None, _permits: permits });
                return;
            }
            Err(e) => Err(e),
        },
        _ => unreachable!("validated command {}", req.kind),
    };
    match result {
        Ok(()) => send_ok(&tx, &req, permits),
        Err(e) => send_io_error(&tx, &c, &req, &e, permits),
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

fn send_ok(tx: &mpsc::UnboundedSender<Reply>, req: &Request, permits: Permits) {
    let mut head = Vec::with_capacity(16);
    simple_reply(&mut head, 0, req.cookie);
    let _ = tx.send(Reply { head, data: None, _permits: permits });
}

fn send_io_error(tx: &mpsc::UnboundedSender<Reply>, c: &Conn, req: &Request, e: &Error, permits: Permits) {
    // Writes past the end are ENOSPC, reads past the end EINVAL; the device only says "range".
    let errno = match (e.kind, req.kind) {
        (ErrorKind::OutOfRange, CMD_WRITE | CMD_WRITE_ZEROES) => ENOSPC,
        (kind, _) => kind.nbd_errno(),
    };
    send_error(tx, c, req, errno, &e.to_string(), permits);
}

fn send_error(tx: &mpsc::UnboundedSender<Reply>, c: &Conn, req: &Request, errno: u32, msg: &str, permits: Permits) {
    let mut head = Vec::with_capacity(64);
    // With structured replies, READ and BLOCK_STATUS errors must be structured too.
    if c.structured && matches!(req.kind, CMD_READ | CMD_BLOCK_STATUS) {
        error_chunk(&mut head, req.cookie, errno, msg);
    } else {
        simple_reply(&mut head, errno, req.cookie);
    }
    let _ = tx.send(Reply { head, data: None, _permits: permits });
}

async fn write_replies<W: AsyncWrite + Unpin>(wr: W, mut rx: mpsc::UnboundedReceiver<Reply>) {
    let mut out = BufWriter::with_capacity(256 << 10, wr);
    let mut done = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(r) = next {
            if out.write_all(&r.head).await.is_err() {
                return;
            }
            if let Some(d) = &r.data {
                if out.write_all(d).await.is_err() {
                    return;
                }
            }
            // Permits are released only once the reply is on its way.
            done.push(r);
            next = rx.try_recv().ok();
        }
        if out.flush().await.is_err() {
            return;
        }
        done.clear();
    }
    let _ = out.shutdown().await;
}
