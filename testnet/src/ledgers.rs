//! The testnet's ledger: one ledger node, or the members of a replicated ledger
//! (`--ledgers 3`), started before everyone else; and the chaos the cluster is there for: its
//! leader killed mid-run and brought back on its disk.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gpux_node::api_client::ApiClient;

use crate::harness::Node;

/// How long a new cluster may take to make every member a voter.
const FORM_TIMEOUT: Duration = Duration::from_secs(45);
/// How long the killed leader stays down before it is started again on its disk.
pub const LEADER_DOWN: Duration = Duration::from_secs(3);

/// The ledger members, started and (for a cluster) formed.
pub struct Ledgers {
    /// Their processes (the first is everyone's bootstrap).
    pub nodes: Vec<Node>,
    /// Every member's address with `/p2p/<peer id>`, comma-separated: what the parties'
    /// `--ledger` names.
    pub list: String,
    /// The first member's address: everyone's bootstrap.
    pub bootstrap: String,
}

/// Starts `n` ledger members under `base` (a lone ledger node when `n` is 1) and waits for a
/// cluster to have every member voting.
pub fn start(
    gpux: &std::path::Path,
    base: &std::path::Path,
    n: usize,
    release_grace_s: &str,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Ledgers> {
    if !matches!(n, 1 | 3 | 5) {
        bail!(
            "--ledgers must be 1, 3 or 5 (a cluster of 3 survives the loss of one member, 5 of two)"
        );
    }
    let mut nodes = Vec::new();
    let mut members = Vec::new();
    for m in 0..n {
        let name = if n == 1 {
            "ledger".to_string()
        } else {
            format!("ledger-{m}")
        };
        let args = [
            "--api",
            "127.0.0.1:0",
            "--serve-ledger",
            "--ledger-release-grace",
            release_grace_s,
        ]
        .map(String::from)
        .to_vec();
        let node = Node::new(gpux, base, &name, args, Vec::new())?;
        // The key first: every member's address names its peer id.
        let (key, _) =
            gpux_node::init_key(&node.dir).with_context(|| format!("creating {name}'s key"))?;
        members.push(format!("{}/p2p/{}", node.addr, key.peer_id()));
        nodes.push(node);
    }
    let list = members.join(",");
    if n > 1 {
        for (m, node) in nodes.iter_mut().enumerate() {
            node.add_args(["--ledger-cluster".to_string(), list.clone()]);
            if m == 0 {
                node.add_args(["--ledger-bootstrap".to_string()]);
            } else {
                node.add_args(["--bootstrap".to_string(), members[0].clone()]);
            }
        }
    }
    for node in &mut nodes {
        node.spawn()?;
    }
    if n > 1 {
        let started = Instant::now();
        let first = nodes[0].api()?;
        loop {
            let voters = first
                .ledger()
                .ok()
                .and_then(|t| t.cluster)
                .map_or(0, |c| c.voters.len());
            if voters == n {
                break;
            }
            if started.elapsed() > FORM_TIMEOUT {
                bail!(
                    "the ledger cluster did not form: {voters} of {n} members vote after {FORM_TIMEOUT:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        progress(&format!(
            "a replicated ledger of {n} members formed in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    Ok(Ledgers {
        nodes,
        bootstrap: members[0].clone(),
        list,
    })
}

/// Mints through whichever member leads (a lone ledger node always does); retried while an
/// election runs.
pub fn mint(nodes: &[Node], request: &gpux_api::MintRequest) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut last = None;
        for node in nodes {
            match node.api().and_then(|a| Ok(a.mint(request)?)) {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        if Instant::now() > deadline {
            return Err(last.unwrap_or_else(|| anyhow::anyhow!("no ledger member")));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A faucet credit of one micro-credit to an account outside the market: a write that
/// moves none of the parties' credits.
pub fn probe() -> gpux_api::MintRequest {
    gpux_api::MintRequest {
        account: gpux_protocol::Keypair::from_seed(&[0x5a; 32])
            .public()
            .peer_id()
            .to_string(),
        amount: "0.000001".into(),
    }
}

/// The index of the member that leads now, if one does.
pub fn leader(nodes: &[Node]) -> Option<usize> {
    nodes.iter().position(|n| {
        n.api()
            .ok()
            .and_then(|a| a.ledger().ok())
            .and_then(|t| t.cluster)
            .is_some_and(|c| c.leader)
    })
}

/// Each member's totals (minted, total) and applied index, once they agree (within 10 s);
/// the last answers otherwise.
pub fn agreement(nodes: &[Node]) -> (bool, Vec<(u64, u64, u64)>) {
    let read = || -> Vec<(u64, u64, u64)> {
        nodes
            .iter()
            .map(|n| {
                n.api()
                    .ok()
                    .and_then(|a: ApiClient| a.ledger().ok())
                    .map_or((0, 0, 0), |t| {
                        (
                            t.minted_micro,
                            t.total_micro,
                            t.cluster.map_or(0, |c| c.applied),
                        )
                    })
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = read();
        let agree = seen.windows(2).all(|w| w[0] == w[1]) && seen.iter().all(|s| s.0 == s.1);
        if agree || Instant::now() > deadline {
            return (agree, seen);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
