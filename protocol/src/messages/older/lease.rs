//! `LeaseRequest` version 4 (its terms in ext keys 1 to 8) and `LeaseAccept` version 1 (its
//! timing and start in ext keys 1 to 4).

use super::unread;
use crate::codec::{BodyError, BoundedString, BoundedVec, Ext};
use crate::key::PublicKey;
use crate::messages::lease::{
    EnvVar, LeaseAccept, LeaseKind, LeaseRequest, LeaseTerms, MAX_LEASE_ARGS, MAX_LEASE_ENV,
    MAX_SSH_KEY_BYTES, MAX_SSH_KEYS, ResourceLimits,
};
use crate::messages::market::MAX_OFFER_GPUS;
use crate::money::MicroCredits;
use crate::types::{ContentId, EscrowId, GpuUuid, ImageDigest, Timestamp};

/// Decodes a `LeaseRequest` body of an older `version`.
pub(crate) fn decode_request(version: u8, body: &[u8]) -> Result<LeaseRequest, BodyError> {
    match version {
        4 => crate::codec::decode_exact::<LeaseRequestV4>(body)?.try_into(),
        _ => Err(unread("no such version of LeaseRequest")),
    }
}

/// Decodes a `LeaseAccept` body of an older `version`.
pub(crate) fn decode_accept(version: u8, body: &[u8]) -> Result<LeaseAccept, BodyError> {
    match version {
        1 => crate::codec::decode_exact::<LeaseAcceptV1>(body)?.try_into(),
        _ => Err(unread("no such version of LeaseAccept")),
    }
}

/// Version 4 of [`LeaseRequest`], still read (the lease records hold the request as
/// signed): its terms were ext keys 1 to 8.
#[derive(bincode::Encode, bincode::Decode)]
struct LeaseRequestV4 {
    created_at: Timestamp,
    expires_at: Timestamp,
    offer: ContentId,
    host: PublicKey,
    gpus: BoundedVec<GpuUuid, MAX_OFFER_GPUS>,
    price_per_gpu_hour: MicroCredits,
    duration_s: u32,
    kind: LeaseKind,
    image: ImageDigest,
    command: BoundedVec<BoundedString<1024>, MAX_LEASE_ARGS>,
    env: BoundedVec<EnvVar, MAX_LEASE_ENV>,
    limits: ResourceLimits,
    network: bool,
    escrow: EscrowId,
    escrow_amount: MicroCredits,
    bid: Option<ContentId>,
    ssh_keys: BoundedVec<BoundedString<MAX_SSH_KEY_BYTES>, MAX_SSH_KEYS>,
    ext: Ext,
}

/// Version 4's ext keys of the terms, in [`LeaseTerms`]' order of meaning: the workspace
/// size (u64 LE), the retention (u64 LE s), the cached image (the one byte 1), the
/// retention's price (u64 LE), the commit wait (u64 LE ms), the group (16 bytes), the
/// committed minimum (u64 LE s), the cancellation fees (their bytes).
mod v4 {
    pub(super) const WORKSPACE_BYTES: u16 = 1;
    pub(super) const RETAIN_S: u16 = 2;
    pub(super) const CACHE_IMAGE: u16 = 3;
    pub(super) const WORKSPACE_PRICE: u16 = 4;
    pub(super) const COMMIT_WAIT_MS: u16 = 5;
    pub(super) const GROUP: u16 = 6;
    pub(super) const COMMITTED_S: u16 = 7;
    pub(super) const CANCEL_FEES: u16 = 8;
}

impl TryFrom<LeaseRequestV4> for LeaseRequest {
    type Error = BodyError;

