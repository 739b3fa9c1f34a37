//! Gossip validation verdicts, without the network.

use gpux_node::p2p::topics;
use gpux_node::validation::{RATE_LIMIT_MESSAGES, Validator, Verdict};
use gpux_protocol::validate::Rules;
use gpux_protocol::*;
use gpux_testkit as kit;

const T0: Timestamp = Timestamp(1_764_460_800_000);

fn attestation(host: &Keypair, name: &str, memory: u64, cc: (u8, u8)) -> Verified<Attestation> {
    let gpu = GpuFacts {
        uuid: GpuUuid::Gpu([3; 16]),
        ..kit::gpu_facts(0, name, memory, cc)
    };
    kit::sign(host, kit::attestation(T0, [gpu]))
}

fn offer(
    host: &Keypair,
    att: &Verified<Attestation>,
    seq: u64,
    created: Timestamp,
) -> Verified<Offer> {
    let g = &att.gpus[0];
    let gpu = OfferGpu {
        pcie_gen: 0,
        ..kit::offer_gpu(
            g.uuid,
            GpuFamily::classify(&g.name).key(),
            g.memory_total_bytes,
            (g.compute_capability.major, g.compute_capability.minor),
        )
    };
    kit::sign(
        host,
        Offer {
            seq,
            attestation: att.id(),
            price_per_gpu_hour: MicroCredits(1_000_000),
            min_duration_s: 60,
            max_duration_s: 3600,
            driver: Version::new(550, 0, 0),
            cuda: Version::new(12, 4, 0),
            images: kit::list([ImageDigest([1; 32])]),
            ..kit::offer(created, [gpu])
        },
    )
}

/// The attestation topic the tests' attestations travel on (the validator takes any family's).
fn attestations() -> String {
    topics::attestations("h100").to_string()
}

fn h100() -> String {
    topics::offers("h100").to_string()
}

fn label(v: &Verdict) -> &'static str {
    match v {
        Verdict::Accept(_) => "accept",
        Verdict::Reject(_) => "reject",
        Verdict::Ignore(_) => "ignore",
    }
}

