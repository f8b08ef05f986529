//! `strata status`: what a running server is doing, from its admin endpoint.

use crate::http::{self, ServerStatus};
use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  strata status --admin 127.0.0.1:9810\n  strata status --admin 127.0.0.1:9810 --json | jq .volumes[0].ops.read"
)]
pub struct StatusArgs {
    /// The server's admin endpoint (as given to `strata serve --admin`).
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: String,
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: StatusArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let body = rt.block_on(http::get(&args.admin, "/status"))?;
    if args.json {
        print!("{body}");
        return Ok(());
    }
    let status: ServerStatus = serde_json::from_str(&body)?;
    print!("{}", render(&status));
    Ok(())
}

/// The human view of `/status`.
pub fn render(status: &ServerStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "uptime {:.0} s, {} connection(s)", status.uptime_s, status.connections);
    for vol in &status.volumes {
        let _ = writeln!(
            out,
            "\nvolume {}  {}  {}{}",
            vol.name,
            strata_io::units::format_size(vol.size_bytes),
            vol.device,
            if vol.read_only { "  (read-only)" } else { "" }
        );
        let _ = writeln!(out, "  {:<13} {:>12} {:>14} {:>8} {:>12}", "op", "requests", "bytes", "errors", "avg lat us");
        if let Some(ops) = vol.ops.as_object() {
            for (name, s) in ops {
                let n = s["requests"].as_u64().unwrap_or(0);
                if n == 0 {
                    continue;
                }
                let avg = s["latency_us_sum"].as_u64().unwrap_or(0) as f64 / n as f64;
                let _ = writeln!(
                    out,
                    "  {:<13} {:>12} {:>14} {:>8} {:>12.1}",
                    name,
                    n,
                    s["bytes"].as_u64().unwrap_or(0),
                    s["errors"].as_u64().unwrap_or(0),
                    avg
                );
            }
        }
        // Whatever the target reports, key by key (for a cache, the fields of `CacheStatus`).
        if let Some(t) = &vol.target {
            render_target(&mut out, t, "  ");
        }
    }
    out
}

/// A target's status key by key; the device under a qos layer (its `below`) as a block of
/// its own, indented.
fn render_target(out: &mut String, target: &serde_json::Value, indent: &str) {
    use std::fmt::Write;
    let Some(t) = target.as_object() else { return };
    for (k, val) in t {
        if k == strata_qos::status::BELOW && val.is_object() {
            let _ = writeln!(out, "{indent}{k}:");
            render_target(out, val, &format!("{indent}  "));
        } else {
            let _ = writeln!(out, "{indent}{k}: {val}");
        }
    }
}
