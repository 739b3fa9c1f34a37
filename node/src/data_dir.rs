//! The one node that runs on a data directory, and the files it writes there privately.

use std::path::Path;

/// The file a running node holds an exclusive `flock` on, in its data directory.
pub const NODE_LOCK_FILE: &str = "node.lock";

/// A data directory claimed by this process (released when dropped, or when the process
/// ends, however it ends: the kernel drops the lock with the last descriptor).
#[derive(Debug)]
pub struct NodeLock {
    _file: std::fs::File,
}

/// Claims `dir` for this node: a second node on the same data directory would share its
/// store, keys and leases.
pub fn claim_data_dir(dir: &Path) -> anyhow::Result<NodeLock> {
    use anyhow::Context;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(NODE_LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(NodeLock { _file: file }),
        Err(rustix::io::Errno::WOULDBLOCK) => anyhow::bail!(
            "another node runs on {} (it holds {NODE_LOCK_FILE}); stop it first (`gpux node stop`)",
            dir.display()
        ),
        Err(e) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// Whether a node runs on `dir` now (holds its lock).
pub fn node_runs_on(dir: &Path) -> std::io::Result<bool> {
    let file = match std::fs::File::open(dir.join(NODE_LOCK_FILE)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared) {
        // Taken: nobody holds it (and it is let go with `file`).
        Ok(()) => Ok(false),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Writes `bytes` to `path` with mode 0600 (replacing it).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_node_claims_a_data_dir_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!node_runs_on(dir.path()).unwrap());
        let lock = claim_data_dir(dir.path()).unwrap();
        assert!(node_runs_on(dir.path()).unwrap());
        let second = claim_data_dir(dir.path()).unwrap_err().to_string();
        assert!(second.contains("another node runs on"), "{second}");
        drop(lock);
        assert!(!node_runs_on(dir.path()).unwrap());
        let _again = claim_data_dir(dir.path()).unwrap();
    }
}
