//! Carrying a stream's bytes both ways, bounded by idle time: a forwarded connection on
//! either side (the host's end in the container, the renter node's local listener) and an
//! exec's input and output on the host.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{FramedStream, IDLE, PlaneError};

/// When a stream last carried bytes either way.
pub(super) struct Activity {
    base: tokio::time::Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            base: tokio::time::Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing moved for `limit`.
    async fn idle(&self, limit: Duration) -> PlaneError {
        loop {
            let last = self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            if last.elapsed() >= limit {
                return PlaneError::Timeout(limit);
            }
            tokio::time::sleep_until(last + limit).await;
        }
    }
}

/// Runs a stream's two directions: `outbound` decides the end; when `inbound` ends first
/// without error, `outbound` goes on. Either way, [`IDLE`] without traffic ends both.
pub(super) async fn both_ways(
    activity: &Activity,
    outbound: impl Future<Output = Result<(), PlaneError>>,
    inbound: impl Future<Output = Result<(), PlaneError>>,
) -> Result<(), PlaneError> {
    tokio::pin!(outbound);
    tokio::pin!(inbound);
    tokio::select! {
        done = &mut outbound => done,
        ended = &mut inbound => {
            ended?;
            tokio::select! {
                done = &mut outbound => done,
                e = activity.idle(IDLE) => Err(e),
            }
        }
        e = activity.idle(IDLE) => Err(e),
    }
}

/// Which end of a forwarded connection is the application's: its data ending ends the
/// connection (a client may half-close and still wait for the answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AppSide {
    /// The TCP connection: the host's end, in the container.
    Conn,
    /// The stream: the renter node's end, whose TCP connection is a local client's.
    Stream,
}

/// Carries a forwarded connection's bytes both ways between the stream and a TCP
/// connection, until the application's side ends (or [`IDLE`] passes without traffic).
pub(super) async fn splice(
    conn: tokio::net::TcpStream,
    framed: FramedStream,
    app: AppSide,
) -> Result<(), PlaneError> {
    let parts = framed.into_parts();
    let (mut from_stream, mut to_stream) = tokio::io::split(parts.io);
    let (mut from_conn, mut to_conn) = conn.into_split();
    if !parts.read_buf.is_empty() {
        to_conn.write_all(&parts.read_buf).await?;
    }
    let activity = Activity::new();
    let into_conn = carry(&mut from_stream, &mut to_conn, &activity);
    let into_stream = carry(&mut from_conn, &mut to_stream, &activity);
    match app {
        AppSide::Conn => both_ways(&activity, into_stream, into_conn).await,
        AppSide::Stream => both_ways(&activity, into_conn, into_stream).await,
    }
}

/// Copies `from` to `to` until `from` ends, then shuts `to` down; every chunk counts as
/// activity.
pub(super) async fn carry(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    activity: &Activity,
) -> Result<(), PlaneError> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        activity.touch();
        to.write_all(&buf[..n]).await?;
    }
}
