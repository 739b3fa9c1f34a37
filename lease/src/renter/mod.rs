//! The renter's side of one lease.
//!
//! After the host's `LeaseAccept`, the renter signs its `EscrowLock` and sends it to the host,
//! which relays it to the ledger and starts the container; the renter learns the lease runs
//! from the ledger's signed `Locked` record. Every receipt is checked against the terms and
//! against the renter's own clock (never billing more than the renter has measured since it
//! asked for the start, nor much past a stop it asked for) before it is countersigned. A host
//! that falls silent ends the lease. Once over, the renter closes the escrow after the
//! ledger's grace with its latest voucher, so the host is paid exactly what the renter
//! acknowledged, and the rest comes back.
//!
//! A rent the renter reported as failed is never paid: from then on every receipt is
//! disputed and the host is asked to stop.

use gpux_protocol::ledger_wire::RefusalCode;
use gpux_protocol::validate::{notice_matches_lease, receipt_matches_lease};
use gpux_protocol::{
    ContentId, EscrowLock, Ext, Keypair, LeaseAccept, LeaseEnd, LeaseKind, LeaseRequest,
    LedgerEntry, PreemptionNotice, PublicKey, ReceiptAck, Release, Signed, Timestamp, UsageReceipt,
    Verified,
};

use crate::{
    End, LedgerCall, LedgerVerdict, MAX_LOCK_AGE_MS, RestoreError, Timing, Voucher, backoff_ms,
};

/// How far ahead of the renter's clock a receipt may be dated, ms.
const RECEIPT_SKEW_MS: u64 = 2_000;
/// Silence beyond interval + grace, before the host counts as gone, ms.
const SILENCE_MARGIN_MS: u64 = 5_000;
/// Delay before the first settlement attempt after the end (the host usually closes the
/// escrow itself first).
const SETTLE_DELAY_MS: u64 = 2_000;
/// Past the ledger's lock age, how much longer a renter waits before it counts a lock that
/// never reached the ledger as gone (clocks differ).
const LOCK_AGE_MARGIN_MS: u64 = 60_000;
/// While the ledger says it is too early, how often the renter looks again (the host may
/// close the escrow in the meantime).
const SETTLE_POLL_MS: u64 = 5_000;

mod io;

pub use io::{
    CommitError, LockOutcome, RentReport, RenterEffect, RenterInput, RenterPhase, RenterRecord,
    RenterTimer, StopError,
};

/// The renter's side of one lease.
///
/// After the host's `LeaseAccept`, the renter signs its `EscrowLock` and sends it to the host,
/// which relays it to the ledger and starts the container; the renter learns the lease runs
/// from the ledger's signed `Locked` record. Every receipt is checked against the terms and
/// against the renter's own clock (never billing more than the renter has measured since it
/// asked for the start, nor much past a stop it asked for) before it is countersigned. A host
/// that falls silent ends the lease. Once over, the renter closes the escrow after the
/// ledger's grace with its latest voucher, so the host is paid exactly what the renter
/// acknowledged, and the rest comes back.
///
/// A rent the renter reported as failed is never paid: from then on every receipt is
/// disputed and the host is asked to stop.
#[derive(Debug, Clone)]
pub struct RenterLease {
    key: Keypair,
    request: Verified<LeaseRequest>,
    lock: Verified<EscrowLock>,
    rec: RenterRecord,
    /// The other members of a replicated ledger, whose records count as the ledger's too
    /// (not stored: a lock's record comes only before a restart, which gives the start up).
    ledger_members: Vec<PublicKey>,
    ledger_busy: bool,
    ledger_failures: u32,
    reported: bool,
}

fn verify<T: gpux_protocol::Message>(bytes: &[u8]) -> Result<Verified<T>, RestoreError> {
    Signed::<T>::from_bytes(bytes.to_vec())
        .and_then(Signed::verify)
        .map_err(|e| RestoreError(e.to_string()))
}

