//! The renter role: one [`RenterLease`] machine per lease, and the effects runner that alone
//! carries out what they decide (the store, the host's link, the ledger, the rent's answer).

use std::collections::{BTreeMap, BTreeSet};

use gpux_api::{ApiError, ErrorCode, Stopping};
use gpux_lease::{
    LedgerVerdict, LockOutcome, RentReport, RenterEffect, RenterInput, RenterLease, RenterPhase,
};
use gpux_protocol::{
    AnySigned, AnyVerified, ContentId, Keypair, LeaseAccept, LeaseEnd, LeaseRequest, LogChunk,
    PreemptionNotice, PublicKey, Timestamp, UsageReceipt, Verified,
};
use tokio::sync::{mpsc, oneshot};

use super::{Event, report, schedule};
use crate::attest::now;
use crate::ledger::LedgerClient;
use crate::p2p::Client;
use crate::store::{NodeState, SledStore, StoreError};

/// Most container output a renter keeps per lease.
const MAX_LOG_BYTES: u64 = 64 << 20;

/// The renter role.
pub(crate) struct RenterRole {
    key: Keypair,
    state: NodeState<SledStore>,
    net: Client,
    events: mpsc::Sender<Event>,
    ledger: Option<LedgerClient>,
    /// Leases not yet settled.
    leases: BTreeMap<ContentId, RenterLease>,
    /// Rents waiting to hear how their start came out.
    rent_replies: BTreeMap<ContentId, oneshot::Sender<RentReport>>,
    /// Leases that ended since [`RenterRole::take_over`] was last called.
    over: Vec<LeaseOver>,
    /// Leases already reported over (until they settle and leave `leases`).
    reported_over: std::collections::BTreeSet<ContentId>,
}

/// A lease of this renter that ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseOver {
    /// The lease.
    pub(crate) lease: ContentId,
    /// Its host.
    pub(crate) host: PublicKey,
    /// For a spot lease: whether the host preempted it (with a notice that held, or by its
    /// own word).
    pub(crate) spot_preempted: Option<bool>,
    /// Whether the host served it: this renter acknowledged a receipt of it.
    pub(crate) served: bool,
}

fn peer_of(key: PublicKey) -> Option<libp2p::PeerId> {
    libp2p::PeerId::from_bytes(&key.peer_id().to_bytes()).ok()
}

impl RenterRole {
    /// The role, with every stored lease not settled restored.
    pub(crate) fn new(
        key: Keypair,
        state: NodeState<SledStore>,
        net: Client,
        events: mpsc::Sender<Event>,
        ledger: Option<LedgerClient>,
        t: Timestamp,
    ) -> Result<Self, StoreError> {
        let mut role = Self {
            key,
            state,
            net,
            events,
            ledger,
            leases: BTreeMap::new(),
            rent_replies: BTreeMap::new(),
            over: Vec::new(),
            reported_over: std::collections::BTreeSet::new(),
        };
        for (id, record) in role.state.renter_leases()? {
            if record.phase == RenterPhase::Settled {
                continue;
            }
            match RenterLease::restore(role.key.clone(), record, t) {
                Ok((lease, effects)) => {
                    role.leases.insert(id, lease);
                    role.apply(id, effects);
                }
                Err(e) => tracing::error!("lease {}: {e}; left as it is", id.short()),
            }
        }
        Ok(role)
    }

    /// The request of this node's lease `id`, while it runs.
    pub(crate) fn running_lease(&self, id: &ContentId) -> Option<&LeaseRequest> {
        self.leases
            .get(id)
            .filter(|l| l.phase() == gpux_lease::RenterPhase::Running)
            .map(|l| &**l.request())
    }

    /// Where one of this node's open leases stands (none: ended, or not here).
    pub(crate) fn phase(&self, id: &ContentId) -> Option<gpux_lease::RenterPhase> {
        self.leases.get(id).map(|lease| lease.phase())
    }

