//! Failing devices and bad input: an origin that fails during write-back keeps its blocks
//! dirty and the volume serving; a fast device that fails to read a dirty block reports it
//! and keeps the block; a foreign, corrupt or mismatched log is refused with a clear error
//! and left as it was.

use std::sync::Arc;
use strata_io::fault::{FaultDev, Faults, Ops, Rule};
use strata_io::mem::MemDev;
use strata_io::stats::StatsDev;
use strata_io::{BlockDev, Buf, ErrorKind};
use strata_writecache::offline::{create, CreateOptions};
use strata_writecache::{OpenOptions, WritecacheDev, WritecacheStatus};

const BLOCK: u64 = 4096;
const ORIGIN: u64 = 1 << 20;
const CACHE: u64 = 256 << 10;

fn opts() -> OpenOptions {
    OpenOptions { no_background: true, ..OpenOptions::default() }
}

fn status(dev: &WritecacheDev) -> WritecacheStatus {
    serde_json::from_value(dev.status().unwrap()).unwrap()
}

/// A log on a RAM device behind injected faults, over a RAM origin.
async fn over_a_faulty_log() -> (WritecacheDev, Arc<MemDev>, Arc<FaultDev<MemDev>>, Faults) {
    let origin = Arc::new(MemDev::new(ORIGIN));
    let (cache, faults) = FaultDev::new(MemDev::new(CACHE));
    let cache = Arc::new(cache);
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, force: false, ..CreateOptions::default() })
        .await
        .unwrap();
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), opts()).await.unwrap();
    (dev, origin, cache, faults)
}

/// A log on a RAM device over a RAM origin behind injected faults.
async fn over_a_faulty_origin() -> (WritecacheDev, Arc<FaultDev<MemDev>>, Faults) {
    let (origin, faults) = FaultDev::new(MemDev::new(ORIGIN));
    let origin = Arc::new(origin);
    let cache = Arc::new(MemDev::new(CACHE));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, force: false, ..CreateOptions::default() })
        .await
        .unwrap();
    let dev = WritecacheDev::open(cache, origin.clone(), opts()).await.unwrap();
    (dev, origin, faults)
}

async fn read(dev: &dyn BlockDev, at: u64) -> Vec<u8> {
    dev.read(at, Buf::zeroed(BLOCK as usize)).await.unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_failing_during_write_back_keeps_blocks_dirty_and_serving() {
    let (dev, origin, faults) = over_a_faulty_origin().await;
    for b in 0..8u8 {
        dev.write(b as u64 * BLOCK, Buf::from_slice(&[b + 1; BLOCK as usize]), false).await.unwrap();
    }
    dev.flush().await.unwrap();
    let rule = faults.add(Rule::write_error(0..ORIGIN).always());
    let err = dev.message("flush").await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io, "{err}");
    let s = status(&dev);
    assert_eq!(s.dirty_blocks, 8, "{s:?}");
    assert!(s.writeback_errors > 0 && s.last_error.is_some(), "{s:?}");
    // Still serving: reads, new writes, flushes.
    assert_eq!(read(&dev, 3 * BLOCK).await, vec![4; BLOCK as usize]);
    dev.write(9 * BLOCK, Buf::from_slice(&[10; BLOCK as usize]), true).await.unwrap();
    dev.flush().await.unwrap();
    dev.check_state().unwrap();
    faults.remove(rule);
    dev.message("flush").await.unwrap();
    assert_eq!(status(&dev).dirty_blocks, 0);
    for b in [0u8, 3, 7, 9] {
        assert_eq!(read(&*origin, b as u64 * BLOCK).await, vec![b + 1; BLOCK as usize], "block {b} on the origin");
    }
}

