//! Fuzz target: arbitrary bytes as the client side of one NBD session (the handshake, then
//! transmission if the bytes get that far) against a server with small RAM exports. The
//! server must never panic, must close the connection within a bounded time once the client
//! stops sending, and must leave no connection task behind.
//!
//! Each input gets a fresh server, so runs do not depend on each other and every crash
//! reproduces from its input alone. The target must never wait on the wall clock for
//! anything but its own deadline: the devices are RAM and answer at once.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use std::time::Duration;
use strata_io::mem::MemDev;
use strata_nbd::{Export, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::{Builder, Runtime};

/// How long a session may take after the client's last byte: far above what a RAM export
/// needs, far below libFuzzer's own timeout, so a hang is reported as this target's panic.
const SESSION_DEADLINE: Duration = Duration::from_secs(10);

thread_local! {
    // One runtime for the whole run: building one per input would dominate the cost.
    static RUNTIME: Runtime = Builder::new_current_thread().enable_time().build().expect("tokio runtime");
}

fn server() -> Server {
    let export = |name: &str, read_only| Export {
        name: name.into(),
        description: format!("fuzz {name}"),
        dev: Arc::new(MemDev::new(1 << 20)),
        read_only,
    };
    // Small limits, so inputs reach them: a few requests in flight, 256 KiB requests.
    let limits = Limits {
        max_connections: 4,
        max_inflight_per_connection: 4,
        max_request_bytes: 256 << 10,
        buffer_budget_bytes: 4 << 20,
        handshake_timeout: Duration::from_secs(5),
    };
    Server::new(vec![export("mem", false), export("ro", true)], limits).expect("valid exports")
}

async fn session(input: &[u8]) {
    let server = server();
    let (client, conn) = tokio::io::duplex(64 << 10);
    let (rd, wr) = tokio::io::split(conn);
    server.spawn_connection(rd, wr);
    let (mut from_server, mut to_server) = tokio::io::split(client);
    // Replies are read and dropped as they come, so the server never stalls on a full pipe.
    let drain = async {
        let mut sink = vec![0u8; 64 << 10];
        while let Ok(n) = from_server.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let send = async {
        // The server may hang up before taking it all: that is an answer too.
        let _ = to_server.write_all(input).await;
        let _ = to_server.shutdown().await;
    };
    if tokio::time::timeout(SESSION_DEADLINE, async { tokio::join!(drain, send) }).await.is_err() {
        panic!("the server kept the connection open {SESSION_DEADLINE:?} after the client's end of stream");
    }
    if tokio::time::timeout(SESSION_DEADLINE, server.wait_idle()).await.is_err() {
        panic!("the connection closed but its task is still running after {SESSION_DEADLINE:?}");
    }
}

fuzz_target!(|input: &[u8]| {
    RUNTIME.with(|rt| rt.block_on(session(input)));
});
