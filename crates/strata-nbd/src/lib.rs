//! strata-nbd: an NBD server for any `BlockDev`. It speaks the fixed newstyle handshake,
//! simple and structured replies, `base:allocation` block status and multi-conn, answers
//! requests out of order, and never lets one misbehaving client affect another: malformed
//! traffic closes only that connection, and every queue and buffer is bounded. It knows
//! nothing about caching; volumes are just devices. It also holds the client side: `remote`,
//! a remote export as a `BlockDev` (the origin of a cache), and `tls` for both ends.

pub mod client;
pub mod errno;
mod export;
mod handshake;
pub mod proto;
pub mod remote;
mod server;
pub mod tls;
mod transmission;

pub use export::{check_name, Export, Limits};
pub use server::Server;
