//! The performance guarantee with real processes: before the work starts the renter's node
//! challenges the leased GPUs (a memory fill of the claimed memory, then a seeded INT8
//! product; blocks and rows of each checked, both timed by itself). The fake GPUs'
//! references are calibrated against the CPU provers in this same run: a genuine fake A100
//! 80GB passes and its work starts; a fake "A100 80GB" that is really an A40 (the fake
//! driver's `really`: 48 GB, the A40's rates) is caught on memory size and on throughput,
//! ends `challenge-failed` and is paid nothing. Challenged again while it runs (`gpux
//! challenge LEASE`), the honest host pauses the workload while it proves and passes; the
//! disguised one, rented without a challenge, is caught while running and its lease ends
//! at once. The honest host's passed challenge,
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

/// Whether `node`'s book shows a free GPU of an offer matching `query`.
fn offered_free(node: &super::market::Node, query: &str) -> bool {
    node.api()
        .offers(query, 5)
        .is_ok_and(|hits| hits.iter().any(|h| h.free >= 1))
}

#[test]
fn an_honest_host_passes_the_challenge_and_a_disguised_a40_is_caught_unpaid() {
    let mut market = Market::start(0, 0, 10);
    market.add_host_of("NVIDIA A100-SXM4-80GB", 85_899_345_920, (8, 0));
    let a40 = "[[gpu]]\nname = \"NVIDIA A100-SXM4-80GB\"\nreally = \"NVIDIA A40\"\nuuid = \"GPU-00000001-0000-3333-4444-555555555555\"\nmemory_total_bytes = 85899345920\ncompute_capability = [8, 0]\n";
    market.add_host_config_in(a40, "us-east");
    market.add_renter(&gpux_testnet::orders::fake_references(&["a100"]));
    // A second renter, for the re-challenges at the end: its A100 references fill no
    // memory (a millionth of it), so that a challenge takes a quarter second.
    market.add_renter(&[
        "--challenge-reference".to_string(),
        format!(
            "a100={},{},0.000001",
            312_000.0 * gpux_attestation::spec::FAKE_TENSOR_SCALE * 0.8,
            1.0
        ),
    ]);
    let renter = &market.renters[0];
    wait_for("the genuine A100 offered again", 30, || {
        offered_free(renter, "gpu=a100 region=eu-west")
    });
    let before = market.balance(renter);
    let rent = |query: &str| {
        let options = ["--challenge", "--max-price", "5", "--duration", "60"];
        market.rent_output(renter, query, &options, "echo challenged work; sleep 8")
    };

    let out = rent("gpu=a100 region=eu-west");
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
    // It filled 90% of its claimed 80 GB, scaled as fake GPUs are, at its reference
    // bandwidth.
    let fill = 80e9 * 0.9 * gpux_attestation::spec::FAKE_MEMORY_SCALE;
    assert!(
        (passed.fill_bytes as f64) <= fill && passed.fill_bytes as f64 > 0.95 * fill,
        "{passed:?}"
    );
    assert!(
        passed.achieved_gbs >= 0.9 * passed.reference_gbs.unwrap(),
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
    // The renter downloaded the rows and blocks it checked, not the product or the fill:
    // 128 rows with their paths, 64 blocks with their inputs and paths.
    let depth = |leaves: f64| (leaves as u64).next_power_of_two().trailing_zeros() as u64;
    assert_eq!(passed.rows_checked as f64, dims[0].min(128.0), "{passed:?}");
    let rows = u64::from(passed.rows_checked) * (4 * dims[2] as u64 + 32 * depth(dims[0]));
    let blocks = 3 * 64 * (1024 + 32 * depth(passed.fill_bytes as f64 / 1024.0));
    assert_eq!(passed.opened_bytes, rows + blocks, "{passed:?}");
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

    // The disguised A40 holds 60% of the fill and runs at the A40's rates: caught on both.
    let out = rent("gpu=a100 region=us-east");
    assert!(!out.status.success(), "the disguised A40 was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("failed the performance challenge"), "{err}");
    assert!(
        err.contains("memory: block") && err.contains("the claimed memory was not filled"),
        "{err}"
    );
    assert!(err.contains("tensor throughput: "), "{err}");
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
        offered_free(renter, "gpu=a100 region=us-east")
    });
    let out = market.rent_output(
        renter,
        "gpu=a100 region=us-east",
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
    // A receipt acknowledged first, so that the lease has run something to pay for (a
    // running lease is challenged on the product alone: it is caught within a second).
    wait_for("a receipt of the slow work", 30, || {
        slow.lease(&running.lease).acked_seq >= 1
    });
    let out = renter.gpux(&["challenge", &running.lease]);
    assert!(
        !out.status.success(),
        "the disguised A40 passed while running"
    );
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
        || challenged(renter, "gpu=a100 region=eu-west tier>=challenged"),
    );
    wait_for(
        "the honest host's offer to be challenged, for a third node",
        30,
        || challenged(&market.ledger, "gpu=a100 region=eu-west tier>=challenged"),
    );
    assert!(!challenged(renter, "gpu=a100 region=us-east"));

    // Challenged again at random while it runs (`--challenge-every`), by the second renter:
    // a quarter-second challenge may come every 25 s at 1% of the time; the disguised host
    // is caught at its first re-challenge and the lease ends.
    let again = &market.renters[1];
    wait_for(
        "the disguised host's GPU offered to the second renter",
        60,
        || offered_free(again, "gpu=a100 region=us-east"),
    );
    let out = market.rent_output(
        again,
        "gpu=a100 region=us-east",
        &[
            "--max-price",
            "5",
            "--duration",
            "120",
            "--challenge-every",
            "1s",
        ],
        "echo watched work; sleep 110",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let watched: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    // Widened to a hundred times a quarter-second challenge.
    assert_eq!(watched.challenge_every_s, Some(25), "{watched:?}");
    let caught_in_time = (0..300).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(200));
        slow.lease(&watched.lease).settled
    });
    assert!(
        caught_in_time,
        "no re-challenge caught the disguised host within 60 s; the renter's re-challenges:\n{}",
        again
            .log()
            .lines()
            .filter(|l| l.contains("challenge"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let ended = slow.lease(&watched.lease);
    assert_eq!(ended.end.as_deref(), Some("challenge-failed"), "{ended:?}");

    // Ten more times while two busy loops keep both cores loaded: the disguise fails on
    // memory every time, since what catches it does not depend on the machine's speed.
    struct Busy(Vec<std::process::Child>);
    impl Drop for Busy {
        fn drop(&mut self) {
            for child in &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let _busy = Busy(
        (0..2)
            .map(|_| {
                std::process::Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("starting a busy loop")
            })
            .collect(),
    );
    for run in 0..10 {
        wait_for("the disguised host's GPU offered again", 60, || {
            offered_free(renter, "gpu=a100 region=us-east")
        });
        // A host still proving a challenge the renter gave up on refuses the next one.
        let mut out = rent("gpu=a100 region=us-east");
        for _ in 0..30 {
            if !String::from_utf8_lossy(&out.stderr).contains("another challenge runs") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
            out = rent("gpu=a100 region=us-east");
        }
        assert!(
            !out.status.success(),
            "run {run}: the disguise passed under load"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        // The fill's blocks, or its time: the memory part fails.
        assert!(err.contains("(memory: "), "run {run}: {err}");
    }
}
