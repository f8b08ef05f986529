//! Pool-scale figures: a volume with N mapped blocks, S snapshots each overwriting a share of
//! it, then the time to open and check the pool, a snapshot's creation time, metadata bytes
//! per mapped block, and the time a deleted snapshot's own 1 GiB, and a deleted volume of N
//! blocks of its own, take to show free (deleted in committed steps, as a server does).
//! `cargo run --release -p strata-thin --example scale -- 1000000 100 10 [PATH]`: with PATH,
//! the metadata is also written there (a sparse file) and opened and checked from it too.

use std::time::Instant;
use strata_io::file::{FileDev, FileOptions};
use strata_io::mem::MemDev;
use strata_io::BlockDev;
use strata_thin::meta::Metadata;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("open") {
        let path = std::env::args().nth(2).expect("scale open PATH");
        return open_file(std::path::Path::new(&path)).await;
    }
    let args: Vec<u64> = std::env::args().skip(1).take(3).map(|a| a.parse().expect("numbers")).collect();
    let (n, snaps, churn) = (
        args.first().copied().unwrap_or(1_000_000),
        args.get(1).copied().unwrap_or(100),
        args.get(2).copied().unwrap_or(10),
    );
    let own = (1u64 << 30) / 65536;
    let data_blocks = 2 * n + snaps * n * churn / 100 + own + 1000;
    let md = MemDev::new(4 << 30);
    let mut m = Metadata::format(&md, data_blocks * 65536, 65536, "", false).await.unwrap();
    m.create_thin(0).unwrap();
    let t = Instant::now();
    for v in 0..n {
        let b = m.alloc_data().unwrap();
        m.insert(0, v, b).unwrap();
    }
    m.commit(&md).await.unwrap();
    println!("{n} mappings inserted and committed in {:?}", t.elapsed());
    let used = m.tm.md.allocated();
    println!("metadata: {used} blocks, {:.1} bytes per mapped block", used as f64 * 4096.0 / n as f64);
    let mut x = 12345u64;
    for s in 1..=snaps as u32 {
        let t = Instant::now();
        m.create_snapshot(s, 0).unwrap();
        let took = t.elapsed();
        if s == 1 {
            println!("snapshot of a volume of {n} mapped blocks: {took:?}");
        }
        for _ in 0..n * churn / 100 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let b = m.alloc_data().unwrap();
            m.insert(s, (x >> 11) % n, b).unwrap();
        }
        m.commit(&md).await.unwrap();
    }
    println!("metadata with {snaps} snapshots at {churn}% churn: {} blocks", m.tm.md.allocated());
    // A snapshot with 1 GiB of its own data, deleted: how long until the space shows free
    // (the delete and its commit).
    let del = snaps as u32 + 1;
    m.create_snapshot(del, 0).unwrap();
    for v in 0..own.min(n) {
        let b = m.alloc_data().unwrap();
        m.insert(del, v, b).unwrap();
    }
    m.commit(&md).await.unwrap();
    deleted(&mut m, &md, del, &format!("a snapshot with {} own blocks", own.min(n))).await;
    // A volume of n blocks of its own, deleted.
    let vol = del + 1;
    m.create_thin(vol).unwrap();
    for v in 0..n {
        let b = m.alloc_data().unwrap();
        m.insert(vol, v, b).unwrap();
    }
    m.commit(&md).await.unwrap();
    deleted(&mut m, &md, vol, &format!("a volume of {n} blocks of its own")).await;
    drop(m);
    open_and_check(&md, "in RAM").await;
    if let Some(path) = std::env::args().nth(4) {
        let path = std::path::Path::new(&path);
        let f = std::fs::File::create(path).unwrap();
        f.set_len(md.size()).unwrap();
        let mut chunk = vec![0u8; 16 << 20];
        for at in (0..md.size()).step_by(chunk.len()) {
            md.read_into(at, &mut chunk).unwrap();
            if chunk.iter().any(|&b| b != 0) {
                std::os::unix::fs::FileExt::write_all_at(&f, &chunk, at).unwrap();
            }
        }
        drop((f, md));
        open_file(path).await;
    }
}

/// Deletes device `id` as a server does: marked (one transaction, committed), then freed by
/// steps of `DELETE_STEP_NODES` nodes, committed every `DELETE_STEPS_PER_COMMIT` steps and at
/// the end. Prints the time the mark holds the
/// pool, the longest step (what holds the pool's lock; its commit runs outside it), and
/// the time until the space shows free.
async fn deleted(m: &mut Metadata, md: &MemDev, id: u32, what: &str) {
    let free = m.tm.data.free();
    let t = Instant::now();
    m.start_delete(id).unwrap();
    m.commit(md).await.unwrap();
    let marked = t.elapsed();
    let (mut steps, mut longest, mut commits) = (0, std::time::Duration::ZERO, std::time::Duration::ZERO);
    let mut stepping = std::time::Duration::ZERO;
    loop {
        let s = Instant::now();
        let done = m.delete_step(id, strata_thin::pool::DELETE_STEP_NODES).unwrap();
        longest = longest.max(s.elapsed());
        stepping += s.elapsed();
        steps += 1;
        if done || steps % strata_thin::pool::DELETE_STEPS_PER_COMMIT == 0 {
            let c = Instant::now();
            m.commit(md).await.unwrap();
            commits = commits.max(c.elapsed());
        }
        if done {
            break;
        }
    }
    println!(
        "delete of {what}: marked and committed in {marked:?}; {steps} steps, the longest {longest:?}, \
         {stepping:?} in all (a commit at most {commits:?}); {:?} until {} blocks show free",
        t.elapsed(),
        m.tm.data.free() - free
    );
}

/// Opens and checks the metadata in the file at `path` (`scale open PATH` alone, for a
/// profile of it).
async fn open_file(path: &std::path::Path) {
    let opts = FileOptions { direct: false, ..FileOptions::default() };
    let dev = FileDev::open(path, &opts).unwrap();
    open_and_check(&dev, &format!("from {} (page cache)", path.display())).await;
}

/// Times opening the pool for serving (`Metadata::open_lazy`, what `Pool::open` does) and
/// `strata thin check`'s work (every node read and checked, counts compared).
async fn open_and_check(dev: &dyn BlockDev, what: &str) {
    let t = Instant::now();
    let m = Metadata::open_lazy(dev).await.unwrap();
    let opened = t.elapsed();
    let nodes = m.tm.blocks.len();
    drop(m);
    let t = Instant::now();
    let r = strata_thin::check::check(dev).await;
    println!(
        "{what}: open for serving {opened:?} ({nodes} nodes read), check {:?} (clean: {})",
        t.elapsed(),
        r.clean()
    );
}
