//! The API's commands, answered from the components (and the store, for what is over).

use gpux_api::{
    ApiError, Balance, ErrorCode, LeaseView, LedgerTotals, LogsPage, ReceiptView, Receipts, Role,
};
use gpux_lease::{HostPhase, HostRecord, RenterPhase, RenterRecord};
use gpux_protocol::{ContentId, LeaseRequest, Signed, UsageReceipt, Verified};

use super::{ApiCommand, Daemon, Event};
use crate::attest::now;

fn kebab<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

pub(super) fn request_of(bytes: &[u8]) -> Option<Verified<LeaseRequest>> {
    Signed::<LeaseRequest>::from_bytes(bytes.to_vec())
        .and_then(Signed::verify)
        .ok()
}

fn view(lease: ContentId, role: Role, request: &Verified<LeaseRequest>) -> LeaseView {
    LeaseView {
        lease: gpux_protocol::hex(&lease.0),
        role,
        phase: String::new(),
        end: None,
        host_end: None,
        host: request.host.peer_id().to_string(),
        renter: request.signer().peer_id().to_string(),
        gpus: request.gpus.iter().map(ToString::to_string).collect(),
        duration_s: request.duration_s,
        price_per_gpu_hour_micro: request.price_per_gpu_hour.0,
        retention_charge_micro: request.retention_charge().map_or(0, |c| c.0),
        image: request.image.to_string(),
        since: 0,
        started_at: None,
        finished_at: None,
        ended_at: None,
        exit_code: None,
        receipt_interval_ms: 0,
        ack_grace_ms: 0,
        last_seq: 0,
        acked_seq: 0,
        acked_amount: 0,
        redeemed: 0,
        settled: false,
        log_bytes: 0,
        kind: match request.kind {
            gpux_protocol::LeaseKind::OnDemand => "on-demand",
            gpux_protocol::LeaseKind::Spot => "spot",
            gpux_protocol::LeaseKind::Reserved { .. } => "reserved",
        }
        .into(),
        starts_at: 0,
        preempted_until: None,
        notice_refused: false,
        resume: None,
        ssh_keys: request.ssh_keys.iter().map(|k| k.to_string()).collect(),
        group: request
            .group()
            .ok()
            .flatten()
            .map(|g| gpux_protocol::hex(&g)),
    }
}

/// A resumable lease's place in its chain, for the API.
fn resume_view(record: &crate::store::ResumeRecord) -> gpux_api::ResumeView {
    use crate::store::ResumeStatus;
    gpux_api::ResumeView {
        status: match &record.status {
            ResumeStatus::Watching => "watching".into(),
            ResumeStatus::Resuming => "resuming".into(),
            ResumeStatus::Resumed => "resumed".into(),
            ResumeStatus::Failed(why) => format!("failed: {why}"),
        },
        hop: record.hop,
        resumed_from: record.resumed_from.map(|l| l.to_string()),
        resumed_by: record.resumed_by.map(|l| l.to_string()),
        moved: record.moved.map(|m| gpux_api::MoveView {
            files: m.files,
            bytes: m.bytes,
            fetched: m.fetched,
            sent: m.sent,
            done_at_ms: m.done_at_ms,
        }),
    }
}

/// A host's lease, for the API.
pub(crate) fn host_view(lease: ContentId, record: &HostRecord) -> Option<LeaseView> {
    let request = request_of(&record.request)?;
    Some(LeaseView {
        phase: kebab(&record.phase),
        end: record.end.as_ref().map(kebab),
        since: record.accepted_at.0,
        started_at: record.started_at.map(|t| t.0),
        finished_at: record.finished_at.map(|t| t.0),
        ended_at: record.ended_at.map(|t| t.0),
        exit_code: record.exit_code,
        receipt_interval_ms: record.timing.receipt_interval_ms,
        ack_grace_ms: record.timing.ack_grace_ms,
        last_seq: record.last_seq,
        acked_seq: record.acked.as_ref().map_or(0, |v| v.seq),
        acked_amount: record.acked.as_ref().map_or(0, |v| v.amount.0),
        redeemed: record.redeemed.0,
        settled: record.phase == HostPhase::Settled,
        log_bytes: record.log_bytes,
        starts_at: record.starts_at.0,
        preempted_until: record.preemption.as_ref().map(|p| p.ends_at.0),
        ..view(lease, Role::Host, &request)
    })
}

