//! Leases end to end, with real processes, real Docker and a real ledger node: the container
//! as inspected, logs at the renter, stop, settlement, and the chaos cases (renter killed,
//! host killed, ledger restarted, restarts that resume). Every test checks that credits are
//! conserved exactly.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::market::{
    FAUCET_MICRO, LEDGER_GRACE_S, Market, Node, RECEIPT_INTERVAL_S, docker_containers,
    docker_inspect, docker_volumes, wait_for,
};

/// A workload that prints a line every second until stopped.
const TICKER: &str =
    "echo hello from gpux; i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done";

fn end(lease: &gpux_api::LeaseView) -> &str {
    lease.end.as_deref().unwrap_or("")
}

#[test]
fn a_lease_runs_hardened_streams_logs_stops_and_settles_and_the_ledger_survives_a_restart() {
    let market = Market::start(1, 1, 10);
    let (host, renter) = (&market.hosts[0], &market.renters[0]);
    let lease = market.rent(renter, 300, TICKER);

    // The container, as Docker reports it.
    let ids = docker_containers(&lease);
    assert_eq!(ids.len(), 1, "one container per lease");
    let c = docker_inspect(&ids[0]);
    let hc = &c["HostConfig"];
    assert_eq!(hc["CapDrop"], serde_json::json!(["ALL"]), "{hc}");
    assert!(hc["CapAdd"].is_null() || hc["CapAdd"] == serde_json::json!([]));
    assert!(
        hc["SecurityOpt"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o.as_str().unwrap().starts_with("no-new-privileges")),
        "{hc}"
    );
    assert_eq!(hc["ReadonlyRootfs"], true);
    assert_eq!(hc["NetworkMode"], "none");
    // The GPU's share of the host's machine, as its offer publishes it.
    let out = renter.gpux(&["offers", "search", "", "--json"]);
    let hits: Vec<gpux_api::OfferHit> = serde_json::from_slice(&out.stdout).unwrap();
    let share = hits[0].machine.share;
    assert_eq!(hc["Memory"], share.memory_bytes);
    assert_eq!(
        hc["MemorySwap"], share.memory_bytes,
        "no swap beyond the limit"
    );
    assert_eq!(
        hc["CpuQuota"].as_u64().unwrap() * 1000 / hc["CpuPeriod"].as_u64().unwrap(),
        u64::from(share.cpu_millis)
    );
    assert_eq!(hc["ShmSize"], share.memory_bytes / 2);
    assert_eq!(
        hc["PidsLimit"],
        u64::from(share.cpu_millis.div_ceil(1000)).max(1) * 1024
    );
    assert!(hc["Binds"].is_null(), "no host paths: {}", hc["Binds"]);
    assert!(hc["Tmpfs"]["/scratch"].is_string(), "{}", hc["Tmpfs"]);
    assert_eq!(c["Config"]["Labels"]["gpux.lease"], lease.as_str());
    assert_eq!(c["Config"]["Labels"]["gpux.node"], host.peer.as_str());
    assert_eq!(c["Config"]["User"], "65534:65534");
    assert!(
        !c["Mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["Source"].as_str().unwrap_or("").contains("docker.sock")),
        "never the Docker socket"
    );
    for m in c["Mounts"].as_array().unwrap() {
        assert_eq!(m["Destination"], "/run/gpux/busybox", "{m}");
        assert_eq!(m["RW"], false, "{m}");
    }

    // Its output reaches the renter.
    wait_for("the logs at the renter", 20, || {
        let out = renter.gpux(&["logs", &lease]);
        let text = String::from_utf8_lossy(&out.stdout);
        text.contains("hello from gpux") && text.contains("tick 2")
    });
    // The host announced its receipt timing in its acceptance (1 s interval, 10 s grace);
    // the renter, on the default settings, keeps it for its watchdog.
    let rented = renter.lease(&lease);
    assert_eq!(
        (rented.receipt_interval_ms, rented.ack_grace_ms),
        (1000, 10000)
    );
    // Receipts flow and are acknowledged.
    wait_for("two acknowledged receipts", 20, || {
        renter.lease(&lease).acked_seq >= 2
    });
    // The ledger node restarts mid-lease: balances and escrows intact.
    let before = market.ledger_state();
    let mut market = market;
    market.ledger.restart();
    let after = market.ledger_state();
    assert_eq!(before.balances, after.balances);
    assert_eq!(before.open_escrows, after.open_escrows);
    assert_eq!(after.open_escrows, 1);
    market.assert_conserved();
    let (host, renter) = (&market.hosts[0], &market.renters[0]);

    // The renter stops it.
    let stop = renter.gpux(&["stop", &lease]);
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    wait_for("the lease to settle on both sides", 30, || {
        renter.phase(&lease) == "settled" && host.phase(&lease) == "settled"
    });
    let hosted = host.lease(&lease);
    assert_eq!(end(&hosted), "renter-stopped", "{hosted:?}");
    assert_eq!(
        end(&renter.lease(&lease)),
        "renter-stopped",
        "both sides name one end"
    );
    assert!(
        docker_containers(&lease).is_empty(),
        "the container is erased"
    );
    assert!(docker_volumes(&lease).is_empty(), "its volumes are erased");
    // The bill: 1 GPU at 1000 µcr/s, under a minute: the 60-second minimum.
    let runtime_ms = hosted.finished_at.unwrap() - hosted.started_at.unwrap();
    let expected = 1000 * (runtime_ms / 1000).max(60);
    assert_eq!(hosted.redeemed, expected, "{hosted:?}");
    assert_eq!(market.balance(host), FAUCET_MICRO + expected);
    assert_eq!(market.balance(renter), FAUCET_MICRO - expected);
    market.assert_conserved();
    assert_eq!(market.ledger_state().open_escrows, 0);
    // The renter's receipts: the last acknowledged one is what was paid.
    let out = renter.gpux(&["receipts", &lease, "--json"]);
    let receipts: Value = serde_json::from_slice(&out.stdout).unwrap();
    let last = receipts["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|r| r["acked"] == true)
        .unwrap()
        .clone();
    assert_eq!(last["amount_due_micro"].as_u64().unwrap(), expected);
    // Metering read the leased GPU through NVML (the fake driver says 87% busy) and the
    // container's own statistics. Usage is cumulative, so the paid receipt averages every
    // sample (the first receipt may be signed before the first sample is in).
    assert_eq!(last["gpu_util_permille"], 870, "{last}");
    assert!(last["memory_peak_bytes"].as_u64().unwrap() > 0, "{last}");
    // `logs --follow` ends once the lease has.
    let follow = renter.gpux(&["logs", "--follow", &lease]);
    assert!(follow.status.success());
    assert!(String::from_utf8_lossy(&follow.stdout).contains("tick 1"));
    // The balance command.
    let balance = renter.gpux(&["balance", "--json"]);
    let balance: Value = serde_json::from_slice(&balance.stdout).unwrap();
    assert_eq!(balance["balance_micro"], FAUCET_MICRO - expected);
}

#[test]
fn a_killed_renter_gets_its_lease_stopped_and_the_host_is_paid_exactly_to_the_last_ack() {
    let grace = 3;
    let mut market = Market::start(1, 1, grace);
    let lease = market.rent(&market.renters[0], 300, TICKER);
    let host = &market.hosts[0];
    wait_for("two acknowledged receipts at the host", 20, || {
        host.lease(&lease).acked_seq >= 2
    });
    market.renters[0].kill9();
    let killed = Instant::now();
    let host = &market.hosts[0];
    wait_for("the host to stop the lease", 30, || {
        end(&host.lease(&lease)) == "receipt-not-acknowledged"
    });
    // Within the grace period (plus the interval in which the missed receipt was sent and
    // the time to notice).
    let bound = Duration::from_secs(grace + RECEIPT_INTERVAL_S + 5);
    assert!(killed.elapsed() <= bound, "took {:?}", killed.elapsed());
    wait_for("the container to go", 20, || {
        docker_containers(&lease).is_empty()
    });
    wait_for("the host to settle", 20, || host.phase(&lease) == "settled");
    let hosted = host.lease(&lease);
    let acked = hosted.acked_amount;
    assert!(acked > 0);
    assert!(
        hosted.last_seq > hosted.acked_seq,
        "receipts went unacknowledged: {hosted:?}"
    );
    assert_eq!(hosted.redeemed, acked, "{hosted:?}");
    assert_eq!(market.balance(host), FAUCET_MICRO + acked);
    assert_eq!(market.balance(&market.renters[0]), FAUCET_MICRO - acked);
    market.assert_conserved();
    assert_eq!(market.ledger_state().open_escrows, 0);
}

#[test]
fn a_killed_host_costs_the_renter_only_acked_receipts_and_never_settles_twice() {
    let (mut market, lease) = lease_with_two_acks();
    market.hosts[0].kill9();
    // The renter notices the silence, waits out the ledger's grace and takes the rest of its
    // escrow back.
    let paid = renter_settles_without_its_host(&market, &lease);
    // The host's container outlived it (SIGKILL); on restart the host finds it by its label,
    // sees the escrow closed, and erases it; nothing is paid twice.
    assert_eq!(docker_containers(&lease).len(), 1);
    market.hosts[0].restart();
    host_back_pays_nothing_twice(&market, &lease, paid);
}

/// One host, one renter, a lease of [`TICKER`] with two receipts acknowledged at the renter
/// (the host waits 10 s for an acknowledgement).
fn lease_with_two_acks() -> (Market, String) {
    let market = Market::start(1, 1, 10);
    let lease = market.rent(&market.renters[0], 300, TICKER);
    let renter = &market.renters[0];
    wait_for("two acknowledged receipts at the renter", 20, || {
        renter.lease(&lease).acked_seq >= 2
    });
    (market, lease)
}

/// The renter of `lease`, its host gone silent, waits out the ledger's grace and takes the
/// rest of its escrow back: its release carried its latest acknowledged receipt, so the
/// host is paid exactly what the renter acknowledged, though it never redeemed it itself.
/// Returns what was paid.
fn renter_settles_without_its_host(market: &Market, lease: &str) -> u64 {
    let renter = &market.renters[0];
    wait_for(
        "the renter to settle without the host",
        40 + LEDGER_GRACE_S,
        || renter.phase(lease) == "settled",
    );
    let rented = renter.lease(lease);
    assert_eq!(end(&rented), "host-silent", "{rented:?}");
    let acked = rented.acked_amount;
    let paid = FAUCET_MICRO - market.balance(renter);
    assert!(
        paid > 0 && paid == acked,
        "paid {paid}, acknowledged {acked}"
    );
    assert_eq!(market.balance(&market.hosts[0]), FAUCET_MICRO + paid);
    market.assert_conserved();
    assert_eq!(market.ledger_state().open_escrows, 0);
    paid
}

/// A host started again after its renter settled `lease` without it (paying `paid`): it
/// erases the container, closes the lease, and is paid nothing twice.
fn host_back_pays_nothing_twice(market: &Market, lease: &str, paid: u64) {
    wait_for("the restarted host to erase the container", 30, || {
        docker_containers(lease).is_empty()
    });
    let host = &market.hosts[0];
    wait_for("the host to close the lease", 20, || {
        host.phase(lease) == "settled"
    });
    assert_eq!(market.balance(host), FAUCET_MICRO + paid, "settled twice");
    assert_eq!(market.balance(&market.renters[0]), FAUCET_MICRO - paid);
    market.assert_conserved();
    assert_eq!(market.ledger_state().open_escrows, 0);
}

/// A host whose disk stops taking writes mid-lease (its database manifest can no longer be
/// replaced: a directory stands where its temporary file goes, so every flushed write
/// fails) stops at once with an error that names its data dir, instead of metering on
/// without records; the renter pays exactly what it acknowledged; once the disk is mended
/// the host comes back and pays nothing twice.
#[test]
fn a_host_whose_store_fails_stops_saying_so_and_the_renter_pays_only_acked_receipts() {
    let (mut market, lease) = lease_with_two_acks();
    let broken = market.hosts[0].dir.join("db.tmp");
    std::fs::create_dir(&broken).unwrap();
    let host = &mut market.hosts[0];
    assert!(
        host.reap(Instant::now() + Duration::from_secs(3 * RECEIPT_INTERVAL_S + 5)),
        "the host ran on with a store that fails: {}",
        {
            let log = market.hosts[0].log();
            log[log.len().saturating_sub(3000)..].to_string()
        }
    );
    let log = host.log();
    assert!(
        log.contains("the node stopped: cannot store")
            && log.contains("the store could not keep a record"),
        "{}",
        &log[log.len().saturating_sub(2000)..]
    );
    let paid = renter_settles_without_its_host(&market, &lease);
    // Mended, the host comes back on its records, finds the escrow closed and erases the
    // container; nothing is paid twice.
    std::fs::remove_dir(&broken).unwrap();
    market.hosts[0].spawn();
    host_back_pays_nothing_twice(&market, &lease, paid);
}

#[test]
fn restarted_hosts_resume_metering_and_restarted_renters_resume_acknowledging() {
    let mut market = Market::start(1, 1, 15);
    let lease = market.rent(&market.renters[0], 30, TICKER);
    let acked = |m: &Market| m.renters[0].lease(&lease).acked_seq;
    wait_for("two acknowledged receipts", 20, || acked(&market) >= 2);
    market.hosts[0].kill9();
    market.hosts[0].restart();
    let at_restart = acked(&market);
    wait_for("receipts after the host's restart", 20, || {
        acked(&market) >= at_restart + 2
    });
    assert!(
        market.hosts[0].log().contains("resuming"),
        "{}",
        market.hosts[0].log()
    );
    market.renters[0].kill9();
    market.renters[0].restart();
    let at_restart = acked(&market);
    wait_for("acknowledgements after the renter's restart", 20, || {
        acked(&market) >= at_restart + 2
    });
    // It runs to its end and settles.
    let host = &market.hosts[0];
    wait_for("the lease to end and settle", 45, || {
        host.phase(&lease) == "settled"
    });
    let hosted = host.lease(&lease);
    assert_eq!(end(&hosted), "duration-reached", "{hosted:?}");
    let runtime_ms = hosted.finished_at.unwrap() - hosted.started_at.unwrap();
    assert!(
        (29_000..31_000).contains(&runtime_ms),
        "ran {runtime_ms} ms for a 30 s lease"
    );
    assert_eq!(hosted.redeemed, 60_000, "the 60 s minimum");
    assert!(docker_containers(&lease).is_empty());
    market.assert_conserved();
}

/// A lease container's identity: its id, and its PID 1's process id and start time (a
/// container started again has another).
fn container_identity(lease: &str) -> String {
    let ids = docker_containers(lease);
    assert_eq!(ids.len(), 1, "one container for {lease}: {ids:?}");
    let out = std::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{.Id}} {{.State.Running}} {{.State.Pid}} {{.State.StartedAt}} {{.RestartCount}}",
            &ids[0],
        ])
        .output()
        .expect("docker inspect");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_host_stopped_and_started_again_mid_lease_keeps_it_running_and_bills_its_runtime() {
    let mut market = Market::start(0, 0, 6);
    market.receipt_interval_s = 2;
    market.add_host();
    market.add_renter(&[]);
    // Longer than the 60 s minimum, which would hide what is billed.
    let lease = market.rent(&market.renters[0], 65, TICKER);
    let acked = |m: &Market| m.renters[0].lease(&lease).acked_seq;
    wait_for("an acknowledged receipt", 20, || acked(&market) >= 1);
    let running = container_identity(&lease);
    assert!(running.contains(" true "), "{running}");
    // SIGTERM (what a service manager sends on a restart or an upgrade): the node exits and
    // the lease's container runs on.
    market.hosts[0].terminate();
    let exited = market.hosts[0].reap(Instant::now() + Duration::from_secs(20));
    assert!(
        exited,
        "the host exits on SIGTERM: {}",
        market.hosts[0].log()
    );
    assert!(
        market.hosts[0].log().contains("keep running"),
        "{}",
        market.hosts[0].log()
    );
    assert_eq!(
        container_identity(&lease),
        running,
        "untouched while the host is down"
    );
    std::thread::sleep(Duration::from_secs(5));
    market.hosts[0].spawn();
    let at_restart = acked(&market);
    wait_for("receipts after the host's restart", 20, || {
        acked(&market) > at_restart
    });
    assert_eq!(
        container_identity(&lease),
        running,
        "the same container, never restarted"
    );
    let (host, renter) = (&market.hosts[0], &market.renters[0]);
    wait_for("the lease to end and settle", 90, || {
        host.phase(&lease) == "settled" && renter.phase(&lease) == "settled"
    });
    let hosted = host.lease(&lease);
    assert_eq!(end(&hosted), "duration-reached", "{hosted:?}");
    assert_eq!(end(&renter.lease(&lease)), "duration-reached");
    // Billed Docker's runtime in whole seconds (1000 µcr a second), no more, no less.
    let runtime_ms = hosted.finished_at.unwrap() - hosted.started_at.unwrap();
    assert!(runtime_ms > 60_000, "{hosted:?}");
    assert_eq!(hosted.redeemed, runtime_ms / 1000 * 1000, "{hosted:?}");
    assert!(docker_containers(&lease).is_empty());
    // The restarted host offers its GPU again once the lease is over.
    wait_for("the GPU offered again after the lease", 15, || {
        renter
            .api()
            .offers("gpu=l4", 5)
            .is_ok_and(|hits| hits.iter().any(|h| h.free >= 1))
    });
    market.assert_conserved();
}

