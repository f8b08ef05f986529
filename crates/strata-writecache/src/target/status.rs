//! The target's status and the messages it takes while serving.

use super::Inner;
use crate::status::{Tunables, WritecacheStatus};
use std::sync::atomic::Ordering::Relaxed;
use strata_io::{Buf, Error, ErrorKind, Result};

impl Inner {
    pub(crate) fn status(&self) -> WritecacheStatus {
        let (free, dirty, writing, stopped, memory) = {
            let st = self.state.lock();
            let (free, dirty) = st.counts();
            (free, dirty, st.writing_back.len() as u64, st.stopped.clone(), st.heap_bytes() as u64)
        };
        let c = &self.counters;
        let tunables = *self.tunables.lock();
        WritecacheStatus {
            target: "writecache".into(),
            block_bytes: self.sb.block_bytes,
            blocks: self.sb.slots,
            free_blocks: free,
            dirty_blocks: dirty,
            writeback_blocks: writing,
            read_hits: c.read_hits.load(Relaxed),
            read_misses: c.read_misses.load(Relaxed),
            write_hits: c.write_hits.load(Relaxed),
            write_misses: c.write_misses.load(Relaxed),
            writes_around: c.writes_around.load(Relaxed),
            writes_around_partial: c.writes_around_partial.load(Relaxed),
            writes_around_writebacks: c.writes_around_writebacks.load(Relaxed),
            writes_around_superseded: c.writes_around_superseded.load(Relaxed),
            writebacks: c.writebacks.load(Relaxed),
            writeback_rate: Some(f64::from_bits(self.writeback_rate.load(Relaxed))).filter(|r| r.is_finite()),
            writeback_errors: c.writeback_errors.load(Relaxed),
            log_write_errors: c.log_write_errors.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            reads_kept: c.reads_kept.load(Relaxed),
            commits: c.commits.load(Relaxed),
            writeback_held: self.held(&tunables).map(|h| h.to_string()),
            tunables,
            memory_bytes: memory,
            last_error: self.last_error.lock().clone(),
            stopped,
        }
    }

    /// Writes `t` into the superblock (its last sector: a torn write leaves the rest as it
    /// was) and commits (`commit_lock` held), so the next open takes them again.
    async fn keep_tunables(&self, t: &Tunables) -> Result<()> {
        let sb = crate::format::Superblock { settings: t.encode(), ..self.sb.clone() };
        self.cache.write(0, Buf::from_slice(&sb.encode()), false).await?;
        self.commit_locked().await
    }

    /// `flush` (write back everything now), `commit`, or tunables, one `NAME VALUE` per line:
    /// every line is checked before any takes effect, so a bad one changes nothing.
    pub(crate) async fn message(&self, msg: &str) -> Result<String> {
        let unknown = || {
            Error::new(
                ErrorKind::Invalid,
                format!("writecache: unknown message {msg:?} (flush, commit, or NAME VALUE lines)"),
            )
        };
        let words: Vec<&str> = msg.split_whitespace().collect();
        match words.as_slice() {
            ["flush"] => {
                self.writeback_all().await?;
                if !self.tunables.lock().cleaner {
                    return Ok("every dirty block is on the origin".into());
                }
                // Detaching: no entry may outlive it, or a log served again after its origin
                // was written without it would read, and write back, its old copies.
                self.evict_all_clean().await?;
                Ok("every dirty block is on the origin; the log holds no block".into())
            }
            ["commit"] => {
                self.commit_force().await?;
                Ok("committed".into())
            }
            [_, _, ..] => {
                let _one = self.commit_lock.lock().await;
                let mut settings = Vec::new();
                for line in msg.lines().filter(|l| !l.trim().is_empty()) {
                    match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                        &[name, value] => settings.push((name, value)),
                        _ => return Err(unknown()),
                    }
                }
                let (old, t) = {
                    let mut t = self.tunables.lock();
                    let old = *t;
                    t.set_all(&settings)?;
                    (old, *t)
                };
                let answers: Vec<String> = settings.iter().map(|(n, v)| format!("{n} = {v}")).collect();
                self.kick.notify_one();
                if t != old {
                    self.keep_tunables(&t).await?;
                }
                Ok(answers.join("; "))
            }
            _ => Err(unknown()),
        }
    }
}
