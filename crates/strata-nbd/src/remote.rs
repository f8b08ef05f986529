//! A remote NBD export as a `BlockDev`: the origin of a cache, or a volume of its own.
//!
//! Each connection has one reader task that matches replies (simple or structured) to the
//! requests waiting for them by cookie; requests are written by their callers, many in flight
//! at once. With `CAN_MULTI_CONN` several connections share the load. Requests are split and
//! aligned to the server's block size constraints; commands the server does not offer are
//! emulated (FUA as write + flush, WRITE_ZEROES as writes of zeroes) or answered without it
//! (TRIM is advisory, BLOCK_STATUS says "data").
//!
//! Network faults: every request attempt has a timeout; a timed-out or broken connection is
//! closed and its slot reconnects in the background with a backoff capped at one second, so
//! the device is back within about a second of the server. A request whose connection broke
//! is sent again (NBD writes are idempotent) until `outage` has passed since it was issued,
//! then fails with EIO: it never hangs and never gets a wrong answer. Writes acknowledged
//! since the last completed flush, FUA writes included, are kept (bounded by `replay_bytes`;
//! more forces a flush) and written again on every new connection before it takes requests,
//! in the order they were acknowledged (overlapping ones one after another), so a server
//! that lost unflushed writes when it restarted gets them back before the flush that covers
//! them is sent again, and one that kept them is left with the newest data.

use crate::client::{choose, greet, split, start_tls, BoxStream, ExportInfo, ReadBox, Want, WriteBox};
use crate::errno;
use crate::proto::*;
use crate::tls::ClientTls;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_io::metrics::{MetricKind, Sample};
use strata_io::query::{percent_encode, Written};
use strata_io::units::{format_duration, format_size_exact};
use strata_io::{check_range, BlockDev, BoxFut, Buf, Error, ErrorKind, Extent, Geometry, Result, ZeroFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// The default NBD port.
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp { host, port } => write!(f, "{}:{port}", Host(host)),
            Address::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A host name, or an IPv6 address in brackets.
struct Host<'a>(&'a str);

impl fmt::Display for Host<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.contains(':') {
            write!(f, "[{}]", self.0)
        } else {
            f.write_str(self.0)
        }
    }
}

/// How the device behaves on the network (the `nbd://` spec's options).
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// Connections to open; `None`: 4 when the server allows several, else 1.
    pub connections: Option<usize>,
    /// One attempt of one request (and one connect with its handshake) gets this long.
    pub timeout: Duration,
    /// A request that cannot reach the server retries this long after it was issued, then
    /// fails with EIO.
    pub outage: Duration,
    /// Bytes of acknowledged, unflushed writes kept for replay; more forces a flush.
    pub replay_bytes: u64,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            connections: None,
            timeout: Duration::from_secs(30),
            outage: Duration::from_secs(180),
            replay_bytes: 64 << 20,
        }
    }
}

/// A remote export: where, which, over TLS or not, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteSpec {
    pub address: Address,
    pub export: String,
    pub tls: Option<ClientTls>,
    pub tuning: Tuning,
}

impl RemoteSpec {
    /// `nbd://host:port/export` and the like, without options.
    pub fn uri(&self) -> String {
        let mut s = String::new();
        self.write_uri(&mut s, false).expect("writing to a String");
        s
    }

    /// Writes the URI: as `uri` says it, or (`spec`) as a device spec: the default port
    /// left out and the options that differ from the defaults written.
    pub fn write_uri(&self, f: &mut impl fmt::Write, spec: bool) -> fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        let export = percent_encode(&self.export, false);
        let mut w = Written::default();
        match &self.address {
            Address::Tcp { host, port } if spec && *port == DEFAULT_PORT => {
                write!(f, "nbd{s}://{}/{export}", Host(host))?
            }
            Address::Tcp { .. } => write!(f, "nbd{s}://{}/{export}", self.address)?,
            Address::Unix(p) => {
                write!(f, "nbd{s}+unix:///{export}")?;
                w.pair("socket", encoded_path(p));
            }
        }
        if spec {
            self.write_options(&mut w);
        }
        write!(f, "{w}")
    }

    /// The options that differ from the defaults, in the order the spec parser takes them.
    fn write_options(&self, w: &mut Written) {
        let (t, d) = (&self.tuning, Tuning::default());
        if let Some(n) = t.connections {
            w.pair("connections", n);
        }
        w.unless_default("timeout", format_duration(t.timeout), format_duration(d.timeout));
        w.unless_default("outage", format_duration(t.outage), format_duration(d.outage));
        if t.replay_bytes != d.replay_bytes {
            w.pair("replay", format_size_exact(t.replay_bytes));
        }
        if let Some(tls) = &self.tls {
            if let Some(p) = &tls.psk_file {
                w.pair("tls-psk-file", encoded_path(p));
            }
            if let Some(u) = &tls.username {
                w.pair("tls-username", percent_encode(u, true));
            }
            if let Some(p) = &tls.certificates {
                w.pair("tls-certificates", encoded_path(p));
            }
            if !tls.verify {
                w.pair("tls-verify", "off");
            }
        }
    }
}

fn encoded_path(p: &Path) -> String {
    percent_encode(&p.to_string_lossy(), true)
}

/// Write payloads up to this size are copied into the queue of requests sent together;
/// larger ones go out from where they are.
const GATHER_PAYLOAD_MAX: usize = 64 << 10;

/// How one attempt of a request ended, short of success.
enum Failure {
    /// The server answered with this errno (and maybe a message).
    Server(u32, String),
    /// The connection broke or was closed before the reply: try again elsewhere.
    Lost(String),
}

#[derive(Default)]
struct Done {
    buf: Option<Buf>,
    extents: Vec<Extent>,
}

/// A request waiting for its reply.
struct Pending {
    kind: u16,
    offset: u64,
    len: u32,
    /// A READ's buffer, filled by the reader task. It may hold a previous request's bytes
    /// (see `BufPool`): a reply must cover every byte of it.
    buf: Option<Buf>,
    /// The ranges of a READ that structured chunks (data or hole) have filled so far.
    filled: Vec<(u64, u64)>,
    extents: Vec<Extent>,
    error: Option<(u32, String)>,
    done: Option<oneshot::Sender<std::result::Result<Done, Failure>>>,
}

