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

use gpux_protocol::ledger_wire::RefusalCode;
use gpux_protocol::validate::{ack_matches_receipt, escrow_lock_matches_request};
use gpux_protocol::{
    BoundedBytes, BoundedString, ContentId, EscrowLock, Ext, Keypair, LeaseAccept, LeaseEnd,
    LeaseKind, LeaseReject, LeaseRequest, LedgerEntry, MicroCredits, ReceiptAck, Redeem,
    RejectReason, Release, Signed, Timestamp, UsageReceipt, UsageSummary, Verified,
};

use crate::{End, LedgerCall, LedgerVerdict, RestoreError, Timing, Voucher, backoff_ms, bill};

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

/// Where the host's side of a lease is.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum HostPhase {
    /// Accepted; waiting for the renter's escrow lock.
    AwaitingLock,
    /// The lock is at the ledger.
    Locking,
    /// The ledger confirmed the lock; the container is being started.
    Starting,
    /// The workload runs and is metered.
    Running,
    /// The work is being stopped.
    Stopping,
    /// The work stopped; the final receipt waits for its answer.
    FinalReceipt,
    /// Over; the escrow is being closed.
    Ended,
    /// The escrow is closed (or nothing was ever locked).
    Settled,
}

/// A receipt sent and not yet superseded by an acknowledged one.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
struct SentReceipt {
    seq: u64,
    /// When it was signed: an acknowledgement shows the renter was there then.
    sent_at: Timestamp,
    envelope: Vec<u8>,
}

/// Usage measured over a lease.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, bincode::Encode, bincode::Decode, serde::Serialize,
)]
pub struct Meter {
    /// Peak container memory, bytes.
    pub memory_peak_bytes: u64,
    /// Container CPU time so far, ns.
    pub cpu_total_ns: u64,
    /// Sum of GPU utilisation samples, ‰.
    pub gpu_util_sum: u64,
    /// Number of GPU samples.
    pub gpu_samples: u64,
    /// Peak GPU memory, bytes.
    pub gpu_memory_peak_bytes: u64,
}

/// One sample of a running container, taken by the shell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageSample {
    /// Container memory now, bytes.
    pub memory_bytes: u64,
    /// Container CPU time so far, ns.
    pub cpu_total_ns: u64,
    /// Mean utilisation of the leased GPUs, ‰ (None: no NVML reading).
    pub gpu_util_permille: Option<u16>,
    /// GPU memory used on the leased GPUs, bytes.
    pub gpu_memory_bytes: Option<u64>,
}

/// The host's whole record of one lease: what the shell persists (flushed) whenever the
/// machine says [`HostEffect::Persist`], and all a restarted host needs.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct HostRecord {
    /// The signed `LeaseRequest`, as received.
    pub request: Vec<u8>,
    /// The signed `LeaseAccept`, as sent.
    pub accept: Vec<u8>,
    /// When the host accepted (the GPUs are booked from then).
    pub accepted_at: Timestamp,
    /// The receipt timing announced in the acceptance.
    pub timing: Timing,
    /// Where the lease is.
    pub phase: HostPhase,
    /// The renter's `EscrowLock`, once it came.
    pub lock: Option<Vec<u8>>,
    /// The ledger's `Locked` record.
    pub lock_record: Option<Vec<u8>>,
    /// The container's start, by Docker's clock.
    pub started_at: Option<Timestamp>,
    /// The container's end, by Docker's clock.
    pub finished_at: Option<Timestamp>,
    /// The workload's exit code.
    pub exit_code: Option<i64>,
    /// The last receipt seq signed.
    pub last_seq: u64,
    /// When the next periodic receipt is due.
    pub next_receipt_at: Timestamp,
    /// The renter owes the next acknowledgement for the time after this.
    pub ack_from: Timestamp,
    sent: Vec<SentReceipt>,
    /// The latest acknowledged receipt.
    pub acked: Option<Voucher>,
    /// The last receipt seq redeemed at the ledger.
    pub redeemed_seq: u64,
    /// What the ledger has paid so far (as its records say).
    pub redeemed: MicroCredits,
    /// Why it ended, once it has.
    pub end: Option<End>,
    /// When it ended.
    pub ended_at: Option<Timestamp>,
    /// Usage measured.
    pub usage: Meter,
    /// The shell's log shipping: where the next read of the container's output starts.
    pub log_cursor: Option<String>,
    /// Log chunks sent.
    pub log_chunks: u64,
    /// Log bytes sent.
    pub log_bytes: u64,
    /// Whether the container was erased (and its absence checked).
    pub erased: bool,
}

