//! strata-io: the BlockDev contract every device and target implements, owned buffers, typed
//! errors, and the plain devices (files and block devices, RAM, latency models) that targets
//! stack on. Nothing here knows about caching or the NBD wire format.

pub mod background;
pub mod buf;
pub mod depth;
pub mod engine;
pub mod error;
pub mod fault;
pub mod file;
pub mod latency;
pub mod mem;
pub mod metrics;
pub mod overlay;
pub mod powercut;
pub mod query;
pub mod rwlock;
pub mod shared;
pub mod signature;
pub mod slice;
pub mod stats;
pub mod testing;
pub mod timer;
pub mod units;

use std::future::Future;
use std::pin::Pin;

pub use buf::{Buf, BufPool};
pub use error::{Error, ErrorKind, Result};

/// A boxed future borrowed from the device it came from.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One run of a device's address space in `block_status`, NBD `base:allocation` style.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    /// Unallocated: reads return zeroes and writes may need to allocate (NBD_STATE_HOLE).
    pub hole: bool,
    /// Known to read as zeroes (NBD_STATE_ZERO).
    pub zero: bool,
}

impl Extent {
    pub fn data(len: u64) -> Extent {
        Extent { len, hole: false, zero: false }
    }
    pub fn hole(len: u64) -> Extent {
        Extent { len, hole: true, zero: true }
    }
}

/// How `write_zeroes` may achieve its effect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// The range may be deallocated (NBD: no NO_HOLE flag).
    pub may_unmap: bool,
    /// Fail with `Unsupported` rather than write zeroes slowly (NBD_CMD_FLAG_FAST_ZERO).
    pub fast_only: bool,
}

/// Static facts about a device that clients and stacked targets plan around.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Smallest IO the device handles without read-modify-write (a power of two).
    pub min_block_bytes: u32,
    /// The IO size the device prefers.
    pub preferred_block_bytes: u32,
    /// Spinning media: random IO is expensive.
    pub rotational: bool,
    /// `discard` actually frees space (rather than succeeding as a no-op).
    pub can_discard: bool,
    /// `write_zeroes` with `fast_only` can succeed.
    pub can_fast_zero: bool,
    /// The device takes no writes (a file opened read-only, a read-only remote export):
    /// exported read-only.
    pub read_only: bool,
}

impl Default for Geometry {
    fn default() -> Geometry {
        Geometry {
            min_block_bytes: 512,
            preferred_block_bytes: 4096,
            rotational: false,
            can_discard: true,
            can_fast_zero: true,
            read_only: false,
        }
    }
}

