//! A device that records the offset and length of every read and write it passes on, in
//! order: tests of the order and size of the IO a target sends its origin. Writes can be
//! held (recorded when issued, passed on when released), to catch a target between two.
//! Writes done, flushes started and shutdowns are also kept in one order ([`Event`]), for
//! tests of what a flush may overtake and of who shuts a device down.

use crate::{BlockDev, BoxFut, Buf, Result};
use parking_lot::Mutex;

/// (offset, length) of each IO, in order.
pub type Log = Vec<(u64, u64)>;

/// A write that completed (its offset), a flush that started, or a shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    WriteDone(u64),
    Flush,
    Shutdown,
}

pub struct Recording<D> {
    pub inner: D,
    reads: Mutex<Log>,
    writes: Mutex<Log>,
    events: Mutex<Vec<Event>>,
    held: tokio::sync::watch::Sender<bool>,
}

impl<D: BlockDev> Recording<D> {
    pub fn new(inner: D) -> Recording<D> {
        let (held, _) = tokio::sync::watch::channel(false);
        Recording {
            inner,
            reads: Mutex::new(Vec::new()),
            writes: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            held,
        }
    }

    /// While held, writes are recorded when issued but wait before they go on.
    pub fn hold_writes(&self, on: bool) {
        self.held.send_replace(on);
    }

    /// The writes recorded since the last `take`, without taking them.
    pub fn writes(&self) -> Log {
        self.writes.lock().clone()
    }

    /// Every write completed, flush started and shutdown so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// The reads and writes recorded since the last call.
    pub fn take(&self) -> (Log, Log) {
        (std::mem::take(&mut self.reads.lock()), std::mem::take(&mut self.writes.lock()))
    }
}

impl<D: BlockDev> BlockDev for Recording<D> {
    crate::forward!(inner: size, discard, write_zeroes, block_status);

    fn describe(&self) -> String {
        format!("recording {}", self.inner.describe())
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        self.reads.lock().push((offset, buf.len() as u64));
        self.inner.read(offset, buf)
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        self.writes.lock().push((offset, buf.len() as u64));
        let mut held = self.held.subscribe();
        Box::pin(async move {
            let _ = held.wait_for(|h| !h).await;
            let done = self.inner.write(offset, buf, fua).await;
            self.events.lock().push(Event::WriteDone(offset));
            done
        })
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        self.events.lock().push(Event::Flush);
        self.inner.flush()
    }

    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        self.events.lock().push(Event::Shutdown);
        self.inner.shutdown()
    }
}
