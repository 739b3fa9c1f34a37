//! `gpux`: the command line of the gpux GPU exchange. Only argument parsing and printing;
//! the work happens in the libraries.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpux_node::attest;

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
