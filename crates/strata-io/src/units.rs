//! Parsing and printing sizes and rates the way operators write them: `4GiB`, `64KiB`, `512`,
//! `1.5G`, `32MiB/s`. The one size parser of every command: `K`, `M`, `G`, `T`, `P` and
//! `KiB`, `MiB`, `GiB`, `TiB`, `PiB` are powers of 1024 (`64M` is 64 MiB, as qemu-img and fio
//! read it); `KB`, `MB`, `GB`, `TB` are powers of 1000 (`10MB` is 10,000,000 bytes; fio's
//! default `kb_base` would read it as MiB, strata does not). Units are case-insensitive.
//! Durations too: `250us`, `10ms`, `1.5s`, `2m`.

use std::time::Duration;

/// Checks a volume's size: a positive multiple of 512 bytes, the sector every block layer
/// and NBD client counts in (a server's minimum block size must divide its export's size).
pub fn volume_size(bytes: u64) -> Result<u64, String> {
    if bytes == 0 || !bytes.is_multiple_of(512) {
        return Err(format!("a volume's size must be a positive multiple of 512 bytes, not {bytes}"));
    }
    Ok(bytes)
}

/// [`parse_size`], then [`volume_size`].
pub fn parse_volume_size(s: &str) -> Result<u64, String> {
    volume_size(parse_size(s)?)
}

/// Parses a byte size such as `4GiB`, `64k`, `512`, `1.5G`, `10MB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("size {s:?}: expected a number, e.g. 4GiB"));
    }
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "ki" => 1 << 10,
        "m" | "mib" | "mi" => 1 << 20,
        "g" | "gib" | "gi" => 1 << 30,
        "t" | "tib" | "ti" => 1 << 40,
        "p" | "pib" | "pi" => 1 << 50,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(format!("size {s:?}: unknown unit {other:?} (use KiB, MiB, GiB, TiB, PiB, or KB to TB)")),
    };
    // Exact: whole part and decimals in integers (a float would change large byte counts).
    let not_a_number = || format!("size {s:?}: {num:?} is not a number");
    let (whole, decimals) = num.split_once('.').unwrap_or((num, ""));
    if (whole.is_empty() && decimals.is_empty()) || decimals.contains('.') {
        return Err(not_a_number());
    }
    let out_of_range = || format!("size {s:?} is out of range");
    let digits = |d: &str| if d.is_empty() { Ok(0) } else { d.parse::<u128>().map_err(|_| out_of_range()) };
    let scale = 10u128.checked_pow(decimals.len() as u32).ok_or_else(out_of_range)?;
    let scaled = digits(whole)?
        .checked_mul(scale)
        .and_then(|w| w.checked_add(digits(decimals).ok()?))
        .and_then(|v| v.checked_mul(mult as u128))
        .ok_or_else(out_of_range)?;
    if scaled % scale != 0 {
        return Err(format!("size {s:?} is not a whole number of bytes"));
    }
    u64::try_from(scaled / scale).map_err(|_| out_of_range())
}

/// Parses a rate such as `32MiB/s` (the `/s` is optional) into bytes per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    parse_size(t.strip_suffix("/s").unwrap_or(t))
}

/// Formats a byte count with a binary unit: `4.0 GiB`, `512 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Formats a byte count as `parse_size` reads it back exactly, in the largest binary unit
/// that divides it: `4GiB`, `64KiB`, `1000`. For specs and flag defaults.
pub fn format_size_exact(bytes: u64) -> String {
    const UNITS: [(&str, u32); 5] = [("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    match UNITS.iter().find(|(_, shift)| bytes != 0 && bytes.trailing_zeros() >= *shift) {
        Some((unit, shift)) => format!("{}{unit}", bytes >> shift),
        None => bytes.to_string(),
    }
}

/// Why `parse_duration` refused a duration; each command words it in its own way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// What stands before the unit is not a number.
    NotANumber(String),
    /// No unit (and no default), or this unknown one.
    Unit(String),
    /// Negative, or too large: why.
    OutOfRange(String),
}

/// Parses a duration such as `250us`, `10ms`, `1.5s`, `2m`: units `ns`, `us`, `ms`, `s`,
/// `m` (or `min`). A bare number is in `bare` units (`Some("s")`), or an error without one.
pub fn parse_duration(s: &str, bare: Option<&str>) -> Result<Duration, DurationError> {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, bare.unwrap_or("")),
    };
    let value: f64 = num.trim().parse().map_err(|_| DurationError::NotANumber(num.to_string()))?;
    let secs = match unit {
        "ns" => value / 1e9,
        "us" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        "m" | "min" => value * 60.0,
        _ => return Err(DurationError::Unit(unit.to_string())),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| DurationError::OutOfRange(e.to_string()))
}

/// Writes a duration back the way `parse_duration` reads it: `30s`, `500ms`.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("10MB").unwrap(), 10_000_000);
        assert_eq!(parse_size("10M").unwrap(), 10 << 20);
        assert_eq!(parse_size("10mib").unwrap(), 10 << 20);
        assert_eq!(parse_rate("32MiB/s").unwrap(), 32 << 20);
        assert_eq!(parse_rate("32MiB").unwrap(), 32 << 20);
        assert!(parse_rate("32MiB/s/s").is_err(), "one /s");
        assert!(parse_size("4XB").unwrap_err().contains("PiB"));
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("4XB").is_err());
        assert!(parse_size("0.3").is_err());
        // Exact at any size: no float in between.
        assert_eq!(parse_size("4611686018427388416").unwrap(), (1 << 62) + 512);
        assert_eq!(parse_size("18446744073709550592").unwrap(), u64::MAX - 1023);
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(parse_size("18446744073709551616").unwrap_err().contains("out of range"));
        assert!(parse_size("16384PiB").unwrap_err().contains("out of range"));
        assert_eq!(parse_size("0.5k").unwrap(), 512);
        assert_eq!(parse_size(".5k").unwrap(), 512);
        assert_eq!(
            parse_size("1.000000000000000000001k").unwrap_err(),
            "size \"1.000000000000000000001k\" is not a whole number of bytes"
        );
        assert!(parse_size("1.2.3k").is_err() && parse_size(".").is_err());
        assert_eq!(format_size(4 << 30), "4 GiB");
        assert_eq!(format_size(1536), "1.5 KiB");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250us", None).unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("1.5s", None).unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m", None).unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("30", Some("s")).unwrap(), Duration::from_secs(30));
        assert!(parse_duration("30", None).is_err());
        assert!(parse_duration("5parsecs", None).is_err());
        assert!(parse_duration("-5ms", None).is_err());
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
    }
}
