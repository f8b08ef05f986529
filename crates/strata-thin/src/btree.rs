//! dm-thin's copy-on-write B-trees over metadata blocks held in memory (`Tm`, the
//! transaction manager): lookups, inserts that split full nodes, removals that merge or
//! rebalance thin ones (thin_check wants every non-root node at least a third full), and
//! dropping a reference to a whole tree.
//!
//! A node written in the committed state is never changed in place: the first change in a
//! transaction shadows it to a new block. A node shared by several parents (a snapshot's
//! subtree) is copied and its children's counts raised then, lazily, as dm-thin does: that
//! is what makes a snapshot O(1).

use crate::format::*;
use crate::sm::SpaceMap;
use rustc_hash::{FxHashMap, FxHashSet};
use strata_io::{Error, ErrorKind, Result};

/// What a tree's leaf values refer to, for the counts raised when a shared leaf is copied
/// and dropped when a tree is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refs {
    /// Plain values (device details, space-map index entries, counts).
    None,
    /// Mapping values: a data block (data space map).
    Data,
    /// The top-level mapping tree's values: a device's subtree root (metadata space map),
    /// whose leaves are `Data`.
    Subtree,
}

/// The metadata in memory: every live B-tree node, both space maps, and which nodes this
/// transaction made (those may change in place).
pub struct Tm {
    pub blocks: FxHashMap<u64, Box<[u8]>>,
    pub shadowed: FxHashSet<u64>,
    pub md: SpaceMap,
    pub data: SpaceMap,
}

pub fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

pub fn no_metadata_space() -> Error {
    Error::new(ErrorKind::NoSpace, "the pool's metadata device is full: extend it (strata thin extend --metadata)")
}

/// A node decoded: keys and values side by side.
#[derive(Debug, Clone)]
pub struct Node {
    pub leaf: bool,
    pub vs: usize,
    pub keys: Vec<u64>,
    pub vals: Vec<u8>,
}

impl Node {
    pub fn empty(leaf: bool, vs: usize) -> Node {
        Node { leaf, vs: if leaf { vs } else { 8 }, keys: Vec::new(), vals: Vec::new() }
    }
    pub fn len(&self) -> usize {
        self.keys.len()
    }
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
    pub fn max(&self) -> usize {
        max_entries(self.vs)
    }
    pub fn val(&self, i: usize) -> &[u8] {
        &self.vals[i * self.vs..(i + 1) * self.vs]
    }
    pub fn val64(&self, i: usize) -> u64 {
        le64(&self.vals, i * 8)
    }
    pub fn set_val(&mut self, i: usize, v: &[u8]) {
        self.vals[i * self.vs..(i + 1) * self.vs].copy_from_slice(v);
    }
    pub fn insert_at(&mut self, i: usize, k: u64, v: &[u8]) {
        self.keys.insert(i, k);
        let at = i * self.vs;
        self.vals.splice(at..at, v.iter().copied());
    }
    pub fn remove_at(&mut self, i: usize) -> Vec<u8> {
        self.keys.remove(i);
        self.vals.drain(i * self.vs..(i + 1) * self.vs).collect()
    }
    /// Moves entries `at..` into a new node.
    pub fn split_off(&mut self, at: usize) -> Node {
        Node { leaf: self.leaf, vs: self.vs, keys: self.keys.split_off(at), vals: self.vals.split_off(at * self.vs) }
    }
    pub fn append(&mut self, other: &mut Node) {
        self.keys.append(&mut other.keys);
        self.vals.append(&mut other.vals);
    }
    /// Index of the child whose range holds `key`: the last key not above it.
    fn child_for(&self, key: u64) -> usize {
        match self.keys.binary_search(&key) {
            Ok(i) => i,
            Err(0) => 0,
            Err(i) => i - 1,
        }
    }

    /// Decodes a node block (its header's counts are trusted only within the block).
    pub fn decode(b: &[u8], at: u64) -> Result<Node> {
        let h = NodeHeader::decode(b);
        let vs = h.value_size as usize;
        let (n, max) = (h.nr_entries as usize, h.max_entries as usize);
        if (h.flags != LEAF_NODE && h.flags != INTERNAL_NODE) || n > max || NODE_HEADER + max * (8 + vs) > BLOCK {
            return Err(corrupt(format!("metadata block {at} is not a B-tree node")));
        }
        let keys = (0..n).map(|i| le64(b, NODE_HEADER + 8 * i)).collect();
        let v0 = NODE_HEADER + 8 * max;
        Ok(Node { leaf: h.flags == LEAF_NODE, vs, keys, vals: b[v0..v0 + n * vs].to_vec() })
    }

