//! The simulation at a size a test affords: its figures hold the rules they claim to measure.

use gpux_lease::Timing;
use gpux_sim::gossip::GossipParams;
use gpux_sim::market::MarketParams;
use gpux_sim::{Config, run};

fn config(hosts: usize, renters: usize, minutes: u64) -> Config {
    Config {
        market: MarketParams {
            hosts,
            renters,
            families: 10,
            duration_ms: minutes * 60_000,
            lease_s: (60, 300),
            think_mean_s: 60,
            timing: Timing {
                receipt_interval_ms: 20_000,
                ack_grace_ms: 10_000,
                ..Timing::default()
            },
            link_ms: 50,
            jitter_ms: 10,
            attempts: 5,
        },
        gossip: GossipParams::default(),
        republish_s: 120,
        attestation_bytes: 2048,
        attestation_every_s: None,
        samples: 4,
        seed: 3,
    }
}

#[test]
fn leases_start_run_and_settle_with_credits_conserved() {
    let r = run(config(1_000, 150, 15)).unwrap();
    let m = &r.market;
    assert_eq!(m.minted, m.total, "credits conserved");
    assert!(m.rents >= 150, "every renter rented: {} rents", m.rents);
    assert!(m.found > 0 && m.found <= m.rents + m.refused);
    assert!(m.running > 0 && m.running <= m.found);
    assert!(m.settled > 0, "some leases settled on the ledger");
    for kind in ["lock", "redeem", "release"] {
        assert!(
            m.ledger_ops.get(kind).copied().unwrap_or(0) > 0,
            "{kind} operations"
        );
    }
    // A lock per lease that ran (a lease that ends unlocked locks nothing), a release per
    // settled lease, a redemption per acknowledged receipt at most.
    assert!(m.ledger_ops["lock"] >= m.running && m.ledger_ops["lock"] <= m.found);
    assert!(m.ledger_ops["redeem"] <= m.receipts);
    assert!(m.ledger_ops["release"] >= m.settled);
    // Rent to running takes the request, the lock, the ledger and Docker's start: at least
    // 800 ms, and well under ten seconds on these links.
    assert!((800..10_000).contains(&m.rent_to_running_p50_ms), "{m:?}");
}

#[test]
fn sharding_cuts_a_one_family_renters_gossip() {
    let r = run(config(2_000, 200, 5)).unwrap();
    let unsharded = r.loads.last().unwrap();
    let popular = &r.loads[0];
    let rare = &r.loads[1];
    assert!(unsharded.node.contains("unsharded"));
    // Families are Zipf-distributed: the most popular of ten holds about a third of the
    // hosts, the least about a thirtieth.
    assert!(
        popular.bytes_per_s < unsharded.bytes_per_s * 0.5,
        "{:?}",
        r.loads
    );
    assert!(
        rare.bytes_per_s < unsharded.bytes_per_s / 5.0,
        "{:?}",
        r.loads
    );
    assert!(rare.book_offers < popular.book_offers);
    assert_eq!(unsharded.book_offers, 2_000);
    // Offers reach the renters of their family within a second on 50 ms links.
    assert!(
        r.offer_arrival_p95_ms > 50 && r.offer_arrival_p95_ms < 1_000,
        "{}",
        r.offer_arrival_p95_ms
    );
}
