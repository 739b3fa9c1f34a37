//! The daemon's part in running leases: escrow locks and lease ends on `/gpux/lease/1`,
//! receipts, logs and ends on `/gpux/receipt/1` (renter side), the ledger on
//! `/gpux/ledger/1`, the lease API (logs, receipts, stop, balance, faucet), the renter's
//! watchdog and settlement, and the host's recovery after a restart.

use std::time::Duration;

use gpux_protocol::validate::{
    ack_matches_receipt, escrow_lock_matches_request, receipt_matches_lease,
};
use gpux_protocol::{
    AnySigned, AnyVerified, BoundedString, ContentId, EndReason, Ext, LeaseEnd, LeaseReject,
    LeaseRequest, MicroCredits, ReceiptAck, RejectReason, Release, Signed, Timestamp, UsageReceipt,
    Verified, money,
};
use tokio::sync::mpsc;

use super::run::Lease;
use super::{ApiCommand, Daemon, Internal, Reply};
use crate::attest::now;
use crate::ledger::SubmitResult;
use crate::p2p::{InboundId, PeerId, Proto};
use crate::store::{LeaseRecord, LeaseState, Role, RunRecord};

/// An accepted lease whose escrow is not locked within this time is dropped (its GPUs freed).
const LOCK_WAIT_MS: u64 = 30_000;
/// A lock must come this soon after the acceptance (the renter sends it at once): the
/// GPUs' booking runs from the acceptance, and the work must fit in it.
const LOCK_WINDOW_MS: u64 = 10_000;
/// How far ahead of the renter's clock a receipt may be dated, ms.
const RECEIPT_SKEW_MS: u64 = 2_000;
/// Most container output a renter keeps per lease.
const MAX_LOG_BYTES: u64 = 64 << 20;
/// How often the renter tries to settle ended leases, in lease ticks (seconds).
const SETTLE_EVERY_TICKS: u64 = 2;
/// How often a host retries releasing escrows the ledger did not confirm, in lease ticks.
const RETRY_RELEASE_EVERY_TICKS: u64 = 30;

fn reject(
    ctx_key: &gpux_protocol::Keypair,
    lease: ContentId,
    reason: RejectReason,
    detail: &str,
) -> Vec<u8> {
    let body = LeaseReject {
        request: lease,
        created_at: now(),
        reason,
        detail: BoundedString::new(detail.chars().take(200).collect::<String>())
            .unwrap_or_default(),
        ext: Ext::new(),
    };
    Signed::sign(ctx_key, body)
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default()
}

fn verified_request(record: &LeaseRecord) -> Option<Verified<LeaseRequest>> {
    Signed::<LeaseRequest>::from_bytes(record.request.clone())
        .and_then(Signed::verify)
        .ok()
}

fn parse_lease(text: &str) -> Result<ContentId, String> {
    text.parse::<ContentId>()
        .map_err(|e| format!("lease id: {e}"))
}

impl Daemon {
    /// A request on `/gpux/receipt/1`, `/gpux/ledger/1`, or a non-`LeaseRequest` frame on
    /// `/gpux/lease/1`.
    pub(super) async fn on_request(
        &mut self,
        id: InboundId,
        proto: Proto,
        peer: PeerId,
        data: Vec<u8>,
    ) {
        let answer = match proto {
            Proto::Ledger => match self.ledger_service.as_mut() {
                Some(service) => crate::ledger::encode(&service.handle(&data, now())),
                None => crate::ledger::encode(&crate::ledger::LedgerResponse::Refused(
                    "this node does not serve a ledger".into(),
                )),
            },
            Proto::Lease | Proto::Receipt => {
                match AnySigned::from_bytes(data).and_then(AnySigned::verify) {
                    Ok(AnyVerified::EscrowLock(lock)) if proto == Proto::Lease => {
                        // Answered by the lease task once the container runs.
                        self.on_escrow_lock(id, lock);
                        return;
                    }
                    Ok(AnyVerified::LeaseEnd(end)) => self.on_lease_end(&end),
                    Ok(AnyVerified::UsageReceipt(receipt)) => self.on_receipt(&receipt),
                    Ok(AnyVerified::LogChunk(chunk)) => {
                        self.on_log_chunk(&chunk);
                        Vec::new()
                    }
                    Ok(_) | Err(_) => {
                        tracing::debug!("unexpected {proto:?} request from {peer}");
                        Vec::new()
                    }
                }
            }
        };
        let _ = self.net.respond(id, answer).await;
    }

