//! The admin endpoint over HTTP: `GET /status` (JSON), `GET /metrics` (Prometheus text),
//! `POST /volumes/NAME/message`, and `POST /exports` (body `NAME=SPEC`, `?read_only`) and
//! `DELETE /exports/NAME` (`?force`) to add and remove exports while serving; over plain
//! HTTP/1.1 on loopback, one small request per connection (anything else gets 404 or 400); and
//! the client side that `strata status`, `strata export` and `strata cache set|flush|detach`
//! use. It knows volumes and the `BlockDev` trait, not the targets: each target describes
//! itself through `status()` and `metrics()`.

use crate::open::Opener;
use crate::spec::Spec;
use anyhow::{bail, Context};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;
use strata_io::metrics::{latency_histogram, MetricKind, Sample};
use strata_io::query::{percent_decode, percent_encode};
use strata_io::stats::{StatsDev, LATENCY_BUCKETS_US, OPS};
use strata_io::BlockDev;
use strata_nbd::{Export, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A served volume as the admin endpoint sees it.
pub struct Volume {
    pub name: String,
    pub read_only: bool,
    pub dev: Arc<StatsDev<Arc<dyn BlockDev>>>,
}

/// A server's volumes, as the admin endpoint and `strata serve` manage them: every export is
/// opened, offered and taken away through here.
pub struct Admin {
    volumes: RwLock<Vec<Arc<Volume>>>,
    /// Held shared by each `add` and `remove` while it runs, and alone by the server's stop
    /// (`stop_changes`), which waits for them: a volume being closed by a removal is closed
    /// before the process ends.
    changes: tokio::sync::RwLock<()>,
    /// Set as the stop begins to wait for them: a change asked for after is refused at once,
    /// not after the changes under way, and none starts once the stop holds the lock.
    stopping: std::sync::atomic::AtomicBool,
    started: Instant,
    server: Server,
    opener: Opener,
    /// When set, every request must carry `Authorization: Bearer TOKEN`.
    pub token: Option<String>,
}

/// A volume name as every way of naming one takes it (`NAME=SPEC`, a config file, the
/// admin endpoint): not empty, and no `=`, `/` or `?`.
pub fn volume_name_ok(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '/', '?'])
}

/// `volume_name_ok`'s rule, as errors state it.
pub const VOLUME_NAME_RULE: &str = "a name is not empty and holds no '=', '/' or '?'";

/// The environment variable the admin commands (`strata status`, `cache set`, ...) read a
/// bearer token from, for a server started with `--admin-token-file`.
pub const TOKEN_ENV: &str = "STRATA_ADMIN_TOKEN";

/// Compares in time independent of where the first difference is.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Whether the request head carries the bearer token `token`.
fn authorized(head: &str, token: &str) -> bool {
    head.lines().any(|l| match l.split_once(':') {
        Some((k, v)) if k.trim().eq_ignore_ascii_case("authorization") => {
            v.trim().strip_prefix("Bearer ").is_some_and(|t| same_secret(t.trim().as_bytes(), token.as_bytes()))
        }
        _ => false,
    })
}

/// The `/status` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub uptime_s: f64,
    /// Open NBD connections.
    pub connections: u64,
    pub volumes: Vec<VolumeStatus>,
}

/// One volume in `/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeStatus {
    pub name: String,
    /// What it was opened from and what it stacks on.
    pub device: String,
    pub size_bytes: u64,
    pub read_only: bool,
    /// Per operation: requests, bytes, errors, latency sum and histogram (`StatsDev::counters`).
    pub ops: serde_json::Value,
    /// The target's own state (for a cache, `strata_cache::CacheStatus`); null for a plain
    /// device.
    pub target: Option<serde_json::Value>,
}

impl Admin {
    /// The admin side of `server`; with `token`, every request must carry it as a bearer token.
    pub fn new(server: Server, token: Option<String>) -> Admin {
        let changes = tokio::sync::RwLock::new(());
        let stopping = std::sync::atomic::AtomicBool::new(false);
        Admin {
            volumes: RwLock::default(),
            changes,
            stopping,
            started: Instant::now(),
            server,
            opener: Opener::new(),
            token,
        }
    }

    /// The volumes served now, in the order they were added.
    pub fn volumes(&self) -> Vec<Arc<Volume>> {
        self.volumes.read().clone()
    }

