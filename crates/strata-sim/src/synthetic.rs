//! Synthetic workloads that match fio's `random_distribution` generators, so a simulated run
//! and a live fio run against strata see the same block popularity.
//!
//! `zipf:θ` and `pareto:h` follow fio's lib/zipf.c: a 32-bit combined Tausworthe generator
//! (taus88, seeded as fio's `init_rand_seed`), zeta(n, θ) summed over at most 10^7 terms, the
//! same closed-form inverse, then the rank scattered over the device with the 64-bit golden
//! ratio multiply and a random offset, exactly as fio does unless `random_center` is set.
//! `zoned:a/s:...` follows fio's percentage zones: pick a zone by a uniform 1..100 draw
//! against the access percentages, then a uniform block inside the zone.
//! The extra patterns `uniform`, `loop` and `scanmix:θ:p` exist to exercise policies.

use std::fmt;

use strata_policy::Op;

use crate::sim::{count_distinct, BlockAccess, Workload};

/// fio's `GOLDEN_RATIO_64`, the multiplier of `__hash_u64`.
pub const GOLDEN_RATIO_64: u64 = 0x61C8_8646_80B5_83EB;
/// fio's `ZIPF_MAX_GEN`: zeta(n) is summed over at most this many terms.
pub const ZIPF_MAX_GEN: u64 = 10_000_000;

/// fio's taus88 generator (lib/rand.h `__rand32`, seeded by lib/rand.c `__init_rand32`).
#[derive(Clone, Debug)]
pub struct Taus88 {
    s1: u32,
    s2: u32,
    s3: u32,
}

impl Taus88 {
    pub fn new(seed: u32) -> Self {
        // fio writes the LCG's starting constant as `(2^31) + (2^17) + (2^7)` in C, where `^`
        // is XOR: 29 + 19 + 5 = 53. Reproducing the quirk keeps our streams equal to fio's.
        const START: u32 = 53;
        fn lcg(x: u32, seed: u32) -> u32 {
            x.wrapping_mul(69069) ^ seed
        }
        fn floor(x: u32, m: u32) -> u32 {
            if x < m {
                x + m
            } else {
                x
            }
        }
        let s1 = floor(lcg(START, seed), 1);
        let s2 = floor(lcg(s1, seed), 7);
        let s3 = floor(lcg(s2, seed), 15);
        let mut t = Taus88 { s1, s2, s3 };
        for _ in 0..6 {
            t.next_u32();
        }
        t
    }

    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        #[inline]
        fn step(s: u32, a: u32, b: u32, c: u32, d: u32) -> u32 {
            ((s & c) << d) ^ (((s << a) ^ s) >> b)
        }
        self.s1 = step(self.s1, 13, 19, 4_294_967_294, 12);
        self.s2 = step(self.s2, 2, 25, 4_294_967_288, 4);
        self.s3 = step(self.s3, 3, 11, 4_294_967_280, 17);
        self.s1 ^ self.s2 ^ self.s3
    }

    /// fio's `rand32_upto`/`rand_between`: uniform in `start..=end`.
    pub fn between(&mut self, start: u64, end: u64) -> u64 {
        let r = self.next_u32() as f64;
        let span = (end - start + 1) as f64;
        start + (span * (r / 4_294_967_296.0)) as u64
    }
}

/// fio's zipf state (`struct zipf_state`).
#[derive(Clone, Debug)]
pub struct Zipf {
    rand: Taus88,
    nranges: u64,
    theta: f64,
    zeta2: f64,
    zetan: f64,
    rand_off: u64,
}

impl Zipf {
    /// `zipf_init(nranges, theta, center = -1, seed)`.
    pub fn new(nranges: u64, theta: f64, seed: u32) -> Self {
        assert!(nranges > 0, "zipf needs at least one block");
        let mut rand = Taus88::new(seed);
        let rand_off = rand.next_u32() as u64;
        let to_gen = nranges.min(ZIPF_MAX_GEN);
        let zetan = (0..to_gen).map(|i| (1.0 / (i + 1) as f64).powf(theta)).sum();
        Zipf { rand, nranges, theta, zeta2: 1.0 + 0.5f64.powf(theta), zetan, rand_off }
    }

    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// The popularity rank (0 = most popular) of the next draw, before scattering.
    pub fn next_rank(&mut self) -> u64 {
        let n = self.nranges as f64;
        let alpha = 1.0 / (1.0 - self.theta);
        let eta = (1.0 - (2.0 / n).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan);
        let rand_uni = self.rand.next_u32() as f64 / u32::MAX as f64;
        let rand_z = rand_uni * self.zetan;
        let val = if rand_z < 1.0 {
            1
        } else if rand_z < 1.0 + 0.5f64.powf(self.theta) {
            2
        } else {
            1 + (n * (eta * rand_uni - eta + 1.0).powf(alpha)) as u64
        };
        val - 1
    }

