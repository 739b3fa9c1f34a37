//! The host role: its book ([`gpux_lease::HostBook`]), one [`HostLease`] machine per lease,
//! and the effects runner that alone carries out what they decide: the store, the
//! executor (through each lease's [`worker`]), the renter's link and the ledger.

mod faults;
mod live;
mod offers;

pub(crate) use live::NAMES as LIVE_SETTINGS;
mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use gpux_lease::{
    Answer, ContainerState, HostBook, HostEffect, HostInput, HostLease, HostPhase, RenterAnswer,
    Timing,
};
use gpux_protocol::{
    AnySigned, AnyVerified, Attestation, BoundedString, ContentId, EscrowLock, Ext, Keypair,
    LeaseEnd, LeaseReject, LeaseRequest, RejectReason, Signed, Timestamp, Verified,
};
use tokio::sync::mpsc;

use super::{Event, HostOptions, report, schedule};
use crate::attest::now;
use crate::executor::{Executor, Workspaces};
use crate::ledger::LedgerClient;
use crate::p2p::{Client, InboundId, Proto};
use crate::plane::stage_host::StageHost;
use crate::plane::staged::StagedImages;
use crate::store::{NodeState, SledStore};
use worker::{ExecOp, PEER_TIMEOUT, WorkerCtx};

/// The host role.
pub(crate) struct HostRole {
    key: Keypair,
    state: NodeState<SledStore>,
    net: Client,
    events: mpsc::Sender<Event>,
    ledger: LedgerClient,
    options: HostOptions,
    book: HostBook,
    attestation: Option<Verified<Attestation>>,
    /// Leases not yet settled.
    leases: BTreeMap<ContentId, HostLease>,
    /// Escrow-lock requests waiting for their lease's answer.
    pending_locks: BTreeMap<ContentId, InboundId>,
    workers: BTreeMap<ContentId, mpsc::UnboundedSender<ExecOp>>,
    worker_ctx: WorkerCtx,
    pub(crate) publish_pending: bool,
    /// This host's devices with a passed challenge held by this node's validator: their
    /// offers claim the `challenged` tier (set by the daemon before each publication).
    pub(crate) challenged: std::collections::BTreeSet<gpux_protocol::GpuUuid>,
    pub(crate) last_publish: Timestamp,
    /// Counts for `/metrics`.
    recorder: crate::metrics::Recorder,
    /// The images pulled without credentials that this host keeps (its offers list them).
    pull_cache: crate::plane::pulled::PullCache,
}

fn verify<T: gpux_protocol::Message>(bytes: &[u8]) -> Option<Verified<T>> {
    Signed::<T>::from_bytes(bytes.to_vec())
        .and_then(Signed::verify)
        .ok()
}

