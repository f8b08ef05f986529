//! Every plain device against the in-memory reference: random reads, writes (some FUA),
//! flushes, discards and write-zeroes, compared after every read and at the end.

use std::time::Duration;
use strata_io::engine::EngineKind;
use strata_io::file::{FileDev, FileOptions};
use strata_io::latency::{HddParams, LatencyDev, SsdParams};
use strata_io::mem::MemDev;
use strata_io::testing::{check_all_blocks_at_once, check_model, random_ops, Workload};
use strata_io::{BlockDev, Buf};

const SIZE: u64 = 4 << 20;

fn aligned() -> Workload {
    Workload { granularity: 4096, max_granules: 64, span: SIZE }
}

fn unaligned() -> Workload {
    Workload { granularity: 1, max_granules: 20_000, span: 256 << 10 }
}

async fn run(dev: &dyn BlockDev, w: &Workload, seeds: std::ops::Range<u64>) {
    for seed in seeds {
        let ops = random_ops(seed, 300, dev.size(), w);
        if let Err(e) = check_model(dev, &ops).await {
            panic!("{} seed {seed}: {e}", dev.describe());
        }
    }
}

fn file(dir: &tempfile::TempDir, name: &str, direct: bool, engine: EngineKind) -> FileDev {
    let opts = FileOptions { direct, engine, create_size: Some(SIZE), allocate: false, read_only: false };
    FileDev::open(&dir.path().join(name), &opts).expect("open file device")
}

#[tokio::test]
async fn mem_matches_reference() {
    let dev = MemDev::new(SIZE);
    run(&dev, &aligned(), 0..4).await;
    run(&dev, &unaligned(), 10..14).await;
}

#[tokio::test]
async fn file_direct_and_buffered_on_both_engines_match_reference() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (i, (direct, engine)) in
        [(true, EngineKind::Uring), (true, EngineKind::Pool), (false, EngineKind::Uring), (false, EngineKind::Pool)]
            .into_iter()
            .enumerate()
    {
        let dev = file(&dir, &format!("f{i}"), direct, engine);
        run(&dev, &aligned(), 0..3).await;
        run(&dev, &unaligned(), 20..23).await;
    }
}

#[tokio::test]
async fn latency_models_match_reference() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let fast_hdd = HddParams { seek_min_ms: 0.001, seek_max_ms: 0.02, rpm: 6_000_000.0, mib_s: 100_000.0, seed: 7 };
    let hdd = LatencyDev::hdd(file(&dir, "hdd", true, EngineKind::Uring), fast_hdd);
    run(&hdd, &aligned(), 0..2).await;
    let ssd = LatencyDev::ssd(
        file(&dir, "ssd", true, EngineKind::Uring),
        SsdParams { read_us: 5.0, write_us: 2.0, channels: 4, mib_s: 100_000.0 },
    );
    run(&ssd, &aligned(), 0..2).await;
}

#[tokio::test]
async fn hdd_model_charges_seeks_and_spares_sequential_io() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dev = LatencyDev::hdd(file(&dir, "h", true, EngineKind::Uring), HddParams::default());
    // The disk's busy time, which the model charges, rather than the wall clock, which a
    // loaded machine stretches.
    let mut buf = Buf::zeroed(4096);
    for i in 0..16u64 {
        buf = dev.read(i * 4096, buf).await.unwrap();
    }
    let sequential = dev.busy_time().unwrap();
    let start = std::time::Instant::now();
    for i in 0..16u64 {
        buf = dev.read((i * 7919 % 1000) * 4096, buf).await.unwrap();
    }
    let waited = start.elapsed();
    let random = dev.busy_time().unwrap() - sequential;
    // 16 sequential 4 KiB reads: one seek and rotation, then transfers (~0.4 ms);
    // 16 random reads cost at least the minimum seek each, and their callers wait it out.
    assert!(random > std::time::Duration::from_millis(8), "random reads kept the disk busy {random:?}");
    assert!(random > sequential * 2, "random {random:?} vs sequential {sequential:?}");
    assert!(waited >= random / 2, "random reads answered in {waited:?}, the disk busy {random:?}");
}

