//! The `strata` command: serving volumes, inspecting them, and the tools around the engine.
//! The binary is a thin shell over these modules so tests can drive them directly.

pub mod admin;
pub mod cmd;
pub mod config;
pub mod crashtest;
pub mod volume;
