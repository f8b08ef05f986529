//! Slot bookkeeping: which slot holds the newest logged copy of each origin block, which
//! slots are free, which hold older copies whose entries must be cleared on disk before the
//! slot can be reused, and which entry pages the next commit writes.
//!
//! The rules that keep an older copy from ever winning (checked by `State::check`):
//! - a slot is reused only once its entry is zero on disk (`Free`);
//! - the entries of a block's older copies (`Stale`) are cleared one per commit, oldest
//!   first, so a torn commit can only leave a newer copy than the one it removed;
//! - a block goes to the origin directly only once it has no logged copy on disk at all.

use crate::format::{Entry, ENTRIES_PER_PAGE};
use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, HashSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Unused; its entry is zero on disk (or never committed).
    Free,
    /// The newest copy of `entry.block`.
    Live { dirty: bool },
    /// An older copy whose entry may be on disk; cleared by a commit, then `Free`.
    Stale,
    /// An entry recovery could not trust (torn, data checksum failed, out of range); cleared
    /// by the first commit.
    Garbage,
}

#[derive(Debug, Clone)]
pub struct Slot {
    pub state: SlotState,
    /// The entry as the next commit writes it (and, once `on_disk`, as the media may hold it).
    pub entry: Entry,
    /// A commit has written (or is writing) this entry: superseding the slot needs a clear.
    pub on_disk: bool,
    /// The commit that wrote this entry has completed: the entry is durable.
    pub committed: bool,
    /// The slot was clean (its data written back and flushed on the origin) when it left the
    /// index: the origin holds data at least as new as it.
    pub retired_clean: bool,
    /// Reads and write-backs in flight from the slot; a pinned slot is not reused.
    pub pins: u32,
}

#[derive(Default)]
pub struct State {
    pub slots: Vec<Slot>,
    /// Origin block → slot of its newest copy.
    pub index: FxHashMap<u64, u32>,
    pub free: Vec<u32>,
    /// Block → (seq, slot) of its stale copies with entries possibly on disk.
    pub stale: FxHashMap<u64, BTreeSet<(u64, u32)>>,
    pub garbage: Vec<u32>,
    /// Dirty live slots, oldest write first.
    pub dirty: BTreeSet<(u64, u32)>,
    /// Clean live slots, oldest write first (evicted in this order).
    pub clean: BTreeSet<(u64, u32)>,
    pub dirty_pages: BTreeSet<u64>,
    /// Last sequence number handed out.
    pub seq: u64,
    /// Last commit number handed out.
    pub commit: u32,
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
    pub fn new(slots: u64) -> State {
        let slot = Slot {
            state: SlotState::Free,
            entry: Entry::default(),
            on_disk: false,
            committed: false,
            retired_clean: false,
            pins: 0,
        };
        State { slots: vec![slot; slots as usize], free: (0..slots as u32).rev().collect(), ..State::default() }
    }

    pub fn touch(&mut self, slot: u32) {
        self.dirty_pages.insert(slot as u64 / ENTRIES_PER_PAGE);
    }

    /// A free slot nobody is reading, if any.
    pub fn alloc(&mut self) -> Option<u32> {
        let i = self.free.iter().rposition(|&s| self.slots[s as usize].pins == 0)?;
        let s = self.free.swap_remove(i);
        debug_assert_eq!(self.slots[s as usize].state, SlotState::Free);
        Some(s)
    }

    /// Records that slot `s` now holds the newest copy of `block` (data already on the fast
    /// device); the previous copy, if any, becomes stale. Returns the generation a flush must
    /// reach to make it durable.
    pub fn install(&mut self, block: u64, s: u32, data_crc: u32, zero: bool) -> u64 {
        self.seq += 1;
        let seq = self.seq;
        let flags = if zero { crate::format::FLAG_ZERO } else { 0 };
        let slot = &mut self.slots[s as usize];
        slot.state = SlotState::Live { dirty: true };
        slot.entry = Entry { block, seq, commit: 0, flags, data_crc };
        slot.on_disk = false;
        slot.committed = false;
        slot.retired_clean = false;
        self.dirty.insert((seq, s));
        self.touch(s);
        if let Some(old) = self.index.insert(block, s) {
            self.retire(old);
        }
        self.write_gen += 1;
        self.write_gen
    }

