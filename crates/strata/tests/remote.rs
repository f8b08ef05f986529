//! Remote origins and TLS against real peers: strata as a client of nbdkit (memory and file
//! plugins, with the delay filter, with TLS-PSK), qemu-nbd and another `strata serve`, data
//! checked end to end; strata as a TLS server for nbdinfo, nbdcopy and qemu-img, refusing
//! clients without TLS or with a wrong key while serving the others; and faults: the remote
//! server killed and restarted under a writeback cache, and one that stops (SIGSTOP).
//!
//! The tools come from scripts/setup.sh (nbdkit, libnbd-bin, qemu-utils, gnutls-bin).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `tools` are all installed; under CI=true a missing one fails the test.
fn tools(test: &str, tools: &[&str]) -> bool {
    for t in tools {
        if !have(t) {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: {t} is missing (scripts/setup.sh installs it)"
            );
            eprintln!("SKIP: {test}: {t} is not installed (see scripts/setup.sh)");
            return false;
        }
    }
    true
}

/// A peer NBD server we started (nbdkit, qemu-nbd), listening on a Unix socket.
struct Peer {
    child: Option<Child>,
    sock: PathBuf,
    argv: Vec<String>,
}

impl Peer {
    /// Starts `prog args` (which must listen on `sock`) and waits until it greets.
    fn start(prog: &str, args: &[String], sock: &Path) -> Peer {
        let _ = std::fs::remove_file(sock);
        let child = cmd(prog).args(args).stdin(Stdio::null()).stdout(Stdio::null()).spawn().expect(prog);
        let mut p = Peer { child: Some(child), sock: sock.to_path_buf(), argv: args.to_vec() };
        let deadline = Instant::now() + START_TIMEOUT;
        while !nbd_greets_unix(sock) {
            if let Some(st) = p.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("{prog} {:?} exited ({st}) before listening", p.argv);
            }
            assert!(Instant::now() < deadline, "{prog} {:?} did not listen on {}", p.argv, sock.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    /// `nbdkit` in the foreground on `sock`, exiting with the test, with `args` (filters,
    /// TLS options, then the plugin and its parameters).
    fn nbdkit(sock: &Path, args: &[&str]) -> Peer {
        let mut a: Vec<String> = ["-f", "--exit-with-parent", "-U"].iter().map(|s| s.to_string()).collect();
        a.push(sock.display().to_string());
        a.extend(args.iter().map(|s| s.to_string()));
        Peer::start("nbdkit", &a, sock)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///vol?socket={}", self.sock.display())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), libc::SIGCONT);
            signal(c.id(), libc::SIGKILL);
            let _ = c.wait();
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes `data` over the start of an NBD URI with nbdcopy (from a file).
fn write_via(uri: &str, dir: &Path, data: &[u8], tag: &str) {
    let src = dir.join(format!("{tag}.bin"));
    std::fs::write(&src, data).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(uri));
}

/// The first `len` bytes of an NBD URI.
fn read_via(uri: &str, dir: &Path, len: u64, tag: &str) -> Vec<u8> {
    let out = dir.join(format!("{tag}.out"));
    let _ = std::fs::remove_file(&out);
    run_ok(Command::new("nbdcopy").arg(uri).arg(&out));
    let mut v = std::fs::read(&out).unwrap();
    v.truncate(len as usize);
    v
}

const SIZE: u64 = 16 * MIB;

/// A temp dir with the socket path for a peer and a zeroed origin file for it.
fn peer_dir(name: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempdir();
    let sock = dir.path().join(format!("{name}.sock"));
    let file = dir.path().join(format!("{name}.img"));
    std::fs::write(&file, vec![0u8; SIZE as usize]).unwrap();
    (dir, sock, file)
}

/// strata serving `r=<origin>` (no cache) and `m=mem:`; writes through strata land in the
/// origin, and what the origin holds reads back through strata.
fn round_trip_through_strata(origin_uri: &str, label: &str) {
    let srv = Server::start(&[&format!("r={origin_uri}"), "m=mem:16MiB"]);
    let d = srv.path().to_path_buf();
    let data = random_bytes(SIZE as usize, 11);
    write_via(&srv.uri("r"), &d, &data, "a");
    assert_same_bytes(&read_via(origin_uri, &d, SIZE, "direct"), &data, &format!("{label}: origin after writes"));
    assert_same_bytes(&read_via(&srv.uri("r"), &d, SIZE, "back"), &data, &format!("{label}: read back via strata"));
    let info = run_ok(Command::new("nbdinfo").arg("--json").arg(srv.uri("r")));
    assert!(info.contains(&format!("{SIZE}")), "{label}: {info}");
    srv.stop();
}

#[test]
fn a_client_of_nbdkit_memory_file_and_delay() {
    if !tools("nbdkit_client", &["nbdkit", "nbdcopy", "nbdinfo", "qemu-img"]) {
        return;
    }
    let (_dir, sock, file) = peer_dir("k");
    let file_arg = format!("file={}", file.display());
    for (label, args) in [
        ("memory", vec!["memory", "16M"]),
        ("file", vec!["file", &file_arg]),
        ("file+delay", vec!["--filter=delay", "file", &file_arg, "rdelay=2ms", "wdelay=2ms"]),
    ] {
        let k = Peer::nbdkit(&sock, &args);
        round_trip_through_strata(&k.uri(), label);
    }
    // And the file really holds it.
    assert_same_bytes(&std::fs::read(&file).unwrap(), &random_bytes(SIZE as usize, 11), "nbdkit's file");
}

/// A remote export that is read-only is exported read-only: clients see the flag (and so
/// do not offer writes) and a write gets an error, as with a `?ro` file.
#[test]
fn a_read_only_remote_is_exported_read_only() {
    if !tools("read_only_remote", &["nbdkit", "nbdinfo"]) {
        return;
    }
    let (_dir, sock, file) = peer_dir("ro");
    let k = Peer::nbdkit(&sock, &["-r", "file", &format!("file={}", file.display())]);
    let srv = Server::start_opts(
        tempdir(),
        ServerOpts { admin: true, args: vec![format!("r={}", k.uri())], ..Default::default() },
    );
    let can = |what: &str| Command::new("nbdinfo").args(["--can", what, &srv.uri("r")]).status().unwrap().success();
    assert!(!can("write"), "the export offers writes");
    assert!(!can("trim") && !can("zero"), "a read-only export offers trim or zeroing");
    assert!(can("read"));
    assert_eq!(srv.status()["volumes"][0]["read_only"], true);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "r").await.unwrap();
        assert!(c.write(0, &[1; 4096], false).await.is_err(), "a write to a read-only export succeeded");
    });
    srv.stop();
}

