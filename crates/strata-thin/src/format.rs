//! dm-thin's on-disk metadata format, as the kernel (drivers/md/dm-thin-metadata.c,
//! persistent-data/) and thin-provisioning-tools read and write it. Everything is little
//! endian in 4 KiB metadata blocks:
//!
//! - block 0, the superblock: magic 27022010, the roots of the two space maps, of the
//!   mapping tree and of the device-details tree, the data block size;
//! - B-tree nodes: a 32-byte header (checksum, flags, own block number, entry counts, value
//!   size), then `max_entries` keys, then `max_entries` values;
//! - space maps: 2-bit reference counts in bitmap blocks (16 bytes of header, 16,320 entries
//!   each), counts of 3 and more in an overflow B-tree (block → u32); the metadata space
//!   map's bitmaps are listed in one index block, the data space map's in a B-tree.
//!
//! Every block carries a crc32c of all its bytes after the checksum field, started at
//! 0xffffffff, not inverted at the end, and xored with a salt per kind of block.

/// Metadata block size in bytes (dm-thin's only one).
pub const BLOCK: usize = 4096;
/// Metadata block size in 512-byte sectors, as the superblock records it.
pub const BLOCK_SECTORS: u32 = 8;
pub const MAGIC: u64 = strata_io::signature::THIN_MAGIC;
/// The version thin_restore and current kernels write.
pub const VERSION: u32 = 2;
pub const SUPERBLOCK: u64 = 0;

pub const SUPERBLOCK_XOR: u32 = 160774;
pub const INDEX_XOR: u32 = 160478;
pub const BITMAP_XOR: u32 = 240779;
pub const BTREE_XOR: u32 = 121107;

/// The superblock's `flags`: dm-thin sets it when the pool's metadata failed, and writes
/// the pool again only once a check has cleared it (`thin_check --clear-needs-check-flag`).
pub const NEEDS_CHECK: u32 = 1;

/// Node flags.
pub const INTERNAL_NODE: u32 = 1;
pub const LEAF_NODE: u32 = 2;
pub const NODE_HEADER: usize = 32;

/// Bitmap blocks: a 16-byte header, then 2 bits per block.
pub const BITMAP_HEADER: usize = 16;
pub const ENTRIES_PER_BITMAP: u64 = ((BLOCK - BITMAP_HEADER) * 4) as u64;
/// The metadata space map's index block holds this many bitmap entries, which caps the
/// metadata device at 255 × 16,320 blocks (about 15.9 GiB).
pub const MAX_METADATA_BITMAPS: usize = 255;
pub const MAX_METADATA_BLOCKS: u64 = MAX_METADATA_BITMAPS as u64 * ENTRIES_PER_BITMAP;
/// The bytes of a metadata device of `bytes` that a pool uses (at most 15.9 GiB): a file
/// extended for the pool is grown to this and no further.
pub fn metadata_bytes_used(bytes: u64) -> u64 {
    bytes.min(MAX_METADATA_BLOCKS * BLOCK as u64)
}

/// The smallest metadata device `strata thin pool create` formats (256 KiB): room for
/// the reserve kept for commits (`Metadata::metadata_reserve`, at least 16 blocks) and
/// for a few dozen leaves of mappings beyond it.
pub const MIN_METADATA_BLOCKS: u64 = 64;
/// The data blocks a pool may have (dm-thin's 40-bit block numbers in the mapping tree).
pub const MAX_DATA_BLOCKS: u64 = 1 << 40;

/// Data block sizes dm-thin accepts: 64 KiB to 1 GiB, a multiple of 64 KiB.
pub const DATA_BLOCK_MIN: u64 = 64 << 10;
pub const DATA_BLOCK_MAX: u64 = 1 << 30;
pub const DATA_BLOCK_DEFAULT: u64 = 64 << 10;

/// Whether dm-thin takes data blocks of `bytes`.
pub fn valid_data_block(bytes: u64) -> bool {
    (DATA_BLOCK_MIN..=DATA_BLOCK_MAX).contains(&bytes) && bytes.is_multiple_of(DATA_BLOCK_MIN)
}

