//! The node's durable state, on sled behind a small trait.
//!
//! Trees: node configuration, the host's own offers (as signed), the host's and the renter's
//! records of their leases (the lease machines' state, `gpux_lease::HostRecord` and
//! `RenterRecord`), a snapshot of the market view for a fast restart, receipts, container
//! logs, and a ledger node's operation log. Writes that change a lease
//! (or move money) are flushed to disk before the call returns; sled otherwise syncs every
//! 500 ms, so a crash may lose at most the last half-second of market snapshot, never a
//! lease. An unreadable or corrupt database is an error that names its path, never a panic.

use std::path::{Path, PathBuf};

use bincode::{Decode, Encode};
use gpux_lease::{HostRecord, RenterRecord};
use gpux_protocol::ContentId;

/// The named trees of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    /// Node configuration.
    Config,
    /// The host's own signed offers, by offer id.
    OwnOffers,
    /// The host's side of its leases ([`HostRecord`]), by lease id.
    HostLeases,
    /// The renter's side of its leases ([`RenterRecord`]), by lease id.
    RenterLeases,
    /// The market view (signed offers), by offer id.
    Market,
    /// Receipts and their acknowledgements, by lease id and seq.
    Receipts,
    /// Container output received by a renter, by lease id and chunk seq.
    Logs,
    /// A ledger node's log of applied operations, by position.
    LedgerLog,
    /// Spot leases that resume after a preemption ([`ResumeRecord`]), by lease id.
    Resumes,
    /// Group orders ([`GroupRecord`]), by group id.
    Groups,
    /// A replicated ledger member's raft log, by index.
    RaftLog,
    /// A replicated ledger member's raft state: its node id, vote, commit, snapshot.
    RaftMeta,
    /// This node's standing bids, with what each runs when filled, by bid id.
    Bids,
}

impl Tree {
    /// Every tree.
    pub const ALL: [Tree; 13] = [
        Tree::Config,
        Tree::OwnOffers,
        Tree::HostLeases,
        Tree::RenterLeases,
        Tree::Market,
        Tree::Receipts,
        Tree::Logs,
        Tree::LedgerLog,
        Tree::Resumes,
        Tree::Groups,
        Tree::RaftLog,
        Tree::RaftMeta,
        Tree::Bids,
    ];

    fn name(self) -> &'static str {
        match self {
            Tree::Config => "config",
            Tree::OwnOffers => "own-offers",
            Tree::HostLeases => "host-leases",
            Tree::RenterLeases => "renter-leases",
            Tree::Market => "market",
            Tree::Receipts => "receipts",
            Tree::Logs => "logs",
            Tree::LedgerLog => "ledger-log",
            Tree::Resumes => "resumes",
            Tree::Groups => "groups",
            Tree::RaftLog => "raft-log",
            Tree::RaftMeta => "raft-meta",
            Tree::Bids => "bids",
        }
    }
}

/// Whether a write must reach the disk before the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Flush before returning (lease changes, money).
    Flush,
    /// Let the background sync write it (market snapshot).
    Lazy,
}

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be opened.
    #[error("cannot open the node database at {path}: {reason}", path = .path.display())]
    Open {
        /// The database directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Another process has the database open (a node runs on this data dir).
    #[error("cannot open the node database at {path}: another gpux node is using it (the database is locked)", path = .path.display())]
    Locked {
        /// The database directory.
        path: PathBuf,
    },
    /// A read or write failed.
    #[error("node database at {path}: {reason}", path = .path.display())]
    Io {
        /// The database directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A stored record does not decode (written by an incompatible version, or damaged).
    #[error("node database at {path}: a record in '{tree}' is unreadable: {reason}", path = .path.display())]
    Corrupt {
        /// The database directory.
        path: PathBuf,
        /// The tree.
        tree: &'static str,
        /// Why.
        reason: String,
    },
}

/// A tree's entries: (key, value) in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Key-value storage in named trees. The node uses [`SledStore`]; the trait keeps sled out of
/// everything else.
pub trait Store: Send + Sync {
    /// The value at `key`.
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Sets `key`.
    fn put(
        &self,
        tree: Tree,
        key: &[u8],
        value: &[u8],
        durability: Durability,
    ) -> Result<(), StoreError>;
    /// Removes `key`.
    fn delete(&self, tree: Tree, key: &[u8], durability: Durability) -> Result<(), StoreError>;
    /// Every entry of a tree, in key order.
    fn scan(&self, tree: Tree) -> Result<Entries, StoreError>;
    /// Writes everything to disk.
    fn flush(&self) -> Result<(), StoreError>;
    /// The entries whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Entries, StoreError> {
        Ok(self
            .scan(tree)?
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect())
    }
}

