//! The node's settings: one [`Options`] type that the command line (clap) and
//! `<data-dir>/config.toml` (serde) both fill, merged flag over file over default, each
//! default stated once ([`Options::defaults`]). `gpux node run --print-config` shows the
//! effective settings and where each came from.
//!
//! The file's keys are the flags' names with `_` for `-` (seconds-valued ones end in `_s`):
//!
//! ```toml
//! listen = ["/ip4/0.0.0.0/tcp/4001"]   # libp2p listen addresses
//! bootstrap = []                        # peers to join through, with /p2p/<peer id>
//! api = "127.0.0.1:0"                   # local API (loopback only; port 0 picks one)
//! metrics_listen = "127.0.0.1:0"        # Prometheus /metrics (port 0 picks one; "off": none)
//! mdns = false                          # discover peers on the LAN
//! ledger = "/ip4/.../tcp/.../p2p/12D3..." # the ledger to settle with (members: comma-separated)
//! serve_ledger = false                  # run the ledger node here
//! ledger_cluster = ["/ip4/.../p2p/..."]  # ... as a member of this replicated ledger
//! ledger_bootstrap = false              # form that cluster from here (one member, once)
//! ledger_release_grace_s = 600          # ledger: idle time before a payer may release
//! ledger_faucet = "12D3KooW..."          # ledger: mint only grants this key signed
//! receipt_interval_s = 60               # host: how often receipts are signed
//! ack_grace_s = 30                      # host: stop a lease this long after a missed ack
//! spot_notice_s = 30                    # host: a spot lease's notice before preemption
//! host = false                          # share this machine's GPUs
//! price = "1.00"                        # host: credits per GPU-hour
//! spot_floor = "0.40"                   # host: optional; no spot leases without it
//! region = "any"                        # host: region token
//! images = ["sha256:..."]               # host: optional; default: every image Docker has
//! nvml_lib = "/path/libnvidia-ml.so.1"  # host: optional; default: the driver's
//! fake_gpus = false                     # host: simulated GPUs (testnet): no device passed
//! min_duration_s = 60                   # host: billing's minimum is 60 s regardless
//! max_duration_s = 86400
//! offer_ttl_s = 600
//! republish_s = 120
//! disk_quota = "64GiB"                  # host: all open leases' workspaces together
//! max_retain_s = 3600                   # host: the longest a workspace outlives its lease
//! disk_price = "0.01"                   # host: credits per GiB-hour of a kept workspace
//! max_image = "20GiB"                   # host: the largest renter image staged (0: none)
//! stage_quota = "64GiB"                 # host: renters' staged images together
//! cancel_fees = "24h:10%,1h:50%,10m:100%" # host: a reserved window's cancellation fees
//! pull = true                           # host: pull renters' images from registries
//! pull_registries = ["docker.io", "ghcr.io", "!evil.example"] # host: (default: any)
//! pull_timeout_s = 1800                 # host: the longest a pull may take
//! pull_cache = "64GiB"                  # host: images pulled without credentials, kept
//! cpus = 32                             # host: CPU threads given to leases (default: all)
//! memory = "256GiB"                     # host: memory given to leases (default: all but a
//!                                       # tenth, at least 2 GiB, kept for the host)
//! challenge_reference = ["l4=1.5"]      # renter: a family's challenge rates, Gop/s[,GB/s
//!                                       # [,memory scale]] (fake GPUs prove on the CPU)
//! market_families = ["h100", "a100"]    # follow only these families' offers (default: all;
//!                                       # ["auto"]: those this node searches, rents and bids for)
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use gpux_lease::Timing;

use crate::daemon::{DaemonConfig, HostOptions};
use crate::p2p::Multiaddr;

/// The file's name in the data directory.
pub const CONFIG_FILE: &str = "config.toml";

