//! What a server offers and what its connections share: the exports, the limits, the state
//! common to every connection ([`Shared`]), and what one connection negotiated
//! ([`Negotiated`]). The server builds these; the handshake and transmission phases read them,
//! so neither phase depends on the server or on the other.

use crate::tls::ServerTls;
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
    /// Time a client gets to finish the handshake.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 1024,
            max_inflight_per_connection: 128,
            max_request_bytes: 32 << 20,
            buffer_budget_bytes: 1 << 30,
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

/// What every connection of one server shares: its exports and limits, the connection and
/// buffer budgets, and the shutdown signal. The server owns the connection count and the
/// shutdown switch; the handshake and transmission phases read the rest.
pub struct Shared {
    exports: BTreeMap<String, Arc<Export>>,
    default_export: Option<String>,
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
    pub fn new(exports: BTreeMap<String, Arc<Export>>, default_export: Option<String>, limits: Limits) -> Shared {
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        Shared {
            exports,
            default_export,
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

    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        let key = if name.is_empty() { self.default_export.as_deref()? } else { name };
        self.exports.get(key).cloned()
    }

    pub fn exports(&self) -> impl Iterator<Item = &Arc<Export>> {
        self.exports.values()
    }

    pub fn shutting_down(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

/// What the client negotiated, handed to the transmission phase.
pub struct Negotiated {
    pub export: Arc<Export>,
    pub structured: bool,
    pub base_allocation: bool,
    /// The client asked for block sizes, so it promised to honour them.
    pub block_size_agreed: bool,
}

/// Block size constraints we advertise: (minimum, preferred, maximum).
pub fn block_sizes(export: &Export, max_request: u32) -> (u32, u32, u32) {
    let g = export.dev.geometry();
    let min = g.min_block_bytes.clamp(1, 65536).next_power_of_two();
    let pref = g.preferred_block_bytes.max(min).max(512);
    (min, pref, max_request.max(pref))
}

/// Completes once shutdown has been asked for.
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
