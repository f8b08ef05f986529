//! The io_uring engine with its completions collected by the runtime's reactor (as `strata
//! serve` runs it) rather than by a thread of its own. In a test binary of its own, so the
//! choice, which is process-wide, is made before any ring exists.

use strata_io::engine::{self, EngineKind};
use strata_io::file::{FileDev, FileOptions};
use strata_io::testing::{check_all_blocks_at_once, check_model, random_ops, Workload};
use strata_io::BlockDev;

fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_reaped_on_the_runtime_match_reference() {
    engine::reap_on_current_runtime();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = FileOptions {
        direct: true,
        engine: EngineKind::Uring,
        create_size: Some(4 << 20),
        allocate: false,
        read_only: false,
    };
    let dev = FileDev::open(&dir.path().join("f"), &opts).expect("open file device");
    assert_eq!(dev.engine_name(), "uring");
    assert!(!thread_names().iter().any(|n| n == "strata-uring"), "a reaper thread was started: {:?}", thread_names());
    check_all_blocks_at_once(&dev).await.unwrap();
    for (seed, w) in [
        (0, Workload { granularity: 4096, max_granules: 64, span: dev.size() }),
        (1, Workload { granularity: 1, max_granules: 20_000, span: 256 << 10 }),
    ] {
        let ops = random_ops(seed, 300, dev.size(), &w);
        check_model(&dev, &ops).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}
