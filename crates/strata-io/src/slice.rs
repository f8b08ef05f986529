//! `slice:OFFSET+SIZE@SPEC` — a window `[offset, offset+len)` of another device, as a device
//! of its own (dm-linear): several volumes on one disk, or several model checkers running at
//! once on disjoint regions of one target. Requests are checked against the window and
//! shifted by its offset; everything else passes through.

use crate::{check_range, ready, BlockDev, BoxFut, Buf, Extent, Result, ZeroFlags};
use std::sync::Arc;

pub struct Slice<D> {
    pub inner: D,
    pub offset: u64,
    pub len: u64,
}

impl<D: BlockDev> Slice<D> {
    /// Runs `op` on the inner device at the shifted offset, or refuses a range outside the window.
    fn within<'a, T: Send + 'a>(
        &'a self,
        what: &str,
        offset: u64,
        len: u64,
        op: impl FnOnce(&'a D, u64) -> BoxFut<'a, Result<T>>,
    ) -> BoxFut<'a, Result<T>> {
        match check_range(what, offset, len, self.len) {
            Ok(()) => op(&self.inner, self.offset + offset),
            Err(e) => ready(Err(e)),
        }
    }
}

impl<D: BlockDev> BlockDev for Slice<D> {
    crate::forward!(inner: geometry, flush, status, metrics, message, disconnect, shutdown);
    fn size(&self) -> u64 {
        self.len
    }
    fn describe(&self) -> String {
        format!("slice {}+{} of {}", self.offset, self.len, self.inner.describe())
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        let n = buf.len() as u64;
        self.within("slice read", offset, n, |d, at| d.read(at, buf))
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        let n = buf.len() as u64;
        self.within("slice write", offset, n, |d, at| d.write(at, buf, fua))
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        self.within("slice discard", offset, len, |d, at| d.discard(at, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        self.within("slice write_zeroes", offset, len, |d, at| d.write_zeroes(at, len, flags))
    }
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        self.within("slice block_status", offset, len, |d, at| d.block_status(at, len))
    }
    fn cache(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        self.within("slice cache", offset, len, |d, at| d.cache(at, len))
    }
    fn connect(&self) -> Option<Arc<dyn BlockDev>> {
        let inner = self.inner.connect()?;
        Some(Arc::new(Slice { inner, offset: self.offset, len: self.len }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDev;
    use crate::ErrorKind;

    #[tokio::test]
    async fn a_slice_shifts_requests_and_refuses_what_leaves_it() {
        let dev = Arc::new(MemDev::new(1 << 20));
        let s = Slice { inner: dev.clone(), offset: 4096, len: 8192 };
        assert_eq!(s.size(), 8192);
        s.write(0, Buf::from_slice(&[7u8; 4096]), false).await.unwrap();
        let got = dev.read(4096, Buf::zeroed(4096)).await.unwrap();
        assert!(got.iter().all(|&b| b == 7));
        let got = dev.read(0, Buf::zeroed(4096)).await.unwrap();
        assert!(got.iter().all(|&b| b == 0));
        for e in [
            s.read(4096, Buf::zeroed(8192)).await.unwrap_err(),
            s.write(8192, Buf::zeroed(512), false).await.unwrap_err(),
            s.discard(u64::MAX, 2).await.unwrap_err(),
            s.write_zeroes(1, 8192, ZeroFlags::default()).await.unwrap_err(),
        ] {
            assert_eq!(e.kind, ErrorKind::OutOfRange, "{e}");
        }
        let got = dev.read(12288, Buf::zeroed(4096)).await.unwrap();
        assert!(got.iter().all(|&b| b == 0), "nothing written past the window");
    }
}