    fn try_from(v4: LeaseRequestV4) -> Result<Self, Self::Error> {
        let mut ext = v4.ext;
        let mut u64_of = |key: u16| super::take_u64(&mut ext, key);
        let workspace_bytes = u64_of(v4::WORKSPACE_BYTES)?;
        let retain_s = u64_of(v4::RETAIN_S)?;
        let workspace_price = MicroCredits(u64_of(v4::WORKSPACE_PRICE)?.unwrap_or(0));
        let commit_wait_ms = u64_of(v4::COMMIT_WAIT_MS)?;
        let committed_s = u64_of(v4::COMMITTED_S)?.unwrap_or(0);
        let cache_image = match ext.remove(v4::CACHE_IMAGE).as_deref() {
            None => false,
            Some([1]) => true,
            Some(_) => return Err(unread("the cache-image term is the one byte 1")),
        };
        let group = ext
            .remove(v4::GROUP)
            .map(|v| <[u8; 16]>::try_from(v).map_err(|_| unread("a group id is 16 bytes")))
            .transpose()?;
        let cancel_fees = super::take_fees(&mut ext, v4::CANCEL_FEES)?;
        Ok(Self {
            created_at: v4.created_at,
            expires_at: v4.expires_at,
            offer: v4.offer,
            host: v4.host,
            gpus: v4.gpus,
            price_per_gpu_hour: v4.price_per_gpu_hour,
            duration_s: v4.duration_s,
            kind: v4.kind,
            image: v4.image,
            command: v4.command,
            env: v4.env,
            limits: v4.limits,
            network: v4.network,
            escrow: v4.escrow,
            escrow_amount: v4.escrow_amount,
            bid: v4.bid,
            ssh_keys: v4.ssh_keys,
            terms: LeaseTerms {
                workspace_bytes,
                retain_s,
                cache_image,
                workspace_price,
                commit_wait_ms,
                group,
                committed_s,
                cancel_fees,
            },
            ext,
        })
    }
}

/// `request`'s body as version 4 encoded it (for [`crate::older`]).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn lease_request_v4_body(request: &LeaseRequest) -> Vec<u8> {
    let t = &request.terms;
    let mut ext = request.ext.clone();
    let u64s = [
        (v4::WORKSPACE_BYTES, t.workspace_bytes),
        (v4::RETAIN_S, t.retain_s),
        (
            v4::WORKSPACE_PRICE,
            Some(t.workspace_price.0).filter(|p| *p > 0),
        ),
        (v4::COMMIT_WAIT_MS, t.commit_wait_ms),
        (v4::COMMITTED_S, Some(t.committed_s).filter(|c| *c > 0)),
    ];
    // At most eight short values: a test's request is within the ext map's limits.
    for (key, value) in u64s {
        if let Some(value) = value {
            let _ = ext.insert(key, value.to_le_bytes().to_vec());
        }
    }
    if t.cache_image {
        let _ = ext.insert(v4::CACHE_IMAGE, vec![1]);
    }
    if let Some(group) = t.group {
        let _ = ext.insert(v4::GROUP, group.to_vec());
    }
    if !t.cancel_fees.tiers().is_empty() {
        let _ = ext.insert(v4::CANCEL_FEES, t.cancel_fees.to_bytes());
    }
    let r = request.clone();
    let v4 = LeaseRequestV4 {
        created_at: r.created_at,
        expires_at: r.expires_at,
        offer: r.offer,
        host: r.host,
        gpus: r.gpus,
        price_per_gpu_hour: r.price_per_gpu_hour,
        duration_s: r.duration_s,
        kind: r.kind,
        image: r.image,
        command: r.command,
        env: r.env,
        limits: r.limits,
        network: r.network,
        escrow: r.escrow,
        escrow_amount: r.escrow_amount,
        bid: r.bid,
        ssh_keys: r.ssh_keys,
        ext,
    };
    // Plain data: encoding cannot fail.
    crate::codec::encode(&v4).unwrap_or_default()
}

/// Version 1 of [`LeaseAccept`], still read (the lease records hold the acceptance as
/// signed): its terms were ext keys 1 to 4, each u64 LE.
#[derive(bincode::Encode, bincode::Decode)]
struct LeaseAcceptV1 {
    request: ContentId,
    created_at: Timestamp,
    ext: Ext,
}

