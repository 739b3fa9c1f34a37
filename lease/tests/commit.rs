//! Leases whose work waits for the renter's commit (`EXT_COMMIT_WAIT_MS`): the GPUs are
//! held for the wait and the duration, the workspace is made at the lock, the container
//! starts only on the renter's signed `LeaseCommit`, and a lease not committed in time ends
//! with nothing paid and nothing left.

use gpux_lease::{
    End, HostEffect, HostInput, HostPhase, HostTimer, LedgerCall, LedgerMachine, LedgerVerdict,
    LockOutcome, RentReport, RenterEffect, RenterInput, RenterPhase, RenterTimer,
};
use gpux_market::LedgerConfig;
use gpux_protocol::*;

use crate::preemption::{
    accept, lock_at_ledger, other_renter, receipt_of, renter_lease, request, spot_market,
    spot_renter,
};
use crate::rules::{T0, ledger_key, submit};

const WAIT_MS: u64 = 60_000;
const PRICE: u64 = 3_600_000;

/// An on-demand request by `who` at `t` whose work waits up to a minute for its commit.
fn held_request(who: &Keypair, offer: &Verified<Offer>, t: u64) -> Verified<LeaseRequest> {
    let mut body = request(who, offer, t, LeaseKind::OnDemand, PRICE)
        .body()
        .clone();
    body.terms.commit_wait_ms = Some(WAIT_MS);
    Signed::sign(who, body).unwrap()
}

fn commit_of(effects: &[RenterEffect]) -> Verified<LeaseCommit> {
    effects
        .iter()
        .find_map(|e| match e {
            RenterEffect::SendCommit { envelope } => Some(
                Signed::<LeaseCommit>::from_bytes(envelope.clone())
                    .unwrap()
                    .verify()
                    .unwrap(),
            ),
            _ => None,
        })
        .expect("a commit")
}

/// A held request accepted at `T0`, its escrow locked at the ledger (`T0 + 20 ms`), and the
/// renter told so (`T0 + 100 ms`): both sides hold.
struct Held {
    ledger: LedgerMachine,
    r: Verified<LeaseRequest>,
    held: crate::preemption::Accepted,
    renter: gpux_lease::RenterLease,
}

/// `r` accepted by `book` at `T0`, its escrow locked at `ledger` (`T0 + 20 ms`) and the
/// renter told so (`T0 + 100 ms`): the host's side and the renter's.
fn agree_and_lock(
    book: &mut gpux_lease::HostBook,
    r: &Verified<LeaseRequest>,
    ledger: &mut LedgerMachine,
) -> (crate::preemption::Accepted, gpux_lease::RenterLease) {
    let mut agreed = accept(book, r, T0).unwrap();
    let (mut renter, lock) = renter_lease(spot_renter(), r, &agreed.accept, T0 + 10);
    let (_, record) = lock_at_ledger(
        &mut agreed.lease,
        &spot_renter(),
        Some(lock),
        ledger,
        T0 + 20,
    );
    renter.handle(
        Timestamp(T0 + 100),
        RenterInput::Lock(LockOutcome::Record(Box::new(record))),
    );
    (agreed, renter)
}

fn held_and_locked() -> Held {
    let (mut book, o) = spot_market();
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    let r = held_request(&spot_renter(), &o, T0);
    let (held, renter) = agree_and_lock(&mut book, &r, &mut ledger);
    assert_eq!(renter.phase(), RenterPhase::Held);
    Held {
        ledger,
        r,
        held,
        renter,
    }
}

#[test]
fn a_commit_wait_is_a_bounded_term() {
    let (_, o) = spot_market();
    let mut body = held_request(&spot_renter(), &o, T0).body().clone();
    body.terms.commit_wait_ms = Some(MAX_COMMIT_WAIT_MS + 1);
    assert!(matches!(
        body.check(),
        Err(InvalidMessage::AboveLimit {
            field: "commit wait",
            ..
        })
    ));
    body.terms.commit_wait_ms = Some(0);
    assert!(body.check().is_err());
}

