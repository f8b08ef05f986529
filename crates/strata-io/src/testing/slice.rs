//! A window of another device, as a device of its own.

use crate::{BlockDev, Buf, ZeroFlags};

/// A window `[offset, offset+len)` of another device, as a device of its own: lets several
/// model checkers run concurrently on disjoint regions of one shared target.
pub struct Slice<D> {
    pub inner: D,
    pub offset: u64,
    pub len: u64,
}

impl<D: BlockDev> BlockDev for Slice<D> {
    fn size(&self) -> u64 {
        self.len
    }
    fn describe(&self) -> String {
        format!("[{}+{}] of {}", self.offset, self.len, self.inner.describe())
    }
    fn read(&self, offset: u64, buf: Buf) -> crate::BoxFut<'_, crate::Result<Buf>> {
        crate::check_range("slice read", offset, buf.len() as u64, self.len)
            .map_or_else(|e| crate::ready(Err(e)), |()| self.inner.read(self.offset + offset, buf))
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> crate::BoxFut<'_, crate::Result<Buf>> {
        crate::check_range("slice write", offset, buf.len() as u64, self.len)
            .map_or_else(|e| crate::ready(Err(e)), |()| self.inner.write(self.offset + offset, buf, fua))
    }
    fn flush(&self) -> crate::BoxFut<'_, crate::Result<()>> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> crate::BoxFut<'_, crate::Result<()>> {
        crate::check_range("slice discard", offset, len, self.len)
            .map_or_else(|e| crate::ready(Err(e)), |()| self.inner.discard(self.offset + offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> crate::BoxFut<'_, crate::Result<()>> {
        crate::check_range("slice write_zeroes", offset, len, self.len)
            .map_or_else(|e| crate::ready(Err(e)), |()| self.inner.write_zeroes(self.offset + offset, len, flags))
    }
}
