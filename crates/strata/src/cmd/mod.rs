pub mod serve;
pub mod status;
pub mod demo;
