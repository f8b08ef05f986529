//! The remote device against strata's own server: model tests (random IO compared with an
//! in-memory reference, aligned and not, split to a small maximum), and network faults: a
//! server that goes away and comes back, one that loses unflushed writes when it restarts,
//! one that stops answering, one that never comes back, and one whose replies are mutated
//! on the way.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use strata_io::fault::{FaultDev, Ops, Rule};
use strata_io::mem::MemDev;
use strata_io::testing::{check_all_blocks_at_once, check_model, pattern, random_ops, Workload};
use strata_io::{BlockDev, Buf, ErrorKind, ZeroFlags};
use strata_nbd::remote::{Address, RemoteDev, RemoteSpec, Tuning};
use strata_nbd::{Export, Limits, Server};

const SIZE: u64 = 4 << 20;

fn serve(dev: Arc<dyn BlockDev>, sock: &Path, limits: Limits) -> Server {
    serve_export(Export { name: "vol".into(), description: String::new(), dev, read_only: false }, sock, limits)
}

fn serve_export(export: Export, sock: &Path, limits: Limits) -> Server {
    let _ = std::fs::remove_file(sock);
    let server = Server::new(vec![export], limits).unwrap();
    let listener = tokio::net::UnixListener::bind(sock).unwrap();
    let s = server.clone();
    tokio::spawn(async move { s.serve_unix(listener).await });
    server
}

async fn stop(server: Server) {
    server.shutdown();
    tokio::time::timeout(Duration::from_secs(10), server.wait_idle()).await.expect("server stops");
}

fn spec(sock: &Path, tuning: Tuning) -> RemoteSpec {
    RemoteSpec { address: Address::Unix(sock.to_path_buf()), export: "vol".into(), tls: None, tuning }
}

fn socket(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("nbd.sock")
}

