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
//! them), by a FUA write to a block mapped since the last commit, or at the latest one
//! commit period (1 s unless set) after they were made, by a background task (dm-thin's
//! `commit_period`); a FLUSH or FUA write that changes no mapping writes no metadata. A
//! mapping enters the metadata only once its data is written, and a commit flushes the data
//! device before it writes metadata: no commit maps a block to data not yet durable.
//!
//! Live changes (while volumes are served): create, snapshot, delete and extend commit at
//! once. A snapshot first quiesces the pool (takes every block lock exclusively, so the
//! writes in flight finish and new ones wait), so it holds exactly the writes completed
//! before it, as dm-thin's snapshot of a suspended origin does. A volume that is open (served)
//! cannot be deleted.

use crate::meta::{Commit, DevId, Metadata};
use parking_lot::{Mutex, RwLock as SyncRwLock};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use strata_io::rwlock::RwLock;
use strata_io::{BlockDev, Error, ErrorKind, Result};

const STRIPES: usize = 1024;

/// dm-thin's default commit period.
pub const COMMIT_PERIOD_DEFAULT: Duration = Duration::from_secs(1);

/// The longest commit period, in milliseconds (an hour): a longer one is a commit on FLUSH
/// and FUA alone, which 0 asks for plainly.
pub const COMMIT_PERIOD_MAX_MS: u64 = 3_600_000;

/// How a pool behaves (dm-thin's pool features that strata has).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolOptions {
    /// Do not zero the rest of a newly provisioned block (it may show old data of the
    /// data device).
    pub skip_block_zeroing: bool,
    /// Do not pass discards of freed blocks down to the data device.
    pub no_discard_passdown: bool,
}

/// A pool's settings that change while it serves (dm-thin's `low_water_mark` and
/// `commit_period`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    /// Free data blocks at or below which the pool reports itself low (0: never).
    pub low_water_blocks: u64,
    /// Provisioning is committed at the latest this long after it was made, FLUSH or not
    /// (zero: only by FLUSH and FUA).
    pub commit_period: Duration,
}

impl Default for Tunables {
    fn default() -> Tunables {
        Tunables { low_water_blocks: 0, commit_period: COMMIT_PERIOD_DEFAULT }
    }
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
    /// The first metadata block found unreadable or damaged while serving (its leaves are
    /// read when first needed): requests that need it fail, the others go on.
    pub damaged: Option<String>,
}

