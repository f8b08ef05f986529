//! Invariants every policy must keep under random access, dirty marking, removal and hint
//! round trips, and after loading hints no policy saves; determinism for a seed; the memory
//! each states it takes.

use strata_policy::{build, Access, Op, Outcome, Params, Policy, POLICIES, POLICY_NAMES};

/// A small deterministic generator so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn check_policy(name: &str, cap: usize, seed: u64) {
    let mut p = build(name, cap, &Params { seed, ..Params::default() }).unwrap();
    let cached = exercise(&mut *p, name, cap, seed, std::collections::HashSet::new());
    // Hints restore the same set of blocks into an empty policy.
    let blob = p.save_hints();
    let mut q = build(name, cap, &Params { seed, ..Params::default() }).unwrap();
    q.load_hints(&blob).unwrap();
    assert_eq!(q.len(), cached.len(), "{name}: hint round trip");
    for &b in &cached {
        assert!(q.contains(b), "{name}: hints lost {b}");
    }
    assert!(q.load_hints(&blob).is_err(), "{name}: loading into a non-empty policy");
    assert!(p.bytes_per_entry() > 0.0);
}

/// Random accesses, dirty marking, write-back and removal on `p`, which holds `cached` (all
/// clean), each outcome checked against a model; returns what `p` holds at the end.
fn exercise(
    p: &mut (dyn Policy + Send),
    name: &str,
    cap: usize,
    seed: u64,
    mut cached: std::collections::HashSet<u64>,
) -> std::collections::HashSet<u64> {
    let mut rng = Rng(seed | 1);
    let mut dirty = std::collections::HashSet::new();
    for step in 0..20_000u64 {
        let now = step * 50_000_000; // 20 accesses per second, so smq's periods go by
        let r = rng.below(100);
        let block = if rng.below(4) == 0 { rng.below(4 * cap as u64) } else { rng.below(cap as u64 + 8) };
        if r < 80 {
            let op = if rng.below(3) == 0 { Op::Write } else { Op::Read };
            let full = rng.below(2) == 0;
            let was = cached.contains(&block);
            match p.access(Access::new(block, op, full, now)) {
                Outcome::Hit => assert!(was, "{name}: hit on uncached {block}"),
                Outcome::Miss => assert!(!was, "{name}: miss on cached {block}"),
                Outcome::Promote { evict } => {
                    assert!(!was, "{name}: promoted cached {block}");
                    if let Some(v) = evict {
                        assert!(cached.remove(&v), "{name}: evicted uncached {v}");
                        assert!(!dirty.contains(&v), "{name}: evicted dirty {v}");
                    } else {
                        assert!(cached.len() < cap, "{name}: promotion without eviction when full");
                    }
                    cached.insert(block);
                }
            }
        } else if r < 88 {
            assert_eq!(p.set_dirty(block), cached.contains(&block), "{name}: set_dirty");
            if cached.contains(&block) {
                dirty.insert(block);
            }
        } else if r < 95 {
            if let Some(b) = p.writeback_candidate(now) {
                assert!(dirty.contains(&b), "{name}: writeback of clean {b}");
                assert!(p.set_clean(b));
                dirty.remove(&b);
            }
        } else {
            assert_eq!(p.remove(block), cached.remove(&block), "{name}: remove");
            dirty.remove(&block);
        }
        assert_eq!(p.len(), cached.len(), "{name}: len at step {step}");
        assert!(p.len() <= cap);
        assert_eq!(p.dirty_len(), dirty.len(), "{name}: dirty_len at step {step}");
    }
    for &b in &cached {
        assert!(p.contains(b), "{name}: lost {b}");
        assert_eq!(p.is_dirty(b), dirty.contains(&b));
    }
    cached
}

