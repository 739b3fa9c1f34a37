//! Reserved windows cancelled before their start: the renter pays its fee schedule's share
//! of the committed minimum for the time it cancelled (the host's offer published the
//! schedule, the request carries it unchanged), and nothing else.

use gpux_lease::{
    End, HostEffect, HostInput, HostPhase, LedgerCall, LedgerMachine, LedgerVerdict, LockOutcome,
    RenterEffect, RenterInput, RenterPhase,
};
use gpux_market::LedgerConfig;
use gpux_protocol::*;

use crate::preemption::{accept, lock_at_ledger, receipt_of, renter_lease, request, spot_renter};
use crate::rules::{T0, host, ledger_key, submit};

const PRICE: u64 = 3_600_000;
/// The window starts half an hour after T0.
const START: Timestamp = Timestamp(T0 + 1_800_000);

fn fees() -> CancelFees {
    "20m:50%,2m:100%".parse().unwrap()
}

/// A host whose offer publishes [`fees`], and that offer.
fn market() -> (gpux_lease::HostBook, Verified<Offer>) {
    let (_, plain) = crate::preemption::spot_market();
    let mut body = plain.body().clone();
    body.terms.cancel_fees = fees();
    let offer = Signed::sign(&host(), body).unwrap();
    let mut book = gpux_lease::HostBook::new(host(), gpux_lease::Timing::default());
    book.add_offer(offer.clone(), Timestamp(T0));
    (book, offer)
}

/// A 600 s window with a committed minimum of 300 s, carrying `fees`.
fn window_request(offer: &Verified<Offer>, fees: &CancelFees) -> Verified<LeaseRequest> {
    let kind = LeaseKind::Reserved {
        start: START,
        end: START.plus_secs(600),
    };
    let mut body = request(&spot_renter(), offer, T0, kind, PRICE)
        .body()
        .clone();
    body.terms.committed_s = 300;
    body.terms.cancel_fees = fees.clone();
    Signed::sign(&spot_renter(), body).unwrap()
}

struct Booked {
    ledger: LedgerMachine,
    host: gpux_lease::HostLease,
    renter: gpux_lease::RenterLease,
}

fn booked() -> Booked {
    let (mut book, offer) = market();
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    let r = window_request(&offer, &fees());
    let mut agreed = accept(&mut book, &r, T0).unwrap();
    let (mut renter, lock) = renter_lease(spot_renter(), &r, &agreed.accept, T0 + 10);
    let (_, record) = lock_at_ledger(
        &mut agreed.lease,
        &spot_renter(),
        Some(lock),
        &mut ledger,
        T0 + 20,
    );
    renter.handle(
        Timestamp(T0 + 100),
        RenterInput::Lock(LockOutcome::Record(Box::new(record))),
    );
    assert_eq!(renter.phase(), RenterPhase::Running);
    assert_eq!(agreed.lease.phase(), HostPhase::Starting);
    Booked {
        ledger,
        host: agreed.lease,
        renter,
    }
}

/// The renter cancels at `at`; the host hears it at once. The host's effects.
fn cancel(b: &mut Booked, at: Timestamp) -> Vec<HostEffect> {
    let stop = b.renter.stop(at).unwrap();
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
    b.host.handle(at, HostInput::RenterEnd(end))
}

fn ledger_call(effects: &[HostEffect]) -> Option<(LedgerCall, Vec<u8>)> {
    effects.iter().find_map(|e| match e {
        HostEffect::Ledger { call, envelope } => Some((*call, envelope.clone())),
        _ => None,
    })
}

#[test]
fn a_committed_window_carries_its_offers_fee_schedule_unchanged() {
    let (mut book, offer) = market();
    for other in [CancelFees::default(), "20m:50%".parse().unwrap()] {
        let r = window_request(&offer, &other);
        assert!(
            matches!(accept(&mut book, &r, T0), Err(RejectReason::Invalid)),
            "{other}"
        );
    }
    assert!(accept(&mut book, &window_request(&offer, &fees()), T0).is_ok());
    // A schedule without a committed minimum is no term at all.
    let mut body = window_request(&offer, &fees()).body().clone();
    body.terms.committed_s = 0;
    body.terms.cancel_fees = fees();
    assert!(Signed::sign(&spot_renter(), body).is_err());
}

