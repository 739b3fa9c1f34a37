//! A small market of real `gpux node run` processes on loopback for the lease tests: one
//! ledger node, hosts with fake GPUs (real NVML code path, real Docker), and renters. Nodes
//! can be killed with SIGKILL and started again on the same data dir and port.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpux_api::{LeaseView, LedgerTotals};
use gpux_client::ApiClient;
use gpux_testnet::harness;
use serde_json::Value;

/// Timing the market's nodes run with (seconds).
/// The notice a test host gives a spot lease before it preempts it, seconds.
pub const SPOT_NOTICE_S: u64 = 6;
pub const RECEIPT_INTERVAL_S: u64 = 1;
pub const LEDGER_GRACE_S: u64 = 5;
/// Credits each node gets from the faucet.
pub const FAUCET_MICRO: u64 = 100_000_000;

/// A node process of the market: the testnet's harness, with the tests' shortcuts (a
/// failure to start or to reach the API fails the test).
pub struct Node(harness::Node);

impl std::ops::Deref for Node {
    type Target = harness::Node;
    fn deref(&self) -> &harness::Node {
        &self.0
    }
}

impl std::ops::DerefMut for Node {
    fn deref_mut(&mut self) -> &mut harness::Node {
        &mut self.0
    }
}

impl Node {
    pub fn spawn(&mut self) {
        self.0.spawn().unwrap();
    }

    /// Starts the node again on the same data dir and port.
    pub fn restart(&mut self) {
        self.0.restart().unwrap();
    }

    pub fn api(&self) -> ApiClient {
        self.0.api().unwrap()
    }

    /// One of this node's leases (panics when it has none by that id).
    pub fn lease(&self, id: &str) -> LeaseView {
        self.leases()
            .into_iter()
            .find(|l| l.lease == id)
            .unwrap_or_else(|| panic!("{} has no lease {id}", self.name))
    }

    /// Runs a `gpux` command against this node's data dir.
    pub fn gpux(&self, args: &[&str]) -> std::process::Output {
        self.0.gpux(args).unwrap()
    }
}

/// Stops hosts first (they settle their leases while the renters and the ledger still run),
/// then everyone else; then erases any container a host of this market left behind (a test
/// that failed half-way), so the machine stays clean.
impl Drop for Market {
    fn drop(&mut self) {
        for host in &mut self.hosts {
            host.stop(25);
        }
        for renter in &mut self.renters {
            renter.stop(5);
        }
        self.ledger.stop(5);
        for host in &self.hosts {
            let ids = Command::new("docker")
                .args([
                    "ps",
                    "-aq",
                    "--filter",
                    &format!("label=gpux.node={}", host.peer),
                ])
                .output();
            if let Ok(out) = ids {
                for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("docker").args(["rm", "-f", id]).output();
                }
            }
        }
        // And any workspace a host kept mounted (a retention cut short by the test's end).
        let base = self._tmp.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for point in mounts.lines().filter_map(|l| l.split(' ').nth(4)) {
            if point.starts_with(&base) {
                let _ = Command::new("umount").args(["-l", point]).output();
            }
        }
    }
}

pub struct Market {
    pub ledger: Node,
    pub hosts: Vec<Node>,
    pub renters: Vec<Node>,
    pub image: String,
    ledger_addr: String,
    ack_grace_s: u64,
    /// The receipt interval of each host added, seconds.
    pub receipt_interval_s: u64,
    /// Fake L4s on each host added.
    pub gpus_per_host: usize,
    /// More flags for each host added (`--cpus 32`).
    pub host_extra: Vec<String>,
    _tmp: tempfile::TempDir,
}

pub fn new_node(base: &Path, name: &str, args: Vec<String>, env: Vec<(String, PathBuf)>) -> Node {
    Node(harness::Node::new(Path::new(gpux_e2e::gpux()), base, name, args, env).unwrap())
}

pub fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out after {secs} s waiting for {what}");
}

fn fake_lib() -> PathBuf {
    super::attest_lib()
}

impl Market {
    /// A ledger, `hosts` hosts with one fake L4 each (price 3.60/h: 1000 µcr per second),
    /// and `renters` renters, every one funded by the faucet; returns once every renter
    /// sees every host's offer. Hosts wait `ack_grace_s` for an acknowledgement.
    pub fn start(hosts: usize, renters: usize, ack_grace_s: u64) -> Market {
        Self::start_with(hosts, 1, renters, ack_grace_s)
    }

