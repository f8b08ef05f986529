//! The offline tools: formatting a cache device (`strata cache create`), checking its metadata
//! (`check`) and printing it (`dump`). They need the metadata's internals; opening a cache for
//! serving (its origin, identity checks, reporting what recovery repaired) is the caller's,
//! through `Meta::load` and `CacheDev::open`.

use crate::format::{Layout, Superblock, PAGE};
use crate::meta::{held_bytes, load_bytes, memory_for, Findings, Meta};
use crate::options::CreateOptions;
use crate::target::open_bytes_per_slot;
use strata_io::{signature, BlockDev, Buf, Error, ErrorKind, Result};

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Invalid, msg)
}

/// Formats `cache` as a cache of `origin`. Refuses a device holding data (a recognised
/// format, or anything but zeroes in its first 4 KiB) unless `force`.
pub async fn create(cache: &dyn BlockDev, origin: &dyn BlockDev, o: &CreateOptions) -> Result<Superblock> {
    o.check()?;
    let bs = o.block_bytes;
    if let Some(what) = signature::recognise_any(&signature::head(cache).await?) {
        if !o.force {
            return Err(invalid(format!(
                "the cache device holds {what}; refusing to overwrite it (use --force to format anyway)"
            )));
        }
    }
    let slots = Layout::fit(cache.size(), bs);
    if slots == 0 {
        return Err(invalid(format!(
            "cache device too small: {} bytes cannot hold metadata and one {bs}-byte block",
            cache.size()
        )));
    }
    if origin.size() == 0 {
        return Err(invalid("origin is empty"));
    }
    signature::check_origin(origin, o.force).await?;
    let layout = Layout::new(slots, bs);
    // A cache this system could not open is refused now, while its block size can change.
    let open = held_bytes(slots) + slots * open_bytes_per_slot(&o.policy);
    memory_for(load_bytes(&layout, slots).max(open), "its books", slots)?;
    let mut uuid = [0u8; 16];
    uuid.iter_mut().for_each(|b| *b = rand::random());
    let sb = Superblock {
        seq: 0,
        uuid,
        block_bytes: bs,
        mode: o.mode,
        clean_shutdown: true,
        slots,
        origin_bytes: origin.size(),
        data_offset: layout.data_offset,
        table_offset: layout.table_offset,
        table_pages: layout.table_pages,
        hints_offset: layout.hints_offset,
        hints_capacity: layout.hints_capacity,
        hints_len: 0,
        hints_crc: 0,
        sequential_cutoff_bytes: o.sequential_cutoff_bytes,
        migration_budget_bytes_per_s: o.migration_budget_bytes_per_s,
        writeback_percent: o.writeback_percent,
        readahead_bytes: o.readahead_bytes,
        policy: strata_policy::resolve(&o.policy).to_string(),
        origin_spec: o.origin_spec.clone(),
        origin_id: o.origin_id.clone(),
    };
    // Zero the metadata area (old superblocks included), then write an empty table.
    let mut pos = 0;
    while pos < layout.data_offset {
        let n = (layout.data_offset - pos).min(8 << 20);
        cache.write(pos, Buf::zeroed(n as usize), false).await?;
        pos += n;
    }
    // Both copies of every page, so a later damaged copy always has a twin.
    let mut meta = Meta::fresh(sb);
    for _ in 0..2 {
        meta.touch_all();
        let batch = meta.prepare_commit();
        for (_, off, _, bytes) in &batch.pages {
            cache.write(*off, Buf::from_slice(bytes), false).await?;
        }
        meta.commit_done(&batch);
    }
    cache.flush().await?;
    meta.write_superblock(cache).await?;
    cache.flush().await?;
    Ok(meta.sb)
}

/// `strata cache check`: the superblock and findings.
pub async fn check(dev: &dyn BlockDev) -> Result<(Superblock, Findings)> {
    let (meta, findings) = Meta::load(dev).await?;
    Ok((meta.sb, findings))
}

/// `strata cache check --repair`: accepts the damage `check` finds (unmapping the slots
/// whose entries are wrong, and whatever a page with both copies damaged held), rewrites
/// both copies of every table page, and checks again. Returns the number of slots unmapped.
pub async fn repair(dev: &dyn BlockDev) -> Result<usize> {
    let (mut meta, findings) = Meta::load(dev).await?;
    if findings.errors.is_empty() {
        return Ok(0);
    }
    let unmapped = meta.repair();
    for _ in 0..2 {
        let batch = meta.prepare_commit();
        for (_, off, _, bytes) in &batch.pages {
            dev.write(*off, Buf::from_slice(bytes), false).await?;
        }
        meta.commit_done(&batch);
        meta.touch_all();
    }
    dev.flush().await?;
    let (_, after) = Meta::load(dev).await?;
    if !after.errors.is_empty() {
        return Err(invalid(format!("still damaged after the repair: {}", after.errors.join("; "))));
    }
    Ok(unmapped)
}

/// `strata cache dump`: superblock and every mapped slot, as JSON.
pub async fn dump(dev: &dyn BlockDev) -> Result<serde_json::Value> {
    let (meta, findings) = Meta::load(dev).await?;
    let sb = &meta.sb;
    let mappings: Vec<serde_json::Value> = meta
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.valid)
        .map(|(s, e)| serde_json::json!({"slot": s, "origin_block": e.origin_block, "dirty": e.dirty, "generation": e.generation}))
        .collect();
    Ok(serde_json::json!({
        "superblock": superblock_json(sb),
        "cached_blocks": mappings.len(),
        "dirty_blocks": meta.entries.iter().filter(|e| e.valid && e.dirty).count(),
        "mappings": mappings,
        "errors": findings.errors,
        "repaired_on_open": findings.repaired,
    }))
}

/// The superblock's facts under the names `dump` and `create --json` print them.
pub fn superblock_json(sb: &Superblock) -> serde_json::Value {
    serde_json::json!({
        "seq": sb.seq,
        "uuid": sb.uuid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "block_size": sb.block_bytes,
        "mode": sb.mode.name(),
        "policy": sb.policy,
        "clean_shutdown": sb.clean_shutdown,
        "cache_blocks": sb.slots,
        "origin_spec": sb.origin_spec,
        "origin_id": sb.origin_id,
        "origin_bytes": sb.origin_bytes,
        "data_offset": sb.data_offset,
        "table_pages": sb.table_pages,
        "hints_bytes": sb.hints_len,
        "sequential_cutoff_bytes": sb.sequential_cutoff_bytes,
        "migration_budget_bytes_per_s": sb.migration_budget_bytes_per_s,
        "writeback_percent": sb.writeback_percent,
        "readahead_bytes": sb.readahead_bytes,
        "page_bytes": PAGE,
    })
}
