//! Spot leases and their preemption: who may preempt whom, the notice (signed, kept, sent,
//! checked by the renter), the stop before the notice ends, billing without the minimum and
//! never past the notice, and the preempting lease's later start.

use gpux_lease::{
    Answer, HostBook, HostEffect, HostInput, HostLease, HostPhase, HostTimer, LedgerCall,
    LedgerMachine, LedgerVerdict, LockOutcome, RenterEffect, RenterInput, RenterLease, Timing,
};
use gpux_market::LedgerConfig;
use gpux_protocol::*;
use gpux_testkit as kit;

use crate::rules::{T0, host, ledger_key, offer, submit};

const GPU: GpuUuid = GpuUuid::Gpu([3; 16]);
const PRICE: u64 = 3_600_000;
const FLOOR: u64 = 1_000_000;

pub(crate) fn spot_offer(t: u64) -> Verified<Offer> {
    let mut body = offer(t).body().clone();
    body.spot_floor_per_gpu_hour = Some(MicroCredits(FLOOR));
    Signed::sign(&host(), body).unwrap()
}

/// A host's book with one spot offer (notice 30 s), at `T0`.
pub(crate) fn spot_market() -> (HostBook, Verified<Offer>) {
    let timing = Timing {
        spot_notice_ms: 30_000,
        ..Timing::default()
    };
    let o = spot_offer(T0);
    let mut book = HostBook::new(host(), timing);
    book.add_offer(o.clone(), Timestamp(T0));
    (book, o)
}

pub(crate) fn request(
    who: &Keypair,
    offer: &Verified<Offer>,
    t: u64,
    kind: LeaseKind,
    price: u64,
) -> Verified<LeaseRequest> {
    kit::sign(
        who,
        LeaseRequest {
            duration_s: 600,
            kind,
            escrow: EscrowId([t as u8; 16]),
            escrow_amount: MicroCredits(1_000_000),
            ..kit::request_to(
                host().public(),
                offer.id(),
                [GPU],
                MicroCredits(price),
                Timestamp(t),
            )
        },
    )
}

pub(crate) fn spot_renter() -> Keypair {
    Keypair::from_seed(&[21; 32])
}
pub(crate) fn other_renter() -> Keypair {
    Keypair::from_seed(&[22; 32])
}

pub(crate) struct Accepted {
    pub(crate) lease: HostLease,
    pub(crate) accept: Verified<LeaseAccept>,
    pub(crate) preempts: Vec<ContentId>,
}

pub(crate) fn accept(
    book: &mut HostBook,
    r: &Verified<LeaseRequest>,
    t: u64,
) -> Result<Accepted, RejectReason> {
    match book.handle_request(r.clone(), Timestamp(t), false) {
        Answer::Accepted {
            lease,
            envelope,
            preempts,
            ..
        } => Ok(Accepted {
            lease: *lease,
            accept: Signed::<LeaseAccept>::from_bytes(envelope)
                .unwrap()
                .verify()
                .unwrap(),
            preempts,
        }),
        Answer::Rejected { reason, .. } => Err(reason),
    }
}

/// The lock `who` signs at `t` for `lease`, held until its booking starts when it starts
/// later (as a renter's node signs it), or not held at all when `held` is false.
pub(crate) fn sign_lock(
    lease: &HostLease,
    who: &Keypair,
    t: u64,
    held: bool,
) -> Verified<EscrowLock> {
    let r = lease.request();
    let mut ext = Ext::new();
    let starts_at = lease.record().starts_at;
    if held && starts_at > lease.record().accepted_at {
        ext.insert(EXT_LOCK_HOLD_UNTIL, starts_at.0.to_le_bytes().to_vec())
            .unwrap();
    }
    Signed::sign(
        who,
        EscrowLock {
            escrow: r.escrow,
            lease: r.id(),
            payer: who.public(),
            payee: host().public(),
            amount: r.escrow_amount,
            price_per_gpu_hour: r.price_per_gpu_hour,
            created_at: Timestamp(t),
            ext,
        },
    )
    .unwrap()
}

/// The host's side locked at the ledger at `t` with `lock` (or one `who` signs now);
/// returns the effects of the lock's verdict.
pub(crate) fn lock_at_ledger(
    lease: &mut HostLease,
    who: &Keypair,
    lock: Option<Verified<EscrowLock>>,
    ledger: &mut LedgerMachine,
    t: u64,
) -> (Vec<HostEffect>, Verified<LedgerRecord>) {
    let lock = lock.unwrap_or_else(|| sign_lock(lease, who, t, true));
    ledger
        .mint(Timestamp(t), who.public(), MicroCredits(1_000_000))
        .unwrap();
    lease.handle(Timestamp(t), HostInput::Lock(lock.clone()));
    let response = submit(ledger, lock.as_bytes(), t);
    let verdict = LedgerVerdict::from_response(response, &[ledger_key().public()]);
    let LedgerVerdict::Applied(record) = verdict.clone() else {
        panic!("the ledger refused the lock: {verdict:?}");
    };
    let effects = lease.handle(
        Timestamp(t),
        HostInput::Ledger {
            call: LedgerCall::Lock,
            verdict,
        },
    );
    (effects, *record)
}

