//! What a renter has learned about reaching hosts: a back-off list with decay, the hosts
//! blocked by hand (`gpux block`), and the local reliability that failures lower. Pure: the
//! caller passes the time.
//!
//! A host that cannot be dialled, does not answer in time, or refuses without a typed reason
//! is backed off for 30 s, doubling with each failure up to an hour; a failure counts half
//! as much for every hour without another, so a host that comes back is tried again. Every
//! such failure is a `HostFailure` in the host's local reputation (and lowers its place in
//! this node's book); a successful probe is an answered uptime probe.

use std::collections::{BTreeMap, BTreeSet};

use gpux_api::Reachability;

use crate::budget::trim_oldest;
use gpux_market::reputation::{HostEvent, Reputation};
use gpux_protocol::{PublicKey, Timestamp};

/// The first back-off, ms.
pub(crate) const BACKOFF_BASE_MS: u64 = 30_000;
/// The longest back-off, ms.
pub(crate) const BACKOFF_MAX_MS: u64 = 3_600_000;
/// A failure's weight halves over this long without another, ms.
const FAILURE_HALF_LIFE_MS: u64 = 3_600_000;
/// Hosts remembered, at most (the least recently seen are forgotten first).
const MAX_REMEMBERED: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Backoff {
    /// Failures, decayed.
    failures: f64,
    /// When the latest failure was.
    last: Timestamp,
    /// Not tried before this.
    until: Timestamp,
}

/// The renter's view of reaching hosts.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    backoff: BTreeMap<PublicKey, Backoff>,
    reached: BTreeMap<PublicKey, Timestamp>,
    blocked: BTreeSet<PublicKey>,
    /// Hosts that served this renter (an acknowledged receipt): a rent tries them early.
    served: BTreeSet<PublicKey>,
    reputation: Reputation,
}

impl Reach {
    /// With the hosts blocked by hand, and those that served this renter.
    pub(crate) fn new(
        blocked: impl IntoIterator<Item = PublicKey>,
        served: impl IntoIterator<Item = PublicKey>,
    ) -> Self {
        let mut reach = Self {
            blocked: blocked.into_iter().collect(),
            served: served.into_iter().collect(),
            ..Self::default()
        };
        while reach.served.len() > MAX_REMEMBERED {
            reach.served.pop_first();
        }
        reach
    }

    /// A lease of `host` had an acknowledged receipt.
    pub(crate) fn served(&mut self, host: PublicKey) {
        if self.served.len() < MAX_REMEMBERED {
            self.served.insert(host);
        }
    }

    /// How many hosts have served this renter.
    pub(crate) fn served_count(&self) -> usize {
        self.served.len()
    }

    /// Whether `host` has served this renter.
    pub(crate) fn has_served(&self, host: &PublicKey) -> bool {
        self.served.contains(host)
    }

    /// Whether a rent should skip this host now.
    pub(crate) fn skip(&self, host: &PublicKey, now: Timestamp) -> bool {
        self.blocked.contains(host) || self.backoff.get(host).is_some_and(|b| b.until > now)
    }

    /// What the market view shows about a host.
    pub(crate) fn state(&self, host: &PublicKey, now: Timestamp) -> Reachability {
        if self.blocked.contains(host) {
            Reachability::Blocked
        } else if self.backoff.get(host).is_some_and(|b| b.until > now) {
            Reachability::Unreachable
        } else if self.reached.contains_key(host) {
            Reachability::Reachable
        } else {
            Reachability::Unknown
        }
    }

    /// The host answered (a probe connected, or it answered a request). Returns its local
    /// reliability now.
    pub(crate) fn reached(&mut self, host: PublicKey, now: Timestamp) -> u16 {
        self.backoff.remove(&host);
        self.reached.insert(host, now);
        self.bound();
        self.reputation
            .record(host, HostEvent::Uptime { online: true }, now);
        self.reputation.score(&host, now)
    }

    /// The host could not be dialled, timed out, or refused without a typed reason: backed
    /// off. Returns its local reliability now.
    pub(crate) fn failed(&mut self, host: PublicKey, now: Timestamp) -> u16 {
        let failures = match self.backoff.get(&host) {
            Some(b) => {
                let idle = now.ms_since(b.last) as f64;
                b.failures * 0.5f64.powf(idle / FAILURE_HALF_LIFE_MS as f64) + 1.0
            }
            None => 1.0,
        };
        let wait = (BACKOFF_BASE_MS as f64 * 2f64.powf(failures - 1.0)).min(BACKOFF_MAX_MS as f64);
        self.backoff.insert(
            host,
            Backoff {
                failures,
                last: now,
                until: now.plus_ms(wait as u64),
            },
        );
        self.reached.remove(&host);
        self.bound();
        self.reputation.record(host, HostEvent::HostFailure, now);
        self.reputation.score(&host, now)
    }

