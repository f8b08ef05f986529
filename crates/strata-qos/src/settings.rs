//! What a `qos:GROUP?...` spec and the admin messages say: a group's weight and caps, and the
//! scheduler's own tuning for the device it runs on. Read from and written back to spec
//! options here, so the spec, the config file and `strata qos set` accept the same words.

use crate::cost::Linear;
use strata_io::query::{Options, Written};
use strata_io::units::{format_size_exact, parse_rate};
use strata_io::{Error, ErrorKind, Result};

pub const DEFAULT_WEIGHT: u32 = 100;
/// Weights run from 1 to 10000, as cgroup `io.weight`'s do.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;
pub const DEFAULT_BURST_MS: u64 = 100;
/// A burst of more than a minute of a group's caps would leave it uncapped for as long.
pub const MAX_BURST_MS: u64 = 60_000;

/// A group's share and caps (cgroup `io.weight`, `io.max`, `io.latency`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSettings {
    pub weight: u32,
    /// Caps: read and write requests per second, read and write bytes per second.
    pub riops: Option<u64>,
    pub wiops: Option<u64>,
    pub rbps: Option<u64>,
    pub wbps: Option<u64>,
    /// How much a capped group may take at once after being idle, in milliseconds of its caps.
    pub burst_ms: u64,
    /// A latency target: while the group's recent requests take longer, it goes first.
    pub latency_ms: Option<u64>,
}

impl Default for GroupSettings {
    fn default() -> GroupSettings {
        GroupSettings {
            weight: DEFAULT_WEIGHT,
            riops: None,
            wiops: None,
            rbps: None,
            wbps: None,
            burst_ms: DEFAULT_BURST_MS,
            latency_ms: None,
        }
    }
}

/// The names `GroupSettings::set` takes, in the order they are written.
pub const GROUP_KEYS: [&str; 7] = ["weight", "riops", "wiops", "rbps", "wbps", "burst_ms", "latency_ms"];

impl GroupSettings {
    /// Sets one setting from its text (`max`, `off` or `none` lifts a cap).
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let invalid = |msg: String| Error::new(ErrorKind::Invalid, msg);
        let cap = |v: &str, rate: bool| -> Result<Option<u64>> {
            if matches!(v, "max" | "off" | "none") {
                return Ok(None);
            }
            let n = if rate { parse_rate(v).map_err(invalid)? } else { number(key, v)? };
            match (n, key) {
                (0, "latency_ms") => {
                    Err(invalid("latency_ms=0 is a target no request meets; give a positive target or off".into()))
                }
                (0, _) => Err(invalid(format!("{key}=0 would stop the group; give a positive cap or max"))),
                _ => Ok(Some(n)),
            }
        };
        match key {
            "weight" => {
                let w = number(key, value)?;
                if !(*WEIGHT_RANGE.start() as u64..=*WEIGHT_RANGE.end() as u64).contains(&w) {
                    return Err(invalid(format!(
                        "weight {w} is out of range ({} to {})",
                        WEIGHT_RANGE.start(),
                        WEIGHT_RANGE.end()
                    )));
                }
                self.weight = w as u32;
            }
            "riops" => self.riops = cap(value, false)?,
            "wiops" => self.wiops = cap(value, false)?,
            "rbps" => self.rbps = cap(value, true)?,
            "wbps" => self.wbps = cap(value, true)?,
            "latency_ms" => self.latency_ms = cap(value, false)?,
            "burst_ms" => {
                let ms = number(key, value)?;
                if ms > MAX_BURST_MS {
                    return Err(invalid(format!(
                        "burst_ms {ms} is more than a minute of the caps (at most {MAX_BURST_MS})"
                    )));
                }
                self.burst_ms = ms.max(1);
            }
            _ => return Err(invalid(format!("unknown setting {key:?} ({})", GROUP_KEYS.join(", ")))),
        }
        Ok(())
    }

    /// One setting's value as text (`max` for a cap that is not set).
    pub fn value(&self, key: &str) -> String {
        let cap = |v: Option<u64>, rate: bool| match v {
            None => "max".to_string(),
            Some(n) if rate => format_size_exact(n),
            Some(n) => n.to_string(),
        };
        match key {
            "weight" => self.weight.to_string(),
            "riops" => cap(self.riops, false),
            "wiops" => cap(self.wiops, false),
            "rbps" => cap(self.rbps, true),
            "wbps" => cap(self.wbps, true),
            "burst_ms" => self.burst_ms.to_string(),
            "latency_ms" => cap(self.latency_ms, false),
            _ => String::new(),
        }
    }

    /// Each setting that differs from the default, as `(key, value)` in `GROUP_KEYS` order.
    pub fn written(&self) -> Vec<(&'static str, String)> {
        let d = GroupSettings::default();
        GROUP_KEYS.into_iter().filter(|k| self.value(k) != d.value(k)).map(|k| (k, self.value(k))).collect()
    }
}