/// A hint blob as `save_hints` writes one (the layout `hints.rs` documents), of any entries.
fn blob(policy: &str, entries: &[(u64, u8)]) -> Vec<u8> {
    let mut out = b"STRATAH1".to_vec();
    out.push(policy.len() as u8);
    out.extend_from_slice(policy.as_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for &(block, tag) in entries {
        out.extend_from_slice(&block.to_le_bytes());
        out.push(tag);
    }
    let sum = out.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3));
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Hints no policy saves, sealed with a good checksum: a block named again and again, more
/// blocks than the cache holds, every tag, the largest block numbers. Each is refused, or
/// loaded into a policy that then keeps every invariant.
#[test]
fn sealed_hints_no_policy_saves_are_refused_or_leave_a_sound_policy() {
    let cap = 8;
    let shapes: Vec<(&str, Vec<(u64, u8)>)> = vec![
        ("one block again and again", (0..=255u8).map(|t| (5, t)).collect()),
        ("more blocks than the cache holds", (0..100).map(|b| (b, 0)).collect()),
        ("every tag", (0..=255u8).map(|t| (t as u64 % 12, t)).collect()),
        ("every tag, one block each", (0..=255u8).map(|t| (1000 + t as u64, t)).collect()),
        ("the largest block numbers", vec![(u64::MAX, 0), (u64::MAX - 1, 1), (0, 2), (u64::MAX, 3)]),
    ];
    for name in POLICY_NAMES {
        for (what, entries) in &shapes {
            for few in [cap / 2, entries.len()] {
                let entries = &entries[..few.min(entries.len())];
                let mut p = build(name, cap, &Params::default()).unwrap();
                let saved_as = p.name();
                if p.load_hints(&blob(saved_as, entries)).is_err() {
                    assert_eq!(p.len(), 0, "{name}, {what}: refused hints left blocks");
                    continue;
                }
                let held: std::collections::HashSet<u64> =
                    entries.iter().map(|e| e.0).filter(|&b| p.contains(b)).collect();
                assert_eq!(p.len(), held.len(), "{name}, {what}: {} blocks held", p.len());
                assert!(p.len() <= cap, "{name}, {what}: {} blocks in a cache of {cap}", p.len());
                exercise(&mut *p, name, cap, 7, held);
            }
        }
    }
}

#[test]
fn invariants_hold_for_every_policy() {
    for name in POLICY_NAMES {
        for (cap, seed) in [(1, 1), (7, 2), (64, 3)] {
            check_policy(name, cap, seed);
        }
    }
}

/// When every cached block is dirty, nothing can be evicted: misses are not promoted.
#[test]
fn all_dirty_means_no_promotion() {
    for name in POLICY_NAMES {
        let mut p = build(name, 4, &Params::default()).unwrap();
        for b in 0..4 {
            p.insert(b, true).unwrap();
        }
        for t in 0..200u64 {
            let out = p.access(Access::write(100 + t % 7, true, t * 1_000_000_000));
            assert!(!out.is_promote(), "{name} promoted with only dirty blocks");
        }
        assert_eq!(p.len(), 4);
        // Writing one back frees a victim.
        let b = p.writeback_candidate(0).expect("a dirty block");
        assert!(p.writeback_candidate(0).is_some_and(|c| c != b), "{name}: handed out twice");
        p.set_clean(b);
        let mut promoted = false;
        for t in 0..400u64 {
            if let Outcome::Promote { evict } = p.access(Access::write(100 + t % 3, true, (t + 300) * 1_000_000_000)) {
                assert_eq!(evict, Some(b), "{name}: evicted a dirty block");
                promoted = true;
                break;
            }
        }
        assert!(promoted || *name == "smq", "{name} never used the clean victim");
    }
}

#[test]
fn deterministic_for_a_seed() {
    for name in POLICY_NAMES {
        let trace: Vec<u64> = (0..5000u64).map(|i| (i * 7919 + i / 3) % 300).collect();
        let outcomes = |seed| {
            let mut p = build(name, 50, &Params { seed, ..Params::default() }).unwrap();
            trace.iter().enumerate().map(|(i, &b)| p.access(Access::read(b, i as u64 * 10_000_000))).collect::<Vec<_>>()
        };
        assert_eq!(outcomes(7), outcomes(7), "{name}");
    }
}

#[test]
fn unknown_names_are_rejected() {
    let err = build("lfu9000", 10, &Params::default()).unwrap_err();
    assert!(err.to_string().contains("lfu9000") && err.to_string().contains("arc"));
    assert_eq!(build("default", 10, &Params::default()).unwrap().name(), strata_policy::DEFAULT_POLICY);
}

