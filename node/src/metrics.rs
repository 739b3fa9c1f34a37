//! `/metrics`: every node's Prometheus endpoint, on a listen address of its own (loopback by
//! default, `--metrics-listen`), apart from the token-protected API.
//!
//! A host exports each GPU it shares under the names and labels of NVIDIA's DCGM exporter,
//! which GPU dashboards already read (`DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_DEV_FB_USED`, ...;
//! labels `gpu`, `UUID`, `modelName`, `Hostname`, and `lease` while a lease holds it), read
//! through NVML at each scrape. They are gauges, as DCGM's are, so no `_total` is added to
//! the energy counter's name. Every node exports gpux's own series under `gpux_`, with
//! labels from small fixed sets only (families from the family table, lease states and
//! kinds, gossip verdicts, ledger operations). docs/metrics.md lists them all.
//!
//! The endpoint answers Prometheus' text format (0.0.4), converted from the OpenMetrics text
//! prometheus-client writes, so that `promtool` and every scraper read it alike.
//!
//! What changes at every scrape is read then: the daemon's loop answers a `Snapshot`
//! and NVML is read on a blocking thread. What accumulates (histograms of rent latencies,
//! the ledger's operations) lives in a `Recorder` shared with the loop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};

/// A label set: names and values (label names are DCGM's own, some not snake case).
type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// What accumulates between scrapes. Cheap to clone (every metric is shared).
#[derive(Clone, Debug)]
pub(crate) struct Recorder {
    /// From `gpux rent` being asked to its container running, seconds.
    pub(crate) rent_to_running: Histogram,
    /// From a rent's search to the offer it took being accepted, seconds.
    pub(crate) match_latency: Histogram,
    /// The ledger's operations served here, by operation and outcome.
    pub(crate) ledger_ops: Family<Labels, Counter>,
    /// Receipts this host signed, and what became of them.
    pub(crate) receipts: Family<Labels, Counter>,
    /// libp2p's bandwidth metrics (`libp2p_bandwidth_bytes_total`), from the swarm.
    pub(crate) libp2p: Option<Arc<Registry>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            // 50 ms to about 100 s.
            rent_to_running: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
            match_latency: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            ledger_ops: Family::default(),
            receipts: Family::default(),
            libp2p: None,
        }
    }
}

impl Recorder {
    /// Counts one ledger operation served: `op` (`lock`, `redeem`, `release`, `query`,
    /// `mint`) and its `outcome` (`applied`, `unchanged`, `refused`).
    pub(crate) fn ledger_op(&self, op: &'static str, outcome: &'static str) {
        self.ledger_ops
            .get_or_create(&vec![
                ("op", op.to_string()),
                ("outcome", outcome.to_string()),
            ])
            .inc();
    }

    /// Counts a receipt event of this host: `sent`, `acked` or `disputed`.
    pub(crate) fn receipt(&self, event: &'static str) {
        self.receipts
            .get_or_create(&vec![("event", event.to_string())])
            .inc();
    }
}

/// This host's GPUs, for the DCGM series.
pub(crate) struct HostGpus {
    /// The NVML library the host meters with.
    pub(crate) probe: Arc<gpux_attestation::Probe>,
    /// The `Hostname` label.
    pub(crate) hostname: String,
    /// The lease holding each GPU now, by UUID (`GPU-...`).
    pub(crate) leases: BTreeMap<String, String>,
}

