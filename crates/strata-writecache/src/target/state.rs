//! Slot bookkeeping: which slot holds the newest logged copy of each origin block, which
//! slots are free, which hold older copies whose entries must be cleared on disk before the
//! slot can be reused, and which entry pages the next commit writes.
//!
//! The rules that keep an older copy from ever winning (checked by `State::check`):
//! - a slot is reused only once its entry is zero on disk (`Free`);
//! - the entries of a block's older copies (`Stale`) are cleared one per commit, oldest
//!   first, so a torn commit can only leave a newer copy than the one it removed;
//! - a block's entries are cleared with no live copy left only once the origin durably holds
//!   data at least as new as the newest (written back, or a write around the log flushed);
//!   a write around the log is acknowledged only once no copy of its blocks is left on disk;
//! - a clean copy leaves the log only once its entry is on disk, or no older one is
//!   (`evictable`): the newest entry of a block on disk is always its newest copy's.
//!
//! Memory: 37 bytes per slot and about 5 more for the index (`State::heap_bytes`). A slot is
//! its entry's figures and two links (32 bytes), its state and flags in one byte, and its
//! number in the index (an open-addressing table of slot numbers whose keys are the slots'
//! blocks, a quarter larger than the log). The links thread every slot on exactly one of
//! three lists: free, dirty (oldest write first) or clean (oldest cleaned first, evicted in
//! that order); stale and garbage slots are on none. Pins (reads and write-backs in flight)
//! live in a small map of the slots pinned now.

use super::index::SlotIndex;
use crate::format::{Entry, ENTRIES_PER_PAGE, FLAG_ZERO, SEQ_MAX, SLOTS_MAX};
use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, HashSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Unused; its entry is zero on disk (or never committed).
    Free,
    /// The newest copy of its block.
    Live { dirty: bool },
    /// An older copy whose entry may be on disk; cleared by a commit, then `Free`.
    Stale,
    /// An entry recovery could not trust (torn, data checksum failed, out of range); cleared
    /// by the first commit.
    Garbage,
}

/// A slot's entry as the next commit writes it (and, once on disk, as the media may hold
/// it), and its links on the list it is on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Slot {
    pub block: u64,
    /// Write order; never zero in a live entry.
    pub seq: u64,
    /// The low 32 bits of the commit that wrote the entry (see [`State::entry`]).
    pub commit: u32,
    pub data_crc: u32,
    prev: u32,
    next: u32,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 32);

/// No slot (list ends, empty index cells).
pub const NONE: u32 = u32::MAX;

/// `n` copies of `v`, or `None` where that memory cannot be had.
pub(super) fn filled<T: Clone>(n: usize, v: T) -> Option<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).ok()?;
    out.resize(n, v);
    Some(out)
}

// A slot's byte: its state in the low two bits, then flags.
const STATE_MASK: u8 = 0b11;
const FREE: u8 = 0;
const LIVE: u8 = 1;
const STALE: u8 = 2;
const GARBAGE: u8 = 3;
const DIRTY: u8 = 1 << 2;
/// A commit has written (or is writing) this entry: superseding the slot needs a clear.
const ON_DISK: u8 = 1 << 3;
/// The commit that wrote this entry has completed: the entry is durable.
const COMMITTED: u8 = 1 << 4;
/// The slot was clean (its data written back and flushed on the origin) when it left the
/// index: the origin holds data at least as new as it.
const RETIRED_CLEAN: u8 = 1 << 5;
/// The entry's `FLAG_ZERO`: the block is zeroes, no data in the slot.
const ZERO: u8 = 1 << 6;
/// A clean copy of a block read from the origin (`install_read`): no entry is ever written
/// for it, so it is gone after a restart, as a clean copy may be.
const READ: u8 = 1 << 7;

/// The lists a slot can be on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Free,
    Dirty,
    Clean,
}

/// A list threaded through the slots' links.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: u64,
}

impl Default for List {
    fn default() -> List {
        List { head: NONE, tail: NONE, len: 0 }
    }
}

