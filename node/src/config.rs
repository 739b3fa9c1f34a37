//! `<data-dir>/config.toml`: the node's settings, with documented defaults. Command-line
//! flags override the file; the file overrides the defaults.
//!
//! ```toml
//! listen = ["/ip4/0.0.0.0/tcp/4001"]   # libp2p listen addresses
//! bootstrap = []                        # peers to join through, with /p2p/<peer id>
//! api = "127.0.0.1:0"                   # local API (loopback only; port 0 picks one)
//! mdns = false                          # discover peers on the LAN
//! ledger = "/ip4/.../tcp/.../p2p/12D3..." # the ledger node this node settles with
//! serve_ledger = false                  # run the ledger node here
//! ledger_release_grace_s = 600          # ledger: idle time before a payer may release
//! receipt_interval_s = 60               # host: how often receipts are signed
//! ack_grace_s = 30                      # host: stop a lease this long after a missed ack
//!
//! [host]                                # present: share this machine's GPUs
//! price = "1.00"                        # credits per GPU-hour
//! spot_floor = "0.40"                   # optional; no spot leases without it
//! region = "any"
//! images = ["sha256:..."]               # optional; default: every image Docker has
//! nvml_lib = "/path/libnvidia-ml.so.1"  # optional; default: the driver's
//! fake_gpus = false                     # simulated GPUs (testnet): no GPU device passed
//! min_duration_s = 60                  # billing's minimum is 60 s regardless
//! max_duration_s = 86400
//! offer_ttl_s = 600
//! republish_s = 120
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use std::time::Duration;

use crate::daemon::{DaemonConfig, HostOptions};
use crate::p2p::Multiaddr;
use gpux_lease::Timing;

/// The file's name in the data directory.
pub const CONFIG_FILE: &str = "config.toml";

/// The file, as written.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// libp2p listen addresses.
    pub listen: Option<Vec<String>>,
    /// Bootstrap peers.
    pub bootstrap: Option<Vec<String>>,
    /// The API address.
    pub api: Option<SocketAddr>,
    /// mDNS discovery.
    pub mdns: Option<bool>,
    /// Host settings; present to run as a host.
    pub host: Option<FileHost>,
    /// The ledger node's address.
    pub ledger: Option<String>,
    /// Serve the ledger.
    pub serve_ledger: Option<bool>,
    /// Ledger: idle seconds before a payer may release an escrow.
    pub ledger_release_grace_s: Option<u64>,
    /// Receipt interval, seconds.
    pub receipt_interval_s: Option<u64>,
    /// Acknowledgement grace, seconds.
    pub ack_grace_s: Option<u64>,
}

/// The `[host]` table.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHost {
    /// Price per GPU-hour, credits.
    pub price: Option<String>,
    /// Spot floor per GPU-hour, credits.
    pub spot_floor: Option<String>,
    /// Region token.
    pub region: Option<String>,
    /// Images by digest.
    pub images: Option<Vec<String>>,
    /// NVML library.
    pub nvml_lib: Option<PathBuf>,
    /// Shortest lease, seconds.
    pub min_duration_s: Option<u32>,
    /// Longest lease, seconds.
    pub max_duration_s: Option<u32>,
    /// Offer lifetime, seconds.
    pub offer_ttl_s: Option<u64>,
    /// Re-publication interval, seconds.
    pub republish_s: Option<u64>,
    /// Simulated GPUs.
    pub fake_gpus: Option<bool>,
}

/// What the command line gave (`None` / empty: not given).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--listen`.
    pub listen: Vec<String>,
    /// `--bootstrap`.
    pub bootstrap: Vec<String>,
    /// `--api`.
    pub api: Option<SocketAddr>,
    /// `--mdns`.
    pub mdns: bool,
    /// `--host`.
    pub host: bool,
    /// `--price`.
    pub price: Option<String>,
    /// `--spot-floor`.
    pub spot_floor: Option<String>,
    /// `--region`.
    pub region: Option<String>,
    /// `--image`.
    pub images: Vec<String>,
    /// `--nvml-lib`.
    pub nvml_lib: Option<PathBuf>,
    /// `--min-duration`.
    pub min_duration_s: Option<u32>,
    /// `--max-duration`.
    pub max_duration_s: Option<u32>,
    /// `--offer-ttl`.
    pub offer_ttl_s: Option<u64>,
    /// `--republish`.
    pub republish_s: Option<u64>,
    /// `--fake-gpus`.
    pub fake_gpus: bool,
    /// `--ledger`.
    pub ledger: Option<String>,
    /// `--serve-ledger`.
    pub serve_ledger: bool,
    /// `--ledger-release-grace`.
    pub ledger_release_grace_s: Option<u64>,
    /// `--receipt-interval`.
    pub receipt_interval_s: Option<u64>,
    /// `--ack-grace`.
    pub ack_grace_s: Option<u64>,
}

