//! Validation rules that need a clock or another message.

use gpux_protocol::validate::{self, RuleError, Rules, SeqTracker};
use gpux_protocol::*;

use crate::samples::{self, T0};

fn chain() -> (
    Verified<Attestation>,
    Verified<Offer>,
    Verified<LeaseRequest>,
) {
    let att = Signed::sign(&samples::host(), samples::attestation()).unwrap();
    let offer = Signed::sign(&samples::host(), samples::offer_for(&att, 1)).unwrap();
    let request = Signed::sign(&samples::renter(), samples::lease_request_for(&offer)).unwrap();
    (att, offer, request)
}

#[test]
fn time_rules() {
    let rules = Rules::default();
    let (att, offer, _) = chain();
    assert_eq!(rules.check_time(&offer, T0), Ok(()));
    assert!(matches!(
        rules.check_time(&offer, T0.plus_secs(600)),
        Err(RuleError::Expired { .. })
    ));
    // 30 s of skew is tolerated, 31 s is not.
    assert_eq!(rules.check_time(&offer, Timestamp(T0.0 - 30_000)), Ok(()));
    assert!(matches!(
        rules.check_time(&offer, Timestamp(T0.0 - 31_000)),
        Err(RuleError::FromTheFuture {
            kind: MessageKind::Offer,
            ..
        })
    ));
    // Kinds without expiry go stale instead: after 10 minutes (attestations: a day).
    let accept = Signed::sign(
        &samples::host(),
        gpux_testkit::accept(ContentId([1; 32]), T0),
    )
    .unwrap();
    assert_eq!(rules.check_time(&accept, T0.plus_secs(600)), Ok(()));
    assert!(matches!(
        rules.check_time(&accept, T0.plus_secs(601)),
        Err(RuleError::Stale {
            kind: MessageKind::LeaseAccept,
            ..
        })
    ));
    assert_eq!(rules.check_time(&att, T0.plus_secs(601)), Ok(()));
    // An offer may not live longer than the limit.
    let mut long = samples::offer_for(&att, 2);
    long.expires_at = T0.plus_secs(3601);
    let long = Signed::sign(&samples::host(), long).unwrap();
    assert!(matches!(
        rules.check_time(&long, T0),
        Err(RuleError::LifetimeTooLong { .. })
    ));
}

#[test]
fn sequence_numbers_replace_and_refuse_replays() {
    let mut seqs = SeqTracker::new();
    let host = samples::host().public();
    let other = samples::renter().public();
    assert_eq!(seqs.observe(host, 5), Ok(()));
    assert_eq!(seqs.observe(host, 6), Ok(()));
    assert_eq!(
        seqs.observe(host, 6),
        Err(RuleError::Replay { seq: 6, newest: 6 })
    );
    assert_eq!(
        seqs.observe(host, 2),
        Err(RuleError::Replay { seq: 2, newest: 6 })
    );
    assert_eq!(seqs.observe(other, 1), Ok(()));
    assert_eq!(seqs.newest(&host), Some(6));
    assert_eq!(seqs.len(), 2);
}

#[test]
fn offers_in_different_slots_do_not_replace_each_other() {
    let host = samples::host().public();
    let mut by_slot: SeqTracker<(PublicKey, u16)> = SeqTracker::new();
    assert_eq!(by_slot.observe((host, 0), 10), Ok(()));
    // Slot 1's first offer has a lower seq than slot 0's newest: still accepted.
    assert_eq!(by_slot.observe((host, 1), 4), Ok(()));
    assert_eq!(
        by_slot.observe((host, 1), 4),
        Err(RuleError::Replay { seq: 4, newest: 4 })
    );
    assert_eq!(by_slot.observe((host, 0), 11), Ok(()));
}

#[test]
fn attestations_stay_valid_for_a_day() {
    let rules = Rules::default();
    let (att, _, _) = chain();
    assert_eq!(rules.check_time(&att, T0.plus_secs(23 * 3600)), Ok(()));
    assert!(matches!(
        rules.check_time(&att, T0.plus_secs(24 * 3600 + 1)),
        Err(RuleError::Stale { .. })
    ));
}

#[test]
fn escrow_lock_must_fit_the_lease_request() {
    let (_, _, request) = chain();
    let renter = samples::renter();
    let lock = |f: &dyn Fn(&mut EscrowLock)| {
        let mut body = EscrowLock {
            escrow: request.escrow,
            lease: request.id(),
            payer: renter.public(),
            payee: request.host,
            amount: request.escrow_amount,
            price_per_gpu_hour: request.price_per_gpu_hour,
            created_at: T0.plus_secs(2),
            ext: Ext::new(),
        };
        f(&mut body);
        Signed::sign(&renter, body).unwrap()
    };
    assert_eq!(
        validate::escrow_lock_matches_request(&lock(&|_| {}), &request),
        Ok(())
    );
    let third = Keypair::from_seed(&[3; 32]).public();
    for (field, change) in [
        (
            "payer",
            Box::new(move |l: &mut EscrowLock| l.payer = third) as Box<dyn Fn(&mut EscrowLock)>,
        ),
        ("payee", Box::new(move |l: &mut EscrowLock| l.payee = third)),
        (
            "escrow",
            Box::new(|l: &mut EscrowLock| l.escrow = EscrowId([0; 16])),
        ),
        (
            "amount",
            Box::new(|l: &mut EscrowLock| l.amount = MicroCredits(l.amount.0 + 1)),
        ),
        (
            "price_per_gpu_hour",
            Box::new(|l: &mut EscrowLock| l.price_per_gpu_hour = MicroCredits(1)),
        ),
    ] {
        assert_eq!(
            validate::escrow_lock_matches_request(&lock(&*change), &request),
            Err(RuleError::EscrowMismatch { field }),
        );
    }
    // Someone else locking money for this lease.
    let stranger = Signed::sign(&samples::host(), lock(&|_| {}).body().clone()).unwrap();
    assert!(matches!(
        validate::escrow_lock_matches_request(&stranger, &request),
        Err(RuleError::SignerMismatch { .. })
    ));
}

