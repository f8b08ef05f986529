//! Interoperability: real, unmodified NBD clients (qemu-img, qemu-io, nbdinfo, nbdcopy, fio's
//! nbd engine, nbdfuse + loop + ext4) against `strata serve` running as a child process.
//!
//! Each test starts its own server in its own temp dir, so they run in parallel.
//! The tools come from scripts/setup.sh (fio qemu-utils libnbd-bin fuse3 e2fsprogs).

mod common;

use common::*;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VOL_SIZE: u64 = 64 * MIB;

fn qemu_io(uri: &str, cmds: &[String]) -> std::process::Output {
    qemu_io_opts(uri, &[], cmds)
}

fn qemu_io_opts(uri: &str, opts: &[&str], cmds: &[String]) -> std::process::Output {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]).args(opts);
    for x in cmds {
        c.arg("-c").arg(x);
    }
    c.arg(uri);
    output(&mut c, CMD_TIMEOUT)
}

/// Runs qemu-io commands that must all succeed; returns stdout+stderr.
fn qemu_io_ok(uri: &str, cmds: &[String]) -> String {
    qemu_io_opts_ok(uri, &[], cmds)
}

fn qemu_io_opts_ok(uri: &str, opts: &[&str], cmds: &[String]) -> String {
    let o = qemu_io_opts(uri, opts, cmds);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "qemu-io {cmds:?} on {uri} failed: {}\n{text}", o.status);
    assert!(!text.contains("Pattern verification failed"), "qemu-io {cmds:?}: data mismatch:\n{text}");
    assert!(!text.contains("failed"), "qemu-io {cmds:?}: an operation failed:\n{text}");
    text
}

// ---------------------------------------------------------------------------------------------
// 1. qemu-img

#[test]
fn qemu_img_info_convert_compare() {
    let srv = Server::start_std();
    let d = srv.path().to_path_buf();
    let uri = srv.uri("vol");

    // info: the right virtual size.
    let info = json_in(&run_ok(Command::new("qemu-img").args(["info", "--output=json", &uri])));
    assert_eq!(info["virtual-size"].as_u64(), Some(VOL_SIZE), "qemu-img info: {info}");
    assert_eq!(info["format"], "raw", "qemu-img info: {info}");

    // Fill the export with junk so that zero runs in the image must really be written as zeroes.
    qemu_io_ok(&uri, &["write -P 0xee 0 64M".to_string()]);

    // A random image with zero runs (aligned and not), the size of the export.
    let mut img = random_bytes(VOL_SIZE as usize, 1);
    for (off, len) in [(8 * MIB, 4 * MIB), (40 * MIB + 512, MIB - 512), (63 * MIB, MIB)] {
        img[off as usize..(off + len) as usize].fill(0);
    }
    let img_path = d.join("src.img");
    std::fs::write(&img_path, &img).unwrap();

    run_ok(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&img_path).arg(&uri));
    let cmp = run_ok(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&img_path).arg(&uri));
    assert!(cmp.contains("Images are identical"), "qemu-img compare: {cmp}");

    let out_path = d.join("out.img");
    run_ok(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw"]).arg(&uri).arg(&out_path));
    let out = std::fs::read(&out_path).unwrap();
    assert_same_bytes(&out, &img, "qemu-img convert out of the export vs the original");

    // The comparison is real: one changed byte must make qemu-img compare report a mismatch.
    img[33 * MIB as usize + 1] ^= 0xff;
    std::fs::write(&img_path, &img).unwrap();
    let o = output(
        Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&img_path).arg(&uri),
        CMD_TIMEOUT,
    );
    assert_eq!(o.status.code(), Some(1), "qemu-img compare should find the changed byte: {o:?}");
}

// ---------------------------------------------------------------------------------------------
// 2. qemu-io patterns

/// What each byte of the export should hold: 0..=255, or UNKNOWN after a discard.
const UNKNOWN: u16 = 0x100;

/// Runs of equal expected bytes: (offset, length, value).
fn runs(model: &[u16]) -> Vec<(u64, u64, u16)> {
    let mut out = Vec::new();
    let mut start = 0usize;
    for i in 1..=model.len() {
        if i == model.len() || model[i] != model[start] {
            out.push((start as u64, (i - start) as u64, model[start]));
            start = i;
        }
    }
    out
}

/// qemu-io commands, the output lines they must produce, and the expected contents.
struct Plan {
    model: Vec<u16>,
    cmds: Vec<String>,
    expect: Vec<String>,
}

impl Plan {
    /// `write FLAGS -P pat off len`, or `write FLAGS -z off len` when `pat` is None.
    fn write(&mut self, flags: &str, pat: Option<u8>, off: u64, len: u64) {
        let v = match pat {
            Some(p) => {
                self.cmds.push(format!("write {flags} -P {p:#04x} {off} {len}"));
                p as u16
            }
            None => {
                self.cmds.push(format!("write {flags} -z {off} {len}"));
                0
            }
        };
        self.expect.push(format!("wrote {len}/{len} bytes at offset {off}"));
        self.model[off as usize..(off + len) as usize].fill(v);
    }
}

