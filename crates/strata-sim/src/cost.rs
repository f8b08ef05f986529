//! The cost model behind `strata sim --cost ORIGIN,CACHE`: what each policy's decisions
//! cost in device time, on the same HDD and SSD models `strata serve` puts in front of real
//! devices (`hdd:`/`ssd:` device specs, `strata_io::latency`).
//!
//! Each device is `hdd` or `ssd`, optionally with the parameters of its device spec in the
//! same `key=value` syntax: `hdd?rpm=5400&seek_max_ms=20`, `ssd?read_us=100&channels=4`
//! (`:` may stand for `?`). The parameter types are `strata_io`'s own; the HDD's timing is
//! `HddParams::mean_service_s` and the SSD's is restated here as a pure function, because
//! `LatencyDev` only computes it inside its IO path (against a wall clock and its inner
//! device's size). Two deliberate differences: the HDD's
//! rotational delay is its mean, half a revolution, instead of a seeded random draw (so the
//! figures are deterministic; `seed` is accepted and ignored); and there is no queueing —
//! a request's latency is its own service time, whatever else the device is doing.
//!
//! What is charged, per cache-block access of `bytes` (a block of `B` bytes):
//!
//! | access | origin | cache | read latency |
//! | --- | --- | --- | --- |
//! | read hit | — | read `bytes` | the cache read |
//! | read miss, not promoted | read `bytes` | — | the origin read |
//! | read miss, promoted | read `B` | write `B` | the origin read |
//! | write hit | write `bytes` | write `bytes` | |
//! | write miss, not promoted | write `bytes` | — | |
//! | write miss, promoted, whole block | write `B` | write `B` | |
//! | write miss, promoted, partial | read `B`, write `bytes` | write `B` | |
//! | write-back | write `B` | read `B` | |
//!
//! The simulator does not model dirty data (policies are never told a block is dirty), so
//! writes are charged as in writethrough mode and there are no write-backs; the charge for
//! one is [`CostState::writeback`]. Block `b` sits at origin offset `b × B`, and an IO for
//! part of a block is placed at the block's start. On an HDD cache device, blocks get
//! cache slots in promotion order, a promoted block taking its victim's slot.
//!
//! A request the simulator split into several block accesses (they follow each other with
//! the request's time, on consecutive blocks) is served as one IO per device where its
//! blocks go to the same device in a row: the first block pays the positioning (HDD) or
//! the fixed latency (SSD), the following ones their transfer only. (On an HDD cache the
//! slots must also be adjacent.) Read latency is per read request: the sum of its blocks'
//! times, as if its pieces were served one after the other.
//!
//! Busy time is the sum of service times; an SSD's is divided by its channels (the time it
//! needs with the work spread evenly over them).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use strata_policy::{Op, Outcome};

pub use strata_io::latency::{HddParams, SsdParams};

use crate::sim::BlockAccess;
use crate::trace::NAMESPACE_SHIFT;

/// One device's latency model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeviceModel {
    Hdd(HddParams),
    Ssd(SsdParams),
}

impl DeviceModel {
    pub fn kind(&self) -> &'static str {
        match self {
            DeviceModel::Hdd(_) => "hdd",
            DeviceModel::Ssd(_) => "ssd",
        }
    }
}

impl fmt::Display for DeviceModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceModel::Hdd(p) => {
                write!(f, "hdd (seek {}-{} ms, {} rpm, {} MiB/s)", p.seek_min_ms, p.seek_max_ms, p.rpm, p.mib_s)
            }
            DeviceModel::Ssd(p) => write!(
                f,
                "ssd (read {} us, write {} us, {} channels, {} MiB/s)",
                p.read_us, p.write_us, p.channels, p.mib_s
            ),
        }
    }
}

impl FromStr for DeviceModel {
    type Err = String;

