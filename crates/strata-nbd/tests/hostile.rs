//! Hostile-client tests, beyond the hand-written error paths of `protocol.rs`: hundreds of
//! seeded random streams after the greeting and after GO, a valid session cut at every byte,
//! clients that flood writes and never read a reply, and thousands of connections dropped
//! at every stage. Throughout, the server must never panic, every misbehaving connection
//! must close once its client stops sending (answering well-formed replies until then), and
//! a well-behaved client on another connection must keep working.
//!
//! The tests run on a multi-threaded runtime so the server's tasks run on tokio's worker
//! threads, where a panic hook can see them: tokio would otherwise swallow a panicking
//! connection task silently. The record of panics is shared by the whole file, so one
//! panic fails every test that checks after it: the first report names the culprit.

mod common;

use common::{assert_no_panics, watch_panics};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_io::mem::MemDev;
use strata_io::{BlockDev, BoxFut, Buf, Result as IoResult, ZeroFlags};
use strata_nbd::proto::*;
use strata_nbd::{Export, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

const SIZE: u64 = 1 << 20;
const INFLIGHT_MAX: usize = 8;
/// How long the server gets to close a connection whose client stopped sending.
const CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// splitmix64: enough randomness for seeded streams without another dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Up to `max - 1` random bytes.
    fn noise(&mut self, max: u64) -> Vec<u8> {
        let n = self.below(max) as usize;
        self.bytes(n)
    }
}

/// A RAM device whose writes wait until the test opens the gate: requests that stay in
/// flight for as long as a test needs.
struct Stuck {
    mem: MemDev,
    gate: Semaphore,
}

