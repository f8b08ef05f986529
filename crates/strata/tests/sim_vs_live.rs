//! The simulator and the cache target run the same policy code: replaying one trace through
//! the live target (in-memory origin and cache device) and through `strata_sim` gives the
//! same hit count, policy by policy, with readahead off and on.

use std::sync::Arc;
use strata_cache::meta::Meta;
use strata_cache::target::policy_capacity;
use strata_cache::{offline::create, CreateOptions};
use strata_cache::{CacheDev, CacheStatus, OpenOptions};
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf};
use strata_policy::{Op, Params};
use strata_sim::sim::{replay_hits, BlockAccess, Readahead};
use strata_sim::synthetic::Zipf;

const BLOCK: u64 = 32 << 10;
const ORIGIN_BLOCKS: u64 = 2048;

/// Hits of `trace` on a live cache of `cache_bytes`; with `junk`, the cache first serves
/// that and restarts cleanly (its policy then restores the junk's blocks from hints), and
/// commits after each read of `trace`: the slots of the blocks readahead displaced come
/// back at a commit, and the simulator has none to wait for.
async fn live_hits(
    policy: &str,
    cache_bytes: u64,
    junk: &[u64],
    trace: &[u64],
    readahead_bytes: u32,
) -> (u64, usize, u64) {
    let origin = Arc::new(MemDev::new(ORIGIN_BLOCKS * BLOCK));
    let cache = Arc::new(MemDev::new(cache_bytes));
    let o = CreateOptions {
        block_bytes: BLOCK as u32,
        policy: policy.into(),
        migration_budget_bytes_per_s: 0,
        sequential_cutoff_bytes: 0,
        readahead_bytes,
        origin_spec: "mem:sim".into(),
        ..CreateOptions::default()
    };
    let sb = create(&*cache, &*origin, &o).await.unwrap();
    let open = || async {
        let (meta, _) = Meta::load(&*cache).await.unwrap();
        CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions { seed: 3, ..OpenOptions::default() })
            .await
            .unwrap()
    };
    if !junk.is_empty() {
        let dev = open().await;
        read_all(&dev, policy, junk, sb.slots, false).await;
        dev.shutdown().await.unwrap();
    }
    let dev = open().await;
    read_all(&dev, policy, trace, sb.slots, !junk.is_empty()).await;
    let s = CacheStatus::of(&dev).unwrap();
    assert_eq!(s.promotions_skipped, 0, "{s:?}");
    (s.read_hits, policy_capacity(sb.slots as usize), s.promotions)
}

async fn read_all(dev: &CacheDev, policy: &str, trace: &[u64], slots: u64, commit: bool) {
    let mut buf = Buf::zeroed(BLOCK as usize);
    for (i, &b) in trace.iter().enumerate() {
        buf = dev.read(b * BLOCK, buf).await.unwrap();
        // The read's promotions land before the next read, as the simulator has it (else a
        // neighbour whose shard an earlier promotion still holds would be skipped). Then
        // every slot is cached or free: none leaks.
        let mut s = CacheStatus::of(dev).unwrap();
        for k in 0..20_000 {
            if s.cached_blocks + s.free_blocks == slots {
                break;
            }
            if k < 10_000 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            s = CacheStatus::of(dev).unwrap();
        }
        let accounted = s.cached_blocks + s.free_blocks;
        assert_eq!(accounted, slots, "{policy}: step {i}: every slot cached or free: {s:?}");
        if commit {
            dev.flush().await.unwrap();
        }
    }
}

fn reads(trace: &[u64]) -> Vec<BlockAccess> {
    trace
        .iter()
        .enumerate()
        .map(|(i, &b)| BlockAccess {
            block: b,
            time_ns: i as u64 * 100_000,
            bytes: BLOCK as u32,
            op: Op::Read,
            full: true,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_and_live_target_agree() {
    let mut z = Zipf::new(ORIGIN_BLOCKS, 0.9, 7);
    let trace: Vec<u64> = (0..12_000).map(|_| z.next_block()).collect();
    let accesses = reads(&trace);
    for readahead_bytes in [0, 8 * BLOCK as u32] {
        let readahead = Readahead { per: readahead_bytes as u64 / BLOCK, limit: ORIGIN_BLOCKS };
        for policy in
            ["strata", "lru", "arc", "s3fifo", "2q", "sieve", "clock", "lirs", "fifo", "tinylfu", "adaptive", "optgate"]
        {
            let (live, capacity, promotions) = live_hits(policy, 12 << 20, &[], &trace, readahead_bytes).await;
            let params = Params { seed: 3, origin_blocks: Some(ORIGIN_BLOCKS), ..Params::default() };
            let mut p = strata_policy::build(policy, capacity, &params).unwrap();
            let sim = replay_hits(&mut *p, &accesses, readahead);
            let what = format!("{policy}, readahead {readahead_bytes} bytes");
            assert_eq!(live, sim, "{what}: live {live} hits, simulated {sim} (capacity {capacity})");
            assert!(promotions > capacity as u64 / 2, "{what}: the cache was exercised ({promotions} promotions)");
            assert!(live > 0 && live < trace.len() as u64);
        }
    }
}

/// After a clean restart with the cache full of another workload's blocks, the two still
/// agree: readahead takes the place of restored blocks nothing has read (the policies that
/// keep them apart: strata, S3-FIFO and the default behind its gate), or waits for room
/// (LRU).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_and_live_target_agree_after_a_restart_full_of_junk() {
    // A slot reserve (a 64th of the slots) of twice the readahead window: each read's
    // neighbours find slots, as in the simulator.
    const CACHE: u64 = 32 << 20;
    let mut z = Zipf::new(ORIGIN_BLOCKS / 2, 0.9, 7);
    let trace: Vec<u64> = (0..6_000).map(|_| z.next_block()).collect();
    // Another workload, on the other half of the origin, fills the cache.
    let junk: Vec<u64> = (0..ORIGIN_BLOCKS / 2).map(|b| ORIGIN_BLOCKS / 2 + b).collect();
    let readahead_bytes = 8 * BLOCK as u32;
    let readahead = Readahead { per: 8, limit: ORIGIN_BLOCKS };
    let policies = ["strata", "lru", "s3fifo", strata_policy::DEFAULT_POLICY];
    let mut hits = Vec::new();
    for policy in policies {
        let (live, capacity, _) = live_hits(policy, CACHE, &junk, &trace, readahead_bytes).await;
        let params = Params { seed: 3, origin_blocks: Some(ORIGIN_BLOCKS), ..Params::default() };
        let mut before = strata_policy::build(policy, capacity, &params).unwrap();
        replay_hits(&mut *before, &reads(&junk), readahead);
        assert_eq!(before.len(), capacity, "{policy}: the junk fills the cache");
        let mut p = strata_policy::build(policy, capacity, &params).unwrap();
        p.load_hints(&before.save_hints()).unwrap();
        let sim = replay_hits(&mut *p, &reads(&trace), readahead);
        assert_eq!(live, sim, "{policy}: live {live} hits, simulated {sim} (capacity {capacity})");
        hits.push(sim);
    }
    // With an empty cache, their hits are the same: the junk cost them nothing.
    for (&policy, &after_junk) in policies.iter().zip(&hits).filter(|(&p, _)| p != "lru") {
        let (empty, _, _) = live_hits(policy, CACHE, &[], &trace, readahead_bytes).await;
        assert_eq!(after_junk, empty, "{policy} after junk {after_junk} hits, from empty {empty}");
        assert!(after_junk > hits[1], "{policy} {after_junk} hits, lru {}", hits[1]);
    }
}