/// Writes of part of a block of a server whose minimum block is 4 KiB are read-modify-written:
/// many of them in flight at once, to different sectors of the same blocks, lose none.
#[test]
fn concurrent_partial_writes_to_a_server_with_4k_blocks_lose_nothing() {
    if !tools("remote_rmw", &["nbdkit"]) {
        return;
    }
    let (_dir, sock, _) = peer_dir("k4");
    let policy =
        ["blocksize-minimum=4096", "blocksize-preferred=4096", "blocksize-maximum=1M", "blocksize-error-policy=error"];
    let mut args = vec!["--filter=blocksize-policy", "memory", "16M"];
    args.extend(policy);
    let k = Peer::nbdkit(&sock, &args);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let spec: strata::spec::Spec = k.uri().parse().unwrap();
        let dev = strata::open::open(&spec, false).await.unwrap();
        assert_eq!(dev.geometry().min_block_bytes, 4096);
        let mut sectors: Vec<u64> = (0..128).collect();
        let mut want = vec![0u8; 128 * 512];
        for round in 0..4u8 {
            // A different order each round, 32 writes of 512 bytes in flight at a time.
            sectors.rotate_left(37);
            sectors.reverse();
            for batch in sectors.chunks(32) {
                let writes = batch.iter().map(|&s| {
                    let data = vec![(s as u8).wrapping_mul(7) ^ round; 512];
                    want[s as usize * 512..(s as usize + 1) * 512].copy_from_slice(&data);
                    dev.write(s * 512, strata_io::Buf::from_slice(&data), false)
                });
                for r in futures::future::join_all(writes).await {
                    r.unwrap();
                }
            }
        }
        dev.flush().await.unwrap();
        let got = dev.read(0, strata_io::Buf::zeroed(want.len())).await.unwrap();
        assert_same_bytes(&got, &want, "sectors written at once into shared 4 KiB blocks");
    });
}

