//! The order book: verified offers, indexed so that search and matching never scan it whole.
//!
//! Offers live in a slab. Each is filed in one *bucket* per (GPU family, nominal VRAM,
//! region, evidence tier); a bucket keeps its offers in a B-tree ordered by price, then host
//! reliability (descending), then age, and a second B-tree of the offers that take spot leases,
//! ordered by spot floor. A query first keeps the buckets its clauses allow (only the
//! families it names, when it names some), then merges those buckets' trees in price order
//! from its price bound, checking each offer's remaining clauses, and stops at the first
//! results it needs.
//!
//! The book is **bounded** ([`BookConfig`]): at most `max_offers` offers (10,000 by default)
//! and `max_offers_per_host` slots per host (16). When it is full, a new offer evicts the
//! offer that stands lowest (evidence tier, then this node's reliability of its host, then
//! age) if the newcomer stands higher, and is refused otherwise. Hosts with a settled-lease
//! record (a reliability above the default) and better evidence therefore keep their place
//! against any number of fresh identities, while unreachable hosts (reliability below it)
//! go first.
//!
//! The book is pure: no clock, no I/O. Time comes in as `now` (unix milliseconds).

mod bids;
mod filter;
mod matching;
mod scan;
mod search;
mod terms;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpux_protocol::{
    ContentId, GpuFamily, GpuUuid, ImageDigest, Offer, OfferWithdrawal, PublicKey, Share,
    Timestamp, Verified,
};

pub use bids::BidError;
pub use matching::{Allocation, BidSpec, MatchError, ReserveError};
pub use search::Hit;

use crate::query::{cc_key, tier_key, version_key};

/// Tuning of the book.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookConfig {
    /// How long a preempted spot lease keeps running after notice, ms. Default 2 minutes.
    pub spot_notice_ms: u64,
    /// Offers the book holds at most. Default 10,000. When full, a new offer evicts the one
    /// that stands lowest if it stands higher itself, and is refused otherwise.
    pub max_offers: usize,
    /// Offers (slots) one host may have in the book. Default 16.
    pub max_offers_per_host: usize,
    /// Standing bids the book holds at most. Default 100,000. When full, a new bid takes the
    /// place of the one paying least if it pays more, and is refused otherwise. (A renter
    /// has at most `MAX_BID_SLOTS` at once, but identities are free: this bounds them all.)
    pub max_bids: usize,
}

impl Default for BookConfig {
    fn default() -> Self {
        Self {
            spot_notice_ms: 120_000,
            max_offers: 10_000,
            max_offers_per_host: 16,
            max_bids: 100_000,
        }
    }
}

/// Why an offer was not inserted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InsertError {
    /// The offer has expired.
    #[error("the offer expired at {0}")]
    Expired(Timestamp),
    /// The book already holds this exact offer.
    #[error("the offer is already in the book")]
    Duplicate,
    /// The host's slot already has an offer with this or a higher seq.
    #[error("seq {seq} is not newer than {newest} for this host and slot")]
    Replay {
        /// The offer's seq.
        seq: u64,
        /// The newest seq seen for the host's slot.
        newest: u64,
    },
    /// The offer's GPUs are not all of one model (family, memory, compute capability).
    #[error("the offer mixes GPU models; publish one offer (slot) per model")]
    MixedGpus,
    /// The host already has as many offers in the book as one host may.
    #[error("the host already has {0} offers in the book")]
    HostFull(usize),
    /// The book is full and every offer in it stands at least as high as this one.
    #[error("the book is full ({0} offers) and this offer stands no higher than any in it")]
    Full(usize),
}

/// Why a withdrawal was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WithdrawError {
    /// No such offer in the book.
    #[error("unknown offer")]
    UnknownOffer,
    /// Signed by someone other than the offer's host.
    #[error("the withdrawal is not signed by the offer's host")]
    NotTheHost,
    /// Its seq is not above the offer's.
    #[error("withdrawal seq {seq} is not newer than the offer's {offer_seq}")]
    Replay {
        /// The withdrawal's seq.
        seq: u64,
        /// The offer's seq.
        offer_seq: u64,
    },
}

/// What an insert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// A new offer.
    New,
    /// It replaced the host's previous offer in the same slot.
    Replaced(ContentId),
    /// A new offer, for which the book (full) evicted the offer that stood lowest.
    Evicted(ContentId),
}

