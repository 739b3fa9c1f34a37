//! The host's side of `/gpux/files/1`: `gpux cp` in and out of a lease's workspace.
//!
//! The host works on the workspace's filesystem itself (its mount on the host), never
//! through the container: nothing with GPU access is involved, and it works the same while
//! the workload runs. Every path goes through [`super::confined`].
//!
//! A put lands in `.<name>.gpux-part` beside its target and becomes the target only once
//! the whole file hashes (blake3) to what the renter announced; an interrupted put leaves the
//! part, and the next put of that file goes on from its end. A get announces the whole
//! file's size and hash and sends from the offset the renter has.

use std::io::{Seek, SeekFrom};
use std::path::PathBuf;

use bytes::Bytes;
use futures::SinkExt;
use gpux_protocol::plane_wire::{
    self, Entry, EntryKind, FilesError, FilesRequest, FilesResponse, MAX_FILE_DATA, MAX_LIST_PAGE,
};
use gpux_protocol::{BoundedBytes, BoundedString, BoundedVec};
use tokio::io::AsyncReadExt;

use super::confined::{PathError, Root};
use super::{FramedStream, IDLE, PlaneError, recv, send};

/// The most entries a listing walks.
pub(crate) const MAX_LISTED: usize = 100_000;

/// The name of a put's part file, beside its target.
pub(crate) fn part_of(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((parent, name)) => format!("{parent}/.{name}.gpux-part"),
        None => format!(".{path}.gpux-part"),
    }
}

fn kind_of(stat: &rustix::fs::Stat) -> EntryKind {
    use rustix::fs::FileType;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => EntryKind::File(u64::try_from(stat.st_size).unwrap_or(0)),
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

fn failure(e: &PathError) -> FilesResponse {
    let code = match e {
        PathError::Invalid(_) => FilesError::Invalid,
        PathError::Outside(_) => FilesError::OutsideWorkspace,
        e if e.is_no_space() => FilesError::NoSpace,
        e if e.kind() == Some(std::io::ErrorKind::NotFound) => FilesError::NotFound,
        e if e.kind() == Some(std::io::ErrorKind::NotADirectory) => FilesError::WrongKind,
        _ => FilesError::Io,
    };
    FilesResponse::failed(code, &e.to_string())
}

/// blake3 of a whole file, read from its start.
fn hash_file(file: &mut std::fs::File) -> std::io::Result<[u8; 32]> {
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(&mut *file)?;
    Ok(*hasher.finalize().as_bytes())
}

/// Runs blocking filesystem work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PlaneError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PlaneError::Io(std::io::Error::other(e.to_string())))
}

/// Serves one files stream on the workspace mounted at `dir` until the renter closes it.
pub(crate) async fn serve(dir: PathBuf, mut framed: FramedStream) -> Result<(), PlaneError> {
    let root = std::sync::Arc::new(blocking(move || Root::open(&dir)).await??);
    loop {
        let request = match recv::<FilesRequest>(&mut framed, IDLE).await {
            Ok(r) => r,
            Err(PlaneError::Closed) => return Ok(()),
            Err(e) => return Err(e),
        };
        match request {
            FilesRequest::Stat { path } => {
                let r = root.clone();
                let answer = match blocking(move || r.stat(&path)).await? {
                    Ok(stat) => FilesResponse::Stat(stat.as_ref().map(kind_of)),
                    Err(e) => failure(&e),
                };
                send(&mut framed, &answer).await?;
            }
            FilesRequest::List { path } => {
                let r = root.clone();
                match blocking(move || r.walk(&path, MAX_LISTED)).await? {
                    Ok(all) => list(&mut framed, all).await?,
                    Err(e) => send(&mut framed, &failure(&e)).await?,
                }
            }
            FilesRequest::Mkdir { path } => {
                let r = root.clone();
                let answer = match blocking(move || r.mkdir_all(&path)).await? {
                    Ok(()) => FilesResponse::Done,
                    Err(e) => failure(&e),
                };
                send(&mut framed, &answer).await?;
            }
            FilesRequest::Put { path, size, hash } => {
                // A put that fails part-way leaves the stream in the middle of its data.
                if !put(&root, &mut framed, path.to_string(), size, hash).await? {
                    return Ok(());
                }
            }
            FilesRequest::Get { path, offset } => {
                get(&root, &mut framed, path.to_string(), offset).await?;
            }
            FilesRequest::Data(_) => {
                let answer = FilesResponse::failed(FilesError::Invalid, "data outside a put");
                send(&mut framed, &answer).await?;
                return Ok(());
            }
        }
    }
}

async fn list(
    framed: &mut FramedStream,
    all: Vec<(String, rustix::fs::Stat)>,
) -> Result<(), PlaneError> {
    let mut entries: Vec<Entry> = all
        .into_iter()
        .filter_map(|(path, stat)| {
            Some(Entry {
                path: BoundedString::new(path).ok()?,
                kind: kind_of(&stat),
            })
        })
        .collect();
    loop {
        let rest = entries.split_off(entries.len().min(MAX_LIST_PAGE));
        let page = std::mem::replace(&mut entries, rest);
        let more = !entries.is_empty();
        // At most a page by construction.
        let entries_page = BoundedVec::new(page)
            .map_err(|e| PlaneError::Io(std::io::Error::other(e.to_string())))?;
        send(
            framed,
            &FilesResponse::Entries {
                entries: entries_page,
                more,
            },
        )
        .await?;
        if !more {
            return Ok(());
        }
    }
}

