//! `strata demo`: the README's first command. Builds a cached volume over an emulated
//! 7200 rpm disk, measures the disk alone, then lets fio's nbd engine read a zipf:1.2 hot
//! spot through the cache while it warms, showing live IOPS and hit ratio from the server's
//! own counters, and ends with a table against the origin alone.

use crate::open::open;
use crate::spec::{FileSpec, Spec};
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_io::latency::HddParams;
use strata_io::stats::StatsDev;
use strata_io::BlockDev;
use strata_nbd::{Export, Limits, Server};

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata demo --seconds 60\n  strata demo --dir /tmp/strata-demo --data 512MiB")]
pub struct DemoArgs {
    /// Where the demo keeps its files and socket (emptied on every run: a directory that
    /// holds anything but an earlier demo run's files is refused).
    #[arg(long, default_value = "/var/tmp/strata-demo")]
    pub dir: PathBuf,
    /// Seconds of load through the cache.
    #[arg(long, default_value_t = 40)]
    pub seconds: u64,
    /// Seconds of load on the origin alone.
    #[arg(long, default_value_t = 10)]
    pub origin_seconds: u64,
    /// The region the workload reads (the cache gets as many blocks, and 8 MiB more for its
    /// metadata).
    #[arg(long, default_value = "256MiB", value_parser = |s: &str| strata_io::units::parse_size(s))]
    pub data: u64,
}

type Vol = Arc<StatsDev<Arc<dyn BlockDev>>>;

/// The file that marks a directory as the demo's own.
const MARKER: &str = ".strata-demo";

/// The files a demo run makes (a directory holding only these is an earlier run's, marked
/// or not: runs before the marker left none).
const MADE: [&str; 3] = ["origin.img", "cache.img", "nbd.sock"];

/// Makes `dir` the demo's for this run: created if missing; refused if it holds anything but
/// an earlier demo run's files (never a user's), or if another demo is running there (its
/// marker is locked); else emptied. The marker stays locked while the returned file is open.
fn claim_dir(dir: &Path) -> Result<std::fs::File> {
    use std::os::unix::io::AsRawFd;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let marker = dir.join(MARKER);
    let others: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<PathBuf>>>()?
        .into_iter()
        .filter(|p| p != &marker)
        .collect();
    let made = |p: &PathBuf| p.file_name().is_some_and(|n| MADE.iter().any(|m| n == *m));
    if !marker.exists() && !others.iter().all(made) {
        bail!(
            "{} holds files that are not a strata demo's ({} entries); give --dir a new or empty directory",
            dir.display(),
            others.len()
        );
    }
    let claim = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&marker)
        .with_context(|| format!("creating {}", marker.display()))?;
    // SAFETY: flock on a file we hold open.
    if unsafe { libc::flock(claim.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!("another strata demo is running in {}", dir.display());
    }
    for p in others {
        let gone = if p.is_dir() && !p.is_symlink() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        gone.with_context(|| format!("removing {} (left by an earlier demo)", p.display()))?;
    }
    Ok(claim)
}

