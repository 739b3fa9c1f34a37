//! Reputation from records anyone can check, with real processes: two renters each pay both
//! hosts (the second on spot leases), so each host has two witnesses with histories of
//! their own at the ledger; a third renter, which never rented and saw nothing itself, asks
//! the ledger who paid whom, and how those leases ended, and trusts both hosts accordingly
//! and knows their interruption rate (none of their spot leases was preempted).

use super::market::{Market, Node, wait_for};

fn reliability(observer: &Node, host: &Node) -> Option<u16> {
    observer
        .api()
        .offers("", 20)
        .ok()?
        .into_iter()
        .find(|h| h.host.peer_id().to_string() == host.peer)
        .map(|h| h.reliability_permille)
}

fn interruption(observer: &Node, host: &Node) -> Option<u16> {
    observer
        .api()
        .offers("", 20)
        .ok()?
        .into_iter()
        .find(|h| h.host.peer_id().to_string() == host.peer)?
        .interruption_permille
}

#[test]
fn a_renter_that_never_rented_trusts_the_hosts_others_paid() {
    let market = Market::start(2, 3, 10);
    let observer = &market.renters[2];
    for host in &market.hosts {
        assert_eq!(reliability(observer, host), Some(500), "no evidence yet");
    }
    let mut leases = Vec::new();
    for (i, renter) in market.renters[..2].iter().enumerate() {
        // Each host's GPU is free again (the last renter's lease ended) in this renter's book.
        wait_for("both hosts' GPUs offered", 40, || {
            renter.api().offers("", 20).is_ok_and(|hits| {
                market.hosts.iter().all(|h| {
                    hits.iter()
                        .any(|o| o.host.peer_id().to_string() == h.peer && o.free >= 1)
                })
            })
        });
        for host in &market.hosts {
            // The second renter's leases are spot: they end at their duration, unpreempted.
            let mut options = vec!["--max-price", "5", "--duration", "2"];
            if i == 1 {
                options.push("--spot");
            }
            let out = market.rent_output(
                renter,
                &format!("host={}", host.peer),
                &options,
                "echo paid work; sleep 5",
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let rented: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
            leases.push((renter, rented.lease));
        }
        wait_for("the renter's leases to settle", 60, || {
            leases.iter().all(|(r, l)| r.lease(l).settled)
        });
    }
    // Each host: two payers, each of which paid the other host too, one escrow each:
    // 2 x 1 settled lease of evidence, (1 + 6) / (2 + 6) = 0.875.
    wait_for("the observer to weigh the ledger's history", 40, || {
        market
            .hosts
            .iter()
            .all(|h| reliability(observer, h).is_some_and(|r| r >= 870))
    });
    // The observer never rented spot, yet knows each host's interruption rate: the
    // ledger's records of how the witnesses' spot leases ended (none preempted).
    for host in &market.hosts {
        assert_eq!(interruption(observer, host), Some(0));
    }
    market.assert_conserved();
}
