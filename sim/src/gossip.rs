//! Gossip, modelled rather than run: a topic's mesh is a random graph of degree D among its
//! subscribers, and a message spreads through it event by event. Each node forwards a message
//! once, on first receipt, to every mesh peer but the one it came from; a peer that already
//! holds a large message has told its neighbours so (gossipsub 1.2's IDONTWANT) and is
//! skipped; a copy lost on a link is fetched on a later heartbeat (IHAVE, then IWANT) from a
//! neighbour that has it. Heartbeat gossip itself (IHAVE to D_lazy peers outside the mesh,
//! naming the ids of the last heartbeats' messages) is priced per heartbeat, as gossipsub
//! sends it whether or not the peer needs it.
//!
//! What is left out, and why it does not change the comparison: the publisher's flood to
//! every connected subscriber (a host publishes a few messages a minute), GRAFT and PRUNE
//! (rare once meshes are stable), peer exchange, and the transport's own floor (kademlia,
//! identify and ping, about 2.7 KB/s a node whatever it follows; see docs/network.md).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

/// The gossip parameters the model runs with (gpux's gossipsub configuration).
#[derive(Debug, Clone, Serialize)]
pub struct GossipParams {
    /// Mesh degree D (gossipsub's `mesh_n`).
    pub degree: usize,
    /// Peers outside the mesh that each heartbeat's IHAVE goes to (`gossip_lazy`).
    pub lazy: usize,
    /// Heartbeat interval, ms (gpux uses 700).
    pub heartbeat_ms: u64,
    /// Heartbeats whose message ids an IHAVE names (`history_gossip`).
    pub history: u64,
    /// One-way link delay, ms.
    pub link_ms: u64,
    /// Uniform jitter on each link delay, ± ms.
    pub jitter_ms: u64,
    /// Per-copy loss, percent.
    pub loss_pct: f64,
    /// A node's time to validate a message before it forwards it (decode, signature, rules), ms.
    pub validate_ms: u64,
    /// Bytes each copy carries besides its data: the signature, the author's key, the sequence
    /// number, the topic and the framing.
    pub overhead_bytes: u64,
    /// Messages at least this large are announced with IDONTWANT (gossipsub's default 1000).
    pub idontwant_bytes: u64,
    /// Bytes an IHAVE spends per message id (32-byte blake3 ids, with framing).
    pub ihave_id_bytes: u64,
    /// The most ids one IHAVE names (`max_ihave_length`).
    pub max_ihave: u64,
}

impl Default for GossipParams {
    fn default() -> Self {
        GossipParams {
            degree: 6,
            lazy: 6,
            heartbeat_ms: 700,
            history: 3,
            link_ms: 50,
            jitter_ms: 10,
            loss_pct: 1.0,
            validate_ms: 1,
            overhead_bytes: 160,
            idontwant_bytes: 1000,
            ihave_id_bytes: 34,
            max_ihave: 5000,
        }
    }
}

/// A topic's mesh: each subscriber's mesh peers (indices into the subscriber list).
#[derive(Debug)]
pub struct Mesh {
    adj: Vec<Vec<u32>>,
}

impl Mesh {
    /// A random mesh of `n` nodes, each with about `degree` peers (the configuration model:
    /// `degree` link ends per node, paired at random; self links and repeats are dropped,
    /// and a node left with no peer is linked to a random one).
    pub fn random(n: usize, degree: usize, rng: &mut StdRng) -> Mesh {
        let mut adj = vec![Vec::with_capacity(degree); n];
        if n < 2 {
            return Mesh { adj };
        }
        // With fewer subscribers than the degree, every one is in every other's mesh.
        if n <= degree {
            for (a, peers) in adj.iter_mut().enumerate() {
                peers.extend((0..n as u32).filter(|&b| b as usize != a));
            }
            return Mesh { adj };
        }
        let mut ends: Vec<u32> = (0..n as u32)
            .flat_map(|v| std::iter::repeat_n(v, degree / 2 + degree % 2))
            .chain((0..n as u32).flat_map(|v| std::iter::repeat_n(v, degree / 2)))
            .collect();
        ends.shuffle(rng);
        for pair in ends.chunks_exact(2) {
            let (a, b) = (pair[0], pair[1]);
            if a != b && !adj[a as usize].contains(&b) {
                adj[a as usize].push(b);
                adj[b as usize].push(a);
            }
        }
        for v in 0..n {
            if adj[v].is_empty() {
                let mut u = rng.random_range(0..n);
                if u == v {
                    u = (u + 1) % n;
                }
                adj[v].push(u as u32);
                adj[u].push(v as u32);
            }
        }
        Mesh { adj }
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.adj.len()
    }