impl HostRole {
    /// Connects to Docker, attests the GPUs, restores the stored offers and leases, and
    /// resumes or ends each lease according to what became of its container.
    pub(crate) async fn start(
        key: Keypair,
        state: NodeState<SledStore>,
        net: Client,
        events: mpsc::Sender<Event>,
        ledger: LedgerClient,
        mut options: HostOptions,
        (timing, recorder): (Timing, crate::metrics::Recorder),
    ) -> anyhow::Result<Self> {
        let exec = Executor::connect(&key.peer_id().to_string())
            .await
            .context("a host runs leases in Docker")?;
        if options.disk_quota_bytes > 0 && !Workspaces::supported() {
            tracing::warn!(
                "workspaces need root and mkfs.ext4: this host offers none (leases asking for --disk are refused)"
            );
            options.disk_quota_bytes = 0;
        }
        let staged = StagedImages::open(&options.staging_root)?;
        let pull_cache =
            crate::plane::pulled::PullCache::open(&options.staging_root, options.pull_cache_bytes)?;
        if options.images.is_empty() {
            // Every image Docker has, but none a renter staged (those are its alone) and
            // none pulled for a renter (the cache lists those).
            let renters = staged.renter_images();
            let cached = pull_cache.images();
            options.images = exec
                .list_images()
                .await
                .context("listing the host's images")?
                .into_iter()
                .filter(|i| !renters.contains(i) && !cached.contains(i))
                .collect();
        }
        options.image_tags = exec
            .image_tags()
            .await
            .context("listing the host's image tags")?;
        options.machine = crate::machine::MachineFacts::read(options.cpus, options.memory_bytes);
        {
            // The workspace disk's speed, in the background: the next publication says it.
            let (machine, dir) = (options.machine.clone(), options.workspace_root.clone());
            tokio::task::spawn_blocking(move || match crate::machine::measure_disk_write(&dir) {
                Ok(mbps) => machine.set_disk_write_mbps(mbps),
                Err(e) => tracing::warn!("measuring the workspace disk's speed: {e}"),
            });
        }
        let nvml = match gpux_attestation::Probe::open(options.nvml_lib.as_deref()) {
            Ok(probe) => {
                let probe = Arc::new(probe);
                faults::spawn_xid_watch(probe.clone(), events.clone());
                Some(probe)
            }
            Err(e) => {
                tracing::warn!("no NVML for metering GPU use: {e}");
                None
            }
        };
        let attestation = {
            let key = key.clone();
            let lib = options.nvml_lib.clone();
            tokio::task::spawn_blocking(move || crate::attest::attest(&key, lib.as_deref(), now()))
                .await
                .context("the probe task failed")??
        };
        let workspaces = Workspaces::new(options.workspace_root.clone());
        crate::plane::host::PlaneHost::spawn(
            &net,
            &key,
            state.clone(),
            exec.clone(),
            workspaces.clone(),
        )
        .context("serving the workload plane")?;
        StageHost::spawn(
            &net,
            exec.clone(),
            staged.clone(),
            options.staging_root.clone(),
            options.max_image_bytes,
            options.stage_quota_bytes,
        )
        .context("serving image staging")?;
        let pull_host = crate::plane::pull_host::PullHost {
            exec: exec.clone(),
            staged: staged.clone(),
            cache: pull_cache.clone(),
            policy: options.pulls.clone(),
            turns: crate::plane::turns::Turns::new(crate::plane::pull_host::MAX_PULLS),
        };
        pull_host.spawn(&net).context("serving image pulls")?;
        crate::plane::challenge::ChallengeHost {
            key: key.clone(),
            state: state.clone(),
            exec: exec.clone(),
            fake_gpus: options.fake_gpus,
            fakes: std::sync::Arc::new(if options.fake_gpus {
                crate::plane::challenge::fake_gpus()
            } else {
                Default::default()
            }),
            busy: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
        }
        .spawn(&net)
        .context("serving performance challenges")?;
        let worker_ctx = WorkerCtx {
            key: key.clone(),
            net: net.clone(),
            exec: exec.clone(),
            events: events.clone(),
            fake_gpus: options.fake_gpus,
            nvml,
            workspaces: workspaces.clone(),
            max_retain_s: options.max_retain_s,
            staged,
            run_root: options.run_root.clone(),
            live: Arc::default(),
        };
        let mut role = Self {
            book: HostBook::new(key.clone(), timing),
            key,
            state,
            net,
            events,
            ledger,
            options,
            attestation: Some(attestation),
            leases: BTreeMap::new(),
            pending_locks: BTreeMap::new(),
            workers: BTreeMap::new(),
            worker_ctx,
            publish_pending: false,
            challenged: Default::default(),
            last_publish: Timestamp(0),
            recorder,
            pull_cache,
        };
        role.apply_stored_changes();
        role.load_failed_gpus();
        role.recover(&exec, &workspaces).await?;
        Ok(role)
    }

