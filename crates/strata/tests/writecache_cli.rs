//! `strata writecache` end to end: create a log over a plain file and over a cache, serve it,
//! write and read through NBD, read its status, write everything back and detach, stop (the
//! cache below closed cleanly), and check and dump it offline; bad input is refused and
//! overwrites nothing.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn create_log(dir: &Path, origin: &str) -> Output {
    let log = format!("{}?size=8MiB", dir.join("log.img").display());
    strata(&["writecache", "create", "--origin", origin, "--cache", &log])
}

/// Writes a pattern through the server, reads it back, and detaches; returns the pattern.
fn exercise(srv: &common::Server) -> Vec<u8> {
    let data = common::random_bytes(256 << 10, 7);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
        c.write(1 << 20, &data, false).await.unwrap();
        c.write(1 << 20, &data[..1000], true).await.unwrap(); // a partial block, FUA
        c.flush().await.unwrap();
        common::assert_same_bytes(&c.read(1 << 20, data.len() as u32).await.unwrap(), &data, "read back");
        c.disconnect().await.unwrap();
    });
    let status = srv.status();
    let target = &status["volumes"][0]["target"];
    assert_eq!(target["target"], "writecache", "{status}");
    assert!(target["write_misses"].as_u64().unwrap() > 0, "{status}");
    assert!(target["read_hits"].as_u64().unwrap() > 0, "{status}");
    let metrics = srv.admin_get("/metrics");
    assert!(metrics.contains("strata_writecache_dirty_blocks{volume=\"vol\"}"), "{metrics}");
    let admin = srv.admin.clone().unwrap();
    let o = strata(&["writecache", "detach", "--admin", &admin, "vol"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(srv.status()["volumes"][0]["target"]["dirty_blocks"], 0);
    data
}

fn serve(dir: tempfile::TempDir, spec: &str) -> common::Server {
    common::Server::start_opts(
        dir,
        common::ServerOpts { admin: true, args: vec![format!("vol={spec}")], ..Default::default() },
    )
}

/// A damaged entry (a flipped bit: no crash tears an entry, which never crosses a sector)
/// is not guessed around: `check` fails and names it, the log does not open, and
/// `check --repair` clears it, after which the log opens.
#[test]
fn a_damaged_entry_is_refused_until_repaired() {
    let d = common::tempdir();
    let origin = d.path().join("origin.img");
    let o = create_log(d.path(), &format!("{}?size=32MiB", origin.display()));
    assert!(o.status.success(), "{}", stderr(&o));
    let log = d.path().join("log.img");
    let srv = serve(tempfile::tempdir_in(d.path()).unwrap(), &format!("writecache:{}", log.display()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
        c.write(1 << 20, &[7; 3 * 4096], false).await.unwrap();
        c.flush().await.unwrap();
    });
    srv.stop();
    let path = log.to_str().unwrap();
    let entries = std::fs::read(&log).unwrap()[4096..4096 + 3 * 32].to_vec();
    assert!(entries.iter().any(|&b| b != 0), "the log holds entries");
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&log).unwrap();
    let slot = entries.chunks(32).position(|e| e.iter().any(|&b| b != 0)).unwrap() as u64;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(4096 + slot * 32 + 9)).unwrap();
    std::io::Write::write_all(&mut f, &[entries[slot as usize * 32 + 9] ^ 0x10]).unwrap();
    drop(f);

    let c = strata(&["writecache", "check", path]);
    assert!(!c.status.success(), "{}", stdout(&c));
    assert!(stdout(&c).contains(&format!("damaged: slot {slot}: entry checksum mismatch")), "{}", stdout(&c));
    assert!(stderr(&c).contains("1 damaged entries"), "{}", stderr(&c));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(["serve", "--unix", d.path().join("s.sock").to_str().unwrap(), &format!("vol=writecache:{path}")]);
    let out = common::output(&mut cmd, common::START_TIMEOUT);
    assert!(!out.status.success() && stderr(&out).contains("check --repair"), "{}", stderr(&out));

    let r = strata(&["writecache", "check", "--repair", path]);
    assert!(r.status.success() && stdout(&r).contains("cleared 1 damaged entries"), "{}{}", stdout(&r), stderr(&r));
    let c = strata(&["writecache", "check", path]);
    assert!(c.status.success() && !stdout(&c).contains("damaged"), "{}", stdout(&c));
    serve(tempfile::tempdir_in(d.path()).unwrap(), &format!("writecache:{path}")).stop();
}