/// Reads `<data-dir>/config.toml`; a missing file is the defaults.
pub fn load(data_dir: &Path) -> anyhow::Result<FileConfig> {
    let path = data_dir.join(CONFIG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text)
            .with_context(|| format!("invalid configuration {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(FileConfig::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn addrs(list: &[String], what: &str) -> anyhow::Result<Vec<Multiaddr>> {
    list.iter()
        .map(|a| {
            a.parse()
                .with_context(|| format!("invalid {what} address '{a}'"))
        })
        .collect()
}

/// The daemon's settings: flags over the file over the defaults.
pub fn resolve(data_dir: &Path, flags: Flags) -> anyhow::Result<DaemonConfig> {
    let file = load(data_dir)?;
    let listen = if flags.listen.is_empty() {
        file.listen
            .unwrap_or_else(|| vec!["/ip4/0.0.0.0/tcp/4001".into()])
    } else {
        flags.listen
    };
    let bootstrap = if flags.bootstrap.is_empty() {
        file.bootstrap.unwrap_or_default()
    } else {
        flags.bootstrap
    };
    let host = if flags.host || file.host.is_some() {
        let h = file.host.unwrap_or_default();
        let images: Vec<String> = if flags.images.is_empty() {
            h.images.unwrap_or_default()
        } else {
            flags.images
        };
        Some(HostOptions {
            nvml_lib: flags.nvml_lib.or(h.nvml_lib),
            price: flags
                .price
                .or(h.price)
                .unwrap_or_else(|| "1.00".into())
                .parse()
                .context("price")?,
            spot_floor: flags
                .spot_floor
                .or(h.spot_floor)
                .map(|s| s.parse())
                .transpose()
                .context("spot floor")?,
            region: flags.region.or(h.region).unwrap_or_else(|| "any".into()),
            images: images
                .iter()
                .map(|i| i.parse())
                .collect::<Result<_, _>>()
                .context("image")?,
            min_duration_s: flags.min_duration_s.or(h.min_duration_s).unwrap_or(60),
            max_duration_s: flags.max_duration_s.or(h.max_duration_s).unwrap_or(86_400),
            offer_ttl_s: flags.offer_ttl_s.or(h.offer_ttl_s).unwrap_or(600),
            republish_s: flags.republish_s.or(h.republish_s).unwrap_or(120),
            fake_gpus: flags.fake_gpus || h.fake_gpus.unwrap_or(false),
        })
    } else {
        None
    };
    Ok(DaemonConfig {
        data_dir: data_dir.to_path_buf(),
        listen: addrs(&listen, "listen")?,
        bootstrap: addrs(&bootstrap, "bootstrap")?,
        api: flags
            .api
            .or(file.api)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        mdns: flags.mdns || file.mdns.unwrap_or(false),
        host,
        ledger: flags
            .ledger
            .or(file.ledger)
            .map(|a| {
                a.parse()
                    .with_context(|| format!("invalid ledger address '{a}'"))
            })
            .transpose()?,
        serve_ledger: (flags.serve_ledger || file.serve_ledger.unwrap_or(false)).then(|| {
            gpux_market::LedgerConfig {
                release_grace_ms: flags
                    .ledger_release_grace_s
                    .or(file.ledger_release_grace_s)
                    .unwrap_or(600)
                    .saturating_mul(1000),
            }
        }),
        timing: timing(
            flags.receipt_interval_s.or(file.receipt_interval_s),
            flags.ack_grace_s.or(file.ack_grace_s),
        )?,
    })
}

fn timing(interval_s: Option<u64>, grace_s: Option<u64>) -> anyhow::Result<Timing> {
    let defaults = Timing::default();
    let interval = interval_s.map_or(
        Duration::from_millis(defaults.receipt_interval_ms),
        Duration::from_secs,
    );
    let grace = grace_s.map_or(
        Duration::from_millis(defaults.ack_grace_ms),
        Duration::from_secs,
    );
    if interval.is_zero() || interval > Duration::from_secs(3600) {
        bail!("receipt_interval_s must be between 1 and 3600");
    }
    if grace.is_zero() {
        bail!("ack_grace_s must be at least 1");
    }
    Ok(Timing {
        receipt_interval_ms: interval.as_millis() as u64,
        ack_grace_ms: grace.as_millis() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_which_overrides_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let defaults = resolve(dir.path(), Flags::default()).unwrap();
        assert_eq!(defaults.listen[0].to_string(), "/ip4/0.0.0.0/tcp/4001");
        assert!(defaults.host.is_none() && !defaults.mdns);
        std::fs::write(
            dir.path().join(CONFIG_FILE),
            "listen = [\"/ip4/127.0.0.1/tcp/5000\"]\nmdns = true\n[host]\nprice = \"2.50\"\nregion = \"eu\"\nimages = [\"sha256:".to_string() + &"ab".repeat(32) + "\"]\n",
        )
        .unwrap();
        let file = resolve(dir.path(), Flags::default()).unwrap();
        assert_eq!(file.listen[0].to_string(), "/ip4/127.0.0.1/tcp/5000");
        assert!(file.mdns);
        let host = file.host.unwrap();
        assert_eq!(
            (host.price.0, host.region.as_str(), host.republish_s),
            (2_500_000, "eu", 120)
        );
        let flags = Flags {
            price: Some("3".into()),
            listen: vec!["/ip4/127.0.0.1/tcp/6000".into()],
            ..Flags::default()
        };
        let both = resolve(dir.path(), flags).unwrap();
        assert_eq!(both.listen[0].to_string(), "/ip4/127.0.0.1/tcp/6000");
        assert_eq!(both.host.unwrap().price.0, 3_000_000);
    }

    #[test]
    fn a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CONFIG_FILE), "listn = []\n").unwrap();
        let err = format!("{:#}", resolve(dir.path(), Flags::default()).unwrap_err());
        assert!(
            err.contains("config.toml") && err.contains("listn"),
            "{err}"
        );
        std::fs::write(dir.path().join(CONFIG_FILE), "receipt_interval_s = 0\n").unwrap();
        let err = format!("{:#}", resolve(dir.path(), Flags::default()).unwrap_err());
        assert!(err.contains("receipt_interval_s"), "{err}");
    }
}
