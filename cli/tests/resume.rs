//! A spot lease rented with `--resume` survives two preemptions: each time, the renter's
//! node copies the checkpoint out of the preempted workspace, rents the work again on the
//! other host (held until the checkpoint is in), and commits; the counter goes on from
//! where it stopped and ends with a count equal to its total run time.

use gpux_api::LeaseView;
use gpux_testnet::orders::{COUNTER, COUNTER_TARGET};

use super::market::{Market, Node, wait_for};

/// Rents `host`'s GPU on demand for 10 s: a spot lease on it is preempted.
fn preempt(market: &Market, by: &Node, host: &Node) -> String {
    let query = format!("gpu=l4 host={}", host.peer);
    let out = market.rent_output(
        by,
        &query,
        &["--max-price", "5", "--duration", "10"],
        "sleep 30",
    );
    assert!(
        out.status.success(),
        "the preempting rent failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<gpux_api::Rented>(&out.stdout)
        .unwrap()
        .lease
}

/// The renter's lease that resumed `previous`, once it runs.
fn resumed(renter: &Node, previous: &str) -> Option<LeaseView> {
    renter.api().leases().ok()?.into_iter().find(|l| {
        l.phase == "running"
            && l.resume
                .as_ref()
                .is_some_and(|r| r.resumed_from.as_deref() == Some(previous))
    })
}

/// The host that runs `lease`, and its view of it.
fn host_of<'a>(market: &'a Market, lease: &str) -> (&'a Node, LeaseView) {
    market
        .hosts
        .iter()
        .find_map(|h| {
            h.api()
                .leases()
                .ok()?
                .into_iter()
                .find(|l| l.lease == lease)
                .map(|v| (h, v))
        })
        .expect("a host has the lease")
}

/// Waits until `lease`'s workload has started (its log says so), then lets it count 8 s.
fn counted(renter: &Node, lease: &str, what: &str) {
    wait_for(what, 40, || {
        renter
            .api()
            .logs(lease, 0)
            .is_ok_and(|p| p.text.contains("resumed at"))
    });
    std::thread::sleep(std::time::Duration::from_secs(8));
}

#[test]
fn a_resumable_spot_lease_survives_two_preemptions_and_its_count_goes_on() {
    let market = Market::start(2, 2, 10);
    let (renter, other) = (&market.renters[0], &market.renters[1]);
    let out = market.rent_output(
        renter,
        "gpu=l4",
        &[
            "--spot",
            "--resume",
            "--max-price",
            "2.00",
            "--duration",
            "300",
            "--disk",
            "32MiB",
            "--retain",
            "60s",
        ],
        COUNTER,
    );
    assert!(
        out.status.success(),
        "the spot rent failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = serde_json::from_slice::<gpux_api::Rented>(&out.stdout)
        .unwrap()
        .lease;
    let mut chain = vec![first.clone()];
    counted(renter, &first, "the first lease to count");

    // Two preemptions, each on the host that runs the work now.
    for hop in 1..=2 {
        let previous = chain.last().unwrap().clone();
        let (host, _) = host_of(&market, &previous);
        preempt(&market, other, host);
        let mut next = None;
        wait_for("the work to resume on another lease", 90, || {
            next = resumed(renter, &previous);
            next.is_some()
        });
        let next = next.unwrap();
        assert_eq!(next.resume.as_ref().unwrap().hop, hop, "{next:?}");
        let view = renter.lease(&previous);
        assert_eq!(view.end.as_deref(), Some("preempted"), "{view:?}");
        let chained = view.resume.expect("the chain");
        assert_eq!(chained.resumed_by.as_deref(), Some(next.lease.as_str()));
        assert_eq!(chained.status, "resumed");
        // It goes on from the checkpoint, not from 0.
        wait_for("the resumed workload to start", 30, || {
            renter
                .api()
                .logs(&next.lease, 0)
                .is_ok_and(|p| p.text.contains("resumed at") && !p.text.contains("resumed at 0\n"))
        });
        chain.push(next.lease.clone());
        if hop == 1 {
            counted(renter, &next.lease, "the second lease to count");
        }
    }

    // The last lease counts to the end; the count equals the seconds the three ran.
    let last = chain.last().unwrap().clone();
    let done = format!("count={COUNTER_TARGET}");
    wait_for("the counter to finish", 90, || {
        renter
            .api()
            .logs(&last, 0)
            .is_ok_and(|p| p.text.contains(&done))
    });
    let mut ran_ms = 0;
    for lease in &chain {
        wait_for("each lease's end, at its host", 30, || {
            host_of(&market, lease).1.finished_at.is_some()
        });
        let (_, view) = host_of(&market, lease);
        ran_ms += view.finished_at.unwrap() - view.started_at.unwrap();
    }
    let ran_s = ran_ms as f64 / 1000.0;
    assert!(
        (ran_s - COUNTER_TARGET as f64).abs() <= 3.0,
        "counted {COUNTER_TARGET} in {ran_s:.1} s of run time over {} leases",
        chain.len()
    );
    let table = String::from_utf8(renter.gpux(&["leases"]).stdout).unwrap();
    assert!(table.contains("resume hop 2 from"), "{table}");
}
