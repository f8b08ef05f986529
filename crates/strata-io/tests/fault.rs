//! Fault injection tests: each kind of rule fires on exactly the requests it names, as often
//! as it says, and nothing else changes; the counters add up; text rules parse.

use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_io::fault::{parse_rule, Effect, FaultDev, Faults, Ops, Rule};
use strata_io::mem::MemDev;
use strata_io::testing::{check_model, random_ops, Workload};
use strata_io::{BlockDev, BoxFut, Buf, ErrorKind, Result, ZeroFlags};

const MIB: u64 = 1 << 20;

fn dev() -> (FaultDev<MemDev>, Faults) {
    FaultDev::new(MemDev::new(4 * MIB))
}

async fn read_kind(d: &FaultDev<MemDev>, offset: u64, len: usize) -> Option<ErrorKind> {
    d.read(offset, Buf::zeroed(len)).await.err().map(|e| e.kind)
}

async fn write_kind(d: &FaultDev<MemDev>, offset: u64, data: &[u8]) -> Option<ErrorKind> {
    d.write(offset, Buf::from_slice(data), false).await.err().map(|e| e.kind)
}

#[tokio::test]
async fn read_error_once_fires_once_and_only_in_its_range() {
    let (d, faults) = dev();
    let id = faults.add(Rule::read_error(MIB..2 * MIB).once());
    assert_eq!(read_kind(&d, 0, 4096).await, None, "below the range");
    assert_eq!(read_kind(&d, 2 * MIB, 4096).await, None, "at the range's end (half-open)");
    assert_eq!(write_kind(&d, MIB, &[1; 512]).await, None, "writes are not named");
    assert_eq!(read_kind(&d, MIB - 512, 1024).await, Some(ErrorKind::Io), "overlapping the start");
    assert_eq!(read_kind(&d, MIB, 512).await, None, "spent");
    assert_eq!(faults.fired(id), 1);
    let c = faults.counters();
    assert_eq!((c.read_errors, c.errors()), (1, 1));
}

#[tokio::test]
async fn write_error_times_n_with_enospc_leaves_the_data_alone() {
    let (d, faults) = dev();
    d.write(0, Buf::from_slice(&[7; 4096]), false).await.unwrap();
    let id = faults.add(Rule::write_error(0..4096).no_space().times(3));
    for i in 0..3 {
        let err = d.write(0, Buf::from_slice(&[9; 4096]), true).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::NoSpace, "attempt {i}");
        assert!(err.context.contains("injected fault (write:enospc:0-4096:times=3)"), "{}", err.context);
    }
    // Failed writes never reached the device.
    let got = d.read(0, Buf::zeroed(4096)).await.unwrap();
    assert!(got.iter().all(|&b| b == 7));
    assert_eq!(write_kind(&d, 0, &[9; 4096]).await, None, "the fourth passes");
    assert!(d.read(0, Buf::zeroed(4096)).await.unwrap().iter().all(|&b| b == 9));
    assert_eq!(faults.fired(id), 3);
    assert_eq!(faults.counters().write_errors, 3);
}

#[tokio::test]
async fn persistent_flush_errors_last_until_removed() {
    let (d, faults) = dev();
    let id = faults.add(Rule::flush_error().range(0..512)); // a flush overlaps every range
    for _ in 0..5 {
        assert_eq!(d.flush().await.unwrap_err().kind, ErrorKind::Io);
    }
    assert_eq!(read_kind(&d, 0, 512).await, None);
    assert!(faults.remove(id));
    assert!(!faults.remove(id));
    d.flush().await.unwrap();
    assert_eq!(faults.fired(id), 0, "a removed rule has no count");
    assert_eq!(faults.counters().flush_errors, 5);
}

#[tokio::test]
async fn after_lets_the_first_matches_through() {
    let (d, faults) = dev();
    let id = faults.add(Rule::read_error(0..MIB).after(2).once());
    assert_eq!(read_kind(&d, 2 * MIB, 512).await, None, "not matching: not counted");
    assert_eq!(read_kind(&d, 0, 512).await, None);
    assert_eq!(read_kind(&d, 0, 512).await, None);
    assert_eq!(read_kind(&d, 0, 512).await, Some(ErrorKind::Io), "the third matching read");
    assert_eq!(read_kind(&d, 0, 512).await, None);
    assert_eq!(faults.fired(id), 1);
}