/// The renter's side of an accepted lease, and the escrow lock it sends.
pub(crate) fn renter_lease(
    who: Keypair,
    request: &Verified<LeaseRequest>,
    accept: &Verified<LeaseAccept>,
    t: u64,
) -> (RenterLease, Verified<EscrowLock>) {
    let (lease, effects) = RenterLease::accepted(
        who,
        request.clone(),
        accept,
        ledger_key().public(),
        Timestamp(t),
    )
    .unwrap();
    let lock = effects
        .iter()
        .find_map(|e| match e {
            RenterEffect::SendLock { envelope } => Some(
                Signed::<EscrowLock>::from_bytes(envelope.clone())
                    .unwrap()
                    .verify()
                    .unwrap(),
            ),
            _ => None,
        })
        .unwrap();
    (lease, lock)
}

fn notice_of(effects: &[HostEffect]) -> Option<(Vec<u8>, Timestamp)> {
    effects.iter().find_map(|e| match e {
        HostEffect::Notify { envelope, ends_at } => Some((envelope.clone(), *ends_at)),
        _ => None,
    })
}

pub(crate) fn receipt_of(effects: &[HostEffect]) -> Option<Verified<UsageReceipt>> {
    effects.iter().find_map(|e| match e {
        HostEffect::SendReceipt { envelope, .. } => Some(
            Signed::<UsageReceipt>::from_bytes(envelope.clone())
                .unwrap()
                .verify()
                .unwrap(),
        ),
        _ => None,
    })
}

