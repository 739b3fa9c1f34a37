//! The lease lifecycle as pure state machines.
//!
//! Every rule of a lease lives here, for both sides, and the ledger service's own decisions
//! too: [`HostBook`] (the host's offers, the bookings of its GPUs, and its answer to a
//! request), [`HostLease`] (the host's side of one lease: the lock, the container's life, receipts,
//! the ack deadline, the final bill, settlement, recovery), [`RenterLease`] (the renter's
//! side: receipt checks against its own clock, acknowledgements, its host-silent watchdog,
//! stopping, settlement after the ledger's grace) and [`LedgerMachine`] (the ledger node:
//! the lock window, stale locks, retried operations and their records). The workflows of
//! many steps around a lease are machines of the same kind: [`GroupPlacement`] (a group
//! order's two phases), [`RentSearch`] (a rent's search: which host is asked next, what is
//! claimed and released; it never holds two hosts' GPUs), [`ResumeHop`] (one hop of a
//! resumed spot lease's chain; a chain never runs two leases at once) and [`StageCheck`]
//! (a staged image's plan and checks on the host; nothing unverified is loaded).
//!
//! Each machine is a plain struct with `handle(now, input) -> effects`, in the style of
//! iroh-gossip's `proto`: it never reads a clock, sleeps, draws random numbers or does I/O.
//! Time comes in as `now`; timers go out as [`HostEffect::Schedule`] /
//! [`RenterEffect::Schedule`] and come back as inputs; everything slow (Docker, the network,
//! the ledger, the disk) is done by the node's shell and reported back as an input. The
//! crate's `clippy.toml` refuses clocks and sleeps, so that purity is checked. Because of it
//! the whole life of a lease runs in a deterministic simulator (`lease/tests/sim.rs`) over
//! thousands of random schedules: lossy buses, slow samples, crashes, ledger outages.
//!
//! ```
//! use gpux_lease::{Timing, bill};
//!
//! // Billing: whole seconds, rounded down, at least the minute, never past the agreed time.
//! assert_eq!(bill::gpu_seconds(2, 600, 59_999), 120);
//! assert_eq!(bill::gpu_seconds(2, 600, 61_999), 122);
//! assert_eq!(bill::gpu_seconds(2, 600, 10_000_000), 1200);
//!
//! // The one loss bound: a host is never owed more than one receipt interval plus the grace.
//! let timing = Timing { receipt_interval_ms: 60_000, ack_grace_ms: 30_000, ..Timing::default() };
//! assert_eq!(timing.loss_bound_ms(), 90_000);
//! ```

pub mod bill;
mod book;
mod group;
mod host;
mod ledger;
mod rent;
mod renter;
mod resume;
mod stage;

pub use book::{Answer, HostBook, NAMED_HOLD_MS, OfferChange, Withheld};
pub use group::{GroupEffect, GroupInput, GroupOutcome, GroupPlacement, MemberState, Placement};
pub use host::{
    ContainerState, EXIT_NOTICE_MS, HostEffect, HostInput, HostLease, HostPhase, HostRecord,
    HostTimer, Meter, PREEMPT_TERM_MS, Preemption, RenterAnswer, StartFailure, UsageSample,
};
pub use ledger::{
    LedgerMachine, LedgerOutput, LogAppend, LogEntry, LogOp, MAX_LOCK_AGE_MS, ReplayError,
};
pub use rent::{
    ChallengeResult, RentAnswer, RentCandidate, RentInput, RentNext, RentOutcome, RentPlan,
    RentSearch, RentSide, RentStep,
};
pub use renter::{
    CommitError, LockOutcome, RentReport, RenterEffect, RenterInput, RenterLease, RenterPhase,
    RenterRecord, RenterTimer, StopError,
};
pub use resume::{
    NextLease, ResumeHop, ResumeInput, ResumeNext, ResumeOutcome, ResumePlan, ResumeSide,
    ResumeStep,
};
pub use stage::{
    LayerOnDisk, LayerStored, StageCheck, StageInput, StageLayerSpec, StageNext, StageSide,
    StageStep,
};

