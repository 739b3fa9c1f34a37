//! The host's side of `/gpux/files/1`: `gpux cp` in and out of a lease's workspace.
//!
//! The host works on the workspace's filesystem itself (its mount on the host), never
//! through the container: nothing with GPU access is involved, and it works the same while
//! the workload runs. Every path goes through [`super::confined`].
//!
//! A put lands in `.<name>.gpux-part` beside its target and becomes the target only once
//! the whole file hashes (blake3, computed as the bytes are written) to what the renter
//! sends at its end; an interrupted put leaves the part, and the next put of that file goes
//! on from its end when the renter's first bytes hash as the part. A get sends from the
//! offset the renter holds when its bytes hash as the host's, and ends with the blake3 of
//! the whole file as read.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use gpux_protocol::plane_wire::{
    Entry, EntryKind, FilesError, FilesRequest, FilesResponse, MAX_LIST_PAGE,
};
use gpux_protocol::{BoundedString, BoundedVec};
use tokio_util::sync::CancellationToken;

use super::chunks::{Cache, hash_prefix, read_chunks, write_chunks};
use super::confined::{Limit, PathError, Root, Walked, check, part_of};
use super::{FramedStream, IDLE, Incoming, PlaneError, feed, recv, recv_data, send};

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

fn failure(e: &PathError) -> FilesResponse {
    let code = match e {
        PathError::Invalid(_) => FilesError::Invalid,
        PathError::Outside(_) => FilesError::OutsideWorkspace,
        PathError::NotAFile(_) => FilesError::WrongKind,
        e if e.is_no_space() => FilesError::NoSpace,
        e if e.kind() == Some(std::io::ErrorKind::NotFound) => FilesError::NotFound,
        e if e.kind() == Some(std::io::ErrorKind::NotADirectory) => FilesError::WrongKind,
        _ => FilesError::Io,
    };
    FilesResponse::failed(code, &e.to_string())
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
                if !put(&root, &dir, &mut framed, path.to_string(), size).await? {
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
    let mut entries: Vec<Entry> = all
        .into_iter()
        .filter_map(|walked| {
            Some(Entry {
                path: BoundedString::new(walked.path).ok()?,
                // A name that is not UTF-8 is listed for the renter to report, never copied.
                kind: walked.stat.as_ref().map_or(EntryKind::Other, kind_of),
            })
        })
        .collect();
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

/// What the host holds of a file being put.
struct Held {
    /// The whole file, at the size announced (else the part an interrupted put left).
    whole: bool,
    len: u64,
    hasher: blake3::Hasher,
    /// The part, locked for this put (not yet opened when the whole file is held).
    part: Option<std::fs::File>,
}

/// How many times a part renamed between its open and its lock is opened again.
const LOCK_TRIES: usize = 4;
/// How long a put waits for the put it took over from to let go of the part.
const TAKEOVER: Duration = Duration::from_secs(10);

/// Opens a put's part and locks it, so that one put of a file writes at a time: a second
/// one would write between the first one's bytes. The lock is the descriptor's, so it is
/// held until the last write of the put's file thread; a put taking over (see [`Claim`])
/// waits here for it, up to `wait` ([`TAKEOVER`]). The part is written only through the descriptor
/// locked here, and its hash is taken through it too.
fn lock_part(root: &Root, part: &str, wait: Duration) -> Result<std::fs::File, PathError> {
    use rustix::fs::{FlockOperation, flock, fstat};
    let io = |e: rustix::io::Errno| PathError::Io(part.to_string(), e.into());
    let busy = |why: &str| {
        PathError::Io(
            part.to_string(),
            std::io::Error::new(std::io::ErrorKind::ResourceBusy, why.to_string()),
        )
    };
    let until = std::time::Instant::now() + wait;
    for _ in 0..LOCK_TRIES {
        let file = root.open_write(part)?;
        loop {
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    return Err(busy(
                        "something else holds this file's part; copy again once it has let go",
                    ));
                }
                Err(e) => return Err(io(e)),
            }
        }
        // A put that held the lock may have renamed this very file to its target between
        // the open and the lock: then it is the target now, not a part.
        let mine = fstat(&file).map_err(io)?;
        if root
            .stat(part)?
            .is_some_and(|there| (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino))
        {
            return Ok(file);
        }
    }
    Err(busy("the part keeps being replaced; copy again"))
}

/// The puts under way, by workspace and path: a put of a file takes over from one of the
/// same file still under way, which ends at once. The one under way is most likely left by
/// a link that died unseen (a renter copying again after a dropped connection), and would
/// otherwise hold the file until its stream idled out.
static PUTS: std::sync::Mutex<BTreeMap<(PathBuf, String), (u64, CancellationToken)>> =
    std::sync::Mutex::new(BTreeMap::new());
static NEXT_CLAIM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One put's claim on its file, given up when dropped.
struct Claim {
    key: (PathBuf, String),
    id: u64,
    /// Cancelled when another put of the file takes over.
    taken_over: CancellationToken,
}

