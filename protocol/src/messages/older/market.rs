//! `Offer` version 4: its terms in ext keys 1 to 8.

use super::unread;
use crate::EvidenceTier;
use crate::codec::{BodyError, BoundedString, BoundedVec, Ext};
use crate::messages::market::{
    BookedWindow, MAX_OFFER_GPUS, MAX_OFFER_IMAGES, Machine, Offer, OfferGpu, OfferTerms, Pulls,
};
use crate::money::MicroCredits;
use crate::types::{ContentId, ImageDigest, Timestamp, Version};

/// Decodes an `Offer` body of an older `version`.
pub(crate) fn decode_offer(version: u8, body: &[u8]) -> Result<Offer, BodyError> {
    match version {
        4 => crate::codec::decode_exact::<OfferV4>(body)?.try_into(),
        _ => Err(unread("no such version of Offer")),
    }
}

/// Version 4 of [`Offer`], still read: its terms were ext keys 1 to 8.
#[derive(bincode::Encode, bincode::Decode)]
struct OfferV4 {
    seq: u64,
    slot: u16,
    created_at: Timestamp,
    expires_at: Timestamp,
    attestation: ContentId,
    gpus: BoundedVec<OfferGpu, MAX_OFFER_GPUS>,
    price_per_gpu_hour: MicroCredits,
    spot_floor_per_gpu_hour: Option<MicroCredits>,
    min_duration_s: u32,
    max_duration_s: u32,
    region: BoundedString<32>,
    tier: EvidenceTier,
    driver: Version,
    cuda: Version,
    images: BoundedVec<ImageDigest, MAX_OFFER_IMAGES>,
    machine: Machine,
    pulls: Pulls,
    ext: Ext,
}

/// Version 4's ext keys of the terms: the workspace size (u64 LE), the longest retention
/// (u64 LE s), the largest staged image (u64 LE), the images' tags (text, one line of
/// space-separated tags per image), the retention's price (u64 LE), the booked windows
/// (17-byte records: the GPU's index, the start and end, u64 LE), the MIG profile (UTF-8),
/// the cancellation fees (their bytes).
mod v4 {
    pub(super) const WORKSPACE_BYTES: u16 = 1;
    pub(super) const MAX_RETAIN_S: u16 = 2;
    pub(super) const MAX_IMAGE_BYTES: u16 = 3;
    pub(super) const IMAGE_TAGS: u16 = 4;
    pub(super) const WORKSPACE_PRICE: u16 = 5;
    pub(super) const BOOKED: u16 = 6;
    pub(super) const MIG_PROFILE: u16 = 7;
    pub(super) const CANCEL_FEES: u16 = 8;
}

impl TryFrom<OfferV4> for Offer {
    type Error = BodyError;

