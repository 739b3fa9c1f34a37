//! The ledger service's decisions, over the pure `gpux_market::Ledger`.
//!
//! [`LedgerMachine`] answers `/gpux/ledger/2` requests: it verifies the submitted envelope,
//! refuses stale locks, answers a retried lock with the record it got the first time and any
//! other retried operation with `Unchanged`, applies the rest, and signs the ledger's
//! records. It does no I/O: each applied operation comes out as a log entry that the shell
//! must store (flushed) *before* it sends the response, and the shell rebuilds the machine
//! from that log with [`LedgerMachine::replay`] on start, or whenever a write fails (so
//! memory never runs ahead of disk).

use std::collections::{BTreeMap, BTreeSet};

use bincode::{Decode, Encode};
use gpux_market::{Applied, Ledger, LedgerConfig, LedgerError, LedgerOp};
use gpux_protocol::ledger_wire::{
    self, EscrowView, LedgerRequest, LedgerResponse, MAX_LEDGER_FRAME, RefusalCode,
};
use gpux_protocol::{
    AnySigned, AnyVerified, ContentId, EXT_RECORD_VOUCHER_PAID, EscrowId, EscrowLock, Ext, Keypair,
    LedgerEntry, LedgerRecord, MicroCredits, PublicKey, Signed, Timestamp, Verified,
};

/// How old an `EscrowLock` may be when the ledger applies it (by the ledger's clock): a
/// lock held back cannot freeze a renter's money after the renter has given up on it.
pub const MAX_LOCK_AGE_MS: u64 = 120_000;
/// The largest envelope submitted: room is left in a frame, and in a log entry (which adds
/// a timestamp and tags), so whatever is accepted can always be replayed.
const MAX_SUBMITTED: usize = MAX_LEDGER_FRAME - 64;
/// The largest log entry read back.
const MAX_LOG_ENTRY: usize = 16 * 1024;

/// One entry of the ledger's operation log (its encoding is the log's format on disk).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct LogEntry {
    /// When it was applied (the ledger's clock).
    pub at: Timestamp,
    /// What.
    pub op: LogOp,
}

/// A logged operation.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum LogOp {
    /// Credits minted by the faucet.
    Mint {
        /// The account.
        account: PublicKey,
        /// Amount.
        amount: MicroCredits,
    },
    /// A signed `EscrowLock`, `Redeem` or `Release`, exactly as submitted.
    Envelope(Vec<u8>),
}

/// A log entry to append: its position and its encoding.
pub type LogAppend = (u64, Vec<u8>);

/// The machine's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerOutput {
    /// The log entry to append at this position, flushed, before the response goes out.
    pub append: Option<LogAppend>,
    /// The response.
    pub response: LedgerResponse,
}

/// A stored log that cannot be replayed.
#[derive(Debug, thiserror::Error)]
#[error("ledger log entry {position}: {reason}")]
pub struct ReplayError {
    /// The entry's position.
    pub position: u64,
    /// Why.
    pub reason: String,
}

/// The ledger service's decisions, over the pure `gpux_market::Ledger`.
///
/// [`LedgerMachine`] answers `/gpux/ledger/2` requests: it verifies the submitted envelope,
/// refuses stale locks, answers a retried lock with the record it got the first time and any
/// other retried operation with `Unchanged`, applies the rest, and signs the ledger's
/// records. It does no I/O: each applied operation comes out as a log entry that the shell
/// must store (flushed) *before* it sends the response, and the shell rebuilds the machine
/// from that log with [`LedgerMachine::replay`] on start, or whenever a write fails (so
/// memory never runs ahead of disk).
pub struct LedgerMachine {
    key: Keypair,
    ledger: Ledger,
    next: u64,
    /// Each escrow's lock (its envelope id) and the signed record it got, returned again
    /// when that very lock is retried.
    locks: BTreeMap<EscrowId, (ContentId, Vec<u8>)>,
    /// Each escrow's newest redemption's signed record (a challenger's proof that it paid).
    paid: BTreeMap<EscrowId, Vec<u8>>,
    /// The faucet grants applied, by envelope id: each credits its account once.
    grants: BTreeSet<ContentId>,
}

impl std::fmt::Debug for LedgerMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerMachine")
            .field("next", &self.next)
            .finish()
    }
}

