//! `strata qos`: measure a device's cost model, and show or change the groups of a running
//! server's qos volumes.

use crate::cmd::cache::send_settings;
use crate::http;
use crate::open::open;
use crate::spec::Spec;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::time::Duration;
use strata_qos::calibrate::{calibrate, Calibration};
use strata_qos::QosStatus;

#[derive(Args, Debug)]
pub struct QosArgs {
    #[command(subcommand)]
    pub command: QosCommand,
}

#[derive(Subcommand, Debug)]
pub enum QosCommand {
    /// Measure a device's cost model (model= for qos: specs and [qos.GROUP] tables).
    Calibrate(CalibrateArgs),
    /// Change a running volume's group: weight=, riops=, wiops=, rbps=, wbps=, burst_ms=, latency_ms= (max lifts a cap).
    Set(SetArgs),
    /// Show the groups of every qos volume of a running server.
    Status(StatusArgs),
}

#[derive(Args, Debug)]
#[command(after_help = "\
Example:
  strata qos calibrate /dev/sdb --seconds 5
  strata serve --unix /tmp/s.sock 'a=qos:db?model=MODEL@slice:0+100GiB@/dev/sdb'
Writes put back the data a read just got: run it while nothing else writes the device.")]
pub struct CalibrateArgs {
    /// The device to measure.
    pub spec: Spec,
    /// Seconds spent on each of the six figures (at least 0.01).
    #[arg(long, default_value_t = 2.0, value_parser = phase_seconds)]
    pub seconds: f64,
    /// Requests in flight (default: 1 on a rotational device, 32 otherwise).
    #[arg(long)]
    pub depth: Option<usize>,
    /// Measure reads only (the write figures are then the read ones).
    #[arg(long)]
    pub read_only: bool,
}

fn phase_seconds(s: &str) -> Result<f64, String> {
    match super::seconds_arg(s)? {
        v if v < 0.01 => Err(format!("at least 0.01 seconds per figure, got {s:?}")),
        v => Ok(v),
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
Example:
  strata qos set --admin 127.0.0.1:9810 db weight=300 rbps=20MiB
  strata qos set --admin 127.0.0.1:9810 db --group batch riops=max")]
pub struct SetArgs {
    /// The server's admin endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// A qos volume (its group is changed, unless --group names another on its device).
    pub name: String,
    /// Another group on the same device.
    #[arg(long)]
    pub group: Option<String>,
    /// Settings as KEY=VALUE, taken together: if one is refused, none changes.
    #[arg(required = true)]
    pub settings: Vec<String>,
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  strata qos status --admin 127.0.0.1:9810")]
pub struct StatusArgs {
    /// The server's admin endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
}

pub fn run(args: QosArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        match args.command {
            QosCommand::Calibrate(a) => run_calibrate(a).await,
            QosCommand::Set(a) => {
                // Another group's setting is the message `group G KEY VALUE`.
                let prefix = a.group.as_ref().map_or(String::new(), |g| format!("group {g} "));
                send_settings(&a.admin, &a.name, &prefix, &a.settings).await
            }
            QosCommand::Status(a) => {
                let status = http::status(&a.admin).await?;
                print!("{}", render(&status));
                Ok(())
            }
        }
    })
}

async fn run_calibrate(a: CalibrateArgs) -> Result<()> {
    let dev = open(&a.spec, a.read_only).await.with_context(|| format!("opening {}", a.spec))?;
    let depth = a.depth.unwrap_or(if dev.geometry().rotational { 1 } else { 32 }).max(1);
    let c = Calibration { phase: Duration::from_secs_f64(a.seconds), depth, writes: !a.read_only };
    eprintln!("strata: calibrating {} ({} s per figure, {depth} in flight)", dev.describe(), a.seconds);
    let m = super::closing_after(&*dev, async { Ok(calibrate(&*dev, &c).await?) }).await?;
    println!("rbps={} rseqiops={} rrandiops={}", m.rbps, m.rseqiops, m.rrandiops);
    println!(
        "wbps={} wseqiops={} wrandiops={}{}",
        m.wbps,
        m.wseqiops,
        m.wrandiops,
        if a.read_only { " (the read figures)" } else { "" }
    );
    println!("model={m}");
    println!("# in a spec:   qos:GROUP?model={m}@...\n# in a config: [qos.GROUP] model = \"{m}\"");
    Ok(())
}

/// The groups of every qos volume in `/status`, one table per device.
pub fn render(status: &http::ServerStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for vol in &status.volumes {
        let Some(q) = vol.target.as_ref().and_then(|t| serde_json::from_value::<QosStatus>(t.clone()).ok()) else {
            continue;
        };
        if !seen.insert(q.device.clone()) {
            continue;
        }
        let _ = writeln!(
            out,
            "{}\n  cost: {}, depth {}, slice {} ms, idle {} ms, max wait {} ms",
            q.device, q.cost_model, q.depth, q.slice_ms, q.idle_ms, q.max_wait_ms
        );
        let _ = writeln!(
            out,
            "  {:<12} {:>6} {:>10} {:>12} {:>10} {:>7} {:>6} {:>8} {:>6} {:>11}  limits",
            "group", "weight", "requests", "bytes", "device s", "share", "queue", "streams", "seeky", "throttled s"
        );
        for g in &q.groups {
            let limits: Vec<&str> = g
                .limits
                .iter()
                .map(String::as_str)
                .filter(|l| !l.ends_with("=max") && !l.starts_with("burst_ms="))
                .collect();
            let _ = writeln!(
                out,
                "  {:<12} {:>6} {:>10} {:>12} {:>10.2} {:>6.1}% {:>6} {:>8} {:>6} {:>11.2}  {}",
                g.name,
                g.weight,
                g.requests,
                g.bytes,
                g.device_time_s,
                g.share * 100.0,
                g.queued,
                g.streams,
                g.seeky_streams,
                g.throttled_s,
                limits.join(" ")
            );
        }
    }
    if out.is_empty() {
        out.push_str("no qos volumes\n");
    }
    out
}