    /// The sealed block for this node at `at`.
    pub fn encode(&self, at: u64) -> Box<[u8]> {
        let max = self.max();
        assert!(self.len() <= max, "node of {} entries over its {max}", self.len());
        let mut b = vec![0u8; BLOCK].into_boxed_slice();
        put32(&mut b, 4, if self.leaf { LEAF_NODE } else { INTERNAL_NODE });
        put64(&mut b, 8, at);
        put32(&mut b, 16, self.len() as u32);
        put32(&mut b, 20, max as u32);
        put32(&mut b, 24, self.vs as u32);
        for (i, k) in self.keys.iter().enumerate() {
            put64(&mut b, NODE_HEADER + 8 * i, *k);
        }
        let v0 = NODE_HEADER + 8 * max;
        b[v0..v0 + self.vals.len()].copy_from_slice(&self.vals);
        seal(&mut b, BTREE_XOR);
        b
    }
}

/// Node `b`, whose block holds `bytes`, in place (its counts checked to lie within the block).
pub(crate) fn view_of(b: u64, bytes: &[u8]) -> Result<View<'_>> {
    let h = NodeHeader::decode(bytes);
    let (n, max, vs) = (h.nr_entries as usize, h.max_entries as usize, h.value_size as usize);
    if (h.flags != LEAF_NODE && h.flags != INTERNAL_NODE) || n > max || NODE_HEADER + max * (8 + vs) > BLOCK {
        return Err(corrupt(format!("metadata block {b} is not a B-tree node")));
    }
    Ok(View { leaf: h.flags == LEAF_NODE, len: n, bytes, v0: NODE_HEADER + 8 * max, vs })
}

/// A node read in place, without decoding it (for walks over many nodes).
pub struct View<'a> {
    pub leaf: bool,
    pub len: usize,
    bytes: &'a [u8],
    v0: usize,
    vs: usize,
}

impl View<'_> {
    pub fn key(&self, i: usize) -> u64 {
        le64(self.bytes, NODE_HEADER + 8 * i)
    }
    pub fn val(&self, i: usize) -> &[u8] {
        &self.bytes[self.v0 + i * self.vs..][..self.vs]
    }
    pub fn val64(&self, i: usize) -> u64 {
        le64(self.bytes, self.v0 + i * self.vs)
    }
    /// Index of the last key not above `key` (None: all are above it, or none is there).
    ///
    /// The first probe is where `key` would sit if the node's keys were evenly spread
    /// between its first and last: a leaf of a volume written through holds consecutive
    /// blocks, so the probe lands on the key, and a lookup reads three of the node's cache
    /// lines instead of the nine or so a bisection of 250 keys touches. A node that is not
    /// so even costs one probe more than a bisection.
    pub fn child(&self, key: u64) -> Option<usize> {
        let n = self.len;
        if n == 0 {
            return None;
        }
        let (first, last) = (self.key(0), self.key(n - 1));
        if key < first {
            return None;
        }
        if key >= last {
            return Some(n - 1);
        }
        // first <= key < last: the guess lies in 0..n-1, so its neighbour above exists.
        let g = ((key - first) as u128 * (n - 1) as u128 / (last - first) as u128) as usize;
        let (mut lo, mut hi) = if self.key(g) <= key {
            if self.key(g + 1) > key {
                return Some(g);
            }
            (g + 2, n)
        } else {
            (0, g)
        };
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.key(mid) <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1)
    }
}

/// Where a walk toward a key ends (`Tm::descend`).
pub enum Descent<'a> {
    /// The leaf holding the key, and its index there.
    Found(View<'a>, usize),
    /// The key is not in the tree.
    Absent,
    /// The child node the walk needs is not in memory: its block, and its parent's key for it.
    Unloaded(u64, u64),
}

pub fn not_loaded(b: u64) -> Error {
    corrupt(format!("metadata block {b} is not a loaded node"))
}

