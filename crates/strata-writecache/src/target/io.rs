//! Foreground IO, split into cache blocks. A read of a logged block is served from its slot
//! (pinned, so the slot is not reused under it); the others from the origin, one origin read
//! per run of adjacent blocks the log does not hold. A write goes to a free slot, a partial
//! one after merging with the block's newest copy; with no free slot it goes around the log,
//! a request of several blocks as one origin write (`write_around`), and supersedes the
//! logged copies of the blocks it covers whole (`supersede`). A discard or write-zeroes of a
//! whole logged block logs a zero entry (no data IO), so the origin never sees it before the
//! log forgets the block; of an unlogged block it goes to the origin. A read that misses
//! keeps its `readahead` window as clean copies in free slots (`read_missed`).

use super::state::SlotState;
use super::writeback::Pick;
use super::{lock_all, relaxed, Inner};
use std::sync::atomic::Ordering::Relaxed;
use strata_io::{check_range, Buf, Error, ErrorKind, Result, ZeroFlags};

/// Blocks in one write around the log that make it a stream (64 KiB of 4 KiB blocks).
const STREAM_BLOCKS: u64 = 16;
/// Most whole blocks of one request logged together (`write_run`).
const RUN_BLOCKS: usize = 256;

/// One request's part inside one cache block.
#[derive(Debug, Clone, Copy)]
struct Piece {
    block: u64,
    /// Offset inside the block.
    within: u64,
    len: u64,
    /// Offset inside the request.
    at: u64,
}

fn pieces(offset: u64, len: u64, block: u64) -> impl Iterator<Item = Piece> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let b = pos / block;
        let within = pos % block;
        let n = (block - within).min(end - pos);
        let p = Piece { block: b, within, len: n, at: pos - offset };
        pos += n;
        Some(p)
    })
}

impl Inner {
    pub(super) async fn read(&self, offset: u64, mut buf: Buf) -> Result<Buf> {
        check_range("writecache read", offset, buf.len() as u64, self.size)?;
        // Pieces the log does not hold are read from the origin in one request per run of
        // adjacent ones (`missed`: offset inside the request and length).
        let mut missed: Option<(u64, u64)> = None;
        for p in pieces(offset, buf.len() as u64, self.block) {
            let logged = {
                let st = self.state.lock();
                st.log_suspect || st.lookup(p.block).is_some()
            };
            if !logged {
                relaxed(&self.counters.read_misses);
                missed = match missed {
                    Some((at, len)) => Some((at, len + p.len)),
                    None => Some((p.at, p.len)),
                };
                continue;
            }
            if let Some((at, len)) = missed.take() {
                self.read_missed(offset + at, &mut buf[at as usize..(at + len) as usize]).await?;
            }
            let data = self.read_piece(p.block, p.within, p.len).await?;
            buf[p.at as usize..(p.at + p.len) as usize].copy_from_slice(&data);
        }
        if let Some((at, len)) = missed {
            self.read_missed(offset + at, &mut buf[at as usize..(at + len) as usize]).await?;
        }
        Ok(buf)
    }

    /// Reads blocks the log does not hold from the origin. A run inside one `readahead`
    /// window reads the whole window instead, in one request, and keeps those of its blocks
    /// the log holds no copy of in free slots above the reserve (`keep_read`). Their lock
    /// ranges are held from the check that no copy is logged to the install, so no write can
    /// log, write back or send around the log any of them meanwhile and the origin's data read
    /// is theirs; a range another request holds is not waited for, and a window the origin
    /// fails to read is not kept: the run is then read alone.
    async fn read_missed(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let t = *self.tunables.lock();
        let per = t.readahead_bytes / self.block;
        let (first, last) = (offset / self.block, (offset + out.len() as u64 - 1) / self.block);
        let window = strata_policy::readahead_range(first, per, self.size.div_ceil(self.block));
        let room = || self.state.lock().counts().0.saturating_sub(self.reserve(&t));
        if per == 0 || last >= window.end || self.keeping_refused.load(Relaxed) || room() == 0 {
            return self.read_origin(offset, out).await;
        }
        let (w0, w1) = (window.start, window.end - 1);
        let Some(_guards) = self.try_lock_range(w0, w1) else {
            return self.read_origin(offset, out).await;
        };
        let keep = {
            let room = room();
            let mut st = self.state.lock();
            let mut keep: Vec<u64> = window.filter(|&b| !st.logged_anywhere(b)).collect();
            // The blocks asked for first, then their neighbours; then in address order.
            keep.sort_by_key(|&b| !(first..=last).contains(&b));
            keep.truncate(room as usize);
            keep.sort_unstable();
            let slots = if st.stopped.is_some() { None } else { st.alloc_n(keep.len()) };
            match slots {
                Some(slots) if !slots.is_empty() => keep.into_iter().zip(slots).collect::<Vec<_>>(),
                _ => Vec::new(),
            }
        };
        if keep.is_empty() {
            return self.read_origin(offset, out).await;
        }
        let at = w0 * self.block;
        let window =
            self.origin.read(at, Buf::zeroed(((w1 + 1) * self.block).min(self.size) as usize - at as usize)).await;
        let Ok(window) = window else {
            // The window may reach a block the run does not: the run alone decides the error.
            {
                let mut st = self.state.lock();
                for &(_, s) in &keep {
                    st.unalloc(s);
                }
            }
            return self.read_origin(offset, out).await;
        };
        let from = (offset - at) as usize;
        out.copy_from_slice(&window[from..from + out.len()]);
        self.keep_read(&window, w0, &keep).await;
        Ok(())
    }