/// What the daemon's loop reports at a scrape.
#[derive(Default)]
pub(crate) struct Snapshot {
    /// Peers connected.
    pub(crate) peers: usize,
    /// Offers in the book, by family key.
    pub(crate) offers: BTreeMap<String, usize>,
    /// Gossip messages judged since start, by verdict.
    pub(crate) gossip: Vec<(&'static str, u64)>,
    /// Leases on record, by (role, state, kind).
    pub(crate) leases: BTreeMap<(&'static str, String, String), usize>,
    /// Credits paid to this host for its leases on record (redeemed), micro-credits.
    pub(crate) earned_micro: u64,
    /// Credits this renter agreed to pay for its leases on record, micro-credits.
    pub(crate) spent_micro: u64,
    /// The host's GPUs, when this node shares some.
    pub(crate) gpus: Option<HostGpus>,
    /// A replicated ledger's member: the cluster as it sees it.
    pub(crate) cluster: Option<gpux_api::ClusterView>,
}

/// The file in the data directory that names where `/metrics` listens.
pub const ADDR_FILE: &str = "metrics.addr";

/// Records where `/metrics` listens (`<data-dir>/metrics.addr`, for scrape configs and the
/// testnet).
pub(crate) fn write_addr(data_dir: &std::path::Path, addr: SocketAddr) -> std::io::Result<()> {
    crate::data_dir::write_private(&data_dir.join(ADDR_FILE), addr.to_string().as_bytes())
}

/// Where the node of `data_dir` serves `/metrics`, if it does.
pub fn read_addr(data_dir: &std::path::Path) -> Option<SocketAddr> {
    std::fs::read_to_string(data_dir.join(ADDR_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The operation a ledger frame asked for and how it came out, as the metric's labels.
pub(crate) fn ledger_op_of(
    frame: &[u8],
    response: &gpux_protocol::ledger_wire::LedgerResponse,
) -> (&'static str, &'static str) {
    use gpux_protocol::ledger_wire::{LedgerRequest, LedgerResponse};
    let op = match gpux_protocol::ledger_wire::decode::<LedgerRequest>(frame) {
        Ok(LedgerRequest::Submit(envelope)) => match gpux_protocol::peek_kind(&envelope) {
            Ok(gpux_protocol::MessageKind::EscrowLock) => "lock",
            Ok(gpux_protocol::MessageKind::Redeem) => "redeem",
            Ok(gpux_protocol::MessageKind::Release) => "release",
            _ => "other",
        },
        Ok(_) => "query",
        Err(_) => "malformed",
    };
    let outcome = match response {
        LedgerResponse::Record(_) | LedgerResponse::Cosigned(_) => "applied",
        LedgerResponse::Unchanged(_) => "unchanged",
        LedgerResponse::Refused { .. } => "refused",
        _ => "answered",
    };
    (op, outcome)
}

/// This machine's name (the `Hostname` label), as the kernel has it.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Asks the loop for a snapshot.
pub(crate) type SnapshotRequest = oneshot::Sender<Snapshot>;

#[derive(Clone)]
struct AppState {
    snapshots: mpsc::Sender<SnapshotRequest>,
    recorder: Recorder,
}

/// Binds `addr` and serves `/metrics` until `shutdown` resolves; returns the bound address.
pub(crate) async fn serve(
    addr: SocketAddr,
    snapshots: mpsc::Sender<SnapshotRequest>,
    recorder: Recorder,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(AppState {
            snapshots,
            recorder,
        });
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!("the metrics server stopped: {e}");
        }
    });
    Ok((bound, task))
}

/// A host's GPUs with what NVML read of them.
pub(crate) type Readings = (HostGpus, Vec<gpux_attestation::GpuTelemetry>);

/// A snapshot from the loop and, on a host, its GPUs read through NVML now (off the
/// runtime's threads: NVML calls block). `None`: the node is shutting down.
pub(crate) async fn take(
    snapshots: &mpsc::Sender<SnapshotRequest>,
) -> Option<(Snapshot, Option<Readings>)> {
    let (tx, rx) = oneshot::channel();
    snapshots.send(tx).await.ok()?;
    let mut snapshot = rx.await.ok()?;
    let telemetry = match snapshot.gpus.take() {
        Some(gpus) => {
            let probe = gpus.probe.clone();
            match tokio::task::spawn_blocking(move || probe.telemetry()).await {
                Ok(Ok(t)) => Some((gpus, t)),
                Ok(Err(e)) => {
                    tracing::warn!("reading the GPUs: {e}");
                    None
                }
                Err(_) => None,
            }
        }
        None => None,
    };
    Some((snapshot, telemetry))
}

async fn scrape(State(app): State<AppState>) -> Response {
    let Some((snapshot, telemetry)) = take(&app.snapshots).await else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the node is shutting down\n",
        )
            .into_response();
    };
    match render(&snapshot, telemetry.as_ref(), &app.recorder) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            prometheus_text(&text),
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

/// The DCGM series, by name: (help, whether it is a counter, value of a reading).
type Reading = fn(&gpux_attestation::GpuTelemetry) -> Option<f64>;
const DCGM: [(&str, &str, bool, Reading); 13] = [
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %)",
        false,
        |t| t.util_percent.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB)",
        false,
        |t| (!t.lost).then(|| t.memory_used_bytes as f64 / 1_048_576.0),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB)",
        false,
        |t| (!t.lost).then(|| t.memory_free_bytes as f64 / 1_048_576.0),
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        "GPU temperature (in C)",
        false,
        |t| t.temperature_c.map(f64::from),
    ),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)", false, |t| {
        t.power_mw.map(|mw| f64::from(mw) / 1000.0)
    }),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ)",
        true,
        |t| t.energy_mj.map(|mj| mj as f64),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus (in bytes per second)",
        false,
        |t| t.pcie_tx_kbps.map(|k| f64::from(k) * 1024.0),
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus (in bytes per second)",
        false,
        |t| t.pcie_rx_kbps.map(|k| f64::from(k) * 1024.0),
    ),
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz)",
        false,
        |t| t.sm_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz)",
        false,
        |t| t.memory_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered",
        false,
        |t| Some(t.last_xid as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors",
        true,
        |t| t.ecc_corrected.map(|n| n as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors",
        true,
        |t| t.ecc_uncorrected.map(|n| n as f64),
    ),
];

