//! `gpux`: the command line of the gpux GPU exchange. Only argument parsing and printing;
//! the work happens in the libraries.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

use cmd::rent::{Kind, Run, Want};

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
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per process: its size does not matter"
)]
enum Command {
    /// Create the node key (mode 0600) in the data directory and print the peer id.
    /// Running it again keeps the existing key.
    Init {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print this node's peer id (and, with --json, its public key and data directory).
    Id {
        /// Print one JSON object instead of the bare peer id.
        #[arg(long)]
        json: bool,
    },
    /// Run the node daemon, or stop it (`gpux-node`).
    #[command(disable_help_flag = true)]
    Node(Handed),
    /// A whole market on this machine: hosts with fake GPUs, renters, real processes
    /// (`gpux-testnet`).
    #[command(disable_help_flag = true)]
    Testnet(Handed),
    /// The running node's status.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// What GPUS GPUs of a model cost a month at HOURS a month, rented on-demand, spot or
    /// reserved from the live book, against buying and running them, and the hours above
    /// which buying is cheaper (docs/estimate.md).
    Estimate {
        /// The GPU model (family: h100, a100, l4, ...).
        #[arg(long)]
        gpu: String,
        /// How many GPUs.
        #[arg(long, default_value_t = 1)]
        gpus: u32,
        /// Hours a month they are used.
        #[arg(long)]
        hours_per_month: f64,
        /// Print JSON (every figure with the inputs it was computed from).
        #[arg(long)]
        json: bool,
    },
    /// Offers in the running node's view of the market.
    Offers {
        #[command(subcommand)]
        action: OffersAction,
    },
    /// Rent GPUs: match locally, ask the host, retry the next-best offer on refusal.
    Rent {
        #[command(flatten)]
        want: Want,
        #[command(flatten)]
        kind: Kind,
        #[command(flatten)]
        run: Run,
        /// Run the image's JupyterLab with a random token, forward it here and print the
        /// address to open (Ctrl-C stops the forward, not the lease).
        #[arg(long, conflicts_with = "json")]
        jupyter: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A lease's container output (as the renter received it).
    Logs {
        /// The lease id.
        lease: String,
        /// Keep printing new output until the lease ends.
        #[arg(long, short)]
        follow: bool,
        /// Print each piece of output as a JSON object (`{"text", "next", "ended"}`), one
        /// per line.
        #[arg(long)]
        json: bool,
    },
    /// Group orders (`gpux rent --gpus N --spread`).
    Group {
        #[command(subcommand)]
        action: GroupAction,
    },
    /// Start the work of a lease rented with --hold (after copying files in).
    Commit {
        /// The lease id.
        lease: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Challenge a running lease's GPUs: a seeded INT8 matrix product, rows of it checked
    /// and the whole timed by your node, while the host pauses your workload. A host below 90% of
    /// its model's reference rate, or with a wrong product, ends the lease at once.
    Challenge {
        /// The lease id.
        lease: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a lease you rent: the host stops the container, bills the time used and
    /// returns the rest of the escrow.
    Stop {
        /// The lease id.
        lease: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a lease's container (while it runs), as its unprivileged user;
    /// exits with the command's exit code.
    Exec {
        /// The lease id.
        lease: String,
        /// Send standard input to the command.
        #[arg(long, short)]
        interactive: bool,
        /// Give the command a terminal (needs one here; resizes follow).
        #[arg(long, short)]
        tty: bool,
        /// An environment variable, NAME=VALUE (repeatable; NVIDIA_* is refused).
        #[arg(long, short, value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// The command and its arguments, after `--`.
        #[arg(required = true, last = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Copy files or directories in or out of a lease's workspace: one side is
    /// `LEASE:/workspace/PATH`. Verified end to end; run it again after an interruption and
    /// it sends only what is missing.
    Cp {
        /// What to copy.
        src: String,
        /// Where to (into it, when it is a directory or ends with `/`).
        dst: String,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// Make a port on a lease container's own loopback reachable on this machine's
    /// 127.0.0.1, over the P2P link (the container has no network).
    Forward {
        /// The lease id.
        lease: String,
        /// `[LOCAL:]REMOTE`: the local port (default: the remote one) and the container's.
        #[arg(value_parser = cmd::plane::parse_ports, value_name = "[LOCAL:]REMOTE")]
        ports: (u16, u16),
        /// Carry one connection over standard input and output instead of listening (an
        /// OpenSSH `ProxyCommand`; see `gpux ssh-config`).
        #[arg(long)]
        stdio: bool,
    },
    /// SSH into a lease rented with `--ssh` (this machine's OpenSSH client; no sshd in the
    /// image: the host's node is the server, reached over the P2P link), or run a command
    /// there; exits with its exit code. `scp` and `sftp` reach `/workspace` through the
    /// entry `gpux ssh-config` prints.
    Ssh {
        /// The lease id.
        lease: String,
        /// A command to run instead of a login shell, after `--`.
        #[arg(last = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Carry one SSH connection into a lease over standard input and output (the
    /// `ProxyCommand` of `gpux ssh` and `gpux ssh-config`).
    #[command(hide = true)]
    SshProxy {
        /// The lease id.
        lease: String,
    },
    /// Print an OpenSSH `Host` entry for a lease rented with `--ssh`: `ssh gpux-LEASE`,
    /// `scp`, `sftp`, `ssh -L`, VS Code's Remote-SSH (the host's key pinned). Add it to
    /// ~/.ssh/config, or use `ssh -F FILE`. With `--port`, an entry for an sshd you run in
    /// the container yourself, through `gpux forward --stdio`.
    SshConfig {
        /// The lease id.
        lease: String,
        /// The port your own sshd listens on inside the container (on its loopback).
        #[arg(long)]
        port: Option<u16>,
        /// The user to log in as (your sshd's; with --port).
        #[arg(long, requires = "port")]
        user: Option<String>,
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
        /// Credits (more than zero).
        #[arg(value_parser = cmd::parse_credits)]
        amount: String,
        /// The faucet's data directory: its key signs a grant, which this node sends to its
        /// ledger (a ledger started with --ledger-faucet mints nothing else).
        #[arg(long, value_name = "DIR")]
        faucet: Option<std::path::PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Skip a host in this node's rents and bids (kept across restarts); `--undo` lifts it.
    /// `gpux offers search` shows blocked and unreachable hosts as such.
    Block {
        /// The host's peer id.
        host: String,
        /// Lift the block instead.
        #[arg(long)]
        undo: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The ledger this node serves, offline (the node stopped).
    Ledger {
        #[command(subcommand)]
        action: LedgerAction,
    },
    /// Place a standing bid: signed and gossiped; this node rents, with everything `gpux
    /// rent` takes (image, command, workspace, SSH...), as soon as an offer that satisfies it
    /// arrives (or is already known). `gpux bid list` shows your bids, `gpux bid cancel ID`
    /// withdraws one.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Bid {
        #[command(subcommand)]
        action: Option<cmd::market::BidAction>,
        #[command(flatten)]
        place: cmd::market::BidPlace,
    },
    /// Leases this node is part of.
    Leases {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a one-time link into the web console (this node's state in a browser, on its
    /// loopback API address): it signs one browser in, once, within two minutes.
    Console {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The node's settings: `gpux config set spend-cap 250` refuses rents, group orders and
    /// bid fills whose worst case would take what open leases commit past 250 credits
    /// (`off` lifts it); `gpux config get` shows them.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Hosting GPUs: `gpux host check` says what sharing real GPUs needs on this machine;
    /// `gpux host install` writes the node's configuration and a systemd unit.
    Host {
        #[command(subcommand)]
        action: cmd::hosting::HostAction,
    },
    /// Read every GPU through NVML, sign what was read with the node key, and print it
    /// (creates the node key on first use). `gpux attest verify FILE` checks a report
    /// (`gpux-node`).
    #[command(disable_help_flag = true)]
    Attest(Handed),
}

/// A command another binary runs (`gpux-node`, `gpux-testnet`, beside this one): its
/// arguments are handed over as they are, `--help` too.
#[derive(Debug, clap::Args)]
pub(crate) struct Handed {
    /// The command's arguments (`--help` lists them).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<std::ffi::OsString>,
}

impl Command {
    /// The binary that runs this command, when it is not `gpux` itself.
    fn handed_to(&self) -> Option<&'static str> {
        match self {
            Command::Node(_)
            | Command::Attest(_)
            | Command::Host {
                action: cmd::hosting::HostAction::Check(_) | cmd::hosting::HostAction::Install(_),
            }
            | Command::Ledger {
                action: LedgerAction::Restore(_),
            } => Some("gpux-node"),
            Command::Testnet(_) => Some("gpux-testnet"),
            _ => None,
        }
    }
}

#[derive(Debug, Subcommand)]
enum ConfigAction {
    /// Show the settings.
    Get {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change one: `spend-cap CREDITS` (or `off`).
    Set {
        /// The setting (spend-cap).
        name: String,
        /// Its value.
        value: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum LedgerAction {
    /// What this ledger node holds: totals, and for a member of a replicated ledger, the
    /// cluster as it sees it (leader, voters, learners, term, applied index).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// On the leader of a replicated ledger: take back a member that lost its store (it came
    /// back under a new node id and does not vote): its old id leaves, the new one joins as
    /// a learner, catches up, then votes.
    Readd {
        /// The member's peer id.
        peer: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild a damaged ledger database from the ledger's verified copy of its log
    /// (`DATA_DIR/ledger.copy`): the copy is checked against the manifest and replayed
    /// before anything changes; the damaged database is moved aside, never deleted
    /// (`gpux-node`).
    #[command(disable_help_flag = true)]
    Restore(Handed),
}

#[derive(Debug, Subcommand)]
enum GroupAction {
    /// Add GPUs to a running group (+K: placed and started all together, or not at all) or
    /// remove them (-K: whole leases, the latest first).
    Scale {
        /// The group id (as `gpux rent --spread` printed it).
        group: String,
        /// +K or -K GPUs.
        #[arg(allow_negative_numbers = true)]
        delta: i32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
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
    /// Follow more GPU families' offers from now on (a node started with --market-families
    /// follows only those; hosts follow their own), until the node restarts.
    Follow {
        /// Family keys (h100, a100, ...).
        #[arg(required_unless_present = "all")]
        families: Vec<String>,
        /// Follow every family.
        #[arg(long)]
        all: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn data_dir(cli: &Cli) -> anyhow::Result<PathBuf> {
    match &cli.data_dir {
        Some(dir) => Ok(dir.clone()),
        None => Ok(gpux_api::default_data_dir()?),
    }
}

/// Runs the command and gives its exit code: `gpux exec` the remote command's, the rest
/// [`run_command`]'s.
fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Some(binary) = cli.command.handed_to() {
        return Err(hand_to(binary));
    }
    if let Command::Ssh { lease, command } = &cli.command {
        let dir = data_dir(&cli)?;
        let code = cmd::ssh::ssh(&dir, lease, command)?;
        return Ok(ExitCode::from(u8::try_from(code).unwrap_or(255)));
    }
    if matches!(cli.command, Command::Exec { .. }) {
        let dir = data_dir(&cli)?;
        if let Command::Exec {
            lease,
            interactive,
            tty,
            env,
            command,
        } = cli.command
        {
            let args = cmd::plane::ExecArgs {
                lease,
                interactive,
                tty,
                env,
                command,
            };
            return cmd::plane::exec(&dir, args);
        }
    }
    Ok(if run_command(cli)? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs the command: Ok(true) for success, Ok(false) for a check that failed (exit 1).
fn run_command(cli: Cli) -> anyhow::Result<bool> {
    let dir = data_dir(&cli)?;
    match cli.command {
        Command::Init { json } => {
            let (key, created) = gpux_api::init_key(&dir)?;
            let path = gpux_api::key_path(&dir);
            if json {
                /// `gpux init --json`.
                #[derive(serde::Serialize)]
                struct Initialized {
                    peer_id: String,
                    key_file: PathBuf,
                    created: bool,
                }
                cmd::print_json(&Initialized {
                    peer_id: key.peer_id().to_string(),
                    key_file: path,
                    created,
                })?;
                return Ok(true);
            }
            if created {
                cmd::out!("created node key {}", path.display())?;
            } else {
                cmd::out!("node key {} already exists; keeping it", path.display())?;
            }
            cmd::out!("peer id: {}", key.peer_id())?;
        }
        Command::Id { json } => {
            let key = gpux_api::load_key(&dir)?;
            if json {
                /// `gpux id --json`.
                #[derive(serde::Serialize)]
                struct Id {
                    peer_id: String,
                    public_key: String,
                    data_dir: PathBuf,
                }
                cmd::print_json(&Id {
                    peer_id: key.peer_id().to_string(),
                    public_key: key.public().to_string(),
                    data_dir: dir,
                })?;
            } else {
                cmd::out!("{}", key.peer_id())?;
            }
        }
        Command::Status { json } => cmd::market::status(&dir, json)?,
        Command::Estimate {
            gpu,
            gpus,
            hours_per_month,
            json,
        } => cmd::estimate::run(&dir, &gpu, gpus, hours_per_month, json)?,
        Command::Offers {
            action: OffersAction::Search { query, limit, json },
        } => cmd::market::search(&dir, &query, limit, json)?,
        Command::Offers {
            action:
                OffersAction::Follow {
                    families,
                    all,
                    json,
                },
        } => cmd::market::follow(&dir, families, all, json)?,
        Command::Rent {
            want,
            kind,
            run,
            jupyter,
            json,
        } => cmd::rent::rent(&dir, want, kind, run, (jupyter, json))?,
        Command::Bid {
            action: Some(cmd::market::BidAction::List { json }),
            ..
        } => cmd::market::bid_list(&dir, json)?,
        Command::Bid {
            action: Some(cmd::market::BidAction::Cancel { bid, json }),
            ..
        } => cmd::market::bid_cancel(&dir, &bid, json)?,
        Command::Bid {
            action: None,
            place,
        } => cmd::market::bid(&dir, place)?,
        Command::Leases { json } => cmd::market::leases(&dir, json)?,
        Command::Logs {
            lease,
            follow,
            json,
        } => cmd::lease::logs(&dir, &lease, follow, json)?,
        Command::Stop { lease, json } => cmd::lease::stop(&dir, &lease, json)?,
        Command::Commit { lease, json } => cmd::lease::commit(&dir, &lease, json)?,
        Command::Challenge { lease, json } => cmd::lease::challenge(&dir, &lease, json)?,
        Command::Group {
            action: GroupAction::Scale { group, delta, json },
        } => cmd::market::scale_group(&dir, &group, delta, json)?,
        Command::Forward {
            lease,
            ports,
            stdio: true,
        } => cmd::plane::forward_stdio(&dir, &lease, ports.1)?,
        Command::Forward { lease, ports, .. } => cmd::plane::forward(&dir, &lease, ports)?,
        Command::SshConfig {
            lease,
            port: Some(port),
            user,
        } => cmd::plane::ssh_config(&dir, &lease, port, user.as_deref())?,
        Command::SshConfig { lease, .. } => cmd::ssh::config(&dir, &lease)?,
        Command::SshProxy { lease } => cmd::ssh::proxy(&dir, &lease)?,
        // Taken by `run`.
        Command::Ssh { .. } => return Ok(false),
        Command::Cp { src, dst, json } => cmd::plane::cp(&dir, &src, &dst, json)?,
        // Taken by `run`.
        Command::Exec { .. } => return Ok(false),
        Command::Receipts { lease, json } => cmd::lease::receipts(&dir, &lease, json)?,
        Command::Balance { json } => cmd::market::balance(&dir, json)?,
        Command::Block { host, undo, json } => cmd::market::block(&dir, host, undo, json)?,
        Command::Ledger {
            action: LedgerAction::Status { json },
        } => cmd::market::ledger_status(&dir, json)?,
        Command::Ledger {
            action: LedgerAction::Readd { peer, json },
        } => cmd::market::ledger_readd(&dir, &peer, json)?,
        Command::Mint {
            account,
            amount,
            faucet,
            json,
        } => cmd::market::mint(&dir, account, amount, faucet.as_deref(), json)?,
        Command::Console { json } => cmd::console::console(&dir, json)?,
        Command::Config {
            action: ConfigAction::Get { json },
        } => cmd::console::get(&dir, json)?,
        Command::Config {
            action: ConfigAction::Set { name, value, json },
        } => cmd::console::set(&dir, &name, &value, json)?,
        Command::Host { action } => cmd::hosting::act(&dir, action)?,
        // Taken by `run`.
        Command::Node(_) | Command::Testnet(_) | Command::Attest(_) => return Ok(false),
        Command::Ledger {
            action: LedgerAction::Restore(_),
        } => return Ok(false),
    }
    Ok(true)
}

/// Runs `binary`, beside this one, in this process (`exec`: the pid stays, so `gpux node
/// run` under systemd or a testnet is the daemon itself) with this process's arguments, and
/// `gpux` as its name (its usage reads `gpux node run`). Returns only on failure.
fn hand_to(binary: &str) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let me = match std::env::current_exe() {
        Ok(me) => me,
        Err(e) => return anyhow::Error::new(e).context("finding the gpux binary"),
    };
    let path = me.with_file_name(binary);
    if !path.is_file() {
        return anyhow::anyhow!(
            "this command is run by {binary}, which belongs beside gpux and is not at {} (install it there; from source: `cargo build -p {binary}`)",
            path.display()
        );
    }
    let err = std::process::Command::new(&path)
        .arg0("gpux")
        .args(std::env::args_os().skip(1))
        .exec();
    anyhow::Error::new(err).context(format!("running {}", path.display()))
}

/// Exit codes: 0 success, 1 an error (printed as one line), 2 a usage error (from clap).
fn main() -> ExitCode {
    let cli = Cli::parse();
    gpux_client::print::finish(run(cli))
}
