//! A pool's metadata: opening it from a metadata device (every live B-tree node and both
//! space maps are read into memory, checked as thin_check checks them), creating an empty
//! one, the operations on volumes (create, snapshot, delete) and on mappings, and commit.
//!
//! A commit writes, into blocks free in the last committed state, every node this
//! transaction made, the space maps' changed bitmaps and new indexes; the caller makes
//! those durable, then writes the superblock (`Commit`). Blocks freed by a transaction are
//! not reused until the commit that frees them is durable, so a crash at any point leaves
//! the previous commit whole.

use crate::btree::{build_shape, build_tree, corrupt, not_loaded, view_of, Blocks, Descent, Refs, Tm};
use crate::format::*;
use crate::sm::{nr_bitmaps, SpaceMap};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};
use strata_io::{signature, BlockDev, Buf, Error, ErrorKind, Result};

/// A thin device's id (dm-thin's 24-bit dev_id).
pub type DevId = u32;
pub const MAX_DEV_ID: DevId = (1 << 24) - 1;

/// Where a virtual block lives, if mapped: (data block, time).
pub type Mapping = Option<(u64, u32)>;

/// The pool's metadata in memory.
pub struct Metadata {
    pub tm: Tm,
    /// The superblock as last committed (or read); roots are refreshed at each commit.
    pub sb: Superblock,
    /// Its bytes on the device, and those of the commit prepared last (the next commit's
    /// superblock writes are made from them: see `Superblock::writes`).
    image: Vec<u8>,
    prepared_image: Vec<u8>,
    /// The current roots of the two-level mapping tree and of the device-details tree.
    root: u64,
    details_root: u64,
    details: BTreeMap<DevId, DeviceDetails>,
    changed: BTreeSet<DevId>,
    /// Blocks of the space maps' indexes and overflow trees as last written (freed and
    /// rewritten at each commit).
    sm_blocks: Vec<u64>,
    /// Something changed since the last commit.
    dirty: bool,
    /// The leaves of the devices' mapping trees are read when first needed (`missing`).
    lazy: bool,
}

/// A prepared commit: blocks to write, then (after they and the data are durable) the
/// superblock, in one write or two.
pub struct Commit {
    pub writes: Blocks,
    pub superblocks: Vec<Vec<u8>>,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Invalid, msg)
}

pub(crate) async fn read_block(dev: &dyn BlockDev, b: u64) -> Result<Buf> {
    dev.read(b * BLOCK as u64, Buf::zeroed(BLOCK)).await
}

impl Metadata {
    /// An empty pool for a metadata device of `md_bytes` and a data device of `data_bytes`
    /// in blocks of `data_block_bytes`.
    pub fn create(md_bytes: u64, data_bytes: u64, data_block_bytes: u64) -> Result<Metadata> {
        if !valid_data_block(data_block_bytes) {
            return Err(invalid(format!(
                "data block size {data_block_bytes} bytes: dm-thin takes 64 KiB to 1 GiB, a multiple of 64 KiB"
            )));
        }
        let md_blocks = (md_bytes / BLOCK as u64).min(MAX_METADATA_BLOCKS);
        if md_blocks < MIN_METADATA_BLOCKS {
            return Err(invalid(format!("a metadata device of {md_bytes} bytes is too small (at least 256 KiB)")));
        }
        let data_blocks = data_bytes / data_block_bytes;
        if data_blocks == 0 || data_blocks >= MAX_DATA_BLOCKS {
            return Err(invalid(format!("a data device of {data_bytes} bytes holds no {data_block_bytes}-byte block")));
        }
        let mut tm = Tm {
            blocks: FxHashMap::default(),
            shadowed: FxHashSet::default(),
            md: SpaceMap::new(md_blocks),
            data: SpaceMap::new(data_blocks),
        };
        tm.md.inc(SUPERBLOCK);
        let root = tm.empty_tree(8)?;
        let details_root = tm.empty_tree(DETAILS_BYTES)?;
        let sb = Superblock {
            version: VERSION,
            data_block_size: (data_block_bytes / 512) as u32,
            metadata_block_size: BLOCK_SECTORS,
            metadata_nr_blocks: md_blocks,
            ..Superblock::default()
        };
        Ok(Metadata {
            tm,
            sb,
            image: vec![0; BLOCK],
            prepared_image: Vec::new(),
            root,
            details_root,
            details: BTreeMap::new(),
            changed: BTreeSet::new(),
            sm_blocks: Vec::new(),
            dirty: true,
            lazy: false,
        })
    }

    /// Writes a new empty pool onto `dev` for a data device of `data_bytes`, refusing a
    /// device whose first 4 KiB are not zero unless `force`.
    pub async fn format(
        dev: &dyn BlockDev,
        data_bytes: u64,
        data_block_bytes: u64,
        data_spec: &str,
        force: bool,
    ) -> Result<Metadata> {
        if dev.size() < BLOCK as u64 {
            return Err(invalid(format!("{}: too small for a pool's metadata", dev.describe())));
        }
        let first = read_block(dev, SUPERBLOCK).await?;
        if !force {
            if let Some(what) = signature::recognise_any(&signature::head(dev).await?) {
                return Err(invalid(format!("{}: the device holds {what}; --force overwrites it", dev.describe())));
            }
        }
        let mut m = Metadata::create(dev.size(), data_bytes, data_block_bytes)?;
        m.image = first.to_vec();
        m.set_data_spec(data_spec)?;
        if let Some(c) = m.prepare_commit()? {
            c.write(dev).await?;
        }
        m.committed();
        Ok(m)
    }

    /// Commits what changed (offline use: nothing else runs).
    pub async fn commit(&mut self, dev: &dyn BlockDev) -> Result<()> {
        if let Some(c) = self.prepare_commit()? {
            c.write(dev).await?;
            self.committed();
        }
        Ok(())
    }

    /// Reads a pool's metadata from `dev`, checking checksums, node structure and block
    /// numbers on the way. Nothing is written.
    pub async fn open(dev: &dyn BlockDev) -> Result<Metadata> {
        Metadata::open_with(dev, false).await
    }

    /// Reads a pool's metadata for serving: the superblock, the space maps, the details
    /// tree, the top-level mapping tree and the devices' trees down to the nodes above
    /// their leaves; the leaves (nearly every node) are read when first needed
    /// (`missing`, `load`). Nothing is written. Reference counts are not compared with the
    /// trees (that is `check`'s work, as it is thin_check's for dm-thin).
    pub async fn open_lazy(dev: &dyn BlockDev) -> Result<Metadata> {
        Metadata::open_with(dev, true).await
    }

    async fn open_with(dev: &dyn BlockDev, lazy: bool) -> Result<Metadata> {
        let Maps { sb, image, md, data, sm_blocks } = Maps::read(dev).await?;
        let limits = (md.nr_blocks(), data.nr_blocks());
        // The mapping and details trees, every node read and checked: the blocks the
        // metadata space map counts in use are read first, in device order and in large
        // reads; the trees are then walked over them (a block referenced but counted free is
        // read alone, and found damaged or short of references as before).
        let blocks = if lazy {
            let tops = Tm::nodes(read_tops(dev, &sb, limits).await?);
            let mut subtrees = Vec::new();
            tops.walk(sb.data_mapping_root, &mut |_, v| subtrees.push(le64(v, 0)))?;
            let mut loaded = tops.blocks;
            load_upper(dev, &subtrees, limits, &mut loaded).await?;
            loaded
        } else {
            let mut blocks = FxHashMap::default();
            blocks.reserve(md.allocated() as usize);
            read_in_use(dev, &md, |b, bytes| {
                blocks.insert(b, Box::from(bytes));
            })
            .await?;
            let roots = [(sb.data_mapping_root, Level::Top), (sb.device_details_root, Level::Details)];
            load_nodes(dev, &roots, limits, blocks, true).await?
        };
        let tm = Tm { blocks, shadowed: FxHashSet::default(), md, data };
        let details = devices(&tm, &sb)?;
        Ok(Metadata {
            root: sb.data_mapping_root,
            details_root: sb.device_details_root,
            sb,
            image,
            prepared_image: Vec::new(),
            tm,
            details,
            changed: BTreeSet::new(),
            sm_blocks,
            dirty: false,
            lazy,
        })
    }

