//! Real libp2p over loopback TCP: offers spread through a line of nodes, forgeries stop at
//! the first hop and cost the forger its score.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpux_node::attest::now;
use gpux_node::p2p::{self, Client, NetConfig, NetworkEvent, topics};
use gpux_node::validation::{Validator, Verdict};
use gpux_protocol::validate::Rules;
use gpux_protocol::*;
use gpux_testkit as kit;
use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;

type Seen = Arc<Mutex<Vec<(usize, MessageKind, ContentId, &'static str)>>>;

struct TestNode {
    client: Client,
    addr: Multiaddr,
}

async fn start(index: usize, seen: Seen) -> TestNode {
    let key = Keypair::from_seed(&[index as u8 + 40; 32]);
    // No kademlia: these tests need the line they build (kademlia would connect the nodes
    // to each other, and a message could bypass the node under test).
    let config = NetConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        heartbeat: Duration::from_millis(200),
        kademlia: false,
        ..NetConfig::default()
    };
    let (client, mut events) = p2p::spawn(&key, config).await.unwrap();
    let addr = loop {
        match events.recv().await.unwrap() {
            NetworkEvent::Listening(addr) => {
                break addr.with(Protocol::P2p(client.local_peer_id()));
            }
            _ => continue,
        }
    };
    let handle = client.clone();
    tokio::spawn(async move {
        let mut validator = Validator::new(Rules::default());
        while let Some(event) = events.recv().await {
            if let NetworkEvent::Gossip {
                id,
                source,
                topic,
                data,
            } = event
            {
                let content = ContentId::of(&data);
                let verdict = validator.validate(&topic, data, now());
                let label = match &verdict {
                    Verdict::Accept(_) => "accept",
                    Verdict::Reject(_) => "reject",
                    Verdict::Ignore(_) => "ignore",
                };
                let kind = match &verdict {
                    Verdict::Accept(v) => v.kind(),
                    _ => MessageKind::Offer,
                };
                seen.lock().unwrap().push((index, kind, content, label));
                let _ = handle.report(id, source, verdict.acceptance()).await;
            }
        }
    });
    TestNode { client, addr }
}

