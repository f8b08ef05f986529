//! The scheduler on a simulated clock and device: the device serves one request at a time
//! for exactly what the cost model charges, and clients keep their requests outstanding.
//! Device time per group is measured here, by the device, not taken from the scheduler.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{HashMap, VecDeque};
use strata_io::latency::HddParams;
use strata_qos::sched::{GroupId, Nanos, Op, Request, StreamId, Ticket};
use strata_qos::{CostModel, GroupSettings, Linear, Scheduler, Tuning};

const SEC: Nanos = 1_000_000_000;
const MS: Nanos = 1_000_000;
const DISK: u64 = 100 << 30;
/// One group's slice in the benchmark's layout of seed 001's experiments: an 8 GiB disk cut
/// in two.
const HALF: u64 = 4 << 30;

#[derive(Clone, Copy)]
enum Pattern {
    Random,
    Sequential,
    /// Random 64 KiB-aligned offsets within the client's own 1/64 of the disk (a file, a
    /// region), as fio's jobs with offset_increment do.
    Local,
}

struct Client {
    stream: StreamId,
    group: usize,
    think: Nanos,
    pattern: Pattern,
    next_offset: u64,
    /// Where its random and sequential requests fall: `len` bytes from `base`.
    base: u64,
    len: u64,
    /// Submits nothing from this time on, and closes its stream once its requests are done
    /// (a fio job whose runtime is over).
    leaves: Nanos,
}

struct Sim {
    sched: Scheduler,
    model: CostModel,
    now: Nanos,
    groups: Vec<GroupId>,
    clients: Vec<Client>,
    rng: ChaCha8Rng,
    tickets: HashMap<Ticket, (usize, Request, Nanos)>,
    /// Sent by the scheduler, waiting for the device (FIFO).
    device_queue: VecDeque<Ticket>,
    on_device: Option<(Ticket, Nanos)>,
    head: u64,
    /// Client submissions due: (time, client).
    due: Vec<(Nanos, usize)>,
    /// Per group: device time, and each request's dispatch time.
    device_ns: Vec<Nanos>,
    dispatched: Vec<Vec<Nanos>>,
    /// Per client: each request's wait from submission to dispatch.
    waits: Vec<Vec<Nanos>>,
    /// (at, for): the first request the device starts at or after `at` takes `for` longer
    /// (the host or the device stalling).
    stall: Option<(Nanos, Nanos)>,
}

impl Sim {
    fn new(tuning: Tuning, model: CostModel) -> Sim {
        Sim {
            sched: Scheduler::new(tuning, model),
            model,
            now: 0,
            groups: Vec::new(),
            clients: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(7),
            tickets: HashMap::new(),
            device_queue: VecDeque::new(),
            on_device: None,
            head: 0,
            due: Vec::new(),
            device_ns: Vec::new(),
            dispatched: Vec::new(),
            waits: Vec::new(),
            stall: None,
        }
    }

    fn hdd() -> Sim {
        Sim::hdd_of(DISK)
    }

    fn hdd_of(size: u64) -> Sim {
        Sim::new(Tuning::for_device(true), CostModel::Hdd { params: HddParams::default(), size })
    }

    fn group(&mut self, name: &str, settings: GroupSettings) -> usize {
        self.groups.push(self.sched.add_group(name, settings));
        self.device_ns.push(0);
        self.dispatched.push(Vec::new());
        self.groups.len() - 1
    }

    fn weighted(&mut self, name: &str, weight: u32) -> usize {
        self.group(name, GroupSettings { weight, ..GroupSettings::default() })
    }

    fn client(&mut self, group: usize, depth: usize, think: Nanos, pattern: Pattern, start: Nanos) -> usize {
        let stream = self.sched.open_stream(self.groups[group]);
        let next_offset = self.rng.gen_range(0..DISK / 4096) * 4096;
        self.clients.push(Client {
            stream,
            group,
            think,
            pattern,
            next_offset,
            base: 0,
            len: DISK,
            leaves: Nanos::MAX,
        });
        self.waits.push(Vec::new());
        let c = self.clients.len() - 1;
        for _ in 0..depth {
            self.due.push((start, c));
        }
        c
    }

