//! The settlement ledger as a pure state machine.
//!
//! Accounts hold balances; a renter's [`EscrowLock`] moves money from its balance into an
//! escrow for one lease; the host redeems its latest *acknowledged* receipt (the host's signed
//! [`UsageReceipt`] and the renter's signed [`ReceiptAck`], both verified here with
//! `verify_strict`); at the end the rest returns to the renter. Redemption is cumulative and
//! idempotent, like a payment-channel voucher: a receipt with a sequence number not above the
//! last one redeemed is a no-op, and no escrow ever pays out more than it holds.
//!
//! **Invariant**: the sum of all balances and of what open escrows still hold changes only
//! by minting ([`Ledger::total`] equals [`Ledger::minted`] after every operation).
//!
//! **Release rule**: the payee (host) may release an escrow at any time (it has redeemed
//! what it will). The payer may release only after `release_grace_ms` without a lock or
//! redemption, so a renter cannot reclaim money the host is about to redeem; a host that
//! redeems every receipt interval loses at most one interval. A lock may carry a hold
//! (`EscrowLock` ext key 1): for a lease whose work starts later, the payer may not release
//! before the hold plus the grace either. A release may carry a
//! *voucher* (the payer's latest signed acknowledgement of a cumulative amount): the ledger
//! pays the payee up to it before refunding the rest, so however late the payee's own
//! redemptions come (a ledger outage, a crashed host) a payer's release never takes back
//! what the payer acknowledged.

use std::collections::BTreeMap;

use gpux_protocol::validate::RuleError;
use gpux_protocol::{
    ContentId, EscrowId, EscrowLock, MicroCredits, PublicKey, ReceiptAck, Redeem, Release, Signed,
    Timestamp, UsageReceipt, Verified, VerifyError,
};

/// Tuning of the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerConfig {
    /// How long an escrow must be idle before its payer may release it, ms. Default 10 min.
    pub release_grace_ms: u64,
    /// The faucet's key: credits are minted only by `FaucetGrant`s it signed (None: by the
    /// ledger's operator, through its node's API).
    pub faucet: Option<PublicKey>,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            release_grace_ms: 600_000,
            faucet: None,
        }
    }
}

/// One escrow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escrow {
    /// The lease it pays for.
    pub lease: ContentId,
    /// Who locked the money.
    pub payer: PublicKey,
    /// Who may redeem receipts.
    pub payee: PublicKey,
    /// Amount locked.
    pub amount: MicroCredits,
    /// Paid to the payee so far.
    pub redeemed: MicroCredits,
    /// The lease's price; receipts must carry it.
    pub price_per_gpu_hour: MicroCredits,
    /// Highest receipt seq redeemed (0: none).
    pub last_seq: u64,
    /// Last lock or redemption.
    pub last_activity: Timestamp,
    /// The payer may not release before this (the lock's hold; its lock time without one).
    pub hold_until: Timestamp,
    /// Whether the remainder has been returned (the escrow is closed).
    pub released: bool,
    /// How the lease ended, as the closing release stated it, and whether the payee (the
    /// host) stated it.
    pub outcome: Option<(gpux_protocol::LeaseOutcome, bool)>,
}

