//! Commits: the one place entries reach the disk. A commit writes every entry page changed
//! since the last one (new entries, and zeroes for the stale slots it may clear) and then
//! flushes the fast device once: the data of every write it covers completed before it
//! started, so that flush makes data and entries durable together. Recovery tells an entry
//! whose data did not land by the data checksum (see `format.rs`).

use super::state::SlotState;
use super::{relaxed, Inner};
use crate::format::{Entry, COMMIT_MAX, ENTRIES_PER_PAGE, ENTRY_BYTES, ENTRY_PAGE_BYTES};
use std::sync::atomic::Ordering::Relaxed;
use strata_io::{Buf, Error, ErrorKind, Result};

impl Inner {
    /// Returns once every change up to generation `generation` is durable.
    pub(super) async fn commit_upto(&self, generation: u64) -> Result<()> {
        self.state.lock().check_running()?;
        if self.state.lock().durable_gen >= generation {
            return Ok(());
        }
        let _one = self.commit_lock.lock().await;
        if self.state.lock().durable_gen >= generation {
            return Ok(());
        }
        self.commit_locked().await
    }

    /// A commit now, whatever is pending (it also clears stale slots).
    pub(crate) async fn commit_force(&self) -> Result<()> {
        let _one = self.commit_lock.lock().await;
        self.commit_locked().await
    }

    /// A commit, `commit_lock` held by the caller.
    pub(super) async fn commit_locked(&self) -> Result<()> {
        self.state.lock().check_running()?;
        let (pages, clearing, garbage, live, generation) = {
            let mut st = self.state.lock();
            if st.commit + 1 >= COMMIT_MAX {
                let why = format!("commit numbers are used up ({COMMIT_MAX}): detach the log and create it anew");
                return Err(Error::new(ErrorKind::NoSpace, why));
            }
            st.commit += 1;
            let n = st.commit;
            let clearing = st.clearable();
            let garbage = std::mem::take(&mut st.garbage);
            for &s in clearing.iter().chain(&garbage) {
                st.touch(s);
            }
            let pages: Vec<u64> = std::mem::take(&mut st.dirty_pages).into_iter().collect();
            let zero: rustc_hash::FxHashSet<u32> = clearing.iter().chain(&garbage).copied().collect();
            let mut live = Vec::new();
            let mut bufs = Vec::with_capacity(pages.len());
            for &p in &pages {
                let mut buf = Buf::zeroed(ENTRY_PAGE_BYTES as usize);
                let first = p * ENTRIES_PER_PAGE;
                let last = (first + ENTRIES_PER_PAGE).min(self.sb.slots);
                for s in first as u32..last as u32 {
                    let at = ((s as u64 - first) * ENTRY_BYTES) as usize;
                    let out = &mut buf[at..at + ENTRY_BYTES as usize];
                    if !st.keeps_entry(s, |s| zero.contains(&s)) {
                        Entry::encode_free(out);
                        continue;
                    }
                    if matches!(st.state(s), SlotState::Live { .. }) && !st.on_disk(s) {
                        st.written_by(s, n);
                        live.push((s, st.slot(s).seq));
                    }
                    st.entry(s).encode(out);
                }
                bufs.push((p, buf));
            }
            (bufs, clearing, garbage, live, st.write_gen)
        };
        let writes = pages
            .iter()
            .map(|(p, buf)| self.cache.write(self.sb.entries_offset() + p * ENTRY_PAGE_BYTES, buf.clone(), false));
        let mut result: Result<()> = Ok(());
        for w in futures::future::join_all(writes).await {
            if let Err(e) = w {
                result = Err(e);
            }
        }
        if result.is_ok() {
            let _alone = self.flush_gate.write().await;
            result = self.cache.flush().await;
            if let Err(e) = &result {
                self.state.lock().stop(format!("fast device flush: {e}"), true);
            }
        }
        let mut st = self.state.lock();
        match result {
            Ok(()) => {
                for s in clearing.into_iter().chain(garbage) {
                    st.cleared(s);
                }
                for (s, seq) in live {
                    st.committed(s, seq);
                }
                st.durable_gen = st.durable_gen.max(generation);
                relaxed(&self.counters.commits);
                Ok(())
            }
            Err(e) => {
                // Nothing is known durable: write the pages again next time, keep the slots.
                for (p, _) in &pages {
                    st.dirty_pages.insert(*p);
                }
                st.garbage.extend(garbage);
                drop(st);
                *self.last_error.lock() = Some(format!("commit failed: {e}"));
                Err(e)
            }
        }
    }

    /// FLUSH: the log's entries, and the origin if writes went around the log since its last
    /// flush.
    pub(super) async fn flush(&self) -> Result<()> {
        let generation = {
            let st = self.state.lock();
            st.check_running()?;
            st.write_gen
        };
        let (a, b) = futures::join!(self.commit_upto(generation), self.origin_flush());
        a.and(b)
    }

    /// Flushes the origin if it took writes since its last flush.
    pub(super) async fn origin_flush(&self) -> Result<()> {
        let wanted = self.origin_writes.load(Relaxed);
        let mut durable = self.origin_durable.lock().await;
        if *durable >= wanted {
            return Ok(());
        }
        self.state.lock().check_running()?;
        let upto = self.origin_writes.load(Relaxed);
        if let Err(e) = self.origin.flush().await {
            // An origin away for now lost nothing: this flush failed, a later one may not.
            if e.kind != ErrorKind::Unavailable {
                self.state.lock().stop(format!("origin flush: {e}"), false);
            }
            return Err(e);
        }
        *durable = upto;
        Ok(())
    }
}
