//! Entries no log writes, each sealed with a good checksum: blocks named by several entries
//! with one sequence, sequences and commits at their bounds, unknown flags, data checksums
//! that match and ones that do not, blocks past the origin. The log is refused with an
//! error or recovered; recovered, it serves what is written to it from then on, across a
//! flush and a restart. No case panics.

use rand::{Rng, SeedableRng};
use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf};
use strata_writecache::format::{Entry, Superblock, COMMIT_MAX, ENTRY_BYTES, FLAG_ZERO, SEQ_MAX, SUPERBLOCK_BYTES};
use strata_writecache::offline::{create, CreateOptions};
use strata_writecache::{OpenOptions, WritecacheDev};

const BLOCK: u64 = 4096;
const ORIGIN: u64 = 64 * BLOCK;
const CACHE: u64 = 256 << 10;

fn opts() -> OpenOptions {
    OpenOptions { no_background: true, ..OpenOptions::default() }
}

/// One of a few values, boundaries among them.
fn pick(rng: &mut impl Rng, values: &[u64]) -> u64 {
    values[rng.gen_range(0..values.len())]
}

/// A fresh log with `rng`'s entries sealed into it (and, for some, data matching them).
async fn crafted(rng: &mut impl Rng) -> (Arc<MemDev>, Arc<MemDev>) {
    let origin = Arc::new(MemDev::new(ORIGIN));
    let cache = Arc::new(MemDev::new(CACHE));
    let o = CreateOptions { block_bytes: BLOCK as u32, ..CreateOptions::default() };
    create(&*cache, &*origin, &o).await.unwrap();
    let head = cache.read(0, Buf::zeroed(SUPERBLOCK_BYTES as usize)).await.unwrap();
    let sb = Superblock::decode(&head, CACHE).unwrap();
    let blocks = ORIGIN / BLOCK;
    // Per log, one kind of extreme: entries a recovery must refuse (a block past the
    // origin, a sequence past 2^63, the last commit number), the last sequence a write may
    // take, the last commit numbers but one, or none.
    let (past_block, past_seq, last_commit) = match rng.gen_range(0..4) {
        0 => (blocks, SEQ_MAX, COMMIT_MAX - 1),
        1 => (blocks - 1, SEQ_MAX - 1, 2),
        2 => (blocks - 1, 3, COMMIT_MAX - 2),
        _ => (blocks - 1, 3, 2),
    };
    for _ in 0..rng.gen_range(1..2 * sb.slots) {
        let s = rng.gen_range(0..sb.slots);
        let data: Vec<u8> = (0..BLOCK).map(|_| rng.gen()).collect();
        let (any_block, any_seq, any_commit, any_flags) =
            (rng.gen_range(0..blocks), rng.gen_range(1..100), rng.gen_range(0..100), rng.gen_range(0..1 << 16));
        let e = Entry {
            block: pick(rng, &[0, 1, 2, any_block, blocks - 1, past_block]),
            seq: pick(rng, &[1, 2, 3, any_seq, SEQ_MAX - 1, past_seq]),
            commit: pick(rng, &[0, 1, 2, any_commit, u32::MAX as u64 + 1, last_commit]),
            flags: pick(rng, &[0, 0, FLAG_ZERO as u64, any_flags]) as u32,
            data_crc: if rng.gen_bool(0.7) { crc32c::crc32c(&data) } else { rng.gen() },
        };
        let mut raw = [0u8; ENTRY_BYTES as usize];
        e.encode(&mut raw);
        cache.write(sb.entries_offset() + s * ENTRY_BYTES, Buf::from_slice(&raw), false).await.unwrap();
        if rng.gen_bool(0.8) {
            cache.write(sb.slot_offset(s), Buf::from_slice(&data), false).await.unwrap();
        }
    }
    (cache, origin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_entries_no_log_writes_are_refused_or_recovered_to_a_log_that_serves() {
    let (mut refused, mut recovered, mut restarted) = (0, 0, 0);
    for seed in 0..300u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let (cache, origin) = crafted(&mut rng).await;
        let dev = match WritecacheDev::open(cache.clone(), origin.clone(), opts()).await {
            Ok(dev) => dev,
            Err(e) => {
                assert!(!e.context.is_empty(), "seed {seed}: an error that says nothing");
                refused += 1;
                continue;
            }
        };
        recovered += 1;
        // Every block reads; the ones written now read back, before and after a restart.
        for b in 0..ORIGIN / BLOCK {
            dev.read(b * BLOCK, Buf::zeroed(BLOCK as usize)).await.unwrap();
        }
        let written: Vec<u64> = (0..6).map(|_| rng.gen_range(0..ORIGIN / BLOCK)).collect();
        // A log whose entries took the last commit numbers refuses writes with a clear error.
        let used_up = |e: strata_io::Error| {
            assert!(e.context.contains("commit numbers are used up"), "seed {seed}: {e}");
        };
        let mut wrote = Ok(());
        for (i, &b) in written.iter().enumerate() {
            let fill = [i as u8 + 1; BLOCK as usize];
            wrote = wrote.and(dev.write(b * BLOCK, Buf::from_slice(&fill), rng.gen_bool(0.5)).await.map(drop));
        }
        if let Err(e) = wrote.and(dev.flush().await) {
            used_up(e);
            continue;
        }
        let expect = |b: u64| written.iter().rposition(|&w| w == b).map(|i| i as u8 + 1);
        for &b in &written {
            let got = dev.read(b * BLOCK, Buf::zeroed(BLOCK as usize)).await.unwrap();
            assert!(got.iter().all(|&x| Some(x) == expect(b)), "seed {seed}: block {b} before the restart");
        }
        dev.shutdown().await.unwrap();
        drop(dev);
        let dev = WritecacheDev::open(cache, origin, opts()).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for &b in &written {
            let got = dev.read(b * BLOCK, Buf::zeroed(BLOCK as usize)).await.unwrap();
            assert!(got.iter().all(|&x| Some(x) == expect(b)), "seed {seed}: block {b} after the restart");
        }
        dev.shutdown().await.unwrap();
        restarted += 1;
    }
    // Each kind of case comes up often.
    assert!(refused > 50 && restarted > 100, "{refused} refused, {recovered} recovered, {restarted} restarted");
}
