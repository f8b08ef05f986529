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
    for m in ["autocommit_time 100000000", "writeback_running off", "autocommit_blocks 16"] {
        dev.message(m).await.unwrap();
    }
    // Each setting is kept in the superblock by a commit of its own.
    let before = status(&dev).commits;
    for b in 0..15u64 {
        dev.write(b * BLOCK, Buf::from_slice(&[b as u8 + 1; BLOCK as usize]), false).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(status(&dev).commits, before, "15 changes are fewer than autocommit_blocks");
    dev.write(15 * BLOCK, Buf::from_slice(&[16; BLOCK as usize]), false).await.unwrap();
    eventually(&dev, "a commit after the 16th change", |s| s.commits == before + 1).await;
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
    dev.message("writeback_running off").await.unwrap();
    for b in 0..32u64 {
        dev.write(b * BLOCK, Buf::from_slice(&[7; BLOCK as usize]), false).await.unwrap();
    }
    eventually(&dev, "rate 0 while paused", |s| s.writeback_rate == Some(0.0) && s.dirty_blocks == 32).await;
    // Cleaner: flat out (null) until everything is written back.
    dev.message("cleaner on").await.unwrap();
    dev.message("writeback_running on").await.unwrap();
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

/// A log of 4 KiB blocks over a recording origin, without background write-back, every
/// slot holding a block of ones (blocks 0 to `slots - 1`).
async fn log_filled_with_ones() -> (WritecacheDev, Arc<strata_io::testing::Recording<MemDev>>, u64) {
    let origin = Arc::new(strata_io::testing::Recording::new(MemDev::new(8 << 20)));
    let cache = Arc::new(MemDev::new(256 << 10));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let o = OpenOptions { no_background: true, ..OpenOptions::default() };
    let dev = WritecacheDev::open(cache, origin.clone(), o).await.unwrap();
    let slots = status(&dev).blocks;
    for b in 0..slots {
        dev.write(b * BLOCK, Buf::from_slice(&[1; BLOCK as usize]), false).await.unwrap();
    }
    (dev, origin, slots)
}

/// With no room in the log, a write of several blocks goes to the origin as one write (the
/// logged copies of the blocks it covers whole are cleared, not written back), and reads back
/// right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_write_into_a_full_log_goes_around_as_one_origin_write() {
    let (dev, origin, slots) = log_filled_with_ones().await;
    assert_eq!(status(&dev).free_blocks, 0);
    origin.take();
    // 32 blocks from the last logged block on: one logged (superseded), 31 not.
    let at = (slots - 1) * BLOCK;
    let data = vec![7u8; 32 * BLOCK as usize];
    dev.write(at, Buf::from_slice(&data), true).await.unwrap();
    let (_, writes) = origin.take();
    assert_eq!(writes, [(at, 32 * BLOCK)], "one write, the logged block not written back");
    let s = status(&dev);
    assert_eq!((s.writes_around, s.free_blocks), (32, 1), "{s:?}");
    assert_eq!((s.writes_around_partial, s.writes_around_writebacks, s.writes_around_superseded), (0, 0, 1), "{s:?}");
    assert_eq!(dev.read(at, Buf::zeroed(data.len())).await.unwrap().to_vec(), data);
    assert_eq!(dev.read(0, Buf::zeroed(BLOCK as usize)).await.unwrap().to_vec(), [1; BLOCK as usize]);
    dev.check_state().unwrap();
}

/// A write around eight logged blocks clears them all with one commit, not one commit per
/// block (and writes none of them back: it covers them whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_around_logged_blocks_clears_them_with_one_commit() {
    let (dev, origin, _) = log_filled_with_ones().await;
    dev.flush().await.unwrap();
    origin.take();
    let commits = status(&dev).commits;
    let data = vec![9u8; 8 * BLOCK as usize];
    dev.write(0, Buf::from_slice(&data), false).await.unwrap();
    let (_, writes) = origin.take();
    assert_eq!(writes, [(0, 8 * BLOCK)], "the write alone");
    assert_eq!(status(&dev).commits, commits + 1, "one commit clears the eight");
    assert_eq!(dev.read(0, Buf::zeroed(data.len())).await.unwrap().to_vec(), data);
    dev.check_state().unwrap();
}

/// A log of `slots` blocks of 4 KiB over a recording origin, filled with blocks 0, 2, 4, …
/// (none adjacent, so each is a run of its own) while write-back is off, then with the
/// background task free to write back.
async fn full_log_of_scattered_blocks(
    settings: &[&str],
) -> (WritecacheDev, Arc<strata_io::testing::Recording<MemDev>>, u64) {
    full_log_opened_with(settings, OpenOptions::default()).await
}

