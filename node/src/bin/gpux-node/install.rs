//! `gpux host install`: writes a host's `config.toml` and a systemd unit that runs its node,
//! and starts nothing (docs/host.md). The configuration is read back through the node's
//! own settings before anything is written, so a unit never points at a configuration the
//! node would refuse; an existing file is kept unless `--force`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use gpux_client::out;
use gpux_client::print::print_json;

/// What `gpux host install` is told.
#[derive(Debug, clap::Args)]
pub(crate) struct InstallArgs {
    /// The ledger node this host settles with (`/ip4/.../tcp/.../p2p/<peer id>`).
    #[arg(long, value_name = "MULTIADDR")]
    pub(crate) ledger: String,
    /// Price per GPU-hour, credits.
    #[arg(long, value_name = "CREDITS")]
    pub(crate) price: String,
    /// Region token (`eu-west`).
    #[arg(long, default_value = "any")]
    pub(crate) region: String,
    /// The least a spot lease pays per GPU-hour (no spot leases without it).
    #[arg(long, value_name = "CREDITS")]
    pub(crate) spot_floor: Option<String>,
    /// libp2p listen address.
    #[arg(
        long,
        default_value = "/ip4/0.0.0.0/tcp/4001",
        value_name = "MULTIADDR"
    )]
    pub(crate) listen: String,
    /// Where the unit goes.
    #[arg(long, default_value = "/etc/systemd/system", value_name = "DIR")]
    pub(crate) unit_dir: PathBuf,
    /// Replace an existing configuration or unit.
    #[arg(long)]
    pub(crate) force: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The unit's file name.
pub(crate) const UNIT: &str = "gpux-node.service";

/// A TOML basic string (JSON's escapes are TOML's).
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// The host's configuration file.
fn config_text(args: &InstallArgs) -> String {
    let mut text =
        String::from("# Written by `gpux host install`; see docs/host.md and docs/network.md.\n");
    text.push_str("host = true\n");
    text.push_str(&format!("ledger = {}\n", quoted(&args.ledger)));
    text.push_str(&format!("listen = [{}]\n", quoted(&args.listen)));
    text.push_str(&format!("price = {}\n", quoted(&args.price)));
    text.push_str(&format!("region = {}\n", quoted(&args.region)));
    if let Some(floor) = &args.spot_floor {
        text.push_str(&format!("spot_floor = {}\n", quoted(floor)));
    }
    text
}

/// The systemd unit running `gpux-node` (at `binary`) for `data_dir`.
pub(crate) fn unit_text(binary: &Path, data_dir: &Path) -> String {
    format!(
        "\
[Unit]
Description=gpux node: shares this machine's GPUs on the gpux market
# docs/host.md in the gpux repository walks a host through it.
After=network-online.target docker.service
Wants=network-online.target docker.service

[Service]
Type=simple
ExecStart={binary} node run --data-dir {data_dir}
# SIGTERM (a restart, an upgrade): the node exits and its leases' containers run on;
# the next start takes them up again. `gpux node stop --end-leases` ends them first.
KillSignal=SIGTERM
TimeoutStopSec=120
Restart=on-failure
RestartSec=5
Environment=RUST_LOG=info
# Root: Docker's socket and the loop-mounted lease workspaces need it.
NoNewPrivileges=yes
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
",
        binary = binary.display(),
        data_dir = data_dir.display(),
    )
}

#[derive(serde::Serialize)]
struct Installed {
    config: PathBuf,
    unit: PathBuf,
    next: Vec<String>,
}

fn write_new(path: &Path, text: &str, force: bool) -> anyhow::Result<()> {
    if path.exists() && !force {
        bail!(
            "{} exists; it is kept (give --force to replace it)",
            path.display()
        );
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes the configuration and the unit; prints what to run next.
pub(crate) fn install(dir: &Path, args: &InstallArgs) -> anyhow::Result<()> {
    let dir = std::path::absolute(dir).context("the data directory's absolute path")?;
    let binary = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .context("finding the gpux-node binary")?;
    let config = dir.join(gpux_node::config::CONFIG_FILE);
    let unit = args.unit_dir.join(UNIT);
    for path in [&config, &unit] {
        if path.exists() && !args.force {
            bail!(
                "{} exists; it is kept (give --force to replace it)",
                path.display()
            );
        }
    }
    // Checked as the node will read it, before anything is written.
    let text = config_text(args);
    let scratch = std::env::temp_dir().join(format!("gpux-install-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).context("a scratch directory")?;
    let checked = std::fs::write(scratch.join(gpux_node::config::CONFIG_FILE), &text)
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            gpux_node::config::Options::default()
                .effective(&scratch)
                .and_then(|e| e.daemon_config(&dir))
                .map(drop)
                .map_err(|e| anyhow::anyhow!("{e}"))
        });
    let _ = std::fs::remove_dir_all(&scratch);
    // (Errors name the file the configuration will be.)
    let scratch_file = scratch.join(gpux_node::config::CONFIG_FILE);
    checked
        .map_err(|e| {
            let text = format!("{e:#}").replace(
                &scratch_file.display().to_string(),
                &config.display().to_string(),
            );
            anyhow::anyhow!(text)
        })
        .context("the configuration would not start a node")?;
    write_new(&config, &text, args.force)?;
    write_new(&unit, &unit_text(&binary, &dir), args.force)?;
    let installed = Installed {
        config,
        unit,
        next: vec![
            "gpux host check".into(),
            "systemctl daemon-reload".into(),
            format!("systemctl enable --now {UNIT}"),
        ],
    };
    if args.json {
        return print_json(&installed);
    }
    out!(
        "wrote {}\nwrote {}\nnothing was started; next:\n  {}",
        installed.config.display(),
        installed.unit.display(),
        installed.next.join("\n  ")
    )?;
    Ok(())
}
