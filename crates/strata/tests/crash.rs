//! Crash tests for the writeback cache: kill -9 at seeded points during mixed writes with
//! flushes; after restart `strata cache check` passes and every flushed or FUA write reads
//! back (see `strata::crashtest` for the oracle).

use strata::crashtest::{kill_point, KillSetup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_seeded_points_loses_no_flushed_write() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let setup = KillSetup {
        strata: env!("CARGO_BIN_EXE_strata").into(),
        dir: dir.path().to_owned(),
        origin_bytes: 16 << 20,
        cache_bytes: 8 << 20,
        steps: 300,
    };
    let mut verified = 0;
    for seed in 100..112 {
        let out = kill_point(&setup, seed).await.unwrap();
        assert_eq!(out.verdict.lost, 0, "seed {seed}: lost flushed writes\n{}", out.detail);
        assert_eq!(out.verdict.garbage, 0, "seed {seed}: sectors hold bytes never written\n{}", out.detail);
        assert_eq!(out.check_failures, 0, "seed {seed}: cache check failed\n{}", out.detail);
        verified += out.verdict.sectors;
    }
    assert_eq!(verified, 12 * (16 << 20) / 512);
}

#[test]
fn crashtest_command_reports_counts() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["crashtest", "--points", "2", "--seed", "7", "--steps", "150", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().last(), Some("2 points, 0 lost writes, 0 check failures"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_at_seeded_points_loses_no_flushed_write() {
    for seed in 1..=40 {
        let out = strata::crashtest::powercut_point(16 << 20, 8 << 20, 300, seed).await.unwrap();
        assert_eq!((out.verdict.lost, out.verdict.garbage, out.check_failures), (0, 0, 0), "seed {seed}: {:?}\n{}", out.verdict, out.detail);
    }
}

/// ext4 through nbdfuse + loop on recording devices, cut at 20 seeded flush points on a plain
/// volume and 20 on a writeback cache: `e2fsck -fn` clean after the journal replay, every
/// fsynced file intact (see `strata::crashtest::ext4`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_cut_at_flush_points_is_clean_and_keeps_fsynced_files() {
    use strata::crashtest::ext4::{replay, unavailable, Ext4Setup};
    if let Some(why) = unavailable() {
        eprintln!("SKIP: ext4_cut_at_flush_points_is_clean_and_keeps_fsynced_files: {why}");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for cache in [false, true] {
        let s = Ext4Setup { dir: dir.path().join(if cache { "c" } else { "p" }), volume_bytes: 64 << 20, ops: 40, seed: 3, cache };
        let sum = replay(&s, 20).await.unwrap();
        assert!(sum.flush_points >= 20, "cache={cache}: only {} flush points recorded", sum.flush_points);
        assert_eq!(sum.points, 20, "cache={cache}");
        assert!(sum.paths > 0, "cache={cache}: no fsynced file was checked");
        assert_eq!((sum.lost, sum.check_failures), (0, 0), "cache={cache}:\n{}", sum.failures.join("\n"));
    }
}

/// The persistent EIO and ENOSPC cells of the fault matrix (origin, cache data, metadata):
/// every request gets a reply, no read returns wrong data, nothing acknowledged and flushed
/// is lost, and the metadata is sound once the device answers again (see
/// `strata::crashtest::faults`; `strata crashtest --mode faults` runs all 18 cells).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_device_errors_crash_nothing_and_lose_nothing() {
    use strata::crashtest::faults::{matrix, run_case, Class};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cells: Vec<_> = matrix().into_iter().filter(|c| c.persistent && c.class != Class::Latency).collect();
    assert_eq!(cells.len(), 6);
    for (i, case) in cells.into_iter().enumerate() {
        let out = run_case(case, 50 + i as u64, dir.path()).await.unwrap();
        assert!(out.errors > 0, "{case:?}: the fault never reached the client: {out:?}");
        assert_eq!((out.server_crashes, out.silent_losses, out.check_failures), (0, 0, 0), "{case:?}: {out:?}");
    }
}
