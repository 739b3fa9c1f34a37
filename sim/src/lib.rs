//! A discrete-event simulation of a gpux market far larger than one machine can run as
//! nodes (100,000 hosts and 10,000 renters by default), for docs/scale.md.
//!
//! Two parts, run in order:
//! - **The market** ([`market`]): every host a real `HostBook` with its signed offer, every
//!   lease the real `HostLease` and `RenterLease`, settlement one real `LedgerMachine`, fed
//!   simulated time; envelopes are signed and verified as on the wire. It gives the ledger's
//!   operation rate, the fraction of rents that find their offer, and how often hosts
//!   republish because a booking changed.
//! - **Gossip** ([`gossip`]): each topic's mesh is built among its subscribers and sampled
//!   messages spread through it event by event, with the links' delay, jitter and loss. With
//!   the market's publication rates this gives each node's gossip load, sharded by family
//!   (as built) and unsharded (every node on one offer topic and one attestation topic, as
//!   before), and how long an offer takes to reach a renter (the delay the market's renters
//!   see their books with).
//!
//! `cargo run --release -p gpux-sim -- --help` lists the knobs; docs/scale.md has the figures.

pub mod gossip;
pub mod market;

use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;

use gossip::{GossipParams, Measured, Mesh, TopicCost};
use market::{MarketFigures, MarketParams};

/// A run's settings.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// The market.
    pub market: MarketParams,
    /// Gossip.
    pub gossip: GossipParams,
    /// A host's periodic republication, s (gpux's default 120).
    pub republish_s: u64,
    /// A signed attestation's size, bytes (a self-reported one with its NVML facts; a
    /// confidential-computing quote makes it up to 64 KiB).
    pub attestation_bytes: u64,
    /// How often a host's attestation travels, s: `None` with every publication (as built:
    /// it is re-signed each time); `Some(s)`: once per `s` (the plan in docs/scale.md:
    /// offers name it, and a node fetches it once, on request).
    pub attestation_every_s: Option<u64>,
    /// Messages spread per topic to measure it.
    pub samples: usize,
    /// The seed of every draw.
    pub seed: u64,
}

/// A node's gossip load.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeLoad {
    /// Who.
    pub node: String,
    /// Gossip messages received per second, duplicates included.
    pub msgs_per_s: f64,
    /// Gossip bytes received per second (copies and heartbeat gossip).
    pub bytes_per_s: f64,
    /// Offers its book holds.
    pub book_offers: u64,
    /// Their bytes.
    pub book_bytes: u64,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The settings.
    pub config: Config,
    /// The market part.
    pub market: MarketFigures,
    /// Per family: its offer topic and its attestation topic, sharded.
    pub sharded_topics: Vec<(String, TopicCost, TopicCost)>,
    /// The unsharded offer topic and attestation topic (every node on both).
    pub unsharded_topics: (TopicCost, TopicCost),
    /// Per-node gossip load, sharded and unsharded, for the kinds of node that differ.
    pub loads: Vec<NodeLoad>,
    /// A renter of the most popular family, sharded, against an unsharded renter: bytes.
    pub renter_bytes_ratio: f64,
    /// An offer's arrival at a renter of its family, ms (sharded, every family): p50, p95.
    pub offer_arrival_p50_ms: u64,
    /// p95.
    pub offer_arrival_p95_ms: u64,
    /// Wall time of the whole run, s.
    pub wall_s: f64,
}

