//! The mapping table in memory, and how it reaches the device: which pages changed, commits
//! that write them to their alternate copies, recovery that reads them back. A commit is the
//! moment mappings become durable; the target calls it on FLUSH and FUA, on a timer, and when
//! it needs freed slots back (a slot freed in memory is reused only after the commit that
//! records it free, so a crash can never leave an old mapping pointing at new data).

use crate::format::{
    self, decode_page, encode_page, Entry, Layout, PageProblem, Superblock, ENTRIES_PER_PAGE, OPEN_SEQUENCE_LIMIT,
    PAGE, SB_COPIES,
};
use strata_io::{signature, BlockDev, Buf, Error, ErrorKind, Result};

pub struct Meta {
    pub sb: Superblock,
    pub layout: Layout,
    pub entries: Vec<Entry>,
    dirty_pages: Vec<bool>,
    dirty_list: Vec<u64>,
    /// Which copy of each page holds its newest committed version.
    page_copy: Vec<u8>,
    next_generation: u64,
    commit_seq: u64,
    /// Counts changes to the table; a commit makes every change up to its batch's `upto`
    /// durable.
    changes: u64,
    /// Per slot: the number of its last change.
    slot_changed: Vec<u64>,
    /// Slots whose entry `load` found wrong (its findings' errors), for `repair`.
    damaged: Vec<u32>,
}

/// Pages to write for one commit, prepared under the state lock and written outside it.
pub struct CommitBatch {
    pub pages: Vec<(u64, u64, u8, Vec<u8>)>, // (page, offset, copy written, bytes)
    /// Every change up to this number is in the batch.
    pub upto: u64,
}

/// What reading the metadata found, for `cache check` and for the log at open.
#[derive(Debug, Default)]
pub struct Findings {
    /// Problems that make the metadata unusable.
    pub errors: Vec<String>,
    /// Things recovery repairs by itself (torn page copies, stale duplicate claims).
    pub repaired: Vec<String>,
}

/// Memory a loaded table keeps: each slot's entry and change count.
pub(crate) fn held_bytes(slots: u64) -> u64 {
    slots * (std::mem::size_of::<Entry>() + std::mem::size_of::<u64>()) as u64
}

/// Memory loading a table takes: the table as read, and what it keeps.
pub(crate) fn load_bytes(layout: &Layout, slots: u64) -> u64 {
    layout.table_bytes() + held_bytes(slots)
}

/// Asks for `bytes` in one piece, and gives them back at once: a cache whose books need
/// more memory than the system will give (more than memory and swap, or past the process's
/// address-space limit) is refused with why, where allocating them piece by piece would
/// abort the process. `what` names the books, `slots` the cache's size.
pub(crate) fn memory_for(bytes: u64, what: &str, slots: u64) -> Result<()> {
    let mut probe: Vec<u8> = Vec::new();
    match usize::try_from(bytes).ok().map(|n| probe.try_reserve_exact(n)) {
        Some(Ok(())) => Ok(()),
        _ => Err(Error::new(
            ErrorKind::NoMemory,
            format!(
                "a cache of {slots} blocks needs {} MiB of memory for {what}, more than this system gives \
                 (memory and swap, or the address-space limit): use a larger cache block size",
                bytes.div_ceil(1 << 20)
            ),
        )),
    }
}

impl Meta {
    /// A fresh, empty table for a newly formatted cache.
    pub fn fresh(sb: Superblock) -> Meta {
        let layout = Layout::new(sb.slots, sb.block_bytes);
        let pages = layout.table_pages as usize;
        Meta {
            entries: vec![Entry::default(); sb.slots as usize],
            dirty_pages: vec![true; pages],
            dirty_list: (0..pages as u64).collect(),
            page_copy: vec![1; pages], // the first commit writes copy 0
            next_generation: 1,
            commit_seq: 1,
            changes: 0,
            slot_changed: vec![0; sb.slots as usize],
            damaged: Vec::new(),
            layout,
            sb,
        }
    }

    pub fn slots(&self) -> usize {
        self.entries.len()
    }

    pub fn set(&mut self, slot: u32, origin_block: u64, valid: bool, dirty: bool) {
        let generation = self.next_generation;
        self.next_generation += 1;
        self.entries[slot as usize] = Entry { origin_block, valid, dirty, generation };
        self.mark(slot);
    }

    /// Changes only the dirty bit (no new generation: the claim on the block is unchanged).
    pub fn set_dirty(&mut self, slot: u32, dirty: bool) {
        let e = &mut self.entries[slot as usize];
        if e.dirty != dirty {
            e.dirty = dirty;
            self.mark(slot);
        }
    }

    /// The number of the latest change to the table.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The number of the latest change to `slot`'s entry.
    pub fn slot_changed(&self, slot: u32) -> u64 {
        self.slot_changed[slot as usize]
    }

    fn mark(&mut self, slot: u32) {
        self.changes += 1;
        self.slot_changed[slot as usize] = self.changes;
        let page = slot as usize / ENTRIES_PER_PAGE;
        if !self.dirty_pages[page] {
            self.dirty_pages[page] = true;
            self.dirty_list.push(page as u64);
        }
    }