#[tokio::test]
async fn discard_and_zero_rules_name_their_operations() {
    let (d, faults) = dev();
    faults.add(Rule::new(Ops::DISCARD, Effect::Fail(ErrorKind::Io)).range(0..MIB));
    faults.add(Rule::new(Ops::ZERO, Effect::Fail(ErrorKind::NoSpace)).range(MIB..2 * MIB));
    d.write(0, Buf::from_slice(&[5; 4096]), false).await.unwrap();
    assert_eq!(d.discard(0, 4096).await.unwrap_err().kind, ErrorKind::Io);
    assert!(d.read(0, Buf::zeroed(4096)).await.unwrap().iter().all(|&b| b == 5), "a failed discard freed nothing");
    assert!(d.discard(MIB, 4096).await.is_ok());
    let z = ZeroFlags::default();
    assert_eq!(d.write_zeroes(MIB, 4096, z).await.unwrap_err().kind, ErrorKind::NoSpace);
    assert!(d.write_zeroes(0, 4096, z).await.is_ok());
    let c = faults.counters();
    assert_eq!((c.discard_errors, c.zero_errors, c.errors()), (1, 1, 2));
}

#[tokio::test]
async fn probability_is_seeded_and_about_right() {
    let pattern = |seed: u64| async move {
        let (d, faults) = dev();
        faults.add(Rule::read_error(0..MIB).probability(0.3, seed));
        let mut v = Vec::new();
        for _ in 0..1000 {
            v.push(read_kind(&d, 0, 512).await.is_some());
        }
        assert_eq!(faults.counters().read_errors, v.iter().filter(|&&f| f).count() as u64);
        v
    };
    let a = pattern(11).await;
    assert_eq!(a, pattern(11).await, "the same seed fails the same requests");
    assert_ne!(a, pattern(12).await, "another seed fails others");
    let fired = a.iter().filter(|&&f| f).count();
    assert!((220..380).contains(&fired), "p=0.3 fired {fired} of 1000");

    let (d, faults) = dev();
    faults.add(Rule::read_error(0..MIB).probability(0.0, 1));
    for _ in 0..200 {
        assert_eq!(read_kind(&d, 0, 512).await, None);
    }
}

#[tokio::test]
async fn delays_hold_only_matching_requests() {
    let (d, faults) = dev();
    let delay = Duration::from_millis(200);
    faults.add(Rule::delay(Ops::WRITE, delay).range(0..MIB).once());
    let t = Instant::now();
    d.write(0, Buf::from_slice(&[1; 512]), false).await.unwrap();
    assert!(t.elapsed() >= delay, "delayed write took {:?}", t.elapsed());
    for _ in 0..10 {
        d.write(0, Buf::from_slice(&[1; 512]), false).await.unwrap(); // spent
        d.read(0, Buf::zeroed(512)).await.unwrap(); // never named
    }
    assert_eq!(faults.counters().delayed, 1, "undelayed requests were held");
    // Delays add up, and a delayed request can still fail.
    faults.add(Rule::delay(Ops::READ, delay));
    faults.add(Rule::delay(Ops::ANY, delay));
    faults.add(Rule::read_error(0..512));
    let t = Instant::now();
    assert_eq!(read_kind(&d, 0, 512).await, Some(ErrorKind::Io));
    assert!(t.elapsed() >= 2 * delay, "two delays took {:?}", t.elapsed());
    let c = faults.counters();
    assert_eq!((c.delayed, c.read_errors), (2, 1));
}

#[tokio::test]
async fn the_first_error_rule_that_fires_decides() {
    let (d, faults) = dev();
    let first = faults.add(Rule::read_error(0..MIB).no_space().once());
    let second = faults.add(Rule::read_error(0..MIB));
    assert_eq!(read_kind(&d, 0, 512).await, Some(ErrorKind::NoSpace));
    assert_eq!((faults.fired(first), faults.fired(second)), (1, 0), "the second was not consulted");
    assert_eq!(read_kind(&d, 0, 512).await, Some(ErrorKind::Io));
    assert_eq!(faults.fired(second), 1);
    faults.clear();
    assert_eq!(read_kind(&d, 0, 512).await, None);
    assert_eq!(faults.counters().read_errors, 2, "counters outlive the rules");
}

