//! Accounting the cache keeps about itself: hit and miss counters with windows (last 10 s,
//! 1 min, 1 h, all time), the migration budget (a token bucket in bytes per second), and
//! how busy the origin is, split between foreground IO and migration.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Counters {
    pub read_hits: AtomicU64,
    pub read_misses: AtomicU64,
    pub write_hits: AtomicU64,
    pub write_misses: AtomicU64,
    pub promotions: AtomicU64,
    /// Promotions that came along with a missed neighbour (readahead).
    pub readahead_blocks: AtomicU64,
    pub demotions: AtomicU64,
    pub writebacks: AtomicU64,
    /// Origin writes that write-back made (adjacent dirty blocks merge into one).
    pub writeback_writes: AtomicU64,
    /// Write-backs that failed; their blocks stay dirty.
    pub writeback_errors: AtomicU64,
    pub bypassed: AtomicU64,
    /// Partial writes to uncached blocks in writethrough, sent to the origin alone.
    pub partial_writes_around: AtomicU64,
    pub migration_bytes: AtomicU64,
    pub promotions_skipped: AtomicU64,
    pub commits: AtomicU64,
    pub cache_read_errors: AtomicU64,
    /// Eviction victims the policy chose dirty, which the engine refused (a policy bug).
    pub dirty_victims_refused: AtomicU64,
}

impl Counters {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    /// Block reads and writes the volume has served, hits and misses.
    pub fn accesses(&self) -> u64 {
        let (h, m) = self.hits_misses();
        h + m
    }

    fn hits_misses(&self) -> (u64, u64) {
        (
            self.read_hits.load(Relaxed) + self.write_hits.load(Relaxed),
            self.read_misses.load(Relaxed) + self.write_misses.load(Relaxed),
        )
    }
}

/// Snapshots of (time, hits, misses) once a second, for windowed hit ratios.
pub struct Windows {
    snaps: Mutex<VecDeque<(Instant, u64, u64)>>,
}

impl Default for Windows {
    fn default() -> Self {
        Self::new()
    }
}

impl Windows {
    pub fn new() -> Windows {
        Windows { snaps: Mutex::new(VecDeque::new()) }
    }

    /// Records a snapshot if a second has passed since the last one.
    pub fn tick(&self, c: &Counters) {
        let now = Instant::now();
        let mut s = self.snaps.lock();
        if s.back().is_none_or(|(t, _, _)| now.duration_since(*t) >= Duration::from_secs(1)) {
            let (h, m) = c.hits_misses();
            s.push_back((now, h, m));
            while s.len() > 3601 {
                s.pop_front();
            }
        }
    }

    /// Hit ratio over the last `window` (or since the oldest snapshot if younger).
    pub fn ratio(&self, c: &Counters, window: Duration) -> Option<f64> {
        let (h, m) = c.hits_misses();
        let s = self.snaps.lock();
        let now = Instant::now();
        let base = s.iter().find(|(t, _, _)| now.duration_since(*t) <= window).or(s.back()).copied();
        let (bh, bm) = base.map(|(_, h, m)| (h, m)).unwrap_or((0, 0));
        let (dh, dm) = (h - bh, m - bm);
        (dh + dm > 0).then(|| dh as f64 / (dh + dm) as f64)
    }

    pub fn total(c: &Counters) -> Option<f64> {
        let (h, m) = c.hits_misses();
        (h + m > 0).then(|| h as f64 / (h + m) as f64)
    }
}

/// The migration budget: bytes per second, with at most one second of burst.
pub struct Budget {
    inner: Mutex<(f64, Instant, u64)>, // (tokens, last refill, rate)
}

impl Budget {
    pub fn new(bytes_per_s: u64) -> Budget {
        Budget { inner: Mutex::new((bytes_per_s as f64, Instant::now(), bytes_per_s)) }
    }

    pub fn set_rate(&self, bytes_per_s: u64) {
        self.inner.lock().2 = bytes_per_s;
    }

    pub fn rate(&self) -> u64 {
        self.inner.lock().2
    }