/// The contract of every device and target. Semantics follow NBD and the Linux block layer:
/// a completed write is visible to every later read from anyone; `flush` returns once every
/// write completed before it was issued is durable; a FUA write returns once it is durable.
/// Offsets and lengths are in bytes; callers stay within `size()` (devices check anyway and
/// answer `OutOfRange`). Buffers move in and come back with the completion.
pub trait BlockDev: Send + Sync + 'static {
    /// Size in bytes.
    fn size(&self) -> u64;

    fn geometry(&self) -> Geometry {
        Geometry::default()
    }

    /// A short human description (the spec it was opened from, and what it stacks on).
    fn describe(&self) -> String;

    /// Fills `buf` (its whole length) from `offset`.
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>>;

    /// Writes `buf` at `offset`; with `fua` it returns only once the data is durable.
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>>;

    /// Makes every write completed before this call durable.
    fn flush(&self) -> BoxFut<'_, Result<()>>;

    /// The range's contents become unspecified and its space may be freed.
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>>;

    /// The range reads as zeroes afterwards.
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>>;

    /// Allocation and zero state of `[offset, offset+len)`, as consecutive extents starting
    /// at `offset`. May describe less than asked (at least one byte) or more.
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        let _ = offset;
        Box::pin(async move { Ok(vec![Extent::data(len)]) })
    }

    /// A hint that the range will be read soon (NBD_CMD_CACHE); default does nothing.
    fn cache(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        let _ = (offset, len);
        Box::pin(async { Ok(()) })
    }

    /// Target-specific state for `strata status` (mode, counters, ...). Plain devices have none.
    fn status(&self) -> Option<serde_json::Value> {
        None
    }

    /// The same state as [`BlockDev::status`], as Prometheus samples for `/metrics`: counters
    /// and gauges with their help lines. Plain devices have none.
    fn metrics(&self) -> Vec<metrics::Sample> {
        Vec::new()
    }

    /// A target-specific control message (like `dmsetup message`), e.g. `mode writethrough`.
    /// Returns a short human answer. Plain devices accept none.
    fn message(&self, msg: &str) -> BoxFut<'_, Result<String>> {
        let msg = msg.to_string();
        Box::pin(async move {
            Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{}: not a cache, write log, thin or qos volume: it takes no messages ({msg:?})",
                    self.describe()
                ),
            ))
        })
    }

    /// A handle through which one client connection (one NBD connection) sends its requests,
    /// so that a device can tell connections apart: an IO controller gives each its own fair
    /// share. The server asks once per connection and drops the handle when it closes. A
    /// target that passes requests through unchanged returns its inner device's handle
    /// wrapped in itself; `None` (the default) means this device serves every connection
    /// alike, and the server uses it directly.
    fn connect(&self) -> Option<std::sync::Arc<dyn BlockDev>> {
        None
    }

    /// Called on a connection's handle (`connect`) once its connection is closing (the
    /// client gone, the server stopping, the export removed): the requests it still has
    /// must finish soon, so a device that paces them (caps, shares) lets them go.
    fn disconnect(&self) {}

    /// Called once when the volume is taken down cleanly: make everything durable and save
    /// whatever makes the next start warm. The default is a flush.
    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        self.flush()
    }

    /// Grows the device to hold at least `bytes` while open (a file is lengthened, a block
    /// device's size read again, as after `lvextend`) and returns its size. The default only
    /// says whether it already holds them.
    fn grow(&self, bytes: u64) -> BoxFut<'_, Result<u64>> {
        Box::pin(async move {
            match self.size() {
                size if size >= bytes => Ok(size),
                size => Err(Error::new(
                    ErrorKind::Unsupported,
                    format!("{}: holds {size} bytes, cannot grow to {bytes}", self.describe()),
                )),
            }
        })
    }
}

