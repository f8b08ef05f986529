//! `hdd:PATH` and `ssd:PATH` — latency models over a real device, so cache experiments are
//! repeatable on any machine. The data is really read and written on the inner device; the
//! model only decides when each request may complete.
//!
//! The HDD serves one request at a time in arrival order: seek time grows with the square
//! root of the distance from where the last request ended (`seek_min_ms` for adjacent tracks
//! to `seek_max_ms` for a full stroke, about 8 ms on average with the defaults), plus a
//! rotational delay (uniform in one revolution, 4.17 ms on average at 7200 rpm) unless the
//! request continues the previous one, plus transfer at `mib_s`. Its write cache is off (a
//! write is durable when it completes, so a flush costs nothing): a write that continues the
//! previous request but arrives after the disk went idle has missed its sector and waits for
//! it to come round again, up to a whole revolution. So synchronous sequential writes, such
//! as a journal's commits one after another, run at most one per revolution, as on a real
//! disk; writes queued back to back, and reads (which the drive's read-ahead serves), don't
//! wait. The SSD has `channels` independent queues, each charging a fixed latency plus
//! transfer.

use crate::timer::sleep_until;
use crate::{BlockDev, BoxFut, Buf, Geometry, Result, ZeroFlags};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HddParams {
    pub seek_min_ms: f64,
    pub seek_max_ms: f64,
    pub rpm: f64,
    pub mib_s: f64,
    pub seed: u64,
}

impl HddParams {
    /// Seek time for a head move over `distance`, a fraction of the device (0 to 1).
    pub fn seek_ms(&self, distance: f64) -> f64 {
        self.seek_min_ms + (self.seek_max_ms - self.seek_min_ms) * distance.clamp(0.0, 1.0).sqrt()
    }

    pub fn revolution_ms(&self) -> f64 {
        60_000.0 / self.rpm
    }

    /// The wait of a write that continues the previous request, arriving `idle` after the
    /// disk finished it: the sector passed under the head then, and is back once a revolution.
    pub fn missed_sector_s(&self, idle: Duration) -> f64 {
        if idle.is_zero() {
            return 0.0;
        }
        let rev = self.revolution_ms() / 1000.0;
        rev - idle.as_secs_f64() % rev
    }

    pub fn transfer_s(&self, len: u64) -> f64 {
        len as f64 / (self.mib_s * 1048576.0)
    }

    /// Mean service time in seconds of a request of `len` bytes at `offset` on a device of
    /// `size` bytes whose head sits where the previous request ended (`last_end`): none for
    /// positioning when the request continues the previous one, else a seek over the distance
    /// plus the mean rotational delay (half a revolution); then the transfer. (It has no clock:
    /// a continuing write is taken as queued behind the previous one, not as missing its
    /// sector.)
    pub fn mean_service_s(&self, size: u64, last_end: u64, offset: u64, len: u64) -> f64 {
        let positioning_ms = if offset == last_end {
            0.0
        } else {
            let distance = offset.abs_diff(last_end) as f64 / size.max(1) as f64;
            self.seek_ms(distance) + self.revolution_ms() / 2.0
        };
        positioning_ms / 1000.0 + self.transfer_s(len)
    }
}

