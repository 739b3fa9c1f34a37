//! Property tests over random books and bid sequences, against a brute-force oracle written
//! independently of the book's indexes.

use std::collections::BTreeMap;

use gpux_market::query::Query;
use gpux_market::*;
use gpux_protocol::*;
use proptest::prelude::*;

use crate::common::*;

const FAMILIES: [(&str, u64, (u8, u8)); 6] = [
    ("h100", 80, (9, 0)),
    ("a100", 40, (8, 0)),
    ("a100", 80, (8, 0)),
    ("a40", 48, (8, 6)),
    ("l4", 24, (8, 9)),
    ("rtx4090", 24, (8, 9)),
];
const REGIONS: [&str; 4] = ["eu-west", "eu-north", "us-east", "asia"];

fn arb_offer() -> impl Strategy<Value = O> {
    (
        0..FAMILIES.len(),
        1u8..=8,
        1u64..=16,
        prop::option::of(1u64..=8),
        0..REGIONS.len(),
        0usize..3,
    )
        .prop_map(|(f, gpus, price, floor, region, tier)| {
            let (family, vram_gb, cc) = FAMILIES[f];
            O {
                family,
                vram_gb,
                cc,
                gpus,
                price: price * 250_000,
                spot_floor: floor.map(|x| (x * 125_000).min(price * 250_000)),
                region: REGIONS[region],
                tier: EvidenceTier::ALL[tier],
                ..O::default()
            }
        })
}

/// A book of distinct hosts (one offer each), distinct ages, random reliabilities.
fn arb_book() -> impl Strategy<Value = (Vec<O>, Vec<u16>)> {
    (
        prop::collection::vec(arb_offer(), 1..40),
        prop::collection::vec(0u16..=1000, 40),
    )
        .prop_map(|(mut offers, rel)| {
            for (i, o) in offers.iter_mut().enumerate() {
                o.host = i as u64 + 1;
                o.created_at = T0.0 - 7 * i as u64;
            }
            (offers, rel)
        })
}

