//! Per-lease workspaces: a `/workspace` of exactly the size the lease signed, on its own
//! loop-mounted ext4 image, so writing past it fails with `ENOSPC` inside the container and
//! never touches the rest of the host's disk.
//!
//! Docker's local volume driver enforces sizes only on tmpfs (RAM), and `--storage-opt size`
//! needs xfs with project quotas; a filesystem image per lease enforces the size anywhere.
//! Each lease gets, under `<data-dir>/workspaces/<lease>/`:
//!
//! - `disk.img`: `fallocate`d to the full size (blocks reserved up front, so a full host disk
//!   can never surface as I/O errors inside a lease), formatted ext4 with no root reserve and
//!   its root directory owned by the workload's user;
//! - `mnt/`: where it is mounted (`loop,nodev,nosuid`), bound into the container at
//!   `/workspace`.
//!
//! The standard tools do the work (`fallocate`, `mkfs.ext4`, `mount`, `umount`): they are on
//! every Linux host, and mounting needs root (a host that is not root offers no workspaces).
//! [`Workspaces::remove`] unmounts and deletes it, and checks it is gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ExecError;

/// Where a lease's workspace appears in its container.
pub const WORKSPACE_DIR: &str = "/workspace";
/// The smallest workspace (ext4's own structures need a few MiB).
pub const MIN_WORKSPACE_BYTES: u64 = 16 << 20;
/// How long a workspace outlives its lease when the lease does not say (seconds).
pub const DEFAULT_RETAIN_S: u64 = gpux_protocol::DEFAULT_RETAIN_S;
/// The file beside a retained workspace saying until when (unix ms).
const RETAIN_FILE: &str = "retain-until";

/// The workspaces of one host's leases.
#[derive(Debug, Clone)]
pub struct Workspaces {
    root: PathBuf,
}

async fn run(program: &str, args: &[&str]) -> Result<(), ExecError> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|source| ExecError::Io {
            path: PathBuf::from(program),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ExecError::Workspace {
            reason: format!(
                "{program} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// `dir` as `/proc/self/mountinfo` names it: absolute, with its links resolved (the kernel
/// names a mount by where it really is), and with space, tab, newline and backslash written
/// as octal escapes.
fn mountinfo_name(dir: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let mut name = String::new();
    for c in dir.to_str()?.chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => name.push_str(&format!("\\{:03o}", c as u32)),
            c => name.push(c),
        }
    }
    Some(name)
}

/// The line of `/proc/self/mountinfo` that mounts something at `dir`, the last one (a
/// mount over another hides it).
fn mountinfo_line(dir: &Path) -> Option<String> {
    let want = mountinfo_name(dir)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(want.as_str()))
        .map(String::from)
}

/// Whether `dir` is a mount point now (from `/proc/self/mountinfo`).
fn is_mounted(dir: &Path) -> bool {
    mountinfo_line(dir).is_some()
}

/// The device mounted at `dir` (`/dev/loop3`), from `/proc/self/mountinfo`.
fn mounted_device(dir: &Path) -> Option<String> {
    mountinfo_line(dir)?
        .split_once(" - ")?
        .1
        .split(' ')
        .nth(1)
        .map(String::from)
}

impl Workspaces {
    /// The workspaces under `root` (created when the first one is).
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// Whether this host can make workspaces: it runs as root and has `mkfs.ext4`.
    pub fn supported() -> bool {
        rustix::process::geteuid().is_root()
            && ["/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"]
                .iter()
                .any(|p| Path::new(p).exists())
    }

    fn dir(&self, lease: &str) -> PathBuf {
        self.root.join(lease)
    }

    /// Whether `dir` (a workspace's mount point) is mounted now.
    pub fn is_mounted(&self, dir: &Path) -> bool {
        is_mounted(dir)
    }

    /// Where lease `lease`'s workspace is mounted on the host.
    pub fn mount_point(&self, lease: &str) -> PathBuf {
        self.dir(lease).join("mnt")
    }

