//! GPU attestation for gpux.
//!
//! **Status: empty.** NVML probing (nvml-wrapper), the fake NVML driver for machines without
//! GPUs, plausibility checks against the GPU spec table and the performance challenge arrive
//! with the attestation issue; until then this crate exports nothing. The wire types it will
//! fill ([`gpux_protocol::Attestation`], [`gpux_protocol::ChallengeRequest`],
//! [`gpux_protocol::ChallengeResponse`]) already exist in `gpux-protocol`.
