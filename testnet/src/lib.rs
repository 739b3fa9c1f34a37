//! `gpux testnet up`: a whole market on one machine.
//!
//! Starts N hosts and M renters as separate `gpux node run` processes on loopback, each with
//! its own data dir, key and port; the hosts read fake GPUs of assorted models and prices
//! through the fake NVML driver (the real NVML code path runs). It waits for the offers to
//! spread, lets every renter rent, shows progress, and writes a JSON report. Every process it
//! started is stopped at the end, on Ctrl-C, or if it fails; none is left behind.

use fakes::{MODELS, family_of};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gpux_client::ApiClient;

pub mod access;
pub mod access_bench;
pub mod api_bench;
mod business;
mod fakes;
mod figures;
pub mod flood;
pub mod harness;
pub mod ledgers;
pub mod nat;
pub mod netns;
pub mod orders;
pub mod partitions;
pub mod plane_baselines;
pub mod plane_bench;
pub mod registry;
pub mod rent_bench;
mod report;
pub mod rogue;
pub mod workload;

pub use report::{Isolation, LeaseReport, Report};

use figures::{
    collect_leases, containers_of, cpu_s, dockerd_pid, double_allocations, is_busy_market,
    isolation, percentile, rss_kb,
};

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
    /// Ledger members: 1 (a ledger node), or 3 or 5 (a replicated ledger, whose leader is
    /// killed a third into the run and started again on its disk).
    pub ledgers: usize,
    /// Every node in a network namespace of its own, links shaped so (`--isolated`).
    pub isolated: Option<netns::Shaping>,
    /// Links cut and healed during the renting rounds (an isolated run only).
    pub partitions: Vec<partitions::Scenario>,
    /// Hosts behind a NAT of their own (an isolated run only): the first ones.
    pub nat_hosts: usize,
    /// Renters behind a NAT of their own (an isolated run only): the last ones.
    pub nat_renters: usize,
    /// How often hosts re-publish their offers, s (5 by default; a large testnet runs with
    /// more, or its renters spend their CPU validating republications).
    pub republish_s: u64,
    /// Renters follow one family each (`--market-families`, cycling through the hosts'
    /// models from renter-2 on), as a renter that knows what it wants does; renter-0,
    /// renter-1 and renters behind NAT, which the order and NAT rounds send to any host,
    /// follow every family. Without it every renter follows every family.
    pub shard_renters: bool,
}

/// Credits every node gets from the testnet faucet.
const FAUCET_CREDITS: &str = "100";
/// Receipt interval of the testnet's hosts, seconds.
const RECEIPT_INTERVAL_S: &str = "2";
/// How long a host waits for an acknowledgement, seconds.
const ACK_GRACE_S: &str = "5";
/// How long a renter's escrow must be idle before the renter may take it back, seconds.
const LEDGER_RELEASE_GRACE_S: &str = "10";
/// Each lease's length, seconds.
const LEASE_S: u64 = 8;
/// How long a partition keeps its links cut: past the acknowledgement grace.
const PARTITION_HOLD: Duration = Duration::from_secs(8);
/// How far the renting rounds may run past `--duration` for partitions still to run or
/// check.
const PARTITION_OVERRUN: Duration = Duration::from_secs(90);

const REGIONS: [&str; 3] = ["eu-west", "us-east", "asia-east"];

/// Builds (or finds, cached) the workload image through the local Docker daemon.
pub fn build_image() -> anyhow::Result<String> {
    crate::block_on(async {
        let exec = gpux_node::executor::Executor::connect("testnet").await?;
        let image = gpux_node::executor::build_workload_image(
            &exec,
            Path::new(gpux_node::executor::BUSYBOX_PATH),
        )
        .await?;
        Ok(image.to_string())
    })
}

