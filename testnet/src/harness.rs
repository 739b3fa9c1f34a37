//! The process harness: `gpux node run` processes on loopback, each with its own data dir,
//! port and log, that can be stopped (through its API, or SIGTERM), killed (SIGKILL) and
//! started again on the same data dir and port. `gpux testnet up` runs its market on it, and so do the
//! integration tests (`cli/tests`), so there is one way to run a node as a process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gpux_api::LeaseView;
use gpux_client::ApiClient;

/// How long a node may take to bring its API up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A free TCP port on 127.0.0.1 (bound and released: good enough for a local market).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One node process.
#[derive(Debug)]
pub struct Node {
    /// Its name (`ledger`, `host-0`, ...), also its data dir's name.
    pub name: String,
    /// Its data dir.
    pub dir: PathBuf,
    /// Its libp2p address, without `/p2p`.
    pub addr: String,
    /// Its peer id, once started.
    pub peer: String,
    gpux: PathBuf,
    args: Vec<String>,
    env: Vec<(String, PathBuf)>,
    child: Option<Child>,
    /// Its own network namespace, in an isolated testnet.
    place: Option<Place>,
    /// Its scheduling niceness, when not the default (`nice -n`).
    niceness: Option<i32>,
}

/// Where an isolated node runs: its namespace and address, and the forwarders that carry
/// its API and `/metrics` from the root namespace into it.
#[derive(Debug)]
pub struct Place {
    /// Its slot in the run's network.
    pub slot: crate::netns::Slot,
    api: crate::netns::Forward,
    metrics: crate::netns::Forward,
}

impl Node {
    /// A node named `name` under `base`, listening on a free loopback port, run by `gpux`
    /// with `args` (after `node run --data-dir DIR --listen ADDR`) and `env`.
    pub fn new(
        gpux: &Path,
        base: &Path,
        name: &str,
        args: Vec<String>,
        env: Vec<(String, PathBuf)>,
    ) -> anyhow::Result<Node> {
        Node::new_at(gpux, base, name, args, env, None)
    }

    /// A node in its own namespace of `net`, its sends delayed as the network's shaping
    /// says; on loopback without one.
    pub fn placed(
        gpux: &Path,
        base: &Path,
        name: &str,
        mut args: Vec<String>,
        env: Vec<(String, PathBuf)>,
        net: Option<&mut crate::netns::Network>,
        behind_nat: bool,
    ) -> anyhow::Result<Node> {
        match net {
            None => Node::new(gpux, base, name, args, env),
            Some(net) => {
                let slot = if behind_nat {
                    net.add_behind_nat(name)?
                } else {
                    net.add(name)?
                };
                args.extend(net.node_args());
                Node::new_at(gpux, base, name, args, env, Some(slot))
            }
        }
    }

    /// A node as [`Node::new`] makes, or, given a slot of an isolated network, one that runs
    /// in its namespace and listens on its address.
    pub fn new_at(
        gpux: &Path,
        base: &Path,
        name: &str,
        args: Vec<String>,
        env: Vec<(String, PathBuf)>,
        slot: Option<crate::netns::Slot>,
    ) -> anyhow::Result<Node> {
        let dir = base.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (addr, place) = match slot {
            None => (format!("/ip4/127.0.0.1/tcp/{}", free_port()?), None),
            Some(slot) => (
                slot.listen(),
                Some(Place {
                    api: crate::netns::Forward::new(slot.netns_path())?,
                    metrics: crate::netns::Forward::new(slot.netns_path())?,
                    slot,
                }),
            ),
        };
        let mut all = vec!["--listen".to_string(), addr.clone()];
        all.extend(args);
        Ok(Node {
            name: name.into(),
            dir,
            addr,
            peer: String::new(),
            gpux: gpux.to_path_buf(),
            args: all,
            env,
            child: None,
            place,
            niceness: None,
        })
    }

    /// Its namespace and address, when it runs in an isolated network.
    pub fn place(&self) -> Option<&Place> {
        self.place.as_ref()
    }

    /// Runs it at `niceness` from its next start (`nice -n`; below 0 needs root, and
    /// without it the node runs at the default, `nice` saying so in its log).
    pub fn set_niceness(&mut self, niceness: i32) {
        self.niceness = Some(niceness);
    }

    /// More arguments for its next start.
    pub fn add_args(&mut self, more: impl IntoIterator<Item = String>) {
        self.args.extend(more);
    }

