//! `UsageReceipt` version 1: its workspace charge in ext key 1.

use super::unread;
use crate::codec::{BodyError, Ext};
use crate::messages::usage::{UsageReceipt, UsageSummary};
use crate::money::MicroCredits;
use crate::types::{ContentId, EscrowId, Timestamp};

/// Decodes a `UsageReceipt` body of an older `version`.
pub(crate) fn decode_receipt(version: u8, body: &[u8]) -> Result<UsageReceipt, BodyError> {
    match version {
        1 => crate::codec::decode_exact::<UsageReceiptV1>(body)?.try_into(),
        _ => Err(unread("no such version of UsageReceipt")),
    }
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
    crate::codec::encode(&v1).unwrap_or_default()
}

impl TryFrom<UsageReceiptV1> for UsageReceipt {
    type Error = BodyError;

    fn try_from(v1: UsageReceiptV1) -> Result<Self, BodyError> {
        let mut ext = v1.ext;
        let workspace_charge =
            MicroCredits(super::take_u64(&mut ext, V1_WORKSPACE_CHARGE)?.unwrap_or(0));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Signed;
    use crate::money::cost;

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
