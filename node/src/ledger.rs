//! The ledger node and its clients, on `/gpux/ledger/1`.
//!
//! The settlement rules are `gpux_market::Ledger`, a pure state machine. A ledger node serves
//! it: every operation it applies is appended to a log in sled and flushed *before* it is
//! answered, and on start the log is replayed (every envelope verified again), so a restarted
//! ledger has exactly the balances it had. Answers to applied operations are
//! [`LedgerRecord`]s signed by the ledger's key, so a host can prove to itself that a renter's
//! escrow is locked.
//!
//! Operations are idempotent: re-submitting an applied lock, a redemption of a receipt not
//! newer than the last one redeemed, or a release of a closed escrow changes nothing and is
//! answered [`LedgerResponse::Unchanged`]. That lets every party retry after a timeout
//! without ever settling twice.
//!
//! The wire format (both directions, one frame each): bincode 2 (standard configuration) of
//! [`LedgerRequest`] / [`LedgerResponse`], every byte consumed.

use bincode::{Decode, Encode};
use gpux_market::{Applied, Ledger, LedgerConfig, LedgerError, LedgerOp};
use gpux_protocol::{
    AnySigned, AnyVerified, EscrowId, Ext, Keypair, LedgerEntry, LedgerRecord, MicroCredits,
    PublicKey, Signed, Timestamp, Verified,
};
use libp2p::{Multiaddr, PeerId};

use crate::p2p::{Client, Proto};
use crate::store::{Durability, NodeState, Store, StoreError, Tree};

/// A request to the ledger node.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum LedgerRequest {
    /// Apply a signed `EscrowLock`, `Redeem` or `Release` envelope.
    Submit(Vec<u8>),
    /// An account's balance.
    Balance(PublicKey),
    /// An escrow's state.
    Escrow(EscrowId),
}

/// An escrow as the ledger reports it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct EscrowView {
    /// Amount locked, micro-credits.
    pub amount: u64,
    /// Paid to the payee so far.
    pub redeemed: u64,
    /// Highest receipt seq redeemed.
    pub last_seq: u64,
    /// Whether the remainder went back to the payer.
    pub released: bool,
    /// Payer account.
    pub payer: PublicKey,
    /// Payee account.
    pub payee: PublicKey,
}

/// The ledger node's answer.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum LedgerResponse {
    /// Applied: the ledger's signed record.
    Record(Vec<u8>),
    /// Already applied (a retry): nothing changed.
    Unchanged(String),
    /// A balance, micro-credits.
    Balance(u64),
    /// An escrow (None: unknown).
    Escrow(Option<EscrowView>),
    /// Refused, with the reason; nothing changed.
    Refused(String),
}

/// The largest ledger frame accepted (a redemption carries two envelopes).
const MAX_FRAME: usize = 8 * 1024;
/// The largest envelope submitted: room is left in a frame, and in a log entry (which adds
/// a timestamp and tags), so whatever is accepted can always be replayed.
const MAX_SUBMITTED: usize = MAX_FRAME - 64;
/// The largest log entry read back.
const MAX_LOG_ENTRY: usize = 16 * 1024;
/// How old an `EscrowLock` may be when the ledger applies it (by the ledger's clock): a
/// lock held back cannot freeze a renter's money after the renter has given up on it.
pub const MAX_LOCK_AGE_MS: u64 = 120_000;
/// How long a party waits for the ledger to answer.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Encodes a ledger wire value.
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    bincode::encode_to_vec(value, bincode::config::standard()).unwrap_or_default()
}

/// Decodes a ledger wire value: bounded, and every byte must be consumed.
pub fn decode<T: Decode<()>>(bytes: &[u8]) -> Result<T, String> {
    decode_bounded::<T, MAX_FRAME>(bytes)
}

fn decode_bounded<T: Decode<()>, const LIMIT: usize>(bytes: &[u8]) -> Result<T, String> {
    if bytes.len() > LIMIT {
        return Err(format!("frame of {} bytes exceeds {LIMIT}", bytes.len()));
    }
    let (value, used) =
        bincode::decode_from_slice(bytes, bincode::config::standard().with_limit::<LIMIT>())
            .map_err(|e| format!("undecodable ledger frame: {e}"))?;
    if used != bytes.len() {
        return Err("trailing bytes after a ledger frame".into());
    }
    Ok(value)
}

