//! A thin volume: a `BlockDev` over one device of a shared `Pool`. Requests are cut at data
//! block boundaries; each piece is read or written through its block's mapping, provisioning
//! the block on a first write, copying it on the first write after a snapshot shared it.

use crate::meta::DevId;
use crate::pool::{Pool, PoolStatus, State};
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use strata_io::metrics::{MetricKind, Sample};
use strata_io::{check_range, BlockDev, BoxFut, Buf, Error, ErrorKind, Extent, Geometry, Result, ZeroFlags};

pub struct ThinDev {
    pool: Arc<Pool>,
    id: DevId,
    size: u64,
    /// Counted open in the pool until shut down or dropped.
    open: AtomicBool,
}

/// A thin volume's state for `strata status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThinStatus {
    /// "thin".
    pub target: String,
    pub id: DevId,
    pub size_bytes: u64,
    pub mapped_blocks: u64,
    pub creation_time: u32,
    pub snapshotted_time: u32,
    pub pool: PoolStatus,
}

/// One piece of a request inside one data block.
#[derive(Debug, Clone, Copy)]
struct Piece {
    vblock: u64,
    /// Offset inside the block.
    at: u64,
    len: u64,
    /// Offset inside the request.
    pos: u64,
}

/// A data block taken for a write, given back unless `keep` is called once its mapping is in:
/// on an error, and when the write is dropped half way (another piece of its request failed,
/// and `try_join_all` dropped this one).
struct Taken<'a> {
    pool: &'a Pool,
    block: Option<u64>,
}

impl Taken<'_> {
    fn keep(mut self) {
        self.block = None;
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.block {
            let _ = self.pool.with_meta(|m| m.release_data(b));
        }
    }
}

impl ThinDev {
    /// Volume `id` of `pool`, `size` bytes (its recorded size when None).
    pub fn new(pool: Arc<Pool>, id: DevId, size: Option<u64>) -> Result<ThinDev> {
        let recorded = pool.with_meta(|m| m.device(id).map(|_| m.record().sizes.get(&id).copied()))?;
        let size = size.or(recorded).ok_or_else(|| {
            Error::new(
                ErrorKind::Invalid,
                format!("no size is recorded for thin volume {id} (a pool made by other tools?): give size="),
            )
        })?;
        pool.open_volume(id)?;
        Ok(ThinDev { pool, id, size, open: AtomicBool::new(true) })
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The one piece of a request that lies inside one block (most do), without `pieces`'
    /// allocation.
    fn single(&self, offset: u64, len: u64) -> Option<Piece> {
        let bs = self.pool.block_bytes;
        let at = offset % bs;
        (len > 0 && at + len <= bs).then_some(Piece { vblock: offset / bs, at, len, pos: 0 })
    }

    fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let bs = self.pool.block_bytes;
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < len {
            let off = offset + pos;
            let at = off % bs;
            let n = (bs - at).min(len - pos);
            out.push(Piece { vblock: off / bs, at, len: n, pos });
            pos += n;
        }
        out
    }

    /// The data block of `vblock` and whether it is shared with a snapshot.
    async fn lookup(&self, vblock: u64) -> Result<Option<(u64, bool)>> {
        self.lookup_with(vblock, |st, b, t| Ok((b, st.meta.shared(self.id, t)?))).await
    }

    /// `lookup` for a write: an error if the pool takes no writes.
    async fn lookup_to_write(&self, vblock: u64) -> Result<Option<(u64, bool)>> {
        let r = self.lookup_with(vblock, |st, b, t| {
            self.pool.writable(st)?;
            Ok((b, st.meta.shared(self.id, t)?))
        });
        r.await
    }

    /// What `what` makes of `vblock`'s mapping (data block and time), with the pool's state
    /// at hand, if it is mapped.
    async fn lookup_with<T>(&self, vblock: u64, what: impl Fn(&State, u64, u32) -> Result<T>) -> Result<Option<T>> {
        let pool = &self.pool;
        loop {
            let (missing, limits) = {
                let st = pool.state.read();
                match st.meta.lookup_or_missing(self.id, vblock)? {
                    Ok(_) if st.aborting => {
                        return Err(Error::new(ErrorKind::Io, format!("{}: the pool failed", pool.describe())))
                    }
                    Ok(Some((b, t))) => return what(&st, b, t).map(Some),
                    Ok(None) => return Ok(None),
                    Err(missing) => (missing, st.meta.limits()),
                }
            };
            pool.fetch_nodes(missing, limits).await?;
        }
    }

