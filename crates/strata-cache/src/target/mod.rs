//! The cache target: where a hit is served, a miss promoted, a write absorbed, a dirty block
//! written back. A read always returns the last completed write, whatever state its block is
//! in: foreground IO to a block holds its lock shared, a migration of that block holds it
//! exclusively; a slot leaves the mapping and the policy together, under the state lock, and
//! is reused only after the commit that records it free and once no IO still reads it.
//!
//! By concern: `read` serves hits and promotes misses (with readahead), `write` absorbs
//! writes and promotes or moves blocks, `discard` drops cached copies before a discard or
//! write-zeroes reaches the origin, `commit` makes mappings durable, `writeback` copies dirty
//! blocks to the origin and runs the background controller, `state` keeps the slots' books
//! under the state lock and checks the invariants, `open` recovers a cache and shuts it
//! down, `status` reports and takes messages.

mod commit;
mod discard;
mod open;
mod read;
mod state;
mod status;
mod write;
mod writeback;

pub(crate) use open::open_bytes_per_slot;
pub use open::OpenOptions;

use crate::meta::Meta;
use crate::meter::{Budget, Counters, Kind, OriginMeter, Windows};
use crate::streams::Streams;
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use strata_io::background::Background;
use strata_io::{check_range, overlay, BlockDev, BoxFut, Buf, Error, Extent, Geometry, Result, ZeroFlags};
use strata_policy::Policy;
use tokio::sync::{Notify, RwLock};

/// Block locks: each origin block hashes to one of `SHARDS`, by the top `SHARD_BITS` bits of
/// a multiplicative hash.
const SHARD_BITS: u32 = 10;
const SHARDS: usize = 1 << SHARD_BITS;

/// Everything that changes under the state lock: the mapping, the policy, the table, the
/// slots' books (kept, and checked, in `state.rs`) and the faults.
struct State {
    policy: Box<dyn Policy + Send>,
    map: FxHashMap<u64, u32>,
    meta: Meta,
    /// Slots free on the device (their release is committed).
    free: Vec<u32>,
    /// Slots freed in memory, reusable after the next commit.
    freed: Vec<u32>,
    /// The freed slots the commit under way records free: free once it is durable, back to
    /// `freed` if it fails.
    committing: Vec<u32>,
    /// Slots `reserve` gave out for a promotion or a move under way: neither free nor mapped
    /// until `map_to` maps them or `release` hands them back.
    reserved: usize,
    /// Per slot: bumped by every write, so a write-back knows whether it is still current.
    write_gen: Vec<u32>,
    /// Sequential streams of reads, and of writes since the last flush (the cutoff's).
    read_streams: Streams,
    write_streams: Streams,
    /// Origin blocks zeroed whole (by a write-zeroes the origin carried out) since start:
    /// promoting them needs no copy. A discard does not count: it need not zero anything.
    zeroed: FxHashSet<u64>,
    /// Blocks unmapped in memory whose old mapping may still be durable, with the number of
    /// the table change that unmapped them. Nothing may write such a block on the origin
    /// until that change is durable: after a crash the old mapping would come back over it
    /// (see `Inner::settle`).
    pending: FxHashMap<u64, u64>,
    /// Table changes up to this number are durable.
    durable_changes: u64,
    /// Clean mappings made since the last full commit, not in the table yet: a clean slot
    /// copies origin data that may not be durable, so each enters the table at a full
    /// commit, whose origin flush comes first. Every other change depends on the cache
    /// device alone, so a commit that waits for one needs no origin flush (`commit_upto`).
    unrecorded: Vec<(u64, u32)>,
    /// Write back everything dirty (cache flush, detach).
    flush_all: bool,
    /// Faults that put the volume in a degraded state.
    faults: Vec<String>,
    /// A fault moved the volume from writeback to writethrough, and the superblock keeps
    /// writeback: the safe mode lasts until restart or until an operator sets a mode.
    safe_mode: bool,
    /// Why the volume stopped acknowledging writes: a flush or commit failed, so data it
    /// covered may be gone from a device however later flushes fare. Latched until restart.
    failed: Option<String>,
    /// The failure was the cache device's: a slot written since its last good flush may
    /// hold older data, another block's, so no read is served from the cache any more.
    cache_suspect: bool,
    /// Slots mapped (filled, or written whole in a new place) since the cache flush now
    /// under way or the last one started, and those that flush covers: their data is gone
    /// if it fails (`Inner::read_slot`).
    fresh: FxHashSet<u32>,
    flushing: FxHashSet<u32>,
}

