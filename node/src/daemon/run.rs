//! The host's side of a running lease: one task per lease starts (or finds) its container,
//! meters it every second, ships its output to the renter, signs a cumulative
//! `UsageReceipt` every receipt interval and redeems each acknowledged one at the ledger at
//! once, and at the end stops and erases the container, bills the exact runtime Docker
//! measured, and releases the rest of the escrow to the renter.
//!
//! Every step is stored (flushed) in the lease's [`RunRecord`] before it is acted on, so a
//! host killed at any point finds its containers by label on restart and resumes or ends
//! them. The host's loss is bounded by one receipt interval: it redeems every acknowledged
//! receipt immediately and stops the work when an acknowledgement is late by more than the
//! grace period.

use std::time::Duration;

use gpux_protocol::{
    AnySigned, AnyVerified, BoundedBytes, ContentId, EndReason, Ext, Keypair, LeaseEnd,
    LeaseRequest, LogChunk, LogStream, MicroCredits, Redeem, Release, Signed, Timestamp,
    UsageReceipt, UsageSummary, Verified, money,
};
use tokio::sync::mpsc;

use crate::attest::now;
use crate::executor::{ContainerSpec, Executor, GpuBinding, LogCursor};
use crate::ledger::{LedgerClient, SubmitResult};
use crate::p2p::{Client, Proto};
use crate::store::{LeaseState, NodeState, RunRecord, SledStore};

/// How long a request to the renter may take before it counts as unanswered.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// Most container output shipped per chunk.
const LOG_CHUNK_BYTES: usize = 32 * 1024;

/// Receipt timing.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    /// How often the host signs a receipt.
    pub receipt_interval: Duration,
    /// How long the host waits for an acknowledgement before it stops the lease; also how
    /// long a renter waits past an interval before it treats the host as gone.
    pub ack_grace: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            receipt_interval: Duration::from_secs(60),
            ack_grace: Duration::from_secs(30),
        }
    }
}

/// What a lease task needs from the node.
#[derive(Clone)]
pub(crate) struct RunCtx {
    pub(crate) key: Keypair,
    pub(crate) net: Client,
    pub(crate) state: NodeState<SledStore>,
    pub(crate) exec: Executor,
    pub(crate) ledger: LedgerClient,
    pub(crate) timing: LeaseTiming,
    pub(crate) fake_gpus: bool,
    /// NVML, for per-GPU utilisation and memory (fake or real driver alike).
    pub(crate) nvml: Option<std::sync::Arc<gpux_attestation::Probe>>,
    /// Told when a lease is over (its GPUs are free again).
    pub(crate) over_tx: mpsc::Sender<ContentId>,
}

/// A lease task's handle: ask it to end.
pub(crate) type StopTx = mpsc::Sender<EndReason>;

/// A lease being run.
pub(crate) struct Lease {
    pub(crate) request: Verified<LeaseRequest>,
    pub(crate) run: RunRecord,
}

impl Lease {
    fn id(&self) -> ContentId {
        self.request.id()
    }

    fn renter(&self) -> Result<libp2p::PeerId, String> {
        libp2p::PeerId::from_bytes(&self.request.signer().peer_id().to_bytes())
            .map_err(|e| e.to_string())
    }

    fn spec(&self, fake: bool) -> ContainerSpec {
        let r = &self.request;
        ContainerSpec {
            lease: gpux_protocol::hex(&r.id().0),
            image: r.image,
            command: r.command.iter().map(|s| s.to_string()).collect(),
            env: r
                .env
                .iter()
                .map(|v| (v.name.to_string(), v.value.to_string()))
                .collect(),
            memory_bytes: r.limits.memory_bytes,
            cpu_millis: r.limits.cpu_millis,
            pids: r.limits.pids,
            scratch_bytes: r.limits.scratch_bytes,
            network: r.network,
            gpus: if fake {
                GpuBinding::Fake
            } else {
                GpuBinding::Real(r.gpus.iter().map(ToString::to_string).collect())
            },
        }
    }
}

/// Billed GPU-seconds for `runtime_ms` of work: whole seconds (rounded down, in the renter's
/// favour), at least the minimum, at most the agreed duration.
pub(crate) fn gpu_seconds(request: &LeaseRequest, runtime_ms: u64) -> u64 {
    let secs = money::billed_seconds((runtime_ms / 1000).min(u64::from(request.duration_s)));
    (request.gpus.len() as u64) * secs
}