/// Every setting of a node. Each field is optional: `None` means "not given here" (on the
/// command line, or in the file); [`Options::defaults`] fills what neither gave, and
/// `gpux node run --print-config` shows every effective value and where it came from.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// libp2p listen address (repeatable).
    #[arg(long, value_name = "MULTIADDR")]
    pub listen: Option<Vec<String>>,
    /// A peer to join through, with its `/p2p/PEER_ID` (repeatable).
    #[arg(long, value_name = "MULTIADDR")]
    pub bootstrap: Option<Vec<String>>,
    /// The API address, loopback only.
    #[arg(long, value_name = "ADDR")]
    pub api: Option<SocketAddr>,
    /// Where Prometheus `/metrics` listens (`127.0.0.1:9400`; port 0 picks one and writes it
    /// to `<data-dir>/metrics.addr`; `off`: nowhere). It needs no token: keep it on loopback
    /// unless the network it listens on is yours.
    #[arg(long = "metrics-listen", value_name = "ADDR|off")]
    pub metrics_listen: Option<String>,
    /// Discover peers on the local network with mDNS.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub mdns: Option<bool>,
    /// The ledger to settle with, ending in /p2p/PEER_ID: its node, or the members of a
    /// replicated ledger, comma-separated.
    #[arg(long, value_name = "MULTIADDR[,...]")]
    pub ledger: Option<String>,
    /// Serve the settlement ledger from this node.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub serve_ledger: Option<bool>,
    /// Ledger: serve it as a member of this replicated ledger (every member's address,
    /// this node's own among them, each ending in /p2p/PEER_ID; 3 or 5 members).
    #[arg(
        long = "ledger-cluster",
        value_delimiter = ',',
        value_name = "MULTIADDR,..."
    )]
    pub ledger_cluster: Option<Vec<String>>,
    /// Ledger: form a new replicated ledger from this member when its store is new (one
    /// member of a new cluster; the others join it).
    #[arg(long = "ledger-bootstrap", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub ledger_bootstrap: Option<bool>,
    /// Ledger: seconds an escrow must be idle before its payer may take it back.
    #[arg(long = "ledger-release-grace", value_name = "SECONDS")]
    pub ledger_release_grace_s: Option<u64>,
    /// Ledger: the faucet's peer id; credits are minted only by `FaucetGrant`s it signed
    /// (`gpux mint --faucet DIR`), which every member checks.
    #[arg(long = "ledger-faucet", value_name = "PEER_ID")]
    pub ledger_faucet: Option<String>,
    /// Host: seconds between usage receipts.
    #[arg(long = "receipt-interval", value_name = "SECONDS")]
    pub receipt_interval_s: Option<u64>,
    /// Host: seconds to wait for a receipt's acknowledgement before stopping the lease
    ///.
    #[arg(long = "ack-grace", value_name = "SECONDS")]
    pub ack_grace_s: Option<u64>,
    /// Host: seconds of notice a spot lease gets before it is preempted (a term of every
    /// lease this host accepts).
    #[arg(long = "spot-notice", value_name = "SECONDS")]
    pub spot_notice_s: Option<u64>,
    /// Share this machine's GPUs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub host: Option<bool>,
    /// Host: price per GPU-hour, credits.
    #[arg(long, value_name = "CREDITS")]
    pub price: Option<String>,
    /// Host: lowest spot bid accepted per GPU-hour (no spot leases without it).
    #[arg(long, value_name = "CREDITS")]
    pub spot_floor: Option<String>,
    /// Host: this host's region (eu, us-east, ...).
    #[arg(long)]
    pub region: Option<String>,
    /// Host: an image the host has locally, by digest (repeatable).
    #[arg(long = "image", value_name = "sha256:DIGEST")]
    pub images: Option<Vec<String>>,
    /// Host: the NVML library to load.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Host: the GPUs are simulated (fake NVML driver): containers get no GPU device.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub fake_gpus: Option<bool>,
    /// Host: shortest lease accepted, seconds.
    #[arg(long = "min-duration", value_name = "SECONDS")]
    pub min_duration_s: Option<u32>,
    /// Host: longest lease accepted, seconds.
    #[arg(long = "max-duration", value_name = "SECONDS")]
    pub max_duration_s: Option<u32>,
    /// Host: how long each published offer lives, seconds.
    #[arg(long = "offer-ttl", value_name = "SECONDS")]
    pub offer_ttl_s: Option<u64>,
    /// Host: how often offers are re-published, seconds.
    #[arg(long = "republish", value_name = "SECONDS")]
    pub republish_s: Option<u64>,
    /// Host: the disk all open leases' workspaces may take together (`64GiB`; 0: no
    /// workspaces). Each workspace's blocks are reserved when its lease starts.
    #[arg(long = "disk-quota", value_name = "SIZE")]
    pub disk_quota: Option<String>,
    /// Host: the longest a lease's workspace is kept after the lease for its renter to
    /// fetch results, seconds.
    #[arg(long = "max-retain", value_name = "SECONDS")]
    pub max_retain_s: Option<u64>,
    /// Host: what keeping a lease's workspace after its workload costs, credits per
    /// GiB-hour (`0.01`; 0: free). The renter pays the whole retention it asked for.
    #[arg(long = "disk-price", value_name = "CREDITS")]
    pub disk_price: Option<String>,
    /// Host: the largest image a renter may stage here to run (`20GiB`; 0: renters run only
    /// the images this host lists).
    #[arg(long = "max-image", value_name = "SIZE")]
    pub max_image: Option<String>,
    /// Host: the disk renters' staged images may take together, kept or arriving (`64GiB`).
    #[arg(long = "stage-quota", value_name = "SIZE")]
    pub stage_quota: Option<String>,
    /// Host: what a renter that cancels a reserved window before its start pays, as shares
    /// of the window's committed minimum by how close to the start it cancels
    /// (`24h:10%,1h:50%,10m:100%`; `none`: cancelling is free). Published in the offers.
    #[arg(long = "cancel-fees", value_name = "SCHEDULE")]
    pub cancel_fees: Option<String>,
    /// Host: pull the images renters name from their registries (public or private, the
    /// credentials given for that pull only), up to `max-image` each, before the lease.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub pull: Option<bool>,
    /// Host: the registries pulled from (`docker.io`, `ghcr.io`, `127.0.0.1:5000`,
    /// `*.example.com`); `!name` refuses one. Default: any. Published in the offers.
    #[arg(
        long = "pull-registries",
        value_delimiter = ',',
        value_name = "REGISTRY,..."
    )]
    pub pull_registries: Option<Vec<String>>,
    /// Host: the longest a pull may take, seconds.
    #[arg(long = "pull-timeout", value_name = "SECONDS")]
    pub pull_timeout_s: Option<u64>,
    /// Host: the disk images pulled without credentials may take, kept for the next
    /// renters who name them (least recently used erased first; `0`: none kept).
    #[arg(long = "pull-cache", value_name = "SIZE")]
    pub pull_cache: Option<String>,
    /// Host: CPU threads given to leases, split evenly over the GPUs (default: every thread
    /// of the machine). Published in the offers; each lease's CPU limit is its GPUs' share.
    #[arg(long, value_name = "N")]
    pub cpus: Option<u32>,
    /// Host: memory given to leases, split evenly over the GPUs (`256GiB`; default: the
    /// machine's, less a tenth, at least 2 GiB, kept for the host).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Renter: the performance challenge's references of a GPU family (repeatable), in
    /// place of the spec table's: the INT8 product's rate in Gop/s, optionally the memory
    /// fill's bandwidth in GB/s (not judged when absent) and the share of the claimed memory
    /// it fills (default 1); for fake GPUs, whose CPU provers are measured on the machine.
    #[arg(long = "challenge-reference", value_name = "FAMILY=GOPS[,GBS[,SCALE]]")]
    pub challenge_reference: Option<Vec<String>>,
    /// The GPU families whose offers and attestations this node follows (`h100,a100`); the
    /// market is gossiped per family, so a renter that wants a few receives only those.
    /// `auto`: the families this node's searches, rents, groups and bids name, followed as
    /// they come. Default: every family.
    #[arg(
        long = "market-families",
        value_delimiter = ',',
        value_name = "FAMILY,..."
    )]
    pub market_families: Option<Vec<String>>,
    /// Testnet only: a delay, ms, added to everything this node sends (the isolated
    /// testnet's links; the kernel here has no netem).
    #[arg(long = "link-delay-ms", value_name = "MS", hide = true)]
    pub link_delay_ms: Option<u64>,
    /// Testnet only: each send's delay is drawn from `link-delay-ms ± this`.
    #[arg(long = "link-jitter-ms", value_name = "MS", hide = true)]
    pub link_jitter_ms: Option<u64>,
}

