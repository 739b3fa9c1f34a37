//! An in-memory [`Store`] for tests: the same trees, nothing on disk.

use std::path::PathBuf;

use super::{Durability, Entries, NodeState, Store, StoreError, Tree};

/// The trees of a [`MemStore`].
type MemTrees =
    std::collections::BTreeMap<&'static str, std::collections::BTreeMap<Vec<u8>, Vec<u8>>>;

/// An in-memory store for tests: the same trees, nothing on disk.
#[derive(Debug, Clone, Default)]
pub struct MemStore {
    trees: std::sync::Arc<std::sync::Mutex<MemTrees>>,
}

impl MemStore {
    fn with<T>(&self, f: impl FnOnce(&mut MemTrees) -> T) -> T {
        // A poisoned lock only means another test thread panicked mid-write; the maps are
        // still whole (every operation is one insert or remove).
        let mut guard = self
            .trees
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }
}

impl Store for MemStore {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.with(|t| t.get(tree.name()).and_then(|m| m.get(key).cloned())))
    }

    fn put(&self, tree: Tree, key: &[u8], value: &[u8], _: Durability) -> Result<(), StoreError> {
        self.with(|t| {
            t.entry(tree.name())
                .or_default()
                .insert(key.to_vec(), value.to_vec())
        });
        Ok(())
    }

    fn delete(&self, tree: Tree, key: &[u8], _: Durability) -> Result<(), StoreError> {
        self.with(|t| t.entry(tree.name()).or_default().remove(key));
        Ok(())
    }

    fn scan(&self, tree: Tree) -> Result<Entries, StoreError> {
        Ok(self.with(|t| {
            t.get(tree.name())
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default()
        }))
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl NodeState<MemStore> {
    /// A node state in memory (tests).
    pub fn in_memory() -> Self {
        Self::new(MemStore::default(), PathBuf::from("(memory)"))
    }
}