    async fn read_piece(&self, p: Piece, buf: Buf) -> Result<Buf> {
        let _held = self.pool.stripe(self.id, p.vblock).read().await;
        let (id, v) = (self.id, p.vblock);
        let mapped = self.lookup_with(v, |st, b, _| Ok((b, st.awaits_commit(id, v)))).await?;
        // A mapping that awaits a commit: its block's data is lost if the next flush fails,
        // and the pool then goes back to the mapping before. Read it between flushes.
        let (block, _between) = match mapped {
            Some((_, true)) => {
                let g = self.pool.flush_gate.read().await;
                (self.lookup_with(v, |_, b, _| Ok(b)).await?, Some(g))
            }
            m => (m.map(|(b, _)| b), None),
        };
        match block {
            Some(b) => self.pool.data.read(b * self.pool.block_bytes + p.at, buf).await,
            None => {
                let mut buf = buf;
                buf.fill(0);
                Ok(buf)
            }
        }
    }

    async fn write_piece(&self, p: Piece, buf: Buf, fua: bool) -> Result<Buf> {
        {
            let _held = self.pool.stripe(self.id, p.vblock).read().await;
            if let Some((b, false)) = self.lookup_to_write(p.vblock).await? {
                return self.write_mapped(p, b, buf, fua).await;
            }
        }
        // A write that needs a new block has a future of its own: the one of every write
        // to a mapped block stays small (it is allocated and moved per request).
        Box::pin(self.write_new(p, buf, fua)).await
    }

    /// A write to a block not mapped, or shared with a snapshot (unless another write mapped
    /// it meanwhile): provisions or copies it.
    async fn write_new(&self, p: Piece, buf: Buf, fua: bool) -> Result<Buf> {
        let bs = self.pool.block_bytes;
        let _held = self.pool.stripe(self.id, p.vblock).write().await;
        let found = self.lookup(p.vblock).await?;
        self.pool.check_writable()?;
        let old = match found {
            Some((b, false)) => return self.write_mapped(p, b, buf, fua).await,
            Some((b, true)) => Some(b),
            None => None,
        };
        let new = self.pool.alloc_data().await?;
        let taken = Taken { pool: &self.pool, block: Some(new) };
        let whole = p.at == 0 && p.len == bs;
        let written = if whole || (old.is_none() && self.pool.opts.skip_block_zeroing) {
            self.pool.data.write(new * bs + p.at, buf, false).await
        } else {
            // The rest of the block: the shared block's data, or zeroes.
            let mut full = match old {
                Some(b) => self.pool.data.read(b * bs, Buf::zeroed(bs as usize)).await,
                None => Ok(Buf::zeroed(bs as usize)),
            };
            if let Ok(f) = &mut full {
                f[p.at as usize..(p.at + p.len) as usize].copy_from_slice(&buf);
            }
            match full {
                Ok(f) => self.pool.data.write(new * bs, f, false).await.map(|_| buf),
                Err(e) => Err(e),
            }
        };
        let buf = written?;
        let id = self.id;
        let inserted = self
            .pool
            .with_loaded(
                |m| m.missing(id, p.vblock, true),
                |st| {
                    let r = st.meta.insert(id, p.vblock, new);
                    if r.is_ok() {
                        st.uncommitted.insert((id, p.vblock));
                    }
                    r
                },
            )
            .await;
        match inserted {
            Ok(Ok(())) => taken.keep(),
            // A node that could not be read: nothing changed.
            Err(e) => return Err(e),
            Ok(Err(e)) => {
                taken.keep();
                return Err(self.pool.fail(format!("updating the mapping failed: {}", e.context)));
            }
        }
        let c = if old.is_some() { &self.pool.counters.copied } else { &self.pool.counters.provisioned };
        c.fetch_add(1, Relaxed);
        if fua {
            self.commit_for_fua(p.vblock).await?;
        }
        Ok(buf)
    }

    /// A write to a block this volume owns alone, the pool found to take writes by the
    /// caller: straight to the data device; a FUA write commits only if the block's mapping
    /// is not yet committed.
    async fn write_mapped(&self, p: Piece, b: u64, buf: Buf, fua: bool) -> Result<Buf> {
        let buf = self.pool.data.write(b * self.pool.block_bytes + p.at, buf, fua).await?;
        if fua {
            self.commit_for_fua(p.vblock).await?;
        }
        Ok(buf)
    }

