//! A spot lease rented with `--resume` survives two preemptions: each time, the renter's
//! node copies the workspace (a data set and the checkpoint) out of the preempted lease,
//! only what changed since the last move, rents the work again on the other host (held
//! until the workspace is in, so its clock starts after the copy), and commits; the
//! counter finds its data set, goes on from where it stopped and ends with a count equal to
//! its total run time.

use gpux_api::LeaseView;
use gpux_testnet::orders::{COUNTER, COUNTER_TARGET};

use super::market::{Market, Node, wait_for};

/// The data set's size: it moves with the work.
const DATA_SET_BYTES: u64 = 4 << 20;

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
            "--hold",
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
    // A data set goes in before the work starts.
    let data = tempfile::tempdir().unwrap();
    let set: Vec<u8> = (0..DATA_SET_BYTES as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(data.path().join("set.bin"), &set).unwrap();
    // And a scratch file the work removes before the second move: it must not come back.
    std::fs::write(data.path().join("scratch.tmp"), b"stale").unwrap();
    let into = format!("{first}:/workspace/data/");
    for file in ["set.bin", "scratch.tmp"] {
        let cp = renter.gpux(&["cp", data.path().join(file).to_str().unwrap(), &into]);
        assert!(
            cp.status.success(),
            "{}",
            String::from_utf8_lossy(&cp.stderr)
        );
    }
    let commit = renter.gpux(&["commit", &first]);
    assert!(
        commit.status.success(),
        "{}",
        String::from_utf8_lossy(&commit.stderr)
    );
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
        // The whole workspace moved; the second time only what changed came out of the old
        // one (the checkpoint, not the data set again).
        let moved = next.resume.as_ref().unwrap().moved.expect("what moved");
        assert!(moved.bytes > DATA_SET_BYTES, "{moved:?}");
        assert!(moved.sent > DATA_SET_BYTES, "{moved:?}");
        if hop == 1 {
            assert!(moved.fetched > DATA_SET_BYTES, "{moved:?}");
        } else {
            assert!(
                moved.fetched < 64 << 10,
                "only the checkpoint changed: {moved:?}"
            );
        }
        // Its clock runs from its start, after the move.
        let mut started = None;
        wait_for("the host to start it", 30, || {
            started = host_of(&market, &next.lease).1.started_at;
            started.is_some()
        });
        assert!(
            started.unwrap() >= moved.done_at_ms,
            "started at {:?}, the move done at {}",
            started,
            moved.done_at_ms
        );
        // It finds its data set, and goes on from the checkpoint, not from 0.
        let found = format!("data set: {DATA_SET_BYTES} bytes");
        wait_for("the resumed workload to start", 30, || {
            renter.api().logs(&next.lease, 0).is_ok_and(|p| {
                p.text.contains(&found)
                    && p.text.contains("resumed at")
                    && !p.text.contains("resumed at 0\n")
            })
        });
        let scratch = |lease: &str| {
            let out = renter.gpux(&["exec", lease, "--", "ls", "/workspace/data"]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).contains("scratch.tmp")
        };
        chain.push(next.lease.clone());
        if hop == 1 {
            assert!(scratch(&next.lease), "the whole workspace moved");
            let rm = renter.gpux(&[
                "exec",
                &next.lease,
                "--",
                "rm",
                "/workspace/data/scratch.tmp",
            ]);
            assert!(
                rm.status.success(),
                "{}",
                String::from_utf8_lossy(&rm.stderr)
            );
            counted(renter, &next.lease, "the second lease to count");
        } else {
            assert!(!scratch(&next.lease), "a file the work removed came back");
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
    assert!(
        table.contains(", moved ") && table.contains(" fetched, "),
        "{table}"
    );
}
