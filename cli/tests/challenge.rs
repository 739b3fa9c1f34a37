//! The performance guarantee with real processes: before the work starts the renter's node
//! challenges the leased GPUs (a seeded product checked with Freivalds, timed by itself).
//! The fake GPUs' reference rates are calibrated against the CPU prover in this same run: an
//! honest fake L4 passes and its work starts; a host whose fake GPUs claim to be H100s, ten
//! times faster than its prover sustains, is caught, ends `challenge-failed` and is paid
//! nothing. Challenged again while it runs (`gpux challenge LEASE`), the honest host pauses
//! the workload while it proves and passes; the slow one, rented without a challenge, is
//! caught while running and its lease ends at once. The honest host's passed challenge,
//! once its lease has paid, is published: its offers claim the `challenged` tier, which a
//! node that never rented grants on the evidence.

use super::market::{Market, wait_for};

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// What Docker did to `lease`'s container since `since` (unix seconds): `pause`,
/// `unpause`, ...
fn docker_actions(lease: &str, since: u64) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args([
            "events",
            "--since",
            &since.saturating_sub(1).to_string(),
            "--until",
            &(unix_now() + 1).to_string(),
            "--filter",
            &format!("label=gpux.lease={lease}"),
            "--format",
            "{{.Action}}",
        ])
        .output()
        .expect("running docker events");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn an_honest_host_passes_the_challenge_and_one_claiming_a_faster_model_is_caught_unpaid() {
    let rate = gpux_testnet::orders::cpu_prover_gops();
    let mut market = Market::start(1, 0, 10);
    market.add_host_of("NVIDIA H100 80GB HBM3", 85_899_345_920, (9, 0));
    // The honest fake L4's reference is well within the prover's rate; an H100's is ten
    // times what the prover sustains.
    market.add_renter(&gpux_testnet::orders::challenge_references(rate, "l4"));
    let renter = &market.renters[0];
    let before = market.balance(renter);
    let rent = |query: &str| {
        let options = ["--challenge", "--max-price", "5", "--duration", "60"];
        market.rent_output(renter, query, &options, "echo challenged work; sleep 8")
    };

    let out = rent("gpu=l4");
    assert!(
        out.status.success(),
        "the honest host was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rented: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    let passed = rented.challenge.expect("the challenge it passed");
    assert!(
        passed.achieved_gops >= 0.9 * passed.reference_gops,
        "{passed:?}"
    );
    // Sized to dwarf the round trip: at least 20 of them at the reference rate.
    let dims: Vec<f64> = passed
        .shape
        .split(" x ")
        .map(|d| d.parse().unwrap())
        .collect();
    let compute_ms = 2.0 * dims.iter().product::<f64>() / (passed.reference_gops * 1e6);
    assert!(compute_ms >= 20.0 * passed.round_trip_ms, "{passed:?}");
    // The renter downloaded the rows it checked, not the product.
    assert_eq!(passed.rows_checked as f64, dims[0].min(128.0), "{passed:?}");
    let path = (dims[0] as u64).next_power_of_two().trailing_zeros() as u64;
    assert_eq!(
        passed.opened_bytes,
        u64::from(passed.rows_checked) * (4 * dims[2] as u64 + 32 * path),
        "{passed:?}"
    );
    wait_for("the challenged work to run", 30, || {
        renter
            .api()
            .logs(&rented.lease, 0)
            .is_ok_and(|p| p.text.contains("challenged work"))
    });

    // Challenged again while it runs: the host freezes the workload while it proves.
    let since = unix_now();
    let out = renter.gpux(&["challenge", &rented.lease, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: gpux_api::ChallengePassed = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        again.achieved_gops >= 0.9 * again.reference_gops,
        "{again:?}"
    );
    let actions = docker_actions(&rented.lease, since);
    assert!(
        actions.contains(&"pause".to_string()) && actions.contains(&"unpause".to_string()),
        "{actions:?}"
    );
    assert!(
        renter.lease(&rented.lease).end.is_none(),
        "a passed challenge ended the lease"
    );

    // The H100 host answers right but at a third of its model's rate: caught.
    let out = rent("gpu=h100");
    assert!(!out.status.success(), "the slow H100 was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("failed the performance challenge"), "{err}");
    let slow = &market.hosts[1];
    let caught = slow.api().leases().unwrap();
    assert_eq!(caught.len(), 1, "{caught:?}");
    let caught = &caught[0];
    wait_for("the caught lease to settle", 30, || {
        slow.lease(&caught.lease).settled
    });
    let ended = slow.lease(&caught.lease);
    assert_eq!(ended.end.as_deref(), Some("challenge-failed"), "{ended:?}");
    assert!(
        ended.started_at.is_none() && ended.redeemed == 0,
        "{ended:?}"
    );
    assert_eq!(
        renter.lease(&caught.lease).end.as_deref(),
        Some("challenge-failed")
    );

    // Rented without a challenge, the slow host's lease runs; challenged while running, it
    // is caught and ends at once, paid for what ran (not its 60 s).
    wait_for("the slow host's GPU offered again", 30, || {
        renter
            .api()
            .offers("gpu=h100", 5)
            .is_ok_and(|hits| hits.iter().any(|h| h.free >= 1))
    });
    let out = market.rent_output(
        renter,
        "gpu=h100",
        &["--max-price", "5", "--duration", "60"],
        "echo slow work; sleep 50",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let running: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    wait_for("the slow host's work to run", 30, || {
        renter
            .api()
            .logs(&running.lease, 0)
            .is_ok_and(|p| p.text.contains("slow work"))
    });
    let out = renter.gpux(&["challenge", &running.lease]);
    assert!(!out.status.success(), "the slow H100 passed while running");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("failed the performance challenge"), "{err}");
    wait_for("the caught running lease to settle", 40, || {
        slow.lease(&running.lease).settled
    });
    let ended = slow.lease(&running.lease);
    assert_eq!(ended.end.as_deref(), Some("challenge-failed"), "{ended:?}");
    assert_eq!(
        renter.lease(&running.lease).end.as_deref(),
        Some("challenge-failed")
    );
    let slow_paid = ended.redeemed;
    assert!(slow_paid > 0, "{ended:?}");

    // The renter paid the honest lease, and the slow one's time until it was caught.
    wait_for("the honest lease to settle", 60, || {
        market.hosts[0].lease(&rented.lease).settled
    });
    let paid = market.hosts[0].lease(&rented.lease).redeemed + slow_paid;
    assert!(paid > slow_paid);
    wait_for("the renter's escrows to close", 30, || {
        market.ledger_state().open_escrows == 0
    });
    assert_eq!(market.balance(renter), before - paid);
    market.assert_conserved();

    // The passed challenge, once its lease paid the host, is published with the ledger's
    // records: the honest host's offer claims the challenged tier, and a third node (the
    // ledger's, which never rented) holds the evidence for it. The slow host earns nothing.
    let challenged = |node: &super::market::Node, query: &str| {
        node.api().offers(query, 5).is_ok_and(|hits| {
            hits.iter()
                .any(|h| h.tier == gpux_protocol::EvidenceTier::Challenged)
        })
    };
    wait_for(
        "the honest host's offer to be challenged, for the renter",
        60,
        || challenged(renter, "gpu=l4 tier>=challenged"),
    );
    wait_for(
        "the honest host's offer to be challenged, for a third node",
        30,
        || challenged(&market.ledger, "gpu=l4 tier>=challenged"),
    );
    assert!(!challenged(renter, "gpu=h100"));
}
