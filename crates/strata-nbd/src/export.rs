//! What a server offers and what its connections share: the exports, the limits, the state
//! common to every connection ([`Shared`]), and what one connection negotiated
//! ([`Negotiated`]). The server builds these; the handshake and transmission phases read them,
//! so neither phase depends on the server or on the other.

use crate::tls::ServerTls;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_io::BlockDev;
use tokio::sync::{watch, Notify, Semaphore};

/// One named volume offered to clients.
pub struct Export {
    pub name: String,
    pub description: String,
    pub dev: Arc<dyn BlockDev>,
    pub read_only: bool,
}

/// Bounds on what clients may make the server hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// Requests in flight per connection; the server stops reading until one completes.
    pub max_inflight_per_connection: usize,
    /// Largest READ or WRITE payload (advertised as the maximum block size).
    pub max_request_bytes: u32,
    /// Payload bytes held in buffers across all connections.
    pub buffer_budget_bytes: usize,
    /// Payload bytes one connection may hold of that budget (at least one largest request's),
    /// so a client that stops reading its replies cannot take every other's share.
    pub connection_budget_bytes: usize,
    /// Time a client gets to finish the handshake.
    pub handshake_timeout: Duration,
    /// A connection with replies to write, or a write's payload to read, that moves no byte
    /// for this long is closed (its requests still run to completion): a client that stops
    /// reading replies, or sends a write header and no data, does not hold buffers for ever.
    pub stall_timeout: Duration,
    /// Once the server stops or the export is removed, the time a connection's replies get to
    /// go out (each byte moved restarts it) before it is closed.
    pub closing_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 1024,
            max_inflight_per_connection: 128,
            max_request_bytes: 32 << 20,
            buffer_budget_bytes: 1 << 30,
            connection_budget_bytes: 128 << 20,
            handshake_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(60),
            closing_grace: Duration::from_secs(10),
        }
    }
}

/// What every connection of one server shares: its exports and limits, the connection and
/// buffer budgets, and the shutdown signal. The server owns the connection count and the
/// shutdown switch; the handshake and transmission phases read the rest.
pub struct Shared {
    exports: RwLock<Exports>,
    pub limits: Limits,
    pub connections: Arc<Semaphore>,
    pub buffers: Arc<Semaphore>,
    pub(crate) shutdown_tx: watch::Sender<bool>,
    pub shutdown_rx: watch::Receiver<bool>,
    /// Connections being served.
    pub(crate) live: AtomicUsize,
    /// Woken when `live` drops to zero.
    pub(crate) idle: Notify,
    pub(crate) stopping: AtomicBool,
    /// STARTTLS, when the server offers it.
    pub tls: Option<ServerTls>,
}

impl Shared {
    /// The state of a server offering `exports`; `default_export` answers the empty name.
    pub fn new(limits: Limits) -> Shared {
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        Shared {
            exports: RwLock::new(Exports::default()),
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            buffers: Arc::new(Semaphore::new(limits.buffer_budget_bytes)),
            limits,
            shutdown_tx,
            shutdown_rx,
            live: AtomicUsize::new(0),
            idle: Notify::new(),
            stopping: AtomicBool::new(false),
            tls: None,
        }
    }