#[tokio::test]
async fn random_io_matches_the_reference_aligned_unaligned_and_split() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket(&dir);
    // A 64 KiB maximum, so the larger requests are split.
    let limits = Limits { max_request_bytes: 64 << 10, ..Limits::default() };
    let server = serve(Arc::new(MemDev::new(SIZE)), &sock, limits);
    let dev = RemoteDev::open(spec(&sock, Tuning { connections: Some(3), ..Tuning::default() })).await.unwrap();
    assert_eq!(dev.size(), SIZE);
    assert_eq!(dev.info().block.2, 64 << 10);
    assert!(dev.info().structured && dev.info().base_allocation.is_some());
    for (seed, granularity) in [(1, 4096), (2, 512), (3, 100)] {
        let w = Workload { granularity, max_granules: 80, span: SIZE };
        check_model(&dev, &random_ops(seed, 400, SIZE, &w)).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    check_all_blocks_at_once(&dev).await.unwrap();
    // Three connections up, made in the background, and no reconnection among them.
    for _ in 0..500 {
        if dev.status().unwrap()["connections_up"] == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = dev.status().unwrap();
    assert_eq!((status["connections_up"].as_u64(), status["reconnects"].as_u64()), (Some(3), Some(0)), "{status}");
    // Holes come through BLOCK_STATUS.
    dev.write_zeroes(0, SIZE, ZeroFlags { may_unmap: true, fast_only: false }).await.unwrap();
    let ext = dev.block_status(4096, 8192).await.unwrap();
    assert!(ext[0].zero && ext[0].hole, "{ext:?}");
    dev.write(SIZE - 4096, pattern(3, SIZE - 4096, 4096), false).await.unwrap();
    let ext = dev.block_status(SIZE - 8192, 8192).await.unwrap();
    assert!(!ext.last().unwrap().zero, "{ext:?}");
    stop(server).await;
}

#[tokio::test]
async fn requests_wait_for_a_server_that_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket(&dir);
    let mem: Arc<dyn BlockDev> = Arc::new(MemDev::new(SIZE));
    let server = serve(mem.clone(), &sock, Limits::default());
    let dev = Arc::new(RemoteDev::open(spec(&sock, Tuning::default())).await.unwrap());
    dev.write(0, pattern(7, 0, 8192), false).await.unwrap();
    dev.flush().await.unwrap();
    stop(server).await;
    // Issued while the server is away; answered once it is back.
    let d = dev.clone();
    let waiting = tokio::spawn(async move {
        let w = d.write(65536, pattern(8, 65536, 4096), false).await.map(|_| ());
        w.and(d.read(0, Buf::zeroed(8192)).await)
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Its connections see the server gone in their own tasks.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dev.status().unwrap()["state"] != "down" && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = dev.status().unwrap();
    assert_eq!(status["state"], "down", "{status}");
    assert!(!waiting.is_finished());
    let server = serve(mem.clone(), &sock, Limits::default());
    let got = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("answered").unwrap().unwrap();
    assert_eq!(got[..], pattern(7, 0, 8192)[..]);
    let status = dev.status().unwrap();
    assert_eq!(status["state"], "up", "{status}");
    assert!(status["reconnects"].as_u64().unwrap() >= 1, "{status}");
    assert!(status["seconds_away"].as_f64().unwrap() > 0.5, "{status}");
    let mut back = vec![0u8; 4096];
    mem.read(65536, Buf::zeroed(4096)).await.map(|b| back.copy_from_slice(&b)).unwrap();
    assert_eq!(back[..], pattern(8, 65536, 4096)[..]);
    stop(server).await;
}

/// A server that comes back with other abilities (here read-only) is not used: requests
/// wait for the export as first agreed, the status says why, and they go on once it is.
#[tokio::test]
async fn a_server_back_with_other_flags_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket(&dir);
    let mem: Arc<dyn BlockDev> = Arc::new(MemDev::new(SIZE));
    let server = serve(mem.clone(), &sock, Limits::default());
    let dev = Arc::new(RemoteDev::open(spec(&sock, Tuning::default())).await.unwrap());
    dev.write(0, pattern(7, 0, 4096), false).await.unwrap();
    stop(server).await;
    let read_only = Export { name: "vol".into(), description: String::new(), dev: mem.clone(), read_only: true };
    let server = serve_export(read_only, &sock, Limits::default());
    let d = dev.clone();
    let waiting = tokio::spawn(async move { d.write(8192, pattern(8, 8192, 4096), false).await.map(|_| ()) });
    let changed = || dev.status().unwrap()["last_error"].as_str().unwrap_or("").contains("export changed");
    for _ in 0..500 {
        if changed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = dev.status().unwrap();
    assert!(changed() && status["last_error"].as_str().unwrap().contains("transmission flags"), "{status}");
    assert_eq!(status["state"], "down", "{status}");
    assert!(!waiting.is_finished(), "the write waits for the export as it was");
    stop(server).await;
    let server = serve(mem.clone(), &sock, Limits::default());
    tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("answered").unwrap().unwrap();
    let back = mem.read(8192, Buf::zeroed(4096)).await.unwrap();
    assert_eq!(back[..], pattern(8, 8192, 4096)[..]);
    stop(server).await;
}

#[tokio::test]
async fn a_server_that_lost_unflushed_writes_gets_them_again_before_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket(&dir);
    let first = Arc::new(MemDev::new(SIZE));
    let server = serve(first.clone(), &sock, Limits::default());
    let dev = RemoteDev::open(spec(&sock, Tuning::default())).await.unwrap();
    dev.write(0, pattern(1, 0, 4096), false).await.unwrap();
    dev.flush().await.unwrap();
    dev.write(4096, pattern(2, 4096, 4096), false).await.unwrap();
    dev.write_zeroes(0, 512, ZeroFlags::default()).await.unwrap();
    assert_eq!(dev.status().unwrap()["unflushed_bytes"], 4096);
    stop(server).await;
    // The restarted server holds only what was flushed.
    let durable = Arc::new(MemDev::new(SIZE));
    durable.write_from(0, &pattern(1, 0, 4096)).unwrap();
    let server = serve(durable.clone(), &sock, Limits::default());
    dev.flush().await.unwrap();
    let mut want = pattern(1, 0, 8192);
    want[4096..].copy_from_slice(&pattern(2, 4096, 4096));
    want[..512].fill(0);
    let mut got = vec![0u8; 8192];
    durable.read_into(0, &mut got).unwrap();
    assert!(got == want[..], "the replayed writes are on the new server");
    assert_eq!(dev.status().unwrap()["unflushed_bytes"], 0);
    stop(server).await;
}

/// A replay never leaves older data over newer: a FUA write (durable at once) after an
/// unflushed write of the same block is written again after it; overlapping writes go out
/// in the order they were acknowledged, though the server may apply requests in flight in
/// any order (here its device delays all but the last).
#[tokio::test]
async fn a_replay_leaves_the_newest_data() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket(&dir);
    let kept = Arc::new(MemDev::new(SIZE));
    let server = serve(kept.clone(), &sock, Limits::default());
    // One connection: each new one replays the log.
    let dev = RemoteDev::open(spec(&sock, Tuning { connections: Some(1), ..Tuning::default() })).await.unwrap();
    dev.write(0, pattern(1, 0, 4096), false).await.unwrap();
    dev.write(0, pattern(2, 0, 4096), true).await.unwrap();
    stop(server).await;
    // The restarted server kept everything; the replay must not undo the FUA write.
    let server = serve(kept.clone(), &sock, Limits::default());
    dev.flush().await.unwrap();
    let mut got = vec![0u8; 4096];
    kept.read_into(0, &mut got).unwrap();
    assert!(got == pattern(2, 0, 4096)[..], "an older write was replayed over the FUA write");
    stop(server).await;

    // Many writes of one block; the restarted server lost them all, and its device
    // delays all of them but the last, which would land first.
    let server = serve(kept.clone(), &sock, Limits::default());
    dev.flush().await.unwrap();
    for i in 0..64 {
        dev.write(65536, pattern(10 + i, 0, 4096), false).await.unwrap();
    }
    stop(server).await;
    let (slow, faults) = FaultDev::new(MemDev::new(SIZE));
    faults.add(Rule::delay(Ops::WRITE, Duration::from_millis(5)).times(63));
    let slow = Arc::new(slow);
    let server = serve(slow.clone(), &sock, Limits::default());
    dev.flush().await.unwrap();
    let got = slow.read(65536, Buf::zeroed(4096)).await.unwrap();
    assert!(got[..] == pattern(73, 0, 4096)[..], "the replay left an older write last");
    stop(server).await;
}