    /// Opens `spec` and offers it as export `name` (wrapped in request counters).
    /// A spec that is read-only by itself (`?ro`), or a device that is, makes a read-only
    /// export. Nothing is opened
    /// (or created) for a name that cannot be served.
    pub async fn add(&self, name: &str, spec: &Spec, read_only: bool) -> anyhow::Result<Arc<Volume>> {
        let _changing = self.change().await?;
        strata_nbd::check_name(name).map_err(anyhow::Error::msg)?;
        // As on the command line (`NAME=SPEC`), wherever the name comes from.
        if !volume_name_ok(name) {
            bail!("volume name {name:?}: {VOLUME_NAME_RULE}");
        }
        if self.volumes.read().iter().any(|v| v.name == name) {
            bail!("an export named {name:?} is already served");
        }
        let read_only = read_only || spec.read_only();
        let dev = self.opener.open(spec, read_only).await.with_context(|| format!("volume {name}"))?;
        // A device that takes no writes by itself (a read-only remote export) is exported so.
        let read_only = read_only || dev.geometry().read_only;
        let dev = Arc::new(StatsDev::new(dev));
        let export = Export { name: name.to_string(), description: dev.describe(), dev: dev.clone(), read_only };
        if let Err(e) = self.server.add(export) {
            // Added meanwhile by another request: this one's device is closed as it opened.
            let _ = dev.shutdown().await;
            bail!(e);
        }
        let volume = Arc::new(Volume { name: name.to_string(), read_only, dev });
        self.volumes.write().push(volume.clone());
        Ok(volume)
    }

    /// Takes export `name` away: new connections no longer see it; with connections serving
    /// it, refused unless `force`, which lets their in-flight requests finish and closes
    /// them. Then its device is flushed and closed (its files' claims released).
    pub async fn remove(&self, name: &str, force: bool) -> anyhow::Result<()> {
        let _changing = self.change().await?;
        let removed = self.server.remove(name, force).map_err(anyhow::Error::msg)?;
        removed.closed().await;
        drop(removed);
        let volume = {
            let mut volumes = self.volumes.write();
            let i = volumes.iter().position(|v| v.name == name).context("volume not in the list")?;
            volumes.remove(i)
        };
        // Read-only or not: a read-only export takes no writes from clients, but a cache or
        // pool behind it writes its own devices and is closed cleanly as any other.
        volume.dev.shutdown().await.with_context(|| format!("flushing {name}"))?;
        // Answered only once the device is closed and its files' claims released, so the same
        // spec can be added again at once: wait out whoever still holds it for a moment (a
        // status request listing volumes, a client listing exports).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while (Arc::strong_count(&volume) > 1 || Arc::strong_count(&volume.dev) > 1)
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Leave to add or remove a volume, refused once the server's stop has begun closing
    /// its volumes.
    async fn change(&self) -> anyhow::Result<tokio::sync::RwLockReadGuard<'_, ()>> {
        let stopping = || self.stopping.load(std::sync::atomic::Ordering::SeqCst);
        if stopping() {
            bail!("the server is shutting down: its volumes are being closed");
        }
        let changing = self.changes.read().await;
        if stopping() {
            bail!("the server is shutting down: its volumes are being closed");
        }
        Ok(changing)
    }

    /// For the server's stop: waits for the adds and removals under way (a volume being
    /// removed is then closed) and refuses any after, so the volumes listed next are all
    /// there is to close.
    pub async fn stop_changes(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let _all = self.changes.write().await;
    }

    /// Takes every export away (`remove` with `force`), each device flushed and closed.
    pub async fn remove_all(&self) {
        // By name: a volume held here would keep `remove` waiting for its last holder.
        let names: Vec<String> = self.volumes().iter().map(|v| v.name.clone()).collect();
        for name in names {
            let _ = self.remove(&name, true).await;
        }
    }

    pub fn status(&self) -> ServerStatus {
        let volumes = self
            .volumes()
            .iter()
            .map(|v| VolumeStatus {
                name: v.name.clone(),
                device: v.dev.describe(),
                size_bytes: v.dev.size(),
                read_only: v.read_only,
                ops: v.dev.counters(),
                target: v.dev.status(),
            })
            .collect();
        ServerStatus {
            uptime_s: self.started.elapsed().as_secs_f64(),
            connections: self.server.live_connections() as u64,
            volumes,
        }
    }