/// A write-back that fails one run of blocks still cleans the runs written before it: an
/// origin that fails some writes drains, where a batch with any failure used to keep every
/// block of it dirty (with 30% of writes failing, none ever became clean).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_written_before_a_failed_one_become_clean() {
    let (dev, origin, faults) = over_a_faulty_origin().await;
    // Eight runs of one block each (every other block), the last of them failing.
    for b in 0..8u8 {
        dev.write(2 * b as u64 * BLOCK, Buf::from_slice(&[b + 1; BLOCK as usize]), false).await.unwrap();
    }
    dev.flush().await.unwrap();
    let rule = faults.add(Rule::write_error(14 * BLOCK..15 * BLOCK).always());
    assert!(dev.message("flush").await.is_err());
    let s = status(&dev);
    assert_eq!(s.dirty_blocks, 1, "{s:?}");
    for b in 0..7u8 {
        assert_eq!(read(&*origin, 2 * b as u64 * BLOCK).await, vec![b + 1; BLOCK as usize], "block {b} on the origin");
    }
    dev.check_state().unwrap();
    faults.remove(rule);
    dev.message("flush").await.unwrap();
    assert_eq!(status(&dev).dirty_blocks, 0);
    assert_eq!(read(&*origin, 14 * BLOCK).await, vec![8; BLOCK as usize]);
}

