//! `strata serve`: open the volumes, serve them over NBD, and on SIGTERM/SIGINT finish what
//! is in flight, flush and close every volume and exit 0; a second signal stops at once.

use crate::config::Config;
use crate::http::{self, Admin};
use crate::spec::{NewFiles, Spec};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use strata_io::BlockDev;
use strata_nbd::tls::{ServerTls, TlsMode};
use strata_nbd::{Limits, Server};

#[derive(Args, Debug)]
#[command(after_help = "\
Volume specs:
  PATH                 a file or block device (O_DIRECT where possible)
  PATH?size=4GiB       ... created as a sparse file of that size if missing
                       (other options: direct=on|off, engine=uring|pool, ro)
  PATH?ro&shared       read-only and unclaimed, to read beside a writer. Otherwise every
                       file or block device is claimed while open (flock: one writer or
                       many ro readers; O_EXCL on a writable block device): a second
                       claim, from another process or in this server (two volumes, or a
                       cache's origin also served raw), is refused naming its holder
  mem:SIZE             RAM, e.g. mem:1GiB
  hdd:PATH[?opts]      PATH behind an emulated 7200 rpm disk
                       (seek_min_ms, seek_max_ms, rpm, mib_s, seed)
  ssd:PATH[?opts]      PATH behind an emulated SSD (read_us, write_us, channels, mib_s)
  cache:PATH           a cache made by `strata cache create` (its superblock names the
                       origin; cache:PATH?origin=SPEC overrides it, and everything after
                       origin= is that spec, e.g. cache:PATH?origin=hdd:O.img?rpm=5400&seed=2)
  writecache:PATH      a write log made by `strata writecache create`, in front of the origin
                       its superblock names (writecache:PATH?origin=SPEC overrides it)
  thin:POOL?id=N[&size=S][&skip_block_zeroing][&data=SPEC]
                       thin volume N of the pool whose metadata device is POOL (made by
                       `strata thin pool create`; size= and data= for pools made by other
                       tools, data= last); volumes of one pool share it (docs/THIN.md);
                       low_water_blocks=N, commit_period_ms=N (default 1000) set the pool's
                       low-water mark and periodic commit
  nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH
                       an export of another NBD server (nbdkit, qemu-nbd, strata), e.g. as
                       a cache's origin; options connections=N, timeout=30s (one attempt),
                       outage=180s (how long requests wait for a server that is away),
                       replay=64MiB (unflushed writes kept to write again after a reconnect)
  nbds://..., nbds+unix://...
                       the same over TLS: tls-psk-file=FILE[&tls-username=ID] or
                       tls-certificates=DIR (ca-cert.pem[, client-cert.pem, client-key.pem])
                       [&tls-verify=off] (do not check the server's certificate and name)
  fault:RULE[,RULE]...@SPEC
                       SPEC behind injected faults (tests and drills): each RULE is
                       OPS:EFFECT[:FIELD]..., OPS read|write|flush|discard|zero|any joined
                       by '+', EFFECT eio|enospc|delay=10ms, FIELDs START-END (bytes),
                       once|always|times=N, after=N, p=PROB, seed=N
                       e.g. fault:read:eio:0-1MiB:once@/var/tmp/vol0.img
                       (an origin too: cache:PATH?origin=fault:write:enospc:after=100@PATH)
  slice:OFFSET+SIZE@SPEC
                       SIZE bytes of SPEC from OFFSET (dm-linear), e.g. slice:0+1GiB@hdd:/d.img;
                       slices of one device share its open device and may not overlap unless
                       each says ?overlap (slice:0+1GiB?overlap@...); a qos: volume over the
                       whole device overlaps every other volume on it
  qos:GROUP[?opts]@SPEC
                       SPEC in the IO controller's group GROUP: the qos: volumes ending in one
                       device share its time by weight (weight=1..10000, default 100), one
                       share per NBD connection within a group; caps riops, wiops, rbps, wbps
                       (max lifts one), burst_ms, latency_ms; device options model, depth,
                       slice_ms, idle_ms, max_wait_ms. See docs/QOS.md and `strata qos`.
                       e.g. 'db=qos:db?weight=200@slice:0+100GiB@/dev/sdb'
A word before ':' that is none of these kinds is refused unless a file of that name exists
(write ./foo:bar for a file to be created).

Examples:
  strata serve --unix /tmp/strata.sock vol0=/var/tmp/vol0.img?size=4GiB
  strata serve --tcp 127.0.0.1:10809 --admin 127.0.0.1:9810 fast=mem:1GiB slow=hdd:/data/o.img
  strata serve --config /etc/strata/strata.toml
  strata serve --unix /tmp/s.sock 'flaky=fault:write:eio:0-4KiB:once,any:delay=5ms:p=0.01@mem:64MiB'
  nbdinfo 'nbd+unix:///vol0?socket=/tmp/strata.sock'
  strata serve --tcp 0.0.0.0:10809 --tls require --tls-psk /etc/strata/keys.psk vol0=/var/tmp/vol0.img
  nbdinfo 'nbds://alice@HOST/vol0?tls-psk-file=/etc/strata/keys.psk'
                       (libnbd's form, for nbdinfo and qemu; in a strata spec the user
                       goes in tls-username=alice)")]
pub struct ServeArgs {
    /// Listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub unix: Option<PathBuf>,
    /// Listen on TCP (binds 127.0.0.1 unless a host is given, e.g. 0.0.0.0:10809).
    #[arg(long, value_name = "HOST:PORT")]
    pub tcp: Option<String>,
    /// Serve GET /status (JSON) and GET /metrics (Prometheus) here.
    #[arg(long, value_name = "HOST:PORT")]
    pub admin: Option<String>,
    /// Export every volume read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Read settings from a TOML file (flags given as well take precedence).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Most NBD connections at once (default 1024; at least 1).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub max_connections: Option<usize>,
    /// Most requests in flight per connection (default 128; at least 1).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub max_inflight: Option<usize>,
    /// TLS (NBD STARTTLS): off, on (offered), or require (nothing but STARTTLS and ABORT is
    /// answered before it); off when not given. Needs --tls-certificates and/or --tls-psk.
    #[arg(long, value_name = "MODE")]
    pub tls: Option<TlsMode>,
    /// X.509 credentials: a directory with server-cert.pem, server-key.pem and, for
    /// --tls-verify-peer, ca-cert.pem (the layout nbdkit and qemu use).
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Pre-shared keys: a file in psktool's format (identity:hexkey per line).
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Ask clients for a certificate signed by the directory's ca-cert.pem (X.509 only).
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Require `Authorization: Bearer TOKEN` on the admin endpoint, TOKEN being this file's
    /// first line (the admin commands send $STRATA_ADMIN_TOKEN).
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Volumes to export, as NAME=SPEC. The first is also the default export.
    #[arg(value_name = "NAME=SPEC", value_parser = parse_named)]
    pub volumes: Vec<(String, Spec)>,
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a whole number of at least 1, got {s:?}")),
    }
}

/// Raises this process's soft limit on open files to its hard one, as a server that holds a
/// file descriptor per connection should (systemd keeps the soft limit at 1,024 for programs
/// that still use `select`, which this one does not), and returns the limit now in force
/// (`None` when it cannot be read or is unlimited).
fn raise_open_files_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Parses `NAME=SPEC`.
pub fn parse_named(arg: &str) -> Result<(String, Spec), String> {
    match arg.split_once('=') {
        Some((name, spec)) if crate::http::volume_name_ok(name) && !spec.is_empty() => {
            Ok((name.to_string(), spec.parse().map_err(|e: strata_io::Error| e.to_string())?))
        }
        _ => Err(format!(
            "expected NAME=SPEC (e.g. vol0=/var/lib/strata/vol0.img; {}), got {arg:?}",
            crate::http::VOLUME_NAME_RULE
        )),
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let unix = args.unix.clone().or(cfg.unix.clone());
    let tcp = args.tcp.clone().or(cfg.tcp.clone()).map(|s| crate::http::tcp_addr(&s));
    let admin_addr = args.admin.clone().or(cfg.admin.clone()).map(|s| crate::http::tcp_addr(&s));
    let all_ro = args.read_only || cfg.read_only;
    let mut wanted = Vec::new();
    for v in &cfg.volumes {
        let spec = cfg.spec(v)?;
        wanted.push((v.name.clone(), spec, v.read_only || all_ro));
    }
    wanted.extend(args.volumes.iter().map(|(n, s)| (n.clone(), s.clone(), all_ro)));
    if wanted.is_empty() {
        bail!("no volumes to serve: give NAME=SPEC arguments or [[volume]] entries in --config");
    }
    if unix.is_none() && tcp.is_none() {
        bail!("nowhere to listen: give --unix PATH and/or --tcp HOST:PORT");
    }
    let tls_mode = match (args.tls, &cfg.tls) {
        (Some(m), _) => m,
        (None, Some(m)) => m.parse().map_err(anyhow::Error::msg).context("tls in the config file")?,
        (None, None) => TlsMode::Off,
    };
    let tls_certificates = args.tls_certificates.clone().or(cfg.tls_certificates.clone());
    let tls_psk = args.tls_psk.clone().or(cfg.tls_psk.clone());
    let tls_verify_peer = args.tls_verify_peer || cfg.tls_verify_peer;
    let tls = match tls_mode {
        TlsMode::Off if tls_certificates.is_some() || tls_psk.is_some() || tls_verify_peer => {
            bail!("--tls-certificates, --tls-psk and --tls-verify-peer need --tls on or --tls require")
        }
        TlsMode::Off => None,
        mode => Some(
            ServerTls::new(mode, tls_certificates.as_deref(), tls_psk.as_deref(), tls_verify_peer)
                .context("setting up TLS")?,
        ),
    };
    let token = match args.admin_token_file.as_ref().or(cfg.admin_token_file.as_ref()) {
        None => None,
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let t = text.lines().next().unwrap_or("").trim().to_string();
            if t.is_empty() {
                bail!("{}: the admin token is empty", p.display());
            }
            Some(t)
        }
    };

    let open_files = raise_open_files_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("strata").build()?;
    runtime.block_on(async move {
        strata_io::engine::reap_on_current_runtime();
        let mut limits = Limits::default();
        if let Some(n) = args.max_connections.or(cfg.max_connections) {
            limits.max_connections = n;
        }
        if let Some(n) = args.max_inflight.or(cfg.max_inflight) {
            limits.max_inflight_per_connection = n;
        }
        // A connection takes a file; the volumes, the admin endpoint's connections and the
        // runtime take a few hundred at most.
        if let Some(n) = open_files.filter(|&n| n < limits.max_connections as u64 + 512) {
            eprintln!(
                "strata: warning: {n} open files allowed, too few for {} connections and the volumes: \
                 raise the hard limit (LimitNOFILE=, ulimit -Hn) or lower --max-connections",
                limits.max_connections
            );
        }
        let mut server = Server::new(Vec::new(), limits).map_err(anyhow::Error::msg)?;
        if let Some(tls) = tls {
            server = server.with_tls(tls);
        }
        let admin = Arc::new(Admin::new(server.clone(), token));
        // Files made for `size=`, removed again if the server does not start.
        let new = NewFiles::of(wanted.iter().map(|(_, spec, _)| spec));
        // Caught from before the first volume opens: a stop asked for while they open (a
        // service restarted as it starts) closes those opened cleanly, once the one opening
        // is open; a second signal stops at once. And before any listener exists: a client
        // may stop the server as soon as it sees the socket.
        let mut stop = StopSignals::new()?;
        let mut stopping = false;
        for (name, spec, ro) in wanted {
            let add = admin.add(&name, &spec, ro);
            tokio::pin!(add);
            let added = loop {
                tokio::select! {
                    added = &mut add => break added,
                    _ = stop.next() => {
                        if stopping {
                            bail!("stopped by a second signal while volume {name} was opening");
                        }
                        stopping = true;
                        eprintln!("strata: stopping once volume {name} is open (a second signal stops at once)");
                    }
                }
            };
            if added.is_err() || stopping {
                // Close what was opened cleanly: a cache left open would be marked unclean.
                admin.remove_all().await;
                added?;
                eprintln!("strata: stopped cleanly before serving");
                return Ok(());
            }
        }

        let mut tasks = Vec::new();
        // The socket this server bound (its file's device and inode), removed at the end only
        // if it is still the one at the path: a server started meanwhile on the same path
        // keeps its own.
        let mut bound_unix = None;
        let listening: Result<()> = async {
            if let Some(path) = &unix {
                if let Ok(found) = std::fs::symlink_metadata(path) {
                    // A socket left by a previous run: remove it only if nobody answers on it.
                    // Anything else at that path is the user's, not ours to remove.
                    if !std::os::unix::fs::FileTypeExt::is_socket(&found.file_type()) {
                        bail!("{} exists and is not a socket; give --unix a path that is free or a socket", path.display());
                    }
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        bail!("{} is in use by a running server", path.display());
                    }
                    std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
                }
                let l = tokio::net::UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
                let s = server.clone();
                tasks.push(tokio::spawn(async move { s.serve_unix(l).await }));
                bound_unix = socket_id(path);
                eprintln!("strata: serving NBD on unix:{}", path.display());
            }
            if let Some(addr) = &tcp {
                let l = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
                let s = server.clone();
                tasks.push(tokio::spawn(async move { s.serve_tcp(l).await }));
                eprintln!("strata: serving NBD on tcp:{addr}");
            }
            if let Some(addr) = &admin_addr {
                let l = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding admin {addr}"))?;
                let loopback = l.local_addr().map(|a| a.ip().is_loopback()).unwrap_or(false);
                if !loopback && admin.token.is_none() {
                    eprintln!("strata: warning: the admin endpoint {addr} is reachable beyond this host without a token (--admin-token-file)");
                }
                tokio::spawn(http::serve(l, admin.clone()));
                eprintln!("strata: admin endpoint on http://{addr}/status and /metrics");
            }
            Ok(())
        }
        .await;
        if let Err(e) = listening {
            // Close the volumes opened, as when one fails to open: a cache left open would be
            // marked unclean (every restart of a unit whose port is taken would do it).
            server.shutdown();
            admin.remove_all().await;
            remove_own_socket(unix.as_deref(), bound_unix);
            return Err(e);
        }
        new.keep();
        for v in &admin.volumes() {
            eprintln!("strata: export {:?}: {} bytes, {}", v.name, v.dev.size(), v.dev.describe());
        }

        stop.next().await;
        eprintln!("strata: shutting down: finishing in-flight requests (a second signal stops at once)");
        server.shutdown();
        // The volumes not shut down yet, named if a second signal cuts the wait short.
        let open = parking_lot::Mutex::new(vec!["(all: in-flight requests were still running)".to_string()]);
        let finish = async {
            for t in tasks {
                let _ = t.await;
            }
            server.wait_idle().await;
            admin.stop_changes().await;
            let volumes = admin.volumes();
            *open.lock() = volumes.iter().map(|v| v.name.clone()).collect();
            // All at once: a volume waiting out an absent remote origin holds up no other.
            let shutdowns = volumes.iter().map(|v| async {
                let done = v.dev.shutdown().await;
                open.lock().retain(|n| *n != v.name);
                done.map_err(|e| eprintln!("strata: flushing {}: {e}", v.name)).is_err()
            });
            futures::future::join_all(shutdowns).await.contains(&true)
        };
        let failed = tokio::select! {
            biased;
            failed = finish => failed,
            _ = stop.next() => {
                remove_own_socket(unix.as_deref(), bound_unix);
                bail!("stopped by a second signal before these volumes were shut down: {}", open.lock().join(", "));
            }
        };
        remove_own_socket(unix.as_deref(), bound_unix);
        if failed {
            bail!("some volumes failed to flush at shutdown");
        }
        eprintln!("strata: stopped cleanly");
        Ok(())
    })
}

/// SIGTERM and SIGINT, caught from when it is made: the first asks for a clean stop, a
/// second for one at once.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn new() -> Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// The device and inode of the file at `path`, if any.
fn socket_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Removes the socket this server bound at `path`, unless another has taken the path since.
fn remove_own_socket(path: Option<&std::path::Path>, bound: Option<(u64, u64)>) {
    if let Some(path) = path {
        if bound.is_some() && socket_id(path) == bound {
            let _ = std::fs::remove_file(path);
        }
    }
}