impl BlockDev for Stuck {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn describe(&self) -> String {
        "stuck".into()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, IoResult<Buf>> {
        self.mem.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, IoResult<Buf>> {
        Box::pin(async move {
            self.gate.acquire().await.expect("gate never closed").forget();
            self.mem.write(offset, buf, fua).await
        })
    }
    fn flush(&self) -> BoxFut<'_, IoResult<()>> {
        self.mem.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, IoResult<()>> {
        self.mem.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, IoResult<()>> {
        self.mem.write_zeroes(offset, len, flags)
    }
}

/// A server with a RAM export `mem` and an export `stuck` whose writes wait for its gate.
fn server() -> (Server, Arc<Stuck>) {
    server_with(Limits { max_inflight_per_connection: INFLIGHT_MAX, ..Limits::default() })
}

fn server_with(limits: Limits) -> (Server, Arc<Stuck>) {
    watch_panics();
    let stuck = Arc::new(Stuck { mem: MemDev::new(SIZE), gate: Semaphore::new(0) });
    let exports = vec![
        Export { name: "mem".into(), description: "test".into(), dev: Arc::new(MemDev::new(SIZE)), read_only: false },
        Export { name: "stuck".into(), description: String::new(), dev: stuck.clone(), read_only: false },
    ];
    (Server::new(exports, limits).unwrap(), stuck)
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(CLOSE_WITHIN, f).await.unwrap_or_else(|_| panic!("{what}: timed out"))
}

fn connect(s: &Server) -> UnixStream {
    let (a, b) = UnixStream::pair().unwrap();
    s.spawn_connection(b);
    a
}

fn opt(code: u32, data: &[u8]) -> Vec<u8> {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&code.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn go_data(export: &str, reqs: &[u16]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
    for r in reqs {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

fn meta_data(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

fn request(kind: u16, flags: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    Request { flags, kind, cookie, offset, length }.encode().to_vec()
}

const CLIENT_FLAGS: u32 = CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES;

async fn greet(c: &mut UnixStream) {
    let mut g = [0u8; 18];
    within("greeting", c.read_exact(&mut g)).await.unwrap();
    assert_eq!(g[..8], NBDMAGIC.to_be_bytes());
    c.write_all(&CLIENT_FLAGS.to_be_bytes()).await.unwrap();
}

/// Reads option replies up to the final one; returns its type.
async fn opt_replies(c: &mut UnixStream) -> u32 {
    loop {
        let mut h = [0u8; 20];
        within("option reply", c.read_exact(&mut h)).await.unwrap();
        assert_eq!(h[..8], OPT_REPLY_MAGIC.to_be_bytes());
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        within("option reply data", c.read_exact(&mut data)).await.unwrap();
        if kind == REP_ACK || kind & (1 << 31) != 0 {
            return kind;
        }
    }
}

/// Greets and enters transmission on `export`, with structured replies and base:allocation
/// if asked.
async fn negotiated(s: &Server, export: &str, structured: bool) -> UnixStream {
    let mut c = connect(s);
    greet(&mut c).await;
    if structured {
        c.write_all(&opt(OPT_STRUCTURED_REPLY, &[])).await.unwrap();
        assert_eq!(opt_replies(&mut c).await, REP_ACK);
        c.write_all(&opt(OPT_SET_META_CONTEXT, &meta_data(export, &[BASE_ALLOCATION]))).await.unwrap();
        assert_eq!(opt_replies(&mut c).await, REP_ACK);
    }
    c.write_all(&opt(OPT_GO, &go_data(export, &[]))).await.unwrap();
    assert_eq!(opt_replies(&mut c).await, REP_ACK);
    c
}

/// Sends `bytes`, closes the sending side, and collects what the server says until it
/// closes. Errs if it does not close in time.
async fn session(c: UnixStream, bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    let (mut rd, mut wr) = c.into_split();
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        let _ = rd.read_to_end(&mut out).await; // a reset is a close too
        out
    });
    // The server may hang up before taking everything: a failed write is an answer too.
    let _ = wr.write_all(&bytes).await;
    let _ = wr.shutdown().await;
    match tokio::time::timeout(CLOSE_WITHIN, reader).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("reader task failed: {e}")),
        Err(_) => Err(format!("the server kept the connection open {CLOSE_WITHIN:?} after the client stopped sending")),
    }
}

/// A simple client on `mem` that must work whatever the others do.
async fn good_client_round(c: &mut UnixStream, round: u64) {
    let offset = (round * 8192) % (SIZE - 8192);
    let data: Vec<u8> = (0..4096u64).map(|i| (i ^ round) as u8).collect();
    let mut b = request(CMD_WRITE, 0, round * 3, offset, 4096);
    b.extend_from_slice(&data);
    b.extend_from_slice(&request(CMD_READ, 0, round * 3 + 1, offset, 4096));
    b.extend_from_slice(&request(CMD_FLUSH, 0, round * 3 + 2, 0, 0));
    within("good client send", c.write_all(&b)).await.unwrap();
    let mut replies = HashMap::new();
    for _ in 0..3 {
        let mut h = [0u8; 16];
        within("good client reply", c.read_exact(&mut h)).await.unwrap();
        assert_eq!(h[..4], SIMPLE_REPLY_MAGIC.to_be_bytes());
        let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        assert_eq!(err, 0, "good client request {cookie} failed");
        if cookie == round * 3 + 1 {
            let mut got = vec![0u8; 4096];
            within("good client data", c.read_exact(&mut got)).await.unwrap();
            replies.insert(cookie, got);
        } else {
            replies.insert(cookie, Vec::new());
        }
    }
    assert_eq!(replies[&(round * 3 + 1)], data, "the good client reads back what it wrote");
}

async fn wait_live(s: &Server, want: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while s.live_connections() != want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.live_connections(), want, "connections still open");
}

/// Random requests, mostly well framed: random commands, flags, offsets and lengths, write
/// payloads as declared. Returns the bytes and, per cookie, the command and length sent.
fn random_requests(rng: &mut Rng) -> (Vec<u8>, HashMap<u64, (u16, u32)>) {
    let mut out = Vec::new();
    let mut sent = HashMap::new();
    for cookie in 0..1 + rng.below(40) {
        let kind = match rng.below(20) {
            0..=4 => CMD_READ,
            5..=9 => CMD_WRITE,
            10 => CMD_FLUSH,
            11 => CMD_TRIM,
            12 => CMD_CACHE,
            13 => CMD_WRITE_ZEROES,
            14 => CMD_BLOCK_STATUS,
            15 if rng.chance(20) => CMD_DISC,
            _ => rng.next() as u16,
        };
        let flags = if rng.chance(90) { rng.below(32) as u16 } else { rng.next() as u16 };
        let offset = match rng.below(10) {
            0 => rng.next(),
            1 => SIZE - rng.below(8192),
            _ => rng.below(2 * SIZE / 512) * 512,
        };
        let length = match rng.below(20) {
            0 => 0,
            1 => rng.next() as u32,
            2 => 40 << 20,
            _ => 1 + rng.below(8192) as u32,
        };
        let magic_ok = rng.chance(97);
        let mut head = request(kind, flags, cookie, offset, length);
        if !magic_ok {
            head[..4].copy_from_slice(&rng.bytes(4));
        }
        out.extend_from_slice(&head);
        sent.insert(cookie, (kind, length));
        if kind == CMD_WRITE {
            if length > 16 << 10 {
                // Too long to send: the stream ends inside the payload.
                out.extend(rng.noise(4096));
                break;
            }
            out.extend(rng.bytes(length as usize));
        }
        if !magic_ok || kind == CMD_DISC {
            break;
        }
    }
    (out, sent)
}

/// Checks that `out` is a sequence of well-formed replies, each answering a request that
/// was sent, each request answered at most once.
fn check_replies(out: &[u8], sent: &HashMap<u64, (u16, u32)>, structured: bool) -> Result<usize, String> {
    let mut at = 0;
    let mut done = HashSet::new();
    let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
        let s = out.get(*at..*at + n).ok_or_else(|| format!("reply cut short at byte {}", *at))?;
        *at += n;
        Ok(s)
    };
    while at < out.len() {
        let magic = u32::from_be_bytes(take(&mut at, 4)?.try_into().unwrap());
        let (cookie, last, data) = if magic == SIMPLE_REPLY_MAGIC {
            let err = u32::from_be_bytes(take(&mut at, 4)?.try_into().unwrap());
            let cookie = u64::from_be_bytes(take(&mut at, 8)?.try_into().unwrap());
            let &(kind, len) = sent.get(&cookie).ok_or(format!("reply to unknown cookie {cookie}"))?;
            let data = if kind == CMD_READ && err == 0 && !structured { len as usize } else { 0 };
            (cookie, true, data)
        } else if magic == STRUCTURED_REPLY_MAGIC && structured {
            let flags = u16::from_be_bytes(take(&mut at, 2)?.try_into().unwrap());
            let _kind = take(&mut at, 2)?;
            let cookie = u64::from_be_bytes(take(&mut at, 8)?.try_into().unwrap());
            let len = u32::from_be_bytes(take(&mut at, 4)?.try_into().unwrap());
            sent.get(&cookie).ok_or(format!("chunk for unknown cookie {cookie}"))?;
            (cookie, flags & REPLY_FLAG_DONE != 0, len as usize)
        } else {
            return Err(format!("bad reply magic {magic:#x} at byte {}", at - 4));
        };
        take(&mut at, data)?;
        if done.contains(&cookie) {
            return Err(format!("cookie {cookie} answered after its final reply"));
        }
        if last {
            done.insert(cookie);
        }
    }
    Ok(done.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_streams_never_hurt_the_server() {
    let (s, _stuck) = server();
    let mut good = negotiated(&s, "mem", false).await;
    good_client_round(&mut good, 0).await;
    const PER_KIND: u64 = 100;
    let mut answered = 0;
    for kind in 0..5u64 {
        let mut set = JoinSet::new();
        for i in 0..PER_KIND {
            let seed = kind * 1_000_000 + i;
            let s = s.clone();
            set.spawn(async move {
                let mut rng = Rng(seed);
                let (c, bytes, check) = match kind {
                    // Noise right after the greeting.
                    0 => {
                        let mut c = connect(&s);
                        let mut g = [0u8; 18];
                        within("greeting", c.read_exact(&mut g)).await.unwrap();
                        (c, rng.noise(1024), None)
                    }
                    // Valid flags, then option-shaped noise.
                    1 => {
                        let mut c = connect(&s);
                        greet(&mut c).await;
                        let mut b = Vec::new();
                        for _ in 0..1 + rng.below(8) {
                            let code = if rng.chance(80) { rng.below(13) as u32 } else { rng.next() as u32 };
                            let data = match rng.below(4) {
                                0 => {
                                    let name = ["", "mem", "stuck", "nope"][rng.below(4) as usize];
                                    go_data(name, &[rng.below(5) as u16])
                                }
                                1 => meta_data("mem", &[BASE_ALLOCATION, "base:", "x"][..rng.below(4) as usize]),
                                _ => rng.noise(64),
                            };
                            let mut o = opt(code, &data);
                            if rng.chance(10) {
                                let cut = rng.below(o.len() as u64) as usize;
                                o[cut] ^= 1 << rng.below(8); // a flipped bit somewhere
                            }
                            b.extend(o);
                        }
                        (c, b, None)
                    }
                    // Noise after GO, mostly starting with a valid request magic.
                    2 => {
                        let c = negotiated(&s, "mem", false).await;
                        let mut b = if rng.chance(70) { REQUEST_MAGIC.to_be_bytes().to_vec() } else { Vec::new() };
                        b.extend(rng.noise(1024));
                        (c, b, None)
                    }
                    // Request-shaped noise, simple and structured replies: the answers must
                    // stay well framed.
                    _ => {
                        let structured = kind == 4;
                        let c = negotiated(&s, "mem", structured).await;
                        let (b, sent) = random_requests(&mut rng);
                        (c, b, Some((sent, structured)))
                    }
                };
                let out = session(c, bytes).await.unwrap_or_else(|e| panic!("stream kind {kind} seed {seed}: {e}"));
                match check {
                    Some((sent, structured)) => check_replies(&out, &sent, structured)
                        .unwrap_or_else(|e| panic!("stream kind {kind} seed {seed}: {e}")),
                    None => 0,
                }
            });
        }
        while let Some(r) = set.join_next().await {
            answered += r.unwrap();
        }
        good_client_round(&mut good, kind + 1).await;
    }
    assert!(answered > 500, "the request-shaped streams got only {answered} answers: they test little");
    wait_live(&s, 1).await;
    drop(good);
    wait_live(&s, 0).await;
    assert_no_panics("the server");
}

/// What a well-behaved client sends after the greeting: its flags, a few options, GO on
/// `fuzz` or on the read-only `ro` (now and then EXPORT_NAME or ABORT instead), then
/// requests of every kind within the export, write payloads as declared.
fn valid_session(rng: &mut Rng) -> Vec<u8> {
    let mut b = (CLIENT_FIXED_NEWSTYLE | if rng.chance(50) { CLIENT_NO_ZEROES } else { 0 }).to_be_bytes().to_vec();
    let export = if rng.chance(25) { "ro" } else { "fuzz" };
    let go = go_data(export, &[INFO_BLOCK_SIZE]);
    let meta = meta_data(export, &[BASE_ALLOCATION]);
    for _ in 0..rng.below(4) {
        b.extend(match rng.below(5) {
            0 => opt(OPT_LIST, &[]),
            1 => opt(OPT_INFO, &go),
            2 => opt(OPT_STRUCTURED_REPLY, &[]),
            3 => opt(OPT_LIST_META_CONTEXT, &meta),
            _ => opt(OPT_STARTTLS, &[]),
        });
    }
    if rng.chance(50) {
        b.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        b.extend(opt(OPT_SET_META_CONTEXT, &meta));
    }
    b.extend(match rng.below(8) {
        0 => opt(OPT_EXPORT_NAME, export.as_bytes()),
        1 => opt(OPT_ABORT, &[]),
        _ => opt(OPT_GO, &go),
    });
    let kinds = [CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS];
    let all_flags = [0, CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLAG_DF, CMD_FLAG_REQ_ONE, CMD_FLAG_FAST_ZERO];
    for cookie in 0..rng.below(12) {
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let length = if matches!(kind, CMD_FLUSH | CMD_DISC) { 0 } else { (1 + rng.below(16) as u32) * 512 };
        let offset = rng.below((SIZE - length as u64) / 512 + 1) * 512;
        b.extend(request(kind, all_flags[rng.below(all_flags.len() as u64) as usize], cookie, offset, length));
        if kind == CMD_WRITE {
            b.extend(rng.bytes(length as usize));
        }
        if kind == CMD_DISC {
            break;
        }
    }
    b
}

/// `b` with one to four mutations: a bit flipped, a byte replaced, a 2-, 4- or 8-byte field
/// set to a boundary value, the stream cut, a piece of it repeated elsewhere or taken out.
fn mutated(rng: &mut Rng, mut b: Vec<u8>) -> Vec<u8> {
    const BOUNDS: [u64; 9] = [0, 1, 511, 4096, SIZE - 1, SIZE, 0x7fff_ffff, u32::MAX as u64, u64::MAX];
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            break;
        }
        let at = rng.below(b.len() as u64) as usize;
        let piece = at..(at + 1 + rng.below(63) as usize).min(b.len());
        match rng.below(6) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next() as u8,
            2 => {
                let value = BOUNDS[rng.below(BOUNDS.len() as u64) as usize].to_be_bytes();
                let width = [2, 4, 8][rng.below(3) as usize];
                for (byte, v) in b[at..].iter_mut().zip(&value[8 - width..]) {
                    *byte = *v;
                }
            }
            3 => b.truncate(at),
            4 => {
                let copy = b[piece].to_vec();
                let to = rng.below(b.len() as u64 + 1) as usize;
                b.splice(to..to, copy);
            }
            _ => {
                b.drain(piece);
            }
        }
    }
    b
}

