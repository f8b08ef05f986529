//! `strata cache` on bad input: every refusal is clear and overwrites nothing.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `strata TARGET create` of a fast device `fast` (8 MiB) over `origin` (32 MiB), both made
/// as sparse files, with `extra` options.
fn create_files(target: &str, origin: &Path, fast: &Path, extra: &[&str]) -> Output {
    let origin = format!("{}?size=32MiB", origin.display());
    let fast = format!("{}?size=8MiB", fast.display());
    let mut args = vec![target, "create", "--origin", &origin, "--cache", &fast];
    args.extend_from_slice(extra);
    strata(&args)
}

/// A cache `cache.img` in `dir` over `origin.img`.
fn create(dir: &Path, extra: &[&str]) -> Output {
    create_files("cache", &dir.join("origin.img"), &dir.join("cache.img"), extra)
}

/// A write log `log.img` in `dir` over its own origin `origin2.img`.
fn create_log(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (log, origin) = (dir.join("log.img"), dir.join("origin2.img"));
    let o = create_files("writecache", &origin, &log, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    (log, origin)
}

#[test]
fn create_check_and_dump_a_fresh_cache() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let o = create(d.path(), &["--block-size", "32KiB", "--mode", "writethrough", "--policy", "smq"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cache = d.path().join("cache.img");
    // The cache device's file is allocated in full (its writes never meet a full file
    // system), the origin's made sparse, as the write log's and its origin's.
    let (log, origin2) = create_log(d.path());
    for (file, full) in [(&cache, true), (&d.path().join("origin.img"), false), (&log, true), (&origin2, false)] {
        let m = std::fs::metadata(file).unwrap();
        let allocated = std::os::unix::fs::MetadataExt::blocks(&m) * 512;
        assert_eq!(allocated >= m.len(), full, "{}: {allocated} of {} bytes allocated", file.display(), m.len());
    }
    let c = strata(&["cache", "check", cache.to_str().unwrap()]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stdout));
    assert!(String::from_utf8_lossy(&c.stdout).contains("metadata ok"));
    let dump = strata(&["cache", "dump", cache.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&dump.stdout).unwrap();
    assert_eq!(v["superblock"]["mode"], "writethrough");
    assert_eq!(v["superblock"]["policy"], "smq");
    assert_eq!(v["superblock"]["block_size"], 32768);
    assert_eq!(v["superblock"]["origin_bytes"], 32 << 20);
    assert!(!v["superblock"]["origin_spec"].as_str().unwrap().contains("size="), "size= is not recorded");
}

#[test]
fn refuses_to_overwrite_recognisable_data_without_force() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    assert!(create(d.path(), &[]).status.success());
    let before = std::fs::read(d.path().join("cache.img")).unwrap();
    let again = create(d.path(), &[]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("holds a strata cache"), "{}", stderr(&again));
    assert!(std::fs::read(d.path().join("cache.img")).unwrap() == before, "nothing overwritten");
    // An ext4 file system is recognised too.
    let fs = d.path().join("fs.img");
    let mut img = vec![0u8; 8 << 20];
    img[1080] = 0x53;
    img[1081] = 0xEF;
    std::fs::write(&fs, &img).unwrap();
    let origin = d.path().join("origin.img");
    let o = create_files("cache", &origin, &fs, &[]);
    assert!(stderr(&o).contains("ext2/3/4"), "{}", stderr(&o));
    let c = strata(&["cache", "check", fs.to_str().unwrap()]);
    assert!(stderr(&c).contains("not a strata cache device: it holds an ext2/3/4"), "{}", stderr(&c));
    // `check` exits 2 for a device it cannot check (1 is for damage).
    assert_eq!(c.status.code(), Some(2));
    let missing = d.path().join("missing.img");
    assert_eq!(strata(&["cache", "check", missing.to_str().unwrap()]).status.code(), Some(2));
    assert!(std::fs::read(&fs).unwrap() == img);
    let forced = create_files("cache", &origin, &fs, &["--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    // Data of no known format (an encrypted disk, say) is not written over either.
    let noise = d.path().join("noise.img");
    let bytes: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&noise, &bytes).unwrap();
    let o = create_files("cache", &origin, &noise, &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("its first 4 KiB are not zero"), "{}", stderr(&o));
    assert!(std::fs::read(&noise).unwrap() == bytes, "nothing overwritten");
}

/// A cache, a write log and a thin pool's metadata: none of the three `create`s formats a
/// device holding one of the others (the strata cache's superblock is at 4 KiB, past what a
/// check of the first 4 KiB sees) or takes one as its origin or data device, and each names
/// what it found.
#[test]
fn no_create_overwrites_another_format() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let origin = d.path().join("origin.img");
    let origin = format!("{}?size=32MiB", origin.display());
    let dev = |name: &str| d.path().join(name).to_str().unwrap().to_string();
    let sized = |name: &str| format!("{}?size=8MiB", dev(name));
    let creates = |target: &str| -> Vec<String> {
        match target {
            "cache" => vec!["cache".into(), "create".into(), "--origin".into(), origin.clone(), "--cache".into()],
            "writecache" => {
                vec!["writecache".into(), "create".into(), "--origin".into(), origin.clone(), "--cache".into()]
            }
            _ => vec![
                "thin".into(),
                "pool".into(),
                "create".into(),
                "--data".into(),
                origin.clone(),
                "--metadata".into(),
            ],
        }
    };
    let run = |target: &str, device: String| {
        let mut args = creates(target);
        args.push(device);
        strata(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    for (made, what) in
        [("cache", "a strata cache"), ("writecache", "a strata write log"), ("thin", "a thin pool's metadata")]
    {
        let o = run(made, sized(made));
        assert!(o.status.success(), "{made}: {}", stderr(&o));
        let before = std::fs::read(dev(made)).unwrap();
        for other in ["cache", "writecache", "thin"].into_iter().filter(|&t| t != made) {
            let o = run(other, dev(made));
            assert!(!o.status.success(), "{other} create formatted {what}");
            assert!(stderr(&o).contains(what), "{other} over {made}: {}", stderr(&o));
            assert!(std::fs::read(dev(made)).unwrap() == before, "{other} create wrote on {what}");
        }
    }
    // Nor does one take another's device as the origin or the data device (swapped
    // arguments), unless forced.
    for (args, want) in [
        (vec!["cache", "create", "--origin", &dev("cache"), "--cache", &sized("new1")], "origin"),
        (vec!["writecache", "create", "--origin", &dev("writecache"), "--cache", &sized("new2")], "origin"),
        (vec!["thin", "pool", "create", "--metadata", &sized("new3"), "--data", &dev("cache")], "data device"),
    ] {
        let o = strata(&args);
        assert!(!o.status.success() && stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        let forced = strata(&[args.as_slice(), &["--force"]].concat());
        assert!(forced.status.success(), "{args:?} --force: {}", stderr(&forced));
    }
}

/// A `create` that fails removes the files it made (so that the retry is not refused as
/// "exists with another size"), and leaves files that were there before.
#[test]
fn a_failed_create_leaves_no_new_file() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let at = |name: &str| d.path().join(name).to_str().unwrap().to_string();
    std::fs::write(at("old.img"), vec![0u8; 1 << 20]).unwrap();
    let too_small = [
        vec!["cache", "create", "--origin", "o1.img?size=8MiB", "--cache", "c.img?size=64KiB"],
        vec!["writecache", "create", "--origin", "o2.img?size=8MiB", "--cache", "w.img?size=8KiB"],
        vec!["thin", "pool", "create", "--metadata", "m.img?size=4KiB", "--data", "d.img?size=8MiB"],
        vec!["cache", "create", "--origin", "old.img", "--cache", "c.img?size=64KiB"],
        // One file named twice: each device would write over the other.
        vec!["cache", "create", "--origin", "s.img?size=8MiB", "--cache", "s.img"],
        vec!["writecache", "create", "--origin", "s.img?size=8MiB", "--cache", "s.img"],
        vec!["thin", "pool", "create", "--metadata", "s.img?size=1MiB", "--data", "s.img"],
        // A device in RAM, gone at the next start, while the format made for it stays.
        vec!["cache", "create", "--origin", "mem:8MiB", "--cache", "c.img?size=4MiB"],
        vec!["writecache", "create", "--origin", "mem:8MiB", "--cache", "w.img?size=4MiB"],
        vec!["thin", "pool", "create", "--metadata", "m.img?size=1MiB", "--data", "mem:8MiB"],
    ];
    for args in too_small {
        let args: Vec<String> = args.iter().map(|a| if a.contains(".img") { at(a) } else { a.to_string() }).collect();
        let o = strata(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!o.status.success(), "{args:?} succeeded");
        let mut left: Vec<String> =
            std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["old.img"], "{args:?} left files behind: {}", stderr(&o));
        if args.iter().any(|a| a.contains("s.img")) {
            assert!(stderr(&o).contains("both name"), "{args:?}: {}", stderr(&o));
        }
        if args.iter().any(|a| a.starts_with("mem:")) {
            assert!(stderr(&o).contains("is in RAM"), "{args:?}: {}", stderr(&o));
        }
    }
    // The retry with a size that fits is not refused.
    let o = strata(&["cache", "create", "--origin", &at("o1.img?size=8MiB"), "--cache", &at("c.img?size=4MiB")]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn refuses_bad_parameters() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (args, want) in [
        (vec!["--policy", "nonesuch"], "unknown policy"),
        (vec!["--mode", "writesideways"], "unknown cache mode"),
        (vec!["--block-size", "48KiB"], "power of two"),
        (vec!["--block-size", "4KiB"], "power of two"),
    ] {
        let o = create(d.path(), &args);
        assert!(!o.status.success(), "{args:?} accepted");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    // A cache device too small for its metadata and one block.
    let o = strata(&[
        "cache",
        "create",
        "--origin",
        &format!("{}?size=32MiB", d.path().join("o2.img").display()),
        "--cache",
        &format!("{}?size=512KiB", d.path().join("tiny.img").display()),
    ]);
    assert!(stderr(&o).contains("too small"), "{}", stderr(&o));
    // An origin that cannot be opened.
    let o = strata(&[
        "cache",
        "create",
        "--origin",
        "/nonexistent/origin.img",
        "--cache",
        &format!("{}?size=8MiB", d.path().join("c3.img").display()),
    ]);
    assert!(stderr(&o).contains("cannot open the origin"), "{}", stderr(&o));
    assert!(
        !d.path().join("c3.img").exists() || std::fs::read(d.path().join("c3.img")).unwrap().iter().all(|&b| b == 0)
    );
}

fn serve_fails(dir: &Path, spec: &str) -> String {
    let sock = dir.join("s.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--unix", sock.to_str().unwrap(), &format!("vol={spec}")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            assert!(!out.status.success(), "serving {spec} should fail");
            return stderr(&out);
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let _ = child.kill();
    panic!("serving {spec} did not fail: {}", stderr(&child.wait_with_output().unwrap()));
}

#[test]
fn serving_refuses_corrupt_foreign_or_mismatched_caches() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    assert!(create(d.path(), &[]).status.success());
    let cache = d.path().join("cache.img");
    let spec = format!("cache:{}", cache.display());

    // Origin size changed.
    let origin = d.path().join("origin.img");
    std::fs::OpenOptions::new().write(true).open(&origin).unwrap().set_len(40 << 20).unwrap();
    assert!(serve_fails(d.path(), &spec).contains("origin size changed"));
    std::fs::OpenOptions::new().write(true).open(&origin).unwrap().set_len(32 << 20).unwrap();

    // A different origin at the same path (made before the old one goes, so it cannot
    // reuse its inode).
    let other = d.path().join("other.img");
    std::fs::write(&other, vec![0u8; 32 << 20]).unwrap();
    std::fs::rename(&other, &origin).unwrap();
    assert!(serve_fails(d.path(), &spec).contains("wrong origin"));

    // A missing origin.
    std::fs::remove_file(&origin).unwrap();
    let e = serve_fails(d.path(), &spec);
    assert!(e.contains("origin") && e.contains("cannot open"), "{e}");
    assert!(!origin.exists(), "a missing origin is never created");

    // Both superblock copies damaged: clear error, nothing overwritten.
    let mut img = std::fs::read(&cache).unwrap();
    img[100] ^= 0xff;
    img[4096 + 100] ^= 0xff;
    std::fs::write(&cache, &img).unwrap();
    assert!(serve_fails(d.path(), &spec).contains("corrupt cache superblock"));
    let c = strata(&["cache", "check", cache.to_str().unwrap()]);
    assert!(!c.status.success());
    assert!(std::fs::read(&cache).unwrap() == img, "a failed open writes nothing");

    // Not a cache at all.
    let plain = d.path().join("plain.img");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    assert!(serve_fails(d.path(), &format!("cache:{}", plain.display())).contains("not a strata cache"));
}

/// The kernel gives a loop device's number to the next file attached: a cache made on
/// `/dev/loopN` refuses to serve another file attached there (same device number, same
/// size), and a write log too. Needs root and loop devices.
#[test]
fn a_block_device_origin_is_told_from_another_at_the_same_number() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/loop-control").exists() {
        eprintln!("SKIP: a_block_device_origin_is_told_from_another_at_the_same_number needs root and loop devices");
        return;
    }
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (a, b) = (d.path().join("a.img"), d.path().join("b.img"));
    std::fs::write(&a, vec![0xaau8; 8 << 20]).unwrap();
    std::fs::write(&b, vec![0xbbu8; 8 << 20]).unwrap();
    let losetup = |args: &[&str]| Command::new("losetup").args(args).output().unwrap();
    let o = losetup(&["--find", "--show", a.to_str().unwrap()]);
    assert!(o.status.success(), "losetup: {}", stderr(&o));
    let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let cache = d.path().join("cache.img");
    let log = d.path().join("log.img");
    let made = [
        strata(&["cache", "create", "--origin", &dev, "--cache", &format!("{}?size=4MiB", cache.display())]),
        strata(&["writecache", "create", "--origin", &dev, "--cache", &format!("{}?size=4MiB", log.display())]),
    ];
    let o = losetup(&["-d", &dev]);
    assert!(o.status.success(), "losetup -d: {}", stderr(&o));
    for m in &made {
        assert!(m.status.success(), "{}", stderr(m));
    }
    // Another file at the same number, if no one else took it meanwhile.
    if !losetup(&[&dev, b.to_str().unwrap()]).status.success() {
        eprintln!("SKIP: {dev} was taken by another test before b.img could be attached to it");
        return;
    }
    let refused = [format!("cache:{}", cache.display()), format!("writecache:{}", log.display())]
        .map(|spec| serve_fails(d.path(), &spec));
    let _ = losetup(&["-d", &dev]);
    for why in refused {
        assert!(why.contains("wrong origin") && why.contains("loop"), "{why}");
    }
    assert!(std::fs::read(&b).unwrap().iter().all(|&x| x == 0xbb), "the other file was written");
}

/// Serves `spec` until the socket answers, then stops it with SIGTERM; returns its stderr.
fn serve_and_stop(dir: &Path, spec: &str) -> String {
    let sock = dir.join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--unix", sock.to_str().unwrap(), &format!("vol={spec}")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stderr(&out)
}

#[test]
fn one_damaged_superblock_copy_is_survived() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    assert!(create(d.path(), &[]).status.success());
    let cache = d.path().join("cache.img");
    let spec = format!("cache:{}", cache.display());
    serve_and_stop(d.path(), &spec); // both superblock copies now hold a valid version
    let mut img = std::fs::read(&cache).unwrap();
    let seq = |at: usize| u64::from_le_bytes(img[at + 16..at + 24].try_into().unwrap());
    let newest = if seq(0) > seq(4096) { 0 } else { 4096 };
    img[newest + 300] ^= 0xff;
    std::fs::write(&cache, &img).unwrap();
    let c = strata(&["cache", "check", cache.to_str().unwrap()]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stdout));
    serve_and_stop(d.path(), &spec);
    // A damaged table page copy is another matter: see `a_damaged_table_is_refused_until_repaired`.
}

