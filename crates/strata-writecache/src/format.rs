//! The on-disk format of a write-log cache device: a superblock, a table of one 32-byte entry
//! per slot, and the slots (one cache block each).
//!
//! ```text
//! [superblock: 4 KiB][entries: 32 B per slot, padded to 4 KiB][slots, aligned to the block size]
//! ```
//!
//! An entry names the origin block its slot holds, the sequence number of the write that put
//! it there (newest wins at recovery), the commit that first wrote the entry (48 bits: the
//! low 32 in a field of their own, the rest in the flags word's top half), and the CRC32C
//! of the slot's data. Entries are written only by commits, each of which ends with one flush
//! of the fast device; an entry of the last commit seen may have reached the media without
//! its data, so recovery checks the data of those (and only those) against the CRC. An entry
//! of all zeroes is a free slot. No entry crosses a 512-byte sector, so a torn commit leaves
//! each entry whole, old or new.
//!
//! This module only encodes and decodes; it does no IO.

use strata_io::{Error, ErrorKind, Result};

pub const MAGIC: [u8; 8] = strata_io::signature::WRITECACHE_MAGIC;
pub const VERSION: u32 = 1;
pub const SUPERBLOCK_BYTES: u64 = 4096;
pub const ENTRY_BYTES: u64 = 32;
/// Entries are written in pages of this size (O_DIRECT-friendly).
pub const ENTRY_PAGE_BYTES: u64 = 4096;
pub const ENTRIES_PER_PAGE: u64 = ENTRY_PAGE_BYTES / ENTRY_BYTES;
pub const BLOCK_BYTES_MIN: u32 = 512;
pub const BLOCK_BYTES_MAX: u32 = 64 << 10;
pub const BLOCK_BYTES_DEFAULT: u32 = 4096;
/// Entry flag: the slot holds zeroes (no data was written; the data CRC is not checked).
pub const FLAG_ZERO: u32 = 1;
/// The flags word's top 16 bits hold the commit number's bits above its 32nd (zero in logs
/// written before commits went past 2^32, which read the same).
const COMMIT_HIGH_SHIFT: u32 = 16;
/// Commit numbers stay below this (2^48): at a hundred thousand commits a second, 89 years.
pub const COMMIT_MAX: u64 = 1 << 48;
/// Write sequences at or past this (2^63) were never handed out: counting on from one
/// would overflow, so an entry holding one is damaged.
pub const SEQ_MAX: u64 = 1 << 63;
/// The most slots a log has: they are numbered in 32 bits, and `u32::MAX` marks none. At
/// the default 4 KiB blocks that is 16 TiB of log; a larger fast device keeps the rest unused.
pub const SLOTS_MAX: u64 = u32::MAX as u64;

/// What the superblock records. It is written by `create`, and again only when a tunable is
/// set live (`settings`, alone in the last 512-byte sector, so a torn rewrite leaves every
/// other field as it was); everything else that changes lives in the entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub block_bytes: u32,
    pub slots: u64,
    /// The origin's size when the cache was created; opening over another size is refused.
    pub origin_bytes: u64,
    /// How to open the origin (a device spec, opaque here), for `writecache:PATH` alone.
    pub origin_spec: String,
    /// What identifies the origin device (opaque here; empty: not checked).
    pub origin_id: String,
    /// The tunables last set live (opaque here; empty: the defaults). Checked by a checksum
    /// of its own: a torn or corrupt one reads as empty.
    pub settings: String,
}

/// Longest `origin_spec` plus `origin_id` the superblock holds.
pub const ORIGIN_TEXT_BYTES_MAX: usize = 3072;
/// Where `settings` lives: the superblock's last sector (length, checksum, then the text).
const SETTINGS_AT: usize = SUPERBLOCK_BYTES as usize - 512;
/// Longest `settings` the superblock holds.
pub const SETTINGS_BYTES_MAX: usize = 512 - 8;

