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
    let ok = !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(PathError::Invalid(path.to_string()))
    }
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
mod tests {
    use super::*;

    #[test]
    fn paths_are_relative_and_plain() {
        for ok in ["a", "a/b.txt", "x y/z"] {
            check(ok).unwrap();
        }
        for bad in [
            "",
            "/etc",
            "../etc",
            "a/../../b",
            "a//b",
            "a/./b",
            "a/",
            "a\0b",
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parts_sit_beside_their_file_and_fit_a_name() {
        assert_eq!(part_of("a/b/c.bin"), "a/b/.c.bin.gpux-part");
        assert_eq!(part_of("c.bin"), ".c.bin.gpux-part");
        let ws = tempfile::tempdir().unwrap();
        let root = Root::open_local(ws.path()).unwrap();
        root.mkdir_all("d").unwrap();
        // Names up to the longest a filesystem takes have parts it takes too, each their own.
        let mut parts = std::collections::BTreeSet::new();
        for len in [244, 245, 254, 255] {
            for last in ['x', 'y'] {
                let name = format!("{}{last}", "n".repeat(len - 1));
                let part = part_of(&format!("d/{name}"));
                root.open_write(&part).unwrap();
                root.rename_in_place(&part, &format!("d/{name}")).unwrap();
                assert!(parts.insert(part));
            }
        }
        assert_eq!(std::fs::read_dir(ws.path().join("d")).unwrap().count(), 8);
        for (name, part) in [
            (".x.gpux-part", true),
            (&part_of(&"n".repeat(250)), true),
            ("x.gpux-part", false),
            (".gpux-part", false),
            (".x.gpux-part.txt", false),
        ] {
            assert_eq!(is_part_name(name), part, "{name}");
        }
    }

    #[test]
    fn a_walk_reports_names_that_are_not_utf8_and_stops_at_its_limits_as_it_reads() {
        use std::os::unix::ffi::OsStrExt;
        let ws = tempfile::tempdir().unwrap();
        let odd = std::ffi::OsStr::from_bytes(b"odd\xff");
        std::fs::create_dir(ws.path().join(odd)).unwrap();
        std::fs::write(ws.path().join(odd).join("inside"), b"x").unwrap();
        std::fs::write(ws.path().join("plain"), b"x").unwrap();
        let root = Root::open(ws.path()).unwrap();
        let limit = |entries, path_bytes| Limit {
            entries,
            path_bytes,
        };
        let walked = root.walk("", limit(100, 1 << 20)).unwrap();
        let listed: Vec<(&str, bool)> = walked
            .iter()
            .map(|w| (w.path.as_str(), w.stat.is_some()))
            .collect();
        // Listed (without a kind) and not entered.
        assert_eq!(listed, [("odd\u{fffd}", false), ("plain", true)]);

        let many = ws.path().join("many");
        std::fs::create_dir(&many).unwrap();
        for i in 0..50 {
            std::fs::write(many.join(format!("f{i:02}")), b"").unwrap();
        }
        let e = root.walk("many", limit(49, 1 << 20)).err().unwrap();
        assert!(e.to_string().contains("more than 49 entries"), "{e}");
        assert_eq!(root.walk("many", limit(50, 1 << 20)).unwrap().len(), 50);
        let e = root.walk("many", limit(50, 100)).err().unwrap();
        assert!(e.to_string().contains("MiB of paths"), "{e}");
    }

    #[test]
    fn nothing_outside_the_root_or_through_a_link_is_reached() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"host").unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("d")).unwrap();
        std::fs::write(ws.path().join("d/f"), b"mine").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
        std::os::unix::fs::symlink("d", ws.path().join("inner")).unwrap();
        let root = Root::open(ws.path()).unwrap();

        assert_eq!(
            std::io::read_to_string(root.open_read("d/f").unwrap()).unwrap(),
            "mine"
        );
        for through_link in ["out/secret", "inner/f"] {
            let e = root.open_read(through_link).unwrap_err();
            assert!(matches!(e, PathError::Outside(_)), "{through_link}: {e}");
            let e = root.open_write(through_link).unwrap_err();
            assert!(matches!(e, PathError::Outside(_)), "{through_link}: {e}");
        }
        assert!(matches!(root.open_read("out"), Err(PathError::Outside(_))));
        assert!(root.mkdir_all("out/new").is_err());
        assert!(!outside.path().join("new").exists());
        assert!(matches!(root.open_read("../x"), Err(PathError::Invalid(_))));

        root.mkdir_all("a/b/c").unwrap();
        let mut f = root.open_write("a/b/c/x.part").unwrap();
        std::io::Write::write_all(&mut f, b"data").unwrap();
        root.rename_in_place("a/b/c/x.part", "a/b/c/x").unwrap();
        assert_eq!(std::fs::read(ws.path().join("a/b/c/x")).unwrap(), b"data");

        let listed: Vec<String> = root
            .walk(
                "",
                Limit {
                    entries: 100,
                    path_bytes: 1 << 20,
                },
            )
            .unwrap()
            .into_iter()
            .map(|w| w.path)
            .collect();
        assert_eq!(
            listed,
            ["a", "a/b", "a/b/c", "a/b/c/x", "d", "d/f", "inner", "out"]
        );
        assert_eq!(
            std::fs::read(outside.path().join("secret")).unwrap(),
            b"host"
        );
    }

    #[test]
    fn a_fifo_is_refused_at_once_and_what_is_opened_blocks_as_a_file_does() {
        let ws = tempfile::tempdir().unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            ws.path().join("p"),
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        std::fs::write(ws.path().join("f"), b"x").unwrap();
        let root = Root::open(ws.path()).unwrap();
        // Nothing opens the fifo's other end: a blocking open would never return.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let read = root.open_read("p").map(|_| ());
            let write = root.open_write("p").map(|_| ());
            let file = root.open_read("f").unwrap();
            let flags = rustix::fs::fcntl_getfl(&file).unwrap();
            let _ = tx.send((read, write, flags));
        });
        let (read, write, flags) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a fifo blocked");
        assert!(matches!(read, Err(PathError::NotAFile(_))), "{read:?}");
        assert!(write.is_err(), "{write:?}");
        assert!(!flags.contains(OFlags::NONBLOCK));
    }
}