impl RenterLease {
    /// A lease the host has accepted: signs the escrow lock and sends it. `ledger` is the key
    /// of the ledger whose records count; `now` is when the lock goes out (the work cannot
    /// have started before).
    pub fn accepted(
        key: Keypair,
        request: Verified<LeaseRequest>,
        accept: &Verified<LeaseAccept>,
        ledger: PublicKey,
        now: Timestamp,
    ) -> Result<(Self, Vec<RenterEffect>), gpux_protocol::SignError> {
        // Work that starts later (the host preempts spot leases first) is paid from an
        // escrow held until then: the host refuses a lock without the hold.
        let starts_at = crate::accept_starts_at(accept);
        let mut ext = Ext::new();
        if let Some(at) = starts_at {
            // One 8-byte value: within the ext map's limits.
            let _ = ext.insert(
                gpux_protocol::EXT_LOCK_HOLD_UNTIL,
                at.0.to_le_bytes().to_vec(),
            );
        }
        let lock = Signed::sign(
            &key,
            EscrowLock {
                escrow: request.escrow,
                lease: request.id(),
                payer: key.public(),
                payee: request.host,
                amount: request.escrow_amount,
                price_per_gpu_hour: request.price_per_gpu_hour,
                created_at: now,
                ext,
            },
        )?;
        let rec = RenterRecord {
            request: request.as_bytes().to_vec(),
            accept: accept.as_bytes().to_vec(),
            lock: lock.as_bytes().to_vec(),
            ledger,
            timing: Timing::from_accept(accept),
            phase: RenterPhase::Starting,
            lock_sent_at: now,
            starts_at: starts_at.unwrap_or(now).max(now),
            commit_by: request
                .commit_wait_ms()
                .ok()
                .flatten()
                .map(|wait| starts_at.unwrap_or(accept.created_at).plus_ms(wait)),
            committed_at: None,
            preempted_until: None,
            notice_refused: false,
            confirmed: false,
            gave_up: false,
            last_seq: 0,
            acked: None,
            last_contact: now,
            stop_requested_at: None,
            end: None,
            ended_at: None,
            host_end: None,
            exit_code: None,
            log_chunks: 0,
            log_bytes: 0,
        };
        let effects = vec![
            RenterEffect::Persist,
            RenterEffect::SendLock {
                envelope: lock.as_bytes().to_vec(),
            },
        ];
        Ok((Self::from_parts(key, request, lock, rec), effects))
    }

    fn from_parts(
        key: Keypair,
        request: Verified<LeaseRequest>,
        lock: Verified<EscrowLock>,
        rec: RenterRecord,
    ) -> Self {
        Self {
            key,
            request,
            lock,
            rec,
            ledger_members: Vec::new(),
            ledger_busy: false,
            ledger_failures: 0,
            reported: false,
        }
    }

    /// Counts the records of these members of a replicated ledger too (the ledger's key,
    /// the record's `ledger`, is its first member's).
    pub fn with_ledger_members(mut self, members: Vec<PublicKey>) -> Self {
        self.ledger_members = members;
        self
    }

    /// A lease from its stored record after a restart.
    pub fn restore(
        key: Keypair,
        rec: RenterRecord,
        now: Timestamp,
    ) -> Result<(Self, Vec<RenterEffect>), RestoreError> {
        let request = verify::<LeaseRequest>(&rec.request)?;
        let lock = verify::<EscrowLock>(&rec.lock)?;
        let mut lease = Self::from_parts(key, request, lock, rec);
        let mut out = Vec::new();
        match lease.rec.phase {
            // Whoever asked for the start was told it failed when this node stopped.
            RenterPhase::Starting => lease.give_up(
                now,
                "the renter restarted before the start was confirmed",
                &mut out,
            ),
            // Whoever was to commit it stopped with this node: the host is told, nothing
            // ran, nothing is paid.
            RenterPhase::Held => {
                lease.end(now, End::NotCommitted, &mut out);
                lease.send_end(now, gpux_protocol::EndReason::RenterStopped, &mut out);
            }
            RenterPhase::Running => {
                // Silence is counted from now: this node was not listening.
                lease.rec.last_contact = lease.rec.last_contact.max(now);
                out.push(RenterEffect::Persist);
                out.push(RenterEffect::Schedule {
                    at: lease.silent_at(),
                    timer: RenterTimer::Watchdog,
                });
            }
            RenterPhase::Ended => out.push(RenterEffect::Schedule {
                at: now,
                timer: RenterTimer::Settle,
            }),
            RenterPhase::Settled => {}
        }
        lease.reported = true;
        Ok((lease, out))
    }

