//! GPU attestation for gpux: the GPU spec table, plausibility checks that catch a disguised
//! GPU, and the performance challenge (a seeded matrix product verified with Freivalds'
//! algorithm). NVML probing and signed reports build on these.
//!
//! ```
//! use gpux_attestation::challenge::{prove_cpu, verify, Policy};
//! use std::time::Duration;
//!
//! let seed = [7u8; 32];
//! let proof = prove_cpu(&seed, 32);
//! let verdict = verify(&seed, 32, &proof, Duration::from_millis(5), 0.001, &Policy::default(), &[1; 32]);
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
pub use spec::{GpuSpec, SPECS, spec_for_name};
