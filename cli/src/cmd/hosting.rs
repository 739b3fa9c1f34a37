//! `gpux host ...`: checking and installing a host, and changing a running one (`set`,
//! `pause`, `resume`: through the node's API, stored by the node, published at once).

use std::path::{Path, PathBuf};

use gpux_node::api_client::ApiClient;

use super::{out, print_json};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum HostAction {
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
    Install(super::install::InstallArgs),
    /// Change a running host's setting: `price CREDITS` (per GPU-hour), `spot-floor
    /// CREDITS` (or `off`), `region TOKEN`. The offers are signed again at once (renters
    /// see them within a gossip round); running leases keep the terms both sides signed.
    /// Kept over config.toml's value at the node's next start.
    Set {
        /// The setting: price, spot-floor, region.
        name: String,
        /// Its value.
        value: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take the GPUs off the market: every offer is withdrawn and new leases are refused,
    /// while running leases go on to their end. Kept across restarts until `resume`.
    Pause {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// What this host earned, from its leases' records: paid (redeemed at the ledger) and
    /// pending (acknowledged, not yet redeemed), by day, lease or renter.
    Earnings {
        /// How to sum.
        #[arg(long, value_enum, default_value_t)]
        by: super::earnings::By,
        /// Only leases from this UTC date (2026-12-01) or RFC 3339 time on.
        #[arg(long)]
        since: Option<String>,
        /// Print CSV.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Offer the GPUs again after `pause`.
    Resume {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `gpux host ...`.
pub(crate) fn act(dir: &Path, action: HostAction) -> anyhow::Result<()> {
    match action {
        HostAction::Check { nvml_lib, json } => super::host::check(dir, nvml_lib.as_deref(), json),
        HostAction::Install(args) => super::install::install(dir, &args),
        HostAction::Set { name, value, json } => {
            if name == "paused" {
                anyhow::bail!("use `gpux host pause` and `gpux host resume`");
            }
            change(dir, &name, &value, json)
        }
        HostAction::Earnings {
            by,
            since,
            csv,
            json,
        } => super::earnings::earnings(dir, by, since.as_deref(), (csv, json)),
        HostAction::Pause { json } => change(dir, "paused", "true", json),
        HostAction::Resume { json } => change(dir, "paused", "false", json),
    }
}

/// Changes one of the running host's settings and prints them all as they now are.
fn change(dir: &Path, name: &str, value: &str, json: bool) -> anyhow::Result<()> {
    let settings = ApiClient::for_data_dir(dir)?.set_setting(name, value)?;
    let Some(host) = settings.host else {
        anyhow::bail!("the node on {} does not host", dir.display());
    };
    if json {
        return print_json(&host);
    }
    out!("price       {} credits per GPU-hour", host.price)?;
    out!(
        "spot-floor  {}",
        host.spot_floor.map_or_else(
            || "off".to_string(),
            |f| format!("{f} credits per GPU-hour")
        )
    )?;
    out!("region      {}", host.region)?;
    out!(
        "offers      {}",
        if host.paused {
            "paused: withdrawn, new leases refused (running leases go on)"
        } else {
            "published"
        }
    )?;
    Ok(())
}