impl Default for HddParams {
    fn default() -> HddParams {
        HddParams { seek_min_ms: 0.5, seek_max_ms: 15.0, rpm: 7200.0, mib_s: 150.0, seed: 1 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SsdParams {
    pub read_us: f64,
    pub write_us: f64,
    pub channels: usize,
    pub mib_s: f64,
}

impl Default for SsdParams {
    fn default() -> SsdParams {
        SsdParams { read_us: 80.0, write_us: 20.0, channels: 8, mib_s: 500.0 }
    }
}

enum Model {
    Hdd { p: HddParams, state: Box<Mutex<HddState>> },
    Ssd { p: SsdParams, free_at: Mutex<Vec<Instant>> },
}

struct HddState {
    /// Where the previous request ended (the head position).
    last_end: u64,
    busy_until: Instant,
    rng: ChaCha8Rng,
    busy_total: Duration,
}

pub struct LatencyDev<D> {
    inner: D,
    model: Model,
}

impl<D: BlockDev> LatencyDev<D> {
    pub fn hdd(inner: D, p: HddParams) -> LatencyDev<D> {
        let state = HddState {
            last_end: 0,
            busy_until: Instant::now(),
            rng: ChaCha8Rng::seed_from_u64(p.seed),
            busy_total: Duration::ZERO,
        };
        LatencyDev { inner, model: Model::Hdd { p, state: Box::new(Mutex::new(state)) } }
    }

    pub fn ssd(inner: D, p: SsdParams) -> LatencyDev<D> {
        let free_at = vec![Instant::now(); p.channels.max(1)];
        LatencyDev { inner, model: Model::Ssd { p, free_at: Mutex::new(free_at) } }
    }

    /// When a request of `len` bytes at `offset` arriving now completes; reserves the device.
    fn schedule(&self, offset: u64, len: u64, write: bool) -> Instant {
        let now = Instant::now();
        match &self.model {
            Model::Hdd { p, state } => {
                let mut s = state.lock();
                let transfer = p.transfer_s(len);
                let positioning = if offset != s.last_end {
                    let size = self.inner.size().max(1) as f64;
                    let distance = (offset as f64 - s.last_end as f64).abs() / size;
                    (p.seek_ms(distance) + s.rng.gen::<f64>() * p.revolution_ms()) / 1000.0
                } else if write {
                    p.missed_sector_s(now.saturating_duration_since(s.busy_until))
                } else {
                    0.0
                };
                let service = Duration::from_secs_f64(positioning + transfer);
                let start = s.busy_until.max(now);
                s.busy_until = start + service;
                s.busy_total += service;
                s.last_end = offset + len;
                s.busy_until
            }
            Model::Ssd { p, free_at } => {
                let mut chans = free_at.lock();
                let (i, _) = chans.iter().enumerate().min_by_key(|(_, t)| **t).expect("one channel");
                let lat_us = if write { p.write_us } else { p.read_us };
                let service = Duration::from_secs_f64(lat_us / 1e6 + len as f64 / (p.mib_s * 1048576.0));
                let start = chans[i].max(now);
                chans[i] = start + service;
                chans[i]
            }
        }
    }

    /// Total emulated busy time so far (HDD only), for utilisation figures.
    pub fn busy_time(&self) -> Option<Duration> {
        match &self.model {
            Model::Hdd { state, .. } => Some(state.lock().busy_total),
            Model::Ssd { .. } => None,
        }
    }
}

impl<D: BlockDev> BlockDev for LatencyDev<D> {
    crate::forward!(inner: size, grow, flush, discard, block_status, cache);

    fn geometry(&self) -> Geometry {
        let rotational = matches!(self.model, Model::Hdd { .. });
        Geometry { rotational, ..self.inner.geometry() }
    }

    fn describe(&self) -> String {
        match &self.model {
            Model::Hdd { p, .. } => format!(
                "hdd model (seek {}-{} ms, {} rpm, {} MiB/s) over {}",
                p.seek_min_ms,
                p.seek_max_ms,
                p.rpm,
                p.mib_s,
                self.inner.describe()
            ),
            Model::Ssd { p, .. } => format!(
                "ssd model (read {} us, write {} us, {} channels, {} MiB/s) over {}",
                p.read_us,
                p.write_us,
                p.channels,
                p.mib_s,
                self.inner.describe()
            ),
        }
    }

    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            let done = self.schedule(offset, buf.len() as u64, false);
            let r = self.inner.read(offset, buf).await;
            sleep_until(done).await;
            r
        })
    }

    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        Box::pin(async move {
            let done = self.schedule(offset, buf.len() as u64, true);
            let r = self.inner.write(offset, buf, fua).await;
            sleep_until(done).await;
            r
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        Box::pin(async move {
            // Zeroing costs what writing the zeroes would, unless it only unmaps.
            let done = if flags.may_unmap { Instant::now() } else { self.schedule(offset, len, true) };
            let r = self.inner.write_zeroes(offset, len, flags).await;
            sleep_until(done).await;
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missed_sector_comes_round_once_a_revolution() {
        let p = HddParams { rpm: 6000.0, ..HddParams::default() }; // 10 ms a revolution
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert_eq!(p.missed_sector_s(Duration::ZERO), 0.0, "queued back to back: no wait");
        assert!(close(p.missed_sector_s(Duration::from_millis(1)), 0.009));
        assert!(close(p.missed_sector_s(Duration::from_millis(9)), 0.001));
        assert!(close(p.missed_sector_s(Duration::from_millis(23)), 0.007));
        assert!(close(p.missed_sector_s(Duration::from_micros(1)), 0.009999));
    }
}
