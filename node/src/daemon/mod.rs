//! `gpux node run`: the daemon, a thin shell over the pure lease machines.
//!
//! One task owns the node's state and runs one loop over everything that arrives: network
//! events (routed by protocol and message kind, `router.rs`), API commands, and the
//! completions of effects (a ledger verdict, a container started, a receipt answered, a
//! timer). Its components are separate: the market view (`market.rs`), the host role
//! (`host/`) and the renter role (`renter.rs`); each carries out its machines' effects, and
//! nothing else touches the executor, the swarm client, the ledger client or the store.
//! The loop never awaits the network: every request, answer and publication runs in a task
//! of its own and reports back as an event, so no two tasks can wait on each other.

pub mod api;
mod bids;
mod command;
mod console;
mod group;
mod host;
mod http;
mod market;
mod mint;
mod proof;
mod reach;
mod rent;
mod renter;
mod resume;
mod router;
mod shutdown;
mod spend;
mod views;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use gpux_lease::{HostInput, RenterInput, Timing};
use gpux_protocol::{ContentId, ImageDigest, Keypair, MicroCredits, Timestamp};
use libp2p::Multiaddr;
use tokio::sync::mpsc;

use crate::attest::now;
use crate::ledger::{LedgerClient, LedgerService};
use crate::p2p::{self, Client, NetConfig};
use crate::store::{NodeState, SledStore};

pub(crate) use command::ApiCommand;

/// The least time between publications triggered by new subscribers, ms.
const SUBSCRIBE_PUBLISH_GAP_MS: u64 = 3000;
/// Capacity of the channel of completions into the loop.
const EVENT_CAPACITY: usize = 1024;
/// Capacity of the API's command channel.
const API_CAPACITY: usize = 64;
/// How long a stopping host waits for its leases to settle.
const SHUTDOWN_SETTLE: Duration = Duration::from_secs(20);

/// What a host offers, and where its GPUs come from.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// The NVML library (None: the driver's).
    pub nvml_lib: Option<PathBuf>,
    /// Price per GPU-hour.
    pub price: MicroCredits,
    /// Spot floor per GPU-hour (None: no spot leases).
    pub spot_floor: Option<MicroCredits>,
    /// Region token.
    pub region: String,
    /// Images the host has, by digest (empty: every image on the host).
    pub images: Vec<ImageDigest>,
    /// Their tags, as Docker has them (read when the host starts).
    pub image_tags: std::collections::BTreeMap<ImageDigest, Vec<String>>,
    /// Shortest lease accepted, seconds (billing has a 60 s minimum regardless).
    pub min_duration_s: u32,
    /// Longest lease accepted, seconds.
    pub max_duration_s: u32,
    /// How long each published offer lives, seconds.
    pub offer_ttl_s: u64,
    /// How often offers are re-published, seconds.
    pub republish_s: u64,
    /// The GPUs are simulated (the fake NVML driver): containers get no GPU device.
    pub fake_gpus: bool,
    /// The disk all open leases' workspaces may take together, bytes (0: no workspaces).
    pub disk_quota_bytes: u64,
    /// Where the workspaces are (`<data-dir>/workspaces`).
    pub workspace_root: PathBuf,
    /// The longest a workspace is kept after its lease, seconds (renters ask for less or
    /// more with `--retain`; 10 minutes when they do not say).
    pub max_retain_s: u64,
    /// What keeping a workspace after its workload costs per GiB-hour (zero: free).
    pub disk_price: MicroCredits,
    /// The largest image a renter may stage, bytes (0: renters run only `images`).
    pub max_image_bytes: u64,
    /// The disk renters' staged images may take together, bytes.
    pub stage_quota_bytes: u64,
    /// What cancelling a reserved window before its start costs (published in the offers;
    /// empty: free).
    pub cancel_fees: gpux_protocol::CancelFees,
    /// Where staged layers arrive (`<data-dir>/staging`), and the record of staged images.
    pub staging_root: PathBuf,
    /// Where each spot lease's `/run/gpux` is written (`<data-dir>/run/<lease>`).
    pub run_root: PathBuf,
    /// CPU threads given to leases (None: every thread the machine has).
    pub cpus: Option<u32>,
    /// Memory given to leases, bytes (None: the machine's, less a tenth kept for the host).
    pub memory_bytes: Option<u64>,
    /// The machine as given to leases (read when the host starts, measured as it runs).
    pub machine: crate::machine::MachineFacts,
    /// What the host pulls from registries (its cached images are added as offers are
    /// signed).
    pub pulls: gpux_protocol::Pulls,
    /// The disk images pulled without credentials may take, kept for later renters.
    pub pull_cache_bytes: u64,
}