#[test]
fn a_client_of_qemu_nbd_and_of_another_strata() {
    if !tools("qemu_nbd_client", &["qemu-nbd", "nbdcopy", "nbdinfo", "qemu-img"]) {
        return;
    }
    let (_dir, sock, file) = peer_dir("q");
    let args: Vec<String> = ["-f", "raw", "-x", "vol", "-t", "-e", "8", "--cache=writeback"]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--socket={}", sock.display()), file.display().to_string()])
        .collect();
    let q = Peer::start("qemu-nbd", &args, &sock);
    round_trip_through_strata(&q.uri(), "qemu-nbd");
    drop(q);

    let a = Server::start(&["vol=mem:16MiB"]);
    round_trip_through_strata(&a.uri("vol"), "strata");
    a.stop();
}

#[test]
fn a_cache_in_front_of_nbdkit_over_tls_psk() {
    if !tools("tls_psk_client", &["nbdkit", "nbdcopy", "psktool", "qemu-img"]) {
        return;
    }
    let (dir, sock, file) = peer_dir("k");
    let keys = dir.path().join("keys.psk");
    run_ok(Command::new("psktool").args(["-u", "alice", "-p"]).arg(&keys));
    let _k = Peer::nbdkit(
        &sock,
        &["--tls=require", &format!("--tls-psk={}", keys.display()), "file", &format!("file={}", file.display())],
    );
    let origin = format!("nbds+unix:///vol?socket={}&tls-psk-file={}", sock.display(), keys.display());
    // A writethrough cache over the TLS origin.
    let cache = dir.path().join("c.img");
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["cache", "create", "--mode", "writethrough", "--origin", &origin, "--cache"])
        .arg(format!("{}?size=8MiB", cache.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "cache create over nbds: {}", String::from_utf8_lossy(&o.stderr));
    let srv = Server::start(&[&format!("c=cache:{}", cache.display())]);
    let data = random_bytes(SIZE as usize, 5);
    write_via(&srv.uri("c"), srv.path(), &data, "w");
    assert_same_bytes(&read_via(&srv.uri("c"), srv.path(), SIZE, "r"), &data, "through the cache");
    let st = srv.stop();
    assert!(!st.contains("error"), "{st}");
    assert_same_bytes(&std::fs::read(&file).unwrap(), &data, "nbdkit's file behind TLS");

    // Without TLS, or with another key, the origin refuses: serve says so and exits.
    let plain = format!("nbd+unix:///vol?socket={}", sock.display());
    let other = dir.path().join("other.psk");
    run_ok(Command::new("psktool").args(["-u", "alice", "-p"]).arg(&other));
    let wrong = format!("nbds+unix:///vol?socket={}&tls-psk-file={}&timeout=5s", sock.display(), other.display());
    for spec in [plain, wrong] {
        let o = output(
            Command::new(env!("CARGO_BIN_EXE_strata"))
                .args(["serve", "--unix"])
                .arg(dir.path().join("x.sock"))
                .arg(format!("v={spec}")),
            CMD_TIMEOUT,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{spec}: {err}");
        assert!(err.contains("TLS") || err.contains("refused"), "{spec}: {err}");
    }
}

/// A strata server requiring TLS with a PSK file; returns it and the key file.
fn tls_server(dir_keys: &Path) -> (Server, PathBuf) {
    let keys = dir_keys.join("keys.psk");
    run_ok(Command::new("psktool").args(["-u", "alice", "-p"]).arg(&keys));
    let srv = Server::start_opts(
        tempdir(),
        ServerOpts {
            args: vec![
                "--tls".into(),
                "require".into(),
                "--tls-psk".into(),
                keys.display().to_string(),
                "vol=mem:16MiB".into(),
            ],
            ..Default::default()
        },
    );
    (srv, keys)
}

/// A server with both a PSK file and certificates takes libnbd's clients of each kind (a
/// GnuTLS client with a key only offers certificate suites too, which it cannot complete).
#[test]
fn a_tls_server_with_keys_and_certificates_takes_both_kinds_of_client() {
    if !tools("tls_both", &["nbdinfo", "psktool", "openssl"]) {
        return;
    }
    let keys_dir = tempdir();
    let certs = keys_dir.path().join("certs");
    x509(&certs, "ca", &["server"]);
    let keys = keys_dir.path().join("keys.psk");
    run_ok(Command::new("psktool").args(["-u", "alice", "-p"]).arg(&keys));
    let args = ["--tls", "require", "--tls-psk", keys.to_str().unwrap(), "--tls-certificates", certs.to_str().unwrap()];
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.push("vol=mem:16MiB".into());
    let srv = Server::start_opts(tempdir(), ServerOpts { args, ..Default::default() });
    let sock = srv.sock.clone().unwrap();
    for uri in [
        format!("nbds+unix://alice@/vol?socket={}&tls-psk-file={}", sock.display(), keys.display()),
        format!(
            "nbds+unix:///vol?socket={}&tls-certificates={}&tls-hostname=localhost",
            sock.display(),
            certs.display()
        ),
    ] {
        let o = output(Command::new("nbdinfo").args(["--size", &uri]), CMD_TIMEOUT);
        let why = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "16777216", "{uri}: {why}");
    }
    srv.stop();
}

