//! What `strata status` and `/metrics` show of a qos volume: every group on its device, with
//! requests, bytes, device time used and its share, queue length, time held back by caps,
//! a latency histogram, and the settings in force.

use crate::dev::{snapshot, Qos};
use crate::sched::{GroupId, GroupReport, LATENCY_BUCKETS_US};
use crate::settings::GROUP_KEYS;
use serde::{Deserialize, Serialize};
use strata_io::metrics::{latency_histogram, MetricKind, Sample};

/// The key of a qos volume's status under which the device it schedules shows its own (a
/// cache's or write log's), as a cache shows its remote origin's under `origin`.
pub const BELOW: &str = "below";

/// The status of the target under any qos layers of a volume's status (`target` in
/// `/status`): the status itself when it is not a qos volume's.
pub fn below_qos(mut target: serde_json::Value) -> serde_json::Value {
    while let Some(below) = target.get_mut(BELOW).map(serde_json::Value::take) {
        target = below;
    }
    target
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QosStatus {
    /// The group this volume belongs to.
    pub group: String,
    /// The device the scheduler shares, how it prices requests, and how it runs.
    pub device: String,
    pub cost_model: String,
    pub depth: usize,
    pub slice_ms: f64,
    pub idle_ms: f64,
    /// A request waiting longer than this is served next, whatever its group's share.
    #[serde(default)]
    pub max_wait_ms: f64,
    pub groups: Vec<GroupStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStatus {
    pub name: String,
    pub weight: u32,
    /// Caps and target as `KEY=VALUE` (`max` when not set).
    pub limits: Vec<String>,
    pub requests: u64,
    pub bytes: u64,
    pub device_time_s: f64,
    /// Share of the device time charged so far.
    pub share: f64,
    pub queued: usize,
    pub inflight: usize,
    pub streams: usize,
    /// Streams that are seeky now: they share the group's slices.
    pub seeky_streams: usize,
    pub throttled_s: f64,
    pub latency_us_sum: u64,
    /// Requests per latency bucket (upper bounds `LATENCY_BUCKETS_US`, then one more).
    pub latency_us_buckets: Vec<u64>,
    pub latency_missed: bool,
}

impl GroupStatus {
    fn from(r: &GroupReport) -> GroupStatus {
        // Every setting but the weight, shown on its own.
        let limits = GROUP_KEYS[1..].iter().map(|k| format!("{k}={}", r.settings.value(k))).collect();
        GroupStatus {
            name: r.name.clone(),
            weight: r.settings.weight,
            limits,
            requests: r.counters.requests,
            bytes: r.counters.bytes,
            device_time_s: r.counters.device_ns as f64 / 1e9,
            share: r.share,
            queued: r.queued,
            inflight: r.inflight,
            streams: r.streams,
            seeky_streams: r.seeky_streams,
            throttled_s: r.counters.throttled_ns as f64 / 1e9,
            latency_us_sum: r.counters.latency_ns_sum / 1000,
            latency_us_buckets: r.counters.latency_buckets.clone(),
            latency_missed: r.latency_missed,
        }
    }
}

pub fn status(qos: &Qos, own: GroupId) -> QosStatus {
    let (reports, tuning, cost, device) = snapshot(qos);
    QosStatus {
        group: reports[own.0].name.clone(),
        device,
        cost_model: cost,
        depth: tuning.depth,
        slice_ms: tuning.slice as f64 / 1e6,
        idle_ms: tuning.idle as f64 / 1e6,
        max_wait_ms: tuning.max_wait as f64 / 1e6,
        // Groups whose volumes were all removed are not shown (nor set: see `message`).
        groups: reports.iter().filter(|r| r.members > 0).map(GroupStatus::from).collect(),
    }
}

/// The volume's own group, as samples labelled `group`.
pub fn metrics(qos: &Qos, own: GroupId) -> Vec<Sample> {
    let r = &qos.with(|s| s.report(own));
    let c = &r.counters;
    let sample = |name, kind, help, value| Sample::new(name, kind, help, value).label("group", r.name.clone());
    use MetricKind::{Counter, Gauge};
    let mut v = vec![
        sample("strata_qos_requests_total", Counter, "Requests the group completed.", c.requests as f64),
        sample("strata_qos_bytes_total", Counter, "Bytes the group's requests moved.", c.bytes as f64),
        sample(
            "strata_qos_device_seconds_total",
            Counter,
            "Device time charged to the group.",
            c.device_ns as f64 / 1e9,
        ),
        sample("strata_qos_device_share_ratio", Gauge, "The group's share of the device time charged so far.", r.share),
        sample("strata_qos_queue_length", Gauge, "The group's requests waiting for their turn.", r.queued as f64),
        sample(
            "strata_qos_throttled_seconds_total",
            Counter,
            "Time the group had requests waiting but was held back by its caps.",
            c.throttled_ns as f64 / 1e9,
        ),
        sample("strata_qos_weight", Gauge, "The group's weight.", r.settings.weight as f64),
        sample("strata_qos_streams", Gauge, "Streams (connections) in the group.", r.streams as f64),
        sample(
            "strata_qos_seeky_streams",
            Gauge,
            "Streams of the group that are seeky now (they share its slices).",
            r.seeky_streams as f64,
        ),
    ];
    v.extend(latency_histogram(
        ["strata_qos_latency_seconds_bucket", "strata_qos_latency_seconds_sum", "strata_qos_latency_seconds_count"],
        "Requests of the group by latency from submission to completion.",
        &[("group", r.name.clone())],
        &LATENCY_BUCKETS_US,
        c.latency_buckets.iter().copied(),
        c.latency_ns_sum as f64 / 1e9,
    ));
    v
}
