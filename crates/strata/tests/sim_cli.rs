//! `strata sim`'s command line: option parsing, help, and whole runs on small inputs. The
//! parsers behind `--size` and `--policy` are tested in strata-sim (`tests/options.rs`).

use clap::Parser;
use strata::cmd::sim::{run, SimArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimArgs,
}

fn args(list: &[&str]) -> Result<SimArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("strata-sim").chain(list.iter().copied())).map(|c| c.args)
}

/// `--size` and `--block-size` read units as `strata_io::units::parse_size` does everywhere
/// else, and `--help` says what MB and MiB mean.
#[test]
fn sizes_take_the_units_of_the_rest_of_strata() {
    let synthetic = ["--synthetic", "uniform", "--blocks", "8000", "--requests", "20000", "--policy", "lru"];
    let with = |extra: &[&str]| args(&[&synthetic[..], extra].concat()).unwrap();
    run(with(&["--size", "10MB,10MiB,10M", "--block-size", "4KiB"])).unwrap();
    let err = run(with(&["--size", "4 parsecs"])).unwrap_err().to_string();
    assert!(err.contains("parsecs"), "{err}");
    let err = run(with(&["--block-size", "4 parsecs"])).unwrap_err().to_string();
    assert!(err.contains("parsecs"), "{err}");
    assert!(run(with(&["--block-size", "0.5KiB", "--size", "1%"])).is_ok());
    let err = run(with(&["--block-size", "0", "--size", "1MiB"])).unwrap_err().to_string();
    assert!(err.contains("block size"), "{err}");
    let help = args(&["--help"]).unwrap_err().to_string();
    assert!(help.contains("powers of 1000") && help.contains("powers of 1024"), "{help}");
}

#[test]
fn accepts_help_and_rejects_bad_options() {
    let help = args(&["--help"]).unwrap_err().to_string();
    assert!(help.contains("--synthetic") && help.contains("cloudphysics-w.csv"), "{help}");
    for p in strata_policy::POLICIES {
        let first_words: String = p.summary.split(' ').take(2).collect::<Vec<_>>().join(" ");
        assert!(
            help.contains(&format!("  {} ", p.name)) && help.contains(&first_words),
            "{} missing from\n{help}",
            p.name
        );
    }
    assert!(args(&["--frobnicate"]).is_err());
    assert!(args(&[]).is_err(), "a trace or --synthetic is required");
    assert!(args(&["t.csv", "--format", "excel"]).is_err());
    assert!(args(&["--synthetic", "zipf:1"]).is_err());
}

#[test]
fn synthetic_run_with_csv_plot_windows_and_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("mrc.png");
    let a = args(&[
        "--synthetic",
        "zipf:1.2",
        "--blocks",
        "5000",
        "--requests",
        "20000",
        "--policy",
        "strata,smq,lru,opt",
        "--size",
        "1%,10%",
        "--csv",
        "--windows",
        "4",
        "--prefill",
        "junk",
        "--plot",
        png.to_str().unwrap(),
        "--jobs",
        "2",
    ])
    .unwrap();
    run(a).unwrap();
    if std::path::Path::new(strata_plot::DEFAULT_FONT).exists() {
        assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    }
}

#[test]
fn malformed_trace_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.lis");
    std::fs::write(&path, "1 8 0 1\n2 8 0 2\noops\n").unwrap();
    let err = run(args(&[path.to_str().unwrap(), "--format", "lis"]).unwrap()).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("line 3"), "{msg}");
    // A file that is not text: the reason, said once.
    std::fs::write(&path, [0xffu8, 0xfe, 0x00, 0x81].repeat(100)).unwrap();
    let err = run(args(&[path.to_str().unwrap(), "--format", "lis"]).unwrap()).unwrap_err();
    let msg = format!("{err:#}");
    assert_eq!(msg.matches("valid UTF-8").count(), 1, "{msg}");
}

#[test]
fn cost_option_parses_and_runs() {
    assert!(args(&["t.csv", "--cost", "hdd,ssd"]).unwrap().cost.is_some());
    assert!(args(&["t.csv", "--cost", "hdd?rpm=5400&seek_max_ms=20,ssd:channels=4"]).is_ok());
    assert!(args(&["t.csv", "--cost", "tape,ssd"]).is_err());
    assert!(args(&["t.csv", "--cost", "hdd"]).is_err());
    assert!(args(&["t.csv", "--cost", "hdd?warp=9,ssd"]).is_err());
    let help = args(&["--help"]).unwrap_err().to_string();
    assert!(help.contains("--cost") && help.contains("tinylfu"), "{help}");
    for csv in [false, true] {
        let mut list = vec![
            "--synthetic",
            "zipf:1.1",
            "--blocks",
            "4000",
            "--requests",
            "20000",
            "--policy",
            "tinylfu,lru",
            "--size",
            "5%",
            "--cost",
            "hdd,ssd",
            "--prefill",
            "junk",
            "--rwmix-read",
            "70",
        ];
        if csv {
            list.push("--csv");
        }
        run(args(&list).unwrap()).unwrap();
    }
}

/// Options that used to be taken and ignored or to exhaust memory: --ops with a synthetic
/// workload is refused; a size far above the footprint (which some policies would allocate
/// whole) and more windows than accesses run at what the trace can use; ALL and DEFAULT
/// are policy lists in any case.
#[test]
fn options_beyond_what_the_trace_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.lis");
    std::fs::write(&path, "0 8 0 1\n8 8 0 2\n").unwrap();
    let trace = path.to_str().unwrap();
    let synthetic = ["--synthetic", "uniform", "--blocks", "100", "--requests", "1000", "--ops", "read"];
    let err = run(args(&synthetic).unwrap()).unwrap_err().to_string();
    assert!(err.contains("--rwmix-read"), "{err}");
    // More requests than a replay holds are refused before any is made (3 * 10^8 took 6 GiB).
    let err =
        run(args(&["--synthetic", "uniform", "--blocks", "100", "--requests", "300000000"]).unwrap()).unwrap_err();
    assert!(err.to_string().contains("at most 268435456 accesses"), "{err}");
    // 2^30 blocks of arc, lirs, opt or smq would need tens of GiB.
    run(args(&[trace, "--policy", "arc,lirs,opt,smq", "--size", "1073741822", "-j", "1"]).unwrap()).unwrap();
    run(args(&[trace, "--policy", "lru", "--size", "1", "--windows", "1000000000000"]).unwrap()).unwrap();
    run(args(&[trace, "--policy", "ALL,Default", "--size", "1"]).unwrap()).unwrap();
    let err = run(args(&[trace, "--size", "100", "--prefill", "junk"]).unwrap()).unwrap_err().to_string();
    assert!(err.contains("4 times the footprint"), "{err}");
}

/// `--csv` writes one table to its stream, with or without `--windows`: every line has the
/// header's columns, and the windows of a run add up to its requests.
#[test]
fn csv_output_is_one_table() {
    let synthetic = ["sim", "--synthetic", "zipf:1.1", "--blocks", "2000", "--requests", "10000", "--csv"];
    for (extra, rows) in [(&[][..], 2), (&["--windows", "5"][..], 10)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(synthetic)
            .args(["--policy", "lru,smq", "--size", "5%"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let body: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(body.len(), rows, "{extra:?}:\n{text}");
        assert!(body.iter().all(|r| r.len() == header.len()), "{extra:?}: ragged rows:\n{text}");
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let accesses: u64 =
            body.iter().filter(|r| r[0] == "lru").map(|r| r[col("requests")].parse::<u64>().unwrap()).sum();
        assert_eq!(accesses, 10_000, "{extra:?}:\n{text}");
    }
}
