//! Power-cut simulation tests: the crash images `PowerCut` produces keep every durable
//! write, keep or drop the rest as the seed decides, tear only writes in flight, never
//! invent data, and come out the same for the same seed.
//!
//! Writes here stamp every 512-byte sector with the writing request's id and the sector's
//! number, so any sector of an image names the write it came from (0: zeroes), and a sector
//! mixing two writes is caught.

use futures::poll;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use strata_io::fault::{FaultDev, Rule};
use strata_io::mem::MemDev;
use strata_io::powercut::{Clock, Fate, PowerCut, Window};
use strata_io::testing::{random_ops, ModelOp, Workload};
use strata_io::{BlockDev, BoxFut, Buf, ErrorKind, Result, ZeroFlags};
use tokio::sync::Semaphore;

const SECTOR: u64 = 512;

/// Data for a write of `n` sectors at `first`, every sector stamped with `id`.
fn stamp(id: u64, first: u64, n: u64) -> Buf {
    let mut b = Buf::zeroed((n * SECTOR) as usize);
    for (i, s) in b.chunks_mut(SECTOR as usize).enumerate() {
        stamp_sector(s, id, first + i as u64);
    }
    b
}

fn stamp_sector(s: &mut [u8], id: u64, sector: u64) {
    s[..8].copy_from_slice(&id.to_le_bytes());
    s[8..16].copy_from_slice(&sector.to_le_bytes());
    for (j, x) in s[16..].iter_mut().enumerate() {
        *x = (id.wrapping_mul(31) ^ sector.wrapping_mul(7) ^ j as u64) as u8 | 1;
    }
}

/// Which write a sector of an image came from (0 for zeroes); an error for a sector that is
/// neither zeroes nor whole from one write.
fn identify(image: &MemDev, sector: u64) -> std::result::Result<u64, String> {
    let mut got = vec![0u8; SECTOR as usize];
    image.read_into(sector * SECTOR, &mut got).unwrap();
    if got.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let id = u64::from_le_bytes(got[..8].try_into().unwrap());
    let mut want = vec![0u8; SECTOR as usize];
    stamp_sector(&mut want, id, sector);
    if got != want {
        return Err(format!("sector {sector} is not whole from one write (claims id {id})"));
    }
    Ok(id)
}

fn ids(image: &MemDev, sectors: std::ops::Range<u64>) -> Vec<u64> {
    sectors.map(|s| identify(image, s).unwrap()).collect()
}

/// One request of a sequential workload, with the point of its issue event.
#[derive(Debug, Clone)]
enum Step {
    /// `id` 0 for zeroes (write_zeroes or discard).
    Write {
        id: u64,
        first: u64,
        n: u64,
        fua: bool,
        issued_at: u64,
    },
    Flush {
        issued_at: u64,
    },
}

/// Runs a seeded sequential workload on `dev`: stamped writes (some FUA), zeroes, discards
/// and flushes over `sectors` sectors.
async fn run_workload(dev: &PowerCut<MemDev>, seed: u64, count: usize, sectors: u64) -> Vec<Step> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut steps = Vec::new();
    for i in 0..count as u64 {
        let first = rng.gen_range(0..sectors);
        let n = rng.gen_range(1..=8.min(sectors - first));
        let issued_at = dev.now();
        match rng.gen_range(0..100) {
            0..=64 => {
                let fua = rng.gen_bool(0.1);
                dev.write(first * SECTOR, stamp(i + 1, first, n), fua).await.unwrap();
                steps.push(Step::Write { id: i + 1, first, n, fua, issued_at });
            }
            65..=72 => {
                dev.write_zeroes(first * SECTOR, n * SECTOR, ZeroFlags::default()).await.unwrap();
                steps.push(Step::Write { id: 0, first, n, fua: false, issued_at });
            }
            73..=77 => {
                dev.discard(first * SECTOR, n * SECTOR).await.unwrap();
                steps.push(Step::Write { id: 0, first, n, fua: false, issued_at });
            }
            _ => {
                dev.flush().await.unwrap();
                steps.push(Step::Flush { issued_at });
            }
        }
    }
    steps
}

/// For a crash at `point` of a sequential history: the values each sector may hold (the
/// last durable write to it, or any later write issued before the point), worked out
/// independently of the code under test. Each request is two events: issue, completion.
fn allowed(steps: &[Step], point: u64, sectors: u64) -> Vec<BTreeSet<u64>> {
    let mut allowed: Vec<BTreeSet<u64>> = (0..sectors).map(|_| BTreeSet::from([0])).collect();
    // Completion of a sequential request is the event right after its issue.
    let flush_done: Vec<u64> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Flush { issued_at } if issued_at + 1 < point => Some(*issued_at),
            _ => None,
        })
        .collect();
    for s in steps {
        let Step::Write { id, first, n, fua, issued_at } = *s else {
            continue;
        };
        if issued_at >= point {
            break;
        }
        let completed = issued_at + 1 < point;
        let flushed = flush_done.iter().any(|&f| f > issued_at + 1);
        let durable = completed && (fua || flushed);
        for sector in first..first + n {
            if durable {
                allowed[sector as usize].clear();
            }
            allowed[sector as usize].insert(id);
        }
    }
    allowed
}

