//! The performance challenge on a lease's GPUs, over `/gpux/challenge/1`: on a held lease
//! before its work (`gpux rent --challenge`), or on a running one (`gpux challenge LEASE`),
//! whose container the host pauses while it proves, so that a GPU busy with the renter's
//! own work is not taken for a slow one.
//!
//! Before the work starts, the renter's node times one exchange with the host (the round
//! trip), sizes a seeded matrix product so that its compute at the claimed model's
//! reference rate is at least 20 round trips, and sends its signed `ChallengeRequest`.
//! The host computes the product and answers at once with its signed `ChallengeResponse`
//! (a digest and a commitment to every row: the renter's clock stops here), then sends the
//! rows. The renter checks the rows against the commitments, the product with Freivalds (20
//! rounds: a wrong product passes with probability at most 2^-20) and a few recomputed rows,
//! and the rate by its own clock against 90% of the reference.
//!
//! The prover is pluggable; this host serves fake GPUs with the CPU prover
//! (`gpux_attestation::challenge::prove_cpu`). A CUDA prover for real GPUs is pending (see
//! docs/attestation.md): a host with real GPUs refuses a challenge (`Unavailable`).

use std::time::{Duration, Instant};

use futures::StreamExt;
use gpux_attestation::challenge::{self, Matrix, Policy, Proof};
use gpux_lease::HostPhase;
use gpux_protocol::plane_wire::{
    ChallengeAnswer, ChallengeOpen, MAX_FILE_DATA, Opened, PlaneRefusal,
};
use gpux_protocol::{
    BoundedBytes, BoundedString, BoundedVec, ChallengeRequest, ChallengeResponse, ContentId, Ext,
    Keypair, Signed,
};
use libp2p::{PeerId, StreamProtocol};

use super::{FramedStream, OPEN_WITHIN, framed, recv, send};
use crate::attest::now;
use crate::executor::Executor;
use crate::p2p::Client;
use crate::store::{NodeState, SledStore};

/// `/gpux/challenge/1`.
pub(crate) const CHALLENGE: StreamProtocol =
    StreamProtocol::new(gpux_protocol::plane_wire::CHALLENGE_PROTOCOL);
/// The largest product the CPU prover computes (2·1024³ operations: seconds on one core).
pub(crate) const MAX_CPU_N: u32 = 1024;
/// The smallest product asked for.
const MIN_N: u32 = 64;
/// The compute must last this many round trips at the reference rate.
const RTT_FACTOR: f64 = 20.0;
/// How long the host may take, all told.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// What a passed challenge measured, and its evidence: the renter's signed request and the
/// host's signed answer (what a `ChallengeResult` carries).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measured {
    pub(crate) n: u32,
    pub(crate) achieved_gops: f64,
    pub(crate) reference_gops: f64,
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

/// The product size: the smallest power of two whose compute at `reference_gops` lasts
/// [`RTT_FACTOR`] round trips (at most [`MAX_CPU_N`]).
pub(crate) fn size_for(reference_gops: f64, round_trip: Duration) -> u32 {
    let want_s = round_trip.as_secs_f64() * RTT_FACTOR;
    let mut n = MIN_N;
    while n < MAX_CPU_N && challenge::operations(n as usize) / (reference_gops * 1e9) < want_s {
        n *= 2;
    }
    n
}

/// How long the renter waits for the host's answer to a product of size `n`: the time a
/// prover at the policy's lowest passing share of `reference_gops` needs, plus four round
/// trips and a second of slack, at most [`ANSWER_WITHIN`]. An answer after it would fail
/// the verdict anyway.
pub(crate) fn answer_within(n: u32, reference_gops: f64, round_trip: Duration) -> Duration {
    let slowest_passing = reference_gops.max(1e-6) * Policy::default().min_share * 1e9;
    let compute_s = challenge::operations(n as usize) / slowest_passing;
    let s = compute_s + round_trip.as_secs_f64() * 4.0 + 1.0;
    Duration::from_secs_f64(s.min(ANSWER_WITHIN.as_secs_f64()))
}