    /// `hdd`, `ssd`, or either with `?key=value&key=value` (the device-spec options).
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (kind, query) = match s.find(['?', ':']) {
            Some(i) => (&s[..i], Some(&s[i + 1..])),
            None => (s, None),
        };
        let mut opts = strata_io::query::Options::parse(s, query);
        let e = |e: strata_io::Error| e.to_string();
        let model = match kind.to_ascii_lowercase().as_str() {
            "hdd" => DeviceModel::Hdd(strata_io::query::take_hdd(&mut opts).map_err(e)?),
            "ssd" => DeviceModel::Ssd(strata_io::query::take_ssd(&mut opts).map_err(e)?),
            _ => return Err(format!("unknown device model '{kind}' (hdd or ssd)")),
        };
        opts.finish().map_err(e)?;
        Ok(model)
    }
}

/// `--cost ORIGIN,CACHE`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostSpec {
    pub origin: DeviceModel,
    pub cache: DeviceModel,
}

impl FromStr for CostSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (origin, cache) = s.split_once(',').ok_or_else(|| format!("'{s}': expected ORIGIN,CACHE, e.g. hdd,ssd"))?;
        Ok(CostSpec { origin: origin.parse()?, cache: cache.parse()? })
    }
}

impl fmt::Display for CostSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "origin {}, cache {}", self.origin, self.cache)
    }
}

fn transfer_s(len: u64, mib_s: f64) -> f64 {
    len as f64 / (mib_s * 1_048_576.0)
}

/// Service time in seconds of an SSD request of `len` bytes: the fixed read or write
/// latency plus transfer at `mib_s`.
pub fn ssd_service_s(p: &SsdParams, len: u64, write: bool) -> f64 {
    let lat_us = if write { p.write_us } else { p.read_us };
    lat_us / 1e6 + transfer_s(len, p.mib_s)
}

/// One modelled device: its head position (HDD) and the work it has done.
#[derive(Clone, Debug)]
pub struct DeviceTimer {
    model: DeviceModel,
    size: u64,
    last_end: u64,
    /// The access the previous IO served, its direction and offset (continuation test).
    last_seq: u64,
    last_write: bool,
    last_offset: u64,
    service_s: f64,
    pub reads: u64,
    pub writes: u64,
}

impl DeviceTimer {
    /// A device of `size` bytes (the HDD's full stroke), head at 0.
    pub fn new(model: DeviceModel, size: u64) -> Self {
        DeviceTimer {
            model,
            size,
            last_end: 0,
            last_seq: u64::MAX,
            last_write: false,
            last_offset: 0,
            service_s: 0.0,
            reads: 0,
            writes: 0,
        }
    }

    /// Serve one request; returns its service time in seconds.
    #[inline]
    pub fn io(&mut self, offset: u64, len: u64, write: bool) -> f64 {
        self.io_continuing(offset, len, write, false)
    }

    /// Serve one IO. `continues`: it is the rest of the IO this device served last (the
    /// next block of the same request), so it costs its transfer only — no positioning on
    /// an HDD, no fixed latency on an SSD.
    #[inline]
    pub fn io_continuing(&mut self, offset: u64, len: u64, write: bool, continues: bool) -> f64 {
        if !continues {
            if write {
                self.writes += 1;
            } else {
                self.reads += 1;
            }
        }
        let t = match &self.model {
            DeviceModel::Hdd(p) if continues => transfer_s(len, p.mib_s),
            DeviceModel::Hdd(p) => p.mean_service_s(self.size, self.last_end, offset, len),
            DeviceModel::Ssd(p) if continues => transfer_s(len, p.mib_s),
            DeviceModel::Ssd(p) => ssd_service_s(p, len, write),
        };
        self.last_end = offset + len;
        self.service_s += t;
        t
    }

    /// Whether an IO for access `seq` at `offset` would continue this device's previous IO:
    /// that IO served access `seq - 1` (the previous block of the same request) in the same
    /// direction, and, on an HDD, ended in the block just before `offset`'s (so a partial
    /// first block, placed at its block's start, still counts).
    #[inline]
    fn continues(&self, seq: u64, offset: u64, write: bool, block_size: u64) -> bool {
        self.last_seq.wrapping_add(1) == seq
            && self.last_write == write
            && match self.model {
                DeviceModel::Hdd(_) => offset == self.last_offset + block_size,
                DeviceModel::Ssd(_) => true,
            }
    }

