//! The isolated testnet's network (`gpux testnet up --isolated`): every node in a network
//! namespace of its own, with its own address on a bridge the run makes, its links shaped,
//! and links that can be cut and healed.
//!
//! - Each node gets a namespace `gpux-<pid>-<name>`, a veth pair (`eth0` inside, the other
//!   end on the run's bridge `gx<pid>br`) and the address `10.X.a.b/16`, X the first
//!   `10.X.0.0/16` this machine does not use. Nodes are started with `nsenter --net`, so
//!   only their network is apart: they share the file system, the loop-mounted workspaces
//!   and the Docker socket with the rest of the machine.
//! - Docker sets the root namespace's `FORWARD` policy to `DROP`, and bridged packets pass
//!   it: the run inserts one `ACCEPT` for its bridge, tagged with a comment naming the run.
//! - Shaping (the kernel here has no netem): loss by an iptables `statistic` drop on each
//!   node's `INPUT`, so every direction of a link loses its share; rate by a `tbf` on each
//!   node's `eth0`; delay and jitter by the nodes themselves (`--link-delay-ms`, a wrapper
//!   around each connection: `gpux_node::p2p::shaping`).
//! - A cut link is a `DROP` of the other's address in both namespaces; healing removes it.
//! - Everything is removed when the [`Network`] is dropped (and what a killed run left is
//!   removed by the next one, once its process is gone): namespaces (with their veths, rules
//!   and qdiscs), the bridge, the `FORWARD` rule.
//!
//! A node's API listens on its namespace's loopback, which the testnet, in the root
//! namespace, cannot reach: a [`Forward`] per node carries it (a listener on the root
//! namespace's loopback, each connection opened from a thread that entered the node's
//! namespace), and the node's `api.addr` names the forwarder.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};

use anyhow::{Context, bail};

/// Where `ip netns` keeps its namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The port every node listens on for libp2p, inside its namespace.
pub const P2P_PORT: u16 = 4001;

/// How links are shaped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shaping {
    /// Added to everything a node sends, ms (by the node: `--link-delay-ms`).
    pub delay_ms: u64,
    /// Each send's delay is drawn from `delay_ms ± jitter_ms`.
    pub jitter_ms: u64,
    /// Packets dropped on arrival, percent (iptables `statistic`).
    pub loss_pct: f64,
    /// Each node's sending rate (`tbf`), as `tc` reads it (`100mbit`).
    pub rate: Option<String>,
}

/// What this machine offers the isolated testnet.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Preflight {
    /// Running as root (namespaces, veths and rules need it).
    pub root: bool,
    /// `ip`, `iptables`, `tc`, `nsenter` found.
    pub tools: Vec<(String, bool)>,
    /// Network namespaces and veth pairs can be made.
    pub namespaces: bool,
    /// Loss by iptables `statistic` drops.
    pub loss: bool,
    /// Rate by `tbf`.
    pub rate: bool,
    /// netem (delay in the kernel); when missing, the nodes delay their own sends.
    pub netem: bool,
}

impl Preflight {
    /// What stops an isolated run, if anything.
    pub fn problems(&self, shaping: &Shaping) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.root {
            problems
                .push("the isolated testnet needs root (namespaces, veth pairs, iptables)".into());
        }
        for (tool, found) in &self.tools {
            if !found {
                problems.push(format!(
                    "{tool} is missing (install iproute2, iptables and util-linux: scripts/lib.sh ensure_netns_tools)"
                ));
            }
        }
        if self.root && !self.namespaces {
            problems.push("network namespaces or veth pairs cannot be made here".into());
        }
        if shaping.loss_pct > 0.0 && !self.loss {
            problems
                .push("--loss needs the iptables statistic match, which this kernel lacks".into());
        }
        if shaping.rate.is_some() && !self.rate {
            problems.push("--rate needs the tbf qdisc, which this kernel lacks".into());
        }
        problems
    }

    /// One line: what shapes links here.
    pub fn summary(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        format!(
            "namespaces {}, loss (iptables statistic) {}, rate (tbf) {}, netem {} (delay and jitter: in the nodes' transport)",
            yes(self.namespaces),
            yes(self.loss),
            yes(self.rate),
            yes(self.netem)
        )
    }
}