/// A renter's lease, for the API.
pub(crate) fn renter_view(lease: ContentId, record: &RenterRecord) -> Option<LeaseView> {
    let request = request_of(&record.request)?;
    Some(LeaseView {
        phase: kebab(&record.phase),
        end: record.end.as_ref().map(kebab),
        host_end: record.host_end.as_ref().map(kebab),
        since: record.lock_sent_at.0,
        exit_code: record.exit_code.map(i64::from),
        receipt_interval_ms: record.timing.receipt_interval_ms,
        ack_grace_ms: record.timing.ack_grace_ms,
        last_seq: record.last_seq,
        acked_seq: record.acked.as_ref().map_or(0, |v| v.seq),
        acked_amount: record.acked.as_ref().map_or(0, |v| v.amount.0),
        settled: record.phase == RenterPhase::Settled,
        log_bytes: record.log_bytes,
        starts_at: record.starts_at.0,
        preempted_until: record.preempted_until.map(|t| t.0),
        notice_refused: record.notice_refused,
        ..view(lease, Role::Renter, &request)
    })
}

fn parse_lease(text: &str) -> Result<ContentId, ApiError> {
    text.parse::<ContentId>()
        .map_err(|e| ApiError::bad_input(format!("lease id: {e}")))
}

fn unknown(lease: &ContentId) -> ApiError {
    ApiError::new(ErrorCode::UnknownLease, format!("no lease {lease} here"))
        .with_hint("`gpux leases` lists this node's leases")
}

impl Daemon {
    fn lease_views(&self) -> Vec<LeaseView> {
        let mut views: Vec<LeaseView> = self
            .host
            .as_ref()
            .map(|h| h.records())
            .unwrap_or_default()
            .iter()
            .filter_map(|(id, r)| host_view(*id, r))
            .collect();
        views.extend(
            self.renter
                .records()
                .iter()
                .filter_map(|(id, r)| renter_view(*id, r))
                .map(|v| self.with_resume(v)),
        );
        views
    }

    /// A renter's view with its place in a resume chain, when it has one.
    fn with_resume(&self, mut view: LeaseView) -> LeaseView {
        if let Ok(id) = view.lease.parse::<ContentId>()
            && let Ok(Some(record)) = self.state.resume(&id)
        {
            view.resume = Some(resume_view(&record));
        }
        view
    }

    fn lease_view(&self, lease: &ContentId) -> Result<LeaseView, ApiError> {
        let store = |e: crate::store::StoreError| ApiError::internal(e.to_string());
        if let Some(record) = self.state.renter_lease(lease).map_err(store)? {
            return renter_view(*lease, &record)
                .map(|v| self.with_resume(v))
                .ok_or_else(|| ApiError::internal("the stored lease does not verify"));
        }
        if let Some(record) = self.state.host_lease(lease).map_err(store)? {
            return host_view(*lease, &record)
                .ok_or_else(|| ApiError::internal("the stored lease does not verify"));
        }
        Err(unknown(lease))
    }

    fn logs(&self, lease: &str, from: u64) -> Result<LogsPage, ApiError> {
        let lease = parse_lease(lease)?;
        let view = self.lease_view(&lease)?;
        let chunks = self
            .state
            .logs(&lease, from)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let next = chunks.last().map_or(from, |(seq, _)| seq + 1);
        let text: String = chunks
            .iter()
            .map(|(_, data)| String::from_utf8_lossy(data).into_owned())
            .collect();
        Ok(LogsPage {
            text,
            next,
            ended: view.end.is_some() || view.settled,
        })
    }