#[test]
fn an_on_demand_request_preempts_a_spot_lease_after_its_notice_and_pays_from_then() {
    let (mut book, o) = spot_market();
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());

    // A spot lease at 1.2 credits per GPU-hour runs from T0 + 1 s.
    let spot_r = request(&spot_renter(), &o, T0, LeaseKind::Spot, 1_200_000);
    let mut spot = accept(&mut book, &spot_r, T0).unwrap();
    assert!(spot.preempts.is_empty());
    // Its GPU stays offered: an on-demand lease may preempt it.
    assert!(!book.unoffered_gpus(Timestamp(T0 + 1)).contains(&GPU));
    let (mut renter, renters_lock) = renter_lease(spot_renter(), &spot_r, &spot.accept, T0 + 10);
    let (effects, record) = lock_at_ledger(
        &mut spot.lease,
        &spot_renter(),
        Some(renters_lock),
        &mut ledger,
        T0 + 20,
    );
    assert!(effects.contains(&HostEffect::StartContainer));
    renter.handle(
        Timestamp(T0 + 1_000),
        RenterInput::Lock(LockOutcome::Record(Box::new(record))),
    );
    spot.lease.handle(
        Timestamp(T0 + 1_000),
        HostInput::ContainerStarted {
            started_at: Timestamp(T0 + 1_000),
        },
    );

    // A spot bid less than a tenth higher may not preempt it; one a tenth higher may.
    let low = request(&other_renter(), &o, T0 + 5_000, LeaseKind::Spot, 1_300_000);
    assert_eq!(
        accept(&mut book, &low, T0 + 5_000).err(),
        Some(RejectReason::GpusUnavailable)
    );
    assert!(validate::may_preempt(&spot_r, spot_r.id(), &low).is_err());
    let high = request(&other_renter(), &o, T0 + 5_000, LeaseKind::Spot, 1_320_000);
    assert!(validate::may_preempt(&spot_r, spot_r.id(), &high).is_ok());

    // An on-demand request at T0 + 20 s: accepted, booked from the end of a notice given
    // within the lock window (+ the hand-over), and it names the spot lease to preempt.
    let od_r = request(&other_renter(), &o, T0 + 20_000, LeaseKind::OnDemand, PRICE);
    let mut od = accept(&mut book, &od_r, T0 + 20_000).unwrap();
    assert_eq!(od.preempts, vec![spot_r.id()]);
    let starts_at = Timestamp(T0 + 20_000 + 10_000 + 30_000 + gpux_lease::PREEMPT_HANDOVER_MS);
    assert_eq!(gpux_lease::accept_starts_at(&od.accept), Some(starts_at));
    assert_eq!(od.lease.record().starts_at, starts_at);
    // Now the GPU is promised to a lease no one preempts: it leaves the offers at once.
    assert!(book.unoffered_gpus(Timestamp(T0 + 20_000)).contains(&GPU));
    assert!(book.unoffered_gpus(starts_at).contains(&GPU));

    // The renter's node holds its escrow until then.
    let (_, held) = renter_lease(other_renter(), &od_r, &od.accept, T0 + 20_010);
    assert_eq!(held.hold_until().unwrap(), Some(starts_at));
    // A lock its payer could take back before the lease starts is refused.
    let unheld = sign_lock(&od.lease, &other_renter(), T0 + 20_000, false);
    let effects = od
        .lease
        .handle(Timestamp(T0 + 20_000), HostInput::Lock(unheld));
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, HostEffect::Ledger { .. }))
    );
    assert_eq!(od.lease.phase(), gpux_lease::HostPhase::AwaitingLock);

    // The preempting lease's escrow is locked, held until it starts: its lock is answered
    // at once, the spot lease is to get its notice, and its container waits for the
    // booking's start.
    let (effects, _) = lock_at_ledger(
        &mut od.lease,
        &other_renter(),
        None,
        &mut ledger,
        T0 + 20_000,
    );
    assert!(effects.contains(&HostEffect::PreemptSpot {
        leases: vec![spot_r.id()]
    }));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, HostEffect::AnswerLock { started: false, .. }))
    );
    assert!(!effects.contains(&HostEffect::StartContainer));
    assert!(effects.contains(&HostEffect::Schedule {
        at: starts_at,
        timer: HostTimer::StartAt,
    }));
    book.preempting_locked(&od_r.id());

    // The spot lease gets its notice: signed, kept, written for the workload and sent.
    let effects = spot.lease.handle(
        Timestamp(T0 + 20_000),
        HostInput::Preempt(Box::new(od_r.clone())),
    );
    let (envelope, ends_at) = notice_of(&effects).expect("a notice");
    assert_eq!(ends_at, Timestamp(T0 + 50_000));
    assert_eq!(spot.lease.deadline(), ends_at);
    assert!(effects.contains(&HostEffect::Schedule {
        at: Timestamp(T0 + 40_000),
        timer: HostTimer::Preempt,
    }));
    // A second preemption changes nothing.
    let again = spot.lease.handle(
        Timestamp(T0 + 21_000),
        HostInput::Preempt(Box::new(od_r.clone())),
    );
    assert!(notice_of(&again).is_none());

    // The renter checks it: it cites a live on-demand request for its GPU, with the agreed
    // notice. It caps what may be billed at the notice's end.
    let notice = Signed::<PreemptionNotice>::from_bytes(envelope)
        .unwrap()
        .verify()
        .unwrap();
    renter.handle(Timestamp(T0 + 20_100), RenterInput::Notice(notice));
    assert_eq!(renter.record().preempted_until, Some(ends_at));
    assert!(!renter.record().notice_refused);

    // Ten seconds before the end the workload is asked to stop, and killed at the end.
    let effects = spot
        .lease
        .handle(Timestamp(T0 + 40_000), HostInput::Timer(HostTimer::Preempt));
    assert!(effects.contains(&HostEffect::StopContainer { grace_s: 10 }));
    // It saved its work and exited at T0 + 43.5 s: billed 42 s, with no minimum.
    let effects = spot.lease.handle(
        Timestamp(T0 + 43_600),
        HostInput::ContainerExited {
            finished_at: Some(Timestamp(T0 + 43_500)),
            exit_code: Some(0),
        },
    );
    let last = receipt_of(&effects).expect("the final receipt");
    assert_eq!(last.gpu_seconds, 42);
    assert_eq!(
        last.amount_due,
        money::cost(42, MicroCredits(1_200_000)).unwrap()
    );
    assert_eq!(spot.lease.phase(), HostPhase::FinalReceipt);
    // The renter acknowledges it.
    let answer = renter.handle(Timestamp(T0 + 43_700), RenterInput::Receipt(last));
    assert!(renter.record().acked.is_some(), "{answer:?}");
    assert_eq!(
        renter.record().acked.as_ref().map(|v| v.gpu_seconds),
        Some(42)
    );
    // The lease ended preempted.
    assert_eq!(spot.lease.record().end, Some(gpux_lease::End::Preempted));

    // The preempting lease starts at the booking's start, not before.
    let early = od
        .lease
        .handle(Timestamp(T0 + 30_000), HostInput::Timer(HostTimer::StartAt));
    assert!(!early.contains(&HostEffect::StartContainer));
    let effects = od
        .lease
        .handle(starts_at, HostInput::Timer(HostTimer::StartAt));
    assert!(effects.contains(&HostEffect::StartContainer));
    // Its deadline runs from its own start: the whole duration.
    od.lease.handle(
        starts_at,
        HostInput::ContainerStarted {
            started_at: starts_at,
        },
    );
    assert_eq!(od.lease.deadline(), starts_at.plus_secs(600));
}

