//! The testnet's ledger: one ledger node, or the members of a replicated ledger
//! (`--ledgers 3`), started before everyone else; and the chaos the cluster is there for: its
//! leader killed mid-run and brought back on its disk.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gpux_client::ApiClient;

use crate::Report;
use crate::harness::Node;

/// How long a new cluster may take to make every member a voter.
const FORM_TIMEOUT: Duration = Duration::from_secs(45);
/// How long the killed leader stays down before it is started again on its disk.
pub const LEADER_DOWN: Duration = Duration::from_secs(3);

/// The ledger members' niceness. In a market they are machines of their own; here they
/// share the cores with every host and renter, and at 100 nodes on two cores (load 80 and
/// more during start-up) a member at the default waited so long for a core that its
/// heartbeats missed their 400 ms and the cluster re-elected for minutes. Needs root (CI
/// has it); without it the members run at the default.
const LEDGER_NICENESS: i32 = -10;

/// The ledger members, started and (for a cluster) formed.
pub struct Ledgers {
    /// Their processes (the first is everyone's bootstrap).
    pub nodes: Vec<Node>,
    /// Every member's address with `/p2p/<peer id>`, comma-separated: what the parties'
    /// `--ledger` names.
    pub list: String,
    /// The first two members' addresses: everyone's bootstrap peers, and the relays of the
    /// nodes behind NAT (two, so that losing one leaves the other).
    pub bootstrap: Vec<String>,
}

/// Above this many nodes a node's first peers are spread over the network: a node keeps
/// about 24 connections, so the ledger members cannot be everyone's first peer (at 100
/// nodes they held 100+ connections each while running raft, and answered late).
pub const SPREAD_BOOTSTRAP_ABOVE: usize = 24;

impl Ledgers {
    /// The `i`th node's bootstrap peers in a network of `nodes`: the first two members in a
    /// small one or for a node behind NAT (they are its relays); else one member in turn and
    /// two of `hosts` (public, started earlier) in turn.
    pub fn bootstrap_for(
        &self,
        i: usize,
        nodes: usize,
        nat: bool,
        hosts: &[String],
    ) -> Vec<String> {
        if nodes <= SPREAD_BOOTSTRAP_ABOVE || nat || hosts.len() < 2 {
            return self.bootstrap.clone();
        }
        let members: Vec<&str> = self.list.split(',').collect();
        let n = hosts.len();
        vec![
            members[i % members.len()].to_string(),
            hosts[i % n].clone(),
            hosts[(i + n / 2) % n].clone(),
        ]
    }
}