use gpux_protocol::ledger_wire::{LedgerResponse, RefusalCode};
use gpux_protocol::{
    EndReason, Ext, LeaseAccept, LedgerRecord, MicroCredits, PublicKey, Signed, Timestamp, Verified,
};

/// The largest `ReceiptAck` a host takes: it must fit, as a voucher, in a `Release` (512
/// bytes in all). An honest renter's are about 180 bytes.
pub const MAX_VOUCHER_BYTES: usize = 320;
/// The longest receipt interval or acknowledgement grace a renter accepts from a host, ms: a
/// host announcing more could keep the renter from ever counting it silent.
pub const MAX_TIMING_MS: u64 = 3_600_000;

/// How far ahead a host books a reserved window, ms (30 days).
pub const MAX_RESERVE_AHEAD_MS: u64 = 30 * 24 * 3_600_000;
/// The notice period a host gives a spot lease by default, ms (as GCP's 30 s).
pub const DEFAULT_SPOT_NOTICE_MS: u64 = 30_000;
/// How long after the notice ends a preempting lease's GPUs are booked from: the
/// preempted container is killed at the notice's end, and this is the hand-over.
pub const PREEMPT_HANDOVER_MS: u64 = 1_000;

/// Receipt timing: a term of the lease, announced by the host in its `LeaseAccept`.
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
pub struct Timing {
    /// How often the host signs a cumulative receipt, ms.
    pub receipt_interval_ms: u64,
    /// How long past an interval the host waits for an acknowledgement before it stops the
    /// work, ms; also how long past an interval a renter waits before it counts the host gone.
    pub ack_grace_ms: u64,
    /// A spot lease's notice period, ms: a preemption ends it no sooner than this after
    /// the notice.
    pub spot_notice_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            receipt_interval_ms: 60_000,
            ack_grace_ms: 30_000,
            spot_notice_ms: DEFAULT_SPOT_NOTICE_MS,
        }
    }
}

impl Timing {
    /// The most a host can be owed for work it ran while its node was up: one receipt
    /// interval plus the acknowledgement grace (counted in whole billed seconds; add the
    /// moment Docker takes to kill a container).
    pub const fn loss_bound_ms(&self) -> u64 {
        self.receipt_interval_ms.saturating_add(self.ack_grace_ms)
    }

    /// The host's signed acceptance of lease `request` at `created_at`, announcing this
    /// timing, its GPUs booked from `starts_at` (none: from the acceptance).
    pub fn accept(
        &self,
        request: gpux_protocol::ContentId,
        created_at: Timestamp,
        starts_at: Option<Timestamp>,
    ) -> LeaseAccept {
        LeaseAccept {
            request,
            created_at,
            receipt_interval_ms: self.receipt_interval_ms,
            ack_grace_ms: self.ack_grace_ms,
            spot_notice_ms: self.spot_notice_ms,
            starts_at,
            ext: Ext::new(),
        }
    }

    /// The timing a `LeaseAccept` announces, each value held to between one second and
    /// [`MAX_TIMING_MS`].
    pub fn from_accept(accept: &LeaseAccept) -> Timing {
        Timing {
            receipt_interval_ms: accept.receipt_interval_ms.clamp(1000, MAX_TIMING_MS),
            ack_grace_ms: accept.ack_grace_ms.clamp(1000, MAX_TIMING_MS),
            spot_notice_ms: accept.spot_notice_ms.clamp(1000, MAX_TIMING_MS),
        }
    }
}

/// When a `LeaseAccept` books the GPUs from, when later than the acceptance.
pub fn accept_starts_at(accept: &LeaseAccept) -> Option<Timestamp> {
    accept.starts_at.filter(|t| *t > accept.created_at)
}

