//! Test support shared by every crate, used by tests only (the runtime decorators that tests
//! also use, `fault` and `powercut`, are devices of their own: `strata crashtest` and the
//! `fault:` spec run them).
//!
//! - [`model`]: the model checker, random workloads against a device and an in-memory
//!   reference, compared read by read;
//! - [`mod@slice`]: a window of a device as a device, to run several checkers on one target;
//! - [`recording`]: a device that records the IO it passes on;
//! - [`extent_at`]: which of a block status answer's extents describes an offset.

pub mod model;
pub mod recording;
pub mod slice;

pub use model::{check_all_blocks_at_once, check_model, pattern, random_ops, ModelOp, Reference, Workload};
pub use recording::Recording;
pub use slice::Slice;

/// The extent of `extents` (a `block_status` answer from offset 0) that describes byte
/// `offset`; panics where none does.
pub fn extent_at(extents: &[crate::Extent], offset: u64) -> crate::Extent {
    let mut end = 0;
    *extents
        .iter()
        .find(|e| {
            end += e.len;
            offset < end
        })
        .unwrap_or_else(|| panic!("{offset} not described: {extents:?}"))
}

/// Caps this process's address space at what it holds now and `headroom` bytes more, or
/// (`None`) lifts the cap again: for tests of what is done when memory is refused, each in
/// a test binary of its own since the cap is the whole process's.
pub fn cap_address_space(headroom: Option<u64>) {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let vm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmSize in /proc/self/status");
    let cur = headroom.map_or(libc::RLIM_INFINITY, |h| (vm_kib << 10) + h);
    let limit = libc::rlimit { rlim_cur: cur, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain syscall with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0, "setting RLIMIT_AS");
}
