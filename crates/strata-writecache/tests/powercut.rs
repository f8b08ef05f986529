//! Acknowledged writes survive a power cut, and an older copy never wins: a client writes
//! whole blocks (each 512-byte sector stamped with the write's tag), flushes and writes FUA,
//! over a log small enough that writes go around it and blocks are written back and evicted
//! while it runs. The fast device and the origin lose power together (`PowerCut` on one
//! `Clock`, with reordering and torn writes), and the volume is recovered from the images
//! left by a cut at many moments of the run. Every sector must hold the last write to it
//! that was durable at the cut, or one issued after it (never anything older, never torn
//! inside a sector), and the recovered slots must pass their invariants.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_io::powercut::{Clock, PowerCut, Window};
use strata_io::{BlockDev, Buf, ZeroFlags};
use strata_writecache::format::{Entry, ENTRY_PAGE_BYTES, FLAG_ZERO};
use strata_writecache::offline::{create, CreateOptions};
use strata_writecache::{OpenOptions, Tunables, WritecacheDev};

const BLOCK: u64 = 4096;
const BLOCKS: u64 = 64;
const SECTOR: u64 = 512;

/// One write of the run: its tag (0: zeroes), the clock before it was issued, and the clock
/// after it completed.
#[derive(Clone, Copy)]
struct Write {
    tag: u64,
    issued: u64,
    done: u64,
    fua: bool,
    /// Position in the run (ticks alone do not order requests that did no IO).
    op: usize,
}

struct Run {
    origin: Arc<PowerCut<MemDev>>,
    cache: Arc<PowerCut<MemDev>>,
    /// Per block, its writes in order.
    history: Vec<Vec<Write>>,
    /// Each flush: its position in the run and the clock once it completed.
    flushes: Vec<(usize, u64)>,
    /// The clock once the log was created and opened (cuts before are not the target's).
    start: u64,
}

fn stamp(tag: u64) -> Buf {
    let mut b = Buf::zeroed(BLOCK as usize);
    for chunk in b.chunks_mut(8) {
        chunk.copy_from_slice(&tag.to_le_bytes());
    }
    b
}

/// Gives a new log on `cache` one entry (block 0, zeroes) of commit `commit`, as if that
/// many commits had been made.
async fn as_if_committed(cache: &dyn BlockDev, commit: u64) {
    let sb = strata_writecache::offline::superblock(cache, None).await.unwrap();
    let mut page = vec![0u8; ENTRY_PAGE_BYTES as usize];
    Entry { block: 0, seq: 1, commit, flags: FLAG_ZERO, data_crc: 0 }.encode(&mut page);
    cache.write(sb.entries_offset(), Buf::from_slice(&page), true).await.unwrap();
}

/// Runs `ops` random requests on a new log. With `last_commit`, the log starts as if that
/// many commits had been made: it holds one entry (block 0, zeroes) of commit `last_commit`.
async fn run(seed: u64, ops: usize, cache_bytes: u64, t: Tunables, last_commit: Option<u64>) -> Run {
    let clock = Clock::default();
    let window = |s| Window { seed: s, max_delay: std::time::Duration::ZERO, ..Window::default() };
    let origin = Arc::new(PowerCut::with_clock(MemDev::new(BLOCKS * BLOCK), clock.clone()).with_window(window(seed)));
    let cache = Arc::new(PowerCut::with_clock(MemDev::new(cache_bytes), clock.clone()).with_window(window(seed + 1)));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, force: false, ..CreateOptions::default() })
        .await
        .unwrap();
    if let Some(commit) = last_commit {
        as_if_committed(&*cache, commit).await;
    }
    let dev =
        WritecacheDev::open(cache.clone(), origin.clone(), OpenOptions { tunables: Some(t), no_background: false })
            .await
            .unwrap();
    let start = clock.now();
    let mut history = vec![Vec::new(); BLOCKS as usize];
    let mut flushes = Vec::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in 0..ops {
        let b = rng.gen_range(0..BLOCKS);
        let issued = clock.now();
        match rng.gen_range(0..100) {
            0..=69 => {
                let tag = (seed << 32) | (i as u64 + 1);
                let fua = rng.gen_bool(0.1);
                dev.write(b * BLOCK, stamp(tag), fua).await.unwrap();
                let done = clock.now();
                history[b as usize].push(Write { tag, issued, done, fua, op: i });
            }
            70..=79 => {
                dev.flush().await.unwrap();
                flushes.push((i, clock.now()));
            }
            80..=89 => {
                dev.write_zeroes(b * BLOCK, BLOCK, ZeroFlags::default()).await.unwrap();
                history[b as usize].push(Write { tag: 0, issued, done: clock.now(), fua: false, op: i });
            }
            90..=94 => {
                dev.message("flush").await.unwrap();
            }
            _ => {
                let _ = dev.read(b * BLOCK, Buf::zeroed(BLOCK as usize)).await.unwrap();
            }
        }
    }
    origin.power_off();
    cache.power_off();
    drop(dev);
    Run { origin, cache, history, flushes, start }
}

