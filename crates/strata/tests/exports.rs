//! Exports added and removed while serving (`strata export add|remove`): a new export is
//! served at once with its data, bad requests are refused and leave the server serving,
//! removing an export with clients is refused unless forced, a forced removal closes its
//! connections after their requests and flushes the device, and its file can be opened again.

mod common;

use common::{Server, ServerOpts};
use std::process::{Command, Output};
use strata_nbd::client::Client;

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "strata failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn refused(o: Output) -> String {
    assert!(!o.status.success(), "strata should have refused: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn names(srv: &Server) -> Vec<String> {
    let st = srv.status();
    st["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_string()).collect()
}

/// A cache of 2 MiB made in `dir` over a 4 MiB origin: (origin, cache).
fn new_cache(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (origin, cache) = (dir.join("o.img"), dir.join("c.img"));
    ok(strata(&[
        "cache",
        "create",
        "--origin",
        &format!("{}?size=4MiB", origin.display()),
        "--cache",
        &format!("{}?size=2MiB", cache.display()),
    ]));
    (origin, cache)
}

#[test]
fn exports_are_added_and_removed_while_serving() {
    let srv = Server::start_opts(
        common::tempdir(),
        ServerOpts { admin: true, args: vec!["a=mem:4MiB".into()], ..Default::default() },
    );
    let admin = srv.admin.clone().unwrap();
    let sock = srv.sock.clone().unwrap();
    let img = srv.dir.path().join("b.img");
    let b = format!("b={}?size=4MiB", img.display());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let data = common::random_bytes(64 << 10, 11);

    assert!(ok(strata(&["export", "add", "--admin", &admin, &b])).contains("added"));
    assert_eq!(names(&srv), ["a", "b"]);

    // Refused, naming why; the server goes on serving both.
    assert!(refused(strata(&["export", "add", "--admin", &admin, &b])).contains("already served"));
    assert!(refused(strata(&["export", "add", "--admin", &admin, "c=foo:bar"])).contains("unknown device kind"));
    let claimed = format!("c={}", img.display());
    assert!(refused(strata(&["export", "add", "--admin", &admin, &claimed])).contains("cannot claim"));
    assert!(refused(strata(&["export", "remove", "--admin", &admin, "nope"])).contains("no export named"));
    assert_eq!(names(&srv), ["a", "b"]);

    rt.block_on(async {
        let mut c = Client::connect_unix(&sock, "b").await.unwrap();
        c.write(1 << 20, &data, false).await.unwrap();
        // With a client connected, removal needs force.
        let why = refused(strata(&["export", "remove", "--admin", &admin, "b"]));
        assert!(why.contains("1 connection"), "{why}");
        c.write(2 << 20, &data, false).await.unwrap();
        assert_eq!(c.read(1 << 20, data.len() as u32).await.unwrap(), data);
        ok(strata(&["export", "remove", "--admin", &admin, "--force", "b"]));
        // The connection is closed: the next request fails rather than reaching a closed device.
        assert!(c.read(0, 4096).await.is_err());
        // New connections no longer see it; the other export is untouched.
        assert!(Client::connect_unix(&sock, "b").await.is_err());
        let mut other = Client::connect_unix(&sock, "a").await.unwrap();
        other.write(0, &data, true).await.unwrap();
        assert_eq!(other.read(0, data.len() as u32).await.unwrap(), data);
    });
    assert_eq!(names(&srv), ["a"]);

    // The device was flushed and its claim released: the file holds the unflushed writes and
    // can be served again.
    let on_disk = std::fs::read(&img).unwrap();
    assert_eq!(&on_disk[1 << 20..(1 << 20) + data.len()], &data[..]);
    assert_eq!(&on_disk[2 << 20..(2 << 20) + data.len()], &data[..]);
    ok(strata(&["export", "add", "--admin", &admin, "--read-only", &b]));
    rt.block_on(async {
        let mut c = Client::connect_unix(&sock, "b").await.unwrap();
        assert_eq!(c.read(2 << 20, data.len() as u32).await.unwrap(), data);
        assert!(c.write(0, &data, false).await.is_err(), "a read-only export refuses writes");
    });
}

#[test]
fn a_volume_that_fails_to_open_at_start_leaves_the_others_closed_cleanly() {
    // The second volume claims the cache's origin: the server refuses to start, and the cache,
    // already opened, is closed with a clean shutdown (no recovery at the next open).
    let dir = common::tempdir();
    let (origin, cache) = new_cache(dir.path());
    let why = refused(strata(&[
        "serve",
        "--unix",
        dir.path().join("s.sock").to_str().unwrap(),
        &format!("a=cache:{}", cache.display()),
        &format!("b={}", origin.display()),
    ]));
    assert!(why.contains("volume b") && why.contains("cannot claim"), "{why}");
    let check = ok(strata(&["cache", "check", cache.to_str().unwrap()]));
    assert!(check.contains("clean shutdown") && !check.contains("not shut down cleanly"), "{check}");
    // The same when a listener cannot bind after the volumes opened (the admin port taken);
    // the socket bound before it is removed.
    // Closing them does not wait on the list of volumes being closed (it waited 10 s for
    // each, the list holding every one).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sock = dir.path().join("s.sock");
    let started = std::time::Instant::now();
    let why = refused(strata(&[
        "serve",
        "--unix",
        sock.to_str().unwrap(),
        "--admin",
        &taken.local_addr().unwrap().to_string(),
        &format!("a=cache:{}", cache.display()),
        "b=mem:1MiB",
        &format!("c={}?size=1MiB", dir.path().join("new.img").display()),
    ]));
    assert!(why.contains("binding admin"), "{why}");
    assert!(!dir.path().join("new.img").exists(), "the file made for size= was left behind");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "closing 3 volumes took {:?}", started.elapsed());
    let check = ok(strata(&["cache", "check", cache.to_str().unwrap()]));
    assert!(check.contains("clean shutdown") && !check.contains("not shut down cleanly"), "{check}");
    assert!(!sock.exists(), "the socket was left behind");
}

