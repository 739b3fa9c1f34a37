//! Gossip validation, outside the behaviour: decode → verify → check against what this node
//! knows (topic, expiry, sequence, the host's attestation, plausibility) → a per-signer
//! rate limit. Nothing is forwarded before it is accepted.
//!
//! `Reject` is for what the sending peer is to blame for (garbage, a forged or tampered
//! signature, a message on the wrong topic, an offer that contradicts its host's attestation,
//! a tier that is provably false): gossipsub lowers that peer's score. `Ignore` is for what
//! may be innocent (expired, replayed, duplicate, over the rate, an attestation or a
//! challenge result not seen yet): dropped, no penalty.
//!
//! **Evidence tiers are derived, never claimed.** An offer's `tier` is a claim the node checks
//! against the evidence it holds: `self-reported` needs the host's signed attestation (every
//! offer needs it); `challenged` needs a [`ChallengeResult`] with a passed verdict, for that
//! host and one of the offer's devices (the GPU or MIG instance its challenge request
//! names), at most 30 days old, from a challenger whose paid lease with the host this
//! node's ledger signed ([`challenge_result_holds`]). Results bind devices, not
//! attestations: a host re-signs its attestation with every publication, and the GPU it
//! attests stays the same. `cc-attested` needs NVIDIA confidential-computing
//! evidence verified against NVIDIA's certificate chain, which nothing here verifies, so it
//! is never granted and an offer claiming it is rejected (provably unbacked). An offer
//! claiming `challenged` without a result this node holds is ignored: the result may still
//! be on its way.

use std::collections::{BTreeMap, HashMap};

use gpux_attestation::{Plausibility, check_gpu};
use gpux_protocol::validate::{
    RuleError, Rules, SeqTracker, challenge_result_holds, offer_matches_attestation,
};
use gpux_protocol::{
    AnySigned, AnyVerified, Attestation, ChallengeResult, ChallengeVerdict, ContentId,
    EvidenceTier, GpuUuid, PublicKey, Timestamp, Verified,
};
use libp2p::gossipsub::MessageAcceptance;

use crate::p2p::topics;

/// Messages one signer may have accepted per window.
pub const RATE_LIMIT_MESSAGES: u32 = 20;
/// The rate-limit window, ms.
pub const RATE_LIMIT_WINDOW_MS: u64 = 10_000;
/// Attestations kept, at most (the oldest go first): as many as the book holds offers.
pub const MAX_ATTESTATIONS: usize = 10_000;
/// Passed challenge results kept, at most (the oldest go first).
pub const MAX_CHALLENGE_RESULTS: usize = 100_000;
/// How long a challenge result counts as evidence, ms (30 days).
pub const CHALLENGE_RESULT_TTL_MS: u64 = 30 * 24 * 3600 * 1000;

/// The device a challenge result's request names (`None`: none, or a request that does
/// not open).
fn challenged_device(result: &Verified<ChallengeResult>) -> Option<GpuUuid> {
    gpux_protocol::Signed::<gpux_protocol::ChallengeRequest>::from_bytes(result.request.to_vec())
        .and_then(gpux_protocol::Signed::verify)
        .ok()?
        .gpu
}

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
    attestation_order: std::collections::VecDeque<ContentId>,
    /// Attestations dropped for the bound, not yet taken by [`Validator::take_evicted`].
    evicted: Vec<ContentId>,
    rate: RateLimiter,
    /// The ledger whose records this node trusts: its node's key, or its members' (none: no
    /// `challenged` tier can be judged).
    ledger: Vec<PublicKey>,
    /// Passed challenge results by (host, device challenged): when each was made.
    challenged: BTreeMap<(PublicKey, GpuUuid), Timestamp>,
}

impl Validator {
    /// A validator with the given time rules.
    pub fn new(rules: Rules) -> Self {
        Self {
            rules,
            ..Self::default()
        }
    }

    /// This validator, judging challenge results by the records of `ledger` (a ledger
    /// node's key, or every member's of a replicated ledger).
    pub fn with_ledger(mut self, ledger: impl IntoIterator<Item = PublicKey>) -> Self {
        self.ledger = ledger.into_iter().collect();
        self
    }

