//! What a writecache target reports about itself ([`WritecacheStatus`], the `target` part of
//! `/status`, and the same figures as Prometheus samples for `/metrics`) and the tunables it
//! takes live ([`Tunables`], dm-writecache's names where they mean the same).

use serde::{Deserialize, Serialize};
use strata_io::metrics::{MetricKind, Sample};
use strata_io::{Error, ErrorKind, Result};

/// Settings that change while serving (`message "NAME VALUE"`); what is set live is kept in
/// the superblock and taken again at the next open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tunables {
    /// Percent of slots in use above which clean blocks are evicted to keep the rest free.
    pub high_watermark: u32,
    /// Dirty share (percent of slots) the background write-back brings the log down to.
    pub low_watermark: u32,
    /// Longest a change waits for a background commit.
    pub autocommit_time_ms: u64,
    /// Blocks written without a FLUSH after which the background commits.
    pub autocommit_blocks: u64,
    /// Most blocks a write-back takes at once (0: a whole batch); fewer keep origin reads
    /// quicker while it writes back.
    pub writeback_jobs: u32,
    /// A block dirty longer than this is written back whatever the dirty share (0: no limit).
    pub max_age_ms: u64,
    /// Background write-back on (bcache's `writeback_running`); off, no background write-back
    /// at all, the cleaner's included (`flush` still writes back), and writes still go around
    /// a full log.
    pub writeback_running: bool,
    /// How long write-back pauses after a large write went around a full log (a stream then
    /// has the origin to itself), as dm-writecache's `pause_writeback`; 0: no pause.
    pub pause_writeback_ms: u64,
    /// Write back everything dirty (before a detach).
    pub cleaner: bool,
    /// Bytes of the aligned window a read that missed the log brings in (`readahead`, as the
    /// cache target's and bcache's): the window is read from the origin in one request and
    /// its blocks the log holds no copy of are kept as clean copies in free slots above the
    /// `high_watermark` reserve (a read never evicts anything). A run of blocks longer than
    /// the window is read alone and not kept. 0: reads are never kept, as dm-writecache.
    pub readahead_bytes: u64,
}

impl Default for Tunables {
    fn default() -> Tunables {
        Tunables {
            high_watermark: 50,
            low_watermark: 45,
            autocommit_time_ms: 1000,
            autocommit_blocks: 65536,
            writeback_jobs: 0,
            max_age_ms: 0,
            writeback_running: true,
            pause_writeback_ms: 3000,
            cleaner: false,
            readahead_bytes: strata_policy::DEFAULT_READAHEAD_BYTES,
        }
    }
}

impl Tunables {
    /// Applies `NAME VALUE`; refuses unknown names and values that break
    /// `low_watermark <= high_watermark <= 100`.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        self.set_all(&[(name, value)])
    }

    /// Applies every `(NAME, VALUE)` or none: refuses unknown names, bad values, and
    /// watermarks that break `low_watermark <= high_watermark <= 100` once all are applied.
    pub fn set_all(&mut self, settings: &[(&str, &str)]) -> Result<()> {
        let mut t = *self;
        for &(name, value) in settings {
            t.assign(name, value)?;
        }
        if !t.valid() {
            let all: Vec<String> = settings.iter().map(|(n, v)| format!("{n} {v}")).collect();
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("writecache: {}: needs low_watermark <= high_watermark <= 100", all.join(", ")),
            ));
        }
        *self = t;
        Ok(())
    }

    fn assign(&mut self, name: &str, value: &str) -> Result<()> {
        let bad = |why: String| Error::new(ErrorKind::Invalid, format!("writecache: {name} {value}: {why}"));
        let num = || value.parse::<u64>().map_err(|e| bad(e.to_string()));
        let flag = || match value {
            "1" | "on" | "true" => Ok(true),
            "0" | "off" | "false" => Ok(false),
            _ => Err(bad("expected on or off".into())),
        };
        let t = self;
        match name {
            "high_watermark" => t.high_watermark = num()?.min(1000) as u32,
            "low_watermark" => t.low_watermark = num()?.min(1000) as u32,
            "autocommit_time" => t.autocommit_time_ms = num()?,
            "autocommit_blocks" => match num()? {
                0 => return Err(bad("at least 1".into())),
                n => t.autocommit_blocks = n,
            },
            "writeback_jobs" => {
                t.writeback_jobs = u32::try_from(num()?).map_err(|_| bad(format!("at most {}", u32::MAX)))?
            }
            "max_age" => t.max_age_ms = num()?,
            "writeback_running" => t.writeback_running = flag()?,
            "pause_writeback" => t.pause_writeback_ms = num()?,
            "cleaner" => t.cleaner = flag()?,
            "readahead" => {
                let r = strata_io::units::parse_size(value).map_err(|e| bad(e.to_string()))?;
                if r > strata_policy::MAX_READAHEAD_BYTES {
                    return Err(bad(format!("at most {} bytes", strata_policy::MAX_READAHEAD_BYTES)));
                }
                t.readahead_bytes = r;
            }
            _ => return Err(bad("unknown setting".into())),
        }
        Ok(())
    }

    /// The bounds `set` keeps to that `assign` does not check alone: the watermarks' order,
    /// and (for a text read from a superblock) each value's own range.
    fn valid(&self) -> bool {
        self.high_watermark <= 100
            && self.low_watermark <= self.high_watermark
            && self.autocommit_blocks >= 1
            && self.readahead_bytes <= strata_policy::MAX_READAHEAD_BYTES
    }

    /// The tunables as the superblock keeps them.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("plain fields")
    }

    /// Tunables kept in a superblock: fields missing from an older text take their defaults;
    /// an empty, unreadable or inconsistent text gives the defaults.
    pub fn decode(text: &str) -> Tunables {
        serde_json::from_str::<Tunables>(text).ok().filter(Tunables::valid).unwrap_or_default()
    }
}

