//! Acknowledged writes survive, in every mode: each test drives the cache target into one
//! of the write paths that used to lose or resurrect data, cuts the power to its cache device
//! and origin together (`PowerCut` on one `Clock`), and recovers from the images a cut could
//! leave, for many seeds. Besides the value read, every test checks that the recovered cache
//! is stable: each clean slot equals its origin block, and a block reads the same before and
//! after the cache drops its clean copy.

mod common;

use common::until;
use std::sync::Arc;
use std::time::Duration;
use strata_cache::meta::Meta;
use strata_cache::{offline::create, CreateOptions};
use strata_cache::{CacheDev, OpenOptions};
use strata_io::fault::{FaultDev, Faults, Ops, Rule};
use strata_io::mem::MemDev;
use strata_io::powercut::{Clock, PowerCut};
use strata_io::{BlockDev, BoxFut, Buf, Extent, Geometry, Result, ZeroFlags};

const BLOCK: u64 = 32 << 10;
const ORIGIN: u64 = 4 << 20;
const CACHE: u64 = 2 << 20;
const SEEDS: u64 = 20;
/// The block every test works on.
const B: u64 = 5;

type Dev = PowerCut<FaultDev<MemDev>>;

struct Rig {
    dev: Arc<CacheDev>,
    origin: Arc<Dev>,
    cache: Arc<Dev>,
    origin_faults: Faults,
    cache_faults: Faults,
    /// The cache device's data area (its slots).
    data: std::ops::Range<u64>,
}

/// A cache in `mode` (policy lru: every miss is promoted; no readahead, no background
/// write-back) over an origin whose block `B` holds `fill(1)`.
async fn rig(mode: &str) -> Rig {
    let clock = Clock::default();
    let (origin, origin_faults) = FaultDev::new(MemDev::new(ORIGIN));
    let origin = Arc::new(PowerCut::with_clock(origin, clock.clone()));
    origin.write(B * BLOCK, Buf::from_slice(&fill(1)), true).await.unwrap();
    let (cache, cache_faults) = FaultDev::new(MemDev::new(CACHE));
    let cache = Arc::new(PowerCut::with_clock(cache, clock));
    let o = CreateOptions {
        block_bytes: BLOCK as u32,
        mode: mode.parse().unwrap(),
        policy: "lru".into(),
        migration_budget_bytes_per_s: 0,
        writeback_percent: 100,
        sequential_cutoff_bytes: 0,
        readahead_bytes: 0,
        origin_spec: "mem:durability".into(),
        ..CreateOptions::default()
    };
    let sb = create(&*cache, &*origin, &o).await.unwrap();
    let (meta, _) = Meta::load(&*cache).await.unwrap();
    let dev = CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap();
    let data = sb.data_offset..sb.data_offset + sb.slots * BLOCK;
    Rig { dev: Arc::new(dev), origin, cache, origin_faults, cache_faults, data }
}

fn fill(v: u8) -> Vec<u8> {
    vec![v; BLOCK as usize]
}

async fn read_block(dev: &CacheDev, b: u64) -> Vec<u8> {
    dev.read(b * BLOCK, Buf::zeroed(BLOCK as usize)).await.unwrap().to_vec()
}

async fn write_block(dev: &CacheDev, b: u64, v: u8, fua: bool) {
    dev.write(b * BLOCK, Buf::from_slice(&fill(v)), fua).await.unwrap();
}

/// Waits until the cache maps `n` blocks (read promotions finish in the background).
async fn until_cached(dev: &CacheDev, n: u64) {
    until(&format!("the cache to hold {n} blocks"), || dev.status().unwrap()["cached_blocks"] == n).await;
}