    /// Marks every page changed (a fresh format writes both copies of every page).
    pub fn touch_all(&mut self) {
        for page in 0..self.dirty_pages.len() {
            if !self.dirty_pages[page] {
                self.dirty_pages[page] = true;
                self.dirty_list.push(page as u64);
            }
        }
    }

    pub fn has_changes(&self) -> bool {
        !self.dirty_list.is_empty()
    }

    /// Encodes every changed page into its other copy. The caller writes the batch and then
    /// calls `commit_done` (or `commit_failed`).
    pub fn prepare_commit(&mut self) -> CommitBatch {
        self.commit_seq += 1;
        let seq = self.commit_seq;
        let mut pages = Vec::with_capacity(self.dirty_list.len());
        for page in std::mem::take(&mut self.dirty_list) {
            self.dirty_pages[page as usize] = false;
            let copy = self.page_copy[page as usize] ^ 1;
            let start = page as usize * ENTRIES_PER_PAGE;
            let end = (start + ENTRIES_PER_PAGE).min(self.entries.len());
            let bytes = encode_page(page, seq, &self.entries[start..end]);
            pages.push((page, self.layout.page_offset(page, copy), copy, bytes));
        }
        CommitBatch { pages, upto: self.changes }
    }

    pub fn commit_done(&mut self, batch: &CommitBatch) {
        for (page, _, copy, _) in &batch.pages {
            self.page_copy[*page as usize] = *copy;
        }
    }

    /// A failed commit: the same copies are written again next time (the other copies still
    /// hold the last good versions).
    pub fn commit_failed(&mut self, batch: &CommitBatch) {
        for (page, _, _, _) in &batch.pages {
            if !self.dirty_pages[*page as usize] {
                self.dirty_pages[*page as usize] = true;
                self.dirty_list.push(*page);
            }
        }
    }

