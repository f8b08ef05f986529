//! Device specs: how a device is named on the command line and in config files.
//!
//! - `PATH` — file or block device; options after `?`: `size=4GiB` (create a sparse file of
//!   that size if missing), `direct=on|off`, `engine=uring|pool`, `ro`
//! - `mem:SIZE` — RAM
//! - `hdd:PATH[?opts]` — `PATH` behind the HDD latency model; extra options `seek_min_ms`,
//!   `seek_max_ms`, `rpm`, `mib_s`, `seed`
//! - `ssd:PATH[?opts]` — `PATH` behind the SSD model; extra options `read_us`, `write_us`,
//!   `channels`, `mib_s`
//!
//! Targets that live in other crates (`cache:PATH`) are resolved by the caller before it
//! falls back to `open`.

use crate::file::{FileDev, FileOptions};
use crate::latency::{HddParams, LatencyDev, SsdParams};
use crate::mem::MemDev;
use crate::units::parse_size;
use crate::{BlockDev, Error, ErrorKind, Result};
use std::path::Path;
use std::sync::Arc;

/// The options of a spec: `key=value` pairs after `?`, each taken once by name.
pub struct Options {
    spec: String,
    pairs: Vec<(String, String, bool)>,
}

impl Options {
    pub fn parse(spec: &str, query: Option<&str>) -> Options {
        let pairs = query
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string(), false),
                None => (p.to_string(), String::new(), false),
            })
            .collect();
        Options { spec: spec.to_string(), pairs }
    }

    fn invalid(&self, msg: String) -> Error {
        Error::new(ErrorKind::Invalid, format!("device spec {:?}: {msg}", self.spec))
    }

    pub fn take(&mut self, key: &str) -> Option<String> {
        self.pairs.iter_mut().find(|(k, _, used)| k == key && !*used).map(|(_, v, used)| {
            *used = true;
            v.clone()
        })
    }

    pub fn take_parsed<T: std::str::FromStr>(&mut self, key: &str) -> Result<Option<T>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| self.invalid(format!("bad value {v:?} for {key}"))),
        }
    }

    pub fn take_bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.take(key).as_deref() {
            None => Ok(None),
            Some("" | "1" | "on" | "true" | "yes") => Ok(Some(true)),
            Some("0" | "off" | "false" | "no") => Ok(Some(false)),
            Some(v) => Err(self.invalid(format!("bad value {v:?} for {key} (on or off)"))),
        }
    }

    pub fn take_size(&mut self, key: &str) -> Result<Option<u64>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => parse_size(&v).map(Some).map_err(|e| self.invalid(e)),
        }
    }

    /// Fails naming any option nobody took.
    pub fn finish(self) -> Result<()> {
        let unknown: Vec<&str> = self.pairs.iter().filter(|(_, _, used)| !used).map(|(k, _, _)| k.as_str()).collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(self.invalid(format!("unknown option(s): {}", unknown.join(", "))))
        }
    }
}

/// Splits `PATH?opts` into the path and its options.
pub fn split_query(s: &str) -> (&str, Option<&str>) {
    match s.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (s, None),
    }
}

fn file_options(opts: &mut Options, read_only: bool) -> Result<FileOptions> {
    let mut fo = FileOptions { read_only, ..FileOptions::default() };
    fo.create_size = opts.take_size("size")?;
    if let Some(d) = opts.take_bool("direct")? {
        fo.direct = d;
    }
    if let Some(e) = opts.take_parsed("engine")? {
        fo.engine = e;
    }
    if opts.take_bool("ro")? == Some(true) {
        fo.read_only = true;
    }
    Ok(fo)
}

/// Opens a plain device spec (see the module docs).
pub fn open(spec: &str, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    if let Some(size) = spec.strip_prefix("mem:") {
        let bytes = parse_size(size)
            .map_err(|e| Error::new(ErrorKind::Invalid, format!("device spec {spec:?}: {e}")))?;
        return Ok(Arc::new(MemDev::new(bytes)));
    }
    let (kind, rest) = match spec.split_once(':') {
        Some((k @ ("hdd" | "ssd"), rest)) => (k, rest),
        _ => ("file", spec),
    };
    let (path, query) = split_query(rest);
    if path.is_empty() {
        return Err(Error::new(ErrorKind::Invalid, format!("device spec {spec:?}: no path")));
    }
    let mut opts = Options::parse(spec, query);
    let fo = file_options(&mut opts, read_only)?;
    let dev: Arc<dyn BlockDev> = match kind {
        "hdd" => {
            let mut p = HddParams::default();
            p.seek_min_ms = opts.take_parsed("seek_min_ms")?.unwrap_or(p.seek_min_ms);
            p.seek_max_ms = opts.take_parsed("seek_max_ms")?.unwrap_or(p.seek_max_ms);
            p.rpm = opts.take_parsed("rpm")?.unwrap_or(p.rpm);
            p.mib_s = opts.take_parsed("mib_s")?.unwrap_or(p.mib_s);
            p.seed = opts.take_parsed("seed")?.unwrap_or(p.seed);
            opts.finish()?;
            Arc::new(LatencyDev::hdd(FileDev::open(Path::new(path), &fo)?, p))
        }
        "ssd" => {
            let mut p = SsdParams::default();
            p.read_us = opts.take_parsed("read_us")?.unwrap_or(p.read_us);
            p.write_us = opts.take_parsed("write_us")?.unwrap_or(p.write_us);
            p.channels = opts.take_parsed("channels")?.unwrap_or(p.channels);
            p.mib_s = opts.take_parsed("mib_s")?.unwrap_or(p.mib_s);
            opts.finish()?;
            Arc::new(LatencyDev::ssd(FileDev::open(Path::new(path), &fo)?, p))
        }
        _ => {
            opts.finish()?;
            Arc::new(FileDev::open(Path::new(path), &fo)?)
        }
    };
    Ok(dev)
}
