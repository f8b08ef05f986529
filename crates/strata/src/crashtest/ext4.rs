//! ext4 replayed to its flush points, behind `strata crashtest --mode ext4`.
//!
//! Recording: a volume whose devices record every write and flush (`strata_io::powercut`,
//! sharing one `Clock`) is served over NBD by the server `strata serve` runs (in this
//! process, so the recordings stay reachable), attached with `nbdfuse`, `losetup` and
//! `mount`, and a seeded ext4 workload runs on it: `mkfs.ext4`, files written and fsynced,
//! partial overwrites, renames and deletes made durable by an fsync of their directory, some
//! writes never synced, then `umount`. Three volumes: a plain RAM device, a writeback cache
//! and a write log, the last two with a cache device and an origin that both record.
//!
//! Replay: for each volume-level flush k from mkfs's last one on, a cut at a seeded moment after flush k completed
//! and before flush k+1 completed (or the end): every device keeps what the power-cut rules
//! allow at that moment (writes after the last completed flush kept, dropped or torn, as the
//! seed decides); a cache or write log is recovered from its two images and read back. On a copy of the
//! volume image, the journal is replayed (`e2fsck -E journal_only -y`, what mounting does),
//! then `e2fsck -fn` must report a clean file system, and every path whose last operation
//! was made durable (fsync returned) before the cut must hold what that operation left:
//! the file's content, or no file after a durable delete or rename away. A path with an
//! operation in flight or never synced at the cut is not checked. A file not intact is a
//! lost write; an unclean `e2fsck` or a failed check of the target is a check failure.

use super::{recover, CacheTarget, CrashTarget, WritecacheTarget};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_io::mem::MemDev;
use strata_io::powercut::{Clock, PowerCut};
use strata_io::BlockDev;

/// What a crash run of this kind needs on the machine.
pub const TOOLS: [&str; 8] = ["nbdfuse", "losetup", "mount", "umount", "mkfs.ext4", "e2fsck", "debugfs", "fusermount3"];

/// Why ext4 crash runs cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (losetup, mount)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing (no loop devices)".into());
    }
    TOOLS.iter().find(|t| find_tool(t).is_none()).map(|t| format!("{t} is not installed (see scripts/setup.sh)"))
}

fn find_tool(prog: &str) -> Option<PathBuf> {
    crate::which(prog).or_else(|| {
        ["/usr/local/sbin", "/usr/sbin", "/sbin"].iter().map(|d| Path::new(d).join(prog)).find(|p| p.is_file())
    })
}

fn tool(prog: &str) -> Command {
    Command::new(find_tool(prog).unwrap_or_else(|| PathBuf::from(prog)))
}

/// Runs a tool to completion; fails with its output unless it exits 0.
fn run(c: &mut Command) -> anyhow::Result<Output> {
    let out = c.stdin(Stdio::null()).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{:?} failed ({}): {}{}",
        c,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

/// The state of one path that a durable operation left: its content, or no file.
type PathState = Option<Vec<u8>>;

/// One operation of the workload on one path, with the clock around it.
#[derive(Debug, Clone)]
struct PathOp {
    /// Clock reading before the operation started: cuts before it never see it.
    started: u64,
    /// Clock reading after its fsync returned, for an operation made durable.
    durable_at: Option<u64>,
    state: PathState,
}

/// The volume the file system lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// A RAM device.
    Plain,
    /// A writeback cache of a quarter of the volume (blocks are evicted and written back).
    Cache,
    /// A write log of a quarter of the volume, default tunables (it fills, writes back and
    /// lets writes go around).
    Writecache,
}

impl Stack {
    pub const ALL: [Stack; 3] = [Stack::Plain, Stack::Cache, Stack::Writecache];

    pub fn name(self) -> &'static str {
        match self {
            Stack::Plain => "plain",
            Stack::Cache => "cache",
            Stack::Writecache => "writecache",
        }
    }
}

/// Which devices a recording was made on.
pub enum Devices {
    Plain(Arc<PowerCut<MemDev>>),
    Stacked { stack: Stack, cache: Arc<PowerCut<MemDev>>, origin: Arc<PowerCut<MemDev>> },
}

/// A recorded ext4 workload, ready to be cut anywhere.
pub struct Recording {
    /// The volume as the NBD server saw it (for the cache, recorded above the cache target
    /// only to learn when its flushes completed).
    volume: Arc<PowerCut<Arc<dyn BlockDev>>>,
    devices: Devices,
    /// Operations per path, in order.
    ops: BTreeMap<String, Vec<PathOp>>,
    /// Clock reading when mkfs.ext4 had returned.
    mkfs_done: u64,
    end: u64,
}

