//! The ledger service over a real sled on disk.

use gpux_protocol::{BoundedBytes, ContentId, EscrowLock, Redeem, Release};

use super::*;
use crate::store::{NodeState, SledStore};
use gpux_protocol::EscrowId;
use gpux_protocol::ledger_wire::{self, LedgerRequest};
use gpux_protocol::{Ext, LedgerEntry, LedgerRecord, Signed, Verified};
use gpux_testkit as kit;

const PRICE: MicroCredits = MicroCredits(3_600_000);

struct Parties {
    ledger: Keypair,
    renter: Keypair,
    host: Keypair,
    lease: ContentId,
    escrow: EscrowId,
}

fn parties() -> Parties {
    Parties {
        ledger: Keypair::from_seed(&[1; 32]),
        renter: Keypair::from_seed(&[2; 32]),
        host: Keypair::from_seed(&[3; 32]),
        lease: ContentId([4; 32]),
        escrow: EscrowId([5; 16]),
    }
}

fn open(dir: &std::path::Path, p: &Parties) -> LedgerService<SledStore> {
    let state = NodeState::open(dir).unwrap();
    LedgerService::open(p.ledger.clone(), state, LedgerConfig::default()).unwrap()
}

fn lock(p: &Parties, amount: u64) -> Vec<u8> {
    Signed::sign(
        &p.renter,
        EscrowLock {
            escrow: p.escrow,
            lease: p.lease,
            payer: p.renter.public(),
            payee: p.host.public(),
            amount: MicroCredits(amount),
            price_per_gpu_hour: PRICE,
            created_at: Timestamp(1),
            ext: Ext::new(),
        },
    )
    .unwrap()
    .as_bytes()
    .to_vec()
}

fn redeem(p: &Parties, seq: u64, gpu_seconds: u64) -> Vec<u8> {
    let receipt = kit::sign(
        &p.host,
        kit::receipt(p.lease, p.escrow, PRICE, seq, gpu_seconds, Timestamp(2)),
    );
    let ack = Signed::sign(
        &p.renter,
        gpux_protocol::ReceiptAck {
            receipt: receipt.id(),
            lease: p.lease,
            seq,
            amount_due: receipt.amount_due,
            created_at: Timestamp(3),
            ext: Ext::new(),
        },
    )
    .unwrap();
    Signed::sign(
        &p.host,
        Redeem {
            escrow: p.escrow,
            lease: p.lease,
            receipt: BoundedBytes::new(receipt.as_bytes().to_vec()).unwrap(),
            ack: BoundedBytes::new(ack.as_bytes().to_vec()).unwrap(),
            created_at: Timestamp(4),
            ext: Ext::new(),
        },
    )
    .unwrap()
    .as_bytes()
    .to_vec()
}

fn release(p: &Parties) -> Vec<u8> {
    Signed::sign(
        &p.host,
        Release {
            escrow: p.escrow,
            lease: p.lease,
            created_at: Timestamp(5),
            ext: Ext::new(),
        },
    )
    .unwrap()
    .as_bytes()
    .to_vec()
}

fn submit(s: &mut LedgerService<SledStore>, envelope: Vec<u8>, at: u64) -> LedgerResponse {
    s.handle(
        &ledger_wire::encode(&LedgerRequest::Submit(envelope)),
        Timestamp(at),
    )
}

fn record(response: LedgerResponse) -> Verified<LedgerRecord> {
    match response {
        LedgerResponse::Record(bytes) => Signed::<LedgerRecord>::from_bytes(bytes)
            .unwrap()
            .verify()
            .unwrap(),
        other => panic!("not a record: {other:?}"),
    }
}