#[tokio::test]
async fn every_cut_point_keeps_durable_writes_and_invents_nothing() {
    const SECTORS: u64 = 64;
    let dev = PowerCut::new(MemDev::new(SECTORS * SECTOR));
    let steps = run_workload(&dev, 1, 250, SECTORS).await;
    let mut seen = HashMap::new();
    for point in dev.first_point()..=dev.now() {
        let allowed = allowed(&steps, point, SECTORS);
        for seed in 0..6 {
            let image = dev.crash_at(point, seed).unwrap();
            for sector in 0..SECTORS {
                let id = identify(&image, sector).unwrap_or_else(|e| panic!("point {point} seed {seed}: {e}"));
                assert!(
                    allowed[sector as usize].contains(&id),
                    "point {point} seed {seed}: sector {sector} holds write {id}, allowed {:?}",
                    allowed[sector as usize]
                );
            }
            for f in dev.fates(point, seed).unwrap() {
                let kind = match f.fate {
                    Fate::Torn(_) => "torn",
                    Fate::Durable => "durable",
                    Fate::Kept => "kept",
                    Fate::Dropped => "dropped",
                    Fate::Lost => "lost",
                };
                *seen.entry(kind).or_insert(0u64) += 1;
            }
        }
    }
    for kind in ["durable", "kept", "dropped", "torn"] {
        assert!(seen.get(kind).copied().unwrap_or(0) > 0, "no write was ever {kind}: {seen:?}");
    }
}

#[tokio::test]
async fn durable_writes_survive_every_seed() {
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    dev.write(0, stamp(1, 0, 8), false).await.unwrap();
    dev.flush().await.unwrap();
    dev.write(8 * SECTOR, stamp(2, 8, 8), true).await.unwrap(); // FUA: durable alone
    dev.write(16 * SECTOR, stamp(3, 16, 8), false).await.unwrap(); // not durable
    for seed in 0..500 {
        let image = dev.crash(seed);
        assert_eq!(ids(&image, 0..8), [1; 8], "seed {seed}: flushed write lost");
        assert_eq!(ids(&image, 8..16), [2; 8], "seed {seed}: completed FUA write lost");
    }
}

#[tokio::test]
async fn unflushed_writes_are_sometimes_kept_and_sometimes_dropped() {
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    dev.write(0, stamp(1, 0, 4), false).await.unwrap();
    dev.flush().await.unwrap();
    dev.write(4 * SECTOR, stamp(2, 4, 4), false).await.unwrap();
    let (mut kept, mut dropped) = (0, 0);
    for seed in 0..200 {
        let got = ids(&dev.crash(seed), 4..8);
        match got[..] {
            [2, 2, 2, 2] => kept += 1,
            [0, 0, 0, 0] => dropped += 1,
            _ => panic!("seed {seed}: a completed write tore: {got:?}"),
        }
    }
    assert!(kept > 40 && dropped > 40, "kept {kept}, dropped {dropped} of 200");
    // A flush that completes makes it durable for every seed.
    dev.flush().await.unwrap();
    assert!((0..200).all(|seed| ids(&dev.crash(seed), 4..8) == [2; 4]));
}

#[tokio::test]
async fn writes_in_flight_tear_at_sector_granularity() {
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    dev.write(0, stamp(1, 0, 16), false).await.unwrap();
    dev.flush().await.unwrap();
    let issued_at = dev.now();
    dev.write(0, stamp(2, 0, 16), false).await.unwrap();
    // Cut between the issue and the completion: the second write is in flight.
    let mut mixes = 0;
    let mut images = BTreeSet::new();
    for seed in 0..300 {
        let image = dev.crash_at(issued_at + 1, seed).unwrap();
        let got = ids(&image, 0..16); // every sector whole: old (1) or new (2)
        assert!(got.iter().all(|&id| id == 1 || id == 2), "seed {seed}: {got:?}");
        if got.contains(&1) && got.contains(&2) {
            mixes += 1;
        }
        images.insert(got);
    }
    assert!(mixes > 30, "only {mixes} of 300 crashes tore the in-flight write");
    assert!(images.len() > 50, "torn images are too alike: {} distinct", images.len());

    // Unaligned writes tear at absolute sector boundaries, never inside a sector.
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    let at = dev.now();
    dev.write(100, Buf::from_slice(&[0xAB; 1000]), false).await.unwrap();
    let mut pieces_seen = BTreeSet::new();
    for seed in 0..300 {
        let image = dev.crash_at(at + 1, seed).unwrap();
        let mut got = vec![0u8; 1100];
        image.read_into(0, &mut got).unwrap();
        assert!(got[..100].iter().all(|&b| b == 0));
        let pieces = [&got[100..512], &got[512..1024], &got[1024..1100]];
        for p in pieces {
            let whole = p.iter().all(|&b| b == 0) || p.iter().all(|&b| b == 0xAB);
            assert!(whole, "seed {seed}: a piece tore inside a sector");
        }
        pieces_seen.insert(pieces.map(|p| p[0] == 0xAB));
    }
    assert_eq!(pieces_seen.len(), 8, "every mix of the three pieces occurs: {pieces_seen:?}");
}

