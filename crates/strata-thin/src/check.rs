//! Our checker: what thin_check checks. Opening the metadata already checks every block's
//! checksum and self-named number, every node's structure and key order; this counts the
//! references to every metadata and data block from the trees and compares them with the
//! space maps. A count below the references is an error (a block would be reused while
//! still mapped); a count above them is a leak, reported but not an error (as thin_check).

use crate::btree::Refs;
use crate::format::{le64, unpack_mapping, SUPERBLOCK};
use crate::meta::Metadata;
use rustc_hash::{FxHashMap, FxHashSet};
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
/// open's error), as are counts below the references.
pub async fn check(dev: &dyn BlockDev) -> Report {
    match Metadata::open(dev).await {
        Ok(m) => check_counts(&m),
        Err(e) => Report { errors: vec![e.context], ..Report::default() },
    }
}

/// Compares the space maps of an open pool with the references its trees hold.
pub fn check_counts(m: &Metadata) -> Report {
    let mut r = Report { devices: m.devices().len(), ..Report::default() };
    if let Err(e) = count(m, &mut r) {
        r.errors.push(e.context);
    }
    r
}

/// References counted per block; blocks past the end are listed apart.
struct Counted {
    counts: Vec<u32>,
    past_end: Vec<u64>,
}

impl Counted {
    fn new(n: u64) -> Counted {
        Counted { counts: vec![0; n as usize], past_end: Vec::new() }
    }
    fn inc(&mut self, b: u64) {
        match self.counts.get_mut(b as usize) {
            Some(c) => *c += 1,
            None => self.past_end.push(b),
        }
    }
}

fn count(m: &Metadata, r: &mut Report) -> Result<()> {
    let mut md = Counted::new(m.tm.md.nr_blocks());
    let mut data = Counted::new(m.tm.data.nr_blocks());
    md.inc(SUPERBLOCK);
    for b in m.space_map_blocks() {
        md.inc(b);
    }
    let mut seen = FxHashSet::default();
    walk(m, m.sb.data_mapping_root, Refs::Subtree, &mut md, &mut data, &mut seen)?;
    walk(m, m.sb.device_details_root, Refs::None, &mut md, &mut data, &mut seen)?;
    let mut sizes = FxHashMap::default();
    for (&id, d) in m.devices() {
        let n = entries(m, m.subtree(id)?, &mut sizes)?;
        r.mapped_blocks += n;
        if n != d.mapped_blocks {
            r.warnings.push(format!("device {id}: details say {} mapped blocks, its tree holds {n}", d.mapped_blocks));
        }
    }
    for (what, sm, want) in [("metadata", &m.tm.md, &md), ("data", &m.tm.data, &data)] {
        for b in &want.past_end {
            r.errors.push(format!("{what} block {b} is referenced but lies past the end ({})", sm.nr_blocks()));
        }
        let mut leaked = 0u64;
        for (b, &n) in want.counts.iter().enumerate() {
            let c = sm.count(b as u64);
            if c < n {
                r.errors.push(format!("{what} reference counts differ for block {b}: {n} references, count {c}"));
            } else if c > n {
                leaked += 1;
            }
        }
        if leaked > 0 {
            r.warnings.push(format!("{leaked} {what} blocks leaked (counted above their references)"));
        }
    }
    r.metadata_blocks_used = md.counts.iter().filter(|&&c| c > 0).count() as u64;
    r.data_blocks_used = data.counts.iter().filter(|&&c| c > 0).count() as u64;
    Ok(())
}

/// The entries of the tree at `b` (each shared node counted once, then remembered).
fn entries(m: &Metadata, b: u64, memo: &mut FxHashMap<u64, u64>) -> Result<u64> {
    if let Some(&n) = memo.get(&b) {
        return Ok(n);
    }
    let node = m.tm.view(b)?;
    let n = if node.leaf {
        node.len as u64
    } else {
        let mut n = 0;
        for i in 0..node.len {
            n += entries(m, node.val64(i), memo)?;
        }
        n
    };
    memo.insert(b, n);
    Ok(n)
}

/// Counts one reference to node `b`, and the first time it is seen, those it holds.
fn walk(
    m: &Metadata,
    b: u64,
    refs: Refs,
    md: &mut Counted,
    data: &mut Counted,
    seen: &mut FxHashSet<u64>,
) -> Result<()> {
    md.inc(b);
    if !seen.insert(b) {
        return Ok(());
    }
    let n = m.tm.view(b)?;
    for i in 0..n.len {
        match (n.leaf, refs) {
            (false, _) => walk(m, n.val64(i), refs, md, data, seen)?,
            (true, Refs::Subtree) => walk(m, le64(n.val(i), 0), Refs::Data, md, data, seen)?,
            (true, Refs::Data) => data.inc(unpack_mapping(n.val64(i)).0),
            (true, Refs::None) => {}
        }
    }
    Ok(())
}