    /// The tier the evidence this node holds supports for an offer of `host` listing
    /// `devices`: `challenged` when any of them passed a challenge in the last 30 days
    /// (never `cc-attested`: see the module's notes).
    pub fn evidence_tier(
        &self,
        host: PublicKey,
        devices: impl IntoIterator<Item = GpuUuid>,
        now: Timestamp,
    ) -> EvidenceTier {
        let fresh = |at: &Timestamp| now.ms_since(*at) <= CHALLENGE_RESULT_TTL_MS;
        if devices
            .into_iter()
            .any(|d| self.challenged.get(&(host, d)).is_some_and(fresh))
        {
            EvidenceTier::Challenged
        } else {
            EvidenceTier::SelfReported
        }
    }

    /// The devices of `host` that passed a challenge in the last 30 days, by the results
    /// held here (a host claims `challenged` in the offers listing them).
    pub fn challenged_devices(
        &self,
        host: PublicKey,
        now: Timestamp,
    ) -> std::collections::BTreeSet<GpuUuid> {
        self.challenged
            .iter()
            .filter(|((h, _), at)| *h == host && now.ms_since(**at) <= CHALLENGE_RESULT_TTL_MS)
            .map(|((_, d), _)| *d)
            .collect()
    }

    /// The newest attestation of `host` known here.
    pub fn latest_attestation(&self, host: &PublicKey) -> Option<ContentId> {
        self.attestation_order
            .iter()
            .rev()
            .find(|id| {
                self.attestations
                    .get(id)
                    .is_some_and(|a| a.signer() == *host)
            })
            .copied()
    }

