//! The scheduler on a real device and clock: `Qos` holds one device and its `Scheduler`
//! (every export ending in that device shares it); `QosDev` is one group's handle onto it,
//! a `BlockDev` whose requests wait their turn. Each NBD connection gets its own handle
//! (`BlockDev::connect`), and so its own stream.

use crate::cost::{CostModel, Linear};
use crate::sched::{GroupId, Nanos, Op, Request, Scheduler, StreamId, Ticket, Tuning};
use crate::settings::{DeviceOptions, GroupSettings, QosOptions, GROUP_KEYS};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use strata_io::latency::HddParams;
use strata_io::{BlockDev, BoxFut, Buf, Error, ErrorKind, Result, ZeroFlags};
use tokio::sync::{oneshot, Notify};

/// One device and the scheduler sharing it.
pub struct Qos {
    dev: Arc<dyn BlockDev>,
    state: Mutex<State>,
    epoch: Instant,
    /// Wakes the timer task when it must wake sooner (or the scheduler is gone).
    timer: Arc<Notify>,
    /// The device options it was opened with, for refusing a spec that says otherwise.
    options: DeviceOptions,
}

struct State {
    sched: Scheduler,
    /// Requests waiting for their turn, woken when it comes.
    waiting: HashMap<Ticket, oneshot::Sender<()>>,
    out: Vec<Ticket>,
    next_wake: Option<Nanos>,
}

impl Qos {
    /// A scheduler over `dev`. Costs come from `options.model` when given, else from the
    /// `hdd:` model's figures when `dev` is one (`hdd`), else from blk-iocost's defaults for
    /// the device's kind. Must be called within a Tokio runtime (a task wakes idle windows
    /// and caps).
    pub fn new(dev: Arc<dyn BlockDev>, options: &DeviceOptions, hdd: Option<HddParams>) -> Arc<Qos> {
        let rotational = dev.geometry().rotational;
        let cost = match (hdd, options.model) {
            (_, Some(m)) => CostModel::Linear(m),
            (Some(params), None) => CostModel::Hdd { params, size: dev.size() },
            (None, None) => CostModel::Linear(if rotational { Linear::ROTATIONAL } else { Linear::SOLID }),
        };
        let mut tuning = Tuning::for_device(rotational);
        let ms = |v: u64| v * 1_000_000;
        tuning.depth = options.depth.unwrap_or(tuning.depth);
        tuning.slice = options.slice_ms.map_or(tuning.slice, ms);
        tuning.idle = options.idle_ms.map_or(tuning.idle, ms);
        tuning.max_wait = options.max_wait_ms.map_or(tuning.max_wait, ms);
        let state =
            State { sched: Scheduler::new(tuning, cost), waiting: HashMap::new(), out: Vec::new(), next_wake: None };
        let qos = Arc::new(Qos {
            dev,
            state: Mutex::new(state),
            epoch: Instant::now(),
            timer: Arc::new(Notify::new()),
            options: options.clone(),
        });
        tokio::spawn(timer(Arc::downgrade(&qos), qos.timer.clone()));
        qos
    }

