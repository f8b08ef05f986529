//! The `?key=value&flag` options a device spec carries after its path: reading them (each
//! taken once by name, any left over named in the error) and writing them back in a fixed
//! order. The latency models' options are read and written here too, so the `hdd:`/`ssd:`
//! device specs and the simulator's cost models (`hdd?rpm=5400`) accept the same words.
//!
//! Which kinds of spec exist and how each opens is the `strata` crate's `spec` and `open`;
//! nothing here opens a device or knows a prefix.

use crate::latency::{HddParams, SsdParams};
use crate::units::parse_size;
use crate::{Error, ErrorKind, Result};
use std::fmt;

/// The options of a spec: `key=value` pairs (or bare flags) after `?`, each taken once by name.
pub struct Options {
    spec: String,
    pairs: Vec<(String, String, bool)>,
}

impl Options {
    /// `spec` is the whole spec, for error messages; `query` what follows its `?`.
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

    /// An `Invalid` error naming the spec.
    pub fn invalid(&self, msg: impl fmt::Display) -> Error {
        invalid_spec(&self.spec, msg)
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

    /// A number within `lo..=hi` (`unit` names it in the error), or `None` if absent.
    pub fn take_within<T>(&mut self, key: &str, lo: T, hi: T, unit: &str) -> Result<Option<T>>
    where
        T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
    {
        match self.take_parsed::<T>(key)? {
            // A NaN compares false both ways, so it is refused here too.
            Some(v) if !(v >= lo && v <= hi) => {
                Err(self.invalid(format!("{key}={v} is out of range ({lo} to {hi}{unit})")))
            }
            v => Ok(v),
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

/// An `Invalid` error about the spec `spec`, in the form every spec error takes.
pub fn invalid_spec(spec: &str, msg: impl fmt::Display) -> Error {
    Error::new(ErrorKind::Invalid, format!("device spec {spec:?}: {msg}"))
}

/// Splits `PATH?opts` into the path and its options.
pub fn split_query(s: &str) -> (&str, Option<&str>) {
    match s.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (s, None),
    }
}

/// Options written back: `?a=1&b`, in the order they were added; nothing when empty.
#[derive(Default)]
pub struct Written(Vec<String>);

impl Written {
    pub fn flag(&mut self, key: &str, on: bool) {
        if on {
            self.0.push(key.to_string());
        }
    }

    pub fn pair(&mut self, key: &str, value: impl fmt::Display) {
        self.0.push(format!("{key}={value}"));
    }

    /// `key=value` unless `value` is the default, which goes without saying.
    pub fn unless_default<T: PartialEq + fmt::Display>(&mut self, key: &str, value: T, default: T) {
        if value != default {
            self.pair(key, value);
        }
    }
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, "?{}", self.0.join("&"))
        }
    }
}