#[test]
fn challenge_response_must_answer_its_request() {
    let host = samples::host();
    let request = Signed::sign(
        &samples::renter(),
        ChallengeRequest {
            host: host.public(),
            created_at: T0,
            seed: [1; 32],
            m: 64,
            k: 64,
            n: 64,
            fill_lanes: 0,
            fill_blocks: 0,
            gpu: None,
            ext: Ext::new(),
        },
    )
    .unwrap();
    let respond = |request: ContentId, key: &Keypair| {
        Signed::sign(
            key,
            ChallengeResponse {
                request,
                created_at: T0.plus_secs(1),
                rows_root: ContentId([9; 32]),
                fill_root: None,
                elapsed_ns: 1000,
                ext: Ext::new(),
            },
        )
        .unwrap()
    };
    assert_eq!(
        validate::challenge_response_matches_request(&respond(request.id(), &host), &request),
        Ok(())
    );
    assert!(matches!(
        validate::challenge_response_matches_request(&respond(ContentId([3; 32]), &host), &request),
        Err(RuleError::WrongReference { .. })
    ));
    assert!(matches!(
        validate::challenge_response_matches_request(
            &respond(request.id(), &samples::renter()),
            &request
        ),
        Err(RuleError::SignerMismatch { .. })
    ));
}

#[test]
fn offer_must_match_its_attestation() {
    let (att, offer, _) = chain();
    assert_eq!(validate::offer_matches_attestation(&offer, &att), Ok(()));

    let mut unknown_gpu = samples::offer_for(&att, 2);
    unknown_gpu.gpus = BoundedVec::new(vec![OfferGpu {
        uuid: samples::uuid(99),
        ..att_gpu(&unknown_gpu)
    }])
    .unwrap();
    let unknown_gpu = Signed::sign(&samples::host(), unknown_gpu).unwrap();
    assert_eq!(
        validate::offer_matches_attestation(&unknown_gpu, &att),
        Err(RuleError::GpuNotAttested {
            uuid: samples::uuid(99)
        })
    );

    let mut bigger = samples::offer_for(&att, 3);
    let mut first = att_gpu(&bigger);
    first.memory_bytes += 1;
    bigger.gpus = BoundedVec::new(vec![first]).unwrap();
    let bigger = Signed::sign(&samples::host(), bigger).unwrap();
    assert!(matches!(
        validate::offer_matches_attestation(&bigger, &att),
        Err(RuleError::GpuMismatch {
            field: "memory_bytes",
            ..
        })
    ));

    let mut renamed = samples::offer_for(&att, 4);
    let mut first = att_gpu(&renamed);
    first.family = BoundedString::new("a100").unwrap();
    renamed.gpus = BoundedVec::new(vec![first]).unwrap();
    let renamed = Signed::sign(&samples::host(), renamed).unwrap();
    assert!(matches!(
        validate::offer_matches_attestation(&renamed, &att),
        Err(RuleError::GpuMismatch {
            field: "family",
            ..
        })
    ));

    // Someone else's attestation.
    let foreign = Signed::sign(&samples::renter(), samples::attestation()).unwrap();
    assert!(matches!(
        validate::offer_matches_attestation(&offer, &foreign),
        Err(RuleError::SignerMismatch { .. })
    ));
    // The right signer, but another attestation than the one named.
    let mut other = samples::attestation();
    other.created_at = T0.plus_secs(1);
    let other = Signed::sign(&samples::host(), other).unwrap();
    assert!(matches!(
        validate::offer_matches_attestation(&offer, &other),
        Err(RuleError::WrongReference { .. })
    ));
}

