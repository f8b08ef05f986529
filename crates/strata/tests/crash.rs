//! Crash tests for the cache: kill -9 and power cuts at seeded points during mixed writes
//! with flushes; after restart `strata cache check` passes and every flushed or FUA write
//! reads back (see `strata::crashtest` for the oracle and the runners).

use strata::crashtest::{kill_point, KillSetup, Killed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_seeded_points_loses_no_flushed_write() {
    kill_points(Killed::Cache).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_write_log_at_seeded_points_loses_no_flushed_write() {
    kill_points(Killed::Writecache).await;
}

/// A thin volume (odd seeds skip block zeroing), snapshotted at some flush boundaries: the
/// volume and every snapshot verified, `strata thin check` and `thin_check` clean after the
/// kill and after recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_thin_volume_at_seeded_points_loses_no_flushed_write() {
    if thin_tools() {
        kill_points(Killed::Thin).await;
    }
}

/// Whether thin_check runs (the thin points need it); under CI=true it must.
fn thin_tools() -> bool {
    match strata::crashtest::thin::ThinTarget::new() {
        Ok(_) => true,
        Err(e) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{e} (scripts/setup.sh installs it)");
            eprintln!("SKIP: {e}");
            false
        }
    }
}

/// Twelve seeded kill -9 points of `target`, every sector checked after each.
async fn kill_points(target: Killed) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let setup = KillSetup {
        target,
        strata: env!("CARGO_BIN_EXE_strata").into(),
        dir: dir.path().to_owned(),
        origin_bytes: 16 << 20,
        cache_bytes: 8 << 20,
        steps: 300,
        skip_zeroing: None,
    };
    let mut verified = 0;
    for seed in 100..112 {
        let out = kill_point(&setup, seed).await.unwrap();
        assert_eq!(out.verdict.lost, 0, "seed {seed}: lost flushed writes\n{}", out.detail);
        assert_eq!(out.verdict.garbage, 0, "seed {seed}: sectors hold bytes never written\n{}", out.detail);
        assert_eq!(out.check_failures, 0, "seed {seed}: {target:?} check failed\n{}", out.detail);
        verified += out.verdict.sectors;
    }
    // Thin points verify their snapshots too.
    assert!(verified >= 12 * (16 << 20) / 512, "{verified} sectors verified");
}

#[test]
fn crashtest_command_reports_counts() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["crashtest", "--points", "2", "--seed", "7", "--steps", "120", "--cache-mode", "writethrough", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let why = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() >= 3, "{why}");
    assert!(lines[0].starts_with("writethrough: 2 points, "), "{why}");
    assert!(lines[lines.len() - 2].ends_with(" unstable reads"), "{why}");
    let last: Vec<&str> = lines[lines.len() - 1].split(' ').collect();
    assert_eq!(
        (last.len(), last[0], last[1], &last[3..5], &last[6..]),
        (8, "2", "points,", &["lost", "writes,"][..], &["check", "failures"][..]),
        "{why}"
    );
    let clean = last[2] == "0" && last[5] == "0";
    assert_eq!(out.status.success(), clean, "exit status follows the counts: {why}");
}