    /// The same with `gpus_per_host` fake L4s on each host.
    pub fn start_with(
        hosts: usize,
        gpus_per_host: usize,
        renters: usize,
        ack_grace_s: u64,
    ) -> Market {
        let image = gpux_testnet::build_image().expect("building the workload image (Docker)");
        Self::start_image(hosts, gpus_per_host, renters, ack_grace_s, image)
    }

    /// The same with hosts that offer `image` (already built).
    pub fn start_image(
        hosts: usize,
        gpus_per_host: usize,
        renters: usize,
        ack_grace_s: u64,
        image: String,
    ) -> Market {
        let tmp = tempfile::tempdir().unwrap();
        let mut ledger = new_node(
            tmp.path(),
            "ledger",
            vec![
                "--serve-ledger".into(),
                "--ledger-release-grace".into(),
                LEDGER_GRACE_S.to_string(),
            ],
            vec![],
        );
        ledger.spawn();
        let ledger_addr = format!("{}/p2p/{}", ledger.addr, ledger.peer);
        let mut market = Market {
            ledger,
            hosts: Vec::new(),
            renters: Vec::new(),
            image,
            ledger_addr,
            ack_grace_s,
            receipt_interval_s: RECEIPT_INTERVAL_S,
            gpus_per_host,
            host_extra: Vec::new(),
            _tmp: tmp,
        };
        for _ in 0..hosts {
            market.add_host();
        }
        for r in 0..renters {
            let mut n = new_node(
                market._tmp.path(),
                &format!("renter-{r}"),
                market.common(),
                vec![],
            );
            n.spawn();
            market.fund(&n);
            market.renters.push(n);
        }
        for r in &market.renters {
            wait_for("the offers to reach the renters", 30, || {
                r.api().status().is_ok_and(|s| s.offers_in_book >= hosts)
            });
        }
        market
    }

    /// Renters keep the default receipt timing (60 s, 30 s): their watchdogs must go by the
    /// timing each host announces in its acceptance.
    fn common(&self) -> Vec<String> {
        vec![
            "--bootstrap".to_string(),
            self.ledger_addr.clone(),
            "--ledger".into(),
            self.ledger_addr.clone(),
        ]
    }

    fn fund(&self, n: &Node) {
        let done = self.ledger.api().mint(&gpux_api::MintRequest {
            account: n.peer.clone(),
            amount: "100".into(),
            grant: None,
        });
        assert!(done.is_ok(), "{done:?}");
    }

    /// Starts (and funds) one more host with fake L4s.
    pub fn add_host(&mut self) {
        self.add_host_of("NVIDIA L4", 24152899584, (8, 9));
    }

    /// Starts (and funds) one more host whose fake GPUs say they are `name`.
    pub fn add_host_of(&mut self, name: &str, memory: u64, cc: (u8, u8)) {
        let h = self.hosts.len();
        let toml: String = (0..self.gpus_per_host)
            .map(|g| format!("[[gpu]]\nname = \"{name}\"\nuuid = \"GPU-{h:08x}-{g:04x}-3333-4444-555555555555\"\nmemory_total_bytes = {memory}\ncompute_capability = [{}, {}]\nutilization_gpu = 87\n", cc.0, cc.1))
            .collect();
        self.add_host_config(&toml);
    }

    /// Starts (and funds) one more host whose fake driver reads `toml` (`[[gpu]]` tables).
    pub fn add_host_config(&mut self, toml: &str) {
        self.add_host_config_in(toml, "eu-west");
    }

    /// The same, in `region`.
    pub fn add_host_config_in(&mut self, toml: &str, region: &str) {
        let h = self.hosts.len();
        let gpus = self._tmp.path().join(format!("gpus-{h}.toml"));
        std::fs::write(&gpus, toml).unwrap();
        let mut args = self.common();
        args.extend(
            [
                "--host",
                "--fake-gpus",
                "--nvml-lib",
                fake_lib().to_str().unwrap(),
                "--image",
                &self.image,
                "--price",
                "3.60",
                // Kept workspaces at 36 credits per GiB-hour: 32 MiB for 2 s is 625 µcr.
                "--disk-price",
                "36",
                "--region",
                region,
                "--min-duration",
                "1",
                "--republish",
                "3",
                "--receipt-interval",
                &self.receipt_interval_s.to_string(),
                "--ack-grace",
                &self.ack_grace_s.to_string(),
                // Spot leases from 1 credit per GPU-hour, preempted with 6 s of notice.
                "--spot-floor",
                "1.00",
                "--spot-notice",
                &SPOT_NOTICE_S.to_string(),
            ]
            .map(String::from),
        );
        args.extend(self.host_extra.iter().cloned());
        let mut n = new_node(
            self._tmp.path(),
            &format!("host-{h}"),
            args,
            vec![("GPUX_FAKE_NVML_CONFIG".into(), gpus)],
        );
        n.spawn();
        self.fund(&n);
        self.hosts.push(n);
    }