impl Pending {
    /// Whether the chunks received fill the whole READ, each byte once.
    fn read_whole(&mut self) -> bool {
        self.filled.sort_unstable();
        let mut at = self.offset;
        for &(start, end) in &self.filled {
            if start != at {
                return false;
            }
            at = end;
        }
        at == self.offset + self.len as u64
    }

    fn finish(&mut self) {
        if self.error.is_none() && self.kind == CMD_READ && self.buf.is_some() && !self.read_whole() {
            let msg = format!("the reply to a READ of {} bytes at {} did not cover it exactly", self.len, self.offset);
            self.error = Some((EIO, msg));
        }
        let out = match self.error.take() {
            Some((e, msg)) => Err(Failure::Server(e, msg)),
            None => Ok(Done { buf: self.buf.take(), extents: std::mem::take(&mut self.extents) }),
        };
        if let Some(tx) = self.done.take() {
            let _ = tx.send(out);
        }
    }
}

/// One connection: its write half (callers take turns), the requests waiting for replies,
/// and the reader task that answers them.
struct Conn {
    info: ExportInfo,
    tx: tokio::sync::Mutex<WriteBox>,
    /// Requests (with payloads up to `GATHER_PAYLOAD_MAX`) waiting for the write half: whoever
    /// holds it next sends them all in one write (one TLS record, one system call).
    queued: Mutex<Vec<u8>>,
    pending: Mutex<HashMap<u64, Pending>>,
    dead: AtomicBool,
    died: watch::Sender<bool>,
    reader: Mutex<Option<JoinHandle<()>>>,
    inflight: AtomicUsize,
}

impl Conn {
    fn new(stream: BoxStream, info: ExportInfo, log_label: String) -> Arc<Conn> {
        let (rd, wr) = split(stream);
        let conn = Arc::new(Conn {
            info,
            tx: tokio::sync::Mutex::new(wr),
            queued: Mutex::new(Vec::new()),
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            died: watch::channel(false).0,
            reader: Mutex::new(None),
            inflight: AtomicUsize::new(0),
        });
        let c = conn.clone();
        let task = tokio::spawn(async move {
            let why = match read_replies(&c, BufReader::with_capacity(256 << 10, rd)).await {
                Ok(()) => "the server closed the connection".to_string(),
                Err(e) => e,
            };
            c.kill(&format!("{log_label}: {why}"));
        });
        *conn.reader.lock() = Some(task);
        conn
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Closes the connection: every waiting request is told it was lost.
    fn kill(&self, why: &str) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(t) = self.reader.lock().take() {
            t.abort();
        }
        let lost: Vec<Pending> = self.pending.lock().drain().map(|(_, p)| p).collect();
        for mut p in lost {
            if let Some(tx) = p.done.take() {
                let _ = tx.send(Err(Failure::Lost(why.to_string())));
            }
        }
        self.died.send_replace(true);
    }

    /// Sends one request and waits for its reply. `buf` is a READ's buffer.
    async fn call(&self, req: Request, payload: Option<&[u8]>, buf: Option<Buf>) -> std::result::Result<Done, Failure> {
        let (tx, rx) = oneshot::channel();
        let p = Pending {
            kind: req.kind,
            offset: req.offset,
            len: req.length,
            buf,
            filled: Vec::new(),
            extents: Vec::new(),
            error: None,
            done: Some(tx),
        };
        self.pending.lock().insert(req.cookie, p);
        if self.is_dead() {
            self.pending.lock().remove(&req.cookie);
            return Err(Failure::Lost("connection closed".into()));
        }
        // Dropped (timed out) before the reply: forget the request; a late reply is skipped.
        struct Forget<'a>(&'a Conn, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.pending.lock().remove(&self.1);
                self.0.inflight.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let _forget = Forget(self, req.cookie);
        let head = req.encode();
        let large = payload.filter(|p| p.len() > GATHER_PAYLOAD_MAX);
        if large.is_none() {
            let mut q = self.queued.lock();
            q.extend_from_slice(&head);
            q.extend_from_slice(payload.unwrap_or(&[]));
        }
        let sent = async {
            let mut w = self.tx.lock().await;
            if self.is_dead() {
                return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "connection closed"));
            }
            // Ours and whatever else was queued meanwhile; nothing if the holder before us
            // sent ours with its own.
            // A large payload's header goes with them; the payload follows from where it is.
            let mut batch = std::mem::take(&mut *self.queued.lock());
            if large.is_some() {
                batch.extend_from_slice(&head);
            }
            if !batch.is_empty() {
                w.write_all(&batch).await?;
                let mut q = self.queued.lock();
                if q.is_empty() {
                    *q = batch; // keep the allocation
                    q.clear();
                }
            }
            if let Some(p) = large {
                w.write_all(p).await?;
            }
            w.flush().await
        };
        if let Err(e) = sent.await {
            let why = format!("sending a request: {e}");
            self.kill(&why);
            return Err(Failure::Lost(why));
        }
        rx.await.unwrap_or_else(|_| Err(Failure::Lost("connection closed".into())))
    }
}