#[test]
fn retries_change_nothing_and_a_restart_replays_to_the_same_balances() {
    let tmp = tempfile::tempdir().unwrap();
    let p = parties();
    {
        let mut s = open(tmp.path(), &p);
        s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
            .unwrap();
        let first = record(submit(&mut s, lock(&p, 300_000), 1));
        assert_eq!(first.signer(), p.ledger.public());
        assert!(matches!(first.entry, LedgerEntry::Locked { .. }));
        // The same lock again (a retry) changes nothing and gets the same record.
        let again = record(submit(&mut s, lock(&p, 300_000), 1));
        assert_eq!(again.as_bytes(), first.as_bytes());
        assert_eq!(
            s.ledger().balance(&p.renter.public()),
            MicroCredits(700_000)
        );
        record(submit(&mut s, redeem(&p, 1, 60), 2));
        record(submit(&mut s, redeem(&p, 2, 90), 3));
        // An older receipt, or the same one again: nothing paid twice.
        assert!(matches!(
            submit(&mut s, redeem(&p, 1, 60), 4),
            LedgerResponse::Unchanged(_)
        ));
        assert!(matches!(
            submit(&mut s, redeem(&p, 2, 90), 4),
            LedgerResponse::Unchanged(_)
        ));
        record(submit(&mut s, release(&p), 5));
        assert!(matches!(
            submit(&mut s, release(&p), 6),
            LedgerResponse::Unchanged(_)
        ));
        assert_eq!(s.ledger().balance(&p.host.public()), MicroCredits(90_000));
        assert_eq!(
            s.ledger().balance(&p.renter.public()),
            MicroCredits(910_000)
        );
        // A lock beyond the balance is refused, with its code, and logs nothing.
        let mut other = parties();
        other.escrow = EscrowId([6; 16]);
        assert_eq!(
            submit(&mut s, lock(&other, 5_000_000), 7).refusal(),
            Some(RefusalCode::InsufficientFunds)
        );
        // A second escrow, left open.
        other.escrow = EscrowId([7; 16]);
        other.lease = ContentId([8; 32]);
        let open_record = record(submit(&mut s, lock(&other, 100_000), 8));
        assert_eq!(open_record.seq, 6);
    }
    let mut s = open(tmp.path(), &p);
    // After a restart a retried lock of an open escrow still gets its original record;
    // one of a closed escrow is refused.
    let mut other = parties();
    other.escrow = EscrowId([7; 16]);
    other.lease = ContentId([8; 32]);
    let again = record(submit(&mut s, lock(&other, 100_000), 9));
    assert!(matches!(again.entry, LedgerEntry::Locked { .. }));
    assert_eq!(again.seq, 6);
    assert_eq!(
        submit(&mut s, lock(&p, 300_000), 9).refusal(),
        Some(RefusalCode::EscrowClosed)
    );
    assert_eq!(s.ledger().balance(&p.host.public()), MicroCredits(90_000));
    assert_eq!(
        s.ledger().balance(&p.renter.public()),
        MicroCredits(810_000)
    );
    assert_eq!(s.ledger().total(), 1_000_000);
    assert!(s.ledger().escrow(&p.escrow).unwrap().released);
}

#[test]
fn an_escrows_proof_is_its_lock_and_newest_redemption_the_same_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let p = parties();
    let proof = |s: &mut LedgerService<SledStore>| {
        s.handle(
            &ledger_wire::encode(&LedgerRequest::Proof(p.escrow)),
            Timestamp(10),
        )
    };
    let before = {
        let mut s = open(tmp.path(), &p);
        assert_eq!(proof(&mut s).refusal(), Some(RefusalCode::UnknownEscrow));
        s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
            .unwrap();
        let locked = record(submit(&mut s, lock(&p, 300_000), 1));
        // Locked, nothing paid yet.
        match proof(&mut s) {
            LedgerResponse::Proof { locked: l, paid } => {
                assert_eq!(l, locked.as_bytes());
                assert!(paid.is_none());
            }
            other => panic!("{other:?}"),
        }
        record(submit(&mut s, redeem(&p, 1, 60), 2));
        let newest = record(submit(&mut s, redeem(&p, 2, 90), 3));
        match proof(&mut s) {
            LedgerResponse::Proof { paid, .. } => {
                let paid = paid.expect("a redemption");
                assert_eq!(paid, newest.as_bytes());
                assert!(matches!(
                    record(LedgerResponse::Record(paid)).entry,
                    LedgerEntry::Redeemed { cumulative, .. } if cumulative == MicroCredits(90_000)
                ));
            }
            other => panic!("{other:?}"),
        }
        proof(&mut s)
    };
    // Rebuilt from the log on disk: the same signed records, byte for byte.
    let mut s = open(tmp.path(), &p);
    assert_eq!(proof(&mut s), before);
}

