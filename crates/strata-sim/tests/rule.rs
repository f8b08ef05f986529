//! Issue 13's rule for the default policy, on every trace in the shared test data (the
//! CloudPhysics sample and the ARC paper's P2, P6 and P12) at 1, 2, 5, 10, 25 and 50% of its
//! footprint: a cell holds when the default's hit ratio is at least LRU's − 0.1 point and
//! the best of ARC, LIRS, S3-FIFO, 2Q and W-TinyLFU's − 1.0, with at most 0.8× LRU's
//! promotions.
//!
//! The rule does not hold in every cell yet (`docs/BENCHMARKS.md` has which and by how
//! much), so this checks that no change loses cells: the default holds at least
//! [`HELD_AT_LEAST`] of the 24, and never falls more than [`BELOW_LRU_AT_MOST`] below LRU.
//! Replays are deterministic; the count is raised as cells are won.

mod common;

use strata_policy::{Params, DEFAULT_POLICY};
use strata_sim::sim::{parse_cache_sizes, run_matrix, split_requests, MatrixOptions, Ops, Readahead, RunResult};

const TRACES: [&str; 4] = ["cloudphysics-w.csv", "arc/P2.lis.zst", "arc/P6.lis.zst", "arc/P12.lis.zst"];
const SIZES: &str = "1%,2%,5%,10%,25%,50%";
const FIVE: [&str; 5] = ["arc", "lirs", "s3fifo", "2q", "tinylfu"];
/// Cells (of 24) where the default holds the rule, at the least.
const HELD_AT_LEAST: usize = 23;
/// How far below LRU's hit ratio (points) the default may fall in any cell: the rule's own
/// 0.1, so even a cell it misses (P12 at 50%, short of the best of the five) stays within
/// the rule's 0.1 of LRU.
const BELOW_LRU_AT_MOST: f64 = 0.1;

fn hit_percent(r: &RunResult) -> f64 {
    100.0 * r.counts.hit_ratio()
}

#[test]
fn the_default_holds_the_rule_in_as_many_cells_as_before() {
    let policies: Vec<String> = [DEFAULT_POLICY, "lru"].into_iter().chain(FIVE).map(String::from).collect();
    let (mut held, mut report, mut below_lru) = (0, Vec::new(), Vec::new());
    for name in TRACES {
        let Some((requests, format)) = common::testdata(name) else {
            return;
        };
        let block_size = format.native_block_size().unwrap_or(4096);
        let w = split_requests(requests, block_size, Ops::All, 100_000).unwrap();
        let sizes: Vec<usize> =
            parse_cache_sizes(SIZES, w.footprint, block_size).unwrap().into_iter().map(|(b, _)| b).collect();
        let opts = MatrixOptions {
            // As `strata sim` runs it (seed 1), so the figures are those `docs/BENCHMARKS.md` publishes.
            params: Params { seed: 1, origin_blocks: Some(w.max_block + 1), ..Params::default() },
            windows: 0,
            prefill_junk: false,
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            progress: false,
            cost: None,
            readahead: Readahead::OFF,
        };
        let results = run_matrix(&w, &policies, &sizes, &opts).unwrap();
        for (i, size) in sizes.iter().enumerate() {
            // Results come policy by policy, each over every size.
            let of = |p: usize| &results[p * sizes.len() + i];
            let (default, lru) = (of(0), of(1));
            assert_eq!((default.size_blocks, lru.size_blocks), (*size, *size));
            let best = (2..policies.len()).map(|p| hit_percent(of(p))).fold(f64::MIN, f64::max);
            let needed = (hit_percent(lru) - 0.1).max(best - 1.0);
            let promotions = default.counts.promotions as f64 / lru.counts.promotions.max(1) as f64;
            let holds = hit_percent(default) >= needed && promotions <= 0.8;
            held += holds as usize;
            if hit_percent(default) < hit_percent(lru) - BELOW_LRU_AT_MOST {
                below_lru.push(format!("{name} at {size} blocks"));
            }
            report.push(format!(
                "{name} {size} blocks: {:.2}% at {promotions:.2}x LRU's promotions, {needed:.2} needed{}",
                hit_percent(default),
                if holds { "" } else { " (misses)" }
            ));
        }
    }
    assert_eq!(report.len(), 24);
    let report = report.join("\n");
    assert!(held >= HELD_AT_LEAST, "{held} of 24 cells held, at least {HELD_AT_LEAST} expected:\n{report}");
    assert!(below_lru.is_empty(), "below LRU − {BELOW_LRU_AT_MOST}: {below_lru:?}\n{report}");
    eprintln!("{held} of 24 cells held\n{report}");
}