    /// Takes live slot `s` out of the index: free at once if its entry never reached the
    /// disk, otherwise stale until a commit clears it.
    pub fn retire(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        let SlotState::Live { dirty } = slot.state else { panic!("retire of slot {s} in state {:?}", slot.state) };
        let e = slot.entry;
        if dirty {
            self.dirty.remove(&(e.seq, s));
        } else {
            self.clean.remove(&(e.seq, s));
        }
        if self.index.get(&e.block) == Some(&s) {
            self.index.remove(&e.block);
        }
        slot.retired_clean = !dirty;
        if slot.on_disk {
            slot.state = SlotState::Stale;
            self.stale.entry(e.block).or_default().insert((e.seq, s));
        } else {
            slot.state = SlotState::Free;
            slot.entry = Entry::default();
            self.free.push(s);
        }
        if !dirty {
            // The origin holds this copy, so it holds data at least as new as every older one.
            if let Some(copies) = self.stale.get(&e.block) {
                let older: Vec<u32> = copies.iter().map(|&(_, o)| o).collect();
                for o in older {
                    self.slots[o as usize].retired_clean = true;
                }
            }
        }
        self.touch(s);
        self.write_gen += 1;
    }

    /// Marks a live slot clean if it still holds the copy written back (same sequence).
    pub fn mark_clean(&mut self, s: u32, seq: u64) -> bool {
        let slot = &mut self.slots[s as usize];
        if slot.state != (SlotState::Live { dirty: true }) || slot.entry.seq != seq {
            return false;
        }
        slot.state = SlotState::Live { dirty: false };
        self.dirty.remove(&(seq, s));
        self.clean.insert((seq, s));
        true
    }

    /// The stale slots a commit may clear now: per block, the oldest one, and only when a
    /// torn commit that clears it cannot let an older copy win: the block's live copy is
    /// durable, or it has none and its newest stale copy is also on the origin.
    pub fn clearable(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (&block, copies) in &self.stale {
            let Some(&(_, oldest)) = copies.first() else { continue };
            let safe = match self.index.get(&block) {
                Some(&live) => self.slots[live as usize].committed,
                None => copies.last().is_some_and(|&(_, newest)| self.slots[newest as usize].retired_clean),
            };
            if safe {
                out.push(oldest);
            }
        }
        out
    }

    /// A cleared slot's entry is zero on disk: the slot is free.
    pub fn cleared(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        match slot.state {
            SlotState::Stale => {
                let e = slot.entry;
                if let Some(copies) = self.stale.get_mut(&e.block) {
                    copies.remove(&(e.seq, s));
                    if copies.is_empty() {
                        self.stale.remove(&e.block);
                    }
                }
            }
            SlotState::Garbage => {}
            other => panic!("cleared slot {s} in state {other:?}"),
        }
        let slot = &mut self.slots[s as usize];
        slot.state = SlotState::Free;
        slot.entry = Entry::default();
        slot.on_disk = false;
        slot.committed = false;
        self.free.push(s);
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
        self.index.contains_key(&block) || self.stale.contains_key(&block)
    }

    pub fn counts(&self) -> (u64, u64) {
        (self.free.len() as u64, self.dirty.len() as u64)
    }

    /// The invariants; returns the first one broken.
    pub fn check(&self) -> Result<(), String> {
        let mut free = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            let s = i as u32;
            let e = slot.entry;
            match slot.state {
                SlotState::Free => free += 1,
                SlotState::Live { dirty } => {
                    if self.index.get(&e.block) != Some(&s) {
                        return Err(format!("slot {s} live for block {} but the index says otherwise", e.block));
                    }
                    let (set, other) = if dirty { (&self.dirty, &self.clean) } else { (&self.clean, &self.dirty) };
                    if !set.contains(&(e.seq, s)) || other.contains(&(e.seq, s)) {
                        return Err(format!("slot {s} in the wrong dirty/clean queue"));
                    }
                }
                SlotState::Stale => {
                    if !self.stale.get(&e.block).is_some_and(|v| v.contains(&(e.seq, s))) {
                        return Err(format!("stale slot {s} not listed under block {}", e.block));
                    }
                    if let Some(&l) = self.index.get(&e.block) {
                        if self.slots[l as usize].entry.seq < e.seq {
                            return Err(format!("block {}: stale slot {s} is newer than live slot {l}", e.block));
                        }
                    }
                }
                SlotState::Garbage => {}
            }
        }
        if free != self.free.len() {
            return Err(format!("{free} free slots but {} on the free list", self.free.len()));
        }
        if self.index.len() != self.dirty.len() + self.clean.len() {
            return Err("index and dirty/clean queues disagree".into());
        }
        Ok(())
    }
}
