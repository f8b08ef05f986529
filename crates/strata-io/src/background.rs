//! A target's background task (write-back, periodic commits): started once the target is
//! open, asked to stop by its shutdown, which then waits it out. Until the task has ended it
//! may hold the target, and through it the devices and their files' claims, for a write-back
//! under way; a shutdown that did not wait would write its last superblock under it and
//! answer while the files were still open.

use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

#[derive(Default)]
pub struct Background {
    stop: AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    pub fn start(&self, task: impl Future<Output = ()> + Send + 'static) {
        *self.task.lock() = Some(tokio::spawn(task));
    }

    /// Whether the task is to end: it looks at each round.
    pub fn stopping(&self) -> bool {
        self.stop.load(Relaxed)
    }

    /// Asks the task to end at its next look, waking it through `wake` if it waits there;
    /// for a drop, which cannot wait.
    pub fn ask_to_stop(&self, wake: &Notify) {
        self.stop.store(true, Relaxed);
        wake.notify_waiters();
    }

    /// Asks the task to end and waits until it has (the round under way finishes first).
    pub async fn stop(&self, wake: &Notify) {
        self.ask_to_stop(wake);
        let task = self.task.lock().take();
        if let Some(task) = task {
            _ = task.await;
        }
    }
}
