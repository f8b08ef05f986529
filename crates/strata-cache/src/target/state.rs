//! The books kept under the state lock: a slot is free, reserved by a promotion under way,
//! mapped, or freed in memory and reusable once a commit records it free. Also the faults
//! that degrade or stop the volume.

use super::{Inner, State};
use crate::format::Mode;
use crate::meter::Counters;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;
use strata_io::{Error, ErrorKind, Result};

impl State {
    /// Latches a failed flush or commit: data it covered may be gone from a device however
    /// later flushes fare (a buffered file drops pages whose write-back failed), so the
    /// volume stops acknowledging writes and flushes until an operator restarts it, which
    /// recovers from what is durable.
    pub(super) fn fail(&mut self, why: String, cache_device: bool) {
        self.cache_suspect |= cache_device;
        if self.failed.is_none() {
            self.failed = Some(why.clone());
        }
        self.fault(format!("stopped: {why}"));
    }

    /// Records a fault and goes to the safe mode: no new dirty data (writeback becomes
    /// writethrough), while dirty data stays readable where it is and keeps being written
    /// back. The mode change is in memory; an operator sets it for good with `cache set`.
    pub(super) fn fault(&mut self, what: String) {
        if self.faults.len() >= 64 {
            self.faults.remove(0);
        }
        self.faults.push(what);
        if self.meta.sb.mode == Mode::Writeback {
            self.meta.sb.mode = Mode::Writethrough;
        }
    }

    /// Removes `b` from the mapping. If the table holds the mapping, its slot is reusable
    /// after the next commit and the origin copy of `b` is not written before then
    /// (`pending`); an unrecorded one's slot is free at once.
    pub(super) fn unmap(&mut self, b: u64) -> Option<u32> {
        let s = self.map.remove(&b)?;
        if self.meta.entries[s as usize].valid {
            self.meta.set(s, 0, false, false);
            self.freed.push(s);
            self.pending.insert(b, self.meta.changes());
        } else {
            // Unrecorded, never in the table: nothing of it can come back after a crash.
            self.free.push(s);
        }
        Some(s)
    }

    /// `unmap`, counted as a demotion (the policy already forgot `b`).
    pub(super) fn demote(&mut self, b: u64, counters: &Counters) -> Option<u32> {
        let s = self.unmap(b)?;
        Counters::bump(&counters.demotions);
        Some(s)
    }

    /// Maps `b` to `s`: dirty, as one table change; clean, in memory until the next full
    /// commit records it (`unrecorded`).
    pub(super) fn map_to(&mut self, b: u64, s: u32, dirty: bool) {
        self.map.insert(b, s);
        if dirty {
            self.meta.set(s, b, true, true);
        } else {
            self.unrecorded.push((b, s));
        }
        self.write_gen[s as usize] = self.write_gen[s as usize].wrapping_add(1);
    }

    /// Puts the clean mappings still current into the table (before a full commit).
    pub(super) fn record_clean(&mut self) {
        for (b, s) in std::mem::take(&mut self.unrecorded) {
            if self.map.get(&b) == Some(&s) && !self.meta.entries[s as usize].valid {
                self.meta.set(s, b, true, false);
            }
        }
    }

    /// Unmaps every clean block (dm-cache's `invalidate_cblocks` for the whole cache):
    /// the next reads go to the origin. Returns how many were dropped.
    pub(super) fn invalidate_clean(&mut self, counters: &Counters) -> usize {
        let clean: Vec<u64> =
            self.map.iter().filter(|&(_, &s)| !self.meta.entries[s as usize].dirty).map(|(&b, _)| b).collect();
        for &b in &clean {
            self.policy.remove(b);
            self.demote(b, counters);
        }
        clean.len()
    }

    pub(super) fn stopped(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(Error::new(
                ErrorKind::Io,
                format!(
                    "cache stopped after a failed flush ({why}); it accepts no writes or flushes{} until restarted",
                    if self.cache_suspect { ", nor reads of cached blocks," } else { "" }
                ),
            )),
        }
    }

    /// A free slot that no IO still uses.
    pub(super) fn reserve(&mut self, refs: &[AtomicU32]) -> Option<u32> {
        let pos = self.free.iter().rposition(|&s| refs[s as usize].load(Relaxed) == 0)?;
        Some(self.free.swap_remove(pos))
    }

    /// Applies a promotion decision's eviction. False if the victim turned out dirty (a
    /// policy bug the engine refuses to act on: the victim is put back).
    pub(super) fn evict(&mut self, victim: Option<u64>, counters: &Counters) -> bool {
        let Some(v) = victim else { return true };
        if let Some(&s) = self.map.get(&v) {
            if self.meta.entries[s as usize].dirty {
                let _ = self.policy.insert(v, true);
                return false;
            }
        }
        self.demote(v, counters);
        true
    }
}

impl Inner {
    /// Commits to make freed slots reusable, then takes one, waiting for promotions in
    /// flight to hand theirs back if need be; if none comes (every slot still in use), the
    /// promotion of `b` is given up.
    pub(super) async fn slot_after_commit(&self, b: u64) -> Option<u32> {
        if let Some(s) = self.free_slot().await {
            return Some(s);
        }
        let mut st = self.state.lock();
        st.policy.remove(b);
        Counters::bump(&self.counters.promotions_skipped);
        None
    }

    /// A free slot, committing to make freed slots reusable and waiting for promotions in
    /// flight to hand theirs back if need be; `None` if every slot stays in use.
    pub(super) async fn free_slot(&self) -> Option<u32> {
        if let Some(s) = self.state.lock().reserve(&self.refs) {
            return Some(s);
        }
        for _ in 0..200 {
            // Freed slots come back with any commit; a light one will do.
            {
                let guard = self.commit_lock.lock().await;
                let _ = self.commit_locked(&guard, false).await;
            }
            let waiting = {
                let mut st = self.state.lock();
                if let Some(s) = st.reserve(&self.refs) {
                    return Some(s);
                }
                self.slots_in_flight(&st) > 0
            };
            if !waiting {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        None
    }

    /// Slots neither mapped nor free: promotions under way.
    fn slots_in_flight(&self, st: &State) -> usize {
        st.meta.slots() - st.map.len() - st.free.len() - st.freed.len()
    }
}
