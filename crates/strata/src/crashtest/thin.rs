//! The thin target in the crash runs: a pool (metadata on the "cache" device, data blocks on
//! the "origin") with one thin volume, snapshotted at flush boundaries while its clients run.
//! Every point checks the metadata with strata's checker and with thin-provisioning-tools'
//! `thin_check`, after the cut and after the recovered pool is closed.

use super::CrashTarget;
use std::path::Path;
use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_io::BlockDev;
use strata_thin::meta::Metadata;
use strata_thin::{Pool, PoolOptions, ThinDev};

/// The pool's data block size in the crash runs (dm-thin's smallest).
pub const THIN_BLOCK: u64 = 64 << 10;
/// The data device holds this many volumes' worth of blocks (snapshots keep old ones).
const DATA_PER_VOLUME: u64 = 3;
/// Nodes a background deletion step drops: one, the smallest step. The volumes here (8 MiB)
/// are a single leaf, so a deletion is its mark and one step, and cuts land between the two;
/// deletions of many steps are tested in strata-thin's `tests/delete.rs`.
const DELETE_STEP_NODES: usize = 1;
/// The volume the clients write.
const VOLUME: u32 = 1;

/// The thin target (`strata_thin::ThinDev`) as a `CrashTarget`; its modes: `zeroing` (new
/// blocks zeroed around a partial first write) and `skip-zeroing` (dm-thin's
/// `skip_block_zeroing`: the rest of a new block shows what the data device held, so
/// sectors never written there may read as anything).
pub struct ThinTarget;

impl ThinTarget {
    /// Its modes: new blocks zeroed or not (dm-thin's `skip_block_zeroing`).
    pub const MODES: [&str; 2] = ["zeroing", "skip-zeroing"];

    /// The target, once `thin_check` is known to run (every point needs it).
    pub fn new() -> anyhow::Result<ThinTarget> {
        match std::process::Command::new("thin_check").arg("-V").output() {
            Ok(_) => Ok(ThinTarget),
            Err(e) => anyhow::bail!("thin_check does not run ({e}): install thin-provisioning-tools"),
        }
    }
}

/// `thin_check PATH`: `None` when it passes, what it printed when it does not.
pub fn thin_check_file(path: &Path) -> anyhow::Result<Option<String>> {
    let out = std::process::Command::new("thin_check").arg(path).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((!out.status.success()).then_some(text))
}

/// Both checkers on a metadata device in memory; returns what they found wrong.
async fn check_both(md: &MemDev, when: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let report = strata_thin::check::check(md).await;
    if !report.clean() {
        problems.push(format!("strata's checker {when}: {}", report.errors.join("; ")));
    }
    let mut bytes = vec![0u8; md.size() as usize];
    if let Err(e) = md.read_into(0, &mut bytes) {
        problems.push(format!("reading the metadata {when}: {e}"));
        return problems;
    }
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("strata-crashtest-{}-{n}.meta", std::process::id()));
    let checked = std::fs::write(&path, &bytes).map_err(anyhow::Error::from).and_then(|()| thin_check_file(&path));
    let _ = std::fs::remove_file(&path);
    match checked {
        Ok(None) => {}
        Ok(Some(text)) => problems.push(format!("thin_check {when}: {}", text.trim())),
        Err(e) => problems.push(format!("thin_check {when} did not run: {e}")),
    }
    problems
}