    /// After a restart: every stored lease not settled is restored with what its container
    /// became; containers of this node that belong to no open lease are erased.
    async fn recover(&mut self, exec: &Executor, workspaces: &Workspaces) -> anyhow::Result<()> {
        let t = now();
        let containers = exec
            .containers()
            .await
            .context("listing this host's containers")?;
        let mut restored = Vec::new();
        let mut answered = Vec::new();
        for (id, record) in self.state.host_leases()? {
            if let Some(request) = verify::<LeaseRequest>(&record.request) {
                answered.push((id, request.expires_at));
            }
            if record.phase == HostPhase::Settled {
                continue;
            }
            let hex = gpux_protocol::hex(&id.0);
            let container = containers
                .iter()
                .find(|(l, _)| *l == hex)
                .map(|(_, c)| c.clone());
            // A challenge cut short by the restart may have left the workload frozen.
            if let Some(c) = &container
                && let Err(e) = exec.unpause(c).await
            {
                tracing::warn!("lease {}: unpausing after restart: {e}", id.short());
            }
            let observed = match &container {
                Some(c) => match exec.inspect(c).await.ok().flatten() {
                    Some(info) if info.running => ContainerState::Running {
                        started_at: Timestamp(info.started_at_ms.unwrap_or(t.0)),
                    },
                    Some(info) => ContainerState::Exited {
                        started_at: info.started_at_ms.map(Timestamp),
                        finished_at: info.finished_at_ms.map(Timestamp),
                        exit_code: info.exit_code,
                    },
                    None => ContainerState::Absent,
                },
                None => ContainerState::Absent,
            };
            let (lease, effects) = match HostLease::restore(self.key.clone(), record, observed, t) {
                Ok(restored) => restored,
                Err(e) => {
                    tracing::error!("lease {}: {e}; left as it is", id.short());
                    continue;
                }
            };
            let what = if lease.phase() == HostPhase::Running {
                "resuming"
            } else {
                "ending"
            };
            tracing::info!(
                "lease {}: {what} after restart ({:?})",
                id.short(),
                lease.phase()
            );
            let worker = worker::spawn(
                self.worker_ctx.clone(),
                lease.request().clone(),
                container,
                lease.record().log_cursor.as_deref(),
                lease.record().log_chunks,
            );
            if matches!(observed, ContainerState::Running { .. })
                && lease.phase() == HostPhase::Running
            {
                let _ = worker.send(ExecOp::Watch);
            }
            self.workers.insert(id, worker);
            self.leases.insert(id, lease);
            restored.push((id, effects));
        }
        let offers = self
            .state
            .own_offers()?
            .into_iter()
            .filter_map(|b| verify(&b))
            .collect();
        self.book.restore(offers, self.leases.values(), answered, t);
        // Staged images of leases that ended while the host was down.
        self.worker_ctx
            .staged
            .release(|l| self.leases.contains_key(l), t.0);
        for (id, effects) in restored {
            self.apply(id, effects);
        }
        for (lease, container) in containers {
            let open = gpux_protocol::unhex(&lease)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .is_some_and(|b| self.leases.contains_key(&ContentId(b)));
            if !open {
                tracing::info!("erasing container {container} of closed lease {lease}");
                let _ = exec.stop(&container, 0).await;
                let _ = exec.remove(&container).await;
            }
        }
        for lease in workspaces.leases() {
            let open = gpux_protocol::unhex(&lease)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .is_some_and(|b| self.leases.contains_key(&ContentId(b)));
            if open {
                continue;
            }
            match workspaces.retained_until(&lease) {
                Some(until) if until > now().0 => {
                    tracing::info!("lease {lease}: keeping its workspace until {until} (unix ms)");
                    workspaces.erase_at(&lease, until);
                }
                _ => {
                    tracing::info!("erasing the workspace of closed lease {lease}");
                    if let Err(e) = workspaces.remove(&lease).await {
                        tracing::error!("lease {lease}: erasing its workspace: {e}");
                    }
                }
            }
        }
        Ok(())
    }

    /// How often offers are re-published, seconds.
    pub(crate) fn republish_s(&self) -> u64 {
        self.options.republish_s.max(1)
    }

    /// This host's current offers.
    pub(crate) fn offer_count(&self) -> usize {
        self.book.offers().len()
    }

    /// Whether a lease still runs or settles.
    pub(crate) fn busy(&self) -> bool {
        self.leases
            .values()
            .any(|l| !matches!(l.phase(), HostPhase::Settled))
            || self
                .worker_ctx
                .live
                .load(std::sync::atomic::Ordering::SeqCst)
                > 0
    }

    /// Whether a lease is between its lock and its start (its renter waits for the start's
    /// answer from this process); a lease whose start waits for its booking or its
    /// renter's commit stays booked across a restart and is not waited for.
    pub(crate) fn starting(&self) -> bool {
        self.leases.values().any(|l| {
            matches!(l.phase(), HostPhase::Locking | HostPhase::Starting) && !l.start_waits()
        })
    }

    /// Leases not settled.
    pub(crate) fn open_count(&self) -> usize {
        self.leases.len()
    }

    /// The stored record of every hosted lease, settled or not.
    pub(crate) fn records(&self) -> Vec<(ContentId, gpux_lease::HostRecord)> {
        self.state.host_leases().unwrap_or_default()
    }

    fn reject(&self, lease: ContentId, reason: RejectReason, detail: &str) -> Vec<u8> {
        let body = LeaseReject {
            request: lease,
            created_at: now(),
            reason,
            detail: BoundedString::new(detail.chars().take(200).collect::<String>())
                .unwrap_or_default(),
            ext: Ext::new(),
        };
        Signed::sign(&self.key, body)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default()
    }

