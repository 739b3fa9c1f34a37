//! The order book: insert, replace, withdraw, expire, search, match, reserve, standing bids.

use gpux_market::query::Query;
use gpux_market::*;
use gpux_protocol::*;

use crate::common::*;

fn book_with(offers: &[O]) -> OrderBook {
    let mut book = OrderBook::new(BookConfig::default());
    for o in offers {
        book.insert(&o.sign(), T0).unwrap();
    }
    book
}

fn search(book: &OrderBook, q: &str) -> Vec<Hit> {
    book.search(&Query::parse(q).unwrap(), T0, 100)
}

fn spec(q: &str, gpus: u16, max_price: u64, kind: LeaseKind) -> BidSpec {
    let duration_s = match kind {
        LeaseKind::Reserved { start, end } => ((end.0 - start.0) / 1000) as u32,
        _ => 3600,
    };
    BidSpec {
        query: Query::parse(q).unwrap(),
        gpus,
        max_price: MicroCredits(max_price),
        duration_s,
        kind,
        allow_spread: false,
    }
}

#[test]
fn search_filters_and_orders_by_price_then_reliability_then_age() {
    let mut book = book_with(&[
        O {
            host: 1,
            price: 3_000_000,
            ..O::default()
        },
        O {
            host: 2,
            price: 2_000_000,
            created_at: T0.0 - 5000,
            ..O::default()
        },
        O {
            host: 3,
            price: 2_000_000,
            created_at: T0.0 - 9000,
            ..O::default()
        },
        O {
            host: 4,
            family: "a100",
            vram_gb: 40,
            cc: (8, 0),
            price: 1_000_000,
            ..O::default()
        },
        O {
            host: 5,
            region: "us-east",
            price: 1_500_000,
            ..O::default()
        },
    ]);
    let ids = |hits: Vec<Hit>| hits.into_iter().map(|h| h.host).collect::<Vec<_>>();
    // Same price: the older offer first.
    assert_eq!(
        ids(search(&book, "gpu=H100 region=eu")),
        [key(3).public(), key(2).public(), key(1).public()]
    );
    // Higher reliability beats age at equal price.
    book.set_reliability(key(2).public(), 900);
    assert_eq!(
        ids(search(&book, "gpu=h100 region=eu price<=2")),
        [key(2).public(), key(3).public()]
    );
    assert_eq!(ids(search(&book, "vram<80")), [key(4).public()]);
    assert_eq!(ids(search(&book, "region notin [eu]")), [key(5).public()]);
    assert_eq!(search(&book, "").len(), 5);
    assert_eq!(ids(search(&book, "order=price-"))[0], key(1).public());
    let hit = &search(&book, "gpu=a100")[0];
    assert_eq!(
        (hit.vram_gb, hit.gpus, hit.free, hit.region.as_str()),
        (40, 8, 8, "eu-west")
    );
}

#[test]
fn disk_finds_hosts_that_say_they_give_a_workspace_that_large() {
    let book = book_with(&[
        O {
            host: 1,
            disk_bytes: 100_000_000_000,
            ..O::default()
        },
        O {
            host: 2,
            disk_bytes: 20_000_000_000,
            ..O::default()
        },
        O {
            host: 3,
            ..O::default()
        },
    ]);
    let hosts = |q: &str| -> Vec<PublicKey> { search(&book, q).iter().map(|h| h.host).collect() };
    assert_eq!(hosts("disk>=50"), [key(1).public()]);
    let mut some = hosts("disk>=20");
    some.sort();
    let mut want = vec![key(1).public(), key(2).public()];
    want.sort();
    assert_eq!(some, want);
    assert_eq!(hosts("disk=0"), [key(3).public()]);
    assert_eq!(hosts("disk>=101"), Vec::<PublicKey>::new());
}

