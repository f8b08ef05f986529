//! strata-writecache: the `writecache` target, a log of written blocks on a fast device in
//! front of a slow origin (dm-writecache's job). Writes land in the log and are acknowledged
//! at the fast device's pace; reads of logged blocks come from it, all others from the
//! origin; dirty blocks are written back continuously, in origin-address order; a full log
//! sends writes around to the origin instead of stalling them.
//!
//! It takes devices already opened and never sees a spec string, a CLI flag or a terminal.
//!
//! - `format`: the on-disk layout (superblock, entries, slots);
//! - `target`: the target itself, by concern;
//! - `status`: what it reports and the tunables it takes;
//! - `offline`: create, check and dump.

pub mod format;
pub mod offline;
pub mod status;
pub mod target;

pub use status::{Tunables, WritecacheStatus};
pub use target::{OpenOptions, WritecacheDev};