#[test]
fn a_tls_server_for_nbdinfo_nbdcopy_and_qemu_img() {
    if !tools("tls_server", &["nbdinfo", "nbdcopy", "psktool", "qemu-img"]) {
        return;
    }
    let keys_dir = tempdir();
    let (srv, keys) = tls_server(keys_dir.path());
    let sock = srv.sock.clone().unwrap();
    let tls_uri = format!("nbds+unix://alice@/vol?socket={}&tls-psk-file={}", sock.display(), keys.display());
    let info = run_ok(Command::new("nbdinfo").arg("--json").arg(&tls_uri));
    assert!(info.contains("16777216"), "{info}");
    let data = random_bytes(SIZE as usize, 9);
    write_via(&tls_uri, srv.path(), &data, "in");
    assert_same_bytes(&read_via(&tls_uri, srv.path(), SIZE, "out"), &data, "nbdcopy over TLS");

    // qemu-img reads the same bytes with tls-creds-psk (it wants the key file as DIR/keys.psk).
    let out = srv.path().join("qemu.img");
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-O", "raw", "--object"])
            .arg(format!("tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice", keys_dir.path().display()))
            .arg("--image-opts")
            .arg(format!("driver=nbd,path={},export=vol,tls-creds=tls0", sock.display()))
            .arg(&out),
    );
    assert_same_bytes(&std::fs::read(&out).unwrap(), &data, "qemu-img over TLS");

    // Refused: no TLS, and a wrong key. The server keeps serving the right one.
    let plain = output(Command::new("nbdinfo").arg(srv.uri("vol")), CMD_TIMEOUT);
    assert!(!plain.status.success(), "a client without TLS got in");
    let other = keys_dir.path().join("other.psk");
    run_ok(Command::new("psktool").args(["-u", "alice", "-p"]).arg(&other));
    let wrong = format!("nbds+unix://alice@/vol?socket={}&tls-psk-file={}", sock.display(), other.display());
    let o = output(Command::new("nbdinfo").arg(&wrong), CMD_TIMEOUT);
    assert!(!o.status.success(), "a client with a wrong key got in");
    assert_same_bytes(&read_via(&tls_uri, srv.path(), SIZE, "again"), &data, "still serving after refusals");
    let err = srv.stop();
    assert!(err.contains("handshake failed"), "the refusals are logged: {err}");
}