/// Implements the named [`BlockDev`] methods by passing each call unchanged to the device at
/// `self.PATH`, for wrappers that change only some of them:
/// `forward!(inner: size, geometry, status);` inside `impl BlockDev for Wrapper`.
#[macro_export]
macro_rules! forward {
    ($($field:ident).+ : $($method:ident),+ $(,)?) => {
        $crate::forward!(@each [$($field).+] $($method)+);
    };
    (@each $path:tt $method:ident $($rest:ident)*) => {
        $crate::forward!(@one $path $method);
        $crate::forward!(@each $path $($rest)*);
    };
    (@each $path:tt) => {};
    (@one [$($f:ident).+] size) => {
        fn size(&self) -> u64 { self.$($f).+.size() }
    };
    (@one [$($f:ident).+] geometry) => {
        fn geometry(&self) -> $crate::Geometry { self.$($f).+.geometry() }
    };
    (@one [$($f:ident).+] describe) => {
        fn describe(&self) -> String { self.$($f).+.describe() }
    };
    (@one [$($f:ident).+] read) => {
        fn read(&self, offset: u64, buf: $crate::Buf) -> $crate::BoxFut<'_, $crate::Result<$crate::Buf>> {
            self.$($f).+.read(offset, buf)
        }
    };
    (@one [$($f:ident).+] write) => {
        fn write(&self, offset: u64, buf: $crate::Buf, fua: bool) -> $crate::BoxFut<'_, $crate::Result<$crate::Buf>> {
            self.$($f).+.write(offset, buf, fua)
        }
    };
    (@one [$($f:ident).+] flush) => {
        fn flush(&self) -> $crate::BoxFut<'_, $crate::Result<()>> { self.$($f).+.flush() }
    };
    (@one [$($f:ident).+] discard) => {
        fn discard(&self, offset: u64, len: u64) -> $crate::BoxFut<'_, $crate::Result<()>> {
            self.$($f).+.discard(offset, len)
        }
    };
    (@one [$($f:ident).+] write_zeroes) => {
        fn write_zeroes(&self, offset: u64, len: u64, flags: $crate::ZeroFlags) -> $crate::BoxFut<'_, $crate::Result<()>> {
            self.$($f).+.write_zeroes(offset, len, flags)
        }
    };
    (@one [$($f:ident).+] block_status) => {
        fn block_status(&self, offset: u64, len: u64) -> $crate::BoxFut<'_, $crate::Result<Vec<$crate::Extent>>> {
            self.$($f).+.block_status(offset, len)
        }
    };
    (@one [$($f:ident).+] cache) => {
        fn cache(&self, offset: u64, len: u64) -> $crate::BoxFut<'_, $crate::Result<()>> {
            self.$($f).+.cache(offset, len)
        }
    };
    (@one [$($f:ident).+] status) => {
        fn status(&self) -> Option<$crate::__serde_json::Value> { self.$($f).+.status() }
    };
    (@one [$($f:ident).+] metrics) => {
        fn metrics(&self) -> Vec<$crate::metrics::Sample> { self.$($f).+.metrics() }
    };
    (@one [$($f:ident).+] message) => {
        fn message(&self, msg: &str) -> $crate::BoxFut<'_, $crate::Result<String>> { self.$($f).+.message(msg) }
    };
    (@one [$($f:ident).+] connect) => {
        fn connect(&self) -> Option<std::sync::Arc<dyn $crate::BlockDev>> { self.$($f).+.connect() }
    };
    (@one [$($f:ident).+] disconnect) => {
        fn disconnect(&self) { self.$($f).+.disconnect() }
    };
    (@one [$($f:ident).+] shutdown) => {
        fn shutdown(&self) -> $crate::BoxFut<'_, $crate::Result<()>> { self.$($f).+.shutdown() }
    };
    (@one [$($f:ident).+] grow) => {
        fn grow(&self, bytes: u64) -> $crate::BoxFut<'_, $crate::Result<u64>> { self.$($f).+.grow(bytes) }
    };
}

#[doc(hidden)]
pub use serde_json as __serde_json;

/// Checks that `[offset, offset+len)` lies inside a device of `size` bytes.
pub fn check_range(what: &str, offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::out_of_range(what, offset, len, size)),
    }
}

/// A future that is already complete.
pub fn ready<'a, T: Send + 'a>(v: T) -> BoxFut<'a, T> {
    Box::pin(std::future::ready(v))
}

impl<T: BlockDev + ?Sized> BlockDev for std::sync::Arc<T> {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, Result<Buf>> {
        (**self).read(offset, buf)
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, Result<Buf>> {
        (**self).write(offset, buf, fua)
    }
    fn flush(&self) -> BoxFut<'_, Result<()>> {
        (**self).flush()
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        (**self).discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, Result<()>> {
        (**self).write_zeroes(offset, len, flags)
    }
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, Result<Vec<Extent>>> {
        (**self).block_status(offset, len)
    }
    fn cache(&self, offset: u64, len: u64) -> BoxFut<'_, Result<()>> {
        (**self).cache(offset, len)
    }
    fn status(&self) -> Option<serde_json::Value> {
        (**self).status()
    }
    fn metrics(&self) -> Vec<metrics::Sample> {
        (**self).metrics()
    }
    fn message(&self, msg: &str) -> BoxFut<'_, Result<String>> {
        (**self).message(msg)
    }
    fn connect(&self) -> Option<std::sync::Arc<dyn BlockDev>> {
        (**self).connect()
    }
    fn disconnect(&self) {
        (**self).disconnect()
    }
    fn shutdown(&self) -> BoxFut<'_, Result<()>> {
        (**self).shutdown()
    }
    fn grow(&self, bytes: u64) -> BoxFut<'_, Result<u64>> {
        (**self).grow(bytes)
    }
}
