//! Validation rules that need no network: freshness against a caller-supplied `now`,
//! per-signer sequence numbers, and consistency between messages (an offer and its
//! attestation, a lease request and its offer or bid, a receipt and its lease).
//!
//! Structural rules of a single message run inside verification ([`crate::Message::check`]);
//! the rules here need a clock or another message, so the caller runs them. Each failure is
//! its own [`RuleError`] variant.

use std::collections::BTreeMap;

use crate::envelope::Signed;
use crate::envelope::{Message, Verified};
use crate::family::GpuFamily;
use crate::key::PublicKey;
use crate::messages::{
    Attestation, Bid, EscrowLock, LeaseAccept, LeaseKind, LeaseRequest, MessageKind, Offer,
    PreemptionNotice, ReceiptAck, UsageReceipt,
};
use crate::money::MicroCredits;
use crate::types::{ContentId, GpuUuid, Timestamp};

mod challenge;
pub use challenge::{challenge_response_matches_request, challenge_result_holds};

/// Limits for the time rules. [`Rules::default`] gives the protocol's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// How far in the future a `created_at` may be (clock skew), ms. Default 30 s.
    pub max_future_skew_ms: u64,
    /// The longest a message with an expiry (offer, bid, lease request) may live from
    /// `created_at` to `expires_at`, ms. Default 1 hour: hosts re-publish well before that.
    pub max_lifetime_ms: u64,
    /// The oldest `created_at` accepted for kinds that do not expire, ms. Default 10 minutes.
    pub max_age_ms: u64,
    /// The oldest attestation accepted, ms. Default 24 hours: offers (which live up to
    /// `max_lifetime_ms`) point at an attestation, and the hardware does not change under
    /// them; a host re-attests at least daily.
    pub max_attestation_age_ms: u64,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            max_future_skew_ms: 30_000,
            max_lifetime_ms: 3_600_000,
            max_age_ms: 600_000,
            max_attestation_age_ms: 86_400_000,
        }
    }
}

