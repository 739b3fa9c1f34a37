//! `gpux ledger restore`: a damaged ledger database rebuilt from the ledger's copy of its log.

use std::path::{Path, PathBuf};

use gpux_lease::LedgerMachine;
use gpux_market::LedgerConfig;
use gpux_protocol::Keypair;

use super::copy::{CopyContents, Tail};
use super::manifest::Manifest;
use super::{LEDGER_MANIFEST, copy_path};
use crate::store::write_atomic;
use crate::store::{Durability, MANIFEST_FILE, NodeState, SledStore, Store, StoreError, Tree};

/// Why a restore did not happen. Nothing is changed when one of these comes back, except
/// as [`RestoreError::Write`] says.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreError {
    /// The copy could not be read.
    #[error("cannot read the ledger's copy {path}: {reason}", path = .path.display())]
    Read {
        /// The copy.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The copy is damaged itself, or holds less than the manifest says was applied.
    #[error("the ledger's copy {path} cannot restore the ledger: {reason}", path = .path.display())]
    BadCopy {
        /// The copy.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The database is in use (the node runs): stop it first.
    #[error("{0}; stop the node before restoring its ledger")]
    InUse(StoreError),
    /// Writing the new database failed; the damaged one is kept where the message says.
    #[error("restoring the ledger failed: {0}")]
    Write(String),
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Log entries restored (and verified by replay).
    pub entries: u64,
    /// Where the damaged database went.
    pub moved_aside: Option<PathBuf>,
    /// The other trees (this node's own leases, its market view) copied over from the
    /// damaged database, when it could still be read.
    pub other_records: Option<usize>,
    /// Accounts in the restored ledger.
    pub accounts: usize,
}

/// Rebuilds the ledger database in `data_dir` from its copy (or from `from`): the copy is
/// verified frame by frame, must reach the entries the manifest says were applied, and is
/// replayed (every envelope's signature checked) before anything is touched; then the
/// damaged database is moved aside to `db.damaged-<time>`, a new one is written and
/// flushed with the log, and the manifest is rewritten over it. The node must be stopped.
pub fn restore(
    data_dir: &Path,
    from: Option<&Path>,
    key: &Keypair,
    config: LedgerConfig,
) -> Result<Restored, RestoreError> {
    let copy = from
        .map(Path::to_path_buf)
        .unwrap_or_else(|| copy_path(data_dir));
    let bad = |reason: String| RestoreError::BadCopy {
        path: copy.clone(),
        reason,
    };
    let contents = CopyContents::read(&copy).map_err(|e| RestoreError::Read {
        path: copy.clone(),
        reason: e.to_string(),
    })?;
    if let Some(Tail::Damaged(offset)) = contents.tail {
        return Err(bad(format!(
            "it is damaged at byte {offset} (the {} entries before it verify)",
            contents.entries.len()
        )));
    }
    if contents.entries.is_empty() {
        return Err(bad("it holds no entries".into()));
    }
    // The manifest says what was applied: the copy must hold all of it, unchanged.
    let manifest_path = data_dir.join(LEDGER_MANIFEST);
    if let Some(recorded) = std::fs::read_to_string(&manifest_path)
        .ok()
        .and_then(|t| Manifest::parse(&t))
    {
        let mut chain = Manifest::default();
        for (at, entry) in contents.entries.iter().take(recorded.count as usize) {
            chain = chain.next(*at, entry);
        }
        if chain.count < recorded.count {
            return Err(bad(format!(
                "it holds {} entries but {} says {} were applied",
                chain.count,
                manifest_path.display(),
                recorded.count
            )));
        }
        if chain.chain != recorded.chain {
            return Err(bad(format!(
                "its first {} entries do not match {}",
                recorded.count,
                manifest_path.display()
            )));
        }
    } else {
        tracing::warn!(
            "{} is missing or unreadable: restoring everything the copy holds",
            manifest_path.display()
        );
    }
    let machine = LedgerMachine::replay(
        key.clone(),
        config,
        contents.entries.iter().map(|(at, e)| (*at, e.as_slice())),
    )
    .map_err(|e| bad(format!("it does not replay: {e}")))?;

    let db = data_dir.join("db");
    let write = |what: &str, e: &dyn std::fmt::Display| RestoreError::Write(format!("{what}: {e}"));
    // The other trees of the damaged database, when it still opens and reads.
    let (moved_aside, others) = if db.exists() {
        let others = match SledStore::open(&db) {
            Ok(old) => read_others(&old).ok(),
            Err(e @ StoreError::Locked { .. }) => {
                return Err(RestoreError::InUse(e));
            }
            Err(_) => None,
        };
        let stamp = crate::attest::now().0;
        let aside = data_dir.join(format!("db.damaged-{stamp}"));
        std::fs::rename(&db, &aside).map_err(|e| write("moving the damaged database aside", &e))?;
        (Some(aside), others)
    } else {
        (None, None)
    };
    // A fresh database: the manifest that says one existed goes, the new one writes it again.
    match std::fs::remove_file(data_dir.join(MANIFEST_FILE)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(write("removing the old database manifest", &e)),
    }
    let state = NodeState::open(data_dir).map_err(|e| write("creating the new database", &e))?;
    let store = state.store();
    let mut other_records = None;
    if let Some(others) = &others {
        for (tree, k, v) in others {
            store
                .put(*tree, k, v, Durability::Lazy)
                .map_err(|e| write("copying the node's other records", &e))?;
        }
        other_records = Some(others.len());
    }
    for (at, entry) in &contents.entries {
        store
            .put(Tree::LedgerLog, &at.to_be_bytes(), entry, Durability::Lazy)
            .map_err(|e| write("writing the log", &e))?;
    }
    store.flush().map_err(|e| write("flushing the log", &e))?;
    write_atomic(&manifest_path, &contents.manifest.text())
        .map_err(|e| write("writing the manifest", &e))?;
    Ok(Restored {
        entries: contents.entries.len() as u64,
        moved_aside,
        other_records,
        accounts: machine.ledger().accounts().count(),
    })
}

/// Records of a database, each with its tree.
type Records = Vec<(Tree, Vec<u8>, Vec<u8>)>;

/// Every record of the trees other than the ledger's log (and the sentinel, which the new
/// database writes itself).
fn read_others(old: &SledStore) -> Result<Records, StoreError> {
    let mut out = Vec::new();
    for tree in Tree::ALL.into_iter().filter(|t| *t != Tree::LedgerLog) {
        for (k, v) in old.scan(tree)? {
            // The new database writes its own sentinel and counts its own writes.
            if tree == Tree::Config
                && (k == crate::store::SENTINEL_KEY.as_bytes()
                    || k == crate::store::WRITES_KEY.as_bytes())
            {
                continue;
            }
            out.push((tree, k, v));
        }
    }
    Ok(out)
}