/// Runs the challenge of `lease` on `host` (the renter's side); the request names `device`
/// (the lease's first), which a published result binds.
pub(crate) async fn run(
    net: &Client,
    key: &Keypair,
    (host, device): (gpux_protocol::PublicKey, Option<gpux_protocol::GpuUuid>),
    lease: ContentId,
    reference_gops: f64,
) -> Result<Measured, ChallengeFailure> {
    let not_run = |e: String| ChallengeFailure::NotRun(e);
    let peer =
        PeerId::from_bytes(&host.peer_id().to_bytes()).map_err(|e| not_run(e.to_string()))?;
    let stream = net
        .open_stream(peer, CHALLENGE, OPEN_WITHIN)
        .await
        .map_err(|e| not_run(format!("opening the challenge: {e}")))?;
    let mut framed = framed(stream);
    let asked = Instant::now();
    send(&mut framed, &ChallengeOpen { lease })
        .await
        .map_err(|e| not_run(e.to_string()))?;
    match recv::<Opened>(&mut framed, OPEN_WITHIN).await {
        Ok(Opened::Yes) => {}
        Ok(Opened::No { detail, .. }) => {
            return Err(not_run(format!("the host refused: {detail}")));
        }
        Err(e) => return Err(not_run(e.to_string())),
    }
    let round_trip = asked.elapsed();
    let n = size_for(reference_gops, round_trip);
    let mut seed = [0u8; 32];
    let mut coins = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| not_run(e.to_string()))?;
    getrandom::fill(&mut coins).map_err(|e| not_run(e.to_string()))?;
    let request = Signed::sign(
        key,
        ChallengeRequest {
            host,
            created_at: now(),
            seed,
            n,
            gpu: device,
            ext: Ext::new(),
        },
    )
    .map_err(|e| not_run(e.to_string()))?;
    let sent = Instant::now();
    let bytes: BoundedBytes<512> =
        BoundedBytes::new(request.as_bytes().to_vec()).map_err(|e| not_run(e.to_string()))?;
    send(&mut framed, &bytes)
        .await
        .map_err(|e| not_run(e.to_string()))?;
    let failed = |e: String| ChallengeFailure::Failed(e);
    // A host that has not answered by the time the policy's slowest passing prover would
    // have has failed already: the renter stops waiting there, not at `ANSWER_WITHIN`.
    let within = answer_within(n, reference_gops, round_trip);
    let response = match recv::<ChallengeAnswer>(&mut framed, within).await {
        Ok(ChallengeAnswer::Response(bytes)) => bytes,
        Ok(ChallengeAnswer::Failed(why)) => return Err(not_run(format!("the host: {why}"))),
        Ok(_) => return Err(failed("the host answered out of turn".into())),
        Err(e) => {
            return Err(failed(format!(
                "no answer within {:.1} s, the time {:.0}% of the reference {reference_gops:.2} Gop/s needs: {e}",
                within.as_secs_f64(),
                Policy::default().min_share * 100.0
            )));
        }
    };
    let observed = sent.elapsed();
    let response_bytes = response.into_inner();
    let response = Signed::<ChallengeResponse>::from_bytes(response_bytes.clone())
        .and_then(Signed::verify)
        .map_err(|e| failed(format!("the host's response does not verify: {e}")))?;
    if response.signer() != host || response.request != request.id() {
        return Err(failed(
            "the response is not the host's answer to this challenge".into(),
        ));
    }
    // The rows, as committed.
    let n_us = n as usize;
    let mut entries = Vec::with_capacity(n_us * n_us);
    loop {
        match recv::<ChallengeAnswer>(&mut framed, ANSWER_WITHIN).await {
            Ok(ChallengeAnswer::Rows(bytes)) => {
                if entries.len() * 4 + bytes.len() > n_us * n_us * 4 || bytes.len() % 4 != 0 {
                    return Err(failed("the host sent more than the product".into()));
                }
                entries.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            Ok(ChallengeAnswer::Done) => break,
            Ok(_) => return Err(failed("the host answered out of turn".into())),
            Err(e) => return Err(failed(format!("the product did not arrive: {e}"))),
        }
    }
    let product = Matrix::from_entries(n_us, entries)
        .ok_or_else(|| failed("the product is not an n×n matrix of residues".into()))?;
    let proof = Proof {
        digest: response.result_digest,
        row_commitments: response.row_commitments.to_vec(),
        elapsed: Duration::from_nanos(response.elapsed_ns),
        product,
    };
    let verdict = tokio::task::spawn_blocking(move || {
        challenge::verify(
            &seed,
            n_us,
            &proof,
            observed,
            reference_gops,
            &Policy::default(),
            &coins,
        )
    })
    .await
    .map_err(|e| not_run(e.to_string()))?
    .map_err(|e| failed(e.to_string()))?;
    Ok(Measured {
        n,
        achieved_gops: verdict.achieved_gops,
        reference_gops,
        round_trip,
        request: request.as_bytes().to_vec(),
        response: response_bytes,
    })
}

