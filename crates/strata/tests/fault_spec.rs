//! `strata serve NAME=fault:RULES@SPEC`: a volume behind injected faults. The failing request
//! gets the device's error over NBD, and the server keeps serving the others, on the same
//! connection and on new ones.

mod common;

use common::Server;
use strata_nbd::client::{Client, ServerError};

const EIO: u32 = 5;
const ENOSPC: u32 = 28;

fn errno(e: &std::io::Error) -> Option<u32> {
    e.get_ref()?.downcast_ref::<ServerError>().map(|s| s.0)
}

async fn connect(srv: &Server, export: &str) -> Client<tokio::net::UnixStream> {
    Client::connect_unix(srv.sock.as_ref().unwrap(), export).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_fail_only_their_requests() {
    let srv = Server::start(&[
        "vol=fault:read:eio:0-64KiB:once,write:enospc:1MiB-2MiB@{dir}/vol.img?size=16MiB",
        "mem=fault:flush:eio:times=2@mem:4MiB",
    ]);
    let mut c = connect(&srv, "vol").await;
    c.write(0, &[7; 4096], false).await.unwrap();
    let e = c.read(0, 4096).await.unwrap_err();
    assert_eq!(errno(&e), Some(EIO), "the first read of 0-64KiB fails: {e}");
    assert_eq!(c.read(0, 4096).await.unwrap(), vec![7; 4096], "`once` is spent; the data is there");
    let e = c.write(1 << 20, &[1; 4096], false).await.unwrap_err();
    assert_eq!(errno(&e), Some(ENOSPC), "writes into 1-2 MiB fail persistently: {e}");
    let e = c.write((2 << 20) - 512, &[1; 1024], false).await.unwrap_err();
    assert_eq!(errno(&e), Some(ENOSPC), "a write overlapping the range fails too: {e}");
    c.write(2 << 20, &[2; 4096], false).await.unwrap();
    assert_eq!(c.read(2 << 20, 4096).await.unwrap(), vec![2; 4096]);
    assert_eq!(c.read(1 << 20, 4096).await.unwrap(), vec![0; 4096], "the failed write changed nothing");
    c.flush().await.unwrap();

    // Another export with its own rules, on another connection at the same time.
    let mut m = connect(&srv, "mem").await;
    m.write(0, &[3; 512], true).await.unwrap();
    for _ in 0..2 {
        assert_eq!(errno(&m.flush().await.unwrap_err()), Some(EIO));
    }
    m.flush().await.unwrap();
    assert_eq!(m.read(0, 512).await.unwrap(), vec![3; 512]);
    m.disconnect().await.unwrap();

    // The first connection still works, and so does a new one.
    assert_eq!(c.read(0, 4096).await.unwrap(), vec![7; 4096]);
    c.disconnect().await.unwrap();
    let mut d = connect(&srv, "vol").await;
    assert_eq!(d.read(2 << 20, 4096).await.unwrap(), vec![2; 4096]);
    d.disconnect().await.unwrap();
    srv.stop();
}

#[test]
fn bad_fault_specs_are_refused_with_the_reason() {
    for (spec, why) in [
        ("v=fault:read:eio:0-1MiB", "expected fault:RULE"),
        ("v=fault:read:boom@mem:1MiB", "expected an effect"),
        ("v=fault:read:eio@", "no device"),
        ("v=fault:read:eio:p=2@mem:1MiB", "probability"),
    ] {
        let dir = common::tempdir();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["serve", "--unix"])
            .arg(dir.path().join("s.sock"))
            .arg(spec)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{spec}: {err}");
    }
}