#[test]
fn every_cache_command_has_help_with_an_example() {
    // Each example runs the command it is the help of.
    let targets = [
        ("cache", &["create", "set", "flush", "detach", "invalidate", "origin", "check", "dump"][..]),
        ("writecache", &["create", "set", "flush", "detach", "origin", "check", "dump"][..]),
        ("thin", &["create", "snapshot", "delete", "list", "check", "dump", "extend"][..]),
    ];
    for (target, cmds) in targets {
        for cmd in cmds {
            let o = strata(&[target, cmd, "--help"]);
            assert!(o.status.success());
            let help = String::from_utf8_lossy(&o.stdout);
            let example = help.split_once("Example").map(|(_, e)| e).unwrap_or("");
            assert!(example.contains(&format!("strata {target} {cmd} ")), "{target} {cmd} --help: {help}");
        }
    }
    for cmd in ["serve", "status", "demo", "sim", "crashtest"] {
        let o = strata(&[cmd, "--help"]);
        assert!(o.status.success());
        assert!(String::from_utf8_lossy(&o.stdout).contains("xample"), "{cmd} --help lacks an example");
    }
    let o = strata(&["serve", "--bogus"]);
    assert!(!o.status.success());
}

/// `strata serve --unix DIR/s.sock ARGS...`, which must fail at startup; returns its stderr.
fn serve_args_fail(dir: &Path, args: &[String]) -> String {
    let sock = dir.join("s.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(["serve", "--unix", sock.to_str().unwrap()]).args(args);
    let out = common::output(&mut cmd, common::START_TIMEOUT);
    assert!(!out.status.success(), "serving {args:?} should fail: {}", stderr(&out));
    stderr(&out)
}

/// Writes and reads back one block through the first server, proving it still serves.
fn still_serves(sock: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = strata_nbd::client::Client::connect_unix(sock, "vol").await.unwrap();
        c.write(65536, &[0x5a; 4096], true).await.unwrap();
        assert_eq!(c.read(65536, 4096).await.unwrap(), vec![0x5a; 4096]);
        c.disconnect().await.unwrap();
    });
}

