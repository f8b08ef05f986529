//! A decorator that counts what passes through a device: requests and bytes per operation,
//! errors, and latency histograms. The server wraps every volume in one, so `strata status`
//! and `/metrics` see the same numbers whatever the volume is.

use crate::{BlockDev, BoxFut, Buf, Extent, Result, ZeroFlags};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Histogram buckets: upper bounds in microseconds (powers of two, 1 µs to ~8.4 s), then +Inf.
pub const LATENCY_BUCKETS_US: [u64; 24] = {
    let mut b = [0u64; 24];
    let mut i = 0;
    while i < 24 {
        b[i] = 1 << i;
        i += 1;
    }
    b
};

/// The bucket a latency of `us` microseconds counts in: the first whose bound it does not
/// exceed, or `LATENCY_BUCKETS_US.len()` (+Inf).
pub fn latency_bucket(us: u64) -> usize {
    LATENCY_BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(LATENCY_BUCKETS_US.len())
}

#[derive(Default)]
pub struct OpStats {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    pub latency_us_sum: AtomicU64,
    /// Counts per bucket of `LATENCY_BUCKETS_US`, plus one for larger.
    pub buckets: [AtomicU64; 25],
}

impl OpStats {
    fn record(&self, bytes: u64, start: Instant, ok: bool) {
        let us = start.elapsed().as_micros() as u64;
        self.requests.fetch_add(1, Relaxed);
        if ok {
            self.bytes.fetch_add(bytes, Relaxed);
        } else {
            self.errors.fetch_add(1, Relaxed);
        }
        self.latency_us_sum.fetch_add(us, Relaxed);
        self.buckets[latency_bucket(us)].fetch_add(1, Relaxed);
    }

    pub fn to_json(&self) -> serde_json::Value {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        serde_json::json!({
            "requests": self.requests.load(Relaxed),
            "bytes": self.bytes.load(Relaxed),
            "errors": self.errors.load(Relaxed),
            "latency_us_sum": self.latency_us_sum.load(Relaxed),
            "latency_us_buckets": buckets,
        })
    }
}

/// The operations counted, in the order they are reported.
pub const OPS: [&str; 7] = ["read", "write", "flush", "discard", "write_zeroes", "block_status", "cache"];

pub struct StatsDev<D> {
    inner: D,
    /// Shared with the handles of its connections (`connect`), which count here too.
    ops: Arc<[OpStats; 7]>,
}

impl<D: BlockDev> StatsDev<D> {
    pub fn new(inner: D) -> StatsDev<D> {
        StatsDev { inner, ops: Default::default() }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn op(&self, name: &str) -> &OpStats {
        &self.ops[OPS.iter().position(|o| *o == name).expect("known op")]
    }

    /// Counters per operation, as JSON.
    pub fn counters(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (name, s) in OPS.iter().zip(self.ops.iter()) {
            m.insert(name.to_string(), s.to_json());
        }
        serde_json::Value::Object(m)
    }

    fn timed<'a, T: Send + 'a>(&'a self, op: usize, bytes: u64, fut: BoxFut<'a, Result<T>>) -> BoxFut<'a, Result<T>> {
        Box::pin(async move {
            let start = Instant::now();
            let r = fut.await;
            self.ops[op].record(bytes, start, r.is_ok());
            r
        })
    }
}

impl<D: BlockDev> BlockDev for StatsDev<D> {
    crate::forward!(inner: size, geometry, describe, status, metrics, message, disconnect, shutdown, grow);
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        let n = buf.len() as u64;
        self.timed(0, n, self.inner.read(offset, buf))
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        let n = buf.len() as u64;
        self.timed(1, n, self.inner.write(offset, buf, fua))
    }
    fn flush(&self) -> BoxFut<'_, Result<()>> {
        self.timed(2, 0, self.inner.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        self.timed(3, len, self.inner.discard(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        self.timed(4, len, self.inner.write_zeroes(offset, len, flags))
    }
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        self.timed(5, len, self.inner.block_status(offset, len))
    }
    fn cache(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        self.timed(6, len, self.inner.cache(offset, len))
    }
    fn connect(&self) -> Option<Arc<dyn BlockDev>> {
        let inner = self.inner.connect()?;
        Some(Arc::new(StatsDev { inner, ops: self.ops.clone() }))
    }
}