/// The target, shared by the IO paths and the background task.
struct Inner {
    origin: Arc<dyn BlockDev>,
    cache: Arc<dyn BlockDev>,
    block: u64,
    data_offset: u64,
    origin_bytes: u64,
    state: Mutex<State>,
    shards: Vec<Arc<RwLock<()>>>,
    refs: Vec<AtomicU32>,
    commit_lock: tokio::sync::Mutex<()>,
    /// Held alone over each cache flush of a commit until a failure is marked
    /// (`cache_suspect`); shared by reads of fresh slots (`read_slot`).
    flush_gate: RwLock<()>,
    counters: Counters,
    windows: Windows,
    budget: Budget,
    meter: OriginMeter,
    wake: Notify,
    /// Commits and write-back, which a shutdown stops and waits out.
    background: Background,
    epoch: Instant,
    describe: String,
    share_cap: Mutex<f64>,
    /// The origin was busy with foreground IO at the background task's last look (then
    /// writeback may stop making new dirty data: see `write_mode`).
    origin_busy: AtomicBool,
    /// The origin's last answer was `Unavailable` (a remote server away for now): writeback
    /// then keeps making dirty data (see `dirty_limited`).
    origin_away: AtomicBool,
}

/// The cache target as a `BlockDev`. Background tasks (write-back, periodic commit) stop
/// when it is shut down or dropped.
pub struct CacheDev {
    inner: Arc<Inner>,
}

impl Inner {
    fn shard(&self, b: u64) -> &Arc<RwLock<()>> {
        &self.shards[self.shard_index(b)]
    }

    fn shard_index(&self, b: u64) -> usize {
        (b.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARD_BITS)) as usize
    }

    fn slot_offset(&self, s: u32) -> u64 {
        self.data_offset + s as u64 * self.block
    }

    /// Reads `buf.len()` bytes at `within` of slot `s`, `fresh` as the caller found it under
    /// the state lock it held anyway (`State::is_fresh`). A fresh slot loses its data if the
    /// flush under way fails, and then holds what it held before (another block's data):
    /// such a read waits that flush out and, after a failed one, fails rather than return
    /// it. The others read at once.
    async fn read_slot(&self, s: u32, within: u64, buf: Buf, fresh: bool) -> Result<Buf> {
        let _between = match fresh {
            true => Some(self.flush_gate.read().await),
            false => None,
        };
        if fresh && self.state.lock().cache_suspect {
            return Err(Error::new(
                strata_io::ErrorKind::Io,
                format!("cache slot {s}: its data went with a failed cache flush"),
            ));
        }
        self.cache.read(self.slot_offset(s) + within, buf).await
    }

    /// Bytes of origin block `b` (the last block may be short).
    fn block_len(&self, b: u64) -> u64 {
        self.block.min(self.origin_bytes - b * self.block)
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// `[offset, offset+len)` as (block, offset within block, length) pieces.
    fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64, u64)> {
        let mut v = Vec::with_capacity((len / self.block + 2) as usize);
        let mut pos = offset;
        while pos < offset + len {
            let b = pos / self.block;
            let within = pos % self.block;
            let n = (self.block - within).min(offset + len - pos);
            v.push((b, within, n));
            pos += n;
        }
        v
    }

    async fn origin_read(&self, offset: u64, buf: Buf, kind: Kind) -> Result<Buf> {
        let _busy = self.meter.start(kind);
        self.origin_answered(self.origin.read(offset, buf).await)
    }

    async fn origin_write(&self, offset: u64, buf: Buf, fua: bool, kind: Kind) -> Result<Buf> {
        let _busy = self.meter.start(kind);
        self.origin_answered(self.origin.write(offset, buf, fua).await)
    }

    /// Notes whether the origin is away for now (`origin_away`) from one of its answers.
    fn origin_answered<T>(&self, answer: Result<T>) -> Result<T> {
        match &answer {
            Ok(_) => self.origin_away.store(false, Relaxed),
            Err(e) if e.kind == strata_io::ErrorKind::Unavailable => self.origin_away.store(true, Relaxed),
            Err(_) => {}
        }
        answer
    }
}

