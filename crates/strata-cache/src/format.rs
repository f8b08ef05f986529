//! The on-disk format of a cache device. Everything here is bytes and arithmetic: no IO.
//!
//! ```text
//!  0      4 KiB   8 KiB                                  hints_offset      data_offset
//!  | sb 0 | sb 1 | table page 0 copy 0, copy 1, page 1 ... | policy hints ... | slot 0 | slot 1 ...
//! ```
//!
//! - Two superblock copies, each checksummed and sequence-numbered; the valid one with the
//!   highest sequence wins, so a torn superblock write loses nothing.
//! - The mapping table: one 16-byte entry per cache slot (origin block, valid and dirty bits,
//!   a generation), 254 entries per 4 KiB page. Every page has two copies written in turn,
//!   each with its commit sequence and checksum; recovery takes the newest valid copy of each
//!   page. Pages are independent: a slot's entry is the whole truth about that slot, and the
//!   generation settles the one case two slots claim an origin block (a crash between the
//!   page that freed a block and the page that mapped it elsewhere).
//! - Policy hints, written at clean shutdown so a restart is warm.
//! - The data slots, each one cache block, from `data_offset` (1 MiB aligned).

pub const PAGE: usize = 4096;
/// Superblock copies, one page each, at the start of the device; written in turn.
pub const SB_COPIES: usize = 2;
/// Copies of each table page, side by side; written in turn.
pub const PAGE_COPIES: usize = 2;
pub const SB_MAGIC: &[u8; 8] = &strata_io::signature::CACHE_MAGIC;
pub const SB_VERSION: u32 = 1;
pub const PAGE_MAGIC: u32 = 0x5354_5047; // "STPG"
pub const ENTRIES_PER_PAGE: usize = (PAGE - PAGE_HEADER) / ENTRY;
const PAGE_HEADER: usize = 32;
const ENTRY: usize = 16;
const ORIGIN_MASK: u64 = (1 << 48) - 1;
/// Superblock and commit sequences and entry generations count up by one per write or
/// change from 0: one at or past this bound was never written by a cache (it would take
/// centuries), and counting on from it would overflow. Metadata holding one is damaged.
pub const MAX_SEQUENCE: u64 = 1 << 63;
/// A cache opens only while those counters are below this (2^62). No cache counts 2^62
/// times (146 years at a billion a second), so one that opened never writes a value at or
/// past [`MAX_SEQUENCE`], which its own reading would refuse: metadata whose counters have
/// got this far was crafted or damaged, and is an error.
pub const OPEN_SEQUENCE_LIMIT: u64 = 1 << 62;
const FLAG_VALID: u64 = 1 << 48;
const FLAG_DIRTY: u64 = 1 << 49;
pub const MAX_ORIGIN_SPEC: usize = 2048;
pub const MAX_ORIGIN_ID: usize = 256;
pub const MIN_BLOCK_BYTES: u32 = 32 << 10;
pub const MAX_BLOCK_BYTES: u32 = 1 << 30;
/// The superblock's variable fields: the policy name (NUL-padded), then the origin spec and
/// the origin identity, each after its length (u16).
const SB_POLICY_AT: usize = 144;
const SB_POLICY_MAX: usize = 16;
const SB_ORIGIN_SPEC_AT: usize = 160;
const SB_ORIGIN_ID_AT: usize = 2302;

// What the layout takes for granted, checked when compiling.
const _: () = assert!(ENTRIES_PER_PAGE == 254, "table page geometry is part of the on-disk format");
const _: () = assert!(ORIGIN_MASK & (FLAG_VALID | FLAG_DIRTY) == 0, "entry flags lie above the origin block");
const _: () = assert!(SB_COPIES == 2 && PAGE_COPIES == 2, "copies alternate: recovery compares two");
const _: () = assert!(SB_POLICY_AT + SB_POLICY_MAX <= SB_ORIGIN_SPEC_AT);
const _: () = assert!(SB_ORIGIN_SPEC_AT + 2 + MAX_ORIGIN_SPEC <= SB_ORIGIN_ID_AT);
const _: () = assert!(SB_ORIGIN_ID_AT + 2 + MAX_ORIGIN_ID <= PAGE, "the superblock fits its page (so u16 lengths do)");
const _: () = assert!(MIN_BLOCK_BYTES.is_power_of_two() && MAX_BLOCK_BYTES.is_power_of_two());
const _: () = assert!(MIN_BLOCK_BYTES <= MAX_BLOCK_BYTES);
const _: () = assert!((MIN_BLOCK_BYTES as usize).is_multiple_of(PAGE), "slots start on page boundaries");