/// The names of the DCGM series a host exports, as their samples are named (a counter's
/// with Prometheus' `_total`), for the dashboard's and the tests' checks.
pub fn dcgm_names() -> impl Iterator<Item = String> {
    DCGM.iter().map(|(name, _, counter, _)| {
        if *counter {
            format!("{name}_total")
        } else {
            (*name).to_string()
        }
    })
}

/// The OpenMetrics text prometheus-client writes, as Prometheus' own text format (0.0.4),
/// which every scraper and `promtool` read: a counter's family is named with its `_total`
/// there, and there is no `# EOF`.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        // Prometheus' text format has neither the end marker nor units.
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{tag}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

fn render(
    snapshot: &Snapshot,
    gpus: Option<&Readings>,
    recorder: &Recorder,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    if let Some((host, readings)) = gpus {
        for (name, help, counter, read) in DCGM {
            let gauges = Family::<Labels, FloatGauge>::default();
            let counters = Family::<Labels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
            for t in readings {
                let Some(value) = read(t) else { continue };
                // dcgm-exporter's labels (`device` is the driver's device file).
                let labels = vec![
                    ("gpu", t.index.to_string()),
                    ("UUID", t.uuid.clone()),
                    ("device", format!("nvidia{}", t.index)),
                    ("modelName", t.name.clone()),
                    ("Hostname", host.hostname.clone()),
                    (
                        "lease",
                        host.leases.get(&t.uuid).cloned().unwrap_or_default(),
                    ),
                ];
                if counter {
                    counters.get_or_create(&labels).inc_by(value);
                } else {
                    gauges.get_or_create(&labels).set(value);
                }
            }
            if counter {
                registry.register(name, help, counters);
            } else {
                registry.register(name, help, gauges);
            }
        }
    }
    let peers = Gauge::<i64>::default();
    peers.set(i64::try_from(snapshot.peers).unwrap_or(i64::MAX));
    registry.register("gpux_peers", "Peers connected", peers);
    let offers = Family::<Labels, Gauge>::default();
    for (family, n) in &snapshot.offers {
        offers
            .get_or_create(&vec![("family", family.clone())])
            .set(i64::try_from(*n).unwrap_or(i64::MAX));
    }
    registry.register(
        "gpux_book_offers",
        "Offers in this node's book, by GPU family",
        offers,
    );
    let gossip = Family::<Labels, Counter>::default();
    for (verdict, n) in &snapshot.gossip {
        gossip
            .get_or_create(&vec![("verdict", verdict.to_string())])
            .inc_by(*n);
    }
    registry.register(
        "gpux_gossip_messages",
        "Gossip messages judged since the node started, by verdict",
        gossip,
    );
    let leases = Family::<Labels, Gauge>::default();
    for ((role, state, kind), n) in &snapshot.leases {
        leases
            .get_or_create(&vec![
                ("role", role.to_string()),
                ("state", state.clone()),
                ("kind", kind.clone()),
            ])
            .set(i64::try_from(*n).unwrap_or(i64::MAX));
    }
    registry.register(
        "gpux_leases",
        "Leases on record, by this node's role, their state and kind",
        leases,
    );
    let credits = Family::<Labels, FloatGauge>::default();
    for (way, micro) in [
        ("earned", snapshot.earned_micro),
        ("spent", snapshot.spent_micro),
    ] {
        credits
            .get_or_create(&vec![("way", way.to_string())])
            .set(micro as f64 / 1e6);
    }
    registry.register(
        "gpux_credits",
        "Credits earned as a host (redeemed) and spent as a renter (acknowledged), over the leases on record",
        credits,
    );
    registry.register(
        "gpux_receipts",
        "Usage receipts this host signed, and the renters' answers",
        recorder.receipts.clone(),
    );
    registry.register(
        "gpux_rent_to_running_seconds",
        "From a rent asked to its container running",
        recorder.rent_to_running.clone(),
    );
    registry.register(
        "gpux_match_seconds",
        "From a rent's search to its offer's acceptance",
        recorder.match_latency.clone(),
    );
    if let Some(c) = &snapshot.cluster {
        let gauge = |value: u64| {
            let g = Gauge::<i64>::default();
            g.set(i64::try_from(value).unwrap_or(i64::MAX));
            g
        };
        registry.register(
            "gpux_ledger_cluster_leader",
            "1 when this member leads the replicated ledger",
            gauge(u64::from(c.leader)),
        );
        registry.register(
            "gpux_ledger_cluster_term",
            "The replicated ledger's raft term, as this member knows it",
            gauge(c.term),
        );
        registry.register(
            "gpux_ledger_cluster_voters",
            "Voting members of the replicated ledger",
            gauge(c.voters.len() as u64),
        );
        registry.register(
            "gpux_ledger_cluster_applied_index",
            "The last raft log index applied to this member's ledger",
            gauge(c.applied),
        );
    }
    registry.register(
        "gpux_ledger_operations",
        "Ledger operations served by this node, by operation and outcome",
        recorder.ledger_ops.clone(),
    );
    let mut text = String::new();
    encode(&mut text, &registry)?;
    // libp2p's own: the bytes through the transport, by direction.
    if let Some(libp2p) = &recorder.libp2p {
        encode(&mut text, libp2p)?;
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpux_series_are_rendered_with_bounded_labels() {
        let recorder = Recorder::default();
        recorder.receipt("sent");
        recorder.receipt("sent");
        recorder.ledger_op("lock", "applied");
        recorder.rent_to_running.observe(1.5);
        let mut snapshot = Snapshot {
            peers: 3,
            gossip: vec![("accepted", 7), ("rejected", 1), ("ignored", 2)],
            earned_micro: 2_500_000,
            ..Snapshot::default()
        };
        snapshot.offers.insert("h100".into(), 4);
        snapshot
            .leases
            .insert(("host", "running".into(), "spot".into()), 2);
        let text = render(&snapshot, None, &recorder).unwrap();
        for line in [
            "gpux_peers 3",
            "gpux_book_offers{family=\"h100\"} 4",
            "gpux_gossip_messages_total{verdict=\"accepted\"} 7",
            "gpux_leases{role=\"host\",state=\"running\",kind=\"spot\"} 2",
            "gpux_credits{way=\"earned\"} 2.5",
            "gpux_receipts_total{event=\"sent\"} 2",
            "gpux_ledger_operations_total{op=\"lock\",outcome=\"applied\"} 1",
            "gpux_rent_to_running_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        // No GPU series without GPUs.
        assert!(!text.contains("DCGM_"));
        // In Prometheus' text format a counter's family carries its `_total`.
        let plain = prometheus_text(&text);
        assert!(plain.contains("# TYPE gpux_receipts_total counter\n"));
        assert!(plain.contains("# HELP gpux_receipts_total "));
        assert!(plain.contains("# TYPE gpux_peers gauge\n"));
        assert!(!plain.contains("# EOF"));
    }
}
