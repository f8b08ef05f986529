//! The scheduler itself, as plain data driven by the caller's clock: requests are submitted
//! to streams, `dispatch(now)` says which may go to the device, `complete(now)` reports one
//! done. Nothing here sleeps or reads a clock, so tests run it on a simulated one.
//!
//! It shares **device time**. Each group has a virtual time that advances by the device time
//! its requests cost divided by its weight; each stream (one per NBD connection) within a
//! group has one that advances by its device time. The group furthest behind goes next, and
//! within it the stream furthest behind (start-time fair queueing, two levels). A group or
//! stream that comes back from idle starts at the current virtual time, so idleness is not
//! banked: an idle group's time goes to the busy ones at once (work-conserving).
//!
//! On a seeky device (`slice > 0`) the chosen stream keeps the device for a time slice, and
//! when it runs out of requests the device waits up to `idle` for its next one (BFQ's and
//! CFQ's slice idling: a synchronous reader thinking between requests keeps its slot, and a
//! sequential reader stays sequential). So does a group furthest behind whose slice ran out
//! between two of its requests, before another group is chosen (CFQ's group idling). A slice
//! is charged the wall time it held the device (up to its allowance, its last request and the
//! idle window: more is a stall of the host or the device), or its requests' cost if that is
//! more. A sequential stream's slice starts once the head is back where the stream left off:
//! the seek there is the price of switching, not the stream's service, and charged to its
//! slice it cost a lone sequential reader a sixth of its half against one random reader.
//! Without slices every request is chosen afresh.
//!
//! A seeky stream (more than 4 of its last 32 requests started over `SEEK_BYTES` from where
//! its previous one ended, BFQ's and CFQ's rule) gains nothing from keeping the disk to
//! itself, and a group of many seeky streams taking a slice each would make every one of them
//! wait for all the others' slices. So when a seeky stream is chosen, the slice goes to all
//! of its group's seeky streams together (CFQ's sync-noidle service tree), with one idle
//! window when none of them has a request. The time such a slice held the device beyond its
//! requests' cost is shared among the streams it served.
//!
//! The seeky streams take turns round-robin, in a fixed order, each slice of theirs going on
//! from where the previous one stopped; and a slice of theirs goes on past its time until
//! every one of them that was waiting when it began has had its turn (for at most
//! `ROUND_SLICES` slices). So each waits for one round of its set's requests and one stretch
//! of the other groups' slices. Served by least service instead, a stream served early in one
//! slice could be passed over in the next while the others caught up, and wait through two
//! or three of the other groups' slices: 16 random readers at iodepth 1 against a busy group
//! waited three times as long as one did, where a round of them takes about as long as a
//! slice. The time a slice runs over is charged to the group like the rest, so the other
//! groups get it back by the usual accounting. A turn is one request, or a few while the
//! stream keeps requests queued and they cost under a quarter slice beyond the first (a seeky
//! stream's requests often lie near each other, in its own file or region: BFQ serves a
//! backlogged queue's budget in a row). The seek to a turn's first request is not counted:
//! it depends on where the stream before it in the order left the head, and counting it would
//! give the streams that follow a far one fewer requests, turn after turn.
//!
//! Caps (`riops`, `wiops`, `rbps`, `wbps`) are token buckets per group: after idling a group
//! may take `burst_ms` worth at once; while it has requests queued its buckets fill only up
//! to what its next request needs, so after the burst no window sees more than the cap (plus
//! one request). A capped group that may go again and is owed time takes the device from
//! the slice holder. A group with a `latency_ms` target whose recent requests took longer
//! goes before the others (io.latency). Whatever the weights, a request queued longer than
//! `max_wait` goes next, oldest first, one request at a time (no starvation).

use crate::cost::CostModel;
use crate::settings::GroupSettings;
use std::collections::{HashMap, VecDeque};
use strata_io::stats::latency_bucket;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub usize);
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub usize);
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// How the scheduler runs on its device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// Requests on the device at once.
    pub depth: usize,
    /// How long a stream keeps the device once chosen; 0 chooses request by request.
    pub slice: Nanos,
    /// How long the device waits for the next request of the stream holding it.
    pub idle: Nanos,
    /// The longest a request waits whatever the weights say.
    pub max_wait: Nanos,
}

impl Tuning {
    /// Defaults: on a rotational device one request at a time, 100 ms slices and an 8 ms
    /// idle window (CFQ's slice_sync and slice_idle); elsewhere 32 at a time,
    /// request by request.
    pub fn for_device(rotational: bool) -> Tuning {
        if rotational {
            Tuning { depth: 1, slice: 100_000_000, idle: 8_000_000, max_wait: 10_000_000_000 }
        } else {
            Tuning { depth: 32, slice: 0, idle: 0, max_wait: 1_000_000_000 }
        }
    }
}

