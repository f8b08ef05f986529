//! How many operations a device has at the kernel, over time: the queue depth the device
//! actually sees, as opposed to the depth a client asks for. The engine counts an operation
//! from the moment it is handed to the kernel until its completion is collected. The gauge
//! keeps the time spent at each depth, so a reader takes two snapshots and gets both the
//! mean depth between them and its distribution. It never blocks on IO; its lock is held
//! for a few arithmetic steps.

use crate::metrics::{MetricKind, Sample};
use std::time::Instant;

/// Depths counted one by one; deeper counts in the last bucket.
pub const DEPTH_BUCKETS: usize = 65;

#[derive(Debug)]
pub struct QueueDepth {
    state: parking_lot::Mutex<State>,
}

#[derive(Debug)]
struct State {
    now: usize,
    since: Instant,
    /// Nanoseconds spent at each depth (the last bucket: that depth or more).
    ns_at: [u64; DEPTH_BUCKETS],
    /// The integral of the depth over time, in depth·nanoseconds.
    depth_ns: u128,
}

/// The gauge at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct DepthSnapshot {
    pub now: usize,
    pub ns_at: [u64; DEPTH_BUCKETS],
    pub depth_ns: u128,
}

impl DepthSnapshot {
    /// The mean depth over the time both snapshots cover (`earlier` taken first).
    pub fn mean_since(&self, earlier: &DepthSnapshot) -> f64 {
        let ns: u64 = self.ns_at.iter().zip(&earlier.ns_at).map(|(a, b)| a - b).sum();
        if ns == 0 {
            return self.now as f64;
        }
        (self.depth_ns - earlier.depth_ns) as f64 / ns as f64
    }
}

impl Default for QueueDepth {
    fn default() -> QueueDepth {
        QueueDepth::new()
    }
}

impl QueueDepth {
    pub fn new() -> QueueDepth {
        let state = State { now: 0, since: Instant::now(), ns_at: [0; DEPTH_BUCKETS], depth_ns: 0 };
        QueueDepth { state: parking_lot::Mutex::new(state) }
    }

    /// One more operation at the kernel.
    pub fn enter(&self) {
        let mut s = self.state.lock();
        s.advance(Instant::now());
        s.now += 1;
    }

    /// One operation fewer at the kernel.
    pub fn leave(&self) {
        let mut s = self.state.lock();
        s.advance(Instant::now());
        debug_assert!(s.now > 0, "an operation left that never entered");
        s.now = s.now.saturating_sub(1);
    }

    pub fn snapshot(&self) -> DepthSnapshot {
        let mut s = self.state.lock();
        s.advance(Instant::now());
        DepthSnapshot { now: s.now, ns_at: s.ns_at, depth_ns: s.depth_ns }
    }

    /// Prometheus samples: the depth now, the time spent at each depth seen so far, and the
    /// depth integrated over time (its rate is the mean depth).
    pub fn samples(&self) -> Vec<Sample> {
        let snap = self.snapshot();
        let mut out = vec![
            Sample::new(
                "strata_device_queue_depth",
                MetricKind::Gauge,
                "Operations the device has at the kernel now.",
                snap.now as f64,
            ),
            Sample::new(
                "strata_device_queue_depth_integral_seconds_total",
                MetricKind::Counter,
                "The device's queue depth integrated over time; its rate is the mean depth.",
                snap.depth_ns as f64 / 1e9,
            ),
        ];
        for (depth, &ns) in snap.ns_at.iter().enumerate().filter(|(_, &ns)| ns > 0) {
            let label = if depth + 1 == DEPTH_BUCKETS { format!("{depth}+") } else { depth.to_string() };
            out.push(
                Sample::new(
                    "strata_device_queue_depth_seconds_total",
                    MetricKind::Counter,
                    "Time the device spent with this many operations at the kernel.",
                    ns as f64 / 1e9,
                )
                .label("depth", label),
            );
        }
        out
    }
}

impl State {
    fn advance(&mut self, t: Instant) {
        let ns = t.saturating_duration_since(self.since).as_nanos() as u64;
        self.ns_at[self.now.min(DEPTH_BUCKETS - 1)] += ns;
        self.depth_ns += self.now as u128 * ns as u128;
        self.since = t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_at_each_depth_adds_up_to_the_mean() {
        let q = QueueDepth::new();
        let a = q.snapshot();
        q.enter();
        q.enter();
        std::thread::sleep(std::time::Duration::from_millis(20));
        q.leave();
        std::thread::sleep(std::time::Duration::from_millis(20));
        q.leave();
        let b = q.snapshot();
        assert_eq!(b.now, 0);
        let at = |d: usize| (b.ns_at[d] - a.ns_at[d]) as f64 / 1e6;
        assert!(at(2) >= 19.0 && at(1) >= 19.0, "ms at 2: {}, at 1: {}", at(2), at(1));
        let mean = b.mean_since(&a);
        // About 20 ms at 2 and 20 ms at 1: a mean near 1.5.
        assert!(mean > 1.2 && mean < 1.8, "mean {mean}");
        assert!(q.samples().iter().any(|s| s.name == "strata_device_queue_depth_seconds_total"));
    }
}