/// The disk's write cache is off: a sequential write that arrives once the disk is idle has
/// missed its sector and waits for it; the same writes queued back to back, and sequential
/// reads one at a time (the drive's read-ahead), pay one positioning in all.
#[tokio::test]
async fn hdd_model_makes_idle_sequential_writes_wait_for_their_sector() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = HddParams::default();
    let n = 8u64;
    // One seek and rotation at most, then transfers.
    let one_positioning =
        Duration::from_secs_f64((p.seek_max_ms + p.revolution_ms()) / 1000.0 + p.transfer_s(n * 4096));
    let dev = LatencyDev::hdd(file(&dir, "queued", true, EngineKind::Uring), p);
    let writes = (0..n).map(|i| dev.write(i * 4096, Buf::zeroed(4096), false));
    for r in futures::future::join_all(writes).await {
        r.unwrap();
    }
    let queued = dev.busy_time().unwrap();
    assert!(queued <= one_positioning, "queued writes kept the disk busy {queued:?}");

    let dev = LatencyDev::hdd(file(&dir, "reads", true, EngineKind::Uring), p);
    let mut buf = Buf::zeroed(4096);
    for i in 0..n {
        buf = dev.read(i * 4096, buf).await.unwrap();
    }
    let reads = dev.busy_time().unwrap();
    assert!(reads <= one_positioning, "reads one at a time kept the disk busy {reads:?}");

    let dev = LatencyDev::hdd(file(&dir, "one-by-one", true, EngineKind::Uring), p);
    let mut transfers_and_waits = Vec::new();
    for i in 0..n {
        dev.write(i * 4096, Buf::zeroed(4096), false).await.unwrap();
        transfers_and_waits.push(dev.busy_time().unwrap());
    }
    // After the first, each write waited for its sector: more than its transfer. The wait
    // is what is left of a revolution after the idle gap, which a loaded machine can stretch
    // to nearly a whole one, so the writes are judged together.
    let after_first = transfers_and_waits[n as usize - 1] - transfers_and_waits[0];
    assert!(
        after_first.as_secs_f64() > p.transfer_s(4096) * 1.5 * (n - 1) as f64,
        "writes one at a time took {transfers_and_waits:?}"
    );
}

#[tokio::test]
async fn read_only_file_refuses_writes() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = dir.path().join("ro.img");
    std::fs::write(&p, vec![7u8; 8192]).unwrap();
    let dev = FileDev::open(&p, &FileOptions { read_only: true, ..FileOptions::default() }).unwrap();
    let err = dev.write(0, Buf::zeroed(4096), false).await.unwrap_err();
    assert_eq!(err.kind, strata_io::ErrorKind::ReadOnly);
    let got = dev.read(0, Buf::zeroed(4096)).await.unwrap();
    assert!(got.iter().all(|&b| b == 7));
}

#[tokio::test]
async fn block_status_reports_holes_of_sparse_files() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dev = file(&dir, "sparse", true, EngineKind::Uring);
    dev.write(1 << 20, Buf::from_slice(&[1u8; 65536]), false).await.unwrap();
    let ext = dev.block_status(0, SIZE).await.unwrap();
    assert_eq!(ext.iter().map(|e| e.len).sum::<u64>(), SIZE);
    assert!(ext[0].hole && ext[0].zero);
    let data: Vec<_> = ext.iter().filter(|e| !e.hole).collect();
    assert_eq!(data.len(), 1, "{ext:?}");
    let mem = MemDev::new(SIZE);
    assert_eq!(mem.block_status(0, SIZE).await.unwrap(), vec![strata_io::Extent::hole(SIZE)]);
}

/// More requests at once than the io_uring holds (256): the rest wait and still complete,
/// each with its own data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_requests_in_flight_than_the_ring_holds() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (i, engine) in [EngineKind::Uring, EngineKind::Pool].into_iter().enumerate() {
        let dev = file(&dir, &format!("wide{i}"), true, engine);
        check_all_blocks_at_once(&dev).await.unwrap_or_else(|e| panic!("{}: {e}", dev.describe()));
    }
}
