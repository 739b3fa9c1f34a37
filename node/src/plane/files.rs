//! The host's side of `/gpux/files/1`: `gpux cp` in and out of a lease's workspace.
//!
//! The host works on the workspace's filesystem itself (its mount on the host), never
//! through the container: nothing with GPU access is involved, and it works the same while
//! the workload runs. Every path goes through [`super::confined`].
//!
//! A put is [`super::put`]'s. A get sends from the offset the renter holds when its bytes
//! hash as the host's, and ends with the blake3 of the whole file as read.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use gpux_protocol::plane_wire::{
    Entry, EntryKind, FilesError, FilesRequest, FilesResponse, MAX_LIST_PAGE,
};
use gpux_protocol::{BoundedString, BoundedVec};
use tokio_util::sync::CancellationToken;

use super::chunks::{hash_prefix_while, read_chunks};
use super::confined::{Limit, PathError, Root, Walked, failure};
use super::{FramedStream, IDLE, PlaneError, blocking, feed, recv, send};

/// The most entries a listing walks.
pub(crate) const MAX_LISTED: usize = 100_000;
/// The most bytes of paths a listing holds, all together (a listing is gathered whole before
/// it is sent: 100,000 paths of 4 KiB would be 400 MiB).
pub(crate) const MAX_LISTED_PATH_BYTES: usize = 16 << 20;
/// The most bytes of entries in one page of a listing: with the page's own few bytes, it
/// fits a frame however long its paths are.
const PAGE_BYTES: usize = gpux_protocol::plane_wire::MAX_FILE_DATA;
/// What one entry takes in a page at most, besides its path's bytes: the path's length
/// (a varint) and the kind (a tag and a varint size).
const ENTRY_OVERHEAD: usize = 16;

fn kind_of(stat: &rustix::fs::Stat) -> EntryKind {
    use rustix::fs::FileType;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => EntryKind::File(u64::try_from(stat.st_size).unwrap_or(0)),
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// Serves one files stream on the workspace mounted at `dir` until the renter closes it.
pub(crate) async fn serve(dir: PathBuf, mut framed: FramedStream) -> Result<(), PlaneError> {
    let at = dir.clone();
    let root = std::sync::Arc::new(blocking(move || Root::open(&at)).await??);
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
                let limit = Limit {
                    entries: MAX_LISTED,
                    path_bytes: MAX_LISTED_PATH_BYTES,
                };
                match blocking(move || r.walk(&path, limit)).await? {
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
            FilesRequest::Put { path, size } => {
                // A put that fails part-way leaves the stream in the middle of its data.
                if !super::put::put(&root, &dir, &mut framed, path.to_string(), size).await? {
                    linger(&mut framed).await;
                    return Ok(());
                }
            }
            FilesRequest::Get { path, offset, hash } => {
                get(&root, &mut framed, path.to_string(), offset, hash).await?;
            }
            FilesRequest::Data(_) | FilesRequest::PutFrom(_) | FilesRequest::PutEnd(_) => {
                let answer = FilesResponse::failed(FilesError::Invalid, "data outside a put");
                send(&mut framed, &answer).await?;
                return Ok(());
            }
        }
    }
}

/// How long a stream left mid-put stays open to be read after the host's answer.
const LINGER: Duration = Duration::from_secs(5);

/// Reads (and drops) what the renter still sends after a put failed in its data, for at
/// most [`LINGER`] or until it closes: a stream closed at once would fail the renter's
/// next write before it read why.
async fn linger(framed: &mut FramedStream) {
    use futures::StreamExt;
    let _ = tokio::time::timeout(LINGER, async {
        while let Some(Ok(_)) = framed.next().await {}
    })
    .await;
}