/// Version 1's ext keys: the receipt interval, the ack grace, the spot notice (ms) and the
/// booking's start (unix ms).
const V1_RECEIPT_INTERVAL_MS: u16 = 1;
const V1_ACK_GRACE_MS: u16 = 2;
const V1_SPOT_NOTICE_MS: u16 = 3;
const V1_STARTS_AT: u16 = 4;
/// What version 1 meant by a term it left out: a receipt a minute, 30 s of grace, 30 s of
/// notice.
const V1_DEFAULTS: [u64; 3] = [60_000, 30_000, 30_000];

impl TryFrom<LeaseAcceptV1> for LeaseAccept {
    type Error = BodyError;

    fn try_from(v1: LeaseAcceptV1) -> Result<Self, Self::Error> {
        let mut ext = v1.ext;
        let mut take = |key: u16| super::take_u64(&mut ext, key);
        let receipt_interval_ms = take(V1_RECEIPT_INTERVAL_MS)?.unwrap_or(V1_DEFAULTS[0]);
        let ack_grace_ms = take(V1_ACK_GRACE_MS)?.unwrap_or(V1_DEFAULTS[1]);
        let spot_notice_ms = take(V1_SPOT_NOTICE_MS)?.unwrap_or(V1_DEFAULTS[2]);
        let starts_at = take(V1_STARTS_AT)?.map(Timestamp);
        Ok(Self {
            request: v1.request,
            created_at: v1.created_at,
            receipt_interval_ms,
            ack_grace_ms,
            spot_notice_ms,
            starts_at,
            ext,
        })
    }
}

/// `accept`'s body as version 1 encoded it (for [`crate::older`]).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn lease_accept_v1_body(accept: &LeaseAccept) -> Vec<u8> {
    let mut ext = accept.ext.clone();
    // Four 8-byte values: a test's accept is within the ext map's limits.
    let terms = [
        (V1_RECEIPT_INTERVAL_MS, Some(accept.receipt_interval_ms)),
        (V1_ACK_GRACE_MS, Some(accept.ack_grace_ms)),
        (V1_SPOT_NOTICE_MS, Some(accept.spot_notice_ms)),
        (V1_STARTS_AT, accept.starts_at.map(|t| t.0)),
    ];
    for (key, value) in terms {
        if let Some(value) = value {
            let _ = ext.insert(key, value.to_le_bytes().to_vec());
        }
    }
    let v1 = LeaseAcceptV1 {
        request: accept.request,
        created_at: accept.created_at,
        ext,
    };
    // Plain data: encoding cannot fail.
    crate::codec::encode(&v1).unwrap_or_default()
}

#[cfg(test)]
mod accept_tests {
    use super::*;
    use crate::envelope::Signed;

    fn accept(starts_at: Option<Timestamp>) -> LeaseAccept {
        LeaseAccept {
            request: ContentId([4; 32]),
            created_at: Timestamp(1_000),
            receipt_interval_ms: 5_000,
            ack_grace_ms: 2_000,
            spot_notice_ms: 10_000,
            starts_at,
            ext: Ext::new(),
        }
    }

    #[test]
    fn a_version_1_acceptance_reads_its_terms_from_ext_keys_1_to_4() {
        let key = crate::Keypair::from_seed(&[7; 32]);
        for starts_at in [None, Some(Timestamp(9_000))] {
            let bytes = crate::older::lease_accept_v1(&key, &accept(starts_at));
            assert_eq!(bytes[5], 1);
            let read = Signed::<LeaseAccept>::from_bytes(bytes.clone())
                .unwrap()
                .verify()
                .unwrap();
            assert_eq!(read.body(), &accept(starts_at));
            assert_eq!(read.id(), ContentId::of(&bytes));
        }
        // The terms version 1 left out are what it meant by leaving them out.
        let mut bare = LeaseAcceptV1 {
            request: ContentId([4; 32]),
            created_at: Timestamp(1_000),
            ext: Ext::new(),
        };
        bare.ext.insert(99, vec![1]).unwrap();
        let read = LeaseAccept::try_from(bare).unwrap();
        assert_eq!(
            (
                read.receipt_interval_ms,
                read.ack_grace_ms,
                read.spot_notice_ms
            ),
            (60_000, 30_000, 30_000)
        );
        assert_eq!(read.starts_at, None);
        // An extra it does not know stays in ext, as signed.
        assert_eq!(read.ext.get(99), Some(&[1u8][..]));
    }