impl Recording {
    /// The moments at which volume flushes completed, from mkfs's last flush on: the flush
    /// points. (A cut while mkfs is still writing leaves no file system to check.)
    pub fn flush_ticks(&self) -> Vec<u64> {
        let all = self.volume.flush_ticks();
        let first = all.iter().rposition(|&t| t < self.mkfs_done).unwrap_or(0);
        all[first..].to_vec()
    }

    /// Paths checked at a cut at `tick`, with what each must hold.
    fn expected(&self, tick: u64) -> Vec<(&str, &PathState)> {
        self.ops
            .iter()
            .filter_map(|(path, ops)| {
                let last = ops.iter().rev().find(|o| o.started < tick)?;
                (last.durable_at? <= tick).then_some((path.as_str(), &last.state))
            })
            .collect()
    }

    /// The volume's content after a power cut at `tick`, as `seed` decides, with the number
    /// of failed cache checks and what they found.
    async fn image(&self, tick: u64, seed: u64) -> anyhow::Result<(Vec<u8>, u32, String)> {
        match &self.devices {
            Devices::Plain(dev) => {
                let img = dev.crash_at(dev.point_at_tick(tick)?, seed)?;
                let mut buf = vec![0; dev.size() as usize];
                img.read_into(0, &mut buf)?;
                Ok((buf, 0, String::new()))
            }
            Devices::Stacked { stack, cache, origin } => {
                let cache_img = cache.crash_at(cache.point_at_tick(tick)?, seed)?;
                let origin_img = origin.crash_at(origin.point_at_tick(tick)?, seed.wrapping_add(1))?;
                let (buf, failures, detail) = match stack {
                    Stack::Writecache => recover(&WritecacheTarget, cache_img, origin_img).await?,
                    _ => recover(&CacheTarget, cache_img, origin_img).await?,
                };
                Ok((buf.to_vec(), failures, detail))
            }
        }
    }
}

/// Undoes the mount, loop device and FUSE mount set up for a recording, in that order.
struct Attached {
    fuse_dir: PathBuf,
    nbdfuse: Option<Child>,
    loopdev: Option<String>,
    mounted: Option<PathBuf>,
}

impl Attached {
    fn release(&mut self) -> anyhow::Result<()> {
        if let Some(m) = self.mounted.take() {
            run(tool("umount").arg(&m))?;
        }
        if let Some(l) = self.loopdev.take() {
            run(tool("losetup").args(["-d", &l]))?;
        }
        if let Some(mut c) = self.nbdfuse.take() {
            let r = run(tool("fusermount3").arg("-u").arg(&self.fuse_dir));
            if r.is_err() {
                let _ = tool("fusermount3").arg("-uz").arg(&self.fuse_dir).output();
                let _ = c.kill();
            }
            c.wait()?;
            r?;
        }
        Ok(())
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if self.mounted.is_some() {
            let _ = tool("umount").arg("-l").args(self.mounted.take()).output();
        }
        if let Err(e) = self.release() {
            eprintln!("ext4 crash run cleanup: {e}");
        }
    }
}

/// Files of the workload live in a few directories so renames and deletes need an fsync of
/// the directory to be durable.
const DIRS: [&str; 3] = ["d0", "d1", "d2"];