#[test]
fn create_refuses_one_file_as_both_origin_and_cache() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = d.path().join("both.img");
    let img: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8 | 1).collect();
    std::fs::write(&f, &img).unwrap();
    let o = strata(&["cache", "create", "--origin", f.to_str().unwrap(), "--cache", f.to_str().unwrap()]);
    assert!(!o.status.success(), "a file became its own cache");
    let e = stderr(&o);
    let shown = std::fs::canonicalize(&f).unwrap();
    assert!(e.contains(&format!("--origin and --cache both name {}", shown.display())), "{e}");
    assert!(!e.contains("?ro&shared"), "no hint to read it beside itself: {e}");
    assert!(std::fs::read(&f).unwrap() == img, "the file was changed");
}

#[test]
fn a_second_server_on_a_served_cache_is_refused_naming_the_first() {
    let d = common::tempdir();
    assert!(create(d.path(), &[]).status.success());
    let cache = d.path().join("cache.img");
    let first = common::Server::start_opts(
        d,
        common::ServerOpts { args: vec!["vol=cache:{dir}/cache.img".into()], ..Default::default() },
    );
    let other = common::tempdir();
    let e = serve_args_fail(other.path(), &[format!("vol=cache:{}", cache.display())]);
    assert!(e.contains(&format!("cannot claim {}", cache.display())), "{e}");
    assert!(e.contains(&format!("in use by pid {} (", first.pid())), "{e}");
    assert!(e.contains("serve"), "the holder's command line is named: {e}");
    still_serves(first.sock.as_ref().unwrap());
    // The same goes for its origin, served raw by a second server.
    let origin = first.path().join("origin.img");
    let e = serve_args_fail(other.path(), &[format!("vol={}", origin.display())]);
    assert!(e.contains(&format!("in use by pid {} (", first.pid())), "{e}");
    still_serves(first.sock.as_ref().unwrap());
    first.stop();
}

