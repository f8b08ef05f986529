//! Power-cut simulation (tests and `strata crashtest`): a decorator that records every write, discard,
//! write-zeroes and flush passing through it, with the data written, so a test can ask what
//! the media could hold if power failed now, or at any earlier point of the recorded history
//! (replaying to every flush, like dm-log-writes), and get that image back as a `MemDev`.
//!
//! The durability rules are the `BlockDev` contract's (NBD's and the Linux block layer's):
//! - a write is durable once it completed with FUA, or once a flush issued after the write
//!   completed has itself completed successfully;
//! - a write that completed but is not durable may or may not have reached the media: it is
//!   kept whole or dropped (or, with `Window::tear_completed`, torn as below);
//! - a write still in flight at the cut (issued, not completed), or one that failed with an
//!   IO error, may also be torn: each 512-byte sector it touches is independently new or old.
//!
//! Each outcome is drawn from the seed and the write's position in the history alone, so the
//! same history and seed always give the same image, whatever the cut point. Writes are
//! applied in the order they landed on the inner device (issue order without a window,
//! completion order with one; writes not completed at the cut come last), so each sector
//! ends up holding the last durable write to it or a later write that happened to survive.
//! Discards are recorded as writes of zeroes, one of the outcomes the contract allows for them.
//!
//! An in-flight window (`Window`, `with_window`) makes the device behave like a real queue:
//! each write and flush completes after a seeded delay, a write's data reaches the inner
//! device only when it completes (reads before that see the old data), and overlapping writes
//! in flight together may complete out of issue order. A flush can be made to fail
//! (`fail_next_flush`, `Window::flush_fail`) the way a buffered file's fsync fails: the
//! not yet durable writes it covered are gone for good, from every later crash image and from
//! the inner device itself (reads return the older data), even if a later flush succeeds.
//!
//! Several devices that lose power together (a cache and its origin) can share a `Clock`:
//! every event any of them records takes the clock's next tick, so one moment of the whole
//! system, a tick, maps to a cut point on each device (`point_at_tick`), and a crash image
//! set cut at one tick is one the devices could really have been left in together.
//!
//! This module must never invent data (every byte of an image was written, or was in the
//! starting image), never lose a durable write, and never decide an outcome from anything
//! but the seed and the recorded history.
//!
//! ```
//! use strata_io::{mem::MemDev, powercut::PowerCut, BlockDev, Buf};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let dev = PowerCut::new(MemDev::new(1 << 20));
//! dev.write(0, Buf::from_slice(&[1; 512]), false).await.unwrap();
//! dev.flush().await.unwrap();
//! dev.write(512, Buf::from_slice(&[2; 512]), false).await.unwrap(); // not flushed
//! let image = dev.crash(7);
//! let mut got = [0u8; 1024];
//! image.read_into(0, &mut got).unwrap();
//! assert_eq!(got[..512], [1; 512]); // durable: always there
//! assert!(got[512..] == [2; 512] || got[512..] == [0; 512]); // either, as seed 7 decides
//! # });
//! ```

use crate::mem::MemDev;
use crate::{check_range, BlockDev, BoxFut, Buf, Error, ErrorKind, Extent, Result, ZeroFlags};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// A tick counter shared by the `PowerCut` devices that lose power together. Ticks only grow,
/// and an event that happened before another (on any of the devices) has a smaller tick.
#[derive(Clone, Default)]
pub struct Clock(Arc<AtomicU64>);

impl Clock {
    /// The tick the next event will take: cutting every device at `now()` (with
    /// `point_at_tick`) keeps everything recorded so far.
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// The granularity at which an in-flight write can tear.
pub const SECTOR_BYTES: u64 = 512;

/// Default bound on the recorded history (data plus per-event overhead).
pub const HISTORY_LIMIT_BYTES_DEFAULT: u64 = 256 << 20;

/// What one recorded event costs besides its data, for the history limit.
const EVENT_OVERHEAD_BYTES: u64 = 64;

/// Piece size when copying images, so a copy never needs a device-sized buffer.
const COPY_PIECE_BYTES: u64 = 1 << 20;

/// The in-flight window of a `PowerCut` device (see the module docs). Every choice it makes
/// is drawn from `seed` and the point of the request's issue.
#[derive(Debug, Clone)]
pub struct Window {
    pub seed: u64,
    /// Most a write or flush waits before it completes; zero waits up to 8 scheduler turns
    /// instead of sleeping.
    pub max_delay: Duration,
    /// Writes may complete (and land) out of issue order; without it they land in order.
    pub reorder: bool,
    /// Completed writes that are not durable may tear at sector granularity in crash images.
    pub tear_completed: bool,
    /// Chance that a flush fails and loses the writes it covered.
    pub flush_fail: f64,
}

impl Default for Window {
    fn default() -> Window {
        Window { seed: 0, max_delay: Duration::from_micros(500), reorder: true, tear_completed: true, flush_fail: 0.0 }
    }
}

enum Payload {
    Data(Box<[u8]>),
    Zeroes(u64),
}

impl Payload {
    fn len(&self) -> u64 {
        match self {
            Payload::Data(d) => d.len() as u64,
            Payload::Zeroes(n) => *n,
        }
    }

