//! `gpux node run`: the daemon. One task owns the node's state (the market view, the
//! validator, the host role, the store) and reacts to network events, API commands and
//! timers; network round trips (a renter's lease requests) run in their own tasks and report
//! back, so the loop never waits on a peer.

pub mod api;
mod leases;
mod rent;
mod run;

use rent::{RentTask, Workload};
pub use run::LeaseTiming;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use gpux_market::query::Query;
use gpux_market::{Allocation, BidSpec, BookConfig, OrderBook};
use gpux_protocol::validate::Rules;
use gpux_protocol::{
    AnySigned, AnyVerified, Attestation, BoundedString, BoundedVec, ContentId, EvidenceTier, Ext,
    GpuFamily, ImageDigest, Keypair, LeaseKind, MicroCredits, Offer, OfferGpu, Signed, Timestamp,
    Verified,
};
use libp2p::Multiaddr;
use tokio::sync::{mpsc, oneshot};

use crate::attest::now;
use crate::host::{Answer, Host};
use crate::p2p::{self, Client, NetConfig, NetworkEvent, topics};
use crate::store::{LeaseRecord, NodeState, SledStore};
use crate::validation::{Validator, Verdict};

/// The least time between publications triggered by new subscribers, ms.
const SUBSCRIBE_PUBLISH_GAP_MS: u64 = 3000;

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
    /// Images the host has, by digest.
    pub images: Vec<ImageDigest>,
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
    /// mDNS discovery.
    pub mdns: bool,
    /// Set for a host.
    pub host: Option<HostOptions>,
    /// The ledger node this node settles with (`.../p2p/<its peer id>`).
    pub ledger: Option<Multiaddr>,
    /// Set to serve the ledger (`/gpux/ledger/1`) from this node.
    pub serve_ledger: Option<gpux_market::LedgerConfig>,
    /// Receipt interval and acknowledgement grace.
    pub timing: LeaseTiming,
}

/// A faucet order to a ledger node's API, `/v1/ledger/mint`.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct MintRequest {
    /// The account: a peer id (`12D3KooW...`).
    pub account: String,
    /// Credits (`100.0`).
    pub amount: String,
}

/// A renter's request to the API's `/v1/rent`.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct RentRequest {
    /// Constraints (query language).
    pub query: String,
    /// GPUs wanted.
    pub gpus: u16,
    /// Most paid per GPU-hour, credits (`2.50`).
    pub max_price: String,
    /// Lease length, seconds.
    pub duration_s: u32,
    /// Image to run (`sha256:...`); the first the host lists when absent.
    pub image: Option<String>,
    /// The command to run in the container (empty: the image's default).
    #[serde(default)]
    pub command: Vec<String>,
    /// Environment for the workload (`NVIDIA_*` is the host's to set).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Whether the container may use the network.
    #[serde(default)]
    pub network: bool,
}

pub(crate) type Reply = oneshot::Sender<Result<serde_json::Value, String>>;

/// A renter's standing bid, to `/v1/bid`.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct BidRequest {
    /// Constraints (query language).
    pub query: String,
    /// GPUs wanted.
    pub gpus: u16,
    /// Most paid per GPU-hour, credits.
    pub max_price: String,
    /// Lease length, seconds.
    pub duration_s: u32,
    /// How long the bid stands, seconds (at most an hour).
    pub ttl_s: u64,
}

/// What the API asks of the node.
pub(crate) enum ApiCommand {
    Bid {
        request: BidRequest,
        reply: Reply,
    },
    Status {
        reply: Reply,
    },
    Search {
        query: String,
        limit: usize,
        reply: Reply,
    },
    Leases {
        reply: Reply,
    },
    Rent {
        request: RentRequest,
        reply: Reply,
    },
    Shutdown {
        reply: Reply,
    },
    Logs {
        lease: String,
        from: u64,
        reply: Reply,
    },
    Receipts {
        lease: String,
        reply: Reply,
    },
    Stop {
        lease: String,
        reply: Reply,
    },
    Balance {
        reply: Reply,
    },
    Mint {
        request: MintRequest,
        reply: Reply,
    },
    Ledger {
        reply: Reply,
    },
}