#[derive(Debug, Clone)]
enum C {
    Gpu(Vec<&'static str>),
    VramGe(u64),
    VramLt(u64),
    CountGe(u64),
    PriceLe(u64),
    Region(&'static str),
    TierGe(usize),
    Spot(bool),
}

fn arb_clause() -> impl Strategy<Value = C> {
    prop_oneof![
        prop::sample::subsequence(vec!["h100", "a100", "a40", "l4", "rtx4090"], 1..3)
            .prop_map(C::Gpu),
        prop::sample::select(vec![24u64, 40, 48, 80]).prop_map(C::VramGe),
        prop::sample::select(vec![24u64, 40, 48, 80]).prop_map(C::VramLt),
        (1u64..=8).prop_map(C::CountGe),
        (1u64..=16).prop_map(|p| C::PriceLe(p * 250_000)),
        prop::sample::select(vec!["eu", "eu-west", "us-east", "asia"]).prop_map(C::Region),
        (0usize..3).prop_map(C::TierGe),
        any::<bool>().prop_map(C::Spot),
    ]
}

fn text(clauses: &[C]) -> String {
    clauses
        .iter()
        .map(|c| match c {
            C::Gpu(f) if f.len() == 1 => format!("gpu={}", f[0]),
            C::Gpu(f) => format!("gpu in [{}]", f.join(",")),
            C::VramGe(v) => format!("vram>={v}"),
            C::VramLt(v) => format!("vram<{v}"),
            C::CountGe(n) => format!("count>={n}"),
            C::PriceLe(p) => format!("price<={}", MicroCredits(*p).amount_text()),
            C::Region(r) => format!("region={r}"),
            C::TierGe(t) => format!("tier>={}", EvidenceTier::ALL[*t]),
            C::Spot(b) => format!("spot={b}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The oracle: does offer `o` (with `free` GPUs free) satisfy every clause?
fn satisfies(o: &O, free: u64, clauses: &[C]) -> bool {
    clauses.iter().all(|c| match c {
        C::Gpu(f) => f.contains(&o.family),
        C::VramGe(v) => o.vram_gb >= *v,
        C::VramLt(v) => o.vram_gb < *v,
        C::CountGe(n) => free >= *n,
        C::PriceLe(p) => o.price <= *p,
        C::Region(r) => o.region == *r || o.region.starts_with(&format!("{r}-")),
        C::TierGe(t) => o.tier >= EvidenceTier::ALL[*t],
        C::Spot(b) => o.spot_floor.is_some() == *b,
    })
}

fn build(offers: &[O], rel: &[u16]) -> (OrderBook, Vec<ContentId>) {
    let mut book = OrderBook::new(BookConfig::default());
    let mut ids = Vec::new();
    for (i, o) in offers.iter().enumerate() {
        let signed = o.sign();
        ids.push(signed.id());
        book.insert(&signed, T0).unwrap();
        book.set_reliability(key(o.host).public(), rel[i]);
    }
    (book, ids)
}

/// Oracle priority: price, reliability descending, age (older first).
fn oracle_order(offers: &[O], rel: &[u16], mut idx: Vec<usize>) -> Vec<usize> {
    idx.sort_by_key(|&i| (offers[i].price, 1000 - rel[i], offers[i].created_at));
    idx
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn indexed_search_equals_the_brute_force_oracle(
        (offers, rel) in arb_book(),
        clauses in prop::collection::vec(arb_clause(), 0..4),
        limit in 1usize..15,
    ) {
        let (book, ids) = build(&offers, &rel);
        let query = Query::parse(&text(&clauses)).unwrap();
        let got: Vec<ContentId> = book.search(&query, T0, limit).into_iter().map(|h| h.offer).collect();
        let passing = (0..offers.len()).filter(|&i| satisfies(&offers[i], u64::from(offers[i].gpus), &clauses)).collect();
        let want: Vec<ContentId> = oracle_order(&offers, &rel, passing).into_iter().take(limit).map(|i| ids[i]).collect();
        let scanned: Vec<ContentId> = book.scan_search(&query, T0, limit).into_iter().map(|h| h.offer).collect();
        prop_assert_eq!(&got, &want, "query {}", text(&clauses));
        prop_assert_eq!(scanned, want);
    }

    #[test]
    fn matches_respect_price_constraints_and_never_double_book(
        (offers, rel) in arb_book(),
        bids in prop::collection::vec((prop::collection::vec(arb_clause(), 0..3), 1u16..=4, 1u64..=16, 0u8..4, 0u64..6), 1..25),
        releases in prop::collection::vec(any::<prop::sample::Index>(), 0..5),
    ) {
        let (mut book, ids) = build(&offers, &rel);
        let by_id: BTreeMap<ContentId, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let mut leases: Vec<ContentId> = Vec::new();
        for (n, (clauses, gpus, max, kind, hour)) in bids.iter().enumerate() {
            let kind = match kind {
                0 | 1 => LeaseKind::OnDemand,
                2 => LeaseKind::Spot,
                _ => LeaseKind::Reserved { start: T0.plus_secs(hour * 1800), end: T0.plus_secs(hour * 1800 + 3600) },
            };
            let spec = BidSpec {
                query: Query::parse(&text(clauses)).unwrap(),
                gpus: *gpus,
                max_price: MicroCredits(max * 250_000),
                duration_s: 3600,
                kind,
                allow_spread: false,
            };
            let fresh = book.bookings().is_empty();
            match book.match_bid(&spec, T0) {
                Ok(allocs) => {
                    prop_assert_eq!(allocs.len(), 1);
                    let a = &allocs[0];
                    let o = &offers[by_id[&a.offer]];
                    prop_assert!(a.price_per_gpu_hour <= spec.max_price, "price {:?} above {:?}", a.price_per_gpu_hour, spec.max_price);
                    match kind {
                        LeaseKind::Spot => prop_assert!(o.spot_floor.is_some_and(|f| f <= spec.max_price.0)),
                        _ => prop_assert_eq!(a.price_per_gpu_hour.0, o.price),
                    }
                    prop_assert_eq!(a.gpus.len(), usize::from(*gpus));
                    let free_now = book.search(&Query::parse(&format!("host={}", a.host)).unwrap(), T0, 1)[0].free;
                    prop_assert!(satisfies(o, u64::from(free_now), clauses), "{} vs {:?}", text(clauses), o);
                    if fresh && !matches!(kind, LeaseKind::Spot) {
                        // With nothing booked, the choice is the oracle's best eligible offer.
                        let eligible = (0..offers.len()).filter(|&i| {
                            satisfies(&offers[i], u64::from(offers[i].gpus), clauses)
                                && offers[i].price <= spec.max_price.0
                                && offers[i].gpus >= *gpus as u8
                        }).collect();
                        let best = oracle_order(&offers, &rel, eligible)[0];
                        prop_assert_eq!(a.offer, ids[best]);
                        if matches!(kind, LeaseKind::OnDemand) {
                            let scanned = book.scan_match_bid(&spec, T0);
                            prop_assert_eq!(scanned.as_ref(), Some(a));
                        }
                    }
                    let lease = ContentId(*blake3::hash(&(n as u64).to_le_bytes()).as_bytes());
                    prop_assert_eq!(book.reserve(a, lease), Ok(()));
                    leases.push(lease);
                }
                Err(MatchError::NoMatch) => {
                    if fresh && !matches!(kind, LeaseKind::Spot) {
                        let any = (0..offers.len()).any(|i| {
                            satisfies(&offers[i], u64::from(offers[i].gpus), clauses)
                                && offers[i].price <= spec.max_price.0
                                && offers[i].gpus >= *gpus as u8
                        });
                        prop_assert!(!any, "the oracle found an offer for {}", text(clauses));
                    }
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
            if let Some(r) = releases.get(n) && !leases.is_empty() {
                let lease = leases.remove(r.index(leases.len()));
                prop_assert!(book.release(&lease));
            }
        }
        // No GPU is ever booked for two overlapping windows.
        let mut per_gpu: BTreeMap<(PublicKey, GpuUuid), Vec<(u64, u64)>> = BTreeMap::new();
        for (host, gpu, _, start, end) in book.bookings() {
            per_gpu.entry((host, gpu)).or_default().push((start.0, end.0));
        }
        for windows in per_gpu.values_mut() {
            windows.sort_unstable();
            for pair in windows.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "overlap {:?}", pair);
            }
        }
    }
}
