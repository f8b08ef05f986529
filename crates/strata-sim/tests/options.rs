//! The parsers behind `strata sim --size` and `--policy`, and synthetic workloads.

use strata_io::units::parse_size;
use strata_sim::sim::{parse_cache_sizes, parse_policy_list};
use strata_sim::synthetic::{self, Pattern, WorkloadOptions};

#[test]
fn sizes_and_bytes() {
    assert_eq!(parse_size("4KiB").unwrap(), 4096);
    assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
    assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
    assert!(parse_size("4 parsecs").is_err());
    let s = parse_cache_sizes("1000,10%,64MiB,1000", 50_000, 4096).unwrap();
    assert_eq!(s.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1000, 5000, 16384]);
    assert!(parse_cache_sizes("0", 10, 4096).is_err());
    assert!(parse_cache_sizes("1KiB", 10, 4096).is_err());
    assert!(parse_cache_sizes("-5%", 10, 4096).is_err());
    assert!(parse_cache_sizes("4 parsecs", 10, 4096).is_err());
}

/// One meaning of MB in the whole project: `strata_io::units`, where M and MiB are 2^20 bytes
/// (as qemu-img and fio read `64M`) and MB is 10^6 bytes.
#[test]
fn mb_is_powers_of_1000_and_m_and_mib_powers_of_1024() {
    let blocks = |spec| parse_cache_sizes(spec, 1 << 20, 4096).unwrap()[0].0;
    assert_eq!(blocks("10MiB"), 2560);
    assert_eq!(blocks("10M"), 2560);
    assert_eq!(blocks("10MB"), 10_000_000 / 4096);
    assert_eq!(blocks("1GB"), 1_000_000_000 / 4096);
    assert_eq!(blocks("1G"), 1 << 18);
    let s = parse_cache_sizes("10MB,10MiB,10M", 1 << 20, 4096).unwrap();
    assert_eq!(s, vec![(2441, "10MB".to_string()), (2560, "10MiB".to_string())]);
}

#[test]
fn policy_lists() {
    assert_eq!(parse_policy_list("lru, ARC,lru,opt").unwrap(), vec!["lru", "arc", "opt"]);
    assert!(parse_policy_list("all").unwrap().contains(&"opt".to_string()));
    assert_eq!(parse_policy_list("all").unwrap().len(), strata_policy::POLICIES.len());
    assert_eq!(parse_policy_list("default").unwrap(), vec![strata_policy::DEFAULT_POLICY]);
    let err = parse_policy_list("lru,nope").unwrap_err();
    assert!(err.contains("nope") && err.contains("s3fifo"), "{err}");
    assert!(parse_policy_list(" , ").is_err());
}

#[test]
fn synthetic_workloads_follow_their_options() {
    let o =
        WorkloadOptions { blocks: 1000, requests: 5000, seed: 3, read_percent: 70, interval_ns: 100, block_size: 4096 };
    let w = synthetic::workload(&Pattern::Uniform, &o);
    assert_eq!(w.requests, 5000);
    assert_eq!(w.accesses.len(), 5000);
    assert_eq!(w.block_size, 4096);
    assert!(w.max_block < 1000 && w.footprint <= 1000);
    assert_eq!(w.accesses[10].time_ns, 1000);
    assert!(w.accesses.iter().all(|a| a.full && a.bytes == 4096));
    let writes = w.accesses.iter().filter(|a| a.op == strata_policy::Op::Write).count();
    assert!((1200..1800).contains(&writes), "{writes} writes of 5000 at rwmixread 70");
    assert_eq!(synthetic::workload(&Pattern::Uniform, &o).accesses, w.accesses);
    let reads_only = synthetic::workload(&Pattern::Uniform, &WorkloadOptions { read_percent: 100, ..o });
    assert!(reads_only.accesses.iter().all(|a| a.op == strata_policy::Op::Read));
}
