//! The router: one enum of everything that arrives from the network, decoded once, and one
//! dispatch to the component it is for.
//!
//! A request is classified by its protocol and by the kind in its verified envelope (never
//! by peeking at bytes); what a protocol does not carry is answered with an empty frame. A
//! ledger frame goes to the ledger service as it is (frames are not envelopes).

use gpux_protocol::ledger_wire::{self, LedgerResponse, RefusalCode};
use gpux_protocol::{
    AnySigned, AnyVerified, EscrowLock, LeaseCommit, LeaseEnd, LeaseRequest, LogChunk,
    PreemptionNotice, UsageReceipt, Verified,
};

use super::Daemon;
use crate::attest::now;
use crate::p2p::{InboundId, NetworkEvent, PeerId, Proto, topics};

/// A request from a peer, typed.
pub(crate) enum Inbound {
    /// `/gpux/lease/1`: a renter asks for a lease (for the host role).
    LeaseRequest(Box<Verified<LeaseRequest>>),
    /// `/gpux/lease/1`: a renter locks the escrow of an accepted lease (host role).
    EscrowLock(Verified<EscrowLock>),
    /// `/gpux/lease/1`: a renter ends a lease (host role).
    RenterEnd(Verified<LeaseEnd>),
    /// `/gpux/lease/1`: a renter commits a held lease: its work starts (host role).
    Commit(Verified<LeaseCommit>),
    /// `/gpux/receipt/1`: a host's receipt (renter role).
    Receipt(Verified<UsageReceipt>),
    /// `/gpux/receipt/1`: a host's container output (renter role).
    LogChunk(Verified<LogChunk>),
    /// `/gpux/receipt/1`: a host ends a lease (renter role).
    HostEnd(Verified<LeaseEnd>),
    /// `/gpux/receipt/1`: a host preempts a spot lease (renter role).
    Notice(Verified<PreemptionNotice>),
    /// `/gpux/ledger/2`: a frame for the ledger service.
    Ledger(Vec<u8>),
    /// `/gpux/raft/1`: a frame for this node's membership of a replicated ledger.
    Raft(Vec<u8>),
    /// Anything else (it does not verify, or the protocol does not carry it).
    Unexpected(String),
}

impl Inbound {
    /// Decodes and verifies a request of `proto`.
    pub(crate) fn decode(proto: Proto, data: Vec<u8>) -> Inbound {
        match proto {
            Proto::Ledger => return Inbound::Ledger(data),
            Proto::Raft => return Inbound::Raft(data),
            _ => {}
        }
        let verified = match AnySigned::from_bytes(data).and_then(AnySigned::verify) {
            Ok(v) => v,
            Err(e) => return Inbound::Unexpected(e.to_string()),
        };
        match (proto, verified) {
            (Proto::Lease, AnyVerified::LeaseRequest(r)) => Inbound::LeaseRequest(Box::new(r)),
            (Proto::Lease, AnyVerified::EscrowLock(l)) => Inbound::EscrowLock(l),
            (Proto::Lease, AnyVerified::LeaseEnd(e)) => Inbound::RenterEnd(e),
            (Proto::Lease, AnyVerified::LeaseCommit(c)) => Inbound::Commit(c),
            (Proto::Receipt, AnyVerified::UsageReceipt(r)) => Inbound::Receipt(r),
            (Proto::Receipt, AnyVerified::LogChunk(c)) => Inbound::LogChunk(c),
            (Proto::Receipt, AnyVerified::LeaseEnd(e)) => Inbound::HostEnd(e),
            (Proto::Receipt, AnyVerified::PreemptionNotice(n)) => Inbound::Notice(n),
            (proto, other) => Inbound::Unexpected(format!("{:?} on {proto:?}", other.kind())),
        }
    }
}

impl Daemon {
    /// Answers an inbound request with `data`, from a task of its own.
    pub(crate) fn respond(&self, id: InboundId, data: Vec<u8>) {
        let net = self.net.clone();
        tokio::spawn(async move {
            let _ = net.respond(id, data).await;
        });
    }