/// Where an effective setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The command line.
    Flag,
    /// `config.toml`.
    File,
    /// The built-in default.
    Default,
    /// Not set anywhere (an optional setting).
    Unset,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Flag => "flag",
            Source::File => "config.toml",
            Source::Default => "default",
            Source::Unset => "not set",
        })
    }
}

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the right shape (the message names the line and key).
    #[error("invalid configuration {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line, column and key.
        message: String,
    },
    /// A value does not work.
    #[error("{where_}: {key}: {message}")]
    Value {
        /// `config.toml line N`, or `--flag`, or `default`.
        where_: String,
        /// The setting.
        key: &'static str,
        /// Why.
        message: String,
    },
}

/// The effective settings: the merged options, where each came from, and the file's text
/// (to name the line of a bad value).
#[derive(Debug, Clone)]
pub struct Effective {
    /// The merged options (everything with a default is `Some`).
    pub options: Options,
    /// Each setting's source, in the order of [`Options`].
    pub sources: Vec<(&'static str, Source)>,
    path: PathBuf,
    text: String,
}

/// Picks flag over file over default.
fn pick<T: Clone>(flag: &Option<T>, file: &Option<T>, default: &Option<T>) -> (Option<T>, Source) {
    match (flag, file, default) {
        (Some(v), _, _) => (Some(v.clone()), Source::Flag),
        (None, Some(v), _) => (Some(v.clone()), Source::File),
        (None, None, Some(v)) => (Some(v.clone()), Source::Default),
        (None, None, None) => (None, Source::Unset),
    }
}

/// Runs `$body` for every field of [`Options`] (one list, so a new setting cannot be
/// forgotten in the merge or the printout).
macro_rules! each_setting {
    ($m:ident) => {
        $m!(
            listen,
            bootstrap,
            api,
            metrics_listen,
            mdns,
            ledger,
            serve_ledger,
            ledger_cluster,
            ledger_bootstrap,
            ledger_release_grace_s,
            ledger_faucet,
            receipt_interval_s,
            ack_grace_s,
            spot_notice_s,
            host,
            price,
            spot_floor,
            region,
            images,
            nvml_lib,
            fake_gpus,
            min_duration_s,
            max_duration_s,
            offer_ttl_s,
            republish_s,
            disk_quota,
            max_retain_s,
            disk_price,
            max_image,
            stage_quota,
            cancel_fees,
            pull,
            pull_registries,
            pull_timeout_s,
            pull_cache,
            cpus,
            memory,
            challenge_reference,
            market_families,
            link_delay_ms,
            link_jitter_ms
        )
    };
}

impl Options {
    /// Every default, stated once.
    pub fn defaults() -> Options {
        let timing = Timing::default();
        Options {
            listen: Some(vec!["/ip4/0.0.0.0/tcp/4001".into()]),
            bootstrap: Some(Vec::new()),
            api: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            metrics_listen: Some("127.0.0.1:0".into()),
            mdns: Some(false),
            ledger: None,
            serve_ledger: Some(false),
            ledger_cluster: None,
            ledger_bootstrap: Some(false),
            ledger_release_grace_s: Some(600),
            ledger_faucet: None,
            receipt_interval_s: Some(timing.receipt_interval_ms / 1000),
            ack_grace_s: Some(timing.ack_grace_ms / 1000),
            spot_notice_s: Some(timing.spot_notice_ms / 1000),
            host: Some(false),
            price: Some("1.00".into()),
            spot_floor: None,
            region: Some("any".into()),
            images: Some(Vec::new()),
            nvml_lib: None,
            fake_gpus: Some(false),
            min_duration_s: Some(60),
            max_duration_s: Some(86_400),
            offer_ttl_s: Some(600),
            republish_s: Some(120),
            disk_quota: Some("64GiB".into()),
            max_retain_s: Some(3600),
            disk_price: Some("0".into()),
            max_image: Some("20GiB".into()),
            stage_quota: Some("64GiB".into()),
            cancel_fees: Some("24h:10%,1h:50%,10m:100%".into()),
            pull: Some(true),
            pull_registries: Some(Vec::new()),
            pull_timeout_s: Some(1800),
            pull_cache: Some("64GiB".into()),
            cpus: None,
            memory: None,
            challenge_reference: Some(Vec::new()),
            market_families: None,
            link_delay_ms: Some(0),
            link_jitter_ms: Some(0),
        }
    }