#[derive(Default)]
pub struct State {
    slots: Vec<Slot>,
    bits: Vec<u8>,
    /// Origin block → slot of its newest copy.
    index: SlotIndex,
    free: List,
    dirty: List,
    clean: List,
    /// Reads and write-backs in flight per slot; a pinned slot is not reused.
    pins: FxHashMap<u32, u32>,
    /// Block → (seq, slot) of its stale copies with entries possibly on disk.
    pub stale: FxHashMap<u64, BTreeSet<(u64, u32)>>,
    pub garbage: Vec<u32>,
    pub dirty_pages: BTreeSet<u64>,
    /// Last sequence number handed out.
    pub seq: u64,
    /// Last commit number handed out.
    pub commit: u64,
    /// Bumped by every change a flush must make durable.
    pub write_gen: u64,
    /// Every change up to this generation is durable.
    pub durable_gen: u64,
    /// Slots being written back right now (not written back twice at once).
    pub writing_back: HashSet<u32>,
    /// Why the volume stopped: a flush of one device failed, so writes it covered may be gone
    /// for good and no later flush can vouch for them. No writes or flushes are accepted.
    pub stopped: Option<String>,
    /// The failed flush was the fast device's: a slot written since its last good flush may
    /// hold older data, so no read is served from the log.
    pub log_suspect: bool,
}

impl State {
    /// `slots` free slots, or an error (not an abort) where their books need more memory
    /// than can be had.
    pub fn new(slots: u64) -> strata_io::Result<State> {
        let n = usize::try_from(slots).unwrap_or(usize::MAX);
        let books = || Some((filled(n, Slot::default())?, filled(n, FREE)?, SlotIndex::with_capacity(n)?));
        let Some((books, bits, index)) = books() else {
            let bytes = slots.saturating_mul(std::mem::size_of::<Slot>() as u64 + 6);
            let why = format!(
                "the write log's {slots} slots need about {} of memory, more than can be had (a larger block \
                 size needs fewer slots)",
                strata_io::units::format_size(bytes)
            );
            return Err(strata_io::Error::new(strata_io::ErrorKind::NoMemory, why));
        };
        let mut st = State { slots: books, bits, index, ..State::default() };
        for s in 0..slots {
            st.push(Which::Free, s as u32);
        }
        Ok(st)
    }

