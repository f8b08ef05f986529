//! `--cost`: hand-computed device times for a three-request trace on each model, and the
//! CSV contract (the old columns stay first and unchanged).

use strata_policy::{Op, Params};
use strata_sim::cost::CostReport;
use strata_sim::report::{self, CSV_HEADER};
use strata_sim::sim::{run_matrix, BlockAccess, MatrixOptions, RunResult, Workload};

/// Reads of block 0 (miss, promoted into free room), block 0 again (hit), block 2 (miss,
/// promoted into free room): 4 KiB blocks, an origin of 3 blocks, LRU with 2 blocks.
fn three_reads() -> Workload {
    let read = |block, i: u64| BlockAccess { block, time_ns: i * 1_000_000, bytes: 4096, op: Op::Read, full: true };
    Workload {
        accesses: vec![read(0, 0), read(0, 1), read(2, 2)],
        requests: 3,
        block_size: 4096,
        footprint: 2,
        max_block: 2,
    }
}

fn run(w: &Workload, policies: &[&str], sizes: &[usize], cost: Option<&str>) -> Vec<RunResult> {
    let opts = MatrixOptions {
        params: Params::default(),
        windows: 0,
        prefill_junk: false,
        jobs: 2,
        progress: false,
        cost: cost.map(|c| c.parse().unwrap()),
        readahead: strata_sim::sim::Readahead::OFF,
    };
    let policies: Vec<String> = policies.iter().map(|p| p.to_string()).collect();
    run_matrix(w, &policies, sizes, &opts).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-9)
}

/// HDD: seek 4 ms for any distance (min = max), 6000 rpm (mean rotational delay 5 ms),
/// 4 MiB/s (4 KiB in 0.9765625 ms). SSD: read 100 us, write 50 us, one channel, 400 MiB/s
/// (4 KiB in 9.765625 us).
const HDD: &str = "hdd?seek_min_ms=4&seek_max_ms=4&rpm=6000&mib_s=4";
const SSD: &str = "ssd?read_us=100&write_us=50&channels=1&mib_s=400";

fn check(c: &CostReport, mean_read_us: f64, origin_busy_s: f64, cache_busy_s: f64) {
    assert!(close(c.mean_read_us(), mean_read_us), "mean read {} us, expected {mean_read_us}", c.mean_read_us());
    assert!(close(c.origin_busy_s, origin_busy_s), "origin busy {} s, expected {origin_busy_s}", c.origin_busy_s);
    assert!(close(c.cache_busy_s, cache_busy_s), "cache busy {} s, expected {cache_busy_s}", c.cache_busy_s);
}

/// Origin HDD (head at 0), cache SSD.
/// 1. read 0 misses: origin read at 0, continuing from the head: 0.9765625 ms (latency);
///    promoted: cache write 59.765625 us. Head now at 4096.
/// 2. read 0 hits: cache read 109.765625 us (latency).
/// 3. read 2 misses: origin read at 8192, not where the head is: 4 + 5 + 0.9765625 =
///    9.9765625 ms (latency); promoted: cache write 59.765625 us.
///
/// Mean read latency (976.5625 + 109.765625 + 9976.5625) / 3 = 3687.630208333 us; origin
/// busy 10.953125 ms; cache busy 109.765625 + 2 × 59.765625 = 229.296875 us.
#[test]
fn hdd_origin_ssd_cache_by_hand() {
    let r = run(&three_reads(), &["lru"], &[2], Some(&format!("{HDD},{SSD}")));
    let c = r[0].cost.as_ref().expect("a cost report");
    assert_eq!((r[0].counts.hits, r[0].counts.promotions), (1, 2));
    check(c, 11062.890625 / 3.0, 0.010953125, 229.296875e-6);
    assert_eq!((c.origin_reads, c.origin_writes, c.cache_reads, c.cache_writes), (2, 0, 1, 2));
}

/// Origin SSD, cache HDD (2 slots; head at 0). Promotions take slots 0 and 1.
/// 1. read 0 misses: origin read 109.765625 us (latency); cache write to slot 0 at offset
///    0, where the head is: 0.9765625 ms. Head at 4096.
/// 2. read 0 hits: cache read at 0, head at 4096: 4 + 5 + 0.9765625 = 9.9765625 ms
///    (latency). Head at 4096.
/// 3. read 2 misses: origin read 109.765625 us (latency); cache write to slot 1 at 4096,
///    continuing: 0.9765625 ms.
///
/// Mean read latency (109.765625 × 2 + 9976.5625) / 3 = 3398.697916667 us; origin busy
/// 219.53125 us; cache busy 11.9296875 ms.
#[test]
fn ssd_origin_hdd_cache_by_hand() {
    let r = run(&three_reads(), &["lru"], &[2], Some(&format!("{SSD},{HDD}")));
    let c = r[0].cost.as_ref().expect("a cost report");
    check(c, 10196.09375 / 3.0, 219.53125e-6, 0.0119296875);
}

