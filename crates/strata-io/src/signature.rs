//! What a device holds, recognised from its first bytes, so that no format overwrites
//! another without `--force`: strata's own three formats (their magic numbers live here, one
//! place for each) and the file systems, volume managers and partition tables a fast device
//! is most likely to carry.

use crate::{BlockDev, Buf, Error, ErrorKind, Result};

/// How much of a device [`recognise`] looks at (btrfs's superblock is at 64 KiB).
pub const HEAD_BYTES: u64 = 128 << 10;

/// A strata cache's superblock, in either of its two copies (at 0 and at 4 KiB).
pub const CACHE_MAGIC: [u8; 8] = *b"STRATAC1";
/// A strata write log's superblock, at 0.
pub const WRITECACHE_MAGIC: [u8; 8] = *b"STRATAWC";
/// dm-thin's metadata superblock (little-endian at byte 32 of block 0).
pub const THIN_MAGIC: u64 = 27022010;
/// What [`recognise`] calls a device with dm-thin's superblock.
pub const THIN_METADATA: &str = "a thin pool's metadata";

/// The first [`HEAD_BYTES`] of `dev` (all of it if smaller), for [`recognise`].
pub async fn head(dev: &dyn BlockDev) -> Result<Buf> {
    dev.read(0, Buf::zeroed(dev.size().min(HEAD_BYTES) as usize)).await
}

type Signature = (&'static [usize], &'static [u8], &'static str);

/// strata's own formats: (offsets, magic, what).
const STRATA: [Signature; 3] = [
    (&[0, 4096], &CACHE_MAGIC, "a strata cache"),
    (&[0], &WRITECACHE_MAGIC, "a strata write log"),
    (&[32], &THIN_MAGIC.to_le_bytes(), THIN_METADATA),
];

/// Other software's formats.
const FOREIGN: [Signature; 10] = [
    (&[1080], &[0x53, 0xEF], "an ext2/3/4 file system"),
    (&[0], b"XFSB", "an XFS file system"),
    (&[65600], b"_BHRfS_M", "a btrfs file system"),
    (&[0, 512], b"LABELONE", "an LVM physical volume"),
    (&[512], b"EFI PART", "a GPT partition table"),
    (&[4086], b"SWAPSPACE2", "a swap area"),
    (&[0], b"\x01CD001", "an ISO 9660 image"),
    (&[32769], b"CD001", "an ISO 9660 image"),
    (&[510], &[0x55, 0xAA], "an MBR partition table or boot sector"),
    (&[4096], &[0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca], "a bcache device"),
];

fn find(head: &[u8], table: &[Signature]) -> Option<&'static str> {
    let at = |o: usize, m: &[u8]| head.get(o..o + m.len()) == Some(m);
    table.iter().find(|(offsets, magic, _)| offsets.iter().any(|&o| at(o, magic))).map(|&(_, _, what)| what)
}

/// What `head` (a device's first bytes) holds, if it is something a format must not
/// overwrite unasked.
pub fn recognise(head: &[u8]) -> Option<&'static str> {
    find(head, &STRATA).or_else(|| find(head, &FOREIGN))
}

/// What `head` holds for a format that takes only an empty device: something recognised,
/// else data if its first 4 KiB are not all zero.
pub fn recognise_any(head: &[u8]) -> Option<&'static str> {
    recognise(head).or_else(|| head.iter().take(4096).any(|&b| b != 0).then_some("data (its first 4 KiB are not zero)"))
}

/// Which of strata's own formats `head` holds, if any: a device given as an origin should
/// hold the user's data, and one of these there means the arguments were swapped or a
/// cache device was named in place of the volume it serves.
pub fn recognise_strata(head: &[u8]) -> Option<&'static str> {
    find(head, &STRATA)
}

/// Refuses, unless `force`, an origin that holds one of strata's own formats (see
/// [`recognise_strata`]): a cache or write log over it would write into that device.
pub async fn check_origin(origin: &dyn BlockDev, force: bool) -> Result<()> {
    match recognise_strata(&head(origin).await?) {
        Some(what) if !force => Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "the origin {} holds {what}, not a volume's data (were --origin and --cache swapped?); \
                 --force uses it anyway",
                origin.describe()
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(offset: usize, bytes: &[u8]) -> Vec<u8> {
        let mut head = vec![0u8; HEAD_BYTES as usize];
        head[offset..offset + bytes.len()].copy_from_slice(bytes);
        head
    }

    #[test]
    fn each_format_is_named_and_zeroes_are_nothing() {
        assert_eq!(recognise(&vec![0u8; HEAD_BYTES as usize]), None);
        assert_eq!(recognise(&with(4096, &CACHE_MAGIC)), Some("a strata cache"));
        assert_eq!(recognise(&with(0, &CACHE_MAGIC)), Some("a strata cache"));
        assert_eq!(recognise(&with(0, &WRITECACHE_MAGIC)), Some("a strata write log"));
        assert_eq!(recognise(&with(32, &THIN_MAGIC.to_le_bytes())), Some("a thin pool's metadata"));
        assert_eq!(recognise(&with(1080, &[0x53, 0xEF])), Some("an ext2/3/4 file system"));
        assert_eq!(recognise(&with(65600, b"_BHRfS_M")), Some("a btrfs file system"));
        assert_eq!(recognise(&with(4096, &[0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca])), Some("a bcache device"));
        // A head shorter than an offset is simply not that format.
        assert_eq!(recognise(&[0u8; 100]), None);
        assert_eq!(recognise(&with(0, &WRITECACHE_MAGIC)[..4096]), Some("a strata write log"));
        // An origin may hold a file system, not a strata format.
        assert_eq!(recognise_strata(&with(1080, &[0x53, 0xEF])), None);
        assert_eq!(recognise_strata(&with(4096, &CACHE_MAGIC)), Some("a strata cache"));
    }
}
