//! Mutated traffic: seeded sessions that a well-behaved client would send (handshake options,
//! then commands of every kind), each with a few bytes flipped, overwritten with boundary
//! values, cut short or spliced, are thrown at one server while another client goes on with
//! its own export. Whatever a session turns into, the server must not panic, must close the
//! connection once its client has hung up (no task is left behind), must not write to the
//! read-only export, and must leave the other client's data as that client wrote it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf};
use strata_nbd::proto::*;
use strata_nbd::{Export, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const SIZE: u64 = 1 << 20;
/// The export the well-behaved client uses: no mutation of the sessions' names reaches it.
const GOOD: &str = "the-well-behaved-clients-volume";

/// A session as a client that follows the protocol would send it, up to the end of its
/// commands (a disconnect, most of the time).
fn session(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(CLIENT_FIXED_NEWSTYLE | if rng.gen() { CLIENT_NO_ZEROES } else { 0 }).to_be_bytes());
    let export = if rng.gen_ratio(1, 4) { "ro" } else { "fuzz" };
    let named = |name: &str| {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d
    };
    let opt = |b: &mut Vec<u8>, kind: u32, data: &[u8]| {
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
    };
    let meta = {
        let mut d = named(export);
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&named(BASE_ALLOCATION));
        d
    };
    let mut go = named(export);
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    for _ in 0..rng.gen_range(0..4) {
        match rng.gen_range(0..5) {
            0 => opt(&mut b, OPT_LIST, &[]),
            1 => opt(&mut b, OPT_INFO, &go),
            2 => opt(&mut b, OPT_STRUCTURED_REPLY, &[]),
            3 => opt(&mut b, OPT_LIST_META_CONTEXT, &meta),
            _ => opt(&mut b, OPT_STARTTLS, &[]),
        }
    }
    if rng.gen() {
        opt(&mut b, OPT_STRUCTURED_REPLY, &[]);
        opt(&mut b, OPT_SET_META_CONTEXT, &meta);
    }
    match rng.gen_range(0..8) {
        0 => opt(&mut b, OPT_EXPORT_NAME, export.as_bytes()),
        1 => opt(&mut b, OPT_ABORT, &[]),
        _ => opt(&mut b, OPT_GO, &go),
    }
    for cookie in 0..rng.gen_range(0..12u64) {
        let kind = rng.gen_range(0..8u16);
        let length = match kind {
            CMD_FLUSH | CMD_DISC => 0,
            _ => rng.gen_range(1..=16u32) * 512,
        };
        let offset = rng.gen_range(0..SIZE / 512) * 512;
        let flags =
            [0, CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLAG_DF, CMD_FLAG_REQ_ONE, CMD_FLAG_FAST_ZERO][rng.gen_range(0..6)];
        let req = Request { flags, kind, cookie, offset, length };
        b.extend_from_slice(&req.encode());
        if kind == CMD_WRITE {
            b.extend((0..length).map(|_| rng.gen::<u8>()));
        }
        if kind == CMD_DISC {
            break;
        }
    }
    b
}

/// The same bytes with one to four mutations.
fn mutate(rng: &mut ChaCha8Rng, mut b: Vec<u8>) -> Vec<u8> {
    const BOUNDS: [u64; 9] = [0, 1, 511, 4096, SIZE - 1, SIZE, 0x7fff_ffff, u32::MAX as u64, u64::MAX];
    for _ in 0..rng.gen_range(1..=4) {
        if b.is_empty() {
            break;
        }
        let at = rng.gen_range(0..b.len());
        match rng.gen_range(0..6) {
            0 => b[at] ^= 1 << rng.gen_range(0..8),
            1 => b[at] = rng.gen(),
            2 => {
                // A field set to a boundary value, as 2, 4 or 8 bytes.
                let v = BOUNDS[rng.gen_range(0..BOUNDS.len())].to_be_bytes();
                let width = [2, 4, 8][rng.gen_range(0..3)];
                for (i, byte) in v[8 - width..].iter().enumerate() {
                    if let Some(x) = b.get_mut(at + i) {
                        *x = *byte;
                    }
                }
            }
            3 => b.truncate(at),
            4 => {
                let end = (at + rng.gen_range(1..64)).min(b.len());
                let chunk = b[at..end].to_vec();
                let to = rng.gen_range(0..=b.len());
                b.splice(to..to, chunk);
            }
            _ => {
                let end = (at + rng.gen_range(1..64)).min(b.len());
                b.drain(at..end);
            }
        }
    }
    b
}