    /// The request of one of this node's leases, in any phase.
    pub(crate) fn lease_request(&self, id: &ContentId) -> Option<&LeaseRequest> {
        self.leases.get(id).map(|l| &**l.request())
    }

    /// The stored record of every rented lease, settled or not.
    pub(crate) fn records(&self) -> Vec<(ContentId, gpux_lease::RenterRecord)> {
        self.state.renter_leases().unwrap_or_default()
    }

    /// The hosts that served this renter: a lease of theirs has an acknowledged receipt.
    pub(crate) fn served_by(&self) -> BTreeSet<PublicKey> {
        self.records()
            .iter()
            .filter(|(_, r)| r.acked.is_some())
            .filter_map(|(_, r)| super::views::request_of(&r.request))
            .map(|request| request.host)
            .collect()
    }

    /// A lease the host accepted: its machine sends the escrow lock; `reply` hears how the
    /// start came out.
    pub(crate) fn start_lease(
        &mut self,
        request: Verified<LeaseRequest>,
        accept: &Verified<LeaseAccept>,
        ledger: &[PublicKey],
        reply: oneshot::Sender<RentReport>,
    ) {
        let id = request.id();
        let Some(&first) = ledger.first() else {
            let _ = reply.send(RentReport::Failed {
                end: gpux_lease::End::NotStarted,
                detail: "no ledger to lock the escrow with".into(),
            });
            return;
        };
        match RenterLease::accepted(self.key.clone(), request, accept, first, now()) {
            Ok((lease, effects)) => {
                let lease = lease.with_ledger_members(ledger.to_vec());
                self.leases.insert(id, lease);
                self.rent_replies.insert(id, reply);
                self.apply(id, effects);
            }
            Err(e) => {
                let _ = reply.send(RentReport::Failed {
                    end: gpux_lease::End::NotStarted,
                    detail: format!("the escrow lock could not be signed: {e}"),
                });
            }
        }
    }

    /// An input for lease `id`.
    pub(crate) fn on_input(&mut self, id: ContentId, input: RenterInput) {
        if let Some(lease) = self.leases.get_mut(&id) {
            let effects = lease.handle(now(), input);
            self.apply(id, effects);
        }
    }

    /// A receipt from a host: the answer (an acknowledgement, a dispute, or nothing).
    pub(crate) fn on_receipt(&mut self, receipt: Verified<UsageReceipt>) -> Vec<u8> {
        let id = receipt.lease;
        let Some(lease) = self.leases.get_mut(&id) else {
            return Vec::new();
        };
        let (seq, bytes) = (receipt.seq, receipt.as_bytes().to_vec());
        let effects = lease.handle(now(), RenterInput::Receipt(receipt));
        let mut answer = Vec::new();
        for effect in &effects {
            if let RenterEffect::Respond { envelope } = effect {
                answer = envelope.clone();
            }
        }
        if !self.apply(id, effects) {
            // The lease's record could not be stored: nothing is answered (the node stops).
            return Vec::new();
        }
        if let Ok(AnyVerified::ReceiptAck(_)) =
            AnySigned::from_bytes(answer.clone()).and_then(AnySigned::verify)
            && let Err(e) = self.state.save_receipt(&id, seq, &bytes, Some(&answer))
        {
            // An acknowledgement this node cannot keep is not given: the lease ends
            // (`store-failed`, said to the host), settled on what was acknowledged before.
            tracing::error!(
                "cannot store receipt {seq} of lease {}: {e}; the lease ends",
                id.short()
            );
            self.on_input(id, RenterInput::StoreFailed);
            return Vec::new();
        }
        answer
    }

