//! Crash consistency checking: random workloads whose every sector says which write made it,
//! an oracle of what may be on the device after a crash, and the runner behind
//! `strata crashtest`. After a crash each 512-byte sector must hold its last durable value
//! (made durable by a completed FLUSH or FUA write) or something written to it later; any
//! other content is a lost write if it is an older value, and a check failure if it is
//! something never written there at all.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;
use std::path::Path;

pub mod ext4;
pub mod faults;
pub mod soak;

pub const SECTOR: u64 = 512;

/// What a sector may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Val {
    Zero,
    Id(u64),
    /// After a trim: zeroes or anything ever written there.
    Trimmed,
}

#[derive(Clone, Default)]
struct SectorState {
    /// Values allowed by the last durability point.
    durable: Vec<Val>,
    /// Values written since (acknowledged or in flight).
    since: Vec<Val>,
    /// Every id ever written to this sector.
    ever: BTreeSet<u64>,
}

/// One step of the workload.
#[derive(Clone, Debug)]
pub enum Step {
    Write { id: u64, offset: u64, len: u64, fua: bool },
    Flush,
    Trim { offset: u64, len: u64 },
    Zero { offset: u64, len: u64 },
}

/// Bytes of write `id` for the sectors starting at `first`: each sector carries the id and
/// its own number, then a pattern derived from both.
pub fn payload(id: u64, first: u64, sectors: u64) -> Vec<u8> {
    let mut out = vec![0u8; (sectors * SECTOR) as usize];
    for (i, s) in out.chunks_mut(SECTOR as usize).enumerate() {
        let sector = first + i as u64;
        s[..8].copy_from_slice(&id.to_le_bytes());
        s[8..16].copy_from_slice(&sector.to_le_bytes());
        let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ sector.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) | 1;
        for w in s[16..].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
        }
    }
    out
}

/// Reads what a sector holds: zeroes, a write's id, or `None` for anything else.
pub fn decode(sector: u64, data: &[u8]) -> Option<Val> {
    if data.iter().all(|&b| b == 0) {
        return Some(Val::Zero);
    }
    let id = u64::from_le_bytes(data[..8].try_into().unwrap());
    (id != 0 && payload(id, sector, 1) == data).then_some(Val::Id(id))
}

pub struct Oracle {
    sectors: Vec<SectorState>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub sectors: u64,
    /// Sectors holding an older value than their last durable one.
    pub lost: u64,
    /// Sectors holding something never written there.
    pub garbage: u64,
}

impl Oracle {
    /// A device of `size` bytes that starts all zero.
    pub fn new(size: u64) -> Oracle {
        let init = SectorState { durable: vec![Val::Zero], ..Default::default() };
        Oracle { sectors: vec![init; (size / SECTOR) as usize] }
    }

    fn range(offset: u64, len: u64) -> std::ops::Range<usize> {
        (offset / SECTOR) as usize..((offset + len) / SECTOR) as usize
    }

    /// Records a step as issued. Steps are issued one at a time; `durable` says whether it
    /// also completed with durability (a FUA write or trim/zero followed by nothing).
    pub fn issue(&mut self, step: &Step) {
        match *step {
            Step::Write { id, offset, len, .. } => {
                for s in &mut self.sectors[Self::range(offset, len)] {
                    s.since.push(Val::Id(id));
                    s.ever.insert(id);
                }
            }
            Step::Trim { offset, len } => {
                for s in &mut self.sectors[Self::range(offset, len)] {
                    s.since.push(Val::Trimmed);
                }
            }
            Step::Zero { offset, len } => {
                for s in &mut self.sectors[Self::range(offset, len)] {
                    s.since.push(Val::Zero);
                }
            }
            Step::Flush => {}
        }
    }

    /// Records that a step completed. A flush makes every earlier step durable; a FUA write
    /// makes itself durable.
    pub fn complete(&mut self, step: &Step) {
        match *step {
            Step::Flush => {
                for s in &mut self.sectors {
                    if let Some(last) = s.since.last().copied() {
                        s.durable = vec![last];
                        s.since.clear();
                    }
                }
            }
            Step::Write { id, offset, len, fua: true } => {
                for s in &mut self.sectors[Self::range(offset, len)] {
                    s.durable = vec![Val::Id(id)];
                    s.since.clear();
                }
            }
            _ => {}
        }
    }