#[tokio::test]
async fn fua_makes_only_its_own_write_durable() {
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    dev.write(0, stamp(1, 0, 4), false).await.unwrap();
    let fua_at = dev.now();
    dev.write(4 * SECTOR, stamp(2, 4, 4), true).await.unwrap();
    let (mut first_dropped, mut fua_dropped_in_flight) = (0, 0);
    for seed in 0..200 {
        let image = dev.crash(seed);
        assert_eq!(ids(&image, 4..8), [2; 4], "seed {seed}: completed FUA write lost");
        if ids(&image, 0..4) == [0; 4] {
            first_dropped += 1; // FUA is no flush: the earlier write may still be lost
        }
        let in_flight = dev.crash_at(fua_at + 1, seed).unwrap();
        if ids(&in_flight, 4..8) == [0; 4] {
            fua_dropped_in_flight += 1; // not durable until it completes
        }
    }
    assert!(first_dropped > 0, "the write before the FUA write was never dropped");
    assert!(fua_dropped_in_flight > 0, "an in-flight FUA write was never dropped");
}

#[tokio::test]
async fn same_seed_same_image() {
    let a = PowerCut::new(MemDev::new(64 * SECTOR));
    let b = PowerCut::new(MemDev::new(64 * SECTOR));
    let steps = run_workload(&a, 9, 120, 64).await;
    let again = run_workload(&b, 9, 120, 64).await;
    assert_eq!(steps.len(), again.len());
    let read_all = |m: &MemDev| {
        let mut v = vec![0u8; (64 * SECTOR) as usize];
        m.read_into(0, &mut v).unwrap();
        v
    };
    let mut distinct = BTreeSet::new();
    for seed in 0..40 {
        let one = read_all(&a.crash(seed));
        assert_eq!(one, read_all(&a.crash(seed)), "seed {seed}: two crashes differ");
        assert_eq!(one, read_all(&b.crash(seed)), "seed {seed}: the same history on another device differs");
        for point in [a.now() / 3, a.now() / 2] {
            assert_eq!(read_all(&a.crash_at(point, seed).unwrap()), read_all(&b.crash_at(point, seed).unwrap()));
        }
        distinct.insert(one);
    }
    assert!(distinct.len() > 5, "seeds barely matter: {} distinct images of 40", distinct.len());
}

/// A RAM device whose flushes wait until the test releases them, and whose writes can be
/// held the same way: requests that stay in flight as long as a test needs.
struct Held {
    mem: MemDev,
    flushes: Semaphore,
    writes: Semaphore,
}

impl Held {
    fn mem_ref(&self) -> &MemDev {
        &self.mem
    }

    fn new(size: u64, writes_free: bool) -> Held {
        let writes = Semaphore::new(if writes_free { Semaphore::MAX_PERMITS } else { 0 });
        Held { mem: MemDev::new(size), flushes: Semaphore::new(0), writes }
    }
}

impl BlockDev for Held {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn describe(&self) -> String {
        "held".into()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        self.mem.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            self.writes.acquire().await.unwrap().forget();
            self.mem.write(offset, buf, fua).await
        })
    }
    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            self.flushes.acquire().await.unwrap().forget();
            Ok(())
        })
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        self.mem.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        self.mem.write_zeroes(offset, len, flags)
    }
}

#[tokio::test]
async fn a_flush_covers_only_writes_completed_before_it_was_issued() {
    let dev = PowerCut::new(Held::new(64 * SECTOR, true));
    dev.write(0, stamp(1, 0, 4), false).await.unwrap();
    let flush = dev.flush();
    tokio::pin!(flush);
    assert!(poll!(&mut flush).is_pending(), "the flush is held");
    // Completes while the flush is in flight: the flush does not cover it.
    dev.write(4 * SECTOR, stamp(2, 4, 4), false).await.unwrap();
    let before_done = dev.now();
    dev.inner().flushes.add_permits(1);
    flush.await.unwrap();
    let mut second_dropped = 0;
    for seed in 0..200 {
        let image = dev.crash(seed);
        assert_eq!(ids(&image, 0..4), [1; 4], "seed {seed}: flushed write lost");
        if ids(&image, 4..8) == [0; 4] {
            second_dropped += 1;
        }
    }
    assert!(second_dropped > 0, "a write completed during the flush was never dropped");
    // Until the flush completed, nothing was durable.
    let lost_early = |seed| ids(&dev.crash_at(before_done, seed).unwrap(), 0..4) == [0; 4];
    let first_lost_early = (0..200).filter(|&seed| lost_early(seed)).count();
    assert!(first_lost_early > 0, "the write was durable before its flush completed");
}

