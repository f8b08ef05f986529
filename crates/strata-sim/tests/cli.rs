//! The command line: size and option parsing, and whole runs on small inputs.

use clap::Parser;
use strata_sim::cli::{parse_bytes, parse_policies, parse_sizes, run, SimArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimArgs,
}

fn args(list: &[&str]) -> Result<SimArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("strata-sim").chain(list.iter().copied())).map(|c| c.args)
}

#[test]
fn sizes_and_bytes() {
    assert_eq!(parse_bytes("4KiB").unwrap(), 4096);
    assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
    assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
    assert!(parse_bytes("4 parsecs").is_err());
    let s = parse_sizes("1000,10%,64MiB,1000", 50_000, 4096).unwrap();
    assert_eq!(
        s.iter().map(|x| x.0).collect::<Vec<_>>(),
        vec![1000, 5000, 16384]
    );
    assert!(parse_sizes("0", 10, 4096).is_err());
    assert!(parse_sizes("1KiB", 10, 4096).is_err());
    assert!(parse_sizes("-5%", 10, 4096).is_err());
}

#[test]
fn policy_lists() {
    assert_eq!(
        parse_policies("lru, ARC,lru,opt").unwrap(),
        vec!["lru", "arc", "opt"]
    );
    assert!(parse_policies("all").unwrap().contains(&"opt".to_string()));
    let err = parse_policies("lru,nope").unwrap_err().to_string();
    assert!(err.contains("nope") && err.contains("s3fifo"), "{err}");
}

#[test]
fn accepts_help_and_rejects_bad_options() {
    let help = args(&["--help"]).unwrap_err().to_string();
    assert!(
        help.contains("--synthetic") && help.contains("cloudphysics-w.csv"),
        "{help}"
    );
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
}

#[test]
fn cost_option_parses_and_runs() {
    assert!(args(&["t.csv", "--cost", "hdd,ssd"])
        .unwrap()
        .cost
        .is_some());
    assert!(args(&[
        "t.csv",
        "--cost",
        "hdd?rpm=5400&seek_max_ms=20,ssd:channels=4"
    ])
    .is_ok());
    assert!(args(&["t.csv", "--cost", "tape,ssd"]).is_err());
    assert!(args(&["t.csv", "--cost", "hdd"]).is_err());
    assert!(args(&["t.csv", "--cost", "hdd?warp=9,ssd"]).is_err());
    let help = args(&["--help"]).unwrap_err().to_string();
    assert!(
        help.contains("--cost") && help.contains("tinylfu"),
        "{help}"
    );
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
