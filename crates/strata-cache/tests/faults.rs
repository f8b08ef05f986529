//! Faults under the cache: the failing request gets an error and nothing else does; a clean
//! cached block that cannot be read is fetched from the origin and dropped from the cache;
//! a dirty block is never silently dropped: the volume reports the fault, goes to its safe
//! mode, and the data stays readable where it is once the device answers again.

mod common;

use common::{until, wait_clean};
use std::sync::Arc;
use strata_cache::meta::Meta;
use strata_cache::{offline::create, CreateOptions};
use strata_cache::{CacheDev, CacheStatus, OpenOptions};
use strata_io::fault::{FaultDev, Faults, Ops, Rule};
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf, ErrorKind};

const BLOCK: u64 = 32 << 10;
const ORIGIN: u64 = 4 << 20;

struct Rig {
    dev: CacheDev,
    origin: Arc<FaultDev<MemDev>>,
    cache: Arc<FaultDev<MemDev>>,
    origin_faults: Faults,
    cache_faults: Faults,
    data: std::ops::Range<u64>,
}

async fn rig(mode: &str) -> Rig {
    let (origin, origin_faults) = FaultDev::new(MemDev::new(ORIGIN));
    let (cache, cache_faults) = FaultDev::new(MemDev::new(2 << 20));
    let (origin, cache) = (Arc::new(origin), Arc::new(cache));
    let o = CreateOptions {
        block_bytes: BLOCK as u32,
        mode: mode.parse().unwrap(),
        migration_budget_bytes_per_s: 0,
        writeback_percent: 100, // no background write-back unless asked
        origin_spec: "mem:faults".into(),
        ..CreateOptions::default()
    };
    let sb = create(&*cache, &*origin, &o).await.unwrap();
    let (meta, _) = Meta::load(&*cache).await.unwrap();
    let dev = CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap();
    Rig { dev, origin, cache, origin_faults, cache_faults, data: sb.data_offset..sb.data_offset + sb.slots * BLOCK }
}

fn fill(v: u8) -> Buf {
    Buf::from_slice(&vec![v; BLOCK as usize])
}

async fn read(dev: &CacheDev, block: u64) -> strata_io::Result<Vec<u8>> {
    dev.read(block * BLOCK, Buf::zeroed(BLOCK as usize)).await.map(|b| b.to_vec())
}

fn status(dev: &CacheDev) -> CacheStatus {
    CacheStatus::of(dev).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_block_unreadable_in_cache_is_served_from_origin_and_dropped() {
    let r = rig("writethrough").await;
    r.dev.write(3 * BLOCK, fill(7), false).await.unwrap(); // promoted, clean
    assert_eq!(status(&r.dev).cached_blocks, 1);
    let id = r.cache_faults.add(Rule::read_error(r.data.clone()).always());
    assert_eq!(read(&r.dev, 3).await.unwrap(), vec![7; BLOCK as usize], "served from the origin");
    assert!(r.cache_faults.fired(id) >= 1);
    assert_eq!(status(&r.dev).cached_blocks, 0, "dropped from the cache");
    assert!(!status(&r.dev).degraded, "nothing was lost");
}

/// The cache device refusing writes (a sparse file on a full file system): in writethrough
/// and writearound every write still succeeds on the origin; in writeback a partial write
/// does too, and the fault puts the volume in writethrough, so later writes do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_the_cache_device_fails_still_reach_the_origin() {
    for mode in ["writethrough", "writeback"] {
        let r = rig(mode).await;
        r.cache_faults.add(Rule::write_error(r.data.clone()).no_space().always());
        r.dev.write(5 * BLOCK + 512, Buf::from_slice(&[3; 1024]), false).await.unwrap();
        for b in 0..4u8 {
            r.dev.write(b as u64 * BLOCK, fill(b + 1), mode == "writethrough").await.unwrap();
        }
        r.dev.flush().await.unwrap();
        let s = status(&r.dev);
        assert!(s.degraded && s.faults.iter().any(|f| f.contains("cache slot")), "{mode}: {s:?}");
        assert_eq!(s.dirty_blocks, 0, "{mode}");
        for b in 0..4u8 {
            assert_eq!(read(&r.dev, b as u64).await.unwrap(), vec![b + 1; BLOCK as usize], "{mode}: block {b}");
        }
        let mut on_origin = vec![0u8; 1024];
        on_origin.copy_from_slice(&r.origin.read(5 * BLOCK + 512, Buf::zeroed(1024)).await.unwrap());
        assert_eq!(on_origin, vec![3; 1024], "{mode}: the partial write");
        r.dev.check_invariants().unwrap();
    }
}

