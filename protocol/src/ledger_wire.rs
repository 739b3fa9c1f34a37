//! The frames of `/gpux/ledger/2`: requests to a ledger member and its answers.
//!
//! Frames are not envelopes: they are bincode 2 (the standard configuration: little-endian
//! varints) of [`LedgerRequest`] and [`LedgerResponse`], at most [`MAX_LEDGER_FRAME`] bytes,
//! every byte consumed. What moves money inside them is signed (the submitted envelope, the
//! ledger's `LedgerRecord`); the frame itself is not.
//!
//! Version 2 replaces version 1's refusal *text* with a [`RefusalCode`] (a human detail
//! beside it), so no party branches on the wording of an error, and adds
//! [`LedgerResponse::NotLeader`], the redirect a replicated ledger's followers give.
//!
//! ```
//! use gpux_protocol::ledger_wire::{self, LedgerRequest, LedgerResponse, RefusalCode};
//! use gpux_protocol::EscrowId;
//!
//! let frame = ledger_wire::encode(&LedgerRequest::Escrow(EscrowId([7; 16])));
//! let back: LedgerRequest = ledger_wire::decode(&frame)?;
//! assert_eq!(back, LedgerRequest::Escrow(EscrowId([7; 16])));
//!
//! let refused = LedgerResponse::refused(RefusalCode::UnknownEscrow, "unknown escrow 0707…");
//! assert_eq!(refused.refusal(), Some(RefusalCode::UnknownEscrow));
//! # Ok::<(), gpux_protocol::ledger_wire::FrameError>(())
//! ```

use bincode::{Decode, Encode};

use crate::key::PublicKey;
use crate::types::{EscrowId, Timestamp};

/// The protocol name.
pub const LEDGER_PROTOCOL: &str = "/gpux/ledger/2";

/// The largest ledger frame, either way (a redemption carries two envelopes; a release may
/// carry a voucher).
pub const MAX_LEDGER_FRAME: usize = 8 * 1024;

/// Longest detail text in a refusal (longer text is cut when the frame is built).
pub const MAX_DETAIL_CHARS: usize = 200;

/// A request to a ledger member.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum LedgerRequest {
    /// Apply a signed `EscrowLock`, `Redeem` or `Release` envelope.
    Submit(Vec<u8>),
    /// An account's balance.
    Balance(PublicKey),
    /// An escrow's state.
    Escrow(EscrowId),
    /// Who has paid a host (appended in this version: a member that predates it answers
    /// `Malformed`).
    History(PublicKey),
    /// The ledger's signed records that an escrow was locked and paid from (its lock's
    /// record and its newest redemption's): what a [`ChallengeResult`](crate::ChallengeResult)
    /// carries to show the challenger paid the host (appended, as `History`).
    Proof(EscrowId),
    /// How a host's leases ended, by payer, as the closing releases stated it (appended).
    Ends(PublicKey),
}

/// The most payers a [`HostHistory`] lists (those with the most paid escrows first).
pub const MAX_HISTORY_PAYERS: usize = 128;

/// A host's record at the ledger: every payer that locked an escrow to it, what became of
/// those escrows, and whether the payer has paid anyone else. Anyone may ask; nodes weigh it
/// into their reliability scores (docs/market.md, "Reputation").
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct HostHistory {
    /// The payers, at most [`MAX_HISTORY_PAYERS`], the most paid escrows first.
    pub payers: Vec<PayerRecord>,
    /// How many distinct payers there are in all.
    pub payers_total: u32,
}

/// One payer's escrows to a host, as the ledger holds them.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct PayerRecord {
    /// The payer.
    pub payer: PublicKey,
    /// Its escrows to the host that are closed and paid the host something.
    pub paid: u32,
    /// Its escrows to the host that closed with nothing paid (the lease never ran).
    pub unpaid: u32,
    /// Distinct other accounts this payer has paid (a payer with no history of its own is
    /// worth little as a witness).
    pub other_payees: u32,
}

/// How a host's leases ended, as the ledger holds it: per payer (at most
/// [`MAX_HISTORY_PAYERS`], those with the most stated outcomes first), the outcomes the
/// closing releases stated, counted.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct HostEnds {
    /// The payers.
    pub payers: Vec<PayerEnds>,
}

/// One payer's closed escrows to a host, by the outcome stated when each closed.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct PayerEnds {
    /// The payer.
    pub payer: PublicKey,
    /// Distinct other accounts this payer has paid (as in [`PayerRecord`]).
    pub other_payees: u32,
    /// Each outcome stated, who stated it, and how many escrows closed with it.
    pub ends: Vec<EndCount>,
}

/// Escrows that closed with one stated outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct EndCount {
    /// The outcome.
    pub outcome: crate::LeaseOutcome,
    /// Whether the host (the payee) stated it; else the payer did.
    pub by_host: bool,
    /// How many.
    pub count: u32,
}

