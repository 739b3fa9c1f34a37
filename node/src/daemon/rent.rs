//! The renter's side of getting a lease: match locally, request it from the host (the next
//! best offer on refusal), lock the escrow through the host, and return once the container
//! runs.

use std::collections::BTreeSet;

use gpux_market::{Allocation, BidSpec};
use gpux_protocol::{
    AnySigned, AnyVerified, BoundedString, BoundedVec, EscrowId, Ext, ImageDigest, Keypair,
    LeaseRequest, ResourceLimits, Signed, Verified, money,
};
use tokio::sync::{mpsc, oneshot};

use super::Internal;
use crate::attest::now;
use crate::p2p::Client;
use crate::store::{LeaseRecord, LeaseState, NodeState, Role, SledStore};

/// Rents: match locally, request the lease from the host, retry the next-best offer on
/// rejection (up to five offers).
pub(super) struct RentTask {
    pub(super) key: Keypair,
    pub(super) net: Client,
    pub(super) internal: mpsc::Sender<Internal>,
    pub(super) state: NodeState<SledStore>,
    /// The ledger's key (records of locked escrows must be signed by it).
    pub(super) ledger: Option<gpux_protocol::PublicKey>,
    pub(super) spec: BidSpec,
    pub(super) image: Option<ImageDigest>,
    pub(super) workload: Workload,
}

/// Why a host did not give a running lease.
enum RentFailure {
    /// Refused before anything was agreed: try another offer.
    Refused(String),
    /// Agreed, but the start was not confirmed.
    Unconfirmed(String),
}

impl From<String> for RentFailure {
    fn from(why: String) -> Self {
        RentFailure::Refused(why)
    }
}

/// What a rented container runs.
#[derive(Debug, Clone, Default)]
pub(super) struct Workload {
    pub(super) command: Vec<BoundedString<1024>>,
    pub(super) env: Vec<gpux_protocol::EnvVar>,
    pub(super) network: bool,
}

impl RentTask {
    pub(super) async fn run(self) -> Result<serde_json::Value, String> {
        if self.ledger.is_none() {
            return Err("this node has no ledger to lock an escrow with (--ledger or `ledger` in config.toml)".into());
        }
        let mut excluded = BTreeSet::new();
        let mut refusals = Vec::new();
        for _ in 0..5 {
            let (tx, rx) = oneshot::channel();
            self.internal
                .send(Internal::Match {
                    spec: self.spec.clone(),
                    excluded: excluded.clone(),
                    reply: tx,
                })
                .await
                .map_err(|_| "the node is shutting down".to_string())?;
            let Some((allocation, offered_image)) = rx
                .await
                .map_err(|_| "the node is shutting down".to_string())?
            else {
                return Err(if refusals.is_empty() {
                    "no offer in this node's view of the market satisfies the request".into()
                } else {
                    format!("no host accepted: {}", refusals.join("; "))
                });
            };
            excluded.insert(allocation.offer);
            // Without an image named, run the first one the offer lists.
            let Some(image) = self.image.or(offered_image) else {
                refusals.push(format!("{} lists no image", allocation.host.peer_id()));
                continue;
            };
            match self.request(&allocation, image).await {
                Ok(value) => return Ok(value),
                Err(RentFailure::Refused(why)) => refusals.push(why),
                // Accepted, but the start was not confirmed: the lease may still run, so no
                // other host is asked (that could start a second lease).
                Err(RentFailure::Unconfirmed(why)) => return Err(why),
            }
        }
        Err(format!("no host accepted: {}", refusals.join("; ")))
    }

    /// Locks the escrow for an accepted lease through its host (which submits the lock to the
    /// ledger and starts the container once the ledger confirms), and waits until the
    /// container runs.
    async fn lock_and_start(
        &self,
        request: &Verified<LeaseRequest>,
        host: libp2p::PeerId,
    ) -> Result<(), String> {
        let lease = request.id();
        let lock = Signed::sign(
            &self.key,
            gpux_protocol::EscrowLock {
                escrow: request.escrow,
                lease,
                payer: self.key.public(),
                payee: request.host,
                amount: request.escrow_amount,
                price_per_gpu_hour: request.price_per_gpu_hour,
                created_at: now(),
                ext: Ext::new(),
            },
        )
        .map_err(|e| e.to_string())?;
        // The work cannot have started before this moment: receipts are checked against it.
        let host_timing = self
            .state
            .lease(&lease)
            .ok()
            .flatten()
            .and_then(|r| r.accept)
            .and_then(|a| {
                Signed::<gpux_protocol::LeaseAccept>::from_bytes(a)
                    .and_then(Signed::verify)
                    .ok()
            })
            .and_then(|a| crate::host::announced_timing(&a));
        let run = crate::store::RunRecord {
            lease: lease.0,
            started_at: Some(now().0),
            last_contact: now().0,
            host_timing,
            ..Default::default()
        };
        self.state.save_run(&run).map_err(|e| e.to_string())?;
        let ended = |reason: String| {
            let _ = self
                .state
                .set_lease_state(&lease, LeaseState::Ended { reason }, now());
        };
        let answer = match self.net.request(host, lock.as_bytes().to_vec()).await {
            Ok(answer) => answer,
            Err(e) => {
                // The host may still have started it: the lease stays as it is, and receipts
                // (or their absence) decide.
                return Err(format!("the host did not confirm the start: {e}"));
            }
        };
        match AnySigned::from_bytes(answer).and_then(AnySigned::verify) {
            Ok(AnyVerified::LedgerRecord(record)) => {
                if Some(record.signer()) != self.ledger
                    || record.escrow != request.escrow
                    || !matches!(record.entry, gpux_protocol::LedgerEntry::Locked { .. })
                {
                    ended("ContainerFailed".into());
                    return Err(
                        "the host's start confirmation is not the ledger's record of this escrow"
                            .into(),
                    );
                }
                let _ = self
                    .state
                    .set_lease_state(&lease, LeaseState::Running, now());
                Ok(())
            }
            Ok(AnyVerified::LeaseReject(reject)) => {
                ended(format!("{:?}", reject.reason));
                Err(format!(
                    "the host did not start the lease: {:?} ({})",
                    reject.reason, reject.detail
                ))
            }
            Ok(_) => Err("the host answered the escrow lock with an unexpected message".into()),
            Err(e) => Err(format!("the host's answer does not verify: {e}")),
        }
    }

