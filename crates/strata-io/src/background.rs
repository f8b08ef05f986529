//! A target's background task (write-back, periodic commits): started once the target is
//! open, asked to stop by its shutdown, which then waits it out. Until the task has ended it
//! may hold the target, and through it the devices and their files' claims, for a write-back
//! under way; a shutdown that did not wait would write its last superblock under it and
//! answer while the files were still open.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use tokio::sync::{Mutex, Notify};
use tokio::task::JoinHandle;

#[derive(Default)]
pub struct Background {
    stop: AtomicBool,
    /// Held by a stop while it waits, so that every stop (two volumes over one target shut
    /// down at once) waits the task out, not only the first.
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    pub fn start(&self, task: impl Future<Output = ()> + Send + 'static) {
        *self.task.try_lock().expect("started once, before any stop") = Some(tokio::spawn(task));
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
        let mut task = self.task.lock().await;
        if let Some(t) = task.as_mut() {
            _ = t.await;
            *task = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Two stops at once: each returns only once the task has ended.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_stop_waits_the_task_out() {
        let (bg, wake, ended) =
            (Arc::new(Background::default()), Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        bg.start({
            let (bg, ended) = (bg.clone(), ended.clone());
            async move {
                while !bg.stopping() {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await; // a round under way
                ended.store(true, Relaxed);
            }
        });
        let stop = |bg: Arc<Background>, wake: Arc<Notify>, ended: Arc<AtomicBool>| async move {
            bg.stop(&wake).await;
            ended.load(Relaxed)
        };
        let (a, b) = tokio::join!(stop(bg.clone(), wake.clone(), ended.clone()), stop(bg.clone(), wake, ended));
        assert!(a && b, "a stop returned before the task ended: {a} {b}");
    }
}