#[test]
fn a_lock_held_back_too_long_is_refused_as_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let p = parties();
    let mut s = open(tmp.path(), &p);
    s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
        .unwrap();
    // The lock was signed at 1 ms; the ledger sees it MAX_LOCK_AGE_MS later.
    let late = 2 + gpux_lease::MAX_LOCK_AGE_MS;
    assert_eq!(
        submit(&mut s, lock(&p, 300_000), late).refusal(),
        Some(RefusalCode::StaleLock)
    );
    assert_eq!(
        s.ledger().balance(&p.renter.public()),
        MicroCredits(1_000_000)
    );
}

#[test]
fn a_log_behind_or_unlike_its_manifest_refuses_to_open() {
    let tmp = tempfile::tempdir().unwrap();
    let p = parties();
    let entry_one;
    {
        let mut s = open(tmp.path(), &p);
        s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
            .unwrap();
        record(submit(&mut s, lock(&p, 300_000), 1));
        s.mint(p.host.public(), MicroCredits(5), Timestamp(2))
            .unwrap();
        entry_one = s
            .state
            .store()
            .get(Tree::LedgerLog, &1u64.to_be_bytes())
            .unwrap()
            .unwrap();
    }
    let manifest = std::fs::read_to_string(tmp.path().join(LEDGER_MANIFEST)).unwrap();
    assert!(manifest.starts_with("count 3\n"), "{manifest}");
    // Reopening the intact log is fine.
    drop(open(tmp.path(), &p));
    // The log loses its last entry (an older copy, a truncation): refused.
    {
        let state = NodeState::<SledStore>::open(tmp.path()).unwrap();
        state
            .store()
            .delete(Tree::LedgerLog, &3u64.to_be_bytes(), Durability::Flush)
            .unwrap();
    }
    let state = NodeState::open(tmp.path()).unwrap();
    let err = LedgerService::open(p.ledger.clone(), state, LedgerConfig::default()).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    // An entry changed for another valid one: refused too.
    {
        let state = NodeState::<SledStore>::open(tmp.path()).unwrap();
        let third = gpux_lease::LogEntry {
            at: Timestamp(2),
            op: gpux_lease::LogOp::Mint {
                account: p.host.public(),
                amount: MicroCredits(5),
            },
        };
        let bytes = bincode::encode_to_vec(&third, bincode::config::standard()).unwrap();
        state
            .store()
            .put(
                Tree::LedgerLog,
                &3u64.to_be_bytes(),
                &bytes,
                Durability::Flush,
            )
            .unwrap();
        // Entry 1 becomes a mint of a different amount.
        let other = gpux_lease::LogEntry {
            at: Timestamp(0),
            op: gpux_lease::LogOp::Mint {
                account: p.renter.public(),
                amount: MicroCredits(2_000_000),
            },
        };
        let changed = bincode::encode_to_vec(&other, bincode::config::standard()).unwrap();
        assert_ne!(changed, entry_one);
        state
            .store()
            .put(
                Tree::LedgerLog,
                &1u64.to_be_bytes(),
                &changed,
                Durability::Flush,
            )
            .unwrap();
    }
    let state = NodeState::open(tmp.path()).unwrap();
    let err = LedgerService::open(p.ledger.clone(), state, LedgerConfig::default()).unwrap_err();
    assert!(err.to_string().contains("changed"), "{err}");
}

#[test]
fn a_damaged_log_refuses_to_open_rather_than_start_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let p = parties();
    {
        let mut s = open(tmp.path(), &p);
        s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
            .unwrap();
        let state = NodeState::<SledStore>::open(tmp.path());
        assert!(
            state.is_err(),
            "the database is locked while the ledger runs"
        );
        s.state
            .store()
            .put(
                Tree::LedgerLog,
                &2u64.to_be_bytes(),
                &[0xff; 7],
                Durability::Flush,
            )
            .unwrap();
    }
    let state = NodeState::open(tmp.path()).unwrap();
    let err = LedgerService::open(p.ledger.clone(), state, LedgerConfig::default()).unwrap_err();
    assert!(matches!(err, ServiceError::Replay(_)), "{err}");
    assert!(err.to_string().contains("refuses to start"), "{err}");
}

