//! Batched io_uring submission (`engine::batch`): operations started inside a batch reach the
//! kernel only when it ends, all with one entry, and then complete as usual. In a test binary
//! of its own, so that the runtime reaping the ring (a process-wide choice) is this test's.

use std::task::{Context, Waker};
use std::time::Duration;
use strata_io::engine::{self, EngineKind};
use strata_io::file::{FileDev, FileOptions};
use strata_io::{BlockDev, Buf};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_holds_submissions_back_until_it_ends() {
    engine::reap_on_current_runtime();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = FileOptions { direct: true, engine: EngineKind::Uring, create_size: Some(1 << 20), read_only: false };
    let dev = FileDev::open(&dir.path().join("f"), &opts).expect("open file device");
    const N: u64 = 32;
    for i in 0..N {
        let mut b = Buf::zeroed(4096);
        b.fill(i as u8 + 1);
        dev.write(i * 4096, b, false).await.unwrap();
    }
    let mut cx = Context::from_waker(Waker::noop());
    let mut reads = Vec::new();
    {
        let _batch = engine::batch();
        for i in 0..N {
            let mut f = dev.read(i * 4096, Buf::zeroed(4096));
            assert!(f.as_mut().poll(&mut cx).is_pending());
            reads.push(f);
        }
        // Nothing has reached the kernel yet, so nothing can have completed.
        std::thread::sleep(Duration::from_millis(50));
        for f in &mut reads {
            assert!(f.as_mut().poll(&mut cx).is_pending(), "an operation went to the kernel inside the batch");
        }
    }
    for (i, f) in reads.into_iter().enumerate() {
        let b = tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("the batch's end submitted its operations")
            .unwrap();
        assert!(b.iter().all(|&x| x == i as u8 + 1), "read {i} got another block's bytes");
    }
}
