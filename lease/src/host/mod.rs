//! The host's side of one lease.
//!
//! From the signed `LeaseAccept` on: the renter's escrow lock goes to the ledger; once the
//! ledger confirms it the container starts, and the renter gets the ledger's record; the
//! work is billed per second from Docker's start; every receipt interval a cumulative
//! receipt is signed and sent; each acknowledgement is redeemed at once; the work stops at
//! its deadline, on the renter's word, on a dispute, when the escrow is exhausted, or when the
//! renter owes an acknowledgement for longer than the grace; then the final bill (Docker's
//! runtime, never past the deadline) goes out, the container is erased, and the escrow is
//! closed with the latest voucher.
//!
//! Loss bound: the ack deadline runs from the end of the time the latest acknowledged
//! receipt covers, not from when a receipt happened to be sent, so however late receipts
//! go out (a slow Docker, a busy node) the host's unpaid runtime stays within one receipt
//! interval plus the grace, for the time its node is up.

use gpux_protocol::{
    ContentId, Keypair, LeaseAccept, LeaseKind, LeaseRequest, MicroCredits, Signed, Timestamp,
    Verified,
};

use crate::{End, LedgerCall, RestoreError, Timing, bill};

/// An escrow lock must come this soon after the acceptance: the GPUs are booked from the
/// acceptance, and the work must fit in the booking.
pub(crate) const LOCK_WINDOW_MS: u64 = 10_000;
/// An accepted lease whose escrow is not locked by then is dropped (its GPUs freed).
pub(crate) const LOCK_WAIT_MS: u64 = 30_000;
/// How long the host keeps trying the ledger with a lock before it refuses the renter.
const LOCK_RETRY_MS: u64 = 8_000;
/// How long the final receipt waits for its answer.
const FINAL_RECEIPT_WAIT_MS: u64 = 5_000;
/// A container asked to stop that has not exited by then is killed again.
const STOP_WAIT_MS: u64 = 10_000;
/// Receipts kept for matching late acknowledgements.
const KEPT_RECEIPTS: usize = 4;
/// The shell learns that a container exited within this time (it waits on the container,
/// and inspects it every second besides). A periodic receipt bills only up to this long
/// ago, so it never bills time after an exit the host has not heard of yet; the final
/// receipt bills Docker's exact runtime.
pub const EXIT_NOTICE_MS: u64 = 1_000;
/// A preempted workload is asked to stop (SIGTERM) this long before its notice ends, or
/// halfway through a shorter notice, and killed at the end: it is gone by then.
pub const PREEMPT_TERM_MS: u64 = 10_000;

mod io;
mod ledger;
mod work;

pub use io::{
    ContainerState, HostEffect, HostInput, HostPhase, HostRecord, HostTimer, Meter, Preemption,
    RenterAnswer, StartFailure, UsageSample,
};

/// The host's side of one lease.
///
/// From the signed `LeaseAccept` on: the renter's escrow lock goes to the ledger; once the
/// ledger confirms it the container starts, and the renter gets the ledger's record; the
/// work is billed per second from Docker's start; every receipt interval a cumulative
/// receipt is signed and sent; each acknowledgement is redeemed at once; the work stops at
/// its deadline, on the renter's word, on a dispute, when the escrow is exhausted, or when the
/// renter owes an acknowledgement for longer than the grace; then the final bill (Docker's
/// runtime, never past the deadline) goes out, the container is erased, and the escrow is
/// closed with the latest voucher.
///
/// Loss bound: the ack deadline runs from the end of the time the latest acknowledged
/// receipt covers, not from when a receipt happened to be sent, so however late receipts
/// go out (a slow Docker, a busy node) the host's unpaid runtime stays within one receipt
/// interval plus the grace, for the time its node is up.
#[derive(Debug, Clone)]
pub struct HostLease {
    key: Keypair,
    request: Verified<LeaseRequest>,
    rec: HostRecord,
    /// A ledger operation is in flight (never two at once).
    ledger_busy: Option<LedgerCall>,
    /// Failed ledger attempts in a row.
    ledger_failures: u32,
    /// When the first attempt of the lock was made (for the retry limit).
    lock_first_tried: Option<Timestamp>,
    /// Whether the renter's lock request still waits for its answer.
    lock_pending: bool,
    /// The lock holds and the container waits for the booking's start or the renter's
    /// commit (not persisted: a restart ends a lease that was starting).
    start_deferred: bool,
    /// The earliest the container may start (the booking's start, or the end of the notice
    /// of the spot leases this lease preempts).
    start_not_before: Timestamp,
}