    /// The nodes not read yet that a lookup of `vblock` in device `id` needs (its leaf), or
    /// with `siblings` a change to it (the leaves beside it too, for a rebalance), each with
    /// the lowest key its parent allows. Empty when all are in memory.
    pub fn missing(&self, id: DevId, vblock: u64, siblings: bool) -> Result<Vec<(u64, u64)>> {
        if !self.lazy {
            return Ok(Vec::new());
        }
        let mut b = self.subtree(id)?;
        let mut out = Vec::new();
        loop {
            let Some(n) = self.tm.blocks.get(&b).map(|_| self.tm.view(b)).transpose()? else {
                return Ok(out);
            };
            if n.leaf || n.len == 0 {
                return Ok(out);
            }
            // The last key not above `vblock` (or the first).
            let i = n.child(vblock).unwrap_or(0);
            let range = if siblings { i.saturating_sub(1)..(i + 2).min(n.len) } else { i..i + 1 };
            for j in range {
                if !self.tm.blocks.contains_key(&n.val64(j)) {
                    out.push((n.val64(j), n.key(j)));
                }
            }
            if !out.is_empty() {
                return Ok(out);
            }
            b = n.val64(i);
        }
    }

    /// Where virtual block `vblock` of device `id` lives (`lookup`), walking down its tree
    /// once; Err with the node to read first when the walk reaches one not in memory (with
    /// the lowest key its parent allows).
    pub fn lookup_or_missing(&self, id: DevId, vblock: u64) -> Result<std::result::Result<Mapping, Vec<(u64, u64)>>> {
        match self.tm.descend(self.subtree(id)?, vblock)? {
            Descent::Found(n, i) => Ok(Ok(Some(unpack_mapping(n.val64(i))))),
            Descent::Absent => Ok(Ok(None)),
            Descent::Unloaded(b, key) if self.lazy => Ok(Err(vec![(b, key)])),
            Descent::Unloaded(b, _) => Err(not_loaded(b)),
        }
    }

    /// The nodes not read yet that deleting device `id` drops (those it holds alone).
    pub fn missing_for_delete(&self, id: DevId) -> Result<Vec<(u64, u64)>> {
        if !self.lazy {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut todo = vec![self.subtree(id)?];
        while let Some(b) = todo.pop() {
            if self.tm.md.count(b) != 1 {
                continue;
            }
            let n = self.tm.view(b)?;
            if n.leaf {
                continue;
            }
            for i in 0..n.len {
                let c = n.val64(i);
                if !self.tm.blocks.contains_key(&c) {
                    if self.tm.md.count(c) == 1 {
                        out.push((c, n.key(i)));
                    }
                } else {
                    todo.push(c);
                }
            }
        }
        Ok(out)
    }

    /// Adds nodes read from the device (a device tree's nodes, not roots, checked as `open`
    /// checks them: `fetch`), unless already in memory (a node changed since is kept).
    pub fn load(&mut self, nodes: Vec<(u64, Box<[u8]>)>) {
        for (b, bytes) in nodes {
            self.tm.blocks.entry(b).or_insert(bytes);
        }
    }

    /// Every block the space maps themselves occupy (bitmaps, indexes, overflow trees).
    pub fn space_map_blocks(&self) -> Vec<u64> {
        space_map_blocks(&self.sm_blocks, &self.tm.md, &self.tm.data)
    }

    /// The current roots of the top-level mapping tree and of the device-details tree.
    pub fn roots(&self) -> (u64, u64) {
        (self.root, self.details_root)
    }

    /// strata's record (data spec, volume sizes) from the superblock's tail.
    pub fn record(&self) -> &Record {
        &self.sb.record
    }

    /// Records the data device's spec, for opening the pool by its metadata device alone.
    pub fn set_data_spec(&mut self, spec: &str) -> Result<()> {
        let r = Record { data_spec: spec.to_string(), ..self.sb.record.clone() };
        if !r.fits_one_more() {
            return Err(invalid(format!("the data spec {spec:?} is too long to record")));
        }
        self.sb.record.data_spec = spec.to_string();
        self.dirty = true;
        Ok(())
    }

    /// Records volume `id`'s size (dm-thin keeps none).
    pub fn set_volume_size(&mut self, id: DevId, bytes: u64) -> Result<()> {
        self.device(id)?;
        self.sb.record = self.record_with_size(id, bytes)?;
        self.dirty = true;
        Ok(())
    }

    /// The record with `id`'s size set, if the superblock has room for it.
    fn record_with_size(&self, id: DevId, bytes: u64) -> Result<Record> {
        let mut r = self.sb.record.clone();
        r.sizes.insert(id, bytes);
        if !r.fits() {
            return Err(invalid(format!(
                "no room left in the superblock to record the size of volume {id}: delete volumes to make room"
            )));
        }
        Ok(r)
    }

    /// Metadata blocks kept free for commits and deletions: provisioning and new devices
    /// stop below this.
    pub fn metadata_reserve(&self) -> u64 {
        (self.tm.md.nr_blocks() / 8).clamp(16, 256)
    }

    /// NoSpace if the metadata device is down to its reserve (`metadata_reserve`).
    pub fn check_metadata_room(&self) -> Result<()> {
        let (free, reserve) = (self.tm.md.allocatable(), self.metadata_reserve());
        if free >= reserve {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::NoSpace,
            format!(
                "the pool's metadata device is nearly full ({free} blocks free, {reserve} kept for commits and deletions): \
                 extend it (strata thin extend --metadata) or delete volumes"
            ),
        ))
    }

    /// The metadata and data blocks there are, as opened or created.
    pub fn limits(&self) -> (u64, u64) {
        (self.tm.md.nr_blocks(), self.tm.data.nr_blocks())
    }

    pub fn data_block_bytes(&self) -> u64 {
        self.sb.data_block_bytes()
    }

    pub fn dirty(&self) -> bool {
        self.dirty
    }

    pub fn time(&self) -> u32 {
        self.sb.time
    }

    pub fn transaction_id(&self) -> u64 {
        self.sb.transaction_id
    }

    pub fn devices(&self) -> &BTreeMap<DevId, DeviceDetails> {
        &self.details
    }

    /// Volume `id`'s details (a device being deleted is none).
    pub fn device(&self, id: DevId) -> Result<DeviceDetails> {
        if self.deleting().contains(&id) {
            return Err(being_deleted(id));
        }
        self.details.get(&id).copied().ok_or_else(|| unknown(id))
    }

    /// The root of device `id`'s mapping tree.
    pub fn subtree(&self, id: DevId) -> Result<u64> {
        self.tm.lookup64(self.root, id as u64)?.ok_or_else(|| unknown(id))
    }

    fn set_subtree(&mut self, id: DevId, sub: u64) -> Result<()> {
        let (root, _) = self.tm.insert(self.root, id as u64, &sub.to_le_bytes(), Refs::Subtree)?;
        self.root = root;
        Ok(())
    }

    fn touch(&mut self, id: DevId, d: DeviceDetails) {
        self.details.insert(id, d);
        self.changed.insert(id);
        self.dirty = true;
    }

    /// Counts a change in the superblock's transaction id, which dm-thin leaves opaque (LVM
    /// sets it; `thin_restore` takes any value): up by one, wrapping past the largest.
    fn next_transaction(&mut self) {
        self.sb.transaction_id = self.sb.transaction_id.wrapping_add(1);
    }

    /// A new empty thin device.
    pub fn create_thin(&mut self, id: DevId) -> Result<()> {
        self.check_new_id(id)?;
        self.check_metadata_room()?;
        let sub = self.tm.empty_tree(8)?;
        self.set_subtree(id, sub)?;
        let t = self.sb.time;
        self.next_transaction();
        let d = DeviceDetails {
            mapped_blocks: 0,
            transaction_id: self.sb.transaction_id,
            creation_time: t,
            snapshotted_time: t,
        };
        self.touch(id, d);
        Ok(())
    }