    /// Container output from a host (kept, within a bound).
    pub(crate) fn on_log_chunk(&mut self, chunk: &Verified<LogChunk>) {
        let Some(lease) = self.leases.get(&chunk.lease) else {
            return;
        };
        // Bounded: a host cannot fill the renter's disk; and only the lease's host writes.
        if chunk.signer() != lease.request().host || lease.record().log_bytes >= MAX_LOG_BYTES {
            return;
        }
        if self
            .state
            .append_log(&chunk.lease, chunk.seq, &chunk.data)
            .is_ok()
        {
            let input = RenterInput::HostHeard {
                log_bytes: chunk.data.len() as u64,
            };
            self.on_input(chunk.lease, input);
        }
    }

    /// A host's `LeaseEnd`.
    pub(crate) fn on_host_end(&mut self, end: Verified<LeaseEnd>) {
        self.on_input(end.lease, RenterInput::HostEnd(end));
    }

    /// A host's `PreemptionNotice` (the lease checks it).
    pub(crate) fn on_notice(&mut self, notice: Verified<PreemptionNotice>) {
        let id = notice.lease;
        self.on_input(id, RenterInput::Notice(notice));
        if let Some(lease) = self.leases.get(&id) {
            let rec = lease.record();
            match rec.preempted_until {
                Some(at) => tracing::info!("lease {}: preempted, ends at {at}", id.short()),
                None if rec.notice_refused => {
                    tracing::warn!(
                        "lease {}: a preemption notice that does not hold",
                        id.short()
                    )
                }
                None => {}
            }
        }
    }

    /// Asks the host to stop a lease.
    pub(crate) fn stop(&mut self, id: ContentId) -> Result<Stopping, ApiError> {
        let Some(lease) = self.leases.get_mut(&id) else {
            return Err(match self.state.renter_lease(&id) {
                Ok(Some(_)) => {
                    ApiError::new(ErrorCode::Conflict, format!("lease {id} has already ended"))
                }
                _ => ApiError::new(ErrorCode::UnknownLease, format!("no lease {id} here")),
            });
        };
        let effects = lease
            .stop(now())
            .map_err(|e| ApiError::new(ErrorCode::Conflict, format!("lease {id}: {e}")))?;
        self.apply(id, effects);
        Ok(Stopping {
            lease: id.to_string(),
        })
    }

    /// Ends a held lease whose performance challenge failed.
    pub(crate) fn fail_challenge(&mut self, id: ContentId) -> Result<(), ApiError> {
        let lease = self
            .leases
            .get_mut(&id)
            .ok_or_else(|| ApiError::new(ErrorCode::UnknownLease, format!("no lease {id} here")))?;
        let effects = lease
            .fail_challenge(now())
            .map_err(|e| ApiError::new(ErrorCode::Conflict, format!("lease {id}: {e}")))?;
        self.apply(id, effects);
        Ok(())
    }

    /// Commits a held lease: its work starts now.
    pub(crate) fn commit(&mut self, id: ContentId) -> Result<gpux_api::Committed, ApiError> {
        let Some(lease) = self.leases.get_mut(&id) else {
            return Err(match self.state.renter_lease(&id) {
                Ok(Some(_)) => {
                    ApiError::new(ErrorCode::Conflict, format!("lease {id} has already ended"))
                }
                _ => ApiError::new(ErrorCode::UnknownLease, format!("no lease {id} here")),
            });
        };
        let at = now();
        let effects = lease
            .commit(at)
            .map_err(|e| ApiError::new(ErrorCode::Conflict, format!("lease {id}: {e}")))?;
        self.apply(id, effects);
        Ok(gpux_api::Committed {
            lease: id.to_string(),
            committed_at_ms: at.0,
        })
    }

