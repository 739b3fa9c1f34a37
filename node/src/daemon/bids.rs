//! This node's standing bids (`gpux bid`): each a signed [`Bid`] in a slot of its own,
//! gossiped on `gpux/bids/1`, with the whole rent it runs when an offer fills it (image,
//! command, environment, workspace, SSH keys, spot and resume: everything `gpux rent`
//! takes), kept here only. A fill is a rent; one that does not happen (the spend cap, no host
//! accepting) is said in `gpux bid list` and the bid stands again; a filled or cancelled bid
//! is withdrawn (a signed [`BidWithdrawal`], gossiped). Records are stored, so bids outlive
//! a restart of the node; a private registry's credentials stay in memory only.

use std::collections::{BTreeMap, BTreeSet};

use bincode::{Decode, Encode};
use gpux_api::{ApiError, BidPlaced, BidView, ErrorCode, RegistryCredentials, RentRequest};
use gpux_market::BidSpec;
use gpux_protocol::{Bid, BidWithdrawal, ContentId, Ext, LeaseKind, Signed, Timestamp, Verified};
use tokio::sync::oneshot;

use super::{Daemon, Event, report};
use crate::attest::now;
use crate::p2p::topics;
use crate::store::Tree;

/// Standing bids a node keeps at once: one per slot.
const MAX_BIDS: usize = gpux_protocol::MAX_BID_SLOTS as usize;

/// The first wait before a bid that hosts refused tries the book again; it doubles with each
/// refusal in a row, up to [`MAX_RETRY_MS`]. (A refusal of this node's own, the spend cap, is
/// tried again at the next tick: nobody else pays for it.)
const FIRST_RETRY_MS: u64 = 10_000;
const MAX_RETRY_MS: u64 = 300_000;

/// Where a bid stands.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) enum BidState {
    Standing,
    /// A rent for it is under way.
    Filling,
    Filled(ContentId),
    Cancelled,
}

/// A bid of this node's, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct BidRecord {
    /// The signed bid.
    pub(crate) bid: Vec<u8>,
    /// What it runs when filled (`gpux_api::RentRequest`, JSON, without secrets).
    pub(crate) rent: Vec<u8>,
    pub(crate) state: BidState,
    /// Why its last fill did not happen.
    pub(crate) refused: Option<String>,
}

/// The bids' part of the daemon: their records, and the credentials of those that pull a
/// private registry's image (in memory only).
#[derive(Debug, Default)]
pub(crate) struct OwnBids {
    records: BTreeMap<ContentId, BidRecord>,
    secrets: BTreeMap<ContentId, RegistryCredentials>,
    /// When each refused bid may try the offers in the book again, and how many refusals in a
    /// row it has had.
    retry: BTreeMap<ContentId, (Timestamp, u32)>,
}

/// A fill's outcome, for the loop.
pub(crate) enum BidEvent {
    Filled {
        bid: ContentId,
        lease: ContentId,
    },
    /// Not filled; `by_host` when a host (not this node) said no, which backs off.
    Refused {
        bid: ContentId,
        why: String,
        by_host: bool,
    },
}

fn verified(record: &BidRecord) -> Option<Verified<Bid>> {
    Signed::<Bid>::from_bytes(record.bid.clone())
        .and_then(Signed::verify)
        .ok()
}

impl Daemon {
    /// Loads the stored bids; those still standing stand again.
    pub(super) fn restore_bids(&mut self) {
        let Ok(records) = self.state.keyed_records::<BidRecord>(Tree::Bids) else {
            tracing::error!("cannot read this node's bids");
            return;
        };
        let t = now();
        for (id, mut record) in records {
            let Some(bid) = verified(&record) else {
                continue;
            };
            if record.state == BidState::Filling {
                // The node stopped while a rent for it ran: it stands again.
                record.state = BidState::Standing;
            }
            if record.state == BidState::Standing
                && bid.expires_at > t
                && let Err(e) = self.market.stand(bid, t)
            {
                tracing::warn!("bid {}: cannot stand again: {}", id.short(), e.message);
            }
            self.bids.records.insert(id, record);
        }
    }

    fn save_bid(&self, id: &ContentId) {
        if let Some(record) = self.bids.records.get(id)
            && let Err(e) = self.state.put_record(Tree::Bids, &id.0, record)
        {
            tracing::error!("bid {}: cannot store it: {e}", id.short());
        }
    }

