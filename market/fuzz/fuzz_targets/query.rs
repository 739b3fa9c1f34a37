#![no_main]
//! Any text as a query: parsing must never panic, and whatever parses is run against a small
//! book (search in its own order, and matching) without panicking.

use std::sync::OnceLock;

use gpux_market::query::Query;
use gpux_market::{BidSpec, BookConfig, OrderBook};
use gpux_protocol::*;

fn book() -> &'static OrderBook {
    static BOOK: OnceLock<OrderBook> = OnceLock::new();
    BOOK.get_or_init(|| {
        let mut book = OrderBook::new(BookConfig::default());
        let now = Timestamp(1_000_000);
        for (i, (family, gb, region)) in
            [("h100", 80u64, "eu-west"), ("a100", 40, "us-east"), ("rtx4090", 24, "eu"), ("l4", 24, "asia-south")]
                .into_iter()
                .enumerate()
        {
            let key = Keypair::from_seed(&[i as u8 + 1; 32]);
            let offer = Offer {
                seq: 1,
                slot: 0,
                created_at: now,
                expires_at: now.plus_secs(600),
                attestation: ContentId([0; 32]),
                gpus: BoundedVec::new(
                    (0..4u8)
                        .map(|g| OfferGpu {
                            uuid: GpuUuid::Gpu([g + 16 * i as u8; 16]),
                            family: BoundedString::new(family).unwrap(),
                            memory_bytes: gb << 30,
                            compute_capability: ComputeCapability::new(8, 9),
                            pcie_gen: 4,
                        })
                        .collect(),
                )
                .unwrap(),
                price_per_gpu_hour: MicroCredits(1_000_000 * (i as u64 + 1)),
                spot_floor_per_gpu_hour: Some(MicroCredits(400_000)),
                min_duration_s: 60,
                max_duration_s: 86_400,
                region: BoundedString::new(region).unwrap(),
                tier: EvidenceTier::Challenged,
                driver: Version::new(550, 0, 0),
                cuda: Version::new(12, 4, 0),
                images: BoundedVec::new(vec![ImageDigest([1; 32])]).unwrap(),
                ext: Ext::new(),
            };
            book.insert(&Signed::sign(&key, offer).unwrap(), now).unwrap();
        }
        book
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(query) = Query::parse(text) else { return };
    let now = Timestamp(1_000_000);
    let hits = book().search(&query, now, 3);
    assert!(hits.len() <= 3);
    let spec = BidSpec {
        query,
        gpus: 2,
        max_price: MicroCredits(5_000_000),
        duration_s: 3600,
        kind: LeaseKind::OnDemand,
        allow_spread: false,
    };
    let _ = book().match_bid(&spec, now);
});