fn op_of(verified: &AnyVerified) -> Option<LedgerOp<'_>> {
    match verified {
        AnyVerified::EscrowLock(lock) => Some(LedgerOp::Lock(lock)),
        AnyVerified::Redeem(redeem) => Some(LedgerOp::Redeem(redeem)),
        AnyVerified::Release(release) => Some(LedgerOp::Release(release)),
        AnyVerified::FaucetGrant(grant) => Some(LedgerOp::Mint {
            account: grant.account,
            amount: grant.amount,
        }),
        _ => None,
    }
}

fn verified_id(verified: &AnyVerified) -> ContentId {
    match verified {
        AnyVerified::EscrowLock(v) => v.id(),
        AnyVerified::Redeem(v) => v.id(),
        AnyVerified::Release(v) => v.id(),
        AnyVerified::FaucetGrant(v) => v.id(),
        _ => ContentId([0; 32]),
    }
}

/// The refusal code of a ledger rule.
pub(crate) fn refusal(e: &LedgerError) -> LedgerResponse {
    let code = match e {
        LedgerError::InsufficientFunds { .. } => RefusalCode::InsufficientFunds,
        LedgerError::UnknownEscrow(_) => RefusalCode::UnknownEscrow,
        LedgerError::EscrowExists(_) => RefusalCode::EscrowExists,
        LedgerError::EscrowClosed(_) => RefusalCode::EscrowClosed,
        LedgerError::WrongSigner { .. } => RefusalCode::WrongSigner,
        LedgerError::BadEnvelope { .. } => RefusalCode::BadEnvelope,
        LedgerError::Mismatch(_) => RefusalCode::Mismatch,
        LedgerError::TooEarly(_) => RefusalCode::TooEarly,
        LedgerError::Overflow => RefusalCode::Overflow,
        _ => RefusalCode::Invalid,
    };
    let mut response = LedgerResponse::refused(code, e.to_string());
    if let (LedgerError::TooEarly(at), LedgerResponse::Refused { retry_at, .. }) =
        (e, &mut response)
    {
        *retry_at = Some(*at);
    }
    response
}

impl LedgerMachine {
    /// An empty ledger.
    pub fn new(key: Keypair, config: LedgerConfig) -> Self {
        Self {
            key,
            ledger: Ledger::new(config),
            next: 1,
            locks: BTreeMap::new(),
            paid: BTreeMap::new(),
            grants: BTreeSet::new(),
        }
    }

    /// The ledger rebuilt from its log: `(position, entry)` in position order, every
    /// envelope verified again.
    pub fn replay<'a>(
        key: Keypair,
        config: LedgerConfig,
        log: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<Self, ReplayError> {
        let mut machine = Self::new(key, config);
        for (position, bytes) in log {
            let fail = |reason: String| ReplayError { position, reason };
            if bytes.len() > MAX_LOG_ENTRY {
                return Err(fail(format!(
                    "{} bytes exceed {MAX_LOG_ENTRY}",
                    bytes.len()
                )));
            }
            let (entry, used): (LogEntry, usize) = bincode::decode_from_slice(
                bytes,
                bincode::config::standard().with_limit::<MAX_LOG_ENTRY>(),
            )
            .map_err(|e| fail(format!("undecodable: {e}")))?;
            if used != bytes.len() {
                return Err(fail("trailing bytes".into()));
            }
            match entry.op {
                LogOp::Mint { account, amount } => {
                    machine
                        .ledger
                        .apply(LedgerOp::Mint { account, amount }, entry.at)
                        .map_err(|e| fail(e.to_string()))?;
                }
                LogOp::Envelope(envelope) => {
                    let verified = AnySigned::from_bytes(envelope)
                        .and_then(AnySigned::verify)
                        .map_err(|e| fail(e.to_string()))?;
                    // Its signer was the faucet when it was applied (a faucet key changed
                    // since does not undo it).
                    if let AnyVerified::FaucetGrant(grant) = &verified
                        && !machine.grants.insert(grant.id())
                    {
                        return Err(fail("a faucet grant applied twice".into()));
                    }
                    let op =
                        op_of(&verified).ok_or_else(|| fail("not a ledger operation".into()))?;
                    let applied = machine
                        .ledger
                        .apply(op, entry.at)
                        .map_err(|e| fail(e.to_string()))?;
                    if let (AnyVerified::Redeem(redeem), Applied::Redeemed { .. }) =
                        (&verified, &applied)
                    {
                        // Signing is deterministic: the same record as first returned.
                        let (escrow, entry_of) = machine.redeemed_entry(redeem, &applied);
                        if let Some(record) = machine.record(
                            position,
                            entry.at,
                            verified_id(&verified),
                            escrow,
                            entry_of,
                            Ext::new(),
                        ) {
                            machine.paid.insert(escrow, record.as_bytes().to_vec());
                        }
                    }
                    if let AnyVerified::EscrowLock(lock) = &verified {
                        // Signing is deterministic: the same record as first returned.
                        let record = machine.lock_record(position, entry.at, lock);
                        if let Some(record) = record {
                            machine
                                .locks
                                .insert(lock.escrow, (lock.id(), record.as_bytes().to_vec()));
                        }
                    }
                }
            }
            machine.next = position + 1;
        }
        Ok(machine)
    }

