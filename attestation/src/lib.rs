//! GPU attestation for gpux: the GPU spec table, plausibility checks that catch a disguised
//! GPU, and the performance challenge (a seeded INT8 matrix product whose rows the prover
//! commits to and the renter samples). NVML probing and signed reports build on these.
//!
//! ```
//! use gpux_attestation::challenge::{pick_rows, prove_cpu, verify, Policy, Shape, Timed};
//! use std::time::Duration;
//!
//! let (seed, coins) = ([7u8; 32], [1u8; 32]);
//! let shape = Shape::new(256, 128, 64).unwrap();
//! let committed = prove_cpu(&seed, shape); // the host: the root first
//! let picked = pick_rows(&coins, shape.m, &Policy::default()); // then the renter's pick
//! let opened = committed.open(&picked);
//! let verdict = verify(&seed, shape, &committed.root, &opened, Timed { observed: Duration::from_millis(5), reference: 0.001 }, &Policy::default(), &coins);
//! assert!(verdict.is_ok());
//! ```

pub mod challenge;
pub mod faults;
pub mod plausibility;
pub mod probe;
pub mod spec;

pub use faults::{WatchEnd, XidEvent, fatal_xid};
pub use plausibility::{Implausible, Plausibility, check_gpu};
pub use probe::{DEFAULT_NVML_LIB, GpuTelemetry, GpuUsage, Probe, ProbeError};
pub use spec::{Disguise, GpuSpec, SPECS, spec_for_name};