/// An operation on the ledger.
#[derive(Debug, Clone, Copy)]
pub enum LedgerOp<'a> {
    /// New credits (testnet faucet; a real network mints nothing).
    Mint {
        /// The account credited.
        account: PublicKey,
        /// Amount.
        amount: MicroCredits,
    },
    /// A renter locks money for a lease.
    Lock(&'a Verified<EscrowLock>),
    /// A host redeems an acknowledged receipt.
    Redeem(&'a Verified<Redeem>),
    /// The rest of an escrow goes back to its payer.
    Release(&'a Verified<Release>),
}

/// What an operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Credits minted.
    Minted {
        /// Amount.
        amount: MicroCredits,
    },
    /// An escrow opened.
    Locked {
        /// Amount locked.
        amount: MicroCredits,
    },
    /// A redemption paid `amount` (possibly zero once the escrow is exhausted).
    Redeemed {
        /// Paid now.
        amount: MicroCredits,
        /// Paid out of the escrow so far.
        cumulative: MicroCredits,
        /// The receipt's seq.
        seq: u64,
    },
    /// A receipt not newer than the last one redeemed: nothing happened.
    AlreadyRedeemed {
        /// The receipt's seq.
        seq: u64,
        /// The last seq redeemed.
        last_seq: u64,
    },
    /// The escrow closed: `voucher_paid` went to the payee (the release's voucher) and
    /// `refunded` back to the payer.
    Released {
        /// Amount returned.
        refunded: MicroCredits,
        /// Paid to the payee by the voucher the release carried (zero without one).
        voucher_paid: MicroCredits,
    },
}

/// Why an operation was refused (the ledger is unchanged).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The payer's balance is too small.
    #[error("insufficient funds: {need} needed, {have} available")]
    InsufficientFunds {
        /// Amount needed.
        need: MicroCredits,
        /// Balance.
        have: MicroCredits,
    },
    /// No escrow with that id.
    #[error("unknown escrow {0}")]
    UnknownEscrow(EscrowId),
    /// An escrow with that id already exists.
    #[error("escrow {0} already exists")]
    EscrowExists(EscrowId),
    /// The escrow was released.
    #[error("escrow {0} is closed")]
    EscrowClosed(EscrowId),
    /// The operation is signed by someone who may not perform it.
    #[error("{what} is not signed by {who}")]
    WrongSigner {
        /// The operation.
        what: &'static str,
        /// Who must sign it.
        who: &'static str,
    },
    /// A nested receipt or acknowledgement does not verify.
    #[error("{what} does not verify: {source}")]
    BadEnvelope {
        /// Which envelope.
        what: &'static str,
        /// Why.
        source: VerifyError,
    },
    /// The receipt or acknowledgement is not for this escrow, lease or price.
    #[error(transparent)]
    Mismatch(#[from] RuleError),
    /// The payer may not release yet.
    #[error("the payer may release the escrow only after {0}")]
    TooEarly(Timestamp),
    /// A balance would overflow.
    #[error("amount overflow")]
    Overflow,
}

/// The ledger. See the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    config: LedgerConfig,
    balances: BTreeMap<PublicKey, u64>,
    escrows: BTreeMap<EscrowId, Escrow>,
    minted: u64,
}

fn add(a: u64, b: u64) -> Result<u64, LedgerError> {
    a.checked_add(b).ok_or(LedgerError::Overflow)
}

impl Ledger {
    /// An empty ledger.
    pub fn new(config: LedgerConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The ledger's tuning.
    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// An account's balance.
    pub fn balance(&self, account: &PublicKey) -> MicroCredits {
        MicroCredits(self.balances.get(account).copied().unwrap_or(0))
    }

    /// An escrow.
    pub fn escrow(&self, id: &EscrowId) -> Option<&Escrow> {
        self.escrows.get(id)
    }

    /// Every account with its balance, in key order.
    pub fn accounts(&self) -> impl Iterator<Item = (PublicKey, MicroCredits)> + '_ {
        self.balances.iter().map(|(k, &b)| (*k, MicroCredits(b)))
    }

    /// Every escrow, open or closed, in id order.
    pub fn escrows(&self) -> impl Iterator<Item = (&EscrowId, &Escrow)> {
        self.escrows.iter()
    }