/// The host's side: serves challenges of its held leases with the CPU prover (fake GPUs
/// only).
#[derive(Clone)]
pub(crate) struct ChallengeHost {
    pub(crate) key: Keypair,
    pub(crate) state: NodeState<SledStore>,
    /// Pauses a running lease's container while its challenge proves.
    pub(crate) exec: Executor,
    pub(crate) fake_gpus: bool,
    /// One challenge at a time per host: the prover has the machine's cores.
    pub(crate) busy: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Lets a paused container run again when dropped, on every way out of a challenge.
struct Unpause {
    exec: Executor,
    container: String,
}

impl Drop for Unpause {
    fn drop(&mut self) {
        let exec = self.exec.clone();
        let container = std::mem::take(&mut self.container);
        tokio::spawn(async move {
            if let Err(e) = exec.unpause(&container).await {
                tracing::warn!("unpausing {container} after a challenge: {e}");
            }
        });
    }
}

async fn refuse(framed: &mut FramedStream, code: PlaneRefusal, detail: &str) {
    let _ = send(framed, &Opened::refused(code, detail)).await;
}

impl ChallengeHost {
    /// Takes `/gpux/challenge/1` on `net`.
    pub(crate) fn spawn(self, net: &Client) -> anyhow::Result<()> {
        let mut streams = net.accept_streams(CHALLENGE)?;
        tokio::spawn(async move {
            while let Some((peer, stream)) = streams.next().await {
                let h = self.clone();
                tokio::spawn(async move { h.serve(peer, framed(stream)).await });
            }
        });
        Ok(())
    }

    /// Whether `peer` may challenge `lease` now: its renter, while it is held or running.
    /// `Ok(true)`: it runs, and its container is paused while the host proves.
    fn admit(&self, peer: PeerId, lease: ContentId) -> Result<bool, (PlaneRefusal, String)> {
        let (record, request) = super::renters_lease(&self.state, peer, lease)?;
        let held = record.phase == HostPhase::Starting
            && record.committed_at.is_none()
            && matches!(request.commit_wait_ms(), Ok(Some(_)));
        let running = record.phase == HostPhase::Running;
        if !held && !running {
            return Err((
                PlaneRefusal::NotRunning,
                "a challenge runs on a held lease, before its commit, or on a running one".into(),
            ));
        }
        if !self.fake_gpus {
            return Err((
                PlaneRefusal::Unavailable,
                "this host has no GPU prover yet (the CUDA prover is pending)".into(),
            ));
        }
        Ok(running)
    }

    /// The container of a running lease, paused: `None` when it could not be found or
    /// frozen (the challenge is then refused rather than measured against the workload).
    async fn pause(&self, lease: ContentId) -> Option<String> {
        let hex = gpux_protocol::hex(&lease.0);
        let container = self
            .exec
            .containers()
            .await
            .ok()?
            .into_iter()
            .find(|(l, _)| *l == hex)
            .map(|(_, c)| c)?;
        match self.exec.pause(&container).await {
            Ok(()) => Some(container),
            Err(e) => {
                tracing::warn!("lease {}: pausing for a challenge: {e}", lease.short());
                None
            }
        }
    }