#[test]
fn over_a_plain_file_create_serve_detach_check_dump() {
    let d = common::tempdir();
    let origin = d.path().join("origin.img");
    let o = create_log(d.path(), &format!("{}?size=32MiB", origin.display()));
    assert!(o.status.success(), "{}", stderr(&o));
    let log = d.path().join("log.img");
    let mut srv = serve(d, "writecache:{dir}/log.img");
    let data = exercise(&srv);
    let (st, err) = srv.terminate();
    assert!(st.success(), "{err}");
    let on_origin = std::fs::read(&origin).unwrap();
    common::assert_same_bytes(&on_origin[1 << 20..(1 << 20) + data.len()], &data, "the origin after detach");
    let c = strata(&["writecache", "check", log.to_str().unwrap()]);
    assert!(c.status.success() && stdout(&c).contains("entries ok"), "{}{}", stdout(&c), stderr(&c));
    let dump = strata(&["writecache", "dump", log.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&dump.stdout).unwrap();
    assert_eq!(v["block_bytes"], 4096);
    assert_eq!(v["origin_bytes"], 32 << 20);
    assert!(!v["origin_spec"].as_str().unwrap().contains("size="), "size= is not recorded");

    // Detached, the log holds nothing: the origin written without it and the log served
    // again, its old copies are neither read nor written back.
    assert!(stdout(&c).contains("entries ok: 0 blocks logged"), "{}", stdout(&c));
    let newer = vec![0x33u8; data.len()];
    let mut f = std::fs::OpenOptions::new().write(true).open(&origin).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(1 << 20)).unwrap();
    std::io::Write::write_all(&mut f, &newer).unwrap();
    drop(f);
    let d = tempfile::tempdir_in(log.parent().unwrap()).unwrap();
    let srv = serve(d, &format!("writecache:{}", log.display()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
        common::assert_same_bytes(&c.read(1 << 20, newer.len() as u32).await.unwrap(), &newer, "served again");
        c.flush().await.unwrap();
    });
    srv.stop();
    let on_origin = std::fs::read(&origin).unwrap();
    common::assert_same_bytes(&on_origin[1 << 20..(1 << 20) + newer.len()], &newer, "the origin served again");
}

#[test]
fn over_a_cache_create_serve_detach() {
    let d = common::tempdir();
    let origin = format!("{}?size=32MiB", d.path().join("origin.img").display());
    let cache = format!("{}?size=8MiB", d.path().join("cache.img").display());
    let o = strata(&["cache", "create", "--origin", &origin, "--cache", &cache]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = create_log(d.path(), &format!("cache:{}", d.path().join("cache.img").display()));
    assert!(o.status.success(), "{}", stderr(&o));
    let check = strata(&["cache", "check", d.path().join("cache.img").to_str().unwrap()]);
    assert!(stdout(&check).contains("clean shutdown") && !stdout(&check).contains("not shut down"), "{check:?}");
    let mut srv = serve(d, "writecache:{dir}/log.img");
    exercise(&srv);
    // The server's stop closes the stack whole: the cache below the log cleanly too.
    srv.stop_checked();
    let check = strata(&["cache", "check", srv.dir.path().join("cache.img").to_str().unwrap()]);
    assert!(stdout(&check).contains("clean shutdown") && !stdout(&check).contains("not shut down"), "{check:?}");
}

#[test]
fn bad_input_is_refused_and_overwrites_nothing() {
    let d = common::tempdir();
    let origin = d.path().join("origin.img");
    assert!(create_log(d.path(), &format!("{}?size=32MiB", origin.display())).status.success());
    let log = d.path().join("log.img");
    let before = std::fs::read(&log).unwrap();
    // A device that holds data (here: a log).
    let o = create_log(d.path(), origin.to_str().unwrap());
    assert!(!o.status.success() && stderr(&o).contains("holds a strata write log"), "{}", stderr(&o));
    assert!(std::fs::read(&log).unwrap() == before, "nothing overwritten");
    // A bad block size.
    let other = format!("{}?size=8MiB", d.path().join("other.img").display());
    let o = strata(&[
        "writecache",
        "create",
        "--origin",
        origin.to_str().unwrap(),
        "--cache",
        &other,
        "--block-size",
        "3000",
    ]);
    assert!(!o.status.success() && stderr(&o).contains("power of two"), "{}", stderr(&o));
    // A foreign device.
    let foreign = d.path().join("foreign.img");
    std::fs::write(&foreign, vec![0x11u8; 1 << 20]).unwrap();
    let o = strata(&["writecache", "check", foreign.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("no writecache superblock"), "{}", stderr(&o));
    // A corrupt superblock.
    let mut bad = before.clone();
    bad[20] ^= 1;
    std::fs::write(&log, &bad).unwrap();
    let o = strata(&["writecache", "check", log.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("checksum"), "{}", stderr(&o));
    std::fs::write(&log, &before).unwrap();
    // The origin's size changed.
    std::fs::OpenOptions::new().write(true).open(&origin).unwrap().set_len(64 << 20).unwrap();
    let sock = d.path().join("s2.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(["serve", "--unix", sock.to_str().unwrap(), &format!("vol=writecache:{}", log.display())]);
    let out = common::output(&mut cmd, common::START_TIMEOUT);
    assert!(!out.status.success() && stderr(&out).contains("wrong origin"), "{}", stderr(&out));
    assert!(std::fs::read(&log).unwrap() == before, "nothing overwritten");
}
