//! A timer with microsecond-scale precision for the latency models. tokio's timer rounds
//! to whole milliseconds, which would turn an emulated 80 µs flash read into 1 ms; this one
//! runs a thread with a 1 ns timer slack that fires completions at their deadlines.

use parking_lot::{Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;
use std::time::Instant;
use tokio::sync::oneshot;

struct Entry {
    at: Instant,
    seq: u64,
    fire: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Timer {
    heap: Mutex<(BinaryHeap<Reverse<Entry>>, u64)>,
    cond: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer =
            Box::leak(Box::new(Timer { heap: Mutex::new((BinaryHeap::new(), 0)), cond: Condvar::new() }));
        std::thread::Builder::new()
            .name("strata-timer".into())
            .spawn(move || {
                // SAFETY: prctl on the calling thread only.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0, 0, 0) };
                let mut g = t.heap.lock();
                loop {
                    let now = Instant::now();
                    while g.0.peek().is_some_and(|Reverse(e)| e.at <= now) {
                        let Reverse(e) = g.0.pop().expect("peeked");
                        let _ = e.fire.send(());
                    }
                    match g.0.peek() {
                        Some(Reverse(e)) => {
                            let at = e.at;
                            t.cond.wait_until(&mut g, at);
                        }
                        None => t.cond.wait(&mut g),
                    }
                }
            })
            .expect("spawn timer thread");
        t
    })
}

/// Completes at `at` (immediately if it has passed).
pub async fn sleep_until(at: Instant) {
    if at <= Instant::now() {
        return;
    }
    let t = timer();
    let (fire, wait) = oneshot::channel();
    {
        let mut g = t.heap.lock();
        let seq = g.1;
        g.1 += 1;
        let earliest = g.0.peek().is_none_or(|Reverse(e)| at < e.at);
        g.0.push(Reverse(Entry { at, seq, fire }));
        if earliest {
            t.cond.notify_one();
        }
    }
    let _ = wait.await;
}