/// The daemon's settings.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The data directory (key, database, API token).
    pub data_dir: PathBuf,
    /// libp2p listen addresses.
    pub listen: Vec<Multiaddr>,
    /// Bootstrap peers.
    pub bootstrap: Vec<Multiaddr>,
    /// The API address (loopback only; port 0 picks one).
    pub api: SocketAddr,
    /// Where `/metrics` listens (None: nowhere).
    pub metrics: Option<SocketAddr>,
    /// mDNS discovery.
    pub mdns: bool,
    /// Set for a host.
    pub host: Option<HostOptions>,
    /// The ledger this node settles with (`.../p2p/<its peer id>`): its node, or the members
    /// of a replicated ledger (empty: none).
    pub ledger: Vec<Multiaddr>,
    /// The replicated ledger this node serves as a member of (with `serve_ledger`).
    pub ledger_cluster: Option<crate::ledger::cluster::ClusterConfig>,
    /// Set to serve the ledger (`/gpux/ledger/2`) from this node.
    pub serve_ledger: Option<gpux_market::LedgerConfig>,
    /// Receipt interval and acknowledgement grace (a host announces them in its acceptances).
    pub timing: Timing,
    /// Renter: challenge references by family, in place of the spec table's (fake GPUs).
    pub challenge_references:
        std::collections::BTreeMap<gpux_protocol::GpuFamily, crate::plane::challenge::OwnReference>,
    /// The families whose offers this node follows (None: every family).
    pub market_families: Option<std::collections::BTreeSet<gpux_protocol::GpuFamily>>,
    /// Follow the families this node's searches, rents, groups and bids name, as they come
    /// (`--market-families auto`), from `market_families`.
    pub market_auto: bool,
    /// Testnet only: a delay added to everything this node sends.
    pub link_delay: Option<crate::p2p::shaping::LinkDelay>,
}

/// What comes back into the loop from the effects it started. (Inputs are large, and
/// events are many and short-lived: not worth a box each.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Event {
    /// An input for one of the host's leases.
    Host { lease: ContentId, input: HostInput },
    /// An input for one of the renter's leases.
    Renter {
        lease: ContentId,
        input: RenterInput,
    },
    /// A step of a rent in progress.
    Rent(rent::RentEvent),
    /// A step of a preempted spot lease's resume.
    Resume(resume::ResumeEvent),
    /// A step of a group order.
    Group(group::GroupEvent),
    /// A standing bid's fill came out.
    Bid(bids::BidEvent),
    /// The ledger's history of a host (who paid it, and how its leases ended), fetched for
    /// its reliability and interruption rate.
    History {
        host: gpux_protocol::PublicKey,
        history: gpux_protocol::ledger_wire::HostHistory,
        ends: gpux_protocol::ledger_wire::HostEnds,
    },
    /// Challenge `lease` again about every `every` while it runs.
    Rechallenge { lease: ContentId, every: Duration },
    /// The renter's performance challenge of one of its leases passed (to publish once the
    /// lease has paid the host).
    ChallengePassed {
        lease: ContentId,
        measured: Box<crate::plane::challenge::Measured>,
    },
    /// The ledger's records of a passed challenge's escrow (its lock's, its newest
    /// redemption's).
    Proof {
        lease: ContentId,
        proof: Result<(Vec<u8>, Option<Vec<u8>>), String>,
    },
    /// A rent that counted against the spend cap while it was matched is over.
    SpendDone(u64),
    /// A write that records money or a lease failed (the disk is full or failing): the
    /// node stops with this error rather than carry on with records it cannot keep.
    StoreFailed(String),
    /// An API command to answer again a little later (a search of families just followed,
    /// once their hosts have republished), and until when it may wait for a first offer.
    Deferred(Box<ApiCommand>, std::time::Instant),
    /// NVML reported Xid `xid` on the host's GPU `uuid` at `at`.
    GpuFault {
        uuid: String,
        xid: u64,
        at: gpux_protocol::Timestamp,
    },
    /// A renter's held lease is committed, stopped, or failed its challenge (a rent, a
    /// group or a resume decided).
    Act {
        lease: ContentId,
        act: LeaseAct,
        reply: tokio::sync::oneshot::Sender<Result<(), gpux_api::ApiError>>,
    },
}