fn content(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let len = match rng.gen_range(0..10) {
        0..=3 => rng.gen_range(1..8192),
        4..=7 => rng.gen_range(8192..256 << 10),
        _ => rng.gen_range(256 << 10..2 << 20),
    };
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The seeded file workload on a mounted ext4; records each path's operations.
fn file_workload(mnt: &Path, clock: &Clock, ops_n: usize, seed: u64) -> anyhow::Result<BTreeMap<String, Vec<PathOp>>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xe474);
    let mut ops: BTreeMap<String, Vec<PathOp>> = BTreeMap::new();
    // Files that exist now: their content, and whether all of it was synced.
    let mut live: BTreeMap<String, (Vec<u8>, bool)> = BTreeMap::new();
    let mut next = 0;
    for d in DIRS {
        std::fs::create_dir(mnt.join(d))?;
        fsync_dir(&mnt.join(d))?;
    }
    fsync_dir(mnt)?;
    let mut record = |path: &str, started: u64, durable: bool, state: PathState| {
        let durable_at = durable.then(|| clock.now());
        ops.entry(path.to_string()).or_default().push(PathOp { started, durable_at, state });
    };
    let parent = |path: &str| mnt.join(path).parent().expect("in a directory").to_path_buf();
    for _ in 0..ops_n {
        let started = clock.now();
        let kind = if live.is_empty() { 0 } else { rng.gen_range(0..100) };
        let pick = |rng: &mut ChaCha8Rng| {
            let i = rng.gen_range(0..live.len());
            live.keys().nth(i).cloned().expect("in range")
        };
        match kind {
            // A new file, written, fsynced and its directory fsynced (or never synced).
            0..=49 | 95..=99 => {
                let path = format!("{}/f{next}", DIRS[rng.gen_range(0..DIRS.len())]);
                next += 1;
                let data = content(&mut rng);
                let synced = kind < 50;
                let mut f = std::fs::File::create(mnt.join(&path))?;
                f.write_all(&data)?;
                if synced {
                    f.sync_all()?;
                    fsync_dir(&parent(&path))?;
                }
                record(&path, started, synced, Some(data.clone()));
                live.insert(path, (data, synced));
            }
            // Part of a file overwritten in place, then the file fsynced (all of it).
            50..=64 => {
                let path = pick(&mut rng);
                let (data, synced) = live.get_mut(&path).expect("live");
                let at = rng.gen_range(0..data.len());
                let n = rng.gen_range(1..=(data.len() - at).min(64 << 10));
                rng.fill(&mut data[at..at + n]);
                let f = std::fs::OpenOptions::new().write(true).open(mnt.join(&path))?;
                std::os::unix::fs::FileExt::write_all_at(&f, &data[at..at + n], at as u64)?;
                f.sync_all()?;
                *synced = true;
                record(&path, started, true, Some(data.clone()));
            }
            // Renamed within its directory, the directory fsynced: the name change is
            // durable; the content only if it was synced before.
            65..=77 => {
                let from = pick(&mut rng);
                let to = format!("{}/f{next}", from.split('/').next().expect("a directory"));
                next += 1;
                std::fs::rename(mnt.join(&from), mnt.join(&to))?;
                fsync_dir(&parent(&to))?;
                let (data, synced) = live.remove(&from).expect("live");
                record(&from, started, true, None);
                record(&to, started, synced, Some(data.clone()));
                live.insert(to, (data, synced));
            }
            // Deleted, the directory fsynced.
            78..=89 => {
                let path = pick(&mut rng);
                std::fs::remove_file(mnt.join(&path))?;
                fsync_dir(&parent(&path))?;
                live.remove(&path);
                record(&path, started, true, None);
            }
            // Appended to, never synced.
            _ => {
                let path = pick(&mut rng);
                let extra = content(&mut rng);
                let mut f = std::fs::OpenOptions::new().append(true).open(mnt.join(&path))?;
                f.write_all(&extra)?;
                let (data, synced) = live.get_mut(&path).expect("live");
                data.extend_from_slice(&extra);
                *synced = false;
                record(&path, started, false, Some(data.clone()));
            }
        }
    }
    Ok(ops)
}

/// How a recording is made.
pub struct Ext4Setup {
    /// Scratch directory (mount points, images of failed points).
    pub dir: PathBuf,
    pub volume_bytes: u64,
    /// Operations of the file workload.
    pub ops: usize,
    pub seed: u64,
    /// The volume: plain, or a target whose cache device and origin both record.
    pub stack: Stack,
}