/// Cache modes, as stored and as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Writeback,
    Writethrough,
    Writearound,
    Passthrough,
    /// Writes back everything dirty and promotes nothing (before detaching the cache).
    Cleaner,
}

impl Mode {
    pub const NAMES: &'static [&'static str] = &["writeback", "writethrough", "writearound", "passthrough", "cleaner"];

    pub fn name(self) -> &'static str {
        Mode::NAMES[self as usize]
    }

    fn from_u8(v: u8) -> Option<Mode> {
        [Mode::Writeback, Mode::Writethrough, Mode::Writearound, Mode::Passthrough, Mode::Cleaner]
            .get(v as usize)
            .copied()
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        Mode::NAMES
            .iter()
            .position(|n| *n == s)
            .and_then(|i| Mode::from_u8(i as u8))
            .ok_or_else(|| format!("unknown cache mode {s:?} (expected one of {})", Mode::NAMES.join(", ")))
    }
}

/// Everything the superblock records.
#[derive(Debug, Clone, PartialEq)]
pub struct Superblock {
    pub seq: u64,
    pub uuid: [u8; 16],
    pub block_bytes: u32,
    pub mode: Mode,
    pub clean_shutdown: bool,
    pub slots: u64,
    pub origin_bytes: u64,
    pub data_offset: u64,
    pub table_offset: u64,
    pub table_pages: u64,
    pub hints_offset: u64,
    pub hints_capacity: u64,
    pub hints_len: u64,
    pub hints_crc: u32,
    pub sequential_cutoff_bytes: u64,
    pub migration_budget_bytes_per_s: u64,
    pub writeback_percent: u32,
    /// Read misses are rounded out to this many bytes while the cache has unused blocks
    /// (0: off; caches made before the field existed read 0).
    pub readahead_bytes: u32,
    pub policy: String,
    pub origin_spec: String,
    /// Identity of the origin when formatted (device and inode of a file), to refuse a
    /// different origin at the same path.
    pub origin_id: String,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FormatError {
    #[error("no strata cache superblock (magic {0:02x?})")]
    NotStrata([u8; 8]),
    #[error("superblock checksum mismatch")]
    Checksum,
    #[error("unsupported format version {0}")]
    Version(u32),
    #[error("superblock field {0} is invalid")]
    Field(&'static str),
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Puts at most `max` bytes of `v` at `at`, after their length.
fn put_sized(b: &mut [u8], at: usize, v: &[u8], max: usize) {
    let v = &v[..v.len().min(max)];
    b[at..at + 2].copy_from_slice(&(v.len() as u16).to_le_bytes());
    b[at + 2..at + 2 + v.len()].copy_from_slice(v);
}

/// What `put_sized` put at `at`, as text; `None` if its length is over `max`.
fn get_sized(b: &[u8], at: usize, max: usize) -> Option<String> {
    let len = u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize;
    (len <= max).then(|| String::from_utf8_lossy(&b[at + 2..at + 2 + len]).into_owned())
}

/// crc32c of a page with its checksum field (4 bytes at `at`) taken as zero.
fn page_crc(b: &[u8], at: usize) -> u32 {
    let mut c = crc32c::crc32c(&b[..at]);
    c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &b[at + 4..])
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        b[0..8].copy_from_slice(SB_MAGIC);
        put_u32(&mut b, 8, SB_VERSION);
        put_u64(&mut b, 16, self.seq);
        b[24..40].copy_from_slice(&self.uuid);
        put_u32(&mut b, 40, self.block_bytes);
        b[44] = self.mode as u8;
        b[45] = self.clean_shutdown as u8;
        put_u64(&mut b, 48, self.slots);
        put_u64(&mut b, 56, self.origin_bytes);
        put_u64(&mut b, 64, self.data_offset);
        put_u64(&mut b, 72, self.table_offset);
        put_u64(&mut b, 80, self.table_pages);
        put_u64(&mut b, 88, self.hints_offset);
        put_u64(&mut b, 96, self.hints_capacity);
        put_u64(&mut b, 104, self.hints_len);
        put_u32(&mut b, 112, self.hints_crc);
        put_u64(&mut b, 120, self.sequential_cutoff_bytes);
        put_u64(&mut b, 128, self.migration_budget_bytes_per_s);
        put_u32(&mut b, 136, self.writeback_percent);
        put_u32(&mut b, 140, self.readahead_bytes);
        let p = self.policy.as_bytes();
        let n = p.len().min(SB_POLICY_MAX);
        b[SB_POLICY_AT..SB_POLICY_AT + n].copy_from_slice(&p[..n]);
        put_sized(&mut b, SB_ORIGIN_SPEC_AT, self.origin_spec.as_bytes(), MAX_ORIGIN_SPEC);
        put_sized(&mut b, SB_ORIGIN_ID_AT, self.origin_id.as_bytes(), MAX_ORIGIN_ID);
        let crc = page_crc(&b, 12);
        put_u32(&mut b, 12, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        let magic: [u8; 8] = b[0..8].try_into().unwrap();
        if &magic != SB_MAGIC {
            return Err(FormatError::NotStrata(magic));
        }
        if page_crc(b, 12) != get_u32(b, 12) {
            return Err(FormatError::Checksum);
        }
        let version = get_u32(b, 8);
        if version != SB_VERSION {
            return Err(FormatError::Version(version));
        }
        let cstr = |bytes: &[u8]| String::from_utf8_lossy(bytes.split(|&c| c == 0).next().unwrap_or(&[])).into_owned();
        let origin_spec = get_sized(b, SB_ORIGIN_SPEC_AT, MAX_ORIGIN_SPEC).ok_or(FormatError::Field("origin_spec"))?;
        let origin_id = get_sized(b, SB_ORIGIN_ID_AT, MAX_ORIGIN_ID).ok_or(FormatError::Field("origin_id"))?;
        let sb = Superblock {
            seq: get_u64(b, 16),
            uuid: b[24..40].try_into().unwrap(),
            block_bytes: get_u32(b, 40),
            mode: Mode::from_u8(b[44]).ok_or(FormatError::Field("mode"))?,
            clean_shutdown: b[45] != 0,
            slots: get_u64(b, 48),
            origin_bytes: get_u64(b, 56),
            data_offset: get_u64(b, 64),
            table_offset: get_u64(b, 72),
            table_pages: get_u64(b, 80),
            hints_offset: get_u64(b, 88),
            hints_capacity: get_u64(b, 96),
            hints_len: get_u64(b, 104),
            hints_crc: get_u32(b, 112),
            sequential_cutoff_bytes: get_u64(b, 120),
            migration_budget_bytes_per_s: get_u64(b, 128),
            writeback_percent: get_u32(b, 136),
            readahead_bytes: get_u32(b, 140),
            policy: cstr(&b[SB_POLICY_AT..SB_POLICY_AT + SB_POLICY_MAX]),
            origin_spec,
            origin_id,
        };
        sb.validate()?;
        Ok(sb)
    }

    fn validate(&self) -> Result<(), FormatError> {
        if self.seq >= MAX_SEQUENCE {
            return Err(FormatError::Field("seq"));
        }
        let bs = self.block_bytes;
        if !bs.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&bs) {
            return Err(FormatError::Field("block_size"));
        }
        let layout = Layout::checked(self.slots, bs).ok_or(FormatError::Field("slots"))?;
        if self.table_offset != layout.table_offset
            || self.table_pages != layout.table_pages
            || self.hints_offset != layout.hints_offset
            || self.hints_capacity != layout.hints_capacity
            || self.data_offset != layout.data_offset
        {
            return Err(FormatError::Field("layout"));
        }
        if self.hints_len > self.hints_capacity {
            return Err(FormatError::Field("hints_len"));
        }
        if self.origin_bytes == 0 {
            return Err(FormatError::Field("origin_size"));
        }
        // The settings' own limits (`cache create` and `cache set` keep to them).
        if self.writeback_percent > crate::options::MAX_WRITEBACK_PERCENT {
            return Err(FormatError::Field("writeback_percent"));
        }
        if self.readahead_bytes as u64 > crate::options::MAX_READAHEAD_BYTES {
            return Err(FormatError::Field("readahead"));
        }
        Ok(())
    }

    pub fn origin_blocks(&self) -> u64 {
        self.origin_bytes.div_ceil(self.block_bytes as u64)
    }

    /// Where this superblock goes: the copy its sequence picks, never the one holding the
    /// previous sequence, so a torn write leaves that one intact.
    pub fn offset(&self) -> u64 {
        (self.seq % SB_COPIES as u64) * PAGE as u64
    }
}

/// `bytes` rounded up to whole pages (the hints are written and read in pages).
pub fn page_round_up(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE as u64) * PAGE as u64
}

