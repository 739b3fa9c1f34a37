//! Real libp2p over loopback TCP: offers spread through a line of nodes, forgeries stop at
//! the first hop and cost the forger its score.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpux_node::attest::now;
use gpux_node::p2p::{self, Client, NetConfig, NetworkEvent, topics};
use gpux_node::validation::{Validator, Verdict};
use gpux_protocol::validate::Rules;
use gpux_protocol::*;
use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;

type Seen = Arc<Mutex<Vec<(usize, MessageKind, ContentId, &'static str)>>>;

struct TestNode {
    client: Client,
    addr: Multiaddr,
}

async fn start(index: usize, seen: Seen) -> TestNode {
    let key = Keypair::from_seed(&[index as u8 + 40; 32]);
    let config = NetConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        heartbeat: Duration::from_millis(200),
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
    let host = Keypair::from_seed(&[40; 32]);
    let gpu = GpuFacts {
        index: 0,
        name: BoundedString::new("NVIDIA H100 80GB HBM3").unwrap(),
        uuid: GpuUuid([3; 16]),
        serial: None,
        board_part_number: None,
        memory_total_bytes: 85_520_809_984,
        compute_capability: ComputeCapability::new(9, 0),
        pcie: PcieFacts {
            max_gen: Some(5),
            ..PcieFacts::default()
        },
        power_limit_mw: None,
        max_sm_clock_mhz: None,
        max_memory_clock_mhz: None,
        ecc: None,
        mig: None,
        confidential_compute: None,
    };
    let att = Signed::sign(
        &host,
        Attestation {
            created_at: t,
            driver_version: BoundedString::new("550.54.15").unwrap(),
            cuda_driver_version: None,
            nvml_version: BoundedString::new("12.550").unwrap(),
            gpus: BoundedVec::new(vec![gpu]).unwrap(),
            ext: Ext::new(),
        },
    )
    .unwrap();
    let offer = Signed::sign(
        &host,
        Offer {
            seq: 1,
            slot: 0,
            created_at: t,
            expires_at: t.plus_secs(600),
            attestation: att.id(),
            gpus: BoundedVec::new(vec![OfferGpu {
                uuid: GpuUuid([3; 16]),
                family: BoundedString::new("h100").unwrap(),
                memory_bytes: 85_520_809_984,
                compute_capability: ComputeCapability::new(9, 0),
                pcie_gen: 5,
            }])
            .unwrap(),
            price_per_gpu_hour: MicroCredits(2_000_000),
            spot_floor_per_gpu_hour: None,
            min_duration_s: 60,
            max_duration_s: 86_400,
            region: BoundedString::new("eu-west").unwrap(),
            tier: EvidenceTier::SelfReported,
            driver: Version::new(550, 54, 15),
            cuda: Version::new(12, 4, 0),
            images: BoundedVec::new(vec![ImageDigest([1; 32])]).unwrap(),
            ext: Ext::new(),
        },
    )
    .unwrap();
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
        .publish(topics::ATTESTATIONS, att.as_bytes().to_vec())
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
    for node in &nodes {
        node.client.shutdown().await.unwrap();
    }
}
