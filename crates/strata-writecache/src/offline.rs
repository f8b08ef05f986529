//! Create, scan (the recovery read of the entries, shared by open, check and dump).
//!
//! `create` refuses a fast device that holds data unless forced, like `cache create`.
//! `scan` reads the superblock and every entry, checks each entry of the last commit against
//! its slot's data, and keeps the newest copy of each block: what recovery opens with, and
//! what `check` and `dump` report.

use crate::format::{
    Entry, Superblock, BLOCK_BYTES_DEFAULT, ENTRIES_PER_PAGE, ENTRY_BYTES, ENTRY_PAGE_BYTES, FLAG_ZERO,
    ORIGIN_TEXT_BYTES_MAX, SUPERBLOCK_BYTES,
};
use rustc_hash::FxHashMap;
use strata_io::{signature, BlockDev, Buf, Error, ErrorKind, Result};

/// Entry pages read at once while scanning.
const SCAN_PAGES: u64 = 256;

/// How `create` formats a log.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub block_bytes: u32,
    /// Overwrite a device that holds data.
    pub force: bool,
    /// Recorded in the superblock: how to open the origin, and what identifies it.
    pub origin_spec: String,
    pub origin_id: String,
}

impl Default for CreateOptions {
    fn default() -> CreateOptions {
        CreateOptions {
            block_bytes: BLOCK_BYTES_DEFAULT,
            force: false,
            origin_spec: String::new(),
            origin_id: String::new(),
        }
    }
}

/// Formats `cache` as a write log in front of `origin` (which it does not touch).
pub async fn create(cache: &dyn BlockDev, origin: &dyn BlockDev, o: &CreateOptions) -> Result<Superblock> {
    let mut sb = Superblock::plan(cache.size(), o.block_bytes, origin.size())?;
    if o.origin_spec.len() + o.origin_id.len() > ORIGIN_TEXT_BYTES_MAX {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!("writecache: the origin's spec and identity exceed {ORIGIN_TEXT_BYTES_MAX} bytes"),
        ));
    }
    signature::check_origin(origin, o.force).await?;
    sb.origin_spec = o.origin_spec.clone();
    sb.origin_id = o.origin_id.clone();
    if !o.force {
        if let Some(what) = signature::recognise_any(&signature::head(cache).await?) {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{}: the device holds {what}; --force overwrites it", cache.describe()),
            ));
        }
    }
    // Entries first, zeroed; the superblock last, so a crash mid-create leaves no valid log.
    cache.write(0, Buf::zeroed(SUPERBLOCK_BYTES as usize), false).await?;
    cache.flush().await?;
    let pages = sb.entry_pages();
    let mut p = 0;
    while p < pages {
        let n = (pages - p).min(SCAN_PAGES);
        let at = sb.entries_offset() + p * ENTRY_PAGE_BYTES;
        cache.write(at, Buf::zeroed((n * ENTRY_PAGE_BYTES) as usize), false).await?;
        p += n;
    }
    cache.flush().await?;
    cache.write(0, Buf::from_slice(&sb.encode()), true).await?;
    cache.flush().await?;
    Ok(sb)
}

/// Reads and checks the superblock, and that `origin` is the one it was created over.
pub async fn superblock(cache: &dyn BlockDev, origin: Option<&dyn BlockDev>) -> Result<Superblock> {
    if cache.size() < SUPERBLOCK_BYTES {
        return Err(Error::new(ErrorKind::Invalid, format!("{}: too small for a writecache", cache.describe())));
    }
    let head = cache.read(0, Buf::zeroed(SUPERBLOCK_BYTES as usize)).await?;
    let sb = Superblock::decode(&head, cache.size())
        .map_err(|e| Error::new(e.kind, format!("{}: {}", cache.describe(), e.context)))?;
    if let Some(origin) = origin {
        if origin.size() != sb.origin_bytes {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "{}: origin {} has {} bytes, the writecache was created over {} bytes (wrong origin, or its size changed)",
                    cache.describe(),
                    origin.describe(),
                    origin.size(),
                    sb.origin_bytes
                ),
            ));
        }
    }
    Ok(sb)
}

/// What the entries say.
#[derive(Debug, Default)]
pub struct Scan {
    /// Block → (slot, entry) of its newest copy.
    pub newest: FxHashMap<u64, (u32, Entry)>,
    /// Valid entries older than their block's newest: (slot, entry).
    pub older: Vec<(u32, Entry)>,
    /// Slots whose entry recovery clears: data the last commit did not finish, a second
    /// entry for one write.
    pub garbage: Vec<u32>,
    /// Slots whose entry is damaged, and how: a checksum that fails or a block past the
    /// origin. An entry never crosses a sector, so no crash tears one: the block it held is
    /// unknown, and recovery refuses to guess (`clear_damaged` after `check --repair`).
    pub damaged: Vec<(u32, String)>,
    pub max_seq: u64,
    pub max_commit: u64,
    /// Human-readable findings about garbage entries (what `check` prints).
    pub findings: Vec<String>,
}

