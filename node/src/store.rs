//! The node's durable state, on sled behind a small trait.
//!
//! Trees: node configuration, the host's own offers (as signed), leases and their states, a
//! snapshot of the market view for a fast restart, each lease's run (container, receipts,
//! settlement), receipts, container logs, and a ledger node's operation log. Writes that change a lease
//! (or move money) are flushed to disk before the call returns; sled otherwise syncs every
//! 500 ms, so a crash may lose at most the last half-second of market snapshot, never a
//! lease. An unreadable or corrupt database is an error that names its path, never a panic.

use std::path::{Path, PathBuf};

use bincode::{Decode, Encode};
use gpux_protocol::{ContentId, Timestamp};

/// The named trees of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    /// Node configuration.
    Config,
    /// The host's own signed offers, by offer id.
    OwnOffers,
    /// Leases, by lease id.
    Leases,
    /// The market view (signed offers), by offer id.
    Market,
    /// Each lease's execution and settlement progress, by lease id.
    Runs,
    /// Receipts and their acknowledgements, by lease id and seq.
    Receipts,
    /// Container output received by a renter, by lease id and chunk seq.
    Logs,
    /// A ledger node's log of applied operations, by position.
    LedgerLog,
}

impl Tree {
    fn name(self) -> &'static str {
        match self {
            Tree::Config => "config",
            Tree::OwnOffers => "own-offers",
            Tree::Leases => "leases",
            Tree::Market => "market",
            Tree::Runs => "runs",
            Tree::Receipts => "receipts",
            Tree::Logs => "logs",
            Tree::LedgerLog => "ledger-log",
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
}

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
                open_err("another gpux node is using it (the database is locked)".into())
            }
            sled::Error::Corruption { .. } => open_err(format!(
                "the database is damaged ({e}); move it away to start afresh"
            )),
            other => open_err(other.to_string()),
        })?;
        let store = SledStore { path, db };
        // Open every tree now, so that damage shows here rather than mid-operation.
        for tree in [Tree::Config, Tree::OwnOffers, Tree::Leases, Tree::Market] {
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

    fn after_write(&self, durability: Durability) -> Result<(), StoreError> {
        match durability {
            Durability::Flush => self.flush(),
            Durability::Lazy => Ok(()),
        }
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

/// Which side of a lease this node is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// This node runs the work.
    Host,
    /// This node pays for it.
    Renter,
}

/// A lease's life, as in the design: every transition is stored (flushed) before it is acted
/// on, so a restarted node resumes or cleans up each lease.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum LeaseState {
    /// The renter sent the request.
    Requested,
    /// The host signed `LeaseAccept`.
    Accepted,
    /// The container is being created.
    Starting,
    /// The workload runs.
    Running,
    /// The container is being stopped.
    Stopping,
    /// The lease is over.
    Ended {
        /// Why (the `EndReason` name).
        reason: String,
    },
    /// The escrow is settled.
    Settled,
}

/// One lease as the node keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct LeaseRecord {
    /// The lease id (the `LeaseRequest` envelope id).
    pub lease: [u8; 32],
    /// This node's side.
    pub role: Role,
    /// The signed `LeaseRequest`, exactly as received or sent.
    pub request: Vec<u8>,
    /// The signed `LeaseAccept`, once there is one.
    pub accept: Option<Vec<u8>>,
    /// Where the lease is.
    pub state: LeaseState,
    /// When the state last changed (unix ms).
    pub updated_at: u64,
}

/// A lease's execution and settlement progress, on either side. Saved (flushed) before each
/// step is acted on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode, serde::Serialize)]
pub struct RunRecord {
    /// The lease id.
    #[serde(serialize_with = "serialize_hex")]
    pub lease: [u8; 32],
    /// Host: the container's id.
    pub container: Option<String>,
    /// Host: the container's start, from Docker (unix ms). Renter: when it asked the host to
    /// start, an upper bound on the time the work can have run.
    pub started_at: Option<u64>,
    /// Host: the container's end, from Docker (unix ms).
    pub finished_at: Option<u64>,
    /// The workload's exit code.
    pub exit_code: Option<i64>,
    /// Why the lease ended, once it has.
    pub end_reason: Option<String>,
    /// Host: the last receipt seq signed. Renter: the last receipt seq seen.
    pub last_seq: u64,
    /// The last acknowledged receipt's seq and cumulative amount (micro-credits).
    pub acked_seq: u64,
    /// See `acked_seq`.
    pub acked_amount: u64,
    /// The last acknowledged receipt and its acknowledgement (envelopes), for redemption.
    #[serde(skip)]
    pub last_ack: Option<(Vec<u8>, Vec<u8>)>,
    /// The last receipt seq redeemed at the ledger and the cumulative amount paid.
    pub redeemed_seq: u64,
    /// See `redeemed_seq`.
    pub redeemed: u64,
    /// Whether the escrow's remainder went back to the renter (the lease is settled).
    pub released: bool,
    /// Renter: when the host was last heard from (unix ms).
    pub last_contact: u64,
    /// Bytes of container output sent (host) or received (renter).
    pub log_bytes: u64,
    /// Log chunks sent (host) or received (renter).
    pub log_chunks: u64,
    /// Host: where the next read of the container's output starts (JSON).
    #[serde(skip)]
    pub log_cursor: Option<String>,
    /// Renter: when it asked the host to stop the lease (unix ms); receipts billing much
    /// past it are disputed.
    pub stop_requested_at: Option<u64>,
    /// Renter: the receipt interval and acknowledgement grace the host announced in its
    /// acceptance (ms), which the renter's watchdog uses.
    pub host_timing: Option<(u64, u64)>,
}

fn serialize_hex<S: serde::Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&gpux_protocol::hex(bytes))
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
    fn put_record<T: Encode>(&self, tree: Tree, key: &[u8], value: &T) -> Result<(), StoreError> {
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

    /// Every versioned record of a tree, in key order.
    fn records<T: Decode<()>>(&self, tree: Tree) -> Result<Vec<T>, StoreError> {
        self.values(tree)?
            .iter()
            .map(|v| self.decode(tree, v))
            .collect()
    }

    /// Stores a lease record, flushed to disk before returning.
    pub fn save_lease(&self, record: &LeaseRecord) -> Result<(), StoreError> {
        self.put_record(Tree::Leases, &record.lease, record)
    }

    /// One lease.
    pub fn lease(&self, lease: &ContentId) -> Result<Option<LeaseRecord>, StoreError> {
        self.record(Tree::Leases, &lease.0)
    }

    /// Every lease.
    pub fn leases(&self) -> Result<Vec<LeaseRecord>, StoreError> {
        self.records(Tree::Leases)
    }

    /// Moves a lease to `state` at `now`, flushed.
    pub fn set_lease_state(
        &self,
        lease: &ContentId,
        state: LeaseState,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let Some(mut record) = self.lease(lease)? else {
            return Ok(false);
        };
        record.state = state;
        record.updated_at = now.0;
        self.save_lease(&record)?;
        Ok(true)
    }

    /// Stores a lease's run record, flushed.
    pub fn save_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.put_record(Tree::Runs, &run.lease, run)
    }

    /// A lease's run record.
    pub fn run(&self, lease: &ContentId) -> Result<Option<RunRecord>, StoreError> {
        self.record(Tree::Runs, &lease.0)
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

impl NodeState<SledStore> {
    /// Opens the node's database in `<data_dir>/db`.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join("db");
        let store = SledStore::open(&path)?;
        Ok(Self::new(store, path))
    }
}