/// Latency histogram buckets: upper bounds in microseconds, powers of two (as `StatsDev`).
pub use strata_io::stats::LATENCY_BUCKETS_US;

/// What a group has done, for status and metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupCounters {
    pub requests: u64,
    pub bytes: u64,
    /// Device time charged to the group.
    pub device_ns: u64,
    /// Time the group had requests queued but was held back by its caps.
    pub throttled_ns: u64,
    /// Latency from submission to completion, per `LATENCY_BUCKETS_US` bucket and one more.
    pub latency_buckets: Vec<u64>,
    pub latency_ns_sum: u64,
}

/// A group as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupReport {
    pub name: String,
    pub settings: GroupSettings,
    pub counters: GroupCounters,
    /// Share of all device time charged so far.
    pub share: f64,
    /// Requests queued (not yet on the device) and on the device.
    pub queued: usize,
    pub inflight: usize,
    /// Streams (connections) in the group, the group's own included.
    pub streams: usize,
    /// Those of them that are seeky now (they share the group's slices).
    pub seeky_streams: usize,
    /// Volumes in the group; a group with none is left from volumes removed.
    pub members: usize,
    /// The recent latency is above the group's target.
    pub latency_missed: bool,
}

struct Pending {
    ticket: Ticket,
    req: Request,
    arrived: Nanos,
}

struct Stream {
    group: GroupId,
    vtime: f64,
    queue: VecDeque<Pending>,
    inflight: usize,
    last_end: u64,
    last_done: Nanos,
    /// One bit per recent request, newest lowest: 1 if it started far from the previous one;
    /// `samples` of them (at most 32) are known.
    seeks: u32,
    samples: u8,
    open: bool,
}

/// A seeky slice goes on past its time until each of its streams that was waiting when it
/// began has had a turn, but for at most this many slices: a set of more streams than that
/// serves is served over several of its slices, each going on from where the last stopped,
/// and the other groups wait at most twice as long for it as for any other slice.
const ROUND_SLICES: u64 = 2;

/// A request that starts further than this from where its stream's previous one ended is a
/// seek (BFQ's and CFQ's threshold: 800 sectors).
pub const SEEK_BYTES: u64 = 800 * 512;

impl Stream {
    /// More than one in eight of its recent requests were seeks (of 32, more than 4: BFQ's
    /// and CFQ's rule). A stream with no history yet counts as seeky, so a new one is served
    /// with the others of its kind at once, not after a slice of its own.
    fn seeky(&self) -> bool {
        self.samples == 0 || self.seeks.count_ones() * 8 > u32::from(self.samples)
    }

    fn note_position(&mut self, req: &Request) {
        if self.last_end != u64::MAX {
            let far = req.offset.abs_diff(self.last_end) > SEEK_BYTES;
            self.seeks = (self.seeks << 1) | u32::from(far);
            self.samples = (self.samples + 1).min(32);
        }
        self.last_end = req.offset + req.len;
    }
}

/// A token bucket: `rate` per second, `tokens` as of `at`.
#[derive(Debug, Clone)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Nanos,
}

impl Bucket {
    fn new(rate: u64, burst_ms: u64) -> Bucket {
        let burst = rate as f64 * burst_ms as f64 / 1000.0;
        Bucket { rate: rate as f64, burst, tokens: burst, at: 0 }
    }

    /// Adds what accrued since `at`, up to `cap`.
    fn refill(&mut self, now: Nanos, cap: f64) {
        let accrued = self.rate * now.saturating_sub(self.at) as f64 / 1e9;
        self.tokens = (self.tokens + accrued).min(cap.max(self.tokens));
        self.at = now.max(self.at);
    }

    /// What `need` waits for: a request larger than the burst goes once the bucket is full.
    fn threshold(&self, need: f64) -> f64 {
        need.min(self.burst.max(1.0))
    }
}

struct Group {
    name: String,
    settings: GroupSettings,
    vtime: f64,
    /// The virtual time of the stream last chosen in this group.
    stream_vnow: f64,
    streams: Vec<StreamId>,
    /// Where in `streams` the seeky set's next turn is looked for, carried from one of the
    /// set's slices to the next; and the stream whose turn is going on, with its cost so far.
    seeky_next: usize,
    seeky_turn: Option<(StreamId, Nanos)>,
    own: StreamId,
    /// riops, wiops, rbps, wbps.
    buckets: [Option<Bucket>; 4],
    throttled_since: Option<Nanos>,
    queued: usize,
    inflight: usize,
    latency_ewma_ns: f64,
    /// When a request of the group last completed.
    last_done: Nanos,
    counters: GroupCounters,
    /// Volumes in the group (`join`, `leave`).
    members: usize,
    /// Its last volume left (`leave`), and none joined since.
    left: bool,
}