    /// Starts it (appending to `<dir>/node.log`) and waits for its API; a node that exits
    /// instead is an error with the last line it logged.
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(self.dir.join("api.addr"));
        let _ = std::fs::remove_file(self.dir.join(gpux_node::metrics::ADDR_FILE));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("node.log"))?;
        // `nice` and `nsenter` each exec the next: the child's pid is the node's.
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(n) = self.niceness {
            argv.extend(["nice".into(), "-n".into(), n.to_string().into()]);
        }
        // Only its network apart: it shares the files, mounts and Docker socket.
        if let Some(place) = &self.place {
            let net = format!("--net={}", place.slot.netns_path().display());
            argv.extend(["nsenter".into(), net.into(), "--".into()]);
        }
        argv.push(self.gpux.clone().into());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        // Run from beside its data dir, which it is given by a relative path, as people
        // start nodes by hand (`--data-dir ./host`): nothing a node does may hang on the
        // path being absolute.
        let (beside, name) = match (self.dir.parent(), self.dir.file_name()) {
            (Some(beside), Some(name)) => (beside, Path::new(name)),
            _ => (Path::new("/"), self.dir.as_path()),
        };
        cmd.current_dir(beside)
            .args(["node", "run", "--data-dir"])
            .arg(Path::new(".").join(name))
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.gpux.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.dir.join("api.addr").exists() {
                break;
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || Instant::now() >= deadline {
                let log = self.log();
                bail!(
                    "{} did not start: {}",
                    self.name,
                    log.lines().last().unwrap_or("no output")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(place) = &self.place {
            place.reach(&self.dir)?;
        }
        self.peer = gpux_node::load_key(&self.dir)?.peer_id().to_string();
        Ok(())
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no shutdown, no flush beyond what was already flushed.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Asks it to stop and end its leases first (`POST /v1/shutdown` with `end_leases`, what
    /// `gpux node stop --end-leases` sends): a host's leases end and settle on its way out.
    /// SIGTERM when its API does not answer at once (a host then leaves its leases' containers
    /// running for its next start).
    pub fn ask_to_stop(&self) {
        if self.child.is_none() {
            return;
        }
        let asked = self.api().is_ok_and(|api| {
            api.with_timeout(Duration::from_secs(2))
                .shutdown(true)
                .is_ok()
        });
        if !asked {
            self.terminate();
        }
    }

    /// Sends SIGTERM: the node stops, and a host leaves its leases running for its next
    /// start on the same data dir.
    pub fn terminate(&self) {
        if let Some(pid) = self.pid().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    /// Waits until it exited, at most until `deadline`; then SIGKILL. True when it exited by
    /// itself.
    pub fn reap(&mut self, deadline: Instant) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// [`Node::ask_to_stop`] (a host's leases end), then SIGKILL if it has not exited
    /// within `secs`. True when it exited by itself.
    pub fn stop(&mut self, secs: u64) -> bool {
        self.ask_to_stop();
        self.reap(Instant::now() + Duration::from_secs(secs))
    }

    /// Starts it again on the same data dir and port (killing it first if it runs).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.spawn()
    }

    /// Runs `gpux` from now on (an upgrade: the next start runs the new binary).
    pub fn set_binary(&mut self, gpux: PathBuf) {
        self.gpux = gpux;
    }

    /// A client of its API.
    pub fn api(&self) -> anyhow::Result<ApiClient> {
        Ok(ApiClient::for_data_dir(&self.dir)?)
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("node.log")).unwrap_or_default()
    }

    /// Its leases (none when its API does not answer).
    pub fn leases(&self) -> Vec<LeaseView> {
        self.api()
            .ok()
            .and_then(|a| a.leases().ok())
            .unwrap_or_default()
    }

    /// A lease's phase here, or "" when it does not know it (yet).
    pub fn phase(&self, lease: &str) -> String {
        self.leases()
            .into_iter()
            .find(|l| l.lease == lease)
            .map(|l| l.phase)
            .unwrap_or_default()
    }

    /// Runs a `gpux` command against its data dir.
    pub fn gpux(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        self.gpux_command(args).output()
    }

    /// A `gpux` command against this node's data dir, to spawn with pipes of one's own.
    pub fn gpux_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.gpux);
        command.arg("--data-dir").arg(&self.dir).args(args);
        command
    }
}

