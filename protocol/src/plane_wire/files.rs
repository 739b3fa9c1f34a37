//! The frames of `/gpux/files/1`: a lease's workspace, read and written by its renter
//! (`gpux cp`, a resume's mirror), one request at a time.

use bincode::{Decode, Encode};

use crate::codec::{BoundedBytes, BoundedString, BoundedVec};
use crate::types::ContentId;

/// The most file bytes in one files (or stage) frame.
pub const MAX_FILE_DATA: usize = 256 * 1024;
/// Longest detail text in a refusal.
pub const MAX_DETAIL_CHARS: usize = 200;
/// The longest path in the workspace, bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// The most entries in one page of a listing.
pub const MAX_LIST_PAGE: usize = 256;

/// A path inside the workspace, relative to its root (`data/train.csv`).
pub type WorkspacePath = BoundedString<MAX_PATH_BYTES>;

/// Whether `path` may name something in a workspace: relative, non-empty, every component
/// non-empty and neither `.` nor `..`, no NUL. Both sides check it (the host before it
/// touches a file, the renter before it asks).
pub fn is_workspace_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The renter's first frame on `/gpux/files/1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub struct FilesOpen {
    /// The lease whose workspace is reached.
    pub lease: ContentId,
}

/// A renter's request on a files stream (one at a time; each has its answer).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum FilesRequest {
    /// What is at `path`.
    Stat {
        /// The path.
        path: WorkspacePath,
    },
    /// Everything under the directory `path`, depth first, sorted: the host answers with
    /// pages of [`FilesResponse::Entries`], the last with `more` false.
    List {
        /// The directory.
        path: WorkspacePath,
    },
    /// Makes the directory `path` and its parents.
    Mkdir {
        /// The directory.
        path: WorkspacePath,
    },
    /// Stores a file of `size` bytes at `path`. The host answers with what it has of it
    /// already ([`FilesResponse::Holding`]); the renter says where it goes on from
    /// ([`FilesRequest::PutFrom`]), sends the rest in [`FilesRequest::Data`] frames, and ends
    /// with [`FilesRequest::PutEnd`].
    Put {
        /// Where.
        path: WorkspacePath,
        /// Its size.
        size: u64,
    },
    /// Where a put goes on from: the length the host holds, when its blake3 is that of the
    /// renter's own first bytes (the file is there already when that is its size), else 0.
    PutFrom(u64),
    /// A put's end: the blake3 of the whole file. The host stores the file only when what
    /// it holds hashes to it.
    PutEnd([u8; 32]),
    /// Sends the file `path` from byte `offset`, where the renter holds `offset` bytes of
    /// an interrupted get whose blake3 is `hash`: the host goes on from there only when its
    /// own first bytes hash the same.
    Get {
        /// The file.
        path: WorkspacePath,
        /// How much of it the renter holds.
        offset: u64,
        /// blake3 of those bytes.
        hash: [u8; 32],
    },
    /// Bytes of the file being put.
    Data(BoundedBytes<MAX_FILE_DATA>),
}

/// What is at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryKind {
    /// A regular file of this size.
    File(u64),
    /// A directory.
    Dir,
    /// A symbolic link: never followed, never copied.
    Symlink,
    /// Anything else (a device, a socket, a fifo): never copied.
    Other,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct Entry {
    /// Its path, relative to the directory listed.
    pub path: WorkspacePath,
    /// What it is.
    pub kind: EntryKind,
}

/// The host's answer on a files stream.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum FilesResponse {
    /// What [`FilesRequest::Stat`] found (`None`: nothing there).
    Stat(Option<EntryKind>),
    /// A page of a listing; `more` when another follows.
    Entries {
        /// The entries.
        entries: BoundedVec<Entry, MAX_LIST_PAGE>,
        /// Whether there are more.
        more: bool,
    },
    /// Done: the directory exists, or the file put is stored and verified.
    Done,
    /// What the host holds of a file being put: `len` bytes whose blake3 is `hash` (the
    /// whole file when it is there at the size announced, else the part an interrupted put
    /// left, else nothing).
    Holding {
        /// How many bytes.
        len: u64,
        /// Their blake3.
        hash: [u8; 32],
    },
    /// The file asked for: its whole size, and the byte its [`FilesResponse::Data`] frames
    /// start at (the renter's offset when its bytes hash as the host's, else 0); a
    /// [`FilesResponse::End`] follows them.
    Sending {
        /// Its size.
        size: u64,
        /// Where the data starts.
        from: u64,
    },
    /// Bytes of the file being sent.
    Data(BoundedBytes<MAX_FILE_DATA>),
    /// The end of a file sent: the blake3 of the whole of it, as the host read it.
    End([u8; 32]),
    /// The request failed; the stream goes on unless the host closes it.
    Failed {
        /// Why, as a code.
        code: FilesError,
        /// Why, in words (at most [`MAX_DETAIL_CHARS`]).
        detail: BoundedString<800>,
    },
}

impl FilesResponse {
    /// A failure, its detail cut to [`MAX_DETAIL_CHARS`].
    pub fn failed(code: FilesError, detail: &str) -> Self {
        let detail: String = detail.chars().take(MAX_DETAIL_CHARS).collect();
        FilesResponse::Failed {
            code,
            detail: BoundedString::new(detail).unwrap_or_default(),
        }
    }
}

/// Why a files request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum FilesError {
    /// Nothing at that path.
    NotFound,
    /// The path leaves the workspace, or goes through a symbolic link.
    OutsideWorkspace,
    /// A file where a directory is needed, or the other way round.
    WrongKind,
    /// The workspace is full.
    NoSpace,
    /// The bytes received do not hash to what was announced (or the file changed while it
    /// was read).
    HashMismatch,
    /// Any other failure of the host's filesystem.
    Io,
    /// A request that does not fit the stream's state, or a bad path.
    Invalid,
}