    /// `POST /v1/bid`: signs and keeps a standing bid (in a free slot), publishes it, and
    /// fills it at once from an offer already in the book.
    pub(super) fn place_bid(
        &mut self,
        mut request: gpux_api::BidRequest,
        reply: oneshot::Sender<Result<BidPlaced, ApiError>>,
    ) {
        let t = now();
        let mut rent = request.rent.take().unwrap_or_else(|| RentRequest {
            query: request.query.clone(),
            gpus: request.gpus,
            max_price: request.max_price.clone(),
            duration_s: request.duration_s,
            ..RentRequest::default()
        });
        // The bid's terms are the rent's.
        rent.query = request.query.clone();
        rent.gpus = request.gpus;
        rent.max_price = request.max_price.clone();
        rent.duration_s = request.duration_s;
        let checked = super::rent::parse(&rent).map(|(spec, _, _)| spec.kind);
        let kind = match checked {
            Ok(kind) => kind,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let standing: Vec<u16> = self
            .bids
            .records
            .values()
            .filter(|r| matches!(r.state, BidState::Standing | BidState::Filling))
            .filter_map(|r| verified(r).filter(|b| b.expires_at > t).map(|b| b.slot))
            .collect();
        if standing.len() >= MAX_BIDS {
            let _ = reply.send(Err(ApiError::new(
                ErrorCode::Conflict,
                format!("this node has {MAX_BIDS} bids standing already"),
            )
            .with_hint("`gpux bid cancel ID` withdraws one")));
            return;
        }
        let slot = (0..gpux_protocol::MAX_BID_SLOTS)
            .find(|s| !standing.contains(s))
            .unwrap_or(0);
        let (bid, fill) = match self.market.place_bid(&self.key, &request, (slot, kind), t) {
            Ok(placed) => placed,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let id = bid.id();
        if let Some(auth) = rent.registry_auth.take() {
            self.bids.secrets.insert(id, auth);
        }
        let rent_json = serde_json::to_vec(&rent.without_secrets()).unwrap_or_default();
        self.bids.records.insert(
            id,
            BidRecord {
                bid: bid.as_bytes().to_vec(),
                rent: rent_json,
                state: BidState::Standing,
                refused: None,
            },
        );
        self.save_bid(&id);
        // With no peer yet the bid still stands locally and fills from offers as they arrive.
        let net = self.net.clone();
        let bytes = bid.as_bytes().to_vec();
        tokio::spawn(async move {
            let _ = net.publish(topics::BIDS, bytes).await;
        });
        let _ = reply.send(Ok(BidPlaced {
            bid: id.to_string(),
            expires_at: bid.expires_at.0,
        }));
        for bid in fill {
            self.fill_bid(bid);
        }
    }

    /// Rents for one of this node's standing bids, which an offer can fill: within the spend
    /// cap, with the bid's whole rent. The outcome comes back as a [`BidEvent`].
    pub(in crate::daemon) fn fill_bid(&mut self, bid: Verified<Bid>) {
        let id = bid.id();
        let Some(record) = self.bids.records.get(&id) else {
            return;
        };
        let Ok(mut rent) = serde_json::from_slice::<RentRequest>(&record.rent) else {
            return self.on_bid_event(BidEvent::Refused {
                bid: id,
                why: "its stored rent does not read".into(),
                by_host: false,
            });
        };
        if self.ledger.is_none() {
            return self.on_bid_event(BidEvent::Refused {
                bid: id,
                why: "this node has no ledger to lock an escrow with".into(),
                by_host: false,
            });
        }
        let spec = match BidSpec::from_bid(&bid) {
            Ok(spec) => spec,
            Err(e) => {
                return self.on_bid_event(BidEvent::Refused {
                    bid: id,
                    why: e.to_string(),
                    by_host: false,
                });
            }
        };
        if let Err(e) = crate::daemon::spend::worst_case(spec.gpus, spec.duration_s, spec.max_price)
            .and_then(|worst| self.within_cap(worst))
        {
            return self.on_bid_event(BidEvent::Refused {
                bid: id,
                why: format!("the spend cap: {}", e.message),
                by_host: false,
            });
        }
        if let Some(record) = self.bids.records.get_mut(&id) {
            record.state = BidState::Filling;
        }
        self.save_bid(&id);
        rent.registry_auth = self.bids.secrets.get(&id).cloned();
        let context = self.rent_context();
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let outcome = match context.run(&rent).await {
                Ok(rented) => match rented.lease.parse() {
                    Ok(lease) => {
                        tracing::info!(
                            "standing bid {} filled: lease {}",
                            id.short(),
                            rented.lease
                        );
                        BidEvent::Filled { bid: id, lease }
                    }
                    Err(_) => BidEvent::Refused {
                        bid: id,
                        why: "the rent gave no lease id".into(),
                        by_host: true,
                    },
                },
                Err(e) => {
                    tracing::info!("standing bid {} not filled: {e}", id.short());
                    BidEvent::Refused {
                        bid: id,
                        why: e.message,
                        by_host: true,
                    }
                }
            };
            report(&events, Event::Bid(outcome)).await;
        });
    }

