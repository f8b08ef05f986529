//! The `CAN_MULTI_CONN` promise, through real NBD connections to one export: a write
//! acknowledged on one connection is read back on another while the writers go on, and a
//! FLUSH sent on a connection that wrote nothing makes every write acknowledged before it,
//! on every connection, survive a power cut. Each target (cache, write log, thin volume)
//! runs over power-cut devices that complete requests late and out of order; after each
//! round's flush, crash images of both devices at that moment are reopened and read.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use strata::crashtest::{CacheTarget, CrashTarget, WritecacheTarget};
use strata_io::mem::MemDev;
use strata_io::powercut::{Clock, PowerCut, Window};
use strata_io::{BlockDev, Buf};
use strata_nbd::client::Client;
use strata_nbd::{Export, Limits, Server};
use tokio::net::UnixStream;

const VOLUME: u64 = 8 << 20;
const CACHE: u64 = 2 << 20;
const BLOCK: u64 = 4096;
const WRITERS: u64 = 3;
const ROUNDS: usize = 4;
/// Writes per writer per round.
const WRITES: usize = 24;

async fn connect(server: &Server) -> Client<UnixStream> {
    let (ours, theirs) = UnixStream::pair().unwrap();
    server.spawn_connection(theirs);
    Client::handshake(ours, "vol").await.unwrap()
}

/// Distinct contents for every write of the test.
fn contents(seed: u64, round: usize, writer: u64, i: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((round as u64) << 40) ^ (writer << 32) ^ i as u64);
    (0..BLOCK).map(|_| rng.gen()).collect()
}

async fn flush_on_one_connection_covers_all<T: CrashTarget>(target: &T, mode: &str, seed: u64) {
    let clock = Clock::default();
    let window = |s: u64| Window {
        seed: s,
        max_delay: Duration::from_micros(800),
        reorder: true,
        tear_completed: true,
        flush_fail: 0.0,
    };
    let origin = Arc::new(
        PowerCut::with_clock(MemDev::new(target.origin_bytes(VOLUME)), clock.clone()).with_window(window(seed * 2)),
    );
    let cache = Arc::new(PowerCut::with_clock(MemDev::new(CACHE), clock.clone()).with_window(window(seed * 2 + 1)));
    let vol: Arc<dyn BlockDev> = Arc::new(target.create(cache.clone(), origin.clone(), mode, seed).await.unwrap());
    let size = vol.size().min(VOLUME);
    let export = Export { name: "vol".into(), description: String::new(), dev: vol.clone(), read_only: false };
    let server = Server::new(vec![export], Limits::default()).unwrap();
    let mut flusher = connect(&server).await;
    assert!(flusher.flags() & strata_nbd::proto::TFLAG_CAN_MULTI_CONN != 0, "{mode}: the export offers multi-conn");

    // Each writer owns the blocks equal to it modulo WRITERS, in a seeded order, each written
    // once: what a read finds is then the one write to its block.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut owned: Vec<Vec<u64>> = (0..WRITERS)
        .map(|w| {
            let mut blocks: Vec<u64> = (0..size / BLOCK).filter(|b| b % WRITERS == w).collect();
            blocks.shuffle(&mut rng);
            blocks
        })
        .collect();
    let mut acked: HashMap<u64, Vec<u8>> = HashMap::new();
    for round in 0..ROUNDS {
        // The reader checks each write on its own connection as soon as it is acknowledged.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Vec<u8>)>();
        let mut reader = connect(&server).await;
        let checker = tokio::spawn(async move {
            let mut checked = 0;
            while let Some((offset, data)) = rx.recv().await {
                let got = reader.read(offset, BLOCK as u32).await.unwrap();
                assert!(got == data, "a write acknowledged on one connection reads otherwise on another, at {offset}");
                checked += 1;
            }
            checked
        });
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let blocks: Vec<u64> = owned[w as usize].drain(..WRITES).collect();
                let (tx, server) = (tx.clone(), server.clone());
                tokio::spawn(async move {
                    let mut c = connect(&server).await;
                    let mut done = Vec::new();
                    for (i, b) in blocks.into_iter().enumerate() {
                        let data = contents(seed, round, w, i);
                        c.write(b * BLOCK, &data, false).await.unwrap();
                        tx.send((b * BLOCK, data.clone())).unwrap();
                        done.push((b * BLOCK, data));
                    }
                    done
                })
            })
            .collect();
        drop(tx);
        for w in writers {
            acked.extend(w.await.unwrap());
        }
        assert_eq!(checker.await.unwrap(), WRITERS as usize * WRITES, "{mode}: every write was read back");

        // A flush on the connection that wrote nothing; power fails the moment it is answered.
        flusher.flush().await.unwrap();
        let tick = clock.now();
        let image = |d: &PowerCut<MemDev>, s: u64| Arc::new(d.crash_at(d.point_at_tick(tick).unwrap(), s).unwrap());
        let (cache_img, origin_img) = (image(&cache, seed + round as u64), image(&origin, seed ^ round as u64));
        let (back, problems) = target.reopen(cache_img.clone(), origin_img).await.unwrap();
        assert!(problems.is_empty(), "{mode}, round {round}: reopening after the cut: {problems:?}");
        let whole = back.read(0, Buf::zeroed(size as usize)).await.unwrap();
        for (offset, data) in &acked {
            let at = *offset as usize;
            assert!(
                whole[at..at + BLOCK as usize] == data[..],
                "{mode}, round {round}: a write acknowledged before a flush on another connection is lost \
                 at {offset} after a power cut"
            );
        }
        let problems = target.close(back, cache_img).await;
        assert!(problems.is_empty(), "{mode}, round {round}: closing the recovered volume: {problems:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_on_one_connection_covers_writes_on_the_others_cache() {
    for (mode, seed) in [("writeback", 11), ("writethrough", 12)] {
        flush_on_one_connection_covers_all(&CacheTarget, mode, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_on_one_connection_covers_writes_on_the_others_write_log() {
    flush_on_one_connection_covers_all(&WritecacheTarget, "default", 21).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_on_one_connection_covers_writes_on_the_others_thin() {
    match strata::crashtest::thin::ThinTarget::new() {
        Ok(t) => flush_on_one_connection_covers_all(&t, "zeroing", 31).await,
        Err(e) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{e} (scripts/setup.sh installs it)");
            eprintln!("SKIP: {e}");
        }
    }
}