/// The same trace with a one-block cache: the third read evicts block 0 and takes its slot
/// (slot 0 at offset 0): the cache write follows the hit's read at 0, which left the head
/// at 4096, so it pays positioning: 9.9765625 ms. Cache busy 0.9765625 + 9.9765625 +
/// 9.9765625 = 20.9296875 ms.
#[test]
fn evicted_slot_is_reused_on_an_hdd_cache() {
    let r = run(&three_reads(), &["lru"], &[1], Some(&format!("{SSD},{HDD}")));
    let c = r[0].cost.as_ref().unwrap();
    check(c, 10196.09375 / 3.0, 219.53125e-6, 0.0209296875);
}

/// With `--cost`, the CSV header is the old header plus new columns, and every row starts
/// with exactly the old row; without it, the CSV is the old one.
#[test]
fn csv_keeps_the_old_columns_first() {
    let w = three_reads();
    let policies = ["lru", "tinylfu", "strata", "opt"];
    let plain = report::csv(&run(&w, &policies, &[1, 2], None));
    let costed = report::csv(&run(&w, &policies, &[1, 2], Some("hdd,ssd")));
    let mut old = plain.lines();
    let mut new = costed.lines();
    assert_eq!(old.next(), Some(CSV_HEADER));
    let header = new.next().unwrap();
    assert!(header.starts_with(&format!("{CSV_HEADER},")), "{header}");
    assert!(header.ends_with(report::CSV_COST_COLUMNS));
    let old_cols = CSV_HEADER.split(',').count();
    let new_cols = header.split(',').count();
    let (mut rows, mut o) = (0, old);
    for row in new {
        let before = o.next().expect("same number of rows");
        assert!(row.starts_with(&format!("{before},")), "{row} vs {before}");
        assert_eq!(row.split(',').count(), new_cols);
        assert_eq!(before.split(',').count(), old_cols);
        rows += 1;
    }
    assert_eq!(rows, 8);
    assert!(o.next().is_none());
    // The human table gains its columns too.
    let table = report::table(&run(&w, &["lru"], &[2], Some("hdd,ssd")), &w, &[(2, "2".into())]);
    assert!(table.lines().next().unwrap().ends_with("cache busy s"), "{table}");
}

/// A trace's devices lie end to end on the modelled origin: the same requests on device 0
/// or device 5 (block numbers 256 TiB apart) cost the same, and a request on a second
/// device adds its own seek, not one across 256 TiB.
#[test]
fn the_origin_cost_does_not_depend_on_device_numbers() {
    let ns = |dev: u64| (dev << strata_sim::trace::NAMESPACE_SHIFT) / 4096;
    let on = |dev: u64, blocks: &[u64]| {
        let accesses: Vec<BlockAccess> = blocks
            .iter()
            .enumerate()
            .map(|(i, &b)| BlockAccess {
                block: ns(dev) + b,
                time_ns: i as u64 * 1_000_000,
                bytes: 4096,
                op: Op::Read,
                full: true,
            })
            .collect();
        let max_block = accesses.iter().map(|a| a.block).max().unwrap();
        Workload {
            accesses,
            requests: blocks.len() as u64,
            block_size: 4096,
            footprint: blocks.len() as u64,
            max_block,
        }
    };
    let cost = |w: &Workload| run(w, &["lru"], &[1], Some("hdd,ssd"))[0].cost.clone().unwrap();
    let blocks = [0, 1000, 20, 50_000, 7, 100_000];
    let (a, b) = (cost(&on(0, &blocks)), cost(&on(5, &blocks)));
    assert!(close(a.origin_busy_s, b.origin_busy_s) && close(a.mean_read_us(), b.mean_read_us()), "{a:?} {b:?}");
    let mut two = on(0, &blocks);
    let other = on(1, &[0]);
    two.accesses.push(BlockAccess { time_ns: 10_000_000, ..other.accesses[0] });
    two.max_block = other.max_block;
    let c = cost(&two);
    assert!(
        c.origin_busy_s < a.origin_busy_s * 1.4,
        "one more read cost {} s over {}",
        c.origin_busy_s,
        a.origin_busy_s
    );
}