    /// The lease id.
    pub fn id(&self) -> ContentId {
        self.request.id()
    }

    /// The signed request.
    pub fn request(&self) -> &Verified<LeaseRequest> {
        &self.request
    }

    /// The record to persist.
    pub fn record(&self) -> &RenterRecord {
        &self.rec
    }

    /// Where the lease is.
    pub fn phase(&self) -> RenterPhase {
        self.rec.phase
    }

    /// Asks the host to stop the lease at `now`.
    pub fn stop(&mut self, now: Timestamp) -> Result<Vec<RenterEffect>, StopError> {
        if matches!(self.rec.phase, RenterPhase::Ended | RenterPhase::Settled) {
            return Err(StopError::Ended);
        }
        let mut out = Vec::new();
        // Recorded first: whatever happens to the message, receipts billing past the stop
        // (and its grace) are disputed.
        self.rec.stop_requested_at.get_or_insert(now);
        out.push(RenterEffect::Persist);
        self.send_end(now, gpux_protocol::EndReason::RenterStopped, &mut out);
        Ok(out)
    }

    /// When the commit must reach the host, for a lease that waits for one.
    pub fn commit_by(&self) -> Option<Timestamp> {
        self.rec.commit_by
    }

    /// Commits a held lease at `now`: its work starts (the host's clock for it runs from
    /// here, and so does this node's bound on what it acknowledges).
    pub fn commit(&mut self, now: Timestamp) -> Result<Vec<RenterEffect>, CommitError> {
        if self.rec.phase != RenterPhase::Held || self.rec.gave_up {
            return Err(CommitError::NotHeld);
        }
        if self.commit_by().is_none_or(|by| now > by) {
            return Err(CommitError::TooLate);
        }
        let body = gpux_protocol::LeaseCommit {
            lease: self.id(),
            created_at: now,
            ext: Ext::new(),
        };
        let commit = Signed::sign(&self.key, body).map_err(|_| CommitError::NotHeld)?;
        self.rec.committed_at = Some(now);
        self.rec.starts_at = self.rec.starts_at.max(now);
        self.rec.phase = RenterPhase::Running;
        self.rec.last_contact = now;
        Ok(vec![
            RenterEffect::Persist,
            RenterEffect::SendCommit {
                envelope: commit.as_bytes().to_vec(),
            },
            RenterEffect::Schedule {
                at: self.silent_at(),
                timer: RenterTimer::Watchdog,
            },
        ])
    }

    /// The renter's performance challenge failed. A held lease ends now, before its work,
    /// and the host is told why (it ends it unpaid and releases the escrow). A running one
    /// is stopped as a renter's stop is (receipts billing past now and the grace are
    /// disputed), its end saying why: it pays what ran, never the window's committed
    /// minimum.
    pub fn fail_challenge(&mut self, now: Timestamp) -> Result<Vec<RenterEffect>, CommitError> {
        let mut out = Vec::new();
        match self.rec.phase {
            RenterPhase::Held => self.end(now, End::ChallengeFailed, &mut out),
            RenterPhase::Running => {
                self.rec.stop_requested_at.get_or_insert(now);
                out.push(RenterEffect::Persist);
            }
            _ => return Err(CommitError::NotHeld),
        }
        self.send_end(now, gpux_protocol::EndReason::ChallengeFailed, &mut out);
        Ok(out)
    }

    fn silent_at(&self) -> Timestamp {
        // A lease booked from later has nothing to say before its start.
        self.rec
            .last_contact
            .max(self.rec.starts_at)
            .plus_ms(self.rec.timing.loss_bound_ms() + SILENCE_MARGIN_MS)
    }

