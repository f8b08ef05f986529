//! Metadata that passes its checksums but says what no cache could: a superblock re-sealed
//! with a boundary value in one field, or a table page re-sealed with an entry past the
//! origin's end. A checksum stops accidental damage, not a crafted or buggy image, so
//! loading, checking and opening each must answer with a result, never panic, hang or size
//! anything by a number the device does not hold; and a cache that opens must open again
//! after a write, holding it.

use std::sync::Arc;
use std::time::Duration;
use strata_cache::format::{decode_page, encode_page, Layout, Superblock, PAGE};
use strata_cache::meta::{read_superblock, Meta};
use strata_cache::{offline, CacheDev, CreateOptions, OpenOptions};
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf};

const BLOCK: u32 = 32 << 10;
const ORIGIN: u64 = 4 << 20;
const CACHE: u64 = 2 << 20;

const U64S: [u64; 9] = [0, 1, 4095, 1 << 31, 1 << 32, 1 << 53, u64::MAX / 2, u64::MAX - 1, u64::MAX];
const U32S: [u32; 7] = [0, 1, 4095, 4096, 1 << 31, u32::MAX - 1, u32::MAX];

/// A cache device with a few blocks cached and dirty, shut down cleanly, over its origin.
async fn made() -> (Arc<MemDev>, Arc<MemDev>) {
    let (origin, cache) = (Arc::new(MemDev::new(ORIGIN)), Arc::new(MemDev::new(CACHE)));
    let o = CreateOptions { block_bytes: BLOCK, origin_spec: "mem:sealed".into(), ..CreateOptions::default() };
    offline::create(&*cache, &*origin, &o).await.unwrap();
    let (meta, _) = Meta::load(&*cache).await.unwrap();
    let dev = CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap();
    for b in 0..8u64 {
        dev.write(b * 3 * BLOCK as u64, Buf::from_slice(&vec![b as u8 + 1; BLOCK as usize]), false).await.unwrap();
    }
    dev.shutdown().await.unwrap();
    (origin, cache)
}

/// Checks, loads and opens the cache on `cache` as a server would (bounded in time: a
/// load with errors is refused there); says what each answered.
async fn try_everything(cache: &Arc<MemDev>, origin: &Arc<MemDev>) -> String {
    let all = async {
        let checked = match offline::check(&**cache).await {
            Ok((_, f)) if f.errors.is_empty() => "ok".to_string(),
            Ok((_, f)) => format!("damaged: {}", f.errors.join("; ")),
            Err(e) => format!("refused: {}", e.context),
        };
        let opened = match Meta::load(&**cache).await {
            Err(e) => format!("refused: {}", e.context),
            Ok((_, f)) if !f.errors.is_empty() => format!("refused: {}", f.errors.join("; ")),
            Ok((meta, _)) => match CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await {
                Err(e) => format!("refused: {}", e.context),
                Ok(dev) => {
                    // Opened: it must serve and close like any cache, and open again holding
                    // what it acknowledged (what it wrote, it reads back).
                    let _ = dev.read(0, Buf::zeroed(BLOCK as usize)).await;
                    let data = vec![9; BLOCK as usize];
                    let wrote = dev.write(BLOCK as u64, Buf::from_slice(&data), true).await.is_ok();
                    let _ = dev.shutdown().await;
                    let (meta, f) = Meta::load(&**cache).await.expect("a cache that opened loads again");
                    assert!(f.errors.is_empty(), "a cache that opened is damaged after: {:?}", f.errors);
                    let dev = CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await;
                    let dev = dev.expect("a cache that opened opens again");
                    let got = dev.read(BLOCK as u64, Buf::zeroed(BLOCK as usize)).await.unwrap();
                    assert!(!wrote || got[..] == data[..], "an acknowledged write is lost across a restart");
                    let _ = dev.shutdown().await;
                    "ok".to_string()
                }
            },
        };
        format!("check: {checked}; open: {opened}")
    };
    tokio::time::timeout(Duration::from_secs(20), all).await.expect("loading, checking or opening hung")
}

fn set_u64(sb: &mut Superblock, field: usize, v: u64) {
    let f = [
        &mut sb.seq,
        &mut sb.slots,
        &mut sb.origin_bytes,
        &mut sb.data_offset,
        &mut sb.table_offset,
        &mut sb.table_pages,
        &mut sb.hints_offset,
        &mut sb.hints_capacity,
        &mut sb.hints_len,
        &mut sb.sequential_cutoff_bytes,
        &mut sb.migration_budget_bytes_per_s,
    ];
    *f.into_iter().nth(field).unwrap() = v;
}

