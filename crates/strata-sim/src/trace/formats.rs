//! One parser per trace format. Each turns one non-empty line into at most one request,
//! `Ok(None)` for lines that carry no data IO (headers, file actions, flushes, discards),
//! or an error message saying what is wrong with the line.

use std::collections::HashMap;

use super::{Format, IoKind, Request, NAMESPACE_SHIFT};

pub trait LineParser {
    fn parse(&mut self, line: &str) -> Result<Option<Request>, String>;
}

pub fn parser_for(format: Format) -> Box<dyn LineParser + Send> {
    match format {
        Format::Msr => Box::new(Msr),
        Format::Fio => Box::new(Fio::default()),
        Format::Blkparse => Box::new(Blkparse::default()),
        Format::Cloudphysics => Box::new(CloudPhysics),
        Format::Lis => Box::new(Lis),
        Format::Alibaba => Box::new(Alibaba),
        Format::Tencent => Box::new(Tencent),
    }
}

fn num<T: std::str::FromStr>(field: &str, what: &str) -> Result<T, String> {
    field.trim().parse::<T>().map_err(|_| format!("{what} '{}' is not a number", field.trim()))
}

fn fields<'a>(line: &'a str, sep: char, n: usize, names: &str) -> Result<Vec<&'a str>, String> {
    let f: Vec<&str> = line.split(sep).map(str::trim).collect();
    if f.len() < n {
        return Err(format!("expected {n} fields ({names}), found {}", f.len()));
    }
    Ok(f)
}

/// Place `offset` in namespace `ns` (a device, volume or file number).
fn in_namespace(ns: u64, offset: u64) -> Result<u64, String> {
    if offset >> NAMESPACE_SHIFT != 0 {
        return Err(format!("offset {offset} is beyond 256 TiB"));
    }
    if ns >> (64 - NAMESPACE_SHIFT) != 0 {
        return Err(format!("device/volume number {ns} is too large"));
    }
    Ok((ns << NAMESPACE_SHIFT) | offset)
}

fn checked_mul(a: u64, b: u64, what: &str) -> Result<u64, String> {
    a.checked_mul(b).ok_or_else(|| format!("{what} overflows"))
}

/// MSR Cambridge: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`, time in
/// Windows filetime ticks (100 ns), offset and size in bytes.
struct Msr;

impl LineParser for Msr {
    fn parse(&mut self, line: &str) -> Result<Option<Request>, String> {
        let f = fields(line, ',', 7, "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime")?;
        if f[0].eq_ignore_ascii_case("timestamp") {
            return Ok(None);
        }
        let ticks: u64 = num(f[0], "timestamp")?;
        let disk: u64 = num(f[2], "disk number")?;
        let kind = match f[3].to_ascii_lowercase().as_str() {
            "read" => IoKind::Read,
            "write" => IoKind::Write,
            other => return Err(format!("type '{other}' is neither Read nor Write")),
        };
        let offset: u64 = num(f[4], "offset")?;
        let len: u64 = num(f[5], "size")?;
        Ok(Some(Request {
            time_ns: Some(checked_mul(ticks, 100, "timestamp")?),
            offset: in_namespace(disk, offset)?,
            len,
            kind,
        }))
    }
}

/// fio iolog v2 (`FILE ACTION [OFFSET LENGTH]`) and v3 (the same after a timestamp in µs).
/// Each file name is its own namespace, numbered in order of appearance.
#[derive(Default)]
struct Fio {
    version: Option<u32>,
    files: HashMap<String, u64>,
}

