//! Opening a cache (recovering the mapping, restoring policy hints, starting the background
//! task), checking its clean blocks against the origin, and the clean shutdown.

use super::writeback::background;
use super::{policy_capacity, CacheDev, Inner, State, SHARDS};
use crate::format::{page_round_up, Mode, Superblock};
use crate::meta::{memory_for, Meta};
use crate::meter::{Budget, Counters, OriginMeter, Windows};
use crate::streams::Streams;
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Arc;
use std::time::Instant;
use strata_io::background::Background;
use strata_io::{BlockDev, Buf, Error, ErrorKind, Result};
use strata_policy::Params;
use tokio::sync::{Notify, RwLock};

/// Memory an open cache running `policy` takes per slot beside its table's ([`Meta`]): the
/// block → slot map (a hash table's entry and control byte, at most 7/8 full), the write
/// generation, and the policy's state as its row of the policy table states it.
pub(crate) fn open_bytes_per_slot(policy: &str) -> u64 {
    let state = strata_policy::find(strata_policy::resolve(policy)).map_or(0, |p| p.bytes_per_block);
    20 + 4 + state as u64
}

/// The settings a cache is opened with beyond its superblock.
pub struct OpenOptions {
    pub seed: u64,
    /// Most share of origin time migration may take (0..1).
    pub migration_share_max: f64,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { seed: 0, migration_share_max: 0.5 }
    }
}