    /// A snapshot `id` of `origin`: it shares the origin's mapping subtree (one count
    /// raised), whatever the origin's size; blocks older than the new time are shared from
    /// now on and copied on the first write to either.
    pub fn create_snapshot(&mut self, id: DevId, origin: DevId) -> Result<()> {
        if self.deleting().contains(&origin) {
            return Err(being_deleted(origin));
        }
        let o = self.details.get(&origin).copied().ok_or_else(|| unknown_origin(origin))?;
        self.check_new_id(id)?;
        self.check_metadata_room()?;
        if self.sb.time >= MAX_TIME {
            return Err(invalid("the pool's time counter is exhausted"));
        }
        let sub = self.subtree(origin)?;
        self.tm.md.inc(sub);
        self.set_subtree(id, sub)?;
        self.sb.time += 1;
        self.next_transaction();
        let t = self.sb.time;
        self.touch(origin, DeviceDetails { snapshotted_time: t, ..o });
        let d = DeviceDetails {
            mapped_blocks: o.mapped_blocks,
            transaction_id: self.sb.transaction_id,
            creation_time: t,
            snapshotted_time: t,
        };
        self.touch(id, d);
        Ok(())
    }

    /// A new empty thin device of `size` bytes (its size recorded).
    /// Nothing changes if it fails.
    pub fn create_volume(&mut self, id: DevId, size: u64) -> Result<()> {
        self.check_new_id(id)?;
        let record = self.record_with_size(id, size)?;
        self.create_thin(id)?;
        self.sb.record = record;
        Ok(())
    }

    /// A snapshot `id` of `origin` (`create_snapshot`) of the origin's recorded size, if it
    /// has one. Nothing changes if it fails.
    pub fn create_snapshot_sized(&mut self, id: DevId, origin: DevId) -> Result<()> {
        self.check_new_id(id)?;
        let record = match self.record().sizes.get(&origin) {
            Some(&size) => Some(self.record_with_size(id, size)?),
            None => None,
        };
        self.create_snapshot(id, origin)?;
        if let Some(r) = record {
            self.sb.record = r;
        }
        Ok(())
    }

    /// Deletes a device at once, in this transaction (`start_delete`, then every step;
    /// the nodes it holds alone must be in memory: `missing_for_delete`).
    pub fn delete(&mut self, id: DevId) -> Result<()> {
        self.start_delete(id)?;
        self.drop_device(id)
    }

    /// Starts deleting device `id` in the background: it is recorded as being deleted
    /// (strata's record, so the mark commits with this transaction) and hidden at once (no
    /// longer a volume: it cannot be served, snapshotted or resized, and its id is refused
    /// until the deletion ends); `delete_step` then frees its space a bounded piece at a
    /// time. Its details (mapped_blocks) are left as they were until it is gone.
    pub fn start_delete(&mut self, id: DevId) -> Result<()> {
        self.device(id)?;
        let mut r = self.sb.record.clone();
        r.sizes.remove(&id);
        r.deleting.insert(id);
        if !r.fits() {
            return Err(invalid(format!("no room left in the superblock to record that device {id} is being deleted")));
        }
        self.sb.record = r;
        self.next_transaction();
        self.dirty = true;
        Ok(())
    }

    /// The devices being deleted in the background (strata's record).
    pub fn deleting(&self) -> &BTreeSet<DevId> {
        &self.sb.record.deleting
    }