    /// Whether the mesh has no node.
    pub fn is_empty(&self) -> bool {
        self.adj.is_empty()
    }
}

/// One message's spread through a mesh.
#[derive(Debug, Clone)]
pub struct Spread {
    /// Copies sent over mesh links (each one received by its peer), the lost included.
    pub copies: u64,
    /// When each node other than the publisher first held the message, ms after publication.
    pub arrivals: Vec<u64>,
}

/// Spreads one message of `size` bytes from `origin` through `mesh`.
pub fn spread(
    mesh: &Mesh,
    origin: usize,
    size: u64,
    params: &GossipParams,
    rng: &mut StdRng,
) -> Spread {
    let n = mesh.len();
    let mut first: Vec<Option<u64>> = vec![None; n];
    let mut queue: BinaryHeap<Reverse<(u64, u32, u32)>> = BinaryHeap::new();
    let mut copies = 0u64;
    let idontwant = size >= params.idontwant_bytes;
    let link = |rng: &mut StdRng| {
        let j = params.jitter_ms;
        params.link_ms + rng.random_range(0..=2 * j) - j
    };
    first[origin] = Some(0);
    for &peer in &mesh.adj[origin] {
        copies += 1;
        if rng.random_bool(params.loss_pct / 100.0) {
            continue;
        }
        queue.push(Reverse((link(rng), peer, origin as u32)));
    }
    while let Some(Reverse((t, v, from))) = queue.pop() {
        let v = v as usize;
        if first[v].is_some() {
            continue;
        }
        first[v] = Some(t);
        let send_at = t + params.validate_ms;
        for &peer in &mesh.adj[v] {
            if peer == from {
                continue;
            }
            // A peer that already held it, long enough ago for its IDONTWANT to arrive, is
            // skipped.
            if idontwant
                && let Some(tp) = first[peer as usize]
                && tp + params.link_ms <= send_at
            {
                continue;
            }
            copies += 1;
            if rng.random_bool(params.loss_pct / 100.0) {
                continue;
            }
            queue.push(Reverse((send_at + link(rng), peer, v as u32)));
        }
    }
    // Nodes every copy to which was lost fetch it on a later heartbeat from a peer that has
    // it: the IHAVE, the IWANT and the message, three link delays after the heartbeat.
    for _ in 0..4 {
        let mut changed = false;
        for v in 0..n {
            if first[v].is_some() {
                continue;
            }
            let holder = mesh.adj[v].iter().filter_map(|&p| first[p as usize]).min();
            if let Some(t) = holder {
                let wait = rng.random_range(0..params.heartbeat_ms.max(1));
                first[v] = Some(t + wait + 3 * params.link_ms);
                copies += 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let arrivals = first
        .iter()
        .enumerate()
        .filter(|&(v, _)| v != origin)
        .filter_map(|(_, t)| *t)
        .collect();
    Spread { copies, arrivals }
}

/// A topic's spread, measured: sampled messages of one size through one mesh.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Subscribers.
    pub subscribers: usize,
    /// Copies each subscriber receives of each message (duplicates included).
    pub copies_per_node: f64,
    /// Publication to arrival at a subscriber, ms, every subscriber of every sample.
    pub arrivals: Vec<u64>,
    /// Publication to arrival at the last subscriber, ms, one per sample.
    pub lasts: Vec<u64>,
}

/// Spreads `samples` messages of `size` bytes from random subscribers through `mesh`.
pub fn measure(
    mesh: &Mesh,
    size: u64,
    samples: usize,
    params: &GossipParams,
    rng: &mut StdRng,
) -> Measured {
    let n = mesh.len();
    if n < 2 {
        return Measured {
            subscribers: n,
            ..Measured::default()
        };
    }
    let mut m = Measured {
        subscribers: n,
        ..Measured::default()
    };
    let mut copies = 0u64;
    for _ in 0..samples.max(1) {
        let origin = rng.random_range(0..n);
        let s = spread(mesh, origin, size, params, rng);
        copies += s.copies;
        m.lasts.push(s.arrivals.iter().copied().max().unwrap_or(0));
        m.arrivals.extend(s.arrivals);
    }
    m.copies_per_node = copies as f64 / (samples.max(1) as f64 * n as f64);
    m
}

/// What a topic costs each subscriber, and how fast it spreads.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TopicCost {
    /// Subscribers.
    pub subscribers: usize,
    /// Messages published per second.
    pub rate_per_s: f64,
    /// Mean message size, bytes.
    pub mean_bytes: f64,
    /// Copies each subscriber receives of each message (duplicates included).
    pub copies_per_node: f64,
    /// Messages each subscriber receives per second, duplicates included.
    pub msgs_per_s: f64,
    /// Bytes each subscriber receives per second: the copies and the heartbeat gossip.
    pub bytes_per_s: f64,
    /// Of which heartbeat gossip (IHAVE), bytes per second.
    pub ihave_bytes_per_s: f64,
    /// Publication to arrival at a subscriber, ms: p50 over every subscriber of every
    /// sampled message.
    pub arrival_p50_ms: u64,
    /// p95.
    pub arrival_p95_ms: u64,
    /// Publication to arrival at the last subscriber, ms: p95 over the sampled messages.
    pub last_p95_ms: u64,
}

/// Prices a measured topic on which `rate_per_s` messages of `mean_bytes` are published.
pub fn price(m: &Measured, rate_per_s: f64, mean_bytes: f64, params: &GossipParams) -> TopicCost {
    let msgs_per_s = rate_per_s * m.copies_per_node;
    // Each heartbeat a node receives, on average, `lazy` IHAVEs, each naming the ids of the
    // messages of the last `history` heartbeats.
    let heartbeats_per_s = 1000.0 / params.heartbeat_ms.max(1) as f64;
    let window_ids = (rate_per_s * params.history as f64 * params.heartbeat_ms as f64 / 1000.0)
        .min(params.max_ihave as f64);
    let ihave_bytes_per_s = if m.subscribers > params.degree + 1 && window_ids > 0.0 {
        heartbeats_per_s * params.lazy as f64 * (window_ids * params.ihave_id_bytes as f64 + 24.0)
    } else {
        0.0
    };
    let mut arrivals = m.arrivals.clone();
    let mut lasts = m.lasts.clone();
    TopicCost {
        subscribers: m.subscribers,
        rate_per_s,
        mean_bytes,
        copies_per_node: m.copies_per_node,
        msgs_per_s,
        bytes_per_s: msgs_per_s * (mean_bytes + params.overhead_bytes as f64) + ihave_bytes_per_s,
        ihave_bytes_per_s,
        arrival_p50_ms: percentile(&mut arrivals, 50.0),
        arrival_p95_ms: percentile(&mut arrivals, 95.0),
        last_p95_ms: percentile(&mut lasts, 95.0),
    }
}

/// The `p`th percentile of `values` (nearest rank; 0 when empty).
pub fn percentile(values: &mut [u64], p: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_message_reaches_every_subscriber_within_a_few_hops() {
        let mut rng = StdRng::seed_from_u64(7);
        let params = GossipParams::default();
        let mesh = Mesh::random(5_000, params.degree, &mut rng);
        let s = spread(&mesh, 0, 1_200, &params, &mut rng);
        assert_eq!(s.arrivals.len(), 4_999, "every node is reached");
        let last = *s.arrivals.iter().max().unwrap();
        // log_5(5000) is about 5.3 hops of 50 ± 10 ms: the last node within a second.
        assert!(last < 1_000, "the last node was reached after {last} ms");
        // Each node forwards once to its D - 1 other peers; IDONTWANT saves some.
        let per_node = s.copies as f64 / 5_000.0;
        assert!((1.0..6.0).contains(&per_node), "{per_node} copies a node");
    }

    #[test]
    fn idontwant_saves_copies_of_large_messages_only() {
        let mut rng = StdRng::seed_from_u64(8);
        let params = GossipParams {
            loss_pct: 0.0,
            ..GossipParams::default()
        };
        let mesh = Mesh::random(3_000, params.degree, &mut rng);
        let small = spread(&mesh, 1, 200, &params, &mut rng).copies;
        let large = spread(&mesh, 1, 2_000, &params, &mut rng).copies;
        assert!(large < small, "large {large} copies, small {small}");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(percentile(&mut v, 50.0), 50);
        assert_eq!(percentile(&mut v, 95.0), 95);
        assert_eq!(percentile(&mut v, 100.0), 100);
        assert_eq!(percentile(&mut [], 95.0), 0);
    }
}
