//! A plug holds back the io_uring submissions of its thread until it goes, then the kernel
//! gets them all at once. In a test binary of its own: the reaper here is the engine's own
//! thread, and the test plugs only once that thread waits in the kernel with nothing in
//! flight, so nothing else enters the ring meanwhile (an entry in the ring goes with any
//! thread's entry, the reaper's included).

use futures::FutureExt;
use std::time::Duration;
use strata_io::engine::{EngineKind, Plug};
use strata_io::file::{FileDev, FileOptions};
use strata_io::{BlockDev, Buf};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugged_operations_start_when_the_plug_goes() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = FileOptions {
        direct: true,
        engine: EngineKind::Uring,
        create_size: Some(1 << 20),
        allocate: false,
        read_only: false,
    };
    let dev = FileDev::open(&dir.path().join("f"), &opts).expect("open file device");
    assert_eq!(dev.engine_name(), "uring");
    dev.write(0, Buf::from_slice(&[7u8; 4096]), false).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !reaper_waits_in_the_kernel() {
        assert!(std::time::Instant::now() < deadline, "the reaper thread never went back to waiting");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (mut write, mut read) = {
        let plug = Plug::new();
        let inner = Plug::new();
        let mut write = dev.write(4096, Buf::from_slice(&[9u8; 4096]), false);
        let mut read = dev.read(0, Buf::zeroed(4096));
        assert!((&mut write).now_or_never().is_none() && (&mut read).now_or_never().is_none());
        drop(inner); // a plug inside a plug lets nothing go
        std::thread::sleep(Duration::from_millis(200));
        assert!((&mut write).now_or_never().is_none(), "a plugged write completed");
        assert!((&mut read).now_or_never().is_none(), "a plugged read completed");
        drop(plug);
        (write, read)
    };
    assert_eq!(&read.as_mut().await.unwrap()[..], &[7u8; 4096][..]);
    write.as_mut().await.unwrap();
    assert_eq!(&dev.read(4096, Buf::zeroed(4096)).await.unwrap()[..], &[9u8; 4096][..]);
}

/// Whether the engine's reaper thread is blocked in `io_uring_enter` (426 on every
/// architecture), where it takes no new entries until a completion wakes it.
fn reaper_waits_in_the_kernel() -> bool {
    std::fs::read_dir("/proc/self/task").unwrap().filter_map(|t| t.ok()).any(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let syscall = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        comm.trim() == "strata-uring" && syscall.split_whitespace().next() == Some("426")
    })
}
