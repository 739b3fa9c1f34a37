//! The performance challenge on a lease's GPUs, over `/gpux/challenge/1`: on a held lease
//! before its work (`gpux rent --challenge`), or on a running one (`gpux challenge LEASE`),
//! whose container the host pauses while it proves, so that a GPU busy with the renter's
//! own work is not taken for a slow one.
//!
//! Before the work starts, the renter's node ([`renter`]) times one exchange with the host
//! (the round trip), sizes a seeded INT8 product so that its compute at the claimed model's
//! reference rate is at least 20 round trips (`gpux_attestation::challenge::shape_for`) and
//! a memory fill of the claimed memory, and sends its signed `ChallengeRequest`. The host
//! ([`host`]) fills the memory and sends the fill's root (the renter's first clock stops:
//! the fill's bandwidth), computes the product and answers with its signed
//! `ChallengeResponse` (the Merkle roots of both: the second clock stops, the product's
//! rate). The renter then picks rows and fill blocks at random (`ChallengePick`) and the
//! host opens each with its Merkle path (a block with its predecessor and its reference);
//! the renter checks them, and each rate by its own clock against 90% of the reference. It
//! downloads the picked rows and blocks only.
//!
//! The host's provers ([`prover`]): fake GPUs are served by the CPU provers
//! (`gpux_attestation::challenge`), answering when the fake GPU's model would have, its
//! rates scaled (`gpux_attestation::spec::FAKE_TENSOR_SCALE`), and for a disguised fake GPU
//! (`really` in the fake driver's configuration) with the real model's memory and rates;
//! real GPUs by the CUDA prover (`gpux_attestation::challenge::gpu`), opened before the
//! renter's clock starts (see docs/attestation.md).

mod host;
mod prover;
mod renter;

use std::time::Duration;

use gpux_attestation::challenge::{self, Policy, Shape, fill::FillShape};
use libp2p::StreamProtocol;

pub(crate) use host::ChallengeHost;
pub(crate) use prover::fake_gpus;
pub(crate) use renter::run;

/// `/gpux/challenge/1`.
pub(crate) const CHALLENGE: StreamProtocol =
    StreamProtocol::new(gpux_protocol::plane_wire::CHALLENGE_PROTOCOL);
/// The compute must last this many round trips at the reference rate...
const RTT_FACTOR: f64 = 20.0;
/// ...and at least this long, so that a prover's fixed costs (starting threads or kernels,
/// signing, a GPU's clocks ramping up) are a small part of what is timed.
const MIN_COMPUTE: Duration = Duration::from_millis(250);
/// How long the host may take, all told.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// What a renter holds a GPU model's challenge against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reference {
    /// The INT8 product's rate, Gop/s.
    pub(crate) gops: f64,
    /// The memory fill's bandwidth, GB/s (`None`: not judged, only that the memory was
    /// filled).
    pub(crate) gbs: Option<f64>,
    /// The memory the fill covers, bytes (0: no fill).
    pub(crate) fill_bytes: u64,
}

/// A renter's own reference for a family (`--challenge-reference FAMILY=GOPS[,GBS[,SCALE]]`):
/// fake GPUs prove on the CPU, so their rates are the CPU's and their memory a scale of
/// what they claim.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OwnReference {
    /// The product's rate, Gop/s.
    pub gops: f64,
    /// The fill's bandwidth, GB/s (`None`: not judged).
    pub gbs: Option<f64>,
    /// The share of the claimed memory the fill covers, on top of the usual 90%.
    pub memory_scale: f64,
}

impl std::str::FromStr for OwnReference {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let positive = |t: &str| {
            t.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| format!("'{t}' is not a positive number"))
        };
        let mut parts = text.split(',');
        let gops = positive(parts.next().unwrap_or_default())?;
        let gbs = parts.next().map(positive).transpose()?;
        let memory_scale = parts.next().map(positive).transpose()?.unwrap_or(1.0);
        if memory_scale > 1.0 || parts.next().is_some() {
            return Err("expected GOPS[,GBS[,SCALE]] with SCALE at most 1".into());
        }
        Ok(OwnReference {
            gops,
            gbs,
            memory_scale,
        })
    }
}