enum Ins {
    One(u64),
    Split(u64, u64, u64),
}

impl Tm {
    /// Nodes alone, without space maps (for walks over trees read apart).
    pub fn nodes(blocks: FxHashMap<u64, Box<[u8]>>) -> Tm {
        Tm { blocks, shadowed: FxHashSet::default(), md: SpaceMap::new(1), data: SpaceMap::new(1) }
    }

    pub fn read(&self, b: u64) -> Result<Node> {
        let bytes = self.blocks.get(&b).ok_or_else(|| not_loaded(b))?;
        Node::decode(bytes, b)
    }

    /// Node `b` in place (its counts checked to lie within the block).
    pub fn view(&self, b: u64) -> Result<View<'_>> {
        view_of(b, self.blocks.get(&b).ok_or_else(|| not_loaded(b))?)
    }

    /// Stores `n` at `b` (a block of this transaction).
    pub fn write(&mut self, b: u64, n: &Node) {
        debug_assert!(self.shadowed.contains(&b));
        self.blocks.insert(b, n.encode(b));
    }

    pub fn alloc_md(&mut self) -> Result<u64> {
        let b = self.md.alloc().ok_or_else(no_metadata_space)?;
        self.shadowed.insert(b);
        Ok(b)
    }

    /// A new node block holding `n`.
    pub fn new_node(&mut self, n: &Node) -> Result<u64> {
        let b = self.alloc_md()?;
        self.write(b, n);
        Ok(b)
    }

    /// Frees a node of this transaction whose entries moved elsewhere (no counts dropped
    /// below it).
    pub(crate) fn forget(&mut self, b: u64) -> Result<()> {
        self.md.dec(b).map_err(corrupt)?;
        self.blocks.remove(&b);
        self.shadowed.remove(&b);
        Ok(())
    }

    /// The block to change in place of `b`: `b` itself if this transaction made it and
    /// nothing else refers to it (a snapshot may share even a new node), else a copy.
    /// Copying a shared node raises its children's counts.
    pub fn shadow(&mut self, b: u64, refs: Refs) -> Result<u64> {
        let shared = self.md.count(b) > 1;
        if self.shadowed.contains(&b) && !shared {
            return Ok(b);
        }
        let n = self.read(b)?;
        let new = self.alloc_md()?;
        self.write(new, &n);
        if shared {
            self.inc_children(&n, refs);
            self.md.dec(b).map_err(corrupt)?;
        } else {
            self.md.dec(b).map_err(corrupt)?;
            self.blocks.remove(&b);
        }
        Ok(new)
    }

    fn inc_children(&mut self, n: &Node, refs: Refs) {
        for i in 0..n.len() {
            match (n.leaf, refs) {
                (false, _) | (true, Refs::Subtree) => self.md.inc(n.val64(i)),
                (true, Refs::Data) => self.data.inc(unpack_mapping(n.val64(i)).0),
                (true, Refs::None) => {}
            }
        }
    }

    /// Drops one reference to the tree at `root`; a node no longer referenced drops its
    /// children, and a leaf its values' referents.
    pub fn dec_tree(&mut self, root: u64, refs: Refs) -> Result<()> {
        if self.md.dec(root).map_err(corrupt)? > 0 {
            return Ok(());
        }
        let n = self.read(root)?;
        for i in 0..n.len() {
            match (n.leaf, refs) {
                (false, _) => self.dec_tree(n.val64(i), refs)?,
                (true, Refs::Subtree) => self.dec_tree(n.val64(i), Refs::Data)?,
                (true, Refs::Data) => {
                    self.data.dec(unpack_mapping(n.val64(i)).0).map_err(corrupt)?;
                }
                (true, Refs::None) => {}
            }
        }
        self.blocks.remove(&root);
        self.shadowed.remove(&root);
        Ok(())
    }

    /// A new empty tree (a leaf with no entries).
    pub fn empty_tree(&mut self, vs: usize) -> Result<u64> {
        self.new_node(&Node::empty(true, vs))
    }

    /// The value of `key`, read from the node blocks in place (no decoding: this is every
    /// IO's path).
    pub fn lookup(&self, root: u64, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.find(root, key)?.map(|(n, i)| n.val(i).to_vec()))
    }

    /// `lookup` of a tree whose values are 8 bytes, without copying the value.
    pub fn lookup64(&self, root: u64, key: u64) -> Result<Option<u64>> {
        Ok(self.find(root, key)?.map(|(n, i)| n.val64(i)))
    }

    /// The leaf holding `key` and its index there.
    fn find(&self, root: u64, key: u64) -> Result<Option<(View<'_>, usize)>> {
        match self.descend(root, key)? {
            Descent::Found(n, i) => Ok(Some((n, i))),
            Descent::Absent => Ok(None),
            Descent::Unloaded(b, _) => Err(not_loaded(b)),
        }
    }

    /// Walks from `root` (in memory) toward `key`, stopping at the first node not in memory.
    pub fn descend(&self, root: u64, key: u64) -> Result<Descent<'_>> {
        let mut n = self.view(root)?;
        loop {
            let Some(i) = n.child(key) else { return Ok(Descent::Absent) };
            if n.leaf {
                return Ok(if n.key(i) == key { Descent::Found(n, i) } else { Descent::Absent });
            }
            let b = n.val64(i);
            n = match self.blocks.get(&b) {
                Some(bytes) => view_of(b, bytes)?,
                None => return Ok(Descent::Unloaded(b, n.key(i))),
            };
        }
    }

    /// Every (key, value) of the tree, in key order.
    pub fn walk(&self, root: u64, each: &mut dyn FnMut(u64, &[u8])) -> Result<()> {
        let n = self.view(root)?;
        for i in 0..n.len {
            if n.leaf {
                each(n.key(i), n.val(i));
            } else {
                self.walk(n.val64(i), each)?;
            }
        }
        Ok(())
    }

    /// Sets `key` to `val`; returns the new root and the value replaced, whose referent the
    /// caller drops if it should.
    pub fn insert(&mut self, root: u64, key: u64, val: &[u8], refs: Refs) -> Result<(u64, Option<Vec<u8>>)> {
        let (r, old) = self.insert_rec(root, key, val, refs)?;
        Ok(match r {
            Ins::One(b) => (b, old),
            Ins::Split(l, k, r) => {
                let first = self.read(l)?.keys[0];
                let mut top = Node::empty(false, 8);
                top.insert_at(0, first, &l.to_le_bytes());
                top.insert_at(1, k, &r.to_le_bytes());
                (self.new_node(&top)?, old)
            }
        })
    }

    fn insert_rec(&mut self, b: u64, key: u64, val: &[u8], refs: Refs) -> Result<(Ins, Option<Vec<u8>>)> {
        let b = self.shadow(b, refs)?;
        let mut n = self.read(b)?;
        let mut old = None;
        if n.leaf {
            if n.vs != val.len() {
                return Err(corrupt(format!(
                    "metadata block {b}: value size {} where {} was expected",
                    n.vs,
                    val.len()
                )));
            }
            match n.keys.binary_search(&key) {
                Ok(i) => {
                    old = Some(n.val(i).to_vec());
                    n.set_val(i, val);
                }
                Err(i) => n.insert_at(i, key, val),
            }
        } else {
            let i = n.child_for(key);
            if key < n.keys[i] {
                n.keys[i] = key;
            }
            let (r, o) = self.insert_rec(n.val64(i), key, val, refs)?;
            old = o;
            match r {
                Ins::One(c) => n.set_val(i, &c.to_le_bytes()),
                Ins::Split(l, k, r) => {
                    n.set_val(i, &l.to_le_bytes());
                    n.insert_at(i + 1, k, &r.to_le_bytes());
                }
            }
        }
        if n.len() > n.max() {
            let right = n.split_off(n.len() / 2);
            self.write(b, &n);
            let k = right.keys[0];
            let rb = self.new_node(&right)?;
            return Ok((Ins::Split(b, k, rb), old));
        }
        self.write(b, &n);
        Ok((Ins::One(b), old))
    }

    /// Removes `key`; returns the new root and the value removed (the caller drops its
    /// referent). Nothing is shadowed when the key is absent.
    pub fn remove(&mut self, root: u64, key: u64, refs: Refs) -> Result<(u64, Option<Vec<u8>>)> {
        if self.lookup(root, key)?.is_none() {
            return Ok((root, None));
        }
        let (mut root, old) = self.remove_rec(root, key, refs)?;
        loop {
            let n = self.read(root)?;
            if n.leaf || n.len() > 1 {
                return Ok((root, Some(old)));
            }
            let child = n.val64(0);
            self.forget(root)?;
            root = child;
        }
    }

    fn remove_rec(&mut self, b: u64, key: u64, refs: Refs) -> Result<(u64, Vec<u8>)> {
        let b = self.shadow(b, refs)?;
        let mut n = self.read(b)?;
        let old;
        if n.leaf {
            let i = n.keys.binary_search(&key).map_err(|_| corrupt(format!("key {key} vanished from block {b}")))?;
            old = n.remove_at(i);
        } else {
            let i = n.child_for(key);
            let (c, o) = self.remove_rec(n.val64(i), key, refs)?;
            old = o;
            n.set_val(i, &c.to_le_bytes());
            let child = self.read(c)?;
            if child.len() < child.max() / 3 && n.len() > 1 {
                self.rebalance(&mut n, i, refs)?;
            }
        }
        self.write(b, &n);
        Ok((b, old))
    }

    /// Child `i` of `parent` is under a third full: merge it with a sibling, or share the
    /// sibling's entries evenly.
    pub(crate) fn rebalance(&mut self, parent: &mut Node, i: usize, refs: Refs) -> Result<()> {
        let (l, r) = if i + 1 < parent.len() { (i, i + 1) } else { (i - 1, i) };
        let lb = self.shadow(parent.val64(l), refs)?;
        let rb = self.shadow(parent.val64(r), refs)?;
        parent.set_val(l, &lb.to_le_bytes());
        parent.set_val(r, &rb.to_le_bytes());
        let (mut ln, mut rn) = (self.read(lb)?, self.read(rb)?);
        if ln.len() + rn.len() <= ln.max() {
            ln.append(&mut rn);
            self.write(lb, &ln);
            parent.remove_at(r);
            self.forget(rb)?;
        } else {
            let total = ln.len() + rn.len();
            let mut all = ln;
            all.append(&mut rn);
            let right = all.split_off(total / 2);
            parent.keys[r] = right.keys[0];
            self.write(lb, &all);
            self.write(rb, &right);
        }
        Ok(())
    }
}