/// A shutdown waits out a write-back under way: once it has returned and the log is
/// dropped, nothing holds the devices any longer (so a removed export's files can be
/// claimed again at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_waits_out_the_write_back_under_way() {
    let (origin, faults) = FaultDev::new(MemDev::new(ORIGIN));
    let (origin, cache) = (Arc::new(origin), Arc::new(MemDev::new(CACHE)));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), OpenOptions::default()).await.unwrap();
    faults.add(Rule::delay(Ops::WRITE, std::time::Duration::from_millis(500)));
    dev.write(3 * BLOCK, Buf::from_slice(&[7; BLOCK as usize]), false).await.unwrap();
    dev.flush().await.unwrap();
    for _ in 0..1000 {
        if faults.counters().delayed > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(faults.counters().delayed, 1, "a write-back is under way");
    dev.shutdown().await.unwrap();
    drop(dev);
    assert_eq!((Arc::strong_count(&origin), Arc::strong_count(&cache)), (1, 1), "the devices are free");
    assert_eq!(read(&*origin, 3 * BLOCK).await, vec![7; BLOCK as usize], "the write-back under way ended first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_the_log_device_fails_go_around_it() {
    let (dev, origin, cache, faults) = over_a_faulty_log().await;
    dev.write(2 * BLOCK, Buf::from_slice(&[1; 2 * BLOCK as usize]), false).await.unwrap();
    // The log's data area full (a sparse file on a full file system): single blocks, a run
    // of whole blocks, and a partial block over a logged copy all reach the origin.
    let sb = strata_writecache::offline::superblock(&*cache, None).await.unwrap();
    faults.add(Rule::write_error(sb.data_offset()..CACHE).no_space().always());
    dev.write(5 * BLOCK, Buf::from_slice(&[5; BLOCK as usize]), true).await.unwrap();
    dev.write(8 * BLOCK, Buf::from_slice(&[8; 4 * BLOCK as usize]), false).await.unwrap();
    dev.write(2 * BLOCK + 100, Buf::from_slice(&[9; 200]), false).await.unwrap();
    dev.flush().await.unwrap();
    let s = status(&dev);
    assert!(s.log_write_errors >= 3 && s.last_error.as_deref().is_some_and(|e| e.contains("around")), "{s:?}");
    assert_eq!(read(&*origin, 5 * BLOCK).await, vec![5; BLOCK as usize]);
    assert_eq!(read(&*origin, 11 * BLOCK).await, vec![8; BLOCK as usize]);
    let mut want = vec![1u8; BLOCK as usize];
    want[100..300].fill(9);
    assert_eq!(read(&dev, 2 * BLOCK).await, want, "the partial write over a logged copy");
    assert_eq!(read(&dev, 3 * BLOCK).await, vec![1; BLOCK as usize]);
    dev.check_state().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_device_failing_a_read_of_a_dirty_block_reports_it_and_keeps_it() {
    let (dev, origin, cache, faults) = over_a_faulty_log().await;
    dev.write(5 * BLOCK, Buf::from_slice(&[7; BLOCK as usize]), true).await.unwrap();
    // Every slot unreadable (the test does not know which slot holds block 5).
    let sb = strata_writecache::offline::superblock(&*cache, None).await.unwrap();
    let rule = faults.add(Rule::read_error(sb.data_offset()..CACHE).always());
    let err = dev.read(5 * BLOCK, Buf::zeroed(BLOCK as usize)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(err.context.contains("block 5"), "{err}");
    assert!(dev.message("flush").await.is_err(), "write-back cannot read the block either");
    assert_eq!(status(&dev).dirty_blocks, 1);
    assert_eq!(read(&*origin, 5 * BLOCK).await, vec![0; BLOCK as usize], "nothing made up reached the origin");
    faults.remove(rule);
    assert_eq!(read(&dev, 5 * BLOCK).await, vec![7; BLOCK as usize]);
    dev.message("flush").await.unwrap();
    assert_eq!(read(&*origin, 5 * BLOCK).await, vec![7; BLOCK as usize]);
}

async fn refused(cache: &Arc<MemDev>, origin: &Arc<MemDev>) -> strata_io::Error {
    let before = cache.read(0, Buf::zeroed(CACHE as usize)).await.unwrap();
    let err = match WritecacheDev::open(cache.clone(), origin.clone(), opts()).await {
        Ok(_) => panic!("opened"),
        Err(e) => e,
    };
    let after = cache.read(0, Buf::zeroed(CACHE as usize)).await.unwrap();
    assert!(before[..] == after[..], "a refused open changed the device");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_logs_are_refused_and_left_alone() {
    let origin = Arc::new(MemDev::new(ORIGIN));
    // Foreign: some other data.
    let cache = Arc::new(MemDev::new(CACHE));
    cache.write(0, Buf::from_slice(&[0xab; 8192]), false).await.unwrap();
    let e = refused(&cache, &origin).await;
    assert!(e.to_string().contains("no writecache superblock"), "{e}");
    // `create` will not overwrite it unless forced.
    let e = create(
        &*cache,
        &*origin,
        &CreateOptions { block_bytes: BLOCK as u32, force: false, ..CreateOptions::default() },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("holds data"), "{e}");
    assert_eq!(read(&*cache, 0).await, vec![0xab; BLOCK as usize]);
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, force: true, ..CreateOptions::default() })
        .await
        .unwrap();
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), opts()).await.unwrap();
    dev.write(0, Buf::from_slice(&[1; BLOCK as usize]), true).await.unwrap();
    drop(dev);
    // Wrong origin (another size), or the origin grew.
    let other = Arc::new(MemDev::new(ORIGIN * 2));
    let e = refused(&cache, &other).await;
    assert!(e.to_string().contains("wrong origin"), "{e}");
    // Corrupt superblock.
    let mut head = read(&*cache, 0).await;
    head[17] ^= 0x40;
    cache.write(0, Buf::from_slice(&head), false).await.unwrap();
    let e = refused(&cache, &origin).await;
    assert_eq!(e.kind, ErrorKind::Corrupt, "{e}");
    head[17] ^= 0x40;
    cache.write(0, Buf::from_slice(&head), false).await.unwrap();
    // Repaired, it opens with the write intact.
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), opts()).await.unwrap();
    assert_eq!(read(&dev, 0).await, vec![1; BLOCK as usize]);
    // Bad block sizes.
    for bs in [256u32, 3000, 128 << 10] {
        let c = MemDev::new(CACHE);
        assert_eq!(
            create(&c, &*origin, &CreateOptions { block_bytes: bs, force: false, ..CreateOptions::default() })
                .await
                .unwrap_err()
                .kind,
            ErrorKind::Invalid,
            "block size {bs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_flush_stops_the_volume() {
    for log_device in [true, false] {
        let (origin, origin_faults) = FaultDev::new(MemDev::new(ORIGIN));
        let (cache, cache_faults) = FaultDev::new(MemDev::new(CACHE));
        let (origin, cache) = (Arc::new(origin), Arc::new(cache));
        create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() })
            .await
            .unwrap();
        let dev = WritecacheDev::open(cache.clone(), origin.clone(), opts()).await.unwrap();
        dev.write(0, Buf::from_slice(&[1; BLOCK as usize]), true).await.unwrap();
        dev.write(BLOCK, Buf::from_slice(&[2; BLOCK as usize]), false).await.unwrap();
        if log_device {
            cache_faults.add(Rule::flush_error().once());
            assert!(dev.flush().await.is_err());
        } else {
            dev.message("flush").await.unwrap(); // on the origin, clean
            origin_faults.add(Rule::flush_error().once());
            dev.write(2 * BLOCK, Buf::from_slice(&[3; BLOCK as usize]), false).await.unwrap();
            assert!(dev.message("flush").await.is_err());
        }
        // Whatever that flush covered may be gone: nothing later may claim it durable.
        let s = status(&dev);
        assert!(s.stopped.is_some(), "{s:?}");
        assert!(dev.flush().await.is_err(), "log device {log_device}: a later flush succeeded");
        assert!(dev.write(3 * BLOCK, Buf::from_slice(&[4; BLOCK as usize]), false).await.is_err());
        let logged_read = dev.read(0, Buf::zeroed(BLOCK as usize)).await;
        assert_eq!(logged_read.is_err(), log_device, "reads from the log stop only when the log lost writes");
    }
}