#[test]
fn a_renter_finds_and_rents_and_the_api_needs_its_token() {
    let market = Market::start(1, 1, 10);
    let (host, renter) = (&market.hosts[0], &market.renters[0]);
    let search = renter.gpux(&["offers", "search", "gpu=l4 region=eu", "--json"]);
    assert!(String::from_utf8_lossy(&search.stdout).contains("\"family\": \"l4\""));
    let lease = market.rent(renter, 300, TICKER);
    for node in [renter, host] {
        let out = String::from_utf8(node.gpux(&["leases"]).stdout).unwrap();
        assert!(out.contains(&lease) && out.contains("running"), "{out}");
    }
    // The GPU is taken: a second rent finds nothing.
    let again = renter.gpux(&["rent", "gpu=l4", "--max-price", "5"]);
    assert!(!again.status.success());
    // The host withdraws the leased GPU from the market.
    wait_for("the leased GPU to leave the market", 30, || {
        let out = renter.gpux(&["offers", "search", "gpu=l4", "--json"]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "[]"
    });
    // The API refuses a request without the token (401) or with a wrong one.
    let addr = std::fs::read_to_string(renter.dir.join("api.addr")).unwrap();
    for auth in [None, Some("Bearer 00")] {
        let mut stream = std::net::TcpStream::connect(addr.trim()).unwrap();
        let header = auth
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        use std::io::{Read, Write};
        write!(
            stream,
            "GET /v1/status HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 401"), "{response}");
    }
    api_under_abuse(renter, addr.trim());
    for file in ["node.key", "api.token", "api.addr"] {
        let mode = std::fs::metadata(renter.dir.join(file))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{file}");
    }
    // A host stopped with `gpux node stop --end-leases` ends its leases, erases their
    // containers and settles.
    let mut market = market;
    let stop = market.hosts[0].gpux(&["node", "stop", "--end-leases"]);
    assert!(
        stop.status.success() && String::from_utf8_lossy(&stop.stdout).contains("stopped"),
        "{stop:?}"
    );
    // The command came back once the process had let go of its data dir.
    let exited = market.hosts[0].reap(Instant::now() + Duration::from_secs(1));
    assert!(
        exited && docker_containers(&lease).is_empty(),
        "a host shutting down erases its containers (exited in time: {exited}); its log:\n{}",
        market.hosts[0].log()
    );
    let renter = &market.renters[0];
    wait_for("the renter to settle", 20, || {
        renter.phase(&lease) == "settled"
    });
    assert_eq!(end(&renter.lease(&lease)), "host-shutdown");
    market.assert_conserved();
    assert_eq!(market.ledger_state().open_escrows, 0);
}