impl Place {
    /// Points the forwarders at the ports the node bound inside its namespace, and its
    /// `api.addr` and `metrics.addr` at the forwarders, so every client here (the testnet,
    /// `gpux` commands on its data dir) reaches it.
    fn reach(&self, dir: &Path) -> anyhow::Result<()> {
        let rewrite = |file: &str, forward: &crate::netns::Forward| -> anyhow::Result<bool> {
            let path = dir.join(file);
            let Ok(text) = std::fs::read_to_string(&path) else {
                return Ok(false);
            };
            let inner: std::net::SocketAddr = text
                .trim()
                .parse()
                .with_context(|| format!("reading {}", path.display()))?;
            forward.point(inner.port());
            let outer = format!("127.0.0.1:{}", forward.port);
            let temp = path.with_extension("forwarded");
            std::fs::write(&temp, outer)?;
            std::fs::rename(&temp, &path)?;
            Ok(true)
        };
        rewrite(gpux_api::ADDR_FILE, &self.api)?;
        // `/metrics` binds before the API answers, when it listens at all.
        rewrite(gpux_node::metrics::ADDR_FILE, &self.metrics)?;
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Stops every node (all asked at once, hosts ending their leases: [`Node::ask_to_stop`],
/// then up to `secs` for each to exit, then SIGKILL); the names of those that had to be
/// killed.
pub fn stop_all<'a>(nodes: impl IntoIterator<Item = &'a mut Node>, secs: u64) -> Vec<String> {
    let nodes: Vec<&mut Node> = nodes.into_iter().collect();
    for node in &nodes {
        node.ask_to_stop();
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut killed = Vec::new();
    for node in nodes {
        if !node.reap(deadline) {
            killed.push(node.name.clone());
        }
    }
    killed
}

/// A benchmark's market: a ledger node, a host with one fake L4 offering `image` and a
/// renter, both funded (1000 credits), the host's offer in the renter's book.
pub(crate) struct BenchNodes {
    pub(crate) ledger: Node,
    pub(crate) host: Node,
    pub(crate) renter: Node,
}

/// Starts a [`BenchNodes`] under `base`.
pub(crate) fn bench_nodes(gpux: &Path, base: &Path, image: &str) -> anyhow::Result<BenchNodes> {
    let fake = crate::fake_nvml_beside(gpux)?;
    let api = || vec!["--api".to_string(), "127.0.0.1:0".to_string()];
    let mut ledger_args = api();
    ledger_args.push("--serve-ledger".into());
    let mut ledger = Node::new(gpux, base, "ledger", ledger_args, vec![])?;
    ledger.spawn()?;
    let ledger_addr = format!("{}/p2p/{}", ledger.addr, ledger.peer);
    let mut joined = api();
    joined.extend(["--bootstrap", &ledger_addr, "--ledger", &ledger_addr].map(String::from));
    let gpus = base.join("gpus.toml");
    std::fs::write(
        &gpus,
        "[[gpu]]\nname = \"NVIDIA L4\"\nuuid = \"GPU-0000beef-0000-4000-8000-000000000002\"\nmemory_total_bytes = 24152899584\ncompute_capability = [8, 9]\n",
    )?;
    let mut host_args = joined.clone();
    host_args.extend(
        [
            "--host",
            "--fake-gpus",
            "--nvml-lib",
            &fake.display().to_string(),
            "--image",
            image,
            "--price",
            "3.60",
            "--min-duration",
            "1",
            "--receipt-interval",
            "1",
            "--republish",
            "2",
        ]
        .map(String::from),
    );
    let mut host = Node::new(
        gpux,
        base,
        "host",
        host_args,
        vec![("GPUX_FAKE_NVML_CONFIG".into(), gpus)],
    )?;
    host.spawn()?;
    let mut renter = Node::new(gpux, base, "renter", joined, vec![])?;
    renter.spawn()?;
    let ledger_api = ledger.api()?;
    for node in [&host, &renter] {
        ledger_api.mint(&gpux_api::MintRequest {
            account: node.peer.clone(),
            amount: "1000".into(),
            grant: None,
        })?;
    }
    let start = Instant::now();
    while renter.api()?.status().map_or(0, |s| s.offers_in_book) == 0 {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "no offer reached the renter"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(BenchNodes {
        ledger,
        host,
        renter,
    })
}

/// Whether `done` comes true within `within` (asked every 250 ms, and once more at the end).
pub(crate) fn wait(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    done()
}