    /// The devices that are volumes: every device but those being deleted.
    pub fn volumes(&self) -> impl Iterator<Item = (DevId, &DeviceDetails)> + '_ {
        self.details.iter().filter(|(id, _)| !self.deleting().contains(id)).map(|(&id, d)| (id, d))
    }

    /// One step of deleting device `id` (marked by `start_delete`), at most about `budget`
    /// nodes of its tree dropped: if what is left of its tree holds at most `budget` nodes
    /// of its own, the device goes (its tree dropped whole, removed from both trees and
    /// from the record: true); else subtrees are cut off the right of its tree, each one
    /// dropped (a shared one only loses a reference; one of its own is freed with its data
    /// blocks), the tree kept valid (nodes on the way shadowed, thin ones rebalanced, a root
    /// of one entry replaced by its child). The nodes it frees must be in memory
    /// (`missing_for_step`).
    pub fn delete_step(&mut self, id: DevId, budget: usize) -> Result<bool> {
        if !self.deleting().contains(&id) {
            return Err(invalid(format!("thin device {id} is not being deleted")));
        }
        let budget = budget.max(1);
        let mut sub = self.subtree(id)?;
        if self.own_nodes(sub, budget)?.is_some() {
            self.drop_device(id)?;
            return Ok(true);
        }
        let mut left = budget;
        while left > 0 && !self.tm.view(sub)?.leaf {
            let (root, cost) = self.cut_last(sub, left)?;
            sub = root;
            left = left.saturating_sub(cost.max(1));
            // A root of one entry gives way to its child, as `Tm::remove` does.
            loop {
                let n = self.tm.view(sub)?;
                if n.leaf || n.len != 1 {
                    break;
                }
                let child = n.val64(0);
                if self.tm.md.count(sub) > 1 {
                    self.tm.md.inc(child);
                    self.tm.md.dec(sub).map_err(corrupt)?;
                } else {
                    self.tm.forget(sub)?;
                }
                sub = child;
            }
        }
        self.set_subtree(id, sub)?;
        self.dirty = true;
        Ok(false)
    }

    /// Runs every deletion in progress to its end, `budget` nodes a step, committing to
    /// `dev` every few steps and at each deletion's end (offline use: nothing else runs).
    pub async fn finish_deletions(&mut self, dev: &dyn BlockDev, budget: usize) -> Result<()> {
        let mut steps = 0;
        while let Some(&id) = self.deleting().first() {
            loop {
                let missing = self.missing_for_step(id, budget)?;
                if missing.is_empty() {
                    break;
                }
                let mut nodes = Vec::new();
                for (b, lo) in missing {
                    nodes.push((b, fetch_leaf(dev, b, Some(lo), self.limits()).await?));
                }
                self.load(nodes);
            }
            steps += 1;
            let done = self.delete_step(id, budget)?;
            if done || steps % crate::pool::DELETE_STEPS_PER_COMMIT == 0 || self.check_metadata_room().is_err() {
                self.commit(dev).await?;
            }
        }
        Ok(())
    }

    /// Removes a device whose deletion has been started, dropping what is left of its tree.
    fn drop_device(&mut self, id: DevId) -> Result<()> {
        let (root, sub) = self.tm.remove(self.root, id as u64, Refs::Subtree)?;
        self.root = root;
        let sub = sub.ok_or_else(|| corrupt(format!("device {id} has details but no mappings")))?;
        self.tm.dec_tree(le64(&sub, 0), Refs::Data)?;
        let (droot, _) = self.tm.remove(self.details_root, id as u64, Refs::None)?;
        self.details_root = droot;
        self.details.remove(&id);
        self.changed.remove(&id);
        self.sb.record.sizes.remove(&id);
        self.sb.record.deleting.remove(&id);
        self.next_transaction();
        self.dirty = true;
        Ok(())
    }

    /// The nodes dropping one reference to the tree at `b` frees (those reached through
    /// nodes held once), counting a shared node met as one, or None past `limit`. A node
    /// not in memory is a leaf (the open reads every node above them).
    fn own_nodes(&self, b: u64, limit: usize) -> Result<Option<usize>> {
        let mut n = 0;
        let mut todo = vec![b];
        while let Some(b) = todo.pop() {
            n += 1;
            if n > limit {
                return Ok(None);
            }
            if self.tm.md.count(b) != 1 || !self.tm.blocks.contains_key(&b) {
                continue;
            }
            let v = self.tm.view(b)?;
            if !v.leaf {
                todo.extend((0..v.len).map(|i| v.val64(i)));
            }
        }
        Ok(Some(n))
    }

    /// Cuts one subtree off the right of the tree at `root` (an internal node): the last
    /// child of the rightmost node whose last child costs at most `left` (`own_nodes`),
    /// going down from the root. Returns the new root and the cost.
    fn cut_last(&mut self, root: u64, left: usize) -> Result<(u64, usize)> {
        let b = self.tm.shadow(root, Refs::Data)?;
        let mut n = self.tm.read(b)?;
        let Some(i) = n.len().checked_sub(1) else {
            return Err(corrupt(format!("metadata block {b}: an internal node with no entries")));
        };
        let c = n.val64(i);
        let cost = match self.own_nodes(c, left)? {
            Some(cost) => {
                n.remove_at(i);
                self.tm.dec_tree(c, Refs::Data)?;
                cost
            }
            None => {
                let (c, cost) = self.cut_last(c, left)?;
                let child = self.tm.read(c)?;
                if child.is_empty() {
                    n.remove_at(i);
                    self.tm.forget(c)?;
                } else {
                    n.set_val(i, &c.to_le_bytes());
                    if child.len() < child.max() / 3 && n.len() > 1 {
                        self.tm.rebalance(&mut n, i, Refs::Data)?;
                    }
                }
                cost
            }
        };
        self.tm.write(b, &n);
        Ok((b, cost))
    }

    /// The nodes not read yet that the next `delete_step(id, budget)` frees: at most those
    /// of the device's own (reached through nodes held once) among the last `budget` leaves
    /// of its tree that are its own, or all of them if the step drops the tree whole.
    pub fn missing_for_step(&self, id: DevId, budget: usize) -> Result<Vec<(u64, u64)>> {
        if !self.lazy {
            return Ok(Vec::new());
        }
        let sub = self.subtree(id)?;
        if self.own_nodes(sub, budget.max(1))?.is_some() {
            return self.missing_for_delete(id);
        }
        // Right to left, depth first; a shared node's subtree is never freed by a step.
        let (mut out, mut leaves) = (Vec::new(), 0);
        let mut todo = vec![(sub, 0u64)];
        while let Some((b, key)) = todo.pop() {
            if leaves >= budget.max(1) {
                break;
            }
            if self.tm.md.count(b) != 1 {
                continue;
            }
            if !self.tm.blocks.contains_key(&b) {
                out.push((b, key));
                leaves += 1;
                continue;
            }
            let v = self.tm.view(b)?;
            if v.leaf {
                leaves += 1;
            } else {
                todo.extend((0..v.len).map(|i| (v.val64(i), v.key(i))));
            }
        }
        Ok(out)
    }

    /// Grows the data space to `blocks` data blocks (the caller has checked the data device
    /// holds them). dm-thin's data space map grows in place: new bitmaps, a longer index.
    pub fn extend_data(&mut self, blocks: u64) -> Result<()> {
        let now = self.tm.data.nr_blocks();
        if blocks < now {
            return Err(invalid(format!("the pool has {now} data blocks; it cannot shrink to {blocks}")));
        }
        if blocks >= 1 << 40 {
            return Err(invalid(format!("{blocks} data blocks are more than dm-thin's mappings can address")));
        }
        if blocks > now {
            self.tm.data.grow(blocks);
            self.dirty = true;
        }
        Ok(())
    }

    /// Grows the metadata space to `blocks` blocks of 4 KiB (at most dm-thin's 255 bitmaps'
    /// worth, 15.9 GiB; a larger device is used up to that).
    pub fn extend_metadata(&mut self, blocks: u64) -> Result<()> {
        let blocks = blocks.min(MAX_METADATA_BLOCKS);
        let now = self.tm.md.nr_blocks();
        if blocks < now {
            return Err(invalid(format!("the pool has {now} metadata blocks; it cannot shrink to {blocks}")));
        }
        if blocks > now {
            self.tm.md.grow(blocks);
            self.sb.metadata_nr_blocks = blocks;
            self.dirty = true;
        }
        Ok(())
    }

    fn check_new_id(&self, id: DevId) -> Result<()> {
        if id > MAX_DEV_ID {
            return Err(invalid(format!("device id {id} out of range (0 to {MAX_DEV_ID})")));
        }
        if self.deleting().contains(&id) {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("thin device {id} is being deleted: its id is free once its space is"),
            ));
        }
        if self.details.contains_key(&id) {
            return Err(Error::new(ErrorKind::Busy, format!("thin device {id} already exists")));
        }
        Ok(())
    }

    /// Where virtual block `vblock` of device `id` lives: (data block, time).
    pub fn lookup(&self, id: DevId, vblock: u64) -> Result<Option<(u64, u32)>> {
        let sub = self.subtree(id)?;
        Ok(self.tm.lookup64(sub, vblock)?.map(unpack_mapping))
    }

    /// Whether a mapping made at `time` is shared with a snapshot (dm-thin's rule: made
    /// before the device was last snapshotted).
    pub fn shared(&self, id: DevId, time: u32) -> Result<bool> {
        Ok(time < self.device(id)?.snapshotted_time)
    }

    /// Maps `vblock` of `id` to `data_block` (allocated by the caller) at the current time;
    /// the block it replaces, if any, loses a reference.
    pub fn insert(&mut self, id: DevId, vblock: u64, data_block: u64) -> Result<()> {
        let sub = self.subtree(id)?;
        let v = pack_mapping(data_block, self.sb.time);
        let (sub, old) = self.tm.insert(sub, vblock, &v.to_le_bytes(), Refs::Data)?;
        self.set_subtree(id, sub)?;
        let mut d = self.device(id)?;
        match old {
            Some(o) => {
                self.tm.data.dec(unpack_mapping(le64(&o, 0)).0).map_err(corrupt)?;
            }
            None => d.mapped_blocks = d.mapped_blocks.saturating_add(1),
        }
        self.touch(id, d);
        Ok(())
    }

    /// Unmaps `vblock` of `id`; returns the data block it held and whether that block is now
    /// free (no other mapping refers to it).
    pub fn remove(&mut self, id: DevId, vblock: u64) -> Result<Option<(u64, bool)>> {
        let sub = self.subtree(id)?;
        if self.tm.lookup(sub, vblock)?.is_none() {
            return Ok(None);
        }
        let (sub, old) = self.tm.remove(sub, vblock, Refs::Data)?;
        self.set_subtree(id, sub)?;
        let Some(old) = old else { return Ok(None) };
        let b = unpack_mapping(le64(&old, 0)).0;
        let left = self.tm.data.dec(b).map_err(corrupt)?;
        let mut d = self.device(id)?;
        d.mapped_blocks = d.mapped_blocks.saturating_sub(1);
        self.touch(id, d);
        Ok(Some((b, left == 0)))
    }

    /// A new data block (count one), or None when the data device is full.
    pub fn alloc_data(&mut self) -> Option<u64> {
        let b = self.tm.data.alloc();
        if b.is_some() {
            self.dirty = true;
        }
        b
    }

    /// Drops a data block allocated but never mapped (a failed write). A commit since the
    /// allocation may hold its count: the next one must write it down again.
    pub fn release_data(&mut self, b: u64) -> Result<()> {
        self.tm.data.dec(b).map_err(corrupt)?;
        self.dirty = true;
        Ok(())
    }

    /// Every mapping of `id`: (virtual block, data block, time), in order.
    pub fn mappings(&self, id: DevId) -> Result<Vec<(u64, u64, u32)>> {
        let sub = self.subtree(id)?;
        let mut out = Vec::new();
        self.tm.walk(sub, &mut |k, v| {
            let (b, t) = unpack_mapping(le64(v, 0));
            out.push((k, b, t));
        })?;
        Ok(out)
    }

    /// Each device's mapped blocks and those no other device maps (thin_ls's MAPPED_BLOCKS
    /// and EXCLUSIVE_BLOCKS).
    pub fn usage(&self) -> Result<BTreeMap<DevId, (u64, u64)>> {
        let mut owners: FxHashMap<u64, u32> = FxHashMap::default();
        let mut maps = BTreeMap::new();
        for id in self.volumes().map(|(id, _)| id).collect::<Vec<_>>() {
            let blocks: Vec<u64> = self.mappings(id)?.into_iter().map(|(_, b, _)| b).collect();
            for &b in &blocks {
                *owners.entry(b).or_default() += 1;
            }
            maps.insert(id, blocks);
        }
        Ok(maps
            .into_iter()
            .map(|(id, blocks)| {
                let exclusive = blocks.iter().filter(|b| owners[b] == 1).count() as u64;
                (id, (blocks.len() as u64, exclusive))
            })
            .collect())
    }

    /// Prepares the commit of everything changed since the last one (None if nothing did).
    /// Until `committed` is called the blocks this commit frees stay unused. Refused for a
    /// pool that must not be written (`Superblock::not_writable`).
    pub fn prepare_commit(&mut self) -> Result<Option<Commit>> {
        if !self.dirty {
            return Ok(None);
        }
        if let Some(why) = self.sb.not_writable() {
            return Err(invalid(why));
        }
        for id in std::mem::take(&mut self.changed) {
            let v = self.details[&id].encode();
            let (r, _) = self.tm.insert(self.details_root, id as u64, &v, Refs::None)?;
            self.details_root = r;
        }
        // The space maps' indexes and overflow trees are rewritten whole into new blocks.
        for b in std::mem::take(&mut self.sm_blocks) {
            self.tm.md.dec(b).map_err(corrupt)?;
        }
        let md_over = self.tm.md.overflow();
        let data_over = self.tm.data.overflow();
        let count = |n: usize, vs: usize| build_shape(n, vs).iter().map(Vec::len).sum::<usize>();
        let n_data_bitmaps = self.tm.data.bitmaps.len();
        let alloc = |tm: &mut Tm, n: usize| -> Result<Vec<u64>> {
            (0..n).map(|_| tm.md.alloc().ok_or_else(crate::btree::no_metadata_space)).collect()
        };
        let index_at = alloc(&mut self.tm, 1)?[0];
        let md_over_at = alloc(&mut self.tm, count(md_over.len(), 4))?;
        let data_over_at = alloc(&mut self.tm, count(data_over.len(), 4))?;
        let data_index_at = alloc(&mut self.tm, count(n_data_bitmaps, INDEX_ENTRY_BYTES))?;
        // Every changed bitmap moves to a new block; moving one changes counts, so repeat
        // until no bitmap is left changed and unmoved.
        let mut moved: [FxHashSet<usize>; 2] = Default::default();
        loop {
            let mut todo = Vec::new();
            for (which, sm) in [&self.tm.md, &self.tm.data].into_iter().enumerate() {
                todo.extend(sm.dirty.iter().filter(|i| !moved[which].contains(i)).map(|&i| (which, i)));
            }
            if todo.is_empty() {
                break;
            }
            for (which, i) in todo {
                let at = self.tm.md.alloc().ok_or_else(crate::btree::no_metadata_space)?;
                let sm = if which == 0 { &mut self.tm.md } else { &mut self.tm.data };
                let old = std::mem::replace(&mut sm.bitmaps[i], at);
                if old != 0 {
                    self.tm.md.dec(old).map_err(corrupt)?;
                }
                moved[which].insert(i);
            }
        }
        let mut writes: Blocks = Vec::new();
        // Bitmaps and index entries.
        let mut index_entries: [Vec<IndexEntry>; 2] = Default::default();
        for (which, sm) in [&mut self.tm.md, &mut self.tm.data].into_iter().enumerate() {
            for i in 0..sm.bitmaps.len() {
                if moved[which].contains(&i) {
                    let mut b = vec![0u8; BLOCK].into_boxed_slice();
                    sm.summary[i] = sm.encode_bitmap(i, &mut b[BITMAP_HEADER..]);
                    put64(&mut b, 8, sm.bitmaps[i]);
                    seal(&mut b, BITMAP_XOR);
                    writes.push((sm.bitmaps[i], b));
                }
                let (nr_free, none_free_before) = sm.summary[i];
                index_entries[which].push(IndexEntry { blocknr: sm.bitmaps[i], nr_free, none_free_before });
            }
        }
        let mut index = vec![0u8; BLOCK].into_boxed_slice();
        put64(&mut index, 8, index_at);
        for (i, e) in index_entries[0].iter().enumerate() {
            e.encode(&mut index[16 + i * INDEX_ENTRY_BYTES..]);
        }
        seal(&mut index, INDEX_XOR);
        writes.push((index_at, index));
        let counts = |over: &[(u64, u32)]| -> Vec<(u64, Vec<u8>)> {
            over.iter().map(|&(b, c)| (b, c.to_le_bytes().to_vec())).collect()
        };
        let (w, md_over_root) = build_tree(&counts(&md_over), 4, &md_over_at);
        writes.extend(w);
        let (w, data_over_root) = build_tree(&counts(&data_over), 4, &data_over_at);
        writes.extend(w);
        let entries: Vec<(u64, Vec<u8>)> = index_entries[1]
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut v = vec![0u8; INDEX_ENTRY_BYTES];
                e.encode(&mut v);
                (i as u64, v)
            })
            .collect();
        let (w, data_index_root) = build_tree(&entries, INDEX_ENTRY_BYTES, &data_index_at);
        writes.extend(w);
        self.sm_blocks = [vec![index_at], md_over_at, data_over_at, data_index_at].concat();
        // The nodes this transaction made.
        for &b in &self.tm.shadowed {
            if let Some(bytes) = self.tm.blocks.get(&b) {
                writes.push((b, bytes.clone()));
            }
        }
        writes.sort_unstable_by_key(|(b, _)| *b);
        self.sb.data_mapping_root = self.root;
        self.sb.device_details_root = self.details_root;
        self.sb.metadata_sm = SmRoot {
            nr_blocks: self.tm.md.nr_blocks(),
            nr_allocated: self.tm.md.allocated(),
            bitmap_root: index_at,
            ref_count_root: md_over_root,
        };
        self.sb.data_sm = SmRoot {
            nr_blocks: self.tm.data.nr_blocks(),
            nr_allocated: self.tm.data.allocated(),
            bitmap_root: data_index_root,
            ref_count_root: data_over_root,
        };
        self.tm.shadowed.clear();
        self.tm.md.begin_commit();
        self.tm.data.begin_commit();
        self.dirty = false;
        let superblocks = self.sb.writes(&self.image);
        self.prepared_image = superblocks.last().unwrap().clone();
        Ok(Some(Commit { writes, superblocks }))
    }

    /// The commit prepared last is durable: the blocks it freed may be reused.
    pub fn committed(&mut self) {
        if !self.prepared_image.is_empty() {
            self.image = std::mem::take(&mut self.prepared_image);
        }
        self.tm.md.durable();
        self.tm.data.durable();
    }
}