#[test]
fn a_held_lease_starts_on_its_renters_commit_and_is_billed_from_then() {
    let (mut book, o) = spot_market();
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    let r = held_request(&spot_renter(), &o, T0);
    let mut held = accept(&mut book, &r, T0).unwrap();
    // The GPU is booked for the wait and the duration.
    let booked = book.bookings_of(&r.id());
    assert_eq!(booked.len(), 1);
    assert_eq!(booked[0].2, Timestamp(T0 + WAIT_MS + 600_000));

    let (mut renter, lock) = renter_lease(spot_renter(), &r, &held.accept, T0 + 10);
    let (effects, record) = lock_at_ledger(
        &mut held.lease,
        &spot_renter(),
        Some(lock),
        &mut ledger,
        T0 + 20,
    );
    // The lock is answered at once, the workspace made, the container not started.
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, HostEffect::AnswerLock { started: false, .. }))
    );
    assert!(effects.contains(&HostEffect::PrepareWorkspace));
    assert!(effects.contains(&HostEffect::Schedule {
        at: Timestamp(T0 + WAIT_MS),
        timer: HostTimer::CommitWait,
    }));
    assert!(!effects.contains(&HostEffect::StartContainer));
    assert_eq!(held.lease.phase(), HostPhase::Starting);

    let effects = renter.handle(
        Timestamp(T0 + 100),
        RenterInput::Lock(LockOutcome::Record(Box::new(record))),
    );
    assert!(effects.contains(&RenterEffect::Report(RentReport::Held)));
    assert_eq!(renter.phase(), RenterPhase::Held);

    // A commit signed by anyone but the renter, or for another lease, starts nothing.
    let forged = Signed::sign(
        &other_renter(),
        LeaseCommit {
            lease: r.id(),
            created_at: Timestamp(T0 + 5_000),
            ext: Ext::new(),
        },
    )
    .unwrap();
    let effects = held
        .lease
        .handle(Timestamp(T0 + 5_000), HostInput::Commit(forged));
    assert!(!effects.contains(&HostEffect::StartContainer));

    // The renter commits 20 s in (its files are in): the work starts now.
    let effects = renter.commit(Timestamp(T0 + 20_000)).unwrap();
    assert_eq!(renter.phase(), RenterPhase::Running);
    assert_eq!(renter.record().starts_at, Timestamp(T0 + 20_000));
    let commit = commit_of(&effects);
    assert_eq!(commit.lease, r.id());
    assert!(renter.commit(Timestamp(T0 + 20_001)).is_err());
    let effects = held
        .lease
        .handle(Timestamp(T0 + 20_050), HostInput::Commit(commit.clone()));
    assert!(effects.contains(&HostEffect::StartContainer));
    assert_eq!(
        held.lease.record().committed_at,
        Some(Timestamp(T0 + 20_050))
    );
    // Once is enough.
    let effects = held
        .lease
        .handle(Timestamp(T0 + 20_060), HostInput::Commit(commit));
    assert!(!effects.contains(&HostEffect::StartContainer));

    // Billed from Docker's start; the whole duration fits the booking.
    held.lease.handle(
        Timestamp(T0 + 21_000),
        HostInput::ContainerStarted {
            started_at: Timestamp(T0 + 21_000),
        },
    );
    assert_eq!(held.lease.deadline(), Timestamp(T0 + 621_000));
    let effects = held.lease.handle(
        Timestamp(T0 + 122_000),
        HostInput::Timer(HostTimer::ReceiptDue),
    );
    let receipt = receipt_of(&effects).expect("a receipt");
    assert_eq!(receipt.gpu_seconds, 100);
    // The renter's own clock runs from its commit: 102 s since, so the receipt holds.
    let answer = renter.handle(Timestamp(T0 + 122_100), RenterInput::Receipt(receipt));
    let Some(RenterEffect::Respond { envelope }) = answer
        .iter()
        .find(|e| matches!(e, RenterEffect::Respond { .. }))
    else {
        panic!("no answer");
    };
    assert!(Signed::<ReceiptAck>::from_bytes(envelope.clone()).is_ok());
}