impl Claim {
    fn take(dir: &std::path::Path, path: &str) -> Claim {
        let key = (dir.to_path_buf(), path.to_string());
        let id = NEXT_CLAIM.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let taken_over = CancellationToken::new();
        let mut puts = PUTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, earlier)) = puts.insert(key.clone(), (id, taken_over.clone())) {
            earlier.cancel();
        }
        Claim {
            key,
            id,
            taken_over,
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut puts = PUTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if puts.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            puts.remove(&self.key);
        }
    }
}

/// One put, ended at once when another put of the same file takes over. Returns whether
/// the stream can go on (false: it was left mid-data).
async fn put(
    root: &std::sync::Arc<Root>,
    dir: &std::path::Path,
    framed: &mut FramedStream,
    path: String,
    size: u64,
) -> Result<bool, PlaneError> {
    // A path that names no file (empty, or ending in `/`) has no part either.
    if let Err(e) = check(&path) {
        send(framed, &failure(&e)).await?;
        return Ok(true);
    }
    let claim = Claim::take(dir, &path);
    let done = tokio::select! {
        done = put_claimed(root, framed, path, size) => Some(done),
        () = claim.taken_over.cancelled() => None,
    };
    match done {
        Some(done) => done,
        None => {
            let answer =
                FilesResponse::failed(FilesError::Io, "another copy of this file took over");
            let _ = send(framed, &answer).await;
            Ok(false)
        }
    }
}

