//! Owned, page-aligned IO buffers. A buffer moves into an IO call and comes back with its
//! completion, so an in-flight kernel operation never points at memory someone else owns.
//! The alignment makes every buffer usable with O_DIRECT.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer: a page, enough for O_DIRECT on any logical block size.
pub const BUF_ALIGN: usize = 4096;

pub struct Buf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: a Buf exclusively owns its allocation, like Vec<u8>.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}

impl Buf {
    /// A zero-filled buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Buf {
        let cap = len.div_ceil(BUF_ALIGN).max(1) * BUF_ALIGN;
        let layout = Layout::from_size_align(cap, BUF_ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Buf { ptr, len, cap }
    }

    pub fn from_slice(data: &[u8]) -> Buf {
        let mut b = Buf::zeroed(data.len());
        b.copy_from_slice(data);
        b
    }

    /// Bytes the buffer can hold without reallocating (a multiple of `BUF_ALIGN`).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Changes the length within the capacity; new bytes are whatever the buffer held
    /// before (zero for a fresh buffer).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "Buf::set_len {len} beyond capacity {}", self.cap);
        self.len = len;
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, BUF_ALIGN).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we own the allocation exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf({} bytes)", self.len)
    }
}

impl Clone for Buf {
    fn clone(&self) -> Buf {
        Buf::from_slice(self)
    }
}

/// Buffers kept for reuse by one owner (a connection), by capacity class: powers of two from
/// `BUF_ALIGN` up. A buffer from the pool is neither zeroed nor faulted in afresh; it holds
/// whatever its last user left in it, so take one only where every byte is about to be
/// overwritten (a device read, which fills its whole buffer, or a write payload read in
/// full). The pool keeps at most `max_bytes`; what does not fit is freed.
pub struct BufPool {
    free: Vec<Vec<Buf>>,
    bytes: usize,
    max_bytes: usize,
}

/// Capacity classes: `BUF_ALIGN << i` for i in 0..CLASSES (4 KiB to 64 MiB).
const CLASSES: usize = 15;

impl BufPool {
    pub fn new(max_bytes: usize) -> BufPool {
        BufPool { free: (0..CLASSES).map(|_| Vec::new()).collect(), bytes: 0, max_bytes }
    }

    /// A buffer of `len` bytes: a kept one of its class, or a fresh (zeroed) one.
    pub fn take(&mut self, len: usize) -> Buf {
        let cap = len.max(BUF_ALIGN).next_power_of_two();
        let class = (cap / BUF_ALIGN).trailing_zeros() as usize;
        let mut buf = match self.free.get_mut(class).and_then(|f| f.pop()) {
            Some(b) => {
                self.bytes -= b.cap;
                b
            }
            None if class < CLASSES => Buf::zeroed(cap),
            None => Buf::zeroed(len),
        };
        buf.set_len(len);
        buf
    }

    /// Keeps `buf` for a later `take` if its class has room under the bound.
    pub fn give(&mut self, buf: Buf) {
        let class = (buf.cap / BUF_ALIGN).trailing_zeros() as usize;
        if buf.cap.is_power_of_two() && class < CLASSES && self.bytes + buf.cap <= self.max_bytes {
            self.bytes += buf.cap;
            self.free[class].push(buf);
        }
    }

    /// Bytes kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Gives the allocator's free pages back to the system (glibc's `malloc_trim`): after a
/// target's recovery has built and dropped large transient maps, its resident memory is then
/// what it keeps, not what recovery once used. Elsewhere a no-op.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0, 1, 512, 4096, 4097, 1 << 20] {
            let b = Buf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % BUF_ALIGN, 0);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn a_pool_reuses_by_class_within_its_bound() {
        let mut pool = BufPool::new(3 << 20);
        let mut b = pool.take(1 << 20);
        let at = b.as_ptr();
        b.fill(7);
        pool.give(b);
        assert_eq!(pool.bytes(), 1 << 20);
        // The same class comes back, at its new length, holding what it held.
        let b = pool.take((1 << 20) - 4096);
        assert_eq!((b.as_ptr(), b.len(), b.capacity(), b[0]), (at, (1 << 20) - 4096, 1 << 20, 7));
        assert_eq!(pool.bytes(), 0);
        // Another class does not.
        let small = pool.take(100);
        assert_eq!((small.len(), small.capacity()), (100, 4096));
        assert!(small.iter().all(|&x| x == 0));
        // Past the bound, buffers are freed; buffers from elsewhere of odd sizes too.
        let more: Vec<Buf> = (0..4).map(|_| pool.take(1 << 20)).collect();
        more.into_iter().for_each(|b| pool.give(b));
        pool.give(b);
        pool.give(Buf::zeroed(3 * 4096));
        assert_eq!(pool.bytes(), 3 << 20);
    }
}
