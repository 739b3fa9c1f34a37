//! `gpux node run`.

use std::path::PathBuf;

use anyhow::Context;

#[derive(Debug, clap::Args)]
pub(crate) struct NodeRunArgs {
    /// libp2p listen address (repeatable).
    #[arg(
        long,
        value_name = "MULTIADDR",
        default_value = "/ip4/0.0.0.0/tcp/4001"
    )]
    pub(crate) listen: Vec<String>,
    /// A peer to join through, with its `/p2p/PEER_ID` (repeatable).
    #[arg(long, value_name = "MULTIADDR")]
    pub(crate) bootstrap: Vec<String>,
    /// The API address, loopback only [default: 127.0.0.1:0, a free port].
    #[arg(long, value_name = "ADDR")]
    pub(crate) api: Option<std::net::SocketAddr>,
    /// Discover peers on the local network with mDNS.
    #[arg(long)]
    pub(crate) mdns: bool,
    /// Share this machine's GPUs.
    #[arg(long)]
    pub(crate) host: bool,
    /// The NVML library to load [default: the driver's libnvidia-ml.so.1].
    #[arg(long, value_name = "PATH")]
    pub(crate) nvml_lib: Option<PathBuf>,
    /// Price per GPU-hour, credits [default: 1.00].
    #[arg(long, value_name = "CREDITS")]
    pub(crate) price: Option<String>,
    /// Lowest spot bid accepted per GPU-hour (no spot leases without it).
    #[arg(long, value_name = "CREDITS")]
    pub(crate) spot_floor: Option<String>,
    /// This host's region (eu, us-east, ...) [default: any].
    #[arg(long)]
    pub(crate) region: Option<String>,
    /// An image the host has locally, by digest (repeatable; hosts need at least one).
    #[arg(long, value_name = "sha256:DIGEST")]
    pub(crate) image: Vec<String>,
    /// Shortest lease accepted, seconds [default: 60; billing's minimum is 60 s regardless].
    #[arg(long)]
    pub(crate) min_duration: Option<u32>,
    /// Longest lease accepted, seconds [default: 86400].
    #[arg(long)]
    pub(crate) max_duration: Option<u32>,
    /// How long each published offer lives, seconds [default: 600].
    #[arg(long)]
    pub(crate) offer_ttl: Option<u64>,
    /// How often offers are re-published, seconds [default: 120].
    #[arg(long)]
    pub(crate) republish: Option<u64>,
    /// The GPUs are simulated (fake NVML driver): containers get no GPU device.
    #[arg(long)]
    pub(crate) fake_gpus: bool,
    /// The ledger node to settle with, ending in /p2p/PEER_ID.
    #[arg(long, value_name = "MULTIADDR")]
    pub(crate) ledger: Option<String>,
    /// Serve the settlement ledger from this node.
    #[arg(long)]
    pub(crate) serve_ledger: bool,
    /// Ledger: seconds an escrow must be idle before its payer may take it back [default: 600].
    #[arg(long, value_name = "SECONDS")]
    pub(crate) ledger_release_grace: Option<u64>,
    /// Host: seconds between usage receipts [default: 60].
    #[arg(long, value_name = "SECONDS")]
    pub(crate) receipt_interval: Option<u64>,
    /// Host: seconds to wait for a receipt's acknowledgement before stopping the lease
    /// [default: 30].
    #[arg(long, value_name = "SECONDS")]
    pub(crate) ack_grace: Option<u64>,
}

/// Runs the node until Ctrl-C or SIGTERM.
pub(crate) fn run(dir: PathBuf, args: NodeRunArgs) -> anyhow::Result<()> {
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
    Ok(())
}
