//! The market gossiped per GPU family: in a market of ten families, a renter that follows
//! one (`--market-families l4`) receives a fifth or less of the gossip messages and bytes an
//! unsharded renter receives over the same 20 s (every topic, duplicates included, by
//! gossipsub's own counters), and fewer bytes in all (libp2p's transport counter); a renter
//! following a family nobody offers shows what any node receives regardless. Its book holds
//! only that family, and a search for another family says it is not followed and how to
//! follow it. A renter started with `--market-families auto` follows the families its
//! searches name, as they come.

use std::time::Duration;

use super::market::{Market, Node, wait_for};

/// Nine more families, as NVML names them: (name, nominal GB, compute capability).
const FAMILIES: [(&str, u64, (u8, u8)); 9] = [
    ("NVIDIA H100 80GB HBM3", 80, (9, 0)),
    ("NVIDIA A100-SXM4-80GB", 80, (8, 0)),
    ("NVIDIA A10", 24, (8, 6)),
    ("NVIDIA L40S", 48, (8, 9)),
    ("Tesla T4", 16, (7, 5)),
    ("Tesla V100-SXM2-32GB", 32, (7, 0)),
    ("NVIDIA A40", 48, (8, 6)),
    ("NVIDIA GeForce RTX 4090", 24, (8, 9)),
    ("NVIDIA H200", 141, (9, 0)),
];

/// What a node has received: (gossip messages, their bytes) over every topic, duplicates
/// included (gossipsub's own counters), and every byte over all its connections (libp2p's
/// transport counter: gossip, its control messages, identify, ping, kademlia, requests).
fn received(node: &Node) -> (u64, u64, u64) {
    let addr = gpux_node::metrics::read_addr(&node.dir).expect("the node's metrics address");
    let text = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let sum = |prefix: &str, also: &str| {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter(|l| l.to_ascii_lowercase().contains(also))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    (
        sum("gossipsub_topic_msg_recv_counts_unfiltered_total{", ""),
        sum("gossipsub_topic_msg_recv_bytes_unfiltered_total{", ""),
        sum("libp2p_bandwidth_bytes_total{", "direction=\"inbound\""),
    )
}

fn minus(a: (u64, u64, u64), b: (u64, u64, u64)) -> (u64, u64, u64) {
    (a.0 - b.0, a.1 - b.1, a.2 - b.2)
}

#[test]
fn a_renter_following_one_family_receives_a_fifth_of_the_gossip_or_less() {
    // An L4 host, then the two renters, then nine hosts of other families.
    let mut market = Market::start(1, 0, 10);
    market.add_renter(&["--market-families".into(), "l4".into()]);
    market.add_renter(&[]);
    // The floor: one that follows a family nobody offers (what any node receives anyway).
    market.add_renter_waiting(&["--market-families".into(), "b200".into()], false);
    for (name, gb, cc) in FAMILIES {
        // What NVML reports: a little under the nominal size in GiB.
        market.add_host_of(name, gb * (1 << 30) * 95 / 100, cc);
    }
    let (one, all) = (&market.renters[0], &market.renters[1]);
    wait_for(
        "nearly every family's offer at the unsharded renter",
        60,
        || all.api().status().is_ok_and(|s| s.offers_in_book >= 9),
    );
    let none = &market.renters[2];
    let before = [one, all, none].map(received);
    std::thread::sleep(Duration::from_secs(20));
    let after = [one, all, none].map(received);
    let [d_one, d_all, d_none] = [0, 1, 2].map(|i| minus(after[i], before[i]));
    let families = all
        .api()
        .offers("", 100)
        .unwrap()
        .iter()
        .map(|h| h.family.clone())
        .collect::<std::collections::BTreeSet<_>>();
    eprintln!(
        "over 20 s, {} families offered (messages, gossip bytes, all bytes received):\n  \
         following l4: {d_one:?}\n  following every family: {d_all:?}\n  following b200 \
         (nobody offers it): {d_none:?}\n  gossip bytes ratio {:.3}, all bytes ratio {:.3}",
        families.len(),
        d_one.1 as f64 / d_all.1 as f64,
        d_one.2 as f64 / d_all.2 as f64,
    );
    assert!(families.len() >= 9, "{families:?}");
    assert!(d_one.1 > 0, "the l4 renter received no gossip: {d_one:?}");
    assert!(d_one.1 * 5 <= d_all.1, "{d_one:?} against {d_all:?}");
    assert!(d_one.0 * 5 <= d_all.0, "{d_one:?} against {d_all:?}");
    // In all bytes the floor every node receives (kademlia's random walks every 30 s,
    // identify, ping, gossipsub control) dominates, and a walk more or less in the window
    // moves it by tens of KB: the one-family renter stays below the unsharded one plus
    // one such floor (the renter following a family nobody offers measures it).
    assert!(
        d_one.2 < d_all.2 + d_none.2,
        "{d_one:?} against {d_all:?} and a floor of {d_none:?}"
    );

    // Its book: L4s only.
    let hits = one.api().offers("", 100).unwrap();
    assert!(!hits.is_empty());
    assert!(hits.iter().all(|h| h.family == "l4"), "{hits:?}");
    // A search for another family says so, and how to follow it.
    let out = one.gpux(&["offers", "search", "gpu=h100"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("follows only the offers of l4")
            && err.contains("gpux offers follow h100")
            && err.contains("--market-families l4,h100"),
        "{err}"
    );
    // Followed now: the H100 host republishes for the new subscriber, and it can be found.
    let out = one.gpux(&["offers", "follow", "h100", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let following: gpux_api::Following = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(following.families, Some(vec!["h100".into(), "l4".into()]));
    wait_for(
        "the H100 offer at the renter that follows it now",
        30,
        || {
            one.api()
                .offers("gpu=h100", 10)
                .is_ok_and(|h| !h.is_empty())
        },
    );
    assert!(one.gpux(&["offers", "follow"]).status.code() == Some(2));

    // `auto`: nothing in its book until it searches; the search follows the family and is
    // answered once the family's host has republished for it. (Started after the
    // measurement, which it would only add to.)
    market.add_renter_waiting(&["--market-families".into(), "auto".into()], false);
    let auto = &market.renters[3];
    assert_eq!(auto.api().status().unwrap().offers_in_book, 0);
    let hits = auto.api().offers("gpu=a100", 10).unwrap();
    assert!(!hits.is_empty(), "no A100 offer after following it");
    assert!(hits.iter().all(|h| h.family == "a100"), "{hits:?}");
    // Only that family came in.
    let in_book = auto.api().status().unwrap().offers_in_book;
    assert_eq!(in_book, hits.len(), "{hits:?}");
}
