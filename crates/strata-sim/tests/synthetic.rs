//! The fio-compatible generators. Expected first values were computed with an independent
//! transcription of fio's lib/rand.c, lib/rand.h and lib/zipf.c (taus88 seeding with the
//! `(2^31)+(2^17)+(2^7)` = 53 XOR quirk, zipf's inverse and golden-ratio scatter) in Python.

use strata_sim::synthetic::{Generator, Pareto, Pattern, Taus88, Zipf, Zone, Zoned};

#[test]
fn taus88_matches_fio() {
    let mut t = Taus88::new(1);
    let first: Vec<u32> = (0..5).map(|_| t.next_u32()).collect();
    assert_eq!(first, vec![2_634_262_343, 4_072_702_554, 2_367_269_570, 3_770_928_454, 3_771_119_923]);
}

#[test]
fn zipf_matches_fio() {
    let mut z = Zipf::new(1000, 1.2, 1);
    let first: Vec<u64> = (0..8).map(|_| z.next_block()).collect();
    assert_eq!(first, vec![26, 28, 435, 435, 451, 897, 474, 343]);
    // zetan is the sum over all n terms when n <= 10^7.
    let expect: f64 = (1..=1000).map(|i| (1.0 / i as f64).powf(1.2)).sum();
    assert!((z.zetan() - expect).abs() < 1e-9);
}

/// zipf:1.2 concentrates accesses: the hottest 10% of blocks take about 90% of them. The
/// exact zeta ratio zeta_{n/10}(1.2) / zeta_n(1.2) is ≈ 0.87 for n = 100,000; fio's
/// closed-form inverse (Gray et al.'s quick zipf) puts a little more on the head, ≈ 0.95 here.
#[test]
fn zipf_head_mass() {
    let n = 100_000u64;
    let mut counts = vec![0u32; n as usize];
    for b in Generator::new(&Pattern::Zipf(1.2), n, 7).take(1_000_000) {
        counts[b as usize] += 1;
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let head: u64 = counts[..(n / 10) as usize].iter().map(|&c| c as u64).sum();
    let share = head as f64 / 1_000_000.0;
    assert!((0.85..0.97).contains(&share), "top 10% of blocks got {share:.3} of accesses");
    // And the ranks are scattered: the hottest block is not block 0.
    let hottest = counts[0];
    assert!(hottest > 50_000, "rank 1 should take ~{:.0}% of accesses", 100.0 / 5.6);
}

#[test]
fn pareto_and_zoned_shapes() {
    // pareto:0.2 is fio's "80/20": most accesses go to a small share of the blocks.
    let n = 10_000u64;
    let mut p = Pareto::new(n, 0.2, 3);
    let mut counts = vec![0u32; n as usize];
    for _ in 0..200_000 {
        counts[p.next_block() as usize] += 1;
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let head: u32 = counts[..2000].iter().sum();
    assert!(head as f64 / 200_000.0 > 0.75, "pareto head share {}", head as f64 / 200_000.0);

    // zoned:60/10:30/20:10/70 — 60% of accesses in the first 10% of blocks, 30% in the next 20%.
    let zones = [
        Zone { access_pct: 60, size_pct: 10 },
        Zone { access_pct: 30, size_pct: 20 },
        Zone { access_pct: 10, size_pct: 70 },
    ];
    let mut z = Zoned::new(n, &zones, 5).unwrap();
    let (mut a, mut b) = (0, 0);
    for _ in 0..100_000 {
        let x = z.next_block();
        assert!(x < n);
        if x < n / 10 {
            a += 1;
        } else if x < 3 * n / 10 {
            b += 1;
        }
    }
    assert!((58_000..62_000).contains(&a), "first zone got {a}");
    assert!((28_000..32_000).contains(&b), "second zone got {b}");
    assert!(Zoned::new(n, &[Zone { access_pct: 50, size_pct: 10 }], 1).is_err());
}

#[test]
fn patterns_parse() {
    assert_eq!("zipf:1.2".parse::<Pattern>().unwrap(), Pattern::Zipf(1.2));
    assert_eq!("pareto:0.2".parse::<Pattern>().unwrap(), Pattern::Pareto(0.2));
    assert_eq!("loop".parse::<Pattern>().unwrap(), Pattern::Loop);
    assert!("zipf:1".parse::<Pattern>().is_err());
    assert!("zoned:60/10:30".parse::<Pattern>().is_err());
    assert!("gauss:3".parse::<Pattern>().is_err());
    let loop_: Vec<u64> = Generator::new(&Pattern::Loop, 3, 1).take(7).collect();
    assert_eq!(loop_, vec![0, 1, 2, 0, 1, 2, 0]);
}