/// Mapping values pack a 40-bit data block and a 24-bit time.
pub const TIME_BITS: u32 = 24;
pub const MAX_TIME: u32 = (1 << TIME_BITS) - 1;

/// The checksum of `bytes` salted with `xor` (dm_bm_checksum).
pub fn checksum(bytes: &[u8], xor: u32) -> u32 {
    crc32c::crc32c(bytes) ^ 0xffff_ffff ^ xor
}

/// Writes the checksum of `block[4..]` into `block[0..4]`.
pub fn seal(block: &mut [u8], xor: u32) {
    let c = checksum(&block[4..], xor);
    block[0..4].copy_from_slice(&c.to_le_bytes());
}

/// Whether `block` carries the right checksum for its kind.
pub fn sealed(block: &[u8], xor: u32) -> bool {
    le32(block, 0) == checksum(&block[4..], xor)
}

pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Entries a node holds for values of `value_size` bytes: as many as fit, rounded down to a
/// multiple of 3 (the kernel's calc_max_entries; thin_check refuses other figures).
pub fn max_entries(value_size: usize) -> usize {
    let fit = (BLOCK - NODE_HEADER) / (8 + value_size);
    fit / 3 * 3
}

/// Packs a mapping value: data block in the high 40 bits, time in the low 24.
pub fn pack_mapping(data_block: u64, time: u32) -> u64 {
    (data_block << TIME_BITS) | (time & MAX_TIME) as u64
}

pub fn unpack_mapping(v: u64) -> (u64, u32) {
    (v >> TIME_BITS, (v & MAX_TIME as u64) as u32)
}

/// A space map's root as the superblock holds it (disk_sm_root, 32 of its 128 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmRoot {
    pub nr_blocks: u64,
    pub nr_allocated: u64,
    pub bitmap_root: u64,
    pub ref_count_root: u64,
}

impl SmRoot {
    pub fn decode(b: &[u8]) -> SmRoot {
        SmRoot {
            nr_blocks: le64(b, 0),
            nr_allocated: le64(b, 8),
            bitmap_root: le64(b, 16),
            ref_count_root: le64(b, 24),
        }
    }
    pub fn encode(&self, b: &mut [u8]) {
        put64(b, 0, self.nr_blocks);
        put64(b, 8, self.nr_allocated);
        put64(b, 16, self.bitmap_root);
        put64(b, 24, self.ref_count_root);
    }
}

/// One bitmap's entry in a space map's index (disk_index_entry, 16 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexEntry {
    pub blocknr: u64,
    pub nr_free: u32,
    pub none_free_before: u32,
}

pub const INDEX_ENTRY_BYTES: usize = 16;

impl IndexEntry {
    pub fn decode(b: &[u8]) -> IndexEntry {
        IndexEntry { blocknr: le64(b, 0), nr_free: le32(b, 8), none_free_before: le32(b, 12) }
    }
    pub fn encode(&self, b: &mut [u8]) {
        put64(b, 0, self.blocknr);
        put32(b, 8, self.nr_free);
        put32(b, 12, self.none_free_before);
    }
}

/// A thin device's details (disk_device_details, 24 bytes). dm-thin keeps no size or name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceDetails {
    pub mapped_blocks: u64,
    pub transaction_id: u64,
    pub creation_time: u32,
    pub snapshotted_time: u32,
}

pub const DETAILS_BYTES: usize = 24;

impl DeviceDetails {
    pub fn decode(b: &[u8]) -> DeviceDetails {
        DeviceDetails {
            mapped_blocks: le64(b, 0),
            transaction_id: le64(b, 8),
            creation_time: le32(b, 16),
            snapshotted_time: le32(b, 20),
        }
    }
    pub fn encode(&self) -> [u8; DETAILS_BYTES] {
        let mut b = [0u8; DETAILS_BYTES];
        put64(&mut b, 0, self.mapped_blocks);
        put64(&mut b, 8, self.transaction_id);
        put32(&mut b, 16, self.creation_time);
        put32(&mut b, 20, self.snapshotted_time);
        b
    }
}