/// What is done to a renter's held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseAct {
    /// Its work starts.
    Commit,
    /// It ends unpaid.
    Stop,
    /// Its performance challenge failed: it ends unpaid, and the host is told why.
    FailChallenge,
}

/// Asks the loop to do `act` to `lease` (from a task).
pub(crate) async fn act(
    events: &mpsc::Sender<Event>,
    lease: ContentId,
    act: LeaseAct,
) -> Result<(), gpux_api::ApiError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    report(events, Event::Act { lease, act, reply }).await;
    answer.await.map_err(|_| {
        gpux_api::ApiError::new(
            gpux_api::ErrorCode::Unavailable,
            "the node is shutting down",
        )
    })?
}

/// Sends `event` into the loop from a task (the loop may be gone at shutdown: fine).
pub(crate) async fn report(tx: &mpsc::Sender<Event>, event: Event) {
    let _ = tx.send(event).await;
}

/// Reports a failed write of a money or lease record ([`Event::StoreFailed`]): the node
/// stops with it. From outside the loop, so from anywhere.
pub(crate) fn store_failed(tx: &mpsc::Sender<Event>, why: String) {
    tracing::error!("{why}: the node stops");
    let tx = tx.clone();
    tokio::spawn(async move { report(&tx, Event::StoreFailed(why)).await });
}

/// Reports `event` at `at` (a timer).
pub(crate) fn schedule(tx: &mpsc::Sender<Event>, at: Timestamp, event: Event) {
    let tx = tx.clone();
    let wait = Duration::from_millis(at.0.saturating_sub(now().0));
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        report(&tx, event).await;
    });
}

/// Everything the loop owns.
pub(crate) struct Daemon {
    key: Keypair,
    net: Client,
    state: NodeState<SledStore>,
    events_tx: mpsc::Sender<Event>,
    started: Timestamp,
    market: market::MarketView,
    host: Option<host::HostRole>,
    renter: renter::RenterRole,
    ledger: Option<LedgerClient>,
    ledger_service: Option<LedgerService<SledStore>>,
    /// This node's membership of a replicated ledger (in place of `ledger_service`).
    ledger_cluster: Option<std::sync::Arc<crate::ledger::cluster::LedgerCluster<SledStore>>>,
    /// What this node has learned about reaching hosts (its rents skip those backed off).
    reach: reach::Reach,
    /// Peers connected now.
    peers: std::collections::BTreeSet<libp2p::PeerId>,
    /// The last ping round trip to each connected peer, ms.
    rtts: std::collections::BTreeMap<libp2p::PeerId, u64>,
    /// How each connected peer is connected (the best of its connections).
    links: std::collections::BTreeMap<libp2p::PeerId, p2p::Link>,
    /// Whether others can dial this node, and the relay addresses it is reached through.
    reachability: (p2p::Reachability, Vec<String>),
    /// The data directory (renters' images are saved under `outbox/` for staging).
    data_dir: std::path::PathBuf,
    /// Challenge references by family, in place of the spec table's (fake GPUs).
    challenge_references:
        std::collections::BTreeMap<gpux_protocol::GpuFamily, crate::plane::challenge::OwnReference>,
    /// Passed challenges waiting for their lease to pay the host, to be published.
    pending_results: Vec<proof::Pending>,
    /// Running leases to challenge again (`--challenge-every`).
    rechallenges: rent::rechallenge::Rechallenges,
    /// What `/metrics` accumulates.
    recorder: crate::metrics::Recorder,
    /// Where `/metrics` listens, once bound.
    metrics_addr: Option<std::net::SocketAddr>,
    /// The worst cases of the rents being matched now (they count against the spend cap).
    spend_pending: u64,
    /// The families whose offers this node follows (None: every family).
    families: Option<std::collections::BTreeSet<gpux_protocol::GpuFamily>>,
    /// Whether a search, rent, group or bid outside `families` follows its families at
    /// once (`--market-families auto`) rather than being refused.
    families_auto: bool,
    /// Registry credentials of resumable leases, by lease (in memory only, never stored).
    registry_secrets:
        std::collections::BTreeMap<gpux_protocol::ContentId, gpux_api::RegistryCredentials>,
    /// Where rents under way stand, for `gpux rent`'s progress.
    rent_progress: rent::ProgressBoard,
    /// A money or lease record could not be written: the node stops with this.
    store_failed: Option<String>,
    /// This node's standing bids and what each runs when filled.
    bids: bids::OwnBids,
}