#[tokio::test]
async fn past_the_outage_limit_requests_fail_with_eio() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket(&dir);
    let server = serve(Arc::new(MemDev::new(SIZE)), &sock, Limits::default());
    let tuning = Tuning { outage: Duration::from_millis(800), ..Tuning::default() };
    let dev = RemoteDev::open(spec(&sock, tuning)).await.unwrap();
    stop(server).await;
    let t = std::time::Instant::now();
    let e = dev.read(0, Buf::zeroed(4096)).await.expect_err("no server");
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}"); // EIO on the wire
    assert!(e.context.contains("unreachable"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(dev.status().unwrap()["state"], "down");
}

#[tokio::test]
async fn a_server_that_stops_answering_turns_into_timeouts_then_eio() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket(&dir);
    let limits = Limits { handshake_timeout: Duration::from_secs(2), ..Limits::default() };
    // Reads that take ten minutes: a server that stops answering them.
    let (silent, faults) = FaultDev::new(MemDev::new(SIZE));
    faults.add(Rule::delay(Ops::READ, Duration::from_secs(600)).always());
    let server = serve(Arc::new(silent), &sock, limits);
    let tuning =
        Tuning { timeout: Duration::from_millis(300), outage: Duration::from_millis(1200), ..Tuning::default() };
    let dev = RemoteDev::open(spec(&sock, tuning)).await.unwrap();
    dev.write(0, pattern(1, 0, 4096), false).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), dev.read(0, Buf::zeroed(4096)))
        .await
        .expect("no hang")
        .expect_err("no answer");
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}"); // EIO on the wire
    let status = dev.status().unwrap();
    assert!(status["timeouts"].as_u64().unwrap() >= 2, "{status}");
    // Writes still work: only the stuck requests failed.
    dev.write(4096, pattern(2, 4096, 4096), false).await.unwrap();
    server.shutdown();
}