/// The most slots a cache has: they are numbered in 32 bits. At the smallest block, 32 KiB,
/// that is 128 TiB of cache; a larger device keeps the rest unused.
pub const SLOTS_MAX: u64 = u32::MAX as u64;

/// Where everything lives for a cache of `slots` blocks of `block_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub table_offset: u64,
    pub table_pages: u64,
    pub hints_offset: u64,
    pub hints_capacity: u64,
    pub data_offset: u64,
    pub end: u64,
}

impl Layout {
    pub fn new(slots: u64, block_bytes: u32) -> Layout {
        Layout::checked(slots, block_bytes).expect("a cache's layout ends within 2^64 bytes")
    }

    /// The layout, unless it would end past 2^64 bytes or has more than [`SLOTS_MAX`] slots
    /// (a superblock's `slots` is checked with this before anything is sized by it).
    pub fn checked(slots: u64, block_bytes: u32) -> Option<Layout> {
        if slots > SLOTS_MAX {
            return None;
        }
        let table_offset = (SB_COPIES * PAGE) as u64;
        let table_pages = slots.div_ceil(ENTRIES_PER_PAGE as u64).max(1);
        let hints_offset = table_offset.checked_add(table_pages.checked_mul((PAGE_COPIES * PAGE) as u64)?)?;
        // Hints cost a few bytes per cached block in every policy; 32 is generous.
        let hints = slots.checked_mul(32)?.checked_add(64 * 1024)?;
        let hints_capacity = hints.div_ceil(PAGE as u64).checked_mul(PAGE as u64)?;
        let data_offset = hints_offset.checked_add(hints_capacity)?.div_ceil(1 << 20).checked_mul(1 << 20)?;
        let end = data_offset.checked_add(slots.checked_mul(block_bytes as u64)?)?;
        Some(Layout { table_offset, table_pages, hints_offset, hints_capacity, data_offset, end })
    }

