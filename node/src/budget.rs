//! Gossip budgets per relaying peer, not per signer: identities cost nothing, connections
//! cost a little more. Pure: the caller passes the time.
//!
//! Each peer that relays gossip to this node has two token buckets: messages (20 a second,
//! bursts of 400) and *new signers*, keys this node has not accepted a message from before
//! (1 a second, bursts of 120: 60 a minute). Peers whose connections come from one IP
//! address (other than 127.0.0.1, where a local testnet runs every node) also share a
//! group budget, twice one peer's, so identities crowded on one address are limited as a
//! group. A message over a budget is ignored (not forwarded, not validated further); one
//! over the message budget also raises the peer's *excess*, which halves every minute. The
//! peer's gossipsub application score is minus its excess, so a peer that keeps flooding
//! sinks below the graylist threshold (-80) and is disconnected, while a relay that only
//! forwards what its own budgets let through stays well above it. Going over the
//! new-signer budget costs no excess: a relay flooded by fresh identities one after another
//! passes on a budget's worth from each, and must not be cut off for it.
//!
//! What a budget lets through can still be a burst: a relay passing on a flood brings up to
//! 120 fresh keys at once, then 60 a minute. [`Bursts`] marks the signers a relaying peer
//! brings more than 16 a minute of (or all peers together more than 32); a rent tries
//! marked hosts last.

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

    /// Takes one message from `peer`'s budgets (and its group's). Over the message budget,
    /// the peer's excess grows; over the new-signer budget the message is only ignored: an
    /// honest relay passes on what each of its peers' budgets let through, so floods from
    /// fresh identities one after another (each with a whole budget of its own there) bring
    /// it over its budget here, and it must not be cut off for that.
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
        if verdict == Admit::OverMessages
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

/// New signers a relaying peer may bring within [`BURST_WINDOW_MS`] before they count as a
/// burst (a relay that brings more is passing on a flood, or the whole market at once).
pub const BURST_SIGNERS: usize = 16;
/// The window [`BURST_SIGNERS`] is counted over, ms.
pub const BURST_WINDOW_MS: u64 = 60_000;
/// How long a signer that came in a burst stays marked, ms.
pub const BURST_MARK_MS: u64 = 600_000;
/// Signers marked at most (the oldest marks go first).
const MAX_MARKED: usize = 20_000;

/// Which signers came in a burst of new signers from one relaying peer. A rent tries
/// them last: a flood of fresh keys, however cheap their offers, cannot push the hosts a
/// renter already knew out of its first round. Pure: the caller passes the time.
#[derive(Debug, Default)]
pub struct Bursts {
    peers: BTreeMap<PeerId, Arrivals>,
    /// From all peers together: a flood split over several relaying peers (each passing on
    /// a share under the threshold) is a burst too.
    all: Arrivals,
    /// Signers marked, with when.
    marked: BTreeMap<gpux_protocol::PublicKey, u64>,
}

/// New signers from all peers within [`BURST_WINDOW_MS`] that make a burst, however they
/// are split between relaying peers.
pub const BURST_SIGNERS_ALL: usize = 2 * BURST_SIGNERS;

/// The new signers one relaying peer (or all of them) brought lately.
#[derive(Debug, Default)]
struct Arrivals {
    /// In the last window, oldest first.
    window: std::collections::VecDeque<(u64, gpux_protocol::PublicKey)>,
    /// While a burst lasts, every new signer is marked at once.
    bursting_until: u64,
    seen: u64,
}

impl Arrivals {
    /// Notes `signer`; returns those to mark now: when the window makes a burst, the whole
    /// window (`back`: those before the crossing too) or `signer` alone.
    fn note(
        &mut self,
        signer: gpux_protocol::PublicKey,
        (threshold, back): (usize, bool),
        now: u64,
    ) -> Vec<gpux_protocol::PublicKey> {
        self.seen = now;
        while self
            .window
            .front()
            .is_some_and(|(at, _)| now.saturating_sub(*at) > BURST_WINDOW_MS)
        {
            self.window.pop_front();
        }
        self.window.push_back((now, signer));
        if self.window.len() > threshold || now < self.bursting_until {
            self.bursting_until = now + BURST_WINDOW_MS;
            let window = self.window.drain(..).map(|(_, s)| s);
            return if back { window.collect() } else { vec![signer] };
        }
        Vec::new()
    }
}