#[test]
fn a_standing_bid_runs_its_image_and_command_when_a_host_appears_and_says_why_it_waited() {
    let mut market = Market::start(0, 1, 10);
    let image = market.image.clone();
    let renter = &market.renters[0];
    let bids = |r: &super::market::Node| -> Vec<gpux_api::BidView> {
        let out = r.gpux(&["bid", "list", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // A cap the fill cannot fit in: the bid waits, saying so.
    assert!(
        renter
            .gpux(&["config", "set", "spend-cap", "0.01"])
            .status
            .success()
    );
    let placed = renter.gpux(&[
        "bid",
        "gpu=l4",
        "--max-price",
        "5",
        "--duration",
        "5m",
        "--image",
        &image,
        "--json",
        "--",
        "sh",
        "-c",
        "echo the-bid-ran; sleep 100",
    ]);
    assert!(
        placed.status.success(),
        "{}",
        String::from_utf8_lossy(&placed.stderr)
    );
    let placed: gpux_api::BidPlaced = serde_json::from_slice(&placed.stdout).unwrap();
    // A second bid, cancelled before anything fills it.
    let other = renter.gpux(&["bid", "gpu=l4", "--max-price", "5", "--json"]);
    let other: gpux_api::BidPlaced = serde_json::from_slice(&other.stdout).unwrap();
    let out = renter.gpux(&["bid", "cancel", &other.bid]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = bids(renter);
    assert_eq!(listed.len(), 2);
    assert!(
        listed
            .iter()
            .any(|b| b.bid == other.bid && b.state == "cancelled")
    );
    assert!(listed.iter().any(|b| b.bid == placed.bid
        && b.state == "standing"
        && b.image.as_deref() == Some(&*image)));

    market.add_host();
    let renter = &market.renters[0];
    wait_for("the spend cap's refusal in `bid list`", 30, || {
        bids(renter).iter().any(|b| {
            b.bid == placed.bid
                && b.state == "standing"
                && b.refused
                    .as_deref()
                    .is_some_and(|r| r.contains("spend cap"))
        })
    });
    assert!(renter.leases().is_empty());
    // With room under the cap, the next offer the host publishes fills it, with the bid's
    // own image and command.
    assert!(
        renter
            .gpux(&["config", "set", "spend-cap", "1000"])
            .status
            .success()
    );
    let mut lease = String::new();
    wait_for("the bid to be filled", 30, || {
        let listed = bids(renter);
        let filled = listed
            .iter()
            .find(|b| b.bid == placed.bid && b.state == "filled");
        lease = filled.and_then(|b| b.lease.clone()).unwrap_or_default();
        !lease.is_empty()
    });
    wait_for("the bid's command to run", 30, || {
        String::from_utf8_lossy(&renter.gpux(&["logs", &lease]).stdout).contains("the-bid-ran")
    });
    assert_eq!(renter.lease(&lease).image, image);
    // The cancelled bid never filled: one lease.
    assert_eq!(renter.leases().len(), 1);
    assert!(renter.gpux(&["stop", &lease]).status.success());
}

#[test]
fn a_lease_for_an_image_the_host_lacks_is_refused_before_any_charge() {
    let market = Market::start(1, 1, 10);
    let renter = &market.renters[0];
    let missing = format!("sha256:{}", "ee".repeat(32));
    let out = renter.gpux(&[
        "rent",
        "gpu=l4",
        "--max-price",
        "5",
        "--duration",
        "60",
        "--image",
        &missing,
        "--",
        "sh",
    ]);
    // No host lists it, so no host is even asked (a host asked anyway refuses with
    // `ImageMissing`: the protocol's rules tests).
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no offer that satisfies the request lists this image"),
        "{err}"
    );
    assert_eq!(market.balance(renter), FAUCET_MICRO);
    market.assert_conserved();
}

#[test]
fn an_unknown_lease_is_an_error_that_says_so() {
    let market = Market::start(0, 1, 10);
    let renter = &market.renters[0];
    let unknown = "ab".repeat(32);
    for command in ["logs", "receipts", "stop"] {
        let out = renter.gpux(&[command, &unknown]);
        assert_eq!(out.status.code(), Some(1), "{command}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("no lease {unknown} here")),
            "{command}: {err}"
        );
    }
    // Through the API: 404 with a typed body {code, message, hint}.
    let err = renter.api().logs(&unknown, 0).unwrap_err();
    assert_eq!(err.code(), Some(gpux_api::ErrorCode::UnknownLease), "{err}");
    let addr = std::fs::read_to_string(renter.dir.join("api.addr")).unwrap();
    let token = std::fs::read_to_string(renter.dir.join("api.token")).unwrap();
    let raw = |request: String| {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr.trim()).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    };
    let response = raw(format!(
        "GET /v1/leases/{unknown}/receipts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        token.trim()
    ));
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    assert!(
        response.contains("\"code\":\"unknown-lease\"") && response.contains("\"hint\""),
        "{response}"
    );
    // A body that is not what the API takes: 400, typed.
    let body = "{\"query\": 5}";
    let response = raw(format!(
        "POST /v1/rent HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        token.trim(),
        body.len()
    ));
    assert!(
        response.starts_with("HTTP/1.1 400") && response.contains("\"code\":\"bad-input\""),
        "{response}"
    );
    // Not a lease id at all: a bad value.
    let out = renter.gpux(&["logs", "nonsense"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lease id"));
    // A search whose output is cut short (`| head -1`) ends quietly.
    let mut child = std::process::Command::new(gpux_e2e::gpux())
        .arg("--data-dir")
        .arg(&renter.dir)
        .args(["offers", "search", "", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One request on its own connection; the whole response.
fn http(addr: &str, request: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The local API under abuse: the auth scheme in any case, 401 on every path without the
/// token, and 2,000 connections that never finish their headers: the node holds at most
/// its cap, closes the rest within the header timeout, and answers throughout.
fn api_under_abuse(node: &Node, addr: &str) {
    use std::io::{Read, Write};
    let token = std::fs::read_to_string(node.dir.join("api.token")).unwrap();
    let status = |scheme: &str| {
        http(
            addr,
            &format!(
                "GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: {scheme} {}\r\nConnection: close\r\n\r\n",
                token.trim()
            ),
        )
    };
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let response = status(scheme);
        assert!(response.starts_with("HTTP/1.1 200"), "{scheme}: {response}");
    }
    let unknown = |auth: &str| {
        http(
            addr,
            &format!("GET /v1/no-such-path HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"),
        )
    };
    assert!(unknown("").starts_with("HTTP/1.1 401"));
    let with_token = unknown(&format!("Authorization: Bearer {}\r\n", token.trim()));
    assert!(with_token.starts_with("HTTP/1.1 400"), "{with_token}");

    let pid = node.pid().unwrap();
    let descriptors = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let before = descriptors();
    let mut held = Vec::new();
    let mut slowest = Duration::ZERO;
    for i in 0..2000 {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        // Headers begun, never finished.
        let _ = stream.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n");
        held.push(stream);
        if i % 100 == 99 {
            let asked = Instant::now();
            let response = status("Bearer");
            slowest = slowest.max(asked.elapsed());
            assert!(
                response.starts_with("HTTP/1.1 200"),
                "after {i}: {response}"
            );
        }
    }
    // The node holds at most its cap (512) of them; the rest were closed as they came.
    let during = descriptors();
    assert!(
        during <= before + 512 + 8,
        "{before} descriptors, then {during}"
    );
    eprintln!(
        "2,000 half-open connections: {before} -> {during} descriptors; slowest status {slowest:?}"
    );
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    // Within the header timeout (10 s) every one of them is closed.
    wait_for("the half-open connections to be closed", 20, || {
        descriptors() <= before + 4
    });
    for mut stream in held {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut rest = Vec::new();
        // Closed by the node: end of file (or a reset), not a timeout.
        match stream.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
    assert!(status("Bearer").starts_with("HTTP/1.1 200"));
}