/// What a passed challenge measured, and its evidence: the renter's signed request and the
/// host's signed answer (what a `ChallengeResult` carries).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measured {
    pub(crate) shape: Shape,
    pub(crate) rows_checked: u32,
    pub(crate) opened_bytes: u64,
    pub(crate) verify: Duration,
    pub(crate) achieved_gops: f64,
    pub(crate) reference_gops: f64,
    /// The fill: its bytes, the bandwidth achieved and the reference (when judged).
    pub(crate) fill: Option<(u64, f64, Option<f64>)>,
    pub(crate) round_trip: Duration,
    pub(crate) request: Vec<u8>,
    pub(crate) response: Vec<u8>,
}

impl Measured {
    /// The speed measured against the reference, per mille (at most 10,000).
    pub(crate) fn speed_permille(&self) -> u16 {
        (self.achieved_gops / self.reference_gops * 1000.0).clamp(0.0, 10_000.0) as u16
    }
}

/// Why a challenge did not pass.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChallengeFailure {
    /// The host's answer was wrong, or too slow: the lease must end.
    #[error("{0}")]
    Failed(String),
    /// The challenge could not be run (refused, a broken link): nothing was learned.
    #[error("{0}")]
    NotRun(String),
}

/// The product's shape: its compute at `reference_gops` lasts [`RTT_FACTOR`] round trips,
/// and at least [`MIN_COMPUTE`].
pub(crate) fn size_for(reference_gops: f64, round_trip: Duration) -> Shape {
    challenge::shape_for(
        reference_gops,
        round_trip.mul_f64(RTT_FACTOR).max(MIN_COMPUTE),
    )
}

/// The fill of `bytes` (`None` for none, or too little to fill).
pub(crate) fn fill_for(bytes: u64) -> Option<FillShape> {
    (bytes >= 1 << 20).then(|| FillShape::for_bytes(bytes))
}

/// What one challenge against `reference` takes at the reference rates: the fill's traffic
/// at its bandwidth (when judged) and the product's least time.
pub(crate) fn expected_time(reference: &Reference) -> Duration {
    let fill = match (fill_for(reference.fill_bytes), reference.gbs) {
        (Some(f), Some(gbs)) if gbs > 0.0 => Duration::from_secs_f64(f.traffic() / (gbs * 1e9)),
        _ => Duration::ZERO,
    };
    fill + MIN_COMPUTE
}

/// How long the renter waits for a commitment to work that takes `seconds` at the
/// reference: the time a prover at the policy's lowest passing share needs, plus four
/// round trips and a second of slack, at most [`ANSWER_WITHIN`]. An answer after it would
/// fail the verdict anyway.
pub(crate) fn answer_within(seconds: f64, round_trip: Duration) -> Duration {
    let slowest_passing = seconds / Policy::default().min_share;
    let s = slowest_passing + round_trip.as_secs_f64() * 4.0 + 1.0;
    Duration::from_secs_f64(s.min(ANSWER_WITHIN.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_renter_waits_as_long_as_a_passing_prover_needs_and_no_longer() {
        let rtt = Duration::from_millis(50);
        assert!(size_for(1.0, Duration::ZERO).operations() >= 0.25e9);
        let reference = 0.2;
        let shape = size_for(reference, rtt);
        assert!(shape.operations() >= reference * 1e9 * rtt.as_secs_f64() * RTT_FACTOR);
        let seconds = shape.operations() / (reference * 1e9);
        let within = answer_within(seconds, rtt);
        // The slowest prover that still passes answers just inside the wait.
        let slowest = Duration::from_secs_f64(seconds / Policy::default().min_share);
        assert!(within > slowest + rtt * 2, "{within:?} vs {slowest:?}");
        assert!(within < slowest + Duration::from_secs(2), "{within:?}");
        // An absurdly slow reference never holds the renter past the hard cap.
        assert_eq!(answer_within(1e9, rtt), ANSWER_WITHIN);
    }

    #[test]
    fn a_renters_own_reference_reads_rates_and_a_memory_scale() {
        let own: OwnReference = "1.5".parse().unwrap();
        assert_eq!((own.gops, own.gbs, own.memory_scale), (1.5, None, 1.0));
        let own: OwnReference = "2,0.5,0.001".parse().unwrap();
        assert_eq!(
            (own.gops, own.gbs, own.memory_scale),
            (2.0, Some(0.5), 0.001)
        );
        for bad in ["", "x", "-1", "1,0", "1,1,2", "1,1,0.5,3"] {
            assert!(bad.parse::<OwnReference>().is_err(), "{bad}");
        }
        assert!(fill_for(1000).is_none());
        let fill = fill_for(72 << 20).unwrap();
        assert!(
            fill.bytes() <= 72 << 20 && fill.bytes() > 70 << 20,
            "{fill:?}"
        );
    }
}