    /// Why this host cannot give `request` the workspace it asks for, if it cannot: the
    /// size is above what the quota leaves after the open leases' workspaces.
    fn workspace_refusal(&self, request: &LeaseRequest) -> Option<String> {
        let bytes = match request.workspace_bytes() {
            Ok(None) => return None,
            Ok(Some(bytes)) => bytes,
            Err(e) => return Some(format!("the workspace term: {e}")),
        };
        if self.options.disk_quota_bytes == 0 {
            return Some("this host offers no workspaces".into());
        }
        if bytes < crate::executor::MIN_WORKSPACE_BYTES {
            return Some(format!(
                "a workspace has at least {} bytes",
                crate::executor::MIN_WORKSPACE_BYTES
            ));
        }
        let left = self.workspace_free();
        if bytes > left {
            return Some(format!(
                "a workspace of {bytes} bytes does not fit: {left} of this host's {} are free",
                self.options.disk_quota_bytes
            ));
        }
        // The quota may promise more than the disk holds now: a workspace is allocated in
        // full, so the disk must back it beside the open leases' workspaces not made yet.
        let workspaces = &self.worker_ctx.workspaces;
        let unmade: u64 = self
            .leases
            .iter()
            .filter(|(id, _)| workspaces.allocated(&gpux_protocol::hex(&id.0)) == 0)
            .filter_map(|(_, l)| l.request().workspace_bytes().ok().flatten())
            .sum();
        match workspaces.disk_free() {
            Ok(free) if bytes > free.saturating_sub(unmade) => Some(format!(
                "a workspace of {bytes} bytes does not fit on this host's disk: {} bytes are free",
                free.saturating_sub(unmade)
            )),
            Ok(_) => None,
            Err(e) => Some(format!("the workspace disk: {e}")),
        }
    }

    /// What the disk quota leaves for a new workspace, bytes.
    fn workspace_free(&self) -> u64 {
        // Open leases' workspaces (made or to be made), and those kept after their lease.
        let open: u64 = self
            .leases
            .values()
            .filter_map(|l| l.request().workspace_bytes().ok().flatten())
            .sum();
        let retained: u64 = self
            .worker_ctx
            .workspaces
            .leases()
            .iter()
            .filter(|hex| {
                !self
                    .leases
                    .keys()
                    .any(|id| gpux_protocol::hex(&id.0) == **hex)
            })
            .map(|hex| self.worker_ctx.workspaces.bytes(hex))
            .sum();
        self.options
            .disk_quota_bytes
            .saturating_sub(open + retained)
    }

    /// A renter's lease request: the signed answer, and whether a lease was made.
    pub(crate) fn on_lease_request(
        &mut self,
        request: Verified<LeaseRequest>,
        now: Timestamp,
    ) -> (Vec<u8>, bool) {
        if let Some(why) = self.workspace_refusal(&request) {
            return (
                self.reject(request.id(), RejectReason::LimitsTooHigh, &why),
                false,
            );
        }
        let staged = self
            .worker_ctx
            .staged
            .held(&request.image, &request.signer());
        match self.book.handle_request(request, now, staged) {
            Answer::Accepted {
                lease,
                effects,
                envelope,
                preempts: _,
            } => {
                let id = lease.id();
                if staged {
                    // Kept while the lease lasts (and cached after, if the renter asked).
                    let request = lease.request();
                    let cache = request.cache_image().unwrap_or(false);
                    self.worker_ctx
                        .staged
                        .attach(&request.image, &request.signer(), id, cache);
                }
                // Stored (flushed) before the renter hears of it.
                if let Err(e) = self.state.save_host_lease(&id, lease.record()) {
                    tracing::error!("cannot store lease {}: {e}", id.short());
                    self.book.release(&id);
                    return (
                        self.reject(id, RejectReason::Invalid, "the host cannot store the lease"),
                        false,
                    );
                }
                let worker = worker::spawn(
                    self.worker_ctx.clone(),
                    lease.request().clone(),
                    None,
                    None,
                    0,
                );
                self.workers.insert(id, worker);
                self.leases.insert(id, *lease);
                self.apply(id, effects);
                (envelope, true)
            }
            Answer::Rejected { envelope, .. } => (envelope, false),
        }
    }