    /// Who has paid `host`: per payer, its closed escrows to the host that paid something
    /// and those that paid nothing, and how many other accounts it has paid; at most
    /// [`MAX_HISTORY_PAYERS`](gpux_protocol::ledger_wire::MAX_HISTORY_PAYERS) payers, the
    /// most paid escrows first. A scan of every escrow (an index comes with scale).
    pub fn history(&self, host: &PublicKey) -> gpux_protocol::ledger_wire::HostHistory {
        use gpux_protocol::ledger_wire::{HostHistory, MAX_HISTORY_PAYERS, PayerRecord};
        use std::collections::BTreeSet;
        let mut by_payer: BTreeMap<PublicKey, (u32, u32)> = BTreeMap::new();
        let mut paid_to: BTreeMap<PublicKey, BTreeSet<PublicKey>> = BTreeMap::new();
        for e in self.escrows.values() {
            if e.redeemed.0 > 0 {
                paid_to.entry(e.payer).or_default().insert(e.payee);
            }
            if e.payee == *host && e.released {
                let counts = by_payer.entry(e.payer).or_default();
                if e.redeemed.0 > 0 {
                    counts.0 = counts.0.saturating_add(1);
                } else {
                    counts.1 = counts.1.saturating_add(1);
                }
            }
        }
        let mut payers: Vec<PayerRecord> = by_payer
            .into_iter()
            .map(|(payer, (paid, unpaid))| PayerRecord {
                payer,
                paid,
                unpaid,
                other_payees: paid_to
                    .get(&payer)
                    .map_or(0, |p| p.iter().filter(|&&p| p != *host).count())
                    .try_into()
                    .unwrap_or(u32::MAX),
            })
            .collect();
        let payers_total = u32::try_from(payers.len()).unwrap_or(u32::MAX);
        payers.sort_by(|a, b| b.paid.cmp(&a.paid).then(a.payer.cmp(&b.payer)));
        payers.truncate(MAX_HISTORY_PAYERS);
        HostHistory {
            payers,
            payers_total,
        }
    }

    /// How `host`'s leases ended, per payer: the outcomes the closing releases stated,
    /// counted (the most stated first, at most
    /// [`MAX_HISTORY_PAYERS`](gpux_protocol::ledger_wire::MAX_HISTORY_PAYERS) payers).
    pub fn ends(&self, host: &PublicKey) -> gpux_protocol::ledger_wire::HostEnds {
        use gpux_protocol::ledger_wire::{EndCount, HostEnds, MAX_HISTORY_PAYERS, PayerEnds};
        use std::collections::BTreeSet;
        let mut by_payer: BTreeMap<PublicKey, Vec<EndCount>> = BTreeMap::new();
        let mut paid_to: BTreeMap<PublicKey, BTreeSet<PublicKey>> = BTreeMap::new();
        for e in self.escrows.values() {
            if e.redeemed.0 > 0 {
                paid_to.entry(e.payer).or_default().insert(e.payee);
            }
            let Some((outcome, by_host)) = e.outcome.filter(|_| e.payee == *host) else {
                continue;
            };
            let ends = by_payer.entry(e.payer).or_default();
            match ends
                .iter_mut()
                .find(|c| c.outcome == outcome && c.by_host == by_host)
            {
                Some(c) => c.count = c.count.saturating_add(1),
                None => ends.push(EndCount {
                    outcome,
                    by_host,
                    count: 1,
                }),
            }
        }
        let mut payers: Vec<PayerEnds> = by_payer
            .into_iter()
            .map(|(payer, ends)| PayerEnds {
                payer,
                other_payees: paid_to
                    .get(&payer)
                    .map_or(0, |p| p.iter().filter(|&&p| p != *host).count())
                    .try_into()
                    .unwrap_or(u32::MAX),
                ends,
            })
            .collect();
        let stated = |p: &PayerEnds| p.ends.iter().map(|c| u64::from(c.count)).sum::<u64>();
        payers.sort_by(|a, b| stated(b).cmp(&stated(a)).then(a.payer.cmp(&b.payer)));
        payers.truncate(MAX_HISTORY_PAYERS);
        HostEnds { payers }
    }

    /// All credits ever minted.
    pub fn minted(&self) -> MicroCredits {
        MicroCredits(self.minted)
    }

    /// Balances plus what open escrows still hold: always equal to [`Ledger::minted`].
    pub fn total(&self) -> u128 {
        let balances: u128 = self.balances.values().map(|&b| u128::from(b)).sum();
        let held: u128 = self
            .escrows
            .values()
            .filter(|e| !e.released)
            .map(|e| u128::from(e.amount.0 - e.redeemed.0))
            .sum();
        balances + held
    }