/// The reader task: replies until the stream ends or breaks framing. Returns why it stopped.
async fn read_replies(conn: &Conn, mut rd: BufReader<ReadBox>) -> std::result::Result<(), String> {
    let io = |e: std::io::Error| format!("reading replies: {e}");
    loop {
        let magic = match rd.read_u32().await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io(e)),
        };
        match magic {
            SIMPLE_REPLY_MAGIC => {
                let err = rd.read_u32().await.map_err(io)?;
                let cookie = rd.read_u64().await.map_err(io)?;
                // Taken now: if its caller gives up meanwhile, the dropped sender tells it.
                let Some(mut p) = conn.pending.lock().remove(&cookie) else {
                    // A late reply to a forgotten request: with structured replies agreed, only
                    // replies without payload are simple.
                    continue;
                };
                let read = p.kind == CMD_READ && err == 0;
                if conn.info.structured && read {
                    return Err("a simple reply to a READ after structured replies were agreed".into());
                }
                let out = if err != 0 {
                    Err(Failure::Server(err, String::new()))
                } else {
                    let mut buf = p.buf.take();
                    match buf.as_mut() {
                        Some(b) if read => rd.read_exact(&mut b[..]).await.map(drop).map_err(io)?,
                        None if read => skip(&mut rd, p.len as u64).await.map_err(io)?,
                        _ => {}
                    }
                    Ok(Done { buf, extents: std::mem::take(&mut p.extents) })
                };
                if let Some(tx) = p.done.take() {
                    let _ = tx.send(out);
                }
            }
            STRUCTURED_REPLY_MAGIC => {
                let flags = rd.read_u16().await.map_err(io)?;
                let ty = rd.read_u16().await.map_err(io)?;
                let cookie = rd.read_u64().await.map_err(io)?;
                let len = rd.read_u32().await.map_err(io)?;
                chunk(conn, &mut rd, ty, cookie, len).await?;
                if flags & REPLY_FLAG_DONE != 0 {
                    if let Some(mut p) = conn.pending.lock().remove(&cookie) {
                        p.finish();
                    }
                }
            }
            m => return Err(format!("bad reply magic {m:#x}")),
        }
    }
}

