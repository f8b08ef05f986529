//! Requests per second of each policy on one core, on a trace already in memory.
//!
//! `cargo run --release -p strata-sim --example policy_rate -- [REQUESTS] [BLOCKS] [THETA] [CACHE%] [POLICIES]`
//! (defaults: 10,000,000 fio zipf:0.9 requests over 1,048,576 blocks, cache 10% of the
//! footprint, every policy and `opt`; POLICIES is a comma-separated subset). Each policy replays the same accesses three times, single-threaded; the figure
//! is accesses divided by the fastest replay's wall time (trace generation excluded).

use std::time::Instant;

use strata_policy::{Params, POLICY_NAMES};
use strata_sim::sim::{self, BlockAccess};
use strata_sim::synthetic::{Generator, Pattern};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: f64| args.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(d);
    let requests = arg(0, 10_000_000.0) as usize;
    let blocks = arg(1, 1_048_576.0) as u64;
    let theta = arg(2, 0.9);
    let pct = arg(3, 10.0);

    let accesses: Vec<BlockAccess> = Generator::new(&Pattern::Zipf(theta), blocks, 1)
        .take(requests)
        .enumerate()
        .map(|(i, block)| BlockAccess {
            block,
            time_ns: i as u64 * 10_000, // 100k IOPS
            bytes: 4096,
            op: strata_policy::Op::Read,
            full: true,
        })
        .collect();
    let footprint = sim::count_distinct(accesses.iter().map(|a| a.block));
    let size = ((footprint as f64 * pct / 100.0) as usize).max(1);
    println!(
        "{} zipf:{theta} accesses over {blocks} blocks (footprint {footprint}), cache {size} blocks ({pct}%), one core",
        requests
    );
    println!("{:<8} {:>12} {:>14} {:>9} {:>10}", "policy", "Mreq/s wall", "Mreq/s on-CPU", "hit%", "seconds");
    let params = Params { seed: 1, origin_blocks: Some(blocks), ..Params::default() };
    let mut names: Vec<&str> = POLICY_NAMES.to_vec();
    names.push("opt");
    if let Some(only) = args.get(4) {
        names = only.split(',').collect();
    }
    for name in names {
        let table = (name == "opt").then(|| {
            strata_policy::policies::opt::next_use(&accesses.iter().map(|a| a.block).collect::<Vec<_>>()).into()
        });
        // Best of three runs: the machine is shared, and the fastest run is the one least
        // disturbed by other work.
        let (mut best, mut best_cpu) = (f64::MAX, f64::MAX);
        let mut counts = Default::default();
        for _ in 0..3 {
            let mut policy = sim::make_policy(name, size, &params, table.as_ref()).expect("known policy");
            let (start, cpu) = (Instant::now(), thread_cpu_seconds());
            counts = sim::replay(policy.as_mut(), &accesses, 0, None);
            best = best.min(start.elapsed().as_secs_f64());
            best_cpu = best_cpu.min(thread_cpu_seconds() - cpu);
        }
        let counts: sim::Counts = counts;
        let secs = best;
        println!(
            "{:<8} {:>12.2} {:>14.2} {:>9.2} {:>10.3}",
            name,
            requests as f64 / secs / 1e6,
            requests as f64 / best_cpu / 1e6,
            100.0 * counts.hit_ratio(),
            secs
        );
    }
}

/// CPU time of this thread, which other processes on a shared machine do not inflate.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
