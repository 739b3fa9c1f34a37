//! The node key file: `<data-dir>/node.key`.
//!
//! Format (text, so a person can tell what it is):
//!
//! ```text
//! gpux node key v1
//! <64 hex digits: the ed25519 secret seed>
//! ```
//!
//! It is created with mode 0600 inside a data directory created with mode 0700, written to a
//! temporary file, flushed to disk and then linked into place, so a crash never leaves a
//! half-written key and an existing key is never overwritten. Loading refuses a key file that
//! group or others can access, naming the file and the fix.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpux_protocol::Keypair;

/// The key file's name inside the data directory.
pub const KEY_FILE_NAME: &str = "node.key";
const HEADER: &str = "gpux node key v1";

/// A key file that cannot be created or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// There is no key file yet.
    #[error("no node key at {path}; run `gpux init --data-dir {dir}` to create one", dir = .path.parent().unwrap_or(Path::new(".")).display(), path = .path.display())]
    Missing {
        /// The key file path.
        path: PathBuf,
    },
    /// `create_key` found a key already there.
    #[error("a node key already exists at {path}; refusing to overwrite it")]
    AlreadyExists {
        /// The key file path.
        path: PathBuf,
    },
    /// Group or others can access the key.
    #[error(
        "key file {path} has mode {mode:04o}: group or others can access it, so the key may be \
         compromised; fix it with `chmod 600 {path}` (and consider creating a new key if others \
         could have read it)",
        path = .path.display()
    )]
    Permissions {
        /// The key file path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The data directory is writable by group or others.
    #[error(
        "data directory {path} has mode {mode:04o}: group or others can write it and could replace the key; fix it with `chmod 700 {path}`",
        path = .path.display()
    )]
    DirPermissions {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Not a regular file.
    #[error("key file {path} is not a regular file", path = .path.display())]
    NotAFile {
        /// The key file path.
        path: PathBuf,
    },
    /// The content is not a gpux key.
    #[error("key file {path} is not a gpux node key ({reason}); move it away and run `gpux init` to create a new one", path = .path.display())]
    Malformed {
        /// The key file path.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// The operating system refused an operation.
    #[error("{action} {path}: {source}", path = .path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// No randomness available to make a key.
    #[error("cannot get randomness from the operating system to create a key: {0}")]
    Random(getrandom::Error),
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> KeyFileError + 'a {
    move |source| KeyFileError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// The key file path for a data directory.
pub fn key_path(data_dir: &Path) -> PathBuf {
    data_dir.join(KEY_FILE_NAME)
}

/// Refuses a data directory that group or others can write: whoever can write it can
/// replace the key.
fn check_dir(data_dir: &Path) -> Result<(), KeyFileError> {
    match fs::metadata(data_dir) {
        Ok(meta) if meta.permissions().mode() & 0o022 != 0 => Err(KeyFileError::DirPermissions {
            path: data_dir.to_path_buf(),
            mode: meta.permissions().mode() & 0o7777,
        }),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("cannot read", data_dir)(e)),
    }
}

/// Loads the node key, refusing a file that group or others can access. The checks are made
/// on the opened file itself (the same inode the path named when it was checked), so the
/// file cannot be swapped between the check and the read.
pub fn load_key(data_dir: &Path) -> Result<Keypair, KeyFileError> {
    check_dir(data_dir)?;
    let path = key_path(data_dir);
    let meta = match fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(KeyFileError::Missing { path });
        }
        Err(e) => return Err(io_err("cannot read", &path)(e)),
    };
    if !meta.is_file() {
        return Err(KeyFileError::NotAFile { path });
    }
    let file = File::open(&path).map_err(io_err("cannot read", &path))?;
    let opened = file.metadata().map_err(io_err("cannot read", &path))?;
    if !opened.is_file() || opened.dev() != meta.dev() || opened.ino() != meta.ino() {
        return Err(KeyFileError::NotAFile { path });
    }
    let mode = opened.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Permissions { path, mode });
    }
    // The key file is tiny; anything larger is not ours (and is not read whole).
    let mut bytes = Vec::with_capacity(128);
    file.take(257)
        .read_to_end(&mut bytes)
        .map_err(io_err("cannot read", &path))?;
    if bytes.len() > 256 {
        return Err(KeyFileError::Malformed {
            path,
            reason: "the file is too large",
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| KeyFileError::Malformed {
        path: path.clone(),
        reason: "the file is not text",
    })?;
    parse(&text).map_err(|reason| KeyFileError::Malformed { path, reason })
}

fn parse(text: &str) -> Result<Keypair, &'static str> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err("the first line is not 'gpux node key v1'");
    }
    let hex = lines.next().ok_or("the key line is missing")?.trim();
    if lines.any(|l| !l.trim().is_empty()) {
        return Err("unexpected lines after the key");
    }
    let bytes = gpux_protocol::unhex(hex).map_err(|_| "the key line is not hex")?;
    let seed: [u8; 32] = bytes.try_into().map_err(|_| "the key is not 32 bytes")?;
    Ok(Keypair::from_seed(&seed))
}