    /// Host: a renter locks the escrow of an accepted lease. The lock goes to the ledger;
    /// once the ledger confirms it the container starts and the renter gets the ledger's
    /// record; then the lease task meters it.
    fn on_escrow_lock(&mut self, id: InboundId, lock: Verified<gpux_protocol::EscrowLock>) {
        let net = self.net.clone();
        let key = self.key.clone();
        let lease_id = lock.lease;
        let refuse = |reason, detail: &str| {
            let bytes = reject(&key, lease_id, reason, detail);
            let net = net.clone();
            tokio::spawn(async move {
                let _ = net.respond(id, bytes).await;
            });
        };
        let Some(ctx) = self.run_ctx.clone() else {
            return refuse(RejectReason::Invalid, "this node is not a host");
        };
        let record = match self.state.lease(&lease_id) {
            Ok(Some(r)) if r.role == Role::Host && r.state == LeaseState::Accepted => r,
            Ok(Some(r)) if r.role == Role::Host && r.state == LeaseState::Accepted => r,
            _ => {
                return refuse(
                    RejectReason::Invalid,
                    "no accepted lease waits for this escrow",
                );
            }
        };
        let Some(request) = verified_request(&record) else {
            return refuse(
                RejectReason::Invalid,
                "the stored lease request does not verify",
            );
        };
        // Execution starts at once: a reserved window in the future cannot be honoured yet.
        if let gpux_protocol::LeaseKind::Reserved { start, .. } = request.kind
            && start > now().plus_ms(LOCK_WINDOW_MS)
        {
            return refuse(
                RejectReason::Invalid,
                "this host starts leases at once; reserved windows in the future are not run yet",
            );
        }
        if now().ms_since(Timestamp(record.updated_at)) > LOCK_WINDOW_MS {
            return refuse(
                RejectReason::RequestExpired,
                "the escrow lock came too long after the acceptance; request the lease again",
            );
        }
        if let Err(e) = escrow_lock_matches_request(&lock, &request) {
            return refuse(RejectReason::EscrowInsufficient, &e.to_string());
        }
        // Starting from now on: a second lock for the lease is refused above.
        let _ = self
            .state
            .set_lease_state(&lease_id, LeaseState::Starting, now());
        let (stop_tx, stop_rx) = mpsc::channel(4);
        self.runners.insert(lease_id, stop_tx);
        // Recorded before the lock goes to the ledger: after a crash, recovery settles it.
        ctx.save(&RunRecord {
            lease: lease_id.0,
            ..RunRecord::default()
        });
        self.runner_tasks.spawn(async move {
            let answer = match ctx.ledger.submit(lock.as_bytes().to_vec()).await {
                Ok(SubmitResult::Applied(record)) => Ok(record.as_bytes().to_vec()),
                Ok(SubmitResult::Unchanged(why) | SubmitResult::Refused(why)) => Err(why),
                Err(why) => Err(why),
            };
            let mut lease = Lease {
                request,
                run: RunRecord {
                    lease: lease_id.0,
                    ..RunRecord::default()
                },
            };
            let record = match answer {
                Ok(record) => record,
                Err(why) => {
                    tracing::warn!(
                        "lease {}: the escrow was not locked: {why}",
                        lease_id.short()
                    );
                    let _ = ctx.state.set_lease_state(
                        &lease_id,
                        LeaseState::Ended {
                            reason: "EscrowNotLocked".into(),
                        },
                        now(),
                    );
                    let _ = ctx.over_tx.send(lease_id).await;
                    let bytes = reject(&ctx.key, lease_id, RejectReason::EscrowInsufficient, &why);
                    let _ = ctx.net.respond(id, bytes).await;
                    return;
                }
            };
            match ctx.start(&mut lease).await {
                Ok(()) => {
                    let _ = ctx.net.respond(id, record).await;
                    ctx.meter(lease, stop_rx).await;
                }
                Err(why) => {
                    let reason = if why.contains("not on this host") {
                        RejectReason::ImageMissing
                    } else {
                        RejectReason::Invalid
                    };
                    let detail = format!("the container did not start: {why}");
                    let _ = ctx
                        .net
                        .respond(id, reject(&ctx.key, lease_id, reason, &detail))
                        .await;
                }
            }
        });
    }

