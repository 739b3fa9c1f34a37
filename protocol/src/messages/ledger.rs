//! Settlement on `/gpux/ledger/1`: `EscrowLock`, `Redeem`, `Release`, and the ledger's own
//! `LedgerRecord`s.

use crate::codec::{BoundedBytes, Ext};
use crate::envelope::Message;
use crate::key::PublicKey;
use crate::messages::{InvalidMessage, MessageKind, ensure_nonzero};
use crate::money::MicroCredits;
use crate::types::{ContentId, EscrowId, Timestamp};

/// The renter locks money for a lease. `payer` and `payee` are account keys (today the
/// renter's and host's node keys), named explicitly so accounts can later differ from nodes.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct EscrowLock {
    /// The escrow id named in the lease request.
    pub escrow: EscrowId,
    /// The lease id.
    pub lease: ContentId,
    /// The account paying (must be the signer's).
    pub payer: PublicKey,
    /// The account that may redeem receipts.
    pub payee: PublicKey,
    /// Amount locked.
    pub amount: MicroCredits,
    /// The lease's price per GPU-hour; receipts must carry the same.
    pub price_per_gpu_hour: MicroCredits,
    /// When.
    pub created_at: Timestamp,
    /// Extension fields.
    pub ext: Ext,
}

/// `EscrowLock` ext key: the payer may not release the escrow before this time (plus the
/// ledger's grace), unix ms (u64 little endian): a lease whose work starts later (it
/// preempts spot leases first) is paid for from an escrow that is still there then.
pub const EXT_LOCK_HOLD_UNTIL: u16 = 1;

impl EscrowLock {
    /// Until when the payer may not release the escrow ([`EXT_LOCK_HOLD_UNTIL`]); `None`
    /// without a hold.
    pub fn hold_until(&self) -> Result<Option<Timestamp>, InvalidMessage> {
        match self.ext.get(EXT_LOCK_HOLD_UNTIL) {
            None => Ok(None),
            Some(v) => <[u8; 8]>::try_from(v)
                .map(|b| Some(Timestamp(u64::from_le_bytes(b))))
                .map_err(|_| InvalidMessage::Malformed {
                    field: "ext",
                    reason: "a hold is 8 bytes, little-endian",
                }),
        }
    }
}