pub fn run(args: DemoArgs) -> Result<()> {
    if crate::which("fio").is_none() {
        bail!("the demo drives the volume with fio; install it (scripts/setup.sh does)");
    }
    let _claim = claim_dir(&args.dir)?;
    let dir = args.dir.canonicalize()?;
    let sock = dir.join("nbd.sock");
    let origin_file = FileSpec::new(dir.join("origin.img"));
    let hdd = |file| Spec::Hdd { file, params: HddParams::default() };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;

    // Ctrl-C (or a TERM) ends the phase under way and shuts the volume down cleanly; one
    // during the cache's creation lets it finish, and no phase starts.
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        use tokio::signal::unix::{signal, SignalKind};
        let _g = rt.enter();
        let (mut int, mut term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
        let flag = interrupted.clone();
        rt.spawn(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            flag.store(true, Relaxed);
        });
    }
    // An origin four times the data, and a cache as big as the data.
    let origin = hdd(FileSpec { size: Some(args.data * 4), ..origin_file.clone() });
    let cache_path = dir.join("cache.img");
    let cache = Spec::File(FileSpec { size: Some(args.data + (8 << 20)), ..FileSpec::new(&cache_path) });
    rt.block_on(super::cache::create(&origin, &cache, Default::default()))?;

    let volume = |spec: Spec| -> Result<Vol> { Ok(Arc::new(StatsDev::new(rt.block_on(open(&spec, false))?))) };
    let cached = volume(Spec::Cache { path: cache_path, origin: None })?;
    // The cache holds the origin's claim; the origin phase only reads, beside it.
    let plain = volume(hdd(FileSpec { ro: true, shared: true, ..origin_file }))?;
    let exports = [("cached", &cached), ("origin", &plain)].map(|(n, d)| Export {
        name: n.into(),
        description: d.describe(),
        dev: d.clone() as Arc<dyn BlockDev>,
        read_only: false,
    });
    let server = Server::new(exports.into(), Limits::default()).map_err(anyhow::Error::msg)?;
    let listener = {
        let _g = rt.enter();
        tokio::net::UnixListener::bind(&sock)?
    };
    let s = server.clone();
    rt.spawn(async move { s.serve_unix(listener).await });
    println!(
        "strata demo: an emulated 7200 rpm disk ({}), cached by {}",
        strata_io::units::format_size(args.data * 4),
        cached.describe()
    );
    println!(
        "workload: fio --ioengine=nbd, 4 KiB random reads, zipf:1.2 over {}, iodepth 8\n",
        strata_io::units::format_size(args.data)
    );

    let load = Load { sock: &sock, data: args.data, interrupted: &interrupted };
    let runs = (|| {
        let origin_run = phase(&load, "origin", &plain, None, args.origin_seconds, "origin alone")?;
        let cached_run = phase(&load, "cached", &cached, Some(&cached), args.seconds, "through the cache")?;
        Ok::<_, anyhow::Error>((origin_run, cached_run))
    })();

    // Whatever became of the phases, the volume is shut down cleanly.
    rt.block_on(async {
        server.shutdown();
        server.wait_idle().await;
        cached.shutdown().await
    })?;
    let _ = std::fs::remove_file(&sock);
    if interrupted.load(Relaxed) {
        bail!("interrupted; the volume was shut down cleanly, its files are in {}", dir.display());
    }
    let (origin_run, cached_run) = runs?;
    let status = cached.status().unwrap_or_default();
    // The first and last 10 s (samples every 0.5 s), or halves of a shorter run.
    let n = cached_run.samples.len();
    let w = (n / 2).clamp(1, 20);
    let mean = |s: &[(f64, f64, f64)]| s.iter().map(|s| s.1).sum::<f64>() / s.len().max(1) as f64;
    let (first, last) = (mean(&cached_run.samples[..w.min(n)]), mean(&cached_run.samples[n.saturating_sub(w)..]));
    let span = format!("{} s", w as f64 / 2.0);
    println!("\n{:<34} {:>10} {:>10}", "", "IOPS", "vs origin");
    let row = |name: &str, iops: f64| println!("{name:<34} {iops:>10.0} {:>9.1}x", iops / origin_run.iops.max(1.0));
    row("origin alone (hdd model)", origin_run.iops);
    row(&format!("cached, first {span} (warming)"), first);
    row(&format!("cached, last {span} (warm)"), last);
    row("cached, whole run", cached_run.iops);
    let (ratio, over) = match args.seconds >= 10 {
        true => (status["hit_ratio_10s"].as_f64(), "the last 10 s"),
        false => (status["hit_ratio_total"].as_f64(), "the run"),
    };
    println!(
        "\nhit ratio {:.1}% over {over}; {} promotions; cache {} of {} blocks used",
        ratio.unwrap_or(0.0) * 100.0,
        status["promotions"],
        status["cached_blocks"],
        status["cache_blocks"]
    );
    println!("the served volume and its cache are in {}", dir.display());
    Ok(())
}

struct PhaseResult {
    iops: f64,
    /// (seconds, IOPS, hit ratio) every half second.
    samples: Vec<(f64, f64, f64)>,
}

/// What every phase's load shares: the server's socket, the region read, and the flag a
/// Ctrl-C sets.
struct Load<'a> {
    sock: &'a Path,
    data: u64,
    interrupted: &'a AtomicBool,
}

