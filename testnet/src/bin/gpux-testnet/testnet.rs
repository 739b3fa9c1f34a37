//! `gpux testnet ...`: the runs and benchmarks, each printing its report.

use std::path::PathBuf;

use anyhow::Context;

use clap::Subcommand;
use gpux_client::out;
use gpux_client::print::print_json;

use crate::gpux_binary;

/// `gpux testnet up`: runs a testnet; true when it ran without errors.
pub(crate) fn up(
    config: gpux_testnet::TestnetConfig,
    report_path: Option<PathBuf>,
) -> anyhow::Result<bool> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    // Ctrl-C and SIGTERM end the run early; every node is still stopped and reported.
    let flag = stop.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        });
        flag.store(true, Ordering::Relaxed);
    });
    let started = std::time::Instant::now();
    let report = gpux_testnet::up(&config, stop, |line| {
        eprintln!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64())
    })?;
    out!(
        "before renting: {} offers published, every renter saw at least {}",
        report.offers_before_renting,
        report.offers_seen_min_before_renting
    )?;
    out!(
        "testnet: {} nodes, {} offers live at the end, every renter saw at least {}",
        report.nodes,
        report.offers_published,
        report.offers_seen_min
    )?;
    out!(
        "propagation to renters: p50 {} ms, p95 {} ms",
        report.propagation_ms_p50,
        report.propagation_ms_p95
    )?;
    out!(
        "every renter held every offer of its families {} ms after the last node started",
        report.offers_spread_ms
    )?;
    out!(
        "nodes when idle: memory median {} MiB, max {} MiB; CPU {:.2}% of a core each",
        report.node_rss_kb_median / 1024,
        report.node_rss_kb_max / 1024,
        report.node_cpu_pct_idle
    )?;
    out!(
        "{} leases agreed, {} double allocations, {} messages rejected, {} over a peer's budget, {} errors",
        report.leases_agreed,
        report.double_allocations,
        report.rejected_messages,
        report.over_budget_messages,
        report.errors.len()
    )?;
    out!(
        "containers: {} started, {} left; {} receipts acknowledged; {} leases settled",
        report.containers_started,
        report.containers_left,
        report.receipts_acked,
        report.leases_settled
    )?;
    out!(
        "workload: {} renter image staged ({} bytes sent), {} files copied; {} image pulled from a registry ({}), {} OpenSSH sessions into its lease",
        report.plane.images_pushed,
        report.plane.image_bytes_sent,
        report.plane.files_copied,
        report.access.images_pulled,
        bytesize::ByteSize(report.access.pull_bytes),
        report.access.ssh_sessions
    )?;
    out!(
        "credits: {} before, {} after (micro-credits){}",
        report.credits_before,
        report.credits_after,
        if report.credits_before == report.credits_after {
            ", conserved"
        } else {
            ", NOT CONSERVED"
        }
    )?;
    if report.ledger_members > 1 {
        out!(
            "ledger: {} members, {:.1} operations/s while renting; {}; applied through {:?}",
            report.ledger_members,
            report.ledger_ops_per_s,
            match (&report.ledger_leader_killed, report.ledger_failover_ms) {
                (Some(name), Some(ms)) => format!(
                    "leader {name} killed, writes applied again {ms} ms later, {} leases started after",
                    report.leases_after_leader_loss
                ),
                (Some(name), None) => format!("leader {name} killed, no write applied after"),
                _ => "the leader was not killed (the run was too short)".into(),
            },
            report.ledger_applied
        )?;
    }
    if let Some(i) = &report.isolated {
        out!(
            "isolated: {} nodes on {}; links {} ms ± {} ms each way, {}% loss; measured round trips p50 {} ms, p95 {} ms ({} pings); left behind: {}",
            i.addresses.len(),
            i.subnet,
            i.delay_ms,
            i.jitter_ms,
            i.loss_pct,
            i.link_rtt_ms_p50,
            i.link_rtt_ms_p95,
            i.link_rtt_samples,
            if i.network_left.is_empty() {
                "nothing".to_string()
            } else {
                i.network_left.join(", ")
            }
        )?;
    }
    for n in &report.nat {
        out!(
            "behind NAT: {} ({}, AutoNAT: {}) rented by {} over a {} connection in {} ms; exec answered, {} bytes copied in and out, {} log lines",
            n.name,
            n.public_address,
            n.reachability,
            n.renter,
            n.connection,
            n.rent_ms,
            n.bytes_copied,
            n.log_lines
        )?;
    }
    for p in &report.partitions {
        out!(
            "partition {}: cut at {:.1} s for {:.1} s ({} links){}{}",
            p.scenario,
            p.at_s,
            p.held_s,
            p.cut.len(),
            match (&p.lease, p.unpaid_s, &p.lease_end) {
                (Some(l), Some(u), end) => format!(
                    "; lease {} ended {}, {u} s unpaid",
                    &l[..12.min(l.len())],
                    end.as_deref().unwrap_or("-")
                ),
                _ => String::new(),
            },
            match p.scenario.as_str() {
                "ledger-minority" => format!("; {} leases started meanwhile", p.leases_during),
                "renter-ledger" => format!(
                    "; {} rents refused meanwhile, rented again after: {}",
                    p.rents_refused_during, p.rented_after_heal
                ),
                _ => String::new(),
            }
        )?;
    }
    for l in &report.leases {
        out!(
            "  lease {}: {} GPU at {} µcr/h, ran {:.2} s ({}), charged {} µcr, expected {:.0}",
            &l.lease[..12.min(l.lease.len())],
            l.gpus,
            l.price_per_gpu_hour,
            l.runtime_s,
            l.end_reason,
            l.charged,
            l.expected
        )?;
    }
    out!(
        "rent to running: p50 {} ms, p95 {} ms (Docker's own create+start: p50 {} ms); host CPU idle {:.2}%, leasing {:.2}%, metering {:.2}% of a core per lease (+{:.2}% in dockerd)",
        report.rent_to_running_ms_p50,
        report.rent_to_running_ms_p95,
        report.docker_start_ms_p50,
        report.host_cpu_pct_idle,
        report.host_cpu_pct_leasing,
        report.metering_cpu_pct_per_lease,
        report.dockerd_cpu_pct_per_lease
    )?;
    for e in &report.errors {
        out!("error: {e}")?;
    }
    if let Some(path) = report_path {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        out!("report written to {}", path.display())?;
    }
    Ok(report.errors.is_empty() && report.double_allocations == 0)
}