/// One entry of the ledger's operation log.
#[derive(Debug, Clone, Encode, Decode)]
struct LogEntry {
    at: Timestamp,
    op: LogOp,
}

#[derive(Debug, Clone, Encode, Decode)]
enum LogOp {
    Mint {
        account: PublicKey,
        amount: MicroCredits,
    },
    Envelope(Vec<u8>),
}

/// Why a ledger operation was not applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The envelope is not a ledger operation or does not verify.
    #[error("not a valid ledger operation: {0}")]
    Invalid(String),
    /// The ledger's rules refused it.
    #[error(transparent)]
    Refused(#[from] LedgerError),
    /// The log could not be written (nothing was applied).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a submission did.
#[derive(Debug)]
pub enum Outcome {
    /// Applied; the ledger's signed record.
    Applied(Box<Verified<LedgerRecord>>),
    /// Nothing to do (already applied).
    Unchanged(String),
}

/// The ledger node's state: the state machine, its durable log and its key.
pub struct LedgerService<S> {
    key: Keypair,
    ledger: Ledger,
    state: NodeState<S>,
    next: u64,
    /// The signed record of each escrow's lock, returned again when a lock is retried.
    locks: std::collections::BTreeMap<EscrowId, Vec<u8>>,
}

impl<S> std::fmt::Debug for LedgerService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerService")
            .field("next", &self.next)
            .finish()
    }
}

fn op_of(verified: &AnyVerified) -> Option<LedgerOp<'_>> {
    match verified {
        AnyVerified::EscrowLock(lock) => Some(LedgerOp::Lock(lock)),
        AnyVerified::Redeem(redeem) => Some(LedgerOp::Redeem(redeem)),
        AnyVerified::Release(release) => Some(LedgerOp::Release(release)),
        _ => None,
    }
}

impl<S: Store> LedgerService<S> {
    /// Opens the ledger over `state`, replaying its log.
    pub fn open(
        key: Keypair,
        state: NodeState<S>,
        config: LedgerConfig,
    ) -> Result<Self, ServiceError> {
        let mut service = Self {
            key,
            ledger: Ledger::new(config),
            state,
            next: 1,
            locks: std::collections::BTreeMap::new(),
        };
        service.replay()?;
        Ok(service)
    }