impl RunCtx {
    /// Stores a lease's run record (flushed); a failure is logged.
    pub(crate) fn save(&self, run: &RunRecord) {
        if let Err(e) = self.state.save_run(run) {
            tracing::error!("cannot store lease {}: {e}", gpux_protocol::hex(&run.lease));
        }
    }

    fn set_state(&self, lease: &ContentId, state: LeaseState) {
        if let Err(e) = self.state.set_lease_state(lease, state, now()) {
            tracing::error!("cannot store lease {}: {e}", lease.short());
        }
    }

    /// When the host accepted the lease (its GPUs are booked from then).
    fn accepted_at(&self, lease: &ContentId) -> Option<Timestamp> {
        let record = self.state.lease(lease).ok().flatten()?;
        let accept = Signed::<gpux_protocol::LeaseAccept>::from_bytes(record.accept?)
            .and_then(Signed::verify)
            .ok()?;
        Some(accept.created_at)
    }

    async fn send(&self, peer: libp2p::PeerId, envelope: Vec<u8>) -> Result<Vec<u8>, String> {
        tokio::time::timeout(
            PEER_TIMEOUT,
            self.net.request_on(Proto::Receipt, peer, envelope),
        )
        .await
        .map_err(|_| "the renter did not answer in time".to_string())?
        .map_err(|e| e.to_string())
    }

    /// Starts a lease's container after its escrow is locked. Returns the container's start
    /// time, or why it could not start (the lease is then ended and the escrow released in
    /// full: nothing is charged).
    pub(crate) async fn start(&self, lease: &mut Lease) -> Result<(), String> {
        let id = lease.id();
        self.set_state(&id, LeaseState::Starting);
        let started = async {
            let container = self
                .exec
                .start(&lease.spec(self.fake_gpus))
                .await
                .map_err(|e| e.to_string())?;
            lease.run.container = Some(container.clone());
            self.save(&lease.run);
            let info = self
                .exec
                .inspect(&container)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("the container vanished as it started")?;
            info.started_at_ms
                .ok_or_else(|| "Docker reports no start time".to_string())
        }
        .await;
        match started {
            Ok(at) => {
                lease.run.started_at = Some(at);
                self.save(&lease.run);
                self.set_state(&id, LeaseState::Running);
                Ok(())
            }
            Err(why) => {
                tracing::warn!("lease {}: the container did not start: {why}", id.short());
                self.finish(lease, EndReason::ContainerFailed).await;
                Err(why)
            }
        }
    }