    #[inline]
    fn mark(&mut self, seq: u64, offset: u64, write: bool) {
        self.last_seq = seq;
        self.last_write = write;
        self.last_offset = offset;
    }

    /// Busy time in seconds (an SSD's work divided over its channels).
    pub fn busy_s(&self) -> f64 {
        match &self.model {
            DeviceModel::Hdd(_) => self.service_s,
            DeviceModel::Ssd(p) => self.service_s / p.channels.max(1) as f64,
        }
    }
}

/// What the cost model reports for one replay.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostReport {
    /// Read requests (a run of read block accesses of one request counts once).
    pub reads: u64,
    /// Sum of their latencies, seconds.
    pub read_latency_s: f64,
    pub origin_busy_s: f64,
    pub cache_busy_s: f64,
    pub origin_reads: u64,
    pub origin_writes: u64,
    pub cache_reads: u64,
    pub cache_writes: u64,
    pub writebacks: u64,
}

impl CostReport {
    /// Mean latency of a read request, microseconds.
    pub fn mean_read_us(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            1e6 * self.read_latency_s / self.reads as f64
        }
    }
}

/// Where each block lies on the modelled origin disk. A trace's devices, volumes or files
/// (its namespaces, 256 TiB apart in byte offsets) lie end to end, each as long as its
/// highest block: the disk is as large as the trace's devices together, and a trace's cost
/// does not depend on how its devices are numbered.
#[derive(Debug)]
pub struct OriginLayout {
    block_size: u64,
    /// Per namespace in order: its first block number and where it starts on the disk.
    parts: Vec<(u64, u64)>,
    /// The disk's size in blocks.
    blocks: u64,
}

impl OriginLayout {
    /// One device of `blocks` blocks.
    pub fn flat(blocks: u64, block_size: u64) -> OriginLayout {
        OriginLayout { block_size, parts: vec![(0, 0)], blocks }
    }

    /// The layout of the namespaces `blocks` (a workload's accesses) fall in.
    pub fn of(blocks: impl Iterator<Item = u64>, block_size: u64) -> OriginLayout {
        let mut last = std::collections::BTreeMap::new();
        for b in blocks {
            let ns = ((b as u128 * block_size as u128) >> NAMESPACE_SHIFT) as u64;
            let e = last.entry(ns).or_insert(b);
            *e = (*e).max(b);
        }
        let (mut parts, mut at) = (Vec::with_capacity(last.len()), 0);
        for (ns, max) in last {
            let first = ((ns as u128) << NAMESPACE_SHIFT).div_ceil(block_size as u128) as u64;
            parts.push((first, at));
            at += max - first + 1;
        }
        if parts.is_empty() {
            parts.push((0, 0));
        }
        OriginLayout { block_size, parts, blocks: at }
    }

    /// The byte offset of `block` on the disk.
    #[inline]
    fn offset(&self, block: u64) -> u64 {
        let i = self.parts.partition_point(|&(first, _)| first <= block).saturating_sub(1);
        let (first, at) = self.parts[i];
        (at + block.saturating_sub(first)) * self.block_size
    }
}

/// The cost model's state during one replay.
#[derive(Debug)]
pub struct CostState {
    layout: std::sync::Arc<OriginLayout>,
    origin: DeviceTimer,
    cache: DeviceTimer,
    /// Block → cache slot, kept only when the cache device is an HDD (where it matters).
    slots: Option<HashMap<u64, u64>>,
    next_slot: u64,
    /// Sequence number of the current access.
    seq: u64,
    /// The previous access's block, time and direction (for request continuation).
    prev: Option<(u64, u64, Op)>,
    reads: u64,
    read_latency_s: f64,
    writebacks: u64,
}

impl CostState {
    /// For a cache of `capacity_blocks` in front of the origin `layout` describes.
    pub fn new(spec: &CostSpec, layout: std::sync::Arc<OriginLayout>, capacity_blocks: usize) -> Self {
        let block_size = layout.block_size;
        CostState {
            origin: DeviceTimer::new(spec.origin, layout.blocks.max(1) * block_size),
            layout,
            cache: DeviceTimer::new(spec.cache, capacity_blocks.max(1) as u64 * block_size),
            slots: matches!(spec.cache, DeviceModel::Hdd(_)).then(HashMap::new),
            next_slot: 0,
            seq: 0,
            prev: None,
            reads: 0,
            read_latency_s: 0.0,
            writebacks: 0,
        }
    }