impl LineParser for Fio {
    fn parse(&mut self, line: &str) -> Result<Option<Request>, String> {
        let Some(version) = self.version else {
            self.version = Some(match line {
                l if l.starts_with("fio version 2 iolog") => 2,
                l if l.starts_with("fio version 3 iolog") => 3,
                _ => return Err("a fio iolog starts with 'fio version 2 iolog' or 'fio version 3 iolog'".into()),
            });
            return Ok(None);
        };
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let (time_ns, rest) = if version == 3 {
            let (ts, rest) = tokens.split_first().ok_or("empty record")?;
            (Some(checked_mul(num::<u64>(ts, "timestamp")?, 1000, "timestamp")?), rest)
        } else {
            (None, &tokens[..])
        };
        let [file, action, args @ ..] = rest else {
            return Err(format!("expected 'FILE ACTION [OFFSET LENGTH]', found '{line}'"));
        };
        let kind = match *action {
            "read" => IoKind::Read,
            "write" => IoKind::Write,
            "add" | "open" | "close" | "trim" | "sync" | "datasync" | "wait" | "sync_file_range" => {
                if *action == "add" || *action == "open" {
                    let n = self.files.len() as u64;
                    self.files.entry(file.to_string()).or_insert(n);
                }
                return Ok(None);
            }
            other => return Err(format!("unknown iolog action '{other}'")),
        };
        let [offset, len, ..] = args else {
            return Err(format!("'{action}' needs an offset and a length"));
        };
        let n = self.files.len() as u64;
        let ns = *self.files.entry(file.to_string()).or_insert(n);
        Ok(Some(Request { time_ns, offset: in_namespace(ns, num(offset, "offset")?)?, len: num(len, "length")?, kind }))
    }
}

/// blkparse's default output:
/// `MAJ,MIN CPU SEQ SECONDS.NANOS PID ACTION RWBS SECTOR + COUNT [PROCESS]`.
/// A request shows up once per stage (Q queued, G, I, D issued, C completed...); we count
/// one stage only, the first of Q, D or C that the trace contains, so traces recorded with
/// `-a issue` or `-a complete` work too.
#[derive(Default)]
struct Blkparse {
    action: Option<String>,
    devices: HashMap<String, u64>,
}

impl LineParser for Blkparse {
    fn parse(&mut self, line: &str) -> Result<Option<Request>, String> {
        let t: Vec<&str> = line.split_whitespace().collect();
        let is_dev = t.first().and_then(|d| d.split_once(',')).is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        });
        if !is_dev {
            // Per-CPU and total summaries at the end of blkparse output.
            return Ok(None);
        }
        if t.len() < 7 {
            return Err(format!("expected 'MAJ,MIN CPU SEQ TIME PID ACTION RWBS ...', found {} fields", t.len()));
        }
        let action = t[5];
        let rwbs = t[6];
        if !(t.len() >= 10 && t[8] == "+") {
            return Ok(None); // plug/unplug, messages and other events without a sector range
        }
        match &self.action {
            Some(a) if a != action => return Ok(None),
            Some(_) => {}
            None if matches!(action, "Q" | "D" | "C") => self.action = Some(action.to_string()),
            None => return Ok(None),
        }
        let time = parse_seconds(t[3])?;
        let sector: u64 = num(t[7], "sector")?;
        let count: u64 = num(t[9], "sector count")?;
        if count == 0 {
            return Ok(None); // a flush (FWS 0 + 0) carries no data
        }
        let kind = if rwbs.contains('D') {
            return Ok(None); // discard
        } else if rwbs.contains('R') {
            IoKind::Read
        } else if rwbs.contains('W') {
            IoKind::Write
        } else {
            return Ok(None); // flush-only or no data
        };
        let n = self.devices.len() as u64;
        let ns = *self.devices.entry(t[0].to_string()).or_insert(n);
        Ok(Some(Request {
            time_ns: Some(time),
            offset: in_namespace(ns, checked_mul(sector, 512, "sector")?)?,
            len: checked_mul(count, 512, "sector count")?,
            kind,
        }))
    }
}

/// `SECONDS.FRACTION` → nanoseconds.
fn parse_seconds(s: &str) -> Result<u64, String> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: u64 = num(whole, "time")?;
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("time '{s}' is not SECONDS.NANOSECONDS"));
    }
    let nanos: u64 = if frac.is_empty() { 0 } else { num::<u64>(frac, "time")? * 10u64.pow(9 - frac.len() as u32) };
    secs.checked_mul(1_000_000_000).and_then(|n| n.checked_add(nanos)).ok_or_else(|| format!("time '{s}' overflows"))
}

/// libCacheSim's block CSV (the CloudPhysics sample): `version,time,op,size,lbn`; `op` a
/// SCSI opcode in hex, `size` in bytes, `lbn` in 512-byte sectors. The time column is read
/// as seconds: the sample's 7,200 time units span the 7,200 s its description gives.
struct CloudPhysics;

