//! `gpux-node`: the node daemon and the commands that act on this machine itself (its GPUs,
//! its Docker, its files), as `dockerd` is to `docker`. The `gpux` client hands these
//! commands to this binary, which sits beside it, by `exec` (the process stays the same, so
//! `gpux node run` under systemd or the testnet is the daemon itself); they take the same
//! arguments either way: `gpux node run` is `gpux-node node run`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod attest;
mod host;
mod host_measure;
mod install;
mod node;

/// gpux-node: the gpux node daemon and this machine's own commands (run as `gpux ...`).
#[derive(Debug, Parser)]
#[command(name = "gpux-node", version, about, long_about = None)]
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
    /// Run the node daemon, or stop it.
    Node {
        #[command(subcommand)]
        action: node::NodeAction,
    },
    /// Hosting GPUs: what sharing them needs here, and the node's configuration and unit.
    Host {
        #[command(subcommand)]
        action: HostAction,
    },
    /// The ledger this node serves, offline (the node stopped).
    Ledger {
        #[command(subcommand)]
        action: LedgerAction,
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
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per process: its size does not matter"
)]
enum HostAction {
    /// Check what sharing real GPUs needs: the NVIDIA driver (NVML), Docker, the NVIDIA
    /// container runtime, cgroups, free disk, the clock. Each failure says how to fix it;
    /// the exit status is non-zero while any check fails. Changes nothing.
    Check {
        /// The NVML library to load [default: the driver's libnvidia-ml.so.1].
        #[arg(long, value_name = "PATH")]
        nvml_lib: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set this machine up as a host: write the node's config.toml (host = true, the
    /// ledger, the price) in the data directory and a systemd unit that runs the node
    /// (gpux-node.service). Starts nothing; prints what to run next. Existing files are kept
    /// unless --force.
    Install(install::InstallArgs),
}

#[derive(Debug, Subcommand)]
enum LedgerAction {
    /// Rebuild a damaged ledger database from the ledger's verified copy of its log
    /// (`DATA_DIR/ledger.copy`): the copy is checked against the manifest and replayed
    /// before anything changes; the damaged database is moved aside, never deleted.
    Restore {
        /// Restore from this copy instead (one kept on another disk or machine).
        #[arg(long, value_name = "FILE")]
        from: Option<PathBuf>,
        /// The ledger's release grace in seconds, when it ran with one other than its
        /// config.toml's (the replay checks releases against it).
        #[arg(long = "ledger-release-grace", value_name = "SECONDS")]
        ledger_release_grace_s: Option<u64>,
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
    /// Challenge this machine's own GPUs with the CUDA prover, as a renter would (the
    /// memory fill of the model the driver names, then the INT8 product), and print each
    /// rate against the model's reference. Needs the NVIDIA driver only. Exits non-zero
    /// unless every GPU passes.
    Challenge {
        /// Only this GPU (its UUID, `GPU-...`); repeat for several [default: every GPU].
        #[arg(long, value_name = "UUID")]
        gpu: Vec<String>,
        /// The product lasts at least this long at the model's reference rate.
        #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
        seconds: f64,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the command: Ok(true) for success, Ok(false) for a check that failed (exit 1).
fn run(cli: Cli) -> anyhow::Result<bool> {
    // These read no data directory.
    match &cli.command {
        Command::Attest {
            action: Some(AttestAction::Verify { file, at }),
            ..
        } => return attest::verify(file, at.as_deref()),
        Command::Attest {
            action: Some(AttestAction::Challenge { gpu, seconds, json }),
            ..
        } => return attest::challenge(gpu, *seconds, *json),
        _ => {}
    }
    let dir = match cli.data_dir {
        Some(dir) => dir,
        None => gpux_node::default_data_dir()?,
    };
    match cli.command {
        Command::Node { action } => node::act(dir, action)?,
        Command::Host {
            action: HostAction::Check { nvml_lib, json },
        } => host::check(&dir, nvml_lib.as_deref(), json)?,
        Command::Host {
            action: HostAction::Install(args),
        } => install::install(&dir, &args)?,
        Command::Ledger {
            action:
                LedgerAction::Restore {
                    from,
                    ledger_release_grace_s,
                },
        } => node::restore_ledger(&dir, from.as_deref(), ledger_release_grace_s)?,
        Command::Attest { nvml_lib, json, .. } => attest::attest(&dir, nvml_lib.as_deref(), json)?,
    }
    Ok(true)
}

/// Exit codes: 0 success, 1 an error (printed as one line) or a failed check, 2 a usage
/// error (from clap).
fn main() -> ExitCode {
    let cli = Cli::parse();
    gpux_client::print::finish(run(cli).map(|ok| {
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }))
}