/// Recovers from a cut at `tick` and checks every sector; returns a description of the
/// first violation.
async fn check_cut(r: &Run, tick: u64, seed: u64) -> Result<(), String> {
    let (Ok(op), Ok(cp)) = (r.origin.point_at_tick(tick), r.cache.point_at_tick(tick)) else {
        return Ok(()); // compacted away
    };
    let origin = Arc::new(r.origin.crash_at(op, seed).map_err(|e| e.to_string())?);
    let cache = Arc::new(r.cache.crash_at(cp, seed + 7).map_err(|e| e.to_string())?);
    let dev = WritecacheDev::open(cache, origin, OpenOptions { no_background: true, ..OpenOptions::default() })
        .await
        .map_err(|e| format!("tick {tick}: recovery failed: {e}"))?;
    dev.check_state().map_err(|e| format!("tick {tick}: {e}"))?;
    // A write is durable at the cut if it completed with FUA, or a flush issued after it
    // completed finished, before the cut.
    let durable = |w: &Write| (w.fua && w.done <= tick) || r.flushes.iter().any(|&(fi, fd)| fi > w.op && fd <= tick);
    let all = dev.read(0, Buf::zeroed((BLOCKS * BLOCK) as usize)).await.map_err(|e| e.to_string())?;
    for b in 0..BLOCKS as usize {
        let h = &r.history[b];
        let last_durable = h.iter().rposition(durable);
        let mut allowed: Vec<u64> = Vec::new();
        if last_durable.is_none() {
            allowed.push(0);
        }
        for (i, w) in h.iter().enumerate().skip(last_durable.unwrap_or(0)) {
            if w.issued <= tick || Some(i) == last_durable {
                allowed.push(w.tag);
            }
        }
        for s in 0..BLOCK / SECTOR {
            let at = (b as u64 * BLOCK + s * SECTOR) as usize;
            let sector = &all[at..at + SECTOR as usize];
            let tag = u64::from_le_bytes(sector[..8].try_into().unwrap());
            if !sector.chunks(8).all(|c| c == tag.to_le_bytes()) {
                return Err(format!("tick {tick}: block {b} sector {s} is torn"));
            }
            if !allowed.contains(&tag) {
                let hist: Vec<_> = h.iter().map(|w| (w.tag, w.issued, w.done)).collect();
                let fl: Vec<_> = r.flushes.iter().filter(|f| f.1 <= tick + 20).collect();
                let cache = r.cache.crash_at(cp, seed + 7).unwrap();
                let sb = strata_writecache::offline::superblock(&cache, None).await.unwrap();
                let scan = strata_writecache::offline::scan(&cache, &sb).await.unwrap();
                let newest = scan.newest.get(&(b as u64));
                let older: Vec<_> = scan.older.iter().filter(|e| e.1.block == b as u64).collect();
                let fates: Vec<_> =
                    r.cache.fates(cp, seed + 7).unwrap().into_iter().filter(|f| f.issued_at + 40 > cp).collect();
                return Err(format!(
                    "tick {tick}: block {b} sector {s} holds tag {tag:#x}, allowed {allowed:x?}; history {hist:x?}, \
                     flushes {fl:?}; log: newest {newest:?}, older {older:?}, garbage {:?}; last fast-device writes {fates:?}",
                    scan.findings
                ));
            }
        }
    }
    Ok(())
}

async fn cuts(seed: u64, cache_bytes: u64, t: Tunables, points: u64) -> u64 {
    cuts_from(seed, cache_bytes, t, points, None).await
}

async fn cuts_from(seed: u64, cache_bytes: u64, t: Tunables, points: u64, last_commit: Option<u64>) -> u64 {
    let r = run(seed, 300, cache_bytes, t, last_commit).await;
    let end = r.origin.now().max(r.cache.now());
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc0ffee);
    let mut checked = 0;
    for i in 0..points {
        let tick =
            if i < points / 4 { r.flushes.get(i as usize).map_or(end, |f| f.1) } else { rng.gen_range(r.start..=end) };
        check_cut(&r, tick, seed * 1000 + i).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        checked += 1;
    }
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_nothing_acknowledged_with_a_small_log() {
    let mut n = 0;
    for seed in 1..=4 {
        n += cuts(seed, 96 << 10, Tunables::default(), 150).await;
    }
    assert_eq!(n, 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_nothing_with_write_back_paused() {
    let t = Tunables { writeback_running: false, ..Tunables::default() };
    let mut n = 0;
    for seed in 11..=13 {
        n += cuts(seed, 96 << 10, t, 150).await;
    }
    assert_eq!(n, 450);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_nothing_with_a_log_larger_than_the_volume() {
    let mut n = 0;
    for seed in 21..=23 {
        n += cuts(seed, 512 << 10, Tunables { low_watermark: 0, ..Tunables::default() }, 150).await;
    }
    assert_eq!(n, 450);
}

/// Commit numbers go past 2^32 (the entry's 32-bit field) mid-run: the last commit's entries
/// must still be told from older ones at recovery, and counting on must not overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_nothing_as_commit_numbers_pass_2_to_the_32() {
    let mut n = 0;
    for seed in 31..=33 {
        n += cuts_from(seed, 96 << 10, Tunables::default(), 150, Some(u32::MAX as u64 - 5)).await;
    }
    assert_eq!(n, 450);
}

/// The last commit number a log can take (2^48 - 1) is taken; the next commit is refused
/// with the reason, not wrapped.
#[tokio::test]
async fn a_log_at_the_last_commit_number_refuses_the_next_commit() {
    use strata_writecache::format::COMMIT_MAX;
    let (origin, cache) = (Arc::new(MemDev::new(BLOCKS * BLOCK)), Arc::new(MemDev::new(96 << 10)));
    create(&*cache, &*origin, &CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() }).await.unwrap();
    as_if_committed(&*cache, COMMIT_MAX - 2).await;
    let o = OpenOptions { no_background: true, ..OpenOptions::default() };
    let dev = WritecacheDev::open(cache.clone(), origin.clone(), o).await.unwrap();
    dev.write(BLOCK, stamp(1), true).await.unwrap();
    let e = dev.write(2 * BLOCK, stamp(2), true).await.unwrap_err();
    assert_eq!(e.kind, strata_io::ErrorKind::NoSpace, "{e}");
    assert!(e.context.contains("commit numbers are used up"), "{e}");
}