/// In writeback, the first write the cache device refuses succeeds too: a whole block
/// promoted on a write miss, and a clean cached block rewritten (whole or in part), each
/// goes to the origin instead, and the cached copy is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_cache_device_refuses_in_writeback_reaches_the_origin() {
    for case in ["whole block, uncached", "whole block, clean cached", "part of a clean cached block"] {
        let r = rig("writethrough").await;
        r.dev.write(2 * BLOCK, fill(8), false).await.unwrap(); // promoted, clean
        assert_eq!(status(&r.dev).cached_blocks, 1, "{case}");
        r.dev.message("mode writeback").await.unwrap();
        r.cache_faults.add(Rule::write_error(r.data.clone()).no_space().always());
        let mut want = vec![8u8; BLOCK as usize];
        let b = match case {
            "whole block, uncached" => {
                want = vec![5; BLOCK as usize];
                r.dev.write(9 * BLOCK, fill(5), true).await.unwrap();
                9
            }
            "whole block, clean cached" => {
                want = vec![5; BLOCK as usize];
                r.dev.write(2 * BLOCK, fill(5), true).await.unwrap();
                2
            }
            _ => {
                want[512..1536].fill(6);
                r.dev.write(2 * BLOCK + 512, Buf::from_slice(&[6; 1024]), true).await.unwrap();
                2
            }
        };
        let s = status(&r.dev);
        assert!(s.degraded && s.faults.iter().any(|f| f.contains("cache slot")), "{case}: {s:?}");
        let untouched = u64::from(b != 2); // block 2 stays cached when another is written
        assert_eq!((s.dirty_blocks, s.cached_blocks), (0, untouched), "{case}");
        // The write counted once, as the hit or miss it was (the uncached block's is planned
        // twice: a promotion, then to the origin).
        let (hit, miss) = if b == 2 { (1, 1) } else { (0, 2) }; // the first write a miss
        assert_eq!((s.write_hits, s.write_misses, s.bypassed), (hit, miss, 0), "{case}: {s:?}");
        assert_eq!(read(&r.dev, b).await.unwrap(), want, "{case}");
        let on_origin = r.origin.read(b * BLOCK, Buf::zeroed(BLOCK as usize)).await.unwrap();
        assert_eq!(on_origin.to_vec(), want, "{case}: on the origin");
        r.dev.check_invariants().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dirty_block_unreadable_is_reported_never_dropped() {
    let r = rig("writeback").await;
    r.dev.write(5 * BLOCK, fill(9), false).await.unwrap(); // dirty in the cache only
    r.dev.write(6 * BLOCK, fill(4), false).await.unwrap();
    assert_eq!(status(&r.dev).dirty_blocks, 2);
    let id = r.cache_faults.add(Rule::read_error(r.data.clone()).always());
    let err = read(&r.dev, 5).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(status(&r.dev).degraded);
    assert_eq!(status(&r.dev).mode, "writethrough", "safe mode: no new dirty data");
    assert_eq!(status(&r.dev).dirty_blocks, 2, "the dirty blocks are still tracked");
    // Other IO keeps working meanwhile.
    r.dev.write(40 * BLOCK, fill(1), false).await.unwrap();
    assert_eq!(read(&r.dev, 41).await.unwrap(), vec![0; BLOCK as usize]);
    // The device answers again: the data is where it was, and write-back completes.
    r.cache_faults.remove(id);
    assert_eq!(read(&r.dev, 5).await.unwrap(), vec![9; BLOCK as usize]);
    r.dev.message("flush").await.unwrap();
    wait_clean(&r.dev).await;
    let mut o = vec![0u8; BLOCK as usize];
    r.origin.inner().read_into(5 * BLOCK, &mut o).unwrap();
    assert_eq!(o, vec![9; BLOCK as usize]);
}

/// The safe mode is the running volume's: the superblock keeps the mode the operator set,
/// so a restart serves in writeback again; a mode the operator sets meanwhile is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_safe_mode_a_fault_chose_lasts_until_restart() {
    for set in [None, Some("writearound")] {
        let r = rig("writeback").await;
        r.dev.write(5 * BLOCK, fill(9), false).await.unwrap();
        let id = r.cache_faults.add(Rule::read_error(r.data.clone()).always());
        read(&r.dev, 5).await.unwrap_err();
        r.cache_faults.remove(id);
        assert_eq!(status(&r.dev).mode, "writethrough", "{set:?}");
        assert_eq!(status(&r.dev).restart_mode, "writeback", "{set:?}");
        if let Some(mode) = set {
            r.dev.message(&format!("mode {mode}")).await.unwrap();
            assert_eq!(status(&r.dev).restart_mode, mode);
        }
        r.dev.message("readahead 0").await.unwrap(); // another setting leaves the mode be
        r.dev.shutdown().await.unwrap();
        let (cache, origin) = (r.cache.clone(), r.origin.clone());
        drop(r);
        let (meta, _) = Meta::load(&*cache).await.unwrap();
        let dev = CacheDev::open(cache, origin, meta, OpenOptions::default()).await.unwrap();
        assert_eq!(status(&dev).mode, set.unwrap_or("writeback"));
        assert_eq!(read(&dev, 5).await.unwrap(), vec![9; BLOCK as usize]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_failing_write_back_keeps_the_block_dirty() {
    let r = rig("writeback").await;
    r.dev.write(2 * BLOCK, fill(3), false).await.unwrap();
    let id = r.origin_faults.add(Rule::write_error(0..ORIGIN).always());
    r.dev.message("flush").await.unwrap();
    until("write-back to be tried and fail", || r.origin_faults.fired(id) >= 1 && status(&r.dev).degraded).await;
    assert_eq!(status(&r.dev).dirty_blocks, 1, "still dirty, not dropped");
    assert!(status(&r.dev).degraded);
    assert_eq!(read(&r.dev, 2).await.unwrap(), vec![3; BLOCK as usize], "readable from the cache");
    r.origin_faults.remove(id);
    wait_clean(&r.dev).await;
}

/// An origin away for now (`Unavailable`: a remote server's outage) lost nothing: the
/// write-back that meets it is counted, the block stays dirty, and the volume records no
/// fault and keeps writeback; once the origin is back the block is written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_away_for_now_is_no_fault() {
    let r = rig("writeback").await;
    r.dev.write(2 * BLOCK, fill(3), false).await.unwrap();
    let id = r.origin_faults.add(Rule::write_error(0..ORIGIN).kind(ErrorKind::Unavailable));
    r.dev.message("flush").await.unwrap();
    until("a write-back error", || status(&r.dev).writeback_errors > 0).await;
    let s = status(&r.dev);
    assert!(s.writeback_errors >= 1, "write-back was tried");
    assert_eq!(s.dirty_blocks, 1, "still dirty");
    assert!(!s.degraded && s.faults.is_empty(), "{:?}", s.faults);
    assert_eq!(s.mode, "writeback");
    r.origin_faults.remove(id);
    r.dev.message("flush").await.unwrap();
    wait_clean(&r.dev).await;
    let mut on_origin = vec![0; BLOCK as usize];
    r.origin.inner().read_into(2 * BLOCK, &mut on_origin).unwrap();
    assert_eq!(on_origin, vec![3; BLOCK as usize]);
}

/// A shutdown waits out a write-back under way: once it has returned and the volume is
/// dropped, nothing holds the devices any longer (so a removed export's files can be
/// claimed again at once), and nothing reaches them after the clean-shutdown superblock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_waits_out_the_write_back_under_way() {
    let Rig { dev, origin, cache, origin_faults, .. } = rig("writeback").await;
    dev.write(2 * BLOCK, fill(3), false).await.unwrap();
    origin_faults.add(Rule::delay(Ops::WRITE, std::time::Duration::from_millis(500)));
    dev.message("flush").await.unwrap();
    until("a write-back under way", || origin_faults.counters().delayed > 0).await;
    assert_eq!(origin_faults.counters().delayed, 1, "a write-back is under way");
    dev.shutdown().await.unwrap();
    drop(dev);
    assert_eq!((Arc::strong_count(&origin), Arc::strong_count(&cache)), (1, 1), "the devices are free");
    let mut on_origin = vec![0; BLOCK as usize];
    origin.inner().read_into(2 * BLOCK, &mut on_origin).unwrap();
    assert_eq!(on_origin, vec![3; BLOCK as usize], "the write-back under way ended first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_errors_reach_only_the_failing_request() {
    let r = rig("writethrough").await;
    let id = r.origin_faults.add(Rule::read_error(10 * BLOCK..11 * BLOCK).once());
    assert_eq!(read(&r.dev, 10).await.unwrap_err().kind, ErrorKind::Io);
    assert!(read(&r.dev, 11).await.is_ok());
    assert_eq!(read(&r.dev, 10).await.unwrap(), vec![0; BLOCK as usize], "the rule fired once");
    assert_eq!(r.origin_faults.fired(id), 1);
    r.origin_faults.add(Rule::write_error(20 * BLOCK..21 * BLOCK).no_space().once());
    let err = r.dev.write(20 * BLOCK, fill(2), false).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::NoSpace);
    r.dev.write(20 * BLOCK, fill(2), false).await.unwrap();
    assert_eq!(read(&r.dev, 20).await.unwrap(), vec![2; BLOCK as usize]);
}

/// A failed commit is latched: once the device answers again, flushes still fail (what the
/// failed one covered may be gone), until a restart recovers from what is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_metadata_commit_fails_every_flush_until_restart() {
    let r = rig("writeback").await;
    r.dev.write(BLOCK, fill(8), false).await.unwrap();
    let id = r.cache_faults.add(Rule::write_error(0..r.data.start).always());
    assert!(r.dev.flush().await.is_err(), "a flush that could not commit says so");
    assert!(status(&r.dev).degraded);
    r.cache_faults.remove(id);
    let err = r.dev.flush().await.unwrap_err();
    assert!(err.context.contains("until restarted"), "{err}");
    assert!(status(&r.dev).stopped.unwrap().contains("metadata write"));
    // The cache device lost what the failed commit covered: its slots are not read any more
    // (one may hold an older block's data); uncached blocks still read from the origin.
    assert_eq!(read(&r.dev, 1).await.unwrap_err().kind, ErrorKind::Io, "a cached block is refused");
    assert_eq!(read(&r.dev, 2).await.unwrap(), vec![0; BLOCK as usize], "an uncached one is read");
    let (cache, origin) = (r.cache.clone(), r.origin.clone());
    drop(r);
    let (meta, findings) = Meta::load(&*cache).await.unwrap();
    assert!(findings.errors.is_empty(), "{:?}", findings.errors);
    let dev = CacheDev::open(cache, origin, meta, OpenOptions::default()).await.unwrap();
    let b1 = read(&dev, 1).await.unwrap();
    assert!(b1 == vec![8; BLOCK as usize] || b1 == vec![0; BLOCK as usize], "never flushed: either");
    dev.write(BLOCK, fill(9), false).await.unwrap();
    dev.flush().await.unwrap();
    assert_eq!(read(&dev, 1).await.unwrap(), vec![9; BLOCK as usize]);
}

