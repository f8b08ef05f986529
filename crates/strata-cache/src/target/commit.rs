//! Commits: where mappings, and so dirty blocks in their slots, become durable (origin
//! flush, cache flush, changed table pages, cache flush), and the superblock write.

use super::{during, futures_join, Inner};
use crate::meter::{Counters, Kind};
use strata_io::{Buf, Error, ErrorKind, Result};

impl Inner {
    /// Makes every completed write durable: origin flush, cache data flush, then the
    /// changed table pages and another cache flush.
    pub(super) async fn commit(&self) -> Result<()> {
        self.state.lock().stopped()?;
        let guard = self.commit_lock.lock().await;
        self.commit_locked(&guard, true).await
    }

    /// Makes table changes up to number `n` durable, sharing a commit with everyone who
    /// waits for one meanwhile.
    pub(super) async fn commit_upto(&self, n: u64) -> Result<()> {
        let done = |me: &Self| {
            let st = me.state.lock();
            st.stopped().map(|_| st.durable_changes >= n)
        };
        if done(self)? {
            return Ok(());
        }
        let guard = self.commit_lock.lock().await;
        if done(self)? {
            return Ok(());
        }
        self.commit_locked(&guard, false).await
    }

    /// Waits until no durable mapping of `b` can outlive a crash, if it was unmapped lately:
    /// the origin copy of `b` may be written from then on. (A clean mapping that came back
    /// after a crash would hide the new origin data, and read differently once evicted.)
    pub(super) async fn settle(&self, b: u64) -> Result<()> {
        let pending = self.state.lock().pending.get(&b).copied();
        match pending {
            Some(n) => self.commit_upto(n).await,
            None => Ok(()),
        }
    }

    /// A full commit (`full`) also records the clean mappings made since the last one and
    /// flushes the origin first; a light one flushes the cache device only.
    pub(super) async fn commit_locked(&self, _guard: &tokio::sync::MutexGuard<'_, ()>, full: bool) -> Result<()> {
        let batch = {
            let mut st = self.state.lock();
            st.stopped()?;
            if full {
                st.record_clean();
            }
            if st.meta.has_changes() {
                st.committing = std::mem::take(&mut st.freed);
                Some(st.meta.prepare_commit())
            } else {
                None
            }
        };
        let origin_flush = async {
            match full {
                true => self.origin_answered(self.origin.flush().await),
                false => Ok(()),
            }
        };
        let (o, c) = tokio::join!(origin_flush, self.flush_cache());
        // On failure: the error, and whether the cache device failed (whatever else did).
        let result: std::result::Result<(), (Error, bool)> = async {
            c.map_err(|e| (during(e, "cache flush"), true))?;
            o.map_err(|e| (during(e, "origin flush"), false))?;
            if let Some(batch) = &batch {
                let writes =
                    batch.pages.iter().map(|(_, off, _, bytes)| self.cache.write(*off, Buf::from_slice(bytes), false));
                futures_join(writes).await.map_err(|e| (during(e, "metadata write"), true))?;
                self.flush_cache().await.map_err(|e| (during(e, "metadata flush"), true))?;
            }
            Ok(())
        }
        .await;
        let mut st = self.state.lock();
        match (&batch, &result) {
            (Some(b), Ok(())) => {
                st.meta.commit_done(b);
                let freed = std::mem::take(&mut st.committing);
                st.free.extend(freed);
                st.durable_changes = b.upto;
                st.pending.retain(|_, n| *n > b.upto);
                Counters::bump(&self.counters.commits);
            }
            (Some(b), Err(_)) => {
                st.meta.commit_failed(b);
                let freed = std::mem::take(&mut st.committing);
                st.freed.extend(freed);
            }
            _ => {}
        }
        st.debug_check();
        result.map_err(|(e, cache_device)| {
            // An origin away for now lost nothing: this commit failed, a later one may not.
            if cache_device || e.kind != ErrorKind::Unavailable {
                st.fail(format!("{e}"), cache_device);
            }
            e
        })
    }

    /// Flushes the origin under the commit lock, as every flush is: two flushes of one
    /// device in flight at once can split a failure between them (only one sees the error,
    /// as with two fsyncs of one file), and the other would acknowledge what the failure
    /// lost. A failure stops the volume, latched before the lock is released so no commit
    /// after it acknowledges anything; except an origin away for now (`Unavailable`, its own
    /// status says so), which lost nothing.
    pub(super) async fn flush_origin(&self, kind: Kind, what: &str) -> Result<()> {
        let _one = self.commit_lock.lock().await;
        let flushed = {
            let _busy = self.meter.start(kind);
            self.origin_answered(self.origin.flush().await)
        };
        if let Err(e) = &flushed {
            if e.kind != ErrorKind::Unavailable {
                self.state.lock().fail(format!("origin flush {what}: {e}"), false);
            }
        }
        flushed
    }

    /// Flushes the cache device. The slots mapped until now are durable with this flush or
    /// lost with it: reads of them wait (`read_slot`) until it is known which, and a failure
    /// is marked (`cache_suspect`) before they go on.
    async fn flush_cache(&self) -> Result<()> {
        let _alone = self.flush_gate.write().await;
        {
            let mut st = self.state.lock();
            st.flushing = std::mem::take(&mut st.fresh);
        }
        let r = self.cache.flush().await;
        let mut st = self.state.lock();
        st.cache_suspect |= r.is_err();
        st.flushing.clear();
        r
    }

    pub(super) async fn write_superblock(&self) -> Result<()> {
        let _g = self.commit_lock.lock().await;
        let (bytes, at) = {
            let sb = self.state.lock().superblock();
            (sb.encode(), sb.offset())
        };
        self.cache.write(at, Buf::from_slice(&bytes), true).await.map(|_| ())
    }
}