    /// After a FUA write to `vblock`: commits its mapping unless a commit since holds it (a
    /// commit flushes the data device first, so the write's data is durable with it). FUA
    /// writes to new blocks at once thus share commits.
    async fn commit_for_fua(&self, vblock: u64) -> Result<()> {
        // A commit that failed meanwhile took the pool back to its last commit, which may
        // not hold this mapping (the pool fails before it forgets): checked with the mapping.
        if self.pool.uncommitted(self.id, vblock)? {
            // Boxed: the commit's future is large, and most FUA writes need none.
            Box::pin(self.pool.commit_for(self.id, vblock)).await?;
        }
        Ok(())
    }

    /// Unmaps whole blocks of `[offset, offset+len)`; blocks left unreferenced are freed and
    /// (unless disabled) discarded on the data device.
    async fn unmap(&self, offset: u64, len: u64) -> Result<()> {
        let bs = self.pool.block_bytes;
        for p in self.pieces(offset, len) {
            if p.len != bs {
                continue;
            }
            let _held = self.pool.stripe(self.id, p.vblock).write().await;
            let id = self.id;
            let freed = self
                .pool
                .with_loaded(
                    |m| m.missing(id, p.vblock, true),
                    |st| {
                        st.uncommitted.remove(&(id, p.vblock));
                        st.meta.remove(id, p.vblock)
                    },
                )
                .await?;
            match freed {
                Ok(Some((b, free))) => {
                    self.pool.counters.unmapped.fetch_add(1, Relaxed);
                    if free && !self.pool.opts.no_discard_passdown && self.pool.data.geometry().can_discard {
                        self.pool.counters.passdowns.fetch_add(1, Relaxed);
                        // The block's contents are unspecified now; a failed passdown loses nothing.
                        let _ = self.pool.data.discard(b * bs, bs).await;
                    }
                }
                Ok(None) => {}
                Err(e) => return Err(self.pool.fail(format!("unmapping failed: {}", e.context))),
            }
        }
        Ok(())
    }

    pub fn thin_status(&self) -> ThinStatus {
        let d = self.pool.with_meta(|m| m.device(self.id).unwrap_or_default());
        ThinStatus {
            target: "thin".into(),
            id: self.id,
            size_bytes: self.size,
            mapped_blocks: d.mapped_blocks,
            creation_time: d.creation_time,
            snapshotted_time: d.snapshotted_time,
            pool: self.pool.status(),
        }
    }
}

impl Drop for ThinDev {
    fn drop(&mut self) {
        if self.open.swap(false, SeqCst) {
            self.pool.close_volume(Some(self.id), false);
        }
    }
}