#[test]
fn a_file_at_the_socket_path_is_left_alone() {
    let dir = common::tempdir();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"the user's").unwrap();
    // A server that starts instead of refusing is killed after the deadline: a failure, not a hang.
    let mut serve = Command::new(env!("CARGO_BIN_EXE_strata"));
    serve.args(["serve", "--unix", path.to_str().unwrap(), "a=mem:1MiB"]);
    let why = refused(common::output(&mut serve, std::time::Duration::from_secs(30)));
    assert!(why.contains("is not a socket"), "{why}");
    assert_eq!(std::fs::read(&path).unwrap(), b"the user's");
}

/// A server that stops removes its socket only if it is still the one it bound: a server
/// started since on the same path (the first one's socket gone) keeps its own.
#[test]
fn a_stopping_server_leaves_a_later_servers_socket_alone() {
    let first = Server::start(&["a=mem:1MiB"]);
    let sock = first.sock.clone().unwrap();
    std::fs::remove_file(&sock).unwrap();
    let second = Server::start_opts(
        common::tempdir(),
        ServerOpts {
            unix: false,
            args: vec!["--unix".into(), sock.display().to_string(), "b=mem:1MiB".into()],
            wait_for: Some(common::Listen::Unix(sock.clone())),
            ..Default::default()
        },
    );
    let mut first = first;
    let (status, err) = first.terminate();
    assert!(status.success(), "{err}");
    assert!(sock.exists(), "the first server removed the second's socket");
    let out = common::output(
        Command::new("nbdinfo").arg("--list").arg(format!("nbd+unix:///?socket={}", sock.display())),
        std::time::Duration::from_secs(30),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("export=\"b\""), "{out:?}");
    drop(second);
}