    /// The ledger's history of `host` (who paid it, and how its leases ended): weighed into
    /// its reliability, which is returned, and its interruption rate.
    pub(crate) fn ledger_history(
        &mut self,
        host: PublicKey,
        history: &gpux_protocol::ledger_wire::HostHistory,
        ends: &gpux_protocol::ledger_wire::HostEnds,
        challenged: usize,
        now: Timestamp,
    ) -> u16 {
        self.reputation.set_ledger_history(host, history);
        self.reputation.set_ledger_ends(host, ends);
        self.reputation.set_challenged(host, challenged);
        self.reputation.score(&host, now)
    }

    /// A spot lease with `host` ended, preempted or not (its interruption rate).
    pub(crate) fn spot_ended(&mut self, host: PublicKey, preempted: bool, now: Timestamp) {
        self.reputation
            .record(host, HostEvent::SpotEnded { preempted }, now);
    }

    /// The host's interruption rate as this node saw it, thousandths.
    pub(crate) fn interruption(&self, host: &PublicKey, now: Timestamp) -> Option<u16> {
        self.reputation.interruption(host, now)
    }

    /// Blocks or unblocks a host by hand. Returns whether anything changed.
    pub(crate) fn set_blocked(&mut self, host: PublicKey, blocked: bool) -> bool {
        if blocked {
            self.blocked.insert(host)
        } else {
            self.blocked.remove(&host)
        }
    }

    /// The hosts blocked by hand.
    pub(crate) fn blocked(&self) -> impl Iterator<Item = &PublicKey> {
        self.blocked.iter()
    }

    fn bound(&mut self) {
        trim_oldest(&mut self.backoff, MAX_REMEMBERED, |b| b.last.0);
        trim_oldest(&mut self.reached, MAX_REMEMBERED, |t| t.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_doubling_decay_and_a_block_lasts() {
        let host = gpux_protocol::Keypair::from_seed(&[1; 32]).public();
        let t0 = Timestamp(1_000_000);
        let mut reach = Reach::new([], []);
        assert_eq!(reach.state(&host, t0), Reachability::Unknown);
        let fresh = reach.reputation.score(&host, t0);
        let score = reach.failed(host, t0);
        assert!(score < fresh, "{score} < {fresh}");
        assert!(reach.skip(&host, t0.plus_ms(29_000)));
        assert!(!reach.skip(&host, t0.plus_ms(30_001)));
        assert_eq!(reach.state(&host, t0), Reachability::Unreachable);
        // A second failure right after: 60 s.
        reach.failed(host, t0.plus_ms(31_000));
        assert!(reach.skip(&host, t0.plus_ms(31_000 + 59_000)));
        assert!(!reach.skip(&host, t0.plus_ms(31_000 + 61_000)));
        // Many failures: capped at an hour.
        for i in 0..20 {
            reach.failed(host, t0.plus_ms(100_000 + i));
        }
        assert!(reach.skip(&host, t0.plus_ms(100_000 + 3_599_000)));
        assert!(!reach.skip(&host, t0.plus_ms(100_020 + BACKOFF_MAX_MS + 1)));
        // Answering clears it.
        reach.reached(host, t0.plus_ms(5_000_000));
        assert!(!reach.skip(&host, t0.plus_ms(5_000_000)));
        assert_eq!(
            reach.state(&host, t0.plus_ms(5_000_000)),
            Reachability::Reachable
        );
        // After a quiet day one failure backs off for about the base again.
        reach.failed(host, t0.plus_ms(5_000_000));
        reach.reached(host, t0.plus_ms(5_000_001));
        reach.failed(host, t0.plus_ms(5_000_000 + 86_400_000));
        assert!(!reach.skip(&host, t0.plus_ms(5_000_000 + 86_400_000 + 31_000)));
        // A block holds until lifted.
        assert!(reach.set_blocked(host, true));
        assert!(reach.skip(&host, t0.plus_ms(999_999_999)));
        assert_eq!(reach.state(&host, t0), Reachability::Blocked);
        assert!(reach.set_blocked(host, false));
        assert!(!reach.skip(&host, t0.plus_ms(999_999_999)));
    }
}
