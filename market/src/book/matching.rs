//! Matching bids against the book, and booking the GPUs of a lease.
//!
//! Priority is price, then host reliability (descending), then age: the book's index order.
//! By default every GPU of a lease comes from one offer (one machine); a bid may allow
//! spreading over several. Kinds:
//!
//! - **on-demand** runs `[now, now + duration)`, pays the offer's price and is never
//!   preempted. It may preempt spot leases on the GPUs it needs; it then starts after the
//!   notice period.
//! - **spot** pays its bid price (at least the offer's spot floor), runs like on-demand, and
//!   may preempt lower-priced spot leases after the notice period.
//! - **reserved** books a future window `[start, end)` at the offer's price; it needs GPUs
//!   with no booking at all in the window, so overlapping windows never both match.

use std::collections::BTreeSet;

use gpux_protocol::{
    Bid, ContentId, GpuUuid, LeaseKind, MicroCredits, PublicKey, Timestamp, Verified,
};

use super::filter::{Facts, clause_holds, price_bounds};
use super::{Booking, Entry, OrderBook};
use crate::query::{Query, QueryError};

/// Whether the host's offer says GPU `g` is booked ahead for part of `window` (a reserved
/// lease of someone else's, which this book may not know of).
fn booked_by_host(entry: &Entry, g: u8, window: (u64, u64)) -> bool {
    entry
        .booked
        .iter()
        .any(|&(gpu, start, end)| gpu == g && start < window.1 && window.0 < end)
}

/// What a renter wants, ready to match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BidSpec {
    /// Constraints.
    pub query: Query,
    /// GPUs wanted.
    pub gpus: u16,
    /// Most paid per GPU-hour (for spot: the price bid).
    pub max_price: MicroCredits,
    /// Lease length, seconds.
    pub duration_s: u32,
    /// On-demand, spot or reserved.
    pub kind: LeaseKind,
    /// Whether GPUs may come from several offers.
    pub allow_spread: bool,
}

impl BidSpec {
    /// The spec of a verified bid (its query parsed).
    pub fn from_bid(bid: &Verified<Bid>) -> Result<Self, QueryError> {
        Ok(Self {
            query: Query::parse(&bid.query)?,
            gpus: bid.gpus,
            max_price: bid.max_price_per_gpu_hour,
            duration_s: bid.duration_s,
            kind: bid.kind,
            allow_spread: bid.allow_spread,
        })
    }

    /// The window a match would occupy, given `now` and any preemption delay.
    pub(crate) fn window(&self, now: u64, delay: u64) -> (u64, u64) {
        match self.kind {
            LeaseKind::Reserved { start, end } => (start.0, end.0),
            LeaseKind::OnDemand | LeaseKind::Spot => {
                let start = now.saturating_add(delay);
                (
                    start,
                    start.saturating_add(u64::from(self.duration_s) * 1000),
                )
            }
        }
    }

    /// The price a spot booking of this bid would carry (None for other kinds).
    fn spot_price(&self) -> Option<u64> {
        matches!(self.kind, LeaseKind::Spot).then_some(self.max_price.0)
    }
}

/// GPUs of one offer for one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The offer.
    pub offer: ContentId,
    /// Its host.
    pub host: PublicKey,
    /// The GPUs.
    pub gpus: Vec<GpuUuid>,
    /// Price per GPU-hour the lease pays.
    pub price_per_gpu_hour: MicroCredits,
    /// The lease kind.
    pub kind: LeaseKind,
    /// Window start (later than now when spot leases must be preempted first).
    pub start: Timestamp,
    /// Window end.
    pub end: Timestamp,
    /// Spot leases that must end (at `start`) to free the GPUs.
    pub preempts: Vec<ContentId>,
}

/// Why a bid matched nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MatchError {
    /// No offer (or set of offers, when spreading) can satisfy it now.
    #[error("no offer satisfies the bid")]
    NoMatch,
    /// A reserved window that has already started.
    #[error("the reserved window starts in the past")]
    WindowInThePast,
    /// Zero GPUs or zero duration.
    #[error("a bid needs at least one GPU and one second")]
    Empty,
}

/// Why GPUs could not be booked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReserveError {
    /// The offer is not in the book.
    #[error("unknown offer")]
    UnknownOffer,
    /// A GPU is not part of the offer.
    #[error("GPU {0} is not in the offer")]
    UnknownGpu(GpuUuid),
    /// A GPU is booked for an overlapping window that this lease may not preempt.
    #[error("GPU {0} is booked for an overlapping window")]
    Unavailable(GpuUuid),
    /// The lease id is already booked.
    #[error("the lease is already booked")]
    DuplicateLease,
    /// The window is empty or reversed.
    #[error("the lease window is empty")]
    EmptyWindow,
}