    /// The most slots that fit a device of `device_bytes`.
    pub fn fit(device_bytes: u64, block_bytes: u32) -> u64 {
        // `end` grows with the slots: bisect between a count that fits (or none) and one
        // whose data alone does not.
        let (mut fits, mut too_many) = (0, (device_bytes / block_bytes as u64 + 1).min(SLOTS_MAX + 1));
        while too_many - fits > 1 {
            let mid = fits + (too_many - fits) / 2;
            if Layout::new(mid, block_bytes).end <= device_bytes {
                fits = mid;
            } else {
                too_many = mid;
            }
        }
        fits
    }

    /// Offset of copy `copy` (0 or 1) of table page `page`.
    pub fn page_offset(&self, page: u64, copy: u8) -> u64 {
        self.table_offset + (page * PAGE_COPIES as u64 + copy as u64) * PAGE as u64
    }

    /// Bytes of the whole table, both copies of every page.
    pub fn table_bytes(&self) -> u64 {
        self.hints_offset - self.table_offset
    }
}

/// One slot's entry in the mapping table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    pub origin_block: u64,
    pub valid: bool,
    pub dirty: bool,
    /// Increases with every change of any mapping; settles duplicate claims after a crash.
    pub generation: u64,
}

/// Encodes table page `index` holding `entries` (at most `ENTRIES_PER_PAGE`), written by
/// commit `seq`.
pub fn encode_page(index: u64, seq: u64, entries: &[Entry]) -> Vec<u8> {
    debug_assert!(entries.len() <= ENTRIES_PER_PAGE);
    let mut b = vec![0u8; PAGE];
    put_u32(&mut b, 0, PAGE_MAGIC);
    put_u32(&mut b, 8, index as u32);
    put_u64(&mut b, 16, seq);
    for (i, e) in entries.iter().enumerate() {
        let at = PAGE_HEADER + i * ENTRY;
        let mut w0 = e.origin_block & ORIGIN_MASK;
        if e.valid {
            w0 |= FLAG_VALID;
        }
        if e.dirty {
            w0 |= FLAG_DIRTY;
        }
        put_u64(&mut b, at, w0);
        put_u64(&mut b, at + 8, e.generation);
    }
    let crc = page_crc(&b, 4);
    put_u32(&mut b, 4, crc);
    b
}