#[tokio::test]
async fn a_failed_flush_makes_nothing_durable() {
    let (faulty, faults) = FaultDev::new(MemDev::new(64 * SECTOR));
    let dev = PowerCut::new(faulty);
    dev.write(0, stamp(1, 0, 4), false).await.unwrap();
    faults.add(Rule::flush_error().once());
    assert_eq!(dev.flush().await.unwrap_err().kind, ErrorKind::Io);
    let lost = (0..200).filter(|&seed| ids(&dev.crash(seed), 0..4) == [0; 4]).count();
    assert!(lost > 0, "a failed flush made the write durable");
    dev.flush().await.unwrap();
    assert!((0..200).all(|seed| ids(&dev.crash(seed), 0..4) == [1; 4]));
}

#[tokio::test]
async fn a_request_really_in_flight_at_power_off_may_tear() {
    let dev = Arc::new(PowerCut::new(Held::new(64 * SECTOR, false)));
    let d = dev.clone();
    let writer = tokio::spawn(async move { d.write(0, stamp(1, 0, 16), false).await });
    while dev.now() == 0 {
        tokio::task::yield_now().await;
    }
    let cut = dev.power_off();
    dev.inner().writes.add_permits(1);
    let err = writer.await.unwrap().unwrap_err();
    assert_eq!(err.kind, ErrorKind::Io, "the write completes after the power is gone");
    assert_eq!(dev.now(), cut, "nothing is recorded after the cut");
    let fates = dev.fates(cut, 0).unwrap();
    assert_eq!(fates.len(), 1);
    assert!(!fates[0].completed);
    let torn = (0..100).filter(|&seed| matches!(dev.fates(cut, seed).unwrap()[0].fate, Fate::Torn(_))).count();
    assert!(torn > 0, "an in-flight write never tore");
    for seed in 0..100 {
        let got = ids(&dev.crash(seed), 0..16);
        assert!(got.iter().all(|&id| id <= 1));
    }
}

#[tokio::test]
async fn power_off_fails_every_later_request() {
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    dev.write(0, stamp(1, 0, 1), false).await.unwrap();
    let cut = dev.power_off();
    assert!(dev.is_dead());
    assert_eq!(dev.read(0, Buf::zeroed(512)).await.unwrap_err().kind, ErrorKind::Io);
    assert_eq!(dev.write(0, stamp(2, 0, 1), false).await.unwrap_err().kind, ErrorKind::Io);
    assert_eq!(dev.flush().await.unwrap_err().kind, ErrorKind::Io);
    assert_eq!(dev.discard(0, 512).await.unwrap_err().kind, ErrorKind::Io);
    assert_eq!(dev.write_zeroes(0, 512, ZeroFlags::default()).await.unwrap_err().kind, ErrorKind::Io);
    assert_eq!(dev.now(), cut);
    assert!((0..50).all(|seed| ids(&dev.crash(seed), 0..1)[0] != 2), "a refused write reached an image");

    // Dying at a chosen point in the middle of a workload.
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    dev.power_off_at(5);
    dev.write(0, stamp(1, 0, 1), false).await.unwrap(); // points 0, 1
    dev.flush().await.unwrap(); // 2, 3
                                // Issued at point 4; its completion would be point 5, past the cut.
    assert_eq!(dev.write(512, stamp(2, 1, 1), false).await.unwrap_err().kind, ErrorKind::Io);
    assert_eq!(dev.now(), 5);
    let fates = dev.fates(5, 0).unwrap();
    assert_eq!((fates[0].fate.clone(), fates[1].completed), (Fate::Durable, false));
    assert_eq!(dev.crash_at(6, 0).err().map(|e| e.kind), Some(ErrorKind::Invalid));
}

#[tokio::test]
async fn replay_to_every_flush_point() {
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    let steps = run_workload(&dev, 3, 200, 64).await;
    let points = dev.flush_points();
    let flushes = steps.iter().filter(|s| matches!(s, Step::Flush { .. })).count();
    assert_eq!(points.len(), flushes);
    for &point in &points {
        // At a flush point of a sequential workload everything issued before is durable
        // except FUA-less writes after the flush; `allowed` knows, and so must the images.
        let allowed = allowed(&steps, point, 64);
        let image = dev.crash_at(point, point).unwrap();
        for sector in 0..64 {
            assert!(allowed[sector as usize].contains(&identify(&image, sector).unwrap()), "flush point {point}");
        }
        let last_write_durable = dev.fates(point, 1).unwrap().iter().all(|f| f.fate == Fate::Durable);
        assert!(last_write_durable, "a sequential history is wholly durable at its flush points");
    }
}