    /// Whether an offer's claimed tier stands on the evidence held: `Err` with the verdict
    /// when it does not (also used on offers read back from the snapshot).
    pub fn check_tier(
        &self,
        offer: &Verified<gpux_protocol::Offer>,
        now: Timestamp,
    ) -> Result<(), Verdict> {
        match offer.tier {
            EvidenceTier::CcAttested => Err(Verdict::Reject(
                "the offer claims cc-attested, which needs NVIDIA confidential-computing evidence \
                 that no node verifies yet"
                    .into(),
            )),
            claimed
                if claimed
                    > self.evidence_tier(
                        offer.signer(),
                        offer.gpus.iter().map(|g| g.uuid),
                        now,
                    ) =>
            {
                Err(Verdict::Ignore(format!(
                    "the offer claims {claimed}; no challenge result for it has been seen"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Remembers a passed challenge result (one read from disk, or checked here) for the
    /// device its request names (one naming none is evidence of nothing in particular).
    pub fn remember_challenge(&mut self, result: &Verified<ChallengeResult>) {
        if !matches!(result.verdict, ChallengeVerdict::Passed { .. }) {
            return;
        }
        let Some(device) = challenged_device(result) else {
            return;
        };
        let key = (result.host, device);
        let at = self.challenged.entry(key).or_insert(result.created_at);
        *at = (*at).max(result.created_at);
        if self.challenged.len() > MAX_CHALLENGE_RESULTS
            && let Some(oldest) = self
                .challenged
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| *k)
        {
            self.challenged.remove(&oldest);
        }
    }

    /// A challenge result read back from disk: checked again, then remembered.
    pub fn restore_challenge(&mut self, result: &Verified<ChallengeResult>, now: Timestamp) {
        if self.check_challenge(result, now).is_ok() {
            self.remember_challenge(result);
        }
    }

    fn check_challenge(
        &self,
        result: &Verified<ChallengeResult>,
        now: Timestamp,
    ) -> Result<(), Verdict> {
        if result.created_at.0 > now.0.saturating_add(self.rules.max_future_skew_ms)
            || now.ms_since(result.created_at) > CHALLENGE_RESULT_TTL_MS
        {
            return Err(Verdict::Ignore(
                "the challenge result is out of date".into(),
            ));
        }
        if self.ledger.is_empty() {
            return Err(Verdict::Ignore(
                "no ledger to judge the challenge result by".into(),
            ));
        }
        let held = challenged_device(result).and_then(|d| self.challenged.get(&(result.host, d)));
        if held >= Some(&result.created_at) {
            return Err(Verdict::Ignore(
                "a challenge result no newer than one held".into(),
            ));
        }
        // The records may be any member's: the result holds when it holds for one of them.
        for &ledger in &self.ledger {
            match challenge_result_holds(result, ledger) {
                Ok(()) => return Ok(()),
                Err(RuleError::SignerMismatch {
                    what: "the ledger record",
                    ..
                }) => continue,
                Err(e) => return Err(Verdict::Reject(format!("invalid challenge result: {e}"))),
            }
        }
        Err(Verdict::Ignore(
            "the challenge result's records are another ledger's".into(),
        ))
    }

    /// A known attestation.
    pub fn attestation(&self, id: &ContentId) -> Option<&Verified<Attestation>> {
        self.attestations.get(id)
    }

    /// What `host` attested `device` to be, from its newest attestation known here that
    /// lists it: the GPU's name and, for a MIG instance, its profile.
    pub fn attested_device(
        &self,
        host: &PublicKey,
        device: &gpux_protocol::GpuUuid,
    ) -> Option<(String, Option<String>)> {
        self.attestation_order
            .iter()
            .rev()
            .filter_map(|id| self.attestations.get(id))
            .filter(|a| a.signer() == *host)
            .find_map(|a| {
                a.gpus.iter().find_map(|g| {
                    if g.uuid == *device {
                        return Some((g.name.to_string(), None));
                    }
                    let slice = g
                        .mig
                        .as_ref()?
                        .instances
                        .iter()
                        .find(|i| i.uuid == *device)?;
                    Some((g.name.to_string(), Some(slice.profile.to_string())))
                })
            })
    }

    /// Remembers an attestation (one this node made, or one read from disk).
    pub fn remember_attestation(&mut self, att: Verified<Attestation>) {
        if self.attestations.insert(att.id(), att.clone()).is_none() {
            self.attestation_order.push_back(att.id());
            if self.attestation_order.len() > MAX_ATTESTATIONS
                && let Some(oldest) = self.attestation_order.pop_front()
            {
                self.attestations.remove(&oldest);
                self.evicted.push(oldest);
            }
        }
    }

    /// The attestations dropped for the bound since the last call (to forget on disk too).
    pub fn take_evicted(&mut self) -> Vec<ContentId> {
        std::mem::take(&mut self.evicted)
    }

    /// Judges one gossip message received on `topic` at `now`.
    pub fn validate(&mut self, topic: &str, data: Vec<u8>, now: Timestamp) -> Verdict {
        let signed = match AnySigned::from_bytes(data) {
            Ok(s) => s,
            Err(e) => return Verdict::Reject(format!("undecodable: {e}")),
        };
        let on_topic = match (&signed, topic) {
            (AnySigned::Attestation(_), t) => topics::attestation_family(t).is_some(),
            (AnySigned::ChallengeResult(_), topics::CHALLENGES)
            | (AnySigned::Bid(_) | AnySigned::BidWithdrawal(_), topics::BIDS) => true,
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
            AnyVerified::Attestation(att) => self.check_attestation(att, topic, now),
            AnyVerified::Offer(offer) => self.check_offer(offer, topic, now),
            AnyVerified::ChallengeResult(result) => self.check_challenge(result, now),
            AnyVerified::OfferWithdrawal(w) => self
                .rules
                .check_time(w, now)
                .map_err(|e| Verdict::Ignore(e.to_string())),
            AnyVerified::BidWithdrawal(w) => self
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
            AnyVerified::BidWithdrawal(v) => v.signer(),
            AnyVerified::ChallengeResult(v) => v.signer(),
            _ => return Verdict::Reject("message kind not gossiped".into()),
        };
        if !self.rate.allow(signer, now.0) {
            return Verdict::Ignore(format!(
                "{signer:?} is over {RATE_LIMIT_MESSAGES} messages per {RATE_LIMIT_WINDOW_MS} ms"
            ));
        }
        match &verified {
            AnyVerified::Attestation(att) => self.remember_attestation(att.clone()),
            AnyVerified::ChallengeResult(result) => self.remember_challenge(result),
            _ => {}
        }
        Verdict::Accept(Box::new(verified))
    }

    fn check_attestation(
        &self,
        att: &Verified<Attestation>,
        topic: &str,
        now: Timestamp,
    ) -> Result<(), Verdict> {
        // A host publishes its attestation on the topics of the families it has: one on
        // another family's topic is spam for that family's followers.
        let family = topics::attestation_family(topic).unwrap_or_default();
        if !att
            .gpus
            .iter()
            .any(|gpu| gpux_protocol::GpuFamily::classify(&gpu.name).key() == family)
        {
            return Err(Verdict::Reject(format!(
                "an attestation without a {family} GPU published on {topic}"
            )));
        }
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
        self.check_tier(offer, now)?;
        self.offer_seqs
            .observe((offer.signer(), offer.slot), offer.seq)
            .map_err(|e| Verdict::Ignore(e.to_string()))
    }
}
