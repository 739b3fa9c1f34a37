//! Asking one host for a lease: GPUs claimed in this node's book first, the signed
//! request, the host's answer, and asking the same host again for the GPUs its refusal
//! names (docs/market.md, "Many rents at once").

use gpux_api::{Rented, StagedImage};
use gpux_lease::RentReport;
use gpux_market::Allocation;
use gpux_protocol::{
    AnySigned, AnyVerified, BoundedVec, EscrowId, ImageDigest, LeaseRequest, RejectReason,
    ResourceLimits, Signed, money,
};
use tokio::sync::oneshot;

use super::terms::Terms;
use super::{RETRIES_ON_HOST, Refusal, RentEvent, RentTask};
use crate::attest::now;
use crate::daemon::{Event, report};

impl RentTask {
    /// Asks `allocation`'s host for a lease, on GPUs claimed in this node's book first (so
    /// this node's other rents ask for others); when the host refuses because another
    /// renter took them, asks it again for the GPUs it names as free, up to
    /// [`RETRIES_ON_HOST`] times.
    pub(super) async fn request_claimed(
        &self,
        allocation: Allocation,
        image: ImageDigest,
        (staged, pulled): (Option<StagedImage>, Option<gpux_api::PulledImage>),
        (terms, limits): (Terms, ResourceLimits),
    ) -> Result<Rented, Refusal> {
        let host = allocation.host.peer_id();
        // A spot lease that preempts others books what the match found, as it is.
        if !allocation.preempts.is_empty() {
            return self
                .request(&allocation, image, (staged, pulled), (terms, limits), None)
                .await;
        }
        let mut prefer = allocation.gpus.clone();
        let mut avoid = Vec::new();
        let mut last = None;
        let mut previous = None;
        for _ in 0..=RETRIES_ON_HOST {
            let (tx, rx) = oneshot::channel();
            let claim = RentEvent::Claim {
                allocation: allocation.clone(),
                spec: self.spec.clone(),
                release: previous.take(),
                prefer: std::mem::take(&mut prefer),
                avoid: avoid.clone(),
                reply: tx,
            };
            report(&self.events, Event::Rent(claim)).await;
            let Some((claimed, hold)) = rx.await.ok().flatten() else {
                break;
            };
            let result = self
                .request(
                    &claimed,
                    image,
                    (staged.clone(), pulled.clone()),
                    (terms.clone(), limits),
                    Some(hold),
                )
                .await;
            match result {
                Err(Refusal::Taken(why, free)) => {
                    // Released with the next claim.
                    previous = Some(hold);
                    avoid.extend(claimed.gpus.iter().copied());
                    prefer = free;
                    last = Some(why);
                }
                Err(other) => {
                    report(&self.events, Event::Rent(RentEvent::Release(hold))).await;
                    return Err(other);
                }
                ok => return ok,
            }
        }
        if let Some(hold) = previous {
            report(&self.events, Event::Rent(RentEvent::Release(hold))).await;
        }
        Err(Refusal::Taken(
            last.unwrap_or_else(|| {
                format!("{host}: its free GPUs are being asked for by this node's other rents")
            }),
            Vec::new(),
        ))
    }

