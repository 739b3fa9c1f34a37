//! The host's own book: its offers, the bookings of its GPUs, and its answer to a lease
//! request.
//!
//! A lease exists only once the host has signed `LeaseAccept`, and the host signs it only
//! after booking the GPUs in its own book (`OrderBook::reserve`, atomic). Requests are
//! answered one at a time by whoever owns the book, so two renters racing for the same GPUs
//! get exactly one lease.

use std::collections::{BTreeMap, BTreeSet};

use gpux_market::{Allocation, BookConfig, OrderBook};
use gpux_protocol::validate::{RuleError, Rules, lease_request_matches_offer};
use gpux_protocol::{
    BoundedString, ContentId, Ext, GpuUuid, Keypair, LeaseKind, LeaseReject, LeaseRequest, Offer,
    RejectReason, Signed, Timestamp, Verified,
};

use crate::{HostEffect, HostLease, Timing};

/// Replaced offers kept answerable, at most.
const MAX_SUPERSEDED: usize = 64;

/// The host's answer to a lease request.
#[derive(Debug)]
pub enum Answer {
    /// Accepted: the new lease (store it before sending), its first effects, the signed
    /// `LeaseAccept` to send back, and the spot leases it will preempt (once its escrow is
    /// locked: its [`HostEffect::PreemptSpot`] says when).
    Accepted {
        /// The lease.
        lease: Box<HostLease>,
        /// Its first effects.
        effects: Vec<HostEffect>,
        /// The signed `LeaseAccept`.
        envelope: Vec<u8>,
        /// The spot leases whose GPUs it takes once their notice ends.
        preempts: Vec<ContentId>,
    },
    /// Refused.
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

/// What a change of the host's offers means for its stored offers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OfferChange {
    /// Store this offer (id, envelope).
    pub store: Option<(ContentId, Vec<u8>)>,
    /// Forget this stored offer.
    pub forget: Option<ContentId>,
}

fn reason_for(e: &RuleError) -> RejectReason {
    match e {
        RuleError::PriceBelowOffer { .. }
        | RuleError::SpotNotOffered
        | RuleError::WorkspacePriceBelowOffer { .. } => RejectReason::PriceTooLow,
        RuleError::DurationOutOfRange { .. } => RejectReason::DurationOutOfRange,
        RuleError::ImageNotOffered => RejectReason::ImageMissing,
        RuleError::LimitsAboveShare { .. } => RejectReason::LimitsTooHigh,
        RuleError::GpuNotOffered { .. } => RejectReason::GpusUnavailable,
        RuleError::Expired { .. } | RuleError::Stale { .. } => RejectReason::RequestExpired,
        _ => RejectReason::Invalid,
    }
}

/// The host's own book: its offers, the bookings of its GPUs, and its answer to a lease
/// request.
///
/// A lease exists only once the host has signed `LeaseAccept`, and the host signs it only
/// after booking the GPUs in its own book (`OrderBook::reserve`, atomic). Requests are
/// answered one at a time by whoever owns the book, so two renters racing for the same GPUs
/// get exactly one lease.
#[derive(Debug)]
pub struct HostBook {
    key: Keypair,
    timing: Timing,
    book: OrderBook,
    offers: Vec<Verified<Offer>>,
    /// Offers replaced by newer ones but not expired: a renter whose view lags one
    /// publication behind may still name them (its lease is booked on the current offer).
    superseded: Vec<Verified<Offer>>,
    rules: Rules,
    /// Requests answered, until they expire (a replayed request is refused).
    answered: BTreeMap<ContentId, Timestamp>,
    /// GPUs held by restored leases that no current offer lists (their slot was withdrawn
    /// while they were leased, or its offer lapsed while the host was down).
    held: BTreeMap<ContentId, Vec<GpuUuid>>,
    /// The booked leases that are spot (preemptible), with what books them again.
    spot: BTreeMap<ContentId, (Verified<LeaseRequest>, Timestamp)>,
    /// Leases booked from the end of the notice of the spot leases they preempt (until they
    /// end): their GPUs are promised, so offers leave them out at once.
    preempting: BTreeSet<ContentId>,
    /// Accepted leases whose bookings cut spot leases that have not had their notice yet
    /// (it waits for the preempting lease's escrow): if the preempting lease ends first,
    /// the spot leases are booked whole again.
    pending: BTreeMap<ContentId, Vec<ContentId>>,
    /// Devices that share hardware: each MIG instance with its GPU, the GPU with each of its
    /// instances. A lease on one makes the others unavailable for its window.
    related: BTreeMap<GpuUuid, BTreeSet<GpuUuid>>,
    /// GPUs a refusal named as free to one renter, kept for it until the time given
    /// ([`NAMED_HOLD_MS`]): another renter is neither named nor given them meanwhile, so
    /// renters refused at once each ask again for GPUs of their own.
    named: BTreeMap<GpuUuid, (gpux_protocol::PublicKey, Timestamp)>,
    /// What the host keeps out of its offers and refuses to lease.
    withheld: Withheld,
}