/// The target's state and counters since it was opened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WritecacheStatus {
    pub target: String,
    pub block_bytes: u32,
    /// Slots of the log.
    pub blocks: u64,
    pub free_blocks: u64,
    pub dirty_blocks: u64,
    /// Dirty blocks being written back now.
    pub writeback_blocks: u64,
    pub read_hits: u64,
    pub read_misses: u64,
    /// Writes to a block the log holds.
    pub write_hits: u64,
    pub write_misses: u64,
    /// Writes that went to the origin because no slot was free.
    pub writes_around: u64,
    /// Blocks of writes around the log that covered only part of their block.
    pub writes_around_partial: u64,
    /// Dirty logged copies written back to the origin before a write went around them (only
    /// blocks it covered in part: their copy holds the rest of the block).
    pub writes_around_writebacks: u64,
    /// Logged copies a write around the log replaced whole: dropped without a write-back.
    pub writes_around_superseded: u64,
    pub writebacks: u64,
    /// The write-back controller's rate now, in blocks per second: 0 at or below the target,
    /// bcache's proportional-integral rate above it, `null` for flat out (flushing,
    /// cleaning, a full log, an idle origin, or blocks past `max_age`).
    pub writeback_rate: Option<f64>,
    /// Why background write-back is held now, if it is: `writeback_running` off, or a stream
    /// that went around the full log less than `pause_writeback` ago.
    pub writeback_held: Option<String>,
    pub writeback_errors: u64,
    /// Writes the log's device failed: a write's, written around the log instead, or a read
    /// window's copies, not kept.
    pub log_write_errors: u64,
    pub evictions: u64,
    /// Blocks read from the origin kept in the log as clean copies (`readahead`).
    pub reads_kept: u64,
    pub commits: u64,
    pub tunables: Tunables,
    /// RAM the log's books take (slots, their lists and the index).
    pub memory_bytes: u64,
    pub last_error: Option<String>,
    /// Why the volume accepts no writes or flushes (a flush of one device failed): restart
    /// it to recover from what is durable.
    pub stopped: Option<String>,
}