/// Records the ext4 workload (see the module docs).
pub async fn record(s: &Ext4Setup) -> anyhow::Result<Recording> {
    let _ = std::fs::remove_dir_all(&s.dir);
    std::fs::create_dir_all(&s.dir)?;
    let clock = Clock::default();
    let (dev, devices): (Arc<dyn BlockDev>, Devices) = if s.stack == Stack::Plain {
        let plain = Arc::new(PowerCut::with_clock(MemDev::new(s.volume_bytes), clock.clone()));
        plain.set_history_limit(4 * s.volume_bytes);
        (plain.clone(), Devices::Plain(plain))
    } else {
        let origin = Arc::new(PowerCut::with_clock(MemDev::new(s.volume_bytes), clock.clone()));
        let cache = Arc::new(PowerCut::with_clock(MemDev::new(s.volume_bytes / 4), clock.clone()));
        for d in [&origin, &cache] {
            d.set_history_limit(4 * s.volume_bytes);
        }
        let dev: Arc<dyn BlockDev> = match s.stack {
            Stack::Writecache => {
                Arc::new(WritecacheTarget.create(cache.clone(), origin.clone(), "default", s.seed).await?)
            }
            _ => Arc::new(super::writeback_cache(cache.clone(), origin.clone(), s.seed).await?),
        };
        (dev, Devices::Stacked { stack: s.stack, cache, origin })
    };
    let volume = Arc::new(PowerCut::with_clock(dev, clock.clone()));
    volume.set_history_limit(4 * s.volume_bytes);

    let sock = s.dir.join("s.sock");
    let export = strata_nbd::Export {
        name: "vol".into(),
        description: volume.describe(),
        dev: volume.clone() as Arc<dyn BlockDev>,
        read_only: false,
    };
    let server = strata_nbd::Server::new(vec![export], strata_nbd::Limits::default()).map_err(anyhow::Error::msg)?;
    let listener = tokio::net::UnixListener::bind(&sock)?;
    let serving = {
        let server = server.clone();
        tokio::spawn(async move { server.serve_unix(listener).await })
    };

    let (dir, ops_n, seed, uri) = (s.dir.clone(), s.ops, s.seed, format!("nbd+unix:///vol?socket={}", sock.display()));
    let c = clock.clone();
    let ops = tokio::task::spawn_blocking(move || attach_and_run(&dir, &uri, &c, ops_n, seed)).await?;
    server.shutdown();
    let _ = serving.await;
    server.wait_idle().await;
    let (ops, mkfs_done) = ops?;
    Ok(Recording { volume, devices, ops, mkfs_done, end: clock.now() })
}

/// nbdfuse, losetup, mkfs.ext4, mount, the workload, umount; everything undone on the way out.
/// Returns the operations per path and the clock reading once mkfs had returned.
fn attach_and_run(
    dir: &Path,
    uri: &str,
    clock: &Clock,
    ops_n: usize,
    seed: u64,
) -> anyhow::Result<(BTreeMap<String, Vec<PathOp>>, u64)> {
    let (fuse_dir, mnt) = (dir.join("fuse"), dir.join("mnt"));
    std::fs::create_dir_all(&fuse_dir)?;
    std::fs::create_dir_all(&mnt)?;
    let log = std::fs::File::create(dir.join("nbdfuse.log"))?;
    let child =
        tool("nbdfuse").arg(&fuse_dir).arg(uri).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn()?;
    let mut a = Attached { fuse_dir: fuse_dir.clone(), nbdfuse: Some(child), loopdev: None, mounted: None };
    let file = fuse_dir.join("nbd");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        if let Some(st) = a.nbdfuse.as_mut().expect("started").try_wait()? {
            a.nbdfuse = None;
            anyhow::bail!(
                "nbdfuse exited ({st}): {}",
                std::fs::read_to_string(dir.join("nbdfuse.log")).unwrap_or_default()
            );
        }
        anyhow::ensure!(Instant::now() < deadline, "nbdfuse did not create {} within 30 s", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = run(tool("losetup").args(["--find", "--show", "--direct-io=off"]).arg(&file))?;
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    a.loopdev = Some(dev.clone());
    run(tool("mkfs.ext4").args(["-q", "-F", &dev]))?;
    let mkfs_done = clock.now();
    run(tool("mount").args(["-t", "ext4", &dev]).arg(&mnt))?;
    a.mounted = Some(mnt.clone());
    let ops = file_workload(&mnt, clock, ops_n, seed)?;
    a.release()?;
    Ok((ops, mkfs_done))
}

/// The outcome of one cut.
#[derive(Debug, Default)]
pub struct Ext4Point {
    /// Paths checked, and those not holding what a durable operation left there.
    pub paths: u64,
    pub lost: u64,
    /// e2fsck not clean, or a cache check failing.
    pub check_failures: u64,
    pub detail: String,
}

/// Cut times, one per flush point: a seeded moment after flush k completed and before flush
/// k+1 did (or the end of the recording). With `points` below their number, a seeded sample.
pub fn cut_ticks(rec: &Recording, points: usize, seed: u64) -> Vec<u64> {
    let flushes = rec.flush_ticks();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc07);
    let mut ticks: Vec<u64> = flushes
        .iter()
        .enumerate()
        .map(|(k, &f)| {
            let until = flushes.get(k + 1).copied().unwrap_or(rec.end).max(f + 1);
            rng.gen_range(f + 1..=until)
        })
        .collect();
    if points > 0 && points < ticks.len() {
        let mut keep = rand::seq::index::sample(&mut rng, ticks.len(), points).into_vec();
        keep.sort_unstable();
        ticks = keep.into_iter().map(|i| ticks[i]).collect();
    }
    ticks
}

