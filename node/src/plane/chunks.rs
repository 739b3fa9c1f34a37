//! Files read and written in [`MAX_FILE_DATA`] chunks on a blocking thread, hashed (blake3)
//! there as they go: the stream's task only moves the chunks, the file's own thread reads
//! ahead (or writes behind) by a few of them. A chunk read is read straight into its data
//! frame (behind the frame's head), and a chunk received is written from where it lies in
//! the frame that brought it: the bytes are never copied into a value and out again.

use std::io::{self, Read, Seek, SeekFrom};

use bytes::Bytes;
use gpux_protocol::plane_wire::{self, DataFrame, MAX_FILE_DATA};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Chunks in flight between a file's thread and its stream.
const AHEAD: usize = 8;

/// blake3 of a file's first `len` bytes, as a hasher that can go on (blocking). A file
/// shorter than `len` is an error.
pub(crate) fn hash_prefix(file: &mut std::fs::File, len: u64) -> io::Result<blake3::Hasher> {
    hash_prefix_while(file, len, || true)
}

/// How much [`hash_prefix_while`] reads between two questions.
const HASH_STEP: usize = 1 << 20;

/// [`hash_prefix`], asking `go_on` before each mebibyte and stopping (`Interrupted`) when
/// it says no: a hash of a large file for a request given up does not hold its thread.
pub(crate) fn hash_prefix_while(
    file: &mut std::fs::File,
    len: u64,
    go_on: impl Fn() -> bool,
) -> io::Result<blake3::Hasher> {
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0; HASH_STEP.min(usize::try_from(len).unwrap_or(HASH_STEP))];
    let mut left = len;
    while left > 0 {
        if !go_on() {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "given up"));
        }
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        file.read_exact(&mut buf[..n]).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::other("the file is shorter than it was")
            } else {
                e
            }
        })?;
        hasher.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(hasher)
}

/// A chunk read, in its data frame.
pub(crate) struct Chunk {
    /// The whole frame, as [`plane_wire::encode`] would write it.
    pub(crate) frame: Vec<u8>,
    /// How many of the file's bytes it carries (at its end).
    pub(crate) len: usize,
}

/// A file read from a thread of its own.
pub(crate) struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Chunk>>,
    task: JoinHandle<blake3::Hasher>,
}

/// Reads `len` bytes of `file` from `from` into data frames of `T`, going on hashing into
/// `hasher`. A file that ends early yields an `UnexpectedEof` error, and nothing after it.
pub(crate) fn read_chunks<T: DataFrame>(
    mut file: std::fs::File,
    from: u64,
    len: u64,
    mut hasher: blake3::Hasher,
) -> ChunkReader {
    let (tx, rx) = mpsc::channel(AHEAD);
    let task = tokio::task::spawn_blocking(move || {
        if let Err(e) = file.seek(SeekFrom::Start(from)) {
            let _ = tx.blocking_send(Err(e));
            return hasher;
        }
        let mut left = len;
        while left > 0 {
            let want = MAX_FILE_DATA.min(usize::try_from(left).unwrap_or(usize::MAX));
            // Read behind the frame's head, into fresh capacity: a file reads into it
            // without zeroing it first.
            let mut frame = plane_wire::data_head::<T>(want);
            let head = frame.len();
            frame.reserve_exact(want);
            let read = Read::take(&mut file, want as u64).read_to_end(&mut frame);
            let whole = read.and_then(|n| {
                if n == want {
                    Ok(())
                } else {
                    Err(io::Error::from(io::ErrorKind::UnexpectedEof))
                }
            });
            if let Err(e) = whole {
                let _ = tx.blocking_send(Err(e));
                return hasher;
            }
            hasher.update(&frame[head..]);
            if tx.blocking_send(Ok(Chunk { frame, len: want })).is_err() {
                break;
            }
            left -= want as u64;
        }
        hasher
    });
    ChunkReader { rx, task }
}

impl ChunkReader {
    /// The next chunk; `None` once all were read.
    pub(crate) async fn next(&mut self) -> Option<io::Result<Chunk>> {
        self.rx.recv().await
    }