    /// A client whose requests fall in `len` bytes from `base`, sequential ones from `base` on
    /// (a fio job with `offset_increment`).
    fn client_in(&mut self, group: usize, think: Nanos, pattern: Pattern, base: u64, len: u64) -> usize {
        let c = self.client(group, 1, think, pattern, 0);
        let cl = &mut self.clients[c];
        (cl.base, cl.len, cl.next_offset) = (base, len, base);
        c
    }

    fn submit(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        let offset = match cl.pattern {
            Pattern::Random => cl.base + self.rng.gen_range(0..cl.len / 4096) * 4096,
            Pattern::Sequential => {
                let o = cl.next_offset;
                cl.next_offset = cl.base + (o + 4096 - cl.base) % cl.len;
                o
            }
            Pattern::Local => {
                let region = DISK / 64;
                let base = cl.next_offset / region * region;
                base + self.rng.gen_range(0..region / 65536) * 65536
            }
        };
        let req = Request { op: Op::Read, offset, len: 4096 };
        let t = self.sched.submit(cl.stream, req, self.now);
        self.tickets.insert(t, (c, req, self.now));
    }

    fn run_until(&mut self, end: Nanos) {
        let mut out = Vec::new();
        while self.now < end {
            // Submissions due now.
            let mut i = 0;
            while i < self.due.len() {
                if self.due[i].0 <= self.now {
                    let (_, c) = self.due.swap_remove(i);
                    self.submit(c);
                } else {
                    i += 1;
                }
            }
            let wake = self.sched.dispatch(self.now, &mut out);
            for t in out.drain(..) {
                let (c, _, submitted) = self.tickets[&t];
                self.waits[c].push(self.now - submitted);
                self.dispatched[self.clients[c].group].push(self.now);
                self.device_queue.push_back(t);
            }
            if self.on_device.is_none() {
                if let Some(t) = self.device_queue.pop_front() {
                    let (c, req, _) = self.tickets[&t];
                    let mut service = self.model.cost(req.op, req.offset, req.len, self.head).max(1);
                    if let Some((_, extra)) = self.stall.filter(|&(at, _)| at <= self.now) {
                        service += extra;
                        self.stall = None;
                    }
                    self.head = req.offset + req.len;
                    self.device_ns[self.clients[c].group] += service;
                    self.on_device = Some((t, self.now + service));
                }
            }
            let mut next = end;
            if let Some((_, done)) = self.on_device {
                next = next.min(done);
            }
            if let Some(w) = wake {
                next = next.min(w.max(self.now + 1));
            }
            for &(at, _) in &self.due {
                next = next.min(at.max(self.now));
            }
            self.now = next;
            if let Some((t, done)) = self.on_device {
                if done <= self.now {
                    self.on_device = None;
                    self.sched.complete(t, self.now);
                    let (c, _, _) = self.tickets.remove(&t).unwrap();
                    let cl = &self.clients[c];
                    if self.now + cl.think < cl.leaves {
                        self.due.push((self.now + cl.think, c));
                    } else if !self.tickets.values().any(|&(o, _, _)| o == c) {
                        self.sched.close_stream(cl.stream);
                    }
                }
            }
        }
    }

    /// The longest any of `clients`' requests waited from submission to dispatch.
    fn worst_wait(&self, clients: &[usize]) -> Nanos {
        clients.iter().flat_map(|&c| self.waits[c].iter().copied()).max().unwrap_or(0)
    }

    /// The fewest and the most requests any of `clients` had dispatched.
    fn served(&self, clients: &[usize]) -> (usize, usize) {
        let n = clients.iter().map(|&c| self.waits[c].len());
        (n.clone().min().unwrap_or(0), n.max().unwrap_or(0))
    }

    /// Restarts each group's device time count.
    fn reset(&mut self) {
        self.device_ns.iter_mut().for_each(|d| *d = 0);
    }
}

fn assert_ratio(got_a: Nanos, got_b: Nanos, a: u32, b: u32, what: &str) {
    let got = got_a as f64 / got_b as f64;
    let want = a as f64 / b as f64;
    assert!(
        (got / want - 1.0).abs() <= 0.05,
        "{what}: weights {a}:{b} got device time {got_a}:{got_b} ({got:.4} against {want:.4})"
    );
}

