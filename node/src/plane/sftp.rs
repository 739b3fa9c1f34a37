//! SFTP on a lease's workspace, for `ssh`'s `sftp` subsystem (`scp`, `sftp`, editors): the
//! client sees `/workspace`, and every path goes through the same kernel-confined
//! operations as `gpux cp` (`super::confined`: `openat2` beneath the workspace, through no
//! symbolic link), so nothing the workload does inside it can make the host touch a file
//! outside. Links are neither followed, read nor made. Paths outside `/workspace` are
//! refused.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use russh_sftp::protocol::{
    Attrs, Data, File, FileAttributes, Handle, Name, OpenFlags, Status, StatusCode, Version,
};

use super::confined::{OpenAs, PathError, Root, SetAttrs};

/// Where the workspace appears to SFTP clients (and in the container).
pub(crate) const WORKSPACE: &str = "/workspace";
/// Handles one session may hold open at once.
const MAX_HANDLES: usize = 256;
/// Entries one directory listing reads at most.
const MAX_LISTED: usize = 100_000;
/// Entries sent per `readdir` answer.
const PAGE: usize = 256;
/// The most bytes one read answers with.
const MAX_READ: u32 = 256 * 1024;

/// An open handle.
enum Open {
    File(Arc<std::fs::File>),
    /// A directory's entries not yet sent.
    Dir(Vec<File>),
}

/// One SFTP session on one workspace.
pub(crate) struct Sftp {
    root: Arc<Root>,
    handles: BTreeMap<String, Open>,
    next: u64,
}

impl Sftp {
    pub(crate) fn new(root: Root) -> Self {
        Sftp {
            root: Arc::new(root),
            handles: BTreeMap::new(),
            next: 0,
        }
    }

    fn add(&mut self, open: Open) -> Result<String, StatusCode> {
        if self.handles.len() >= MAX_HANDLES {
            return Err(StatusCode::Failure);
        }
        self.next += 1;
        let handle = self.next.to_string();
        self.handles.insert(handle.clone(), open);
        Ok(handle)
    }

    fn file(&self, handle: &str) -> Result<Arc<std::fs::File>, StatusCode> {
        match self.handles.get(handle) {
            Some(Open::File(f)) => Ok(f.clone()),
            _ => Err(StatusCode::Failure),
        }
    }
}

/// The workspace path a client's path names (`""`: the workspace itself): `/workspace/a`,
/// or `a` (relative to `/workspace`, the session's home), `.` and `..` resolved by name
/// (never above the workspace). Anything else is refused.
pub(crate) fn inside(path: &str) -> Result<String, StatusCode> {
    let rest = if path == WORKSPACE {
        ""
    } else if let Some(rest) = path.strip_prefix("/workspace/") {
        rest
    } else if path.starts_with('/') {
        return Err(StatusCode::PermissionDenied);
    } else {
        path
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name => parts.push(name),
        }
    }
    if parts.iter().any(|p| p.contains('\0')) {
        return Err(StatusCode::BadMessage);
    }
    Ok(parts.join("/"))
}

fn status(e: &PathError) -> StatusCode {
    match e.kind() {
        Some(std::io::ErrorKind::NotFound) => StatusCode::NoSuchFile,
        Some(std::io::ErrorKind::PermissionDenied) => StatusCode::PermissionDenied,
        _ => match e {
            PathError::Outside(_) | PathError::Invalid(_) => StatusCode::PermissionDenied,
            _ => StatusCode::Failure,
        },
    }
}

fn attrs(stat: &rustix::fs::Stat) -> FileAttributes {
    FileAttributes {
        size: Some(stat.st_size as u64),
        uid: Some(stat.st_uid),
        user: None,
        gid: Some(stat.st_gid),
        group: None,
        permissions: Some(stat.st_mode),
        atime: Some(stat.st_atime as u32),
        mtime: Some(stat.st_mtime as u32),
    }
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".into(),
        language_tag: "en-US".into(),
    }
}

/// Runs `f` on a blocking thread (the workspace's disk may be slow).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StatusCode> + Send + 'static,
) -> Result<T, StatusCode> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or(Err(StatusCode::Failure))
}

impl russh_sftp::server::Handler for Sftp {
    type Error = StatusCode;

    fn unimplemented(&self) -> Self::Error {
        StatusCode::OpUnsupported
    }

    async fn init(
        &mut self,
        _version: u32,
        _extensions: std::collections::HashMap<String, String>,
    ) -> Result<Version, Self::Error> {
        Ok(Version::new())
    }

