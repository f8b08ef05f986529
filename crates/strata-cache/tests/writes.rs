//! The write path's rules, counted on a recording origin: in writethrough and writearound a
//! partial write to an uncached block goes to the origin alone (no fill read); every mode
//! stays coherent when clients write parts of the same blocks while they are promoted and
//! invalidated; write-back goes in origin-address order, merging adjacent dirty blocks, and
//! writes keep succeeding when every block is dirty. Block status shows cached blocks as
//! data and the origin's holes elsewhere.

mod common;

use common::{until, wait_clean};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use strata_cache::meta::Meta;
use strata_cache::{offline::create, CreateOptions};
use strata_cache::{CacheDev, CacheStatus, Mode, OpenOptions};
use strata_io::mem::MemDev;
use strata_io::testing::{pattern, Recording};
use strata_io::{BlockDev, Buf};

const ORIGIN: u64 = 8 << 20;
const BLOCK: u32 = 32 << 10;

struct Rig {
    origin: Arc<MemDev>,
    recording: Arc<Recording<Arc<MemDev>>>,
    cache_dev: Arc<MemDev>,
}

async fn rig(mode: Mode, cache_bytes: u64, policy: &str) -> Rig {
    let origin = Arc::new(MemDev::new(ORIGIN));
    let cache_dev = Arc::new(MemDev::new(cache_bytes));
    let o = CreateOptions {
        block_bytes: BLOCK,
        mode,
        policy: policy.into(),
        migration_budget_bytes_per_s: 0,
        writeback_percent: 0,
        sequential_cutoff_bytes: 0,
        readahead_bytes: 0,
        origin_spec: "mem:test".into(),
        ..CreateOptions::default()
    };
    create(&*cache_dev, &*origin, &o).await.unwrap();
    Rig { recording: Arc::new(Recording::new(origin.clone())), origin, cache_dev }
}

async fn open(r: &Rig) -> Arc<CacheDev> {
    let (meta, findings) = Meta::load(&*r.cache_dev).await.unwrap();
    assert!(findings.errors.is_empty(), "{:?}", findings.errors);
    Arc::new(CacheDev::open(r.cache_dev.clone(), r.recording.clone(), meta, OpenOptions::default()).await.unwrap())
}

/// Writethrough and writearound: 4 KiB writes into blocks never cached read nothing from the
/// origin and write exactly the request there; whole-block writes in writethrough are still
/// cached (and then read back from the cache, not the origin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_write_misses_go_to_the_origin_alone() {
    for mode in [Mode::Writethrough, Mode::Writearound] {
        // lru promotes on first access: every write would be promoted if the rule allowed.
        let r = rig(mode, 4 << 20, "lru").await;
        let dev = open(&r).await;
        r.recording.take();
        for i in 0..64u64 {
            let at = i * 3 * BLOCK as u64 + (i % 8) * 4096;
            dev.write(at, pattern(i, at, 4096), i % 5 == 0).await.unwrap();
        }
        let (reads, writes) = r.recording.take();
        assert!(reads.is_empty(), "{mode:?}: partial writes read the origin: {reads:?}");
        assert_eq!(writes.len(), 64, "{mode:?}: one origin write per request");
        assert!(writes.iter().all(|&(_, n)| n == 4096), "{mode:?}: {writes:?}");
        let s = CacheStatus::of(&*dev).unwrap();
        assert_eq!((s.promotions, s.cached_blocks), (0, 0), "{mode:?}: {s:?}");
        if mode == Mode::Writethrough {
            assert_eq!(s.partial_writes_around, 64, "{s:?}");
            // A whole block is still cached on write, with no origin read.
            let at = 5 * BLOCK as u64;
            dev.write(at, pattern(99, at, BLOCK as usize), false).await.unwrap();
            let got = dev.read(at, Buf::zeroed(BLOCK as usize)).await.unwrap();
            assert!(got[..] == pattern(99, at, BLOCK as usize)[..]);
            let (reads, _) = r.recording.take();
            assert!(reads.is_empty(), "the whole-block write was cached: {reads:?}");
            assert_eq!(CacheStatus::of(&*dev).unwrap().promotions, 1);
        }
        // What the origin holds is what was written.
        let mut seen = vec![0u8; 4096];
        for i in 0..64u64 {
            let at = i * 3 * BLOCK as u64 + (i % 8) * 4096;
            r.origin.read_into(at, &mut seen).unwrap();
            assert!(seen[..] == pattern(i, at, 4096)[..], "{mode:?}: write {i}");
        }
        dev.check_invariants().unwrap();
    }
}

