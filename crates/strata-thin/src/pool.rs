//! An open pool: its metadata in memory behind one lock, its data device, the commit that
//! makes provisioning durable, and per-block ordering of IO. Several volumes (`ThinDev`s)
//! share one pool.
//!
//! Ordering (dm-thin's bio prison, with the O_SYNC fast path of its 2023 patch): IO to a
//! block already mapped and not shared takes its block's lock shared and goes straight to
//! the data device, FUA included; provisioning, copy-on-write and unmapping take it
//! exclusively, so no IO to a block runs while its mapping changes. Locks are striped by
//! (volume, block).
//!
//! Durability: new mappings are committed by the next FLUSH (one transaction for all of
//! them) or by a FUA write to a block mapped since the last commit; a FLUSH or FUA write
//! that changes no mapping writes no metadata.

use crate::meta::{Commit, DevId, Metadata};
use parking_lot::Mutex;
use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use strata_io::{BlockDev, Error, ErrorKind, Result};
use tokio::sync::RwLock;

const STRIPES: usize = 1024;

/// How a pool behaves (dm-thin's pool features that strata has).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolOptions {
    /// Do not zero the rest of a newly provisioned block (it may show old data of the
    /// data device).
    pub skip_block_zeroing: bool,
    /// Do not pass discards of freed blocks down to the data device.
    pub no_discard_passdown: bool,
}

pub(crate) struct State {
    pub meta: Metadata,
    /// Mappings made since the last prepared commit (a FUA write to one needs a commit).
    pub uncommitted: FxHashSet<(DevId, u64)>,
    /// Those in the commit being written.
    pub committing: FxHashSet<(DevId, u64)>,
    /// Why the pool takes no more writes, if it does not.
    pub failed: Option<String>,
    pub out_of_data: bool,
    pub metadata_low: bool,
    /// The metadata is going back to the last commit (`abort`): mappings are not to be used.
    pub aborting: bool,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub commits: AtomicU64,
    pub provisioned: AtomicU64,
    pub copied: AtomicU64,
    pub unmapped: AtomicU64,
    pub passdowns: AtomicU64,
    pub no_space: AtomicU64,
}

pub struct Pool {
    pub(crate) md: Arc<dyn BlockDev>,
    pub(crate) data: Arc<dyn BlockDev>,
    pub(crate) state: Mutex<State>,
    commit_lock: tokio::sync::Mutex<()>,
    stripes: Vec<RwLock<()>>,
    pub(crate) block_bytes: u64,
    pub(crate) opts: PoolOptions,
    pub(crate) counters: Counters,
    describe: String,
    /// The spec the data device was opened from, as its opener gave it.
    pub data_spec: String,
}

/// The pool's state for `strata status` and the thin volumes' status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolStatus {
    /// ok, out_of_data_space, metadata_low or failed.
    pub mode: String,
    pub reason: Option<String>,
    pub transaction_id: u64,
    pub time: u32,
    pub block_bytes: u64,
    pub data_blocks: u64,
    pub data_used_blocks: u64,
    pub metadata_blocks: u64,
    pub metadata_used_blocks: u64,
    pub volumes: usize,
    pub skip_block_zeroing: bool,
    pub commits: u64,
    pub provisioned_blocks: u64,
    pub copied_blocks: u64,
    pub unmapped_blocks: u64,
    pub no_space_errors: u64,
}

/// Metadata blocks kept free for commits: provisioning stops below this.
fn metadata_reserve(m: &Metadata) -> u64 {
    (m.tm.md.nr_blocks() / 8).clamp(16, 256)
}