    /// The state machine (read-only).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The position the next log entry will take (1 for an empty ledger).
    pub fn next_position(&self) -> u64 {
        self.next
    }

    /// The ledger's key.
    pub fn public_key(&self) -> PublicKey {
        self.key.public()
    }

    fn record(
        &self,
        seq: u64,
        now: Timestamp,
        op: ContentId,
        escrow: EscrowId,
        entry: LedgerEntry,
        ext: Ext,
    ) -> Option<Verified<LedgerRecord>> {
        Signed::sign(
            &self.key,
            LedgerRecord {
                seq,
                created_at: now,
                op,
                escrow,
                entry,
                ext,
            },
        )
        .ok()
    }

    fn lock_record(
        &self,
        seq: u64,
        at: Timestamp,
        lock: &Verified<EscrowLock>,
    ) -> Option<Verified<LedgerRecord>> {
        self.record(
            seq,
            at,
            lock.id(),
            lock.escrow,
            LedgerEntry::Locked {
                payer: lock.payer,
                payee: lock.payee,
                amount: lock.amount,
            },
            Ext::new(),
        )
    }

    /// The escrow and record entry of an applied redemption.
    fn redeemed_entry(
        &self,
        redeem: &Verified<gpux_protocol::Redeem>,
        applied: &Applied,
    ) -> (EscrowId, LedgerEntry) {
        let payee = self
            .ledger
            .escrow(&redeem.escrow)
            .map_or(redeem.signer(), |e| e.payee);
        let (amount, cumulative, seq) = match *applied {
            Applied::Redeemed {
                amount,
                cumulative,
                seq,
            } => (amount, cumulative, seq),
            _ => (MicroCredits::ZERO, MicroCredits::ZERO, 0),
        };
        (
            redeem.escrow,
            LedgerEntry::Redeemed {
                payee,
                amount,
                cumulative,
                receipt_seq: seq,
            },
        )
    }

    fn encode_entry(entry: &LogEntry) -> Vec<u8> {
        bincode::encode_to_vec(entry, bincode::config::standard()).unwrap_or_default()
    }

    /// Mints credits for the ledger's operator (a ledger without a faucet key): the record,
    /// and the log entry to append.
    pub fn mint(
        &mut self,
        now: Timestamp,
        account: PublicKey,
        amount: MicroCredits,
    ) -> Result<(Verified<LedgerRecord>, LogAppend), LedgerResponse> {
        if self.ledger.config().faucet.is_some() {
            return Err(LedgerResponse::refused(
                RefusalCode::WrongSigner,
                "this ledger mints only grants its faucet signed (gpux mint --faucet DIR)",
            ));
        }
        self.ledger
            .apply(LedgerOp::Mint { account, amount }, now)
            .map_err(|e| refusal(&e))?;
        let seq = self.next;
        self.next += 1;
        let entry = Self::encode_entry(&LogEntry {
            at: now,
            op: LogOp::Mint { account, amount },
        });
        let op = ContentId(*blake3::hash(&ledger_wire::encode(&(account, amount, seq))).as_bytes());
        let record = self
            .record(
                seq,
                now,
                op,
                EscrowId([0; 16]),
                LedgerEntry::Minted { account, amount },
                Ext::new(),
            )
            .ok_or_else(|| {
                LedgerResponse::refused(RefusalCode::Invalid, "the record could not be signed")
            })?;
        Ok((record, (seq, entry)))
    }

