//! Power cuts: the metadata and data devices lose power together at many points of a run of
//! writes, flushes and a snapshot; every cut leaves a pool that opens, passes both checkers,
//! and reads in each sector the last durable write or a later one.

mod common;

use rand::{Rng, SeedableRng};
use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_io::powercut::{Clock, PowerCut};
use strata_io::testing::model::pattern;
use strata_io::{BlockDev, Buf};
use strata_thin::meta::Metadata;
use strata_thin::{Pool, PoolOptions, ThinDev};

const BS: u64 = 64 << 10;
const VOL: u64 = 16 * BS;
const SECTOR: u64 = 512;

/// A write as the run made it, in clock ticks.
struct Write {
    start: u64,
    end: u64,
    offset: u64,
    len: u64,
    fill: u64,
    /// Durable on its own once complete.
    fua: bool,
}

/// The bytes sector `s` may hold after a cut at `tick`: the last write to it made durable by
/// a flush completed before the cut (or zeroes), or any later write issued before it.
fn allowed(writes: &[Write], flushes: &[(u64, u64)], s: u64, tick: u64) -> Vec<Vec<u8>> {
    let at = s * SECTOR;
    let covering: Vec<&Write> = writes.iter().filter(|w| w.offset <= at && at < w.offset + w.len).collect();
    let durable = |w: &Write| (w.fua && w.end < tick) || flushes.iter().any(|&(fs, fe)| fs > w.end && fe < tick);
    let last = covering.iter().rposition(|w| durable(w));
    let bytes =
        |w: &Write| pattern(w.fill, w.offset, w.len as usize)[(at - w.offset) as usize..][..SECTOR as usize].to_vec();
    let mut out = vec![match last {
        Some(i) => bytes(covering[i]),
        None => vec![0; SECTOR as usize],
    }];
    let from = last.map_or(0, |i| i + 1);
    out.extend(covering[from..].iter().filter(|w| w.start < tick).map(|w| bytes(w)));
    out
}

