pub mod cache;
pub mod crashtest;
pub mod demo;
pub mod serve;
pub mod sim;
pub mod status;
pub mod thin;
pub mod writecache;