    /// `/status` as sent: pretty JSON with its keys in sorted order, as it always was.
    pub fn status_text(&self) -> String {
        let sorted = serde_json::to_value(self.status()).expect("a status serialises");
        let mut s = serde_json::to_string_pretty(&sorted).expect("a status serialises");
        s.push('\n');
        s
    }

    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        let head = |name: &str, kind: &str, help: &str, out: &mut String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        head("strata_connections", "gauge", "Open NBD connections.", &mut out);
        let _ = writeln!(out, "strata_connections {}", self.server.live_connections());
        let volumes = self.volumes();
        head("strata_volume_size_bytes", "gauge", "Volume size.", &mut out);
        for v in &volumes {
            let _ = writeln!(out, "strata_volume_size_bytes{{volume=\"{}\"}} {}", escape(&v.name), v.dev.size());
        }
        for (metric, field, help) in [
            ("strata_requests_total", "requests", "Requests completed, by operation."),
            ("strata_bytes_total", "bytes", "Bytes moved by successful requests, by operation."),
            ("strata_errors_total", "errors", "Requests that failed, by operation."),
        ] {
            head(metric, "counter", help, &mut out);
            for v in &volumes {
                for op in OPS {
                    let s = v.dev.op(op);
                    let n = match field {
                        "requests" => s.requests.load(std::sync::atomic::Ordering::Relaxed),
                        "bytes" => s.bytes.load(std::sync::atomic::Ordering::Relaxed),
                        _ => s.errors.load(std::sync::atomic::Ordering::Relaxed),
                    };
                    let _ = writeln!(out, "{metric}{{volume=\"{}\",op=\"{op}\"}} {n}", escape(&v.name));
                }
            }
        }
        head("strata_request_duration_seconds", "histogram", "Request latency, by operation.", &mut out);
        for v in &volumes {
            for op in OPS {
                let s = v.dev.op(op);
                let samples = latency_histogram(
                    [
                        "strata_request_duration_seconds_bucket",
                        "strata_request_duration_seconds_sum",
                        "strata_request_duration_seconds_count",
                    ],
                    "Request latency, by operation.",
                    &[("op", op.to_string())],
                    &LATENCY_BUCKETS_US,
                    s.buckets.iter().map(|b| b.load(std::sync::atomic::Ordering::Relaxed)),
                    s.latency_us_sum.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6,
                );
                for sample in &samples {
                    let _ = writeln!(out, "{}", line(&v.name, sample));
                }
            }
        }
        // What each target reports about itself: one family per name, across the volumes.
        let mut families: BTreeMap<&str, (MetricKind, &str, Vec<String>)> = BTreeMap::new();
        for v in &volumes {
            for s in v.dev.metrics() {
                let family = s.kind.family(s.name);
                families.entry(family).or_insert((s.kind, s.help, Vec::new())).2.push(line(&v.name, &s));
            }
        }
        for (name, (kind, help, lines)) in families {
            head(name, kind.name(), help, &mut out);
            for l in lines {
                out.push_str(&l);
                out.push('\n');
            }
        }
        out
    }
}

/// A sample's line in the text format, labelled with its volume first.
fn line(volume: &str, s: &Sample) -> String {
    let mut labels = format!("volume=\"{}\"", escape(volume));
    for (k, value) in &s.labels {
        let _ = write!(labels, ",{k}=\"{}\"", escape(value));
    }
    format!("{}{{{labels}}} {}", s.name, number(s.value))
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A sample value in the text format (infinities are `+Inf` and `-Inf`).
fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        v.to_string()
    }
}

/// Most admin connections served at once. Each holds a file for up to [`READ_TIMEOUT`]
/// while its request comes in; past this many a new one is answered 503 and closed, so a
/// client opening connections without end cannot take the files the NBD connections need.
pub const MAX_ADMIN_CONNECTIONS: usize = 64;