/// The table is the one list: names, help and `build` agree with it and with each other.
#[test]
fn the_policy_table_drives_names_help_and_build() {
    let mut seen = std::collections::HashSet::new();
    for row in POLICIES {
        assert!(seen.insert(row.name), "{} listed twice", row.name);
        assert!(!row.summary.is_empty() && !row.summary.contains('\n'), "{}", row.name);
        match row.new {
            Some(_) => {
                let p = build(row.name, 8, &Params::default()).unwrap();
                assert_eq!(p.name(), row.name);
                assert!(POLICY_NAMES.contains(&row.name));
            }
            None => {
                assert!(build(row.name, 8, &Params::default()).is_err());
                assert!(!POLICY_NAMES.contains(&row.name));
            }
        }
    }
    assert_eq!(POLICY_NAMES.len(), POLICIES.iter().filter(|p| p.new.is_some()).count());
    assert_eq!(POLICY_NAMES[0], strata_policy::DEFAULT_POLICY);
    let help = strata_policy::help();
    for name in POLICY_NAMES {
        assert!(help.lines().any(|l| l.trim_start().starts_with(&format!("{name} "))), "{help}");
    }
    assert!(!help.contains("opt "), "{help}");
    let all = strata_policy::describe(POLICIES);
    assert!(all.contains("opt "));
    assert!(all.lines().all(|l| l.len() <= strata_policy::HELP_COLUMNS), "{all}");
    let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let summaries: Vec<String> =
        POLICIES.iter().flat_map(|p| [p.name.to_string()].into_iter().chain(words(p.summary))).collect();
    assert_eq!(words(&all), summaries, "wrapping keeps every word, in order");
    let err = build("nope", 8, &Params::default()).unwrap_err().to_string();
    assert!(POLICY_NAMES.iter().all(|n| err.contains(n)), "{err}");
}

/// The default promotes far less than LRU on a zipf-like trace without losing hits.
#[test]
fn strata_promotes_less_than_lru() {
    let mut rng = Rng(42);
    // Popularity ~ 1/rank over 20,000 blocks, scattered.
    let trace: Vec<u64> = (0..200_000)
        .map(|_| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            let rank = (20_000f64.powf(u)) as u64;
            rank.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 1_000_003
        })
        .collect();
    let run = |name: &str| {
        let mut p = build(name, 1000, &Params::default()).unwrap();
        let (mut hits, mut promos) = (0, 0);
        for &b in &trace {
            match p.access(Access::read(b, 0)) {
                Outcome::Hit => hits += 1,
                Outcome::Promote { .. } => promos += 1,
                Outcome::Miss => {}
            }
        }
        (hits, promos)
    };
    let (lh, lp) = run("lru");
    let (sh, sp) = run("strata");
    assert!(sh > lh, "strata {sh} hits vs lru {lh}");
    assert!(sp * 4 < lp, "strata {sp} promotions vs lru {lp}");
}

/// Each policy's state, in caches of a million blocks and more (at powers of two and just
/// past them, where tables sized by powers of two are at their emptiest), takes no more per
/// cached block than its row of the table says: the figure the cache target asks the system
/// for before building one. At a million blocks it is filled first, ghosts and all.
#[test]
fn every_policy_keeps_to_the_bytes_per_block_it_states() {
    for info in POLICIES.iter().filter(|i| i.new.is_some()) {
        for cap in [1usize << 20, (1 << 20) + 1, 3 << 20, (1 << 21) + 1] {
            let mut p = build(info.name, cap, &Params::default()).unwrap();
            if cap == 1 << 20 {
                // Three capacities of new blocks, then the middle one again.
                for b in (0..3 * cap as u64).chain(cap as u64..2 * cap as u64) {
                    p.access(Access::read(b, 0));
                }
            }
            let took = p.bytes_per_entry();
            assert!(
                took <= info.bytes_per_block as f64,
                "{} at {cap} blocks: {took:.2} B a block, states {}",
                info.name,
                info.bytes_per_block
            );
        }
    }
}