    /// A preemption notice from the host: checked against the lease and the notice period
    /// the acceptance agreed, and not dated ahead of this node's clock. A notice that holds
    /// caps what the host may bill at its end; one that does not is refused (recorded) and
    /// changes nothing.
    fn on_notice(
        &mut self,
        now: Timestamp,
        notice: &Verified<PreemptionNotice>,
        out: &mut Vec<RenterEffect>,
    ) {
        if matches!(self.rec.phase, RenterPhase::Ended | RenterPhase::Settled)
            || notice.signer() != self.request.host
            || notice.lease != self.id()
        {
            return;
        }
        let holds = notice.created_at <= now.plus_ms(RECEIPT_SKEW_MS)
            && notice_matches_lease(notice, &self.request, self.rec.timing.spot_notice_ms).is_ok();
        if holds {
            let until = self
                .rec
                .preempted_until
                .map_or(notice.ends_at, |t| t.min(notice.ends_at));
            self.rec.preempted_until = Some(until);
            self.rec.last_contact = self.rec.last_contact.max(now);
        } else {
            self.rec.notice_refused = true;
        }
        out.push(RenterEffect::Persist);
    }

    fn sign_end(&self, now: Timestamp, reason: gpux_protocol::EndReason) -> Vec<u8> {
        let body = LeaseEnd {
            lease: self.id(),
            created_at: now,
            reason,
            exit_code: None,
            ext: Ext::new(),
        };
        Signed::sign(&self.key, body)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default()
    }

    fn send_end(
        &self,
        now: Timestamp,
        reason: gpux_protocol::EndReason,
        out: &mut Vec<RenterEffect>,
    ) {
        out.push(RenterEffect::SendEnd {
            envelope: self.sign_end(now, reason),
        });
    }

    fn report(&mut self, report: RentReport, out: &mut Vec<RenterEffect>) {
        if !self.reported {
            self.reported = true;
            out.push(RenterEffect::Report(report));
        }
    }

    /// Handles one input at `now`.
    pub fn handle(&mut self, now: Timestamp, input: RenterInput) -> Vec<RenterEffect> {
        let mut out = Vec::new();
        match input {
            RenterInput::Lock(outcome) => self.on_lock(now, outcome, &mut out),
            RenterInput::Receipt(receipt) => self.on_receipt(now, &receipt, &mut out),
            RenterInput::HostEnd(end) => self.on_host_end(now, &end, &mut out),
            RenterInput::Notice(notice) => self.on_notice(now, &notice, &mut out),
            RenterInput::HostHeard { log_bytes } => {
                if self.rec.phase == RenterPhase::Running {
                    self.rec.last_contact = now;
                }
                self.rec.log_chunks += 1;
                self.rec.log_bytes += log_bytes;
                out.push(RenterEffect::Persist);
            }
            RenterInput::Ledger { call, verdict } => self.on_ledger(now, call, verdict, &mut out),
            RenterInput::StoreFailed => {
                if matches!(self.rec.phase, RenterPhase::Ended | RenterPhase::Settled) {
                    return out;
                }
                if self.rec.phase == RenterPhase::Starting {
                    self.report(
                        RentReport::Failed {
                            end: End::StoreFailed,
                            detail: "this node could not store the lease's records".into(),
                        },
                        &mut out,
                    );
                }
                self.end(now, End::StoreFailed, &mut out);
                self.send_end(now, gpux_protocol::EndReason::StoreFailed, &mut out);
            }
            RenterInput::Timer(RenterTimer::Watchdog) => {
                if self.rec.phase == RenterPhase::Held {
                    // Never committed: the host ends it unpaid; so does this side.
                    if self.commit_by().is_some_and(|by| now >= by) {
                        self.end(now, End::NotCommitted, &mut out);
                        self.send_end(now, gpux_protocol::EndReason::RenterStopped, &mut out);
                    }
                    return out;
                }
                if self.rec.phase != RenterPhase::Running {
                    return out;
                }
                if now >= self.silent_at() {
                    self.end(now, End::HostSilent, &mut out);
                } else {
                    out.push(RenterEffect::Schedule {
                        at: self.silent_at(),
                        timer: RenterTimer::Watchdog,
                    });
                }
            }
            RenterInput::Timer(RenterTimer::Settle) => self.settle(now, &mut out),
        }
        out
    }