    /// The data bytes the history holds for this payload.
    fn cost_bytes(&self) -> u64 {
        match self {
            Payload::Data(d) => d.len() as u64,
            Payload::Zeroes(_) => 0,
        }
    }

    /// Writes `[from, to)` of the payload (offsets relative to its start) at `offset + from`.
    fn apply(&self, image: &MemDev, offset: u64, from: u64, to: u64) {
        let r = match self {
            Payload::Data(d) => image.write_from(offset + from, &d[from as usize..to as usize]),
            Payload::Zeroes(_) => image.zero_range(offset + from, to - from, false),
        };
        r.expect("recorded writes were range-checked against the same size");
    }

    /// Copies the part of the payload (written at `offset`) that falls in `[at, at+out.len())`.
    fn copy_into(&self, offset: u64, at: u64, out: &mut [u8]) {
        let from = offset.max(at);
        let to = (offset + self.len()).min(at + out.len() as u64);
        if from >= to {
            return;
        }
        let dst = &mut out[(from - at) as usize..(to - at) as usize];
        match self {
            Payload::Data(d) => dst.copy_from_slice(&d[(from - offset) as usize..(to - offset) as usize]),
            Payload::Zeroes(_) => dst.fill(0),
        }
    }
}

/// How a write ended, as far as the media is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Ok,
    /// Failed after it may have touched the media (an IO error and the like).
    Failed,
    /// Refused before touching the media (out of range, unsupported, read-only, invalid).
    Refused,
}

impl Done {
    fn of<T>(r: &Result<T>) -> Done {
        match r {
            Ok(_) => Done::Ok,
            Err(e) => match e.kind {
                ErrorKind::OutOfRange | ErrorKind::Unsupported | ErrorKind::ReadOnly | ErrorKind::Invalid => {
                    Done::Refused
                }
                _ => Done::Failed,
            },
        }
    }
}

/// One entry of the history. A write or flush is named by the point of its issue event.
enum Event {
    /// `at_done`: the data reaches the inner device when the write completes (a window),
    /// not when it is issued. `tear`: may tear in a crash once completed, if not durable.
    Write {
        offset: u64,
        payload: Payload,
        fua: bool,
        at_done: bool,
        tear: bool,
    },
    WriteDone {
        of: u64,
        done: Done,
    },
    Flush,
    /// `lost`: a failed flush that lost the not yet durable writes it covered.
    FlushDone {
        of: u64,
        ok: bool,
        lost: bool,
    },
}

impl Event {
    fn cost_bytes(&self) -> u64 {
        EVENT_OVERHEAD_BYTES
            + match self {
                Event::Write { payload, .. } => payload.cost_bytes(),
                _ => 0,
            }
    }
}

/// What became of one write in a simulated crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Covered by a completed flush, or a completed FUA write: always on the media.
    Durable,
    /// Not durable, and reached the media whole by chance.
    Kept,
    /// Did not reach the media (by chance, or because the device refused it).
    Dropped,
    /// Was in flight (or failed, or completed but not durable with `tear_completed`) and
    /// reached the media in part: one flag per 512-byte sector it touches, in order, true
    /// where the new data landed.
    Torn(Vec<bool>),
    /// Completed, then lost by a failed flush that covered it: never on the media again.
    Lost,
}

/// A recorded write and its fate in one simulated crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFate {
    /// The point of its issue: `crash_at(issued_at, _)` cuts just before it.
    pub issued_at: u64,
    pub offset: u64,
    pub len: u64,
    /// Whether it had completed (successfully or not) before the cut.
    pub completed: bool,
    pub fate: Fate,
}

/// Per-write state while walking the history.
struct Tracked {
    issued_at: u64,
    /// Index of the issue event in the history.
    pos: usize,
    fua: bool,
    at_done: bool,
    tear: bool,
    done: Option<Done>,
    /// Index of the completion event.
    done_pos: usize,
    durable: bool,
    /// Lost by the failed flush issued at this point.
    lost_by: Option<u64>,
}

