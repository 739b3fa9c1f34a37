//! The Sybil flood, as a benchmark (`gpux testnet flood`) and as a short CI test: a rogue
//! peer floods an honest relay with fresh host keys (each with a plausible attestation and
//! an offer) while an honest host keeps re-publishing its offer through the same relay to a
//! victim node. Real `gpux node run` processes on loopback, real libp2p.
//!
//! ```text
//!   rogue ──> relay <── host        (the relay also serves the ledger)
//!               │
//!             victim
//! ```
//!
//! It reports the victim's book, memory (RSS) and database size at their largest, how long
//! the honest host's offers took to reach the victim during the flood, and who is still
//! connected at the end: the rogue should be cut off, the relay should not. Given an image
//! the honest host offers, the victim then rents (one `gpux rent`, timed), and the flood
//! runs again from a fresh rogue, as many rounds as asked: every rent should succeed on its
//! first call, though the flood's cheap hosts are all ahead of the honest one by price.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use gpux_client::ApiClient;
use gpux_protocol::{ImageDigest, MicroCredits};
use serde::Serialize;

use crate::harness::Node;
use crate::rogue::Rogue;

/// What to run.
#[derive(Debug, Clone)]
pub struct FloodConfig {
    /// The `gpux` binary.
    pub gpux: PathBuf,
    /// Fresh host keys the rogue sends a minute.
    pub keys_per_min: u32,
    /// How long the flood lasts.
    pub duration: Duration,
    /// Where the nodes' data dirs go (a temporary directory when None).
    pub base_dir: Option<PathBuf>,
    /// Floods in a row, each from a fresh rogue (1 at least).
    pub rounds: u32,
    /// An image the honest host offers (built in the local Docker): the victim rents after
    /// each flood. Without one, nobody rents.
    pub rent_image: Option<String>,
}

/// One `gpux rent` on the victim after a flood.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RentAfterFlood {
    /// After which flood (from 1).
    pub round: u32,
    /// Whether it got a lease on its first call.
    pub ok: bool,
    /// From the call to its answer, ms.
    pub ms: u64,
    /// The host it got (the honest one, the only one with a node).
    pub host: Option<String>,
    /// Its error when it failed.
    pub error: Option<String>,
    /// When it failed: how the victim saw the honest host then.
    pub honest_host: Option<String>,
}

