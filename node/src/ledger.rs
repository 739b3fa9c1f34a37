//! The ledger node and its clients, on `/gpux/ledger/2`.
//!
//! The rules are pure: `gpux_market::Ledger` (settlement) under `gpux_lease::LedgerMachine`
//! (the service's decisions: stale locks, retries and their records). [`LedgerService`] is
//! the shell around them: every operation the machine applies comes out as a log entry that
//! is appended to sled and flushed *before* the answer goes out, and on start the log is
//! replayed (every envelope verified again), so a restarted ledger has exactly the balances
//! it had. A write that fails rebuilds the machine from the log, so memory never runs ahead
//! of disk.
//!
//! [`LedgerClient`] is a party's connection to the ledger it trusts: a verdict comes back
//! typed ([`gpux_lease::LedgerVerdict`]: applied with the ledger's verified record,
//! unchanged, refused with a [`RefusalCode`], or no verdict), and a `NotLeader` redirect is
//! followed.

use gpux_lease::{LedgerMachine, LedgerVerdict, ReplayError};
use gpux_market::{Ledger, LedgerConfig};
use gpux_protocol::ledger_wire::{self, EscrowView, LedgerRequest, LedgerResponse, RefusalCode};
use gpux_protocol::{EscrowId, Keypair, MicroCredits, PublicKey, Timestamp};
use libp2p::{Multiaddr, PeerId};

use crate::p2p::{Client, Proto};
use std::path::PathBuf;

use crate::store::{Durability, NodeState, Store, StoreError, Tree};

/// How long a party waits for the ledger to answer.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the ledger service could not open or do something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The stored log does not replay: the database is damaged (never opened as empty).
    #[error(
        "the ledger's log is damaged: {0}; the ledger refuses to start rather than lose balances"
    )]
    Replay(#[from] ReplayError),
    /// The disk failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The ledger's rules refused the operation.
    #[error("refused ({code:?}): {detail}")]
    Refused {
        /// The rule.
        code: RefusalCode,
        /// For people.
        detail: String,
    },
}

/// The ledger node's state: the machine and its durable log.
pub struct LedgerService<S> {
    key: Keypair,
    config: LedgerConfig,
    machine: LedgerMachine,
    state: NodeState<S>,
    /// `<data-dir>/ledger.manifest` (None for a store in memory), and what it says.
    manifest: Option<(PathBuf, Manifest)>,
}

/// What the ledger has applied, kept beside its database: the number of log entries and a
/// hash chain over them (`h_i = blake3(h_{i-1} || position || entry)`). Written after each
/// entry is flushed, so a log may be ahead of it (a crash in between), never behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Manifest {
    count: u64,
    chain: [u8; 32],
}

/// The manifest's file name, in the data dir.
pub const LEDGER_MANIFEST: &str = "ledger.manifest";

impl Manifest {
    fn next(&self, position: u64, entry: &[u8]) -> Manifest {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&self.chain);
        hasher.update(&position.to_be_bytes());
        hasher.update(entry);
        Manifest {
            count: self.count + 1,
            chain: *hasher.finalize().as_bytes(),
        }
    }

    fn text(&self) -> String {
        format!(
            "count {}\nchain {}\n",
            self.count,
            gpux_protocol::hex(&self.chain)
        )
    }

    fn parse(text: &str) -> Option<Manifest> {
        let mut count = None;
        let mut chain = None;
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("count", n)) => count = n.trim().parse().ok(),
                Some(("chain", h)) => {
                    chain = gpux_protocol::unhex(h.trim())
                        .ok()
                        .and_then(|b| <[u8; 32]>::try_from(b).ok())
                }
                _ => {}
            }
        }
        Some(Manifest {
            count: count?,
            chain: chain?,
        })
    }
}

/// Writes a file atomically (temporary file, sync, rename, sync of the directory).
fn write_atomic(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl<S> std::fmt::Debug for LedgerService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerService")
            .field("machine", &self.machine)
            .finish()
    }
}

fn position(key: &[u8]) -> Option<u64> {
    key.get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
}