#[test]
fn strata_to_strata_over_tls() {
    if !tools("strata_tls", &["psktool", "nbdcopy"]) {
        return;
    }
    let keys_dir = tempdir();
    let (a, keys) = tls_server(keys_dir.path());
    let origin =
        format!("nbds+unix:///vol?socket={}&tls-psk-file={}", a.sock.as_ref().unwrap().display(), keys.display());
    let b = Server::start(&[&format!("r={origin}")]);
    let data = random_bytes(SIZE as usize, 3);
    write_via(&b.uri("r"), b.path(), &data, "w");
    let tls_uri = origin.replace("nbds+unix:///", "nbds+unix://alice@/");
    assert_same_bytes(&read_via(&tls_uri, b.path(), SIZE, "r"), &data, "strata client to strata server over TLS");
    b.stop();
    a.stop();
}

/// `GET /status` volume `name`'s target JSON.
fn target(srv: &Server, name: &str) -> serde_json::Value {
    let st = srv.status();
    st["volumes"].as_array().unwrap().iter().find(|v| v["name"] == name).unwrap()["target"].clone()
}

#[test]
fn the_remote_killed_and_restarted_under_a_writeback_cache() {
    if !tools("restart_under_writeback", &["nbdkit", "nbdcopy", "qemu-io"]) {
        return;
    }
    let (dir, sock, file) = peer_dir("k");
    let file_arg = format!("file={}", file.display());
    let mut k = Peer::nbdkit(&sock, &["file", &file_arg]);
    let cache = dir.path().join("c.img");
    let origin = format!("{}&timeout=2s", k.uri());
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["cache", "create", "--mode", "writeback", "--block-size", "64KiB", "--origin", &origin, "--cache"])
        .arg(format!("{}?size=8MiB", cache.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let srv = Server::start_opts(
        tempdir(),
        ServerOpts { admin: true, args: vec![format!("c=cache:{}", cache.display())], ..Default::default() },
    );
    let uri = srv.uri("c");
    let write = |pat: u8, at: u64| {
        let o = output(
            Command::new("qemu-io").args(["-f", "raw", "-c", &format!("write -P {pat} {at} 1M"), &uri]),
            CMD_TIMEOUT,
        );
        assert!(o.status.success(), "write {pat} at {at}: {}", String::from_utf8_lossy(&o.stdout));
    };
    let check = |pat: u8, at: u64| {
        let o = output(
            Command::new("qemu-io").args(["-f", "raw", "-c", &format!("read -P {pat} {at} 1M"), &uri]),
            CMD_TIMEOUT,
        );
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && !text.contains("failed"), "read {pat} at {at}: {text}");
    };
    write(1, 0); // before, and written back
    let deadline = Instant::now() + Duration::from_secs(20);
    while target(&srv, "c")["dirty_blocks"].as_u64() != Some(0) {
        assert!(Instant::now() < deadline, "not written back: {}", srv.status());
        std::thread::sleep(Duration::from_millis(100));
    }
    k.kill();
    let t = Instant::now();
    write(2, 2 * MIB); // during: the cache takes it
    check(1, 0); // hits are served
    assert!(t.elapsed() < Duration::from_secs(20), "the cache served without the origin");
    // The connections see nbdkit gone in their own tasks.
    let deadline = Instant::now() + Duration::from_secs(10);
    while target(&srv, "c")["origin"]["state"] != "down" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let origin = &target(&srv, "c")["origin"];
    assert_eq!(origin["state"], "down", "status: {origin}");
    let _k2 = Peer::nbdkit(&sock, &["file", &file_arg]);
    write(3, 4 * MIB); // after
    let flushed = output(
        Command::new(env!("CARGO_BIN_EXE_strata")).args([
            "cache",
            "flush",
            "--admin",
            srv.admin.as_ref().unwrap(),
            "c",
        ]),
        CMD_TIMEOUT,
    );
    assert!(flushed.status.success(), "{}", String::from_utf8_lossy(&flushed.stderr));
    srv.stop();
    let disk = std::fs::read(&file).unwrap();
    for (pat, at) in [(1u8, 0u64), (2, 2 * MIB), (3, 4 * MIB)] {
        assert!(
            disk[at as usize..(at + MIB) as usize].iter().all(|b| *b == pat),
            "pattern {pat} at {at} in the origin"
        );
    }
}

