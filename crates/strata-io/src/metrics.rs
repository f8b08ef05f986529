//! Figures a device or target exports for monitoring, as Prometheus samples. A target lists
//! its own (see [`crate::BlockDev::metrics`]); the server's HTTP layer adds the `volume` label
//! and writes them out in the text exposition format, knowing nothing of the target.

/// The Prometheus type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only ever goes up (from the start of the process or the target); named `..._total`.
    Counter,
    /// Goes up and down: a level, a setting, a ratio, or a 0/1 flag.
    Gauge,
}

impl MetricKind {
    /// The name on a `# TYPE` line.
    pub fn name(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
        }
    }
}

/// One value of one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The full metric name, in base units (`_bytes`, `_seconds`, `_ratio`), e.g.
    /// `strata_cache_read_hits_total`.
    pub name: &'static str,
    pub kind: MetricKind,
    /// The `# HELP` line: the same for every sample of one name.
    pub help: &'static str,
    /// Labels besides `volume`, which the server adds.
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}