    /// A lease end: from the renter to the host (stop the work), or from the host to the
    /// renter (the work stopped).
    fn on_lease_end(&mut self, end: &Verified<LeaseEnd>) -> Vec<u8> {
        let Ok(Some(record)) = self.state.lease(&end.lease) else {
            return Vec::new();
        };
        let Some(request) = verified_request(&record) else {
            return Vec::new();
        };
        match record.role {
            Role::Host
                if end.signer() == request.signer() && end.reason == EndReason::RenterStopped =>
            {
                if let Some(stop) = self.runners.get(&end.lease) {
                    let _ = stop.try_send(EndReason::RenterStopped);
                }
            }
            Role::Renter if end.signer() == request.host => {
                if let Ok(Some(mut run)) = self.state.run(&end.lease) {
                    run.end_reason = Some(format!("{:?}", end.reason));
                    run.exit_code = end.exit_code.map(i64::from);
                    run.last_contact = now().0;
                    let _ = self.state.save_run(&run);
                }
                if !matches!(record.state, LeaseState::Settled) {
                    let _ = self.state.set_lease_state(
                        &end.lease,
                        LeaseState::Ended {
                            reason: format!("{:?}", end.reason),
                        },
                        now(),
                    );
                }
            }
            _ => {}
        }
        Vec::new()
    }

