//! strata-cache: a fast device caching a slow origin, doing what lvmcache (dm-cache with
//! smq) and bcache do. `format` is the on-disk layout, `meta` the mapping table and its
//! commits and recovery, `target` the IO paths and background migration (one file per
//! concern), `meter` the counters, budget and origin accounting, `streams` the sequential
//! detector, `status` what the target reports (`/status`, `/metrics`), `options` the settings
//! a cache is created with (defaults and limits), `offline` the tools that work on an unserved
//! cache device (create, check, dump).
//!
//! The target takes devices already opened: it never sees a device spec, a command-line flag,
//! or a terminal. Opening a cache from its spec (and its origin from the superblock) is the
//! `strata` crate's opener.
//!
//! What it must never do: acknowledge a FLUSH or FUA write before the data and the mapping
//! that finds it are durable; reuse a cache slot before its release is durable; evict a
//! dirty block; read a clock inside a policy (time is passed in).

pub mod format;
pub mod meta;
pub mod meter;
pub mod offline;
pub mod options;
pub mod status;
pub mod streams;
pub mod target;

pub use format::Mode;
pub use options::CreateOptions;
pub use status::CacheStatus;
pub use target::{CacheDev, OpenOptions};
