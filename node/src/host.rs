//! The host role: the authority over its own GPUs.
//!
//! A lease exists only once the host has signed `LeaseAccept`, and the host signs it only
//! after booking the GPUs in its own book (`OrderBook::reserve`, atomic) and storing the lease
//! (flushed). Requests are handled one at a time, so two renters racing for the same GPUs get
//! exactly one lease.

use gpux_market::{Allocation, BookConfig, OrderBook};
use gpux_protocol::validate::{RuleError, Rules, lease_request_matches_offer};
use gpux_protocol::{
    BoundedString, ContentId, Ext, Keypair, LeaseAccept, LeaseReject, LeaseRequest, Offer,
    RejectReason, Signed, Timestamp, Verified,
};

use crate::store::{LeaseRecord, LeaseState, NodeState, Role, Store, StoreError};

/// The host's side of lease negotiation.
#[derive(Debug)]
pub struct Host<S> {
    key: Keypair,
    book: OrderBook,
    offers: Vec<Verified<Offer>>,
    /// Offers replaced by newer ones but not expired: a renter whose view lags one
    /// publication behind may still name them (its lease is booked on the current offer).
    superseded: Vec<Verified<Offer>>,
    state: NodeState<S>,
    rules: Rules,
    /// Receipt timing announced in every `LeaseAccept` (ext keys 1 and 2), ms.
    timing: Option<(u64, u64)>,
}

/// `LeaseAccept` ext key: the host's receipt interval, ms (u64 little endian).
pub const EXT_RECEIPT_INTERVAL_MS: u16 = 1;
/// `LeaseAccept` ext key: the host's acknowledgement grace, ms (u64 little endian).
pub const EXT_ACK_GRACE_MS: u16 = 2;

/// The receipt timing a `LeaseAccept` announces: (interval, grace) in ms.
pub fn announced_timing(accept: &LeaseAccept) -> Option<(u64, u64)> {
    let read = |key| {
        accept
            .ext
            .get(key)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    Some((read(EXT_RECEIPT_INTERVAL_MS)?, read(EXT_ACK_GRACE_MS)?))
}

/// The host's answer to a request: the signed envelope to send back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A signed `LeaseAccept` (the lease id is the request's id).
    Accepted {
        /// The lease id.
        lease: ContentId,
        /// The signed `LeaseAccept`.
        envelope: Vec<u8>,
    },
    /// A signed `LeaseReject`, with its reason.
    Rejected {
        /// Why.
        reason: RejectReason,
        /// The signed `LeaseReject` (empty when the request was too broken to name).
        envelope: Vec<u8>,
    },
}

impl Answer {
    /// The bytes to send back.
    pub fn envelope(&self) -> &[u8] {
        match self {
            Answer::Accepted { envelope, .. } | Answer::Rejected { envelope, .. } => envelope,
        }
    }
}

fn reason_for(e: &RuleError) -> RejectReason {
    match e {
        RuleError::PriceBelowOffer { .. } | RuleError::SpotNotOffered => RejectReason::PriceTooLow,
        RuleError::DurationOutOfRange { .. } => RejectReason::DurationOutOfRange,
        RuleError::ImageNotOffered => RejectReason::ImageMissing,
        RuleError::GpuNotOffered { .. } => RejectReason::GpusUnavailable,
        RuleError::Expired { .. } | RuleError::Stale { .. } => RejectReason::RequestExpired,
        _ => RejectReason::Invalid,
    }
}

impl<S: Store> Host<S> {
    /// A host with its store. Leases already stored and still running are booked again, so a
    /// restarted host never hands their GPUs to someone else.
    pub fn new(key: Keypair, state: NodeState<S>, now: Timestamp) -> Result<Self, StoreError> {
        let mut host = Self {
            key,
            book: OrderBook::new(BookConfig::default()),
            offers: Vec::new(),
            superseded: Vec::new(),
            state,
            rules: Rules::default(),
            timing: None,
        };
        for bytes in host.state.own_offers()? {
            if let Ok(offer) = Signed::<Offer>::from_bytes(bytes).and_then(Signed::verify)
                && offer.expires_at > now
            {
                host.book.insert(&offer, now).ok();
                host.offers.push(offer);
            }
        }
        for record in host.state.leases()? {
            if record.role != Role::Host
                || !matches!(
                    record.state,
                    LeaseState::Accepted | LeaseState::Starting | LeaseState::Running
                )
            {
                continue;
            }
            if let Ok(request) =
                Signed::<LeaseRequest>::from_bytes(record.request.clone()).and_then(Signed::verify)
            {
                let allocation = Self::allocation(&request, Timestamp(record.updated_at));
                // The offer may have been replaced; the booking belongs to the GPUs, not the
                // offer, so any current offer listing them carries it.
                if let Some(offer) = host.offers.iter().find(|o| {
                    request
                        .gpus
                        .iter()
                        .all(|g| o.gpus.iter().any(|og| og.uuid == *g))
                }) {
                    let _ = host.book.reserve(
                        &Allocation {
                            offer: offer.id(),
                            ..allocation
                        },
                        request.id(),
                    );
                }
            }
        }
        Ok(host)
    }

