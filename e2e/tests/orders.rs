//! Every kind of order with real processes, real Docker and a real ledger.
//!
//! Spot: an on-demand rent preempts a spot lease after its notice; the workload sees the
//! notice file and SIGTERM, its container is gone by the notice's end, it pays the seconds
//! it ran at its bid with no minimum, and the on-demand lease starts on the freed GPU once
//! the notice has run out. Reserved: a window booked ahead starts and ends on time, and no
//! other lease gets its GPU meanwhile; one cancelled before its start pays the host's
//! published share of its committed minimum.

use gpux_protocol::{MicroCredits, money};

use gpux_testnet::orders::PATIENT;

use super::market::{Market, SPOT_NOTICE_S, docker_containers, wait_for};

/// The spot bid, credits per GPU-hour (the test hosts' floor is 1.00, on-demand 3.60).
const BID: &str = "2.00";

#[test]
fn an_on_demand_rent_preempts_a_spot_lease_which_sees_the_notice_and_pays_no_minimum() {
    let market = Market::start(1, 2, 10);
    let (host, spot_renter, od_renter) = (&market.hosts[0], &market.renters[0], &market.renters[1]);

    // A spot lease at the bid.
    let out = spot_renter.gpux(&[
        "rent",
        "gpu=l4",
        "--spot",
        "--max-price",
        BID,
        "--duration",
        "300",
        "--image",
        &market.image,
        "--json",
        "--",
        "sh",
        "-c",
        PATIENT,
    ]);
    assert!(
        out.status.success(),
        "spot rent failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spot: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    let spot = spot.lease;
    let view = host.lease(&spot);
    assert_eq!(view.kind, "spot");
    assert_eq!(view.price_per_gpu_hour_micro, 2_000_000);
    wait_for("the spot workload to start", 20, || {
        spot_renter
            .api()
            .logs(&spot, 0)
            .is_ok_and(|p| p.text.contains("started"))
    });
    // Its GPU stays in the market: an on-demand renter finds it.
    wait_for("the spot-held GPU to stay offered", 20, || {
        od_renter
            .api()
            .offers("gpu=l4", 10)
            .is_ok_and(|hits| hits.iter().any(|h| h.free >= 1))
    });

    // An on-demand rent takes the GPU: accepted at once, its container waits.
    let od = market.rent(od_renter, 60, "echo on-demand started; sleep 5");
    let od_view = host.lease(&od);
    assert_eq!(od_view.kind, "on-demand");
    assert!(od_view.starts_at > od_view.since, "{od_view:?}");

    // The spot lease gets its notice; the workload sees the file, then SIGTERM.
    wait_for("the spot lease to be preempted", 30, || {
        let view = host.lease(&spot);
        view.end.as_deref() == Some("preempted") && view.finished_at.is_some()
    });
    let ended = host.lease(&spot);
    let until = ended.preempted_until.expect("the notice's end");
    let finished = ended.finished_at.expect("the container's end");
    let started = ended.started_at.expect("the container's start");
    assert!(
        finished <= until + 1_500,
        "the container ran past the notice: finished {finished}, notice ends {until}"
    );
    wait_for("the renter to hear of the notice", 10, || {
        spot_renter.lease(&spot).preempted_until == Some(until)
    });
    let seen = spot_renter.lease(&spot);
    assert!(!seen.notice_refused);
    let table = String::from_utf8(spot_renter.gpux(&["leases"]).stdout).unwrap();
    let line = table
        .lines()
        .find(|l| l.contains(&spot))
        .unwrap_or_default();
    assert!(
        line.contains("spot") && line.contains("preempted: notice ends at"),
        "{table}"
    );
    wait_for("the workload's last words", 10, || {
        spot_renter.api().logs(&spot, 0).is_ok_and(|p| {
            p.text.contains("notice seen")
                && p.text.contains("got TERM")
                && p.text.contains("\"action\":\"terminate\"")
        })
    });
    let text = spot_renter.api().logs(&spot, 0).unwrap().text;
    let seen_at = text.find("notice seen").unwrap();
    assert!(seen_at < text.find("got TERM").unwrap(), "{text}");

    // It pays the seconds it ran at its bid, with no 60 s minimum.
    wait_for("the spot lease to settle", 30, || host.lease(&spot).settled);
    let paid = host.lease(&spot).redeemed;
    let ran_s = (finished - started) / 1000;
    assert!(ran_s < 60, "ran {ran_s} s");
    let cost = |s: u64| money::cost(s, MicroCredits(2_000_000)).unwrap().0;
    assert!(
        paid <= cost(ran_s) && paid >= cost(ran_s.saturating_sub(2)),
        "paid {paid} for {ran_s} s at the bid (a minimum would be {})",
        cost(60)
    );
    wait_for("the spot container to be erased", 20, || {
        docker_containers(&spot).is_empty()
    });

    // The on-demand lease starts on the freed GPU, once the notice has run out.
    wait_for("the on-demand lease to start", 30, || {
        host.lease(&od).started_at.is_some()
    });
    let od_view = host.lease(&od);
    let od_started = od_view.started_at.unwrap();
    assert!(
        od_started >= finished,
        "started {od_started} before the spot lease ended {finished}"
    );
    assert!(od_started >= od_view.starts_at - 1_000, "{od_view:?}");
    assert!(
        od_started >= until,
        "the notice ({} s) had not run out",
        SPOT_NOTICE_S
    );
    // Once the GPU is offered again, the spot renter sees the host's interruption rate: it
    // preempted its one spot lease.
    wait_for(
        "the host's interruption rate, once its GPU is offered again",
        40,
        || {
            spot_renter.api().offers("gpu=l4", 10).is_ok_and(|hits| {
                hits.iter().any(|h| {
                    h.host.peer_id().to_string() == host.peer
                        && h.interruption_permille == Some(1000)
                })
            })
        },
    );

    market.assert_conserved();
}

#[test]
fn a_reserved_window_booked_ahead_runs_from_its_start_to_its_end_and_no_one_else_gets_its_gpu() {
    let market = Market::start(1, 2, 10);
    let (host, renter, other) = (&market.hosts[0], &market.renters[0], &market.renters[1]);
    let out = renter.gpux(&[
        "rent",
        "gpu=l4",
        "--max-price",
        "5",
        "--start",
        "+20s",
        "--end",
        "+40s",
        "--image",
        &market.image,
        "--json",
        "--",
        "sh",
        "-c",
        "echo reserved; while true; do sleep 1; done",
    ]);
    assert!(
        out.status.success(),
        "reserved rent failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rented: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    let start = rented
        .starts_at_ms
        .expect("a window ahead says when it starts");
    let view = host.lease(&rented.lease);
    assert_eq!(view.kind, "reserved");
    assert_eq!(view.starts_at, start);
    let end = start + u64::from(view.duration_s) * 1000;
    assert!((19..=21).contains(&view.duration_s), "{view:?}");

    // No other lease gets the GPU for a time that overlaps the window.
    let taken = other.gpux(&["rent", "gpu=l4", "--max-price", "5", "--duration", "60"]);
    assert!(!taken.status.success(), "an overlapping lease was granted");

    // It starts within 2 s of the window's start and ends at its end.
    wait_for("the reserved window to start", 40, || {
        host.lease(&rented.lease).started_at.is_some()
    });
    let started = host.lease(&rented.lease).started_at.unwrap();
    assert!(
        started >= start && started <= start + 2_000,
        "started at {started}, the window at {start}"
    );
    wait_for("the reserved window to end", 40, || {
        host.lease(&rented.lease).finished_at.is_some()
    });
    let ended = host.lease(&rented.lease);
    let finished = ended.finished_at.unwrap();
    assert!(
        finished <= end + 2_000,
        "ran until {finished}, the window ends at {end}"
    );
    assert_eq!(ended.end.as_deref(), Some("duration-reached"), "{ended:?}");
    wait_for("the reserved lease to settle", 30, || {
        host.lease(&rented.lease).settled
    });
    market.assert_conserved();

    // A window committed to for 10 s and cancelled before its start pays the host's
    // published share of that minimum (the default schedule: all of it within 10 minutes
    // of the start), and nothing runs.
    let before = market.balance(other);
    let mut out = None;
    // (Once the renter's book has the GPU free again.)
    wait_for("a window to be booked", 20, || {
        let o = market.rent_output(
            other,
            "gpu=l4",
            &[
                "--max-price",
                "5",
                "--start",
                "+20s",
                "--end",
                "+40s",
                "--committed",
                "10s",
            ],
            "sleep 60",
        );
        let ok = o.status.success();
        if !ok {
            eprintln!("rent: {}", String::from_utf8_lossy(&o.stderr));
        }
        out = Some(o);
        ok
    });
    let window: gpux_api::Rented = serde_json::from_slice(&out.unwrap().stdout).unwrap();
    assert!(other.gpux(&["stop", &window.lease]).status.success());
    wait_for("the cancelled window to settle", 30, || {
        let view = other.lease(&window.lease);
        view.settled && host.lease(&window.lease).settled
    });
    let cancelled = host.lease(&window.lease);
    assert_eq!(
        cancelled.end.as_deref(),
        Some("renter-stopped"),
        "{cancelled:?}"
    );
    assert!(cancelled.started_at.is_none(), "{cancelled:?}");
    let price: MicroCredits = window.price_per_gpu_hour.parse().unwrap();
    let fee = money::cost(10, price).unwrap();
    assert_eq!(before - market.balance(other), fee.0);
    market.assert_conserved();
}

#[test]
fn a_held_lease_takes_files_in_before_its_work_starts_on_commit_and_costs_nothing_uncommitted() {
    let market = Market::start(1, 1, 10);
    let (host, renter) = (&market.hosts[0], &market.renters[0]);
    let before = market.balance(renter);

    // Held: the escrow is locked and the GPU booked, but nothing runs yet.
    let options = [
        "--max-price",
        "5",
        "--duration",
        "60",
        "--disk",
        "32MiB",
        "--retain",
        "2s",
        "--hold",
        "60s",
    ];
    let out = market.rent_output(
        renter,
        "gpu=l4",
        &options,
        "cat /workspace/input.txt && echo work-done",
    );
    assert!(
        out.status.success(),
        "held rent failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    let lease = held.lease;
    let by = held
        .commit_by_ms
        .expect("a held lease says by when to commit");
    assert!(by > held.starts_at_ms.unwrap_or(0), "{by}");
    assert_eq!(renter.lease(&lease).phase, "held");
    assert!(host.lease(&lease).started_at.is_none());
    assert!(docker_containers(&lease).is_empty());

    // The input goes in first; then the commit starts the work, which reads it.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.txt");
    std::fs::write(&input, "seeded before the start\n").unwrap();
    let cp = renter.gpux(&[
        "cp",
        input.to_str().unwrap(),
        &format!("{lease}:/workspace/input.txt"),
    ]);
    assert!(
        cp.status.success(),
        "{}",
        String::from_utf8_lossy(&cp.stderr)
    );
    assert!(host.lease(&lease).started_at.is_none());
    let commit = renter.gpux(&["commit", &lease]);
    assert!(
        commit.status.success(),
        "{}",
        String::from_utf8_lossy(&commit.stderr)
    );
    wait_for("the committed work to read its input", 30, || {
        renter.api().logs(&lease, 0).is_ok_and(|p| {
            p.text.contains("seeded before the start") && p.text.contains("work-done")
        })
    });
    assert!(!renter.gpux(&["commit", &lease]).status.success());
    wait_for("the committed lease to settle", 30, || {
        host.lease(&lease).settled
    });

    // A held lease never committed ends when its hold runs out: nothing runs, nothing is
    // paid, its workspace goes at once.
    let options = [
        "--max-price",
        "5",
        "--duration",
        "60",
        "--disk",
        "32MiB",
        "--hold",
        "3s",
    ];
    let out = market.rent_output(renter, "gpu=l4", &options, "echo never");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let idle: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    let workspace = host.dir.join("workspaces").join(&idle.lease);
    wait_for("the held workspace", 10, || workspace.exists());
    wait_for("the uncommitted lease to end and settle", 30, || {
        let view = host.lease(&idle.lease);
        view.end.as_deref() == Some("not-committed") && view.settled
    });
    let view = host.lease(&idle.lease);
    assert!(view.started_at.is_none() && view.redeemed == 0, "{view:?}");
    wait_for("the renter to hear of it", 10, || {
        renter.lease(&idle.lease).end.as_deref() == Some("not-committed")
    });
    wait_for("the uncommitted workspace to go", 10, || {
        !workspace.exists()
    });
    assert!(docker_containers(&idle.lease).is_empty());
    // A held lease without a workspace takes no file before its commit, and says why.
    // (Rented once the host offers its GPU again, after the lease above.)
    let options = ["--max-price", "5", "--duration", "60", "--hold", "3s"];
    let mut out = None;
    wait_for("the GPU to be offered again", 30, || {
        let o = market.rent_output(renter, "gpu=l4", &options, "echo never");
        let rented = o.status.success();
        out = Some(o);
        rented
    });
    let out = out.unwrap();
    let bare: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    let cp = renter.gpux(&[
        "cp",
        input.to_str().unwrap(),
        &format!("{}:/workspace/input.txt", bare.lease),
    ]);
    let said = String::from_utf8_lossy(&cp.stderr);
    assert!(!cp.status.success());
    assert!(
        said.contains("waits for its commit") && said.contains("rent with --disk"),
        "{said}"
    );
    wait_for("the bare held lease to end and settle", 30, || {
        renter.lease(&bare.lease).settled
    });
    // The renter paid for the committed lease's minute only.
    wait_for("the renter's escrows to come back", 30, || {
        renter.lease(&idle.lease).settled
    });
    let paid = host.lease(&lease).redeemed;
    assert_eq!(market.balance(renter), before - paid);
    market.assert_conserved();
}

#[test]
fn concurrent_rents_from_one_renter_and_from_two_all_get_a_gpu_each() {
    let market = Market::start_with(1, 8, 2, 30);
    let (a, b) = (&market.renters[0], &market.renters[1]);
    // Rents fired at once; each outcome as the renter's JSON, or its error.
    let fire = |rents: &[&super::market::Node]| -> Vec<Result<gpux_api::Rented, String>> {
        let children: Vec<_> = rents
            .iter()
            .map(|renter| {
                renter
                    .gpux_command(&[
                        "rent",
                        "gpu=l4",
                        "--max-price",
                        "5",
                        "--duration",
                        "300",
                        "--image",
                        &market.image,
                        "--json",
                        "--",
                        "sleep",
                        "300",
                    ])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        children
            .into_iter()
            .map(|child| {
                let out = child.wait_with_output().unwrap();
                if out.status.success() {
                    Ok(serde_json::from_slice(&out.stdout).unwrap())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).into_owned())
                }
            })
            .collect()
    };
    let distinct_gpus = |rented: &[gpux_api::Rented]| {
        let gpus: std::collections::BTreeSet<&String> =
            rented.iter().flat_map(|r| &r.gpus).collect();
        gpus.len()
    };
    // Six at once from one renter node on one free 8-GPU host: six leases, six GPUs.
    let one: Vec<_> = fire(&[a; 6]).into_iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(distinct_gpus(&one), 6);
    for r in &one {
        assert!(a.gpux(&["stop", &r.lease]).status.success());
    }
    wait_for("the six leases to end on the host", 60, || {
        market.hosts[0]
            .leases()
            .iter()
            .all(|l| l.phase == "ended" || l.phase == "settled")
    });
    // Two renters, four each at once, for the host's eight GPUs: they collide on the same
    // best GPUs, and the host's refusals name the free ones, asked for again at once.
    let both = fire(&[a, a, a, a, b, b, b, b]);
    let rented: Vec<_> = both
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .cloned()
        .collect();
    let failed: Vec<_> = both.iter().filter_map(|r| r.as_ref().err()).collect();
    eprintln!("two renters, eight rents at once: {} leases", rented.len());
    assert!(rented.len() >= 7, "{} of 8: {failed:?}", rented.len());
    assert_eq!(distinct_gpus(&rented), rented.len());
}

#[test]
fn forty_two_rents_at_once_from_three_renters_on_three_16_gpu_hosts_with_a_replicated_ledger() {
    // The acceptance run of `gpux testnet rent-bench` (docs/benchmarks.md has the levels).
    let config = gpux_testnet::rent_bench::RentBenchConfig {
        gpux: std::path::PathBuf::from(gpux_e2e::gpux()),
        hosts: 3,
        gpus_per_host: 16,
        renters: 3,
        ledgers: 3,
        burst: 42,
        levels: Vec::new(),
        samples: 0,
        restart: false,
        base_dir: None,
    };
    let report = gpux_testnet::rent_bench::run(&config, |line| eprintln!("{line}")).unwrap();
    let burst = report.burst.expect("the burst ran");
    eprintln!("{burst:#?}");
    assert!(burst.leased >= 40, "{burst:#?}");
    assert_eq!(burst.gpus_twice, 0, "{burst:#?}");
}