impl Tracked {
    /// Where the write landed on the inner device, for ordering: its issue, or with a
    /// window its completion (after everything else while it has not completed).
    fn landed(&self) -> (usize, usize) {
        match (self.at_done, self.done) {
            (false, _) => (self.pos, self.pos),
            (true, Some(_)) => (self.done_pos, self.pos),
            (true, None) => (usize::MAX, self.pos),
        }
    }

    /// Whether its data is on the inner device now.
    fn on_inner(&self) -> bool {
        self.lost_by.is_none()
            && match (self.at_done, self.done) {
                (_, Some(Done::Refused)) => false,
                (false, _) => true,
                (true, d) => d == Some(Done::Ok),
            }
    }
}

/// Walks the history event by event and knows, after each, which writes are durable.
#[derive(Default)]
struct Tracker {
    writes: Vec<Tracked>,
    by_point: HashMap<u64, usize>,
    /// Writes that completed successfully, in completion order.
    completed: Vec<usize>,
    /// `completed[..durable_upto]` is covered by a completed flush.
    durable_upto: usize,
    /// For each flush in flight: how much of `completed` it covers.
    flushes: HashMap<u64, usize>,
    /// Writes neither durable nor refused: what stops compaction.
    unsettled: usize,
}

impl Tracker {
    fn step(&mut self, point: u64, pos: usize, ev: &Event) {
        match *ev {
            Event::Write { fua, at_done, tear, .. } => {
                self.by_point.insert(point, self.writes.len());
                let t = Tracked {
                    issued_at: point,
                    pos,
                    fua,
                    at_done,
                    tear,
                    done: None,
                    done_pos: 0,
                    durable: false,
                    lost_by: None,
                };
                self.writes.push(t);
                self.unsettled += 1;
            }
            Event::WriteDone { of, done } => {
                // A write folded into the base by compaction has no entry: it was durable.
                let Some(&w) = self.by_point.get(&of) else {
                    return;
                };
                self.writes[w].done = Some(done);
                self.writes[w].done_pos = pos;
                match done {
                    Done::Ok if self.writes[w].fua => self.make_durable(w),
                    Done::Ok => self.completed.push(w),
                    Done::Refused => self.unsettled -= 1,
                    Done::Failed => {}
                }
            }
            Event::Flush => {
                self.flushes.insert(point, self.completed.len());
            }
            Event::FlushDone { of, ok, lost } => {
                // An unknown flush was issued before a compaction point, so it covers only
                // writes that were durable already.
                let Some(covers) = self.flushes.remove(&of) else {
                    return;
                };
                if ok {
                    while self.durable_upto < covers {
                        let w = self.completed[self.durable_upto];
                        self.make_durable(w);
                        self.durable_upto += 1;
                    }
                } else if lost {
                    for i in self.durable_upto..covers {
                        let w = &mut self.writes[self.completed[i]];
                        if !w.durable && w.lost_by.is_none() {
                            w.lost_by = Some(of);
                            self.unsettled -= 1;
                        }
                    }
                }
            }
        }
    }

    fn make_durable(&mut self, w: usize) {
        if !self.writes[w].durable && self.writes[w].lost_by.is_none() {
            self.writes[w].durable = true;
            self.unsettled -= 1;
        }
    }

    /// Indexes into `writes`, in the order they landed.
    fn landing_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.writes.len()).collect();
        order.sort_by_key(|&w| self.writes[w].landed());
        order
    }
}

struct State {
    /// The durable image at `start`: the starting content plus every compacted write.
    base: MemDev,
    /// The point of `events[0]`; points before it were compacted away.
    start: u64,
    events: Vec<Event>,
    history_bytes: u64,
    history_limit_bytes: u64,
    dead: bool,
    /// Power fails when the history reaches this point.
    die_at: Option<u64>,
    clock: Option<Clock>,
    /// With a clock: the tick of each event in `events`.
    ticks: Vec<u64>,
    window: Option<Window>,
    /// Flushes still to fail on purpose (`fail_next_flush`).
    fail_flushes: u32,
    /// Flushes failed on purpose so far, losing what they covered.
    lost_flushes: u64,
    /// Without reordering: window writes not yet landed, by issue point.
    unlanded: BTreeSet<u64>,
}

impl State {
    fn now(&self) -> u64 {
        self.start + self.events.len() as u64
    }