impl HostLease {
    /// A lease the host has just accepted (`accept` signed over `request`, booked from the
    /// acceptance or from the time its `starts_at` says, to be
    /// stored before it is sent), preempting the spot leases `preempts` once its escrow is
    /// locked. Effects: persist, and the lock-wait timer.
    pub fn accepted(
        key: Keypair,
        request: Verified<LeaseRequest>,
        accept: &Verified<LeaseAccept>,
        timing: Timing,
        preempts: Vec<ContentId>,
    ) -> (Self, Vec<HostEffect>) {
        let now = accept.created_at;
        let rec = HostRecord {
            request: request.as_bytes().to_vec(),
            accept: accept.as_bytes().to_vec(),
            accepted_at: now,
            starts_at: crate::accept_starts_at(accept).unwrap_or(now),
            preemption: None,
            preempts,
            committed_at: None,
            timing,
            phase: HostPhase::AwaitingLock,
            lock: None,
            lock_record: None,
            started_at: None,
            finished_at: None,
            exit_code: None,
            last_seq: 0,
            next_receipt_at: now,
            ack_from: now,
            sent: Vec::new(),
            acked: None,
            redeemed_seq: 0,
            redeemed: MicroCredits::ZERO,
            end: None,
            ended_at: None,
            usage: Meter::default(),
            log_cursor: None,
            log_chunks: 0,
            log_bytes: 0,
            erased: false,
        };
        let lease = Self::from_parts(key, request, rec);
        let effects = vec![
            HostEffect::Persist,
            HostEffect::Schedule {
                at: now.plus_ms(LOCK_WAIT_MS),
                timer: HostTimer::LockWait,
            },
        ];
        (lease, effects)
    }

    fn from_parts(key: Keypair, request: Verified<LeaseRequest>, rec: HostRecord) -> Self {
        Self {
            key,
            request,
            rec,
            ledger_busy: None,
            ledger_failures: 0,
            lock_first_tried: None,
            lock_pending: false,
            start_deferred: false,
            start_not_before: Timestamp(0),
        }
    }