    /// A fill's outcome: a filled bid is withdrawn; a refused one stands again (until it
    /// lapses), saying why.
    pub(super) fn on_bid_event(&mut self, event: BidEvent) {
        let t = now();
        match event {
            BidEvent::Filled { bid, lease } => {
                if let Some(record) = self.bids.records.get_mut(&bid) {
                    record.state = BidState::Filled(lease);
                    record.refused = None;
                }
                self.bids.retry.remove(&bid);
                self.save_bid(&bid);
                self.withdraw_bid(bid);
            }
            BidEvent::Refused { bid, why, by_host } => {
                let Some(record) = self.bids.records.get_mut(&bid) else {
                    return;
                };
                record.refused = Some(why);
                if record.state == BidState::Cancelled {
                    return self.save_bid(&bid);
                }
                record.state = BidState::Standing;
                let standing = verified(record).filter(|b| b.expires_at > t);
                self.save_bid(&bid);
                let tries = self.bids.retry.get(&bid).map_or(0, |r| r.1) + 1;
                let wait = if by_host {
                    FIRST_RETRY_MS
                        .saturating_mul(1 << (tries - 1).min(16))
                        .min(MAX_RETRY_MS)
                } else {
                    0
                };
                self.bids.retry.insert(bid, (t.plus_ms(wait), tries));
                if let Some(signed) = standing
                    && let Err(e) = self.market.stand(signed, t)
                {
                    tracing::warn!("bid {}: cannot stand again: {}", bid.short(), e.message);
                }
            }
        }
    }

    /// The standing bids whose wait after a refusal is over try the offers in the book again
    /// (a new offer that fits tries at once; this is for those already seen).
    pub(super) fn retry_bids(&mut self) {
        let t = now();
        let due: BTreeSet<ContentId> = self
            .bids
            .records
            .iter()
            .filter(|(_, r)| r.state == BidState::Standing)
            .map(|(id, _)| *id)
            .filter(|id| self.bids.retry.get(id).is_none_or(|(at, _)| *at <= t))
            .collect();
        self.bids.retry.retain(|id, _| {
            self.bids
                .records
                .get(id)
                .is_some_and(|r| r.state == BidState::Standing)
        });
        for bid in self.market.fills_in_book(&due, t) {
            self.fill_bid(bid);
        }
    }

    /// Publishes the withdrawal of `bid` and takes it out of this node's book.
    fn withdraw_bid(&mut self, bid: ContentId) {
        self.market.unstand(&bid);
        let Some(signed) = self.bids.records.get(&bid).and_then(verified) else {
            return;
        };
        self.bids.secrets.remove(&bid);
        let t = now();
        let body = BidWithdrawal {
            seq: t.0.max(signed.seq + 1),
            created_at: t,
            bid,
            slot: signed.slot,
            ext: Ext::new(),
        };
        let Ok(withdrawal) = Signed::sign(&self.key, body) else {
            return;
        };
        let net = self.net.clone();
        let bytes = withdrawal.as_bytes().to_vec();
        tokio::spawn(async move {
            let _ = net.publish(topics::BIDS, bytes).await;
        });
    }

    /// `POST /v1/bids/{bid}/cancel`.
    pub(super) fn cancel_bid(&mut self, bid: &str) -> Result<BidView, ApiError> {
        let unknown = || {
            ApiError::new(
                ErrorCode::UnknownLease,
                format!("no bid {bid} of this node's"),
            )
            .with_hint("`gpux bid list` lists them")
        };
        let id: ContentId = bid
            .parse()
            .map_err(|e| ApiError::bad_input(format!("bid id: {e}")))?;
        let record = self.bids.records.get_mut(&id).ok_or_else(unknown)?;
        if let BidState::Filled(lease) = record.state {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("bid {bid} was filled already (lease {lease})"),
            )
            .with_hint("`gpux stop LEASE` ends the lease"));
        }
        record.state = BidState::Cancelled;
        self.save_bid(&id);
        self.withdraw_bid(id);
        self.bid_views()
            .into_iter()
            .find(|v| v.bid == id.to_string())
            .ok_or_else(unknown)
    }

    /// `GET /v1/bids`: this node's bids, the newest first.
    pub(super) fn bid_views(&self) -> Vec<BidView> {
        let t = now();
        let mut views: Vec<(u64, BidView)> = self
            .bids
            .records
            .iter()
            .filter_map(|(id, record)| {
                let bid = verified(record)?;
                let rent: Option<RentRequest> = serde_json::from_slice(&record.rent).ok();
                let (state, lease) = match record.state {
                    BidState::Filled(lease) => ("filled", Some(lease.to_string())),
                    BidState::Cancelled => ("cancelled", None),
                    _ if bid.expires_at <= t => ("expired", None),
                    BidState::Filling => ("filling", None),
                    BidState::Standing => ("standing", None),
                };
                Some((
                    bid.created_at.0,
                    BidView {
                        bid: id.to_string(),
                        query: bid.query.to_string(),
                        gpus: bid.gpus,
                        max_price: bid.max_price_per_gpu_hour.amount_text(),
                        duration_s: bid.duration_s,
                        kind: match bid.kind {
                            LeaseKind::OnDemand => "on-demand",
                            LeaseKind::Spot => "spot",
                            LeaseKind::Reserved { .. } => "reserved",
                        }
                        .into(),
                        image: rent.and_then(|r| r.image),
                        expires_at: bid.expires_at.0,
                        state: state.into(),
                        lease,
                        refused: record.refused.clone(),
                    },
                ))
            })
            .collect();
        views.sort_by_key(|v| std::cmp::Reverse(v.0));
        views.into_iter().map(|(_, v)| v).collect()
    }
}