/// Why a table page copy was not usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageProblem {
    NeverWritten,
    BadMagic,
    Checksum,
    WrongIndex(u32),
    UnknownFlags,
    /// A commit sequence or generation at or past [`MAX_SEQUENCE`].
    Sequence,
}

/// Decodes a table page copy: its commit sequence and entries.
pub fn decode_page(index: u64, b: &[u8]) -> Result<(u64, Vec<Entry>), PageProblem> {
    if b.iter().all(|&x| x == 0) {
        return Err(PageProblem::NeverWritten);
    }
    if get_u32(b, 0) != PAGE_MAGIC {
        return Err(PageProblem::BadMagic);
    }
    if page_crc(b, 4) != get_u32(b, 4) {
        return Err(PageProblem::Checksum);
    }
    if get_u32(b, 8) as u64 != index {
        return Err(PageProblem::WrongIndex(get_u32(b, 8)));
    }
    let seq = get_u64(b, 16);
    if seq >= MAX_SEQUENCE {
        return Err(PageProblem::Sequence);
    }
    let mut entries = Vec::with_capacity(ENTRIES_PER_PAGE);
    for i in 0..ENTRIES_PER_PAGE {
        let at = PAGE_HEADER + i * ENTRY;
        let w0 = get_u64(b, at);
        if w0 & !(ORIGIN_MASK | FLAG_VALID | FLAG_DIRTY) != 0 {
            return Err(PageProblem::UnknownFlags);
        }
        let generation = get_u64(b, at + 8);
        if generation >= MAX_SEQUENCE {
            return Err(PageProblem::Sequence);
        }
        entries.push(Entry {
            origin_block: w0 & ORIGIN_MASK,
            valid: w0 & FLAG_VALID != 0,
            dirty: w0 & FLAG_DIRTY != 0,
            generation,
        });
    }
    Ok((seq, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        let l = Layout::new(1000, 64 << 10);
        Superblock {
            seq: 7,
            uuid: [3; 16],
            block_bytes: 64 << 10,
            mode: Mode::Writeback,
            clean_shutdown: true,
            slots: 1000,
            origin_bytes: 1 << 30,
            data_offset: l.data_offset,
            table_offset: l.table_offset,
            table_pages: l.table_pages,
            hints_offset: l.hints_offset,
            hints_capacity: l.hints_capacity,
            hints_len: 10,
            hints_crc: 99,
            sequential_cutoff_bytes: 4 << 20,
            migration_budget_bytes_per_s: 32 << 20,
            writeback_percent: 10,
            readahead_bytes: 1 << 20,
            policy: "strata".into(),
            origin_spec: "hdd:/tmp/o.img".into(),
            origin_id: "2049:1234".into(),
        }
    }

    #[test]
    fn superblock_round_trips_and_detects_damage() {
        let s = sb();
        let mut b = s.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), s);
        b[200] ^= 1;
        assert_eq!(Superblock::decode(&b), Err(FormatError::Checksum));
        let mut b = s.encode();
        b[0] = b'X';
        assert!(matches!(Superblock::decode(&b), Err(FormatError::NotStrata(_))));
    }

    #[test]
    fn pages_round_trip_and_detect_damage() {
        let entries: Vec<Entry> = (0..ENTRIES_PER_PAGE as u64)
            .map(|i| Entry { origin_block: i * 3, valid: i % 2 == 0, dirty: i % 3 == 0, generation: i })
            .collect();
        let b = encode_page(5, 42, &entries);
        assert_eq!(decode_page(5, &b).unwrap(), (42, entries));
        assert_eq!(decode_page(6, &b), Err(PageProblem::WrongIndex(5)));
        let mut t = b.clone();
        t[1000] ^= 0x10;
        assert_eq!(decode_page(5, &t), Err(PageProblem::Checksum));
        assert_eq!(decode_page(5, &vec![0; PAGE]), Err(PageProblem::NeverWritten));
    }

    #[test]
    fn layout_fits_the_device() {
        for (dev, block) in
            [(8u64 << 20, 64 << 10), (100 << 20, 64 << 10), (1 << 30, 64 << 10), ((1 << 30) + 12345, 64 << 10)]
                .into_iter()
                .chain([(Layout::new(16 << 20, 4096).end, 4096), (Layout::new(1 << 20, 4096).end + 4095, 4096)])
        {
            let slots = Layout::fit(dev, block);
            assert!(Layout::new(slots, block).end <= dev);
            assert!(Layout::new(slots + 1, block).end > dev, "{dev} bytes: {slots} slots of {block}");
        }
        assert_eq!(Layout::fit(Layout::new(16 << 20, 4096).end, 4096), 16 << 20, "a device sized for n slots holds n");
        assert_eq!(Layout::fit(1 << 20, 64 << 10), 0);
    }

    #[test]
    fn slots_stay_within_32_bit_numbers_on_a_device_that_would_hold_more() {
        for dev in [Layout::new(SLOTS_MAX, MIN_BLOCK_BYTES).end + (1 << 40), u64::MAX] {
            assert_eq!(Layout::fit(dev, MIN_BLOCK_BYTES), SLOTS_MAX, "{dev} bytes");
        }
        assert!(Layout::checked(SLOTS_MAX + 1, MIN_BLOCK_BYTES).is_none());
    }

    #[test]
    fn superblock_copies_and_table_pages_tile_the_metadata() {
        let offsets: Vec<u64> = (0..4).map(|seq| Superblock { seq, ..sb() }.offset()).collect();
        assert_eq!(offsets, [0, PAGE as u64, 0, PAGE as u64], "copies written in turn");
        let l = Layout::new(1000, 64 << 10);
        assert_eq!(l.table_offset, (SB_COPIES * PAGE) as u64, "the table follows the superblock copies");
        assert_eq!(l.page_offset(0, 0), l.table_offset);
        assert_eq!(l.page_offset(l.table_pages - 1, 1) + PAGE as u64, l.hints_offset, "the hints follow the last page");
        assert_eq!(l.table_bytes(), l.table_pages * (PAGE_COPIES * PAGE) as u64);
        assert_eq!(l.hints_capacity % PAGE as u64, 0);
        assert_eq!(page_round_up(1), PAGE as u64);
        assert_eq!(page_round_up(PAGE as u64), PAGE as u64);
    }
}
