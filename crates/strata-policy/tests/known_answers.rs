//! Hand-computed outcomes of tiny traces. Each expected sequence was worked out on paper
//! from the published algorithm (the derivation is in the comment above each test), not by
//! running the code, so a wrong implementation fails here.

use strata_policy::{build, Access, Outcome, Params, Policy};

const M: Option<Option<u64>> = None; // "any miss" marker is not used; outcomes are exact.

/// H = hit, P(None) = promoted into free space, P(Some(v)) = promoted evicting v, X = miss.
#[derive(Debug, Clone, Copy, PartialEq)]
enum E {
    H,
    P(Option<u64>),
    X,
}

fn run(policy: &mut dyn Policy, trace: &[u64]) -> Vec<E> {
    let _ = M;
    trace
        .iter()
        .map(|&b| match policy.access(Access::read(b, 0)) {
            Outcome::Hit => E::H,
            Outcome::Promote { evict } => E::P(evict),
            Outcome::Miss => E::X,
        })
        .collect()
}

fn policy(name: &str, cap: usize) -> Box<dyn Policy + Send> {
    build(name, cap, &Params::default()).unwrap()
}

use E::{H, P};

/// LRU, 3 blocks, trace 1 2 3 1 4 2 5 1 2 3. Order (LRU..MRU):
/// [1,2,3] → hit 1 [2,3,1] → 4 evicts 2 [3,1,4] → 2 evicts 3 [1,4,2] → 5 evicts 1 [4,2,5]
/// → 1 evicts 4 [2,5,1] → hit 2 [5,1,2] → 3 evicts 5.
#[test]
fn lru_textbook() {
    let out = run(policy("lru", 3).as_mut(), &[1, 2, 3, 1, 4, 2, 5, 1, 2, 3]);
    assert_eq!(out, vec![P(None), P(None), P(None), H, P(Some(2)), P(Some(3)), P(Some(1)), P(Some(4)), H, P(Some(5))]);
}

/// FIFO, same trace: hits do not reorder. [1,2,3] → hit 1 → 4 evicts 1 [2,3,4] → hit 2 →
/// 5 evicts 2 [3,4,5] → 1 evicts 3 → 2 evicts 4 → 3 evicts 5.
#[test]
fn fifo_textbook() {
    let out = run(policy("fifo", 3).as_mut(), &[1, 2, 3, 1, 4, 2, 5, 1, 2, 3]);
    assert_eq!(out, vec![P(None), P(None), P(None), H, P(Some(1)), H, P(Some(2)), P(Some(3)), P(Some(4)), P(Some(5))]);
}

/// CLOCK, 3 slots filled in order, hand at slot 0, newcomers unreferenced, hand moves past a
/// newcomer. hit 1 sets ref(1). 4: slot0 ref → clear, slot1 (2) evicted, hand→2. 2: slot2
/// (3) evicted, hand→0. 5: slot0 (1, cleared) evicted. 1: slot1 (4) evicted, hand→2.
/// hit 2 sets ref. 3: slot2 ref → clear, slot0 (5) evicted.
#[test]
fn clock_textbook() {
    let out = run(policy("clock", 3).as_mut(), &[1, 2, 3, 1, 4, 2, 5, 1, 2, 3]);
    assert_eq!(out, vec![P(None), P(None), P(None), H, P(Some(2)), P(Some(3)), P(Some(1)), P(Some(4)), H, P(Some(5))]);
}

/// SIEVE (Zhang et al.): queue oldest..newest [1,2,3]; hit 1 marks it. 4: hand starts at
/// the oldest, 1 visited → cleared, 2 evicted, hand at 3. 2: 3 evicted, hand at 4. 5: 4
/// evicted, hand at 2 → [1,2,5]. hits on 1 and 2. 3: hand at 2 visited → cleared, 5 evicted.
/// SIEVE keeps block 1 where LRU and FIFO lose it: 3 hits instead of 2.
#[test]
fn sieve_textbook() {
    let out = run(policy("sieve", 3).as_mut(), &[1, 2, 3, 1, 4, 2, 5, 1, 2, 3]);
    assert_eq!(out, vec![P(None), P(None), P(None), H, P(Some(2)), P(Some(3)), P(Some(4)), H, H, P(Some(5))]);
}

