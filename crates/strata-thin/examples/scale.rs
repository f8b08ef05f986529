//! Pool-scale figures: a volume with N mapped blocks, S snapshots each overwriting a share of
//! it, then the time to open and check the pool, a snapshot's creation time, and metadata
//! bytes per mapped block. `cargo run --release -p strata-thin --example scale -- 1000000 100 10`

use std::time::Instant;
use strata_io::mem::MemDev;
use strata_thin::meta::Metadata;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<u64> = std::env::args().skip(1).map(|a| a.parse().expect("numbers")).collect();
    let (n, snaps, churn) = (
        args.first().copied().unwrap_or(1_000_000),
        args.get(1).copied().unwrap_or(100),
        args.get(2).copied().unwrap_or(10),
    );
    let data_blocks = n + snaps * n * churn / 100 + 1000;
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
    let t = Instant::now();
    let m2 = Metadata::open(&md).await.unwrap();
    let opened = t.elapsed();
    let r = strata_thin::check::check_counts(&m2);
    println!("open {opened:?}, open + check {:?}, clean: {}", t.elapsed(), r.clean());
}
