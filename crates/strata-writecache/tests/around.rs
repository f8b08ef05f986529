//! Writes around a full log: a write that covers a whole logged block supersedes its copy
//! (no write-back, one commit to clear it, after the new data is durable on the origin); a
//! write that covers a logged block only in part writes the copy back first. Reads never see
//! the origin's older data while the write is in flight, and a power cut at any moment of it
//! leaves the old logged copy or the new data, never the origin's older data, and the new data
//! once the write is acknowledged.

use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_io::powercut::{Clock, PowerCut, Window};
use strata_io::testing::Recording;
use strata_io::{BlockDev, Buf, ZeroFlags};
use strata_writecache::offline::{create, CreateOptions};
use strata_writecache::{OpenOptions, WritecacheDev, WritecacheStatus};

const BLOCK: u64 = 4096;
const SECTOR: u64 = 512;
/// The block the tests write around; the log's other slots hold blocks after it.
const X: u64 = 3;

fn status(dev: &WritecacheDev) -> WritecacheStatus {
    serde_json::from_value(dev.status().unwrap()).unwrap()
}

fn opts() -> OpenOptions {
    OpenOptions { no_background: true, ..OpenOptions::default() }
}

/// A block of 8-byte `tag`s.
fn stamp(tag: u64, len: u64) -> Buf {
    let mut b = Buf::zeroed(len as usize);
    for chunk in b.chunks_mut(8) {
        chunk.copy_from_slice(&tag.to_le_bytes());
    }
    b
}

async fn read(dev: &dyn BlockDev, at: u64, len: u64) -> Vec<u8> {
    dev.read(at, Buf::zeroed(len as usize)).await.unwrap().to_vec()
}

/// Fills the log of `dev` (no background task): block `X` holds `a`, committed, and the other
/// slots blocks from `X + 8` on, so a write to `X` goes around the log.
async fn fill_with_x_logged(dev: &WritecacheDev, a: &[u8]) {
    dev.write(X * BLOCK, Buf::from_slice(a), false).await.unwrap();
    let slots = status(dev).blocks;
    for b in 1..slots {
        dev.write((X + 7 + b) * BLOCK, stamp(b, BLOCK), false).await.unwrap();
    }
    dev.flush().await.unwrap();
    let s = status(dev);
    assert_eq!((s.free_blocks, s.dirty_blocks), (0, slots), "{s:?}");
}

/// A log over a recording origin with block `X` logged dirty and committed, the log full.
async fn full_log_over_recording() -> (WritecacheDev, Arc<Recording<MemDev>>) {
    let origin = Arc::new(Recording::new(MemDev::new(8 << 20)));
    let cache = Arc::new(MemDev::new(256 << 10));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let dev = WritecacheDev::open(cache, origin.clone(), opts()).await.unwrap();
    fill_with_x_logged(&dev, &[1; BLOCK as usize]).await;
    origin.take();
    (dev, origin)
}

/// A whole-block write around a dirty logged block: the origin gets the write and nothing
/// else (the old copy is not written back), one commit clears the copy, and the block reads
/// the new data, also after a reopen and after a full write-back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_block_write_around_a_dirty_logged_block_writes_nothing_back() {
    for blocks in [1u64, 2] {
        let (dev, origin) = full_log_over_recording().await;
        let before = status(&dev);
        let data = vec![9u8; (blocks * BLOCK) as usize];
        dev.write(X * BLOCK, Buf::from_slice(&data), false).await.unwrap();
        let (_, writes) = origin.take();
        assert_eq!(writes, [(X * BLOCK, blocks * BLOCK)], "{blocks} blocks: only the write itself");
        let s = status(&dev);
        assert_eq!(s.writes_around, before.writes_around + blocks, "{s:?}");
        assert_eq!((s.writes_around_superseded, s.writes_around_writebacks, s.writebacks), (1, 0, 0), "{s:?}");
        assert_eq!(s.commits, before.commits + 1, "one commit clears the copy: {s:?}");
        assert_eq!(s.dirty_blocks, before.dirty_blocks - 1, "{s:?}");
        assert_eq!(read(&dev, X * BLOCK, blocks * BLOCK).await, data);
        dev.check_state().unwrap();
        dev.writeback_all().await.unwrap();
        assert_eq!(read(&dev, X * BLOCK, blocks * BLOCK).await, data, "after write-back");
        assert_eq!(read(&origin.inner, X * BLOCK, blocks * BLOCK).await, data, "on the origin");
    }
}