    /// A handle for group `name`, made with `opts`' settings if new; an existing group must
    /// agree with whatever `opts` says. Device options other than the scheduler's are refused.
    pub fn join(self: &Arc<Qos>, name: &str, opts: &QosOptions) -> Result<QosDev> {
        if !opts.device.is_empty() && opts.device != self.options {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "qos group {name}: the scheduler of {} already runs with other device options \
                     (model, depth, slice_ms, idle_ms, max_wait_ms must agree in every spec naming the device)",
                    self.dev.describe()
                ),
            ));
        }
        let mut st = self.state.lock();
        let group = match st.sched.group(name) {
            Some(g) => {
                let current = st.sched.settings(g).clone();
                if opts.apply(&current)? != current {
                    return Err(Error::new(
                        ErrorKind::Invalid,
                        format!(
                            "qos group {name} already runs with {}; change it live (strata qos set) \
                             rather than in a second spec",
                            describe_settings(&current)
                        ),
                    ));
                }
                g
            }
            None => {
                let settings = opts.apply(&GroupSettings::default())?;
                st.sched.add_group(name, settings)
            }
        };
        st.sched.join(group);
        let stream = st.sched.own_stream(group);
        Ok(QosDev { qos: self.clone(), group, stream, connection: false })
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Queues a request; `None` if it may go at once, else what wakes it when it may.
    fn submit(&self, stream: StreamId, req: Request) -> (Ticket, Option<oneshot::Receiver<()>>) {
        let mut st = self.state.lock();
        let now = self.now();
        let ticket = st.sched.submit(stream, req, now);
        if self.pump(&mut st, now, Some(ticket)) {
            return (ticket, None);
        }
        let (tx, rx) = oneshot::channel();
        st.waiting.insert(ticket, tx);
        (ticket, Some(rx))
    }

    /// A request is done (or withdrawn before it went).
    fn finish(&self, stream: StreamId, ticket: Ticket, started: bool) {
        let mut st = self.state.lock();
        let now = self.now();
        if !started {
            st.waiting.remove(&ticket);
            if st.sched.cancel(stream, ticket) {
                self.pump(&mut st, now, None);
                return;
            }
        }
        st.sched.complete(ticket, now);
        self.pump(&mut st, now, None);
    }

    /// Sends what may go now on its way and sets the timer for what waits on time. Returns
    /// whether `mine` (a request being submitted, with no waiter yet) may go.
    fn pump(&self, st: &mut State, now: Nanos, mine: Option<Ticket>) -> bool {
        let mut out = std::mem::take(&mut st.out);
        let wake = st.sched.dispatch(now, &mut out);
        let mut go = false;
        for t in out.drain(..) {
            if Some(t) == mine {
                go = true;
            } else if let Some(tx) = st.waiting.remove(&t) {
                let _ = tx.send(());
            }
        }
        st.out = out;
        let sooner = match (wake, st.next_wake) {
            (Some(w), Some(n)) => w < n,
            (Some(_), None) => true,
            _ => false,
        };
        st.next_wake = wake;
        if sooner {
            self.timer.notify_one();
        }
        go
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Scheduler) -> T) -> T {
        f(&mut self.state.lock().sched)
    }
}

impl Drop for Qos {
    fn drop(&mut self) {
        self.timer.notify_one();
    }
}

/// Runs the scheduler when an idle window closes or a cap lets a group go again.
async fn timer(qos: Weak<Qos>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(q) = qos.upgrade() else { return };
            let mut st = q.state.lock();
            let now = q.now();
            if st.next_wake.is_some_and(|w| w <= now) {
                q.pump(&mut st, now, None);
            }
            st.next_wake.map(|w| q.epoch + Duration::from_nanos(w))
        };
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

fn describe_settings(s: &GroupSettings) -> String {
    let mut parts = vec![format!("weight={}", s.weight)];
    parts.extend(s.written().into_iter().filter(|(k, _)| *k != "weight").map(|(k, v)| format!("{k}={v}")));
    parts.join(" ")
}

/// One group's handle onto a shared device: the export's own, or one connection's.
pub struct QosDev {
    qos: Arc<Qos>,
    group: GroupId,
    stream: StreamId,
    /// A connection's handle: its stream closes with it.
    connection: bool,
}

/// A request's place in the scheduler until it is done, even if its future is dropped.
struct Turn<'a> {
    qos: &'a Qos,
    stream: StreamId,
    ticket: Ticket,
    started: bool,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.qos.finish(self.stream, self.ticket, self.started);
    }
}

impl QosDev {
    /// Runs `io` on the device once the scheduler gives `req` its turn.
    fn scheduled<'a, T: Send + 'a>(
        &'a self,
        req: Request,
        io: impl FnOnce(&'a dyn BlockDev) -> BoxFut<'a, Result<T>> + Send + 'a,
    ) -> BoxFut<'a, Result<T>> {
        Box::pin(async move {
            let (ticket, wait) = self.qos.submit(self.stream, req);
            let mut turn = Turn { qos: &self.qos, stream: self.stream, ticket, started: false };
            if let Some(rx) = wait {
                let _ = rx.await;
            }
            turn.started = true;
            io(&*self.qos.dev).await
        })
    }

