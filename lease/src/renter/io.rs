//! What goes into and out of the renter's machine, and what it stores.

use gpux_protocol::{
    LeaseEnd, LeaseReject, LedgerRecord, PreemptionNotice, PublicKey, Timestamp, UsageReceipt,
    Verified,
};

use crate::{End, LedgerCall, LedgerVerdict, Timing, Voucher};

/// Where the renter's side of a lease is.
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
pub enum RenterPhase {
    /// The escrow lock went to the host; the start is not confirmed yet.
    Starting,
    /// The escrow is locked and the GPUs held; the work starts on the renter's commit
    /// ([`RenterLease::commit`](crate::RenterLease::commit)).
    Held,
    /// The host confirmed the start (the ledger's record) or sent a valid receipt.
    Running,
    /// Over; the escrow is not closed yet.
    Ended,
    /// The escrow is closed.
    Settled,
}

/// The renter's whole record of one lease (persisted on [`RenterEffect::Persist`]).
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct RenterRecord {
    /// The signed `LeaseRequest`, as sent.
    pub request: Vec<u8>,
    /// The host's signed `LeaseAccept`.
    pub accept: Vec<u8>,
    /// The signed `EscrowLock`.
    pub lock: Vec<u8>,
    /// The ledger whose records count.
    pub ledger: PublicKey,
    /// The receipt timing the host announced (or the default).
    pub timing: Timing,
    /// Where the lease is.
    pub phase: RenterPhase,
    /// When the renter asked for the start: the work cannot have run before.
    pub lock_sent_at: Timestamp,
    /// When the host booked the GPUs from (later than the acceptance when the lease
    /// preempts spot leases): the work cannot have run before either.
    pub starts_at: Timestamp,
    /// For a lease whose work waits for the renter's commit: by when the host must have it
    /// (the booking's start, by the acceptance, plus the agreed wait).
    pub commit_by: Option<Timestamp>,
    /// When the renter committed, for a lease whose work waits for its commit.
    pub committed_at: Option<Timestamp>,
    /// A spot lease's preemption: when its notice (checked) ends the lease.
    pub preempted_until: Option<Timestamp>,
    /// A preemption notice came that did not hold (no valid preempting request, a shorter
    /// notice than agreed): the host is at fault if the lease ends early.
    pub notice_refused: bool,
    /// The ledger's record of the lock, once the host forwarded it.
    pub confirmed: bool,
    /// The renter reported the rent as failed: it pays nothing, disputes every receipt.
    pub gave_up: bool,
    /// The last receipt seq seen.
    pub last_seq: u64,
    /// The latest receipt acknowledged (the voucher).
    pub acked: Option<Voucher>,
    /// When the host was last heard from.
    pub last_contact: Timestamp,
    /// When the renter asked the host to stop.
    pub stop_requested_at: Option<Timestamp>,
    /// Why it ended (the host's reason when the host said; else the renter's own).
    pub end: Option<End>,
    /// When it ended.
    pub ended_at: Option<Timestamp>,
    /// What the host said ended it, when it did.
    pub host_end: Option<End>,
    /// The workload's exit code, as the host reported it.
    pub exit_code: Option<i32>,
    /// Log chunks received.
    pub log_chunks: u64,
    /// Log bytes received.
    pub log_bytes: u64,
}

/// What came back for the escrow lock the renter sent to the host.
#[derive(Debug, Clone)]
pub enum LockOutcome {
    /// A ledger record (verified as an envelope by the shell).
    Record(Box<Verified<LedgerRecord>>),
    /// The host refused to start it.
    Rejected(Box<Verified<LeaseReject>>),
    /// No answer, or one that is neither.
    Unanswered,
}

/// What can happen to a lease on the renter.
#[derive(Debug, Clone)]
pub enum RenterInput {
    /// The answer to the escrow lock.
    Lock(LockOutcome),
    /// A receipt from the host (verified as an envelope); answered with
    /// [`RenterEffect::Respond`].
    Receipt(Verified<UsageReceipt>),
    /// A `LeaseEnd` (verified as an envelope).
    HostEnd(Verified<LeaseEnd>),
    /// A `PreemptionNotice` (verified as an envelope).
    Notice(Verified<PreemptionNotice>),
    /// The host was heard from otherwise (a log chunk).
    HostHeard {
        /// Bytes of output received.
        log_bytes: u64,
    },
    /// The ledger's verdict.
    Ledger {
        /// Which operation.
        call: LedgerCall,
        /// What became of it.
        verdict: LedgerVerdict,
    },
    /// A timer fired.
    Timer(RenterTimer),
    /// The node could not store a record of this lease outside the machine's own (a
    /// receipt and its acknowledgement, which is then not sent): the lease ends
    /// (`End::StoreFailed`, said to the host), settled on what was acknowledged before.
    StoreFailed,
}

/// The renter's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RenterTimer {
    /// Check whether the host fell silent.
    Watchdog,
    /// Try to close the escrow.
    Settle,
}

/// How a rent came out, for whoever asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RentReport {
    /// The lease runs.
    Running,
    /// The escrow is locked and the GPUs held: the work starts on the renter's commit.
    Held,
    /// It does not run, and nothing is paid.
    Failed {
        /// Why.
        end: End,
        /// For people.
        detail: String,
    },
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenterEffect {
    /// Store [`RenterLease::record`](crate::RenterLease::record) (flushed) before the effects after it.
    Persist,
    /// Send the escrow lock to the host; report [`RenterInput::Lock`].
    SendLock {
        /// The signed `EscrowLock`.
        envelope: Vec<u8>,
    },
    /// Send the signed `LeaseCommit` to the host (no answer expected: the host's receipts,
    /// or its `LeaseEnd`, say what became of it).
    SendCommit {
        /// The envelope.
        envelope: Vec<u8>,
    },
    /// Answer the request being handled (a receipt) with this envelope.
    Respond {
        /// The answer.
        envelope: Vec<u8>,
    },
    /// Send a signed `LeaseEnd` to the host (no answer expected).
    SendEnd {
        /// The envelope.
        envelope: Vec<u8>,
    },
    /// Submit to the ledger; report [`RenterInput::Ledger`].
    Ledger {
        /// Which.
        call: LedgerCall,
        /// The signed envelope.
        envelope: Vec<u8>,
    },
    /// Report [`RenterInput::Timer`] at `at`.
    Schedule {
        /// When.
        at: Timestamp,
        /// Which.
        timer: RenterTimer,
    },
    /// Tell whoever asked for the rent how it came out.
    Report(RentReport),
}

/// Why a commit was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The lease does not wait for a commit, or is not held (yet, or any more).
    #[error("the lease is not held waiting for a commit")]
    NotHeld,
    /// The time to commit has passed: the host ends the lease unpaid.
    #[error("the time to commit has passed")]
    TooLate,
}

/// Why a stop was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StopError {
    /// The lease is already over.
    #[error("the lease has already ended")]
    Ended,
}
