//! The renter's own disk in a copy: the directory a download writes under, confined as
//! the host's workspace is, and the local tree an upload walks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{CopyError, join, local};
use crate::plane::chunks::hash_prefix;
use crate::plane::confined::{PathError, Root, is_part_name};

/// blake3 of a local file's first `len` bytes, as a hasher that can go on.
pub(super) async fn hash_local(path: &Path, len: u64) -> Result<blake3::Hasher, CopyError> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || hash_prefix(&mut std::fs::File::open(&p)?, len))
        .await
        .map_err(|e| CopyError::Link(e.to_string()))?
        .map_err(local(path))
}

/// What a copy leaves free on the filesystem it downloads to: a host announces the size
/// of what it sends, and a size the filesystem cannot take (less this) is refused before a
/// byte is written.
pub(super) const KEEP_FREE: u64 = 64 << 20;

/// The directory a get writes under, opened as a confined root: a path a host names is
/// resolved under it by the kernel without following any link, so neither a link the user
/// has there nor one a listing names leads a write out of it.
pub(super) struct LocalDir {
    pub(super) root: Arc<Root>,
    /// The directory as the user named it, for messages.
    pub(super) shown: PathBuf,
}

impl LocalDir {
    pub(super) fn open(dir: &Path) -> Result<LocalDir, CopyError> {
        let root = Root::open_local(dir).map_err(local(dir))?;
        Ok(LocalDir {
            root: Arc::new(root),
            shown: dir.to_path_buf(),
        })
    }

    /// `op` on the root, on a blocking thread; its errors name `path`.
    pub(super) async fn with<T: Send + 'static>(
        &self,
        path: &str,
        op: impl FnOnce(&Root) -> Result<T, PathError> + Send + 'static,
    ) -> Result<T, CopyError> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || op(&root))
            .await
            .map_err(|e| CopyError::Link(e.to_string()))?
            .map_err(|e| self.failed(path, e))
    }

    pub(super) fn failed(&self, path: &str, e: PathError) -> CopyError {
        let source = match e {
            PathError::Io(_, e) => e,
            PathError::Outside(_) => std::io::Error::other(
                "goes through a symbolic link, which a copy from a host never follows",
            ),
            PathError::NotAFile(_) => std::io::Error::other("is not a regular file"),
            PathError::Invalid(_) => std::io::Error::other("is not a plain relative path"),
        };
        CopyError::Local {
            path: self.shown.join(path),
            source,
        }
    }

    /// The size of the regular file at `path`, if one is there.
    pub(super) async fn file_len(&self, path: &str) -> Result<Option<u64>, CopyError> {
        let at = path.to_string();
        self.with(path, move |root| {
            Ok(root.stat(&at)?.and_then(|stat| {
                (rustix::fs::FileType::from_raw_mode(stat.st_mode)
                    == rustix::fs::FileType::RegularFile)
                    .then(|| u64::try_from(stat.st_size).unwrap_or(0))
            }))
        })
        .await
    }

    /// blake3 of the first `len` bytes of the file at `path`, as a hasher that can go on.
    pub(super) async fn hash(&self, path: &str, len: u64) -> Result<blake3::Hasher, CopyError> {
        let at = path.to_string();
        self.with(path, move |root| {
            let mut file = root.open_read(&at)?;
            hash_prefix(&mut file, len).map_err(|e| PathError::Io(at, e))
        })
        .await
    }

    /// Fails unless `bytes` more fit on the filesystem with [`KEEP_FREE`] to spare.
    pub(super) async fn room_for(&self, path: &str, bytes: u64) -> Result<(), CopyError> {
        let at = path.to_string();
        let free = self
            .with(path, move |root| {
                root.free_bytes().map_err(|e| PathError::Io(at, e))
            })
            .await?;
        if bytes > free.saturating_sub(KEEP_FREE) {
            return Err(CopyError::Local {
                path: self.shown.join(path),
                source: std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!(
                        "{bytes} bytes to write, {free} free (a copy leaves {} MiB)",
                        KEEP_FREE >> 20
                    ),
                ),
            });
        }
        Ok(())
    }
}

/// What is under a local directory, relative to it, sorted.
#[derive(Default)]
pub(super) struct LocalTree {
    /// Files and their sizes.
    pub(super) files: Vec<(String, u64)>,
    pub(super) dirs: Vec<String>,
    /// Links, special files, names that are not UTF-8 and parts of copies.
    pub(super) skipped: Vec<String>,
}

/// Every file and directory under a local directory; links and special files apart.
pub(super) fn walk_local(root: &Path) -> Result<LocalTree, CopyError> {
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    let mut skipped = Vec::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        };
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map_err(local(&dir))?
            .filter_map(Result::ok)
            .collect();
        names.sort_by_key(std::fs::DirEntry::file_name);
        for entry in names {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                // Every path on the wire is UTF-8: reported, under its name as near as
                // UTF-8 comes, and never copied.
                skipped.push(join(&rel, &file_name.to_string_lossy()));
                continue;
            };
            let child = join(&rel, name);
            // An interrupted download's part is this side's to go on from, not a file.
            if is_part_name(name) {
                skipped.push(child);
                continue;
            }
            let kind = entry.file_type().map_err(local(&entry.path()))?;
            if kind.is_dir() {
                dirs.push(child.clone());
                stack.push(child);
            } else if kind.is_file() {
                let len = entry.metadata().map_err(local(&entry.path()))?.len();
                files.push((child, len));
            } else {
                skipped.push(child);
            }
        }
    }
    dirs.sort();
    files.sort();
    Ok(LocalTree {
        files,
        dirs,
        skipped,
    })
}
