//! Device specs: how a device is named on the command line and in config files.
//!
//! - `PATH` — file or block device; options after `?`: `size=4GiB` (create a sparse file of
//!   that size if missing), `direct=on|off`, `engine=uring|pool`, `ro`, `shared` (with `ro`
//!   only: no claim on the file, to read beside a writer; see `crate::file`)
//! - `mem:SIZE` — RAM
//! - `hdd:PATH[?opts]` — `PATH` behind the HDD latency model; extra options `seek_min_ms`,
//!   `seek_max_ms`, `rpm`, `mib_s`, `seed`
//! - `ssd:PATH[?opts]` — `PATH` behind the SSD model; extra options `read_us`, `write_us`,
//!   `channels`, `mib_s`
//! - `fault:RULE[,RULE]...@SPEC` — the device `SPEC` names, behind the fault-injection
//!   device (`crate::fault`), with these rules in the text form `fault::parse_rule` reads,
//!   e.g. `fault:read:eio:0-1MiB:once,flush:eio:after=10@/var/tmp/o.img`
//!
//! Targets that live in other crates (`cache:PATH`) are resolved by the caller before it
//! falls back to `open`.

use crate::fault::{parse_rule, FaultDev, Rule};
use crate::file::{Claim, FileDev, FileOptions};
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

fn file_options(opts: &mut Options, read_only: bool) -> Result<(FileOptions, Claim)> {
    let mut fo = FileOptions { read_only, ..FileOptions::default() };
    fo.create_size = opts.take_size("size")?;
    if let Some(d) = opts.take_bool("direct")? {
        fo.direct = d;
    }
    if let Some(e) = opts.take_parsed("engine")? {
        fo.engine = e;
    }
    let ro = opts.take_bool("ro")? == Some(true);
    if ro {
        fo.read_only = true;
    }
    let claim = if opts.take_bool("shared")? == Some(true) {
        if !ro {
            return Err(opts.invalid(
                "shared is only allowed with ro (?ro&shared): an open that takes no claim must not write".into(),
            ));
        }
        Claim::Unclaimed
    } else {
        Claim::Default
    };
    Ok((fo, claim))
}

/// Adds to a refused claim how to read beside the holder.
fn claim_hint(e: Error, read_only: bool) -> Error {
    if e.kind != ErrorKind::Busy {
        return e;
    }
    let hint = if read_only { "add shared (?ro&shared)" } else { "open it read-only with ?ro&shared" };
    Error::new(ErrorKind::Busy, format!("{}; {hint} to read beside it", e.context))
}

/// Splits `fault:RULES@SPEC` into its rules and the spec of the device they wrap; `None`
/// for a spec without the `fault:` prefix. Callers that resolve other targets (`cache:`)
/// open the inner spec themselves and wrap it with `with_faults`.
pub fn split_fault(spec: &str) -> Result<Option<(Vec<Rule>, &str)>> {
    let Some(rest) = spec.strip_prefix("fault:") else { return Ok(None) };
    let invalid = |msg: String| Error::new(ErrorKind::Invalid, format!("device spec {spec:?}: {msg}"));
    let (rules, inner) = rest.split_once('@').ok_or_else(|| invalid("expected fault:RULE[,RULE]...@SPEC".into()))?;
    if inner.is_empty() {
        return Err(invalid("no device after '@'".into()));
    }
    let rules = rules.split(',').map(parse_rule).collect::<std::result::Result<Vec<_>, _>>().map_err(invalid)?;
    Ok(Some((rules, inner)))
}

/// Wraps `dev` in a fault-injection device that starts with `rules`.
pub fn with_faults(dev: Arc<dyn BlockDev>, rules: Vec<Rule>) -> Arc<dyn BlockDev> {
    let (dev, faults) = FaultDev::new(dev);
    for r in rules {
        faults.add(r);
    }
    Arc::new(dev)
}

/// Opens a plain device spec (see the module docs).
pub fn open(spec: &str, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    if let Some((rules, inner)) = split_fault(spec)? {
        return Ok(with_faults(open(inner, read_only)?, rules));
    }
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
    let (fo, claim) = file_options(&mut opts, read_only)?;
    let open_file = || FileDev::open_claimed(Path::new(path), &fo, claim).map_err(|e| claim_hint(e, fo.read_only));
    let dev: Arc<dyn BlockDev> = match kind {
        "hdd" => {
            let mut p = HddParams::default();
            p.seek_min_ms = opts.take_parsed("seek_min_ms")?.unwrap_or(p.seek_min_ms);
            p.seek_max_ms = opts.take_parsed("seek_max_ms")?.unwrap_or(p.seek_max_ms);
            p.rpm = opts.take_parsed("rpm")?.unwrap_or(p.rpm);
            p.mib_s = opts.take_parsed("mib_s")?.unwrap_or(p.mib_s);
            p.seed = opts.take_parsed("seed")?.unwrap_or(p.seed);
            opts.finish()?;
            Arc::new(LatencyDev::hdd(open_file()?, p))
        }
        "ssd" => {
            let mut p = SsdParams::default();
            p.read_us = opts.take_parsed("read_us")?.unwrap_or(p.read_us);
            p.write_us = opts.take_parsed("write_us")?.unwrap_or(p.write_us);
            p.channels = opts.take_parsed("channels")?.unwrap_or(p.channels);
            p.mib_s = opts.take_parsed("mib_s")?.unwrap_or(p.mib_s);
            opts.finish()?;
            Arc::new(LatencyDev::ssd(open_file()?, p))
        }
        _ => {
            opts.finish()?;
            Arc::new(open_file()?)
        }
    };
    Ok(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_specs_wrap_the_inner_device() {
        let (rules, inner) = split_fault("fault:read:eio:0-1MiB:once,flush:eio@mem:4MiB?x").unwrap().unwrap();
        assert_eq!(inner, "mem:4MiB?x");
        assert_eq!(rules.iter().map(|r| r.to_string()).collect::<Vec<_>>(), ["read:eio:0-1048576:once", "flush:eio"]);
        assert!(split_fault("mem:4MiB").unwrap().is_none());
        let dev = open("fault:write:enospc@mem:1MiB", false).unwrap();
        assert_eq!(dev.size(), 1 << 20);
        assert_eq!(dev.describe(), "fault(mem)".replace("mem", &open("mem:1MiB", false).unwrap().describe()));
        for bad in ["fault:read:eio", "fault:read:eio@", "fault:nope:eio@mem:1MiB", "fault:@mem:1MiB"] {
            assert_eq!(open(bad, false).err().unwrap().kind, ErrorKind::Invalid, "{bad}");
        }
    }
}
