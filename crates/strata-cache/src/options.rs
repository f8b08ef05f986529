//! The settings a cache is created with, their defaults and their limits: the one place these
//! numbers are written. `strata cache create` builds its flags, defaults and help from them,
//! `offline::create` checks against them, and the running target checks a changed readahead
//! with `check_readahead`.

use crate::format::Mode;
use strata_io::units::format_size;
use strata_io::{Error, ErrorKind, Result};

/// The block size limits, set by the on-disk format.
pub use crate::format::{MAX_BLOCK_BYTES, MIN_BLOCK_BYTES};

pub const DEFAULT_BLOCK_BYTES: u32 = 64 << 10;
pub const DEFAULT_MODE: Mode = Mode::Writeback;
/// Streams that run contiguously beyond this bypass the cache (0 disables the cutoff); a write
/// stream counts from its last flush or FUA write.
pub const DEFAULT_SEQUENTIAL_CUTOFF_BYTES: u64 = 4 << 20;
/// Promotions and write-backs together (0: unlimited).
pub const DEFAULT_MIGRATION_BUDGET_BYTES_PER_S: u64 = 32 << 20;
/// The dirty share of the cache the write-back controller holds.
pub const DEFAULT_WRITEBACK_PERCENT: u32 = 10;
pub const MAX_WRITEBACK_PERCENT: u32 = 100;
/// Read misses round out to this while the cache has unused blocks (see `Inner::fill_ahead`).
pub const DEFAULT_READAHEAD_BYTES: u32 = strata_policy::DEFAULT_READAHEAD_BYTES as u32;
pub use strata_policy::MAX_READAHEAD_BYTES;

const _: () = assert!(DEFAULT_BLOCK_BYTES.is_power_of_two());
const _: () = assert!(MIN_BLOCK_BYTES <= DEFAULT_BLOCK_BYTES && DEFAULT_BLOCK_BYTES <= MAX_BLOCK_BYTES);
const _: () = assert!(DEFAULT_READAHEAD_BYTES as u64 <= MAX_READAHEAD_BYTES);
const _: () = assert!(MAX_READAHEAD_BYTES <= u32::MAX as u64, "readahead is stored in 32 bits");
const _: () = assert!(DEFAULT_WRITEBACK_PERCENT <= MAX_WRITEBACK_PERCENT);

pub struct CreateOptions {
    pub block_bytes: u32,
    pub mode: Mode,
    pub policy: String,
    pub sequential_cutoff_bytes: u64,
    pub migration_budget_bytes_per_s: u64,
    pub writeback_percent: u32,
    pub readahead_bytes: u32,
    /// How to open the origin again (recorded in the superblock).
    pub origin_spec: String,
    /// What identifies the origin (device and inode of its file; empty when nothing does),
    /// recorded so that serving refuses another device at the same path.
    pub origin_id: String,
    pub force: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            block_bytes: DEFAULT_BLOCK_BYTES,
            mode: DEFAULT_MODE,
            policy: strata_policy::DEFAULT_POLICY.to_string(),
            sequential_cutoff_bytes: DEFAULT_SEQUENTIAL_CUTOFF_BYTES,
            migration_budget_bytes_per_s: DEFAULT_MIGRATION_BUDGET_BYTES_PER_S,
            writeback_percent: DEFAULT_WRITEBACK_PERCENT,
            readahead_bytes: DEFAULT_READAHEAD_BYTES,
            origin_spec: String::new(),
            origin_id: String::new(),
            force: false,
        }
    }
}

impl CreateOptions {
    /// Refuses settings outside their limits, or a policy nobody knows.
    pub fn check(&self) -> Result<()> {
        check_block_bytes(self.block_bytes)?;
        strata_policy::build(&self.policy, 1, &strata_policy::Params::default()).map_err(|e| invalid(e.to_string()))?;
        check_writeback_percent(self.writeback_percent)?;
        check_readahead(self.readahead_bytes as u64)
    }
}

pub fn check_block_bytes(bs: u32) -> Result<()> {
    if !bs.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&bs) {
        return Err(invalid(format!(
            "block size {bs} must be a power of two from {} to {}",
            format_size(MIN_BLOCK_BYTES as u64),
            format_size(MAX_BLOCK_BYTES as u64)
        )));
    }
    Ok(())
}

pub fn check_writeback_percent(percent: u32) -> Result<()> {
    if percent > MAX_WRITEBACK_PERCENT {
        return Err(invalid(format!("writeback percent must be 0..{MAX_WRITEBACK_PERCENT}")));
    }
    Ok(())
}

pub fn check_readahead(bytes: u64) -> Result<()> {
    if bytes > MAX_READAHEAD_BYTES {
        return Err(invalid(format!("readahead {bytes} bytes is over the maximum {MAX_READAHEAD_BYTES}")));
    }
    Ok(())
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Invalid, msg)
}