async fn skip(rd: &mut BufReader<ReadBox>, n: u64) -> std::io::Result<()> {
    let copied = tokio::io::copy(&mut (&mut *rd).take(n), &mut tokio::io::sink()).await?;
    if copied < n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// One structured chunk's payload.
async fn chunk(
    conn: &Conn,
    rd: &mut BufReader<ReadBox>,
    ty: u16,
    cookie: u64,
    len: u32,
) -> std::result::Result<(), String> {
    let io = |e: std::io::Error| format!("reading a reply chunk: {e}");
    let bad = |what: &str| format!("bad {what} chunk ({len} bytes) for cookie {cookie}");
    match ty {
        CHUNK_NONE => skip(rd, len as u64).await.map_err(io),
        CHUNK_OFFSET_DATA => {
            if len < 8 {
                return Err(bad("data"));
            }
            let offset = rd.read_u64().await.map_err(io)?;
            let n = len as u64 - 8;
            let taken = conn.pending.lock().get_mut(&cookie).map(|p| (p.offset, p.len, p.buf.take()));
            match taken {
                Some((start, plen, Some(mut b))) => {
                    if offset < start || offset.checked_add(n).is_none_or(|end| end > start + plen as u64) {
                        if let Some(p) = conn.pending.lock().get_mut(&cookie) {
                            p.buf = Some(b);
                        }
                        return Err(bad("data"));
                    }
                    let at = (offset - start) as usize;
                    rd.read_exact(&mut b[at..at + n as usize]).await.map_err(io)?;
                    if let Some(p) = conn.pending.lock().get_mut(&cookie) {
                        p.buf = Some(b);
                        p.filled.push((offset, offset + n));
                    }
                    Ok(())
                }
                _ => skip(rd, n).await.map_err(io),
            }
        }
        CHUNK_OFFSET_HOLE => {
            if len != 12 {
                return Err(bad("hole"));
            }
            let offset = rd.read_u64().await.map_err(io)?;
            let n = rd.read_u32().await.map_err(io)? as u64;
            if let Some(p) = conn.pending.lock().get_mut(&cookie) {
                let end = p.offset + p.len as u64;
                if offset < p.offset || offset.checked_add(n).is_none_or(|e| e > end) {
                    return Err(bad("hole"));
                }
                if let Some(b) = p.buf.as_mut() {
                    let at = (offset - p.offset) as usize;
                    b[at..at + n as usize].fill(0);
                    p.filled.push((offset, offset + n));
                }
            }
            Ok(())
        }
        CHUNK_BLOCK_STATUS => {
            if len < 4 || !(len - 4).is_multiple_of(8) || len > 8 << 20 {
                return Err(bad("block status"));
            }
            let id = rd.read_u32().await.map_err(io)?;
            let mut d = vec![0u8; len as usize - 4];
            rd.read_exact(&mut d).await.map_err(io)?;
            if Some(id) == conn.info.base_allocation {
                if let Some(p) = conn.pending.lock().get_mut(&cookie) {
                    for e in d.chunks_exact(8) {
                        let n = u32::from_be_bytes(e[..4].try_into().unwrap()) as u64;
                        let state = u32::from_be_bytes(e[4..].try_into().unwrap());
                        p.extents.push(Extent { len: n, hole: state & STATE_HOLE != 0, zero: state & STATE_ZERO != 0 });
                    }
                }
            }
            Ok(())
        }
        t if t & (1 << 15) != 0 => {
            if len < 6 {
                return Err(bad("error"));
            }
            let mut d = vec![0u8; len as usize];
            rd.read_exact(&mut d).await.map_err(io)?;
            let err = u32::from_be_bytes(d[..4].try_into().unwrap());
            let mlen = (u16::from_be_bytes(d[4..6].try_into().unwrap()) as usize).min(d.len() - 6);
            let msg = String::from_utf8_lossy(&d[6..6 + mlen]).into_owned();
            if let Some(p) = conn.pending.lock().get_mut(&cookie) {
                p.error.get_or_insert((if err == 0 { EIO } else { err }, msg));
            }
            Ok(())
        }
        t => Err(format!("unknown reply chunk type {t}")),
    }
}

/// Where the device stands with its server, for `status`.
#[derive(Default)]
struct Health {
    /// Since when no connection has been up (None while one is).
    down_since: Option<Instant>,
    /// Time with no connection up, over finished outages.
    away: Duration,
    outages: u64,
    reconnects: u64,
    timeouts: u64,
    last_error: String,
    /// The TLS version and cipher suite of the last connection made.
    tls_cipher: Option<String>,
}

/// Most log entries a replay has in flight at once.
const REPLAY_BATCH: usize = 64;

/// A write acknowledged and not yet covered by a completed flush.
#[derive(Clone)]
struct Logged {
    seq: u64,
    offset: u64,
    /// Data, or `None` for zeroes of `len` bytes.
    data: Option<Arc<Vec<u8>>>,
    len: u64,
}

#[derive(Default)]
struct ReplayLog {
    entries: VecDeque<Logged>,
    bytes: u64,
    next_seq: u64,
}

struct Inner {
    spec: RemoteSpec,
    /// What the first connection agreed; later connections must agree on size and flags.
    info: ExportInfo,
    slots: Vec<Mutex<Option<Arc<Conn>>>>,
    /// Bumped whenever a connection comes up.
    up: watch::Sender<u64>,
    live: AtomicUsize,
    next_slot: AtomicUsize,
    cookie: AtomicU64,
    health: Mutex<Health>,
    /// Requests take it shared for one attempt; a replay takes it alone.
    gate: tokio::sync::RwLock<()>,
    /// Writes, zeroes and trims take it shared; a read-modify-write (a write the server's
    /// minimum block does not divide) takes it alone, so no write to its blocks lands
    /// between its read and its write, to be overwritten by the block as it was read.
    rmw: tokio::sync::RwLock<()>,
    log: Mutex<ReplayLog>,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    retries: AtomicU64,
    /// Writes (and zeroes, trims) completed, and how many of them the last completed flush
    /// covered: when equal, a flush has nothing to do and does not wait for the server.
    completed: AtomicU64,
    flushed: AtomicU64,
}

/// A remote NBD export as a block device.
pub struct RemoteDev {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RemoteDev {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for s in &self.inner.slots {
            if let Some(c) = s.lock().take() {
                c.kill("device closed");
            }
        }
    }
}

/// Opens a stream to the server and negotiates: STARTTLS first when asked, then structured
/// replies, `base:allocation` and the export. Also returns the TLS version and cipher agreed.
async fn connect(spec: &RemoteSpec) -> std::io::Result<(BoxStream, ExportInfo, Option<String>)> {
    let mut s: BoxStream = match &spec.address {
        Address::Tcp { host, port } => {
            let t = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            t.set_nodelay(true)?;
            Box::new(t)
        }
        Address::Unix(p) => Box::new(tokio::net::UnixStream::connect(p).await?),
    };
    greet(&mut s).await?;
    let mut cipher = None;
    if let Some(tls) = &spec.tls {
        start_tls(&mut s).await?;
        let host = match &spec.address {
            Address::Tcp { host, .. } => host.as_str(),
            Address::Unix(_) => "localhost",
        };
        let t = tls.connect(host, s).await?;
        cipher = Some(t.cipher());
        s = Box::new(t);
    }
    let info =
        choose(&mut s, &Want { export: &spec.export, structured: true, base_allocation: true, block_sizes: true })
            .await?;
    Ok((s, info, cipher))
}

/// Whether a failed connect means no server answered (rather than one that said no).
fn is_unreachable(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(kind, ConnectionRefused | NotFound | ConnectionReset | ConnectionAborted | TimedOut | AddrNotAvailable)
        || matches!(kind, UnexpectedEof | BrokenPipe | Other)
}

fn eio(msg: String) -> Error {
    Error::new(ErrorKind::Io, msg)
}

/// The server could not be reached in time: nothing acknowledged is lost (see `replay`).
fn unavailable(msg: String) -> Error {
    Error::new(ErrorKind::Unavailable, msg)
}

impl RemoteDev {
    /// Connects (one attempt, within the request timeout) and starts the connections.
    ///
    /// A server that cannot be reached now is an error, as it is for qemu and nbd-client:
    /// the export's size and abilities come from it, and a mistyped address should not look
    /// like an outage. Outages after the first connection are ridden out (`Tuning::outage`).
    pub async fn open(spec: RemoteSpec) -> Result<RemoteDev> {
        let shown = spec.uri();
        let unreachable = |why: String| {
            let hint = "a remote origin must answer when it is opened; outages after that are waited out";
            format!("{shown}: cannot reach the server: {why} ({hint})")
        };
        let (stream, info, cipher) = match tokio::time::timeout(spec.tuning.timeout, connect(&spec)).await {
            Ok(Ok(c)) => c,
            // TLS refused or failed: a setting to fix, not an outage (nor a read-only device).
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(Error::new(ErrorKind::Invalid, format!("{shown}: {e}")));
            }
            Ok(Err(e)) if is_unreachable(e.kind()) => return Err(eio(unreachable(e.to_string()))),
            Ok(Err(e)) => return Err(eio(format!("{shown}: {e}"))),
            Err(_) => return Err(eio(unreachable(format!("no answer within {:?}", spec.tuning.timeout)))),
        };
        let multi = info.flags & TFLAG_CAN_MULTI_CONN != 0;
        let n = spec.tuning.connections.unwrap_or(if multi { 4 } else { 1 }).max(1);
        if n > 1 && !multi {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{shown}: connections={n} asked, but the server does not allow several (no CAN_MULTI_CONN)"),
            ));
        }
        let inner = Arc::new(Inner {
            rmw: tokio::sync::RwLock::new(()),
            info,
            slots: (0..n).map(|_| Mutex::new(None)).collect(),
            up: watch::channel(0).0,
            live: AtomicUsize::new(0),
            next_slot: AtomicUsize::new(0),
            cookie: AtomicU64::new(1),
            health: Mutex::new(Health { tls_cipher: cipher, ..Health::default() }),
            gate: tokio::sync::RwLock::new(()),
            log: Mutex::new(ReplayLog::default()),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            spec,
        });
        let first = Conn::new(stream, info, shown.clone());
        let mut tasks = Vec::with_capacity(n);
        let mut first = Some(first);
        for i in 0..n {
            let c = first.take();
            if let Some(c) = &c {
                inner.publish(i, c.clone());
            }
            tasks.push(tokio::spawn(maintain(inner.clone(), i, c)));
        }
        Ok(RemoteDev { inner, tasks })
    }

    pub fn info(&self) -> ExportInfo {
        self.inner.info
    }
}