/// Groups of weights 200:100, 200:300, 1:4 and 1:8, all busy with random readers, get device
/// time in those ratios within 5%: on the HDD model with slices, and request by request.
#[test]
fn busy_groups_get_device_time_in_their_weights_ratio() {
    for (a, b) in [(200, 100), (200, 300), (1, 4), (1, 8)] {
        for sliced in [true, false] {
            let mut sim = Sim::hdd();
            if !sliced {
                sim.sched = Scheduler::new(Tuning { slice: 0, idle: 0, ..Tuning::for_device(true) }, sim.model);
            }
            let ga = sim.weighted("a", a);
            let gb = sim.weighted("b", b);
            for g in [ga, gb] {
                for _ in 0..3 {
                    sim.client(g, 1, 0, Pattern::Random, 0);
                }
            }
            sim.client(gb, 4, 0, Pattern::Sequential, 0);
            sim.run_until(120 * SEC);
            let what = if sliced { "sliced" } else { "request by request" };
            assert_ratio(sim.device_ns[ga], sim.device_ns[gb], a, b, what);
            let busy = sim.device_ns[ga] + sim.device_ns[gb];
            assert!(busy as f64 >= 0.99 * (120 * SEC) as f64, "{what}: the device idled: {busy} ns busy of 120 s");
        }
    }
}

/// While one group is idle the other has the whole device; when it comes back it gets its
/// share within a second, and from then on its share, not the time it was away.
#[test]
fn an_idle_groups_time_is_reused_and_not_banked() {
    let mut sim = Sim::hdd();
    let busy = sim.weighted("busy", 100);
    let late = sim.weighted("late", 100);
    sim.client(busy, 1, 0, Pattern::Random, 0);
    sim.client(busy, 1, 0, Pattern::Random, 0);
    sim.client(late, 1, 0, Pattern::Random, 30 * SEC);
    sim.run_until(30 * SEC);
    assert!(sim.device_ns[busy] as f64 >= 0.99 * (30 * SEC) as f64, "{:?}", sim.device_ns);
    sim.reset();
    // It reaches its share within a second of joining.
    sim.run_until(31 * SEC);
    assert!(sim.device_ns[late] as f64 >= 0.45 * SEC as f64, "its first second: {:?}", sim.device_ns);
    sim.reset();
    sim.run_until(90 * SEC);
    assert_ratio(sim.device_ns[busy], sim.device_ns[late], 100, 100, "after the idle group came back");
}

/// A stream whose client thinks 1 ms between requests keeps its slot through the idle window
/// and gets its group's share; without idling it would lose the device after every request.
#[test]
fn a_thinking_stream_keeps_its_share() {
    let mut sim = Sim::hdd();
    let thinker = sim.weighted("thinker", 100);
    let busy = sim.weighted("busy", 100);
    sim.client(thinker, 1, MS, Pattern::Random, 0);
    for _ in 0..4 {
        sim.client(busy, 1, 0, Pattern::Random, 0);
    }
    sim.run_until(60 * SEC);
    // The thinker is charged its slices' wall time, think time included, and gets half of it.
    let share = sim.device_ns[thinker] as f64 / (sim.device_ns[thinker] + sim.device_ns[busy]) as f64;
    assert!(share > 0.40, "the thinking stream got {share:.3} of the device time");
}

/// Streams of one group share it equally: 8 sequential readers against a random reader in
/// another group each get about the same device time.
#[test]
fn streams_within_a_group_share_it_equally() {
    let mut sim = Sim::hdd();
    let seq = sim.weighted("seq", 100);
    let rand = sim.weighted("rand", 100);
    let readers: Vec<usize> = (0..8).map(|_| sim.client(seq, 1, 0, Pattern::Sequential, 0)).collect();
    sim.client(rand, 1, 0, Pattern::Random, 0);
    sim.run_until(120 * SEC);
    let served: Vec<usize> = readers.iter().map(|&c| sim.waits[c].len()).collect();
    let (min, max) = (*served.iter().min().unwrap(), *served.iter().max().unwrap());
    assert!(min as f64 >= 0.9 * max as f64, "requests per sequential reader: {served:?}");
    assert_ratio(sim.device_ns[seq], sim.device_ns[rand], 100, 100, "groups");
}

