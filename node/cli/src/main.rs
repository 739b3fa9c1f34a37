//! `gpux`: the command line of the gpux GPU exchange. Only argument parsing and printing;
//! the work happens in the libraries.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpux_node::attest;

mod lease_cmd;

/// gpux: a peer-to-peer exchange for GPU compute.
#[derive(Debug, Parser)]
#[command(name = "gpux", version, about, long_about = None)]
struct Cli {
    /// Where the node keeps its key and state
    /// [default: $XDG_DATA_HOME/gpux, else ~/.local/share/gpux].
    #[arg(long, global = true, env = "GPUX_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the node key (mode 0600) in the data directory and print the peer id.
    /// Running it again keeps the existing key.
    Init,
    /// Print this node's peer id (and, with --json, its public key and data directory).
    Id {
        /// Print one JSON object instead of the bare peer id.
        #[arg(long)]
        json: bool,
    },
    /// Run the node daemon.
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
    /// A whole market on this machine: hosts with fake GPUs, renters, real processes.
    Testnet {
        #[command(subcommand)]
        action: TestnetAction,
    },
    /// The running node's status.
    Status,
    /// Offers in the running node's view of the market.
    Offers {
        #[command(subcommand)]
        action: OffersAction,
    },
    /// Rent GPUs: match locally, ask the host, retry the next-best offer on refusal.
    Rent {
        #[command(flatten)]
        want: Want,
        /// The image to run, by digest.
        #[arg(long, value_name = "sha256:DIGEST")]
        image: Option<String>,
        /// An environment variable for the workload, NAME=VALUE (repeatable).
        #[arg(long, value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Give the container a network (none by default).
        #[arg(long)]
        network: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The command to run in the container, after `--` [default: the image's].
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// A lease's container output (as the renter received it).
    Logs {
        /// The lease id.
        lease: String,
        /// Keep printing new output until the lease ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Stop a lease you rent: the host stops the container, bills the time used and
    /// returns the rest of the escrow.
    Stop {
        /// The lease id.
        lease: String,
    },
    /// A lease's usage receipts and their acknowledgements.
    Receipts {
        /// The lease id.
        lease: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// This node's balance at its ledger.
    Balance {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// On a node that serves the ledger: credit an account (the testnet faucet).
    Mint {
        /// The account's peer id.
        account: String,
        /// Credits.
        amount: String,
    },
    /// Place a standing bid: signed and gossiped; this node rents as soon as an offer that
    /// satisfies it arrives (or is already known).
    Bid {
        #[command(flatten)]
        want: Want,
        /// How long the bid stands (at most 1h).
        #[arg(long, default_value = "10m")]
        ttl: String,
    },
    /// Leases this node is part of.
    Leases {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read every GPU through NVML, sign what was read with the node key, and print it
    /// (creates the node key on first use). `gpux attest verify FILE` checks a report.
    Attest {
        #[command(subcommand)]
        action: Option<AttestAction>,
        /// The NVML library to load [default: the driver's libnvidia-ml.so.1].
        #[arg(long, value_name = "PATH")]
        nvml_lib: Option<PathBuf>,
        /// Print the signed report as one JSON document (envelope and decoded content).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum NodeAction {
    /// Run the node: join the network, keep a live view of the market, serve the local API
    /// (127.0.0.1, token in `DATA_DIR/api.token`). With --host, also read the GPUs through
    /// NVML, sign an attestation, publish offers and answer lease requests.
    Run(NodeRunArgs),
}

#[derive(Debug, clap::Args)]
struct NodeRunArgs {
    /// libp2p listen address (repeatable).
    #[arg(
        long,
        value_name = "MULTIADDR",
        default_value = "/ip4/0.0.0.0/tcp/4001"
    )]
    listen: Vec<String>,
    /// A peer to join through, with its `/p2p/PEER_ID` (repeatable).
    #[arg(long, value_name = "MULTIADDR")]
    bootstrap: Vec<String>,
    /// The API address, loopback only [default: 127.0.0.1:0, a free port].
    #[arg(long, value_name = "ADDR")]
    api: Option<std::net::SocketAddr>,
    /// Discover peers on the local network with mDNS.
    #[arg(long)]
    mdns: bool,
    /// Share this machine's GPUs.
    #[arg(long)]
    host: bool,
    /// The NVML library to load [default: the driver's libnvidia-ml.so.1].
    #[arg(long, value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
    /// Price per GPU-hour, credits [default: 1.00].
    #[arg(long, value_name = "CREDITS")]
    price: Option<String>,
    /// Lowest spot bid accepted per GPU-hour (no spot leases without it).
    #[arg(long, value_name = "CREDITS")]
    spot_floor: Option<String>,
    /// This host's region (eu, us-east, ...) [default: any].
    #[arg(long)]
    region: Option<String>,
    /// An image the host has locally, by digest (repeatable; hosts need at least one).
    #[arg(long, value_name = "sha256:DIGEST")]
    image: Vec<String>,
    /// Shortest lease accepted, seconds [default: 60; billing's minimum is 60 s regardless].
    #[arg(long)]
    min_duration: Option<u32>,
    /// Longest lease accepted, seconds [default: 86400].
    #[arg(long)]
    max_duration: Option<u32>,
    /// How long each published offer lives, seconds [default: 600].
    #[arg(long)]
    offer_ttl: Option<u64>,
    /// How often offers are re-published, seconds [default: 120].
    #[arg(long)]
    republish: Option<u64>,
    /// The GPUs are simulated (fake NVML driver): containers get no GPU device.
    #[arg(long)]
    fake_gpus: bool,
    /// The ledger node to settle with, ending in /p2p/PEER_ID.
    #[arg(long, value_name = "MULTIADDR")]
    ledger: Option<String>,
    /// Serve the settlement ledger from this node.
    #[arg(long)]
    serve_ledger: bool,
    /// Ledger: seconds an escrow must be idle before its payer may take it back [default: 600].
    #[arg(long, value_name = "SECONDS")]
    ledger_release_grace: Option<u64>,
    /// Host: seconds between usage receipts [default: 60].
    #[arg(long, value_name = "SECONDS")]
    receipt_interval: Option<u64>,
    /// Host: seconds to wait for a receipt's acknowledgement before stopping the lease
    /// [default: 30].
    #[arg(long, value_name = "SECONDS")]
    ack_grace: Option<u64>,
}

/// What a renter wants, shared by `rent` and `bid`.
#[derive(Debug, clap::Args)]
struct Want {
    /// Constraints, e.g. 'gpu=H100 region=eu'.
    query: String,
    /// GPUs wanted (from one machine).
    #[arg(long, default_value_t = 1)]
    gpus: u16,
    /// Most paid per GPU-hour, credits.
    #[arg(long, value_name = "CREDITS")]
    max_price: String,
    /// Lease length: seconds, or a duration like 30m or 2h.
    #[arg(long, default_value = "1h")]
    duration: String,
}

impl Want {
    /// The JSON body fields the API's `/v1/rent` and `/v1/bid` share.
    fn body(&self) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::json!({
            "query": self.query,
            "gpus": self.gpus,
            "max_price": self.max_price,
            "duration_s": parse_duration(&self.duration)?,
        }))
    }
}

#[derive(Debug, Subcommand)]
enum TestnetAction {
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
        #[arg(long, default_value = "20s")]
        duration: String,
        /// Write the JSON report here.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
        /// Keep the nodes' data dirs here (default: a temporary directory, removed).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum OffersAction {
    /// Search the running node's view of the market, e.g. 'gpu=H100 vram>=80 price<=2.5'
    /// (docs/query.md).
    Search {
        /// The query.
        #[arg(default_value = "")]
        query: String,
        /// Most results.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum AttestAction {
    /// Check a report written by `gpux attest --json`: signature, that the decoded content
    /// matches the envelope, freshness and plausibility. Exits non-zero on any failure.
    Verify {
        /// The report file (`-` for standard input).
        file: PathBuf,
        /// Verify as of this time (RFC 3339 or unix milliseconds) instead of now.
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
    },
}

fn data_dir(cli: &Cli) -> anyhow::Result<PathBuf> {
    match &cli.data_dir {
        Some(dir) => Ok(dir.clone()),
        None => Ok(gpux_node::default_data_dir()?),
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    if let Command::Attest {
        action: Some(AttestAction::Verify { file, at }),
        ..
    } = &cli.command
    {
        return verify_report(file, at.as_deref());
    }
    let dir = data_dir(&cli)?;
    match cli.command {
        Command::Init => {
            let (key, created) = gpux_node::init_key(&dir)?;
            let path = gpux_node::key_path(&dir);
            if created {
                println!("created node key {}", path.display());
            } else {
                println!("node key {} already exists; keeping it", path.display());
            }
            println!("peer id: {}", key.peer_id());
        }
        Command::Id { json } => {
            let key = gpux_node::load_key(&dir)?;
            if json {
                let doc = serde_json::json!({
                    "peer_id": key.peer_id().to_string(),
                    "public_key": key.public().to_string(),
                    "data_dir": dir,
                });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&doc).context("encoding JSON")?
                );
            } else {
                println!("{}", key.peer_id());
            }
        }
        Command::Node {
            action: NodeAction::Run(args),
        } => return node_run(dir, args),
        Command::Testnet {
            action:
                TestnetAction::Up {
                    hosts,
                    renters,
                    duration,
                    report,
                    dir,
                },
        } => {
            return testnet_up(hosts, renters, &duration, report, dir);
        }
        Command::Status => {
            let status =
                gpux_node::api_client::ApiClient::for_data_dir(&dir)?.get("/v1/status", &[])?;
            println!("{}", serde_json::to_string_pretty(&status)?);
        }
        Command::Offers {
            action: OffersAction::Search { query, limit, json },
        } => {
            let client = gpux_node::api_client::ApiClient::for_data_dir(&dir)?;
            let hits = client.get(
                "/v1/offers",
                &[("q", &query), ("limit", &limit.to_string())],
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&hits)?);
            } else {
                print_hits(&hits);
            }
        }
        Command::Rent {
            want,
            image,
            env,
            network,
            json,
            command,
        } => {
            let client = gpux_node::api_client::ApiClient::for_data_dir(&dir)?;
            let mut body = want.body()?;
            body["image"] = serde_json::json!(image);
            body["command"] = serde_json::json!(command);
            body["network"] = serde_json::json!(network);
            let env: serde_json::Map<String, serde_json::Value> = env
                .iter()
                .map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
                        .with_context(|| format!("--env {kv}: expected NAME=VALUE"))
                })
                .collect::<anyhow::Result<_>>()?;
            body["env"] = serde_json::Value::Object(env);
            let lease = client.post("/v1/rent", &body)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&lease)?);
            } else {
                println!(
                    "lease {} running with {}: {} GPU(s) at {} credits per GPU-hour for {} s (escrow {} credits)",
                    lease["lease"].as_str().unwrap_or("?"),
                    lease["host"].as_str().unwrap_or("?"),
                    lease["gpus"].as_array().map_or(0, Vec::len),
                    lease["price_per_gpu_hour"].as_str().unwrap_or("?"),
                    lease["duration_s"],
                    lease["escrow_amount"].as_str().unwrap_or("?"),
                );
            }
        }
        Command::Bid { want, ttl } => {
            let client = gpux_node::api_client::ApiClient::for_data_dir(&dir)?;
            let mut body = want.body()?;
            body["ttl_s"] = serde_json::json!(parse_duration(&ttl)?);
            let bid = client.post("/v1/bid", &body)?;
            println!(
                "standing bid {} placed; see `gpux leases` once it is filled",
                bid["bid"].as_str().unwrap_or("?")
            );
        }
        Command::Leases { json } => {
            let leases =
                gpux_node::api_client::ApiClient::for_data_dir(&dir)?.get("/v1/leases", &[])?;
            if json {
                println!("{}", serde_json::to_string_pretty(&leases)?);
            } else {
                for l in leases.as_array().into_iter().flatten() {
                    println!(
                        "{}  {:<6}  {}",
                        l["lease"].as_str().unwrap_or("?"),
                        l["role"].as_str().unwrap_or("?"),
                        l["state"]["state"].as_str().unwrap_or("?")
                    );
                }
            }
        }
        Command::Logs { lease, follow } => return lease_cmd::logs(&dir, &lease, follow),
        Command::Stop { lease } => {
            let client = gpux_node::api_client::ApiClient::for_data_dir(&dir)?;
            client.post(&format!("/v1/leases/{lease}/stop"), &serde_json::json!({}))?;
            println!(
                "lease {lease}: the host is stopping it; `gpux receipts {lease}` shows the bill"
            );
        }
        Command::Receipts { lease, json } => return lease_cmd::receipts(&dir, &lease, json),
        Command::Balance { json } => {
            let client = gpux_node::api_client::ApiClient::for_data_dir(&dir)?;
            let balance = client.get("/v1/balance", &[])?;
            if json {
                println!("{}", serde_json::to_string_pretty(&balance)?);
            } else {
                println!(
                    "{} credits ({})",
                    balance["balance"].as_str().unwrap_or("?"),
                    balance["account"].as_str().unwrap_or("?")
                );
            }
        }
        Command::Mint { account, amount } => {
            let client = gpux_node::api_client::ApiClient::for_data_dir(&dir)?;
            let done = client.post(
                "/v1/ledger/mint",
                &serde_json::json!({ "account": account, "amount": amount }),
            )?;
            println!("{}", serde_json::to_string_pretty(&done)?);
        }
        Command::Attest { nvml_lib, json, .. } => {
            let (key, created) = gpux_node::init_key(&dir)?;
            if created {
                eprintln!("created node key {}", gpux_node::key_path(&dir).display());
            }
            let report = attest::attest(&key, nvml_lib.as_deref(), attest::now())?;
            if json {
                let doc = attest::report_json(&report);
                println!(
                    "{}",
                    serde_json::to_string_pretty(&doc).context("encoding JSON")?
                );
            } else {
                print_attestation(&report);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_attestation(att: &gpux_protocol::Verified<gpux_protocol::Attestation>) {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!(
        "attestation {} by {}, driver {}, CUDA {}, {}",
        att.id().short(),
        att.signer().peer_id(),
        att.driver_version,
        or_dash(att.cuda_driver_version.map(|v| v.to_string())),
        attest::format_time(att.created_at)
    );
    println!(
        "{:<3} {:<32} {:<41} {:>9} {:>4} {:>6} {:>7} {:>5} {:>4}  verdict",
        "#", "name", "uuid", "memory", "cc", "pcie", "power", "ecc", "mig"
    );
    for g in att.gpus.iter() {
        let pcie = match (g.pcie.max_gen, g.pcie.max_width) {
            (Some(gen_), Some(w)) => format!("{gen_}x{w}"),
            _ => "-".into(),
        };
        let verdict = match gpux_attestation::check_gpu(g) {
            gpux_attestation::Plausibility::Plausible => "plausible".to_string(),
            gpux_attestation::Plausibility::UnknownModel => "unknown model".to_string(),
            gpux_attestation::Plausibility::Implausible(why) => {
                format!("IMPLAUSIBLE: {}", why.reasons.join("; "))
            }
        };
        println!(
            "{:<3} {:<32} {:<41} {:>7.1}Gi {:>4} {:>6} {:>7} {:>5} {:>4}  {}",
            g.index,
            g.name.as_str(),
            g.uuid.to_string(),
            g.memory_total_bytes as f64 / (1u64 << 30) as f64,
            g.compute_capability.to_string(),
            pcie,
            or_dash(g.power_limit_mw.map(|p| format!("{}W", p / 1000))),
            or_dash(
                g.ecc
                    .map(|e| if e.enabled { "on".into() } else { "off".into() })
            ),
            or_dash(g.mig.as_ref().map(|m| if m.enabled {
                format!("{}", m.instances.len())
            } else {
                "off".into()
            })),
            verdict
        );
    }
}

fn parse_duration(text: &str) -> anyhow::Result<u32> {
    let secs = match text.parse::<u64>() {
        Ok(s) => s,
        Err(_) => humantime::parse_duration(text)
            .with_context(|| {
                format!("invalid duration '{text}': use seconds or a duration like 30m or 2h")
            })?
            .as_secs(),
    };
    u32::try_from(secs).map_err(|_| anyhow::anyhow!("duration '{text}' is too long"))
}

fn print_hits(hits: &serde_json::Value) {
    let rows = hits.as_array().map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        println!("no offer matches");
        return;
    }
    println!(
        "{:<16} {:<10} {:>5} {:>5} {:>10} {:<12} {:<14} {:>5}  host",
        "offer", "gpu", "vram", "free", "price/h", "region", "tier", "rel"
    );
    for h in rows {
        println!(
            "{:<16} {:<10} {:>5} {:>2}/{:<2} {:>10} {:<12} {:<14} {:>5.2}  {}",
            &h["offer"].as_str().unwrap_or("?")[..16.min(h["offer"].as_str().unwrap_or("?").len())],
            h["family"].as_str().unwrap_or("?"),
            h["vram_gb"],
            h["free"],
            h["gpus"],
            gpux_protocol::MicroCredits(h["price_per_gpu_hour"].as_u64().unwrap_or(0))
                .amount_text(),
            h["region"].as_str().unwrap_or("?"),
            h["tier"].as_str().unwrap_or("?"),
            h["reliability_permille"].as_f64().unwrap_or(0.0) / 1000.0,
            h["host"]
                .as_str()
                .and_then(|s| s.parse::<gpux_protocol::PublicKey>().ok())
                .map(|k| k.peer_id().to_string())
                .unwrap_or_default(),
        );
    }
}

fn testnet_up(
    hosts: usize,
    renters: usize,
    duration: &str,
    report_path: Option<PathBuf>,
    dir: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let duration = std::time::Duration::from_secs(u64::from(parse_duration(duration)?));
    let gpux = std::env::current_exe().context("finding the gpux binary")?;
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
    let config = gpux_testnet::TestnetConfig {
        hosts,
        renters,
        duration,
        gpux,
        base_dir: dir,
    };
    let report = gpux_testnet::up(&config, stop, |line| {
        eprintln!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64())
    })?;
    println!(
        "before renting: {} offers published, every renter saw at least {}",
        report.offers_before_renting, report.offers_seen_min_before_renting
    );
    println!(
        "testnet: {} nodes, {} offers live at the end, every renter saw at least {}",
        report.nodes, report.offers_published, report.offers_seen_min
    );
    println!(
        "propagation to renters: p50 {} ms, p95 {} ms",
        report.propagation_ms_p50, report.propagation_ms_p95
    );
    println!(
        "node memory when idle: median {} MiB, max {} MiB",
        report.node_rss_kb_median / 1024,
        report.node_rss_kb_max / 1024
    );
    println!(
        "{} leases agreed, {} double allocations, {} messages rejected, {} errors",
        report.leases_agreed,
        report.double_allocations,
        report.rejected_messages,
        report.errors.len()
    );
    println!(
        "containers: {} started, {} left; {} receipts acknowledged; {} leases settled",
        report.containers_started,
        report.containers_left,
        report.receipts_acked,
        report.leases_settled
    );
    println!(
        "credits: {} before, {} after (micro-credits){}",
        report.credits_before,
        report.credits_after,
        if report.credits_before == report.credits_after {
            ", conserved"
        } else {
            ", NOT CONSERVED"
        }
    );
    for l in &report.leases {
        println!(
            "  lease {}: {} GPU at {} µcr/h, ran {:.2} s ({}), charged {} µcr, expected {:.0}",
            &l.lease[..12.min(l.lease.len())],
            l.gpus,
            l.price_per_gpu_hour,
            l.runtime_s,
            l.end_reason,
            l.charged,
            l.expected
        );
    }
    println!(
        "rent to running: p50 {} ms, p95 {} ms; host CPU idle {:.2}%, leasing {:.2}%, metering {:.2}% of a core per lease (+{:.2}% in dockerd)",
        report.rent_to_running_ms_p50,
        report.rent_to_running_ms_p95,
        report.host_cpu_pct_idle,
        report.host_cpu_pct_leasing,
        report.metering_cpu_pct_per_lease,
        report.dockerd_cpu_pct_per_lease
    );
    for e in &report.errors {
        println!("error: {e}");
    }
    if let Some(path) = report_path {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("report written to {}", path.display());
    }
    Ok(
        if report.errors.is_empty() && report.double_allocations == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

fn node_run(dir: PathBuf, args: NodeRunArgs) -> anyhow::Result<ExitCode> {
    // Flags override <data-dir>/config.toml, which overrides the defaults.
    let flags = gpux_node::config::Flags {
        listen: args.listen,
        bootstrap: args.bootstrap,
        api: args.api,
        mdns: args.mdns,
        host: args.host,
        price: args.price,
        spot_floor: args.spot_floor,
        region: args.region,
        images: args.image,
        nvml_lib: args.nvml_lib,
        min_duration_s: args.min_duration,
        max_duration_s: args.max_duration,
        offer_ttl_s: args.offer_ttl,
        republish_s: args.republish,
        fake_gpus: args.fake_gpus,
        ledger: args.ledger,
        serve_ledger: args.serve_ledger,
        ledger_release_grace_s: args.ledger_release_grace,
        receipt_interval_s: args.receipt_interval,
        ack_grace_s: args.ack_grace,
    };
    let config = gpux_node::config::resolve(&dir, flags)?;
    // Logs to stderr; RUST_LOG overrides the default level (info).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        // Stop cleanly on Ctrl-C and on SIGTERM (what `gpux testnet` and service managers send).
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        gpux_node::daemon::run(config, async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await
    })?;
    Ok(ExitCode::SUCCESS)
}

fn verify_report(file: &std::path::Path, at: Option<&str>) -> anyhow::Result<ExitCode> {
    let text = if file == std::path::Path::new("-") {
        std::io::read_to_string(std::io::stdin())
            .context("reading the report from standard input")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let at = match at {
        Some(t) => attest::parse_time(t).map_err(anyhow::Error::msg)?,
        None => attest::now(),
    };
    let verdict = attest::verify_report(&text, at, &gpux_protocol::validate::Rules::default());
    for check in &verdict.checks {
        println!(
            "{:<4} {:<13} {}",
            if check.ok { "ok" } else { "FAIL" },
            check.name,
            check.detail
        );
    }
    if verdict.passed() {
        println!("report verified");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("report NOT verified");
        Ok(ExitCode::FAILURE)
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
