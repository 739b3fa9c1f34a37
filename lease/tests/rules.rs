//! Rules that a rogue peer or a badly timed crash would test, one by one (found in review).

use gpux_lease::{
    Answer, ContainerState, HostBook, HostEffect, HostInput, HostLease, HostPhase, LedgerCall,
    LedgerMachine, LedgerVerdict, RenterAnswer, Timing,
};
use gpux_market::LedgerConfig;
use gpux_protocol::ledger_wire::{LedgerResponse, RefusalCode};
use gpux_protocol::*;
use gpux_testkit as kit;

pub(crate) const T0: u64 = 1_700_000_000_000;

pub(crate) fn host() -> Keypair {
    kit::key(1)
}
fn renter() -> Keypair {
    kit::key(2)
}
pub(crate) fn ledger_key() -> Keypair {
    kit::key(9)
}

pub(crate) fn offer(t: u64) -> Verified<Offer> {
    kit::sign(&host(), kit::offer(Timestamp(t), [kit::l4(kit::gpu(3))]))
}

fn request(offer: &Verified<Offer>, t: u64, kind: LeaseKind) -> Verified<LeaseRequest> {
    request_by(&renter(), offer, GpuUuid::Gpu([3; 16]), t, kind)
}

/// A request by `renter` for `gpu` of `offer` at `t`: 120 s at 3.60 credits per GPU-hour.
pub(crate) fn request_by(
    renter: &Keypair,
    offer: &Verified<Offer>,
    gpu: GpuUuid,
    t: u64,
    kind: LeaseKind,
) -> Verified<LeaseRequest> {
    kit::sign(
        renter,
        LeaseRequest {
            kind,
            ..kit::request_to(
                host().public(),
                offer.id(),
                [gpu],
                MicroCredits(3_600_000),
                Timestamp(t),
            )
        },
    )
}

fn lock(request: &Verified<LeaseRequest>, price: u64, t: u64) -> Verified<EscrowLock> {
    Signed::sign(
        &renter(),
        EscrowLock {
            escrow: request.escrow,
            lease: request.id(),
            payer: renter().public(),
            payee: host().public(),
            amount: request.escrow_amount,
            price_per_gpu_hour: MicroCredits(price),
            created_at: Timestamp(t),
            ext: Ext::new(),
        },
    )
    .unwrap()
}

/// A lease the host's book accepted at `T0`.
fn accepted() -> (HostLease, Verified<LeaseRequest>) {
    let o = offer(T0);
    let mut book = HostBook::new(host(), Timing::default());
    book.add_offer(o.clone(), Timestamp(T0));
    let r = request(&o, T0, LeaseKind::OnDemand);
    let Answer::Accepted { lease, .. } = book.handle_request(r.clone(), Timestamp(T0), false)
    else {
        panic!("refused");
    };
    (*lease, r)
}

pub(crate) fn submit(ledger: &mut LedgerMachine, envelope: &[u8], t: u64) -> LedgerResponse {
    ledger.submit(Timestamp(t), envelope.to_vec()).response
}

#[test]
fn a_renters_own_lock_for_the_same_escrow_never_starts_the_work() {
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    ledger
        .mint(Timestamp(T0), renter().public(), MicroCredits(1_000_000))
        .unwrap();
    let (mut lease, r) = accepted();
    // The renter locks the escrow itself first, at a price of its own.
    let own = lock(&r, 1, T0 + 10);
    assert!(matches!(
        submit(&mut ledger, own.as_bytes(), T0 + 10),
        LedgerResponse::Record(_)
    ));
    // Then hands the host the honest lock; the ledger refuses it: the escrow is taken.
    let honest = lock(&r, 3_600_000, T0 + 20);
    let effects = lease.handle(Timestamp(T0 + 20), HostInput::Lock(honest.clone()));
    assert!(effects.iter().any(|e| matches!(
        e,
        HostEffect::Ledger {
            call: LedgerCall::Lock,
            ..
        }
    )));
    let response = submit(&mut ledger, honest.as_bytes(), T0 + 30);
    assert_eq!(response.refusal(), Some(RefusalCode::EscrowExists));
    // Even were the ledger to answer with the renter's record, it is not this lock's.
    let forged = LedgerVerdict::from_response(
        submit(&mut ledger, own.as_bytes(), T0 + 40),
        &[ledger_key().public()],
    );
    assert!(matches!(forged, LedgerVerdict::Applied(_)));
    let effects = lease.handle(
        Timestamp(T0 + 40),
        HostInput::Ledger {
            call: LedgerCall::Lock,
            verdict: forged,
        },
    );
    assert!(
        !effects.contains(&HostEffect::StartContainer),
        "{effects:?}"
    );
    assert_ne!(lease.phase(), HostPhase::Starting);
}