/// A key of a lease id followed by a big-endian sequence number (sorts by seq).
fn seq_key(lease: &ContentId, seq: u64) -> Vec<u8> {
    let mut key = lease.0.to_vec();
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// The sled store, in `<data-dir>/db`. Cloning shares the same open database.
#[derive(Clone)]
pub struct SledStore {
    path: PathBuf,
    db: sled::Db,
    /// Flushed writes counted, with the manifest that records them (set by
    /// [`NodeState::open`]; a store opened alone counts nothing).
    writes: std::sync::Arc<std::sync::Mutex<Option<WriteCount>>>,
}

/// How many flushed writes a database has had, and the manifest file that says so.
#[derive(Debug)]
struct WriteCount {
    count: u64,
    manifest: PathBuf,
}

/// The record inside the database that counts its flushed writes.
pub(crate) const WRITES_KEY: &str = "db-writes";

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .finish()
    }
}

fn describe_panic(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "the database library panicked".into())
}

impl SledStore {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        let path = dir.to_path_buf();
        let open_err = |reason: String| StoreError::Open {
            path: path.clone(),
            reason,
        };
        let config = sled::Config::new().path(&path).flush_every_ms(Some(500));
        // sled 0.34 may panic on some damaged files instead of returning an error; a damaged
        // database must be an error that names the path, so the panic is caught here.
        // The config is not used again after a panic, so observing it half-updated is impossible.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || config.open()))
            .map_err(|p| open_err(describe_panic(p)))?;
        let db = opened.map_err(|e| match e {
            // sled wraps the lock failure in an error of its own kind; its text says what it is.
            sled::Error::Io(io)
                if io.kind() == std::io::ErrorKind::WouldBlock
                    || io.to_string().contains("could not acquire lock") =>
            {
                StoreError::Locked { path: path.clone() }
            }
            sled::Error::Corruption { .. } => open_err(format!(
                "the database is damaged ({e}); move it away to start afresh"
            )),
            other => open_err(other.to_string()),
        })?;
        let store = SledStore {
            path,
            db,
            writes: Default::default(),
        };
        // Open every tree now, so that damage shows here rather than mid-operation.
        for tree in [
            Tree::Config,
            Tree::OwnOffers,
            Tree::HostLeases,
            Tree::RenterLeases,
            Tree::Market,
        ] {
            store.tree(tree)?;
        }
        Ok(store)
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: sled::Error) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    fn tree(&self, tree: Tree) -> Result<sled::Tree, StoreError> {
        self.db.open_tree(tree.name()).map_err(|e| self.io(e))
    }

    /// A flushed write is counted: the count goes into the database with the flush, then
    /// into the manifest (synced), so the manifest may lag the database after a crash but
    /// never lead it. A database found behind its manifest lost flushed writes.
    fn after_write(&self, durability: Durability) -> Result<(), StoreError> {
        if durability == Durability::Lazy {
            return Ok(());
        }
        let mut writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(w) = writes.as_mut() else {
            return self.flush();
        };
        let next = w.count + 1;
        self.tree(Tree::Config)?
            .insert(WRITES_KEY, &next.to_be_bytes())
            .map_err(|e| self.io(e))?;
        self.flush()?;
        w.count = next;
        write_manifest(&w.manifest, next).map_err(|e| StoreError::Io {
            path: w.manifest.clone(),
            reason: e.to_string(),
        })
    }
}

impl Store for SledStore {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .tree(tree)?
            .get(key)
            .map_err(|e| self.io(e))?
            .map(|v| v.to_vec()))
    }

    fn put(
        &self,
        tree: Tree,
        key: &[u8],
        value: &[u8],
        durability: Durability,
    ) -> Result<(), StoreError> {
        self.tree(tree)?
            .insert(key, value)
            .map_err(|e| self.io(e))?;
        self.after_write(durability)
    }

    fn delete(&self, tree: Tree, key: &[u8], durability: Durability) -> Result<(), StoreError> {
        self.tree(tree)?.remove(key).map_err(|e| self.io(e))?;
        self.after_write(durability)
    }

    fn scan(&self, tree: Tree) -> Result<Entries, StoreError> {
        self.tree(tree)?
            .iter()
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| self.io(e))
            })
            .collect()
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(drop).map_err(|e| self.io(e))
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Entries, StoreError> {
        self.tree(tree)?
            .scan_prefix(prefix)
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| self.io(e))
            })
            .collect()
    }
}