    /// Answers one request frame at `now`.
    pub fn handle(&mut self, now: Timestamp, frame: &[u8]) -> LedgerOutput {
        match ledger_wire::decode::<LedgerRequest>(frame) {
            Ok(request) => self.request(now, request),
            Err(e) => LedgerOutput {
                append: None,
                response: LedgerResponse::refused(RefusalCode::Malformed, e.to_string()),
            },
        }
    }

    /// Answers one request at `now`.
    pub fn request(&mut self, now: Timestamp, request: LedgerRequest) -> LedgerOutput {
        let answer = |response| LedgerOutput {
            append: None,
            response,
        };
        match request {
            LedgerRequest::Submit(envelope) => self.submit(now, envelope),
            LedgerRequest::Balance(account) => {
                answer(LedgerResponse::Balance(self.ledger.balance(&account).0))
            }
            LedgerRequest::History(host) => {
                answer(LedgerResponse::History(self.ledger.history(&host)))
            }
            LedgerRequest::Ends(host) => answer(LedgerResponse::Ends(self.ledger.ends(&host))),
            LedgerRequest::Proof(escrow) => answer(match self.locks.get(&escrow) {
                Some((_, locked)) => LedgerResponse::Proof {
                    locked: locked.clone(),
                    paid: self.paid.get(&escrow).cloned(),
                },
                None => LedgerResponse::refused(
                    RefusalCode::UnknownEscrow,
                    format!("no escrow {escrow} is locked here"),
                ),
            }),
            LedgerRequest::Escrow(id) => {
                answer(LedgerResponse::Escrow(self.ledger.escrow(&id).map(|e| {
                    EscrowView {
                        amount: e.amount.0,
                        redeemed: e.redeemed.0,
                        last_seq: e.last_seq,
                        released: e.released,
                        payer: e.payer,
                        payee: e.payee,
                    }
                })))
            }
        }
    }

    /// Whether `verified` was already applied (a retry): why nothing changes.
    fn already_applied(&self, verified: &AnyVerified) -> Option<String> {
        match verified {
            AnyVerified::Release(release) => {
                let e = self.ledger.escrow(&release.escrow)?;
                (e.released && e.lease == release.lease)
                    .then(|| format!("escrow {} is already released", release.escrow))
            }
            AnyVerified::FaucetGrant(grant) => self
                .grants
                .contains(&grant.id())
                .then(|| format!("grant {} was applied already", grant.id())),
            _ => None,
        }
    }

