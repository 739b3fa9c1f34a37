//! Gossip budgets per relaying peer, not per signer: identities cost nothing, connections
//! cost a little more. Pure: the caller passes the time.
//!
//! Each peer that relays gossip to this node has two token buckets: messages (20 a second,
//! bursts of 400) and *new signers*, keys this node has not accepted a message from before
//! (1 a second, bursts of 120: 60 a minute). Peers whose connections come from one IP
//! address (other than 127.0.0.1, where a local testnet runs every node) also share a
//! group budget, twice one peer's, so identities crowded on one address are limited as a
//! group. A message over a budget is ignored (not forwarded, not validated further) and
//! raises the peer's *excess*, which halves every minute; the peer's gossipsub application
//! score is minus its excess, so a peer that keeps flooding sinks below the graylist
//! threshold (-80) and is disconnected, while a relay that only forwards what its own
//! budgets let through stays well above it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use libp2p::PeerId;

/// Messages a peer may relay per second, sustained.
pub const MESSAGES_PER_S: f64 = 20.0;
/// Messages a peer may relay in a burst.
pub const MESSAGE_BURST: f64 = 400.0;
/// New signers a peer may bring per second, sustained (60 a minute).
pub const NEW_SIGNERS_PER_S: f64 = 1.0;
/// New signers a peer may bring in a burst.
pub const NEW_SIGNER_BURST: f64 = 120.0;
/// A group of peers on one IP address gets this many times one peer's budget.
pub const IP_GROUP_FACTOR: f64 = 2.0;
/// The excess over a budget halves over this long, ms.
pub const EXCESS_HALF_LIFE_MS: u64 = 60_000;
/// Peers and groups tracked, at most (the least recently seen go first).
const MAX_TRACKED: usize = 4096;

/// A token bucket: `rate` tokens a second, up to `capacity`; times are unix ms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    tokens: f64,
    at: u64,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn full(capacity: f64, now: u64) -> Self {
        Self {
            tokens: capacity,
            at: now,
        }
    }

    /// Takes a token, if there is one.
    pub(crate) fn take(&mut self, rate: f64, capacity: f64, now: u64) -> bool {
        let elapsed = now.saturating_sub(self.at) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate).min(capacity);
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Budget {
    messages: Bucket,
    signers: Bucket,
    excess: f64,
    excess_at: u64,
    seen: u64,
    /// The application score last handed to gossipsub.
    reported: f64,
}

impl Budget {
    fn new(factor: f64, now: u64) -> Self {
        Self {
            messages: Bucket::full(MESSAGE_BURST * factor, now),
            signers: Bucket::full(NEW_SIGNER_BURST * factor, now),
            excess: 0.0,
            excess_at: now,
            seen: now,
            reported: 0.0,
        }
    }

    fn admit(&mut self, new_signer: bool, factor: f64, now: u64) -> Admit {
        self.seen = now;
        if !self
            .messages
            .take(MESSAGES_PER_S * factor, MESSAGE_BURST * factor, now)
        {
            return Admit::OverMessages;
        }
        if new_signer
            && !self
                .signers
                .take(NEW_SIGNERS_PER_S * factor, NEW_SIGNER_BURST * factor, now)
        {
            return Admit::OverNewSigners;
        }
        Admit::Yes
    }

    fn excess(&self, now: u64) -> f64 {
        let idle = now.saturating_sub(self.excess_at) as f64;
        self.excess * 0.5f64.powf(idle / EXCESS_HALF_LIFE_MS as f64)
    }

    fn add_excess(&mut self, now: u64) {
        self.excess = self.excess(now) + 1.0;
        self.excess_at = now.max(self.excess_at);
    }
}

/// Whether a message fits the budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// It fits.
    Yes,
    /// The peer (or its IP group) relays more messages than its budget.
    OverMessages,
    /// The peer (or its IP group) brings more new signers than its budget.
    OverNewSigners,
}

/// The budgets of every relaying peer and IP group.
#[derive(Debug, Default)]
pub struct Budgets {
    peers: BTreeMap<PeerId, Budget>,
    groups: BTreeMap<IpAddr, Budget>,
    ip_of: BTreeMap<PeerId, IpAddr>,
}

impl Budgets {
    /// Notes where a peer's connection comes from (127.0.0.1 and ::1 form no group).
    pub fn connected(&mut self, peer: PeerId, ip: IpAddr) {
        if ip == IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
            || ip == IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        {
            self.ip_of.remove(&peer);
        } else {
            self.ip_of.insert(peer, ip);
        }
        if self.ip_of.len() > MAX_TRACKED
            && let Some(&first) = self.ip_of.keys().next()
        {
            self.ip_of.remove(&first);
        }
    }