#[tokio::test]
async fn a_durable_history_crashes_to_the_inner_device_content() {
    // Every kind of request from the model workload, then a flush: every seed must give
    // back exactly what the device holds.
    let size = 256 << 10;
    let dev = PowerCut::new(MemDev::new(size));
    let w = Workload { granularity: 512, max_granules: 32, span: size };
    for op in random_ops(4, 400, size, &w) {
        match op {
            ModelOp::Read { .. } => {}
            ModelOp::Write { offset, len, fua, fill } => {
                dev.write(offset, strata_io::testing::pattern(fill, offset, len as usize), fua).await.unwrap();
            }
            ModelOp::Flush => dev.flush().await.unwrap(),
            ModelOp::Discard { offset, len } => dev.discard(offset, len).await.unwrap(),
            ModelOp::WriteZeroes { offset, len, may_unmap } => {
                let flags = ZeroFlags { may_unmap, fast_only: false };
                dev.write_zeroes(offset, len, flags).await.unwrap();
            }
        }
    }
    dev.flush().await.unwrap();
    let mut want = vec![0u8; size as usize];
    dev.inner().read_into(0, &mut want).unwrap();
    for seed in 0..20 {
        let mut got = vec![0u8; size as usize];
        dev.crash(seed).read_into(0, &mut got).unwrap();
        assert!(got == want, "seed {seed}: the durable image differs from the device");
    }
}

#[tokio::test]
async fn compaction_bounds_history_and_changes_no_image() {
    let full = PowerCut::new(MemDev::new(64 * SECTOR));
    let bounded = PowerCut::new(MemDev::new(64 * SECTOR));
    let limit = 64 << 10;
    bounded.set_history_limit(limit);
    let a = run_workload(&full, 5, 400, 64).await;
    let b = run_workload(&bounded, 5, 400, 64).await;
    assert_eq!(a.len(), b.len());
    assert!(bounded.history_bytes() <= limit);
    assert!(bounded.first_point() > 0, "nothing was compacted");
    assert_eq!(full.first_point(), 0);
    let read_all = |m: MemDev| {
        let mut v = vec![0u8; (64 * SECTOR) as usize];
        m.read_into(0, &mut v).unwrap();
        v
    };
    for point in bounded.first_point()..=bounded.now() {
        for seed in 0..3 {
            let want = read_all(full.crash_at(point, seed).unwrap());
            assert!(read_all(bounded.crash_at(point, seed).unwrap()) == want, "point {point} seed {seed}");
        }
    }
    assert_eq!(bounded.crash_at(bounded.first_point() - 1, 0).err().map(|e| e.kind), Some(ErrorKind::Invalid));

    // Without flushes nothing can be compacted: writes are refused once the limit is hit.
    let dev = PowerCut::new(MemDev::new(64 * SECTOR));
    dev.set_history_limit(16 << 10);
    let mut refused = None;
    for i in 0..64 {
        if let Err(e) = dev.write(i * SECTOR, stamp(i + 1, i, 1), false).await {
            refused = Some((i, e.kind));
            break;
        }
    }
    let (at, kind) = refused.expect("the history grew without bound");
    assert_eq!(kind, ErrorKind::NoMemory);
    assert!(dev.history_bytes() <= 16 << 10, "history {} after {at} writes", dev.history_bytes());
    dev.flush().await.unwrap();
    dev.write(0, stamp(99, 0, 1), false).await.unwrap(); // flushed history compacts away
}

#[tokio::test]
async fn capture_starts_from_the_existing_content() {
    let mem = MemDev::new(64 * SECTOR);
    mem.write_from(0, &stamp(7, 0, 4)).unwrap();
    let dev = PowerCut::capture(mem).await.unwrap();
    dev.write(4 * SECTOR, stamp(8, 4, 1), false).await.unwrap();
    for seed in 0..50 {
        assert_eq!(ids(&dev.crash(seed), 0..4), [7; 4]);
    }
}

/// A RAM device that makes each write and flush wait a seeded number of scheduler turns,
/// so concurrent requests overlap and complete out of order, deterministically on a
/// current-thread runtime.
struct Shuffled {
    mem: MemDev,
    rng: Mutex<ChaCha8Rng>,
}

impl Shuffled {
    async fn wander(&self) {
        let turns = self.rng.lock().gen_range(0..8);
        for _ in 0..turns {
            tokio::task::yield_now().await;
        }
    }
}

impl BlockDev for Shuffled {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn describe(&self) -> String {
        "shuffled".into()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        self.mem.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            self.wander().await;
            self.mem.write(offset, buf, fua).await
        })
    }
    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            self.wander().await;
            Ok(())
        })
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        self.mem.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        self.mem.write_zeroes(offset, len, flags)
    }
}

