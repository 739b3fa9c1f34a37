//! The host's side of a put on `/gpux/files/1`: a file from the renter into the workspace.
//!
//! A put lands in its part (see [`part_of`]) and becomes the file only once the whole
//! file hashes (blake3, computed as the bytes are written) to what the renter sends at its
//! end; an interrupted put leaves the part, and the next put of that file goes on from its
//! end when the renter's first bytes hash as the part.
//!
//! One put of a file writes at a time: the part is written, hashed and renamed only through
//! a descriptor holding an exclusive `flock` on it, and a put of a file takes over from one
//! of the same file still under way (see [`Claim`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpux_protocol::plane_wire::{FilesError, FilesRequest, FilesResponse};
use tokio_util::sync::CancellationToken;

use super::chunks::{Cache, hash_prefix_while, write_chunks};
use super::confined::{
    NAME_MAX, PathError, Root, check, failure, go_on_from, is_part_name, part_of,
};
use super::{FramedStream, IDLE, Incoming, PlaneError, blocking, recv, recv_data, send};

/// What the host holds of a file being put.
struct Held {
    /// The whole file, at the size announced (else the part an interrupted put left).
    whole: bool,
    len: u64,
    hasher: blake3::Hasher,
    /// The part, locked for this put (not yet opened when the whole file is held).
    part: Option<File>,
}

/// How long a put waits for the put it took over from to let go of the part.
const TAKEOVER: Duration = Duration::from_secs(10);
/// How often a put waiting for a part tries its lock again.
const LOCK_POLL: Duration = Duration::from_millis(50);

/// Opens a put's part and locks it, waiting up to `wait` while another descriptor holds it
/// (a put taken over lets go once its file thread has written what it had). The lock is
/// the open file's, so it holds while any descriptor of it is open: the put's file thread
/// and the put itself, up to its rename. The wait is asynchronous: a put taken over while
/// it waits holds no thread.
async fn lock_part(root: &Arc<Root>, part: &str, wait: Duration) -> Result<File, PathError> {
    let until = Instant::now() + wait;
    loop {
        let (r, p) = (root.clone(), part.to_string());
        let tried = tokio::task::spawn_blocking(move || r.try_lock_part(&p))
            .await
            .map_err(|e| PathError::Io(part.to_string(), std::io::Error::other(e.to_string())))?;
        match tried? {
            Some(file) => return Ok(file),
            None if Instant::now() < until => tokio::time::sleep(LOCK_POLL).await,
            None => {
                return Err(PathError::busy(
                    part,
                    "something else holds this file's part; copy again once it has let go",
                ));
            }
        }
    }
}

/// The puts under way, by workspace and path. The one under way when another put of the
/// same file comes is most likely left by a link that died unseen (a renter copying again
/// after a dropped connection), and would otherwise hold the file until its stream idled
/// out.
type Puts = BTreeMap<(PathBuf, String), (u64, CancellationToken)>;
static PUTS: std::sync::Mutex<Puts> = std::sync::Mutex::new(BTreeMap::new());
static NEXT_CLAIM: AtomicU64 = AtomicU64::new(0);

/// One put's claim on its file, given up when dropped.
struct Claim {
    key: (PathBuf, String),
    id: u64,
    /// Cancelled when another put of the file takes over.
    taken_over: CancellationToken,
}

impl Claim {
    /// Claims `path` in the workspace at `dir`, ending the put that held it.
    fn take(dir: &Path, path: &str) -> Claim {
        let key = (dir.to_path_buf(), path.to_string());
        let id = NEXT_CLAIM.fetch_add(1, Ordering::Relaxed);
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
        // What the put left on blocking threads (a hash) stops too: its stream or lease
        // has ended.
        self.taken_over.cancel();
        let mut puts = PUTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if puts.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            puts.remove(&self.key);
        }
    }
}

