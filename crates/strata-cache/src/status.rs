//! What a cache target reports about itself: [`CacheStatus`], the `target` part of `strata
//! status` and of the server's `/status` JSON, and the same figures as Prometheus samples for
//! `/metrics`. One table below declares each field with its type, how it is exported and
//! its help line, so a new field cannot be left out of either.

use serde::{Deserialize, Serialize};
use strata_io::metrics::{MetricKind, Sample};
use strata_io::BlockDev;

/// How one field of [`CacheStatus`] appears in `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Export {
    /// A sample of this kind and name, with these fixed labels (fields that differ only by a
    /// label value share a name and a help line).
    Metric { kind: MetricKind, name: &'static str, labels: &'static [(&'static str, &'static str)] },
    /// A percentage, exported as a gauge in the range 0 to 1 under this name (`..._ratio`).
    Percent { name: &'static str },
    /// A string, exported as this label of the one [`INFO`] sample.
    Info { label: &'static str },
    /// Not a number (a list of messages): in `/status` only.
    None,
}

/// The metric that carries the string fields as labels, with the value 1.
pub const INFO: &str = "strata_cache_info";
const INFO_HELP: &str = "The cache's mode and policy as labels; the value is always 1.";

const fn counter(name: &'static str) -> Export {
    Export::Metric { kind: MetricKind::Counter, name, labels: &[] }
}

const fn gauge(name: &'static str) -> Export {
    Export::Metric { kind: MetricKind::Gauge, name, labels: &[] }
}

const fn labelled(kind: MetricKind, name: &'static str, labels: &'static [(&'static str, &'static str)]) -> Export {
    Export::Metric { kind, name, labels }
}

/// One row of the table: a field of [`CacheStatus`] (its JSON key), its export and help.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub key: &'static str,
    pub export: Export,
    pub help: &'static str,
}

/// A field's value as `/metrics` sees it.
pub trait Figure {
    /// The number to export: counts and sizes as they are, `true`/`false` as 1/0, an
    /// optional message as 1 when present; `None` for text, or for a ratio with no data yet.
    fn number(&self) -> Option<f64>;
    /// The label value, for a string field.
    fn text(&self) -> Option<&str> {
        None
    }
}

impl Figure for u64 {
    fn number(&self) -> Option<f64> {
        Some(*self as f64)
    }
}

impl Figure for u32 {
    fn number(&self) -> Option<f64> {
        Some(*self as f64)
    }
}

impl Figure for f64 {
    fn number(&self) -> Option<f64> {
        Some(*self)
    }
}

impl Figure for Option<f64> {
    fn number(&self) -> Option<f64> {
        *self
    }
}

impl Figure for bool {
    fn number(&self) -> Option<f64> {
        Some(u8::from(*self) as f64)
    }
}

impl Figure for Option<String> {
    fn number(&self) -> Option<f64> {
        Some(u8::from(self.is_some()) as f64)
    }
}

impl Figure for String {
    fn number(&self) -> Option<f64> {
        None
    }
    fn text(&self) -> Option<&str> {
        Some(self)
    }
}

impl Figure for Vec<String> {
    fn number(&self) -> Option<f64> {
        None
    }
}

