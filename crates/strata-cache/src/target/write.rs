//! The write path: where a write is absorbed by the cache, passed to the origin, or both,
//! where a write miss is promoted, and where a written clean block moves to a new slot.

use super::writeback::dirty_limited;
use super::{futures_join, Inner, State};
use crate::format::Mode;
use crate::meter::{BufferPermit, Counters, Kind};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use strata_io::{BoxFut, Buf, Error, ErrorKind, Result};
use strata_policy::{Access, Op, Outcome};
use tokio::sync::OwnedRwLockWriteGuard;

enum WritePlan {
    /// Write a dirty block's slot in place (no durable clean mapping names that slot).
    Cache(u32),
    /// A dirty block written to the origin and its slot (outside writeback, or a write its
    /// slot refused once).
    Both(u32),
    Origin,
    /// Promote by writing the whole block into a new slot; a partial write holds a share of
    /// the buffers for the block it reads (`BufferPermit`).
    Promote(u32, Option<BufferPermit>),
    /// A clean cached block is written: it moves to a new slot (see `Inner::replace`).
    Replace(u32),
    /// As `ReadPlan::NeedSlot`.
    NeedSlot(Option<BufferPermit>),
}

/// How a piece of a write is planned.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// As the policy decides; counted as a write hit or miss.
    Policy,
    /// Around the cache (a sequential stream past the cutoff) unless its block is cached;
    /// counted as a hit, or as a miss and a bypassed write.
    Bypass,
    /// Planned again after another change overtook its plan: counted already, and seen by
    /// the policy. A cached block is written as its mode has it; an uncached one goes to the
    /// origin.
    Retry,
    /// Planned again after the cache device refused it (`Piece::Refused`): as `Retry`, but a
    /// dirty block goes to the origin too whatever the mode, since its slot may refuse again
    /// and the volume, taken out of writeback by the refusal, may be back in it since (an
    /// admin's change).
    Refused,
}

impl Route {
    /// The piece's first plan, not a retry: counted, and free to report a refusal.
    fn first(self) -> bool {
        matches!(self, Route::Policy | Route::Bypass)
    }
}

/// What became of one piece of a write.
pub(super) enum Piece {
    /// Written. With FUA, the table change that must be durable before the write is
    /// acknowledged (the mapping of the slot that holds its data), if any.
    Done(Option<u64>),
    /// The cache device failed to take it and nothing else holds it: the caller, which still
    /// has the bytes, writes them again (`Inner::write_refused`).
    Refused,
}

impl Inner {
    pub(super) async fn write(self: &Arc<Self>, offset: u64, buf: Buf, fua: bool) -> Result<Buf> {
        strata_io::check_range("cache write", offset, buf.len() as u64, self.origin_bytes)
            .map_err(|e| Error::new(ErrorKind::NoSpace, e.context))?;
        let bypass = {
            let mut st = self.state.lock();
            st.stopped()?;
            let cutoff = st.meta.sb.sequential_cutoff_bytes;
            let bypass = st.write_streams.observe(offset, buf.len() as u64, cutoff);
            if fua {
                st.write_streams.synced();
            }
            bypass
        };
        let pieces = self.pieces(offset, buf.len() as u64);
        let needs = futures_join(pieces.iter().map(|&(b, within, n)| {
            let start = (b * self.block + within - offset) as usize;
            let bytes = &buf[start..start + n as usize];
            async move {
                let route = if bypass { Route::Bypass } else { Route::Policy };
                match self.write_piece(b, within, Buf::from_slice(bytes), fua, route).await? {
                    Piece::Done(need) => Ok(need),
                    Piece::Refused => self.write_refused(b, within, Buf::from_slice(bytes), fua).await,
                }
            }
        }))
        .await?;
        // A FUA write is durable only together with the mapping that finds its data.
        if let Some(n) = needs.into_iter().flatten().max() {
            self.commit_upto(n).await?;
        }
        Ok(buf)
    }