impl Group {
    fn backlogged(&self) -> bool {
        self.queued > 0
    }

    fn latency_missed(&self) -> bool {
        self.settings.latency_ms.is_some_and(|ms| self.latency_ewma_ns > ms as f64 * 1e6)
    }

    fn set_buckets(&mut self) {
        let s = &self.settings;
        let old = std::mem::take(&mut self.buckets);
        for (i, cap) in [s.riops, s.wiops, s.rbps, s.wbps].into_iter().enumerate() {
            self.buckets[i] = cap.map(|rate| {
                let mut b = Bucket::new(rate, s.burst_ms);
                if let Some(o) = &old[i] {
                    b.tokens = o.tokens.min(b.burst);
                    b.at = o.at;
                }
                b
            });
        }
    }

    /// The buckets `req` draws on and how much from each.
    fn needs(req: &Request) -> [(usize, f64); 2] {
        match req.op {
            Op::Read => [(0, 1.0), (2, req.len as f64)],
            Op::Write => [(1, 1.0), (3, req.len as f64)],
            Op::Flush | Op::Discard => [(0, 0.0), (2, 0.0)],
        }
    }

    /// When `req` may go: `None` now, else the time its buckets will hold enough.
    fn held_until(&mut self, req: &Request, now: Nanos) -> Option<Nanos> {
        let mut until = None;
        for (i, need) in Group::needs(req) {
            let Some(b) = &mut self.buckets[i] else { continue };
            let threshold = b.threshold(need);
            b.refill(now, threshold);
            if b.tokens < threshold {
                let wait = ((threshold - b.tokens) / b.rate * 1e9).ceil() as Nanos;
                until = Some(until.unwrap_or(0).max(now + wait.max(1)));
            }
        }
        until
    }

    fn take_tokens(&mut self, req: &Request) {
        for (i, need) in Group::needs(req) {
            if let Some(b) = &mut self.buckets[i] {
                b.tokens -= need;
            }
        }
    }
}

/// What the holder of a slice can do next.
enum Work {
    /// This stream has a request queued.
    Queued(StreamId),
    /// Nothing queued, something on the device.
    Running,
    /// Nothing queued or running; the last request completed then.
    Thinking(Nanos),
    /// Nothing queued or running, and no connection to send more.
    Gone,
}

struct Running {
    stream: StreamId,
    req: Request,
    submitted: Nanos,
}

/// The stream holding the device on a seeky device, since `started`, charged `charged` so far.
struct Slice {
    stream: StreamId,
    /// The slice belongs to all of `stream`'s group's seeky streams; these were served in it.
    seeky: Option<Vec<StreamId>>,
    /// The seeky streams that had a request queued when the slice began: it goes on past its
    /// time until each of them has had a turn. Not those with no history yet: they count as
    /// seeky only until they show what they are, and a crowd of new sequential readers would
    /// hold the device for the longest such slice once.
    owed: Vec<StreamId>,
    started: Nanos,
    charged: Nanos,
    /// The modelled cost of the last request sent in it.
    last_cost: Nanos,
    /// Ends after one request (a stream served because it waited too long).
    single: bool,
    taken: u32,
}

pub struct Scheduler {
    tuning: Tuning,
    cost: CostModel,
    groups: Vec<Group>,
    streams: Vec<Option<Stream>>,
    free_streams: Vec<usize>,
    /// Streams whose connection is closing: their requests go as the device takes them,
    /// past caps and shares (a gone client's request must not hold a shutdown for its
    /// cap's time).
    draining: Vec<StreamId>,
    running: HashMap<Ticket, Running>,
    next_ticket: u64,
    /// Where the last request sent to the device ended.
    head: u64,
    /// The virtual time of the group last chosen.
    vnow: f64,
    slice: Option<Slice>,
    device_ns: u64,
}

impl Scheduler {
    pub fn new(tuning: Tuning, cost: CostModel) -> Scheduler {
        Scheduler {
            tuning,
            cost,
            groups: Vec::new(),
            streams: Vec::new(),
            free_streams: Vec::new(),
            draining: Vec::new(),
            running: HashMap::new(),
            next_ticket: 0,
            head: 0,
            vnow: 0.0,
            slice: None,
            device_ns: 0,
        }
    }

