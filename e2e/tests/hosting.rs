//! A host that runs a business: its price changed while it runs (`gpux host set`), its
//! GPUs taken off the market and offered again (`gpux host pause`, `resume`), a GPU that
//! fails mid-lease (an Xid the fake driver injects) and a host's own stop that ends its
//! leases, with real processes, real Docker and a real ledger. Running leases keep their
//! signed terms, the changes outlive a restart, and a lease the host ended pays what ran.

use super::market::{Market, wait_for};

const TICKER: &str = "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done";

/// The price per GPU-hour of the host's offers in `renter`'s book (none when it has none).
fn offered_price(market: &Market) -> Option<u64> {
    let api = market.renters[0].api();
    let hits = api.offers("gpu=l4", 10).unwrap_or_default();
    hits.first().map(|h| h.price_per_gpu_hour.0)
}

#[test]
fn a_host_reprices_pauses_and_resumes_while_its_lease_keeps_the_signed_terms() {
    let mut market = Market::start_with(1, 2, 1, 10);
    let lease = market.rent(&market.renters[0], 20, TICKER);
    let host = &market.hosts[0];
    // Repriced while the lease runs: the renter's book has the new price within a gossip
    // round; the lease keeps its own.
    let set = host.gpux(&["host", "set", "price", "1.75"]);
    let said = String::from_utf8_lossy(&set.stdout);
    assert!(set.status.success() && said.contains("1.75"), "{set:?}");
    wait_for("the new price in the renter's book", 10, || {
        offered_price(&market) == Some(1_750_000)
    });
    // Out of the protocol's bounds, or not a setting: refused, the price unchanged.
    for (name, value) in [
        ("price", "20000"),
        ("price", "0"),
        ("spot-floor", "9"),
        ("disk", "1"),
        ("memory", "100MiB"),
        ("cancel-fees", "soon"),
        ("cpus", "0"),
    ] {
        let out = host.gpux(&["host", "set", name, value]);
        assert!(!out.status.success(), "{name} {value}: {out:?}");
    }
    // The cancellation schedule and the machine's share change live too.
    let set = host.gpux(&["host", "set", "cancel-fees", "1h:50%", "--json"]);
    let live: gpux_api::HostLive = serde_json::from_slice(&set.stdout).unwrap();
    assert_eq!(live.cancel_fees, "1h:50%", "{set:?}");
    let set = host.gpux(&["host", "set", "cpus", "1", "--json"]);
    let live: gpux_api::HostLive = serde_json::from_slice(&set.stdout).unwrap();
    assert_eq!(live.cpus, Some(1), "{set:?}");
    // Paused: the offer is withdrawn at the renter and a rent finds nothing; the running
    // lease goes on.
    let pause = host.gpux(&["host", "pause"]);
    assert!(pause.status.success(), "{pause:?}");
    wait_for("the host's offer withdrawn at the renter", 10, || {
        offered_price(&market).is_none()
    });
    let refused = market.rent_output(
        &market.renters[0],
        "gpu=l4",
        &["--max-price", "5", "--duration", "10"],
        "true",
    );
    assert!(!refused.status.success(), "{refused:?}");
    assert_eq!(host.phase(&lease), "running");
    // Paused across a restart too, then resumed at the new price.
    market.hosts[0].restart();
    let host = &market.hosts[0];
    assert!(
        host.log().contains("host setting price = 1.75"),
        "{}",
        host.log()
    );
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(
        offered_price(&market),
        None,
        "still paused after the restart"
    );
    let resume = host.gpux(&["host", "resume", "--json"]);
    let live: gpux_api::HostLive = serde_json::from_slice(&resume.stdout).unwrap();
    assert!(!live.paused && live.price == "1.75", "{live:?}");
    wait_for("the offer back at the new price", 15, || {
        offered_price(&market) == Some(1_750_000)
    });
    // Draining: a lease that would end after the drain time is refused; the host says when
    // it is free (the running lease's end); `resume` ends the drain.
    let drain = host.gpux(&["host", "drain", "--until", "40s"]);
    let said = String::from_utf8_lossy(&drain.stdout);
    assert!(
        drain.status.success() && said.contains("only leases that end by then"),
        "{drain:?}"
    );
    let live: gpux_api::HostLive = serde_json::from_slice(
        &host
            .gpux(&["host", "drain", "--until", "40s", "--json"])
            .stdout,
    )
    .unwrap();
    let running = host.lease(&lease);
    assert_eq!(
        live.free_at,
        Some(running.started_at.unwrap().min(running.starts_at) + 20_000),
        "{live:?}"
    );
    let refused = market.rent_output(
        &market.renters[0],
        "gpu=l4",
        &["--max-price", "5", "--duration", "300"],
        "true",
    );
    assert!(!refused.status.success(), "{refused:?}");
    let resume = host.gpux(&["host", "resume", "--json"]);
    let live: gpux_api::HostLive = serde_json::from_slice(&resume.stdout).unwrap();
    assert_eq!(live.drain_until, None);
    // The lease ran at the price both sides signed.
    wait_for("the lease to settle", 60, || {
        host.phase(&lease) == "settled"
    });
    let hosted = host.lease(&lease);
    assert_eq!(hosted.price_per_gpu_hour_micro, 3_600_000, "{hosted:?}");
    assert_eq!(
        hosted.redeemed, 60_000,
        "the 60 s minimum at 3.60/h: {hosted:?}"
    );
    // What it earned, by renter; and its leases name the renter.
    let out = host.gpux(&["host", "earnings", "--by", "renter", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let renter = &market.renters[0].peer;
    assert_eq!(rows[0]["key"], renter.as_str(), "{rows}");
    assert_eq!(
        (rows[0]["leases"].as_u64(), rows[0]["paid_micro"].as_u64()),
        (Some(1), Some(60_000))
    );
    let csv = host.gpux(&["host", "earnings", "--csv"]);
    let csv = String::from_utf8_lossy(&csv.stdout);
    assert!(
        csv.starts_with("key,leases,paid,pending,disputed\n") && csv.contains(",1,0.06,0.00,0"),
        "{csv}"
    );
    let listed = host.gpux(&["leases"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&renter[renter.len() - 12..]));
    market.assert_conserved();
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A host's DCGM gauge `name` for its GPU 0.
fn dcgm(node: &super::market::Node, name: &str) -> Option<f64> {
    let addr = gpux_node::metrics::read_addr(&node.dir)?;
    let text = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .ok()?
        .body_mut()
        .read_to_string()
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_gpu_fault_ends_its_lease_billed_to_the_fault_and_a_host_s_own_stop_bills_what_ran() {
    let faults_dir = tempfile::tempdir().unwrap();
    let faults = faults_dir.path().join("faults.toml");
    let uuid = "GPU-0000000f-0000-3333-4444-555555555555";
    let config = format!(
        "faults = \"{}\"\n\n[[gpu]]\nname = \"NVIDIA L4\"\nuuid = \"{uuid}\"\nmemory_total_bytes = 24152899584\ncompute_capability = [8, 9]\nutilization_gpu = 87\n",
        faults.display()
    );
    let gpus = faults_dir.path().join("gpus.toml");
    std::fs::write(&gpus, &config).unwrap();
    let mut market = Market::start(0, 0, 6);
    market.receipt_interval_s = 2;
    market.add_host_config(&config);
    market.add_renter(&[]);
    let (host, renter) = (&market.hosts[0], &market.renters[0]);

    // An Xid 79 (the GPU fell off the bus) while a lease runs: the lease ends `gpu-failed`
    // within two receipt intervals, billed up to the fault and no minimum.
    let lease = market.rent(renter, 120, TICKER);
    wait_for("an acknowledged receipt", 20, || {
        renter.lease(&lease).acked_seq >= 1
    });
    let started = host.lease(&lease).started_at.unwrap();
    let before = now_ms();
    std::fs::write(&faults, format!("[[fault]]\nuuid = \"{uuid}\"\nxid = 79\n")).unwrap();
    let after = now_ms();
    wait_for("the lease to end gpu-failed", 4, || {
        host.lease(&lease).end.as_deref() == Some("gpu-failed")
    });
    wait_for("the lease to settle", 60, || {
        host.phase(&lease) == "settled" && renter.phase(&lease) == "settled"
    });
    let hosted = host.lease(&lease);
    assert_eq!(renter.lease(&lease).end.as_deref(), Some("gpu-failed"));
    let (low, high) = ((before - started) / 1000, (after - started) / 1000 + 1);
    assert!(
        (low * 1000..=high * 1000).contains(&hosted.redeemed) && hosted.redeemed < 60_000,
        "billed {} µcr for a fault {low}-{high} s in: {hosted:?}",
        hosted.redeemed
    );
    // The GPU leaves the offers and takes no lease; its last Xid is in /metrics.
    std::thread::sleep(std::time::Duration::from_secs(6));
    assert_eq!(offered_price(&market), None, "a failed GPU is not offered");
    let live = host.api().settings().unwrap().host.unwrap();
    assert_eq!(live.failed_gpus, vec![uuid.to_string()]);
    assert_eq!(dcgm(host, "DCGM_FI_DEV_XID_ERRORS"), Some(79.0));

    // Repaired (the fault gone): `gpux host check` reads it well through the driver and
    // offers it again (other checks fail on this machine: no NVIDIA container runtime).
    std::fs::remove_file(&faults).unwrap();
    let check = host
        .gpux_command(&[
            "host",
            "check",
            "--nvml-lib",
            super::attest_lib().to_str().unwrap(),
        ])
        .env("GPUX_FAKE_NVML_CONFIG", &gpus)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(said.contains("offered again: GPU-0000000f"), "{check:?}");
    wait_for("the GPU offered again", 15, || {
        offered_price(&market).is_some()
    });

    // The host stops with --end-leases 18 s into a lease: 18 s billed, not the minimum.
    let lease = market.rent(renter, 120, TICKER);
    let started = host.lease(&lease).started_at.unwrap();
    while now_ms() < started + 18_000 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let stop_at = now_ms();
    let stop = host.gpux(&["node", "stop", "--end-leases"]);
    assert!(stop.status.success(), "{stop:?}");
    wait_for("the renter to hear the lease ended", 30, || {
        renter.lease(&lease).end.as_deref() == Some("host-shutdown")
    });
    wait_for("the final receipt acknowledged", 30, || {
        renter.lease(&lease).acked_amount >= 18_000
    });
    let paid = renter.lease(&lease).acked_amount;
    let ran_s = (stop_at - started) / 1000;
    assert!(
        (ran_s * 1000..=(ran_s + 1) * 1000).contains(&paid),
        "billed {paid} µcr for a lease the host stopped {ran_s} s in"
    );
    market.assert_conserved();
}