#[test]
fn a_stopped_remote_turns_into_timeouts_not_a_hang() {
    if !tools("sigstop_remote", &["nbdkit", "qemu-io"]) {
        return;
    }
    let dir = tempdir();
    let sock = dir.path().join("k.sock");
    let k = Peer::nbdkit(&sock, &["memory", "16M"]);
    let srv = Server::start_opts(
        tempdir(),
        ServerOpts {
            admin: true,
            args: vec![format!("r={}&timeout=1s&outage=3s", k.uri()), "m=mem:16MiB".into()],
            ..Default::default()
        },
    );
    let r = srv.uri("r");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 7 0 64k", &r]));
    signal(k.pid(), libc::SIGSTOP);
    let t = Instant::now();
    let o = output(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 7 0 64k", &r]), CMD_TIMEOUT);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("failed") || !o.status.success(), "a read of a stopped remote must fail: {text}");
    assert!(t.elapsed() < Duration::from_secs(30), "it failed in bounded time");
    // The other volume was served all along.
    run_ok(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 1 0 64k",
        "-c",
        "read -P 1 0 64k",
        &srv.uri("m"),
    ]));
    let st = target(&srv, "r");
    assert!(st["timeouts"].as_u64().unwrap() >= 1, "{st}");
    signal(k.pid(), libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let o = output(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 7 0 64k", &r]), CMD_TIMEOUT);
        if o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("failed") {
            break;
        }
        assert!(Instant::now() < deadline, "the remote came back but reads still fail");
        std::thread::sleep(Duration::from_millis(200));
    }
    srv.stop();
}

/// Makes a CA in `dir` (ca-cert.pem, ca-key.pem) and a certificate `name`-cert.pem /
/// `name`-key.pem signed by it for `localhost`, with the openssl tool.
fn x509(dir: &Path, ca: &str, names: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let ossl = |args: &[&str]| run_ok(Command::new("openssl").args(args).current_dir(dir));
    ossl(
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem", "-out", "ca-cert.pem"]
            .into_iter()
            .chain(["-subj", &format!("/CN={ca}"), "-days", "2"])
            .collect::<Vec<_>>(),
    );
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=DNS:localhost\n").unwrap();
    for n in names {
        let (key, csr, cert) = (format!("{n}-key.pem"), format!("{n}.csr"), format!("{n}-cert.pem"));
        ossl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"]);
        ossl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]);
    }
}