    fn try_from(v4: OfferV4) -> Result<Self, Self::Error> {
        let mut ext = v4.ext;
        let mut u64_of = |key: u16| super::take_u64(&mut ext, key);
        let workspace_bytes = u64_of(v4::WORKSPACE_BYTES)?.unwrap_or(0);
        let max_retain_s = u64_of(v4::MAX_RETAIN_S)?;
        let max_image_bytes = u64_of(v4::MAX_IMAGE_BYTES)?.unwrap_or(0);
        let workspace_price = MicroCredits(u64_of(v4::WORKSPACE_PRICE)?.unwrap_or(0));
        let bad_tags = || unread("version 4 image tags: one line of valid tags per listed image");
        let image_tags = match ext.remove(v4::IMAGE_TAGS) {
            None => BoundedVec::empty(),
            Some(text) => {
                let text = String::from_utf8(text).map_err(|_| bad_tags())?;
                let lines = text
                    .lines()
                    .map(|line| {
                        let tags = line
                            .split_whitespace()
                            .map(|t| BoundedString::new(t).map_err(|_| bad_tags()))
                            .collect::<Result<Vec<_>, _>>()?;
                        BoundedVec::new(tags).map_err(|_| bad_tags())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                BoundedVec::new(lines).map_err(|_| bad_tags())?
            }
        };
        let booked = match ext.remove(v4::BOOKED) {
            None => BoundedVec::empty(),
            Some(bytes) => {
                if bytes.len() % 17 != 0 {
                    return Err(unread("version 4 booked windows: records of 17 bytes"));
                }
                let windows = bytes
                    .chunks_exact(17)
                    .map(|r| {
                        let word = |at: usize| {
                            let mut w = [0u8; 8];
                            w.copy_from_slice(&r[at..at + 8]);
                            Timestamp(u64::from_le_bytes(w))
                        };
                        BookedWindow {
                            gpu: r[0],
                            start: word(1),
                            end: word(9),
                        }
                    })
                    .collect();
                BoundedVec::new(windows)
                    .map_err(|_| unread("version 4 booked windows: at most 8"))?
            }
        };
        let mig_profile = ext
            .remove(v4::MIG_PROFILE)
            .map(|p| {
                String::from_utf8(p)
                    .ok()
                    .and_then(|p| BoundedString::new(p).ok())
                    .ok_or_else(|| unread("a version 4 MIG profile is short UTF-8 text"))
            })
            .transpose()?;
        let cancel_fees = super::take_fees(&mut ext, v4::CANCEL_FEES)?;
        Ok(Self {
            seq: v4.seq,
            slot: v4.slot,
            created_at: v4.created_at,
            expires_at: v4.expires_at,
            attestation: v4.attestation,
            gpus: v4.gpus,
            price_per_gpu_hour: v4.price_per_gpu_hour,
            spot_floor_per_gpu_hour: v4.spot_floor_per_gpu_hour,
            min_duration_s: v4.min_duration_s,
            max_duration_s: v4.max_duration_s,
            region: v4.region,
            tier: v4.tier,
            driver: v4.driver,
            cuda: v4.cuda,
            images: v4.images,
            machine: v4.machine,
            pulls: v4.pulls,
            terms: OfferTerms {
                workspace_bytes,
                max_retain_s,
                max_image_bytes,
                workspace_price,
                image_tags,
                booked,
                mig_profile,
                cancel_fees,
            },
            ext,
        })
    }
}

/// `offer`'s body as version 4 encoded it (for [`crate::older`]).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn offer_v4_body(offer: &Offer) -> Vec<u8> {
    let t = &offer.terms;
    let mut ext = offer.ext.clone();
    // Short values: a test's offer is within the ext map's limits.
    let u64s = [
        (
            v4::WORKSPACE_BYTES,
            Some(t.workspace_bytes).filter(|b| *b > 0),
        ),
        (v4::MAX_RETAIN_S, t.max_retain_s),
        (
            v4::MAX_IMAGE_BYTES,
            Some(t.max_image_bytes).filter(|b| *b > 0),
        ),
        (
            v4::WORKSPACE_PRICE,
            Some(t.workspace_price.0).filter(|p| *p > 0),
        ),
    ];
    for (key, value) in u64s {
        if let Some(value) = value {
            let _ = ext.insert(key, value.to_le_bytes().to_vec());
        }
    }
    if !t.image_tags.is_empty() {
        let lines: Vec<String> = t
            .image_tags
            .iter()
            .map(|tags| {
                tags.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let _ = ext.insert(v4::IMAGE_TAGS, lines.join("\n").into_bytes());
    }
    if !t.booked.is_empty() {
        let records = t
            .booked
            .iter()
            .flat_map(|w| {
                let mut r = vec![w.gpu];
                r.extend(w.start.0.to_le_bytes());
                r.extend(w.end.0.to_le_bytes());
                r
            })
            .collect();
        let _ = ext.insert(v4::BOOKED, records);
    }
    if let Some(profile) = &t.mig_profile {
        let _ = ext.insert(v4::MIG_PROFILE, profile.as_bytes().to_vec());
    }
    if !t.cancel_fees.tiers().is_empty() {
        let _ = ext.insert(v4::CANCEL_FEES, t.cancel_fees.to_bytes());
    }
    let o = offer.clone();
    let v4 = OfferV4 {
        seq: o.seq,
        slot: o.slot,
        created_at: o.created_at,
        expires_at: o.expires_at,
        attestation: o.attestation,
        gpus: o.gpus,
        price_per_gpu_hour: o.price_per_gpu_hour,
        spot_floor_per_gpu_hour: o.spot_floor_per_gpu_hour,
        min_duration_s: o.min_duration_s,
        max_duration_s: o.max_duration_s,
        region: o.region,
        tier: o.tier,
        driver: o.driver,
        cuda: o.cuda,
        images: o.images,
        machine: o.machine,
        pulls: o.pulls,
        ext,
    };
    // Plain data: encoding cannot fail.
    crate::codec::encode(&v4).unwrap_or_default()
}

#[cfg(test)]
mod offer_tests {
    use super::*;
    use crate::envelope::Signed;

    fn offer() -> Offer {
        let gpu = |n: u8| OfferGpu {
            uuid: crate::GpuUuid::Mig([n; 16]),
            family: BoundedString::new("a100").unwrap(),
            memory_bytes: 10 << 30,
            compute_capability: crate::ComputeCapability::new(8, 0),
            pcie_gen: 4,
        };
        let tags = |t: &[&str]| {
            BoundedVec::new(t.iter().map(|t| BoundedString::new(*t).unwrap()).collect()).unwrap()
        };
        Offer {
            seq: 1,
            slot: 0,
            created_at: Timestamp(1_000),
            expires_at: Timestamp(601_000),
            attestation: ContentId([7; 32]),
            gpus: BoundedVec::new(vec![gpu(1), gpu(2)]).unwrap(),
            price_per_gpu_hour: MicroCredits(3_600_000),
            spot_floor_per_gpu_hour: None,
            min_duration_s: 60,
            max_duration_s: 86_400,
            region: BoundedString::new("eu").unwrap(),
            tier: EvidenceTier::SelfReported,
            driver: Version::default(),
            cuda: Version::default(),
            images: BoundedVec::new(vec![ImageDigest([4; 32]), ImageDigest([5; 32])]).unwrap(),
            machine: Machine::split_evenly("test CPU", 16, 64 << 30, 2),
            pulls: Pulls::default(),
            terms: OfferTerms {
                workspace_bytes: 100 << 30,
                max_retain_s: Some(3600),
                max_image_bytes: 20 << 30,
                workspace_price: MicroCredits(50_000),
                image_tags: BoundedVec::new(vec![
                    tags(&["pytorch:2.4", "pytorch:latest"]),
                    tags(&["cuda:12"]),
                ])
                .unwrap(),
                booked: BoundedVec::new(vec![BookedWindow {
                    gpu: 1,
                    start: Timestamp(90_000),
                    end: Timestamp(180_000),
                }])
                .unwrap(),
                mig_profile: Some(BoundedString::new("1g.10gb").unwrap()),
                cancel_fees: "1h:50%,10m:100%".parse().unwrap(),
            },
            ext: Ext::new(),
        }
    }

    #[test]
    fn a_version_4_offer_reads_its_eight_terms_from_ext_into_the_typed_terms() {
        let key = crate::Keypair::from_seed(&[7; 32]);
        let bytes = crate::older::offer_v4(&key, &offer());
        assert_eq!(bytes[5], 4);
        let read = Signed::<Offer>::from_bytes(bytes.clone())
            .unwrap()
            .verify()
            .unwrap();
        assert_eq!(read.body(), &offer());
        assert!(read.ext.is_empty());
        assert_eq!(read.id(), ContentId::of(&bytes));
        assert_eq!(read.image_tags().len(), 3);
        assert_eq!(read.mig_profile(), Some("1g.10gb"));
    }

    #[test]
    fn a_version_4_term_of_the_wrong_shape_is_refused() {
        let key = crate::Keypair::from_seed(&[7; 32]);
        for (term, value) in [
            (v4::WORKSPACE_BYTES, vec![1, 2, 3]),
            (v4::IMAGE_TAGS, vec![0xff]),
            (v4::BOOKED, vec![0; 16]),
            (v4::CANCEL_FEES, vec![1, 2, 3]),
        ] {
            let mut odd = offer();
            odd.terms = OfferTerms {
                mig_profile: odd.terms.mig_profile,
                ..OfferTerms::default()
            };
            odd.ext.insert(term, value).unwrap();
            let bytes = crate::older::offer_v4(&key, &odd);
            let refused = Signed::<Offer>::from_bytes(bytes).unwrap().verify();
            assert!(
                matches!(refused, Err(crate::VerifyError::Body { .. })),
                "key {term}: {refused:?}"
            );
        }
    }
}