#[test]
fn machine_facts_filter_and_order_offers_per_gpu() {
    let book = book_with(&[
        // 8 GPUs on 32 threads and 256 GiB: 4 cores and 32 GiB (34 GB) per GPU.
        O {
            host: 1,
            machine: (32, 256 * GIB),
            net: (1000, 100),
            ..O::default()
        },
        // 2 GPUs on 64 threads and 512 GiB: 32 cores and 256 GiB per GPU.
        O {
            host: 2,
            gpus: 2,
            machine: (64, 512 * GIB),
            net: (10_000, 1000),
            ..O::default()
        },
        // Not measured.
        O {
            host: 3,
            gpus: 1,
            machine: (3, 16 * GIB),
            ..O::default()
        },
    ]);
    let hosts = |q: &str| -> Vec<u64> {
        search(&book, q)
            .iter()
            .map(|h| (1..=3).find(|&n| key(n).public() == h.host).unwrap())
            .collect()
    };
    assert_eq!(hosts("cpu>=16"), [2]);
    assert_eq!(hosts("cpu>=3 cpu<=4 order=cpu"), [3, 1]);
    assert_eq!(hosts("cpu>=2.5 order=cpu-"), [2, 1, 3]);
    assert_eq!(hosts("ram>=128"), [2]);
    assert_eq!(hosts("ram>=34 order=ram"), [1, 2]);
    assert_eq!(hosts("inet_down>=1000 order=inet_down-"), [2, 1]);
    assert_eq!(hosts("inet_up>=500"), [2]);
    // What was not measured is 0.
    assert_eq!(hosts("inet_down=0"), [3]);
    // A hit shows the machine and the share.
    let hit = &search(&book, "cpu>=16")[0];
    assert_eq!(hit.machine.cpu_threads, 64);
    assert_eq!(hit.machine.share.cpu_millis, 32_000);
    assert_eq!(hit.machine.share.memory_bytes, 256 * GIB);
    assert_eq!(hit.machine.cpu_model.as_str(), "test CPU");
}

#[test]
fn pulling_hosts_are_found_by_size_and_warm_ones_by_their_cached_images() {
    let pulls = |gb: u64, cached: &[&str]| Pulls {
        max_bytes: gb * 1_000_000_000,
        timeout_s: 600,
        registries: BoundedVec::empty(),
        cached: BoundedVec::new(
            cached
                .iter()
                .map(|c| BoundedString::new(*c).unwrap())
                .collect(),
        )
        .unwrap(),
    };
    let mut book = book_with(&[
        O {
            host: 1,
            pulls: pulls(
                40,
                &[
                    "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                    "ubuntu:24.04",
                ],
            ),
            ..O::default()
        },
        O {
            host: 2,
            pulls: pulls(10, &["ubuntu:24.04"]),
            ..O::default()
        },
        O {
            host: 3,
            ..O::default()
        },
    ]);
    let hosts = |book: &OrderBook, q: &str| -> Vec<u64> {
        let mut found: Vec<u64> = search(book, q)
            .iter()
            .map(|h| (1..=3).find(|&n| key(n).public() == h.host).unwrap())
            .collect();
        found.sort_unstable();
        found
    };
    assert_eq!(hosts(&book, "pull>=20"), [1]);
    assert_eq!(hosts(&book, "pull>0"), [1, 2]);
    assert_eq!(hosts(&book, "pull=0"), [3]);
    assert_eq!(hosts(&book, "image=pytorch/pytorch:2.5*"), [1]);
    assert_eq!(hosts(&book, "image=ubuntu:24.04"), [1, 2]);
    assert_eq!(
        hosts(&book, "image=ubuntu"),
        Vec::<u64>::new(),
        "ubuntu is ubuntu:latest"
    );
    let hit = &search(&book, "pull>=20")[0];
    assert_eq!(hit.pulls.cached.len(), 2);
    assert_eq!(
        book.offer_pulls(&hit.offer).unwrap().max_bytes,
        40_000_000_000
    );
    // A replaced offer forgets its cache: the names it alone used are gone from the book.
    let newer = O {
        host: 2,
        seq: 2,
        pulls: pulls(10, &[]),
        ..O::default()
    };
    book.insert(&newer.sign(), T0).unwrap();
    assert_eq!(hosts(&book, "image=ubuntu:24.04"), [1]);
}

#[test]
fn mig_finds_slices_by_their_profile_memory_and_whole_gpus_apart() {
    let book = book_with(&[
        // One A100 host: its whole GPUs in slot 0, 1g.10gb slices in slot 1, 3g.40gb in 2.
        O {
            family: "a100",
            vram_gb: 80,
            cc: (8, 0),
            gpus: 1,
            ..O::default()
        },
        O {
            slot: 1,
            family: "a100",
            vram_gb: 10,
            cc: (8, 0),
            gpus: 7,
            price: 285_714,
            spot_floor: None,
            mig_profile: Some("1g.10gb"),
            ..O::default()
        },
        O {
            slot: 2,
            family: "a100",
            vram_gb: 40,
            cc: (8, 0),
            gpus: 2,
            price: 857_142,
            spot_floor: None,
            mig_profile: Some("3g.40gb"),
            ..O::default()
        },
    ]);
    let found = |q: &str| -> Vec<(u16, Option<String>)> {
        search(&book, q)
            .into_iter()
            .map(|h| (h.vram_gb, h.mig_profile))
            .collect()
    };
    // Slices are found as slices, cheapest first, with the memory their profile names.
    assert_eq!(
        found("mig=true"),
        [(10, Some("1g.10gb".into())), (40, Some("3g.40gb".into()))]
    );
    assert_eq!(found("mig=true vram>=20"), [(40, Some("3g.40gb".into()))]);
    assert_eq!(found("mig=false"), [(80, None)]);
    assert_eq!(found("gpu=a100 vram>=10").len(), 3);
}