    /// A renter's escrow lock: answered by the lease (now, or once the container runs).
    pub(crate) fn on_lock(&mut self, id: InboundId, lock: Verified<EscrowLock>) -> Option<Vec<u8>> {
        let lease = lock.lease;
        if !self.leases.contains_key(&lease) {
            return Some(self.reject(
                lease,
                RejectReason::Invalid,
                "no accepted lease waits for this escrow",
            ));
        }
        self.pending_locks.insert(lease, id);
        self.on_input(lease, HostInput::Lock(lock));
        None
    }

    /// A renter's `LeaseEnd`.
    pub(crate) fn on_renter_end(&mut self, end: Verified<LeaseEnd>) {
        self.on_input(end.lease, HostInput::RenterEnd(end));
    }

    /// A renter's commit: the lease checks it is its renter's, in time.
    pub(crate) fn on_commit(&mut self, commit: Verified<gpux_protocol::LeaseCommit>) {
        self.on_input(commit.lease, HostInput::Commit(commit));
    }

    /// Every lease ends (the host is stopping).
    pub(crate) fn shutdown_all(&mut self) {
        let ids: Vec<ContentId> = self.leases.keys().copied().collect();
        for id in ids {
            self.on_input(id, HostInput::Shutdown);
        }
    }

    /// An input for lease `id`. Returns whether GPUs were freed (offers change).
    pub(crate) fn on_input(&mut self, id: ContentId, input: HostInput) -> bool {
        let Some(lease) = self.leases.get_mut(&id) else {
            return false;
        };
        let effects = lease.handle(now(), input);
        self.apply(id, effects)
    }

    /// Carries out a lease's effects, in order. Returns whether GPUs were freed.
    fn apply(&mut self, id: ContentId, effects: Vec<HostEffect>) -> bool {
        let mut freed = false;
        let mut preempt = Vec::new();
        for effect in effects {
            let Some(lease) = self.leases.get(&id) else {
                return freed;
            };
            match effect {
                HostEffect::Persist => {
                    if let Err(e) = self.state.save_host_lease(&id, lease.record()) {
                        // Nothing after an unstored step is carried out, and the node stops:
                        // a restart resumes from the last stored one.
                        crate::daemon::store_failed(
                            &self.events,
                            format!("cannot store lease {}: {e}", id.short()),
                        );
                        return freed;
                    }
                }
                HostEffect::Ledger { call, envelope } => {
                    let (ledger, events) = (self.ledger.clone(), self.events.clone());
                    tokio::spawn(async move {
                        let verdict = ledger.submit(envelope).await;
                        report(
                            &events,
                            Event::Host {
                                lease: id,
                                input: HostInput::Ledger { call, verdict },
                            },
                        )
                        .await;
                    });
                }
                HostEffect::AnswerLock { envelope, .. } => {
                    if let Some(inbound) = self.pending_locks.remove(&id) {
                        let net = self.net.clone();
                        tokio::spawn(async move {
                            let _ = net.respond(inbound, envelope).await;
                        });
                    }
                }
                HostEffect::PrepareWorkspace => self.exec(id, ExecOp::Prepare),
                HostEffect::StartContainer => self.exec(id, ExecOp::Start),
                HostEffect::StopContainer { grace_s } => self.exec(id, ExecOp::Stop { grace_s }),
                HostEffect::EraseContainer => self.exec(id, ExecOp::Erase),
                HostEffect::SendReceipt { seq, envelope } => {
                    self.send_receipt(id, lease.request(), seq, envelope)
                }
                HostEffect::PreemptSpot { leases } => {
                    self.book.preempting_locked(&id);
                    preempt = leases;
                }
                HostEffect::Notify { envelope, ends_at } => {
                    tracing::info!("lease {}: preempted, ends at {ends_at}", id.short());
                    self.exec(id, ExecOp::Notify { ends_at });
                    self.send_to_renter(lease.request(), envelope);
                }
                HostEffect::SendEnd { envelope } => self.send_to_renter(lease.request(), envelope),
                HostEffect::Schedule { at, timer } => schedule(
                    &self.events,
                    at,
                    Event::Host {
                        lease: id,
                        input: HostInput::Timer(timer),
                    },
                ),
                HostEffect::FreeGpus => {
                    self.book.release(&id);
                    freed = true;
                }
            }
        }
        // The spot leases this lease preempts get their notice (after its own effects).
        if let Some(preemptor) = self.leases.get(&id).map(|l| l.request().clone()) {
            for spot in preempt {
                freed |= self.on_input(spot, HostInput::Preempt(Box::new(preemptor.clone())));
            }
        }
        if self
            .leases
            .get(&id)
            .is_some_and(|l| l.phase() == HostPhase::Settled)
        {
            self.leases.remove(&id);
            self.pending_locks.remove(&id);
            // The worker ends after its erasure (or with its queue).
            self.workers.remove(&id);
        }
        freed
    }

