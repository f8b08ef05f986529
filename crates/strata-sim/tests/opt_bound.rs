//! No policy beats Belady's optimum (with bypass) on any trace at any size, and OPT is exact
//! on a case small enough to check by hand.

mod common;

use strata_policy::{Access, Opt, Outcome, Params, Policy, POLICY_NAMES};
use strata_sim::sim::{run_matrix, split_requests, BlockAccess, MatrixOptions, Ops, Workload};
use strata_sim::synthetic::{Generator, Pattern};

fn workload(blocks: Vec<u64>) -> Workload {
    let footprint = blocks.iter().collect::<std::collections::HashSet<_>>().len() as u64;
    let max_block = blocks.iter().copied().max().unwrap_or(0);
    let accesses: Vec<BlockAccess> = blocks
        .iter()
        .enumerate()
        .map(|(i, &block)| BlockAccess {
            block,
            time_ns: i as u64 * 10_000_000,
            bytes: 4096,
            op: strata_policy::Op::Read,
            full: true,
        })
        .collect();
    Workload { requests: accesses.len() as u64, accesses, block_size: 4096, footprint, max_block }
}

fn check(name: &str, w: &Workload, prefill: bool) {
    let mut policies: Vec<String> = POLICY_NAMES.iter().map(|s| s.to_string()).collect();
    policies.push("opt".into());
    let f = w.footprint as usize;
    let sizes: Vec<usize> = [f / 100, f / 20, f / 10, f / 4, f / 2].into_iter().filter(|&s| s > 0).collect();
    let opts = MatrixOptions {
        params: Params::default(),
        windows: 0,
        prefill_junk: prefill,
        jobs: 2,
        progress: false,
        cost: None,
        readahead: strata_sim::sim::Readahead::OFF,
    };
    let results = run_matrix(w, &policies, &sizes, &opts).unwrap();
    for &s in &sizes {
        let opt = results.iter().find(|r| r.policy == "opt" && r.size_blocks == s).unwrap().counts.hits;
        for r in results.iter().filter(|r| r.size_blocks == s) {
            assert!(r.counts.hits <= opt, "{name}: {} got {} hits with {s} blocks, OPT {opt}", r.policy, r.counts.hits);
        }
    }
}

#[test]
fn opt_is_never_beaten_on_synthetic_traces() {
    let n = 5000;
    for (name, pattern) in [
        ("zipf:0.8", Pattern::Zipf(0.8)),
        ("zipf:1.2", Pattern::Zipf(1.2)),
        ("uniform", Pattern::Uniform),
        ("scanmix", Pattern::ScanMix(0.9, 0.3)),
        ("loop", Pattern::Loop),
    ] {
        let w = workload(Generator::new(&pattern, n, 11).take(60_000).collect());
        check(name, &w, false);
        check(name, &w, true);
    }
}

#[test]
fn opt_is_never_beaten_on_the_cloudphysics_sample() {
    let Some((reqs, _)) = common::testdata("cloudphysics-w.csv") else {
        return;
    };
    // The first 30,000 requests keep this test quick in debug builds.
    let w = split_requests(reqs.take(30_000), 4096, Ops::All, 1_000_000).unwrap();
    check("cloudphysics", &w, false);
}

/// Capacity 2, trace a b c a b: OPT keeps a and b and bypasses c (used never again), so the
/// last two accesses hit. Plain demand paging would have to load c and lose one of them.
#[test]
fn opt_bypasses() {
    let blocks = [1, 2, 3, 1, 2];
    let mut opt = Opt::new(2, &blocks);
    let out: Vec<Outcome> = blocks.iter().map(|&b| opt.access(Access::read(b, 0))).collect();
    assert_eq!(
        out,
        vec![
            Outcome::Promote { evict: None },
            Outcome::Promote { evict: None },
            Outcome::Miss,
            Outcome::Hit,
            Outcome::Hit
        ]
    );
    // cap 2, trace 1 2 3 1 3 2: at 3 (next use 4) the residents are 1 (next 3) and 2 (next 5),
    // so 2, needed farthest, is evicted; 1 and 3 hit; the final 2 misses and is not admitted.
    let blocks = [1, 2, 3, 1, 3, 2];
    let mut opt = Opt::new(2, &blocks);
    let out: Vec<Outcome> = blocks.iter().map(|&b| opt.access(Access::read(b, 0))).collect();
    assert_eq!(
        out,
        vec![
            Outcome::Promote { evict: None },
            Outcome::Promote { evict: None },
            Outcome::Promote { evict: Some(2) },
            Outcome::Hit,
            Outcome::Hit,
            Outcome::Miss
        ]
    );
}
