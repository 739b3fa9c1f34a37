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

use gpux_lease::{LedgerMachine, ReplayError};
use gpux_market::Ledger;
pub use gpux_market::LedgerConfig;
use gpux_protocol::ledger_wire::{LedgerResponse, RefusalCode};
use gpux_protocol::{Keypair, MicroCredits, PublicKey, Timestamp};

use std::path::PathBuf;

use crate::store::{Durability, Entries, NodeState, Store, StoreError, Tree};

/// Why the ledger service could not open or do something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The stored log does not replay: the database is damaged (never opened as empty).
    #[error(
        "the ledger's log is damaged: {0}; the ledger refuses to start rather than lose balances \
         (stop the node and run `gpux ledger restore` to rebuild the database from the ledger's copy \
         of its log; see docs/settlement.md)"
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
    /// The verified copy of the log (`<data-dir>/ledger.copy`; None for a store in memory).
    copy: Option<LogCopy>,
    /// Set when the copy could not be written: every later operation is refused until a
    /// restart rebuilds the copy, so nothing is acknowledged that the copy lacks.
    halted: Option<String>,
}

mod client;
pub mod cluster;
mod copy;
mod manifest;
mod restore;

use crate::store::write_atomic;
pub use client::{LedgerAddrError, LedgerCallError, LedgerClient};
pub use copy::LEDGER_COPY;
use copy::{CopyContents, LogCopy, Tail};
pub use manifest::LEDGER_MANIFEST;
use manifest::Manifest;
pub use restore::{RestoreError, Restored, restore};

pub use gpux_api::faucet_grant;

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
        // The log is read once, for the replay and both checks.
        let log = state.store().scan(Tree::LedgerLog)?;
        let machine = Self::replay_entries(&key, &log, config)?;
        let data_dir = state
            .db_path()
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && d.is_dir())
            .map(std::path::Path::to_path_buf);
        let (manifest, copy) = match data_dir {
            Some(dir) => {
                let manifest = Self::check_manifest(&log, dir.join(LEDGER_MANIFEST))?;
                let copy = Self::check_copy(&log, &copy_path(&dir))?;
                (Some(manifest), Some(copy))
            }
            None => (None, None),
        };
        Ok(Self {
            key,
            config,
            machine,
            state,
            manifest,
            copy,
            halted: None,
        })
    }

    /// Checks the copy against the (verified) log: the copy must be a prefix of it. A copy
    /// that is behind (a crash before its append) is brought up to the log; a missing or
    /// damaged one is rewritten from the log; a copy with entries the log lacks means the
    /// database lost flushed entries, and the ledger refuses to start.
    fn check_copy(log: &Entries, path: &std::path::Path) -> Result<LogCopy, ServiceError> {
        let refuse = |position: u64, reason: String| ReplayError { position, reason };
        let io = |e: std::io::Error| refuse(0, format!("{}: {e}", path.display()));
        let contents = CopyContents::read(path).map_err(io)?;
        for (i, (at, entry)) in contents.entries.iter().enumerate() {
            let Some((k, v)) = log.get(i) else {
                return Err(refuse(
                    *at,
                    format!(
                        "the ledger's copy {} holds {} entries but the database only {}: the database lost entries it had flushed",
                        path.display(),
                        contents.entries.len(),
                        log.len()
                    ),
                )
                .into());
            };
            if position(k) != Some(*at) || v != entry {
                return Err(refuse(
                    *at,
                    format!(
                        "the database's log differs from the ledger's copy {} at this entry",
                        path.display()
                    ),
                )
                .into());
            }
        }
        let log: Vec<(u64, Vec<u8>)> = log
            .iter()
            .map(|(k, v)| (position(k).unwrap_or(0), v.clone()))
            .collect();
        if let Some(Tail::Damaged(offset)) = contents.tail {
            tracing::warn!(
                "the ledger's copy {} is damaged at byte {offset}; rewriting it from the verified log",
                path.display()
            );
            return Ok(LogCopy::rewrite(path, &log).map_err(io)?);
        }
        if contents.entries.is_empty() && !log.is_empty() {
            tracing::warn!(
                "the ledger's copy {} is missing; writing it from the verified log",
                path.display()
            );
            return Ok(LogCopy::rewrite(path, &log).map_err(io)?);
        }
        let mut copy =
            LogCopy::reopen_or_create(path, copy::frames_len(&contents.entries)).map_err(io)?;
        let mut chain = contents.manifest;
        for (at, entry) in &log[contents.entries.len()..] {
            chain = chain.next(*at, entry);
            copy.append(*at, entry, &chain.chain).map_err(io)?;
        }
        Ok(copy)
    }

    /// Checks the log against its manifest: it may be ahead, never behind or different.
    /// Writes the manifest when there is none (a ledger of an earlier version).
    fn check_manifest(
        entries: &Entries,
        path: PathBuf,
    ) -> Result<(PathBuf, Manifest), ServiceError> {
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
        for (k, v) in entries {
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
        Self::replay_entries(key, &state.store().scan(Tree::LedgerLog)?, config)
    }

    fn replay_entries(
        key: &Keypair,
        entries: &Entries,
        config: LedgerConfig,
    ) -> Result<LedgerMachine, ServiceError> {
        let mut log = Vec::with_capacity(entries.len());
        for (k, v) in entries {
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
        // After the flush, the copy, then the manifest: each may lag the one before it (a
        // crash in between), never lead it.
        if let Some((path, manifest)) = self.manifest.as_mut() {
            let next = manifest.next(at, &entry);
            if let Some(copy) = self.copy.as_mut()
                && let Err(e) = copy.append(at, &entry, &next.chain)
            {
                let why = format!(
                    "the ledger cannot write its copy {}: {e}",
                    copy.path().display()
                );
                tracing::error!("{why}; refusing every operation until a restart");
                self.halted = Some(why.clone());
                return Err(ServiceError::Refused {
                    code: RefusalCode::Storage,
                    detail: why,
                });
            }
            *manifest = next;
            if let Err(e) = write_atomic(path, &manifest.text()) {
                tracing::error!("the ledger cannot write {}: {e}", path.display());
            }
        }
        Ok(())
    }

    /// Entries applied (the log's length).
    pub fn applied(&self) -> u64 {
        self.machine.next_position().saturating_sub(1)
    }

    /// Mints credits (the testnet faucet), logged and flushed. Returns the new balance.
    pub fn mint(
        &mut self,
        account: PublicKey,
        amount: MicroCredits,
        now: Timestamp,
    ) -> Result<MicroCredits, ServiceError> {
        if let Some(why) = &self.halted {
            return Err(ServiceError::Refused {
                code: RefusalCode::Storage,
                detail: why.clone(),
            });
        }
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
        if let Some(why) = &self.halted {
            return LedgerResponse::refused(RefusalCode::Storage, why.clone());
        }
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

/// Where a ledger in `data_dir` keeps its copy: `ledger.copy`, or wherever that file links
/// to (a symbolic link puts the copy on another disk).
pub fn copy_path(data_dir: &std::path::Path) -> PathBuf {
    let path = data_dir.join(LEDGER_COPY);
    std::fs::canonicalize(&path).unwrap_or(path)
}

#[cfg(test)]
mod tests;