fn io(e: strata_io::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

impl CrashTarget for ThinTarget {
    type Vol = ThinDev;

    fn modes(&self) -> Vec<String> {
        ThinTarget::MODES.map(String::from).to_vec()
    }

    async fn create(
        &self,
        md: Arc<dyn BlockDev>,
        data: Arc<dyn BlockDev>,
        mode: &str,
        _seed: u64,
    ) -> anyhow::Result<ThinDev> {
        let skip_block_zeroing = match mode {
            "zeroing" => false,
            "skip-zeroing" => true,
            other => anyhow::bail!("thin: no crashtest mode {other:?} (zeroing, skip-zeroing)"),
        };
        let size = data.size() / DATA_PER_VOLUME;
        let mut m = Metadata::format(&*md, data.size(), THIN_BLOCK, "mem:crash", false).await?;
        m.create_volume(VOLUME, size)?;
        m.commit(&*md).await?;
        let pool =
            Pool::open(md, data, "mem:crash", PoolOptions { skip_block_zeroing, ..PoolOptions::default() }).await?;
        pool.set_delete_step_nodes(DELETE_STEP_NODES);
        Ok(ThinDev::new(pool, VOLUME, None)?)
    }

    fn scripts(&self, _mode: &str) -> Vec<Vec<String>> {
        let s = |v: &[&str]| v.iter().map(|m| m.to_string()).collect::<Vec<_>>();
        vec![
            vec![],
            s(&["snapshot"]),
            s(&["snapshot", "snapshot"]),
            s(&["snapshot", "snapshot", "snapshot"]),
            s(&["snapshot", "delete snapshot", "snapshot"]),
            s(&["snapshot", "snapshot", "delete snapshot"]),
        ]
    }

    fn block_bytes(&self) -> u64 {
        THIN_BLOCK
    }

    fn origin_bytes(&self, volume_bytes: u64) -> u64 {
        volume_bytes * DATA_PER_VOLUME
    }

    fn stale_reads(&self, mode: &str) -> bool {
        mode == "skip-zeroing"
    }

    fn stopped(&self, vol: &ThinDev) -> bool {
        vol.thin_status().pool.mode == "failed"
    }

    /// A failed pool goes back to its last commit and serves it, as dm-thin's does.
    fn serves_last_commit_when_stopped(&self) -> bool {
        true
    }

    async fn reopen(&self, md: Arc<MemDev>, data: Arc<MemDev>) -> anyhow::Result<(ThinDev, Vec<String>)> {
        let problems = check_both(&md, "after the cut").await;
        let pool = Pool::open(md, data, "mem:crash", PoolOptions::default()).await?;
        pool.set_delete_step_nodes(DELETE_STEP_NODES);
        Ok((ThinDev::new(pool, VOLUME, None)?, problems))
    }

    async fn check(&self, vol: &ThinDev) -> Vec<String> {
        let report = vol.pool().with_meta(|m| strata_thin::check::check_counts(m));
        report.errors.into_iter().map(|e| format!("the open pool's counts: {e}")).collect()
    }

    /// Deletes every snapshot (freeing the blocks only they held), so the volume's second
    /// read shows whether that touched its blocks.
    async fn settle(&self, vol: &ThinDev) -> (Vec<String>, Vec<String>) {
        let ids: Vec<u32> =
            vol.pool().with_meta(|m| m.volumes().map(|(id, _)| id).filter(|&id| id != VOLUME).collect());
        let mut problems = Vec::new();
        for &id in &ids {
            if let Err(e) = self.delete_snapshot(vol, id).await {
                problems.push(format!("deleting snapshot {id} after recovery: {e}"));
            }
        }
        // Deletions resumed from before the cut, and these, run to their end.
        if let Err(e) = vol.pool().wait_deletions().await {
            problems.push(format!("freeing deleted snapshots' space after recovery: {e}"));
        }
        (problems, vec![format!("deleted snapshots {ids:?}")])
    }

    async fn close(&self, vol: ThinDev, md: Arc<MemDev>) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = vol.pool().commit().await {
            problems.push(format!("commit after recovery: {e}"));
        }
        drop(vol);
        problems.extend(check_both(&md, "after recovery").await);
        problems
    }

    async fn snapshot(&self, vol: &ThinDev, id: u32) -> anyhow::Result<()> {
        let size = vol.size();
        vol.pool()
            .with_meta(|m| m.create_snapshot(id, VOLUME).and_then(|()| m.set_volume_size(id, size)))
            .map_err(io)?;
        vol.pool().commit().await.map_err(io)
    }

    async fn delete_snapshot(&self, vol: &ThinDev, id: u32) -> anyhow::Result<()> {
        // Marked and committed at once; the space is freed by background steps (one leaf
        // each here), so cuts land between them.
        vol.pool().delete_volume(id).await.map_err(io)
    }

    fn open_snapshot(&self, vol: &ThinDev, id: u32) -> anyhow::Result<Arc<dyn BlockDev>> {
        Ok(Arc::new(ThinDev::new(vol.pool().clone(), id, None)?))
    }
}

/// Runs `strata thin ARGS` (an offline pool command).
pub fn offline(strata: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new(strata).arg("thin").args(args).output()?;
    anyhow::ensure!(out.status.success(), "strata thin {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// Makes the kill runs' pool: metadata in `meta`, data blocks of 64 KiB in `data` (three
/// volumes' worth), and volume 1 of `volume_bytes`.
pub fn create_pool(
    strata: &Path,
    (meta, meta_bytes): (&Path, u64),
    (data, volume_bytes): (&Path, u64),
) -> anyhow::Result<()> {
    let (meta_spec, m) = (format!("{}?size={meta_bytes}", meta.display()), meta.display().to_string());
    let data_spec = format!("{}?size={}", data.display(), volume_bytes * DATA_PER_VOLUME);
    let block = THIN_BLOCK.to_string();
    offline(strata, &["pool", "create", "--metadata", &meta_spec, "--data", &data_spec, "--block-size", &block])?;
    offline(strata, &["create", &m, "1", "--size", &volume_bytes.to_string()])
}

/// The kill runs' exports of the pool on `meta`: `vol` (volume 1) and `snapN` for each
/// snapshot.
pub fn exports(meta: &Path, skip_zeroing: bool, snapshots: impl Iterator<Item = u32>) -> Vec<String> {
    let opts = if skip_zeroing { "&skip_block_zeroing=1" } else { "" };
    let spec = |id: u32| format!("thin:{}?id={id}{opts}", meta.display());
    let mut out = vec![format!("vol={}", spec(VOLUME))];
    out.extend(snapshots.map(|id| format!("snap{id}={}", spec(id))));
    out
}

/// The steps after which a kill run snapshots the volume: up to two of its flushes, each
/// with whether the snapshot before it is then deleted.
pub fn snapshot_steps(steps: &[super::Step], rng: &mut impl rand::Rng) -> Vec<(usize, bool)> {
    let flushes: Vec<usize> =
        (steps.iter().enumerate()).filter(|(_, s)| **s == super::Step::Flush).map(|(i, _)| i).collect();
    let mut at: Vec<usize> = (0..rng.gen_range(0..=2usize))
        .filter(|_| !flushes.is_empty())
        .map(|_| flushes[rng.gen_range(0..flushes.len())])
        .collect();
    at.sort_unstable();
    at.dedup();
    at.into_iter().map(|i| (i, rng.gen_bool(0.5))).collect()
}
