//! Many requests in one socket write, on an O_DIRECT file whose io_uring completions the
//! runtime's reactor collects (as under `strata serve`): the connection parses every request
//! its buffer holds and starts them all before it waits. Every request must still get exactly
//! its own reply, a flush must come after every write acknowledged before it was sent, a
//! malformed request gets its error, and requests cut across socket reads are taken whole.
//! In a test binary of its own: the reaping runtime is process-wide.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use strata_io::file::{FileDev, FileOptions};
use strata_io::{BlockDev, BoxFut, Buf, Extent, Result as IoResult, ZeroFlags};
use strata_nbd::proto::*;
use strata_nbd::{Export, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const BLOCK: u64 = 4096;
const N: u64 = 48;

/// The file device, with the order in which writes completed and flushes started.
struct Recorder {
    dev: FileDev,
    clock: AtomicU64,
    /// Offset of each completed write and when it completed.
    writes: Mutex<Vec<(u64, u64)>>,
    flushes: Mutex<Vec<u64>>,
}

impl BlockDev for Recorder {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn describe(&self) -> String {
        "recorder".into()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, IoResult<Buf>> {
        self.dev.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, IoResult<Buf>> {
        Box::pin(async move {
            let r = self.dev.write(offset, buf, fua).await;
            self.writes.lock().unwrap().push((offset, self.clock.fetch_add(1, Ordering::SeqCst)));
            r
        })
    }
    fn flush(&self) -> BoxFut<'_, IoResult<()>> {
        self.flushes.lock().unwrap().push(self.clock.fetch_add(1, Ordering::SeqCst));
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, IoResult<()>> {
        self.dev.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, IoResult<()>> {
        self.dev.write_zeroes(offset, len, flags)
    }
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, IoResult<Vec<Extent>>> {
        self.dev.block_status(offset, len)
    }
}

fn pattern(block: u64) -> Vec<u8> {
    (0..BLOCK).map(|i| (block * 31 + i / 512) as u8 ^ 0xA5).collect()
}

fn request(b: &mut Vec<u8>, kind: u16, flags: u16, cookie: u64, offset: u64, length: u32) {
    b.extend_from_slice(&Request { flags, kind, cookie, offset, length }.encode());
}

async fn negotiate(s: &Server) -> UnixStream {
    let (mut c, theirs) = UnixStream::pair().unwrap();
    s.spawn_connection(theirs);
    assert_eq!(c.read_u64().await.unwrap(), NBDMAGIC);
    assert_eq!(c.read_u64().await.unwrap(), IHAVEOPT);
    c.read_u16().await.unwrap();
    c.write_u32(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).await.unwrap();
    let mut go = IHAVEOPT.to_be_bytes().to_vec();
    go.extend_from_slice(&OPT_GO.to_be_bytes());
    go.extend_from_slice(&(4 + 1 + 2u32).to_be_bytes());
    go.extend_from_slice(&1u32.to_be_bytes());
    go.extend_from_slice(b"f");
    go.extend_from_slice(&0u16.to_be_bytes());
    c.write_all(&go).await.unwrap();
    loop {
        assert_eq!(c.read_u64().await.unwrap(), OPT_REPLY_MAGIC);
        c.read_u32().await.unwrap();
        let kind = c.read_u32().await.unwrap();
        let mut data = vec![0; c.read_u32().await.unwrap() as usize];
        c.read_exact(&mut data).await.unwrap();
        if kind == REP_ACK {
            return c;
        }
        assert_eq!(kind, REP_INFO, "GO refused");
    }
}

/// Reads `n` simple replies: cookie -> (error, payload). `reads` are the READ cookies (their
/// replies carry a block).
async fn replies(c: &mut UnixStream, n: usize, reads: &[u64]) -> HashMap<u64, (u32, Option<Vec<u8>>)> {
    let mut got = HashMap::new();
    for _ in 0..n {
        let one = async {
            assert_eq!(c.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
            let err = c.read_u32().await.unwrap();
            let cookie = c.read_u64().await.unwrap();
            let mut data = None;
            if err == 0 && reads.contains(&cookie) {
                let mut b = vec![0; BLOCK as usize];
                c.read_exact(&mut b).await.unwrap();
                data = Some(b);
            }
            (cookie, err, data)
        };
        let (cookie, err, data) = tokio::time::timeout(Duration::from_secs(10), one).await.expect("a reply");
        assert!(got.insert(cookie, (err, data)).is_none(), "two replies for cookie {cookie}");
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_all_get_their_replies_in_order_with_flushes() {
    strata_io::engine::reap_on_current_runtime();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = FileOptions { create_size: Some(2 * N * BLOCK), ..Default::default() };
    let dev = FileDev::open(&dir.path().join("f"), &opts).unwrap();
    assert!(dev.is_direct(), "the test needs a file system that takes O_DIRECT");
    let rec = Arc::new(Recorder { dev, clock: AtomicU64::new(0), writes: Mutex::default(), flushes: Mutex::default() });
    let export = Export { name: "f".into(), description: String::new(), dev: rec.clone(), read_only: false };
    let s = Server::new(vec![export], Limits::default()).unwrap();
    let mut c = negotiate(&s).await;

    // 1. N writes and a malformed request in one socket write.
    let mut b = Vec::new();
    for i in 0..N {
        request(&mut b, CMD_WRITE, if i % 5 == 0 { CMD_FLAG_FUA } else { 0 }, 1 + i, i * BLOCK, BLOCK as u32);
        b.extend_from_slice(&pattern(i));
        if i == N / 2 {
            request(&mut b, CMD_FLUSH, CMD_FLAG_DF, 900, 0, 0);
        }
    }
    c.write_all(&b).await.unwrap();
    let got = replies(&mut c, N as usize + 1, &[]).await;
    assert_eq!(got[&900].0, EINVAL, "a FLUSH with a READ's flag is refused");
    assert!((1..=N).all(|k| got[&k] == (0, None)), "every write succeeds: {got:?}");
    let acked = rec.writes.lock().unwrap().len();
    assert_eq!(acked, N as usize);

    // 2. A flush, N more writes and reads of the first N blocks in one socket write: the
    //    flush starts after every write acknowledged before it was sent.
    let mut b = Vec::new();
    request(&mut b, CMD_FLUSH, 0, 1000, 0, 0);
    for i in 0..N {
        request(&mut b, CMD_WRITE, 0, 1001 + i, (N + i) * BLOCK, BLOCK as u32);
        b.extend_from_slice(&pattern(N + i));
        request(&mut b, CMD_READ, 0, 2001 + i, i * BLOCK, BLOCK as u32);
    }
    c.write_all(&b).await.unwrap();
    let reads: Vec<u64> = (2001..2001 + N).collect();
    let got = replies(&mut c, 1 + 2 * N as usize, &reads).await;
    assert_eq!(got[&1000], (0, None));
    let flush_at = *rec.flushes.lock().unwrap().first().expect("the flush reached the device");
    let writes = rec.writes.lock().unwrap().clone();
    assert!(writes[..acked].iter().all(|&(_, t)| t < flush_at), "the flush started before an acknowledged write");
    for i in 0..N {
        assert_eq!(got[&(1001 + i)], (0, None));
        assert_eq!(got[&(2001 + i)].1.as_deref(), Some(&pattern(i)[..]), "read of block {i}");
    }

    // 3. Requests cut across socket reads at every few bytes: headers and payloads split.
    let mut b = Vec::new();
    for i in 0..8 {
        request(&mut b, CMD_WRITE, 0, 3001 + i, i * BLOCK, BLOCK as u32);
        b.extend_from_slice(&pattern(100 + i));
    }
    for i in 0..N {
        request(&mut b, CMD_READ, 0, 4001 + i, (N + i) * BLOCK, BLOCK as u32);
    }
    let (mut at, mut step) = (0, 1);
    while at < b.len() {
        let end = (at + step).min(b.len());
        c.write_all(&b[at..end]).await.unwrap();
        tokio::time::sleep(Duration::from_micros(200)).await;
        (at, step) = (end, (step * 7 + 3) % 97 + 1);
    }
    let reads: Vec<u64> = (4001..4001 + N).collect();
    let got = replies(&mut c, 8 + N as usize, &reads).await;
    for i in 0..8 {
        assert_eq!(got[&(3001 + i)], (0, None));
    }
    for i in 0..N {
        assert_eq!(got[&(4001 + i)].1.as_deref(), Some(&pattern(N + i)[..]), "split read of block {}", N + i);
    }
    let mut b = Vec::new();
    request(&mut b, CMD_DISC, 0, 0, 0, 0);
    c.write_all(&b).await.unwrap();
}