/// Runs `work` on a runtime of its own (the testnet drives its nodes from plain threads).
pub(crate) fn block_on<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting an async runtime")?
        .block_on(work)
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
    if config.nat_hosts + config.nat_renters > 0 && config.isolated.is_none() {
        bail!("nodes behind NAT need an isolated network (--isolated)");
    }
    if config.nat_renters > config.renters {
        bail!(
            "{} renters behind NAT of {}",
            config.nat_renters,
            config.renters
        );
    }
    if config.nat_hosts >= config.hosts {
        bail!(
            "{} hosts behind NAT of {}: at least one host must be reachable (it relays for them)",
            config.nat_hosts,
            config.hosts
        );
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
    // An isolated run checks what the machine offers before it makes anything.
    let mut net = match &config.isolated {
        None => None,
        Some(shaping) => {
            let preflight = netns::preflight();
            progress(&format!("isolated network: {}", preflight.summary()));
            let problems = preflight.problems(shaping);
            if !problems.is_empty() {
                bail!(
                    "the isolated testnet cannot run here: {}",
                    problems.join("; ")
                );
            }
            let mut net = netns::Network::create(shaping.clone())?;
            // Every node, and the namespace of each behind NAT.
            let namespaces = config.ledgers
                + config.hosts
                + config.renters
                + config.nat_hosts
                + config.nat_renters;
            if let Some(change) = net.make_room(namespaces)? {
                progress(&change);
            }
            progress(&format!(
                "isolated network {}: every node in a namespace of its own; links {} ms ± {} ms each way, {}% loss{}",
                net.subnet(),
                shaping.delay_ms,
                shaping.jitter_ms,
                shaping.loss_pct,
                shaping
                    .rate
                    .as_ref()
                    .map(|r| format!(", {r} per node"))
                    .unwrap_or_default()
            ));
            Some((net, preflight.summary()))
        }
    };
    let mut nodes: Vec<harness::Node> = Vec::new();
    let mut report = Report {
        nodes: config.ledgers + config.hosts + config.renters,
        ledger_members: config.ledgers,
        ..Report::default()
    };
    progress("building the workload image (FROM scratch + static busybox) through Docker");
    let image = build_image().context("building the workload image")?;
    report.image = image.clone();
    progress(&format!("workload image {image}"));
    // The ledger first: everyone settles with it and joins through it.
    let mut ledgers = ledgers::start(
        &config.gpux,
        &base,
        config.ledgers,
        LEDGER_RELEASE_GRACE_S,
        net.as_mut().map(|(n, _)| n),
        &progress,
    )?;
    let n_ledgers = ledgers.nodes.len();
    nodes.extend(std::mem::take(&mut ledgers.nodes));
    let mut host_dirs = Vec::new();
    let mut renter_dirs = Vec::new();
    let mut public_hosts = Vec::new();
    let mut expected_offers = 0;
    // Offers per family key, and each renter's family (`None`: every family).
    let mut offers_by_family: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut renter_family: Vec<Option<&str>> = Vec::new();
    let prover_gops = orders::cpu_prover_gops();
    let fill_gbs = orders::cpu_fill_gbs();
    let a100 = gpux_attestation::spec_for_name("NVIDIA A100-SXM4-80GB");
    progress(&format!(
        "the CPU provers run at {prover_gops:.3} Gop/s and fill at {fill_gbs:.2} GB/s here; fake GPUs answer at their models' rates scaled (an A100 at {:.2} Gop/s and {:.2} GB/s)",
        a100.map_or(0.0, |s| s.challenge_gops
            * gpux_attestation::spec::FAKE_TENSOR_SCALE),
        a100.map_or(0.0, |s| s.fill_gbs()
            * gpux_attestation::spec::FAKE_BANDWIDTH_SCALE),
    ));
    for i in 1..1 + config.hosts + config.renters {
        let is_host = i <= config.hosts;
        let name = if is_host {
            format!("host-{}", i - 1)
        } else {
            format!("renter-{}", i - 1 - config.hosts)
        };
        let dir = base.join(&name);
        let mut args: Vec<String> = vec!["--api".into(), "127.0.0.1:0".into()];
        let mut env = Vec::new();
        // Everyone runs with the network's receipt timing: hosts sign receipts at that
        // interval, renters' watchdogs expect them.
        let behind_nat = if is_host {
            i <= config.nat_hosts
        } else {
            i > config.hosts + config.renters - config.nat_renters
        };
        let all = n_ledgers + config.hosts + config.renters;
        for peer in ledgers.bootstrap_for(i, all, behind_nat, &public_hosts) {
            args.extend(["--bootstrap".to_string(), peer]);
        }
        args.extend(
            [
                "--ledger",
                &ledgers.list,
                "--receipt-interval",
                RECEIPT_INTERVAL_S,
            ]
            .map(String::from),
        );
        args.extend(["--ack-grace", ACK_GRACE_S].map(String::from));
        if is_host {
            let h = i - 1;
            let (model, _, _, price) = MODELS[h % MODELS.len()];
            // Faults are injected by writing `faults.toml` in its data directory.
            let toml = fakes::host_gpus(h, &dir.join("faults.toml"));
            // One offer per host, and one more for an A100 host's MIG slices.
            expected_offers += 1 + usize::from(model.contains("A100"));
            *offers_by_family.entry(family_of(model)).or_default() +=
                1 + usize::from(model.contains("A100"));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let gpus = dir.join("gpus.toml");
            std::fs::write(&gpus, toml)?;
            env.push(("GPUX_FAKE_NVML_CONFIG".to_string(), gpus));
            args.extend(["--host", "--fake-gpus", "--nvml-lib"].map(String::from));
            args.push(fake.display().to_string());
            args.extend(
                [
                    "--image",
                    &image,
                    "--price",
                    price,
                    // Kept workspaces are priced too; the report's expected charges add it.
                    "--disk-price",
                    "0.05",
                    // Spot leases from 0.10 credits, preempted with 4 s of notice.
                    "--spot-floor",
                    "0.10",
                    "--spot-notice",
                    "4",
                    "--region",
                    REGIONS[h % REGIONS.len()],
                    "--republish",
                    &config.republish_s.max(1).to_string(),
                    "--min-duration",
                    "1",
                ]
                .map(String::from),
            );
            host_dirs.push(dir.clone());
        } else {
            // The fake GPUs prove on the CPU: renters judge them against it.
            args.extend(orders::fake_references(&["a100", "h100"]));
            let r = i - 1 - config.hosts;
            let family =
                (config.shard_renters && r >= 2 && r < config.renters - config.nat_renters)
                    .then(|| family_of(MODELS[(r - 2) % MODELS.len()].0));
            if let Some(family) = family {
                args.extend(["--market-families".to_string(), family.to_string()]);
            }
            renter_family.push(family);
            renter_dirs.push(dir.clone());
        }
        // Every node needs its API up. A node that exits instead fails the run at once, with
        // the last line it logged.
        // (Behind NAT: the first hosts, those the order rounds use most, and the last
        // renters.)
        let mut node = harness::Node::placed(
            &config.gpux,
            &base,
            &name,
            args,
            env,
            net.as_mut().map(|(n, _)| n),
            behind_nat,
        )?;
        if is_host && !behind_nat {
            let (key, _) = gpux_node::init_key(&node.dir)?;
            public_hosts.push(format!("{}/p2p/{}", node.addr, key.peer_id()));
        }
        node.spawn()?;
        nodes.push(node);
        if stop.load(Ordering::Relaxed) {
            bail!("stopped while starting the nodes");
        }
    }
    if !config.partitions.is_empty() && net.is_none() {
        bail!("partitions need an isolated network (--isolated)");
    }
    progress(&format!(
        "started {}, {} hosts and {} renters in {}",
        if n_ledgers == 1 {
            "a ledger".to_string()
        } else {
            format!("{n_ledgers} ledger members")
        },
        config.hosts,
        config.renters,
        base.display()
    ));
    // Where Prometheus scrapes each node (docs/metrics.md has the scrape configuration).
    for node in &nodes {
        if let Some(addr) = gpux_node::metrics::read_addr(&node.dir) {
            report
                .scrape_targets
                .insert(node.name.clone(), addr.to_string());
        }
    }
    let targets = |prefix: &str| {
        report
            .scrape_targets
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, addr)| addr.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    progress(&format!(
        "scrape targets: gpux-ledger [{}], gpux-hosts [{}], gpux-renters [{}] (http://ADDR/metrics)",
        targets("ledger"),
        targets("host"),
        targets("renter")
    ));

    let clients = |dirs: &[PathBuf]| -> anyhow::Result<Vec<ApiClient>> {
        Ok(dirs
            .iter()
            .map(|d| ApiClient::for_data_dir(d))
            .collect::<Result<_, _>>()?)
    };
    let mut hosts = clients(&host_dirs)?;
    let renters = clients(&renter_dirs)?;
    let seen = |c: &ApiClient| c.status().map_or(0, |s| s.offers_in_book);
    // What each renter should hold: every offer of the families it follows.
    let expected: Vec<usize> = renter_family
        .iter()
        .map(|f| {
            f.map_or(expected_offers, |f| {
                offers_by_family.get(f).copied().unwrap_or(0)
            })
        })
        .collect();
    let short = |renters: &[ApiClient]| -> usize {
        renters
            .iter()
            .zip(&expected)
            .filter(|(r, want)| seen(r) < **want)
            .count()
    };
    let spread_from = Instant::now();
    let spread = wait_until(Instant::now() + Duration::from_secs(30), &stop, || {
        short(&renters) == 0
    });
    report.offers_spread_ms = spread_from.elapsed().as_millis() as u64;
    progress(&format!(
        "offers spread: {} of {} renters hold every offer of their families ({expected_offers} offers in all) {:.1} s after the last node started",
        renters.len() - short(&renters),
        renters.len(),
        spread_from.elapsed().as_secs_f64()
    ));
    report.offers_before_renting = expected_offers;
    report.offers_seen_min_before_renting = renters.iter().map(seen).min().unwrap_or(0);
    // Counted again: the market may have spread during the last (slow, at 100 nodes) round.
    let still_short = short(&renters);
    if !spread && still_short > 0 {
        report.errors.push(format!(
            "{still_short} renters did not hold every offer of their families within 30 s"
        ));
    }
    // Memory while idle: the market has spread, nobody has rented yet.
    let mut rss: Vec<u64> = nodes
        .iter()
        .filter_map(|n| n.pid())
        .filter_map(rss_kb)
        .collect();
    rss.sort_unstable();
    report.node_rss_kb_median = percentile(&rss, 0.5);
    report.node_rss_kb_max = rss.last().copied().unwrap_or(0);

    // The faucet: every host and renter gets credits, by grants the faucet's key signed.
    let peers = host_dirs
        .iter()
        .chain(&renter_dirs)
        .map(|dir| Ok(gpux_node::load_key(dir)?.peer_id().to_string()))
        .collect::<anyhow::Result<Vec<String>>>()?;
    ledgers::fund(&nodes[..n_ledgers], &peers, FAUCET_CREDITS, &stop)?;
    let host_peers: Vec<String> = peers[..hosts.len()].to_vec();
    let credits = |hosts: &[ApiClient], errors: &mut Vec<String>| -> u64 {
        hosts
            .iter()
            .chain(&renters)
            .map(|c| match c.balance() {
                Ok(b) => b.balance_micro,
                Err(e) => {
                    errors.push(format!("reading a balance: {e:#}"));
                    0
                }
            })
            .sum()
    };
    report.credits_before = credits(&hosts, &mut report.errors);
    progress(&format!(
        "faucet: {FAUCET_CREDITS} credits to each of {} nodes",
        peers.len()
    ));

    // Hosts' CPU while idle, over a short window, as the metering baseline.
    let host_pids: Vec<u32> = nodes
        .iter()
        .filter(|n| n.name.starts_with("host-"))
        .filter_map(harness::Node::pid)
        .collect();
    let cpu_total = |pids: &[u32]| -> f64 { pids.iter().filter_map(|&p| cpu_s(p)).sum() };
    let dockerd: Vec<u32> = dockerd_pid().into_iter().collect();
    let all_pids: Vec<u32> = nodes.iter().filter_map(harness::Node::pid).collect();
    let all_idle_from = (Instant::now(), cpu_total(&all_pids));
    let idle_from = (Instant::now(), cpu_total(&host_pids));
    let docker_idle_from = (Instant::now(), cpu_total(&dockerd));
    wait_until(Instant::now() + Duration::from_secs(3), &stop, || false);
    let idle_to = (Instant::now(), cpu_total(&host_pids));
    let docker_idle_to = (Instant::now(), cpu_total(&dockerd));
    let pct_of = |from: (Instant, f64), to: (Instant, f64), n: usize| {
        100.0 * (to.1 - from.1) / to.0.duration_since(from.0).as_secs_f64() / n.max(1) as f64
    };
    let pct = |from, to| pct_of(from, to, hosts.len());
    report.host_cpu_pct_idle = pct(idle_from, idle_to);
    report.node_cpu_pct_idle = pct_of(
        all_idle_from,
        (Instant::now(), cpu_total(&all_pids)),
        all_pids.len(),
    );
    let applied_from = (Instant::now(), ledgers::applied(&nodes[..n_ledgers]));
    report.dockerd_cpu_pct_idle = pct_of(docker_idle_from, docker_idle_to, 1);

    // Renters rent one GPU at a time, whatever is cheapest, for LEASE_S seconds, running the
    // workload image; every third workload exits by itself (exit code 3) before its time.
    let end = Instant::now() + config.duration;
    let mut round = 0;
    let mut next_rent = vec![Instant::now(); renters.len()];
    let mut rent_ms = Vec::new();
    let mut leases_started = 0u64;
    // A replicated ledger loses its leader a third into the run.
    let mut chaos = ledgers::Chaos::new(n_ledgers, config.duration);
    let mut partitions = partitions::Partitions::new(config.partitions.clone(), PARTITION_HOLD);
    // A host behind NAT is also reached through its relay, which a cut link does not cut.
    let nat_hosts: std::collections::BTreeMap<String, String> = net
        .as_ref()
        .map(|(n, _)| n.behind_nat())
        .unwrap_or_default();
    partitions.exempt(nat_hosts.keys().cloned());
    let overrun = end + PARTITION_OVERRUN;
    while (Instant::now() < end || (partitions.pending() && Instant::now() < overrun))
        && !stop.load(Ordering::Relaxed)
    {
        chaos.step(&mut nodes[..n_ledgers], &mut report, &progress);
        if let Some((net, _)) = net.as_mut() {
            let errors = partitions.step(net, &nodes, chaos.quiet(), &progress);
            report.errors.extend(errors);
        }
        for (i, renter) in renters.iter().enumerate() {
            let name = format!("renter-{i}");
            if Instant::now() < next_rent[i] {
                continue;
            }
            let script = if leases_started % 3 == 2 {
                "echo gpux workload: exiting early; sleep 3; echo bye; exit 3"
            } else {
                "echo gpux workload: started; i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"
            };
            let body = gpux_api::RentRequest {
                query: String::new(),
                gpus: 1,
                max_price: "10".into(),
                duration_s: LEASE_S as u32,
                image: Some(image.clone()),
                image_archive: None,
                cache_image: false,
                command: vec!["sh".into(), "-c".into(), script.into()],
                env: Default::default(),
                network: false,
                disk_bytes: None,
                retain_s: None,
                spot: false,
                window: None,
                ..Default::default()
            };
            let asked = Instant::now();
            match renter.rent(&body) {
                Ok(lease) => {
                    let ms = asked.elapsed().as_millis() as u64;
                    rent_ms.push(ms);
                    if chaos.lost_at().is_some_and(|lost| asked >= lost) {
                        report.leases_after_leader_loss += 1;
                    }
                    leases_started += 1;
                    report.leases_agreed += 1;
                    partitions.rented(&name, true);
                    partitions.lease_started();
                    next_rent[i] = Instant::now() + Duration::from_secs(LEASE_S + 1);
                    progress(&format!(
                        "renter-{i}: container running {ms} ms after rent: lease {} on {} GPU at {} credits/h",
                        &lease.lease[..12.min(lease.lease.len())],
                        lease.gpus.len(),
                        lease.price_per_gpu_hour
                    ));
                }
                // Once the market is busy, finding nothing free is the market working: the
                // renter's view lists GPUs other renters hold, and their hosts say so.
                Err(e) if is_busy_market(e.code(), round > 0) => {}
                // A renter cut off by a partition is refused, as it should be.
                Err(e) if partitions.excuses(&name) => {
                    partitions.rented(&name, false);
                    progress(&format!("{name}: refused while cut off: {e:#}"));
                }
                Err(e) => report.errors.push(format!("renter-{i}: {e:#}")),
            }
        }
        round += 1;
        let pause = Instant::now() + Duration::from_secs(1);
        wait_until(pause.min(end), &stop, || false);
    }
    if let Some((net, _)) = net.as_mut() {
        report.errors.extend(partitions.finish(net));
    }
    let leasing_to = (Instant::now(), cpu_total(&host_pids));
    let docker_leasing_to = (Instant::now(), cpu_total(&dockerd));
    report.host_cpu_pct_leasing = pct(idle_to, leasing_to);
    report.dockerd_cpu_pct_leasing = pct_of(docker_idle_to, docker_leasing_to, 1);
    rent_ms.sort_unstable();
    report.rent_to_running_ms_p50 = percentile(&rent_ms, 0.5);
    report.rent_to_running_ms_p95 = percentile(&rent_ms, 0.95);
    match figures::docker_start_ms(&image, 5) {
        Ok(times) => report.docker_start_ms_p50 = percentile(&times, 0.5),
        Err(e) => report
            .errors
            .push(format!("measuring Docker's start time: {e:#}")),
    }

    // Hosts behind NAT: found, rented and used like the others, by a reachable renter and
    // by each renter behind a NAT of its own.
    if !stop.load(Ordering::Relaxed) {
        nat::rounds(&nodes, &nat_hosts, &image, &base, &mut report, &progress);
    }

    // The workload plane: a renter's own image, its files in and out; an image from a
    // registry, and OpenSSH into its lease.
    if !stop.load(Ordering::Relaxed)
        && let Some(renter) = nodes.iter().find(|n| n.name == "renter-0")
    {
        workload::rounds(renter, &host_dirs, (&image, &base), &mut report, &progress);
    }

    // Every kind of order: a spot lease preempted by an on-demand rent of its GPU.
    let node = |name: &str| nodes.iter().find(|n| n.name == name);
    if !stop.load(Ordering::Relaxed)
        && let (Some(host), Some(spot_renter)) = (node("host-0"), node("renter-0"))
    {
        let od_renter = node("renter-1").unwrap_or(spot_renter);
        progress("orders: a spot lease, preempted by an on-demand rent");
        match orders::round(host, spot_renter, od_renter, &progress) {
            Ok(f) => report.orders = f,
            Err(e) => report.errors.push(format!("orders: {e:#}")),
        }
        if config.hosts >= 2 && !stop.load(Ordering::Relaxed) {
            progress("orders: performance challenges before the work, and a group order");
            match orders::challenge_and_group_round(spot_renter, &progress) {
                Ok(f) => {
                    report.orders.challenges_passed = f.challenges_passed;
                    report.orders.challenges_failed = f.challenges_failed;
                    report.orders.challenges_in_lease_passed = f.challenges_in_lease_passed;
                    report.orders.groups = f.groups;
                    report.orders.mig_leases = f.mig_leases;
                }
                Err(e) => report.errors.push(format!("orders: {e:#}")),
            }
        }
    }

    // A host running a business: a live price change, a restart and an upgrade mid-lease,
    // a GPU that fails under a lease.
    let last_host = format!("host-{}", config.hosts - 1);
    if config.hosts > config.nat_hosts && !stop.load(Ordering::Relaxed) {
        let renter = nodes.iter().position(|n| n.name == "renter-0");
        let host = nodes.iter().position(|n| n.name == last_host);
        if let (Some(r), Some(h)) = (renter, host) {
            let renter = nodes[r].dir.clone();
            match business::round(&mut nodes[h], &renter, &config.gpux, &progress) {
                Ok(f) => report.hosting = Some(f),
                Err(e) => report.errors.push(format!("hosting: {e:#}")),
            }
            // Restarted: its API listens on a new port.
            hosts = clients(&host_dirs)?;
        }
    }

    // Every lease ends within its time; wait for all of them to settle.
    progress("renting stopped; waiting for the last leases to end and settle");
    let settled = |c: &ApiClient| -> (usize, usize) {
        let leases = c.leases().unwrap_or_default();
        (leases.iter().filter(|l| l.settled).count(), leases.len())
    };
    let all_settled = wait_until(
        Instant::now() + Duration::from_secs(LEASE_S + 30),
        &stop,
        || {
            hosts.iter().chain(&renters).all(|c| {
                let (done, all) = settled(c);
                done == all
            })
        },
    );
    if !all_settled {
        report
            .errors
            .push("not every lease settled within 30 s of its end".into());
    }
    report.credits_after = credits(&hosts, &mut report.errors);
    // The ledger's operations (its log's entries) over the renting rounds and the wait.
    if let (Some(from), Some(to)) = (applied_from.1, ledgers::applied(&nodes[..n_ledgers])) {
        let secs = applied_from.0.elapsed().as_secs_f64();
        report.ledger_ops_per_s = to.saturating_sub(from) as f64 / secs.max(1e-3);
    }
    {
        let hosts_now: Vec<&harness::Node> = nodes
            .iter()
            .filter(|n| n.name.starts_with("host-"))
            .collect();
        let bound_s = figures::unpaid_bound_s();
        report.errors.extend(partitions.check(&hosts_now, bound_s));
        report.partitions = partitions.reports.clone();
    }
    collect_leases(&hosts, &renters, &mut report);
    let lease_seconds: f64 = report.leases.iter().map(|l| l.runtime_s).sum();
    let window = leasing_to.0.duration_since(idle_to.0).as_secs_f64();
    let mean_leases_per_host = lease_seconds / window / hosts.len() as f64;
    if mean_leases_per_host > 0.0 {
        report.metering_cpu_pct_per_lease =
            (report.host_cpu_pct_leasing - report.host_cpu_pct_idle) / mean_leases_per_host;
        report.dockerd_cpu_pct_per_lease = (report.dockerd_cpu_pct_leasing
            - report.dockerd_cpu_pct_idle)
            / (mean_leases_per_host * hosts.len() as f64);
    }
    progress(&format!(
        "{} leases settled; credits before {} / after {} micro-credits",
        report.leases_settled, report.credits_before, report.credits_after
    ));

    // Collect the figures.
    figures::market_figures(&hosts, &renters, &mut report);
    report.offers_seen_min = renters.iter().map(seen).min().unwrap_or(0);
    report.double_allocations = double_allocations(&hosts);
    if let Some((net, preflight)) = &net {
        report.isolated = Some(isolation(net, preflight, &nodes));
    }
    if n_ledgers > 1 {
        ledgers::check_agreement(&nodes[..n_ledgers], &mut report);
    }
    report.errors.extend(
        harness::stop_all(&mut nodes, 5)
            .into_iter()
            .map(|name| format!("{name} did not stop within 5 s and was killed")),
    );
    if let Some((mut net, _)) = net.take() {
        // The nodes first: their forwarders hold threads in the namespaces.
        nodes.clear();
        let mut errors = net.teardown();
        drop(net);
        let left = netns::leftovers(std::process::id());
        errors.extend(left.iter().map(|l| format!("left behind: {l}")));
        if let Some(isolated) = report.isolated.as_mut() {
            isolated.network_left = left;
        }
        report.errors.extend(errors);
    }
    match workload::erase_retained(&host_dirs) {
        Ok(n) => report.workspaces_retained_at_stop = n,
        Err(e) => report
            .errors
            .push(format!("erasing kept workspaces: {e:#}")),
    }
    match containers_of(&host_peers) {
        Ok(n) => report.containers_left = n,
        Err(e) => report.errors.push(format!("listing containers: {e:#}")),
    }
    if report.containers_left > 0 {
        report.errors.push(format!(
            "{} lease containers left behind",
            report.containers_left
        ));
    }
    if report.credits_before != report.credits_after {
        report.errors.push(format!(
            "credits not conserved: {} before, {} after",
            report.credits_before, report.credits_after
        ));
    }
    figures::check_charges(&mut report, figures::unpaid_bound_s());
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}