    /// `zipf_next`: the next block, scattered like fio.
    pub fn next_block(&mut self) -> u64 {
        let rank = self.next_rank();
        rank.wrapping_mul(GOLDEN_RATIO_64).wrapping_add(self.rand_off) % self.nranges
    }
}

/// fio's pareto generator (`pareto_init`/`pareto_next`).
#[derive(Clone, Debug)]
pub struct Pareto {
    rand: Taus88,
    nranges: u64,
    pareto_pow: f64,
    rand_off: u64,
}

impl Pareto {
    pub fn new(nranges: u64, h: f64, seed: u32) -> Self {
        assert!(nranges > 0, "pareto needs at least one block");
        let mut rand = Taus88::new(seed);
        let rand_off = rand.next_u32() as u64;
        Pareto { rand, nranges, pareto_pow: h.ln() / (1.0 - h).ln(), rand_off }
    }

    pub fn next_block(&mut self) -> u64 {
        let r = self.rand.next_u32() as f64 / u32::MAX as f64;
        let rank = ((self.nranges - 1) as f64 * r.powf(self.pareto_pow)) as u64;
        rank.wrapping_mul(GOLDEN_RATIO_64).wrapping_add(self.rand_off) % self.nranges
    }
}

/// One `access%/size%` pair of a zoned distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Zone {
    pub access_pct: u32,
    pub size_pct: u32,
}

/// fio's `zoned` distribution.
#[derive(Clone, Debug)]
pub struct Zoned {
    rand: Taus88,
    nblocks: u64,
    /// For each draw 1..=100, the zone's [start%, end%) of the device.
    index: Vec<(u32, u32)>,
}

impl Zoned {
    pub fn new(nblocks: u64, zones: &[Zone], seed: u32) -> Result<Self, String> {
        let access: u32 = zones.iter().map(|z| z.access_pct).sum();
        let size: u32 = zones.iter().map(|z| z.size_pct).sum();
        if access != 100 || size > 100 {
            return Err(format!(
                "zoned: access percentages must add up to 100 (got {access}) and sizes to at most 100 (got {size})"
            ));
        }
        let mut index = Vec::with_capacity(100);
        let mut size_prev = 0;
        for z in zones {
            for _ in 0..z.access_pct {
                index.push((size_prev, size_prev + z.size_pct));
            }
            size_prev += z.size_pct;
        }
        Ok(Zoned { rand: Taus88::new(seed), nblocks, index })
    }

    pub fn next_block(&mut self) -> u64 {
        let v = self.rand.between(1, 100) as usize;
        let (start, end) = self.index[v - 1];
        let offset = start as u64 * self.nblocks / 100;
        let len = (self.nblocks * (end - start) as u64 / 100).max(1);
        offset + self.rand.between(0, len - 1)
    }
}

/// A parsed `--synthetic` pattern.
#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    Zipf(f64),
    Pareto(f64),
    Zoned(Vec<Zone>),
    Uniform,
    /// Sequential passes over all blocks, again and again.
    Loop,
    /// Zipf(θ) over the blocks, interleaved with a sequential scan that takes a fraction `p`
    /// of the requests and walks a separate region of the same size.
    ScanMix(f64, f64),
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Zipf(t) => write!(f, "zipf:{t}"),
            Pattern::Pareto(h) => write!(f, "pareto:{h}"),
            Pattern::Zoned(z) => {
                let parts: Vec<String> = z.iter().map(|z| format!("{}/{}", z.access_pct, z.size_pct)).collect();
                write!(f, "zoned:{}", parts.join(":"))
            }
            Pattern::Uniform => write!(f, "uniform"),
            Pattern::Loop => write!(f, "loop"),
            Pattern::ScanMix(t, p) => write!(f, "scanmix:{t}:{p}"),
        }
    }
}