/// A write logged since the last commit lives only in the device's volatile copy until
/// the next flush; if that flush fails, its slot holds what it held before. A read hit in
/// flight across the failure must not return that: here the read is delayed on the fast
/// device while the flush fails, and it gets the logged data or an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_that_meets_a_failed_flush_never_reads_what_the_flush_lost() {
    use strata_io::fault::Ops;
    use strata_io::powercut::PowerCut;
    let origin = Arc::new(MemDev::new(ORIGIN));
    let cut = Arc::new(PowerCut::new(MemDev::new(CACHE)));
    let (cache, faults) = FaultDev::new(cut.clone());
    let cache = Arc::new(cache);
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, force: false, ..CreateOptions::default() })
        .await
        .unwrap();
    let dev = Arc::new(WritecacheDev::open(cache.clone(), origin.clone(), opts()).await.unwrap());
    dev.write(5 * BLOCK, Buf::from_slice(&[7; BLOCK as usize]), false).await.unwrap(); // logged, not flushed
    let sb = strata_writecache::offline::superblock(&*cache, None).await.unwrap();
    faults.add(Rule::delay(Ops::READ, std::time::Duration::from_millis(300)).range(sb.data_offset()..CACHE).once());
    let reader = {
        let dev = dev.clone();
        tokio::spawn(async move { dev.read(5 * BLOCK, Buf::zeroed(BLOCK as usize)).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    cut.fail_next_flush();
    assert!(dev.flush().await.is_err(), "the flush fails");
    if let Ok(got) = reader.await.unwrap() {
        assert!(got[..] == [7; BLOCK as usize], "the hit read what the failed flush lost");
    }
}

/// A log whose device refuses the copies of a read's window (a full file system, a failing
/// device) keeps no window until a write to the log succeeds: each read miss meanwhile reads
/// its own block from the origin, not the whole window, and every read has its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_refuses_a_reads_window_reads_no_window_until_a_write_to_it_succeeds() {
    const WINDOW: u64 = 16;
    let fill = |b: u64| vec![(b % 251 + 1) as u8; BLOCK as usize];
    let origin = Arc::new(StatsDev::new(MemDev::new(ORIGIN)));
    for b in 0..ORIGIN / BLOCK {
        origin.write(b * BLOCK, Buf::from_slice(&fill(b)), false).await.unwrap();
    }
    let (cache, faults) = FaultDev::new(MemDev::new(CACHE));
    let cache = Arc::new(cache);
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), opts()).await.unwrap();
    dev.message(&format!("readahead {}", WINDOW * BLOCK)).await.unwrap();
    let origin_read = || origin.op("read").bytes.load(std::sync::atomic::Ordering::Relaxed);

    let full = faults.add(Rule::write_error(0..CACHE).no_space().always());
    let before = origin_read();
    for w in 0..12 {
        let b = w * WINDOW + 3;
        assert_eq!(read(&dev, b * BLOCK).await, fill(b), "block {b}");
    }
    // The first miss read its window and could not keep it; the rest read their own block.
    assert_eq!(origin_read() - before, WINDOW * BLOCK + 11 * BLOCK);
    let s = status(&dev);
    assert_eq!(s.reads_kept, 0);
    assert!(s.log_write_errors >= 1 && s.last_error.as_deref().unwrap_or("").contains("window not kept"), "{s:?}");

    // Once the log takes a write again, a miss keeps its window again.
    faults.remove(full);
    dev.write(0, Buf::from_slice(&[0xaa; BLOCK as usize]), false).await.unwrap();
    let before = origin_read();
    assert_eq!(read(&dev, (12 * WINDOW + 3) * BLOCK).await, fill(12 * WINDOW + 3));
    assert_eq!(origin_read() - before, WINDOW * BLOCK);
    assert_eq!(status(&dev).reads_kept, WINDOW);
    dev.check_state().unwrap();
}