#[test]
fn frames_with_trailing_or_garbage_bytes_are_refused_as_malformed() {
    let tmp = tempfile::tempdir().unwrap();
    let p = parties();
    let mut s = open(tmp.path(), &p);
    let mut frame = ledger_wire::encode(&LedgerRequest::Balance(p.renter.public()));
    assert_eq!(s.handle(&frame, Timestamp(0)), LedgerResponse::Balance(0));
    frame.push(0);
    assert_eq!(
        s.handle(&frame, Timestamp(0)).refusal(),
        Some(RefusalCode::Malformed)
    );
    assert_eq!(
        s.handle(&[0xff; 9], Timestamp(0)).refusal(),
        Some(RefusalCode::Malformed)
    );
    assert_eq!(
        s.handle(&vec![0; ledger_wire::MAX_LEDGER_FRAME + 1], Timestamp(0))
            .refusal(),
        Some(RefusalCode::Malformed)
    );
    // A valid envelope of the wrong kind is not a ledger operation.
    let not_op = Signed::sign(
        &p.renter,
        gpux_protocol::LeaseEnd {
            lease: p.lease,
            created_at: Timestamp(1),
            reason: gpux_protocol::EndReason::RenterStopped,
            exit_code: None,
            ext: Ext::new(),
        },
    )
    .unwrap();
    assert_eq!(
        submit(&mut s, not_op.as_bytes().to_vec(), 1).refusal(),
        Some(RefusalCode::Invalid)
    );
}

#[test]
fn the_copy_follows_the_log_is_rebuilt_when_damaged_and_a_log_behind_it_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let p = parties();
    {
        let mut s = open(tmp.path(), &p);
        s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
            .unwrap();
        record(submit(&mut s, lock(&p, 300_000), 1));
        assert_eq!(s.applied(), 2);
    }
    let copy = tmp.path().join(LEDGER_COPY);
    let read = CopyContents::read(&copy).unwrap();
    assert_eq!(read.entries.len(), 2);
    assert_eq!(read.tail, None);
    // Damaged in the middle: rebuilt from the verified log on open.
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[20] ^= 1;
    std::fs::write(&copy, &bytes).unwrap();
    drop(open(tmp.path(), &p));
    let read = CopyContents::read(&copy).unwrap();
    assert_eq!((read.entries.len(), read.tail), (2, None));
    // Missing: written again.
    std::fs::remove_file(&copy).unwrap();
    drop(open(tmp.path(), &p));
    assert_eq!(CopyContents::read(&copy).unwrap().entries.len(), 2);
    // The database loses its last entry while the copy (and a manifest written before
    // the loss was noticed) hold it: refused, and a restore brings it back.
    {
        let state = NodeState::<SledStore>::open(tmp.path()).unwrap();
        state
            .store()
            .delete(Tree::LedgerLog, &2u64.to_be_bytes(), Durability::Flush)
            .unwrap();
    }
    std::fs::remove_file(tmp.path().join(LEDGER_MANIFEST)).unwrap();
    let state = NodeState::open(tmp.path()).unwrap();
    let err = LedgerService::open(p.ledger.clone(), state, LedgerConfig::default()).unwrap_err();
    assert!(err.to_string().contains("lost entries"), "{err}");
    assert!(err.to_string().contains("gpux ledger restore"), "{err}");
    let restored = restore(tmp.path(), None, &p.ledger, LedgerConfig::default()).unwrap();
    assert_eq!(restored.entries, 2);
    assert!(restored.moved_aside.is_some());
    assert!(restored.other_records.is_some());
    let s = open(tmp.path(), &p);
    assert_eq!(s.applied(), 2);
    assert_eq!(
        s.ledger().balance(&p.renter.public()),
        MicroCredits(700_000)
    );
}

#[test]
fn a_restore_refuses_a_copy_short_of_the_manifest_and_while_the_node_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let p = parties();
    let mut s = open(tmp.path(), &p);
    s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
        .unwrap();
    s.mint(p.host.public(), MicroCredits(5), Timestamp(1))
        .unwrap();
    let err = restore(tmp.path(), None, &p.ledger, LedgerConfig::default()).unwrap_err();
    assert!(matches!(err, RestoreError::InUse(_)), "{err}");
    drop(s);
    // An older copy (one entry) against a manifest that says two were applied.
    let copy = tmp.path().join(LEDGER_COPY);
    let entries = CopyContents::read(&copy).unwrap().entries;
    let old = tmp.path().join("old.copy");
    LogCopy::rewrite(&old, &entries[..1]).unwrap();
    let err = restore(tmp.path(), Some(&old), &p.ledger, LedgerConfig::default()).unwrap_err();
    assert!(err.to_string().contains("says 2 were applied"), "{err}");
    // Nothing was touched: the ledger still opens.
    assert_eq!(open(tmp.path(), &p).applied(), 2);
}