/// How often a node asks the ledger who paid the hosts in its book (their reliability).
const HISTORY_EVERY: Duration = Duration::from_secs(10);
/// Hosts asked about per round.
const HISTORIES_PER_ROUND: usize = 32;

/// Runs the node until `shutdown` resolves or the API asks it to stop.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (key, created) = crate::init_key(&config.data_dir)?;
    // Held until the node has exited: `gpux node stop` waits for it.
    let _claimed = crate::claim_data_dir(&config.data_dir)?;
    if created {
        tracing::info!(
            "created node key {}",
            crate::key_path(&config.data_dir).display()
        );
    }
    let state = NodeState::open(&config.data_dir)?;
    let token = api::ensure_token(&config.data_dir).context("creating the API token")?;
    let net_config = NetConfig {
        listen: config.listen.clone(),
        bootstrap: config.bootstrap.clone(),
        mdns: config.mdns,
        families: config.market_families.clone(),
        link_delay: config.link_delay,
        ..NetConfig::default()
    };
    let (net, mut net_events) = p2p::spawn(&key, net_config).await?;
    p2p::perf::serve(&net).context("serving bandwidth measurements")?;
    let (events_tx, mut events_rx) = mpsc::channel(EVENT_CAPACITY);
    let t = now();
    let ledger = match config.ledger.as_slice() {
        [] => None,
        addrs => Some(LedgerClient::cluster(net.clone(), addrs.to_vec())?),
    };
    let ledger_cluster = match (config.serve_ledger, &config.ledger_cluster) {
        (Some(ledger_config), Some(cluster)) => Some(std::sync::Arc::new(
            crate::ledger::cluster::LedgerCluster::start(
                key.clone(),
                ledger_config,
                std::sync::Arc::new(state.store().clone()),
                net.clone(),
                cluster,
            )
            .await
            .context("starting this member of the replicated ledger")?,
        )),
        _ => None,
    };
    let ledger_service = match config.serve_ledger {
        Some(ledger_config) if ledger_cluster.is_none() => Some(
            LedgerService::open(key.clone(), state.clone(), ledger_config)
                .context("opening the ledger")?,
        ),
        _ => None,
    };
    let renter = renter::RenterRole::new(
        key.clone(),
        state.clone(),
        net.clone(),
        events_tx.clone(),
        ledger.clone(),
        t,
    )
    .context("loading the renter's leases")?;
    let renter_served = renter.served_by();
    let mut daemon = Daemon {
        key: key.clone(),
        net: net.clone(),
        state: state.clone(),
        events_tx: events_tx.clone(),
        started: t,
        market: market::MarketView::new(
            state.clone(),
            // The ledger this node settles with (or is) signs the records that back a
            // challenged tier.
            match (&ledger, &ledger_service, &ledger_cluster) {
                (Some(client), _, _) => client.keys(),
                (None, Some(_), _) => vec![key.public()],
                (None, None, Some(cluster)) => cluster.member_keys(),
                (None, None, None) => Vec::new(),
            },
            t,
        ),
        host: None,
        renter,
        ledger: ledger.clone(),
        ledger_service,
        ledger_cluster,
        reach: reach::Reach::new(views::blocked_hosts(&state), renter_served),
        peers: std::collections::BTreeSet::new(),
        rtts: std::collections::BTreeMap::new(),
        links: std::collections::BTreeMap::new(),
        reachability: (p2p::Reachability::Unknown, Vec::new()),
        data_dir: config.data_dir.clone(),
        challenge_references: config.challenge_references.clone(),
        pending_results: Vec::new(),
        rechallenges: Default::default(),
        recorder: crate::metrics::Recorder {
            libp2p: Some(net.bandwidth()),
            ..crate::metrics::Recorder::default()
        },
        metrics_addr: None,
        spend_pending: 0,
        families: config.market_families.clone(),
        families_auto: config.market_auto,
        registry_secrets: std::collections::BTreeMap::new(),
        rent_progress: rent::ProgressBoard::default(),
        bids: bids::OwnBids::default(),
        store_failed: None,
    };
    if let Some(options) = config.host.clone() {
        let ledger = ledger.clone().context(
            "a host needs a ledger to settle with (--ledger or `ledger` in config.toml)",
        )?;
        let role = host::HostRole::start(
            key.clone(),
            state.clone(),
            net.clone(),
            events_tx.clone(),
            ledger,
            options,
            (config.timing, daemon.recorder.clone()),
        )
        .await?;
        // Its bandwidth, measured to its bootstrap peers (the network's well-known nodes)
        // once they are reached, and published with its offers.
        let bootstrap = config
            .bootstrap
            .iter()
            .filter_map(|a| match a.iter().last() {
                Some(libp2p::multiaddr::Protocol::P2p(peer)) => Some(peer),
                _ => None,
            })
            .collect();
        tokio::spawn(crate::machine::measure_bandwidth(
            net.clone(),
            role.machine(),
            bootstrap,
        ));
        // A host follows the market of its own families unless told otherwise: it sells,
        // and other families' offers would only cost it bandwidth.
        if config.market_families.is_none() || config.market_auto {
            let mut own = role.families();
            own.extend(config.market_families.iter().flatten().copied());
            if !own.is_empty() {
                net.follow(Some(own.clone()))
                    .await
                    .context("subscribing to the host's families' topics")?;
                daemon.families = Some(own);
            }
        }
        daemon.host = Some(role);
        daemon.publish_offers();
    }
    // /metrics binds before the API, whose address file tells the harness (and
    // scripts) that the node is up: by then `metrics.addr` is there too.
    let (snapshot_tx, mut snapshot_rx) = mpsc::channel::<crate::metrics::SnapshotRequest>(8);
    let (metrics_stop_tx, metrics_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let history = console::History::default();
    if daemon.host.is_some() {
        tokio::spawn(history.clone().sample(snapshot_tx.clone()));
    }
    let feeds = console::Feeds {
        snapshots: snapshot_tx.clone(),
        history,
    };
    let metrics_task = match config.metrics {
        Some(addr) => {
            let (bound, task) =
                crate::metrics::serve(addr, snapshot_tx, daemon.recorder.clone(), async {
                    let _ = metrics_stop_rx.await;
                })
                .await
                .with_context(|| format!("starting /metrics on {addr}"))?;
            crate::metrics::write_addr(&config.data_dir, bound)
                .context("writing the metrics address")?;
            tracing::info!("metrics on http://{bound}/metrics");
            daemon.metrics_addr = Some(bound);
            Some(task)
        }
        None => None,
    };
    let (api_tx, mut api_rx) = mpsc::channel(API_CAPACITY);
    let (api_stop_tx, api_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let bridge = crate::plane::bridge::Bridge {
        net: net.clone(),
        state: state.clone(),
    };
    let (api_addr, api_task) = api::serve(
        config.api,
        token,
        api_tx,
        bridge,
        feeds,
        &config.data_dir,
        async {
            let _ = api_stop_rx.await;
        },
    )
    .await
    .with_context(|| format!("starting the API on {}", config.api))?;
    tracing::info!("peer id {}, API on http://{api_addr}", key.peer_id());

    let republish = daemon.host.as_ref().map_or(3600, |h| h.republish_s());
    let mut republish_tick = tokio::time::interval(Duration::from_secs(republish));
    republish_tick.tick().await;
    let mut expire_tick = tokio::time::interval(Duration::from_secs(10));
    let mut pending_tick = tokio::time::interval(Duration::from_millis(250));
    let mut history_tick = tokio::time::interval(HISTORY_EVERY);
    let mut history_from = 0;
    tokio::pin!(shutdown);
    daemon.restart_resumes();
    daemon.restore_bids();
    let mut failed = None;
    // A signal (SIGTERM, Ctrl-C) leaves the hosted leases running; only an API shutdown
    // with `end_leases` (`gpux node stop --end-leases`) ends them.
    let mut end_leases = false;
    loop {
        if let Some(why) = daemon.store_failed.take() {
            failed = Some(why);
            break;
        }
        tokio::select! {
            () = &mut shutdown => break,
            Some(event) = net_events.recv() => daemon.on_network_event(event),
            Some(command) = api_rx.recv() => {
                if let ApiCommand::Shutdown { end_leases: end, reply } = command {
                    let _ = reply.send(Ok(gpux_api::ShuttingDown { stopping: true }));
                    end_leases = end;
                    break;
                }
                daemon.on_api(command);
            }
            Some(event) = events_rx.recv() => daemon.on_event(event),
            Some(reply) = snapshot_rx.recv() => {
                let _ = reply.send(daemon.metrics_snapshot());
            }
            _ = republish_tick.tick() => daemon.publish_offers(),
            _ = pending_tick.tick() => {
                daemon.publish_if_due();
                daemon.rechallenge_if_due();
            }
            _ = expire_tick.tick() => {
                daemon.market.expire(now());
                daemon.retry_bids();
            }
            _ = history_tick.tick() => {
                history_from = daemon.fetch_histories(history_from);
                daemon.fetch_proofs();
            }
        }
        // A lease of this renter that is over (stopped, preempted, or early) gives its GPUs
        // back in this node's view of the market.
        for over in daemon.renter.take_over() {
            daemon.market.book.release(&over.lease);
            if over.served {
                daemon.reach.served(over.host);
            }
            if let Some(preempted) = over.spot_preempted {
                daemon.reach.spot_ended(over.host, preempted, now());
                // Rented with --resume: a preempted lease's work moves on (once); a lease
                // that ended otherwise ends its chain.
                daemon.on_resume_event(if preempted {
                    resume::ResumeEvent::Preempted(over.lease)
                } else {
                    resume::ResumeEvent::Ended(over.lease)
                });
            }
        }
    }
    // A store that fails cannot record the leases' ends: they are left as a SIGKILL leaves
    // them, and resume from their last stored step at the next start.
    if failed.is_none() {
        if end_leases {
            daemon.stop_hosting(&mut events_rx).await;
        } else {
            daemon.detach_hosting(&mut events_rx).await;
        }
    }
    let _ = api_stop_tx.send(());
    let _ = api_task.await;
    let _ = metrics_stop_tx.send(());
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    net.shutdown().await.ok();
    {
        use crate::store::Store;
        state.store().flush()?;
    }
    match failed {
        Some(why) => Err(anyhow::anyhow!(
            "the node stopped: {why} (the store could not keep a record; free disk space or \
             check the disk under {}, then start the node again: it resumes from what was \
             stored)",
            config.data_dir.display()
        )),
        None => Ok(()),
    }
}

impl Daemon {
    /// Publishes now if a publication is pending and the last was long enough ago.
    fn publish_if_due(&mut self) {
        if let Some(host) = self.host.as_mut()
            && host.publish_pending
            && now().ms_since(host.last_publish) >= SUBSCRIBE_PUBLISH_GAP_MS
        {
            self.publish_offers();
        }
    }

    fn publish_offers(&mut self) {
        let Some(host) = self.host.as_mut() else {
            return;
        };
        host.challenged = self
            .market
            .validator
            .challenged_devices(self.key.public(), now());
        match host.publish_offers(now()) {
            Ok(published) => {
                for offer in &published.offers {
                    let _ = self.market.book.insert(offer, now());
                }
                for withdrawal in &published.withdrawals {
                    let _ = self.market.book.withdraw(withdrawal);
                }
                if let Some(att) = published.attestation.clone() {
                    self.market.remember_attestation(att);
                }
                published.send(&self.net);
            }
            Err(e) => tracing::warn!("publishing offers: {e:#}"),
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Host { lease, input } => {
                if let Some(host) = self.host.as_mut()
                    && host.on_input(lease, input)
                {
                    self.publish_offers_soon();
                }
            }
            Event::GpuFault { uuid, xid, at } => {
                if let Some(host) = self.host.as_mut()
                    && host.on_gpu_fault(&uuid, xid, at)
                {
                    self.publish_offers_soon();
                }
            }
            Event::Renter { lease, input } => self.renter.on_input(lease, input),
            Event::Rent(step) => self.on_rent_event(step),
            Event::Resume(step) => self.on_resume_event(step),
            Event::Bid(outcome) => self.on_bid_event(outcome),
            Event::Group(step) => self.on_group_event(step),
            Event::History {
                host,
                history,
                ends,
            } => {
                // With its devices that passed a published challenge.
                let t = now();
                let challenged = self.market.validator.challenged_devices(host, t).len();
                let score = self
                    .reach
                    .ledger_history(host, &history, &ends, challenged, t);
                self.market.book.set_reliability(host, score);
            }
            Event::ChallengePassed { lease, measured } => self.challenge_passed(lease, &measured),
            Event::Rechallenge { lease, every } => self.rechallenges.add(lease, every),
            Event::Proof { lease, proof } => self.on_proof(lease, proof),
            Event::StoreFailed(why) => {
                self.store_failed.get_or_insert(why);
            }
            Event::SpendDone(worst) => {
                self.spend_pending = self.spend_pending.saturating_sub(worst);
            }
            Event::Deferred(command, until) => self.deferred(command, until),
            Event::Act { lease, act, reply } => {
                let done = match act {
                    LeaseAct::Commit => self.renter.commit(lease).map(drop),
                    LeaseAct::Stop => self.renter.stop(lease).map(drop),
                    LeaseAct::FailChallenge => self.renter.fail_challenge(lease),
                };
                let _ = reply.send(done);
            }
        }
    }

    /// Asks the ledger for the histories of up to [`HISTORIES_PER_ROUND`] hosts with offers
    /// in the book, from the `from`-th on (round robin); returns where the next round starts.
    fn fetch_histories(&self, from: usize) -> usize {
        let Some(ledger) = self.ledger.clone() else {
            return 0;
        };
        let hosts = self.market.book.hosts_offering();
        if hosts.is_empty() {
            return 0;
        }
        let from = from % hosts.len();
        let round: Vec<_> = hosts
            .iter()
            .cycle()
            .skip(from)
            .take(HISTORIES_PER_ROUND.min(hosts.len()))
            .copied()
            .collect();
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            for host in round {
                let both = match ledger.history(host).await {
                    Ok(history) => ledger.ends(host).await.map(|ends| (history, ends)),
                    Err(e) => Err(e),
                };
                match both {
                    Ok((history, ends)) => {
                        report(
                            &events,
                            Event::History {
                                host,
                                history,
                                ends,
                            },
                        )
                        .await
                    }
                    Err(e) => {
                        tracing::debug!("the ledger's history of {}: {e}", host.peer_id());
                        return;
                    }
                }
            }
        });
        from + HISTORIES_PER_ROUND
    }

    fn publish_offers_soon(&mut self) {
        if let Some(host) = self.host.as_mut() {
            host.publish_pending = true;
        }
    }

    fn status(&self) -> gpux_api::Status {
        gpux_api::Status {
            peer_id: self.key.peer_id().to_string(),
            metrics: self.metrics_addr.map(|a| a.to_string()),
            offers_in_book: self.market.book.len(),
            own_offers: self.host.as_ref().map(|h| h.offer_count()),
            gossip_accepted: self.market.accepted,
            gossip_rejected: self.market.rejected,
            gossip_over_budget: self.market.over_budget,
            arrivals_ms: self.market.arrivals_ms.iter().copied().collect(),
            uptime_s: now().ms_since(self.started) / 1000,
            peers: self.peers.iter().map(ToString::to_string).collect(),
            peer_rtt_ms: self
                .rtts
                .iter()
                .map(|(peer, ms)| (peer.to_string(), *ms))
                .collect(),
            peer_links: self
                .links
                .iter()
                .map(|(peer, link)| (peer.to_string(), link.as_str().to_string()))
                .collect(),
            reachability: self.reachability.0.as_str().to_string(),
            relayed_at: self.reachability.1.clone(),
        }
    }
}