#[test]
fn a_renter_refuses_a_notice_that_cites_no_request_that_may_preempt_it() {
    let (mut book, o) = spot_market();
    let spot_r = request(&spot_renter(), &o, T0, LeaseKind::Spot, 1_200_000);
    let spot = accept(&mut book, &spot_r, T0).unwrap();
    let (mut renter, _) = renter_lease(spot_renter(), &spot_r, &spot.accept, T0 + 10);
    let notice = |preemptor: &Verified<LeaseRequest>, created: u64, ends: u64| {
        Signed::sign(
            &host(),
            PreemptionNotice {
                lease: spot_r.id(),
                created_at: Timestamp(created),
                ends_at: Timestamp(ends),
                preemptor: BoundedBytes::new(preemptor.as_bytes().to_vec()).unwrap(),
                ext: Ext::new(),
            },
        )
        .unwrap()
    };
    let t = T0 + 20_000;
    let cases = [
        // The lease itself.
        notice(&spot_r, t, t + 30_000),
        // A spot bid that does not outbid it by a tenth.
        notice(
            &request(&other_renter(), &o, t, LeaseKind::Spot, 1_250_000),
            t,
            t + 30_000,
        ),
        // A request long expired.
        notice(
            &request(
                &other_renter(),
                &o,
                T0 - 120_000,
                LeaseKind::OnDemand,
                PRICE,
            ),
            t,
            t + 30_000,
        ),
        // A notice shorter than agreed.
        notice(
            &request(&other_renter(), &o, t, LeaseKind::OnDemand, PRICE),
            t,
            t + 10_000,
        ),
    ];
    for n in cases {
        renter.handle(Timestamp(t + 100), RenterInput::Notice(n));
        assert_eq!(renter.record().preempted_until, None);
        assert!(renter.record().notice_refused);
    }
    // A valid one holds.
    let valid = notice(
        &request(&other_renter(), &o, t, LeaseKind::OnDemand, PRICE),
        t,
        t + 30_000,
    );
    renter.handle(Timestamp(t + 100), RenterInput::Notice(valid));
    assert_eq!(renter.record().preempted_until, Some(Timestamp(t + 30_000)));
}

#[test]
fn a_request_that_never_locks_its_escrow_preempts_nobody() {
    let (mut book, o) = spot_market();
    let spot_r = request(&spot_renter(), &o, T0, LeaseKind::Spot, 1_200_000);
    accept(&mut book, &spot_r, T0).unwrap();
    let whole = book.bookings_of(&spot_r.id());
    // An on-demand request is accepted over it; its renter never locks.
    let od_r = request(&other_renter(), &o, T0 + 5_000, LeaseKind::OnDemand, PRICE);
    let mut od = accept(&mut book, &od_r, T0 + 5_000).unwrap();
    assert_eq!(od.preempts, vec![spot_r.id()]);
    assert_ne!(
        book.bookings_of(&spot_r.id()),
        whole,
        "cut while the request waits"
    );
    let effects = od.lease.handle(
        Timestamp(T0 + 35_000),
        HostInput::Timer(HostTimer::LockWait),
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, HostEffect::PreemptSpot { .. }))
    );
    assert!(effects.contains(&HostEffect::FreeGpus));
    // The shell frees its GPUs: the spot lease is booked whole again, so a reservation
    // over its time is refused.
    book.release(&od_r.id());
    assert_eq!(book.bookings_of(&spot_r.id()), whole);
    let reserved = request(
        &other_renter(),
        &o,
        T0 + 40_000,
        LeaseKind::Reserved {
            start: Timestamp(T0 + 40_000),
            end: Timestamp(T0 + 640_000),
        },
        PRICE,
    );
    assert_eq!(
        accept(&mut book, &reserved, T0 + 40_000).err(),
        Some(RejectReason::GpusUnavailable)
    );
}

#[test]
fn spot_leases_bill_no_minimum_and_on_demand_leases_do() {
    let o = spot_offer(T0);
    let spot = request(&spot_renter(), &o, T0, LeaseKind::Spot, 1_200_000);
    let od = request(&spot_renter(), &o, T0, LeaseKind::OnDemand, PRICE);
    assert_eq!(gpux_lease::bill::request_gpu_seconds(&spot, 20_999), 20);
    assert_eq!(gpux_lease::bill::request_gpu_seconds(&od, 20_999), 60);
    // Never past the duration either way.
    assert_eq!(gpux_lease::bill::request_gpu_seconds(&spot, u64::MAX), 600);
}