    /// Meters a running lease until it ends, then settles it.
    pub(crate) async fn meter(&self, mut lease: Lease, mut stop_rx: mpsc::Receiver<EndReason>) {
        let (Some(container), Some(started)) = (lease.run.container.clone(), lease.run.started_at)
        else {
            self.finish(&mut lease, EndReason::ContainerFailed).await;
            return;
        };
        // The lease's time runs from the container's start, but never past the window its
        // GPUs are booked for (from the acceptance): after that they may be someone else's.
        let duration_ms = u64::from(lease.request.duration_s) * 1000;
        let booked_until = match lease.request.kind {
            gpux_protocol::LeaseKind::Reserved { end, .. } => end,
            _ => self
                .accepted_at(&lease.id())
                .unwrap_or(Timestamp(started))
                .plus_ms(duration_ms),
        };
        let deadline = Timestamp(started).plus_ms(duration_ms).min(booked_until);
        let until_deadline = Duration::from_millis(deadline.ms_since(now()));
        let end_at = tokio::time::Instant::now() + until_deadline;
        // The work is killed exactly at its deadline by a task of its own, whatever this loop
        // is waiting for (a slow renter, the ledger): every second past it would be unpaid.
        let killer = {
            let exec = self.exec.clone();
            let container = container.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(end_at).await;
                let _ = exec.stop(&container, 0).await;
            })
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut receipt_tick = tokio::time::interval(self.timing.receipt_interval);
        receipt_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        receipt_tick.tick().await;
        let mut cursor = lease
            .run
            .log_cursor
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or(LogCursor::START);
        let mut usage = Meter::default();
        // The oldest receipt not yet acknowledged: when it was first sent.
        let mut unacked_since: Option<Timestamp> = None;
        let reason = loop {
            tokio::select! {
                reason = stop_rx.recv() => break reason.unwrap_or(EndReason::HostShutdown),
                () = tokio::time::sleep_until(end_at) => break EndReason::DurationReached,
                _ = tick.tick() => {
                    match self.exec.inspect(&container).await {
                        Ok(Some(info)) if !info.running => {
                            break if now() >= deadline {
                                EndReason::DurationReached
                            } else {
                                EndReason::ContainerExited
                            };
                        }
                        Ok(None) => break EndReason::ContainerFailed,
                        _ => {}
                    }
                    if let Ok(sample) = self.exec.sample(&container).await {
                        usage.add(sample, now().ms_since(Timestamp(started)));
                    }
                    if let Some(nvml) = &self.nvml {
                        let uuids: Vec<String> =
                            lease.request.gpus.iter().map(ToString::to_string).collect();
                        if let Ok(gpu) = nvml.usage(&uuids) {
                            usage.add_gpu(gpu);
                        }
                    }
                    cursor = self.ship_logs(&mut lease, &container, cursor).await;
                    // An acknowledgement late by more than the grace ends the lease, checked
                    // every second (not only at the next receipt).
                    if let Some(since) = unacked_since
                        && now().ms_since(since) >= self.timing.ack_grace.as_millis() as u64
                    {
                        break EndReason::ReceiptNotAcknowledged;
                    }
                }
                _ = receipt_tick.tick() => {
                    let t = now();
                    let gs = gpu_seconds(&lease.request, t.ms_since(Timestamp(started)));
                    let due = money::cost(gs, lease.request.price_per_gpu_hour)
                        .unwrap_or(MicroCredits(u64::MAX));
                    let full = money::cost(
                        gpu_seconds(&lease.request, u64::MAX),
                        lease.request.price_per_gpu_hour,
                    )
                    .unwrap_or(MicroCredits(u64::MAX));
                    match self.receipt(&mut lease, gs, usage.summary(), t).await {
                        // The ledger will pay no more for this lease (its escrow was closed):
                        // the work stops.
                        Ok(Answer::Acked(Redeemed::Refused(why))) => {
                            tracing::warn!("lease {}: stopping: {why}", lease.id().short());
                            break EndReason::EscrowExhausted;
                        }
                        // The escrow pays for no more: the work stops here.
                        Ok(Answer::Acked(_))
                            if due >= lease.request.escrow_amount
                                && lease.request.escrow_amount < full =>
                        {
                            break EndReason::EscrowExhausted;
                        }
                        Ok(Answer::Acked(_)) => unacked_since = None,
                        // A dispute costs at most this interval: stop now.
                        Ok(Answer::Disputed) => break EndReason::ReceiptDisputed,
                        Err(_) => {
                            unacked_since.get_or_insert(t);
                        }
                    }
                }
            }
        };
        killer.abort();
        lease.run.log_cursor = serde_json::to_string(&cursor).ok();
        self.finish(&mut lease, reason).await;
    }

    /// Sends the container's new output to the renter (best effort: output the renter did
    /// not take is sent again next time).
    async fn ship_logs(&self, lease: &mut Lease, container: &str, cursor: LogCursor) -> LogCursor {
        let Ok((data, next)) = self
            .exec
            .logs_since(container, cursor, LOG_CHUNK_BYTES)
            .await
        else {
            return cursor;
        };
        if data.is_empty() {
            return cursor;
        }
        let Ok(bytes) = BoundedBytes::new(data) else {
            return cursor;
        };
        let len = bytes.len() as u64;
        let chunk = LogChunk {
            lease: lease.id(),
            seq: lease.run.log_chunks,
            created_at: now(),
            stream: LogStream::Stdout,
            data: bytes,
            ext: Ext::new(),
        };
        let (Ok(chunk), Ok(peer)) = (Signed::sign(&self.key, chunk), lease.renter()) else {
            return cursor;
        };
        if self.send(peer, chunk.as_bytes().to_vec()).await.is_err() {
            return cursor;
        }
        lease.run.log_chunks += 1;
        lease.run.log_bytes += len;
        lease.run.log_cursor = serde_json::to_string(&next).ok();
        self.save(&lease.run);
        next
    }

    /// Signs, stores and sends the next cumulative receipt; on a valid acknowledgement,
    /// stores it and redeems it.
    async fn receipt(
        &self,
        lease: &mut Lease,
        gpu_seconds: u64,
        usage: UsageSummary,
        t: Timestamp,
    ) -> Result<Answer, String> {
        let request = &lease.request;
        let body = UsageReceipt {
            lease: lease.id(),
            escrow: request.escrow,
            price_per_gpu_hour: request.price_per_gpu_hour,
            gpus: request.gpus.len() as u16,
            seq: lease.run.last_seq + 1,
            created_at: t,
            gpu_seconds,
            amount_due: money::cost(gpu_seconds, request.price_per_gpu_hour)
                .map_err(|e| e.to_string())?,
            usage,
            ext: Ext::new(),
        };
        let receipt = Signed::sign(&self.key, body).map_err(|e| e.to_string())?;
        lease.run.last_seq = receipt.seq;
        self.save(&lease.run);
        let _ = self
            .state
            .save_receipt(&lease.id(), receipt.seq, receipt.as_bytes(), None);
        let answer = self
            .send(lease.renter()?, receipt.as_bytes().to_vec())
            .await?;
        match AnySigned::from_bytes(answer).and_then(AnySigned::verify) {
            Ok(AnyVerified::ReceiptAck(ack)) => {
                gpux_protocol::validate::ack_matches_receipt(
                    &ack,
                    &receipt,
                    lease.request.signer(),
                )
                .map_err(|e| e.to_string())?;
                let _ = self.state.save_receipt(
                    &lease.id(),
                    receipt.seq,
                    receipt.as_bytes(),
                    Some(ack.as_bytes()),
                );
                lease.run.acked_seq = receipt.seq;
                lease.run.acked_amount = receipt.amount_due.0;
                lease.run.last_ack = Some((receipt.as_bytes().to_vec(), ack.as_bytes().to_vec()));
                self.save(&lease.run);
                Ok(Answer::Acked(self.redeem(lease).await))
            }
            Ok(AnyVerified::LeaseEnd(end)) if end.signer() == lease.request.signer() => {
                tracing::warn!(
                    "lease {}: the renter refused receipt {} ({:?})",
                    lease.id().short(),
                    receipt.seq,
                    end.reason
                );
                Ok(Answer::Disputed)
            }
            Ok(_) => Err("the renter answered with an unexpected message".into()),
            Err(e) => Err(format!("the renter's answer does not verify: {e}")),
        }
    }

    /// Redeems the last acknowledged receipt, if newer than the last redeemed.
    async fn redeem(&self, lease: &mut Lease) -> Redeemed {
        let Some((receipt, ack)) = lease.run.last_ack.clone() else {
            return Redeemed::UpToDate;
        };
        if lease.run.acked_seq <= lease.run.redeemed_seq {
            return Redeemed::UpToDate;
        }
        let (Ok(receipt_b), Ok(ack_b)) = (BoundedBytes::new(receipt), BoundedBytes::new(ack))
        else {
            return Redeemed::Refused("the receipt or ack is too large".into());
        };
        let body = Redeem {
            escrow: lease.request.escrow,
            lease: lease.id(),
            receipt: receipt_b,
            ack: ack_b,
            created_at: now(),
            ext: Ext::new(),
        };
        let redeem = match Signed::sign(&self.key, body) {
            Ok(r) => r,
            Err(e) => return Redeemed::Refused(e.to_string()),
        };
        match self.ledger.submit(redeem.as_bytes().to_vec()).await {
            Ok(SubmitResult::Applied(record)) => {
                if let gpux_protocol::LedgerEntry::Redeemed { cumulative, .. } = record.entry {
                    lease.run.redeemed = cumulative.0;
                }
                lease.run.redeemed_seq = lease.run.acked_seq;
                self.save(&lease.run);
                Redeemed::UpToDate
            }
            Ok(SubmitResult::Unchanged(_)) => {
                lease.run.redeemed_seq = lease.run.acked_seq;
                self.save(&lease.run);
                Redeemed::UpToDate
            }
            Ok(SubmitResult::Refused(why)) => {
                tracing::warn!(
                    "lease {}: the ledger refused a redemption: {why}",
                    lease.id().short()
                );
                Redeemed::Refused(why)
            }
            Err(e) => {
                tracing::warn!("lease {}: redeeming: {e}", lease.id().short());
                Redeemed::Pending
            }
        }
    }

    /// Ends a lease: stops and erases its container, bills Docker's measured runtime in a
    /// final receipt, redeems the last acknowledged receipt, tells the renter, releases the
    /// rest of the escrow, and frees the GPUs.
    pub(crate) async fn finish(&self, lease: &mut Lease, reason: EndReason) {
        let id = lease.id();
        let reason_name = format!("{reason:?}");
        if lease.run.end_reason.is_none() {
            lease.run.end_reason = Some(reason_name.clone());
        }
        self.save(&lease.run);
        self.set_state(&id, LeaseState::Stopping);
        if let Some(container) = lease.run.container.clone() {
            // At the end of its time the work is killed at once (every second is billed);
            // otherwise it gets a moment to exit cleanly.
            let grace = if reason == EndReason::DurationReached {
                0
            } else {
                2
            };
            if let Err(e) = self.exec.stop(&container, grace).await {
                tracing::warn!("lease {}: stopping the container: {e}", id.short());
            }
            if let Ok(Some(info)) = self.exec.inspect(&container).await {
                lease.run.started_at = info.started_at_ms.or(lease.run.started_at);
                lease.run.finished_at = info.finished_at_ms;
                lease.run.exit_code = info.exit_code;
            }
            // The last of its output, while it still exists.
            let cursor = lease
                .run
                .log_cursor
                .as_deref()
                .and_then(|c| serde_json::from_str(c).ok())
                .unwrap_or(LogCursor::START);
            let _ = self.ship_logs(lease, &container, cursor).await;
            match self.exec.remove(&container).await {
                Ok(()) => {
                    lease.run.container = None;
                }
                Err(e) => tracing::error!("lease {}: erasing the container: {e}", id.short()),
            }
            self.save(&lease.run);
        }
        // The final bill, from Docker's own start and finish times.
        if let (Some(start), Some(end)) = (lease.run.started_at, lease.run.finished_at) {
            let gs = gpu_seconds(&lease.request, end.saturating_sub(start));
            let amount =
                money::cost(gs, lease.request.price_per_gpu_hour).unwrap_or(MicroCredits(0));
            let renter_answers = !matches!(
                reason,
                EndReason::ReceiptNotAcknowledged | EndReason::ReceiptDisputed
            );
            if amount.0 > lease.run.acked_amount && renter_answers {
                let _ = self
                    .receipt(lease, gs, UsageSummary::default(), now())
                    .await;
            }
        }
        let _ = self.redeem(lease).await;
        if let Ok(peer) = lease.renter() {
            let end = LeaseEnd {
                lease: id,
                created_at: now(),
                reason,
                exit_code: lease.run.exit_code.and_then(|c| i32::try_from(c).ok()),
                ext: Ext::new(),
            };
            if let Ok(end) = Signed::sign(&self.key, end) {
                let _ = self.send(peer, end.as_bytes().to_vec()).await;
            }
        }
        self.set_state(
            &id,
            LeaseState::Ended {
                reason: reason_name,
            },
        );
        let _ = self.over_tx.send(id).await;
        self.release(lease).await;
    }

    /// Returns the rest of the escrow to the renter (the payee may release at any time), but
    /// only once every acknowledged receipt is redeemed: releasing first would refund work
    /// the renter agreed to pay for. Retried for a while; the daemon retries later and after
    /// a restart.
    pub(crate) async fn release(&self, lease: &mut Lease) {
        let id = lease.id();
        for attempt in 0..10u64 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500 * attempt)).await;
            }
            match self.redeem(lease).await {
                Redeemed::UpToDate => {}
                // Nothing more can be redeemed (closed by the renter after the ledger's
                // grace, say): release what is left.
                Redeemed::Refused(_) => {}
                Redeemed::Pending => continue,
            }
            let body = Release {
                escrow: lease.request.escrow,
                lease: id,
                created_at: now(),
                ext: Ext::new(),
            };
            let Ok(release) = Signed::sign(&self.key, body) else {
                return;
            };
            let settled = match self.ledger.submit(release.as_bytes().to_vec()).await {
                Ok(SubmitResult::Applied(_) | SubmitResult::Unchanged(_)) => true,
                // Never locked (the lock was refused): nothing to settle.
                Ok(SubmitResult::Refused(why)) if why.contains("unknown escrow") => true,
                Ok(SubmitResult::Refused(why)) => {
                    tracing::warn!(
                        "lease {}: the ledger refused the release: {why}",
                        id.short()
                    );
                    false
                }
                Err(e) => {
                    tracing::warn!("lease {}: releasing the escrow: {e}", id.short());
                    false
                }
            };
            if settled {
                lease.run.released = true;
                self.save(&lease.run);
                self.set_state(&id, LeaseState::Settled);
                return;
            }
        }
    }
}

