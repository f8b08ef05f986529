//! Presenting results: the human table, the CSV contract, hit ratio over time, and the
//! miss-ratio-curve plot.

use std::fmt::Write as _;
use std::path::Path;

use crate::sim::{ratio, RunResult, Workload};

pub const CSV_HEADER: &str = "policy,size_blocks,requests,hits,hit_ratio,byte_hit_ratio,promotions,bytes_per_entry";

/// The columns `--cost` appends to [`CSV_HEADER`] (after it, so readers of the old columns
/// keep working): mean latency of a read block access in microseconds, each device's busy
/// time in seconds, and the IOs each device served.
pub const CSV_COST_COLUMNS: &str =
    "mean_read_us,origin_busy_s,cache_busy_s,origin_reads,origin_writes,cache_reads,cache_writes";

/// `12345678` → `12,345,678`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else if v >= 100.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// One line describing the workload.
pub fn summary(source: &str, w: &Workload) -> String {
    format!(
        "{source}: {} requests, {} block accesses of {}, footprint {} blocks ({})",
        thousands(w.requests),
        thousands(w.accesses.len() as u64),
        human_bytes(w.block_size),
        thousands(w.footprint),
        human_bytes(w.footprint * w.block_size),
    )
}

/// The human-readable table. `size_labels[i]` is how the user wrote size `i`.
pub fn table(results: &[RunResult], w: &Workload, size_labels: &[(usize, String)]) -> String {
    let label = |s: usize| size_labels.iter().find(|(b, _)| *b == s).map(|(_, l)| l.clone()).unwrap_or_default();
    let with_cost = results.iter().any(|r| r.cost.is_some());
    let mut out = String::new();
    let _ = write!(
        out,
        "{:<8} {:>12} {:>10} {:>9} {:>8} {:>9} {:>12} {:>10} {:>10} {:>9}",
        "policy", "size", "", "capacity", "hit%", "bytehit%", "promotions", "promo/lru", "promo/hit", "B/entry"
    );
    if with_cost {
        let _ = write!(out, " {:>11} {:>13} {:>12}", "read us", "origin busy s", "cache busy s");
    }
    out.push('\n');
    // `a` per `b`, or a dash where there is no `b`.
    let per = |a: u64, b: u64| if b == 0 { "-".to_string() } else { format!("{:.2}", a as f64 / b as f64) };
    for r in results {
        let lru = results.iter().find(|o| o.policy == "lru" && o.size_blocks == r.size_blocks);
        let vs_lru = per(r.counts.promotions, lru.map_or(0, |l| l.counts.promotions));
        // What each hit cost in origin reads and cache writes.
        let per_hit = per(r.counts.promotions, r.counts.hits);
        let _ = write!(
            out,
            "{:<8} {:>12} {:>10} {:>9} {:>8.2} {:>9.2} {:>12} {:>10} {:>10} {:>9.1}",
            r.policy,
            thousands(r.size_blocks as u64),
            label(r.size_blocks),
            human_bytes(r.size_blocks as u64 * w.block_size),
            100.0 * r.counts.hit_ratio(),
            100.0 * r.counts.byte_hit_ratio(),
            thousands(r.counts.promotions),
            vs_lru,
            per_hit,
            r.bytes_per_entry,
        );
        match &r.cost {
            Some(c) => {
                let _ = write!(out, " {:>11.1} {:>13.1} {:>12.1}", c.mean_read_us(), c.origin_busy_s, c.cache_busy_s);
            }
            None if with_cost => {
                let _ = write!(out, " {:>11} {:>13} {:>12}", "-", "-", "-");
            }
            None => {}
        }
        out.push('\n');
    }
    out
}

/// The CSV contract: [`CSV_HEADER`]'s columns, then [`CSV_COST_COLUMNS`] when any result
/// carries a cost report.
pub fn csv(results: &[RunResult]) -> String {
    let with_cost = results.iter().any(|r| r.cost.is_some());
    let mut out = String::from(CSV_HEADER);
    if with_cost {
        out.push(',');
        out.push_str(CSV_COST_COLUMNS);
    }
    out.push('\n');
    for r in results {
        let c = &r.counts;
        let _ = write!(
            out,
            "{},{},{},{},{:.6},{:.6},{},{:.2}",
            r.policy,
            r.size_blocks,
            c.accesses,
            c.hits,
            c.hit_ratio(),
            c.byte_hit_ratio(),
            c.promotions,
            r.bytes_per_entry
        );
        match &r.cost {
            Some(k) => {
                let _ = write!(
                    out,
                    ",{:.3},{:.6},{:.6},{},{},{},{}",
                    k.mean_read_us(),
                    k.origin_busy_s,
                    k.cache_busy_s,
                    k.origin_reads,
                    k.origin_writes,
                    k.cache_reads,
                    k.cache_writes
                );
            }
            None if with_cost => out.push_str(",,,,,,,"),
            None => {}
        }
        out.push('\n');
    }
    out
}