async fn line(n: usize, seen: &Seen) -> Vec<TestNode> {
    let mut nodes: Vec<TestNode> = Vec::new();
    for i in 0..n {
        let node = start(i, seen.clone()).await;
        if let Some(prev) = nodes.last() {
            node.client.dial(prev.addr.clone()).await.unwrap();
        }
        nodes.push(node);
    }
    // Wait until every node has a gossip mesh on the offer topic.
    let topic = topics::offers("h100").to_string();
    for _ in 0..100 {
        let mut ready = true;
        for node in &nodes {
            ready &= !node
                .client
                .mesh_peers(topic.clone())
                .await
                .unwrap()
                .is_empty();
        }
        if ready {
            return nodes;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the gossip mesh did not form");
}

fn host_messages(t: Timestamp) -> (Verified<Attestation>, Verified<Offer>) {
    host_messages_at(t, t, 1)
}

/// The host's attestation signed at `att_t`, and an offer signed at `offer_t` with `seq`.
fn host_messages_at(
    att_t: Timestamp,
    offer_t: Timestamp,
    seq: u64,
) -> (Verified<Attestation>, Verified<Offer>) {
    let t = att_t;
    let host = Keypair::from_seed(&[40; 32]);
    let gpu = GpuFacts {
        uuid: GpuUuid::Gpu([3; 16]),
        pcie: PcieFacts {
            max_gen: Some(5),
            ..PcieFacts::default()
        },
        ..kit::gpu_facts(0, "NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0))
    };
    let att = kit::sign(
        &host,
        Attestation {
            driver_version: kit::text("550.54.15"),
            nvml_version: kit::text("12.550"),
            ..kit::attestation(t, [gpu])
        },
    );
    let gpu = OfferGpu {
        pcie_gen: 5,
        ..kit::offer_gpu(GpuUuid::Gpu([3; 16]), "h100", 85_520_809_984, (9, 0))
    };
    let offer = kit::sign(
        &host,
        Offer {
            seq,
            attestation: att.id(),
            price_per_gpu_hour: MicroCredits(2_000_000),
            min_duration_s: 60,
            region: kit::text("eu-west"),
            driver: Version::new(550, 54, 15),
            cuda: Version::new(12, 4, 0),
            images: kit::list([ImageDigest([1; 32])]),
            ..kit::offer(offer_t, [gpu])
        },
    );
    (att, offer)
}

async fn wait_for(
    seen: &Seen,
    what: impl Fn(&[(usize, MessageKind, ContentId, &'static str)]) -> bool,
) -> bool {
    for _ in 0..100 {
        if what(&seen.lock().unwrap()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_reaches_every_node_and_a_forgery_stops_at_the_first_hop() {
    let seen: Seen = Arc::default();
    let nodes = line(5, &seen).await;
    let (att, offer) = host_messages(now());
    nodes[0]
        .client
        .publish(
            topics::attestations("h100").to_string(),
            att.as_bytes().to_vec(),
        )
        .await
        .unwrap();
    nodes[0]
        .client
        .publish(
            topics::offers("h100").to_string(),
            offer.as_bytes().to_vec(),
        )
        .await
        .unwrap();
    let offer_id = offer.id();
    let everyone = wait_for(&seen, |s| {
        (1..5).all(|i| {
            s.iter().any(|&(n, kind, id, verdict)| {
                n == i && kind == MessageKind::Offer && id == offer_id && verdict == "accept"
            })
        })
    })
    .await;
    assert!(
        everyone,
        "the offer did not reach every node: {:?}",
        seen.lock().unwrap()
    );

    // Node 4 (the end of the line) turns rogue: a tampered offer (one signature bit flipped).
    let mut forged = offer.as_bytes().to_vec();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    let forged_id = ContentId::of(&forged);
    nodes[4]
        .client
        .publish(topics::offers("h100").to_string(), forged.clone())
        .await
        .unwrap();
    let rejected = wait_for(&seen, |s| {
        s.iter()
            .any(|&(n, _, id, v)| n == 3 && id == forged_id && v == "reject")
    })
    .await;
    assert!(rejected, "node 3 did not reject the forgery");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let forwarded: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|&&(n, _, id, _)| id == forged_id && n != 3)
        .cloned()
        .collect();
    assert!(
        forwarded.is_empty(),
        "the forgery was forwarded: {forwarded:?}"
    );
    let rogue = nodes[4].client.local_peer_id();
    let score = nodes[3].client.score(rogue).await.unwrap().unwrap_or(0.0);
    assert!(score < 0.0, "the forger's score is {score}");
    // The penalty lasts: seconds later the forger is still below the graylist threshold
    // (-80), so what it sends is ignored (with the old decay it was back above in ~1 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = nodes[3].client.score(rogue).await.unwrap().unwrap_or(0.0);
    assert!(
        later < -80.0,
        "the forger's score recovered to {later} within 4.5 s"
    );
    for node in &nodes {
        node.client.shutdown().await.unwrap();
    }
}

/// An offer that several nodes saw, by verdict.
fn verdicts(seen: &Seen, id: ContentId) -> Vec<(usize, &'static str)> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|&&(_, _, i, _)| i == id)
        .map(|&(n, _, _, v)| (n, v))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_replayed_over_rate_and_oversized_offers_go_no_further() {
    let seen: Seen = Arc::default();
    let nodes = line(4, &seen).await;
    let topic = topics::offers("h100").to_string();
    let t = now();
    let (att, offer) = host_messages(t);
    nodes[0]
        .client
        .publish(
            topics::attestations("h100").to_string(),
            att.as_bytes().to_vec(),
        )
        .await
        .unwrap();
    nodes[0]
        .client
        .publish(topic.clone(), offer.as_bytes().to_vec())
        .await
        .unwrap();
    let id = offer.id();
    assert!(
        wait_for(&seen, |s| s
            .iter()
            .any(|&(n, _, i, v)| n == 3 && i == id && v == "accept"))
        .await
    );

    // Expired: signed long ago (same attestation, a higher seq), so nobody forwards it.
    let (_, expired) = host_messages_at(t, Timestamp(t.0 - 700_000), 2);
    nodes[0]
        .client
        .publish(topic.clone(), expired.as_bytes().to_vec())
        .await
        .unwrap();
    // Replayed: the first offer's content under a new gossip id is impossible (ids are the
    // content hash), so a replay is an older seq signed again.
    let (_, newer) = host_messages_at(t, t, 5);
    nodes[0]
        .client
        .publish(topic.clone(), newer.as_bytes().to_vec())
        .await
        .unwrap();
    assert!(
        wait_for(&seen, |s| s
            .iter()
            .any(|&(n, _, i, v)| n == 3 && i == newer.id() && v == "accept"))
        .await
    );
    let (_, replay) = host_messages_at(t, t.plus_ms(1), 4);
    nodes[0]
        .client
        .publish(topic.clone(), replay.as_bytes().to_vec())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        verdicts(&seen, expired.id()),
        vec![(1, "ignore")],
        "the expired offer went further"
    );
    assert_eq!(
        verdicts(&seen, replay.id()),
        vec![(1, "ignore")],
        "the replayed offer went further"
    );

    // Over the rate: 40 offers at once from one host; node 1 passes at most the limit on.
    let mut burst = Vec::new();
    for k in 0..40u64 {
        let (_, o) = host_messages_at(t, t.plus_ms(10 + k), 100 + k);
        burst.push(o.id());
        nodes[0]
            .client
            .publish(topic.clone(), o.as_bytes().to_vec())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let at = |node: usize| {
        burst
            .iter()
            .filter(|id| verdicts(&seen, **id).iter().any(|&(n, _)| n == node))
            .count()
    };
    let ignored_at_1 = burst
        .iter()
        .filter(|id| verdicts(&seen, **id).contains(&(1, "ignore")))
        .count();
    assert!(ignored_at_1 > 0, "node 1 ignored none of the burst");
    assert_eq!(
        at(2),
        40 - ignored_at_1,
        "node 2 received what node 1 ignored"
    );

    // Oversized: beyond the transport's limit, the message is refused before it travels.
    let big = vec![0u8; 200 * 1024];
    assert!(
        nodes[0]
            .client
            .publish(topic.clone(), big.clone())
            .await
            .is_err()
    );
    let big_id = ContentId::of(&big);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(verdicts(&seen, big_id).is_empty());
    for node in &nodes {
        node.client.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_second_node_on_a_port_in_use_is_an_error_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: libp2p::Multiaddr = format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap();
    let config = || NetConfig {
        listen: vec![addr.clone()],
        ..NetConfig::default()
    };
    let (first, _events) = p2p::spawn(&Keypair::from_seed(&[61; 32]), config())
        .await
        .unwrap();
    let err = p2p::spawn(&Keypair::from_seed(&[62; 32]), config())
        .await
        .map(|_| ())
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&addr.to_string()) && text.contains("already in use"),
        "{text}"
    );
    first.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_perf_protocol_measures_both_ways_and_a_peer_is_served_once_a_while() {
    let seen: Seen = Arc::default();
    let nodes = line(2, &seen).await;
    p2p::perf::serve(&nodes[0].client).unwrap();
    let server = nodes[0].client.local_peer_id();
    let rates = p2p::perf::measure(&nodes[1].client, server, 4 << 20)
        .await
        .unwrap();
    // Loopback moves far more than a megabit per second each way.
    assert!(rates.up_bps > 1e6 && rates.down_bps > 1e6, "{rates:?}");
    // The same peer again at once is not served: its stream is closed unanswered.
    assert!(
        p2p::perf::measure(&nodes[1].client, server, 1 << 20)
            .await
            .is_err()
    );
}