    fn on_lock(&mut self, now: Timestamp, outcome: LockOutcome, out: &mut Vec<RenterEffect>) {
        if self.rec.gave_up {
            return;
        }
        match outcome {
            LockOutcome::Record(record)
                if (record.signer() == self.rec.ledger
                    || self.ledger_members.contains(&record.signer()))
                    && record.escrow == self.request.escrow
                    && record.op == self.lock.id()
                    && matches!(
                        record.entry,
                        LedgerEntry::Locked { payer, payee, amount }
                            if payer == self.key.public()
                                && payee == self.request.host
                                && amount == self.request.escrow_amount
                    ) =>
            {
                self.rec.confirmed = true;
                if self.rec.phase == RenterPhase::Starting
                    && let Some(by) = self.commit_by()
                    && self.rec.committed_at.is_none()
                {
                    // Held for the renter's commit.
                    self.rec.phase = RenterPhase::Held;
                    out.push(RenterEffect::Persist);
                    out.push(RenterEffect::Schedule {
                        at: by,
                        timer: RenterTimer::Watchdog,
                    });
                    return self.report(RentReport::Held, out);
                }
                if self.rec.phase == RenterPhase::Starting {
                    self.rec.phase = RenterPhase::Running;
                    self.rec.last_contact = now;
                    out.push(RenterEffect::Schedule {
                        at: self.silent_at(),
                        timer: RenterTimer::Watchdog,
                    });
                }
                out.push(RenterEffect::Persist);
                self.report(RentReport::Running, out);
            }
            LockOutcome::Rejected(reject)
                if reject.signer() == self.request.host && reject.request == self.id() =>
            {
                if self.rec.acked.is_some() {
                    // A receipt was already acknowledged: it ran, whatever the answer says.
                    return self.report(RentReport::Running, out);
                }
                let detail = format!(
                    "the host did not start the lease: {:?} ({})",
                    reject.reason, reject.detail
                );
                self.end(now, End::NotStarted, out);
                self.report(
                    RentReport::Failed {
                        end: End::NotStarted,
                        detail,
                    },
                    out,
                );
            }
            _ => {
                if self.rec.acked.is_some() {
                    // A valid receipt came first: the lease ran (and is paid for), and is
                    // reported so.
                    return self.report(RentReport::Running, out);
                }
                self.give_up(now, "the host did not confirm the start", out);
            }
        }
    }

    /// The rent is reported as failed: the host is told to stop, every receipt is
    /// disputed, and the escrow comes back whole.
    fn give_up(&mut self, now: Timestamp, why: &str, out: &mut Vec<RenterEffect>) {
        self.rec.gave_up = true;
        self.end(now, End::StartUnconfirmed, out);
        self.send_end(now, gpux_protocol::EndReason::RenterStopped, out);
        self.report(
            RentReport::Failed {
                end: End::StartUnconfirmed,
                detail: format!("{why}; the lease will not be paid for"),
            },
            out,
        );
    }

    fn dispute(&self, now: Timestamp, out: &mut Vec<RenterEffect>) {
        // Nothing is recorded: the host ends the lease itself when no acknowledgement comes.
        out.push(RenterEffect::Respond {
            envelope: self.sign_end(now, gpux_protocol::EndReason::ReceiptDisputed),
        });
    }