/// Why a lease ended: the wire's [`EndReason`]s and the outcomes only one side can see.
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
#[non_exhaustive]
pub enum End {
    /// The renter stopped it.
    RenterStopped,
    /// Its duration was reached.
    DurationReached,
    /// The renter did not acknowledge a receipt in time.
    ReceiptNotAcknowledged,
    /// The renter disputed a receipt.
    ReceiptDisputed,
    /// The escrow pays for no more.
    EscrowExhausted,
    /// A spot lease was preempted.
    Preempted,
    /// The host shut down.
    HostShutdown,
    /// The workload exited by itself.
    ContainerExited,
    /// The container could not start, or vanished.
    ContainerFailed,
    /// The image was not on the host.
    ImageMissing,
    /// The escrow was never locked (or not in time): nothing ran.
    EscrowNotLocked,
    /// Renter: the host refused to start it.
    NotStarted,
    /// Renter: the host did not confirm the start; the renter gave up (and pays nothing).
    StartUnconfirmed,
    /// Renter: the host fell silent.
    HostSilent,
    /// A lease waiting for the renter's commit was not committed in time: nothing ran.
    NotCommitted,
    /// The renter's performance challenge failed: the lease ended before its work.
    ChallengeFailed,
    /// A side could not store a record of the lease (a receipt, an acknowledgement); it
    /// ended the lease. What was acknowledged before is settled.
    StoreFailed,
    /// A leased GPU failed (an Xid error such as 79, "fallen off the bus", uncorrectable
    /// memory errors, or the GPU vanished from the driver): billed up to the fault.
    GpuFailed,
}

impl End {
    /// The reason sent in a `LeaseEnd`.
    pub const fn wire(self) -> EndReason {
        match self {
            End::RenterStopped | End::StartUnconfirmed => EndReason::RenterStopped,
            End::DurationReached => EndReason::DurationReached,
            End::ReceiptNotAcknowledged | End::HostSilent => EndReason::ReceiptNotAcknowledged,
            End::ReceiptDisputed => EndReason::ReceiptDisputed,
            End::EscrowExhausted | End::EscrowNotLocked => EndReason::EscrowExhausted,
            End::Preempted => EndReason::Preempted,
            End::HostShutdown => EndReason::HostShutdown,
            End::NotCommitted => EndReason::NotCommitted,
            End::ChallengeFailed => EndReason::ChallengeFailed,
            End::StoreFailed => EndReason::StoreFailed,
            End::ContainerExited => EndReason::ContainerExited,
            End::ContainerFailed | End::ImageMissing | End::NotStarted => {
                EndReason::ContainerFailed
            }
            End::GpuFailed => EndReason::GpuFailed,
        }
    }

    /// Whether the renter owes the billing minimum for a lease that ended so: it does when
    /// its own side ended the lease (a stop, its workload's exit, the end of the time it
    /// asked for, a receipt it did not answer or disputed, an escrow that pays no more), not
    /// when the host did (a shutdown, a container or GPU that failed, a record it could not
    /// keep, a challenge its GPUs failed).
    pub const fn owes_minimum(self) -> bool {
        matches!(
            self,
            End::RenterStopped
                | End::DurationReached
                | End::ContainerExited
                | End::ReceiptNotAcknowledged
                | End::ReceiptDisputed
                | End::EscrowExhausted
                | End::Preempted
        )
    }

    /// The end a `LeaseEnd` reports.
    pub fn from_wire(reason: EndReason) -> End {
        match reason {
            EndReason::RenterStopped => End::RenterStopped,
            EndReason::DurationReached => End::DurationReached,
            EndReason::ReceiptNotAcknowledged => End::ReceiptNotAcknowledged,
            EndReason::ReceiptDisputed => End::ReceiptDisputed,
            EndReason::EscrowExhausted => End::EscrowExhausted,
            EndReason::Preempted => End::Preempted,
            EndReason::HostShutdown => End::HostShutdown,
            EndReason::ContainerExited => End::ContainerExited,
            EndReason::ContainerFailed => End::ContainerFailed,
            EndReason::NotCommitted => End::NotCommitted,
            EndReason::ChallengeFailed => End::ChallengeFailed,
            EndReason::StoreFailed => End::StoreFailed,
            EndReason::GpuFailed => End::GpuFailed,
            // A reason from a newer peer: the nearest this build knows.
            _ => End::ContainerFailed,
        }
    }
}

