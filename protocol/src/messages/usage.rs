//! Metering on `/gpux/receipt/1`: `UsageReceipt`, `ReceiptAck`, and the `LogChunk`s that carry
//! container output to the renter.

use crate::codec::{BodyError, BoundedBytes, Ext};
use crate::envelope::Message;
use crate::messages::{InvalidMessage, MessageKind, ensure_nonzero};
use crate::money::{MicroCredits, cost};
use crate::types::{ContentId, EscrowId, Timestamp};

/// The most bytes of output in one log chunk.
pub const MAX_LOG_CHUNK_BYTES: usize = 64 * 1024;

/// Usage observed over the lease so far.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct UsageSummary {
    /// Mean GPU utilisation over the lease, in thousandths (0..=1000).
    pub gpu_util_permille: u16,
    /// Highest GPU memory used by the workload, bytes.
    pub gpu_memory_peak_bytes: u64,
    /// Highest container memory used, bytes.
    pub memory_peak_bytes: u64,
    /// Mean CPU used, thousandths of a core.
    pub cpu_millis_avg: u32,
}

/// The host's signed, cumulative statement of what a lease owes so far. Bound to the lease,
/// its price and its escrow; a higher `seq` supersedes a lower one.
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
pub struct UsageReceipt {
    /// The lease id.
    pub lease: ContentId,
    /// The lease's escrow.
    pub escrow: EscrowId,
    /// The lease's price per GPU-hour.
    pub price_per_gpu_hour: MicroCredits,
    /// GPUs in the lease.
    pub gpus: u16,
    /// Receipt number within the lease, from 1.
    pub seq: u64,
    /// When it was issued.
    pub created_at: Timestamp,
    /// Billed GPU-seconds since the lease started, cumulative (60 s minimum per GPU).
    pub gpu_seconds: u64,
    /// Amount due, cumulative: exactly [`cost`]`(gpu_seconds, price_per_gpu_hour)` plus the
    /// [workspace charge](Self::workspace_charge).
    pub amount_due: MicroCredits,
    /// The part of `amount_due` that pays for the workspace's retention (at most the lease's
    /// [`LeaseRequest::retention_charge`](crate::LeaseRequest::retention_charge); zero
    /// without a kept workspace). Version 1 carried it in ext key 1.
    pub workspace_charge: MicroCredits,
    /// What the workload used.
    pub usage: UsageSummary,
    /// Extension fields: optional extras only.
    pub ext: Ext,
}

impl Message for UsageReceipt {
    const KIND: MessageKind = MessageKind::UsageReceipt;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonzero("gpus", self.gpus.into())?;
        ensure_nonzero("seq", self.seq)?;
        if self.usage.gpu_util_permille > 1000 {
            return Err(InvalidMessage::AboveLimit {
                field: "usage.gpu_util_permille",
                value: self.usage.gpu_util_permille.into(),
                max: 1000,
            });
        }
        let due =
            cost(self.gpu_seconds, self.price_per_gpu_hour)?.checked_add(self.workspace_charge)?;
        if due != self.amount_due {
            return Err(InvalidMessage::Inconsistent {
                field: "amount_due",
                reason: "not the cost of gpu_seconds at price_per_gpu_hour plus the workspace charge",
            });
        }
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }

    fn seq(&self) -> Option<u64> {
        Some(self.seq)
    }

    fn decode_older(version: u8, body: &[u8]) -> Result<Self, BodyError> {
        super::older::usage::decode_receipt(version, body)
    }
}

/// The renter's countersignature of a receipt: it agrees the cumulative amount.
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
pub struct ReceiptAck {
    /// Id of the receipt acknowledged.
    pub receipt: ContentId,
    /// The lease id.
    pub lease: ContentId,
    /// The receipt's `seq`.
    pub seq: u64,
    /// The receipt's cumulative `amount_due`.
    pub amount_due: MicroCredits,
    /// When.
    pub created_at: Timestamp,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for ReceiptAck {
    const KIND: MessageKind = MessageKind::ReceiptAck;

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

/// Which output stream a log chunk is from.
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
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Container output for the renter, in order by `seq`.
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
pub struct LogChunk {
    /// The lease id.
    pub lease: ContentId,
    /// Chunk number within the lease, from 0.
    pub seq: u64,
    /// When the output was read.
    pub created_at: Timestamp,
    /// Which stream.
    pub stream: LogStream,
    /// The bytes (not necessarily UTF-8).
    pub data: BoundedBytes<MAX_LOG_CHUNK_BYTES>,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for LogChunk {
    const KIND: MessageKind = MessageKind::LogChunk;

    fn check(&self) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}
