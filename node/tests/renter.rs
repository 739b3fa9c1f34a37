//! A renter daemon against a rogue host (a raw libp2p peer holding the host's key): the
//! renter countersigns only receipts within what it agreed, measured by its own clock.

use std::time::Duration;

use gpux_lease::{RenterLease, RenterPhase, Timing};
use gpux_node::attest::now;
use gpux_node::daemon::DaemonConfig;
use gpux_node::p2p::{self, NetConfig, Proto};
use gpux_node::store::NodeState;
use gpux_protocol::*;
use gpux_testkit as kit;
use libp2p::multiaddr::Protocol;

/// 3.60 credits per GPU-hour: 1000 micro-credits per GPU-second.
const PRICE: MicroCredits = MicroCredits(3_600_000);

fn receipt(
    host: &Keypair,
    lease: ContentId,
    escrow: EscrowId,
    price: MicroCredits,
    seq: u64,
    gpu_seconds: u64,
) -> Vec<u8> {
    kit::sign(
        host,
        kit::receipt(lease, escrow, price, seq, gpu_seconds, now()),
    )
    .as_bytes()
    .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renter_refuses_receipts_above_what_it_agreed_and_acknowledges_fair_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("renter");
    let (renter_key, _) = gpux_node::init_key(&dir).unwrap();
    let host_key = Keypair::from_seed(&[7; 32]);
    let t = now();
    let escrow = EscrowId([5; 16]);
    let request = kit::sign(
        &renter_key,
        LeaseRequest {
            image: ImageDigest([1; 32]),
            escrow,
            ..kit::request_to(
                host_key.public(),
                ContentId([1; 32]),
                [GpuUuid::Gpu([3; 16])],
                PRICE,
                t,
            )
        },
    );
    let lease = request.id();
    {
        // The renter agreed this lease and asked the host to start it 10 s ago.
        let state = NodeState::open(&dir).unwrap();
        let accept = Signed::sign(&host_key, Timing::default().accept(lease, t, None)).unwrap();
        let ledger = Keypair::from_seed(&[9; 32]).public();
        let (renter, _) = RenterLease::accepted(
            renter_key.clone(),
            request.clone(),
            &accept,
            ledger,
            Timestamp(t.0 - 10_000),
        )
        .unwrap();
        let mut record = renter.record().clone();
        record.phase = RenterPhase::Running;
        record.confirmed = true;
        record.last_contact = t;
        state.save_renter_lease(&lease, &record).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen: libp2p::Multiaddr = format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap();
    let config = DaemonConfig {
        data_dir: dir.clone(),
        listen: vec![listen.clone()],
        bootstrap: vec![],
        api: "127.0.0.1:0".parse().unwrap(),
        metrics: None,
        mdns: false,
        host: None,
        ledger: Vec::new(),
        ledger_cluster: None,
        serve_ledger: None,
        timing: Timing::default(),
        challenge_references: Default::default(),
        market_families: None,
        link_delay: None,
        market_auto: false,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(gpux_node::daemon::run(config, async {
        let _ = stop_rx.await;
    }));
    for _ in 0..100 {
        if dir.join("api.addr").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The rogue host.
    let (net, mut events) = p2p::spawn(
        &host_key,
        NetConfig {
            listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
            ..NetConfig::default()
        },
    )
    .await
    .unwrap();
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let renter_peer = libp2p::PeerId::from_bytes(&renter_key.peer_id().to_bytes()).unwrap();
    net.dial(listen.with(Protocol::P2p(renter_peer)))
        .await
        .unwrap();
    let send = |bytes: Vec<u8>| {
        let net = net.clone();
        async move {
            let answer = net
                .request_on(Proto::Receipt, renter_peer, bytes)
                .await
                .unwrap();
            AnySigned::from_bytes(answer)
                .and_then(AnySigned::verify)
                .unwrap()
        }
    };
    let disputed = |answer: &AnyVerified| matches!(answer, AnyVerified::LeaseEnd(end) if end.reason == EndReason::ReceiptDisputed);

    // A fair receipt: the 60 s minimum at the agreed price.
    match send(receipt(&host_key, lease, escrow, PRICE, 1, 60)).await {
        AnyVerified::ReceiptAck(ack) => {
            assert_eq!(ack.signer(), renter_key.public());
            assert_eq!((ack.seq, ack.amount_due), (1, MicroCredits(60_000)));
        }
        other => panic!("a fair receipt was not acknowledged: {other:?}"),
    }
    // Above the agreed price.
    let doubled = MicroCredits(PRICE.0 * 2);
    let answer = send(receipt(&host_key, lease, escrow, doubled, 2, 60)).await;
    assert!(disputed(&answer), "{answer:?}");
    // More time than the renter's own clock allows (about 10 s have passed: at most the
    // 60 s minimum can be due).
    let answer = send(receipt(&host_key, lease, escrow, PRICE, 2, 100)).await;
    assert!(disputed(&answer), "{answer:?}");
    // Dated ahead of the renter's clock, claiming the whole lease at once.
    let mut body =
        Signed::<UsageReceipt>::from_bytes(receipt(&host_key, lease, escrow, PRICE, 2, 120))
            .unwrap()
            .verify()
            .unwrap()
            .body()
            .clone();
    body.created_at = now().plus_secs(110);
    let ahead = Signed::sign(&host_key, body).unwrap().as_bytes().to_vec();
    let answer = send(ahead).await;
    assert!(disputed(&answer), "{answer:?}");
    // Signed by someone else than the lease's host: no answer at all (a signed dispute
    // could be replayed to the host to stop the lease).
    let stranger = Keypair::from_seed(&[8; 32]);
    let answer = net
        .request_on(
            Proto::Receipt,
            renter_peer,
            receipt(&stranger, lease, escrow, PRICE, 2, 60),
        )
        .await
        .unwrap();
    assert!(answer.is_empty());
    // Another escrow.
    let answer = send(receipt(&host_key, lease, EscrowId([6; 16]), PRICE, 2, 60)).await;
    assert!(disputed(&answer), "{answer:?}");

    // Only the fair receipt was countersigned and stored.
    let api = gpux_client::ApiClient::for_data_dir(&dir).unwrap();
    let receipts = tokio::task::spawn_blocking(move || api.receipts(&lease.to_string()).unwrap())
        .await
        .unwrap();
    assert_eq!(receipts.receipts.len(), 1, "{receipts:?}");
    assert!(receipts.receipts[0].acked);
    assert_eq!(receipts.lease.acked_amount, 60_000);
    let _ = stop_tx.send(());
    daemon.await.unwrap().unwrap();
}