#[test]
fn one_server_refuses_a_cache_beside_its_origin_raw() {
    let d = common::tempdir();
    assert!(create(d.path(), &[]).status.success());
    let cache = format!("vol=cache:{}", d.path().join("cache.img").display());
    let origin = d.path().join("origin.img");
    let raw = format!("raw={}", origin.display());
    for args in [[cache.clone(), raw.clone()], [raw.clone(), cache.clone()]] {
        let e = serve_args_fail(d.path(), &args);
        assert!(e.contains(&format!("cannot claim {}", origin.display())), "{args:?}: {e}");
        assert!(e.contains("already open in this process"), "{args:?}: {e}");
    }
    // Reading the origin beside its cache is an explicit opt-out.
    let srv = common::Server::start_opts(
        d,
        common::ServerOpts { args: vec![cache, "raw={dir}/origin.img?ro&shared".into()], ..Default::default() },
    );
    srv.stop();
}

/// `cache flush`, `cache detach` and `writecache detach` fail, rather than wait forever, once
/// the origin refuses write-back; the blocks stay dirty and readable.
#[test]
fn flush_and_detach_fail_when_the_origin_refuses_write_back() {
    let d = common::tempdir();
    assert!(create(d.path(), &["--mode", "writeback"]).status.success());
    let (log, origin2) = create_log(d.path());
    let failing = |target: &str, path: &Path, origin: &Path| {
        format!("{target}:{}?origin=fault:write:eio:always@{}", path.display(), origin.display())
    };
    let args = vec![
        format!("vol={}", failing("cache", &d.path().join("cache.img"), &d.path().join("origin.img"))),
        format!("log={}", failing("writecache", &log, &origin2)),
    ];
    let srv = common::Server::start_opts(
        tempfile::tempdir_in(d.path()).unwrap(),
        common::ServerOpts { admin: true, args, ..Default::default() },
    );
    let data = common::random_bytes(256 << 10, 9);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for name in ["vol", "log"] {
        rt.block_on(async {
            let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), name).await.unwrap();
            c.write(1 << 20, &data, false).await.unwrap();
            c.flush().await.unwrap();
        });
    }
    let admin = srv.admin.clone().unwrap();
    for args in [["cache", "flush"], ["cache", "detach"], ["writecache", "detach"]] {
        let name = if args[0] == "cache" { "vol" } else { "log" };
        let mut c = Command::new(env!("CARGO_BIN_EXE_strata"));
        c.args(args).args(["--admin", &admin, name]);
        let o = common::output(&mut c, std::time::Duration::from_secs(60));
        let e = stderr(&o);
        assert!(!o.status.success() && e.contains("write-back failed") && e.contains("still dirty"), "{args:?}: {e}");
    }
    for name in ["vol", "log"] {
        rt.block_on(async {
            let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), name).await.unwrap();
            common::assert_same_bytes(&c.read(1 << 20, data.len() as u32).await.unwrap(), &data, name);
        });
    }
    srv.stop();
}

