//! Validation throughput of signed offers: the whole path (framing, decode, canonical check,
//! structural checks, blake3 id, `verify_strict`, time and sequence rules) against raw
//! ed25519 `verify_strict` of the same bytes, and batch against single verification, all
//! measured in the same run.
//!
//! `cargo bench -p gpux-protocol --bench verify -- [--json] [--rounds N] [--batch N] [--hosts N]`
//!
//! By default every offer has its own host key (the worst case for the batch path, which
//! parses each distinct key once per batch).
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use ed25519_dalek::{Signature, VerifyingKey};
use gpux_protocol::validate::{Rules, SeqTracker};
use gpux_protocol::*;

const OFFERS: usize = 2048;
const T0: Timestamp = Timestamp(1_764_460_800_000);

fn make_offers(hosts: usize) -> Vec<Vec<u8>> {
    let mib = 1u64 << 20;
    let mut out = Vec::with_capacity(OFFERS);
    for i in 0..OFFERS {
        let h = (i % hosts) as u64 + 1;
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&h.to_le_bytes());
        let host = Keypair::from_seed(&seed);
        let gpus = (0..8u8)
            .map(|g| OfferGpu {
                uuid: GpuUuid::Gpu([g ^ (i as u8); 16]),
                family: BoundedString::new("h100").unwrap(),
                memory_bytes: 81_559 * mib,
                compute_capability: ComputeCapability::new(9, 0),
                pcie_gen: 5,
            })
            .collect();
        let offer = Offer {
            seq: i as u64 + 1,
            slot: 0,
            created_at: T0,
            expires_at: T0.plus_secs(600),
            attestation: ContentId([i as u8; 32]),
            gpus: BoundedVec::new(gpus).unwrap(),
            price_per_gpu_hour: MicroCredits(2_100_000 + i as u64),
            spot_floor_per_gpu_hour: Some(MicroCredits(900_000)),
            min_duration_s: 60,
            max_duration_s: 86_400,
            region: BoundedString::new("eu-west").unwrap(),
            tier: EvidenceTier::SelfReported,
            driver: Version::new(550, 54, 15),
            cuda: Version::new(12, 4, 0),
            images: BoundedVec::new(vec![ImageDigest([0xd1; 32])]).unwrap(),
            machine: gpux_protocol::Machine::split_evenly("test CPU", 16, 64 << 30, 16),
            pulls: gpux_protocol::Pulls::default(),
            terms: gpux_protocol::OfferTerms::default(),
            ext: Ext::new(),
        };
        out.push(Signed::sign(&host, offer).unwrap().as_bytes().to_vec());
    }
    out
}

fn raw_verify(offers: &[Vec<u8>], preparsed: Option<&[VerifyingKey]>) -> usize {
    let mut ok = 0;
    for (i, bytes) in offers.iter().enumerate() {
        let split = bytes.len() - SIGNATURE_LEN;
        let key = match preparsed {
            Some(keys) => keys[i],
            None => VerifyingKey::from_bytes(bytes[6..38].try_into().unwrap()).unwrap(),
        };
        let sig = Signature::from_bytes(bytes[split..].try_into().unwrap());
        ok += usize::from(key.verify_strict(&bytes[..split], &sig).is_ok());
    }
    ok
}

fn full_validation(owned: Vec<Vec<u8>>, rules: &Rules) -> usize {
    let mut seqs: SeqTracker<(PublicKey, u16)> = SeqTracker::new();
    let now = T0.plus_secs(1);
    let mut ok = 0;
    for bytes in owned {
        let Ok(verified) = Signed::<Offer>::from_bytes(bytes).and_then(Signed::verify) else {
            continue;
        };
        if rules.check_time(&verified, now).is_ok()
            && seqs
                .observe((verified.signer(), verified.slot), verified.seq)
                .is_ok()
        {
            ok += 1;
        }
    }
    ok
}

fn batch_validation(owned: Vec<Vec<u8>>, rules: &Rules, batch: usize) -> usize {
    let mut seqs: SeqTracker<(PublicKey, u16)> = SeqTracker::new();
    let now = T0.plus_secs(1);
    let mut ok = 0;
    let mut iter = owned.into_iter().peekable();
    while iter.peek().is_some() {
        let chunk: Vec<Signed<Offer>> = iter
            .by_ref()
            .take(batch)
            .filter_map(|b| Signed::<Offer>::from_bytes(b).ok())
            .collect();
        for verified in verify_batch(chunk).into_iter().flatten() {
            if rules.check_time(&verified, now).is_ok()
                && seqs
                    .observe((verified.signer(), verified.slot), verified.seq)
                    .is_ok()
            {
                ok += 1;
            }
        }
    }
    ok
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(11);
    let batch_size: usize = args
        .iter()
        .position(|a| a == "--batch")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(256);
    let hosts: usize = args
        .iter()
        .position(|a| a == "--hosts")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(OFFERS);
    let offers = make_offers(hosts);
    let keys: Vec<VerifyingKey> = offers
        .iter()
        .map(|b| VerifyingKey::from_bytes(b[6..38].try_into().unwrap()).unwrap())
        .collect();
    let rules = Rules::default();
    let (mut raw, mut raw_pre, mut full, mut batch) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        // Interleaved, so drift on a noisy machine hits every measurement alike.
        let t = Instant::now();
        assert_eq!(raw_verify(&offers, None), OFFERS);
        raw.push(rate(OFFERS, t.elapsed()));

        let t = Instant::now();
        assert_eq!(raw_verify(&offers, Some(&keys)), OFFERS);
        raw_pre.push(rate(OFFERS, t.elapsed()));

        let owned = offers.clone();
        let t = Instant::now();
        assert_eq!(full_validation(owned, &rules), OFFERS);
        full.push(rate(OFFERS, t.elapsed()));

        let owned = offers.clone();
        let t = Instant::now();
        assert_eq!(batch_validation(owned, &rules, batch_size), OFFERS);
        batch.push(rate(OFFERS, t.elapsed()));
    }
    let (raw, raw_pre, full, batch) = (median(raw), median(raw_pre), median(full), median(batch));
    let offer_bytes = offers[0].len();
    if json {
        println!(
            "{{\"offers\":{OFFERS},\"offer_bytes\":{offer_bytes},\"rounds\":{rounds},\"batch_size\":{batch_size},\"hosts\":{hosts},\"raw_verify_strict_per_s\":{raw:.0},\"raw_verify_strict_preparsed_key_per_s\":{raw_pre:.0},\"full_validation_per_s\":{full:.0},\"batch_validation_per_s\":{batch:.0},\"full_vs_raw\":{:.3},\"batch_vs_single\":{:.3}}}",
            full / raw,
            batch / full
        );
    } else {
        println!(
            "signed offers: {OFFERS} of {offer_bytes} bytes, {hosts} hosts, batches of {batch_size}; medians of {rounds} rounds"
        );
        println!("raw verify_strict (key parsed from the bytes): {raw:>10.0} /s");
        println!("raw verify_strict (key pre-parsed):            {raw_pre:>10.0} /s");
        println!(
            "full validation, one by one:                   {full:>10.0} /s  ({:.3} of raw; goal >= 0.8)",
            full / raw
        );
        println!(
            "full validation, batched:                      {batch:>10.0} /s  ({:.2}x single; goal >= 2)",
            batch / full
        );
    }
}
