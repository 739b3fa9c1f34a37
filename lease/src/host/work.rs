//! The work itself: its start, its samples, its receipts and their answers, its end, the
//! final bill, and the timers.

use gpux_protocol::validate::{ack_matches_receipt, may_preempt};
use gpux_protocol::{
    BoundedBytes, Ext, LeaseCommit, LeaseEnd, LeaseRequest, MicroCredits, PreemptionNotice,
    ReceiptAck, RejectReason, Signed, Timestamp, UsageReceipt, UsageSummary, Verified,
};

use super::io::SentReceipt;
use super::{
    EXIT_NOTICE_MS, FINAL_RECEIPT_WAIT_MS, HostEffect, HostLease, HostPhase, HostTimer,
    KEPT_RECEIPTS, LOCK_WAIT_MS, Preemption, RenterAnswer, STOP_WAIT_MS, UsageSample,
};
use crate::{End, LedgerCall, MAX_VOUCHER_BYTES, Voucher, bill};

impl HostLease {
    pub(super) fn on_started(
        &mut self,
        now: Timestamp,
        started_at: Timestamp,
        out: &mut Vec<HostEffect>,
    ) {
        match self.rec.phase {
            HostPhase::Starting => {}
            // Ended while it was being started: stop it.
            HostPhase::Stopping => {
                self.rec.started_at = Some(started_at);
                out.push(HostEffect::Persist);
                out.push(HostEffect::StopContainer { grace_s: 0 });
                return;
            }
            _ => return,
        }
        self.rec.started_at = Some(started_at);
        self.rec.ack_from = started_at;
        self.rec.phase = HostPhase::Running;
        let interval = self.rec.timing.receipt_interval_ms;
        self.rec.next_receipt_at = started_at.plus_ms(interval);
        out.push(HostEffect::Persist);
        if self.lock_pending {
            self.lock_pending = false;
            if let Some(record) = self.rec.lock_record.clone() {
                out.push(HostEffect::AnswerLock {
                    envelope: record,
                    started: true,
                });
            }
        }
        out.push(HostEffect::Schedule {
            at: self.rec.next_receipt_at,
            timer: HostTimer::ReceiptDue,
        });
        out.push(HostEffect::Schedule {
            at: self.deadline(),
            timer: HostTimer::Deadline,
        });
        out.push(HostEffect::Schedule {
            at: self.ack_deadline(),
            timer: HostTimer::AckDeadline,
        });
        // A start after the deadline (a very slow Docker) ends at once.
        if now >= self.deadline() {
            self.end(now, End::DurationReached, out);
        }
    }

    pub(super) fn on_sample(&mut self, sample: UsageSample) {
        if self.rec.phase != HostPhase::Running {
            return;
        }
        let m = &mut self.rec.usage;
        m.memory_peak_bytes = m.memory_peak_bytes.max(sample.memory_bytes);
        m.cpu_total_ns = m.cpu_total_ns.max(sample.cpu_total_ns);
        if let Some(util) = sample.gpu_util_permille {
            m.gpu_util_sum += u64::from(util.min(1000));
            m.gpu_samples += 1;
        }
        if let Some(mem) = sample.gpu_memory_bytes {
            m.gpu_memory_peak_bytes = m.gpu_memory_peak_bytes.max(mem);
        }
        // Samples are not persisted one by one: the next receipt carries them.
    }