#[test]
fn an_offer_of_mig_slices_names_attested_slices_of_one_profile() {
    let (att, _, _) = chain();
    let slice = |uuid: u8, memory_mib: u64| OfferGpu {
        uuid: GpuUuid::Mig([uuid; 16]),
        memory_bytes: memory_mib << 20,
        ..att_gpu(&samples::offer_for(&att, 1))
    };
    let offer_of = |gpus: Vec<OfferGpu>, profile: Option<&str>| {
        let mut offer = samples::offer_for(&att, 5);
        offer.gpus = BoundedVec::new(gpus).unwrap();
        offer.terms.mig_profile = profile.map(|p| BoundedString::new(p).unwrap());
        Signed::sign(&samples::host(), offer)
    };
    // The sample's second GPU has MIG on with a 1g.10gb slice (0xa1) and a 3g.40gb (0xa2).
    let good = offer_of(vec![slice(0xa1, 9_984)], Some("1g.10gb")).unwrap();
    assert_eq!(validate::offer_matches_attestation(&good, &att), Ok(()));
    assert_eq!(good.mig_profile(), Some("1g.10gb"));
    // Another profile than the slice's, another memory, a slice nobody attested.
    let wrong_profile = offer_of(vec![slice(0xa2, 40_192)], Some("1g.10gb")).unwrap();
    assert!(matches!(
        validate::offer_matches_attestation(&wrong_profile, &att),
        Err(RuleError::GpuMismatch {
            field: "MIG profile",
            ..
        })
    ));
    let bigger = offer_of(vec![slice(0xa1, 10_000)], Some("1g.10gb")).unwrap();
    assert!(matches!(
        validate::offer_matches_attestation(&bigger, &att),
        Err(RuleError::GpuMismatch {
            field: "memory_bytes",
            ..
        })
    ));
    let unknown = offer_of(vec![slice(0xa9, 9_984)], Some("1g.10gb")).unwrap();
    assert!(matches!(
        validate::offer_matches_attestation(&unknown, &att),
        Err(RuleError::GpuNotAttested { .. })
    ));
    // A slice is not its GPU: the same bytes as a whole GPU are another device.
    let as_gpu = OfferGpu {
        uuid: GpuUuid::Gpu([0xa1; 16]),
        ..slice(0xa1, 9_984)
    };
    let as_gpu = offer_of(vec![as_gpu], None).unwrap();
    assert!(matches!(
        validate::offer_matches_attestation(&as_gpu, &att),
        Err(RuleError::GpuNotAttested { .. })
    ));
    // Whole GPUs and slices never share an offer; slices name their profile, GPUs none.
    let whole = att_gpu(&samples::offer_for(&att, 1));
    for (gpus, profile) in [
        (vec![whole.clone(), slice(0xa1, 9_984)], Some("1g.10gb")),
        (vec![slice(0xa1, 9_984)], None),
        (vec![slice(0xa1, 9_984)], Some("big")),
        (vec![whole], Some("1g.10gb")),
    ] {
        assert!(offer_of(gpus, profile).is_err());
    }
    // A slice with MIG off is not attested: the probe never lists one, and a forged
    // attestation that does is refused.
    let mut forged = samples::attestation();
    let mut gpus = forged.gpus.to_vec();
    if let Some(m) = gpus[1].mig.as_mut() {
        m.enabled = false;
    }
    forged.gpus = BoundedVec::new(gpus).unwrap();
    assert!(Signed::sign(&samples::host(), forged).is_err());
}

fn att_gpu(offer: &Offer) -> OfferGpu {
    offer.gpus[0].clone()
}

#[test]
fn lease_request_must_fit_its_offer() {
    let (_, offer, request) = chain();
    assert_eq!(
        validate::lease_request_matches_offer(&request, &offer, false),
        Ok(())
    );
    let renter = samples::renter();
    let sign = |r: LeaseRequest| Signed::sign(&renter, r).unwrap();

    let mut cheap = samples::lease_request_for(&offer);
    cheap.price_per_gpu_hour = MicroCredits(offer.price_per_gpu_hour.0 - 1);
    assert!(matches!(
        validate::lease_request_matches_offer(&sign(cheap), &offer, false),
        Err(RuleError::PriceBelowOffer { .. })
    ));

    let mut spot = samples::lease_request_for(&offer);
    spot.kind = LeaseKind::Spot;
    spot.price_per_gpu_hour = offer.spot_floor_per_gpu_hour.unwrap();
    assert_eq!(
        validate::lease_request_matches_offer(&sign(spot.clone()), &offer, false),
        Ok(())
    );
    spot.price_per_gpu_hour = MicroCredits(spot.price_per_gpu_hour.0 - 1);
    assert!(matches!(
        validate::lease_request_matches_offer(&sign(spot), &offer, false),
        Err(RuleError::PriceBelowOffer { .. })
    ));

    let mut stranger = samples::lease_request_for(&offer);
    stranger.gpus = BoundedVec::new(vec![samples::uuid(77)]).unwrap();
    assert_eq!(
        validate::lease_request_matches_offer(&sign(stranger), &offer, false),
        Err(RuleError::GpuNotOffered {
            uuid: samples::uuid(77)
        })
    );

    let mut long = samples::lease_request_for(&offer);
    long.duration_s = offer.max_duration_s + 1;
    assert!(matches!(
        validate::lease_request_matches_offer(&sign(long), &offer, false),
        Err(RuleError::DurationOutOfRange { .. })
    ));

    let mut image = samples::lease_request_for(&offer);
    image.image = ImageDigest([0; 32]);
    let image = sign(image);
    assert_eq!(
        validate::lease_request_matches_offer(&image, &offer, false),
        Err(RuleError::ImageNotOffered)
    );
    // A staged (or pulled) image counts only where the offer says the host stages or pulls
    // renters' images: the sample pulls, an offer of the same GPUs without pulls does not.
    assert_eq!(
        validate::lease_request_matches_offer(&image, &offer, true),
        Ok(())
    );
    let mut own_only = offer.body().clone();
    own_only.pulls = Pulls::default();
    let own_only = Signed::sign(&samples::host(), own_only).unwrap();
    let mut image = samples::lease_request_for(&own_only);
    image.image = ImageDigest([0; 32]);
    let image = sign(image);
    assert_eq!(
        validate::lease_request_matches_offer(&image, &own_only, true),
        Err(RuleError::ImageNotOffered)
    );
    let offer = own_only;
    let mut staging = offer.body().clone();
    staging.terms.max_image_bytes = 1 << 30;
    staging.images = BoundedVec::new(Vec::new()).unwrap();
    let staging = Signed::sign(&samples::host(), staging).unwrap();
    let mut staged = samples::lease_request_for(&staging);
    staged.image = ImageDigest([0; 32]);
    let staged = sign(staged);
    assert_eq!(
        validate::lease_request_matches_offer(&staged, &staging, true),
        Ok(())
    );
    assert_eq!(
        validate::lease_request_matches_offer(&staged, &staging, false),
        Err(RuleError::ImageNotOffered)
    );

    let mut wrong_host = samples::lease_request_for(&offer);
    wrong_host.host = renter.public();
    assert!(matches!(
        validate::lease_request_matches_offer(&sign(wrong_host), &offer, false),
        Err(RuleError::SignerMismatch { .. })
    ));
}