    /// Settings, one `KEY VALUE` (this volume's group) or `group NAME KEY VALUE` (another on
    /// the same device) per line, all of one group: every line is checked before any takes
    /// effect.
    fn apply_message(&self, msg: &str) -> Result<String> {
        let unknown = || {
            Error::new(
                ErrorKind::Invalid,
                format!("qos: unknown message {msg:?} (KEY VALUE, or group NAME KEY VALUE, per line)"),
            )
        };
        let mut group = None;
        let mut pairs = Vec::new();
        for (i, line) in msg.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            let (g, key, value) = match *line.split_whitespace().collect::<Vec<_>>().as_slice() {
                [key, value] => (None, key, value),
                ["group", g, key, value] => (Some(g), key, value),
                _ => return Err(unknown()),
            };
            if i > 0 && g != group {
                return Err(Error::new(ErrorKind::Invalid, format!("qos: one group per message: {msg:?}")));
            }
            group = g;
            pairs.push((key, value));
        }
        if pairs.is_empty() {
            return Err(unknown());
        }
        let mut st = self.qos.state.lock();
        let gid = match group {
            None => self.group,
            Some(name) => st.sched.group(name).ok_or_else(|| {
                Error::new(ErrorKind::Invalid, format!("qos: unknown group {name:?} on {}", self.qos.dev.describe()))
            })?,
        };
        let mut settings = st.sched.settings(gid).clone();
        for &(key, value) in &pairs {
            settings.set(key, value).map_err(|e| Error::new(e.kind, format!("qos: {}", e.context)))?;
        }
        let shown: Vec<String> = pairs.iter().map(|&(key, _)| format!("{key} = {}", settings.value(key))).collect();
        let answer = format!("group {}: {}", st.sched.name(gid), shown.join(", "));
        st.sched.set(gid, settings);
        let now = self.qos.now();
        self.qos.pump(&mut st, now, None);
        Ok(answer)
    }
}

impl Drop for QosDev {
    fn drop(&mut self) {
        match self.connection {
            true => self.qos.with(|s| s.close_stream(self.stream)),
            false => self.qos.with(|s| s.leave(self.group)),
        }
    }
}

/// Whether a message line is the scheduler's: `KEY VALUE` of a group setting, or `group ...`.
fn is_setting(line: &str) -> bool {
    line.split_whitespace().next().is_some_and(|w| w == "group" || GROUP_KEYS.contains(&w))
}

fn rw(op: Op, offset: u64, len: u64) -> Request {
    Request { op, offset, len }
}

impl BlockDev for QosDev {
    strata_io::forward!(qos.dev: size, geometry, block_status, cache);
    fn describe(&self) -> String {
        let (name, weight) = self.qos.with(|s| (s.name(self.group).to_string(), s.settings(self.group).weight));
        format!("qos group {name} (weight {weight}) over {}", self.qos.dev.describe())
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        self.scheduled(rw(Op::Read, offset, buf.len() as u64), move |d| d.read(offset, buf))
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        self.scheduled(rw(Op::Write, offset, buf.len() as u64), move |d| d.write(offset, buf, fua))
    }
    fn flush(&self) -> BoxFut<'_, Result<()>> {
        self.scheduled(rw(Op::Flush, 0, 0), |d| d.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        self.scheduled(rw(Op::Discard, offset, 0), move |d| d.discard(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        let op = if flags.may_unmap { rw(Op::Discard, offset, 0) } else { rw(Op::Write, offset, len) };
        self.scheduled(op, move |d| d.write_zeroes(offset, len, flags))
    }
    /// The scheduler's status, and the device's below it under `BELOW` when it has one (a
    /// cache: dirty blocks, degraded, its origin).
    fn status(&self) -> Option<serde_json::Value> {
        let mut v = serde_json::to_value(crate::status::status(&self.qos, self.group)).expect("a status serialises");
        if let Some(below) = self.qos.dev.status() {
            v[crate::status::BELOW] = below;
        }
        Some(v)
    }
    fn metrics(&self) -> Vec<strata_io::metrics::Sample> {
        let mut m = crate::status::metrics(&self.qos, self.group);
        m.extend(self.qos.dev.metrics());
        m
    }
    /// Settings are the scheduler's; any other message is the device's below (`flush` to a
    /// cache under qos). A device that takes no messages leaves the refusal to the settings.
    fn message(&self, msg: &str) -> BoxFut<'_, Result<String>> {
        let lines: Vec<&str> = msg.lines().filter(|l| !l.trim().is_empty()).collect();
        let settings = lines.iter().filter(|l| is_setting(l)).count();
        if settings == lines.len() && settings > 0 {
            return strata_io::ready(self.apply_message(msg));
        }
        if settings > 0 {
            return strata_io::ready(Err(Error::new(
                ErrorKind::Invalid,
                format!("qos: a message is either qos settings or the device's below, not both: {msg:?}"),
            )));
        }
        let msg = msg.to_string();
        Box::pin(async move {
            match self.qos.dev.message(&msg).await {
                Err(e) if e.kind == ErrorKind::Unsupported => self.apply_message(&msg),
                answer => answer,
            }
        })
    }
    fn connect(&self) -> Option<Arc<dyn BlockDev>> {
        let stream = self.qos.with(|s| s.open_stream(self.group));
        Some(Arc::new(QosDev { qos: self.qos.clone(), group: self.group, stream, connection: true }))
    }
    fn disconnect(&self) {
        if self.connection {
            let mut st = self.qos.state.lock();
            st.sched.drain_stream(self.stream);
            let now = self.qos.now();
            self.qos.pump(&mut st, now, None);
        }
    }
    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        self.qos.dev.shutdown()
    }
}

