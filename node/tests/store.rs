//! The node database on a real sled on disk.

use gpux_lease::{HostLease, HostPhase, HostRecord, Timing};
use gpux_node::store::{NodeState, SledStore, Store, StoreError, Tree};
use gpux_protocol::*;
use gpux_testkit as kit;

/// A host's record of lease `n`, as accepted.
fn record(n: u8) -> (ContentId, HostRecord) {
    let host = Keypair::from_seed(&[1; 32]);
    let renter = Keypair::from_seed(&[2; 32]);
    let request = kit::sign(
        &renter,
        LeaseRequest {
            duration_s: 60,
            escrow: EscrowId([n; 16]),
            escrow_amount: MicroCredits(60_000),
            ..kit::request_to(
                host.public(),
                ContentId([n; 32]),
                [GpuUuid::Gpu([n; 16])],
                MicroCredits(3_600_000),
                Timestamp(1000),
            )
        },
    );
    let accept = kit::sign(&host, kit::accept(request.id(), Timestamp(1001)));
    let (lease, _) = HostLease::accepted(host, request, &accept, Timing::default(), Vec::new());
    (lease.id(), lease.record().clone())
}

#[test]
fn leases_offers_and_snapshot_survive_a_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, mut first) = record(1);
    let (two, second) = record(2);
    {
        let state = NodeState::open(tmp.path()).unwrap();
        state.save_host_lease(&one, &first).unwrap();
        state.save_host_lease(&two, &second).unwrap();
        first.phase = HostPhase::Settled;
        state.save_host_lease(&one, &first).unwrap();
        state
            .save_own_offer(&ContentId([5; 32]), b"offer-envelope")
            .unwrap();
        state
            .snapshot_offer(&ContentId([6; 32]), b"market-offer")
            .unwrap();
        state.set_config("listen", b"/ip4/127.0.0.1/tcp/0").unwrap();
        state.store().flush().unwrap();
    }
    let state = NodeState::open(tmp.path()).unwrap();
    let mut leases = state.host_leases().unwrap();
    leases.sort_by_key(|(id, _)| id.0);
    let mut expected = vec![(one, first), (two, second)];
    expected.sort_by_key(|(id, _)| id.0);
    assert_eq!(leases, expected);
    assert_eq!(
        state.host_lease(&one).unwrap().unwrap().phase,
        HostPhase::Settled
    );
    assert!(state.renter_leases().unwrap().is_empty());
    assert_eq!(
        state.own_offers().unwrap(),
        vec![b"offer-envelope".to_vec()]
    );
    assert_eq!(
        state.market_snapshot().unwrap(),
        vec![b"market-offer".to_vec()]
    );
    assert_eq!(
        state.config("listen").unwrap().as_deref(),
        Some(&b"/ip4/127.0.0.1/tcp/0"[..])
    );
}

#[test]
fn the_in_memory_store_keeps_what_sled_keeps() {
    let state = NodeState::in_memory();
    let (id, rec) = record(3);
    state.save_host_lease(&id, &rec).unwrap();
    assert_eq!(state.host_leases().unwrap(), vec![(id, rec)]);
    state
        .save_receipt(&id, 1, b"receipt", Some(b"ack"))
        .unwrap();
    assert_eq!(
        state.receipts(&id).unwrap(),
        vec![(b"receipt".to_vec(), Some(b"ack".to_vec()))]
    );
}

#[test]
fn a_database_that_comes_back_empty_is_refused_not_started_afresh() {
    let tmp = tempfile::tempdir().unwrap();
    let (id, rec) = record(4);
    {
        let state = NodeState::open(tmp.path()).unwrap();
        state.save_host_lease(&id, &rec).unwrap();
    }
    assert!(tmp.path().join(gpux_node::store::MANIFEST_FILE).exists());
    // Reopening is fine.
    drop(NodeState::open(tmp.path()).unwrap());
    // The database is lost (deleted here; a damaged one sled opens as empty looks the same).
    std::fs::remove_dir_all(tmp.path().join("db")).unwrap();
    let err = NodeState::open(tmp.path()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("came back empty") && text.contains("db.manifest"),
        "{text}"
    );
    // It stays refused (the failed open created nothing that would hide the loss).
    assert!(NodeState::open(tmp.path()).is_err());
    // Only moving the manifest away starts afresh, knowingly.
    std::fs::remove_file(tmp.path().join(gpux_node::store::MANIFEST_FILE)).unwrap();
    let fresh = NodeState::open(tmp.path()).unwrap();
    assert!(fresh.host_leases().unwrap().is_empty());
}