/// Creates a new key in `data_dir` (created with mode 0700 if missing). Fails if a key
/// already exists there.
pub fn create_key(data_dir: &Path) -> Result<Keypair, KeyFileError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .map_err(io_err("cannot create the data directory", data_dir))?;
    check_dir(data_dir)?;
    let path = key_path(data_dir);
    if fs::symlink_metadata(&path).is_ok() {
        return Err(KeyFileError::AlreadyExists { path });
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(KeyFileError::Random)?;
    let keypair = Keypair::from_seed(&seed);
    let content = format!("{HEADER}\n{}\n", gpux_protocol::hex(&seed));
    seed.fill(0);

    // A temporary file of our own (never another process's), flushed, then linked into
    // place: hard_link never overwrites, so if another init won the race its key stays.
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(KeyFileError::Random)?;
    let tmp = data_dir.join(format!(
        "{KEY_FILE_NAME}.tmp.{}.{}",
        std::process::id(),
        gpux_protocol::hex(&nonce)
    ));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("cannot create", &tmp))?;
    let written = file
        .write_all(content.as_bytes())
        .and_then(|()| file.sync_all());
    drop(file);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io_err("cannot write", &tmp)(e));
    }
    let linked = fs::hard_link(&tmp, &path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(KeyFileError::AlreadyExists { path });
        }
        Err(e) => return Err(io_err("cannot create", &path)(e)),
    }
    File::open(data_dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io_err("cannot sync", data_dir))?;
    // What is on disk is what we hand out.
    let stored = load_key(data_dir)?;
    if stored.public() != keypair.public() {
        return Err(KeyFileError::AlreadyExists { path });
    }
    Ok(keypair)
}

/// Loads the key in `data_dir`, or creates one if there is none. Returns the key and whether
/// it was created.
pub fn init_key(data_dir: &Path) -> Result<(Keypair, bool), KeyFileError> {
    match load_key(data_dir) {
        Ok(key) => Ok((key, false)),
        Err(KeyFileError::Missing { .. }) => create_key(data_dir).map(|k| (k, true)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_refuses_garbage() {
        assert!(parse("").is_err());
        assert!(parse("gpux node key v1\n").is_err());
        assert!(parse("gpux node key v1\nzz\n").is_err());
        assert!(parse("gpux node key v1\nabcd\n").is_err());
        assert!(parse(&format!("gpux node key v1\n{}\nmore\n", "00".repeat(32))).is_err());
        assert!(parse(&format!("gpux node key v2\n{}\n", "00".repeat(32))).is_err());
        assert!(parse(&format!("gpux node key v1\n{}\n", "00".repeat(32))).is_ok());
    }
}
