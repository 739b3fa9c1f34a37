//! The node's view of the market: gossip validated into an order book (and a snapshot of it
//! on disk for a fast restart), search, matching for renting, and this node's own standing
//! bids.

use std::collections::{BTreeSet, VecDeque};

use gpux_api::{ApiError, OfferHit};
use gpux_market::query::Query;
use gpux_market::{Allocation, BidSpec, BookConfig, OrderBook};

use crate::budget::{Admit, Budgets, Bursts};
use gpux_protocol::validate::Rules;
use gpux_protocol::{
    AnySigned, AnyVerified, Attestation, Bid, BoundedString, ContentId, Ext, ImageDigest, Keypair,
    LeaseKind, MicroCredits, Signed, Timestamp, Verified,
};
use libp2p::gossipsub::MessageAcceptance;

use crate::store::{NodeState, SledStore};
use crate::validation::{Validator, Verdict};

/// Offer arrival delays kept for the status.
const MAX_ARRIVALS: usize = 10_000;

/// The market view.
pub(crate) struct MarketView {
    pub(crate) book: OrderBook,
    pub(crate) validator: Validator,
    state: NodeState<SledStore>,
    /// This node's own standing bids, filled when an offer that satisfies one arrives.
    own_bids: Vec<Verified<Bid>>,
    /// Delays from an offer's signing to its arrival here, ms.
    pub(crate) arrivals_ms: VecDeque<u64>,
    pub(crate) accepted: u64,
    pub(crate) rejected: u64,
    /// Gossip ignored (innocent but not taken: expired, duplicate, over the rate, ...).
    pub(crate) ignored: u64,
    /// Messages ignored for a relaying peer's budget.
    pub(crate) over_budget: u64,
    /// Gossip budgets per relaying peer and IP group.
    pub(crate) budgets: Budgets,
    /// Signers this node has accepted a message from (bounded, oldest forgotten first).
    known_signers: BTreeSet<gpux_protocol::PublicKey>,
    known_order: VecDeque<gpux_protocol::PublicKey>,
    /// Signers that came in a burst of new signers from one relaying peer.
    bursts: Bursts,
}

/// Signers remembered as known, at most.
const MAX_KNOWN_SIGNERS: usize = 20_000;

impl MarketView {
    /// The view, filled from the snapshot (verified again: it is a cache), judging
    /// challenge results by the records of `ledger`.
    pub(crate) fn new(
        state: NodeState<SledStore>,
        ledger: Vec<gpux_protocol::PublicKey>,
        now: Timestamp,
    ) -> Self {
        let mut view = Self {
            book: OrderBook::new(BookConfig::default()),
            validator: Validator::new(Rules::default()).with_ledger(ledger),
            state,
            own_bids: Vec::new(),
            arrivals_ms: VecDeque::new(),
            accepted: 0,
            rejected: 0,
            ignored: 0,
            over_budget: 0,
            budgets: Budgets::default(),
            known_signers: BTreeSet::new(),
            known_order: VecDeque::new(),
            bursts: Bursts::default(),
        };
        // Evidence first, then the offers that stand on it.
        let mut offers = Vec::new();
        for bytes in view.state.market_snapshot().unwrap_or_default() {
            match AnySigned::from_bytes(bytes).and_then(AnySigned::verify) {
                Ok(AnyVerified::Attestation(att)) => {
                    view.know(att.signer());
                    view.validator.remember_attestation(att)
                }
                Ok(AnyVerified::ChallengeResult(result)) => {
                    view.validator.restore_challenge(&result, now)
                }
                Ok(AnyVerified::Offer(offer)) => offers.push(offer),
                _ => {}
            }
        }
        for offer in offers {
            if view.validator.check_tier(&offer, now).is_ok() {
                let _ = view.book.insert(&offer, now);
            }
        }
        view
    }

    /// A gossip message relayed by `source`: held against the peer's budgets, validated,
    /// and when accepted taken into the book. Returns the verdict for gossipsub, the bids of
    /// this node an arriving offer may fill, and the peer's application score when it has
    /// moved (see [`Budgets::score_update`]).
    pub(crate) fn on_gossip(
        &mut self,
        topic: &str,
        data: Vec<u8>,
        source: libp2p::PeerId,
        now: Timestamp,
    ) -> (MessageAcceptance, Vec<Verified<Bid>>, Option<f64>) {
        // Budgets first, before paying for a signature check.
        let signer = gpux_protocol::peek_signer(&data).ok();
        let new_signer = signer.is_some_and(|signer| !self.known_signers.contains(&signer));
        let admitted = self.budgets.admit(source, new_signer, now.0) == Admit::Yes;
        let score = self.budgets.score_update(&source, now.0);
        if !admitted {
            self.over_budget += 1;
            return (MessageAcceptance::Ignore, Vec::new(), score);
        }
        let (acceptance, fill) = self.on_admitted(topic, data, signer, now);
        if new_signer
            && acceptance == MessageAcceptance::Accept
            && let Some(signer) = signer
        {
            self.bursts.arrived(source, signer, now.0);
        }
        (acceptance, fill, score)
    }