/// The superblock (thin_disk_superblock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Superblock {
    pub flags: u32,
    pub uuid: [u8; 16],
    pub version: u32,
    pub time: u32,
    /// Opaque to dm-thin; strata counts it up per change (`Metadata::next_transaction`).
    pub transaction_id: u64,
    /// A held metadata snapshot's root (thin_dump --metadata-snap); 0 for none.
    pub held_root: u64,
    pub data_sm: SmRoot,
    pub metadata_sm: SmRoot,
    pub data_mapping_root: u64,
    pub device_details_root: u64,
    /// In 512-byte sectors.
    pub data_block_size: u32,
    pub metadata_block_size: u32,
    pub metadata_nr_blocks: u64,
    pub compat_flags: u32,
    pub compat_ro_flags: u32,
    pub incompat_flags: u32,
    /// strata's own record in the superblock's unused tail (see `Record`).
    pub record: Record,
}

/// What dm-thin does not keep and strata does: the data device's spec and each volume's
/// size, and the devices being deleted in the background (`deleting`).
///
/// It lives in the superblock's sectors 1 to 7, which dm-thin leaves unused, in two slots;
/// a pointer in sector 0's unused bytes (from byte 448) names the slot in use, its length
/// and its crc32c. The superblock's checksum covers everything, neither thin_check nor the
/// kernel reads these bytes, and the kernel's commits keep them (they rewrite only the
/// fields they know). thin_restore writes a superblock without them.
///
/// A commit that changes the record writes the superblock twice (`Superblock::writes`):
/// first the new record into the slot not in use, then sector 0 alone. The last 4 bytes
/// of each of sectors 1 to 7 are chosen so that a sector's change leaves the superblock's
/// checksum as it was: a power cut during the first write, whatever mix of old and new
/// sectors it leaves, keeps a superblock dm-thin accepts, naming the old slot, which that
/// write did not touch. The second write changes only sector 0, which a disk writes whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub data_spec: String,
    pub sizes: std::collections::BTreeMap<u32, u64>,
    pub deleting: std::collections::BTreeSet<u32>,
}

const SECTOR: usize = 512;
/// The bytes of each of sectors 1 to 7 that a slot uses (the rest keep the checksum).
const SECTOR_PAYLOAD: usize = SECTOR - 4;
/// A slot's bytes: half of sectors 1 to 7's payload.
const SLOT: usize = (BLOCK / SECTOR - 1) * SECTOR_PAYLOAD / 2;
const POINTER_AT: usize = 448;
const POINTER_TAG: &[u8; 8] = b"strata\x02\x00";
/// Before the two slots, the record sat unprotected from byte 1024 behind this tag; such
/// a superblock is still read, and its next record change writes slot 1, which starts past
/// any record of that layout short of 1,278 bytes.
const V1_AT: usize = 1024;
const V1_TAG: &[u8; 8] = b"strata\x01\x00";

/// The byte of the superblock holding byte `i` of slot `slot`.
fn slot_byte(slot: usize, i: usize) -> usize {
    let k = slot * SLOT + i;
    (1 + k / SECTOR_PAYLOAD) * SECTOR + k % SECTOR_PAYLOAD
}