#[test]
fn lease_price_must_not_exceed_the_bid() {
    let (_, offer, _) = chain();
    let renter = samples::renter();
    let mut bid = samples::bid();
    bid.kind = LeaseKind::OnDemand;
    bid.gpus = 1;
    bid.duration_s = 3600;
    let bid = Signed::sign(&renter, bid).unwrap();
    let mut request = samples::lease_request_for(&offer);
    request.bid = Some(bid.id());
    request.price_per_gpu_hour = bid.max_price_per_gpu_hour;
    request.escrow_amount = MicroCredits(10_000_000);
    assert_eq!(
        validate::lease_request_within_bid(&Signed::sign(&renter, request.clone()).unwrap(), &bid),
        Ok(())
    );
    request.price_per_gpu_hour = MicroCredits(bid.max_price_per_gpu_hour.0 + 1);
    assert!(matches!(
        validate::lease_request_within_bid(&Signed::sign(&renter, request).unwrap(), &bid),
        Err(RuleError::PriceAboveBidMax { .. })
    ));
}

#[test]
fn accept_receipt_and_ack_are_bound_to_the_lease() {
    let (_, _, request) = chain();
    let host = samples::host();
    let renter = samples::renter();
    let accept = Signed::sign(&host, gpux_testkit::accept(request.id(), T0)).unwrap();
    assert_eq!(validate::accept_matches_request(&accept, &request), Ok(()));
    let impostor = Signed::sign(&renter, gpux_testkit::accept(request.id(), T0)).unwrap();
    assert!(matches!(
        validate::accept_matches_request(&impostor, &request),
        Err(RuleError::SignerMismatch { .. })
    ));

    let started = request.created_at;
    let receipt = Signed::sign(&host, samples::receipt_for(&request, 1, 60)).unwrap();
    assert_eq!(
        validate::receipt_matches_lease(&receipt, &request, started),
        Ok(())
    );

    let mut pricey = samples::receipt_for(&request, 2, 60);
    pricey.price_per_gpu_hour = MicroCredits(pricey.price_per_gpu_hour.0 * 2);
    pricey.amount_due = money::cost(60, pricey.price_per_gpu_hour).unwrap();
    assert_eq!(
        validate::receipt_matches_lease(&Signed::sign(&host, pricey).unwrap(), &request, started),
        Err(RuleError::ReceiptMismatch {
            field: "price_per_gpu_hour"
        })
    );
    // Billing more GPU-seconds than have elapsed.
    let mut greedy = samples::receipt_for(&request, 3, 120);
    greedy.created_at = started.plus_secs(90);
    assert!(matches!(
        validate::receipt_matches_lease(&Signed::sign(&host, greedy).unwrap(), &request, started),
        Err(RuleError::ReceiptTooHigh {
            gpu_seconds: 120,
            max: 90
        })
    ));

    let ack = Signed::sign(&renter, samples::ack_for(&receipt)).unwrap();
    assert_eq!(
        validate::ack_matches_receipt(&ack, &receipt, renter.public()),
        Ok(())
    );
    let mut short = samples::ack_for(&receipt);
    short.amount_due = MicroCredits(1);
    assert_eq!(
        validate::ack_matches_receipt(
            &Signed::sign(&renter, short).unwrap(),
            &receipt,
            renter.public()
        ),
        Err(RuleError::AckMismatch {
            field: "amount_due"
        })
    );
}