    fn on_receipt(
        &mut self,
        now: Timestamp,
        receipt: &Verified<UsageReceipt>,
        out: &mut Vec<RenterEffect>,
    ) {
        // Only the lease's host gets an answer: a signed dispute handed to anyone else could
        // be replayed to the host.
        if receipt.signer() != self.request.host || receipt.lease != self.id() {
            return out.push(RenterEffect::Respond {
                envelope: Vec::new(),
            });
        }
        // Nothing runs before the commit, so nothing is owed for it.
        if self.rec.gave_up
            || matches!(
                self.rec.phase,
                RenterPhase::Held | RenterPhase::Ended | RenterPhase::Settled
            )
        {
            return self.dispute(now, out);
        }
        // The receipt's time is the host's word: it may not be ahead of this node's clock.
        if receipt.created_at > now.plus_ms(RECEIPT_SKEW_MS) {
            return self.dispute(now, out);
        }
        let started = self.rec.lock_sent_at.max(self.rec.starts_at);
        if receipt_matches_lease(receipt, &self.request, started).is_err() {
            return self.dispute(now, out);
        }
        // This node's own measure: whole seconds since it asked for the start (one more for
        // rounding), never past the agreed duration, nor much past a stop it asked for, nor
        // past the end of a preemption's notice.
        let mut until = now;
        if let Some(stop) = self.rec.stop_requested_at {
            until = until.min(stop.plus_ms(self.rec.timing.ack_grace_ms));
        }
        if let Some(end) = self.rec.preempted_until {
            until = until.min(end);
        }
        let own_s = (until.ms_since(started) / 1000 + 1).min(u64::from(self.request.duration_s));
        let mut max = crate::bill::most_gpu_seconds(&self.request, own_s);
        match self.rec.stop_requested_at {
            // A reserved window this node cancelled before it could begin (the stop reached
            // the host, with the grace, before the window's start) owes its fee schedule's
            // share of the committed minimum for that time, and nothing else.
            Some(stop)
                if matches!(self.request.kind, LeaseKind::Reserved { start, .. }
                    if stop.plus_ms(self.rec.timing.ack_grace_ms) < start) =>
            {
                let late = stop.plus_ms(self.rec.timing.ack_grace_ms);
                max = crate::bill::cancel_gpu_seconds(&self.request, late);
            }
            // A reserved window this node stopped early owes its committed minimum.
            Some(_) => max = max.max(crate::bill::committed_gpu_seconds(&self.request)),
            None => {}
        }
        if receipt.gpu_seconds > max {
            return self.dispute(now, out);
        }
        if let Some(v) = &self.rec.acked {
            if receipt.seq < v.seq || receipt.amount_due < v.amount {
                return self.dispute(now, out);
            }
            if receipt.seq == v.seq {
                // The same receipt again (a retry): the same acknowledgement.
                if receipt.as_bytes() == v.receipt.as_slice() {
                    return out.push(RenterEffect::Respond {
                        envelope: v.ack.clone(),
                    });
                }
                return self.dispute(now, out);
            }
        }
        let body = ReceiptAck {
            receipt: receipt.id(),
            lease: receipt.lease,
            seq: receipt.seq,
            amount_due: receipt.amount_due,
            created_at: now,
            ext: Ext::new(),
        };
        let Ok(ack) = Signed::sign(&self.key, body) else {
            return;
        };
        self.rec.last_seq = self.rec.last_seq.max(receipt.seq);
        self.rec.acked = Some(Voucher {
            seq: receipt.seq,
            amount: receipt.amount_due,
            gpu_seconds: receipt.gpu_seconds,
            receipt: receipt.as_bytes().to_vec(),
            ack: ack.as_bytes().to_vec(),
        });
        self.rec.last_contact = now;
        if self.rec.phase == RenterPhase::Starting {
            // The host started it (its confirmation may be on its way, or lost).
            self.rec.phase = RenterPhase::Running;
            out.push(RenterEffect::Schedule {
                at: self.silent_at(),
                timer: RenterTimer::Watchdog,
            });
        }
        // Stored (flushed) before the host hears of it: a restarted renter knows what it
        // agreed to pay.
        out.push(RenterEffect::Persist);
        out.push(RenterEffect::Respond {
            envelope: ack.as_bytes().to_vec(),
        });
    }