    /// A lease from its stored record after a restart, with what the host found of its
    /// container. The effects resume it (metering a container still running within its
    /// time) or end and settle it.
    pub fn restore(
        key: Keypair,
        rec: HostRecord,
        container: ContainerState,
        now: Timestamp,
    ) -> Result<(Self, Vec<HostEffect>), RestoreError> {
        let request = Signed::<LeaseRequest>::from_bytes(rec.request.clone())
            .and_then(Signed::verify)
            .map_err(|e| RestoreError(e.to_string()))?;
        let mut lease = Self::from_parts(key, request, rec);
        let mut out = Vec::new();
        match lease.rec.phase {
            HostPhase::AwaitingLock => out.push(HostEffect::Schedule {
                at: lease.rec.accepted_at.plus_ms(LOCK_WAIT_MS),
                timer: HostTimer::LockWait,
            }),
            // A locked lease whose start waits (a window booked ahead, the notice of the spot
            // leases it preempts, the renter's commit), and whose container was never made:
            // the renter was told the lock holds and waits for the start, so it keeps
            // waiting, and starts then.
            HostPhase::Starting
                if matches!(container, ContainerState::Absent)
                    && lease.rec.lock_record.is_some()
                    && lease.rec.started_at.is_none()
                    && (now < lease.rec.starts_at || lease.commit_wait_ms().is_some()) =>
            {
                lease.start_deferred = true;
                lease.start_not_before = lease.rec.starts_at;
                if let Some(by) = lease.commit_by() {
                    out.push(HostEffect::Schedule {
                        at: by,
                        timer: HostTimer::CommitWait,
                    });
                }
                lease.try_start(now, &mut out);
            }
            // The renter's request for the start died with the old process: the renter has
            // given up on it (and pays nothing), so the work must not run.
            HostPhase::Locking | HostPhase::Starting => {
                lease.end(now, End::HostShutdown, &mut out);
                match container {
                    // It started after all: nothing reports a start any more, so it is
                    // stopped now.
                    ContainerState::Running { started_at } => {
                        lease.rec.started_at = Some(started_at);
                        out.push(HostEffect::Persist);
                        out.push(HostEffect::StopContainer { grace_s: 0 });
                        out.push(HostEffect::Schedule {
                            at: now.plus_ms(STOP_WAIT_MS),
                            timer: HostTimer::StopWait,
                        });
                    }
                    ContainerState::Exited {
                        started_at,
                        finished_at,
                        exit_code,
                    } => {
                        lease.rec.started_at = started_at.or(lease.rec.started_at);
                        lease.on_exited(now, finished_at, exit_code, &mut out);
                    }
                    ContainerState::Absent => lease.on_exited(now, None, None, &mut out),
                }
            }
            HostPhase::Running => match container {
                ContainerState::Running { started_at } => {
                    lease.rec.started_at.get_or_insert(started_at);
                    // Whatever ran while this node was down is at its own risk; the renter
                    // gets a fresh receipt now and the grace to acknowledge it.
                    let interval = lease.rec.timing.receipt_interval_ms;
                    lease.rec.ack_from = lease
                        .rec
                        .ack_from
                        .max(Timestamp(now.0.saturating_sub(interval)));
                    lease.rec.next_receipt_at = now;
                    out.push(HostEffect::Persist);
                    out.push(HostEffect::Schedule {
                        at: now,
                        timer: HostTimer::ReceiptDue,
                    });
                    out.push(HostEffect::Schedule {
                        at: lease.deadline(),
                        timer: HostTimer::Deadline,
                    });
                    out.push(HostEffect::Schedule {
                        at: lease.ack_deadline(),
                        timer: HostTimer::AckDeadline,
                    });
                }
                ContainerState::Exited {
                    finished_at,
                    exit_code,
                    ..
                } => {
                    let end = lease.natural_end(finished_at.unwrap_or(now));
                    lease.end(now, end, &mut out);
                    lease.on_exited(now, finished_at, exit_code, &mut out);
                }
                ContainerState::Absent => {
                    lease.end(now, End::ContainerFailed, &mut out);
                    lease.on_exited(now, None, None, &mut out);
                }
            },
            HostPhase::Stopping => match container {
                ContainerState::Running { .. } => {
                    out.push(HostEffect::StopContainer { grace_s: 0 })
                }
                ContainerState::Exited {
                    finished_at,
                    exit_code,
                    ..
                } => lease.on_exited(now, finished_at, exit_code, &mut out),
                ContainerState::Absent => lease.on_exited(now, None, None, &mut out),
            },
            // The final receipt's answer is lost with the old process.
            HostPhase::FinalReceipt => lease.finish(now, &mut out),
            HostPhase::Ended => {
                if !lease.rec.erased && container != ContainerState::Absent {
                    out.push(HostEffect::EraseContainer);
                }
                lease.settle(now, &mut out);
            }
            HostPhase::Settled => {
                if container != ContainerState::Absent {
                    out.push(HostEffect::EraseContainer);
                }
            }
        }
        Ok((lease, out))
    }

    /// The lease id.
    pub fn id(&self) -> ContentId {
        self.request.id()
    }

    /// The signed request (the terms).
    pub fn request(&self) -> &Verified<LeaseRequest> {
        &self.request
    }

    /// The record to persist.
    pub fn record(&self) -> &HostRecord {
        &self.rec
    }

    /// Where the lease is.
    pub fn phase(&self) -> HostPhase {
        self.rec.phase
    }