/// A spot lease rented with `--resume`, and where its chain of leases stands.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct ResumeRecord {
    /// The rent as asked (`gpux_api::RentRequest`, JSON): every hop rents the same.
    pub request: Vec<u8>,
    /// How many times the work moved before this lease (0: the first).
    pub hop: u32,
    /// The lease this one resumed, when it did.
    pub resumed_from: Option<ContentId>,
    /// The lease that resumed this one, once rented.
    pub resumed_by: Option<ContentId>,
    /// Where it stands.
    pub status: ResumeStatus,
    /// The workspace moved into this lease before it started (a resumed lease).
    pub moved: Option<Moved>,
}

/// A workspace moved from a preempted lease into the one that resumed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct Moved {
    /// Files in what moved.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes fetched from the preempted workspace (only what changed since the last move).
    pub fetched: u64,
    /// Bytes sent into the new one.
    pub sent: u64,
    /// When the move was done (and the lease then committed), unix ms.
    pub done_at_ms: u64,
}

/// A group order: what it rents, and its leases (a scale adds and removes them).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct GroupRecord {
    /// The rent as asked (`gpux_api::RentRequest`, JSON).
    pub request: Vec<u8>,
    /// Its leases, in the order they were placed.
    pub members: Vec<ContentId>,
}

/// Where a resumable lease stands.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum ResumeStatus {
    /// Running (or over without a preemption): it resumes if preempted.
    Watching,
    /// Preempted: its checkpoint is being fetched and the work rented again.
    Resuming,
    /// Resumed as the next lease (`resumed_by`).
    Resumed,
    /// The resume gave up (why).
    Failed(String),
}

/// The first byte of every stored record: its format version.
const RECORD_VERSION: u8 = 1;

/// The node's state over a [`Store`]: typed, versioned records.
#[derive(Debug, Clone)]
pub struct NodeState<S> {
    store: S,
    path: PathBuf,
}

fn encode_record<T: Encode>(value: &T) -> Vec<u8> {
    let mut bytes = vec![RECORD_VERSION];
    // Encoding into a Vec cannot fail for these plain types.
    bytes.extend(bincode::encode_to_vec(value, bincode::config::standard()).unwrap_or_default());
    bytes
}

