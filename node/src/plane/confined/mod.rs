//! File operations confined to a lease's workspace by the kernel.
//!
//! The workload owns its workspace and can swap any directory for a symbolic link at any
//! moment, so a check followed by an open proves nothing. Every path here is resolved by
//! `openat2` from the workspace's root with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS`: a path that would leave the root, or that goes through a symbolic
//! link anywhere, fails in the kernel, atomically with the open. Operations on a name (make
//! a directory, rename, remove) first open its parent that way and then act on one plain
//! name relative to that descriptor, so nothing between the check and the act can be
//! swapped. The host runs as root: what it creates is handed to the workload's user.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use gpux_protocol::plane_wire::{FilesError, FilesResponse};
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

/// The workload's user and group, owner of what the host creates in a workspace.
const OWNER: u32 = 65534;

/// How many times an `openat2` that raced with a rename (`EAGAIN`) is tried.
const RACE_RETRIES: usize = 8;
/// How many times a part renamed between its open and its lock is opened again.
const LOCK_TRIES: usize = 4;

/// Why a path cannot be used.
///
/// The reason comes first: a host's answer is cut at 200 characters, and a long path must
/// not push the reason out of it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PathError {
    #[error("not a path inside the workspace: {0:?}")]
    Invalid(String),
    #[error("leaves the workspace or goes through a symbolic link: {0:?}")]
    Outside(String),
    #[error("not a regular file: {0:?}")]
    NotAFile(String),
    #[error("{1}: {0:?}")]
    Io(String, io::Error),
}

impl PathError {
    fn from_errno(path: &str, e: rustix::io::Errno) -> Self {
        if e == rustix::io::Errno::XDEV || e == rustix::io::Errno::LOOP {
            PathError::Outside(path.to_string())
        } else {
            PathError::Io(path.to_string(), e.into())
        }
    }

    /// The I/O error's kind, when it is one.
    pub(crate) fn kind(&self) -> Option<io::ErrorKind> {
        match self {
            PathError::Io(_, e) => Some(e.kind()),
            _ => None,
        }
    }

    /// `path` is held by something else.
    pub(crate) fn busy(path: &str, why: &str) -> Self {
        PathError::Io(
            path.to_string(),
            io::Error::new(io::ErrorKind::ResourceBusy, why.to_string()),
        )
    }

    /// Whether the filesystem is full.
    pub(crate) fn is_no_space(&self) -> bool {
        matches!(self, PathError::Io(_, e) if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()))
    }
}

/// A workspace's root, by descriptor.
pub(crate) struct Root {
    fd: OwnedFd,
    /// Whether what is made under it is handed to the workload's user.
    workload_owns: bool,
}

/// Checks a workspace path: relative, non-empty components, no `.` or `..`, no NUL.
pub(crate) fn check(path: &str) -> Result<(), PathError> {
    if gpux_protocol::plane_wire::is_workspace_path(path) {
        Ok(())
    } else {
        Err(PathError::Invalid(path.to_string()))
    }
}

/// The answer to a files request that failed on `e`.
pub(crate) fn failure(e: &PathError) -> FilesResponse {
    let code = match e {
        PathError::Invalid(_) => FilesError::Invalid,
        PathError::Outside(_) => FilesError::OutsideWorkspace,
        PathError::NotAFile(_) => FilesError::WrongKind,
        e if e.is_no_space() => FilesError::NoSpace,
        e if e.kind() == Some(std::io::ErrorKind::NotFound) => FilesError::NotFound,
        e if e.kind() == Some(std::io::ErrorKind::NotADirectory) => FilesError::WrongKind,
        _ => FilesError::Io,
    };
    FilesResponse::failed(code, &e.to_string())
}

/// The longest name a Linux filesystem takes, bytes.
pub(crate) const NAME_MAX: usize = 255;
/// What a part file's name ends with.
const PART_SUFFIX: &str = ".gpux-part";

/// The name of a copy's part file, beside its target `path` (both relative to one
/// directory): `.<name>.gpux-part`, or for a name too long to take the dot and suffix,
/// `.<blake3 of the name, 32 hex digits>.gpux-part`.
pub(crate) fn part_of(path: &str) -> String {
    let (parent, name) = split(path);
    let part = if name.len() + ".".len() + PART_SUFFIX.len() <= NAME_MAX {
        format!(".{name}{PART_SUFFIX}")
    } else {
        let hex = blake3::hash(name.as_bytes()).to_hex();
        format!(".{}{PART_SUFFIX}", &hex[..32])
    };
    join(parent, &part)
}

