//! What the thin layer itself costs per request: 4 KiB reads and writes at random places of a
//! fully mapped volume whose pool's data device is in RAM, against the same requests to that
//! RAM device directly, one at a time on one thread (no IO wait, no scheduling: the CPU time
//! of the path alone). Prints nanoseconds per request, the fastest of five passes.
//! `cargo run --release -p strata-thin --example path_cost -- [BLOCKS]` (default 8192 blocks
//! of 64 KiB, a 512 MiB volume).

use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Instant;
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf};
use strata_thin::meta::Metadata;
use strata_thin::{Pool, PoolOptions, ThinDev};

const BS: u64 = 64 << 10;
const REQUESTS: usize = 200_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let blocks: u64 = std::env::args().nth(1).map(|a| a.parse().expect("a number of blocks")).unwrap_or(8192);
    let size = blocks * BS;
    let md = Arc::new(MemDev::new(256 << 20));
    let data = Arc::new(MemDev::new(size));
    let mut m = Metadata::format(&*md, size, BS, "mem:data", false).await.unwrap();
    m.create_thin(1).unwrap();
    m.commit(&*md).await.unwrap();
    let pool = Pool::open(md, data.clone(), "mem:data", PoolOptions::default()).await.unwrap();
    let vol = ThinDev::new(pool, 1, Some(size)).unwrap();
    for b in 0..blocks {
        vol.write(b * BS, Buf::zeroed(BS as usize), false).await.unwrap();
    }
    vol.flush().await.unwrap();
    let devs: [(&str, &dyn BlockDev); 2] = [("data device directly", &*data), ("thin volume", &vol)];
    for write in [false, true] {
        for (name, dev) in devs {
            let mut best = f64::MAX;
            for pass in 0..5 {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(pass);
                let mut buf = Buf::zeroed(4096);
                let t = Instant::now();
                for _ in 0..REQUESTS {
                    let off = rng.gen_range(0..size / 4096) * 4096;
                    buf = if write { dev.write(off, buf, false).await } else { dev.read(off, buf).await }.unwrap();
                }
                best = best.min(t.elapsed().as_nanos() as f64 / REQUESTS as f64);
            }
            println!("{:5} {name}: {best:.0} ns per 4 KiB request", if write { "write" } else { "read" });
        }
    }
}