impl BlockDev for ThinDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            min_block_bytes: 512,
            preferred_block_bytes: 4096,
            rotational: self.pool.data.geometry().rotational,
            can_discard: true,
            can_fast_zero: true,
            read_only: self.pool.data.geometry().read_only,
        }
    }

    fn describe(&self) -> String {
        format!("thin volume {} of {}", self.id, self.pool.describe())
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            check_range("read", offset, buf.len() as u64, self.size)?;
            if let Some(p) = self.single(offset, buf.len() as u64) {
                return self.read_piece(p, buf).await;
            }
            let pieces = self.pieces(offset, buf.len() as u64);
            let reads = pieces.iter().map(|&p| self.read_piece(p, Buf::zeroed(p.len as usize)));
            let got = futures::future::try_join_all(reads).await?;
            let mut buf = buf;
            for (p, b) in pieces.iter().zip(got) {
                buf[p.pos as usize..(p.pos + p.len) as usize].copy_from_slice(&b);
            }
            Ok(buf)
        })
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            check_range("write", offset, buf.len() as u64, self.size)?;
            if let Some(p) = self.single(offset, buf.len() as u64) {
                return self.write_piece(p, buf, fua).await;
            }
            let pieces = self.pieces(offset, buf.len() as u64);
            let writes = pieces.iter().map(|&p| {
                let part = Buf::from_slice(&buf[p.pos as usize..(p.pos + p.len) as usize]);
                self.write_piece(p, part, fua)
            });
            futures::future::try_join_all(writes).await?;
            Ok(buf)
        })
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.pool.flush())
    }

    /// A commit; the pool's last open volume also shuts its devices down.
    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            match self.open.swap(false, SeqCst) {
                true => self.pool.shutdown_volume(self.id).await,
                false => self.pool.flush().await,
            }
        })
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            check_range("discard", offset, len, self.size)?;
            self.pool.check_writable()?;
            self.unmap(offset, len).await
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            check_range("write_zeroes", offset, len, self.size)?;
            self.pool.check_writable()?;
            let bs = self.pool.block_bytes;
            // Without block zeroing an unmapped block reads as zeroes only until a first
            // write provisions it: its zeroes must be written.
            let skip = self.pool.opts.skip_block_zeroing;
            for p in self.pieces(offset, len) {
                let mapped = self.lookup(p.vblock).await?.is_some();
                if p.len == bs && (flags.may_unmap || !mapped) && !skip {
                    // An unmapped block reads as zeroes.
                    self.unmap(p.vblock * bs, bs).await?;
                } else if mapped || skip {
                    if flags.fast_only {
                        return Err(Error::new(ErrorKind::Unsupported, "zeroing part of a mapped block is not fast"));
                    }
                    let p = Piece { pos: 0, ..p };
                    self.write_piece(p, Buf::zeroed(p.len as usize), false).await?;
                }
            }
            Ok(())
        })
    }

    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        Box::pin(async move {
            check_range("block_status", offset, len, self.size)?;
            // At most 16,384 blocks per answer (the contract allows describing less).
            let bs = self.pool.block_bytes;
            let len = len.min(16384 * bs - offset % bs);
            let mut out: Vec<Extent> = Vec::new();
            for p in self.pieces(offset, len) {
                let e = if self.lookup(p.vblock).await?.is_some() { Extent::data(p.len) } else { Extent::hole(p.len) };
                match out.last_mut() {
                    Some(last) if last.hole == e.hole => last.len += e.len,
                    _ => out.push(e),
                }
            }
            Ok(out)
        })
    }

    fn status(&self) -> Option<serde_json::Value> {
        serde_json::to_value(self.thin_status()).ok()
    }

    /// The pool's live operations (see `Pool::message`), through any of its volumes.
    fn message(&self, msg: &str) -> BoxFut<'_, Result<String>> {
        let msg = msg.to_string();
        Box::pin(async move { self.pool.message(&msg).await })
    }

    fn metrics(&self) -> Vec<Sample> {
        let s = self.thin_status();
        let gauge = |name, help, value: u64| Sample::new(name, MetricKind::Gauge, help, value as f64);
        let counter = |name, help, value: u64| Sample::new(name, MetricKind::Counter, help, value as f64);
        let p = &s.pool;
        vec![
            gauge(
                "strata_thin_mapped_bytes",
                "Bytes of the volume mapped to data blocks.",
                s.mapped_blocks * p.block_bytes,
            ),
            gauge("strata_thin_pool_data_bytes", "Size of the pool's data space.", p.data_blocks * p.block_bytes),
            gauge("strata_thin_pool_data_used_bytes", "Data space in use.", p.data_used_blocks * p.block_bytes),
            gauge("strata_thin_pool_metadata_bytes", "Size of the pool's metadata space.", p.metadata_blocks * 4096),
            gauge("strata_thin_pool_metadata_used_bytes", "Metadata space in use.", p.metadata_used_blocks * 4096),
            gauge("strata_thin_pool_data_free_blocks", "Free data blocks.", p.data_free_blocks),
            gauge("strata_thin_pool_metadata_free_blocks", "Free metadata blocks.", p.metadata_free_blocks),
            gauge(
                "strata_thin_pool_low_water_blocks",
                "The low-water mark, in free data blocks (0: none).",
                p.low_water_blocks,
            ),
            gauge(
                "strata_thin_pool_below_low_water",
                "1 while the free data blocks are at or below the low-water mark.",
                p.below_low_water as u64,
            ),
            gauge(
                "strata_thin_pool_ok",
                "1 while the pool provisions new blocks; 0 when out of space or failed.",
                (p.mode == "ok") as u64,
            ),
            counter("strata_thin_pool_commits_total", "Metadata transactions committed.", p.commits),
            counter(
                "strata_thin_pool_provisioned_blocks_total",
                "Blocks provisioned by first writes.",
                p.provisioned_blocks,
            ),
            counter(
                "strata_thin_pool_copied_blocks_total",
                "Blocks copied on write after a snapshot.",
                p.copied_blocks,
            ),
            counter("strata_thin_pool_no_space_errors_total", "Writes refused for want of space.", p.no_space_errors),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Metadata;
    use crate::PoolOptions;
    use strata_io::mem::MemDev;

    /// A pool of 64 KiB blocks on `md` and `data` with volumes 1 to `volumes`.
    async fn pool_of(md: Arc<dyn BlockDev>, data: Arc<dyn BlockDev>, volumes: DevId) -> Arc<Pool> {
        let mut m = Metadata::format(&*md, data.size(), 64 << 10, "mem:data", false).await.unwrap();
        for id in 1..=volumes {
            m.create_thin(id).unwrap();
        }
        m.commit(&*md).await.unwrap();
        Pool::open(md, data, "mem:data", PoolOptions::default()).await.unwrap()
    }

    /// Every request's future is allocated and moved: a write to a mapped block must not
    /// carry the provisioning path's or a commit's state (its 3.2 KiB cost about 14% of the
    /// rate of 4 KiB writes to a mapped volume, docs/BENCHMARKS.md).
    #[tokio::test]
    async fn a_write_to_a_mapped_block_has_a_small_future() {
        let bs = 64 << 10;
        let pool = pool_of(Arc::new(MemDev::new(4 << 20)), Arc::new(MemDev::new(16 * bs)), 1).await;
        let dev = ThinDev::new(pool, 1, Some(16 * bs)).unwrap();
        let p = Piece { vblock: 0, at: 0, len: 4096, pos: 0 };
        let sizes = [
            std::mem::size_of_val(&dev.write_piece(p, Buf::zeroed(4096), true)),
            std::mem::size_of_val(&dev.read_piece(p, Buf::zeroed(4096))),
        ];
        assert!(sizes.iter().all(|&s| s <= 1024), "futures of {sizes:?} bytes");
    }

    /// Volumes of one pool shut down one after another: the others only commit, and the
    /// last commits and then shuts the data device down; the pool then takes no volume and
    /// no commit, and volumes dropped without a shutdown never shut it down.
    #[tokio::test]
    async fn only_the_pools_last_volume_shuts_its_data_device_down() {
        use strata_io::testing::recording::{Event, Recording};
        let bs = 64 << 10;
        let data = Arc::new(Recording::new(MemDev::new(16 * bs)));
        let pool = pool_of(Arc::new(MemDev::new(4 << 20)), data.clone(), 3).await;
        let vols: Vec<_> = (1..=3).map(|id| ThinDev::new(pool.clone(), id, Some(16 * bs)).unwrap()).collect();
        let dropped = ThinDev::new(pool.clone(), 3, Some(16 * bs)).unwrap();
        let before = pool.status().commits;
        drop(dropped);
        let shutdowns = || data.events().iter().filter(|e| **e == Event::Shutdown).count();
        for v in &vols[..2] {
            v.write(0, Buf::from_slice(&[v.id as u8; 4096]), false).await.unwrap();
            v.shutdown().await.unwrap();
            assert_eq!(shutdowns(), 0, "the data device shut down under volume 3");
            assert!(!pool.closed());
        }
        vols[2].write(0, Buf::from_slice(&[3; 4096]), false).await.unwrap();
        vols[2].shutdown().await.unwrap();
        assert_eq!(shutdowns(), 1);
        assert_eq!(data.events().last(), Some(&Event::Shutdown), "a flush after the shutdown");
        assert_eq!(pool.status().commits, before + 3, "each volume's shutdown commits its write");
        let late = ThinDev::new(pool.clone(), 1, Some(16 * bs)).err().expect("a volume on a closed pool");
        assert!(late.context.contains("closing it"), "{}", late.context);
        assert!(pool.commit().await.unwrap_err().context.contains("shut down"));
        drop(vols);
        assert_eq!(shutdowns(), 1);
    }

    /// An open that fails on a pool its last volume is shutting down does not wait for
    /// that shutdown (however slow its devices) to answer.
    #[tokio::test]
    async fn a_failed_open_does_not_wait_for_the_pools_shutdown_under_way() {
        use futures::FutureExt;
        use strata_io::testing::recording::Recording;
        let bs = 64 << 10;
        let md = Arc::new(Recording::new(MemDev::new(4 << 20)));
        let pool = pool_of(md.clone(), Arc::new(MemDev::new(16 * bs)), 1).await;
        let vol = ThinDev::new(pool.clone(), 1, Some(16 * bs)).unwrap();
        vol.write(0, Buf::from_slice(&[1; 4096]), false).await.unwrap();
        // The last commit's metadata writes wait: the shutdown stays under way.
        md.hold_writes(true);
        let mut shutdown = vol.shutdown();
        while !pool.closed() {
            assert!((&mut shutdown).now_or_never().is_none(), "shut down with its metadata writes held");
        }
        assert!(pool.close_unused().now_or_never().is_some(), "waited for the shutdown under way");
        md.hold_writes(false);
        shutdown.await.unwrap();
    }
}