/// How a GPU can serve a window.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Availability {
    Free,
    /// Free once these spot leases are preempted.
    Preempt(Vec<ContentId>),
    Busy,
}

fn availability(
    bookings: &[Booking],
    window: (u64, u64),
    spec_spot: Option<u64>,
    reserved: bool,
) -> Availability {
    let mut preempt = Vec::new();
    for b in bookings
        .iter()
        .filter(|b| b.start < window.1 && window.0 < b.end)
    {
        // A reservation never preempts; on-demand preempts any spot lease; spot preempts
        // only lower spot bids.
        if reserved || !may_preempt(b.spot_price, spec_spot) {
            return Availability::Busy;
        }
        preempt.push(b.lease);
    }
    if preempt.is_empty() {
        Availability::Free
    } else {
        Availability::Preempt(preempt)
    }
}

/// Whether a lease paying `ours` (None: not spot) may preempt a booking paying `theirs`:
/// on-demand preempts any spot lease, spot only one it outbids by the increment
/// ([`spot_outbids`](gpux_protocol::validate::spot_outbids)).
fn may_preempt(theirs: Option<u64>, ours: Option<u64>) -> bool {
    match (theirs, ours) {
        (Some(_), None) => true,
        (Some(theirs), Some(ours)) => {
            gpux_protocol::validate::spot_outbids(MicroCredits(theirs), MicroCredits(ours))
        }
        (None, _) => false,
    }
}

impl OrderBook {
    /// Whether an entry takes this bid at all (clauses aside): price, duration, kind.
    pub(crate) fn takes(entry: &Entry, spec: &BidSpec) -> bool {
        let price_ok = match spec.kind {
            LeaseKind::Spot => entry.spot_floor.is_some_and(|f| f <= spec.max_price.0),
            LeaseKind::OnDemand | LeaseKind::Reserved { .. } => entry.price <= spec.max_price.0,
        };
        price_ok
            && entry.min_duration_s <= spec.duration_s
            && spec.duration_s <= entry.max_duration_s
    }

    /// GPUs of `entry` free for the whole window without preempting anyone.
    pub(crate) fn free_gpus(
        &self,
        entry: &Entry,
        spec: &BidSpec,
        window: (u64, u64),
    ) -> Vec<(u8, Vec<ContentId>)> {
        let reserved = matches!(spec.kind, LeaseKind::Reserved { .. });
        (0..entry.gpus.len() as u8)
            .filter(|&g| !booked_by_host(entry, g, window))
            .filter(|&g| {
                let bookings = self.gpu_bookings(entry.host, &entry.gpus[usize::from(g)]);
                availability(bookings, window, spec.spot_price(), reserved) == Availability::Free
            })
            .map(|g| (g, Vec::new()))
            .collect()
    }

    /// GPUs of `entry` usable for `window` if spot leases on them are preempted (those first
    /// that need no preemption).
    fn preemptible_gpus(
        &self,
        entry: &Entry,
        spec: &BidSpec,
        window: (u64, u64),
    ) -> Vec<(u8, Vec<ContentId>)> {
        let mut free = Vec::new();
        let mut preempt = Vec::new();
        for g in 0..entry.gpus.len() as u8 {
            if booked_by_host(entry, g, window) {
                continue;
            }
            let bookings = self.gpu_bookings(entry.host, &entry.gpus[usize::from(g)]);
            match availability(bookings, window, spec.spot_price(), false) {
                Availability::Free => free.push((g, Vec::new())),
                Availability::Preempt(leases) => preempt.push((g, leases)),
                Availability::Busy => {}
            }
        }
        free.extend(preempt);
        free
    }

    pub(crate) fn allocation(
        entry: &Entry,
        spec: &BidSpec,
        window: (u64, u64),
        picked: &[(u8, Vec<ContentId>)],
    ) -> Allocation {
        let mut preempts: Vec<ContentId> =
            picked.iter().flat_map(|(_, p)| p.iter().copied()).collect();
        preempts.sort_unstable();
        preempts.dedup();
        Allocation {
            offer: entry.id,
            host: entry.host_key,
            gpus: picked
                .iter()
                .map(|(g, _)| entry.gpus[usize::from(*g)])
                .collect(),
            price_per_gpu_hour: match spec.kind {
                LeaseKind::Spot => spec.max_price,
                _ => MicroCredits(entry.price),
            },
            kind: spec.kind,
            start: Timestamp(window.0),
            end: Timestamp(window.1),
            preempts,
        }
    }