/// What background tasks ask of the node.
enum Internal {
    Match {
        spec: BidSpec,
        excluded: BTreeSet<ContentId>,
        reply: oneshot::Sender<Option<(Allocation, Option<ImageDigest>)>>,
    },
    Leased {
        record: LeaseRecord,
        allocation: Allocation,
        reply: oneshot::Sender<()>,
    },
    /// A renter's lease was settled at the ledger (its escrow released).
    Settled { lease: ContentId },
    /// A renter's settlement pass finished.
    SweepDone,
}

struct Daemon {
    key: Keypair,
    net: Client,
    state: NodeState<SledStore>,
    book: OrderBook,
    validator: Validator,
    host: Option<(Host<SledStore>, HostOptions, Option<Verified<Attestation>>)>,
    internal_tx: mpsc::Sender<Internal>,
    started: Timestamp,
    last_publish: Timestamp,
    publish_pending: bool,
    /// This node's own standing bids, filled automatically when an offer that satisfies one
    /// arrives.
    own_bids: Vec<Verified<gpux_protocol::Bid>>,
    /// Delays from an offer's signing to its arrival here, ms (the last 10,000).
    arrivals_ms: std::collections::VecDeque<u64>,
    rejected: u64,
    accepted: u64,
    /// The ledger this node settles with.
    ledger: Option<crate::ledger::LedgerClient>,
    /// The ledger this node serves.
    ledger_service: Option<crate::ledger::LedgerService<SledStore>>,
    /// Host: what lease tasks need.
    run_ctx: Option<run::RunCtx>,
    /// Host: running lease tasks, by lease.
    runners: std::collections::BTreeMap<ContentId, run::StopTx>,
    runner_tasks: tokio::task::JoinSet<()>,
    timing: LeaseTiming,
    /// A renter settlement pass is running.
    sweeping: bool,
    lease_ticks: u64,
}

