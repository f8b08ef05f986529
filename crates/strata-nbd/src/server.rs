//! The listening side: accepting on Unix sockets and TCP, running each connection through the
//! handshake and then the transmission phase, and a shutdown that lets in-flight requests
//! finish before the devices are flushed.

use crate::client::{split, BoxStream, Stream};
use crate::export::{stopped, Export, Limits, Removed, Shared};
use crate::handshake::{negotiate, HandshakeEnd};
use crate::tls::ServerTls;
use crate::transmission::transmit;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener};

#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// A server for `exports`; the first is also the default export (empty name).
    pub fn new(exports: Vec<Export>, limits: Limits) -> Result<Server, String> {
        let server = Server { shared: Arc::new(Shared::new(limits)) };
        for e in exports {
            server.add(e)?;
        }
        Ok(server)
    }

    /// Offers (or requires) TLS as `tls` says. Call before serving.
    pub fn with_tls(mut self, tls: ServerTls) -> Server {
        Arc::get_mut(&mut self.shared).expect("with_tls before the server is shared").tls = Some(tls);
        self
    }

    pub fn exports(&self) -> Vec<Arc<Export>> {
        self.shared.exports()
    }

    /// Offers another export while serving (see `Shared::add`).
    pub fn add(&self, export: Export) -> Result<Arc<Export>, String> {
        self.shared.add(export)
    }

    /// Takes an export away while serving (see `Shared::remove`).
    pub fn remove(&self, name: &str, force: bool) -> Result<Removed, String> {
        self.shared.remove(name, force)
    }

    /// Accepts on a Unix socket until shutdown.
    pub async fn serve_unix(&self, listener: UnixListener) {
        let mut stop = self.shared.shutdown_rx.clone();
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => self.spawn_connection(stream),
                    Err(e) => accept_error(e).await,
                },
            }
        }
    }

    /// Accepts on TCP until shutdown.
    pub async fn serve_tcp(&self, listener: TcpListener) {
        let mut stop = self.shared.shutdown_rx.clone();
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        self.spawn_connection(stream);
                    }
                    Err(e) => accept_error(e).await,
                },
            }
        }
    }

    /// Serves one already-connected stream (tests, socket activation).
    pub fn spawn_connection<S: Stream>(&self, stream: S) {
        let Ok(permit) = self.shared.connections.clone().try_acquire_owned() else {
            eprintln!(
                "strata-nbd: connection limit ({}) reached; closing a new connection",
                self.shared.limits.max_connections
            );
            return;
        };
        let shared = self.shared.clone();
        shared.live.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let mut stream = tokio::io::BufReader::with_capacity(64 << 10, Box::new(stream) as BoxStream);
            let timeout = shared.limits.handshake_timeout;
            match tokio::time::timeout(timeout, negotiate(&mut stream, &shared)).await {
                Ok(Ok(neg)) => {
                    // The handshake may have read ahead into the first requests.
                    let early = stream.buffer().to_vec();
                    let (rd, wr) = split(stream.into_inner());
                    transmit(rd, wr, &early, neg, shared.clone()).await
                }
                Ok(Err(HandshakeEnd::Closed)) => {}
                Ok(Err(HandshakeEnd::Drop(why))) => eprintln!("strata-nbd: handshake failed: {why}"),
                Err(_) => eprintln!("strata-nbd: handshake timed out after {timeout:?}"),
            }
            drop(permit);
            if shared.live.fetch_sub(1, Ordering::AcqRel) == 1 {
                shared.idle.notify_waiters();
            }
        });
    }

    /// Stops accepting and tells connections to finish what is in flight and close.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        let _ = self.shared.shutdown_tx.send(true);
    }

    /// Waits until every connection has closed.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.shared.idle.notified();
            if self.shared.live.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    pub fn live_connections(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }
}

async fn accept_error(e: std::io::Error) {
    // Out of file descriptors and the like: back off rather than spin.
    eprintln!("strata-nbd: accept failed: {e}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}