impl Superblock {
    /// The layout for a fast device of `cache_bytes` with blocks of `block_bytes`.
    pub fn plan(cache_bytes: u64, block_bytes: u32, origin_bytes: u64) -> Result<Superblock> {
        if !block_bytes.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes) {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("writecache: block size {block_bytes} is not a power of two from {BLOCK_BYTES_MIN} to {BLOCK_BYTES_MAX}"),
            ));
        }
        let b = block_bytes as u64;
        // Largest n with layout(n) inside the device.
        let mut n =
            (cache_bytes.saturating_sub(SUPERBLOCK_BYTES + ENTRY_PAGE_BYTES) / (b + ENTRY_BYTES)).min(SLOTS_MAX);
        let mut sb = Superblock {
            block_bytes,
            slots: n,
            origin_bytes,
            origin_spec: String::new(),
            origin_id: String::new(),
            settings: String::new(),
        };
        // The estimate counts a whole entry page beyond the entries: more may fit.
        while n < SLOTS_MAX && (Superblock { slots: n + 1, ..sb.clone() }).end() <= cache_bytes {
            n += 1;
            sb.slots = n;
        }
        while n > 0 && sb.end() > cache_bytes {
            n -= 1;
            sb.slots = n;
        }
        if n < 2 {
            let least = Superblock { slots: 2, ..sb }.end();
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "writecache: a fast device of {cache_bytes} bytes holds fewer than 2 blocks of {block_bytes} \
                     beside its superblock and entries (it needs at least {least} bytes)"
                ),
            ));
        }
        Ok(sb)
    }

    pub fn entries_offset(&self) -> u64 {
        SUPERBLOCK_BYTES
    }

    pub fn entry_pages(&self) -> u64 {
        self.slots.div_ceil(ENTRIES_PER_PAGE)
    }

    pub fn data_offset(&self) -> u64 {
        (SUPERBLOCK_BYTES + self.entry_pages() * ENTRY_PAGE_BYTES).next_multiple_of(self.block_bytes as u64)
    }

    pub fn slot_offset(&self, slot: u64) -> u64 {
        self.data_offset() + slot * self.block_bytes as u64
    }

    /// First byte past the last slot.
    pub fn end(&self) -> u64 {
        self.slot_offset(self.slots)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_BYTES as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_bytes.to_le_bytes());
        b[16..24].copy_from_slice(&self.slots.to_le_bytes());
        b[24..32].copy_from_slice(&self.origin_bytes.to_le_bytes());
        let (spec, id) = (self.origin_spec.as_bytes(), self.origin_id.as_bytes());
        assert!(spec.len() + id.len() <= ORIGIN_TEXT_BYTES_MAX, "origin text checked by the caller");
        b[36..38].copy_from_slice(&(spec.len() as u16).to_le_bytes());
        b[38..40].copy_from_slice(&(id.len() as u16).to_le_bytes());
        b[64..64 + spec.len()].copy_from_slice(spec);
        b[64 + spec.len()..64 + spec.len() + id.len()].copy_from_slice(id);
        let crc = crc32c::crc32c(&b[..64 + ORIGIN_TEXT_BYTES_MAX]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        let settings = self.settings.as_bytes();
        assert!(settings.len() <= SETTINGS_BYTES_MAX, "settings checked by the caller");
        if !settings.is_empty() {
            let s = &mut b[SETTINGS_AT..];
            s[0..2].copy_from_slice(&(settings.len() as u16).to_le_bytes());
            s[4..8].copy_from_slice(&crc32c::crc32c(settings).to_le_bytes());
            s[8..8 + settings.len()].copy_from_slice(settings);
        }
        b
    }

    /// The settings text of a superblock's last sector; empty when none was written or it
    /// fails its checksum.
    fn decode_settings(b: &[u8]) -> String {
        let s = &b[SETTINGS_AT..SUPERBLOCK_BYTES as usize];
        let len = u16::from_le_bytes([s[0], s[1]]) as usize;
        if len == 0 || len > SETTINGS_BYTES_MAX {
            return String::new();
        }
        let text = &s[8..8 + len];
        if crc32c::crc32c(text).to_le_bytes() != s[4..8] {
            return String::new();
        }
        String::from_utf8(text.to_vec()).unwrap_or_default()
    }

    /// The checksummed bytes with the checksum field zeroed.
    fn checksum_of(b: &[u8]) -> u32 {
        let mut c = b[..64 + ORIGIN_TEXT_BYTES_MAX].to_vec();
        c[32..36].fill(0);
        crc32c::crc32c(&c)
    }

    /// Decodes and checks a superblock read from a device of `cache_bytes`.
    pub fn decode(b: &[u8], cache_bytes: u64) -> Result<Superblock> {
        let bad = |what: String| Error::new(ErrorKind::Invalid, format!("writecache superblock: {what}"));
        if b.len() < SUPERBLOCK_BYTES as usize || b[0..8] != MAGIC {
            return Err(bad("no writecache superblock (foreign or empty device)".into()));
        }
        let crc = u32::from_le_bytes(b[32..36].try_into().expect("4 bytes"));
        if crc != Superblock::checksum_of(b) {
            return Err(Error::new(ErrorKind::Corrupt, "writecache superblock: checksum mismatch (corrupt)"));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(bad(format!("version {version}, this build reads {VERSION}")));
        }
        let sb = Superblock {
            block_bytes: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
            slots: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            origin_bytes: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
            origin_spec: String::new(),
            origin_id: String::new(),
            settings: Superblock::decode_settings(b),
        };
        let spec_len = u16::from_le_bytes(b[36..38].try_into().expect("2 bytes")) as usize;
        let id_len = u16::from_le_bytes(b[38..40].try_into().expect("2 bytes")) as usize;
        if spec_len + id_len > ORIGIN_TEXT_BYTES_MAX {
            return Err(bad(format!("origin text of {} bytes", spec_len + id_len)));
        }
        let text = |r: std::ops::Range<usize>| {
            String::from_utf8(b[r].to_vec()).map_err(|_| bad("origin text is not UTF-8".into()))
        };
        let mut sb = sb;
        sb.origin_spec = text(64..64 + spec_len)?;
        sb.origin_id = text(64 + spec_len..64 + spec_len + id_len)?;
        if !sb.block_bytes.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&sb.block_bytes) {
            return Err(bad(format!("block size {} out of range", sb.block_bytes)));
        }
        if sb.slots > SLOTS_MAX {
            return Err(bad(format!("{} slots, more than the {SLOTS_MAX} a write log numbers", sb.slots)));
        }
        if sb.slots == 0 || sb.slots > cache_bytes / sb.block_bytes as u64 || sb.end() > cache_bytes {
            return Err(bad(format!("{} slots do not fit a device of {cache_bytes} bytes", sb.slots)));
        }
        Ok(sb)
    }
}

