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
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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

/// Loads the node key, refusing a file that group or others can access.
pub fn load_key(data_dir: &Path) -> Result<Keypair, KeyFileError> {
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
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Permissions { path, mode });
    }
    // The key file is tiny; anything larger is not ours (and is not read whole).
    if meta.len() > 256 {
        return Err(KeyFileError::Malformed {
            path,
            reason: "the file is too large",
        });
    }
    let text = fs::read_to_string(&path).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => KeyFileError::Malformed {
            path: path.clone(),
            reason: "the file is not text",
        },
        _ => io_err("cannot read", &path)(e),
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
    let path = key_path(data_dir);
    if fs::symlink_metadata(&path).is_ok() {
        return Err(KeyFileError::AlreadyExists { path });
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(KeyFileError::Random)?;
    let keypair = Keypair::from_seed(&seed);
    let content = format!("{HEADER}\n{}\n", gpux_protocol::hex(&seed));
    seed.fill(0);

    let tmp = data_dir.join(format!("{KEY_FILE_NAME}.tmp"));
    // A leftover from a crash during an earlier init holds no key anyone uses.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("cannot remove", &tmp)(e)),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("cannot create", &tmp))?;
    file.write_all(content.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_err("cannot write", &tmp))?;
    drop(file);
    // hard_link never overwrites: if another init won the race, its key stays.
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