/// Names that clients and the admin endpoint can carry: one with a space and a `%` is added, counted in
/// `/metrics` and removed by name; a quote is escaped in `/metrics`; a control character or a
/// name over 4096 bytes is refused before anything is opened. A `?ro` spec is exported
/// read-only. Removing the default export makes the next one served the default.
#[test]
fn export_names_defaults_and_read_only_specs() {
    let srv = Server::start_opts(
        common::tempdir(),
        ServerOpts { admin: true, args: vec!["a=mem:1MiB".into(), "b=mem:2MiB".into()], ..Default::default() },
    );
    let admin = srv.admin.clone().unwrap();
    let sock = srv.sock.clone().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    ok(strata(&["export", "add", "--admin", &admin, "sp ace%=mem:1MiB"]));
    ok(strata(&["export", "add", "--admin", &admin, "q\"uote=mem:1MiB"]));
    let metrics = srv.admin_get("/metrics");
    assert!(metrics.contains("strata_volume_size_bytes{volume=\"q\\\"uote\"}"), "{metrics}");
    assert!(metrics.contains("strata_requests_total{volume=\"sp ace%\",op=\"read\"}"), "{metrics}");
    ok(strata(&["export", "remove", "--admin", &admin, "sp ace%"]));
    ok(strata(&["export", "remove", "--admin", &admin, "q\"uote"]));
    assert_eq!(names(&srv), ["a", "b"]);

    let why = refused(strata(&["export", "add", "--admin", &admin, "new\nline=mem:1MiB"]));
    assert!(why.contains("control character"), "{why}");
    let img = srv.dir.path().join("long.img");
    let long = format!("{}={}?size=1MiB", "€".repeat(1500), img.display());
    let why = refused(strata(&["export", "add", "--admin", &admin, &long]));
    assert!(why.contains("longer than 4096 bytes"), "{why}");
    assert!(!img.exists(), "a refused name created its file");

    // A path that names no volume: refused, and the endpoint goes on answering.
    let mut s = std::net::TcpStream::connect(&admin).unwrap();
    use std::io::{Read, Write};
    write!(s, "POST /volumes/message HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert_eq!(names(&srv), ["a", "b"]);

    let ro = srv.dir.path().join("ro.img");
    std::fs::write(&ro, vec![7u8; 1 << 20]).unwrap();
    ok(strata(&["export", "add", "--admin", &admin, &format!("c={}?ro", ro.display())]));
    ok(strata(&["export", "remove", "--admin", &admin, "a"]));
    rt.block_on(async {
        let c = Client::connect_unix(&sock, "c").await.unwrap();
        assert_ne!(c.flags() & (1 << 1), 0, "the READ_ONLY flag of a ?ro spec: {:#x}", c.flags());
        let default = Client::connect_unix(&sock, "").await.unwrap();
        assert_eq!(default.size(), 2 << 20, "b, served longest, is the default now");
    });
    assert_eq!(srv.status()["volumes"][1]["read_only"], true);
}

/// A read-only export takes no writes from clients, but a cache behind it still writes its
/// own device (promotions, metadata): removing the export, and stopping a server that
/// serves every volume read-only, shut it down cleanly (no recovery at the next open).
#[test]
fn a_read_only_export_of_a_cache_is_shut_down_cleanly() {
    let dir = common::tempdir();
    let (_, cache) = new_cache(dir.path());
    let clean = || {
        let check = ok(strata(&["cache", "check", cache.to_str().unwrap()]));
        assert!(check.contains("clean shutdown") && !check.contains("not shut down cleanly"), "{check}");
    };
    let spec = format!("c=cache:{}", cache.display());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let read = |sock: &std::path::Path| {
        rt.block_on(async {
            let mut c = Client::connect_unix(sock, "c").await.unwrap();
            assert_ne!(c.flags() & (1 << 1), 0, "exported read-only: {:#x}", c.flags());
            c.read(0, 1 << 20).await.unwrap();
            c.disconnect().await.unwrap();
        })
    };

    let srv = Server::start_opts(
        common::tempdir(),
        ServerOpts { admin: true, args: vec!["keep=mem:1MiB".into()], ..Default::default() },
    );
    let admin = srv.admin.clone().unwrap();
    ok(strata(&["export", "add", "--admin", &admin, "--read-only", &spec]));
    read(srv.sock.as_ref().unwrap());
    ok(strata(&["export", "remove", "--admin", &admin, "c"]));
    clean();
    srv.stop();

    let srv = Server::start_opts(
        common::tempdir(),
        ServerOpts { args: vec!["--read-only".into(), spec.clone()], ..Default::default() },
    );
    read(srv.sock.as_ref().unwrap());
    srv.stop();
    clean();
}

/// A config file's volume names follow the command line's rules: an empty name (which
/// would hide behind the default export) or one with '/' is refused.
#[test]
fn config_volume_names_follow_the_command_lines_rules() {
    let dir = common::tempdir();
    for name in ["", "a/b"] {
        let cfg = dir.path().join("strata.toml");
        std::fs::write(
            &cfg,
            format!(
                "[[volume]]\nname = \"x\"\nspec = \"mem:1MiB\"\n[[volume]]\nname = \"{name}\"\nspec = \"mem:2MiB\"\n"
            ),
        )
        .unwrap();
        let mut serve = Command::new(env!("CARGO_BIN_EXE_strata"));
        serve.args(["serve", "--unix", dir.path().join("s.sock").to_str().unwrap(), "--config", cfg.to_str().unwrap()]);
        let why = refused(common::output(&mut serve, std::time::Duration::from_secs(30)));
        assert!(why.contains("a name is not empty"), "{name:?}: {why}");
    }
}

/// A removal is answered once the export is gone for good: its file released (the same spec
/// can be added again at once, even when clients were reading as it was forced away), and a
/// client that has just disconnected no longer counts as one.
#[test]
fn a_removed_export_can_be_added_again_at_once() {
    let srv = Server::start_opts(
        common::tempdir(),
        ServerOpts { admin: true, args: vec!["keep=mem:1MiB".into()], ..Default::default() },
    );
    let (admin, sock) = (srv.admin.clone().unwrap(), srv.sock.clone().unwrap());
    let spec = format!("x={}?size=4MiB", srv.dir.path().join("x.img").display());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        strata::http::add_export(&admin, &spec, false).await.unwrap();
        for round in 0..40 {
            // Clients reading while the export is forced away: three connected before, which
            // the removal must cut off, and one connecting as it goes, which may reach the
            // export added again (so it reads a bounded number of times).
            let mut readers = Vec::new();
            for _ in 0..3 {
                let mut c = Client::connect_unix(&sock, "x").await.unwrap();
                readers.push(tokio::spawn(async move { while c.read(0, 65536).await.is_ok() {} }));
            }
            let racing = sock.clone();
            readers.push(tokio::spawn(async move {
                let Ok(mut c) = Client::connect_unix(&racing, "x").await else { return };
                for _ in 0..1_000 {
                    if c.read(0, 65536).await.is_err() {
                        return;
                    }
                }
            }));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            strata::http::remove_export(&admin, "x", true).await.unwrap();
            strata::http::add_export(&admin, &spec, false)
                .await
                .unwrap_or_else(|e| panic!("round {round}: added again after a forced removal: {e:#}"));
            for r in readers {
                r.await.unwrap();
            }
            // A client that disconnected is gone by the time it knows.
            let mut c = Client::connect_unix(&sock, "x").await.unwrap();
            c.read(0, 4096).await.unwrap();
            c.disconnect().await.unwrap();
            strata::http::remove_export(&admin, "x", false)
                .await
                .unwrap_or_else(|e| panic!("round {round}: removed after its client disconnected: {e:#}"));
            strata::http::add_export(&admin, &spec, false).await.unwrap();
        }
    });
    srv.stop();
}