#[tokio::test]
async fn concurrent_writers_crash_to_written_data_only() {
    // Four writers, each in its own 16-sector region, with overlapping requests and flushes;
    // the power fails at a seeded point. Every sector of every image must hold zeroes or a
    // value written to that sector, and what a writer saw flushed must be there (or a later
    // write of its own).
    const WRITERS: u64 = 4;
    const REGION: u64 = 16;
    for run in 0..8u64 {
        let rng = Mutex::new(ChaCha8Rng::seed_from_u64(run));
        let inner = Shuffled { mem: MemDev::new(WRITERS * REGION * SECTOR), rng };
        let dev = Arc::new(PowerCut::new(inner));
        dev.power_off_at(ChaCha8Rng::seed_from_u64(run).gen_range(50..400));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let dev = dev.clone();
            tasks.push(tokio::spawn(async move {
                let mut rng = ChaCha8Rng::seed_from_u64(run * 100 + w);
                // Per sector: (id, durable as far as this writer knows) in issue order.
                let mut log: Vec<Vec<(u64, bool)>> = vec![Vec::new(); REGION as usize];
                let mut acked: Vec<(u64, u64)> = Vec::new(); // (sector, id) completed, not yet flushed
                for i in 0..100u64 {
                    let id = w * 1000 + i + 1;
                    if rng.gen_bool(0.2) {
                        if dev.flush().await.is_err() {
                            break;
                        }
                        for (sector, id) in acked.drain(..) {
                            let e = log[sector as usize].iter_mut().rev().find(|e| e.0 == id).expect("logged");
                            e.1 = true;
                        }
                        continue;
                    }
                    let first = rng.gen_range(0..REGION);
                    let n = rng.gen_range(1..=4.min(REGION - first));
                    let abs = w * REGION + first;
                    let fua = rng.gen_bool(0.1);
                    for s in first..first + n {
                        log[s as usize].push((id, false));
                    }
                    match dev.write(abs * SECTOR, stamp(id, abs, n), fua).await {
                        Ok(_) => {
                            for s in first..first + n {
                                if fua {
                                    log[s as usize].last_mut().unwrap().1 = true;
                                } else {
                                    acked.push((s, id));
                                }
                            }
                        }
                        Err(_) => break,
                    }
                }
                log
            }));
        }
        let mut logs = Vec::new();
        for t in tasks {
            logs.push(t.await.unwrap());
        }
        assert!(dev.is_dead(), "run {run}: the power never failed");
        let fates = dev.fates(dev.now(), 0).unwrap();
        assert!(fates.iter().any(|f| !f.completed), "run {run}: nothing was in flight at the cut");
        for seed in 0..40 {
            let image = dev.crash(seed);
            for (w, log) in logs.iter().enumerate() {
                for (s, entries) in log.iter().enumerate() {
                    let abs = w as u64 * REGION + s as u64;
                    let got = identify(&image, abs).unwrap_or_else(|e| panic!("run {run} seed {seed}: {e}"));
                    let last_durable = entries.iter().rposition(|e| e.1);
                    let allowed: BTreeSet<u64> = match last_durable {
                        Some(k) => entries[k..].iter().map(|e| e.0).collect(),
                        None => entries.iter().map(|e| e.0).chain([0]).collect(),
                    };
                    let why = format!("run {run} seed {seed}: sector {abs} holds {got}, allowed {allowed:?}");
                    assert!(allowed.contains(&got), "{why}");
                }
            }
        }
    }
}

fn window(seed: u64) -> Window {
    Window { seed, max_delay: Duration::from_millis(4), reorder: true, tear_completed: false, flush_fail: 0.0 }
}

#[tokio::test]
async fn a_window_write_reaches_the_inner_device_only_when_it_completes() {
    let dev = Arc::new(
        PowerCut::new(MemDev::new(64 * SECTOR))
            .with_window(Window { max_delay: Duration::from_millis(30), ..window(1) }),
    );
    dev.write(0, stamp(1, 0, 4), false).await.unwrap();
    // Find a write whose seeded delay is long enough to look at it in flight.
    let d = dev.clone();
    let writer = tokio::spawn(async move { d.write(0, stamp(2, 0, 4), false).await });
    while dev.now() < 3 {
        tokio::task::yield_now().await;
    }
    let seen_before = ids(dev.inner(), 0..4);
    let through = dev.read(0, Buf::zeroed(4 * SECTOR as usize)).await.unwrap();
    writer.await.unwrap().unwrap();
    assert_eq!(seen_before, [1; 4], "the inner device had the data before the write completed");
    assert_eq!(u64::from_le_bytes(through[..8].try_into().unwrap()), 1, "a read before completion saw the new data");
    assert_eq!(ids(dev.inner(), 0..4), [2; 4]);
    let mut got = vec![0u8; 4 * SECTOR as usize];
    dev.inner().read_into(0, &mut got).unwrap();
    assert_eq!(dev.read(0, Buf::zeroed(got.len())).await.unwrap()[..], got[..]);
}

/// Two overlapping writes issued together on a window device: which lands last, per seed.
async fn race(w: Window) -> (u64, Vec<u64>) {
    let dev = Arc::new(PowerCut::new(MemDev::new(64 * SECTOR)).with_window(w));
    let (a, b) = (dev.clone(), dev.clone());
    let t1 = tokio::spawn(async move { a.write(0, stamp(1, 0, 4), false).await.unwrap() });
    while dev.now() < 1 {
        tokio::task::yield_now().await;
    }
    let t2 = tokio::spawn(async move { b.write(0, stamp(2, 0, 4), false).await.unwrap() });
    t1.await.unwrap();
    t2.await.unwrap();
    dev.flush().await.unwrap();
    let live = ids(dev.inner(), 0..1)[0];
    let images = (0..10).map(|seed| ids(&dev.crash(seed), 0..1)[0]).collect();
    (live, images)
}

