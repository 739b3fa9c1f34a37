//! The settlement ledger: flows, refusals, and conservation over random operation sequences.

use gpux_market::*;
use gpux_protocol::*;
use gpux_testkit as kit;
use proptest::prelude::*;

use crate::common::*;

struct Lease {
    renter: Keypair,
    host: Keypair,
    lease: ContentId,
    escrow: EscrowId,
    price: MicroCredits,
}

impl Lease {
    fn new(n: u8, renter: Keypair, host: Keypair) -> Self {
        Lease {
            renter,
            host,
            lease: ContentId([n; 32]),
            escrow: EscrowId([n; 16]),
            price: MicroCredits(3_600),
        }
    }

    fn lock(&self, amount: u64) -> Verified<EscrowLock> {
        Signed::sign(
            &self.renter,
            EscrowLock {
                escrow: self.escrow,
                lease: self.lease,
                payer: self.renter.public(),
                payee: self.host.public(),
                amount: MicroCredits(amount),
                price_per_gpu_hour: self.price,
                created_at: T0,
                ext: Ext::new(),
            },
        )
        .unwrap()
    }

    /// A receipt for `gpu_seconds` (1 micro-credit per GPU-second at this price), acked.
    fn redeem(&self, seq: u64, gpu_seconds: u64) -> Verified<Redeem> {
        let receipt = kit::sign(
            &self.host,
            kit::receipt(self.lease, self.escrow, self.price, seq, gpu_seconds, T0),
        );
        let ack = Signed::sign(
            &self.renter,
            ReceiptAck {
                receipt: receipt.id(),
                lease: self.lease,
                seq,
                amount_due: receipt.amount_due,
                created_at: T0,
                ext: Ext::new(),
            },
        )
        .unwrap();
        Signed::sign(
            &self.host,
            Redeem {
                escrow: self.escrow,
                lease: self.lease,
                receipt: BoundedBytes::new(receipt.as_bytes().to_vec()).unwrap(),
                ack: BoundedBytes::new(ack.as_bytes().to_vec()).unwrap(),
                created_at: T0,
                ext: Ext::new(),
            },
        )
        .unwrap()
    }

    /// A payer's release carrying the voucher of `redeem` (the ack inside it).
    fn release_with_voucher(&self, voucher: &Verified<Redeem>) -> Verified<Release> {
        let mut body = Release {
            escrow: self.escrow,
            lease: self.lease,
            created_at: T0,
            ext: Ext::new(),
        };
        body.set_voucher(&voucher.ack).unwrap();
        Signed::sign(&self.renter, body).unwrap()
    }

    fn release(&self, by: &Keypair) -> Verified<Release> {
        Signed::sign(
            by,
            Release {
                escrow: self.escrow,
                lease: self.lease,
                created_at: T0,
                ext: Ext::new(),
            },
        )
        .unwrap()
    }
}

fn minted(ledger: &mut Ledger, who: &Keypair, amount: u64) {
    ledger
        .apply(
            LedgerOp::Mint {
                account: who.public(),
                amount: MicroCredits(amount),
            },
            T0,
        )
        .unwrap();
}

#[test]
fn a_lease_settles_exactly_once() {
    let l = Lease::new(1, key(1), key(2));
    let mut ledger = Ledger::new(LedgerConfig::default());
    minted(&mut ledger, &l.renter, 1_000);
    assert_eq!(
        ledger.apply(LedgerOp::Lock(&l.lock(600)), T0).unwrap(),
        Applied::Locked {
            amount: MicroCredits(600)
        }
    );
    assert_eq!(ledger.balance(&l.renter.public()), MicroCredits(400));
    let r1 = l.redeem(1, 100);
    let r2 = l.redeem(2, 250);
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&r1), T0).unwrap(),
        Applied::Redeemed {
            amount: MicroCredits(100),
            ..
        }
    ));
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&r2), T0).unwrap(),
        Applied::Redeemed {
            amount: MicroCredits(150),
            ..
        }
    ));
    // Replayed and out-of-order redemptions change nothing.
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&r2), T0).unwrap(),
        Applied::AlreadyRedeemed {
            seq: 2,
            last_seq: 2
        }
    ));
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&r1), T0).unwrap(),
        Applied::AlreadyRedeemed {
            seq: 1,
            last_seq: 2
        }
    ));
    assert_eq!(ledger.balance(&l.host.public()), MicroCredits(250));
    // Never more than the escrow.
    assert!(matches!(
        ledger
            .apply(LedgerOp::Redeem(&l.redeem(3, 10_000)), T0)
            .unwrap(),
        Applied::Redeemed {
            amount: MicroCredits(350),
            cumulative: MicroCredits(600),
            ..
        }
    ));
    assert_eq!(
        ledger
            .apply(LedgerOp::Release(&l.release(&l.host)), T0)
            .unwrap(),
        Applied::Released {
            refunded: MicroCredits(0),
            voucher_paid: MicroCredits(0),
        }
    );
    assert_eq!(ledger.total(), u128::from(ledger.minted().0));
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&l.redeem(4, 1)), T0),
        Err(LedgerError::EscrowClosed(_))
    ));
}