    async fn request(
        &self,
        allocation: &Allocation,
        image: ImageDigest,
    ) -> Result<serde_json::Value, RentFailure> {
        let t = now();
        let mut escrow = [0u8; 16];
        getrandom::fill(&mut escrow).map_err(|e| e.to_string())?;
        let gpus = allocation.gpus.len() as u64;
        let escrow_amount = money::cost(
            gpus * u64::from(self.spec.duration_s).max(money::MIN_BILLED_SECONDS),
            allocation.price_per_gpu_hour,
        )
        .map_err(|e| e.to_string())?;
        let body = LeaseRequest {
            created_at: t,
            expires_at: t.plus_secs(30),
            offer: allocation.offer,
            host: allocation.host,
            gpus: BoundedVec::new(allocation.gpus.clone()).map_err(|e| e.to_string())?,
            price_per_gpu_hour: allocation.price_per_gpu_hour,
            duration_s: self.spec.duration_s,
            kind: self.spec.kind,
            image,
            command: BoundedVec::new(self.workload.command.clone()).map_err(|e| e.to_string())?,
            env: BoundedVec::new(self.workload.env.clone()).map_err(|e| e.to_string())?,
            limits: ResourceLimits {
                memory_bytes: 1 << 30,
                cpu_millis: 1000,
                pids: 256,
                scratch_bytes: 1 << 28,
            },
            network: self.workload.network,
            escrow: EscrowId(escrow),
            escrow_amount,
            bid: None,
            ext: Ext::new(),
        };
        let request = Signed::sign(&self.key, body).map_err(|e| e.to_string())?;
        let peer = libp2p::PeerId::from_bytes(&allocation.host.peer_id().to_bytes())
            .map_err(|e| e.to_string())?;
        let answer = self
            .net
            .request(peer, request.as_bytes().to_vec())
            .await
            .map_err(|e| e.to_string())?;
        match AnySigned::from_bytes(answer).and_then(AnySigned::verify) {
            Ok(AnyVerified::LeaseAccept(accept)) => {
                gpux_protocol::validate::accept_matches_request(&accept, &request)
                    .map_err(|e| e.to_string())?;
                let record = LeaseRecord {
                    lease: request.id().0,
                    role: Role::Renter,
                    request: request.as_bytes().to_vec(),
                    accept: Some(accept.as_bytes().to_vec()),
                    state: LeaseState::Accepted,
                    updated_at: t.0,
                };
                let (tx, rx) = oneshot::channel();
                let _ = self
                    .internal
                    .send(Internal::Leased {
                        record,
                        allocation: allocation.clone(),
                        reply: tx,
                    })
                    .await;
                let _ = rx.await;
                self.lock_and_start(&request, peer)
                    .await
                    .map_err(RentFailure::Unconfirmed)?;
                Ok(serde_json::json!({
                    "running": true,
                    "lease": request.id().to_string(),
                    "host": allocation.host.peer_id().to_string(),
                    "offer": allocation.offer.to_string(),
                    "gpus": allocation.gpus.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "price_per_gpu_hour": allocation.price_per_gpu_hour.amount_text(),
                    "duration_s": self.spec.duration_s,
                    "escrow_amount": escrow_amount.amount_text(),
                }))
            }
            Ok(AnyVerified::LeaseReject(reject)) => Err(RentFailure::Refused(format!(
                "{} refused: {:?} ({})",
                allocation.host.peer_id(),
                reject.reason,
                reject.detail
            ))),
            Ok(_) => Err(RentFailure::Refused(
                "the host answered with an unexpected message".into(),
            )),
            Err(e) => Err(RentFailure::Refused(format!(
                "the host's answer does not verify: {e}"
            ))),
        }
    }
}