/// Hit ratio per window, one column per (policy, size).
pub fn windows_table(results: &[RunResult]) -> String {
    let mut out = String::new();
    let n = results.iter().map(|r| r.counts.windows.len()).max().unwrap_or(0);
    let _ = write!(out, "{:>6} {:>12}", "window", "accesses");
    for r in results {
        let _ = write!(out, " {:>14}", format!("{}@{}", r.policy, r.size_blocks));
    }
    out.push('\n');
    let mut start = 0u64;
    for w in 0..n {
        let len = results.first().map(|r| r.counts.windows[w].0).unwrap_or(0);
        let _ = write!(out, "{:>6} {:>12}", w, thousands(start));
        for r in results {
            let (a, h) = r.counts.windows[w];
            let _ = write!(out, " {:>13.2}%", 100.0 * ratio(h, a));
        }
        out.push('\n');
        start += len;
    }
    out
}

pub fn windows_csv(results: &[RunResult]) -> String {
    let mut out = String::from("policy,size_blocks,window,first_access,requests,hits,hit_ratio\n");
    for r in results {
        let mut start = 0u64;
        for (w, &(a, h)) in r.counts.windows.iter().enumerate() {
            let _ = writeln!(out, "{},{},{},{},{},{},{:.6}", r.policy, r.size_blocks, w, start, a, h, ratio(h, a));
            start += a;
        }
    }
    out
}

/// Hit ratio against cache size, one line per policy.
pub fn plot(path: &Path, title: &str, results: &[RunResult], block_size: u64) -> Result<(), strata_plot::PlotError> {
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        if !names.contains(&r.policy.as_str()) {
            names.push(&r.policy);
        }
    }
    let mib = |blocks: usize| blocks as f64 * block_size as f64 / (1024.0 * 1024.0);
    let series = names
        .iter()
        .map(|&n| {
            let pts = results
                .iter()
                .filter(|r| r.policy == n)
                .map(|r| (mib(r.size_blocks), 100.0 * r.counts.hit_ratio()))
                .collect();
            strata_plot::Series::new(n, pts)
        })
        .collect();
    let sizes: Vec<f64> = results.iter().map(|r| mib(r.size_blocks)).collect();
    let (lo, hi) = sizes.iter().fold((f64::MAX, 0f64), |(l, h), &s| (l.min(s), h.max(s)));
    let spec = strata_plot::ChartSpec {
        title: title.to_string(),
        x_label: "cache size (MiB)".into(),
        y_label: "hit ratio (%)".into(),
        series,
        log_x: hi >= 8.0 * lo && lo > 0.0,
        ..Default::default()
    };
    strata_plot::line_chart(path, &spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Counts;

    fn result(policy: &str, hits: u64, promotions: u64) -> RunResult {
        RunResult {
            policy: policy.into(),
            size_blocks: 10,
            counts: Counts { accesses: 100, hits, promotions, ..Counts::default() },
            bytes_per_entry: 0.0,
            elapsed: Default::default(),
            cost: None,
        }
    }

    /// The table prices each hit in promotions (an origin read and a cache write each) beside
    /// the promotions against LRU's: 30 promotions for 20 hits is 1.50, LRU's 60 for 40 is
    /// 1.50 too though it promotes twice as much; no hits, no price.
    #[test]
    fn the_table_gives_promotions_per_hit() {
        let w = Workload { block_size: 4096, ..Workload::default() };
        let rows = [result("lru", 40, 60), result("arc", 20, 30), result("none", 0, 5)];
        let table = table(&rows, &w, &[]);
        // The last three columns: promo/lru, promo/hit, B/entry.
        fn tail(line: &str) -> Vec<&str> {
            line.split_whitespace().rev().skip(1).take(2).collect()
        }
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(tail(lines[0]), ["promo/hit", "promo/lru"], "{table}");
        assert_eq!(tail(lines[1]), ["1.50", "1.00"], "{table}");
        assert_eq!(tail(lines[2]), ["1.50", "0.50"], "{table}");
        assert_eq!(tail(lines[3])[0], "-", "{table}");
        // Without an LRU row at that size there is nothing to compare promotions with.
        let alone = super::table(&rows[1..2], &w, &[]);
        assert_eq!(tail(alone.lines().nth(1).unwrap()), ["1.50", "-"], "{alone}");
    }
}
