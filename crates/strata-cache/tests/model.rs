//! The cache target against the in-memory reference, in every mode: several clients at once
//! on disjoint regions of one volume (so they compete for cache slots), with mode switches,
//! forced write-backs, policy changes and commits thrown in at random points. Every read is
//! compared, and the whole volume is compared again through a fresh open after shutdown.

mod common;

use common::wait_clean;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use strata_cache::meta::Meta;
use strata_cache::{offline::create, CreateOptions};
use strata_cache::{CacheDev, CacheStatus, Mode, OpenOptions};
use strata_io::latency::{LatencyDev, SsdParams};
use strata_io::mem::MemDev;
use strata_io::testing::{check_model, random_ops, Slice, Workload};
use strata_io::{BlockDev, Buf};

const ORIGIN: u64 = 8 << 20;
const BLOCK: u32 = 32 << 10;

struct Rig {
    origin: Arc<MemDev>,
    cache_dev: Arc<MemDev>,
    /// Served through an SSD latency model, so background cache writes overlap foreground IO.
    slow_cache: bool,
}

fn rig(cache_bytes: u64) -> Rig {
    Rig { origin: Arc::new(MemDev::new(ORIGIN)), cache_dev: Arc::new(MemDev::new(cache_bytes)), slow_cache: false }
}

async fn format(r: &Rig, mode: Mode, policy: &str) {
    let o = CreateOptions {
        block_bytes: BLOCK,
        mode,
        policy: policy.into(),
        migration_budget_bytes_per_s: 0, // unlimited: promote whenever the policy says so
        writeback_percent: 0,
        sequential_cutoff_bytes: 512 << 10,
        origin_spec: "mem:test".into(),
        ..CreateOptions::default()
    };
    create(&*r.cache_dev, &*r.origin, &o).await.unwrap();
}

async fn open(r: &Rig) -> Arc<CacheDev> {
    let (meta, findings) = Meta::load(&*r.cache_dev).await.unwrap();
    assert!(findings.errors.is_empty(), "{:?}", findings.errors);
    let cache: Arc<dyn BlockDev> = if r.slow_cache {
        let p = SsdParams { read_us: 50.0, write_us: 300.0, ..SsdParams::default() };
        Arc::new(LatencyDev::ssd(r.cache_dev.clone(), p))
    } else {
        r.cache_dev.clone()
    };
    Arc::new(CacheDev::open(cache, r.origin.clone(), meta, OpenOptions::default()).await.unwrap())
}

/// Runs `clients` model checkers concurrently plus a disturber that changes modes, asks for
/// write-back and commits at random.
async fn exercise(dev: Arc<CacheDev>, seed: u64, clients: u64, modes: &[Mode]) {
    let region = ORIGIN / clients;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let dev = dev.clone();
        tasks.push(tokio::spawn(async move {
            let slice = Slice { inner: dev, offset: c * region, len: region };
            let w = Workload { granularity: 512, max_granules: 160, span: region };
            let ops = random_ops(seed * 100 + c, 250, region, &w);
            check_model(&slice, &ops).await.map_err(|e| format!("client {c}: {e}"))
        }));
    }
    let disturber = {
        let dev = dev.clone();
        let modes = modes.to_vec();
        tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for _ in 0..40 {
                tokio::time::sleep(std::time::Duration::from_millis(rng.gen_range(1..15))).await;
                let msg = match rng.gen_range(0..5) {
                    0 => format!("mode {}", modes[rng.gen_range(0..modes.len())].name()),
                    1 => "flush".to_string(),
                    2 => "writeback_percent 50".to_string(),
                    3 => "sequential_cutoff 0".to_string(),
                    _ => {
                        dev.flush().await.unwrap();
                        continue;
                    }
                };
                dev.message(&msg).await.unwrap();
            }
        })
    };
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            panic!("seed {seed}: {e}");
        }
    }
    disturber.await.unwrap();
}

/// A cache of ~24 slots over 256 origin blocks: constant eviction.
const SMALL_CACHE: u64 = 2 << 20;

/// Runs three seeds; returns the status of each volume after its workload.
async fn run_mode(mode: Mode, also: &[Mode], cache_bytes: u64) -> Vec<CacheStatus> {
    let mut seen = Vec::new();
    for seed in 1..=3u64 {
        // Free slots (readahead) are what a big cache is for: give its writes time to race.
        let r = Rig { slow_cache: cache_bytes > SMALL_CACHE, ..rig(cache_bytes) };
        format(&r, mode, "strata").await;
        let dev = open(&r).await;
        let mut modes = vec![mode];
        modes.extend_from_slice(also);
        exercise(dev.clone(), seed, 4, &modes).await;
        dev.check_invariants().unwrap();
        let s = CacheStatus::of(&*dev).unwrap();
        assert!(s.promotions > 0, "no promotions happened: {s:?}");
        seen.push(s);
        // Clean shutdown, reopen: the contents seen through the cache are the same.
        let before = dev.read(0, Buf::zeroed(ORIGIN as usize)).await.unwrap();
        dev.shutdown().await.unwrap();
        drop(dev);
        let dev = open(&r).await;
        let after = dev.read(0, Buf::zeroed(ORIGIN as usize)).await.unwrap();
        assert!(before[..] == after[..], "seed {seed}: contents changed across a clean restart");
        dev.check_invariants().unwrap();
        // And after writing everything back, the origin alone holds the same contents.
        dev.message("detach").await.unwrap();
        wait_clean(&dev).await;
        let mut origin_view = vec![0u8; ORIGIN as usize];
        r.origin.read_into(0, &mut origin_view).unwrap();
        assert!(origin_view[..] == after[..], "seed {seed}: origin incomplete after detach");
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writeback_matches_reference() {
    run_mode(Mode::Writeback, &[], SMALL_CACHE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writethrough_matches_reference() {
    run_mode(Mode::Writethrough, &[], SMALL_CACHE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writearound_and_passthrough_match_reference() {
    run_mode(Mode::Writearound, &[Mode::Passthrough], SMALL_CACHE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switches_under_load_match_reference() {
    run_mode(Mode::Writeback, &[Mode::Writethrough, Mode::Writearound, Mode::Passthrough, Mode::Cleaner], SMALL_CACHE)
        .await;
}

/// A cache larger than the data keeps free slots, so read misses bring their readahead
/// neighbours along while the same clients write to those neighbours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_neighbours_stay_coherent() {
    let seen = run_mode(Mode::Writeback, &[Mode::Writethrough], 12 << 20).await;
    let ahead: u64 = seen.iter().map(|s| s.readahead_blocks).sum();
    assert!(ahead > 0, "no readahead happened: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_policy_serves_correct_data() {
    for policy in strata_policy::POLICY_NAMES {
        let r = rig(SMALL_CACHE);
        format(&r, Mode::Writeback, policy).await;
        let dev = open(&r).await;
        exercise(dev, 9, 2, &[Mode::Writeback]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writethrough_leaves_nothing_dirty() {
    let r = rig(SMALL_CACHE);
    format(&r, Mode::Writethrough, "strata").await;
    let dev = open(&r).await;
    let slice = Slice { inner: dev.clone(), offset: 0, len: ORIGIN };
    let ops = random_ops(5, 300, ORIGIN, &Workload { granularity: 4096, max_granules: 16, span: ORIGIN });
    check_model(&slice, &ops).await.unwrap();
    assert_eq!(CacheStatus::of(&*dev).unwrap().dirty_blocks, 0);
    let (meta, _) = Meta::load(&*r.cache_dev).await.unwrap();
    assert!(meta.entries.iter().all(|e| !e.dirty));
}