#[test]
fn a_database_behind_its_manifest_is_refused_one_ahead_is_fine() {
    let tmp = tempfile::tempdir().unwrap();
    let older = tempfile::tempdir().unwrap();
    {
        let state = NodeState::open(tmp.path()).unwrap();
        let (id, rec) = record(5);
        state.save_host_lease(&id, &rec).unwrap();
    }
    // An operator's copy of the database, taken now.
    copy_dir(&tmp.path().join("db"), &older.path().join("db"));
    {
        let state = NodeState::open(tmp.path()).unwrap();
        let (id, rec) = record(6);
        state.save_host_lease(&id, &rec).unwrap();
        assert_eq!(state.host_leases().unwrap().len(), 2);
    }
    let manifest =
        std::fs::read_to_string(tmp.path().join(gpux_node::store::MANIFEST_FILE)).unwrap();
    assert!(manifest.contains("\nwrites "), "{manifest}");
    // The older copy put back in place of the database: a lease would be lost, so refused.
    std::fs::remove_dir_all(tmp.path().join("db")).unwrap();
    copy_dir(&older.path().join("db"), &tmp.path().join("db"));
    let err = NodeState::open(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("older copy or lost writes"), "{err}");
    assert!(err.contains("db.manifest"), "{err}");
    // A database ahead of its manifest (a crash between the flush and the manifest) opens.
    std::fs::write(
        tmp.path().join(gpux_node::store::MANIFEST_FILE),
        "gpux database manifest: this data dir holds a database in db/\nwrites 1\n",
    )
    .unwrap();
    let state = NodeState::open(tmp.path()).unwrap();
    assert_eq!(state.host_leases().unwrap().len(), 1);
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_second_node_on_the_same_data_dir_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let _first = NodeState::open(tmp.path()).unwrap();
    let err = NodeState::open(tmp.path()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&tmp.path().join("db").display().to_string()),
        "{text}"
    );
    assert!(text.contains("another gpux node"), "{text}");
}

#[test]
fn a_damaged_record_is_an_error_naming_the_database() {
    let tmp = tempfile::tempdir().unwrap();
    let state = NodeState::open(tmp.path()).unwrap();
    state
        .store()
        .put(
            Tree::HostLeases,
            &[7; 32],
            &[9, 9, 9],
            gpux_node::store::Durability::Flush,
        )
        .unwrap();
    let err = state.host_leases().unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Corrupt {
                tree: "host-leases",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("record format 9 is not supported"),
        "{err}"
    );
    state
        .store()
        .put(
            Tree::HostLeases,
            &[7; 32],
            &[1, 0xff, 0xff],
            gpux_node::store::Durability::Flush,
        )
        .unwrap();
    assert!(matches!(
        state.host_leases().unwrap_err(),
        StoreError::Corrupt { .. }
    ));
}

#[test]
fn a_damaged_database_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let state = NodeState::open(tmp.path()).unwrap();
        for n in 0..50 {
            let (id, rec) = record(n);
            state.save_host_lease(&id, &rec).unwrap();
        }
    }
    // Overwrite every file of the database with garbage.
    let db = tmp.path().join("db");
    let mut damaged = 0;
    for entry in walk(&db) {
        let len = std::fs::metadata(&entry).unwrap().len().max(64) as usize;
        std::fs::write(&entry, vec![0xa5; len]).unwrap();
        damaged += 1;
    }
    assert!(damaged > 0);
    match SledStore::open(&db) {
        Err(err) => assert!(err.to_string().contains(&db.display().to_string()), "{err}"),
        // sled may treat fully unreadable segments as empty; reading must not panic either.
        Ok(store) => {
            let _ = store.scan(Tree::HostLeases);
        }
    }
    // Whatever sled makes of it, the node's state never opens as if nothing had been there.
    let err = NodeState::open(tmp.path()).unwrap_err();
    assert!(err.to_string().contains(&db.display().to_string()), "{err}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