    /// Matches a bid at `now`: the best offer (or offers, when spreading is allowed) that
    /// satisfies every clause, the price, the duration bounds and the kind, best first by
    /// price, reliability and age. Nothing is booked; see [`OrderBook::reserve`].
    pub fn match_bid(&self, spec: &BidSpec, now: Timestamp) -> Result<Vec<Allocation>, MatchError> {
        self.match_bid_excluding(spec, now, &BTreeSet::new())
    }

    /// [`OrderBook::match_bid`], skipping the offers in `excluded` (for example those whose
    /// hosts just refused the renter).
    pub fn match_bid_excluding(
        &self,
        spec: &BidSpec,
        now: Timestamp,
        excluded: &BTreeSet<ContentId>,
    ) -> Result<Vec<Allocation>, MatchError> {
        let now = now.0;
        if spec.gpus == 0 || spec.duration_s == 0 {
            return Err(MatchError::Empty);
        }
        if let LeaseKind::Reserved { start, .. } = spec.kind
            && start.0 < now
        {
            return Err(MatchError::WindowInThePast);
        }
        let buckets = self.candidate_buckets(&spec.query.clauses);
        let (lo, hi) = price_bounds(&spec.query.clauses);
        // Spot bids walk the spot-floor index, the others the price index, both capped by the
        // bid's maximum. `price` clauses bound the offer's price, which only the price index
        // is ordered by.
        let spot = matches!(spec.kind, LeaseKind::Spot);
        let (lo, hi) = if spot {
            (0, spec.max_price.0)
        } else {
            (lo, hi.min(spec.max_price.0))
        };
        let mut wanted = usize::from(spec.gpus);
        let mut allocations = Vec::new();
        for key in self.merged(&buckets, lo, hi, spot) {
            let Some(entry) = self.entry(key.3) else {
                continue;
            };
            if excluded.contains(&entry.id) || entry.expires_at <= now || !Self::takes(entry, spec)
            {
                continue;
            }
            let facts = Facts::new(self, entry, now);
            if !spec.query.clauses.iter().all(|c| clause_holds(c, &facts)) {
                continue;
            }
            let window = spec.window(now, 0);
            let free = self.free_gpus(entry, spec, window);
            if spec.allow_spread {
                // Spreading takes free GPUs only; it never preempts.
                if free.is_empty() {
                    continue;
                }
                let take = free.len().min(wanted);
                allocations.push(Self::allocation(entry, spec, window, &free[..take]));
                wanted -= take;
                if wanted == 0 {
                    return Ok(allocations);
                }
            } else if free.len() >= wanted {
                return Ok(vec![Self::allocation(entry, spec, window, &free[..wanted])]);
            } else if !matches!(spec.kind, LeaseKind::Reserved { .. }) {
                // Preempted spot leases run until their notice ends; this lease starts then.
                let delayed = spec.window(now, self.config.spot_notice_ms);
                let usable = self.preemptible_gpus(entry, spec, delayed);
                if usable.len() >= wanted {
                    return Ok(vec![Self::allocation(
                        entry,
                        spec,
                        delayed,
                        &usable[..wanted],
                    )]);
                }
            }
        }
        Err(MatchError::NoMatch)
    }

