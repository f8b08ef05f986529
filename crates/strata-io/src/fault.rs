//! Fault injection (tests, `fault:` device specs, `strata crashtest`): a decorator that fails or delays chosen requests of the
//! device it wraps, steered at run time through a shared handle, so tests (and later the
//! command line) can make a healthy device misbehave in exactly the way a case needs.
//!
//! ```
//! use strata_io::fault::{FaultDev, Rule};
//! use strata_io::{mem::MemDev, BlockDev, Buf, ErrorKind};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let (dev, faults) = FaultDev::new(MemDev::new(1 << 20));
//! let id = faults.add(Rule::read_error(0..4096).once());
//! let err = dev.read(0, Buf::zeroed(512)).await.unwrap_err();
//! assert_eq!(err.kind, ErrorKind::Io);
//! assert!(dev.read(0, Buf::zeroed(512)).await.is_ok()); // `once` is spent
//! assert_eq!(faults.fired(id), 1);
//! # });
//! ```
//!
//! Rules can also be written as text (`parse_rule`, and `Display` prints the same form):
//!
//! ```text
//! OPS:EFFECT[:FIELD]...
//!   OPS     read | write | flush | discard | zero | any, joined with '+' (read+write)
//!   EFFECT  eio | enospc | delay=DURATION (DURATION: 250us, 10ms, 1.5s)
//!   FIELD   START-END       byte range, half-open, sizes as in units::parse_size (0-1MiB)
//!           once | always | times=N     how often the rule fires (default: always)
//!           after=N         let the first N matching requests through
//!           p=PROB          fire with this probability (0..=1) per matching request
//!           seed=N          seed of that probability's generator (default 0)
//! e.g.  read:eio:0-1MiB:once    write+zero:enospc:1GiB-2GiB:times=3:after=10
//!       flush:eio:p=0.01:seed=7 any:delay=50ms:p=0.1
//! ```
//!
//! Matching: a request matches a rule when the rule names its operation and its byte range
//! overlaps the rule's range (a flush concerns the whole device, so it overlaps every range).
//! Every matching delay rule that fires adds its delay; the first error rule that fires
//! decides the error, and later error rules are not consulted (their counts stay put).
//! `block_status` and `cache` are never faulted.
//!
//! It must never change data: a request either fails before it reaches the inner device, or
//! reaches it untouched (after any delay). Probabilities come from a seeded generator per
//! rule, so a run with the same requests in the same order fails the same way.

use crate::timer::sleep_until;
use crate::units::{parse_duration, parse_size, DurationError};
use crate::{BlockDev, BoxFut, Buf, Error, ErrorKind, Result, ZeroFlags};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest delay a rule may ask for: a test that waits longer is hung, not slow.
pub const DELAY_MAX: Duration = Duration::from_secs(600);

/// A set of operations a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ops(u8);

impl Ops {
    pub const READ: Ops = Ops(1);
    pub const WRITE: Ops = Ops(2);
    pub const FLUSH: Ops = Ops(4);
    pub const DISCARD: Ops = Ops(8);
    pub const ZERO: Ops = Ops(16);
    pub const ANY: Ops = Ops(31);

    const NAMES: [(Ops, &'static str); 5] = [
        (Ops::READ, "read"),
        (Ops::WRITE, "write"),
        (Ops::FLUSH, "flush"),
        (Ops::DISCARD, "discard"),
        (Ops::ZERO, "zero"),
    ];

    pub fn contains(self, other: Ops) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Ops {
    type Output = Ops;
    fn bitor(self, o: Ops) -> Ops {
        Ops(self.0 | o.0)
    }
}

/// What a firing rule does to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Fail it with this kind (`Io` is EIO, `NoSpace` is ENOSPC) without touching the device.
    Fail(ErrorKind),
    /// Hold it this long, then pass it on.
    Delay(Duration),
}

/// One fault: which requests, what happens to them, and how often.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub ops: Ops,
    pub effect: Effect,
    /// Bytes the rule covers; `None` for the whole device.
    pub range: Option<Range<u64>>,
    /// Fire at most this many times; `None` fires persistently.
    pub limit: Option<u64>,
    /// Matching requests let through before the rule starts firing.
    pub after: u64,
    /// Chance that a matching request fires the rule (1.0: every one).
    pub probability: f64,
    /// Seed of the generator that draws against `probability`.
    pub seed: u64,
}

impl Rule {
    /// A persistent rule for `ops` over the whole device.
    pub fn new(ops: Ops, effect: Effect) -> Rule {
        Rule { ops, effect, range: None, limit: None, after: 0, probability: 1.0, seed: 0 }
    }