    /// Whether `host` is a fresh key that came in a burst from one relaying peer (a rent
    /// tries it last).
    pub(crate) fn came_in_burst(&self, host: &gpux_protocol::PublicKey, now: Timestamp) -> bool {
        self.bursts.marked(host, now.0)
    }

    fn know(&mut self, signer: gpux_protocol::PublicKey) {
        if self.known_signers.insert(signer) {
            self.known_order.push_back(signer);
            if self.known_order.len() > MAX_KNOWN_SIGNERS
                && let Some(oldest) = self.known_order.pop_front()
            {
                self.known_signers.remove(&oldest);
            }
        }
    }

    fn on_admitted(
        &mut self,
        topic: &str,
        data: Vec<u8>,
        signer: Option<gpux_protocol::PublicKey>,
        now: Timestamp,
    ) -> (MessageAcceptance, Vec<Verified<Bid>>) {
        let bytes = data.clone();
        let verdict = self.validator.validate(topic, data, now);
        let acceptance = verdict.acceptance();
        let mut fill = Vec::new();
        match verdict {
            Verdict::Accept(v) => {
                self.accepted += 1;
                if let Some(signer) = signer {
                    self.know(signer);
                }
                match *v {
                    AnyVerified::Offer(offer) if self.insert(&offer, now) => {
                        if self.arrivals_ms.len() >= MAX_ARRIVALS {
                            self.arrivals_ms.pop_front();
                        }
                        self.arrivals_ms.push_back(now.ms_since(offer.created_at));
                        let _ = self.state.snapshot_offer(&offer.id(), &bytes);
                        fill = self.bids_filled_by(&offer.id(), now);
                    }
                    AnyVerified::Attestation(att) => {
                        let _ = self.state.snapshot_offer(&att.id(), &bytes);
                    }
                    AnyVerified::ChallengeResult(result) => {
                        let _ = self.state.snapshot_offer(&result.id(), &bytes);
                    }
                    AnyVerified::OfferWithdrawal(w) if self.book.withdraw(&w).is_ok() => {
                        let _ = self.state.forget_offer(&w.offer);
                    }
                    AnyVerified::Bid(bid) => {
                        let _ = self.book.add_bid(&bid, now);
                    }
                    AnyVerified::BidWithdrawal(w) => {
                        self.book.withdraw_bid(&w);
                    }
                    _ => {}
                }
            }
            Verdict::Reject(why) => {
                self.rejected += 1;
                tracing::debug!("rejected gossip: {why}");
            }
            Verdict::Ignore(why) => {
                self.ignored += 1;
                tracing::trace!("ignored gossip: {why}")
            }
        }
        for gone in self.validator.take_evicted() {
            let _ = self.state.forget_offer(&gone);
        }
        (acceptance, fill)
    }

    /// Files an offer in the book; the offer it replaced, or that the full book evicted for
    /// it, is forgotten on disk too. Returns whether it went in.
    fn insert(&mut self, offer: &Verified<gpux_protocol::Offer>, now: Timestamp) -> bool {
        match self.book.insert(offer, now) {
            // The replaced or evicted offer leaves the snapshot too (else it grows with
            // every republish).
            Ok(gpux_market::Inserted::Evicted(gone) | gpux_market::Inserted::Replaced(gone)) => {
                let _ = self.state.forget_offer(&gone);
                true
            }
            Ok(_) => true,
            Err(e) => {
                tracing::trace!("offer {} not filed: {e}", offer.id().short());
                false
            }
        }
    }

    /// Drops expired offers (and their snapshot entries).
    pub(crate) fn expire(&mut self, now: Timestamp) {
        for gone in self.book.expire(now) {
            let _ = self.state.forget_offer(&gone);
        }
    }

    /// Offers matching a query.
    pub(crate) fn search(
        &self,
        query: &str,
        limit: usize,
        now: Timestamp,
    ) -> Result<Vec<OfferHit>, ApiError> {
        let query = Query::parse(query).map_err(|e| ApiError::bad_input(e.to_string()))?;
        Ok(self
            .book
            .search(&query, now, limit)
            .into_iter()
            .map(|h| OfferHit {
                offer: h.offer,
                host: h.host,
                family: h.family.key().to_string(),
                vram_gb: h.vram_gb,
                mig_profile: h.mig_profile,
                cancel_fees: h.cancel_fees,
                compute_capability: h.compute_capability,
                gpus: h.gpus,
                free: h.free,
                price_per_gpu_hour: h.price_per_gpu_hour,
                spot_floor_per_gpu_hour: h.spot_floor_per_gpu_hour,
                region: h.region,
                tier: h.tier,
                reliability_permille: h.reliability_permille,
                created_at: h.created_at,
                expires_at: h.expires_at,
                reach: gpux_api::Reachability::Unknown,
                interruption_permille: None,
                machine: h.machine,
                disk_bytes: h.disk_bytes,
                pulls: h.pulls,
            })
            .collect())
    }

