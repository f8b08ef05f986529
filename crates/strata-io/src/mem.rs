//! `mem:SIZE` — a RAM device. Memory is mapped in 2 MiB chunks on first write, and the
//! table of chunks in groups of a GiB's worth as they are first written, so a large `mem:`
//! volume costs only what is written (and 16 bytes per GiB of its size for the groups'
//! places: 16 MiB for [`MAX_BYTES`], the largest the spec takes); discarding a whole chunk
//! frees it, and `block_status` reports unmapped chunks as holes. When the kernel refuses a
//! chunk, the write fails with ENOSPC. (Asking for transparent huge pages made steady random
//! IO faster but stalled the first write to each chunk for milliseconds of compaction, so it
//! does not.) It is also the reference device the model-based tests compare every other
//! device and target against.

use crate::{check_range, ready, BlockDev, BoxFut, Buf, Error, ErrorKind, Extent, Geometry, Result, ZeroFlags};
use parking_lot::RwLock;
use std::ptr::NonNull;
use std::sync::OnceLock;

const CHUNK_BYTES: u64 = 2 << 20;
/// Chunks per group of the table (a GiB of the device).
const GROUP_CHUNKS: usize = 512;
/// The largest `mem:` device the spec takes: 1 PiB.
pub const MAX_BYTES: u64 = 1 << 50;

/// A chunk's place in the table: unmapped (`None`) until first written.
type Slot = RwLock<Option<Chunk>>;

pub struct MemDev {
    size: u64,
    groups: Vec<OnceLock<Box<[Slot; GROUP_CHUNKS]>>>,
}

impl MemDev {
    pub fn new(size: u64) -> MemDev {
        let n = size.div_ceil(CHUNK_BYTES).div_ceil(GROUP_CHUNKS as u64) as usize;
        MemDev { size, groups: (0..n).map(|_| OnceLock::new()).collect() }
    }

    /// Chunk `idx`'s place, if its group was ever written.
    fn slot(&self, idx: usize) -> Option<&Slot> {
        self.groups[idx / GROUP_CHUNKS].get().map(|g| &g[idx % GROUP_CHUNKS])
    }

    /// Chunk `idx`'s place, its group made if it was not.
    fn slot_made(&self, idx: usize) -> &Slot {
        let group =
            self.groups[idx / GROUP_CHUNKS].get_or_init(|| Box::new(std::array::from_fn(|_| RwLock::new(None))));
        &group[idx % GROUP_CHUNKS]
    }

    /// Visits `[offset, offset+len)` chunk by chunk: (chunk index, offset in chunk, span).
    fn spans(offset: u64, len: u64) -> impl Iterator<Item = (usize, usize, usize)> {
        let end = offset + len;
        let mut pos = offset;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let idx = pos / CHUNK_BYTES;
            let within = pos % CHUNK_BYTES;
            let span = (CHUNK_BYTES - within).min(end - pos);
            pos += span;
            Some((idx as usize, within as usize, span as usize))
        })
    }

    /// Synchronous read, for callers (tests, tools) that are not async.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        check_range("mem read", offset, out.len() as u64, self.size)?;
        let mut done = 0;
        for (idx, within, span) in Self::spans(offset, out.len() as u64) {
            let dst = &mut out[done..done + span];
            match self.slot(idx).map(|s| s.read()).as_deref() {
                Some(Some(chunk)) => dst.copy_from_slice(&chunk[within..within + span]),
                _ => dst.fill(0),
            }
            done += span;
        }
        Ok(())
    }

    /// Synchronous write.
    pub fn write_from(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_range("mem write", offset, data.len() as u64, self.size)?;
        let mut done = 0;
        for (idx, within, span) in Self::spans(offset, data.len() as u64) {
            let mut slot = self.slot_made(idx).write();
            if slot.is_none() {
                *slot = Some(Chunk::map().ok_or_else(|| {
                    Error::new(
                        ErrorKind::NoSpace,
                        format!("mem: no memory for the chunk at offset {}", offset + done as u64),
                    )
                })?);
            }
            let chunk = slot.as_mut().expect("mapped above");
            chunk[within..within + span].copy_from_slice(&data[done..done + span]);
            done += span;
        }
        Ok(())
    }

    /// Zeroes a range, freeing whole chunks when allowed.
    pub fn zero_range(&self, offset: u64, len: u64, free: bool) -> Result<()> {
        check_range("mem zero", offset, len, self.size)?;
        for (idx, within, span) in Self::spans(offset, len) {
            let Some(slot) = self.slot(idx) else { continue };
            let mut slot = slot.write();
            let whole = within == 0 && (span as u64 == CHUNK_BYTES || self.chunk_end(idx) == offset + len);
            if let Some(chunk) = slot.as_mut() {
                if whole && free {
                    *slot = None;
                } else {
                    chunk[within..within + span].fill(0);
                }
            }
        }
        Ok(())
    }

    fn chunk_end(&self, idx: usize) -> u64 {
        ((idx as u64 + 1) * CHUNK_BYTES).min(self.size)
    }

    pub fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range("mem block_status", offset, len, self.size)?;
        let mut out: Vec<Extent> = Vec::new();
        for (idx, _, span) in Self::spans(offset, len) {
            let hole = self.slot(idx).is_none_or(|s| s.read().is_none());
            match out.last_mut() {
                Some(last) if last.hole == hole => last.len += span as u64,
                _ => out.push(if hole { Extent::hole(span as u64) } else { Extent::data(span as u64) }),
            }
        }
        Ok(out)
    }
}

