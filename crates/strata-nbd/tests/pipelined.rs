//! Many requests in one socket write, on an O_DIRECT file whose io_uring completions the
//! runtime's reactor collects (as under `strata serve`): the connection parses every request
//! its buffer holds and starts them all before it waits. Every request must still get exactly
//! its own reply, a flush must come after every write acknowledged before it was sent, a
//! malformed request gets its error, and requests cut across socket reads are taken whole.
//! In a test binary of its own: the reaping runtime is process-wide.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use strata_io::file::{FileDev, FileOptions};
use strata_io::testing::recording::Event;
use strata_io::testing::Recording;
use strata_nbd::proto::*;
use strata_nbd::{Export, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const BLOCK: u64 = 4096;
const N: u64 = 48;

/// Block `block`'s contents, distinct for every block.
fn pattern(block: u64) -> strata_io::Buf {
    strata_io::testing::pattern(block, 0, BLOCK as usize)
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
    let rec = Arc::new(Recording::new(dev));
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
    let acked = rec.events().iter().filter(|e| matches!(e, Event::WriteDone(_))).count();
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
    let events = rec.events();
    let flush_at = events.iter().position(|&e| e == Event::Flush).expect("the flush reached the device");
    let done_before = events[..flush_at].iter().filter(|e| matches!(e, Event::WriteDone(_))).count();
    assert!(done_before >= acked, "the flush started before an acknowledged write");
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