/// What block `B` reads as after the power is cut now and the cache recovered from the
/// images `seed` picks, for each seed; panics if a recovered cache is unstable.
async fn cut(r: Rig) -> Vec<Vec<u8>> {
    r.origin.power_off();
    r.cache.power_off();
    let (origin, cache) = (r.origin, r.cache);
    drop(r.dev);
    let mut seen = Vec::new();
    for seed in 0..SEEDS {
        let o = Arc::new(origin.crash(seed));
        let c = Arc::new(cache.crash(seed + 1000));
        let (meta, findings) = Meta::load(&*c).await.unwrap();
        assert!(findings.errors.is_empty(), "seed {seed}: {:?}", findings.errors);
        let dev = CacheDev::open(c, o, meta, OpenOptions::default()).await.unwrap();
        let differ = dev.verify_clean().await.unwrap();
        assert!(differ.is_empty(), "seed {seed}: clean slots differ from the origin for blocks {differ:?}");
        let first = read_block(&dev, B).await;
        dev.message("invalidate").await.unwrap();
        assert_eq!(
            read_block(&dev, B).await,
            first,
            "seed {seed}: block {B} reads differently once its clean copy is dropped"
        );
        seen.push(first);
    }
    seen
}

fn assert_all(seen: &[Vec<u8>], allowed: &[u8], what: &str) {
    for (seed, data) in seen.iter().enumerate() {
        let v = data[0];
        assert!(
            data.iter().all(|&x| x == v) && allowed.contains(&v),
            "seed {seed}: {what}: block reads {v} (allowed {allowed:?})"
        );
    }
}

/// Hole 1: a FUA write to the origin committed nothing, so a dirty block's mapping that a
/// TRIM had removed in memory only came back over the FUA data after a cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fua_write_commits_the_unmap_before_it() {
    let r = rig("writeback").await;
    write_block(&r.dev, B, 2, false).await; // dirty in the cache
    r.dev.flush().await.unwrap();
    r.dev.message("mode writearound").await.unwrap();
    r.dev.discard(B * BLOCK, BLOCK).await.unwrap();
    write_block(&r.dev, B, 3, true).await; // around the cache, to the origin
    assert_all(&cut(r).await, &[3], "FUA write after a TRIM of a dirty block");
}

/// Hole 1, the clean case: a block evicted in memory only, then written FUA on the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fua_write_to_an_evicted_block_outlives_its_old_mapping() {
    let r = rig("writearound").await;
    read_block(&r.dev, B).await; // promoted clean
    until_cached(&r.dev, 1).await;
    r.dev.flush().await.unwrap();
    r.dev.message("invalidate").await.unwrap(); // unmapped in memory only
    write_block(&r.dev, B, 3, true).await;
    assert_all(&cut(r).await, &[3], "FUA write after an eviction");
}

/// Hole 2: in writethrough a FUA write to a clean cached block left the cache copy
/// unflushed under a durable clean mapping (old data after a cut in 9 of 20 cuts); with a
/// TRIM first, the old mapping came back in 20 of 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writethrough_fua_write_to_a_clean_block_survives() {
    for trim_first in [false, true] {
        let r = rig("writethrough").await;
        read_block(&r.dev, B).await;
        until_cached(&r.dev, 1).await;
        r.dev.flush().await.unwrap();
        if trim_first {
            r.dev.discard(B * BLOCK, BLOCK).await.unwrap();
        }
        write_block(&r.dev, B, 4, true).await;
        assert_all(&cut(r).await, &[4], &format!("writethrough FUA write (trim first: {trim_first})"));
    }
}

