pub mod serve;
pub mod status;
pub mod demo;
pub mod cache;
pub mod crashtest;
pub mod sim;
