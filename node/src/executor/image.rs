//! The testnet's workload image, built locally: these machines reach no registry.
//!
//! `FROM scratch` plus Debian's static busybox at `/bin/busybox`, one symlink per applet
//! (`/bin/sh`, `/bin/sleep`, ...), and empty `/scratch` and `/tmp` for the tmpfs mounts.
//! The build context is a tar made in memory with fixed owners and times, so Docker's build
//! cache makes a rebuild return the same image id.

use std::path::Path;

use bollard::body_full;
use bollard::query_parameters::BuildImageOptionsBuilder;
use futures::StreamExt;
use gpux_protocol::ImageDigest;

use super::{ExecError, Executor};

/// The tag of the workload image [`build_workload_image`] builds.
pub const WORKLOAD_TAG: &str = "gpux-workload:latest";
/// Where Debian's `busybox-static` package installs busybox.
pub const BUSYBOX_PATH: &str = "/bin/busybox";

const DOCKERFILE: &str = "\
FROM scratch
COPY rootfs/ /
ENV PATH=/bin
USER 65534:65534
CMD [\"sh\"]
";

/// A fixed modification time for every file in the context (any constant would do).
const MTIME: u64 = 1_700_000_000;

/// Builds (or finds in Docker's build cache) the workload image from the static busybox at
/// `busybox`, tags it [`WORKLOAD_TAG`] and returns its image id.
pub async fn build_workload_image(
    executor: &Executor,
    busybox: &Path,
) -> Result<ImageDigest, ExecError> {
    let binary = match tokio::fs::read(busybox).await {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ExecError::BusyboxMissing {
                path: busybox.to_path_buf(),
            });
        }
        Err(source) => {
            return Err(ExecError::Io {
                path: busybox.to_path_buf(),
                source,
            });
        }
    };
    if !is_static_elf(&binary) {
        return Err(ExecError::BusyboxNotStatic {
            path: busybox.to_path_buf(),
        });
    }
    let applets = applets(busybox).await?;
    let context = build_context(&binary, &applets).map_err(|source| ExecError::Io {
        path: busybox.to_path_buf(),
        source,
    })?;

    let options = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(WORKLOAD_TAG)
        .rm(true)
        .forcerm(true)
        .build();
    let mut stream = executor
        .docker()
        .build_image(options, None, Some(body_full(context.into())));
    let mut id = None;
    let mut transcript = String::new();
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| ExecError::Build {
            message: format!("{e}{}", tail(&transcript)),
        })?;
        if let Some(text) = info.stream {
            transcript.push_str(&text);
        }
        if let Some(found) = info.aux.and_then(|aux| aux.id) {
            id = Some(found);
        }
    }
    // The legacy builder reports the id in an `aux` message; ask for the tag otherwise.
    let id = match id {
        Some(id) => id,
        None => executor
            .docker()
            .inspect_image(WORKLOAD_TAG)
            .await
            .map_err(|source| ExecError::Docker {
                op: "inspect image",
                source,
            })?
            .id
            .unwrap_or_default(),
    };
    id.parse().map_err(|e| ExecError::Build {
        message: format!("the daemon reported image id {id:?}: {e}"),
    })
}

fn tail(transcript: &str) -> String {
    let lines: Vec<&str> = transcript.lines().rev().take(5).collect();
    if lines.is_empty() {
        return String::new();
    }
    let lines: Vec<&str> = lines.into_iter().rev().collect();
    format!(" (last build output: {})", lines.join(" | "))
}

/// The applet names busybox provides (`sh`, `sleep`, ...), from `busybox --list`: it is
/// static, so it runs here as it will in the image.
async fn applets(busybox: &Path) -> Result<Vec<String>, ExecError> {
    let output = tokio::process::Command::new(busybox)
        .arg("--list")
        .output()
        .await
        .map_err(|source| ExecError::Io {
            path: busybox.to_path_buf(),
            source,
        })?;
    if !output.status.success() {
        return Err(ExecError::Build {
            message: format!("`{} --list` failed: {}", busybox.display(), output.status),
        });
    }
    let names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty() && n != &"busybox" && !n.contains('/'))
        .map(str::to_string)
        .collect();
    if !names.iter().any(|n| n == "sh") {
        return Err(ExecError::Build {
            message: format!("{} has no `sh` applet", busybox.display()),
        });
    }
    Ok(names)
}

/// The build context: `Dockerfile` and `rootfs/` with `bin/busybox`, applet symlinks and
/// the mount points.
fn build_context(busybox: &[u8], applets: &[String]) -> std::io::Result<Vec<u8>> {
    use tar::{EntryType, Header};

    fn header(kind: EntryType, mode: u32, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(MTIME);
        h.set_uid(0);
        h.set_gid(0);
        h
    }

    let mut tar = tar::Builder::new(Vec::new());
    let mut h = header(EntryType::Regular, 0o644, DOCKERFILE.len() as u64);
    tar.append_data(&mut h, "Dockerfile", DOCKERFILE.as_bytes())?;
    for dir in ["rootfs", "rootfs/bin", "rootfs/scratch", "rootfs/tmp"] {
        let mode = if dir == "rootfs/tmp" || dir == "rootfs/scratch" {
            0o1777
        } else {
            0o755
        };
        let mut h = header(EntryType::Directory, mode, 0);
        tar.append_data(&mut h, dir, std::io::empty())?;
    }
    let mut h = header(EntryType::Regular, 0o755, busybox.len() as u64);
    tar.append_data(&mut h, "rootfs/bin/busybox", busybox)?;
    for name in applets {
        let mut h = header(EntryType::Symlink, 0o777, 0);
        tar.append_link(&mut h, format!("rootfs/bin/{name}"), "busybox")?;
    }
    tar.into_inner()
}

/// Whether `elf` is a 64-bit little-endian ELF executable with no program interpreter
/// (`PT_INTERP`): a dynamically linked busybox would not start in a `FROM scratch` image.
/// Whether `path` is a statically linked busybox that runs in any image.
pub(crate) async fn static_busybox(path: &Path) -> bool {
    tokio::fs::read(path)
        .await
        .is_ok_and(|bytes| is_static_elf(&bytes))
}

fn is_static_elf(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    // Magic, 64-bit class, little-endian.
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(phnum)).all(|i| {
        let at = phoff + i * usize::from(phentsize);
        u32_at(at).is_some_and(|kind| kind != PT_INTERP)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_and_dynamic_executables_are_told_apart() {
        // The test binary itself is dynamically linked.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(!is_static_elf(&me));
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        assert!(!is_static_elf(b""));
        if let Ok(busybox) = std::fs::read(BUSYBOX_PATH) {
            assert!(is_static_elf(&busybox));
        }
    }

    #[test]
    fn the_context_is_deterministic() {
        let applets = vec!["sh".to_string(), "sleep".into()];
        let a = build_context(b"binary", &applets).unwrap();
        let b = build_context(b"binary", &applets).unwrap();
        assert_eq!(a, b);
        let mut archive = tar::Archive::new(&a[..]);
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "Dockerfile",
                "rootfs",
                "rootfs/bin",
                "rootfs/scratch",
                "rootfs/tmp",
                "rootfs/bin/busybox",
                "rootfs/bin/sh",
                "rootfs/bin/sleep"
            ]
        );
    }
}