    /// The hash of everything read (after the last chunk).
    pub(crate) async fn finish(self) -> io::Result<blake3::Hasher> {
        drop(self.rx);
        self.task.await.map_err(|e| io::Error::other(e.to_string()))
    }
}

/// A file written from a thread of its own.
pub(crate) struct ChunkWriter {
    tx: mpsc::Sender<Bytes>,
    task: JoinHandle<io::Result<blake3::Hasher>>,
}

/// `RWF_DONTCACHE` (Linux 6.14): the write goes through the page cache, whose pages are
/// written back at once and dropped once they are.
const RWF_DONTCACHE: u32 = 0x80;

/// Whether a file written keeps its pages in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cache {
    /// Cached as any write (a file put into a workspace, which its workload reads next).
    Keep,
    /// Uncached where the kernel and the filesystem can (a file a renter gets). A copy
    /// writes gigabytes once: cached, they would push out what the renter's machine had in
    /// its page cache and stay there. Uncached writes recycle a few pages instead, which
    /// also spares virtual machines whose hypervisor takes back freed memory the slow first
    /// touch of every new page (docs/benchmarks.md). Where `RWF_DONTCACHE` is refused (an
    /// older kernel, a filesystem without it), writes are plain.
    Drop,
}

/// A file written at an offset, uncached while `uncached` holds.
struct FileAt {
    file: std::fs::File,
    at: u64,
    uncached: bool,
}

impl FileAt {
    fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        while !buf.is_empty() {
            let written = if self.uncached {
                let flags = rustix::io::ReadWriteFlags::from_bits_retain(RWF_DONTCACHE);
                match rustix::io::pwritev2(&self.file, &[io::IoSlice::new(buf)], self.at, flags) {
                    Ok(n) => n,
                    Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL) => {
                        self.uncached = false;
                        continue;
                    }
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            } else {
                match self.file.write_at(buf, self.at) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => other?,
                }
            };
            if written == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            buf = &buf[written..];
            self.at += written as u64;
        }
        Ok(())
    }
}

/// Writes chunks into `file` from `at` on, going on hashing into `hasher`.
pub(crate) fn write_chunks(
    file: std::fs::File,
    at: u64,
    mut hasher: blake3::Hasher,
    cache: Cache,
) -> ChunkWriter {
    let (tx, mut rx) = mpsc::channel::<Bytes>(AHEAD);
    let task = tokio::task::spawn_blocking(move || {
        let mut file = FileAt {
            file,
            at,
            uncached: cache == Cache::Drop,
        };
        while let Some(chunk) = rx.blocking_recv() {
            file.write_all(&chunk)?;
            hasher.update(&chunk);
        }
        Ok(hasher)
    });
    ChunkWriter { tx, task }
}

impl ChunkWriter {
    /// Hands over one chunk. Fails once the file's thread has stopped (its error comes
    /// from [`ChunkWriter::finish`]).
    pub(crate) async fn write(&self, chunk: Bytes) -> Result<(), ()> {
        self.tx.send(chunk).await.map_err(|_| ())
    }