    /// Whether the lease holds its GPUs (from acceptance until the work stopped).
    pub fn holds_gpus(&self) -> bool {
        matches!(
            self.rec.phase,
            HostPhase::AwaitingLock
                | HostPhase::Locking
                | HostPhase::Starting
                | HostPhase::Running
                | HostPhase::Stopping
        )
    }

    /// Whether its escrow is locked and its start waits (for its booking to begin, a spot
    /// notice to run out, or its renter's commit): nothing is under way to wait for.
    pub fn start_waits(&self) -> bool {
        self.start_deferred && self.rec.phase == HostPhase::Starting
    }

    /// The moment the work must stop: its duration from the start, but never past the
    /// booking of its GPUs (which runs from the acceptance, or from the end of the notice of
    /// the spot leases it preempts), nor past the end of a preemption's notice.
    pub fn deadline(&self) -> Timestamp {
        let duration_ms = u64::from(self.request.duration_s) * 1000;
        let booked_until = match self.request.kind {
            LeaseKind::Reserved { end, .. } => end,
            _ => self
                .rec
                .starts_at
                .plus_ms(self.commit_wait_ms().unwrap_or(0) + duration_ms),
        };
        let started = self.rec.started_at.unwrap_or(self.rec.starts_at);
        let deadline = started.plus_ms(duration_ms).min(booked_until);
        match &self.rec.preemption {
            Some(p) => deadline.min(p.ends_at),
            None => deadline,
        }
    }

    /// How long the lease waits for the renter's commit, ms (`None`: it does not).
    pub fn commit_wait_ms(&self) -> Option<u64> {
        self.request.commit_wait_ms().ok().flatten()
    }

    /// When the renter's commit must have come, for a lease that waits for one.
    pub fn commit_by(&self) -> Option<Timestamp> {
        self.commit_wait_ms().map(|w| self.rec.starts_at.plus_ms(w))
    }

    /// The preemption given to this lease, if any.
    pub fn preemption(&self) -> Option<&Preemption> {
        self.rec.preemption.as_ref()
    }

    /// How long before a preemption's end the workload is asked to stop, ms.
    fn preempt_term_ms(&self) -> u64 {
        PREEMPT_TERM_MS.min(self.rec.timing.spot_notice_ms / 2)
    }

    fn ack_deadline(&self) -> Timestamp {
        self.rec.ack_from.plus_ms(self.rec.timing.loss_bound_ms())
    }

    fn natural_end(&self, at: Timestamp) -> End {
        // A workload that exits once notified (after saving its work) was preempted.
        if self.rec.preemption.is_some() {
            End::Preempted
        } else if at >= self.deadline() {
            End::DurationReached
        } else {
            End::ContainerExited
        }
    }

    /// GPU-seconds billed up to `until` (never past the deadline nor Docker's finish), and
    /// the end of the time billed.
    fn billed_until(&self, until: Timestamp) -> (u64, Timestamp) {
        let Some(started) = self.rec.started_at else {
            // A reserved window its renter cancelled before it began pays its fee schedule's
            // share of the committed minimum, at the time the cancellation came.
            let fee = match (self.rec.end, self.rec.ended_at) {
                (Some(End::RenterStopped), Some(at)) => bill::cancel_gpu_seconds(&self.request, at),
                _ => 0,
            };
            return (fee, until);
        };
        let mut end = until.min(self.deadline());
        if let Some(finished) = self.rec.finished_at {
            end = end.min(finished);
        }
        // A lease the host ended is billed up to the moment it did (a failed GPU: the
        // fault), not the moments its container took to stop.
        if let (Some(why), Some(ended)) = (self.rec.end, self.rec.ended_at)
            && !why.owes_minimum()
        {
            end = end.min(ended);
        }
        let end = end.max(started);
        let runtime = end.ms_since(started);
        #[cfg(feature = "broken-rule")]
        let runtime = runtime + 1000;
        // Who ended it pays for the end: the minimum once the renter's side ended the lease;
        // the seconds that ran while it runs and when the host ended it.
        let mut gpu_seconds = match self.rec.end {
            Some(end) if end.owes_minimum() => bill::request_gpu_seconds(&self.request, runtime),
            _ => bill::run_gpu_seconds(&self.request, runtime),
        };
        // A reserved window its renter stopped early pays its committed minimum.
        if self.rec.end == Some(End::RenterStopped) {
            gpu_seconds = gpu_seconds.max(bill::committed_gpu_seconds(&self.request));
        }
        (gpu_seconds, end)
    }

