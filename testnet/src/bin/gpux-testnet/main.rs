//! `gpux-testnet`: a whole market on this machine (`gpux testnet up`) and the benchmarks
//! that drive one. The `gpux` client hands `gpux testnet ...` to this binary, which sits
//! beside it, by `exec`; the testnet runs its nodes and renter commands through that same
//! `gpux`. Kept out of the product binaries: the rogue peer, the benchmarks and link
//! shaping live here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod testnet;

/// gpux-testnet: a whole gpux market on this machine (run as `gpux testnet ...`).
#[derive(Debug, Parser)]
#[command(name = "gpux-testnet", version, about, long_about = None)]
struct Cli {
    /// Accepted as `gpux` accepts it; a testnet keeps its nodes' data under --dir.
    #[arg(
        long,
        global = true,
        env = "GPUX_DATA_DIR",
        value_name = "DIR",
        hide = true
    )]
    data_dir: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A whole market on this machine: hosts with fake GPUs, renters, real processes.
    Testnet {
        #[command(subcommand)]
        action: testnet::TestnetAction,
    },
}

/// The `gpux` binary beside this one: the testnet runs every node and renter command
/// through it.
fn gpux_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("finding the gpux-testnet binary")?;
    let gpux = me.with_file_name("gpux");
    if !gpux.is_file() {
        anyhow::bail!(
            "the testnet runs its nodes with the gpux binary beside {}, and there is none at {} (build both: `cargo build -p gpux -p gpux-node -p gpux-testnet`)",
            me.display(),
            gpux.display()
        );
    }
    Ok(gpux)
}

/// A short time on the command line (`50ms`, `0.2s`, or plain milliseconds), in ms, at
/// most 10 s.
fn parse_millis(text: &str) -> Result<u64, String> {
    let ms = match text.parse::<u64>() {
        Ok(ms) => ms,
        Err(_) => humantime::parse_duration(text)
            .map_err(|_| format!("'{text}': use a time like 50ms or 0.2s"))?
            .as_millis() as u64,
    };
    if ms > 10_000 {
        return Err(format!("'{text}': at most 10s"));
    }
    Ok(ms)
}

/// A percentage on the command line (`1%` or `1`), from 0 to 100.
fn parse_percent(text: &str) -> Result<f64, String> {
    let pct: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{text}': use a percentage like 1% or 0.5"))?;
    if !(0.0..=100.0).contains(&pct) {
        return Err(format!("'{text}': a percentage from 0 to 100"));
    }
    Ok(pct)
}

/// A partition scenario on the command line (`all`: every one).
fn parse_partition(text: &str) -> Result<Vec<gpux_testnet::partitions::Scenario>, String> {
    match text.trim() {
        "all" => Ok(gpux_testnet::partitions::Scenario::ALL.to_vec()),
        one => Ok(vec![one.parse()?]),
    }
}

/// Runs the command: Ok(true) for success, Ok(false) for a run with errors (exit 1).
fn run(cli: Cli) -> anyhow::Result<bool> {
    use testnet::TestnetAction;
    let Command::Testnet { action } = cli.command;
    match action {
        TestnetAction::Up {
            hosts,
            renters,
            duration,
            report,
            dir,
            ledgers,
            isolated,
            delay,
            jitter,
            loss,
            rate,
            partition,
            nat_hosts,
            nat_renters,
            republish,
            shard_renters,
        } => {
            let nat_hosts = match (isolated, nat_hosts) {
                (false, _) => 0,
                (true, Some(n)) => n,
                (true, None) => usize::from(hosts >= 2),
            };
            let nat_renters = match (isolated, nat_renters) {
                (false, _) => 0,
                (true, Some(n)) => n,
                (true, None) => usize::from(nat_hosts > 0 && renters >= 2),
            };
            let isolated = isolated.then(|| gpux_testnet::netns::Shaping {
                delay_ms: delay.unwrap_or(0),
                jitter_ms: jitter.unwrap_or(0),
                loss_pct: loss.unwrap_or(0.0),
                rate,
            });
            let config = gpux_testnet::TestnetConfig {
                hosts,
                renters,
                duration: std::time::Duration::from_secs(u64::from(duration)),
                gpux: gpux_binary()?,
                base_dir: dir,
                ledgers,
                isolated,
                partitions: partition.into_iter().flatten().collect(),
                nat_hosts,
                nat_renters,
                republish_s: republish,
                shard_renters,
            };
            return testnet::up(config, report);
        }
        TestnetAction::Preflight => testnet::preflight()?,
        TestnetAction::Flood {
            keys_per_min,
            duration,
            rounds,
            rent,
            dir,
        } => testnet::flood(keys_per_min, duration, (rounds, rent), dir)?,
        TestnetAction::PlaneBench {
            bytes,
            echo_samples,
            rounds,
        } => testnet::plane_bench(bytes, echo_samples, rounds.into())?,
        TestnetAction::RentBench {
            hosts,
            gpus,
            renters,
            ledgers,
            burst,
            levels,
            samples,
            restart,
            dir,
        } => testnet::rent_bench(
            (hosts, gpus, renters, ledgers),
            (burst, restart),
            levels,
            (samples, dir),
        )?,
        TestnetAction::AccessBench {
            image_size,
            layers,
            samples,
            copy,
        } => testnet::access_bench(image_size, layers, samples, copy)?,
        TestnetAction::ApiBench {
            connections,
            samples,
        } => testnet::api_bench(connections, samples)?,
        TestnetAction::StreamSink { into } => testnet::stream_sink(into)?,
    }
    Ok(true)
}

/// Exit codes: 0 success, 1 an error (printed as one line) or a run with errors, 2 a usage
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