/// Hole 3: WRITE_ZEROES of a dirty block unmapped it before the origin was zeroed; a commit
/// meanwhile made the unmap durable, and a cut then exposed origin data older than the
/// flushed write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_zeroes_on_a_dirty_block_never_exposes_older_data() {
    let r = rig("writeback").await;
    write_block(&r.dev, B, 5, false).await;
    r.dev.flush().await.unwrap();
    r.origin_faults
        .add(Rule::delay(Ops::ZERO | Ops::WRITE, Duration::from_millis(300)).range(B * BLOCK..(B + 1) * BLOCK));
    let dev = r.dev.clone();
    let zeroing = tokio::spawn(async move { dev.write_zeroes(B * BLOCK, BLOCK, ZeroFlags::default()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    r.dev.flush().await.unwrap(); // a commit while the zeroes are on their way
    let seen = cut(r).await;
    zeroing.abort();
    assert_all(&seen, &[5, 0], "write-zeroes in flight over a flushed dirty block");
}

/// A dirty block whose slot the cache device refuses, freed by a whole-block write to the
/// origin (the first write the slot refuses, or one after a refused partial write put the
/// volume in writethrough): the slot's mapping may go only once the origin holds the write
/// durably, FUA or not; else a cut leaves the origin's data from before the flushed dirty
/// write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_dirty_slot_goes_only_once_the_origin_holds_its_block() {
    for (fua, after_partial) in [(false, false), (true, false), (false, true), (true, true)] {
        let r = rig("writeback").await;
        write_block(&r.dev, B, 2, false).await;
        r.dev.flush().await.unwrap(); // 2 is durable, in the slot alone
        r.cache_faults.add(Rule::write_error(r.data.clone()).always());
        if after_partial {
            assert!(r.dev.write(B * BLOCK, Buf::from_slice(&fill(3)[..512]), false).await.is_err());
        }
        write_block(&r.dev, B, 4, fua).await; // to the origin; the slot goes
        assert_eq!(r.dev.status().unwrap()["dirty_blocks"], 0);
        let allowed: &[u8] = if fua { &[4] } else { &[2, 4] };
        let what =
            format!("a whole-block write freeing a refused slot (FUA: {fua}, after a partial one: {after_partial})");
        assert_all(&cut(r).await, allowed, &what);
    }
}

/// Hole 4: write-back dropped the block before its origin write, so a discard and a newer
/// write of the block could land first and be overwritten by the stale write-back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_back_in_flight_is_never_overtaken() {
    let r = rig("writeback").await;
    write_block(&r.dev, B, 6, false).await;
    let slow = r
        .origin_faults
        .add(Rule::delay(Ops::WRITE, Duration::from_millis(400)).range(B * BLOCK..(B + 1) * BLOCK).once());
    r.dev.message("flush").await.unwrap();
    until("write-back to start", || r.origin_faults.fired(slow) > 0).await;
    assert_eq!(r.origin_faults.fired(slow), 1, "write-back started once");
    r.dev.discard(B * BLOCK, BLOCK).await.unwrap();
    r.dev.message("mode writearound").await.unwrap();
    write_block(&r.dev, B, 7, false).await;
    tokio::time::sleep(Duration::from_millis(600)).await; // the write-back has landed
    assert_eq!(read_block(&r.dev, B).await, fill(7), "the newest write reads back");
    r.dev.message("invalidate").await.unwrap();
    assert_eq!(read_block(&r.dev, B).await, fill(7), "and it is what the origin holds");
}

/// Hole 5: a clean slot was overwritten in place (writeback) or written beside the origin
/// (writethrough) under a durable clean mapping; after a cut the slot and the origin differ,
/// so the block reads one way until its clean copy is dropped and another way after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_block_written_stays_stable_across_a_cut() {
    for mode in ["writeback", "writethrough"] {
        for whole in [true, false] {
            let r = rig(mode).await;
            read_block(&r.dev, B).await;
            until_cached(&r.dev, 1).await;
            r.dev.flush().await.unwrap();
            if whole {
                write_block(&r.dev, B, 8, false).await;
            } else {
                r.dev.write(B * BLOCK + 4096, Buf::from_slice(&[8; 4096]), false).await.unwrap();
            }
            // `cut` checks the stability; the value is either (nothing was flushed).
            let seen = cut(r).await;
            for (seed, data) in seen.iter().enumerate() {
                let new = data[4096] == 8;
                let expect: Vec<u8> = if !new {
                    fill(1)
                } else if whole {
                    fill(8)
                } else {
                    let mut v = fill(1);
                    v[4096..8192].fill(8);
                    v
                };
                assert!(*data == expect, "{mode}, whole {whole}, seed {seed}: neither the old nor the new data");
            }
        }
    }
}

