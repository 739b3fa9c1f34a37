//! Standing bids: when a new offer arrives, the bids it can satisfy, best bid first.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use gpux_protocol::{Bid, ContentId, LeaseKind, Timestamp, Verified};

use super::filter::{Facts, clause_holds};
use super::{BidSpec, OrderBook};
use crate::query::QueryError;

/// Why a bid was not added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BidError {
    /// The bid has expired.
    #[error("the bid expired at {0}")]
    Expired(Timestamp),
    /// Its query does not parse.
    #[error("the bid's query is invalid: {0}")]
    Query(#[from] QueryError),
    /// The renter already has a bid with this or a higher seq.
    #[error("bid seq {seq} is not newer than {newest}")]
    Replay {
        /// The bid's seq.
        seq: u64,
        /// The renter's newest.
        newest: u64,
    },
    /// The book is full (`BookConfig::max_bids`) of bids paying at least as much.
    #[error("the book is full of standing bids paying at least as much as this one")]
    Full,
}

#[derive(Debug, Clone)]
struct StandingBid {
    spec: BidSpec,
    expires_at: u64,
    key: (Reverse<u64>, u64, ContentId),
}

/// (max price descending, created_at, id): best bid first.
#[derive(Debug, Clone, Default)]
pub(crate) struct Bids {
    bids: HashMap<ContentId, StandingBid>,
    order: BTreeSet<(Reverse<u64>, u64, ContentId)>,
    /// Each renter's bid in each of its slots: (seq, id, expires_at), kept (for the seq)
    /// after it was filled or withdrawn, until it lapses.
    by_renter: HashMap<(gpux_protocol::PublicKey, u16), (u64, ContentId, u64)>,
}

impl Bids {
    fn remove(&mut self, id: &ContentId) -> bool {
        match self.bids.remove(id) {
            Some(bid) => {
                self.order.remove(&bid.key);
                true
            }
            None => false,
        }
    }

    pub(crate) fn expire(&mut self, now: u64) {
        let gone: Vec<ContentId> = self
            .bids
            .iter()
            .filter(|(_, b)| b.expires_at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.remove(&id);
        }
        self.by_renter
            .retain(|_, (_, _, expires_at)| *expires_at > now);
    }
}

impl OrderBook {
    /// Adds a renter's standing bid; a newer bid (higher seq) from the same renter in the
    /// same slot replaces the older one.
    pub fn add_bid(&mut self, bid: &Verified<Bid>, now: Timestamp) -> Result<(), BidError> {
        if bid.expires_at <= now {
            return Err(BidError::Expired(bid.expires_at));
        }
        let spec = BidSpec::from_bid(bid)?;
        if let Some(&(newest, old, _)) = self.bids.by_renter.get(&(bid.signer(), bid.slot)) {
            // The same bid again (standing after a fill that did not happen) is taken.
            if bid.seq < newest || (bid.seq == newest && old != bid.id()) {
                return Err(BidError::Replay {
                    seq: bid.seq,
                    newest,
                });
            }
            self.bids.remove(&old);
        }
        let key = (
            Reverse(bid.max_price_per_gpu_hour.0),
            bid.created_at.0,
            bid.id(),
        );
        if self.bids.bids.len() >= self.config.max_bids {
            match self.bids.order.last().copied() {
                Some(worst) if worst > key => {
                    self.bids.remove(&worst.2);
                }
                _ => return Err(BidError::Full),
            }
        }
        if self.bids.by_renter.len() >= self.config.max_bids.saturating_mul(2) {
            // Withdrawn bids' seqs go first (their bids are refused as replays no more).
            let standing = &self.bids.bids;
            self.bids
                .by_renter
                .retain(|_, (_, id, _)| standing.contains_key(id));
        }
        self.bids.by_renter.insert(
            (bid.signer(), bid.slot),
            (bid.seq, bid.id(), bid.expires_at.0),
        );
        self.bids.order.insert(key);
        self.bids.bids.insert(
            bid.id(),
            StandingBid {
                spec,
                expires_at: bid.expires_at.0,
                key,
            },
        );
        Ok(())
    }

    /// Removes a standing bid (matched or cancelled).
    pub fn remove_bid(&mut self, bid: &ContentId) -> bool {
        self.bids.remove(bid)
    }

    /// A renter withdrew a standing bid: it leaves the book when the withdrawal is its
    /// renter's, names its slot and is newer than it. Returns whether it was there.
    pub fn withdraw_bid(&mut self, withdrawal: &Verified<gpux_protocol::BidWithdrawal>) -> bool {
        let key = (withdrawal.signer(), withdrawal.slot);
        match self.bids.by_renter.get(&key) {
            Some(&(seq, id, expires_at)) if id == withdrawal.bid && seq < withdrawal.seq => {
                self.bids
                    .by_renter
                    .insert(key, (withdrawal.seq, id, expires_at));
                self.bids.remove(&id)
            }
            _ => false,
        }
    }

    /// Standing bids.
    pub fn bid_count(&self) -> usize {
        self.bids.bids.len()
    }

    /// The standing bids an offer in the book can satisfy at `now`, best bid first (highest
    /// price, then oldest). Walks bids from the highest price down and stops at the first
    /// that pays less than the offer asks.
    pub fn bids_for_offer(&self, offer: &ContentId, now: Timestamp) -> Vec<ContentId> {
        let Some(entry) = self.by_id.get(offer).and_then(|&i| self.entry(i)) else {
            return Vec::new();
        };
        if entry.expires_at <= now.0 {
            return Vec::new();
        }
        let cheapest = entry.spot_floor.map_or(entry.price, |f| f.min(entry.price));
        let facts = Facts::new(self, entry, now.0);
        let mut found = Vec::new();
        for (Reverse(max), _, id) in &self.bids.order {
            if *max < cheapest {
                break;
            }
            let Some(bid) = self.bids.bids.get(id) else {
                continue;
            };
            if bid.expires_at <= now.0 || !Self::takes(entry, &bid.spec) {
                continue;
            }
            if !bid
                .spec
                .query
                .clauses
                .iter()
                .all(|c| clause_holds(c, &facts))
            {
                continue;
            }
            if let LeaseKind::Reserved { start, .. } = bid.spec.kind
                && start.0 < now.0
            {
                continue;
            }
            let window_ok = match self.match_one(entry, &bid.spec, now.0) {
                Some(n) => bid.spec.allow_spread || n >= usize::from(bid.spec.gpus),
                None => false,
            };
            if window_ok {
                found.push(*id);
            }
        }
        found
    }
}