    fn receipts(&self, lease: &str) -> Result<Receipts, ApiError> {
        let lease = parse_lease(lease)?;
        let view = self.lease_view(&lease)?;
        let receipts = self
            .state
            .receipts(&lease)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let receipts = receipts
            .iter()
            .filter_map(|(receipt, ack)| {
                let r = Signed::<UsageReceipt>::from_bytes(receipt.clone())
                    .and_then(Signed::verify)
                    .ok()?;
                Some(ReceiptView {
                    seq: r.seq,
                    created_at: r.created_at.0,
                    gpu_seconds: r.gpu_seconds,
                    amount_due: r.amount_due.amount_text(),
                    amount_due_micro: r.amount_due.0,
                    workspace_charge_micro: r.workspace_charge.0,
                    memory_peak_bytes: r.usage.memory_peak_bytes,
                    gpu_util_permille: r.usage.gpu_util_permille,
                    gpu_memory_peak_bytes: r.usage.gpu_memory_peak_bytes,
                    cpu_millis_avg: r.usage.cpu_millis_avg,
                    acked: ack.is_some(),
                })
            })
            .collect();
        Ok(Receipts {
            receipts,
            lease: view,
        })
    }

    fn stop(&mut self, lease: &str) -> Result<gpux_api::Stopping, ApiError> {
        let lease = parse_lease(lease)?;
        if self.state.renter_lease(&lease).ok().flatten().is_none()
            && self.state.host_lease(&lease).ok().flatten().is_some()
        {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                "this node hosts that lease; the renter stops it",
            ));
        }
        self.renter.stop(lease)
    }

    fn block(&mut self, request: &gpux_api::BlockRequest) -> Result<gpux_api::Blocked, ApiError> {
        let host = request
            .host
            .parse::<gpux_protocol::PeerId>()
            .map_err(|e| ApiError::bad_input(format!("host: {e}")))?
            .public_key();
        let changed = self.reach.set_blocked(host, request.blocked);
        let hosts: Vec<String> = self
            .reach
            .blocked()
            .map(|k| k.peer_id().to_string())
            .collect();
        if changed {
            // Flushed: a block is the user's decision and survives a restart.
            self.state
                .set_config(BLOCKED_KEY, hosts.join("\n").as_bytes())
                .map_err(|e| ApiError::internal(e.to_string()))?;
        }
        Ok(gpux_api::Blocked { hosts, changed })
    }

    fn ledger_totals(&self) -> Result<LedgerTotals, ApiError> {
        if let Some(cluster) = &self.ledger_cluster {
            let mut totals = cluster.state().read(|m| totals(m.ledger()));
            totals.cluster = Some(cluster.view());
            return Ok(totals);
        }
        let service = self.ledger_service.as_ref().ok_or_else(|| {
            ApiError::new(ErrorCode::Conflict, "this node does not serve a ledger")
        })?;
        Ok(totals(service.ledger()))
    }

    /// Takes back a member of this node's replicated ledger that lost its store.
    fn readd(
        &self,
        request: gpux_api::ReaddRequest,
        reply: tokio::sync::oneshot::Sender<Result<gpux_api::Readded, ApiError>>,
    ) {
        let Some(cluster) = self.ledger_cluster.clone() else {
            let _ = reply.send(Err(ApiError::new(
                ErrorCode::Conflict,
                "this node is not a member of a replicated ledger",
            )));
            return;
        };
        tokio::spawn(async move {
            let result = match request.peer.parse::<libp2p::PeerId>() {
                Err(e) => Err(ApiError::bad_input(format!("peer: {e}"))),
                Ok(peer) => match cluster.readd(peer).await {
                    Ok(node_id) => Ok(gpux_api::Readded {
                        peer: request.peer.clone(),
                        node_id,
                    }),
                    Err(crate::ledger::cluster::ClusterError::NotLeader) => Err(ApiError::new(
                        ErrorCode::Conflict,
                        "this member is not the ledger's leader",
                    )
                    .with_hint("run it on the leader (`gpux ledger status` says which)")),
                    Err(e) => Err(ApiError::new(ErrorCode::Unavailable, e.to_string())),
                },
            };
            let _ = reply.send(result);
        });
    }
}

/// The totals of a ledger's state.
fn totals(ledger: &gpux_market::Ledger) -> LedgerTotals {
    LedgerTotals {
        minted_micro: ledger.minted().0,
        total_micro: u64::try_from(ledger.total()).unwrap_or(u64::MAX),
        balances: ledger
            .accounts()
            .map(|(k, b)| (k.peer_id().to_string(), b.0))
            .collect(),
        escrows: ledger.escrows().count(),
        open_escrows: ledger.escrows().filter(|(_, e)| !e.released).count(),
        cluster: None,
    }
}