    /// Applies a signed ledger operation at `now`.
    pub fn submit(&mut self, now: Timestamp, envelope: Vec<u8>) -> LedgerOutput {
        let refuse = |code, detail: String| LedgerOutput {
            append: None,
            response: LedgerResponse::refused(code, detail),
        };
        if envelope.len() > MAX_SUBMITTED {
            return refuse(
                RefusalCode::Malformed,
                format!(
                    "an envelope of {} bytes; the ledger takes at most {MAX_SUBMITTED}",
                    envelope.len()
                ),
            );
        }
        let verified = match AnySigned::from_bytes(envelope.clone()).and_then(AnySigned::verify) {
            Ok(v) => v,
            Err(e) => return refuse(RefusalCode::Invalid, e.to_string()),
        };
        let Some(op) = op_of(&verified) else {
            return refuse(
                RefusalCode::Invalid,
                "only EscrowLock, Redeem, Release and FaucetGrant are ledger operations".into(),
            );
        };
        if let AnyVerified::FaucetGrant(grant) = &verified {
            match self.ledger.config().faucet {
                None => {
                    return refuse(
                        RefusalCode::WrongSigner,
                        "this ledger has no faucet: its operator mints".into(),
                    );
                }
                Some(faucet) if faucet != grant.signer() => {
                    return refuse(
                        RefusalCode::WrongSigner,
                        "the grant is not signed by this ledger's faucet".into(),
                    );
                }
                Some(_) => {}
            }
        }
        if let AnyVerified::EscrowLock(lock) = &verified {
            if let Some((applied, record)) = self.locks.get(&lock.escrow) {
                // The escrow was locked: a retry of that very lock gets the record it got the
                // first time (while the escrow is open); any other lock naming the escrow is
                // refused, however close to the first it is, so nobody can pass a lock of
                // their own off as the one a host relays.
                let released = self.ledger.escrow(&lock.escrow).is_some_and(|e| e.released);
                let response = if released {
                    LedgerResponse::refused(
                        RefusalCode::EscrowClosed,
                        format!("escrow {} is closed", lock.escrow),
                    )
                } else if *applied == lock.id() {
                    LedgerResponse::Record(record.clone())
                } else {
                    LedgerResponse::refused(
                        RefusalCode::EscrowExists,
                        format!("escrow {} was locked by another lock", lock.escrow),
                    )
                };
                return LedgerOutput {
                    append: None,
                    response,
                };
            }
            if now.ms_since(lock.created_at) > MAX_LOCK_AGE_MS {
                return refuse(
                    RefusalCode::StaleLock,
                    format!("the escrow lock is older than {} s", MAX_LOCK_AGE_MS / 1000),
                );
            }
        }
        if let Some(unchanged) = self.already_applied(&verified) {
            return LedgerOutput {
                append: None,
                response: LedgerResponse::Unchanged(unchanged),
            };
        }
        // `apply` changes nothing when it fails; the shell replays the log when the disk
        // refuses the entry.
        let applied = match self.ledger.apply(op, now) {
            Ok(a) => a,
            Err(e) => {
                return LedgerOutput {
                    append: None,
                    response: refusal(&e),
                };
            }
        };
        let mut ext = Ext::new();
        let (escrow, entry) = match (&verified, applied) {
            (_, Applied::AlreadyRedeemed { seq, last_seq }) => {
                return LedgerOutput {
                    append: None,
                    response: LedgerResponse::Unchanged(format!(
                        "receipt {seq} is not newer than the last one redeemed ({last_seq})"
                    )),
                };
            }
            (AnyVerified::EscrowLock(lock), Applied::Locked { amount }) => (
                lock.escrow,
                LedgerEntry::Locked {
                    payer: lock.payer,
                    payee: lock.payee,
                    amount,
                },
            ),
            (AnyVerified::Redeem(redeem), applied @ Applied::Redeemed { .. }) => {
                self.redeemed_entry(redeem, &applied)
            }
            (
                AnyVerified::Release(release),
                Applied::Released {
                    refunded,
                    voucher_paid,
                },
            ) => {
                let payer = self
                    .ledger
                    .escrow(&release.escrow)
                    .map_or(release.signer(), |e| e.payer);
                if voucher_paid.0 > 0 {
                    let _ = ext.insert(
                        EXT_RECORD_VOUCHER_PAID,
                        voucher_paid.0.to_le_bytes().to_vec(),
                    );
                }
                (
                    release.escrow,
                    LedgerEntry::Released {
                        payer,
                        amount: refunded,
                    },
                )
            }
            (AnyVerified::FaucetGrant(grant), Applied::Minted { amount }) => (
                EscrowId([0; 16]),
                LedgerEntry::Minted {
                    account: grant.account,
                    amount,
                },
            ),
            _ => return refuse(RefusalCode::Invalid, "unexpected ledger outcome".into()),
        };
        let seq = self.next;
        self.next += 1;
        let append = (
            seq,
            Self::encode_entry(&LogEntry {
                at: now,
                op: LogOp::Envelope(envelope),
            }),
        );
        let Some(record) = self.record(seq, now, verified_id(&verified), escrow, entry, ext) else {
            // Applied all the same: it must be logged like any other.
            return LedgerOutput {
                append: Some(append),
                response: LedgerResponse::refused(
                    RefusalCode::Invalid,
                    "the record could not be signed",
                ),
            };
        };
        match &verified {
            AnyVerified::EscrowLock(lock) => {
                self.locks
                    .insert(lock.escrow, (lock.id(), record.as_bytes().to_vec()));
            }
            AnyVerified::Redeem(redeem) => {
                self.paid.insert(redeem.escrow, record.as_bytes().to_vec());
            }
            AnyVerified::FaucetGrant(grant) => {
                self.grants.insert(grant.id());
            }
            _ => {}
        }
        LedgerOutput {
            append: Some(append),
            response: LedgerResponse::Record(record.as_bytes().to_vec()),
        }
    }
}