impl Bursts {
    /// `peer` brought `signer`, new to this node. When the peer's window then holds more
    /// than [`BURST_SIGNERS`], all of them are marked (those before the crossing too), and
    /// so is every new signer it brings until a window passes without a burst; when all
    /// peers' window holds more than [`BURST_SIGNERS_ALL`], every new signer from then on
    /// is marked, from any peer, until a window passes without a burst.
    pub fn arrived(&mut self, peer: PeerId, signer: gpux_protocol::PublicKey, now: u64) {
        let mut marks =
            self.peers
                .entry(peer)
                .or_default()
                .note(signer, (BURST_SIGNERS, true), now);
        // Not back over all peers' window: an honest host that arrived through another
        // relay a moment before a flood is no part of it.
        marks.extend(self.all.note(signer, (BURST_SIGNERS_ALL, false), now));
        for s in marks {
            self.marked.insert(s, now);
        }
        trim_oldest(&mut self.peers, MAX_TRACKED, |a| a.seen);
        trim_oldest(&mut self.marked, MAX_MARKED, |at| *at);
    }

    /// Whether `signer` came in a burst, less than [`BURST_MARK_MS`] ago.
    pub fn marked(&self, signer: &gpux_protocol::PublicKey, now: u64) -> bool {
        self.marked
            .get(signer)
            .is_some_and(|at| now.saturating_sub(*at) < BURST_MARK_MS)
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

    #[test]
    fn floods_from_fresh_identities_one_after_another_never_get_their_relay_cut_off() {
        // A relay flooded by ten rogues in turn, each a fresh identity with a whole budget
        // at the relay; the relay's neighbour holds all it forwards against the relay's
        // one budget there.
        let mut relay = Budgets::default();
        let mut neighbour = Budgets::default();
        let relay_id = PeerId::random();
        let t0 = 1_000_000;
        let mut ignored_at_neighbour = 0;
        for round in 0..10u64 {
            let rogue = PeerId::random();
            for i in 0..1000u64 {
                let at = t0 + round * 20_000 + i * 12;
                if relay.admit(rogue, true, at) == Admit::Yes
                    && neighbour.admit(relay_id, true, at + 5) != Admit::Yes
                {
                    ignored_at_neighbour += 1;
                }
            }
            // Each rogue sinks at the relay.
            assert!(relay.app_score(&rogue, t0 + round * 20_000 + 12_000) < -80.0);
        }
        // The neighbour ignored what went over the relay's budget, and keeps the relay.
        assert!(ignored_at_neighbour > 500, "{ignored_at_neighbour}");
        assert_eq!(neighbour.app_score(&relay_id, t0 + 200_000), 0.0);
    }

    #[test]
    fn signers_a_relay_brings_in_a_burst_are_marked_and_a_trickle_is_not() {
        let key = |i: u32| {
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&i.to_le_bytes());
            gpux_protocol::Keypair::from_seed(&seed).public()
        };
        let mut b = Bursts::default();
        let (relay, other) = (PeerId::random(), PeerId::random());
        let t0 = 1_000_000;
        // A trickle: one new host every five seconds, for ten minutes.
        for i in 0..120 {
            b.arrived(relay, key(i), t0 + u64::from(i) * 5_000);
        }
        assert!((0..120).all(|i| !b.marked(&key(i), t0 + 600_000)));
        // A host through another relay just before a flood is no part of it.
        let t1 = t0 + 700_000;
        b.arrived(other, key(4999), t1 - 1_000);
        // A flood through the relay: all of it marked, its first keys too, and what
        // follows while it lasts; so is a host another relay brings during the flood (it is
        // tried, only later), but not one after it.
        for i in 1000..1200 {
            b.arrived(relay, key(i), t1 + u64::from(i - 1000) * 10);
        }
        b.arrived(other, key(5000), t1 + 5_000);
        b.arrived(relay, key(1200), t1 + 30_000);
        b.arrived(other, key(5001), t1 + 30_000 + BURST_WINDOW_MS + 1);
        assert!((1000..=1200).all(|i| b.marked(&key(i), t1 + 30_000)));
        assert!(!b.marked(&key(4999), t1 + 30_000));
        assert!(b.marked(&key(5000), t1 + 30_000));
        assert!(!b.marked(&key(5001), t1 + 100_000));
        // The mark fades.
        assert!(!b.marked(&key(1000), t1 + 2_000 + BURST_MARK_MS));
        // A flood split over four relays, each passing on fewer than a burst's worth.
        let mut b = Bursts::default();
        let relays: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        for i in 0..60u32 {
            b.arrived(
                relays[i as usize % 4],
                key(2000 + i),
                t0 + u64::from(i) * 500,
            );
        }
        assert!((2033..2060).all(|i| b.marked(&key(i), t0 + 30_000)));
        assert!((2000..2032).all(|i| !b.marked(&key(i), t0 + 30_000)));
    }
}
