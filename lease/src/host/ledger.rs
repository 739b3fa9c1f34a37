//! The host's dealings with the ledger: the lock, redemptions, the release.

use gpux_protocol::ledger_wire::RefusalCode;
use gpux_protocol::validate::escrow_lock_matches_request;
use gpux_protocol::{
    BoundedBytes, BoundedString, ContentId, EscrowLock, Ext, LeaseReject, LedgerEntry,
    MicroCredits, Redeem, RejectReason, Release, Signed, Timestamp, Verified,
};

use super::{HostEffect, HostLease, HostPhase, HostTimer, LOCK_RETRY_MS, LOCK_WINDOW_MS};
use crate::{End, LedgerCall, LedgerVerdict, backoff_ms};

impl HostLease {
    pub(super) fn reject(&self, now: Timestamp, reason: RejectReason, detail: &str) -> Vec<u8> {
        let body = LeaseReject {
            request: self.id(),
            created_at: now,
            reason,
            detail: BoundedString::new(detail.chars().take(200).collect::<String>())
                .unwrap_or_default(),
            ext: Ext::new(),
        };
        Signed::sign(&self.key, body)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default()
    }

    pub(super) fn refuse_lock(
        &mut self,
        now: Timestamp,
        reason: RejectReason,
        detail: &str,
        out: &mut Vec<HostEffect>,
    ) {
        out.push(HostEffect::AnswerLock {
            envelope: self.reject(now, reason, detail),
            started: false,
        });
    }

    pub(super) fn on_lock(
        &mut self,
        now: Timestamp,
        lock: Verified<EscrowLock>,
        out: &mut Vec<HostEffect>,
    ) {
        if self.rec.phase != HostPhase::AwaitingLock {
            return self.refuse_lock(
                now,
                RejectReason::Invalid,
                "no accepted lease waits for this escrow",
                out,
            );
        }
        if now.ms_since(self.rec.accepted_at) > LOCK_WINDOW_MS {
            return self.refuse_lock(
                now,
                RejectReason::RequestExpired,
                "the escrow lock came too long after the acceptance; request the lease again",
                out,
            );
        }
        if let Err(e) = escrow_lock_matches_request(&lock, &self.request) {
            return self.refuse_lock(now, RejectReason::EscrowInsufficient, &e.to_string(), out);
        }
        // Work that starts later is paid from an escrow its payer cannot take back before.
        if self.rec.starts_at > self.rec.accepted_at
            && lock.hold_until().ok().flatten() < Some(self.rec.starts_at)
        {
            return self.refuse_lock(
                now,
                RejectReason::EscrowInsufficient,
                "this lease starts later: its escrow must be held until it starts",
                out,
            );
        }
        self.rec.phase = HostPhase::Locking;
        self.rec.lock = Some(lock.as_bytes().to_vec());
        self.lock_pending = true;
        self.lock_first_tried = Some(now);
        out.push(HostEffect::Persist);
        self.submit(LedgerCall::Lock, lock.as_bytes().to_vec(), out);
    }

    pub(super) fn submit(
        &mut self,
        call: LedgerCall,
        envelope: Vec<u8>,
        out: &mut Vec<HostEffect>,
    ) {
        self.ledger_busy = Some(call);
        out.push(HostEffect::Ledger { call, envelope });
    }

    pub(super) fn retry_later(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
        let delay = backoff_ms(self.ledger_failures);
        self.ledger_failures = self.ledger_failures.saturating_add(1);
        out.push(HostEffect::Schedule {
            at: now.plus_ms(delay),
            timer: HostTimer::LedgerRetry,
        });
    }