#[test]
fn a_lock_of_a_closed_escrow_is_refused_not_answered_with_its_old_record() {
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    ledger
        .mint(Timestamp(T0), renter().public(), MicroCredits(1_000_000))
        .unwrap();
    let (_, r) = accepted();
    let l = lock(&r, 3_600_000, T0);
    assert!(matches!(
        submit(&mut ledger, l.as_bytes(), T0),
        LedgerResponse::Record(_)
    ));
    let release = Signed::sign(
        &host(),
        Release {
            escrow: r.escrow,
            lease: r.id(),
            created_at: Timestamp(T0 + 1),
            ext: Ext::new(),
        },
    )
    .unwrap();
    assert!(matches!(
        submit(&mut ledger, release.as_bytes(), T0 + 1),
        LedgerResponse::Record(_)
    ));
    assert_eq!(
        submit(&mut ledger, l.as_bytes(), T0 + 2).refusal(),
        Some(RefusalCode::EscrowClosed)
    );
}

/// A lease accepted at `T0` whose escrow the ledger locked at `T0 + 20`: its container
/// is being started.
fn starting() -> (HostLease, Verified<LeaseRequest>) {
    let (mut lease, r) = accepted();
    lease.handle(
        Timestamp(T0 + 10),
        HostInput::Lock(lock(&r, 3_600_000, T0 + 10)),
    );
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    ledger
        .mint(Timestamp(T0), renter().public(), MicroCredits(1_000_000))
        .unwrap();
    let verdict = LedgerVerdict::from_response(
        submit(&mut ledger, &lease.record().lock.clone().unwrap(), T0 + 20),
        &[ledger_key().public()],
    );
    let effects = lease.handle(
        Timestamp(T0 + 20),
        HostInput::Ledger {
            call: LedgerCall::Lock,
            verdict,
        },
    );
    assert!(effects.contains(&HostEffect::StartContainer));
    assert_eq!(lease.phase(), HostPhase::Starting);
    (lease, r)
}

#[test]
fn a_host_killed_as_its_container_started_stops_it_after_the_restart() {
    let (lease, _) = starting();
    // Killed now; Docker started the container anyway.
    let (restored, effects) = HostLease::restore(
        host(),
        lease.record().clone(),
        ContainerState::Running {
            started_at: Timestamp(T0 + 500),
        },
        Timestamp(T0 + 5_000),
    )
    .unwrap();
    assert!(
        effects.contains(&HostEffect::StopContainer { grace_s: 0 }),
        "{effects:?}"
    );
    assert_eq!(restored.phase(), HostPhase::Stopping);
}