/// Options a mode does not use, and a target's modes given to another, are refused before
/// anything runs: a run never reports on what it did not test.
#[test]
fn crashtest_refuses_what_its_mode_does_not_test() {
    for (args, why) in [
        (&["--mode", "faults", "--points", "3"][..], "--points does not apply to --mode faults"),
        (&["--mode", "kill", "--clients", "4"][..], "--clients does not apply to --mode kill"),
        (&["--mode", "kill", "--cache-mode", "writethrough"][..], "one mode only"),
        (&["--mode", "kill", "--target", "thin", "--cache-mode", "eager"][..], "the modes zeroing, skip-zeroing"),
        (&["--mode", "powercut", "--target", "writecache", "--cache-mode", "writeback"][..], "default, eager, paused"),
        (&["--mode", "ext4", "--minutes", "1"][..], "--minutes does not apply to --mode ext4"),
        (&["--mode", "soak", "--steps", "10"][..], "--steps does not apply to --mode soak"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .arg("crashtest")
            .args(args)
            .args(["--dir", "/nonexistent/strata-crashtest-refused"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(why), "{args:?}: {stderr}");
    }
}

/// The power-cut suite at a small scale: every cache mode, 4 clients, devices that complete
/// requests late and out of order, live mode switches, failed flushes (see
/// `strata::crashtest::powercut_run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_suite_in_every_cache_mode_loses_nothing() {
    let bad = failing_points(&strata::crashtest::CacheTarget, 1..=12).await;
    assert!(bad.is_empty(), "{} failing points:\n{}", bad.len(), bad.join("\n"));
}

/// Runs the default power-cut setup on `target` in each of its modes for `seeds`; describes
/// every point that lost a write, read garbage, failed a check or read unstably.
async fn failing_points<T: strata::crashtest::CrashTarget>(
    target: &T,
    seeds: std::ops::RangeInclusive<u64>,
) -> Vec<String> {
    use strata::crashtest::{powercut_run, PowercutSetup};
    let setup = PowercutSetup::default();
    let mut bad = Vec::new();
    for mode in target.modes() {
        for seed in seeds.clone() {
            let out = powercut_run(target, &setup, &mode, seed).await.unwrap();
            let v = out.verdict;
            if v.lost + v.garbage + out.check_failures as u64 + out.unstable > 0 {
                bad.push(format!(
                    "{mode} seed {seed}: {v:?}, {} check failures, {} unstable\n{}",
                    out.check_failures, out.unstable, out.detail
                ));
            }
        }
    }
    bad
}

/// The power-cut suite on the write log (`WritecacheTarget`) in each of its tunings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_suite_on_the_write_log_loses_nothing() {
    let bad = failing_points(&strata::crashtest::WritecacheTarget, 1..=8).await;
    assert!(bad.is_empty(), "{} failing points:\n{}", bad.len(), bad.join("\n"));
}

/// The power-cut suite on a thin volume, with and without block zeroing: snapshots taken at
/// flush boundaries while 4 clients write (copy-on-write after them), trims that unmap,
/// FUA writes, failing flushes; the volume and its snapshots verified after each cut, and
/// strata's checker and `thin_check` clean after the cut and after recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_suite_on_thin_volumes_and_snapshots_loses_nothing() {
    if !thin_tools() {
        return;
    }
    let target = strata::crashtest::thin::ThinTarget::new().unwrap();
    let bad = failing_points(&target, 1..=8).await;
    assert!(bad.is_empty(), "{} failing points:\n{}", bad.len(), bad.join("\n"));
}

/// The suite can fail on thin: a pool that never flushes loses writes, and a snapshot that
/// changes after it was taken shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_suite_catches_thin_flaws() {
    use broken::{Broken, Flaw};
    use strata::crashtest::{powercut_run, PowercutSetup};
    if !thin_tools() {
        return;
    }
    let setup = PowercutSetup { flush_fail_share: 0.0, ..PowercutSetup::default() };
    let thin = || strata::crashtest::thin::ThinTarget::new().unwrap();
    let (mut lost, mut snapshot_bad) = (0, 0);
    for seed in 1..=6 {
        lost += powercut_run(&Broken(thin(), Flaw::NoFlush), &setup, "zeroing", seed).await.unwrap().verdict.lost;
        let out = powercut_run(&Broken(thin(), Flaw::SnapshotOverwritten), &setup, "zeroing", seed).await.unwrap();
        if out.detail.contains("snapshot 2: sector") {
            snapshot_bad += 1;
        }
    }
    assert!(lost > 0, "no lost write found on a thin pool that never flushes");
    assert!(snapshot_bad > 0, "no snapshot found changed after it was taken");
}

/// A deliberately broken wrapper of a `CrashTarget`'s volume, to show the suite can fail.
mod broken {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use strata::crashtest::CrashTarget;
    use strata_io::mem::MemDev;
    use strata_io::{BlockDev, BoxFut, Buf, Result, ZeroFlags};

    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum Flaw {
        /// Acknowledges FLUSH without flushing and drops FUA.
        NoFlush,
        /// Once recovered, every second read returns zeroes.
        AlternatingReads,
        /// Zeroes a snapshot's first MiB just after taking it.
        SnapshotOverwritten,
    }