    /// Rebuilds the state machine from the log.
    fn replay(&mut self) -> Result<(), ServiceError> {
        let config = *self.ledger.config();
        self.ledger = Ledger::new(config);
        self.locks.clear();
        self.next = 1;
        let corrupt = |reason: String| {
            ServiceError::Store(StoreError::Corrupt {
                path: std::path::PathBuf::from("ledger-log"),
                tree: "ledger-log",
                reason,
            })
        };
        for (k, v) in self.state.store().scan(Tree::LedgerLog)? {
            let entry: LogEntry = decode_bounded::<_, MAX_LOG_ENTRY>(&v).map_err(corrupt)?;
            let seq = k
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt("a key is not a log position".into()))?;
            match entry.op {
                LogOp::Mint { account, amount } => {
                    self.ledger
                        .apply(LedgerOp::Mint { account, amount }, entry.at)?;
                }
                LogOp::Envelope(bytes) => {
                    let verified = AnySigned::from_bytes(bytes)
                        .and_then(AnySigned::verify)
                        .map_err(|e| ServiceError::Invalid(e.to_string()))?;
                    let op = op_of(&verified)
                        .ok_or_else(|| ServiceError::Invalid("not a ledger operation".into()))?;
                    self.ledger.apply(op, entry.at)?;
                    if let AnyVerified::EscrowLock(lock) = &verified {
                        // Signing is deterministic: the same record as first returned.
                        let record = self.lock_record(seq, entry.at, lock)?;
                        self.locks.insert(lock.escrow, record.as_bytes().to_vec());
                    }
                }
            }
            self.next = seq + 1;
        }
        Ok(())
    }

    /// The state machine (read-only).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Appends an applied operation to the log (flushed). If the disk refuses, the state
    /// machine (already changed) is rebuilt from the log, so memory never runs ahead of disk.
    fn log(&mut self, entry: &LogEntry) -> Result<u64, ServiceError> {
        let seq = self.next;
        let written = self.state.store().put(
            Tree::LedgerLog,
            &seq.to_be_bytes(),
            &encode(entry),
            Durability::Flush,
        );
        if let Err(e) = written {
            self.replay()?;
            return Err(e.into());
        }
        self.next += 1;
        Ok(seq)
    }

    fn record(
        &self,
        seq: u64,
        now: Timestamp,
        op: gpux_protocol::ContentId,
        escrow: EscrowId,
        entry: LedgerEntry,
    ) -> Result<Verified<LedgerRecord>, ServiceError> {
        Signed::sign(
            &self.key,
            LedgerRecord {
                seq,
                created_at: now,
                op,
                escrow,
                entry,
                ext: Ext::new(),
            },
        )
        .map_err(|e| ServiceError::Invalid(e.to_string()))
    }

    fn lock_record(
        &self,
        seq: u64,
        at: Timestamp,
        lock: &Verified<gpux_protocol::EscrowLock>,
    ) -> Result<Verified<LedgerRecord>, ServiceError> {
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
        )
    }

    /// Mints credits (the testnet faucet), logged and flushed.
    pub fn mint(
        &mut self,
        account: PublicKey,
        amount: MicroCredits,
        now: Timestamp,
    ) -> Result<Verified<LedgerRecord>, ServiceError> {
        // `apply` changes nothing when it fails; `log` undoes it when the disk refuses.
        self.ledger.apply(LedgerOp::Mint { account, amount }, now)?;
        let seq = self.log(&LogEntry {
            at: now,
            op: LogOp::Mint { account, amount },
        })?;
        let op =
            gpux_protocol::ContentId(*blake3::hash(&encode(&(account, amount, seq))).as_bytes());
        self.record(
            seq,
            now,
            op,
            EscrowId([0; 16]),
            LedgerEntry::Minted { account, amount },
        )
    }

    /// Applies a signed ledger operation: verified, checked, applied, logged (flushed) before
    /// it is answered.
    pub fn submit(&mut self, envelope: Vec<u8>, now: Timestamp) -> Result<Outcome, ServiceError> {
        if envelope.len() > MAX_SUBMITTED {
            return Err(ServiceError::Invalid(format!(
                "an envelope of {} bytes; the ledger takes at most {MAX_SUBMITTED}",
                envelope.len()
            )));
        }
        let verified = AnySigned::from_bytes(envelope.clone())
            .and_then(AnySigned::verify)
            .map_err(|e| ServiceError::Invalid(e.to_string()))?;
        let op = op_of(&verified).ok_or_else(|| {
            ServiceError::Invalid(
                "only EscrowLock, Redeem and Release are ledger operations".into(),
            )
        })?;
        if let AnyVerified::EscrowLock(lock) = &verified {
            if let Some(record) = self.locks.get(&lock.escrow)
                && self.already_applied(&verified).is_some()
            {
                // A retried lock gets the record it got the first time.
                let record = Signed::<LedgerRecord>::from_bytes(record.clone())
                    .and_then(Signed::verify)
                    .map_err(|e| ServiceError::Invalid(e.to_string()))?;
                return Ok(Outcome::Applied(Box::new(record)));
            }
            if now.ms_since(lock.created_at) > MAX_LOCK_AGE_MS {
                return Err(ServiceError::Invalid(format!(
                    "the escrow lock is older than {} s",
                    MAX_LOCK_AGE_MS / 1000
                )));
            }
        }
        if let Some(unchanged) = self.already_applied(&verified) {
            return Ok(Outcome::Unchanged(unchanged));
        }
        // `apply` changes nothing when it fails; `log` undoes it when the disk refuses.
        let applied = self.ledger.apply(op, now)?;
        let (escrow, entry) = match (&verified, applied) {
            (_, Applied::AlreadyRedeemed { seq, last_seq }) => {
                return Ok(Outcome::Unchanged(format!(
                    "receipt {seq} is not newer than the last one redeemed ({last_seq})"
                )));
            }
            (AnyVerified::EscrowLock(lock), Applied::Locked { amount }) => (
                lock.escrow,
                LedgerEntry::Locked {
                    payer: lock.payer,
                    payee: lock.payee,
                    amount,
                },
            ),
            (
                AnyVerified::Redeem(redeem),
                Applied::Redeemed {
                    amount,
                    cumulative,
                    seq,
                },
            ) => {
                let payee = self
                    .ledger
                    .escrow(&redeem.escrow)
                    .map_or(redeem.signer(), |e| e.payee);
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
            (AnyVerified::Release(release), Applied::Released { refunded, .. }) => {
                let payer = self
                    .ledger
                    .escrow(&release.escrow)
                    .map_or(release.signer(), |e| e.payer);
                (
                    release.escrow,
                    LedgerEntry::Released {
                        payer,
                        amount: refunded,
                    },
                )
            }
            _ => return Err(ServiceError::Invalid("unexpected ledger outcome".into())),
        };
        let seq = self.log(&LogEntry {
            at: now,
            op: LogOp::Envelope(envelope),
        })?;
        let record = self.record(seq, now, verified_id(&verified), escrow, entry)?;
        if matches!(verified, AnyVerified::EscrowLock(_)) {
            self.locks.insert(escrow, record.as_bytes().to_vec());
        }
        Ok(Outcome::Applied(Box::new(record)))
    }

    /// A lock already applied (same escrow, lease, payer and amount) or a release of a closed
    /// escrow: retries, answered without change.
    fn already_applied(&self, verified: &AnyVerified) -> Option<String> {
        match verified {
            AnyVerified::EscrowLock(lock) => {
                let e = self.ledger.escrow(&lock.escrow)?;
                (e.lease == lock.lease && e.payer == lock.payer && e.amount == lock.amount)
                    .then(|| format!("escrow {} is already locked", lock.escrow))
            }
            AnyVerified::Release(release) => {
                let e = self.ledger.escrow(&release.escrow)?;
                (e.released && e.lease == release.lease)
                    .then(|| format!("escrow {} is already released", release.escrow))
            }
            _ => None,
        }
    }

    /// Answers one request frame.
    pub fn handle(&mut self, frame: &[u8], now: Timestamp) -> LedgerResponse {
        let request: LedgerRequest = match decode(frame) {
            Ok(r) => r,
            Err(e) => return LedgerResponse::Refused(e),
        };
        match request {
            LedgerRequest::Submit(envelope) => match self.submit(envelope, now) {
                Ok(Outcome::Applied(record)) => LedgerResponse::Record(record.as_bytes().to_vec()),
                Ok(Outcome::Unchanged(why)) => LedgerResponse::Unchanged(why),
                Err(e) => LedgerResponse::Refused(e.to_string()),
            },
            LedgerRequest::Balance(account) => {
                LedgerResponse::Balance(self.ledger.balance(&account).0)
            }
            LedgerRequest::Escrow(id) => {
                LedgerResponse::Escrow(self.ledger.escrow(&id).map(|e| EscrowView {
                    amount: e.amount.0,
                    redeemed: e.redeemed.0,
                    last_seq: e.last_seq,
                    released: e.released,
                    payer: e.payer,
                    payee: e.payee,
                }))
            }
        }
    }
}