/// A table mapping every slot (more than the policy holds: one written under another slot
/// reserve, or damaged) opens with the excess clean blocks dropped, copies of the origin,
/// and a consistent state; with every slot dirty it is refused, saying why, and nothing on
/// the device changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_mapping_more_blocks_than_the_policy_holds() {
    for dirty in [false, true] {
        let origin = Arc::new(MemDev::new(ORIGIN));
        let cache = Arc::new(MemDev::new(2 << 20));
        let o = CreateOptions { block_bytes: BLOCK as u32, origin_spec: "mem:full".into(), ..CreateOptions::default() };
        let sb = create(&*cache, &*origin, &o).await.unwrap();
        let (mut meta, _) = Meta::load(&*cache).await.unwrap();
        for s in 0..sb.slots {
            meta.set(s as u32, s, true, dirty);
        }
        let batch = meta.prepare_commit();
        for (_, off, _, bytes) in &batch.pages {
            cache.write(*off, Buf::from_slice(bytes), false).await.unwrap();
        }
        meta.commit_done(&batch);
        meta.write_superblock(&*cache).await.unwrap();
        let (meta, _) = Meta::load(&*cache).await.unwrap();
        let held = strata_cache::target::policy_capacity(sb.slots as usize) as u64;
        assert!(held < sb.slots);
        match CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await {
            Ok(dev) if !dirty => {
                let s = status(&dev);
                assert_eq!((s.cached_blocks, s.free_blocks), (held, sb.slots - held), "{s:?}");
                dev.check_invariants().unwrap();
            }
            Err(e) if dirty => {
                assert!(e.to_string().contains("more dirty blocks than policy"), "{e}");
                let (meta, _) = Meta::load(&*cache).await.unwrap();
                assert!(meta.entries.iter().all(|e| e.valid && e.dirty), "the refused table is left as it was");
            }
            Ok(_) => panic!("a table of {} dirty blocks opened with a policy of {held}", sb.slots),
            Err(e) => panic!("clean table refused: {e}"),
        }
    }
}