/// Keeps slot `i` connected: waits for its connection to die, then reconnects with backoff
/// (50 ms doubling to 1 s), replays the log on the new connection and publishes it.
async fn maintain(inner: Arc<Inner>, i: usize, mut conn: Option<Arc<Conn>>) {
    let shown = inner.spec.uri();
    let mut backoff = Duration::from_millis(50);
    // A slot's first connection (made in the background for all but the first) is no
    // reconnection.
    let mut connected_before = conn.is_some();
    loop {
        if let Some(c) = conn.take() {
            let mut died = c.died.subscribe();
            let _ = died.wait_for(|d| *d).await;
            inner.unpublish(i, &c);
            backoff = Duration::from_millis(50);
        }
        let timeout = inner.spec.tuning.timeout;
        let attempt = async {
            let (stream, info, cipher) = connect(&inner.spec).await.map_err(|e| e.to_string())?;
            inner.health.lock().tls_cipher = cipher;
            if let Some(change) = export_change(&inner.info, &info) {
                return Err(format!("the export changed: {change}; waiting for it as it was"));
            }
            let c = Conn::new(stream, info, shown.clone());
            inner.replay(&c).await?;
            Ok(c)
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(c)) => {
                inner.health.lock().reconnects += u64::from(connected_before);
                connected_before = true;
                inner.publish(i, c.clone());
                conn = Some(c);
            }
            Ok(Err(e)) => inner.health.lock().last_error = format!("reconnecting: {e}"),
            Err(_) => inner.health.lock().last_error = format!("reconnecting: no answer within {timeout:?}"),
        }
        if conn.is_none() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// How `now` differs from the export as first agreed (`was`), where the difference matters:
/// its size, structured replies, block sizes, or any transmission flag but the rotational
/// hint. Requests are shaped by what was first agreed (a FUA bit, a write to a read-only
/// export, several connections without multi-conn, whose flushes may not cover each other's
/// writes), so a server that comes back otherwise is not used.
fn export_change(was: &ExportInfo, now: &ExportInfo) -> Option<String> {
    let flags = |i: &ExportInfo| i.flags & !TFLAG_ROTATIONAL;
    let mut changes = Vec::new();
    if now.size != was.size {
        changes.push(format!("{} bytes (was {})", now.size, was.size));
    }
    if now.structured != was.structured {
        changes.push(format!("structured replies {} (was {})", now.structured, was.structured));
    }
    if now.block != was.block {
        changes.push(format!("block sizes {:?} (was {:?})", now.block, was.block));
    }
    if flags(now) != flags(was) {
        changes.push(format!("transmission flags {:#06x} (was {:#06x})", flags(now), flags(was)));
    }
    (!changes.is_empty()).then(|| changes.join(", "))
}

impl Inner {
    fn publish(&self, i: usize, c: Arc<Conn>) {
        *self.slots[i].lock() = Some(c);
        if self.live.fetch_add(1, Ordering::AcqRel) == 0 {
            let mut h = self.health.lock();
            if let Some(t) = h.down_since.take() {
                h.away += t.elapsed();
            }
        }
        self.up.send_modify(|v| *v += 1);
    }

    fn unpublish(&self, i: usize, c: &Arc<Conn>) {
        let mut slot = self.slots[i].lock();
        if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, c)) {
            *slot = None;
            if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
                let mut h = self.health.lock();
                h.down_since = Some(Instant::now());
                h.outages += 1;
            }
        }
    }

    /// A live connection, the least busy from a rotating start.
    fn pick(&self) -> Option<Arc<Conn>> {
        let n = self.slots.len();
        let start = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<Arc<Conn>> = None;
        for k in 0..n {
            if let Some(c) = self.slots[(start + k) % n].lock().as_ref() {
                if !c.is_dead()
                    && best
                        .as_ref()
                        .is_none_or(|b| c.inflight.load(Ordering::Relaxed) < b.inflight.load(Ordering::Relaxed))
                {
                    best = Some(c.clone());
                }
            }
        }
        best
    }

    /// Waits for a live connection until `deadline`.
    async fn live_conn(&self, deadline: tokio::time::Instant, issued: Instant) -> Result<Arc<Conn>> {
        if let Some(c) = self.pick() {
            return Ok(c);
        }
        let mut up = self.up.subscribe();
        loop {
            if let Some(c) = self.pick() {
                return Ok(c);
            }
            if tokio::time::timeout_at(deadline, up.changed()).await.is_err() {
                let why = self.health.lock().last_error.clone();
                return Err(unavailable(format!(
                    "{}: unreachable for {:.1} s, giving up ({why})",
                    self.spec.uri(),
                    issued.elapsed().as_secs_f64()
                )));
            }
        }
    }

    /// Runs one request to its answer, over broken connections and timeouts, until the
    /// outage limit.
    async fn request(&self, kind: u16, flags: u16, offset: u64, len: u32, payload: Option<&[u8]>) -> Result<Done> {
        self.request_into(kind, flags, offset, len, payload, None).await
    }

    /// `request`, reading into `buf` (a READ's buffer of `len` bytes) when given.
    async fn request_into(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
        mut buf: Option<Buf>,
    ) -> Result<Done> {
        let issued = Instant::now();
        let deadline = tokio::time::Instant::now() + self.spec.tuning.outage;
        let what = || format!("{}: {} of {len} bytes at {offset}", self.spec.uri(), command_name(kind));
        loop {
            let conn = self.live_conn(deadline, issued).await;
            let conn = conn.map_err(|e| unavailable(format!("{}: {}", what(), e.context)))?;
            // A lost attempt loses its buffer: the next one gets a new one.
            let buf = buf.take().or_else(|| (kind == CMD_READ).then(|| Buf::zeroed(len as usize)));
            let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
            let req = Request { flags, kind, cookie, offset, length: len };
            let gate = self.gate.read().await;
            let timeout = self.spec.tuning.timeout;
            let outcome = tokio::time::timeout(timeout, conn.call(req, payload, buf)).await;
            drop(gate);
            let why = match outcome {
                Ok(Ok(done)) => {
                    if matches!(kind, CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM) {
                        self.completed.fetch_add(1, Ordering::AcqRel);
                    }
                    return Ok(done);
                }
                Ok(Err(Failure::Server(ESHUTDOWN, _))) => "the server is shutting down".to_string(),
                Ok(Err(Failure::Server(e, msg))) => {
                    let kind = errno::to_kind(e);
                    let msg = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                    return Err(Error::new(kind, format!("{}: the server answered errno {e}{msg}", what())));
                }
                Ok(Err(Failure::Lost(why))) => why,
                Err(_) => {
                    self.health.lock().timeouts += 1;
                    format!("no reply within {timeout:?}")
                }
            };
            conn.kill(&why);
            self.health.lock().last_error = format!("{}: {why}", what());
            self.retries.fetch_add(1, Ordering::Relaxed);
            if tokio::time::Instant::now() >= deadline {
                return Err(unavailable(format!("{}: {why}; giving up after {:?}", what(), self.spec.tuning.outage)));
            }
        }
    }

    /// Writes the replay log on `c` before it takes requests, with every request held off.
    /// Entries go out in the order they were acknowledged: many at once, but one that
    /// overlaps an entry still in flight waits for it (a server may apply requests in flight
    /// in any order, and the later write must land last).
    async fn replay(&self, c: &Conn) -> std::result::Result<(), String> {
        let _alone = self.gate.write().await;
        let entries: Vec<Logged> = self.log.lock().entries.iter().cloned().collect();
        let mut rest = &entries[..];
        while !rest.is_empty() {
            let mut batch: Vec<(u64, u64)> = Vec::new();
            let n = rest
                .iter()
                .take_while(|e| {
                    let (start, end) = (e.offset, e.offset + e.len);
                    let alone = batch.len() < REPLAY_BATCH && !batch.iter().any(|&(s, t)| start < t && s < end);
                    batch.push((start, end));
                    alone
                })
                .count()
                .max(1);
            let calls = rest[..n].iter().map(|e| {
                let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
                let kind = if e.data.is_some() { CMD_WRITE } else { CMD_WRITE_ZEROES };
                let req = Request { flags: 0, kind, cookie, offset: e.offset, length: e.len as u32 };
                c.call(req, e.data.as_deref().map(|d| &d[..]), None)
            });
            for r in futures::future::join_all(calls).await {
                match r {
                    Ok(_) => {}
                    Err(Failure::Server(e, m)) => return Err(format!("replaying writes: errno {e} {m}")),
                    Err(Failure::Lost(why)) => return Err(format!("replaying writes: {why}")),
                }
            }
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Records an acknowledged write; true when the log is over its bound (flush now).
    fn logged(&self, offset: u64, data: Option<&[u8]>, len: u64) -> bool {
        let mut log = self.log.lock();
        let seq = log.next_seq;
        log.next_seq += 1;
        log.bytes += data.map_or(0, |d| d.len() as u64);
        log.entries.push_back(Logged { seq, offset, data: data.map(|d| Arc::new(d.to_vec())), len });
        log.bytes > self.spec.tuning.replay_bytes
    }

    fn flags(&self) -> u16 {
        self.info.flags
    }

    fn has(&self, f: u16) -> bool {
        self.info.flags & f != 0
    }

    async fn flush(&self) -> Result<()> {
        let completed = self.completed.load(Ordering::Acquire);
        if completed == self.flushed.load(Ordering::Acquire) {
            return Ok(()); // no write completed since the last flush
        }
        let covered = self.log.lock().next_seq;
        if self.has(TFLAG_SEND_FLUSH) {
            self.request(CMD_FLUSH, 0, 0, 0, None).await?;
        }
        self.flushed.fetch_max(completed, Ordering::AcqRel);
        let mut log = self.log.lock();
        while log.entries.front().is_some_and(|e| e.seq < covered) {
            let e = log.entries.pop_front().unwrap();
            log.bytes -= e.data.map_or(0, |d| d.len() as u64);
        }
        Ok(())
    }

    /// Largest piece of one request: the server's maximum, rounded down to its minimum.
    fn max_piece(&self) -> u64 {
        let (min, _, max) = self.info.block;
        (max as u64 / min as u64 * min as u64).max(min as u64)
    }

    fn min(&self) -> u64 {
        self.info.block.0 as u64
    }

    fn aligned(&self, offset: u64, len: u64) -> bool {
        offset.is_multiple_of(self.min()) && len.is_multiple_of(self.min())
    }

    /// The aligned range around `[offset, offset+len)`: `(start, end)`.
    fn widen(&self, offset: u64, len: u64) -> (u64, u64) {
        let min = self.min();
        (offset / min * min, (offset + len).div_ceil(min) * min)
    }

    /// The aligned range inside `[offset, offset+len)`: `(start, end)`, `start >= end` when
    /// there is none.
    fn shrink(&self, offset: u64, len: u64) -> (u64, u64) {
        let min = self.min();
        (offset.div_ceil(min) * min, (offset + len) / min * min)
    }

    fn writable(&self) -> Result<()> {
        if self.has(TFLAG_READ_ONLY) {
            return Err(Error::new(ErrorKind::ReadOnly, format!("{}: the export is read-only", self.spec.uri())));
        }
        Ok(())
    }

    fn no_fast_zero(&self) -> Error {
        Error::new(ErrorKind::Unsupported, format!("{}: no fast zeroing", self.spec.uri()))
    }

    /// Reads `[offset, offset+len)` into `out`, aligned and no larger than the maximum.
    async fn read_piece(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let done = self.request(CMD_READ, 0, offset, out.len() as u32, None).await?;
        out.copy_from_slice(&done.buf.expect("a read returns its buffer")[..]);
        Ok(())
    }

    /// Reads any range: split to the maximum and widened to the minimum.
    async fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let len = out.len() as u64;
        if !self.aligned(offset, len) {
            let (start, end) = self.widen(offset, len);
            let mut wide = vec![0u8; (end - start) as usize];
            Box::pin(self.read_into(start, &mut wide)).await?;
            let at = (offset - start) as usize;
            out.copy_from_slice(&wide[at..at + out.len()]);
            return Ok(());
        }
        let piece = self.max_piece() as usize;
        let pieces =
            out.chunks_mut(piece).enumerate().map(|(i, chunk)| self.read_piece(offset + (i * piece) as u64, chunk));
        futures::future::try_join_all(pieces).await?;
        Ok(())
    }

    async fn write_from(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let len = data.len() as u64;
        if self.aligned(offset, len) {
            let _shared = self.rmw.read().await;
            return self.write_aligned(offset, data, fua).await;
        }
        // Read-modify-write of the aligned range around it.
        let _alone = self.rmw.write().await;
        let (start, end) = self.widen(offset, len);
        let mut wide = vec![0u8; (end - start) as usize];
        self.read_into(start, &mut wide).await?;
        let at = (offset - start) as usize;
        wide[at..at + data.len()].copy_from_slice(data);
        self.write_aligned(start, &wide, fua).await
    }

    async fn write_aligned(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let fua_wire = fua && self.has(TFLAG_SEND_FUA);
        let flags = if fua_wire { CMD_FLAG_FUA } else { 0 };
        let piece = self.max_piece() as usize;
        let pieces = data.chunks(piece).enumerate().map(|(i, chunk)| async move {
            let at = offset + (i * piece) as u64;
            self.request(CMD_WRITE, flags, at, chunk.len() as u32, Some(chunk)).await?;
            self.bytes_written.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            // A FUA write is logged too, though durable: a replay of an older write to the
            // same blocks must be followed by it, never left over it.
            Ok::<bool, Error>(self.logged(at, Some(chunk), chunk.len() as u64))
        });
        let over = futures::future::try_join_all(pieces).await?.into_iter().any(|o| o);
        if (fua && !fua_wire) || over {
            self.flush().await?;
        }
        Ok(())
    }

    /// Runs `cmd` (TRIM or WRITE_ZEROES) over `[offset, offset+len)` in pieces of at most
    /// 1 GiB (the length field is 32 bits).
    async fn ranged(&self, cmd: u16, flags: u16, offset: u64, len: u64) -> Result<()> {
        let _shared = self.rmw.read().await;
        let piece = (1u64 << 30).max(self.min());
        let mut at = offset;
        while at < offset + len {
            let n = piece.min(offset + len - at);
            self.request(cmd, flags, at, n as u32, None).await?;
            if cmd == CMD_WRITE_ZEROES && self.logged(at, None, n) {
                self.flush().await?;
            }
            at += n;
        }
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        if !self.has(TFLAG_SEND_WRITE_ZEROES) || !self.aligned(offset, len) {
            if flags.fast_only {
                return Err(self.no_fast_zero());
            }
            if !self.has(TFLAG_SEND_WRITE_ZEROES) {
                // Emulated: zeroes written in pieces of up to 1 MiB.
                let zero = vec![0u8; (1 << 20).min(len as usize)];
                let mut at = offset;
                while at < offset + len {
                    let n = (zero.len() as u64).min(offset + len - at) as usize;
                    self.write_from(at, &zero[..n], false).await?;
                    at += n as u64;
                }
                return Ok(());
            }
            // Unaligned edges as data, the aligned middle as a command.
            let (start, end) = self.shrink(offset, len);
            if start >= end {
                return self.write_from(offset, &vec![0u8; len as usize], false).await;
            }
            self.write_from(offset, &vec![0u8; (start - offset) as usize], false).await?;
            self.write_from(end, &vec![0u8; (offset + len - end) as usize], false).await?;
            return Box::pin(self.write_zeroes(start, end - start, flags)).await;
        }
        if flags.fast_only && !self.has(TFLAG_SEND_FAST_ZERO) {
            return Err(self.no_fast_zero());
        }
        let mut f = if flags.may_unmap { 0 } else { CMD_FLAG_NO_HOLE };
        if flags.fast_only {
            f |= CMD_FLAG_FAST_ZERO;
        }
        self.ranged(CMD_WRITE_ZEROES, f, offset, len).await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if !self.has(TFLAG_SEND_TRIM) {
            return Ok(());
        }
        // Only the aligned middle: a trim is advisory.
        let (start, end) = self.shrink(offset, len);
        if start >= end {
            return Ok(());
        }
        self.ranged(CMD_TRIM, 0, start, end - start).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        if self.info.base_allocation.is_none() {
            return Ok(vec![Extent::data(len)]);
        }
        let (start, end) = self.widen(offset, len);
        let end = end.min(start + (1 << 30));
        let done = self.request(CMD_BLOCK_STATUS, 0, start, (end - start) as u32, None).await?;
        let mut extents = done.extents;
        // Start at `offset`: drop what lies before it.
        let mut skip = offset - start;
        while skip > 0 && !extents.is_empty() {
            if extents[0].len <= skip {
                skip -= extents.remove(0).len;
            } else {
                extents[0].len -= skip;
                skip = 0;
            }
        }
        extents.retain(|e| e.len > 0);
        if extents.is_empty() {
            return Err(eio(format!("{}: BLOCK_STATUS at {offset} answered no extent", self.spec.uri())));
        }
        Ok(extents)
    }
}