    pub(super) fn summary(&self) -> UsageSummary {
        let m = &self.rec.usage;
        let runtime_ms = match (self.rec.started_at, self.rec.finished_at) {
            (Some(s), Some(f)) => f.ms_since(s),
            (Some(s), None) => self.rec.next_receipt_at.ms_since(s),
            _ => 0,
        };
        UsageSummary {
            gpu_util_permille: m
                .gpu_util_sum
                .checked_div(m.gpu_samples)
                .map_or(0, |v| u16::try_from(v.min(1000)).unwrap_or(1000)),
            gpu_memory_peak_bytes: m.gpu_memory_peak_bytes,
            memory_peak_bytes: m.memory_peak_bytes,
            cpu_millis_avg: (m.cpu_total_ns / 1000)
                .checked_div(runtime_ms.max(1))
                .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)),
        }
    }

    /// Signs, keeps and sends the next cumulative receipt, billing up to `until`.
    pub(super) fn send_receipt(
        &mut self,
        now: Timestamp,
        until: Timestamp,
        out: &mut Vec<HostEffect>,
    ) -> bool {
        let (gpu_seconds, _) = self.billed_until(until);
        let request = &self.request;
        let body = UsageReceipt {
            lease: self.id(),
            escrow: request.escrow,
            price_per_gpu_hour: request.price_per_gpu_hour,
            gpus: request.gpus.len() as u16,
            seq: self.rec.last_seq + 1,
            created_at: now,
            gpu_seconds,
            amount_due: bill::amount(request, gpu_seconds),
            workspace_charge: bill::retention(request),
            usage: self.summary(),
            ext: Ext::new(),
        };
        let Ok(receipt) = Signed::sign(&self.key, body) else {
            return false;
        };
        self.rec.last_seq = receipt.seq;
        self.rec.sent.push(SentReceipt {
            seq: receipt.seq,
            sent_at: now,
            envelope: receipt.as_bytes().to_vec(),
        });
        let excess = self.rec.sent.len().saturating_sub(KEPT_RECEIPTS);
        self.rec.sent.drain(..excess);
        out.push(HostEffect::Persist);
        out.push(HostEffect::SendReceipt {
            seq: receipt.seq,
            envelope: receipt.as_bytes().to_vec(),
        });
        true
    }

    pub(super) fn on_answer(
        &mut self,
        now: Timestamp,
        seq: u64,
        answer: RenterAnswer,
        out: &mut Vec<HostEffect>,
    ) {
        let final_answer = self.rec.phase == HostPhase::FinalReceipt && seq == self.rec.last_seq;
        match answer {
            RenterAnswer::Ack(ack) => self.on_ack(now, seq, &ack, out),
            RenterAnswer::Dispute(end)
                if end.signer() == self.request.signer() && end.lease == self.id() =>
            {
                // A dispute costs at most this interval: stop now.
                self.end(now, End::ReceiptDisputed, out);
            }
            RenterAnswer::Dispute(_) | RenterAnswer::Nothing => {}
        }
        if final_answer && self.rec.phase == HostPhase::FinalReceipt {
            self.finish(now, out);
        }
    }

    pub(super) fn on_ack(
        &mut self,
        now: Timestamp,
        seq: u64,
        ack: &Verified<ReceiptAck>,
        out: &mut Vec<HostEffect>,
    ) {
        let Some(sent) = self.rec.sent.iter().find(|s| s.seq == seq).cloned() else {
            return;
        };
        let Ok(receipt) =
            Signed::<UsageReceipt>::from_bytes(sent.envelope.clone()).and_then(Signed::verify)
        else {
            return;
        };
        // An ack too large to travel as a release's voucher is no ack (a renter padding its
        // ext could otherwise keep the host from ever closing the escrow).
        if ack.as_bytes().len() > MAX_VOUCHER_BYTES
            || ack_matches_receipt(ack, &receipt, self.request.signer()).is_err()
        {
            return;
        }
        if self.rec.acked.as_ref().is_some_and(|v| v.seq >= seq) {
            return;
        }
        self.rec.acked = Some(Voucher {
            seq,
            amount: receipt.amount_due,
            gpu_seconds: receipt.gpu_seconds,
            receipt: sent.envelope,
            ack: ack.as_bytes().to_vec(),
        });
        self.rec.ack_from = self.rec.ack_from.max(sent.sent_at);
        self.rec.sent.retain(|s| s.seq > seq);
        out.push(HostEffect::Persist);
        if self.rec.phase == HostPhase::Running {
            out.push(HostEffect::Schedule {
                at: self.ack_deadline(),
                timer: HostTimer::AckDeadline,
            });
            // The escrow pays for no more: the work stops here.
            let escrow = self.request.escrow_amount;
            if receipt.amount_due >= escrow && escrow < bill::full_amount(&self.request) {
                self.end(now, End::EscrowExhausted, out);
            }
        }
        self.redeem_or_settle(now, out);
    }

    /// While the lease runs, each new acknowledgement is redeemed at once; once it is over,
    /// the escrow is closed.
    /// The work ends for `end` (the first reason wins).
    pub(super) fn end(&mut self, now: Timestamp, end: End, out: &mut Vec<HostEffect>) {
        if self.rec.end.is_some() {
            return;
        }
        self.rec.end = Some(end);
        self.rec.ended_at = Some(now);
        match self.rec.phase {
            HostPhase::AwaitingLock => {
                // Nothing was locked.
                self.rec.phase = HostPhase::Settled;
                out.push(HostEffect::Persist);
                out.push(HostEffect::FreeGpus);
            }
            HostPhase::Locking => {
                // The lock may still be applied: close whatever it opened.
                if self.lock_pending {
                    self.lock_pending = false;
                    self.refuse_lock(now, RejectReason::Invalid, "the host is shutting down", out);
                }
                self.rec.phase = HostPhase::Ended;
                self.rec.erased = true;
                out.push(HostEffect::Persist);
                out.push(HostEffect::FreeGpus);
                // The lock's verdict, if it comes, is ignored: settle once it is in.
                self.ledger_busy = None;
                self.settle(now, out);
            }
            HostPhase::Starting if self.start_deferred => {
                // Never started: nothing ran, so nothing is owed but a reserved window's
                // cancellation fee (when its renter cancelled it); the rest of the escrow
                // goes back. A workspace made for the commit goes too.
                self.start_deferred = false;
                self.rec.phase = HostPhase::Ended;
                let prepared = self.commit_wait_ms().is_some();
                self.rec.erased = !prepared;
                out.push(HostEffect::Persist);
                out.push(HostEffect::FreeGpus);
                if prepared {
                    out.push(HostEffect::EraseContainer);
                }
                let (fee, _) = self.billed_until(now);
                if fee > 0 {
                    self.rec.phase = HostPhase::FinalReceipt;
                    if self.send_receipt(now, now, out) {
                        out.push(HostEffect::Schedule {
                            at: now.plus_ms(FINAL_RECEIPT_WAIT_MS),
                            timer: HostTimer::FinalReceiptWait,
                        });
                        return;
                    }
                }
                self.finish(now, out);
            }
            HostPhase::Starting => {
                if self.lock_pending {
                    self.lock_pending = false;
                    // Said to the renter, who cannot see the host's log.
                    let why = match end {
                        End::ContainerFailed => "the container did not start on the host",
                        End::ImageMissing => "the image is not on the host",
                        End::HostShutdown => "the host is shutting down",
                        _ => "the lease ended as it started",
                    };
                    self.refuse_lock(now, RejectReason::Invalid, why, out);
                }
                // The start under way reports first; the container is stopped then.
                self.rec.phase = HostPhase::Stopping;
                out.push(HostEffect::Persist);
            }
            HostPhase::Running => {
                self.rec.phase = HostPhase::Stopping;
                // Stopped by the renter, by the host's shutdown or for want of escrow, the
                // work gets a moment to exit; at the end of its time, or when the renter
                // stops acknowledging (or disputes) receipts, it is killed at once (every
                // second more would be unpaid).
                let grace_s = match (end, &self.rec.preemption) {
                    (End::RenterStopped | End::HostShutdown | End::EscrowExhausted, _) => 2,
                    // Asked to stop before the notice ends, killed at its end.
                    (End::Preempted, Some(p)) => {
                        u32::try_from(p.ends_at.ms_since(now) / 1000).unwrap_or(u32::MAX)
                    }
                    _ => 0,
                };
                out.push(HostEffect::Persist);
                out.push(HostEffect::StopContainer { grace_s });
                out.push(HostEffect::Schedule {
                    at: now.plus_ms(STOP_WAIT_MS),
                    timer: HostTimer::StopWait,
                });
            }
            HostPhase::Stopping
            | HostPhase::FinalReceipt
            | HostPhase::Ended
            | HostPhase::Settled => {}
        }
    }

    /// The container stopped: the final bill, the erasure, the end message, settlement.
    pub(super) fn on_exited(
        &mut self,
        now: Timestamp,
        finished_at: Option<Timestamp>,
        exit_code: Option<i64>,
        out: &mut Vec<HostEffect>,
    ) {
        if !matches!(self.rec.phase, HostPhase::Stopping) {
            return;
        }
        self.rec.finished_at = finished_at.or(self.rec.finished_at);
        self.rec.exit_code = exit_code.or(self.rec.exit_code);
        out.push(HostEffect::Persist);
        out.push(HostEffect::EraseContainer);
        out.push(HostEffect::FreeGpus);
        // The final bill, from Docker's own start and finish times (never past the deadline).
        let renter_answers = !matches!(
            self.rec.end,
            Some(End::ReceiptNotAcknowledged | End::ReceiptDisputed)
        );
        let acked = self
            .rec
            .acked
            .as_ref()
            .map_or(MicroCredits::ZERO, |v| v.amount);
        if let (Some(_), Some(finished)) = (self.rec.started_at, self.rec.finished_at) {
            let (gs, _) = self.billed_until(finished);
            if renter_answers && bill::amount(&self.request, gs) > acked {
                self.rec.phase = HostPhase::FinalReceipt;
                if self.send_receipt(now, finished, out) {
                    out.push(HostEffect::Schedule {
                        at: now.plus_ms(FINAL_RECEIPT_WAIT_MS),
                        timer: HostTimer::FinalReceiptWait,
                    });
                    return;
                }
            }
        }
        self.finish(now, out);
    }

    /// Tells the renter the lease is over and closes the escrow.
    pub(super) fn finish(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
        let end = self.rec.end.unwrap_or(End::HostShutdown);
        let body = LeaseEnd {
            lease: self.id(),
            created_at: now,
            reason: end.wire(),
            exit_code: self.rec.exit_code.and_then(|c| i32::try_from(c).ok()),
            ext: Ext::new(),
        };
        if let Ok(signed) = Signed::sign(&self.key, body) {
            out.push(HostEffect::SendEnd {
                envelope: signed.as_bytes().to_vec(),
            });
        }
        self.rec.phase = HostPhase::Ended;
        out.push(HostEffect::Persist);
        // A redemption in flight finishes first; its verdict then settles.
        self.settle(now, out);
    }

    pub(super) fn on_timer(&mut self, now: Timestamp, timer: HostTimer, out: &mut Vec<HostEffect>) {
        match timer {
            HostTimer::ReceiptDue => {
                if self.rec.phase != HostPhase::Running || now < self.rec.next_receipt_at {
                    return;
                }
                let interval = self.rec.timing.receipt_interval_ms;
                self.rec.next_receipt_at = now.plus_ms(interval);
                let until = Timestamp(now.0.saturating_sub(EXIT_NOTICE_MS));
                self.send_receipt(now, until, out);
                out.push(HostEffect::Schedule {
                    at: self.rec.next_receipt_at,
                    timer: HostTimer::ReceiptDue,
                });
            }
            HostTimer::AckDeadline => {
                if self.rec.phase != HostPhase::Running {
                    return;
                }
                if now >= self.ack_deadline() {
                    self.end(now, End::ReceiptNotAcknowledged, out);
                } else {
                    out.push(HostEffect::Schedule {
                        at: self.ack_deadline(),
                        timer: HostTimer::AckDeadline,
                    });
                }
            }
            HostTimer::Deadline => {
                if self.rec.phase == HostPhase::Running && now >= self.deadline() {
                    let end = if self.rec.preemption.is_some() {
                        End::Preempted
                    } else {
                        End::DurationReached
                    };
                    self.end(now, end, out);
                }
            }
            HostTimer::StartAt => self.try_start(now, out),
            HostTimer::CommitWait => {
                let overdue = self.commit_by().is_some_and(|by| now >= by);
                if self.start_deferred
                    && self.rec.phase == HostPhase::Starting
                    && self.rec.committed_at.is_none()
                    && overdue
                {
                    self.end(now, End::NotCommitted, out);
                }
            }
            HostTimer::Preempt => {
                let due = self
                    .rec
                    .preemption
                    .as_ref()
                    .is_some_and(|p| now.plus_ms(self.preempt_term_ms()) >= p.ends_at);
                if due {
                    self.end(now, End::Preempted, out);
                }
            }
            HostTimer::LockWait => {
                if self.rec.phase == HostPhase::AwaitingLock
                    && now.ms_since(self.rec.accepted_at) >= LOCK_WAIT_MS
                {
                    self.end(now, End::EscrowNotLocked, out);
                }
            }
            HostTimer::LedgerRetry => {
                if self.ledger_busy.is_some() {
                    return;
                }
                match self.rec.phase {
                    HostPhase::Locking => {
                        if let Some(lock) = self.rec.lock.clone() {
                            self.submit(LedgerCall::Lock, lock, out);
                        }
                    }
                    _ => self.redeem_or_settle(now, out),
                }
            }
            HostTimer::FinalReceiptWait => {
                if self.rec.phase == HostPhase::FinalReceipt {
                    self.finish(now, out);
                }
            }
            HostTimer::StopWait => {
                if self.rec.phase == HostPhase::Stopping {
                    out.push(HostEffect::StopContainer { grace_s: 0 });
                    out.push(HostEffect::Schedule {
                        at: now.plus_ms(STOP_WAIT_MS),
                        timer: HostTimer::StopWait,
                    });
                }
            }
        }
    }

    /// A locked lease whose start was deferred starts once its booking has begun (and the
    /// notice of the spot leases it preempts has run out) and, when it waits for one, the
    /// renter has committed; until then the start is scheduled.
    pub(super) fn try_start(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
        if !self.start_deferred || self.rec.phase != HostPhase::Starting {
            return;
        }
        if self.commit_wait_ms().is_some() && self.rec.committed_at.is_none() {
            return;
        }
        if now < self.start_not_before {
            out.push(HostEffect::Schedule {
                at: self.start_not_before,
                timer: HostTimer::StartAt,
            });
            return;
        }
        self.start_deferred = false;
        out.push(HostEffect::StartContainer);
    }

    /// The renter's commit: recorded, and the work starts (now, or when its booking
    /// begins). A commit for a lease that does not wait for one, from anyone but its
    /// renter, after the lease ended or after its time is ignored.
    pub(super) fn on_commit(
        &mut self,
        now: Timestamp,
        commit: &Verified<LeaseCommit>,
        out: &mut Vec<HostEffect>,
    ) {
        let in_time = self.commit_by().is_some_and(|by| now <= by);
        if commit.signer() != self.request.signer()
            || commit.lease != self.id()
            || !in_time
            || self.rec.committed_at.is_some()
            || self.rec.end.is_some()
            || !matches!(
                self.rec.phase,
                HostPhase::AwaitingLock | HostPhase::Locking | HostPhase::Starting
            )
        {
            return;
        }
        self.rec.committed_at = Some(now);
        out.push(HostEffect::Persist);
        self.try_start(now, out);
    }

    /// A request that may preempt this spot lease was accepted: the notice is signed, kept,
    /// written for the workload and sent to the renter; the workload is asked to stop a
    /// moment before the notice ends and killed at its end.
    pub(super) fn on_preempt(
        &mut self,
        now: Timestamp,
        preemptor: &Verified<LeaseRequest>,
        out: &mut Vec<HostEffect>,
    ) {
        if self.rec.preemption.is_some()
            || self.rec.end.is_some()
            || may_preempt(&self.request, self.id(), preemptor).is_err()
        {
            return;
        }
        let Ok(cited) = BoundedBytes::new(preemptor.as_bytes().to_vec()) else {
            return;
        };
        let ends_at = now.plus_ms(self.rec.timing.spot_notice_ms);
        let body = PreemptionNotice {
            lease: self.id(),
            created_at: now,
            ends_at,
            preemptor: cited,
            ext: Ext::new(),
        };
        let Ok(notice) = Signed::sign(&self.key, body) else {
            return;
        };
        let envelope = notice.as_bytes().to_vec();
        self.rec.preemption = Some(Preemption {
            notice: envelope.clone(),
            ends_at,
        });
        out.push(HostEffect::Persist);
        out.push(HostEffect::Notify { envelope, ends_at });
        out.push(HostEffect::Schedule {
            at: Timestamp(ends_at.0.saturating_sub(self.preempt_term_ms())),
            timer: HostTimer::Preempt,
        });
        out.push(HostEffect::Schedule {
            at: ends_at,
            timer: HostTimer::Deadline,
        });
    }
}