impl Commit {
    /// Writes the commit's blocks, makes them durable, then writes the superblock and makes
    /// it durable. (Data written for new mappings must be durable before: the caller
    /// flushes the data device first.)
    pub async fn write(self, dev: &dyn BlockDev) -> Result<()> {
        let mut i = 0;
        while i < self.writes.len() {
            let mut j = i + 1;
            while j < self.writes.len() && self.writes[j].0 == self.writes[j - 1].0 + 1 && j - i < 256 {
                j += 1;
            }
            let mut buf = Buf::zeroed((j - i) * BLOCK);
            for (k, (_, bytes)) in self.writes[i..j].iter().enumerate() {
                buf[k * BLOCK..(k + 1) * BLOCK].copy_from_slice(bytes);
            }
            dev.write(self.writes[i].0 * BLOCK as u64, buf, false).await?;
            i = j;
        }
        dev.flush().await?;
        write_superblocks(dev, &self.superblocks).await
    }
}

/// Writes the superblock images `Superblock::writes` gave, in order, each durable before the
/// next.
async fn write_superblocks(dev: &dyn BlockDev, images: &[Vec<u8>]) -> Result<()> {
    for sb in images {
        dev.write(0, Buf::from_slice(sb), true).await?;
        dev.flush().await?;
    }
    Ok(())
}

pub(crate) fn unknown(id: DevId) -> Error {
    invalid(format!("no thin device {id} in the pool"))
}

fn being_deleted(id: DevId) -> Error {
    invalid(format!("thin device {id} is being deleted"))
}

fn unknown_origin(id: DevId) -> Error {
    invalid(format!("no thin device {id} in the pool to snapshot"))
}

/// Reads a space-map block, checking its checksum and self-named block number.
async fn read_checked(dev: &dyn BlockDev, at: u64, md_blocks: u64, xor: u32, what: &str) -> Result<Buf> {
    if at == SUPERBLOCK || at >= md_blocks {
        return Err(corrupt(format!("{what}: block {at} out of range")));
    }
    let b = read_block(dev, at).await?;
    if !sealed(&b, xor) {
        return Err(corrupt(format!("{what}: bad checksum in block {at}")));
    }
    if le64(&b, 8) != at {
        return Err(corrupt(format!("{what}: block {at} names itself block {}", le64(&b, 8))));
    }
    Ok(b)
}