/// Runs the simulation.
pub fn run(config: Config) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(config.seed);
    let p = &config.gossip;
    let families = config.market.families;
    // The market first: it draws who is of which family (a family's hosts and the renters
    // who want it subscribe to its topics).
    let mut market = market::Market::new(
        config.market.clone(),
        StdRng::seed_from_u64(config.seed ^ 0x5EED),
    )?;
    let subscribers = market.subscribers();
    // 1. Each family's mesh, sharded: offers and attestations spread through it.
    let mut sharded: Vec<(Measured, Measured)> = Vec::new();
    for &n in &subscribers {
        let mesh = Mesh::random(n, p.degree, &mut rng);
        let offers = gossip::measure(&mesh, 700, config.samples, p, &mut rng);
        let atts = gossip::measure(&mesh, config.attestation_bytes, config.samples, p, &mut rng);
        sharded.push((offers, atts));
    }
    // 2. The market, its renters seeing offers as late as their family's topic spreads them.
    let lag: Vec<Vec<u64>> = sharded
        .iter()
        .map(|(o, _)| o.arrivals.iter().step_by(7).take(20_000).copied().collect())
        .collect();
    market.set_lag(lag);
    let figures = market.run();
    // 3. Prices: each publication is the attestation and an offer (or a withdrawal).
    let secs = config.market.duration_ms as f64 / 1000.0;
    let mut sharded_topics = Vec::new();
    let (mut all_rate, mut all_att_rate, mut all_offer_bytes) = (0.0, 0.0, 0.0);
    for (f, (offers, atts)) in sharded.iter().enumerate() {
        let fam = &figures.per_family[f];
        let periodic = fam.hosts as f64 * secs / config.republish_s.max(1) as f64;
        let pubs = periodic + fam.publications.on_change as f64;
        let rate = pubs / secs;
        let withdrawals = fam.publications.withdrawals as f64;
        let offer_bytes = if pubs > 0.0 {
            ((pubs - withdrawals) * figures.offer_bytes
                + withdrawals * figures.withdrawal_bytes as f64)
                / pubs
        } else {
            figures.offer_bytes
        };
        let att_rate = config
            .attestation_every_s
            .map_or(rate, |every| fam.hosts as f64 / every.max(1) as f64);
        all_rate += rate;
        all_att_rate += att_rate;
        all_offer_bytes += rate * offer_bytes;
        sharded_topics.push((
            fam.family.clone(),
            gossip::price(offers, rate, offer_bytes, p),
            gossip::price(atts, att_rate, config.attestation_bytes as f64, p),
        ));
    }
    let all_offer_bytes = if all_rate > 0.0 {
        all_offer_bytes / all_rate
    } else {
        0.0
    };
    // 4. Unsharded: every node on one offer topic and one attestation topic.
    let everyone = config.market.hosts + config.market.renters;
    let mesh = Mesh::random(everyone, p.degree, &mut rng);
    let offers = gossip::measure(&mesh, all_offer_bytes as u64, config.samples, p, &mut rng);
    let atts = gossip::measure(&mesh, config.attestation_bytes, config.samples, p, &mut rng);
    drop(mesh);
    let unsharded_topics = (
        gossip::price(&offers, all_rate, all_offer_bytes, p),
        gossip::price(&atts, all_att_rate, config.attestation_bytes as f64, p),
    );
    // 5. Per-node loads.
    let load = |node: &str, topics: &[&TopicCost], book_offers: u64| NodeLoad {
        node: node.to_string(),
        msgs_per_s: topics.iter().map(|t| t.msgs_per_s).sum(),
        bytes_per_s: topics.iter().map(|t| t.bytes_per_s).sum(),
        book_offers,
        book_bytes: (book_offers as f64 * figures.offer_bytes) as u64,
    };
    let hosts_of = |f: usize| figures.per_family.get(f).map_or(0, |x| x.hosts);
    let last = families.saturating_sub(1);
    let mut loads = Vec::new();
    if let (Some(first), Some(least)) = (sharded_topics.first(), sharded_topics.get(last)) {
        loads.push(load(
            &format!("renter following {} (sharded)", first.0),
            &[&first.1, &first.2],
            hosts_of(0),
        ));
        loads.push(load(
            &format!("renter following {} (sharded)", least.0),
            &[&least.1, &least.2],
            hosts_of(last),
        ));
        loads.push(load(
            &format!("host of {} (sharded)", first.0),
            &[&first.1, &first.2],
            0,
        ));
        let every: Vec<&TopicCost> = sharded_topics.iter().flat_map(|t| [&t.1, &t.2]).collect();
        loads.push(load(
            "renter following every family (sharded)",
            &every,
            config.market.hosts as u64,
        ));
    }
    loads.push(load(
        "any node (unsharded)",
        &[&unsharded_topics.0, &unsharded_topics.1],
        config.market.hosts as u64,
    ));
    let renter_bytes_ratio = match (loads.first(), loads.last()) {
        (Some(a), Some(b)) if b.bytes_per_s > 0.0 => a.bytes_per_s / b.bytes_per_s,
        _ => 0.0,
    };
    let mut arrivals: Vec<u64> = sharded
        .iter()
        .flat_map(|(o, _)| o.arrivals.clone())
        .collect();
    Ok(Report {
        offer_arrival_p50_ms: gossip::percentile(&mut arrivals, 50.0),
        offer_arrival_p95_ms: gossip::percentile(&mut arrivals, 95.0),
        config,
        market: figures,
        sharded_topics,
        unsharded_topics,
        loads,
        renter_bytes_ratio,
        wall_s: started.elapsed().as_secs_f64(),
    })
}