#[test]
fn structural_rules_refuse_inconsistent_messages() {
    let (_, offer, _) = chain();
    let renter = samples::renter();
    let invalid = |r: LeaseRequest| match Signed::sign(&renter, r) {
        Err(SignError::Invalid { source, .. }) => source,
        other => panic!("expected an invalid message, got {other:?}"),
    };
    let mut nvidia = samples::lease_request_for(&offer);
    nvidia.env = BoundedVec::new(vec![EnvVar {
        name: BoundedString::new("NVIDIA_VISIBLE_DEVICES").unwrap(),
        value: BoundedString::new("all").unwrap(),
    }])
    .unwrap();
    assert!(matches!(
        invalid(nvidia),
        InvalidMessage::Malformed {
            field: "env.name",
            ..
        }
    ));

    let mut twice = samples::lease_request_for(&offer);
    twice.gpus = BoundedVec::new(vec![samples::uuid(1), samples::uuid(1)]).unwrap();
    assert!(matches!(
        invalid(twice),
        InvalidMessage::Duplicate { field: "gpus", .. }
    ));

    // An offer listing no image can never be leased.
    let att = Signed::sign(&samples::host(), samples::attestation()).unwrap();
    let mut imageless = samples::offer_for(&att, 9);
    imageless.images = BoundedVec::empty();
    imageless.pulls = Pulls::default();
    assert!(matches!(
        Signed::sign(&samples::host(), imageless),
        Err(SignError::Invalid {
            source: InvalidMessage::Empty { field: "images" },
            ..
        })
    ));

    // ...unless it pulls images from registries,
    let mut pulling = samples::offer_for(&att, 9);
    pulling.images = BoundedVec::empty();
    assert!(Signed::sign(&samples::host(), pulling).is_ok());
    // ...or stages renters' images.
    let mut staging = samples::offer_for(&att, 9);
    staging.pulls = Pulls::default();
    staging.images = BoundedVec::empty();
    staging.terms.max_image_bytes = 1 << 30;
    assert!(Signed::sign(&samples::host(), staging).is_ok());

    // Image tags: valid tags for the listed images, read back with their digests.
    let tags = |lines: &[&[&str]]| {
        BoundedVec::new(
            lines
                .iter()
                .map(|l| {
                    BoundedVec::new(l.iter().map(|t| BoundedString::new(*t).unwrap()).collect())
                        .unwrap()
                })
                .collect(),
        )
        .unwrap()
    };
    let mut tagged = samples::offer_for(&att, 9);
    tagged.terms.image_tags = tags(&[&["pytorch:2.4", "pytorch:latest"]]);
    let image = tagged.images[0];
    let signed = Signed::sign(&samples::host(), tagged.clone()).unwrap();
    assert_eq!(
        signed.image_tags(),
        vec![
            (image, "pytorch:2.4".to_string()),
            (image, "pytorch:latest".to_string())
        ]
    );
    // More tag lists than images, or a tag that is not one, are refused.
    for bad in [tags(&[&["a"], &["b"]]), tags(&[&["py torch*"]])] {
        let mut t = tagged.clone();
        t.terms.image_tags = bad.clone();
        assert!(Signed::sign(&samples::host(), t).is_err(), "{bad:?}");
    }

    let mut broke = samples::lease_request_for(&offer);
    broke.escrow_amount = MicroCredits(1);
    assert!(matches!(
        invalid(broke),
        InvalidMessage::BelowMinimum {
            field: "escrow_amount",
            ..
        }
    ));

    // A receipt whose amount is not the cost of its GPU-seconds cannot be signed.
    let request = Signed::sign(&renter, samples::lease_request_for(&offer)).unwrap();
    let mut receipt = samples::receipt_for(&request, 1, 60);
    receipt.amount_due = MicroCredits(receipt.amount_due.0 + 1);
    assert!(matches!(
        Signed::sign(&samples::host(), receipt),
        Err(SignError::Invalid {
            source: InvalidMessage::Inconsistent {
                field: "amount_due",
                ..
            },
            ..
        })
    ));

    // A reserved window that does not last the duration.
    let mut bid = samples::bid();
    bid.duration_s += 1;
    assert!(matches!(
        Signed::sign(&renter, bid),
        Err(SignError::Invalid {
            source: InvalidMessage::Inconsistent {
                field: "duration_s",
                ..
            },
            ..
        })
    ));
}

/// The sample challenge result, decoded.
fn challenge_result() -> Verified<ChallengeResult> {
    let (_, bytes) = samples::all_signed()
        .into_iter()
        .find(|(k, _)| *k == MessageKind::ChallengeResult)
        .unwrap();
    Signed::<ChallengeResult>::from_bytes(bytes)
        .unwrap()
        .verify()
        .unwrap()
}

fn resign(result: ChallengeResult, by: &Keypair) -> Verified<ChallengeResult> {
    Signed::sign(by, result).unwrap()
}