fn command_name(kind: u16) -> &'static str {
    match kind {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "request",
    }
}

impl BlockDev for RemoteDev {
    fn size(&self) -> u64 {
        self.inner.info.size
    }

    fn geometry(&self) -> Geometry {
        let i = &self.inner;
        let min = i.info.block.0.clamp(512, 65536).next_power_of_two();
        Geometry {
            min_block_bytes: min,
            preferred_block_bytes: i.info.block.1.max(min),
            rotational: i.has(TFLAG_ROTATIONAL),
            can_discard: i.has(TFLAG_SEND_TRIM),
            can_fast_zero: i.has(TFLAG_SEND_WRITE_ZEROES) && i.has(TFLAG_SEND_FAST_ZERO),
            read_only: i.has(TFLAG_READ_ONLY),
        }
    }

    fn describe(&self) -> String {
        format!("remote NBD export {}", self.inner.spec.uri())
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            check_range("read", offset, buf.len() as u64, self.size())?;
            let i = &self.inner;
            let len = buf.len() as u64;
            if len == 0 {
                return Ok(buf);
            }
            let out = if i.aligned(offset, len) && len <= i.max_piece() {
                let done = i.request_into(CMD_READ, 0, offset, len as u32, None, Some(buf)).await?;
                done.buf.expect("a read returns its buffer")
            } else {
                let mut buf = buf;
                i.read_into(offset, &mut buf).await?;
                buf
            };
            i.bytes_read.fetch_add(len, Ordering::Relaxed);
            Ok(out)
        })
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            check_range("write", offset, buf.len() as u64, self.size())?;
            self.inner.writable()?;
            if !buf.is_empty() {
                self.inner.write_from(offset, &buf, fua).await?;
            }
            Ok(buf)
        })
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.flush())
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            check_range("discard", offset, len, self.size())?;
            self.inner.writable()?;
            self.inner.discard(offset, len).await
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            check_range("write_zeroes", offset, len, self.size())?;
            self.inner.writable()?;
            if len == 0 {
                return Ok(());
            }
            self.inner.write_zeroes(offset, len, flags).await
        })
    }

    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        Box::pin(async move {
            check_range("block_status", offset, len, self.size())?;
            if len == 0 {
                return Ok(vec![]);
            }
            self.inner.block_status(offset, len).await
        })
    }

    fn cache(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            check_range("cache", offset, len, self.size())?;
            let i = &self.inner;
            if !i.has(TFLAG_SEND_CACHE) || len == 0 || len > u32::MAX as u64 || !i.aligned(offset, len) {
                return Ok(());
            }
            i.request(CMD_CACHE, 0, offset, len as u32, None).await.map(|_| ())
        })
    }

    fn status(&self) -> Option<serde_json::Value> {
        let i = &self.inner;
        let h = i.health.lock();
        let down_for = h.down_since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let live = i.live.load(Ordering::Acquire);
        Some(serde_json::json!({
            "origin": i.spec.uri(),
            "tls": i.spec.tls.is_some(),
            "tls_cipher": h.tls_cipher,
            "state": if live > 0 { "up" } else { "down" },
            "connections": i.slots.len(),
            "connections_up": live,
            "reconnects": h.reconnects,
            "outages": h.outages,
            "timeouts": h.timeouts,
            "retries": i.retries.load(Ordering::Relaxed),
            "down_for_seconds": down_for,
            "seconds_away": h.away.as_secs_f64() + down_for,
            "last_error": h.last_error,
            "unflushed_bytes": i.log.lock().bytes,
            "block_sizes": [i.info.block.0, i.info.block.1, i.info.block.2],
            "transmission_flags": i.flags(),
            "structured_replies": i.info.structured,
            "block_status": i.info.base_allocation.is_some(),
            "read_bytes": i.bytes_read.load(Ordering::Relaxed),
            "written_bytes": i.bytes_written.load(Ordering::Relaxed),
        }))
    }

    fn metrics(&self) -> Vec<Sample> {
        let i = &self.inner;
        let h = i.health.lock();
        let down_for = h.down_since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        use MetricKind::{Counter, Gauge};
        vec![
            Sample::new(
                "strata_remote_up",
                Gauge,
                "1 while at least one connection to the remote server is up",
                (i.live.load(Ordering::Acquire) > 0) as u64 as f64,
            ),
            Sample::new(
                "strata_remote_connections_up",
                Gauge,
                "Connections to the remote server that are up",
                i.live.load(Ordering::Acquire) as f64,
            ),
            Sample::new("strata_remote_reconnects_total", Counter, "Connections re-established", h.reconnects as f64),
            Sample::new("strata_remote_outages_total", Counter, "Times every connection was down", h.outages as f64),
            Sample::new("strata_remote_timeouts_total", Counter, "Request attempts that timed out", h.timeouts as f64),
            Sample::new(
                "strata_remote_retries_total",
                Counter,
                "Requests sent again after a lost connection or a timeout",
                i.retries.load(Ordering::Relaxed) as f64,
            ),
            Sample::new(
                "strata_remote_away_seconds_total",
                Counter,
                "Time with no connection to the remote server",
                h.away.as_secs_f64() + down_for,
            ),
            Sample::new(
                "strata_remote_read_bytes_total",
                Counter,
                "Bytes read from the remote server",
                i.bytes_read.load(Ordering::Relaxed) as f64,
            ),
            Sample::new(
                "strata_remote_written_bytes_total",
                Counter,
                "Bytes written to the remote server",
                i.bytes_written.load(Ordering::Relaxed) as f64,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_of(buf: Buf, filled: &[(u64, u64)]) -> std::result::Result<Done, Failure> {
        let (tx, mut rx) = oneshot::channel();
        let len = buf.len() as u32;
        let mut p = Pending {
            kind: CMD_READ,
            offset: 8192,
            len,
            buf: Some(buf),
            filled: filled.to_vec(),
            extents: vec![],
            error: None,
            done: Some(tx),
        };
        p.finish();
        rx.try_recv().unwrap()
    }

    /// A READ's buffer may hold an earlier request's bytes: a structured reply that leaves
    /// any of it unfilled (or fills some twice and some not) is an error, never an answer.
    #[test]
    fn a_read_reply_must_cover_its_whole_buffer() {
        let stale = || Buf::from_slice(&[0xAA; 8192]);
        assert!(read_of(stale(), &[(8192, 16384)]).is_ok());
        assert!(read_of(stale(), &[(12288, 16384), (8192, 12288)]).is_ok());
        for gaps in [
            &[][..],
            &[(8192, 12288)],
            &[(12288, 16384)],
            &[(8192, 12288), (8192, 12288)],
            &[(8192, 16384), (12288, 16384)],
        ] {
            match read_of(stale(), gaps) {
                Err(Failure::Server(e, msg)) => assert!(e == EIO && msg.contains("did not cover"), "{msg}"),
                _ => panic!("{gaps:?} taken as a whole reply"),
            }
        }
    }
}