    /// Gives back `bytes` taken for a migration that did not happen.
    pub fn refund(&self, bytes: u64) {
        let mut g = self.inner.lock();
        let (tokens, _, rate) = &mut *g;
        *tokens = (*tokens + bytes as f64).min((*rate).max(bytes) as f64);
    }

    /// Takes `bytes` if available now (a rate of 0 means unlimited).
    pub fn try_take(&self, bytes: u64) -> bool {
        let mut g = self.inner.lock();
        let (tokens, last, rate) = &mut *g;
        if *rate == 0 {
            return true;
        }
        let now = Instant::now();
        let cap = (*rate).max(bytes) as f64;
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * *rate as f64).min(cap);
        *last = now;
        if *tokens >= bytes as f64 {
            *tokens -= bytes as f64;
            true
        } else {
            false
        }
    }
}

/// Bytes of whole-block buffers that promotions hold at once, over every volume of the
/// server: a promotion that would pass it is skipped (the read or write goes to the origin
/// alone), unless none is in flight, so blocks larger than it still promote one at a time.
pub const PROMOTION_BUFFER_BYTES: u64 = 256 << 20;

static PROMOTION_BUFFERS: AtomicU64 = AtomicU64::new(0);

/// Bytes of `PROMOTION_BUFFER_BYTES` held by one promotion, given back when dropped.
#[must_use]
pub struct BufferPermit {
    bytes: u64,
}

impl BufferPermit {
    /// `bytes` of the promotion buffers, if they fit under the cap (or none are held).
    pub fn try_take(bytes: u64) -> Option<BufferPermit> {
        PROMOTION_BUFFERS
            .fetch_update(Relaxed, Relaxed, |used| {
                (used == 0 || used + bytes <= PROMOTION_BUFFER_BYTES).then_some(used + bytes)
            })
            .ok()
            .map(|_| BufferPermit { bytes })
    }

    /// Takes `bytes` more, if they fit under the cap.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let grown = PROMOTION_BUFFERS
            .fetch_update(Relaxed, Relaxed, |used| (used + bytes <= PROMOTION_BUFFER_BYTES).then_some(used + bytes))
            .is_ok();
        if grown {
            self.bytes += bytes;
        }
        grown
    }
}

impl Drop for BufferPermit {
    fn drop(&mut self) {
        PROMOTION_BUFFERS.fetch_sub(self.bytes, Relaxed);
    }
}

/// Busy time of the origin (time with at least one request in flight), for foreground and
/// migration IO apart.
pub struct OriginMeter {
    state: Mutex<[(u32, Instant, Duration); 2]>,
}

#[derive(Clone, Copy)]
pub enum Kind {
    Foreground = 0,
    Migration = 1,
}

pub struct Busy<'a> {
    meter: &'a OriginMeter,
    kind: Kind,
}

impl Default for OriginMeter {
    fn default() -> Self {
        Self::new()
    }
}

impl OriginMeter {
    pub fn new() -> OriginMeter {
        let now = Instant::now();
        OriginMeter { state: Mutex::new([(0, now, Duration::ZERO); 2]) }
    }

    pub fn start(&self, kind: Kind) -> Busy<'_> {
        let mut s = self.state.lock();
        let e = &mut s[kind as usize];
        if e.0 == 0 {
            e.1 = Instant::now();
        }
        e.0 += 1;
        Busy { meter: self, kind }
    }

    /// Total busy time so far, counting requests still in flight.
    pub fn busy(&self, kind: Kind) -> Duration {
        let s = self.state.lock();
        let e = &s[kind as usize];
        e.2 + if e.0 > 0 { e.1.elapsed() } else { Duration::ZERO }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut s = self.meter.state.lock();
        let e = &mut s[self.kind as usize];
        e.0 -= 1;
        if e.0 == 0 {
            e.2 += e.1.elapsed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_limits_bytes_per_second() {
        let b = Budget::new(1 << 20);
        let mut taken = 0;
        while b.try_take(65536) {
            taken += 65536;
        }
        assert_eq!(taken, 1 << 20, "one second of burst");
        assert!(Budget::new(0).try_take(u64::MAX / 2), "0 means unlimited");
    }
}