#[test]
fn disk_price_finds_hosts_by_what_a_kept_workspace_costs() {
    let book = book_with(&[
        O {
            host: 1,
            disk_bytes: 100_000_000_000,
            disk_price: 100_000,
            ..O::default()
        },
        O {
            host: 2,
            disk_bytes: 100_000_000_000,
            ..O::default()
        },
    ]);
    let hosts = |q: &str| -> Vec<PublicKey> { search(&book, q).iter().map(|h| h.host).collect() };
    assert_eq!(hosts("disk_price<=0.05"), [key(2).public()]);
    assert_eq!(hosts("disk_price>0"), [key(1).public()]);
    // The renter's node reads the terms of the offer it picks.
    let offer = search(&book, "disk_price>0")[0].offer;
    assert_eq!(
        book.offer_retention(&offer),
        Some((MicroCredits(100_000), None))
    );
}

#[test]
fn newer_offers_replace_older_ones_in_their_slot_only() {
    let mut book = book_with(&[
        O {
            seq: 5,
            ..O::default()
        },
        O {
            slot: 1,
            seq: 6,
            family: "a40",
            vram_gb: 48,
            cc: (8, 6),
            ..O::default()
        },
    ]);
    assert_eq!(book.len(), 2);
    let newer = O {
        seq: 7,
        price: 2_500_000,
        ..O::default()
    }
    .sign();
    assert!(matches!(book.insert(&newer, T0), Ok(Inserted::Replaced(_))));
    assert_eq!(book.len(), 2);
    assert_eq!(
        search(&book, "gpu=h100")[0].price_per_gpu_hour,
        MicroCredits(2_500_000)
    );
    // A replay of the old seq, or the same offer again, is refused.
    assert_eq!(
        book.insert(
            &O {
                seq: 5,
                ..O::default()
            }
            .sign(),
            T0
        ),
        Err(InsertError::Replay { seq: 5, newest: 7 })
    );
    assert_eq!(book.insert(&newer, T0), Err(InsertError::Duplicate));
    // Expired offers are refused.
    let old = O {
        seq: 9,
        created_at: T0.0 - 700_000,
        ..O::default()
    }
    .sign();
    assert!(matches!(
        book.insert(&old, T0),
        Err(InsertError::Expired(_))
    ));
}

#[test]
fn withdrawals_and_expiry_remove_offers() {
    let offer = O::default().sign();
    let mut book = OrderBook::new(BookConfig::default());
    book.insert(&offer, T0).unwrap();
    let withdraw = |k: &Keypair, seq| {
        Signed::sign(
            k,
            OfferWithdrawal {
                seq,
                created_at: T0,
                offer: offer.id(),
                ext: Ext::new(),
            },
        )
        .unwrap()
    };
    assert_eq!(
        book.withdraw(&withdraw(&key(2), 9)),
        Err(WithdrawError::NotTheHost)
    );
    assert!(matches!(
        book.withdraw(&withdraw(&key(1), 1)),
        Err(WithdrawError::Replay { .. })
    ));
    book.withdraw(&withdraw(&key(1), 2)).unwrap();
    assert!(book.is_empty());
    // The withdrawn seq cannot come back.
    assert!(matches!(
        book.insert(&offer, T0),
        Err(InsertError::Replay { .. })
    ));

    let mut book = book_with(&[
        O::default(),
        O {
            host: 2,
            created_at: T0.0 + 100_000,
            ..O::default()
        },
    ]);
    assert_eq!(book.expire(T0.plus_secs(599)).len(), 0);
    assert_eq!(book.expire(T0.plus_secs(600)).len(), 1);
    assert_eq!(book.len(), 1);
    // Search never returns an expired offer, even before the sweep.
    assert!(
        book.search(&Query::default(), T0.plus_secs(700), 10)
            .is_empty()
    );
}

#[test]
fn mixed_gpu_offers_are_refused() {
    let o = O::default();
    let mut offer = o.sign().body().clone();
    let mut gpus = offer.gpus.to_vec();
    gpus[1].memory_bytes += GIB;
    offer.gpus = BoundedVec::new(gpus).unwrap();
    let signed = Signed::sign(&key(1), offer).unwrap();
    assert_eq!(
        OrderBook::default().insert(&signed, T0),
        Err(InsertError::MixedGpus)
    );
}