#[tokio::test]
async fn every_power_cut_leaves_a_checked_pool_holding_every_durable_write() {
    let clock = Clock::default();
    let md = Arc::new(PowerCut::with_clock(MemDev::new(1 << 20), clock.clone()));
    let data = Arc::new(PowerCut::with_clock(MemDev::new(40 * BS), clock.clone()));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_thin(1).unwrap();
    m.commit(&*md).await.unwrap();
    let p = Pool::open(md.clone(), data.clone(), "", PoolOptions::default()).await.unwrap();
    let dev = ThinDev::new(p.clone(), 1, Some(VOL)).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let (mut writes, mut flushes) = (Vec::new(), Vec::new());
    for step in 0..300 {
        if step == 120 {
            p.with_meta(|m| m.create_snapshot(2, 1)).unwrap();
        }
        if rng.gen_bool(0.15) {
            let start = clock.now();
            dev.flush().await.unwrap();
            flushes.push((start, clock.now()));
            continue;
        }
        let sectors = rng.gen_range(1..=16u64);
        let offset = rng.gen_range(0..VOL / SECTOR - sectors) * SECTOR;
        let (fill, fua) = (rng.gen(), rng.gen_bool(0.1));
        let start = clock.now();
        dev.write(offset, pattern(fill, offset, (sectors * SECTOR) as usize), fua).await.unwrap();
        let end = clock.now();
        writes.push(Write { start, end, offset, len: sectors * SECTOR, fill, fua });
    }
    let last = clock.now();
    let mut cuts: Vec<u64> = (0..60).map(|_| rng.gen_range(1..=last)).collect();
    cuts.extend(flushes.iter().map(|&(_, e)| e + 1));
    cuts.extend(writes.iter().filter(|w| w.fua).map(|w| w.end + 1));
    for (k, &tick) in cuts.iter().enumerate() {
        let seed = k as u64;
        let md_img = Arc::new(md.crash_at(md.point_at_tick(tick).unwrap(), seed).unwrap());
        let data_img = Arc::new(data.crash_at(data.point_at_tick(tick).unwrap(), seed).unwrap());
        let what = format!("cut at tick {tick} (seed {seed})");
        let report = strata_thin::check::check(&*md_img).await;
        assert!(report.clean(), "{what}: {report:?}");
        if k % 10 == 0 {
            let mut bytes = vec![0u8; md_img.size() as usize];
            md_img.read_into(0, &mut bytes).unwrap();
            if let Some((ok, text)) = common::thin_check_bytes(&bytes) {
                assert!(ok, "{what}: thin_check: {text}");
            }
        }
        let p = Pool::open(md_img, data_img, "", PoolOptions::default()).await.unwrap();
        let dev = ThinDev::new(p, 1, Some(VOL)).unwrap();
        let got = dev.read(0, Buf::zeroed(VOL as usize)).await.unwrap();
        for s in 0..VOL / SECTOR {
            let sector = &got[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
            let ok = allowed(&writes, &flushes, s, tick);
            if !ok.iter().any(|a| a == sector) {
                let at = s * SECTOR;
                let from: Vec<String> = writes
                    .iter()
                    .filter(|w| w.offset <= at && at < w.offset + w.len)
                    .map(|w| {
                        let b =
                            &pattern(w.fill, w.offset, w.len as usize)[(at - w.offset) as usize..][..SECTOR as usize];
                        format!("[{}..{} {}{}]", w.start, w.end, w.offset, if b == sector { " <- this" } else { "" })
                    })
                    .collect();
                let zero = sector.iter().all(|&b| b == 0);
                panic!("{what}: sector {s} holds neither its durable data nor a later write (zero: {zero}; writes {from:?}; flushes {flushes:?})");
            }
        }
    }
}

/// A pool with volume 1 (4 blocks) over a data device whose flushes can be made to fail.
async fn pool_over_failing_data() -> (Arc<PowerCut<MemDev>>, Arc<Pool>, ThinDev) {
    let md = Arc::new(MemDev::new(1 << 20));
    let data = Arc::new(PowerCut::new(MemDev::new(8 * BS)));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_thin(1).unwrap();
    m.commit(&*md).await.unwrap();
    let p = Pool::open(md, data.clone(), "", PoolOptions::default()).await.unwrap();
    let dev = ThinDev::new(p.clone(), 1, Some(4 * BS)).unwrap();
    (data, p, dev)
}

/// A pool that failed on its metadata device takes no more writes, also none to a block it
/// mapped before, whose data device still works.
#[tokio::test]
async fn a_pool_failed_on_its_metadata_takes_no_writes_to_mapped_blocks() {
    let md = Arc::new(PowerCut::new(MemDev::new(1 << 20)));
    let data = Arc::new(MemDev::new(8 * BS));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_thin(1).unwrap();
    m.commit(&*md).await.unwrap();
    let p = Pool::open(md.clone(), data, "", PoolOptions::default()).await.unwrap();
    let dev = ThinDev::new(p.clone(), 1, Some(4 * BS)).unwrap();
    dev.write(0, pattern(1, 0, 4096), false).await.unwrap();
    dev.flush().await.unwrap();
    // A new block: the next flush commits, and the metadata device fails it.
    dev.write(BS, pattern(2, BS, 4096), false).await.unwrap();
    md.fail_next_flush();
    assert!(dev.flush().await.is_err());
    assert_eq!(p.status().mode, "failed");
    assert!(dev.write(0, pattern(3, 0, 4096), false).await.is_err(), "a failed pool took a write to a mapped block");
    assert!(dev.write(0, pattern(3, 0, 4096), true).await.is_err(), "nor a FUA write");
}

/// A failed flush of the data device fails the pool and takes it back to its last commit (as
/// dm-thin aborts the transaction): a block copied from a snapshot's since then lost its data
/// with the flush, so reads must go to the committed, shared block again, which holds the
/// flushed data (they read zeroes from the lost copy before).
#[tokio::test]
async fn a_failed_flush_takes_the_pool_back_to_its_last_commit() {
    let (data, p, dev) = pool_over_failing_data().await;
    let flushed = pattern(1, 0, BS as usize);
    dev.write(0, flushed.clone(), false).await.unwrap();
    dev.flush().await.unwrap();
    p.with_meta(|m| m.create_snapshot(2, 1)).unwrap();
    p.commit().await.unwrap();
    // Copy-on-write into a new block, then the flush that would commit it fails.
    dev.write(4096, pattern(2, 4096, 4096), false).await.unwrap();
    data.fail_next_flush();
    assert!(dev.flush().await.is_err());
    assert_eq!(p.status().mode, "failed");
    let got = dev.read(0, Buf::zeroed(8192)).await.unwrap();
    assert_eq!(&got[..4096], &flushed[..4096], "flushed data of the volume's block");
    assert!(dev.write(0, pattern(3, 0, 512), false).await.is_err(), "a failed pool takes no writes");
}

/// A FLUSH that changes no mapping and whose data-device flush fails fails the pool too: the
/// overwrites it covered may be gone, so no later FLUSH may succeed and call them durable.
#[tokio::test]
async fn a_failed_flush_of_overwrites_fails_the_pool() {
    let (data, p, dev) = pool_over_failing_data().await;
    dev.write(0, pattern(1, 0, BS as usize), false).await.unwrap();
    dev.flush().await.unwrap();
    // An overwrite of the mapped block: the flush after it changes no mapping.
    dev.write(0, pattern(2, 0, 4096), false).await.unwrap();
    data.fail_next_flush();
    assert!(dev.flush().await.is_err());
    assert_eq!(p.status().mode, "failed");
    assert!(dev.flush().await.is_err(), "a later flush would call the lost overwrite durable");
    assert!(dev.write(0, pattern(3, 0, 4096), true).await.is_err(), "nor may a FUA write succeed");
}

/// A failed flush loses the data of a block copied from a snapshot's since the last commit,
/// and the pool goes back to that commit, where the volume maps the shared block again. A
/// read through the copy's mapping that meets the failed flush must not return what the
/// device lost: it reads what was durable (or fails), never zeroes. The read here is
/// delayed on the data device while the flush fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_meets_a_failed_flush_never_sees_lost_copies() {
    use strata_io::fault::{FaultDev, Ops, Rule};
    let md = Arc::new(MemDev::new(1 << 20));
    let cut = Arc::new(PowerCut::new(MemDev::new(8 * BS)));
    let (data, faults) = FaultDev::new(cut.clone());
    let mut m = Metadata::format(&*md, 8 * BS, BS, "", false).await.unwrap();
    m.create_thin(1).unwrap();
    m.commit(&*md).await.unwrap();
    let p = Pool::open(md.clone(), Arc::new(data), "", PoolOptions::default()).await.unwrap();
    let dev = Arc::new(ThinDev::new(p.clone(), 1, Some(4 * BS)).unwrap());
    let durable = pattern(7, 0, BS as usize);
    dev.write(0, durable.clone(), true).await.unwrap();
    p.with_meta(|m| m.create_snapshot(2, 1)).unwrap();
    p.commit().await.unwrap();
    // Copy-on-write: block 0 now maps a new block holding the copy, not yet flushed.
    dev.write(0, pattern(8, 0, 4096), false).await.unwrap();
    faults.add(Rule::delay(Ops::READ, std::time::Duration::from_millis(300)).once());
    let reader = {
        let dev = dev.clone();
        tokio::spawn(async move { dev.read(BS / 2, Buf::zeroed(4096)).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    cut.fail_next_flush();
    assert!(dev.flush().await.is_err(), "the flush fails");
    match reader.await.unwrap() {
        Ok(got) => assert!(got[..] == durable[BS as usize / 2..][..4096], "the read saw the lost copy"),
        Err(e) => assert!(e.context.contains("fail"), "{e}"),
    }
    // After the abort the volume reads its last commit: the shared block.
    let again = dev.read(BS / 2, Buf::zeroed(4096)).await;
    if let Ok(got) = again {
        assert!(got[..] == durable[BS as usize / 2..][..4096], "the volume reads its last commit");
    }
}