/// `gpux testnet flood`: the Sybil-flood benchmark; prints its report as JSON.
pub(crate) fn flood(
    keys_per_min: u32,
    duration: u32,
    (rounds, rent): (u32, bool),
    dir: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let gpux = gpux_binary()?;
    let rent_image = if rent {
        Some(gpux_testnet::build_image().context("building the workload image (Docker)")?)
    } else {
        None
    };
    let config = gpux_testnet::flood::FloodConfig {
        gpux,
        keys_per_min,
        duration: std::time::Duration::from_secs(u64::from(duration)),
        base_dir: dir,
        rounds,
        rent_image,
    };
    let started = std::time::Instant::now();
    let report = gpux_testnet::flood::run(&config, |line| {
        eprintln!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64())
    })?;
    print_json(&report)
}

/// `gpux testnet rent-bench`: renting at scale; prints its report as JSON.
pub(crate) fn rent_bench(
    (hosts, gpus, renters, ledgers): (u16, u16, u16, usize),
    (burst, restart): (usize, bool),
    levels: Vec<usize>,
    (samples, dir): (usize, Option<std::path::PathBuf>),
) -> anyhow::Result<()> {
    let config = gpux_testnet::rent_bench::RentBenchConfig {
        gpux: gpux_binary()?,
        hosts: hosts.into(),
        gpus_per_host: gpus.into(),
        renters: renters.into(),
        ledgers,
        burst,
        levels,
        samples,
        restart,
        base_dir: dir,
    };
    let started = std::time::Instant::now();
    let report = gpux_testnet::rent_bench::run(&config, |line| {
        eprintln!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64())
    })?;
    print_json(&report)
}

/// `gpux testnet api-bench`: `/v1/status` quiet and under half-open connections; prints
/// its report as JSON.
pub(crate) fn api_bench(connections: usize, samples: usize) -> anyhow::Result<()> {
    let config = gpux_testnet::api_bench::ApiBenchConfig {
        gpux: gpux_binary()?,
        connections,
        samples,
    };
    let report = gpux_testnet::api_bench::run(&config, |line| eprintln!("{line}"))?;
    print_json(&report)
}

pub(crate) fn stream_sink(into: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(gpux_testnet::plane_baselines::stream_sink(into))
}

pub(crate) fn plane_bench(bytes: u64, echo_samples: usize, rounds: usize) -> anyhow::Result<()> {
    let gpux = gpux_binary()?;
    let config = gpux_testnet::plane_bench::PlaneBenchConfig {
        gpux,
        bytes,
        echo_samples,
        rounds,
    };
    let started = std::time::Instant::now();
    let report = gpux_testnet::plane_bench::run(&config, |line| {
        eprintln!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64())
    })?;
    print_json(&report)
}