#[test]
fn every_verdict_has_its_cause() {
    let host = Keypair::from_seed(&[1; 32]);
    let mut v = Validator::new(Rules::default());
    let att = attestation(&host, "NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0));
    let o1 = offer(&host, &att, 1, T0);
    // Garbage, and a valid message on the wrong topic: the sender is at fault.
    assert_eq!(label(&v.validate(&h100(), vec![1, 2, 3], T0)), "reject");
    assert_eq!(
        label(&v.validate(topics::BIDS, o1.as_bytes().to_vec(), T0)),
        "reject"
    );
    assert_eq!(
        label(&v.validate(
            &topics::offers("a100").to_string(),
            o1.as_bytes().to_vec(),
            T0
        )),
        "reject"
    );
    // An offer whose attestation is unknown yet: ignored, not penalised.
    assert_eq!(
        label(&v.validate(&h100(), o1.as_bytes().to_vec(), T0)),
        "ignore"
    );
    // An attestation on another family's topic is spam there.
    assert_eq!(
        label(&v.validate(
            &topics::attestations("a100").to_string(),
            att.as_bytes().to_vec(),
            T0
        )),
        "reject"
    );
    assert_eq!(
        label(&v.validate(&attestations(), att.as_bytes().to_vec(), T0)),
        "accept"
    );
    assert_eq!(
        label(&v.validate(&attestations(), att.as_bytes().to_vec(), T0)),
        "ignore"
    );
    assert_eq!(
        label(&v.validate(&h100(), o1.as_bytes().to_vec(), T0)),
        "accept"
    );
    // Replayed and expired offers are ignored.
    assert_eq!(
        label(&v.validate(&h100(), o1.as_bytes().to_vec(), T0)),
        "ignore"
    );
    let old = offer(&host, &att, 2, Timestamp(T0.0 - 700_000));
    assert_eq!(
        label(&v.validate(&h100(), old.as_bytes().to_vec(), T0)),
        "ignore"
    );
    // A tampered offer is rejected.
    let mut tampered = offer(&host, &att, 3, T0).as_bytes().to_vec();
    tampered[50] ^= 1;
    assert_eq!(label(&v.validate(&h100(), tampered, T0)), "reject");
}

#[test]
fn a_disguised_gpu_and_an_offer_contradicting_its_attestation_are_rejected() {
    let host = Keypair::from_seed(&[2; 32]);
    let mut v = Validator::new(Rules::default());
    let disguised = attestation(&host, "NVIDIA A100-SXM4-80GB", 48_305_799_168, (8, 6));
    assert_eq!(
        label(&v.validate(&attestations(), disguised.as_bytes().to_vec(), T0)),
        "reject"
    );
    let att = attestation(&host, "NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0));
    assert_eq!(
        label(&v.validate(&attestations(), att.as_bytes().to_vec(), T0)),
        "accept"
    );
    let mut lying = offer(&host, &att, 1, T0).body().clone();
    let mut gpus = lying.gpus.to_vec();
    gpus[0].memory_bytes *= 2;
    lying.gpus = BoundedVec::new(gpus).unwrap();
    let lying = Signed::sign(&host, lying).unwrap();
    assert_eq!(
        label(&v.validate(&h100(), lying.as_bytes().to_vec(), T0)),
        "reject"
    );
}

#[test]
fn each_signer_is_rate_limited() {
    let host = Keypair::from_seed(&[3; 32]);
    let mut v = Validator::new(Rules::default());
    let att = attestation(&host, "NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0));
    assert_eq!(
        label(&v.validate(&attestations(), att.as_bytes().to_vec(), T0)),
        "accept"
    );
    let mut accepted = 1;
    for seq in 1..=40 {
        if let Verdict::Accept(_) =
            v.validate(&h100(), offer(&host, &att, seq, T0).as_bytes().to_vec(), T0)
        {
            accepted += 1;
        }
    }
    assert_eq!(accepted, RATE_LIMIT_MESSAGES);
    // The next window admits the host again.
    let later = T0.plus_secs(11);
    assert_eq!(
        label(&v.validate(
            &h100(),
            offer(&host, &att, 100, later).as_bytes().to_vec(),
            later
        )),
        "accept"
    );
}

/// An offer of `host` claiming `tier`.
fn claiming(
    host: &Keypair,
    att: &Verified<Attestation>,
    seq: u64,
    tier: EvidenceTier,
) -> Verified<Offer> {
    let mut body = offer(host, att, seq, T0).body().clone();
    body.tier = tier;
    Signed::sign(host, body).unwrap()
}

/// A passed challenge of `host` by `challenger`, with `ledger`'s records of a paid lease.
fn challenge_result(
    host: &Keypair,
    att: &Verified<Attestation>,
    challenger: &Keypair,
    ledger: &Keypair,
) -> Verified<ChallengeResult> {
    let request = Signed::sign(
        challenger,
        ChallengeRequest {
            host: host.public(),
            created_at: T0,
            seed: [9; 32],
            m: 64,
            k: 64,
            n: 64,
            fill_lanes: 0,
            fill_blocks: 0,
            gpu: Some(att.gpus[0].uuid),
            ext: Ext::new(),
        },
    )
    .unwrap();
    let response = Signed::sign(
        host,
        ChallengeResponse {
            request: request.id(),
            created_at: T0,
            rows_root: ContentId([1; 32]),
            fill_root: None,
            elapsed_ns: 1_000,
            ext: Ext::new(),
        },
    )
    .unwrap();
    let record = |seq, entry| {
        Signed::sign(
            ledger,
            LedgerRecord {
                seq,
                created_at: T0,
                op: ContentId([seq as u8; 32]),
                escrow: EscrowId([7; 16]),
                entry,
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes()
        .to_vec()
    };
    let locked = record(
        1,
        LedgerEntry::Locked {
            payer: challenger.public(),
            payee: host.public(),
            amount: MicroCredits(100_000),
        },
    );
    let paid = record(
        2,
        LedgerEntry::Redeemed {
            payee: host.public(),
            amount: MicroCredits(60_000),
            cumulative: MicroCredits(60_000),
            receipt_seq: 1,
        },
    );
    Signed::sign(
        challenger,
        ChallengeResult {
            host: host.public(),
            attestation: att.id(),
            request: BoundedBytes::new(request.as_bytes().to_vec()).unwrap(),
            response: BoundedBytes::new(response.as_bytes().to_vec()).unwrap(),
            verdict: ChallengeVerdict::Passed {
                speed_permille: 990,
            },
            locked: BoundedBytes::new(locked).unwrap(),
            paid: BoundedBytes::new(paid).unwrap(),
            created_at: T0,
            ext: Ext::new(),
        },
    )
    .unwrap()
}

#[test]
fn a_tier_is_what_the_evidence_held_supports_never_what_the_offer_claims() {
    let host = Keypair::from_seed(&[1; 32]);
    let renter = Keypair::from_seed(&[2; 32]);
    let ledger = Keypair::from_seed(&[3; 32]);
    let att = attestation(&host, "NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0));
    let mut v = Validator::new(Rules::default()).with_ledger([ledger.public()]);
    let at = |v: &mut Validator, topic: &str, bytes: &[u8]| {
        label(&v.validate(topic, bytes.to_vec(), T0))
    };
    assert_eq!(at(&mut v, &attestations(), att.as_bytes()), "accept");

    // cc-attested without evidence: provably false, the relay is at fault.
    let cc = claiming(&host, &att, 1, EvidenceTier::CcAttested);
    assert_eq!(at(&mut v, &h100(), cc.as_bytes()), "reject");
    // challenged before any result was seen: not in the book, no fault (it may be coming).
    let ch = claiming(&host, &att, 2, EvidenceTier::Challenged);
    assert_eq!(at(&mut v, &h100(), ch.as_bytes()), "ignore");

    // The host's own Sybil renter vouching with another ledger's records: not judged here.
    let fake_ledger = Keypair::from_seed(&[4; 32]);
    let sybil = challenge_result(&host, &att, &renter, &fake_ledger);
    assert_eq!(at(&mut v, topics::CHALLENGES, sybil.as_bytes()), "ignore");
    assert_eq!(at(&mut v, &h100(), ch.as_bytes()), "ignore");
    // The host challenging itself with the trusted ledger's records of paying itself.
    let selfie = challenge_result(&host, &att, &host, &ledger);
    assert_eq!(at(&mut v, topics::CHALLENGES, selfie.as_bytes()), "reject");
    let device = att.gpus[0].uuid;
    assert_eq!(
        v.evidence_tier(host.public(), [device], T0),
        EvidenceTier::SelfReported
    );

    // A real challenger's passed result with the trusted ledger's records: challenged.
    let real = challenge_result(&host, &att, &renter, &ledger);
    assert_eq!(at(&mut v, topics::CHALLENGES, real.as_bytes()), "accept");
    assert_eq!(
        v.evidence_tier(host.public(), [device], T0),
        EvidenceTier::Challenged
    );
    assert_eq!(
        v.challenged_devices(host.public(), T0)
            .into_iter()
            .collect::<Vec<_>>(),
        vec![device]
    );
    assert_eq!(at(&mut v, &h100(), ch.as_bytes()), "accept");
    // Still never cc-attested.
    let cc = claiming(&host, &att, 3, EvidenceTier::CcAttested);
    assert_eq!(at(&mut v, &h100(), cc.as_bytes()), "reject");
    // The result binds the device challenged: the host's other GPUs are not covered (nor
    // another host's), nor is it after 30 days. The same GPU attested again is.
    assert_eq!(
        v.evidence_tier(host.public(), [GpuUuid::Gpu([8; 16])], T0),
        EvidenceTier::SelfReported
    );
    assert_eq!(
        v.evidence_tier(renter.public(), [device], T0),
        EvidenceTier::SelfReported
    );
    let later = T0.plus_secs(31 * 24 * 3600);
    assert_eq!(
        v.evidence_tier(host.public(), [device], later),
        EvidenceTier::SelfReported
    );
    let again = {
        let mut body = att.body().clone();
        body.created_at = T0.plus_secs(60);
        Signed::sign(&host, body).unwrap()
    };
    assert_ne!(again.id(), att.id());
    let mut body = claiming(&host, &att, 4, EvidenceTier::Challenged)
        .body()
        .clone();
    body.attestation = again.id();
    body.created_at = T0.plus_secs(60);
    body.expires_at = T0.plus_secs(600);
    let anew = Signed::sign(&host, body).unwrap();
    assert_eq!(
        label(&v.validate(&attestations(), again.as_bytes().to_vec(), T0.plus_secs(60))),
        "accept"
    );
    assert_eq!(
        label(&v.validate(&h100(), anew.as_bytes().to_vec(), T0.plus_secs(60))),
        "accept"
    );
}