    /// Starts (and funds) one more renter with `extra` flags.
    pub fn add_renter(&mut self, extra: &[String]) {
        self.add_renter_waiting(extra, true);
    }

    /// The same, waiting for the offers only when `wait` (a renter may follow a family
    /// nobody offers).
    pub fn add_renter_waiting(&mut self, extra: &[String], wait: bool) {
        let r = self.renters.len();
        let mut args = self.common();
        args.extend(extra.iter().cloned());
        let mut n = new_node(self._tmp.path(), &format!("renter-{r}"), args, vec![]);
        n.spawn();
        self.fund(&n);
        let hosts = self.hosts.len();
        if wait {
            wait_for("the offers to reach the new renter", 30, || {
                n.api().status().is_ok_and(|s| s.offers_in_book >= hosts)
            });
        }
        self.renters.push(n);
    }

    /// The ledger node's view: balances by peer id, totals.
    pub fn ledger_state(&self) -> LedgerTotals {
        self.ledger.api().ledger().unwrap()
    }

    pub fn balance(&self, node: &Node) -> u64 {
        self.ledger_state()
            .balances
            .get(&node.peer)
            .copied()
            .unwrap_or(0)
    }

    /// Every credit minted is held by someone or in an open escrow, exactly.
    pub fn assert_conserved(&self) {
        let state = self.ledger_state();
        let sum: u64 = state.balances.values().sum();
        assert_eq!(state.total_micro, state.minted_micro, "{state:?}");
        if state.open_escrows == 0 {
            assert_eq!(sum, state.minted_micro, "credits not conserved: {state:?}");
        }
    }

    /// Rents one GPU running `script` for `duration_s`; returns the lease id.
    pub fn rent(&self, renter: &Node, duration_s: u64, script: &str) -> String {
        self.rent_with(renter, duration_s, script, &[])
    }

    /// `gpux rent QUERY OPTIONS --image IMAGE --json -- sh -c SCRIPT` by `renter`, as it
    /// came out (for tests that look at a refusal as well as a success).
    pub fn rent_output(
        &self,
        renter: &Node,
        query: &str,
        options: &[&str],
        script: &str,
    ) -> std::process::Output {
        let mut args = vec!["rent", query];
        args.extend_from_slice(options);
        args.extend_from_slice(&["--image", &self.image, "--json", "--", "sh", "-c", script]);
        renter.gpux(&args)
    }

    /// The same with more `gpux rent` options (`--disk 32MiB`).
    pub fn rent_with(&self, renter: &Node, duration_s: u64, script: &str, more: &[&str]) -> String {
        let duration = duration_s.to_string();
        let mut args = vec![
            "rent",
            "gpu=l4",
            "--max-price",
            "5",
            "--duration",
            &duration,
            "--image",
            &self.image,
            "--json",
        ];
        args.extend_from_slice(more);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let out = renter.gpux(&args);
        assert!(
            out.status.success(),
            "rent failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lease: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
        lease.lease
    }
}

/// Lease containers (any state) Docker has for a lease label.
pub fn docker_containers(lease: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=gpux.lease={lease}"),
        ])
        .output()
        .expect("the docker CLI");
    assert!(out.status.success(), "docker ps: {:?}", out);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Volumes Docker has with a lease's label.
pub fn docker_volumes(lease: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "volume",
            "ls",
            "-q",
            "--filter",
            &format!("label=gpux.lease={lease}"),
        ])
        .output()
        .expect("the docker CLI");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// `docker inspect` of one container.
pub fn docker_inspect(id: &str) -> Value {
    let out = Command::new("docker")
        .args(["inspect", id])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0].clone()
}