fn qemu_io_patterns_on(srv: &Server, export: &str) {
    let uri = srv.uri(export);
    let mut p = Plan { model: vec![0u16; VOL_SIZE as usize], cmds: Vec::new(), expect: Vec::new() };
    p.write("", Some(0x11), 0, 4096);
    p.write("", Some(0x22), 512, 512); // one sector, not 4 KiB aligned
    p.write("", Some(0x33), MIB + 512, MIB + 512); // 1 MiB+512 at 1 MiB+512
    p.write("", Some(0x44), 7, 13); // below the minimum block size: read-modify-write
    p.write("", Some(0x55), 20 * MIB, 33 * MIB); // above the 32 MiB request maximum
    p.write("-f", Some(0x66), 3 * MIB + 4096, 8192); // FUA
    p.write("", None, 24 * MIB, MIB + 512); // WRITE_ZEROES over data
    p.write("-u", None, 30 * MIB, 2 * MIB); // WRITE_ZEROES, may unmap
    p.write("", Some(0x88), VOL_SIZE - 512, 512); // the last sector
                                                  // Discard: contents are unspecified afterwards, until overwritten.
    p.cmds.push(format!("discard {} {}", 40 * MIB, MIB));
    p.expect.push(format!("discard {}/{} bytes at offset {}", MIB, MIB, 40 * MIB));
    p.model[(40 * MIB) as usize..(41 * MIB) as usize].fill(UNKNOWN);
    p.write("", Some(0x77), 40 * MIB + 512, 4096);
    p.cmds.push("flush".to_string());
    p.write("-f", Some(0x99), 50 * MIB, 64 * 1024); // FUA inside the 0x55 range
    let Plan { model, cmds, expect } = p;

    let text = qemu_io_ok(&uri, &cmds);
    for e in &expect {
        assert!(text.contains(e), "{export}: qemu-io did not report {e:?}:\n{text}");
    }

    // Read everything back on a new connection, one run of equal bytes at a time.
    let runs = runs(&model);
    assert!(runs.len() > 15, "model has {} runs", runs.len());
    let mut reads = Vec::new();
    let mut expect = Vec::new();
    for &(off, len, v) in &runs {
        if v == UNKNOWN {
            reads.push(format!("read {off} {len}"));
        } else {
            reads.push(format!("read -P {v:#04x} {off} {len}"));
        }
        expect.push(format!("read {len}/{len} bytes at offset {off}"));
    }
    let text = qemu_io_ok(&uri, &reads);
    for e in &expect {
        assert!(text.contains(e), "{export}: qemu-io did not report {e:?}:\n{text}");
    }

    // The verification is real: a wrong pattern must be reported.
    let o = qemu_io(&uri, &[format!("read -P 0x12 {} 4096", 20 * MIB)]);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("Pattern verification failed"), "{export}: wrong pattern not detected:\n{text}");
}

#[test]
fn qemu_io_patterns() {
    let srv = Server::start_std();
    qemu_io_patterns_on(&srv, "vol"); // O_DIRECT file, 512-byte minimum block
    qemu_io_patterns_on(&srv, "mem"); // RAM, 1-byte minimum block
}

// ---------------------------------------------------------------------------------------------
// 3. nbdinfo

/// `nbdinfo --map --json`, with adjacent extents of the same type merged.
fn map(uri: &str) -> Vec<(u64, u64, u64, String)> {
    let m = json_in(&run_ok(Command::new("nbdinfo").args(["--map", "--json", uri])));
    let mut out: Vec<(u64, u64, u64, String)> = Vec::new();
    for e in m.as_array().expect("map is an array") {
        let (off, len, ty) =
            (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap(), e["type"].as_u64().unwrap());
        let desc = e["description"].as_str().unwrap_or("").to_string();
        match out.last_mut() {
            Some(last) if last.2 == ty && last.0 + last.1 == off => last.1 += len,
            _ => out.push((off, len, ty, desc)),
        }
    }
    out
}

