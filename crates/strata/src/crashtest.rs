//! Crash consistency checking: random workloads whose every sector says which write made it,
//! an oracle of what may be on the device after a crash (and what a read may return while
//! requests run concurrently), and the runners behind `strata crashtest`. After a crash each
//! 512-byte sector must hold a value no durable write superseded (made durable by a completed
//! FLUSH or FUA write); any other content is a lost write if it is an older value, and a
//! check failure if it is something never written there at all.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

pub mod ext4;
pub mod faults;
pub mod soak;
pub mod thin;

pub const SECTOR: u64 = 512;

/// What a sector may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Val {
    Zero,
    Id(u64),
    /// After a trim: zeroes or anything ever written there.
    Trimmed,
}

/// One step of the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Write { id: u64, offset: u64, len: u64, fua: bool },
    Flush,
    Trim { offset: u64, len: u64 },
    Zero { offset: u64, len: u64 },
}

/// Bytes of write `id` for the sectors starting at `first`: each sector carries the id and
/// its own number, then a pattern derived from both.
pub fn payload(id: u64, first: u64, sectors: u64) -> Vec<u8> {
    let mut out = vec![0u8; (sectors * SECTOR) as usize];
    for (i, s) in out.chunks_mut(SECTOR as usize).enumerate() {
        let sector = first + i as u64;
        s[..8].copy_from_slice(&id.to_le_bytes());
        s[8..16].copy_from_slice(&sector.to_le_bytes());
        let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ sector.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) | 1;
        for w in s[16..].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
        }
    }
    out
}

/// Whose bytes a sector holds, for reports: its value, or the write id and sector number in
/// its header when it is another sector's data.
pub fn describe_sector(sector: u64, data: &[u8]) -> String {
    match decode(sector, data) {
        Some(v) => format!("{v:?}"),
        None => {
            let id = u64::from_le_bytes(data[..8].try_into().unwrap());
            let at = u64::from_le_bytes(data[8..16].try_into().unwrap());
            if id != 0 && payload(id, at, 1) == data {
                format!("write {id}'s data for sector {at}")
            } else {
                "bytes no write produced".to_string()
            }
        }
    }
}

/// Reads what a sector holds: zeroes, a write's id, or `None` for anything else.
pub fn decode(sector: u64, data: &[u8]) -> Option<Val> {
    if data.iter().all(|&b| b == 0) {
        return Some(Val::Zero);
    }
    let id = u64::from_le_bytes(data[..8].try_into().unwrap());
    (id != 0 && payload(id, sector, 1) == data).then_some(Val::Id(id))
}

/// Not completed (yet).
const PENDING: u64 = u64::MAX;

/// One request as the oracle saw it, on its logical clock.
#[derive(Clone, Copy)]
struct OpRec {
    issued: u64,
    /// When its completion was seen (`PENDING` until then).
    done: u64,
    failed: bool,
    fua: bool,
    flush: bool,
}

#[derive(Clone)]
struct SectorState {
    /// What the sector held at the start (durable).
    init: Val,
    /// Every write, trim and write-zeroes to the sector: its value and its request.
    entries: Vec<(Val, u32)>,
}

/// A request issued to the oracle (`Oracle::begin`), to be ended with `Oracle::end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u32);

/// What may be on a device after a crash, and what a read may return meanwhile, for a
/// workload whose requests may run concurrently. A logical clock orders what the clients saw:
/// each request takes a tick when it is issued and another when its completion is seen.
/// - A write (trim, write-zeroes) is durable once it completed with FUA, or completed before
///   the issue of a flush that then completed successfully.
/// - After a crash a sector may hold any value not superseded by a durable write (`w` is
///   superseded by durable `d` if `w` completed before `d` was issued), the initial content
///   included. An older, superseded value is a lost write; anything never written there is
///   garbage. A trim leaves zeroes or anything ever written there.
/// - A read may return a value issued before the read completed and not superseded by a
///   write that completed before the read was issued.
/// - A failed request's value stays possible for good, and so does whatever the sectors it
///   touched could hold when it failed, until a write issued after the failure is durable.
/// - With `allow_stale`, a sector that may hold its initial content or a trim's may hold
///   anything (a thin pool that skips block zeroing shows a reused block's old data there).
#[derive(Clone)]
pub struct Oracle {
    sectors: Vec<SectorState>,
    ops: Vec<OpRec>,
    now: u64,
    /// Successful flushes: (issued, done).
    flushes: Vec<(u64, u64)>,
    /// Steps issued with `issue` and not ended yet (the sequential interface).
    open: Vec<(Step, Ticket)>,
    stale: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub sectors: u64,
    /// Sectors holding an older value than their last durable one.
    pub lost: u64,
    /// Sectors holding something never written there.
    pub garbage: u64,
}

impl std::ops::AddAssign for Verdict {
    fn add_assign(&mut self, v: Verdict) {
        self.sectors += v.sectors;
        self.lost += v.lost;
        self.garbage += v.garbage;
    }
}

impl Oracle {
    /// A device of `size` bytes that starts all zero.
    pub fn new(size: u64) -> Oracle {
        let init = SectorState { init: Val::Zero, entries: Vec::new() };
        Oracle::with_sectors(vec![init; (size / SECTOR) as usize])
    }

    fn with_sectors(sectors: Vec<SectorState>) -> Oracle {
        Oracle { sectors, ops: Vec::new(), now: 0, flushes: Vec::new(), open: Vec::new(), stale: false }
    }

    /// Lets sectors that may hold their initial content or a trim's hold anything.
    pub fn allow_stale(&mut self) {
        self.stale = true;
    }

    /// Whether `allow_stale` lets a sector hold whatever it holds, given what it may hold.
    fn stale_ok(&self, allowed: &(Vec<Val>, bool)) -> bool {
        self.stale && (allowed.1 || allowed.0.contains(&Val::Trimmed))
    }

    /// An oracle whose durable content is what `image` holds: a run that goes on after a
    /// verified crash starts from there. Sectors holding neither zeroes nor a write (already
    /// counted as failures) are taken as zeroes.
    pub fn from_image(image: &[u8]) -> Oracle {
        let sectors = (image.chunks(SECTOR as usize).enumerate())
            .map(|(i, data)| SectorState { init: decode(i as u64, data).unwrap_or(Val::Zero), entries: Vec::new() })
            .collect();
        Oracle::with_sectors(sectors)
    }

    fn range(offset: u64, len: u64) -> std::ops::Range<usize> {
        (offset / SECTOR) as usize..((offset + len) / SECTOR) as usize
    }

    fn tick(&mut self) -> u64 {
        self.now += 1;
        self.now
    }

    /// The clock now; a read takes its issue time from here (`read_issued`).
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Records that a read is being issued; returns its issue time for `check_read`.
    pub fn read_issued(&mut self) -> u64 {
        self.tick()
    }

    /// Records a request as issued.
    pub fn begin(&mut self, step: &Step) -> Ticket {
        let issued = self.tick();
        let t = Ticket(self.ops.len() as u32);
        let (val, offset, len, fua) = match *step {
            Step::Write { id, offset, len, fua } => (Val::Id(id), offset, len, fua),
            Step::Trim { offset, len } => (Val::Trimmed, offset, len, false),
            Step::Zero { offset, len } => (Val::Zero, offset, len, false),
            Step::Flush => {
                self.ops.push(OpRec { issued, done: PENDING, failed: false, fua: false, flush: true });
                return t;
            }
        };
        self.ops.push(OpRec { issued, done: PENDING, failed: false, fua, flush: false });
        for s in &mut self.sectors[Self::range(offset, len)] {
            s.entries.push((val, t.0));
        }
        t
    }

    /// Records that a request completed (`ok`) or failed.
    pub fn end(&mut self, t: Ticket, ok: bool) {
        let done = self.tick();
        let op = &mut self.ops[t.0 as usize];
        op.done = done;
        op.failed = !ok;
        if op.flush && ok {
            self.flushes.push((op.issued, done));
        }
    }

    /// Records a step as issued (one request of a client that runs one at a time).
    pub fn issue(&mut self, step: &Step) {
        let t = self.begin(step);
        self.open.push((step.clone(), t));
    }

    fn end_step(&mut self, step: &Step, ok: bool) {
        if let Some(i) = self.open.iter().rposition(|(s, _)| s == step) {
            let (_, t) = self.open.remove(i);
            self.end(t, ok);
        }
    }

    /// Records that a step issued with `issue` completed.
    pub fn complete(&mut self, step: &Step) {
        self.end_step(step, true);
    }

    /// Records that a step issued with `issue` failed: it may have landed or not, sector by
    /// sector.
    pub fn fail(&mut self, step: &Step) {
        self.end_step(step, false);
    }

    /// Whether `op` was durable at time `at` (`PENDING`: at the end).
    fn durable_at(&self, op: &OpRec, at: u64) -> bool {
        if op.failed || op.flush || op.done >= at {
            return false;
        }
        op.fua || self.flushes.iter().any(|&(fi, fd)| op.done < fi && fd < at)
    }

