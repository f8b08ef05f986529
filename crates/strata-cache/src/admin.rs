//! Creating, checking and dumping caches: what `strata cache ...` does to a cache device
//! offline. Opening one for serving (its origin, identity checks, reporting what recovery
//! repaired) is the caller's, through `Meta::load` and `CacheDev::open`.

use crate::format::{recognise, Layout, Mode, Superblock, MAX_BLOCK_BYTES, MIN_BLOCK_BYTES, PAGE};
use crate::meta::{Findings, Meta};
use strata_io::{BlockDev, Buf, Error, ErrorKind, Result};

pub struct CreateOptions {
    pub block_bytes: u32,
    pub mode: Mode,
    pub policy: String,
    pub sequential_cutoff_bytes: u64,
    pub migration_budget_bytes_per_s: u64,
    pub writeback_percent: u32,
    pub readahead_bytes: u32,
    /// How to open the origin again (recorded in the superblock).
    pub origin_spec: String,
    /// What identifies the origin (device and inode of its file; empty when nothing does),
    /// recorded so that serving refuses another device at the same path.
    pub origin_id: String,
    pub force: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            block_bytes: 64 << 10,
            mode: Mode::Writeback,
            policy: strata_policy::DEFAULT_POLICY.to_string(),
            sequential_cutoff_bytes: 4 << 20,
            migration_budget_bytes_per_s: 32 << 20,
            writeback_percent: 10,
            readahead_bytes: DEFAULT_READAHEAD_BYTES,
            origin_spec: String::new(),
            origin_id: String::new(),
            force: false,
        }
    }
}

/// Read misses round out to this while the cache has unused blocks (see `Inner::fill_ahead`).
pub const DEFAULT_READAHEAD_BYTES: u32 = 1 << 20;

/// The largest readahead: one origin read of this size is still short next to a seek train.
pub const MAX_READAHEAD_BYTES: u64 = 16 << 20;

pub fn check_readahead(bytes: u64) -> Result<()> {
    if bytes > MAX_READAHEAD_BYTES {
        return Err(invalid(format!("readahead {bytes} bytes is over the maximum {MAX_READAHEAD_BYTES}")));
    }
    Ok(())
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Invalid, msg)
}

/// Formats `cache` as a cache of `origin`. Refuses a device holding recognisable data
/// unless `force`.
pub async fn create(cache: &dyn BlockDev, origin: &dyn BlockDev, o: &CreateOptions) -> Result<Superblock> {
    let bs = o.block_bytes;
    if !bs.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&bs) {
        return Err(invalid(format!("block size {bs} must be a power of two from 32 KiB to 1 GiB")));
    }
    strata_policy::build(&o.policy, 1, &strata_policy::Params::default()).map_err(|e| invalid(e.to_string()))?;
    if o.writeback_percent > 100 {
        return Err(invalid("writeback percent must be 0..100"));
    }
    check_readahead(o.readahead_bytes as u64)?;
    let head_len = cache.size().min(128 << 10) as usize;
    let head = cache.read(0, Buf::zeroed(head_len)).await?;
    if let Some(what) = recognise(&head) {
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
    let layout = Layout::new(slots, bs);
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
        policy: o.policy.clone(),
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
        "superblock": {
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
        },
        "cached_blocks": mappings.len(),
        "dirty_blocks": meta.entries.iter().filter(|e| e.valid && e.dirty).count(),
        "mappings": mappings,
        "errors": findings.errors,
        "repaired_on_open": findings.repaired,
    }))
}