fn number(key: &str, v: &str) -> Result<u64> {
    v.trim().parse().map_err(|_| Error::new(ErrorKind::Invalid, format!("bad value {v:?} for {key}")))
}

/// How the scheduler runs on its device. Unset fields take defaults from the device's
/// geometry (see `Tuning::for_device`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceOptions {
    /// The linear cost model (`model=RBPS,RSEQIOPS,RRANDIOPS,WBPS,WSEQIOPS,WRANDIOPS`).
    pub model: Option<Linear>,
    /// Requests on the device at once.
    pub depth: Option<usize>,
    /// How long a stream keeps the device once it has it (0: no slices, request by request).
    pub slice_ms: Option<u64>,
    /// How long the device waits for a thinking stream's next request within its slice.
    pub idle_ms: Option<u64>,
    /// The longest a queued request waits whatever the weights say.
    pub max_wait_ms: Option<u64>,
}

impl DeviceOptions {
    pub fn is_empty(&self) -> bool {
        *self == DeviceOptions::default()
    }
}

/// A `qos:` spec's options: the group's settings as given (those not given are `None`, so a
/// second spec naming the group only has to agree on what it says) and the device's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QosOptions {
    pub group: Vec<(String, String)>,
    pub device: DeviceOptions,
}

impl QosOptions {
    /// Takes the group's and the device's options from a spec's options.
    pub fn take(opts: &mut Options) -> Result<QosOptions> {
        let mut given = Vec::new();
        let mut check = GroupSettings::default();
        for key in GROUP_KEYS {
            if let Some(v) = opts.take(key) {
                check.set(key, &v).map_err(|e| opts.invalid(e.context))?;
                given.push(key);
            }
        }
        // Written back canonically: each value as the settings print it.
        let group = given.into_iter().map(|k| (k.to_string(), check.value(k))).collect();
        let mut device = DeviceOptions::default();
        if let Some(m) = opts.take("model") {
            device.model = Some(m.parse().map_err(|e: String| opts.invalid(e))?);
        }
        device.depth = opts.take_parsed("depth")?;
        if device.depth == Some(0) {
            return Err(opts.invalid("depth=0 would never send a request"));
        }
        // At most a minute (an hour for max_wait_ms): past that a typo, not a setting, and
        // the nanoseconds the scheduler counts in stay far from overflowing.
        device.slice_ms = opts.take_within("slice_ms", 0, 60_000, " ms")?;
        device.idle_ms = opts.take_within("idle_ms", 0, 60_000, " ms")?;
        device.max_wait_ms = opts.take_within("max_wait_ms", 0, 3_600_000, " ms")?;
        Ok(QosOptions { group, device })
    }

    /// The group's settings: `base` with what these options say.
    pub fn apply(&self, base: &GroupSettings) -> Result<GroupSettings> {
        let mut s = base.clone();
        for (k, v) in &self.group {
            s.set(k, v)?;
        }
        Ok(s)
    }

    /// Writes the options back in `take`'s order.
    pub fn write(&self, w: &mut Written) {
        for key in GROUP_KEYS {
            if let Some((_, v)) = self.group.iter().find(|(k, _)| k == key) {
                w.pair(key, v);
            }
        }
        let d = &self.device;
        if let Some(m) = &d.model {
            w.pair("model", m);
        }
        for (key, v) in [
            ("depth", d.depth.map(|n| n as u64)),
            ("slice_ms", d.slice_ms),
            ("idle_ms", d.idle_ms),
            ("max_wait_ms", d.max_wait_ms),
        ] {
            if let Some(v) = v {
                w.pair(key, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_and_caps_are_checked() {
        let mut s = GroupSettings::default();
        for (k, v, why) in [
            ("weight", "0", "weight 0 is out of range (1 to 10000)"),
            ("weight", "10001", "out of range"),
            ("weight", "99999999999", "out of range"),
            ("weight", "-1", "bad value"),
            ("riops", "0", "riops=0 would stop the group"),
            ("latency_ms", "0", "latency_ms=0 is a target no request meets"),
            ("rbps", "lots", "expected a number"),
            ("burst_ms", "60001", "burst_ms 60001 is more than a minute"),
            ("burst_ms", "18446744073709551615", "more than a minute"),
            ("color", "red", "unknown setting \"color\""),
        ] {
            let e = s.set(k, v).unwrap_err();
            assert!(e.context.contains(why), "{k}={v}: {e}");
        }
        assert_eq!(s, GroupSettings::default(), "a refused setting changes nothing");
        s.set("weight", "10000").unwrap();
        s.set("rbps", "10MiB/s").unwrap();
        s.set("riops", "500").unwrap();
        s.set("burst_ms", "60000").unwrap();
        assert_eq!((s.weight, s.rbps, s.riops, s.burst_ms), (10_000, Some(10 << 20), Some(500), 60_000));
        s.set("burst_ms", "100").unwrap();
        s.set("riops", "max").unwrap();
        assert_eq!(s.riops, None);
        assert_eq!(s.written(), [("weight", "10000".to_string()), ("rbps", "10MiB".to_string())]);
    }
}