    /// The issue time of the newest write to `s` durable at `at`.
    fn durable_issue(&self, s: &SectorState, at: u64) -> Option<u64> {
        (s.entries.iter().map(|&(_, op)| &self.ops[op as usize]))
            .filter(|op| self.durable_at(op, at))
            .map(|op| op.issued)
            .max()
    }

    /// Whether the value of `op` survives a crash at `at` given the newest durable write's
    /// issue `d`.
    fn survives(op: &OpRec, d: Option<u64>) -> bool {
        op.failed || op.done == PENDING || d.is_none_or(|d| op.done > d)
    }

    /// The values sector `s` may hold after a crash now, and whether its initial content is
    /// one of them.
    fn crash_allowed(&self, s: &SectorState) -> (Vec<Val>, bool) {
        let d = self.durable_issue(s, PENDING);
        let mut vals: Vec<Val> = Vec::new();
        let mut init = d.is_none();
        for &(val, op) in &s.entries {
            if Self::survives(&self.ops[op as usize], d) {
                vals.push(val);
            }
        }
        // A failed request pins what the sector could hold when it failed, until a write
        // issued after the failure is durable.
        for &(_, op) in &s.entries {
            let f = &self.ops[op as usize];
            if f.failed && d.is_none_or(|d| d < f.done) {
                let df = self.durable_issue(s, f.done);
                init |= df.is_none();
                for &(val, op) in &s.entries {
                    let e = &self.ops[op as usize];
                    if e.issued < f.done && Self::survives(e, df) {
                        vals.push(val);
                    }
                }
            }
        }
        (vals, init)
    }

    /// The values a read of sector `s` issued at `issued` and completed now may return.
    fn read_allowed(&self, s: &SectorState, issued: u64) -> (Vec<Val>, bool) {
        let issued_before_end = |op: &OpRec| op.issued < self.now;
        if s.entries.iter().any(|&(_, op)| self.ops[op as usize].failed) {
            let vals = s.entries.iter().filter(|&&(_, op)| issued_before_end(&self.ops[op as usize])).map(|e| e.0);
            return (vals.collect(), true);
        }
        let d = (s.entries.iter().map(|&(_, op)| &self.ops[op as usize]))
            .filter(|op| op.done < issued)
            .map(|op| op.issued)
            .max();
        let vals = (s.entries.iter())
            .filter(|&&(_, op)| {
                let op = &self.ops[op as usize];
                issued_before_end(op) && (op.done == PENDING || d.is_none_or(|d| op.done > d))
            })
            .map(|e| e.0);
        (vals.collect(), d.is_none())
    }

    fn matches(s: &SectorState, allowed: &(Vec<Val>, bool), val: Val) -> bool {
        let ever = |id: u64| s.init == Val::Id(id) || s.entries.iter().any(|e| e.0 == Val::Id(id));
        let one = |a: Val| match (a, val) {
            (Val::Trimmed, Val::Zero) => true,
            (Val::Trimmed, Val::Id(id)) => ever(id),
            (a, b) => a == b,
        };
        (allowed.1 && one(s.init)) || allowed.0.iter().any(|&a| one(a))
    }

    /// Whether `val` was ever written to sector `s` (or is its initial content).
    fn ever(s: &SectorState, val: Val) -> bool {
        match val {
            Val::Zero => true,
            Val::Id(id) => s.init == Val::Id(id) || s.entries.iter().any(|e| e.0 == Val::Id(id)),
            Val::Trimmed => false,
        }
    }

    /// Whether `val` was ever written to sector `sector` (or is its initial content).
    pub fn ever_written(&self, sector: u64, val: Val) -> bool {
        Self::ever(&self.sectors[sector as usize], val)
    }

    /// Checks a device image (or the part of it starting at sector 0) against what a crash
    /// now may leave.
    pub fn verify(&self, image: &[u8]) -> Verdict {
        let mut v = Verdict::default();
        for (i, s) in self.sectors.iter().enumerate() {
            let data = &image[i * SECTOR as usize..(i + 1) * SECTOR as usize];
            v.sectors += 1;
            let allowed = self.crash_allowed(s);
            match decode(i as u64, data) {
                Some(val) if Self::matches(s, &allowed, val) => {}
                _ if self.stale_ok(&allowed) => {}
                Some(val) if Self::ever(s, val) => v.lost += 1,
                _ => v.garbage += 1,
            }
        }
        v
    }

    /// Checks what a read issued at `issued` (from `read_issued`) returned at `offset`, now
    /// that it completed. `lenient`: the devices below lost data (a failed flush), so the read
    /// may return anything a crash now could leave. Returns the sectors it may not hold.
    pub fn check_read(&mut self, offset: u64, data: &[u8], issued: u64, lenient: bool) -> Vec<u64> {
        self.tick();
        let first = offset / SECTOR;
        let mut wrong = Vec::new();
        for (i, d) in data.chunks(SECTOR as usize).enumerate() {
            let sector = first + i as u64;
            let s = &self.sectors[sector as usize];
            let val = decode(sector, d);
            let fits = |allowed: &(Vec<Val>, bool)| {
                val.is_some_and(|v| Self::matches(s, allowed, v)) || self.stale_ok(allowed)
            };
            let ok = fits(&self.read_allowed(s, issued)) || (lenient && fits(&self.crash_allowed(s)));
            if !ok {
                wrong.push(sector);
            }
        }
        wrong
    }

    /// Whether sector `sector` of a crash image may hold `data`.
    pub fn verify_sector(&self, sector: u64, data: &[u8]) -> bool {
        let s = &self.sectors[sector as usize];
        let allowed = self.crash_allowed(s);
        matches!(decode(sector, data), Some(val) if Self::matches(s, &allowed, val)) || self.stale_ok(&allowed)
    }

    /// What the oracle allows in sector `sector` after a crash now, for reports.
    pub fn explain(&self, sector: u64) -> String {
        let s = &self.sectors[sector as usize];
        let (vals, init) = self.crash_allowed(s);
        let entries: Vec<String> = (s.entries.iter())
            .map(|&(v, op)| {
                let o = &self.ops[op as usize];
                let done = if o.done == PENDING { "-".to_string() } else { o.done.to_string() };
                format!(
                    "{v:?}@{}..{done}{}{}",
                    o.issued,
                    if o.fua { " fua" } else { "" },
                    if o.failed { " failed" } else { "" }
                )
            })
            .collect();
        format!("allowed {vals:?} (initial {:?}: {init}); history {}", s.init, entries.join(", "))
    }
}