    pub struct Broken<T>(pub T, pub Flaw);

    pub struct Vol<V> {
        inner: V,
        flaw: Option<Flaw>,
        reads: AtomicU64,
    }

    impl<V: BlockDev> BlockDev for Vol<V> {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn describe(&self) -> String {
            format!("broken({})", self.inner.describe())
        }
        fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
            if self.flaw == Some(Flaw::AlternatingReads) && self.reads.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
                return Box::pin(async move { Ok(Buf::zeroed(buf.len())) });
            }
            self.inner.read(offset, buf)
        }
        fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
            self.inner.write(offset, buf, fua && self.flaw != Some(Flaw::NoFlush))
        }
        fn flush(&self) -> BoxFut<'_, Result<()>> {
            match self.flaw {
                Some(Flaw::NoFlush) => Box::pin(async { Ok(()) }),
                _ => self.inner.flush(),
            }
        }
        fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
            self.inner.discard(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
            self.inner.write_zeroes(offset, len, flags)
        }
        fn status(&self) -> Option<serde_json::Value> {
            self.inner.status()
        }
        fn message(&self, msg: &str) -> BoxFut<'_, Result<String>> {
            self.inner.message(msg)
        }
        fn shutdown(&self) -> BoxFut<'_, Result<()>> {
            self.inner.shutdown()
        }
    }

    impl<T: CrashTarget> CrashTarget for Broken<T> {
        type Vol = Vol<T::Vol>;

        fn modes(&self) -> Vec<String> {
            self.0.modes()
        }

        async fn create(
            &self,
            cache: Arc<dyn BlockDev>,
            origin: Arc<dyn BlockDev>,
            mode: &str,
            seed: u64,
        ) -> anyhow::Result<Vol<T::Vol>> {
            let inner = self.0.create(cache, origin, mode, seed).await?;
            let flaw = (self.1 == Flaw::NoFlush).then_some(Flaw::NoFlush);
            Ok(Vol { inner, flaw, reads: AtomicU64::new(0) })
        }

        fn scripts(&self, mode: &str) -> Vec<Vec<String>> {
            self.0.scripts(mode)
        }

        async fn reopen(&self, cache: Arc<MemDev>, origin: Arc<MemDev>) -> anyhow::Result<(Vol<T::Vol>, Vec<String>)> {
            let (inner, found) = self.0.reopen(cache, origin).await?;
            let flaw = (self.1 == Flaw::AlternatingReads).then_some(Flaw::AlternatingReads);
            Ok((Vol { inner, flaw, reads: AtomicU64::new(0) }, found))
        }

        async fn check(&self, vol: &Vol<T::Vol>) -> Vec<String> {
            self.0.check(&vol.inner).await
        }

        async fn settle(&self, vol: &Vol<T::Vol>) -> (Vec<String>, Vec<String>) {
            self.0.settle(&vol.inner).await
        }

        async fn close(&self, vol: Vol<T::Vol>, cache: Arc<MemDev>) -> Vec<String> {
            self.0.close(vol.inner, cache).await
        }

        fn block_bytes(&self) -> u64 {
            self.0.block_bytes()
        }

        fn origin_bytes(&self, volume_bytes: u64) -> u64 {
            self.0.origin_bytes(volume_bytes)
        }

        fn stale_reads(&self, mode: &str) -> bool {
            self.0.stale_reads(mode)
        }

        async fn snapshot(&self, vol: &Vol<T::Vol>, id: u32) -> anyhow::Result<()> {
            self.0.snapshot(&vol.inner, id).await?;
            if self.1 == Flaw::SnapshotOverwritten {
                let snap = self.0.open_snapshot(&vol.inner, id)?;
                snap.write(0, Buf::zeroed(1 << 20), true).await?;
            }
            Ok(())
        }

        async fn delete_snapshot(&self, vol: &Vol<T::Vol>, id: u32) -> anyhow::Result<()> {
            self.0.delete_snapshot(&vol.inner, id).await
        }

        fn open_snapshot(&self, vol: &Vol<T::Vol>, id: u32) -> anyhow::Result<Arc<dyn BlockDev>> {
            self.0.open_snapshot(&vol.inner, id)
        }
    }
}