impl State {
    /// Whether the mapping of `vblock` of `id` was made since the last commit (or is in
    /// the one being written).
    pub fn awaits_commit(&self, id: DevId, vblock: u64) -> bool {
        let key = (id, vblock);
        self.uncommitted.contains(&key) || self.committing.contains(&key)
    }
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

/// The volumes open on a pool, and whether the last of them has shut it down: a closed
/// pool takes no more volumes and no more commits.
#[derive(Default)]
struct OpenVolumes {
    by_id: FxHashMap<DevId, usize>,
    closed: bool,
}

pub struct Pool {
    pub(crate) md: Arc<dyn BlockDev>,
    pub(crate) data: Arc<dyn BlockDev>,
    /// Shared by lookups (every request), taken alone to change the metadata.
    pub(crate) state: SyncRwLock<State>,
    commit_lock: tokio::sync::Mutex<()>,
    /// Held alone by a commit while it flushes the data device and, if that fails, until
    /// the pool is back at its last commit; shared by reads through mappings that await a
    /// commit (`ThinDev::read_piece`). A failed flush loses the data of those mappings'
    /// blocks (a copy of a snapshot's block among them), so such a read must not meet one.
    pub(crate) flush_gate: tokio::sync::RwLock<()>,
    stripes: Vec<RwLock>,
    pub(crate) block_bytes: u64,
    pub(crate) opts: PoolOptions,
    pub(crate) counters: Counters,
    describe: String,
    /// The spec the data device was opened from, as its opener gave it.
    pub data_spec: String,
    /// The metadata device's path, as the opener names the pool (status shows it, so the
    /// admin commands find the server's pool by its path).
    path: OnceLock<String>,
    /// The `Tunables`, kept apart so the low-water mark is read without a lock on every
    /// allocation: the mark in data blocks, and the commit period in ms.
    low_water_blocks: AtomicU64,
    commit_period_ms: AtomicU64,
    /// Set when the background committer should look again (a new period).
    kick: Arc<tokio::sync::Notify>,
    below_low_water: AtomicBool,
    /// When the last commit became durable (ms since the epoch; 0: none since open).
    last_commit_ms: AtomicU64,
    /// Volumes open (served) now, by id: these cannot be deleted.
    open_volumes: Mutex<OpenVolumes>,
    /// Volumes' shutdowns, one at a time (`shutdown_volume`).
    closing: tokio::sync::Mutex<()>,
    /// Wakes the background deleter (a deletion started, or steps resumed).
    delete_kick: Arc<tokio::sync::Notify>,
    /// Nodes a deletion step drops at most (`Metadata::delete_step`), and whether the
    /// background deleter is paused.
    delete_step_nodes: AtomicU64,
    deletions_paused: AtomicBool,
}

/// Nodes a background deletion step drops at most by default: about 256 leaves of a
/// volume's own (up to 64,512 mappings), a few ms under the pool's lock.
pub const DELETE_STEP_NODES: usize = 256;

/// Background deletion steps per commit (the last step of a deletion is committed at once;
/// a FLUSH or the periodic commit commits those before too).
pub const DELETE_STEPS_PER_COMMIT: usize = 8;

/// The pool's state for `strata status` and the thin volumes' status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolStatus {
    /// ok, out_of_data_space, metadata_low, failed or metadata_unreadable.
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
    /// The metadata device's path ("" if the opener gave none).
    pub metadata_path: String,
    pub data_free_blocks: u64,
    pub metadata_free_blocks: u64,
    /// dm-thin's low_water_mark, in data blocks (0: none).
    pub low_water_blocks: u64,
    /// Free data blocks at or below the low-water mark.
    pub below_low_water: bool,
    pub commit_period_ms: u64,
    /// When the last commit was durable, in ms since the Unix epoch (0: none since open).
    pub last_commit_unix_ms: u64,
    /// Devices being deleted in the background (hidden, their space being freed).
    #[serde(default)]
    pub deleting: Vec<DevId>,
}

