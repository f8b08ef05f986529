//! Opening a volume from its spec: the one place that knows every kind of device and target.

use anyhow::{Context, Result};
use std::sync::Arc;
use strata_io::BlockDev;

/// Opens `spec`: `cache:PATH[?origin=SPEC]` for a cache made by `strata cache create`,
/// `fault:RULES@SPEC` for any of these behind injected faults, or any plain device spec (see
/// `strata serve --help`).
pub async fn open(spec: &str, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    if let Some((rules, inner)) = strata_io::spec::split_fault(spec)? {
        // Resolved here rather than in strata-io so that the inner spec may be a cache.
        let dev = Box::pin(open(inner, read_only)).await?;
        return Ok(strata_io::spec::with_faults(dev, rules));
    }
    if let Some(rest) = spec.strip_prefix("cache:") {
        let dev = strata_cache::admin::open(rest, strata_cache::OpenOptions::default())
            .await
            .with_context(|| format!("opening cache {rest}"))?;
        return Ok(Arc::new(dev));
    }
    Ok(strata_io::spec::open(spec, read_only)?)
}

/// Parses `NAME=SPEC`.
pub fn parse_named(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((name, spec)) if !name.is_empty() && !spec.is_empty() && !name.contains(['/', '?']) => {
            Ok((name.to_string(), spec.to_string()))
        }
        _ => Err(format!("expected NAME=SPEC (e.g. vol0=/var/lib/strata/vol0.img), got {arg:?}")),
    }
}