/// The suite can fail: a cache whose FLUSH is acknowledged without flushing (and whose FUA
/// is dropped) loses writes at power cuts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_suite_catches_a_target_that_does_not_flush() {
    use broken::{Broken, Flaw};
    use strata::crashtest::{powercut_run, CacheTarget, PowercutSetup};
    let setup = PowercutSetup { flush_fail_share: 0.0, ..PowercutSetup::default() };
    let target = Broken(CacheTarget, Flaw::NoFlush);
    let mut lost = 0;
    for seed in 1..=6 {
        lost += powercut_run(&target, &setup, "writeback", seed).await.unwrap().verdict.lost;
    }
    assert!(lost > 0, "no lost write found on a target that never flushes");
}

/// The suite can fail: a recovered volume whose reads alternate between its content and
/// zeroes reads unstably.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_suite_catches_unstable_reads() {
    use broken::{Broken, Flaw};
    use strata::crashtest::{powercut_run, CacheTarget, PowercutSetup};
    let setup = PowercutSetup { flush_fail_share: 0.0, ..PowercutSetup::default() };
    let out = powercut_run(&Broken(CacheTarget, Flaw::AlternatingReads), &setup, "writethrough", 3).await.unwrap();
    assert!(out.unstable > 0, "no unstable read found: {}", out.detail);
    assert!(out.check_failures as u64 >= out.unstable, "unstable reads count as check failures");
}

/// ext4 through nbdfuse + loop on recording devices, cut at 20 seeded flush points on a plain
/// volume, 20 on a writeback cache and 20 on a write log: `e2fsck -fn` clean after the journal
/// replay, every fsynced file intact (see `strata::crashtest::ext4`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_cut_at_flush_points_is_clean_and_keeps_fsynced_files() {
    use strata::crashtest::ext4::{replay, unavailable, Ext4Setup, Stack};
    if let Some(why) = unavailable() {
        eprintln!("SKIP: ext4_cut_at_flush_points_is_clean_and_keeps_fsynced_files: {why}");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for stack in Stack::ALL {
        let s = Ext4Setup { dir: dir.path().join(stack.name()), volume_bytes: 64 << 20, ops: 40, seed: 3, stack };
        let sum = replay(&s, 20).await.unwrap();
        assert!(sum.flush_points >= 20, "{stack:?}: only {} flush points recorded", sum.flush_points);
        assert_eq!(sum.points, 20, "{stack:?}");
        assert!(sum.paths > 0, "{stack:?}: no fsynced file was checked");
        assert_eq!((sum.lost, sum.check_failures), (0, 0), "{stack:?}:\n{}", sum.failures.join("\n"));
    }
}

/// The persistent EIO and ENOSPC cells of the fault matrix (origin, fast device's data area,
/// metadata) of each target: every request gets a reply, no read returns wrong data, nothing
/// acknowledged and flushed is lost, and the volume opened again is sound once the device
/// answers (see `strata::crashtest::faults`; `strata crashtest --mode faults --target T`
/// runs every cell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_device_errors_crash_nothing_and_lose_nothing() {
    use strata::crashtest::{thin::ThinTarget, CacheTarget, CrashTarget, WritecacheTarget};
    async fn cells<T: CrashTarget>(t: &T, devices: usize) {
        use strata::crashtest::faults::{matrix, run_case, Class};
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let cells: Vec<_> = matrix(t).into_iter().filter(|c| c.persistent && c.class != Class::Latency).collect();
        assert_eq!(cells.len(), 2 * devices);
        for (i, case) in cells.into_iter().enumerate() {
            let out = run_case(t, case, 50 + i as u64, dir.path()).await.unwrap();
            assert!(out.errors > 0, "{case:?}: the fault never reached the client: {out:?}");
            assert_eq!((out.server_crashes, out.silent_losses, out.check_failures), (0, 0, 0), "{case:?}: {out:?}");
        }
    }
    cells(&CacheTarget, 3).await;
    cells(&WritecacheTarget, 3).await;
    cells(&ThinTarget::new().unwrap(), 2).await;
}