    /// Writes again a piece the cache device refused (`Piece::Refused`), planned afresh under
    /// the block's lock (`Route::Refused`): to the origin if the block is not cached, else as
    /// the block's mode has it, a dirty block to its slot and the origin in every mode.
    /// Written to the origin without the lock, a read could promote the block's older content
    /// meanwhile and keep it cached, clean, after the write lands.
    pub(super) async fn write_refused(
        self: &Arc<Self>,
        b: u64,
        within: u64,
        data: Buf,
        fua: bool,
    ) -> Result<Option<u64>> {
        match self.write_piece(b, within, data, fua, Route::Refused).await? {
            Piece::Done(need) => Ok(need),
            Piece::Refused => unreachable!("a retried write promotes nothing and fails where a slot refuses it"),
        }
    }

    /// Writes one piece.
    pub(super) fn write_piece(
        self: &Arc<Self>,
        b: u64,
        within: u64,
        data: Buf,
        fua: bool,
        route: Route,
    ) -> BoxFut<'_, Result<Piece>> {
        Box::pin(async move {
            let shard = self.shard(b).clone();
            let guard = shard.clone().read_owned().await;
            let n = data.len() as u64;
            let plan = match self.plan_write(b, within, n, route) {
                WritePlan::NeedSlot(permit) => match self.slot_after_commit(b).await {
                    Some(s) => WritePlan::Promote(s, permit),
                    None => WritePlan::Origin,
                },
                plan => plan,
            };
            let slot_change = |s: u32| fua.then(|| self.state.lock().meta.slot_changed(s));
            match plan {
                WritePlan::Cache(s) => {
                    let r = self.cache.write(self.slot_offset(s) + within, data, fua).await;
                    self.refs[s as usize].fetch_sub(1, Relaxed);
                    match r {
                        Ok(_) => Ok(Piece::Done(slot_change(s))),
                        Err(e) => {
                            self.dirty_slot_refused(b, s, &e);
                            // A whole block is written again, through to the origin (`Both`,
                            // `Route::Refused`), which frees the slot. Part of one fails: the
                            // rest of the block's newest data is the slot's alone.
                            if route.first() && within == 0 && n == self.block_len(b) {
                                Ok(Piece::Refused)
                            } else {
                                Err(e)
                            }
                        }
                    }
                }
                WritePlan::Both(s) => {
                    // The slot stays the block's current copy: with FUA it must be durable too.
                    let copy = Buf::from_slice(&data);
                    let (a, c) = tokio::join!(
                        self.write_origin(b, within, data, fua),
                        self.cache.write(self.slot_offset(s) + within, copy, fua)
                    );
                    self.refs[s as usize].fetch_sub(1, Relaxed);
                    if let (Err(_), Err(e)) = (&a, &c) {
                        self.dirty_slot_refused(b, s, e);
                    }
                    a?;
                    match c {
                        Ok(_) => Ok(Piece::Done(slot_change(s))),
                        Err(e) if within == 0 && n == self.block_len(b) => {
                            // Still under the block's lock: write-back (which copies the slot
                            // to the origin) cannot come between the origin write and this.
                            self.drop_refused_slot(b, s, e, fua).await.map(|_| Piece::Done(None))
                        }
                        Err(e) => {
                            self.dirty_slot_refused(b, s, &e);
                            Err(e)
                        }
                    }
                }
                WritePlan::Origin => self.write_origin(b, within, data, fua).await.map(|_| Piece::Done(None)),
                WritePlan::NeedSlot(_) => unreachable!("resolved above"),
                WritePlan::Replace(old) => {
                    drop(guard);
                    let exclusive = shard.write_owned().await;
                    self.replace(b, within, data, fua, old, exclusive).await
                }
                WritePlan::Promote(s, _permit) => {
                    drop(guard);
                    let _exclusive = shard.write_owned().await;
                    let (ok, writeback) = {
                        let st = self.state.lock();
                        (!st.map.contains_key(&b) && st.policy.contains(b), self.write_mode(&st) == Mode::Writeback)
                    };
                    if !ok {
                        self.state.lock().release(s);
                        drop(_exclusive);
                        return self.write_piece(b, within, data, fua, Route::Retry).await;
                    }
                    // A partial write fills the rest of the block from the origin first (one
                    // read, as a read-miss promotion costs), so the slot holds the whole block.
                    let len = self.block_len(b);
                    let (block_data, partial) = if within == 0 && n == len {
                        (data, None)
                    } else {
                        let known_zero = self.state.lock().zeroed.contains(&b);
                        let read = if known_zero {
                            Ok(Buf::zeroed(len as usize))
                        } else {
                            self.origin_read(b * self.block, Buf::zeroed(len as usize), Kind::Foreground).await
                        };
                        let mut full = match read {
                            Ok(full) => full,
                            Err(e) => {
                                let mut st = self.state.lock();
                                st.policy.remove(b);
                                st.release(s);
                                return Err(e);
                            }
                        };
                        full[within as usize..(within + n) as usize].copy_from_slice(&data);
                        (full, Some(data))
                    };
                    // Writeback keeps the data (to fall back on); writethrough has it in the origin.
                    let r: Result<Option<Buf>> = if writeback {
                        match self.cache.write(self.slot_offset(s), block_data, fua).await {
                            Ok(d) => Ok(Some(d)),
                            Err(e) => {
                                self.cache_write_failed(b, s, &e);
                                // The piece alone goes to the origin, as to an uncached block.
                                return match partial {
                                    Some(d) => self.write_origin(b, within, d, fua).await.map(|_| Piece::Done(None)),
                                    None => Ok(Piece::Refused),
                                };
                            }
                        }
                    } else {
                        let (to_origin, at) = match partial {
                            Some(d) => (d, within),
                            None => (Buf::from_slice(&block_data), 0),
                        };
                        let (a, c) = tokio::join!(
                            self.write_origin(b, at, to_origin, fua),
                            self.cache.write(self.slot_offset(s), block_data, false)
                        );
                        if let (Ok(_), Err(e)) = (&a, &c) {
                            // The origin has the write: only the promotion is lost.
                            self.cache_write_failed(b, s, e);
                            return Ok(Piece::Done(None));
                        }
                        a.and(c).map(|_| None)
                    };
                    let homeless = {
                        let mut st = self.state.lock();
                        match r {
                            Ok(_) if st.policy.contains(b) => {
                                st.map_to(b, s, writeback);
                                if writeback {
                                    st.policy.set_dirty(b);
                                }
                                st.zeroed.remove(&b);
                                Counters::bump(&self.counters.promotions);
                                return Ok(Piece::Done((writeback && fua).then(|| st.meta.changes())));
                            }
                            // The policy dropped the block while its data was on the way (it
                            // was chosen as another promotion's victim): the slot goes back,
                            // and data that lives only there goes to the origin instead.
                            Ok(Some(data)) => {
                                st.release(s);
                                data
                            }
                            Ok(None) => {
                                st.release(s);
                                return Ok(Piece::Done(None));
                            }
                            Err(e) => {
                                st.policy.remove(b);
                                st.release(s);
                                return Err(e);
                            }
                        }
                    };
                    // `homeless` is the whole block (merged if the write was partial).
                    self.write_origin(b, 0, homeless, fua).await.map(|_| Piece::Done(None))
                }
            }
        })
    }

    /// A write to clean cached block `b` in slot `old`. A clean slot is never overwritten in
    /// place: its mapping may be durable, and after a crash a clean slot that differs from
    /// the origin reads one way until it is evicted and another way after. So the block
    /// moves to a new slot with the write merged in. In writeback the new slot is dirty; in
    /// writethrough the old mapping's removal is made durable first, then the origin and the
    /// new slot are written, and the new slot is mapped clean once both hold the data.
    async fn replace(
        self: &Arc<Self>,
        b: u64,
        within: u64,
        data: Buf,
        fua: bool,
        old: u32,
        exclusive: OwnedRwLockWriteGuard<()>,
    ) -> Result<Piece> {
        let release_old = || self.refs[old as usize].fetch_sub(1, Relaxed);
        let (current, writeback, fresh) = {
            let st = self.state.lock();
            (
                st.map.get(&b) == Some(&old) && !st.meta.entries[old as usize].dirty,
                self.write_mode(&st) == Mode::Writeback,
                st.is_fresh(old),
            )
        };
        let len = self.block_len(b);
        let n = data.len() as u64;
        // A partial write reads the rest of the block: a share of the buffers for it.
        let permit = if within == 0 && n == len { Some(None) } else { BufferPermit::try_take(len).map(Some) };
        let new = match current && permit.is_some() {
            true => self.free_slot().await,
            false => None,
        };
        let Some(new) = new else {
            release_old();
            if current {
                // No slot to move to (or no buffer for the block): drop the cached copy and
                // write the origin only.
                let mut st = self.state.lock();
                if st.map.get(&b) == Some(&old) {
                    st.policy.remove(b);
                    st.demote(b, &self.counters);
                }
            }
            drop(exclusive);
            return self.write_piece(b, within, data, fua, Route::Retry).await;
        };
        let block_data = if within == 0 && n == len {
            Buf::from_slice(&data)
        } else {
            let mut full = match self.read_slot(old, 0, Buf::zeroed(len as usize), fresh).await {
                Ok(d) => Ok(d),
                Err(_) => {
                    // A clean block: the origin holds the same data.
                    Counters::bump(&self.counters.cache_read_errors);
                    self.origin_read(b * self.block, Buf::zeroed(len as usize), Kind::Foreground).await
                }
            };
            if let Ok(full) = &mut full {
                full[within as usize..(within + n) as usize].copy_from_slice(&data);
            }
            full.inspect_err(|_| {
                release_old();
                self.state.lock().release(new);
            })?
        };
        release_old();
        if writeback {
            let r = self.cache.write(self.slot_offset(new), block_data, fua).await;
            let homeless = {
                let mut st = self.state.lock();
                match r {
                    Err(e) => {
                        // The old slot is clean (the origin holds what it holds): it goes,
                        // and the write goes to the origin as to an uncached block.
                        st.fault(format!("a write of block {b} into cache slot {new} failed: {e}"));
                        st.release(new);
                        if st.map.get(&b) == Some(&old) {
                            st.policy.remove(b);
                            st.demote(b, &self.counters);
                        }
                        None
                    }
                    Ok(d) if st.map.get(&b) != Some(&old) => {
                        // Evicted or invalidated meanwhile: the data lives only in `new`.
                        st.release(new);
                        Some(d)
                    }
                    Ok(_) => {
                        st.unmap(b);
                        st.map_to(b, new, true);
                        st.policy.set_dirty(b);
                        return Ok(Piece::Done(fua.then(|| st.meta.changes())));
                    }
                }
            };
            return match homeless {
                Some(d) => self.write_origin(b, 0, d, fua).await.map(|_| Piece::Done(None)),
                None => self.write_origin(b, within, data, fua).await.map(|_| Piece::Done(None)),
            };
        }
        self.state.lock().unmap(b);
        let (a, c) = tokio::join!(
            self.write_origin(b, within, data, fua),
            self.cache.write(self.slot_offset(new), block_data, false)
        );
        let mut st = self.state.lock();
        let keep = a.is_ok() && c.is_ok() && st.policy.contains(b) && !st.map.contains_key(&b);
        if keep {
            st.map_to(b, new, false);
        } else {
            st.release(new);
            if !st.map.contains_key(&b) {
                st.policy.remove(b);
            }
        }
        a.map(|_| Piece::Done(None))
    }

    /// A promotion's write into slot `s` failed: the slot goes back, the block is not cached,
    /// and the fault (which stops new dirty data) shows in status.
    fn cache_write_failed(&self, b: u64, s: u32, e: &strata_io::Error) {
        let mut st = self.state.lock();
        st.fault(format!("a write of block {b} into cache slot {s} failed: {e}"));
        st.policy.remove(b);
        st.release(s);
    }

    /// Dirty block `b`'s slot `s` refused a write: the volume reports the fault (and leaves
    /// writeback).
    fn dirty_slot_refused(&self, b: u64, s: u32, e: &strata_io::Error) {
        self.state.lock().fault(format!("a write into dirty block {b}'s cache slot {s} failed: {e}"));
    }

    /// The origin took a whole-block write of dirty block `b` that its slot `s` refused: the
    /// origin now holds the block's newest data, so the slot goes (if `b` is still there),
    /// durably before the write is acknowledged: else a crash would bring back the slot's
    /// older copy over it. Without FUA the origin is flushed first: the commit that records
    /// the removal (this one, or any other meanwhile) flushes only the cache device, and a
    /// crash must not find the slot gone and the write not on the origin either.
    async fn drop_refused_slot(&self, b: u64, s: u32, e: strata_io::Error, fua: bool) -> Result<()> {
        if !fua {
            self.flush_origin(Kind::Foreground, "after a refused cache write").await?;
        }
        {
            let mut st = self.state.lock();
            st.fault(format!("a write of block {b} into cache slot {s} failed: {e}; the origin has it"));
            if st.map.get(&b) == Some(&s) {
                st.policy.remove(b);
                st.demote(b, &self.counters);
            }
        }
        self.settle(b).await
    }

    /// Writes part of block `b` on the origin, once no mapping of `b` that was removed in
    /// memory can come back over it after a crash (see `settle`).
    async fn write_origin(&self, b: u64, within: u64, data: Buf, fua: bool) -> Result<Buf> {
        self.settle(b).await?;
        self.origin_write(b * self.block + within, data, fua, Kind::Foreground).await
    }

    /// The mode writes follow: the volume's, except that writeback makes no new dirty data
    /// while the origin is busy (as the background task last found it) and the dirty blocks
    /// are 5 points or more above `writeback_percent` (`dirty_limited`). New data then goes
    /// through to the origin, at its pace, while write-back brings the dirty share down;
    /// writes to blocks already dirty stay in their slots.
    pub(super) fn write_mode(&self, st: &State) -> Mode {
        match st.meta.sb.mode {
            Mode::Writeback if self.dirty_limited(st) => Mode::Writethrough,
            m => m,
        }
    }

    pub(super) fn dirty_limited(&self, st: &State) -> bool {
        // An origin away for now is no busy one: writes sent through would wait out the
        // outage and fail, where the cache can keep them.
        let busy = self.origin_busy.load(Relaxed) && !self.origin_away.load(Relaxed);
        dirty_limited(st.policy.dirty_len(), st.meta.slots(), st.meta.sb.writeback_percent, busy)
    }

    fn plan_write(&self, b: u64, within: u64, n: u64, route: Route) -> WritePlan {
        let mut st = self.state.lock();
        let now = self.now_ns();
        let full = within == 0 && n == self.block_len(b);
        let mode = self.write_mode(&st);
        st.zeroed.remove(&b);
        if let Some(&s) = st.map.get(&b) {
            if route.first() {
                Counters::bump(&self.counters.write_hits);
            }
            let dirty = st.meta.entries[s as usize].dirty;
            if route == Route::Policy {
                st.policy.access(Access::new(b, Op::Write, full, now));
            }
            let plan = match (mode, dirty) {
                // A dirty block's newest data is in its slot: keep writing it there, and to
                // the origin too in every mode but writeback (a dirty-limited writeback adds
                // no dirty block by writing one already dirty). A write its slot refused goes
                // to the origin too in every mode (`Route::Refused`).
                (_, true) if st.meta.sb.mode != Mode::Writeback || route == Route::Refused => WritePlan::Both(s),
                (_, true) => WritePlan::Cache(s),
                (Mode::Writeback | Mode::Writethrough, false) => WritePlan::Replace(s),
                (Mode::Writearound | Mode::Passthrough | Mode::Cleaner, false) => {
                    st.policy.remove(b);
                    st.demote(b, &self.counters);
                    return WritePlan::Origin;
                }
            };
            if dirty {
                st.write_gen[s as usize] = st.write_gen[s as usize].wrapping_add(1);
            }
            self.refs[s as usize].fetch_add(1, Relaxed);
            return plan;
        }
        match route {
            Route::Retry | Route::Refused => return WritePlan::Origin,
            Route::Bypass => {
                Counters::bump(&self.counters.write_misses);
                Counters::bump(&self.counters.bypassed);
                return WritePlan::Origin;
            }
            Route::Policy => Counters::bump(&self.counters.write_misses),
        }
        if !matches!(mode, Mode::Writeback | Mode::Writethrough) {
            return WritePlan::Origin;
        }
        if mode == Mode::Writethrough && !full {
            // The origin gets the write anyway: caching a partial block would first read the
            // rest of it from the origin, a read the origin alone never pays. It goes around
            // the cache, and the policy does not see it (the simulator follows the same rule).
            Counters::bump(&self.counters.partial_writes_around);
            return WritePlan::Origin;
        }
        let a = Access::new(b, Op::Write, full, now);
        match st.policy.access(Access { fast_promote: a.fast_promote && mode == Mode::Writeback, ..a }) {
            Outcome::Promote { evict } => {
                let evicted = st.evict(evict, &self.counters);
                // Whole-block writes are cached without reading the origin; a partial one (in
                // writeback only) reads the rest of its block first (see `write_piece`).
                let permit = if full { Some(None) } else { BufferPermit::try_take(self.block).map(Some) };
                if evicted && permit.is_none() {
                    Counters::bump(&self.counters.promotions_skipped);
                }
                let Some(permit) = permit.filter(|_| evicted && self.budget.try_take(self.block)) else {
                    st.policy.remove(b);
                    return WritePlan::Origin;
                };
                match st.reserve(&self.refs) {
                    Some(s) => WritePlan::Promote(s, permit),
                    None => WritePlan::NeedSlot(permit),
                }
            }
            _ => WritePlan::Origin,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Piece, Route};
    use crate::format::Mode;
    use crate::target::state::tests::small_cache;
    use crate::CacheStatus;
    use std::sync::Arc;
    use strata_io::fault::{FaultDev, Rule};
    use strata_io::mem::MemDev;
    use strata_io::{BlockDev, Buf};

    /// A whole-block write its dirty block's slot refused is written again (`write_refused`).
    /// The refusal takes the volume out of writeback; an admin may put it back before the
    /// retry is planned. The retry still goes through to the origin and frees the slot,
    /// rather than trying the slot again and failing the write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_write_retried_back_in_writeback_still_reaches_the_origin() {
        let (cache, cache_faults) = FaultDev::new(MemDev::new(2 << 20));
        let (cache, origin) = (Arc::new(cache), Arc::new(MemDev::new(8 << 20)));
        let dev = small_cache(Mode::Writeback, &cache, &origin, true).await;
        dev.message("writeback_percent 100").await.unwrap(); // no write-back meanwhile
        let block = dev.inner.block;
        let fill = |v: u8| Buf::from_slice(&vec![v; block as usize]);
        dev.write(3 * block, fill(1), false).await.unwrap();
        dev.flush().await.unwrap();
        assert_eq!(CacheStatus::of(&dev).unwrap().dirty_blocks, 1);
        let sb = dev.inner.state.lock().meta.sb.clone();
        cache_faults.add(Rule::write_error(sb.data_offset..sb.data_offset + sb.slots * block).always());

        let refused = dev.inner.write_piece(3, 0, fill(4), true, Route::Policy).await.unwrap();
        assert!(matches!(refused, Piece::Refused), "the slot refused the write");
        assert_eq!(CacheStatus::of(&dev).unwrap().mode, "writethrough", "the fault left writeback");
        dev.message("mode writeback").await.unwrap();
        // Not written back meanwhile (which would make it a clean block's write, planned
        // otherwise): the retry meets a dirty block in writeback.
        let s = CacheStatus::of(&dev).unwrap();
        assert_eq!((s.mode.as_str(), s.dirty_blocks), ("writeback", 1), "{s:?}");
        let need = dev.inner.write_refused(3, 0, fill(4), true).await.expect("the retry reaches the origin");
        if let Some(n) = need {
            dev.inner.commit_upto(n).await.unwrap();
        }

        let on_origin = origin.read(3 * block, Buf::zeroed(block as usize)).await.unwrap();
        assert_eq!(on_origin.to_vec(), vec![4; block as usize]);
        let s = CacheStatus::of(&dev).unwrap();
        assert_eq!((s.dirty_blocks, s.cached_blocks), (0, 0), "{s:?}");
        let read = dev.read(3 * block, Buf::zeroed(block as usize)).await.unwrap();
        assert_eq!(read.to_vec(), vec![4; block as usize]);
        dev.check_invariants().unwrap();
    }
}