fn verified_id(verified: &AnyVerified) -> gpux_protocol::ContentId {
    match verified {
        AnyVerified::EscrowLock(v) => v.id(),
        AnyVerified::Redeem(v) => v.id(),
        AnyVerified::Release(v) => v.id(),
        _ => gpux_protocol::ContentId([0; 32]),
    }
}

/// A party's connection to the ledger node it trusts.
#[derive(Debug, Clone)]
pub struct LedgerClient {
    net: Client,
    addr: Multiaddr,
    peer: PeerId,
    key: PublicKey,
}

impl LedgerClient {
    /// The ledger at `addr`, which must end with `/p2p/<peer id>` (the ledger's key).
    pub fn new(net: Client, addr: Multiaddr) -> Result<Self, String> {
        let Some(libp2p::multiaddr::Protocol::P2p(peer)) = addr.iter().last() else {
            return Err(format!(
                "the ledger address {addr} must end with /p2p/<the ledger's peer id>"
            ));
        };
        let key = peer
            .to_base58()
            .parse::<gpux_protocol::PeerId>()
            .map_err(|e| format!("the ledger's peer id: {e}"))?
            .public_key();
        Ok(Self {
            net,
            addr,
            peer,
            key,
        })
    }

    /// The ledger's public key.
    pub fn key(&self) -> PublicKey {
        self.key
    }