/// A GPU booked for a lease over `[start, end)`. Bookings belong to the host's GPU (by UUID),
/// not to an offer: they survive the offer's replacement, withdrawal or expiry, and follow the
/// GPU if the host lists it in another slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Booking {
    pub(crate) lease: ContentId,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// `Some(price)` for a spot lease: it may be preempted by an on-demand lease or a higher
    /// spot bid.
    pub(crate) spot_price: Option<u64>,
}

/// One offer as the book keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) id: ContentId,
    pub(crate) host: u32,
    pub(crate) host_key: PublicKey,
    pub(crate) slot: u16,
    pub(crate) seq: u64,
    pub(crate) created_at: u64,
    pub(crate) expires_at: u64,
    pub(crate) bucket: u32,
    pub(crate) rel_inv: u16,
    pub(crate) family: GpuFamily,
    pub(crate) vram_gb: u16,
    pub(crate) cc: u16,
    pub(crate) pcie_gen: u8,
    pub(crate) tier: u8,
    pub(crate) region: u32,
    pub(crate) price: u64,
    pub(crate) spot_floor: Option<u64>,
    pub(crate) min_duration_s: u32,
    pub(crate) max_duration_s: u32,
    pub(crate) driver: u64,
    pub(crate) cuda: u64,
    pub(crate) images: Box<[ImageDigest]>,
    pub(crate) gpus: Box<[GpuUuid]>,
    /// The largest workspace the host gives a lease now, bytes.
    pub(crate) disk_bytes: u64,
    /// What a kept workspace costs per GiB-hour, micro-credits.
    pub(crate) disk_price: u64,
    /// The longest the host keeps a workspace after its lease, seconds, if it says.
    pub(crate) max_retain_s: Option<u64>,
    /// The largest renter image the host stages, bytes.
    pub(crate) stage_bytes: u64,
    /// The tags the host lists, with their images.
    pub(crate) tags: Box<[(ImageDigest, Box<str>)]>,
    /// Windows the host has booked ahead on the offer's GPUs: (GPU index, start, end), ms.
    pub(crate) booked: Box<[(u8, u64, u64)]>,
    /// The MIG profile, when the offer lists MIG instances.
    pub(crate) mig_profile: Option<Box<str>>,
    /// The host's cancellation fee schedule for reserved windows (empty: free).
    pub(crate) cancel_fees: gpux_protocol::CancelFees,
    /// What of the machine goes with each GPU.
    pub(crate) share: Share,
    /// The machine's CPU model (interned), threads and memory given to leases.
    pub(crate) cpu_model: u32,
    pub(crate) cpu_threads: u16,
    pub(crate) machine_memory: u64,
    /// Measured: the workspace disk's write speed (MB/s), bandwidth (Mbit/s).
    pub(crate) disk_write_mbps: u32,
    pub(crate) net_up_mbps: u32,
    pub(crate) net_down_mbps: u32,
    /// The largest image the host pulls from a registry, bytes (0: none), the longest a
    /// pull may take, and the registries it names.
    pub(crate) pull_bytes: u64,
    pub(crate) pull_timeout_s: u32,
    pub(crate) pull_registries: Box<[Box<str>]>,
    /// The images in its pull cache (interned).
    pub(crate) cached: Box<[u32]>,
}

impl Entry {
    fn price_key(&self, idx: u32) -> IndexKey {
        (self.price, self.rel_inv, self.created_at, idx)
    }

    fn spot_key(&self, idx: u32) -> Option<IndexKey> {
        self.spot_floor
            .map(|floor| (floor, self.rel_inv, self.created_at, idx))
    }

    /// How the offer stands when the book is full: evidence tier, then the host's
    /// reliability here (settled leases raise it; unreachable hosts and failures lower it),
    /// then how recent it is. The lowest is evicted first.
    fn standing(&self, idx: u32) -> (u8, u16, u64, u32) {
        (self.tier, 1000 - self.rel_inv, self.created_at, idx)
    }
}

/// (price, 1000 - reliability, created_at, slab index): the book's priority order.
pub(crate) type IndexKey = (u64, u16, u64, u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BucketKey {
    pub(crate) family: GpuFamily,
    pub(crate) vram_gb: u16,
    pub(crate) region: u32,
    pub(crate) tier: u8,
}

#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub(crate) key: BucketKey,
    pub(crate) by_price: BTreeSet<IndexKey>,
    pub(crate) by_spot: BTreeSet<IndexKey>,
}