    /// Appends an event and returns its point; refused once power is cut.
    fn record(&mut self, ev: Event, what: &str) -> Result<u64> {
        if self.die_at.is_some_and(|p| self.now() >= p) {
            self.dead = true;
        }
        if self.dead {
            let msg = format!("powercut: {what} after the power was cut at point {}", self.now());
            return Err(Error::new(ErrorKind::Io, msg));
        }
        let cost = ev.cost_bytes();
        // A write reserves room for its completion too, so completions never overshoot.
        let reserve = cost + EVENT_OVERHEAD_BYTES;
        if matches!(ev, Event::Write { .. }) && self.history_bytes + reserve > self.history_limit_bytes {
            self.compact();
            if self.history_bytes + reserve > self.history_limit_bytes {
                // Completions and flushes are always recorded (they are small and settle
                // history); only new writes are refused.
                return Err(Error::new(
                    ErrorKind::NoMemory,
                    format!(
                        "powercut: {what}: history holds {} bytes that no completed flush covers (limit {}); \
                         flush more often or raise the limit",
                        self.history_bytes, self.history_limit_bytes
                    ),
                ));
            }
        }
        let settles = matches!(ev, Event::FlushDone { ok: true, .. } | Event::FlushDone { lost: true, .. });
        self.history_bytes += cost;
        self.events.push(ev);
        if let Some(c) = &self.clock {
            self.ticks.push(c.tick());
        }
        let point = self.now() - 1;
        if settles && self.history_bytes > self.history_limit_bytes {
            // Flush events may have overshot the limit; the flush that just completed is
            // what lets compaction bring the history back under it.
            self.compact();
        }
        Ok(point)
    }

    /// Folds the longest prefix of the history whose writes are all durable (or refused)
    /// into the base image.
    fn compact(&mut self) {
        let mut t = Tracker::default();
        let mut fold = 0;
        for (pos, ev) in self.events.iter().enumerate() {
            t.step(self.start + pos as u64, pos, ev);
            if t.unsettled == 0 {
                fold = pos + 1;
            }
        }
        for w in t.landing_order().into_iter().map(|w| &t.writes[w]).filter(|w| w.pos < fold && w.durable) {
            if let Event::Write { offset, payload, .. } = &self.events[w.pos] {
                payload.apply(&self.base, *offset, 0, payload.len());
            }
        }
        for ev in self.events.drain(..fold) {
            self.history_bytes -= ev.cost_bytes();
        }
        if self.clock.is_some() {
            self.ticks.drain(..fold);
        }
        self.start += fold as u64;
    }

    fn check_point(&self, point: u64) -> Result<()> {
        if point < self.start || point > self.now() {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("powercut: cut point {point} outside the recorded history [{}, {}]", self.start, self.now()),
            ));
        }
        Ok(())
    }

    fn tracker(&self, point: u64) -> Tracker {
        let mut t = Tracker::default();
        let n = (point - self.start) as usize;
        for (pos, ev) in self.events[..n].iter().enumerate() {
            t.step(self.start + pos as u64, pos, ev);
        }
        t
    }

    /// Every write issued before `point`, in the order they landed, with what a crash there
    /// seeded by `seed` does to it.
    fn fates(&self, point: u64, seed: u64) -> Vec<(usize, WriteFate)> {
        let t = self.tracker(point);
        t.landing_order()
            .into_iter()
            .map(|w| &t.writes[w])
            .map(|w| {
                let Event::Write { offset, payload, .. } = &self.events[w.pos] else {
                    unreachable!("tracked writes point at write events")
                };
                let fate = fate(w, seed, *offset, payload.len());
                let completed = w.done.is_some();
                (w.pos, WriteFate { issued_at: w.issued_at, offset: *offset, len: payload.len(), completed, fate })
            })
            .collect()
    }

    fn image(&self, point: u64, seed: u64, size: u64) -> MemDev {
        let image = copy_image(&self.base, size);
        for (pos, wf) in self.fates(point, seed) {
            let Event::Write { offset, payload, .. } = &self.events[pos] else {
                unreachable!("fates point at write events")
            };
            match &wf.fate {
                Fate::Durable | Fate::Kept => payload.apply(&image, *offset, 0, payload.len()),
                Fate::Dropped | Fate::Lost => {}
                Fate::Torn(landed) => {
                    for ((from, to), _) in sectors(*offset, payload.len()).zip(landed).filter(|(_, l)| **l) {
                        payload.apply(&image, *offset, from, to);
                    }
                }
            }
        }
        image
    }

    /// What the inner device should hold in `[offset, offset+len)` now: the base plus every
    /// write on it, in landing order (used to take lost writes back off it).
    fn render(&self, t: &Tracker, offset: u64, len: u64) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        self.base.read_into(offset, &mut out).expect("in range");
        for w in t.landing_order().into_iter().map(|w| &t.writes[w]).filter(|w| w.on_inner()) {
            if let Event::Write { offset: at, payload, .. } = &self.events[w.pos] {
                payload.copy_into(*at, offset, &mut out);
            }
        }
        out
    }
}

