//! Metering on `/gpux/receipt/1`: `UsageReceipt`, `ReceiptAck`, and the `LogChunk`s that carry
//! container output to the renter.

use crate::codec::{self, BodyError, BoundedBytes, Ext};
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

/// Version 1 of [`UsageReceipt`], still read (a host's store holds the receipts of a lease
/// that ran across its upgrade): the workspace charge was ext key 1.
#[derive(bincode::Encode, bincode::Decode)]
struct UsageReceiptV1 {
    lease: ContentId,
    escrow: EscrowId,
    price_per_gpu_hour: MicroCredits,
    gpus: u16,
    seq: u64,
    created_at: Timestamp,
    gpu_seconds: u64,
    amount_due: MicroCredits,
    usage: UsageSummary,
    ext: Ext,
}

/// Version 1's ext key of the workspace charge (u64 little-endian micro-credits).
const V1_WORKSPACE_CHARGE: u16 = 1;

/// `receipt`'s body as version 1 encoded it (for [`crate::older`]).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn usage_receipt_v1_body(receipt: &UsageReceipt) -> Vec<u8> {
    let mut ext = receipt.ext.clone();
    if receipt.workspace_charge > MicroCredits::ZERO {
        // One 8-byte field more than version 2's extras; a receipt at the ext limit
        // already is no receipt a test signs.
        let _ = ext.insert(
            V1_WORKSPACE_CHARGE,
            receipt.workspace_charge.0.to_le_bytes().to_vec(),
        );
    }
    let v1 = UsageReceiptV1 {
        lease: receipt.lease,
        escrow: receipt.escrow,
        price_per_gpu_hour: receipt.price_per_gpu_hour,
        gpus: receipt.gpus,
        seq: receipt.seq,
        created_at: receipt.created_at,
        gpu_seconds: receipt.gpu_seconds,
        amount_due: receipt.amount_due,
        usage: receipt.usage,
        ext,
    };
    // Plain data: encoding cannot fail.
    codec::encode(&v1).unwrap_or_default()
}

impl TryFrom<UsageReceiptV1> for UsageReceipt {
    type Error = BodyError;

    fn try_from(v1: UsageReceiptV1) -> Result<Self, BodyError> {
        let mut ext = v1.ext;
        let workspace_charge = match ext.remove(V1_WORKSPACE_CHARGE) {
            None => MicroCredits::ZERO,
            Some(v) => <[u8; 8]>::try_from(v)
                .map(|b| MicroCredits(u64::from_le_bytes(b)))
                .map_err(|_| {
                    BodyError::Decode(bincode::error::DecodeError::Other(
                        "the workspace charge (version 1, ext key 1) is 8 bytes, little-endian",
                    ))
                })?,
        };
        Ok(Self {
            lease: v1.lease,
            escrow: v1.escrow,
            price_per_gpu_hour: v1.price_per_gpu_hour,
            gpus: v1.gpus,
            seq: v1.seq,
            created_at: v1.created_at,
            gpu_seconds: v1.gpu_seconds,
            amount_due: v1.amount_due,
            workspace_charge,
            usage: v1.usage,
            ext,
        })
    }
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
        match version {
            1 => codec::decode_exact::<UsageReceiptV1>(body)?.try_into(),
            _ => Err(BodyError::Decode(bincode::error::DecodeError::Other(
                "no such version of UsageReceipt",
            ))),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Signed;

    fn receipt(charge: u64) -> UsageReceipt {
        let price = MicroCredits(3_600_000);
        UsageReceipt {
            lease: ContentId([1; 32]),
            escrow: EscrowId([2; 16]),
            price_per_gpu_hour: price,
            gpus: 1,
            seq: 3,
            created_at: Timestamp(1_000),
            gpu_seconds: 120,
            amount_due: MicroCredits(cost(120, price).unwrap().0 + charge),
            workspace_charge: MicroCredits(charge),
            usage: UsageSummary::default(),
            ext: Ext::new(),
        }
    }

    #[test]
    fn a_version_1_receipt_reads_as_today_s_with_its_workspace_charge_typed() {
        let key = crate::Keypair::from_seed(&[7; 32]);
        let bytes = crate::older::usage_receipt_v1(&key, &receipt(200_000));
        assert_eq!(bytes[5], 1);
        let read = Signed::<UsageReceipt>::from_bytes(bytes.clone())
            .unwrap()
            .verify()
            .unwrap();
        assert_eq!(read.workspace_charge, MicroCredits(200_000));
        assert!(read.ext.is_empty(), "{:?}", read.ext);
        assert_eq!(read.body(), &receipt(200_000));
        // Its id and signature are over the bytes received, as version 1 signed them.
        assert_eq!(read.id(), ContentId::of(&bytes));
        assert_eq!(read.as_bytes(), &bytes[..]);
        // Today's version of the same receipt is another envelope.
        let v2 = Signed::sign(&key, receipt(200_000)).unwrap();
        assert_eq!(v2.as_bytes()[5], 2);
        assert_ne!(v2.id(), read.id());
    }

    #[test]
    fn a_version_1_receipt_whose_charge_is_not_8_bytes_or_does_not_add_up_is_refused() {
        let key = crate::Keypair::from_seed(&[7; 32]);
        let mut v1 = receipt(0);
        v1.ext.insert(V1_WORKSPACE_CHARGE, vec![1, 2, 3]).unwrap();
        let bytes = crate::older::usage_receipt_v1(&key, &v1);
        let refused = Signed::<UsageReceipt>::from_bytes(bytes).unwrap().verify();
        assert!(
            matches!(refused, Err(crate::VerifyError::Body { .. })),
            "{refused:?}"
        );
        // A charge the amount leaves out.
        let mut unsummed = receipt(0);
        unsummed.workspace_charge = MicroCredits(5);
        let bytes = crate::older::usage_receipt_v1(&key, &unsummed);
        let refused = Signed::<UsageReceipt>::from_bytes(bytes).unwrap().verify();
        assert!(
            matches!(refused, Err(crate::VerifyError::Invalid { .. })),
            "{refused:?}"
        );
    }

    #[test]
    fn a_version_this_build_never_spoke_is_refused_at_the_frame() {
        let key = crate::Keypair::from_seed(&[7; 32]);
        let mut bytes = crate::older::usage_receipt_v1(&key, &receipt(0));
        bytes[5] = 3;
        assert!(matches!(
            Signed::<UsageReceipt>::from_bytes(bytes),
            Err(crate::VerifyError::UnsupportedVersion { version: 3, .. })
        ));
    }
}