/// Seed 001's fourth experiment: 16 random readers in one group against 16 sequential
/// readers in another. The random readers share their group's slices (they are seeky), so each
/// waits about a round of its group's requests and a slice of the other group's, not for 15
/// slices of its own group's others (6 s when each had slices of its own); the groups
/// still split the device time evenly, and the sequential readers keep their half.
#[test]
fn seeky_streams_share_their_groups_slices() {
    let mut sim = Sim::hdd();
    let seq = sim.weighted("seq", 100);
    let rand = sim.weighted("rand", 100);
    for _ in 0..16 {
        sim.client(seq, 1, 0, Pattern::Sequential, 0);
    }
    let readers: Vec<usize> = (0..16).map(|_| sim.client(rand, 1, 0, Pattern::Random, 0)).collect();
    sim.run_until(60 * SEC);
    assert_ratio(sim.device_ns[seq], sim.device_ns[rand], 100, 100, "groups");
    // A reader served first in one round of its group's requests may go last in the next:
    // two rounds of the 16 readers' requests (a random read takes under 25 ms) and the
    // sequential group's slices between them.
    let slice = sim.sched.tuning().slice;
    let bound = 2 * (slice + 16 * 25 * MS);
    let worst = sim.worst_wait(&readers);
    assert!(worst <= bound, "a random read waited {} ms (bound {} ms)", worst / MS, bound / MS);
    let (min, max) = sim.served(&readers);
    assert!(min as f64 >= 0.8 * max as f64, "requests per random reader: {min}..{max}");
}

/// Seed 001's second experiment: a random reader thinking 50 µs between requests against 16
/// random writers at iodepth 4 in another group. The writers' slices run past their time to
/// give each of them a turn; the reader's slices end between two of its requests. It still
/// gets half the device time: its group, furthest behind, keeps the device through its
/// think time rather than handing it to the writers each time.
#[test]
fn a_thinking_group_keeps_its_share_against_a_crowd_of_seeky_streams() {
    let mut sim = Sim::hdd();
    let lone = sim.weighted("lone", 100);
    let busy = sim.weighted("busy", 100);
    sim.client(lone, 1, 50_000, Pattern::Random, 0);
    for _ in 0..16 {
        sim.client(busy, 4, 0, Pattern::Local, 0);
    }
    sim.run_until(60 * SEC);
    assert_ratio(sim.device_ns[lone], sim.device_ns[busy], 100, 100, "groups");
}

/// Seed 001's second experiment, alone: 16 random writers at iodepth 4, each in its own
/// region. They are seeky, but each keeps requests queued, so each goes on for a few requests
/// while it is not ahead of the others, and the seeks between its own requests are short: the
/// device serves half again as many requests as when it takes them request by request, while
/// the writers keep equal shares.
#[test]
fn a_backlogged_seeky_stream_keeps_a_few_requests_together() {
    let mut served = Vec::new();
    for sliced in [true, false] {
        let mut sim = Sim::hdd();
        if !sliced {
            sim.sched = Scheduler::new(Tuning { slice: 0, idle: 0, ..Tuning::for_device(true) }, sim.model);
        }
        let g = sim.weighted("writers", 100);
        let writers: Vec<usize> = (0..16).map(|_| sim.client(g, 4, 0, Pattern::Local, 0)).collect();
        sim.run_until(30 * SEC);
        let each: Vec<usize> = writers.iter().map(|&c| sim.waits[c].len()).collect();
        let (min, max) = (*each.iter().min().unwrap(), *each.iter().max().unwrap());
        assert!(!sliced || min as f64 >= 0.7 * max as f64, "requests per writer {each:?}");
        served.push(each.iter().sum::<usize>());
    }
    assert!(served[0] as f64 >= 1.5 * served[1] as f64, "requests with slices and request by request: {served:?}");
}

