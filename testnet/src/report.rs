//! What `gpux testnet up` reports: the run's figures and each lease, written as JSON.

use crate::{orders, workload};

/// The run's outcome, written as JSON.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// Processes started.
    pub nodes: usize,
    /// Each node's Prometheus `/metrics` address, by node name (`host-0`: `127.0.0.1:PORT`).
    pub scrape_targets: std::collections::BTreeMap<String, String>,
    /// Distinct offers live at the end (all hosts' own offers).
    pub offers_published: usize,
    /// The fewest of those any renter's book holds.
    pub offers_seen_min: usize,
    /// Offers published before anyone rented (one per host, one more for an A100 host's
    /// MIG slices).
    pub offers_before_renting: usize,
    /// The fewest of those any renter's book held before renting began.
    pub offers_seen_min_before_renting: usize,
    /// Median delay from an offer's signing to its arrival at a renter, ms.
    pub propagation_ms_p50: u64,
    /// 95th percentile of that delay, ms.
    pub propagation_ms_p95: u64,
    /// Arrivals the percentiles are computed from.
    pub propagation_samples: usize,
    /// Leases agreed (accepted by a host).
    pub leases_agreed: usize,
    /// GPUs booked for two overlapping leases (must be 0).
    pub double_allocations: usize,
    /// Gossip messages rejected by validation, over all nodes.
    pub rejected_messages: u64,
    /// Gossip messages ignored because their relaying peer was over its budget, over all
    /// nodes (an honest testnet stays at 0).
    pub over_budget_messages: u64,
    /// Median resident memory of the node processes once the offers had spread, KiB.
    pub node_rss_kb_median: u64,
    /// Largest resident memory of a node process at that time, KiB.
    pub node_rss_kb_max: u64,
    /// Mean CPU of every node process (ledger members, hosts, renters) while idle, percent
    /// of one core, over the same window as `host_cpu_pct_idle`.
    pub node_cpu_pct_idle: f64,
    /// From the last node's start until every renter held every offer of the families it
    /// follows, ms.
    pub offers_spread_ms: u64,
    /// Ledger operations (log entries applied by the replicated ledger) per second, from the
    /// first rent until every lease settled (0 with a single ledger node).
    pub ledger_ops_per_s: f64,
    /// The workload image every host lists and every lease runs (built locally).
    pub image: String,
    /// Containers started for leases, over all hosts.
    pub containers_started: usize,
    /// Lease containers still present after the run (must be 0).
    pub containers_left: usize,
    /// Usage receipts the renters acknowledged.
    pub receipts_acked: u64,
    /// Leases whose escrow was settled (redeemed and released).
    pub leases_settled: usize,
    /// Credits held by all parties after the faucet, before any lease, micro-credits.
    pub credits_before: u64,
    /// Credits held by all parties at the end, micro-credits (must equal `credits_before`).
    pub credits_after: u64,
    /// Median time from a renter's `rent` call to its container running, ms.
    pub rent_to_running_ms_p50: u64,
    /// 95th percentile of that time, ms.
    pub rent_to_running_ms_p95: u64,
    /// Median time Docker itself takes to create and start the same container, measured in
    /// the same run (the overhead of gpux is the difference).
    pub docker_start_ms_p50: u64,
    /// Hosts' CPU use while idle (market up, no lease), % of one core, mean over hosts.
    pub host_cpu_pct_idle: f64,
    /// Hosts' CPU use while leases ran, % of one core, mean over hosts.
    pub host_cpu_pct_leasing: f64,
    /// The metering overhead of one running lease on its host: the CPU added per lease
    /// running, % of one core.
    pub metering_cpu_pct_per_lease: f64,
    /// The Docker daemon's CPU while idle and while leases ran, % of one core (it answers
    /// the hosts' inspect, stats and log calls; the workloads themselves are not counted).
    pub dockerd_cpu_pct_idle: f64,
    /// See `dockerd_cpu_pct_idle`.
    pub dockerd_cpu_pct_leasing: f64,
    /// The Docker daemon's CPU added per running lease, % of one core.
    pub dockerd_cpu_pct_per_lease: f64,
    /// The workload-plane round: a renter's own image staged, its files in and out, and
    /// what was left (flattened into the report).
    #[serde(flatten)]
    pub plane: workload::PlaneFigures,
    /// The access round: an image pulled from a registry, OpenSSH into its lease
    /// (flattened into the report).
    #[serde(flatten)]
    pub access: crate::access::AccessFigures,
    /// The order-kinds round: a spot lease preempted (flattened into the report).
    #[serde(flatten)]
    pub orders: orders::OrderFigures,
    /// The hosting round: a live price change, a restart and upgrade mid-lease, a GPU
    /// fault (none when the run had no public host to spare or was stopped first).
    pub hosting: Option<crate::business::HostingFigures>,
    /// Every lease, as its host ran and settled it.
    pub leases: Vec<LeaseReport>,
    /// Workspaces the hosts still kept (within their leases' retention) when the run
    /// stopped them; the run erases them.
    pub workspaces_retained_at_stop: usize,
    /// Ledger members (1: a ledger node; 3 or 5: a replicated ledger).
    pub ledger_members: usize,
    /// The replicated ledger's leader killed a third into the run, by name.
    pub ledger_leader_killed: Option<String>,
    /// From that kill to the first write the cluster applied again, ms.
    pub ledger_failover_ms: Option<u64>,
    /// Leases that started after the leader's loss (in the renting rounds; the order rounds
    /// after them run on the new leader too).
    pub leases_after_leader_loss: usize,
    /// Each member's last applied log index at the end (equal: they agree).
    pub ledger_applied: Vec<u64>,
    /// The partitions (`--partition`): what was cut, when, and how it came out.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<crate::partitions::PartitionReport>,
    /// Hosts behind a NAT of their own (`--isolated`), each rented and used on purpose.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nat: Vec<crate::nat::NatHost>,
    /// The isolated network (`--isolated`): addresses, shaping, measured links.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolated: Option<Isolation>,
    /// Anything that went wrong.
    pub errors: Vec<String>,
    /// Seconds the whole run took.
    pub elapsed_s: f64,
}