impl LineParser for CloudPhysics {
    fn parse(&mut self, line: &str) -> Result<Option<Request>, String> {
        let f = fields(line, ',', 5, "version,time,op,size,lbn")?;
        if f[0].eq_ignore_ascii_case("version") {
            return Ok(None);
        }
        let time: u64 = num(f[1], "time")?;
        let op = u8::from_str_radix(f[2].trim_start_matches("0x"), 16)
            .map_err(|_| format!("op '{}' is not a hex SCSI opcode", f[2]))?;
        let kind = match op {
            0x08 | 0x28 | 0xa8 | 0x88 => IoKind::Read,
            0x0a | 0x2a | 0xaa | 0x8a => IoKind::Write,
            _ => return Ok(None), // SYNCHRONIZE CACHE, UNMAP, ...: no data to cache
        };
        let size: u64 = num(f[3], "size")?;
        let lbn: u64 = num(f[4], "lbn")?;
        Ok(Some(Request {
            time_ns: Some(checked_mul(time, 1_000_000_000, "time")?),
            offset: in_namespace(0, checked_mul(lbn, 512, "lbn")?)?,
            len: size,
            kind,
        }))
    }
}

/// ARC/SPC `.lis` (Megiddo & Modha's traces): `start_block nblocks ignore reqno`, in 512-byte
/// blocks, every block a read request. No timestamps.
struct Lis;

impl LineParser for Lis {
    fn parse(&mut self, line: &str) -> Result<Option<Request>, String> {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() != 4 {
            return Err(format!("expected 4 fields (start_block nblocks ignore reqno), found {}", t.len()));
        }
        let start: u64 = num(t[0], "start block")?;
        let n: u64 = num(t[1], "block count")?;
        num::<u64>(t[2], "third field")?;
        num::<u64>(t[3], "request number")?;
        Ok(Some(Request {
            time_ns: None,
            offset: in_namespace(0, checked_mul(start, 512, "start block")?)?,
            len: checked_mul(n, 512, "block count")?,
            kind: IoKind::Read,
        }))
    }
}

/// Alibaba block traces: `device_id,opcode,offset,length,timestamp`; opcode R or W, bytes,
/// timestamp in µs.
struct Alibaba;

impl LineParser for Alibaba {
    fn parse(&mut self, line: &str) -> Result<Option<Request>, String> {
        let f = fields(line, ',', 5, "device_id,opcode,offset,length,timestamp")?;
        if f[0].eq_ignore_ascii_case("device_id") {
            return Ok(None);
        }
        let dev: u64 = num(f[0], "device id")?;
        let kind = match f[1] {
            "R" | "r" => IoKind::Read,
            "W" | "w" => IoKind::Write,
            other => return Err(format!("opcode '{other}' is neither R nor W")),
        };
        let offset: u64 = num(f[2], "offset")?;
        let len: u64 = num(f[3], "length")?;
        let ts: u64 = num(f[4], "timestamp")?;
        Ok(Some(Request {
            time_ns: Some(checked_mul(ts, 1000, "timestamp")?),
            offset: in_namespace(dev, offset)?,
            len,
            kind,
        }))
    }
}

/// Tencent CBS: `Timestamp,Offset,Size,IOType,VolumeID`; seconds, 512-byte sectors, IOType 0
/// read / 1 write.
struct Tencent;

impl LineParser for Tencent {
    fn parse(&mut self, line: &str) -> Result<Option<Request>, String> {
        let f = fields(line, ',', 5, "Timestamp,Offset,Size,IOType,VolumeID")?;
        if f[0].eq_ignore_ascii_case("timestamp") {
            return Ok(None);
        }
        let ts: u64 = num(f[0], "timestamp")?;
        let offset: u64 = num(f[1], "offset")?;
        let size: u64 = num(f[2], "size")?;
        let kind = match f[3] {
            "0" => IoKind::Read,
            "1" => IoKind::Write,
            other => return Err(format!("IOType '{other}' is neither 0 (read) nor 1 (write)")),
        };
        let vol: u64 = num(f[4], "volume id")?;
        Ok(Some(Request {
            time_ns: Some(checked_mul(ts, 1_000_000_000, "timestamp")?),
            offset: in_namespace(vol, checked_mul(offset, 512, "offset")?)?,
            len: checked_mul(size, 512, "size")?,
            kind,
        }))
    }
}