impl WritecacheStatus {
    /// The figures as Prometheus samples.
    pub fn samples(&self) -> Vec<Sample> {
        use MetricKind::{Counter, Gauge};
        let rows: [(&'static str, MetricKind, &'static str, f64); 22] = [
            ("strata_writecache_block_bytes", Gauge, "Size of a log slot.", self.block_bytes as f64),
            ("strata_writecache_blocks", Gauge, "Slots of the log.", self.blocks as f64),
            ("strata_writecache_free_blocks", Gauge, "Slots free for new writes.", self.free_blocks as f64),
            ("strata_writecache_dirty_blocks", Gauge, "Logged blocks not yet on the origin.", self.dirty_blocks as f64),
            (
                "strata_writecache_writeback_blocks",
                Gauge,
                "Blocks being written back now.",
                self.writeback_blocks as f64,
            ),
            ("strata_writecache_read_hits_total", Counter, "Block reads served from the log.", self.read_hits as f64),
            (
                "strata_writecache_read_misses_total",
                Counter,
                "Block reads served by the origin.",
                self.read_misses as f64,
            ),
            ("strata_writecache_write_hits_total", Counter, "Writes to a block the log held.", self.write_hits as f64),
            (
                "strata_writecache_write_misses_total",
                Counter,
                "Writes to a block the log did not hold.",
                self.write_misses as f64,
            ),
            (
                "strata_writecache_writes_around_total",
                Counter,
                "Writes sent to the origin as the log was full.",
                self.writes_around as f64,
            ),
            (
                "strata_writecache_writes_around_partial_total",
                Counter,
                "Blocks of writes around the log that covered only part of their block.",
                self.writes_around_partial as f64,
            ),
            (
                "strata_writecache_writes_around_writebacks_total",
                Counter,
                "Dirty logged copies written back before a write went around them.",
                self.writes_around_writebacks as f64,
            ),
            (
                "strata_writecache_writes_around_superseded_total",
                Counter,
                "Logged copies a write around the log replaced whole, without a write-back.",
                self.writes_around_superseded as f64,
            ),
            (
                "strata_writecache_writebacks_total",
                Counter,
                "Blocks written back to the origin.",
                self.writebacks as f64,
            ),
            (
                "strata_writecache_writeback_errors_total",
                Counter,
                "Write-back batches that failed.",
                self.writeback_errors as f64,
            ),
            (
                "strata_writecache_log_write_errors_total",
                Counter,
                "Writes the log's device failed (a write then goes around the log; a read's window is not kept).",
                self.log_write_errors as f64,
            ),
            (
                "strata_writecache_evictions_total",
                Counter,
                "Clean blocks dropped from the log to free slots.",
                self.evictions as f64,
            ),
            (
                "strata_writecache_reads_kept_total",
                Counter,
                "Blocks read from the origin kept in the log as clean copies.",
                self.reads_kept as f64,
            ),
            ("strata_writecache_commits_total", Counter, "Commits (one fast-device flush each).", self.commits as f64),
            (
                "strata_writecache_writeback_rate_blocks_per_second",
                Gauge,
                "The write-back controller's rate (+Inf: flat out).",
                self.writeback_rate.unwrap_or(f64::INFINITY),
            ),
            ("strata_writecache_memory_bytes", Gauge, "RAM the log's books take.", self.memory_bytes as f64),
            (
                "strata_writecache_low_watermark_ratio",
                Gauge,
                "Dirty share the write-back aims for.",
                self.tunables.low_watermark as f64 / 100.0,
            ),
        ];
        rows.into_iter().map(|(name, kind, help, value)| Sample::new(name, kind, help, value)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunables_refuse_bad_values_and_keep_the_old_ones() {
        let mut t = Tunables::default();
        t.set("high_watermark", "80").unwrap();
        t.set("low_watermark", "10").unwrap();
        assert!(t.set("low_watermark", "90").is_err());
        assert!(t.set("high_watermark", "101").is_err());
        assert!(t.set("cleaner", "maybe").is_err());
        assert!(t.set("nonsense", "1").is_err());
        assert_eq!((t.high_watermark, t.low_watermark, t.cleaner), (80, 10, false));
        // Together, the watermarks are checked once both are in.
        let mut u = t;
        u.set_all(&[("high_watermark", "5"), ("low_watermark", "2")]).unwrap();
        assert_eq!((u.high_watermark, u.low_watermark), (5, 2));
        let before = u;
        assert!(u.set_all(&[("max_age", "7"), ("low_watermark", "9")]).is_err());
        assert!(u.set_all(&[("max_age", "7"), ("cleaner", "maybe")]).is_err());
        assert_eq!(u, before, "a refused set changes nothing");
        // Out of range: refused, never stored as something else.
        let before = t;
        assert!(t.set("autocommit_blocks", "0").is_err());
        assert!(t.set("writeback_jobs", "99999999999").is_err());
        assert!(t.set("readahead", "1TiB").is_err());
        assert_eq!(t, before);
        t.set("readahead", "64KiB").unwrap();
        assert_eq!(t.readahead_bytes, 64 << 10);
    }

    /// A superblock's settings text, sealed, holding what `set` refuses: the defaults are
    /// taken (a readahead past the bound made a window as large as the origin).
    #[test]
    fn settings_set_would_refuse_read_back_as_the_defaults() {
        let good = Tunables { readahead_bytes: 64 << 10, ..Tunables::default() };
        assert_eq!(Tunables::decode(&good.encode()), good);
        for bad in [
            Tunables { readahead_bytes: u64::MAX, ..good },
            Tunables { readahead_bytes: strata_policy::MAX_READAHEAD_BYTES + 1, ..good },
            Tunables { autocommit_blocks: 0, ..good },
            Tunables { high_watermark: 101, ..good },
        ] {
            assert_eq!(Tunables::decode(&bad.encode()), Tunables::default(), "{bad:?}");
        }
    }
}
