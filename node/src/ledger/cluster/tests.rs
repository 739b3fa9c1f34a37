//! A three-member ledger cluster over real libp2p (loopback TCP) and real sled on disk: it
//! forms, follows redirects, loses its leader and goes on, takes back a member restarted
//! with its disk, and keeps a member whose disk was wiped out of the vote until it is re-added.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpux_protocol::{
    ContentId, EscrowId, EscrowLock, Ext, Keypair, LedgerRecord, MicroCredits, Signed,
};
use libp2p::multiaddr::Protocol;

use super::*;
use crate::ledger::LedgerClient;
use crate::p2p::{self, NetConfig, NetworkEvent, Proto};
use crate::store::SledStore;

struct Running {
    cluster: Arc<LedgerCluster<SledStore>>,
    net: Client,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn net_config(port: u16) -> NetConfig {
    NetConfig {
        listen: vec![format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap()],
        kademlia: false,
        ..NetConfig::default()
    }
}

/// Starts member `key` on `port` over the store in `dir`, answering raft and ledger
/// requests from its own task.
async fn start(
    key: &Keypair,
    port: u16,
    dir: &std::path::Path,
    members: &[Multiaddr],
    bootstrap: bool,
) -> Running {
    // A member restarted on its port waits for its previous listener to close.
    let started = Instant::now();
    let (net, mut events) = loop {
        match p2p::spawn(key, net_config(port)).await {
            Ok(spawned) => break spawned,
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                tracing::debug!("{e}; trying again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let store = Arc::new(SledStore::open(dir).unwrap());
    let cluster = Arc::new(
        LedgerCluster::start(
            key.clone(),
            LedgerConfig::default(),
            store,
            net.clone(),
            &ClusterConfig {
                members: members.to_vec(),
                bootstrap,
            },
        )
        .await
        .unwrap(),
    );
    let (c, n) = (cluster.clone(), net.clone());
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let NetworkEvent::Request {
                id,
                proto,
                peer,
                data,
            } = event
            {
                let (c, n) = (c.clone(), n.clone());
                tokio::spawn(async move {
                    let answer = match proto {
                        Proto::Raft => c.serve_raft(peer, data).await,
                        Proto::Ledger => {
                            ledger_wire::encode(&c.handle(&data, crate::attest::now()).await)
                        }
                        _ => Vec::new(),
                    };
                    let _ = n.respond(id, answer).await;
                });
            }
        }
    });
    Running { cluster, net }
}

fn all(r: &[Option<Running>]) -> Vec<&Running> {
    r.iter().flatten().collect()
}

async fn stop(member: Running) {
    member.cluster.shutdown().await;
    let _ = member.net.shutdown().await;
}

async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn voters(member: &Running) -> Vec<NodeId> {
    member
        .cluster
        .raft()
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect()
}

fn leader_of(members: &[&Running]) -> Option<usize> {
    members.iter().position(|m| {
        let metrics = m.cluster.raft().metrics().borrow().clone();
        metrics.current_leader == Some(metrics.id)
    })
}

fn balance(member: &Running, account: &Keypair) -> u64 {
    member
        .cluster
        .state()
        .read(|m| m.ledger().balance(&account.public()).0)
}

fn lock(renter: &Keypair, host: &Keypair, escrow: u8, amount: u64) -> Vec<u8> {
    Signed::sign(
        renter,
        EscrowLock {
            escrow: EscrowId([escrow; 16]),
            lease: ContentId([escrow; 32]),
            payer: renter.public(),
            payee: host.public(),
            amount: MicroCredits(amount),
            price_per_gpu_hour: MicroCredits(3_600_000),
            created_at: crate::attest::now(),
            ext: Ext::new(),
        },
    )
    .unwrap()
    .as_bytes()
    .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_survives_its_leader_and_keeps_a_wiped_member_out_of_the_vote() {
    let keys: Vec<Keypair> = (0..3).map(|i| Keypair::from_seed(&[90 + i; 32])).collect();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let members: Vec<Multiaddr> = keys
        .iter()
        .zip(&ports)
        .map(|(k, port)| {
            let peer: PeerId = k.public().peer_id().to_string().parse().unwrap();
            format!("/ip4/127.0.0.1/tcp/{port}")
                .parse::<Multiaddr>()
                .unwrap()
                .with(Protocol::P2p(peer))
        })
        .collect();
    let mut running = Vec::new();
    for i in 0..3 {
        running.push(Some(
            start(&keys[i], ports[i], dirs[i].path(), &members, i == 0).await,
        ));
    }

    // The first member forms the cluster and takes the others in: three voters.
    wait_for("three voters", Duration::from_secs(30), || {
        all(&running).iter().all(|m| voters(m).len() == 3)
    })
    .await;
    let first_leader = leader_of(&all(&running)).expect("a leader");

    // A stranger is not answered on /gpux/raft/1.
    let stranger = Keypair::from_seed(&[99; 32]);
    let (stranger_net, _events) = p2p::spawn(&stranger, net_config(0)).await.unwrap();
    let peer0 = match members[0].iter().last() {
        Some(Protocol::P2p(p)) => p,
        _ => unreachable!(),
    };
    let reply = network::call(
        &stranger_net,
        peer0,
        Some(&members[0]),
        &Addressed {
            to: None,
            rpc: RaftRpc::Hello,
        },
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert!(matches!(reply, RaftReply::Refused(_)), "{reply:?}");

    // Minting and a lock through a follower: the client follows the redirect; every member
    // applies the same operations.
    let (renter, host) = (Keypair::from_seed(&[7; 32]), Keypair::from_seed(&[8; 32]));
    let leader = running[first_leader].as_ref().unwrap();
    let minted = leader
        .cluster
        .mint(
            renter.public(),
            MicroCredits(10_000_000),
            crate::attest::now(),
        )
        .await
        .unwrap();
    assert!(matches!(minted, LedgerResponse::Record(_)), "{minted:?}");
    let follower = (first_leader + 1) % 3;
    let client = LedgerClient::new(stranger_net.clone(), members[follower].clone()).unwrap();
    let answer = client
        .call(&LedgerRequest::Submit(lock(&renter, &host, 1, 2_000_000)))
        .await
        .unwrap();
    // The same record under a majority of the members' own signatures, the leader's first.
    let LedgerResponse::Cosigned(copies) = answer.clone() else {
        panic!("{answer:?}");
    };
    assert!(copies.len() >= 2, "{copies:?}");
    let records: Vec<_> = copies
        .iter()
        .map(|c| {
            Signed::<LedgerRecord>::from_bytes(c.clone())
                .and_then(Signed::verify)
                .unwrap()
        })
        .collect();
    assert_eq!(records[0].signer(), keys[first_leader].public());
    assert!(records.iter().all(|r| **r == *records[0]));
    let signers: std::collections::BTreeSet<_> = records.iter().map(|r| r.signer()).collect();
    assert_eq!(signers.len(), copies.len());
    let member_keys: Vec<_> = keys.iter().map(Keypair::public).collect();
    assert!(matches!(
        gpux_lease::LedgerVerdict::from_response(answer, &member_keys),
        gpux_lease::LedgerVerdict::Applied(_)
    ));
    // One member's signature alone is not the ledger's word.
    for alone in [
        LedgerResponse::Cosigned(copies[..1].to_vec()),
        LedgerResponse::Cosigned(vec![copies[0].clone(), copies[0].clone()]),
        LedgerResponse::Record(copies[0].clone()),
    ] {
        assert!(matches!(
            gpux_lease::LedgerVerdict::from_response(alone, &member_keys),
            gpux_lease::LedgerVerdict::Unreachable
        ));
    }
    wait_for("every member applied both", Duration::from_secs(10), || {
        all(&running)
            .iter()
            .all(|m| balance(m, &renter) == 8_000_000)
    })
    .await;

    // The leader dies: a client that knew it as the leader rides out the election in one
    // call (asking the others again while they have no leader), and a new leader is there
    // within 5 s.
    let client = LedgerClient::cluster(stranger_net.clone(), members.to_vec()).unwrap();
    client
        .call(&LedgerRequest::Balance(renter.public()))
        .await
        .unwrap();
    stop(running[first_leader].take().unwrap()).await;
    let lost = Instant::now();
    let answer = client
        .call(&LedgerRequest::Submit(lock(&renter, &host, 2, 1_000_000)))
        .await;
    assert!(
        matches!(answer, Ok(LedgerResponse::Cosigned(_))),
        "a lock right after the leader's loss: {answer:?} after {:?}",
        lost.elapsed()
    );
    wait_for("a new leader", Duration::from_secs(5), || {
        leader_of(&all(&running)).is_some()
    })
    .await;
    let survivors: Vec<usize> = (0..3).filter(|&i| i != first_leader).collect();

    // It comes back with its disk: it catches up (7 of 10 left), and credits are conserved.
    let i = first_leader;
    running[i] = Some(start(&keys[i], ports[i], dirs[i].path(), &members, i == 0).await);
    wait_for(
        "the restarted member caught up",
        Duration::from_secs(15),
        || balance(running[i].as_ref().unwrap(), &renter) == 7_000_000,
    )
    .await;
    for m in all(&running) {
        m.cluster.state().read(|machine| {
            let ledger = machine.ledger();
            assert_eq!(ledger.minted().0, 10_000_000);
            assert_eq!(ledger.total(), 10_000_000);
        });
    }

    // A member whose disk was wiped comes back under a new node id: it is not taken back
    // into the vote until the operator re-adds it, then it catches up.
    let wiped = survivors[1];
    let old_id = running[wiped].as_ref().unwrap().cluster.id();
    stop(running[wiped].take().unwrap()).await;
    let fresh = tempfile::tempdir().unwrap();
    running[wiped] = Some(start(&keys[wiped], ports[wiped], fresh.path(), &members, false).await);
    let new_id = running[wiped].as_ref().unwrap().cluster.id();
    assert_ne!(new_id, old_id);
    wait_for("a leader among the others", Duration::from_secs(10), || {
        all(&running)
            .iter()
            .filter(|m| m.cluster.id() != new_id)
            .any(|m| {
                let metrics = m.cluster.raft().metrics().borrow().clone();
                metrics.current_leader == Some(metrics.id)
            })
    })
    .await;
    // Time for the leader to have tried to take the new id in, as it would a new member.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let others: Vec<&Running> = all(&running)
        .into_iter()
        .filter(|m| m.cluster.id() != new_id)
        .collect();
    for m in &others {
        let v = voters(m);
        assert!(!v.contains(&new_id), "the wiped member votes: {v:?}");
    }
    assert_eq!(balance(running[wiped].as_ref().unwrap(), &renter), 0);
    let leader = others
        .iter()
        .find(|m| {
            let metrics = m.cluster.raft().metrics().borrow().clone();
            metrics.current_leader == Some(metrics.id)
        })
        .expect("a leader");
    let peer = match members[wiped].iter().last() {
        Some(Protocol::P2p(p)) => p,
        _ => unreachable!(),
    };
    assert_eq!(leader.cluster.readd(peer).await.unwrap(), new_id);
    let v = voters(leader);
    assert!(v.contains(&new_id) && !v.contains(&old_id), "{v:?}");
    wait_for(
        "the re-added member caught up",
        Duration::from_secs(15),
        || balance(running[wiped].as_ref().unwrap(), &renter) == 7_000_000,
    )
    .await;

    for m in running.into_iter().flatten() {
        stop(m).await;
    }
    let _ = stranger_net.shutdown().await;
}