async fn list(framed: &mut FramedStream, all: Vec<Walked>) -> Result<(), PlaneError> {
    let mut entries = Vec::with_capacity(all.len());
    for walked in all {
        // A name that is not UTF-8 is listed for the renter to report, never copied.
        let kind = walked.stat.as_ref().map_or(EntryKind::Other, kind_of);
        let Ok(path) = BoundedString::new(walked.path) else {
            let answer = FilesResponse::failed(
                FilesError::Io,
                "a path under it is longer than a path on the wire (4096 bytes): copy the directories under it one at a time",
            );
            return send(framed, &answer).await;
        };
        entries.push(Entry { path, kind });
    }
    loop {
        let rest = entries.split_off(page_len(&entries));
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

/// How many of `entries`, from the first, make the next page: at most [`MAX_LIST_PAGE`]
/// entries and [`PAGE_BYTES`] of them.
fn page_len(entries: &[Entry]) -> usize {
    let mut bytes = 0;
    entries
        .iter()
        .take(MAX_LIST_PAGE)
        .take_while(|e| {
            bytes += e.path.len() + ENTRY_OVERHEAD;
            bytes <= PAGE_BYTES
        })
        .count()
}

/// One get: the file's size and where its bytes start (the renter's `offset` when its
/// first bytes hash to `hash`, else 0), its bytes, and the blake3 of all of it as read.
async fn get(
    root: &std::sync::Arc<Root>,
    framed: &mut FramedStream,
    path: String,
    offset: u64,
    hash: [u8; 32],
) -> Result<(), PlaneError> {
    // A hash of a large file stops when this get is dropped (its stream or lease ended).
    let stop = CancellationToken::new();
    let _stop_when_dropped = stop.clone().drop_guard();
    let r = root.clone();
    let opened = blocking(
        move || -> Result<(std::fs::File, u64, u64, blake3::Hasher), PathError> {
            let mut file = r.open_read(&path)?;
            let size = file
                .metadata()
                .map_err(|e| PathError::Io(path.clone(), e))?
                .len();
            if offset > 0 && offset <= size {
                let hasher = hash_prefix_while(&mut file, offset, || !stop.is_cancelled())
                    .map_err(|e| PathError::Io(path.clone(), e))?;
                if *hasher.finalize().as_bytes() == hash {
                    return Ok((file, size, offset, hasher));
                }
            }
            Ok((file, size, 0, blake3::Hasher::new()))
        },
    )
    .await?;
    let (file, size, from, hasher) = match opened {
        Ok(ok) => ok,
        Err(e) => return send(framed, &failure(&e)).await,
    };
    send(framed, &FilesResponse::Sending { size, from }).await?;
    let mut reader = read_chunks::<FilesResponse>(file, from, size - from, hasher);
    while let Some(chunk) = reader.next().await {
        let Ok(chunk) = chunk else {
            let answer = FilesResponse::failed(
                FilesError::HashMismatch,
                "the file shrank while it was sent",
            );
            return send(framed, &answer).await;
        };
        feed(framed, Bytes::from(chunk.frame)).await?;
    }
    let hasher = reader.finish().await?;
    send(framed, &FilesResponse::End(*hasher.finalize().as_bytes())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_of_long_paths_is_paged_into_frames_that_fit() {
        let entries: Vec<Entry> = (0..600)
            .map(|i| Entry {
                path: BoundedString::new(format!("{i:04}{}", "x".repeat(4000))).unwrap(),
                kind: EntryKind::File(u64::MAX),
            })
            .chain((0..300).map(|i| Entry {
                path: BoundedString::new(format!("short/{i}")).unwrap(),
                kind: EntryKind::Dir,
            }))
            .collect();
        let mut left = entries.clone();
        let mut back = Vec::new();
        let mut pages = 0;
        while !left.is_empty() {
            let rest = left.split_off(page_len(&left));
            let page = std::mem::replace(&mut left, rest);
            assert!(!page.is_empty() && page.len() <= MAX_LIST_PAGE);
            let frame = gpux_protocol::plane_wire::encode(&FilesResponse::Entries {
                entries: BoundedVec::new(page.clone()).unwrap(),
                more: !left.is_empty(),
            });
            let decoded: FilesResponse = gpux_protocol::plane_wire::decode(&frame).unwrap();
            assert!(matches!(decoded, FilesResponse::Entries { .. }));
            back.extend(page);
            pages += 1;
        }
        assert_eq!(back, entries);
        // 600 paths of 4 KiB take 10 pages of 62; the 300 short ones two more.
        assert!(pages >= 11, "{pages} pages");
    }
}