    /// Reads overlapping `range` fail with EIO.
    pub fn read_error(range: Range<u64>) -> Rule {
        Rule::new(Ops::READ, Effect::Fail(ErrorKind::Io)).range(range)
    }

    /// Writes overlapping `range` fail with EIO.
    pub fn write_error(range: Range<u64>) -> Rule {
        Rule::new(Ops::WRITE, Effect::Fail(ErrorKind::Io)).range(range)
    }

    /// Flushes fail with EIO.
    pub fn flush_error() -> Rule {
        Rule::new(Ops::FLUSH, Effect::Fail(ErrorKind::Io))
    }

    /// Requests for `ops` are held for `delay` before they go on.
    pub fn delay(ops: Ops, delay: Duration) -> Rule {
        Rule::new(ops, Effect::Delay(delay))
    }

    pub fn range(mut self, range: Range<u64>) -> Rule {
        self.range = Some(range);
        self
    }

    /// Fails with ENOSPC instead of EIO.
    pub fn no_space(self) -> Rule {
        self.kind(ErrorKind::NoSpace)
    }

    /// Fails with `kind` (a delay rule becomes an error rule).
    pub fn kind(mut self, kind: ErrorKind) -> Rule {
        self.effect = Effect::Fail(kind);
        self
    }

    pub fn once(self) -> Rule {
        self.times(1)
    }

    pub fn times(mut self, n: u64) -> Rule {
        self.limit = Some(n);
        self
    }

    pub fn always(mut self) -> Rule {
        self.limit = None;
        self
    }

    pub fn after(mut self, n: u64) -> Rule {
        self.after = n;
        self
    }

    pub fn probability(mut self, p: f64, seed: u64) -> Rule {
        self.probability = p;
        self.seed = seed;
        self
    }

    fn matches(&self, op: Ops, offset: u64, len: u64) -> bool {
        if !self.ops.contains(op) {
            return false;
        }
        match &self.range {
            None => true,
            Some(_) if op == Ops::FLUSH => true,
            // A zero-length request still names a position: count it as one byte.
            Some(r) => offset < r.end && offset.saturating_add(len.max(1)) > r.start,
        }
    }

    fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(format!("probability {} is not within 0..=1", self.probability));
        }
        if let Some(r) = &self.range {
            if r.start >= r.end {
                return Err(format!("empty range {}-{}", r.start, r.end));
            }
        }
        if let Effect::Delay(d) = self.effect {
            if d > DELAY_MAX {
                return Err(format!("delay {d:?} is longer than {DELAY_MAX:?}"));
            }
        }
        if self.ops.0 == 0 || !Ops::ANY.contains(self.ops) {
            return Err("no operations named".into());
        }
        Ok(())
    }
}

/// Parses a rule written as text; the syntax is in the module header.
pub fn parse_rule(s: &str) -> Result<Rule, String> {
    let err = |what: String| format!("fault rule {s:?}: {what}");
    let mut fields = s.trim().split(':');
    let ops_text = fields.next().unwrap_or_default();
    let mut ops = Ops(0);
    for name in ops_text.split('+') {
        ops = ops
            | match name {
                "any" => Ops::ANY,
                _ => Ops::NAMES.iter().find(|(_, n)| *n == name).map(|(o, _)| *o).ok_or_else(|| {
                    err(format!("unknown operation {name:?} (read, write, flush, discard, zero or any)"))
                })?,
            };
    }
    let effect = match fields.next() {
        Some("eio") => Effect::Fail(ErrorKind::Io),
        Some("enospc") => Effect::Fail(ErrorKind::NoSpace),
        Some(e) if e.starts_with("delay=") => Effect::Delay(delay(&e["delay=".len()..]).map_err(err)?),
        other => return Err(err(format!("expected an effect (eio, enospc, delay=10ms), found {other:?}"))),
    };
    let mut rule = Rule::new(ops, effect);
    for field in fields {
        let number = |v: &str| v.parse::<u64>().map_err(|_| err(format!("{field:?}: {v:?} is not a whole number")));
        match field.split_once('=') {
            None if field == "once" => rule = rule.once(),
            None if field == "always" => rule = rule.always(),
            None if field.contains('-') => {
                let (a, b) = field.split_once('-').expect("contains '-'");
                let start = parse_size(a).map_err(err)?;
                let end = parse_size(b).map_err(err)?;
                rule = rule.range(start..end);
            }
            Some(("times", v)) => rule = rule.times(number(v)?),
            Some(("after", v)) => rule = rule.after(number(v)?),
            Some(("seed", v)) => rule.seed = number(v)?,
            Some(("p", v)) => {
                rule.probability = v.parse().map_err(|_| err(format!("{field:?}: {v:?} is not a probability")))?
            }
            _ => return Err(err(format!("unknown field {field:?}"))),
        }
    }
    rule.check().map_err(err)?;
    Ok(rule)
}