    /// Books an allocation's GPUs for `lease`, atomically: either every GPU is booked or
    /// none is. Spot leases the allocation preempts, and only those found on its GPUs in its
    /// window, are cut to end at its start (on all their GPUs: a lease ends as a whole). Fails
    /// if any GPU has an overlapping booking it may not preempt (the host is the authority:
    /// this is the check behind every `LeaseAccept`).
    pub fn reserve(
        &mut self,
        allocation: &Allocation,
        lease: ContentId,
    ) -> Result<(), ReserveError> {
        if self.leases.contains_key(&lease) {
            return Err(ReserveError::DuplicateLease);
        }
        if allocation.start >= allocation.end {
            return Err(ReserveError::EmptyWindow);
        }
        let idx = *self
            .by_id
            .get(&allocation.offer)
            .ok_or(ReserveError::UnknownOffer)?;
        let entry = self.entry(idx).ok_or(ReserveError::UnknownOffer)?;
        let host = entry.host;
        let window = (allocation.start.0, allocation.end.0);
        let spot_price =
            matches!(allocation.kind, LeaseKind::Spot).then_some(allocation.price_per_gpu_hour.0);
        let reserved = matches!(allocation.kind, LeaseKind::Reserved { .. });
        let mut cut: BTreeSet<ContentId> = BTreeSet::new();
        let mut gpus: Vec<GpuUuid> = Vec::with_capacity(allocation.gpus.len());
        for uuid in &allocation.gpus {
            if !entry.gpus.contains(uuid) {
                return Err(ReserveError::UnknownGpu(*uuid));
            }
            if gpus.contains(uuid) {
                return Err(ReserveError::Unavailable(*uuid));
            }
            for b in self
                .gpu_bookings(host, uuid)
                .iter()
                .filter(|b| b.start < window.1 && window.0 < b.end)
            {
                let allowed = !reserved
                    && allocation.preempts.contains(&b.lease)
                    && may_preempt(b.spot_price, spot_price);
                if !allowed {
                    return Err(ReserveError::Unavailable(*uuid));
                }
                cut.insert(b.lease);
            }
            gpus.push(*uuid);
        }
        // Preempted leases end when this one starts; one that had not started yet is
        // cancelled outright.
        for preempted in &cut {
            let Some((h, their_gpus)) = self.leases.get(preempted).cloned() else {
                continue;
            };
            for g in their_gpus {
                if let Some(list) = self.bookings.get_mut(&(h, g)) {
                    for b in list.iter_mut().filter(|b| b.lease == *preempted) {
                        b.end = b.end.min(window.0).max(b.start);
                    }
                    let before = list.len();
                    list.retain(|b| b.end > b.start);
                    self.hosts.booked[h as usize] -= (before - list.len()) as u32;
                }
            }
        }
        for uuid in &gpus {
            self.bookings
                .entry((host, *uuid))
                .or_default()
                .push(Booking {
                    lease,
                    start: window.0,
                    end: window.1,
                    spot_price,
                });
        }
        self.hosts.booked[host as usize] += gpus.len() as u32;
        self.leases.insert(lease, (host, gpus));
        Ok(())
    }

    /// `spec.gpus` GPUs of offer `offer` free now for `spec`'s window without preempting
    /// anyone, those in `prefer` first (in its order) and none in `avoid`: where a renter's concurrent
    /// rents, or a host's refusal, send it to another GPU of the same offer rather than
    /// another host. `None` when the offer is unknown, does not take the spec, or has too
    /// few free.
    pub fn allocate_on(
        &self,
        offer: &ContentId,
        spec: &BidSpec,
        now: Timestamp,
        (prefer, avoid): (&[GpuUuid], &[GpuUuid]),
    ) -> Option<Allocation> {
        let entry = self.entry(*self.by_id.get(offer)?)?;
        if !Self::takes(entry, spec) {
            return None;
        }
        let window = spec.window(now.0, 0);
        let mut free = self.free_gpus(entry, spec, window);
        free.retain(|(g, _)| !avoid.contains(&entry.gpus[usize::from(*g)]));
        free.sort_by_key(|(g, _)| {
            let gpu = &entry.gpus[usize::from(*g)];
            prefer.iter().position(|p| p == gpu).unwrap_or(usize::MAX)
        });
        let wanted = usize::from(spec.gpus);
        (free.len() >= wanted).then(|| Self::allocation(entry, spec, window, &free[..wanted]))
    }

    /// Frees the GPUs of a lease (it ended). Returns whether the lease was booked here.
    pub fn release(&mut self, lease: &ContentId) -> bool {
        let Some((host, gpus)) = self.leases.remove(lease) else {
            return false;
        };
        for g in gpus {
            if let Some(list) = self.bookings.get_mut(&(host, g)) {
                let before = list.len();
                list.retain(|b| b.lease != *lease);
                self.hosts.booked[host as usize] -= (before - list.len()) as u32;
                if list.is_empty() {
                    self.bookings.remove(&(host, g));
                }
            }
        }
        true
    }

    /// Every booking as (host, GPU, lease, start, end): for checks and tests.
    pub fn bookings(&self) -> Vec<(PublicKey, GpuUuid, ContentId, Timestamp, Timestamp)> {
        let mut out: Vec<_> = self
            .bookings
            .iter()
            .flat_map(|((host, gpu), list)| {
                let key = self.hosts.keys[*host as usize];
                list.iter()
                    .map(move |b| (key, *gpu, b.lease, Timestamp(b.start), Timestamp(b.end)))
            })
            .collect();
        out.sort_unstable();
        out
    }
}

impl OrderBook {
    /// How many GPUs of `entry` could serve `spec` at `now` (free, or after preemption).
    pub(crate) fn match_one(&self, entry: &Entry, spec: &BidSpec, now: u64) -> Option<usize> {
        let free = self.free_gpus(entry, spec, spec.window(now, 0)).len();
        let n = if free >= usize::from(spec.gpus) || matches!(spec.kind, LeaseKind::Reserved { .. })
        {
            free
        } else {
            self.preemptible_gpus(entry, spec, spec.window(now, self.config.spot_notice_ms))
                .len()
        };
        (n > 0).then_some(n)
    }
}