/// A group capped at 50 reads/s (burst 100 ms) stays under its cap, plus at most one
/// request, in every 1-second window after the burst, while the other group takes the rest.
#[test]
fn a_capped_group_stays_under_its_cap() {
    for model in [CostModel::Hdd { params: HddParams::default(), size: DISK }, CostModel::Linear(Linear::SOLID)] {
        let rotational = matches!(model, CostModel::Hdd { .. });
        let mut sim = Sim::new(Tuning::for_device(rotational), model);
        let capped = sim.group("capped", GroupSettings { riops: Some(50), ..GroupSettings::default() });
        let free = sim.weighted("free", 100);
        for _ in 0..4 {
            sim.client(capped, 2, 0, Pattern::Random, 0);
        }
        sim.client(free, 1, 0, Pattern::Random, 0);
        sim.run_until(20 * SEC);
        let times = &sim.dispatched[capped];
        assert!(times.len() > 500, "the capped group got {} requests in 20 s", times.len());
        let mut from = SEC;
        while from + SEC <= 20 * SEC {
            let n = times.iter().filter(|&&t| t >= from && t < from + SEC).count();
            assert!(n <= 51, "{} requests in [{from}, +1 s) against a cap of 50/s", n);
            from += 10 * MS;
        }
        assert!(sim.device_ns[free] > sim.device_ns[capped], "the other group takes what the cap leaves");
    }
}

/// Whatever the weights and the other streams do, a queued request waits at most about
/// `max_wait` plus one slice: a weight-1 stream against weight-10000 groups of busy streams,
/// one of them missing an unreachable latency target (and so always going first).
#[test]
fn no_stream_starves() {
    let mut sim = Sim::hdd();
    let tuning = sim.sched.tuning();
    let low = sim.weighted("low", 1);
    let heavy = sim.weighted("heavy", 10_000);
    let urgent = sim.group("urgent", GroupSettings { weight: 10_000, latency_ms: Some(1), ..GroupSettings::default() });
    let lone = sim.client(low, 1, 0, Pattern::Random, 0);
    for _ in 0..16 {
        sim.client(heavy, 2, 0, Pattern::Random, 0);
    }
    for _ in 0..4 {
        sim.client(urgent, 1, 0, Pattern::Random, 0);
    }
    sim.run_until(60 * SEC);
    let waits = &sim.waits[lone];
    assert!(waits.len() >= 5, "the weight-1 stream was served {} times in 60 s", waits.len());
    // Past max_wait the oldest goes first, one request each: the 37 streams' requests at
    // most (a random read takes under 25 ms), after the slice in progress.
    let bound = tuning.max_wait + tuning.slice + 37 * 25 * MS;
    let worst = *waits.iter().max().unwrap();
    assert!(worst <= bound, "a request waited {worst} ns (bound {bound})");
}

/// One point of seed 001's fourth experiment as the benchmark runs it: an 8 GiB disk cut in
/// two halves, one per group of equal weight; 16 sequential readers in the first, each
/// reading its own sixteenth of it from the start, against `random` random readers in the
/// second, each in its own part of it (fio's `offset_increment`), all at iodepth 1 with 50 µs
/// between a completion and the next request, for 60 s (the sequential readers alone if
/// `random` is 0). The random readers connect in the order of their parts, or if `shuffled`
/// in another. Returns the random readers' worst wait from submission to dispatch and the
/// bytes each group was served.
fn experiment4(random: usize, shuffled: bool) -> (Nanos, u64, u64) {
    experiment4_until(random, shuffled, 60 * SEC, None)
}

/// `experiment4` until `end`; with `leaving`, the random readers stop one after another from
/// that time on, `LEAVE_GAP` apart (fio's jobs, which end each its own runtime after it
/// connected).
fn experiment4_until(random: usize, shuffled: bool, end: Nanos, leaving: Option<Nanos>) -> (Nanos, u64, u64) {
    let mut sim = Sim::hdd_of(2 * HALF);
    let seq = sim.weighted("seq", 100);
    let rand = sim.weighted("rand", 100);
    for i in 0..16 {
        sim.client_in(seq, 50_000, Pattern::Sequential, i * HALF / 16, HALF / 16);
    }
    let part = HALF / random.max(1) as u64;
    let mut order: Vec<u64> = (0..random as u64).collect();
    if shuffled {
        order.shuffle(&mut sim.rng);
    }
    let readers: Vec<usize> =
        order.into_iter().map(|i| sim.client_in(rand, 50_000, Pattern::Random, HALF + i * part, part)).collect();
    if let Some(from) = leaving {
        for (i, &c) in readers.iter().enumerate() {
            sim.clients[c].leaves = from + i as Nanos * LEAVE_GAP;
        }
    }
    sim.run_until(end);
    let worst = sim.worst_wait(&readers);
    let bytes = |g: usize| sim.dispatched[g].len() as u64 * 4096;
    (worst, bytes(rand), bytes(seq))
}

