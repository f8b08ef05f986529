//! The read path: where a hit is served from its cache slot, a miss read from the origin,
//! and a miss the policy admits promoted (with its readahead neighbours).

use super::{futures_collect, futures_join, slot_reserve, Inner};
use crate::format::Mode;
use crate::meter::{BufferPermit, Counters, Kind};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use strata_io::{BoxFut, Buf, Error, ErrorKind, Result};
use strata_policy::{readahead_place, readahead_window, Access, Op, Outcome};
use tokio::sync::OwnedRwLockWriteGuard;

enum ReadPlan {
    /// The slot, and whether it is fresh (`State::is_fresh`).
    Hit(u32, bool),
    /// The cache device lost writes in a failed flush: its slots are not to be trusted.
    Refused,
    Miss,
    /// The slot, and the promotion's share of the buffers (`BufferPermit`).
    Promote(u32, BufferPermit),
    /// The policy admitted the block but every free slot's release still awaits a commit.
    NeedSlot(BufferPermit),
}

impl Inner {
    pub(super) async fn read(self: &Arc<Self>, offset: u64, mut buf: Buf) -> Result<Buf> {
        strata_io::check_range("cache read", offset, buf.len() as u64, self.origin_bytes)?;
        let bypass = {
            let mut st = self.state.lock();
            let cutoff = st.meta.sb.sequential_cutoff_bytes;
            st.read_streams.observe(offset, buf.len() as u64, cutoff)
        };
        let pieces = self.pieces(offset, buf.len() as u64);
        if pieces.len() == 1 {
            let (b, within, n) = pieces[0];
            return self.read_piece(b, within, n, bypass, Some(buf)).await;
        }
        if bypass && self.none_cached(&pieces) {
            // A sequential stream past the cutoff over blocks the cache does not hold: one
            // origin request for the whole range rather than one per cache block.
            return self.origin_read(offset, buf, Kind::Foreground).await;
        }
        let parts = futures_join(pieces.iter().map(|&(b, w, n)| self.read_piece(b, w, n, bypass, None))).await?;
        let mut pos = 0;
        for p in parts {
            buf[pos..pos + p.len()].copy_from_slice(&p);
            pos += p.len();
        }
        Ok(buf)
    }

    /// Whether no block of `pieces` is in the cache, counting each as a bypassed miss when
    /// none is. The origin then holds every one of them as it is now: a block written since
    /// is in the cache (write-back) or was written to the origin before its write completed.
    fn none_cached(&self, pieces: &[(u64, u64, u64)]) -> bool {
        let st = self.state.lock();
        if pieces.iter().any(|(b, _, _)| st.map.contains_key(b)) {
            return false;
        }
        for _ in pieces {
            Counters::bump(&self.counters.read_misses);
            Counters::bump(&self.counters.bypassed);
        }
        true
    }