/// Interned region names, reference-counted so that a name no offer uses any more is
/// forgotten (a host cycling through made-up regions cannot grow the table).
#[derive(Debug, Clone, Default)]
pub(crate) struct Interner {
    names: Vec<String>,
    refs: Vec<u32>,
    ids: HashMap<String, u32>,
    vacant: Vec<u32>,
}

impl Interner {
    fn intern(&mut self, name: &str) -> u32 {
        let id = match self.ids.get(name) {
            Some(&id) => id,
            None => {
                let id = match self.vacant.pop() {
                    Some(id) => {
                        self.names[id as usize] = name.to_string();
                        id
                    }
                    None => {
                        self.names.push(name.to_string());
                        self.refs.push(0);
                        (self.names.len() - 1) as u32
                    }
                };
                self.ids.insert(name.to_string(), id);
                id
            }
        };
        self.refs[id as usize] += 1;
        id
    }

    fn release(&mut self, id: u32) {
        let Some(refs) = self.refs.get_mut(id as usize) else {
            return;
        };
        *refs = refs.saturating_sub(1);
        if *refs == 0 {
            let name = std::mem::take(&mut self.names[id as usize]);
            self.ids.remove(&name);
            self.vacant.push(id);
        }
    }

    pub(crate) fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }
}

/// Hosts seen, with this node's reliability score of each (thousandths).
#[derive(Debug, Clone, Default)]
pub(crate) struct Hosts {
    keys: Vec<PublicKey>,
    by_key: HashMap<PublicKey, u32>,
    reliability: Vec<u16>,
    offers: Vec<Vec<u32>>,
    /// Booking records per host, so that a host with none skips every lookup.
    booked: Vec<u32>,
}

/// Reliability of a host nobody has observed yet, in thousandths.
pub const DEFAULT_RELIABILITY: u16 = 500;

impl Hosts {
    fn get_or_insert(&mut self, key: PublicKey) -> u32 {
        if let Some(&h) = self.by_key.get(&key) {
            return h;
        }
        let h = self.keys.len() as u32;
        self.keys.push(key);
        self.by_key.insert(key, h);
        self.reliability.push(DEFAULT_RELIABILITY);
        self.offers.push(Vec::new());
        self.booked.push(0);
        h
    }

    pub(crate) fn reliability(&self, host: u32) -> u16 {
        self.reliability
            .get(host as usize)
            .copied()
            .unwrap_or(DEFAULT_RELIABILITY)
    }
}

/// The order book. See the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct OrderBook {
    config: BookConfig,
    entries: Vec<Option<Entry>>,
    vacant: Vec<u32>,
    by_id: HashMap<ContentId, u32>,
    by_slot: HashMap<(u32, u16), u32>,
    newest_seq: HashMap<(u32, u16), u64>,
    hosts: Hosts,
    regions: Interner,
    /// CPU model names, interned as regions are (few models, many offers).
    cpu_models: Interner,
    /// Cached image references, interned (many hosts cache the same popular images).
    images: Interner,
    buckets: Vec<Bucket>,
    bucket_ids: BTreeMap<BucketKey, u32>,
    expiry: BTreeSet<(u64, u32)>,
    /// Every offer by how it stands (evicted lowest first): (evidence tier, this node's
    /// reliability of the host, created_at, index).
    standing: BTreeSet<(u8, u16, u64, u32)>,
    bookings: HashMap<(u32, GpuUuid), Vec<Booking>>,
    leases: HashMap<ContentId, (u32, Vec<GpuUuid>)>,
    bids: bids::Bids,
}