    /// The export `name` names; the empty name is the default export.
    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        self.attach(name).map(|(e, _)| e)
    }

    /// The export `name` names and a receiver that turns true when it is removed: a
    /// connection holds it for as long as it serves the export.
    pub fn attach(&self, name: &str) -> Option<(Arc<Export>, watch::Receiver<bool>)> {
        let exports = self.exports.read();
        let key = if name.is_empty() { exports.default.as_deref()? } else { name };
        exports.map.get(key).map(|s| (s.export.clone(), s.retire.subscribe()))
    }

    pub fn exports(&self) -> Vec<Arc<Export>> {
        self.exports.read().map.values().map(|s| s.export.clone()).collect()
    }

    /// Offers `export` to new connections. The first export added while there is no default
    /// answers the empty name. Refused once the server is shutting down: the volumes it
    /// closes are those it serves once its connections are done.
    pub fn add(&self, export: Export) -> Result<Arc<Export>, String> {
        check_name(&export.name)?;
        let mut exports = self.exports.write();
        if self.shutting_down() {
            return Err(format!("the server is shutting down: {:?} is not added", export.name));
        }
        if exports.map.contains_key(&export.name) {
            return Err(format!("an export named {:?} is already served", export.name));
        }
        let export = Arc::new(export);
        exports.default.get_or_insert_with(|| export.name.clone());
        exports.added += 1;
        let served = Served { export: export.clone(), retire: watch::channel(false).0, added: exports.added };
        exports.map.insert(export.name.clone(), served);
        Ok(export)
    }

    /// Takes the export `name` away from new connections. With connections serving it, it is
    /// refused unless `force`, which tells them to finish what is in flight and close;
    /// `Removed::closed` waits for the last of them.
    pub fn remove(&self, name: &str, force: bool) -> Result<Removed, String> {
        let mut exports = self.exports.write();
        let Some(served) = exports.map.get(name) else {
            return Err(format!("no export named {name:?}"));
        };
        let users = served.retire.receiver_count();
        if users > 0 && !force {
            return Err(format!("export {name:?} has {users} connection(s); remove it with force to close them"));
        }
        let served = exports.map.remove(name).expect("found above");
        if exports.default.as_deref() == Some(name) {
            // The export served longest answers the empty name now, as after a restart.
            exports.default = exports.map.values().min_by_key(|s| s.added).map(|s| s.export.name.clone());
        }
        let _ = served.retire.send(true);
        Ok(Removed { export: served.export, retire: served.retire })
    }

    pub fn shutting_down(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct Exports {
    map: BTreeMap<String, Served>,
    /// The export the empty name selects.
    default: Option<String>,
    /// Exports added so far: each one's `Served::added`.
    added: u64,
}

struct Served {
    export: Arc<Export>,
    /// The order exports were added in (1 for the first).
    added: u64,
    /// Sends true when the export is removed; each connection serving it holds a receiver.
    retire: watch::Sender<bool>,
}

/// An export taken away from new connections.
pub struct Removed {
    pub export: Arc<Export>,
    retire: watch::Sender<bool>,
}

impl Removed {
    /// Completes when no connection serves the export any more.
    pub async fn closed(&self) {
        self.retire.closed().await
    }
}

/// What the client negotiated, handed to the transmission phase.
pub struct Negotiated {
    pub export: Arc<Export>,
    /// Turns true when the export is removed: the connection finishes and closes.
    pub retired: watch::Receiver<bool>,
    pub structured: bool,
    pub base_allocation: bool,
    /// The client asked for block sizes, so it promised to honour them.
    pub block_size_agreed: bool,
    /// The connection went over to TLS (STARTTLS).
    pub tls: bool,
}

/// An export name clients can send and the admin endpoint can address: UTF-8 (a `String`
/// already), at most the protocol's 4096 bytes, and no control characters (a newline in a
/// name would break the logs and `/metrics`).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.len() > 4096 {
        let head: String = name.chars().take(32).collect();
        return Err(format!("export name longer than 4096 bytes: {head:?}..."));
    }
    if name.chars().any(char::is_control) {
        return Err(format!("export name {name:?} holds a control character"));
    }
    Ok(())
}

/// Block size constraints we advertise: (minimum, preferred, maximum). The minimum also
/// divides the export's size (the protocol's SHOULD): a client that honours it can then reach
/// the last bytes of a file whose size is not a multiple of its sectors (the device takes
/// such requests through its read-modify-write path).
pub fn block_sizes(export: &Export, max_request: u32) -> (u32, u32, u32) {
    let g = export.dev.geometry();
    let size = export.dev.size();
    let divides_size = if size == 0 { 65536 } else { 1u64 << size.trailing_zeros().min(16) } as u32;
    let min = g.min_block_bytes.clamp(1, 65536).next_power_of_two().min(divides_size);
    let pref = g.preferred_block_bytes.max(min).max(512);
    (min, pref, max_request.max(pref))
}

/// Completes once shutdown has been asked for.
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