/// Decides a write's fate from the seed and the write's issue point alone, so a write fares
/// the same at every cut point where it is in the same state, and compaction changes nothing.
fn fate(w: &Tracked, seed: u64, offset: u64, len: u64) -> Fate {
    if w.done == Some(Done::Refused) {
        return Fate::Dropped;
    }
    if w.lost_by.is_some() {
        return Fate::Lost;
    }
    if w.durable {
        return Fate::Durable;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(w.issued_at);
    if w.done == Some(Done::Ok) && !w.tear {
        return if rng.gen_bool(0.5) { Fate::Kept } else { Fate::Dropped };
    }
    match rng.gen_range(0..3) {
        0 => Fate::Kept,
        1 => Fate::Dropped,
        _ => Fate::Torn(sectors(offset, len).map(|_| rng.gen_bool(0.5)).collect()),
    }
}

/// The pieces of `[offset, offset+len)` cut at absolute sector boundaries, as offsets
/// relative to `offset`.
fn sectors(offset: u64, len: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let to = (at + SECTOR_BYTES - (offset + at) % SECTOR_BYTES).min(len);
        let piece = (at, to);
        at = to;
        Some(piece)
    })
}

fn copy_image(src: &MemDev, size: u64) -> MemDev {
    let dst = MemDev::new(size);
    let mut buf = vec![0u8; COPY_PIECE_BYTES.min(size) as usize];
    let mut pos = 0;
    for e in src.extents(0, size).expect("whole device") {
        if !e.hole {
            let end = pos + e.len;
            let mut at = pos;
            while at < end {
                let n = (end - at).min(COPY_PIECE_BYTES) as usize;
                src.read_into(at, &mut buf[..n]).expect("in range");
                dst.write_from(at, &buf[..n]).expect("in range");
                at += n as u64;
            }
        }
        pos += e.len;
    }
    dst
}

/// The power-cut decorator. Reads pass through; writes, discards, write-zeroes and flushes
/// pass through and are recorded. Points count recorded events (the issue and the completion
/// of each write and flush): cutting at point `p` keeps what the first `p` events did.
pub struct PowerCut<D> {
    inner: D,
    state: Mutex<State>,
    /// Held while a window write lands (and while lost writes are taken off the inner
    /// device), so the inner device sees landings in recorded order.
    land: tokio::sync::Mutex<()>,
    /// Wakes window writes waiting for their turn to land (without reordering).
    turn: Notify,
}

/// Takes a window write off the landing queue however its request ends.
struct Unlanded<'a> {
    state: &'a Mutex<State>,
    turn: &'a Notify,
    of: u64,
}

impl Drop for Unlanded<'_> {
    fn drop(&mut self) {
        self.state.lock().unlanded.remove(&self.of);
        self.turn.notify_waiters();
    }
}

impl<D: BlockDev> PowerCut<D> {
    /// Wraps a device that reads as zeroes (a fresh `MemDev`): the crash images start from
    /// zeroes. Use `capture` for a device that already holds data.
    pub fn new(inner: D) -> PowerCut<D> {
        let base = MemDev::new(inner.size());
        PowerCut::with_base(inner, base)
    }

    /// Wraps a device whose current content is taken as durable (reading it all once).
    pub async fn capture(inner: D) -> Result<PowerCut<D>> {
        let size = inner.size();
        let base = MemDev::new(size);
        let mut at = 0;
        while at < size {
            let n = (size - at).min(COPY_PIECE_BYTES);
            let buf = inner.read(at, Buf::zeroed(n as usize)).await?;
            // All-zero pieces stay unallocated, so a sparse device stays cheap.
            if buf.iter().any(|&b| b != 0) {
                base.write_from(at, &buf)?;
            }
            at += n;
        }
        Ok(PowerCut::with_base(inner, base))
    }

    /// `new`, with events ticking `clock` (see the module docs).
    pub fn with_clock(inner: D, clock: Clock) -> PowerCut<D> {
        let pc = PowerCut::new(inner);
        pc.state.lock().clock = Some(clock);
        pc
    }

