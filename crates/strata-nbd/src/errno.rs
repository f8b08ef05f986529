//! How an IO error travels on the wire. An NBD reply carries a Linux errno value (proto.md,
//! "Error values"); `strata_io::ErrorKind` says what went wrong, and this table says which
//! number the client sees. Each kind maps onto exactly one number, except that a device only
//! says a range is out of bounds and the protocol wants ENOSPC for a write past the end and
//! EINVAL for anything else ([`for_command`]).

use crate::proto::*;
use strata_io::ErrorKind;

/// The NBD error number for `kind`.
pub fn from_kind(kind: ErrorKind) -> u32 {
    match kind {
        // NBD has no EBUSY or error for damaged data: the client sees an IO error.
        ErrorKind::Io | ErrorKind::Corrupt | ErrorKind::Busy | ErrorKind::Unavailable => EIO,
        ErrorKind::NoSpace => ENOSPC,
        ErrorKind::OutOfRange | ErrorKind::Invalid => EINVAL,
        ErrorKind::ReadOnly => EPERM,
        ErrorKind::Unsupported => ENOTSUP,
        ErrorKind::Shutdown => ESHUTDOWN,
        ErrorKind::NoMemory => ENOMEM,
    }
}

/// What an errno a server answered with means here (the inverse of [`from_kind`]; numbers
/// with no kind of their own are IO errors).
pub fn to_kind(errno: u32) -> ErrorKind {
    match errno {
        ENOSPC => ErrorKind::NoSpace,
        EINVAL | EOVERFLOW => ErrorKind::Invalid,
        EPERM => ErrorKind::ReadOnly,
        ENOTSUP => ErrorKind::Unsupported,
        ESHUTDOWN => ErrorKind::Shutdown,
        ENOMEM => ErrorKind::NoMemory,
        _ => ErrorKind::Io,
    }
}

/// The NBD error number for a request of command `cmd` (`CMD_*`) that failed with `kind`.
pub fn for_command(kind: ErrorKind, cmd: u16) -> u32 {
    match (kind, cmd) {
        (ErrorKind::OutOfRange, CMD_WRITE | CMD_WRITE_ZEROES) => ENOSPC,
        (kind, _) => from_kind(kind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers are Linux's (NBD puts them on the wire as they are); pin them.
    #[test]
    fn the_table() {
        let table = [
            (ErrorKind::Io, 5),
            (ErrorKind::NoSpace, 28),
            (ErrorKind::OutOfRange, 22),
            (ErrorKind::Invalid, 22),
            (ErrorKind::ReadOnly, 1),
            (ErrorKind::Corrupt, 5),
            (ErrorKind::Unsupported, 95),
            (ErrorKind::Shutdown, 108),
            (ErrorKind::NoMemory, 12),
            (ErrorKind::Busy, 5),
            (ErrorKind::Unavailable, 5),
        ];
        for (kind, errno) in table {
            assert_eq!(from_kind(kind), errno, "{kind:?}");
        }
        assert_eq!(for_command(ErrorKind::OutOfRange, CMD_WRITE), 28);
        assert_eq!(for_command(ErrorKind::OutOfRange, CMD_WRITE_ZEROES), 28);
        assert_eq!(for_command(ErrorKind::OutOfRange, CMD_READ), 22);
        assert_eq!(for_command(ErrorKind::OutOfRange, CMD_TRIM), 22);
        assert_eq!(for_command(ErrorKind::ReadOnly, CMD_WRITE), 1);
        assert_eq!(for_command(ErrorKind::Io, CMD_READ), 5);
        for (kind, errno) in table {
            if !matches!(kind, ErrorKind::Corrupt | ErrorKind::Busy | ErrorKind::Unavailable | ErrorKind::OutOfRange) {
                assert_eq!(to_kind(errno), kind, "{errno}");
            }
        }
    }
}
