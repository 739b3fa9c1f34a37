//! The performance challenge on a lease's GPUs, over `/gpux/challenge/1`: on a held lease
//! before its work (`gpux rent --challenge`), or on a running one (`gpux challenge LEASE`),
//! whose container the host pauses while it proves, so that a GPU busy with the renter's
//! own work is not taken for a slow one.
//!
//! Before the work starts, the renter's node times one exchange with the host (the round
//! trip), sizes a seeded INT8 product so that its compute at the claimed model's reference
//! rate is at least 20 round trips (`gpux_attestation::challenge::shape_for`), and sends its
//! signed `ChallengeRequest`. The host computes the product and answers at once with its
//! signed `ChallengeResponse` (the Merkle root over its rows: the renter's clock stops here).
//! The renter then picks rows at random (`ChallengePick`) and the host opens each with its
//! path; the renter checks them against the root and with random projections, and the rate
//! by its own clock against 90% of the reference. It downloads the picked rows only.
//!
//! The prover is pluggable; this host serves fake GPUs with the CPU prover
//! (`gpux_attestation::challenge::prove_cpu`). A host with real GPUs refuses a challenge
//! (`Unavailable`) until the CUDA prover lands (see docs/attestation.md).

use std::time::{Duration, Instant};

use futures::StreamExt;
use gpux_attestation::challenge::{self, Opened, Policy, Shape};
use gpux_lease::HostPhase;
use gpux_protocol::plane_wire::{
    ChallengeAnswer, ChallengeOpen, ChallengePick, Opened as Open, PlaneRefusal,
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
/// The most operations the CPU prover computes (tens of seconds on two cores): a renter,
/// who pays for the lease, makes its host work at most this long per challenge, one at a
/// time. A fake GPU claiming a faster model than its CPU answers late and fails.
pub(crate) const MAX_CPU_OPS: f64 = 1e11;
/// The most memory the CPU prover holds: `B`, and the product it opens rows of.
const MAX_CPU_BYTES: u64 = 512 << 20;

/// Whether the CPU prover computes a product of `shape`.
fn cpu_proves(shape: Shape) -> Result<(), String> {
    let bytes =
        u64::from(shape.k) * u64::from(shape.n) + 4 * u64::from(shape.m) * u64::from(shape.n);
    if shape.operations() > MAX_CPU_OPS || bytes > MAX_CPU_BYTES {
        return Err(format!(
            "{shape} is more than this host's CPU prover computes ({MAX_CPU_OPS:.0} operations, {} MiB)",
            MAX_CPU_BYTES >> 20
        ));
    }
    Ok(())
}
/// The compute must last this many round trips at the reference rate.
const RTT_FACTOR: f64 = 20.0;
/// How long the host may take, all told.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

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

/// The product's shape: its compute at `reference_gops` lasts [`RTT_FACTOR`] round trips.
pub(crate) fn size_for(reference_gops: f64, round_trip: Duration) -> Shape {
    challenge::shape_for(reference_gops, round_trip.mul_f64(RTT_FACTOR))
}

/// How long the renter waits for the host's commitment to a product of `shape`: the time a
/// prover at the policy's lowest passing share of `reference_gops` needs, plus four round
/// trips and a second of slack, at most [`ANSWER_WITHIN`]. An answer after it would fail
/// the verdict anyway.
pub(crate) fn answer_within(shape: Shape, reference_gops: f64, round_trip: Duration) -> Duration {
    let slowest_passing = reference_gops.max(1e-6) * Policy::default().min_share * 1e9;
    let compute_s = shape.operations() / slowest_passing;
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
    match recv::<Open>(&mut framed, OPEN_WITHIN).await {
        Ok(Open::Yes) => {}
        Ok(Open::No { detail, .. }) => {
            return Err(not_run(format!("the host refused: {detail}")));
        }
        Err(e) => return Err(not_run(e.to_string())),
    }
    let round_trip = asked.elapsed();
    let shape = size_for(reference_gops, round_trip);
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
            m: shape.m,
            k: shape.k,
            n: shape.n,
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
    let within = answer_within(shape, reference_gops, round_trip);
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
    // Only now, with the host committed, does it learn which rows are checked.
    let policy = Policy::default();
    let picked = challenge::pick_rows(&coins, shape.m, &policy);
    let rows = BoundedVec::new(picked.clone()).map_err(|e| not_run(e.to_string()))?;
    send(&mut framed, &ChallengePick { rows })
        .await
        .map_err(|e| not_run(e.to_string()))?;
    let mut opened = Vec::with_capacity(picked.len());
    let mut opened_bytes = 0u64;
    loop {
        match recv::<ChallengeAnswer>(&mut framed, ANSWER_WITHIN).await {
            Ok(ChallengeAnswer::Row {
                index,
                values,
                path,
            }) => {
                if opened.len() == picked.len() || values.len() != 4 * shape.n as usize {
                    return Err(failed("the host opened rows it was not asked for".into()));
                }
                opened_bytes += (values.len() + 32 * path.len()) as u64;
                opened.push(Opened {
                    index,
                    row: values
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                    path: path.iter().map(|h| h.0).collect(),
                });
            }
            Ok(ChallengeAnswer::Done) => break,
            Ok(_) => return Err(failed("the host answered out of turn".into())),
            Err(e) => return Err(failed(format!("the picked rows did not arrive: {e}"))),
        }
    }
    let root = response.rows_root.0;
    let checking = Instant::now();
    let verdict = tokio::task::spawn_blocking(move || {
        challenge::verify(
            &seed,
            shape,
            &root,
            &opened,
            challenge::Timed {
                observed,
                reference: reference_gops,
            },
            &policy,
            &coins,
        )
    })
    .await
    .map_err(|e| not_run(e.to_string()))?
    .map_err(|e| failed(e.to_string()))?;
    Ok(Measured {
        shape,
        rows_checked: picked.len() as u32,
        opened_bytes,
        verify: checking.elapsed(),
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
    let _ = send(framed, &Open::refused(code, detail)).await;
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
        if send(&mut framed, &Open::Yes).await.is_err() {
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
                }),
            Err(_) => return,
        };
        let Some(request) = request else {
            let _ = send(&mut framed, &fail("not a challenge this host answers")).await;
            return;
        };
        let shape = match Shape::new(request.m, request.k, request.n)
            .map_err(|e| e.to_string())
            .and_then(|shape| cpu_proves(shape).map(|()| shape))
        {
            Ok(shape) => shape,
            Err(why) => {
                let _ = send(&mut framed, &fail(&why)).await;
                return;
            }
        };
        let seed = request.seed;
        let Ok(proof) =
            tokio::task::spawn_blocking(move || challenge::prove_cpu(&seed, shape)).await
        else {
            return;
        };
        let body = ChallengeResponse {
            request: request.id(),
            created_at: now(),
            rows_root: ContentId(proof.root),
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
        let Ok(pick) = recv::<ChallengePick>(&mut framed, OPEN_WITHIN).await else {
            return;
        };
        let ascending = pick.rows.windows(2).all(|w| w[0] < w[1]);
        if !ascending || pick.rows.iter().any(|&i| i >= shape.m) {
            let why = "the picked rows are not distinct rows of the product, ascending";
            let _ = send(&mut framed, &fail(why)).await;
            return;
        }
        for row in proof.open(&pick.rows) {
            let values: Vec<u8> = row.row.iter().flat_map(|v| v.to_le_bytes()).collect();
            let (Ok(values), Ok(path)) = (
                BoundedBytes::new(values),
                BoundedVec::new(row.path.into_iter().map(ContentId).collect()),
            ) else {
                return;
            };
            let answer = ChallengeAnswer::Row {
                index: row.index,
                values,
                path,
            };
            if send(&mut framed, &answer).await.is_err() {
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
        let shape = size_for(reference, rtt);
        assert!(shape.operations() >= reference * 1e9 * rtt.as_secs_f64() * RTT_FACTOR);
        let within = answer_within(shape, reference, rtt);
        // The slowest prover that still passes answers just inside the wait.
        let slowest = Duration::from_secs_f64(
            shape.operations() / (reference * Policy::default().min_share * 1e9),
        );
        assert!(within > slowest + rtt * 2, "{within:?} vs {slowest:?}");
        assert!(within < slowest + Duration::from_secs(2), "{within:?}");
        // An absurdly slow reference never holds the renter past the hard cap.
        assert_eq!(answer_within(shape, 1e-9, rtt), ANSWER_WITHIN);
    }
}
