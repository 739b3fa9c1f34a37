//! Search: the best offers for a query, in the query's order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Bound;

use gpux_protocol::{
    BoundedString, ComputeCapability, ContentId, EvidenceTier, GpuFamily, Machine, MicroCredits,
    PublicKey, Timestamp,
};

use super::filter::{Facts, allowed_families, bucket_may_pass, clause_holds, price_bounds};
use super::{BucketKey, Entry, IndexKey, OrderBook};
use crate::query::{Clause, OrderKey, Query};

/// One search result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Hit {
    /// The offer id.
    pub offer: ContentId,
    /// The host.
    pub host: PublicKey,
    /// GPU family.
    pub family: GpuFamily,
    /// Memory per GPU, nominal GB.
    pub vram_gb: u16,
    /// The MIG profile when the offer lists slices of GPUs (`1g.10gb`), not whole GPUs.
    pub mig_profile: Option<String>,
    /// What cancelling a reserved window before its start costs (`1h:50%,10m:100%`;
    /// `None`: free).
    pub cancel_fees: Option<String>,
    /// Compute capability.
    pub compute_capability: ComputeCapability,
    /// GPUs in the offer.
    pub gpus: u16,
    /// GPUs free at the time of the search.
    pub free: u16,
    /// Price per GPU-hour.
    pub price_per_gpu_hour: MicroCredits,
    /// Spot floor per GPU-hour, when the offer takes spot leases.
    pub spot_floor_per_gpu_hour: Option<MicroCredits>,
    /// Region.
    pub region: String,
    /// Evidence tier.
    pub tier: EvidenceTier,
    /// This node's reliability score of the host, thousandths.
    pub reliability_permille: u16,
    /// When the offer was made.
    pub created_at: Timestamp,
    /// When it lapses.
    pub expires_at: Timestamp,
    /// The machine, and what of it goes with each GPU.
    pub machine: Machine,
    /// The largest workspace the host gives a lease now, bytes.
    pub disk_bytes: u64,
    /// What the host pulls from registries, and has cached.
    pub pulls: gpux_protocol::Pulls,
}

const TIERS: [EvidenceTier; 3] = EvidenceTier::ALL;

impl OrderBook {
    /// The indices of the buckets a query's clauses allow.
    pub(crate) fn candidate_buckets(&self, clauses: &[Clause]) -> Vec<u32> {
        let keep = |&(_, &b): &(&BucketKey, &u32)| {
            let bucket = &self.buckets[b as usize];
            clauses
                .iter()
                .all(|c| bucket_may_pass(c, bucket, &self.regions))
        };
        match allowed_families(clauses) {
            Some(families) => families
                .into_iter()
                .flat_map(|family| {
                    let lo = BucketKey {
                        family,
                        vram_gb: 0,
                        region: 0,
                        tier: 0,
                    };
                    let hi = BucketKey {
                        family,
                        vram_gb: u16::MAX,
                        region: u32::MAX,
                        tier: u8::MAX,
                    };
                    self.bucket_ids
                        .range(lo..=hi)
                        .filter(keep)
                        .map(|(_, &b)| b)
                        .collect::<Vec<_>>()
                })
                .collect(),
            None => self
                .bucket_ids
                .iter()
                .filter(keep)
                .map(|(_, &b)| b)
                .collect(),
        }
    }