#[test]
fn a_container_that_does_not_start_is_refused_to_the_renter_saying_so() {
    use gpux_lease::StartFailure;
    for (why, says) in [
        (
            StartFailure::Failed,
            "the container did not start on the host",
        ),
        (StartFailure::ImageMissing, "the image is not on the host"),
    ] {
        let (mut lease, r) = starting();
        // The renter cannot read the host's log: the refusal it gets names what went wrong.
        let effects = lease.handle(Timestamp(T0 + 30), HostInput::ContainerNotStarted(why));
        let reject = effects
            .iter()
            .find_map(|e| match e {
                HostEffect::AnswerLock {
                    envelope,
                    started: false,
                } => match AnySigned::from_bytes(envelope.clone()).and_then(AnySigned::verify) {
                    Ok(AnyVerified::LeaseReject(r)) => Some(r),
                    _ => None,
                },
                _ => None,
            })
            .unwrap_or_else(|| panic!("no refusal: {effects:?}"));
        assert_eq!(reject.detail.as_str(), says);
        assert_eq!(reject.request, r.id());
    }
}

#[test]
fn a_restarted_host_keeps_leased_gpus_out_of_the_market_even_with_no_offer_stored() {
    let (lease, _) = accepted();
    let mut book = HostBook::new(host(), Timing::default());
    // The slot's offer was withdrawn while its GPU was leased: nothing stored lists it.
    book.restore(
        Vec::new(),
        [&lease],
        [(lease.id(), lease.request().expires_at)],
        Timestamp(T0 + 1000),
    );
    assert!(
        book.busy_gpus(Timestamp(T0 + 1000))
            .contains(&GpuUuid::Gpu([3; 16]))
    );
    let o = offer(T0 + 2000);
    book.add_offer(o.clone(), Timestamp(T0 + 2000));
    let answer = book.handle_request(
        request(&o, T0 + 2000, LeaseKind::OnDemand),
        Timestamp(T0 + 2000),
        false,
    );
    assert!(
        matches!(
            answer,
            Answer::Rejected {
                reason: RejectReason::GpusUnavailable,
                ..
            }
        ),
        "{answer:?}"
    );
    // A request answered before the restart stays answered.
    let replay = book.handle_request(lease.request().clone(), Timestamp(T0 + 2000), false);
    assert!(matches!(replay, Answer::Rejected { .. }));
    book.release(&lease.id());
    assert!(book.busy_gpus(Timestamp(T0 + 2000)).is_empty());
}

#[test]
fn reserved_windows_are_booked_ahead_and_start_at_their_start() {
    let o = offer(T0);
    let mut book = HostBook::new(host(), Timing::default());
    book.add_offer(o.clone(), Timestamp(T0));
    // Beyond the horizon: refused, nothing booked.
    let far = LeaseKind::Reserved {
        start: Timestamp(T0 + gpux_lease::MAX_RESERVE_AHEAD_MS + 1),
        end: Timestamp(T0 + gpux_lease::MAX_RESERVE_AHEAD_MS + 120_001),
    };
    let answer = book.handle_request(request(&o, T0, far), Timestamp(T0), false);
    assert!(
        matches!(
            answer,
            Answer::Rejected {
                reason: RejectReason::Invalid,
                ..
            }
        ),
        "{answer:?}"
    );
    assert!(book.bookings_of(&request(&o, T0, far).id()).is_empty());
    // A window a minute ahead: booked for exactly the window, from then.
    let (start, end) = (Timestamp(T0 + 60_000), Timestamp(T0 + 180_000));
    let r = request(&o, T0, LeaseKind::Reserved { start, end });
    let Answer::Accepted {
        lease: mut reserved,
        envelope,
        ..
    } = book.handle_request(r.clone(), Timestamp(T0), false)
    else {
        panic!("refused");
    };
    let accept = Signed::<LeaseAccept>::from_bytes(envelope)
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(gpux_lease::accept_starts_at(&accept), Some(start));
    assert_eq!(
        book.bookings_of(&r.id()),
        vec![(GpuUuid::Gpu([3; 16]), start, end)]
    );
    // The GPU stays offered until the window; during it, it is taken.
    assert!(book.unoffered_gpus(Timestamp(T0)).is_empty());
    assert!(
        book.busy_gpus(start.plus_ms(1))
            .contains(&GpuUuid::Gpu([3; 16]))
    );
    // An on-demand lease that would overlap the window is refused.
    let overlapping = request(&o, T0 + 1_000, LeaseKind::OnDemand);
    assert!(matches!(
        book.handle_request(overlapping, Timestamp(T0 + 1_000), false),
        Answer::Rejected {
            reason: RejectReason::GpusUnavailable,
            ..
        }
    ));
    // Its escrow, held until the start, is locked now; the container starts at the start
    // and stops at the end.
    let mut body = lock(&r, 3_600_000, T0 + 10).body().clone();
    body.ext
        .insert(EXT_LOCK_HOLD_UNTIL, start.0.to_le_bytes().to_vec())
        .unwrap();
    let held = Signed::sign(&renter(), body).unwrap();
    reserved.handle(Timestamp(T0 + 10), HostInput::Lock(held));
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    ledger
        .mint(Timestamp(T0), renter().public(), MicroCredits(1_000_000))
        .unwrap();
    let verdict = LedgerVerdict::from_response(
        submit(
            &mut ledger,
            &reserved.record().lock.clone().unwrap(),
            T0 + 20,
        ),
        &[ledger_key().public()],
    );
    let effects = reserved.handle(
        Timestamp(T0 + 20),
        HostInput::Ledger {
            call: LedgerCall::Lock,
            verdict,
        },
    );
    assert!(!effects.contains(&HostEffect::StartContainer));
    assert!(effects.contains(&HostEffect::Schedule {
        at: start,
        timer: gpux_lease::HostTimer::StartAt,
    }));
    let effects = reserved.handle(start, HostInput::Timer(gpux_lease::HostTimer::StartAt));
    assert!(effects.contains(&HostEffect::StartContainer));
    reserved.handle(
        start.plus_ms(400),
        HostInput::ContainerStarted {
            started_at: start.plus_ms(400),
        },
    );
    assert_eq!(reserved.deadline(), end);
}