#[test]
fn a_lease_not_committed_in_time_ends_unpaid_and_leaves_nothing() {
    let Held {
        mut ledger,
        r,
        mut held,
        mut renter,
    } = held_and_locked();
    let before = ledger.ledger().balance(&spot_renter().public());

    // Early, the wait's timer changes nothing.
    let effects = held.lease.handle(
        Timestamp(T0 + WAIT_MS - 1),
        HostInput::Timer(HostTimer::CommitWait),
    );
    assert!(effects.is_empty());
    // At its end the lease is over: GPUs freed, the workspace erased, the renter told,
    // and the escrow released with no voucher.
    let effects = held.lease.handle(
        Timestamp(T0 + WAIT_MS),
        HostInput::Timer(HostTimer::CommitWait),
    );
    assert_eq!(held.lease.record().end, Some(End::NotCommitted));
    assert!(effects.contains(&HostEffect::FreeGpus));
    assert!(effects.contains(&HostEffect::EraseContainer));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, HostEffect::SendEnd { .. }))
    );
    let release = effects
        .iter()
        .find_map(|e| match e {
            HostEffect::Ledger {
                call: LedgerCall::Release,
                envelope,
            } => Some(envelope.clone()),
            _ => None,
        })
        .expect("a release");
    let verdict = LedgerVerdict::from_response(
        submit(&mut ledger, &release, T0 + WAIT_MS),
        &[ledger_key().public()],
    );
    assert!(matches!(verdict, LedgerVerdict::Applied(_)));
    assert_eq!(
        ledger.ledger().balance(&spot_renter().public()),
        before.checked_add(r.escrow_amount).unwrap()
    );
    // A commit now starts nothing, on either side.
    assert!(renter.commit(Timestamp(T0 + WAIT_MS + 1)).is_err());
    let late = Signed::sign(
        &spot_renter(),
        LeaseCommit {
            lease: r.id(),
            created_at: Timestamp(T0 + WAIT_MS + 1),
            ext: Ext::new(),
        },
    )
    .unwrap();
    let effects = held
        .lease
        .handle(Timestamp(T0 + WAIT_MS + 1), HostInput::Commit(late));
    assert!(!effects.contains(&HostEffect::StartContainer));
    // The renter's side ends too, and asks the host to stop.
    let effects = renter.handle(
        Timestamp(T0 + WAIT_MS),
        RenterInput::Timer(RenterTimer::Watchdog),
    );
    assert_eq!(renter.record().end, Some(End::NotCommitted));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, RenterEffect::SendEnd { .. }))
    );
}

#[test]
fn a_held_lease_whose_challenge_failed_ends_unpaid_on_both_sides() {
    let Held {
        mut held,
        mut renter,
        ..
    } = held_and_locked();
    // Only a held lease can fail its challenge.
    let effects = renter.fail_challenge(Timestamp(T0 + 5_000)).unwrap();
    assert_eq!(renter.record().end, Some(End::ChallengeFailed));
    assert!(renter.fail_challenge(Timestamp(T0 + 5_001)).is_err());
    let told = effects
        .iter()
        .find_map(|e| match e {
            RenterEffect::SendEnd { envelope } => Some(
                Signed::<LeaseEnd>::from_bytes(envelope.clone())
                    .unwrap()
                    .verify()
                    .unwrap(),
            ),
            _ => None,
        })
        .expect("the host is told");
    assert_eq!(told.reason, EndReason::ChallengeFailed);
    // The host ends it before any work: nothing to bill, the escrow released whole.
    let effects = held
        .lease
        .handle(Timestamp(T0 + 5_100), HostInput::RenterEnd(told));
    assert_eq!(held.lease.record().end, Some(End::ChallengeFailed));
    assert!(!effects.contains(&HostEffect::StartContainer));
    assert!(effects.contains(&HostEffect::FreeGpus));
    assert!(held.lease.record().acked.is_none());
    assert!(effects.iter().any(|e| matches!(
        e,
        HostEffect::Ledger {
            call: LedgerCall::Release,
            ..
        }
    )));
}

/// A reserved window of 600 s from `T0 + 60 s` whose renter commits to 300 s, accepted and
/// locked, its container started at the window's start; and the renter's side, told so.
fn committed_window() -> (
    crate::preemption::Accepted,
    gpux_lease::RenterLease,
    Timestamp,
) {
    let (mut book, o) = spot_market();
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    let start = Timestamp(T0 + 60_000);
    let kind = LeaseKind::Reserved {
        start,
        end: start.plus_secs(600),
    };
    let mut body = request(&spot_renter(), &o, T0, kind, PRICE).body().clone();
    body.terms.committed_s = 300;
    let r = Signed::sign(&spot_renter(), body).unwrap();
    assert_eq!(gpux_lease::bill::committed_gpu_seconds(&r), 300);
    let (mut window, renter) = agree_and_lock(&mut book, &r, &mut ledger);
    let effects = window
        .lease
        .handle(start, HostInput::Timer(HostTimer::StartAt));
    assert!(effects.contains(&HostEffect::StartContainer));
    window
        .lease
        .handle(start, HostInput::ContainerStarted { started_at: start });
    (window, renter, start)
}