async fn full_log_opened_with(
    settings: &[&str],
    o: OpenOptions,
) -> (WritecacheDev, Arc<strata_io::testing::Recording<MemDev>>, u64) {
    use strata_io::testing::Recording;
    let origin = Arc::new(Recording::new(MemDev::new(8 << 20)));
    let cache = Arc::new(MemDev::new(1 << 20));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let dev = WritecacheDev::open(cache, origin.clone(), o).await.unwrap();
    dev.message("writeback_running off").await.unwrap();
    for m in settings {
        dev.message(m).await.unwrap();
    }
    let slots = status(&dev).blocks;
    for i in 0..slots {
        dev.write(2 * i * BLOCK, Buf::from_slice(&[i as u8; BLOCK as usize]), false).await.unwrap();
    }
    assert_eq!(status(&dev).free_blocks, 0);
    origin.take();
    (dev, origin, slots)
}

/// A stream going around a full log pauses write-back for `pause_writeback` after it (the
/// stream has the origin to itself), a single-block write around does not, and with no pause
/// set write-back goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_around_a_full_log_pauses_write_back_for_pause_writeback() {
    let (dev, origin, slots) = full_log_of_scattered_blocks(&["pause_writeback 600000"]).await;
    // One block around the log: no pause.
    let past = 2 * slots + 8;
    dev.write(past * BLOCK, Buf::from_slice(&[9; BLOCK as usize]), false).await.unwrap();
    assert_eq!(status(&dev).writeback_held.as_deref(), Some("writeback_running is off"), "not paused by a stream");
    // A stream of 64 KiB past the logged blocks: held for ten minutes.
    dev.write((past + 1) * BLOCK, Buf::from_slice(&[8; 16 * BLOCK as usize]), false).await.unwrap();
    assert_eq!(status(&dev).writes_around, 17);
    assert_eq!(origin.take().1, [(past * BLOCK, BLOCK), ((past + 1) * BLOCK, 16 * BLOCK)]);
    dev.message("writeback_running on").await.unwrap();
    let held = status(&dev).writeback_held.expect("held after a stream");
    assert!(held.contains("pause_writeback"), "{held}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let s = status(&dev);
    assert_eq!((s.writebacks, s.dirty_blocks, s.writeback_rate), (0, slots, Some(0.0)), "{s:?}");
    assert!(origin.writes().is_empty(), "nothing written back: {:?}", origin.writes());
    // No pause: write-back runs again.
    dev.message("pause_writeback 0").await.unwrap();
    eventually(&dev, "write-back after the pause is lifted", |s| s.writebacks > 0 && s.writeback_held.is_none()).await;
}

/// Only a stream going around the log starts the pause: with write-back on (and no background
/// task to write back), writes of one and of four blocks around it leave it unpaused, 16
/// blocks pause it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_block_around_the_log_does_not_pause_write_back_and_a_stream_does() {
    let o = OpenOptions { no_background: true, ..OpenOptions::default() };
    let (dev, _origin, slots) = full_log_opened_with(&["pause_writeback 600000"], o).await;
    dev.message("writeback_running on").await.unwrap();
    let past = 2 * slots + 8;
    dev.write(past * BLOCK, Buf::from_slice(&[9; BLOCK as usize]), false).await.unwrap();
    assert_eq!(status(&dev).writes_around, 1);
    assert_eq!(status(&dev).writeback_held, None, "one block is not a stream");
    dev.write((past + 1) * BLOCK, Buf::from_slice(&[7; 4 * BLOCK as usize]), false).await.unwrap();
    assert_eq!(status(&dev).writes_around, 5);
    assert_eq!(status(&dev).writeback_held, None, "nor are four");
    dev.write((past + 5) * BLOCK, Buf::from_slice(&[8; 16 * BLOCK as usize]), false).await.unwrap();
    let held = status(&dev).writeback_held.expect("held after a stream");
    assert!(held.contains("pause_writeback"), "{held}");
}