/// Sends `bytes` after the greeting, reading and dropping whatever comes back, then hangs
/// up; true once the server has closed its side, which it must do within 10 s of that.
async fn throw(server: &Server, bytes: &[u8]) -> bool {
    let (client, theirs) = UnixStream::pair().unwrap();
    server.spawn_connection(theirs);
    let (mut rd, mut wr) = client.into_split();
    let drain = tokio::spawn(async move {
        let mut sink = vec![0u8; 64 << 10];
        loop {
            match rd.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    // The server may close before taking it all: a refused write is not a failure here.
    let _ = wr.write_all(bytes).await;
    let _ = wr.shutdown().await;
    tokio::time::timeout(Duration::from_secs(10), drain).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_sessions_close_their_own_connection_and_touch_nothing_else() {
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));

    let good_dev = Arc::new(MemDev::new(SIZE));
    let ro_dev = Arc::new(MemDev::new(SIZE));
    let exports = vec![
        Export { name: GOOD.into(), description: String::new(), dev: good_dev.clone(), read_only: false },
        Export { name: "fuzz".into(), description: String::new(), dev: Arc::new(MemDev::new(SIZE)), read_only: false },
        Export { name: "ro".into(), description: String::new(), dev: ro_dev.clone(), read_only: true },
    ];
    let limits = Limits { handshake_timeout: Duration::from_secs(5), ..Limits::default() };
    let server = Server::new(exports, limits).unwrap();

    // The well-behaved client: connected throughout, writing a pattern between batches.
    let (mut good, theirs) = UnixStream::pair().unwrap();
    server.spawn_connection(theirs);
    let mut greeting = [0u8; 18];
    good.read_exact(&mut greeting).await.unwrap();
    good.write_u32(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).await.unwrap();
    let mut go = (GOOD.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(GOOD.as_bytes());
    go.extend_from_slice(&0u16.to_be_bytes());
    good.write_u64(IHAVEOPT).await.unwrap();
    good.write_u32(OPT_GO).await.unwrap();
    good.write_u32(go.len() as u32).await.unwrap();
    good.write_all(&go).await.unwrap();
    loop {
        assert_eq!(good.read_u64().await.unwrap(), OPT_REPLY_MAGIC);
        let _opt = good.read_u32().await.unwrap();
        let kind = good.read_u32().await.unwrap();
        let mut data = vec![0; good.read_u32().await.unwrap() as usize];
        good.read_exact(&mut data).await.unwrap();
        assert!(kind == REP_ACK || kind == REP_INFO, "the good client's GO: reply {kind:#x}");
        if kind == REP_ACK {
            break;
        }
    }

    let mut rng = ChaCha8Rng::seed_from_u64(0x006e_6264_5f6d_7574);
    let mut hung = Vec::new();
    for batch in 0..40u64 {
        for case in 0..200 {
            let valid = session(&mut rng);
            let bytes = mutate(&mut rng, valid);
            if !throw(&server, &bytes).await {
                hung.push((batch, case));
            }
        }
        // The good client writes one 4 KiB block of its own and reads it back.
        let block: Vec<u8> = (0..4096).map(|i| (i as u64 * 31 + batch) as u8).collect();
        let offset = (batch % (SIZE / 4096)) * 4096;
        let w = Request { flags: CMD_FLAG_FUA, kind: CMD_WRITE, cookie: batch, offset, length: 4096 };
        good.write_all(&w.encode()).await.unwrap();
        good.write_all(&block).await.unwrap();
        assert_eq!(good.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
        assert_eq!((good.read_u32().await.unwrap(), good.read_u64().await.unwrap()), (0, batch));
        let r = Request { flags: 0, kind: CMD_READ, cookie: batch, offset, length: 4096 };
        good.write_all(&r.encode()).await.unwrap();
        assert_eq!(good.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
        assert_eq!((good.read_u32().await.unwrap(), good.read_u64().await.unwrap()), (0, batch));
        let mut back = vec![0u8; 4096];
        good.read_exact(&mut back).await.unwrap();
        assert!(back == block, "batch {batch}: the good client read back other bytes than it wrote");
    }
    assert!(hung.is_empty(), "connections still open 10 s after their client hung up: {hung:?}");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "the server panicked (see above)");

    // Only the good client's connection is left, and its device holds what it wrote.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.live_connections() > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.live_connections(), 1, "connections left behind");
    for batch in 0..40u64 {
        let offset = (batch % (SIZE / 4096)) * 4096;
        let got = good_dev.read(offset, Buf::zeroed(4096)).await.unwrap();
        let want: Vec<u8> = (0..4096).map(|i| (i as u64 * 31 + batch) as u8).collect();
        assert!(got[..] == want[..], "block {batch} of the good client's device changed");
    }
    let ro = ro_dev.read(0, Buf::zeroed(SIZE as usize)).await.unwrap();
    assert!(ro.iter().all(|&x| x == 0), "the read-only export was written");
}