    /// Sends a request; when the ledger is not connected, dials it and tries once more.
    pub async fn call(&self, request: &LedgerRequest) -> Result<LedgerResponse, String> {
        tokio::time::timeout(CALL_TIMEOUT, self.call_once(request))
            .await
            .map_err(|_| format!("the ledger at {} did not answer in time", self.addr))?
    }

    async fn call_once(&self, request: &LedgerRequest) -> Result<LedgerResponse, String> {
        let frame = encode(request);
        let answer = match self
            .net
            .request_on(Proto::Ledger, self.peer, frame.clone())
            .await
        {
            Ok(answer) => answer,
            Err(_) => {
                let _ = self.net.dial(self.addr.clone()).await;
                self.net
                    .request_on(Proto::Ledger, self.peer, frame)
                    .await
                    .map_err(|e| format!("the ledger at {} did not answer: {e}", self.addr))?
            }
        };
        decode(&answer)
    }

    /// Submits a signed operation; an applied one comes back as the ledger's verified record.
    /// `Err` means no verdict (the ledger did not answer, or answered nonsense).
    pub async fn submit(&self, envelope: Vec<u8>) -> Result<SubmitResult, String> {
        match self.call(&LedgerRequest::Submit(envelope)).await? {
            LedgerResponse::Record(bytes) => {
                let record = Signed::<LedgerRecord>::from_bytes(bytes)
                    .and_then(Signed::verify)
                    .map_err(|e| format!("the ledger's record does not verify: {e}"))?;
                if record.signer() != self.key {
                    return Err("the ledger's record is not signed by the ledger".into());
                }
                Ok(SubmitResult::Applied(Box::new(record)))
            }
            LedgerResponse::Unchanged(why) => Ok(SubmitResult::Unchanged(why)),
            LedgerResponse::Refused(why) => Ok(SubmitResult::Refused(why)),
            _ => Err("the ledger answered with an unexpected message".into()),
        }
    }

    /// An account's balance.
    pub async fn balance(&self, account: PublicKey) -> Result<MicroCredits, String> {
        match self.call(&LedgerRequest::Balance(account)).await? {
            LedgerResponse::Balance(b) => Ok(MicroCredits(b)),
            LedgerResponse::Refused(why) => Err(format!("the ledger refused: {why}")),
            _ => Err("the ledger answered with an unexpected message".into()),
        }
    }

    /// An escrow's state.
    pub async fn escrow(&self, id: EscrowId) -> Result<Option<EscrowView>, String> {
        match self.call(&LedgerRequest::Escrow(id)).await? {
            LedgerResponse::Escrow(e) => Ok(e),
            LedgerResponse::Refused(why) => Err(format!("the ledger refused: {why}")),
            _ => Err("the ledger answered with an unexpected message".into()),
        }
    }
}

/// What a submission through [`LedgerClient::submit`] did.
#[derive(Debug)]
pub enum SubmitResult {
    /// Applied: the ledger's record, verified against its key.
    Applied(Box<Verified<LedgerRecord>>),
    /// Already applied before.
    Unchanged(String),
    /// The ledger's rules refused it (nothing changed).
    Refused(String),
}

#[cfg(test)]
mod tests {
    use gpux_protocol::{
        BoundedBytes, ContentId, EscrowLock, Redeem, Release, UsageReceipt, UsageSummary,
    };

    use super::*;
    use crate::store::{NodeState, SledStore};

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
        let receipt = Signed::sign(
            &p.host,
            UsageReceipt {
                lease: p.lease,
                escrow: p.escrow,
                price_per_gpu_hour: PRICE,
                gpus: 1,
                seq,
                created_at: Timestamp(2),
                gpu_seconds,
                amount_due: gpux_protocol::money::cost(gpu_seconds, PRICE).unwrap(),
                usage: UsageSummary::default(),
                ext: Ext::new(),
            },
        )
        .unwrap();
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