/// A server that answers the handshake and then every read with one structured reply chunk
/// (`chunk_type`, `payload`): a hostile or broken server, written out by hand.
fn serve_chunks(sock: &Path, chunk_type: u16, payload: Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = std::fs::remove_file(sock);
    let listener = tokio::net::UnixListener::bind(sock).unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let payload = payload.clone();
            tokio::spawn(async move {
                let reply = |opt: u32, ty: u32, data: &[u8]| {
                    let mut r = 0x3e889045565a9u64.to_be_bytes().to_vec();
                    r.extend(opt.to_be_bytes());
                    r.extend(ty.to_be_bytes());
                    r.extend((data.len() as u32).to_be_bytes());
                    r.extend(data);
                    r
                };
                c.write_all(b"NBDMAGICIHAVEOPT\0\x03").await?;
                c.read_u32().await?;
                loop {
                    let (_, opt, len) = (c.read_u64().await?, c.read_u32().await?, c.read_u32().await?);
                    let mut data = vec![0; len as usize];
                    c.read_exact(&mut data).await?;
                    match opt {
                        8 => c.write_all(&reply(opt, 1, &[])).await?,
                        6 | 7 => {
                            let mut info = vec![0, 0];
                            info.extend(SIZE.to_be_bytes());
                            info.extend(5u16.to_be_bytes());
                            c.write_all(&reply(opt, 3, &info)).await?;
                            c.write_all(&reply(opt, 1, &[])).await?;
                            if opt == 7 {
                                break;
                            }
                        }
                        _ => c.write_all(&reply(opt, 0x8000_0001, &[])).await?,
                    }
                }
                loop {
                    let mut req = [0u8; 28];
                    c.read_exact(&mut req).await?;
                    let ty = u16::from_be_bytes([req[6], req[7]]);
                    let len = u32::from_be_bytes(req[24..28].try_into().unwrap());
                    let mut r = Vec::new();
                    if ty == 0 {
                        r.extend(0x668e_33efu32.to_be_bytes());
                        r.extend(1u16.to_be_bytes());
                        r.extend(chunk_type.to_be_bytes());
                        r.extend(&req[8..16]);
                        r.extend((payload.len() as u32).to_be_bytes());
                        r.extend(&payload);
                    } else {
                        if ty == 1 {
                            c.read_exact(&mut vec![0; len as usize]).await?;
                        }
                        r.extend(0x6744_6698u32.to_be_bytes());
                        r.extend(0u32.to_be_bytes());
                        r.extend(&req[8..16]);
                    }
                    c.write_all(&r).await?;
                }
                #[allow(unreachable_code)]
                Ok::<(), std::io::Error>(())
            });
        }
    });
}

/// A reply chunk whose offset and length run past 2^64 is a bad chunk: the read fails and
/// the connection is dropped (as for any chunk outside the request), the reply reader does
/// not panic on the arithmetic.
#[tokio::test]
async fn a_chunk_whose_range_wraps_around_is_refused() {
    let near_end = u64::MAX - 9;
    let hole = [near_end.to_be_bytes().as_slice(), &100u32.to_be_bytes()].concat();
    let data = [near_end.to_be_bytes().as_slice(), &[7u8; 100]].concat();
    for (name, ty, payload) in [("hole", 2u16, hole), ("data", 1, data)] {
        let dir = tempfile::tempdir().unwrap();
        let sock = socket(&dir);
        serve_chunks(&sock, ty, payload);
        let tuning =
            Tuning { timeout: Duration::from_millis(500), outage: Duration::from_millis(1500), ..Tuning::default() };
        let dev = RemoteDev::open(spec(&sock, tuning)).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(20), dev.read(0, Buf::zeroed(4096))).await.expect("no hang");
        assert!(r.is_err(), "{name}: a read answered by a bad chunk");
        let status = dev.status().unwrap();
        let why = status["last_error"].as_str().unwrap();
        assert!(why.contains(&format!("bad {name} chunk")), "{name}: {status}");
    }
}

/// A server that answers but refuses the export is not called unreachable: the error names
/// the refusal.
#[tokio::test]
async fn an_unknown_export_is_a_refusal_not_an_unreachable_server() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket(&dir);
    let server = serve(Arc::new(MemDev::new(SIZE)), &sock, Limits::default());
    let wrong = RemoteSpec { export: "wrong".into(), ..spec(&sock, Tuning::default()) };
    let e = RemoteDev::open(wrong).await.err().expect("an unknown export");
    assert!(e.context.contains("unknown export") && !e.context.contains("cannot reach"), "{e}");
    stop(server).await;
}