impl Daemon {
    /// One API command.
    pub(super) fn on_api(&mut self, command: ApiCommand) {
        match command {
            ApiCommand::Status { reply } => {
                let _ = reply.send(Ok(self.status()));
            }
            ApiCommand::Search {
                query,
                limit,
                reply,
            } => {
                match self.followed(&query) {
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                    // Families just followed: their hosts republish for the new
                    // subscriber; the search is answered once their offers are in.
                    Ok(true) => {
                        return self.after_following(ApiCommand::Search {
                            query,
                            limit,
                            reply,
                        });
                    }
                    Ok(false) => {}
                }
                let t = now();
                let hits = self.market.search(&query, limit, t).map(|mut hits| {
                    for hit in &mut hits {
                        hit.reach = self.reach.state(&hit.host, t);
                        hit.interruption_permille = self.reach.interruption(&hit.host, t);
                    }
                    hits
                });
                let _ = reply.send(hits);
            }
            ApiCommand::Leases { reply } => {
                let _ = reply.send(Ok(self.lease_views()));
            }
            ApiCommand::Rent { request, reply } => self.start_rent(*request, reply),
            ApiCommand::RentProgress { name, reply } => {
                let _ = reply.send(self.rent_progress.get(&name).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::UnknownLease,
                        "no rent under way by that name (it has not begun, or ended long ago)",
                    )
                }));
            }
            ApiCommand::Group { request, reply } => self.start_group(*request, reply),
            ApiCommand::ScaleGroup {
                group,
                delta,
                reply,
            } => self.scale_group(&group, delta, reply),
            ApiCommand::Bid { request, reply } => {
                // A standing bid fills from the offers of its families: follow them.
                if let Err(e) = self.followed(&request.query) {
                    let _ = reply.send(Err(e));
                    return;
                }
                self.place_bid(*request, reply);
            }
            ApiCommand::Bids { reply } => {
                let _ = reply.send(Ok(self.bid_views()));
            }
            ApiCommand::CancelBid { bid, reply } => {
                let _ = reply.send(self.cancel_bid(&bid));
            }
            ApiCommand::Logs { lease, from, reply } => {
                let _ = reply.send(self.logs(&lease, from));
            }
            ApiCommand::Receipts { lease, reply } => {
                let _ = reply.send(self.receipts(&lease));
            }
            ApiCommand::Stop { lease, reply } => {
                let _ = reply.send(self.stop(&lease));
            }
            ApiCommand::Commit { lease, reply } => {
                let _ = reply.send(parse_lease(&lease).and_then(|id| self.renter.commit(id)));
            }
            ApiCommand::Challenge { lease, reply } => match parse_lease(&lease) {
                Ok(id) => self.challenge_running(id, reply),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ApiCommand::Balance { reply } => {
                let ledger = self.ledger.clone();
                let account = self.key.public();
                tokio::spawn(async move {
                    let result = match ledger {
                        Some(ledger) => ledger
                            .balance(account)
                            .await
                            .map(|b| Balance {
                                account: account.peer_id().to_string(),
                                balance: b.amount_text(),
                                balance_micro: b.0,
                            })
                            .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string())),
                        None => Err(ApiError::new(
                            ErrorCode::Conflict,
                            "this node has no ledger configured",
                        )
                        .with_hint("start it with --ledger, or set `ledger` in config.toml")),
                    };
                    let _ = reply.send(result);
                });
            }
            ApiCommand::Mint { request, reply } if request.grant.is_some() => {
                self.mint_grant(request, reply);
            }
            ApiCommand::Mint { request, reply } if self.ledger_cluster.is_some() => {
                self.mint_in_cluster(request, reply);
            }
            ApiCommand::Mint { request, reply } => {
                let _ = reply.send(self.mint(&request));
            }
            ApiCommand::Ledger { reply } => {
                let _ = reply.send(self.ledger_totals());
            }
            ApiCommand::LedgerReadd { request, reply } => self.readd(request, reply),
            ApiCommand::Block { request, reply } => {
                let _ = reply.send(self.block(&request));
            }
            ApiCommand::Follow { request, reply } => {
                let _ = reply.send(self.follow(&request));
            }
            ApiCommand::Settings { change, reply } => {
                let result = match change {
                    Some(change) => self.change_setting(&change),
                    None => Ok(self.settings()),
                };
                let _ = reply.send(result);
            }
            // Handled by the loop.
            ApiCommand::Shutdown { .. } => {}
        }
    }
}