    /// Applies one operation at `now`. On error nothing changes.
    pub fn apply(&mut self, op: LedgerOp<'_>, now: Timestamp) -> Result<Applied, LedgerError> {
        match op {
            LedgerOp::Mint { account, amount } => {
                let minted = add(self.minted, amount.0)?;
                let balance = add(self.balance(&account).0, amount.0)?;
                self.minted = minted;
                self.balances.insert(account, balance);
                Ok(Applied::Minted { amount })
            }
            LedgerOp::Lock(lock) => self.lock(lock, now),
            LedgerOp::Redeem(redeem) => self.redeem(redeem, now),
            LedgerOp::Release(release) => self.release(release, now),
        }
    }

    fn lock(
        &mut self,
        lock: &Verified<EscrowLock>,
        now: Timestamp,
    ) -> Result<Applied, LedgerError> {
        if lock.payer != lock.signer() {
            return Err(LedgerError::WrongSigner {
                what: "the escrow lock",
                who: "its payer",
            });
        }
        if self.escrows.contains_key(&lock.escrow) {
            return Err(LedgerError::EscrowExists(lock.escrow));
        }
        let have = self.balance(&lock.payer);
        if have < lock.amount {
            return Err(LedgerError::InsufficientFunds {
                need: lock.amount,
                have,
            });
        }
        let hold_until = lock
            .hold_until()
            .map_err(|_| LedgerError::Mismatch(RuleError::BadTerm("the lock's hold".into())))?
            .unwrap_or(now);
        self.balances.insert(lock.payer, have.0 - lock.amount.0);
        self.escrows.insert(
            lock.escrow,
            Escrow {
                lease: lock.lease,
                payer: lock.payer,
                payee: lock.payee,
                amount: lock.amount,
                redeemed: MicroCredits::ZERO,
                price_per_gpu_hour: lock.price_per_gpu_hour,
                last_seq: 0,
                last_activity: now,
                hold_until,
                released: false,
                outcome: None,
            },
        );
        Ok(Applied::Locked {
            amount: lock.amount,
        })
    }

    fn open_escrow(&self, id: &EscrowId) -> Result<&Escrow, LedgerError> {
        let escrow = self
            .escrows
            .get(id)
            .ok_or(LedgerError::UnknownEscrow(*id))?;
        if escrow.released {
            return Err(LedgerError::EscrowClosed(*id));
        }
        Ok(escrow)
    }

    /// Checks a voucher (a receipt signed by the escrow's payee and the payer's
    /// acknowledgement of it) against an escrow: its receipt seq and cumulative amount due.
    fn check_voucher(
        escrow: &Escrow,
        id: &EscrowId,
        receipt: &[u8],
        ack: &[u8],
    ) -> Result<(u64, MicroCredits), LedgerError> {
        let bad = |what| move |source| LedgerError::BadEnvelope { what, source };
        // The ledger's verdicts must be the same everywhere: strict verification, one by one.
        let receipt = Signed::<UsageReceipt>::from_bytes(receipt.to_vec())
            .and_then(Signed::verify)
            .map_err(bad("the receipt"))?;
        let ack = Signed::<ReceiptAck>::from_bytes(ack.to_vec())
            .and_then(Signed::verify)
            .map_err(bad("the acknowledgement"))?;
        let mismatch = |field| LedgerError::Mismatch(RuleError::ReceiptMismatch { field });
        if receipt.signer() != escrow.payee {
            return Err(LedgerError::WrongSigner {
                what: "the receipt",
                who: "the escrow's payee",
            });
        }
        if receipt.escrow != *id {
            return Err(mismatch("escrow"));
        }
        if receipt.lease != escrow.lease {
            return Err(mismatch("lease"));
        }
        if receipt.price_per_gpu_hour != escrow.price_per_gpu_hour {
            return Err(mismatch("price_per_gpu_hour"));
        }
        gpux_protocol::validate::ack_matches_receipt(&ack, &receipt, escrow.payer)?;
        Ok((receipt.seq, receipt.amount_due))
    }