/// Runs a command; its stderr in the error when it fails.
fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command inside a namespace.
fn run_in(netns: &str, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["netns", "exec", netns, program];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// Loss: drops `pct` percent of the packets arriving on the namespace's `eth0`.
fn drop_share(netns: &str, pct: f64) -> anyhow::Result<String> {
    let p = format!("{:.4}", pct / 100.0);
    run_in(
        netns,
        "iptables",
        &[
            "-A",
            "INPUT",
            "-i",
            "eth0",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            &p,
            "-j",
            "DROP",
        ],
    )
}

/// Rate: a `tbf` on the namespace's `eth0`.
fn limit_rate(netns: &str, rate: &str) -> anyhow::Result<String> {
    run_in(
        netns,
        "tc",
        &[
            "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "64kb", "latency",
            "200ms",
        ],
    )
}

fn found(tool: &str) -> bool {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .any(|dir| std::path::Path::new(dir).join(tool).exists())
}

/// Probes what the isolated testnet can use here, in a namespace of its own (removed after).
pub fn preflight() -> Preflight {
    let tools: Vec<(String, bool)> = ["ip", "iptables", "tc", "nsenter"]
        .iter()
        .map(|t| (t.to_string(), found(t)))
        .collect();
    let mut p = Preflight {
        root: nix::unistd::geteuid().is_root(),
        tools,
        ..Preflight::default()
    };
    if !p.root || p.tools.iter().any(|(_, f)| !f) {
        return p;
    }
    let ns = format!("gpux-{}-preflight", std::process::id());
    if run("ip", &["netns", "add", &ns]).is_err() {
        return p;
    }
    let probe = format!("gx{:x}pf", std::process::id());
    p.namespaces = run(
        "ip",
        &[
            "link", "add", &probe, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ],
    )
    .is_ok();
    if p.namespaces {
        let _ = run_in(&ns, "ip", &["link", "set", "eth0", "up"]);
        p.loss = drop_share(&ns, 1.0).is_ok();
        p.rate = limit_rate(&ns, "100mbit").is_ok();
        p.netem = run_in(
            &ns,
            "tc",
            &[
                "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", "1ms",
            ],
        )
        .is_ok();
    }
    let _ = run("ip", &["link", "del", &probe]);
    let _ = run("ip", &["netns", "del", &ns]);
    p
}

/// A node's place in the network.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The node's name.
    pub name: String,
    /// Its namespace.
    pub netns: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Behind a NAT of its own: the NAT's namespace and public address.
    pub nat: Option<Nat>,
}

/// A node's own NAT: a namespace routing between the node's private link and the bridge,
/// rewriting the node's outgoing connections to its own address (iptables `MASQUERADE`), so
/// others cannot dial the node, and the node can dial out.
#[derive(Debug, Clone)]
pub struct Nat {
    /// The NAT's namespace.
    pub netns: String,
    /// Its address on the bridge: the one others see the node's connections come from.
    pub public: Ipv4Addr,
}

impl Slot {
    /// The namespace's file, for `nsenter --net`.
    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.netns)
    }

    /// The address others see its connections come from.
    pub fn seen_at(&self) -> Ipv4Addr {
        self.nat.as_ref().map_or(self.ip, |n| n.public)
    }

    /// Its libp2p listen address.
    pub fn listen(&self) -> String {
        format!("/ip4/{}/tcp/{P2P_PORT}", self.ip)
    }
}

/// The run's network: a bridge, and a namespace per node.
#[derive(Debug)]
pub struct Network {
    /// `<pid hex>-<n>`: this process's n-th network; every link's name starts `gx<run>`.
    run: String,
    /// Tags the run's iptables rule: `gpux-<pid>-<n>`.
    tag: String,
    bridge: String,
    /// The second octet of the run's `10.X.0.0/16`.
    subnet: u8,
    slots: Vec<Slot>,
    shaping: Shaping,
    /// The root namespace's `FORWARD` rule, once inserted.
    forward_rule: bool,
    /// Links cut now.
    cuts: Vec<(String, String)>,
    /// The ARP table's limits, when the run raised them.
    neighbours: Option<neigh::Raised>,
    torn_down: bool,
}

