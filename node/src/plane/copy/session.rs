//! One files stream to the host, as the renter's node drives it: stat, mkdir, list, and a
//! file's put and get with their part files and end-to-end hashes.

use std::path::Path;
use std::pin::Pin;

use bytes::Bytes;
use futures::{Sink, SinkExt, Stream, StreamExt};
use gpux_protocol::BoundedString;
use gpux_protocol::plane_wire::{
    self, Entry, EntryKind, FilesError, FilesRequest, FilesResponse, WorkspacePath,
};

use super::error::{CopyError, Progress, local};
use super::local::{LocalDir, hash_local};
use crate::plane::chunks::{Cache, read_chunks, write_chunks};
use crate::plane::confined::{PathError, go_on_from, part_of};
use crate::plane::files::{MAX_LISTED, MAX_LISTED_PATH_BYTES};
use crate::plane::{FramedStream, IDLE, Incoming};

fn wpath(path: &str) -> Result<WorkspacePath, CopyError> {
    BoundedString::new(path).map_err(|e| CopyError::Usage(format!("{path}: {e}")))
}

/// Where a session's frames go: the host's `/gpux/files/1` stream.
type FrameSink = Pin<Box<dyn Sink<Bytes, Error = CopyError> + Send>>;
/// Where a session's frames come from.
type FrameSource = Pin<Box<dyn Stream<Item = Result<Bytes, CopyError>> + Send>>;

/// One files stream.
pub(super) struct Session {
    tx: FrameSink,
    rx: FrameSource,
}

fn link(e: impl std::fmt::Display) -> CopyError {
    CopyError::Link(e.to_string())
}

impl Session {
    /// Straight over a `/gpux/files/1` stream to the host, already opened.
    pub(super) fn over(stream: FramedStream) -> Session {
        let (tx, rx) = stream.split();
        Session {
            tx: Box::pin(tx.sink_map_err(link)),
            rx: Box::pin(rx.map(|frame| frame.map(bytes::BytesMut::freeze).map_err(link))),
        }
    }

    async fn send(&mut self, request: &FilesRequest) -> Result<(), CopyError> {
        stalled(
            tokio::time::timeout(IDLE, self.tx.send(Bytes::from(plane_wire::encode(request))))
                .await,
        )
    }

    async fn recv(&mut self) -> Result<FilesResponse, CopyError> {
        match self.recv_data().await? {
            Incoming::Frame(answer) => Ok(answer),
            Incoming::Data(_) => Err(CopyError::Link("data out of turn".into())),
        }
    }

    /// The next frame, a data frame's bytes in place.
    async fn recv_data(&mut self) -> Result<Incoming<FilesResponse>, CopyError> {
        match tokio::time::timeout(IDLE, self.rx.next()).await {
            Ok(Some(Ok(bytes))) => Incoming::of(bytes).map_err(link),
            Ok(Some(Err(e))) => Err(e),
            Ok(None) => Err(CopyError::Link("the host closed the stream".into())),
            Err(_) => Err(stall()),
        }
    }

    async fn ask(&mut self, request: &FilesRequest) -> Result<FilesResponse, CopyError> {
        self.send(request).await?;
        self.recv().await
    }

    pub(super) async fn stat(&mut self, path: &str) -> Result<Option<EntryKind>, CopyError> {
        match self.ask(&FilesRequest::Stat { path: wpath(path)? }).await? {
            FilesResponse::Stat(kind) => Ok(kind),
            other => Err(unexpected(path, other)),
        }
    }

    pub(super) async fn mkdir(&mut self, path: &str) -> Result<(), CopyError> {
        match self
            .ask(&FilesRequest::Mkdir { path: wpath(path)? })
            .await?
        {
            FilesResponse::Done => Ok(()),
            other => Err(unexpected(path, other)),
        }
    }

    pub(super) async fn list(&mut self, path: &str) -> Result<Vec<Entry>, CopyError> {
        self.send(&FilesRequest::List { path: wpath(path)? })
            .await?;
        let (mut all, mut path_bytes) = (Vec::new(), 0);
        loop {
            match self.recv().await? {
                FilesResponse::Entries { entries, more } => {
                    if entries.is_empty() && more {
                        return Err(CopyError::Link(format!(
                            "the host sent an empty page of the listing of {path:?}"
                        )));
                    }
                    path_bytes += entries.iter().map(|e| e.path.len()).sum::<usize>();
                    all.extend(entries.into_inner());
                    // A host lists at most this much; one that goes on is not believed.
                    if all.len() > MAX_LISTED || path_bytes > MAX_LISTED_PATH_BYTES {
                        return Err(CopyError::Link(format!(
                            "the host listed more than {MAX_LISTED} entries or {} MiB of \
                             paths under {path:?}",
                            MAX_LISTED_PATH_BYTES >> 20
                        )));
                    }
                    if !more {
                        return Ok(all);
                    }
                }
                other => return Err(unexpected(path, other)),
            }
        }
    }