    #[test]
    fn retries_change_nothing_and_a_restart_replays_to_the_same_balances() {
        let tmp = tempfile::tempdir().unwrap();
        let p = parties();
        {
            let mut s = open(tmp.path(), &p);
            s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
                .unwrap();
            let record = match s.submit(lock(&p, 300_000), Timestamp(1)).unwrap() {
                Outcome::Applied(r) => r,
                other => panic!("{other:?}"),
            };
            assert_eq!(record.signer(), p.ledger.public());
            assert!(matches!(record.entry, LedgerEntry::Locked { .. }));
            // The same lock again (a retry) changes nothing and gets the same record.
            match s.submit(lock(&p, 300_000), Timestamp(1)).unwrap() {
                Outcome::Applied(again) => assert_eq!(again.as_bytes(), record.as_bytes()),
                other => panic!("{other:?}"),
            }
            assert_eq!(
                s.ledger().balance(&p.renter.public()),
                MicroCredits(700_000)
            );
            assert!(matches!(
                s.submit(redeem(&p, 1, 60), Timestamp(2)).unwrap(),
                Outcome::Applied(_)
            ));
            assert!(matches!(
                s.submit(redeem(&p, 2, 90), Timestamp(3)).unwrap(),
                Outcome::Applied(_)
            ));
            // An older receipt, or the same one again: nothing paid twice.
            assert!(matches!(
                s.submit(redeem(&p, 1, 60), Timestamp(4)).unwrap(),
                Outcome::Unchanged(_)
            ));
            assert!(matches!(
                s.submit(redeem(&p, 2, 90), Timestamp(4)).unwrap(),
                Outcome::Unchanged(_)
            ));
            assert!(matches!(
                s.submit(release(&p), Timestamp(5)).unwrap(),
                Outcome::Applied(_)
            ));
            assert!(matches!(
                s.submit(release(&p), Timestamp(6)).unwrap(),
                Outcome::Unchanged(_)
            ));
            assert_eq!(s.ledger().balance(&p.host.public()), MicroCredits(90_000));
            assert_eq!(
                s.ledger().balance(&p.renter.public()),
                MicroCredits(910_000)
            );
            // A lock beyond the balance is refused and logs nothing.
            let mut other = parties();
            other.escrow = EscrowId([6; 16]);
            assert!(matches!(
                s.submit(lock(&other, 5_000_000), Timestamp(7)),
                Err(ServiceError::Refused(LedgerError::InsufficientFunds { .. }))
            ));
        }
        let mut s = open(tmp.path(), &p);
        // After a restart a retried lock still gets its original record.
        match s.submit(lock(&p, 300_000), Timestamp(9)).unwrap() {
            Outcome::Applied(again) => {
                assert!(matches!(again.entry, LedgerEntry::Locked { .. }));
                assert_eq!(again.seq, 2);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.ledger().balance(&p.host.public()), MicroCredits(90_000));
        assert_eq!(
            s.ledger().balance(&p.renter.public()),
            MicroCredits(910_000)
        );
        assert_eq!(s.ledger().total(), 1_000_000);
        assert!(s.ledger().escrow(&p.escrow).unwrap().released);
    }

    #[test]
    fn a_lock_held_back_too_long_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let p = parties();
        let mut s = open(tmp.path(), &p);
        s.mint(p.renter.public(), MicroCredits(1_000_000), Timestamp(0))
            .unwrap();
        // The lock was signed at 1 ms; the ledger sees it MAX_LOCK_AGE_MS later.
        let late = Timestamp(2 + MAX_LOCK_AGE_MS);
        let err = s.submit(lock(&p, 300_000), late).unwrap_err();
        assert!(err.to_string().contains("older than"), "{err}");
        assert_eq!(
            s.ledger().balance(&p.renter.public()),
            MicroCredits(1_000_000)
        );
    }

    #[test]
    fn frames_with_trailing_or_garbage_bytes_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let p = parties();
        let mut s = open(tmp.path(), &p);
        let mut frame = encode(&LedgerRequest::Balance(p.renter.public()));
        assert_eq!(s.handle(&frame, Timestamp(0)), LedgerResponse::Balance(0));
        frame.push(0);
        assert!(matches!(
            s.handle(&frame, Timestamp(0)),
            LedgerResponse::Refused(why) if why.contains("trailing")
        ));
        assert!(matches!(
            s.handle(&[0xff; 9], Timestamp(0)),
            LedgerResponse::Refused(_)
        ));
        assert!(matches!(
            s.handle(&vec![0; MAX_FRAME + 1], Timestamp(0)),
            LedgerResponse::Refused(_)
        ));
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
        let frame = encode(&LedgerRequest::Submit(not_op.as_bytes().to_vec()));
        assert!(matches!(
            s.handle(&frame, Timestamp(1)),
            LedgerResponse::Refused(_)
        ));
    }
}
