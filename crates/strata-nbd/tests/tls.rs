//! STARTTLS in the server: with `require`, nothing but STARTTLS and ABORT is answered before
//! TLS; with `on`, TLS is offered and plain clients still served; a wrong key fails the TLS
//! handshake of that connection only.

use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_nbd::client::{choose, greet, start_tls, BoxStream, Want};
use strata_nbd::proto::*;
use strata_nbd::tls::{ClientTls, ServerTls, TlsMode};
use strata_nbd::{Export, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

fn server(dir: &std::path::Path, mode: TlsMode) -> Server {
    let keys = dir.join("keys.psk");
    std::fs::write(&keys, "alice:0123456789abcdef0123456789abcdef\n").unwrap();
    let export = Export {
        name: "vol".into(),
        description: String::new(),
        dev: Arc::new(MemDev::new(1 << 20)),
        read_only: false,
    };
    let tls = ServerTls::new(mode, None, Some(&keys), false).unwrap();
    Server::new(vec![export], Limits::default()).unwrap().with_tls(tls)
}

fn connect(s: &Server) -> UnixStream {
    let (a, b) = UnixStream::pair().unwrap();
    s.spawn_connection(b);
    a
}

fn client_tls(dir: &std::path::Path, key: &str) -> ClientTls {
    let f = dir.join(format!("client-{key}.psk"));
    std::fs::write(&f, format!("alice:{key}\n")).unwrap();
    ClientTls { psk_file: Some(f), ..ClientTls::default() }
}

async fn option(c: &mut UnixStream, opt: u32, data: &[u8]) -> u32 {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    c.write_all(&b).await.unwrap();
    assert_eq!(c.read_u64().await.unwrap(), OPT_REPLY_MAGIC);
    assert_eq!(c.read_u32().await.unwrap(), opt);
    let kind = c.read_u32().await.unwrap();
    let len = c.read_u32().await.unwrap();
    let mut d = vec![0; len as usize];
    c.read_exact(&mut d).await.unwrap();
    kind
}

#[tokio::test]
async fn require_answers_nothing_but_starttls_before_tls() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), TlsMode::Require);
    let mut c = connect(&s);
    greet(&mut c).await.unwrap();
    let mut go = 3u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"vol");
    go.extend_from_slice(&0u16.to_be_bytes());
    for (opt, data) in [(OPT_GO, &go[..]), (OPT_INFO, &go[..]), (OPT_LIST, &[][..]), (OPT_STRUCTURED_REPLY, &[][..])] {
        assert_eq!(option(&mut c, opt, data).await, REP_ERR_TLS_REQD, "option {opt}");
    }
    start_tls(&mut c).await.unwrap();
    let boxed: BoxStream = Box::new(c);
    let mut t = client_tls(dir.path(), "0123456789abcdef0123456789abcdef").connect("localhost", boxed).await.unwrap();
    let info = choose(&mut t, &Want { export: "vol", structured: true, base_allocation: true, block_sizes: true })
        .await
        .unwrap();
    assert_eq!(info.size, 1 << 20);
    assert!(info.structured && info.base_allocation.is_some());

    // A wrong key fails that handshake; the next client with the right key gets in.
    let mut c = connect(&s);
    greet(&mut c).await.unwrap();
    start_tls(&mut c).await.unwrap();
    let wrong = client_tls(dir.path(), "ffffffffffffffffffffffffffffffff").connect("localhost", Box::new(c)).await;
    assert!(wrong.is_err(), "a wrong key got in");
    let mut c = connect(&s);
    greet(&mut c).await.unwrap();
    start_tls(&mut c).await.unwrap();
    let mut t =
        client_tls(dir.path(), "0123456789abcdef0123456789abcdef").connect("localhost", Box::new(c)).await.unwrap();
    choose(&mut t, &Want { export: "vol", structured: false, base_allocation: false, block_sizes: true })
        .await
        .unwrap();
}

#[tokio::test]
async fn on_offers_tls_and_still_serves_plain_clients() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), TlsMode::On);
    let mut c = connect(&s);
    greet(&mut c).await.unwrap();
    choose(&mut c, &Want { export: "vol", structured: true, base_allocation: false, block_sizes: true }).await.unwrap();
    let mut c = connect(&s);
    greet(&mut c).await.unwrap();
    start_tls(&mut c).await.unwrap();
    let mut t =
        client_tls(dir.path(), "0123456789abcdef0123456789abcdef").connect("localhost", Box::new(c)).await.unwrap();
    choose(&mut t, &Want { export: "vol", structured: true, base_allocation: false, block_sizes: true }).await.unwrap();
}