    /// Writes the blocks `keep` (block, free slot; in block order) of `window` (the origin's
    /// data from block `w0`) to their slots, adjacent blocks in adjacent slots as one write,
    /// and installs them as read copies; the slots of a write that fails are given back (the
    /// read itself has its data).
    async fn keep_read(&self, window: &[u8], w0: u64, keep: &[(u64, u32)]) {
        let bytes = |from: u64, to: u64| {
            let at = ((from - w0) * self.block) as usize;
            &window[at..at + ((to - from) * self.block + self.block_len(to)) as usize]
        };
        let runs: Vec<&[(u64, u32)]> = keep.chunk_by(|a, b| b.0 == a.0 + 1 && b.1 == a.1 + 1).collect();
        let writes = runs.iter().map(|r| {
            let (from, to) = (r[0].0, r[r.len() - 1].0);
            self.cache.write(self.slot_offset(r[0].1), Buf::from_slice(bytes(from, to)), false)
        });
        let results = futures::future::join_all(writes).await;
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            self.log_write_failed(e, "a read's window not kept; none is until a write to the log succeeds");
            self.keeping_refused.store(true, Relaxed);
        }
        let mut st = self.state.lock();
        let mut kept = 0;
        for (run, r) in runs.iter().zip(results) {
            for &(b, s) in run.iter() {
                if r.is_ok() && !st.logged_anywhere(b) {
                    st.install_read(b, s);
                    kept += 1;
                } else {
                    st.unalloc(s);
                }
            }
        }
        self.counters.reads_kept.fetch_add(kept, Relaxed);
    }

    async fn read_origin(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let data = self.origin.read(offset, Buf::zeroed(out.len())).await?;
        out.copy_from_slice(&data);
        Ok(())
    }

    /// `len` bytes at `within` of block `b`, from its newest copy.
    async fn read_piece(&self, b: u64, within: u64, len: u64) -> Result<Buf> {
        let slot = {
            let mut st = self.state.lock();
            match st.lookup(b) {
                Some(_) if st.log_suspect => return Err(log_lost(b)),
                Some(s) => {
                    if st.zero(s) {
                        relaxed(&self.counters.read_hits);
                        return Ok(Buf::zeroed(len as usize));
                    }
                    st.pin(s);
                    Some((s, st.durable(s)))
                }
                None => None,
            }
        };
        match slot {
            Some((s, durable)) => {
                relaxed(&self.counters.read_hits);
                // A slot whose entry is not durable loses its data if the flush under way
                // fails, and then holds older data, another block's: read it between flushes.
                let _between = match durable {
                    true => None,
                    false => Some(self.flush_gate.read().await),
                };
                if !durable {
                    let mut st = self.state.lock();
                    if st.log_suspect {
                        st.unpin(s);
                        return Err(log_lost(b));
                    }
                }
                let r = self.cache.read(self.slot_offset(s) + within, Buf::zeroed(len as usize)).await;
                self.state.lock().unpin(s);
                r.map_err(|e| {
                    Error::new(e.kind, format!("writecache: block {b} (logged in slot {s}) unreadable: {}", e.context))
                })
            }
            None => {
                relaxed(&self.counters.read_misses);
                self.origin.read(b * self.block + within, Buf::zeroed(len as usize)).await
            }
        }
    }

    pub(super) async fn write(&self, offset: u64, buf: Buf, fua: bool) -> Result<Buf> {
        check_range("writecache write", offset, buf.len() as u64, self.size)?;
        self.state.lock().check_running()?;
        let total = match buf.len() as u64 {
            0 => 0,
            len => (offset + len - 1) / self.block - offset / self.block + 1,
        };
        let mut generation = 0;
        let mut pieces = pieces(offset, buf.len() as u64, self.block).enumerate().peekable();
        while let Some((k, p)) = pieces.next() {
            // What the log has no room for goes around it as one write.
            let left = total - k as u64;
            if left > 1 && self.state.lock().counts().0 < left {
                if k == 0 {
                    return self.write_around(offset, buf, fua).await;
                }
                let rest = Buf::from_slice(&buf[p.at as usize..]);
                self.write_around(offset + p.at, rest, fua).await?;
                break;
            }
            // Whole blocks in a row go to the log together (`write_run`).
            let whole = |p: &Piece| p.within == 0 && p.len == self.block_len(p.block);
            if whole(&p) {
                let mut run = 1;
                while run < RUN_BLOCKS && pieces.peek().is_some_and(|(_, q)| whole(q)) {
                    pieces.next();
                    run += 1;
                }
                if run > 1 {
                    let end = (p.at + run as u64 * self.block).min(buf.len() as u64);
                    let g = self.write_run(p.block, &buf[p.at as usize..end as usize], fua).await?;
                    generation = generation.max(g);
                    continue;
                }
            }
            let data = &buf[p.at as usize..(p.at + p.len) as usize];
            if let Some(g) = self.write_piece(p, Some(data), fua).await? {
                generation = generation.max(g);
            }
        }
        if fua && generation > 0 {
            self.commit_upto(generation).await?;
        }
        Ok(buf)
    }

    /// Logs the whole blocks from `b0` that `data` covers, all at once: their locks taken
    /// together (ascending, as every path takes them), one slot each, the slot writes of
    /// consecutive slots merged and all issued together, then installed under one state lock.
    /// Returns the generation to commit. Without a slot for each (another writer took them
    /// since the caller looked) the blocks go one by one (`write_piece`), those without a slot
    /// around the log, with the request's FUA.
    async fn write_run(&self, b0: u64, data: &[u8], fua: bool) -> Result<u64> {
        let n = data.len().div_ceil(self.block as usize) as u64;
        let guards = lock_all(&self.stripes, &self.stripes_of_range(b0, b0 + n - 1)).await;
        let slots = {
            let mut st = self.state.lock();
            st.check_running()?;
            let slots = st.alloc_n(n as usize);
            if slots.is_some() {
                for b in b0..b0 + n {
                    self.count_write(st.lookup(b).is_some());
                }
            }
            slots
        };
        let Some(slots) = slots else {
            drop(guards);
            let mut generation = 0;
            for (i, b) in (b0..b0 + n).enumerate() {
                let at = i * self.block as usize;
                let len = self.block_len(b);
                let p = Piece { block: b, within: 0, len, at: at as u64 };
                if let Some(g) = self.write_piece(p, Some(&data[at..at + len as usize]), fua).await? {
                    generation = generation.max(g);
                }
            }
            return Ok(generation);
        };
        let bs = self.block as usize;
        let block_data = |i: usize| &data[i * bs..((i + 1) * bs).min(data.len())];
        // Consecutive slots take one write.
        let mut writes = Vec::new();
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1] + 1 {
                j += 1;
            }
            let end = (j * bs).min(data.len());
            writes.push(self.cache.write(self.slot_offset(slots[i]), Buf::from_slice(&data[i * bs..end]), false));
            i = j;
        }
        let crcs: Vec<u32> = (0..slots.len()).map(|i| crc32c::crc32c(block_data(i))).collect();
        let mut failed = None;
        for r in futures::future::join_all(writes).await {
            if let Err(e) = r {
                failed = failed.or(Some(e));
            }
        }
        if let Some(e) = failed {
            {
                let mut st = self.state.lock();
                for &s in &slots {
                    st.unalloc(s);
                }
            }
            drop(guards);
            // The log could not take them (full file system, failing device): around it.
            self.log_write_failed(&e, "written around it");
            self.write_around(b0 * self.block, Buf::from_slice(data), fua).await?;
            return Ok(0);
        }
        self.log_write_succeeded();
        let mut st = self.state.lock();
        let mut generation = 0;
        for (i, (&s, &crc)) in slots.iter().zip(&crcs).enumerate() {
            generation = st.install(b0 + i as u64, s, crc, false);
        }
        self.kick_if_due(&st, generation);
        Ok(generation)
    }

    /// A write the log's device failed (`then`: what was done instead); the failure shows in
    /// status, and the first one on stderr too.
    fn log_write_failed(&self, e: &strata_io::Error, then: &str) {
        let what = format!("a write to the log failed, {then}: {e}");
        if self.counters.log_write_errors.fetch_add(1, Relaxed) == 0 {
            eprintln!("strata: write log of {}: {what} (later ones are counted in the status)", self.describe_origin);
        }
        *self.last_error.lock() = Some(what);
    }

    /// The log's device took a write: read misses may keep their windows again.
    fn log_write_succeeded(&self) {
        if self.keeping_refused.load(Relaxed) {
            self.keeping_refused.store(false, Relaxed);
        }
    }

    /// Counts a write to a block the log holds (`hit`) or not.
    fn count_write(&self, hit: bool) {
        relaxed(if hit { &self.counters.write_hits } else { &self.counters.write_misses });
    }

    /// Wakes the background task when the log is past `high_watermark` or `autocommit_blocks`
    /// changes wait for a commit (generation `g` just installed).
    fn kick_if_due(&self, st: &super::state::State, g: u64) {
        let (free, _) = st.counts();
        let t = *self.tunables.lock();
        if free * 100 < self.sb.slots * (100 - t.high_watermark as u64) || g - st.durable_gen >= t.autocommit_blocks {
            self.kick.notify_one();
        }
    }

    /// Writes one piece (`None`: zeroes) under its block's lock. Returns the generation to
    /// commit for a logged write, `None` for one that went around the log (FUA already done).
    async fn write_piece(&self, p: Piece, data: Option<&[u8]>, fua: bool) -> Result<Option<u64>> {
        let b = p.block;
        let whole = p.within == 0 && p.len == self.block_len(b);
        let _lock = self.stripes[self.stripe(b)].lock().await;
        self.state.lock().check_running()?;
        let len = self.block_len(b) as usize;
        self.count_write(self.state.lock().lookup(b).is_some());
        let block_data = if whole {
            match data {
                Some(d) => Buf::from_slice(d),
                None => Buf::zeroed(len),
            }
        } else {
            let mut cur = self.read_piece(b, 0, len as u64).await?;
            let dst = &mut cur[p.within as usize..(p.within + p.len) as usize];
            match data {
                Some(d) => dst.copy_from_slice(d),
                None => dst.fill(0),
            }
            cur
        };
        let zero = whole && data.is_none();
        let slot = self.state.lock().alloc();
        let Some(s) = slot else {
            self.kick.notify_one();
            relaxed(&self.counters.writes_around);
            let _origin = self.origin_locks[self.stripe(b)].lock().await;
            // The whole block (a partial write was merged above): no logged copy is written back.
            let r = if zero {
                self.origin.write_zeroes(b * self.block, len as u64, ZeroFlags::default()).await
            } else {
                self.origin.write(b * self.block, block_data, fua).await.map(drop)
            };
            self.origin_writes.fetch_add(1, Relaxed);
            r?;
            self.supersede(b, b, fua && !zero).await?;
            return Ok(None);
        };
        let crc = if zero { 0 } else { crc32c::crc32c(&block_data) };
        if !zero {
            if let Err(e) = self.cache.write(self.slot_offset(s), block_data, false).await {
                self.state.lock().unalloc(s);
                drop(_lock);
                self.log_write_failed(&e, "written around it");
                let piece = data.map_or_else(|| Buf::zeroed(p.len as usize), Buf::from_slice);
                self.write_around(b * self.block + p.within, piece, fua).await?;
                return Ok(None);
            }
            self.log_write_succeeded();
        }
        let generation = {
            let mut st = self.state.lock();
            let g = st.install(b, s, crc, zero);
            self.kick_if_due(&st, g);
            g
        };
        Ok(Some(generation))
    }

    /// A request of several blocks the log has no room for goes to the origin as one write,
    /// all its blocks' locks held (block locks, then origin-write locks, each in ascending
    /// order, as every path takes them). Only the blocks it covers in part have their dirty
    /// logged copies written back first (they hold newer data for the rest of the block than
    /// the origin); the others' copies it supersedes (`supersede`). A large one marks the
    /// origin as streaming, which pauses write-back until `pause_writeback` after its end
    /// (see `writeback.rs`).
    async fn write_around(&self, offset: u64, buf: Buf, fua: bool) -> Result<Buf> {
        let (first, last) = (offset / self.block, (offset + buf.len() as u64 - 1) / self.block);
        let blocks = last - first + 1;
        if blocks >= STREAM_BLOCKS {
            // Before waiting for the locks: a write-back batch holding some stops at its next run.
            self.last_stream.store(self.now_ns(), Relaxed);
        }
        let stripes = self.stripes_of_range(first, last);
        let _guards = lock_all(&self.stripes, &stripes).await;
        let _origin_guards = lock_all(&self.origin_locks, &stripes).await;
        self.state.lock().check_running()?;
        let partial = self.partial_blocks(offset, buf.len() as u64);
        self.write_back_live(&partial).await?;
        self.counters.writes_around.fetch_add(blocks, Relaxed);
        self.counters.writes_around_partial.fetch_add(partial.len() as u64, Relaxed);
        self.kick.notify_one();
        let r = self.origin.write(offset, buf, fua).await;
        self.origin_writes.fetch_add(1, Relaxed);
        if blocks >= STREAM_BLOCKS {
            self.last_stream.store(self.now_ns(), Relaxed);
        }
        let buf = r?;
        self.supersede(first, last, fua).await?;
        Ok(buf)
    }

    /// The blocks a request covers only in part: at most its first and its last.
    fn partial_blocks(&self, offset: u64, len: u64) -> Vec<u64> {
        let end = offset + len;
        let (first, last) = (offset / self.block, (end - 1) / self.block);
        let whole = |b: u64| offset <= b * self.block && b * self.block + self.block_len(b) <= end;
        let mut edges = vec![first, last];
        edges.dedup();
        edges.retain(|&b| !whole(b));
        edges
    }

    /// Once a write around the log has landed on the origin over blocks `first..=last` (their
    /// block and origin-write locks held; `durable`: written with FUA), their logged copies
    /// leave the index and are cleared on disk, one commit for them all, before the write is
    /// acknowledged, so none can come back over it, on a read or after a crash. Reads get the
    /// logged copy until then, never the origin's older data. When a copy is dirty, the origin
    /// is flushed first: a crash must not leave the origin's older data with the log's newer
    /// copy gone. Blocks covered in part were written back first (`write_back_live`).
    async fn supersede(&self, first: u64, last: u64, durable: bool) -> Result<()> {
        let dirty = {
            let st = self.state.lock();
            (first..=last).any(|b| st.dirty_copy(b))
        };
        if dirty && !durable {
            self.origin_flush().await?;
        }
        {
            let mut st = self.state.lock();
            for b in first..=last {
                if st.lookup(b).is_some() {
                    relaxed(&self.counters.writes_around_superseded);
                }
                st.superseded(b);
            }
        }
        self.clear_logged(first, last).await
    }

    /// Writes back the dirty live copies of `blocks`, with one origin flush for them all, and
    /// retires their live copies (their block and origin-write locks held).
    async fn write_back_live(&self, blocks: &[u64]) -> Result<()> {
        let (live, picks) = {
            let mut st = self.state.lock();
            let live: Vec<(u64, u32)> = blocks.iter().filter_map(|&b| st.lookup(b).map(|s| (b, s))).collect();
            let mut picks = Vec::new();
            for &(b, s) in &live {
                if st.state(s) == (SlotState::Live { dirty: true }) {
                    st.pin(s);
                    picks.push(Pick {
                        block: b,
                        slot: s,
                        seq: st.slot(s).seq,
                        crc: st.slot(s).data_crc,
                        zero: st.zero(s),
                    });
                }
            }
            (live, picks)
        };
        let r = async {
            for p in &picks {
                self.copy_run(&[p]).await?;
            }
            if picks.is_empty() {
                Ok(())
            } else {
                self.origin_flush().await
            }
        }
        .await;
        let mut st = self.state.lock();
        for p in &picks {
            st.unpin(p.slot);
        }
        r?;
        for p in &picks {
            if st.mark_clean(p.slot, p.seq) {
                relaxed(&self.counters.writebacks);
                relaxed(&self.counters.writes_around_writebacks);
            }
        }
        for (b, s) in live {
            if st.lookup(b) == Some(s) {
                st.retire(s);
            }
        }
        Ok(())
    }

    /// Commits until no copy of blocks `first..=last` is logged on disk. Writes going around
    /// at once share commits: each looks again once it holds the commit lock, and one commit
    /// clears every copy retired before it.
    async fn clear_logged(&self, first: u64, last: u64) -> Result<()> {
        let logged = || {
            let st = self.state.lock();
            (first..=last).any(|b| st.logged_anywhere(b))
        };
        while logged() {
            let _one = self.commit_lock.lock().await;
            if logged() {
                self.commit_locked().await?;
            }
        }
        Ok(())
    }

    pub(super) async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        check_range("writecache write_zeroes", offset, len, self.size)?;
        if flags.fast_only {
            return Err(Error::new(ErrorKind::Unsupported, "writecache: no fast zeroing"));
        }
        self.zero_or_discard(offset, len, false).await
    }

    pub(super) async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_range("writecache discard", offset, len, self.size)?;
        self.zero_or_discard(offset, len, true).await
    }

    async fn zero_or_discard(&self, offset: u64, len: u64, discard: bool) -> Result<()> {
        self.state.lock().check_running()?;
        let mut generation = 0;
        for p in pieces(offset, len, self.block) {
            let whole = p.within == 0 && p.len == self.block_len(p.block);
            if !whole {
                if discard {
                    continue; // contents become unspecified: leaving them is allowed
                }
                if let Some(g) = self.write_piece(p, None, false).await? {
                    generation = generation.max(g);
                }
                continue;
            }
            let logged = self.state.lock().logged_anywhere(p.block);
            if logged {
                if let Some(g) = self.write_piece(p, None, false).await? {
                    generation = generation.max(g);
                }
                continue;
            }
            let _lock = self.stripes[self.stripe(p.block)].lock().await;
            if self.state.lock().logged_anywhere(p.block) {
                drop(_lock);
                if let Some(g) = self.write_piece(p, None, false).await? {
                    generation = generation.max(g);
                }
                continue;
            }
            let at = p.block * self.block;
            let r = if discard {
                self.origin.discard(at, p.len).await
            } else {
                self.origin.write_zeroes(at, p.len, ZeroFlags::default()).await
            };
            self.origin_writes.fetch_add(1, Relaxed);
            r?;
        }
        let _ = generation;
        Ok(())
    }
}