/// Where the hosts blocked by hand are kept (peer ids, one per line).
const BLOCKED_KEY: &str = "blocked-hosts";
/// How long a search of families just followed waits for their hosts' offers (hosts
/// republish for a new subscriber within a few seconds).
const FOLLOW_SETTLE: std::time::Duration = std::time::Duration::from_secs(3);
/// When nothing matches by then (a busy network, a host slow to republish), how long it
/// goes on waiting for a first match, looking every [`FOLLOW_POLL`].
const FOLLOW_MAX: std::time::Duration = std::time::Duration::from_secs(15);
/// See [`FOLLOW_MAX`].
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// The hosts blocked by hand, from the store (an unreadable entry is skipped, with a word).
pub(super) fn blocked_hosts(
    state: &crate::store::NodeState<crate::store::SledStore>,
) -> Vec<gpux_protocol::PublicKey> {
    let text = state.config(BLOCKED_KEY).ok().flatten().unwrap_or_default();
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| !l.is_empty())
        .filter_map(|l| match l.parse::<gpux_protocol::PeerId>() {
            Ok(peer) => Some(peer.public_key()),
            Err(e) => {
                tracing::warn!("a blocked host '{l}' is unreadable: {e}");
                None
            }
        })
        .collect()
}

impl Daemon {
    /// Refuses a query for families this node does not follow (`--market-families`): its
    /// book has none of their offers, so an empty answer would mislead.
    /// Whether this node follows the families `query` names: `Ok(false)` when it does,
    /// `Ok(true)` when it has just started to (`--market-families auto`), an error that says
    /// how to follow them otherwise.
    pub(super) fn followed(&mut self, query: &str) -> Result<bool, ApiError> {
        let Some(followed) = &self.families else {
            return Ok(false);
        };
        let Ok(parsed) = gpux_market::query::Query::parse(query) else {
            // The search itself says what is wrong with it.
            return Ok(false);
        };
        let wanted = parsed.families();
        if self.families_auto {
            let follow = match &wanted {
                // A query of every family follows every family.
                None => None,
                Some(wanted) if wanted.is_subset(followed) => return Ok(false),
                Some(wanted) => Some(followed.union(wanted).copied().collect()),
            };
            tracing::info!(
                "following the offers of {} (--market-families auto)",
                follow.as_ref().map_or(
                    "every family".to_string(),
                    |set: &std::collections::BTreeSet<gpux_protocol::GpuFamily>| set
                        .iter()
                        .map(|f| f.key())
                        .collect::<Vec<_>>()
                        .join(",")
                )
            );
            self.set_following(follow);
            return Ok(true);
        }
        let Some(wanted) = wanted else {
            return Ok(false);
        };
        let outside: Vec<&str> = wanted
            .iter()
            .filter(|f| !followed.contains(f))
            .map(|f| f.key())
            .collect();
        if outside.is_empty() {
            return Ok(false);
        }
        let keys = |set: &mut dyn Iterator<Item = &str>| set.collect::<Vec<_>>().join(",");
        let all: Vec<&str> = followed
            .iter()
            .map(|f| f.key())
            .chain(outside.iter().copied())
            .collect();
        Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "this node follows only the offers of {} (--market-families); {} is outside them",
                keys(&mut followed.iter().map(|f| f.key())),
                keys(&mut outside.iter().copied())
            ),
        )
        .with_hint(format!(
            "`gpux offers follow {}` follows it now; --market-families {} at the next start",
            outside.join(" "),
            all.join(",")
        )))
    }

    /// Takes `command` again once the families just followed have had time to arrive (their
    /// hosts republish for a new subscriber).
    pub(super) fn after_following(&self, command: ApiCommand) {
        let until = std::time::Instant::now() + FOLLOW_MAX;
        self.defer(Box::new(command), until, FOLLOW_SETTLE);
    }

    fn defer(&self, command: Box<ApiCommand>, until: std::time::Instant, by: std::time::Duration) {
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(by).await;
            let _ = events.send(Event::Deferred(command, until)).await;
        });
    }

    /// A deferred command comes back: answered now, unless its query still matches nothing
    /// and it may wait longer.
    pub(super) fn deferred(&mut self, command: Box<ApiCommand>, until: std::time::Instant) {
        let query = match &*command {
            ApiCommand::Search { query, .. } => Some(query.as_str()),
            ApiCommand::Rent { request, .. } | ApiCommand::Group { request, .. } => {
                Some(request.query.as_str())
            }
            _ => None,
        };
        let nothing = query.is_some_and(|q| {
            self.market
                .search(q, 1, now())
                .is_ok_and(|hits| hits.is_empty())
        });
        if nothing && std::time::Instant::now() < until {
            return self.defer(command, until, FOLLOW_POLL);
        }
        self.on_api(*command);
    }

    /// Subscribes to the topics of `families` (None: every family) from now on.
    fn set_following(
        &mut self,
        families: Option<std::collections::BTreeSet<gpux_protocol::GpuFamily>>,
    ) {
        self.families = families.clone();
        let net = self.net.clone();
        tokio::spawn(async move {
            if let Err(e) = net.follow(families).await {
                tracing::warn!("following the market's families: {e}");
            }
        });
    }

    /// Follows more families (or every family) from now on: subscribed at once, and the
    /// hosts that offer them republish for the new subscriber. Until the next restart, which
    /// takes the configured set again.
    fn follow(
        &mut self,
        request: &gpux_api::FollowRequest,
    ) -> Result<gpux_api::Following, ApiError> {
        let mut added = std::collections::BTreeSet::new();
        for key in &request.add {
            let family = key
                .trim()
                .parse::<gpux_protocol::GpuFamily>()
                .map_err(|e| ApiError::bad_input(format!("{key}: {e}")))?;
            added.insert(family);
        }
        if !request.all && added.is_empty() {
            return Err(ApiError::bad_input(
                "name a family to follow, or every family",
            ));
        }
        let families = match (&self.families, request.all) {
            (_, true) | (None, false) => None,
            (Some(now), false) => Some(now.union(&added).copied().collect()),
        };
        self.set_following(families);
        Ok(gpux_api::Following {
            families: self
                .families
                .as_ref()
                .map(|set| set.iter().map(|f| f.key().to_string()).collect()),
        })
    }

    /// What `/metrics` reports of this node now (the leases from the store: a scrape is
    /// rare next to the loop's work).
    pub(super) fn metrics_snapshot(&self) -> crate::metrics::Snapshot {
        let mut leases = std::collections::BTreeMap::new();
        let (mut earned_micro, mut spent_micro) = (0u64, 0u64);
        let hosted = self.state.host_leases().unwrap_or_default();
        for view in hosted.iter().filter_map(|(id, r)| host_view(*id, r)) {
            *leases.entry(("host", view.phase, view.kind)).or_insert(0) += 1;
            earned_micro = earned_micro.saturating_add(view.redeemed);
        }
        let rented = self.renter.records();
        for view in rented.iter().filter_map(|(id, r)| renter_view(*id, r)) {
            *leases.entry(("renter", view.phase, view.kind)).or_insert(0) += 1;
            spent_micro = spent_micro.saturating_add(view.acked_amount);
        }
        crate::metrics::Snapshot {
            peers: self.peers.len(),
            offers: self
                .market
                .book
                .count_by_family()
                .into_iter()
                .map(|(f, n)| (f.to_string(), n))
                .collect(),
            gossip: vec![
                ("accepted", self.market.accepted),
                ("rejected", self.market.rejected),
                ("ignored", self.market.ignored),
                ("over-budget", self.market.over_budget),
            ],
            leases,
            earned_micro,
            spent_micro,
            gpus: self.host.as_ref().and_then(|h| h.metrics_gpus()),
            cluster: self.ledger_cluster.as_ref().map(|c| c.view()),
        }
    }
}