    /// Sends a message that expects no answer to the lease's renter, from a task of its own.
    fn send_to_renter(&self, request: &Verified<LeaseRequest>, envelope: Vec<u8>) {
        if let Some(renter) = peer_of(request) {
            let net = self.net.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    PEER_TIMEOUT,
                    net.request_on(Proto::Receipt, renter, envelope),
                )
                .await;
            });
        }
    }

    fn exec(&self, id: ContentId, op: ExecOp) {
        if let Some(worker) = self.workers.get(&id)
            && worker.send(op).is_err()
        {
            tracing::error!("lease {}: its container worker is gone", id.short());
        }
    }

    /// Sends a receipt (stored first, for `gpux receipts`); its answer comes back typed.
    fn send_receipt(
        &self,
        id: ContentId,
        request: &Verified<LeaseRequest>,
        seq: u64,
        envelope: Vec<u8>,
    ) {
        if let Err(e) = self.state.save_receipt(&id, seq, &envelope, None) {
            // Not sent: a receipt the host cannot keep is one it could not show or settle.
            // The lease ends (`store-failed`), settled on what the renter acknowledged.
            tracing::error!(
                "cannot store receipt {seq} of lease {}: {e}; the lease ends",
                id.short()
            );
            let events = self.events.clone();
            tokio::spawn(async move {
                let input = HostInput::StoreFailed;
                report(&events, Event::Host { lease: id, input }).await;
            });
            return;
        }
        self.recorder.receipt("sent");
        let Some(renter) = peer_of(request) else {
            return;
        };
        let (net, events, state) = (self.net.clone(), self.events.clone(), self.state.clone());
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(
                PEER_TIMEOUT,
                net.request_on(Proto::Receipt, renter, envelope.clone()),
            )
            .await;
            let answer = match sent {
                Ok(Ok(bytes)) => match AnySigned::from_bytes(bytes).and_then(AnySigned::verify) {
                    Ok(AnyVerified::ReceiptAck(ack)) => {
                        if let Err(e) =
                            state.save_receipt(&id, seq, &envelope, Some(ack.as_bytes()))
                        {
                            // The lease's own record takes the acknowledgement (the answer
                            // below); the copy for `gpux receipts` is lost, and the lease
                            // ends.
                            tracing::error!(
                                "cannot store the acknowledgement of receipt {seq} of lease {}: {e}; the lease ends",
                                id.short()
                            );
                            let (events, input) = (events.clone(), HostInput::StoreFailed);
                            tokio::spawn(async move {
                                report(&events, Event::Host { lease: id, input }).await;
                            });
                        }
                        recorder.receipt("acked");
                        RenterAnswer::Ack(ack)
                    }
                    Ok(AnyVerified::LeaseEnd(end)) => {
                        recorder.receipt("disputed");
                        RenterAnswer::Dispute(end)
                    }
                    _ => RenterAnswer::Nothing,
                },
                _ => RenterAnswer::Nothing,
            };
            report(
                &events,
                Event::Host {
                    lease: id,
                    input: HostInput::ReceiptAnswer { seq, answer },
                },
            )
            .await;
        });
    }

    /// This host's GPUs for `/metrics`: the NVML library it meters with (none: no GPU
    /// series), and the lease holding each device now.
    pub(crate) fn metrics_gpus(&self) -> Option<crate::metrics::HostGpus> {
        let probe = self.worker_ctx.nvml.clone()?;
        let leases = self
            .leases
            .iter()
            .filter(|(_, l)| l.holds_gpus())
            .flat_map(|(id, l)| {
                l.request()
                    .gpus
                    .iter()
                    .map(|g| (g.to_string(), id.to_string()))
                    .collect::<Vec<_>>()
            })
            .collect();
        Some(crate::metrics::HostGpus {
            probe,
            hostname: crate::metrics::hostname(),
            leases,
        })
    }
}

fn peer_of(request: &Verified<LeaseRequest>) -> Option<libp2p::PeerId> {
    libp2p::PeerId::from_bytes(&request.signer().peer_id().to_bytes()).ok()
}
