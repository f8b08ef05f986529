//! The benchmark suite at a tiny scale: `bench/run.py all --scale 0.01` against the binary
//! under test must run every experiment, stop everything it started, and leave a
//! well-formed summary.json, CSV files and PNG plots with the expected series. No timing
//! is judged here: figures belong to benchmarks, never to tests.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCALE: &str = "0.01";
/// Only a hang guard: the whole suite at this scale takes 2 to 4 minutes on 2 cores beside
/// the rest of the test suite (nextest gives up on a test after 10).
const TIMEOUT: Duration = Duration::from_secs(480);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn have(prog: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].iter().map(PathBuf::from))
        .any(|d| d.join(prog).is_file())
}

/// Why the git experiment cannot run here (it must then report itself skipped): what ext4
/// through nbdfuse and loop needs, and git.
fn git_unavailable() -> Option<String> {
    strata::crashtest::ext4::unavailable().or_else(|| (!have("git")).then(|| "git is not installed".into()))
}

fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let header: Vec<String> =
        lines.next().unwrap_or_else(|| panic!("{} is empty", path.display())).split(',').map(String::from).collect();
    let rows: Vec<Vec<String>> = lines.map(|l| l.split(',').map(String::from).collect()).collect();
    assert!(!rows.is_empty(), "{} has a header but no rows", path.display());
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(
            r.len(),
            header.len(),
            "{} row {} has {} fields, the header {}",
            path.display(),
            i + 2,
            r.len(),
            header.len()
        );
    }
    (header, rows)
}

fn column(header: &[String], rows: &[Vec<String>], name: &str) -> Vec<String> {
    let i = header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name} in {header:?}"));
    rows.iter().map(|r| r[i].clone()).collect()
}

fn check_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{} is not a PNG", path.display());
    assert!(bytes.len() > 5_000, "{} is suspiciously small ({} bytes)", path.display(), bytes.len());
    assert!(bytes.len() < 400_000, "{} is too large for the docs ({} bytes)", path.display(), bytes.len());
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
}

