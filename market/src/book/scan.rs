//! The unindexed baseline: the same compiled query evaluated on every offer, then a partial
//! sort. The benchmark measures the indexes against it, and tests use it as an oracle.

use gpux_protocol::{LeaseKind, Timestamp};

use super::filter::{Facts, clause_holds};
use super::{Allocation, BidSpec, Entry, Hit, OrderBook};
use crate::query::Query;

impl OrderBook {
    fn scan_passing<'a>(
        &'a self,
        query: &'a Query,
        now: u64,
    ) -> impl Iterator<Item = (u32, &'a Entry)> + 'a {
        self.entries.iter().enumerate().filter_map(move |(i, e)| {
            let e = e.as_ref()?;
            let facts = Facts::new(self, e, now);
            (e.expires_at > now && query.clauses.iter().all(|c| clause_holds(c, &facts)))
                .then_some((i as u32, e))
        })
    }

    /// [`OrderBook::search`] in the default order, by evaluating every offer (no index).
    pub fn scan_search(&self, query: &Query, now: Timestamp, limit: usize) -> Vec<Hit> {
        let mut found: Vec<(u64, u16, u64, u32)> = self
            .scan_passing(query, now.0)
            .map(|(i, e)| (e.price, e.rel_inv, e.created_at, i))
            .collect();
        if limit == 0 {
            return Vec::new();
        }
        if found.len() > limit {
            found.select_nth_unstable(limit - 1);
            found.truncate(limit);
        }
        found.sort_unstable();
        found
            .iter()
            .filter_map(|k| self.entry(k.3))
            .map(|e| self.hit(e, now.0))
            .collect()
    }

    /// [`OrderBook::match_bid`] for an on-demand bid on one machine without preemption, by
    /// evaluating every offer (no index) and keeping the best.
    pub fn scan_match_bid(&self, spec: &BidSpec, now: Timestamp) -> Option<Allocation> {
        if !matches!(spec.kind, LeaseKind::OnDemand) {
            return None;
        }
        let window = spec.window(now.0, 0);
        let best = self
            .scan_passing(&spec.query, now.0)
            .filter(|(_, e)| Self::takes(e, spec))
            .filter(|(_, e)| self.free_gpus(e, spec, window).len() >= usize::from(spec.gpus))
            .min_by_key(|(i, e)| (e.price, e.rel_inv, e.created_at, *i))?;
        let free = self.free_gpus(best.1, spec, window);
        Some(Self::allocation(
            best.1,
            spec,
            window,
            &free[..usize::from(spec.gpus)],
        ))
    }
}
