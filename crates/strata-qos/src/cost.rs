//! What a request costs in device time. On the `hdd:` model the cost is what the model
//! charges (seek over the distance from where the head is, half a revolution on average,
//! transfer); elsewhere a linear model like blk-iocost's `io.cost.model` estimates it from
//! six figures: bytes per second and sequential and random 4 KiB requests per second, for
//! reads and for writes (`strata qos calibrate` measures them).

use crate::sched::{Nanos, Op};
use std::fmt;
use std::str::FromStr;
use strata_io::latency::HddParams;

/// `io.cost.model`'s figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Linear {
    pub rbps: u64,
    pub rseqiops: u64,
    pub rrandiops: u64,
    pub wbps: u64,
    pub wseqiops: u64,
    pub wrandiops: u64,
}

impl Linear {
    /// blk-iocost's defaults for a rotational disk.
    pub const ROTATIONAL: Linear = Linear {
        rbps: 174_019_176,
        rseqiops: 41_708,
        rrandiops: 370,
        wbps: 178_075_866,
        wseqiops: 42_705,
        wrandiops: 378,
    };
    /// blk-iocost's defaults for a solid-state device.
    pub const SOLID: Linear = Linear {
        rbps: 2_000_000_000,
        rseqiops: 49_286,
        rrandiops: 49_286,
        wbps: 1_000_000_000,
        wseqiops: 42_005,
        wrandiops: 42_005,
    };

    /// Device time of a request: a per-request part (what a 4 KiB request costs beyond its
    /// transfer) plus the transfer of its bytes.
    pub fn cost(&self, write: bool, sequential: bool, len: u64) -> Nanos {
        let (bps, seq, rand) =
            if write { (self.wbps, self.wseqiops, self.wrandiops) } else { (self.rbps, self.rseqiops, self.rrandiops) };
        let per_byte = 1e9 / bps.max(1) as f64;
        let iops = if sequential { seq } else { rand };
        let per_io = (1e9 / iops.max(1) as f64 - 4096.0 * per_byte).max(0.0);
        (per_io + len as f64 * per_byte) as Nanos
    }
}

impl fmt::Display for Linear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{},{},{},{},{},{}",
            self.rbps, self.rseqiops, self.rrandiops, self.wbps, self.wseqiops, self.wrandiops
        )
    }
}

impl FromStr for Linear {
    type Err = String;
    fn from_str(s: &str) -> Result<Linear, String> {
        let v: Vec<u64> = s
            .split(',')
            .map(|n| n.trim().parse::<u64>().ok().filter(|&n| n > 0))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("model {s:?}: expected six positive integers"))?;
        let [rbps, rseqiops, rrandiops, wbps, wseqiops, wrandiops] = v[..] else {
            return Err(format!(
                "model {s:?}: expected RBPS,RSEQIOPS,RRANDIOPS,WBPS,WSEQIOPS,WRANDIOPS (six figures, got {})",
                v.len()
            ));
        };
        Ok(Linear { rbps, rseqiops, rrandiops, wbps, wseqiops, wrandiops })
    }
}

/// How the scheduler prices requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CostModel {
    Linear(Linear),
    /// The `hdd:` model's own figures over a device of `size` bytes.
    Hdd {
        params: HddParams,
        size: u64,
    },
}

impl CostModel {
    /// The device time of `op` over `[offset, offset+len)`, the head (or the stream) having
    /// last ended at `last_end`.
    pub fn cost(&self, op: Op, offset: u64, len: u64, last_end: u64) -> Nanos {
        let sequential = offset == last_end;
        match self {
            CostModel::Linear(m) => match op {
                Op::Read => m.cost(false, sequential, len),
                Op::Write => m.cost(true, sequential, len),
                // A flush or a discard costs about one random write request.
                Op::Flush | Op::Discard => m.cost(true, false, 0),
            },
            CostModel::Hdd { params, size } => {
                if matches!(op, Op::Flush | Op::Discard) {
                    return 0;
                }
                (params.mean_service_s(*size, last_end, offset, len) * 1e9) as Nanos
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            CostModel::Linear(m) => format!("linear model {m}"),
            CostModel::Hdd { .. } => "the hdd model's own figures".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linear_model_reads_back_and_prices_as_iocost_does() {
        let m: Linear = "174019176,41708,370,178075866,42705,378".parse().unwrap();
        assert_eq!(m, Linear::ROTATIONAL);
        assert_eq!(m.to_string().parse::<Linear>().unwrap(), m);
        // A random 4 KiB read costs 1/rrandiops; a sequential one 1/rseqiops.
        assert_eq!(m.cost(false, false, 4096) / 1000, 1_000_000 / 370);
        assert_eq!(m.cost(false, true, 4096) / 100, 10_000_000 / 41708);
        for bad in ["1,2,3", "1,2,3,4,5,0", "a,b,c,d,e,f", "1,2,3,4,5,6,7"] {
            assert!(bad.parse::<Linear>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_hdd_model_charges_positioning_only_off_the_head() {
        let m = CostModel::Hdd { params: HddParams::default(), size: 1 << 30 };
        let seq = m.cost(Op::Read, 8192, 4096, 8192);
        let far = m.cost(Op::Read, 1 << 29, 4096, 0);
        assert_eq!(seq, 26_041);
        assert!(far > 12_000_000 && far < 15_000_000, "{far}");
    }
}
