//! Write-back pacing: bcache's rate controller, shared by the cache and the write log.
//!
//! The rate, in blocks per second, is proportional to how far the dirty count is above its
//! target (1/40 of the excess per second, bcache's `writeback_rate_p_term_inverse`), plus an
//! integral term that grows by 1/10,000 of the excess per second while it stays above
//! (`writeback_rate_i_term_inverse`), so a steady inflow above the proportional rate is
//! caught up with. Below target the rate is zero. When the origin is idle or everything must
//! go (a flush, a detach, a full log) the caller asks for flat out: the ceiling.
//!
//! Write-back happens in whole blocks: the rate earns credit over time, at most one second's
//! worth and at most one batch, and the caller spends what it writes.

/// 1/40 of the excess per second (bcache's proportional term).
pub const P_TERM_INVERSE: f64 = 40.0;
/// 1/10,000 of the excess, accumulated per second (bcache's integral term).
pub const I_TERM_INVERSE: f64 = 10_000.0;

#[derive(Debug, Clone, Default)]
pub struct Pacer {
    integral: f64,
    rate: f64,
    credit: f64,
}

impl Pacer {
    /// Sets the rate for the next `dt` seconds from `dirty` blocks against `target`, capped at
    /// `ceiling` (blocks per second; infinite for no cap); `flat_out` asks for the ceiling.
    /// Returns the rate.
    pub fn update(&mut self, dirty: f64, target: f64, dt: f64, flat_out: bool, ceiling: f64) -> f64 {
        let error = dirty - target;
        self.rate = if dirty <= 0.0 {
            self.integral = 0.0;
            0.0
        } else if flat_out {
            ceiling
        } else if error > 0.0 {
            self.integral = (self.integral + error * dt / I_TERM_INVERSE).max(0.0);
            (error / P_TERM_INVERSE + self.integral).max(1.0).min(ceiling)
        } else {
            self.integral = 0.0;
            0.0
        };
        if self.rate == 0.0 {
            self.credit = 0.0;
        }
        self.rate
    }

    /// The rate set last, in blocks per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Earns `dt` seconds of credit at the rate (at most a second's worth and at most
    /// `batch` blocks) and returns the whole blocks it allows now.
    pub fn earn(&mut self, dt: f64, batch: usize) -> usize {
        self.credit = (self.credit + self.rate * dt).min(self.rate.max(1.0)).min(batch as f64);
        self.credit.floor() as usize
    }

    /// Spends the credit of `blocks` written back.
    pub fn spend(&mut self, blocks: usize) {
        self.credit = (self.credit - blocks as f64).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_proportional_to_the_excess_plus_a_growing_integral() {
        let mut p = Pacer::default();
        // 4,000 blocks over target: 100 blocks/s at once, plus 0.4 per second of integral.
        let r1 = p.update(5_000.0, 1_000.0, 1.0, false, f64::INFINITY);
        assert!((r1 - 100.4).abs() < 1e-9, "{r1}");
        let r2 = p.update(5_000.0, 1_000.0, 1.0, false, f64::INFINITY);
        assert!((r2 - 100.8).abs() < 1e-9, "{r2}");
        // A small excess still writes a block a second; at or below target nothing, and the
        // integral starts over.
        assert_eq!(p.update(1_001.0, 1_000.0, 1.0, false, f64::INFINITY), 1.0);
        assert_eq!(p.update(900.0, 1_000.0, 1.0, false, f64::INFINITY), 0.0);
        let again = p.update(5_000.0, 1_000.0, 1.0, false, f64::INFINITY);
        assert!((again - 100.4).abs() < 1e-9, "{again}");
        // The ceiling caps it; flat out is the ceiling, even below target, unless nothing is dirty.
        assert_eq!(p.update(5_000.0, 1_000.0, 1.0, false, 50.0), 50.0);
        assert_eq!(p.update(10.0, 1_000.0, 1.0, true, 300.0), 300.0);
        assert_eq!(p.update(0.0, 0.0, 1.0, true, 300.0), 0.0);
    }

    #[test]
    fn credit_is_earned_in_whole_blocks_capped_and_spent() {
        let mut p = Pacer::default();
        p.update(41_000.0, 1_000.0, 0.0, false, f64::INFINITY); // 1,000 blocks/s
        assert_eq!(p.earn(0.0005, 256), 0, "half a block is not a block");
        assert_eq!(p.earn(0.0005, 256), 1);
        p.spend(1);
        assert_eq!(p.earn(10.0, 256), 256, "at most a batch");
        p.spend(200);
        assert_eq!(p.earn(0.0, 256), 56);
        // Below target the credit is dropped.
        p.update(0.0, 1_000.0, 1.0, false, f64::INFINITY);
        assert_eq!(p.earn(1.0, 256), 0);
        // A slow rate earns at most a second's worth (one block at 0.5 blocks/s is never
        // more than one).
        p.update(1_010.0, 1_000.0, 0.0, false, 0.5);
        assert_eq!(p.earn(100.0, 256), 1);
    }
}
