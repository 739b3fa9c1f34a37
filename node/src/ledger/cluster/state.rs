//! The replicated state machine: every member applies the same committed entries to its own
//! [`LedgerMachine`] (verifying every envelope again) and signs its records with its own key.
//!
//! A snapshot is the ledger's own log of applied operations (what a single-member ledger
//! keeps): installing one replays it, verifying every envelope, exactly as a restart does.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use gpux_lease::{LedgerMachine, LogEntry, LogOp};
use gpux_market::LedgerConfig;
use gpux_protocol::Keypair;
use gpux_protocol::ledger_wire::{self, LedgerRequest, LedgerResponse, RefusalCode};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, StorageError, StorageIOError, StoredMembership,
};

use super::{Answer, LedgerRaft, Member, NodeId, decode, encode};
use crate::store::{Durability, Store, Tree};

const SNAPSHOT: &[u8] = b"snapshot";
/// How many of its newest records (by log index) a member keeps for the leader to collect
/// its signature (a few seconds' worth at any rate the ledger runs).
const RECENT_RECORDS: usize = 4096;
/// The largest log entry a member applies.
const MAX_ENTRY: usize = 16 * 1024;

/// A snapshot's body: the ledger's applied operations, by position.
#[derive(serde::Serialize, serde::Deserialize)]
struct Body {
    entries: Vec<(u64, Vec<u8>)>,
}

struct Inner {
    key: Keypair,
    config: LedgerConfig,
    machine: LedgerMachine,
    /// The ledger's own log: what the machine applied, by position (the snapshot's body).
    entries: Vec<(u64, Vec<u8>)>,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Member>,
    /// The newest snapshot, built or installed: its metadata and body.
    snapshot: Option<(SnapshotMeta<NodeId, Member>, Vec<u8>)>,
    built: u64,
    /// This member's signed records of its newest entries, by log index.
    recent: BTreeMap<u64, Vec<u8>>,
}

/// The state machine. Cloning shares it: the node reads balances through a clone while
/// openraft applies through another.
pub struct LedgerState<S> {
    inner: Arc<Mutex<Inner>>,
    store: Arc<S>,
}

impl<S> Clone for LedgerState<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            store: self.store.clone(),
        }
    }
}

fn sm_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::read_state_machine(&std::io::Error::other(e.to_string())).into()
}

fn replay(
    key: &Keypair,
    config: LedgerConfig,
    entries: &[(u64, Vec<u8>)],
) -> Result<LedgerMachine, StorageError<NodeId>> {
    LedgerMachine::replay(
        key.clone(),
        config,
        entries.iter().map(|(p, e)| (*p, e.as_slice())),
    )
    .map_err(sm_err)
}

impl<S: Store + 'static> LedgerState<S> {
    /// The state machine, from the newest snapshot in `store` (empty without one); openraft
    /// applies the committed entries after it.
    pub fn open(key: Keypair, config: LedgerConfig, store: Arc<S>) -> Result<Self, String> {
        let saved: Option<(SnapshotMeta<NodeId, Member>, Vec<u8>)> = match store
            .get(Tree::RaftMeta, SNAPSHOT)
            .map_err(|e| e.to_string())?
        {
            Some(bytes) => Some(decode(&bytes).map_err(|e| format!("the snapshot: {e}"))?),
            None => None,
        };
        let (machine, entries, last_applied, membership) = match &saved {
            Some((meta, body)) => {
                let body: Body = decode(body).map_err(|e| format!("the snapshot: {e}"))?;
                let machine = replay(&key, config, &body.entries)
                    .map_err(|e| format!("the snapshot does not replay: {e}"))?;
                (
                    machine,
                    body.entries,
                    meta.last_log_id,
                    meta.last_membership.clone(),
                )
            }
            None => (
                LedgerMachine::new(key.clone(), config),
                Vec::new(),
                None,
                StoredMembership::default(),
            ),
        };
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                key,
                config,
                machine,
                entries,
                last_applied,
                membership,
                snapshot: saved,
                built: 0,
                recent: BTreeMap::new(),
            })),
            store,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the machine half-changed (every
        // change is one call into the pure machine), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the machine.
    pub fn read<T>(&self, f: impl FnOnce(&LedgerMachine) -> T) -> T {
        f(&self.lock().machine)
    }

    /// Answers a read-only request from this member's state.
    pub fn query(&self, request: LedgerRequest) -> LedgerResponse {
        let mut inner = self.lock();
        let now = gpux_protocol::Timestamp(0);
        inner.machine.request(now, request).response
    }

    /// This member's signed record of the entry at log `index`, if it applied one there
    /// lately.
    pub fn record_at(&self, index: u64) -> Option<Vec<u8>> {
        self.lock().recent.get(&index).cloned()
    }

    /// The last applied log id's index (0 before any).
    pub fn applied_index(&self) -> u64 {
        self.lock().last_applied.map_or(0, |l| l.index)
    }

    fn save_snapshot(
        &self,
        meta: &SnapshotMeta<NodeId, Member>,
        body: &[u8],
    ) -> Result<(), StorageError<NodeId>> {
        self.store
            .put(
                Tree::RaftMeta,
                SNAPSHOT,
                &encode(&(meta, body)),
                Durability::Flush,
            )
            .map_err(|e| {
                StorageIOError::write_snapshot(None, &std::io::Error::other(e.to_string())).into()
            })
    }
}