/// A table page copy damaged after a clean shutdown: `check` fails and names it, the cache
/// does not open, and `check --repair` rewrites the table so it opens again.
#[test]
fn a_damaged_table_is_refused_until_repaired() {
    let d = common::tempdir();
    assert!(create(d.path(), &[]).status.success());
    let cache = d.path().join("cache.img");
    let path = cache.to_str().unwrap();
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&cache).unwrap();
    let at = 8192 + 100; // table page 0, copy 0
    let mut byte = [0u8];
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(at)).unwrap();
    std::io::Read::read_exact(&mut f, &mut byte).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(at)).unwrap();
    std::io::Write::write_all(&mut f, &[byte[0] ^ 0x40]).unwrap();
    drop(f);
    let c = strata(&["cache", "check", path]);
    let out = String::from_utf8_lossy(&c.stdout).into_owned();
    assert!(c.status.code() == Some(1) && out.contains("table page 0: copy 0 damaged"), "{out}");
    let e = serve_args_fail(d.path(), &[format!("vol=cache:{path}")]);
    assert!(e.contains("--repair"), "{e}");
    let r = strata(&["cache", "check", "--repair", path]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(
        String::from_utf8_lossy(&r.stdout).contains("repaired: 0 slots unmapped"),
        "{}",
        String::from_utf8_lossy(&r.stdout)
    );
    let c = strata(&["cache", "check", path]);
    assert!(c.status.success() && String::from_utf8_lossy(&c.stdout).contains("metadata ok"), "{}", stderr(&c));
    common::Server::start_opts(
        tempfile::tempdir_in(d.path()).unwrap(),
        common::ServerOpts { args: vec![format!("vol=cache:{path}")], ..Default::default() },
    )
    .stop();
}