/// Which slot sector 0 names, with the record's length and crc32c.
fn pointer(b: &[u8]) -> Option<(usize, usize, u32)> {
    (&b[POINTER_AT..POINTER_AT + 8] == POINTER_TAG)
        .then(|| (le32(b, POINTER_AT + 8) as usize, le32(b, POINTER_AT + 12) as usize, le32(b, POINTER_AT + 16)))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn take_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

impl Record {
    /// Whether the record fits in a slot.
    pub fn fits(&self) -> bool {
        self.bytes().len() <= SLOT
    }

    /// Whether a slot still holds this record and another volume's size, at its largest
    /// (an id of up to 5 varint bytes, a size of up to 10).
    pub fn fits_one_more(&self) -> bool {
        self.bytes().len() + 15 <= SLOT
    }

    /// A slot's content: the spec's length and bytes, then the sizes and the devices being
    /// deleted, each a count followed by its entries, all as LEB128 varints. An empty
    /// record is no bytes.
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.data_spec.is_empty() && self.sizes.is_empty() && self.deleting.is_empty() {
            return out;
        }
        put_varint(&mut out, self.data_spec.len() as u64);
        out.extend_from_slice(self.data_spec.as_bytes());
        put_varint(&mut out, self.sizes.len() as u64);
        for (&id, &bytes) in &self.sizes {
            put_varint(&mut out, id as u64);
            put_varint(&mut out, bytes);
        }
        put_varint(&mut out, self.deleting.len() as u64);
        for &id in &self.deleting {
            put_varint(&mut out, id as u64);
        }
        out
    }

    fn from_bytes(b: &[u8]) -> Option<Record> {
        let mut r = Record::default();
        if b.is_empty() {
            return Some(r);
        }
        let at = &mut 0;
        let len = usize::try_from(take_varint(b, at)?).ok()?;
        let end = (*at).checked_add(len)?;
        r.data_spec = String::from_utf8(b.get(*at..end)?.to_vec()).ok()?;
        *at = end;
        for _ in 0..take_varint(b, at)? {
            let id = u32::try_from(take_varint(b, at)?).ok()?;
            r.sizes.insert(id, take_varint(b, at)?);
        }
        for _ in 0..take_varint(b, at)? {
            r.deleting.insert(u32::try_from(take_varint(b, at)?).ok()?);
        }
        (*at == b.len()).then_some(r)
    }

    /// The record in a (checksummed) superblock: from the slot its pointer names, or from
    /// the earlier layout, or none.
    fn decode(b: &[u8]) -> Result<Record, String> {
        let Some((slot, len, crc)) = pointer(b) else {
            return Ok(Record::decode_v1(b));
        };
        if slot > 1 || len > SLOT {
            return Err(format!("strata's record: a pointer to slot {slot}, {len} bytes"));
        }
        let bytes: Vec<u8> = (0..len).map(|i| b[slot_byte(slot, i)]).collect();
        if crc32c::crc32c(&bytes) != crc {
            return Err(format!("strata's record: bad checksum in slot {slot}"));
        }
        Record::from_bytes(&bytes).ok_or_else(|| format!("strata's record: slot {slot} does not decode"))
    }

    fn decode_v1(b: &[u8]) -> Record {
        let mut r = Record::default();
        if &b[V1_AT..V1_AT + 8] != V1_TAG {
            return r;
        }
        let len = u16::from_le_bytes([b[V1_AT + 8], b[V1_AT + 9]]) as usize;
        let mut at = V1_AT + 10;
        if at + len + 4 > BLOCK {
            return r;
        }
        r.data_spec = String::from_utf8_lossy(&b[at..at + len]).into_owned();
        at += len;
        let n = le32(b, at) as usize;
        at += 4;
        for _ in 0..n.min((BLOCK - at) / 12) {
            r.sizes.insert(le32(b, at), le64(b, at + 4));
            at += 12;
        }
        if at + 4 <= BLOCK {
            let m = le32(b, at) as usize;
            at += 4;
            for _ in 0..m.min((BLOCK - at) / 4) {
                r.deleting.insert(le32(b, at));
                at += 4;
            }
        }
        r
    }
}

