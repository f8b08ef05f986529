//! Our checker: what thin_check checks, over the raw metadata blocks, without building the
//! trees in memory. The superblock, the space maps and the two small trees above the
//! devices' own (the top-level mapping tree and the details tree) are read and checked as
//! `open` reads them. Then every block the metadata space map counts in use is read in
//! device order, in large reads, and checked on its own as a node of a device's tree
//! (checksum, self-named number, structure, key order, mappings within the data device);
//! a leaf's mappings are counted there and then. A walk from the devices' roots over what
//! was kept (internal nodes whole, a few facts per leaf in a flat vector indexed by block)
//! then checks what depends on a node's place (a non-root node at least a third full, its
//! lowest key not below its parent's key for it) and counts the references to every node:
//! a node reached again only has its count raised (a shared subtree is walked once, as
//! thin_check walks it). A block referenced but counted free is read then, alone; a leaf
//! no walk reached (a leak) has its mappings uncounted.
//!
//! The counts are then compared with the space maps. A count below the references is an
//! error (a block would be reused while still mapped); a count above them is a leak,
//! reported but not an error (as thin_check). The same counting checks a pool open in
//! memory (`check_counts`). Nothing is ever written.

use crate::btree::{corrupt, not_loaded, Tm};
use crate::format::{
    check_fill, le64, unpack_mapping, DeviceDetails, NodeHeader, LEAF_NODE, NEEDS_CHECK, NODE_HEADER, SUPERBLOCK,
};
use crate::meta::{
    check_bottom, check_lowest, devices, out_of_range, read_block, read_in_use, read_tops, unknown, DevId, Maps,
    Metadata,
};
use crate::sm::SpaceMap;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use strata_io::{BlockDev, Result};

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub devices: usize,
    pub mapped_blocks: u64,
    pub metadata_blocks_used: u64,
    pub data_blocks_used: u64,
}