/// An entry that fails its checksum (torn by a crash, or corrupt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornEntry;

/// One slot's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    pub block: u64,
    /// Write order; never zero in a valid entry.
    pub seq: u64,
    /// The commit that wrote the entry (below [`COMMIT_MAX`]).
    pub commit: u64,
    /// [`FLAG_ZERO`], or none (16 bits).
    pub flags: u32,
    pub data_crc: u32,
}

impl Entry {
    pub fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.block.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        debug_assert!(self.commit < COMMIT_MAX && self.flags >> COMMIT_HIGH_SHIFT == 0);
        out[16..20].copy_from_slice(&(self.commit as u32).to_le_bytes());
        let flags = self.flags | ((self.commit >> 32) as u32) << COMMIT_HIGH_SHIFT;
        out[20..24].copy_from_slice(&flags.to_le_bytes());
        out[24..28].copy_from_slice(&self.data_crc.to_le_bytes());
        let crc = crc32c::crc32c(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
    }

    /// The free entry (all zeroes).
    pub fn encode_free(out: &mut [u8]) {
        out[..ENTRY_BYTES as usize].fill(0);
    }

    /// `None` for a free slot; `Err` for an entry whose checksum fails (a torn or corrupt
    /// entry, which recovery treats as free and clears).
    pub fn decode(b: &[u8]) -> std::result::Result<Option<Entry>, TornEntry> {
        if b[..ENTRY_BYTES as usize].iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let crc = u32::from_le_bytes(b[28..32].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&b[0..28]) {
            return Err(TornEntry);
        }
        let flags = u32::from_le_bytes(b[20..24].try_into().expect("4 bytes"));
        let commit_low = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
        let e = Entry {
            block: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            seq: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            commit: ((flags >> COMMIT_HIGH_SHIFT) as u64) << 32 | commit_low as u64,
            flags: flags & ((1 << COMMIT_HIGH_SHIFT) - 1),
            data_crc: u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")),
        };
        if e.seq == 0 || e.seq >= SEQ_MAX {
            return Err(TornEntry);
        }
        Ok(Some(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fits_and_aligns() {
        for bs in [512u32, 4096, 65536] {
            for cache in [64u64 << 10, 1 << 20, 3 << 20, (1 << 20) + 12345] {
                let Ok(sb) = Superblock::plan(cache, bs, 1 << 30) else { continue };
                assert!(sb.end() <= cache, "{bs} {cache}");
                assert_eq!(sb.data_offset() % bs as u64, 0);
                assert!(sb.entries_offset() + sb.slots * ENTRY_BYTES <= sb.data_offset());
                let again = Superblock::decode(&sb.encode(), cache).unwrap();
                assert_eq!(again, sb);
            }
        }
        assert!(Superblock::plan(1 << 20, 3000, 1 << 30).is_err());
        assert!(Superblock::plan(8192, 4096, 1 << 30).is_err());
    }

    #[test]
    fn slots_stay_within_32_bit_numbers_on_a_device_that_would_hold_more() {
        for (bs, cache) in [(BLOCK_BYTES_MIN, 4u64 << 40), (4096, 20 << 40), (4096, u64::MAX)] {
            let sb = Superblock::plan(cache, bs, 1 << 30).unwrap();
            assert_eq!(sb.slots, SLOTS_MAX, "{bs}-byte blocks on {cache} bytes");
            assert!(sb.end() <= cache);
            assert_eq!(Superblock::decode(&sb.encode(), cache).unwrap(), sb);
            // A superblock sealed with one slot more is refused, though the device holds it.
            let more = Superblock { slots: SLOTS_MAX + 1, ..sb };
            assert!(more.end() <= cache);
            let e = Superblock::decode(&more.encode(), cache).unwrap_err();
            assert!(e.context.contains("more than the"), "{}", e.context);
        }
    }

    #[test]
    fn a_device_too_small_is_told_the_least_size_that_holds_two_blocks() {
        for bs in [BLOCK_BYTES_MIN, 4096, 65536, BLOCK_BYTES_MAX] {
            let e = Superblock::plan(2 * bs as u64, bs, 1 << 30).unwrap_err();
            let least: u64 = e.context.rsplit("at least ").next().unwrap().split(' ').next().unwrap().parse().unwrap();
            assert_eq!(Superblock::plan(least, bs, 1 << 30).unwrap().slots, 2, "{}", e.context);
            assert!(Superblock::plan(least - 1, bs, 1 << 30).is_err());
        }
    }

    #[test]
    fn settings_round_trip_and_a_torn_copy_reads_as_none_without_touching_the_rest() {
        let mut sb = Superblock::plan(1 << 20, 4096, 1 << 30).unwrap();
        sb.origin_spec = "/var/tmp/o.img".into();
        assert_eq!(Superblock::decode(&sb.encode(), 1 << 20).unwrap().settings, "", "none written");
        sb.settings = r#"{"low_watermark":10}"#.into();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b, 1 << 20).unwrap(), sb);
        // Only the last sector differs from a superblock without settings.
        let plain = Superblock { settings: String::new(), ..sb.clone() }.encode();
        assert!(b[..SETTINGS_AT] == plain[..SETTINGS_AT]);
        let mut torn = b.clone();
        torn[SETTINGS_AT + 9] ^= 1;
        let again = Superblock::decode(&torn, 1 << 20).unwrap();
        assert_eq!((again.settings.as_str(), again.origin_spec.as_str()), ("", "/var/tmp/o.img"));
    }

    #[test]
    fn entries_round_trip_and_torn_ones_are_caught() {
        let e = Entry { block: 7, seq: 9, commit: 3, flags: 0, data_crc: 0xdead };
        let mut b = [0u8; 32];
        e.encode(&mut b);
        assert_eq!(Entry::decode(&b), Ok(Some(e)));
        b[3] ^= 1;
        assert_eq!(Entry::decode(&b), Err(TornEntry));
        assert_eq!(Entry::decode(&[0u8; 32]), Ok(None));
        // A commit past 2^32 keeps its high bits in the flags word's top half; an entry
        // written with those bits zero (every log before) reads as it always did.
        let e = Entry { block: 7, seq: 9, commit: (1 << 40) + 3, flags: FLAG_ZERO, data_crc: 0 };
        e.encode(&mut b);
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), 3);
        assert_eq!(Entry::decode(&b), Ok(Some(e)));
        // A sequence no log hands out (counting on from it would overflow) is damage.
        Entry { seq: SEQ_MAX, ..e }.encode(&mut b);
        assert_eq!(Entry::decode(&b), Err(TornEntry));
    }

    #[test]
    fn corrupt_superblock_is_refused() {
        let mut sb = Superblock::plan(1 << 20, 4096, 1 << 30).unwrap();
        sb.origin_spec = "hdd:/var/tmp/o.img?rpm=5400".into();
        sb.origin_id = "dev 8:1 ino 12".into();
        assert_eq!(Superblock::decode(&sb.encode(), 1 << 20).unwrap(), sb);
        let mut b = sb.encode();
        b[70] ^= 1;
        assert_eq!(Superblock::decode(&b, 1 << 20).unwrap_err().kind, ErrorKind::Corrupt, "origin text is checked");
        b[70] ^= 1;
        b[20] ^= 1;
        assert_eq!(Superblock::decode(&b, 1 << 20).unwrap_err().kind, ErrorKind::Corrupt);
        assert!(Superblock::decode(&[0u8; 4096], 1 << 20).is_err());
    }
}