/// Runs the node until `shutdown` resolves or the API asks it to stop.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (key, created) = crate::init_key(&config.data_dir)?;
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
        ..NetConfig::default()
    };
    let (net, mut events) = p2p::spawn(&key, net_config).await?;
    let (internal_tx, mut internal_rx) = mpsc::channel(64);
    let t = now();
    let mut daemon = Daemon {
        key: key.clone(),
        net: net.clone(),
        state: state.clone(),
        book: OrderBook::new(BookConfig::default()),
        validator: Validator::new(Rules::default()),
        host: None,
        internal_tx,
        started: t,
        last_publish: Timestamp(0),
        publish_pending: false,
        arrivals_ms: std::collections::VecDeque::new(),
        own_bids: Vec::new(),
        rejected: 0,
        accepted: 0,
        ledger: None,
        ledger_service: None,
        run_ctx: None,
        runners: std::collections::BTreeMap::new(),
        runner_tasks: tokio::task::JoinSet::new(),
        timing: config.timing,
        sweeping: false,
        lease_ticks: 0,
    };
    daemon.load_snapshot(t);
    if let Some(ledger_config) = config.serve_ledger {
        daemon.ledger_service = Some(
            crate::ledger::LedgerService::open(key.clone(), state.clone(), ledger_config)
                .context("opening the ledger")?,
        );
    }
    if let Some(addr) = config.ledger.clone() {
        let client =
            crate::ledger::LedgerClient::new(net.clone(), addr).map_err(|e| anyhow::anyhow!(e))?;
        daemon.ledger = Some(client);
    }
    let (over_tx, mut over_rx) = mpsc::channel::<ContentId>(64);
    if let Some(mut options) = config.host.clone() {
        let mut host = Host::new(key.clone(), state.clone(), t)?;
        host.set_receipt_timing(
            config.timing.receipt_interval.as_millis() as u64,
            config.timing.ack_grace.as_millis() as u64,
        );
        let exec = crate::executor::Executor::connect(&key.peer_id().to_string())
            .await
            .context("a host runs leases in Docker")?;
        if options.images.is_empty() {
            options.images = exec
                .list_images()
                .await
                .context("listing the host's images")?;
        }
        let ledger = daemon.ledger.clone().context(
            "a host needs a ledger to settle with (--ledger or `ledger` in config.toml)",
        )?;
        daemon.run_ctx = Some(run::RunCtx {
            key: key.clone(),
            net: net.clone(),
            state: state.clone(),
            exec,
            ledger,
            timing: config.timing,
            fake_gpus: options.fake_gpus,
            nvml: match gpux_attestation::Probe::open(options.nvml_lib.as_deref()) {
                Ok(probe) => Some(std::sync::Arc::new(probe)),
                Err(e) => {
                    tracing::warn!("no NVML for metering GPU use: {e}");
                    None
                }
            },
            over_tx,
        });
        daemon.host = Some((host, options, None));
        daemon.recover_host_leases().await;
        daemon.attest_and_publish().await?;
    }
    let (api_tx, mut api_rx) = mpsc::channel(64);
    let (api_stop_tx, api_stop_rx) = oneshot::channel::<()>();
    let (api_addr, api_task) = api::serve(config.api, token, api_tx, &config.data_dir, async {
        let _ = api_stop_rx.await;
    })
    .await
    .with_context(|| format!("starting the API on {}", config.api))?;
    tracing::info!("peer id {}, API on http://{api_addr}", key.peer_id());

    let republish = daemon
        .host
        .as_ref()
        .map_or(3600, |(_, o, _)| o.republish_s.max(1));
    let mut republish_tick = tokio::time::interval(Duration::from_secs(republish));
    republish_tick.tick().await;
    let mut sweep_tick = tokio::time::interval(Duration::from_secs(10));
    let mut lease_tick = tokio::time::interval(Duration::from_secs(1));
    let mut pending_tick = tokio::time::interval(Duration::from_millis(250));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(event) = events.recv() => daemon.on_network_event(event).await,
            Some(command) = api_rx.recv() => {
                if let ApiCommand::Shutdown { reply } = command {
                    let _ = reply.send(Ok(serde_json::json!({ "stopping": true })));
                    break;
                }
                daemon.on_api(command);
            }
            Some(internal) = internal_rx.recv() => daemon.on_internal(internal),
            Some(lease) = over_rx.recv() => daemon.on_lease_over(&lease),
            _ = lease_tick.tick() => daemon.sweep_leases(),
            Some(_) = daemon.runner_tasks.join_next(), if !daemon.runner_tasks.is_empty() => {}
            _ = republish_tick.tick() => {
                if let Err(e) = daemon.publish_offers().await {
                    tracing::warn!("re-publishing offers: {e:#}");
                }
            }
            _ = pending_tick.tick() => daemon.publish_if_due().await,
            _ = sweep_tick.tick() => {
                for gone in daemon.book.expire(now()) {
                    let _ = daemon.state.forget_offer(&gone);
                }
            }
        }
    }
    daemon.stop_runners(&mut over_rx).await;
    let _ = api_stop_tx.send(());
    let _ = api_task.await;
    net.shutdown().await.ok();
    state.store_flush()?;
    Ok(())
}

impl NodeState<SledStore> {
    fn store_flush(&self) -> Result<(), crate::store::StoreError> {
        use crate::store::Store;
        self.store().flush()
    }
}

impl Daemon {
    fn load_snapshot(&mut self, t: Timestamp) {
        let Ok(snapshot) = self.state.market_snapshot() else {
            return;
        };
        for bytes in snapshot {
            // The snapshot is a cache: everything in it is verified again.
            match AnySigned::from_bytes(bytes).and_then(AnySigned::verify) {
                Ok(AnyVerified::Attestation(att)) => self.validator.remember_attestation(att),
                Ok(AnyVerified::Offer(offer)) => {
                    let _ = self.book.insert(&offer, t);
                }
                _ => {}
            }
        }
    }