    /// Heap bytes the books take (per-slot arrays and the index; the transient sets and maps
    /// of stale, pinned and written-back slots are not counted).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>() + self.bits.capacity() + self.index.heap_bytes()
    }

    pub fn slot(&self, s: u32) -> &Slot {
        &self.slots[s as usize]
    }

    pub fn state(&self, s: u32) -> SlotState {
        let b = self.bits[s as usize];
        match b & STATE_MASK {
            FREE => SlotState::Free,
            LIVE => SlotState::Live { dirty: b & DIRTY != 0 },
            STALE => SlotState::Stale,
            _ => SlotState::Garbage,
        }
    }

    fn flag(&self, s: u32, f: u8) -> bool {
        self.bits[s as usize] & f != 0
    }

    fn set_flag(&mut self, s: u32, f: u8, on: bool) {
        let b = &mut self.bits[s as usize];
        *b = if on { *b | f } else { *b & !f };
    }

    fn set_state(&mut self, s: u32, state: u8) {
        let b = &mut self.bits[s as usize];
        *b = (*b & !STATE_MASK) | state;
    }

    /// The entry as a commit writes it. A slot keeps its commit's low 32 bits (8 bytes more
    /// a slot for the rest would be a quarter of its memory): the entry takes the latest
    /// commit number up to the last handed out that has them. That is its own unless it is
    /// 2^32 commits old, and never later than the last commit, whose entries recovery must
    /// tell apart (an older entry's data is durable, whatever number it carries).
    pub fn entry(&self, s: u32) -> Entry {
        let sl = &self.slots[s as usize];
        let flags = if self.zero(s) { FLAG_ZERO } else { 0 };
        let same_low = (self.commit & !(u32::MAX as u64)) | sl.commit as u64;
        let commit = if same_low <= self.commit { same_low } else { same_low.saturating_sub(1 << 32) };
        Entry { block: sl.block, seq: sl.seq, commit, flags, data_crc: sl.data_crc }
    }

    /// The block is zeroes (no data in the slot).
    pub fn zero(&self, s: u32) -> bool {
        self.flag(s, ZERO)
    }

    pub fn on_disk(&self, s: u32) -> bool {
        self.flag(s, ON_DISK)
    }

    /// A commit numbered `commit` writes slot `s`'s entry.
    pub fn written_by(&mut self, s: u32, commit: u64) {
        self.slots[s as usize].commit = commit as u32;
        self.set_flag(s, ON_DISK, true);
    }

    /// The commit that wrote slot `s`'s entry (sequence `seq`) completed.
    pub fn committed(&mut self, s: u32, seq: u64) {
        if self.slots[s as usize].seq == seq && self.on_disk(s) {
            self.set_flag(s, COMMITTED, true);
        }
    }

    /// The slot's entry is durable (and its data with it).
    pub fn durable(&self, s: u32) -> bool {
        self.flag(s, COMMITTED)
    }

    pub fn pin(&mut self, s: u32) {
        *self.pins.entry(s).or_default() += 1;
    }

    pub fn unpin(&mut self, s: u32) {
        let n = self.pins.get_mut(&s).expect("unpin of a slot not pinned");
        *n -= 1;
        if *n == 0 {
            self.pins.remove(&s);
        }
    }

    /// The slot holding the newest copy of `block`.
    pub fn lookup(&self, block: u64) -> Option<u32> {
        self.index.get(&self.slots, block)
    }

    /// Dirty slots, oldest write first, as (seq, slot).
    pub fn dirty_oldest(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.walk(self.dirty.head).map(|s| (self.slots[s as usize].seq, s))
    }

    /// The clean slots eviction may retire now, cleaned longest ago first. A clean copy whose
    /// entry is not on disk waits while older copies of its block are: retired, it would leave
    /// the newest of them to win at recovery over the origin's newer data until commits had
    /// cleared them all, one per commit, and a flush makes only one. The next commit writes
    /// its entry; after that it may go.
    pub fn evictable(&self) -> impl Iterator<Item = u32> + '_ {
        self.walk(self.clean.head)
            .filter(|&s| self.on_disk(s) || !self.stale.contains_key(&self.slots[s as usize].block))
    }

    /// Whether any slot is clean.
    pub fn has_clean(&self) -> bool {
        self.clean.len > 0
    }

    fn walk(&self, from: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors((from != NONE).then_some(from), move |&s| {
            let n = self.slots[s as usize].next;
            (n != NONE).then_some(n)
        })
    }

    pub fn touch(&mut self, slot: u32) {
        self.dirty_pages.insert(slot as u64 / ENTRIES_PER_PAGE);
    }

    /// A free slot nobody is reading, if any (taken off the free list).
    pub fn alloc(&mut self) -> Option<u32> {
        if self.sequences_used_up() {
            return None;
        }
        let s = self.walk(self.free.head).find(|s| !self.pins.contains_key(s))?;
        self.unlink(Which::Free, s);
        debug_assert_eq!(self.state(s), SlotState::Free);
        Some(s)
    }

    /// Whether the write sequences left could run out: a slot handed out takes one when a
    /// copy is installed in it, and at most every slot is handed out at once, so none is
    /// once fewer than [`SLOTS_MAX`] are left below [`SEQ_MAX`]. Only a log whose entries
    /// were made to say so gets there (2^63 writes take millennia); it then takes no more
    /// copies, and writes go around it as when it is full.
    pub fn sequences_used_up(&self) -> bool {
        self.seq >= SEQ_MAX - SLOTS_MAX - 1
    }

    /// `n` slots, or none if fewer are free.
    pub fn alloc_n(&mut self, n: usize) -> Option<Vec<u32>> {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            match self.alloc() {
                Some(s) => got.push(s),
                None => {
                    for &s in &got {
                        self.unalloc(s);
                    }
                    return None;
                }
            }
        }
        Some(got)
    }

    /// Gives back a slot `alloc` handed out and nothing was installed in.
    pub fn unalloc(&mut self, s: u32) {
        debug_assert_eq!(self.state(s), SlotState::Free);
        self.push(Which::Free, s);
    }

    /// Records that slot `s` (from `alloc`) now holds the newest copy of `block` (data
    /// already on the fast device); the previous copy, if any, becomes stale. Returns the
    /// generation a flush must reach to make it durable.
    pub fn install(&mut self, block: u64, s: u32, data_crc: u32, zero: bool) -> u64 {
        self.seq += 1;
        self.slots[s as usize] = Slot { block, seq: self.seq, commit: 0, data_crc, prev: NONE, next: NONE };
        self.bits[s as usize] = LIVE | DIRTY | if zero { ZERO } else { 0 };
        self.push(Which::Dirty, s);
        self.touch(s);
        if let Some(old) = self.index.insert(&self.slots, block, s) {
            self.retire(old);
        }
        self.write_gen += 1;
        self.write_gen
    }

    /// Records that slot `s` (from `alloc`) holds a clean copy of `block` just read from the
    /// origin, which the log holds no copy of, live or on disk. Nothing to commit: a read copy
    /// keeps no entry (`keeps_entry`), and leaves at the first write to its block or eviction.
    /// It is never written back, so it carries no data checksum.
    pub fn install_read(&mut self, block: u64, s: u32) {
        debug_assert!(!self.logged_anywhere(block));
        self.seq += 1;
        self.slots[s as usize] = Slot { block, seq: self.seq, commit: 0, data_crc: 0, prev: NONE, next: NONE };
        self.bits[s as usize] = LIVE | READ;
        self.push(Which::Clean, s);
        self.index.insert(&self.slots, block, s);
    }

    /// Recovery: slot `s` holds `e`, the newest committed copy of its block (dirty: the
    /// origin may not have it). Call in ascending `seq` order.
    pub fn recovered_live(&mut self, s: u32, e: Entry) {
        self.recovered(s, e, LIVE | DIRTY);
        self.push(Which::Dirty, s);
        self.index.insert(&self.slots, e.block, s);
    }

    /// Recovery: slot `s` holds `e`, an older committed copy of its block.
    pub fn recovered_stale(&mut self, s: u32, e: Entry) {
        self.recovered(s, e, STALE);
        self.stale.entry(e.block).or_default().insert((e.seq, s));
    }

    /// Recovery: slot `s` holds an entry that cannot be trusted; the first commit clears it.
    pub fn recovered_garbage(&mut self, s: u32) {
        self.unlink(Which::Free, s);
        self.bits[s as usize] = GARBAGE | ON_DISK;
        self.garbage.push(s);
    }

    fn recovered(&mut self, s: u32, e: Entry, state: u8) {
        self.unlink(Which::Free, s);
        let zero = if e.flags & FLAG_ZERO != 0 { ZERO } else { 0 };
        self.slots[s as usize] =
            Slot { block: e.block, seq: e.seq, commit: e.commit as u32, data_crc: e.data_crc, prev: NONE, next: NONE };
        self.bits[s as usize] = state | ON_DISK | COMMITTED | zero;
    }

    /// Takes live slot `s` out of the index: free at once if its entry never reached the
    /// disk, otherwise stale until a commit clears it.
    pub fn retire(&mut self, s: u32) {
        let SlotState::Live { dirty } = self.state(s) else {
            panic!("retire of slot {s} in state {:?}", self.state(s))
        };
        let Slot { block, seq, .. } = self.slots[s as usize];
        self.unlink(if dirty { Which::Dirty } else { Which::Clean }, s);
        if self.index.get(&self.slots, block) == Some(s) {
            self.index.remove(&self.slots, block);
        }
        if self.flag(s, READ) {
            // No entry, no older copy: nothing for a commit to do.
            self.make_free(s);
            return;
        }
        self.set_flag(s, RETIRED_CLEAN, !dirty);
        if self.on_disk(s) {
            self.set_state(s, STALE);
            self.stale.entry(block).or_default().insert((seq, s));
        } else {
            self.make_free(s);
        }
        if !dirty {
            // The origin holds this copy, so it holds data at least as new as every older one.
            if let Some(copies) = self.stale.get(&block) {
                let older: Vec<u32> = copies.iter().map(|&(_, o)| o).collect();
                for o in older {
                    self.set_flag(o, RETIRED_CLEAN, true);
                }
            }
        }
        self.touch(s);
        self.write_gen += 1;
    }

    /// Whether a logged copy of `block` may hold data the origin does not hold durably (a
    /// dirty one, live or older).
    pub fn dirty_copy(&self, block: u64) -> bool {
        self.lookup(block).is_some_and(|s| self.state(s) == SlotState::Live { dirty: true })
            || self.stale.get(&block).is_some_and(|c| c.iter().any(|&(_, s)| !self.flag(s, RETIRED_CLEAN)))
    }

    /// The origin durably holds data newer than every logged copy of `block` (a write around
    /// the log covered it whole): its live copy leaves the index, and commits may clear every
    /// copy (see `clearable`).
    pub fn superseded(&mut self, block: u64) {
        if let Some(s) = self.lookup(block) {
            self.retire(s);
        }
        let copies: Vec<u32> = self.stale.get(&block).map_or_else(Vec::new, |c| c.iter().map(|&(_, s)| s).collect());
        for s in copies {
            self.set_flag(s, RETIRED_CLEAN, true);
        }
    }

    /// Marks a live slot clean if it still holds the copy written back (same sequence).
    pub fn mark_clean(&mut self, s: u32, seq: u64) -> bool {
        if self.state(s) != (SlotState::Live { dirty: true }) || self.slots[s as usize].seq != seq {
            return false;
        }
        self.set_flag(s, DIRTY, false);
        self.unlink(Which::Dirty, s);
        self.push(Which::Clean, s);
        true
    }

    /// The stale slots a commit may clear now: per block, the oldest one, and only when a
    /// torn commit that clears it cannot let an older copy win: the block's live copy is
    /// durable, or it has none and its newest stale copy is also on the origin.
    pub fn clearable(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (&block, copies) in &self.stale {
            let Some(&(_, oldest)) = copies.first() else { continue };
            let safe = match self.lookup(block) {
                Some(live) => self.flag(live, COMMITTED),
                None => copies.last().is_some_and(|&(_, newest)| self.flag(newest, RETIRED_CLEAN)),
            };
            if safe {
                out.push(oldest);
            }
        }
        out
    }

    /// Whether a commit writes slot `s`'s entry (rather than zeroes): live slots but read
    /// copies, stale and garbage ones unless this commit clears them (`clearing`).
    pub fn keeps_entry(&self, s: u32, clearing: impl Fn(u32) -> bool) -> bool {
        match self.state(s) {
            SlotState::Free => false,
            SlotState::Live { .. } => !self.flag(s, READ),
            SlotState::Stale | SlotState::Garbage => !clearing(s),
        }
    }

    /// A cleared slot's entry is zero on disk: the slot is free.
    pub fn cleared(&mut self, s: u32) {
        match self.state(s) {
            SlotState::Stale => {
                let Slot { block, seq, .. } = self.slots[s as usize];
                if let Some(copies) = self.stale.get_mut(&block) {
                    copies.remove(&(seq, s));
                    if copies.is_empty() {
                        self.stale.remove(&block);
                    }
                }
            }
            SlotState::Garbage => {}
            other => panic!("cleared slot {s} in state {other:?}"),
        }
        self.make_free(s);
    }

    fn make_free(&mut self, s: u32) {
        self.slots[s as usize] = Slot { prev: NONE, next: NONE, ..Slot::default() };
        self.bits[s as usize] = FREE;
        self.push(Which::Free, s);
    }

    /// Stops the volume after a failed flush (see `stopped`).
    pub fn stop(&mut self, why: String, log_device: bool) {
        self.log_suspect |= log_device;
        self.stopped.get_or_insert(why);
    }

    /// Refuses writes and flushes once stopped.
    pub fn check_running(&self) -> strata_io::Result<()> {
        match &self.stopped {
            None => Ok(()),
            Some(why) => Err(strata_io::Error::new(
                strata_io::ErrorKind::Io,
                format!(
                    "writecache stopped after a failed flush ({why}); it accepts no writes or flushes until restarted"
                ),
            )),
        }
    }

    /// Whether `block` has any copy in the log (live or with an entry on disk).
    pub fn logged_anywhere(&self, block: u64) -> bool {
        self.lookup(block).is_some() || self.stale.contains_key(&block)
    }

    /// Free and dirty slots.
    pub fn counts(&self) -> (u64, u64) {
        (self.free.len, self.dirty.len)
    }

    fn list(&mut self, l: Which) -> &mut List {
        match l {
            Which::Free => &mut self.free,
            Which::Dirty => &mut self.dirty,
            Which::Clean => &mut self.clean,
        }
    }

    fn push(&mut self, l: Which, s: u32) {
        let tail = self.list(l).tail;
        self.slots[s as usize].prev = tail;
        self.slots[s as usize].next = NONE;
        if tail == NONE {
            self.list(l).head = s;
        } else {
            self.slots[tail as usize].next = s;
        }
        let list = self.list(l);
        list.tail = s;
        list.len += 1;
    }

    fn unlink(&mut self, l: Which, s: u32) {
        let Slot { prev, next, .. } = self.slots[s as usize];
        if prev == NONE {
            self.list(l).head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NONE {
            self.list(l).tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        self.slots[s as usize].prev = NONE;
        self.slots[s as usize].next = NONE;
        self.list(l).len -= 1;
    }

    /// The invariants; returns the first one broken.
    pub fn check(&self) -> Result<(), String> {
        let mut on = vec![None; self.slots.len()];
        for (name, list) in [("free", &self.free), ("dirty", &self.dirty), ("clean", &self.clean)] {
            let mut n = 0;
            let mut prev = NONE;
            let mut last_seq = 0;
            for s in self.walk(list.head) {
                if let Some(other) = on[s as usize].replace(name) {
                    return Err(format!("slot {s} on the {other} list and the {name} list"));
                }
                if self.slots[s as usize].prev != prev {
                    return Err(format!("slot {s}: broken back link on the {name} list"));
                }
                if name == "dirty" {
                    let seq = self.slots[s as usize].seq;
                    if seq <= last_seq {
                        return Err(format!("dirty list out of write order at slot {s}"));
                    }
                    last_seq = seq;
                }
                prev = s;
                n += 1;
                if n > self.slots.len() as u64 {
                    return Err(format!("the {name} list loops"));
                }
            }
            if prev != list.tail || n != list.len {
                return Err(format!("the {name} list's tail or length is wrong"));
            }
        }
        let mut live = 0;
        for s in 0..self.slots.len() as u32 {
            let Slot { block, seq, .. } = self.slots[s as usize];
            let want = match self.state(s) {
                SlotState::Free => Some("free"),
                SlotState::Live { dirty } => {
                    live += 1;
                    if self.lookup(block) != Some(s) {
                        return Err(format!("slot {s} live for block {block} but the index says otherwise"));
                    }
                    Some(if dirty { "dirty" } else { "clean" })
                }
                SlotState::Stale => {
                    if !self.stale.get(&block).is_some_and(|v| v.contains(&(seq, s))) {
                        return Err(format!("stale slot {s} not listed under block {block}"));
                    }
                    if let Some(l) = self.lookup(block) {
                        if self.slots[l as usize].seq < seq {
                            return Err(format!("block {block}: stale slot {s} is newer than live slot {l}"));
                        }
                    }
                    None
                }
                SlotState::Garbage => None,
            };
            if on[s as usize] != want {
                return Err(format!("slot {s} in state {:?} is on the {:?} list", self.state(s), on[s as usize]));
            }
        }
        if self.index.len() != live {
            return Err(format!("the index holds {} blocks but {live} slots are live", self.index.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_books_take_at_most_40_bytes_a_slot() {
        for slots in [1u64 << 10, 1 << 20] {
            let st = State::new(slots).unwrap();
            let per_slot = st.heap_bytes() as f64 / slots as f64;
            assert!(per_slot <= 40.0, "{slots} slots: {per_slot} bytes each");
            st.check().unwrap();
        }
    }

    #[test]
    fn books_that_cannot_be_had_are_an_error_not_an_abort() {
        let e = State::new(u64::MAX).err().expect("no machine holds these books");
        assert_eq!(e.kind, strata_io::ErrorKind::NoMemory);
        assert!(e.context.contains("a larger block size"), "{}", e.context);
    }

    #[test]
    fn lists_and_index_follow_installs_overwrites_cleaning_and_retiring() {
        let mut st = State::new(8).unwrap();
        let a = st.alloc().unwrap();
        st.install(100, a, 1, false);
        let b = st.alloc().unwrap();
        st.install(200, b, 2, true);
        assert_eq!(st.dirty_oldest().map(|(_, s)| s).collect::<Vec<_>>(), [a, b]);
        assert_eq!((st.lookup(100), st.lookup(200), st.lookup(300)), (Some(a), Some(b), None));
        assert!(st.zero(b) && !st.zero(a));
        // Overwriting block 100: the new copy is live, the old one (never on disk) free again.
        let c = st.alloc().unwrap();
        st.install(100, c, 3, false);
        assert_eq!(st.lookup(100), Some(c));
        assert_eq!(st.state(a), SlotState::Free);
        assert_eq!(st.dirty_oldest().map(|(_, s)| s).collect::<Vec<_>>(), [b, c]);
        // Written back: clean, in the order cleaned; an old sequence number is refused.
        assert!(!st.mark_clean(c, 1));
        assert!(st.mark_clean(c, st.slot(c).seq) && st.mark_clean(b, st.slot(b).seq));
        assert_eq!(st.evictable().collect::<Vec<_>>(), [c, b]);
        assert_eq!(st.counts(), (6, 0));
        // A committed entry retired becomes stale, then free once cleared.
        st.written_by(c, 1);
        st.committed(c, st.slot(c).seq);
        st.retire(c);
        assert_eq!(st.state(c), SlotState::Stale);
        assert_eq!(st.clearable(), [c]);
        st.cleared(c);
        assert_eq!((st.state(c), st.lookup(100), st.counts()), (SlotState::Free, None, (7, 0)));
        // A pinned free slot is not handed out.
        st.pin(c);
        let next = st.alloc().unwrap();
        assert_ne!(next, c);
        st.unalloc(next);
        st.unpin(c);
        st.check().unwrap();
    }
}