impl Pool {
    /// Opens the pool on `md` with data on `data` (opened from `data_spec`), checking the
    /// metadata as it is read: the superblock, space maps and the trees down to the nodes
    /// above the devices' leaves, which are read (and checked) when first needed.
    pub async fn open(
        md: Arc<dyn BlockDev>,
        data: Arc<dyn BlockDev>,
        data_spec: &str,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>> {
        // The devices' leaves are read when first needed; the counts are not compared with
        // the trees here (strata thin check and thin_check do that, as before dm-thin's).
        let meta = Metadata::open_lazy(&*md).await?;
        if let Some(why) = meta.sb.not_writable() {
            return Err(Error::new(ErrorKind::Invalid, why));
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
        let pool = Arc::new(Pool {
            md,
            data,
            state: SyncRwLock::new(State {
                meta,
                uncommitted: FxHashSet::default(),
                committing: FxHashSet::default(),
                failed: None,
                out_of_data: false,
                metadata_low: false,
                aborting: false,
                damaged: None,
            }),
            commit_lock: tokio::sync::Mutex::new(()),
            flush_gate: tokio::sync::RwLock::new(()),
            stripes: (0..STRIPES).map(|_| RwLock::new()).collect(),
            block_bytes,
            opts,
            counters: Counters::default(),
            describe,
            data_spec: data_spec.to_string(),
            path: OnceLock::new(),
            low_water_blocks: AtomicU64::new(Tunables::default().low_water_blocks),
            commit_period_ms: AtomicU64::new(Tunables::default().commit_period.as_millis() as u64),
            kick: Arc::new(tokio::sync::Notify::new()),
            below_low_water: AtomicBool::new(false),
            last_commit_ms: AtomicU64::new(0),
            open_volumes: Mutex::new(OpenVolumes::default()),
            closing: tokio::sync::Mutex::new(()),
            delete_kick: Arc::new(tokio::sync::Notify::new()),
            delete_step_nodes: AtomicU64::new(DELETE_STEP_NODES as u64),
            deletions_paused: AtomicBool::new(false),
        });
        tokio::spawn(periodic_commit(Arc::downgrade(&pool), pool.kick.clone()));
        // Deletions recorded as in progress resume at once.
        tokio::spawn(background_delete(Arc::downgrade(&pool), pool.delete_kick.clone()));
        Ok(pool)
    }

    /// Names the pool by its metadata device's path (once; later calls are ignored).
    pub fn set_path(&self, path: &str) {
        let _ = self.path.set(path.to_string());
    }

    pub fn tunables(&self) -> Tunables {
        Tunables {
            low_water_blocks: self.low_water_blocks.load(Relaxed),
            commit_period: Duration::from_millis(self.commit_period_ms.load(Relaxed)),
        }
    }

    /// Changes the settings; the low-water mark is looked at again at once.
    pub fn set_tunables(&self, t: Tunables) {
        self.low_water_blocks.store(t.low_water_blocks, Relaxed);
        self.commit_period_ms.store(t.commit_period.as_millis() as u64, Relaxed);
        self.kick.notify_one();
        let st = self.state.read();
        self.watch_low_water(&st);
    }

    /// Logs the free data blocks crossing the low-water mark, either way.
    fn watch_low_water(&self, st: &State) {
        let mark = self.low_water_blocks.load(Relaxed);
        let free = st.meta.tm.data.free();
        let below = mark > 0 && free <= mark;
        if self.below_low_water.swap(below, Relaxed) != below {
            if below {
                eprintln!(
                    "strata: {}: {free} free data blocks, at or below the low-water mark of {mark}: extend the pool",
                    self.describe
                );
            } else {
                eprintln!(
                    "strata: {}: {free} free data blocks, above the low-water mark of {mark} again",
                    self.describe
                );
            }
        }
    }

    /// Counts volume `id` open (a served `ThinDev`) until the matching `close_volume`;
    /// refused once the pool is closed.
    pub(crate) fn open_volume(&self, id: DevId) -> Result<()> {
        let mut open = self.open_volumes.lock();
        if open.closed {
            return Err(Error::new(ErrorKind::Busy, format!("{}: its last volume is closing it", self.describe)));
        }
        *open.by_id.entry(id).or_default() += 1;
        Ok(())
    }

    /// Gives up volume `id`'s place (none: only looks). With `closing` (a clean shutdown),
    /// the last volume to go closes the pool in the same step, so no volume opens on a pool
    /// being shut down; returns whether it did.
    pub(crate) fn close_volume(&self, id: Option<DevId>, closing: bool) -> bool {
        let mut open = self.open_volumes.lock();
        if let Some(id) = id {
            if let Some(n) = open.by_id.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    open.by_id.remove(&id);
                }
            }
        }
        let last = closing && open.by_id.is_empty() && !open.closed;
        open.closed |= last;
        last
    }

    /// Whether the last volume has shut the pool down (or is doing so).
    pub fn closed(&self) -> bool {
        self.open_volumes.lock().closed
    }

    /// Volume `id`'s clean shutdown. While other volumes are open it is a commit, and the
    /// pool keeps running for them; the last one also shuts the data and metadata devices
    /// down (a cache as the data device saves its hints and is marked clean), and no commit
    /// runs after. One at a time, so the last starts after the others' commits.
    pub(crate) async fn shutdown_volume(&self, id: DevId) -> Result<()> {
        let _one_at_a_time = self.closing.lock().await;
        match self.close_volume(Some(id), true) {
            true => self.shut_down().await,
            false => self.flush().await,
        }
    }

