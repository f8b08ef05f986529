//! The model checker: drive a device and an in-memory reference with the same random
//! operations and compare what reads return. Discarded ranges become "unknown" in the
//! reference (their contents are unspecified by the contract), so they are not compared until
//! written again.

use crate::mem::MemDev;
use crate::{BlockDev, Buf, ZeroFlags};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One step of a random workload.
#[derive(Debug, Clone)]
pub enum ModelOp {
    Read { offset: u64, len: u64 },
    Write { offset: u64, len: u64, fua: bool, fill: u64 },
    Flush,
    Discard { offset: u64, len: u64 },
    WriteZeroes { offset: u64, len: u64, may_unmap: bool },
}

/// Shape of the random workload.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Offsets and lengths are multiples of this.
    pub granularity: u64,
    /// Longest request in granules.
    pub max_granules: u64,
    /// Confine offsets to the first `span` bytes (hot region) to force overlap.
    pub span: u64,
}

/// Deterministic pseudo-random bytes for a write: every byte depends on the seed and position.
pub fn pattern(fill: u64, offset: u64, len: usize) -> Buf {
    let mut b = Buf::zeroed(len);
    for (i, chunk) in b.chunks_mut(8).enumerate() {
        let pos = offset + (i * 8) as u64;
        let v = (fill ^ pos).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ fill;
        let bytes = v.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    b
}

pub fn random_ops(seed: u64, count: usize, size: u64, w: &Workload) -> Vec<ModelOp> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let span = w.span.min(size);
    let granules = span / w.granularity;
    assert!(granules > 0, "device smaller than one granule");
    (0..count)
        .map(|_| {
            let start = rng.gen_range(0..granules);
            let n = rng.gen_range(1..=w.max_granules.min(granules - start));
            let (offset, len) = (start * w.granularity, n * w.granularity);
            match rng.gen_range(0..100) {
                0..=39 => ModelOp::Read { offset, len },
                40..=79 => ModelOp::Write { offset, len, fua: rng.gen_bool(0.1), fill: rng.gen() },
                80..=87 => ModelOp::Flush,
                88..=93 => ModelOp::Discard { offset, len },
                _ => ModelOp::WriteZeroes { offset, len, may_unmap: rng.gen_bool(0.5) },
            }
        })
        .collect()
}

/// The reference: a RAM device plus which bytes have a defined value.
pub struct Reference {
    pub mem: MemDev,
    known: Vec<bool>,
}

impl Reference {
    /// A reference device of `size` bytes, all zero and all known.
    pub fn new(size: u64) -> Reference {
        Reference { mem: MemDev::new(size), known: vec![true; size as usize] }
    }

    fn mark(&mut self, offset: u64, len: u64, known: bool) {
        self.known[offset as usize..(offset + len) as usize].fill(known);
    }

    /// Compares `got` (read at `offset`) with the reference; describes the first difference.
    pub fn compare(&self, offset: u64, got: &[u8]) -> Result<(), String> {
        let mut want = vec![0u8; got.len()];
        self.mem.read_into(offset, &mut want).map_err(|e| e.to_string())?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let pos = offset + i as u64;
            if g != w && self.known[pos as usize] {
                return Err(format!("byte at {pos} reads {g:#04x}, expected {w:#04x}"));
            }
        }
        Ok(())
    }

    pub fn apply_write(&mut self, offset: u64, data: &[u8]) {
        self.mem.write_from(offset, data).expect("reference write");
        self.mark(offset, data.len() as u64, true);
    }

    pub fn apply_zero(&mut self, offset: u64, len: u64) {
        self.mem.zero_range(offset, len, false).expect("reference zero");
        self.mark(offset, len, true);
    }

    pub fn apply_discard(&mut self, offset: u64, len: u64) {
        self.mark(offset, len, false);
    }
}

/// Runs `ops` against `dev` and the reference; every read is compared, and at the end the
/// whole device is read back and compared. Returns a description of the first mismatch,
/// naming the step.
pub async fn check_model(dev: &dyn BlockDev, ops: &[ModelOp]) -> Result<(), String> {
    let mut reference = Reference::new(dev.size());
    // Start from whatever the device holds now.
    let initial = dev.read(0, Buf::zeroed(dev.size() as usize)).await.map_err(|e| e.to_string())?;
    reference.mem.write_from(0, &initial).expect("reference init");
    for (step, op) in ops.iter().enumerate() {
        let fail = |what: String| format!("step {step} ({op:?}): {what}");
        match *op {
            ModelOp::Read { offset, len } => {
                let got = dev.read(offset, Buf::zeroed(len as usize)).await.map_err(|e| fail(e.to_string()))?;
                reference.compare(offset, &got).map_err(fail)?;
            }
            ModelOp::Write { offset, len, fua, fill } => {
                let data = pattern(fill, offset, len as usize);
                reference.apply_write(offset, &data);
                dev.write(offset, data, fua).await.map_err(|e| fail(e.to_string()))?;
            }
            ModelOp::Flush => dev.flush().await.map_err(|e| fail(e.to_string()))?,
            ModelOp::Discard { offset, len } => {
                reference.apply_discard(offset, len);
                dev.discard(offset, len).await.map_err(|e| fail(e.to_string()))?;
            }
            ModelOp::WriteZeroes { offset, len, may_unmap } => {
                reference.apply_zero(offset, len);
                let flags = ZeroFlags { may_unmap, fast_only: false };
                dev.write_zeroes(offset, len, flags).await.map_err(|e| fail(e.to_string()))?;
            }
        }
    }
    let all = dev.read(0, Buf::zeroed(dev.size() as usize)).await.map_err(|e| e.to_string())?;
    reference.compare(0, &all).map_err(|e| format!("final read-back: {e}"))
}

/// Writes every 4 KiB block of `dev` at once, each with its own pattern, then reads them all
/// back at once: more requests in flight than any queue of the device holds.
pub async fn check_all_blocks_at_once(dev: &dyn BlockDev) -> Result<(), String> {
    let blocks = dev.size() / 4096;
    let writes = (0..blocks).map(|b| dev.write(b * 4096, pattern(b, b * 4096, 4096), false));
    for (b, w) in futures::future::join_all(writes).await.into_iter().enumerate() {
        w.map_err(|e| format!("write of block {b}: {e}"))?;
    }
    let reads = (0..blocks).map(|b| dev.read(b * 4096, Buf::zeroed(4096)));
    for (b, r) in futures::future::join_all(reads).await.into_iter().enumerate() {
        let got = r.map_err(|e| format!("read of block {b}: {e}"))?;
        if got[..] != pattern(b as u64, b as u64 * 4096, 4096)[..] {
            return Err(format!("block {b} reads back other data"));
        }
    }
    Ok(())
}
