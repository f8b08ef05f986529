//! Helpers shared by the cache's integration tests.

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