    /// Publishes if a publication is pending and the last was long enough ago.
    async fn publish_if_due(&mut self) {
        if self.publish_pending && now().ms_since(self.last_publish) >= SUBSCRIBE_PUBLISH_GAP_MS {
            self.publish_pending = false;
            if let Err(e) = self.publish_offers().await {
                tracing::warn!("publishing offers: {e:#}");
            }
        }
    }

    async fn attest_and_publish(&mut self) -> anyhow::Result<()> {
        let Some((_, options, attestation)) = self.host.as_mut() else {
            return Ok(());
        };
        let key = self.key.clone();
        let lib = options.nvml_lib.clone();
        let att =
            tokio::task::spawn_blocking(move || crate::attest::attest(&key, lib.as_deref(), now()))
                .await
                .context("the probe task failed")??;
        self.validator.remember_attestation(att.clone());
        *attestation = Some(att);
        self.publish_offers().await
    }

    /// Signs fresh offers (one per GPU model, in its own slot) and publishes them with the
    /// attestation.
    async fn publish_offers(&mut self) -> anyhow::Result<()> {
        let Some((host, options, Some(att))) = self.host.as_mut() else {
            return Ok(());
        };
        let t = now();
        self.last_publish = t;
        // The attestation is re-signed with every publication: a new message, so peers that
        // joined since receive it (they ignore offers whose attestation they have not seen).
        // Publications are at least SUBSCRIBE_PUBLISH_GAP_MS apart, which keeps a host well
        // under the per-signer gossip rate limit.
        let mut body = att.body().clone();
        body.created_at = t;
        *att = Signed::sign(&self.key, body).context("signing the attestation")?;
        self.validator.remember_attestation(att.clone());
        let mut groups: Vec<Vec<&gpux_protocol::GpuFacts>> = Vec::new();
        for gpu in att.gpus.iter() {
            match groups.iter_mut().find(|g| {
                g.len() < gpux_protocol::MAX_OFFER_GPUS
                    && g[0].name == gpu.name
                    && g[0].memory_total_bytes == gpu.memory_total_bytes
                    && g[0].compute_capability == gpu.compute_capability
            }) {
                Some(group) => group.push(gpu),
                None => groups.push(vec![gpu]),
            }
        }
        // GPUs leased now are not offered: each publication lists what is free, and a slot
        // whose GPUs are all leased is withdrawn until they come back.
        let busy = host.busy_gpus(t);
        let mut offers = Vec::new();
        let mut withdrawals = Vec::new();
        for (slot, group) in groups.iter().enumerate() {
            let group: Vec<_> = group.iter().filter(|g| !busy.contains(&g.uuid)).collect();
            if group.is_empty() {
                if let Some(old) = host.retire_slot(slot as u16)? {
                    let body = gpux_protocol::OfferWithdrawal {
                        seq: t.0 * 64 + slot as u64,
                        created_at: t,
                        offer: old.id(),
                        ext: Ext::new(),
                    };
                    let w = Signed::sign(&self.key, body).context("signing a withdrawal")?;
                    withdrawals.push((topics::offers(old.topic_family()).to_string(), w));
                }
                continue;
            }
            let gpus = group
                .iter()
                .map(|g| OfferGpu {
                    uuid: g.uuid,
                    family: BoundedString::new(GpuFamily::classify(&g.name).key())
                        .unwrap_or_default(),
                    memory_bytes: g.memory_total_bytes,
                    compute_capability: g.compute_capability,
                    pcie_gen: g.pcie.max_gen.unwrap_or(0),
                })
                .collect();
            let offer = Offer {
                // Unix milliseconds plus the slot: grows across restarts without a counter.
                seq: t.0 * 64 + slot as u64,
                slot: slot as u16,
                created_at: t,
                expires_at: t.plus_secs(options.offer_ttl_s),
                attestation: att.id(),
                gpus: BoundedVec::new(gpus).map_err(|e| anyhow::anyhow!("{e}"))?,
                price_per_gpu_hour: options.price,
                spot_floor_per_gpu_hour: options.spot_floor,
                min_duration_s: options.min_duration_s,
                max_duration_s: options.max_duration_s,
                region: BoundedString::new(options.region.clone())
                    .map_err(|e| anyhow::anyhow!("region: {e}"))?,
                tier: EvidenceTier::SelfReported,
                driver: att.driver_version.parse().unwrap_or_default(),
                cuda: att.cuda_driver_version.unwrap_or_default(),
                images: BoundedVec::new(options.images.clone())
                    .map_err(|e| anyhow::anyhow!("images: {e}"))?,
                ext: Ext::new(),
            };
            let signed = Signed::sign(&self.key, offer).context("signing an offer")?;
            host.add_offer(signed.clone(), t)?;
            offers.push(signed);
        }
        let att_bytes = att.as_bytes().to_vec();
        // With no peer yet publishing fails; the next tick or the next connection retries.
        let _ = self.net.publish(topics::ATTESTATIONS, att_bytes).await;
        for offer in offers {
            let _ = self.book.insert(&offer, t);
            let topic = topics::offers(offer.topic_family()).to_string();
            let _ = self.net.publish(topic, offer.as_bytes().to_vec()).await;
        }
        for (topic, withdrawal) in withdrawals {
            let _ = self.book.withdraw(&withdrawal);
            let _ = self
                .net
                .publish(topic, withdrawal.as_bytes().to_vec())
                .await;
        }
        Ok(())
    }

