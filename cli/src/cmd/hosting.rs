//! `gpux host ...`: checking and installing a host, and changing a running one (`set`,
//! `pause`, `drain`, `resume`: through the node's API, stored by the node, published at
//! once).

use std::path::Path;

use gpux_client::ApiClient;

use super::{out, print_json};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum HostAction {
    /// Check what sharing real GPUs needs: the NVIDIA driver (NVML), Docker, the NVIDIA
    /// container runtime, cgroups, free disk, the clock. Each failure says how to fix it;
    /// the exit status is non-zero while any check fails. Changes nothing (`gpux-node`).
    #[command(disable_help_flag = true)]
    Check(crate::Handed),
    /// Set this machine up as a host: write the node's config.toml (host = true, the
    /// ledger, the price) in the data directory and a systemd unit that runs the node
    /// (gpux-node.service). Starts nothing; prints what to run next. Existing files are kept
    /// unless --force (`gpux-node`).
    #[command(disable_help_flag = true)]
    Install(crate::Handed),
    /// Change a running host's setting: `price CREDITS` (per GPU-hour), `spot-floor
    /// CREDITS` (or `off`), `region TOKEN`, `cancel-fees SCHEDULE` (24h:10%,1h:50%, or
    /// none), `cpus N` and `memory SIZE` (what leases get of the machine, or `all`). The
    /// offers are signed again at once (renters see them within a gossip round); running
    /// leases keep the terms both sides signed. Kept over config.toml's value at the
    /// node's next start.
    Set {
        /// The setting: price, spot-floor, region, cancel-fees, cpus, memory.
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
    /// Take the machine back at a time: from now on offer and take only leases that end by
    /// TIME (an RFC 3339 time, 2026-12-08T09:00:00Z, or a span from now, 2h30m), and say
    /// when the last running lease ends. Kept across restarts until `resume` (or --off).
    Drain {
        /// When the machine must be free.
        #[arg(long, value_name = "TIME", required_unless_present = "off")]
        until: Option<String>,
        /// Stop draining: offer leases of any length again.
        #[arg(long, conflicts_with = "until")]
        off: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Offer the GPUs again after `pause` or `drain`.
    Resume {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `gpux host ...`.
pub(crate) fn act(dir: &Path, action: HostAction) -> anyhow::Result<()> {
    match action {
        // `gpux-node` runs these (`main`'s `hand_to`).
        HostAction::Check(_) | HostAction::Install(_) => {
            anyhow::bail!("`gpux host check` and `gpux host install` are run by gpux-node")
        }
        HostAction::Set { name, value, json } => {
            if name == "paused" {
                anyhow::bail!("use `gpux host pause` and `gpux host resume`");
            }
            if name == "drain-until" {
                anyhow::bail!("use `gpux host drain --until TIME` and `gpux host resume`");
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
        HostAction::Drain { until, off, json } => {
            let value = match (until, off) {
                (Some(until), false) => drain_time(&until)?.to_string(),
                _ => "off".to_string(),
            };
            change(dir, "drain-until", &value, json)
        }
        HostAction::Resume { json } => {
            ApiClient::for_data_dir(dir)?.set_setting("drain-until", "off")?;
            change(dir, "paused", "false", json)
        }
    }
}

/// `--until`: an RFC 3339 time or a span from now, as unix milliseconds (in the future).
fn drain_time(until: &str) -> anyhow::Result<u64> {
    let now = std::time::SystemTime::now();
    let at = match humantime::parse_rfc3339_weak(until) {
        Ok(at) => at,
        Err(_) => {
            let span = humantime::parse_duration(until).map_err(|e| {
                anyhow::anyhow!(
                    "--until {until}: {e} (a time, 2026-12-08T09:00:00Z, or a span from now, 2h30m)"
                )
            })?;
            now + span
        }
    };
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| anyhow::anyhow!("--until {until}: before 1970"))?
        .as_millis();
    if at <= now {
        anyhow::bail!("--until {until}: that time has passed");
    }
    Ok(u64::try_from(ms)?)
}

/// A unix-ms time as the user reads it (UTC, to the second).
fn when(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
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
    out!("cancel-fees {}", host.cancel_fees)?;
    out!(
        "share       {} threads, {} of memory for leases",
        host.cpus
            .map_or_else(|| "all".to_string(), |n| n.to_string()),
        host.memory_bytes.map_or_else(
            || "all but the host's own".to_string(),
            |b| bytesize::ByteSize(b).to_string()
        )
    )?;
    out!(
        "offers      {}",
        if host.paused {
            "paused: withdrawn, new leases refused (running leases go on)"
        } else {
            "published"
        }
    )?;
    if let Some(until) = host.drain_until {
        out!(
            "drain       until {}: only leases that end by then are offered and taken",
            when(until)
        )?;
    }
    match host.free_at {
        Some(free) => out!(
            "free at     {} (when the last running lease ends)",
            when(free)
        )?,
        None => out!("free at     now (no lease running)")?,
    }
    if !host.failed_gpus.is_empty() {
        out!(
            "failed      {} (withheld after a fault; `gpux host check` offers them again once they read well)",
            host.failed_gpus.join(", ")
        )?;
    }
    Ok(())
}
