//! What the target reports (`status`) and the messages it takes (mode, policy, tunables,
//! flush, invalidate, detach).

use super::{policy_capacity, Inner};
use crate::format::Mode;
use crate::meter::{Kind, Windows};
use crate::status::CacheStatus;
use std::time::Duration;
use strata_io::{Error, ErrorKind, Result};
use strata_policy::Params;

impl Inner {
    pub(super) fn status(&self) -> CacheStatus {
        use std::sync::atomic::Ordering::Relaxed as R;
        let c = &self.counters;
        let st = self.state.lock();
        let sb = &st.meta.sb;
        let up = self.epoch.elapsed().as_secs_f64().max(1e-9);
        CacheStatus {
            mode: sb.mode.name().to_string(),
            restart_mode: st.saved_mode().name().to_string(),
            policy: sb.policy.clone(),
            block_size: sb.block_bytes,
            read_hits: c.read_hits.load(R),
            read_misses: c.read_misses.load(R),
            write_hits: c.write_hits.load(R),
            write_misses: c.write_misses.load(R),
            promotions: c.promotions.load(R),
            demotions: c.demotions.load(R),
            writebacks: c.writebacks.load(R),
            writeback_writes: c.writeback_writes.load(R),
            writeback_errors: c.writeback_errors.load(R),
            dirty_blocks: st.policy.dirty_len() as u64,
            cached_blocks: st.map.len() as u64,
            cache_blocks: sb.slots,
            free_blocks: (st.free.len() + st.freed.len()) as u64,
            migration_bytes: c.migration_bytes.load(R),
            migration_budget_bytes_per_s: self.budget.rate(),
            sequential_cutoff_bytes: sb.sequential_cutoff_bytes,
            writeback_percent: sb.writeback_percent,
            readahead_bytes: sb.readahead_bytes,
            readahead_blocks: c.readahead_blocks.load(R),
            bypassed: c.bypassed.load(R),
            partial_writes_around: c.partial_writes_around.load(R),
            promotions_skipped: c.promotions_skipped.load(R),
            commits: c.commits.load(R),
            dirty_victims_refused: c.dirty_victims_refused.load(R),
            hit_ratio_10s: self.windows.ratio(c, Duration::from_secs(10)),
            hit_ratio_1m: self.windows.ratio(c, Duration::from_secs(60)),
            hit_ratio_1h: self.windows.ratio(c, Duration::from_secs(3600)),
            hit_ratio_total: Windows::total(c),
            origin_busy_foreground_s: self.meter.busy(Kind::Foreground).as_secs_f64(),
            origin_busy_migration_s: self.meter.busy(Kind::Migration).as_secs_f64(),
            origin_busy_share: (self.meter.busy(Kind::Foreground) + self.meter.busy(Kind::Migration)).as_secs_f64()
                / up,
            flushing: st.flush_all,
            dirty_limited: self.dirty_limited(&st),
            faults: st.faults.iter().rev().take(8).cloned().collect(),
            degraded: !st.faults.is_empty(),
            stopped: st.failed.clone(),
        }
    }

    /// An action (`flush`, `invalidate`, `detach`), or settings, one `KEY VALUE` per line:
    /// every line is checked before any takes effect, so a bad one changes nothing.
    pub(super) async fn message(&self, msg: &str) -> Result<String> {
        let invalid = |m: String| Error::new(ErrorKind::Invalid, m);
        let answer = {
            let mut st = self.state.lock();
            st.stopped()?;
            match msg.trim() {
                "flush" => {
                    st.flush_all = true;
                    self.wake.notify_one();
                    return Ok(format!("writing back {} dirty blocks", st.policy.dirty_len()));
                }
                "invalidate" => {
                    let n = st.invalidate_clean(&self.counters);
                    return Ok(format!("dropped {n} clean blocks"));
                }
                "detach" => {
                    st.meta.sb.mode = Mode::Cleaner;
                    st.safe_mode = false;
                    st.flush_all = true;
                    self.wake.notify_one();
                    format!("cleaner mode: writing back {} dirty blocks", st.policy.dirty_len())
                }
                _ => {
                    let mut sb = st.meta.sb.clone();
                    let (mut policy, mut budget, mut mode_set) = (None, None, false);
                    let mut answers = Vec::new();
                    for line in msg.lines().map(str::trim).filter(|l| !l.is_empty()) {
                        let (key, value) =
                            line.split_once([' ', '=']).map(|(k, v)| (k.trim(), v.trim())).unwrap_or((line, ""));
                        answers.push(match key {
                            "mode" => {
                                sb.mode = value.parse().map_err(invalid)?;
                                mode_set = true;
                                format!("mode {}", sb.mode.name())
                            }
                            "policy" => {
                                let value = strata_policy::resolve(value);
                                let params =
                                    Params { origin_blocks: Some(sb.origin_blocks()), ..Params::default() };
                                let p = strata_policy::build(value, policy_capacity(st.meta.slots()), &params)
                                    .map_err(|e| invalid(e.to_string()))?;
                                policy = Some(p);
                                sb.policy = value.to_string();
                                format!("policy {value}")
                            }
                            "migration_budget" | "migration-budget" => {
                                let r = strata_io::units::parse_rate(value).map_err(invalid)?;
                                sb.migration_budget_bytes_per_s = r;
                                budget = Some(r);
                                format!("migration budget {r} bytes/s")
                            }
                            "sequential_cutoff" | "sequential-cutoff" => {
                                sb.sequential_cutoff_bytes = strata_io::units::parse_size(value).map_err(invalid)?;
                                format!("sequential cutoff {} bytes", sb.sequential_cutoff_bytes)
                            }
                            "readahead" => {
                                let r = strata_io::units::parse_size(value).map_err(invalid)?;
                                crate::options::check_readahead(r)?;
                                sb.readahead_bytes = r as u32;
                                format!("readahead {r} bytes")
                            }
                            "writeback_percent" | "writeback-percent" => {
                                let p: u32 = value.parse().map_err(|_| invalid(format!("bad percent {value:?}")))?;
                                crate::options::check_writeback_percent(p)?;
                                sb.writeback_percent = p;
                                format!("writeback percent {p}")
                            }
                            "flush" | "invalidate" | "detach" => {
                                return Err(invalid(format!("{key} is an action: it takes no value and goes alone")))
                            }
                            _ => {
                                return Err(invalid(format!(
                                    "unknown message {key:?} (mode, policy, migration-budget, sequential-cutoff, readahead, writeback-percent, flush, invalidate, detach)"
                                )))
                            }
                        });
                    }
                    if answers.is_empty() {
                        return Err(invalid("empty message".into()));
                    }
                    if let Some(mut p) = policy {
                        let st = &mut *st;
                        for (&b, &s) in &st.map {
                            let _ = p.insert(b, st.meta.entries[s as usize].dirty);
                        }
                        st.policy = p;
                    }
                    if let Some(r) = budget {
                        self.budget.set_rate(r);
                    }
                    if mode_set {
                        // The operator's mode ends the safe mode a fault chose.
                        st.safe_mode = false;
                    }
                    st.meta.sb = sb;
                    answers.join("; ")
                }
            }
        };
        self.write_superblock().await?;
        Ok(answer)
    }
}