/// Valid sessions mutated (so that they go deeper into the handshake and the requests than
/// noise does) on exports beside the good client's: each connection must close once its
/// client stops sending, and none may write to the read-only export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_sessions_close_and_leave_the_read_only_export_unwritten() {
    watch_panics();
    let ro = Arc::new(MemDev::new(SIZE));
    let exports = vec![
        Export { name: "mem".into(), description: String::new(), dev: Arc::new(MemDev::new(SIZE)), read_only: false },
        Export { name: "fuzz".into(), description: String::new(), dev: Arc::new(MemDev::new(SIZE)), read_only: false },
        Export { name: "ro".into(), description: String::new(), dev: ro.clone(), read_only: true },
    ];
    let s = Server::new(exports, Limits::default()).unwrap();
    let mut good = negotiated(&s, "mem", false).await;
    for round in 0..40 {
        let mut set = JoinSet::new();
        for i in 0..200 {
            let seed = round * 1_000 + i;
            let s = s.clone();
            set.spawn(async move {
                let mut rng = Rng(seed);
                let valid = valid_session(&mut rng);
                let bytes = mutated(&mut rng, valid);
                let mut c = connect(&s);
                let mut g = [0u8; 18];
                within("greeting", c.read_exact(&mut g)).await.unwrap();
                session(c, bytes).await.unwrap_or_else(|e| panic!("mutated session {seed}: {e}"));
            });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
        good_client_round(&mut good, round + 1).await;
    }
    wait_live(&s, 1).await;
    let written = ro.read(0, Buf::zeroed(SIZE as usize)).await.unwrap();
    assert!(written.iter().all(|&x| x == 0), "the read-only export was written");
    assert_no_panics("the server");
}