/// What the admin endpoint answers to `request`, sent whole and followed by the end of
/// the client's side.
fn admin_answer(admin: &str, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(admin).unwrap();
    s.write_all(request).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp
}

/// A request the endpoint will not read is answered with why, at once; none of them
/// changes anything, and the endpoint goes on answering.
#[test]
fn requests_past_the_admin_endpoints_bounds_are_answered_with_why() {
    let srv = Server::start_opts(
        common::tempdir(),
        ServerOpts { admin: true, args: vec!["a=mem:1MiB".into()], ..Default::default() },
    );
    let admin = srv.admin.clone().unwrap();
    let post = |length: &str, body: &str| {
        admin_answer(&admin, format!("POST /exports HTTP/1.1\r\nContent-Length: {length}\r\n\r\n{body}").as_bytes())
    };
    let resp = post(&u64::MAX.to_string(), "");
    assert!(resp.starts_with("HTTP/1.1 413") && resp.contains("at most 65536"), "{resp}");
    let resp = post("65537", "b=mem:1MiB");
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    let resp = post("ten", "b=mem:1MiB");
    assert!(resp.starts_with("HTTP/1.1 400") && resp.contains("not a number"), "{resp}");
    // Cut short, "b=mem:1MiB" would have been "b=mem:1".
    let resp = post("10", "b=mem:1");
    assert!(resp.starts_with("HTTP/1.1 400") && resp.contains("after 7 of its 10 bytes"), "{resp}");
    // A head one byte past the bound, with no end: all of it is read, then refused.
    let mut head = b"GET /status HTTP/1.1\r\nX: ".to_vec();
    head.resize((16 << 10) + 1, b'x');
    let resp = admin_answer(&admin, &head);
    assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");

    assert_eq!(names(&srv), ["a"]);
    assert!(post("10", "b=mem:1MiB").starts_with("HTTP/1.1 200"));
    assert_eq!(names(&srv), ["a", "b"]);
}