    /// Carries out a lease's effects, in order. Returns false when a step could not be
    /// stored (nothing after it is carried out).
    fn apply(&mut self, id: ContentId, effects: Vec<RenterEffect>) -> bool {
        for effect in effects {
            let Some(lease) = self.leases.get(&id) else {
                return false;
            };
            match effect {
                RenterEffect::Persist => {
                    if let Err(e) = self.state.save_renter_lease(&id, lease.record()) {
                        // Nothing after an unstored step is carried out, and the node stops:
                        // a restart resumes from the last stored one.
                        crate::daemon::store_failed(
                            &self.events,
                            format!("cannot store lease {}: {e}", id.short()),
                        );
                        return false;
                    }
                }
                RenterEffect::SendLock { envelope } => {
                    let (net, events) = (self.net.clone(), self.events.clone());
                    let host = peer_of(lease.request().host);
                    tokio::spawn(async move {
                        let outcome = match host {
                            Some(host) => match net.request(host, envelope).await {
                                Ok(bytes) => {
                                    match AnySigned::from_bytes(bytes).and_then(AnySigned::verify) {
                                        Ok(AnyVerified::LedgerRecord(r)) => {
                                            LockOutcome::Record(Box::new(r))
                                        }
                                        Ok(AnyVerified::LeaseReject(r)) => {
                                            LockOutcome::Rejected(Box::new(r))
                                        }
                                        _ => LockOutcome::Unanswered,
                                    }
                                }
                                Err(e) => {
                                    tracing::warn!(
                                        "lease {}: the host did not confirm the start: {e}",
                                        id.short()
                                    );
                                    LockOutcome::Unanswered
                                }
                            },
                            None => LockOutcome::Unanswered,
                        };
                        report(
                            &events,
                            Event::Renter {
                                lease: id,
                                input: RenterInput::Lock(outcome),
                            },
                        )
                        .await;
                    });
                }
                // The answer to the request being handled: taken by the caller.
                RenterEffect::Respond { .. } => {}
                RenterEffect::SendEnd { envelope } | RenterEffect::SendCommit { envelope } => {
                    if let Some(host) = peer_of(lease.request().host) {
                        let net = self.net.clone();
                        tokio::spawn(async move {
                            let _ = net.request(host, envelope).await;
                        });
                    }
                }
                RenterEffect::Ledger { call, envelope } => {
                    let (ledger, events) = (self.ledger.clone(), self.events.clone());
                    tokio::spawn(async move {
                        let verdict = match ledger {
                            Some(ledger) => ledger.submit(envelope).await,
                            None => LedgerVerdict::Unreachable,
                        };
                        report(
                            &events,
                            Event::Renter {
                                lease: id,
                                input: RenterInput::Ledger { call, verdict },
                            },
                        )
                        .await;
                    });
                }
                RenterEffect::Schedule { at, timer } => schedule(
                    &self.events,
                    at,
                    Event::Renter {
                        lease: id,
                        input: RenterInput::Timer(timer),
                    },
                ),
                RenterEffect::Report(outcome) => {
                    if let Some(reply) = self.rent_replies.remove(&id) {
                        let _ = reply.send(outcome);
                    }
                }
            }
        }
        if let Some(l) = self.leases.get(&id)
            && matches!(l.phase(), RenterPhase::Ended | RenterPhase::Settled)
            && self.reported_over.insert(id)
        {
            let rec = l.record();
            let spot = matches!(l.request().kind, gpux_protocol::LeaseKind::Spot);
            self.over.push(LeaseOver {
                lease: id,
                host: l.request().host,
                served: rec.acked.is_some(),
                spot_preempted: spot.then(|| {
                    rec.preempted_until.is_some()
                        || rec.host_end == Some(gpux_lease::End::Preempted)
                }),
            });
        }
        if self
            .leases
            .get(&id)
            .is_some_and(|l| l.phase() == RenterPhase::Settled)
        {
            self.leases.remove(&id);
            self.rent_replies.remove(&id);
            self.reported_over.remove(&id);
        }
        true
    }

    /// The leases that ended since the last call, once each: their bookings in this node's
    /// view of the market can go, and a spot lease's end counts in its host's interruption
    /// rate.
    pub(crate) fn take_over(&mut self) -> Vec<LeaseOver> {
        std::mem::take(&mut self.over)
    }
}
