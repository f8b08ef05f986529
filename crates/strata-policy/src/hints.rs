//! The hint blob a policy saves at clean shutdown so a restart is warm.
//!
//! Layout (little-endian): magic `STRATAH1`, policy name (u8 length + bytes), entry count
//! (u64), then per cached block `block: u64, tag: u8` from the policy's coldest to hottest
//! block, then an FNV-1a 64 checksum of everything before it. The tag is policy-specific
//! (smq: queue level; ARC: which list; S3-FIFO: queue and frequency). Decoding checks every
//! length and the checksum before a policy sees any entry.

const MAGIC: &[u8; 8] = b"STRATAH1";
/// A hint blob never describes more blocks than this (2^32 cache blocks).
const MAX_ENTRIES: u64 = 1 << 32;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HintError {
    #[error("hint blob is truncated or has trailing bytes")]
    BadLength,
    #[error("hint blob has a bad magic number")]
    BadMagic,
    #[error("hint blob checksum mismatch")]
    BadChecksum,
    #[error("hints were saved by policy '{found}', not '{expected}'")]
    WrongPolicy { expected: String, found: String },
    #[error("hints can only be loaded into an empty policy")]
    NotEmpty,
    #[error("hint blob names block {0}, past the most a policy numbers")]
    BlockOutOfRange(u64),
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub(crate) fn encode(name: &str, entries: impl ExactSizeIterator<Item = (u64, u8)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 1 + name.len() + 8 + entries.len() * 9 + 8);
    out.extend_from_slice(MAGIC);
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (block, tag) in entries {
        out.extend_from_slice(&block.to_le_bytes());
        out.push(tag);
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Check and decode a blob saved by policy `name`.
pub(crate) fn decode(name: &str, bytes: &[u8]) -> Result<Vec<(u64, u8)>, HintError> {
    if bytes.len() < 8 + 1 + 8 + 8 {
        return Err(HintError::BadLength);
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if &body[..8] != MAGIC {
        return Err(HintError::BadMagic);
    }
    if fnv1a(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(HintError::BadChecksum);
    }
    let name_len = body[8] as usize;
    let rest = &body[9..];
    if rest.len() < name_len + 8 {
        return Err(HintError::BadLength);
    }
    let found = String::from_utf8_lossy(&rest[..name_len]).into_owned();
    if found != name {
        return Err(HintError::WrongPolicy { expected: name.to_string(), found });
    }
    let rest = &rest[name_len..];
    let count = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
    let rest = &rest[8..];
    if count > MAX_ENTRIES || rest.len() as u64 != count * 9 {
        return Err(HintError::BadLength);
    }
    let entries: Vec<(u64, u8)> =
        rest.chunks_exact(9).map(|c| (u64::from_le_bytes(c[..8].try_into().expect("8 bytes")), c[8])).collect();
    match entries.iter().find(|e| e.0 > crate::entry::MAX_BLOCK) {
        Some(&(block, _)) => Err(HintError::BlockOutOfRange(block)),
        None => Ok(entries),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let blob = encode("lru", vec![(7u64, 1u8), (9, 0)].into_iter());
        assert_eq!(decode("lru", &blob).unwrap(), vec![(7, 1), (9, 0)]);
        assert!(matches!(decode("arc", &blob), Err(HintError::WrongPolicy { .. })));
        let mut bad = blob.clone();
        bad[20] ^= 1;
        assert_eq!(decode("lru", &bad), Err(HintError::BadChecksum));
        assert_eq!(decode("lru", &blob[..10]), Err(HintError::BadLength));
    }
}