    async fn request(
        &self,
        allocation: &Allocation,
        image: ImageDigest,
        (staged, pulled): (Option<StagedImage>, Option<gpux_api::PulledImage>),
        (terms, limits): (Terms, ResourceLimits),
        hold: Option<gpux_protocol::ContentId>,
    ) -> Result<Rented, Refusal> {
        let t = now();
        let refused = |e: String| Refusal::Refused(e, None);
        let mut escrow = [0u8; 16];
        getrandom::fill(&mut escrow).map_err(|e| refused(e.to_string()))?;
        let gpus = allocation.gpus.len() as u64;
        let escrow_amount = money::cost(
            gpus * u64::from(self.spec.duration_s).max(money::MIN_BILLED_SECONDS),
            allocation.price_per_gpu_hour,
        )
        .and_then(|gpus| gpus.checked_add(terms.charge))
        .map_err(|e| refused(e.to_string()))?;
        let body = LeaseRequest {
            created_at: t,
            expires_at: t.plus_secs(30),
            offer: allocation.offer,
            host: allocation.host,
            gpus: BoundedVec::new(allocation.gpus.clone()).map_err(|e| refused(e.to_string()))?,
            price_per_gpu_hour: allocation.price_per_gpu_hour,
            duration_s: self.spec.duration_s,
            kind: self.spec.kind,
            image,
            command: BoundedVec::new(self.workload.command.clone())
                .map_err(|e| refused(e.to_string()))?,
            env: BoundedVec::new(self.workload.env.clone()).map_err(|e| refused(e.to_string()))?,
            limits,
            network: self.workload.network,
            escrow: EscrowId(escrow),
            escrow_amount,
            bid: None,
            ssh_keys: BoundedVec::new(self.workload.ssh_keys.clone())
                .map_err(|e| refused(e.to_string()))?,
            ext: terms.ext,
        };
        let request = Signed::sign(&self.key, body).map_err(|e| refused(e.to_string()))?;
        let host = allocation.host.peer_id();
        let peer =
            libp2p::PeerId::from_bytes(&host.to_bytes()).map_err(|e| refused(e.to_string()))?;
        let answer = self
            .net
            .request(peer, request.as_bytes().to_vec())
            .await
            .map_err(|e| refused(format!("{host}: {e}")))?;
        let accept = match AnySigned::from_bytes(answer).and_then(AnySigned::verify) {
            Ok(AnyVerified::LeaseAccept(accept)) => {
                gpux_protocol::validate::accept_matches_request(&accept, &request)
                    .map_err(|e| refused(e.to_string()))?;
                accept
            }
            Ok(AnyVerified::LeaseReject(reject)) => {
                let why = format!("{host} refused: {:?} ({})", reject.reason, reject.detail);
                return Err(match gpux_protocol::reject_free_gpus(&reject) {
                    Some(free) if reject.reason == RejectReason::GpusUnavailable => {
                        Refusal::Taken(why, free)
                    }
                    _ => Refusal::Refused(why, Some(reject.reason)),
                });
            }
            Ok(_) => {
                return Err(refused(format!(
                    "{host} answered with an unexpected message"
                )));
            }
            Err(e) => return Err(refused(format!("{host}'s answer does not verify: {e}"))),
        };
        let (tx, rx) = oneshot::channel();
        let lease = request.id();
        let starts_at = gpux_lease::accept_starts_at(&accept).map(|t| t.0);
        let commit_by = request.commit_wait_ms().ok().flatten().map(|wait| {
            starts_at
                .unwrap_or(accept.created_at.0)
                .saturating_add(wait)
        });
        report(
            &self.events,
            Event::Rent(RentEvent::Accepted {
                request: Box::new(request),
                accept: Box::new(accept),
                allocation: allocation.clone(),
                hold,
                reply: tx,
            }),
        )
        .await;
        match rx.await {
            Ok(report @ (RentReport::Running | RentReport::Held)) => Ok(Rented {
                lease: lease.to_string(),
                host: host.to_string(),
                offer: allocation.offer.to_string(),
                gpus: allocation.gpus.iter().map(ToString::to_string).collect(),
                price_per_gpu_hour: allocation.price_per_gpu_hour.amount_text(),
                duration_s: self.spec.duration_s,
                escrow_amount: escrow_amount.amount_text(),
                image: image.to_string(),
                staged,
                pulled,
                retention: terms.retention,
                starts_at_ms: starts_at,
                commit_by_ms: (report == RentReport::Held).then_some(commit_by).flatten(),
                challenge: None,
                challenge_every_s: None,
            }),
            Ok(RentReport::Failed { detail, .. }) => Err(Refusal::NotStarted(detail)),
            Err(_) => Err(Refusal::NotStarted(
                "the node stopped before the lease started".into(),
            )),
        }
    }
}
