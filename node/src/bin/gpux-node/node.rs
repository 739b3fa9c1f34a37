//! `gpux node run`.

use std::path::PathBuf;

use anyhow::Context;
use gpux_node::config::Options;

use gpux_client::out;

/// `gpux node run`'s arguments: every setting of the node (the same [`Options`] that
/// `config.toml` fills), and what to do with them.
#[derive(Debug, clap::Args)]
pub(crate) struct NodeRunArgs {
    #[command(flatten)]
    pub(crate) options: Options,
    /// Print the effective settings (flag over config.toml over default, each with where it
    /// came from) and exit.
    #[arg(long)]
    pub(crate) print_config: bool,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum NodeAction {
    /// Run the node: join the network, keep a live view of the market, serve the local API
    /// (127.0.0.1, token in `DATA_DIR/api.token`). With --host, also read the GPUs through
    /// NVML, sign an attestation, publish offers and answer lease requests. Ctrl-C and
    /// SIGTERM stop it and leave hosted leases running: the next start on the same data
    /// directory takes them up again.
    Run(Box<NodeRunArgs>),
    /// Stop the running node (through its API) and wait until it has exited. Hosted leases
    /// keep running for the node's next start, unless --end-leases.
    Stop {
        /// End every hosted lease first: each stops and settles, billed what ran.
        #[arg(long)]
        end_leases: bool,
    },
}

/// `gpux node ...`.
pub(crate) fn act(dir: PathBuf, action: NodeAction) -> anyhow::Result<()> {
    match action {
        NodeAction::Run(args) => run(dir, *args),
        NodeAction::Stop { end_leases } => stop(&dir, end_leases),
    }
}

/// How long `gpux node stop` waits for the node to exit (it gives its leases 20 s to
/// settle with --end-leases).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `gpux node stop`: asks the node to stop, then waits until its process has let go of the
/// data directory.
fn stop(dir: &std::path::Path, end_leases: bool) -> anyhow::Result<()> {
    let api = gpux_client::ApiClient::for_data_dir(dir)?;
    api.shutdown(end_leases)
        .context("asking the node to stop")?;
    eprintln!(
        "{}",
        if end_leases {
            "the node is ending its leases and stopping..."
        } else {
            "the node is stopping; its hosted leases keep running until it starts again..."
        }
    );
    let started = std::time::Instant::now();
    while gpux_node::node_runs_on(dir)
        .with_context(|| format!("looking for the node on {}", dir.display()))?
    {
        if started.elapsed() > STOP_WAIT {
            anyhow::bail!(
                "the node still runs {} s after it was asked to stop; see its log",
                STOP_WAIT.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    out!("stopped")?;
    Ok(())
}

/// Runs the node until Ctrl-C, SIGTERM or `gpux node stop`.
fn run(dir: PathBuf, args: NodeRunArgs) -> anyhow::Result<()> {
    // Everything under the data directory is named by an absolute path from here on: Docker
    // mounts only absolute paths (a lease's workspace), and a mount is found in
    // /proc/self/mountinfo by its absolute path (unmounting it when the lease ends).
    let dir = std::path::absolute(&dir)
        .with_context(|| format!("making the data directory {} absolute", dir.display()))?;
    let effective = args.options.effective(&dir)?;
    // Checked before anything is printed: settings that would not run are an error here too.
    let config = effective.daemon_config(&dir)?;
    if args.print_config {
        out!("# the settings of the node on {}", dir.display())?;
        for line in effective.to_toml().lines() {
            out!("{line}")?;
        }
        return Ok(());
    }
    // Logs to stderr; RUST_LOG overrides the default level (info).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        // Stop cleanly on Ctrl-C and on SIGTERM (what service managers send), leaving hosted
        // leases running for the next start.
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

/// `gpux ledger restore`.
pub(crate) fn restore_ledger(
    dir: &std::path::Path,
    from: Option<&std::path::Path>,
    release_grace_s: Option<u64>,
) -> anyhow::Result<()> {
    let flags = Options {
        ledger_release_grace_s: release_grace_s,
        ..Options::default()
    };
    let effective = flags.effective(dir)?;
    let grace_s = effective.options.ledger_release_grace_s.unwrap_or(600);
    let key = gpux_node::load_key(dir)?;
    // Replaying needs no faucet key: a grant's signer was checked when it was applied.
    let config = gpux_node::ledger::LedgerConfig {
        release_grace_ms: grace_s.saturating_mul(1000),
        ..Default::default()
    };
    let restored = gpux_node::ledger::restore(dir, from, &key, config)?;
    out!(
        "restored the ledger in {}: {} log entries verified and replayed, {} accounts",
        dir.display(),
        restored.entries,
        restored.accounts
    )?;
    if let Some(aside) = &restored.moved_aside {
        out!("the damaged database is kept at {}", aside.display())?;
    }
    match restored.other_records {
        Some(n) => out!("{n} other records of this node were copied from it")?,
        None => out!(
            "the damaged database could not be read: this node's own records other than the ledger (its leases as a party, its market view) are not restored"
        )?,
    }
    Ok(())
}