/// The renter's answer to a receipt, as the shell read it.
#[derive(Debug, Clone)]
pub enum RenterAnswer {
    /// A countersignature.
    Ack(Verified<ReceiptAck>),
    /// A `LeaseEnd` disputing the receipt.
    Dispute(Verified<LeaseEnd>),
    /// No usable answer: not delivered, timed out, unexpected or not verifying.
    Nothing,
}

/// Why a container did not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFailure {
    /// The image is not on this host.
    ImageMissing,
    /// Anything else (Docker refused, the container vanished as it started).
    Failed,
}

/// What a restarted host found of a lease's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    /// Running, started at this time (Docker's clock).
    Running {
        /// Docker's start time.
        started_at: Timestamp,
    },
    /// Stopped.
    Exited {
        /// Docker's start time.
        started_at: Option<Timestamp>,
        /// Docker's finish time.
        finished_at: Option<Timestamp>,
        /// Exit code.
        exit_code: Option<i64>,
    },
    /// No container with the lease's label.
    Absent,
}

/// The host's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostTimer {
    /// A periodic receipt is due.
    ReceiptDue,
    /// The renter's acknowledgement is due.
    AckDeadline,
    /// The lease's time is up: the work is killed.
    Deadline,
    /// The escrow lock is overdue.
    LockWait,
    /// Try the ledger again.
    LedgerRetry,
    /// The final receipt's answer is overdue.
    FinalReceiptWait,
    /// The container should have exited by now.
    StopWait,
}

/// What can happen to a lease on the host.
#[derive(Debug, Clone)]
pub enum HostInput {
    /// The renter's escrow lock (verified).
    Lock(Verified<EscrowLock>),
    /// The ledger's verdict on an operation the machine asked for.
    Ledger {
        /// Which.
        call: LedgerCall,
        /// What became of it.
        verdict: LedgerVerdict,
    },
    /// The container runs (Docker's start time).
    ContainerStarted {
        /// Docker's start time.
        started_at: Timestamp,
    },
    /// The container could not start.
    ContainerNotStarted(StartFailure),
    /// The container stopped (Docker's finish time; None when it vanished).
    ContainerExited {
        /// Docker's finish time.
        finished_at: Option<Timestamp>,
        /// Exit code.
        exit_code: Option<i64>,
    },
    /// The container was removed and its absence checked.
    ContainerErased,
    /// A usage sample.
    Sample(UsageSample),
    /// The renter's answer to receipt `seq`.
    ReceiptAnswer {
        /// The receipt.
        seq: u64,
        /// The answer.
        answer: RenterAnswer,
    },
    /// A `LeaseEnd` from the renter (verified).
    RenterEnd(Verified<LeaseEnd>),
    /// The host node is shutting down.
    Shutdown,
    /// A timer fired.
    Timer(HostTimer),
    /// The shell shipped container output up to `cursor`.
    LogsShipped {
        /// Where the next read starts.
        cursor: String,
        /// Chunks shipped by this step.
        chunks: u64,
        /// Bytes shipped by this step.
        bytes: u64,
    },
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEffect {
    /// Store [`HostLease::record`] (flushed) before carrying out the effects after it.
    Persist,
    /// Submit a signed operation to the ledger; report the verdict as [`HostInput::Ledger`].
    Ledger {
        /// Which.
        call: LedgerCall,
        /// The signed envelope.
        envelope: Vec<u8>,
    },
    /// Answer the renter's pending escrow-lock request with this envelope (the ledger's
    /// `Locked` record, or a signed `LeaseReject`).
    AnswerLock {
        /// The answer.
        envelope: Vec<u8>,
        /// Whether it says the lease runs.
        started: bool,
    },
    /// Start the lease's container; report [`HostInput::ContainerStarted`] or
    /// [`HostInput::ContainerNotStarted`].
    StartContainer,
    /// Stop the container (SIGTERM, then SIGKILL after `grace_s`); report
    /// [`HostInput::ContainerExited`].
    StopContainer {
        /// Seconds before the kill.
        grace_s: u32,
    },
    /// Remove the container and check it is gone; report [`HostInput::ContainerErased`].
    EraseContainer,
    /// Send a receipt to the renter; report the answer as [`HostInput::ReceiptAnswer`].
    SendReceipt {
        /// The receipt's seq.
        seq: u64,
        /// The signed `UsageReceipt`.
        envelope: Vec<u8>,
    },
    /// Send a signed `LeaseEnd` to the renter (no answer expected).
    SendEnd {
        /// The envelope.
        envelope: Vec<u8>,
    },
    /// Report [`HostInput::Timer`] at `at` (earlier timers of the same kind may be kept;
    /// the machine ignores one that fires when it is not due).
    Schedule {
        /// When.
        at: Timestamp,
        /// Which.
        timer: HostTimer,
    },
    /// The lease's GPUs are free again (the booking is released).
    FreeGpus,
}

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
}

