//! `strata demo`: the README's first command. Serves a volume from this process, drives it
//! with a real NBD client (fio's nbd engine, verifying every block it wrote), shows live
//! progress from the server's own counters, and ends with a summary table.

use crate::admin::Volume;
use crate::volume;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_io::stats::StatsDev;
use strata_io::BlockDev;
use strata_nbd::{Export, Limits, Server};

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata demo --seconds 20")]
pub struct DemoArgs {
    /// Where the demo keeps its files and socket.
    #[arg(long, default_value = "strata-demo")]
    pub dir: PathBuf,
    /// Seconds of load per phase.
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
    /// Size of the demo volume.
    #[arg(long, default_value = "1GiB", value_parser = |s: &str| strata_io::units::parse_size(s))]
    pub size: u64,
}

struct Phase {
    name: &'static str,
    rw: &'static str,
}

pub fn run(args: DemoArgs) -> Result<()> {
    if which("fio").is_none() {
        bail!("the demo drives the volume with fio; install it (scripts/setup.sh does)");
    }
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = args.dir.canonicalize()?;
    let sock = dir.join("nbd.sock");
    let _ = std::fs::remove_file(&sock);
    let spec = format!("{}?size={}", dir.join("volume.img").display(), args.size);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let dev = rt.block_on(volume::open(&spec, false))?;
    let stats = Arc::new(StatsDev::new(dev));
    let vol = Volume { name: "demo".into(), read_only: false, dev: stats.clone() };
    println!("strata demo: volume {:?} = {}", vol.name, vol.dev.describe());
    let server = Server::new(
        vec![Export { name: "demo".into(), description: "strata demo".into(), dev: stats.clone() as Arc<dyn BlockDev>, read_only: false }],
        Limits::default(),
    )
    .map_err(anyhow::Error::msg)?;
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(&sock)?
    };
    let s = server.clone();
    rt.spawn(async move { s.serve_unix(listener).await });
    let uri = format!("nbd+unix:///demo?socket={}", sock.display());
    println!("strata demo: serving {uri}\n");

    let phases = [
        Phase { name: "random writes, 4 KiB, crc32c on every block", rw: "randwrite" },
        Phase { name: "random reads, verifying what was written", rw: "randread" },
    ];
    let mut rows = Vec::new();
    let region = (args.size / 4).max(16 << 20);
    for (i, p) in phases.iter().enumerate() {
        let before = (stats.op("read").requests.load(Relaxed), stats.op("write").requests.load(Relaxed));
        let mut fio = Command::new("fio");
        fio.args([
            "--name=demo",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={}", p.rw),
            "--bs=4k",
            "--iodepth=16",
            &format!("--size={region}"),
            "--verify=crc32c",
            "--verify_fatal=1",
            "--randseed=42",
            "--output-format=json",
        ]);
        if p.rw == "randwrite" {
            fio.args([format!("--runtime={}", args.seconds), "--time_based=0".into(), "--do_verify=0".into()]);
        } else {
            fio.args(["--verify_only=1".to_string()]);
            fio.arg("--rw=randwrite"); // verify_only replays the write pattern as reads
        }
        let child = fio.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn()?;
        let bar = ProgressBar::new(args.seconds * 10);
        bar.set_style(ProgressStyle::with_template(&format!("[{}/{}] {{prefix}} {{msg}}", i + 1, phases.len()))?);
        bar.set_prefix(p.name);
        let start = Instant::now();
        let mut last = (start, before.0 + before.1);
        let out = std::thread::scope(|scope| {
            let h = scope.spawn(|| child.wait_with_output());
            while !h.is_finished() {
                std::thread::sleep(Duration::from_millis(500));
                let now = (stats.op("read").requests.load(Relaxed), stats.op("write").requests.load(Relaxed));
                let total = now.0 + now.1;
                let iops = (total - last.1) as f64 / last.0.elapsed().as_secs_f64();
                last = (Instant::now(), total);
                bar.set_message(format!("{:>8.0} IOPS  {:>7.1} s", iops, start.elapsed().as_secs_f64()));
                bar.tick();
            }
            h.join().expect("fio waiter")
        })?;
        bar.finish();
        if !out.status.success() {
            bail!("fio failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        }
        let report = fio_json(&out.stdout)?;
        let job = &report["jobs"][0];
        let side = if p.rw == "randwrite" && job["write"]["io_bytes"].as_u64().unwrap_or(0) > 0 { "write" } else { "read" };
        rows.push((
            p.name,
            job[side]["iops"].as_f64().unwrap_or(0.0),
            job[side]["clat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1000.0,
            job[side]["io_bytes"].as_u64().unwrap_or(0),
        ));
    }
    rt.block_on(async {
        server.shutdown();
        server.wait_idle().await;
        stats.flush().await
    })?;
    println!("\n{:<50} {:>10} {:>12} {:>12}", "phase", "IOPS", "mean lat us", "MiB");
    for (name, iops, lat, bytes) in rows {
        println!("{name:<50} {iops:>10.0} {lat:>12.1} {:>12.1}", bytes as f64 / 1048576.0);
    }
    println!("\nEvery block fio wrote was read back over NBD and matched its crc32c.");
    let _ = std::fs::remove_file(&sock);
    Ok(())
}

/// fio's JSON report, skipping any notes it prints before it.
pub fn fio_json(stdout: &[u8]) -> Result<serde_json::Value> {
    let text = String::from_utf8_lossy(stdout);
    let start = text.find("\n{").map(|i| i + 1).or_else(|| text.starts_with('{').then_some(0));
    let json = start.map(|i| &text[i..]).context("fio printed no JSON report")?;
    serde_json::from_str(json).context("parsing fio's JSON report")
}

pub fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(prog)).find(|p| p.is_file())
}
