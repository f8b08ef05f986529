//! Reads kept in the log (`readahead`): a read that misses keeps its aligned window as clean
//! copies in free slots above the reserve, never in the reserve and never by evicting; later
//! reads of the window are hits; a write to a kept block replaces it; kept copies leave no
//! entry, so a reopen starts without them and reads the same data; an origin error outside
//! the blocks read fails nothing; `readahead 0` keeps nothing, as dm-writecache. Block
//! status shows logged blocks as data and the origin's holes elsewhere.

use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf};
use strata_writecache::offline::{create, CreateOptions};
use strata_writecache::{OpenOptions, WritecacheDev, WritecacheStatus};

const BLOCK: usize = 4096;
/// Blocks of one 64 KiB window.
const WINDOW: u64 = 16;

fn status(dev: &WritecacheDev) -> WritecacheStatus {
    serde_json::from_value(dev.status().unwrap()).unwrap()
}

fn opts() -> OpenOptions {
    OpenOptions { no_background: true, ..OpenOptions::default() }
}

/// A log over an origin whose block `b` holds bytes `b % 251 + 1`, with a 64 KiB readahead.
async fn log() -> (WritecacheDev, Arc<MemDev>, Arc<MemDev>) {
    let origin = Arc::new(MemDev::new(4 << 20));
    for b in 0..(4 << 20) / BLOCK as u64 {
        origin.write(b * BLOCK as u64, Buf::from_slice(&[fill(b); BLOCK]), false).await.unwrap();
    }
    let cache = Arc::new(MemDev::new(512 << 10));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), opts()).await.unwrap();
    dev.message(&format!("readahead {}", WINDOW as usize * BLOCK)).await.unwrap();
    (dev, cache, origin)
}

fn fill(b: u64) -> u8 {
    (b % 251 + 1) as u8
}

async fn read_block(dev: &dyn BlockDev, b: u64) -> u8 {
    let got = dev.read(b * BLOCK as u64, Buf::zeroed(BLOCK)).await.unwrap();
    assert!(got.iter().all(|&x| x == got[0]), "block {b} is torn");
    got[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_miss_keeps_its_window_above_the_reserve_and_later_reads_hit() {
    let (dev, _, _) = log().await;
    let s0 = status(&dev);
    let reserve = (s0.blocks * (100 - s0.tunables.high_watermark as u64)).div_ceil(100);
    assert_eq!(read_block(&dev, 21).await, fill(21));
    let s = status(&dev);
    assert_eq!((s.reads_kept, s.read_misses, s.free_blocks), (WINDOW, 1, s0.blocks - WINDOW), "{s:?}");
    // Every block of the window 16..32 now hits, with its own data.
    for b in 16..32 {
        assert_eq!(read_block(&dev, b).await, fill(b), "block {b}");
    }
    assert_eq!(status(&dev).read_hits, WINDOW);
    // Reads of many more windows fill the slots above the reserve and no more.
    for w in 2..40u64 {
        read_block(&dev, w * WINDOW).await;
    }
    let s = status(&dev);
    assert_eq!((s.free_blocks, s.reads_kept, s.evictions), (reserve, s0.blocks - reserve, 0), "{s:?}");
    dev.check_state().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_replaces_a_kept_block_and_a_reopen_forgets_kept_blocks() {
    let (dev, cache, origin) = log().await;
    read_block(&dev, 5).await;
    dev.write(5 * BLOCK as u64, Buf::from_slice(&[0xee; BLOCK]), false).await.unwrap();
    // A partial write merges with the kept copy.
    dev.write(6 * BLOCK as u64 + 512, Buf::from_slice(&[0xdd; 512]), false).await.unwrap();
    assert_eq!(read_block(&dev, 5).await, 0xee);
    let six = dev.read(6 * BLOCK as u64, Buf::zeroed(BLOCK)).await.unwrap();
    assert!(six[..512].iter().all(|&x| x == fill(6)) && six[512..1024].iter().all(|&x| x == 0xdd));
    assert_eq!(read_block(&dev, 7).await, fill(7));
    dev.flush().await.unwrap();
    dev.check_state().unwrap();
    let blocks = status(&dev).blocks;
    drop(dev);
    let dev = WritecacheDev::open(cache, origin, opts()).await.unwrap();
    dev.check_state().unwrap();
    // Only the two written blocks came back from the log.
    assert_eq!(status(&dev).free_blocks, blocks - 2);
    assert_eq!(read_block(&dev, 5).await, 0xee);
    assert_eq!(read_block(&dev, 7).await, fill(7));
    let six = dev.read(6 * BLOCK as u64, Buf::zeroed(BLOCK)).await.unwrap();
    assert!(six[1024..].iter().all(|&x| x == fill(6)) && six[512..1024].iter().all(|&x| x == 0xdd));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_0_keeps_nothing() {
    let (dev, _, _) = log().await;
    dev.message("readahead 0").await.unwrap();
    for b in [3, 4, 100] {
        assert_eq!(read_block(&dev, b).await, fill(b));
    }
    let s = status(&dev);
    assert_eq!((s.reads_kept, s.read_hits, s.read_misses, s.free_blocks), (0, 0, 3, s.blocks), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_error_elsewhere_in_the_window_fails_no_read() {
    use strata_io::fault::{FaultDev, Rule};
    let (origin, faults) = FaultDev::new(MemDev::new(1 << 20));
    let origin = Arc::new(origin);
    origin.write(9 * BLOCK as u64, Buf::from_slice(&[9; BLOCK]), false).await.unwrap();
    let cache = Arc::new(MemDev::new(512 << 10));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let dev = WritecacheDev::open(cache, origin, opts()).await.unwrap();
    dev.message(&format!("readahead {}", WINDOW as usize * BLOCK)).await.unwrap();
    faults.add(Rule::read_error(12 * BLOCK as u64..13 * BLOCK as u64).always());
    assert_eq!(read_block(&dev, 9).await, 9);
    let err = dev.read(12 * BLOCK as u64, Buf::zeroed(BLOCK)).await.unwrap_err();
    assert_eq!(err.kind, strata_io::ErrorKind::Io, "{err}");
    let s = status(&dev);
    assert_eq!((s.reads_kept, s.free_blocks), (0, s.blocks), "{s:?}");
    dev.check_state().unwrap();
}

/// Block status (`base:allocation`): a block the log holds is data, the rest of the range is
/// as the origin says, holes included, so a copy can skip the blocks never written.
#[tokio::test]
async fn block_status_shows_logged_blocks_as_data_and_the_origins_holes() {
    const MIB: u64 = 1 << 20;
    let (origin, cache) = (Arc::new(MemDev::new(16 * MIB)), Arc::new(MemDev::new(MIB)));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let dev = WritecacheDev::open(cache, origin, opts()).await.unwrap();
    dev.write(5 * MIB, Buf::from_slice(&[7u8; BLOCK]), false).await.unwrap();
    let got = dev.block_status(0, 16 * MIB).await.unwrap();
    let at = |off: u64| strata_io::testing::extent_at(&got, off);
    assert!(at(0).hole && at(15 * MIB).hole, "never written, on the origin as in the log: {got:?}");
    assert_eq!(at(5 * MIB), strata_io::Extent::data(BLOCK as u64), "{got:?}");
    assert_eq!(got.iter().map(|e| e.len).sum::<u64>(), 16 * MIB, "{got:?}");
}