/// Undoes an NBD URI's percent-encoding (RFC 3986, as the NBD URI format says): the export
/// name and query values are percent-decoded. A `%` not followed by two hex digits, a result
/// that is not UTF-8, or a NUL (no export name or path may hold one) is an error.
pub fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let v = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(v.ok_or_else(|| format!("bad percent-escape in {s:?} (% and two hex digits)"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return Err(format!("{s:?} decodes to a NUL byte"));
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} does not decode to UTF-8"))
}

/// Percent-encodes what an NBD URI's path (`in_query` false) or a query value (true) cannot
/// hold as it is; `percent_decode` gives `s` back.
pub fn percent_encode(s: &str, in_query: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        let plain = c.is_ascii_alphanumeric()
            || matches!(c, b'-' | b'.' | b'_' | b'~' | b'/' | b':' | b'@' | b'!' | b'$' | b'\'' | b'(' | b')')
            || matches!(c, b'*' | b'+' | b',' | b';')
            || (!in_query && matches!(c, b'&' | b'='));
        if plain {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// The HDD model's options (`seek_min_ms`, `seek_max_ms`, `rpm`, `mib_s`, `seed`) over the
/// defaults.
///
/// Each time the models charge is at most a second (a seek, a revolution, a flash access) and
/// each transfer rate at least 1 MiB/s: a model that sleeps for hours on a request, or divides
/// by a zero rate, emulates no disk, and its requests would outlast any shutdown.
pub fn take_hdd(opts: &mut Options) -> Result<HddParams> {
    let mut p = HddParams::default();
    p.seek_min_ms = opts.take_within("seek_min_ms", 0.0, MAX_MS, " ms")?.unwrap_or(p.seek_min_ms);
    p.seek_max_ms = opts.take_within("seek_max_ms", 0.0, MAX_MS, " ms")?.unwrap_or(p.seek_max_ms);
    p.rpm = opts.take_within("rpm", 60_000.0 / MAX_MS, MAX_RPM, "")?.unwrap_or(p.rpm);
    p.mib_s = opts.take_within("mib_s", MIN_MIB_S, MAX_MIB_S, " MiB/s")?.unwrap_or(p.mib_s);
    p.seed = opts.take_parsed("seed")?.unwrap_or(p.seed);
    if p.seek_min_ms > p.seek_max_ms {
        return Err(
            opts.invalid(format!("seek_min_ms ({} ms) is above seek_max_ms ({} ms)", p.seek_min_ms, p.seek_max_ms))
        );
    }
    Ok(p)
}

/// The longest time a latency model charges for one step of a request, in milliseconds.
const MAX_MS: f64 = 1000.0;
const MAX_RPM: f64 = 1e6;
const MIN_MIB_S: f64 = 1.0;
const MAX_MIB_S: f64 = 1e7;

/// Writes the HDD model's options that differ from the defaults, in `take_hdd`'s order.
pub fn write_hdd(w: &mut Written, p: &HddParams) {
    let d = HddParams::default();
    w.unless_default("seek_min_ms", p.seek_min_ms, d.seek_min_ms);
    w.unless_default("seek_max_ms", p.seek_max_ms, d.seek_max_ms);
    w.unless_default("rpm", p.rpm, d.rpm);
    w.unless_default("mib_s", p.mib_s, d.mib_s);
    w.unless_default("seed", p.seed, d.seed);
}

/// The SSD model's options (`read_us`, `write_us`, `channels`, `mib_s`) over the defaults.
pub fn take_ssd(opts: &mut Options) -> Result<SsdParams> {
    let mut p = SsdParams::default();
    p.read_us = opts.take_within("read_us", 0.0, MAX_MS * 1000.0, " us")?.unwrap_or(p.read_us);
    p.write_us = opts.take_within("write_us", 0.0, MAX_MS * 1000.0, " us")?.unwrap_or(p.write_us);
    p.channels = opts.take_within("channels", 1, 1024, "")?.unwrap_or(p.channels);
    p.mib_s = opts.take_within("mib_s", MIN_MIB_S, MAX_MIB_S, " MiB/s")?.unwrap_or(p.mib_s);
    Ok(p)
}

/// Writes the SSD model's options that differ from the defaults, in `take_ssd`'s order.
pub fn write_ssd(w: &mut Written, p: &SsdParams) {
    let d = SsdParams::default();
    w.unless_default("read_us", p.read_us, d.read_us);
    w.unless_default("write_us", p.write_us, d.write_us);
    w.unless_default("channels", p.channels, d.channels);
    w.unless_default("mib_s", p.mib_s, d.mib_s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_taken_once_and_leftovers_named() {
        let mut o = Options::parse("x?a=1&b&c=on&rpm=5400", Some("a=1&b&c=on&rpm=5400"));
        assert_eq!(o.take_parsed::<u32>("a").unwrap(), Some(1));
        assert_eq!(o.take("a"), None, "taken once");
        assert_eq!(o.take_bool("b").unwrap(), Some(true));
        let hdd = take_hdd(&mut o).unwrap();
        assert_eq!(hdd, HddParams { rpm: 5400.0, ..HddParams::default() });
        let err = o.finish().unwrap_err();
        assert_eq!(err.kind, ErrorKind::Invalid);
        assert!(err.context.ends_with("unknown option(s): c"), "{err}");
        let mut w = Written::default();
        write_hdd(&mut w, &hdd);
        w.flag("ro", true);
        w.flag("shared", false);
        assert_eq!(w.to_string(), "?rpm=5400&ro");
        assert_eq!(Written::default().to_string(), "");
    }

    fn hdd(q: &str) -> Result<HddParams> {
        take_hdd(&mut Options::parse(&format!("hdd?{q}"), Some(q)))
    }

    fn ssd(q: &str) -> Result<SsdParams> {
        take_ssd(&mut Options::parse(&format!("ssd?{q}"), Some(q)))
    }

    /// A zero rate panicked the model on every request (a duration of infinite seconds); a
    /// seek of 2^64 ms left every request, and the server's shutdown, waiting for good.
    #[test]
    fn the_models_refuse_times_and_rates_no_disk_has() {
        for q in [
            "rpm=0",
            "rpm=-7200",
            "mib_s=0",
            "mib_s=0.5",
            "mib_s=inf",
            "seek_max_ms=18446744073709551615",
            "seek_min_ms=-1",
            "seek_min_ms=NaN",
            "seek_min_ms=20&seek_max_ms=10",
        ] {
            let err = hdd(q).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Invalid, "{q}");
            let key = q.split('=').next().unwrap();
            assert!(err.to_string().contains(key), "{q}: {err}");
        }
        for q in ["read_us=1e7", "write_us=-1", "channels=0", "channels=100000", "mib_s=0", "read_us=nan"] {
            let err = ssd(q).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Invalid, "{q}");
            assert!(err.to_string().contains(q.split('=').next().unwrap()), "{q}: {err}");
        }
        assert_eq!(
            hdd("rpm=60&mib_s=1&seek_min_ms=0&seek_max_ms=1000").unwrap(),
            HddParams { rpm: 60.0, mib_s: 1.0, seek_min_ms: 0.0, seek_max_ms: 1000.0, ..HddParams::default() }
        );
        assert_eq!(
            ssd("read_us=1e6&write_us=0&channels=1").unwrap(),
            SsdParams { read_us: 1e6, write_us: 0.0, channels: 1, ..SsdParams::default() }
        );
        let err = hdd("rpm=0").unwrap_err().to_string();
        assert!(err.contains("rpm=0 is out of range (60 to 1000000)"), "{err}");
    }
}