/// Hole 6: a failed flush is latched: later flushes and writes fail even once the device
/// answers again (the data the failed flush covered may be gone), reads go on, the status
/// says why, and a restart recovers from what is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_flush_stops_acknowledging_until_restart() {
    let r = rig("writeback").await;
    write_block(&r.dev, B, 9, false).await;
    let id = r.origin_faults.add(Rule::flush_error().once());
    assert!(r.dev.flush().await.is_err());
    assert_eq!(r.origin_faults.fired(id), 1);
    assert!(r.dev.flush().await.is_err(), "a later flush must not claim what the failed one lost");
    assert!(r.dev.write(0, Buf::from_slice(&fill(1)), true).await.is_err(), "nor a FUA write");
    assert!(r.dev.write(0, Buf::from_slice(&fill(1)), false).await.is_err(), "writes are refused too");
    assert_eq!(read_block(&r.dev, B).await, fill(9), "reads go on");
    let status = r.dev.status().unwrap();
    assert!(status["stopped"].as_str().is_some_and(|s| s.contains("origin flush")), "{status}");
    // A restart recovers from what is durable and accepts writes again.
    let (origin, cache) = (r.origin.clone(), r.cache.clone());
    drop(r);
    let (meta, findings) = Meta::load(&*cache).await.unwrap();
    assert!(findings.errors.is_empty());
    let dev = CacheDev::open(cache, origin, meta, OpenOptions::default()).await.unwrap();
    write_block(&dev, B, 10, true).await;
    dev.flush().await.unwrap();
    assert_eq!(read_block(&dev, B).await, fill(10));
}

/// A device whose discard leaves the data in place, as the contract allows.
struct KeepOnDiscard(Arc<Dev>);

impl BlockDev for KeepOnDiscard {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    fn describe(&self) -> String {
        "keep-on-discard".into()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        self.0.write(offset, buf, fua)
    }
    fn flush(&self) -> BoxFut<'_, Result<()>> {
        self.0.flush()
    }
    fn discard(&self, _offset: u64, _len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        self.0.write_zeroes(offset, len, flags)
    }
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        self.0.block_status(offset, len)
    }
}

/// Hole 7: a whole-block discard was taken to zero the origin, so promoting the block
/// afterwards cached zeroes the origin never held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_is_not_taken_for_zeroes() {
    let r = rig("writeback").await;
    let origin: Arc<dyn BlockDev> = Arc::new(KeepOnDiscard(r.origin.clone()));
    let (meta, _) = Meta::load(&*r.cache).await.unwrap();
    drop(r.dev);
    let dev = CacheDev::open(r.cache.clone(), origin, meta, OpenOptions::default()).await.unwrap();
    dev.discard(B * BLOCK, BLOCK).await.unwrap();
    let first = read_block(&dev, B).await; // promoted
    until_cached(&dev, 1).await;
    assert_eq!(dev.verify_clean().await.unwrap(), Vec::<u64>::new(), "the cached copy is what the origin holds");
    dev.message("invalidate").await.unwrap();
    assert_eq!(read_block(&dev, B).await, first, "stable once the copy is dropped");
    // Write-zeroes does promise zeroes: a promotion after it needs no copy.
    dev.write_zeroes((B + 1) * BLOCK, BLOCK, ZeroFlags::default()).await.unwrap();
    assert_eq!(read_block(&dev, B + 1).await, fill(0));
}