#[test]
fn a_host_announcing_endless_timing_is_held_to_an_hour() {
    let accept = LeaseAccept {
        receipt_interval_ms: u64::MAX,
        ack_grace_ms: u64::MAX,
        ..kit::accept(ContentId([1; 32]), Timestamp(T0))
    };
    let timing = Timing::from_accept(&accept);
    assert_eq!(timing.receipt_interval_ms, gpux_lease::MAX_TIMING_MS);
    assert_eq!(timing.ack_grace_ms, gpux_lease::MAX_TIMING_MS);
}

/// A lease running since `T0 + 500`, its escrow locked at a ledger that minted the renter a
/// credit, and the first receipt it signed at `T0 + 61 s`.
fn running_with_a_receipt() -> (HostLease, LedgerMachine, Verified<UsageReceipt>) {
    let (mut lease, r) = accepted();
    lease.handle(
        Timestamp(T0 + 10),
        HostInput::Lock(lock(&r, 3_600_000, T0 + 10)),
    );
    let mut ledger = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    ledger
        .mint(Timestamp(T0), renter().public(), MicroCredits(1_000_000))
        .unwrap();
    let verdict = LedgerVerdict::from_response(
        submit(&mut ledger, &lease.record().lock.clone().unwrap(), T0 + 20),
        &[ledger_key().public()],
    );
    lease.handle(
        Timestamp(T0 + 20),
        HostInput::Ledger {
            call: LedgerCall::Lock,
            verdict,
        },
    );
    lease.handle(
        Timestamp(T0 + 500),
        HostInput::ContainerStarted {
            started_at: Timestamp(T0 + 500),
        },
    );
    let effects = lease.handle(
        Timestamp(T0 + 61_000),
        HostInput::Timer(gpux_lease::HostTimer::ReceiptDue),
    );
    let receipt = effects
        .iter()
        .find_map(|e| match e {
            HostEffect::SendReceipt { envelope, .. } => Some(envelope.clone()),
            _ => None,
        })
        .unwrap();
    let receipt = Signed::<UsageReceipt>::from_bytes(receipt)
        .unwrap()
        .verify()
        .unwrap();
    (lease, ledger, receipt)
}