#[test]
fn a_window_cancelled_within_a_step_pays_that_share_of_its_committed_minimum() {
    let mut b = booked();
    // Cancelled 10 min before the start: within the 20 min step, so half of the committed
    // 300 GPU-seconds.
    let at = Timestamp(START.0 - 600_000);
    let effects = cancel(&mut b, at);
    assert_eq!(b.host.record().end, Some(End::RenterStopped));
    assert!(effects.contains(&HostEffect::FreeGpus));
    assert!(!effects.contains(&HostEffect::StartContainer));
    let receipt = receipt_of(&effects).expect("the fee's receipt");
    assert_eq!(receipt.gpu_seconds, 150);
    let answer = b
        .renter
        .handle(at.plus_ms(200), RenterInput::Receipt(receipt.clone()));
    let ack = answer
        .iter()
        .find_map(|e| match e {
            RenterEffect::Respond { envelope } => {
                Signed::<ReceiptAck>::from_bytes(envelope.clone())
                    .ok()
                    .map(|a| a.verify().unwrap())
            }
            _ => None,
        })
        .expect("the renter acknowledges its fee");
    let effects = b.host.handle(
        at.plus_ms(300),
        HostInput::ReceiptAnswer {
            seq: receipt.seq,
            answer: gpux_lease::RenterAnswer::Ack(ack),
        },
    );
    // The host closes the escrow with the renter's voucher: the fee is paid, the rest goes
    // back.
    let (call, close) = ledger_call(&effects).expect("the escrow is closed");
    let verdict = LedgerVerdict::from_response(
        submit(&mut b.ledger, &close, at.0 + 400),
        &[ledger_key().public()],
    );
    assert!(matches!(verdict, LedgerVerdict::Applied(_)), "{verdict:?}");
    let fee = gpux_lease::bill::amount(b.renter.request(), 150);
    assert_eq!(b.ledger.ledger().balance(&host().public()), fee);
    // The host then releases the rest of the escrow to the renter.
    let effects = b
        .host
        .handle(at.plus_ms(500), HostInput::Ledger { call, verdict });
    let (call, release) = ledger_call(&effects).expect("the rest is released");
    assert_eq!(call, LedgerCall::Release);
    let verdict = LedgerVerdict::from_response(
        submit(&mut b.ledger, &release, at.0 + 600),
        &[ledger_key().public()],
    );
    b.host
        .handle(at.plus_ms(700), HostInput::Ledger { call, verdict });
    assert_eq!(b.host.phase(), HostPhase::Settled);
    assert_eq!(
        b.ledger.ledger().balance(&spot_renter().public()).0,
        1_000_000 - fee.0
    );
}

#[test]
fn a_window_cancelled_before_every_step_costs_nothing_and_a_dearer_fee_is_disputed() {
    // 25 min before the start: before the first step. No receipt; the escrow comes back.
    let mut b = booked();
    let effects = cancel(&mut b, Timestamp(START.0 - 1_500_000));
    assert!(receipt_of(&effects).is_none());
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, HostEffect::SendEnd { .. }))
    );

    // 10 min before: a host that bills the whole commitment (the 2 min step's share) is
    // disputed: the renter's bound is the share for its own time plus the grace.
    let mut b = booked();
    let at = Timestamp(START.0 - 600_000);
    let honest = receipt_of(&cancel(&mut b, at)).unwrap();
    let dearer = UsageReceipt {
        seq: honest.seq + 1,
        gpu_seconds: 300,
        amount_due: gpux_lease::bill::amount(b.renter.request(), 300),
        ..honest.body().clone()
    };
    let dearer = Signed::sign(&host(), dearer).unwrap();
    let answer = b
        .renter
        .handle(at.plus_ms(200), RenterInput::Receipt(dearer));
    assert!(answer.iter().any(|e| matches!(
        e,
        RenterEffect::Respond { envelope }
            if Signed::<LeaseEnd>::from_bytes(envelope.clone()).is_ok()
    )));
}

#[test]
fn a_host_restarted_while_its_window_waits_keeps_it_and_starts_it_at_the_start() {
    let b = booked();
    // The host's node restarts ten minutes before the window: nothing was made for it yet.
    let at = Timestamp(START.0 - 600_000);
    let (mut restored, effects) = gpux_lease::HostLease::restore(
        host(),
        b.host.record().clone(),
        gpux_lease::ContainerState::Absent,
        at,
    )
    .unwrap();
    assert_eq!(restored.phase(), HostPhase::Starting, "{effects:?}");
    assert!(
        effects.iter().any(|e| matches!(
            e,
            HostEffect::Schedule {
                at,
                timer: gpux_lease::HostTimer::StartAt
            } if *at == START
        )),
        "the start scheduled for the window: {effects:?}"
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, HostEffect::StartContainer | HostEffect::SendEnd { .. })),
        "{effects:?}"
    );
    // At the window's start, the work starts.
    let effects = restored.handle(START, HostInput::Timer(gpux_lease::HostTimer::StartAt));
    assert!(effects.contains(&HostEffect::StartContainer), "{effects:?}");
    assert_eq!(restored.record().end, None::<End>);
}