/// 2Q with 4 blocks: Kin = 1, Kout = 2. 1..4 fill A1in. hit 1 (A1in: no change). 5: A1in
/// over Kin → its oldest (1) leaves to A1out. 1: ghost hit → reclaim evicts 2 (A1out [1,2]),
/// 1 moves to Am. hit 1 in Am. 2: ghost hit → evicts 3, 2 to Am. 6: new → evicts 4 into
/// A1out. hit 5 in A1in.
#[test]
fn two_q_full_version() {
    let out = run(policy("2q", 4).as_mut(), &[1, 2, 3, 4, 1, 5, 1, 1, 2, 6, 5]);
    assert_eq!(out, vec![P(None), P(None), P(None), P(None), H, P(Some(1)), P(Some(2)), H, P(Some(3)), P(Some(4)), H]);
}

/// ARC (Megiddo & Modha, Fig. 4) with c = 2, p = 0. 1, 2 into T1; hit 1 → T2. 3: case IV.B,
/// REPLACE with |T1| = 1 > p evicts 2 to B1. 2: B1 hit, p = 1; REPLACE: |T1| = 1 not > p →
/// T2's LRU 1 to B2. 1: B2 hit, p = 0; REPLACE: |T1| = 1 > 0 → 3 to B1. 4: case IV.B with
/// T1 empty → T2's LRU 2 to B2. 3: B1 hit, p = 1; REPLACE: |T1| = 1 not > 1 → 1 to B2.
#[test]
fn arc_adapts_p() {
    let mut arc = strata_policy::policies::arc::Arc::new(2);
    let out = run(&mut arc, &[1, 2, 1, 3, 2, 1, 4, 3]);
    assert_eq!(out, vec![P(None), P(None), H, P(Some(2)), P(Some(1)), P(Some(3)), P(Some(2)), P(Some(1))]);
    assert_eq!(arc.target_t1(), 1);
    assert!(arc.contains(4) && arc.contains(3) && !arc.contains(1));
}

/// S3-FIFO with 4 blocks: small target 1, ghost 3. 1..4 fill S; 1, 2, 3 hit twice. 5: S
/// evicts from its tail: 1, 2, 3 (freq 2) move to M with no credit, 4 goes to the ghost.
/// hit 1 (M freq 1). 6: S holds only 5 (freq 0) → ghost. 6 hit twice. 7: 6 moves to M, S is
/// empty, so M evicts: 1 has credit (reinserted), 2 has none → evicted, not remembered.
/// 4: ghost hit → S evicts 7 into the ghost, 4 enters M. 2: not remembered → S is empty, so M
/// evicts its oldest block without credit, 3.
#[test]
fn s3fifo_queues() {
    let trace = [1, 2, 3, 4, 1, 1, 2, 2, 3, 3, 5, 1, 6, 6, 6, 7, 4, 2];
    let out = run(policy("s3fifo", 4).as_mut(), &trace);
    assert_eq!(
        out,
        vec![
            P(None),
            P(None),
            P(None),
            P(None),
            H,
            H,
            H,
            H,
            H,
            H,
            P(Some(4)),
            H,
            P(Some(5)),
            H,
            H,
            P(Some(2)),
            P(Some(7)),
            P(Some(3))
        ]
    );
}

/// LIRS with 3 blocks: 2 LIR, 1 HIR. 1, 2 become LIR, 3 resident HIR. 4 evicts 3 (stays in
/// the stack as non-resident). 3: non-resident in S → evicts 4, becomes LIR, and the bottom
/// LIR (1) is demoted to HIR. 1: resident HIR not in S → hit. 4: non-resident in S → evicts
/// 1 (front of Q), becomes LIR, demoting 2. 2: resident HIR → hit.
#[test]
fn lirs_irr_swap() {
    let out = run(policy("lirs", 3).as_mut(), &[1, 2, 3, 4, 3, 1, 4, 2]);
    assert_eq!(out, vec![P(None), P(None), P(None), P(Some(3)), P(Some(4)), H, P(Some(1)), H]);
}