/// A detached cache served again after its origin was written without it reads what the
/// origin holds now, not its old clean copies, and writes none of them back.
#[test]
fn a_detached_cache_served_again_drops_its_clean_copies() {
    let d = common::tempdir();
    assert!(create(d.path(), &["--mode", "writeback"]).status.success());
    let (origin, cache) = (d.path().join("origin.img"), d.path().join("cache.img"));
    let data = common::random_bytes(256 << 10, 5);
    let serve = |dir| {
        let spec = format!("vol=cache:{}", cache.display());
        common::Server::start_opts(dir, common::ServerOpts { admin: true, args: vec![spec], ..Default::default() })
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let read = |srv: &common::Server| {
        rt.block_on(async {
            let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
            c.read(1 << 20, data.len() as u32).await.unwrap()
        })
    };
    let srv = serve(tempfile::tempdir_in(d.path()).unwrap());
    rt.block_on(async {
        let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
        c.write(1 << 20, &data, false).await.unwrap();
        c.flush().await.unwrap();
    });
    common::assert_same_bytes(&read(&srv), &data, "read through the cache");
    let o = strata(&["cache", "detach", "--admin", srv.admin.as_ref().unwrap(), "vol"]);
    assert!(o.status.success(), "{}", stderr(&o));
    srv.stop();

    let newer = vec![0x33u8; data.len()];
    let mut img = std::fs::read(&origin).unwrap();
    common::assert_same_bytes(&img[1 << 20..(1 << 20) + data.len()], &data, "the origin after detach");
    img[1 << 20..(1 << 20) + data.len()].copy_from_slice(&newer);
    std::fs::write(&origin, &img).unwrap();
    let srv = serve(tempfile::tempdir_in(d.path()).unwrap());
    common::assert_same_bytes(&read(&srv), &newer, "served again");
    let err = srv.stop();
    assert!(err.contains("clean blocks dropped"), "{err}");
    let img = std::fs::read(&origin).unwrap();
    common::assert_same_bytes(&img[1 << 20..(1 << 20) + data.len()], &newer, "the origin served again");
}

/// A command whose reader goes away before it prints (`strata ... | head -0`) ends quietly,
/// as Unix tools do, instead of panicking on the closed pipe.
#[test]
fn printing_into_a_closed_pipe_is_no_panic() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (origin, log) = (d.path().join("o.img"), d.path().join("l.img"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["writecache", "create", "--origin", &format!("{}?size=8MiB", origin.display())])
        .args(["--cache", &format!("{}?size=4MiB", log.display())])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    assert!(log.exists(), "the log was made before the print");
}

/// An origin restored from a backup (another inode) is refused as the wrong one until
/// `strata cache origin` (or `writecache origin`) records it; the target then serves its
/// data, dirty blocks included.
#[test]
fn a_restored_origin_is_recorded_with_the_origin_command() {
    for target in ["cache", "writecache"] {
        let d = common::tempdir();
        let (origin, fast) = (d.path().join("origin.img"), d.path().join("fast.img"));
        let o = create_files(target, &origin, &fast, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let spec = format!("vol={target}:{}", fast.display());
        let serve = |dir| {
            common::Server::start_opts(dir, common::ServerOpts { args: vec![spec.clone()], ..Default::default() })
        };
        let data = common::random_bytes(64 << 10, 3);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let srv = serve(tempfile::tempdir_in(d.path()).unwrap());
        rt.block_on(async {
            let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
            c.write(1 << 20, &data, true).await.unwrap();
        });
        srv.stop();
        // Restored from a backup: the same bytes in another file, moved into place.
        let copy = d.path().join("restored.img");
        std::fs::copy(&origin, &copy).unwrap();
        std::fs::rename(&copy, &origin).unwrap();
        let why = serve_fails(d.path(), &format!("{target}:{}", fast.display()));
        assert!(why.contains("wrong origin"), "{target}: {why}");
        // Another size is refused; the restored one is recorded.
        let small = d.path().join("small.img");
        std::fs::write(&small, vec![0u8; 1 << 20]).unwrap();
        let o = strata(&[target, "origin", fast.to_str().unwrap(), "--origin", small.to_str().unwrap()]);
        assert!(!o.status.success() && stderr(&o).contains("bytes"), "{target}: {}", stderr(&o));
        let o = strata(&[target, "origin", fast.to_str().unwrap(), "--origin", origin.to_str().unwrap()]);
        assert!(o.status.success(), "{target}: {}", stderr(&o));
        let srv = serve(tempfile::tempdir_in(d.path()).unwrap());
        rt.block_on(async {
            let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
            common::assert_same_bytes(&c.read(1 << 20, data.len() as u32).await.unwrap(), &data, target);
        });
        srv.stop();
    }
}

/// Durations that are no number of seconds are usage errors, not panics.
#[test]
fn seconds_that_are_not_a_duration_are_refused() {
    for bad in ["inf", "1e30", "nan", "-1"] {
        let seconds = format!("--seconds={bad}");
        for args in
            [vec!["load", "--unix", "/nonexistent.sock", &seconds], vec!["qos", "calibrate", "mem:8MiB", &seconds]]
        {
            let o = strata(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
            assert!(stderr(&o).contains("number of seconds") && !stderr(&o).contains("panicked"), "{}", stderr(&o));
        }
    }
}

/// Ctrl-C during `strata demo` stops fio and shuts the cached volume down cleanly: the
/// cache it leaves behind says so.
#[test]
fn an_interrupted_demo_leaves_its_cache_clean() {
    if !common::have("fio") {
        eprintln!("SKIP: fio is not installed (scripts/setup.sh installs it)");
        return;
    }
    // Interrupted while its cache is being made (the origin file is made first), and while
    // fio runs the origin phase (under way once the server's socket is there).
    for (wait_for, then) in [("origin.img", 0), ("nbd.sock", 2)] {
        let d = common::tempdir();
        let dir = d.path().join("demo");
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["demo", "--dir", dir.to_str().unwrap(), "--data", "16MiB", "--origin-seconds", "60"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + common::START_TIMEOUT;
        while !dir.join(wait_for).exists() {
            assert!(std::time::Instant::now() < deadline, "the demo never made {wait_for}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_secs(then));
        common::signal(child.id(), libc::SIGINT);
        let status = common::wait_timeout(&mut child, common::STOP_TIMEOUT).expect("the demo did not stop on SIGINT");
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(!status.success() && err.contains("interrupted"), "after {wait_for}: {status}: {err}");
        let check = strata(&["cache", "check", dir.join("cache.img").to_str().unwrap()]);
        let out = String::from_utf8_lossy(&check.stdout);
        assert!(out.contains("clean shutdown") && !out.contains("not shut down"), "{out}{}", stderr(&check));
    }
}

/// A stop asked for while a volume opens (a service restarted as it starts): the server lets
/// the cache finish opening (its origin's flushes take 2 s here), closes it cleanly and
/// exits 0, leaving it clean.
#[test]
fn a_stop_while_a_cache_opens_closes_it_cleanly() {
    let d = common::tempdir();
    let o = create(d.path(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (cache, origin) = (d.path().join("cache.img"), d.path().join("origin.img"));
    let spec = format!("vol=cache:{}?origin=fault:flush:delay=2s@{}", cache.display(), origin.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--unix", d.path().join("s.sock").to_str().unwrap(), &spec])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The server has begun opening the cache once it holds the file open.
    let file = cache.canonicalize().unwrap();
    let holds = || {
        let fds = std::fs::read_dir(format!("/proc/{}/fd", child.id())).into_iter().flatten().flatten();
        fds.filter_map(|fd| std::fs::read_link(fd.path()).ok()).any(|target| target == file)
    };
    let deadline = std::time::Instant::now() + common::START_TIMEOUT;
    while !holds() {
        assert!(std::time::Instant::now() < deadline, "the server never opened the cache");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    common::signal(child.id(), libc::SIGTERM);
    let status = common::wait_timeout(&mut child, common::STOP_TIMEOUT).expect("no exit after SIGTERM");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success() && err.contains("stopped cleanly"), "{status}: {err}");
    let check = strata(&["cache", "check", cache.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(out.contains("clean shutdown") && !out.contains("not shut down"), "{out}{}", stderr(&check));
}

/// `cache set` and `writecache set` send their settings as one message, which the volume
/// takes whole: every setting, or (one refused) none of them.
#[test]
fn set_takes_every_setting_or_none() {
    let d = common::tempdir();
    assert!(create(d.path(), &["--mode", "writeback"]).status.success());
    let (log, _) = create_log(d.path());
    let specs = vec![
        format!("vol=cache:{}", d.path().join("cache.img").display()),
        format!("log=writecache:{}", log.display()),
    ];
    let srv = common::Server::start_opts(
        tempfile::tempdir_in(d.path()).unwrap(),
        common::ServerOpts { admin: true, args: specs, ..Default::default() },
    );
    let admin = srv.admin.clone().unwrap();
    let set = |what: &str, vol: &str, settings: &[&str]| {
        let mut args = vec![what, "set", "--admin", &admin, vol];
        args.extend_from_slice(settings);
        strata(&args)
    };
    let target = |vol: &str| {
        let status = srv.status();
        let v = status["volumes"].as_array().unwrap().iter().find(|v| v["name"] == vol).unwrap().clone();
        v["target"].clone()
    };

    let o = set("cache", "vol", &["mode=writethrough", "readahead=0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "vol: mode writethrough; readahead 0 bytes\n");
    let before = target("vol");
    assert_eq!((before["mode"].as_str(), before["readahead_bytes"].as_u64()), (Some("writethrough"), Some(0)));
    for bad in [&["mode=writearound", "writeback-percent=500"][..], &["readahead=64KiB", "colour=red"], &["mode=x"]] {
        let o = set("cache", "vol", bad);
        assert!(!o.status.success(), "{bad:?}");
        let now = target("vol");
        assert_eq!(
            (&now["mode"], &now["readahead_bytes"], &now["writeback_percent"]),
            (&before["mode"], &before["readahead_bytes"], &before["writeback_percent"]),
            "{bad:?} changed the cache"
        );
    }

    // An action is not a setting: refused with its own reason, even beside settings.
    for bad in [&["flush=now"][..], &["mode=writeback", "invalidate=1"]] {
        let o = set("cache", "vol", bad);
        assert!(!o.status.success() && stderr(&o).contains("is an action"), "{bad:?}: {}", stderr(&o));
        assert_eq!(target("vol")["mode"], before["mode"], "{bad:?} changed the cache");
    }

    // Taken together, the watermarks are checked once both are in (one by one, a high
    // watermark of 30 under the default low one of 45 would be refused).
    let o = set("writecache", "log", &["high_watermark=30", "low_watermark=20"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = target("log")["tunables"].clone();
    assert_eq!((before["high_watermark"].as_u64(), before["low_watermark"].as_u64()), (Some(30), Some(20)));
    for bad in [&["max_age=7", "cleaner=maybe"][..], &["max_age=7", "low_watermark=90"]] {
        let o = set("writecache", "log", bad);
        assert!(!o.status.success(), "{bad:?}");
        assert_eq!(target("log")["tunables"], before, "{bad:?} changed the log");
    }
    srv.stop();
}
