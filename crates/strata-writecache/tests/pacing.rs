//! The background task's tunables at work: `autocommit_blocks` commits after that many
//! changes without a FLUSH (and not before), `writeback_jobs` and `max_age` are taken live,
//! and status reports the write-back controller's rate.

use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf};
use strata_writecache::offline::{create, CreateOptions};
use strata_writecache::{OpenOptions, WritecacheDev, WritecacheStatus};

const BLOCK: u64 = 4096;

fn status(dev: &WritecacheDev) -> WritecacheStatus {
    serde_json::from_value(dev.status().unwrap()).unwrap()
}

async fn log() -> WritecacheDev {
    let origin = Arc::new(MemDev::new(4 << 20));
    let cache = Arc::new(MemDev::new(1 << 20));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    WritecacheDev::open(cache, origin, OpenOptions::default()).await.unwrap()
}

/// Waits up to 10 s for `cond` on the status.
async fn eventually(dev: &WritecacheDev, what: &str, cond: impl Fn(&WritecacheStatus) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond(&status(dev)) {
        assert!(Instant::now() < deadline, "{what}: {:?}", status(dev));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autocommit_blocks_commits_after_that_many_changes_and_not_before() {
    let dev = log().await;
    // No timed commits; nothing written back (so no eviction commits either).
    for m in ["autocommit_time 100000000", "pause_writeback on", "autocommit_blocks 16"] {
        dev.message(m).await.unwrap();
    }
    for b in 0..15u64 {
        dev.write(b * BLOCK, Buf::from_slice(&[b as u8 + 1; BLOCK as usize]), false).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(status(&dev).commits, 0, "15 changes are fewer than autocommit_blocks");
    dev.write(15 * BLOCK, Buf::from_slice(&[16; BLOCK as usize]), false).await.unwrap();
    eventually(&dev, "a commit after the 16th change", |s| s.commits == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_controller_rate_and_the_new_tunables() {
    let dev = log().await;
    for m in ["writeback_jobs 4", "max_age 250", "autocommit_blocks 100"] {
        dev.message(m).await.unwrap();
    }
    let t = status(&dev).tunables;
    assert_eq!((t.writeback_jobs, t.max_age_ms, t.autocommit_blocks), (4, 250, 100));
    assert!(dev.message("writeback_jobs many").await.is_err());
    // Paused: rate 0 whatever is dirty.
    dev.message("pause_writeback on").await.unwrap();
    for b in 0..32u64 {
        dev.write(b * BLOCK, Buf::from_slice(&[7; BLOCK as usize]), false).await.unwrap();
    }
    eventually(&dev, "rate 0 while paused", |s| s.writeback_rate == Some(0.0) && s.dirty_blocks == 32).await;
    // Cleaner: flat out (null) until everything is written back.
    dev.message("cleaner on").await.unwrap();
    dev.message("pause_writeback off").await.unwrap();
    eventually(&dev, "everything written back", |s| s.dirty_blocks == 0 && s.writebacks == 32).await;
    let text: Vec<_> = dev.metrics().into_iter().filter(|s| s.name.contains("writeback_rate")).collect();
    assert_eq!(text.len(), 1);
}

/// `flush` (and the cleaner, which detach uses) drains the log in origin-address order: blocks
/// written in a random order reach the origin as one ascending sweep, adjacent ones merged
/// into one write each (of at most a batch, 256 blocks), not as batches of the oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_drains_in_origin_address_order_merging_adjacent_blocks() {
    use rand::{Rng, SeedableRng};
    use strata_io::testing::Recording;
    let origin = Arc::new(Recording::new(MemDev::new(8 << 20)));
    let cache = Arc::new(MemDev::new(4 << 20));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let o = OpenOptions { no_background: true, ..OpenOptions::default() };
    let dev = WritecacheDev::open(cache, origin.clone(), o).await.unwrap();
    let mut blocks: Vec<u64> = (10..610).chain([800, 802, 804]).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    for i in (1..blocks.len()).rev() {
        blocks.swap(i, rng.gen_range(0..=i));
    }
    for &b in &blocks {
        dev.write(b * BLOCK, Buf::from_slice(&[b as u8; BLOCK as usize]), false).await.unwrap();
    }
    origin.take();
    dev.message("flush").await.unwrap();
    let (_, writes) = origin.take();
    let want: Vec<(u64, u64)> = [(10, 256), (266, 256), (522, 88), (800, 1), (802, 1), (804, 1)]
        .iter()
        .map(|&(b, n)| (b * BLOCK, n * BLOCK))
        .collect();
    assert_eq!(writes, want);
    assert_eq!(status(&dev).writebacks, blocks.len() as u64);
}

/// With no room in the log, a write of several blocks goes to the origin as one write (after
/// the logged copies of its blocks go back and are cleared), and reads back right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_write_into_a_full_log_goes_around_as_one_origin_write() {
    use strata_io::testing::Recording;
    let origin = Arc::new(Recording::new(MemDev::new(8 << 20)));
    let cache = Arc::new(MemDev::new(256 << 10));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let o = OpenOptions { no_background: true, ..OpenOptions::default() };
    let dev = WritecacheDev::open(cache, origin.clone(), o).await.unwrap();
    let slots = status(&dev).blocks;
    for b in 0..slots {
        dev.write(b * BLOCK, Buf::from_slice(&[1; BLOCK as usize]), false).await.unwrap();
    }
    assert_eq!(status(&dev).free_blocks, 0);
    origin.take();
    // 32 blocks from the last logged block on: one logged (written back first), 31 not.
    let at = (slots - 1) * BLOCK;
    let data = vec![7u8; 32 * BLOCK as usize];
    dev.write(at, Buf::from_slice(&data), true).await.unwrap();
    let (_, writes) = origin.take();
    assert_eq!(writes, [(at, BLOCK), (at, 32 * BLOCK)], "the logged block goes back, then one write");
    let s = status(&dev);
    assert_eq!((s.writes_around, s.free_blocks), (32, 1), "{s:?}");
    assert_eq!(dev.read(at, Buf::zeroed(data.len())).await.unwrap().to_vec(), data);
    assert_eq!(dev.read(0, Buf::zeroed(BLOCK as usize)).await.unwrap().to_vec(), [1; BLOCK as usize]);
    dev.check_state().unwrap();
}