#[test]
fn a_hosts_history_names_each_payer_with_what_it_paid_and_whom_else() {
    let (host, other) = (key(20), key(21));
    let (a, b, c) = (key(1), key(2), key(3));
    let mut ledger = Ledger::new(LedgerConfig::default());
    for who in [&a, &b, &c, &host] {
        minted(&mut ledger, who, 10_000);
    }
    // a pays the host twice and the other host once; b pays the host once; c's escrow to
    // the host closes unpaid; one of a's escrows is still open. (A host cannot lock an
    // escrow to itself: the lock is refused as a message.)
    let mut n = 0;
    let mut lease = |renter: &Keypair, payee: &Keypair, paid: u64, close: bool| {
        n += 1;
        let l = Lease::new(n, renter.clone(), payee.clone());
        ledger.apply(LedgerOp::Lock(&l.lock(500)), T0).unwrap();
        if paid > 0 {
            ledger
                .apply(LedgerOp::Redeem(&l.redeem(1, paid)), T0)
                .unwrap();
        }
        if close {
            ledger
                .apply(LedgerOp::Release(&l.release(&l.host)), T0)
                .unwrap();
        }
    };
    lease(&a, &host, 100, true);
    lease(&a, &host, 50, true);
    lease(&a, &host, 50, false);
    lease(&a, &other, 10, true);
    lease(&b, &host, 20, true);
    lease(&c, &host, 0, true);
    let history = ledger.history(&host.public());
    let rows: Vec<_> = history
        .payers
        .iter()
        .map(|p| (p.payer, p.paid, p.unpaid, p.other_payees))
        .collect();
    let mut want = vec![
        (a.public(), 2, 0, 1),
        (b.public(), 1, 0, 0),
        (c.public(), 0, 1, 0),
    ];
    // The most paid first, then by key.
    want.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    assert_eq!(rows, want);
    assert_eq!(history.payers_total, 3);
    // Only a counts for the host's reputation: b paid nobody else, c paid nothing.
    let config = reputation::ReputationConfig::default();
    assert_eq!(
        reputation::ledger_evidence(&host.public(), &history, &config),
        2.0 * config.settled
    );
    assert!(ledger.history(&key(99).public()).payers.is_empty());
}

#[test]
fn the_closing_release_states_how_the_lease_ended_and_the_host_s_ends_count_it() {
    let (host, other) = (key(20), key(21));
    let (a, b) = (key(1), key(2));
    let mut ledger = Ledger::new(LedgerConfig::default());
    for who in [&a, &b] {
        minted(&mut ledger, who, 10_000);
    }
    let outcome = |reason, spot| LeaseOutcome { reason, spot };
    let mut n = 0;
    // `closer` closes each escrow, stating `stated` (or nothing).
    let mut lease =
        |renter: &Keypair, payee: &Keypair, by_host: bool, stated: Option<LeaseOutcome>| {
            n += 1;
            let l = Lease::new(n, renter.clone(), payee.clone());
            ledger.apply(LedgerOp::Lock(&l.lock(500)), T0).unwrap();
            ledger
                .apply(LedgerOp::Redeem(&l.redeem(1, 10)), T0)
                .unwrap();
            let closer = if by_host { &l.host } else { &l.renter };
            let mut body = l.release(closer).body().clone();
            if let Some(o) = stated {
                body.set_outcome(o).unwrap();
            }
            let release = Signed::sign(closer, body).unwrap();
            assert_eq!(release.outcome().unwrap(), stated);
            let at = Timestamp(T0.0 + 3_600_000);
            ledger.apply(LedgerOp::Release(&release), at).unwrap();
        };
    let preempted = outcome(EndReason::Preempted, true);
    let silent = outcome(EndReason::ReceiptNotAcknowledged, false);
    lease(&a, &host, true, Some(preempted));
    lease(&a, &host, true, Some(preempted));
    lease(&a, &host, false, Some(silent));
    lease(&a, &host, true, None);
    lease(
        &a,
        &other,
        true,
        Some(outcome(EndReason::DurationReached, false)),
    );
    lease(
        &b,
        &host,
        true,
        Some(outcome(EndReason::DurationReached, true)),
    );
    let ends = ledger.ends(&host.public());
    // The payer with the most stated outcomes first; the other host's lease is not counted;
    // an escrow closed without a statement counts for nothing.
    assert_eq!(ends.payers.len(), 2);
    let first = &ends.payers[0];
    assert_eq!((first.payer, first.other_payees), (a.public(), 1));
    let counts: Vec<_> = first
        .ends
        .iter()
        .map(|c| (c.outcome, c.by_host, c.count))
        .collect();
    assert_eq!(counts.len(), 2);
    assert!(counts.contains(&(preempted, true, 2)));
    assert!(counts.contains(&(silent, false, 1)));
    assert_eq!(ends.payers[1].payer, b.public());
    // a is a witness (it paid another host): two spot leases preempted of two, and one
    // silence by its word; b paid nobody else and counts for nothing.
    let config = reputation::ReputationConfig::default();
    let e = reputation::ledger_end_evidence(&host.public(), &ends, &config);
    assert_eq!((e.spot, e.preempted), (2.0, 2.0));
    assert_eq!(e.bad, config.failure);
    // A malformed statement does not verify at all.
    let l = Lease::new(99, a.clone(), host.clone());
    let mut body = l.release(&a).body().clone();
    body.ext.insert(EXT_RELEASE_END, vec![200, 7]).unwrap();
    assert!(Signed::sign(&a, body).is_err());
}