/// Scans the entries of a cache whose superblock is `sb`.
pub async fn scan(cache: &dyn BlockDev, sb: &Superblock) -> Result<Scan> {
    let origin_blocks = sb.origin_bytes.div_ceil(sb.block_bytes as u64);
    let mut all: Vec<(u32, Entry)> = Vec::new();
    let mut out = Scan::default();
    let pages = sb.entry_pages();
    let mut p = 0;
    while p < pages {
        let n = (pages - p).min(SCAN_PAGES);
        let at = sb.entries_offset() + p * ENTRY_PAGE_BYTES;
        let buf = cache.read(at, Buf::zeroed((n * ENTRY_PAGE_BYTES) as usize)).await?;
        for i in 0..n * ENTRIES_PER_PAGE {
            let s = p * ENTRIES_PER_PAGE + i;
            if s >= sb.slots {
                break;
            }
            let raw = &buf[(i * ENTRY_BYTES) as usize..((i + 1) * ENTRY_BYTES) as usize];
            match Entry::decode(raw) {
                Ok(None) => {}
                Ok(Some(e)) if e.block < origin_blocks => all.push((s as u32, e)),
                Ok(Some(e)) => {
                    let why = format!("slot {s}: block {} beyond the origin ({origin_blocks} blocks)", e.block);
                    out.damaged.push((s as u32, why));
                }
                Err(crate::format::TornEntry) => {
                    out.damaged.push((s as u32, format!("slot {s}: entry checksum mismatch")));
                }
            }
        }
        p += n;
    }
    out.max_commit = all.iter().map(|(_, e)| e.commit).max().unwrap_or(0);
    // Entries of the last commit may have landed without their data: check it.
    let last: Vec<(u32, Entry)> =
        all.iter().filter(|(_, e)| e.commit == out.max_commit && e.flags & FLAG_ZERO == 0).copied().collect();
    let mut bad = rustc_hash::FxHashSet::default();
    for chunk in last.chunks(64) {
        let reads =
            chunk.iter().map(|(s, _)| cache.read(sb.slot_offset(*s as u64), Buf::zeroed(sb.block_bytes as usize)));
        for ((s, e), r) in chunk.iter().zip(futures::future::join_all(reads).await) {
            let data = r?;
            let len = (sb.origin_bytes - e.block * sb.block_bytes as u64).min(sb.block_bytes as u64) as usize;
            if crc32c::crc32c(&data[..len]) != e.data_crc {
                bad.insert(*s);
            }
        }
    }
    for (s, e) in all {
        if bad.contains(&s) {
            out.findings
                .push(format!("slot {s}: data of block {} does not match its entry (unfinished commit)", e.block));
            out.garbage.push(s);
            continue;
        }
        out.max_seq = out.max_seq.max(e.seq);
        match out.newest.get(&e.block) {
            Some(&(_, cur)) if cur.seq > e.seq => out.older.push((s, e)),
            Some(&(cs, cur)) if cur.seq == e.seq => {
                out.findings.push(format!("slots {cs} and {s}: block {} twice with sequence {}", e.block, e.seq));
                out.garbage.push(s);
            }
            Some(&(cs, cur)) => {
                out.older.push((cs, cur));
                out.newest.insert(e.block, (s, e));
            }
            None => {
                out.newest.insert(e.block, (s, e));
            }
        }
    }
    Ok(out)
}

impl Scan {
    /// Refuses a log with damaged entries: serving it would read an older copy, or the
    /// origin's, of whatever block such an entry held.
    pub fn refuse_damage(&self, cache: &dyn BlockDev) -> Result<()> {
        if self.damaged.is_empty() {
            return Ok(());
        }
        let shown: Vec<&str> = self.damaged.iter().map(|(_, why)| why.as_str()).take(4).collect();
        Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "{}: {} damaged entries ({}{}): the blocks they held are unknown; `strata writecache check --repair` clears them, losing those blocks' logged data",
                cache.describe(),
                self.damaged.len(),
                shown.join("; "),
                if self.damaged.len() > shown.len() { "; ..." } else { "" }
            ),
        ))
    }
}

/// Clears the entries `scan` found damaged (a repair that accepts losing what they held),
/// durably.
pub async fn clear_damaged(cache: &dyn BlockDev, sb: &Superblock, scan: &Scan) -> Result<()> {
    let slots: Vec<u32> = scan.damaged.iter().map(|&(s, _)| s).collect();
    let mut pages: Vec<u64> = slots.iter().map(|&s| s as u64 / ENTRIES_PER_PAGE).collect();
    pages.sort_unstable();
    pages.dedup();
    for p in pages {
        let at = sb.entries_offset() + p * ENTRY_PAGE_BYTES;
        let mut page = cache.read(at, Buf::zeroed(ENTRY_PAGE_BYTES as usize)).await?;
        for &s in slots.iter().filter(|&&s| s as u64 / ENTRIES_PER_PAGE == p) {
            let i = (s as u64 % ENTRIES_PER_PAGE * ENTRY_BYTES) as usize;
            Entry::encode_free(&mut page[i..]);
        }
        cache.write(at, page, false).await?;
    }
    cache.flush().await
}