    /// The best allocation for `spec` outside `excluded`, and the first image its offer lists.
    pub(crate) fn best_match(
        &self,
        spec: &BidSpec,
        excluded: &BTreeSet<ContentId>,
        now: Timestamp,
        tag: Option<&str>,
    ) -> Option<(Allocation, Option<ImageDigest>)> {
        let allocation = self
            .book
            .match_bid_excluding(spec, now, excluded)
            .ok()
            .and_then(|mut a| a.pop())?;
        let image = match tag {
            Some(tag) => self.book.offer_image_tagged(&allocation.offer, tag),
            None => self
                .book
                .offer_images(&allocation.offer)
                .and_then(|i| i.first().copied()),
        };
        Some((allocation, image))
    }

    /// Signs a standing bid in `slot` and keeps it. Returns the signed bid (to publish) and
    /// the bids it can fill at once from offers already in the book.
    pub(crate) fn place_bid(
        &mut self,
        key: &Keypair,
        request: &gpux_api::BidRequest,
        (slot, kind): (u16, LeaseKind),
        now: Timestamp,
    ) -> Result<(Verified<Bid>, Vec<Verified<Bid>>), ApiError> {
        Query::parse(&request.query).map_err(|e| ApiError::bad_input(e.to_string()))?;
        if request.gpus == 0 {
            return Err(ApiError::bad_input("--gpus must be at least 1"));
        }
        if request.duration_s == 0 {
            return Err(ApiError::bad_input("--duration must be at least 1 s"));
        }
        let body = Bid {
            seq: now.0,
            slot,
            created_at: now,
            expires_at: now.plus_secs(request.ttl_s.clamp(1, 3600)),
            query: BoundedString::new(request.query.clone())
                .map_err(|e| ApiError::bad_input(e.to_string()))?,
            gpus: request.gpus,
            max_price_per_gpu_hour: request
                .max_price
                .parse::<MicroCredits>()
                .map_err(|e| ApiError::bad_input(format!("--max-price: {e}")))?,
            duration_s: request.duration_s,
            kind,
            allow_spread: false,
            ext: Ext::new(),
        };
        let bid = Signed::sign(key, body).map_err(|e| ApiError::bad_input(e.to_string()))?;
        self.stand(bid.clone(), now)?;
        let fill = self.fills_in_book(&BTreeSet::from([bid.id()]), now);
        Ok((bid, fill))
    }

    /// Keeps `bid` standing (placed, or standing again after a fill that did not happen).
    pub(crate) fn stand(&mut self, bid: Verified<Bid>, now: Timestamp) -> Result<(), ApiError> {
        self.book
            .add_bid(&bid, now)
            .map_err(|e| ApiError::bad_input(e.to_string()))?;
        self.own_bids
            .retain(|b| b.expires_at > now && b.id() != bid.id());
        self.own_bids.push(bid);
        Ok(())
    }

    /// Those of `bids` (this node's, standing) that an offer already in the book fills; they
    /// leave the book.
    pub(crate) fn fills_in_book(
        &mut self,
        bids: &BTreeSet<ContentId>,
        now: Timestamp,
    ) -> Vec<Verified<Bid>> {
        if bids.is_empty() {
            return Vec::new();
        }
        let offers: Vec<ContentId> = self
            .book
            .search(&Query::default(), now, 1000)
            .into_iter()
            .map(|h| h.offer)
            .collect();
        let mut filled = Vec::new();
        for offer in offers {
            for bid_id in self.book.bids_for_offer(&offer, now) {
                if !bids.contains(&bid_id) {
                    continue;
                }
                if let Some(pos) = self.own_bids.iter().position(|b| b.id() == bid_id) {
                    filled.push(self.own_bids.remove(pos));
                    self.book.remove_bid(&bid_id);
                }
            }
        }
        filled
    }

    /// This node's bid `bid` no longer stands (cancelled, or filled).
    pub(crate) fn unstand(&mut self, bid: &ContentId) {
        self.own_bids.retain(|b| b.id() != *bid);
        self.book.remove_bid(bid);
    }

    /// This node's bids that `offer` can satisfy (best first); they leave the book.
    fn bids_filled_by(&mut self, offer: &ContentId, now: Timestamp) -> Vec<Verified<Bid>> {
        if self.own_bids.is_empty() {
            return Vec::new();
        }
        let mut filled = Vec::new();
        for bid_id in self.book.bids_for_offer(offer, now) {
            let Some(pos) = self.own_bids.iter().position(|b| b.id() == bid_id) else {
                continue;
            };
            filled.push(self.own_bids.remove(pos));
            self.book.remove_bid(&bid_id);
        }
        filled
    }

    /// Remembers an attestation (the host's own).
    pub(crate) fn remember_attestation(&mut self, att: Verified<Attestation>) {
        self.validator.remember_attestation(att);
    }
}
