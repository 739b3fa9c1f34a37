//! The gpux node library.
//!
//! Today it owns the node's identity on disk: the data directory and the key file
//! (`<data-dir>/node.key`, mode 0600, refused when group or others can read it). The swarm,
//! store, executor and local API join it in later steps; the `gpux` binary stays a thin
//! argument parser over this library.
//!
//! ```no_run
//! # fn main() -> Result<(), gpux_node::KeyFileError> {
//! let dir = std::path::Path::new("/tmp/gpux-example");
//! let (keypair, created) = gpux_node::init_key(dir)?;
//! println!("{} ({})", keypair.peer_id(), if created { "new" } else { "existing" });
//! # Ok(())
//! # }
//! ```

pub mod attest;
pub mod budget;
pub mod config;
pub mod daemon;
mod data_dir;
pub mod executor;
pub mod ledger;
pub mod machine;
pub mod metrics;
pub mod p2p;
pub mod plane;
pub mod store;
pub mod validation;

pub use data_dir::{NODE_LOCK_FILE, NodeLock, claim_data_dir, node_runs_on};
pub use gpux_api::{
    DataDirError, KEY_FILE_NAME, KeyFileError, create_key, default_data_dir, init_key, key_path,
    load_key,
};