impl std::str::FromStr for Rule {
    type Err = String;
    fn from_str(s: &str) -> Result<Rule, String> {
        parse_rule(s)
    }
}

/// Prints the rule in the form `parse_rule` reads back (error kinds other than EIO and
/// ENOSPC, set with `Rule::kind`, print by name and have no text form).
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ops == Ops::ANY {
            f.write_str("any")?;
        } else {
            let names: Vec<&str> = Ops::NAMES.iter().filter(|(o, _)| self.ops.contains(*o)).map(|(_, n)| *n).collect();
            f.write_str(&names.join("+"))?;
        }
        match self.effect {
            Effect::Fail(ErrorKind::Io) => f.write_str(":eio")?,
            Effect::Fail(ErrorKind::NoSpace) => f.write_str(":enospc")?,
            // Other kinds have no text form; they are reachable only through `Rule::kind`.
            Effect::Fail(kind) => write!(f, ":{kind:?}")?,
            Effect::Delay(d) => write!(f, ":delay={}us", d.as_micros())?,
        }
        if let Some(r) = &self.range {
            write!(f, ":{}-{}", r.start, r.end)?;
        }
        match self.limit {
            None => {}
            Some(1) => f.write_str(":once")?,
            Some(n) => write!(f, ":times={n}")?,
        }
        if self.after > 0 {
            write!(f, ":after={}", self.after)?;
        }
        if self.probability < 1.0 {
            write!(f, ":p={}:seed={}", self.probability, self.seed)?;
        }
        Ok(())
    }
}

/// Parses `250us`, `10ms`, `1.5s`, `100ns` (a unit is a must).
fn delay(s: &str) -> Result<Duration, String> {
    parse_duration(s, None).map_err(|e| match e {
        DurationError::NotANumber(num) => format!("duration {s:?}: {num:?} is not a number"),
        DurationError::Unit(_) => format!("duration {s:?}: unit must be ns, us, ms or s"),
        DurationError::OutOfRange(why) => format!("duration {s:?}: {why}"),
    })
}

/// Names a rule added to a `Faults` handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuleId(u64);

/// Faults injected so far, per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub read_errors: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    pub discard_errors: u64,
    pub zero_errors: u64,
    /// Requests held by at least one delay rule.
    pub delayed: u64,
}

impl Counters {
    pub fn errors(&self) -> u64 {
        self.read_errors + self.write_errors + self.flush_errors + self.discard_errors + self.zero_errors
    }

    fn error_slot(&mut self, op: Ops) -> &mut u64 {
        match op {
            Ops::READ => &mut self.read_errors,
            Ops::WRITE => &mut self.write_errors,
            Ops::FLUSH => &mut self.flush_errors,
            Ops::DISCARD => &mut self.discard_errors,
            _ => &mut self.zero_errors,
        }
    }
}

struct Slot {
    id: RuleId,
    rule: Rule,
    /// Matching requests seen, fired or not.
    seen: u64,
    fired: u64,
    rng: ChaCha8Rng,
}

impl Slot {
    /// Counts a matching request and says whether the rule fires on it.
    fn fires(&mut self) -> bool {
        self.seen += 1;
        if self.seen <= self.rule.after || self.rule.limit.is_some_and(|n| self.fired >= n) {
            return false;
        }
        // Drawn only when it matters, so a probability of 1 costs nothing.
        if self.rule.probability < 1.0 && !self.rng.gen_bool(self.rule.probability) {
            return false;
        }
        self.fired += 1;
        true
    }
}

#[derive(Default)]
struct Table {
    rules: Vec<Slot>,
    next_id: u64,
    counters: Counters,
}

/// The shared handle that steers a `FaultDev`; clones steer the same device.
#[derive(Clone, Default)]
pub struct Faults {
    table: Arc<Mutex<Table>>,
}

/// What the rules decided for one request.
struct Verdict {
    delay: Duration,
    error: Option<(ErrorKind, String)>,
}