/// What a host keeps off the market while it runs: everything while paused, its failed GPUs
/// (and their MIG slices), and any lease that would end after its drain time. Offers leave
/// them out and [`HostBook::handle_request`] refuses them; running leases go on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Withheld {
    /// Paused: no offers, no new leases.
    pub paused: bool,
    /// GPUs that failed (a fatal Xid), until checked.
    pub failed: BTreeSet<GpuUuid>,
    /// Draining: only leases that end by then.
    pub drain_until: Option<Timestamp>,
}

/// How long the GPUs a refusal names stay kept for the renter it named them to, ms.
pub const NAMED_HOLD_MS: u64 = 5_000;

impl HostBook {
    /// An empty book; `timing` is announced in every acceptance.
    pub fn new(key: Keypair, timing: Timing) -> Self {
        Self {
            key,
            timing,
            book: OrderBook::new(BookConfig::default()),
            offers: Vec::new(),
            superseded: Vec::new(),
            rules: Rules::default(),
            answered: BTreeMap::new(),
            held: BTreeMap::new(),
            spot: BTreeMap::new(),
            preempting: BTreeSet::new(),
            pending: BTreeMap::new(),
            related: BTreeMap::new(),
            named: BTreeMap::new(),
            withheld: Withheld::default(),
        }
    }

    /// What the host keeps off the market now.
    pub fn withheld(&self) -> &Withheld {
        &self.withheld
    }

    /// Changes what the host keeps off the market (from the next request and publication).
    pub fn set_withheld(&mut self, withheld: Withheld) {
        self.withheld = withheld;
    }

    /// Whether `device` is on a failed GPU: the GPU itself, or a MIG slice of it.
    pub fn on_failed_gpu(&self, device: &GpuUuid) -> bool {
        self.with_related([*device])
            .iter()
            .any(|d| self.withheld.failed.contains(d))
    }

    /// Why the host refuses `request` at `now` for what it withholds, if it does.
    fn withheld_refusal(&self, request: &LeaseRequest, now: Timestamp) -> Option<String> {
        if self.withheld.paused {
            return Some("the host is paused: it takes no new leases".into());
        }
        if let Some(until) = self.withheld.drain_until {
            let end = match request.kind {
                LeaseKind::Reserved { end, .. } => end,
                _ => now.plus_secs(request.duration_s.into()),
            };
            if end > until {
                return Some(
                    "the host is draining: it takes only leases that end before its drain time"
                        .into(),
                );
            }
        }
        request
            .gpus
            .iter()
            .find(|g| self.on_failed_gpu(g))
            .map(|g| format!("GPU {g} failed on this host; it takes no leases until checked"))
    }

    /// The GPUs kept at `now` for renters other than `renter` (named in their refusals).
    fn named_to_others(&self, renter: &gpux_protocol::PublicKey, now: Timestamp) -> Vec<GpuUuid> {
        self.named
            .iter()
            .filter(|(_, (to, until))| to != renter && *until > now)
            .map(|(g, _)| *g)
            .collect()
    }

    /// The host's MIG layout: `(gpu, instance)` pairs, each instance a slice of that GPU. A
    /// GPU is then not offered or leased while any of its slices is, nor a slice while its
    /// GPU is. Replaces the layout set before.
    pub fn set_mig_layout(&mut self, pairs: impl IntoIterator<Item = (GpuUuid, GpuUuid)>) {
        self.related.clear();
        for (gpu, slice) in pairs {
            self.related.entry(gpu).or_default().insert(slice);
            self.related.entry(slice).or_default().insert(gpu);
        }
    }

    /// `devices` and every device sharing hardware with one of them.
    fn with_related(&self, devices: impl IntoIterator<Item = GpuUuid>) -> BTreeSet<GpuUuid> {
        let mut all = BTreeSet::new();
        for d in devices {
            all.insert(d);
            all.extend(self.related.get(&d).into_iter().flatten().copied());
        }
        all
    }