impl<S: Store> LedgerService<S> {
    /// Opens the ledger over `state`, replaying its log.
    pub fn open(
        key: Keypair,
        state: NodeState<S>,
        config: LedgerConfig,
    ) -> Result<Self, ServiceError> {
        let machine = Self::replay(&key, &state, config)?;
        let manifest_path = state
            .db_path()
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && d.is_dir())
            .map(|d| d.join(LEDGER_MANIFEST));
        let manifest = match manifest_path {
            Some(path) => Some(Self::check_manifest(&state, path)?),
            None => None,
        };
        Ok(Self {
            key,
            config,
            machine,
            state,
            manifest,
        })
    }

    /// Checks the log against its manifest: it may be ahead, never behind or different.
    /// Writes the manifest when there is none (a ledger of an earlier version).
    fn check_manifest(
        state: &NodeState<S>,
        path: PathBuf,
    ) -> Result<(PathBuf, Manifest), ServiceError> {
        let entries = state.store().scan(Tree::LedgerLog)?;
        let refuse = |reason: String| ReplayError {
            position: 0,
            reason,
        };
        let mut chain = Manifest::default();
        let recorded = match std::fs::read_to_string(&path) {
            Ok(text) => Some(Manifest::parse(&text).ok_or_else(|| {
                refuse(format!(
                    "{} is unreadable; restore it with the database",
                    path.display()
                ))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(refuse(format!("{}: {e}", path.display())).into()),
        };
        for (k, v) in &entries {
            let at = position(k).unwrap_or(0);
            if recorded.is_some_and(|m| chain.count == m.count) {
                break;
            }
            chain = chain.next(at, v);
        }
        if let Some(m) = recorded {
            if chain.count < m.count {
                return Err(refuse(format!(
                    "the log holds {} entries but {} says {} were applied: it is truncated or an older copy",
                    chain.count,
                    path.display(),
                    m.count
                ))
                .into());
            }
            if chain.chain != m.chain {
                return Err(refuse(format!(
                    "the log's first {} entries do not match {} (their hash chain differs): it was changed",
                    m.count,
                    path.display()
                ))
                .into());
            }
        }
        // Bring the manifest up to the whole log (it may be ahead after a crash).
        for (k, v) in entries.iter().skip(chain.count as usize) {
            chain = chain.next(position(k).unwrap_or(0), v);
        }
        write_atomic(&path, &chain.text())
            .map_err(|e| refuse(format!("{}: {e}", path.display())))?;
        Ok((path, chain))
    }

    fn replay(
        key: &Keypair,
        state: &NodeState<S>,
        config: LedgerConfig,
    ) -> Result<LedgerMachine, ServiceError> {
        let entries = state.store().scan(Tree::LedgerLog)?;
        let mut log = Vec::with_capacity(entries.len());
        for (k, v) in &entries {
            let at = position(k).ok_or_else(|| ReplayError {
                position: 0,
                reason: "a key is not a log position".into(),
            })?;
            log.push((at, v.as_slice()));
        }
        Ok(LedgerMachine::replay(key.clone(), config, log)?)
    }

    /// The state machine (read-only).
    pub fn ledger(&self) -> &Ledger {
        self.machine.ledger()
    }

    /// Stores a log entry (flushed); on failure the machine is rebuilt from the log.
    fn append(&mut self, (at, entry): (u64, Vec<u8>)) -> Result<(), ServiceError> {
        let written = self.state.store().put(
            Tree::LedgerLog,
            &at.to_be_bytes(),
            &entry,
            Durability::Flush,
        );
        if let Err(e) = written {
            self.machine = Self::replay(&self.key, &self.state, self.config)?;
            return Err(e.into());
        }
        // After the flush: the manifest may lag the log (a crash here), never lead it.
        if let Some((path, manifest)) = self.manifest.as_mut() {
            *manifest = manifest.next(at, &entry);
            if let Err(e) = write_atomic(path, &manifest.text()) {
                tracing::error!("the ledger cannot write {}: {e}", path.display());
            }
        }
        Ok(())
    }

    /// Mints credits (the testnet faucet), logged and flushed. Returns the new balance.
    pub fn mint(
        &mut self,
        account: PublicKey,
        amount: MicroCredits,
        now: Timestamp,
    ) -> Result<MicroCredits, ServiceError> {
        let (_, append) = self
            .machine
            .mint(now, account, amount)
            .map_err(|r| match r {
                LedgerResponse::Refused { code, detail, .. } => {
                    ServiceError::Refused { code, detail }
                }
                _ => ServiceError::Refused {
                    code: RefusalCode::Invalid,
                    detail: "unexpected answer".into(),
                },
            })?;
        self.append(append)?;
        Ok(self.machine.ledger().balance(&account))
    }

    /// Answers one request frame: an applied operation is on disk before the answer.
    pub fn handle(&mut self, frame: &[u8], now: Timestamp) -> LedgerResponse {
        let output = self.machine.handle(now, frame);
        if let Some(append) = output.append
            && let Err(e) = self.append(append)
        {
            tracing::error!("the ledger cannot write its log: {e}");
            return LedgerResponse::refused(RefusalCode::Storage, e.to_string());
        }
        output.response
    }
}

/// Why a call to the ledger gave no answer to act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerCallError {
    /// The ledger did not answer (in time), or answered nonsense.
    #[error("the ledger at {addr} did not answer: {why}")]
    Unreachable {
        /// Where.
        addr: String,
        /// Why.
        why: String,
    },
    /// The ledger refused.
    #[error("the ledger refused ({code:?}): {detail}")]
    Refused {
        /// The rule.
        code: RefusalCode,
        /// For people.
        detail: String,
    },
}

/// A party's connection to the ledger it trusts.
#[derive(Debug, Clone)]
pub struct LedgerClient {
    net: Client,
    addr: Multiaddr,
    peer: PeerId,
    key: PublicKey,
}

/// A ledger address that does not name the ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the ledger address {0} must end with /p2p/<the ledger's peer id>")]
pub struct LedgerAddrError(pub String);

impl LedgerClient {
    /// The ledger at `addr`, which must end with `/p2p/<peer id>` (the ledger's key).
    pub fn new(net: Client, addr: Multiaddr) -> Result<Self, LedgerAddrError> {
        let Some(libp2p::multiaddr::Protocol::P2p(peer)) = addr.iter().last() else {
            return Err(LedgerAddrError(addr.to_string()));
        };
        let key = peer
            .to_base58()
            .parse::<gpux_protocol::PeerId>()
            .map_err(|_| LedgerAddrError(addr.to_string()))?
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

    fn unreachable(&self, why: impl std::fmt::Display) -> LedgerCallError {
        LedgerCallError::Unreachable {
            addr: self.addr.to_string(),
            why: why.to_string(),
        }
    }

    /// Sends a request (dialing when not connected), following one `NotLeader` redirect.
    pub async fn call(&self, request: &LedgerRequest) -> Result<LedgerResponse, LedgerCallError> {
        let frame = ledger_wire::encode(request);
        let response = tokio::time::timeout(
            CALL_TIMEOUT,
            self.call_once(self.peer, Some(&self.addr), frame.clone()),
        )
        .await
        .map_err(|_| self.unreachable("no answer in time"))??;
        let LedgerResponse::NotLeader {
            leader: Some(leader),
            addrs,
        } = &response
        else {
            return Ok(response);
        };
        let leader = PeerId::from_bytes(leader)
            .map_err(|e| self.unreachable(format!("a redirect to a bad peer id: {e}")))?;
        for addr in addrs.iter().filter_map(|a| a.parse::<Multiaddr>().ok()) {
            let _ = self.net.dial(addr).await;
        }
        tokio::time::timeout(CALL_TIMEOUT, self.call_once(leader, None, frame))
            .await
            .map_err(|_| self.unreachable("the leader gave no answer in time"))?
    }

    async fn call_once(
        &self,
        peer: PeerId,
        addr: Option<&Multiaddr>,
        frame: Vec<u8>,
    ) -> Result<LedgerResponse, LedgerCallError> {
        let answer = match self
            .net
            .request_on(Proto::Ledger, peer, frame.clone())
            .await
        {
            Ok(answer) => answer,
            Err(first) => {
                let Some(addr) = addr else {
                    return Err(self.unreachable(first));
                };
                let _ = self.net.dial(addr.clone()).await;
                self.net
                    .request_on(Proto::Ledger, peer, frame)
                    .await
                    .map_err(|e| self.unreachable(e))?
            }
        };
        ledger_wire::decode(&answer).map_err(|e| self.unreachable(e))
    }

    /// Submits a signed operation; the verdict, typed.
    pub async fn submit(&self, envelope: Vec<u8>) -> LedgerVerdict {
        match self.call(&LedgerRequest::Submit(envelope)).await {
            Ok(response) => LedgerVerdict::from_response(response, self.key),
            Err(e) => {
                tracing::debug!("{e}");
                LedgerVerdict::Unreachable
            }
        }
    }

    /// An account's balance.
    pub async fn balance(&self, account: PublicKey) -> Result<MicroCredits, LedgerCallError> {
        match self.call(&LedgerRequest::Balance(account)).await? {
            LedgerResponse::Balance(b) => Ok(MicroCredits(b)),
            LedgerResponse::Refused { code, detail, .. } => {
                Err(LedgerCallError::Refused { code, detail })
            }
            _ => Err(self.unreachable("an unexpected answer")),
        }
    }

    /// An escrow's state.
    pub async fn escrow(&self, id: EscrowId) -> Result<Option<EscrowView>, LedgerCallError> {
        match self.call(&LedgerRequest::Escrow(id)).await? {
            LedgerResponse::Escrow(e) => Ok(e),
            LedgerResponse::Refused { code, detail, .. } => {
                Err(LedgerCallError::Refused { code, detail })
            }
            _ => Err(self.unreachable("an unexpected answer")),
        }
    }
}

#[cfg(test)]
mod tests {
    use gpux_protocol::{
        BoundedBytes, ContentId, EscrowLock, Redeem, Release, UsageReceipt, UsageSummary,
    };

    use super::*;
    use crate::store::{NodeState, SledStore};
    use gpux_protocol::{Ext, LedgerEntry, LedgerRecord, Signed, Verified};

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
        let err =
            LedgerService::open(p.ledger.clone(), state, LedgerConfig::default()).unwrap_err();
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
        let err =
            LedgerService::open(p.ledger.clone(), state, LedgerConfig::default()).unwrap_err();
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
        let err =
            LedgerService::open(p.ledger.clone(), state, LedgerConfig::default()).unwrap_err();
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
}