    /// Takes one message from `peer`'s budgets (and its group's). Over a budget, the peer's
    /// excess grows.
    pub fn admit(&mut self, peer: PeerId, new_signer: bool, now: u64) -> Admit {
        let own = self
            .peers
            .entry(peer)
            .or_insert_with(|| Budget::new(1.0, now))
            .admit(new_signer, 1.0, now);
        let verdict = match (own, self.ip_of.get(&peer)) {
            (Admit::Yes, Some(ip)) => self
                .groups
                .entry(*ip)
                .or_insert_with(|| Budget::new(IP_GROUP_FACTOR, now))
                .admit(new_signer, IP_GROUP_FACTOR, now),
            (own, _) => own,
        };
        if verdict != Admit::Yes
            && let Some(b) = self.peers.get_mut(&peer)
        {
            b.add_excess(now);
        }
        self.bound();
        verdict
    }

    /// The application score gossipsub is given for `peer`: minus its excess.
    pub fn app_score(&self, peer: &PeerId, now: u64) -> f64 {
        self.peers.get(peer).map_or(0.0, |b| -b.excess(now))
    }

    /// The peer's application score when it has moved by a point or more since it was last
    /// handed to gossipsub (down as a peer overruns, back up as its excess fades), else
    /// None. What it returns counts as handed over.
    pub fn score_update(&mut self, peer: &PeerId, now: u64) -> Option<f64> {
        let b = self.peers.get_mut(peer)?;
        let score = -b.excess(now);
        let score = if score > -0.5 { 0.0 } else { score };
        if (score - b.reported).abs() < 1.0 && !(score == 0.0 && b.reported != 0.0) {
            return None;
        }
        b.reported = score;
        Some(score)
    }

    fn bound(&mut self) {
        trim_oldest(&mut self.peers, MAX_TRACKED, |b| b.seen);
        trim_oldest(&mut self.groups, MAX_TRACKED, |b| b.seen);
    }
}

/// Drops the entries seen longest ago until `map` holds at most `max` (bounded tables
/// of peers and hosts, which anyone can make grow).
pub(crate) fn trim_oldest<K: Ord + Copy, V>(
    map: &mut BTreeMap<K, V>,
    max: usize,
    seen: impl Fn(&V) -> u64,
) {
    while map.len() > max {
        let Some(oldest) = map.iter().min_by_key(|(_, v)| seen(v)).map(|(k, _)| *k) else {
            break;
        };
        map.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flooder_runs_over_and_sinks_while_a_relay_within_budget_does_not() {
        let flooder = PeerId::random();
        let relay = PeerId::random();
        let mut b = Budgets::default();
        let t0 = 1_000_000;
        // 5,000 new keys a minute from one peer: 120 in the burst, then 1 a second.
        let mut admitted = 0;
        for i in 0..5000u64 {
            if b.admit(flooder, true, t0 + i * 12) == Admit::Yes {
                admitted += 1;
            }
        }
        assert!((120..=200).contains(&admitted), "{admitted}");
        let t1 = t0 + 60_000;
        assert!(
            b.app_score(&flooder, t1) < -80.0,
            "{}",
            b.app_score(&flooder, t1)
        );
        // A relay forwarding one new signer a second and 10 known messages a second.
        for s in 0..600u64 {
            assert_eq!(b.admit(relay, true, t0 + s * 1000), Admit::Yes);
            for m in 0..10 {
                assert_eq!(b.admit(relay, false, t0 + s * 1000 + m), Admit::Yes);
            }
        }
        assert_eq!(b.app_score(&relay, t0 + 600_000), 0.0);
        assert_eq!(b.score_update(&relay, t0 + 600_000), None);
        // The flooder's score is handed over as it sinks, and again as it recovers.
        let sunk = b.score_update(&flooder, t1).unwrap();
        assert!(sunk < -80.0);
        assert_eq!(b.score_update(&flooder, t1 + 10), None);
        let recovered = b.score_update(&flooder, t1 + 20 * 60_000).unwrap();
        assert_eq!(recovered, 0.0);
        // The excess fades: a minute halves it.
        let before = b.app_score(&flooder, t1);
        let after = b.app_score(&flooder, t1 + 60_000);
        assert!((after / before - 0.5).abs() < 1e-9, "{before} {after}");
    }

    #[test]
    fn identities_on_one_address_share_a_group_budget_but_loopback_does_not() {
        let mut b = Budgets::default();
        let t0 = 1_000_000;
        let crowd: Vec<PeerId> = (0..10).map(|_| PeerId::random()).collect();
        let ip: IpAddr = "127.0.0.7".parse().unwrap();
        for p in &crowd {
            b.connected(*p, ip);
        }
        // Each alone could bring 120 new signers; together they get 240.
        let mut admitted = 0;
        for p in &crowd {
            for _ in 0..120 {
                if b.admit(*p, true, t0) == Admit::Yes {
                    admitted += 1;
                }
            }
        }
        assert_eq!(admitted, 240);
        // On 127.0.0.1 (a local testnet) every peer has its own budget.
        let mut b = Budgets::default();
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let mut admitted = 0;
        for p in &crowd {
            b.connected(*p, local);
            for _ in 0..120 {
                if b.admit(*p, true, t0) == Admit::Yes {
                    admitted += 1;
                }
            }
        }
        assert_eq!(admitted, 1200);
    }
}