#[test]
fn an_ack_too_large_to_be_a_voucher_is_no_ack() {
    let (mut lease, _, receipt) = running_with_a_receipt();
    let seq = receipt.seq;
    let mut padding = Ext::new();
    padding.insert(99, vec![0; 300]).unwrap();
    let ack = Signed::sign(
        &renter(),
        ReceiptAck {
            receipt: receipt.id(),
            lease: receipt.lease,
            seq,
            amount_due: receipt.amount_due,
            created_at: Timestamp(T0 + 61_100),
            ext: padding,
        },
    )
    .unwrap();
    assert!(ack.as_bytes().len() > gpux_lease::MAX_VOUCHER_BYTES);
    lease.handle(
        Timestamp(T0 + 61_200),
        HostInput::ReceiptAnswer {
            seq,
            answer: RenterAnswer::Ack(ack),
        },
    );
    assert!(lease.record().acked.is_none());
}

#[test]
fn a_ledger_with_a_faucet_mints_only_its_grants_each_once_and_replays_them() {
    let faucet = Keypair::from_seed(&[7; 32]);
    let config = LedgerConfig {
        faucet: Some(faucet.public()),
        ..LedgerConfig::default()
    };
    let mut ledger = LedgerMachine::new(ledger_key(), config);
    let account = renter().public();
    let grant = |key: &Keypair, nonce: u64| {
        Signed::sign(
            key,
            FaucetGrant {
                account,
                amount: MicroCredits(5_000_000),
                nonce,
                created_at: Timestamp(T0),
                ext: Ext::new(),
            },
        )
        .unwrap()
        .as_bytes()
        .to_vec()
    };
    let mut log = Vec::new();
    // The faucet's grant is applied, with a record of the mint.
    let first = grant(&faucet, 1);
    let out = ledger.submit(Timestamp(T0), first.clone());
    let LedgerResponse::Record(record) = &out.response else {
        panic!("{:?}", out.response);
    };
    let record = Signed::<LedgerRecord>::from_bytes(record.clone())
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(
        record.entry,
        LedgerEntry::Minted {
            account,
            amount: MicroCredits(5_000_000)
        }
    );
    log.extend(out.append);
    assert_eq!(ledger.ledger().balance(&account), MicroCredits(5_000_000));
    // Sent again, it changes nothing.
    let again = ledger.submit(Timestamp(T0 + 1), first);
    assert!(
        matches!(again.response, LedgerResponse::Unchanged(_)),
        "{:?}",
        again.response
    );
    assert!(again.append.is_none());
    // Another grant alike but for its nonce is another grant.
    let out = ledger.submit(Timestamp(T0 + 2), grant(&faucet, 2));
    assert!(matches!(out.response, LedgerResponse::Record(_)));
    log.extend(out.append);
    assert_eq!(ledger.ledger().balance(&account), MicroCredits(10_000_000));
    // Anyone else's grant, the ledger's own key's included, is refused.
    for other in [renter(), ledger_key()] {
        let out = ledger.submit(Timestamp(T0 + 3), grant(&other, 3));
        assert!(
            matches!(
                out.response,
                LedgerResponse::Refused {
                    code: RefusalCode::WrongSigner,
                    ..
                }
            ),
            "{:?}",
            out.response
        );
    }
    // And so is the operator's unsigned mint.
    assert!(
        ledger
            .mint(Timestamp(T0 + 4), account, MicroCredits(1))
            .is_err()
    );
    assert_eq!(ledger.ledger().balance(&account), MicroCredits(10_000_000));
    // The log replays to the same balance, and the replayed ledger still knows the grants.
    let mut replayed = LedgerMachine::replay(
        ledger_key(),
        config,
        log.iter().map(|(p, e)| (*p, e.as_slice())),
    )
    .unwrap();
    assert_eq!(
        replayed.ledger().balance(&account),
        MicroCredits(10_000_000)
    );
    let again = replayed.submit(Timestamp(T0 + 5), grant(&faucet, 1));
    assert!(matches!(again.response, LedgerResponse::Unchanged(_)));
    // A ledger without a faucet takes no grant.
    let mut plain = LedgerMachine::new(ledger_key(), LedgerConfig::default());
    let out = plain.submit(Timestamp(T0), grant(&faucet, 9));
    assert!(matches!(
        out.response,
        LedgerResponse::Refused {
            code: RefusalCode::WrongSigner,
            ..
        }
    ));
}

