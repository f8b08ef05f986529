//! The admin endpoint: `GET /status` (JSON) and `GET /metrics` (Prometheus text) over plain
//! HTTP/1.1 on loopback. One small request per connection; anything else gets 404 or 400.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;
use strata_io::stats::{StatsDev, LATENCY_BUCKETS_US, OPS};
use strata_io::BlockDev;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A served volume as the admin endpoint sees it.
pub struct Volume {
    pub name: String,
    pub read_only: bool,
    pub dev: Arc<StatsDev<Arc<dyn BlockDev>>>,
}

pub struct Admin {
    pub volumes: Vec<Volume>,
    pub started: Instant,
    pub connections: Box<dyn Fn() -> usize + Send + Sync>,
}

impl Admin {
    pub fn status_json(&self) -> serde_json::Value {
        let volumes: Vec<serde_json::Value> = self
            .volumes
            .iter()
            .map(|v| {
                serde_json::json!({
                    "name": v.name,
                    "device": v.dev.describe(),
                    "size_bytes": v.dev.size(),
                    "read_only": v.read_only,
                    "ops": v.dev.counters(),
                    "target": v.dev.status(),
                })
            })
            .collect();
        serde_json::json!({
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "connections": (self.connections)(),
            "volumes": volumes,
        })
    }

    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        let head = |name: &str, kind: &str, help: &str, out: &mut String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        head("strata_connections", "gauge", "Open NBD connections.", &mut out);
        let _ = writeln!(out, "strata_connections {}", (self.connections)());
        head("strata_volume_size_bytes", "gauge", "Volume size.", &mut out);
        for v in &self.volumes {
            let _ = writeln!(out, "strata_volume_size_bytes{{volume=\"{}\"}} {}", v.name, v.dev.size());
        }
        for (metric, field, help) in [
            ("strata_requests_total", "requests", "Requests completed, by operation."),
            ("strata_bytes_total", "bytes", "Bytes moved by successful requests, by operation."),
            ("strata_errors_total", "errors", "Requests that failed, by operation."),
        ] {
            head(metric, "counter", help, &mut out);
            for v in &self.volumes {
                for op in OPS {
                    let s = v.dev.op(op);
                    let n = match field {
                        "requests" => s.requests.load(std::sync::atomic::Ordering::Relaxed),
                        "bytes" => s.bytes.load(std::sync::atomic::Ordering::Relaxed),
                        _ => s.errors.load(std::sync::atomic::Ordering::Relaxed),
                    };
                    let _ = writeln!(out, "{metric}{{volume=\"{}\",op=\"{op}\"}} {n}", v.name);
                }
            }
        }
        head("strata_request_duration_seconds", "histogram", "Request latency, by operation.", &mut out);
        for v in &self.volumes {
            for op in OPS {
                let s = v.dev.op(op);
                let mut cumulative = 0u64;
                for (i, le) in LATENCY_BUCKETS_US.iter().enumerate() {
                    cumulative += s.buckets[i].load(std::sync::atomic::Ordering::Relaxed);
                    let _ = writeln!(
                        out,
                        "strata_request_duration_seconds_bucket{{volume=\"{}\",op=\"{op}\",le=\"{}\"}} {cumulative}",
                        v.name,
                        *le as f64 / 1e6
                    );
                }
                cumulative += s.buckets[LATENCY_BUCKETS_US.len()].load(std::sync::atomic::Ordering::Relaxed);
                let labels = format!("volume=\"{}\",op=\"{op}\"", v.name);
                let _ = writeln!(out, "strata_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
                let sum = s.latency_us_sum.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6;
                let _ = writeln!(out, "strata_request_duration_seconds_sum{{{labels}}} {sum}");
                let _ = writeln!(out, "strata_request_duration_seconds_count{{{labels}}} {cumulative}");
            }
        }
        // Target-specific numbers (cache counters and the like) as gauges.
        let mut target_lines: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for v in &self.volumes {
            if let Some(serde_json::Value::Object(m)) = v.dev.status() {
                flatten_numbers(&v.name, "strata_target", &serde_json::Value::Object(m), &mut target_lines);
            }
        }
        for (metric, lines) in target_lines {
            head(&metric, "gauge", "Target state (see strata status).", &mut out);
            for l in lines {
                out.push_str(&l);
                out.push('\n');
            }
        }
        out
    }
}

