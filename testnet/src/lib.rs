//! `gpux testnet up`: a whole market on one machine.
//!
//! Starts N hosts and M renters as separate `gpux node run` processes on loopback, each with
//! its own data dir, key and port; the hosts read fake GPUs of assorted models and prices
//! through the fake NVML driver (the real NVML code path runs). It waits for the offers to
//! spread, lets every renter rent, shows progress, and writes a JSON report. Every process it
//! started is stopped at the end, on Ctrl-C, or if it fails; none is left behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gpux_node::api_client::ApiClient;

/// What to run.
#[derive(Debug, Clone)]
pub struct TestnetConfig {
    /// Host nodes.
    pub hosts: usize,
    /// Renter nodes.
    pub renters: usize,
    /// How long to run after the mesh is up.
    pub duration: Duration,
    /// The `gpux` binary to start nodes with.
    pub gpux: PathBuf,
    /// Where data dirs go (a temporary directory when `None`, removed at the end).
    pub base_dir: Option<PathBuf>,
}

/// The run's outcome, written as JSON.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// Processes started.
    pub nodes: usize,
    /// Distinct offers live at the end (all hosts' own offers).
    pub offers_published: usize,
    /// The fewest of those any renter's book holds.
    pub offers_seen_min: usize,
    /// Offers published before anyone rented (one per host).
    pub offers_before_renting: usize,
    /// The fewest of those any renter's book held before renting began.
    pub offers_seen_min_before_renting: usize,
    /// Median delay from an offer's signing to its arrival at a renter, ms.
    pub propagation_ms_p50: u64,
    /// 95th percentile of that delay, ms.
    pub propagation_ms_p95: u64,
    /// Arrivals the percentiles are computed from.
    pub propagation_samples: usize,
    /// Leases agreed (accepted by a host).
    pub leases_agreed: usize,
    /// GPUs booked for two overlapping leases (must be 0).
    pub double_allocations: usize,
    /// Gossip messages rejected by validation, over all nodes.
    pub rejected_messages: u64,
    /// Median resident memory of the node processes once the offers had spread, KiB.
    pub node_rss_kb_median: u64,
    /// Largest resident memory of a node process at that time, KiB.
    pub node_rss_kb_max: u64,
    /// Anything that went wrong.
    pub errors: Vec<String>,
    /// Seconds the whole run took.
    pub elapsed_s: f64,
}