impl<S: Store> NodeState<S> {
    /// Wraps a store; `path` is what errors name.
    pub fn new(store: S, path: PathBuf) -> Self {
        Self { store, path }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The database's path (what errors name).
    pub fn db_path(&self) -> &Path {
        &self.path
    }

    fn decode<T: Decode<()>>(&self, tree: Tree, bytes: &[u8]) -> Result<T, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            path: self.path.clone(),
            tree: tree.name(),
            reason,
        };
        match bytes.split_first() {
            Some((&RECORD_VERSION, rest)) => {
                let (value, used) = bincode::decode_from_slice(
                    rest,
                    bincode::config::standard().with_limit::<{ 1 << 20 }>(),
                )
                .map_err(|e| corrupt(e.to_string()))?;
                if used != rest.len() {
                    return Err(corrupt("trailing bytes".into()));
                }
                Ok(value)
            }
            Some((v, _)) => Err(corrupt(format!(
                "record format {v} is not supported by this version of gpux"
            ))),
            None => Err(corrupt("empty record".into())),
        }
    }

    /// A versioned record, flushed to disk before returning.
    pub(crate) fn put_record<T: Encode>(
        &self,
        tree: Tree,
        key: &[u8],
        value: &T,
    ) -> Result<(), StoreError> {
        self.store
            .put(tree, key, &encode_record(value), Durability::Flush)
    }

    /// One versioned record.
    fn record<T: Decode<()>>(&self, tree: Tree, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.store.get(tree, key)? {
            Some(bytes) => self.decode(tree, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Stores the host's record of a lease, flushed to disk before returning.
    pub fn save_host_lease(
        &self,
        lease: &ContentId,
        record: &HostRecord,
    ) -> Result<(), StoreError> {
        self.put_record(Tree::HostLeases, &lease.0, record)
    }

    /// The host's record of one lease.
    pub fn host_lease(&self, lease: &ContentId) -> Result<Option<HostRecord>, StoreError> {
        self.record(Tree::HostLeases, &lease.0)
    }

    /// Every lease this node hosts.
    pub fn host_leases(&self) -> Result<Vec<(ContentId, HostRecord)>, StoreError> {
        self.keyed_records(Tree::HostLeases)
    }

    /// Stores the renter's record of a lease, flushed to disk before returning.
    pub fn save_renter_lease(
        &self,
        lease: &ContentId,
        record: &RenterRecord,
    ) -> Result<(), StoreError> {
        self.put_record(Tree::RenterLeases, &lease.0, record)
    }

    /// The renter's record of one lease.
    pub fn renter_lease(&self, lease: &ContentId) -> Result<Option<RenterRecord>, StoreError> {
        self.record(Tree::RenterLeases, &lease.0)
    }

    /// Every lease this node rents.
    pub fn renter_leases(&self) -> Result<Vec<(ContentId, RenterRecord)>, StoreError> {
        self.keyed_records(Tree::RenterLeases)
    }

    /// Stores a resumable lease's record (flushed).
    pub fn save_resume(&self, lease: &ContentId, record: &ResumeRecord) -> Result<(), StoreError> {
        self.put_record(Tree::Resumes, &lease.0, record)
    }

    /// A resumable lease's record.
    pub fn resume(&self, lease: &ContentId) -> Result<Option<ResumeRecord>, StoreError> {
        self.record(Tree::Resumes, &lease.0)
    }

    /// Every resumable lease.
    pub fn resumes(&self) -> Result<Vec<(ContentId, ResumeRecord)>, StoreError> {
        self.keyed_records(Tree::Resumes)
    }

    /// Stores a group order's record (flushed).
    pub fn save_group(&self, group: &[u8; 16], record: &GroupRecord) -> Result<(), StoreError> {
        self.put_record(Tree::Groups, group, record)
    }

    /// A group order's record.
    pub fn group(&self, group: &[u8; 16]) -> Result<Option<GroupRecord>, StoreError> {
        self.record(Tree::Groups, group)
    }

    /// Every versioned record of a tree keyed by lease id, in key order.
    pub(crate) fn keyed_records<T: Decode<()>>(
        &self,
        tree: Tree,
    ) -> Result<Vec<(ContentId, T)>, StoreError> {
        self.store
            .scan(tree)?
            .into_iter()
            .map(|(k, v)| {
                let id = <[u8; 32]>::try_from(k.as_slice()).map_err(|_| StoreError::Corrupt {
                    path: self.path.clone(),
                    tree: tree.name(),
                    reason: "a key is not a lease id".into(),
                })?;
                Ok((ContentId(id), self.decode(tree, &v)?))
            })
            .collect()
    }

    /// Stores a receipt (and its acknowledgement, once there is one), flushed.
    pub fn save_receipt(
        &self,
        lease: &ContentId,
        seq: u64,
        receipt: &[u8],
        ack: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        self.put_record(
            Tree::Receipts,
            &seq_key(lease, seq),
            &(receipt.to_vec(), ack.map(<[u8]>::to_vec)),
        )
    }

    /// A lease's receipts in seq order: (receipt, acknowledgement) envelopes.
    #[allow(clippy::type_complexity)]
    pub fn receipts(
        &self,
        lease: &ContentId,
    ) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>, StoreError> {
        self.store
            .scan_prefix(Tree::Receipts, &lease.0)?
            .iter()
            .map(|(_, v)| self.decode(Tree::Receipts, v))
            .collect()
    }

    /// Appends a chunk of container output (lazily written: logs are not money).
    pub fn append_log(&self, lease: &ContentId, seq: u64, data: &[u8]) -> Result<(), StoreError> {
        self.store
            .put(Tree::Logs, &seq_key(lease, seq), data, Durability::Lazy)
    }

    /// A lease's log chunks from chunk `from` on: (seq, data).
    pub fn logs(&self, lease: &ContentId, from: u64) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        Ok(self
            .store
            .scan_prefix(Tree::Logs, &lease.0)?
            .into_iter()
            .filter_map(|(k, v)| {
                let seq = u64::from_be_bytes(k.get(32..40)?.try_into().ok()?);
                (seq >= from).then_some((seq, v))
            })
            .collect())
    }

    /// The values of a tree, in key order.
    fn values(&self, tree: Tree) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self.store.scan(tree)?.into_iter().map(|(_, v)| v).collect())
    }

    /// Stores one of the host's own signed offers (flushed: offers are promises).
    pub fn save_own_offer(&self, id: &ContentId, envelope: &[u8]) -> Result<(), StoreError> {
        self.store
            .put(Tree::OwnOffers, &id.0, envelope, Durability::Flush)
    }

    /// Forgets one of the host's own offers.
    pub fn remove_own_offer(&self, id: &ContentId) -> Result<(), StoreError> {
        self.store.delete(Tree::OwnOffers, &id.0, Durability::Flush)
    }

    /// The host's own signed offers.
    pub fn own_offers(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        self.values(Tree::OwnOffers)
    }

    /// Adds an offer to the market snapshot (not flushed: it is a cache).
    pub fn snapshot_offer(&self, id: &ContentId, envelope: &[u8]) -> Result<(), StoreError> {
        self.store
            .put(Tree::Market, &id.0, envelope, Durability::Lazy)
    }

    /// Removes an offer from the market snapshot.
    pub fn forget_offer(&self, id: &ContentId) -> Result<(), StoreError> {
        self.store.delete(Tree::Market, &id.0, Durability::Lazy)
    }

    /// The market snapshot: signed offers, to be verified again on load.
    pub fn market_snapshot(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        self.values(Tree::Market)
    }

    /// A configuration value.
    pub fn config(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.get(Tree::Config, key.as_bytes())
    }

    /// Sets a configuration value (flushed).
    pub fn set_config(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.store
            .put(Tree::Config, key.as_bytes(), value, Durability::Flush)
    }
}