const LEAVE_GAP: Nanos = 3 * MS;

/// Experiment 4's end: the random readers leave one after another. The seeky slice in
/// progress is the group's, so the readers still waiting for their turn in it keep that turn
/// when the stream that began it goes; none waits longer than if all had stayed, and within
/// twice what one reader waits.
#[test]
fn readers_that_leave_do_not_cost_the_others_their_turn() {
    let (worst1, _, _) = experiment4_until(1, false, 12 * SEC, Some(10 * SEC));
    for shuffled in [false, true] {
        let (leaving, _, _) = experiment4_until(16, shuffled, 12 * SEC, Some(10 * SEC));
        let (staying, _, _) = experiment4_until(16, shuffled, 12 * SEC, None);
        eprintln!(
            "shuffled {shuffled}: worst wait {} ms as 16 readers leave, {} ms if they stay, {} ms for one reader",
            leaving / MS,
            staying / MS,
            worst1 / MS
        );
        assert!(leaving <= staying, "shuffled {shuffled}: {} ms leaving, {} ms staying", leaving / MS, staying / MS);
        assert!(leaving <= 2 * worst1, "shuffled {shuffled}: {} ms, one reader {} ms", leaving / MS, worst1 / MS);
    }
}

/// Seed 001's fourth experiment against the targets: with 16 random readers rather
/// than one, the random group's worst wait is at most twice what it is with one and its
/// bandwidth at least 0.8 of it, and the sequential readers keep at least 0.8 of half what
/// they get alone. Sixteen readers at iodepth 1 take a round of 16 random reads, longer than
/// a slice, so each must be served once in every slice of its group: a reader passed over in
/// one of them waits through two or three of the other group's slices. When the readers'
/// turns go in the order of their parts of the disk they sweep across it, with short seeks,
/// and the group gets about 1.3 times as many reads in its half of the time: more is not held
/// against it; in any other order its bandwidth stays within ±20%.
#[test]
fn many_random_readers_wait_about_one_round() {
    let (_, _, alone) = experiment4(0, false);
    let (worst1, rand1, seq1) = experiment4(1, false);
    for shuffled in [false, true] {
        let (worst16, rand16, seq16) = experiment4(16, shuffled);
        eprintln!(
            "readers shuffled {shuffled}: worst wait {} ms with 1 random reader, {} ms with 16; random group {} and \
             {} KB/s; sequential group {}, {} and {} KB/s alone",
            worst1 / MS,
            worst16 / MS,
            rand1 / 60_000,
            rand16 / 60_000,
            seq1 / 60_000,
            seq16 / 60_000,
            alone / 60_000
        );
        assert!(
            worst16 <= 2 * worst1,
            "shuffled {shuffled}: worst wait {} ms with 16 random readers, {} ms with 1",
            worst16 / MS,
            worst1 / MS
        );
        let ratio = rand16 as f64 / rand1 as f64;
        let most = if shuffled { 1.2 } else { f64::INFINITY };
        assert!(
            (0.8..=most).contains(&ratio),
            "shuffled {shuffled}: the random group's bandwidth at 16 readers is {ratio:.3} of its at 1"
        );
        for (n, got) in [(1, seq1), (16, seq16)] {
            let share = got as f64 / (alone as f64 / 2.0);
            assert!(share >= 0.8, "the sequential group got {share:.3} of half its alone figure against {n}");
        }
    }
}