/// Sealed metadata blocks and where they go.
pub type Blocks = Vec<(u64, Box<[u8]>)>;

/// How entries spread over the nodes of a tree built whole: per level, each node's entry
/// count, leaves first; every node at least half full, so thin_check's third holds.
pub fn build_shape(n: usize, vs: usize) -> Vec<Vec<usize>> {
    let mut levels = Vec::new();
    let mut count = n;
    let mut max = max_entries(vs);
    loop {
        let nodes = count.div_ceil(max).max(1);
        let level: Vec<usize> = (0..nodes).map(|k| count * (k + 1) / nodes - count * k / nodes).collect();
        levels.push(level);
        if nodes == 1 {
            return levels;
        }
        count = nodes;
        max = max_entries(8);
    }
}

/// Builds a tree of `entries` (sorted keys, values of `vs` bytes) into the blocks `at`
/// (`build_shape`'s node count of them, allocated by the caller). Returns the sealed blocks
/// and the root.
pub fn build_tree(entries: &[(u64, Vec<u8>)], vs: usize, at: &[u64]) -> (Blocks, u64) {
    let shape = build_shape(entries.len(), vs);
    let mut out = Vec::new();
    let mut next = at.iter().copied();
    let mut level: Vec<(u64, Vec<u8>)> = entries.to_vec();
    let mut leaf = true;
    for sizes in shape {
        let mut up = Vec::new();
        let mut it = level.into_iter();
        for size in sizes {
            let mut n = Node::empty(leaf, vs);
            for (k, v) in it.by_ref().take(size) {
                let i = n.len();
                n.insert_at(i, k, &v);
            }
            let b = next.next().expect("blocks for every node");
            up.push((n.keys.first().copied().unwrap_or(0), b.to_le_bytes().to_vec()));
            out.push((b, n.encode(b)));
        }
        level = up;
        leaf = false;
    }
    let root = le64(&level[0].1, 0);
    (out, root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    /// `View::child` against the plain answer (how many keys lie at or below the key, less
    /// one) on leaves of consecutive keys, of keys with gaps, of clusters, of one key and of
    /// none, for keys inside, between, below and above theirs.
    #[test]
    fn child_finds_the_last_key_not_above() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for round in 0..2_000 {
            let n = match round % 5 {
                0 => 0,
                1 => 1,
                _ => rng.gen_range(2..=252),
            };
            let mut keys = std::collections::BTreeSet::new();
            let start = rng.gen_range(0..1u64 << 40);
            while keys.len() < n {
                let k = match round % 4 {
                    0 => start + keys.len() as u64,
                    1 => start + rng.gen_range(0..4 * n as u64),
                    2 if rng.gen_bool(0.5) => start + rng.gen_range(0..8),
                    _ => rng.gen_range(0..u64::MAX),
                };
                keys.insert(k);
            }
            let mut node = Node::empty(true, 8);
            for (i, k) in keys.iter().enumerate() {
                node.insert_at(i, *k, &k.to_le_bytes());
            }
            let bytes = node.encode(1);
            let v = view_of(1, &bytes).unwrap();
            let keys: Vec<u64> = keys.into_iter().collect();
            let mut probes = vec![0, u64::MAX, start, start.wrapping_sub(1)];
            for &k in &keys {
                probes.extend([k, k.wrapping_sub(1), k.wrapping_add(1)]);
            }
            for p in probes {
                let want = keys.iter().filter(|&&k| k <= p).count().checked_sub(1);
                assert_eq!(v.child(p), want, "round {round}: key {p} among {keys:?}");
            }
        }
    }

    fn tm() -> Tm {
        Tm {
            blocks: FxHashMap::default(),
            shadowed: FxHashSet::default(),
            md: SpaceMap::new(100_000),
            data: SpaceMap::new(1_000_000),
        }
    }

    /// Checks structure the way thin_check does and returns the entries.
    fn entries(tm: &Tm, root: u64) -> Vec<(u64, u64)> {
        fn go(tm: &Tm, b: u64, root: bool, lo: Option<u64>, out: &mut Vec<(u64, u64)>) {
            check_node(&tm.blocks[&b], b, 8, root).unwrap();
            let n = tm.read(b).unwrap();
            if let Some(lo) = lo {
                assert!(n.keys[0] >= lo, "parent key {lo} above the child's lowest {}", n.keys[0]);
            }
            for i in 0..n.len() {
                if n.leaf {
                    out.push((n.keys[i], n.val64(i)));
                } else {
                    go(tm, n.val64(i), false, Some(n.keys[i]), out);
                }
            }
        }
        let mut out = Vec::new();
        go(tm, root, true, None, &mut out);
        out
    }

    #[test]
    fn inserts_and_removes_keep_a_valid_tree_equal_to_a_map() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut t = tm();
        let mut root = t.empty_tree(8).unwrap();
        let mut model = BTreeMap::new();
        for step in 0..40_000 {
            let k = rng.gen_range(0..20_000u64);
            if rng.gen_bool(0.6) {
                let v: u64 = rng.gen();
                let (r, old) = t.insert(root, k, &v.to_le_bytes(), Refs::None).unwrap();
                root = r;
                assert_eq!(old.map(|o| le64(&o, 0)), model.insert(k, v));
            } else {
                let (r, old) = t.remove(root, k, Refs::None).unwrap();
                root = r;
                assert_eq!(old.map(|o| le64(&o, 0)), model.remove(&k));
            }
            if step % 5000 == 0 {
                t.shadowed.clear();
            }
        }
        assert_eq!(entries(&t, root), model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_built_tree_is_valid() {
        for n in [0, 1, 251, 252, 253, 600, 100_000] {
            let e: Vec<(u64, Vec<u8>)> = (0..n as u64).map(|k| (k * 3, (k * 7).to_le_bytes().to_vec())).collect();
            let count: usize = build_shape(n, 8).iter().map(|l| l.len()).sum();
            let at: Vec<u64> = (1..=count as u64).collect();
            let (blocks, root) = build_tree(&e, 8, &at);
            let mut t = tm();
            t.blocks.extend(blocks);
            let got = entries(&t, root);
            assert_eq!(got.len(), n);
            assert!(got.iter().enumerate().all(|(i, &(k, v))| k == i as u64 * 3 && v == i as u64 * 7));
        }
    }
}