/// An isolated run's network, as the report gives it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Isolation {
    /// Each node's own address, by name (a private one behind NAT).
    pub addresses: std::collections::BTreeMap<String, String>,
    /// The nodes behind a NAT of their own, by name: the NAT's address.
    pub behind_nat: std::collections::BTreeMap<String, String>,
    /// The run's subnet.
    pub subnet: String,
    /// What shapes links on this machine (the preflight).
    pub preflight: String,
    /// Delay added to each direction of each link, ms (± `jitter_ms`).
    pub delay_ms: u64,
    /// See `delay_ms`.
    pub jitter_ms: u64,
    /// Packets dropped on arrival, percent.
    pub loss_pct: f64,
    /// Each node's sending rate, when limited.
    pub rate: Option<String>,
    /// Round trips the nodes' libp2p pings measured over their links at the end of the
    /// run, ms: median and 95th percentile, over every connected pair (both ways).
    pub link_rtt_ms_p50: u64,
    /// See `link_rtt_ms_p50`.
    pub link_rtt_ms_p95: u64,
    /// Half the median round trip: the measured one-way delay of a link, ms.
    pub link_delay_ms_measured: u64,
    /// Ping samples behind those figures.
    pub link_rtt_samples: usize,
    /// Namespaces, links and rules of the run still present after it (must be empty).
    pub network_left: Vec<String>,
}

/// One lease in the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LeaseReport {
    /// Lease id.
    pub lease: String,
    /// Agreed price, micro-credits per GPU-hour.
    pub price_per_gpu_hour: u64,
    /// GPUs leased.
    pub gpus: u64,
    /// The container's runtime from Docker's own start and finish times, seconds.
    pub runtime_s: f64,
    /// What the ledger moved to the host, micro-credits.
    pub charged: u64,
    /// price × gpus × max(60, runtime_s) / 3600 (spot: runtime_s, no minimum), plus the
    /// kept workspace's fixed sum, micro-credits.
    pub expected: f64,
    /// The kept workspace's fixed sum (in `expected`), micro-credits.
    pub retention_charge: u64,
    /// `on-demand`, `spot` or `reserved`.
    pub kind: String,
    /// Why it ended.
    pub end_reason: String,
    /// The workload's exit code.
    pub exit_code: Option<i64>,
    /// Whether the escrow is settled.
    pub settled: bool,
    /// How the renter was connected to the host at the end of the run: `direct`,
    /// `relayed` or `punched` (empty when no longer connected).
    pub connection: String,
    /// It ran while a partition held, over a connection that was not direct: a relay the
    /// partition cut may have carried it, so it is held to the bound on unpaid work (one
    /// receipt interval plus the grace, plus 2 s), not to the exact charge.
    pub indirect_across_cut: bool,
}