    fn with_base(inner: D, base: MemDev) -> PowerCut<D> {
        let state = State {
            base,
            start: 0,
            events: Vec::new(),
            history_bytes: 0,
            history_limit_bytes: HISTORY_LIMIT_BYTES_DEFAULT,
            dead: false,
            die_at: None,
            clock: None,
            ticks: Vec::new(),
            window: None,
            fail_flushes: 0,
            lost_flushes: 0,
            unlanded: BTreeSet::new(),
        };
        PowerCut { inner, state: Mutex::new(state), land: tokio::sync::Mutex::new(()), turn: Notify::new() }
    }

    /// Gives the device an in-flight window (see the module docs).
    pub fn with_window(self, window: Window) -> PowerCut<D> {
        self.set_window(Some(window));
        self
    }

    /// Sets or clears the in-flight window; requests issued from now on follow it.
    pub fn set_window(&self, window: Option<Window>) {
        self.state.lock().window = window;
    }

    /// Makes the next flush fail the way a buffered file's fsync does: the writes it covers
    /// that are not durable yet are lost for good (see the module docs). Cumulative.
    pub fn fail_next_flush(&self) {
        self.state.lock().fail_flushes += 1;
    }

    /// How many flushes failed on purpose (`fail_next_flush`, `Window::flush_fail`) so far.
    pub fn lost_flushes(&self) -> u64 {
        self.state.lock().lost_flushes
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The current point: `crash_at(now(), seed)` is `crash(seed)`.
    pub fn now(&self) -> u64 {
        self.state.lock().now()
    }

    /// The earliest point still recorded (history before it was compacted into the base).
    pub fn first_point(&self) -> u64 {
        self.state.lock().start
    }

    /// The points just after each successful flush completed, oldest first: cutting at each
    /// replays the history flush by flush.
    pub fn flush_points(&self) -> Vec<u64> {
        let st = self.state.lock();
        (st.events.iter().enumerate())
            .filter(|(_, ev)| matches!(ev, Event::FlushDone { ok: true, .. }))
            .map(|(pos, _)| st.start + pos as u64 + 1)
            .collect()
    }

    /// The ticks at which successful flushes completed, oldest first (empty without a clock).
    pub fn flush_ticks(&self) -> Vec<u64> {
        let st = self.state.lock();
        (st.events.iter().zip(&st.ticks))
            .filter(|(ev, _)| matches!(ev, Event::FlushDone { ok: true, .. }))
            .map(|(_, t)| *t)
            .collect()
    }

    /// The cut point matching a moment of the shared clock: every event that took a tick
    /// before `tick` is kept, none after. Fails without a clock, or if the events just
    /// before that moment were compacted away.
    pub fn point_at_tick(&self, tick: u64) -> Result<u64> {
        let st = self.state.lock();
        if st.clock.is_none() {
            return Err(Error::new(ErrorKind::Invalid, "powercut: point_at_tick on a device without a clock"));
        }
        let kept = st.ticks.partition_point(|&t| t < tick);
        if kept == 0 && st.start > 0 {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("powercut: tick {tick} is in history compacted away (before point {})", st.start),
            ));
        }
        Ok(st.start + kept as u64)
    }

    /// The image a power cut now would leave, as `seed` decides.
    pub fn crash(&self, seed: u64) -> MemDev {
        let st = self.state.lock();
        st.image(st.now(), seed, self.inner.size())
    }

    /// The image a power cut at `point` would have left, as `seed` decides.
    pub fn crash_at(&self, point: u64, seed: u64) -> Result<MemDev> {
        let st = self.state.lock();
        st.check_point(point)?;
        Ok(st.image(point, seed, self.inner.size()))
    }

    /// What a crash at `point` seeded by `seed` does to each write issued before it, in issue
    /// order: the explanation of the image `crash_at` returns.
    pub fn fates(&self, point: u64, seed: u64) -> Result<Vec<WriteFate>> {
        let st = self.state.lock();
        st.check_point(point)?;
        let mut fates: Vec<WriteFate> = st.fates(point, seed).into_iter().map(|(_, wf)| wf).collect();
        fates.sort_by_key(|f| f.issued_at);
        Ok(fates)
    }

    /// Cuts the power now: every later request fails with `ErrorKind::Io`, and requests in
    /// flight stay in flight in the history. Returns the cut point.
    pub fn power_off(&self) -> u64 {
        let mut st = self.state.lock();
        st.dead = true;
        st.now()
    }

    /// Cuts the power once the history reaches `point` (at once if it has), to crash a
    /// target in the middle of its work.
    pub fn power_off_at(&self, point: u64) {
        let mut st = self.state.lock();
        st.die_at = Some(point);
        if st.now() >= point {
            st.dead = true;
        }
    }

    pub fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    /// Folds history that is durable at every later point into the base image; cut points
    /// before the new `first_point()` are no longer available.
    pub fn compact(&self) {
        self.state.lock().compact();
    }

    /// Bounds the recorded history (default `HISTORY_LIMIT_BYTES_DEFAULT`). Past it, durable
    /// history is compacted, and writes are refused with `ErrorKind::NoMemory` while what is
    /// left is still over the limit. Flushes are never refused, so flushes in flight may
    /// overshoot it by a few hundred bytes until one completes.
    pub fn set_history_limit(&self, bytes: u64) {
        self.state.lock().history_limit_bytes = bytes;
    }

    /// Bytes the history holds now (data plus a fixed overhead per event).
    pub fn history_bytes(&self) -> u64 {
        self.state.lock().history_bytes
    }

    fn dead_error(&self, what: &str) -> Error {
        Error::new(ErrorKind::Io, format!("{}: {what} after the power was cut", self.describe()))
    }

    /// Records a write-like request and issues it to the inner device: without a window at
    /// once under the same lock (so the inner device sees writes in recorded order), with one
    /// after its delay and under `land`, recording its completion as it lands.
    async fn recorded<'a, T>(
        &'a self,
        what: &str,
        offset: u64,
        payload: Payload,
        fua: bool,
        issue: impl FnOnce() -> BoxFut<'a, Result<T>> + Send,
    ) -> Result<T> {
        check_range(what, offset, payload.len(), self.inner.size())?;
        let window = self.state.lock().window.clone();
        let Some(window) = window else {
            let (of, fut) = {
                let mut st = self.state.lock();
                let of = st.record(Event::Write { offset, payload, fua, at_done: false, tear: false }, what)?;
                (of, issue())
            };
            let r = fut.await;
            let done = Done::of(&r);
            self.state.lock().record(Event::WriteDone { of, done }, what)?;
            return r;
        };
        let of = {
            let mut st = self.state.lock();
            let ev = Event::Write { offset, payload, fua, at_done: true, tear: window.tear_completed };
            let of = st.record(ev, what)?;
            if !window.reorder {
                st.unlanded.insert(of);
            }
            of
        };
        let _queued = (!window.reorder).then(|| Unlanded { state: &self.state, turn: &self.turn, of });
        delay(&window, of).await;
        if !window.reorder {
            loop {
                let turn = self.turn.notified();
                tokio::pin!(turn);
                turn.as_mut().enable();
                if self.state.lock().unlanded.first() == Some(&of) {
                    break;
                }
                turn.await;
            }
        }
        let _land = self.land.lock().await;
        if self.is_dead() {
            return Err(self.dead_error(what));
        }
        let r = issue().await;
        let done = Done::of(&r);
        self.state.lock().record(Event::WriteDone { of, done }, what)?;
        r
    }

    /// A flush chosen to fail: records it as losing what it covered and takes those writes
    /// back off the inner device.
    async fn lose_flush(&self, of: u64) -> Result<()> {
        let _land = self.land.lock().await;
        let restores = {
            let mut st = self.state.lock();
            st.record(Event::FlushDone { of, ok: false, lost: true }, "flush")?;
            st.lost_flushes += 1;
            let t = st.tracker(st.now());
            let mut ranges: Vec<(u64, u64)> = (t.writes.iter())
                .filter(|w| w.lost_by == Some(of))
                .filter_map(|w| match &st.events[w.pos] {
                    Event::Write { offset, payload, .. } => Some((*offset, *offset + payload.len())),
                    _ => None,
                })
                .collect();
            ranges.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::new();
            for (a, b) in ranges {
                match merged.last_mut() {
                    Some(last) if a <= last.1 => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            // Issued under the lock, as writes without a window are.
            (merged.into_iter())
                .map(|(a, b)| self.inner.write(a, Buf::from_slice(&st.render(&t, a, b - a)), false))
                .collect::<Vec<_>>()
        };
        for r in futures::future::join_all(restores).await {
            r?;
        }
        Err(Error::new(
            ErrorKind::Io,
            format!("{}: flush failed (injected); the writes it covered are lost", self.describe()),
        ))
    }
}

/// Waits the seeded delay of the request issued at `of`.
async fn delay(window: &Window, of: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(window.seed ^ 0x7769_6e64_6f77);
    rng.set_stream(of);
    if window.max_delay.is_zero() {
        for _ in 0..rng.gen_range(0..8) {
            tokio::task::yield_now().await;
        }
    } else {
        let ns = rng.gen_range(0..=window.max_delay.as_nanos() as u64);
        tokio::time::sleep(Duration::from_nanos(ns)).await;
    }
}

/// Whether the flush issued at `of` fails on purpose: the next one after `fail_next_flush`,
/// or as `Window::flush_fail` draws it.
fn flush_fails(st: &mut State, of: u64) -> bool {
    if st.fail_flushes > 0 {
        st.fail_flushes -= 1;
        return true;
    }
    match &st.window {
        Some(w) if w.flush_fail > 0.0 => {
            let mut rng = ChaCha8Rng::seed_from_u64(w.seed ^ 0x66_6c75_7368);
            rng.set_stream(of);
            rng.gen_bool(w.flush_fail.min(1.0))
        }
        _ => false,
    }
}

impl<D: BlockDev> BlockDev for PowerCut<D> {
    crate::forward!(inner: size, geometry);

    fn describe(&self) -> String {
        format!("powercut({})", self.inner.describe())
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        if self.is_dead() {
            return crate::ready(Err(self.dead_error("read")));
        }
        self.inner.read(offset, buf)
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            // The copy is what the history keeps; the buffer itself goes to the device.
            let payload = Payload::Data(buf.to_vec().into_boxed_slice());
            self.recorded("powercut write", offset, payload, fua, move || self.inner.write(offset, buf, fua)).await
        })
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            let (of, window) = {
                let mut st = self.state.lock();
                (st.record(Event::Flush, "flush")?, st.window.clone())
            };
            if let Some(w) = &window {
                delay(w, of).await;
            }
            if flush_fails(&mut self.state.lock(), of) {
                return self.lose_flush(of).await;
            }
            let r = self.inner.flush().await;
            self.state.lock().record(Event::FlushDone { of, ok: r.is_ok(), lost: false }, "flush")?;
            r
        })
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            let payload = Payload::Zeroes(len);
            self.recorded("powercut discard", offset, payload, false, move || self.inner.discard(offset, len)).await
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            let payload = Payload::Zeroes(len);
            let issue = move || self.inner.write_zeroes(offset, len, flags);
            self.recorded("powercut write_zeroes", offset, payload, false, issue).await
        })
    }

    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        if self.is_dead() {
            return crate::ready(Err(self.dead_error("block_status")));
        }
        self.inner.block_status(offset, len)
    }

    fn cache(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        if self.is_dead() {
            return crate::ready(Err(self.dead_error("cache")));
        }
        self.inner.cache(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sectors_split_at_absolute_boundaries() {
        let v: Vec<_> = sectors(500, 1100).collect();
        assert_eq!(v, [(0, 12), (12, 524), (524, 1036), (1036, 1100)]);
        assert_eq!(sectors(0, 0).count(), 0);
        assert_eq!(sectors(1024, 512).collect::<Vec<_>>(), [(0, 512)]);
    }

    #[test]
    fn a_shared_clock_cuts_devices_at_one_moment() {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
            let clock = Clock::default();
            let a = PowerCut::with_clock(MemDev::new(4096), clock.clone());
            let b = PowerCut::with_clock(MemDev::new(4096), clock.clone());
            a.write(0, Buf::from_slice(&[1; 512]), false).await.unwrap(); // ticks 0, 1
            a.flush().await.unwrap(); // ticks 2, 3
            let t = clock.now();
            b.write(0, Buf::from_slice(&[2; 512]), false).await.unwrap(); // ticks 4, 5
            b.flush().await.unwrap(); // ticks 6, 7
            a.write(512, Buf::from_slice(&[3; 512]), false).await.unwrap(); // ticks 8, 9
            assert_eq!((t, clock.now()), (4, 10));
            assert_eq!((a.flush_ticks(), b.flush_ticks()), (vec![3], vec![7]));
            assert_eq!((a.point_at_tick(t).unwrap(), b.point_at_tick(t).unwrap()), (4, 0));
            assert_eq!((a.point_at_tick(8).unwrap(), b.point_at_tick(8).unwrap()), (4, 4));
            assert_eq!(a.point_at_tick(clock.now()).unwrap(), a.now());
            let mut got = [0u8; 512];
            b.crash_at(b.point_at_tick(t).unwrap(), 1).unwrap().read_into(0, &mut got).unwrap();
            assert_eq!(got, [0; 512], "b had written nothing at tick {t}");
            assert!(PowerCut::new(MemDev::new(4096)).point_at_tick(0).is_err(), "no clock, no ticks");
        });
    }
}