    /// Shuts the pool down as its last volume would, if no volume is open on it: for an
    /// open that made the pool and then failed (an unknown volume id).
    pub async fn close_unused(&self) -> Result<()> {
        if self.closed() {
            // Being shut down by its last volume: nothing to wait for here.
            return Ok(());
        }
        let _one_at_a_time = self.closing.lock().await;
        match self.close_volume(None, true) {
            true => self.shut_down().await,
            false => Ok(()),
        }
    }

    /// The last commit, then the devices' shutdowns, with no commit after.
    async fn shut_down(&self) -> Result<()> {
        let _no_commit_after = self.commit_lock.lock().await;
        let committed = self.commit_now().await;
        let md = self.md.shutdown().await;
        let data = self.data.shutdown().await;
        committed.and(md).and(data)
    }

    /// Runs `f` on the metadata, then commits it (live changes of volumes and space). `f`
    /// changes nothing when it fails (the metadata's own changes check first); if it is
    /// refused for want of metadata space that a commit would release, it is tried again
    /// after one. Should a failing `f` have changed the metadata, the pool fails rather
    /// than commit half a change.
    async fn change<T>(&self, f: impl Fn(&mut Metadata) -> Result<T>) -> Result<T> {
        for attempt in 0..2 {
            self.check_writable()?;
            let (out, half_done, retry) = {
                let mut st = self.state.write();
                let marks = |m: &Metadata| (m.transaction_id(), m.tm.md.allocated(), m.tm.md.held());
                let before = marks(&st.meta);
                let out = f(&mut st.meta);
                self.watch_low_water(&st);
                let half_done = out.is_err() && marks(&st.meta) != before;
                let retry = matches!(&out, Err(e) if e.kind == ErrorKind::NoSpace) && st.meta.tm.md.held() > 0;
                (out, half_done, retry && attempt == 0)
            };
            match out {
                Ok(out) => {
                    self.commit().await?;
                    return Ok(out);
                }
                Err(e) if half_done => return Err(self.fail(format!("a change failed half done: {}", e.context))),
                Err(_) if retry => self.commit().await?,
                Err(e) => return Err(e),
            }
        }
        unreachable!()
    }

    /// Creates an empty volume `id` of `size` bytes, committed.
    pub async fn create_volume(&self, id: DevId, size: u64) -> Result<()> {
        self.change(|m| m.create_volume(id, size)).await
    }

    /// Snapshots `origin` as `id`, committed. The pool is quiesced meanwhile: the snapshot
    /// holds every write completed before it and none started after.
    pub async fn snapshot(&self, origin: DevId, id: DevId) -> Result<()> {
        let mut held = Vec::with_capacity(STRIPES);
        for s in &self.stripes {
            held.push(s.write().await);
        }
        let r = self.change(|m| m.create_snapshot_sized(id, origin)).await;
        drop(held);
        r
    }