    fn redeem(
        &mut self,
        redeem: &Verified<Redeem>,
        now: Timestamp,
    ) -> Result<Applied, LedgerError> {
        let escrow = self.open_escrow(&redeem.escrow)?;
        if redeem.signer() != escrow.payee {
            return Err(LedgerError::WrongSigner {
                what: "the redemption",
                who: "the escrow's payee",
            });
        }
        if redeem.lease != escrow.lease {
            return Err(LedgerError::Mismatch(RuleError::ReceiptMismatch {
                field: "lease",
            }));
        }
        let (seq, amount_due) =
            Self::check_voucher(escrow, &redeem.escrow, &redeem.receipt, &redeem.ack)?;
        if seq <= escrow.last_seq {
            return Ok(Applied::AlreadyRedeemed {
                seq,
                last_seq: escrow.last_seq,
            });
        }
        let cumulative = amount_due.min(escrow.amount).max(escrow.redeemed);
        let pay = cumulative.0 - escrow.redeemed.0;
        let payee = escrow.payee;
        let balance = add(self.balance(&payee).0, pay)?;
        self.balances.insert(payee, balance);
        if let Some(escrow) = self.escrows.get_mut(&redeem.escrow) {
            escrow.redeemed = cumulative;
            escrow.last_seq = seq;
            // Never backwards: an operation applied with an older clock must not shorten the
            // payee's grace.
            escrow.last_activity = escrow.last_activity.max(now);
        }
        Ok(Applied::Redeemed {
            amount: MicroCredits(pay),
            cumulative,
            seq,
        })
    }

    fn release(
        &mut self,
        release: &Verified<Release>,
        now: Timestamp,
    ) -> Result<Applied, LedgerError> {
        let escrow = self.open_escrow(&release.escrow)?;
        if release.lease != escrow.lease {
            return Err(LedgerError::Mismatch(RuleError::ReceiptMismatch {
                field: "lease",
            }));
        }
        let signer = release.signer();
        if signer == escrow.payer && signer != escrow.payee {
            let allowed = escrow
                .last_activity
                .max(escrow.hold_until)
                .plus_ms(self.config.release_grace_ms);
            if now < allowed {
                return Err(LedgerError::TooEarly(allowed));
            }
        } else if signer != escrow.payee {
            return Err(LedgerError::WrongSigner {
                what: "the release",
                who: "the escrow's payer or payee",
            });
        }
        // A voucher carried by the release is honoured first: the payee is paid up to the
        // latest cumulative amount the payer acknowledged, whoever closes the escrow and
        // whenever. The payer's signed acknowledgement is its consent to pay that amount for
        // this lease; it can only move money towards the payee, never back.
        let mut cumulative = escrow.redeemed;
        let mut last_seq = escrow.last_seq;
        if let Some(ack) = release.voucher() {
            let ack = Signed::<ReceiptAck>::from_bytes(ack.to_vec())
                .and_then(Signed::verify)
                .map_err(|source| LedgerError::BadEnvelope {
                    what: "the voucher",
                    source,
                })?;
            if ack.signer() != escrow.payer {
                return Err(LedgerError::WrongSigner {
                    what: "the voucher",
                    who: "the escrow's payer",
                });
            }
            if ack.lease != escrow.lease {
                return Err(LedgerError::Mismatch(RuleError::AckMismatch {
                    field: "lease",
                }));
            }
            if ack.seq > escrow.last_seq {
                cumulative = ack.amount_due.min(escrow.amount).max(escrow.redeemed);
                last_seq = ack.seq;
            }
        }
        let paid = cumulative.0 - escrow.redeemed.0;
        let refund = escrow.amount.0 - cumulative.0;
        let (payer, payee) = (escrow.payer, escrow.payee);
        let payee_balance = add(self.balance(&payee).0, paid)?;
        let payer_balance = if payer == payee {
            add(payee_balance, refund)?
        } else {
            add(self.balance(&payer).0, refund)?
        };
        self.balances.insert(payee, payee_balance);
        self.balances.insert(payer, payer_balance);
        // (A release that states a malformed outcome does not verify; none here is `None`.)
        let outcome = release.outcome().ok().flatten();
        if let Some(escrow) = self.escrows.get_mut(&release.escrow) {
            escrow.redeemed = cumulative;
            escrow.last_seq = last_seq;
            escrow.released = true;
            escrow.outcome = outcome.map(|o| (o, signer == payee));
        }
        Ok(Applied::Released {
            refunded: MicroCredits(refund),
            voucher_paid: MicroCredits(paid),
        })
    }
}
