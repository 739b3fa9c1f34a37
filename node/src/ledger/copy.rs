//! The ledger's verified copy of its log: an append-only file beside (or away from) the
//! database, from which `gpux ledger restore` rebuilds a damaged database.
//!
//! Each frame is `position (u64 BE) | length (u32 BE) | entry | chain (32 bytes)`, where
//! `chain` is the manifest's hash chain after this entry, so every byte of the file is
//! covered by a hash and a frame proves the whole prefix before it. A frame is appended and
//! synced after the database's flush and before the manifest is written, so the copy is
//! never behind the manifest and never ahead of the database. A kill in the middle of an
//! append leaves a torn last frame, which is dropped when read.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::manifest::Manifest;

/// The copy's default file name, in the data dir.
pub const LEDGER_COPY: &str = "ledger.copy";

/// The largest entry a frame may hold (a log entry is far smaller).
const MAX_FRAME_ENTRY: u32 = 64 * 1024;

/// A frame's fixed part: position, length and chain.
const FRAME_OVERHEAD: usize = 8 + 4 + 32;

/// What a copy holds: its verified entries, and what followed them.
#[derive(Debug, Default)]
pub(crate) struct CopyContents {
    /// `(position, entry)` in order; every one verified by its frame's chain.
    pub(crate) entries: Vec<(u64, Vec<u8>)>,
    /// The chain after the last verified entry.
    pub(crate) manifest: Manifest,
    /// Bytes after the verified entries: a torn last frame (a crash mid-append) when they
    /// are less than a frame, damage otherwise. Says what and where.
    pub(crate) tail: Option<Tail>,
}

/// What follows a copy's verified frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tail {
    /// An incomplete last frame: a crash in the middle of an append.
    Torn,
    /// A complete frame that does not verify, at this byte offset.
    Damaged(u64),
}

impl CopyContents {
    /// Reads a copy; a missing file is an empty copy.
    pub(crate) fn read(path: &Path) -> std::io::Result<CopyContents> {
        let mut bytes = Vec::new();
        match std::fs::File::open(path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(CopyContents::default());
            }
            Err(e) => return Err(e),
        }
        let mut contents = CopyContents::default();
        let mut at = 0usize;
        while at < bytes.len() {
            let rest = &bytes[at..];
            if rest.len() < FRAME_OVERHEAD {
                contents.tail = Some(Tail::Torn);
                break;
            }
            let position = u64::from_be_bytes(rest[..8].try_into().unwrap_or_default());
            let len = u32::from_be_bytes(rest[8..12].try_into().unwrap_or_default());
            if len > MAX_FRAME_ENTRY {
                contents.tail = Some(Tail::Damaged(at as u64));
                break;
            }
            let end = 12 + len as usize + 32;
            if rest.len() < end {
                contents.tail = Some(Tail::Torn);
                break;
            }
            let entry = &rest[12..12 + len as usize];
            let next = contents.manifest.next(position, entry);
            if next.chain[..] != rest[12 + len as usize..end] {
                // The last frame may be torn across sectors by a power loss; a bad frame
                // with more after it is damage.
                contents.tail = Some(if at + end == bytes.len() {
                    Tail::Torn
                } else {
                    Tail::Damaged(at as u64)
                });
                break;
            }
            contents.manifest = next;
            contents.entries.push((position, entry.to_vec()));
            at += end;
        }
        Ok(contents)
    }
}

fn frame(position: u64, entry: &[u8], chain: &[u8; 32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_OVERHEAD + entry.len());
    out.extend_from_slice(&position.to_be_bytes());
    out.extend_from_slice(&(entry.len() as u32).to_be_bytes());
    out.extend_from_slice(entry);
    out.extend_from_slice(chain);
    out
}

/// The copy, open for appending.
#[derive(Debug)]
pub(crate) struct LogCopy {
    path: PathBuf,
    file: std::fs::File,
}

impl LogCopy {
    /// Writes `entries` as a fresh copy (a temporary file, synced, renamed over the old one)
    /// and opens it for appending.
    pub(crate) fn rewrite(path: &Path, entries: &[(u64, Vec<u8>)]) -> std::io::Result<LogCopy> {
        let tmp = path.with_extension("copy-tmp");
        {
            let mut file = std::fs::File::create(&tmp)?;
            let mut chain = Manifest::default();
            let mut out = Vec::new();
            for (at, entry) in entries {
                chain = chain.next(*at, entry);
                out.extend_from_slice(&frame(*at, entry, &chain.chain));
            }
            file.write_all(&out)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        sync_dir(path)?;
        Self::append_to(path)
    }

    /// Opens a copy for appending (creating it), dropping a torn last frame first.
    pub(crate) fn reopen_or_create(path: &Path, verified_len: u64) -> std::io::Result<LogCopy> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() != verified_len {
            file.set_len(verified_len)?;
            file.sync_all()?;
        }
        drop(file);
        Self::append_to(path)
    }

    fn append_to(path: &Path) -> std::io::Result<LogCopy> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)?;
        Ok(LogCopy {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends one entry with the chain after it, and syncs it to disk.
    pub(crate) fn append(
        &mut self,
        position: u64,
        entry: &[u8],
        chain: &[u8; 32],
    ) -> std::io::Result<()> {
        self.file.write_all(&frame(position, entry, chain))?;
        self.file.sync_data()
    }

    /// Where the copy is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// The byte length of the verified frames of `entries`.
pub(crate) fn frames_len(entries: &[(u64, Vec<u8>)]) -> u64 {
    entries
        .iter()
        .map(|(_, e)| (FRAME_OVERHEAD + e.len()) as u64)
        .sum()
}

pub(super) fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_reads_back_its_entries_and_tells_a_torn_tail_from_damage() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(LEDGER_COPY);
        let entries: Vec<(u64, Vec<u8>)> = (1..=4)
            .map(|i| (i, vec![i as u8; 10 + i as usize]))
            .collect();
        let mut copy = LogCopy::rewrite(&path, &entries[..2]).unwrap();
        let mut chain = CopyContents::read(&path).unwrap().manifest;
        for (at, e) in &entries[2..] {
            chain = chain.next(*at, e);
            copy.append(*at, e, &chain.chain).unwrap();
        }
        let read = CopyContents::read(&path).unwrap();
        assert_eq!(read.entries, entries);
        assert_eq!(read.tail, None);
        assert_eq!(read.manifest, chain);
        let full = std::fs::read(&path).unwrap();

        // A kill mid-append: the torn frame is dropped, the rest is whole.
        std::fs::write(&path, &full[..full.len() - 5]).unwrap();
        let read = CopyContents::read(&path).unwrap();
        assert_eq!(read.entries, entries[..3]);
        assert_eq!(read.tail, Some(Tail::Torn));
        LogCopy::reopen_or_create(&path, frames_len(&read.entries)).unwrap();
        assert_eq!(CopyContents::read(&path).unwrap().tail, None);

        // A flipped byte in the middle: the frames before it stand, the rest is damage.
        let mut damaged = full.clone();
        let second = FRAME_OVERHEAD + 11 + 3;
        damaged[second] ^= 0x40;
        std::fs::write(&path, &damaged).unwrap();
        let read = CopyContents::read(&path).unwrap();
        assert_eq!(read.entries, entries[..1]);
        assert_eq!(read.tail, Some(Tail::Damaged((FRAME_OVERHEAD + 11) as u64)));
    }
}
