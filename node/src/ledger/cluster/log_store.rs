//! Raft's log and vote on the node's sled store (`Tree::RaftLog`, `Tree::RaftMeta`), each
//! write flushed before openraft is told it is durable.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};

use super::{LedgerRaft, NodeId, decode, encode};
use crate::store::{Durability, Store, Tree};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

/// The log store: cloning shares the same database (openraft reads through a clone while it
/// writes through the original).
pub struct LogStore<S> {
    store: Arc<S>,
}

impl<S> Clone for LogStore<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
        }
    }
}

fn read_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::read_logs(&std::io::Error::other(e.to_string())).into()
}

fn write_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_logs(&std::io::Error::other(e.to_string())).into()
}

impl<S: Store + 'static> LogStore<S> {
    /// The log over `store`.
    pub fn new(store: Arc<S>) -> Self {
        Self { store }
    }

    fn meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageError<NodeId>> {
        match self.store.get(Tree::RaftMeta, key).map_err(read_err)? {
            Some(bytes) => Ok(Some(decode(&bytes).map_err(read_err)?)),
            None => Ok(None),
        }
    }

    fn set_meta<T: serde::Serialize>(
        &self,
        key: &[u8],
        value: &T,
    ) -> Result<(), StorageError<NodeId>> {
        self.store
            .put(Tree::RaftMeta, key, &encode(value), Durability::Flush)
            .map_err(write_err)
    }

    fn last_entry(&self) -> Result<Option<Entry<LedgerRaft>>, StorageError<NodeId>> {
        // The log is bounded by purging (a few thousand entries): a scan of the keys is cheap
        // next to a flush.
        let entries = self.store.scan(Tree::RaftLog).map_err(read_err)?;
        match entries.last() {
            Some((_, v)) => Ok(Some(decode(v).map_err(read_err)?)),
            None => Ok(None),
        }
    }

    fn indexes(&self) -> Result<Vec<u64>, StorageError<NodeId>> {
        Ok(self
            .store
            .scan(Tree::RaftLog)
            .map_err(read_err)?
            .iter()
            .filter_map(|(k, _)| k.as_slice().try_into().ok().map(u64::from_be_bytes))
            .collect())
    }
}

impl<S: Store + 'static> RaftLogReader<LedgerRaft> for LogStore<S> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<LedgerRaft>>, StorageError<NodeId>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        let mut index = start;
        while range.contains(&index) {
            match self
                .store
                .get(Tree::RaftLog, &index.to_be_bytes())
                .map_err(read_err)?
            {
                Some(bytes) => out.push(decode(&bytes).map_err(read_err)?),
                None => break,
            }
            index += 1;
        }
        Ok(out)
    }
}

impl<S: Store + 'static> RaftLogStorage<LedgerRaft> for LogStore<S> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<LedgerRaft>, StorageError<NodeId>> {
        let last_purged_log_id: Option<LogId<NodeId>> = self.meta(PURGED)?;
        let last_log_id = self.last_entry()?.map(|e| e.log_id).or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.set_meta(VOTE, vote)
            .map_err(|_| StorageIOError::write_vote(&std::io::Error::other("the store")).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.meta(VOTE)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.set_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.meta::<Option<LogId<NodeId>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<LedgerRaft>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<LedgerRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        for entry in entries {
            self.store
                .put(
                    Tree::RaftLog,
                    &entry.log_id.index.to_be_bytes(),
                    &encode(&entry),
                    Durability::Lazy,
                )
                .map_err(write_err)?;
        }
        // Durable before openraft counts the entries (and before any answer depends on them).
        let flushed = self.store.flush();
        let result = flushed
            .as_ref()
            .map(|_| ())
            .map_err(|e| std::io::Error::other(e.to_string()));
        callback.log_io_completed(result);
        flushed.map_err(write_err)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        for index in self.indexes()?.into_iter().filter(|&i| i >= log_id.index) {
            self.store
                .delete(Tree::RaftLog, &index.to_be_bytes(), Durability::Lazy)
                .map_err(write_err)?;
        }
        self.store.flush().map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        // The purge mark first: a crash between the two leaves entries below it, never a gap.
        self.set_meta(PURGED, &log_id)?;
        for index in self.indexes()?.into_iter().filter(|&i| i <= log_id.index) {
            self.store
                .delete(Tree::RaftLog, &index.to_be_bytes(), Durability::Lazy)
                .map_err(write_err)?;
        }
        self.store.flush().map_err(write_err)
    }
}