/// A read of block `b`, logged, once the log lost writes in a failed flush.
fn log_lost(b: u64) -> Error {
    Error::new(ErrorKind::Io, format!("writecache: block {b} is in the log, which lost writes in a failed flush"))
}

#[cfg(test)]
mod tests {
    use crate::target::test_log;
    use crate::Tunables;
    use std::sync::Arc;
    use strata_io::mem::MemDev;
    use strata_io::powercut::PowerCut;
    use strata_io::{BlockDev, Buf};

    /// A run of whole blocks that finds no free slots once it holds their locks (another
    /// writer took them) goes around the log block by block: with FUA, each block must be
    /// durable on the origin when the write returns, whatever a power cut then keeps.
    #[tokio::test]
    async fn a_fua_run_that_finds_the_log_full_is_durable_on_the_origin() {
        const BLOCK: usize = 4096;
        let origin = Arc::new(PowerCut::new(MemDev::new(1 << 20)));
        let t = Tunables { writeback_running: false, readahead_bytes: 0, ..Tunables::default() };
        let dev = test_log(Arc::new(MemDev::new(64 << 10)), origin.clone(), t).await;
        let slots = dev.inner.sb.slots;
        for b in 0..slots {
            dev.write(b * BLOCK as u64, Buf::from_slice(&[1; BLOCK]), false).await.unwrap();
        }
        assert_eq!(dev.inner.state.lock().counts().0, 0, "the log is full");
        let at = 100;
        dev.inner.write_run(at, &[7; 4 * BLOCK], true).await.unwrap();
        for seed in 0..16 {
            let image = origin.crash_at(origin.now(), seed).unwrap();
            let got = image.read(at * BLOCK as u64, Buf::zeroed(4 * BLOCK)).await.unwrap();
            assert!(got.iter().all(|&x| x == 7), "seed {seed}: the FUA run is not durable on the origin");
        }
    }
}