    pub(super) fn on_ledger(
        &mut self,
        now: Timestamp,
        call: LedgerCall,
        verdict: LedgerVerdict,
        out: &mut Vec<HostEffect>,
    ) {
        if self.ledger_busy != Some(call) {
            return;
        }
        self.ledger_busy = None;
        if !matches!(verdict, LedgerVerdict::Unreachable) {
            self.ledger_failures = 0;
        }
        match call {
            LedgerCall::Lock => self.on_lock_verdict(now, verdict, out),
            LedgerCall::Redeem { seq } => {
                match verdict {
                    LedgerVerdict::Applied(record) => {
                        if let LedgerEntry::Redeemed { cumulative, .. } = record.entry {
                            self.rec.redeemed = self.rec.redeemed.max(cumulative);
                        }
                        self.rec.redeemed_seq = self.rec.redeemed_seq.max(seq);
                        out.push(HostEffect::Persist);
                    }
                    // Redeemed already (an earlier attempt whose answer was lost: a ledger's
                    // leader lost, say): the ledger paid at least this voucher's amount, up
                    // to the escrow.
                    LedgerVerdict::Unchanged => {
                        if let Some(v) = self.rec.acked.as_ref().filter(|v| v.seq == seq) {
                            let paid = v.amount.min(self.request.escrow_amount);
                            self.rec.redeemed = self.rec.redeemed.max(paid);
                        }
                        self.rec.redeemed_seq = self.rec.redeemed_seq.max(seq);
                        out.push(HostEffect::Persist);
                    }
                    // The ledger will pay no more for this lease: the work stops.
                    LedgerVerdict::Refused {
                        code: RefusalCode::EscrowClosed | RefusalCode::UnknownEscrow,
                        ..
                    } => {
                        self.rec.redeemed_seq = self.rec.redeemed_seq.max(seq);
                        self.end(now, End::EscrowExhausted, out);
                    }
                    // The disk of the ledger: later.
                    LedgerVerdict::Refused {
                        code: RefusalCode::Storage,
                        ..
                    } => return self.retry_later(now, out),
                    // Any other refusal means this escrow will not pay for this work (it is
                    // not the escrow the host was promised): the work stops, and the
                    // voucher is not offered again.
                    LedgerVerdict::Refused { .. } => {
                        self.rec.redeemed_seq = self.rec.redeemed_seq.max(seq);
                        self.end(now, End::EscrowExhausted, out);
                        out.push(HostEffect::Persist);
                    }
                    LedgerVerdict::Unreachable => return self.retry_later(now, out),
                }
                self.redeem_or_settle(now, out);
            }
            LedgerCall::Release => match verdict {
                // What the voucher paid at the close counts as paid too.
                LedgerVerdict::Applied(record) => {
                    let voucher_paid = record
                        .ext
                        .get(gpux_protocol::EXT_RECORD_VOUCHER_PAID)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_le_bytes);
                    self.rec.redeemed =
                        MicroCredits(self.rec.redeemed.0.saturating_add(voucher_paid));
                    if let Some(v) = &self.rec.acked {
                        self.rec.redeemed_seq = self.rec.redeemed_seq.max(v.seq);
                    }
                    self.rec.phase = HostPhase::Settled;
                    out.push(HostEffect::Persist);
                }
                LedgerVerdict::Unchanged
                | LedgerVerdict::Refused {
                    code: RefusalCode::EscrowClosed | RefusalCode::UnknownEscrow,
                    ..
                } => {
                    if let Some(v) = &self.rec.acked {
                        self.rec.redeemed_seq = self.rec.redeemed_seq.max(v.seq);
                    }
                    self.rec.phase = HostPhase::Settled;
                    out.push(HostEffect::Persist);
                }
                // Nothing else refuses a payee's release for long (the disk, say): later.
                LedgerVerdict::Refused { .. } | LedgerVerdict::Unreachable => {
                    self.retry_later(now, out)
                }
            },
        }
    }

    /// Whether a ledger record is the lock of this lease's escrow, by the renter's very lock,
    /// for the agreed amount, paying this host: anything else (a lock of the renter's own
    /// making for the same escrow id, say) must not start the work.
    pub(super) fn is_our_lock(
        &self,
        record: &gpux_protocol::Verified<gpux_protocol::LedgerRecord>,
    ) -> bool {
        let lock_id = self.rec.lock.as_deref().map(ContentId::of);
        record.escrow == self.request.escrow
            && Some(record.op) == lock_id
            && matches!(
                record.entry,
                LedgerEntry::Locked { payer, payee, amount }
                    if payer == self.request.signer()
                        && payee == self.request.host
                        && amount == self.request.escrow_amount
            )
    }

    pub(super) fn on_lock_verdict(
        &mut self,
        now: Timestamp,
        verdict: LedgerVerdict,
        out: &mut Vec<HostEffect>,
    ) {
        if self.rec.phase != HostPhase::Locking {
            return;
        }
        match verdict {
            LedgerVerdict::Applied(record) if self.is_our_lock(&record) => {
                self.rec.lock_record = Some(record.as_bytes().to_vec());
                self.rec.phase = HostPhase::Starting;
                out.push(HostEffect::Persist);
                if now < self.rec.starts_at || self.commit_wait_ms().is_some() {
                    // The GPUs are booked from later (spot leases run out their notice), or
                    // the work waits for the renter's commit: the renter learns the lock
                    // holds now, the container starts then.
                    self.start_deferred = true;
                    if self.lock_pending {
                        self.lock_pending = false;
                        out.push(HostEffect::AnswerLock {
                            envelope: record.as_bytes().to_vec(),
                            started: false,
                        });
                    }
                    // Only a lease whose escrow is locked preempts anyone (a request alone
                    // costs nothing). Their notice runs from now: a lock confirmed late
                    // moves the start after its end, within the booking.
                    let mut start = self.rec.starts_at;
                    if !self.rec.preempts.is_empty() {
                        out.push(HostEffect::PreemptSpot {
                            leases: self.rec.preempts.clone(),
                        });
                        let notice_end = now
                            .plus_ms(self.rec.timing.spot_notice_ms + crate::PREEMPT_HANDOVER_MS);
                        start = start.max(notice_end);
                    }
                    self.start_not_before = start;
                    if let Some(by) = self.commit_by() {
                        out.push(HostEffect::PrepareWorkspace);
                        out.push(HostEffect::Schedule {
                            at: by,
                            timer: HostTimer::CommitWait,
                        });
                    }
                    self.try_start(now, out);
                } else {
                    out.push(HostEffect::StartContainer);
                }
            }
            LedgerVerdict::Unreachable
                if self
                    .lock_first_tried
                    .is_some_and(|t| now.ms_since(t) < LOCK_RETRY_MS) =>
            {
                self.retry_later(now, out);
            }
            verdict => {
                let detail = match verdict {
                    LedgerVerdict::Refused { code, .. } => {
                        format!("the ledger refused the lock ({code:?})")
                    }
                    LedgerVerdict::Unreachable => "the ledger did not answer".to_string(),
                    _ => "the ledger's record is not this escrow's lock".to_string(),
                };
                if self.lock_pending {
                    self.lock_pending = false;
                    self.refuse_lock(now, RejectReason::EscrowInsufficient, &detail, out);
                }
                let refused = matches!(verdict, LedgerVerdict::Refused { .. });
                self.rec.end = Some(End::EscrowNotLocked);
                self.rec.ended_at = Some(now);
                out.push(HostEffect::FreeGpus);
                if refused {
                    // Refused: nothing was locked, nothing to settle.
                    self.rec.phase = HostPhase::Settled;
                    out.push(HostEffect::Persist);
                } else {
                    // It may have been locked after all: close it (all back to the renter).
                    self.rec.phase = HostPhase::Ended;
                    self.rec.erased = true;
                    out.push(HostEffect::Persist);
                    self.settle(now, out);
                }
            }
        }
    }

    pub(super) fn redeem_or_settle(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
        if self.ledger_busy.is_some() {
            return;
        }
        match self.rec.phase {
            HostPhase::Running | HostPhase::Stopping | HostPhase::FinalReceipt => {
                if let Some(v) = self.rec.acked.clone()
                    && v.seq > self.rec.redeemed_seq
                {
                    let body = Redeem {
                        escrow: self.request.escrow,
                        lease: self.id(),
                        receipt: BoundedBytes::new(v.receipt).unwrap_or_default(),
                        ack: BoundedBytes::new(v.ack).unwrap_or_default(),
                        created_at: now,
                        ext: Ext::new(),
                    };
                    if let Ok(redeem) = Signed::sign(&self.key, body) {
                        self.submit(
                            LedgerCall::Redeem { seq: v.seq },
                            redeem.as_bytes().to_vec(),
                            out,
                        );
                    }
                }
            }
            HostPhase::Ended => self.settle(now, out),
            _ => {}
        }
    }

    /// Closes the escrow with the latest voucher: the ledger pays up to it, then refunds.
    pub(super) fn settle(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
        if self.rec.phase != HostPhase::Ended || self.ledger_busy.is_some() {
            return;
        }
        let mut body = Release {
            escrow: self.request.escrow,
            lease: self.id(),
            created_at: now,
            ext: Ext::new(),
        };
        if let Some(v) = &self.rec.acked
            && v.seq > self.rec.redeemed_seq
        {
            let _ = body.set_voucher(&v.ack);
        }
        // How it ended, for the ledger's record of this host (a few bytes).
        if let Some(end) = self.rec.end {
            let _ = body.set_outcome(gpux_protocol::LeaseOutcome {
                reason: end.wire(),
                spot: matches!(self.request.kind, gpux_protocol::LeaseKind::Spot),
            });
        }
        if let Ok(release) = Signed::sign(&self.key, body) {
            self.submit(LedgerCall::Release, release.as_bytes().to_vec(), out);
        }
    }
}