    /// Renter: checks a receipt against the agreed terms and its own clock, and
    /// countersigns it, or answers with a `LeaseEnd` that disputes it.
    fn on_receipt(&mut self, receipt: &Verified<UsageReceipt>) -> Vec<u8> {
        let t = now();
        let dispute = |daemon: &mut Daemon, why: String| {
            tracing::warn!(
                "disputing receipt {} of lease {}: {why}",
                receipt.seq,
                receipt.lease.short()
            );
            // Nothing is recorded: anyone can send a bad receipt; only the lease's host can
            // end the lease, and it does so itself when no acknowledgement comes.
            let end = LeaseEnd {
                lease: receipt.lease,
                created_at: t,
                reason: EndReason::ReceiptDisputed,
                exit_code: None,
                ext: Ext::new(),
            };
            Signed::sign(&daemon.key, end)
                .map(|v| v.as_bytes().to_vec())
                .unwrap_or_default()
        };
        let (Ok(Some(record)), Ok(Some(mut run))) = (
            self.state.lease(&receipt.lease),
            self.state.run(&receipt.lease),
        ) else {
            return Vec::new();
        };
        let Some(request) = verified_request(&record) else {
            return Vec::new();
        };
        // Only the lease's host gets an answer: a signed dispute handed to anyone else could
        // be replayed to the host.
        if record.role != Role::Renter || receipt.signer() != request.host {
            return Vec::new();
        }
        if matches!(record.state, LeaseState::Ended { .. } | LeaseState::Settled) {
            return dispute(self, "the lease has ended".into());
        }
        // The receipt's time is the host's word: it may not be ahead of this node's clock.
        if receipt.created_at > t.plus_ms(RECEIPT_SKEW_MS) {
            return dispute(self, "the receipt is dated in the future".into());
        }
        let started = Timestamp(run.started_at.unwrap_or(t.0));
        if let Err(e) = receipt_matches_lease(receipt, &request, started) {
            return dispute(self, e.to_string());
        }
        // This node's own measure: whole seconds since it asked for the start (one more for
        // rounding), never past the agreed duration, nor much past a stop it asked for.
        let mut until = t;
        if let Some(stop) = run.stop_requested_at {
            until = until.min(Timestamp(stop).plus_ms(self.timing.ack_grace.as_millis() as u64));
        }
        let own_s = (until.ms_since(started) / 1000 + 1).min(u64::from(request.duration_s));
        let max = (request.gpus.len() as u64) * money::billed_seconds(own_s);
        if receipt.gpu_seconds > max {
            return dispute(
                self,
                format!(
                    "{} GPU-seconds exceed the {max} this node measured",
                    receipt.gpu_seconds
                ),
            );
        }
        if receipt.seq < run.acked_seq || receipt.amount_due.0 < run.acked_amount {
            return dispute(self, "older than a receipt already acknowledged".into());
        }
        let body = ReceiptAck {
            receipt: receipt.id(),
            lease: receipt.lease,
            seq: receipt.seq,
            amount_due: receipt.amount_due,
            created_at: t,
            ext: Ext::new(),
        };
        let Ok(ack) = Signed::sign(&self.key, body) else {
            return Vec::new();
        };
        if ack_matches_receipt(&ack, receipt, self.key.public()).is_err() {
            return Vec::new();
        }
        // Stored (flushed) before the host hears of it: a restarted renter knows what it
        // agreed to pay.
        let _ = self.state.save_receipt(
            &receipt.lease,
            receipt.seq,
            receipt.as_bytes(),
            Some(ack.as_bytes()),
        );
        run.last_seq = run.last_seq.max(receipt.seq);
        run.acked_seq = receipt.seq;
        run.acked_amount = receipt.amount_due.0;
        run.last_contact = t.0;
        if self.state.save_run(&run).is_err() {
            return Vec::new();
        }
        if matches!(record.state, LeaseState::Accepted | LeaseState::Starting) {
            let _ = self
                .state
                .set_lease_state(&receipt.lease, LeaseState::Running, t);
        }
        ack.as_bytes().to_vec()
    }

    /// Renter: stores a chunk of the container's output.
    fn on_log_chunk(&mut self, chunk: &Verified<gpux_protocol::LogChunk>) {
        let (Ok(Some(record)), Ok(Some(mut run))) =
            (self.state.lease(&chunk.lease), self.state.run(&chunk.lease))
        else {
            return;
        };
        match verified_request(&record) {
            Some(request) if request.host == chunk.signer() && record.role == Role::Renter => {}
            _ => return,
        }
        // Bounded: a host cannot fill the renter's disk.
        if run.log_bytes >= MAX_LOG_BYTES {
            return;
        }
        if self
            .state
            .append_log(&chunk.lease, chunk.seq, &chunk.data)
            .is_ok()
            && chunk.seq >= run.log_chunks
        {
            run.log_chunks = chunk.seq.saturating_add(1);
            run.log_bytes += chunk.data.len() as u64;
            run.last_contact = now().0;
            let _ = self.state.save_run(&run);
        }
    }