/// Networks this process has made (each gets names of its own).
static NETWORKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Network {
    /// Makes the bridge (with the address `10.X.0.1/16`) and lets bridged packets through
    /// Docker's `FORWARD` policy. Leftovers of runs whose process is gone are removed first.
    pub fn create(shaping: Shaping) -> anyhow::Result<Network> {
        remove_stale();
        let pid = std::process::id();
        let n = NETWORKS.fetch_add(1, Ordering::Relaxed) % 100;
        let subnet = free_subnet()?;
        let run_id = format!("{pid:x}-{n}");
        let bridge = format!("gx{run_id}b");
        let mut net = Network {
            tag: format!("gpux-{pid}-{n}"),
            run: run_id,
            bridge: bridge.clone(),
            subnet,
            slots: Vec::new(),
            shaping,
            forward_rule: false,
            cuts: Vec::new(),
            neighbours: None,
            torn_down: false,
        };
        run("ip", &["link", "add", &bridge, "type", "bridge"])?;
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("10.{subnet}.0.1/16"),
                "dev",
                &bridge,
            ],
        )?;
        run("ip", &["link", "set", &bridge, "up"])?;
        let comment = net.tag.clone();
        run(
            "iptables",
            &[
                "-I",
                "FORWARD",
                "1",
                "-i",
                &bridge,
                "-o",
                &bridge,
                "-m",
                "comment",
                "--comment",
                &comment,
                "-j",
                "ACCEPT",
            ],
        )?;
        net.forward_rule = true;
        Ok(net)
    }

    /// Makes room in the kernel's ARP table, which every namespace shares, for a run of
    /// `nodes` (docs/testnet.md, "Room in the ARP table"); says what it changed, if anything.
    pub fn make_room(&mut self, nodes: usize) -> anyhow::Result<Option<String>> {
        if self.neighbours.is_some() {
            return Ok(None);
        }
        self.neighbours = neigh::make_room(nodes)?;
        Ok(self.neighbours.as_ref().map(neigh::Raised::describe))
    }

    /// The run's subnet, `10.X.0.0/16`.
    pub fn subnet(&self) -> String {
        format!("10.{}.0.0/16", self.subnet)
    }

    /// A namespace for node `name`, on the bridge, with its links shaped.
    pub fn add(&mut self, name: &str) -> anyhow::Result<Slot> {
        self.add_slot(name, false)
    }

    /// A namespace for node `name` behind a NAT of its own (see [`Nat`]): the node has a
    /// private address, `192.168.K.2/24`, and reaches the bridge through the NAT.
    pub fn add_behind_nat(&mut self, name: &str) -> anyhow::Result<Slot> {
        self.add_slot(name, true)
    }

    fn add_slot(&mut self, name: &str, nat: bool) -> anyhow::Result<Slot> {
        let i = self.slots.len();
        if i >= 250 * 250 {
            bail!("an isolated testnet holds at most {} nodes", 250 * 250);
        }
        let behind = self.slots.iter().filter(|s| s.nat.is_some()).count();
        if nat && behind >= 250 {
            bail!("an isolated testnet holds at most 250 nodes behind NAT");
        }
        // On the bridge: the node's address, or its NAT's.
        let ip = Ipv4Addr::new(10, self.subnet, (i / 250) as u8, (i % 250 + 2) as u8);
        let netns = format!("{}-{name}", self.tag);
        let outer = format!("gx{}v{i}", self.run);
        let inner = format!("gx{}p{i}", self.run);
        run("ip", &["netns", "add", &netns])?;
        // Recorded at once: a failure below still removes the namespace.
        self.slots.push(Slot {
            name: name.to_string(),
            netns: netns.clone(),
            ip,
            nat: None,
        });
        // The namespace on the bridge: the node's own, or its NAT's.
        let bridged = if nat {
            let router = format!("{}-{name}-nat", self.tag);
            run("ip", &["netns", "add", &router])?;
            self.slots[i].nat = Some(Nat {
                netns: router.clone(),
                public: ip,
            });
            router
        } else {
            netns.clone()
        };
        run(
            "ip",
            &[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &bridged,
            ],
        )?;
        run("ip", &["link", "set", &outer, "master", &self.bridge, "up"])?;
        run_in(&bridged, "ip", &["link", "set", &inner, "name", "eth0"])?;
        run_in(
            &bridged,
            "ip",
            &["addr", "add", &format!("{ip}/16"), "dev", "eth0"],
        )?;
        run_in(&bridged, "ip", &["link", "set", "eth0", "up"])?;
        run_in(&netns, "ip", &["link", "set", "lo", "up"])?;
        if nat {
            let private = Ipv4Addr::new(192, 168, (behind + 1) as u8, 2);
            let gateway = Ipv4Addr::new(192, 168, (behind + 1) as u8, 1);
            let lan = format!("gx{}n{i}", self.run);
            let node_end = format!("gx{}m{i}", self.run);
            run(
                "ip",
                &[
                    "link", "add", &lan, "type", "veth", "peer", "name", &node_end, "netns", &netns,
                ],
            )?;
            run("ip", &["link", "set", &lan, "netns", &bridged])?;
            run_in(&bridged, "ip", &["link", "set", &lan, "name", "lan0"])?;
            run_in(
                &bridged,
                "ip",
                &["addr", "add", &format!("{gateway}/24"), "dev", "lan0"],
            )?;
            run_in(&bridged, "ip", &["link", "set", "lan0", "up"])?;
            run_in(&bridged, "ip", &["link", "set", "lo", "up"])?;
            run_in(
                &bridged,
                "sh",
                &["-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
            )?;
            run_in(
                &bridged,
                "iptables",
                &[
                    "-t",
                    "nat",
                    "-A",
                    "POSTROUTING",
                    "-o",
                    "eth0",
                    "-j",
                    "MASQUERADE",
                ],
            )?;
            run_in(&netns, "ip", &["link", "set", &node_end, "name", "eth0"])?;
            run_in(
                &netns,
                "ip",
                &["addr", "add", &format!("{private}/24"), "dev", "eth0"],
            )?;
            run_in(&netns, "ip", &["link", "set", "eth0", "up"])?;
            run_in(
                &netns,
                "ip",
                &["route", "add", "default", "via", &gateway.to_string()],
            )?;
            self.slots[i].ip = private;
        }
        if self.shaping.loss_pct > 0.0 {
            drop_share(&netns, self.shaping.loss_pct)?;
        }
        if let Some(rate) = &self.shaping.rate {
            limit_rate(&netns, rate)?;
        }
        Ok(self.slots.last().cloned().expect("just added"))
    }

    /// What every node of this network runs with: the delay its sends get.
    pub fn node_args(&self) -> Vec<String> {
        if self.shaping.delay_ms == 0 {
            return Vec::new();
        }
        vec![
            "--link-delay-ms".into(),
            self.shaping.delay_ms.to_string(),
            "--link-jitter-ms".into(),
            self.shaping.jitter_ms.to_string(),
        ]
    }

    /// How its links are shaped.
    pub fn shaping(&self) -> &Shaping {
        &self.shaping
    }

    /// The slot of node `name`.
    pub fn slot(&self, name: &str) -> Option<&Slot> {
        self.slots.iter().find(|s| s.name == name)
    }

    /// Every node's address, by name.
    pub fn addresses(&self) -> std::collections::BTreeMap<String, String> {
        self.slots
            .iter()
            .map(|s| (s.name.clone(), s.ip.to_string()))
            .collect()
    }

    /// The nodes behind a NAT of their own, by name: the address others see them at.
    pub fn behind_nat(&self) -> std::collections::BTreeMap<String, String> {
        self.slots
            .iter()
            .filter_map(|s| Some((s.name.clone(), s.nat.as_ref()?.public.to_string())))
            .collect()
    }

    fn cut_rules(&self, a: &str, b: &str, op: &str) -> anyhow::Result<()> {
        let (Some(sa), Some(sb)) = (self.slot(a), self.slot(b)) else {
            bail!("no node {a} or {b} in this network");
        };
        for (at, from) in [(sa, sb), (sb, sa)] {
            run_in(
                &at.netns,
                "iptables",
                &[op, "INPUT", "-s", &from.seen_at().to_string(), "-j", "DROP"],
            )?;
        }
        Ok(())
    }

    /// Cuts the link between nodes `a` and `b`: nothing passes either way until it heals.
    pub fn cut(&mut self, a: &str, b: &str) -> anyhow::Result<()> {
        self.cut_rules(a, b, "-I")?;
        self.cuts.push((a.to_string(), b.to_string()));
        Ok(())
    }

    /// Heals a link [`Network::cut`] cut.
    pub fn heal(&mut self, a: &str, b: &str) -> anyhow::Result<()> {
        self.cut_rules(a, b, "-D")?;
        self.cuts.retain(|(x, y)| !(x == a && y == b));
        Ok(())
    }

    /// Removes everything the run made; what could not be removed, as errors.
    pub fn teardown(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let mut errors = Vec::new();
        for i in 0..self.slots.len() {
            // Deleting one end deletes the pair at once; a namespace goes only when the last
            // thing in it does.
            let _ = run("ip", &["link", "del", &format!("gx{}v{i}", self.run)]);
        }
        for slot in &self.slots {
            // The namespace takes its end of the veth pair, and so the pair, with it.
            let nat = slot.nat.as_ref().map(|n| n.netns.as_str());
            for netns in std::iter::once(slot.netns.as_str()).chain(nat) {
                if let Err(e) = run("ip", &["netns", "del", netns]) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
        if let Err(e) = run("ip", &["link", "del", &self.bridge]) {
            errors.push(format!("{e:#}"));
        }
        if self.forward_rule {
            let comment = self.tag.clone();
            if let Err(e) = run(
                "iptables",
                &[
                    "-D",
                    "FORWARD",
                    "-i",
                    &self.bridge,
                    "-o",
                    &self.bridge,
                    "-m",
                    "comment",
                    "--comment",
                    &comment,
                    "-j",
                    "ACCEPT",
                ],
            ) {
                errors.push(format!("{e:#}"));
            }
        }
        if let Some(raised) = self.neighbours.take()
            && let Err(e) = raised.restore()
        {
            errors.push(format!("putting the ARP table's limits back: {e:#}"));
        }
        errors
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // `up` tears down itself and reports what failed; this is the path of an early
        // error, which has its own to report.
        let _ = self.teardown();
    }
}

/// What a run of process `pid` left on this machine: its namespaces, links and rules.
pub fn leftovers(pid: u32) -> Vec<String> {
    let mut left = Vec::new();
    let prefix = format!("gpux-{pid}-");
    if let Ok(list) = run("ip", &["netns", "list"]) {
        left.extend(
            list.lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|n| n.starts_with(&prefix))
                .map(|n| format!("namespace {n}")),
        );
    }
    let link = format!("gx{pid:x}-");
    if let Ok(list) = run("ip", &["-o", "link", "show"]) {
        left.extend(
            list.lines()
                .filter_map(|l| l.split(':').nth(1))
                .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
                .filter(|n| n.starts_with(&link))
                .map(|n| format!("link {n}")),
        );
    }
    left.extend(forward_rules(pid).into_iter().map(|r| format!("rule {r}")));
    left
}

/// The root namespace's `FORWARD` rules tagged by process `pid`'s runs (`iptables -S`
/// lines).
fn forward_rules(pid: u32) -> Vec<String> {
    let tag = format!("gpux-{pid}-");
    run("iptables", &["-S", "FORWARD"])
        .map(|rules| {
            rules
                .lines()
                .filter(|r| r.starts_with("-A FORWARD") && r.contains(&tag))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Removes what runs whose process is gone left behind (a run killed with SIGKILL).
fn remove_stale() {
    let Ok(list) = run("ip", &["netns", "list"]) else {
        return;
    };
    let mut dead = std::collections::BTreeSet::new();
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix("gpux-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", name]);
            dead.insert(pid);
        }
    }
    for pid in dead {
        for left in leftovers(pid) {
            if let Some(link) = left.strip_prefix("link ") {
                let _ = run("ip", &["link", "del", link]);
            }
        }
        for rule in forward_rules(pid) {
            let args: Vec<String> = rule
                .replacen("-A", "-D", 1)
                .split_whitespace()
                .map(|a| a.trim_matches('"').to_string())
                .collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let _ = run("iptables", &args);
        }
    }
}

/// The first `10.X.0.0/16` (X from 100) no address or route on this machine falls in.
fn free_subnet() -> anyhow::Result<u8> {
    let used = run("ip", &["-4", "-o", "addr", "show"])? + &run("ip", &["-4", "route", "show"])?;
    (100..=199u8)
        .find(|x| !used.contains(&format!("10.{x}.")))
        .context("no free 10.X.0.0/16 for the isolated network (10.100-10.199 are all in use)")
}

/// A TCP port on the root namespace's loopback that leads to a port on a node namespace's
/// loopback (where the node's API listens).
#[derive(Debug)]
pub struct Forward {
    /// The port in the root namespace.
    pub port: u16,
    target: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
    /// The connections it carries now (shut at its end: their threads hold the namespace).
    open: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, TcpStream>>>,
}

impl Forward {
    /// Listens on `127.0.0.1:0` here; connections go to the namespace's loopback, at the
    /// port [`Forward::point`] sets.
    pub fn new(netns: PathBuf) -> anyhow::Result<Forward> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let target = Arc::new(AtomicU16::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let open: Arc<std::sync::Mutex<std::collections::BTreeMap<u64, TcpStream>>> =
            Arc::default();
        let (t, s, o) = (target.clone(), stop.clone(), open.clone());
        std::thread::Builder::new()
            .name("netns-forward".into())
            .spawn(move || {
                for (id, conn) in (0u64..).zip(listener.incoming()) {
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    if let (Ok(copy), Ok(mut open)) = (conn.try_clone(), o.lock()) {
                        open.insert(id, copy);
                    }
                    let (netns, to, o) = (netns.clone(), t.load(Ordering::Relaxed), o.clone());
                    let _ = std::thread::Builder::new()
                        .name("netns-forward-conn".into())
                        .spawn(move || {
                            // A failed connection is the client's error to see.
                            let _ = carry(conn, &netns, to);
                            if let Ok(mut open) = o.lock() {
                                open.remove(&id);
                            }
                        });
                }
            })?;
        Ok(Forward {
            port,
            target,
            stop,
            open,
        })
    }

    /// Where connections go from now on: this port on the namespace's loopback.
    pub fn point(&self, port: u16) {
        self.target.store(port, Ordering::Relaxed);
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the listener so it sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Ok(open) = self.open.lock() {
            for conn in open.values() {
                let _ = conn.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// Carries one connection: this thread enters the namespace (threads have namespaces of
/// their own), connects there, and copies both ways until either side closes.
fn carry(conn: TcpStream, netns: &std::path::Path, port: u16) -> anyhow::Result<()> {
    let file =
        std::fs::File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .context("entering the namespace")?;
    let inner = TcpStream::connect(("127.0.0.1", port))?;
    let (mut a, mut b) = (conn.try_clone()?, inner.try_clone()?);
    let back = std::thread::spawn(move || {
        let _ = pipe(&mut b, &mut a);
    });
    let (mut conn, mut inner) = (conn, inner);
    let _ = pipe(&mut conn, &mut inner);
    let _ = back.join();
    Ok(())
}

fn pipe(from: &mut TcpStream, to: &mut TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            let _ = to.shutdown(std::net::Shutdown::Write);
            return Ok(());
        }
        to.write_all(&buf[..n])?;
    }
}

mod neigh;
#[cfg(test)]
mod tests;