impl OrderBook {
    /// An empty book.
    pub fn new(config: BookConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Offers in the book.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Offers in the book by GPU family key (for metrics: a few dozen families at most).
    pub fn count_by_family(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for e in self.entries.iter().flatten() {
            *counts.entry(e.family.key()).or_insert(0) += 1;
        }
        counts
    }

    /// True when the book holds no offer.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Whether the book holds this offer.
    pub fn contains(&self, offer: &ContentId) -> bool {
        self.by_id.contains_key(offer)
    }

    pub(crate) fn entry(&self, idx: u32) -> Option<&Entry> {
        self.entries.get(idx as usize).and_then(Option::as_ref)
    }

    /// Inserts a verified offer, replacing the host's previous offer in the same slot when
    /// its seq is higher. Leases on GPUs that the new offer still lists carry over.
    pub fn insert(
        &mut self,
        offer: &Verified<Offer>,
        now: Timestamp,
    ) -> Result<Inserted, InsertError> {
        if offer.expires_at <= now {
            return Err(InsertError::Expired(offer.expires_at));
        }
        if self.by_id.contains_key(&offer.id()) {
            return Err(InsertError::Duplicate);
        }
        let first = offer.gpus.first().ok_or(InsertError::MixedGpus)?;
        if offer.gpus.iter().any(|g| {
            g.family != first.family
                || g.memory_bytes != first.memory_bytes
                || g.compute_capability != first.compute_capability
        }) {
            return Err(InsertError::MixedGpus);
        }
        let host = self.hosts.get_or_insert(offer.signer());
        if let Some(&newest) = self.newest_seq.get(&(host, offer.slot))
            && offer.seq <= newest
        {
            return Err(InsertError::Replay {
                seq: offer.seq,
                newest,
            });
        }
        // The bounds, for an offer that adds a slot (a replacement does not grow the book).
        let mut evict = None;
        if !self.by_slot.contains_key(&(host, offer.slot)) {
            let held = self.hosts.offers.get(host as usize).map_or(0, Vec::len);
            if held >= self.config.max_offers_per_host {
                return Err(InsertError::HostFull(held));
            }
            if self.len() >= self.config.max_offers {
                let newcomer = (
                    tier_key(offer.tier) as u8,
                    self.hosts.reliability(host).min(1000),
                    offer.created_at.0,
                );
                match self.standing.first() {
                    Some(&(t, r, c, idx)) if (t, r, c) < newcomer => evict = Some(idx),
                    _ => return Err(InsertError::Full(self.len())),
                }
            }
        }
        self.newest_seq.insert((host, offer.slot), offer.seq);

        let family = GpuFamily::lookup(&first.family).unwrap_or(GpuFamily::Other);
        let region = self.regions.intern(&offer.region);
        let mut entry = Entry {
            id: offer.id(),
            host,
            host_key: offer.signer(),
            slot: offer.slot,
            seq: offer.seq,
            created_at: offer.created_at.0,
            expires_at: offer.expires_at.0,
            bucket: 0,
            rel_inv: 1000 - self.hosts.reliability(host).min(1000),
            family,
            // A slice's memory as its profile names it (`1g.10gb`: 10), a GPU's as the maker
            // prints it.
            vram_gb: offer
                .mig_profile()
                .and_then(gpux_protocol::mig_profile_gb)
                .unwrap_or_else(|| family.nominal_vram_gb(first.memory_bytes)),
            cc: cc_key(first.compute_capability) as u16,
            pcie_gen: first.pcie_gen,
            tier: tier_key(offer.tier) as u8,
            region,
            price: offer.price_per_gpu_hour.0,
            spot_floor: offer.spot_floor_per_gpu_hour.map(|m| m.0),
            min_duration_s: offer.min_duration_s,
            max_duration_s: offer.max_duration_s,
            driver: version_key(offer.driver),
            cuda: version_key(offer.cuda),
            images: offer.images.to_vec().into_boxed_slice(),
            gpus: offer.gpus.iter().map(|g| g.uuid).collect(),
            disk_bytes: offer.workspace_bytes(),
            disk_price: offer.workspace_price().0,
            max_retain_s: offer.max_retain_s(),
            stage_bytes: offer.max_image_bytes(),
            tags: offer
                .image_tags()
                .into_iter()
                .map(|(d, t)| (d, t.into_boxed_str()))
                .collect(),
            // (Checked when the offer was verified.)
            booked: offer
                .booked()
                .unwrap_or_default()
                .into_iter()
                .map(|(g, s, e)| (g, s.0, e.0))
                .collect(),
            mig_profile: offer.mig_profile().map(Into::into),
            // (Checked when the offer was verified.)
            cancel_fees: offer.cancel_fees().unwrap_or_default(),
            share: offer.machine.share,
            cpu_model: self.cpu_models.intern(&offer.machine.cpu_model),
            cpu_threads: offer.machine.cpu_threads,
            machine_memory: offer.machine.memory_bytes,
            disk_write_mbps: offer.machine.disk_write_mbps,
            net_up_mbps: offer.machine.net_up_mbps,
            net_down_mbps: offer.machine.net_down_mbps,
            pull_bytes: offer.pulls.max_bytes,
            pull_timeout_s: offer.pulls.timeout_s,
            pull_registries: offer
                .pulls
                .registries
                .iter()
                .map(|r| r.as_str().into())
                .collect(),
            cached: offer
                .pulls
                .cached
                .iter()
                .map(|r| self.images.intern(r))
                .collect(),
        };
        let key = BucketKey {
            family,
            vram_gb: entry.vram_gb,
            region,
            tier: entry.tier,
        };
        entry.bucket = self.bucket_for(key);

        let outcome = match (self.by_slot.get(&(host, offer.slot)).copied(), evict) {
            (Some(old), _) => {
                Inserted::Replaced(self.remove_at(old).map_or(ContentId([0; 32]), |e| e.id))
            }
            (None, Some(lowest)) => {
                Inserted::Evicted(self.remove_at(lowest).map_or(ContentId([0; 32]), |e| e.id))
            }
            (None, None) => Inserted::New,
        };
        self.place(entry);
        Ok(outcome)
    }

    fn bucket_for(&mut self, key: BucketKey) -> u32 {
        if let Some(&b) = self.bucket_ids.get(&key) {
            return b;
        }
        let b = self.buckets.len() as u32;
        self.buckets.push(Bucket {
            key,
            by_price: BTreeSet::new(),
            by_spot: BTreeSet::new(),
        });
        self.bucket_ids.insert(key, b);
        b
    }

    fn place(&mut self, entry: Entry) {
        let idx = match self.vacant.pop() {
            Some(i) => i,
            None => {
                self.entries.push(None);
                (self.entries.len() - 1) as u32
            }
        };
        let bucket = &mut self.buckets[entry.bucket as usize];
        bucket.by_price.insert(entry.price_key(idx));
        if let Some(k) = entry.spot_key(idx) {
            bucket.by_spot.insert(k);
        }
        self.expiry.insert((entry.expires_at, idx));
        self.standing.insert(entry.standing(idx));
        self.by_id.insert(entry.id, idx);
        self.by_slot.insert((entry.host, entry.slot), idx);
        if let Some(list) = self.hosts.offers.get_mut(entry.host as usize) {
            list.push(idx);
        }
        self.entries[idx as usize] = Some(entry);
    }

    fn remove_at(&mut self, idx: u32) -> Option<Entry> {
        let entry = self.entries.get_mut(idx as usize)?.take()?;
        let bucket = &mut self.buckets[entry.bucket as usize];
        bucket.by_price.remove(&entry.price_key(idx));
        if let Some(k) = entry.spot_key(idx) {
            bucket.by_spot.remove(&k);
        }
        self.expiry.remove(&(entry.expires_at, idx));
        self.standing.remove(&entry.standing(idx));
        self.by_id.remove(&entry.id);
        if self.by_slot.get(&(entry.host, entry.slot)) == Some(&idx) {
            self.by_slot.remove(&(entry.host, entry.slot));
        }
        if let Some(list) = self.hosts.offers.get_mut(entry.host as usize) {
            list.retain(|&i| i != idx);
        }
        self.regions.release(entry.region);
        self.cpu_models.release(entry.cpu_model);
        for &image in entry.cached.iter() {
            self.images.release(image);
        }
        self.vacant.push(idx);
        Some(entry)
    }

    /// Removes an offer (for example when its host is gone). Returns whether it was there.
    pub fn remove(&mut self, offer: &ContentId) -> bool {
        match self.by_id.get(offer).copied() {
            Some(idx) => self.remove_at(idx).is_some(),
            None => false,
        }
    }

    /// Applies a host's withdrawal of one of its offers.
    pub fn withdraw(
        &mut self,
        withdrawal: &Verified<OfferWithdrawal>,
    ) -> Result<(), WithdrawError> {
        let idx = *self
            .by_id
            .get(&withdrawal.offer)
            .ok_or(WithdrawError::UnknownOffer)?;
        let entry = self.entry(idx).ok_or(WithdrawError::UnknownOffer)?;
        if entry.host_key != withdrawal.signer() {
            return Err(WithdrawError::NotTheHost);
        }
        if withdrawal.seq <= entry.seq {
            return Err(WithdrawError::Replay {
                seq: withdrawal.seq,
                offer_seq: entry.seq,
            });
        }
        let key = (entry.host, entry.slot);
        self.newest_seq.insert(key, withdrawal.seq);
        self.remove_at(idx);
        Ok(())
    }

    /// Removes every offer and standing bid that has expired at `now`; returns the offers
    /// removed.
    pub fn expire(&mut self, now: Timestamp) -> Vec<ContentId> {
        let mut gone = Vec::new();
        while let Some(&(at, idx)) = self.expiry.first() {
            if at > now.0 {
                break;
            }
            if let Some(entry) = self.remove_at(idx) {
                gone.push(entry.id);
            } else {
                self.expiry.pop_first();
            }
        }
        self.bids.expire(now.0);
        self.sweep_bookings(now.0);
        gone
    }

    /// Forgets bookings whose window has ended (their leases are over).
    fn sweep_bookings(&mut self, now: u64) {
        let hosts = &mut self.hosts;
        self.bookings.retain(|(host, _), list| {
            let before = list.len();
            list.retain(|b| b.end > now);
            if let Some(n) = hosts.booked.get_mut(*host as usize) {
                *n -= (before - list.len()) as u32;
            }
            !list.is_empty()
        });
        let bookings = &self.bookings;
        self.leases.retain(|lease, (host, gpus)| {
            gpus.iter().any(|g| {
                bookings
                    .get(&(*host, *g))
                    .is_some_and(|l| l.iter().any(|b| b.lease == *lease))
            })
        });
    }

    /// The bookings of one of a host's GPUs.
    pub(crate) fn gpu_bookings(&self, host: u32, gpu: &GpuUuid) -> &[Booking] {
        if self.hosts.booked.get(host as usize).is_none_or(|&n| n == 0) {
            return &[];
        }
        self.bookings.get(&(host, *gpu)).map_or(&[], Vec::as_slice)
    }

    /// GPUs of an offer with no booking covering `now`.
    pub(crate) fn free_at(&self, entry: &Entry, now: u64) -> u16 {
        if self
            .hosts
            .booked
            .get(entry.host as usize)
            .is_none_or(|&n| n == 0)
        {
            return entry.gpus.len() as u16;
        }
        entry
            .gpus
            .iter()
            .filter(|g| {
                !self
                    .gpu_bookings(entry.host, g)
                    .iter()
                    .any(|b| b.start <= now && now < b.end)
            })
            .count() as u16
    }

    /// The hosts with an offer in the book now, in key order.
    pub fn hosts_offering(&self) -> Vec<PublicKey> {
        let mut hosts: Vec<PublicKey> = self
            .hosts
            .keys
            .iter()
            .zip(&self.hosts.offers)
            .filter(|(_, offers)| !offers.is_empty())
            .map(|(k, _)| *k)
            .collect();
        hosts.sort();
        hosts
    }

    /// Sets this node's reliability score of a host (0..=1000 thousandths), re-filing its
    /// offers in priority order.
    pub fn set_reliability(&mut self, host: PublicKey, permille: u16) {
        let permille = permille.min(1000);
        let h = self.hosts.get_or_insert(host);
        self.hosts.reliability[h as usize] = permille;
        for &idx in &self.hosts.offers[h as usize] {
            let Some(entry) = self.entries.get_mut(idx as usize).and_then(Option::as_mut) else {
                continue;
            };
            let bucket = &mut self.buckets[entry.bucket as usize];
            bucket.by_price.remove(&entry.price_key(idx));
            if let Some(k) = entry.spot_key(idx) {
                bucket.by_spot.remove(&k);
            }
            self.standing.remove(&entry.standing(idx));
            entry.rel_inv = 1000 - permille;
            self.standing.insert(entry.standing(idx));
            bucket.by_price.insert(entry.price_key(idx));
            if let Some(k) = entry.spot_key(idx) {
                bucket.by_spot.insert(k);
            }
        }
    }

    /// This node's reliability score of a host, thousandths.
    pub fn reliability(&self, host: &PublicKey) -> u16 {
        self.hosts
            .by_key
            .get(host)
            .map_or(DEFAULT_RELIABILITY, |&h| self.hosts.reliability(h))
    }
}