#[test]
fn a_challenge_result_holds_only_with_the_trusted_ledgers_proof_of_a_paid_lease() {
    let good = challenge_result();
    let ledger = samples::ledger().public();
    assert_eq!(validate::challenge_result_holds(&good, ledger), Ok(()));

    // Another ledger's records: not judged here (no fault of the relay).
    let other = Keypair::from_seed(&[0x99; 32]).public();
    assert!(matches!(
        validate::challenge_result_holds(&good, other),
        Err(RuleError::SignerMismatch {
            what: "the ledger record",
            ..
        })
    ));

    // A host vouching for itself, even with a request of its own.
    let host = samples::host();
    let mut own = good.body().clone();
    let request = Signed::sign(
        &host,
        ChallengeRequest {
            host: host.public(),
            created_at: samples::T0,
            seed: [1; 32],
            m: 64,
            k: 64,
            n: 64,
            fill_lanes: 0,
            fill_blocks: 0,
            gpu: None,
            ext: Ext::new(),
        },
    )
    .unwrap();
    own.request = BoundedBytes::new(request.as_bytes().to_vec()).unwrap();
    assert!(matches!(
        validate::challenge_result_holds(&resign(own, &host), ledger),
        Err(RuleError::Evidence {
            what: "challenger",
            ..
        })
    ));

    // A third party re-signing the renter's evidence: the request is not its own.
    let sybil = Keypair::from_seed(&[0x42; 32]);
    assert!(matches!(
        validate::challenge_result_holds(&resign(good.body().clone(), &sybil), ledger),
        Err(RuleError::SignerMismatch { .. })
    ));

    // The locked record standing in as the payment: not a redemption.
    let mut unpaid = good.body().clone();
    unpaid.paid = unpaid.locked.clone();
    assert!(matches!(
        validate::challenge_result_holds(&resign(unpaid, &samples::renter()), ledger),
        Err(RuleError::Evidence {
            what: "paid record",
            ..
        })
    ));

    // A tampered host answer does not verify.
    let mut forged = good.body().clone();
    let mut response = forged.response.to_vec();
    let last = response.len() - 1;
    response[last] ^= 1;
    forged.response = BoundedBytes::new(response).unwrap();
    assert!(matches!(
        validate::challenge_result_holds(&resign(forged, &samples::renter()), ledger),
        Err(RuleError::Evidence {
            what: "response",
            ..
        })
    ));
}

#[test]
fn a_kept_workspace_is_paid_at_the_offers_price_and_receipts_charge_no_more_than_agreed() {
    let (att, _, _) = chain();
    let mut body = samples::offer_for(&att, 1);
    body.terms.workspace_bytes = 10 << 30;
    body.terms.max_retain_s = Some(3600);
    // 0.10 credits per GiB-hour.
    body.terms.workspace_price = MicroCredits(100_000);
    let offer = Signed::sign(&samples::host(), body).unwrap();
    assert_eq!(offer.workspace_price(), MicroCredits(100_000));
    let renter = samples::renter();
    let asking = |price: Option<u64>, retain: Option<u64>| {
        let mut r = samples::lease_request_for(&offer);
        r.terms.workspace_bytes = Some(4 << 30);
        r.terms.retain_s = retain;
        r.terms.workspace_price = MicroCredits(price.unwrap_or(0));
        r
    };
    // 4 GiB for half an hour at 0.10: 0.20 credits, owed whatever the work does.
    let request = Signed::sign(&renter, asking(Some(100_000), Some(1800))).unwrap();
    assert_eq!(request.retention_charge(), Ok(MicroCredits(200_000)));
    assert_eq!(
        validate::lease_request_matches_offer(&request, &offer, false),
        Ok(())
    );
    let sign = |r: LeaseRequest| Signed::sign(&renter, r).unwrap();
    assert_eq!(
        validate::lease_request_matches_offer(
            &sign(asking(Some(99_999), Some(1800))),
            &offer,
            false
        ),
        Err(RuleError::WorkspacePriceBelowOffer {
            price: MicroCredits(99_999),
            min: MicroCredits(100_000)
        })
    );
    assert_eq!(
        validate::lease_request_matches_offer(&sign(asking(None, Some(1800))), &offer, false),
        Err(RuleError::WorkspacePriceBelowOffer {
            price: MicroCredits::ZERO,
            min: MicroCredits(100_000)
        })
    );
    assert_eq!(
        validate::lease_request_matches_offer(
            &sign(asking(Some(100_000), Some(3601))),
            &offer,
            false
        ),
        Err(RuleError::RetentionAboveOffer {
            retain_s: 3601,
            max_s: 3600
        })
    );
    // Without a term the retention is the default 10 minutes, priced as such.
    let default = sign(asking(Some(100_000), None));
    assert_eq!(default.retention_s(), Ok(DEFAULT_RETAIN_S));
    assert_eq!(
        default.retention_charge(),
        Ok(money::storage_cost(4 << 30, DEFAULT_RETAIN_S, MicroCredits(100_000)).unwrap())
    );
    // The escrow holds the minute's minimum and the retention.
    let mut short = asking(Some(100_000), Some(1800));
    short.escrow_amount = money::cost(60, short.price_per_gpu_hour)
        .unwrap()
        .checked_add(MicroCredits(199_999))
        .unwrap();
    assert!(matches!(
        short.check(),
        Err(InvalidMessage::BelowMinimum {
            field: "escrow_amount",
            ..
        })
    ));

    // Receipts carry the sum in their amount, and at most the agreed one.
    let host = samples::host();
    let started = request.created_at;
    let charging = |charge: u64| {
        let mut r = samples::receipt_for(&request, 1, 60);
        r.workspace_charge = MicroCredits(charge);
        r.amount_due = r.amount_due.checked_add(MicroCredits(charge)).unwrap();
        r
    };
    let fair = Signed::sign(&host, charging(200_000)).unwrap();
    assert_eq!(fair.workspace_charge, MicroCredits(200_000));
    assert_eq!(
        validate::receipt_matches_lease(&fair, &request, started),
        Ok(())
    );
    assert_eq!(
        validate::receipt_matches_lease(
            &Signed::sign(&host, charging(200_001)).unwrap(),
            &request,
            started
        ),
        Err(RuleError::ReceiptMismatch {
            field: "workspace_charge"
        })
    );
    // A charge the amount leaves out does not add up.
    let mut unsummed = charging(200_000);
    unsummed.amount_due = money::cost(60, request.price_per_gpu_hour).unwrap();
    assert!(matches!(
        unsummed.check(),
        Err(InvalidMessage::Inconsistent {
            field: "amount_due",
            ..
        })
    ));
    // A lease without a kept workspace pays none.
    let (_, _, plain) = chain();
    let mut r = samples::receipt_for(&plain, 1, 60);
    r.workspace_charge = MicroCredits(1);
    r.amount_due = r.amount_due.checked_add(MicroCredits(1)).unwrap();
    assert_eq!(
        validate::receipt_matches_lease(&Signed::sign(&host, r).unwrap(), &plain, plain.created_at),
        Err(RuleError::ReceiptMismatch {
            field: "workspace_charge"
        })
    );
}