async fn load_bitmaps(dev: &dyn BlockDev, sm: &mut SpaceMap, md_blocks: u64, what: &str) -> Result<()> {
    let what = format!("{what} space map bitmap");
    let locations = sm.bitmaps.clone();
    for chunk in locations.chunks(64).enumerate() {
        let reads = chunk.1.iter().map(|&at| read_checked(dev, at, md_blocks, BITMAP_XOR, &what));
        for (k, b) in futures::future::join_all(reads).await.into_iter().enumerate() {
            sm.decode_bitmap(chunk.0 * 64 + k, &b?[BITMAP_HEADER..]);
        }
    }
    Ok(())
}

/// The most references a space map counts for one block. A block is referenced from at
/// most one place in each volume's tree, and a pool numbers 2^24 volumes: a count of 2^31
/// was crafted or damaged, and counting on from one near u32::MAX could wrap to zero,
/// freeing a block still in use.
const MAX_REFS: u32 = 1 << 31;

fn apply_overflow(sm: &mut SpaceMap, over: &[(u64, Vec<u8>)], what: &str) -> Result<()> {
    for (b, v) in over {
        if *b >= sm.nr_blocks() || sm.count(*b) != 3 {
            return Err(corrupt(format!(
                "{what} space map: an overflow count for block {b}, whose bitmap entry is not 3"
            )));
        }
        let count = le32(v, 0);
        if count >= MAX_REFS {
            return Err(corrupt(format!(
                "{what} space map: block {b} counted {count} times, more than any pool holds"
            )));
        }
        sm.load(*b, count);
    }
    Ok(())
}

/// Which tree a node belongs to, for the value size its leaves must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Top,
    Bottom,
    Details,
    Index,
    Counts,
}

impl Level {
    pub fn value_size(self) -> usize {
        match self {
            Level::Top | Level::Bottom => 8,
            Level::Details => DETAILS_BYTES,
            Level::Index => INDEX_ENTRY_BYTES,
            Level::Counts => 4,
        }
    }
}

/// Reads a space map's tree (index or overflow counts) whole: its entries, in order. Its
/// blocks are added to `blocks`.
async fn read_tree(
    dev: &dyn BlockDev,
    root: u64,
    vs: usize,
    md_blocks: u64,
    blocks: &mut Vec<u64>,
) -> Result<Vec<(u64, Vec<u8>)>> {
    let level = if vs == 4 { Level::Counts } else { Level::Index };
    let nodes = load_nodes(dev, &[(root, level)], (md_blocks, 0), FxHashMap::default(), true).await?;
    blocks.extend(nodes.keys().copied());
    let tm = Tm::nodes(nodes);
    let mut out = Vec::new();
    walk_unshared(&tm, root, &mut FxHashSet::default(), &mut out)?;
    Ok(out)
}

/// A space map tree's entries, in order. Such a tree shares no node; one reached twice is
/// damage (it would repeat its entries, as many times as there are ways down to it).
fn walk_unshared(tm: &Tm, b: u64, seen: &mut FxHashSet<u64>, out: &mut Vec<(u64, Vec<u8>)>) -> Result<()> {
    if !seen.insert(b) {
        return Err(corrupt(format!("space map tree: node {b} is reached twice")));
    }
    let n = tm.view(b)?;
    for i in 0..n.len {
        if n.leaf {
            out.push((n.key(i), n.val(i).to_vec()));
        } else {
            walk_unshared(tm, n.val64(i), seen, out)?;
        }
    }
    Ok(())
}

/// Blocks read at once by `read_in_use` (2 MiB: large reads, and what a run holds is still
/// in the caches when `each` goes through it).
const RUN: u64 = 512;

/// Every block but the superblock that the metadata space map counts in use, read in
/// device order `RUN` blocks at a time (runs holding none are skipped) and handed to `each`
/// with its bytes. Two buffers serve all the reads: the next run is read while `each` goes
/// through the last one (at once, when the device reads on other threads or in the kernel;
/// a read from the page cache is done before).
pub(crate) async fn read_in_use(dev: &dyn BlockDev, md: &SpaceMap, mut each: impl FnMut(u64, &[u8])) -> Result<()> {
    let in_use = |b: u64| b != SUPERBLOCK && md.count(b) > 0;
    let mut runs = (0..md.nr_blocks()).step_by(RUN as usize).filter_map(|start| {
        let end = (start + RUN).min(md.nr_blocks());
        let first = (start..end).find(|&b| in_use(b))?;
        Some((first, (first..end).rfind(|&b| in_use(b)).unwrap_or(first) + 1))
    });
    let (mut held, mut spare): (Option<(u64, Buf)>, Option<Buf>) = (None, None);
    loop {
        let next = runs.next();
        let reading = async {
            let (first, end) = next?;
            let mut buf = spare.take().unwrap_or_else(|| Buf::zeroed(RUN as usize * BLOCK));
            buf.set_len((end - first) as usize * BLOCK);
            Some(dev.read(first * BLOCK as u64, buf).await.map(|buf| (first, buf)))
        };
        let handing = async {
            let (first, buf) = held.take()?;
            for (b, bytes) in (first..).zip(buf.chunks_exact(BLOCK)) {
                if in_use(b) {
                    each(b, bytes);
                }
            }
            Some(buf)
        };
        let (read, handed) = futures::join!(reading, handing);
        spare = handed;
        match read {
            Some(got) => held = Some(got?),
            None => return Ok(()),
        }
    }
}

/// Reads every node of the trees rooted at `roots`, breadth first, each checked as
/// thin_check checks it (a shared node is read and checked once), and returns them. Nodes
/// found in `pre` (blocks read ahead) are taken from there, others read from `dev`. Subtree
/// roots found in the top-level mapping tree's leaves are followed. `limits`: the metadata
/// and data blocks there are (a mapping to a data block past the end is damage).
pub async fn load_nodes(
    dev: &dyn BlockDev,
    roots: &[(u64, Level)],
    limits: (u64, u64),
    mut pre: FxHashMap<u64, Box<[u8]>>,
    follow: bool,
) -> Result<FxHashMap<u64, Box<[u8]>>> {
    let (md_blocks, data_blocks) = limits;
    let mut out = FxHashMap::default();
    out.reserve(pre.len());
    // (block, level, is root, lowest key allowed)
    let mut frontier: Vec<(u64, Level, bool, Option<u64>)> = roots.iter().map(|&(b, l)| (b, l, true, None)).collect();
    let mut queued: FxHashSet<u64> = frontier.iter().map(|f| f.0).collect();
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for chunk in frontier.chunks(128) {
            let reads = chunk.iter().map(|&(b, ..)| {
                let ahead = pre.remove(&b);
                async move {
                    if b == SUPERBLOCK || b >= md_blocks {
                        return Err(out_of_range(b));
                    }
                    match ahead {
                        Some(bytes) => Ok(bytes),
                        None => Ok(Box::from(&read_block(dev, b).await?[..])),
                    }
                }
            });
            let got = futures::future::join_all(reads).await;
            for (&(b, level, root, lo), bytes) in chunk.iter().zip(got) {
                let bytes = bytes?;
                let h = if level == Level::Bottom {
                    check_bottom(&bytes, b, root, lo, data_blocks)?
                } else {
                    check_keys(&bytes, b, level.value_size(), root, lo)?
                };
                let v0 = NODE_HEADER + 8 * h.max_entries as usize;
                // Leaves of a device's mappings refer to no other node.
                if h.flags == INTERNAL_NODE || (level == Level::Top && follow) {
                    for i in 0..h.nr_entries as usize {
                        let child = le64(&bytes, v0 + 8 * i);
                        let child = if h.flags == INTERNAL_NODE {
                            (child, level, false, Some(le64(&bytes, NODE_HEADER + 8 * i)))
                        } else {
                            (child, Level::Bottom, true, None)
                        };
                        // A node shared by snapshots is read once.
                        if queued.insert(child.0) {
                            next.push(child);
                        }
                    }
                }
                out.insert(b, bytes);
            }
        }
        frontier = next;
    }
    let mut heights = FxHashMap::default();
    for &(root, level) in roots {
        check_shape(&out, root, &mut heights)?;
        if follow && level == Level::Top {
            // The devices' trees, whose roots the top-level tree's leaves hold.
            let mut todo = vec![root];
            while let Some(b) = todo.pop() {
                let n = view_of(b, &out[&b])?;
                todo.extend((0..n.len).map(|i| n.val64(i)).filter(|_| !n.leaf));
                for i in (0..n.len).filter(|_| n.leaf) {
                    check_shape(&out, n.val64(i), &mut heights)?;
                }
            }
        }
    }
    Ok(out)
}