/// Cuts the recording at `tick` (fates seeded by `seed`) and checks the result. Points that
/// fail keep their image in `dir`.
pub async fn check_cut(rec: &Recording, tick: u64, seed: u64, dir: &Path) -> anyhow::Result<Ext4Point> {
    let mut p = Ext4Point::default();
    let (image, cache_failures, detail) = rec.image(tick, seed).await?;
    p.check_failures += cache_failures as u64;
    p.detail.push_str(&detail);
    let work = dir.join(format!("cut-{tick}-{seed}"));
    std::fs::create_dir_all(&work)?;
    let img = work.join("volume.img");
    std::fs::write(&img, &image)?;
    drop(image);
    // Replaying the journal is what mounting would do first; it may exit 1 (fixed).
    let replay = tool("e2fsck").args(["-E", "journal_only", "-y"]).arg(&img).stdin(Stdio::null()).output()?;
    let fsck = tool("e2fsck").arg("-fn").arg(&img).stdin(Stdio::null()).output()?;
    if replay.status.code().unwrap_or(8) > 1 || !fsck.status.success() {
        p.check_failures += 1;
        p.detail.push_str(&format!(
            "journal replay: {}\n{}e2fsck -fn: {}\n{}{}",
            replay.status,
            String::from_utf8_lossy(&replay.stdout),
            fsck.status,
            String::from_utf8_lossy(&fsck.stdout),
            String::from_utf8_lossy(&fsck.stderr)
        ));
    }
    let expected = rec.expected(tick);
    let cmds: String =
        expected.iter().enumerate().map(|(i, (path, _))| format!("dump /{path} {}/{i}\n", work.display())).collect();
    std::fs::write(work.join("cmds"), cmds)?;
    run(tool("debugfs").arg("-f").arg(work.join("cmds")).arg(&img))?;
    for (i, (path, want)) in expected.iter().enumerate() {
        p.paths += 1;
        let got = std::fs::read(work.join(i.to_string())).ok();
        if got.as_ref() != want.as_ref() {
            p.lost += 1;
            let show = |s: &Option<Vec<u8>>| s.as_ref().map_or("no file".to_string(), |d| format!("{} bytes", d.len()));
            p.detail.push_str(&format!("/{path}: expected {}, found {}\n", show(want), show(&got)));
        }
    }
    if p.lost == 0 && p.check_failures == 0 {
        std::fs::remove_dir_all(&work)?;
    } else {
        p.detail.push_str(&format!("kept {} for inspection\n", work.display()));
    }
    Ok(p)
}

/// What a replay found, over all its cuts.
#[derive(Debug, Default)]
pub struct Ext4Summary {
    /// Flush points in the recording, and cuts checked.
    pub flush_points: usize,
    pub points: u64,
    pub paths: u64,
    pub lost: u64,
    pub check_failures: u64,
    /// What each failing cut found.
    pub failures: Vec<String>,
}

/// Records the workload, then cuts it at `points` of its flush points (every one for 0) and
/// checks each cut, printing a line per cut to stderr.
pub async fn replay(s: &Ext4Setup, points: usize) -> anyhow::Result<Ext4Summary> {
    let rec = record(s).await?;
    let ticks = cut_ticks(&rec, points, s.seed);
    let mut sum = Ext4Summary { flush_points: rec.flush_ticks().len(), ..Ext4Summary::default() };
    let kind = s.stack.name();
    for (i, &tick) in ticks.iter().enumerate() {
        let seed = s.seed.wrapping_mul(1000).wrapping_add(i as u64);
        let p = check_cut(&rec, tick, seed, &s.dir).await?;
        sum.points += 1;
        sum.paths += p.paths;
        sum.lost += p.lost;
        sum.check_failures += p.check_failures;
        if p.lost + p.check_failures > 0 {
            eprintln!(
                "{kind} volume, cut at tick {tick} (seed {seed}): {} lost, {} check failures\n{}",
                p.lost, p.check_failures, p.detail
            );
            sum.failures.push(p.detail);
        } else {
            eprintln!("{kind} volume, cut at tick {tick} (seed {seed}): ok, e2fsck clean, {} paths intact", p.paths);
        }
    }
    Ok(sum)
}