/// Changes the last 4 bytes of sector `s` of `new` so that the sector's change from `old`
/// leaves the block's checksum as it was. The checksum is affine in the block's bits, so a
/// change keeps it iff the change alone checksums as zeroes do; any 32 consecutive bits can
/// cancel any residue (crc32c's polynomial has a constant term), found by elimination over
/// GF(2) from the residues of the 32 single bits.
fn keep_checksum(old: &[u8], new: &mut [u8], s: usize) {
    let at = s * SECTOR + SECTOR_PAYLOAD;
    new[at..at + 4].copy_from_slice(&old[at..at + 4]);
    let zeroes = checksum(&[0u8; BLOCK][4..], 0);
    let residue = |change: &[u8]| checksum(&change[4..], 0) ^ zeroes;
    let mut change = vec![0u8; BLOCK];
    for i in s * SECTOR..(s + 1) * SECTOR {
        change[i] = old[i] ^ new[i];
    }
    let mut target = residue(&change);
    // A basis of the residues: pivots[bit] = (residue, the bits of the 4 bytes making it).
    let mut pivots = [(0u32, 0u32); 32];
    for bit in 0..32 {
        let mut one = vec![0u8; BLOCK];
        put32(&mut one, at, 1 << bit);
        let (mut v, mut m) = (residue(&one), 1u32 << bit);
        for p in (0..32).rev() {
            if v >> p & 1 == 0 {
                continue;
            }
            if pivots[p].0 == 0 {
                pivots[p] = (v, m);
                break;
            }
            v ^= pivots[p].0;
            m ^= pivots[p].1;
        }
    }
    let mut fix = 0u32;
    for p in (0..32).rev() {
        if target >> p & 1 == 1 {
            target ^= pivots[p].0;
            fix ^= pivots[p].1;
        }
    }
    debug_assert_eq!(target, 0, "32 consecutive bits span every crc32c residue");
    put32(new, at, le32(old, at) ^ fix);
}

impl Superblock {
    /// Reads a superblock, refusing another kind of block or a bad checksum.
    pub fn decode(b: &[u8]) -> Result<Superblock, String> {
        if le64(b, 32) != MAGIC {
            return Err(format!("not dm-thin metadata (magic {:#x}, expected {MAGIC})", le64(b, 32)));
        }
        if !sealed(b, SUPERBLOCK_XOR) {
            return Err(format!(
                "bad superblock checksum (stored {:#010x}, computed {:#010x})",
                le32(b, 0),
                checksum(&b[4..], SUPERBLOCK_XOR)
            ));
        }
        if le64(b, 8) != SUPERBLOCK {
            return Err(format!("the superblock names itself block {}", le64(b, 8)));
        }
        let sb = Superblock {
            flags: le32(b, 4),
            uuid: b[16..32].try_into().unwrap(),
            version: le32(b, 40),
            time: le32(b, 44),
            transaction_id: le64(b, 48),
            held_root: le64(b, 56),
            data_sm: SmRoot::decode(&b[64..]),
            metadata_sm: SmRoot::decode(&b[192..]),
            data_mapping_root: le64(b, 320),
            device_details_root: le64(b, 328),
            data_block_size: le32(b, 336),
            metadata_block_size: le32(b, 340),
            metadata_nr_blocks: le64(b, 344),
            compat_flags: le32(b, 352),
            compat_ro_flags: le32(b, 356),
            incompat_flags: le32(b, 360),
            record: Record::decode(b)?,
        };
        if !(1..=2).contains(&sb.version) {
            return Err(format!("unsupported metadata version {}", sb.version));
        }
        if sb.metadata_block_size != BLOCK_SECTORS {
            return Err(format!(
                "metadata block size {} sectors (only {BLOCK_SECTORS} is known)",
                sb.metadata_block_size
            ));
        }
        let dbs = sb.data_block_size as u64 * 512;
        if !valid_data_block(dbs) {
            return Err(format!("bad data block size {} sectors", sb.data_block_size));
        }
        Ok(sb)
    }

    /// Features the pool uses that strata does not know, if any: dm-thin defines no
    /// compat_ro or incompat feature, and refuses a pool with one (to write, for a compat_ro
    /// one; at all, for an incompat one). Unknown compat features are harmless.
    pub fn unknown_features(&self) -> Option<String> {
        let named = |kind: &str, bits: u32| (bits != 0).then(|| format!("{kind} features {bits:#x}"));
        let found: Vec<String> = [named("incompat", self.incompat_flags), named("compat_ro", self.compat_ro_flags)]
            .into_iter()
            .flatten()
            .collect();
        (!found.is_empty()).then(|| format!("the pool uses {} that strata does not know", found.join(" and ")))
    }