/// Declares [`CacheStatus`] and its table [`CacheStatus::FIELDS`] from one list of
/// `key: type = export, "help";` rows. The help becomes the field's doc and its `# HELP`.
macro_rules! cache_status {
    ($($key:ident: $ty:ty = $export:expr, $help:literal;)*) => {
        /// The state of a cache target: its settings, counters since it was opened, levels
        /// and health. Serialised, it is the `target` object of `/status` (keys as named here).
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        pub struct CacheStatus {
            $(#[doc = $help] pub $key: $ty,)*
        }

        impl CacheStatus {
            /// Every field in declaration order, with how it is exported.
            pub const FIELDS: &'static [Field] = &[$(Field { key: stringify!($key), export: $export, help: $help },)*];

            /// The fields' values, in the order of [`Self::FIELDS`].
            fn figures(&self) -> Vec<&dyn Figure> {
                vec![$(&self.$key,)*]
            }
        }
    };
}

cache_status! {
    mode: String = Export::Info { label: "mode" },
        "The cache mode: writeback, writethrough, writearound, passthrough or cleaner.";
    restart_mode: String = Export::Info { label: "restart_mode" },
        "The mode the superblock holds, which a restart serves in: `mode`, unless a fault put the running volume in writethrough.";
    policy: String = Export::Info { label: "policy" }, "The replacement policy.";
    block_size: u32 = gauge("strata_cache_block_size_bytes"), "Bytes per cache block.";
    read_hits: u64 = counter("strata_cache_read_hits_total"), "Block reads served from the cache.";
    read_misses: u64 = counter("strata_cache_read_misses_total"), "Block reads that missed the cache.";
    write_hits: u64 = counter("strata_cache_write_hits_total"), "Block writes to a block in the cache.";
    write_misses: u64 = counter("strata_cache_write_misses_total"), "Block writes to a block not in the cache.";
    promotions: u64 = counter("strata_cache_promotions_total"), "Blocks copied from the origin into the cache.";
    demotions: u64 = counter("strata_cache_demotions_total"), "Blocks evicted from the cache.";
    writebacks: u64 = counter("strata_cache_writebacks_total"), "Dirty blocks written back to the origin.";
    writeback_writes: u64 = counter("strata_cache_writeback_writes_total"),
        "Origin writes made by write-back: adjacent dirty blocks go in one.";
    writeback_errors: u64 = counter("strata_cache_writeback_errors_total"),
        "Write-backs that failed (the origin refused the write, or the slot could not be read); the blocks stay dirty.";
    dirty_blocks: u64 = gauge("strata_cache_dirty_blocks"), "Cached blocks newer than the origin.";
    cached_blocks: u64 = gauge("strata_cache_cached_blocks"), "Cache blocks holding an origin block.";
    cache_blocks: u64 = gauge("strata_cache_capacity_blocks"), "Cache blocks in all.";
    free_blocks: u64 = gauge("strata_cache_free_blocks"), "Cache blocks free (or free after the next commit).";
    migration_bytes: u64 = counter("strata_cache_migration_bytes_total"), "Bytes moved by promotions and write-backs.";
    migration_budget_bytes_per_s: u64 = gauge("strata_cache_migration_budget_bytes_per_second"),
        "The migration budget in bytes per second (0: unlimited).";
    sequential_cutoff_bytes: u64 = gauge("strata_cache_sequential_cutoff_bytes"),
        "A sequential stream longer than this bypasses the cache (0: never).";
    writeback_percent: u32 = Export::Percent { name: "strata_cache_writeback_target_ratio" },
        "The dirty share of the cache that write-back aims for while the origin is busy.";
    readahead_bytes: u32 = gauge("strata_cache_readahead_bytes"), "Bytes around a missed block promoted with it.";
    readahead_blocks: u64 = counter("strata_cache_readahead_blocks_total"), "Blocks promoted as a missed block's neighbours.";
    bypassed: u64 = counter("strata_cache_bypassed_total"),
        "Block accesses sent to the origin past the cache (sequential streams, a stopped cache).";
    partial_writes_around: u64 = counter("strata_cache_partial_writes_around_total"),
        "Partial writes to uncached blocks in writethrough, sent to the origin alone (no fill read).";
    promotions_skipped: u64 = counter("strata_cache_promotions_skipped_total"),
        "Promotions given up (migration budget spent, or no slot free).";
    commits: u64 = counter("strata_cache_commits_total"), "Metadata commits.";
    dirty_victims_refused: u64 = counter("strata_cache_dirty_victims_refused_total"),
        "Evictions refused because the policy chose a dirty block (a policy bug; 0 when healthy).";
    hit_ratio_10s: Option<f64> = labelled(MetricKind::Gauge, "strata_cache_hit_ratio", &[("window", "10s")]),
        "Hits over all block accesses, reads and writes, in the window (absent before any access).";
    hit_ratio_1m: Option<f64> = labelled(MetricKind::Gauge, "strata_cache_hit_ratio", &[("window", "1m")]),
        "Hits over all block accesses, reads and writes, in the window (absent before any access).";
    hit_ratio_1h: Option<f64> = labelled(MetricKind::Gauge, "strata_cache_hit_ratio", &[("window", "1h")]),
        "Hits over all block accesses, reads and writes, in the window (absent before any access).";
    hit_ratio_total: Option<f64> = labelled(MetricKind::Gauge, "strata_cache_hit_ratio", &[("window", "total")]),
        "Hits over all block accesses, reads and writes, in the window (absent before any access).";
    origin_busy_foreground_s: f64 =
        labelled(MetricKind::Counter, "strata_cache_origin_busy_seconds_total", &[("io", "foreground")]),
        "Time the origin had a request in flight, by the IO it served (foreground or migration).";
    origin_busy_migration_s: f64 =
        labelled(MetricKind::Counter, "strata_cache_origin_busy_seconds_total", &[("io", "migration")]),
        "Time the origin had a request in flight, by the IO it served (foreground or migration).";
    origin_busy_share: f64 = gauge("strata_cache_origin_busy_ratio"),
        "Origin busy time (foreground and migration added) over the time since the cache opened.";
    flushing: bool = gauge("strata_cache_flushing"), "1 while every dirty block is being written back (flush, detach).";
    dirty_limited: bool = gauge("strata_cache_dirty_limited"),
        "1 while writeback makes no new dirty data: the origin is busy and the dirty share is 5 points above its target.";
    faults: Vec<String> = Export::None, "The latest faults, newest first (at most 8).";
    degraded: bool = gauge("strata_cache_degraded"), "1 once a fault has been seen since the cache opened.";
    stopped: Option<String> = gauge("strata_cache_stopped"),
        "Why the cache stopped serving (a metadata write failed); 1 in /metrics when stopped.";
}

impl CacheStatus {
    /// The status of `dev` if it is a cache target (or a wrapper of one).
    pub fn of(dev: &(impl BlockDev + ?Sized)) -> Option<CacheStatus> {
        Self::from_json(dev.status()?)
    }

    /// Reads the `target` object of `/status`; `None` if it is not a cache's.
    pub fn from_json(v: serde_json::Value) -> Option<CacheStatus> {
        serde_json::from_value(v).ok()
    }

    /// The status as JSON, as `/status` shows it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a status serialises")
    }

    /// The status as Prometheus samples (without the `volume` label, which the server adds).
    pub fn samples(&self) -> Vec<Sample> {
        let mut out = Vec::with_capacity(Self::FIELDS.len());
        let mut info = Vec::new();
        for (f, value) in Self::FIELDS.iter().zip(self.figures()) {
            match f.export {
                Export::Metric { kind, name, labels } => {
                    if let Some(value) = value.number() {
                        let sample = Sample::new(name, kind, f.help, value);
                        out.push(labels.iter().fold(sample, |s, &(k, v)| s.label(k, v.to_string())));
                    }
                }
                Export::Percent { name } => {
                    if let Some(value) = value.number() {
                        out.push(Sample::new(name, MetricKind::Gauge, f.help, value / 100.0));
                    }
                }
                Export::Info { label } => info.push((label, value.text().unwrap_or_default().to_string())),
                Export::None => {}
            }
        }
        out.push(Sample { labels: info, ..Sample::new(INFO, MetricKind::Gauge, INFO_HELP, 1.0) });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys `/status` has always had: renaming one breaks its readers (the bench polls them).
    const KEYS: [&str; 34] = [
        "mode",
        "policy",
        "block_size",
        "read_hits",
        "read_misses",
        "write_hits",
        "write_misses",
        "promotions",
        "demotions",
        "writebacks",
        "dirty_blocks",
        "cached_blocks",
        "cache_blocks",
        "free_blocks",
        "migration_bytes",
        "migration_budget_bytes_per_s",
        "sequential_cutoff_bytes",
        "writeback_percent",
        "readahead_bytes",
        "readahead_blocks",
        "bypassed",
        "promotions_skipped",
        "commits",
        "hit_ratio_10s",
        "hit_ratio_1m",
        "hit_ratio_1h",
        "hit_ratio_total",
        "origin_busy_foreground_s",
        "origin_busy_migration_s",
        "origin_busy_share",
        "flushing",
        "faults",
        "degraded",
        "stopped",
    ];

    /// Every field set to something other than its default.
    fn busy() -> CacheStatus {
        CacheStatus {
            mode: "writeback".into(),
            restart_mode: "writeback".into(),
            policy: "strata".into(),
            block_size: 65536,
            read_hits: 7,
            hit_ratio_10s: Some(0.5),
            hit_ratio_1m: Some(0.25),
            hit_ratio_1h: Some(0.125),
            hit_ratio_total: Some(0.0625),
            writeback_percent: 10,
            faults: vec!["cache read at 0: injected".into()],
            degraded: true,
            stopped: Some("metadata write failed".into()),
            ..CacheStatus::default()
        }
    }

    #[test]
    fn json_keeps_every_key_and_reads_back() {
        let s = busy();
        let v = s.to_json();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut want = KEYS.to_vec();
        want.sort();
        for k in CacheStatus::FIELDS.iter().map(|f| f.key).filter(|k| !KEYS.contains(k)) {
            want.push(k); // a field added since: it must at least be in the table
        }
        want.sort();
        assert_eq!(keys, want);
        assert_eq!(v["mode"], "writeback");
        assert_eq!(v["block_size"], 65536);
        assert_eq!(v["hit_ratio_10s"], 0.5);
        assert_eq!(v["degraded"], true);
        assert_eq!(v["stopped"], "metadata write failed");
        assert_eq!(CacheStatus::from_json(v), Some(s));
        let idle = CacheStatus::default().to_json();
        assert!(idle["hit_ratio_1m"].is_null() && idle["stopped"].is_null(), "no data yet reads as null: {idle}");
        assert_eq!(CacheStatus::from_json(serde_json::json!({"requests": 1})), None, "not a cache's status");
    }

    #[test]
    fn every_number_in_the_json_is_a_metric() {
        let s = busy();
        let v = s.to_json();
        assert_eq!(CacheStatus::FIELDS.len(), s.figures().len());
        for (f, figure) in CacheStatus::FIELDS.iter().zip(s.figures()) {
            let numeric = v[f.key].is_number() || v[f.key].is_boolean();
            match f.export {
                Export::Metric { .. } | Export::Percent { .. } => {
                    assert!(figure.number().is_some(), "{} is exported but gives no number", f.key)
                }
                Export::Info { .. } => assert!(v[f.key].is_string(), "{} is an info label but not a string", f.key),
                Export::None => assert!(!numeric && !v[f.key].is_string(), "{} is a number with no metric", f.key),
            }
        }
        let samples = s.samples();
        // One sample per numeric field, plus the info sample.
        let numeric =
            CacheStatus::FIELDS.iter().filter(|f| matches!(f.export, Export::Metric { .. } | Export::Percent { .. }));
        assert_eq!(samples.len(), numeric.count() + 1);
        let get = |name: &str, label: Option<(&str, &str)>| {
            samples
                .iter()
                .find(|x| x.name == name && label.is_none_or(|(k, v)| x.labels.iter().any(|(a, b)| *a == k && b == v)))
                .unwrap_or_else(|| panic!("no {name} {label:?}"))
        };
        assert_eq!(get("strata_cache_read_hits_total", None).value, 7.0);
        assert_eq!(get("strata_cache_read_hits_total", None).kind, MetricKind::Counter);
        assert_eq!(get("strata_cache_hit_ratio", Some(("window", "1m"))).value, 0.25);
        assert_eq!(get("strata_cache_writeback_target_ratio", None).value, 0.1);
        assert_eq!(get("strata_cache_degraded", None).value, 1.0);
        assert_eq!(get("strata_cache_stopped", None).value, 1.0);
        let info = get(INFO, None);
        assert_eq!(
            info.labels,
            [
                ("mode", "writeback".to_string()),
                ("restart_mode", "writeback".to_string()),
                ("policy", "strata".to_string())
            ]
        );
        // Ratios with no data yet are left out rather than reported as 0.
        assert!(CacheStatus::default().samples().iter().all(|x| x.name != "strata_cache_hit_ratio"));
    }

    #[test]
    fn metric_names_follow_prometheus_conventions() {
        let mut helps = std::collections::BTreeMap::new();
        for s in busy().samples() {
            assert!(s.name.starts_with("strata_cache_"), "{}", s.name);
            let counter = s.kind == MetricKind::Counter;
            assert_eq!(counter, s.name.ends_with("_total"), "{}: counters and only counters end in _total", s.name);
            for abbreviated in ["_s", "_ms", "_us", "_per_s", "_percent"] {
                assert!(!s.name.ends_with(abbreviated) && !s.name.contains(&format!("{abbreviated}_")), "{}", s.name);
            }
            let seen = helps.entry(s.name).or_insert((s.kind, s.help));
            assert_eq!(*seen, (s.kind, s.help), "{}: one kind and one help line per name", s.name);
        }
    }
}