#[tokio::test]
async fn overlapping_writes_land_out_of_order_and_images_follow_landing_order() {
    let mut winners = BTreeSet::new();
    for seed in 0..30 {
        let (live, images) = race(window(seed)).await;
        // Both completed before the flush: durable, so the one that landed last is there.
        assert!(images.iter().all(|&id| id == live), "seed {seed}: images {images:?}, inner device {live}");
        winners.insert(live);
    }
    assert_eq!(winners, BTreeSet::from([1, 2]), "the later write never landed first (or never last)");
    for seed in 0..15 {
        let (live, _) = race(Window { reorder: false, ..window(seed) }).await;
        assert_eq!(live, 2, "seed {seed}: without reordering the later write lands last");
    }
}

#[tokio::test]
async fn completed_writes_tear_with_tear_completed() {
    let dev = PowerCut::new(MemDev::new(64 * SECTOR)).with_window(Window {
        tear_completed: true,
        max_delay: Duration::ZERO,
        ..window(3)
    });
    dev.write(0, stamp(1, 0, 16), false).await.unwrap();
    dev.flush().await.unwrap();
    dev.write(0, stamp(2, 0, 16), false).await.unwrap(); // completed, not flushed
    let mut torn = 0;
    for seed in 0..200 {
        let got = ids(&dev.crash(seed), 0..16);
        assert!(got.iter().all(|&id| id == 1 || id == 2), "seed {seed}: {got:?}");
        torn += (got.contains(&1) && got.contains(&2)) as u32;
    }
    assert!(torn > 20, "a completed write tore in only {torn} of 200 crashes");
    dev.flush().await.unwrap();
    assert!((0..50).all(|seed| ids(&dev.crash(seed), 0..16) == [2; 16]), "a flushed write tore");
}

#[tokio::test]
async fn a_failed_flush_loses_what_it_covered_for_good() {
    for w in [None, Some(window(5))] {
        let mut dev = PowerCut::new(MemDev::new(64 * SECTOR));
        if let Some(w) = w.clone() {
            dev = dev.with_window(w);
        }
        dev.write(0, stamp(1, 0, 4), false).await.unwrap();
        dev.flush().await.unwrap();
        dev.write(0, stamp(2, 0, 4), false).await.unwrap(); // covered by the failing flush
        dev.write(8 * SECTOR, stamp(3, 8, 2), true).await.unwrap(); // FUA: durable already
        dev.fail_next_flush();
        assert_eq!(dev.flush().await.unwrap_err().kind, ErrorKind::Io);
        assert_eq!(dev.lost_flushes(), 1);
        assert_eq!(ids(dev.inner(), 0..4), [1; 4], "{w:?}: the lost write is still on the inner device");
        assert_eq!(ids(dev.inner(), 8..10), [3; 2]);
        let back = dev.read(0, Buf::zeroed(512)).await.unwrap();
        assert_eq!(u64::from_le_bytes(back[..8].try_into().unwrap()), 1, "reads return the older data");
        dev.write(4 * SECTOR, stamp(4, 4, 2), false).await.unwrap(); // after the failure: kept
        dev.flush().await.unwrap();
        for seed in 0..100 {
            let image = dev.crash(seed);
            assert_eq!(ids(&image, 0..4), [1; 4], "{w:?} seed {seed}: a lost write came back");
            assert_eq!(ids(&image, 4..6), [4; 2], "{w:?} seed {seed}: a later flushed write is gone");
            assert_eq!(ids(&image, 8..10), [3; 2]);
        }
        let fates = dev.fates(dev.now(), 0).unwrap();
        assert_eq!(fates.iter().filter(|f| f.fate == Fate::Lost).count(), 1);
        // Compaction keeps it lost.
        dev.compact();
        assert_eq!(ids(&dev.crash(1), 0..4), [1; 4]);
    }
}

#[tokio::test]
async fn a_failed_flush_keeps_writes_completed_after_its_issue() {
    let dev = Arc::new(PowerCut::new(Held::new(64 * SECTOR, true)));
    dev.write(0, stamp(1, 0, 4), false).await.unwrap();
    dev.fail_next_flush();
    // A window delays the flush so a write can complete while it is in flight.
    dev.set_window(Some(Window { max_delay: Duration::from_millis(50), ..window(0) }));
    let d = dev.clone();
    let flush = tokio::spawn(async move { d.flush().await });
    while dev.now() < 3 {
        tokio::task::yield_now().await;
    }
    dev.set_window(None);
    dev.write(4 * SECTOR, stamp(2, 4, 4), false).await.unwrap();
    flush.await.unwrap().unwrap_err();
    assert_eq!(ids(dev.inner().mem_ref(), 0..8), [0, 0, 0, 0, 2, 2, 2, 2]);
    dev.inner().flushes.add_permits(1);
    dev.flush().await.unwrap();
    assert!((0..50).all(|seed| ids(&dev.crash(seed), 0..8) == [0, 0, 0, 0, 2, 2, 2, 2]));
}