/// What came out.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FloodReport {
    /// Fresh host keys the rogue published (each an attestation and an offer).
    pub keys_sent: u64,
    /// Keys it could not publish any more: nobody connected to it would take them.
    pub keys_refused: u64,
    /// The flood's length, s.
    pub duration_s: f64,
    /// The victim's book, memory and disk just before the flood (the baseline).
    pub victim_book_before: usize,
    /// See `victim_book_before`, KiB.
    pub victim_rss_before_kib: u64,
    /// See `victim_book_before`, bytes.
    pub victim_disk_before_bytes: u64,
    /// The victim's book at its largest.
    pub victim_book_max: usize,
    /// The victim's resident memory at its largest, KiB.
    pub victim_rss_max_kib: u64,
    /// The victim's data dir at its largest, bytes.
    pub victim_disk_max_bytes: u64,
    /// Messages the victim and the relay ignored for a peer's budget.
    pub victim_over_budget: u64,
    /// The same at the relay.
    pub relay_over_budget: u64,
    /// The honest host's offers seen by the victim during the flood.
    pub honest_offers_seen: usize,
    /// From an honest offer's signing to the victim's book, ms: median and 95th percentile.
    pub propagation_ms_p50: u64,
    /// See `propagation_ms_p50`.
    pub propagation_ms_p95: u64,
    /// Whether the victim and the relay are still connected to the rogue at the end.
    pub rogue_connected_to_victim: bool,
    /// See `rogue_connected_to_victim`.
    pub rogue_connected_to_relay: bool,
    /// Whether the honest relay is still connected to the victim at the end.
    pub relay_connected_to_victim: bool,
    /// Floods run.
    pub rounds: u32,
    /// The victim's rents, one after each flood.
    pub rents: Vec<RentAfterFlood>,
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Runs the flood and reports.
pub fn run(config: &FloodConfig, progress: impl Fn(&str)) -> anyhow::Result<FloodReport> {
    let fake = crate::fake_nvml_beside(&config.gpux)?;
    let temp;
    let base = match &config.base_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    let api = || vec!["--api".to_string(), "127.0.0.1:0".to_string()];
    // The relay also serves the ledger hosts need to start (it is everyone's bootstrap).
    let mut relay_args = api();
    relay_args.push("--serve-ledger".into());
    let mut relay = Node::new(&config.gpux, &base, "relay", relay_args, vec![])?;
    relay.spawn()?;
    let relay_addr = format!("{}/p2p/{}", relay.addr, relay.peer);
    let mut joined = api();
    joined.extend(["--bootstrap", &relay_addr, "--ledger", &relay_addr].map(String::from));
    let gpus = base.join("gpus.toml");
    std::fs::write(
        &gpus,
        "[[gpu]]\nname = \"NVIDIA L4\"\nuuid = \"GPU-0000beef-0000-4000-8000-000000000001\"\nmemory_total_bytes = 24152899584\ncompute_capability = [8, 9]\n",
    )?;
    let image: ImageDigest = match &config.rent_image {
        Some(image) => image.parse().context("the image to rent")?,
        None => ImageDigest([0x11; 32]),
    };
    let mut host_args = joined.clone();
    host_args.extend(
        [
            "--host",
            "--fake-gpus",
            "--nvml-lib",
            &fake.display().to_string(),
            "--image",
            &image.to_string(),
            "--price",
            "3.60",
            "--republish",
            "2",
        ]
        .map(String::from),
    );
    let mut host = Node::new(
        &config.gpux,
        &base,
        "host",
        host_args,
        vec![("GPUX_FAKE_NVML_CONFIG".into(), gpus)],
    )?;
    host.spawn()?;
    let mut victim = Node::new(&config.gpux, &base, "victim", joined, vec![])?;
    victim.spawn()?;
    let victim_api = ApiClient::for_data_dir(&victim.dir)?;
    let relay_api = ApiClient::for_data_dir(&relay.dir)?;
    let honest = format!("host={}", host.peer);
    let start = Instant::now();
    while victim_api.offers(&honest, 10).map_or(0, |h| h.len()) == 0 {
        if start.elapsed() > Duration::from_secs(30) {
            anyhow::bail!("the honest host's offer did not reach the victim in 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    progress("relay, honest host and victim up; the honest offer reached the victim");

    if config.rent_image.is_some() {
        relay_api
            .mint(&gpux_api::MintRequest {
                account: victim.peer.clone(),
                amount: "100".into(),
                grant: None,
            })
            .context("funding the victim")?;
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let mut report = FloodReport::default();
    let mut seen = std::collections::BTreeMap::new();
    let victim_pid = victim.pid().unwrap_or(0);
    report.victim_book_before = victim_api.status().map_or(0, |s| s.offers_in_book);
    report.victim_rss_before_kib = rss_kib(victim_pid);
    report.victim_disk_before_bytes = dir_bytes(&victim.dir);
    let flood_start = Instant::now();
    for round in 1..=config.rounds.max(1) {
        let mut rogue = runtime.block_on(Rogue::start(&relay_addr))?;
        runtime.block_on(rogue.wait_for_mesh(Duration::from_secs(20)))?;
        progress(&format!(
            "flood {round}: {} fresh host keys a minute for {} s into the relay",
            config.keys_per_min,
            config.duration.as_secs()
        ));
        let rogue_peer = rogue.peer_id().to_string();
        let (keys_per_min, duration) = (config.keys_per_min, config.duration);
        let flood = runtime.spawn(async move {
            rogue
                .flood(keys_per_min, duration, MicroCredits(36_000), image)
                .await
        });
        let mut last_progress = Instant::now();
        while !flood.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
            let now = gpux_node::attest::now();
            if let Ok(hits) = victim_api.offers(&honest, 10) {
                for h in hits {
                    seen.entry(h.offer)
                        .or_insert_with(|| now.ms_since(h.created_at));
                }
            }
            if let Ok(s) = victim_api.status() {
                report.victim_book_max = report.victim_book_max.max(s.offers_in_book);
            }
            report.victim_rss_max_kib = report.victim_rss_max_kib.max(rss_kib(victim_pid));
            report.victim_disk_max_bytes = report.victim_disk_max_bytes.max(dir_bytes(&victim.dir));
            if last_progress.elapsed() > Duration::from_secs(15) {
                last_progress = Instant::now();
                progress(&format!(
                    "{:>4.0} s: victim book {}, RSS {} KiB, disk {} KiB",
                    flood_start.elapsed().as_secs_f64(),
                    report.victim_book_max,
                    report.victim_rss_max_kib,
                    report.victim_disk_max_bytes / 1024
                ));
            }
        }
        let (sent, refused) = runtime.block_on(flood).unwrap_or((0, 0));
        report.keys_sent += sent;
        report.keys_refused += refused;
        let victim_status = victim_api.status()?;
        let relay_status = relay_api.status()?;
        report.rogue_connected_to_victim |= victim_status.peers.contains(&rogue_peer);
        report.rogue_connected_to_relay |= relay_status.peers.contains(&rogue_peer);
        progress(&format!(
            "flood {round} over: {sent} keys sent, {refused} refused; the relay ignored {} \
             messages over budget so far, and is {}connected to the rogue",
            relay_status.gossip_over_budget,
            if relay_status.peers.contains(&rogue_peer) {
                "still "
            } else {
                "not "
            }
        ));
        if let Some(image) = &config.rent_image {
            let mut rent = rent_once(&victim, image, round)?;
            if !rent.ok {
                // What the victim makes of the honest host, for the report.
                let seen = victim_api.offers(&honest, 10).unwrap_or_default();
                let view: Vec<String> = seen
                    .iter()
                    .map(|h| format!("{:?}, {} free of {}", h.reach, h.free, h.gpus))
                    .collect();
                rent.honest_host = Some(if view.is_empty() {
                    "not in the victim's book".into()
                } else {
                    view.join("; ")
                });
            }
            progress(&format!(
                "rent after flood {round}: {} in {} ms{}{}",
                if rent.ok { "a lease" } else { "FAILED" },
                rent.ms,
                rent.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default(),
                rent.honest_host
                    .as_deref()
                    .map(|h| format!(" (the honest host: {h})"))
                    .unwrap_or_default()
            ));
            report.rents.push(rent);
        }
    }
    report.rounds = config.rounds.max(1);
    report.duration_s = flood_start.elapsed().as_secs_f64();
    let mut delays: Vec<u64> = seen.values().copied().collect();
    delays.sort_unstable();
    report.honest_offers_seen = delays.len();
    report.propagation_ms_p50 = percentile(&delays, 0.5);
    report.propagation_ms_p95 = percentile(&delays, 0.95);
    let victim_status = victim_api.status()?;
    let relay_status = relay_api.status()?;
    report.victim_over_budget = victim_status.gossip_over_budget;
    report.relay_over_budget = relay_status.gossip_over_budget;
    report.relay_connected_to_victim = victim_status.peers.contains(&relay.peer);
    drop(runtime);
    crate::harness::stop_all([&mut victim, &mut host, &mut relay], 10);
    Ok(report)
}

/// One `gpux rent` on the victim, timed; its lease is stopped and left to end (the honest
/// host has one GPU, which the next round's rent needs).
fn rent_once(victim: &Node, image: &str, round: u32) -> anyhow::Result<RentAfterFlood> {
    let asked = Instant::now();
    let out = victim.gpux(&[
        "rent",
        "gpu=l4",
        "--max-price",
        "5",
        "--duration",
        "60",
        "--image",
        image,
        "--json",
        "--",
        "sleep",
        "60",
    ])?;
    let ms = asked.elapsed().as_millis() as u64;
    if !out.status.success() {
        return Ok(RentAfterFlood {
            round,
            ms,
            error: Some(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            ..RentAfterFlood::default()
        });
    }
    let rented: gpux_api::Rented =
        serde_json::from_slice(&out.stdout).context("reading the rent's answer")?;
    victim.gpux(&["stop", &rented.lease])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(victim.phase(&rented.lease).as_str(), "ended" | "settled") {
        if Instant::now() > deadline {
            anyhow::bail!("lease {} did not end in 30 s after its stop", rented.lease);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(RentAfterFlood {
        round,
        ok: true,
        ms,
        host: Some(rented.host),
        error: None,
        honest_host: None,
    })
}