impl HostLease {
    /// A lease the host has just accepted (`accept` signed over `request`, booked, to be
    /// stored before it is sent). Effects: persist, and the lock-wait timer.
    pub fn accepted(
        key: Keypair,
        request: Verified<LeaseRequest>,
        accept: &Verified<LeaseAccept>,
        timing: Timing,
    ) -> (Self, Vec<HostEffect>) {
        let now = accept.created_at;
        let rec = HostRecord {
            request: request.as_bytes().to_vec(),
            accept: accept.as_bytes().to_vec(),
            accepted_at: now,
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
            // The renter's request for the start died with the old process: the renter has
            // given up on it (and pays nothing), so the work must not run.
            HostPhase::Locking | HostPhase::Starting => {
                lease.end(now, End::HostShutdown, &mut out);
                if let ContainerState::Exited { .. } | ContainerState::Absent = container {
                    lease.on_exited(now, None, None, &mut out);
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

    /// The moment the work must stop: its duration from the start, but never past the
    /// booking of its GPUs (which runs from the acceptance).
    pub fn deadline(&self) -> Timestamp {
        let duration_ms = u64::from(self.request.duration_s) * 1000;
        let booked_until = match self.request.kind {
            LeaseKind::Reserved { end, .. } => end,
            _ => self.rec.accepted_at.plus_ms(duration_ms),
        };
        let started = self.rec.started_at.unwrap_or(self.rec.accepted_at);
        started.plus_ms(duration_ms).min(booked_until)
    }

    fn ack_deadline(&self) -> Timestamp {
        self.rec.ack_from.plus_ms(self.rec.timing.loss_bound_ms())
    }

    fn natural_end(&self, at: Timestamp) -> End {
        if at >= self.deadline() {
            End::DurationReached
        } else {
            End::ContainerExited
        }
    }

    /// GPU-seconds billed up to `until` (never past the deadline nor Docker's finish), and
    /// the end of the time billed.
    fn billed_until(&self, until: Timestamp) -> (u64, Timestamp) {
        let Some(started) = self.rec.started_at else {
            return (0, until);
        };
        let mut end = until.min(self.deadline());
        if let Some(finished) = self.rec.finished_at {
            end = end.min(finished);
        }
        let end = end.max(started);
        let runtime = end.ms_since(started);
        #[cfg(feature = "broken-rule")]
        let runtime = runtime + 1000;
        (bill::request_gpu_seconds(&self.request, runtime), end)
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
                if end.signer() == self.request.signer()
                    && end.lease == self.id()
                    && end.reason == gpux_protocol::EndReason::RenterStopped
                {
                    self.end(now, End::RenterStopped, &mut out);
                }
            }
            HostInput::Shutdown => self.end(now, End::HostShutdown, &mut out),
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

    fn reject(&self, now: Timestamp, reason: RejectReason, detail: &str) -> Vec<u8> {
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

    fn refuse_lock(
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

    fn on_lock(&mut self, now: Timestamp, lock: Verified<EscrowLock>, out: &mut Vec<HostEffect>) {
        if self.rec.phase != HostPhase::AwaitingLock {
            return self.refuse_lock(
                now,
                RejectReason::Invalid,
                "no accepted lease waits for this escrow",
                out,
            );
        }
        // Execution starts at once: a reserved window in the future cannot be honoured yet.
        if let LeaseKind::Reserved { start, .. } = self.request.kind
            && start > now.plus_ms(LOCK_WINDOW_MS)
        {
            return self.refuse_lock(
                now,
                RejectReason::Invalid,
                "this host starts leases at once; reserved windows in the future are not run yet",
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
        self.rec.phase = HostPhase::Locking;
        self.rec.lock = Some(lock.as_bytes().to_vec());
        self.lock_pending = true;
        self.lock_first_tried = Some(now);
        out.push(HostEffect::Persist);
        self.submit(LedgerCall::Lock, lock.as_bytes().to_vec(), out);
    }

    fn submit(&mut self, call: LedgerCall, envelope: Vec<u8>, out: &mut Vec<HostEffect>) {
        self.ledger_busy = Some(call);
        out.push(HostEffect::Ledger { call, envelope });
    }

    fn retry_later(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
        let delay = backoff_ms(self.ledger_failures);
        self.ledger_failures = self.ledger_failures.saturating_add(1);
        out.push(HostEffect::Schedule {
            at: now.plus_ms(delay),
            timer: HostTimer::LedgerRetry,
        });
    }

    fn on_ledger(
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
                    LedgerVerdict::Unchanged => {
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
                    // A voucher the ledger will never take (a bug): not offered again.
                    LedgerVerdict::Refused { .. } => {
                        self.rec.redeemed_seq = self.rec.redeemed_seq.max(seq);
                        out.push(HostEffect::Persist);
                    }
                    LedgerVerdict::Unreachable => return self.retry_later(now, out),
                }
                self.redeem_or_settle(now, out);
            }
            LedgerCall::Release => match verdict {
                LedgerVerdict::Applied(_)
                | LedgerVerdict::Unchanged
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

    fn on_lock_verdict(
        &mut self,
        now: Timestamp,
        verdict: LedgerVerdict,
        out: &mut Vec<HostEffect>,
    ) {
        if self.rec.phase != HostPhase::Locking {
            return;
        }
        match verdict {
            LedgerVerdict::Applied(record)
                if record.escrow == self.request.escrow
                    && matches!(record.entry, LedgerEntry::Locked { .. }) =>
            {
                self.rec.lock_record = Some(record.as_bytes().to_vec());
                self.rec.phase = HostPhase::Starting;
                out.push(HostEffect::Persist);
                out.push(HostEffect::StartContainer);
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

    fn on_started(&mut self, now: Timestamp, started_at: Timestamp, out: &mut Vec<HostEffect>) {
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

    fn on_sample(&mut self, sample: UsageSample) {
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

    fn summary(&self) -> UsageSummary {
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
    fn send_receipt(
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

    fn on_answer(
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

    fn on_ack(
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
        if ack_matches_receipt(ack, &receipt, self.request.signer()).is_err() {
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
    fn redeem_or_settle(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
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
    fn settle(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
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
            let _ = body.set_voucher(&v.receipt, &v.ack);
        }
        if let Ok(release) = Signed::sign(&self.key, body) {
            self.submit(LedgerCall::Release, release.as_bytes().to_vec(), out);
        }
    }

    /// The work ends for `end` (the first reason wins).
    fn end(&mut self, now: Timestamp, end: End, out: &mut Vec<HostEffect>) {
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
            HostPhase::Starting => {
                if self.lock_pending {
                    self.lock_pending = false;
                    self.refuse_lock(
                        now,
                        RejectReason::Invalid,
                        "the lease ended as it started",
                        out,
                    );
                }
                // The start under way reports first; the container is stopped then.
                self.rec.phase = HostPhase::Stopping;
                out.push(HostEffect::Persist);
            }
            HostPhase::Running => {
                self.rec.phase = HostPhase::Stopping;
                // At the end of its time, or when the renter stops paying, the work is killed
                // at once (every second is unpaid); otherwise it gets a moment to exit.
                let grace_s = match end {
                    End::RenterStopped | End::HostShutdown | End::EscrowExhausted => 2,
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
    fn on_exited(
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
    fn finish(&mut self, now: Timestamp, out: &mut Vec<HostEffect>) {
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

    fn on_timer(&mut self, now: Timestamp, timer: HostTimer, out: &mut Vec<HostEffect>) {
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
                    self.end(now, End::DurationReached, out);
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
}