    /// Why the pool must not be written, if it must not: features strata does not know, or
    /// a check due (`NEEDS_CHECK`), as dm-thin refuses to write it.
    pub fn not_writable(&self) -> Option<String> {
        self.unknown_features().or_else(|| {
            (self.flags & NEEDS_CHECK != 0).then(|| {
                "the pool's needs_check flag is set (its metadata failed once): once `strata thin check` \
                 finds it clean, `strata thin check --clear-needs-check-flag` (or thin_check's) clears it"
                    .to_string()
            })
        })
    }

    /// The sealed 4 KiB block, written over nothing.
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        self.writes(&[0; BLOCK]).pop().unwrap()
    }

    /// The writes, in order, that turn the superblock `on_disk` into this one, each to be
    /// durable before the next: one when strata's record is unchanged, which changes sector
    /// 0 alone; two when it changed (see `Record`).
    pub fn writes(&self, on_disk: &[u8]) -> Vec<Vec<u8>> {
        let mut b = on_disk.to_vec();
        let mut out = Vec::new();
        let bytes = self.record.bytes();
        let active = pointer(on_disk).filter(|&(slot, len, _)| slot <= 1 && len <= SLOT);
        let holds = |(slot, len, _): (usize, usize, u32)| {
            len == bytes.len() && (0..len).all(|i| on_disk[slot_byte(slot, i)] == bytes[i])
        };
        let slot = match active {
            Some(p) if holds(p) => Some(p.0),
            None if bytes.is_empty() && Record::decode_v1(on_disk) == Record::default() => None,
            _ => {
                let slot = active.map_or(1, |p| 1 - p.0);
                for (i, &v) in bytes.iter().enumerate() {
                    b[slot_byte(slot, i)] = v;
                }
                for s in 1..BLOCK / SECTOR {
                    if b[s * SECTOR..(s + 1) * SECTOR] != on_disk[s * SECTOR..(s + 1) * SECTOR] {
                        keep_checksum(on_disk, &mut b, s);
                    }
                }
                if b != on_disk {
                    out.push(b.clone());
                }
                Some(slot)
            }
        };
        b[..SECTOR].fill(0);
        put32(&mut b, 4, self.flags);
        put64(&mut b, 8, SUPERBLOCK);
        b[16..32].copy_from_slice(&self.uuid);
        put64(&mut b, 32, MAGIC);
        put32(&mut b, 40, self.version);
        put32(&mut b, 44, self.time);
        put64(&mut b, 48, self.transaction_id);
        put64(&mut b, 56, self.held_root);
        self.data_sm.encode(&mut b[64..]);
        self.metadata_sm.encode(&mut b[192..]);
        put64(&mut b, 320, self.data_mapping_root);
        put64(&mut b, 328, self.device_details_root);
        put32(&mut b, 336, self.data_block_size);
        put32(&mut b, 340, self.metadata_block_size);
        put64(&mut b, 344, self.metadata_nr_blocks);
        put32(&mut b, 352, self.compat_flags);
        put32(&mut b, 356, self.compat_ro_flags);
        put32(&mut b, 360, self.incompat_flags);
        if let Some(slot) = slot {
            b[POINTER_AT..POINTER_AT + 8].copy_from_slice(POINTER_TAG);
            put32(&mut b, POINTER_AT + 8, slot as u32);
            put32(&mut b, POINTER_AT + 12, bytes.len() as u32);
            put32(&mut b, POINTER_AT + 16, crc32c::crc32c(&bytes));
        }
        seal(&mut b, SUPERBLOCK_XOR);
        out.push(b);
        out
    }

    /// Data block size in bytes.
    pub fn data_block_bytes(&self) -> u64 {
        self.data_block_size as u64 * 512
    }
}

/// A B-tree node's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeHeader {
    pub flags: u32,
    pub blocknr: u64,
    pub nr_entries: u32,
    pub max_entries: u32,
    pub value_size: u32,
}

impl NodeHeader {
    pub fn decode(b: &[u8]) -> NodeHeader {
        NodeHeader {
            flags: le32(b, 4),
            blocknr: le64(b, 8),
            nr_entries: le32(b, 16),
            max_entries: le32(b, 20),
            value_size: le32(b, 24),
        }
    }
}