impl Faults {
    /// Adds a rule; it applies to requests issued from now on.
    ///
    /// Panics if the rule is malformed (a probability outside 0..=1, an empty range, no
    /// operations): that is a bug in the test that wrote it. Text rules are checked by
    /// `parse_rule` instead.
    pub fn add(&self, rule: Rule) -> RuleId {
        if let Err(e) = rule.check() {
            panic!("fault rule {rule}: {e}");
        }
        let mut t = self.table.lock();
        let id = RuleId(t.next_id);
        t.next_id += 1;
        let rng = ChaCha8Rng::seed_from_u64(rule.seed);
        t.rules.push(Slot { id, rule, seen: 0, fired: 0, rng });
        id
    }

    /// Removes a rule; false if it was not there.
    pub fn remove(&self, id: RuleId) -> bool {
        let mut t = self.table.lock();
        let before = t.rules.len();
        t.rules.retain(|s| s.id != id);
        t.rules.len() != before
    }

    /// Removes every rule (the counters stay).
    pub fn clear(&self) {
        self.table.lock().rules.clear();
    }

    /// How many times the rule fired (0 for a rule that is gone).
    pub fn fired(&self, id: RuleId) -> u64 {
        self.table.lock().rules.iter().find(|s| s.id == id).map_or(0, |s| s.fired)
    }

    pub fn counters(&self) -> Counters {
        self.table.lock().counters
    }

    fn judge(&self, op: Ops, offset: u64, len: u64) -> Verdict {
        let mut t = self.table.lock();
        let mut v = Verdict { delay: Duration::ZERO, error: None };
        for slot in t.rules.iter_mut().filter(|s| s.rule.matches(op, offset, len)) {
            match slot.rule.effect {
                Effect::Delay(d) => {
                    if slot.fires() {
                        v.delay += d;
                    }
                }
                Effect::Fail(kind) => {
                    if v.error.is_none() && slot.fires() {
                        v.error = Some((kind, slot.rule.to_string()));
                    }
                }
            }
        }
        if v.error.is_some() {
            *t.counters.error_slot(op) += 1;
        }
        if !v.delay.is_zero() {
            t.counters.delayed += 1;
        }
        v
    }
}

/// The fault-injecting decorator.
pub struct FaultDev<D> {
    inner: D,
    faults: Faults,
}

impl<D: BlockDev> FaultDev<D> {
    /// Wraps `inner` with no rules; the handle adds them.
    pub fn new(inner: D) -> (FaultDev<D>, Faults) {
        let faults = Faults::default();
        (FaultDev { inner, faults: faults.clone() }, faults)
    }

    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Applies the verdict for a request, then runs it on the inner device if it survives.
    async fn guarded<'a, T>(
        &'a self,
        op: Ops,
        name: &str,
        offset: u64,
        len: u64,
        run: impl FnOnce() -> BoxFut<'a, Result<T>> + Send,
    ) -> Result<T> {
        let v = self.faults.judge(op, offset, len);
        if !v.delay.is_zero() {
            sleep_until(Instant::now() + v.delay).await;
        }
        if let Some((kind, rule)) = v.error {
            let at = if op == Ops::FLUSH { String::new() } else { format!(" of {len} bytes at {offset}") };
            return Err(Error::new(kind, format!("{}: injected fault ({rule}) on {name}{at}", self.inner.describe())));
        }
        run().await
    }
}

impl<D: BlockDev> BlockDev for FaultDev<D> {
    crate::forward!(inner: size, geometry, block_status, cache, status, metrics, message, disconnect, shutdown);

    fn describe(&self) -> String {
        format!("fault({})", self.inner.describe())
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        let len = buf.len() as u64;
        Box::pin(self.guarded(Ops::READ, "read", offset, len, move || self.inner.read(offset, buf)))
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        let len = buf.len() as u64;
        Box::pin(self.guarded(Ops::WRITE, "write", offset, len, move || self.inner.write(offset, buf, fua)))
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        Box::pin(self.guarded(Ops::FLUSH, "flush", 0, 0, move || self.inner.flush()))
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        Box::pin(self.guarded(Ops::DISCARD, "discard", offset, len, move || self.inner.discard(offset, len)))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        let run = move || self.inner.write_zeroes(offset, len, flags);
        Box::pin(self.guarded(Ops::ZERO, "write_zeroes", offset, len, run))
    }

    fn connect(&self) -> Option<std::sync::Arc<dyn BlockDev>> {
        let inner = self.inner.connect()?;
        Some(std::sync::Arc::new(FaultDev { inner, faults: self.faults.clone() }))
    }
}