    pub fn tuning(&self) -> Tuning {
        self.tuning
    }

    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }

    /// Adds a group (with its own stream, for requests from no connection in particular).
    /// A group its volumes all left, with nothing queued or running and no connection's
    /// stream, gives the new one its place: groups that volumes make and leave come and go
    /// without the list (which every dispatch walks) growing.
    pub fn add_group(&mut self, name: &str, settings: GroupSettings) -> GroupId {
        let unused = |g: &Group| g.left && g.queued == 0 && g.inflight == 0 && g.streams == [g.own];
        let reuse = self.groups.iter().position(unused);
        let id = GroupId(reuse.unwrap_or(self.groups.len()));
        let mut g = Group {
            name: name.to_string(),
            settings,
            vtime: self.vnow,
            stream_vnow: 0.0,
            streams: Vec::new(),
            seeky_next: 0,
            seeky_turn: None,
            own: StreamId(usize::MAX),
            buckets: Default::default(),
            throttled_since: None,
            queued: 0,
            inflight: 0,
            latency_ewma_ns: 0.0,
            last_done: 0,
            counters: GroupCounters { latency_buckets: vec![0; LATENCY_BUCKETS_US.len() + 1], ..Default::default() },
            members: 0,
            left: false,
        };
        g.set_buckets();
        match reuse {
            Some(i) => {
                let own = self.groups[i].own;
                self.stream_mut(own).open = false;
                self.reap(own);
                self.groups[i] = g;
            }
            None => self.groups.push(g),
        }
        self.groups[id.0].own = self.open_stream(id);
        id
    }

    /// A volume enters group `g`.
    pub fn join(&mut self, g: GroupId) {
        let g = &mut self.groups[g.0];
        g.members += 1;
        g.left = false;
    }

    /// A volume of group `g` is gone.
    pub fn leave(&mut self, g: GroupId) {
        let g = &mut self.groups[g.0];
        g.members -= 1;
        g.left = g.members == 0;
    }

    /// The group of that name, unless its last volume has left: the next to join it then
    /// starts it afresh, settings and counters alike.
    pub fn group(&self, name: &str) -> Option<GroupId> {
        self.groups.iter().position(|g| g.name == name && !g.left).map(GroupId)
    }

    pub fn groups(&self) -> impl Iterator<Item = GroupId> {
        (0..self.groups.len()).map(GroupId)
    }

    pub fn settings(&self, g: GroupId) -> &GroupSettings {
        &self.groups[g.0].settings
    }

    /// Changes a group's weight and caps; takes effect with its next request.
    pub fn set(&mut self, g: GroupId, settings: GroupSettings) {
        let g = &mut self.groups[g.0];
        g.settings = settings;
        g.set_buckets();
    }

    /// The stream for requests from no connection in particular.
    pub fn own_stream(&self, g: GroupId) -> StreamId {
        self.groups[g.0].own
    }

    /// A new stream (a connection) in group `g`.
    pub fn open_stream(&mut self, g: GroupId) -> StreamId {
        let s = Stream {
            group: g,
            vtime: self.groups[g.0].stream_vnow,
            queue: VecDeque::new(),
            inflight: 0,
            last_end: u64::MAX,
            last_done: 0,
            seeks: 0,
            samples: 0,
            open: true,
        };
        let id = match self.free_streams.pop() {
            Some(i) => {
                self.streams[i] = Some(s);
                i
            }
            None => {
                self.streams.push(Some(s));
                self.streams.len() - 1
            }
        };
        self.groups[g.0].streams.push(StreamId(id));
        StreamId(id)
    }

    /// The connection is closing: stream `s`'s requests wait for no cap or share.
    pub fn drain_stream(&mut self, s: StreamId) {
        if !self.draining.contains(&s) {
            self.draining.push(s);
        }
    }

    /// The connection is gone: the stream goes once its requests are done.
    pub fn close_stream(&mut self, s: StreamId) {
        self.stream_mut(s).open = false;
        self.reap(s);
    }

    fn reap(&mut self, s: StreamId) {
        let st = self.stream(s);
        if st.open || !st.queue.is_empty() || st.inflight > 0 {
            return;
        }
        let gid = st.group;
        self.leave_slice(s, gid);
        let g = &mut self.groups[gid.0];
        if let Some(i) = g.streams.iter().position(|x| *x == s) {
            g.streams.remove(i);
            if i < g.seeky_next {
                g.seeky_next -= 1;
            }
        }
        self.streams[s.0] = None;
        self.free_streams.push(s.0);
        self.draining.retain(|&x| x != s);
    }

    /// Stream `s` of group `gid` goes: the slice in progress forgets it. A seeky slice is its
    /// group's, not its holder's: it goes on under another of the group's streams, or the
    /// streams still waiting for their turn in it would lose that turn and wait through the
    /// other groups' slices once more. Any other slice of `s` ends here.
    fn leave_slice(&mut self, s: StreamId, gid: GroupId) {
        let Some(sl) = &mut self.slice else { return };
        sl.owed.retain(|&x| x != s);
        if let Some(served) = &mut sl.seeky {
            served.retain(|&x| x != s);
        }
        if sl.stream != s {
            return;
        }
        let others = self.groups[gid.0].streams.iter().copied().filter(|&x| x != s);
        let heir = match sl.seeky {
            Some(_) => others.min_by_key(|&x| !self.streams[x.0].as_ref().is_some_and(Stream::seeky)),
            None => None,
        };
        match (heir, &mut self.slice) {
            (Some(h), Some(sl)) => sl.stream = h,
            _ => self.slice = None,
        }
    }

    fn stream(&self, s: StreamId) -> &Stream {
        self.streams[s.0].as_ref().expect("a live stream")
    }

    fn stream_mut(&mut self, s: StreamId) -> &mut Stream {
        self.streams[s.0].as_mut().expect("a live stream")
    }

    /// Queues `req` on stream `s`; it goes to the device when `dispatch` says so.
    pub fn submit(&mut self, s: StreamId, req: Request, now: Nanos) -> Ticket {
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        let (gid, was_idle) = {
            let st = self.stream(s);
            (st.group, st.queue.is_empty())
        };
        let g = &mut self.groups[gid.0];
        if !g.backlogged() && g.inflight == 0 {
            // Back from idle: its buckets refill up to the burst, and it does not bank the
            // time it was away.
            for b in g.buckets.iter_mut().flatten() {
                let burst = b.burst;
                b.refill(now, burst);
            }
            g.vtime = g.vtime.max(self.vnow);
        }
        g.queued += 1;
        let floor = g.stream_vnow;
        let st = self.stream_mut(s);
        if was_idle && st.inflight == 0 {
            st.vtime = st.vtime.max(floor);
        }
        st.queue.push_back(Pending { ticket, req, arrived: now });
        ticket
    }

    /// Withdraws a request not yet sent to the device; false if it had been sent.
    pub fn cancel(&mut self, s: StreamId, t: Ticket) -> bool {
        let st = self.stream_mut(s);
        let Some(i) = st.queue.iter().position(|p| p.ticket == t) else { return false };
        st.queue.remove(i);
        let g = st.group;
        self.groups[g.0].queued -= 1;
        self.reap(s);
        true
    }

    /// Reports a request done.
    pub fn complete(&mut self, t: Ticket, now: Nanos) {
        let Some(r) = self.running.remove(&t) else { return };
        let st = self.stream_mut(r.stream);
        st.inflight -= 1;
        st.last_done = now;
        let gid = st.group;
        let g = &mut self.groups[gid.0];
        g.inflight -= 1;
        g.last_done = now;
        let latency = now.saturating_sub(r.submitted);
        let c = &mut g.counters;
        c.requests += 1;
        c.bytes += r.req.len;
        c.latency_ns_sum += latency;
        c.latency_buckets[latency_bucket(latency / 1000)] += 1;
        g.latency_ewma_ns =
            if g.counters.requests == 1 { latency as f64 } else { 0.8 * g.latency_ewma_ns + 0.2 * latency as f64 };
        self.reap(r.stream);
    }

    /// Requests that may go to the device now, appended to `out` in order. Returns when to
    /// call again if something is waiting on time (an idle window or a cap) rather than on a
    /// completion or a submission.
    pub fn dispatch(&mut self, now: Nanos, out: &mut Vec<Ticket>) -> Option<Nanos> {
        let mut wake: Option<Nanos> = None;
        let soonest = |t: Nanos, wake: &mut Option<Nanos>| *wake = Some(wake.map_or(t, |w| w.min(t)));
        while self.running.len() < self.tuning.depth {
            if let Some(&s) = self.draining.iter().find(|&&s| !self.stream(s).queue.is_empty()) {
                out.push(self.send(s, now));
                continue;
            }
            if self.tuning.slice > 0 {
                if let Some(sl) = &mut self.slice {
                    // A holder that turned out seeky shares its slice with its group's others.
                    let holder_seeky = self.streams[sl.stream.0].as_ref().is_some_and(Stream::seeky);
                    if sl.seeky.is_none() && !sl.single && holder_seeky {
                        sl.seeky = Some(vec![sl.stream]);
                    }
                    let (holder, seeky, started) = (sl.stream, sl.seeky.is_some(), sl.started);
                    let done_single = sl.single && sl.taken > 0;
                    let elapsed = now.saturating_sub(started);
                    let over = elapsed >= self.tuning.slice;
                    let owes = seeky && over && elapsed < ROUND_SLICES * self.tuning.slice && self.owes_turns();
                    let expired = (over && !owes) || done_single || self.preempted_by_cap(holder, now);
                    let w = if seeky { self.seeky_work(holder) } else { self.stream_work(holder) };
                    if !expired {
                        match w {
                            Work::Queued(s) => match self.held(s, now) {
                                None => {
                                    out.push(self.send(s, now));
                                    continue;
                                }
                                Some(until) => soonest(until, &mut wake),
                            },
                            Work::Running => return wake,
                            Work::Thinking(last_done) if now < last_done + self.tuning.idle => {
                                soonest(last_done + self.tuning.idle, &mut wake);
                                return wake;
                            }
                            Work::Thinking(_) | Work::Gone => {}
                        }
                    }
                    self.end_slice(now);
                }
            }
            match self.pick(now) {
                Ok((s, starved)) => {
                    if self.tuning.slice > 0 {
                        // A stream served because it waited too long gets one request, not a slice.
                        let seeky = (!starved && self.stream(s).seeky()).then(Vec::new);
                        let owed = match seeky {
                            Some(_) => self.groups[self.stream(s).group.0]
                                .streams
                                .iter()
                                .copied()
                                .filter(|&x| {
                                    let st = self.stream(x);
                                    st.samples > 0 && st.seeky() && !st.queue.is_empty()
                                })
                                .collect(),
                            None => Vec::new(),
                        };
                        // A sequential stream's slice starts once the head is back where it
                        // left off: the seek there is the price of switching, not its service.
                        let started = if seeky.is_none() && !starved { now + self.switch_seek(s) } else { now };
                        self.slice = Some(Slice {
                            stream: s,
                            seeky,
                            owed,
                            started,
                            charged: 0,
                            last_cost: 0,
                            single: starved,
                            taken: 0,
                        });
                    }
                    out.push(self.send(s, now));
                }
                Err(until) => {
                    if let Some(u) = until {
                        soonest(u, &mut wake);
                    }
                    return wake;
                }
            }
        }
        wake
    }

    /// A group held back by its caps may go again and is owed more time than the slice
    /// holder's group: it takes the device now rather than after the slice, or a capped
    /// group would get one request per slice of the others instead of its cap.
    fn preempted_by_cap(&mut self, holder: StreamId, now: Nanos) -> bool {
        let hg = self.stream(holder).group;
        let hv = self.groups[hg.0].vtime;
        for i in 0..self.groups.len() {
            let g = &self.groups[i];
            if i == hg.0 || g.throttled_since.is_none() || !g.backlogged() || g.vtime >= hv {
                continue;
            }
            let Some(req) = g.streams.iter().find_map(|&s| self.stream(s).queue.front().map(|p| p.req)) else {
                continue;
            };
            if self.groups[i].held_until(&req, now).is_none() {
                return true;
            }
        }
        false
    }

    /// The cost of stream `s`'s first request from where the head is, beyond its cost from
    /// where the stream's previous request ended.
    fn switch_seek(&self, s: StreamId) -> Nanos {
        let st = self.stream(s);
        let Some(p) = st.queue.front() else { return 0 };
        if st.last_end == u64::MAX || !matches!(p.req.op, Op::Read | Op::Write) {
            return 0;
        }
        let (op, offset, len) = (p.req.op, p.req.offset, p.req.len);
        self.cost.cost(op, offset, len, self.head).saturating_sub(self.cost.cost(op, offset, len, st.last_end))
    }

    /// What the holder of a stream's slice can do next.
    fn stream_work(&self, s: StreamId) -> Work {
        let st = self.stream(s);
        if !st.queue.is_empty() {
            Work::Queued(s)
        } else if !st.open {
            Work::Gone
        } else if st.inflight > 0 {
            Work::Running
        } else {
            Work::Thinking(st.last_done)
        }
    }

    /// Whether the seeky slice in progress still owes a turn to one of `owed`: one it has not
    /// served that is still seeky and has a request queued. Its turns go on in their order
    /// meanwhile, to whichever stream is next, so none is passed over.
    fn owes_turns(&self) -> bool {
        let Some(sl) = &self.slice else { return false };
        let served = sl.seeky.as_deref().unwrap_or(&[]);
        sl.owed.iter().any(|s| {
            !served.contains(s) && self.streams[s.0].as_ref().is_some_and(|st| st.seeky() && !st.queue.is_empty())
        })
    }

    /// What the seeky streams of `holder`'s group can do next: the one whose turn it is.
    fn seeky_work(&self, holder: StreamId) -> Work {
        let gid = self.stream(holder).group;
        if let Some(s) = self.seeky_turn(gid) {
            return Work::Queued(s);
        }
        let (mut running, mut thinking) = (false, None::<Nanos>);
        for &s in &self.groups[gid.0].streams {
            let st = self.stream(s);
            if !st.seeky() {
                continue;
            }
            if st.inflight > 0 {
                running = true;
            } else if st.open {
                thinking = Some(thinking.unwrap_or(0).max(st.last_done));
            }
        }
        match (running, thinking) {
            (true, _) => Work::Running,
            (false, Some(t)) => Work::Thinking(t),
            (false, None) => Work::Gone,
        }
    }

    /// The seeky stream of group `gid` whose turn is next: the first with a request queued
    /// from the group's cursor on.
    fn seeky_turn(&self, gid: GroupId) -> Option<StreamId> {
        let g = &self.groups[gid.0];
        let n = g.streams.len();
        (0..n).map(|i| g.streams[(g.seeky_next + i) % n]).find(|&s| {
            let st = self.stream(s);
            st.seeky() && !st.queue.is_empty()
        })
    }

    /// Charges the slice's holders the wall time it held the device, if more than their
    /// requests' cost: the stream that held it, or in equal parts the seeky streams it served.
    /// Wall time is counted up to what the slice was allowed, its last request's cost and the
    /// idle window: a slice that outlasts that was held up by the host or the device, not by
    /// its streams, and charging a stall of S to one of N equal streams would keep it waiting
    /// about 2·N·S while the others caught up.
    fn end_slice(&mut self, now: Nanos) {
        let Some(sl) = self.slice.take() else { return };
        let allowed = if sl.seeky.is_some() { ROUND_SLICES } else { 1 } * self.tuning.slice;
        let wall = now.saturating_sub(sl.started).min(allowed + sl.last_cost + self.tuning.idle);
        if wall <= sl.charged {
            return;
        }
        let rest = wall - sl.charged;
        match sl.seeky {
            Some(served) if !served.is_empty() => {
                let part = rest / served.len() as u64;
                for s in served {
                    if self.streams[s.0].is_some() {
                        self.charge(s, part);
                    }
                }
            }
            _ if self.streams[sl.stream.0].is_some() => self.charge(sl.stream, rest),
            _ => {}
        }
    }

    fn charge(&mut self, s: StreamId, ns: Nanos) {
        let st = self.stream_mut(s);
        st.vtime += ns as f64;
        let gid = st.group;
        let g = &mut self.groups[gid.0];
        g.vtime += ns as f64 / g.settings.weight as f64;
        g.counters.device_ns += ns;
        self.device_ns += ns;
    }

    /// The stream to serve next: the oldest request past `max_wait`, else the group with a
    /// missed latency target, else the group and then the stream furthest behind. Groups held
    /// by their caps are skipped; `Err` says when the first of them may go again.
    fn pick(&mut self, now: Nanos) -> Result<(StreamId, bool), Option<Nanos>> {
        let mut held: Option<Nanos> = None;
        // Grown only when a group is held (dispatch runs on every submission and completion).
        let mut skip: Vec<bool> = Vec::new();
        loop {
            let mut starving: Option<(Nanos, StreamId)> = None;
            let mut best: Option<(u8, f64, GroupId)> = None;
            for (i, g) in self.groups.iter().enumerate() {
                if skip.get(i).copied().unwrap_or(false) || !g.backlogged() {
                    continue;
                }
                for &s in &g.streams {
                    if let Some(p) = self.stream(s).queue.front() {
                        if now.saturating_sub(p.arrived) >= self.tuning.max_wait
                            && starving.is_none_or(|(a, _)| p.arrived < a)
                        {
                            starving = Some((p.arrived, s));
                        }
                    }
                }
                // Groups missing their latency target first, then the furthest behind.
                let key = (u8::from(!g.latency_missed()), g.vtime, GroupId(i));
                if best.is_none_or(|b| key.0 < b.0 || (key.0 == b.0 && key.1 < b.1)) {
                    best = Some(key);
                }
            }
            if starving.is_none() {
                if let Some(until) = self.thinking_ahead_of(best.map(|(l, v, _)| (l, v)), now) {
                    return Err(Some(until));
                }
            }
            let (s, starved) = match (starving, best) {
                (Some((_, s)), _) => (s, true),
                (None, Some((_, _, gid))) => {
                    let g = &self.groups[gid.0];
                    let s = g
                        .streams
                        .iter()
                        .copied()
                        .filter(|&s| !self.stream(s).queue.is_empty())
                        .min_by(|a, b| self.stream(*a).vtime.total_cmp(&self.stream(*b).vtime))
                        .expect("a backlogged group has a stream with requests");
                    // A seeky stream's slice is its group's seeky set's: it starts with the
                    // stream whose turn is next.
                    let s = if self.tuning.slice > 0 && self.stream(s).seeky() {
                        self.seeky_turn(gid).unwrap_or(s)
                    } else {
                        s
                    };
                    (s, false)
                }
                (None, None) => return Err(held),
            };
            let gid = self.stream(s).group;
            let req = self.stream(s).queue.front().expect("queued").req;
            match self.groups[gid.0].held_until(&req, now) {
                None => {
                    self.vnow = self.vnow.max(self.groups[gid.0].vtime);
                    let v = self.stream(s).vtime;
                    let g = &mut self.groups[gid.0];
                    g.stream_vnow = g.stream_vnow.max(v);
                    return Ok((s, starved));
                }
                Some(until) => {
                    let g = &mut self.groups[gid.0];
                    g.throttled_since.get_or_insert(now);
                    if skip.len() <= gid.0 {
                        skip.resize(self.groups.len(), false);
                    }
                    skip[gid.0] = true;
                    held = Some(held.map_or(until, |h| h.min(until)));
                }
            }
        }
    }

    /// On a seeky device, a group with nothing queued whose last request completed within the
    /// idle window, and that goes before `best` (the first of the backlogged groups): the
    /// device waits for its next request until the window ends, the time returned. Its slice
    /// may have run out between two of its requests; without the wait the other groups would
    /// take the device while it thinks, and a group of synchronous readers would get one
    /// slice for each of theirs, however long those are, not its share.
    fn thinking_ahead_of(&self, best: Option<(u8, f64)>, now: Nanos) -> Option<Nanos> {
        if self.tuning.slice == 0 {
            return None;
        }
        self.groups
            .iter()
            .filter(|g| !g.backlogged() && g.inflight == 0 && g.counters.requests > 0)
            .filter(|g| now < g.last_done + self.tuning.idle)
            .filter(|g| best.is_none_or(|b| (u8::from(!g.latency_missed()), g.vtime) < b))
            .map(|g| g.last_done + self.tuning.idle)
            .min()
    }

    /// When the caps allow the first request of stream `s`: `None` now.
    fn held(&mut self, s: StreamId, now: Nanos) -> Option<Nanos> {
        let gid = self.stream(s).group;
        let req = self.stream(s).queue.front().expect("queued").req;
        let until = self.groups[gid.0].held_until(&req, now);
        if until.is_some() {
            self.groups[gid.0].throttled_since.get_or_insert(now);
        }
        until
    }

    /// Sends the first request of stream `s` to the device (its caps allow it: `held` or
    /// `pick` said so).
    fn send(&mut self, s: StreamId, now: Nanos) -> Ticket {
        let gid = self.stream(s).group;
        let p = self.stream_mut(s).queue.pop_front().expect("queued");
        let req = p.req;
        let g = &mut self.groups[gid.0];
        g.take_tokens(&req);
        if let Some(since) = g.throttled_since.take() {
            g.counters.throttled_ns += now.saturating_sub(since);
        }
        g.queued -= 1;
        g.inflight += 1;
        let last_end = match self.cost {
            CostModel::Hdd { .. } => self.head,
            CostModel::Linear(_) => self.stream(s).last_end,
        };
        let cost = self.cost.cost(req.op, req.offset, req.len, last_end);
        if matches!(req.op, Op::Read | Op::Write) {
            self.head = req.offset + req.len;
            self.stream_mut(s).note_position(&req);
        }
        self.stream_mut(s).inflight += 1;
        self.charge(s, cost);
        if let Some(sl) = &mut self.slice {
            sl.charged += cost;
            sl.last_cost = cost;
            sl.taken += 1;
            if let Some(served) = &mut sl.seeky {
                if !served.contains(&s) {
                    served.push(s);
                }
                // The turn goes on while the stream keeps requests queued and they have cost
                // under a quarter slice beyond the first, into the set's next slice if this one
                // ends first.
                let backlogged = self.streams[s.0].as_ref().is_some_and(|st| !st.queue.is_empty());
                let g = &mut self.groups[gid.0];
                let turn = match g.seeky_turn {
                    Some((t, ns)) if t == s => ns + cost,
                    _ => 0,
                };
                let i = g.streams.iter().position(|x| *x == s).unwrap_or(0);
                if backlogged && turn < self.tuning.slice / 4 {
                    g.seeky_turn = Some((s, turn));
                    g.seeky_next = i;
                } else {
                    g.seeky_turn = None;
                    g.seeky_next = i + 1;
                }
            }
        }
        self.running.insert(p.ticket, Running { stream: s, req, submitted: p.arrived });
        p.ticket
    }

    pub fn name(&self, g: GroupId) -> &str {
        &self.groups[g.0].name
    }

    pub fn report(&self, g: GroupId) -> GroupReport {
        let gr = &self.groups[g.0];
        GroupReport {
            name: gr.name.clone(),
            settings: gr.settings.clone(),
            counters: gr.counters.clone(),
            share: if self.device_ns == 0 { 0.0 } else { gr.counters.device_ns as f64 / self.device_ns as f64 },
            queued: gr.queued,
            inflight: gr.inflight,
            streams: gr.streams.len(),
            seeky_streams: gr.streams.iter().filter(|&&s| self.stream(s).seeky()).count(),
            members: gr.members,
            latency_missed: gr.latency_missed(),
        }
    }
}