#[test]
fn refusals_leave_the_ledger_unchanged() {
    let l = Lease::new(1, key(1), key(2));
    let stranger = key(3);
    let mut ledger = Ledger::new(LedgerConfig::default());
    minted(&mut ledger, &l.renter, 100);
    assert!(matches!(
        ledger.apply(LedgerOp::Lock(&l.lock(101)), T0),
        Err(LedgerError::InsufficientFunds { .. })
    ));
    ledger.apply(LedgerOp::Lock(&l.lock(100)), T0).unwrap();
    assert!(matches!(
        ledger.apply(LedgerOp::Lock(&l.lock(100)), T0),
        Err(LedgerError::EscrowExists(_))
    ));

    // A redemption signed by someone else, a receipt by someone else, an ack by someone else.
    let forged = Signed::sign(&stranger, l.redeem(1, 10).body().clone()).unwrap();
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&forged), T0),
        Err(LedgerError::WrongSigner { .. })
    ));
    let wrong_host = Lease {
        host: stranger.clone(),
        ..Lease::new(1, key(1), key(3))
    };
    // The redemption is the payee's, but the receipt inside was signed by another key.
    let redeem = Signed::sign(&l.host, wrong_host.redeem(1, 10).body().clone()).unwrap();
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&redeem), T0),
        Err(LedgerError::WrongSigner {
            what: "the receipt",
            ..
        })
    ));
    let self_acked = Lease {
        renter: l.host.clone(),
        ..Lease::new(1, key(1), key(2))
    };
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&self_acked.redeem(1, 10)), T0),
        Err(LedgerError::Mismatch(
            validate::RuleError::SignerMismatch { .. }
        ))
    ));
    // A receipt at another price.
    let pricier = Lease {
        price: MicroCredits(7_200),
        ..Lease::new(1, key(1), key(2))
    };
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&pricier.redeem(1, 10)), T0),
        Err(LedgerError::Mismatch(_))
    ));
    // Tampered receipt bytes inside a validly signed redemption.
    let mut tampered = l.redeem(1, 10).body().clone();
    let mut bytes = tampered.receipt.to_vec();
    bytes[60] ^= 1;
    tampered.receipt = BoundedBytes::new(bytes).unwrap();
    let tampered = Signed::sign(&l.host, tampered).unwrap();
    assert!(matches!(
        ledger.apply(LedgerOp::Redeem(&tampered), T0),
        Err(LedgerError::BadEnvelope {
            what: "the receipt",
            ..
        })
    ));
    assert_eq!(ledger.balance(&l.host.public()), MicroCredits(0));

    // The renter may take the rest back only after the grace period; strangers never.
    assert!(matches!(
        ledger.apply(LedgerOp::Release(&l.release(&stranger)), T0),
        Err(LedgerError::WrongSigner { .. })
    ));
    assert!(matches!(
        ledger.apply(LedgerOp::Release(&l.release(&l.renter)), T0.plus_secs(599)),
        Err(LedgerError::TooEarly(_))
    ));
    assert_eq!(
        ledger
            .apply(LedgerOp::Release(&l.release(&l.renter)), T0.plus_secs(600))
            .unwrap(),
        Applied::Released {
            refunded: MicroCredits(100),
            voucher_paid: MicroCredits(0),
        }
    );
    assert_eq!(ledger.balance(&l.renter.public()), MicroCredits(100));
    assert_eq!(ledger.total(), u128::from(ledger.minted().0));
}