impl std::str::FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, rest) = s.split_once(':').unwrap_or((s, ""));
        let num = |v: &str, what: &str| -> Result<f64, String> {
            v.parse::<f64>().map_err(|_| format!("{name}: bad {what} '{v}'"))
        };
        match name {
            "zipf" => {
                let theta = num(rest, "theta")?;
                if !(theta > 0.0 && theta != 1.0) {
                    return Err("zipf: theta must be > 0 and != 1 (as in fio)".into());
                }
                Ok(Pattern::Zipf(theta))
            }
            "pareto" => {
                let h = num(rest, "h")?;
                if !(h > 0.0 && h < 1.0) {
                    return Err("pareto: h must be in (0, 1) (as in fio)".into());
                }
                Ok(Pattern::Pareto(h))
            }
            "zoned" => {
                let zones = rest
                    .split(':')
                    .map(|z| {
                        let (a, s) = z.split_once('/').ok_or_else(|| format!("zoned: '{z}' is not ACCESS%/SIZE%"))?;
                        let p = |v: &str| v.parse::<u32>().map_err(|_| format!("zoned: bad percentage '{v}'"));
                        Ok(Zone { access_pct: p(a)?, size_pct: p(s)? })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Zoned::new(100, &zones, 0)?;
                Ok(Pattern::Zoned(zones))
            }
            "uniform" | "random" => Ok(Pattern::Uniform),
            "loop" => Ok(Pattern::Loop),
            "scanmix" => {
                let (t, p) = rest.split_once(':').ok_or("scanmix: expected scanmix:THETA:SCAN_FRACTION")?;
                let (t, p) = (num(t, "theta")?, num(p, "scan fraction")?);
                if !(0.0..=1.0).contains(&p) || t <= 0.0 || t == 1.0 {
                    return Err("scanmix: theta must be > 0 and != 1, the scan fraction in [0, 1]".into());
                }
                Ok(Pattern::ScanMix(t, p))
            }
            _ => Err(format!(
                "unknown synthetic pattern '{s}' (zipf:THETA, pareto:H, zoned:A/S:..., uniform, loop, scanmix:THETA:P)"
            )),
        }
    }
}

/// An endless stream of block numbers following a [`Pattern`] over `blocks` blocks.
pub struct Generator {
    inner: Inner,
}

enum Inner {
    Zipf(Zipf),
    Pareto(Pareto),
    Zoned(Zoned),
    Uniform(Taus88, u64),
    Loop(u64, u64),
    ScanMix { zipf: Zipf, rand: Taus88, p: f64, blocks: u64, cursor: u64 },
}

impl Generator {
    pub fn new(pattern: &Pattern, blocks: u64, seed: u32) -> Self {
        assert!(blocks > 0, "a synthetic trace needs at least one block");
        let inner = match pattern {
            Pattern::Zipf(t) => Inner::Zipf(Zipf::new(blocks, *t, seed)),
            Pattern::Pareto(h) => Inner::Pareto(Pareto::new(blocks, *h, seed)),
            Pattern::Zoned(z) => Inner::Zoned(Zoned::new(blocks, z, seed).expect("validated when parsed")),
            Pattern::Uniform => Inner::Uniform(Taus88::new(seed), blocks),
            Pattern::Loop => Inner::Loop(0, blocks),
            Pattern::ScanMix(t, p) => Inner::ScanMix {
                zipf: Zipf::new(blocks, *t, seed),
                rand: Taus88::new(seed ^ 0x5ca9),
                p: *p,
                blocks,
                cursor: 0,
            },
        };
        Generator { inner }
    }
}

impl Iterator for Generator {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        Some(match &mut self.inner {
            Inner::Zipf(z) => z.next_block(),
            Inner::Pareto(p) => p.next_block(),
            Inner::Zoned(z) => z.next_block(),
            Inner::Uniform(r, n) => r.between(0, *n - 1),
            Inner::Loop(i, n) => {
                let b = *i;
                *i = (*i + 1) % *n;
                b
            }
            Inner::ScanMix { zipf, rand, p, blocks, cursor } => {
                if (rand.next_u32() as f64) < *p * 4_294_967_296.0 {
                    let b = *blocks + *cursor;
                    *cursor = (*cursor + 1) % *blocks;
                    b
                } else {
                    zipf.next_block()
                }
            }
        })
    }
}

/// What a synthetic [`workload`] looks like besides its [`Pattern`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadOptions {
    /// Device size in blocks (fio's nranges).
    pub blocks: u64,
    pub requests: u64,
    /// Seeds the pattern (fio's zipf/pareto seed, taken as 32 bits) and the read/write mix.
    pub seed: u64,
    /// Percentage of reads (fio's rwmixread); the rest are writes.
    pub read_percent: u8,
    /// Time between requests, for policies with periods.
    pub interval_ns: u64,
    pub block_size: u64,
}

/// `o.requests` whole-block accesses following `pattern`, request `i` at `i * interval_ns`.
pub fn workload(pattern: &Pattern, o: &WorkloadOptions) -> Workload {
    let seed = o.seed as u32;
    let mut mix = Taus88::new(seed.wrapping_add(0x9e37));
    let accesses: Vec<BlockAccess> = Generator::new(pattern, o.blocks, seed)
        .take(o.requests as usize)
        .enumerate()
        .map(|(i, block)| {
            let write = o.read_percent < 100 && mix.between(1, 100) > o.read_percent as u64;
            BlockAccess {
                block,
                time_ns: i as u64 * o.interval_ns,
                bytes: o.block_size as u32,
                op: if write { Op::Write } else { Op::Read },
                full: true,
            }
        })
        .collect();
    let footprint = count_distinct(accesses.iter().map(|a| a.block));
    let max_block = accesses.iter().map(|a| a.block).max().unwrap_or(0);
    Workload { requests: o.requests, block_size: o.block_size, footprint, max_block, accesses }
}