/// The most levels a tree may have. Nodes below a tree's root hold at least a third of
/// the entries they have room for (thin_check's rule), so 2^64 keys need no more than 13
/// levels; a deeper tree is damage, or loops, and a walk over it would go as deep.
const MAX_LEVELS: u32 = 64;

fn too_deep(root: u64) -> Error {
    corrupt(format!("block {root}: a tree of more than {MAX_LEVELS} levels, or one that loops back"))
}

fn uneven(b: u64) -> Error {
    corrupt(format!("block {b}: the tree's leaves are not all at one depth, or it loops back"))
}

/// Queues node `b` at `height` (levels below it) unless it was queued before, at the same
/// height (a node that snapshots' trees share); at another it is damage.
fn queue(queued: &mut FxHashMap<u64, u32>, b: u64, height: u32) -> Result<bool> {
    match queued.entry(b) {
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(height);
            Ok(true)
        }
        std::collections::hash_map::Entry::Occupied(e) if *e.get() == height => Ok(false),
        std::collections::hash_map::Entry::Occupied(_) => Err(uneven(b)),
    }
}

/// Checks that the tree at `root` in `blocks` is one: its height found along its leftmost
/// path, every node at one height whichever parent reaches it (`heights`, kept across the
/// trees that share nodes) and every leaf at the bottom, so no node is its own descendant
/// and every walk over it ends.
fn check_shape(blocks: &FxHashMap<u64, Box<[u8]>>, root: u64, heights: &mut FxHashMap<u64, u32>) -> Result<()> {
    let view = |b: u64| blocks.get(&b).ok_or_else(|| out_of_range(b)).and_then(|bytes| view_of(b, bytes));
    let (mut b, mut height) = (root, 0);
    loop {
        let n = view(b)?;
        if n.leaf || n.len == 0 {
            break;
        }
        height += 1;
        if height >= MAX_LEVELS {
            return Err(too_deep(root));
        }
        b = n.val64(0);
    }
    let mut todo = vec![(root, height)];
    while let Some((b, h)) = todo.pop() {
        if !queue(heights, b, h)? {
            continue;
        }
        let n = view(b)?;
        if n.leaf != (h == 0) {
            return Err(uneven(b));
        }
        todo.extend((0..n.len).filter(|_| !n.leaf).map(|i| (n.val64(i), h - 1)));
    }
    Ok(())
}

pub(crate) fn out_of_range(b: u64) -> Error {
    corrupt(format!("a B-tree points at block {b}, out of range"))
}

/// Checks node `b` as thin_check does, and that its lowest key is not below `lo` (its
/// parent's key).
fn check_keys(bytes: &[u8], b: u64, vs: usize, root: bool, lo: Option<u64>) -> Result<NodeHeader> {
    let h = check_node(bytes, b, vs, root).map_err(corrupt)?;
    check_lowest(b, h.nr_entries as usize, le64(bytes, NODE_HEADER), lo)?;
    Ok(h)
}

/// Checks that node `b`'s lowest key (`first`, if it has `n` > 0 entries) is not below `lo`,
/// its parent's key for it.
pub(crate) fn check_lowest(b: u64, n: usize, first: u64, lo: Option<u64>) -> Result<()> {
    match lo {
        Some(lo) if n > 0 && first < lo => {
            Err(corrupt(format!("block {b}: lowest key {first} below its parent's key {lo}")))
        }
        _ => Ok(()),
    }
}

/// Checks a node of a device's mapping tree: as any node, and a leaf's mappings against the
/// data blocks there are.
pub(crate) fn check_bottom(bytes: &[u8], b: u64, root: bool, lo: Option<u64>, data_blocks: u64) -> Result<NodeHeader> {
    let h = check_keys(bytes, b, 8, root, lo)?;
    if h.flags == LEAF_NODE {
        let v0 = NODE_HEADER + 8 * h.max_entries as usize;
        for i in 0..h.nr_entries as usize {
            let (d, _) = unpack_mapping(le64(bytes, v0 + 8 * i));
            if d >= data_blocks {
                return Err(corrupt(format!("block {b}: a mapping to data block {d}, past the end ({data_blocks})")));
            }
        }
    }
    Ok(h)
}

/// Reads node `b` of a device's mapping tree and checks it (`check_bottom`).
async fn fetch(dev: &dyn BlockDev, b: u64, lo: Option<u64>, limits: (u64, u64)) -> Result<Box<[u8]>> {
    let (md_blocks, data_blocks) = limits;
    if b == SUPERBLOCK || b >= md_blocks {
        return Err(out_of_range(b));
    }
    let bytes: Box<[u8]> = Box::from(&read_block(dev, b).await?[..]);
    check_bottom(&bytes, b, lo.is_none(), lo, data_blocks)?;
    Ok(bytes)
}

/// Reads node `b`, which a walk down a lazily opened pool's tree found missing, and checks
/// it (`fetch`): a leaf, since every node above the leaves was read at open (`load_upper`).
pub async fn fetch_leaf(dev: &dyn BlockDev, b: u64, lo: Option<u64>, limits: (u64, u64)) -> Result<Box<[u8]>> {
    let bytes = fetch(dev, b, lo, limits).await?;
    match NodeHeader::decode(&bytes).flags {
        LEAF_NODE => Ok(bytes),
        _ => Err(uneven(b)),
    }
}

/// Reads the devices' trees rooted at `roots` down to the nodes above their leaves: each
/// tree's height is found along its leftmost path (all its leaves are at one depth), then
/// its internal nodes are read level by level, each once.
async fn load_upper(
    dev: &dyn BlockDev,
    roots: &[u64],
    limits: (u64, u64),
    out: &mut FxHashMap<u64, Box<[u8]>>,
) -> Result<()> {
    // (block, lowest key allowed, levels above the leaves)
    let mut frontier: Vec<(u64, Option<u64>, u32)> = Vec::new();
    let mut queued = FxHashMap::default();
    for &root in roots {
        let (mut b, mut lo, mut depth) = (root, None, 0u32);
        loop {
            if let std::collections::hash_map::Entry::Vacant(e) = out.entry(b) {
                e.insert(fetch(dev, b, lo, limits).await?);
            }
            let bytes = &out[&b];
            let h = NodeHeader::decode(bytes);
            if h.flags == LEAF_NODE {
                break;
            }
            lo = Some(le64(bytes, NODE_HEADER));
            b = le64(bytes, NODE_HEADER + 8 * h.max_entries as usize);
            depth += 1;
            if depth >= MAX_LEVELS {
                return Err(too_deep(root));
            }
        }
        if queue(&mut queued, root, depth)? {
            frontier.push((root, None, depth));
        }
    }
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for chunk in frontier.chunks(128) {
            let reads = chunk.iter().map(|&(b, lo, _)| {
                let have = out.get(&b).cloned();
                async move {
                    match have {
                        Some(bytes) => Ok(bytes),
                        None => fetch(dev, b, lo, limits).await,
                    }
                }
            });
            let got = futures::future::join_all(reads).await;
            for (&(b, _, height), bytes) in chunk.iter().zip(got) {
                let bytes = bytes?;
                let h = NodeHeader::decode(&bytes);
                let leaf = h.flags == LEAF_NODE;
                if leaf != (height == 0) {
                    return Err(corrupt(format!("block {b}: the tree's leaves are not all at one depth")));
                }
                if height >= 2 {
                    let v0 = NODE_HEADER + 8 * h.max_entries as usize;
                    for i in 0..h.nr_entries as usize {
                        let child = le64(&bytes, v0 + 8 * i);
                        if queue(&mut queued, child, height - 1)? {
                            next.push((child, Some(le64(&bytes, NODE_HEADER + 8 * i)), height - 1));
                        }
                    }
                }
                out.insert(b, bytes);
            }
        }
        frontier = next;
    }
    // The leaves are read when first needed: none may be a node read here above them (a
    // leaf that is a tree's root, as a snapshot of a one-leaf volume has, is read as one).
    for (&b, _) in queued.iter().filter(|&(_, &height)| height == 1) {
        let n = view_of(b, &out[&b])?;
        if let Some(c) = (0..n.len).map(|i| n.val64(i)).find(|c| queued.get(c).is_some_and(|&h| h != 0)) {
            return Err(uneven(c));
        }
    }
    Ok(())
}

