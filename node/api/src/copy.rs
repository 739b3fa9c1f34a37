//! `gpux cp` through the node (`GET /v1/leases/{lease}/copy?request=...`, a WebSocket): the
//! CLI sends a [`CopyOrder`], the node copies between its own filesystem and the lease's
//! workspace and answers with [`CopyEvent`]s, the last a [`CopyReport`] or the failure.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What the CLI asks its node to copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyOrder {
    /// Into the workspace (`true`) or out of it.
    pub upload: bool,
    /// The local file or directory, an absolute path.
    pub local: PathBuf,
    /// The path under `/workspace`.
    pub remote: String,
    /// Into the remote directory (`LEASE:/workspace/dir/`), for an upload.
    pub into: bool,
}

/// What the node tells the CLI while it copies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyEvent {
    /// The total bytes to copy, and how many are done.
    Progress {
        /// All the files' bytes.
        total: u64,
        /// Done so far (sent, or found in place).
        done: u64,
    },
    /// The copy is done.
    Done(CopyReport),
    /// The copy failed; run it again to go on where it stopped.
    Failed(String),
}

/// What a copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyReport {
    /// Files copied (or found already there, unchanged).
    pub files: u64,
    /// Directories made.
    pub dirs: u64,
    /// The files' bytes, all together.
    pub bytes: u64,
    /// Bytes that crossed the link (less, when a part from an interrupted copy was kept or
    /// a file was there already).
    pub bytes_sent: u64,
    /// What was left out: symbolic links, special files, names that are not UTF-8 and
    /// copies' part files (never copied).
    pub skipped: Vec<String>,
    /// How long it took, milliseconds.
    pub elapsed_ms: u64,
}
