//! An async reader-writer lock that guards no data, for per-block exclusion on a request's
//! path: a read lock costs one compare-and-swap to take and one atomic subtraction to give
//! back while no writer is about, where `tokio::sync::RwLock` builds a waiter entry and
//! takes its waiters' mutex on every release. Writers are rare here (a block being
//! provisioned, copied or unmapped) and wait on a `Notify`.
//!
//! A writer waiting for readers to leave keeps new readers out, so writers are not starved.
//! Dropping a `write()` that is still waiting gives the lock back to the readers.

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use tokio::sync::Notify;

/// Set while a writer holds the lock or waits for its readers to leave.
const WRITER: u32 = 1 << 31;

#[derive(Default)]
pub struct RwLock {
    /// The readers holding the lock, and `WRITER`.
    state: AtomicU32,
    /// Wakes readers and writers waiting for a writer to leave, and the writer waiting for
    /// the last reader to leave.
    changed: Notify,
}

#[must_use = "the lock is given back when the guard is dropped"]
pub struct ReadGuard<'a>(&'a RwLock);

#[must_use = "the lock is given back when the guard is dropped"]
pub struct WriteGuard<'a>(&'a RwLock);

impl RwLock {
    pub fn new() -> RwLock {
        RwLock::default()
    }

    pub async fn read(&self) -> ReadGuard<'_> {
        loop {
            let s = self.state.load(Relaxed);
            if s & WRITER == 0 {
                if self.state.compare_exchange_weak(s, s + 1, Acquire, Relaxed).is_ok() {
                    return ReadGuard(self);
                }
                continue;
            }
            self.wait_while(|s| s & WRITER != 0).await;
        }
    }

    pub async fn write(&self) -> WriteGuard<'_> {
        loop {
            let s = self.state.load(Relaxed);
            if s & WRITER == 0 {
                if self.state.compare_exchange_weak(s, s | WRITER, Acquire, Relaxed).is_ok() {
                    break;
                }
                continue;
            }
            self.wait_while(|s| s & WRITER != 0).await;
        }
        // From here on the guard gives the lock back, also if this future is dropped.
        let guard = WriteGuard(self);
        self.wait_while(|s| s != WRITER).await;
        guard
    }

    /// Waits until `busy` no longer holds of the state (at once if it does not now). Whoever
    /// changes what `busy` looks at wakes the waiters after the change.
    async fn wait_while(&self, busy: impl Fn(u32) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the state is read: a change after this read wakes it.
            changed.as_mut().enable();
            if !busy(self.state.load(Acquire)) {
                return;
            }
            changed.await;
        }
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        if self.0.state.fetch_sub(1, Release) == WRITER | 1 {
            self.0.changed.notify_waiters();
        }
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.state.fetch_and(!WRITER, Release);
        self.0.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    /// True if `f` is still pending after the runtime has had time to run it.
    async fn blocked<F: std::future::Future>(f: F) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f).await.is_err()
    }

    #[tokio::test]
    async fn readers_share_and_a_writer_is_alone() {
        let l = RwLock::new();
        let r1 = l.read().await;
        let r2 = l.read().await;
        assert!(blocked(l.write()).await, "a writer got in beside readers");
        drop((r1, r2));
        let w = l.write().await;
        assert!(blocked(l.read()).await, "a reader got in beside a writer");
        assert!(blocked(l.write()).await, "a second writer got in");
        drop(w);
        let _r = l.read().await;
    }

    #[tokio::test]
    async fn a_waiting_writer_keeps_new_readers_out_and_gets_in_when_the_old_leave() {
        let l = Arc::new(RwLock::new());
        let r = l.read().await;
        let (l2, got) = (l.clone(), Arc::new(AtomicUsize::new(0)));
        let g2 = got.clone();
        let writer = tokio::spawn(async move {
            let _w = l2.write().await;
            g2.store(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
            g2.store(2, Relaxed);
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(blocked(l.read()).await, "a new reader passed a waiting writer");
        assert_eq!(got.load(Relaxed), 0);
        drop(r);
        let _r = l.read().await;
        // The writer ran whole before this reader got in.
        assert_eq!(got.load(Relaxed), 2);
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_writer_given_up_while_waiting_lets_readers_in() {
        let l = RwLock::new();
        let r = l.read().await;
        assert!(blocked(l.write()).await);
        drop(r);
        assert!(!blocked(l.read()).await, "a writer that gave up kept readers out");
    }

    /// Many tasks on several threads: a writer never overlaps anyone, readers overlap.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn under_load_writers_exclude_everyone() {
        let l = Arc::new(RwLock::new());
        let inside = Arc::new(AtomicU32::new(0)); // readers inside, and WRITER
        let mut tasks = Vec::new();
        for t in 0..16u32 {
            let (l, inside) = (l.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..2_000u32 {
                    if (t + i) % 10 == 0 {
                        let _w = l.write().await;
                        assert_eq!(inside.fetch_or(WRITER, Relaxed), 0, "a writer met someone inside");
                        tokio::task::yield_now().await;
                        inside.fetch_and(!WRITER, Relaxed);
                    } else {
                        let _r = l.read().await;
                        assert_eq!(inside.fetch_add(1, Relaxed) & WRITER, 0, "a reader met a writer");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(l.state.load(Relaxed), 0);
    }
}