#[test]
fn x509_with_client_certificates_and_an_untrusted_one_refused() {
    if !tools("tls_x509", &["openssl", "qemu-img", "nbdcopy"]) {
        return;
    }
    let keys = tempdir();
    let (good, rogue) = (keys.path().join("pki"), keys.path().join("rogue"));
    x509(&good, "strata test CA", &["server", "client"]);
    x509(&rogue, "someone else", &["client"]);
    // A server of `vol` requiring TLS with the good certificates, and `extra` flags.
    let tls_server = |extra: &[&str]| {
        let mut args: Vec<String> = vec!["--tls".into(), "require".into(), "--tls-certificates".into()];
        args.push(good.display().to_string());
        args.extend(extra.iter().map(|a| a.to_string()));
        args.push("vol=mem:16MiB".into());
        Server::start_opts(tempdir(), ServerOpts { args, ..Default::default() })
    };
    let srv = tls_server(&["--tls-verify-peer"]);
    let sock = srv.sock.clone().unwrap();
    // strata as the client, presenting the CA's client certificate.
    let origin = format!("nbds+unix:///vol?socket={}&tls-certificates={}", sock.display(), good.display());
    let b = Server::start(&[&format!("r={origin}")]);
    let data = random_bytes(SIZE as usize, 4);
    write_via(&b.uri("r"), b.path(), &data, "w");
    b.stop();
    // qemu-img reads it back with tls-creds-x509 (the same directory layout).
    let out = srv.path().join("qemu.img");
    let qemu = |dir: &Path, out: &Path| {
        output(
            Command::new("qemu-img")
                .args(["convert", "-O", "raw", "--object"])
                .arg(format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", dir.display()))
                .arg("--image-opts")
                .arg(format!("driver=nbd,path={},export=vol,tls-creds=tls0,tls-hostname=localhost", sock.display()))
                .arg(out),
            CMD_TIMEOUT,
        )
    };
    let o = qemu(&good, &out);
    assert!(o.status.success(), "qemu-img over X.509: {}", String::from_utf8_lossy(&o.stderr));
    assert_same_bytes(&std::fs::read(&out).unwrap(), &data, "qemu-img over X.509");
    // A client certificate from another CA is refused (qemu trusts the server through the
    // right CA file, but presents the rogue certificate).
    std::fs::copy(good.join("ca-cert.pem"), rogue.join("ca-cert.pem")).unwrap();
    let o = qemu(&rogue, &srv.path().join("rogue.img"));
    assert!(!o.status.success(), "a client with an untrusted certificate got in");
    // strata serving `origin` as a volume: whether it could open it, and what it said.
    let serves = |origin: &str, sock: &str| {
        let mut serve = Command::new(env!("CARGO_BIN_EXE_strata"));
        serve.args(["serve", "--unix"]).arg(keys.path().join(sock)).arg(format!("v={origin}"));
        let o = output(&mut serve, CMD_TIMEOUT);
        (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let rogue_origin = format!("nbds+unix:///vol?socket={}&tls-certificates={}", sock.display(), rogue.display());
    assert!(!serves(&rogue_origin, "x.sock").0, "strata with an untrusted certificate got in");
    // A client with a PSK proves the server by the key alone: a server without the key (one
    // with a certificate only, asking for none) is refused, whatever certificate it shows.
    let certs_only = tls_server(&[]);
    let psk = keys.path().join("keys.psk");
    std::fs::write(&psk, "alice:00112233445566778899aabbccddeeff\n").unwrap();
    let psk_origin = format!(
        "nbds+unix:///vol?socket={}&tls-psk-file={}",
        certs_only.sock.as_ref().unwrap().display(),
        psk.display()
    );
    let (served, said) = serves(&psk_origin, "p.sock");
    assert!(!served, "a PSK client took a server that has no key");
    assert!(said.contains("a certificate rather than the pre-shared key"), "{said}");
    certs_only.stop();
    // The server kept serving.
    let o = qemu(&good, &srv.path().join("again.img"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    srv.stop();
}

/// The status line of `GET /status` sent with `auth` headers.
fn admin_status_line(addr: &str, auth: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /status HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp.lines().next().unwrap_or("").to_string()
}

#[test]
fn the_admin_endpoint_wants_its_bearer_token() {
    let dir = tempdir();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let srv = Server::start_opts(
        dir,
        ServerOpts {
            admin: true,
            args: vec!["--admin-token-file".into(), token.display().to_string(), "vol=mem:1MiB".into()],
            ..Default::default()
        },
    );
    let addr = srv.admin.clone().unwrap();
    assert!(admin_status_line(&addr, "").contains("401"));
    assert!(admin_status_line(&addr, "Authorization: Bearer wrong\r\n").contains("401"));
    assert!(admin_status_line(&addr, "Authorization: Bearer s3cret-token\r\n").contains("200"));
    // The admin commands send $STRATA_ADMIN_TOKEN.
    let status = |token: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_strata"));
        c.args(["status", "--admin", &addr]);
        if let Some(t) = token {
            c.env("STRATA_ADMIN_TOKEN", t);
        }
        output(&mut c, CMD_TIMEOUT)
    };
    assert!(!status(None).status.success());
    let o = status(Some("s3cret-token"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    srv.stop();
}

/// A remote origin that does not answer when `strata serve` starts is an error at once, as
/// for qemu and nbd-client, naming the origin and saying why.
#[test]
fn an_origin_unreachable_at_start_fails_serve_clearly() {
    let dir = tempdir();
    let missing = dir.path().join("no-server.sock");
    let sock = dir.path().join("s.sock");
    for vol in [
        format!("r=nbd+unix:///vol?socket={}", missing.display()),
        format!("r=nbd+unix:///a%20b?socket={}", missing.display()),
    ] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_strata"));
        c.args(["serve", "--unix", &sock.display().to_string(), &vol]);
        let o = output(&mut c, CMD_TIMEOUT);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{vol}: served without its origin");
        assert!(err.contains("cannot reach the server") && err.contains("no-server.sock"), "{vol}: {err}");
    }
}

/// A remote origin gone at shutdown with writes not yet flushed to it: its volume waits the
/// outage out to deliver them, while every other volume is shut down cleanly meanwhile, and a
/// second SIGTERM ends the wait, naming the volume not shut down.
#[test]
fn a_second_signal_ends_a_shutdown_waiting_for_an_absent_remote() {
    let origin = Server::start(&["m=mem:4MiB"]);
    let dir = tempdir();
    let cache = dir.path().join("c.img");
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["cache", "create", "--origin"])
        .arg(format!("{}?size=4MiB", dir.path().join("o.img").display()))
        .arg("--cache")
        .arg(format!("{}?size=2MiB", cache.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let remote = format!("r=nbd+unix:///m?socket={}&outage=600s", origin.sock.as_ref().unwrap().display());
    let mut srv = Server::start_opts(
        tempdir(),
        ServerOpts { args: vec![remote, format!("c=cache:{}", cache.display())], ..Default::default() },
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        for name in ["r", "c"] {
            let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), name).await.unwrap();
            c.write(0, &[7; 65536], false).await.unwrap(); // not flushed
            c.disconnect().await.unwrap();
        }
    });
    origin.stop();
    signal(srv.pid(), libc::SIGTERM);
    let clean = || {
        // The newer of the superblock's two copies (read beside the server's claim).
        let b = std::fs::read(&cache).unwrap();
        let copies = b.chunks(strata_cache::format::PAGE).take(strata_cache::format::SB_COPIES);
        let newest = copies.filter_map(|p| strata_cache::format::Superblock::decode(p).ok()).max_by_key(|sb| sb.seq);
        newest.is_some_and(|sb| sb.clean_shutdown)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !clean() {
        assert!(Instant::now() < deadline, "the cache was not shut down: {}", srv.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (st, err) = srv.terminate();
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("stopped by a second signal before these volumes were shut down: r\n"), "{err}");
    assert!(!srv.sock.as_ref().unwrap().exists(), "the socket was left behind");
}