    /// Deletes volume `id`: it is marked as being deleted and hidden, committed (one
    /// transaction), and its space is freed in the background (`background_delete`);
    /// refused while it is open (served).
    pub async fn delete_volume(&self, id: DevId) -> Result<()> {
        if self.open_volumes.lock().by_id.contains_key(&id) {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("thin volume {id} is open (served): remove its export first (strata export remove)"),
            ));
        }
        self.change(|m| m.start_delete(id)).await?;
        self.delete_kick.notify_one();
        Ok(())
    }

    /// The devices being deleted in the background.
    pub fn deleting(&self) -> Vec<DevId> {
        self.state.read().meta.deleting().iter().copied().collect()
    }

    /// Pauses or resumes the background deleter (a step in progress finishes).
    pub fn pause_deletions(&self, paused: bool) {
        self.deletions_paused.store(paused, Relaxed);
        self.delete_kick.notify_one();
    }

    /// Sets the nodes a deletion step drops at most (at least 1).
    pub fn set_delete_step_nodes(&self, nodes: usize) {
        self.delete_step_nodes.store(nodes.max(1) as u64, Relaxed);
    }

    /// One step of the first deletion in progress, committed: Ok(None) when there is none,
    /// else the device and whether its deletion ended. The step runs under the pool's lock
    /// once the nodes it frees are in memory; IO waits for one step at most, and a FLUSH
    /// then commits it with its own changes.
    pub async fn delete_step(&self) -> Result<Option<(DevId, bool)>> {
        self.step(true).await
    }

    /// `delete_step`, committed if `commit` or if the deletion ended.
    async fn step(&self, commit: bool) -> Result<Option<(DevId, bool)>> {
        self.check_writable()?;
        let Some(id) = self.state.read().meta.deleting().first().copied() else { return Ok(None) };
        let budget = self.delete_step_nodes.load(Relaxed) as usize;
        let done = self
            .with_loaded(
                |m| m.missing_for_step(id, budget),
                |st| {
                    let r = st.meta.delete_step(id, budget);
                    self.watch_low_water(st);
                    r
                },
            )
            .await?;
        let done = match done {
            Ok(done) => done,
            // The metadata in memory may be half changed: nothing more is committed.
            Err(e) => return Err(self.fail(format!("deleting thin device {id} failed: {}", e.context))),
        };
        // Down to the metadata reserve, each step commits: the nodes it shadowed are
        // released for the next.
        if commit || done || self.state.read().meta.check_metadata_room().is_err() {
            self.commit().await?;
        }
        Ok(Some((id, done)))
    }

    /// Waits until no deletion is in progress (the background deleter's work is done);
    /// an error if the pool fails first.
    pub async fn wait_deletions(&self) -> Result<()> {
        loop {
            self.check_writable()?;
            if self.state.read().meta.deleting().is_empty() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Grows the data space to `data_bytes` and the metadata space to `md_bytes`, growing
    /// their devices first (`BlockDev::grow`: a file is lengthened; a block device must have
    /// been grown already, as by `lvextend`).
    pub async fn extend(&self, data_bytes: Option<u64>, md_bytes: Option<u64>) -> Result<()> {
        if let Some(bytes) = data_bytes {
            self.data.grow(bytes).await?;
        }
        let md_bytes = md_bytes.map(crate::format::metadata_bytes_used);
        if let Some(bytes) = md_bytes {
            self.md.grow(bytes).await?;
        }
        let bs = self.block_bytes;
        self.change(|m| {
            if let Some(bytes) = data_bytes {
                m.extend_data(bytes / bs)?;
            }
            if let Some(bytes) = md_bytes {
                m.extend_metadata(bytes / crate::format::BLOCK as u64)?;
            }
            Ok(())
        })
        .await?;
        let mut st = self.state.write();
        st.out_of_data = false;
        st.metadata_low = false;
        Ok(())
    }

    /// A control message from the admin endpoint: `create ID SIZE`, `snapshot ORIGIN ID`,
    /// `delete ID`, `extend data|metadata BYTES`, `low_water_blocks N`, `commit_period_ms N`.
    pub async fn message(&self, msg: &str) -> Result<String> {
        let words: Vec<&str> = msg.split_whitespace().collect();
        let bad = |w: &str| Error::new(ErrorKind::Invalid, format!("thin: bad number {w:?} in {msg:?}"));
        let num = |w: &str| w.parse::<u64>().map_err(|_| bad(w));
        let id = |w: &str| w.parse::<DevId>().map_err(|_| bad(w));
        match words.as_slice() {
            ["create", i, size] => {
                self.create_volume(id(i)?, num(size)?).await?;
                Ok(format!("created thin volume {i}"))
            }
            ["snapshot", origin, i] => {
                self.snapshot(id(origin)?, id(i)?).await?;
                Ok(format!("created snapshot {i} of thin volume {origin}"))
            }
            ["delete", i] => {
                self.delete_volume(id(i)?).await?;
                Ok(format!("deleted thin volume {i} (its space is freed in the background)"))
            }
            ["extend", "data", bytes] => {
                self.extend(Some(num(bytes)?), None).await?;
                Ok(format!("{} data blocks", self.status().data_blocks))
            }
            ["extend", "metadata", bytes] => {
                self.extend(None, Some(num(bytes)?)).await?;
                Ok(format!("{} metadata blocks", self.status().metadata_blocks))
            }
            ["low_water_blocks", n] => {
                let n = num(n)?;
                self.set_tunables(Tunables { low_water_blocks: n, ..self.tunables() });
                Ok(format!("low_water_blocks = {n}"))
            }
            ["commit_period_ms", n] => {
                let n = num(n)?;
                if n > COMMIT_PERIOD_MAX_MS {
                    return Err(Error::new(
                        ErrorKind::Invalid,
                        format!("thin: commit_period_ms {n} is past an hour ({COMMIT_PERIOD_MAX_MS}; 0 commits only on FLUSH and FUA)"),
                    ));
                }
                self.set_tunables(Tunables { commit_period: Duration::from_millis(n), ..self.tunables() });
                Ok(format!("commit_period_ms = {n}"))
            }
            _ => Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "thin: unknown message {msg:?} (create ID SIZE, snapshot ORIGIN ID, delete ID, \
                     extend data|metadata BYTES, low_water_blocks N, commit_period_ms N)"
                ),
            )),
        }
    }

    pub fn describe(&self) -> String {
        self.describe.clone()
    }

    pub fn options(&self) -> PoolOptions {
        self.opts
    }

    pub(crate) fn stripe(&self, id: DevId, vblock: u64) -> &RwLock {
        let h = (vblock ^ ((id as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
        &self.stripes[h as usize % STRIPES]
    }

    /// Runs `f` on the metadata.
    pub fn with_meta<T>(&self, f: impl FnOnce(&mut Metadata) -> T) -> T {
        f(&mut self.state.write().meta)
    }

    /// Runs `f` on the pool's state once the nodes `need` names are in memory (they are
    /// read from the metadata device first, lock released, until `need` names none).
    pub(crate) async fn with_loaded<T>(
        &self,
        need: impl Fn(&Metadata) -> Result<Vec<(u64, u64)>>,
        f: impl FnOnce(&mut State) -> T,
    ) -> Result<T> {
        loop {
            let (missing, limits) = {
                let mut st = self.state.write();
                let missing = need(&st.meta)?;
                if missing.is_empty() {
                    return Ok(f(&mut st));
                }
                (missing, st.meta.limits())
            };
            self.fetch_nodes(missing, limits).await?;
        }
    }

    /// Reads the nodes `missing` names (block, lowest key its parent allows) from the
    /// metadata device, checked (`meta::fetch_leaf`), into memory; `limits`: `Metadata::limits`.
    pub(crate) async fn fetch_nodes(&self, missing: Vec<(u64, u64)>, limits: (u64, u64)) -> Result<()> {
        let reads = missing.iter().map(|&(b, lo)| crate::meta::fetch_leaf(&*self.md, b, Some(lo), limits));
        let got = match futures::future::try_join_all(reads).await {
            Ok(got) => got,
            Err(e) => {
                let mut st = self.state.write();
                if st.damaged.is_none() {
                    let why = format!("{e}: requests that need it fail; run `strata thin check` on the pool offline");
                    eprintln!("strata: {}: metadata: {why}", self.describe);
                    st.damaged = Some(why);
                }
                return Err(e);
            }
        };
        let nodes = missing.into_iter().map(|(b, _)| b).zip(got).collect();
        self.state.write().meta.load(nodes);
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        self.writable(&self.state.read())
    }

    pub(crate) fn writable(&self, st: &State) -> Result<()> {
        match &st.failed {
            Some(why) => Err(Error::new(ErrorKind::Io, format!("{}: the pool has failed: {why}", self.describe))),
            None => Ok(()),
        }
    }

    /// Stops the pool taking writes, for `why`.
    pub(crate) fn fail(&self, why: String) -> Error {
        let first = {
            let mut st = self.state.write();
            let first = st.failed.is_none();
            st.failed.get_or_insert(why.clone());
            first
        };
        if first {
            eprintln!("strata: {}: the pool has failed, every write fails from now on: {why}", self.describe);
        }
        Error::new(ErrorKind::Io, format!("{}: {why}", self.describe))
    }

    /// A data block for a new mapping, or NoSpace (after a commit has released what the
    /// current transaction freed).
    pub(crate) async fn alloc_data(&self) -> Result<u64> {
        for attempt in 0..2 {
            {
                let mut st = self.state.write();
                st.metadata_low = st.meta.check_metadata_room().is_err();
                if !st.metadata_low {
                    if let Some(b) = st.meta.alloc_data() {
                        st.out_of_data = false;
                        self.watch_low_water(&st);
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
        self.commit_unless(|| matches!(self.uncommitted(id, vblock), Ok(false))).await
    }

    /// `commit`, unless `done()` says so once the commit lock is held. Refused once the
    /// pool is closed: its last volume's shutdown made the last commit.
    async fn commit_unless(&self, done: impl Fn() -> bool) -> Result<()> {
        let _one = self.commit_lock.lock().await;
        if self.closed() {
            return Err(Error::new(ErrorKind::Busy, format!("{}: the pool is shut down", self.describe)));
        }
        // A failed commit forgets uncommitted mappings after failing the pool: check after.
        if done() {
            return self.check_writable();
        }
        self.commit_now().await
    }

    /// The commit itself, under the commit lock.
    async fn commit_now(&self) -> Result<()> {
        self.check_writable()?;
        let prepared: Result<Option<Commit>> = {
            let mut st = self.state.write();
            let c = st.meta.prepare_commit();
            st.committing = std::mem::take(&mut st.uncommitted);
            c
        };
        let commit = match prepared {
            Ok(Some(c)) => c,
            // Nothing to commit: the data device alone, still after any commit before. If
            // that flush fails, writes it covered may be gone: no later flush may say
            // otherwise.
            Ok(None) => return self.flush_data().await,
            Err(e) => return Err(self.abort(format!("commit failed: {}", e.context)).await),
        };
        self.flush_data().await?;
        if let Err(e) = commit.write(&*self.md).await {
            return Err(self.abort(format!("writing the metadata failed: {}", e.context)).await);
        }
        let mut st = self.state.write();
        st.meta.committed();
        st.committing.clear();
        self.counters.commits.fetch_add(1, Relaxed);
        self.last_commit_ms.store(now_ms(), Relaxed);
        Ok(())
    }

    /// Flushes the data device; if that fails, fails the pool and goes back to its last
    /// commit before any read through a mapping made since may look (`flush_gate`).
    async fn flush_data(&self) -> Result<()> {
        let _alone = self.flush_gate.write().await;
        match self.data.flush().await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.abort(format!("flushing the data device failed: {}", e.context)).await),
        }
    }

    /// Whether the metadata changed since the last commit was prepared.
    fn dirty(&self) -> bool {
        self.state.read().meta.dirty()
    }

    /// Fails the pool for `why` and, as dm-thin aborts the transaction, goes back to the
    /// metadata last committed: a failed flush may have lost the data of blocks mapped since,
    /// so reads must not follow those mappings (a block copied from a snapshot's would read
    /// as zeroes where the shared block still holds flushed data).
    async fn abort(&self, why: String) -> Error {
        let e = self.fail(why);
        self.state.write().aborting = true;
        let reopened = Metadata::open_lazy(&*self.md).await;
        let mut st = self.state.write();
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

    /// Whether the mapping of this block awaits a commit; an error once the pool has failed
    /// (`check_writable`).
    pub(crate) fn uncommitted(&self, id: DevId, vblock: u64) -> Result<bool> {
        let st = self.state.read();
        let uncommitted = st.awaits_commit(id, vblock);
        self.writable(&st)?;
        Ok(uncommitted)
    }

    pub fn status(&self) -> PoolStatus {
        let t = self.tunables();
        let st = self.state.read();
        let m = &st.meta;
        let (mode, reason) = if let Some(why) = &st.failed {
            ("failed", Some(why.clone()))
        } else if st.out_of_data {
            ("out_of_data_space", Some("the data device is full: writes needing a new block fail".to_string()))
        } else if st.metadata_low {
            ("metadata_low", Some("the metadata device is nearly full: writes needing a new block fail".to_string()))
        } else if let Some(why) = &st.damaged {
            ("metadata_unreadable", Some(why.clone()))
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
            volumes: m.volumes().count(),
            skip_block_zeroing: self.opts.skip_block_zeroing,
            commits: c.commits.load(Relaxed),
            provisioned_blocks: c.provisioned.load(Relaxed),
            copied_blocks: c.copied.load(Relaxed),
            unmapped_blocks: c.unmapped.load(Relaxed),
            no_space_errors: c.no_space.load(Relaxed),
            metadata_path: self.path.get().cloned().unwrap_or_default(),
            data_free_blocks: m.tm.data.free(),
            metadata_free_blocks: m.tm.md.free(),
            low_water_blocks: t.low_water_blocks,
            below_low_water: self.below_low_water.load(Relaxed),
            commit_period_ms: t.commit_period.as_millis() as u64,
            last_commit_unix_ms: self.last_commit_ms.load(Relaxed),
            deleting: m.deleting().iter().copied().collect(),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // The background tasks hold no reference: wake them to see the pool gone.
        self.kick.notify_one();
        self.delete_kick.notify_one();
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Commits the pool's changes every commit period (dm-thin's periodic commit), until the
/// pool is dropped. A failed commit has already failed the pool; this stops then.
async fn periodic_commit(pool: Weak<Pool>, kick: Arc<tokio::sync::Notify>) {
    loop {
        let Some(period) = pool.upgrade().map(|p| p.tunables().commit_period) else { return };
        let wait = if period.is_zero() { Duration::from_secs(3600) } else { period };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = kick.notified() => continue,
        }
        let Some(p) = pool.upgrade() else { return };
        if p.closed() {
            return;
        }
        if period.is_zero() || !p.dirty() || p.state.read().failed.is_some() {
            continue;
        }
        if let Err(e) = p.commit().await {
            eprintln!("strata: {}: periodic commit: {}", p.describe, e.context);
            return;
        }
    }
}

/// Frees the space of deleted devices, a step at a time (`Pool::delete_step`), every
/// `DELETE_STEPS_PER_COMMIT`th step and each deletion's last committed, a yield after each
/// so IO proceeds, until the pool is dropped. Steps stop while paused or once the pool has
/// failed.
async fn background_delete(pool: Weak<Pool>, kick: Arc<tokio::sync::Notify>) {
    let mut steps = 0;
    loop {
        let step = {
            let Some(p) = pool.upgrade() else { return };
            let idle = p.deletions_paused.load(Relaxed) || p.closed() || {
                let st = p.state.read();
                st.failed.is_some() || st.meta.deleting().is_empty()
            };
            if idle {
                None
            } else {
                steps += 1;
                Some(p.step(steps % DELETE_STEPS_PER_COMMIT == 0).await)
            }
        };
        match step {
            None | Some(Ok(None)) => {
                // Steps left uncommitted by a pause are committed now.
                if let Some(p) = pool.upgrade() {
                    if p.dirty() && p.state.read().failed.is_none() && !p.closed() {
                        let _ = p.commit().await;
                    }
                }
                steps = 0;
                kick.notified().await
            }
            Some(Ok(Some(_))) => tokio::task::yield_now().await,
            Some(Err(e)) => {
                match pool.upgrade() {
                    Some(p) if !p.closed() => eprintln!("strata: {}: background deletion: {}", p.describe, e.context),
                    _ => {}
                }
                kick.notified().await;
            }
        }
    }
}