/// Frames of a valid session: (client bytes, description).
fn session_frames(structured: bool) -> Vec<(Vec<u8>, &'static str)> {
    let payload: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut frames = vec![(CLIENT_FLAGS.to_be_bytes().to_vec(), "client flags")];
    if structured {
        frames.push((opt(OPT_STRUCTURED_REPLY, &[]), "STRUCTURED_REPLY"));
        frames.push((opt(OPT_SET_META_CONTEXT, &meta_data("mem", &[BASE_ALLOCATION])), "SET_META_CONTEXT"));
    }
    frames.push((opt(OPT_GO, &go_data("mem", &[INFO_NAME])), "GO"));
    let mut write = request(CMD_WRITE, CMD_FLAG_FUA, 1, 4096, payload.len() as u32);
    write.extend_from_slice(&payload);
    frames.push((write, "WRITE"));
    let read_flags = if structured { CMD_FLAG_DF } else { 0 };
    frames.push((request(CMD_READ, read_flags, 2, 4096, payload.len() as u32), "READ"));
    if structured {
        frames.push((request(CMD_BLOCK_STATUS, 0, 3, 0, SIZE as u32), "BLOCK_STATUS"));
    }
    frames.push((request(CMD_FLUSH, 0, 4, 0, 0), "FLUSH"));
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_at_every_byte_answers_exactly_its_whole_frames() {
    let (s, _stuck) = server();
    let mut good = negotiated(&s, "mem", false).await;
    for structured in [false, true] {
        let frames = session_frames(structured);
        // What the server says to the first k whole frames, then end of stream.
        let mut expected = Vec::new();
        for k in 0..=frames.len() {
            let bytes: Vec<u8> = frames[..k].iter().flat_map(|f| f.0.clone()).collect();
            expected.push(session(connect(&s), bytes).await.unwrap());
        }
        let full = expected.last().unwrap();
        let payload = &frames.iter().find(|f| f.1 == "WRITE").unwrap().0[28..];
        assert!(full.windows(payload.len()).any(|w| w == payload), "the full session reads its write back");
        // The client flags get no answer; every later frame gets one.
        assert_eq!(expected[0], expected[1]);
        assert!(expected[1..].windows(2).all(|w| w[1].len() > w[0].len()), "every frame after the flags is answered");

        let all: Vec<u8> = frames.iter().flat_map(|f| f.0.clone()).collect();
        let ends: Vec<usize> = frames
            .iter()
            .scan(0, |end, f| {
                *end += f.0.len();
                Some(*end)
            })
            .collect();
        let mut cuts = JoinSet::new();
        for n in 0..=all.len() {
            let whole = ends.iter().filter(|&&e| e <= n).count();
            let (s, bytes, want) = (s.clone(), all[..n].to_vec(), expected[whole].clone());
            let cut_in = frames.get(whole).map_or("nothing", |f| f.1);
            cuts.spawn(async move {
                let at = format!("cut at byte {n} (in {cut_in})");
                let got = session(connect(&s), bytes).await.unwrap_or_else(|e| panic!("{at}: {e}"));
                assert!(got == want, "{at}: {} bytes of replies, want {}", got.len(), want.len());
            });
            if cuts.len() >= 32 {
                cuts.join_next().await.unwrap().unwrap();
            }
        }
        while let Some(r) = cuts.join_next().await {
            r.unwrap();
        }
        good_client_round(&mut good, structured as u64).await;
    }
    wait_live(&s, 1).await;
    assert_no_panics("the server");
}

/// Samples a byte counter until it has not moved for a second (long enough that a busy
/// machine does not fake a stall); returns where it stopped.
async fn stalled_at(sent: &AtomicU64) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = u64::MAX;
    let mut still = 0;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = sent.load(Ordering::Acquire);
        still = if now == last { still + 1 } else { 0 };
        if still >= 20 {
            return now;
        }
        last = now;
    }
    panic!("the flood never stalled: {} bytes accepted", sent.load(Ordering::Acquire));
}

