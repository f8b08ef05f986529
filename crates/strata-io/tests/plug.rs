//! A plug holds back the io_uring submissions of its thread until it goes, then the kernel
//! gets them all at once. In a test binary of its own: the reaper here is the engine's own
//! thread, asleep in the kernel while nothing is in flight, so nothing else enters the ring.

use futures::FutureExt;
use std::time::Duration;
use strata_io::engine::{EngineKind, Plug};
use strata_io::file::{FileDev, FileOptions};
use strata_io::{BlockDev, Buf};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugged_operations_start_when_the_plug_goes() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = FileOptions { direct: true, engine: EngineKind::Uring, create_size: Some(1 << 20), read_only: false };
    let dev = FileDev::open(&dir.path().join("f"), &opts).expect("open file device");
    assert_eq!(dev.engine_name(), "uring");
    dev.write(0, Buf::from_slice(&[7u8; 4096]), false).await.unwrap();
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