/// Whether `name` (one name, not a path) is a copy's part file: `.<...>.gpux-part`. Parts
/// are a copy's own: never copied, never a put's target.
pub(crate) fn is_part_name(name: &str) -> bool {
    name.len() > ".".len() + PART_SUFFIX.len()
        && name.starts_with('.')
        && name.ends_with(PART_SUFFIX)
}

/// Cuts a copy's locked part `file` (at `part`) to the `keep` bytes that were hashed of it,
/// and returns a second descriptor of it, which keeps its lock while the first is written
/// through and closed. Fails when the part is shorter than `keep` now (cut since it was
/// hashed): growing it back would put zeros where the hash says the bytes are.
pub(crate) fn go_on_from(file: &File, keep: u64, part: &str) -> Result<File, PathError> {
    let io = |e| PathError::Io(part.to_string(), e);
    if file.metadata().map_err(io)?.len() < keep {
        return Err(io(io::Error::other(
            "the part changed while it was compared; copy again",
        )));
    }
    file.set_len(keep).map_err(io)?;
    file.try_clone().map_err(io)
}

/// `path`'s parent directory and last name.
fn split(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", path),
    }
}

impl Root {
    /// Opens the workspace at `dir` (a path of the host's own, trusted).
    pub(crate) fn open(dir: &Path) -> io::Result<Root> {
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root {
            fd,
            workload_owns: true,
        })
    }

    /// Opens a directory of this machine's (a renter's download target), where a copy from
    /// a host must not follow a link the user has there out of it. What is made under it
    /// keeps this process's owner.
    pub(crate) fn open_local(dir: &Path) -> io::Result<Root> {
        let root = Root::open(dir)?;
        Ok(Root {
            workload_owns: false,
            ..root
        })
    }

    /// Bytes free to this process on the root's filesystem.
    pub(crate) fn free_bytes(&self) -> io::Result<u64> {
        let stat = rustix::fs::fstatvfs(&self.fd)?;
        Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    fn own(&self, fd: impl AsFd, path: &str) -> Result<(), PathError> {
        if self.workload_owns {
            own(fd, path)
        } else {
            Ok(())
        }
    }

    /// `openat2` from the root, confined; `""` is the root itself.
    fn resolve(&self, path: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, PathError> {
        let at = if path.is_empty() { "." } else { path };
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(&self.fd, at, flags | OFlags::CLOEXEC, mode, how) {
                Ok(fd) => return Ok(fd),
                Err(rustix::io::Errno::AGAIN) if tries < RACE_RETRIES => tries += 1,
                Err(e) => return Err(PathError::from_errno(path, e)),
            }
        }
    }

    fn dir(&self, path: &str) -> Result<OwnedFd, PathError> {
        self.resolve(path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
    }

    /// Opens the regular file `path` for reading.
    pub(crate) fn open_read(&self, path: &str) -> Result<File, PathError> {
        check(path)?;
        let fd = self.resolve(
            path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        regular_file(fd, path)
    }

    /// Opens (creating it, owned by the workload) the regular file `path` for reading and
    /// writing, without truncating it.
    pub(crate) fn open_write(&self, path: &str) -> Result<File, PathError> {
        check(path)?;
        let fd = self.resolve(
            path,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o644),
        )?;
        let file = regular_file(fd, path)?;
        self.own(&file, path)?;
        Ok(file)
    }

    /// Opens (creating it) a copy's part file and takes an exclusive `flock` on it, without
    /// waiting; `None` while another descriptor holds it. The lock is the open file's: it
    /// holds while any descriptor of it (a dup too) is open.
    pub(crate) fn try_lock_part(&self, part: &str) -> Result<Option<File>, PathError> {
        use rustix::fs::{FlockOperation, flock};
        for _ in 0..LOCK_TRIES {
            let file = self.open_write(part)?;
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(PathError::from_errno(part, e)),
            }
            // A copy that held the lock may have renamed this very file to its target
            // between the open and the lock: then it is the target now, not a part.
            if self.names(part, &file) {
                return Ok(Some(file));
            }
        }
        Err(PathError::busy(
            part,
            "the part keeps being replaced; copy again",
        ))
    }

    /// Whether `path` names `file` now.
    pub(crate) fn names(&self, path: &str, file: &File) -> bool {
        match (rustix::fs::fstat(file), self.stat(path)) {
            (Ok(mine), Ok(Some(there))) => {
                (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
            }
            _ => false,
        }
    }

    /// What is at `path` (`None`: nothing); `""` is the root.
    pub(crate) fn stat(&self, path: &str) -> Result<Option<rustix::fs::Stat>, PathError> {
        if !path.is_empty() {
            check(path)?;
        }
        let (parent, name) = split(path);
        let fd = match self.dir(parent) {
            Ok(fd) => fd,
            Err(PathError::Io(_, e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let name = if name.is_empty() { "." } else { name };
        match rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(stat)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(PathError::from_errno(path, e)),
        }
    }

    /// Makes the directory `path` and its missing parents, owned by the workload.
    pub(crate) fn mkdir_all(&self, path: &str) -> Result<(), PathError> {
        check(path)?;
        let mut done = String::new();
        for part in path.split('/') {
            let parent = self.dir(&done)?;
            match rustix::fs::mkdirat(&parent, part, Mode::from_raw_mode(0o755)) {
                Ok(()) => {
                    let made = self.resolve(
                        &join(&done, part),
                        OFlags::RDONLY | OFlags::DIRECTORY,
                        Mode::empty(),
                    )?;
                    self.own(&made, path)?;
                }
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(PathError::from_errno(path, e)),
            }
            done = join(&done, part);
        }
        // What is there now is a directory reached without a link.
        self.dir(path).map(drop)
    }

    /// Renames `from` to `to`, both in one directory.
    pub(crate) fn rename_in_place(&self, from: &str, to: &str) -> Result<(), PathError> {
        check(from)?;
        check(to)?;
        let (parent, from_name) = split(from);
        let (to_parent, to_name) = split(to);
        if parent != to_parent {
            return Err(PathError::Invalid(to.to_string()));
        }
        let dir = self.dir(parent)?;
        rustix::fs::renameat(&dir, from_name, &dir, to_name)
            .map_err(|e| PathError::from_errno(to, e))
    }

    /// Removes the file `path` (a link itself, never what it points to); nothing there is
    /// fine.
    pub(crate) fn remove_file(&self, path: &str) -> Result<(), PathError> {
        check(path)?;
        let (parent, name) = split(path);
        let dir = self.dir(parent)?;
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(PathError::from_errno(path, e)),
        }
    }

    /// Opens the regular file `path` for what an SFTP client asks: reading, writing or both;
    /// created (owned by the workload) with `create`, emptied with `truncate`, refused when
    /// it exists and `exclusive`.
    pub(crate) fn open_as(&self, path: &str, how: OpenAs) -> Result<File, PathError> {
        check(path)?;
        let mut flags = match (how.read, how.write) {
            (_, false) => OFlags::RDONLY,
            (false, true) => OFlags::WRONLY,
            (true, true) => OFlags::RDWR,
        };
        flags |= OFlags::NOFOLLOW | OFlags::NONBLOCK;
        if how.write && how.create {
            flags |= OFlags::CREATE;
            if how.exclusive {
                flags |= OFlags::EXCL;
            }
        }
        if how.write && how.truncate {
            flags |= OFlags::TRUNC;
        }
        // (`openat2` takes a mode only with `O_CREAT`.)
        let mode = if flags.contains(OFlags::CREATE) {
            Mode::from_raw_mode(0o644)
        } else {
            Mode::empty()
        };
        let fd = self.resolve(path, flags, mode)?;
        let file = regular_file(fd, path)?;
        if how.write && how.create {
            self.own(&file, path)?;
        }
        Ok(file)
    }

    /// The entries of the directory `path` (`""`: the root), one level, sorted by name, each
    /// with what it is; at most `max` (names that are not UTF-8 are left out: every path on
    /// the wire is UTF-8).
    pub(crate) fn list(
        &self,
        path: &str,
        max: usize,
    ) -> Result<Vec<(String, rustix::fs::Stat)>, PathError> {
        if !path.is_empty() {
            check(path)?;
        }
        let fd = self.resolve(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(&fd).map_err(|e| PathError::from_errno(path, e))? {
            let entry = entry.map_err(|e| PathError::from_errno(path, e))?;
            let raw = entry.file_name();
            let Ok(name) = raw.to_str() else { continue };
            if name == "." || name == ".." {
                continue;
            }
            if out.len() >= max {
                return Err(too_many(
                    path.to_string(),
                    Limit {
                        entries: max,
                        path_bytes: 0,
                    },
                ));
            }
            match rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => out.push((name.to_string(), stat)),
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(PathError::from_errno(path, e)),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Makes the directory `path` (its parent exists), owned by the workload.
    pub(crate) fn mkdir(&self, path: &str) -> Result<(), PathError> {
        check(path)?;
        let (parent, name) = split(path);
        let dir = self.dir(parent)?;
        rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755))
            .map_err(|e| PathError::from_errno(path, e))?;
        let made = self.resolve(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        self.own(&made, path)
    }

    /// Removes the empty directory `path`.
    pub(crate) fn rmdir(&self, path: &str) -> Result<(), PathError> {
        check(path)?;
        let (parent, name) = split(path);
        let dir = self.dir(parent)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR)
            .map_err(|e| PathError::from_errno(path, e))
    }

    /// Renames `from` to `to`, anywhere in the workspace; replaces what is at `to` only
    /// with `replace`.
    pub(crate) fn rename(&self, from: &str, to: &str, replace: bool) -> Result<(), PathError> {
        check(from)?;
        check(to)?;
        let ((from_dir, from_name), (to_dir, to_name)) = (split(from), split(to));
        let (a, b) = (self.dir(from_dir)?, self.dir(to_dir)?);
        let flags = if replace {
            rustix::fs::RenameFlags::empty()
        } else {
            rustix::fs::RenameFlags::NOREPLACE
        };
        rustix::fs::renameat_with(&a, from_name, &b, to_name, flags)
            .map_err(|e| PathError::from_errno(to, e))
    }

    /// Sets what an SFTP client may change of `path` (`""`: the root): its size (a regular
    /// file), its permission bits, its access and modification times (unix seconds).
    pub(crate) fn set(&self, path: &str, how: SetAttrs) -> Result<(), PathError> {
        if !path.is_empty() {
            check(path)?;
        }
        let fd = self.resolve(
            path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        let errno = |e| PathError::from_errno(path, e);
        if let Some(size) = how.size {
            // (A regular file only, opened for writing.)
            let writable = self.open_as(
                path,
                OpenAs {
                    write: true,
                    ..OpenAs::default()
                },
            )?;
            writable
                .set_len(size)
                .map_err(|e| PathError::Io(path.into(), e))?;
        }
        if let Some(mode) = how.mode {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o7777 & !0o6000)).map_err(errno)?;
        }
        if let Some((atime, mtime)) = how.times {
            let at = |s: u32| rustix::fs::Timespec {
                tv_sec: i64::from(s),
                tv_nsec: 0,
            };
            rustix::fs::futimens(
                &fd,
                &rustix::fs::Timestamps {
                    last_access: at(atime),
                    last_modification: at(mtime),
                },
            )
            .map_err(errno)?;
        }
        Ok(())
    }

    /// Every entry under the directory `path` (`""`: the whole workspace), depth first and
    /// sorted, with paths relative to it; at most `limit`. Links are listed, never entered.
    pub(crate) fn walk(&self, path: &str, limit: Limit) -> Result<Vec<Walked>, PathError> {
        if !path.is_empty() {
            check(path)?;
        }
        let mut out = Vec::new();
        self.walk_into(path, "", limit, &mut out, &mut Seen::default())?;
        Ok(out)
    }

    fn walk_into(
        &self,
        base: &str,
        rel: &str,
        limit: Limit,
        out: &mut Vec<Walked>,
        seen: &mut Seen,
    ) -> Result<(), PathError> {
        let here = join(base, rel);
        let fd = self.resolve(&here, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        // Every name is charged as it is read, and never given back: what all the
        // directories being walked hold at once stays within the limits, however the
        // workload nests them.
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&fd).map_err(|e| PathError::from_errno(&here, e))? {
            let entry = entry.map_err(|e| PathError::from_errno(&here, e))?;
            let raw = entry.file_name();
            if raw == c"." || raw == c".." {
                continue;
            }
            seen.entries += 1;
            if seen.entries > limit.entries {
                return Err(too_many(here, limit));
            }
            // At least the length of the path it is listed under (a name that is not
            // UTF-8 is listed in its lossy form, up to three times longer).
            let listed = match raw.to_str() {
                Ok(name) => name.len(),
                Err(_) => raw.to_string_lossy().len(),
            };
            seen.path_bytes += rel.len() + 1 + listed;
            if seen.path_bytes > limit.path_bytes {
                return Err(too_long(here, limit));
            }
            names.push(raw.to_owned());
        }
        // By bytes: for UTF-8 names, the order of their characters.
        names.sort();
        for raw in names {
            let (child, stat) = match raw.to_str() {
                Ok(name) => match rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) => (join(rel, name), Some(stat)),
                    // Gone since the listing: the workload is busy there.
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(PathError::from_errno(&here, e)),
                },
                // Every path on the wire is UTF-8: this one is listed as neither a file
                // nor a directory, under its name as near as UTF-8 comes, and not entered.
                Err(_) => (join(rel, &raw.to_string_lossy()), None),
            };
            let is_dir = stat.is_some_and(|stat| {
                rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory
            });
            out.push(Walked {
                path: child.clone(),
                stat,
            });
            if is_dir {
                self.walk_into(base, &child, limit, out, seen)?;
            }
        }
        Ok(())
    }
}