    async fn on_network_event(&mut self, event: NetworkEvent) {
        match event {
            NetworkEvent::Gossip {
                id,
                source,
                topic,
                data,
            } => {
                let bytes = data.clone();
                let verdict = self.validator.validate(&topic, data, now());
                let acceptance = verdict.acceptance();
                match verdict {
                    Verdict::Accept(v) => {
                        self.accepted += 1;
                        match *v {
                            AnyVerified::Offer(offer)
                                if self.book.insert(&offer, now()).is_ok() =>
                            {
                                if self.arrivals_ms.len() >= 10_000 {
                                    self.arrivals_ms.pop_front();
                                }
                                self.arrivals_ms.push_back(now().ms_since(offer.created_at));
                                let _ = self.state.snapshot_offer(&offer.id(), &bytes);
                                self.fill_own_bids(&offer.id());
                            }
                            AnyVerified::Attestation(att) => {
                                let _ = self.state.snapshot_offer(&att.id(), &bytes);
                            }
                            AnyVerified::OfferWithdrawal(w) if self.book.withdraw(&w).is_ok() => {
                                let _ = self.state.forget_offer(&w.offer);
                            }
                            AnyVerified::Bid(bid) => {
                                let _ = self.book.add_bid(&bid, now());
                            }
                            _ => {}
                        }
                    }
                    Verdict::Reject(why) => {
                        self.rejected += 1;
                        tracing::debug!("rejected gossip from {source}: {why}");
                    }
                    Verdict::Ignore(why) => tracing::trace!("ignored gossip from {source}: {why}"),
                }
                let _ = self.net.report(id, source, acceptance).await;
            }
            NetworkEvent::Request {
                id,
                proto,
                peer,
                data,
            } if proto != p2p::Proto::Lease || !is_lease_request(&data) => {
                self.on_request(id, proto, peer, data).await;
            }
            NetworkEvent::Request { id, data, .. } => {
                let answer = match self.host.as_mut() {
                    Some((host, _, _)) => host.handle_request(data, now()),
                    None => Ok(Answer::Rejected {
                        reason: gpux_protocol::RejectReason::Invalid,
                        envelope: Vec::new(),
                    }),
                };
                match answer {
                    Ok(answer) => {
                        if matches!(answer, Answer::Accepted { .. }) {
                            // The leased GPUs leave the published offers at the next
                            // (paced) publication.
                            self.publish_pending = true;
                        }
                        let _ = self.net.respond(id, answer.envelope().to_vec()).await;
                    }
                    Err(e) => tracing::error!("cannot store a lease: {e}"),
                }
            }
            // A new peer fills its book from our next publication: publish soon (fresh
            // signatures, so the messages are new), at most every few seconds (subscribers
            // arriving together share one publication); the pending tick sends what the gap
            // held back.
            NetworkEvent::Subscribed { topic, .. }
                if topic == topics::ATTESTATIONS && self.host.is_some() =>
            {
                self.publish_pending = true;
                self.publish_if_due().await;
            }
            _ => {}
        }
    }

