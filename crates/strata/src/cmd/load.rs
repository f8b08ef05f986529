//! `strata load`: random IO against an NBD export over a Unix socket, with FUA on every
//! write if asked (fio's nbd engine sends none): the benchmarks' sync rows.

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use strata_io::units::parse_size;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Rw {
    Randread,
    Randwrite,
    Randrw,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Each of --iodepth connections keeps one request in flight. Prints one JSON line: reads and
writes done, seconds, read_iops, write_iops and fua (whether --fua was given).

Example:
  strata load --unix /tmp/strata.sock --export vol --rw randwrite --fua --seconds 10")]
pub struct LoadArgs {
    /// The server's Unix socket.
    #[arg(long)]
    pub unix: PathBuf,
    /// The export's name.
    #[arg(long, default_value = "")]
    pub export: String,
    #[arg(long, value_enum, default_value = "randwrite")]
    pub rw: Rw,
    /// Share of reads in randrw, in percent.
    #[arg(long, default_value_t = 50)]
    pub rwmixread: u32,
    /// Request size.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    pub bs: u64,
    /// Requests in flight (one connection each).
    #[arg(long, default_value_t = 32)]
    pub iodepth: usize,
    /// How long to run.
    #[arg(long, default_value_t = 10.0, value_parser = super::seconds_arg)]
    pub seconds: f64,
    /// Set FUA on every write.
    #[arg(long)]
    pub fua: bool,
    /// Only the first BYTES of the export (default: all of it).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Write each multiple of BYTES once, in random order, and stop when all are written
    /// (first writes into a thin volume's blocks: --stride 64KiB).
    #[arg(long, value_parser = parse_size)]
    pub stride: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub fn run(a: LoadArgs) -> Result<()> {
    anyhow::ensure!(
        a.bs > 0 && a.bs.is_multiple_of(512) && a.bs <= 32 << 20,
        "--bs must be a multiple of 512 up to 32 MiB"
    );
    anyhow::ensure!(a.iodepth > 0, "--iodepth must be at least 1");
    anyhow::ensure!(a.rwmixread <= 100, "--rwmixread is a percentage");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (reads, writes, secs) = rt.block_on(drive(&a))?;
    println!(
        "{}",
        serde_json::json!({
            "reads": reads,
            "writes": writes,
            "seconds": secs,
            "read_iops": reads as f64 / secs,
            "write_iops": writes as f64 / secs,
            "fua": a.fua,
        })
    );
    Ok(())
}

async fn drive(a: &LoadArgs) -> Result<(u64, u64, f64)> {
    type Client = strata_nbd::client::Client<tokio::net::UnixStream>;
    let mut clients: Vec<Client> = Vec::new();
    // A server answers a handshake at once: one that does not is not an NBD server, or is
    // stuck (or out of connections: it closes those past its limit).
    const HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(30);
    for i in 0..a.iodepth {
        let c = tokio::time::timeout(HANDSHAKE, Client::connect_unix(&a.unix, &a.export))
            .await
            .map_err(|_| anyhow::anyhow!("no NBD handshake within {HANDSHAKE:?}"))
            .and_then(|c| {
                c.map_err(|e| match e.kind() {
                    // What a server at its connection limit does to the next one.
                    std::io::ErrorKind::UnexpectedEof if i > 0 => anyhow::anyhow!(
                        "{e}: the server closed it during the handshake (at its connection limit? \
                         strata serve --max-connections)"
                    ),
                    _ => anyhow::Error::from(e),
                })
            });
        let what = || {
            format!("connecting to {} export {:?} (connection {} of {})", a.unix.display(), a.export, i + 1, a.iodepth)
        };
        clients.push(c.with_context(what)?);
    }
    let export = clients[0].size();
    let size = a.size.unwrap_or(export).min(export);
    anyhow::ensure!(size / a.bs > 0, "{size} bytes to use (the export has {export}) are fewer than --bs {}", a.bs);
    let slots = size / a.bs;
    // With --stride: every stride's first bytes once, in a seeded random order.
    let once: Option<std::sync::Arc<(Vec<u64>, std::sync::atomic::AtomicUsize)>> = a.stride.map(|stride| {
        let step = stride.max(a.bs);
        let mut offsets: Vec<u64> = (0..size / step).map(|i| i * step).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
        for i in (1..offsets.len()).rev() {
            offsets.swap(i, rng.gen_range(0..=i));
        }
        std::sync::Arc::new((offsets, Default::default()))
    });
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let started = Instant::now();
    let (rw, mix, bs, fua) = (a.rw, a.rwmixread, a.bs, a.fua);
    let tasks: Vec<_> = (clients.into_iter().enumerate())
        .map(|(i, mut c)| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed.wrapping_mul(1000) + i as u64);
            let once = once.clone();
            tokio::spawn(async move {
                let data = vec![0x5a_u8; bs as usize];
                let (mut reads, mut writes) = (0u64, 0u64);
                while Instant::now() < deadline {
                    let offset = match &once {
                        Some(o) => match o.0.get(o.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                            Some(&at) => at,
                            None => break,
                        },
                        None => rng.gen_range(0..slots) * bs,
                    };
                    let read = match rw {
                        Rw::Randread => true,
                        Rw::Randwrite => false,
                        Rw::Randrw => rng.gen_range(0..100) < mix,
                    } && once.is_none();
                    if read {
                        c.read(offset, bs as u32).await?;
                        reads += 1;
                    } else {
                        c.write(offset, &data, fua).await?;
                        writes += 1;
                    }
                }
                c.disconnect().await?;
                std::io::Result::Ok((reads, writes))
            })
        })
        .collect();
    let (mut reads, mut writes) = (0, 0);
    for t in tasks {
        let (r, w) = t.await?.context("a request failed")?;
        reads += r;
        writes += w;
    }
    Ok((reads, writes, started.elapsed().as_secs_f64()))
}