/// How [`Root::open_as`] opens a file.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OpenAs {
    pub(crate) read: bool,
    pub(crate) write: bool,
    pub(crate) create: bool,
    pub(crate) truncate: bool,
    pub(crate) exclusive: bool,
}

/// What [`Root::set`] changes (each `None`: left alone).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SetAttrs {
    pub(crate) size: Option<u64>,
    pub(crate) mode: Option<u32>,
    pub(crate) times: Option<(u32, u32)>,
}

/// What a walk has read so far.
#[derive(Default)]
struct Seen {
    entries: usize,
    path_bytes: usize,
}

/// One entry a walk found.
pub(crate) struct Walked {
    /// Relative to the directory walked.
    pub(crate) path: String,
    /// What it is; `None` for a name that is not UTF-8 (the path is then its lossy form).
    pub(crate) stat: Option<rustix::fs::Stat>,
}

fn too_many(here: String, limit: Limit) -> PathError {
    PathError::Io(
        here,
        io::Error::other(format!(
            "more than {} entries: copy its directories one at a time",
            limit.entries
        )),
    )
}

fn too_long(here: String, limit: Limit) -> PathError {
    PathError::Io(
        here,
        io::Error::other(format!(
            "more than {} MiB of paths: copy its directories one at a time",
            limit.path_bytes >> 20
        )),
    )
}

/// How much a walk gathers at most: it is held whole before it is sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit {
    /// Entries.
    pub(crate) entries: usize,
    /// Bytes of their paths, all together.
    pub(crate) path_bytes: usize,
}

/// `fd`, opened with `O_NONBLOCK`, as a blocking [`File`] when it is a regular file.
///
/// Files are opened non-blocking so that a fifo the workload made in its workspace fails
/// here instead of blocking the opening thread until something opens its other end (a
/// blocking thread a timeout cannot cancel, and a busy mount the workspace's removal cannot
/// unmount).
fn regular_file(fd: OwnedFd, path: &str) -> Result<File, PathError> {
    let stat = rustix::fs::fstat(&fd).map_err(|e| PathError::from_errno(path, e))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(PathError::NotAFile(path.to_string()));
    }
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| PathError::from_errno(path, e))?;
    rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)
        .map_err(|e| PathError::from_errno(path, e))?;
    Ok(File::from(fd))
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

fn own(fd: impl AsFd, path: &str) -> Result<(), PathError> {
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(OWNER)),
        Some(rustix::fs::Gid::from_raw(OWNER)),
    )
    .map_err(|e| PathError::from_errno(path, e))
}

#[cfg(test)]
mod tests;