/// A proxy on `front` to the server on `back` that, while `mutate` holds, changes what the
/// server says: in one in `every` of its reads, a byte flipped, the read cut short and the
/// connection closed, or stray bytes put in (what a broken server or network could send).
fn mutating_proxy(front: &Path, back: PathBuf, mutate: Arc<std::sync::atomic::AtomicBool>, every: u64) {
    use std::sync::atomic::Ordering::Relaxed;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = std::fs::remove_file(front);
    let listener = tokio::net::UnixListener::bind(front).unwrap();
    tokio::spawn(async move {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::UnixStream::connect(&back).await else { continue };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
            seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let (mutate, mut rng) = (mutate.clone(), seed);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                loop {
                    let n = sr.read(&mut buf).await?;
                    if n == 0 {
                        return Ok::<(), std::io::Error>(());
                    }
                    let out = &mut buf[..n];
                    if mutate.load(Relaxed) && next() % every == 0 {
                        // Often in the first bytes of a read, where a reply's header most
                        // often lies.
                        let span = if next() % 2 == 0 { n.min(32) } else { n };
                        let at = (next() % span as u64) as usize;
                        match next() % 3 {
                            0 => out[at] ^= 1 << (next() % 8),
                            1 => {
                                cw.write_all(&out[..at]).await?;
                                return cw.shutdown().await;
                            }
                            _ => cw.write_all(&next().to_be_bytes()[..1 + at % 8]).await?,
                        }
                    }
                    cw.write_all(out).await?;
                }
            });
        }
    });
}

/// A server whose replies are mutated on the way (bit flips, replies cut short, stray
/// bytes): the client neither panics nor hangs past its outage limit, and once the replies
/// are whole again it serves exactly what is written from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_replies_fail_requests_and_never_hurt_the_client() {
    common::watch_panics();
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("server.sock");
    let front = dir.path().join("proxy.sock");
    let server = serve(Arc::new(MemDev::new(SIZE)), &back, Limits::default());
    let mutate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    mutating_proxy(&front, back, mutate.clone(), 3);
    let tuning = Tuning { timeout: Duration::from_millis(200), outage: Duration::from_secs(1), ..Tuning::default() };
    let dev = RemoteDev::open(spec(&front, tuning)).await.unwrap();
    mutate.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, 0);
    for i in 0..120u64 {
        let at = (i * 7919 % (SIZE / 4096 - 4)) * 4096;
        let len = 4096 * (1 + i % 4);
        let io = async {
            match i % 3 {
                0 => dev.write(at, pattern(i, at, len as usize), i % 2 == 0).await.map(drop),
                1 => dev.read(at, Buf::zeroed(len as usize)).await.map(drop),
                _ => dev.flush().await,
            }
        };
        match tokio::time::timeout(Duration::from_secs(20), io).await.expect("a request ends") {
            Ok(()) => ok += 1,
            Err(_) => failed += 1,
        }
    }
    assert!(failed > 0 && ok > 0, "{ok} requests answered, {failed} failed: the replies were mutated");
    mutate.store(false, std::sync::atomic::Ordering::Relaxed);
    // Whole replies again: what is written now reads back, block for block.
    let mut served = false;
    for _ in 0..50 {
        if dev.write(0, pattern(1000, 0, 4096), true).await.is_ok() {
            served = true;
            break;
        }
    }
    assert!(served, "the client serves again once the replies are whole");
    for b in 0..64u64 {
        dev.write(b * 4096, pattern(2000 + b, b * 4096, 4096), b % 2 == 0).await.unwrap();
    }
    dev.flush().await.unwrap();
    for b in 0..64u64 {
        let got = dev.read(b * 4096, Buf::zeroed(4096)).await.unwrap();
        assert!(got[..] == pattern(2000 + b, b * 4096, 4096)[..], "block {b} after the mutations");
    }
    common::assert_no_panics("the client");
    stop(server).await;
}