/// A table page copy torn by a crash is rewritten by the first commit after recovery, not
/// left damaged until its page next changes (a second crash could tear the good copy too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_rewrites_a_torn_table_copy() {
    let r = rig("writeback").await;
    write_block(&r.dev, B, 2, true).await; // page 0 committed at least once more
    let (origin, cache) = (r.origin.clone(), r.cache.clone());
    drop(r);
    let (meta, _) = Meta::load(&*cache).await.unwrap();
    // Damage the copy of page 0 that does not hold its newest version.
    use strata_cache::format::{decode_page, PAGE};
    let (a, b) = (meta.layout.page_offset(0, 0), meta.layout.page_offset(0, 1));
    let page = |off: u64| {
        let cache = cache.clone();
        async move { cache.read(off, Buf::zeroed(PAGE)).await.unwrap().to_vec() }
    };
    let seq = |bytes: &[u8]| decode_page(0, bytes).map(|p| p.0).unwrap_or(0);
    let older = if seq(&page(a).await) >= seq(&page(b).await) { b } else { a };
    let mut torn = page(older).await;
    torn[100] ^= 0xff;
    cache.write(older, Buf::from_slice(&torn), true).await.unwrap();
    let (meta, findings) = Meta::load(&*cache).await.unwrap();
    assert_eq!(findings.repaired.len(), 1, "{:?}", findings.repaired);
    let dev = CacheDev::open(cache.clone(), origin, meta, OpenOptions::default()).await.unwrap();
    assert_eq!(read_block(&dev, B).await, fill(2));
    drop(dev);
    let (_, findings) = Meta::load(&*cache).await.unwrap();
    assert!(
        findings.repaired.is_empty() && findings.errors.is_empty(),
        "{:?} {:?}",
        findings.repaired,
        findings.errors
    );
}

/// A damaged table copy that no crash explains is an error, not a silent fall back to the
/// other copy (which may be older than what was acknowledged): a zeroed copy (both are
/// written when the cache is made, and a torn write never zeroes one), or any damaged copy
/// after a clean shutdown. A checksum failure after a crash stays a repair: its commit may
/// have been under way. `offline::repair` accepts the damage and rewrites both copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_table_copy_no_crash_explains_is_an_error() {
    use strata_cache::format::{decode_page, PAGE};
    for (case, clean, zero, both) in [
        ("flipped after a crash", false, false, false),
        ("zeroed after a crash", false, true, false),
        ("flipped after a clean shutdown", true, false, false),
        ("both copies flipped after a crash", false, false, true),
    ] {
        let r = rig("writeback").await;
        write_block(&r.dev, B, 2, true).await;
        if clean {
            r.dev.shutdown().await.unwrap();
        }
        let (origin, cache) = (r.origin.clone(), r.cache.clone());
        drop(r);
        let (meta, _) = Meta::load(&*cache).await.unwrap();
        let offsets = [meta.layout.page_offset(0, 0), meta.layout.page_offset(0, 1)];
        let mut copies = Vec::new();
        for off in offsets {
            copies.push(cache.read(off, Buf::zeroed(PAGE)).await.unwrap().to_vec());
        }
        let seq = |bytes: &[u8]| decode_page(0, bytes).map(|p| p.0).unwrap_or(0);
        let newer = usize::from(seq(&copies[1]) > seq(&copies[0]));
        let mut bad = copies[newer].clone();
        match zero {
            true => bad.fill(0),
            false => bad[100] ^= 0xff,
        }
        cache.write(offsets[newer], Buf::from_slice(&bad), true).await.unwrap();
        if both {
            let mut bad = copies[newer ^ 1].clone();
            bad[100] ^= 0xff;
            cache.write(offsets[newer ^ 1], Buf::from_slice(&bad), true).await.unwrap();
        }
        let (_, findings) = Meta::load(&*cache).await.unwrap();
        let want = if clean || zero || both { (1, 0) } else { (0, 1) };
        assert_eq!((findings.errors.len(), findings.repaired.len()), want, "{case}: {findings:?}");
        if findings.errors.is_empty() {
            continue;
        }
        let unmapped = strata_cache::offline::repair(&*cache).await.unwrap();
        assert_eq!(unmapped, 0, "{case}: no entry was wrong, a page copy was");
        let (meta, findings) = Meta::load(&*cache).await.unwrap();
        assert!(findings.errors.is_empty() && findings.repaired.is_empty(), "{case}: {findings:?}");
        let dev = CacheDev::open(cache.clone(), origin, meta, OpenOptions::default()).await.unwrap();
        let b = read_block(&dev, B).await;
        assert!(b == fill(1) || b == fill(2), "{case}: the origin's copy or the older mapping's");
        if both {
            assert_eq!(b, fill(1), "{case}: the page's mappings are gone: the origin's copy");
        }
    }
}