#[test]
fn the_benchmark_suite_runs_at_a_tiny_scale() {
    for tool in ["python3", "fio", "nbdkit"] {
        if !have(tool) {
            eprintln!("SKIP: the_benchmark_suite_runs_at_a_tiny_scale: {tool} is not installed (see scripts/setup.sh)");
            return;
        }
    }
    let mpl = Command::new("python3").args(["-c", "import matplotlib"]).output().unwrap();
    if !mpl.status.success() {
        eprintln!("SKIP: the_benchmark_suite_runs_at_a_tiny_scale: matplotlib is not installed (see scripts/setup.sh)");
        return;
    }
    let tmp = tempfile::Builder::new().prefix("bench").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = tmp.path().join("out");
    let started = Instant::now();
    let mut child = Command::new("python3")
        .arg(repo_root().join("bench/run.py"))
        .args(["all", "--scale", SCALE, "--out"])
        .arg(&out)
        .env("STRATA_BIN", env!("CARGO_BIN_EXE_strata"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting bench/run.py");
    let mut stderr_pipe = child.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > TIMEOUT {
            // run.py stops everything it started on SIGTERM.
            // SAFETY: plain syscall on our own child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(30));
            let _ = child.kill();
            let _ = child.wait();
            panic!("bench/run.py did not finish within {TIMEOUT:?}:\n{}", errs.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = errs.join().unwrap();
    eprintln!("{log}");
    eprintln!("bench/run.py all --scale {SCALE}: {:.1} s", started.elapsed().as_secs_f64());
    assert!(status.success(), "bench/run.py failed ({status}):\n{log}");

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary.json"))
            .expect("summary.json parses");
    assert_eq!(summary["scale"].as_f64(), Some(0.01));
    let exps = &summary["experiments"];
    let mut got = names(exps);
    got.sort();
    assert_eq!(
        got,
        [
            "connections",
            "git",
            "metadata",
            "mixed",
            "overhead",
            "policies",
            "qos",
            "remote",
            "small-cache",
            "thin",
            "warmup",
            "writeback",
            "writelog"
        ]
    );
    // thin: every ratio measured (qcow2's needs qemu-nbd), the pool checked clean at the end.
    let t = &exps["thin"];
    for (name, v) in t["ratios"].as_object().unwrap_or_else(|| panic!("thin: no ratios: {t}")) {
        let optional = name.contains("qcow2") && !have("qemu-nbd");
        assert!(optional || v.as_f64().is_some_and(|x| x > 0.0), "thin: {name}: {v}");
    }
    assert_eq!(t["thin_check_ok"].as_bool(), Some(true), "thin: strata thin check after the run: {t}");

    // writelog: the books' memory within budget, every other figure a positive number.
    let w = &exps["writelog"];
    assert!(w["memory"]["target_memory_bytes_per_block"].as_f64().is_some_and(|b| b > 0.0 && b <= 40.0), "{w}");
    for (part, key) in [("commit", "ratio"), ("recovery", "seconds"), ("drain", "ratio"), ("stream", "rate_ratio")] {
        assert!(w[part][key].as_f64().is_some_and(|x| x > 0.0), "writelog: {part}.{key}: {w}");
    }
    // Recovery found the dirty blocks (some may be written back before the count is read,
    // and one batch may be between the two counters).
    let (before, found) = (w["recovery"]["dirty_blocks"].as_f64(), w["recovery"]["recovered_dirty_blocks"].as_f64());
    assert!(before.zip(found).is_some_and(|(b, f)| f >= b - 256.0 && f <= b), "writelog recovery: {w}");

    // Every experiment: status, and every file it lists exists and is well formed.
    let (git_skip, ext4_skip) = (git_unavailable(), strata::crashtest::ext4::unavailable());
    for (name, e) in exps.as_object().unwrap() {
        let status = e["status"].as_str().unwrap_or("?");
        let skip = match name.as_str() {
            "git" => &git_skip,
            "metadata" => &ext4_skip,
            _ => &None,
        };
        if let Some(why) = skip {
            eprintln!("SKIP: the {name} experiment needs what is missing here: {why}");
            assert_eq!(status, "skipped", "{name} should report itself skipped: {e}");
            continue;
        }
        if name == "metadata" {
            // Every configuration, phase and process count, each a positive rate.
            let rates = e["rates"].as_object().unwrap_or_else(|| panic!("metadata: no rates: {e}"));
            assert_eq!(rates.len(), 4 * 3 * 3, "metadata: {e}");
            assert!(rates.values().all(|r| r["mean"].as_f64().is_some_and(|x| x > 0.0)), "metadata: {e}");
        }
        assert_eq!(status, "ok", "{name}: {}", e["error"]);
        let dir = out.join(name.replace('-', "_"));
        assert!(dir.join("summary.json").exists(), "{name}/summary.json");
        let files = e["files"].as_array().unwrap_or_else(|| panic!("{name} lists no files"));
        assert!(files.iter().any(|f| f.as_str().unwrap().ends_with(".png")), "{name} has no plot");
        for f in files {
            let p = dir.join(f.as_str().unwrap());
            if p.extension().unwrap() == "png" {
                check_png(&p);
            } else {
                read_csv(&p);
            }
        }
    }

    // warmup: every series measured, IOPS over time for each, hit ratio for strata's.
    let w = &exps["warmup"];
    let series = [
        "HDD origin alone",
        "fast file alone",
        "strata warm (all hits)",
        "strata empty cache",
        "strata cache full of junk",
        "nbdkit cache filter",
        "HDD origin alone 50/50",
        "strata writeback 50/50",
    ];
    for s in series {
        let iops = w["series"][s]["avg_iops"].as_f64().unwrap_or_else(|| panic!("warmup: no IOPS for {s}"));
        assert!(iops > 0.0, "warmup: {s}: {iops} IOPS");
    }
    for s in ["strata warm (all hits)", "strata empty cache", "strata cache full of junk", "strata writeback 50/50"] {
        let h = w["series"][s]["hit_ratio_total"].as_f64().unwrap_or_else(|| panic!("warmup: no hit ratio for {s}"));
        assert!((0.0..=1.0).contains(&h), "warmup: {s}: hit ratio {h}");
    }
    assert!(w["derived"]["warm_over_fast_file"].as_f64().is_some());
    let (h, rows) = read_csv(&out.join("warmup/iops.csv"));
    let in_csv = column(&h, &rows, "series");
    for s in series {
        assert!(in_csv.iter().any(|x| x == s), "warmup/iops.csv has no rows for {s}");
    }
    let (h, rows) = read_csv(&out.join("warmup/hit_ratio.csv"));
    assert!(column(&h, &rows, "series").iter().any(|x| x == "strata empty cache"));

    // small-cache: both live runs and the simulated policies, OPT among them.
    let sc = &exps["small-cache"];
    let mut live = names(&sc["live"]);
    live.sort();
    assert_eq!(live, ["smq (live)", "strata (live)"]);
    for p in ["opt", "strata", "smq", "lru"] {
        let h = sc["sim"][p]["hit_ratio"].as_f64().unwrap_or_else(|| panic!("small-cache: no simulated {p}"));
        assert!((0.0..=1.0).contains(&h));
    }
    assert!(sc["derived"]["trace_requests"].as_u64().unwrap() > 0, "the recorded trace is empty");

    // mixed: every config x workload x pass, plus the origin.
    let (h, rows) = read_csv(&out.join("mixed/times.csv"));
    let configs = column(&h, &rows, "config");
    let workloads = column(&h, &rows, "workload");
    for c in ["origin alone", "strata writeback", "strata writethrough", "nbdkit cache filter"] {
        assert!(configs.iter().any(|x| x == c), "mixed: no rows for {c}");
    }
    for wl in ["100% read", "50/50", "100% write"] {
        assert!(workloads.iter().any(|x| x == wl), "mixed: no rows for {wl}");
    }
    // A pass served wholly from the cache can take less than fio's millisecond resolution.
    for t in column(&h, &rows, "time_s") {
        assert!(t.parse::<f64>().unwrap() >= 0.0);
    }
    for n in column(&h, &rows, "ios") {
        assert!(n.parse::<u64>().unwrap() > 0, "a pass did no IO");
    }

    // git: the origin, the fast device alone and at least one size of each target, both
    // phases timed.
    if git_skip.is_none() {
        let (h, rows) = read_csv(&out.join("git/times.csv"));
        let targets = column(&h, &rows, "target");
        for t in ["origin alone", "fast alone", "cache", "writecache"] {
            assert!(targets.iter().any(|x| x == t), "git: no {t} row in {targets:?}");
        }
        for col in ["clone_s", "checkout_s"] {
            for t in column(&h, &rows, col) {
                assert!(t.parse::<f64>().unwrap() > 0.0, "git: {col} = {t}");
            }
        }
    }

    // overhead: every series in both directions, and the ratios (qemu-nbd's two with it).
    let o = &exps["overhead"];
    let qemu = have("qemu-nbd");
    for s in [
        "strata file (O_DIRECT)",
        "strata mem",
        "nbdkit file",
        "nbdkit memory",
        "qemu-nbd file (O_DIRECT)",
        "fio io_uring O_DIRECT on the file",
    ] {
        if s.starts_with("qemu") && !qemu {
            continue;
        }
        for rw in ["randread", "randwrite"] {
            let r = &o["results"][format!("{s} {rw}")];
            assert!(r["iops"].as_f64().is_some(), "overhead: no {s} {rw}");
            // The whole machine's CPU over the run: every request costs some, on some core.
            for m in ["machine_us_per_req", "busy_cores"] {
                assert!(r[m].as_f64().is_some_and(|v| v > 0.0), "overhead: {s} {rw} {m} = {}", r[m]);
            }
        }
    }
    assert_eq!(names(&o["ratios"]).len(), if qemu { 14 } else { 10 });

    // qos: every way at every point of experiment 1, lone and busy sides, and the targets.
    let (h, rows) = read_csv(&out.join("qos/points.csv"));
    let ways = column(&h, &rows, "way");
    for w in ["no controller", "strata qos", "nbdkit rate"] {
        assert!(ways.iter().any(|x| x == w), "qos: no rows for {w}");
    }
    for col in ["busy_agg_kbs", "lone_agg_kbs"] {
        for v in column(&h, &rows, col) {
            assert!(v.parse::<f64>().unwrap() > 0.0, "qos: {col} = {v}");
        }
    }
    let tables = std::fs::read_to_string(out.join("qos/tables.txt")).unwrap();
    assert!(tables.contains("nr Max-bandw Min-bandw Agg-bandw Max-latency nr Agg-bandw Max-latency"), "{tables}");
    assert!(exps["qos"]["results"]["1"]["targets"]["strata qos"].as_array().is_some());

    // remote: every ratio of the figures, each a positive number.
    let r = &exps["remote"];
    assert_eq!(r["status"], "ok", "remote: {r}");
    assert_eq!(names(&r["ratios"]).len(), 8, "remote: {r}");
    for (k, v) in r["ratios"].as_object().unwrap() {
        assert!(v.as_f64().is_some_and(|x| x > 0.0), "remote: {k} = {v}");
    }
    // 1 MiB reads reach the export whole, as one request each.
    let seen = &r["origin_reads_through_strata"];
    assert_eq!(seen["mean_bytes"].as_f64(), Some(1048576.0), "remote: requests the export saw: {seen}");

    // connections: the four shapes' ratios, each a positive number.
    let c = &exps["connections"];
    assert_eq!(names(&c["ratios"]).len(), 4, "connections: {c}");
    for (k, v) in c["ratios"].as_object().unwrap() {
        assert!(v.as_f64().is_some_and(|x| x > 0.0), "connections: {k} = {v}");
    }

    // Nothing left behind: the scratch folder is gone.
    let scratch = summary["scratch"].as_str().expect("summary.json names its scratch folder");
    assert!(!Path::new(scratch).exists(), "the scratch folder {scratch} was left behind");
    assert!(!log.contains("Traceback"), "a traceback in the log:\n{log}");
}
