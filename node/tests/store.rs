//! The node database on a real sled on disk.

use gpux_node::store::{
    LeaseRecord, LeaseState, NodeState, Role, SledStore, Store, StoreError, Tree,
};
use gpux_protocol::{ContentId, Timestamp};

fn record(n: u8) -> LeaseRecord {
    LeaseRecord {
        lease: [n; 32],
        role: Role::Host,
        request: vec![1, 2, 3, n],
        accept: None,
        state: LeaseState::Accepted,
        updated_at: 1000,
    }
}

#[test]
fn leases_offers_and_snapshot_survive_a_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let state = NodeState::open(tmp.path()).unwrap();
        state.save_lease(&record(1)).unwrap();
        state.save_lease(&record(2)).unwrap();
        assert!(
            state
                .set_lease_state(
                    &ContentId([1; 32]),
                    LeaseState::Ended {
                        reason: "renter-stopped".into()
                    },
                    Timestamp(2000)
                )
                .unwrap()
        );
        assert!(
            !state
                .set_lease_state(&ContentId([9; 32]), LeaseState::Running, Timestamp(2000))
                .unwrap()
        );
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
    let leases = state.leases().unwrap();
    assert_eq!(leases.len(), 2);
    assert_eq!(
        leases[0].state,
        LeaseState::Ended {
            reason: "renter-stopped".into()
        }
    );
    assert_eq!(leases[0].updated_at, 2000);
    assert_eq!(leases[1], record(2));
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
            Tree::Leases,
            &[7; 32],
            &[9, 9, 9],
            gpux_node::store::Durability::Flush,
        )
        .unwrap();
    let err = state.leases().unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { tree: "leases", .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("record format 9 is not supported"),
        "{err}"
    );
    state
        .store()
        .put(
            Tree::Leases,
            &[7; 32],
            &[1, 0xff, 0xff],
            gpux_node::store::Durability::Flush,
        )
        .unwrap();
    assert!(matches!(
        state.leases().unwrap_err(),
        StoreError::Corrupt { .. }
    ));
}

#[test]
fn a_damaged_database_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let state = NodeState::open(tmp.path()).unwrap();
        for n in 0..50 {
            state.save_lease(&record(n)).unwrap();
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
        // sled may treat fully unreadable segments as empty; then the data is gone but the
        // node did not panic, and reading must not panic either.
        Ok(store) => {
            let _ = store.scan(Tree::Leases);
        }
    }
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
