//! Opening a volume from its spec: the one place that knows every kind of device and target.

use anyhow::Result;
use std::sync::Arc;
use strata_io::BlockDev;

/// Opens `spec` (see `strata serve --help` for the forms).
pub fn open(spec: &str, read_only: bool) -> Result<Arc<dyn BlockDev>> {
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