/// An escrow as the ledger reports it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct EscrowView {
    /// Amount locked, micro-credits.
    pub amount: u64,
    /// Paid to the payee so far.
    pub redeemed: u64,
    /// Highest receipt seq redeemed.
    pub last_seq: u64,
    /// Whether the remainder went back to the payer.
    pub released: bool,
    /// Payer account.
    pub payer: PublicKey,
    /// Payee account.
    pub payee: PublicKey,
}

/// Why a ledger refused an operation. Nothing changed; the code says whether trying again
/// can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Encode, Decode, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RefusalCode {
    /// The frame did not decode, or was too large.
    Malformed,
    /// The envelope is not a ledger operation, or it does not verify.
    Invalid,
    /// The payer's balance is too small.
    InsufficientFunds,
    /// No escrow with that id.
    UnknownEscrow,
    /// An escrow with that id already exists (for another lock).
    EscrowExists,
    /// The escrow is closed (released).
    EscrowClosed,
    /// Signed by someone who may not perform the operation.
    WrongSigner,
    /// A nested receipt or acknowledgement does not verify.
    BadEnvelope,
    /// The receipt or acknowledgement is not for this escrow, lease or price.
    Mismatch,
    /// The payer may not release yet; `retry_at` says when it may.
    TooEarly,
    /// The escrow lock was signed too long ago.
    StaleLock,
    /// An amount would overflow.
    Overflow,
    /// The member could not write its log; nothing was applied.
    Storage,
    /// This node serves no ledger.
    NotServed,
}

impl RefusalCode {
    /// Whether the same operation, sent again later, may succeed (the verdict depends on the
    /// ledger's state or time, not on the operation itself).
    pub const fn is_transient(self) -> bool {
        matches!(self, Self::TooEarly | Self::Storage | Self::UnknownEscrow)
    }
}

/// A ledger member's answer.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum LedgerResponse {
    /// Applied: the ledger's signed `LedgerRecord`.
    Record(Vec<u8>),
    /// Already applied (a retry): nothing changed.
    Unchanged(String),
    /// A balance, micro-credits.
    Balance(u64),
    /// An escrow (None: unknown).
    Escrow(Option<EscrowView>),
    /// Refused; nothing changed.
    Refused {
        /// The rule that refused it.
        code: RefusalCode,
        /// For people.
        detail: String,
        /// With [`RefusalCode::TooEarly`]: when the operation may be sent again.
        retry_at: Option<Timestamp>,
    },
    /// This member is not the leader of a replicated ledger: ask the leader.
    NotLeader {
        /// The leader's peer id (its 38-byte binary form), when known.
        leader: Option<Vec<u8>>,
        /// The leader's addresses (multiaddr text), when known.
        addrs: Vec<String>,
    },
    /// A host's history (appended in this version; empty for a host nobody paid).
    History(HostHistory),
    /// An escrow's signed records (appended): the lock's, and the newest redemption's when
    /// the payee has redeemed anything. An unknown escrow is refused (`UnknownEscrow`).
    Proof {
        /// The signed `LedgerRecord` of the lock (`Locked`).
        locked: Vec<u8>,
        /// The signed `LedgerRecord` of the newest redemption (`Redeemed`), if any.
        paid: Option<Vec<u8>>,
    },
    /// How a host's leases ended (appended).
    Ends(HostEnds),
    /// A replicated ledger's answer to a submission (appended): the same `LedgerRecord`,
    /// signed by each member that applied it, at least a majority of the members. A party
    /// configured with the members acts on no less.
    Cosigned(Vec<Vec<u8>>),
}

impl LedgerResponse {
    /// A refusal with a detail (cut to [`MAX_DETAIL_CHARS`]).
    pub fn refused(code: RefusalCode, detail: impl AsRef<str>) -> Self {
        Self::Refused {
            code,
            detail: detail.as_ref().chars().take(MAX_DETAIL_CHARS).collect(),
            retry_at: None,
        }
    }

    /// The refusal code, when this is a refusal.
    pub fn refusal(&self) -> Option<RefusalCode> {
        match self {
            Self::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub use crate::codec::FrameError;

/// Encodes a ledger frame.
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    crate::codec::encode_frame(value)
}

/// Decodes a ledger frame: at most [`MAX_LEDGER_FRAME`] bytes, every byte consumed, and in
/// its one canonical encoding (found by the `ledger_wire` fuzz target: bincode took
/// `fc 00 00 00 00` as the varint 0).
pub fn decode<T: Decode<()> + Encode>(bytes: &[u8]) -> Result<T, FrameError> {
    crate::codec::decode_frame::<T, MAX_LEDGER_FRAME>(bytes)
}
