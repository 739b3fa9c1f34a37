//! What goes into and out of the host's machine, and what it stores.

use gpux_protocol::{
    ContentId, EscrowLock, LeaseCommit, LeaseEnd, LeaseRequest, MicroCredits, ReceiptAck,
    Timestamp, Verified,
};

use crate::{End, LedgerCall, LedgerVerdict, Timing, Voucher};

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
pub(crate) struct SentReceipt {
    pub(crate) seq: u64,
    /// When it was signed: an acknowledgement shows the renter was there then.
    pub(crate) sent_at: Timestamp,
    pub(crate) envelope: Vec<u8>,
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

/// A spot lease's preemption: the notice given and when it ends the lease.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Preemption {
    /// The signed `PreemptionNotice`, as sent.
    pub notice: Vec<u8>,
    /// When the lease ends (the notice's `ends_at`).
    pub ends_at: Timestamp,
}

/// The host's whole record of one lease: what the shell persists (flushed) whenever the
/// machine says [`HostEffect::Persist`], and all a restarted host needs.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct HostRecord {
    /// The signed `LeaseRequest`, as received.
    pub request: Vec<u8>,
    /// The signed `LeaseAccept`, as sent.
    pub accept: Vec<u8>,
    /// When the host accepted.
    pub accepted_at: Timestamp,
    /// When the GPUs are booked from: the acceptance, or later when the lease preempts spot
    /// leases (they run out their notice first). The container starts no sooner.
    pub starts_at: Timestamp,
    /// A spot lease's preemption, once notice was given.
    pub preemption: Option<Preemption>,
    /// The spot leases this lease preempts: they get their notice once its escrow is locked.
    pub preempts: Vec<ContentId>,
    /// When the renter's `LeaseCommit` came, for a lease that waits for one.
    pub committed_at: Option<Timestamp>,
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
    pub(crate) sent: Vec<SentReceipt>,
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
    /// The booking starts: the container may start.
    StartAt,
    /// A preempted lease's workload is asked to stop (SIGTERM), so that it is gone by the
    /// notice's end.
    Preempt,
    /// The renter's commit is overdue: the lease ends unpaid.
    CommitWait,
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
    /// The renter's `LeaseCommit` (verified): the held lease's work may start.
    Commit(Verified<LeaseCommit>),
    /// The host node is shutting down.
    Shutdown,
    /// One of the lease's GPUs failed at `at` (a fatal Xid, uncorrectable memory errors, the
    /// GPU gone from the driver): the lease ends (`End::GpuFailed`), billed up to the fault.
    GpuFailed {
        /// When the fault happened (or was first seen), never after the input's `now`.
        at: Timestamp,
    },
    /// The node could not store a record of this lease outside the machine's own (a
    /// receipt, an acknowledgement): the lease ends (`End::StoreFailed`), settled on what
    /// was acknowledged.
    StoreFailed,
    /// This (spot) lease's GPUs are needed by this accepted request, which may preempt it.
    Preempt(Box<Verified<LeaseRequest>>),
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
    /// Store [`HostLease::record`](crate::HostLease::record) (flushed) before carrying out the effects after it.
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
    /// A workspace whose work never started is erased at once, with no retention.
    EraseContainer,
    /// Make the lease's workspace now: its work waits for the renter's commit, and the
    /// renter may copy files in first.
    PrepareWorkspace,
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
    /// This lease's escrow is locked: give the spot leases it preempts their notice (hand
    /// each [`HostInput::Preempt`] with this lease's request).
    PreemptSpot {
        /// The spot leases.
        leases: Vec<ContentId>,
    },
    /// The lease is preempted: write the notice where the workload reads it (`/run/gpux`)
    /// and send it to the renter (no answer expected).
    Notify {
        /// The signed `PreemptionNotice`.
        envelope: Vec<u8>,
        /// When the lease ends.
        ends_at: Timestamp,
    },
}
