//! Typed errors for block IO. Every error carries where it happened so an operator can act on
//! it, and each kind maps onto exactly one NBD error code (see `nbd_errno`).

use std::fmt;

/// What went wrong, independent of where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The device failed the request (EIO).
    Io,
    /// No space left on the device, or a write past its end (ENOSPC).
    NoSpace,
    /// Offset or length lies outside the device (EINVAL for reads, ENOSPC for writes at the
    /// protocol edge: the server decides which; inside the engine it is this kind).
    OutOfRange,
    /// A malformed request: misaligned, zero-length where not allowed, unknown flag (EINVAL).
    Invalid,
    /// Write to a read-only device (EPERM).
    ReadOnly,
    /// Stored data failed its checksum (EIO on the wire).
    Checksum,
    /// The device cannot do this (ENOTSUP), e.g. a fast zero it cannot do quickly.
    Unsupported,
    /// The device is shutting down (ESHUTDOWN).
    Shutdown,
    /// Out of memory or another resource limit (ENOMEM).
    NoMemory,
    /// The device is claimed by another open of it (EBUSY; EIO on the wire, NBD has no EBUSY).
    Busy,
}

impl ErrorKind {
    /// The NBD error number for this kind (NBD uses Linux errno values on the wire).
    pub fn nbd_errno(self) -> u32 {
        match self {
            ErrorKind::Io | ErrorKind::Checksum | ErrorKind::Busy => 5,
            ErrorKind::NoSpace => 28,
            ErrorKind::OutOfRange | ErrorKind::Invalid => 22,
            ErrorKind::ReadOnly => 1,
            ErrorKind::Unsupported => 95,
            ErrorKind::Shutdown => 108,
            ErrorKind::NoMemory => 12,
        }
    }
}

/// A block IO error: its kind, and a message that says where (device, offset, structure).
#[derive(Debug, Clone, thiserror::Error)]
pub struct Error {
    pub kind: ErrorKind,
    pub context: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.context)
    }
}

impl Error {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error { kind, context: context.into() }
    }

    /// Wraps an OS error, keeping ENOSPC, EROFS and EINVAL apart from plain EIO.
    pub fn from_os(err: std::io::Error, context: impl Into<String>) -> Error {
        let kind = match err.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => ErrorKind::NoSpace,
            Some(libc::EROFS) | Some(libc::EPERM) | Some(libc::EACCES) => ErrorKind::ReadOnly,
            Some(libc::EINVAL) => ErrorKind::Invalid,
            Some(libc::EOPNOTSUPP) => ErrorKind::Unsupported,
            Some(libc::ENOMEM) => ErrorKind::NoMemory,
            Some(libc::EBUSY) => ErrorKind::Busy,
            _ => ErrorKind::Io,
        };
        Error { kind, context: format!("{}: {err}", context.into()) }
    }

    pub fn out_of_range(what: &str, offset: u64, len: u64, size: u64) -> Error {
        Error::new(
            ErrorKind::OutOfRange,
            format!("{what}: {len} bytes at offset {offset} exceed device size {size}"),
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
