//! Opening a write log: recovery from its entries (`offline::scan`), the first commit that
//! clears what recovery could not trust, and the background task.
//!
//! Recovery keeps each block's newest entry (all counted dirty: whether it was written back
//! is not recorded) and the older ones as stale, to be cleared oldest first. Untrusted
//! entries are cleared by a commit before the target serves anything, and that commit writes
//! no new entry, so a crash during it leaves the same last commit to check again.

use super::state::State;
use super::{writeback, Counters, Inner, WritecacheDev, STRIPES};
use crate::format::Entry;
use crate::offline::{scan, superblock};
use crate::status::Tunables;
use parking_lot::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use strata_io::background::Background;
use strata_io::{BlockDev, Result};
use tokio::sync::Notify;

/// How a writecache is opened.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// The tunables to start with; `None`: those last set live (kept in the superblock), or
    /// the defaults.
    pub tunables: Option<Tunables>,
    /// No background task (tests drive write-back and commits themselves).
    pub no_background: bool,
}

impl WritecacheDev {
    /// Opens the write log on `cache` in front of `origin`, recovering its entries.
    pub async fn open(cache: Arc<dyn BlockDev>, origin: Arc<dyn BlockDev>, o: OpenOptions) -> Result<WritecacheDev> {
        let sb = superblock(&*cache, Some(&*origin)).await?;
        let tunables = o.tunables.unwrap_or_else(|| Tunables::decode(&sb.settings));
        let found = scan(&*cache, &sb).await?;
        found.refuse_damage(&*cache)?;
        let mut st = State::new(sb.slots)?;
        let mut newest: Vec<(u32, Entry)> = found.newest.values().copied().collect();
        newest.sort_unstable_by_key(|(_, e)| e.seq);
        for (s, e) in newest {
            st.recovered_live(s, e);
        }
        for &(s, e) in &found.older {
            st.recovered_stale(s, e);
        }
        for &s in &found.garbage {
            st.recovered_garbage(s);
        }
        st.seq = found.max_seq;
        st.commit = found.max_commit;
        if st.sequences_used_up() {
            let why = "its write sequences are used up: writes go around it; detach it and create it anew";
            eprintln!("strata: write log {}: {why}", cache.describe());
        }
        let untrusted = !found.garbage.is_empty();
        drop(found);
        let inner = Arc::new(Inner {
            block: sb.block_bytes as u64,
            size: origin.size(),
            describe_origin: origin.describe(),
            cache,
            origin,
            state: Mutex::new(st),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            origin_locks: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            commit_lock: tokio::sync::Mutex::new(()),
            flush_gate: tokio::sync::RwLock::new(()),
            origin_writes: AtomicU64::new(0),
            origin_durable: tokio::sync::Mutex::new(0),
            counters: Counters::default(),
            tunables: Mutex::new(tunables),
            kick: Notify::new(),
            background: Background::default(),
            writeback_rate: AtomicU64::new(0),
            last_stream: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            last_error: Mutex::new(None),
            keeping_refused: Default::default(),
            sb,
        });
        if untrusted {
            // Nothing else is dirty yet: this commit only zeroes the untrusted entries.
            inner.commit_force().await?;
        }
        // Recovery's maps are gone: give their pages back, so the books are what stays.
        strata_io::buf::trim_heap();
        if !o.no_background {
            inner.background.start(writeback::background(Arc::downgrade(&inner)));
        }
        let describe = format!("writecache({} over {})", inner.cache.describe(), inner.describe_origin);
        Ok(WritecacheDev { inner, describe })
    }
}