    /// Puts one local file; returns the bytes sent. The file is read once: its first bytes
    /// only to compare with what the host holds, the rest as they are sent, hashed as they
    /// go.
    pub(super) async fn put(
        &mut self,
        from: &Path,
        to: &str,
        size: u64,
        progress: &dyn Progress,
    ) -> Result<u64, CopyError> {
        let request = FilesRequest::Put {
            path: wpath(to)?,
            size,
        };
        let (held, theirs) = match self.ask(&request).await? {
            FilesResponse::Holding { len, hash } if len <= size => (len, hash),
            other => return Err(unexpected(to, other)),
        };
        let (mut hasher, mut offset) = (blake3::Hasher::new(), 0);
        if held > 0 {
            let ours = hash_local(from, held).await?;
            if *ours.finalize().as_bytes() == theirs {
                (hasher, offset) = (ours, held);
            }
        }
        self.send(&FilesRequest::PutFrom(offset)).await?;
        progress.advance(offset);
        let file = std::fs::File::open(from).map_err(local(from))?;
        let mut reader = read_chunks::<FilesRequest>(file, offset, size - offset, hasher);
        while let Some(chunk) = reader.next().await {
            let chunk = chunk.map_err(|e| CopyError::Local {
                path: from.to_path_buf(),
                source: if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    std::io::Error::other("the file shrank while it was copied")
                } else {
                    e
                },
            })?;
            let (n, frame) = (chunk.len, Bytes::from(chunk.frame));
            // The host answers early only to fail (its disk is full, say).
            tokio::select! {
                biased;
                early = self.rx.next() => {
                    let answer = match early {
                        Some(Ok(bytes)) => plane_wire::decode(&bytes).ok(),
                        _ => None,
                    };
                    return Err(match answer {
                        Some(answer) => unexpected(to, answer),
                        None => CopyError::Link("the host closed the stream".into()),
                    });
                }
                sent = tokio::time::timeout(IDLE, self.tx.feed(frame)) => stalled(sent)?,
            }
            progress.advance(n as u64);
        }
        let hasher = reader.finish().await.map_err(local(from))?;
        self.send(&FilesRequest::PutEnd(*hasher.finalize().as_bytes()))
            .await?;
        match self.recv().await? {
            FilesResponse::Done => Ok(size - offset),
            other => Err(unexpected(to, other)),
        }
    }

    /// Gets one file, listed at `listed` bytes, into `to` under `dir`; returns its size and
    /// the bytes received. What an interrupted get left is hashed once to go on from it;
    /// the rest is hashed as it is written, and compared with the host's hash of the file
    /// as it read it. A file already at `to` at the listed size, with no part beside it, is
    /// offered the same way: when the host's file hashes the same, nothing is sent (a copy
    /// of a tree run again after an interruption sends only the files it lacks).
    pub(super) async fn get(
        &mut self,
        from: &str,
        dir: &LocalDir,
        to: &str,
        listed: u64,
        progress: &dyn Progress,
    ) -> Result<(u64, u64), CopyError> {
        let part = part_of(to);
        let part_len = dir.file_len(&part).await?.unwrap_or(0);
        let whole = part_len == 0 && listed > 0 && dir.file_len(to).await? == Some(listed);
        let (held_at, have) = if whole {
            (to, listed)
        } else {
            (part.as_str(), part_len)
        };
        let held = if have > 0 {
            dir.hash(held_at, have).await?
        } else {
            blake3::Hasher::new()
        };
        let request = FilesRequest::Get {
            path: wpath(from)?,
            offset: have,
            hash: *held.finalize().as_bytes(),
        };
        let (size, start) = match self.ask(&request).await? {
            FilesResponse::Sending { size, from: start }
                if start <= size && (start == have || start == 0) =>
            {
                (size, start)
            }
            other => return Err(unexpected(from, other)),
        };
        // The host's bytes differ from the part's (or the file is shorter now): start over.
        let hasher = if start == have {
            held
        } else {
            blake3::Hasher::new()
        };
        progress.advance(start);
        let go_on_from_whole = whole && start == have;
        if go_on_from_whole && size == have {
            // The file is here already: only the host's hash of it comes.
            return match self.recv().await? {
                FilesResponse::End(hash) if hash == *hasher.finalize().as_bytes() => Ok((size, 0)),
                FilesResponse::End(_) => Err(CopyError::Remote {
                    path: from.to_string(),
                    code: FilesError::HashMismatch,
                    detail: "the file changed on the host while it was compared; copy again".into(),
                }),
                other => Err(unexpected(from, other)),
            };
        }
        // The host says how much comes: it must fit before a byte is written.
        let copied = if go_on_from_whole { have } else { 0 };
        dir.room_for(to, (size - start).saturating_add(copied))
            .await?;
        let (at, whole_at) = (part.clone(), to.to_string());
        let (file, keeps_lock) = dir
            .with(&part, move |root| {
                let io = |e| PathError::Io(at.clone(), e);
                // One get of a file writes its part at a time.
                let Some(mut file) = root.try_lock_part(&at)? else {
                    return Err(PathError::busy(
                        &at,
                        "another copy of this file into here is under way",
                    ));
                };
                if go_on_from_whole {
                    // The host's file grew past the one here since it was listed: go on
                    // from a copy of this one.
                    let mut from = root.open_read(&whole_at)?;
                    file.set_len(0).map_err(io)?;
                    std::io::copy(&mut std::io::Read::take(&mut from, start), &mut file)
                        .map_err(io)?;
                }
                // The part may have been cut (or taken as its file by another copy) since
                // it was hashed. The second descriptor keeps the lock to the rename.
                match go_on_from(&file, start, &at) {
                    Ok(keeps_lock) => Ok((file, keeps_lock)),
                    Err(e) => {
                        // An empty part made here goes.
                        if file.metadata().is_ok_and(|m| m.len() == 0) {
                            let _ = root.remove_file(&at);
                        }
                        Err(e)
                    }
                }
            })
            .await?;
        let shown = dir.shown.join(&part);
        let writer = write_chunks(file, start, hasher, Cache::Drop);
        let mut left = size - start;
        while left > 0 {
            // A broken link keeps what arrived in the part, written out, for the next try.
            let answer = match self.recv_data().await {
                Ok(answer) => answer,
                Err(e) => {
                    let _ = writer.finish().await;
                    return Err(e);
                }
            };
            match answer {
                Incoming::Data(data) if !data.is_empty() && data.len() as u64 <= left => {
                    let n = data.len() as u64;
                    if writer.write(data).await.is_err() {
                        break;
                    }
                    left -= n;
                    progress.advance(n);
                }
                Incoming::Data(data) => {
                    writer.finish().await.map_err(local(&shown))?;
                    return Err(CopyError::Link(if data.is_empty() {
                        format!("the host sent an empty piece of {from}")
                    } else {
                        format!("the host sent more of {from} than the file has")
                    }));
                }
                Incoming::Frame(other) => {
                    writer.finish().await.map_err(local(&shown))?;
                    return Err(unexpected(from, other));
                }
            }
        }
        let hasher = writer.finish().await.map_err(local(&shown))?;
        if left > 0 {
            return Err(CopyError::Local {
                path: shown,
                source: std::io::Error::other("the write stopped"),
            });
        }
        let hash = match self.recv().await? {
            FilesResponse::End(hash) => hash,
            other => return Err(unexpected(from, other)),
        };
        if *hasher.finalize().as_bytes() != hash {
            let at = part.clone();
            let _ = dir
                .with(&part, move |root| {
                    let _locked = keeps_lock;
                    root.remove_file(&at)
                })
                .await;
            return Err(CopyError::Remote {
                path: from.to_string(),
                code: FilesError::HashMismatch,
                detail: "the bytes received do not hash to the host's file; nothing was kept"
                    .into(),
            });
        }
        let (at, into) = (part, to.to_string());
        dir.with(to, move |root| {
            let _locked = keeps_lock;
            root.rename_in_place(&at, &into)
        })
        .await?;
        Ok((size, size - start))
    }
}

/// A frame the host did not read or send within [`IDLE`].
fn stall() -> CopyError {
    CopyError::Link(format!("nothing moved for {} minutes", IDLE.as_secs() / 60))
}

fn stalled<T>(
    result: Result<Result<T, CopyError>, tokio::time::error::Elapsed>,
) -> Result<T, CopyError> {
    result.unwrap_or_else(|_| Err(stall()))
}

fn unexpected(path: &str, answer: FilesResponse) -> CopyError {
    match answer {
        FilesResponse::Failed { code, detail } => CopyError::Remote {
            path: path.to_string(),
            code,
            detail: detail.to_string(),
        },
        other => CopyError::Link(format!("an answer out of turn for {path}: {other:?}")),
    }
}