#[test]
fn a_request_for_more_than_its_gpus_share_of_the_machine_is_refused_as_too_high() {
    // The offer's machine: 16 threads and 64 GiB over 16 GPUs, 1 core and 4 GiB per GPU.
    let o = offer(T0);
    let mut book = HostBook::new(host(), Timing::default());
    book.add_offer(o.clone(), Timestamp(T0));
    let ask = |limits: ResourceLimits| {
        let mut body = request(&o, T0, LeaseKind::OnDemand).body().clone();
        body.limits = limits;
        Signed::sign(&renter(), body).unwrap()
    };
    let greedy = ask(ResourceLimits::sized(1_001, 1 << 30));
    match book.handle_request(greedy, Timestamp(T0), false) {
        Answer::Rejected { reason, .. } => assert_eq!(reason, RejectReason::LimitsTooHigh),
        Answer::Accepted { .. } => panic!("a lease above its share was accepted"),
    }
    let whole = ask(ResourceLimits::sized(1_000, 4 << 30));
    assert!(matches!(
        book.handle_request(whole, Timestamp(T0), false),
        Answer::Accepted { .. }
    ));
}

#[test]
fn a_refusal_for_a_taken_gpu_names_free_gpus_of_the_offer_and_they_are_given() {
    // An offer of four GPUs.
    let mut body = offer(T0).body().clone();
    let gpu = |n: u8| GpuUuid::Gpu([n; 16]);
    body.gpus = BoundedVec::new(
        (3..7)
            .map(|n| OfferGpu {
                uuid: gpu(n),
                ..body.gpus[0].clone()
            })
            .collect(),
    )
    .unwrap();
    let four = Signed::sign(&host(), body).unwrap();
    let mut book = HostBook::new(host(), Timing::default());
    book.add_offer(four.clone(), Timestamp(T0));
    // Two renters ask for the same GPU at once: the first gets it.
    let first = request_by(&renter(), &four, gpu(3), T0 + 10, LeaseKind::OnDemand);
    assert!(matches!(
        book.handle_request(first, Timestamp(T0 + 10), false),
        Answer::Accepted { .. }
    ));
    let other = Keypair::from_seed(&[33; 32]);
    let second = request_by(&other, &four, gpu(3), T0 + 20, LeaseKind::OnDemand);
    let Answer::Rejected { reason, envelope } =
        book.handle_request(second, Timestamp(T0 + 20), false)
    else {
        panic!("the taken GPU was given twice");
    };
    assert_eq!(reason, RejectReason::GpusUnavailable);
    let reject = Signed::<LeaseReject>::from_bytes(envelope)
        .unwrap()
        .verify()
        .unwrap();
    let free = reject_free_gpus(&reject).expect("the refusal names free GPUs");
    assert_eq!(free.len(), 1);
    assert_ne!(free[0], gpu(3));
    // Asked again for the one named, the second renter gets it.
    let again = request_by(&other, &four, free[0], T0 + 30, LeaseKind::OnDemand);
    assert!(matches!(
        book.handle_request(again, Timestamp(T0 + 30), false),
        Answer::Accepted { .. }
    ));
    // The encoding round-trips and refuses what is not one.
    let all: Vec<GpuUuid> = vec![gpu(1), GpuUuid::Mig([2; 16])];
    assert_eq!(decode_gpus(&encode_gpus(&all)), Some(all));
    assert_eq!(decode_gpus(&[2; 17]), None);
    assert_eq!(decode_gpus(&[0; 16]), None);
}

