//! gpux-lease's integration tests: the deterministic lease simulator.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]
#![cfg_attr(feature = "broken-rule", allow(dead_code))]

// Exact bills: not under the broken rule (a host billing a second too many), which the
// simulator must catch instead.
#[cfg(not(feature = "broken-rule"))]
mod cancel;
#[cfg(not(feature = "broken-rule"))]
mod commit;
mod crowd;
#[cfg(not(feature = "broken-rule"))]
mod group;
mod mig;
#[cfg(not(feature = "broken-rule"))]
mod preemption;
mod rent;
mod resume;
mod rules;
mod schedules;
mod sim;
mod stage;
mod withheld;