/// Floods `count` write requests of `len` bytes and never reads a reply; returns the task
/// (which hands back both halves, so the connection lives on) and the bytes sent so far.
fn flood(c: UnixStream, count: u64, len: u32) -> (tokio::task::JoinHandle<UnixStream>, Arc<AtomicU64>) {
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let task = tokio::spawn(async move {
        let mut c = c;
        let payload = vec![0x5A; len as usize];
        for cookie in 0..count {
            let mut b = request(CMD_WRITE, 0, cookie, (cookie * len as u64) % (SIZE - len as u64), len);
            b.extend_from_slice(&payload);
            if c.write_all(&b).await.is_err() {
                break;
            }
            counter.fetch_add(b.len() as u64, Ordering::AcqRel);
        }
        c
    });
    (task, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_flood_on_a_stuck_device_stops_at_the_inflight_limit() {
    let (s, stuck) = server();
    let mut good = negotiated(&s, "mem", false).await;
    let mut neighbour = negotiated(&s, "stuck", false).await; // same export, other connection
    const LEN: u32 = 64 << 10;
    const COUNT: u64 = 2000; // 128 MiB if the server took it all
    let (flooder, sent) = flood(negotiated(&s, "stuck", false).await, COUNT, LEN);
    let at = stalled_at(&sent).await;
    assert!(!flooder.is_finished(), "the server took all {COUNT} writes");
    // The server holds at most INFLIGHT_MAX requests and its 64 KiB read buffer; the rest
    // sits in the socket (a few hundred KiB on Linux).
    let request_bytes = LEN as u64 + 28;
    let bound = INFLIGHT_MAX as u64 * request_bytes + (64 << 10) + (2 << 20);
    assert!(at >= INFLIGHT_MAX as u64 * request_bytes, "stalled after only {at} bytes");
    assert!(at <= bound, "accepted {at} bytes with {INFLIGHT_MAX} requests in flight (bound {bound})");

    // Others are unaffected: another export, and reads on the same one.
    good_client_round(&mut good, 1).await;
    neighbour.write_all(&request(CMD_READ, 0, 9, 0, 4096)).await.unwrap();
    let mut h = [0u8; 16];
    within("neighbour read", neighbour.read_exact(&mut h)).await.unwrap();
    let (err, cookie) =
        (u32::from_be_bytes(h[4..8].try_into().unwrap()), u64::from_be_bytes(h[8..16].try_into().unwrap()));
    assert_eq!((err, cookie), (0, 9));
    let mut data = vec![0u8; 4096];
    within("neighbour data", neighbour.read_exact(&mut data)).await.unwrap();

    // Open the gate: the flood moves again, until unread replies stall it once more.
    stuck.gate.add_permits(1 << 20);
    let again = stalled_at(&sent).await;
    assert!(again > at, "the flood did not resume once the device answered");
    flooder.abort();
    let _ = flooder.await; // dropping the task drops the connection
    drop(neighbour);
    wait_live(&s, 1).await;
    good_client_round(&mut good, 2).await;
    assert_no_panics("the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_replies_stalls_only_itself() {
    let (s, _stuck) = server();
    let mut good = negotiated(&s, "mem", false).await;
    const COUNT: u64 = 400_000;
    let (flooder, sent) = flood(negotiated(&s, "mem", false).await, COUNT, 512);
    // Replies pile up in the socket and the server's write buffer until writing blocks;
    // then requests hold their in-flight permits and the server stops reading.
    let at = stalled_at(&sent).await;
    assert!(!flooder.is_finished(), "the server took all {COUNT} writes without its replies being read");
    for round in 0..5 {
        good_client_round(&mut good, round).await;
    }
    assert_eq!(sent.load(Ordering::Acquire), at, "the flood stays stalled");
    flooder.abort();
    let _ = flooder.await;
    wait_live(&s, 1).await;
    drop(good);
    wait_live(&s, 0).await;
    assert_no_panics("the server");
}

/// Reads of `len` bytes at 0, `count` of them, sent and never answered by reading: the
/// replies fill the socket, and the server holds the rest.
async fn unread_reads(c: &mut UnixStream, count: u64, len: u32) {
    let b: Vec<u8> = (0..count).flat_map(|cookie| request(CMD_READ, 0, cookie, 0, len)).collect();
    within("sending reads", c.write_all(&b)).await.unwrap();
}

/// Limits small enough to reach in a test: a 1 MiB payload budget, requests of 128 KiB.
fn small_budget() -> Limits {
    Limits {
        max_inflight_per_connection: INFLIGHT_MAX,
        max_request_bytes: 128 << 10,
        buffer_budget_bytes: 1 << 20,
        connection_budget_bytes: 256 << 10,
        ..Limits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_no_replies_holds_only_its_share_of_the_buffers() {
    // Its 8 requests in flight would hold the whole budget: its share holds 2.
    let (s, _stuck) = server_with(small_budget());
    let mut good = negotiated(&s, "mem", false).await;
    let mut hog = negotiated(&s, "mem", false).await;
    unread_reads(&mut hog, 64, 128 << 10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for round in 0..3 {
        good_client_round(&mut good, round).await;
    }
    drop(hog);
    assert_no_panics("the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_clients_are_closed_and_free_what_they_held() {
    let (s, _stuck) = server_with(Limits { stall_timeout: Duration::from_millis(300), ..small_budget() });
    let mut good = negotiated(&s, "mem", false).await;
    let mut reads = negotiated(&s, "mem", false).await;
    unread_reads(&mut reads, 64, 128 << 10).await;
    // A write's header and a little of its payload, then nothing.
    let mut write = negotiated(&s, "mem", false).await;
    let mut b = request(CMD_WRITE, 0, 1, 0, 128 << 10);
    b.extend_from_slice(&[7u8; 100]);
    within("sending a write header", write.write_all(&b)).await.unwrap();
    wait_live(&s, 1).await;
    good_client_round(&mut good, 0).await;
    // Each found its connection closed, after what the socket still held.
    let mut rest = Vec::new();
    within("the write's connection closing", write.read_to_end(&mut rest)).await.unwrap();
    assert!(rest.is_empty(), "the half-sent write was answered: {} bytes", rest.len());
    within("the reader's connection closing", reads.read_to_end(&mut rest)).await.unwrap();
    assert_no_panics("the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_a_client_that_reads_no_replies_after_a_grace() {
    let (s, _stuck) = server_with(Limits { closing_grace: Duration::from_millis(300), ..small_budget() });
    let mut hog = negotiated(&s, "mem", false).await;
    unread_reads(&mut hog, 64, 128 << 10).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.shutdown();
    within("shutdown", s.wait_idle()).await;
    drop(hog);
    assert_no_panics("the server");
}

/// How far a connection gets before its client vanishes.
#[derive(Debug, Clone, Copy)]
enum Stage {
    Connected,
    Greeted,
    FlagsSent,
    HalfOptionHeader,
    ListUnread,
    Negotiated,
    HalfRequestHeader,
    HalfWritePayload,
    BigReadUnread,
    HalfClosedWithWriteStuck,
}

const STAGES: [Stage; 10] = [
    Stage::Connected,
    Stage::Greeted,
    Stage::FlagsSent,
    Stage::HalfOptionHeader,
    Stage::ListUnread,
    Stage::Negotiated,
    Stage::HalfRequestHeader,
    Stage::HalfWritePayload,
    Stage::BigReadUnread,
    Stage::HalfClosedWithWriteStuck,
];

async fn reach(s: &Server, stage: Stage) -> UnixStream {
    let mut c = connect(s);
    match stage {
        Stage::Connected => return c,
        Stage::Greeted => {
            let mut g = [0u8; 18];
            within("greeting", c.read_exact(&mut g)).await.unwrap();
            return c;
        }
        _ => greet(&mut c).await,
    }
    match stage {
        Stage::FlagsSent => return c,
        Stage::HalfOptionHeader => {
            c.write_all(&opt(OPT_GO, &go_data("mem", &[]))[..10]).await.unwrap();
            return c;
        }
        Stage::ListUnread => {
            c.write_all(&opt(OPT_LIST, &[])).await.unwrap();
            return c;
        }
        _ => {}
    }
    let export = if matches!(stage, Stage::HalfClosedWithWriteStuck) { "stuck" } else { "mem" };
    c.write_all(&opt(OPT_GO, &go_data(export, &[]))).await.unwrap();
    assert_eq!(opt_replies(&mut c).await, REP_ACK);
    match stage {
        Stage::HalfRequestHeader => c.write_all(&request(CMD_READ, 0, 1, 0, 512)[..13]).await.unwrap(),
        Stage::HalfWritePayload => {
            c.write_all(&request(CMD_WRITE, 0, 1, 0, 65536)).await.unwrap();
            c.write_all(&[7u8; 1000]).await.unwrap();
        }
        Stage::BigReadUnread => c.write_all(&request(CMD_READ, 0, 1, 0, SIZE as u32)).await.unwrap(),
        Stage::HalfClosedWithWriteStuck => {
            let mut b = request(CMD_WRITE, 0, 1, 0, 512);
            b.extend_from_slice(&[1u8; 512]);
            c.write_all(&b).await.unwrap();
            c.shutdown().await.unwrap(); // no more requests; the write is still in flight
        }
        _ => {}
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_connections_dropped_at_every_stage_all_close() {
    let (s, stuck) = server();
    const PER_STAGE: usize = 300;
    const HELD: usize = 250; // connections open at once, under the server's limit of 1024
    let mut total = 0;
    for stage in STAGES {
        let mut held = Vec::with_capacity(HELD);
        for i in 0..PER_STAGE {
            held.push(reach(&s, stage).await);
            if held.len() == HELD || i + 1 == PER_STAGE {
                total += held.len();
                held.clear(); // all vanish at once
            }
        }
    }
    assert_eq!(total, STAGES.len() * PER_STAGE);
    // The half-closed connections wait for their stuck writes; then they close too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(s.live_connections() >= PER_STAGE.min(HELD), "connections with writes in flight wait for them");
    stuck.gate.add_permits(1 << 20);
    wait_live(&s, 0).await;
    let mut good = negotiated(&s, "mem", false).await;
    good_client_round(&mut good, 0).await;
    assert_no_panics("the server");
}