    /// A device sharing hardware with one of `gpus` that is booked within `[start, end)` or
    /// held: the first, with the device it shares with.
    fn related_conflict(
        &self,
        gpus: &[GpuUuid],
        start: Timestamp,
        end: Timestamp,
    ) -> Option<(GpuUuid, GpuUuid)> {
        let taken: BTreeSet<GpuUuid> = self
            .book
            .bookings()
            .into_iter()
            .filter(|b| b.3 < end && start < b.4)
            .map(|b| b.1)
            .chain(self.held.values().flatten().copied())
            .collect();
        gpus.iter().find_map(|g| {
            self.related
                .get(g)?
                .iter()
                .find(|r| taken.contains(r))
                .map(|r| (*g, *r))
        })
    }

    /// After a restart: the stored offers (still current); every lease that still holds its
    /// GPUs is booked again, so a restarted host never hands them to someone else; and every
    /// request answered before (settled or not: `answered`, with its expiry) stays refused.
    pub fn restore<'a>(
        &mut self,
        offers: Vec<Verified<Offer>>,
        leases: impl IntoIterator<Item = &'a HostLease>,
        answered: impl IntoIterator<Item = (ContentId, Timestamp)>,
        now: Timestamp,
    ) {
        for offer in offers {
            if offer.expires_at > now && self.book.insert(&offer, now).is_ok() {
                self.offers.push(offer);
            }
        }
        self.answered
            .extend(answered.into_iter().filter(|(_, expires)| *expires > now));
        for lease in leases {
            self.answered.insert(lease.id(), lease.request().expires_at);
            if lease.holds_gpus() {
                self.book_lease(lease.request(), lease.record().starts_at);
            }
        }
    }

    fn book_lease(&mut self, request: &Verified<LeaseRequest>, accepted_at: Timestamp) {
        if matches!(request.kind, LeaseKind::Spot) {
            self.spot
                .insert(request.id(), (request.clone(), accepted_at));
        }
        // The offer may have been replaced; the booking belongs to the GPUs, not the offer,
        // so any current offer listing them carries it. When none does, the GPUs are held
        // apart from the book.
        let booked = self
            .offers
            .iter()
            .find(|o| {
                request
                    .gpus
                    .iter()
                    .all(|g| o.gpus.iter().any(|og| og.uuid == *g))
            })
            .map(|offer| Allocation {
                offer: offer.id(),
                ..allocation(request, accepted_at)
            })
            .is_some_and(|a| self.book.reserve(&a, request.id()).is_ok());
        if !booked {
            self.held.insert(request.id(), request.gpus.to_vec());
        }
    }

    /// Publishes one of this host's offers (it replaces the slot's previous one).
    pub fn add_offer(&mut self, offer: Verified<Offer>, now: Timestamp) -> OfferChange {
        if self.book.insert(&offer, now).is_err() {
            return OfferChange::default();
        }
        let mut change = OfferChange {
            store: Some((offer.id(), offer.as_bytes().to_vec())),
            forget: None,
        };
        // Replaced offers stay answerable in memory until they expire.
        if let Some(pos) = self.offers.iter().position(|o| o.slot == offer.slot) {
            let old = self.offers.remove(pos);
            change.forget = Some(old.id());
            self.superseded.push(old);
        }
        self.superseded.retain(|o| o.expires_at > now);
        let excess = self.superseded.len().saturating_sub(MAX_SUPERSEDED);
        self.superseded.drain(..excess);
        self.offers.push(offer);
        change
    }

    /// Forgets a slot's offer (its GPUs are all leased, or gone): it stays answerable until it
    /// expires. Returns the offer, to withdraw it from the market.
    pub fn retire_slot(&mut self, slot: u16) -> Option<Verified<Offer>> {
        let pos = self.offers.iter().position(|o| o.slot == slot)?;
        let old = self.offers.remove(pos);
        self.superseded.push(old.clone());
        Some(old)
    }

    /// This host's current offers.
    pub fn offers(&self) -> &[Verified<Offer>] {
        &self.offers
    }

    /// GPUs booked for a lease running at `now` (or held by a restored one).
    /// A GPU is busy while one of its MIG instances is, and an instance while its GPU is.
    pub fn busy_gpus(&self, now: Timestamp) -> BTreeSet<GpuUuid> {
        self.with_related(
            self.book
                .bookings()
                .into_iter()
                .filter(|b| b.3 <= now && now < b.4)
                .map(|b| b.1)
                .chain(self.held.values().flatten().copied()),
        )
    }

    /// GPUs a publication leaves out at `now`: those booked now by leases that are not
    /// spot, and those promised to a lease that preempts spot leases. GPUs under a spot
    /// lease alone stay offered, since an on-demand lease (or a higher spot bid) may preempt
    /// it; so do GPUs reserved for a window later on (a lease that would overlap the window
    /// is refused). A device sharing hardware with a leased one (a GPU and its MIG
    /// instances) is left out too, spot or not: a lease on one never preempts the other.
    pub fn unoffered_gpus(&self, now: Timestamp) -> BTreeSet<GpuUuid> {
        let bookings = self.book.bookings();
        let mut out: BTreeSet<GpuUuid> = bookings
            .iter()
            .filter(|b| {
                now < b.4
                    && ((b.3 <= now && !self.spot.contains_key(&b.2))
                        || self.preempting.contains(&b.2))
            })
            .map(|b| b.1)
            .chain(self.held.values().flatten().copied())
            .collect();
        let running = bookings
            .iter()
            .filter(|b| b.3 <= now && now < b.4)
            .map(|b| b.1)
            .chain(self.held.values().flatten().copied());
        for d in running {
            out.extend(self.related.get(&d).into_iter().flatten().copied());
        }
        out
    }

    /// The windows booked ahead on `gpu` at `now` (leases that have not begun and no one
    /// preempts), earliest first: an offer lists them so that renters do not ask for them.
    /// Windows booked on a device sharing its hardware count too.
    pub fn booked_ahead(&self, gpu: &GpuUuid, now: Timestamp) -> Vec<(Timestamp, Timestamp)> {
        let devices = self.with_related([*gpu]);
        let mut windows: Vec<(Timestamp, Timestamp)> = self
            .book
            .bookings()
            .into_iter()
            .filter(|b| devices.contains(&b.1) && now < b.3 && !self.spot.contains_key(&b.2))
            .map(|b| (b.3, b.4))
            .collect();
        windows.sort();
        windows
    }

    /// The booked windows of `lease` as (GPU, start, end): for checks and tests.
    pub fn bookings_of(&self, lease: &ContentId) -> Vec<(GpuUuid, Timestamp, Timestamp)> {
        self.book
            .bookings()
            .into_iter()
            .filter(|b| b.2 == *lease)
            .map(|b| (b.1, b.3, b.4))
            .collect()
    }

    /// Frees a lease's GPUs. A preempting lease that ends before its escrow was locked
    /// gives the spot leases it cut their whole booking back.
    pub fn release(&mut self, lease: &ContentId) {
        self.book.release(lease);
        self.held.remove(lease);
        self.spot.remove(lease);
        self.preempting.remove(lease);
        for spot in self.pending.remove(lease).unwrap_or_default() {
            if let Some((request, starts_at)) = self.spot.get(&spot).cloned() {
                self.book.release(&spot);
                self.book_lease(&request, starts_at);
            }
        }
    }

    /// The preempting lease's escrow is locked: the spot leases it cut get their notice, and
    /// their bookings stay cut.
    pub fn preempting_locked(&mut self, lease: &ContentId) {
        self.pending.remove(lease);
    }

    /// The booking `request` would take by preempting the spot leases on its GPUs: from the
    /// end of their notice, if every lease booked on its GPUs until its end is a spot lease
    /// it may preempt (the book checks the price).
    fn preempting(
        &self,
        request: &Verified<LeaseRequest>,
        offer: ContentId,
        now: Timestamp,
    ) -> Option<Allocation> {
        if matches!(request.kind, LeaseKind::Reserved { .. }) {
            return None;
        }
        // The notice is given once the preempting lease's escrow is locked, at most the lock
        // window after the acceptance.
        let start = now.plus_ms(
            crate::host::LOCK_WINDOW_MS + self.timing.spot_notice_ms + crate::PREEMPT_HANDOVER_MS,
        );
        let mut wanted = Allocation {
            offer,
            ..allocation(request, start)
        };
        let mut preempts = BTreeSet::new();
        for (_, gpu, lease, from, until) in self.book.bookings() {
            if request.gpus.contains(&gpu) && from < wanted.end && now < until {
                if !self.spot.contains_key(&lease) {
                    return None;
                }
                preempts.insert(lease);
            }
        }
        if preempts.is_empty() {
            return None;
        }
        wanted.preempts = preempts.into_iter().collect();
        Some(wanted)
    }

    fn reject(
        &self,
        request: ContentId,
        reason: RejectReason,
        detail: &str,
        now: Timestamp,
    ) -> Answer {
        self.reject_with(request, reason, detail, Ext::new(), now)
    }

    fn reject_with(
        &self,
        request: ContentId,
        reason: RejectReason,
        detail: &str,
        ext: Ext,
        now: Timestamp,
    ) -> Answer {
        let body = LeaseReject {
            request,
            created_at: now,
            reason,
            detail: BoundedString::new(detail.chars().take(200).collect::<String>())
                .unwrap_or_default(),
            ext,
        };
        let envelope = Signed::sign(&self.key, body)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default();
        Answer::Rejected { reason, envelope }
    }

    /// A refusal for GPUs that are taken, naming as many other GPUs of the request's slot as
    /// it asks for that are free for its window ([`gpux_protocol::EXT_REJECT_FREE_GPUS`]), so
    /// that the renter asks again for those rather than going to another host.
    fn reject_taken(
        &mut self,
        request: &Verified<LeaseRequest>,
        detail: &str,
        now: Timestamp,
    ) -> Answer {
        let mut ext = Ext::new();
        self.named.retain(|_, (_, until)| *until > now);
        if let Some(free) = self.free_instead(request, now) {
            for g in &free {
                self.named
                    .insert(*g, (request.signer(), now.plus_ms(NAMED_HOLD_MS)));
            }
            // At most 16 GPUs of 17 bytes: within an ext value's 1 KiB.
            let _ = ext.insert(
                gpux_protocol::EXT_REJECT_FREE_GPUS,
                gpux_protocol::encode_gpus(&free),
            );
        }
        self.reject_with(
            request.id(),
            RejectReason::GpusUnavailable,
            detail,
            ext,
            now,
        )
    }

    /// Free GPUs of the request's slot, as many as it asks for, none of them held.
    fn free_instead(
        &self,
        request: &Verified<LeaseRequest>,
        now: Timestamp,
    ) -> Option<Vec<GpuUuid>> {
        let named = self
            .offers
            .iter()
            .chain(&self.superseded)
            .find(|o| o.id() == request.offer)?;
        let current = self.offers.iter().find(|o| o.slot == named.slot)?;
        let spec = gpux_market::BidSpec {
            query: gpux_market::query::Query::default(),
            gpus: u16::try_from(request.gpus.len()).ok()?,
            max_price: request.price_per_gpu_hour,
            duration_s: request.duration_s,
            kind: request.kind,
            allow_spread: false,
        };
        // Not the GPUs named to anyone in a refusal still kept (to this renter's other
        // rents neither): each refusal names GPUs of its own.
        let mut held: Vec<GpuUuid> = self.held.values().flatten().copied().collect();
        held.extend(
            self.named
                .iter()
                .filter(|(_, (_, until))| *until > now)
                .map(|(g, _)| *g),
        );
        // Renters refused at the same moment are named different GPUs where there are
        // enough: the offer's GPUs from a point that the request's id picks.
        let mut order: Vec<GpuUuid> = current.gpus.iter().map(|g| g.uuid).collect();
        let turn = usize::from(request.id().0[0]) % order.len().max(1);
        order.rotate_left(turn);
        let allocation = self
            .book
            .allocate_on(&current.id(), &spec, now, (&order, &held))?;
        // Only GPUs the offer the renter named lists: its request must name them.
        allocation
            .gpus
            .iter()
            .all(|g| named.gpus.iter().any(|n| n.uuid == *g))
            .then_some(allocation.gpus)
    }

    /// Answers a (verified) lease request at `now`; `staged`: the host holds the image the
    /// request names for its renter (staged by it, see [`lease_request_matches_offer`]).
    pub fn handle_request(
        &mut self,
        request: Verified<LeaseRequest>,
        now: Timestamp,
        staged: bool,
    ) -> Answer {
        let id = request.id();
        self.answered.retain(|_, expires| *expires > now);
        if request.host != self.key.public() {
            return self.reject(
                id,
                RejectReason::Invalid,
                "the request is addressed to another host",
                now,
            );
        }
        if let Err(e) = self.rules.check_time(&request, now) {
            return self.reject(id, reason_for(&e), &e.to_string(), now);
        }
        if self.answered.contains_key(&id) {
            return self.reject(
                id,
                RejectReason::Invalid,
                "this request was already answered",
                now,
            );
        }
        if let Some(why) = self.withheld_refusal(&request, now) {
            return self.reject(id, RejectReason::GpusUnavailable, &why, now);
        }
        let Some(offer) = self
            .offers
            .iter()
            .chain(&self.superseded)
            .find(|o| o.id() == request.offer)
        else {
            return self.reject(
                id,
                RejectReason::OfferUnknown,
                "no such offer (replaced or withdrawn?)",
                now,
            );
        };
        if offer.expires_at <= now {
            return self.reject(id, RejectReason::OfferExpired, "the offer has expired", now);
        }
        if let Err(e) = lease_request_matches_offer(&request, offer, staged) {
            return self.reject(id, reason_for(&e), &e.to_string(), now);
        }
        // A reserved window is booked ahead, up to a horizon; one that has begun starts at
        // once, for what is left of it.
        if let LeaseKind::Reserved { start, end } = request.kind {
            if start > now.plus_ms(crate::MAX_RESERVE_AHEAD_MS) {
                return self.reject(
                    id,
                    RejectReason::Invalid,
                    "the reserved window starts too far ahead (this host books 30 days ahead)",
                    now,
                );
            }
            if end <= now {
                return self.reject(
                    id,
                    RejectReason::Invalid,
                    "the reserved window is over",
                    now,
                );
            }
        }
        if let Some(g) = request
            .gpus
            .iter()
            .find(|g| self.held.values().flatten().any(|h| h == *g))
        {
            return self.reject_taken(&request, &format!("GPU {g} is leased"), now);
        }
        let others = self.named_to_others(&request.signer(), now);
        if let Some(g) = request.gpus.iter().find(|g| others.contains(g)) {
            return self.reject_taken(
                &request,
                &format!("GPU {g} is kept a moment for another renter"),
                now,
            );
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
            return match request.gpus.iter().find(|g| busy.contains(g)) {
                Some(g) => self.reject_taken(&request, &format!("GPU {g} is leased"), now),
                None => self.reject(
                    id,
                    RejectReason::OfferUnknown,
                    "the offer's GPUs are no longer offered",
                    now,
                ),
            };
        };
        let offer = current.id();
        let direct = Allocation {
            offer,
            ..allocation(&request, now)
        };
        // A GPU and its MIG instances are one piece of hardware: a lease on either waits for
        // no preemption of the other, it is refused.
        if let Some((wanted, taken)) =
            self.related_conflict(&request.gpus, direct.start, direct.end)
        {
            return self.reject(
                id,
                RejectReason::GpusUnavailable,
                &format!("{wanted} shares its hardware with {taken}, which is leased"),
                now,
            );
        }
        // Free GPUs are booked at once; GPUs under spot leases this request may preempt,
        // from the end of their notice.
        let booked = match self.book.reserve(&direct, id) {
            Ok(()) => direct,
            Err(e) => match self.preempting(&request, offer, now) {
                Some(wanted) if self.book.reserve(&wanted, id).is_ok() => wanted,
                _ => return self.reject_taken(&request, &e.to_string(), now),
            },
        };
        // The booking's start, when later than now: after the preempted leases' notice, or
        // a reserved window's start.
        let starts_at = (booked.start > now).then_some(booked.start);
        let accept = match Signed::sign(&self.key, self.timing.accept(id, now, starts_at)) {
            Ok(a) => a,
            Err(e) => {
                // (Signing does not fail with a valid key; any preempted booking stays cut.)
                self.book.release(&id);
                return self.reject(id, RejectReason::Invalid, &e.to_string(), now);
            }
        };
        if matches!(request.kind, LeaseKind::Spot) {
            self.spot.insert(id, (request.clone(), booked.start));
        }
        if !booked.preempts.is_empty() {
            self.pending.insert(id, booked.preempts.clone());
            self.preempting.insert(id);
        }
        self.answered.insert(id, request.expires_at);
        let envelope = accept.as_bytes().to_vec();
        let (lease, effects) = HostLease::accepted(
            self.key.clone(),
            request,
            &accept,
            self.timing,
            booked.preempts.clone(),
        );
        Answer::Accepted {
            lease: Box::new(lease),
            effects,
            envelope,
            preempts: booked.preempts,
        }
    }
}

fn allocation(request: &Verified<LeaseRequest>, start: Timestamp) -> Allocation {
    let (start, end) = match request.kind {
        LeaseKind::Reserved { start, end } => (start, end),
        // A lease that waits for its renter's commit holds its GPUs for the wait too.
        _ => {
            let wait = request.commit_wait_ms().ok().flatten().unwrap_or(0);
            (
                start,
                start.plus_ms(wait + u64::from(request.duration_s) * 1000),
            )
        }
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