fn set_u32(sb: &mut Superblock, field: usize, v: u32) {
    let f = [&mut sb.block_bytes, &mut sb.hints_crc, &mut sb.writeback_percent, &mut sb.readahead_bytes];
    *f.into_iter().nth(field).unwrap() = v;
}

/// Writes `sb`, sealed, over both copies (a damaged newest copy alone is taken for a torn
/// write, and the other used); its layout fields made to agree with its slots and block
/// size where they can, so that the checks behind the layout's are reached too.
async fn write_sealed(cache: &MemDev, mut sb: Superblock, relayout: bool) {
    if let Some(l) = Layout::checked(sb.slots, sb.block_bytes).filter(|_| relayout) {
        (sb.table_offset, sb.table_pages, sb.hints_offset) = (l.table_offset, l.table_pages, l.hints_offset);
        (sb.hints_capacity, sb.data_offset) = (l.hints_capacity, l.data_offset);
    }
    for at in [0, PAGE as u64] {
        cache.write(at, Buf::from_slice(&sb.encode()), true).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_superblocks_with_boundary_values_are_answered_not_crashed_on() {
    use strata_cache::options::{MAX_READAHEAD_BYTES, MAX_WRITEBACK_PERCENT};
    let (origin, cache) = made().await;
    let image = cache.read(0, Buf::zeroed(CACHE as usize)).await.unwrap().to_vec();
    let sb = read_superblock(&*cache).await.unwrap();
    let crafted = |s: Superblock, relayout: bool| {
        let (cache, origin, image) = (cache.clone(), origin.clone(), image.clone());
        async move {
            cache.write(0, Buf::from_slice(&image), true).await.unwrap();
            write_sealed(&cache, s, relayout).await;
            try_everything(&cache, &origin).await
        }
    };
    let layout = [sb.data_offset, sb.table_offset, sb.table_pages, sb.hints_offset, sb.hints_capacity];
    for field in 0..11 {
        for v in U64S {
            for relayout in [false, true] {
                let mut s = sb.clone();
                set_u64(&mut s, field, v);
                let fits = Layout::checked(s.slots, s.block_bytes).is_some_and(|l| l.end <= CACHE);
                let refuse = match field {
                    0 => v >= 1 << 62,
                    1 => !fits || s.slots < sb.slots,
                    2 => v != ORIGIN,
                    3..=7 => !relayout && v != layout[field - 3],
                    8 => v > s.hints_capacity,
                    _ => false,
                };
                let said = crafted(s, relayout).await;
                if refuse {
                    assert!(said.contains("open: refused"), "field {field} = {v}: {said}");
                }
            }
        }
    }
    for field in 0..4 {
        for v in U32S {
            for relayout in [false, true] {
                let mut s = sb.clone();
                set_u32(&mut s, field, v);
                let refuse = match field {
                    0 => !v.is_power_of_two() || v < 4096 || Layout::checked(s.slots, v).is_none_or(|l| l.end > CACHE),
                    2 => v > MAX_WRITEBACK_PERCENT,
                    3 => v as u64 > MAX_READAHEAD_BYTES,
                    _ => false,
                };
                let said = crafted(s, relayout).await;
                if refuse {
                    assert!(said.contains("open: refused"), "field {field} = {v}: {said}");
                }
            }
        }
    }
    for text in ["", "no-such-policy", &"x".repeat(4000)] {
        for which in 0..3 {
            let mut s = sb.clone();
            *[&mut s.policy, &mut s.origin_spec, &mut s.origin_id][which] = text.to_string();
            let said = crafted(s, false).await;
            if which == 0 {
                assert!(said.contains("open: refused: unknown policy"), "policy {text:?}: {said}");
            }
        }
    }
    // The untouched image still opens: the cases above were refused for what they changed.
    cache.write(0, Buf::from_slice(&image), true).await.unwrap();
    assert_eq!(try_everything(&cache, &origin).await, "check: ok; open: ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_table_entries_past_the_origin_are_answered_not_crashed_on() {
    let (origin, cache) = made().await;
    let image = cache.read(0, Buf::zeroed(CACHE as usize)).await.unwrap().to_vec();
    let (meta, _) = Meta::load(&*cache).await.unwrap();
    let at = meta.layout.page_offset(0, 0);
    let page = cache.read(at, Buf::zeroed(PAGE)).await.unwrap().to_vec();
    let (seq, entries) = decode_page(0, &page).unwrap();
    let mapped = entries.iter().position(|e| e.valid).expect("a block is cached");
    let write_both = |e: Vec<strata_cache::format::Entry>, seq: u64| {
        let (cache, at) = (cache.clone(), [meta.layout.page_offset(0, 0), meta.layout.page_offset(0, 1)]);
        async move {
            // Both copies, so that neither is taken for a torn write.
            for at in at {
                cache.write(at, Buf::from_slice(&encode_page(0, seq, &e)), true).await.unwrap();
            }
        }
    };
    let blocks = ORIGIN / BLOCK as u64;
    for v in U64S.into_iter().chain([blocks, blocks - 1, (1 << 48) - 1]) {
        for also_dirty in [false, true] {
            cache.write(0, Buf::from_slice(&image), true).await.unwrap();
            let mut e = entries.clone();
            e[mapped].origin_block = v;
            e[mapped].dirty |= also_dirty;
            write_both(e, seq + 1).await;
            // An entry keeps 48 bits of its block.
            let kept =
                decode_page(0, &cache.read(at, Buf::zeroed(PAGE)).await.unwrap()).unwrap().1[mapped].origin_block;
            let said = try_everything(&cache, &origin).await;
            if kept >= blocks {
                assert!(said.contains("check: damaged") && said.contains("open: refused"), "block {kept}: {said}");
            }
        }
    }
    // Generations and commit sequences that counting on from would overflow, or reach
    // values the cache's own reading refuses.
    for v in U64S {
        cache.write(0, Buf::from_slice(&image), true).await.unwrap();
        let mut e = entries.clone();
        e[mapped].generation = v;
        write_both(e, seq + 1).await;
        let said = try_everything(&cache, &origin).await;
        if v >= 1 << 62 {
            assert!(said.contains("open: refused"), "generation {v}: {said}");
        }
        cache.write(0, Buf::from_slice(&image), true).await.unwrap();
        write_both(entries.clone(), v).await;
        let said = try_everything(&cache, &origin).await;
        if v >= 1 << 62 {
            assert!(said.contains("open: refused"), "commit sequence {v}: {said}");
        }
    }
    // Two slots claiming one origin block (a crash can leave that; the generations settle it).
    cache.write(0, Buf::from_slice(&image), true).await.unwrap();
    let mut e = entries.clone();
    let other = entries.iter().enumerate().position(|(i, x)| i != mapped && x.valid).expect("two blocks cached");
    e[other].origin_block = e[mapped].origin_block;
    write_both(e, seq + 1).await;
    try_everything(&cache, &origin).await;
}

/// Hints saved at a clean shutdown that name a block the table no longer maps (a repair
/// unmapped it, or the table was edited): the policy drops it at open, and what the policy
/// holds agrees with the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_naming_a_block_the_table_no_longer_maps_are_reconciled() {
    let (origin, cache) = made().await;
    let (meta, _) = Meta::load(&*cache).await.unwrap();
    assert!(meta.sb.clean_shutdown && meta.sb.hints_len > 0, "the rig saves hints");
    let at = meta.layout.page_offset(0, 0);
    let (seq, mut entries) = decode_page(0, &cache.read(at, Buf::zeroed(PAGE)).await.unwrap()).unwrap();
    let gone = entries.iter().position(|e| e.valid).expect("a block is cached");
    let block = entries[gone].origin_block;
    entries[gone].valid = false;
    entries[gone].dirty = false;
    for copy in 0..2 {
        let page = encode_page(0, seq + 1, &entries);
        cache.write(meta.layout.page_offset(0, copy), Buf::from_slice(&page), true).await.unwrap();
    }
    let (meta, findings) = Meta::load(&*cache).await.unwrap();
    assert!(findings.errors.is_empty(), "{findings:?}");
    let dev = CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap();
    dev.check_invariants().unwrap();
    // The block reads as the origin holds it (its dirty copy was unmapped with the entry).
    let got = dev.read(block * BLOCK as u64, Buf::zeroed(BLOCK as usize)).await.unwrap();
    assert!(got.iter().all(|&x| x == 0), "block {block}");
    // Every other block through the cache, more than it holds: it fills every slot the
    // policy manages (a block the policy held without a slot would keep one more free).
    for b in (0..ORIGIN / BLOCK as u64).filter(|&b| b != block) {
        dev.write(b * BLOCK as u64, Buf::from_slice(&vec![7; BLOCK as usize]), false).await.unwrap();
        dev.check_invariants().unwrap();
    }
    let s = dev.status().unwrap();
    let n = |k: &str| s[k].as_u64().unwrap();
    let reserve = strata_cache::target::slot_reserve(n("cache_blocks") as usize) as u64;
    assert_eq!(n("free_blocks"), reserve, "{s}");
}
