//! Lease negotiation: the host is the authority over its GPUs.

use gpux_lease::{Answer, ContainerState, HostBook, HostLease, HostPhase, Timing};
use gpux_node::attest::now;
use gpux_node::p2p::{self, NetConfig, NetworkEvent};
use gpux_node::store::NodeState;
use gpux_protocol::*;
use gpux_testkit as kit;
use libp2p::multiaddr::Protocol;
use tokio::sync::mpsc;

fn offer(host: &Keypair, t: Timestamp, gpus: u8) -> Verified<Offer> {
    kit::sign(
        host,
        Offer {
            expires_at: t.plus_secs(3000),
            attestation: ContentId([9; 32]),
            price_per_gpu_hour: MicroCredits(1_500_000),
            min_duration_s: 60,
            driver: Version::new(550, 0, 0),
            cuda: Version::new(12, 4, 0),
            images: kit::list([ImageDigest([1; 32])]),
            ..kit::offer(t, (0..gpus).map(|g| kit::a100(kit::gpu(g + 1))))
        },
    )
}

fn request(
    renter: &Keypair,
    offer: &Verified<Offer>,
    t: Timestamp,
    nonce: u64,
) -> Verified<LeaseRequest> {
    let mut escrow = [0u8; 16];
    escrow[..8].copy_from_slice(&nonce.to_le_bytes());
    kit::sign(
        renter,
        LeaseRequest {
            duration_s: 600,
            image: ImageDigest([1; 32]),
            limits: ResourceLimits {
                scratch_bytes: 1 << 28,
                shm_bytes: 1 << 28,
                ..kit::limits()
            },
            escrow: EscrowId(escrow),
            escrow_amount: MicroCredits(1_000_000),
            ..kit::request(offer, t)
        },
    )
}

/// A host book and its store, as the node's shell keeps them: offers and leases are stored
/// as the book decides, and a new process restores them.
fn open_host(
    key: &Keypair,
    dir: &std::path::Path,
    t: Timestamp,
) -> (HostBook, NodeState<gpux_node::store::SledStore>) {
    let state = NodeState::open(dir).unwrap();
    let mut book = HostBook::new(key.clone(), Timing::default());
    let offers = state
        .own_offers()
        .unwrap()
        .into_iter()
        .map(|b| Signed::<Offer>::from_bytes(b).unwrap().verify().unwrap())
        .collect();
    let leases: Vec<HostLease> = state
        .host_leases()
        .unwrap()
        .into_iter()
        .map(|(_, rec)| {
            HostLease::restore(key.clone(), rec, ContainerState::Absent, t)
                .unwrap()
                .0
        })
        .collect();
    let answered: Vec<(ContentId, Timestamp)> = leases
        .iter()
        .map(|l| (l.id(), l.request().expires_at))
        .collect();
    book.restore(offers, &leases, answered, t);
    (book, state)
}

fn handle(
    book: &mut HostBook,
    state: &NodeState<gpux_node::store::SledStore>,
    request: &Verified<LeaseRequest>,
    t: Timestamp,
) -> Answer {
    let answer = book.handle_request(request.clone(), t, false);
    if let Answer::Accepted { lease, .. } = &answer {
        state.save_host_lease(&lease.id(), lease.record()).unwrap();
    }
    answer
}

#[test]
fn a_restarted_host_keeps_its_leases_and_offers() {
    let tmp = tempfile::tempdir().unwrap();
    let key = Keypair::from_seed(&[21; 32]);
    let t = now();
    let o = offer(&key, t, 2);
    let first = {
        let (mut book, state) = open_host(&key, tmp.path(), t);
        let change = book.add_offer(o.clone(), t);
        let (id, bytes) = change.store.unwrap();
        state.save_own_offer(&id, &bytes).unwrap();
        let answer = handle(
            &mut book,
            &state,
            &request(&Keypair::from_seed(&[22; 32]), &o, t, 1),
            t,
        );
        let Answer::Accepted { lease, .. } = answer else {
            panic!("{answer:?}");
        };
        lease.id()
    };
    // A new process on the same data dir: the lease still holds its GPUs (it waits for its
    // escrow lock), so the same GPUs are not leased twice.
    let (mut book, state) = open_host(&key, tmp.path(), t);
    assert_eq!(book.offers().len(), 1);
    let leases = state.host_leases().unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].1.phase, HostPhase::AwaitingLock);
    let again = handle(
        &mut book,
        &state,
        &request(&Keypair::from_seed(&[23; 32]), &o, t, 2),
        t,
    );
    assert!(
        matches!(
            again,
            Answer::Rejected {
                reason: RejectReason::GpusUnavailable,
                ..
            }
        ),
        "{again:?}"
    );
    // Once the lease frees its GPUs, they can be leased again.
    book.release(&first);
    let after = handle(
        &mut book,
        &state,
        &request(&Keypair::from_seed(&[23; 32]), &o, t, 3),
        t,
    );
    assert!(matches!(after, Answer::Accepted { .. }));
    // The same request twice is not a second lease.
    let twice = handle(
        &mut book,
        &state,
        &request(&Keypair::from_seed(&[23; 32]), &o, t, 3),
        t,
    );
    assert!(
        matches!(
            twice,
            Answer::Rejected {
                reason: RejectReason::Invalid,
                ..
            }
        ),
        "{twice:?}"
    );
}

