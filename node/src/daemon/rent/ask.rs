//! Asking one host for a lease: the signed request and the host's answer. Which GPUs are
//! claimed first, and asking the same host again for those its refusal names, is the rent
//! search's (`gpux_lease::RentSearch`; docs/market.md, "Many rents at once").

use gpux_api::{Rented, StagedImage};
use gpux_lease::RentReport;
use gpux_market::Allocation;
use gpux_protocol::{
    AnySigned, AnyVerified, BoundedVec, EscrowId, ImageDigest, LeaseRequest, RejectReason,
    ResourceLimits, Signed, money,
};
use tokio::sync::oneshot;

use super::terms::Terms;
use super::{Refusal, RentEvent, RentTask};
use crate::attest::now;
use crate::daemon::{Event, report};

impl RentTask {
    /// Asks `allocation`'s host for a lease, under `hold`, this node's claim on its GPUs
    /// (none: a match that preempts spot leases books what it found, as it is). Once the
    /// host accepts, the lease's machine takes over and says how the start went.
    pub(super) async fn request(
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
            terms: terms.terms,
            ext: gpux_protocol::Ext::new(),
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