    /// Records that a step failed: it may have landed or not, sector by sector, so from now
    /// on each sector it touched may hold anything it was allowed to hold before or what the
    /// step wrote, whatever later flushes say, until a later write replaces it.
    pub fn fail(&mut self, step: &Step) {
        let (offset, len) = match *step {
            Step::Write { offset, len, .. } | Step::Trim { offset, len } | Step::Zero { offset, len } => (offset, len),
            Step::Flush => return,
        };
        for s in &mut self.sectors[Self::range(offset, len)] {
            let since = std::mem::take(&mut s.since);
            s.durable.extend(since);
        }
    }

    /// Checks a device image (or the part of it starting at sector 0) against the oracle.
    pub fn verify(&self, image: &[u8]) -> Verdict {
        let mut v = Verdict::default();
        for (i, s) in self.sectors.iter().enumerate() {
            let data = &image[i * SECTOR as usize..(i + 1) * SECTOR as usize];
            v.sectors += 1;
            let allowed = |val: Val| {
                s.durable.iter().chain(&s.since).any(|a| match (a, val) {
                    (Val::Trimmed, Val::Zero) => true,
                    (Val::Trimmed, Val::Id(id)) => s.ever.contains(&id),
                    (a, b) => *a == b,
                })
            };
            match decode(i as u64, data) {
                Some(val) if allowed(val) => {}
                Some(Val::Id(id)) if s.ever.contains(&id) => v.lost += 1,
                Some(Val::Zero) => v.lost += 1, // the durable write vanished
                _ => v.garbage += 1,
            }
        }
        v
    }
}

impl Oracle {
    /// An oracle whose durable content is what `image` holds: a run that goes on after a
    /// verified crash starts from there. Sectors holding neither zeroes nor a write (already
    /// counted as failures) are taken as zeroes.
    pub fn from_image(image: &[u8]) -> Oracle {
        let sectors = image
            .chunks(SECTOR as usize)
            .enumerate()
            .map(|(i, data)| {
                let val = decode(i as u64, data).unwrap_or(Val::Zero);
                let ever = match val {
                    Val::Id(id) => BTreeSet::from([id]),
                    _ => BTreeSet::new(),
                };
                SectorState { durable: vec![val], since: Vec::new(), ever }
            })
            .collect();
        Oracle { sectors }
    }
}

