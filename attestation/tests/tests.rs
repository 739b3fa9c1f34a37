//! gpux-attestation integration tests: the real nvml-wrapper probe against the fake driver.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

mod fake;
mod probe;
