//! A passed performance challenge, published as the renter's signed `ChallengeResult` so
//! that every node can grant the host's offers of that device the `challenged` tier.
//!
//! A result must show that the challenger paid the host (the ledger's records of the lease's
//! lock and of a redemption from it), so that a host cannot earn the tier from its own Sybil
//! renters for free. The renter's node keeps each passed challenge until the lease's escrow
//! has been redeemed from, asking the ledger (`LedgerRequest::Proof`) every 10 s; it then
//! signs the result, judges it as any peer would, keeps it and gossips it on the
//! attestations topic. A challenge whose lease pays nothing within the hour is dropped, and
//! so is one still waiting when the node stops.

use gpux_protocol::{
    BoundedBytes, ChallengeResult, ChallengeVerdict, ContentId, EscrowId, Ext, PublicKey, Signed,
    Timestamp,
};

use super::{Daemon, Event, report};
use crate::attest::now;
use crate::p2p::topics;
use crate::plane::challenge::Measured;
use crate::validation::Verdict;

/// Passed challenges waiting for their lease's first redemption, at most.
const MAX_PENDING: usize = 64;
/// How long a passed challenge waits for a redemption, ms.
const PENDING_FOR_MS: u64 = 3_600_000;

/// A passed challenge not published yet.
#[derive(Debug)]
pub(crate) struct Pending {
    lease: ContentId,
    host: PublicKey,
    escrow: EscrowId,
    request: Vec<u8>,
    response: Vec<u8>,
    speed_permille: u16,
    since: Timestamp,
    asking: bool,
}

impl Daemon {
    /// The renter's challenge of `lease` passed: kept until the lease has paid the host.
    pub(crate) fn challenge_passed(&mut self, lease: ContentId, measured: &Measured) {
        let Some(request) = self.renter.lease_request(&lease) else {
            return;
        };
        if self.pending_results.len() >= MAX_PENDING {
            self.pending_results.remove(0);
        }
        self.pending_results.push(Pending {
            lease,
            host: request.host,
            escrow: request.escrow,
            request: measured.request.clone(),
            response: measured.response.clone(),
            speed_permille: measured.speed_permille(),
            since: now(),
            asking: false,
        });
    }

    /// Asks the ledger whether the leases of the passed challenges have paid their hosts.
    pub(crate) fn fetch_proofs(&mut self) {
        let t = now();
        self.pending_results
            .retain(|p| t.ms_since(p.since) <= PENDING_FOR_MS);
        let Some(ledger) = self.ledger.clone() else {
            return;
        };
        for pending in self.pending_results.iter_mut().filter(|p| !p.asking) {
            pending.asking = true;
            let (ledger, events) = (ledger.clone(), self.events_tx.clone());
            let (lease, escrow) = (pending.lease, pending.escrow);
            tokio::spawn(async move {
                let proof = ledger.proof(escrow).await.map_err(|e| e.to_string());
                report(&events, Event::Proof { lease, proof }).await;
            });
        }
    }

    /// The ledger's records of a passed challenge's escrow: once a redemption is among them,
    /// the result is signed, judged, kept and published.
    pub(crate) fn on_proof(
        &mut self,
        lease: ContentId,
        proof: Result<(Vec<u8>, Option<Vec<u8>>), String>,
    ) {
        let Some(i) = self.pending_results.iter().position(|p| p.lease == lease) else {
            return;
        };
        self.pending_results[i].asking = false;
        let (locked, paid) = match proof {
            Ok((locked, Some(paid))) => (locked, paid),
            Ok((_, None)) => return,
            Err(e) => {
                tracing::debug!("the ledger's records of lease {}: {e}", lease.short());
                return;
            }
        };
        let pending = self.pending_results.remove(i);
        match self.publish_result(pending, locked, paid) {
            Ok(host) => tracing::info!(
                "lease {}: published the passed challenge of {}",
                lease.short(),
                host.peer_id()
            ),
            Err(why) => tracing::warn!(
                "lease {}: the passed challenge was not published: {why}",
                lease.short()
            ),
        }
    }

    fn publish_result(
        &mut self,
        p: Pending,
        locked: Vec<u8>,
        paid: Vec<u8>,
    ) -> Result<PublicKey, String> {
        let body = ChallengeResult {
            host: p.host,
            attestation: self
                .market
                .validator
                .latest_attestation(&p.host)
                .unwrap_or(ContentId([0; 32])),
            request: bounded(p.request)?,
            response: bounded(p.response)?,
            verdict: ChallengeVerdict::Passed {
                speed_permille: p.speed_permille,
            },
            locked: bounded(locked)?,
            paid: bounded(paid)?,
            created_at: now(),
            ext: Ext::new(),
        };
        let signed = Signed::sign(&self.key, body).map_err(|e| e.to_string())?;
        let data = signed.as_bytes().to_vec();
        // Judged here as every peer will judge it; kept (it survives a restart) and sent.
        match self
            .market
            .validator
            .validate(topics::CHALLENGES, data.clone(), now())
        {
            Verdict::Accept(_) => {}
            Verdict::Reject(why) | Verdict::Ignore(why) => return Err(why),
        }
        let _ = self.state.snapshot_offer(&signed.id(), &data);
        let net = self.net.clone();
        tokio::spawn(async move {
            let _ = net.publish(topics::CHALLENGES, data).await;
        });
        Ok(p.host)
    }
}

fn bounded<const N: usize>(bytes: Vec<u8>) -> Result<BoundedBytes<N>, String> {
    BoundedBytes::new(bytes).map_err(|e| e.to_string())
}
