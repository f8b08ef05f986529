//! Typed errors for block IO. Every error carries where it happened so an operator can act on
//! it, and its kind is coarse enough that whatever serves the device can answer each kind with
//! one error code of its protocol (strata-nbd's `errno` module does it for NBD).

use std::fmt;

/// What went wrong, independent of where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The device failed the request (EIO).
    Io,
    /// No space left on the device, or a write past its end (ENOSPC).
    NoSpace,
    /// Offset or length lies outside the device (a protocol edge may answer EINVAL for reads
    /// and ENOSPC for writes; inside the engine it is this kind).
    OutOfRange,
    /// A malformed request: misaligned, zero-length where not allowed, unknown flag (EINVAL).
    Invalid,
    /// Write to a read-only device (EPERM).
    ReadOnly,
    /// Stored data or metadata is damaged: a bad checksum, or a structure that cannot be
    /// (an EIO to clients).
    Corrupt,
    /// The device cannot do this (ENOTSUP), e.g. a fast zero it cannot do quickly.
    Unsupported,
    /// The device is shutting down (ESHUTDOWN).
    Shutdown,
    /// Out of memory or another resource limit (ENOMEM).
    NoMemory,
    /// The device is claimed by another open of it (EBUSY).
    Busy,
    /// The device cannot be reached for now (a remote server away longer than its outage
    /// limit): the request was not done, nothing acknowledged before is lost, and the same
    /// request may succeed later. An EIO to clients; a target above need not stop over it.
    Unavailable,
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
        Error::new(ErrorKind::OutOfRange, format!("{what}: {len} bytes at offset {offset} exceed device size {size}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
