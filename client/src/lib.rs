//! A client of a running gpux node, for the processes that are not the node: the `gpux` CLI
//! and the testnet's driver.
//!
//! - [`api`]: the node's local API over HTTP, typed by `gpux-api` (it finds the node
//!   through `<data-dir>/api.addr` and authenticates with `<data-dir>/api.token`);
//! - [`stream`]: `gpux exec`, `gpux forward` and `gpux ssh` over the API's WebSockets, which
//!   the node bridges to streams to the lease's host;
//! - [`copy`]: `gpux cp`, which the node carries out and reports on;
//! - [`mod@print`]: how the command-line binaries print (lines, JSON, the exit on an error).
//!
//! It depends on the API's types and the protocol's wire types only: nothing of the node
//! (libp2p, sled, Docker) is linked into a client.

pub mod api;
pub mod copy;
pub mod print;
pub mod stream;

pub use api::{ApiClient, ClientError, RENT_WAIT};
