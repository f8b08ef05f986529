//! The writecache target: every write goes to a free slot of the fast device and an
//! in-memory index maps its origin block to the newest slot; reads of a logged block come
//! from the fast device, every other read from the origin, which keeps the read's window in
//! free slots above the writes' reserve when there are some (`io.rs`, `readahead`). A
//! commit writes the changed entries and flushes the fast device once; FLUSH and FUA wait
//! for one. When no slot is free, a write goes around the log to the origin instead of
//! waiting, and the block's logged copies are cleared on disk before it is acknowledged (a
//! copy of a block it covers only in part written back first), so an older copy can never
//! win afterwards (see `state.rs` for the rules).
//!
//! By concern: `io` serves reads, writes, discards and write-zeroes; `commit` makes entries
//! durable; `writeback` copies dirty blocks to the origin in origin-address order and runs
//! the background task; `state` keeps the slots' books and checks the invariants; `open`
//! recovers a cache from its entries; `status` reports and takes messages.

mod commit;
mod index;
mod io;
mod open;
mod state;
mod status;
mod writeback;

pub use open::OpenOptions;

use crate::format::Superblock;
use crate::status::Tunables;
use parking_lot::Mutex;
use state::State;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use strata_io::background::Background;
use strata_io::{check_range, overlay, BlockDev, BoxFut, Buf, Extent, Geometry, Result, ZeroFlags};
use tokio::sync::Notify;

/// Block locks: an origin block hashes to one of these; writes and write-arounds of a block
/// hold its lock, write-backs and write-arounds its origin-write lock.
const STRIPES: usize = 1024;
/// Bytes of the volume under one lock stripe.
const STRIPE_BYTES: u64 = 1 << 20;

#[derive(Default)]
pub(crate) struct Counters {
    pub read_hits: AtomicU64,
    pub read_misses: AtomicU64,
    pub write_hits: AtomicU64,
    pub write_misses: AtomicU64,
    pub writes_around: AtomicU64,
    pub writes_around_partial: AtomicU64,
    pub writes_around_writebacks: AtomicU64,
    pub writes_around_superseded: AtomicU64,
    pub writebacks: AtomicU64,
    pub writeback_errors: AtomicU64,
    pub log_write_errors: AtomicU64,
    pub commits: AtomicU64,
    pub evictions: AtomicU64,
    pub reads_kept: AtomicU64,
}

pub(crate) struct Inner {
    pub(crate) sb: Superblock,
    cache: Arc<dyn BlockDev>,
    origin: Arc<dyn BlockDev>,
    block: u64,
    size: u64,
    describe_origin: String,
    pub(crate) state: Mutex<State>,
    stripes: Vec<tokio::sync::Mutex<()>>,
    /// Origin-write locks, by the same hash: write-back and a write going around the log
    /// hold a block's while they write it to the origin, so an older copy never lands after
    /// a newer one. Logged writes do not take them; one waits for a write-back only behind a
    /// write around the log that holds its block lock while it waits for the write-back.
    origin_locks: Vec<tokio::sync::Mutex<()>>,
    /// One commit at a time.
    commit_lock: tokio::sync::Mutex<()>,
    /// Held alone by a commit over its fast-device flush until a failure is marked
    /// (`log_suspect`); shared by reads of slots whose entry is not durable yet, whose data
    /// that flush makes durable or loses (`read_piece`).
    flush_gate: tokio::sync::RwLock<()>,
    /// Writes that went to the origin directly (completed), and how many of them a completed
    /// origin flush covers.
    origin_writes: AtomicU64,
    origin_durable: tokio::sync::Mutex<u64>,
    pub(crate) counters: Counters,
    pub(crate) tunables: Mutex<Tunables>,
    /// Wakes the background task (a write filled the log, a tunable changed, a shutdown).
    kick: Notify,
    /// Write-back and commits, which a shutdown stops and waits out.
    background: Background,
    /// The write-back controller's rate (f64 bits, blocks per second; infinite: flat out).
    writeback_rate: AtomicU64,
    /// When a large write last went around the log (nanoseconds since `epoch`, 0: never):
    /// write-back pauses for `pause_writeback` after it, and a batch stops at its next run
    /// when one starts.
    last_stream: AtomicU64,
    epoch: std::time::Instant,
    /// The last fault (write-back or commit), for status.
    pub(crate) last_error: Mutex<Option<String>>,
    /// The log's device refused the copies of a read's window: read misses keep nothing
    /// (and read no window) until a write to the log succeeds again. Without it a full or
    /// failing device would cost every read miss a whole window from the origin, for ever.
    keeping_refused: AtomicBool,
}

/// The lock stripe of 1 MiB range `r` (see `Inner::stripe`).
fn range_stripe(r: u64) -> usize {
    (r.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % STRIPES
}

fn ascending(stripes: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut v: Vec<usize> = stripes.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Locks `stripes` of `locks` in the order given (ascending, as every path takes them).
async fn lock_all<'a>(locks: &'a [tokio::sync::Mutex<()>], stripes: &[usize]) -> Vec<tokio::sync::MutexGuard<'a, ()>> {
    let mut guards = Vec::with_capacity(stripes.len());
    for &i in stripes {
        guards.push(locks[i].lock().await);
    }
    guards
}

/// The writecache target over an already-opened fast device and origin.
pub struct WritecacheDev {
    inner: Arc<Inner>,
    describe: String,
}

impl Inner {
    /// The lock stripe of block `b`: blocks of one aligned `STRIPE_BYTES` range share one,
    /// so a large request takes one or two locks.
    fn stripe(&self, b: u64) -> usize {
        range_stripe(b / self.blocks_per_stripe())
    }

