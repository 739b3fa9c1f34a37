//! A host that runs a business: its price changed while it runs (`gpux host set`), its
//! GPUs taken off the market and offered again (`gpux host pause`, `resume`), with real
//! processes, real Docker and a real ledger. Running leases keep their signed terms, and the
//! changes outlive a restart.

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
    ] {
        let out = host.gpux(&["host", "set", name, value]);
        assert!(!out.status.success(), "{name} {value}: {out:?}");
    }
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
