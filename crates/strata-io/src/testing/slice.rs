//! A window of a device as a device, to run several model checkers on one target: the
//! `slice:` device itself.

pub use crate::slice::Slice;