/// How long a request may take to arrive whole.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves the admin endpoint until the process exits.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_ADMIN_CONNECTIONS));
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Without waiting: the answer fits the socket's buffer, or is not given.
            let why = format!("more than {MAX_ADMIN_CONNECTIONS} admin connections at once; try again\n");
            let _ = stream.try_write(response("503 Service Unavailable", "text/plain", &why).as_bytes());
            continue;
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let read = tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream)).await;
            let (code, ctype, body) = match read {
                // Too slow, or gone: nobody to answer.
                Err(_) | Ok(Err(_)) => return,
                Ok(Ok(Err((code, why)))) => (code, "text/plain", format!("{why}\n")),
                Ok(Ok(Ok(request))) => answer(&admin, request).await,
            };
            let _ = stream.write_all(response(code, ctype, &body).as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// A whole answer: status line, head and body.
fn response(code: &str, ctype: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {code}\r\nServer: {SERVER}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// One request, read whole.
struct Request {
    head: String,
    method: String,
    path: String,
    body: String,
}

/// The answer to a request: status, content type and body.
async fn answer(admin: &Admin, Request { head, method, path, body }: Request) -> (&'static str, &'static str, String) {
    let route = path.split('?').next().unwrap_or("").to_string();
    let denied = admin.token.as_deref().is_some_and(|t| !authorized(&head, t));
    match (method.as_str(), route.as_str()) {
        _ if denied => ("401 Unauthorized", "text/plain", format!("a bearer token is required (set {TOKEN_ENV})\n")),
        ("GET", "/status") => ("200 OK", "application/json", admin.status_text()),
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", admin.metrics_text()),
        ("POST", r) if r.strip_prefix("/volumes/").and_then(|n| n.strip_suffix("/message")).is_some() => {
            let name = name_in_path(&r["/volumes/".len()..r.len() - "/message".len()]);
            match admin.volumes().iter().find(|v| v.name == name) {
                None => ("404 Not Found", "text/plain", format!("no volume named {name:?}\n")),
                Some(v) => match v.dev.message(body.trim()).await {
                    Ok(answer) => ("200 OK", "text/plain", format!("{answer}\n")),
                    Err(e) => ("400 Bad Request", "text/plain", format!("{e}\n")),
                },
            }
        }
        ("POST", "/exports") => {
            let read_only = path.split_once('?').is_some_and(|(_, q)| q.split('&').any(|o| o == "read_only"));
            let added = match crate::cmd::serve::parse_named(body.trim()) {
                Ok((name, spec)) => admin.add(&name, &spec, read_only).await.map(|v| v.dev.describe()),
                Err(e) => Err(anyhow::Error::msg(e)),
            };
            match added {
                Ok(device) => ("200 OK", "text/plain", format!("added: {device}\n")),
                Err(e) => ("400 Bad Request", "text/plain", format!("{e:#}\n")),
            }
        }
        ("DELETE", r) if r.starts_with("/exports/") => {
            let force = path.split_once('?').is_some_and(|(_, q)| q.split('&').any(|o| o == "force"));
            match admin.remove(&name_in_path(&r["/exports/".len()..]), force).await {
                Ok(()) => ("200 OK", "text/plain", "removed\n".to_string()),
                Err(e) => ("400 Bad Request", "text/plain", format!("{e:#}\n")),
            }
        }
        ("GET", _) => ("404 Not Found", "text/plain", "try /status or /metrics\n".to_string()),
        _ => (
            "400 Bad Request",
            "text/plain",
            "GET /status, GET /metrics, POST /volumes/NAME/message, POST /exports, DELETE /exports/NAME\n".to_string(),
        ),
    }
}

/// A volume name from a request path, percent-encoding undone (`percent_encode` on the
/// client side); a segment that does not decode is taken as it is.
fn name_in_path(segment: &str) -> String {
    percent_decode(segment).unwrap_or_else(|_| segment.to_string())
}

/// The longest request head and body the endpoint reads.
const MAX_HEAD: usize = 16 << 10;
const MAX_BODY: usize = 64 << 10;

/// Reads one request: its head, method, path and body. A request the endpoint will not
/// read (a head or body past the bounds, a body length that is not a number, a body cut
/// short) is answered with the status and reason given here.
async fn read_request(stream: &mut tokio::net::TcpStream) -> std::io::Result<Result<Request, (&'static str, String)>> {
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if req.len() > MAX_HEAD {
            let why = format!("a request head longer than {MAX_HEAD} bytes");
            return Ok(Err(("431 Request Header Fields Too Large", why)));
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
    let length = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(str::to_string));
    let length = match length.map(|v| v.trim().parse::<u64>()) {
        None => 0,
        Some(Ok(n)) if n <= MAX_BODY as u64 => n as usize,
        Some(Ok(n)) => return Ok(Err(("413 Content Too Large", format!("a body of {n} bytes: at most {MAX_BODY}")))),
        Some(Err(_)) => return Ok(Err(("400 Bad Request", "Content-Length is not a number".to_string()))),
    };
    while req.len() < head_end + length {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            let why = format!("the body ended after {} of its {length} bytes", req.len() - head_end);
            return Ok(Err(("400 Bad Request", why)));
        }
        req.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&req[head_end..head_end + length]).into_owned();
    Ok(Ok(Request { head, method, path, body }))
}

/// The `Server` header of the admin endpoint's answers, by which its clients know it.
const SERVER: &str = "strata";

/// How long `get` waits for an answer: `/status` and `/metrics` answer at once, so a peer
/// that takes longer is not a strata server (or is stuck), and a monitoring script must not
/// hang on it.
const GET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a control message may take to be answered (settings, invalidate, a snapshot, the
/// start of a flush): all answer at once but a write log's `flush`, which waits for its
/// write-back (`message_unbounded`).
const MESSAGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// How long adding or removing an export may take: opening a device (a remote origin
/// connects, within its own timeout) or closing one (a forced removal waits for its
/// connections, then flushes).
const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// `request`, failing if no answer comes within `limit`.
async fn request_within(
    limit: std::time::Duration,
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<String> {
    tokio::time::timeout(limit, request(addr, method, path, body))
        .await
        .map_err(|_| anyhow::anyhow!("no answer from the admin endpoint at {addr} within {limit:?}"))?
}

/// Fetches `path` from an admin endpoint (for `strata status` and friends).
pub async fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    request_within(GET_TIMEOUT, addr, "GET", path, "").await
}

/// The `/status` of a running server.
pub async fn status(addr: &str) -> anyhow::Result<ServerStatus> {
    Ok(serde_json::from_str(&get(addr, "/status").await?)?)
}

/// Adds export `named` (`NAME=SPEC`) to a running server.
pub async fn add_export(addr: &str, named: &str, read_only: bool) -> anyhow::Result<String> {
    request_within(EXPORT_TIMEOUT, addr, "POST", if read_only { "/exports?read_only" } else { "/exports" }, named).await
}

/// Removes export `name` from a running server.
pub async fn remove_export(addr: &str, name: &str, force: bool) -> anyhow::Result<String> {
    request_within(
        EXPORT_TIMEOUT,
        addr,
        "DELETE",
        &format!("/exports/{}{}", percent_encode(name, true), if force { "?force" } else { "" }),
        "",
    )
    .await
}

/// Sends a control message to a volume of a running server.
pub async fn message(addr: &str, volume: &str, msg: &str) -> anyhow::Result<String> {
    request_within(MESSAGE_TIMEOUT, addr, "POST", &format!("/volumes/{}/message", percent_encode(volume, true)), msg)
        .await
}

/// `message`, for one whose answer waits for as long as the work takes (a write log's flush).
pub async fn message_unbounded(addr: &str, volume: &str, msg: &str) -> anyhow::Result<String> {
    request(addr, "POST", &format!("/volumes/{}/message", percent_encode(volume, true)), msg).await
}

/// A TCP address as given on the command line: without a host (`9810`, `:9810`), loopback.
pub fn tcp_addr(s: &str) -> String {
    if s.starts_with(':') {
        format!("127.0.0.1{s}")
    } else if s.parse::<u16>().is_ok() {
        format!("127.0.0.1:{s}")
    } else {
        s.to_string()
    }
}

async fn request(addr: &str, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    use anyhow::Context;
    let addr = &tcp_addr(addr);
    let unreachable =
        || format!("cannot reach the admin endpoint at {addr} (is `strata serve --admin {addr}` running?)");
    // Other requests may take long to answer (a forced removal waits for its connections),
    // but connecting does not.
    let mut s = tokio::time::timeout(std::time::Duration::from_secs(10), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow::anyhow!("connecting timed out"))
        .with_context(unreachable)?
        .with_context(unreachable)?;
    let auth = match std::env::var(TOKEN_ENV) {
        Ok(t) if !t.is_empty() => format!("Authorization: Bearer {t}\r\n"),
        _ => String::new(),
    };
    s.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).await?;
    let not_strata = |what: &str| anyhow::anyhow!("{addr} is not a strata admin endpoint: it answered {what}");
    let (head, body) = resp.split_once("\r\n\r\n").ok_or_else(|| not_strata("no HTTP response"))?;
    let mut lines = head.lines();
    let status = lines.next().unwrap_or("");
    let ours =
        lines.any(|l| l.split_once(':').is_some_and(|(k, v)| k.eq_ignore_ascii_case("server") && v.trim() == SERVER));
    if !ours {
        return Err(not_strata(&format!("{status:?}")));
    }
    if !status.contains(" 200 ") {
        anyhow::bail!("{}", body.trim());
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A peer that takes the request and never answers is given up on, with the reason.
    #[tokio::test]
    async fn a_silent_peer_is_given_up_on() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let held = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            drop(s);
        });
        let limit = std::time::Duration::from_millis(200);
        let e = request_within(limit, &addr, "POST", "/volumes/v/message", "flush").await.unwrap_err();
        assert!(e.to_string().contains("no answer from the admin endpoint"), "{e}");
        held.abort();
    }

    /// Another HTTP server's answer, error page or not, is said to be another server's
    /// rather than printed as strata's error.
    #[tokio::test]
    async fn another_http_servers_answer_is_named_as_such() {
        for answer in ["HTTP/1.0 501 Unsupported method\r\n\r\n<!DOCTYPE HTML>\n<html>", "HTTP/1.0 200 OK\r\n\r\n{}"] {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            tokio::spawn(async move {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                s.write_all(answer.as_bytes()).await.unwrap();
            });
            let e = request(&addr, "GET", "/status", "").await.unwrap_err().to_string();
            assert!(e.contains("is not a strata admin endpoint") && !e.contains("DOCTYPE"), "{e}");
        }
    }

    /// The server's stop waits for a removal under way (the last volume of a thin pool,
    /// whose data device's flushes take 300 ms), and no volume is added or removed after it.
    #[tokio::test]
    async fn the_stop_waits_for_a_removal_and_refuses_changes_after() {
        let dir = tempfile::tempdir().unwrap();
        let meta = crate::open::tests::pool_meta(dir.path()).await;
        let admin = Admin::new(Server::new(Vec::new(), strata_nbd::Limits::default()).unwrap(), None);
        let slow = format!("thin:{}?id=1&size=1MiB&data=fault:flush:delay=300ms@mem:4MiB", meta.display());
        admin.add("slow", &slow.parse().unwrap(), false).await.unwrap();
        admin.add("kept", &"mem:1MiB".parse().unwrap(), false).await.unwrap();
        let removed = std::sync::atomic::AtomicBool::new(false);
        let ((), (), ()) = tokio::join!(
            async {
                admin.remove("slow", true).await.unwrap();
                removed.store(true, std::sync::atomic::Ordering::SeqCst);
            },
            async {
                // Once "slow" has left the list, its removal is closing it.
                while admin.volumes().len() == 2 {
                    tokio::task::yield_now().await;
                }
                admin.stop_changes().await;
                assert!(removed.load(std::sync::atomic::Ordering::SeqCst), "the stop did not wait for the removal");
            },
            async {
                // Asked for while the stop waits: refused at once, the removal still under way.
                while !admin.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::task::yield_now().await;
                }
                let e = admin.remove("kept", true).await.unwrap_err();
                assert!(e.to_string().contains("shutting down"), "{e}");
                assert!(!removed.load(std::sync::atomic::Ordering::SeqCst), "refused only after the removal ended");
            }
        );
        let e = admin.add("late", &"mem:1MiB".parse().unwrap(), false).await.err().expect("added after the stop");
        assert!(e.to_string().contains("shutting down"), "{e}");
        let e = admin.remove("kept", true).await.unwrap_err();
        assert!(e.to_string().contains("shutting down"), "{e}");
        assert_eq!(admin.volumes().len(), 1, "the volume to close at the stop is still listed");
    }
}
