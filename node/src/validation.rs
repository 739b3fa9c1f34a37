//! Gossip validation, outside the behaviour: decode → verify → check against what this node
//! knows (topic, expiry, sequence, the host's attestation, plausibility) → a per-signer
//! rate limit. Nothing is forwarded before it is accepted.
//!
//! `Reject` is for what the sending peer is to blame for (garbage, a forged or tampered
//! signature, a message on the wrong topic, an offer that contradicts its host's attestation):
//! gossipsub lowers that peer's score. `Ignore` is for what may be innocent (expired, replayed,
//! duplicate, over the rate, an attestation not seen yet): dropped, no penalty.

use std::collections::{BTreeMap, HashMap};

use gpux_attestation::{Plausibility, check_gpu};
use gpux_protocol::validate::{Rules, SeqTracker, offer_matches_attestation};
use gpux_protocol::{
    AnySigned, AnyVerified, Attestation, ContentId, PublicKey, Timestamp, Verified,
};
use libp2p::gossipsub::MessageAcceptance;

use crate::p2p::topics;

/// Messages one signer may have accepted per window.
pub const RATE_LIMIT_MESSAGES: u32 = 20;
/// The rate-limit window, ms.
pub const RATE_LIMIT_WINDOW_MS: u64 = 10_000;
/// Attestations kept, at most (the oldest go first).
pub const MAX_ATTESTATIONS: usize = 100_000;

/// The verdict on one gossip message.
#[derive(Debug)]
pub enum Verdict {
    /// Valid: forward it and use it.
    Accept(Box<AnyVerified>),
    /// The sender is at fault.
    Reject(String),
    /// Not forwarded, no penalty.
    Ignore(String),
}

impl Verdict {
    /// What gossipsub is told.
    pub fn acceptance(&self) -> MessageAcceptance {
        match self {
            Verdict::Accept(_) => MessageAcceptance::Accept,
            Verdict::Reject(_) => MessageAcceptance::Reject,
            Verdict::Ignore(_) => MessageAcceptance::Ignore,
        }
    }
}

/// Per-signer counts in fixed windows.
#[derive(Debug, Default)]
struct RateLimiter {
    windows: HashMap<PublicKey, (u64, u32)>,
}

impl RateLimiter {
    fn allow(&mut self, signer: PublicKey, now: u64) -> bool {
        let window = now / RATE_LIMIT_WINDOW_MS;
        if self.windows.len() > 100_000 {
            self.windows.retain(|_, (w, _)| *w == window);
        }
        let entry = self.windows.entry(signer).or_insert((window, 0));
        if entry.0 != window {
            *entry = (window, 0);
        }
        entry.1 += 1;
        entry.1 <= RATE_LIMIT_MESSAGES
    }
}

/// The validator's state.
#[derive(Debug, Default)]
pub struct Validator {
    rules: Rules,
    offer_seqs: SeqTracker<(PublicKey, u16)>,
    bid_seqs: SeqTracker<PublicKey>,
    attestations: BTreeMap<ContentId, Verified<Attestation>>,
    attestation_order: Vec<ContentId>,
    rate: RateLimiter,
}

impl Validator {
    /// A validator with the given time rules.
    pub fn new(rules: Rules) -> Self {
        Self {
            rules,
            ..Self::default()
        }
    }

    /// A known attestation.
    pub fn attestation(&self, id: &ContentId) -> Option<&Verified<Attestation>> {
        self.attestations.get(id)
    }

    /// Remembers an attestation (one this node made, or one read from disk).
    pub fn remember_attestation(&mut self, att: Verified<Attestation>) {
        if self.attestations.insert(att.id(), att.clone()).is_none() {
            self.attestation_order.push(att.id());
            if self.attestation_order.len() > MAX_ATTESTATIONS {
                let oldest = self.attestation_order.remove(0);
                self.attestations.remove(&oldest);
            }
        }
    }

