//! A device that several volumes use at once: the device below `slice:` volumes, or below
//! the groups of one IO controller. Each volume holds a `Lease` on it. A volume's shutdown
//! shuts the device down only if it is the last lease left; before that it flushes, so the
//! others keep a running device (a cache's write-back goes on, and no clean-shutdown mark is
//! written under volumes still serving). Closings run one at a time, so the last one's
//! shutdown starts after the others' flushes have ended.

use crate::{BlockDev, BoxFut, Error, ErrorKind, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct Shared {
    dev: Arc<dyn BlockDev>,
    users: Mutex<Users>,
    closing: tokio::sync::Mutex<()>,
}

struct Users {
    /// Leases neither shut down nor dropped.
    open: usize,
    /// The last lease has shut the device down: it takes no new ones.
    closed: bool,
}

impl Shared {
    pub fn new(dev: Arc<dyn BlockDev>) -> Arc<Shared> {
        Arc::new(Shared { dev, users: Mutex::new(Users { open: 0, closed: false }), closing: Default::default() })
    }

    /// The device itself, for what stacks on it once for all its users (a scheduler).
    pub fn dev(&self) -> &Arc<dyn BlockDev> {
        &self.dev
    }

    /// Whether its last volume has shut it down (it is gone once that volume is dropped).
    pub fn closed(&self) -> bool {
        self.users.lock().closed
    }

    /// One more volume using the device, through `inner` (the device itself, or a handle
    /// onto it whose shutdown reaches it). Refused once the device has been shut down.
    pub fn lease(self: &Arc<Self>, inner: Arc<dyn BlockDev>) -> Result<Lease> {
        let mut users = self.users.lock();
        if users.closed {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{}: its last volume is closing it; open it again once that is done", self.dev.describe()),
            ));
        }
        users.open += 1;
        Ok(Lease { inner, shared: self.clone(), held: AtomicBool::new(true) })
    }
}

/// One volume's use of a `Shared` device.
pub struct Lease {
    inner: Arc<dyn BlockDev>,
    shared: Arc<Shared>,
    held: AtomicBool,
}

impl Lease {
    /// Gives the lease up (once); says whether it was the last, and if so and `closing`,
    /// marks the device closed in the same step, so no lease taken meanwhile is left on a
    /// device about to be shut down.
    fn release(&self, closing: bool) -> Option<bool> {
        if !self.held.swap(false, Ordering::AcqRel) {
            return None;
        }
        let mut users = self.shared.users.lock();
        users.open -= 1;
        users.closed |= closing && users.open == 0;
        Some(users.open == 0)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release(false);
    }
}

impl BlockDev for Lease {
    crate::forward!(inner: size, geometry, describe, read, write, flush, discard, write_zeroes, block_status, cache);
    crate::forward!(inner: status, metrics, message, connect, disconnect, grow);
    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            let _one_at_a_time = self.shared.closing.lock().await;
            if self.release(true) == Some(true) {
                self.inner.shutdown().await
            } else {
                self.inner.flush().await
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDev;
    use crate::testing::recording::{Event, Recording};

    #[tokio::test]
    async fn only_the_last_lease_shuts_the_device_down() {
        use Event::{Flush, Shutdown};
        let dev = Arc::new(Recording::new(MemDev::new(1 << 20)));
        let shared = Shared::new(dev.clone());
        let lease = || shared.lease(dev.clone()).unwrap();
        let (a, b, c) = (lease(), lease(), lease());
        drop(c);
        a.shutdown().await.unwrap();
        a.shutdown().await.unwrap();
        assert_eq!(dev.events(), [Flush, Flush], "a dropped lease leaves two: the first to close flushes");
        b.shutdown().await.unwrap();
        assert_eq!(dev.events(), [Flush, Flush, Shutdown], "the last one shuts it down");
        let e = shared.lease(dev.clone()).err().unwrap();
        assert_eq!(e.kind, ErrorKind::Busy, "a device shut down takes no new volume: {e}");

        // Closed at once, two leases still give one shutdown, after the other's flush.
        let dev = Arc::new(Recording::new(MemDev::new(1 << 20)));
        let shared = Shared::new(dev.clone());
        let (a, b) = (shared.lease(dev.clone()).unwrap(), shared.lease(dev.clone()).unwrap());
        let (ra, rb) = tokio::join!(a.shutdown(), b.shutdown());
        ra.unwrap();
        rb.unwrap();
        assert_eq!(dev.events(), [Flush, Shutdown]);
    }
}