    /// These flags over `<data-dir>/config.toml` over the defaults.
    pub fn effective(&self, data_dir: &Path) -> Result<Effective, ConfigError> {
        let path = data_dir.join(CONFIG_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        let file: Options = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.clone(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        let defaults = Options::defaults();
        let mut options = Options::default();
        let mut sources = Vec::new();
        macro_rules! merge {
            ($($f:ident),*) => {
                $(
                    let (value, source) = pick(&self.$f, &file.$f, &defaults.$f);
                    options.$f = value;
                    sources.push((stringify!($f), source));
                )*
            };
        }
        each_setting!(merge);
        Ok(Effective {
            options,
            sources,
            path,
            text,
        })
    }
}

impl Effective {
    /// Where a setting came from, for error messages: the file's line, or the flag.
    fn origin(&self, key: &'static str) -> String {
        match self
            .sources
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, s)| *s)
        {
            Some(Source::File) => {
                let line = self.text.lines().position(|l| {
                    l.trim_start()
                        .strip_prefix(key)
                        .is_some_and(|rest| rest.trim_start().starts_with('='))
                });
                match line {
                    Some(n) => format!("{} line {}", self.path.display(), n + 1),
                    None => self.path.display().to_string(),
                }
            }
            Some(Source::Flag) => format!("--{}", key.trim_end_matches("_s").replace('_', "-")),
            _ => "the default".into(),
        }
    }

