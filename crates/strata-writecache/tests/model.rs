//! The writecache target against the in-memory reference: several clients at once on
//! disjoint regions of one volume, random reads, writes (partial blocks too), flushes, FUA,
//! discards and write-zeroes, with the background write-back running and a disturber that
//! forces write-backs, commits and tunable changes (reads kept in the log by windows that
//! cross the clients' regions among them). Logs from far smaller than the working
//! set (most writes go around) to larger than it. After the workload the slots' invariants
//! are checked and the whole volume is compared again through a fresh open.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_io::testing::{check_model, random_ops, Slice, Workload};
use strata_io::{BlockDev, Buf};
use strata_writecache::offline::{create, CreateOptions};
use strata_writecache::{OpenOptions, Tunables, WritecacheDev, WritecacheStatus};

const ORIGIN: u64 = 4 << 20;

async fn open(cache: &Arc<MemDev>, origin: &Arc<MemDev>, t: Tunables) -> Arc<WritecacheDev> {
    let o = OpenOptions { tunables: Some(t), no_background: false };
    Arc::new(WritecacheDev::open(cache.clone(), origin.clone(), o).await.unwrap())
}

/// Runs the workload; returns the target's status before shutdown.
async fn exercise(cache_bytes: u64, block: u32, t: Tunables, seed: u64) -> WritecacheStatus {
    let origin = Arc::new(MemDev::new(ORIGIN));
    let cache = Arc::new(MemDev::new(cache_bytes));
    create(&*cache, &*origin, &CreateOptions { block_bytes: block, force: false, ..CreateOptions::default() })
        .await
        .unwrap();
    let dev = open(&cache, &origin, t).await;
    let clients = 3u64;
    let region = ORIGIN / clients / 4096 * 4096;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let dev = dev.clone();
        tasks.push(tokio::spawn(async move {
            let slice = Slice { inner: dev, offset: c * region, len: region };
            let w = Workload { granularity: 512, max_granules: 40, span: region };
            let ops = random_ops(seed * 100 + c, 400, region, &w);
            check_model(&slice, &ops).await
        }));
    }
    let disturber = {
        let dev = dev.clone();
        tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for _ in 0..30 {
                let msg = match rng.gen_range(0..10) {
                    0 => "flush".to_string(),
                    1 => "commit".to_string(),
                    2 => format!("writeback_running {}", rng.gen_bool(0.5) as u8),
                    3 => format!("cleaner {}", rng.gen_bool(0.3) as u8),
                    4 => format!("low_watermark {}", rng.gen_range(0..=40)),
                    5 => format!("writeback_jobs {}", rng.gen_range(0..8)),
                    6 => format!("max_age {}", rng.gen_range(0..20)),
                    7 => format!("autocommit_blocks {}", rng.gen_range(1..64)),
                    8 => format!("readahead {}", [0, 4096, 65536, 1 << 20][rng.gen_range(0..4)]),
                    _ => format!("autocommit_time {}", rng.gen_range(0..50)),
                };
                dev.message(&msg).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(rng.gen_range(0..5))).await;
            }
        })
    };
    for (c, t) in tasks.into_iter().enumerate() {
        t.await.unwrap().unwrap_or_else(|e| panic!("seed {seed} client {c}: {e}"));
    }
    disturber.await.unwrap();
    dev.check_state().unwrap();
    let status: WritecacheStatus = serde_json::from_value(dev.status().unwrap()).unwrap();
    let before = dev.read(0, Buf::zeroed(ORIGIN as usize)).await.unwrap();
    dev.shutdown().await.unwrap();
    drop(dev);
    let again = open(&cache, &origin, Tunables::default()).await;
    again.check_state().unwrap();
    let after = again.read(0, Buf::zeroed(ORIGIN as usize)).await.unwrap();
    assert!(before[..] == after[..], "seed {seed}: the volume reads differently after a reopen");
    again.writeback_all().await.unwrap();
    let origin_now = origin.read(0, Buf::zeroed(ORIGIN as usize)).await.unwrap();
    assert!(origin_now[..] == before[..], "seed {seed}: the origin after a full write-back differs from the volume");
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_larger_than_the_working_set() {
    for seed in 0..3 {
        let s = exercise(8 << 20, 4096, Tunables::default(), seed).await;
        assert_eq!(s.writes_around, 0, "seed {seed}: {s:?}");
        assert!(s.write_hits > 0 && s.read_hits > 0 && s.read_misses > 0 && s.reads_kept > 0, "seed {seed}: {s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_far_smaller_than_the_working_set() {
    for seed in 10..13 {
        let s = exercise(160 << 10, 4096, Tunables::default(), seed).await;
        assert!(s.writes_around > 0 && s.writebacks > 0 && s.read_hits > 0, "seed {seed}: {s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_blocks_and_no_headroom() {
    let t = Tunables { high_watermark: 100, low_watermark: 0, ..Tunables::default() };
    for seed in 20..23 {
        exercise(256 << 10, 512, t, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_blocks_partial_writes() {
    for seed in 30..32 {
        exercise(1 << 20, 64 << 10, Tunables::default(), seed).await;
    }
}