/// A write around that covers a dirty logged block only in part writes that block's copy back
/// first (it holds the rest of the block), then the request; the block reads both merged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_block_write_around_writes_the_logged_copy_back_first() {
    let (dev, origin) = full_log_over_recording().await;
    // From the second half of block X to the first half of X + 1 (not logged).
    let at = X * BLOCK + BLOCK / 2;
    let data = vec![9u8; BLOCK as usize];
    dev.write(at, Buf::from_slice(&data), false).await.unwrap();
    let (_, writes) = origin.take();
    assert_eq!(writes, [(X * BLOCK, BLOCK), (at, BLOCK)], "the copy goes back, then the write");
    let s = status(&dev);
    assert_eq!((s.writes_around_partial, s.writes_around_writebacks, s.writes_around_superseded), (2, 1, 0), "{s:?}");
    let mut want = vec![1u8; (BLOCK / 2) as usize];
    want.extend(&data);
    want.extend(vec![0u8; (BLOCK / 2) as usize]);
    assert_eq!(read(&dev, X * BLOCK, 2 * BLOCK).await, want);
    dev.check_state().unwrap();
}

/// While a whole-block write around a logged block is on its way to the origin, reads of the
/// block get the logged copy, never the origin's older data; once it is acknowledged, the new
/// data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_during_a_write_around_never_see_the_origin_s_older_data() {
    for blocks in [1u64, 2] {
        let (dev, origin) = full_log_over_recording().await;
        let dev = Arc::new(dev);
        origin.hold_writes(true);
        let data = vec![9u8; (blocks * BLOCK) as usize];
        let write = {
            let (dev, data) = (dev.clone(), data.clone());
            tokio::spawn(async move { dev.write(X * BLOCK, Buf::from_slice(&data), false).await.unwrap() })
        };
        while origin.writes().is_empty() {
            tokio::task::yield_now().await;
        }
        // The origin write is issued and held: the block still reads the logged copy.
        for _ in 0..3 {
            assert_eq!(read(&*dev, X * BLOCK, BLOCK).await, [1; BLOCK as usize], "{blocks} blocks, write in flight");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        origin.hold_writes(false);
        write.await.unwrap();
        assert_eq!(read(&*dev, X * BLOCK, blocks * BLOCK).await, data);
    }
}

/// A run to cut: the devices, and the ticks at which the write around was issued and
/// acknowledged.
struct Cut {
    origin: Arc<PowerCut<MemDev>>,
    cache: Arc<PowerCut<MemDev>>,
    issued: u64,
    done: u64,
}

const OLD: u64 = 0x01d;
const LOGGED: u64 = 0xa;
const NEW: u64 = 0xb;

/// How the write around is made.
#[derive(Debug, Clone, Copy)]
enum Around {
    Write { blocks: u64, fua: bool },
    Zeroes,
}

