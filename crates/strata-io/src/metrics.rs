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
    /// One of a histogram's `_bucket`, `_sum` and `_count` samples (see [`latency_histogram`]);
    /// the family is the name without that suffix.
    Histogram,
}

impl MetricKind {
    /// The name on a `# TYPE` line.
    pub fn name(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }

    /// The family `sample` belongs to: a histogram's samples share their name less the suffix.
    pub fn family(self, sample: &str) -> &str {
        match self {
            MetricKind::Histogram => HISTOGRAM_SUFFIXES.iter().find_map(|x| sample.strip_suffix(x)).unwrap_or(sample),
            _ => sample,
        }
    }
}

const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

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

/// A latency histogram's samples, labelled `labels`: the cumulative `_bucket`s, one per upper
/// bound of `bounds_us` (label `le` in seconds) and a last one `le="+Inf"`, then `_sum` (in
/// seconds) and `_count`. `names` are the three sample names, in that order; `counts` are the
/// requests per bucket: one per bound, then those beyond the last.
pub fn latency_histogram(
    names: [&'static str; 3],
    help: &'static str,
    labels: &[(&'static str, String)],
    bounds_us: &[u64],
    counts: impl IntoIterator<Item = u64>,
    sum_seconds: f64,
) -> Vec<Sample> {
    debug_assert!(names.iter().zip(HISTOGRAM_SUFFIXES).all(|(n, x)| n.ends_with(x)), "{names:?}");
    let sample =
        |name, value| Sample { labels: labels.to_vec(), ..Sample::new(name, MetricKind::Histogram, help, value) };
    let mut cumulative = 0;
    let mut v: Vec<Sample> = counts
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            cumulative += n;
            let le = bounds_us.get(i).map_or("+Inf".to_string(), |us| (*us as f64 / 1e6).to_string());
            sample(names[0], cumulative as f64).label("le", le)
        })
        .collect();
    v.push(sample(names[1], sum_seconds));
    v.push(sample(names[2], cumulative as f64));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_and_ends_with_its_sum_and_count() {
        let names = ["x_seconds_bucket", "x_seconds_sum", "x_seconds_count"];
        let v = latency_histogram(names, "h", &[("g", "a".into())], &[100, 1000], [1, 2, 3], 0.5);
        let got: Vec<(&str, f64, Option<&str>)> =
            v.iter().map(|s| (s.name, s.value, s.labels.iter().find(|l| l.0 == "le").map(|l| l.1.as_str()))).collect();
        assert_eq!(
            got,
            [
                ("x_seconds_bucket", 1.0, Some("0.0001")),
                ("x_seconds_bucket", 3.0, Some("0.001")),
                ("x_seconds_bucket", 6.0, Some("+Inf")),
                ("x_seconds_sum", 0.5, None),
                ("x_seconds_count", 6.0, None),
            ]
        );
        assert!(v
            .iter()
            .all(|s| s.labels[0] == ("g", "a".to_string()) && MetricKind::Histogram.family(s.name) == "x_seconds"));
        assert_eq!(MetricKind::Counter.family("y_count"), "y_count");
    }
}