/// Checks a node block read from `location` the way thin_check does (checksum, block number,
/// flags, value size, entry counts, ordered keys); `min_entries` for non-root nodes.
pub fn check_node(b: &[u8], location: u64, value_size: usize, root: bool) -> Result<NodeHeader, String> {
    if !sealed(b, BTREE_XOR) {
        return Err(format!("block {location}: bad B-tree node checksum"));
    }
    let h = NodeHeader::decode(b);
    if h.blocknr != location {
        return Err(format!("block {location}: the node names itself block {}", h.blocknr));
    }
    let vs = if h.flags == INTERNAL_NODE { 8 } else { value_size };
    if h.flags != INTERNAL_NODE && h.flags != LEAF_NODE {
        return Err(format!("block {location}: bad node flags {:#x}", h.flags));
    }
    if h.value_size as usize != vs {
        return Err(format!("block {location}: value size {} where {vs} was expected", h.value_size));
    }
    let max = h.max_entries as usize;
    if NODE_HEADER + max * (8 + vs) > BLOCK || !max.is_multiple_of(3) {
        return Err(format!("block {location}: bad max_entries {max}"));
    }
    let n = h.nr_entries as usize;
    if n > max {
        return Err(format!("block {location}: {n} entries, more than its {max}"));
    }
    if !root {
        check_fill(location, n, max)?;
    }
    if h.flags == INTERNAL_NODE && n == 0 {
        return Err(format!("block {location}: an internal node with no entries"));
    }
    for i in 1..n {
        if le64(b, NODE_HEADER + 8 * i) <= le64(b, NODE_HEADER + 8 * (i - 1)) {
            return Err(format!("block {location}: keys out of order at entry {i}"));
        }
    }
    Ok(h)
}