/// The soft limit on open files the server runs under, and the hard one.
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let mut fields = line.split_whitespace().skip(3);
    (fields.next().unwrap().to_string(), fields.next().unwrap().to_string())
}

/// A client that opens admin connections without end gets a 503 past the endpoint's bound,
/// and the NBD side, which needs a file per connection, is served all the while. The server
/// runs with its soft limit on open files lowered to 256 (as systemd's 1,024, smaller), which
/// it raises to the hard one: the flood alone would take more than 256 files.
#[test]
fn a_flood_of_admin_connections_is_turned_away_and_the_nbd_side_stays_served() {
    let srv = Server::start_opts(
        common::tempdir(),
        ServerOpts { admin: true, args: vec!["a=mem:1MiB".into()], open_files: Some(256), ..Default::default() },
    );
    let (soft, hard) = open_files_limits(srv.pid());
    assert_eq!(soft, hard, "the soft limit on open files is raised to the hard one");

    let admin = srv.admin.clone().unwrap();
    const FLOOD: usize = 300;
    let held: Vec<std::net::TcpStream> = (0..FLOOD).map(|_| std::net::TcpStream::connect(&admin).unwrap()).collect();
    // Each connection read to its end, on its own thread: the endpoint's own answer, or
    // nothing once it gives up waiting for a request.
    let readers: Vec<_> = held
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                use std::io::Read;
                s.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                answer
            })
        })
        .collect();

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::connect_unix(srv.sock.as_ref().unwrap(), "a").await.unwrap();
        c.write(4096, &[7; 4096], true).await.unwrap();
        assert_eq!(c.read(4096, 4096).await.unwrap(), vec![7; 4096]);
        c.disconnect().await.unwrap();
    });

    let answers: Vec<String> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let turned_away = answers.iter().filter(|a| a.starts_with("HTTP/1.1 503")).count();
    let bound = strata::http::MAX_ADMIN_CONNECTIONS;
    assert!(turned_away >= FLOOD - bound, "{turned_away} of {FLOOD} turned away, at most {bound} served");
    for a in &answers {
        assert!(a.is_empty() || a.contains(&format!("more than {bound} admin connections")), "{a}");
    }
    // Once they are gone, the endpoint answers again.
    assert_eq!(names(&srv), ["a"]);
}