    /// Makes and mounts lease `lease`'s workspace of `bytes`; returns its mount point. A
    /// workspace already mounted (a host restarted) is kept as it is.
    pub async fn create(&self, lease: &str, bytes: u64) -> Result<PathBuf, ExecError> {
        if lease.is_empty() || !lease.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ExecError::InvalidSpec {
                reason: format!("lease label {lease:?} is not hex"),
            });
        }
        if bytes < MIN_WORKSPACE_BYTES {
            return Err(ExecError::InvalidSpec {
                reason: format!("a workspace has at least {MIN_WORKSPACE_BYTES} bytes"),
            });
        }
        let dir = self.dir(lease);
        let mnt = self.mount_point(lease);
        if is_mounted(&mnt) {
            return Ok(mnt);
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ExecError::Io { path, source }
        };
        tokio::fs::create_dir_all(&mnt).await.map_err(io(&mnt))?;
        let image = dir.join("disk.img");
        let image_s = image.display().to_string();
        let mnt_s = mnt.display().to_string();
        // A half-made image from a crash is made again.
        let _ = tokio::fs::remove_file(&image).await;
        run("fallocate", &["-l", &bytes.to_string(), &image_s]).await?;
        // `nodiscard`: mkfs.ext4 otherwise discards the whole device first, which on an
        // image file punches holes, making it sparse again (a 512 MiB workspace held 17 MB
        // of the host's disk); the blocks `fallocate` reserved must stay reserved. Inode
        // tables and journal are zeroed by mkfs, not later: ext4's lazy init zeroes them in
        // the background after the mount, which on a loop device punches them out of the
        // image (about 19 MB of a 1200 MiB workspace, measured).
        let extended = format!(
            "root_owner={},nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            super::WORKLOAD_USER
        );
        run(
            "mkfs.ext4",
            &[
                "-F", "-q", "-m", "0", "-E", &extended, "-L", "gpux-ws", &image_s,
            ],
        )
        .await?;
        // Whatever mkfs zeroed by punching is reserved again (holes only: data is kept).
        run("fallocate", &["-l", &bytes.to_string(), &image_s]).await?;
        run("mount", &["-o", "loop,nodev,nosuid", &image_s, &mnt_s]).await?;
        // The loop device reads and writes its image with direct I/O where the filesystem
        // below allows it: the workspace's data is then cached once (by the workspace's
        // ext4), not a second time as the image file's pages. Where it does not (tmpfs),
        // the device stays as it is.
        if let Some(device) = mounted_device(&mnt).filter(|d| d.starts_with("/dev/loop"))
            && let Err(e) = run("losetup", &["--direct-io=on", &device]).await
        {
            tracing::debug!("workspace {lease}: {e}");
        }
        // ext4's lost+found is root's and useless to the workload.
        let _ = tokio::fs::remove_dir(mnt.join("lost+found")).await;
        Ok(mnt)
    }

    /// Unmounts and deletes lease `lease`'s workspace, if it has one; checks nothing is
    /// left.
    pub async fn remove(&self, lease: &str) -> Result<(), ExecError> {
        let dir = self.dir(lease);
        let mnt = self.mount_point(lease);
        let mnt_s = mnt.display().to_string();
        for attempt in 0..10 {
            if !is_mounted(&mnt) {
                break;
            }
            // Busy for a moment after its container went (the kernel drops its last
            // references asynchronously); lazily at the last try.
            let lazy = attempt == 9;
            let args: &[&str] = if lazy { &["-l", &mnt_s] } else { &[&mnt_s] };
            if run("umount", args).await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        match tokio::fs::remove_dir_all(&dir).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ExecError::Io { path: dir, source }),
        }
        if dir.exists() || is_mounted(&mnt) {
            return Err(ExecError::Workspace {
                reason: format!("{} is still there after its removal", dir.display()),
            });
        }
        Ok(())
    }

    /// Keeps lease `lease`'s workspace until `until_ms` (unix ms): written beside it, so a
    /// restarted host still knows when to erase it.
    pub async fn retain(&self, lease: &str, until_ms: u64) -> Result<(), ExecError> {
        let path = self.dir(lease).join(RETAIN_FILE);
        tokio::fs::write(&path, until_ms.to_string())
            .await
            .map_err(|source| ExecError::Io { path, source })
    }

    /// Erases lease `lease`'s workspace at `until_ms` (unix ms; at once if that has passed),
    /// in a task of its own.
    pub fn erase_at(&self, lease: &str, until_ms: u64) {
        let (workspaces, lease) = (self.clone(), lease.to_string());
        tokio::spawn(async move {
            let now = crate::attest::now().0;
            tokio::time::sleep(Duration::from_millis(until_ms.saturating_sub(now))).await;
            match workspaces.remove(&lease).await {
                Ok(()) => tracing::info!("lease {lease}: its workspace's retention ended; erased"),
                Err(e) => tracing::error!("lease {lease}: erasing its workspace: {e}"),
            }
        });
    }

    /// Until when lease `lease`'s workspace is kept after its lease (unix ms), if it is.
    pub fn retained_until(&self, lease: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir(lease).join(RETAIN_FILE))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The host disk's bytes that lease `lease`'s workspace image holds (its allocated
    /// blocks; 0 when it has none).
    pub fn allocated(&self, lease: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.dir(lease).join("disk.img")).map_or(0, |m| m.blocks() * 512)
    }

    /// Bytes free for new workspaces on the filesystem that holds them (where it does not
    /// exist yet, on the nearest directory above it).
    pub fn disk_free(&self) -> std::io::Result<u64> {
        let mut at = self.root.as_path();
        while !at.exists() {
            at = at.parent().unwrap_or(Path::new("/"));
        }
        let stat = rustix::fs::statvfs(at)?;
        Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    /// The size of lease `lease`'s workspace image, bytes (0 when it has none).
    pub fn bytes(&self, lease: &str) -> u64 {
        std::fs::metadata(self.dir(lease).join("disk.img")).map_or(0, |m| m.len())
    }

    /// The leases (hex) that have a workspace here.
    pub fn leases(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut leases: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect();
        leases.sort();
        leases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_are_found_by_any_path_to_them() {
        // A relative path, through `..`, names the mount the kernel lists as /proc.
        let cwd = std::env::current_dir().unwrap();
        let up: PathBuf = cwd.components().skip(1).map(|_| "..").collect();
        let relative = up.join("proc");
        assert!(relative.is_relative());
        assert!(is_mounted(&relative), "{}", relative.display());
        assert!(is_mounted(Path::new("/proc/")));
        assert!(!is_mounted(&cwd.join("no-such-dir")));
        // The kernel escapes a mount point's spaces and backslashes.
        let tmp = tempfile::tempdir().unwrap();
        let odd = tmp.path().join("a b\\c");
        std::fs::create_dir(&odd).unwrap();
        let name = mountinfo_name(&odd).unwrap();
        assert!(name.ends_with("/a\\040b\\134c"), "{name}");
        assert!(!is_mounted(&odd));
    }
}