/// One put. Returns whether the stream can go on (false: it was left mid-data).
async fn put(
    root: &std::sync::Arc<Root>,
    framed: &mut FramedStream,
    path: String,
    size: u64,
    hash: [u8; 32],
) -> Result<bool, PlaneError> {
    // Already there with this content: nothing to send.
    let (r, p) = (root.clone(), path.clone());
    let have = blocking(move || {
        let mut file = r.open_read(&p).ok()?;
        let len = file.metadata().ok()?.len();
        (len == size).then(|| hash_file(&mut file).ok()).flatten()
    })
    .await?;
    if have == Some(hash) {
        send(framed, &FilesResponse::Have).await?;
        return Ok(true);
    }
    let part = part_of(&path);
    let (r, pp) = (root.clone(), part.clone());
    let opened = blocking(move || -> Result<(std::fs::File, u64), PathError> {
        let file = r.open_write(&pp)?;
        let len = file
            .metadata()
            .map_err(|e| PathError::Io(pp.clone(), e))?
            .len();
        // A part longer than the file is from another version of it.
        if len > size {
            file.set_len(0).map_err(|e| PathError::Io(pp.clone(), e))?;
            return Ok((file, 0));
        }
        Ok((file, len))
    })
    .await?;
    let (file, offset) = match opened {
        Ok(ok) => ok,
        Err(e) => {
            send(framed, &failure(&e)).await?;
            return Ok(true);
        }
    };
    send(framed, &FilesResponse::PutFrom(offset)).await?;
    let mut file = tokio::fs::File::from_std(file);
    tokio::io::AsyncSeekExt::seek(&mut file, SeekFrom::Start(offset)).await?;
    let mut at = offset;
    let mut writer = tokio::io::BufWriter::with_capacity(1 << 20, file);
    while at < size {
        let frame = recv::<FilesRequest>(framed, IDLE).await?;
        let FilesRequest::Data(data) = frame else {
            let answer = FilesResponse::failed(FilesError::Invalid, "a put's data was cut short");
            send(framed, &answer).await?;
            return Ok(false);
        };
        if at + data.len() as u64 > size {
            let answer = FilesResponse::failed(FilesError::Invalid, "more data than announced");
            send(framed, &answer).await?;
            return Ok(false);
        }
        if let Err(e) = tokio::io::AsyncWriteExt::write_all(&mut writer, &data).await {
            let e = PathError::Io(part.clone(), e);
            let _ = send(framed, &failure(&e)).await;
            let (r, pp) = (root.clone(), part.clone());
            let _ = blocking(move || r.remove_file(&pp)).await;
            return Ok(false);
        }
        at += data.len() as u64;
    }
    if let Err(e) = tokio::io::AsyncWriteExt::flush(&mut writer).await {
        let e = PathError::Io(part.clone(), e);
        send(framed, &failure(&e)).await?;
        return Ok(true);
    }
    drop(writer.into_inner().into_std().await);
    let (r, pp, p) = (root.clone(), part.clone(), path.clone());
    let answer = blocking(move || {
        let mut check = r.open_read(&pp).map_err(|e| failure(&e))?;
        let got = hash_file(&mut check).map_err(|e| failure(&PathError::Io(pp.clone(), e)))?;
        if got != hash {
            let _ = r.remove_file(&pp);
            return Err(FilesResponse::failed(
                FilesError::HashMismatch,
                "the file's bytes do not hash to what was announced; it was not stored",
            ));
        }
        r.rename_in_place(&pp, &p).map_err(|e| failure(&e))?;
        Ok(FilesResponse::Done)
    })
    .await?
    .unwrap_or_else(|failed| failed);
    send(framed, &answer).await?;
    Ok(true)
}

/// One get: the file's size and hash, then its bytes from `offset`.
async fn get(
    root: &std::sync::Arc<Root>,
    framed: &mut FramedStream,
    path: String,
    offset: u64,
) -> Result<(), PlaneError> {
    let r = root.clone();
    let opened = blocking(
        move || -> Result<(std::fs::File, u64, [u8; 32]), PathError> {
            let mut file = r.open_read(&path)?;
            let size = file
                .metadata()
                .map_err(|e| PathError::Io(path.clone(), e))?
                .len();
            let hash = hash_file(&mut file).map_err(|e| PathError::Io(path.clone(), e))?;
            Ok((file, size, hash))
        },
    )
    .await?;
    let (file, size, hash) = match opened {
        Ok(ok) => ok,
        Err(e) => return send(framed, &failure(&e)).await,
    };
    if offset > size {
        let answer = FilesResponse::failed(FilesError::Invalid, "an offset past the file's end");
        return send(framed, &answer).await;
    }
    send(framed, &FilesResponse::Sending { size, hash }).await?;
    let mut file = tokio::fs::File::from_std(file);
    tokio::io::AsyncSeekExt::seek(&mut file, SeekFrom::Start(offset)).await?;
    let mut reader = tokio::io::BufReader::with_capacity(1 << 20, file);
    let mut left = size - offset;
    let mut buf = vec![0u8; MAX_FILE_DATA];
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = reader.read(&mut buf[..want]).await?;
        if n == 0 {
            let answer = FilesResponse::failed(
                FilesError::HashMismatch,
                "the file shrank while it was sent",
            );
            return send(framed, &answer).await;
        }
        let data = BoundedBytes::new(buf[..n].to_vec()).unwrap_or_default();
        framed
            .feed(Bytes::from(plane_wire::encode(&FilesResponse::Data(data))))
            .await?;
        left -= n as u64;
    }
    SinkExt::<Bytes>::flush(framed).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_sit_beside_their_file() {
        assert_eq!(part_of("a/b/c.bin"), "a/b/.c.bin.gpux-part");
        assert_eq!(part_of("c.bin"), ".c.bin.gpux-part");
    }
}