#[derive(Debug, Clone)]
enum Op {
    Mint(usize, u64),
    Lock(usize, u64),
    Redeem(usize, u64, u64),
    ReleaseByHost(usize),
    ReleaseByRenter(usize, u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..2, 0u64..5_000).prop_map(|(r, a)| Op::Mint(r, a)),
        (0usize..4, 1u64..3_000).prop_map(|(l, a)| Op::Lock(l, a)),
        (0usize..4, 1u64..8, 0u64..4_000).prop_map(|(l, s, g)| Op::Redeem(l, s, g)),
        (0usize..4).prop_map(Op::ReleaseByHost),
        (0usize..4, 0u64..1_200).prop_map(|(l, t)| Op::ReleaseByRenter(l, t)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn credits_are_conserved_and_redemption_is_idempotent(ops in prop::collection::vec(arb_op(), 1..40)) {
        let renters = [key(1), key(2)];
        let hosts = [key(3), key(4)];
        let leases: Vec<Lease> = (0..4).map(|i| Lease::new(i as u8 + 1, renters[i % 2].clone(), hosts[i / 2].clone())).collect();
        let mut ledger = Ledger::new(LedgerConfig::default());
        for op in ops {
            let before = ledger.clone();
            let result = match &op {
                Op::Mint(r, a) => ledger.apply(LedgerOp::Mint { account: renters[*r].public(), amount: MicroCredits(*a) }, T0),
                Op::Lock(l, a) => ledger.apply(LedgerOp::Lock(&leases[*l].lock(*a)), T0),
                Op::Redeem(l, s, g) => {
                    let redeem = leases[*l].redeem(*s, *g);
                    let first = ledger.apply(LedgerOp::Redeem(&redeem), T0);
                    if first.is_ok() {
                        // The same redemption again is a no-op.
                        let snapshot = ledger.total();
                        let again = ledger.apply(LedgerOp::Redeem(&redeem), T0).unwrap();
                        prop_assert!(matches!(again, Applied::AlreadyRedeemed { .. }), "{again:?}");
                        prop_assert_eq!(ledger.total(), snapshot);
                    }
                    first
                }
                Op::ReleaseByHost(l) => ledger.apply(LedgerOp::Release(&leases[*l].release(&leases[*l].host)), T0),
                Op::ReleaseByRenter(l, t) => {
                    ledger.apply(LedgerOp::Release(&leases[*l].release(&leases[*l].renter)), T0.plus_secs(*t))
                }
            };
            if result.is_err() {
                // A refused operation changes nothing.
                prop_assert_eq!(ledger.total(), before.total());
                for k in renters.iter().chain(&hosts) {
                    prop_assert_eq!(ledger.balance(&k.public()), before.balance(&k.public()));
                }
            }
            prop_assert_eq!(ledger.total(), u128::from(ledger.minted().0), "after {:?}", op);
            let mut paid = [0u64; 2];
            for (i, l) in leases.iter().enumerate() {
                if let Some(e) = ledger.escrow(&l.escrow) {
                    prop_assert!(e.redeemed <= e.amount);
                    paid[i / 2] += e.redeemed.0;
                }
            }
            // Hosts are paid only through redemptions.
            for (h, host) in hosts.iter().enumerate() {
                prop_assert_eq!(ledger.balance(&host.public()).0, paid[h]);
            }
        }
    }
}

/// A lock with a hold (a lease whose work starts later): its payer may release only after
/// the hold plus the grace, however idle the escrow was before; the payee at any time.
#[test]
fn a_held_escrow_stays_until_its_hold_plus_the_grace() {
    let l = Lease::new(1, key(1), key(2));
    let mut ledger = Ledger::new(LedgerConfig::default());
    minted(&mut ledger, &l.renter, 100);
    let hold = T0.plus_secs(3600);
    let mut body = l.lock(100).body().clone();
    body.ext
        .insert(EXT_LOCK_HOLD_UNTIL, hold.0.to_le_bytes().to_vec())
        .unwrap();
    let held = Signed::sign(&l.renter, body).unwrap();
    assert_eq!(held.hold_until().unwrap(), Some(hold));
    ledger.apply(LedgerOp::Lock(&held), T0).unwrap();
    // Idle for the grace, but before the hold's end: refused.
    assert!(matches!(
        ledger.apply(LedgerOp::Release(&l.release(&l.renter)), T0.plus_secs(600)),
        Err(LedgerError::TooEarly(at)) if at == hold.plus_secs(600)
    ));
    assert!(matches!(
        ledger.apply(
            LedgerOp::Release(&l.release(&l.renter)),
            hold.plus_secs(599)
        ),
        Err(LedgerError::TooEarly(_))
    ));
    assert!(matches!(
        ledger.apply(
            LedgerOp::Release(&l.release(&l.renter)),
            hold.plus_secs(600)
        ),
        Ok(Applied::Released { .. })
    ));
    // A hold that is not 8 bytes makes the lock invalid.
    let mut bad = l.lock(100).body().clone();
    bad.ext.insert(EXT_LOCK_HOLD_UNTIL, vec![1, 2, 3]).unwrap();
    assert!(Signed::sign(&l.renter, bad).is_err());
}

/// r007: an operation applied with an older clock does not move the escrow's activity back
/// (which would let the payer release early).
#[test]
fn r007_activity_never_moves_backwards() {
    let l = Lease::new(1, key(1), key(2));
    let mut ledger = Ledger::new(LedgerConfig::default());
    minted(&mut ledger, &l.renter, 100);
    let hour = T0.plus_secs(3600);
    ledger.apply(LedgerOp::Lock(&l.lock(100)), hour).unwrap();
    ledger
        .apply(LedgerOp::Redeem(&l.redeem(1, 10)), T0)
        .unwrap();
    assert!(matches!(
        ledger.apply(LedgerOp::Release(&l.release(&l.renter)), hour.plus_secs(1)),
        Err(LedgerError::TooEarly(_))
    ));
}

#[test]
fn a_payers_release_pays_the_payee_up_to_the_voucher_it_carries() {
    let mut ledger = Ledger::new(LedgerConfig::default());
    let l = Lease::new(
        9,
        Keypair::from_seed(&[1; 32]),
        Keypair::from_seed(&[2; 32]),
    );
    minted(&mut ledger, &l.renter, 1_000);
    ledger.apply(LedgerOp::Lock(&l.lock(1_000)), T0).unwrap();
    ledger
        .apply(LedgerOp::Redeem(&l.redeem(1, 100)), T0)
        .unwrap();
    // The host never redeemed receipt 3 (the ledger was down); the renter's release carries it.
    let late = T0.plus_secs(600);
    let applied = ledger
        .apply(
            LedgerOp::Release(&l.release_with_voucher(&l.redeem(3, 400))),
            late,
        )
        .unwrap();
    assert_eq!(
        applied,
        Applied::Released {
            refunded: MicroCredits(600),
            voucher_paid: MicroCredits(300),
        }
    );
    assert_eq!(ledger.balance(&l.host.public()), MicroCredits(400));
    assert_eq!(ledger.balance(&l.renter.public()), MicroCredits(600));
    assert_eq!(ledger.total(), u128::from(ledger.minted().0));

    // An older voucher than the one redeemed pays nothing more; a forged one is refused.
    let m = Lease::new(
        10,
        Keypair::from_seed(&[1; 32]),
        Keypair::from_seed(&[2; 32]),
    );
    minted(&mut ledger, &m.renter, 1_000);
    ledger.apply(LedgerOp::Lock(&m.lock(1_000)), T0).unwrap();
    ledger
        .apply(LedgerOp::Redeem(&m.redeem(5, 500)), T0)
        .unwrap();
    // A voucher signed by someone other than the payer.
    let stranger = Lease::new(
        10,
        Keypair::from_seed(&[3; 32]),
        Keypair::from_seed(&[2; 32]),
    );
    assert!(matches!(
        ledger.apply(
            LedgerOp::Release(&m.release_with_voucher(&stranger.redeem(9, 900))),
            late
        ),
        Err(LedgerError::WrongSigner { .. })
    ));
    assert_eq!(
        ledger
            .apply(
                LedgerOp::Release(&m.release_with_voucher(&m.redeem(2, 200))),
                late
            )
            .unwrap(),
        Applied::Released {
            refunded: MicroCredits(500),
            voucher_paid: MicroCredits(0),
        }
    );
    assert_eq!(ledger.total(), u128::from(ledger.minted().0));
}