pub(crate) fn access_bench(
    image_bytes: u64,
    layers: u32,
    samples: usize,
    copy_bytes: u64,
) -> anyhow::Result<()> {
    let config = gpux_testnet::access_bench::AccessBenchConfig {
        gpux: gpux_binary()?,
        image_bytes,
        layers,
        samples: samples.max(1),
        copy_bytes,
    };
    let started = std::time::Instant::now();
    let report = gpux_testnet::access_bench::run(&config, |line| {
        eprintln!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64())
    })?;
    print_json(&report)
}

/// `gpux testnet preflight`: what this machine offers an isolated testnet.
pub(crate) fn preflight() -> anyhow::Result<()> {
    let p = gpux_testnet::netns::preflight();
    eprintln!("{}", p.summary());
    for problem in p.problems(&gpux_testnet::netns::Shaping::default()) {
        eprintln!("cannot run isolated: {problem}");
    }
    out!("{}", serde_json::to_string_pretty(&p)?)?;
    Ok(())
}

/// `gpux testnet ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum TestnetAction {
    /// Start hosts and renters as separate processes on loopback, let offers spread and
    /// renters rent, print a summary and (with --report) write a JSON report. Ctrl-C or the
    /// end of --duration stops every process it started.
    Up {
        /// Host nodes (with fake GPUs of assorted models and prices).
        #[arg(long, default_value_t = 3)]
        hosts: usize,
        /// Renter nodes.
        #[arg(long, default_value_t = 2)]
        renters: usize,
        /// How long to run once the offers have spread (e.g. 20s, 2m).
        #[arg(long, default_value = "20s", value_parser = gpux_api::text::duration_s)]
        duration: u32,
        /// Write the JSON report here.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
        /// Keep the nodes' data dirs here (default: a temporary directory, removed).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Ledger members: 1 (a ledger node), or 3 or 5 (a replicated ledger on openraft,
        /// whose leader is killed a third into the run and started again on its disk).
        #[arg(long, default_value_t = 1)]
        ledgers: usize,
        /// Every node in a network namespace of its own, with its own address, on a bridge
        /// the run makes and removes (needs root; docs/testnet.md).
        #[arg(long)]
        isolated: bool,
        /// With --isolated: delay added to each direction of each link (e.g. 50ms).
        #[arg(long, value_name = "TIME", requires = "isolated", value_parser = crate::parse_millis)]
        delay: Option<u64>,
        /// With --isolated: each send's delay drawn from delay ± this (e.g. 10ms).
        #[arg(long, value_name = "TIME", requires = "delay", value_parser = crate::parse_millis)]
        jitter: Option<u64>,
        /// With --isolated: packets lost on each link, percent (e.g. 1%).
        #[arg(long, value_name = "PERCENT", requires = "isolated", value_parser = crate::parse_percent)]
        loss: Option<f64>,
        /// With --isolated: each node's sending rate, as tc reads it (e.g. 100mbit).
        #[arg(long, value_name = "RATE", requires = "isolated")]
        rate: Option<String>,
        /// With --isolated: links to cut during the renting rounds and heal 8 s later, one
        /// after another, each checked: host-renter, ledger-minority, renter-ledger, or all
        /// (docs/testnet.md).
        #[arg(long, value_name = "SCENARIO,...", requires = "isolated", value_delimiter = ',', value_parser = crate::parse_partition)]
        partition: Vec<Vec<gpux_testnet::partitions::Scenario>>,
        /// With --isolated: hosts behind a NAT of their own (the first ones), each rented and used through
        /// a relay or a punched hole (default: 1 when there are 2 hosts or more).
        #[arg(long, value_name = "N", requires = "isolated")]
        nat_hosts: Option<usize>,
        /// With --isolated: renters behind a NAT of their own; each also rents every host
        /// behind NAT (default: 1 when there are hosts behind NAT and 2 renters or more).
        #[arg(long, value_name = "N", requires = "isolated")]
        nat_renters: Option<usize>,
        /// How often hosts re-publish their offers, seconds (a large testnet needs more:
        /// every republication is validated by every subscriber).
        #[arg(long, value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
        republish: u64,
        /// Renters from renter-2 on (but those behind NAT) follow one family each, cycling
        /// through the hosts' models, as renters that know what they want do
        /// (`--market-families`).
        #[arg(long)]
        shard_renters: bool,
    },
    /// What this machine offers an isolated testnet: namespaces, and how links can be
    /// shaped (loss, rate, delay); prints JSON.
    Preflight,
    /// The Sybil-flood benchmark: a rogue peer floods an honest relay with fresh host keys
    /// while an honest host's offers must keep reaching a victim node; prints the victim's
    /// book, memory, disk, the honest offers' propagation and who stayed connected as JSON
    /// (docs/benchmarks.md).
    Flood {
        /// Fresh host keys a minute.
        #[arg(long, default_value_t = 5000)]
        keys_per_min: u32,
        /// How long each flood lasts (e.g. 20s, 5m).
        #[arg(long, default_value = "5m", value_parser = gpux_api::text::duration_s)]
        duration: u32,
        /// Floods in a row, each from a fresh rogue identity.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
        /// After each flood the victim rents from the honest host (one `gpux rent`, timed;
        /// needs Docker).
        #[arg(long)]
        rent: bool,
        /// Keep the nodes' data dirs and logs here (a temporary directory, removed, when
        /// not given).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Benchmark renting at scale: hosts with many free fake GPUs, a burst of rents from
    /// several renters at once (leases got, no GPU twice), then rents per second and
    /// rent-to-running at each concurrency from one renter against Docker's create+start;
    /// prints JSON (docs/benchmarks.md).
    RentBench {
        /// Host nodes.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
        hosts: u16,
        /// Fake L4s on each host.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=64))]
        gpus: u16,
        /// Renter nodes (the burst is spread over them; the levels use the first).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
        renters: u16,
        /// Ledger members: 1, or 3 (a replicated ledger).
        #[arg(long, default_value_t = 1)]
        ledgers: usize,
        /// Rents fired at once over all renters first (0: none).
        #[arg(long, default_value_t = 0)]
        burst: usize,
        /// Concurrency levels from one renter, comma-separated.
        #[arg(long, default_value = "1,8,32", value_delimiter = ',')]
        levels: Vec<usize>,
        /// Rents timed at each level, at least.
        #[arg(long, default_value_t = 32)]
        samples: usize,
        /// After the burst, stop the first host with SIGTERM while the burst's leases run
        /// on it and start it again: the time to each lease's next acknowledged receipt
        /// (receipts every 5 s in this run).
        #[arg(long, requires = "burst")]
        restart: bool,
        /// Keep the nodes' data dirs and logs here (a temporary directory, removed, when
        /// not given).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Benchmark the local API under abuse: `/v1/status` on a quiet node, then while
    /// clients hold connections whose headers never end; prints JSON (docs/benchmarks.md).
    ApiBench {
        /// Half-open connections opened (and held).
        #[arg(long, default_value_t = 2000)]
        connections: usize,
        /// `/v1/status` calls timed on the quiet API (twice as many under the flood).
        #[arg(long, default_value_t = 100)]
        samples: usize,
    },
    /// Benchmark the workload plane: `gpux cp` against a raw libp2p stream and raw TCP,
    /// exec echo latency, HTTP through `gpux forward` against direct loopback; prints JSON
    /// (docs/benchmarks.md).
    PlaneBench {
        /// Bytes each copy moves (`1GiB`).
        #[arg(long, default_value = "1GiB", value_parser = gpux_api::text::size_bytes)]
        bytes: u64,
        /// Exec echo samples.
        #[arg(long, default_value_t = 200)]
        echo_samples: usize,
        /// Runs of each copy and raw stream (their medians are reported).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=20))]
        rounds: u16,
    },
    /// Benchmark reaching a lease: a cold and a warm pull from a registry against Docker's
    /// pull, create and start; `gpux ssh LEASE true` against `gpux exec`; scp against
    /// `gpux cp`; prints JSON (docs/benchmarks.md).
    AccessBench {
        /// The pulled image's size, in layers of random bytes (`4GiB`).
        #[arg(long, default_value = "4GiB", value_parser = gpux_api::text::size_bytes)]
        image_size: u64,
        /// Its layers.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
        layers: u32,
        /// `ssh` and `exec` samples each.
        #[arg(long, default_value_t = 30)]
        samples: usize,
        /// Bytes scp and gpux cp copy (`1GiB`).
        #[arg(long, default_value = "1GiB", value_parser = gpux_api::text::size_bytes)]
        copy: u64,
    },
    /// The receiving end of plane-bench's raw libp2p stream between two processes: prints
    /// its address, reads one stream to its end, prints how many bytes came.
    #[command(hide = true)]
    StreamSink {
        /// Write what comes into this new file.
        #[arg(long, value_name = "FILE")]
        into: Option<std::path::PathBuf>,
    },
}