    async fn realpath(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let rel = inside(&path)?;
        let full = if rel.is_empty() {
            WORKSPACE.to_string()
        } else {
            format!("{WORKSPACE}/{rel}")
        };
        Ok(Name {
            id,
            files: vec![File::dummy(full)],
        })
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        // Links are never followed: stat is lstat.
        self.lstat(id, path).await
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let rel = inside(&path)?;
        let root = self.root.clone();
        let stat = blocking(move || root.stat(&rel).map_err(|e| status(&e))).await?;
        let stat = stat.ok_or(StatusCode::NoSuchFile)?;
        Ok(Attrs {
            id,
            attrs: attrs(&stat),
        })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, Self::Error> {
        let file = self.file(&handle)?;
        let stat =
            blocking(move || rustix::fs::fstat(&*file).map_err(|_| StatusCode::Failure)).await?;
        Ok(Attrs {
            id,
            attrs: attrs(&stat),
        })
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        pflags: OpenFlags,
        _attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        let rel = inside(&filename)?;
        if rel.is_empty() {
            return Err(StatusCode::Failure);
        }
        let how = OpenAs {
            read: pflags.contains(OpenFlags::READ),
            write: pflags.intersects(OpenFlags::WRITE | OpenFlags::APPEND),
            create: pflags.contains(OpenFlags::CREATE),
            truncate: pflags.contains(OpenFlags::TRUNCATE),
            exclusive: pflags.contains(OpenFlags::EXCLUDE),
        };
        let root = self.root.clone();
        let file = blocking(move || root.open_as(&rel, how).map_err(|e| status(&e))).await?;
        let handle = self.add(Open::File(Arc::new(file)))?;
        Ok(Handle { id, handle })
    }

    async fn read(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        len: u32,
    ) -> Result<Data, Self::Error> {
        let file = self.file(&handle)?;
        let data = blocking(move || {
            let mut buf = vec![0u8; len.min(MAX_READ) as usize];
            let n = file
                .read_at(&mut buf, offset)
                .map_err(|_| StatusCode::Failure)?;
            if n == 0 && !buf.is_empty() {
                return Err(StatusCode::Eof);
            }
            buf.truncate(n);
            Ok(buf)
        })
        .await?;
        Ok(Data { id, data })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        let file = self.file(&handle)?;
        blocking(move || {
            file.write_all_at(&data, offset)
                .map_err(|_| StatusCode::Failure)
        })
        .await?;
        Ok(ok(id))
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        self.handles
            .remove(&handle)
            .map(|_| ok(id))
            .ok_or(StatusCode::Failure)
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        let rel = inside(&path)?;
        let root = self.root.clone();
        let listed = blocking(move || root.list(&rel, MAX_LISTED).map_err(|e| status(&e))).await?;
        let mut files: Vec<File> = listed
            .iter()
            .map(|(name, stat)| File::new(name.clone(), attrs(stat)))
            .collect();
        // Sent from the end: reversed, so the client sees them sorted.
        files.reverse();
        let handle = self.add(Open::Dir(files))?;
        Ok(Handle { id, handle })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        let Some(Open::Dir(left)) = self.handles.get_mut(&handle) else {
            return Err(StatusCode::Failure);
        };
        if left.is_empty() {
            return Err(StatusCode::Eof);
        }
        let take = left.len().min(PAGE);
        let files = left
            .split_off(left.len() - take)
            .into_iter()
            .rev()
            .collect();
        Ok(Name { id, files })
    }

    async fn mkdir(
        &mut self,
        id: u32,
        path: String,
        _attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let rel = inside(&path)?;
        let root = self.root.clone();
        blocking(move || root.mkdir(&rel).map_err(|e| status(&e))).await?;
        Ok(ok(id))
    }

    async fn rmdir(&mut self, id: u32, path: String) -> Result<Status, Self::Error> {
        let rel = inside(&path)?;
        if rel.is_empty() {
            return Err(StatusCode::PermissionDenied);
        }
        let root = self.root.clone();
        blocking(move || root.rmdir(&rel).map_err(|e| status(&e))).await?;
        Ok(ok(id))
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        let rel = inside(&filename)?;
        let root = self.root.clone();
        blocking(move || {
            match root.stat(&rel) {
                Ok(None) => return Err(StatusCode::NoSuchFile),
                Err(e) => return Err(status(&e)),
                Ok(Some(_)) => {}
            }
            root.remove_file(&rel).map_err(|e| status(&e))
        })
        .await?;
        Ok(ok(id))
    }

    async fn rename(
        &mut self,
        id: u32,
        oldpath: String,
        newpath: String,
    ) -> Result<Status, Self::Error> {
        let (from, to) = (inside(&oldpath)?, inside(&newpath)?);
        let root = self.root.clone();
        blocking(move || root.rename(&from, &to, false).map_err(|e| status(&e))).await?;
        Ok(ok(id))
    }

    async fn setstat(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let rel = inside(&path)?;
        let root = self.root.clone();
        let how = set_attrs(&attrs);
        blocking(move || root.set(&rel, how).map_err(|e| status(&e))).await?;
        Ok(ok(id))
    }

    async fn fsetstat(
        &mut self,
        id: u32,
        handle: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let file = self.file(&handle)?;
        let how = set_attrs(&attrs);
        blocking(move || {
            if let Some(size) = how.size {
                file.set_len(size).map_err(|_| StatusCode::Failure)?;
            }
            if let Some(mode) = how.mode {
                rustix::fs::fchmod(&*file, rustix::fs::Mode::from_raw_mode(mode))
                    .map_err(|_| StatusCode::Failure)?;
            }
            if let Some((atime, mtime)) = how.times {
                let at = |s: u32| rustix::fs::Timespec {
                    tv_sec: i64::from(s),
                    tv_nsec: 0,
                };
                rustix::fs::futimens(
                    &*file,
                    &rustix::fs::Timestamps {
                        last_access: at(atime),
                        last_modification: at(mtime),
                    },
                )
                .map_err(|_| StatusCode::Failure)?;
            }
            Ok(())
        })
        .await?;
        Ok(ok(id))
    }

    async fn readlink(&mut self, _id: u32, _path: String) -> Result<Name, Self::Error> {
        Err(StatusCode::PermissionDenied)
    }

    async fn symlink(
        &mut self,
        _id: u32,
        _linkpath: String,
        _targetpath: String,
    ) -> Result<Status, Self::Error> {
        Err(StatusCode::PermissionDenied)
    }
}

/// What a client's attributes ask to change: size, permission bits (never set-uid or
/// set-gid), times.
fn set_attrs(attrs: &FileAttributes) -> SetAttrs {
    SetAttrs {
        size: attrs.size,
        mode: attrs.permissions.map(|m| m & 0o1777),
        times: attrs.atime.zip(attrs.mtime),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_workspace_paths_are_served_and_dots_stay_inside() {
        assert_eq!(inside("/workspace").unwrap(), "");
        assert_eq!(inside("/workspace/").unwrap(), "");
        assert_eq!(inside(".").unwrap(), "");
        assert_eq!(inside("/workspace/a/./b/../c").unwrap(), "a/c");
        assert_eq!(inside("data/x.csv").unwrap(), "data/x.csv");
        assert_eq!(inside("../../etc/passwd").unwrap(), "etc/passwd");
        assert_eq!(inside("/workspace/../etc").unwrap(), "etc");
        for outside in ["/etc/passwd", "/", "/workspaces/x", "/tmp"] {
            assert_eq!(
                inside(outside),
                Err(StatusCode::PermissionDenied),
                "{outside}"
            );
        }
    }
}

#[cfg(test)]
mod session_tests {
    use russh_sftp::server::Handler;

    use super::*;

    #[tokio::test]
    async fn files_go_in_and_out_and_listings_page() {
        let dir = tempfile::tempdir().unwrap();
        let mut sftp = Sftp::new(Root::open(dir.path()).unwrap());
        let write = OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::TRUNCATE;
        let h = sftp
            .open(
                1,
                "/workspace/a.bin".into(),
                write,
                FileAttributes::default(),
            )
            .await
            .unwrap()
            .handle;
        sftp.write(2, h.clone(), 0, b"hello".to_vec())
            .await
            .unwrap();
        sftp.close(3, h).await.unwrap();
        let h = sftp
            .open(
                4,
                "a.bin".into(),
                OpenFlags::READ,
                FileAttributes::default(),
            )
            .await
            .unwrap()
            .handle;
        let data = sftp.read(5, h.clone(), 0, 1024).await.unwrap().data;
        assert_eq!(data, b"hello");
        assert_eq!(sftp.read(6, h, 5, 1024).await.unwrap_err(), StatusCode::Eof);
        // An existing file is not made anew with EXCLUDE; a directory lists, in pages.
        let excl = OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUDE;
        assert!(
            sftp.open(7, "a.bin".into(), excl, FileAttributes::default())
                .await
                .is_err()
        );
        sftp.mkdir(8, "/workspace/d".into(), FileAttributes::default())
            .await
            .unwrap();
        for i in 0..300 {
            std::fs::write(dir.path().join(format!("d/{i:03}")), b"x").unwrap();
        }
        let h = sftp.opendir(9, "d".into()).await.unwrap().handle;
        let first = sftp.readdir(10, h.clone()).await.unwrap().files;
        let second = sftp.readdir(11, h.clone()).await.unwrap().files;
        assert_eq!((first.len(), second.len()), (256, 44));
        assert_eq!(first[0].filename, "000");
        assert_eq!(sftp.readdir(12, h).await.unwrap_err(), StatusCode::Eof);
        // Renames do not replace; a link is neither followed nor made.
        sftp.rename(13, "a.bin".into(), "d/b.bin".into())
            .await
            .unwrap();
        assert!(dir.path().join("d/b.bin").exists());
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        assert!(
            sftp.open(
                14,
                "etc/passwd".into(),
                OpenFlags::READ,
                FileAttributes::default()
            )
            .await
            .is_err()
        );
        assert_eq!(
            sftp.stat(15, "/etc/passwd".into()).await.unwrap_err(),
            StatusCode::PermissionDenied
        );
        assert!(sftp.symlink(16, "x".into(), "/etc".into()).await.is_err());
    }
}