    /// Reads the whole metadata of a cache device. `Err` only when nothing usable is there
    /// (no superblock); table problems are in the findings.
    pub async fn load(dev: &dyn BlockDev) -> Result<(Meta, Findings)> {
        let sb = read_superblock(dev).await?;
        let layout = Layout::new(sb.slots, sb.block_bytes);
        if layout.end > dev.size() {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("cache device is {} bytes but its superblock needs {}", dev.size(), layout.end),
            ));
        }
        let table_bytes = layout.table_bytes() as usize;
        memory_for(load_bytes(&layout, sb.slots), "its table", sb.slots)?;
        let mut table = Vec::with_capacity(table_bytes);
        let mut pos = 0;
        while pos < table_bytes {
            let n = (table_bytes - pos).min(8 << 20);
            let b = dev.read(layout.table_offset + pos as u64, Buf::zeroed(n)).await?;
            table.extend_from_slice(&b);
            pos += n;
        }
        let mut findings = Findings::default();
        let slots = sb.slots as usize;
        let mut entries = vec![Entry::default(); slots];
        let mut page_copy = vec![0u8; layout.table_pages as usize];
        let mut commit_seq = 0;
        // Pages with one copy torn or damaged: the first commit rewrites that copy.
        let mut rewrite = Vec::new();
        for page in 0..layout.table_pages {
            let copy = |c: u8| {
                let at = (layout.page_offset(page, c) - layout.table_offset) as usize;
                decode_page(page, &table[at..at + PAGE])
            };
            let (a, b) = (copy(0), copy(1));
            let chosen = match (&a, &b) {
                (Ok((sa, _)), Ok((sb_, _))) => Some(if sa >= sb_ { 0 } else { 1 }),
                (Ok((seq, _)), Err(p)) | (Err(p), Ok((seq, _))) => {
                    let bad = if a.is_ok() { 1 } else { 0 };
                    // A crash tears only a copy its last commit was writing, and never zeroes
                    // one (both are written when the cache is made). After a clean shutdown,
                    // or zeroed, the copy was damaged since: it may have been the newer, and
                    // the other older than what was acknowledged.
                    if sb.clean_shutdown || *p == PageProblem::NeverWritten {
                        findings.errors.push(format!(
                            "table page {page}: copy {bad} damaged ({p:?}); copy {} (commit {seq}) may be older than what was acknowledged",
                            bad ^ 1
                        ));
                    } else {
                        findings.repaired.push(format!(
                            "table page {page}: copy {bad} unusable ({p:?}), as a commit under way at a crash leaves it; using copy {}",
                            bad ^ 1
                        ));
                    }
                    rewrite.push(page);
                    Some(bad ^ 1)
                }
                (Err(pa), Err(pb)) => {
                    findings.errors.push(format!("table page {page}: both copies unusable ({pa:?}, {pb:?})"));
                    None
                }
            };
            if let Some(c) = chosen {
                let (seq, es) = if c == 0 { a.unwrap() } else { b.unwrap() };
                commit_seq = commit_seq.max(seq);
                page_copy[page as usize] = c;
                let start = page as usize * ENTRIES_PER_PAGE;
                for (i, e) in es.into_iter().enumerate() {
                    if start + i < slots {
                        entries[start + i] = e;
                    } else if e.valid {
                        findings.errors.push(format!("table page {page}: entry {i} beyond the last slot is valid"));
                    }
                }
            }
        }
        let mut meta = Meta {
            dirty_pages: vec![false; layout.table_pages as usize],
            dirty_list: Vec::new(),
            page_copy,
            next_generation: entries.iter().map(|e| e.generation).max().unwrap_or(0) + 1,
            commit_seq,
            changes: 0,
            slot_changed: vec![0; slots],
            damaged: Vec::new(),
            entries,
            layout,
            sb,
        };
        for page in rewrite {
            meta.dirty_pages[page as usize] = true;
            meta.dirty_list.push(page);
        }
        meta.validate_and_resolve(&mut findings);
        let counters = [
            ("the superblock's sequence", meta.sb.seq),
            ("the table's commit sequence", meta.commit_seq),
            ("an entry's generation", meta.next_generation - 1),
        ];
        for (what, v) in counters.into_iter().filter(|c| c.1 >= OPEN_SEQUENCE_LIMIT) {
            findings.errors.push(format!(
                "{what} is {v}, past the 2^62 no cache counts to (the metadata was crafted or damaged; \
                 a repair does not mend it)"
            ));
        }
        Ok((meta, findings))
    }

    /// Checks every entry; resolves duplicate claims on one origin block by generation (the
    /// losers are freed and the fix is committed by the next commit).
    fn validate_and_resolve(&mut self, findings: &mut Findings) {
        let origin_blocks = self.sb.origin_blocks();
        let mut owner: rustc_hash::FxHashMap<u64, u32> = Default::default();
        for slot in 0..self.entries.len() as u32 {
            let e = self.entries[slot as usize];
            if !e.valid {
                if e.dirty {
                    findings.errors.push(format!("slot {slot}: dirty bit on an unmapped slot"));
                    self.damaged.push(slot);
                }
                continue;
            }
            if e.origin_block >= origin_blocks {
                findings.errors.push(format!(
                    "slot {slot}: maps origin block {} beyond the origin's {origin_blocks} blocks",
                    e.origin_block
                ));
                self.damaged.push(slot);
                continue;
            }
            match owner.get(&e.origin_block).copied() {
                None => {
                    owner.insert(e.origin_block, slot);
                }
                Some(other) => {
                    let o = self.entries[other as usize];
                    if o.generation == e.generation {
                        findings.errors.push(format!(
                            "slots {other} and {slot} both map origin block {} with the same generation",
                            e.origin_block
                        ));
                        self.damaged.extend([other, slot]);
                        continue;
                    }
                    let (keep, lose) = if e.generation > o.generation { (slot, other) } else { (other, slot) };
                    findings.repaired.push(format!(
                        "origin block {} claimed by slots {other} and {slot}; keeping the newer slot {keep}",
                        e.origin_block
                    ));
                    self.set(lose, 0, false, false);
                    owner.insert(e.origin_block, keep);
                }
            }
        }
    }

    /// Accepts what `load` found wrong: unmaps every slot whose entry was wrong (the origin's
    /// copy of its block is read from then on) and marks every page to be written, so that
    /// two commits rewrite both copies of each. Returns the slots unmapped.
    pub fn repair(&mut self) -> usize {
        let damaged = std::mem::take(&mut self.damaged);
        for &s in &damaged {
            self.set(s, 0, false, false);
        }
        self.touch_all();
        damaged.len()
    }

    /// Writes the superblock into the copy not holding the current one.
    pub async fn write_superblock(&mut self, dev: &dyn BlockDev) -> Result<()> {
        self.sb.seq += 1;
        dev.write(self.sb.offset(), Buf::from_slice(&self.sb.encode()), true).await?;
        Ok(())
    }
}

/// Reads both superblock copies and returns the newest valid one.
pub async fn read_superblock(dev: &dyn BlockDev) -> Result<Superblock> {
    if dev.size() < (SB_COPIES * PAGE) as u64 {
        return Err(Error::new(ErrorKind::Invalid, "device too small to hold a strata cache"));
    }
    let b = dev.read(0, Buf::zeroed(SB_COPIES * PAGE)).await?;
    let a = Superblock::decode(&b[..PAGE]);
    let c = Superblock::decode(&b[PAGE..]);
    match (a, c) {
        (Ok(x), Ok(y)) => Ok(if x.seq >= y.seq { x } else { y }),
        (Ok(x), Err(_)) | (Err(_), Ok(x)) => Ok(x),
        (Err(e0), Err(e1)) => {
            let msg = match (e0, e1) {
                (format::FormatError::NotStrata(_), format::FormatError::NotStrata(_)) => {
                    match signature::head(dev).await.ok().and_then(|h| signature::recognise(&h)) {
                        Some(what) => format!("not a strata cache device: it holds {what}"),
                        None => "not a strata cache device (no superblock; create one with `strata cache create`)"
                            .to_string(),
                    }
                }
                (format::FormatError::NotStrata(_), e) | (e, _) => {
                    format!("corrupt cache superblock: {e} (no usable copy)")
                }
            };
            Err(Error::new(ErrorKind::Invalid, msg))
        }
    }
}