/// What opening a pool and checking it read first: the superblock and both space maps,
/// every block of them checked.
pub(crate) struct Maps {
    pub sb: Superblock,
    /// The superblock's bytes.
    pub image: Vec<u8>,
    pub md: SpaceMap,
    pub data: SpaceMap,
    /// The blocks of the space maps' indexes and overflow trees (bitmaps are in `md` and
    /// `data`).
    pub sm_blocks: Vec<u64>,
}

impl Maps {
    pub async fn read(dev: &dyn BlockDev) -> Result<Maps> {
        let (sb, image) = read_superblock_image(dev).await?;
        if sb.held_root != 0 {
            return Err(invalid(
                "the pool holds a metadata snapshot (release it with dmsetup message ... release_metadata_snap)",
            ));
        }
        let md_blocks = sb.metadata_sm.nr_blocks;
        if md_blocks > MAX_METADATA_BLOCKS || md_blocks * BLOCK as u64 > dev.size() || md_blocks == 0 {
            return Err(corrupt(format!(
                "the metadata space map covers {md_blocks} blocks, the device {}",
                dev.size() / 4096
            )));
        }
        let mut sm_blocks = Vec::new();
        // The metadata space map: one index block listing its bitmaps.
        let mut md = SpaceMap::new(md_blocks);
        let index_at = sb.metadata_sm.bitmap_root;
        let index = read_checked(dev, index_at, md_blocks, INDEX_XOR, "metadata space map index").await?;
        sm_blocks.push(index_at);
        let n = nr_bitmaps(md_blocks);
        if n > MAX_METADATA_BITMAPS {
            return Err(corrupt("the metadata space map has too many bitmaps"));
        }
        for i in 0..n {
            let e = IndexEntry::decode(&index[16 + i * INDEX_ENTRY_BYTES..]);
            md.bitmaps[i] = e.blocknr;
            md.summary[i] = (e.nr_free, e.none_free_before);
        }
        load_bitmaps(dev, &mut md, md_blocks, "metadata").await?;
        let over = read_tree(dev, sb.metadata_sm.ref_count_root, 4, md_blocks, &mut sm_blocks).await?;
        apply_overflow(&mut md, &over, "metadata")?;
        // The data space map: its bitmaps are listed in a B-tree. The block count is only
        // believed within the format's limit and once the index lists each of its bitmaps
        // once (a map is a byte per block).
        let data_blocks = sb.data_sm.nr_blocks;
        if data_blocks >= MAX_DATA_BLOCKS {
            return Err(corrupt(format!("the data space map covers {data_blocks} blocks, past the format's limit")));
        }
        let entries = read_tree(dev, sb.data_sm.bitmap_root, INDEX_ENTRY_BYTES, md_blocks, &mut sm_blocks).await?;
        if entries.len() != nr_bitmaps(data_blocks) {
            return Err(corrupt(format!(
                "the data space map's index lists {} bitmaps for {data_blocks} blocks",
                entries.len()
            )));
        }
        if let Some(i) = entries.iter().enumerate().position(|(i, (k, _))| *k != i as u64) {
            return Err(corrupt(format!("the data space map's index has no bitmap {i}")));
        }
        let mut data = SpaceMap::new(data_blocks);
        for (i, (_, v)) in entries.iter().enumerate() {
            let e = IndexEntry::decode(v);
            data.bitmaps[i] = e.blocknr;
            data.summary[i] = (e.nr_free, e.none_free_before);
        }
        load_bitmaps(dev, &mut data, md_blocks, "data").await?;
        let over = read_tree(dev, sb.data_sm.ref_count_root, 4, md_blocks, &mut sm_blocks).await?;
        apply_overflow(&mut data, &over, "data")?;
        md.loaded();
        data.loaded();
        md.begin_commit();
        data.begin_commit();
        md.durable();
        data.durable();
        Ok(Maps { sb, image, md, data, sm_blocks })
    }

    /// The metadata and data blocks there are.
    pub fn limits(&self) -> (u64, u64) {
        (self.md.nr_blocks(), self.data.nr_blocks())
    }

    /// Every block the space maps occupy (`Metadata::space_map_blocks`).
    pub fn blocks(&self) -> Vec<u64> {
        space_map_blocks(&self.sm_blocks, &self.md, &self.data)
    }
}

fn space_map_blocks(sm_blocks: &[u64], md: &SpaceMap, data: &SpaceMap) -> Vec<u64> {
    let mut v = sm_blocks.to_vec();
    v.extend(md.bitmaps.iter().chain(&data.bitmaps).copied().filter(|&b| b != 0));
    v
}

/// The top-level mapping tree and the device-details tree, every node read and checked; the
/// devices' own trees are not followed.
pub(crate) async fn read_tops(
    dev: &dyn BlockDev,
    sb: &Superblock,
    limits: (u64, u64),
) -> Result<FxHashMap<u64, Box<[u8]>>> {
    let roots = [(sb.data_mapping_root, Level::Top), (sb.device_details_root, Level::Details)];
    load_nodes(dev, &roots, limits, FxHashMap::default(), false).await
}

/// The devices' details from the details tree, checked against the devices the top-level
/// mapping tree holds (`tm` holds both trees' nodes).
pub(crate) fn devices(tm: &Tm, sb: &Superblock) -> Result<BTreeMap<DevId, DeviceDetails>> {
    let mut details = BTreeMap::new();
    let mut bad = None;
    tm.walk(sb.device_details_root, &mut |k, v| {
        if k > MAX_DEV_ID as u64 {
            bad = Some(k);
        }
        details.insert(k as DevId, DeviceDetails::decode(v));
    })?;
    if let Some(k) = bad {
        return Err(corrupt(format!("device id {k} out of range")));
    }
    let mut mapped = BTreeSet::new();
    tm.walk(sb.data_mapping_root, &mut |k, _| {
        mapped.insert(k as DevId);
    })?;
    if mapped != details.keys().copied().collect() {
        return Err(corrupt(format!(
            "the mapping tree's devices {mapped:?} differ from the details tree's {:?}",
            details.keys().collect::<Vec<_>>()
        )));
    }
    Ok(details)
}

/// Clears the superblock's needs_check flag (the caller has found the pool clean): whether
/// it was set. The rest of the superblock is written back as it was.
pub async fn clear_needs_check(dev: &dyn BlockDev) -> Result<bool> {
    let (mut sb, image) = read_superblock_image(dev).await?;
    if sb.flags & NEEDS_CHECK == 0 {
        return Ok(false);
    }
    sb.flags &= !NEEDS_CHECK;
    write_superblocks(dev, &sb.writes(&image)).await?;
    Ok(true)
}

/// Reads and checks the superblock alone (for strata's record of the data device).
pub async fn read_superblock(dev: &dyn BlockDev) -> Result<Superblock> {
    Ok(read_superblock_image(dev).await?.0)
}

async fn read_superblock_image(dev: &dyn BlockDev) -> Result<(Superblock, Vec<u8>)> {
    if dev.size() < BLOCK as u64 {
        return Err(invalid(format!("{}: too small to hold dm-thin metadata", dev.describe())));
    }
    let b = read_block(dev, SUPERBLOCK).await?;
    let sb = Superblock::decode(&b).map_err(|e| {
        let kind = if e.starts_with("not dm-thin") { ErrorKind::Invalid } else { ErrorKind::Corrupt };
        Error::new(kind, format!("superblock: {e}"))
    })?;
    Ok((sb, b.to_vec()))
}