    fn bad(&self, key: &'static str, message: impl std::fmt::Display) -> ConfigError {
        ConfigError::Value {
            where_: self.origin(key),
            key,
            message: message.to_string(),
        }
    }

    /// The effective settings as TOML, each with where it came from.
    pub fn to_toml(&self) -> String {
        let o = &self.options;
        let mut out = String::new();
        macro_rules! print {
            ($($f:ident),*) => {
                $(
                    let source = self
                        .sources
                        .iter()
                        .find(|(k, _)| *k == stringify!($f))
                        .map_or(Source::Unset, |(_, s)| *s);
                    match &o.$f {
                        Some(v) => {
                            let value = toml::Value::try_from(v)
                                .map(|v| v.to_string())
                                .unwrap_or_else(|_| format!("{v:?}"));
                            out.push_str(&format!("{} = {value}  # {source}\n", stringify!($f)));
                        }
                        None => out.push_str(&format!("# {} is not set\n", stringify!($f))),
                    }
                )*
            };
        }
        each_setting!(print);
        out
    }

    fn addrs(&self, key: &'static str, list: &[String]) -> Result<Vec<Multiaddr>, ConfigError> {
        list.iter()
            .map(|a| {
                a.parse()
                    .map_err(|e| self.bad(key, format!("'{a}' is not a multiaddr: {e}")))
            })
            .collect()
    }