/// A rule a verified message breaks. Each rule is its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// `created_at` is further in the future than the skew allows.
    #[error("{kind} created at {created_at}, more than {max_skew_ms} ms after now ({now})")]
    FromTheFuture {
        /// The kind.
        kind: MessageKind,
        /// Its `created_at`.
        created_at: Timestamp,
        /// The local clock.
        now: Timestamp,
        /// The skew allowed.
        max_skew_ms: u64,
    },
    /// `expires_at` has passed.
    #[error("{kind} expired at {expires_at} (now {now})")]
    Expired {
        /// The kind.
        kind: MessageKind,
        /// Its `expires_at`.
        expires_at: Timestamp,
        /// The local clock.
        now: Timestamp,
    },
    /// Lives longer than allowed.
    #[error("{kind} lives {lifetime_ms} ms, longer than the {max_ms} ms allowed")]
    LifetimeTooLong {
        /// The kind.
        kind: MessageKind,
        /// From `created_at` to `expires_at`.
        lifetime_ms: u64,
        /// The limit.
        max_ms: u64,
    },
    /// A kind without expiry whose `created_at` is too old.
    #[error("{kind} created at {created_at} is stale (now {now})")]
    Stale {
        /// The kind.
        kind: MessageKind,
        /// Its `created_at`.
        created_at: Timestamp,
        /// The local clock.
        now: Timestamp,
    },
    /// A sequence number not newer than the newest seen for the same signer (and slot).
    #[error("replay: seq {seq} is not newer than {newest}")]
    Replay {
        /// The message's seq.
        seq: u64,
        /// The newest seq seen before.
        newest: u64,
    },
    /// Two messages that must come from one signer do not.
    #[error("{what} is signed by {found:?}, expected {expected:?}")]
    SignerMismatch {
        /// Which relation.
        what: &'static str,
        /// Expected signer.
        expected: PublicKey,
        /// Actual signer.
        found: PublicKey,
    },
    /// A message names another message by id, and it is not that one.
    #[error("{what} names {named:?}, not {actual:?}")]
    WrongReference {
        /// Which reference.
        what: &'static str,
        /// The id named.
        named: ContentId,
        /// The id of the message given.
        actual: ContentId,
    },
    /// An offered GPU is not in the host's attestation.
    #[error("GPU {uuid} is not in the attestation")]
    GpuNotAttested {
        /// The GPU.
        uuid: GpuUuid,
    },
    /// An offered GPU's summary contradicts the attestation.
    #[error("GPU {uuid}: the offer's {field} contradicts the attestation")]
    GpuMismatch {
        /// The GPU.
        uuid: GpuUuid,
        /// The field.
        field: &'static str,
    },
    /// A lease names a GPU the offer does not list.
    #[error("GPU {uuid} is not in the offer")]
    GpuNotOffered {
        /// The GPU.
        uuid: GpuUuid,
    },
    /// A lease's price is below the offer's (or the spot floor).
    #[error("price {price} is below the offer's {min}")]
    PriceBelowOffer {
        /// The lease price.
        price: MicroCredits,
        /// The least the offer accepts.
        min: MicroCredits,
    },
    /// A spot lease for an offer without spot capacity.
    #[error("the offer takes no spot leases")]
    SpotNotOffered,
    /// A lease's price exceeds the bid's maximum.
    #[error("price {price} exceeds the bid's maximum {max}")]
    PriceAboveBidMax {
        /// The lease price.
        price: MicroCredits,
        /// The bid's maximum.
        max: MicroCredits,
    },
    /// A lease's duration is outside the offer's bounds.
    #[error("duration {duration_s} s is outside the offer's {min_s}..={max_s} s")]
    DurationOutOfRange {
        /// Requested.
        duration_s: u32,
        /// Offer minimum.
        min_s: u32,
        /// Offer maximum.
        max_s: u32,
    },
    /// A lease names an image the offer does not list.
    #[error("the image is not one the offer lists")]
    ImageNotOffered,
    /// A lease's workspace retention is priced below the offer's.
    #[error("workspace price {price} per GiB-hour is below the offer's {min}")]
    WorkspacePriceBelowOffer {
        /// The lease's price.
        price: MicroCredits,
        /// The offer's.
        min: MicroCredits,
    },
    /// A lease asks the host to keep its workspace longer than the offer does.
    #[error(
        "a workspace kept {retain_s} s after the workload; this host keeps one at most {max_s} s"
    )]
    RetentionAboveOffer {
        /// What the lease asks, seconds.
        retain_s: u64,
        /// The offer's longest, seconds.
        max_s: u64,
    },
    /// A lease asks for more CPU or memory than the offer's share for its GPUs.
    #[error("the lease asks for {asked} of {what}; its GPUs' share of this host is {share}")]
    LimitsAboveShare {
        /// `CPU` or `memory`.
        what: &'static str,
        /// What the lease asks, in words (`8.000 cores`, `64.0 GiB`).
        asked: String,
        /// The offer's share for the lease's GPUs, in words.
        share: String,
    },
    /// A lease term (an ext field) is malformed.
    #[error("a lease term: {0}")]
    BadTerm(String),
    /// A reserved window with a committed minimum states a cancellation fee schedule other
    /// than its offer's.
    #[error("the cancellation fees are {asked}; the offer's are {offered}")]
    CancelFeesNotOffered {
        /// The request's schedule.
        asked: String,
        /// The offer's.
        offered: String,
    },
    /// A lease request contradicts the bid it answers.
    #[error("the lease's {field} does not match the bid")]
    BidMismatch {
        /// The field.
        field: &'static str,
    },
    /// A receipt contradicts its lease.
    #[error("the receipt's {field} does not match the lease")]
    ReceiptMismatch {
        /// The field.
        field: &'static str,
    },
    /// A receipt bills more GPU-seconds than the lease can have used by its `created_at`.
    #[error("the receipt bills {gpu_seconds} GPU-seconds, more than the {max} possible")]
    ReceiptTooHigh {
        /// Billed.
        gpu_seconds: u64,
        /// Possible.
        max: u64,
    },
    /// An escrow lock contradicts the lease request it pays for.
    #[error("the escrow lock's {field} does not match the lease request")]
    EscrowMismatch {
        /// The field.
        field: &'static str,
    },
    /// A challenge result does not hold as evidence.
    #[error("the challenge result's {what}: {why}")]
    Evidence {
        /// The part.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// A challenge response contradicts its request.
    #[error("the challenge response's {field} does not match the request")]
    ChallengeMismatch {
        /// The field.
        field: &'static str,
    },
    /// An acknowledgement contradicts its receipt.
    #[error("the acknowledgement's {field} does not match the receipt")]
    AckMismatch {
        /// The field.
        field: &'static str,
    },
    /// A preemption notice does not hold against its lease.
    #[error("the preemption notice: {0}")]
    Preemption(&'static str),
}

impl Rules {
    /// Freshness of any message at `now`: not from the future beyond the skew; not expired;
    /// not living longer than allowed; for kinds without expiry, not older than `max_age_ms`
    /// (`max_attestation_age_ms` for attestations).
    pub fn check_time<T: Message>(
        &self,
        msg: &Verified<T>,
        now: Timestamp,
    ) -> Result<(), RuleError> {
        let kind = T::KIND;
        let created_at = msg.created_at();
        if created_at.ms_since(now) > self.max_future_skew_ms {
            return Err(RuleError::FromTheFuture {
                kind,
                created_at,
                now,
                max_skew_ms: self.max_future_skew_ms,
            });
        }
        match msg.expires_at() {
            Some(expires_at) => {
                if expires_at <= now {
                    return Err(RuleError::Expired {
                        kind,
                        expires_at,
                        now,
                    });
                }
                let lifetime_ms = expires_at.ms_since(created_at);
                if lifetime_ms > self.max_lifetime_ms {
                    return Err(RuleError::LifetimeTooLong {
                        kind,
                        lifetime_ms,
                        max_ms: self.max_lifetime_ms,
                    });
                }
            }
            None => {
                let max_age = match kind {
                    MessageKind::Attestation => self.max_attestation_age_ms,
                    _ => self.max_age_ms,
                };
                if now.ms_since(created_at) > max_age {
                    return Err(RuleError::Stale {
                        kind,
                        created_at,
                        now,
                    });
                }
            }
        }
        Ok(())
    }
}

/// The newest sequence number seen per key, for one family of messages. The key is the
/// signer, or the signer and a slot: `(host, offer.slot)` for offers, the renter for bids.
/// Newer replaces older; equal or older is a replay.
#[derive(Debug, Clone)]
pub struct SeqTracker<K = PublicKey> {
    newest: BTreeMap<K, u64>,
}

impl<K: Ord> Default for SeqTracker<K> {
    fn default() -> Self {
        Self {
            newest: BTreeMap::new(),
        }
    }
}

impl<K: Ord> SeqTracker<K> {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks `seq` for `key` without recording it.
    pub fn check(&self, key: &K, seq: u64) -> Result<(), RuleError> {
        match self.newest.get(key) {
            Some(&newest) if seq <= newest => Err(RuleError::Replay { seq, newest }),
            _ => Ok(()),
        }
    }

    /// Checks `seq` and records it as the key's newest.
    pub fn observe(&mut self, key: K, seq: u64) -> Result<(), RuleError> {
        self.check(&key, seq)?;
        self.newest.insert(key, seq);
        Ok(())
    }

    /// The newest seq seen for `key`.
    pub fn newest(&self, key: &K) -> Option<u64> {
        self.newest.get(key).copied()
    }

    /// Forgets a key (when its state is evicted).
    pub fn forget(&mut self, key: &K) {
        self.newest.remove(key);
    }

    /// Keys tracked.
    pub fn len(&self) -> usize {
        self.newest.len()
    }

    /// True when no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }
}

fn same_signer(what: &'static str, expected: PublicKey, found: PublicKey) -> Result<(), RuleError> {
    if expected != found {
        return Err(RuleError::SignerMismatch {
            what,
            expected,
            found,
        });
    }
    Ok(())
}

fn same_id(what: &'static str, named: ContentId, actual: ContentId) -> Result<(), RuleError> {
    if named != actual {
        return Err(RuleError::WrongReference {
            what,
            named,
            actual,
        });
    }
    Ok(())
}

/// An offer against the attestation it names: same signer, the right id, and every offered
/// GPU present in it with the same memory, compute capability and family (a MIG instance
/// under its GPU, with MIG enabled, of the offer's profile and with its own memory).
pub fn offer_matches_attestation(
    offer: &Verified<Offer>,
    attestation: &Verified<Attestation>,
) -> Result<(), RuleError> {
    same_signer("the attestation", offer.signer(), attestation.signer())?;
    same_id("offer.attestation", offer.attestation, attestation.id())?;
    for gpu in offer.gpus.iter() {
        let mismatch = |field| RuleError::GpuMismatch {
            uuid: gpu.uuid,
            field,
        };
        // A whole GPU is listed as itself; a MIG instance under the GPU it is a slice of,
        // with MIG enabled, and the offer names its profile.
        let (facts, memory) = if gpu.uuid.is_mig() {
            let (facts, instance) = attestation
                .gpus
                .iter()
                .filter(|f| f.mig.as_ref().is_some_and(|m| m.enabled))
                .find_map(|f| {
                    let m = f.mig.as_ref()?;
                    Some((f, m.instances.iter().find(|i| i.uuid == gpu.uuid)?))
                })
                .ok_or(RuleError::GpuNotAttested { uuid: gpu.uuid })?;
            if offer.mig_profile() != Some(instance.profile.as_str()) {
                return Err(mismatch("MIG profile"));
            }
            (facts, instance.memory_total_bytes)
        } else {
            let facts = attestation
                .gpus
                .iter()
                .find(|f| f.uuid == gpu.uuid)
                .ok_or(RuleError::GpuNotAttested { uuid: gpu.uuid })?;
            (facts, facts.memory_total_bytes)
        };
        if memory != gpu.memory_bytes {
            return Err(mismatch("memory_bytes"));
        }
        if facts.compute_capability != gpu.compute_capability {
            return Err(mismatch("compute_capability"));
        }
        if GpuFamily::classify(&facts.name).key() != gpu.family.as_str() {
            return Err(mismatch("family"));
        }
        if gpu.pcie_gen != facts.pcie.max_gen.unwrap_or(0) {
            return Err(mismatch("pcie_gen"));
        }
    }
    Ok(())
}

/// A lease request against the offer it names: addressed to the offer's host, GPUs from the
/// offer, price at least the offer's (or the spot floor for spot), duration in bounds, CPU
/// and memory within the offer's share for the GPUs asked ([`Machine`](crate::Machine)), a
/// workspace retention priced at least at the offer's and no longer than it keeps one, a
/// committed window's cancellation fees exactly the offer's, an
/// image the offer lists, or one the renter staged on the host or had it pull (`staged`:
/// the host holds it for this renter) when the offer says it stages or pulls images.
pub fn lease_request_matches_offer(
    request: &Verified<LeaseRequest>,
    offer: &Verified<Offer>,
    staged: bool,
) -> Result<(), RuleError> {
    same_id("request.offer", request.offer, offer.id())?;
    same_signer("the offer", request.host, offer.signer())?;
    for uuid in request.gpus.iter() {
        if !offer.gpus.iter().any(|g| g.uuid == *uuid) {
            return Err(RuleError::GpuNotOffered { uuid: *uuid });
        }
    }
    let min = match request.kind {
        LeaseKind::Spot => offer
            .spot_floor_per_gpu_hour
            .ok_or(RuleError::SpotNotOffered)?,
        LeaseKind::OnDemand | LeaseKind::Reserved { .. } => offer.price_per_gpu_hour,
    };
    if request.price_per_gpu_hour < min {
        return Err(RuleError::PriceBelowOffer {
            price: request.price_per_gpu_hour,
            min,
        });
    }
    if request.duration_s < offer.min_duration_s || request.duration_s > offer.max_duration_s {
        return Err(RuleError::DurationOutOfRange {
            duration_s: request.duration_s,
            min_s: offer.min_duration_s,
            max_s: offer.max_duration_s,
        });
    }
    let share = offer.machine.share.times(request.gpus.len());
    if request.limits.cpu_millis > share.cpu_millis {
        return Err(RuleError::LimitsAboveShare {
            what: "CPU",
            asked: cores(request.limits.cpu_millis),
            share: cores(share.cpu_millis),
        });
    }
    if request.limits.memory_bytes > share.memory_bytes {
        return Err(RuleError::LimitsAboveShare {
            what: "memory",
            asked: gib(request.limits.memory_bytes),
            share: gib(share.memory_bytes),
        });
    }
    let term = |e: crate::InvalidMessage| RuleError::BadTerm(e.to_string());
    if request.workspace_bytes().map_err(term)?.is_some() {
        let (price, min) = (
            request.workspace_price().map_err(term)?,
            offer.workspace_price(),
        );
        if price < min {
            return Err(RuleError::WorkspacePriceBelowOffer { price, min });
        }
        let retain_s = request.retention_s().map_err(term)?;
        if let Some(max_s) = offer.max_retain_s()
            && retain_s > max_s
        {
            return Err(RuleError::RetentionAboveOffer { retain_s, max_s });
        }
    }
    // A window its renter committed to carries the offer's cancellation fees, unchanged.
    if request.committed_s().map_err(term)? > 0 {
        let (asked, offered) = (
            request.cancel_fees().map_err(term)?,
            offer.cancel_fees().map_err(term)?,
        );
        if asked != offered {
            return Err(RuleError::CancelFeesNotOffered {
                asked: asked.to_string(),
                offered: offered.to_string(),
            });
        }
    }
    let listed = offer.images.contains(&request.image);
    // A renter's image held for it on the host: staged, or pulled from a registry.
    let staged_here = staged && (offer.max_image_bytes() > 0 || offer.pulls.max_bytes > 0);
    if !(listed || staged_here) {
        return Err(RuleError::ImageNotOffered);
    }
    Ok(())
}

fn cores(millis: u32) -> String {
    format!("{}.{:03} cores", millis / 1000, millis % 1000)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// A lease request against the standing bid it answers: same renter, the bid's id, a price
/// within the bid's maximum, and the bid's GPU count, duration and kind.
pub fn lease_request_within_bid(
    request: &Verified<LeaseRequest>,
    bid: &Verified<Bid>,
) -> Result<(), RuleError> {
    same_signer("the bid", bid.signer(), request.signer())?;
    match request.bid {
        Some(id) => same_id("request.bid", id, bid.id())?,
        None => return Err(RuleError::BidMismatch { field: "bid" }),
    }
    if request.price_per_gpu_hour > bid.max_price_per_gpu_hour {
        return Err(RuleError::PriceAboveBidMax {
            price: request.price_per_gpu_hour,
            max: bid.max_price_per_gpu_hour,
        });
    }
    if !bid.allow_spread && request.gpus.len() != usize::from(bid.gpus) {
        return Err(RuleError::BidMismatch { field: "gpus" });
    }
    if request.gpus.len() > usize::from(bid.gpus) {
        return Err(RuleError::BidMismatch { field: "gpus" });
    }
    if request.duration_s != bid.duration_s {
        return Err(RuleError::BidMismatch {
            field: "duration_s",
        });
    }
    if request.kind != bid.kind {
        return Err(RuleError::BidMismatch { field: "kind" });
    }
    Ok(())
}

/// A host's acceptance against the request: signed by the request's host, naming the exact
/// request bytes.
pub fn accept_matches_request(
    accept: &Verified<LeaseAccept>,
    request: &Verified<LeaseRequest>,
) -> Result<(), RuleError> {
    same_signer("the acceptance", request.host, accept.signer())?;
    same_id("accept.request", accept.request, request.id())
}

/// A receipt against its lease: from the host, bound to the lease id, price, escrow and GPU
/// count, billing no more than `gpus × max(60, seconds since started_at)` by its
/// `created_at`, and charging at most the agreed retention for the workspace.
pub fn receipt_matches_lease(
    receipt: &Verified<UsageReceipt>,
    request: &Verified<LeaseRequest>,
    started_at: Timestamp,
) -> Result<(), RuleError> {
    same_signer("the receipt", request.host, receipt.signer())?;
    same_id("receipt.lease", receipt.lease, request.id())?;
    if receipt.price_per_gpu_hour != request.price_per_gpu_hour {
        return Err(RuleError::ReceiptMismatch {
            field: "price_per_gpu_hour",
        });
    }
    if receipt.escrow != request.escrow {
        return Err(RuleError::ReceiptMismatch { field: "escrow" });
    }
    if usize::from(receipt.gpus) != request.gpus.len() {
        return Err(RuleError::ReceiptMismatch { field: "gpus" });
    }
    // The workspace's retention: at most the fixed sum the terms say.
    let charge = receipt.workspace_charge;
    if request
        .retention_charge()
        .map_or(true, |agreed| charge > agreed)
    {
        return Err(RuleError::ReceiptMismatch {
            field: "workspace_charge",
        });
    }
    let elapsed_s = receipt.created_at.ms_since(started_at) / 1000;
    // A reserved window's committed minimum may be billed early (when its renter stopped
    // it: the renter's own check).
    let committed = request
        .committed_s()
        .unwrap_or(0)
        .min(u64::from(request.duration_s));
    let max = u64::from(receipt.gpus)
        .saturating_mul(crate::money::billed_seconds(elapsed_s).max(committed));
    if receipt.gpu_seconds > max {
        return Err(RuleError::ReceiptTooHigh {
            gpu_seconds: receipt.gpu_seconds,
            max,
        });
    }
    Ok(())
}

/// Whether a spot bid of `bid` per GPU-hour may preempt a spot lease paying `held`: only
/// when it is higher by at least a tenth (and at least one micro-credit), so that bids a
/// micro-credit apart cannot preempt each other in turn.
pub fn spot_outbids(held: MicroCredits, bid: MicroCredits) -> bool {
    bid.0 >= held.0.saturating_add((held.0 / 10).max(1))
}

/// Whether `preemptor` may preempt `lease` (both addressed to the same host, sharing a GPU):
/// an on-demand request preempts any spot lease, a spot request one it outbids
/// ([`spot_outbids`]); a reservation never preempts, and nothing preempts a lease that is
/// not spot.
pub fn may_preempt(
    lease: &LeaseRequest,
    lease_id: ContentId,
    preemptor: &Verified<LeaseRequest>,
) -> Result<(), RuleError> {
    if !matches!(lease.kind, LeaseKind::Spot) {
        return Err(RuleError::Preemption("only spot leases are preempted"));
    }
    if preemptor.host != lease.host {
        return Err(RuleError::Preemption(
            "the preempting request is addressed to another host",
        ));
    }
    if preemptor.id() == lease_id {
        return Err(RuleError::Preemption("a lease cannot preempt itself"));
    }
    if !preemptor.gpus.iter().any(|g| lease.gpus.contains(g)) {
        return Err(RuleError::Preemption(
            "the preempting request needs none of the lease's GPUs",
        ));
    }
    let outbids = match preemptor.kind {
        LeaseKind::OnDemand => true,
        LeaseKind::Spot => spot_outbids(lease.price_per_gpu_hour, preemptor.price_per_gpu_hour),
        LeaseKind::Reserved { .. } => false,
    };
    if !outbids {
        return Err(RuleError::Preemption(
            "the preempting request does not outbid the lease",
        ));
    }
    Ok(())
}

/// A preemption notice against the spot lease it ends, whose acceptance agreed a notice
/// period of `notice_ms`: signed by the lease's host, for this lease, at least the agreed
/// period long, and citing a signed request that was live when the notice was given and
/// [`may_preempt`] the lease. Returns the verified preempting request.
pub fn notice_matches_lease(
    notice: &Verified<PreemptionNotice>,
    lease: &Verified<LeaseRequest>,
    notice_ms: u64,
) -> Result<Verified<LeaseRequest>, RuleError> {
    same_signer("the notice", lease.host, notice.signer())?;
    same_id("notice.lease", notice.lease, lease.id())?;
    if notice.ends_at.ms_since(notice.created_at) < notice_ms {
        return Err(RuleError::Preemption(
            "its notice is shorter than the period agreed",
        ));
    }
    let preemptor = Signed::<LeaseRequest>::from_bytes(notice.preemptor.to_vec())
        .and_then(Signed::verify)
        .map_err(|_| RuleError::Preemption("the preempting request does not verify"))?;
    // The request was made by another renter's clock: allow it the usual skew.
    let skew = Rules::default().max_future_skew_ms;
    if preemptor.created_at > notice.created_at.plus_ms(skew)
        || preemptor.expires_at < notice.created_at
    {
        return Err(RuleError::Preemption(
            "the preempting request was not live when the notice was given",
        ));
    }
    may_preempt(lease, lease.id(), &preemptor)?;
    Ok(preemptor)
}

/// A renter's acknowledgement against the receipt it countersigns.
pub fn ack_matches_receipt(
    ack: &Verified<ReceiptAck>,
    receipt: &Verified<UsageReceipt>,
    renter: PublicKey,
) -> Result<(), RuleError> {
    same_signer("the acknowledgement", renter, ack.signer())?;
    same_id("ack.receipt", ack.receipt, receipt.id())?;
    if ack.lease != receipt.lease {
        return Err(RuleError::AckMismatch { field: "lease" });
    }
    if ack.seq != receipt.seq {
        return Err(RuleError::AckMismatch { field: "seq" });
    }
    if ack.amount_due != receipt.amount_due {
        return Err(RuleError::AckMismatch {
            field: "amount_due",
        });
    }
    Ok(())
}

/// An escrow lock against the lease request it pays for: signed by the renter, who is the
/// payer; paying the request's host; the request's escrow id, lease id, amount and price.
pub fn escrow_lock_matches_request(
    lock: &Verified<EscrowLock>,
    request: &Verified<LeaseRequest>,
) -> Result<(), RuleError> {
    same_signer("the escrow lock", request.signer(), lock.signer())?;
    same_id("lock.lease", lock.lease, request.id())?;
    let mismatch = |field| Err(RuleError::EscrowMismatch { field });
    if lock.payer != lock.signer() {
        return mismatch("payer");
    }
    if lock.payee != request.host {
        return mismatch("payee");
    }
    if lock.escrow != request.escrow {
        return mismatch("escrow");
    }
    if lock.amount != request.escrow_amount {
        return mismatch("amount");
    }
    if lock.price_per_gpu_hour != request.price_per_gpu_hour {
        return mismatch("price_per_gpu_hour");
    }
    Ok(())
}
