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
    // The first rejection may already cut the rogue off, so only the first must go out.
    let mut cc = runtime
        .block_on(rogue.fake_hosts(1, cheap, image, EvidenceTier::CcAttested))
        .unwrap();
    for _ in 0..2 {
        match runtime.block_on(rogue.fake_hosts(1, cheap, image, EvidenceTier::CcAttested)) {
            Ok(keys) => cc.extend(keys),
            Err(e) => eprintln!("the rogue is cut off: {e:#}"),
        }
    }
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
fn a_sybil_flood_is_cut_off_at_the_relay_honest_offers_still_arrive_and_the_next_rent_succeeds() {
    // The short version of `gpux testnet flood` (docs/benchmarks.md has the 5-minute run and
    // ten floods in a row): two floods, each from a fresh rogue, each followed by one rent.
    let config = gpux_testnet::flood::FloodConfig {
        gpux: std::path::PathBuf::from(gpux_e2e::gpux()),
        keys_per_min: 5000,
        duration: Duration::from_secs(12),
        base_dir: None,
        rounds: 2,
        rent_image: Some(gpux_testnet::build_image().expect("building the workload image")),
    };
    let report = gpux_testnet::flood::run(&config, |line| eprintln!("{line}")).unwrap();
    eprintln!("{report:#?}");
    // Every rogue is cut off where it flooded: by the relay, or (when it also reached the
    // victim and the host directly, as kademlia lets it about one flood in three) by them.
    assert!(!report.rogue_connected_to_victim, "{report:#?}");
    assert!(report.relay_connected_to_victim, "{report:#?}");
    assert!(report.relay_over_budget > 0, "{report:#?}");
    // What got through is one relay's budget of new signers a round, not the flood.
    assert!(report.victim_book_max <= 450, "{report:#?}");
    assert!(report.victim_rss_max_kib <= 64 * 1024, "{report:#?}");
    assert!(report.honest_offers_seen >= 3, "{report:#?}");
    assert!(report.propagation_ms_p95 <= 1000, "{report:#?}");
    // The flood's cheap hosts are ahead of the honest one by price, and none has a node
    // behind it: every rent still gets a lease on its first call.
    assert_eq!(report.rents.len(), 2, "{report:#?}");
    assert!(report.rents.iter().all(|r| r.ok), "{:#?}", report.rents);
}

#[test]
fn malformed_frames_on_every_request_response_protocol_are_refused_and_harm_nothing() {
    use gpux_node::p2p::Proto;
    use gpux_protocol::ledger_wire::{self, LedgerRequest, LedgerResponse, RefusalCode};
    let tmp = tempfile::tempdir().unwrap();
    let mut ledger =
        super::market::new_node(tmp.path(), "ledger", vec!["--serve-ledger".into()], vec![]);
    ledger.spawn();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rogue = runtime
        .block_on(Rogue::start(&format!(
            "{}/p2p/{}",
            ledger.addr, ledger.peer
        )))
        .unwrap();
    // A real envelope of a kind no protocol takes here, one with bytes after it, one cut
    // short, garbage, nothing, and the most bytes a frame may carry.
    let key = gpux_protocol::Keypair::from_seed(&[5; 32]);
    let (attestation, _) = gpux_testnet::rogue::fake_host(
        &key,
        MicroCredits(1),
        ImageDigest([1; 32]),
        EvidenceTier::SelfReported,
        gpux_node::attest::now(),
    )
    .unwrap();
    let mut trailing = attestation.clone();
    trailing.push(0);
    let cut = attestation[..attestation.len() / 2].to_vec();
    let frames: Vec<(&str, Vec<u8>)> = vec![
        ("a wrong kind", attestation),
        ("trailing bytes", trailing),
        ("cut short", cut),
        ("garbage", (0..200u8).map(|i| i.wrapping_mul(37)).collect()),
        ("empty", Vec::new()),
        (
            "the largest frame",
            vec![0xee; gpux_protocol::MAX_ENVELOPE_BYTES],
        ),
    ];
    for proto in [Proto::Lease, Proto::Receipt, Proto::Ledger] {
        for (what, frame) in &frames {
            let answer = runtime
                .block_on(rogue.request(proto, &ledger.peer, frame.clone()))
                .unwrap_or_else(|e| panic!("{proto:?}, {what}: no answer: {e:#}"));
            match proto {
                // The ledger says why, typed.
                Proto::Ledger => {
                    let response: LedgerResponse = ledger_wire::decode(&answer).unwrap();
                    assert_eq!(
                        response.refusal(),
                        Some(RefusalCode::Malformed),
                        "{what}: {response:?}"
                    );
                }
                // The lease and receipt protocols answer nothing to what they cannot use.
                _ => assert!(answer.is_empty(), "{proto:?}, {what}: {answer:?}"),
            }
        }
    }
    // The node is unharmed: it answers a well-formed request, and its API works.
    let answer = runtime
        .block_on(rogue.request(
            Proto::Ledger,
            &ledger.peer,
            ledger_wire::encode(&LedgerRequest::Balance(key.public())),
        ))
        .unwrap();
    assert_eq!(
        ledger_wire::decode::<LedgerResponse>(&answer).unwrap(),
        LedgerResponse::Balance(0)
    );
    assert!(ledger.api().status().is_ok());
    assert!(!ledger.log().contains("panicked"), "{}", ledger.log());
}

#[test]
fn a_host_blocked_by_hand_stays_blocked_across_a_restart_until_unblocked() {
    let tmp = tempfile::tempdir().unwrap();
    let mut node = super::market::new_node(tmp.path(), "renter", vec![], vec![]);
    node.spawn();
    let host = gpux_protocol::Keypair::from_seed(&[9; 32])
        .peer_id()
        .to_string();
    let say = |node: &super::market::Node, args: &[&str]| {
        let out = node.gpux(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, text) = say(&node, &["block", &host]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("blocked") && text.contains("skip it"),
        "{text}"
    );
    node.restart();
    let (_, text) = say(&node, &["block", &host]);
    assert!(
        text.contains("already blocked"),
        "kept across the restart: {text}"
    );
    let (_, text) = say(&node, &["block", &host, "--undo"]);
    assert!(text.contains("unblocked"), "{text}");
    let (_, text) = say(&node, &["block", &host, "--undo"]);
    assert!(text.contains("was not blocked"), "{text}");
    let (code, text) = say(&node, &["block", "not-a-peer-id"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("host") && !text.contains("panicked"),
        "{text}"
    );
}