#[test]
fn nbdinfo_size_block_sizes_and_map() {
    let srv = Server::start_std();
    for export in ["vol", "mem"] {
        let uri = srv.uri(export);
        let info = json_in(&run_ok(Command::new("nbdinfo").args(["--json", &uri])));
        assert_eq!(info["protocol"], "newstyle-fixed", "{info}");
        assert_eq!(info["structured"], true, "{info}");
        let exports = info["exports"].as_array().expect("exports");
        assert_eq!(exports.len(), 1, "{info}");
        let e = &exports[0];
        assert_eq!(e["export-name"], export, "{e}");
        assert_eq!(e["export-size"].as_u64(), Some(VOL_SIZE), "{e}");
        for flag in ["can_multi_conn", "can_fua", "can_trim", "can_zero", "can_flush"] {
            assert_eq!(e[flag], true, "{export}: {flag} should be true: {e}");
        }
        assert_eq!(e["is_read_only"], false, "{e}");
        assert!(e["contexts"].as_array().unwrap().iter().any(|c| c == "base:allocation"), "{e}");
        let min = e["block_size_minimum"].as_u64().expect("block_size_minimum");
        let pref = e["block_size_preferred"].as_u64().expect("block_size_preferred");
        let max = e["block_size_maximum"].as_u64().expect("block_size_maximum");
        for b in [min, pref, max] {
            assert!(b.is_power_of_two(), "{export}: block size {b} is not a power of two: {e}");
        }
        assert!((1..=65536).contains(&min) && min <= pref && pref <= max, "{export}: block sizes {min}/{pref}/{max}");
        assert!(pref >= 512 && (MIB..=32 * MIB).contains(&max), "{export}: block sizes {min}/{pref}/{max}");
        if export == "vol" {
            // O_DIRECT needs at least a logical sector.
            assert!(min >= 512, "vol: O_DIRECT file advertises minimum block {min}");
        }
    }

    // --list: both exports, by name.
    let sock = srv.sock.as_ref().unwrap();
    let list = json_in(&run_ok(Command::new("nbdinfo").args([
        "--list",
        "--json",
        &format!("nbd+unix://?socket={}", sock.display()),
    ])));
    let names: BTreeSet<String> =
        list["exports"].as_array().unwrap().iter().map(|e| e["export-name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, BTreeSet::from(["vol".to_string(), "mem".to_string()]), "{list}");

    // --map: a fresh sparse file is one hole; after 1 MiB at 4 MiB, data exactly there.
    let uri = srv.uri("vol");
    assert_eq!(map(&uri), vec![(0, VOL_SIZE, 3, "hole,zero".to_string())], "fresh sparse file export");
    qemu_io_ok(&uri, &[format!("write -P 0x5a {} {}", 4 * MIB, MIB)]);
    assert_eq!(
        map(&uri),
        vec![
            (0, 4 * MIB, 3, "hole,zero".to_string()),
            (4 * MIB, MIB, 0, "data".to_string()),
            (5 * MIB, VOL_SIZE - 5 * MIB, 3, "hole,zero".to_string()),
        ],
        "map after writing 1 MiB at 4 MiB"
    );
    // The data really is there.
    qemu_io_ok(&uri, &[format!("read -P 0x5a {} {}", 4 * MIB, MIB), format!("read -P 0 {} {}", 5 * MIB, MIB)]);
}

/// `nbdinfo --map` of a cache and of a write log over sparse origins: the blocks they hold
/// are data, the rest the origin's holes, so `nbdcopy` and `qemu-img convert` skip them.
#[test]
fn nbdinfo_map_of_a_cache_and_a_write_log_shows_the_origins_holes() {
    let dir = tempdir();
    let mut args = Vec::new();
    for kind in ["cache", "writecache"] {
        let (origin, fast) = (dir.path().join(format!("{kind}-o.img")), dir.path().join(format!("{kind}-c.img")));
        run_ok(Command::new(env!("CARGO_BIN_EXE_strata")).args([
            kind,
            "create",
            "--origin",
            &format!("{}?size=16MiB", origin.display()),
            "--cache",
            &format!("{}?size=4MiB", fast.display()),
        ]));
        args.push(format!("{kind}={kind}:{}", fast.display()));
    }
    let srv = Server::start_opts(tempdir(), ServerOpts { args, ..Default::default() });
    for kind in ["cache", "writecache"] {
        let uri = srv.uri(kind);
        qemu_io_ok(&uri, &[format!("write -P 0x5a {} {}", 4 * MIB, MIB)]);
        let got = map(&uri);
        assert_eq!(got.first().map(|e| (e.0, e.1, e.2)), Some((0, 4 * MIB, 3)), "{kind}: {got:?}");
        assert_eq!(got.last().map(|e| (e.0, e.1, e.2)), Some((5 * MIB, 11 * MIB, 3)), "{kind}: {got:?}");
        assert_eq!(got.len(), 3, "{kind}: data exactly where written: {got:?}");
        qemu_io_ok(&uri, &[format!("read -P 0x5a {} {}", 4 * MIB, MIB), format!("read -P 0 0 {}", 4 * MIB)]);
    }
}

/// A file whose size is not a multiple of 512 (1,000,000 bytes): the advertised minimum block
/// divides the size, so clients that honour it reach the last bytes. `nbdcopy` and
/// `qemu-img convert` copy it whole, and a write of its last bytes reads back, the file's
/// size unchanged.
#[test]
fn a_file_of_odd_size_is_reachable_to_its_last_byte() {
    let dir = tempdir();
    let file = dir.path().join("odd.img");
    let data = random_bytes(1_000_000, 3);
    std::fs::write(&file, &data).unwrap();
    let srv = Server::start_opts(
        tempfile::tempdir_in(dir.path()).unwrap(),
        ServerOpts { args: vec![format!("odd={}", file.display())], ..Default::default() },
    );
    let uri = srv.uri("odd");
    let info = json_in(&run_ok(Command::new("nbdinfo").args(["--json", &uri])));
    let e = &info["exports"][0];
    assert_eq!(e["export-size"], 1_000_000, "{e}");
    assert_eq!(1_000_000 % e["block_size_minimum"].as_u64().unwrap(), 0, "{e}");
    let out = srv.path().join("copy.bin");
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&out));
    assert_same_bytes(&std::fs::read(&out).unwrap(), &data, "nbdcopy of the whole export");
    let converted = srv.path().join("converted.raw");
    run_ok(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw", &uri]).arg(&converted));
    // qemu's block layer counts whole sectors: its copy ends with the rest of the last one.
    let copy = std::fs::read(&converted).unwrap();
    assert_same_bytes(&copy[..data.len()], &data, "qemu-img convert of the whole export");
    assert!(copy.len() < data.len() + 512 && copy[data.len()..].iter().all(|&b| b == 0), "{}", copy.len());
    qemu_io_ok(&uri, &["write -P 0x77 999936 64".to_string(), "read -P 0x77 999936 64".to_string()]);
    srv.stop();
    let after = std::fs::read(&file).unwrap();
    assert_eq!(after.len(), 1_000_000, "the file's size");
    assert_same_bytes(&after[..999_936], &data[..999_936], "the file before its last 64 bytes");
    assert_eq!(&after[999_936..], &[0x77; 64][..], "its last 64 bytes");
}

// ---------------------------------------------------------------------------------------------
// 4. nbdcopy

#[test]
fn nbdcopy_both_ways_multi_conn() {
    let srv = Server::start_opts(
        tempdir(),
        ServerOpts {
            admin: true,
            args: vec!["vol={dir}/vol.img?size=64MiB".into(), "mem=mem:64MiB".into()],
            ..Default::default()
        },
    );
    let d = srv.path().to_path_buf();
    let src = random_bytes(32 * MIB as usize, 4);
    std::fs::write(d.join("src.img"), &src).unwrap();
    let before_flush = srv.op_counter("vol", "flush", "requests");

    let uri = srv.uri("vol");
    run_ok(Command::new("nbdcopy").args(["--connections=4", "--flush"]).arg(d.join("src.img")).arg(&uri));
    run_ok(Command::new("nbdcopy").args(["--connections=4", &uri]).arg(d.join("out.img")));
    let out = std::fs::read(d.join("out.img")).unwrap();
    assert_eq!(out.len() as u64, VOL_SIZE, "nbdcopy out of the export: size");
    assert_same_bytes(&out[..src.len()], &src, "nbdcopy round trip");
    assert!(out[src.len()..].iter().all(|&b| b == 0), "the rest of the fresh export should read as zeroes");

    // The server saw it: writes of at least the copied bytes, reads, and the flush.
    let writes = srv.op_counter("vol", "write", "requests");
    let wbytes = srv.op_counter("vol", "write", "bytes");
    let rbytes = srv.op_counter("vol", "read", "bytes");
    let flushes = srv.op_counter("vol", "flush", "requests");
    assert!(writes > 0 && wbytes >= 32 * MIB, "admin /status: {writes} writes, {wbytes} bytes");
    assert!(rbytes >= 32 * MIB, "admin /status: {rbytes} bytes read");
    assert!(flushes > before_flush, "admin /status: no flush after nbdcopy --flush");
    assert_eq!(srv.op_counter("vol", "write", "errors"), 0);
    assert_eq!(srv.op_counter("mem", "write", "requests"), 0, "writes landed on the wrong volume");
    let metrics = srv.admin_get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("strata_requests_total{volume=\"vol\",op=\"write\"} ") && !l.ends_with(" 0")),
        "/metrics has no write requests for vol:\n{metrics}"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. fio

/// Runs fio (in `dir`, where it keeps its verify state) and returns its JSON; asserts exit 0
/// and no job errors.
fn fio(dir: &Path, uri: &str, args: &[&str]) -> serde_json::Value {
    let mut c = Command::new("fio");
    c.current_dir(dir).args(["--ioengine=nbd", &format!("--uri={uri}"), "--output-format=json"]).args(args);
    let j = json_in(&run(&mut c, Duration::from_secs(60)));
    for job in j["jobs"].as_array().expect("fio jobs") {
        assert_eq!(job["error"], 0, "fio {args:?}: job error: {job}");
    }
    j
}

fn fio_bytes(j: &serde_json::Value, dir: &str) -> u64 {
    j["jobs"].as_array().unwrap().iter().map(|job| job[dir]["io_bytes"].as_u64().unwrap()).sum()
}

#[test]
fn fio_nbd_verify() {
    let srv = Server::start_std();
    let d = srv.path().to_path_buf();
    let uri = srv.uri("vol");
    let common =
        ["--name=v", "--rw=randwrite", "--bs=4k", "--size=16M", "--iodepth=16", "--verify=crc32c", "--randseed=4242"];

    // Write with verify headers, no verification yet...
    let w = fio(&d, &uri, &[&common[..], &["--do_verify=0"]].concat());
    assert_eq!(fio_bytes(&w, "write"), 16 * MIB, "fio write run");
    // ...then a second run (new connection) that only reads and verifies.
    let v = fio(&d, &uri, &[&common[..], &["--verify_only"]].concat());
    assert_eq!(fio_bytes(&v, "read"), 16 * MIB, "fio verify_only run must read everything back");

    // The verification is real: corrupt one block and verify_only must fail.
    qemu_io_ok(&uri, &[format!("write -P 0x77 {} 4096", 8 * MIB)]);
    let mut c = Command::new("fio");
    c.current_dir(&d)
        .args(["--ioengine=nbd", &format!("--uri={uri}"), "--output-format=json"])
        .args(common)
        .arg("--verify_only");
    let o = output(&mut c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("verify"), "fio verify_only missed a corrupted block: {o:?}");

    // Mixed random reads and writes with inline verification, deep queue, on the mem export,
    // with sizes from 512 bytes to 128 KiB.
    let m = fio(
        &d,
        &srv.uri("mem"),
        &[
            "--name=m",
            "--rw=randrw",
            "--bsrange=512-128k",
            "--size=16M",
            "--iodepth=16",
            "--verify=crc32c",
            "--randseed=7",
        ],
    );
    assert!(fio_bytes(&m, "write") > 0 && fio_bytes(&m, "read") > 0, "fio randrw moved no data: {m}");
    // And sequential verify at queue depth 1 on the file.
    let s = fio(
        &d,
        &uri,
        &[
            "--name=s",
            "--rw=write",
            "--bs=64k",
            "--offset=32M",
            "--size=16M",
            "--iodepth=1",
            "--verify=crc32c",
            "--do_verify=1",
        ],
    );
    assert_eq!(fio_bytes(&s, "write"), 16 * MIB);
    assert_eq!(fio_bytes(&s, "read"), 16 * MIB, "fio do_verify=1 must read back what it wrote");
}

// ---------------------------------------------------------------------------------------------
// 6. ext4 over nbdfuse + loop

/// Undoes whatever of mount / loop / nbdfuse was set up, even when the test panics.
struct FuseLoop {
    fuse_dir: PathBuf,
    nbdfuse: Option<Child>,
    loopdev: Option<String>,
    mounted: Option<PathBuf>,
}

const CLEANUP_TIMEOUT: Duration = Duration::from_secs(20);

impl FuseLoop {
    fn umount(&mut self) -> Result<(), String> {
        if let Some(m) = self.mounted.take() {
            let o = try_output(cmd("umount").arg(&m), CLEANUP_TIMEOUT)?;
            if !o.status.success() {
                // Leave nothing behind: detach lazily, then report.
                let _ = try_output(cmd("umount").arg("-l").arg(&m), CLEANUP_TIMEOUT);
                return Err(format!("umount {}: {}", m.display(), String::from_utf8_lossy(&o.stderr)));
            }
        }
        Ok(())
    }

    fn detach(&mut self) -> Result<(), String> {
        if let Some(l) = self.loopdev.take() {
            let o = try_output(cmd("losetup").args(["-d", &l]), CLEANUP_TIMEOUT)?;
            if !o.status.success() {
                return Err(format!("losetup -d {l}: {}", String::from_utf8_lossy(&o.stderr)));
            }
        }
        Ok(())
    }

    fn unfuse(&mut self) -> Result<(), String> {
        if let Some(mut c) = self.nbdfuse.take() {
            let o = try_output(cmd("fusermount3").arg("-u").arg(&self.fuse_dir), CLEANUP_TIMEOUT);
            let ok = matches!(&o, Ok(o) if o.status.success());
            if !ok {
                let _ = try_output(cmd("fusermount3").arg("-uz").arg(&self.fuse_dir), CLEANUP_TIMEOUT);
            }
            let st = wait_timeout(&mut c, CLEANUP_TIMEOUT);
            if st.is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
            if !ok {
                return Err(format!("fusermount3 -u {}: {o:?}", self.fuse_dir.display()));
            }
            match st {
                Some(s) if s.success() => {}
                other => return Err(format!("nbdfuse did not exit cleanly after unmount: {other:?}")),
            }
        }
        Ok(())
    }
}

impl Drop for FuseLoop {
    fn drop(&mut self) {
        let results = [self.umount(), self.detach(), self.unfuse()];
        for r in results {
            if let Err(e) = r {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

fn losetup(file: &Path) -> String {
    let dev = run(cmd("losetup").args(["--find", "--show", "--direct-io=off"]).arg(file), Duration::from_secs(20));
    let dev = dev.trim().to_string();
    assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
    dev
}

fn mount(dev: &str, dir: &Path) {
    run(cmd("mount").args(["-t", "ext4", dev]).arg(dir), Duration::from_secs(30));
}

#[test]
fn ext4_over_nbdfuse_and_loop() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: ext4_over_nbdfuse_and_loop needs root (losetup, mount)");
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: ext4_over_nbdfuse_and_loop: /dev/fuse is missing");
        return;
    }
    for tool in ["losetup", "nbdfuse", "mkfs.ext4", "e2fsck", "fusermount3", "mount", "umount", "debugfs"] {
        if !have(tool) {
            eprintln!("SKIP: ext4_over_nbdfuse_and_loop: {tool} is not installed (see scripts/setup.sh)");
            return;
        }
    }
    let srv = Server::start(&["vol={dir}/vol.img?size=64MiB"]);
    let d = srv.path().to_path_buf();
    let (fuse_dir, mnt) = (d.join("fuse"), d.join("mnt"));
    std::fs::create_dir(&fuse_dir).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let uri = srv.uri("vol");

    // Declared after the server, so it is dropped (cleaned up) first.
    let log = std::fs::File::create(d.join("nbdfuse.log")).unwrap();
    let child = cmd("nbdfuse")
        .arg(&fuse_dir)
        .arg(&uri)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting nbdfuse");
    let mut g = FuseLoop { fuse_dir: fuse_dir.clone(), nbdfuse: Some(child), loopdev: None, mounted: None };
    let nbd_file = fuse_dir.join("nbd");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !nbd_file.exists() {
        if let Some(st) = g.nbdfuse.as_mut().unwrap().try_wait().unwrap() {
            g.nbdfuse = None;
            panic!("nbdfuse exited ({st}): {}", std::fs::read_to_string(d.join("nbdfuse.log")).unwrap_or_default());
        }
        assert!(Instant::now() < deadline, "nbdfuse did not create {} within 15 s", nbd_file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::metadata(&nbd_file).unwrap().len(), VOL_SIZE, "nbdfuse file size");

    let dev = losetup(&nbd_file);
    g.loopdev = Some(dev.clone());
    run(cmd("mkfs.ext4").args(["-q", &dev]), Duration::from_secs(60));
    mount(&dev, &mnt);
    g.mounted = Some(mnt.clone());

    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.bin", random_bytes(3 * MIB as usize, 61)),
        ("b.bin", random_bytes(5 * MIB as usize + 4321, 62)),
        ("sub/c.bin", random_bytes(MIB as usize + 123, 63)),
        ("small.txt", b"strata over nbdfuse over loop\n".repeat(37)),
    ];
    std::fs::create_dir(mnt.join("sub")).unwrap();
    for (name, data) in &files {
        let mut f = std::fs::File::create(mnt.join(name)).unwrap();
        f.write_all(data).unwrap();
        f.sync_all().unwrap();
    }
    run(&mut cmd("sync"), Duration::from_secs(30));
    g.umount().unwrap();
    run(cmd("e2fsck").args(["-fn", &dev]), Duration::from_secs(60));

    // A fresh loop device (no cached blocks) and a second mount: the files are intact.
    g.detach().unwrap();
    let dev = losetup(&nbd_file);
    g.loopdev = Some(dev.clone());
    mount(&dev, &mnt);
    g.mounted = Some(mnt.clone());
    for (name, data) in &files {
        let got = std::fs::read(mnt.join(name)).unwrap();
        assert_same_bytes(&got, data, &format!("{name} after remount"));
    }
    g.umount().unwrap();
    g.detach().unwrap();
    g.unfuse().unwrap();

    // Everything reached the server: copy the export out and check the copy on its own.
    let copy = d.join("copy.img");
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&copy));
    run(cmd("e2fsck").arg("-fn").arg(&copy), Duration::from_secs(60));
    let dumped = d.join("dumped.bin");
    run(cmd("debugfs").arg("-R").arg(format!("dump /b.bin {}", dumped.display())).arg(&copy), Duration::from_secs(30));
    assert_same_bytes(&std::fs::read(&dumped).unwrap(), &files[1].1, "b.bin read by debugfs from a copy of the export");
}

// ---------------------------------------------------------------------------------------------
// 7. read-only

/// A minimal NBD client (fixed newstyle, EXPORT_NAME, simple replies) that sends whatever it
/// is told, so the server's own checks are tested rather than the client's.
struct RawNbd {
    s: UnixStream,
    size: u64,
    flags: u16,
    handle: u64,
}

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const EPERM: u32 = 1;
const TFLAG_READ_ONLY: u16 = 1 << 1;

impl RawNbd {
    fn connect(sock: &Path, export: &str) -> RawNbd {
        let mut s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(u64::from_be_bytes(hello[0..8].try_into().unwrap()), NBDMAGIC);
        assert_eq!(u64::from_be_bytes(hello[8..16].try_into().unwrap()), IHAVEOPT);
        let server_flags = u16::from_be_bytes(hello[16..18].try_into().unwrap());
        assert!(server_flags & 1 != 0, "server is not fixed newstyle");
        let no_zeroes = server_flags & 2 != 0;
        let mut msg = Vec::new();
        msg.extend_from_slice(&(1u32 | if no_zeroes { 2 } else { 0 }).to_be_bytes());
        msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&1u32.to_be_bytes()); // OPT_EXPORT_NAME
        msg.extend_from_slice(&(export.len() as u32).to_be_bytes());
        msg.extend_from_slice(export.as_bytes());
        s.write_all(&msg).unwrap();
        let mut info = vec![0u8; if no_zeroes { 10 } else { 134 }];
        s.read_exact(&mut info).unwrap();
        let size = u64::from_be_bytes(info[0..8].try_into().unwrap());
        let flags = u16::from_be_bytes(info[8..10].try_into().unwrap());
        RawNbd { s, size, flags, handle: 0 }
    }

    /// Sends one request and returns (error, payload of a successful read).
    fn request(&mut self, kind: u16, offset: u64, len: u32, data: &[u8]) -> (u32, Vec<u8>) {
        self.handle += 1;
        let mut msg = Vec::with_capacity(28 + data.len());
        msg.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        msg.extend_from_slice(&0u16.to_be_bytes());
        msg.extend_from_slice(&kind.to_be_bytes());
        msg.extend_from_slice(&self.handle.to_be_bytes());
        msg.extend_from_slice(&offset.to_be_bytes());
        msg.extend_from_slice(&len.to_be_bytes());
        msg.extend_from_slice(data);
        self.s.write_all(&msg).unwrap();
        if kind == CMD_DISC {
            return (0, Vec::new());
        }
        let mut reply = [0u8; 16];
        self.s.read_exact(&mut reply).expect("reading a simple reply");
        assert_eq!(u32::from_be_bytes(reply[0..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC, "reply magic");
        let err = u32::from_be_bytes(reply[4..8].try_into().unwrap());
        assert_eq!(u64::from_be_bytes(reply[8..16].try_into().unwrap()), self.handle, "reply handle");
        let mut payload = Vec::new();
        if kind == CMD_READ && err == 0 {
            payload = vec![0u8; len as usize];
            self.s.read_exact(&mut payload).unwrap();
        }
        (err, payload)
    }

    /// Sends a request without waiting for its reply (pipelining).
    fn send(&mut self, kind: u16, offset: u64, data: &[u8], out: &mut Vec<u8>) -> u64 {
        self.handle += 1;
        out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&self.handle.to_be_bytes());
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        self.handle
    }

    /// Simple replies (error, handle) to non-read requests that arrive before `deadline`, at
    /// most `max`, or until the server closes the connection.
    fn replies_until(&mut self, pending: &mut Vec<u8>, deadline: Instant, max: usize) -> (Vec<(u32, u64)>, bool) {
        let mut out = Vec::new();
        let mut eof = false;
        loop {
            while pending.len() >= 16 && out.len() < max {
                let r: Vec<u8> = pending.drain(..16).collect();
                assert_eq!(u32::from_be_bytes(r[0..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC, "reply magic");
                out.push((
                    u32::from_be_bytes(r[4..8].try_into().unwrap()),
                    u64::from_be_bytes(r[8..16].try_into().unwrap()),
                ));
            }
            let now = Instant::now();
            if out.len() >= max || now >= deadline {
                break;
            }
            self.s.set_read_timeout(Some(deadline - now)).unwrap();
            let mut buf = [0u8; 4096];
            match self.s.read(&mut buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    eof = true;
                    break;
                }
                Err(e) => panic!("reading replies: {e}"),
            }
        }
        (out, eof)
    }
}

#[test]
fn read_only_export_refuses_writes() {
    let dir = tempdir();
    // A volume file with known content: 1 MiB of 0x5a, then zeroes.
    let mut content = vec![0u8; VOL_SIZE as usize];
    content[..MIB as usize].fill(0x5a);
    std::fs::write(dir.path().join("vol.img"), &content).unwrap();
    let srv = Server::start_opts(
        dir,
        ServerOpts {
            args: vec!["--read-only".into(), "vol={dir}/vol.img?size=64MiB".into(), "mem=mem:64MiB".into()],
            ..Default::default()
        },
    );
    let uri = srv.uri("vol");

    let info = json_in(&run_ok(Command::new("nbdinfo").args(["--json", &uri])));
    assert_eq!(info["exports"][0]["is_read_only"], true, "{info}");
    let mem_info = json_in(&run_ok(Command::new("nbdinfo").args(["--json", &srv.uri("mem")])));
    assert_eq!(mem_info["exports"][0]["is_read_only"], true, "--read-only covers every volume: {mem_info}");

    // Real clients: reads work, writes fail.
    let text = qemu_io_opts_ok(&uri, &["-r"], &["read -P 0x5a 0 1M".into(), "read -P 0 1M 1M".into()]);
    assert!(text.contains("read 1048576/1048576 bytes at offset 1048576"), "{text}");
    let o = qemu_io(&uri, &["write -P 0x11 0 4096".into()]);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(
        !o.status.success() || text.contains("failed") || text.contains("denied"),
        "qemu-io write to a read-only export succeeded:\n{text}"
    );
    assert!(!text.contains("wrote 4096/4096"), "qemu-io claims a write to a read-only export:\n{text}");
    std::fs::write(srv.path().join("src.img"), vec![0x11u8; MIB as usize]).unwrap();
    let o = output(Command::new("nbdcopy").arg(srv.path().join("src.img")).arg(&uri), CMD_TIMEOUT);
    assert!(!o.status.success(), "nbdcopy into a read-only export succeeded");

    // qemu and libnbd refuse on the client side already; the server must refuse as well.
    let mut c = RawNbd::connect(srv.sock.as_ref().unwrap(), "vol");
    assert_eq!(c.size, VOL_SIZE);
    assert!(c.flags & TFLAG_READ_ONLY != 0, "READ_ONLY transmission flag missing: {:#x}", c.flags);
    let (err, _) = c.request(CMD_WRITE, 0, 4096, &[0x11u8; 4096]);
    assert_eq!(err, EPERM, "server answered a write to a read-only export with error {err}");
    let (err, _) = c.request(CMD_WRITE_ZEROES, 0, 4096, &[]);
    assert_eq!(err, EPERM, "WRITE_ZEROES on a read-only export: error {err}");
    let (err, _) = c.request(CMD_TRIM, 0, 4096, &[]);
    assert_eq!(err, EPERM, "TRIM on a read-only export: error {err}");
    // The refused write's payload was consumed: the connection is still in step.
    let (err, data) = c.request(CMD_READ, 0, 4096, &[]);
    assert_eq!(err, 0);
    assert!(data.iter().all(|&b| b == 0x5a), "data changed by refused writes");
    c.request(CMD_DISC, 0, 0, &[]);

    qemu_io_opts_ok(&uri, &["-r"], &["read -P 0x5a 0 1M".into()]);
    let mut srv = srv;
    srv.stop_checked();
    let after = std::fs::read(srv.path().join("vol.img")).unwrap();
    assert_same_bytes(&after, &content, "read-only volume file after the test");
}

// ---------------------------------------------------------------------------------------------
// 8. config file, TCP

/// The TCP sockets `pid` is listening on, as "a.b.c.d:port" (or "[v6 hex]:port").
fn listening_tcp(pid: u32) -> BTreeSet<String> {
    let mut inodes = BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if let Ok(t) = std::fs::read_link(fd.path()) {
            let t = t.to_string_lossy().into_owned();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(i.to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(f[9]) {
                continue;
            }
            let (addr, port) = f[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            let a = if addr.len() == 8 {
                let n = u32::from_str_radix(addr, 16).unwrap();
                std::net::Ipv4Addr::from(n.to_le_bytes()).to_string()
            } else {
                format!("[{addr}]")
            };
            out.insert(format!("{a}:{port}"));
        }
    }
    out
}

#[test]
fn config_file_and_tcp() {
    let dir = tempdir();
    let (port, admin) = (free_port(), free_port());
    let toml = format!(
        "tcp = \"127.0.0.1:{port}\"\nadmin = \"127.0.0.1:{admin}\"\n\n\
         [[volume]]\nname = \"cfgvol\"\nspec = \"mem:64MiB\"\n\n\
         [[volume]]\nname = \"cfgro\"\nspec = \"{}/ro.img?size=8MiB\"\nread_only = true\n",
        dir.path().display()
    );
    let cfg = dir.path().join("strata.toml");
    std::fs::write(&cfg, toml).unwrap();
    let mut srv = Server::start_opts(
        dir,
        ServerOpts {
            unix: false,
            args: vec!["--config".into(), cfg.to_string_lossy().into_owned()],
            wait_for: Some(Listen::Tcp(format!("127.0.0.1:{admin}"))),
            ..Default::default()
        },
    );
    srv.admin = Some(format!("127.0.0.1:{admin}"));
    // The admin port is up; the NBD port comes up first (see serve.rs), but wait anyway.
    let deadline = Instant::now() + START_TIMEOUT;
    while !nbd_greets_tcp(&format!("127.0.0.1:{port}")) {
        assert!(Instant::now() < deadline, "NBD TCP port {port} never greeted:\n{}", srv.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }

    let info = json_in(&run_ok(Command::new("nbdinfo").args(["--json", &format!("nbd://127.0.0.1:{port}/cfgvol")])));
    assert_eq!(info["exports"][0]["export-size"].as_u64(), Some(VOL_SIZE), "{info}");
    assert_eq!(info["exports"][0]["is_read_only"], false, "{info}");
    let info = json_in(&run_ok(Command::new("nbdinfo").args(["--json", &format!("nbd://127.0.0.1:{port}/cfgro")])));
    assert_eq!(info["exports"][0]["export-size"].as_u64(), Some(8 * MIB), "{info}");
    assert_eq!(info["exports"][0]["is_read_only"], true, "per-volume read_only from the config: {info}");
    // The first volume is the default export.
    let info = json_in(&run_ok(Command::new("nbdinfo").args(["--json", &format!("nbd://127.0.0.1:{port}")])));
    assert_eq!(info["exports"][0]["export-size"].as_u64(), Some(VOL_SIZE), "default export: {info}");
    // Data over TCP.
    qemu_io_ok(
        &format!("nbd://127.0.0.1:{port}/cfgvol"),
        &["write -P 0x3c 1M 64k".into(), "read -P 0x3c 1M 64k".into()],
    );
    let st = srv.status();
    let names: Vec<&str> = st["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cfgvol", "cfgro"], "admin /status from the config's admin address");

    assert_eq!(
        listening_tcp(srv.pid()),
        BTreeSet::from([format!("127.0.0.1:{port}"), format!("127.0.0.1:{admin}")]),
        "listening sockets of the server"
    );
    drop(srv);

    // A port without a host binds loopback, not every interface.
    let dir = tempdir();
    let port = free_port();
    let cfg = dir.path().join("strata.toml");
    std::fs::write(&cfg, format!("tcp = \"{port}\"\n\n[[volume]]\nname = \"m\"\nspec = \"mem:1MiB\"\n")).unwrap();
    let srv = Server::start_opts(
        dir,
        ServerOpts {
            unix: false,
            args: vec!["--config".into(), cfg.to_string_lossy().into_owned()],
            wait_for: Some(Listen::Nbd(format!("127.0.0.1:{port}"))),
            ..Default::default()
        },
    );
    assert_eq!(listening_tcp(srv.pid()), BTreeSet::from([format!("127.0.0.1:{port}")]), "tcp = \"{port}\"");
    let info = json_in(&run_ok(Command::new("nbdinfo").args(["--json", &format!("nbd://127.0.0.1:{port}/m")])));
    assert_eq!(info["exports"][0]["export-size"].as_u64(), Some(MIB), "{info}");
}

// ---------------------------------------------------------------------------------------------
// 9. SIGTERM under load

#[test]
fn sigterm_finishes_inflight_and_exits_0() {
    let mut srv = Server::start_opts(
        tempdir(),
        ServerOpts { admin: true, args: vec!["vol={dir}/vol.img?size=64MiB".into()], ..Default::default() },
    );
    let d = srv.path().to_path_buf();
    let log = std::fs::File::create(d.join("fio.log")).unwrap();
    let mut fio = Command::new("fio")
        .current_dir(&d)
        .args([
            "--name=load",
            "--ioengine=nbd",
            &format!("--uri={}", srv.uri("vol")),
            "--rw=randwrite",
            "--bs=4k",
            "--size=64M",
            "--iodepth=32",
            "--time_based",
            "--runtime=30",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting fio");

    // Wait until writes are flowing, then stop the server mid-run.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if srv.op_counter("vol", "write", "requests") >= 2000 {
            break;
        }
        if let Some(st) = fio.try_wait().unwrap() {
            panic!("fio exited early ({st}): {}", std::fs::read_to_string(d.join("fio.log")).unwrap_or_default());
        }
        if Instant::now() >= deadline {
            let _ = fio.kill();
            let _ = fio.wait();
            panic!("fio never got going:\n{}", std::fs::read_to_string(d.join("fio.log")).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(srv.status()["connections"].as_u64().unwrap() >= 1, "fio's connection is not live");
    let t = Instant::now();
    let (st, err) = srv.terminate();
    let took = t.elapsed();
    let fio_st = wait_timeout(&mut fio, Duration::from_secs(20));
    if fio_st.is_none() {
        let _ = fio.kill();
        let _ = fio.wait();
    }
    assert!(st.success(), "server exited with {st} after SIGTERM under load\n--- server stderr ---\n{err}");
    assert!(err.contains("shutting down"), "server stderr:\n{err}");
    assert!(err.contains("stopped cleanly"), "server stderr:\n{err}");
    assert!(took < Duration::from_secs(10), "server took {took:?} to stop");
    assert!(fio_st.is_some(), "fio still running 20 s after the server stopped");
    assert!(!srv.sock.as_ref().unwrap().exists(), "socket left behind");
    eprintln!("server stopped in {took:?}; fio exited with {fio_st:?}");

    // Precisely: requests the server has read when SIGTERM arrives get their replies, and the
    // acknowledged writes are on disk. An emulated disk (one request at a time, >= 50 ms each)
    // keeps most of 64 pipelined writes in flight when the signal arrives.
    const N: u64 = 64;
    let mut srv = Server::start(&["slow=hdd:{dir}/h.img?size=64MiB&seek_min_ms=50&seek_max_ms=60"]);
    let mut c = RawNbd::connect(srv.sock.as_ref().unwrap(), "slow");
    let block = |i: u64| vec![(i as u8).wrapping_mul(7).wrapping_add(1); 4096];
    let offset = |i: u64| (i * 997 % 16000) * 4096; // scattered, distinct, < 64 MiB
    let mut burst = Vec::new();
    for i in 0..N {
        c.send(CMD_WRITE, offset(i), &block(i), &mut burst);
    }
    c.s.write_all(&burst).unwrap();
    let mut pending = Vec::new();
    let (mut replies, _) = c.replies_until(&mut pending, Instant::now() + Duration::from_secs(20), 1);
    assert_eq!(replies.len(), 1, "no reply from the emulated disk within 20 s");
    // Give the server time to read every request while the disk is busy (a second, against
    // the disk's 3 s or more for all of them, so a loaded machine reads them too), then stop it.
    let (more, _) = c.replies_until(&mut pending, Instant::now() + Duration::from_secs(1), N as usize);
    replies.extend(more);
    let before = replies.len();
    assert!(before < N as usize, "all {N} writes finished before SIGTERM; the test proves nothing");
    let (st, err) = srv.terminate();
    assert!(st.success() && err.contains("stopped cleanly"), "server exit {st} with writes in flight:\n{err}");
    let (more, eof) = c.replies_until(&mut pending, Instant::now() + Duration::from_secs(10), N as usize);
    replies.extend(more);
    assert!(eof || replies.len() == N as usize, "connection neither completed nor closed");
    let handles: BTreeSet<u64> = replies.iter().map(|r| r.1).collect();
    assert_eq!(handles.len(), replies.len(), "duplicate replies: {replies:?}");
    assert!(replies.iter().all(|r| r.0 == 0), "failed writes at shutdown: {replies:?}");
    assert_eq!(
        replies.len(),
        N as usize,
        "{before} writes were answered before SIGTERM, only {} of {N} in all: in-flight writes were dropped\n{err}",
        replies.len()
    );
    // The acknowledged writes are there after a restart.
    let check = Server::start(&[&format!("v={}/h.img", srv.path().display())]);
    let reads: Vec<String> = (0..N).map(|i| format!("read -P {:#04x} {} 4096", block(i)[0], offset(i))).collect();
    qemu_io_ok(&check.uri("v"), &reads);
    eprintln!("{before} of {N} pipelined writes answered before SIGTERM, all {N} answered and durable");
}
