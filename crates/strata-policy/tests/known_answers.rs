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
    assert_eq!(
        out,
        vec![
            P(None),
            P(None),
            P(None),
            H,
            P(Some(2)),
            P(Some(3)),
            P(Some(1)),
            P(Some(4)),
            H,
            P(Some(5))
        ]
    );
}

/// FIFO, same trace: hits do not reorder. [1,2,3] → hit 1 → 4 evicts 1 [2,3,4] → hit 2 →
/// 5 evicts 2 [3,4,5] → 1 evicts 3 → 2 evicts 4 → 3 evicts 5.
#[test]
fn fifo_textbook() {
    let out = run(policy("fifo", 3).as_mut(), &[1, 2, 3, 1, 4, 2, 5, 1, 2, 3]);
    assert_eq!(
        out,
        vec![
            P(None),
            P(None),
            P(None),
            H,
            P(Some(1)),
            H,
            P(Some(2)),
            P(Some(3)),
            P(Some(4)),
            P(Some(5))
        ]
    );
}

/// CLOCK, 3 slots filled in order, hand at slot 0, newcomers unreferenced, hand moves past a
/// newcomer. hit 1 sets ref(1). 4: slot0 ref → clear, slot1 (2) evicted, hand→2. 2: slot2
/// (3) evicted, hand→0. 5: slot0 (1, cleared) evicted. 1: slot1 (4) evicted, hand→2.
/// hit 2 sets ref. 3: slot2 ref → clear, slot0 (5) evicted.
#[test]
fn clock_textbook() {
    let out = run(policy("clock", 3).as_mut(), &[1, 2, 3, 1, 4, 2, 5, 1, 2, 3]);
    assert_eq!(
        out,
        vec![
            P(None),
            P(None),
            P(None),
            H,
            P(Some(2)),
            P(Some(3)),
            P(Some(1)),
            P(Some(4)),
            H,
            P(Some(5))
        ]
    );
}

/// SIEVE (Zhang et al.): queue oldest..newest [1,2,3]; hit 1 marks it. 4: hand starts at
/// the oldest, 1 visited → cleared, 2 evicted, hand at 3. 2: 3 evicted, hand at 4. 5: 4
/// evicted, hand at 2 → [1,2,5]. hits on 1 and 2. 3: hand at 2 visited → cleared, 5 evicted.
/// SIEVE keeps block 1 where LRU and FIFO lose it: 3 hits instead of 2.
#[test]
fn sieve_textbook() {
    let out = run(policy("sieve", 3).as_mut(), &[1, 2, 3, 1, 4, 2, 5, 1, 2, 3]);
    assert_eq!(
        out,
        vec![
            P(None),
            P(None),
            P(None),
            H,
            P(Some(2)),
            P(Some(3)),
            P(Some(4)),
            H,
            H,
            P(Some(5))
        ]
    );
}

/// 2Q with 4 blocks: Kin = 1, Kout = 2. 1..4 fill A1in. hit 1 (A1in: no change). 5: A1in
/// over Kin → its oldest (1) leaves to A1out. 1: ghost hit → reclaim evicts 2 (A1out [1,2]),
/// 1 moves to Am. hit 1 in Am. 2: ghost hit → evicts 3, 2 to Am. 6: new → evicts 4 into
/// A1out. hit 5 in A1in.
#[test]
fn two_q_full_version() {
    let out = run(policy("2q", 4).as_mut(), &[1, 2, 3, 4, 1, 5, 1, 1, 2, 6, 5]);
    assert_eq!(
        out,
        vec![
            P(None),
            P(None),
            P(None),
            P(None),
            H,
            P(Some(1)),
            P(Some(2)),
            H,
            P(Some(3)),
            P(Some(4)),
            H
        ]
    );
}

/// ARC (Megiddo & Modha, Fig. 4) with c = 2, p = 0. 1, 2 into T1; hit 1 → T2. 3: case IV.B,
/// REPLACE with |T1| = 1 > p evicts 2 to B1. 2: B1 hit, p = 1; REPLACE: |T1| = 1 not > p →
/// T2's LRU 1 to B2. 1: B2 hit, p = 0; REPLACE: |T1| = 1 > 0 → 3 to B1. 4: case IV.B with
/// T1 empty → T2's LRU 2 to B2. 3: B1 hit, p = 1; REPLACE: |T1| = 1 not > 1 → 1 to B2.
#[test]
fn arc_adapts_p() {
    let mut arc = strata_policy::policies::arc::Arc::new(2);
    let out = run(&mut arc, &[1, 2, 1, 3, 2, 1, 4, 3]);
    assert_eq!(
        out,
        vec![
            P(None),
            P(None),
            H,
            P(Some(2)),
            P(Some(1)),
            P(Some(3)),
            P(Some(2)),
            P(Some(1))
        ]
    );
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
    assert_eq!(
        out,
        vec![
            P(None),
            P(None),
            P(None),
            P(Some(3)),
            P(Some(4)),
            H,
            P(Some(1)),
            H
        ]
    );
}

/// LIRS keeps a loop's head resident where LRU gets nothing: 2 LIR blocks survive a cyclic
/// scan of 10 blocks with a 3-block cache.
#[test]
fn lirs_beats_lru_on_loops() {
    let trace: Vec<u64> = (0..20).flat_map(|_| 0..10u64).collect();
    let hits = |name: &str| {
        run(policy(name, 3).as_mut(), &trace)
            .iter()
            .filter(|e| **e == H)
            .count()
    };
    assert_eq!(hits("lru"), 0);
    // After the first pass the two LIR blocks (0 and 1) hit on every pass.
    assert!(hits("lirs") >= 2 * 19, "lirs hits {}", hits("lirs"));
}