    fn on_api(&mut self, command: ApiCommand) {
        match command {
            ApiCommand::Status { reply } => {
                let hosting = self.host.as_ref().map(|(h, _, _)| h.offers().len());
                let _ = reply.send(Ok(serde_json::json!({
                    "peer_id": self.key.peer_id().to_string(),
                    "offers_in_book": self.book.len(),
                    "own_offers": hosting,
                    "gossip_accepted": self.accepted,
                    "gossip_rejected": self.rejected,
                    "arrivals_ms": self.arrivals_ms,
                    "uptime_s": now().ms_since(self.started) / 1000,
                })));
            }
            ApiCommand::Search {
                query,
                limit,
                reply,
            } => {
                let result = Query::parse(&query)
                    .map(|q| {
                        serde_json::to_value(self.book.search(&q, now(), limit)).unwrap_or_default()
                    })
                    .map_err(|e| e.to_string());
                let _ = reply.send(result);
            }
            ApiCommand::Leases { reply } => {
                let _ = reply.send(self.leases_json());
            }
            ApiCommand::Rent { request, reply } => self.start_rent(request, reply),
            ApiCommand::Bid { request, reply } => {
                let result = self.place_bid(request);
                let net = self.net.clone();
                tokio::spawn(async move {
                    match result {
                        Ok((bid, value)) => {
                            // With no peer yet, the bid still stands locally and fills from
                            // offers as they arrive.
                            let _ = net.publish(topics::BIDS, bid).await;
                            let _ = reply.send(Ok(value));
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                });
            }
            ApiCommand::Shutdown { .. } => {}
            other => self.on_lease_api(other),
        }
    }

    fn on_internal(&mut self, internal: Internal) {
        match internal {
            Internal::Match {
                spec,
                excluded,
                reply,
            } => {
                let found = self
                    .book
                    .match_bid_excluding(&spec, now(), &excluded)
                    .ok()
                    .and_then(|mut a| a.pop());
                let found = found.map(|a| {
                    let image = self
                        .book
                        .offer_images(&a.offer)
                        .and_then(|i| i.first().copied());
                    (a, image)
                });
                let _ = reply.send(found);
            }
            Internal::Leased {
                record,
                allocation,
                reply,
            } => {
                if let Err(e) = self.state.save_lease(&record) {
                    tracing::error!("cannot store a lease: {e}");
                }
                let _ = self.book.reserve(&allocation, ContentId(record.lease));
                let _ = reply.send(());
            }
            Internal::Settled { lease } => self.on_renter_settled(&lease),
            Internal::SweepDone => self.sweeping = false,
        }
    }

    /// Signs a standing bid, keeps it, and returns its envelope (to publish) and a summary.
    fn place_bid(&mut self, request: BidRequest) -> Result<(Vec<u8>, serde_json::Value), String> {
        Query::parse(&request.query).map_err(|e| e.to_string())?;
        let t = now();
        let body = gpux_protocol::Bid {
            seq: t.0,
            created_at: t,
            expires_at: t.plus_secs(request.ttl_s.clamp(1, 3600)),
            query: BoundedString::new(request.query.clone()).map_err(|e| e.to_string())?,
            gpus: request.gpus,
            max_price_per_gpu_hour: request
                .max_price
                .parse::<MicroCredits>()
                .map_err(|e| e.to_string())?,
            duration_s: request.duration_s,
            kind: LeaseKind::OnDemand,
            allow_spread: false,
            ext: Ext::new(),
        };
        let bid = Signed::sign(&self.key, body).map_err(|e| e.to_string())?;
        self.book.add_bid(&bid, t).map_err(|e| e.to_string())?;
        let bytes = bid.as_bytes().to_vec();
        let value =
            serde_json::json!({ "bid": bid.id().to_string(), "expires_at": bid.expires_at.0 });
        self.own_bids.retain(|b| b.expires_at > t);
        self.own_bids.push(bid);
        // An offer already in the book may satisfy it.
        let offers: Vec<ContentId> = self
            .book
            .search(&Query::default(), t, 1000)
            .into_iter()
            .map(|h| h.offer)
            .collect();
        for offer in offers {
            self.fill_own_bids(&offer);
        }
        Ok((bytes, value))
    }

    /// Rents for this node's standing bids that `offer` can satisfy (best bid first); a bid
    /// being filled leaves the book.
    fn fill_own_bids(&mut self, offer: &ContentId) {
        if self.own_bids.is_empty() {
            return;
        }
        let t = now();
        for bid_id in self.book.bids_for_offer(offer, t) {
            let Some(pos) = self.own_bids.iter().position(|b| b.id() == bid_id) else {
                continue;
            };
            let bid = self.own_bids.remove(pos);
            self.book.remove_bid(&bid_id);
            let Ok(spec) = BidSpec::from_bid(&bid) else {
                continue;
            };
            let task = self.rent_task(spec, None);
            tokio::spawn(async move {
                match task.run().await {
                    Ok(lease) => tracing::info!(
                        "standing bid {} filled: lease {}",
                        bid_id.short(),
                        lease["lease"]
                    ),
                    Err(e) => {
                        tracing::warn!("standing bid {} could not be filled: {e}", bid_id.short())
                    }
                }
            });
        }
    }

    /// A renting task for `spec`, running outside the loop.
    fn rent_task(&self, spec: BidSpec, image: Option<ImageDigest>) -> RentTask {
        RentTask {
            key: self.key.clone(),
            net: self.net.clone(),
            internal: self.internal_tx.clone(),
            state: self.state.clone(),
            ledger: self.ledger.as_ref().map(crate::ledger::LedgerClient::key),
            spec,
            image,
            workload: Workload::default(),
        }
    }

    fn start_rent(&mut self, request: RentRequest, reply: Reply) {
        let spec = match (
            Query::parse(&request.query),
            request.max_price.parse::<MicroCredits>(),
        ) {
            (Ok(query), Ok(max_price)) => BidSpec {
                query,
                gpus: request.gpus,
                max_price,
                duration_s: request.duration_s,
                kind: LeaseKind::OnDemand,
                allow_spread: false,
            },
            (Err(e), _) => {
                let _ = reply.send(Err(e.to_string()));
                return;
            }
            (_, Err(e)) => {
                let _ = reply.send(Err(e.to_string()));
                return;
            }
        };
        let image = match request
            .image
            .as_deref()
            .map(str::parse::<ImageDigest>)
            .transpose()
        {
            Ok(image) => image,
            Err(e) => {
                let _ = reply.send(Err(e.to_string()));
                return;
            }
        };
        let mut task = self.rent_task(spec, image);
        let env: Result<Vec<_>, String> = request
            .env
            .iter()
            .map(|(name, value)| {
                Ok(gpux_protocol::EnvVar {
                    name: BoundedString::new(name.clone()).map_err(|e| format!("{name}: {e}"))?,
                    value: BoundedString::new(value.clone()).map_err(|e| format!("{name}: {e}"))?,
                })
            })
            .collect();
        let command: Result<Vec<_>, String> = request
            .command
            .iter()
            .map(|a| BoundedString::new(a.clone()).map_err(|e| format!("command: {e}")))
            .collect();
        match (command, env) {
            (Ok(command), Ok(env)) => {
                task.workload = Workload {
                    command,
                    env,
                    network: request.network,
                };
            }
            (Err(e), _) | (_, Err(e)) => {
                let _ = reply.send(Err(e));
                return;
            }
        }
        tokio::spawn(async move {
            let _ = reply.send(task.run().await);
        });
    }
}

/// Whether a `/gpux/lease/1` frame is a `LeaseRequest` (handled by the host role's book)
/// rather than an escrow lock or a lease end.
fn is_lease_request(data: &[u8]) -> bool {
    data.get(4) == Some(&(gpux_protocol::MessageKind::LeaseRequest as u8))
}