/// `CHUNK_BYTES` of anonymous memory aligned to its size: zero-filled by the kernel, its
/// pages faulted in as they are written, unmapped on drop.
struct Chunk(NonNull<u8>);

// SAFETY: a Chunk exclusively owns its mapping, like a Box<[u8]>.
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

impl Chunk {
    fn map() -> Option<Chunk> {
        let len = CHUNK_BYTES as usize;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh private anonymous mapping of twice the size, of which the aligned
        // middle is kept and the rest unmapped; nothing else refers to it.
        unsafe {
            let raw = libc::mmap(std::ptr::null_mut(), 2 * len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            if raw == libc::MAP_FAILED {
                return None;
            }
            let start = raw as usize;
            let aligned = start.next_multiple_of(len);
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            let tail = start + 2 * len - (aligned + len);
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            NonNull::new(aligned as *mut u8).map(Chunk)
        }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.0.as_ptr().cast(), CHUNK_BYTES as usize) };
    }
}

impl std::ops::Deref for Chunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is CHUNK_BYTES long, readable and ours.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), CHUNK_BYTES as usize) }
    }
}

impl std::ops::DerefMut for Chunk {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and writable.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), CHUNK_BYTES as usize) }
    }
}

impl BlockDev for MemDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn geometry(&self) -> Geometry {
        Geometry { min_block_bytes: 1, ..Geometry::default() }
    }

    fn describe(&self) -> String {
        format!("mem:{}", self.size)
    }

    fn read(&self, offset: u64, mut buf: Buf) -> BoxFut<'_, Result<Buf>> {
        ready(self.read_into(offset, &mut buf).map(|()| buf))
    }

    fn write(&self, offset: u64, buf: Buf, _fua: bool) -> BoxFut<'_, Result<Buf>> {
        ready(self.write_from(offset, &buf).map(|()| buf))
    }

    fn flush(&self) -> BoxFut<'_, Result<()>> {
        ready(Ok(()))
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        ready(self.zero_range(offset, len, true))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        ready(self.zero_range(offset, len, flags.may_unmap))
    }

    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        ready(self.extents(offset, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_device_costs_its_table_of_groups_alone_until_written() {
        let dev = MemDev::new(MAX_BYTES);
        assert_eq!(dev.groups.len(), 1 << 20);
        assert!(dev.groups.iter().all(|g| g.get().is_none()));
        let end = MAX_BYTES - 4096;
        let mut out = vec![1u8; 4096];
        dev.read_into(end, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0), "never written reads as zeroes");
        let tail = MAX_BYTES - (1 << 32);
        assert_eq!(dev.extents(tail, 1 << 32).unwrap(), vec![Extent::hole(1 << 32)]);
        dev.write_from(end, &[7u8; 4096]).unwrap();
        assert_eq!(dev.groups.iter().filter(|g| g.get().is_some()).count(), 1, "one group made by the write");
        dev.read_into(end, &mut out).unwrap();
        assert_eq!(out, vec![7u8; 4096]);
        let ext = dev.extents(MAX_BYTES - 2 * CHUNK_BYTES, 2 * CHUNK_BYTES).unwrap();
        assert_eq!(ext, vec![Extent::hole(CHUNK_BYTES), Extent::data(CHUNK_BYTES)]);
        // Zeroing an unmade group makes nothing; freeing the written chunk leaves a hole.
        dev.zero_range(0, CHUNK_BYTES, true).unwrap();
        dev.zero_range(MAX_BYTES - CHUNK_BYTES, CHUNK_BYTES, true).unwrap();
        assert_eq!(dev.groups.iter().filter(|g| g.get().is_some()).count(), 1);
        assert_eq!(dev.extents(tail, 1 << 32).unwrap(), vec![Extent::hole(1 << 32)]);
    }
}