impl CacheDev {
    /// Opens a formatted cache over `origin`: recovers the mapping (cost: reading the table),
    /// restores policy hints after a clean shutdown, and starts the background tasks.
    pub async fn open(
        cache: Arc<dyn BlockDev>,
        origin: Arc<dyn BlockDev>,
        mut meta: Meta,
        opts: OpenOptions,
    ) -> Result<CacheDev> {
        let sb: Superblock = meta.sb.clone();
        if origin.size() != sb.origin_bytes {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "origin size changed: the cache was made for {} bytes, {} has {}",
                    sb.origin_bytes,
                    origin.describe(),
                    origin.size()
                ),
            ));
        }
        let slots = sb.slots as usize;
        memory_for(sb.slots * open_bytes_per_slot(&sb.policy), "its map and policy", sb.slots)?;
        let params = Params { seed: opts.seed, origin_blocks: Some(sb.origin_blocks()), ..Params::default() };
        let mut policy = strata_policy::build(&sb.policy, policy_capacity(slots), &params)
            .map_err(|e| Error::new(ErrorKind::Invalid, e.to_string()))?;
        let mut map = FxHashMap::default();
        let mut free = Vec::new();
        for (s, e) in meta.entries.iter().enumerate() {
            if e.valid {
                map.insert(e.origin_block, s as u32);
            } else {
                free.push(s as u32);
            }
        }
        free.reverse(); // hand out low slots first
        let hints = if sb.clean_shutdown && sb.hints_len > 0 {
            let b = cache.read(sb.hints_offset, Buf::zeroed(page_round_up(sb.hints_len) as usize)).await?;
            let h = b[..sb.hints_len as usize].to_vec();
            (crc32c::crc32c(&h) == sb.hints_crc).then_some(h)
        } else {
            None
        };
        if let Some(h) = hints {
            if policy.load_hints(&h).is_err() {
                policy = strata_policy::build(&sb.policy, policy_capacity(slots), &params).expect("built above");
            }
        }
        // The mapping is authoritative: reconcile the policy with it, stale hints out first,
        // then dirty blocks before clean ones. A table mapping more blocks than the policy
        // holds (written under another slot reserve, or damaged) loses its excess clean
        // blocks, copies of the origin; more dirty blocks than that is refused.
        // (Found by looking over the origin's blocks only if the policy holds any the table
        // does not map: that look costs a second a few hundred million blocks.)
        let agreed = map.keys().filter(|&&b| policy.contains(b)).count();
        if agreed < policy.len() {
            let stale: Vec<u64> =
                (0..sb.origin_blocks()).filter(|b| policy.contains(*b) && !map.contains_key(b)).collect();
            for b in stale {
                policy.remove(b);
            }
        }
        let mut mapped: Vec<(u64, u32)> = map.iter().map(|(&b, &s)| (b, s)).collect();
        mapped.sort_unstable_by_key(|&(b, s)| (!meta.entries[s as usize].dirty, b));
        // A cache left in cleaner mode was detached (or was being detached): its origin may
        // have been served and written without it since, so its clean copies are not trusted.
        let forget_clean = sb.mode == Mode::Cleaner;
        let (mut dropped, mut forgotten) = (0usize, 0usize);
        for (b, s) in mapped {
            let dirty = meta.entries[s as usize].dirty;
            if forget_clean && !dirty {
                policy.remove(b);
                map.remove(&b);
                meta.set(s, 0, false, false);
                free.push(s);
                forgotten += 1;
                continue;
            }
            if !policy.contains(b) && policy.insert(b, dirty).is_err() {
                if dirty {
                    return Err(Error::new(
                        ErrorKind::Invalid,
                        format!(
                            "the cache table holds more dirty blocks than policy {} can hold ({} of {} slots): \
                             the table is damaged or from another version",
                            sb.policy,
                            policy.capacity(),
                            slots
                        ),
                    ));
                }
                map.remove(&b);
                meta.set(s, 0, false, false);
                free.push(s);
                dropped += 1;
                continue;
            }
            if dirty {
                policy.set_dirty(b);
            }
        }
        if forgotten > 0 {
            eprintln!(
                "strata: cache on {}: opened in cleaner mode (detached, or being detached): {forgotten} clean blocks \
                 dropped, as the origin may have been written without the cache since",
                cache.describe()
            );
        }
        if dropped > 0 {
            eprintln!(
                "strata: cache on {}: the table maps more blocks than policy {} holds ({}); {dropped} clean \
                 blocks dropped from the cache",
                cache.describe(),
                sb.policy,
                policy.capacity()
            );
        }
        let describe = format!(
            "cache ({}, {} blocks of {} KiB, policy {}) of {} on {}",
            sb.mode.name(),
            sb.slots,
            sb.block_bytes >> 10,
            sb.policy,
            origin.describe(),
            cache.describe()
        );
        let inner = Arc::new(Inner {
            block: sb.block_bytes as u64,
            data_offset: sb.data_offset,
            origin_bytes: sb.origin_bytes,
            refs: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            shards: (0..SHARDS).map(|_| Arc::new(RwLock::new(()))).collect(),
            commit_lock: tokio::sync::Mutex::new(()),
            flush_gate: RwLock::new(()),
            counters: Counters::default(),
            windows: Windows::new(),
            budget: Budget::new(sb.migration_budget_bytes_per_s),
            meter: OriginMeter::new(),
            wake: Notify::new(),
            background: Background::default(),
            epoch: Instant::now(),
            describe,
            share_cap: Mutex::new(opts.migration_share_max),
            origin_busy: AtomicBool::new(false),
            origin_away: AtomicBool::new(false),
            state: Mutex::new(State {
                policy,
                map,
                write_gen: vec![0; slots],
                meta,
                free,
                freed: Vec::new(),
                committing: Vec::new(),
                reserved: 0,
                read_streams: Streams::new(),
                write_streams: Streams::new(),
                zeroed: FxHashSet::default(),
                pending: FxHashMap::default(),
                durable_changes: 0,
                unrecorded: Vec::new(),
                flush_all: false,
                faults: Vec::new(),
                safe_mode: false,
                failed: None,
                cache_suspect: false,
                fresh: FxHashSet::default(),
                flushing: FxHashSet::default(),
            }),
            origin,
            cache,
        });
        // From now on a crash is not a clean shutdown: hints must not be trusted.
        {
            let mut st = inner.state.lock();
            st.meta.sb.clean_shutdown = false;
            st.meta.sb.hints_len = 0;
        }
        inner.write_superblock().await?;
        inner.commit().await?;
        inner.state.lock().debug_check();
        inner.background.start(background(Arc::downgrade(&inner)));
        Ok(CacheDev { inner })
    }

    /// The origin blocks whose clean cached copy differs from the origin (there should be
    /// none: a clean slot is a copy of its block, before and after a crash).
    pub async fn verify_clean(&self) -> Result<Vec<u64>> {
        let me = &self.inner;
        let clean: Vec<u64> = {
            let st = me.state.lock();
            st.map.iter().filter(|&(_, &s)| !st.meta.entries[s as usize].dirty).map(|(&b, _)| b).collect()
        };
        let mut differ = Vec::new();
        for b in clean {
            let _g = me.shard(b).clone().read_owned().await;
            let s = {
                let st = me.state.lock();
                match st.map.get(&b) {
                    Some(&s) if !st.meta.entries[s as usize].dirty => s,
                    _ => continue,
                }
            };
            let len = me.block_len(b) as usize;
            let (c, o) = tokio::join!(
                me.cache.read(me.slot_offset(s), Buf::zeroed(len)),
                me.origin.read(b * me.block, Buf::zeroed(len))
            );
            if c?[..] != o?[..] {
                differ.push(b);
            }
        }
        differ.sort_unstable();
        Ok(differ)
    }
}

impl Inner {
    /// Clean shutdown: write back nothing extra, commit, save hints, mark clean.
    pub(super) async fn shutdown(&self) -> Result<()> {
        self.background.stop(&self.wake).await;
        self.commit().await?;
        let (hints, offset, capacity) = {
            let st = self.state.lock();
            (st.policy.save_hints(), st.meta.sb.hints_offset, st.meta.sb.hints_capacity)
        };
        if (hints.len() as u64) <= capacity && !hints.is_empty() {
            let mut b = Buf::zeroed(page_round_up(hints.len() as u64) as usize);
            b[..hints.len()].copy_from_slice(&hints);
            self.cache.write(offset, b, true).await?;
            let mut st = self.state.lock();
            st.meta.sb.hints_len = hints.len() as u64;
            st.meta.sb.hints_crc = crc32c::crc32c(&hints);
        }
        self.state.lock().meta.sb.clean_shutdown = true;
        self.write_superblock().await
    }
}