    /// The daemon's settings, every value checked.
    pub fn daemon_config(&self, data_dir: &Path) -> Result<DaemonConfig, ConfigError> {
        let o = &self.options;
        let d = Options::defaults();
        let host = if o.host.unwrap_or(false) {
            Some(self.host_options(data_dir)?)
        } else {
            None
        };
        let interval = o.receipt_interval_s.unwrap_or(60);
        if !(1..=3600).contains(&interval) {
            return Err(self.bad("receipt_interval_s", "must be between 1 and 3600"));
        }
        let grace = o.ack_grace_s.unwrap_or(30);
        if grace == 0 {
            return Err(self.bad("ack_grace_s", "must be at least 1"));
        }
        let notice = o.spot_notice_s.unwrap_or(30);
        if !(2..=3600).contains(&notice) {
            return Err(self.bad("spot_notice_s", "must be between 2 and 3600"));
        }
        let api = o
            .api
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        if !api.ip().is_loopback() {
            return Err(self.bad("api", format!("{api}: the API listens on loopback only")));
        }
        let metrics_text = o
            .metrics_listen
            .clone()
            .or(d.metrics_listen.clone())
            .unwrap_or_default();
        let metrics = match metrics_text.trim() {
            "off" | "none" => None,
            text => Some(text.parse::<SocketAddr>().map_err(|e| {
                self.bad(
                    "metrics_listen",
                    format!("'{text}': {e} (e.g. 127.0.0.1:9400, or off)"),
                )
            })?),
        };
        let mut challenge_references = std::collections::BTreeMap::new();
        for pair in o.challenge_reference.as_deref().unwrap_or_default() {
            let parsed = pair
                .split_once('=')
                .ok_or_else(|| "no '='".to_string())
                .and_then(|(family, reference)| {
                    let family = family
                        .parse::<gpux_protocol::GpuFamily>()
                        .map_err(|e| e.to_string())?;
                    Ok((
                        family,
                        reference.parse::<crate::plane::challenge::OwnReference>()?,
                    ))
                });
            match parsed {
                Ok((family, reference)) => {
                    challenge_references.insert(family, reference);
                }
                Err(e) => {
                    return Err(self.bad(
                        "challenge_reference",
                        format!("'{pair}': {e} (expected FAMILY=GOPS[,GBS[,SCALE]], e.g. l4=1.5 or a100=2,0.8,0.001)"),
                    ));
                }
            }
        }
        let market_auto = o
            .market_families
            .as_ref()
            .is_some_and(|names| names.len() == 1 && names[0].trim() == "auto");
        let market_families = match &o.market_families {
            None => None,
            // Derived from this node's searches, rents and bids, starting from none.
            Some(_) if market_auto => Some(std::collections::BTreeSet::new()),
            Some(names) => {
                let mut set = std::collections::BTreeSet::new();
                for name in names {
                    let family = name
                        .trim()
                        .parse::<gpux_protocol::GpuFamily>()
                        .map_err(|e| self.bad("market_families", format!("'{name}': {e}")))?;
                    set.insert(family);
                }
                if set.is_empty() {
                    return Err(self.bad(
                        "market_families",
                        "names no family (leave it out to follow every family)",
                    ));
                }
                Some(set)
            }
        };
        let delay = o.link_delay_ms.unwrap_or(0);
        let jitter = o.link_jitter_ms.unwrap_or(0);
        if delay > 10_000 || jitter > delay {
            return Err(self.bad(
                "link_delay_ms",
                format!(
                    "{delay} ms ± {jitter} ms: at most 10000 ms, and the jitter at most the delay"
                ),
            ));
        }
        let link_delay = (delay > 0).then(|| crate::p2p::shaping::LinkDelay {
            base: std::time::Duration::from_millis(delay),
            jitter: std::time::Duration::from_millis(jitter),
        });
        Ok(DaemonConfig {
            link_delay,
            market_families,
            market_auto,
            challenge_references,
            data_dir: data_dir.to_path_buf(),
            listen: self.addrs("listen", o.listen.as_deref().unwrap_or_default())?,
            bootstrap: self.addrs("bootstrap", o.bootstrap.as_deref().unwrap_or_default())?,
            api,
            metrics,
            mdns: o.mdns.unwrap_or(false),
            host,
            ledger: self.addrs(
                "ledger",
                &o.ledger
                    .as_deref()
                    .map(|l| {
                        l.split(',')
                            .map(|a| a.trim().to_string())
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default(),
            )?,
            ledger_cluster: match &o.ledger_cluster {
                Some(members) if o.serve_ledger == Some(true) => {
                    Some(crate::ledger::cluster::ClusterConfig {
                        members: self.addrs("ledger_cluster", members)?,
                        bootstrap: o.ledger_bootstrap.unwrap_or(false),
                    })
                }
                Some(_) => {
                    return Err(self.bad(
                        "ledger_cluster",
                        "is for a node that serves the ledger (--serve-ledger)",
                    ));
                }
                None => None,
            },
            serve_ledger: match (o.serve_ledger.unwrap_or(false), &o.ledger_faucet) {
                (false, Some(_)) => {
                    return Err(self.bad(
                        "ledger_faucet",
                        "is for a node that serves the ledger (--serve-ledger)",
                    ));
                }
                (false, None) => None,
                (true, faucet) => Some(gpux_market::LedgerConfig {
                    release_grace_ms: o.ledger_release_grace_s.unwrap_or(600).saturating_mul(1000),
                    faucet: match faucet {
                        None => None,
                        Some(text) => Some(
                            text.trim()
                                .parse::<gpux_protocol::PeerId>()
                                .map_err(|e| self.bad("ledger_faucet", format!("{text:?}: {e}")))?
                                .public_key(),
                        ),
                    },
                }),
            },
            timing: Timing {
                receipt_interval_ms: interval * 1000,
                ack_grace_ms: grace * 1000,
                spot_notice_ms: notice * 1000,
            },
        })
    }
}

/// The daemon's settings from these flags, the data dir's file and the defaults.
pub fn resolve(data_dir: &Path, flags: &Options) -> Result<DaemonConfig, ConfigError> {
    flags.effective(data_dir)?.daemon_config(data_dir)
}

mod host;

#[cfg(test)]
mod tests;
