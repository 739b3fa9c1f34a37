//! What a copy reports as it goes, and why it fails.

use std::path::{Path, PathBuf};

use gpux_protocol::plane_wire::FilesError;

/// What a copy reports as it goes.
pub(crate) trait Progress: Send + Sync {
    /// The total bytes to copy, once known.
    fn total(&self, _bytes: u64) {}
    /// `bytes` more are done (sent, or found in place).
    fn advance(&self, _bytes: u64) {}
}

/// No progress shown.
impl Progress for () {}

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum CopyError {
    /// A local file.
    #[error("{}: {source}", path.display())]
    Local {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The host refused a request.
    #[error("{path}: {detail}")]
    Remote {
        /// The workspace path.
        path: String,
        /// The host's code.
        code: FilesError,
        /// Its words.
        detail: String,
    },
    /// The link to the host broke (run the copy again to go on).
    #[error(
        "the link to the host broke ({0}); run the same copy again to go on from where it stopped"
    )]
    Link(String),
    /// A directory copy that made its destination `made` stopped: the same copy again
    /// would copy into it, nested; `again` says how to go on.
    #[error(
        "{why}; this copy made /workspace/{made}, and the same command again would copy into it: {again}"
    )]
    Made {
        /// Why it stopped.
        why: String,
        /// The directory the copy made.
        made: String,
        /// How to go on.
        again: String,
    },
    /// A copy that cannot be done as asked.
    #[error("{0}")]
    Usage(String),
}

pub(crate) fn local(path: &Path) -> impl FnOnce(std::io::Error) -> CopyError + '_ {
    move |source| CopyError::Local {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_string()
    } else {
        format!("{a}/{b}")
    }
}

pub(crate) fn base_name(path: &Path) -> Result<String, CopyError> {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| CopyError::Usage(format!("{} has no name to copy under", path.display())))
}