#[tokio::test]
async fn unmatched_io_passes_through_intact() {
    // Rules over a part of the device the workload never touches: the device must behave
    // exactly like RAM, flushes included (no rule names them).
    let (d, faults) = FaultDev::new(MemDev::new(4 * MIB));
    let all_but_flush = Ops::READ | Ops::WRITE | Ops::DISCARD | Ops::ZERO;
    faults.add(Rule::new(all_but_flush, Effect::Fail(ErrorKind::Io)).range(3 * MIB..4 * MIB));
    faults.add(Rule::read_error(2 * MIB..3 * MIB));
    faults.add(Rule::delay(Ops::READ, Duration::from_secs(60)).range(2 * MIB..3 * MIB));
    // check_model ends with a read of the whole device, which the rules would catch: give
    // it a view that stops where they start.
    let view = Prefix { dev: Arc::new(d), size: 2 * MIB };
    let w = Workload { granularity: 512, max_granules: 64, span: 2 * MIB };
    for seed in 0..4 {
        let ops = random_ops(seed, 500, 2 * MIB, &w);
        check_model(&view, &ops).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    assert_eq!(faults.counters(), Default::default(), "no fault fired");
}

/// The first `size` bytes of a device, so a whole-device check can skip a faulty tail.
struct Prefix {
    dev: Arc<FaultDev<MemDev>>,
    size: u64,
}

impl BlockDev for Prefix {
    fn size(&self) -> u64 {
        self.size
    }
    fn describe(&self) -> String {
        "prefix".into()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        self.dev.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        self.dev.write(offset, buf, fua)
    }
    fn flush(&self) -> BoxFut<'_, Result<()>> {
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        self.dev.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        self.dev.write_zeroes(offset, len, flags)
    }
}

#[test]
fn text_rules_parse_and_print_back() {
    let r = parse_rule("read:eio:0-1MiB:once").unwrap();
    assert_eq!(r, Rule::read_error(0..MIB).once());
    let r = parse_rule("write+zero:enospc:1GiB-2GiB:times=3:after=10").unwrap();
    let want = Rule::new(Ops::WRITE | Ops::ZERO, Effect::Fail(ErrorKind::NoSpace)).range(1 << 30..2 << 30);
    assert_eq!(r, want.times(3).after(10));
    let r = parse_rule("flush:eio:p=0.01:seed=7").unwrap();
    assert_eq!(r, Rule::flush_error().probability(0.01, 7));
    let r = parse_rule("any:delay=1.5ms:always").unwrap();
    assert_eq!(r, Rule::delay(Ops::ANY, Duration::from_micros(1500)));
    let texts = [
        "read:eio:0-1MiB:once",
        "write+zero:enospc:1GiB-2GiB:times=3:after=10",
        "flush:eio:p=0.01:seed=7",
        "any:delay=250us",
        "read+flush:eio",
    ];
    for text in texts {
        let r = parse_rule(text).unwrap();
        assert_eq!(parse_rule(&r.to_string()).unwrap(), r, "{text} printed as {r}");
    }
    assert_eq!(Rule::read_error(0..MIB).once().to_string(), "read:eio:0-1048576:once");
    for bad in [
        "",
        "read",
        "reed:eio",
        "read:eperm",
        "read:eio:1MiB-0",
        "read:eio:0-1XB",
        "read:eio:p=2",
        "read:eio:times=x",
        "read:eio:sometimes",
        "read:delay=5parsecs",
        "read:delay=1000s",
    ] {
        let e = parse_rule(bad).unwrap_err();
        assert!(e.starts_with("fault rule"), "{bad:?}: {e}");
    }
    assert_eq!("write:eio:once".parse::<Rule>().unwrap(), Rule::new(Ops::WRITE, Effect::Fail(ErrorKind::Io)).once());
}

#[test]
#[should_panic(expected = "probability")]
fn malformed_rules_are_refused_when_added() {
    let (_d, faults) = dev();
    faults.add(Rule::read_error(0..MIB).probability(1.5, 0));
}