#[test]
fn bad_requests_get_typed_rejections() {
    let key = Keypair::from_seed(&[31; 32]);
    let t = now();
    let o = offer(&key, t, 1);
    let mut host = HostBook::new(key, Timing::default());
    host.add_offer(o.clone(), t);
    let renter = Keypair::from_seed(&[32; 32]);
    let reason = |a: Answer| match a {
        Answer::Rejected { reason, envelope } => {
            assert!(!envelope.is_empty());
            reason
        }
        other => panic!("accepted: {other:?}"),
    };
    let mut cheap = request(&renter, &o, t, 1).body().clone();
    cheap.price_per_gpu_hour = MicroCredits(1);
    cheap.escrow_amount = MicroCredits(1_000_000);
    let cheap = Signed::sign(&renter, cheap).unwrap();
    assert_eq!(
        reason(host.handle_request(cheap, t, false)),
        RejectReason::PriceTooLow
    );
    let late = request(&renter, &o, t, 2);
    assert_eq!(
        reason(host.handle_request(late, t.plus_secs(31), false)),
        RejectReason::RequestExpired
    );
    let other_host = offer(&Keypair::from_seed(&[33; 32]), t, 1);
    let wrong = request(&renter, &other_host, t, 3);
    assert_eq!(
        reason(host.handle_request(wrong, t, false)),
        RejectReason::Invalid
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_renters_racing_for_the_same_gpus_get_exactly_one_lease_each_time() {
    let tmp = tempfile::tempdir().unwrap();
    let host_key = Keypair::from_seed(&[41; 32]);
    let t = now();
    let o = offer(&host_key, t, 2);
    let _ = &tmp;
    let mut host = HostBook::new(host_key.clone(), Timing::default());
    host.add_offer(o.clone(), t);

    let config = || NetConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        ..NetConfig::default()
    };
    let (host_net, mut host_events) = p2p::spawn(&host_key, config()).await.unwrap();
    let host_addr = loop {
        if let Some(NetworkEvent::Listening(a)) = host_events.recv().await {
            break a.with(Protocol::P2p(host_net.local_peer_id()));
        }
    };
    // The host task answers requests one at a time and ends leases on demand.
    let (end_tx, mut end_rx) = mpsc::channel::<(ContentId, tokio::sync::oneshot::Sender<()>)>(8);
    let responder = host_net.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(event) = host_events.recv() => {
                    if let NetworkEvent::Request { id, data, .. } = event {
                        let request = Signed::<LeaseRequest>::from_bytes(data).unwrap().verify().unwrap();
                        let answer = host.handle_request(request, now(), false);
                        responder.respond(id, answer.envelope().to_vec()).await.unwrap();
                    }
                }
                Some((lease, done)) = end_rx.recv() => {
                    host.release(&lease);
                    let _ = done.send(());
                }
                else => break,
            }
        }
    });

    let mut renters = Vec::new();
    for i in 0..2u8 {
        let key = Keypair::from_seed(&[50 + i; 32]);
        let (net, mut events) = p2p::spawn(&key, config()).await.unwrap();
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        net.dial(host_addr.clone()).await.unwrap();
        renters.push((key, net));
    }
    let host_peer = host_net.local_peer_id();
    for round in 0..100u64 {
        let at = now();
        let a = request(&renters[0].0, &o, at, round * 2);
        let b = request(&renters[1].0, &o, at, round * 2 + 1);
        let (ra, rb) = tokio::join!(
            renters[0].1.request(host_peer, a.as_bytes().to_vec()),
            renters[1].1.request(host_peer, b.as_bytes().to_vec())
        );
        let mut accepted = Vec::new();
        for (req, resp) in [(&a, ra.unwrap()), (&b, rb.unwrap())] {
            match AnySigned::from_bytes(resp).unwrap().verify().unwrap() {
                AnyVerified::LeaseAccept(acc) => {
                    validate::accept_matches_request(&acc, req).unwrap();
                    accepted.push(req.id());
                }
                AnyVerified::LeaseReject(rej) => {
                    assert_eq!(rej.reason, RejectReason::GpusUnavailable)
                }
                other => panic!("unexpected answer {other:?}"),
            }
        }
        assert_eq!(
            accepted.len(),
            1,
            "round {round}: {} leases",
            accepted.len()
        );
        let (done, ended) = tokio::sync::oneshot::channel();
        end_tx.send((accepted[0], done)).await.unwrap();
        ended.await.unwrap();
    }
}