    /// Blocks `first..first + n` were inserted into the cache before the replay (prefill).
    pub fn prefilled(&mut self, first: u64, n: usize) {
        if let Some(slots) = &mut self.slots {
            for k in 0..n as u64 {
                slots.insert(first + k, self.next_slot);
                self.next_slot += 1;
            }
        }
    }

    #[inline]
    fn slot_offset(&self, block: u64) -> u64 {
        match &self.slots {
            Some(s) => s.get(&block).copied().unwrap_or(0) * self.layout.block_size,
            None => 0,
        }
    }

    #[inline]
    fn place(&mut self, block: u64, evict: Option<u64>) -> u64 {
        let Some(slots) = &mut self.slots else {
            return 0;
        };
        let slot = match evict.and_then(|v| slots.remove(&v)) {
            Some(s) => s,
            None => {
                self.next_slot += 1;
                self.next_slot - 1
            }
        };
        slots.insert(block, slot);
        slot * self.layout.block_size
    }

    /// One IO on the origin (`cache` false) or the cache for the current access, merged
    /// into the device's previous IO when it continues it (same request, next block).
    #[inline]
    fn io(&mut self, cache: bool, offset: u64, len: u64, write: bool, in_request: bool) -> f64 {
        let (seq, bs) = (self.seq, self.layout.block_size);
        let dev = if cache { &mut self.cache } else { &mut self.origin };
        let cont = in_request && dev.continues(seq, offset, write, bs);
        let t = dev.io_continuing(offset, len, write, cont);
        dev.mark(seq, offset, write);
        t
    }

    /// Charge one access and the policy's decision on it.
    #[inline]
    pub fn charge(&mut self, a: &BlockAccess, out: Outcome) {
        let bs = self.layout.block_size;
        let bytes = a.bytes as u64;
        let at = self.layout.offset(a.block);
        // Block accesses of one request come in a row, with the request's time.
        let in_request =
            self.prev.is_some_and(|(b, t, op)| b.wrapping_add(1) == a.block && t == a.time_ns && op == a.op);
        self.prev = Some((a.block, a.time_ns, a.op));
        self.seq += 1;
        if a.op == Op::Read && !in_request {
            self.reads += 1;
        }
        match (a.op, out) {
            (Op::Read, Outcome::Hit) => {
                let off = self.slot_offset(a.block);
                self.read_latency_s += self.io(true, off, bytes, false, in_request);
            }
            (Op::Read, Outcome::Miss) => {
                self.read_latency_s += self.io(false, at, bytes, false, in_request);
            }
            (Op::Read, Outcome::Promote { evict }) => {
                self.read_latency_s += self.io(false, at, bs, false, in_request);
                let off = self.place(a.block, evict);
                self.io(true, off, bs, true, in_request);
            }
            (Op::Write, Outcome::Hit) => {
                let off = self.slot_offset(a.block);
                self.io(true, off, bytes, true, in_request);
                self.io(false, at, bytes, true, in_request);
            }
            (Op::Write, Outcome::Miss) => {
                self.io(false, at, bytes, true, in_request);
            }
            (Op::Write, Outcome::Promote { evict }) => {
                if !a.full {
                    self.io(false, at, bs, false, in_request);
                }
                let off = self.place(a.block, evict);
                self.io(true, off, bs, true, in_request);
                self.io(false, at, bytes, true, in_request);
            }
        }
    }

    /// Charge a readahead neighbour of the block promoted last: the origin read goes on over
    /// it (no seek of its own) and it is written to its cache slot.
    pub fn readahead(&mut self, block: u64) {
        let bs = self.layout.block_size;
        self.origin.io_continuing(self.layout.offset(block), bs, false, true);
        let off = self.place(block, None);
        self.cache.io(off, bs, true);
    }