#[test]
fn an_offer_s_machine_shares_fit_the_machine_and_a_lease_asks_no_more_than_its_share() {
    let att = Signed::sign(&samples::host(), samples::attestation()).unwrap();
    let host = samples::host();
    let invalid = |o: Offer| match Signed::sign(&host, o) {
        Err(SignError::Invalid { source, .. }) => source,
        other => panic!("expected an invalid offer, got {other:?}"),
    };
    // Two GPUs at 26 of 52 threads each fit; 27 each would be 54 threads of 52.
    let mut greedy = samples::offer_for(&att, 9);
    greedy.machine.share.cpu_millis = 27_000;
    assert!(matches!(
        invalid(greedy),
        InvalidMessage::AboveLimit {
            field: "machine.share.cpu_millis",
            ..
        }
    ));
    let mut hungry = samples::offer_for(&att, 9);
    hungry.machine.share.memory_bytes = 241 << 30;
    assert!(matches!(
        invalid(hungry),
        InvalidMessage::AboveLimit {
            field: "machine.share.memory_bytes",
            ..
        }
    ));
    let mut nothing = samples::offer_for(&att, 9);
    nothing.machine.share.cpu_millis = 0;
    assert!(matches!(
        invalid(nothing),
        InvalidMessage::Zero {
            field: "machine.share.cpu_millis"
        }
    ));
    // A model name is shown to renters: no terminal escapes.
    let mut escape = samples::offer_for(&att, 9);
    escape.machine.cpu_model = BoundedString::new("Xeon\u{1b}[2J").unwrap();
    assert!(matches!(
        invalid(escape),
        InvalidMessage::Malformed {
            field: "machine.cpu_model",
            ..
        }
    ));
    // split_evenly shares a machine over its GPUs.
    let split = Machine::split_evenly("EPYC 9654", 32, 256 << 30, 8);
    assert_eq!(split.share.cpu_millis, 4_000);
    assert_eq!(split.share.memory_bytes, 32 << 30);

    // A lease gets at most its GPUs' share: the sample asks 4 cores and 8 GiB of one GPU's
    // 26 cores and 240 GiB.
    let offer = Signed::sign(&host, samples::offer_for(&att, 1)).unwrap();
    let renter = samples::renter();
    let sign = |r: LeaseRequest| Signed::sign(&renter, r).unwrap();
    let mut all = samples::lease_request_for(&offer);
    all.limits = ResourceLimits::sized(26_000, 240 << 30);
    assert_eq!(
        validate::lease_request_matches_offer(&sign(all.clone()), &offer, false),
        Ok(())
    );
    all.limits.cpu_millis = 26_001;
    let refused = validate::lease_request_matches_offer(&sign(all.clone()), &offer, false);
    assert!(
        matches!(
            refused,
            Err(RuleError::LimitsAboveShare { what: "CPU", .. })
        ),
        "{refused:?}"
    );
    all.limits = ResourceLimits::sized(1_000, (240 << 30) + 1);
    assert!(matches!(
        validate::lease_request_matches_offer(&sign(all), &offer, false),
        Err(RuleError::LimitsAboveShare { what: "memory", .. })
    ));
}

#[test]
fn a_lease_s_tmpfs_sizes_stay_within_its_memory() {
    let att = Signed::sign(&samples::host(), samples::attestation()).unwrap();
    let offer = Signed::sign(&samples::host(), samples::offer_for(&att, 1)).unwrap();
    let sized = ResourceLimits::sized(8_000, 64 << 30);
    assert_eq!(sized.shm_bytes, 32 << 30);
    assert_eq!(sized.scratch_bytes, 16 << 30);
    assert_eq!(sized.pids, 8 * 1024);
    assert_eq!(ResourceLimits::sized(500, 1 << 30).pids, 1024);
    let mut big_shm = samples::lease_request_for(&offer);
    big_shm.limits.shm_bytes = big_shm.limits.memory_bytes + 1;
    assert!(matches!(
        Signed::sign(&samples::renter(), big_shm),
        Err(SignError::Invalid {
            source: InvalidMessage::AboveLimit {
                field: "limits.shm_bytes",
                ..
            },
            ..
        })
    ));
}