    /// Offers of the candidate buckets in priority order (price, reliability descending,
    /// age) within `[lo, hi]` of the chosen index (price or spot floor), lazily merged.
    pub(crate) fn merged(&self, buckets: &[u32], lo: u64, hi: u64, spot: bool) -> Merge<'_> {
        // Contradictory bounds (`price>=6 price<=2.5`) select nothing; BTreeSet::range would
        // panic on them.
        let buckets = if lo > hi { &[][..] } else { buckets };
        let range = (
            Bound::Included((lo, 0, 0, 0)),
            Bound::Included((hi, u16::MAX, u64::MAX, u32::MAX)),
        );
        let mut iters = Vec::with_capacity(buckets.len());
        let mut heap = BinaryHeap::with_capacity(buckets.len());
        for &b in buckets {
            let bucket = &self.buckets[b as usize];
            let tree = if spot {
                &bucket.by_spot
            } else {
                &bucket.by_price
            };
            let mut it = tree.range(range);
            if let Some(&first) = it.next() {
                heap.push(Reverse((first, iters.len())));
                iters.push(it);
            }
        }
        Merge { iters, heap }
    }

    pub(crate) fn hit(&self, e: &Entry, now: u64) -> Hit {
        Hit {
            offer: e.id,
            host: e.host_key,
            family: e.family,
            vram_gb: e.vram_gb,
            mig_profile: e.mig_profile.as_deref().map(str::to_string),
            cancel_fees: (!e.cancel_fees.is_free()).then(|| e.cancel_fees.to_string()),
            compute_capability: ComputeCapability::new((e.cc / 100) as u8, (e.cc % 100) as u8),
            gpus: e.gpus.len() as u16,
            free: self.free_at(e, now),
            price_per_gpu_hour: MicroCredits(e.price),
            spot_floor_per_gpu_hour: e.spot_floor.map(MicroCredits),
            region: self.regions.name(e.region).to_string(),
            tier: TIERS[usize::from(e.tier).min(2)],
            reliability_permille: self.hosts.reliability(e.host),
            created_at: Timestamp(e.created_at),
            expires_at: Timestamp(e.expires_at),
            machine: Machine {
                cpu_model: BoundedString::new(self.cpu_models.name(e.cpu_model))
                    .unwrap_or_default(),
                cpu_threads: e.cpu_threads,
                memory_bytes: e.machine_memory,
                disk_write_mbps: e.disk_write_mbps,
                net_up_mbps: e.net_up_mbps,
                net_down_mbps: e.net_down_mbps,
                share: e.share,
            },
            disk_bytes: e.disk_bytes,
            pulls: self.offer_pulls(&e.id).unwrap_or_default(),
        }
    }

    /// The best `limit` offers for `query` at `now`, in the query's order (default: price,
    /// then reliability descending, then age). Expired offers are never returned.
    ///
    /// In the default order (and whenever the order starts with ascending price and keeps the
    /// default tie-breaks) the search walks the indexes and stops after `limit` results. Any
    /// other order evaluates every offer in the buckets the clauses allow, then sorts.
    pub fn search(&self, query: &Query, now: Timestamp, limit: usize) -> Vec<Hit> {
        let now = now.0;
        let buckets = self.candidate_buckets(&query.clauses);
        let (lo, hi) = price_bounds(&query.clauses);
        let passes = |e: &Entry| {
            e.expires_at > now && {
                let facts = Facts::new(self, e, now);
                query.clauses.iter().all(|c| clause_holds(c, &facts))
            }
        };
        if query.effective_order() == Query::DEFAULT_ORDER {
            return self
                .merged(&buckets, lo, hi, false)
                .filter_map(|k| self.entry(k.3))
                .filter(|e| passes(e))
                .take(limit)
                .map(|e| self.hit(e, now))
                .collect();
        }
        let mut found: Vec<&Entry> = Vec::new();
        for &b in buckets.iter().filter(|_| lo <= hi) {
            let tree = &self.buckets[b as usize].by_price;
            for k in tree.range((lo, 0, 0, 0)..=(hi, u16::MAX, u64::MAX, u32::MAX)) {
                if let Some(e) = self.entry(k.3).filter(|e| passes(e)) {
                    found.push(e);
                }
            }
        }
        let order = query.effective_order();
        let sort_key = |e: &Entry, key: OrderKey| -> u64 {
            match key {
                OrderKey::Price => e.price,
                OrderKey::Reliability => u64::from(self.hosts.reliability(e.host)),
                OrderKey::Vram => u64::from(e.vram_gb),
                OrderKey::Count => u64::from(self.free_at(e, now)),
                OrderKey::Cc => u64::from(e.cc),
                OrderKey::PcieGen => u64::from(e.pcie_gen),
                OrderKey::Tier => u64::from(e.tier),
                OrderKey::Age => e.created_at,
                OrderKey::Driver => e.driver,
                OrderKey::Cuda => e.cuda,
                OrderKey::Cpu => u64::from(e.share.cpu_millis),
                OrderKey::Ram => e.share.memory_bytes,
                OrderKey::DiskSpeed => u64::from(e.disk_write_mbps),
                OrderKey::InetUp => u64::from(e.net_up_mbps),
                OrderKey::InetDown => u64::from(e.net_down_mbps),
            }
        };
        let compare = |a: &&Entry, b: &&Entry| {
            for o in &order {
                let (x, y) = (sort_key(a, o.key), sort_key(b, o.key));
                let ord = if o.descending { y.cmp(&x) } else { x.cmp(&y) };
                if ord.is_ne() {
                    return ord;
                }
            }
            a.id.cmp(&b.id)
        };
        if found.len() > limit && limit > 0 {
            found.select_nth_unstable_by(limit - 1, compare);
            found.truncate(limit);
        }
        found.sort_by(compare);
        found.truncate(limit);
        found.into_iter().map(|e| self.hit(e, now)).collect()
    }
}

/// A lazy k-way merge of B-tree ranges in key order.
pub(crate) struct Merge<'a> {
    iters: Vec<std::collections::btree_set::Range<'a, IndexKey>>,
    heap: BinaryHeap<Reverse<(IndexKey, usize)>>,
}

impl Iterator for Merge<'_> {
    type Item = IndexKey;

    fn next(&mut self) -> Option<IndexKey> {
        let Reverse((key, i)) = self.heap.pop()?;
        if let Some(&next) = self.iters[i].next() {
            self.heap.push(Reverse((next, i)));
        }
        Some(key)
    }
}
