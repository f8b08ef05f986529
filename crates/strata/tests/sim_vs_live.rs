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

async fn live_hits(policy: &str, trace: &[u64], readahead_bytes: u32) -> (u64, usize, u64) {
    let origin = Arc::new(MemDev::new(ORIGIN_BLOCKS * BLOCK));
    let cache = Arc::new(MemDev::new(12 << 20));
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
    let (meta, _) = Meta::load(&*cache).await.unwrap();
    let dev = CacheDev::open(cache, origin, meta, OpenOptions { seed: 3, ..OpenOptions::default() }).await.unwrap();
    let mut buf = Buf::zeroed(BLOCK as usize);
    for (i, &b) in trace.iter().enumerate() {
        buf = dev.read(b * BLOCK, buf).await.unwrap();
        // The read's promotions land before the next read, as the simulator has it (else a
        // neighbour whose shard an earlier promotion still holds would be skipped). Then
        // every slot is cached or free: none leaks.
        let mut s = CacheStatus::of(&dev).unwrap();
        for k in 0..20_000 {
            if s.cached_blocks + s.free_blocks == sb.slots {
                break;
            }
            if k < 10_000 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            s = CacheStatus::of(&dev).unwrap();
        }
        let accounted = s.cached_blocks + s.free_blocks;
        assert_eq!(accounted, sb.slots, "{policy}: step {i}: every slot cached or free: {s:?}");
    }
    let s = CacheStatus::of(&dev).unwrap();
    assert_eq!(s.promotions_skipped, 0, "{s:?}");
    (s.read_hits, policy_capacity(sb.slots as usize), s.promotions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_and_live_target_agree() {
    let mut z = Zipf::new(ORIGIN_BLOCKS, 0.9, 7);
    let trace: Vec<u64> = (0..12_000).map(|_| z.next_block()).collect();
    let accesses: Vec<BlockAccess> = trace
        .iter()
        .enumerate()
        .map(|(i, &b)| BlockAccess {
            block: b,
            time_ns: i as u64 * 100_000,
            bytes: BLOCK as u32,
            op: Op::Read,
            full: true,
        })
        .collect();
    for readahead_bytes in [0, 8 * BLOCK as u32] {
        let readahead = Readahead { per: readahead_bytes as u64 / BLOCK, limit: ORIGIN_BLOCKS };
        for policy in ["strata", "lru", "arc", "s3fifo", "2q", "sieve", "clock", "lirs", "fifo", "tinylfu", "adaptive"]
        {
            let (live, capacity, promotions) = live_hits(policy, &trace, readahead_bytes).await;
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