    fn blocks_per_stripe(&self) -> u64 {
        (STRIPE_BYTES / self.block).max(1)
    }

    /// The stripes of blocks `first..=last`, ascending, each once (one per range, not per
    /// block).
    fn stripes_of_range(&self, first: u64, last: u64) -> Vec<usize> {
        let per = self.blocks_per_stripe();
        ascending((first / per..=last / per).map(range_stripe))
    }

    /// The block locks of `first..=last` if none is held now (ascending, as every path takes
    /// them), else none.
    fn try_lock_range(&self, first: u64, last: u64) -> Option<Vec<tokio::sync::MutexGuard<'_, ()>>> {
        self.stripes_of_range(first, last).into_iter().map(|i| self.stripes[i].try_lock().ok()).collect()
    }

    /// Slots kept free for writes: `100 - high_watermark` percent (at least one); eviction
    /// brings clean blocks out to keep them, and reads never take them.
    fn reserve(&self, t: &Tunables) -> u64 {
        (self.sb.slots * (100 - t.high_watermark as u64)).div_ceil(100).max(1)
    }

    /// The stripes of `blocks`, ascending, each once.
    fn stripes_of(&self, blocks: impl Iterator<Item = u64>) -> Vec<usize> {
        ascending(blocks.map(|b| self.stripe(b)))
    }

    fn slot_offset(&self, s: u32) -> u64 {
        self.sb.slot_offset(s as u64)
    }

    /// Nanoseconds since `epoch` (never 0).
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// Whether a large write went around the log within the last `ms` milliseconds.
    fn streamed_within(&self, ms: u64) -> bool {
        let last = self.last_stream.load(std::sync::atomic::Ordering::Relaxed);
        last != 0 && self.now_ns().saturating_sub(last) < ms.saturating_mul(1_000_000)
    }

    /// Bytes of block `b` inside the volume (the last block may be short).
    fn block_len(&self, b: u64) -> u64 {
        self.block.min(self.size - b * self.block)
    }
}

impl WritecacheDev {
    /// Runs the invariants of the slots' books (tests and `check`).
    pub fn check_state(&self) -> std::result::Result<(), String> {
        self.inner.state.lock().check()
    }

    pub fn block_bytes(&self) -> u32 {
        self.inner.sb.block_bytes
    }

    /// Writes back everything dirty and waits until it is on the origin and durable.
    pub async fn writeback_all(&self) -> Result<()> {
        self.inner.writeback_all().await
    }

    /// Drops every clean block from the log and clears their entries on disk (later reads of
    /// them go to the origin).
    pub async fn evict_clean(&self) -> Result<()> {
        self.inner.evict_all_clean().await
    }

    /// Makes everything durable now (as FLUSH does).
    pub async fn commit(&self) -> Result<()> {
        self.inner.commit_force().await
    }
}

impl BlockDev for WritecacheDev {
    fn size(&self) -> u64 {
        self.inner.size
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            min_block_bytes: self
                .inner
                .cache
                .geometry()
                .min_block_bytes
                .max(self.inner.origin.geometry().min_block_bytes),
            preferred_block_bytes: self.inner.sb.block_bytes,
            rotational: false,
            can_discard: true,
            can_fast_zero: false,
            read_only: self.inner.origin.geometry().read_only,
        }
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        Box::pin(self.inner.read(offset, buf))
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(self.inner.write(offset, buf, fua))
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.flush())
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.discard(offset, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.write_zeroes(offset, len, flags))
    }

    /// Blocks the log holds are data; the others as the origin says (`strata_io::overlay`).
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        Box::pin(async move {
            check_range("writecache block_status", offset, len, self.inner.size)?;
            let i = &self.inner;
            overlay::block_status(&*i.origin, offset, len, |pos, left| {
                let st = i.state.lock();
                overlay::leading_run(pos, left, i.block, |b| st.log_suspect || st.logged_anywhere(b))
            })
            .await
        })
    }

    /// The log's state, and its origin's under `origin` when it has one.
    fn status(&self) -> Option<serde_json::Value> {
        let mut v = serde_json::to_value(self.inner.status()).ok()?;
        if let Some(o) = self.inner.origin.status() {
            v["origin"] = o;
        }
        Some(v)
    }

    fn metrics(&self) -> Vec<strata_io::metrics::Sample> {
        let mut m = self.inner.status().samples();
        m.extend(self.inner.origin.metrics());
        m
    }

    fn message(&self, msg: &str) -> BoxFut<'_, Result<String>> {
        let msg = msg.to_string();
        Box::pin(async move { self.inner.message(&msg).await })
    }

    /// Stops write-back and makes the log durable, then closes its origin: a cache below is
    /// closed cleanly too, and a shared device's lease is given up.
    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            self.inner.background.stop(&self.inner.kick).await;
            self.inner.flush().await?;
            self.inner.origin.shutdown().await
        })
    }
}

fn relaxed(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

/// A new log of 4 KiB blocks on `cache` in front of `origin`, opened with `t` and no
/// background task (the crate's unit tests).
#[cfg(test)]
pub(crate) async fn test_log(cache: Arc<dyn BlockDev>, origin: Arc<dyn BlockDev>, t: Tunables) -> WritecacheDev {
    let o = crate::offline::CreateOptions { block_bytes: 4096, ..crate::offline::CreateOptions::default() };
    crate::offline::create(&*cache, &*origin, &o).await.unwrap();
    WritecacheDev::open(cache, origin, OpenOptions { no_background: true, tunables: Some(t) }).await.unwrap()
}
