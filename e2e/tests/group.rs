//! Group orders with real processes and real Docker: 6 GPUs over 3 hosts start all together
//! (no container before the last member was agreed); a group that cannot be placed whole
//! starts nothing and leaves no escrow locked; `gpux group scale` adds and removes GPUs.

use gpux_api::{GroupPlaced, GroupScaled};

use super::market::{Market, docker_containers, wait_for};

const SCRIPT: &str = "echo member; sleep 300";

fn group_rent(market: &Market, gpus: u16) -> std::process::Output {
    let gpus = gpus.to_string();
    let options = [
        "--gpus",
        &gpus,
        "--spread",
        "--max-price",
        "5",
        "--duration",
        "300",
    ];
    market.rent_output(&market.renters[0], "gpu=l4", &options, SCRIPT)
}

#[test]
fn a_spread_group_starts_all_or_nothing_and_scales_up_and_down() {
    let mut market = Market::start_with(3, 2, 1, 10);
    let out = group_rent(&market, 6);
    assert!(
        out.status.success(),
        "the group rent failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let placed: GroupPlaced = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(placed.gpus, 6);
    assert_eq!(placed.leases.len(), 3, "{placed:?}");
    let hosts: std::collections::BTreeSet<&str> =
        placed.leases.iter().map(|l| l.host.as_str()).collect();
    assert_eq!(hosts.len(), 3, "one lease per host");

    // No member's container started before the last member was agreed.
    let host_view = |lease: &str| {
        market
            .hosts
            .iter()
            .find_map(|h| {
                h.api()
                    .leases()
                    .ok()?
                    .into_iter()
                    .find(|l| l.lease == lease)
            })
            .expect("a host has the lease")
    };
    for l in &placed.leases {
        wait_for("every member to start", 30, || {
            host_view(&l.lease).started_at.is_some()
        });
    }
    let views: Vec<_> = placed.leases.iter().map(|l| host_view(&l.lease)).collect();
    let last_agreed = views.iter().map(|v| v.since).max().unwrap();
    let first_start = views.iter().filter_map(|v| v.started_at).min().unwrap();
    assert!(
        first_start >= last_agreed,
        "a member started at {first_start}, before the last was agreed at {last_agreed}"
    );
    assert!(
        views
            .iter()
            .all(|v| v.group.as_deref() == Some(placed.group.as_str()))
    );
    let renter = &market.renters[0];
    let table = String::from_utf8(renter.gpux(&["leases"]).stdout).unwrap();
    assert!(
        table.contains(&format!(
            "group {}: 3 of 3 leases running, 6 GPU(s), over 3 host(s)",
            placed.group
        )),
        "{table}"
    );

    // A fourth host with 2 GPUs: a group of 4 cannot be placed whole. Its one member that
    // held is stopped: nothing runs, nothing is paid, no escrow stays locked.
    market.add_host();
    let renter = &market.renters[0];
    // Its own offer, by its key: the full hosts' offers leave the book as their
    // withdrawals arrive, before or after it.
    let new_peer = market.hosts.last().unwrap().peer.clone();
    wait_for("the new host's offer", 30, || {
        renter.api().offers("", 100).is_ok_and(|hits| {
            hits.iter()
                .any(|h| h.host.peer_id().to_string() == new_peer)
        })
    });
    let out = group_rent(&market, 4);
    assert!(!out.status.success(), "a group of 4 was placed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("could not place all 4 GPUs"), "{err}");
    let new_host = market.hosts.last().unwrap();
    let held: Vec<_> = new_host.api().leases().unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    let held = &held[0];
    assert!(held.group.is_some() && held.group.as_deref() != Some(placed.group.as_str()));
    wait_for("the held member to settle", 30, || {
        new_host.lease(&held.lease).settled
    });
    let ended = new_host.lease(&held.lease);
    assert!(
        ended.started_at.is_none() && ended.redeemed == 0,
        "{ended:?}"
    );
    assert!(docker_containers(&held.lease).is_empty());
    wait_for(
        "only the running group's escrows to stay locked",
        30,
        || market.ledger_state().open_escrows == 3,
    );

    // Scale up by 2 (on the new host), then down by 2 (that lease, the latest).
    let out = renter.gpux(&["group", "scale", &placed.group, "+2", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let up: GroupScaled = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((up.gpus, up.added.len()), (8, 1), "{up:?}");
    let added = up.added[0].lease.clone();
    wait_for("the added member to start", 30, || {
        new_host.lease(&added).started_at.is_some()
    });
    let out = renter.gpux(&["group", "scale", &placed.group, "-3"]);
    assert!(
        !out.status.success(),
        "-3 is not a sum of whole 2-GPU leases"
    );
    let out = renter.gpux(&["group", "scale", &placed.group, "-2", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let down: GroupScaled = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((down.gpus, down.stopped.clone()), (6, vec![added.clone()]));
    wait_for("the removed member to end", 30, || {
        new_host.lease(&added).end.as_deref() == Some("renter-stopped")
    });

    for l in &placed.leases {
        assert!(renter.gpux(&["stop", &l.lease]).status.success());
    }
    wait_for("every escrow to close", 60, || {
        market.ledger_state().open_escrows == 0
    });
    market.assert_conserved();
}