    /// Everything from the network.
    pub(super) fn on_network_event(&mut self, event: NetworkEvent) {
        match event {
            NetworkEvent::Gossip {
                id,
                source,
                topic,
                data,
            } => {
                let (acceptance, fill, score) = self.market.on_gossip(&topic, data, source, now());
                self.net.report_nowait(id, source, acceptance);
                // A renter's passed challenge of this host: its offers claim the tier now.
                if topic == topics::CHALLENGES
                    && let Some(host) = &self.host
                    && host.challenged
                        != self
                            .market
                            .validator
                            .challenged_devices(self.key.public(), now())
                {
                    self.publish_offers_soon();
                    self.publish_if_due();
                }
                if let Some(score) = score {
                    self.net.set_app_score_nowait(source, score);
                }
                for bid in fill {
                    self.fill_bid(bid);
                }
            }
            NetworkEvent::PeerIp { peer, ip } => self.market.budgets.connected(peer, ip),
            NetworkEvent::Connected(peer) => {
                // Bounded by the swarm's connection limits; kept only while connected.
                self.peers.insert(peer);
            }
            NetworkEvent::Disconnected(peer) => {
                self.peers.remove(&peer);
                self.rtts.remove(&peer);
                self.links.remove(&peer);
            }
            // Kept for connected peers only: the best way each is connected.
            NetworkEvent::Link { peer, link } if self.peers.contains(&peer) => {
                let best = self.links.get(&peer).map_or(link, |l| (*l).max(link));
                self.links.insert(peer, best);
            }
            NetworkEvent::Link { .. } => {}
            NetworkEvent::Reachability {
                reachability,
                relayed_at,
            } => {
                self.reachability = (
                    reachability,
                    relayed_at.iter().map(ToString::to_string).collect(),
                );
            }
            // Kept for connected peers only.
            NetworkEvent::Rtt { peer, rtt } if self.peers.contains(&peer) => {
                // The ledger client gives each member time by its round trips.
                if let Some(ledger) = &self.ledger {
                    ledger.note_rtt(&peer, rtt);
                }
                self.rtts
                    .insert(peer, u64::try_from(rtt.as_millis()).unwrap_or(u64::MAX));
            }
            NetworkEvent::Rtt { .. } => {}
            NetworkEvent::Request {
                id,
                proto,
                peer,
                data,
            } => self.on_request(id, peer, Inbound::decode(proto, data)),
            // A new peer fills its book from our next publication: publish soon (fresh
            // signatures, so the messages are new), at most every few seconds; only for a
            // subscriber to one of our own families (a peer following others' would not
            // take our offers, and at 100 nodes every new connection announces up to 20
            // topics).
            NetworkEvent::Subscribed { topic, .. }
                if topics::attestation_family(&topic).is_some_and(|key| {
                    self.host
                        .as_ref()
                        .is_some_and(|h| h.families().iter().any(|f| f.key() == key))
                }) =>
            {
                self.publish_offers_soon();
                self.publish_if_due();
            }
            _ => {}
        }
    }

    fn on_request(&mut self, id: InboundId, peer: PeerId, inbound: Inbound) {
        match inbound {
            Inbound::Raft(frame) => match &self.ledger_cluster {
                Some(cluster) => {
                    let (answer, net) = (cluster.serve_raft(peer, frame), self.net.clone());
                    tokio::spawn(async move {
                        let _ = net.respond(id, answer.await).await;
                    });
                }
                None => self.respond(id, Vec::new()),
            },
            Inbound::Ledger(frame) if self.ledger_cluster.is_some() => {
                let Some(cluster) = &self.ledger_cluster else {
                    return;
                };
                let answer = cluster.handle(&frame, now());
                let (net, recorder) = (self.net.clone(), self.recorder.clone());
                tokio::spawn(async move {
                    let response = answer.await;
                    let (op, outcome) = crate::metrics::ledger_op_of(&frame, &response);
                    recorder.ledger_op(op, outcome);
                    let _ = net.respond(id, ledger_wire::encode(&response)).await;
                });
            }
            Inbound::Ledger(frame) => {
                let response = match self.ledger_service.as_mut() {
                    Some(service) => {
                        let response = service.handle(&frame, now());
                        let (op, outcome) = crate::metrics::ledger_op_of(&frame, &response);
                        self.recorder.ledger_op(op, outcome);
                        response
                    }
                    None => LedgerResponse::refused(
                        RefusalCode::NotServed,
                        "this node does not serve a ledger",
                    ),
                };
                self.respond(id, ledger_wire::encode(&response));
            }
            Inbound::LeaseRequest(request) => match self.host.as_mut() {
                Some(host) => {
                    let (answer, accepted) = host.on_lease_request(*request, now());
                    if accepted {
                        // Preempted spot leases' GPUs stay offered; the new lease's do not.
                        // The leased GPUs leave the published offers at the next (paced)
                        // publication.
                        self.publish_offers_soon();
                    }
                    self.respond(id, answer);
                }
                None => self.respond(id, Vec::new()),
            },
            Inbound::EscrowLock(lock) => match self.host.as_mut() {
                // Answered by the lease once the ledger confirmed the lock and the container
                // runs (or with a refusal).
                Some(host) => {
                    if let Some(answer) = host.on_lock(id, lock) {
                        self.respond(id, answer);
                    }
                }
                None => self.respond(id, Vec::new()),
            },
            Inbound::RenterEnd(end) => {
                if let Some(host) = self.host.as_mut() {
                    host.on_renter_end(end);
                }
                self.respond(id, Vec::new());
            }
            Inbound::Commit(commit) => {
                if let Some(host) = self.host.as_mut() {
                    host.on_commit(commit);
                }
                self.respond(id, Vec::new());
            }
            Inbound::Receipt(receipt) => {
                let answer = self.renter.on_receipt(receipt);
                self.respond(id, answer);
            }
            Inbound::LogChunk(chunk) => {
                self.renter.on_log_chunk(&chunk);
                self.respond(id, Vec::new());
            }
            Inbound::HostEnd(end) => {
                self.renter.on_host_end(end);
                self.respond(id, Vec::new());
            }
            Inbound::Notice(notice) => {
                self.renter.on_notice(notice);
                self.respond(id, Vec::new());
            }
            Inbound::Unexpected(what) => {
                tracing::debug!("unexpected request from {peer}: {what}");
                self.respond(id, Vec::new());
            }
        }
    }
}