    /// Reads `n` bytes at `within` of block `b`, into `buf` (of `n` bytes) when given: the
    /// caller's own buffer when the request is this one piece, so a hit costs no allocation.
    fn read_piece(
        self: &Arc<Self>,
        b: u64,
        within: u64,
        n: u64,
        bypass: bool,
        buf: Option<Buf>,
    ) -> BoxFut<'_, Result<Buf>> {
        let buf = buf.unwrap_or_else(|| Buf::zeroed(n as usize));
        Box::pin(async move {
            let shard = self.shard(b).clone();
            let guard = shard.clone().read_owned().await;
            let plan = match self.plan_read(b, within, n, bypass) {
                ReadPlan::NeedSlot(permit) => match self.slot_after_commit(b).await {
                    Some(s) => ReadPlan::Promote(s, permit),
                    None => ReadPlan::Miss,
                },
                plan => plan,
            };
            match plan {
                ReadPlan::Hit(s, fresh) => {
                    let r = self.read_slot(s, within, buf, fresh).await;
                    self.refs[s as usize].fetch_sub(1, Relaxed);
                    match r {
                        Ok(data) => Ok(data),
                        Err(e) => {
                            drop(guard);
                            if self.cache_read_failed(b, s, e).await? {
                                // Dropped from the cache: the origin holds the block.
                                let _g = shard.read_owned().await;
                                self.origin_read(b * self.block + within, Buf::zeroed(n as usize), Kind::Foreground)
                                    .await
                            } else {
                                self.read_piece(b, within, n, bypass, None).await
                            }
                        }
                    }
                }
                ReadPlan::Miss => self.origin_read(b * self.block + within, buf, Kind::Foreground).await,
                ReadPlan::Promote(s, permit) => {
                    drop(guard);
                    let exclusive = shard.write_owned().await;
                    self.promote_on_read((b, within, n), (s, permit), exclusive, bypass, buf).await
                }
                ReadPlan::Refused => Err(self.state.lock().stopped().expect_err("refused only once stopped")),
                ReadPlan::NeedSlot(_) => unreachable!("resolved above"),
            }
        })
    }

    fn plan_read(&self, b: u64, within: u64, n: u64, bypass: bool) -> ReadPlan {
        let mut st = self.state.lock();
        let now = self.now_ns();
        if let Some(&s) = st.map.get(&b) {
            if st.cache_suspect {
                return ReadPlan::Refused;
            }
            if !bypass {
                st.policy.access(Access::new(b, Op::Read, within == 0 && n == self.block, now));
            }
            self.refs[s as usize].fetch_add(1, Relaxed);
            Counters::bump(&self.counters.read_hits);
            return ReadPlan::Hit(s, st.is_fresh(s));
        }
        Counters::bump(&self.counters.read_misses);
        if bypass || st.failed.is_some() {
            Counters::bump(&self.counters.bypassed);
            return ReadPlan::Miss;
        }
        if matches!(st.meta.sb.mode, Mode::Passthrough | Mode::Cleaner) {
            return ReadPlan::Miss;
        }
        match st.policy.access(Access::new(b, Op::Read, within == 0 && n == self.block, now)) {
            Outcome::Promote { evict } => {
                if !st.evict(evict, &self.counters) {
                    st.policy.remove(b);
                    return ReadPlan::Miss;
                }
                let permit = BufferPermit::try_take(self.block);
                let Some(permit) = permit.filter(|_| self.budget.try_take(self.block)) else {
                    st.policy.remove(b);
                    Counters::bump(&self.counters.promotions_skipped);
                    return ReadPlan::Miss;
                };
                match st.reserve(&self.refs) {
                    Some(s) => ReadPlan::Promote(s, permit),
                    None => ReadPlan::NeedSlot(permit),
                }
            }
            _ => ReadPlan::Miss,
        }
    }

    /// A read miss the policy promotes: read the whole block from the origin once (with
    /// its readahead neighbours, see `fill_ahead`), answer from it, and fill the cache slots
    /// in the background while still holding the blocks. `answer` gets the `n` bytes at
    /// `within` of block `b` (the piece).
    async fn promote_on_read(
        self: &Arc<Self>,
        (b, within, n): (u64, u64, u64),
        (s, mut permit): (u32, BufferPermit),
        exclusive: OwnedRwLockWriteGuard<()>,
        bypass: bool,
        mut answer: Buf,
    ) -> Result<Buf> {
        let still_wanted = {
            let st = self.state.lock();
            !st.map.contains_key(&b) && st.policy.contains(b)
        };
        if !still_wanted {
            self.state.lock().release(s);
            drop(exclusive);
            return self.read_piece(b, within, n, bypass, Some(answer)).await;
        }
        let known_zero = self.state.lock().zeroed.contains(&b);
        let mut fills = vec![(b, s, Some(exclusive))];
        if !known_zero {
            fills.extend(self.fill_ahead(b, &mut permit));
        }
        let first = fills.iter().map(|f| f.0).min().expect("b is there");
        let end = fills.iter().map(|f| f.0 * self.block + self.block_len(f.0)).max().expect("b is there");
        let data = if known_zero {
            Buf::zeroed(self.block_len(b) as usize)
        } else {
            match self
                .origin_read(first * self.block, Buf::zeroed((end - first * self.block) as usize), Kind::Foreground)
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    let mut st = self.state.lock();
                    for &(fb, fs, _) in &fills {
                        st.policy.remove(fb);
                        st.release(fs);
                    }
                    return Err(e);
                }
            }
        };
        let range = |fb: u64| {
            let at = ((fb - first) * self.block) as usize;
            at..at + self.block_len(fb) as usize
        };
        let at_b = range(b).start;
        answer.copy_from_slice(&data[at_b + within as usize..at_b + (within + n) as usize]);
        let writes: Vec<(u64, u32, Option<OwnedRwLockWriteGuard<()>>, Buf)> = if fills.len() == 1 {
            let (fb, fs, g) = fills.pop().expect("b is there");
            vec![(fb, fs, g, data)]
        } else {
            fills.into_iter().map(|(fb, fs, g)| (fb, fs, g, Buf::from_slice(&data[range(fb)]))).collect()
        };
        let me = self.clone();
        tokio::spawn(async move {
            let done = futures_collect(writes.into_iter().map(|(fb, fs, g, d)| {
                let me = &me;
                async move { (fb, fs, g, me.cache.write(me.slot_offset(fs), d, false).await) }
            }))
            .await;
            let mut st = me.state.lock();
            let mut guards = Vec::with_capacity(done.len());
            for (fb, fs, guard, r) in done {
                match r {
                    Ok(_) if st.policy.contains(fb) && !st.map.contains_key(&fb) => {
                        st.map_to(fb, fs, false);
                        Counters::bump(&me.counters.promotions);
                        if fb != b {
                            Counters::bump(&me.counters.readahead_blocks);
                        }
                        me.counters.migration_bytes.fetch_add(me.block_len(fb), Relaxed);
                    }
                    Ok(_) => st.release(fs),
                    Err(e) => {
                        st.policy.remove(fb);
                        st.release(fs);
                        st.fault(format!("promotion of block {fb} into slot {fs} failed: {e}"));
                    }
                }
                guards.push(guard);
            }
            // Only once every block of the window is mapped: a neighbour may share a shard
            // lock with the block or another neighbour.
            drop(st);
            drop(guards);
            drop(permit);
        });
        Ok(answer)
    }

    /// While the cache has room, a promoted read miss brings its neighbours along: the
    /// origin read is rounded out to the aligned `readahead` window around the block (as
    /// bcache's `readahead` does), and each neighbour that is not cached, not being promoted
    /// and not in use by other IO takes a free slot, within the migration budget. For a disk
    /// one longer read costs little more than the seek it needed anyway, so an empty cache
    /// fills at the origin's streaming rate rather than its seek rate. Room is unused
    /// blocks, or blocks restored at start-up that nothing has read since
    /// (`readahead_place`), so a cache full of another workload's blocks fills as fast.
    /// Neighbours never evict a block the workload has used, and leave the slot reserve
    /// alone (taking the place of restored blocks, whose slots come back at the next commit,
    /// they may use half of it). A neighbour in a shard already held here (the block's, or an
    /// earlier neighbour's) needs no lock of its own (`None`).
    fn fill_ahead(&self, b: u64, permit: &mut BufferPermit) -> Vec<(u64, u32, Option<OwnedRwLockWriteGuard<()>>)> {
        let mut st = self.state.lock();
        let per = st.meta.sb.readahead_bytes as u64 / self.block;
        let mut got = Vec::new();
        if per <= 1 {
            return got;
        }
        let keep_free = slot_reserve(st.meta.slots());
        let mut held = vec![self.shard_index(b)];
        for nb in readahead_window(b, per, st.meta.sb.origin_blocks()) {
            if st.map.contains_key(&nb) || st.policy.contains(nb) {
                continue;
            }
            let floor = if st.policy.len() < st.policy.capacity() { keep_free } else { keep_free / 2 };
            if st.free.len() <= floor {
                break;
            }
            // Only a neighbour nobody is using: its shard is taken without waiting.
            let shard = self.shard_index(nb);
            let guard = if held.contains(&shard) {
                None
            } else {
                let Ok(g) = self.shard(nb).clone().try_write_owned() else { continue };
                held.push(shard);
                Some(g)
            };
            if !permit.try_grow(self.block) || !self.budget.try_take(self.block) {
                break;
            }
            let Some(s) = st.reserve(&self.refs) else {
                self.budget.refund(self.block);
                break;
            };
            match readahead_place(&mut *st.policy, nb) {
                Ok(victim) if st.evict(victim, &self.counters) => got.push((nb, s, guard)),
                placed => {
                    if placed.is_ok() {
                        st.policy.remove(nb);
                    }
                    st.release(s);
                    self.budget.refund(self.block);
                    break;
                }
            }
        }
        got
    }

    /// A cached block could not be read from the cache device. A clean one is dropped and
    /// served from the origin; a dirty one exists nowhere else: report it.
    /// Returns whether the block was dropped (serve it from the origin) rather than moved
    /// meanwhile (retry).
    async fn cache_read_failed(&self, b: u64, s: u32, e: Error) -> Result<bool> {
        Counters::bump(&self.counters.cache_read_errors);
        let mut st = self.state.lock();
        if st.map.get(&b) != Some(&s) {
            return Ok(false);
        }
        if st.meta.entries[s as usize].dirty {
            st.fault(format!("dirty block {b} unreadable in cache slot {s}: {e}"));
            return Err(Error::new(ErrorKind::Io, format!("cache block {b} (dirty, slot {s}) unreadable: {e}")));
        }
        st.policy.remove(b);
        st.demote(b, &self.counters);
        Ok(true)
    }
}