    /// Charge the write-back of a dirty `block`: a cache read and an origin write of it.
    pub fn writeback(&mut self, block: u64) {
        let off = self.slot_offset(block);
        self.cache.io(off, self.layout.block_size, false);
        self.origin.io(self.layout.offset(block), self.layout.block_size, true);
        self.writebacks += 1;
    }

    pub fn report(&self) -> CostReport {
        CostReport {
            reads: self.reads,
            read_latency_s: self.read_latency_s,
            origin_busy_s: self.origin.busy_s(),
            cache_busy_s: self.cache.busy_s(),
            origin_reads: self.origin.reads,
            origin_writes: self.origin.writes,
            cache_reads: self.cache.reads,
            cache_writes: self.cache.writes,
            writebacks: self.writebacks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn parses_models_like_device_specs() {
        assert_eq!("hdd".parse::<DeviceModel>(), Ok(DeviceModel::Hdd(HddParams::default())));
        assert_eq!("SSD".parse::<DeviceModel>(), Ok(DeviceModel::Ssd(SsdParams::default())));
        let DeviceModel::Hdd(p) = "hdd?rpm=5400&seek_max_ms=20".parse().unwrap() else { panic!() };
        assert_eq!((p.rpm, p.seek_max_ms, p.seek_min_ms), (5400.0, 20.0, 0.5));
        let DeviceModel::Ssd(p) = "ssd:channels=2&read_us=90".parse().unwrap() else { panic!() };
        assert_eq!((p.channels, p.read_us, p.write_us), (2, 90.0, 20.0));
        let err = "hdd?rpn=5400".parse::<DeviceModel>().unwrap_err();
        assert!(err.contains("rpn"), "{err}");
        assert!("hdd?rpm=fast".parse::<DeviceModel>().unwrap_err().contains("rpm"));
        assert!("tape".parse::<DeviceModel>().is_err());
        assert!("ssd?channels=0".parse::<DeviceModel>().is_err());
        let c: CostSpec = "hdd,ssd?write_us=30".parse().unwrap();
        assert_eq!(c.origin, DeviceModel::Hdd(HddParams::default()));
        assert!(matches!(c.cache, DeviceModel::Ssd(p) if p.write_us == 30.0));
        assert!("hdd".parse::<CostSpec>().is_err());
    }

    /// Seek over a quarter of the stroke: sqrt(1/4) = 1/2 of the way from 1 to 9 ms = 5 ms,
    /// plus half a revolution at 6000 rpm (5 ms), plus 4 KiB at 4 MiB/s (0.9765625 ms).
    /// Continuing where the last request ended costs the transfer only.
    #[test]
    fn hdd_timing_by_hand() {
        let p = HddParams { seek_min_ms: 1.0, seek_max_ms: 9.0, rpm: 6000.0, mib_s: 4.0, seed: 1 };
        let size = 16 * 4096;
        assert!(close(p.mean_service_s(size, 4096, 5 * 4096, 4096), 0.0109765625));
        assert!(close(p.mean_service_s(size, 5 * 4096, 4096, 4096), 0.0109765625));
        assert!(close(p.mean_service_s(size, 8192, 8192, 4096), 0.0009765625));
        // Beyond the stroke counts as a full stroke: 9 + 5 ms + transfer.
        assert!(close(p.mean_service_s(size, 0, 100 * 4096, 4096), 0.0149765625));
    }

    /// 100 us + 4 KiB at 400 MiB/s (9.765625 us); two channels halve the busy time.
    #[test]
    fn ssd_timing_by_hand() {
        let p = SsdParams { read_us: 100.0, write_us: 50.0, channels: 2, mib_s: 400.0 };
        assert!(close(ssd_service_s(&p, 4096, false), 109.765625e-6));
        assert!(close(ssd_service_s(&p, 4096, true), 59.765625e-6));
        let mut d = DeviceTimer::new(DeviceModel::Ssd(p), 1 << 20);
        d.io(0, 4096, false);
        d.io(0, 4096, true);
        assert!(close(d.busy_s(), (109.765625e-6 + 59.765625e-6) / 2.0));
        assert_eq!((d.reads, d.writes), (1, 1));
    }

    /// Write-through charges: a partial write promoted reads the block from the origin,
    /// writes it to the cache, and writes the request's bytes to the origin; a write-back is
    /// a cache read and an origin write.
    #[test]
    fn write_and_writeback_charges() {
        let spec: CostSpec =
            "ssd?read_us=100&write_us=50&channels=1&mib_s=400,ssd?read_us=10&write_us=20&channels=1&mib_s=400"
                .parse()
                .unwrap();
        let mut s = CostState::new(&spec, std::sync::Arc::new(OriginLayout::flat(16, 4096)), 4);
        let w = |block, bytes, full, t| BlockAccess { block, time_ns: t, bytes, op: Op::Write, full };
        s.charge(&w(1, 512, false, 1), Outcome::Promote { evict: None });
        s.charge(&w(2, 4096, true, 2), Outcome::Promote { evict: None });
        s.charge(&w(1, 512, false, 3), Outcome::Hit);
        s.charge(&w(3, 512, false, 4), Outcome::Miss);
        s.writeback(2);
        let r = s.report();
        assert_eq!((r.origin_reads, r.origin_writes), (1, 5));
        assert_eq!((r.cache_reads, r.cache_writes), (1, 3));
        assert_eq!((r.reads, r.writebacks), (0, 1));
        let t = |us: f64, bytes: f64| us * 1e-6 + bytes / (400.0 * 1_048_576.0);
        let origin = t(100.0, 4096.0) // the partial promotion's fill
            + t(50.0, 512.0) + t(50.0, 4096.0) + t(50.0, 512.0) + t(50.0, 512.0)
            + t(50.0, 4096.0); // the write-back
        let cache = 2.0 * t(20.0, 4096.0) + t(20.0, 512.0) + t(10.0, 4096.0);
        assert!(close(r.origin_busy_s, origin), "{} vs {origin}", r.origin_busy_s);
        assert!(close(r.cache_busy_s, cache), "{} vs {cache}", r.cache_busy_s);
    }

    /// One read request over blocks 4..7 (time 9): 4 and 5 miss, 6 and 7 hit, 7 partial.
    /// Origin HDD (4 ms seeks, 6000 rpm, 4 MiB/s), head at 0: block 4 pays 4 + 5 +
    /// 0.9765625 ms, block 5 continues it (0.9765625 ms). Cache SSD (read 100 us, 400 MiB/s):
    /// block 6 pays 100 + 9.765625 us, block 7 continues it with 1 KiB (2.44140625 us): one
    /// read request of 9.9765625 + 0.9765625 ms + 112.20703125 us in all. A request at
    /// another time on block 8 starts afresh (positioning again: 9.9765625 ms).
    #[test]
    fn blocks_of_one_request_are_one_io_per_device() {
        let spec: CostSpec =
            "hdd?seek_min_ms=4&seek_max_ms=4&rpm=6000&mib_s=4,ssd?read_us=100&channels=1&mib_s=400".parse().unwrap();
        let mut s = CostState::new(&spec, std::sync::Arc::new(OriginLayout::flat(16, 4096)), 8);
        let r = |block, bytes, t| BlockAccess { block, time_ns: t, bytes, op: Op::Read, full: bytes == 4096 };
        s.charge(&r(4, 4096, 9), Outcome::Miss);
        s.charge(&r(5, 4096, 9), Outcome::Miss);
        s.charge(&r(6, 4096, 9), Outcome::Hit);
        s.charge(&r(7, 1024, 9), Outcome::Hit);
        let first = 0.0099765625 + 0.0009765625 + 109.765625e-6 + 2.44140625e-6;
        let k = s.report();
        assert_eq!((k.reads, k.origin_reads, k.cache_reads), (1, 1, 1));
        assert!(close(k.read_latency_s, first), "{} vs {first}", k.read_latency_s);
        s.charge(&r(8, 4096, 10), Outcome::Miss);
        let k = s.report();
        assert_eq!((k.reads, k.origin_reads), (2, 2));
        assert!(close(k.read_latency_s, first + 0.0099765625));
        assert!(close(k.mean_read_us(), 1e6 * (first + 0.0099765625) / 2.0));
    }
}
