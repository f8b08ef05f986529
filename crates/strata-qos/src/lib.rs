//! strata-qos: the `qos` target, proportional shares of one device's time between groups of
//! volumes and, within a group, between its connections; with io.max-style caps and an
//! io.latency-style target per group.
//!
//! It takes devices already opened and never sees a spec string or a CLI flag.
//!
//! - `sched`: the scheduler, plain data on the caller's clock (the policy lives here);
//! - `cost`: what a request costs in device time (the `hdd:` model's figures, or a linear
//!   model like blk-iocost's);
//! - `settings`: weights, caps and the device's tuning, as spec options and messages;
//! - `dev`: the scheduler on a real device (`Qos`) and one group's handle (`QosDev`);
//! - `status`: what status and metrics show;
//! - `calibrate`: measuring a device's linear cost model.

pub mod calibrate;
pub mod cost;
pub mod dev;
pub mod sched;
pub mod settings;
pub mod status;

pub use cost::{CostModel, Linear};
pub use dev::{Qos, QosDev};
pub use sched::{Scheduler, Tuning};
pub use settings::{DeviceOptions, GroupSettings, QosOptions};
pub use status::QosStatus;