/// `e`, saying what it happened during.
fn during(e: Error, what: &str) -> Error {
    Error::new(e.kind, format!("{what}: {}", e.context))
}

/// Runs futures concurrently and collects their results in order (first error wins).
async fn futures_join<T, F>(futs: impl Iterator<Item = F>) -> Result<Vec<T>>
where
    F: std::future::Future<Output = Result<T>>,
{
    futures_collect(futs).await.into_iter().collect()
}

async fn futures_collect<T, F>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T>,
{
    futures::future::join_all(futs).await
}

/// Slots kept out of the policy's reach: a promotion takes a slot whose release is already
/// durable while the slot it evicted waits for the next commit, so the policy manages all
/// but a small reserve (1/64 of the slots, 1 to 256).
pub fn slot_reserve(slots: usize) -> usize {
    (slots / 64).clamp(1, 256).min(slots.saturating_sub(1))
}

/// What the policy is given to manage.
pub fn policy_capacity(slots: usize) -> usize {
    (slots - slot_reserve(slots)).max(1)
}

impl BlockDev for CacheDev {
    fn size(&self) -> u64 {
        self.inner.origin_bytes
    }

    fn geometry(&self) -> Geometry {
        let o = self.inner.origin.geometry();
        let c = self.inner.cache.geometry();
        Geometry {
            min_block_bytes: o.min_block_bytes.max(c.min_block_bytes),
            preferred_block_bytes: o.preferred_block_bytes.max(c.preferred_block_bytes),
            rotational: false,
            can_discard: true,
            can_fast_zero: o.can_fast_zero,
            read_only: o.read_only || c.read_only,
        }
    }

    fn describe(&self) -> String {
        self.inner.describe.clone()
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        Box::pin(self.inner.read(offset, buf))
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(self.inner.write(offset, buf, fua))
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        self.inner.state.lock().write_streams.synced();
        Box::pin(self.inner.commit())
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.discard(offset, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        Box::pin(self.inner.write_zeroes(offset, len, flags))
    }

    /// Cached blocks are data; the others as the origin says (`strata_io::overlay`).
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        Box::pin(async move {
            check_range("cache block_status", offset, len, self.size())?;
            let i = &self.inner;
            overlay::block_status(&*i.origin, offset, len, |pos, left| {
                let st = i.state.lock();
                overlay::leading_run(pos, left, i.block, |b| st.map.contains_key(&b))
            })
            .await
        })
    }

    fn cache(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        // A prefetch hint: read the range through the cache so the policy sees it.
        Box::pin(async move {
            strata_io::check_range("cache prefetch", offset, len, self.inner.origin_bytes)?;
            let mut pos = offset;
            while pos < offset + len {
                let n = (offset + len - pos).min(4 << 20);
                self.inner.read(pos, Buf::zeroed(n as usize)).await?;
                pos += n;
            }
            Ok(())
        })
    }

    /// The cache's state, and its origin's under `origin` when it has one (a remote origin:
    /// up or away, reconnects).
    fn status(&self) -> Option<serde_json::Value> {
        let mut v = self.inner.status().to_json();
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
        Box::pin(async move {
            let answer = self.inner.message(&msg).await;
            self.inner.state.lock().debug_check();
            answer
        })
    }

    /// Closes the cache cleanly, then its origin: a cache or write log below is closed cleanly
    /// too, and a shared device's lease is given up.
    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            self.inner.shutdown().await?;
            self.inner.origin.shutdown().await
        })
    }
}

impl Drop for CacheDev {
    fn drop(&mut self) {
        self.inner.background.ask_to_stop(&self.inner.wake);
    }
}