impl Pool {
    /// Opens the pool on `md` with data on `data` (opened from `data_spec`), checking the
    /// metadata as it is read and its reference counts against the trees.
    pub async fn open(
        md: Arc<dyn BlockDev>,
        data: Arc<dyn BlockDev>,
        data_spec: &str,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>> {
        let meta = Metadata::open(&*md).await?;
        // A count below its references would hand out a block still in use: refuse.
        let report = crate::check::check_counts(&meta);
        if !report.clean() {
            return Err(Error::new(
                ErrorKind::Checksum,
                format!("{}: the pool's metadata is damaged: {}", md.describe(), report.errors.join("; ")),
            ));
        }
        let block_bytes = meta.data_block_bytes();
        let need = meta.tm.data.nr_blocks() * block_bytes;
        if data.size() < need {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "the data device {} holds {} bytes, the pool's {} blocks of {block_bytes} need {need}",
                    data.describe(),
                    data.size(),
                    meta.tm.data.nr_blocks()
                ),
            ));
        }
        let describe = format!("thin pool {} (data {})", md.describe(), data.describe());
        Ok(Arc::new(Pool {
            md,
            data,
            state: Mutex::new(State {
                meta,
                uncommitted: FxHashSet::default(),
                committing: FxHashSet::default(),
                failed: None,
                out_of_data: false,
                metadata_low: false,
                aborting: false,
            }),
            commit_lock: tokio::sync::Mutex::new(()),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            block_bytes,
            opts,
            counters: Counters::default(),
            describe,
            data_spec: data_spec.to_string(),
        }))
    }

    pub fn describe(&self) -> String {
        self.describe.clone()
    }

    pub fn options(&self) -> PoolOptions {
        self.opts
    }

    pub(crate) fn stripe(&self, id: DevId, vblock: u64) -> &RwLock<()> {
        let h = (vblock ^ ((id as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
        &self.stripes[h as usize % STRIPES]
    }

    /// Runs `f` on the metadata.
    pub fn with_meta<T>(&self, f: impl FnOnce(&mut Metadata) -> T) -> T {
        f(&mut self.state.lock().meta)
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        match &self.state.lock().failed {
            Some(why) => Err(Error::new(ErrorKind::Io, format!("{}: the pool has failed: {why}", self.describe))),
            None => Ok(()),
        }
    }

    /// Stops the pool taking writes, for `why`.
    pub(crate) fn fail(&self, why: String) -> Error {
        let mut st = self.state.lock();
        st.failed.get_or_insert(why.clone());
        Error::new(ErrorKind::Io, format!("{}: {why}", self.describe))
    }

    /// A data block for a new mapping, or NoSpace (after a commit has released what the
    /// current transaction freed).
    pub(crate) async fn alloc_data(&self) -> Result<u64> {
        for attempt in 0..2 {
            {
                let mut st = self.state.lock();
                let reserve = metadata_reserve(&st.meta);
                st.metadata_low = st.meta.tm.md.allocatable() < reserve;
                if !st.metadata_low {
                    if let Some(b) = st.meta.alloc_data() {
                        st.out_of_data = false;
                        return Ok(b);
                    }
                    st.out_of_data = true;
                }
                let held = st.meta.tm.data.held() + st.meta.tm.md.held();
                if attempt == 1 || held == 0 {
                    self.counters.no_space.fetch_add(1, Relaxed);
                    let what = if st.metadata_low { "metadata device nearly full" } else { "data device full" };
                    return Err(Error::new(ErrorKind::NoSpace, format!("{}: {what}", self.describe)));
                }
            }
            self.commit().await?;
        }
        unreachable!()
    }

    /// Commits every change since the last commit: data device flushed, new metadata blocks
    /// written and flushed, then the superblock. With nothing changed, only the data device
    /// is flushed.
    pub async fn commit(&self) -> Result<()> {
        self.commit_unless(|| false).await
    }

    /// Commits for a FUA write to `vblock` of `id`: nothing if, once the commits before are
    /// done, one of them holds its mapping (FUA writes to new blocks at once share commits).
    pub(crate) async fn commit_for(&self, id: DevId, vblock: u64) -> Result<()> {
        self.commit_unless(|| !self.uncommitted(id, vblock)).await
    }

    /// `commit`, unless `done()` says so once the commit lock is held.
    async fn commit_unless(&self, done: impl Fn() -> bool) -> Result<()> {
        let _one = self.commit_lock.lock().await;
        // A failed commit forgets uncommitted mappings after failing the pool: check after.
        let done = done();
        self.check_writable()?;
        if done {
            return Ok(());
        }
        let prepared: Result<Option<Commit>> = {
            let mut st = self.state.lock();
            let c = st.meta.prepare_commit();
            st.committing = std::mem::take(&mut st.uncommitted);
            c
        };
        let commit = match prepared {
            Ok(Some(c)) => c,
            // Nothing to commit: the data device alone, still after any commit before. If
            // that flush fails, writes it covered may be gone: no later flush may say
            // otherwise.
            Ok(None) => {
                return match self.data.flush().await {
                    Ok(()) => Ok(()),
                    Err(e) => Err(self.abort(format!("flushing the data device failed: {}", e.context)).await),
                }
            }
            Err(e) => return Err(self.abort(format!("commit failed: {}", e.context)).await),
        };
        if let Err(e) = self.data.flush().await {
            return Err(self.abort(format!("flushing the data device failed: {}", e.context)).await);
        }
        if let Err(e) = commit.write(&*self.md).await {
            return Err(self.abort(format!("writing the metadata failed: {}", e.context)).await);
        }
        let mut st = self.state.lock();
        st.meta.committed();
        st.committing.clear();
        self.counters.commits.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Fails the pool for `why` and, as dm-thin aborts the transaction, goes back to the
    /// metadata last committed: a failed flush may have lost the data of blocks mapped since,
    /// so reads must not follow those mappings (a block copied from a snapshot's would read
    /// as zeroes where the shared block still holds flushed data).
    async fn abort(&self, why: String) -> Error {
        let e = self.fail(why);
        self.state.lock().aborting = true;
        let reopened = Metadata::open(&*self.md).await;
        let mut st = self.state.lock();
        if let Ok(meta) = reopened {
            st.meta = meta;
            st.uncommitted.clear();
            st.committing.clear();
            st.aborting = false;
        }
        e
    }

    /// Makes every completed write durable: a commit if mappings changed, else a flush of
    /// the data device alone (after the commit in progress, if any: it may hold the
    /// mappings of blocks written since).
    pub async fn flush(&self) -> Result<()> {
        self.commit().await
    }

    /// Whether the mapping of this block awaits a commit.
    pub(crate) fn uncommitted(&self, id: DevId, vblock: u64) -> bool {
        let st = self.state.lock();
        st.uncommitted.contains(&(id, vblock)) || st.committing.contains(&(id, vblock))
    }

    pub fn status(&self) -> PoolStatus {
        let st = self.state.lock();
        let m = &st.meta;
        let (mode, reason) = if let Some(why) = &st.failed {
            ("failed", Some(why.clone()))
        } else if st.out_of_data {
            ("out_of_data_space", Some("the data device is full: writes needing a new block fail".to_string()))
        } else if st.metadata_low {
            ("metadata_low", Some("the metadata device is nearly full: writes needing a new block fail".to_string()))
        } else {
            ("ok", None)
        };
        let c = &self.counters;
        PoolStatus {
            mode: mode.into(),
            reason,
            transaction_id: m.transaction_id(),
            time: m.time(),
            block_bytes: self.block_bytes,
            data_blocks: m.tm.data.nr_blocks(),
            data_used_blocks: m.tm.data.allocated(),
            metadata_blocks: m.tm.md.nr_blocks(),
            metadata_used_blocks: m.tm.md.allocated(),
            volumes: m.devices().len(),
            skip_block_zeroing: self.opts.skip_block_zeroing,
            commits: c.commits.load(Relaxed),
            provisioned_blocks: c.provisioned.load(Relaxed),
            copied_blocks: c.copied.load(Relaxed),
            unmapped_blocks: c.unmapped.load(Relaxed),
            no_space_errors: c.no_space.load(Relaxed),
        }
    }
}
