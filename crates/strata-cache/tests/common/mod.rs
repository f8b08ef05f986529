//! Helpers shared by the cache's integration tests (each test binary uses some of them).
#![allow(dead_code)]

use strata_cache::{CacheDev, CacheStatus};

/// Waits until write-back has left no dirty block (12 s at most, then fails).
pub async fn wait_clean(dev: &CacheDev) {
    for _ in 0..600 {
        if CacheStatus::of(dev).unwrap().dirty_blocks == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("dirty blocks never reached 0: {:?}", CacheStatus::of(dev).unwrap());
}

/// Waits until `done` holds, looking every 10 ms for at most 10 s (background tasks run
/// late on a loaded machine), then fails naming `what`.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "waited 10 s for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