fn flatten_numbers(
    volume: &str,
    prefix: &str,
    v: &serde_json::Value,
    out: &mut std::collections::BTreeMap<String, Vec<String>>,
) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, child) in m {
                let name: String =
                    k.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
                flatten_numbers(volume, &format!("{prefix}_{name}"), child, out);
            }
        }
        serde_json::Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                out.entry(prefix.to_string()).or_default().push(format!("{prefix}{{volume=\"{volume}\"}} {f}"));
            }
        }
        serde_json::Value::Bool(b) => {
            out.entry(prefix.to_string()).or_default().push(format!("{prefix}{{volume=\"{volume}\"}} {}", *b as u8));
        }
        _ => {}
    }
}

/// Serves the admin endpoint until the process exits.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let Ok(Ok((method, path, body))) =
                tokio::time::timeout(std::time::Duration::from_secs(5), read_request(&mut stream)).await
            else {
                return;
            };
            let route = path.split('?').next().unwrap_or("").to_string();
            let (code, ctype, body) = match (method.as_str(), route.as_str()) {
                ("GET", "/status") => {
                    let mut s = serde_json::to_string_pretty(&admin.status_json()).unwrap_or_default();
                    s.push('\n');
                    ("200 OK", "application/json", s)
                }
                ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", admin.metrics_text()),
                ("POST", r) if r.starts_with("/volumes/") && r.ends_with("/message") => {
                    let name = &r["/volumes/".len()..r.len() - "/message".len()];
                    match admin.volumes.iter().find(|v| v.name == name) {
                        None => ("404 Not Found", "text/plain", format!("no volume named {name:?}\n")),
                        Some(v) => match v.dev.message(body.trim()).await {
                            Ok(answer) => ("200 OK", "text/plain", format!("{answer}\n")),
                            Err(e) => ("400 Bad Request", "text/plain", format!("{e}\n")),
                        },
                    }
                }
                ("GET", _) => ("404 Not Found", "text/plain", "try /status or /metrics\n".to_string()),
                _ => ("400 Bad Request", "text/plain", "GET /status, GET /metrics, POST /volumes/NAME/message\n".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(resp.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// Reads one request: method, path and body (bounded sizes).
async fn read_request(stream: &mut tokio::net::TcpStream) -> std::io::Result<(String, String, String)> {
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if req.len() > 16 << 10 {
            return Err(std::io::Error::other("request head too long"));
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed"));
        }
        req.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&req[..head_end]).into_owned();
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let length = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
        .unwrap_or(0)
        .min(64 << 10);
    while req.len() < head_end + length {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&req[head_end..(head_end + length).min(req.len())]).into_owned();
    Ok((method, path, body))
}

/// Fetches `path` from an admin endpoint (for `strata status` and friends).
pub async fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    request(addr, "GET", path, "").await
}

/// Sends a control message to a volume of a running server.
pub async fn message(addr: &str, volume: &str, msg: &str) -> anyhow::Result<String> {
    request(addr, "POST", &format!("/volumes/{volume}/message"), msg).await
}

async fn request(addr: &str, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    use anyhow::Context;
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot reach the admin endpoint at {addr} (is `strata serve --admin {addr}` running?)"))?;
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
            .as_bytes(),
    )
    .await?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).await?;
    let (head, body) = resp.split_once("\r\n\r\n").context("malformed HTTP response")?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200 ") {
        anyhow::bail!("{}", body.trim());
    }
    Ok(body.to_string())
}