/// smq promotes a whole-block write miss at once only in writeback, as dm-cache's fast
/// promotion does: in writethrough it waits for its hotspot like a read (before smq's first
/// tick, nothing qualifies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smq_fast_promotion_is_for_writeback_only() {
    for (mode, promoted) in [(Mode::Writeback, 1), (Mode::Writethrough, 0)] {
        let r = rig(mode, 4 << 20, "smq").await;
        let dev = open(&r).await;
        let at = 3 * BLOCK as u64;
        dev.write(at, pattern(7, at, BLOCK as usize), false).await.unwrap();
        let s = CacheStatus::of(&*dev).unwrap();
        assert_eq!(s.promotions, promoted, "{mode:?}: {s:?}");
        dev.check_invariants().unwrap();
    }
}

/// Blocks shared by every client: client `c` owns the 4 KiB granules `g` with `g % CLIENTS
/// == c`, and writes parts of them (sub-granule, so always partial) while a reader promotes
/// whole blocks and a disturber invalidates clean copies, switches modes and flushes. Every client checks its own granules after each
/// write; at the end the whole region is compared, across a clean restart too.
const CLIENTS: u64 = 4;
const SHARED_BLOCKS: u64 = 40;
const GRANULE: u64 = 4096;

fn owner(offset: u64) -> u64 {
    (offset / GRANULE) % CLIENTS
}