#[test]
fn one_machine_by_default_spread_when_allowed() {
    let book = book_with(&[
        O {
            host: 1,
            gpus: 2,
            price: 1_000_000,
            ..O::default()
        },
        O {
            host: 2,
            gpus: 4,
            price: 2_000_000,
            ..O::default()
        },
    ]);
    let m = book
        .match_bid(&spec("gpu=h100", 3, 5_000_000, LeaseKind::OnDemand), T0)
        .unwrap();
    assert_eq!(
        (m.len(), m[0].host, m[0].gpus.len()),
        (1, key(2).public(), 3)
    );
    let mut spread = spec("gpu=h100", 5, 5_000_000, LeaseKind::OnDemand);
    spread.allow_spread = true;
    let m = book.match_bid(&spread, T0).unwrap();
    assert_eq!(m.iter().map(|a| a.gpus.len()).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(
        book.match_bid(&spec("gpu=h100", 5, 5_000_000, LeaseKind::OnDemand), T0),
        Err(MatchError::NoMatch)
    );
    // Price cap.
    assert_eq!(
        book.match_bid(&spec("gpu=h100", 3, 1_999_999, LeaseKind::OnDemand), T0),
        Err(MatchError::NoMatch)
    );
}

#[test]
fn reserving_books_gpus_exactly_once() {
    let mut book = book_with(&[O {
        gpus: 2,
        ..O::default()
    }]);
    let s = spec("", 2, 5_000_000, LeaseKind::OnDemand);
    let a = book.match_bid(&s, T0).unwrap().remove(0);
    book.reserve(&a, ContentId([1; 32])).unwrap();
    assert_eq!(
        book.reserve(&a, ContentId([2; 32])),
        Err(ReserveError::Unavailable(a.gpus[0]))
    );
    assert_eq!(book.match_bid(&s, T0), Err(MatchError::NoMatch));
    assert_eq!(search(&book, "count>=1").len(), 0);
    assert_eq!(search(&book, "count=0").len(), 1);
    assert!(book.release(&ContentId([1; 32])));
    assert_eq!(search(&book, "count=2").len(), 1);
    book.reserve(&a, ContentId([2; 32])).unwrap();
}

#[test]
fn on_demand_preempts_spot_after_the_notice_and_spot_outbids_spot() {
    let mut book = book_with(&[O {
        gpus: 1,
        spot_floor: Some(500_000),
        ..O::default()
    }]);
    let spot_low = book
        .match_bid(&spec("", 1, 600_000, LeaseKind::Spot), T0)
        .unwrap()
        .remove(0);
    assert_eq!(spot_low.price_per_gpu_hour, MicroCredits(600_000));
    book.reserve(&spot_low, ContentId([1; 32])).unwrap();
    // A lower spot bid cannot displace it; a higher one can, after the notice.
    assert_eq!(
        book.match_bid(&spec("", 1, 550_000, LeaseKind::Spot), T0),
        Err(MatchError::NoMatch)
    );
    let spot_high = book
        .match_bid(&spec("", 1, 700_000, LeaseKind::Spot), T0)
        .unwrap()
        .remove(0);
    assert_eq!(spot_high.preempts, [ContentId([1; 32])]);
    assert_eq!(
        spot_high.start,
        T0.plus_ms(BookConfig::default().spot_notice_ms)
    );
    // On-demand preempts spot too.
    let od = book
        .match_bid(&spec("", 1, 5_000_000, LeaseKind::OnDemand), T0)
        .unwrap()
        .remove(0);
    assert_eq!(
        (od.preempts.len(), od.price_per_gpu_hour),
        (1, MicroCredits(2_000_000))
    );
    book.reserve(&od, ContentId([2; 32])).unwrap();
    // Now the GPU is on-demand: nothing preempts it.
    assert_eq!(
        book.match_bid(&spec("", 1, 9_000_000, LeaseKind::Spot), T0),
        Err(MatchError::NoMatch)
    );
    // The preempted lease was cut to end when the on-demand lease starts.
    let cut = book
        .bookings()
        .into_iter()
        .find(|b| b.2 == ContentId([1; 32]))
        .unwrap();
    assert_eq!(cut.4, od.start);
}

#[test]
fn overlapping_reserved_windows_never_both_match() {
    let mut book = book_with(&[O {
        gpus: 1,
        ..O::default()
    }]);
    let w = |a: u64, b: u64| LeaseKind::Reserved {
        start: T0.plus_secs(a),
        end: T0.plus_secs(b),
    };
    let first = book
        .match_bid(&spec("", 1, 5_000_000, w(1800, 7200)), T0)
        .unwrap()
        .remove(0);
    book.reserve(&first, ContentId([1; 32])).unwrap();
    assert_eq!(
        book.match_bid(&spec("", 1, 5_000_000, w(7000, 9000)), T0),
        Err(MatchError::NoMatch)
    );
    assert!(
        book.match_bid(&spec("", 1, 5_000_000, w(7200, 9000)), T0)
            .is_ok()
    );
    // On-demand for an hour from now would overlap the reservation.
    assert_eq!(
        book.match_bid(&spec("", 1, 5_000_000, LeaseKind::OnDemand), T0),
        Err(MatchError::NoMatch)
    );
    assert_eq!(
        book.match_bid(&spec("", 1, 5_000_000, w(0, 10)), T0.plus_secs(1)),
        Err(MatchError::WindowInThePast)
    );
}

#[test]
fn windows_a_host_booked_ahead_are_left_alone_by_other_renters() {
    // The host's offer says its only GPU is booked from T0 + 2 h to T0 + 3 h (someone else's
    // reserved lease, which this renter's book never saw).
    let o = O {
        gpus: 1,
        ..O::default()
    };
    let mut body = o.sign().body().clone();
    let window = (0u8, T0.plus_secs(7200), T0.plus_secs(10_800));
    body.terms.booked = Offer::booked_windows(&[window]);
    let offer = Signed::sign(&key(o.host), body).unwrap();
    assert_eq!(offer.booked().unwrap(), vec![window]);
    let mut book = OrderBook::new(BookConfig::default());
    book.insert(&offer, T0).unwrap();
    let w = |a: u64, b: u64| LeaseKind::Reserved {
        start: T0.plus_secs(a),
        end: T0.plus_secs(b),
    };
    // Overlapping it, in any way: no match.
    for (a, b) in [(5400, 9000), (9000, 12_000), (7200, 10_800), (3600, 14_400)] {
        assert_eq!(
            book.match_bid(&spec("", 1, 5_000_000, w(a, b)), T0),
            Err(MatchError::NoMatch),
            "[{a}, {b})"
        );
    }
    // Before or after it: a match.
    assert!(
        book.match_bid(&spec("", 1, 5_000_000, w(3600, 7200)), T0)
            .is_ok()
    );
    assert!(
        book.match_bid(&spec("", 1, 5_000_000, w(10_800, 12_000)), T0)
            .is_ok()
    );
    // An on-demand hour from now ends before it; three hours would run into it.
    assert!(
        book.match_bid(&spec("", 1, 5_000_000, LeaseKind::OnDemand), T0)
            .is_ok()
    );
    let mut long = spec("", 1, 5_000_000, LeaseKind::OnDemand);
    long.duration_s = 3 * 3600;
    assert_eq!(book.match_bid(&long, T0), Err(MatchError::NoMatch));

    // A window list that names no GPU of the offer, or runs backwards, is invalid.
    for bad in [
        (1u8, T0.plus_secs(1), T0.plus_secs(2)),
        (0u8, T0.plus_secs(2), T0.plus_secs(1)),
    ] {
        let mut body = o.sign().body().clone();
        body.terms.booked = Offer::booked_windows(&[bad]);
        assert!(body.check().is_err(), "{bad:?}");
    }
}

#[test]
fn standing_bids_are_found_for_a_new_offer_best_first() {
    let mut book = OrderBook::new(BookConfig::default());
    book.add_bid(
        &bid(1, 1, "gpu=h100", 2, 2_500_000, LeaseKind::OnDemand),
        T0,
    )
    .unwrap();
    book.add_bid(
        &bid(2, 1, "gpu=h100", 2, 3_000_000, LeaseKind::OnDemand),
        T0,
    )
    .unwrap();
    book.add_bid(
        &bid(3, 1, "gpu=a100", 2, 9_000_000, LeaseKind::OnDemand),
        T0,
    )
    .unwrap();
    book.add_bid(
        &bid(4, 1, "gpu=h100", 2, 1_000_000, LeaseKind::OnDemand),
        T0,
    )
    .unwrap();
    book.add_bid(&bid(5, 1, "gpu=h100", 2, 900_000, LeaseKind::Spot), T0)
        .unwrap();
    book.add_bid(
        &bid(6, 1, "gpu=h100", 9, 9_000_000, LeaseKind::OnDemand),
        T0,
    )
    .unwrap();
    assert!(matches!(
        book.add_bid(&bid(1, 1, "gpu=h100", 2, 1, LeaseKind::OnDemand), T0),
        Err(BidError::Replay { .. })
    ));
    assert!(matches!(
        book.add_bid(&bid(7, 1, "gpu=h10", 2, 1, LeaseKind::OnDemand), T0),
        Err(BidError::Query(_))
    ));
    let offer = O::default().sign();
    book.insert(&offer, T0).unwrap();
    let renters = |ids: Vec<ContentId>| ids.len();
    let found = book.bids_for_offer(&offer.id(), T0);
    // The 3.0 bid, then 2.5, then the spot bid at 0.9 (floor 0.8); not the 1.0 on-demand bid
    // (below the price), the A100 bid or the 9-GPU bid.
    assert_eq!(renters(found.clone()), 3);
    let expected = [
        bid(2, 1, "gpu=h100", 2, 3_000_000, LeaseKind::OnDemand).id(),
        bid(1, 1, "gpu=h100", 2, 2_500_000, LeaseKind::OnDemand).id(),
        bid(5, 1, "gpu=h100", 2, 900_000, LeaseKind::Spot).id(),
    ];
    assert_eq!(found, expected);
}

/// A renter's bid in one slot (a copy of `bid` with `slot`, `seq` and a price of its own).
fn bid_in(renter: u64, slot: u16, seq: u64, max_price: u64) -> Verified<Bid> {
    let mut body = bid(renter, seq, "gpu=h100", 2, max_price, LeaseKind::OnDemand)
        .body()
        .clone();
    body.slot = slot;
    Signed::sign(&key(1000 + renter), body).unwrap()
}

#[test]
fn a_renter_keeps_a_bid_per_slot_and_withdraws_each_on_its_own() {
    let mut book = OrderBook::new(BookConfig::default());
    let a = bid_in(1, 0, 1, 3_000_000);
    let b = bid_in(1, 1, 2, 2_500_000);
    book.add_bid(&a, T0).unwrap();
    book.add_bid(&b, T0).unwrap();
    // The same bid again stands again (after a fill that did not happen); an older one in
    // its slot does not.
    book.add_bid(&a, T0).unwrap();
    assert!(matches!(
        book.add_bid(&bid_in(1, 1, 1, 9_000_000), T0),
        Err(BidError::Replay { .. })
    ));
    assert_eq!(book.bid_count(), 2);
    let offer = O::default().sign();
    book.insert(&offer, T0).unwrap();
    assert_eq!(book.bids_for_offer(&offer.id(), T0), [a.id(), b.id()]);
    let withdraw = |renter: u64, slot: u16, seq: u64, bid: ContentId| {
        let body = BidWithdrawal {
            seq,
            created_at: T0,
            bid,
            slot,
            ext: Ext::new(),
        };
        Signed::sign(&key(1000 + renter), body).unwrap()
    };
    // Only its renter, naming its slot, with a newer seq, withdraws a bid.
    assert!(!book.withdraw_bid(&withdraw(2, 0, 5, a.id())));
    assert!(!book.withdraw_bid(&withdraw(1, 1, 5, a.id())));
    assert!(!book.withdraw_bid(&withdraw(1, 0, 1, a.id())));
    assert!(book.withdraw_bid(&withdraw(1, 0, 5, a.id())));
    assert_eq!(book.bids_for_offer(&offer.id(), T0), [b.id()]);
    // Withdrawn, it cannot be replayed.
    assert!(matches!(book.add_bid(&a, T0), Err(BidError::Replay { .. })));
    // A slot past the last is not a bid.
    let mut body = a.body().clone();
    body.slot = MAX_BID_SLOTS;
    assert!(body.check().is_err());
}

#[test]
fn a_full_book_of_bids_takes_a_better_bid_in_place_of_the_worst() {
    let mut book = OrderBook::new(BookConfig {
        max_bids: 3,
        ..BookConfig::default()
    });
    for renter in 1..=3 {
        book.add_bid(&bid_in(renter, 0, 1, renter * 1_000_000), T0)
            .unwrap();
    }
    // Paying no more than the worst: refused.
    assert_eq!(
        book.add_bid(&bid_in(4, 0, 1, 1_000_000), T0),
        Err(BidError::Full)
    );
    book.add_bid(&bid_in(5, 0, 1, 5_000_000), T0).unwrap();
    assert_eq!(book.bid_count(), 3);
    let offer = O {
        price: 500_000,
        spot_floor: Some(400_000),
        ..O::default()
    }
    .sign();
    book.insert(&offer, T0).unwrap();
    let found = book.bids_for_offer(&offer.id(), T0);
    assert_eq!(
        found,
        [
            bid_in(5, 0, 1, 5_000_000).id(),
            bid_in(3, 0, 1, 3_000_000).id(),
            bid_in(2, 0, 1, 2_000_000).id(),
        ]
    );
}

/// r001: contradictory price bounds panicked inside BTreeSet::range (found by fuzzing).
#[test]
fn r001_contradictory_price_bounds_match_nothing() {
    let book = book_with(&[O::default()]);
    for q in [
        "price>=6 price<=2.5",
        "price>=6 price<=2.5 order=vram-",
        "price>3 price<3",
    ] {
        assert!(search(&book, q).is_empty(), "{q}");
        assert_eq!(
            book.match_bid(&spec(q, 1, 9_000_000, LeaseKind::OnDemand), T0),
            Err(MatchError::NoMatch)
        );
        assert!(
            book.scan_search(&Query::parse(q).unwrap(), T0, 5)
                .is_empty()
        );
    }
}

/// r002: `reserve` must not cut a lease just because an allocation names it in `preempts`.
#[test]
fn r002_reserve_never_preempts_what_it_may_not() {
    let mut book = book_with(&[O {
        gpus: 2,
        ..O::default()
    }]);
    let od = book
        .match_bid(&spec("", 1, 9_000_000, LeaseKind::OnDemand), T0)
        .unwrap()
        .remove(0);
    book.reserve(&od, ContentId([1; 32])).unwrap();
    let window = LeaseKind::Reserved {
        start: T0.plus_secs(600),
        end: T0.plus_secs(1200),
    };
    let mut forged = book
        .match_bid(&spec("", 1, 9_000_000, window), T0)
        .unwrap()
        .remove(0);
    forged.gpus = od.gpus.clone();
    forged.preempts = vec![ContentId([1; 32])];
    assert_eq!(
        book.reserve(&forged, ContentId([2; 32])),
        Err(ReserveError::Unavailable(od.gpus[0]))
    );
    // Naming it on another GPU does not cut it either.
    let mut other = book
        .match_bid(&spec("", 1, 9_000_000, window), T0)
        .unwrap()
        .remove(0);
    other.preempts = vec![ContentId([1; 32])];
    book.reserve(&other, ContentId([3; 32])).unwrap();
    let kept = book
        .bookings()
        .into_iter()
        .find(|b| b.2 == ContentId([1; 32]))
        .unwrap();
    assert_eq!(kept.4, od.end);
    // Empty windows are refused.
    let mut empty = other.clone();
    empty.end = empty.start;
    assert_eq!(
        book.reserve(&empty, ContentId([4; 32])),
        Err(ReserveError::EmptyWindow)
    );
}

/// r003: a family named twice is merged once.
#[test]
fn r003_repeated_families_do_not_duplicate_results() {
    let book = book_with(&[O::default()]);
    assert_eq!(search(&book, "gpu in [h100,H100]").len(), 1);
    let mut spread = spec("gpu in [h100,H100]", 12, 9_000_000, LeaseKind::OnDemand);
    spread.allow_spread = true;
    assert_eq!(book.match_bid(&spread, T0), Err(MatchError::NoMatch));
}

/// r004: a running lease keeps its GPU when the offer expires and the host republishes.
#[test]
fn r004_bookings_survive_expiry_and_republishing() {
    let mut book = book_with(&[O {
        gpus: 1,
        ..O::default()
    }]);
    let a = book
        .match_bid(&spec("", 1, 9_000_000, LeaseKind::OnDemand), T0)
        .unwrap()
        .remove(0);
    book.reserve(&a, ContentId([1; 32])).unwrap();
    let later = T0.plus_secs(700);
    assert_eq!(book.expire(later).len(), 1);
    book.insert(
        &O {
            gpus: 1,
            seq: 2,
            created_at: later.0,
            ..O::default()
        }
        .sign(),
        later,
    )
    .unwrap();
    assert_eq!(
        book.match_bid(&spec("", 1, 9_000_000, LeaseKind::OnDemand), later),
        Err(MatchError::NoMatch)
    );
    // The republished offer shows its GPU as busy.
    assert_eq!(
        book.search(&Query::parse("count=0").unwrap(), later, 5)
            .len(),
        1
    );
    assert!(book.release(&ContentId([1; 32])));
}

/// r005: a GPU listed again in another slot keeps its booking.
#[test]
fn r005_bookings_follow_the_gpu_across_slots() {
    let mut book = book_with(&[O {
        gpus: 1,
        ..O::default()
    }]);
    let a = book
        .match_bid(&spec("", 1, 9_000_000, LeaseKind::OnDemand), T0)
        .unwrap()
        .remove(0);
    book.reserve(&a, ContentId([1; 32])).unwrap();
    let mut moved = O {
        gpus: 1,
        slot: 1,
        seq: 2,
        ..O::default()
    }
    .sign()
    .body()
    .clone();
    let mut gpus = moved.gpus.to_vec();
    gpus[0].uuid = a.gpus[0];
    moved.gpus = BoundedVec::new(gpus).unwrap();
    book.insert(&Signed::sign(&key(1), moved).unwrap(), T0)
        .unwrap();
    assert_eq!(
        book.match_bid(&spec("", 1, 9_000_000, LeaseKind::OnDemand), T0),
        Err(MatchError::NoMatch)
    );
}

/// r006: a host cycling through made-up regions does not grow the region table or break
/// other hosts' region matches.
#[test]
fn r006_region_names_are_reference_counted() {
    let mut book = OrderBook::new(BookConfig::default());
    let regions: Vec<String> = (0..2000).map(|i| format!("r{i}")).collect();
    for (i, region) in regions.iter().enumerate() {
        let leaked: &'static str = Box::leak(region.clone().into_boxed_str());
        book.insert(
            &O {
                seq: i as u64 + 1,
                region: leaked,
                ..O::default()
            }
            .sign(),
            T0,
        )
        .unwrap();
    }
    book.insert(
        &O {
            host: 2,
            region: "ap-south",
            ..O::default()
        }
        .sign(),
        T0,
    )
    .unwrap();
    assert_eq!(search(&book, "region=ap").len(), 1);
    assert_eq!(search(&book, "region=r1999").len(), 1);
    assert_eq!(search(&book, "region=r5").len(), 0);
}

/// r008: an expired offer (not yet swept) satisfies no standing bid.
#[test]
fn r008_expired_offers_match_no_standing_bid() {
    let mut book = OrderBook::new(BookConfig::default());
    book.add_bid(
        &bid(1, 1, "gpu=h100", 1, 9_000_000, LeaseKind::OnDemand),
        T0,
    )
    .unwrap();
    let offer = O::default().sign();
    book.insert(&offer, T0).unwrap();
    assert_eq!(book.bids_for_offer(&offer.id(), T0).len(), 1);
    assert!(
        book.bids_for_offer(&offer.id(), T0.plus_secs(600))
            .is_empty()
    );
}

#[test]
fn a_full_book_evicts_what_stands_lowest_and_one_host_cannot_fill_it() {
    let mut book = OrderBook::new(BookConfig {
        max_offers: 4,
        max_offers_per_host: 2,
        ..BookConfig::default()
    });
    let offer = |host, slot, created_at, tier| O {
        host,
        slot,
        created_at,
        tier,
        ..O::default()
    };
    let sr = EvidenceTier::SelfReported;
    // One host: two slots, not a third.
    book.insert(&offer(1, 0, T0.0 - 9000, sr).sign(), T0)
        .unwrap();
    book.insert(&offer(1, 1, T0.0 - 8000, sr).sign(), T0)
        .unwrap();
    assert_eq!(
        book.insert(&offer(1, 2, T0.0 - 7000, sr).sign(), T0),
        Err(InsertError::HostFull(2))
    );
    // A replacement in a held slot is always fine.
    let mut newer = offer(1, 0, T0.0 - 6000, sr);
    newer.seq = 2;
    assert!(matches!(
        book.insert(&newer.sign(), T0),
        Ok(Inserted::Replaced(_))
    ));
    // A host this node trusts (settled leases), and a challenged one.
    book.set_reliability(key(2).public(), 900);
    let trusted = offer(2, 0, T0.0 - 9500, sr).sign();
    book.insert(&trusted, T0).unwrap();
    let challenged = offer(3, 0, T0.0 - 9900, EvidenceTier::Challenged).sign();
    book.insert(&challenged, T0).unwrap();
    assert_eq!(book.len(), 4);
    // Full: a newcomer evicts the lowest (host 1's older offer), never the trusted or the
    // challenged one.
    let first_newcomer = offer(4, 0, T0.0 - 1000, sr).sign();
    let evicted = match book.insert(&first_newcomer, T0) {
        Ok(Inserted::Evicted(id)) => id,
        other => panic!("{other:?}"),
    };
    assert_eq!(evicted, offer(1, 1, T0.0 - 8000, sr).sign().id());
    assert!(!book.contains(&evicted));
    for _ in 0..10 {
        // A flood of newcomers churns only among the lowest.
        let n = book.len() as u64 + 100;
        let _ = book.insert(&offer(n, 0, T0.0 - 500, sr).sign(), T0);
    }
    assert_eq!(book.len(), 4);
    assert!(book.contains(&trusted.id()));
    assert!(book.contains(&challenged.id()));
    // An unreachable host (reliability below the default) loses its place first; an older
    // offer than everything in a full book of equals is refused.
    book.set_reliability(key(2).public(), 100);
    let late = offer(5, 0, T0.0 - 99_000, sr).sign();
    assert!(matches!(book.insert(&late, T0), Ok(Inserted::Evicted(id)) if id == trusted.id()));
    let older = offer(6, 0, T0.0 - 300_000, sr).sign();
    assert_eq!(book.insert(&older, T0), Err(InsertError::Full(4)));
}
