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

/// A check that could not be made: the device is missing, in use or of another kind. A
/// `check` exits 2 for it, and 1 for damage it found.
#[derive(Debug)]
pub struct NotChecked;

impl std::fmt::Display for NotChecked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cannot check")
    }
}

/// The device a `check` looks at, which `recognise` must not call something other than
/// `kind` (`NotChecked` if it cannot be opened or holds another format; one it does not
/// recognise at all may be a damaged device of this kind, for the check to report).
pub async fn device_to_check(
    path: &std::path::Path,
    read_only: bool,
    kind: &str,
) -> anyhow::Result<std::sync::Arc<dyn strata_io::BlockDev>> {
    use anyhow::Context;
    use strata_io::signature;
    let dev = crate::open::cache_device(path, read_only).context(NotChecked)?;
    match signature::recognise(&signature::head(&*dev).await.context(NotChecked)?) {
        Some(what) if what != kind => {
            Err(anyhow::anyhow!("{} is not {kind} device: it holds {what}", path.display()).context(NotChecked))
        }
        _ => Ok(dev),
    }
}

/// `work`'s answer, once `dev` (a device a command opened for it) is closed as a server
/// closes a volume, whatever `work` answered: a cache or write log opened by a command
/// is left clean, not for recovery at its next open.
pub async fn closing_after<T>(
    dev: &dyn strata_io::BlockDev,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    use anyhow::Context;
    let done = work.await;
    let closed = dev.shutdown().await;
    let value = done?;
    closed.with_context(|| format!("closing {}", dev.describe()))?;
    Ok(value)
}

/// A `--seconds` value: a finite, non-negative number of seconds, at most a year (a run that
/// long is a typo, and `Duration` takes nothing infinite).
pub fn seconds_arg(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=365.0 * 86400.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a number of seconds from 0 to a year, got {s:?}")),
    }
}
