//! Gossip validation verdicts, without the network.

use gpux_node::p2p::topics;
use gpux_node::validation::{RATE_LIMIT_MESSAGES, Validator, Verdict};
use gpux_protocol::validate::Rules;
use gpux_protocol::*;

const T0: Timestamp = Timestamp(1_764_460_800_000);

fn attestation(host: &Keypair, name: &str, memory: u64, cc: (u8, u8)) -> Verified<Attestation> {
    let gpu = GpuFacts {
        index: 0,
        name: BoundedString::new(name).unwrap(),
        uuid: GpuUuid([3; 16]),
        serial: None,
        board_part_number: None,
        memory_total_bytes: memory,
        compute_capability: ComputeCapability::new(cc.0, cc.1),
        pcie: PcieFacts::default(),
        power_limit_mw: None,
        max_sm_clock_mhz: None,
        max_memory_clock_mhz: None,
        ecc: None,
        mig: None,
        confidential_compute: None,
    };
    let body = Attestation {
        created_at: T0,
        driver_version: BoundedString::new("550").unwrap(),
        cuda_driver_version: None,
        nvml_version: BoundedString::new("12").unwrap(),
        gpus: BoundedVec::new(vec![gpu]).unwrap(),
        ext: Ext::new(),
    };
    Signed::sign(host, body).unwrap()
}

fn offer(
    host: &Keypair,
    att: &Verified<Attestation>,
    seq: u64,
    created: Timestamp,
) -> Verified<Offer> {
    let g = &att.gpus[0];
    Signed::sign(
        host,
        Offer {
            seq,
            slot: 0,
            created_at: created,
            expires_at: created.plus_secs(600),
            attestation: att.id(),
            gpus: BoundedVec::new(vec![OfferGpu {
                uuid: g.uuid,
                family: BoundedString::new(GpuFamily::classify(&g.name).key()).unwrap(),
                memory_bytes: g.memory_total_bytes,
                compute_capability: g.compute_capability,
                pcie_gen: 0,
            }])
            .unwrap(),
            price_per_gpu_hour: MicroCredits(1_000_000),
            spot_floor_per_gpu_hour: None,
            min_duration_s: 60,
            max_duration_s: 3600,
            region: BoundedString::new("eu").unwrap(),
            tier: EvidenceTier::SelfReported,
            driver: Version::new(550, 0, 0),
            cuda: Version::new(12, 4, 0),
            images: BoundedVec::new(vec![ImageDigest([1; 32])]).unwrap(),
            ext: Ext::new(),
        },
    )
    .unwrap()
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
    assert_eq!(
        label(&v.validate(topics::ATTESTATIONS, att.as_bytes().to_vec(), T0)),
        "accept"
    );
    assert_eq!(
        label(&v.validate(topics::ATTESTATIONS, att.as_bytes().to_vec(), T0)),
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
        label(&v.validate(topics::ATTESTATIONS, disguised.as_bytes().to_vec(), T0)),
        "reject"
    );
    let att = attestation(&host, "NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0));
    assert_eq!(
        label(&v.validate(topics::ATTESTATIONS, att.as_bytes().to_vec(), T0)),
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
        label(&v.validate(topics::ATTESTATIONS, att.as_bytes().to_vec(), T0)),
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
