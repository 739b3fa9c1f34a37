//! gpux-lease's integration tests: the deterministic lease simulator.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]
#![cfg_attr(feature = "broken-rule", allow(dead_code))]

mod preemption;
mod rules;
mod sim;
