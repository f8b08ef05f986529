pub mod cache;
pub mod crashtest;
pub mod demo;
pub mod qos;
pub mod serve;
pub mod sim;
pub mod status;
pub mod writecache;