/// The renter's answer to a receipt.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Acknowledged; then the redemption's outcome.
    Acked(Redeemed),
    /// Disputed by the renter.
    Disputed,
}

/// What a redemption attempt came to.
#[derive(Debug)]
pub(crate) enum Redeemed {
    /// Everything acknowledged is redeemed.
    UpToDate,
    /// The ledger did not answer: try again.
    Pending,
    /// The ledger refused (the escrow is closed, say): redeeming again will not help.
    Refused(String),
}

/// Usage measured over a lease.
#[derive(Debug, Default)]
struct Meter {
    peak_memory: u64,
    cpu_ns: u64,
    runtime_ms: u64,
    gpu_util_sum: u64,
    gpu_samples: u64,
    gpu_memory_peak: u64,
}

impl Meter {
    fn add(&mut self, sample: crate::executor::Sample, runtime_ms: u64) {
        self.peak_memory = self.peak_memory.max(sample.memory_bytes);
        self.cpu_ns = sample.cpu_total_ns;
        self.runtime_ms = runtime_ms;
    }

    fn add_gpu(&mut self, gpu: gpux_attestation::GpuUsage) {
        self.gpu_util_sum += u64::from(gpu.util_permille);
        self.gpu_samples += 1;
        self.gpu_memory_peak = self.gpu_memory_peak.max(gpu.memory_used_bytes);
    }