/// Starts `n` ledger members under `base` (a lone ledger node when `n` is 1) and waits for a
/// cluster to have every member voting.
pub fn start(
    gpux: &std::path::Path,
    base: &std::path::Path,
    n: usize,
    release_grace_s: &str,
    mut net: Option<&mut crate::netns::Network>,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Ledgers> {
    if !matches!(n, 1 | 3 | 5) {
        bail!(
            "--ledgers must be 1, 3 or 5 (a cluster of 3 survives the loss of one member, 5 of two)"
        );
    }
    // The faucet: a key of its own (in `<base>/faucet`, for `gpux mint --faucet`), which
    // every member is told (`--ledger-faucet`): they mint only grants it signed.
    let faucet_dir = base.join(FAUCET_DIR);
    let (faucet, _) = gpux_node::init_key(&faucet_dir).context("creating the faucet's key")?;
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
            "--ledger-faucet",
            &faucet.peer_id().to_string(),
        ]
        .map(String::from)
        .to_vec();
        let mut node = Node::placed(
            gpux,
            base,
            &name,
            args,
            Vec::new(),
            net.as_deref_mut(),
            false,
        )?;
        node.set_niceness(LEDGER_NICENESS);
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
        bootstrap: members.iter().take(2).cloned().collect(),
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

/// Grants the faucet has in flight at once.
const FAUCET_WORKERS: usize = 8;

/// Grants `amount` credits to each of `accounts` (peer ids), eight grants in flight at once:
/// the leader puts concurrent writes in one raft append, where one by one each waits out its
/// own replication (over 2 s a grant on the isolated testnet's links at 40 nodes).
pub fn fund(
    nodes: &[Node],
    accounts: &[String],
    amount: &str,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    std::thread::scope(|scope| {
        let workers: Vec<_> = accounts
            .chunks(accounts.len().div_ceil(FAUCET_WORKERS).max(1))
            .map(|chunk| {
                scope.spawn(move || -> anyhow::Result<()> {
                    for account in chunk {
                        if stop.load(Ordering::Relaxed) {
                            bail!("stopped while minting the faucet's credits");
                        }
                        let grant = grant(nodes, account, amount)?;
                        mint(nodes, &grant)
                            .with_context(|| format!("minting faucet credits for {account}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| bail!("a faucet worker panicked"))
        })
    })
}

/// Where a testnet keeps its faucet's key, under its base directory.
pub const FAUCET_DIR: &str = "faucet";

/// A grant of `amount` credits to `account` (a peer id), signed by the faucet of the
/// testnet whose ledger members are `nodes`.
pub fn grant(nodes: &[Node], account: &str, amount: &str) -> anyhow::Result<gpux_api::MintRequest> {
    let base = nodes
        .first()
        .and_then(|n| n.dir.parent())
        .context("no ledger member")?;
    let faucet = gpux_node::load_key(&base.join(FAUCET_DIR)).context("the faucet's key")?;
    let key = account
        .parse::<gpux_protocol::PeerId>()
        .map_err(|e| anyhow::anyhow!("{account}: {e}"))?
        .public_key();
    let credits = amount
        .parse::<gpux_protocol::MicroCredits>()
        .map_err(|e| anyhow::anyhow!("{amount}: {e}"))?;
    let envelope = gpux_node::ledger::faucet_grant(&faucet, key, credits, gpux_node::attest::now())
        .map_err(|e| anyhow::anyhow!("signing a grant: {e}"))?;
    Ok(gpux_api::MintRequest {
        account: account.to_string(),
        amount: amount.to_string(),
        grant: Some(gpux_protocol::hex(&envelope)),
    })
}

/// A faucet grant of one micro-credit to an account outside the market: a write that moves
/// none of the parties' credits.
pub fn probe(nodes: &[Node]) -> anyhow::Result<gpux_api::MintRequest> {
    let outside = gpux_protocol::Keypair::from_seed(&[0x5a; 32])
        .public()
        .peer_id()
        .to_string();
    grant(nodes, &outside, "0.000001")
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

/// The leader's loss: a replicated ledger's leader killed (SIGKILL) a third into the renting
/// and started again on its disk [`LEADER_DOWN`] later; the failover is timed from the kill
/// to the first write the cluster applies again (a faucet credit to an account outside the
/// market, so the parties' credits are untouched).
pub struct Chaos {
    kill_at: Option<Instant>,
    killed: Option<(usize, Instant)>,
    lost_at: Option<Instant>,
    restarted: Option<Instant>,
    /// The member killed, once one was.
    victim: Option<usize>,
}

impl Chaos {
    /// For `n` members over a run of `duration` (nothing happens to a lone ledger node).
    pub fn new(n: usize, duration: Duration) -> Self {
        Self {
            kill_at: (n >= 3).then(|| Instant::now() + duration / 3),
            killed: None,
            lost_at: None,
            restarted: None,
            victim: None,
        }
    }

    /// Whether no member is down or about to be: the leader's loss is over (its member
    /// back for 3 s) or never comes.
    pub fn quiet(&self) -> bool {
        self.kill_at.is_none()
            && self.killed.is_none()
            && self
                .restarted
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(3))
    }

    /// When the leader was lost, once it was.
    pub fn lost_at(&self) -> Option<Instant> {
        self.lost_at
    }

    /// Kills the leader when it is time, and starts it again when it has been down long
    /// enough.
    pub fn step(&mut self, nodes: &mut [Node], report: &mut Report, progress: &dyn Fn(&str)) {
        if self.kill_at.is_some_and(|at| Instant::now() >= at)
            && let Some(leader) = leader(nodes)
        {
            self.kill_at = None;
            self.victim = Some(leader);
            nodes[leader].kill9();
            let lost = Instant::now();
            self.killed = Some((leader, lost));
            self.lost_at = Some(lost);
            report.ledger_leader_killed = Some(nodes[leader].name.clone());
            progress(&format!(
                "chaos: killed the ledger's leader, {}",
                nodes[leader].name
            ));
            match probe(nodes).and_then(|p| mint(nodes, &p)) {
                Ok(()) => {
                    let ms = lost.elapsed().as_millis() as u64;
                    report.ledger_failover_ms = Some(ms);
                    progress(&format!(
                        "the ledger applies writes again {ms} ms after its leader's loss"
                    ));
                }
                Err(e) => report.errors.push(format!(
                    "the ledger applied nothing after its leader's loss: {e:#}"
                )),
            }
        }
        if let Some((member, at)) = self.killed
            && at.elapsed() >= LEADER_DOWN
        {
            self.killed = None;
            self.restarted = Some(Instant::now());
            match nodes[member].spawn() {
                Ok(()) => progress(&format!(
                    "chaos: {} started again on its disk",
                    nodes[member].name
                )),
                Err(e) => report
                    .errors
                    .push(format!("restarting a ledger member: {e:#}")),
            }
        }
    }
}

/// The highest log index any member has applied (`None` without a replicated ledger).
pub fn applied(nodes: &[Node]) -> Option<u64> {
    nodes
        .iter()
        .filter_map(|n| n.api().ok())
        .filter_map(|a: ApiClient| a.ledger().ok())
        .filter_map(|t| t.cluster.map(|c| c.applied))
        .max()
}

/// Records each member's applied index at the end, and an error when the members disagree.
pub fn check_agreement(nodes: &[Node], report: &mut Report) {
    let (agree, seen) = agreement(nodes);
    report.ledger_applied = seen.iter().map(|s| s.2).collect();
    if !agree {
        report.errors.push(format!(
            "the ledger's members disagree (minted, total, applied): {seen:?}"
        ));
    }
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