/// A snapshot of the scheduler for status and metrics.
pub(crate) fn snapshot(qos: &Qos) -> (Vec<crate::sched::GroupReport>, Tuning, String, String) {
    qos.with(|s| (s.groups().map(|g| s.report(g)).collect(), s.tuning(), s.cost_model().describe(), qos.dev.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that closes (its client gone, the server stopping, the export removed)
    /// has its requests go past its group's caps: at 1 KiB/s, two reads of 256 KiB would
    /// hold a shutdown for minutes.
    #[tokio::test]
    async fn a_closing_connections_requests_wait_for_no_cap() {
        let qos = Qos::new(Arc::new(strata_io::mem::MemDev::new(1 << 20)), &DeviceOptions::default(), None);
        let capped = QosOptions { group: vec![("rbps".into(), "1KiB".into())], ..QosOptions::default() };
        let volume = qos.join("ga", &capped).unwrap();
        let conn = volume.connect().unwrap();
        let reads: Vec<_> = (0..2)
            .map(|_| {
                let conn = conn.clone();
                tokio::spawn(async move { conn.read(0, Buf::zeroed(256 << 10)).await.map(|b| b.len()) })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(reads.iter().any(|r| !r.is_finished()), "the cap held no read");
        conn.disconnect();
        for r in reads {
            let done = tokio::time::timeout(std::time::Duration::from_secs(10), r).await.expect("no hang");
            assert_eq!(done.unwrap().unwrap(), 256 << 10);
        }
    }

    /// Groups made and left by volumes one after another do not pile up: a group left by
    /// its volumes gives a new one its place (every dispatch walks the groups).
    #[tokio::test]
    async fn groups_left_by_their_volumes_make_room_for_new_ones() {
        let qos = Qos::new(Arc::new(strata_io::mem::MemDev::new(1 << 20)), &DeviceOptions::default(), None);
        let stays = qos.join("stays", &QosOptions::default()).unwrap();
        for i in 0..1000 {
            let v = qos.join(&format!("g{i}"), &QosOptions::default()).unwrap();
            let conn = v.connect().unwrap();
            conn.write(0, Buf::zeroed(4096), false).await.unwrap();
            drop((conn, v));
        }
        assert_eq!(qos.with(|s| s.groups().count()), 2);
        let again = qos.join("g999", &QosOptions::default()).unwrap();
        assert_eq!(qos.with(|s| s.name(again.group).to_string()), "g999");
        stays.read(0, Buf::zeroed(4096)).await.unwrap();
        again.read(0, Buf::zeroed(4096)).await.unwrap();
    }

    /// A group whose volumes were all removed is not shown or set, and the next volume to
    /// join it starts it afresh (its settings, zero counters), as a new group; a group with a
    /// volume keeps its own.
    #[tokio::test]
    async fn a_group_left_by_its_volumes_takes_the_next_ones_settings() {
        let qos = Qos::new(Arc::new(strata_io::mem::MemDev::new(1 << 20)), &DeviceOptions::default(), None);
        let weight = |w: &str| QosOptions { group: vec![("weight".into(), w.into())], ..QosOptions::default() };
        let a = qos.join("ga", &weight("300")).unwrap();
        let b = qos.join("gb", &QosOptions::default()).unwrap();
        a.message("weight 50").await.unwrap();
        a.write(0, Buf::zeroed(4096), false).await.unwrap();
        assert!(qos.join("ga", &weight("300")).is_err(), "a group with a volume keeps its settings");
        let shown = |d: &QosDev| -> Vec<String> {
            crate::status::status(&d.qos, d.group).groups.into_iter().map(|g| g.name).collect()
        };
        assert_eq!(shown(&b), ["ga", "gb"]);
        drop(a);
        assert_eq!(shown(&b), ["gb"]);
        assert!(b.message("group ga weight 5").await.is_err(), "a group without volumes is not set");
        let a = qos.join("ga", &weight("300")).unwrap();
        assert_eq!(qos.with(|s| s.settings(a.group).weight), 300);
        assert_eq!(shown(&b), ["ga", "gb"]);
        let ga = crate::status::status(&a.qos, a.group).groups.into_iter().find(|g| g.name == "ga").unwrap();
        assert_eq!((ga.requests, ga.bytes), (0, 0), "the old group's counters are gone");
    }
}