    fn summary(&self) -> UsageSummary {
        UsageSummary {
            gpu_util_permille: self
                .gpu_util_sum
                .checked_div(self.gpu_samples)
                .map_or(0, |v| u16::try_from(v.min(1000)).unwrap_or(1000)),
            gpu_memory_peak_bytes: self.gpu_memory_peak,
            memory_peak_bytes: self.peak_memory,
            cpu_millis_avg: (self.cpu_ns / 1000)
                .checked_div(self.runtime_ms.max(1))
                .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)),
        }
    }
}

#[cfg(test)]
mod tests {
    use gpux_protocol::*;

    use super::gpu_seconds;

    fn request(gpus: u8, duration_s: u32) -> LeaseRequest {
        LeaseRequest {
            created_at: Timestamp(0),
            expires_at: Timestamp(1),
            offer: ContentId([0; 32]),
            host: Keypair::from_seed(&[1; 32]).public(),
            gpus: BoundedVec::new((0..gpus).map(|g| GpuUuid([g; 16])).collect()).unwrap(),
            price_per_gpu_hour: MicroCredits(3_600_000),
            duration_s,
            kind: LeaseKind::OnDemand,
            image: ImageDigest([0; 32]),
            command: BoundedVec::empty(),
            env: BoundedVec::empty(),
            limits: ResourceLimits {
                memory_bytes: 1,
                cpu_millis: 1,
                pids: 1,
                scratch_bytes: 1,
            },
            network: false,
            escrow: EscrowId([0; 16]),
            escrow_amount: MicroCredits(0),
            bid: None,
            ext: Ext::new(),
        }
    }

    #[test]
    fn billing_is_per_whole_second_with_a_minute_minimum_and_the_agreed_cap() {
        let r = request(2, 600);
        assert_eq!(gpu_seconds(&r, 0), 2 * 60);
        assert_eq!(gpu_seconds(&r, 59_999), 2 * 60);
        assert_eq!(gpu_seconds(&r, 61_999), 2 * 61, "seconds round down");
        assert_eq!(gpu_seconds(&r, 125_000), 2 * 125);
        assert_eq!(
            gpu_seconds(&r, 10_000_000),
            2 * 600,
            "never past the duration"
        );
    }
}