/// The file beside the database that says this node has one (`<data-dir>/db.manifest`).
pub const MANIFEST_FILE: &str = "db.manifest";
/// The record inside the database that must be there when the manifest is.
pub(crate) const SENTINEL_KEY: &str = "db-created";

impl NodeState<SledStore> {
    /// Opens the node's database in `<data_dir>/db`.
    ///
    /// A database that should be there and is not is an error, never an empty start: the
    /// first open writes a sentinel record (flushed) and then the manifest file beside the
    /// database (synced); every later open refuses a database that lacks the sentinel while
    /// the manifest exists (deleted, replaced, or so damaged that sled opened it as empty),
    /// naming the path and the way out. Every flushed write is counted, in the database and
    /// then in the manifest, so a database *behind* its manifest (an older copy, or one that
    /// lost writes it had made durable) is refused too; one ahead of it (a crash between the
    /// two) is fine.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join("db");
        let manifest = data_dir.join(MANIFEST_FILE);
        let recorded = match std::fs::read_to_string(&manifest) {
            Ok(text) => Some(manifest_writes(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(StoreError::Io {
                    path: manifest,
                    reason: e.to_string(),
                });
            }
        };
        let store = SledStore::open(&path)?;
        let state = Self::new(store, path.clone());
        let sentinel = state.config(SENTINEL_KEY)?;
        let restore_hint = format!(
            "Restore the database from a copy (a ledger node: `gpux ledger restore` rebuilds it \
             from the ledger's copy of its log); only if its contents are truly gone, move {} \
             away to start afresh",
            manifest.display()
        );
        match (recorded, sentinel.is_some()) {
            (Some(_), false) => {
                return Err(StoreError::Open {
                    path,
                    reason: format!(
                        "the database is missing or came back empty, but this node had one ({} says so): \
                         its balances and leases would be lost. {restore_hint}",
                        manifest.display(),
                    ),
                });
            }
            (_, false) => {
                state.set_config(SENTINEL_KEY, crate::attest::now().0.to_string().as_bytes())?;
            }
            _ => {}
        }
        let count = state
            .config(WRITES_KEY)?
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, u64::from_be_bytes);
        if let Some(recorded) = recorded
            && count < recorded
        {
            return Err(StoreError::Open {
                path,
                reason: format!(
                    "the database has had {count} flushed writes but {} says {recorded}: it is an \
                     older copy or lost writes it had made durable, and leases or money would be \
                     lost. {restore_hint}",
                    manifest.display()
                ),
            });
        }
        write_manifest(&manifest, count).map_err(|e| StoreError::Io {
            path: manifest.clone(),
            reason: e.to_string(),
        })?;
        *state.store.writes.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(WriteCount { count, manifest });
        Ok(state)
    }
}

/// The flushed writes a manifest records (0 for one written before they were counted).
fn manifest_writes(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("writes "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Writes the manifest: how many flushed writes the database has had.
fn write_manifest(path: &Path, writes: u64) -> std::io::Result<()> {
    write_atomic(
        path,
        &format!(
            "gpux database manifest: this data dir holds a database in db/\nwrites {writes}\n"
        ),
    )
}

/// Writes a small file atomically: a temporary file, synced, renamed over `path`, and the
/// directory synced, so a crash leaves the old file or the new one, never a torn one.
pub(crate) fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
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

mod mem;
pub use mem::MemStore;