/// A block promoted since the last cache flush lives only in the device's volatile copy
/// until the next flush; if that flush fails, the slot holds what it held before. A read
/// hit in flight across the failure must not return that: here the read is delayed on the
/// cache device while the flush fails, and it gets the block's data or an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_that_meets_a_failed_cache_flush_never_reads_what_the_flush_lost() {
    use strata_io::fault::Ops;
    use strata_io::powercut::PowerCut;
    let origin = Arc::new(MemDev::new(ORIGIN));
    let cut = Arc::new(PowerCut::new(MemDev::new(2 << 20)));
    let (cache, faults) = FaultDev::new(cut.clone());
    let cache = Arc::new(cache);
    let o = CreateOptions {
        block_bytes: BLOCK as u32,
        mode: "writethrough".parse().unwrap(),
        migration_budget_bytes_per_s: 0,
        origin_spec: "mem:faults".into(),
        ..CreateOptions::default()
    };
    let sb = create(&*cache, &*origin, &o).await.unwrap();
    let (meta, _) = Meta::load(&*cache).await.unwrap();
    let dev = Arc::new(CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap());
    dev.flush().await.unwrap();
    dev.write(3 * BLOCK, fill(7), false).await.unwrap(); // promoted into a slot, not flushed
    assert_eq!(status(&dev).cached_blocks, 1);
    let data = sb.data_offset..sb.data_offset + sb.slots * BLOCK;
    faults.add(Rule::delay(Ops::READ, std::time::Duration::from_millis(300)).range(data).once());
    let reader = {
        let dev = dev.clone();
        tokio::spawn(async move { read(&dev, 3).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    cut.fail_next_flush();
    assert!(dev.flush().await.is_err(), "the flush fails");
    if let Ok(got) = reader.await.unwrap() {
        assert!(got == vec![7; BLOCK as usize], "the hit read what the failed flush lost");
    }
}

/// A block written back, then discarded and read back into the very slot it had, while the
/// rest of its write-back batch is still under way: the batch must leave the block as the
/// table has it now (clean), not offer it again as dirty. Here the batch's other block is
/// delayed on the origin while the first one goes through that cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_remapped_into_its_slot_during_write_back_keeps_its_clean_state() {
    use strata_io::fault::Ops;
    let r = rig("writeback").await;
    r.dev.write(2 * BLOCK, fill(3), false).await.unwrap();
    r.dev.write(9 * BLOCK, fill(4), false).await.unwrap();
    let slow = r
        .origin_faults
        .add(Rule::delay(Ops::WRITE, std::time::Duration::from_millis(500)).range(9 * BLOCK..10 * BLOCK).once());
    r.dev.message("flush").await.unwrap();
    until("the batch to reach the slow block", || r.origin_faults.fired(slow) == 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    r.dev.discard(2 * BLOCK, BLOCK).await.unwrap();
    r.dev.flush().await.unwrap(); // the slot is free again
    for _ in 0..4 {
        assert_eq!(read(&r.dev, 2).await.unwrap(), vec![0; BLOCK as usize]);
        if status(&r.dev).cached_blocks >= 2 {
            break;
        }
    }
    assert!(status(&r.dev).cached_blocks >= 2, "the reads promoted block 2 again: {:?}", status(&r.dev));
    wait_clean(&r.dev).await;
    r.dev.check_invariants().unwrap();
}

/// A whole-block write the cache device refuses goes to the origin (above) while the block
/// is still locked: a read meanwhile must not promote the origin's older content, which would
/// leave a clean cached copy that differs from the origin once the write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_during_a_refused_write_does_not_cache_the_data_it_replaces() {
    use std::time::Duration;
    use strata_io::fault::Ops;
    let r = rig("writeback").await;
    r.origin.write(9 * BLOCK, fill(1), false).await.unwrap();
    r.cache_faults.add(Rule::write_error(r.data.clone()).no_space().once());
    let slow =
        r.origin_faults.add(Rule::delay(Ops::WRITE, Duration::from_millis(400)).range(9 * BLOCK..10 * BLOCK).once());
    let dev = Arc::new(r.dev);
    let write = tokio::spawn({
        let dev = dev.clone();
        async move { dev.write(9 * BLOCK, fill(5), false).await.map(|_| ()) }
    });
    until("the refused write to reach the origin", || r.origin_faults.fired(slow) == 1).await;
    // Reads while the origin write is on its way: old or new content, and nothing cached
    // that goes stale.
    for _ in 0..4 {
        let got = read(&dev, 9).await.unwrap();
        assert!(got == vec![1; BLOCK as usize] || got == vec![5; BLOCK as usize]);
    }
    write.await.unwrap().unwrap();
    assert_eq!(read(&dev, 9).await.unwrap(), vec![5; BLOCK as usize], "{:?}", status(&dev));
    dev.check_invariants().unwrap();
}

/// A dirty block whose slot the cache device no longer takes, in writeback and in the modes
/// a volume with dirty blocks can be switched to: a write of part of it fails (the rest of
/// the block's newest data is the slot's alone) and puts the volume's fault in its status
/// (writeback goes to writethrough); a write of the whole block succeeds, on the origin, and
/// drops the slot, durably, so the block is usable again: the first write the slot refuses,
/// or one after a refused partial write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_block_write_frees_a_dirty_block_the_cache_device_refuses() {
    for mode in ["writeback", "writethrough", "writearound"] {
        for partial_first in [false, true] {
            let case = format!("{mode}, partial write first: {partial_first}");
            let r = rig("writeback").await;
            r.dev.write(3 * BLOCK, fill(1), false).await.unwrap();
            r.dev.flush().await.unwrap();
            if mode != "writeback" {
                r.dev.message(&format!("mode {mode}")).await.unwrap();
            }
            assert_eq!(status(&r.dev).dirty_blocks, 1, "{case}");
            r.cache_faults.add(Rule::write_error(r.data.clone()).always());
            let safe = if mode == "writeback" { "writethrough" } else { mode };
            if partial_first {
                let part = Buf::from_slice(&[3; 512]);
                assert!(r.dev.write(3 * BLOCK + 512, part, false).await.is_err(), "{case}: part of the slot's block");
                let s = status(&r.dev);
                assert!(s.degraded && s.mode == safe && s.dirty_blocks == 1, "{case}: {s:?}");
            }
            let hits = status(&r.dev).write_hits;
            r.dev.write(3 * BLOCK, fill(4), true).await.unwrap();
            assert_eq!(read(&r.dev, 3).await.unwrap(), vec![4; BLOCK as usize], "{case}");
            let s = status(&r.dev);
            assert!(s.degraded && s.mode == safe, "{case}: {s:?}");
            assert_eq!((s.dirty_blocks, s.cached_blocks), (0, 0), "{case}: {s:?}");
            assert_eq!(s.write_hits, hits + 1, "{case}: one write, counted once");
            r.dev.check_invariants().unwrap();
            // Acknowledged with FUA: the volume opened again from what the devices hold (a
            // crash now) reads the same, not the slot's older copy.
            let (meta, _) = Meta::load(&*r.cache).await.unwrap();
            let again = CacheDev::open(r.cache.clone(), r.origin.clone(), meta, OpenOptions::default()).await.unwrap();
            assert_eq!(read(&again, 3).await.unwrap(), vec![4; BLOCK as usize], "{case}");
        }
    }
}
