//! `gpux-sim`: the market at 100,000 hosts and 10,000 renters, simulated (docs/scale.md).

use std::path::PathBuf;

use clap::Parser;
use gpux_lease::Timing;
use gpux_sim::gossip::GossipParams;
use gpux_sim::market::MarketParams;
use gpux_sim::{Config, Report};

/// Simulates a gpux market far larger than one machine runs as nodes: the pure lease and
/// ledger machines unchanged, gossip modelled; prints each node's gossip load (sharded and
/// not), the ledger's operation rate, and how rents fare.
#[derive(Debug, Parser)]
#[command(name = "gpux-sim", version)]
struct Args {
    /// Hosts.
    #[arg(long, default_value_t = 100_000)]
    hosts: usize,
    /// Renters.
    #[arg(long, default_value_t = 10_000)]
    renters: usize,
    /// GPU families (popularity falls as 1/rank).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=16))]
    families: u16,
    /// Simulated time, minutes.
    #[arg(long, default_value_t = 60)]
    minutes: u64,
    /// Shortest and longest lease, minutes (drawn uniformly).
    #[arg(long, default_value_t = 10)]
    lease_min: u32,
    /// Longest lease, minutes.
    #[arg(long, default_value_t = 90)]
    lease_max: u32,
    /// A renter's mean pause between leases, minutes.
    #[arg(long, default_value_t = 10)]
    think: u64,
    /// Receipt interval, s (the host redeems at the ledger after each acknowledgement).
    #[arg(long, default_value_t = 60)]
    receipt_interval: u64,
    /// One-way link delay, ms.
    #[arg(long, default_value_t = 50)]
    delay: u64,
    /// Link jitter, ± ms.
    #[arg(long, default_value_t = 10)]
    jitter: u64,
    /// Loss per gossip copy, percent.
    #[arg(long, default_value_t = 1.0)]
    loss: f64,
    /// A host's periodic republication, s.
    #[arg(long, default_value_t = 120)]
    republish: u64,
    /// A signed attestation, bytes.
    #[arg(long, default_value_t = 2048)]
    attestation_bytes: u64,
    /// Attestations travel once per this many seconds per host instead of with every
    /// publication (a what-if: offers name the attestation, nodes fetch it once).
    #[arg(long, value_name = "SECONDS")]
    attestation_every: Option<u64>,
    /// Messages spread per topic to measure it.
    #[arg(long, default_value_t = 8)]
    samples: usize,
    /// The seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the whole report as JSON here.
    #[arg(long)]
    report: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(
        a.hosts > 0 && a.renters > 0,
        "--hosts and --renters must be at least 1"
    );
    anyhow::ensure!(
        a.lease_min >= 1 && a.lease_min <= a.lease_max,
        "--lease-min must be at least 1 and at most --lease-max"
    );
    anyhow::ensure!(
        (0.0..100.0).contains(&a.loss),
        "--loss is a percentage below 100"
    );
    anyhow::ensure!(
        a.receipt_interval >= 1,
        "--receipt-interval must be at least 1 s"
    );
    let config = Config {
        market: MarketParams {
            hosts: a.hosts,
            renters: a.renters,
            families: usize::from(a.families),
            duration_ms: a.minutes * 60_000,
            lease_s: (a.lease_min * 60, a.lease_max * 60),
            think_mean_s: a.think * 60,
            timing: Timing {
                receipt_interval_ms: a.receipt_interval * 1000,
                ..Timing::default()
            },
            link_ms: a.delay,
            jitter_ms: a.jitter.min(a.delay),
            attempts: 5,
        },
        gossip: GossipParams {
            link_ms: a.delay,
            jitter_ms: a.jitter.min(a.delay),
            loss_pct: a.loss,
            ..GossipParams::default()
        },
        republish_s: a.republish,
        attestation_bytes: a.attestation_bytes,
        attestation_every_s: a.attestation_every,
        samples: a.samples,
        seed: a.seed,
    };
    eprintln!(
        "simulating {} hosts and {} renters for {} simulated minutes...",
        a.hosts, a.renters, a.minutes
    );
    let report = gpux_sim::run(config)?;
    print(&report);
    if let Some(path) = &a.report {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
        println!("report written to {}", path.display());
    }
    Ok(())
}

fn print(r: &Report) {
    let m = &r.market;
    println!("gossip, per node (received; the transport's own floor of ~2.7 KB/s not included):");
    println!(
        "  {:<44} {:>10} {:>12} {:>10}",
        "node", "msgs/s", "bytes/s", "book"
    );
    for l in &r.loads {
        println!(
            "  {:<44} {:>10.1} {:>12.0} {:>10}",
            l.node, l.msgs_per_s, l.bytes_per_s, l.book_offers
        );
    }
    println!(
        "  one-family renter / unsharded renter, bytes: {:.4}",
        r.renter_bytes_ratio
    );
    println!(
        "  an offer reaches a renter of its family: p50 {} ms, p95 {} ms (unsharded: p95 {} ms)",
        r.offer_arrival_p50_ms, r.offer_arrival_p95_ms, r.unsharded_topics.0.arrival_p95_ms
    );
    println!("market:");
    println!(
        "  rents {}: first host asked accepted {:.1}%, some host within 5 accepted {:.1}%; refusals {}, looks that saw nothing free {}",
        m.rents,
        100.0 * m.found_first as f64 / m.rents.max(1) as f64,
        100.0 * m.found as f64 / m.rents.max(1) as f64,
        m.refused,
        m.nothing_seen
    );
    println!(
        "  rent to running (modelled links and Docker): p50 {} ms, p95 {} ms; leases running {}, ended {}, settled {}, open at the end {}",
        m.rent_to_running_p50_ms,
        m.rent_to_running_p95_ms,
        m.running,
        m.ended,
        m.settled,
        m.open_at_end
    );
    println!("ledger:");
    println!(
        "  {:.1} operations/s on average, {:.1}/s in the busiest minute ({:?}); {} receipts signed",
        m.ledger_ops_per_s, m.ledger_peak_ops_per_s, m.ledger_ops, m.receipts
    );
    println!(
        "  the ledger machine's CPU per operation: {:.1} µs (one core: {:.0} operations/s before replication)",
        m.ledger_us_per_op,
        1e6 / m.ledger_us_per_op.max(1e-9)
    );
    println!(
        "  credits: minted {}, total at the end {} ({})",
        m.minted,
        m.total,
        if m.minted == m.total {
            "conserved"
        } else {
            "NOT CONSERVED"
        }
    );
    println!("wall time: {:.1} s (market {:.1} s)", r.wall_s, m.wall_s);
}