#[tokio::test]
async fn seeded_flush_failures_fail_some_flushes() {
    let dev = PowerCut::new(MemDev::new(64 * SECTOR)).with_window(Window {
        flush_fail: 0.3,
        max_delay: Duration::ZERO,
        ..window(8)
    });
    let mut failed = 0;
    for i in 0..60u64 {
        dev.write((i % 64) * SECTOR, stamp(i + 1, i % 64, 1), false).await.unwrap();
        failed += dev.flush().await.is_err() as u64;
    }
    assert_eq!(dev.lost_flushes(), failed);
    assert!((5..40).contains(&failed), "{failed} of 60 flushes failed at 30%");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_window_writers_on_a_shared_clock_crash_to_allowed_data() {
    // Writers on two window devices sharing a clock, each writer sequential in its own
    // region; cut both at one tick. Every sector holds zeroes or a value written there, and
    // what a writer saw flushed (or FUA) is there or a later write of its own.
    const REGION: u64 = 16;
    for run in 0..4u64 {
        let clock = Clock::default();
        let w = Window { tear_completed: true, flush_fail: 0.05, ..window(run) };
        let devs: Vec<Arc<PowerCut<MemDev>>> = (0..2)
            .map(|i| {
                Arc::new(
                    PowerCut::with_clock(MemDev::new(2 * REGION * SECTOR), clock.clone())
                        .with_window(Window { seed: run * 10 + i, ..w.clone() }),
                )
            })
            .collect();
        let mut tasks = Vec::new();
        for wr in 0..4u64 {
            let dev = devs[(wr % 2) as usize].clone();
            tasks.push(tokio::spawn(async move {
                let base = (wr / 2) * REGION;
                let mut rng = ChaCha8Rng::seed_from_u64(run * 100 + wr);
                // Per sector: (id, durable) in issue order.
                let mut log: Vec<Vec<(u64, bool)>> = vec![Vec::new(); REGION as usize];
                let mut acked: Vec<(u64, u64, u64)> = Vec::new();
                for i in 0..40u64 {
                    let id = wr * 1000 + i + 1;
                    if rng.gen_bool(0.2) {
                        // Any writer's failed flush loses what it covered, mine included: a
                        // write is durable only if no flush failed between its completion
                        // and my flush's success.
                        let ok = dev.flush().await.is_ok();
                        let lost_now = dev.lost_flushes();
                        for (s, id, lost_then) in acked.drain(..) {
                            if ok && lost_then == lost_now {
                                log[s as usize].iter_mut().rev().find(|e| e.0 == id).unwrap().1 = true;
                            }
                        }
                        continue;
                    }
                    let first = rng.gen_range(0..REGION);
                    let n = rng.gen_range(1..=4.min(REGION - first));
                    let fua = rng.gen_bool(0.1);
                    for s in first..first + n {
                        log[s as usize].push((id, false));
                    }
                    let lost_then = dev.lost_flushes();
                    dev.write((base + first) * SECTOR, stamp(id, base + first, n), fua).await.unwrap();
                    for s in first..first + n {
                        if fua {
                            log[s as usize].last_mut().unwrap().1 = true;
                        } else {
                            acked.push((s, id, lost_then));
                        }
                    }
                }
                (base, log)
            }));
        }
        let mut logs = Vec::new();
        for t in tasks {
            logs.push(t.await.unwrap());
        }
        let tick = ChaCha8Rng::seed_from_u64(run).gen_range(clock.now() / 2..clock.now());
        for seed in 0..10 {
            for (wr, (base, log)) in logs.iter().enumerate() {
                let dev = &devs[wr % 2];
                let image = dev.crash_at(dev.point_at_tick(tick).unwrap(), seed).unwrap();
                let _ = image;
                // Only the end state is checked against the writer's log (its durability
                // knowledge is of the end); cut images are checked for invented data.
                let end = dev.crash(seed);
                for (s, entries) in log.iter().enumerate() {
                    let abs = base + s as u64;
                    let got = identify(&end, abs).unwrap_or_else(|e| panic!("run {run} seed {seed}: {e}"));
                    let allowed: BTreeSet<u64> = match entries.iter().rposition(|e| e.1) {
                        Some(k) => entries[k..].iter().map(|e| e.0).collect(),
                        None => entries.iter().map(|e| e.0).chain([0]).collect(),
                    };
                    assert!(
                        allowed.contains(&got),
                        "run {run} seed {seed}: sector {abs} holds {got}, allowed {allowed:?}"
                    );
                    identify(&image, abs).unwrap();
                }
            }
        }
    }
}