impl Inner {
    fn apply_one(&mut self, entry: Entry<LedgerRaft>) -> Answer {
        self.last_applied = Some(entry.log_id);
        match entry.payload {
            EntryPayload::Blank => Answer(Vec::new()),
            EntryPayload::Membership(m) => {
                self.membership = StoredMembership::new(Some(entry.log_id), m);
                Answer(Vec::new())
            }
            EntryPayload::Normal(command) => {
                let response = self.apply_command(&command.0);
                if let LedgerResponse::Record(record) = &response {
                    self.recent.insert(entry.log_id.index, record.clone());
                    while self.recent.len() > RECENT_RECORDS {
                        self.recent.pop_first();
                    }
                }
                Answer(ledger_wire::encode(&response))
            }
        }
    }

    /// One ledger operation at the time its leader stamped on it (never this member's
    /// clock), so every member decides alike.
    fn apply_command(&mut self, bytes: &[u8]) -> LedgerResponse {
        let decoded = bincode::decode_from_slice::<LogEntry, _>(
            bytes,
            bincode::config::standard().with_limit::<MAX_ENTRY>(),
        );
        let entry = match decoded {
            Ok((entry, used)) if used == bytes.len() => entry,
            _ => {
                return LedgerResponse::refused(RefusalCode::Malformed, "an undecodable entry");
            }
        };
        let (append, response) = match entry.op {
            LogOp::Mint { account, amount } => match self.machine.mint(entry.at, account, amount) {
                Ok((record, append)) => (
                    Some(append),
                    LedgerResponse::Record(record.as_bytes().to_vec()),
                ),
                Err(refused) => (None, refused),
            },
            LogOp::Envelope(envelope) => {
                let out = self
                    .machine
                    .request(entry.at, LedgerRequest::Submit(envelope));
                (out.append, out.response)
            }
        };
        if let Some(append) = append {
            self.entries.push(append);
        }
        response
    }

    fn build(&mut self) -> (SnapshotMeta<NodeId, Member>, Vec<u8>) {
        self.built += 1;
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id: format!(
                "{}-{}",
                self.last_applied.map_or(0, |l| l.index),
                self.built
            ),
        };
        let body = encode(&Body {
            entries: self.entries.clone(),
        });
        (meta, body)
    }
}

impl<S: Store + 'static> RaftSnapshotBuilder<LedgerRaft> for LedgerState<S> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<LedgerRaft>, StorageError<NodeId>> {
        let (meta, body) = self.lock().build();
        self.save_snapshot(&meta, &body)?;
        self.lock().snapshot = Some((meta.clone(), body.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(body)),
        })
    }
}

impl<S: Store + 'static> RaftStateMachine<LedgerRaft> for LedgerState<S> {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, Member>), StorageError<NodeId>>
    {
        let inner = self.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Answer>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<LedgerRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        Ok(entries.into_iter().map(|e| inner.apply_one(e)).collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Member>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let body_bytes = snapshot.into_inner();
        let body: Body = decode(&body_bytes).map_err(sm_err)?;
        let (key, config) = {
            let inner = self.lock();
            (inner.key.clone(), inner.config)
        };
        // Every envelope verified again before the snapshot replaces anything.
        let machine = replay(&key, config, &body.entries)?;
        self.save_snapshot(meta, &body_bytes)?;
        let mut inner = self.lock();
        inner.machine = machine;
        inner.entries = body.entries;
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.snapshot = Some((meta.clone(), body_bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<LedgerRaft>>, StorageError<NodeId>> {
        Ok(self.lock().snapshot.clone().map(|(meta, body)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(body)),
        }))
    }
}