/// Seed 001's first experiment at its first point: one sequential reader against one random
/// reader in the other half of the disk. The seek back to where the sequential reader left
/// off, at the start of each of its slices, is the price of switching and is not charged to
/// its slice: it keeps at least 0.9 of half what it reads alone (0.84 when its slices paid
/// for the seek), and the random reader still gets at least 0.85 of half the device time.
#[test]
fn a_sequential_reader_is_not_charged_the_seek_back() {
    let run = |with_random: bool| {
        let mut sim = Sim::hdd_of(2 * HALF);
        let seq = sim.weighted("seq", 100);
        let rand = sim.weighted("rand", 100);
        sim.client_in(seq, 50_000, Pattern::Sequential, 0, HALF);
        if with_random {
            sim.client_in(rand, 50_000, Pattern::Random, HALF, HALF);
        }
        sim.run_until(20 * SEC);
        (sim.dispatched[seq].len() as f64, sim.device_ns[rand] as f64)
    };
    let (alone, _) = run(false);
    let (shared, random_ns) = run(true);
    let share = shared / (alone / 2.0);
    let random_share = random_ns / (10 * SEC) as f64;
    eprintln!(
        "sequential reader: {share:.3} of half its alone figure; random reader: {random_share:.3} of half the time"
    );
    assert!(share >= 0.9, "the sequential reader got {share:.3} of half its alone figure");
    assert!(random_share >= 0.85, "the random reader got {random_share:.3} of half the device time");
}

/// Seed 001's third experiment at 8 streams: 8 sequential readers, each in its own part of
/// the first half of the disk, against one sequential reader in the second, for 20 s, with
/// the host stalling once for `stall` ns at `at`. Returns the lone reader's worst wait, the
/// busy readers' worst wait, and the busy readers' fewest and most requests served.
fn experiment3_with_stall(at: Nanos, stall: Nanos) -> (Nanos, Nanos, usize, usize) {
    const N: u64 = 8;
    let mut sim = Sim::hdd_of(2 * HALF);
    let busy = sim.weighted("busy", 100);
    let lone = sim.weighted("lone", 100);
    let readers: Vec<usize> =
        (0..N).map(|i| sim.client_in(busy, 50_000, Pattern::Sequential, i * HALF / N, HALF / N)).collect();
    let l = sim.client_in(lone, 50_000, Pattern::Sequential, HALF, HALF);
    sim.stall = (stall > 0).then_some((at, stall));
    sim.run_until(20 * SEC);
    let (fewest, most) = sim.served(&readers);
    (sim.worst_wait(&[l]), sim.worst_wait(&readers), fewest, most)
}

/// A stall of the host in the middle of a sequential stream's slice (what a real run of
/// experiment 3 most likely met once: about 0.4 s) is not charged to that stream in full: charged, it
/// would wait while the other group, or its seven siblings, caught up (7.5 s against 1.7 s
/// in that run; here, charged in full, 9.3 s against 1.7 s, and the stalled reader got 0.57
/// of the requests of the others). Stalls at several moments, so that some fall in each
/// group's slices: the worst waits grow by about the stall (the lone reader's by at most the
/// stall, a busy reader's by at most twice), and every busy reader keeps at least 0.8 of the
/// requests of the best served.
#[test]
fn a_stall_of_the_host_does_not_starve_the_stream_it_hit() {
    let (lone0, busy0, _, _) = experiment3_with_stall(0, 0);
    let stall = 500 * MS;
    for k in 0..8 {
        let at = 10 * SEC + k * 60 * MS;
        let (lone, busy, fewest, most) = experiment3_with_stall(at, stall);
        eprintln!(
            "a {} ms stall at {} ms: worst waits lone {} ms, busy {} ms (without: {} and {} ms); busy readers served \
             {fewest}..{most} requests",
            stall / MS,
            at / MS,
            lone / MS,
            busy / MS,
            lone0 / MS,
            busy0 / MS,
        );
        assert!(lone <= lone0 + stall + 10 * MS, "stall at {} ms: the lone reader waited {} ms", at / MS, lone / MS);
        assert!(busy <= busy0 + 2 * stall, "stall at {} ms: a busy reader waited {} ms", at / MS, busy / MS);
        assert!(fewest as f64 >= 0.8 * most as f64, "stall at {} ms: busy readers served {fewest}..{most}", at / MS);
    }
}
