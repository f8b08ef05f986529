pub mod cache;
pub mod crashtest;
pub mod demo;
pub mod export;
pub mod load;
pub mod qos;
pub mod serve;
pub mod sim;
pub mod status;
pub mod thin;
pub mod writecache;

/// A `--seconds` value: a finite, non-negative number of seconds, at most a year (a run that
/// long is a typo, and `Duration` takes nothing infinite).
pub fn seconds_arg(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=365.0 * 86400.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a number of seconds from 0 to a year, got {s:?}")),
    }
}