/// A paced write-back batch in progress stops at its next run once a stream waits to go
/// around the log, rather than writing its other runs first: the stream's origin write comes
/// right after the runs in flight and the logged copies of its own blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_batch_yields_to_a_waiting_stream_at_its_next_run() {
    let (dev, origin, _) = full_log_of_scattered_blocks(&["pause_writeback 600000"]).await;
    let dev = Arc::new(dev);
    origin.hold_writes(true);
    dev.message("writeback_running on").await.unwrap();
    // The batch's first runs (blocks 0, 2, …: a few at once) are issued and held.
    let deadline = Instant::now() + Duration::from_secs(10);
    while origin.writes().is_empty() {
        assert!(Instant::now() < deadline, "no write-back started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(origin.writes()[0], (0, BLOCK));
    // A stream over blocks 1..=16 (8 of them logged, in the batch) waits for the batch.
    let stream = {
        let dev = dev.clone();
        tokio::spawn(async move { dev.write(BLOCK, Buf::from_slice(&[5; 16 * BLOCK as usize]), false).await })
    };
    while status(&dev).writeback_held.is_none() {
        assert!(Instant::now() < deadline, "the stream never registered");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    origin.hold_writes(false);
    stream.await.unwrap().unwrap();
    let writes = origin.writes();
    let at = writes.iter().position(|&w| w == (BLOCK, 16 * BLOCK)).expect("the stream's write");
    assert!(
        writes[..at].iter().all(|&(o, _)| o <= 16 * BLOCK),
        "only the runs in flight and the stream's own blocks go first: {:?}",
        &writes[..at]
    );
    assert_eq!(dev.read(BLOCK, Buf::zeroed(16 * BLOCK as usize)).await.unwrap().to_vec(), [5; 16 * BLOCK as usize]);
    dev.check_state().unwrap();
}

/// Tunables set live are kept in the superblock and taken again at the next open; options
/// given at open win; a torn copy reads as the defaults and the log still opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunables_set_live_are_kept_across_a_reopen() {
    let origin = Arc::new(MemDev::new(4 << 20));
    let cache = Arc::new(MemDev::new(1 << 20));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let o = || OpenOptions { no_background: true, ..OpenOptions::default() };
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), o()).await.unwrap();
    for m in ["low_watermark 10", "pause_writeback 250", "writeback_running off", "max_age 900"] {
        dev.message(m).await.unwrap();
    }
    let set = status(&dev).tunables;
    drop(dev);
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), o()).await.unwrap();
    assert_eq!(status(&dev).tunables, set);
    let t = status(&dev).tunables;
    assert_eq!((t.low_watermark, t.pause_writeback_ms, t.writeback_running, t.max_age_ms), (10, 250, false, 900));
    drop(dev);
    let given = strata_writecache::Tunables::default();
    let dev =
        WritecacheDev::open(cache.clone(), origin.clone(), OpenOptions { tunables: Some(given), ..o() }).await.unwrap();
    assert_eq!(status(&dev).tunables, given);
    drop(dev);
    // Tear the settings sector (the superblock's last).
    let mut sb = cache.read(0, Buf::zeroed(4096)).await.unwrap().to_vec();
    sb[4096 - 500] ^= 0xff;
    cache.write(0, Buf::from_slice(&sb), false).await.unwrap();
    let dev = WritecacheDev::open(cache, origin, o()).await.unwrap();
    assert_eq!(status(&dev).tunables, strata_writecache::Tunables::default());
}

/// A request of whole blocks goes to the log together: consecutive free slots take one write
/// of the fast device, not one write per block, and the blocks read back from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_blocks_of_one_request_go_to_the_log_in_one_write() {
    use strata_io::testing::Recording;
    let origin = Arc::new(MemDev::new(8 << 20));
    let cache = Arc::new(Recording::new(MemDev::new(1 << 20)));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let o = OpenOptions { no_background: true, ..OpenOptions::default() };
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), o).await.unwrap();
    cache.take();
    // A partial head block, 16 whole blocks, a partial tail block.
    let at = 3 * BLOCK + 512;
    let data: Vec<u8> = (0..(17 * BLOCK) as usize).map(|i| (i % 251) as u8).collect();
    dev.write(at, Buf::from_slice(&data), false).await.unwrap();
    let (_, writes) = cache.take();
    assert_eq!(writes.len(), 3, "head, the 16 whole blocks at once, tail: {writes:?}");
    assert_eq!(writes.iter().filter(|&&(_, n)| n == 16 * BLOCK).count(), 1, "{writes:?}");
    let s = status(&dev);
    assert_eq!((s.write_misses, s.dirty_blocks, s.writes_around), (18, 18, 0), "{s:?}");
    assert_eq!(dev.read(at, Buf::zeroed(data.len())).await.unwrap().to_vec(), data);
    dev.check_state().unwrap();
}