/// One write around block `X` (logged, committed, dirty) over devices that lose power
/// together (`Window` `seed`), then the power goes off.
async fn write_around_then_cut(how: Around, seed: u64) -> Cut {
    let clock = Clock::default();
    let window = |s| Window { seed: s, max_delay: std::time::Duration::ZERO, ..Window::default() };
    let origin = Arc::new(PowerCut::with_clock(MemDev::new(1 << 20), clock.clone()).with_window(window(seed)));
    let cache = Arc::new(PowerCut::with_clock(MemDev::new(96 << 10), clock.clone()).with_window(window(seed + 1)));
    // The origin's own, older data, durable before the log is made.
    origin.write(X * BLOCK, stamp(OLD, 2 * BLOCK), false).await.unwrap();
    origin.flush().await.unwrap();
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), opts()).await.unwrap();
    fill_with_x_logged(&dev, &stamp(LOGGED, BLOCK)).await;
    let issued = clock.now();
    match how {
        Around::Write { blocks, fua } => {
            dev.write(X * BLOCK, stamp(NEW, blocks * BLOCK), fua).await.unwrap();
        }
        Around::Zeroes => dev.write_zeroes(X * BLOCK, BLOCK, ZeroFlags::default()).await.unwrap(),
    }
    let done = clock.now();
    assert_eq!(status(&dev).writes_around_writebacks, 0, "{how:?}: the logged copy was written back");
    origin.power_off();
    cache.power_off();
    Cut { origin, cache, issued, done }
}

/// The block tags (one per sector) the volume recovered from a cut at `tick` reads for
/// blocks `X` and `X + 1`.
async fn recovered(c: &Cut, tick: u64, seed: u64) -> Vec<u64> {
    let origin = c.origin.crash_at(c.origin.point_at_tick(tick).unwrap(), seed).unwrap();
    let cache = c.cache.crash_at(c.cache.point_at_tick(tick).unwrap(), seed + 7).unwrap();
    let dev = WritecacheDev::open(Arc::new(cache), Arc::new(origin), opts()).await.unwrap();
    dev.check_state().unwrap();
    let got = read(&dev, X * BLOCK, 2 * BLOCK).await;
    got.chunks(SECTOR as usize)
        .map(|s| {
            let tag = u64::from_le_bytes(s[..8].try_into().unwrap());
            assert!(s.chunks(8).all(|c| c == tag.to_le_bytes()), "tick {tick}: a sector is torn inside");
            tag
        })
        .collect()
}

/// A power cut while a whole-block write goes around a dirty logged copy leaves the logged
/// copy or the new data, never the origin's older data; from the acknowledgement on, the new
/// data (the copy's entry is cleared only after the new data is durable on the origin, and
/// before the write is acknowledged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_during_a_write_around_never_brings_back_an_older_copy() {
    let hows = [
        Around::Write { blocks: 1, fua: false },
        Around::Write { blocks: 1, fua: true },
        Around::Write { blocks: 2, fua: false },
        Around::Write { blocks: 2, fua: true },
        Around::Zeroes,
    ];
    let mut cuts = 0;
    for how in hows {
        let new = if matches!(how, Around::Zeroes) { 0 } else { NEW };
        let second = if let Around::Write { blocks: 2, .. } = how { vec![OLD, NEW] } else { vec![OLD] };
        for run in 0..4u64 {
            let c = write_around_then_cut(how, run * 100).await;
            assert!(c.done > c.issued + 2, "{how:?}: {} ticks", c.done - c.issued);
            for tick in c.issued..=c.done + 2 {
                for seed in 0..6 {
                    let tags = recovered(&c, tick, run * 1000 + tick * 10 + seed).await;
                    let per = (BLOCK / SECTOR) as usize;
                    let (x, next) = tags.split_at(per);
                    let allowed: &[u64] = if tick >= c.done { &[new] } else { &[LOGGED, new] };
                    assert!(
                        x.iter().all(|t| allowed.contains(t)),
                        "{how:?} run {run}: cut at tick {tick} ({} after the write was issued, acknowledged at {}): \
                         block X reads {x:x?}, allowed {allowed:x?}",
                        tick - c.issued,
                        c.done - c.issued
                    );
                    let allowed: &[u64] = if tick >= c.done { &second[second.len() - 1..] } else { &second };
                    assert!(next.iter().all(|t| allowed.contains(t)), "{how:?}: tick {tick}: X + 1 reads {next:x?}");
                    cuts += 1;
                }
            }
        }
    }
    assert!(cuts > 500, "{cuts} cuts");
}
