//! A replicated ledger of three `gpux node run` processes, operated with the commands of
//! docs/settlement.md: `gpux ledger status` shows one leader and three voters, a mint on a
//! follower says where to mint, and a member whose disk was wiped (its key kept) comes back
//! under a new node id that does not vote until `gpux ledger readd` on the leader takes it
//! back; then it has every balance. `/metrics` shows who leads and how many vote.

use std::path::Path;
use std::time::{Duration, Instant};

use gpux_api::LedgerTotals;
use gpux_testnet::harness::Node;

fn status(node: &Node) -> LedgerTotals {
    let out = node.gpux(&["ledger", "status", "--json"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what}: not within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_wiped_member_does_not_vote_until_readded_then_has_every_balance() {
    let tmp = tempfile::tempdir().unwrap();
    let gpux = Path::new(gpux_e2e::gpux());
    let mut ledgers =
        gpux_testnet::ledgers::start(gpux, tmp.path(), 3, "600", None, &|_| {}).unwrap();
    let nodes = &mut ledgers.nodes;

    // One leader, three voters, as every member sees it.
    let views: Vec<_> = nodes.iter().map(|n| status(n).cluster.unwrap()).collect();
    assert_eq!(views.iter().filter(|v| v.leader).count(), 1, "{views:?}");
    assert!(views.iter().all(|v| v.voters.len() == 3), "{views:?}");
    let leader = views.iter().position(|v| v.leader).unwrap();
    // /metrics says the same.
    for (i, node) in nodes.iter().enumerate() {
        let addr = gpux_node::metrics::read_addr(&node.dir).unwrap();
        let text = ureq::get(&format!("http://{addr}/metrics"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        let leads = format!("gpux_ledger_cluster_leader {}", u8::from(i == leader));
        assert!(text.lines().any(|l| l == leads), "{text}");
        assert!(
            text.lines().any(|l| l == "gpux_ledger_cluster_voters 3"),
            "{text}"
        );
    }
    let follower = (leader + 1) % 3;
    let wiped = (leader + 2) % 3;

    // The testnet's ledger mints only its faucet's grants: the operator's own mint is
    // refused; a grant sent to a follower says where to send it; on the leader it applies
    // everywhere.
    let faucet = tmp
        .path()
        .join(gpux_testnet::ledgers::FAUCET_DIR)
        .display()
        .to_string();
    let account = gpux_protocol::Keypair::from_seed(&[77; 32])
        .peer_id()
        .to_string();
    let out = nodes[leader].gpux(&["mint", &account, "5"]).unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--faucet DIR"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = nodes[follower]
        .gpux(&["mint", &account, "5", "--faucet", &faucet])
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("gpux ledger status"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = nodes[leader]
        .gpux(&["mint", &account, "5", "--faucet", &faucet])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("every member has the mint", 10, || {
        nodes.iter().all(|n| status(n).minted_micro == 5_000_000)
    });

    // The wiped member: everything but its key is gone.
    let old_id = views[wiped].node_id;
    nodes[wiped].kill9();
    for entry in std::fs::read_dir(&nodes[wiped].dir).unwrap().flatten() {
        if entry.file_name() != gpux_node::KEY_FILE_NAME {
            let path = entry.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    nodes[wiped].spawn().unwrap();
    let new_id = status(&nodes[wiped]).cluster.unwrap().node_id;
    assert_ne!(new_id, old_id);
    // The leader does not take it back on its own; it holds nothing.
    std::thread::sleep(Duration::from_secs(3));
    let voters = status(&nodes[leader]).cluster.unwrap().voters;
    assert!(
        voters.contains(&old_id) && !voters.contains(&new_id),
        "{voters:?}"
    );
    assert_eq!(status(&nodes[wiped]).minted_micro, 0);
    assert!(
        nodes[leader].log().contains("gpux ledger readd"),
        "the leader's log does not say what to do"
    );

    // The operator takes it back.
    let out = nodes[leader]
        .gpux(&["ledger", "readd", &nodes[wiped].peer, "--json"])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let readded: gpux_api::Readded = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(readded.node_id, new_id);
    let voters = status(&nodes[leader]).cluster.unwrap().voters;
    assert!(
        voters.contains(&new_id) && !voters.contains(&old_id) && voters.len() == 3,
        "{voters:?}"
    );
    wait_for("the re-added member has every balance", 15, || {
        let t = status(&nodes[wiped]);
        t.minted_micro == 5_000_000 && t.balances.get(&account) == Some(&5_000_000)
    });
}