/// One put of a checked path.
///
/// Every byte is hashed as it is written (and a kept part once, as the put opens), so the
/// file is read back never: the renter's whole-file blake3 at the end is compared with what
/// the host holds.
async fn put_claimed(
    root: &std::sync::Arc<Root>,
    framed: &mut FramedStream,
    path: String,
    size: u64,
) -> Result<bool, PlaneError> {
    let part = part_of(&path);
    let (r, p, pp) = (root.clone(), path.clone(), part.clone());
    let held = blocking(move || -> Result<Held, PathError> {
        // The file there already at this size: the renter may have nothing to send.
        if let Ok(mut file) = r.open_read(&p)
            && file.metadata().is_ok_and(|m| m.len() == size)
            && let Ok(hasher) = hash_prefix(&mut file, size)
        {
            return Ok(Held {
                whole: true,
                len: size,
                hasher,
                part: None,
            });
        }
        let mut file = lock_part(&r, &pp, TAKEOVER)?;
        let on_disk = file
            .metadata()
            .map_err(|e| PathError::Io(pp.clone(), e))?
            .len();
        // A part longer than the file is from another version of it: not held.
        let (len, hasher) = if on_disk <= size {
            let hasher =
                hash_prefix(&mut file, on_disk).map_err(|e| PathError::Io(pp.clone(), e))?;
            (on_disk, hasher)
        } else {
            (0, blake3::Hasher::new())
        };
        Ok(Held {
            whole: false,
            len,
            hasher,
            part: Some(file),
        })
    })
    .await?;
    let held = match held {
        Ok(held) => held,
        Err(e) => {
            send(framed, &failure(&e)).await?;
            return Ok(true);
        }
    };
    let hash = *held.hasher.finalize().as_bytes();
    send(
        framed,
        &FilesResponse::Holding {
            len: held.len,
            hash,
        },
    )
    .await?;
    let from = match recv::<FilesRequest>(framed, IDLE).await? {
        FilesRequest::PutFrom(from) if from == held.len || from == 0 => from,
        _ => {
            let answer = FilesResponse::failed(
                FilesError::Invalid,
                "a put goes on from what the host holds, or from 0",
            );
            send(framed, &answer).await?;
            return Ok(false);
        }
    };
    if held.whole && from == size {
        // The renter's bytes hash as the file there: nothing to write.
        return match recv::<FilesRequest>(framed, IDLE).await? {
            FilesRequest::PutEnd(end) if end == hash => {
                send(framed, &FilesResponse::Done).await?;
                Ok(true)
            }
            _ => {
                let answer = FilesResponse::failed(FilesError::Invalid, "a put's end was expected");
                send(framed, &answer).await?;
                Ok(false)
            }
        };
    }
    let (hasher, keep) = if from > 0 && !held.whole {
        (held.hasher, from)
    } else {
        (blake3::Hasher::new(), 0)
    };
    let (r, pp, locked) = (root.clone(), part.clone(), held.part);
    let opened = blocking(move || -> Result<std::fs::File, PathError> {
        let file = match locked {
            Some(file) => file,
            None => lock_part(&r, &pp, TAKEOVER)?,
        };
        // No other put writes the part now, but the workload may have cut it since it was
        // hashed: growing it back would put zeros where the hash says the bytes are.
        let on_disk = file
            .metadata()
            .map_err(|e| PathError::Io(pp.clone(), e))?
            .len();
        if on_disk < keep {
            return Err(PathError::Io(
                pp,
                std::io::Error::other("the part shrank while it was compared; copy again"),
            ));
        }
        file.set_len(keep)
            .map_err(|e| PathError::Io(pp.clone(), e))?;
        Ok(file)
    })
    .await?;
    let file = match opened {
        Ok(file) => file,
        Err(e) => {
            send(framed, &failure(&e)).await?;
            return Ok(false);
        }
    };
    let mut at = keep;
    let writer = write_chunks(file, keep, hasher, Cache::Keep);
    // The file's thread stops at its first error: that error is the answer.
    let mut failed = false;
    while at < size {
        // A broken stream keeps what arrived in the part, written out before the next put
        // of the file can look at it.
        let frame = match recv_data::<FilesRequest>(framed, IDLE).await {
            Ok(frame) => frame,
            Err(e) => {
                let _ = writer.finish().await;
                return Err(e);
            }
        };
        let data = match frame {
            Incoming::Data(data) if at + data.len() as u64 <= size => data,
            other => {
                let _ = writer.finish().await;
                let detail = match other {
                    Incoming::Data(_) => "more data than announced",
                    Incoming::Frame(_) => "a put's data was cut short",
                };
                send(framed, &FilesResponse::failed(FilesError::Invalid, detail)).await?;
                return Ok(false);
            }
        };
        at += data.len() as u64;
        if writer.write(data).await.is_err() {
            failed = true;
            break;
        }
    }
    let hasher = match writer.finish().await {
        Ok(hasher) if !failed => hasher,
        result => {
            let error = result
                .err()
                .unwrap_or_else(|| std::io::Error::other("the write stopped"));
            let _ = send(framed, &failure(&PathError::Io(part.clone(), error))).await;
            let (r, pp) = (root.clone(), part.clone());
            let _ = blocking(move || r.remove_file(&pp)).await;
            return Ok(false);
        }
    };
    let FilesRequest::PutEnd(end) = recv::<FilesRequest>(framed, IDLE).await? else {
        let answer = FilesResponse::failed(FilesError::Invalid, "a put's end was expected");
        send(framed, &answer).await?;
        return Ok(false);
    };
    let (r, pp, p) = (root.clone(), part.clone(), path.clone());
    let matches = *hasher.finalize().as_bytes() == end;
    let answer = blocking(move || {
        if !matches {
            let _ = r.remove_file(&pp);
            return FilesResponse::failed(
                FilesError::HashMismatch,
                "the file's bytes do not hash to what the renter sent; it was not stored",
            );
        }
        match r.rename_in_place(&pp, &p) {
            Ok(()) => FilesResponse::Done,
            Err(e) => failure(&e),
        }
    })
    .await?;
    send(framed, &answer).await?;
    Ok(true)
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
    let r = root.clone();
    let opened = blocking(
        move || -> Result<(std::fs::File, u64, u64, blake3::Hasher), PathError> {
            let mut file = r.open_read(&path)?;
            let size = file
                .metadata()
                .map_err(|e| PathError::Io(path.clone(), e))?
                .len();
            if offset > 0 && offset <= size {
                let hasher =
                    hash_prefix(&mut file, offset).map_err(|e| PathError::Io(path.clone(), e))?;
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
    fn one_put_of_a_file_writes_at_a_time_and_a_later_one_takes_over() {
        let ws = tempfile::tempdir().unwrap();
        let root = std::sync::Arc::new(Root::open(ws.path()).unwrap());
        let part = part_of("f.bin");
        let short = Duration::from_millis(100);
        let first = lock_part(&root, &part, short).unwrap();
        let e = lock_part(&root, &part, short).err().unwrap();
        assert_eq!(e.kind(), Some(std::io::ErrorKind::ResourceBusy), "{e}");
        // A put taking over waits for the one before to let go.
        let (r, p) = (root.clone(), part.clone());
        let second = std::thread::spawn(move || lock_part(&r, &p, TAKEOVER));
        std::thread::sleep(Duration::from_millis(300));
        drop(first);
        let second = second.join().unwrap().unwrap();
        // A part renamed to its file is a part no more.
        root.rename_in_place(&part, "f.bin").unwrap();
        let third = lock_part(&root, &part, short).unwrap();
        let (a, b) = (
            rustix::fs::fstat(&second).unwrap(),
            rustix::fs::fstat(&third).unwrap(),
        );
        assert_ne!(a.st_ino, b.st_ino);

        // Claims: a later put of the same file ends the one before; others are left be.
        let one = Claim::take(ws.path(), "f.bin");
        let other = Claim::take(ws.path(), "g.bin");
        let two = Claim::take(ws.path(), "f.bin");
        assert!(one.taken_over.is_cancelled());
        assert!(!other.taken_over.is_cancelled() && !two.taken_over.is_cancelled());
        drop(one);
        let three = Claim::take(ws.path(), "f.bin");
        assert!(two.taken_over.is_cancelled() && !three.taken_over.is_cancelled());
    }

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
