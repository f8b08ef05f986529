//! `strata qos calibrate`: measures a device's linear cost model (blk-iocost's
//! `io.cost.model` figures) by driving it for a while per figure: random and sequential
//! 4 KiB requests, and sequential 1 MiB requests for bytes per second, reads then writes.
//! Writes put back what a read just got, so the device's contents do not change (run it on
//! a device nobody else writes meanwhile).

use crate::cost::Linear;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::{Duration, Instant};
use strata_io::{BlockDev, Buf, Error, ErrorKind, Result};

/// How to drive the device.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    /// Time spent on each of the six figures.
    pub phase: Duration,
    /// Requests in flight at once.
    pub depth: usize,
    /// Measure writes too (else the write figures are the read ones).
    pub writes: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Pattern {
    Random,
    Sequential,
}

/// Requests per second of device time: each worker's count over the time its measured
/// requests took, summed.
async fn rate(dev: &dyn BlockDev, c: &Calibration, pattern: Pattern, len: u64, write: bool) -> Result<f64> {
    let size = dev.size() / len * len;
    let deadline = Instant::now() + c.phase;
    let workers = (0..c.depth as u64).map(|w| async move {
        let mut rng = ChaCha8Rng::seed_from_u64(w + 1);
        let mut at = size / c.depth as u64 * w / len * len;
        let (mut n, mut busy) = (0u64, Duration::ZERO);
        while Instant::now() < deadline {
            let offset = match pattern {
                Pattern::Random => rng.gen_range(0..size / len) * len,
                Pattern::Sequential => {
                    let o = at;
                    at = (at + len) % size;
                    o
                }
            };
            let start = Instant::now();
            let buf = dev.read(offset, Buf::zeroed(len as usize)).await?;
            if write {
                let start = Instant::now();
                dev.write(offset, buf, false).await?;
                busy += start.elapsed();
            } else {
                busy += start.elapsed();
            }
            n += 1;
        }
        Ok::<_, Error>(n as f64 / busy.as_secs_f64().max(1e-9))
    });
    let mut total = 0.0;
    for r in futures::future::join_all(workers).await {
        total += r?;
    }
    Ok(total)
}

/// Measures `dev`'s cost model.
pub async fn calibrate(dev: &dyn BlockDev, c: &Calibration) -> Result<Linear> {
    if dev.size() < 4 << 20 {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!("{}: too small to calibrate (under 4 MiB)", dev.describe()),
        ));
    }
    let figures = |write: bool| async move {
        let randiops = rate(dev, c, Pattern::Random, 4096, write).await?;
        let seqiops = rate(dev, c, Pattern::Sequential, 4096, write).await?;
        let bps = rate(dev, c, Pattern::Sequential, 1 << 20, write).await? * (1 << 20) as f64;
        Ok::<_, Error>((bps.max(1.0) as u64, seqiops.max(1.0) as u64, randiops.max(1.0) as u64))
    };
    let (rbps, rseqiops, rrandiops) = figures(false).await?;
    let (wbps, wseqiops, wrandiops) = if c.writes { figures(true).await? } else { (rbps, rseqiops, rrandiops) };
    Ok(Linear { rbps, rseqiops, rrandiops, wbps, wseqiops, wrandiops })
}
