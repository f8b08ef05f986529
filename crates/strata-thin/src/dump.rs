//! A pool's metadata as thin_dump prints it (its XML, the same bytes for the same pool), and
//! read back as thin_restore reads it, for tests and for moving pools between tools.

use crate::meta::Metadata;
use std::fmt::Write;
use strata_io::Result;

/// The pool as thin_dump's XML.
pub fn xml(m: &Metadata) -> Result<String> {
    let sb = &m.sb;
    let mut out = String::new();
    let uuid: String = sb.uuid.iter().take_while(|&&c| c != 0).map(|&c| c as char).collect();
    writeln!(
        out,
        "<superblock uuid=\"{uuid}\" time=\"{}\" transaction=\"{}\" flags=\"{}\" version=\"{}\" data_block_size=\"{}\" nr_data_blocks=\"{}\">",
        m.time(),
        m.transaction_id(),
        sb.flags,
        sb.version,
        sb.data_block_size,
        m.tm.data.nr_blocks()
    )
    .unwrap();
    for (&id, d) in m.devices() {
        writeln!(
            out,
            "  <device dev_id=\"{id}\" mapped_blocks=\"{}\" transaction=\"{}\" creation_time=\"{}\" snap_time=\"{}\">",
            d.mapped_blocks, d.transaction_id, d.creation_time, d.snapshotted_time
        )
        .unwrap();
        let maps = m.mappings(id)?;
        let mut i = 0;
        while i < maps.len() {
            let (v, b, t) = maps[i];
            let mut n = 1;
            while i + n < maps.len() && maps[i + n] == (v + n as u64, b + n as u64, t) {
                n += 1;
            }
            if n == 1 {
                writeln!(out, "    <single_mapping origin_block=\"{v}\" data_block=\"{b}\" time=\"{t}\"/>").unwrap();
            } else {
                writeln!(
                    out,
                    "    <range_mapping origin_begin=\"{v}\" data_begin=\"{b}\" length=\"{n}\" time=\"{t}\"/>"
                )
                .unwrap();
            }
            i += n;
        }
        writeln!(out, "  </device>").unwrap();
    }
    writeln!(out, "</superblock>").unwrap();
    Ok(out)
}