async fn shared_blocks(mode: Mode, also: &[Mode], seed: u64) {
    // About 24 slots for 40 shared blocks: constant eviction.
    let r = rig(mode, 2 << 20, "strata").await;
    let dev = open(&r).await;
    let region = SHARED_BLOCKS * BLOCK as u64;
    let model = Arc::new(Mutex::new(vec![0u8; region as usize]));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (dev, model) = (dev.clone(), model.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(seed * 10 + c);
            for i in 0..150u64 {
                let granule = rng.gen_range(0..region / GRANULE / CLIENTS) * CLIENTS + c;
                let start = granule * GRANULE + rng.gen_range(0..8) * 512;
                let len = rng.gen_range(1..=(granule * GRANULE + GRANULE - start) / 512) * 512;
                let data = pattern(seed * 1000 + c * 100 + i, start, len as usize);
                dev.write(start, Buf::from_slice(&data), rng.gen_bool(0.1)).await.unwrap();
                model.lock()[start as usize..(start + len) as usize].copy_from_slice(&data);
                let at = granule * GRANULE;
                let got = dev.read(at, Buf::zeroed(GRANULE as usize)).await.unwrap();
                let want = model.lock()[at as usize..(at + GRANULE) as usize].to_vec();
                assert!(got[..] == want[..], "seed {seed} client {c} write {i}: granule {granule} differs");
            }
        }));
    }
    let reader = {
        let dev = dev.clone();
        tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(seed + 77);
            for _ in 0..300 {
                let b = rng.gen_range(0..SHARED_BLOCKS);
                dev.read(b * BLOCK as u64, Buf::zeroed(BLOCK as usize)).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let disturber = {
        let (dev, mut modes) = (dev.clone(), vec![mode]);
        modes.extend_from_slice(also);
        tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(seed + 99);
            for _ in 0..60 {
                tokio::time::sleep(std::time::Duration::from_millis(rng.gen_range(1..5))).await;
                match rng.gen_range(0..4) {
                    0 => drop(dev.message("invalidate").await.unwrap()),
                    1 => drop(dev.message(&format!("mode {}", modes[rng.gen_range(0..modes.len())].name())).await),
                    2 => drop(dev.message("flush").await.unwrap()),
                    _ => dev.flush().await.unwrap(),
                }
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    reader.await.unwrap();
    disturber.await.unwrap();
    dev.check_invariants().unwrap();
    let got = dev.read(0, Buf::zeroed(region as usize)).await.unwrap();
    let want = model.lock().clone();
    for (k, (a, b)) in got.chunks(GRANULE as usize).zip(want.chunks(GRANULE as usize)).enumerate() {
        assert!(a == b, "seed {seed}: granule {k} (client {}) differs at the end", owner(k as u64 * GRANULE));
    }
    dev.shutdown().await.unwrap();
    drop(dev);
    let dev = open(&r).await;
    let again = dev.read(0, Buf::zeroed(region as usize)).await.unwrap();
    assert!(again[..] == want[..], "seed {seed}: contents changed across a clean restart");
    dev.message("detach").await.unwrap();
    wait_clean(&dev).await;
    let mut origin_view = vec![0u8; region as usize];
    r.origin.read_into(0, &mut origin_view).unwrap();
    assert!(origin_view[..] == want[..], "seed {seed}: origin incomplete after detach");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writethrough_partial_writes_to_shared_blocks_stay_coherent() {
    for seed in 1..=3 {
        shared_blocks(Mode::Writethrough, &[], seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writearound_partial_writes_to_shared_blocks_stay_coherent() {
    for seed in 4..=6 {
        shared_blocks(Mode::Writearound, &[], seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switches_with_partial_writes_to_shared_blocks_stay_coherent() {
    for seed in 7..=9 {
        shared_blocks(Mode::Writeback, &[Mode::Writethrough, Mode::Writearound], seed).await;
    }
}

/// The dirty blocks the table on `cache_dev` records, ascending.
async fn dirty_in_table(cache_dev: &MemDev) -> Vec<u64> {
    let (meta, _) = Meta::load(cache_dev).await.unwrap();
    let mut d: Vec<u64> = meta.entries.iter().filter(|e| e.dirty).map(|e| e.origin_block).collect();
    d.sort_unstable();
    d
}

/// Write-back goes in origin-address order and merges adjacent dirty blocks: runs of 40, 16
/// and 1 dirty blocks written in a shuffled order reach the origin as ascending writes of
/// at most 32 blocks, one per 32 blocks of each run, and nothing else is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writeback_runs_in_address_order_and_merges_adjacent_blocks() {
    let r = rig(Mode::Writeback, 12 << 20, "lru").await;
    let dev = open(&r).await;
    let mut blocks: Vec<u64> = (10..50).chain(100..116).chain([200, 202, 204]).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for i in (1..blocks.len()).rev() {
        blocks.swap(i, rng.gen_range(0..=i));
    }
    let bs = BLOCK as u64;
    for &b in &blocks {
        dev.write(b * bs, pattern(b, b * bs, BLOCK as usize), false).await.unwrap();
    }
    dev.shutdown().await.unwrap();
    drop(dev);
    // What is dirty now (write-back may have started during the writes) is what the flush
    // below must write back.
    let dirty = dirty_in_table(&r.cache_dev).await;
    assert!(!dirty.is_empty());
    r.recording.take();
    let dev = open(&r).await;
    dev.message("flush").await.unwrap();
    wait_clean(&dev).await;
    let (_, writes) = r.recording.take();
    // The expected writes: each maximal run of adjacent dirty blocks, cut every 32 blocks.
    let mut want: Vec<(u64, u64)> = Vec::new();
    for &b in &dirty {
        match want.last_mut() {
            Some((start, n)) if *start + *n == b * bs && *n < 32 * bs => *n += bs,
            _ => want.push((b * bs, bs)),
        }
    }
    assert_eq!(writes, want, "dirty blocks {dirty:?}");
    assert!(writes.iter().any(|&(_, n)| n > bs), "adjacent blocks were merged");
    let s = CacheStatus::of(&*dev).unwrap();
    assert_eq!((s.writebacks, s.writeback_writes), (dirty.len() as u64, want.len() as u64), "{s:?}");
    assert_patterns_on_origin(&r, blocks);
}

/// Each of `blocks` holds its `pattern` on the origin.
fn assert_patterns_on_origin(r: &Rig, blocks: impl IntoIterator<Item = u64>) {
    let (bs, mut seen) = (BLOCK as u64, vec![0u8; BLOCK as usize]);
    for b in blocks {
        r.origin.read_into(b * bs, &mut seen).unwrap();
        assert!(seen[..] == pattern(b, b * bs, BLOCK as usize)[..], "block {b} on the origin");
    }
}

/// A flush goes flat out whatever the migration budget: at 1 byte a second a 64 KiB block
/// earned its write-back after 18 hours, and the flush never ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_is_not_held_to_the_migration_budget() {
    let r = rig(Mode::Writeback, 12 << 20, "lru").await;
    let dev = open(&r).await;
    // Dirty blocks the write-back target keeps (promoted while the budget is unlimited: a
    // write's promotion spends it too), then a budget of a byte a second.
    dev.message("writeback_percent 100").await.unwrap();
    let bs = BLOCK as u64;
    for b in 0..20u64 {
        dev.write(b * bs, pattern(b, b * bs, BLOCK as usize), false).await.unwrap();
    }
    dev.message("migration-budget 1").await.unwrap();
    assert_eq!(CacheStatus::of(&*dev).unwrap().dirty_blocks, 20, "the budget holds write-back back");
    dev.message("flush").await.unwrap();
    wait_clean(&dev).await;
    let s = CacheStatus::of(&*dev).unwrap();
    assert_eq!((s.writebacks, s.migration_budget_bytes_per_s), (20, 1), "{s:?}");
    assert_patterns_on_origin(&r, 0..20);
}

/// When every slot is dirty, writes keep succeeding (to the origin, at its pace) and read
/// back right, in writeback with a target that keeps everything dirty while busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_never_fail_when_every_block_is_dirty() {
    let r = rig(Mode::Writeback, 2 << 20, "strata").await;
    let dev = open(&r).await;
    dev.message("writeback_percent 100").await.unwrap();
    let bs = BLOCK as u64;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut model = vec![0u8; ORIGIN as usize];
    for i in 0..2000u64 {
        let b = rng.gen_range(0..ORIGIN / bs);
        let (at, len) = match rng.gen_bool(0.5) {
            true => (b * bs, bs),
            false => (b * bs + rng.gen_range(0..8) * 4096, 4096),
        };
        let data = pattern(i, at, len as usize);
        dev.write(at, Buf::from_slice(&data), false).await.unwrap();
        model[at as usize..(at + len) as usize].copy_from_slice(&data);
    }
    let got = dev.read(0, Buf::zeroed(ORIGIN as usize)).await.unwrap();
    assert!(got[..] == model[..], "contents differ");
    let s = CacheStatus::of(&*dev).unwrap();
    assert!(s.dirty_blocks > 0 && s.write_misses > s.cache_blocks, "{s:?}");
    dev.message("writeback_percent 0").await.unwrap();
    dev.message("flush").await.unwrap();
    wait_clean(&dev).await;
    let mut origin_view = vec![0u8; ORIGIN as usize];
    r.origin.read_into(0, &mut origin_view).unwrap();
    assert!(origin_view[..] == model[..], "origin incomplete after the flush");
    dev.check_invariants().unwrap();
}

/// A sequential stream past the cutoff over uncached blocks reaches the origin as the
/// client's large requests, not one request per cache block; where some blocks are cached,
/// the cached ones still come from the cache. Data checked against the origin throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_reads_past_the_cutoff_go_to_the_origin_whole() {
    let r = rig(Mode::Writethrough, 4 << 20, "lru").await;
    let dev = open(&r).await;
    dev.message("sequential_cutoff 1536KiB").await.unwrap();
    r.origin.write(0, pattern(7, 0, ORIGIN as usize), false).await.unwrap();
    // A block cached before the stream reaches it.
    let cached_at = 3 << 20;
    dev.read(cached_at, Buf::zeroed(BLOCK as usize)).await.unwrap();
    // Its promotion finishes in the background.
    until("the promotion", || CacheStatus::of(&dev).unwrap().cached_blocks == 1).await;
    r.recording.take();
    for i in 0..6u64 {
        let at = i << 20;
        let got = dev.read(at, Buf::zeroed(1 << 20)).await.unwrap();
        assert!(got[..] == pattern(7, 0, ORIGIN as usize)[at as usize..(at + (1 << 20)) as usize], "at {at}");
    }
    let (reads, _) = r.recording.take();
    let whole: Vec<u64> = reads.iter().filter(|&&(_, n)| n == 1 << 20).map(|&(at, _)| at).collect();
    // The first MiB counts towards the cutoff (read block by block); the MiB holding the
    // cached block is read block by block around it; the others whole.
    assert_eq!(whole, [1 << 20, 2 << 20, 4 << 20, 5 << 20], "{reads:?}");
    assert!(
        !reads.iter().any(|&(at, n)| at <= cached_at && cached_at < at + n),
        "the cached block came from the origin"
    );
}

/// The cutoff counts a write stream since the last flush: a journal-like stream that flushes
/// every 64 KiB (or writes its commit block with FUA) stays in the cache in writeback,
/// however far it runs; the same stream unflushed goes around the cache past the cutoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_flushed_every_few_blocks_stays_in_the_cache() {
    let r = rig(Mode::Writeback, 4 << 20, "lru").await;
    let dev = open(&r).await;
    dev.message("sequential_cutoff 256KiB").await.unwrap();
    let stream = |start: u64, sync_every: Option<(u64, bool)>| {
        let dev = dev.clone();
        async move {
            for i in 0..256u64 {
                let at = start + i * 4096;
                let fua = matches!(sync_every, Some((n, true)) if i % n == n - 1);
                dev.write(at, pattern(i, at, 4096), fua).await.unwrap();
                if matches!(sync_every, Some((n, false)) if i % n == n - 1) {
                    dev.flush().await.unwrap();
                }
            }
        }
    };
    stream(0, Some((16, false))).await;
    stream(1 << 20, Some((16, true))).await;
    let s = CacheStatus::of(&*dev).unwrap();
    assert_eq!(s.bypassed, 0, "flushed streams went around the cache: {s:?}");
    stream(2 << 20, None).await;
    let s = CacheStatus::of(&*dev).unwrap();
    assert!(s.bypassed > 100, "an unflushed 1 MiB stream stayed in the cache: {s:?}");
    dev.check_invariants().unwrap();
}

/// Keeps writing 4 KiB pieces of `hot` blocks (by number) for `busy`, one every 2 ms, and
/// then on until the volume's status is `done` (background write-back runs late on a loaded
/// machine), for at most five times `busy` in all.
async fn keep_writing(
    dev: &CacheDev,
    hot: std::ops::Range<u64>,
    busy: std::time::Duration,
    done: impl Fn(&CacheStatus) -> bool,
) {
    let (start, mut i) = (std::time::Instant::now(), 0u64);
    while start.elapsed() < busy || (!done(&CacheStatus::of(dev).unwrap()) && start.elapsed() < busy * 5) {
        let b = hot.start + i % (hot.end - hot.start);
        let at = b * BLOCK as u64 + (i * 4096) % BLOCK as u64;
        dev.write(at, pattern(i, at, 4096), false).await.unwrap();
        i += 1;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// On an idle origin, a volume whose writer keeps writing its dirty blocks gets write-back
/// only down to the target dirty share, of the blocks dirty longest (each block written back
/// would move to a new slot at its next write); once the volume has been quiet a while,
/// write-back drains it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_back_goes_below_the_target_only_on_a_quiet_volume() {
    let r = rig(Mode::Writeback, 4 << 20, "lru").await;
    let dev = open(&r).await;
    dev.message("writeback_percent 50").await.unwrap();
    // Below the target: nothing is written back while the writer goes on.
    keep_writing(&dev, 0..8, std::time::Duration::from_millis(2500), |_| true).await;
    let s = CacheStatus::of(&*dev).unwrap();
    assert_eq!((s.dirty_blocks, s.writebacks), (8, 0), "written back while the volume was busy: {s:?}");
    wait_clean(&dev).await;

    // Over the target (4 blocks of 8 dirty ones): the four dirty longest, not written since,
    // are written back; the four the writer keeps writing stay dirty.
    let slots = s.cache_blocks;
    dev.message(&format!("writeback_percent {}", 100 * 4 / slots + 1)).await.unwrap();
    let target = (slots * (100 * 4 / slots + 1)) as f64 / 100.0;
    assert!((4.0..5.0).contains(&target), "{target} of {slots}");
    for b in (8..12).chain(0..4) {
        let at = b * BLOCK as u64;
        dev.write(at, pattern(b, at, BLOCK as usize), false).await.unwrap();
    }
    let target_reached = |s: &CacheStatus| (s.dirty_blocks, s.writebacks - 8) == (4, 4);
    keep_writing(&dev, 0..4, std::time::Duration::from_millis(2500), target_reached).await;
    let s = CacheStatus::of(&*dev).unwrap();
    assert_eq!((s.dirty_blocks, s.writebacks - 8), (4, 4), "{s:?}");
    wait_clean(&dev).await;
    dev.check_invariants().unwrap();
}

/// Promotions of large blocks share a bounded set of buffers: with the cache device's writes
/// held, so that no promotion finishes, reads of one block after another promote only as
/// many blocks as `PROMOTION_BUFFER_BYTES` holds, and the rest are read from the origin
/// without promotion (counted as skipped). Every read returns the origin's data, and once
/// the writes go on, the blocks promoted read back from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotions_of_large_blocks_hold_a_bounded_set_of_buffers() {
    use strata_cache::meter::PROMOTION_BUFFER_BYTES;
    const BIG: u32 = 64 << 20;
    let reads = 3 * (PROMOTION_BUFFER_BYTES / BIG as u64) as usize;
    let origin = Arc::new(MemDev::new(reads as u64 * BIG as u64));
    let cache_dev = Arc::new(Recording::new(MemDev::new(4 << 30)));
    for i in 0..reads as u64 {
        origin.write(i * BIG as u64 + 4096, pattern(i, 0, 4096), false).await.unwrap();
    }
    let o = CreateOptions {
        block_bytes: BIG,
        policy: "lru".into(),
        migration_budget_bytes_per_s: 0,
        sequential_cutoff_bytes: 0,
        readahead_bytes: 0,
        origin_spec: "mem:test".into(),
        ..CreateOptions::default()
    };
    create(&cache_dev.inner, &*origin, &o).await.unwrap();
    let (meta, _) = Meta::load(&cache_dev.inner).await.unwrap();
    let dev = CacheDev::open(cache_dev.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap();
    cache_dev.hold_writes(true);
    cache_dev.take();
    for i in 0..reads as u64 {
        let got = dev.read(i * BIG as u64 + 4096, Buf::zeroed(4096)).await.unwrap();
        assert_eq!(&got[..], &pattern(i, 0, 4096)[..], "block {i}");
    }
    // A promotion taken on starts its cache write in the background: wait for those taken
    // on (reads less the skipped ones) to reach the held device before counting.
    let s = CacheStatus::of(&dev).unwrap();
    let taken = reads - s.promotions_skipped as usize;
    let big_writes = || cache_dev.writes().iter().filter(|&&(_, n)| n == BIG as u64).count();
    until("the promotions taken on to start", || big_writes() >= taken).await;
    let started = big_writes();
    let fit = (PROMOTION_BUFFER_BYTES / BIG as u64) as usize;
    assert_eq!(started, fit, "promotions in flight: {s:?}");
    assert_eq!(s.promotions_skipped as usize, reads - fit, "{s:?}");
    cache_dev.hold_writes(false);
    for _ in 0..1000 {
        if CacheStatus::of(&dev).unwrap().promotions as usize == fit {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(CacheStatus::of(&dev).unwrap().promotions as usize, fit);
    let hits = CacheStatus::of(&dev).unwrap().read_hits;
    for i in 0..reads as u64 {
        let got = dev.read(i * BIG as u64 + 4096, Buf::zeroed(4096)).await.unwrap();
        assert_eq!(&got[..], &pattern(i, 0, 4096)[..], "block {i} again");
    }
    assert!(CacheStatus::of(&dev).unwrap().read_hits >= hits + fit as u64);
}

/// Block status (`base:allocation`): a cached block is data, the rest of the range is as the
/// origin says, holes included, so a copy can skip the blocks never written.
#[tokio::test]
async fn block_status_shows_cached_blocks_as_data_and_the_origins_holes() {
    let r = rig(Mode::Writeback, 2 << 20, "lru").await;
    let dev = open(&r).await;
    dev.write(5 << 20, Buf::from_slice(&[7u8; BLOCK as usize]), false).await.unwrap();
    let got = dev.block_status(0, ORIGIN).await.unwrap();
    let at = |off: u64| strata_io::testing::extent_at(&got, off);
    assert!(at(0).hole && at(7 << 20).hole, "never written, on the origin as in the cache: {got:?}");
    assert!(!at(5 << 20).hole && !at(5 << 20).zero, "{got:?}");
    assert_eq!(got.iter().map(|e| e.len).sum::<u64>(), ORIGIN, "{got:?}");
    assert!(dev.block_status(ORIGIN, 4096).await.is_err(), "past the end");
}
