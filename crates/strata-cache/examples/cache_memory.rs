//! Resident memory of the cache target holding a full cache: a cache of BLOCKS blocks is
//! formatted on a sparse file, its table filled with clean mappings for as many blocks as the
//! policy holds (the origin, a sparse file of zeros, holds what the empty data area holds, so
//! the cache is consistent), and then opened as `strata serve` opens it. Prints the process's
//! resident memory before the table is read and with the cache open, per cached block.
//!
//! ```sh
//! cargo run --release -p strata-cache --example cache_memory -- 1048576 [POLICY] [DIR]
//! ```
//!
//! Nothing is kept in RAM but the target's own state: both files are sparse, under DIR
//! (default /var/tmp), and removed at the end. The block is 64 KiB, the default.

use std::path::Path;
use std::sync::Arc;
use strata_cache::format::Layout;
use strata_cache::meta::Meta;
use strata_cache::options::DEFAULT_BLOCK_BYTES;
use strata_cache::target::policy_capacity;
use strata_cache::{offline, CacheDev, CacheStatus, CreateOptions, OpenOptions};
use strata_io::file::{FileDev, FileOptions};
use strata_io::{BlockDev, Buf};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("VmRSS");
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().expect("VmRSS in kB") * 1024
}

fn sparse(path: &Path, bytes: u64) -> Arc<dyn BlockDev> {
    let opts = FileOptions { direct: false, create_size: Some(bytes), ..FileOptions::default() };
    Arc::new(FileDev::open(path, &opts).expect("sparse file"))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let slots: u64 = args.first().and_then(|s| s.parse().ok()).expect("usage: cache_memory BLOCKS [POLICY] [DIR]");
    let policy = args.get(1).cloned().unwrap_or_else(|| strata_policy::DEFAULT_POLICY.to_string());
    let dir = tempfile::tempdir_in(args.get(2).map_or("/var/tmp", String::as_str)).expect("scratch dir");
    let bs = DEFAULT_BLOCK_BYTES;
    let (cache_path, origin_path) = (dir.path().join("cache.img"), dir.path().join("origin.img"));
    let cache = sparse(&cache_path, Layout::new(slots, bs).end);
    let origin = sparse(&origin_path, slots * bs as u64);
    let o =
        CreateOptions { block_bytes: bs, policy, origin_spec: origin_path.display().to_string(), ..Default::default() };
    let sb = offline::create(&*cache, &*origin, &o).await.expect("format");

    // Every slot the policy can hold maps the origin block of its number, clean.
    let held = policy_capacity(sb.slots as usize) as u64;
    let (mut meta, _) = Meta::load(&*cache).await.expect("load");
    for s in 0..held {
        meta.set(s as u32, s, true, false);
    }
    for _ in 0..2 {
        let batch = meta.prepare_commit();
        for (_, off, _, bytes) in &batch.pages {
            cache.write(*off, Buf::from_slice(bytes), false).await.expect("table page");
        }
        meta.commit_done(&batch);
    }
    meta.write_superblock(&*cache).await.expect("superblock");
    cache.flush().await.expect("flush");
    drop(meta);
    strata_io::buf::trim_heap();

    let before = rss_bytes();
    let (meta, findings) = Meta::load(&*cache).await.expect("load");
    assert!(findings.errors.is_empty(), "{:?}", findings.errors);
    let dev = CacheDev::open(cache, origin, meta, OpenOptions::default()).await.expect("open");
    let s = CacheStatus::of(&dev).expect("status");
    assert_eq!(s.cached_blocks, held, "every block the policy holds is cached");
    strata_io::buf::trim_heap();
    let open = rss_bytes();
    println!(
        "{} blocks of {} KiB, policy {}, {held} cached: resident {:.1} MiB before the table is read, \
         {:.1} MiB open; {:.1} bytes per cached block",
        sb.slots,
        bs >> 10,
        s.policy,
        before as f64 / (1 << 20) as f64,
        open as f64 / (1 << 20) as f64,
        (open - before) as f64 / held as f64
    );
}