    /// Publishes (remembers and stores) one of this host's offers.
    pub fn add_offer(&mut self, offer: Verified<Offer>, now: Timestamp) -> Result<(), StoreError> {
        if self.book.insert(&offer, now).is_err() {
            return Ok(());
        }
        self.state.save_own_offer(&offer.id(), offer.as_bytes())?;
        // The store keeps only current offers; replaced ones stay answerable in memory until
        // they expire.
        if let Some(pos) = self.offers.iter().position(|o| o.slot == offer.slot) {
            let old = self.offers.remove(pos);
            self.state.remove_own_offer(&old.id())?;
            self.superseded.push(old);
        }
        self.superseded.retain(|o| o.expires_at > now);
        let excess = self.superseded.len().saturating_sub(64);
        self.superseded.drain(..excess);
        self.offers.push(offer);
        Ok(())
    }

    /// This host's current offers.
    pub fn offers(&self) -> &[Verified<Offer>] {
        &self.offers
    }

    /// GPUs booked for a lease running at `now`.
    pub fn busy_gpus(&self, now: Timestamp) -> std::collections::BTreeSet<gpux_protocol::GpuUuid> {
        self.book
            .bookings()
            .into_iter()
            .filter(|b| b.3 <= now && now < b.4)
            .map(|b| b.1)
            .collect()
    }

    /// Forgets a slot's offer (its GPUs are all leased, or gone): it stays answerable until it
    /// expires, like a replaced one. Returns the offer, to withdraw it from the market.
    pub fn retire_slot(&mut self, slot: u16) -> Result<Option<Verified<Offer>>, StoreError> {
        let Some(pos) = self.offers.iter().position(|o| o.slot == slot) else {
            return Ok(None);
        };
        let old = self.offers.remove(pos);
        self.state.remove_own_offer(&old.id())?;
        self.superseded.push(old.clone());
        Ok(Some(old))
    }

    fn allocation(request: &Verified<LeaseRequest>, start: Timestamp) -> Allocation {
        let (start, end) = match request.kind {
            gpux_protocol::LeaseKind::Reserved { start, end } => (start, end),
            _ => (start, start.plus_secs(u64::from(request.duration_s))),
        };
        Allocation {
            offer: request.offer,
            host: request.host,
            gpus: request.gpus.to_vec(),
            price_per_gpu_hour: request.price_per_gpu_hour,
            kind: request.kind,
            start,
            end,
            preempts: Vec::new(),
        }
    }

    fn accept_ext(&self) -> Ext {
        let mut ext = Ext::new();
        if let Some((interval, grace)) = self.timing {
            // Two 8-byte values: always within the ext map's limits.
            let _ = ext.insert(EXT_RECEIPT_INTERVAL_MS, interval.to_le_bytes().to_vec());
            let _ = ext.insert(EXT_ACK_GRACE_MS, grace.to_le_bytes().to_vec());
        }
        ext
    }

    fn reject(
        &self,
        request: ContentId,
        reason: RejectReason,
        detail: &str,
        now: Timestamp,
    ) -> Answer {
        let body = LeaseReject {
            request,
            created_at: now,
            reason,
            detail: BoundedString::new(detail.chars().take(200).collect::<String>())
                .unwrap_or_default(),
            ext: Ext::new(),
        };
        let envelope = Signed::sign(&self.key, body)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default();
        Answer::Rejected { reason, envelope }
    }

