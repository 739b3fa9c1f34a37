//! `gpux`: the command line of the gpux GPU exchange. Only argument parsing and printing;
//! the work happens in the libraries.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

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
}

fn data_dir(cli: &Cli) -> anyhow::Result<PathBuf> {
    match &cli.data_dir {
        Some(dir) => Ok(dir.clone()),
        None => Ok(gpux_node::default_data_dir()?),
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
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
    }
    Ok(ExitCode::SUCCESS)
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