    /// Waits for every chunk to be written: the hash of all of them, or the write's error.
    pub(crate) async fn finish(self) -> io::Result<blake3::Hasher> {
        drop(self.tx);
        self.task
            .await
            .map_err(|e| io::Error::other(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use gpux_protocol::plane_wire::FilesResponse;

    #[test]
    fn a_prefix_hash_goes_step_by_step_and_stops_when_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..(5 << 19) + 7).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let mut file = std::fs::File::open(&path).unwrap();
        for len in [0, 1, 1 << 20, bytes.len()] {
            let hasher = hash_prefix(&mut file, len as u64).unwrap();
            assert_eq!(hasher.finalize(), blake3::hash(&bytes[..len]), "{len}");
        }
        let short = hash_prefix(&mut file, bytes.len() as u64 + 1).unwrap_err();
        assert!(short.to_string().contains("shorter"), "{short}");
        let asked = std::cell::Cell::new(0);
        let stopped = hash_prefix_while(&mut file, bytes.len() as u64, || {
            asked.set(asked.get() + 1);
            asked.get() < 2
        })
        .unwrap_err();
        assert_eq!(stopped.kind(), io::ErrorKind::Interrupted);
        assert_eq!(asked.get(), 2);
    }

    #[tokio::test]
    async fn a_write_goes_on_at_its_offset_cached_or_not() {
        // On disk, where uncached writes are taken, and on tmpfs, which refuses them (the
        // writes go on plain).
        let mut dirs = vec![tempfile::tempdir().unwrap()];
        if Path::new("/dev/shm").is_dir() {
            dirs.push(tempfile::tempdir_in("/dev/shm").unwrap());
        }
        let data: Vec<u8> = (0..MAX_FILE_DATA * 3 + 77)
            .map(|i| (i % 241) as u8)
            .collect();
        let cases = [(Cache::Keep, Cache::Drop), (Cache::Drop, Cache::Keep)];
        for (dir, (first, then)) in dirs.iter().flat_map(|d| cases.map(|c| (d, c))) {
            let path = dir.path().join(format!("{first:?}-{then:?}"));
            let half = MAX_FILE_DATA + 5;
            let open = || {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .unwrap()
            };
            let writer = write_chunks(open(), 0, blake3::Hasher::new(), first);
            writer
                .write(Bytes::copy_from_slice(&data[..half]))
                .await
                .unwrap();
            let held = writer.finish().await.unwrap();
            // Going on from what is there, as a resumed copy does.
            let writer = write_chunks(open(), half as u64, held, then);
            for chunk in data[half..].chunks(MAX_FILE_DATA) {
                writer.write(Bytes::copy_from_slice(chunk)).await.unwrap();
            }
            assert_eq!(
                writer.finish().await.unwrap().finalize(),
                blake3::hash(&data)
            );
            assert_eq!(
                std::fs::read(&path).unwrap(),
                data,
                "{first:?} then {then:?}"
            );
        }
    }

    #[tokio::test]
    async fn chunks_come_back_whole_and_hashed_and_a_short_file_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..MAX_FILE_DATA * 2 + 123)
            .map(|i| (i % 251) as u8)
            .collect();
        let writer = write_chunks(
            std::fs::File::create(&path).unwrap(),
            0,
            blake3::Hasher::new(),
            Cache::Drop,
        );
        for chunk in data.chunks(MAX_FILE_DATA) {
            writer.write(Bytes::copy_from_slice(chunk)).await.unwrap();
        }
        let written = writer.finish().await.unwrap();
        assert_eq!(written.finalize(), blake3::hash(&data));
        assert_eq!(std::fs::read(&path).unwrap(), data);

        // From an offset, going on from the hash of what came before it.
        let mut head = blake3::Hasher::new();
        head.update(&data[..100]);
        let mut reader = read_chunks::<FilesResponse>(
            std::fs::File::open(&path).unwrap(),
            100,
            (data.len() - 100) as u64,
            head,
        );
        let mut got = Vec::new();
        while let Some(chunk) = reader.next().await {
            // Each is a data frame as encoding one would write it.
            let chunk = chunk.unwrap();
            let Ok(FilesResponse::Data(data)) = plane_wire::decode(&chunk.frame) else {
                panic!("not a data frame");
            };
            assert_eq!(data.len(), chunk.len);
            got.extend(data.into_inner());
        }
        assert_eq!(got, data[100..]);
        assert_eq!(
            reader.finish().await.unwrap().finalize(),
            blake3::hash(&data)
        );

        // Asked for more than the file has: an error, not a short success.
        let mut reader = read_chunks::<FilesResponse>(
            std::fs::File::open(&path).unwrap(),
            0,
            data.len() as u64 + 1,
            blake3::Hasher::new(),
        );
        let mut last = None;
        while let Some(chunk) = reader.next().await {
            last = Some(chunk);
        }
        assert!(matches!(last, Some(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof));
    }
}