    /// Answers a lease request (raw envelope bytes from the network) at `now`.
    pub fn handle_request(&mut self, bytes: Vec<u8>, now: Timestamp) -> Result<Answer, StoreError> {
        let request = match Signed::<LeaseRequest>::from_bytes(bytes).and_then(Signed::verify) {
            Ok(r) => r,
            Err(e) => {
                return Ok(self.reject(
                    ContentId([0; 32]),
                    RejectReason::Invalid,
                    &e.to_string(),
                    now,
                ));
            }
        };
        let id = request.id();
        if request.host != self.key.public() {
            return Ok(self.reject(
                id,
                RejectReason::Invalid,
                "the request is addressed to another host",
                now,
            ));
        }
        if let Err(e) = self.rules.check_time(&request, now) {
            return Ok(self.reject(id, reason_for(&e), &e.to_string(), now));
        }
        if self.state.lease(&id)?.is_some() {
            return Ok(self.reject(
                id,
                RejectReason::Invalid,
                "this request was already answered",
                now,
            ));
        }
        let Some(offer) = self
            .offers
            .iter()
            .chain(&self.superseded)
            .find(|o| o.id() == request.offer)
        else {
            return Ok(self.reject(
                id,
                RejectReason::OfferUnknown,
                "no such offer (replaced or withdrawn?)",
                now,
            ));
        };
        if offer.expires_at <= now {
            return Ok(self.reject(id, RejectReason::OfferExpired, "the offer has expired", now));
        }
        if let Err(e) = lease_request_matches_offer(&request, offer) {
            return Ok(self.reject(id, reason_for(&e), &e.to_string(), now));
        }
        // Book on the slot's current offer: bookings belong to the GPUs, so which of the
        // slot's offers the renter saw does not matter.
        let slot = offer.slot;
        let Some(current) = self.offers.iter().find(|o| {
            o.slot == slot
                && request
                    .gpus
                    .iter()
                    .all(|g| o.gpus.iter().any(|og| og.uuid == *g))
        }) else {
            // Leased GPUs leave the current offer; say so rather than "unknown offer".
            let busy = self.busy_gpus(now);
            let (reason, detail) = match request.gpus.iter().find(|g| busy.contains(g)) {
                Some(g) => (RejectReason::GpusUnavailable, format!("GPU {g} is leased")),
                None => (
                    RejectReason::OfferUnknown,
                    "the offer's GPUs are no longer offered".to_string(),
                ),
            };
            return Ok(self.reject(id, reason, &detail, now));
        };
        let current = current.id();
        let allocation = Allocation {
            offer: current,
            ..Self::allocation(&request, now)
        };
        if let Err(e) = self.book.reserve(&allocation, id) {
            return Ok(self.reject(id, RejectReason::GpusUnavailable, &e.to_string(), now));
        }
        let accept = match Signed::sign(
            &self.key,
            LeaseAccept {
                request: id,
                created_at: now,
                ext: self.accept_ext(),
            },
        ) {
            Ok(a) => a,
            Err(e) => {
                self.book.release(&id);
                return Ok(self.reject(id, RejectReason::Invalid, &e.to_string(), now));
            }
        };
        // Stored (flushed) before the renter hears of it.
        let record = LeaseRecord {
            lease: id.0,
            role: Role::Host,
            request: request.as_bytes().to_vec(),
            accept: Some(accept.as_bytes().to_vec()),
            state: LeaseState::Accepted,
            updated_at: now.0,
        };
        if let Err(e) = self.state.save_lease(&record) {
            self.book.release(&id);
            return Err(e);
        }
        Ok(Answer::Accepted {
            lease: id,
            envelope: accept.as_bytes().to_vec(),
        })
    }

    /// Ends a lease: frees its GPUs and records why.
    pub fn end_lease(
        &mut self,
        lease: &ContentId,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.book.release(lease);
        self.state.set_lease_state(
            lease,
            LeaseState::Ended {
                reason: reason.into(),
            },
            now,
        )
    }

    /// Announces this receipt timing (ms) in every acceptance, so the renter's watchdog
    /// knows when the host has fallen silent.
    pub fn set_receipt_timing(&mut self, interval_ms: u64, grace_ms: u64) {
        self.timing = Some((interval_ms, grace_ms));
    }

    /// Frees a lease's GPUs (its record is left as it is).
    pub fn release_gpus(&mut self, lease: &ContentId) {
        self.book.release(lease);
    }

    /// The node state.
    pub fn state(&self) -> &NodeState<S> {
        &self.state
    }
}