/// A random mixed workload over the first `span` bytes of a device: writes of many sizes
/// (some FUA), flushes, trims and write-zeroes, all sector aligned.
pub fn workload(seed: u64, steps: usize, span: u64) -> Vec<Step> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let sectors = span / SECTOR;
    let mut next_id = seed.wrapping_mul(1_000_000) + 1;
    (0..steps)
        .map(|_| {
            let len_sectors = match rng.gen_range(0..10) {
                0..=4 => rng.gen_range(1..=8),
                5..=7 => rng.gen_range(8..=128),
                _ => rng.gen_range(128..=512),
            }
            .min(sectors);
            let first = rng.gen_range(0..=sectors - len_sectors);
            let (offset, len) = (first * SECTOR, len_sectors * SECTOR);
            match rng.gen_range(0..100) {
                0..=69 => {
                    next_id += 1;
                    Step::Write { id: next_id, offset, len, fua: rng.gen_bool(0.1) }
                }
                70..=84 => Step::Flush,
                85..=92 => Step::Trim { offset, len },
                _ => Step::Zero { offset, len },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: u64, sector: u64, n: u64, fua: bool) -> Step {
        Step::Write { id, offset: sector * SECTOR, len: n * SECTOR, fua }
    }

    fn image(sectors: &[Option<u64>]) -> Vec<u8> {
        let mut img = vec![0u8; sectors.len() * SECTOR as usize];
        for (i, id) in sectors.iter().enumerate() {
            if let Some(id) = id {
                img[i * 512..(i + 1) * 512].copy_from_slice(&payload(*id, i as u64, 1));
            }
        }
        img
    }

    #[test]
    fn oracle_accepts_durable_and_later_values_only() {
        let mut o = Oracle::new(4 * SECTOR);
        let w1 = Step::Write { id: 1, offset: 0, len: 2 * SECTOR, fua: false };
        let w2 = Step::Write { id: 2, offset: 0, len: SECTOR, fua: false };
        o.issue(&w1);
        o.complete(&w1);
        o.issue(&Step::Flush);
        o.complete(&Step::Flush);
        o.issue(&w2);
        o.complete(&w2);
        let mut img = vec![0u8; 4 * 512];
        img[..1024].copy_from_slice(&payload(1, 0, 2));
        assert_eq!(o.verify(&img), Verdict { sectors: 4, lost: 0, garbage: 0 });
        img[..512].copy_from_slice(&payload(2, 0, 1));
        assert_eq!(o.verify(&img).lost, 0, "a later unflushed write may survive");
        img[512..1024].fill(0);
        assert_eq!(o.verify(&img).lost, 1, "sector 1 lost its flushed write");
        img[1024..1536].copy_from_slice(&payload(1, 2, 1));
        assert_eq!(o.verify(&img).garbage, 1, "write 1 never reached sector 2");
        img[1024..1536].fill(0);
        img[1536 + 100] = 1;
        assert_eq!(o.verify(&img).garbage, 1, "bytes no write produced");
    }

    #[test]
    fn a_flush_covers_only_writes_completed_before_its_issue() {
        let mut o = Oracle::new(2 * SECTOR);
        let a = o.begin(&w(1, 0, 1, false));
        let f = o.begin(&Step::Flush);
        o.end(a, true); // completed while the flush was in flight: not covered
        let b = o.begin(&w(2, 1, 1, false));
        o.end(b, true);
        o.end(f, true);
        assert_eq!(o.verify(&image(&[None, None])), Verdict { sectors: 2, lost: 0, garbage: 0 });
        let g = o.begin(&Step::Flush);
        o.end(g, true);
        assert_eq!(o.verify(&image(&[None, Some(2)])).lost, 1, "write 1 is durable now");
        assert_eq!(o.verify(&image(&[Some(1), None])).lost, 1, "write 2 is durable now");
    }

    #[test]
    fn overlapping_writes_in_flight_together_may_land_either_way() {
        let mut o = Oracle::new(SECTOR);
        let a = o.begin(&w(1, 0, 1, false));
        let b = o.begin(&w(2, 0, 1, false));
        o.end(b, true);
        o.end(a, true);
        let f = o.begin(&Step::Flush);
        o.end(f, true);
        // Both durable, neither completed before the other was issued: either may win.
        assert_eq!(o.verify(&image(&[Some(1)])).lost, 0);
        assert_eq!(o.verify(&image(&[Some(2)])).lost, 0);
        assert_eq!(o.verify(&image(&[None])).lost, 1);
        // A third write issued after both completed, then FUA: the only value left.
        let c = o.begin(&w(3, 0, 1, true));
        o.end(c, true);
        assert_eq!(o.verify(&image(&[Some(1)])).lost, 1);
        assert_eq!(o.verify(&image(&[Some(3)])).lost, 0);
    }

    #[test]
    fn a_write_in_flight_at_the_crash_may_or_may_not_be_there() {
        let mut o = Oracle::new(SECTOR);
        let a = o.begin(&w(1, 0, 1, true));
        o.end(a, true);
        let _b = o.begin(&w(2, 0, 1, true)); // never completes
        assert_eq!(o.verify(&image(&[Some(1)])).lost, 0);
        assert_eq!(o.verify(&image(&[Some(2)])).lost, 0);
        assert_eq!(o.verify(&image(&[None])).lost, 1);
        // Even a later durable write does not supersede a write that never completed.
        let c = o.begin(&w(3, 0, 1, true));
        o.end(c, true);
        assert_eq!(o.verify(&image(&[Some(2)])).lost, 0);
        assert_eq!(o.verify(&image(&[Some(1)])).lost, 1);
    }

    #[test]
    fn reads_see_completed_writes_and_maybe_those_in_flight() {
        let mut o = Oracle::new(SECTOR);
        let a = o.begin(&w(1, 0, 1, false));
        o.end(a, true);
        let r = o.read_issued();
        let b = o.begin(&w(2, 0, 1, false)); // in flight during the read
        assert!(o.check_read(0, &image(&[Some(1)]), r, false).is_empty());
        let r = o.read_issued();
        assert!(o.check_read(0, &image(&[Some(2)]), r, false).is_empty(), "a write in flight may be seen");
        assert_eq!(o.check_read(0, &image(&[None]), r, false), [0], "write 1 completed before the read");
        o.end(b, true);
        let r = o.read_issued();
        assert_eq!(o.check_read(0, &image(&[Some(1)]), r, false), [0], "stale read");
        // Not flushed: a crash may lose it, so a lenient read (the devices lost data) may too.
        assert!(o.check_read(0, &image(&[Some(1)]), r, true).is_empty());
        let r = o.read_issued();
        let c = o.begin(&w(3, 0, 1, false));
        o.end(c, true);
        assert!(
            o.check_read(0, &image(&[Some(2)]), r, false).is_empty(),
            "write 3 completed after the read was issued"
        );
        let r = o.read_issued();
        assert_eq!(o.check_read(0, &image(&[Some(7)]), r, true), [0], "never written");
    }

    #[test]
    fn a_failed_request_keeps_its_value_and_what_was_there() {
        let mut o = Oracle::new(SECTOR);
        let a = o.begin(&w(1, 0, 1, true));
        o.end(a, true);
        let b = o.begin(&w(2, 0, 1, false));
        o.end(b, false);
        let f = o.begin(&Step::Flush);
        o.end(f, true);
        assert_eq!(o.verify(&image(&[Some(1)])).lost, 0);
        assert_eq!(o.verify(&image(&[Some(2)])).lost, 0);
        let c = o.begin(&w(3, 0, 1, true));
        o.end(c, true);
        assert_eq!(o.verify(&image(&[Some(1)])).lost, 1, "write 3 is durable after the failure");
        assert_eq!(o.verify(&image(&[Some(2)])).lost, 0, "a failed value stays possible");
    }

    #[test]
    fn trims_allow_zeroes_or_anything_written() {
        let mut o = Oracle::new(SECTOR);
        let a = o.begin(&w(1, 0, 1, true));
        o.end(a, true);
        let t = o.begin(&Step::Trim { offset: 0, len: SECTOR });
        o.end(t, true);
        let f = o.begin(&Step::Flush);
        o.end(f, true);
        assert_eq!(o.verify(&image(&[None])).lost, 0);
        assert_eq!(o.verify(&image(&[Some(1)])).lost, 0);
        assert_eq!(o.verify(&image(&[Some(9)])).garbage, 1);
    }
}

/// The target a kill -9 point serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    Cache,
    Writecache,
    /// Volume 1 of a thin pool (the "cache" is the metadata device, the "origin" the data
    /// device), snapshotted offline at some flush boundaries of the workload.
    Thin,
}

impl Killed {
    /// Its spec prefix and its command's name.
    fn word(self) -> &'static str {
        match self {
            Killed::Cache => "cache",
            Killed::Writecache => "writecache",
            Killed::Thin => "thin",
        }
    }
}

/// How a kill -9 crash point is set up.
pub struct KillSetup {
    /// What is served and killed.
    pub target: Killed,
    /// The strata binary to run as the server.
    pub strata: std::path::PathBuf,
    /// Scratch directory (one subdirectory per point).
    pub dir: std::path::PathBuf,
    pub origin_bytes: u64,
    pub cache_bytes: u64,
    pub steps: usize,
    /// Thin: whether the pool skips block zeroing (None: odd seeds do).
    pub skip_zeroing: Option<bool>,
}

/// The outcome of one crash point.
#[derive(Debug, Clone)]
pub struct PointOutcome {
    pub seed: u64,
    pub verdict: Verdict,
    /// `strata cache check` failed (after the crash, or after the recovered run); in the
    /// power-cut runs also wrong reads, failed target checks and unstable sectors.
    pub check_failures: u32,
    /// Power-cut runs: sectors that read differently after write-back and eviction than
    /// just after recovery (also counted in `check_failures`).
    pub unstable: u64,
    pub detail: String,
}

struct ServerProc {
    child: std::process::Child,
}

impl ServerProc {
    fn start(strata: &Path, sock: &Path, target: Killed, cache: &Path, log: &Path) -> anyhow::Result<Self> {
        Self::serve(strata, sock, &[format!("vol={}:{}", target.word(), cache.display())], log)
    }