/// One put into the workspace at `dir`, ended at once when another put of the same file
/// takes over. Returns whether the stream can go on (false: it was left mid-data).
pub(super) async fn put(
    root: &Arc<Root>,
    dir: &Path,
    framed: &mut FramedStream,
    path: String,
    size: u64,
) -> Result<bool, PlaneError> {
    // A path that names no file (empty, or ending in `/`) has no part either, and a part
    // is no put's target (it would take the name of another put's part).
    if let Err(e) = check(&path) {
        send(framed, &failure(&e)).await?;
        return Ok(true);
    }
    let name = path.rsplit('/').next().unwrap_or(&path);
    let refused = if is_part_name(name) {
        Some("a name of the form .NAME.gpux-part is a copy's part, never copied")
    } else if name.len() > NAME_MAX {
        // Refused before a byte is sent: its part would take it, its rename never.
        Some("a name too long: over 255 bytes, more than a filesystem takes")
    } else {
        None
    };
    if let Some(why) = refused {
        send(framed, &FilesResponse::failed(FilesError::Invalid, why)).await?;
        return Ok(true);
    }
    let claim = Claim::take(dir, &path);
    let part = part_of(&path);
    let done = tokio::select! {
        done = put_claimed(root, framed, path, size, &claim.taken_over) => Some(done),
        () = claim.taken_over.cancelled() => None,
    };
    match done {
        Some(done) => {
            // A put given up before its first byte leaves no empty part behind.
            let r = root.clone();
            let _ = blocking(move || drop_empty_part(&r, &part)).await;
            done
        }
        None => {
            let answer =
                FilesResponse::failed(FilesError::Io, "another copy of this file took over");
            let _ = send(framed, &answer).await;
            Ok(false)
        }
    }
}

/// Removes the part at `part` when it is empty and no put holds it (blocking).
fn drop_empty_part(root: &Root, part: &str) {
    use rustix::fs::{FlockOperation, flock};
    let Ok(file) = root.open_read(part) else {
        return;
    };
    if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok()
        && file.metadata().is_ok_and(|m| m.len() == 0)
        && root.names(part, &file)
    {
        let _ = root.remove_file(part);
    }
}