#[test]
fn a_reserved_window_stopped_early_by_its_renter_pays_its_committed_minimum_and_only_then() {
    // The renter stops it 100 s in: the final receipt bills the committed 300 s, and the
    // renter, having stopped it, acknowledges that.
    let (mut window, mut renter, start) = committed_window();
    let at = start.plus_secs(100);
    let stop = renter.stop(at).unwrap();
    let end = stop
        .iter()
        .find_map(|e| match e {
            RenterEffect::SendEnd { envelope } => Some(
                Signed::<LeaseEnd>::from_bytes(envelope.clone())
                    .unwrap()
                    .verify()
                    .unwrap(),
            ),
            _ => None,
        })
        .unwrap();
    window.lease.handle(at, HostInput::RenterEnd(end));
    let effects = window.lease.handle(
        at.plus_ms(500),
        HostInput::ContainerExited {
            finished_at: Some(at.plus_ms(500)),
            exit_code: Some(143),
        },
    );
    let receipt = receipt_of(&effects).expect("the final receipt");
    assert_eq!(receipt.gpu_seconds, 300);
    let answer = renter.handle(at.plus_secs(1), RenterInput::Receipt(receipt));
    assert!(answer.iter().any(|e| matches!(
        e,
        RenterEffect::Respond { envelope }
            if Signed::<ReceiptAck>::from_bytes(envelope.clone()).is_ok()
    )));

    // A window the host ends early (it shuts down) pays its runtime, not the commitment;
    // and a renter that did not stop it disputes a receipt for the commitment.
    let (mut window, mut renter, start) = committed_window();
    let at = start.plus_secs(100);
    window.lease.handle(at, HostInput::Shutdown);
    let effects = window.lease.handle(
        at.plus_ms(500),
        HostInput::ContainerExited {
            finished_at: Some(at.plus_ms(500)),
            exit_code: Some(143),
        },
    );
    let receipt = receipt_of(&effects).expect("the final receipt");
    assert_eq!(receipt.gpu_seconds, 100);
    assert!(renter.record().stop_requested_at.is_none());
    let forged = UsageReceipt {
        seq: receipt.seq + 1,
        gpu_seconds: 300,
        amount_due: gpux_lease::bill::amount(renter.request(), 300),
        ..receipt.body().clone()
    };
    let forged = Signed::sign(&crate::rules::host(), forged).unwrap();
    let answer = renter.handle(at.plus_secs(1), RenterInput::Receipt(forged));
    assert!(answer.iter().any(|e| matches!(
        e,
        RenterEffect::Respond { envelope }
            if Signed::<LeaseEnd>::from_bytes(envelope.clone()).is_ok()
    )));
}

#[test]
fn a_reserved_window_its_host_never_starts_is_refunded_whole() {
    let (mut book, o) = spot_market();
    let mut ledger = LedgerMachine::new(
        ledger_key(),
        LedgerConfig {
            release_grace_ms: 10_000,
            ..LedgerConfig::default()
        },
    );
    let start = Timestamp(T0 + 60_000);
    let kind = LeaseKind::Reserved {
        start,
        end: start.plus_secs(600),
    };
    let r = request(&spot_renter(), &o, T0, kind, PRICE);
    let (_host, mut renter) = agree_and_lock(&mut book, &r, &mut ledger);
    // The host falls silent and never starts the window. Before the window, silence is
    // expected; past its start and the loss bound, the renter counts the host gone.
    let early = renter.handle(
        start.plus_ms(1_000),
        RenterInput::Timer(RenterTimer::Watchdog),
    );
    assert!(renter.record().end.is_none(), "{early:?}");
    let silent_at = start.plus_ms(gpux_lease::Timing::default().loss_bound_ms() + 5_000);
    renter.handle(silent_at, RenterInput::Timer(RenterTimer::Watchdog));
    assert_eq!(renter.record().end, Some(End::HostSilent));
    // It releases the escrow with no voucher once the hold and the ledger's grace are past:
    // everything comes back.
    let effects = renter.handle(
        silent_at.plus_ms(2_000),
        RenterInput::Timer(RenterTimer::Settle),
    );
    let release = effects
        .iter()
        .find_map(|e| match e {
            RenterEffect::Ledger {
                call: LedgerCall::Release,
                envelope,
            } => Some(envelope.clone()),
            _ => None,
        })
        .expect("a release");
    let verdict = LedgerVerdict::from_response(
        submit(&mut ledger, &release, silent_at.0 + 2_000),
        &[ledger_key().public()],
    );
    assert!(matches!(verdict, LedgerVerdict::Applied(_)), "{verdict:?}");
    renter.handle(
        silent_at.plus_ms(2_100),
        RenterInput::Ledger {
            call: LedgerCall::Release,
            verdict,
        },
    );
    assert_eq!(renter.phase(), RenterPhase::Settled);
    assert_eq!(
        ledger.ledger().balance(&spot_renter().public()),
        MicroCredits(1_000_000)
    );
    assert_eq!(ledger.ledger().balance(&crate::rules::host().public()).0, 0);
}