    /// Serves `exports` (NAME=SPEC each) on `sock`.
    fn serve(strata: &Path, sock: &Path, exports: &[String], log: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_file(sock);
        let child = std::process::Command::new(strata)
            .args(["serve", "--unix"])
            .arg(sock)
            .args(exports)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(log)?)
            .spawn()?;
        let mut me = ServerProc { child };
        for _ in 0..400 {
            if std::os::unix::net::UnixStream::connect(sock).is_ok() {
                return Ok(me);
            }
            if let Some(st) = me.child.try_wait()? {
                anyhow::bail!("server exited ({st}): {}", std::fs::read_to_string(log).unwrap_or_default());
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        me.kill();
        anyhow::bail!("server never listened on {}", sock.display())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let st = self.child.wait()?;
        anyhow::ensure!(st.success(), "server exited with {st} at SIGTERM");
        Ok(())
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

type UnixClient = strata_nbd::client::Client<tokio::net::UnixStream>;

async fn apply(c: &mut UnixClient, step: &Step) -> std::io::Result<()> {
    apply_at(c, step, 0).await
}

/// Applies a step of a workload over a region starting at `base` (sectors are numbered from
/// the region's start, as the oracle numbers them).
async fn apply_at(c: &mut UnixClient, step: &Step, base: u64) -> std::io::Result<()> {
    match *step {
        Step::Write { id, offset, len, fua } => {
            c.write(base + offset, &payload(id, offset / SECTOR, len / SECTOR), fua).await
        }
        Step::Flush => c.flush().await,
        Step::Trim { offset, len } => c.trim(base + offset, len as u32).await,
        Step::Zero { offset, len } => c.write_zeroes(base + offset, len as u32, false).await,
    }
}

/// Reads the first `len` bytes of export `name` on `sock`.
async fn read_export(sock: &Path, name: String, len: u64) -> anyhow::Result<Vec<u8>> {
    let mut c = strata_nbd::client::Client::connect_unix(sock, &name).await?;
    let image = read_region(&mut c, 0, len).await?;
    c.disconnect().await?;
    Ok(image)
}

/// Reads `len` bytes at `offset` over NBD, a MiB at a time.
async fn read_region(c: &mut UnixClient, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut image = Vec::with_capacity(len as usize);
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(1 << 20);
        image.extend_from_slice(&c.read(offset + pos, n as u32).await?);
        pos += n;
    }
    Ok(image)
}

/// `strata cache create` of a writeback cache for the crash runs: no migration budget limit,
/// no sequential cutoff, write-back above 30% dirty.
fn create_cache(
    strata: &Path,
    origin: &Path,
    origin_bytes: u64,
    cache: &Path,
    cache_bytes: u64,
    block: &str,
) -> anyhow::Result<()> {
    let opts =
        ["--block-size", block, "--migration-budget", "0", "--sequential-cutoff", "0", "--writeback-percent", "30"];
    create_target(strata, Killed::Cache, (origin, origin_bytes), (cache, cache_bytes), &opts)
}

/// `strata cache create` or `strata writecache create` (the write log with 4 KiB blocks and
/// default tunables: write-back runs while the workload does) with `opts`.
fn create_target(
    strata: &Path,
    target: Killed,
    (origin, origin_bytes): (&Path, u64),
    (cache, cache_bytes): (&Path, u64),
    opts: &[&str],
) -> anyhow::Result<()> {
    let out = std::process::Command::new(strata)
        .args([target.word(), "create", "--origin"])
        .arg(format!("{}?size={origin_bytes}", origin.display()))
        .arg("--cache")
        .arg(format!("{}?size={cache_bytes}", cache.display()))
        .args(opts)
        .output()?;
    anyhow::ensure!(out.status.success(), "{} create: {}", target.word(), String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// `strata cache check CACHE` (or `writecache check`): `None` when it passes, its report when
/// it does not.
fn target_check(strata: &Path, target: Killed, cache: &Path) -> anyhow::Result<Option<String>> {
    let out = std::process::Command::new(strata).args([target.word(), "check"]).arg(cache).output()?;
    if !out.status.success() {
        return Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    if target == Killed::Thin {
        return Ok(thin::thin_check_file(cache)?.map(|t| format!("thin_check: {t}")));
    }
    Ok(None)
}

/// One kill -9 crash point: a writeback cache (or a write log) over a file origin is driven
/// by a random workload through NBD and killed at a seeded step (mid-request); then the
/// metadata is checked, the target restarted, every sector verified against the oracle, and
/// the metadata checked again after a clean stop.
pub async fn kill_point(setup: &KillSetup, seed: u64) -> anyhow::Result<PointOutcome> {
    let dir = setup.dir.join(format!("point-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (origin, cache, sock, log) =
        (dir.join("origin.img"), dir.join("cache.img"), dir.join("s.sock"), dir.join("server.log"));
    match setup.target {
        Killed::Cache => create_cache(&setup.strata, &origin, setup.origin_bytes, &cache, setup.cache_bytes, "32KiB")?,
        Killed::Writecache => {
            let (o, c) = ((origin.as_path(), setup.origin_bytes), (cache.as_path(), setup.cache_bytes));
            create_target(&setup.strata, Killed::Writecache, o, c, &[])?
        }
        Killed::Thin => thin::create_pool(&setup.strata, (&cache, setup.cache_bytes), (&origin, setup.origin_bytes))?,
    }

    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let steps = workload(seed, setup.steps, setup.origin_bytes);
    let kill_at = rng.gen_range(setup.steps / 4..setup.steps);
    let mut oracle = Oracle::new(setup.origin_bytes);
    let skip_zeroing = setup.skip_zeroing.unwrap_or(seed % 2 == 1);
    if setup.target == Killed::Thin && skip_zeroing {
        oracle.allow_stale();
    }
    // Thin: snapshots after some flushes (the server stopped meanwhile), each with what the
    // volume held then; a snapshot deleted after the next is taken, at some points.
    let mut snapshots: Vec<(u32, Oracle)> = Vec::new();
    let snap_at = match setup.target {
        Killed::Thin => thin::snapshot_steps(&steps[..kill_at], &mut rng),
        _ => Vec::new(),
    };
    let exports = |snaps: &[(u32, Oracle)]| match setup.target {
        Killed::Thin => thin::exports(&cache, skip_zeroing, snaps.iter().map(|s| s.0)),
        t => vec![format!("vol={}:{}", t.word(), cache.display())],
    };
    let mut detail = String::new();
    let mut server = ServerProc::serve(&setup.strata, &sock, &exports(&snapshots), &log)?;
    {
        let mut c = strata_nbd::client::Client::connect_unix(&sock, "vol").await?;
        for (i, step) in steps[..kill_at].iter().enumerate() {
            oracle.issue(step);
            apply(&mut c, step).await?;
            oracle.complete(step);
            if let Some(&(_, delete_first)) = snap_at.iter().find(|s| s.0 == i) {
                c.disconnect().await?;
                server.stop()?;
                let id = snapshots.last().map_or(2, |s| s.0 + 1);
                thin::offline(&setup.strata, &["snapshot", &cache.display().to_string(), "1", &id.to_string()])?;
                snapshots.push((id, oracle.clone()));
                detail.push_str(&format!("snapshot {id} after step {i}\n"));
                if delete_first && snapshots.len() > 1 {
                    let first = snapshots.remove(0).0;
                    thin::offline(&setup.strata, &["delete", &cache.display().to_string(), &first.to_string()])?;
                    detail.push_str(&format!("snapshot {first} deleted\n"));
                }
                server = ServerProc::serve(&setup.strata, &sock, &exports(&snapshots), &log)?;
                c = strata_nbd::client::Client::connect_unix(&sock, "vol").await?;
            }
        }
        // The last step is in flight when the server dies.
        let last = steps[kill_at].clone();
        oracle.issue(&last);
        let delay = std::time::Duration::from_micros(rng.gen_range(0..3000));
        let inflight = tokio::spawn(async move {
            let _ = apply(&mut c, &last).await;
        });
        tokio::time::sleep(delay).await;
        server.kill();
        inflight.abort();
    }

    let mut check_failures = 0;
    if let Some(report) = target_check(&setup.strata, setup.target, &cache)? {
        check_failures += 1;
        detail.push_str(&format!("check after crash: {report}\n"));
    }
    let server = ServerProc::serve(&setup.strata, &sock, &exports(&snapshots), &log)?;
    let read_export = |name: String| read_export(&sock, name, setup.origin_bytes);
    let block = if setup.target == Killed::Thin { thin::THIN_BLOCK } else { CRASH_BLOCK };
    let mut verdict = verify_image(&oracle, &read_export("vol".into()).await?, "", block, &mut detail);
    for (id, o) in &snapshots {
        let image = read_export(format!("snap{id}")).await?;
        verdict += verify_image(o, &image, &format!("snapshot {id}: "), block, &mut detail);
    }
    server.stop()?;
    if let Some(report) = target_check(&setup.strata, setup.target, &cache)? {
        check_failures += 1;
        detail.push_str(&format!("check after recovery: {report}\n"));
    }
    if verdict.lost == 0 && verdict.garbage == 0 && check_failures == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        detail.push_str(&format!("kept {} for inspection; killed at step {kill_at}\n", dir.display()));
    }
    Ok(PointOutcome { seed, verdict, check_failures, unstable: 0, detail })
}

/// Formats and opens the writeback cache of the in-process crash runs over `cache` and
/// `origin`: 32 KiB blocks, no migration budget limit, no sequential cutoff, write-back above
/// 30% dirty, the policy seeded by `seed`.
pub async fn writeback_cache(
    cache: std::sync::Arc<dyn strata_io::BlockDev>,
    origin: std::sync::Arc<dyn strata_io::BlockDev>,
    seed: u64,
) -> anyhow::Result<strata_cache::CacheDev> {
    use strata_cache::meta::Meta;
    use strata_cache::{offline::create, CreateOptions};
    use strata_cache::{CacheDev, OpenOptions};
    let opts = CreateOptions {
        block_bytes: 32 << 10,
        migration_budget_bytes_per_s: 0,
        sequential_cutoff_bytes: 0,
        writeback_percent: 30,
        origin_spec: "mem:crash".into(),
        ..CreateOptions::default()
    };
    create(&*cache, &*origin, &opts).await?;
    let (meta, _) = Meta::load(&*cache).await?;
    Ok(CacheDev::open(cache, origin, meta, OpenOptions { seed, ..OpenOptions::default() }).await?)
}

/// Restarts a target from the images a power cut left of its cache device and origin: opens
/// it (recovering it, and checking what it found), checks it, reads the whole volume, shuts
/// it down and checks what it leaves. Returns the volume's content, the number of problems
/// found and what they were.
pub async fn recover<T: CrashTarget>(
    target: &T,
    cache_img: strata_io::mem::MemDev,
    origin_img: strata_io::mem::MemDev,
) -> anyhow::Result<(strata_io::Buf, u32, String)> {
    use std::sync::Arc;
    use strata_io::{BlockDev, Buf};

    let (cache_img, origin_img) = (Arc::new(cache_img), Arc::new(origin_img));
    let size = origin_img.size();
    let (vol, mut problems) = target.reopen(cache_img.clone(), origin_img).await?;
    problems.extend(target.check(&vol).await);
    let image = vol.read(0, Buf::zeroed(size as usize)).await?;
    problems.extend(target.close(vol, cache_img).await);
    let detail = problems.iter().map(|p| format!("{p}\n")).collect();
    Ok((image, problems.len() as u32, detail))
}

// ------------------------------------------------------------------- power-cut runs

/// A target the power-cut runs can crash: formatted and opened over a cache device and an
/// origin (both `PowerCut` devices with an in-flight window, on one clock), driven by
/// concurrent clients, cut, reopened from the crash images and checked. The cache target is
/// the first (`CacheTarget`).
pub trait CrashTarget: Send + Sync + 'static {
    type Vol: strata_io::BlockDev;

    /// The modes a run can be made in (the first is the default).
    fn modes(&self) -> Vec<String>;

    /// Formats a volume over `cache` and `origin` in `mode`, and opens it.
    fn create(
        &self,
        cache: std::sync::Arc<dyn strata_io::BlockDev>,
        origin: std::sync::Arc<dyn strata_io::BlockDev>,
        mode: &str,
        seed: u64,
    ) -> impl std::future::Future<Output = anyhow::Result<Self::Vol>> + Send;

    /// Scripts of control messages (`BlockDev::message`) a run in `mode` may send, spread
    /// over the run, one script per run.
    fn scripts(&self, mode: &str) -> Vec<Vec<String>>;

    /// Opens the volume again from the crash images; returns it and the problems checking
    /// the images found.
    fn reopen(
        &self,
        cache: std::sync::Arc<strata_io::mem::MemDev>,
        origin: std::sync::Arc<strata_io::mem::MemDev>,
    ) -> impl std::future::Future<Output = anyhow::Result<(Self::Vol, Vec<String>)>> + Send;

    /// Checks of a recovered volume beyond its content (problems found).
    fn check(&self, vol: &Self::Vol) -> impl std::future::Future<Output = Vec<String>> + Send;

    /// Moves the data of a recovered volume to other places (write back, evict) so that a
    /// second read goes other ways; returns problems and notes.
    fn settle(&self, vol: &Self::Vol) -> impl std::future::Future<Output = (Vec<String>, Vec<String>)> + Send;

    /// Takes a recovered volume down cleanly and checks what it leaves (problems found).
    fn close(
        &self,
        vol: Self::Vol,
        cache: std::sync::Arc<strata_io::mem::MemDev>,
    ) -> impl std::future::Future<Output = Vec<String>> + Send;

    /// The block the clients' requests are shaped by: whole blocks, sectors inside one,
    /// extents across a boundary (32 KiB unless the target's own block is another size).
    fn block_bytes(&self) -> u64 {
        CRASH_BLOCK
    }

    /// Bytes of the origin device under a volume of `volume_bytes` (a thin pool's data device
    /// also holds its snapshots' blocks).
    fn origin_bytes(&self, volume_bytes: u64) -> u64 {
        volume_bytes
    }

    /// Whether sectors never written (or trimmed) may read as stale data in `mode` (a thin
    /// pool that skips block zeroing), not only as zeroes or what was written there.
    fn stale_reads(&self, _mode: &str) -> bool {
        false
    }

    /// Snapshots the volume as volume `id`, durably. A script's `snapshot` calls it with
    /// every client quiet, and the run counts it as a flush: the snapshot must then hold what
    /// the volume held. Targets without snapshots have no such script.
    fn snapshot(&self, _vol: &Self::Vol, _id: u32) -> impl std::future::Future<Output = anyhow::Result<()>> + Send {
        async { anyhow::bail!("this target takes no snapshots") }
    }

    /// Deletes snapshot `id`, durably (a script's `delete snapshot`: the oldest one left).
    fn delete_snapshot(
        &self,
        _vol: &Self::Vol,
        _id: u32,
    ) -> impl std::future::Future<Output = anyhow::Result<()>> + Send {
        async { anyhow::bail!("this target takes no snapshots") }
    }

    /// Snapshot `id` of a recovered volume, to read.
    fn open_snapshot(&self, _vol: &Self::Vol, _id: u32) -> anyhow::Result<std::sync::Arc<dyn strata_io::BlockDev>> {
        anyhow::bail!("this target takes no snapshots")
    }

    /// Whether the fast device holds data beside its metadata (`data_offset` says where):
    /// the fault matrix then has a cell for each. (A thin pool's metadata device holds none.)
    fn fast_data_area(&self) -> bool {
        false
    }

    /// Where the data area of the fast device `cache` of a volume made by `create` starts.
    fn data_offset(
        &self,
        _cache: &dyn strata_io::BlockDev,
    ) -> impl std::future::Future<Output = anyhow::Result<Option<u64>>> + Send {
        async { Ok(None) }
    }

    /// Whether the volume stopped after a failed flush: it then refuses writes and flushes
    /// until restarted (`stopped` in its status).
    fn stopped(&self, vol: &Self::Vol) -> bool {
        strata_io::BlockDev::status(vol).is_some_and(|s| s["stopped"].is_string())
    }

    /// Whether a stopped volume serves what it last committed (reads may then show what a
    /// crash would leave), rather than refusing what may be gone.
    fn serves_last_commit_when_stopped(&self) -> bool {
        false
    }

    /// Whether the fast device `cache` says its volume was shut down cleanly (a mark that
    /// spares the next open its recovery); `None` for a target that keeps no such mark.
    fn marked_clean(
        &self,
        _cache: &dyn strata_io::BlockDev,
    ) -> impl std::future::Future<Output = anyhow::Result<Option<bool>>> + Send {
        async { Ok(None) }
    }
}

/// The cache target (`strata_cache::CacheDev`) as a `CrashTarget`: 32 KiB blocks, no
/// migration budget limit, no sequential cutoff, write-back above 5% dirty.
pub struct CacheTarget;

impl CrashTarget for CacheTarget {
    type Vol = strata_cache::CacheDev;

    fn modes(&self) -> Vec<String> {
        strata_cache::format::Mode::NAMES.iter().map(|m| m.to_string()).collect()
    }

    async fn create(
        &self,
        cache: std::sync::Arc<dyn strata_io::BlockDev>,
        origin: std::sync::Arc<dyn strata_io::BlockDev>,
        mode: &str,
        seed: u64,
    ) -> anyhow::Result<strata_cache::CacheDev> {
        use strata_cache::meta::Meta;
        use strata_cache::{offline::create, CreateOptions};
        use strata_cache::{CacheDev, OpenOptions};
        let opts = CreateOptions {
            block_bytes: 32 << 10,
            mode: mode.parse().map_err(anyhow::Error::msg)?,
            migration_budget_bytes_per_s: 0,
            sequential_cutoff_bytes: 0,
            writeback_percent: 5,
            origin_spec: "mem:crash".into(),
            ..CreateOptions::default()
        };
        create(&*cache, &*origin, &opts).await?;
        let (meta, _) = Meta::load(&*cache).await?;
        Ok(CacheDev::open(cache, origin, meta, OpenOptions { seed, ..OpenOptions::default() }).await?)
    }

    fn scripts(&self, mode: &str) -> Vec<Vec<String>> {
        let back = format!("mode {mode}");
        let s = |v: &[&str]| v.iter().map(|m| m.to_string()).collect::<Vec<_>>();
        vec![
            vec![],
            s(&["flush"]),
            s(&["flush", "flush"]),
            vec!["mode writeback".into(), back.clone()],
            vec!["mode writethrough".into(), back.clone()],
            vec!["mode writearound".into(), back.clone()],
            vec!["mode passthrough".into(), back.clone()],
            vec!["mode writeback".into(), "flush".into(), "mode writethrough".into(), back],
            s(&["detach"]),
        ]
    }

    async fn reopen(
        &self,
        cache: std::sync::Arc<strata_io::mem::MemDev>,
        origin: std::sync::Arc<strata_io::mem::MemDev>,
    ) -> anyhow::Result<(strata_cache::CacheDev, Vec<String>)> {
        use strata_cache::meta::Meta;
        use strata_cache::{CacheDev, OpenOptions};
        let mut problems = Vec::new();
        let (meta, findings) = Meta::load(&*cache).await?;
        if !findings.errors.is_empty() {
            problems.push(format!("metadata check after the cut: {:?}", findings.errors));
        }
        Ok((CacheDev::open(cache, origin, meta, OpenOptions::default()).await?, problems))
    }

    async fn marked_clean(&self, cache: &dyn strata_io::BlockDev) -> anyhow::Result<Option<bool>> {
        Ok(Some(strata_cache::meta::read_superblock(cache).await?.clean_shutdown))
    }

    async fn check(&self, vol: &strata_cache::CacheDev) -> Vec<String> {
        let mut problems = match vol.verify_clean().await {
            Ok(blocks) if blocks.is_empty() => Vec::new(),
            Ok(blocks) => vec![format!("clean cached blocks differ from the origin: {blocks:?}")],
            Err(e) => vec![format!("verify_clean: {e}")],
        };
        if let Err(e) = vol.check_invariants() {
            problems.push(format!("target invariants: {e}"));
        }
        problems
    }

    async fn settle(&self, vol: &strata_cache::CacheDev) -> (Vec<String>, Vec<String>) {
        use strata_io::BlockDev;
        let (mut problems, mut notes) = (Vec::new(), Vec::new());
        if let Err(e) = vol.message("flush").await {
            problems.push(format!("message flush: {e}"));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let dirty = strata_cache::CacheStatus::of(vol).map_or(0, |s| s.dirty_blocks);
            if dirty == 0 {
                break;
            }
            if std::time::Instant::now() > deadline {
                problems.push(format!("write-back did not finish in 10 s ({dirty} dirty blocks left)"));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        if let Err(e) = vol.message("invalidate").await {
            notes.push(format!("no eviction (message invalidate: {e})"));
        }
        (problems, notes)
    }

    fn fast_data_area(&self) -> bool {
        true
    }

    async fn data_offset(&self, cache: &dyn strata_io::BlockDev) -> anyhow::Result<Option<u64>> {
        Ok(Some(strata_cache::meta::Meta::load(cache).await?.0.sb.data_offset))
    }

    async fn close(&self, vol: strata_cache::CacheDev, cache: std::sync::Arc<strata_io::mem::MemDev>) -> Vec<String> {
        use strata_io::BlockDev;
        let mut problems = Vec::new();
        if let Err(e) = vol.shutdown().await {
            problems.push(format!("shutdown after recovery: {e}"));
        }
        drop(vol);
        match strata_cache::meta::Meta::load(&*cache).await {
            Ok((_, f)) if f.errors.is_empty() && f.repaired.is_empty() => {}
            Ok((_, f)) => problems.push(format!("metadata check after recovery: {:?} {:?}", f.errors, f.repaired)),
            Err(e) => problems.push(format!("metadata unreadable after recovery: {e}")),
        }
        problems
    }
}

/// The shape of a power-cut run.
#[derive(Debug, Clone)]
pub struct PowercutSetup {
    pub origin_bytes: u64,
    pub cache_bytes: u64,
    /// Clients issuing requests at once.
    pub clients: usize,
    /// Requests per client (the cut comes somewhere in the second half... or earlier).
    pub steps: usize,
    /// Most a device takes to complete a write or flush.
    pub max_delay: std::time::Duration,
    /// Share of points where a flush of one device fails and loses what it covered.
    pub flush_fail_share: f64,
}

impl Default for PowercutSetup {
    fn default() -> Self {
        PowercutSetup {
            origin_bytes: 8 << 20,
            cache_bytes: 2 << 20,
            clients: 4,
            steps: 100,
            max_delay: std::time::Duration::from_micros(1500),
            flush_fail_share: 0.25,
        }
    }
}

/// What one client request is.
#[derive(Debug, Clone)]
enum Req {
    Step(Step),
    Read { offset: u64, len: u64 },
    Pause(std::time::Duration),
}

/// Blocks every client picks from: a hot set shared by all (bigger than the cache holds
/// when mixed with the cold rest) and the whole volume.
const HOT_BLOCKS: u64 = 48;
const CRASH_BLOCK: u64 = 32 << 10;

fn client_requests(seed: u64, client: u64, n: usize, size: u64, block: u64) -> Vec<Req> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x1000_0001) ^ client);
    let blocks = size / block;
    let per_block = block / SECTOR;
    let mut next_id = seed.wrapping_mul(10_000_000) + client * 100_000;
    let extent = |rng: &mut ChaCha8Rng| {
        let b = if rng.gen_bool(0.6) { rng.gen_range(0..HOT_BLOCKS.min(blocks)) } else { rng.gen_range(0..blocks) };
        let (first, sectors) = match rng.gen_range(0..10) {
            // Whole blocks, one or two.
            0..=3 => (b * per_block, per_block * rng.gen_range(1..=2)),
            // A few sectors inside a block.
            4..=7 => {
                let n = rng.gen_range(1..=16);
                (b * per_block + rng.gen_range(0..=per_block - n), n)
            }
            // Across a block boundary.
            _ => (b * per_block + rng.gen_range(1..per_block), rng.gen_range(2..=per_block)),
        };
        let end = (first + sectors).min(size / SECTOR);
        (first * SECTOR, (end - first) * SECTOR)
    };
    (0..n)
        .map(|_| match rng.gen_range(0..100) {
            0..=29 => {
                let (offset, len) = extent(&mut rng);
                Req::Read { offset, len }
            }
            30..=69 => {
                let (offset, len) = extent(&mut rng);
                next_id += 1;
                Req::Step(Step::Write { id: next_id, offset, len, fua: rng.gen_bool(0.15) })
            }
            70..=77 => Req::Step(Step::Flush),
            78..=82 => {
                let (offset, len) = extent(&mut rng);
                Req::Step(Step::Trim { offset, len })
            }
            83..=87 => {
                let (offset, len) = extent(&mut rng);
                Req::Step(Step::Zero { offset, len })
            }
            _ => Req::Pause(std::time::Duration::from_micros(rng.gen_range(0..3000))),
        })
        .collect()
}

async fn apply_vol<V: strata_io::BlockDev>(vol: &V, step: &Step) -> strata_io::Result<()> {
    use strata_io::{Buf, ZeroFlags};
    match *step {
        Step::Write { id, offset, len, fua } => {
            vol.write(offset, Buf::from_slice(&payload(id, offset / SECTOR, len / SECTOR)), fua).await.map(|_| ())
        }
        Step::Flush => vol.flush().await,
        Step::Trim { offset, len } => vol.discard(offset, len).await,
        Step::Zero { offset, len } => vol.write_zeroes(offset, len, ZeroFlags::default()).await,
    }
}

/// What the clients of one run share.
struct Run {
    oracle: std::sync::Mutex<Oracle>,
    /// Requests finished (any outcome).
    done: std::sync::atomic::AtomicUsize,
    /// Set at the cut: clients stop issuing.
    cut: std::sync::atomic::AtomicBool,
    /// How many flushes of the devices failed and lost data: from the first on, reads are
    /// checked leniently and errors are expected.
    lost: Box<dyn Fn() -> u64 + Send + Sync>,
    /// Problems the clients found (wrong reads, errors before the cut).
    problems: std::sync::Mutex<Vec<String>>,
    wrong_sectors: std::sync::atomic::AtomicU64,
    /// Held shared by each request from its issue to its completion as the oracle saw them;
    /// taken whole to quiet every client (for a snapshot).
    gate: tokio::sync::RwLock<()>,
}

async fn client<V: strata_io::BlockDev>(vol: std::sync::Arc<V>, run: std::sync::Arc<Run>, reqs: Vec<Req>, c: usize) {
    use std::sync::atomic::Ordering::SeqCst;
    use strata_io::Buf;
    for req in reqs {
        if run.cut.load(SeqCst) {
            return;
        }
        match req {
            Req::Pause(d) => tokio::time::sleep(d).await,
            Req::Step(step) => {
                let _in = run.gate.read().await;
                let t = run.oracle.lock().unwrap().begin(&step);
                let r = apply_vol(&*vol, &step).await;
                run.oracle.lock().unwrap().end(t, r.is_ok());
                if let Err(e) = r {
                    if !run.cut.load(SeqCst) && (run.lost)() == 0 {
                        run.problems.lock().unwrap().push(format!("client {c}: {step:?} failed before the cut: {e}"));
                    }
                }
            }
            Req::Read { offset, len } => {
                let _in = run.gate.read().await;
                let issued = run.oracle.lock().unwrap().read_issued();
                let r = vol.read(offset, Buf::zeroed(len as usize)).await;
                match r {
                    Ok(data) => {
                        let lenient = (run.lost)() > 0;
                        let mut o = run.oracle.lock().unwrap();
                        let wrong = o.check_read(offset, &data, issued, lenient);
                        if !wrong.is_empty() {
                            run.wrong_sectors.fetch_add(wrong.len() as u64, SeqCst);
                            let s = wrong[0];
                            let got = describe_sector(
                                s,
                                &data[((s - offset / SECTOR) * SECTOR) as usize..][..SECTOR as usize],
                            );
                            let why = format!(
                                "client {c}: read of {len} bytes at {offset} (issued at {issued}): {} sectors wrong, first {s} holds {got}; {}",
                                wrong.len(),
                                o.explain(s)
                            );
                            run.problems.lock().unwrap().push(why);
                        }
                    }
                    Err(e) if !run.cut.load(SeqCst) && (run.lost)() == 0 => run
                        .problems
                        .lock()
                        .unwrap()
                        .push(format!("client {c}: read at {offset} failed before the cut: {e}")),
                    Err(_) => {}
                }
            }
        }
        run.done.fetch_add(1, SeqCst);
    }
}

/// One power-cut point of `target` in `mode`: `setup.clients` clients issue reads, writes
/// (some FUA), flushes, trims and write-zeroes at once over shared blocks, reads checked
/// against the oracle as they complete, while the target's background work runs and a
/// seeded script of control messages is sent; in some points a flush of one device fails
/// and loses what it covered. Power fails on both devices at a seeded moment; the target is
/// reopened from the crash images, checked, read whole and verified, made to move its data
/// (`settle`), and read again: any sector that reads differently is unstable.
pub async fn powercut_run<T: CrashTarget>(
    target: &T,
    setup: &PowercutSetup,
    mode: &str,
    seed: u64,
) -> anyhow::Result<PointOutcome> {
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;
    use std::time::Duration;
    use strata_io::mem::MemDev;
    use strata_io::powercut::{Clock, PowerCut, Window};
    use strata_io::{BlockDev, Buf};

    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9c0f_fee5);
    let clock = Clock::default();
    let window =
        |s: u64| Window { seed: s, max_delay: setup.max_delay, reorder: true, tear_completed: true, flush_fail: 0.0 };
    let origin_bytes = target.origin_bytes(setup.origin_bytes);
    let origin = Arc::new(PowerCut::with_clock(MemDev::new(origin_bytes), clock.clone()).with_window(window(seed * 2)));
    let cache =
        Arc::new(PowerCut::with_clock(MemDev::new(setup.cache_bytes), clock.clone()).with_window(window(seed * 2 + 1)));
    let vol = Arc::new(target.create(cache.clone(), origin.clone(), mode, seed).await?);
    let mut oracle = Oracle::new(setup.origin_bytes);
    if target.stale_reads(mode) {
        oracle.allow_stale();
    }

    let run = Arc::new(Run {
        oracle: std::sync::Mutex::new(oracle),
        done: Default::default(),
        cut: Default::default(),
        lost: {
            let (o, c) = (origin.clone(), cache.clone());
            Box::new(move || o.lost_flushes() + c.lost_flushes())
        },
        problems: Default::default(),
        wrong_sectors: Default::default(),
        gate: Default::default(),
    });
    // Snapshots taken (id, what the volume held then) and deleted, in order.
    let mut snapshots: Vec<(u32, Oracle)> = Vec::new();
    let mut next_snapshot = 2;
    let total = setup.clients * setup.steps;
    let cut_at = rng.gen_range(total / 4..total.max(2) * 9 / 10);
    // Seeded events, by how many requests have finished: messages, a failing flush, the cut.
    let scripts = target.scripts(mode);
    let script = scripts.get(rng.gen_range(0..scripts.len().max(1))).cloned().unwrap_or_default();
    let mut at: Vec<usize> = script.iter().map(|_| rng.gen_range(0..cut_at)).collect();
    at.sort_unstable();
    let events: Vec<(usize, String)> = at.into_iter().zip(script).collect();
    let fail_flush = rng.gen_bool(setup.flush_fail_share).then(|| (rng.gen_range(0..cut_at), rng.gen_bool(0.5)));
    let mut detail = String::new();

    let clients: Vec<_> = (0..setup.clients)
        .map(|c| {
            let reqs = client_requests(seed, c as u64, setup.steps, setup.origin_bytes, target.block_bytes());
            tokio::spawn(client(vol.clone(), run.clone(), reqs, c))
        })
        .collect();
    let mut armed = false;
    let mut sent = 0;
    loop {
        let done = run.done.load(SeqCst);
        while sent < events.len() && events[sent].0 <= done {
            let msg = events[sent].1.clone();
            let answer = match msg.as_str() {
                "snapshot" => {
                    let id = next_snapshot;
                    next_snapshot += 1;
                    let taken = snapshot_quietly(target, &vol, &run, id).await;
                    let answer = format!("{:?}", taken.as_ref().map(|_| id));
                    if let Ok(o) = taken {
                        snapshots.push((id, o));
                    }
                    answer
                }
                "delete snapshot" if !snapshots.is_empty() => {
                    let id = snapshots.remove(0).0;
                    format!("{:?}", target.delete_snapshot(&vol, id).await.map(|()| id))
                }
                _ => format!("{:?}", vol.message(&msg).await),
            };
            detail.push_str(&format!("after {done} requests: message {msg:?}: {answer}\n"));
            sent += 1;
        }
        if let Some((at, on_cache)) = fail_flush {
            if !armed && done >= at {
                armed = true;
                if on_cache {
                    cache.fail_next_flush()
                } else {
                    origin.fail_next_flush()
                }
                detail.push_str(&format!(
                    "after {done} requests: the next {} flush fails\n",
                    if on_cache { "cache" } else { "origin" }
                ));
            }
        }
        if done >= cut_at || clients.iter().all(|c| c.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    tokio::time::sleep(Duration::from_micros(rng.gen_range(0..2000))).await;
    if let Some(s) = strata_cache::CacheStatus::of(&vol) {
        detail.push_str(&format!(
            "status at the cut: mode {:?}, read_hits {}, promotions {}, demotions {}, writebacks {}, commits {}, \
             dirty_blocks {}, cached_blocks {}, cache_blocks {}\n",
            s.mode,
            s.read_hits,
            s.promotions,
            s.demotions,
            s.writebacks,
            s.commits,
            s.dirty_blocks,
            s.cached_blocks,
            s.cache_blocks
        ));
    }
    if let Some(s) = vol.status().and_then(|j| serde_json::from_value::<strata_thin::ThinStatus>(j).ok()) {
        let p = &s.pool;
        detail.push_str(&format!(
            "status at the cut: pool {}, commits {}, provisioned {}, copied {}, unmapped {}, mapped_blocks {}, \
             data_used_blocks {}, volumes {}, deleting {:?}\n",
            p.mode,
            p.commits,
            p.provisioned_blocks,
            p.copied_blocks,
            p.unmapped_blocks,
            s.mapped_blocks,
            p.data_used_blocks,
            p.volumes,
            p.deleting
        ));
    }
    run.cut.store(true, SeqCst);
    if rng.gen_bool(0.5) {
        origin.power_off();
        cache.power_off();
    } else {
        cache.power_off();
        origin.power_off();
    }
    let cut_requests = run.done.load(SeqCst);
    let mut problems: Vec<String> = Vec::new();
    for c in clients {
        let abort = c.abort_handle();
        if tokio::time::timeout(Duration::from_secs(20), c).await.is_err() {
            abort.abort();
            problems.push("a client's request never completed after the cut".into());
        }
    }
    drop(vol);
    let lost_flushes = origin.lost_flushes() + cache.lost_flushes();
    detail.push_str(&format!("cut after {cut_requests} of {total} requests; {lost_flushes} flushes lost data\n"));
    problems.extend(std::mem::take(&mut *run.problems.lock().unwrap()));
    let wrong_reads = run.wrong_sectors.load(SeqCst);
    let oracle = std::mem::replace(&mut *run.oracle.lock().unwrap(), Oracle::new(0));

    let (origin_img, cache_img) = (Arc::new(origin.crash(seed)), Arc::new(cache.crash(seed.wrapping_add(1))));
    let size = setup.origin_bytes;
    let (vol, found) = match target.reopen(cache_img.clone(), origin_img).await {
        Ok(v) => v,
        Err(e) => {
            problems.push(format!("could not reopen after the cut: {e}"));
            return Ok(finish_point(seed, Verdict::default(), problems, wrong_reads, 0, detail));
        }
    };
    problems.extend(found);
    problems.extend(target.check(&vol).await);
    let first = match vol.read(0, Buf::zeroed(size as usize)).await {
        Ok(b) => b,
        Err(e) => {
            problems.push(format!("reading the recovered volume: {e}"));
            return Ok(finish_point(seed, Verdict::default(), problems, wrong_reads, 0, detail));
        }
    };
    let block = target.block_bytes();
    let mut verdict = verify_image(&oracle, &first, "", block, &mut detail);
    // Each snapshot holds what the volume held when it was taken.
    for (id, o) in &snapshots {
        let snap = target.open_snapshot(&vol, *id);
        match snap {
            Ok(snap) => match snap.read(0, Buf::zeroed(size as usize)).await {
                Ok(img) => {
                    verdict += verify_image(o, &img, &format!("snapshot {id}: "), block, &mut detail);
                }
                Err(e) => problems.push(format!("reading snapshot {id} after recovery: {e}")),
            },
            Err(e) => problems.push(format!("snapshot {id} after recovery: {e}")),
        }
    }
    let (p, notes) = target.settle(&vol).await;
    problems.extend(p);
    for n in notes {
        detail.push_str(&format!("note: {n}\n"));
    }
    problems.extend(target.check(&vol).await);
    let unstable = match vol.read(0, Buf::zeroed(size as usize)).await {
        Ok(second) => {
            let differ: Vec<u64> = (0..size / SECTOR)
                .filter(|&s| {
                    let r = (s * SECTOR) as usize..((s + 1) * SECTOR) as usize;
                    first[r.clone()] != second[r]
                })
                .collect();
            for &s in differ.iter().take(3) {
                let r = (s * SECTOR) as usize..((s + 1) * SECTOR) as usize;
                detail.push_str(&format!(
                    "unstable sector {s} (block {}): {:?} then {:?}\n",
                    s * SECTOR / CRASH_BLOCK,
                    decode(s, &first[r.clone()]),
                    decode(s, &second[r])
                ));
            }
            differ.len() as u64
        }
        Err(e) => {
            problems.push(format!("reading the settled volume: {e}"));
            0
        }
    };
    problems.extend(target.close(vol, cache_img).await);
    Ok(finish_point(seed, verdict, problems, wrong_reads, unstable, detail))
}

/// Verifies a crash image against `oracle`, describing the first wrong sectors in `detail`
/// (with their blocks of `block` bytes).
fn verify_image(oracle: &Oracle, image: &[u8], what: &str, block: u64, detail: &mut String) -> Verdict {
    let verdict = oracle.verify(image);
    if verdict.lost + verdict.garbage > 0 {
        let sector = |s: u64| &image[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
        let bad: Vec<u64> =
            (0..image.len() as u64 / SECTOR).filter(|&s| !oracle.verify_sector(s, sector(s))).take(3).collect();
        for s in bad {
            let got = describe_sector(s, sector(s));
            detail.push_str(&format!(
                "{what}sector {s} (block {}) holds {got}: {}\n",
                s * SECTOR / block,
                oracle.explain(s)
            ));
        }
    }
    verdict
}

/// Takes snapshot `id` of `vol` with every client quiet, as a flush of the oracle's; returns
/// what the volume held then.
async fn snapshot_quietly<T: CrashTarget>(target: &T, vol: &T::Vol, run: &Run, id: u32) -> anyhow::Result<Oracle> {
    let _quiet = run.gate.write().await;
    let t = run.oracle.lock().unwrap().begin(&Step::Flush);
    let taken = target.snapshot(vol, id).await;
    let mut o = run.oracle.lock().unwrap();
    o.end(t, taken.is_ok());
    taken.map(|()| o.clone())
}

fn finish_point(
    seed: u64,
    verdict: Verdict,
    problems: Vec<String>,
    wrong_reads: u64,
    unstable: u64,
    mut detail: String,
) -> PointOutcome {
    for p in problems.iter().take(12) {
        detail.push_str(&format!("{p}\n"));
    }
    if problems.len() > 12 {
        detail.push_str(&format!("... {} more problems\n", problems.len() - 12));
    }
    // Wrong reads count per sector; the problem lines of reads only describe them.
    let read_lines = problems.iter().filter(|p| p.contains(": read of ")).count() as u64;
    let check_failures = (problems.len() as u64 - read_lines + wrong_reads + unstable) as u32;
    PointOutcome { seed, verdict, check_failures, unstable, detail }
}

/// The writecache target (`strata_writecache::WritecacheDev`) as a `CrashTarget`: 4 KiB
/// blocks; its "modes" are tunings: `default`, `eager` (write back everything, no
/// headroom: eviction and write-around all the time) and `paused` (no write-back: the log
/// fills and writes go around it).
pub struct WritecacheTarget;

impl WritecacheTarget {
    fn tunables(mode: &str) -> anyhow::Result<strata_writecache::Tunables> {
        let d = strata_writecache::Tunables::default();
        Ok(match mode {
            "default" => d,
            "eager" => strata_writecache::Tunables { high_watermark: 100, low_watermark: 0, ..d },
            "paused" => strata_writecache::Tunables { writeback_running: false, ..d },
            other => anyhow::bail!("writecache: no crashtest mode {other:?} (default, eager, paused)"),
        })
    }
}

impl CrashTarget for WritecacheTarget {
    type Vol = strata_writecache::WritecacheDev;

    fn modes(&self) -> Vec<String> {
        ["default", "eager", "paused"].iter().map(|m| m.to_string()).collect()
    }

    async fn create(
        &self,
        cache: std::sync::Arc<dyn strata_io::BlockDev>,
        origin: std::sync::Arc<dyn strata_io::BlockDev>,
        mode: &str,
        _seed: u64,
    ) -> anyhow::Result<strata_writecache::WritecacheDev> {
        use strata_writecache::offline::{create, CreateOptions};
        let tunables = Self::tunables(mode)?;
        create(&*cache, &*origin, &CreateOptions { block_bytes: 4096, ..CreateOptions::default() }).await?;
        let o = strata_writecache::OpenOptions { tunables: Some(tunables), no_background: false };
        Ok(strata_writecache::WritecacheDev::open(cache, origin, o).await?)
    }

    fn scripts(&self, _mode: &str) -> Vec<Vec<String>> {
        let s = |v: &[&str]| v.iter().map(|m| m.to_string()).collect::<Vec<_>>();
        vec![
            vec![],
            s(&["flush"]),
            s(&["commit", "flush"]),
            s(&["writeback_running off", "writeback_running on"]),
            s(&["cleaner on", "cleaner off"]),
            s(&["low_watermark 0", "high_watermark 90"]),
            s(&["autocommit_time 0", "flush"]),
        ]
    }

    async fn reopen(
        &self,
        cache: std::sync::Arc<strata_io::mem::MemDev>,
        origin: std::sync::Arc<strata_io::mem::MemDev>,
    ) -> anyhow::Result<(strata_writecache::WritecacheDev, Vec<String>)> {
        // Untrusted entries after a cut are expected (a commit in flight); recovery clears
        // them, and `close` checks that none are left.
        let o = strata_writecache::OpenOptions::default();
        Ok((strata_writecache::WritecacheDev::open(cache, origin, o).await?, Vec::new()))
    }

    async fn check(&self, vol: &strata_writecache::WritecacheDev) -> Vec<String> {
        match vol.check_state() {
            Ok(()) => Vec::new(),
            Err(e) => vec![format!("target invariants: {e}")],
        }
    }

    async fn settle(&self, vol: &strata_writecache::WritecacheDev) -> (Vec<String>, Vec<String>) {
        use strata_io::BlockDev;
        let mut problems = Vec::new();
        if let Err(e) = vol.message("flush").await {
            problems.push(format!("message flush: {e}"));
        }
        // Evict everything now clean: later reads go to the origin.
        if let Err(e) = vol.evict_clean().await {
            problems.push(format!("evicting: {e}"));
        }
        (problems, Vec::new())
    }

    fn fast_data_area(&self) -> bool {
        true
    }

    async fn data_offset(&self, cache: &dyn strata_io::BlockDev) -> anyhow::Result<Option<u64>> {
        Ok(Some(strata_writecache::offline::superblock(cache, None).await?.data_offset()))
    }

    async fn close(
        &self,
        vol: strata_writecache::WritecacheDev,
        cache: std::sync::Arc<strata_io::mem::MemDev>,
    ) -> Vec<String> {
        use strata_io::BlockDev;
        let mut problems = Vec::new();
        if let Err(e) = vol.shutdown().await {
            problems.push(format!("shutdown after recovery: {e}"));
        }
        drop(vol);
        let scanned = async {
            let sb = strata_writecache::offline::superblock(&*cache, None).await?;
            strata_writecache::offline::scan(&*cache, &sb).await
        };
        match scanned.await {
            Ok(scan) if scan.findings.is_empty() => {}
            Ok(scan) => problems.push(format!("entries after recovery and shutdown: {:?}", scan.findings)),
            Err(e) => problems.push(format!("log unreadable after recovery: {e}")),
        }
        problems
    }
}

/// One power-cut point of the cache target in writeback mode (see `powercut_run`).
pub async fn powercut_point(setup: &PowercutSetup, seed: u64) -> anyhow::Result<PointOutcome> {
    powercut_run(&CacheTarget, setup, "writeback", seed).await
}