/// What the host holds of `path` at `size`: the whole file, when it is there at that size,
/// else the part, locked, and as much of it as counts. An error is the answer to the put.
async fn holding(
    root: &Arc<Root>,
    path: &str,
    part: &str,
    size: u64,
    stop: &CancellationToken,
) -> Result<Result<Held, PathError>, PlaneError> {
    let (r, p, t) = (root.clone(), path.to_string(), stop.clone());
    if let Some(hasher) = blocking(move || whole_hash(&r, &p, size, &t)).await? {
        // The renter may have nothing to send.
        return Ok(Ok(Held {
            whole: true,
            len: size,
            hasher,
            part: None,
        }));
    }
    let mut file = match lock_part(root, part, TAKEOVER).await {
        Ok(file) => file,
        Err(e) => return Ok(Err(e)),
    };
    let (r, p, pp, t) = (
        root.clone(),
        path.to_string(),
        part.to_string(),
        stop.clone(),
    );
    blocking(move || {
        let on_disk = file
            .metadata()
            .map_err(|e| PathError::Io(pp.clone(), e))?
            .len();
        if on_disk == 0
            && let Some(hasher) = whole_hash(&r, &p, size, &t)
        {
            // A put this one took over from renamed its part to the file while this one
            // waited: the file is whole now. The empty part goes, under its lock.
            r.remove_file(&pp)?;
            return Ok(Held {
                whole: true,
                len: size,
                hasher,
                part: None,
            });
        }
        // A part longer than the file is from another version of it: not held.
        let (len, hasher) = if on_disk <= size {
            let hasher = hash_prefix_while(&mut file, on_disk, || !t.is_cancelled())
                .map_err(|e| PathError::Io(pp.clone(), e))?;
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
    .await
}

/// The hash of the file at `path` when it is there at `size` (blocking).
fn whole_hash(
    root: &Root,
    path: &str,
    size: u64,
    stop: &CancellationToken,
) -> Option<blake3::Hasher> {
    let mut file = root.open_read(path).ok()?;
    if file.metadata().ok()?.len() != size {
        return None;
    }
    hash_prefix_while(&mut file, size, || !stop.is_cancelled()).ok()
}

/// One put of a checked path, given up when `stop` is cancelled.
///
/// Every byte is hashed as it is written (and a kept part once, as the put opens), so the
/// file is read back never: the renter's whole-file blake3 at the end is compared with what
/// the host holds.
async fn put_claimed(
    root: &Arc<Root>,
    framed: &mut FramedStream,
    path: String,
    size: u64,
    stop: &CancellationToken,
) -> Result<bool, PlaneError> {
    let part = part_of(&path);
    let held = match holding(root, &path, &part, size, stop).await? {
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
    let locked = match held.part {
        Some(file) => Ok(file),
        None => lock_part(root, &part, TAKEOVER).await,
    };
    let pp = part.clone();
    let opened = blocking(move || -> Result<(File, File), PathError> {
        let file = locked?;
        // No other put writes the part now, but the workload may have cut it since it was
        // hashed. The second descriptor keeps the lock to the rename.
        let keeps_lock = go_on_from(&file, keep, &pp)?;
        Ok((file, keeps_lock))
    })
    .await?;
    let (file, keeps_lock) = match opened {
        Ok(opened) => opened,
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
    let (r, pp) = (root.clone(), part.clone());
    let hasher = match writer.finish().await {
        Ok(hasher) if !failed => hasher,
        result => {
            let error = result
                .err()
                .unwrap_or_else(|| std::io::Error::other("the write stopped"));
            let _ = send(framed, &failure(&PathError::Io(part.clone(), error))).await;
            let _ = blocking(move || {
                let _locked = keeps_lock;
                r.remove_file(&pp)
            })
            .await;
            return Ok(false);
        }
    };
    let FilesRequest::PutEnd(end) = recv::<FilesRequest>(framed, IDLE).await? else {
        let answer = FilesResponse::failed(FilesError::Invalid, "a put's end was expected");
        send(framed, &answer).await?;
        return Ok(false);
    };
    let matches = *hasher.finalize().as_bytes() == end;
    let answer = blocking(move || {
        // `keeps_lock`, moved here, holds the lock to the end of the rename (or removal),
        // which goes on even if this put is taken over meanwhile: the put that takes over
        // opens the part only after it. The name must still be this put's part: the
        // workload may have renamed another file onto it.
        if !r.names(&pp, &keeps_lock) {
            return FilesResponse::failed(
                FilesError::Io,
                "the part was replaced while it was written; copy again",
            );
        }
        if !matches {
            let _ = r.remove_file(&pp);
            return FilesResponse::failed(
                FilesError::HashMismatch,
                "the file's bytes do not hash to what the renter sent; it was not stored",
            );
        }
        match r.rename_in_place(&pp, &path) {
            Ok(()) => FilesResponse::Done,
            Err(e) => failure(&e),
        }
    })
    .await?;
    send(framed, &answer).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_put_of_a_file_writes_at_a_time_and_a_later_one_takes_over() {
        let ws = tempfile::tempdir().unwrap();
        let root = Arc::new(Root::open(ws.path()).unwrap());
        let part = part_of("f.bin");
        let short = Duration::from_millis(100);
        let first = lock_part(&root, &part, short).await.unwrap();
        let e = lock_part(&root, &part, short).await.err().unwrap();
        assert_eq!(e.kind(), Some(std::io::ErrorKind::ResourceBusy), "{e}");
        // The lock is the open file's: a descriptor kept of it keeps the lock.
        let kept = first.try_clone().unwrap();
        drop(first);
        assert!(lock_part(&root, &part, short).await.is_err());
        // A put taking over waits for the one before to let go.
        let (r, p) = (root.clone(), part.clone());
        let second = tokio::spawn(async move { lock_part(&r, &p, TAKEOVER).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(kept);
        let second = second.await.unwrap().unwrap();
        // A part renamed to its file is a part no more.
        root.rename_in_place(&part, "f.bin").unwrap();
        let third = lock_part(&root, &part, short).await.unwrap();
        let (a, b) = (
            rustix::fs::fstat(&second).unwrap(),
            rustix::fs::fstat(&third).unwrap(),
        );
        assert_ne!(a.st_ino, b.st_ino);

        // An empty part no put holds goes; one that holds bytes, or that a put holds, stays.
        drop(third);
        let empty = part_of("e.bin");
        std::fs::write(ws.path().join(&empty), b"").unwrap();
        let held = lock_part(&root, &empty, short).await.unwrap();
        drop_empty_part(&root, &empty);
        assert!(ws.path().join(&empty).exists());
        drop(held);
        drop_empty_part(&root, &empty);
        assert!(!ws.path().join(&empty).exists());
        std::fs::write(ws.path().join(&part), b"x").unwrap();
        drop_empty_part(&root, &part);
        assert!(ws.path().join(&part).exists());

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
}