    /// The lease API: logs, receipts, stop, balance, and a ledger node's faucet.
    pub(super) fn on_lease_api(&mut self, command: ApiCommand) {
        match command {
            ApiCommand::Logs { lease, from, reply } => {
                let result = parse_lease(&lease).and_then(|lease| {
                    let chunks = self.state.logs(&lease, from).map_err(|e| e.to_string())?;
                    let record = self.state.lease(&lease).map_err(|e| e.to_string())?;
                    let next = chunks.last().map_or(from, |(seq, _)| seq + 1);
                    let text: String = chunks
                        .iter()
                        .map(|(_, data)| String::from_utf8_lossy(data).into_owned())
                        .collect();
                    let ended = record.is_none_or(|r| {
                        matches!(r.state, LeaseState::Ended { .. } | LeaseState::Settled)
                    });
                    Ok(serde_json::json!({ "text": text, "next": next, "ended": ended }))
                });
                let _ = reply.send(result);
            }
            ApiCommand::Receipts { lease, reply } => {
                let result = parse_lease(&lease).and_then(|lease| self.receipts_json(&lease));
                let _ = reply.send(result);
            }
            ApiCommand::Stop { lease, reply } => self.stop_lease(&lease, reply),
            ApiCommand::Balance { reply } => {
                let ledger = self.ledger.clone();
                let account = self.key.public();
                tokio::spawn(async move {
                    let result = match ledger {
                        Some(ledger) => ledger.balance(account).await.map(|b| {
                            serde_json::json!({
                                "account": account.peer_id().to_string(),
                                "balance": b.amount_text(),
                                "balance_micro": b.0,
                            })
                        }),
                        None => Err("this node has no ledger configured".into()),
                    };
                    let _ = reply.send(result);
                });
            }
            ApiCommand::Mint { request, reply } => {
                let result = match self.ledger_service.as_mut() {
                    None => Err("this node does not serve a ledger".to_string()),
                    Some(service) => request
                        .account
                        .parse::<gpux_protocol::PeerId>()
                        .map_err(|e| e.to_string())
                        .and_then(|peer| {
                            let amount = request
                                .amount
                                .parse::<MicroCredits>()
                                .map_err(|e| e.to_string())?;
                            service
                                .mint(peer.public_key(), amount, now())
                                .map_err(|e| e.to_string())?;
                            Ok(serde_json::json!({
                                "account": request.account,
                                "balance_micro": service.ledger().balance(&peer.public_key()).0,
                            }))
                        }),
                };
                let _ = reply.send(result);
            }
            ApiCommand::Ledger { reply } => {
                let result = match self.ledger_service.as_ref() {
                    None => Err("this node does not serve a ledger".to_string()),
                    Some(service) => {
                        let ledger = service.ledger();
                        let balances: serde_json::Map<String, serde_json::Value> = ledger
                            .accounts()
                            .map(|(k, b)| (k.peer_id().to_string(), serde_json::json!(b.0)))
                            .collect();
                        let open = ledger.escrows().filter(|(_, e)| !e.released).count();
                        Ok(serde_json::json!({
                            "minted_micro": ledger.minted().0,
                            "total_micro": u64::try_from(ledger.total()).unwrap_or(u64::MAX),
                            "balances": balances,
                            "escrows": ledger.escrows().count(),
                            "open_escrows": open,
                        }))
                    }
                };
                let _ = reply.send(result);
            }
            _ => {}
        }
    }

    /// Every lease with its terms and run, for `/v1/leases`.
    pub(super) fn leases_json(&self) -> Result<serde_json::Value, String> {
        let leases = self.state.leases().map_err(|e| e.to_string())?;
        let rows = leases
            .iter()
            .map(|l| {
                let request = verified_request(l);
                let run = self.state.run(&ContentId(l.lease)).ok().flatten();
                serde_json::json!({
                    "lease": gpux_protocol::hex(&l.lease),
                    "role": l.role,
                    "state": l.state,
                    "updated_at": l.updated_at,
                    "host": request.as_ref().map(|r| r.host.peer_id().to_string()),
                    "renter": request.as_ref().map(|r| r.signer().peer_id().to_string()),
                    "gpus": request.as_ref().map(|r| r.gpus.iter().map(ToString::to_string).collect::<Vec<_>>()),
                    "duration_s": request.as_ref().map(|r| r.duration_s),
                    "price_per_gpu_hour_micro": request.as_ref().map(|r| r.price_per_gpu_hour.0),
                    "image": request.as_ref().map(|r| r.image.to_string()),
                    "run": run,
                })
            })
            .collect();
        Ok(serde_json::Value::Array(rows))
    }

