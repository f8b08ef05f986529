//! strata-thin: the `thin` target, thin volumes and snapshots over a pool of data blocks,
//! with the pool's metadata in dm-thin's on-disk format, so that thin-provisioning-tools
//! (thin_check, thin_dump, thin_restore, thin_ls, thin_delta) and the kernel read it.
//!
//! - `format`: the on-disk layout;
//! - `sm`, `btree`: space maps and copy-on-write B-trees;
//! - `meta`: the pool's metadata: open, create, volumes and snapshots, mappings, commit;
//! - `check`, `dump`: our checker and a dump in thin_dump's XML.

pub mod btree;
pub mod check;
pub mod dump;
pub mod format;
pub mod meta;
pub mod pool;
pub mod sm;
pub mod target;

pub use pool::{Pool, PoolOptions, PoolStatus};
pub use target::{ThinDev, ThinStatus};