/// A host upgraded mid-lease: its store holds a receipt and its acknowledgement signed as
/// version 1 (the workspace charge in ext key 1). The restored lease redeems them, and the
/// upgraded ledger pays exactly their amount.
#[test]
fn a_host_upgraded_mid_lease_redeems_the_version_1_receipt_its_store_holds() {
    let (lease, mut ledger, receipt) = running_with_a_receipt();
    // The same receipt as the build before signed it, and the renter's ack of that one.
    let v1 = older::usage_receipt_v1(&host(), receipt.body());
    assert_eq!(v1[5], 1);
    let v1_id = ContentId::of(&v1);
    let ack = Signed::sign(
        &renter(),
        ReceiptAck {
            receipt: v1_id,
            lease: receipt.lease,
            seq: receipt.seq,
            amount_due: receipt.amount_due,
            created_at: Timestamp(T0 + 61_100),
            ext: Ext::new(),
        },
    )
    .unwrap();
    let mut stored = lease.record().clone();
    stored.acked = Some(gpux_lease::Voucher {
        seq: receipt.seq,
        amount: receipt.amount_due,
        gpu_seconds: receipt.gpu_seconds,
        receipt: v1,
        ack: ack.as_bytes().to_vec(),
    });
    // Restarted on the new build, from that record.
    let (mut restored, _) = HostLease::restore(
        host(),
        stored,
        ContainerState::Running {
            started_at: Timestamp(T0 + 500),
        },
        Timestamp(T0 + 62_000),
    )
    .unwrap();
    let effects = restored.handle(
        Timestamp(T0 + 62_100),
        HostInput::Timer(gpux_lease::HostTimer::LedgerRetry),
    );
    let redeem = effects
        .iter()
        .find_map(|e| match e {
            HostEffect::Ledger {
                call: LedgerCall::Redeem { seq },
                envelope,
            } => Some((*seq, envelope.clone())),
            _ => None,
        })
        .expect("the restored lease redeems its stored voucher");
    assert_eq!(redeem.0, receipt.seq);
    let before = ledger.ledger().balance(&host().public());
    let answer = submit(&mut ledger, &redeem.1, T0 + 62_200);
    assert_eq!(answer.refusal(), None, "{answer:?}");
    assert_eq!(
        ledger.ledger().balance(&host().public()),
        before.checked_add(receipt.amount_due).unwrap()
    );
}

/// A host that still speaks version 1 of `LeaseAccept` (its terms in ext keys 1 to 4), or
/// the acceptance a renter's store kept from before its upgrade: the renter's machine reads
/// the same timing and start from it as from today's version, and keeps the bytes as
/// signed.
#[test]
fn a_renter_reads_the_timing_and_start_of_a_version_1_acceptance() {
    let o = offer(T0);
    let r = request(&o, T0, LeaseKind::OnDemand);
    let timing = Timing {
        receipt_interval_ms: 5_000,
        ack_grace_ms: 2_000,
        spot_notice_ms: 10_000,
    };
    let today = timing.accept(r.id(), Timestamp(T0 + 5), Some(Timestamp(T0 + 40_000)));
    let v1 = older::lease_accept_v1(&host(), &today);
    assert_eq!(v1[5], 1);
    let accept = Signed::<LeaseAccept>::from_bytes(v1.clone())
        .unwrap()
        .verify()
        .unwrap();
    assert_eq!(accept.body(), &today);
    let (lease, _) = gpux_lease::RenterLease::accepted(
        renter(),
        r,
        &accept,
        ledger_key().public(),
        Timestamp(T0 + 10),
    )
    .unwrap();
    assert_eq!(lease.record().timing, timing);
    assert_eq!(lease.record().starts_at, Timestamp(T0 + 40_000));
    assert_eq!(lease.record().accept, v1);
}
