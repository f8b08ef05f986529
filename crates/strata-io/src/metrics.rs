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

impl Sample {
    /// A sample without labels.
    pub fn new(name: &'static str, kind: MetricKind, help: &'static str, value: f64) -> Sample {
        Sample { name, kind, help, labels: Vec::new(), value }
    }

    /// The sample with one more label, after those it has.
    pub fn label(mut self, k: &'static str, v: String) -> Sample {
        self.labels.push((k, v));
        self
    }
}

/// A latency histogram's cumulative `_bucket` samples (counters named `name`): one per upper
/// bound of `bounds_us`, labelled `labels` then `le` in seconds, and a last one `le="+Inf"`.
/// `counts` are the requests per bucket: one per bound, then those beyond the last.
pub fn latency_buckets(
    name: &'static str,
    help: &'static str,
    labels: &[(&'static str, String)],
    bounds_us: &[u64],
    counts: impl IntoIterator<Item = u64>,
) -> Vec<Sample> {
    let mut cumulative = 0;
    counts
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            cumulative += n;
            let le = bounds_us.get(i).map_or("+Inf".to_string(), |us| (*us as f64 / 1e6).to_string());
            let s =
                Sample { labels: labels.to_vec(), ..Sample::new(name, MetricKind::Counter, help, cumulative as f64) };
            s.label("le", le)
        })
        .collect()
}