impl Message for EscrowLock {
    const KIND: MessageKind = MessageKind::EscrowLock;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonzero("amount", self.amount.0)?;
        ensure_nonzero("price_per_gpu_hour", self.price_per_gpu_hour.0)?;
        if self.payer == self.payee {
            return Err(InvalidMessage::Inconsistent {
                field: "payee",
                reason: "the payer cannot pay itself",
            });
        }
        self.hold_until()?;
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// The host redeems its latest acknowledged receipt: both envelopes travel inside, exactly
/// as signed, and the ledger verifies them.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Redeem {
    /// The escrow.
    pub escrow: EscrowId,
    /// The lease id.
    pub lease: ContentId,
    /// The `UsageReceipt` envelope, as signed by the host.
    pub receipt: BoundedBytes<1024>,
    /// The `ReceiptAck` envelope, as signed by the renter.
    pub ack: BoundedBytes<512>,
    /// When.
    pub created_at: Timestamp,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for Redeem {
    const KIND: MessageKind = MessageKind::Redeem;

    fn check(&self) -> Result<(), InvalidMessage> {
        if self.receipt.is_empty() {
            return Err(InvalidMessage::Empty { field: "receipt" });
        }
        if self.ack.is_empty() {
            return Err(InvalidMessage::Empty { field: "ack" });
        }
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// After the lease ends, either party asks the ledger to return what was not redeemed to the
/// payer and close the escrow.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Release {
    /// The escrow.
    pub escrow: EscrowId,
    /// The lease id.
    pub lease: ContentId,
    /// When.
    pub created_at: Timestamp,
    /// Extension fields.
    pub ext: Ext,
}

/// `Release` ext key: a voucher, the payer's latest `ReceiptAck` envelope for the lease.
pub const EXT_RELEASE_ACK: u16 = 1;
/// `Release` ext key: how the lease ended, as the signer's node recorded it (a
/// [`LeaseOutcome`], bincode). The ledger keeps the closing release's outcome with the
/// escrow and reports it in a host's `Ends` (reputation from records anyone can ask for).
pub const EXT_RELEASE_END: u16 = 2;

/// How a lease ended, as one side states it when it closes the escrow.
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
pub struct LeaseOutcome {
    /// Why it ended.
    pub reason: crate::EndReason,
    /// Whether it was a spot lease (its interruptions count towards the host's rate).
    pub spot: bool,
}
/// `LedgerRecord` ext key, on a `Released` record: what the release's voucher paid the payee
/// before the refund (u64 little endian, micro-credits).
pub const EXT_RECORD_VOUCHER_PAID: u16 = 1;

impl Release {
    /// The voucher a release carries: the payer's latest `ReceiptAck` (as signed), its consent
    /// to pay the cumulative amount it names. The ledger pays the payee up to it before it
    /// refunds the rest, as a payment channel's close honours the latest voucher.
    pub fn voucher(&self) -> Option<&[u8]> {
        self.ext.get(EXT_RELEASE_ACK)
    }

    /// Attaches a voucher (see [`Release::voucher`]).
    pub fn set_voucher(&mut self, ack: &[u8]) -> Result<(), crate::LimitError> {
        self.ext.insert(EXT_RELEASE_ACK, ack.to_vec())
    }

    /// How the lease ended, as the signer states it (`None`: not stated). A value that is
    /// not one canonical [`LeaseOutcome`] is malformed.
    pub fn outcome(&self) -> Result<Option<LeaseOutcome>, InvalidMessage> {
        self.ext
            .get(EXT_RELEASE_END)
            .map(|bytes| {
                crate::codec::decode_exact::<LeaseOutcome>(bytes).map_err(|_| {
                    InvalidMessage::Malformed {
                        field: "ext",
                        reason: "a lease's outcome: an end reason and a spot flag",
                    }
                })
            })
            .transpose()
    }

    /// States how the lease ended (see [`Release::outcome`]).
    pub fn set_outcome(&mut self, outcome: LeaseOutcome) -> Result<(), crate::LimitError> {
        let bytes = crate::codec::encode(&outcome).unwrap_or_default();
        self.ext.insert(EXT_RELEASE_END, bytes)
    }
}

impl Message for Release {
    const KIND: MessageKind = MessageKind::Release;

    fn check(&self) -> Result<(), InvalidMessage> {
        self.outcome().map(drop)
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// Credits granted by a ledger's faucet: the only way a replicated ledger mints. The
/// cluster is configured with the faucet's public key; every member checks that the grant is
/// signed by it before applying it, and applies each grant (by its envelope id) once.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct FaucetGrant {
    /// The account credited.
    pub account: PublicKey,
    /// Amount.
    pub amount: MicroCredits,
    /// A number the faucet picks, so two grants of the same amount to the same account in
    /// the same millisecond are two grants.
    pub nonce: u64,
    /// When.
    pub created_at: Timestamp,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for FaucetGrant {
    const KIND: MessageKind = MessageKind::FaucetGrant;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonzero("amount", self.amount.0)
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// What a ledger operation did.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum LedgerEntry {
    /// New credits for an account (testnet faucet).
    Minted {
        /// The account.
        account: PublicKey,
        /// Amount.
        amount: MicroCredits,
    },
    /// Money moved from the payer's balance into an escrow.
    Locked {
        /// Payer account.
        payer: PublicKey,
        /// Payee account.
        payee: PublicKey,
        /// Amount locked.
        amount: MicroCredits,
    },
    /// Money moved from an escrow to the payee.
    Redeemed {
        /// Payee account.
        payee: PublicKey,
        /// Paid by this redemption.
        amount: MicroCredits,
        /// Paid out of the escrow so far.
        cumulative: MicroCredits,
        /// The receipt's `seq`.
        receipt_seq: u64,
    },
    /// The rest of an escrow returned to the payer; the escrow is closed.
    Released {
        /// Payer account.
        payer: PublicKey,
        /// Amount returned.
        amount: MicroCredits,
    },
}

/// The ledger's signed record of one applied operation, numbered in the ledger's order.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LedgerRecord {
    /// Position in the ledger's log, from 1.
    pub seq: u64,
    /// When it was applied.
    pub created_at: Timestamp,
    /// Id of the request envelope applied (lock, redeem, release) or of the mint order.
    pub op: ContentId,
    /// The escrow concerned (all zeros for a mint).
    pub escrow: EscrowId,
    /// What happened.
    pub entry: LedgerEntry,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for LedgerRecord {
    const KIND: MessageKind = MessageKind::LedgerRecord;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonzero("seq", self.seq)
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }

    fn seq(&self) -> Option<u64> {
        Some(self.seq)
    }
}