    async fn serve(self, peer: PeerId, mut framed: FramedStream) {
        let open: ChallengeOpen = match recv(&mut framed, OPEN_WITHIN).await {
            Ok(open) => open,
            Err(e) => {
                return refuse(&mut framed, PlaneRefusal::Malformed, &e.to_string()).await;
            }
        };
        let running = match self.admit(peer, open.lease) {
            Ok(running) => running,
            Err((code, detail)) => return refuse(&mut framed, code, &detail).await,
        };
        let Ok(_permit) = self.busy.clone().try_acquire_owned() else {
            return refuse(&mut framed, PlaneRefusal::Busy, "another challenge runs").await;
        };
        // A running lease's workload is frozen from before the renter's clock starts until
        // the host's answer is sent (when it stops): Docker's latency is never timed.
        let paused = if running {
            match self.pause(open.lease).await {
                Some(container) => Some(Unpause {
                    exec: self.exec.clone(),
                    container,
                }),
                None => {
                    let why = "the workload could not be paused for the challenge";
                    return refuse(&mut framed, PlaneRefusal::Unavailable, why).await;
                }
            }
        } else {
            None
        };
        if send(&mut framed, &Opened::Yes).await.is_err() {
            return;
        }
        let fail = |why: &str| ChallengeAnswer::Failed(BoundedString::new(why).unwrap_or_default());
        let request = match recv::<BoundedBytes<512>>(&mut framed, OPEN_WITHIN).await {
            Ok(bytes) => Signed::<ChallengeRequest>::from_bytes(bytes.into_inner())
                .and_then(Signed::verify)
                .ok()
                .filter(|r| {
                    r.host == self.key.public()
                        && PeerId::from_bytes(&r.signer().peer_id().to_bytes()).ok() == Some(peer)
                        && r.n <= MAX_CPU_N
                }),
            Err(_) => return,
        };
        let Some(request) = request else {
            let _ = send(&mut framed, &fail("not a challenge this host answers")).await;
            return;
        };
        let (seed, n) = (request.seed, request.n as usize);
        let Ok(proof) = tokio::task::spawn_blocking(move || challenge::prove_cpu(&seed, n)).await
        else {
            return;
        };
        let Ok(row_commitments) = BoundedVec::new(proof.row_commitments.clone()) else {
            return;
        };
        let body = ChallengeResponse {
            request: request.id(),
            created_at: now(),
            result_digest: proof.digest,
            row_commitments,
            elapsed_ns: u64::try_from(proof.elapsed.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
            ext: Ext::new(),
        };
        let Ok(signed) = Signed::sign(&self.key, body) else {
            return;
        };
        let Ok(bytes) = BoundedBytes::new(signed.as_bytes().to_vec()) else {
            return;
        };
        if send(&mut framed, &ChallengeAnswer::Response(bytes))
            .await
            .is_err()
        {
            return;
        }
        drop(paused);
        let mut chunk = Vec::with_capacity(MAX_FILE_DATA);
        for i in 0..n {
            for v in proof.product.row(i) {
                chunk.extend_from_slice(&v.to_le_bytes());
                if chunk.len() == MAX_FILE_DATA {
                    let rows = BoundedBytes::new(std::mem::take(&mut chunk)).unwrap_or_default();
                    if send(&mut framed, &ChallengeAnswer::Rows(rows))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        if !chunk.is_empty() {
            let rows = BoundedBytes::new(chunk).unwrap_or_default();
            if send(&mut framed, &ChallengeAnswer::Rows(rows))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = send(&mut framed, &ChallengeAnswer::Done).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_renter_waits_as_long_as_a_passing_prover_needs_and_no_longer() {
        let rtt = Duration::from_millis(50);
        let reference = 0.2;
        let n = 512;
        let within = answer_within(n, reference, rtt);
        // The slowest prover that still passes answers just inside the wait.
        let slowest = Duration::from_secs_f64(
            challenge::operations(n as usize) / (reference * Policy::default().min_share * 1e9),
        );
        assert!(within > slowest + rtt * 2, "{within:?} vs {slowest:?}");
        assert!(within < slowest + Duration::from_secs(2), "{within:?}");
        // An absurdly slow reference never holds the renter past the hard cap.
        assert_eq!(answer_within(MAX_CPU_N, 1e-9, rtt), ANSWER_WITHIN);
    }
}