/// GPU models the fake hosts pretend to have: (NVML name, memory bytes, cc, base price).
const MODELS: [(&str, u64, (u8, u8), &str); 5] = [
    ("NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0), "2.40"),
    ("NVIDIA A100-SXM4-40GB", 42_505_273_344, (8, 0), "1.30"),
    ("NVIDIA L4", 24_152_899_584, (8, 9), "0.45"),
    ("NVIDIA GeForce RTX 4090", 25_757_220_864, (8, 9), "0.40"),
    ("NVIDIA A40", 48_305_799_168, (8, 6), "0.70"),
];
const REGIONS: [&str; 3] = ["eu-west", "us-east", "asia-east"];

/// The image every testnet host lists (until hosts build and report real images).
pub const TESTNET_IMAGE: &str =
    "sha256:7e577e577e577e577e577e577e577e577e577e577e577e577e577e577e577e57";

/// Starts nodes and stops them all when dropped.
struct Nodes {
    children: Vec<(String, Child)>,
}

impl Nodes {
    fn stop(&mut self) -> Vec<String> {
        for (_, child) in &self.children {
            // SIGTERM first: nodes flush and close cleanly.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut left = Vec::new();
        for (name, child) in &mut self.children {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        left.push(format!("{name} did not stop within 5 s and was killed"));
                        break;
                    }
                }
            }
        }
        self.children.clear();
        left
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_until(deadline: Instant, stop: &AtomicBool, mut done: impl FnMut() -> bool) -> bool {
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    done()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The fake NVML driver built beside `gpux` (`cargo build --release --workspace` puts it there).
pub fn fake_nvml_beside(gpux: &Path) -> anyhow::Result<PathBuf> {
    let lib = gpux.with_file_name("libgpux_fake_nvml.so");
    if !lib.is_file() {
        bail!(
            "the fake NVML driver is missing: expected {} next to gpux; build it with `cargo build --release --workspace`",
            lib.display()
        );
    }
    Ok(lib)
}

/// Runs a testnet. `progress` receives one line per step; `stop` (set on Ctrl-C) ends the run
/// early, still stopping every node and reporting.
pub fn up(
    config: &TestnetConfig,
    stop: Arc<AtomicBool>,
    progress: impl Fn(&str),
) -> anyhow::Result<Report> {
    if config.hosts == 0 || config.renters == 0 {
        bail!("a testnet needs at least one host and one renter");
    }
    let started = Instant::now();
    let fake = fake_nvml_beside(&config.gpux)?;
    let temp;
    let base = match &config.base_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    let mut nodes = Nodes {
        children: Vec::new(),
    };
    let mut report = Report {
        nodes: config.hosts + config.renters,
        ..Report::default()
    };
    let mut bootstrap: Option<String> = None;
    let mut host_dirs = Vec::new();
    let mut renter_dirs = Vec::new();
    let mut expected_offers = 0;
    for i in 0..config.hosts + config.renters {
        let is_host = i < config.hosts;
        let name = if is_host {
            format!("host-{i}")
        } else {
            format!("renter-{}", i - config.hosts)
        };
        let dir = base.join(&name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let port = free_port()?;
        let listen = format!("/ip4/127.0.0.1/tcp/{port}");
        let mut cmd = Command::new(&config.gpux);
        cmd.args(["node", "run", "--data-dir"]).arg(&dir).args([
            "--listen",
            &listen,
            "--api",
            "127.0.0.1:0",
        ]);
        if let Some(b) = &bootstrap {
            cmd.args(["--bootstrap", b]);
        }
        if is_host {
            let (model, memory, cc, price) = MODELS[i % MODELS.len()];
            let count = 1 + i % 4;
            let mut toml = String::new();
            for g in 0..count {
                toml.push_str(&format!(
                    "[[gpu]]\nname = \"{model}\"\nuuid = \"GPU-{i:08x}-0000-4000-8000-{g:012x}\"\nmemory_total_bytes = {memory}\ncompute_capability = [{}, {}]\n\n",
                    cc.0, cc.1
                ));
            }
            let gpus = dir.join("gpus.toml");
            std::fs::write(&gpus, toml)?;
            cmd.env("GPUX_FAKE_NVML_CONFIG", &gpus)
                .args(["--host", "--nvml-lib"])
                .arg(&fake)
                .args([
                    "--image",
                    TESTNET_IMAGE,
                    "--price",
                    price,
                    "--region",
                    REGIONS[i % REGIONS.len()],
                    "--republish",
                    "5",
                ]);
            expected_offers += 1;
            host_dirs.push(dir.clone());
        } else {
            renter_dirs.push(dir.clone());
        }
        let log = std::fs::File::create(dir.join("node.log"))?;
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", config.gpux.display()))?;
        nodes.children.push((name.clone(), child));
        // Every node needs its API up; the first one's address is everyone's bootstrap. A node
        // that exits instead fails the run at once, with the last line it logged.
        let deadline = Instant::now() + Duration::from_secs(20);
        let started_ok = wait_until(deadline, &stop, || {
            let exited = nodes
                .children
                .last_mut()
                .is_some_and(|(_, c)| matches!(c.try_wait(), Ok(Some(_))));
            exited || dir.join("api.addr").exists()
        });
        let exited = nodes
            .children
            .last_mut()
            .is_some_and(|(_, c)| matches!(c.try_wait(), Ok(Some(_))));
        if !started_ok || exited {
            let log = std::fs::read_to_string(dir.join("node.log")).unwrap_or_default();
            bail!(
                "{name} did not start: {}",
                log.lines().last().unwrap_or("no output")
            );
        }
        if bootstrap.is_none() {
            let key = gpux_node::load_key(&dir)?;
            bootstrap = Some(format!("{listen}/p2p/{}", key.peer_id()));
        }
    }
    progress(&format!(
        "started {} hosts and {} renters in {}",
        config.hosts,
        config.renters,
        base.display()
    ));

    let clients = |dirs: &[PathBuf]| -> anyhow::Result<Vec<ApiClient>> {
        dirs.iter().map(|d| ApiClient::for_data_dir(d)).collect()
    };
    let hosts = clients(&host_dirs)?;
    let renters = clients(&renter_dirs)?;
    let seen = |c: &ApiClient| {
        c.get("/v1/status", &[])
            .ok()
            .and_then(|s| s["offers_in_book"].as_u64())
            .unwrap_or(0) as usize
    };
    let spread = wait_until(Instant::now() + Duration::from_secs(30), &stop, || {
        renters.iter().all(|r| seen(r) >= expected_offers)
    });
    progress(&format!(
        "offers spread: {} of {expected_offers} in every renter's book after {:.1} s",
        renters.iter().map(seen).min().unwrap_or(0),
        started.elapsed().as_secs_f64()
    ));
    report.offers_before_renting = expected_offers;
    report.offers_seen_min_before_renting = renters.iter().map(seen).min().unwrap_or(0);
    if !spread {
        report.errors.push(format!(
            "not every renter saw all {expected_offers} offers within 30 s"
        ));
    }
    // Memory while idle: the market has spread, nobody has rented yet.
    let mut rss: Vec<u64> = nodes
        .children
        .iter()
        .filter_map(|(_, c)| rss_kb(c.id()))
        .collect();
    rss.sort_unstable();
    report.node_rss_kb_median = percentile(&rss, 0.5);
    report.node_rss_kb_max = rss.last().copied().unwrap_or(0);

    // Every renter rents one GPU, whatever is cheapest; then they keep the market busy until
    // the duration ends.
    let end = Instant::now() + config.duration;
    let mut round = 0;
    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
        for (i, renter) in renters.iter().enumerate() {
            let body =
                serde_json::json!({ "query": "", "gpus": 1, "max_price": "10", "duration_s": 60 });
            match renter.post("/v1/rent", &body) {
                Ok(lease) => {
                    report.leases_agreed += 1;
                    progress(&format!(
                        "renter-{i} leased {} GPU at {} credits/h",
                        lease["gpus"].as_array().map_or(0, Vec::len),
                        lease["price_per_gpu_hour"].as_str().unwrap_or("?")
                    ));
                }
                // Once the market is busy, finding nothing free is the market working: the
                // renter's view lists GPUs other renters hold, and their hosts say so.
                Err(e) if is_busy_market(&e.to_string(), round > 0) => {}
                Err(e) => report.errors.push(format!("renter-{i}: {e:#}")),
            }
        }
        round += 1;
        let pause = Instant::now() + Duration::from_secs(2);
        wait_until(pause.min(end), &stop, || false);
    }

    // Collect the figures.
    let published: usize = hosts
        .iter()
        .map(|h| {
            h.get("/v1/status", &[])
                .ok()
                .and_then(|s| s["own_offers"].as_u64())
                .unwrap_or(0) as usize
        })
        .sum();
    report.offers_published = published;
    report.offers_seen_min = renters.iter().map(seen).min().unwrap_or(0);
    let mut delays = Vec::new();
    for c in hosts.iter().chain(&renters) {
        if let Ok(status) = c.get("/v1/status", &[]) {
            report.rejected_messages += status["gossip_rejected"].as_u64().unwrap_or(0);
        }
    }
    for r in &renters {
        if let Ok(status) = r.get("/v1/status", &[]) {
            delays.extend(
                status["arrivals_ms"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(serde_json::Value::as_u64),
            );
        }
    }
    delays.sort_unstable();
    report.propagation_samples = delays.len();
    report.propagation_ms_p50 = percentile(&delays, 0.50);
    report.propagation_ms_p95 = percentile(&delays, 0.95);
    report.double_allocations = double_allocations(&hosts);
    report.errors.extend(nodes.stop());
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Resident memory of a process, KiB (Linux: `VmRSS` in `/proc/<pid>/status`).
fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A rent that failed only because every matching GPU is taken: hosts refused because other
/// renters got there first (renters race from the first round on), or, once some leases
/// exist, the renter's view holds nothing free.
fn is_busy_market(message: &str, leases_exist: bool) -> bool {
    (leases_exist && message.contains("no offer"))
        || (message.contains("no host accepted")
            && message
                .split("; ")
                .all(|refusal| refusal.contains("GpusUnavailable")))
}

/// GPUs a host booked for two leases at once, over all hosts (from their lease records:
/// active leases, each for its whole duration from its acceptance).
fn double_allocations(hosts: &[ApiClient]) -> usize {
    let mut doubles = 0;
    for host in hosts {
        let Ok(leases) = host.get("/v1/leases", &[]) else {
            continue;
        };
        let mut windows: Vec<(String, u64, u64)> = Vec::new();
        for l in leases.as_array().into_iter().flatten() {
            if l["role"] != "host" || l["state"]["state"] != "accepted" {
                continue;
            }
            let start = l["updated_at"].as_u64().unwrap_or(0);
            let end = start + l["duration_s"].as_u64().unwrap_or(0) * 1000;
            for g in l["gpus"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str())
            {
                windows.push((g.to_string(), start, end));
            }
        }
        windows.sort();
        doubles += windows
            .windows(2)
            .filter(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
            .count();
    }
    doubles
}
