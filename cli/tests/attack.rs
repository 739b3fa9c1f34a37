//! The market under attack, over real libp2p against real nodes, driven by the rogue-peer
//! kit (`gpux_testnet::rogue`).

use std::time::{Duration, Instant};

use gpux_api::Reachability;
use gpux_protocol::{EvidenceTier, ImageDigest, MicroCredits};
use gpux_testnet::rogue::Rogue;

use super::market::{Market, wait_for};

#[test]
fn cheap_unreachable_hosts_do_not_stop_a_rent_and_forged_tiers_reach_no_book() {
    let market = Market::start(1, 1, 30);
    let renter = &market.renters[0];
    let host = &market.hosts[0];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let victim = format!("{}/p2p/{}", renter.addr, renter.peer);
    let mut rogue = runtime.block_on(Rogue::start(&victim)).unwrap();
    runtime
        .block_on(rogue.wait_for_mesh(Duration::from_secs(20)))
        .unwrap();
    let image: ImageDigest = market.image.parse().unwrap();
    // Ten hosts at a hundredth of the honest price, with no node behind them.
    let cheap = MicroCredits(36_000);
    let fakes = runtime
        .block_on(rogue.fake_hosts(10, cheap, image, EvidenceTier::SelfReported))
        .unwrap();
    wait_for("the fake offers to reach the renter's book", 20, || {
        renter.api().status().is_ok_and(|s| s.offers_in_book >= 11)
    });

    let started = Instant::now();
    let lease = market.rent(renter, 60, "sleep 2");
    let took = started.elapsed();
    eprintln!("rent with 10 unreachable cheaper hosts: {took:?}");
    assert!(took < Duration::from_secs(10), "the rent took {took:?}");
    let view = renter.lease(&lease);
    assert_eq!(view.host, host.peer, "{view:?}");
    // The fakes it tried are shown as unreachable.
    let hits = renter.api().offers("gpu=l4", 100).unwrap();
    let unreachable = hits
        .iter()
        .filter(|h| fakes.iter().any(|k| k.public() == h.host))
        .filter(|h| h.reach == Reachability::Unreachable)
        .count();
    assert_eq!(unreachable, 10, "{hits:#?}");
    let out = renter.gpux(&["stop", &lease]);
    assert!(out.status.success());

    // Tiers above their evidence: `challenged` without a result (ignored), `cc-attested`
    // (rejected: it costs the rogue its score, so it goes last).
    let challenged = runtime
        .block_on(rogue.fake_hosts(3, cheap, image, EvidenceTier::Challenged))
        .unwrap();
    let cc = runtime
        .block_on(rogue.fake_hosts(3, cheap, image, EvidenceTier::CcAttested))
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    for node in [renter, host, &market.ledger] {
        let hits = node.api().offers("", 1000).unwrap();
        let forged: Vec<_> = hits
            .iter()
            .filter(|h| {
                challenged.iter().chain(&cc).any(|k| k.public() == h.host)
                    || h.tier != EvidenceTier::SelfReported
            })
            .collect();
        assert!(forged.is_empty(), "{}: {forged:#?}", node.name);
        assert!(hits.len() >= 11, "{}: {} offers", node.name, hits.len());
    }
    wait_for("the lease to settle", 30, || {
        renter.phase(&lease) == "settled"
    });
}

#[test]
fn a_sybil_flood_is_cut_off_at_the_relay_and_honest_offers_still_arrive() {
    // The short version of `gpux testnet flood` (docs/benchmarks.md has the 5-minute run).
    let config = gpux_testnet::flood::FloodConfig {
        gpux: std::path::PathBuf::from(env!("CARGO_BIN_EXE_gpux")),
        keys_per_min: 5000,
        duration: Duration::from_secs(15),
        base_dir: None,
    };
    let report = gpux_testnet::flood::run(&config, |line| eprintln!("{line}")).unwrap();
    eprintln!("{report:#?}");
    assert!(
        !report.rogue_connected_to_relay && !report.rogue_connected_to_victim,
        "{report:#?}"
    );
    assert!(report.relay_connected_to_victim, "{report:#?}");
    assert!(report.relay_over_budget > 0, "{report:#?}");
    // What got through is one relay's budget of new signers, not the flood.
    assert!(report.victim_book_max <= 300, "{report:#?}");
    assert!(report.victim_rss_max_kib <= 64 * 1024, "{report:#?}");
    assert!(report.honest_offers_seen >= 3, "{report:#?}");
    assert!(report.propagation_ms_p95 <= 1000, "{report:#?}");
}