    /// Handles one input at `now`.
    pub fn handle(&mut self, now: Timestamp, input: HostInput) -> Vec<HostEffect> {
        let mut out = Vec::new();
        match input {
            HostInput::Lock(lock) => self.on_lock(now, lock, &mut out),
            HostInput::Ledger { call, verdict } => self.on_ledger(now, call, verdict, &mut out),
            HostInput::ContainerStarted { started_at } => {
                self.on_started(now, started_at, &mut out)
            }
            HostInput::ContainerNotStarted(why) => {
                if self.rec.phase == HostPhase::Stopping && self.rec.started_at.is_none() {
                    // Ended while it was being started, and it never started.
                    self.on_exited(now, None, None, &mut out);
                } else if self.rec.phase == HostPhase::Starting {
                    let end = match why {
                        StartFailure::ImageMissing => End::ImageMissing,
                        StartFailure::Failed => End::ContainerFailed,
                    };
                    self.end(now, end, &mut out);
                    self.on_exited(now, None, None, &mut out);
                }
            }
            HostInput::ContainerExited {
                finished_at,
                exit_code,
            } => match self.rec.phase {
                HostPhase::Running => {
                    let end = self.natural_end(finished_at.unwrap_or(now));
                    let end = if finished_at.is_none() {
                        End::ContainerFailed
                    } else {
                        end
                    };
                    self.end(now, end, &mut out);
                    self.on_exited(now, finished_at, exit_code, &mut out);
                }
                HostPhase::Stopping => self.on_exited(now, finished_at, exit_code, &mut out),
                _ => {}
            },
            HostInput::ContainerErased => {
                self.rec.erased = true;
                out.push(HostEffect::Persist);
            }
            HostInput::Sample(sample) => self.on_sample(sample),
            HostInput::ReceiptAnswer { seq, answer } => self.on_answer(now, seq, answer, &mut out),
            HostInput::RenterEnd(end) => {
                if end.signer() == self.request.signer() && end.lease == self.id() {
                    match end.reason {
                        gpux_protocol::EndReason::RenterStopped => {
                            self.end(now, End::RenterStopped, &mut out)
                        }
                        gpux_protocol::EndReason::ChallengeFailed => {
                            self.end(now, End::ChallengeFailed, &mut out)
                        }
                        gpux_protocol::EndReason::StoreFailed => {
                            self.end(now, End::StoreFailed, &mut out)
                        }
                        _ => {}
                    }
                }
            }
            HostInput::Commit(commit) => self.on_commit(now, &commit, &mut out),
            HostInput::Shutdown => self.end(now, End::HostShutdown, &mut out),
            HostInput::GpuFailed { at } => {
                if self.rec.end.is_none() {
                    self.end(now, End::GpuFailed, &mut out);
                    // Billed up to the fault (the work after it was on a broken GPU).
                    self.rec.ended_at = Some(at.min(now));
                }
            }
            HostInput::StoreFailed => self.end(now, End::StoreFailed, &mut out),
            HostInput::Preempt(preemptor) => self.on_preempt(now, &preemptor, &mut out),
            HostInput::Timer(timer) => self.on_timer(now, timer, &mut out),
            HostInput::LogsShipped {
                cursor,
                chunks,
                bytes,
            } => {
                self.rec.log_cursor = Some(cursor);
                self.rec.log_chunks += chunks;
                self.rec.log_bytes += bytes;
                out.push(HostEffect::Persist);
            }
        }
        out
    }
}
