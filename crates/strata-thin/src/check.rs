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

fn count(m: &Metadata, r: &mut Report) -> Result<()> {
    let mut md: FxHashMap<u64, u32> = FxHashMap::default();
    let mut data: FxHashMap<u64, u32> = FxHashMap::default();
    md.insert(SUPERBLOCK, 1);
    for b in m.space_map_blocks() {
        *md.entry(b).or_default() += 1;
    }
    let mut seen = FxHashSet::default();
    walk(m, m.sb.data_mapping_root, Refs::Subtree, &mut md, &mut data, &mut seen)?;
    walk(m, m.sb.device_details_root, Refs::None, &mut md, &mut data, &mut seen)?;
    for (&id, d) in m.devices() {
        let n = m.mappings(id)?.len() as u64;
        r.mapped_blocks += n;
        if n != d.mapped_blocks {
            r.warnings.push(format!("device {id}: details say {} mapped blocks, its tree holds {n}", d.mapped_blocks));
        }
    }
    for (what, sm, want) in [("metadata", &m.tm.md, &md), ("data", &m.tm.data, &data)] {
        let mut leaked = 0u64;
        for (&b, &n) in want {
            if b >= sm.nr_blocks() {
                r.errors.push(format!("{what} block {b} is referenced but lies past the end ({})", sm.nr_blocks()));
            } else if sm.count(b) < n {
                r.errors.push(format!(
                    "{what} reference counts differ for block {b}: {n} references, count {}",
                    sm.count(b)
                ));
            }
        }
        for b in 0..sm.nr_blocks() {
            let c = sm.count(b);
            if c > want.get(&b).copied().unwrap_or(0) {
                leaked += 1;
            }
        }
        if leaked > 0 {
            r.warnings.push(format!("{leaked} {what} blocks leaked (counted above their references)"));
        }
    }
    r.metadata_blocks_used = md.len() as u64;
    r.data_blocks_used = data.len() as u64;
    Ok(())
}

/// Counts one reference to node `b`, and the first time it is seen, those it holds.
fn walk(
    m: &Metadata,
    b: u64,
    refs: Refs,
    md: &mut FxHashMap<u64, u32>,
    data: &mut FxHashMap<u64, u32>,
    seen: &mut FxHashSet<u64>,
) -> Result<()> {
    *md.entry(b).or_default() += 1;
    if !seen.insert(b) {
        return Ok(());
    }
    let n = m.tm.read(b)?;
    for i in 0..n.len() {
        match (n.leaf, refs) {
            (false, _) => walk(m, n.val64(i), refs, md, data, seen)?,
            (true, Refs::Subtree) => walk(m, le64(n.val(i), 0), Refs::Data, md, data, seen)?,
            (true, Refs::Data) => *data.entry(unpack_mapping(n.val64(i)).0).or_default() += 1,
            (true, Refs::None) => {}
        }
    }
    Ok(())
}