    fn on_host_end(
        &mut self,
        now: Timestamp,
        end: &Verified<LeaseEnd>,
        out: &mut Vec<RenterEffect>,
    ) {
        if end.signer() != self.request.host || end.lease != self.id() {
            return;
        }
        let reason = End::from_wire(end.reason);
        self.rec.host_end = Some(reason);
        self.rec.exit_code = end.exit_code;
        if self.rec.phase == RenterPhase::Starting {
            self.report(
                RentReport::Failed {
                    end: reason,
                    detail: format!("the host ended the lease as it started ({:?})", end.reason),
                },
                out,
            );
        }
        // Both sides record the same reason: the host's, unless this side ended it first for
        // a reason of its own.
        if !matches!(self.rec.phase, RenterPhase::Ended | RenterPhase::Settled) {
            self.end(now, reason, out);
        } else {
            out.push(RenterEffect::Persist);
        }
    }

    fn end(&mut self, now: Timestamp, end: End, out: &mut Vec<RenterEffect>) {
        if matches!(self.rec.phase, RenterPhase::Ended | RenterPhase::Settled) {
            return;
        }
        self.rec.end = Some(end);
        self.rec.ended_at = Some(now);
        self.rec.phase = RenterPhase::Ended;
        out.push(RenterEffect::Persist);
        out.push(RenterEffect::Schedule {
            at: now.plus_ms(SETTLE_DELAY_MS),
            timer: RenterTimer::Settle,
        });
    }

    fn settle(&mut self, now: Timestamp, out: &mut Vec<RenterEffect>) {
        if self.rec.phase != RenterPhase::Ended || self.ledger_busy {
            return;
        }
        let mut body = Release {
            escrow: self.request.escrow,
            lease: self.id(),
            created_at: now,
            ext: Ext::new(),
        };
        if let Some(v) = &self.rec.acked {
            let _ = body.set_voucher(&v.ack);
        }
        // How it ended, as this node saw it, for the ledger's record of the host.
        if let Some(end) = self.rec.end {
            let _ = body.set_outcome(gpux_protocol::LeaseOutcome {
                reason: end.wire(),
                spot: matches!(self.request.kind, LeaseKind::Spot),
            });
        }
        let Ok(release) = Signed::sign(&self.key, body) else {
            return;
        };
        self.ledger_busy = true;
        out.push(RenterEffect::Ledger {
            call: LedgerCall::Release,
            envelope: release.as_bytes().to_vec(),
        });
    }

    fn on_ledger(
        &mut self,
        now: Timestamp,
        call: LedgerCall,
        verdict: LedgerVerdict,
        out: &mut Vec<RenterEffect>,
    ) {
        if call != LedgerCall::Release || !self.ledger_busy {
            return;
        }
        self.ledger_busy = false;
        if !matches!(verdict, LedgerVerdict::Unreachable) {
            self.ledger_failures = 0;
        }
        let again_at = match verdict {
            LedgerVerdict::Applied(_)
            | LedgerVerdict::Unchanged
            | LedgerVerdict::Refused {
                code: RefusalCode::EscrowClosed,
                ..
            } => {
                self.rec.phase = RenterPhase::Settled;
                out.push(RenterEffect::Persist);
                return;
            }
            LedgerVerdict::Refused {
                code: RefusalCode::UnknownEscrow,
                ..
            } => {
                // Never locked, and too old to be locked now (with a margin for the ledger's
                // clock running behind this node's): nothing to settle.
                if now.ms_since(self.lock.created_at) > MAX_LOCK_AGE_MS + LOCK_AGE_MARGIN_MS {
                    self.rec.phase = RenterPhase::Settled;
                    out.push(RenterEffect::Persist);
                    return;
                }
                now.plus_ms(SETTLE_POLL_MS)
            }
            LedgerVerdict::Refused {
                code: RefusalCode::TooEarly,
                retry_at,
            } => retry_at
                .unwrap_or(now)
                .min(now.plus_ms(SETTLE_POLL_MS))
                .max(now),
            LedgerVerdict::Refused { .. } => now.plus_ms(SETTLE_POLL_MS),
            LedgerVerdict::Unreachable => {
                let delay = backoff_ms(self.ledger_failures);
                self.ledger_failures = self.ledger_failures.saturating_add(1);
                now.plus_ms(delay)
            }
        };
        out.push(RenterEffect::Schedule {
            at: again_at,
            timer: RenterTimer::Settle,
        });
    }
}