#[test]
fn a_pull_policy_names_registries_and_lists_its_cache_only_when_it_pulls() {
    let att = Signed::sign(&samples::host(), samples::attestation()).unwrap();
    let pulls = samples::pulls();
    assert!(pulls.allows("docker.io") && pulls.allows("GHCR.IO") && pulls.allows("nvcr.io"));
    assert!(!pulls.allows("quay.io"), "only the registries it names");
    assert!(!pulls.allows("registry.evil.example"));
    let with = |names: &[&str]| Pulls {
        registries: BoundedVec::new(
            names
                .iter()
                .map(|n| BoundedString::new(*n).unwrap())
                .collect(),
        )
        .unwrap(),
        ..pulls.clone()
    };
    // Refusals only: anything else is allowed.
    let open = with(&["!registry.evil.example"]);
    assert!(!open.allows("registry.evil.example"));
    assert!(open.allows("quay.io") && open.allows("127.0.0.1:5000"));
    // A domain's hosts, on any port.
    let internal = with(&["*.internal"]);
    assert!(internal.allows("cache.internal:5000") && !internal.allows("quay.io"));
    assert!(
        !Pulls::default().allows("docker.io"),
        "a host that pulls nothing"
    );

    let invalid = |pulls: Pulls| {
        let mut offer = samples::offer_for(&att, 9);
        offer.pulls = pulls;
        match Signed::sign(&samples::host(), offer) {
            Err(SignError::Invalid { source, .. }) => source,
            other => panic!("expected an invalid offer, got {other:?}"),
        }
    };
    let cache_without_pulls = Pulls {
        max_bytes: 0,
        ..pulls.clone()
    };
    assert!(matches!(
        invalid(cache_without_pulls),
        InvalidMessage::Inconsistent { field: "pulls", .. }
    ));
    let mut upper = pulls.clone();
    upper.registries = BoundedVec::new(vec![BoundedString::new("Docker.IO").unwrap()]).unwrap();
    assert!(matches!(
        invalid(upper),
        InvalidMessage::Malformed {
            field: "pulls.registries",
            ..
        }
    ));
    let mut twice = pulls.clone();
    twice.cached = BoundedVec::new(vec![
        BoundedString::new("ubuntu:24.04").unwrap(),
        BoundedString::new("ubuntu:24.04").unwrap(),
    ])
    .unwrap();
    assert!(matches!(
        invalid(twice),
        InvalidMessage::Duplicate {
            field: "pulls.cached",
            ..
        }
    ));
    let mut odd = pulls;
    odd.cached = BoundedVec::new(vec![BoundedString::new("a b").unwrap()]).unwrap();
    assert!(matches!(
        invalid(odd),
        InvalidMessage::Malformed {
            field: "pulls.cached",
            ..
        }
    ));
}

#[test]
fn prices_durations_and_lease_values_beyond_the_protocol_s_bounds_are_invalid() {
    let att = Signed::sign(&samples::host(), samples::attestation()).unwrap();
    let host = samples::host();
    fn above<T: std::fmt::Debug>(signed: Result<T, SignError>) -> &'static str {
        match signed {
            Err(SignError::Invalid {
                source: InvalidMessage::AboveLimit { field, .. },
                ..
            }) => field,
            other => panic!("expected a bound, got {other:?}"),
        }
    }
    // 20,000 credits per GPU-hour: twice the bound.
    let mut dear = samples::offer_for(&att, 9);
    dear.price_per_gpu_hour = MicroCredits::from_credits(20_000).unwrap();
    assert_eq!(above(Signed::sign(&host, dear)), "price_per_gpu_hour");
    let mut at_bound = samples::offer_for(&att, 9);
    at_bound.price_per_gpu_hour = gpux_protocol::MAX_PRICE_PER_GPU_HOUR;
    Signed::sign(&host, at_bound).unwrap();
    let mut endless = samples::offer_for(&att, 9);
    endless.min_duration_s = u32::MAX - 1;
    endless.max_duration_s = u32::MAX - 1;
    assert_eq!(above(Signed::sign(&host, endless)), "max_duration_s");

    let offer = Signed::sign(&host, samples::offer_for(&att, 9)).unwrap();
    let mut request = samples::lease_request_for(&offer);
    request.price_per_gpu_hour = MicroCredits(u64::MAX);
    assert_eq!(
        above(Signed::sign(&samples::renter(), request)),
        "price_per_gpu_hour"
    );
    let mut long = samples::lease_request_for(&offer);
    long.duration_s = gpux_protocol::MAX_DURATION_S + 1;
    assert_eq!(above(Signed::sign(&samples::renter(), long)), "duration_s");

    // Each bound alone holds, but 64 GPUs at 10,000 credits for a year are worth too much.
    let mut bid = samples::bid();
    bid.gpus = 64;
    bid.max_price_per_gpu_hour = gpux_protocol::MAX_PRICE_PER_GPU_HOUR;
    bid.duration_s = 365 * 24 * 3600;
    assert_eq!(
        above(Signed::sign(&samples::renter(), bid)),
        "value (gpus x price x duration)"
    );
    let mut fair = samples::bid();
    fair.kind = LeaseKind::OnDemand;
    fair.gpus = 8;
    fair.max_price_per_gpu_hour = MicroCredits::from_credits(1_000).unwrap();
    fair.duration_s = 365 * 24 * 3600;
    Signed::sign(&samples::renter(), fair).unwrap();
}