    #[test]
    fn a_version_1_term_that_is_not_8_bytes_is_refused() {
        let mut v1 = LeaseAcceptV1 {
            request: ContentId([4; 32]),
            created_at: Timestamp(1_000),
            ext: Ext::new(),
        };
        v1.ext.insert(V1_ACK_GRACE_MS, vec![0; 4]).unwrap();
        let body = crate::codec::encode(&v1).unwrap();
        assert!(decode_accept(1, &body).is_err());
        // Nor is a version this build never spoke.
        assert!(decode_accept(3, &body).is_err());
    }
}

#[cfg(test)]
mod request_tests {
    use super::*;
    use crate::envelope::Signed;

    fn request() -> LeaseRequest {
        let price = MicroCredits(3_600_000);
        LeaseRequest {
            created_at: Timestamp(1_000),
            expires_at: Timestamp(31_000),
            offer: ContentId([1; 32]),
            host: crate::Keypair::from_seed(&[7; 32]).public(),
            gpus: BoundedVec::new(vec![GpuUuid::Gpu([2; 16])]).unwrap(),
            price_per_gpu_hour: price,
            duration_s: 600,
            kind: LeaseKind::Reserved {
                start: Timestamp(100_000),
                end: Timestamp(700_000),
            },
            image: ImageDigest([3; 32]),
            command: BoundedVec::empty(),
            env: BoundedVec::empty(),
            limits: ResourceLimits {
                memory_bytes: 1 << 30,
                cpu_millis: 1000,
                pids: 64,
                scratch_bytes: 1 << 20,
                shm_bytes: 1 << 20,
            },
            network: false,
            escrow: EscrowId([4; 16]),
            escrow_amount: MicroCredits(2_000_000),
            bid: None,
            ssh_keys: BoundedVec::empty(),
            terms: LeaseTerms {
                workspace_bytes: Some(4 << 30),
                retain_s: Some(1800),
                cache_image: true,
                workspace_price: MicroCredits(100_000),
                commit_wait_ms: Some(60_000),
                group: Some([9; 16]),
                committed_s: 300,
                cancel_fees: "1h:50%,10m:100%".parse().unwrap(),
            },
            ext: Ext::new(),
        }
    }

    #[test]
    fn a_version_4_request_reads_its_eight_terms_from_ext_into_the_typed_terms() {
        let key = crate::Keypair::from_seed(&[8; 32]);
        let bytes = crate::older::lease_request_v4(&key, &request());
        assert_eq!(bytes[5], 4);
        let read = Signed::<LeaseRequest>::from_bytes(bytes.clone())
            .unwrap()
            .verify()
            .unwrap();
        assert_eq!(read.body(), &request());
        assert!(read.ext.is_empty());
        assert_eq!(read.id(), ContentId::of(&bytes));
        assert_eq!(read.retention_charge(), Ok(MicroCredits(200_000)));
        // Today's version of the same request is another envelope, another lease id.
        let v5 = Signed::sign(&key, request()).unwrap();
        assert_eq!(v5.as_bytes()[5], 5);
        assert_ne!(v5.id(), read.id());
    }

    #[test]
    fn a_version_4_term_of_the_wrong_shape_is_refused() {
        let key = crate::Keypair::from_seed(&[8; 32]);
        for (term, value) in [
            (v4::WORKSPACE_BYTES, vec![1, 2, 3]),
            (v4::CACHE_IMAGE, vec![2]),
            (v4::GROUP, vec![1; 15]),
            (v4::CANCEL_FEES, vec![1, 2, 3, 4]),
        ] {
            let mut odd = request();
            odd.terms = LeaseTerms::default();
            odd.kind = LeaseKind::OnDemand;
            odd.ext.insert(term, value).unwrap();
            let bytes = crate::older::lease_request_v4(&key, &odd);
            let refused = Signed::<LeaseRequest>::from_bytes(bytes).unwrap().verify();
            assert!(
                matches!(refused, Err(crate::VerifyError::Body { .. })),
                "key {term}: {refused:?}"
            );
        }
    }
}