/// thin_check's rule for a node that is not its tree's root: at least a third full.
pub fn check_fill(location: u64, n: usize, max: usize) -> Result<(), String> {
    if n < max / 3 {
        return Err(format!("block {location}: too few entries ({n}, at least {} in a non-root node)", max / 3));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_capacities_are_the_kernels() {
        assert_eq!(max_entries(8), 252);
        assert_eq!(max_entries(24), 126);
        assert_eq!(max_entries(16), 168);
        assert_eq!(max_entries(4), 336);
        assert_eq!(ENTRIES_PER_BITMAP, 16320);
    }

    #[test]
    fn superblock_round_trips_and_refuses_damage() {
        let sb = Superblock {
            version: VERSION,
            time: 3,
            transaction_id: 9,
            data_block_size: 128,
            metadata_block_size: BLOCK_SECTORS,
            metadata_nr_blocks: 1024,
            data_sm: SmRoot { nr_blocks: 100, nr_allocated: 2, bitmap_root: 4, ref_count_root: 5 },
            record: Record {
                data_spec: "/d.img".into(),
                sizes: [(1, 1 << 40), (7, 4096)].into(),
                deleting: [3, 9].into(),
            },
            ..Superblock::default()
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        b[100] ^= 1;
        assert!(Superblock::decode(&b).unwrap_err().contains("checksum"));
        assert!(Superblock::decode(&vec![0u8; BLOCK]).unwrap_err().contains("not dm-thin"));
    }

    /// Every mix of old and new sectors a power cut can leave of `writes` over `on_disk`
    /// reads as the old superblock or (the last write whole) the new one.
    fn torn_writes_read_old_or_new(on_disk: &[u8], old: &Superblock, new: &Superblock) -> Vec<u8> {
        let writes = new.writes(on_disk);
        let mut before = on_disk.to_vec();
        for (k, w) in writes.iter().enumerate() {
            let changed: Vec<usize> = (0..BLOCK / SECTOR)
                .filter(|&s| w[s * SECTOR..(s + 1) * SECTOR] != before[s * SECTOR..(s + 1) * SECTOR])
                .collect();
            if k + 1 < writes.len() {
                assert!(!changed.contains(&0), "the record's write leaves sector 0 alone");
            } else {
                assert!(changed.iter().all(|&s| s == 0), "the last write changes sector 0 alone");
            }
            for mask in 0u32..1 << changed.len() {
                let mut mix = before.clone();
                for (i, &s) in changed.iter().enumerate() {
                    if mask >> i & 1 == 1 {
                        mix[s * SECTOR..(s + 1) * SECTOR].copy_from_slice(&w[s * SECTOR..(s + 1) * SECTOR]);
                    }
                }
                let whole = mask == (1 << changed.len()) - 1 && k + 1 == writes.len();
                assert_eq!(&Superblock::decode(&mix).unwrap(), if whole { new } else { old });
            }
            before = w.clone();
        }
        before
    }

    #[test]
    fn a_torn_superblock_write_reads_as_the_old_superblock() {
        let mut sb = Superblock {
            version: VERSION,
            data_block_size: 128,
            metadata_block_size: BLOCK_SECTORS,
            record: Record {
                data_spec: "/dev/disk/by-id/nvme-a-long-name-for-the-data-device".into(),
                ..Record::default()
            },
            ..Superblock::default()
        };
        let mut disk = sb.encode();
        for step in 0u32..40 {
            let mut next = sb.clone();
            next.transaction_id += 1;
            match step % 4 {
                0 | 1 => {
                    next.record.sizes.insert(step * 7919 % 1000, (step as u64 + 1) << 30);
                }
                2 => {
                    let id = *next.record.sizes.keys().next().unwrap();
                    next.record.sizes.remove(&id);
                    next.record.deleting.insert(id);
                }
                _ => {} // the record unchanged: one write
            }
            assert_eq!(next.writes(&disk).len(), if step % 4 == 3 { 1 } else { 2 });
            disk = torn_writes_read_old_or_new(&disk, &sb, &next);
            sb = next;
        }
    }

    #[test]
    fn the_record_of_the_earlier_layout_is_read_and_moved_safely() {
        let mut sb = Superblock {
            version: VERSION,
            data_block_size: 128,
            metadata_block_size: BLOCK_SECTORS,
            ..Superblock::default()
        };
        let mut disk = sb.encode();
        disk[V1_AT..V1_AT + 8].copy_from_slice(V1_TAG);
        disk[V1_AT + 8..V1_AT + 10].copy_from_slice(&6u16.to_le_bytes());
        disk[V1_AT + 10..V1_AT + 16].copy_from_slice(b"/d.img");
        put32(&mut disk, V1_AT + 16, 1);
        put32(&mut disk, V1_AT + 20, 5);
        put64(&mut disk, V1_AT + 24, 1 << 30);
        seal(&mut disk, SUPERBLOCK_XOR);
        sb.record = Record { data_spec: "/d.img".into(), sizes: [(5, 1 << 30)].into(), ..Record::default() };
        assert_eq!(Superblock::decode(&disk).unwrap(), sb);
        let mut next = sb.clone();
        next.record.sizes.insert(6, 1 << 20);
        torn_writes_read_old_or_new(&disk, &sb, &next);
    }

    #[test]
    fn a_slot_that_does_not_decode_is_refused_not_a_panic() {
        // Too long a varint; a spec longer than the slot; one as long as the address space;
        // a size cut short; bytes after the end.
        let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        for bad in [&[0xff; 11][..], &[0x05, b'a'], &huge, &[0x01, b'a', 0x01, 0x80], &[0x00, 0x00, 0x00, 0x00]] {
            assert_eq!(Record::from_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_slot_holds_two_hundred_volume_sizes() {
        let mut r = Record {
            data_spec: "/dev/disk/by-id/nvme-Samsung_SSD_980_PRO_2TB_S6B0NL0T000000X".into(),
            ..Record::default()
        };
        for id in 0..200 {
            r.sizes.insert(id, 1 << 40);
        }
        assert!(r.fits_one_more());
        let mut sb = Superblock {
            version: VERSION,
            data_block_size: 128,
            metadata_block_size: BLOCK_SECTORS,
            ..Superblock::default()
        };
        sb.record = r;
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn mappings_pack_block_and_time() {
        assert_eq!(pack_mapping(10, 0), 0x0a00_0000);
        assert_eq!(unpack_mapping(pack_mapping(1 << 39, 77)), (1 << 39, 77));
    }
}