    /// Judges one gossip message received on `topic` at `now`.
    pub fn validate(&mut self, topic: &str, data: Vec<u8>, now: Timestamp) -> Verdict {
        let signed = match AnySigned::from_bytes(data) {
            Ok(s) => s,
            Err(e) => return Verdict::Reject(format!("undecodable: {e}")),
        };
        let on_topic = match (&signed, topic) {
            (AnySigned::Attestation(_), topics::ATTESTATIONS)
            | (AnySigned::Bid(_), topics::BIDS) => true,
            (AnySigned::Offer(_) | AnySigned::OfferWithdrawal(_), t) => {
                topics::offer_family(t).is_some()
            }
            _ => false,
        };
        if !on_topic {
            return Verdict::Reject(format!("message kind not carried on {topic}"));
        }
        let verified = match signed.verify() {
            Ok(v) => v,
            Err(e) => return Verdict::Reject(format!("invalid: {e}")),
        };
        let checked = match &verified {
            AnyVerified::Attestation(att) => self.check_attestation(att, now),
            AnyVerified::Offer(offer) => self.check_offer(offer, topic, now),
            AnyVerified::OfferWithdrawal(w) => self
                .rules
                .check_time(w, now)
                .map_err(|e| Verdict::Ignore(e.to_string())),
            AnyVerified::Bid(bid) => self
                .rules
                .check_time(bid, now)
                .map_err(|e| Verdict::Ignore(e.to_string()))
                .and_then(|()| {
                    self.bid_seqs
                        .observe(bid.signer(), bid.seq)
                        .map_err(|e| Verdict::Ignore(e.to_string()))
                }),
            _ => Err(Verdict::Reject("message kind not gossiped".into())),
        };
        if let Err(verdict) = checked {
            return verdict;
        }
        let signer = match &verified {
            AnyVerified::Attestation(v) => v.signer(),
            AnyVerified::Offer(v) => v.signer(),
            AnyVerified::OfferWithdrawal(v) => v.signer(),
            AnyVerified::Bid(v) => v.signer(),
            _ => return Verdict::Reject("message kind not gossiped".into()),
        };
        if !self.rate.allow(signer, now.0) {
            return Verdict::Ignore(format!(
                "{signer:?} is over {RATE_LIMIT_MESSAGES} messages per {RATE_LIMIT_WINDOW_MS} ms"
            ));
        }
        if let AnyVerified::Attestation(att) = &verified {
            self.remember_attestation(att.clone());
        }
        Verdict::Accept(Box::new(verified))
    }

    fn check_attestation(
        &self,
        att: &Verified<Attestation>,
        now: Timestamp,
    ) -> Result<(), Verdict> {
        if self.attestations.contains_key(&att.id()) {
            return Err(Verdict::Ignore("duplicate attestation".into()));
        }
        self.rules
            .check_time(att, now)
            .map_err(|e| Verdict::Ignore(e.to_string()))?;
        for gpu in att.gpus.iter() {
            if let Plausibility::Implausible(why) = check_gpu(gpu) {
                return Err(Verdict::Reject(format!("implausible attestation: {why}")));
            }
        }
        Ok(())
    }

    fn check_offer(
        &mut self,
        offer: &Verified<gpux_protocol::Offer>,
        topic: &str,
        now: Timestamp,
    ) -> Result<(), Verdict> {
        if topics::offer_family(topic) != Some(offer.topic_family()) {
            return Err(Verdict::Reject(format!(
                "offer for {} published on {topic}",
                offer.topic_family()
            )));
        }
        self.rules
            .check_time(offer, now)
            .map_err(|e| Verdict::Ignore(e.to_string()))?;
        self.offer_seqs
            .check(&(offer.signer(), offer.slot), offer.seq)
            .map_err(|e| Verdict::Ignore(e.to_string()))?;
        let att = self.attestations.get(&offer.attestation).ok_or_else(|| {
            Verdict::Ignore("the offer's attestation has not been seen yet".into())
        })?;
        offer_matches_attestation(offer, att)
            .map_err(|e| Verdict::Reject(format!("offer contradicts its attestation: {e}")))?;
        self.offer_seqs
            .observe((offer.signer(), offer.slot), offer.seq)
            .map_err(|e| Verdict::Ignore(e.to_string()))
    }
}