/// A random mixed workload over the first `span` bytes of a device: writes of many sizes
/// (some FUA), flushes, trims and write-zeroes, all sector aligned.
pub fn workload(seed: u64, steps: usize, span: u64) -> Vec<Step> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let sectors = span / SECTOR;
    let mut next_id = seed.wrapping_mul(1_000_000) + 1;
    (0..steps)
        .map(|_| {
            let len_sectors = match rng.gen_range(0..10) {
                0..=4 => rng.gen_range(1..=8),
                5..=7 => rng.gen_range(8..=128),
                _ => rng.gen_range(128..=512),
            }
            .min(sectors);
            let first = rng.gen_range(0..=sectors - len_sectors);
            let (offset, len) = (first * SECTOR, len_sectors * SECTOR);
            match rng.gen_range(0..100) {
                0..=69 => {
                    next_id += 1;
                    Step::Write { id: next_id, offset, len, fua: rng.gen_bool(0.1) }
                }
                70..=84 => Step::Flush,
                85..=92 => Step::Trim { offset, len },
                _ => Step::Zero { offset, len },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oracle_accepts_durable_and_later_values_only() {
        let mut o = Oracle::new(4 * SECTOR);
        let w1 = Step::Write { id: 1, offset: 0, len: 2 * SECTOR, fua: false };
        let w2 = Step::Write { id: 2, offset: 0, len: SECTOR, fua: false };
        o.issue(&w1);
        o.complete(&w1);
        o.issue(&Step::Flush);
        o.complete(&Step::Flush);
        o.issue(&w2);
        o.complete(&w2);
        let mut img = vec![0u8; 4 * 512];
        img[..1024].copy_from_slice(&payload(1, 0, 2));
        assert_eq!(o.verify(&img), Verdict { sectors: 4, lost: 0, garbage: 0 });
        img[..512].copy_from_slice(&payload(2, 0, 1));
        assert_eq!(o.verify(&img).lost, 0, "a later unflushed write may survive");
        img[512..1024].fill(0);
        assert_eq!(o.verify(&img).lost, 1, "sector 1 lost its flushed write");
        img[1024..1536].copy_from_slice(&payload(1, 2, 1));
        assert_eq!(o.verify(&img).garbage, 1, "write 1 never reached sector 2");
        img[1024..1536].fill(0);
        img[1536 + 100] = 1;
        assert_eq!(o.verify(&img).garbage, 1, "bytes no write produced");
    }
}

/// How a kill -9 crash point is set up.
pub struct KillSetup {
    /// The strata binary to run as the server.
    pub strata: std::path::PathBuf,
    /// Scratch directory (one subdirectory per point).
    pub dir: std::path::PathBuf,
    pub origin_bytes: u64,
    pub cache_bytes: u64,
    pub steps: usize,
}

/// The outcome of one crash point.
#[derive(Debug, Clone)]
pub struct PointOutcome {
    pub seed: u64,
    pub verdict: Verdict,
    /// `strata cache check` failed (after the crash, or after the recovered run).
    pub check_failures: u32,
    pub detail: String,
}

struct ServerProc {
    child: std::process::Child,
}

impl ServerProc {
    fn start(strata: &Path, sock: &Path, cache: &Path, log: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_file(sock);
        let child = std::process::Command::new(strata)
            .args(["serve", "--unix"])
            .arg(sock)
            .arg(format!("vol=cache:{}", cache.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(log)?)
            .spawn()?;
        let mut me = ServerProc { child };
        for _ in 0..400 {
            if std::os::unix::net::UnixStream::connect(sock).is_ok() {
                return Ok(me);
            }
            if let Some(st) = me.child.try_wait()? {
                anyhow::bail!("server exited ({st}): {}", std::fs::read_to_string(log).unwrap_or_default());
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        me.kill();
        anyhow::bail!("server never listened on {}", sock.display())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let st = self.child.wait()?;
        anyhow::ensure!(st.success(), "server exited with {st} at SIGTERM");
        Ok(())
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

type UnixClient = strata_nbd::client::Client<tokio::net::UnixStream>;

async fn apply(c: &mut UnixClient, step: &Step) -> std::io::Result<()> {
    apply_at(c, step, 0).await
}

/// Applies a step of a workload over a region starting at `base` (sectors are numbered from
/// the region's start, as the oracle numbers them).
async fn apply_at(c: &mut UnixClient, step: &Step, base: u64) -> std::io::Result<()> {
    match *step {
        Step::Write { id, offset, len, fua } => {
            c.write(base + offset, &payload(id, offset / SECTOR, len / SECTOR), fua).await
        }
        Step::Flush => c.flush().await,
        Step::Trim { offset, len } => c.trim(base + offset, len as u32).await,
        Step::Zero { offset, len } => c.write_zeroes(base + offset, len as u32, false).await,
    }
}

/// Reads `len` bytes at `offset` over NBD, a MiB at a time.
async fn read_region(c: &mut UnixClient, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut image = Vec::with_capacity(len as usize);
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(1 << 20);
        image.extend_from_slice(&c.read(offset + pos, n as u32).await?);
        pos += n;
    }
    Ok(image)
}

/// `strata cache create` of a writeback cache for the crash runs: no migration budget limit,
/// no sequential cutoff, write-back above 30% dirty.
fn create_cache(strata: &Path, origin: &Path, origin_bytes: u64, cache: &Path, cache_bytes: u64, block: &str) -> anyhow::Result<()> {
    let out = std::process::Command::new(strata)
        .args(["cache", "create", "--origin"])
        .arg(format!("{}?size={origin_bytes}", origin.display()))
        .arg("--cache")
        .arg(format!("{}?size={cache_bytes}", cache.display()))
        .args(["--block-size", block, "--migration-budget", "0", "--sequential-cutoff", "0", "--writeback-percent", "30"])
        .output()?;
    anyhow::ensure!(out.status.success(), "cache create: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// `strata cache check CACHE`: `None` when it passes, its report when it does not.
fn cache_check(strata: &Path, cache: &Path) -> anyhow::Result<Option<String>> {
    let out = std::process::Command::new(strata).args(["cache", "check"]).arg(cache).output()?;
    Ok((!out.status.success()).then(|| String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// One kill -9 crash point: a writeback cache over a file origin is driven by a random
/// workload through NBD and killed at a seeded step (mid-request); then the metadata is
/// checked, the cache restarted, every sector verified against the oracle, and the
/// metadata checked again after a clean stop.
pub async fn kill_point(setup: &KillSetup, seed: u64) -> anyhow::Result<PointOutcome> {
    let dir = setup.dir.join(format!("point-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (origin, cache, sock, log) = (dir.join("origin.img"), dir.join("cache.img"), dir.join("s.sock"), dir.join("server.log"));
    create_cache(&setup.strata, &origin, setup.origin_bytes, &cache, setup.cache_bytes, "32KiB")?;

    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let steps = workload(seed, setup.steps, setup.origin_bytes);
    let kill_at = rng.gen_range(setup.steps / 4..setup.steps);
    let mut oracle = Oracle::new(setup.origin_bytes);
    let mut server = ServerProc::start(&setup.strata, &sock, &cache, &log)?;
    {
        let mut c = strata_nbd::client::Client::connect_unix(&sock, "vol").await?;
        for step in &steps[..kill_at] {
            oracle.issue(step);
            apply(&mut c, step).await?;
            oracle.complete(step);
        }
        // The last step is in flight when the server dies.
        let last = steps[kill_at].clone();
        oracle.issue(&last);
        let delay = std::time::Duration::from_micros(rng.gen_range(0..3000));
        let inflight = tokio::spawn(async move {
            let _ = apply(&mut c, &last).await;
        });
        tokio::time::sleep(delay).await;
        server.kill();
        inflight.abort();
    }

    let mut check_failures = 0;
    let mut detail = String::new();
    if let Some(report) = cache_check(&setup.strata, &cache)? {
        check_failures += 1;
        detail.push_str(&format!("check after crash: {report}\n"));
    }
    let server = ServerProc::start(&setup.strata, &sock, &cache, &log)?;
    let image = {
        let mut c = strata_nbd::client::Client::connect_unix(&sock, "vol").await?;
        let image = read_region(&mut c, 0, setup.origin_bytes).await?;
        c.disconnect().await?;
        image
    };
    server.stop()?;
    if let Some(report) = cache_check(&setup.strata, &cache)? {
        check_failures += 1;
        detail.push_str(&format!("check after recovery: {report}\n"));
    }
    let verdict = oracle.verify(&image);
    if verdict.lost == 0 && verdict.garbage == 0 && check_failures == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        detail.push_str(&format!("kept {} for inspection; killed at step {kill_at}\n", dir.display()));
    }
    Ok(PointOutcome { seed, verdict, check_failures, detail })
}

/// Formats and opens the writeback cache of the in-process crash runs over `cache` and
/// `origin`: 32 KiB blocks, no migration budget limit, no sequential cutoff, write-back above
/// 30% dirty, the policy seeded by `seed`.
pub async fn writeback_cache(
    cache: std::sync::Arc<dyn strata_io::BlockDev>,
    origin: std::sync::Arc<dyn strata_io::BlockDev>,
    seed: u64,
) -> anyhow::Result<strata_cache::CacheDev> {
    use strata_cache::admin::{create, CreateOptions};
    use strata_cache::meta::Meta;
    use strata_cache::{CacheDev, OpenOptions};
    let opts = CreateOptions {
        block_bytes: 32 << 10,
        migration_budget_bytes_per_s: 0,
        sequential_cutoff_bytes: 0,
        writeback_percent: 30,
        origin_spec: "mem:crash".into(),
        ..CreateOptions::default()
    };
    create(&*cache, &*origin, &opts).await?;
    let (meta, _) = Meta::load(&*cache).await?;
    Ok(CacheDev::open(cache, origin, meta, OpenOptions { seed, ..OpenOptions::default() }).await?)
}

/// Restarts a cache from the images a power cut left of its cache device and origin: checks
/// the metadata, opens the cache (recovering it), reads the whole volume, shuts it down and
/// checks the metadata again. Returns the volume's content, the number of failed checks and
/// what they found.
pub async fn recover_cache(
    cache_img: strata_io::mem::MemDev,
    origin_img: strata_io::mem::MemDev,
) -> anyhow::Result<(strata_io::Buf, u32, String)> {
    use std::sync::Arc;
    use strata_cache::meta::Meta;
    use strata_cache::{CacheDev, OpenOptions};
    use strata_io::{BlockDev, Buf};

    let (cache_img, origin_img) = (Arc::new(cache_img), Arc::new(origin_img));
    let mut check_failures = 0;
    let mut detail = String::new();
    let (meta, findings) = Meta::load(&*cache_img).await?;
    if !findings.errors.is_empty() {
        check_failures += 1;
        detail.push_str(&format!("check after the cut: {:?}\n", findings.errors));
    }
    let size = origin_img.size();
    let dev = CacheDev::open(cache_img.clone(), origin_img, meta, OpenOptions::default()).await?;
    let image = dev.read(0, Buf::zeroed(size as usize)).await?;
    dev.shutdown().await?;
    drop(dev);
    let (_, findings) = Meta::load(&*cache_img).await?;
    if !findings.errors.is_empty() || !findings.repaired.is_empty() {
        check_failures += 1;
        detail.push_str(&format!("check after recovery: {:?} {:?}\n", findings.errors, findings.repaired));
    }
    Ok((image, check_failures, detail))
}

/// One power-cut point, in process: a writeback cache whose origin and cache device both
/// record their writes; the workload runs, power fails on both at a seeded step (with the
/// last request in flight), each device keeps only what its durability rules allow (torn
/// sectors included), and the cache is recovered from those images and verified.
pub async fn powercut_point(origin_bytes: u64, cache_bytes: u64, steps_n: usize, seed: u64) -> anyhow::Result<PointOutcome> {
    use std::sync::Arc;
    use strata_cache::CacheDev;
    use strata_io::mem::MemDev;
    use strata_io::powercut::PowerCut;
    use strata_io::{BlockDev, Buf, ZeroFlags};

    let origin = Arc::new(PowerCut::new(MemDev::new(origin_bytes)));
    let cache = Arc::new(PowerCut::new(MemDev::new(cache_bytes)));
    let dev = Arc::new(writeback_cache(cache.clone(), origin.clone(), seed).await?);

    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc0ffee);
    let steps = workload(seed, steps_n, origin_bytes);
    let cut_at = rng.gen_range(steps_n / 4..steps_n);
    let mut oracle = Oracle::new(origin_bytes);
    async fn apply_dev(dev: &CacheDev, step: &Step) -> strata_io::Result<()> {
        match *step {
            Step::Write { id, offset, len, fua } => {
                dev.write(offset, Buf::from_slice(&payload(id, offset / SECTOR, len / SECTOR)), fua).await.map(|_| ())
            }
            Step::Flush => dev.flush().await,
            Step::Trim { offset, len } => dev.discard(offset, len).await,
            Step::Zero { offset, len } => dev.write_zeroes(offset, len, ZeroFlags::default()).await,
        }
    }
    for step in &steps[..cut_at] {
        oracle.issue(step);
        apply_dev(&dev, step).await?;
        oracle.complete(step);
    }
    let last = steps[cut_at].clone();
    oracle.issue(&last);
    let d2 = dev.clone();
    let inflight = tokio::spawn(async move {
        let _ = apply_dev(&d2, &last).await;
    });
    for _ in 0..rng.gen_range(0..4) {
        tokio::task::yield_now().await;
    }
    origin.power_off();
    cache.power_off();
    let _ = inflight.await;
    drop(dev);
    let (origin_img, cache_img) = (origin.crash(seed), cache.crash(seed.wrapping_add(1)));

    let (image, check_failures, mut detail) = recover_cache(cache_img, origin_img).await?;
    let verdict = oracle.verify(&image);
    if verdict.lost + verdict.garbage > 0 {
        detail.push_str(&format!("cut at step {cut_at}\n"));
    }
    Ok(PointOutcome { seed, verdict, check_failures, detail })
}