fn phase(load: &Load, export: &str, vol: &Vol, cache: Option<&Vol>, seconds: u64, label: &str) -> Result<PhaseResult> {
    let Load { sock, data, interrupted } = *load;
    if interrupted.load(Relaxed) {
        bail!("interrupted");
    }
    let uri = format!("nbd+unix:///{export}?socket={}", sock.display());
    let child = Command::new("fio")
        .args([
            "--name=demo",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randread",
            "--bs=4k",
            "--iodepth=8",
            "--random_distribution=zipf:1.2",
            &format!("--size={data}"),
            &format!("--runtime={seconds}"),
            "--time_based",
            "--randseed=42",
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let fio_pid = child.id() as libc::pid_t;
    let bar = ProgressBar::new(seconds * 10);
    bar.set_style(ProgressStyle::with_template("{prefix:<18} [{bar:30}] {msg}")?.progress_chars("=> "));
    bar.set_prefix(label.to_string());
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let start = Instant::now();
    let mut samples = Vec::new();
    let out = std::thread::scope(|scope| {
        let h = scope.spawn(|| child.wait_with_output());
        let (mut last_t, mut last_n) = (Instant::now(), vol.op("read").requests.load(Relaxed));
        let mut next_line = 5.0;
        let mut stopping = false;
        while !h.is_finished() {
            std::thread::sleep(Duration::from_millis(500));
            if interrupted.load(Relaxed) && !stopping && !h.is_finished() {
                // fio stops its jobs on SIGINT (a Ctrl-C at the terminal reaches it anyway).
                // SAFETY: plain syscall on our child, still running a moment ago (its pid
                // cannot have been reused since).
                unsafe { libc::kill(fio_pid, libc::SIGINT) };
                stopping = true;
            }
            let n = vol.op("read").requests.load(Relaxed);
            let iops = (n - last_n) as f64 / last_t.elapsed().as_secs_f64();
            (last_t, last_n) = (Instant::now(), n);
            let t = start.elapsed().as_secs_f64();
            let hit = cache.and_then(|c| c.status()).and_then(|s| s["hit_ratio_10s"].as_f64()).unwrap_or(0.0);
            samples.push((t, iops, hit));
            let msg = match cache {
                Some(_) => format!("{iops:>7.0} IOPS  hit ratio {:>5.1}%  {t:>4.0} s", hit * 100.0),
                None => format!("{iops:>7.0} IOPS  {t:>4.0} s"),
            };
            bar.set_position(((t * 10.0) as u64).min(seconds * 10));
            bar.set_message(msg.clone());
            if !tty && t >= next_line {
                println!("{label}: {msg}");
                next_line += 5.0;
            }
        }
        h.join().expect("fio waiter")
    })?;
    bar.finish();
    if !out.status.success() {
        bail!("fio failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let report = crate::fio_json(&out.stdout)?;
    Ok(PhaseResult { iops: report["jobs"][0]["read"]["iops"].as_f64().unwrap_or(0.0), samples })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo empties only a directory of its own, and never one another demo is using.
    #[test]
    fn the_demo_takes_only_a_directory_of_its_own() {
        let base = tempfile::tempdir().unwrap();
        let user = base.path().join("precious");
        std::fs::create_dir_all(user.join("sub")).unwrap();
        std::fs::write(user.join("thesis.txt"), "mine").unwrap();
        let why = claim_dir(&user).unwrap_err().to_string();
        assert!(why.contains("not a strata demo's"), "{why}");
        assert_eq!(std::fs::read_to_string(user.join("thesis.txt")).unwrap(), "mine");
        assert!(user.join("sub").is_dir() && !user.join(MARKER).exists());

        // An earlier run's files without the marker (runs before it left none) are taken.
        let old = base.path().join("old");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("cache.img"), "old run").unwrap();
        drop(claim_dir(&old).unwrap());
        assert!(!old.join("cache.img").exists());

        let demo = base.path().join("demo");
        let first = claim_dir(&demo).unwrap();
        std::fs::write(demo.join("cache.img"), "old run").unwrap();
        let why = claim_dir(&demo).unwrap_err().to_string();
        assert!(why.contains("another strata demo"), "{why}");
        assert!(demo.join("cache.img").exists(), "a running demo's files are left alone");
        drop(first);
        let _again = claim_dir(&demo).unwrap();
        assert!(!demo.join("cache.img").exists() && demo.join(MARKER).exists());
    }
}
