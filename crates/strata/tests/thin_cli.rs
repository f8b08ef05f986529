//! `strata thin` end to end: a pool made by strata, volumes and a snapshot served by
//! `strata serve` and written and read by real NBD clients (qemu-io, nbdinfo), checked by
//! thin_check and dumped by thin_dump as strata dumps it; a pool made by thin_restore served
//! with the right data; bad input refused with nothing written. Live, through the admin
//! endpoint: a snapshot of a volume under a writing client holds exactly a prefix of its
//! writes, is served with `strata export add` and read through NBD; a served volume is not
//! deleted until its export is removed; the offline commands refuse the held pool.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use strata_nbd::client::Client;

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap()
}

fn strata_ok(args: &[&str]) -> String {
    let o = strata(args);
    assert!(o.status.success(), "strata {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn strata_err(args: &[&str]) -> String {
    let o = strata(args);
    assert!(!o.status.success(), "strata {args:?} should fail: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether the tools are here (under CI=true they must be: scripts/setup.sh installs them).
fn tools(names: &[&str]) -> bool {
    let missing: Vec<&&str> = names.iter().filter(|n| !have(n)).collect();
    if missing.is_empty() {
        return true;
    }
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{missing:?} missing under CI=true (see scripts/setup.sh)");
    eprintln!("SKIP: {missing:?} not installed");
    false
}

fn qemu_io_ok(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for x in cmds {
        c.arg("-c").arg(x);
    }
    let o = output(c.arg(uri), CMD_TIMEOUT);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && !text.contains("failed"), "qemu-io {cmds:?}: {text}");
    text
}

fn serve(volumes: &[String]) -> Server {
    Server::start_opts(tempdir(), ServerOpts { admin: true, args: volumes.to_vec(), ..Default::default() })
}

fn thin_check_ok(meta: &Path) {
    let o = cmd("thin_check").arg(meta).output().unwrap();
    assert!(
        o.status.success(),
        "thin_check: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_strata_pool_served_snapshotted_and_checked_by_the_real_tools() {
    if !tools(&["qemu-io", "nbdinfo", "thin_check", "thin_dump"]) {
        return;
    }
    let d = tempdir();
    let meta = d.path().join("pool.meta");
    let m = meta.to_str().unwrap();
    let md = format!("{m}?size=8MiB");
    let data = format!("{}?size=64MiB", d.path().join("pool.data").display());
    strata_ok(&["thin", "pool", "create", "--metadata", &md, "--data", &data]);
    strata_ok(&["thin", "create", m, "1", "--size", "16MiB"]);
    // Served: first writes provision, unwritten ranges are holes.
    let srv = serve(&[format!("vol=thin:{m}?id=1")]);
    let uri = srv.uri("vol");
    qemu_io_ok(&uri, &["write -P 0x11 0 256k", "write -P 0x22 4M 4k", "flush"]);
    let map = run_ok(Command::new("nbdinfo").args(["--map", &uri]));
    assert!(map.contains("hole"), "nbdinfo --map shows no hole: {map}");
    let status = srv.status();
    let t = &status["volumes"][0]["target"];
    assert_eq!(t["target"], "thin", "{status}");
    assert_eq!(t["mapped_blocks"], 5, "{status}");
    assert_eq!(t["pool"]["mode"], "ok", "{status}");
    assert!(srv.admin_get("/metrics").contains("strata_thin_pool_data_used_bytes{volume=\"vol\"}"));
    drop(srv);
    thin_check_ok(&meta);
    // A snapshot, then both served from one pool: writes to the origin leave it unchanged.
    strata_ok(&["thin", "snapshot", m, "1", "2"]);
    let srv = serve(&[format!("vol=thin:{m}?id=1"), format!("snap=thin:{m}?id=2")]);
    qemu_io_ok(&srv.uri("vol"), &["write -P 0x33 64k 8k", "write -P 0x44 8M 4k", "flush"]);
    qemu_io_ok(&srv.uri("snap"), &["read -P 0x11 0 256k", "read -P 0x22 4M 4k", "read -P 0 8M 4k"]);
    qemu_io_ok(&srv.uri("vol"), &["read -P 0x11 0 64k", "read -P 0x33 64k 8k", "read -P 0x11 72k 184k"]);
    // TRIM frees the snapshot's own blocks only.
    qemu_io_ok(&srv.uri("snap"), &["write -P 0x55 12M 64k", "discard 12M 64k", "flush"]);
    drop(srv);
    thin_check_ok(&meta);
    let ours = strata_ok(&["thin", "dump", m]);
    let theirs = cmd("thin_dump").arg(&meta).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&theirs.stdout), ours);
    let list = strata_ok(&["thin", "list", m]);
    assert!(list.contains("16 MiB"), "{list}");
    assert!(strata_ok(&["thin", "check", m]).contains("ok: 2 volumes"));
    strata_ok(&["thin", "delete", m, "2"]);
    thin_check_ok(&meta);
}

#[test]
fn a_pool_made_by_thin_restore_is_served_with_the_right_data() {
    if !tools(&["qemu-io", "thin_restore", "thin_check"]) {
        return;
    }
    let d = tempdir();
    let (meta, data) = (d.path().join("pool.meta"), d.path().join("pool.data"));
    let xml = d.path().join("pool.xml");
    std::fs::write(
        &xml,
        r#"<superblock uuid="" time="1" transaction="2" flags="0" version="2" data_block_size="128" nr_data_blocks="64">
  <device dev_id="1" mapped_blocks="3" transaction="0" creation_time="0" snap_time="1">
    <range_mapping origin_begin="0" data_begin="10" length="2" time="0"/>
    <single_mapping origin_block="5" data_block="20" time="0"/>
  </device>
  <device dev_id="2" mapped_blocks="2" transaction="1" creation_time="1" snap_time="1">
    <single_mapping origin_block="0" data_block="10" time="0"/>
    <single_mapping origin_block="1" data_block="30" time="1"/>
  </device>
</superblock>
"#,
    )
    .unwrap();
    std::fs::write(&meta, vec![0u8; 4 << 20]).unwrap();
    run_ok(cmd("thin_restore").arg("-i").arg(&xml).arg("-o").arg(&meta));
    // The data device: block N filled with byte N.
    let mut bytes = vec![0u8; 64 << 16];
    for (n, chunk) in bytes.chunks_mut(64 << 10).enumerate() {
        chunk.fill(n as u8);
    }
    std::fs::write(&data, bytes).unwrap();
    let (m, dd) = (meta.display(), data.display());
    // No sizes recorded by other tools: size= is needed, and asked for.
    let srv =
        serve(&[format!("one=thin:{m}?data={dd}&id=1&size=1MiB"), format!("two=thin:{m}?id=2&size=1MiB&data={dd}")]);
    qemu_io_ok(
        &srv.uri("one"),
        &["read -P 10 0 64k", "read -P 11 64k 64k", "read -P 20 320k 64k", "read -P 0 128k 64k"],
    );
    qemu_io_ok(&srv.uri("two"), &["read -P 10 0 64k", "read -P 30 64k 64k"]);
    // Writing to the block the two share copies it: the other keeps the old data.
    qemu_io_ok(&srv.uri("two"), &["write -P 0x77 4k 4k", "flush"]);
    qemu_io_ok(&srv.uri("one"), &["read -P 10 0 64k"]);
    qemu_io_ok(&srv.uri("two"), &["read -P 10 0 4k", "read -P 0x77 4k 4k", "read -P 10 8k 56k"]);
    drop(srv);
    thin_check_ok(&meta);
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--unix", d.path().join("s.sock").to_str().unwrap(), &format!("v=thin:{m}?id=1&data={dd}")])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("give size="), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A pool made with relative paths is served from another working directory: the data
/// device is recorded by its absolute path.
#[test]
fn a_pool_made_with_relative_paths_opens_from_anywhere() {
    if !tools(&["qemu-io"]) {
        return;
    }
    let d = tempdir();
    let here = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_strata")).args(args).current_dir(d.path()).output().unwrap();
        assert!(o.status.success(), "strata {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    here(&["thin", "pool", "create", "--metadata", "pool.meta?size=8MiB", "--data", "pool.data?size=64MiB"]);
    here(&["thin", "create", "pool.meta", "1", "--size", "16MiB"]);
    let meta = d.path().join("pool.meta");
    // The server runs in a directory of its own.
    let srv = serve(&[format!("vol=thin:{}?id=1", meta.display())]);
    qemu_io_ok(&srv.uri("vol"), &["write -P 0x5a 0 64k", "flush", "read -P 0x5a 0 64k"]);
    drop(srv);
    let data = std::fs::read(d.path().join("pool.data")).unwrap();
    assert!(data.windows(4096).any(|w| w.iter().all(|&b| b == 0x5a)), "the data went to another file");
}

/// A pool whose data device is a cache: removing one of its two volumes leaves the pool and
/// the cache serving the other, and the server's stop, closing the last volume, shuts the
/// cache down cleanly (its hints saved, no recovery at the next open), as does an open of a
/// volume the pool does not have.
#[test]
fn a_pool_over_a_cache_shuts_the_cache_down_with_its_last_volume() {
    if !tools(&["qemu-io"]) {
        return;
    }
    let d = tempdir();
    let (cache, meta) = pool_over_a_cache(d.path(), &["1", "2"]);
    let m = meta.display();
    let mut srv = serve(&[format!("one=thin:{m}?id=1"), format!("two=thin:{m}?id=2")]);
    qemu_io_ok(&srv.uri("one"), &["write -P 0x11 0 256k", "flush"]);
    qemu_io_ok(&srv.uri("two"), &["write -P 0x22 0 256k", "flush"]);
    strata_ok(&["export", "remove", "--admin", srv.admin.as_deref().unwrap(), "one"]);
    qemu_io_ok(&srv.uri("two"), &["write -P 0x33 256k 256k", "flush", "read -P 0x22 0 256k", "read -P 0x33 256k 256k"]);
    srv.stop_checked();
    let check = strata_ok(&["cache", "check", cache.to_str().unwrap()]);
    assert!(check.contains("clean shutdown") && !check.contains("not shut down"), "{check}");
    let mut srv = serve(&[format!("one=thin:{m}?id=1"), format!("two=thin:{m}?id=2")]);
    qemu_io_ok(&srv.uri("one"), &["read -P 0x11 0 256k"]);
    qemu_io_ok(&srv.uri("two"), &["read -P 0x22 0 256k", "read -P 0x33 256k 256k"]);
    srv.stop_checked();
    // A volume the pool does not have, added live: refused, and the pool (and cache) it
    // opened for it closed cleanly, not dropped.
    let srv = serve(&["other=mem:1MiB".to_string()]);
    let refused = strata(&["export", "add", "--admin", srv.admin.as_deref().unwrap(), &format!("v=thin:{m}?id=9")]);
    assert!(!refused.status.success(), "{refused:?}");
    let check = strata_ok(&["cache", "check", cache.to_str().unwrap()]);
    assert!(check.contains("clean shutdown") && !check.contains("not shut down"), "{check}");
}

/// The server's stop waits for a removal under way: the last volume of a pool over a cache,
/// removed just before SIGTERM while the data device's flushes are slow, still closes the
/// cache cleanly before the server exits.
#[test]
fn a_stop_during_the_removal_of_a_pools_last_volume_closes_the_cache_cleanly() {
    if !tools(&["qemu-io"]) {
        return;
    }
    let d = tempdir();
    let (cache, meta) = pool_over_a_cache(d.path(), &["1"]);
    let (c, m) = (cache.display(), meta.display());
    let mut srv = serve(&[format!("v=thin:{m}?id=1&data=fault:flush:delay=2s@cache:{c}")]);
    qemu_io_ok(&srv.uri("v"), &["write -P 0x44 0 256k"]);
    let mut remove = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["export", "remove", "--admin", srv.admin.as_deref().unwrap(), "v"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Gone from the list: its removal is closing the pool now, its flushes taking 2 s each.
    let start = std::time::Instant::now();
    while srv.status()["volumes"].as_array().is_some_and(|v| !v.is_empty()) {
        assert!(start.elapsed() < common::CMD_TIMEOUT, "the removal never began");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    srv.stop_checked();
    let _ = remove.wait();
    let check = strata_ok(&["cache", "check", cache.to_str().unwrap()]);
    assert!(check.contains("clean shutdown") && !check.contains("not shut down"), "{check}");
    let srv = serve(&[format!("v=thin:{m}?id=1")]);
    qemu_io_ok(&srv.uri("v"), &["read -P 0x44 0 256k"]);
}

/// A cache in `dir` (`cache.img` over `origin.img`) and a pool whose data device it is
/// (`pool.meta`), with volumes `ids` of 16 MiB: the cache's and the metadata's paths.
fn pool_over_a_cache(dir: &Path, ids: &[&str]) -> (PathBuf, PathBuf) {
    let (origin, cache, meta) = (dir.join("origin.img"), dir.join("cache.img"), dir.join("pool.meta"));
    let (o, c, m) = (origin.display(), cache.display(), meta.display());
    strata_ok(&["cache", "create", "--origin", &format!("{o}?size=64MiB"), "--cache", &format!("{c}?size=16MiB")]);
    strata_ok(&["thin", "pool", "create", "--metadata", &format!("{m}?size=8MiB"), "--data", &format!("cache:{c}")]);
    let check = strata_ok(&["cache", "check", cache.to_str().unwrap()]);
    assert!(check.contains("clean shutdown") && !check.contains("not shut down"), "after the pool's creation: {check}");
    for id in ids {
        strata_ok(&["thin", "create", meta.to_str().unwrap(), id, "--size", "16MiB"]);
    }
    (cache, meta)
}

/// A pool in `dir` (`pool.meta` of `md_size`, `pool.data` of `data_size`) with volume 1 of
/// `volume_size`: the metadata's path and the data device's spec.
fn new_pool(dir: &Path, md_size: &str, data_size: &str, volume_size: &str) -> (PathBuf, String) {
    let meta = dir.join("pool.meta");
    let m = meta.to_str().unwrap();
    let data = format!("{}?size={data_size}", dir.join("pool.data").display());
    strata_ok(&["thin", "pool", "create", "--metadata", &format!("{m}?size={md_size}"), "--data", &data]);
    strata_ok(&["thin", "create", m, "1", "--size", volume_size]);
    (meta, data)
}

#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let d = tempdir();
    let (meta, data) = new_pool(d.path(), "4MiB", "16MiB", "4MiB");
    let m = meta.to_str().unwrap();
    let good = std::fs::read(&meta).unwrap();
    let unchanged = |what: &str| assert!(std::fs::read(&meta).unwrap() == good, "{what}: the pool changed");
    assert!(strata_err(&["thin", "pool", "create", "--metadata", m, "--data", &data]).contains("--force"));
    unchanged("pool create over a pool");
    assert!(strata_err(&["thin", "snapshot", m, "9", "2"]).contains("no thin device 9"));
    assert!(strata_err(&["thin", "create", m, "1", "--size", "1MiB"]).contains("already exists"));
    assert!(strata_err(&["thin", "delete", m, "5"]).contains("no thin device 5"));
    unchanged("refused operations");
    // An unknown volume id: the server refuses to start and says why.
    let o = strata(&["serve", "--unix", d.path().join("s.sock").to_str().unwrap(), &format!("v=thin:{m}?id=3")]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no thin device 3"));
    unchanged("serving an unknown volume");
    // Volumes of one pool must agree on the pool's features.
    let (a, b) = (format!("a=thin:{m}?id=1&skip_block_zeroing"), format!("b=thin:{m}?id=1"));
    let o = strata(&["serve", "--unix", d.path().join("s.sock").to_str().unwrap(), &a, &b]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("already open with skip_block_zeroing on"), "{e}");
    unchanged("serving with conflicting features");
    // A corrupt superblock: a clear error from every command, and nothing written.
    let mut bad = good.clone();
    bad[200] ^= 1;
    std::fs::write(&meta, &bad).unwrap();
    for args in [vec!["thin", "check", m], vec!["thin", "create", m, "4", "--size", "1MiB"], vec!["thin", "list", m]] {
        let e = strata_err(&args);
        assert!(e.contains("bad superblock checksum"), "{args:?}: {e}");
        assert!(std::fs::read(&meta).unwrap() == bad, "{args:?} wrote to a damaged pool");
    }
    // `check` exits 1 for damage, 2 for a device it cannot check.
    assert_eq!(strata(&["thin", "check", m]).status.code(), Some(1));
    let missing = d.path().join("missing.meta");
    assert_eq!(strata(&["thin", "check", missing.to_str().unwrap()]).status.code(), Some(2));
    // A metadata device of another kind.
    std::fs::write(&meta, vec![7u8; 1 << 20]).unwrap();
    assert!(strata_err(&["thin", "list", m]).contains("not dm-thin metadata"));
    let e = strata_err(&["thin", "check", m]);
    assert!(e.contains("not a thin pool's metadata device: it holds no dm-thin superblock"), "{e}");
    assert_eq!(strata(&["thin", "check", m]).status.code(), Some(2));
    let cache = d.path().join("c.img");
    let origin = format!("{}?size=8MiB", d.path().join("o.img").display());
    strata_ok(&["cache", "create", "--origin", &origin, "--cache", &format!("{}?size=4MiB", cache.display())]);
    let e = strata_err(&["thin", "check", cache.to_str().unwrap()]);
    assert!(e.contains("it holds a strata cache") && !e.contains("damaged"), "{e}");
    assert_eq!(strata(&["thin", "check", cache.to_str().unwrap()]).status.code(), Some(2));
    assert_eq!(strata(&["writecache", "check", cache.to_str().unwrap()]).status.code(), Some(2));
}

/// A pool whose needs_check flag is set (dm-thin's mark of a metadata failure): served, it is
/// refused with the way out; `thin check` warns and exits 0; `--clear-needs-check-flag` clears
/// it once the pool checks clean, as thin_check's does, and the pool is written again. One
/// using features strata does not know cannot be checked (exit 2) and is not written.
#[test]
fn a_pool_flagged_for_a_check_is_refused_until_a_clean_check_clears_the_flag() {
    let d = tempdir();
    let (meta, _) = new_pool(d.path(), "4MiB", "16MiB", "4MiB");
    let m = meta.to_str().unwrap();
    let set = |at: usize, bits: u32| {
        let mut b = std::fs::read(&meta).unwrap();
        b[at..at + 4].copy_from_slice(&bits.to_le_bytes());
        strata_thin::format::seal(&mut b[..4096], strata_thin::format::SUPERBLOCK_XOR);
        std::fs::write(&meta, &b).unwrap();
        b
    };
    let flagged = set(4, 1);
    let sock = d.path().join("s.sock");
    let o = strata(&["serve", "--unix", sock.to_str().unwrap(), &format!("v=thin:{m}?id=1")]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("needs_check flag is set") && e.contains("--clear-needs-check-flag"),
        "{e}"
    );
    assert!(strata_err(&["thin", "create", m, "2", "--size", "1MiB"]).contains("needs_check"));
    let data_bytes = std::fs::metadata(d.path().join("pool.data")).unwrap().len();
    assert!(strata_err(&["thin", "extend", m, "--data", "32MiB", "--metadata", "8MiB"]).contains("needs_check"));
    assert_eq!(std::fs::metadata(d.path().join("pool.data")).unwrap().len(), data_bytes, "the data file grew");
    let out = strata_ok(&["thin", "check", m]);
    assert!(out.contains("warning: the needs_check flag is set") && out.contains(": ok:"), "{out}");
    assert!(std::fs::read(&meta).unwrap() == flagged, "the flagged pool was written");
    let out = strata_ok(&["thin", "check", "--clear-needs-check-flag", m]);
    assert!(out.contains("the needs_check flag is cleared"), "{out}");
    strata_ok(&["thin", "create", m, "2", "--size", "1MiB"]);
    assert!(!strata_ok(&["thin", "check", m]).contains("warning"));
    if tools(&["thin_check"]) {
        thin_check_ok(&meta);
        // The tools' own way out, on a flag strata reads.
        set(4, 1);
        let o = cmd("thin_check").args(["--clear-needs-check-flag", m]).output().unwrap();
        assert!(o.status.success(), "thin_check: {}", String::from_utf8_lossy(&o.stderr));
        strata_ok(&["thin", "create", m, "3", "--size", "1MiB"]);
    }
    let unknown = set(360, 2);
    let o = strata(&["thin", "check", m]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && e.contains("incompat features 0x2 that strata does not know"), "{e}");
    assert!(strata_err(&["thin", "delete", m, "2"]).contains("does not know"));
    assert!(std::fs::read(&meta).unwrap() == unknown, "a pool with unknown features was written");
}

const REGION: u64 = 64 << 10;
const REGIONS: u64 = 64;

/// Region `j`'s contents after round `r` of the writer (round 0: the first fill).
fn pattern(r: u64, j: u64) -> Vec<u8> {
    let mut v = vec![0u8; 4096];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (r as u8).wrapping_mul(31) ^ (j as u8) ^ (i as u8);
    }
    v[..16].copy_from_slice(&[r.to_le_bytes(), j.to_le_bytes()].concat());
    v
}

/// The round each region's first 4 KiB holds, checking the rest of the pattern.
async fn rounds(c: &mut Client<tokio::net::UnixStream>) -> Vec<u64> {
    let mut out = Vec::new();
    for j in 0..REGIONS {
        let got = c.read(j * REGION, 4096).await.unwrap();
        let r = u64::from_le_bytes(got[..8].try_into().unwrap());
        assert_eq!(got, pattern(r, j), "region {j}: torn or foreign data");
        out.push(r);
    }
    out
}

#[test]
fn a_live_snapshot_of_a_volume_being_written_holds_a_prefix_of_its_writes() {
    let d = tempdir();
    let (meta, _) = new_pool(d.path(), "8MiB", "64MiB", "16MiB");
    let m = meta.to_str().unwrap();
    let srv = serve_unix(&[format!("vol=thin:{m}?id=1")]);
    let admin = srv.admin.clone().unwrap();
    let sock = srv.sock.clone().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    // A writer rewrites the regions in order, round after round, each write completed
    // before the next starts; `done` counts the writes completed.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let (sock, stop, done) = (sock.clone(), stop.clone(), done.clone());
        rt.spawn(async move {
            let mut c = Client::connect_unix(&sock, "vol").await.unwrap();
            let mut r = 0;
            while r < 2 || !stop.load(Ordering::Relaxed) {
                for j in 0..REGIONS {
                    c.write(j * REGION, &pattern(r, j), false).await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
                if r == 0 {
                    c.flush().await.unwrap();
                }
                r += 1;
            }
            c.flush().await.unwrap();
        })
    };
    while done.load(Ordering::Relaxed) < REGIONS * 2 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }

    // Live: the server's pool takes the snapshot while the writer goes on.
    let before = done.load(Ordering::Relaxed);
    strata_ok(&["thin", "snapshot", m, "1", "2", "--admin", &admin]);
    let after = done.load(Ordering::Relaxed);
    strata_ok(&["export", "add", "--admin", &admin, &format!("snap=thin:{m}?id=2")]);
    let first = rt.block_on(async {
        let mut c = Client::connect_unix(&sock, "snap").await.unwrap();
        assert_eq!(c.size(), 16 << 20, "the snapshot has its origin's recorded size");
        rounds(&mut c).await
    });
    // A prefix of the writes: regions 0..k in round R, the rest in round R-1, and that
    // prefix between the writes completed before the command and after it.
    let top = first[0];
    let k = first.iter().take_while(|&&r| r == top).count() as u64;
    assert!(first[k as usize..].iter().all(|&r| r + 1 == top), "not a prefix of the writes: {first:?}");
    let taken = top * REGIONS + k;
    // (A write the snapshot holds may have its reply still on the way when the command returns.)
    assert!(before <= taken && taken <= after + 1, "the snapshot holds {taken} writes, {before} to {after} were done");

    // The origin goes on changing; the snapshot does not.
    let seen = done.load(Ordering::Relaxed);
    while done.load(Ordering::Relaxed) < seen + REGIONS * 2 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let again = rt.block_on(async {
        let mut c = Client::connect_unix(&sock, "snap").await.unwrap();
        rounds(&mut c).await
    });
    assert_eq!(first, again, "the snapshot changed while its origin was written");
    stop.store(true, Ordering::Relaxed);
    rt.block_on(writer).unwrap();

    // Served volumes are not deleted; the offline commands refuse the held pool.
    let why = strata_err(&["thin", "delete", m, "2", "--admin", &admin]);
    assert!(why.contains("open (served)") && why.contains("export remove"), "{why}");
    let why = strata_err(&["thin", "delete", m, "2"]);
    assert!(why.contains("cannot claim") && why.contains("--admin"), "{why}");
    strata_ok(&["export", "remove", "--admin", &admin, "snap"]);
    strata_ok(&["thin", "delete", m, "2", "--admin", &admin]);
    let why = strata_err(&["export", "add", "--admin", &admin, &format!("snap=thin:{m}?id=2")]);
    assert!(why.contains("no thin device 2"), "{why}");
    // Created live, then served at once.
    strata_ok(&["thin", "create", m, "3", "--size", "1MiB", "--admin", &admin]);
    strata_ok(&["export", "add", "--admin", &admin, &format!("new=thin:{m}?id=3")]);
    rt.block_on(async {
        let mut c = Client::connect_unix(&sock, "new").await.unwrap();
        assert_eq!(c.read(0, 4096).await.unwrap(), vec![0u8; 4096]);
        c.write(0, &pattern(9, 9), true).await.unwrap();
    });
    let st = srv.status();
    let pool = &st["volumes"][0]["target"]["pool"];
    assert_eq!(pool["volumes"], 2, "{pool}");
    assert_eq!(pool["metadata_path"], std::fs::canonicalize(&meta).unwrap().to_str().unwrap());
    drop(srv);
    let list = strata_ok(&["thin", "list", m]);
    assert!(!list.contains("\n       2 "), "{list}");
    strata_ok(&["thin", "check", m]);
    if tools(&["thin_check"]) {
        thin_check_ok(&meta);
    }
}

#[test]
fn a_full_pool_is_extended_live_and_offline_with_its_low_water_mark_reported() {
    let d = tempdir();
    // 16 data blocks of 64 KiB; volume 1 of 4 MiB.
    let (meta, _) = new_pool(d.path(), "1MiB", "1MiB", "4MiB");
    let m = meta.to_str().unwrap();
    let data_file = d.path().join("pool.data");
    let srv = serve_unix(&[format!("vol=thin:{m}?id=1&low_water_blocks=4")]);
    let admin = srv.admin.clone().unwrap();
    let sock = srv.sock.clone().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let block = |b: u64| pattern(b, 0);
    let mut c = rt.block_on(Client::connect_unix(&sock, "vol")).unwrap();
    rt.block_on(async {
        for b in 0..16 {
            c.write(b * REGION, &block(b), false).await.unwrap();
        }
        assert!(c.write(16 * REGION, &block(16), false).await.is_err(), "a 17th block in a pool of 16");
        // Mapped blocks still take writes.
        c.write(3 * REGION, &block(33), true).await.unwrap();
    });
    let pool = srv.status()["volumes"][0]["target"]["pool"].clone();
    assert_eq!(pool["mode"], "out_of_data_space", "{pool}");
    assert_eq!((pool["data_free_blocks"].as_u64(), pool["below_low_water"].as_bool()), (Some(0), Some(true)));
    let metrics = srv.admin_get("/metrics");
    assert!(metrics.contains("strata_thin_pool_below_low_water{volume=\"vol\"} 1"), "{metrics}");
    assert!(metrics.contains("strata_thin_pool_data_free_blocks{volume=\"vol\"} 0"), "{metrics}");
    assert!(srv.stderr().contains("low-water mark of 4"), "{}", srv.stderr());

    // Live: the data file grows, the pool's data space with it, and the refused write goes in.
    strata_ok(&["thin", "extend", m, "--data", "2MiB", "--admin", &admin]);
    assert_eq!(std::fs::metadata(&data_file).unwrap().len(), 2 << 20);
    rt.block_on(async {
        c.write(16 * REGION, &block(16), false).await.unwrap();
        c.flush().await.unwrap();
    });
    let pool = srv.status()["volumes"][0]["target"]["pool"].clone();
    assert_eq!((pool["mode"].as_str(), pool["data_blocks"].as_u64()), (Some("ok"), Some(32)), "{pool}");
    assert_eq!(pool["below_low_water"], false, "{pool}");
    strata_ok(&["thin", "set", m, "--admin", &admin, "--low-water-blocks", "20", "--commit-period", "500ms"]);
    let pool = srv.status()["volumes"][0]["target"]["pool"].clone();
    assert_eq!((pool["below_low_water"].as_bool(), pool["commit_period_ms"].as_u64()), (Some(true), Some(500)));
    let why = strata_err(&["thin", "extend", m, "--data", "1MiB", "--admin", &admin]);
    assert!(why.contains("cannot shrink"), "{why}");
    drop(c);
    drop(srv);

    // Offline: metadata and data grown, everything written before intact.
    strata_ok(&["thin", "extend", m, "--data", "4MiB", "--metadata", "2MiB"]);
    let list = strata_ok(&["thin", "list", m]);
    assert!(list.contains("of 64 data blocks") || list.contains("of 64 blocks"), "{list}");
    if tools(&["thin_check"]) {
        thin_check_ok(&meta);
    }
    strata_ok(&["thin", "check", m]);
    let srv = serve_unix(&[format!("vol=thin:{m}?id=1")]);
    rt.block_on(async {
        let mut c = Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
        for b in 0..17 {
            let want = block(if b == 3 { 33 } else { b });
            assert_eq!(c.read(b * REGION, 4096).await.unwrap(), want, "block {b}");
        }
    });
    drop(srv);

    // Past dm-thin's most metadata (255 bitmaps of 16,320 blocks), the file grows to that.
    let out = strata_ok(&["thin", "extend", m, "--metadata", "17GiB"]);
    assert!(out.contains("4161600 metadata blocks"), "{out}");
    assert_eq!(std::fs::metadata(&meta).unwrap().len(), 4_161_600 * 4096);
    strata_ok(&["thin", "check", m]);
}

fn serve_unix(volumes: &[String]) -> Server {
    Server::start_opts(tempdir(), ServerOpts { admin: true, unix: true, args: volumes.to_vec(), ..Default::default() })
}

/// Unmounts a tmpfs mounted for a test, even when the test panics.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A pool whose data file (sparse) and metadata file share a file system that fills: the
/// write that finds no room fails with ENOSPC, and the pool goes on. The metadata file was
/// allocated in full when the pool was made, so commits never meet the full file system;
/// every write acknowledged before reads back, after a flush and after a restart.
#[test]
fn a_full_file_system_under_the_data_file_fails_the_write_and_keeps_the_pool() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: a_full_file_system_under_the_data_file_fails_the_write_and_keeps_the_pool needs root (mount)");
        return;
    }
    let d = tempdir();
    let fs = d.path().join("fs");
    std::fs::create_dir(&fs).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=8M", "tmpfs"]).arg(&fs).output().unwrap();
    if !mounted.status.success() {
        let why = String::from_utf8_lossy(&mounted.stderr);
        eprintln!(
            "SKIP: a_full_file_system_under_the_data_file_fails_the_write_and_keeps_the_pool: mount -t tmpfs: {why}"
        );
        return;
    }
    let _fs = Tmpfs(fs.clone());
    let (meta, _) = new_pool(&fs, "1MiB", "64MiB", "32MiB");
    let allocated = |p: &Path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap()) * 512;
    assert!(allocated(&meta) >= 1 << 20, "the metadata file is allocated");
    assert!(allocated(&fs.join("pool.data")) < 1 << 20, "the data file stays sparse");
    let m = meta.to_str().unwrap();
    let srv = serve_unix(&[format!("vol=thin:{m}?id=1")]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let written = rt.block_on(async {
        let mut c = Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
        let mut b = 0;
        let e = loop {
            match c.write(b * REGION, &pattern(b, 0).repeat(16), false).await {
                Ok(()) => b += 1,
                Err(e) => break e,
            }
            assert!(b < 512, "8 MiB of tmpfs took the whole volume");
        };
        assert!(e.to_string().contains("errno 28"), "ENOSPC: {e}");
        c.flush().await.unwrap();
        for v in 0..b {
            assert_eq!(c.read(v * REGION, 4096).await.unwrap(), pattern(v, 0)[..4096], "block {v}");
        }
        b
    });
    assert!(written > 0);
    assert_eq!(srv.status()["volumes"][0]["target"]["pool"]["mode"], "ok");
    drop(srv);
    strata_ok(&["thin", "check", m]);
    let srv = serve_unix(&[format!("vol=thin:{m}?id=1")]);
    rt.block_on(async {
        let mut c = Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
        for v in 0..written {
            assert_eq!(c.read(v * REGION, 4096).await.unwrap(), pattern(v, 0)[..4096], "block {v} after a restart");
        }
    });
}