/// A ledger operation a machine asked for, named so the verdict finds its way back.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
)]
pub enum LedgerCall {
    /// The renter's `EscrowLock` (submitted by the host).
    Lock,
    /// A `Redeem` of the acknowledged receipt with this seq.
    Redeem {
        /// The receipt's seq.
        seq: u64,
    },
    /// A `Release` (with the latest voucher, when there is one).
    Release,
}

/// What became of a ledger operation, as the shell reports it.
#[derive(Debug, Clone)]
pub enum LedgerVerdict {
    /// Applied: the ledger's record, verified against the ledger's key by the shell.
    Applied(Box<Verified<LedgerRecord>>),
    /// Already applied before (a retry).
    Unchanged,
    /// Refused by the ledger's rules; nothing changed.
    Refused {
        /// Why.
        code: RefusalCode,
        /// When it may be sent again ([`RefusalCode::TooEarly`]).
        retry_at: Option<Timestamp>,
    },
    /// No verdict: the ledger did not answer (or answered nonsense). Try again later.
    Unreachable,
}

impl LedgerVerdict {
    /// The verdict a ledger's response gives on a submission. `ledger` is the ledger node's
    /// key, or every member's of a replicated ledger. An applied record counts only when it
    /// verifies and is signed by the ledger node, or, for a replicated ledger, when the
    /// same record comes signed by a majority of distinct members (`Cosigned`): no single
    /// member can forge one. Anything else that is not a verdict (a redirect, nonsense, too
    /// few signatures) is no verdict.
    pub fn from_response(response: LedgerResponse, ledger: &[PublicKey]) -> LedgerVerdict {
        let verify = |bytes: Vec<u8>| {
            Signed::<LedgerRecord>::from_bytes(bytes)
                .and_then(Signed::verify)
                .ok()
                .filter(|r| ledger.contains(&r.signer()))
        };
        let quorum = ledger.len() / 2 + 1;
        match response {
            LedgerResponse::Record(bytes) if quorum == 1 => match verify(bytes) {
                Some(record) => LedgerVerdict::Applied(Box::new(record)),
                None => LedgerVerdict::Unreachable,
            },
            LedgerResponse::Cosigned(copies) => {
                let mut records = copies.into_iter().filter_map(verify);
                let Some(first) = records.next() else {
                    return LedgerVerdict::Unreachable;
                };
                let mut signers = std::collections::BTreeSet::from([first.signer()]);
                for record in records {
                    // The same record, another member's signature.
                    if *record == *first {
                        signers.insert(record.signer());
                    }
                }
                if signers.len() >= quorum {
                    LedgerVerdict::Applied(Box::new(first))
                } else {
                    LedgerVerdict::Unreachable
                }
            }
            LedgerResponse::Unchanged(_) => LedgerVerdict::Unchanged,
            LedgerResponse::Refused { code, retry_at, .. } => {
                LedgerVerdict::Refused { code, retry_at }
            }
            _ => LedgerVerdict::Unreachable,
        }
    }
}

/// The latest acknowledged receipt: both envelopes exactly as signed, redeemable at the
/// ledger by either party.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode, serde::Serialize)]
pub struct Voucher {
    /// The receipt's seq.
    pub seq: u64,
    /// Its cumulative amount due.
    pub amount: MicroCredits,
    /// Its cumulative GPU-seconds.
    pub gpu_seconds: u64,
    /// The `UsageReceipt` envelope.
    #[serde(skip)]
    pub receipt: Vec<u8>,
    /// The `ReceiptAck` envelope.
    #[serde(skip)]
    pub ack: Vec<u8>,
}

/// A stored lease record that cannot be restored (its envelopes do not verify).
#[derive(Debug, thiserror::Error)]
#[error("the stored lease does not verify: {0}")]
pub struct RestoreError(pub(crate) String);

/// Delay before the `attempt`-th retry of a ledger operation (from 0): 1 s, 2 s, 4 s, ...
/// up to 30 s.
pub(crate) fn backoff_ms(attempt: u32) -> u64 {
    1000u64.saturating_mul(1 << attempt.min(5)).min(30_000)
}
