//! The raft timings, scaled to the time of a call between members, which each member
//! measures when it starts (a `Hello` exchange over `/gpux/raft/1`: a new substream, then
//! the request, so about two network round trips, plus whatever the members' load adds).
//!
//! openraft fixes its timings when the engine is made, and waits for an append (a
//! heartbeat included) only one heartbeat interval. An append costs what the measured call
//! costs, and the interval must also cover a TCP retransmission (Linux waits at least
//! 200 ms) and the load of the moment: so the heartbeat is four measured calls, never under
//! 400 ms (which holds on links of 50 ms each way with 1% loss, where 200 ms never did) nor
//! over 4 s. Elections wait two to three heartbeats; a follower that knows a leader first
//! waits out the leader's lease (openraft: the largest election timeout), so a leader lost
//! on a LAN is replaced within about 2.5 s.
//!
//! The first member to start has no one to measure and takes the floor. Members whose
//! calls take over 200 ms (the floor's 800 ms election timeout below a far leader's
//! heartbeat) should be started together, or the first restarted once the others run.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use openraft::Config;

use super::ClusterError;
use crate::p2p::{Client, Multiaddr, PeerId};

/// The shortest heartbeat interval.
const MIN_HEARTBEAT: Duration = Duration::from_millis(400);
/// The longest: members 1 s apart still form a cluster, slowly.
const MAX_HEARTBEAT: Duration = Duration::from_secs(4);
/// A heartbeat covers this many measured calls.
const HEARTBEAT_ROUND_TRIPS: u32 = 4;
/// How long a starting member spends measuring (members not running yet cost nothing:
/// their refusals are immediate, and the first to start has no one to measure).
const MEASURE_WITHIN: Duration = Duration::from_millis(1500);
/// Timed exchanges per member, after one that connects.
const SAMPLES: usize = 3;

/// The timings a member uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// The round trip they were scaled to (none measured: the floor's).
    pub round_trip: Option<Duration>,
    /// The leader's heartbeat interval, and its append's deadline.
    pub heartbeat: Duration,
    /// The election timeout's range.
    pub election: (Duration, Duration),
}

impl Timings {
    /// The timings for members `round_trip` apart (`None`: not measured).
    pub fn for_round_trip(round_trip: Option<Duration>) -> Self {
        let heartbeat = round_trip
            .map_or(MIN_HEARTBEAT, |rtt| rtt * HEARTBEAT_ROUND_TRIPS)
            .clamp(MIN_HEARTBEAT, MAX_HEARTBEAT);
        // Whole milliseconds: openraft's unit.
        let heartbeat = Duration::from_millis(heartbeat.as_millis() as u64);
        Timings {
            round_trip,
            heartbeat,
            election: (heartbeat * 2, heartbeat * 3),
        }
    }

    /// openraft's configuration with these timings.
    pub(super) fn config(&self) -> Result<Config, ClusterError> {
        Config {
            cluster_name: "gpux-ledger".into(),
            heartbeat_interval: self.heartbeat.as_millis() as u64,
            election_timeout_min: self.election.0.as_millis() as u64,
            election_timeout_max: self.election.1.as_millis() as u64,
            max_payload_entries: 128,
            snapshot_max_chunk_size: 1024 * 1024,
            ..Config::default()
        }
        .validate()
        .map_err(|e| ClusterError::Config(e.to_string()))
    }
}

impl std::fmt::Display for Timings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "heartbeat {} ms, elections after {}-{} ms (",
            self.heartbeat.as_millis(),
            self.election.0.as_millis(),
            self.election.1.as_millis()
        )?;
        match self.round_trip {
            Some(rtt) => write!(f, "members {} ms apart)", rtt.as_millis()),
            None => write!(f, "no other member answered; the floor)"),
        }
    }
}

/// The time of a call to the farthest member that answers within [`MEASURE_WITHIN`]: for
/// each, the median of [`SAMPLES`] `Hello` exchanges after one that connects.
pub(super) async fn measure(
    net: &Client,
    members: &BTreeMap<PeerId, Multiaddr>,
) -> Option<Duration> {
    let me = net.local_peer_id();
    let one = |peer: PeerId, addr: Multiaddr| async move {
        let ask = || super::hello(net, peer, &addr, MEASURE_WITHIN);
        // The first call connects; the next ones are timed.
        ask().await.ok()?;
        let mut samples = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let started = tokio::time::Instant::now();
            if ask().await.is_ok() {
                samples.push(started.elapsed());
            }
        }
        samples.sort();
        samples.get(samples.len() / 2).copied()
    };
    let asked = members
        .iter()
        .filter(|(peer, _)| **peer != me)
        .map(|(peer, addr)| tokio::time::timeout(MEASURE_WITHIN, one(*peer, addr.clone())));
    join_all(asked).await.into_iter().flatten().flatten().max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_grow_with_the_round_trip_between_a_floor_and_a_ceiling() {
        let floor = Timings::for_round_trip(None);
        assert_eq!(floor.heartbeat, MIN_HEARTBEAT);
        assert_eq!(
            floor.election,
            (Duration::from_millis(800), Duration::from_millis(1200))
        );
        // A LAN, and the isolated testnet's 100 ms round trips: the floor.
        let lan = Timings::for_round_trip(Some(Duration::from_millis(1)));
        assert_eq!(
            (lan.heartbeat, lan.election),
            (floor.heartbeat, floor.election)
        );
        assert_eq!(
            Timings::for_round_trip(Some(Duration::from_millis(100))).heartbeat,
            MIN_HEARTBEAT
        );
        // Members 250 ms apart: four round trips.
        let far = Timings::for_round_trip(Some(Duration::from_millis(250)));
        assert_eq!(far.heartbeat, Duration::from_secs(1));
        assert_eq!(
            far.election,
            (Duration::from_secs(2), Duration::from_secs(3))
        );
        assert!(far.config().is_ok());
        // Never past the ceiling.
        let absurd = Timings::for_round_trip(Some(Duration::from_secs(30)));
        assert_eq!(absurd.heartbeat, MAX_HEARTBEAT);
        assert!(absurd.config().is_ok());
    }
}