/// LIRS keeps a loop's head resident where LRU gets nothing: 2 LIR blocks survive a cyclic
/// scan of 10 blocks with a 3-block cache.
#[test]
fn lirs_beats_lru_on_loops() {
    let trace: Vec<u64> = (0..20).flat_map(|_| 0..10u64).collect();
    let hits = |name: &str| run(policy(name, 3).as_mut(), &trace).iter().filter(|e| **e == H).count();
    assert_eq!(hits("lru"), 0);
    // After the first pass the two LIR blocks (0 and 1) hit on every pass.
    assert!(hits("lirs") >= 2 * 19, "lirs hits {}", hits("lirs"));
}

/// W-TinyLFU, 100 blocks: window 1, main 99 (protected at most 79), sample period 1,000
/// accesses, so nothing below ages or climbs before access 1,000.
/// Five rounds over the working set 0..80 (400 accesses): round 1 fills window [79] and
/// probation [0..78]; round 2 hits move 0..78 to protected. A one-pass scan of 300 new
/// blocks (3 caches' worth, 700 accesses in all): the first 20 fill the free room (79
/// and 1000..1018 move to probation unopposed). From 1020 on the cache is full; each new
/// block's arrival makes the window's previous block (estimate 1) the admission candidate
/// against probation's oldest, block 79 (estimate 5): the candidate loses, so each scan
/// block evicts the one before it. The working set then hits 80 times out of 80, where LRU
/// (which the scan flushes completely) hits none.
#[test]
fn tinylfu_scan_does_not_flush_the_working_set() {
    let mut trace: Vec<u64> = (0..5).flat_map(|_| 0..80u64).collect();
    trace.extend(1000..1300u64);
    trace.extend(0..80u64);
    for name in ["tinylfu", "lru"] {
        let out = run(policy(name, 100).as_mut(), &trace);
        let last = &out[700..];
        let hits = last.iter().filter(|e| **e == H).count();
        if name == "lru" {
            assert_eq!(hits, 0, "lru keeps nothing through the scan");
            continue;
        }
        assert_eq!(hits, 80, "tinylfu lost the working set: {last:?}");
        // Rounds 2-5 all hit.
        assert!(out[80..400].iter().all(|e| *e == H));
        // The scan: free room for 20, then each block evicts its predecessor.
        assert!(out[400..420].iter().all(|e| *e == P(None)));
        for (k, e) in out[420..700].iter().enumerate() {
            assert_eq!(*e, P(Some(1019 + k as u64)), "scan block {}", 1020 + k);
        }
    }
}

/// W-TinyLFU, 100 blocks, sample period 1,000. Ten rounds over A = 0..80 (800 accesses)
/// give A estimates of 10 and leave window [79], protected [0..78]. Then B = 1000..1080,
/// round after round. The first 20 B blocks take the free room (79, then 1000..1018, move to
/// probation unopposed). From 1020 on, every B candidate (estimate at most 3 before the
/// first aging at access 1,000, in B's third round) loses to an A victim (10), so until then
/// exactly 1000..1018 hit and no other B block does. Aging halves A to 5 and B to at most
/// 1; each B round adds one, so about six rounds later B candidates beat A victims (6 > 5)
/// and replace them. Forty B rounds (3,200 accesses, three agings and three climbing steps
/// later) B is wholly cached: its last round hits 80 of 80, and A keeps only the 20 blocks
/// B leaves free.
#[test]
fn tinylfu_admits_a_shifted_hot_set_after_aging() {
    let mut trace: Vec<u64> = (0..10).flat_map(|_| 0..80u64).collect();
    trace.extend((0..40).flat_map(|_| 1000..1080u64));
    let mut p = policy("tinylfu", 100);
    let out = run(p.as_mut(), &trace);
    for t in 800..1000 {
        let b = trace[t];
        let want_hit = t >= 880 && b < 1019;
        assert_eq!(out[t] == H, want_hit, "access {t} to {b}: {:?}", out[t]);
    }
    assert!(out[trace.len() - 80..].iter().all(|e| *e == H), "B not cached after 40 rounds");
    assert_eq!((0..80).filter(|&b| p.contains(b)).count(), 20, "A keeps only the room B leaves");
    assert!((1000..1080).all(|b| p.contains(b)));
}