impl Report {
    pub fn clean(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Checks the pool on `dev`: a damaged block or structure is an error in the report (the
/// first one found, alone), as are counts below the references.
pub async fn check(dev: &dyn BlockDev) -> Report {
    check_dev(dev).await.unwrap_or_else(|e| Report { errors: vec![e.context], ..Report::default() })
}

async fn check_dev(dev: &dyn BlockDev) -> Result<Report> {
    let maps = Maps::read(dev).await?;
    // Features it does not know would be misread as damage, or damage as sound.
    if let Some(why) = maps.sb.unknown_features() {
        return Err(strata_io::Error::new(strata_io::ErrorKind::Invalid, why));
    }
    let mut tm = Tm::nodes(read_tops(dev, &maps.sb, maps.limits()).await?);
    let details = devices(&tm, &maps.sb)?;
    let mut c = Counter::new(maps.limits(), &maps.blocks())?;
    c.tops(&tm, maps.sb.data_mapping_root, maps.sb.device_details_root)?;
    read_in_use(dev, &maps.md, |b, bytes| {
        if c.unread(b) && c.take(b, bytes) {
            tm.blocks.insert(b, Box::from(bytes));
        }
    })
    .await?;
    loop {
        let wanted = c.walk(&tm)?;
        if wanted.is_empty() {
            break;
        }
        for b in wanted {
            let bytes = read_block(dev, b).await?;
            if c.take(b, &bytes) {
                tm.blocks.insert(b, Box::from(&bytes[..]));
            }
        }
    }
    for b in c.unreached() {
        c.untake(&read_block(dev, b).await?);
    }
    let mut r = c.report(&tm, &maps.md, &maps.data, &details, &maps.sb.record.deleting)?;
    // A mapping's time is the pool's time when it was made (24 bits of it, which the pool's
    // has not outgrown here). One from later passes for made after every snapshot, so a
    // write to it goes in place though a snapshot shares it, in dm-thin as here (thin_check
    // does not look).
    let latest = c.latest.last_key_value().map_or(0, |(&t, _)| t);
    if maps.sb.time < 1 << 24 && latest > maps.sb.time {
        r.warnings.push(format!(
            "a mapping was made at time {latest}, after the pool's time {}: the times do not tell which blocks snapshots share",
            maps.sb.time
        ));
    }
    if maps.sb.flags & NEEDS_CHECK != 0 {
        r.warnings.push("the needs_check flag is set: the pool is not written until it is cleared".into());
    }
    Ok(r)
}

/// Compares the space maps of an open pool with the references its trees hold (the nodes
/// in memory checked as `check` checks those it reads; a node not in memory is an error).
pub fn check_counts(m: &Metadata) -> Report {
    count_in_memory(m).unwrap_or_else(|e| Report {
        errors: vec![e.context],
        devices: m.devices().len(),
        ..Report::default()
    })
}

fn count_in_memory(m: &Metadata) -> Result<Report> {
    let mut c = Counter::new(m.limits(), &m.space_map_blocks())?;
    let (root, details_root) = m.roots();
    c.tops(&m.tm, root, details_root)?;
    for (&b, bytes) in &m.tm.blocks {
        if c.unread(b) {
            c.take(b, bytes);
        }
    }
    if let Some(&b) = c.walk(&m.tm)?.first() {
        return Err(not_loaded(b));
    }
    for b in c.unreached() {
        c.untake(&m.tm.blocks[&b]);
    }
    c.report(&m.tm, &m.tm.md, &m.tm.data, m.devices(), m.deleting())
}

/// What the count knows of one metadata block.
#[derive(Debug, Clone, Copy, Default)]
struct Info {
    /// The node's lowest key (when it has entries).
    key: u64,
    /// References to the block found so far.
    refs: u32,
    /// The node's entries, and a third of as many as it can hold.
    len: u16,
    third: u8,
    /// Its kind (`KIND` bits) and whether a walk reached it (`REACHED`).
    state: u8,
}

/// Not read yet.
const UNREAD: u8 = 0;
/// A sound leaf of a device's tree, its mappings counted.
const LEAF: u8 = 1;
/// A sound internal node of a device's tree, its bytes kept for the walk.
const INTERNAL: u8 = 2;
/// Damaged: `Counter::bad` says how.
const BAD: u8 = 3;
/// The superblock, a block of the space maps, or a node of the trees above the devices'.
const OTHER: u8 = 4;
const KIND: u8 = 7;
const REACHED: u8 = 8;

/// What `Counter::entries` remembers of a node whose entries it is counting.
const WALKING: u64 = u64::MAX;

/// References counted per block, by a walk over nodes checked as they come.
struct Counter {
    data_blocks: u64,
    md: Vec<Info>,
    data: DataRefs,
    /// What is wrong with each damaged block read (reported if a walk reaches it).
    bad: FxHashMap<u64, String>,
    /// Nodes of the devices' trees reached and not walked yet: (block, whether a tree's
    /// root, the parent's key for it).
    todo: Vec<(u64, bool, Option<u64>)>,
    /// Those of them waiting for their blocks to be read.
    waiting: Vec<(u64, bool, Option<u64>)>,
    /// Each device's tree root, from the top-level tree's leaves.
    roots: BTreeMap<u64, u64>,
    /// The leaves read, by the latest time of a mapping in each (a leaf found leaked is
    /// taken out again: its times say nothing of the pool's).
    latest: BTreeMap<u32, u64>,
}

impl Counter {
    /// A count for `limits` (metadata and data blocks there are) holding one reference to
    /// the superblock and one to each of the space maps' `blocks`.
    fn new(limits: (u64, u64), blocks: &[u64]) -> Result<Counter> {
        let (md_blocks, data_blocks) = limits;
        let mut c = Counter {
            data_blocks,
            md: vec![Info::default(); md_blocks as usize],
            data: DataRefs { low: vec![0; data_blocks as usize], high: FxHashMap::default() },
            bad: FxHashMap::default(),
            todo: Vec::new(),
            waiting: Vec::new(),
            roots: BTreeMap::new(),
            latest: BTreeMap::new(),
        };
        if let Some(sb) = c.md.get_mut(SUPERBLOCK as usize) {
            *sb = Info { refs: 1, state: OTHER | REACHED, ..Info::default() };
        }
        for &b in blocks {
            let i = c.reference(b)?;
            i.state = OTHER | REACHED;
        }
        Ok(c)
    }

    fn reference(&mut self, b: u64) -> Result<&mut Info> {
        match self.md.get_mut(b as usize).filter(|_| b != SUPERBLOCK) {
            Some(i) => {
                i.refs += 1;
                Ok(i)
            }
            None => Err(out_of_range(b)),
        }
    }

    /// Counts a reference to node `b` of a device's tree, and queues it the first time.
    fn reach(&mut self, b: u64, root: bool, lo: Option<u64>) -> Result<()> {
        let i = self.reference(b)?;
        if i.state & REACHED == 0 {
            i.state |= REACHED;
            self.todo.push((b, root, lo));
        }
        Ok(())
    }

    /// Walks the top-level mapping tree at `root` (its leaves hold the devices' roots, which
    /// are reached) and the details tree at `details_root`, their nodes in `tm`.
    fn tops(&mut self, tm: &Tm, root: u64, details_root: u64) -> Result<()> {
        self.top(tm, root, true)?;
        self.top(tm, details_root, false)
    }

    fn top(&mut self, tm: &Tm, b: u64, holds_roots: bool) -> Result<()> {
        let i = self.reference(b)?;
        if i.state & REACHED != 0 {
            return Ok(());
        }
        i.state = OTHER | REACHED;
        let n = tm.view(b)?;
        for k in 0..n.len {
            if !n.leaf {
                self.top(tm, n.val64(k), holds_roots)?;
            } else if holds_roots {
                self.roots.insert(n.key(k), n.val64(k));
                self.reach(n.val64(k), true, None)?;
            }
        }
        Ok(())
    }

    /// Whether block `b` is one not read yet (nor known for another structure's).
    fn unread(&self, b: u64) -> bool {
        self.md.get(b as usize).is_some_and(|i| i.state & KIND == UNREAD)
    }

    /// Checks block `b` on its own as a node of a device's tree, and counts its mappings if
    /// it is a leaf. True for an internal node, whose bytes the walk needs.
    fn take(&mut self, b: u64, bytes: &[u8]) -> bool {
        let reached = self.md[b as usize].state & REACHED;
        let h = match check_bottom(bytes, b, true, None, self.data_blocks) {
            Ok(h) => h,
            Err(e) => {
                self.md[b as usize].state = BAD | reached;
                self.bad.insert(b, e.context);
                return false;
            }
        };
        let leaf = h.flags == LEAF_NODE;
        let i = &mut self.md[b as usize];
        i.key = le64(bytes, NODE_HEADER);
        i.len = h.nr_entries as u16;
        i.third = (h.max_entries / 3) as u8;
        i.state = reached | if leaf { LEAF } else { INTERNAL };
        if leaf {
            let mut latest = 0;
            for (d, t) in mapped(bytes, &h) {
                self.data.inc(d);
                latest = latest.max(t);
            }
            *self.latest.entry(latest).or_default() += 1;
        }
        !leaf
    }

    /// Walks the devices' trees from the nodes reached and not walked yet; returns the
    /// blocks to read (`take`) before walking on, none when done.
    fn walk(&mut self, tm: &Tm) -> Result<Vec<u64>> {
        self.todo.append(&mut self.waiting);
        while let Some((b, root, lo)) = self.todo.pop() {
            let i = self.md[b as usize];
            match i.state & KIND {
                UNREAD => {
                    self.waiting.push((b, root, lo));
                    continue;
                }
                BAD => return Err(corrupt(self.bad[&b].clone())),
                _ => {}
            }
            if !root {
                check_fill(b, i.len as usize, i.third as usize * 3).map_err(corrupt)?;
            }
            check_lowest(b, i.len as usize, i.key, lo)?;
            if i.state & KIND == INTERNAL {
                let n = tm.view(b)?;
                for k in 0..n.len {
                    self.reach(n.val64(k), false, Some(n.key(k)))?;
                }
            }
        }
        Ok(self.waiting.iter().map(|w| w.0).collect())
    }

    /// The leaves read and counted that no walk reached.
    fn unreached(&self) -> Vec<u64> {
        (0..self.md.len() as u64).filter(|&b| self.md[b as usize].state == LEAF).collect()
    }

    /// Uncounts the mappings of a leaf no walk reached (`bytes`, as `take` had them).
    fn untake(&mut self, bytes: &[u8]) {
        let mut latest = 0;
        for (d, t) in mapped(bytes, &NodeHeader::decode(bytes)) {
            self.data.dec(d);
            latest = latest.max(t);
        }
        if let std::collections::btree_map::Entry::Occupied(mut leaves) = self.latest.entry(latest) {
            *leaves.get_mut() -= 1;
            if *leaves.get() == 0 {
                leaves.remove();
            }
        }
    }

    /// The mapped blocks under node `b` (a shared node's counted once, then remembered;
    /// [`WALKING`] while its own are counted, so a node found again below itself is damage).
    fn entries(&self, tm: &Tm, b: u64, memo: &mut FxHashMap<u64, u64>) -> Result<u64> {
        let i = self.md[b as usize];
        if i.state & KIND == LEAF {
            return Ok(i.len as u64);
        }
        match memo.get(&b) {
            Some(&WALKING) => return Err(corrupt(format!("block {b}: the tree loops back to it"))),
            Some(&n) => return Ok(n),
            None => memo.insert(b, WALKING),
        };
        let node = tm.view(b)?;
        let mut n = 0;
        for k in 0..node.len {
            n += self.entries(tm, node.val64(k), memo)?;
        }
        memo.insert(b, n);
        Ok(n)
    }

    /// The counts against the space maps, and each device's mappings against its details.
    fn report(
        &self,
        tm: &Tm,
        md: &SpaceMap,
        data: &SpaceMap,
        details: &BTreeMap<DevId, DeviceDetails>,
        deleting: &std::collections::BTreeSet<DevId>,
    ) -> Result<Report> {
        let mut r = Report { devices: details.len(), ..Report::default() };
        let mut memo = FxHashMap::default();
        for (&id, d) in details {
            let root = self.roots.get(&(id as u64)).copied().ok_or_else(|| unknown(id))?;
            let n = self.entries(tm, root, &mut memo)?;
            r.mapped_blocks += n;
            // A device being deleted keeps its details while its tree shrinks.
            if n != d.mapped_blocks && !deleting.contains(&id) {
                r.warnings
                    .push(format!("device {id}: details say {} mapped blocks, its tree holds {n}", d.mapped_blocks));
            }
        }
        r.metadata_blocks_used = compare(&mut r, "metadata", md, self.md.iter().map(|i| i.refs));
        r.data_blocks_used = compare(&mut r, "data", data, (0..self.data.low.len() as u64).map(|d| self.data.get(d)));
        Ok(r)
    }
}

/// References to each data block: a byte each (a small array is much of the count's speed:
/// it stays in the caches), the excess over 255 apart.
struct DataRefs {
    low: Vec<u8>,
    high: FxHashMap<u64, u32>,
}

impl DataRefs {
    fn inc(&mut self, d: u64) {
        let low = &mut self.low[d as usize];
        match low.checked_add(1) {
            Some(n) => *low = n,
            None => *self.high.entry(d).or_default() += 1,
        }
    }
    fn dec(&mut self, d: u64) {
        match self.high.get_mut(&d).filter(|_| self.low[d as usize] == u8::MAX) {
            Some(1) => drop(self.high.remove(&d)),
            Some(n) => *n -= 1,
            None => self.low[d as usize] -= 1,
        }
    }
    fn get(&self, d: u64) -> u32 {
        match self.low[d as usize] {
            u8::MAX => u8::MAX as u32 + self.high.get(&d).copied().unwrap_or(0),
            n => n as u32,
        }
    }
}

/// The data blocks a sound leaf of a device's tree maps, and the times they were mapped.
fn mapped<'a>(bytes: &'a [u8], h: &NodeHeader) -> impl Iterator<Item = (u64, u32)> + 'a {
    let v0 = NODE_HEADER + 8 * h.max_entries as usize;
    bytes[v0..v0 + 8 * h.nr_entries as usize].chunks_exact(8).map(|v| unpack_mapping(le64(v, 0)))
}

/// Compares the references to each block (`refs`, in block order) with `sm`'s counts;
/// returns the blocks referenced.
fn compare(r: &mut Report, what: &str, sm: &SpaceMap, refs: impl Iterator<Item = u32>) -> u64 {
    let (mut leaked, mut used) = (0u64, 0u64);
    for (b, n) in refs.enumerate() {
        let c = sm.count(b as u64);
        if c < n {
            r.errors.push(format!("{what} reference counts differ for block {b}: {n} references, count {c}"));
        } else if c > n {
            leaked += 1;
        }
        used += (n > 0) as u64;
    }
    if leaked > 0 {
        r.warnings.push(format!("{leaked} {what} blocks leaked (counted above their references)"));
    }
    used
}