    fn receipts_json(&self, lease: &ContentId) -> Result<serde_json::Value, String> {
        let receipts = self.state.receipts(lease).map_err(|e| e.to_string())?;
        let rows: Vec<_> = receipts
            .iter()
            .filter_map(|(receipt, ack)| {
                let r = Signed::<UsageReceipt>::from_bytes(receipt.clone())
                    .and_then(Signed::verify)
                    .ok()?;
                Some(serde_json::json!({
                    "seq": r.seq,
                    "created_at": r.created_at.0,
                    "gpu_seconds": r.gpu_seconds,
                    "amount_due": r.amount_due.amount_text(),
                    "amount_due_micro": r.amount_due.0,
                    "memory_peak_bytes": r.usage.memory_peak_bytes,
                    "gpu_util_permille": r.usage.gpu_util_permille,
                    "gpu_memory_peak_bytes": r.usage.gpu_memory_peak_bytes,
                    "cpu_millis_avg": r.usage.cpu_millis_avg,
                    "acked": ack.is_some(),
                }))
            })
            .collect();
        let run = self.state.run(lease).map_err(|e| e.to_string())?;
        Ok(serde_json::json!({ "receipts": rows, "run": run }))
    }

    /// Renter: asks the host to stop a lease.
    fn stop_lease(&mut self, lease: &str, reply: Reply) {
        let lease = match parse_lease(lease) {
            Ok(l) => l,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let request = match self.state.lease(&lease) {
            Ok(Some(r)) if r.role == Role::Renter => verified_request(&r),
            Ok(Some(_)) => {
                let _ = reply.send(Err("this node hosts that lease; the renter stops it".into()));
                return;
            }
            _ => None,
        };
        let Some(request) = request else {
            let _ = reply.send(Err(format!("no lease {lease} here")));
            return;
        };
        // Recorded first: whatever happens to the message, receipts billing past the stop
        // (and its grace) are disputed.
        if let Ok(Some(mut run)) = self.state.run(&lease)
            && run.stop_requested_at.is_none()
        {
            run.stop_requested_at = Some(now().0);
            let _ = self.state.save_run(&run);
        }
        let end = LeaseEnd {
            lease,
            created_at: now(),
            reason: EndReason::RenterStopped,
            exit_code: None,
            ext: Ext::new(),
        };
        let net = self.net.clone();
        let signed = Signed::sign(&self.key, end);
        tokio::spawn(async move {
            let result = async {
                let end = signed.map_err(|e| e.to_string())?;
                let host = libp2p::PeerId::from_bytes(&request.host.peer_id().to_bytes())
                    .map_err(|e| e.to_string())?;
                net.request(host, end.as_bytes().to_vec())
                    .await
                    .map_err(|e| format!("the host did not answer: {e}"))?;
                Ok(serde_json::json!({ "lease": lease.to_string(), "stopping": true }))
            }
            .await;
            let _ = reply.send(result);
        });
    }

    /// Host: a lease is over; its GPUs are offered again.
    pub(super) fn on_lease_over(&mut self, lease: &ContentId) {
        self.runners.remove(lease);
        if let Some((host, _, _)) = self.host.as_mut() {
            host.release_gpus(lease);
            self.publish_pending = true;
        }
    }

    /// Renter: a lease's escrow is settled.
    pub(super) fn on_renter_settled(&mut self, lease: &ContentId) {
        if let Ok(Some(mut run)) = self.state.run(lease) {
            run.released = true;
            let _ = self.state.save_run(&run);
        }
        let _ = self
            .state
            .set_lease_state(lease, LeaseState::Settled, now());
    }

    /// Every second: the renter's watchdog (a silent host ends the lease) and settlement of
    /// ended leases; the host drops accepted leases whose escrow never came.
    pub(super) fn sweep_leases(&mut self) {
        self.lease_ticks += 1;
        let t = now();
        let Ok(leases) = self.state.leases() else {
            return;
        };
        // Silence is measured against the timing the host announced in its acceptance (this
        // node's own settings when it announced none).
        let own_timing = (
            self.timing.receipt_interval.as_millis() as u64,
            self.timing.ack_grace.as_millis() as u64,
        );
        let silence = |run: &RunRecord| {
            let (interval, grace) = run.host_timing.unwrap_or(own_timing);
            interval.saturating_add(grace).saturating_add(5_000)
        };
        let mut to_settle = Vec::new();
        for record in leases {
            let lease = ContentId(record.lease);
            match (record.role, &record.state) {
                (Role::Renter, LeaseState::Running) => {
                    if let Ok(Some(mut run)) = self.state.run(&lease)
                        && t.ms_since(Timestamp(run.last_contact)) > silence(&run)
                    {
                        tracing::warn!("lease {}: the host fell silent; ending it", lease.short());
                        run.end_reason.get_or_insert("HostSilent".into());
                        let _ = self.state.save_run(&run);
                        let _ = self.state.set_lease_state(
                            &lease,
                            LeaseState::Ended {
                                reason: "HostSilent".into(),
                            },
                            t,
                        );
                    }
                }
                // The host never confirmed the start and never sent a receipt: not started.
                (Role::Renter, LeaseState::Accepted)
                    if t.ms_since(Timestamp(record.updated_at)) > LOCK_WAIT_MS =>
                {
                    let _ = self.state.set_lease_state(
                        &lease,
                        LeaseState::Ended {
                            reason: "NotStarted".into(),
                        },
                        t,
                    );
                }
                (Role::Renter, LeaseState::Ended { .. }) => {
                    if let Some(request) = verified_request(&record) {
                        to_settle.push(request);
                    }
                }
                // Ended, but the ledger did not confirm the release (it was unreachable):
                // try again now and then.
                (Role::Host, LeaseState::Ended { .. })
                    if !self.runners.contains_key(&lease)
                        && self.lease_ticks.is_multiple_of(RETRY_RELEASE_EVERY_TICKS) =>
                {
                    if let (Some(ctx), Some(request), Ok(Some(run))) = (
                        self.run_ctx.clone(),
                        verified_request(&record),
                        self.state.run(&lease),
                    ) && !run.released
                    {
                        let (stop_tx, _) = mpsc::channel(1);
                        self.runners.insert(lease, stop_tx);
                        self.runner_tasks.spawn(async move {
                            let mut lease = Lease { request, run };
                            ctx.release(&mut lease).await;
                            let _ = ctx.over_tx.send(lease.request.id()).await;
                        });
                    }
                }
                (Role::Host, LeaseState::Accepted)
                    if t.ms_since(Timestamp(record.updated_at)) > LOCK_WAIT_MS =>
                {
                    if let Some((host, _, _)) = self.host.as_mut() {
                        let _ = host.end_lease(&lease, "EscrowNotLocked", t);
                        self.publish_pending = true;
                    }
                }
                _ => {}
            }
        }
        if to_settle.is_empty()
            || self.sweeping
            || !self.lease_ticks.is_multiple_of(SETTLE_EVERY_TICKS)
        {
            return;
        }
        let Some(ledger) = self.ledger.clone() else {
            return;
        };
        self.sweeping = true;
        let key = self.key.clone();
        let internal = self.internal_tx.clone();
        tokio::spawn(async move {
            for request in to_settle {
                let lease = request.id();
                let settled = match ledger.escrow(request.escrow).await {
                    // Never locked, and too old to be locked now (the ledger refuses locks
                    // older than MAX_LOCK_AGE_MS): nothing to settle.
                    Ok(None) => now().ms_since(request.created_at) > crate::ledger::MAX_LOCK_AGE_MS,
                    Ok(Some(escrow)) if escrow.released => true,
                    Ok(Some(_)) => {
                        // The host has not released it (gone?): the renter may, once the
                        // ledger's grace since the last redemption has passed.
                        let body = Release {
                            escrow: request.escrow,
                            lease,
                            created_at: now(),
                            ext: Ext::new(),
                        };
                        match Signed::sign(&key, body) {
                            Ok(release) => matches!(
                                ledger.submit(release.as_bytes().to_vec()).await,
                                Ok(SubmitResult::Applied(_) | SubmitResult::Unchanged(_))
                            ),
                            Err(_) => false,
                        }
                    }
                    Err(_) => false,
                };
                if settled {
                    let _ = internal.send(Internal::Settled { lease }).await;
                }
            }
            let _ = internal.send(Internal::SweepDone).await;
        });
    }

    /// Host, at start: leases that were running when the node stopped. A container still
    /// running within its time resumes metering; any other is ended and settled. Containers
    /// of this node that belong to no open lease are erased.
    pub(super) async fn recover_host_leases(&mut self) {
        let Some(ctx) = self.run_ctx.clone() else {
            return;
        };
        let containers = ctx.exec.containers().await.unwrap_or_default();
        let Ok(leases) = self.state.leases() else {
            return;
        };
        let mut open = std::collections::BTreeSet::new();
        for record in leases {
            if record.role != Role::Host {
                continue;
            }
            let lease_id = ContentId(record.lease);
            let Some(request) = verified_request(&record) else {
                continue;
            };
            let run = match self.state.run(&lease_id) {
                Ok(Some(run)) if !run.released => run,
                _ => continue,
            };
            let hex = gpux_protocol::hex(&lease_id.0);
            let mut run = run;
            if run.container.is_none() {
                // Started, but the id was not stored: find it by its label.
                run.container = containers
                    .iter()
                    .find(|(l, _)| *l == hex)
                    .map(|(_, c)| c.clone());
            }
            if let Some(c) = &run.container {
                open.insert(c.clone());
            }
            let info = match &run.container {
                Some(c) => ctx.exec.inspect(c).await.ok().flatten(),
                None => None,
            };
            // A ledger that does not answer now is no reason to stop healthy work.
            let escrow_open = match ctx.ledger.escrow(request.escrow).await {
                Ok(Some(e)) => !e.released,
                Ok(None) => false,
                Err(_) => true,
            };
            let within_time = run.started_at.is_some_and(|s| {
                now().ms_since(Timestamp(s)) < u64::from(request.duration_s) * 1000
            });
            let resume = run.end_reason.is_none()
                && escrow_open
                && within_time
                && info.as_ref().is_some_and(|i| i.running);
            tracing::info!(
                "lease {}: {} after restart",
                lease_id.short(),
                if resume { "resuming" } else { "ending" }
            );
            let mut lease = Lease { request, run };
            if resume {
                let (stop_tx, stop_rx) = mpsc::channel(4);
                self.runners.insert(lease_id, stop_tx);
                let ctx = ctx.clone();
                self.runner_tasks
                    .spawn(async move { ctx.meter(lease, stop_rx).await });
            } else {
                let reason = if info.as_ref().is_some_and(|i| !i.running) {
                    EndReason::ContainerExited
                } else if !within_time {
                    EndReason::DurationReached
                } else {
                    EndReason::HostShutdown
                };
                let ctx = ctx.clone();
                self.runner_tasks
                    .spawn(async move { ctx.finish(&mut lease, reason).await });
            }
        }
        for (lease, container) in containers {
            if !open.contains(&container) {
                tracing::info!("erasing container {container} of closed lease {lease}");
                let _ = ctx.exec.stop(&container, 0).await;
                let _ = ctx.exec.remove(&container).await;
            }
        }
    }

    /// At shutdown: every running lease ends (HostShutdown) and settles, within a bound.
    pub(super) async fn stop_runners(&mut self, over_rx: &mut mpsc::Receiver<ContentId>) {
        for stop in self.runners.values() {
            let _ = stop.try_send(EndReason::HostShutdown);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !self.runner_tasks.is_empty() {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!("{} lease(s) did not settle before shutdown; they resume at the next start", self.runner_tasks.len());
                    break;
                }
                _ = self.runner_tasks.join_next() => {}
                Some(_) = over_rx.recv() => {}
            }
        }
    }
}
