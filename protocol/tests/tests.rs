//! gpux-protocol integration tests (one binary, as in the style guide).
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

mod envelope;
mod ext_keys;
mod golden;
mod peer_id;
mod props;
mod rules;
mod samples;
