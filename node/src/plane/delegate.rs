//! `gpux cp` done by the node: the CLI names the local path and the workspace path, and the
//! renter's node reads or writes the local file itself over its `/gpux/files/1` stream to the
//! host, sending the CLI only its progress and the report (`GET
//! /v1/leases/{lease}/copy?request=...`, a WebSocket of JSON [`CopyEvent`]s).
//!
//! Before, every byte of a copy crossed the CLI's WebSocket to its node and was framed once
//! more; on two cores that hop cost about half of the copy's throughput (docs/benchmarks.md).
//!
//! The node does the I/O with its own user's rights. That gives the caller nothing it lacks:
//! the local API takes only the token in the node's data directory, which is readable by the
//! node's user alone (0600), so whoever holds it can read and write what that user can.
//! The path must be absolute (the CLI resolves it against its own working directory).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite;

use super::FramedStream;
use super::client::connect;
use super::copy::{CopyError, CopyReport, Place, Progress, download_over, upload_over};
use crate::api_client::ApiClient;

/// How often the node reports progress to the CLI.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// What the CLI asks its node to copy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CopyOrder {
    /// Into the workspace (`true`) or out of it.
    pub upload: bool,
    /// The local file or directory, an absolute path.
    pub local: PathBuf,
    /// The path under `/workspace`.
    pub remote: String,
    /// Into the remote directory (`LEASE:/workspace/dir/`), for an upload.
    pub into: bool,
}

/// What the node tells the CLI while it copies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyEvent {
    /// The total bytes to copy, and how many are done.
    Progress {
        /// All the files' bytes.
        total: u64,
        /// Done so far (sent, or found in place).
        done: u64,
    },
    /// The copy is done.
    Done(CopyReport),
    /// The copy failed; run it again to go on where it stopped.
    Failed(String),
}

#[derive(Default)]
struct Counter {
    total: AtomicU64,
    done: AtomicU64,
}

impl Progress for Counter {
    fn total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }
    fn advance(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }
}

async fn send(ws: &mut WebSocket, event: &CopyEvent) -> bool {
    match serde_json::to_string(event) {
        Ok(text) => ws.send(Message::Text(text.into())).await.is_ok(),
        Err(_) => false,
    }
}

/// The node's side: copies as `order` says over `stream` (a `/gpux/files/1` stream to the
/// lease's host), reporting to the CLI on `ws`. The CLI closing its socket cancels the copy
/// (a re-run goes on from the part it left).
pub(crate) async fn serve(mut ws: WebSocket, stream: FramedStream, order: CopyOrder) {
    let counter = Counter::default();
    let started = Instant::now();
    let work = async {
        if order.upload {
            upload_over(stream, &order.local, &order.remote, order.into, &counter).await
        } else {
            download_over(stream, &order.remote, &order.local, &counter).await
        }
    };
    tokio::pin!(work);
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    let mut last = (0, 0);
    let outcome = loop {
        tokio::select! {
            outcome = &mut work => break outcome,
            _ = tick.tick() => {
                let now = (
                    counter.total.load(Ordering::Relaxed),
                    counter.done.load(Ordering::Relaxed),
                );
                if now != last {
                    last = now;
                    let event = CopyEvent::Progress { total: now.0, done: now.1 };
                    if !send(&mut ws, &event).await {
                        return;
                    }
                }
            }
            message = ws.recv() => {
                if !matches!(message, Some(Ok(Message::Ping(_) | Message::Pong(_)))) {
                    tracing::info!("the CLI left a copy of {}: cancelled", order.remote);
                    return;
                }
            }
        }
    };
    let event = match outcome {
        Ok(mut report) => {
            report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            CopyEvent::Done(report)
        }
        Err(e) => CopyEvent::Failed(e.to_string()),
    };
    let _ = send(&mut ws, &event).await;
    let _ = ws.close().await;
}

/// The CLI's side: has the node copy between a local path and a lease's workspace, showing
/// `progress`. One side is `LEASE:/workspace/PATH`, the other a local path (made absolute
/// here, against this process's working directory).
pub async fn copy(
    api: &ApiClient,
    src: &Place,
    dst: &Place,
    progress: &dyn Progress,
) -> Result<CopyReport, CopyError> {
    let absolute = |p: &PathBuf| {
        std::path::absolute(p).map_err(|source| CopyError::Local {
            path: p.clone(),
            source,
        })
    };
    let (lease, order) = match (src, dst) {
        (Place::Local(from), Place::Remote { lease, path, into }) => (
            lease,
            CopyOrder {
                upload: true,
                local: absolute(from)?,
                remote: path.clone(),
                into: *into,
            },
        ),
        (Place::Remote { lease, path, .. }, Place::Local(to)) => (
            lease,
            CopyOrder {
                upload: false,
                local: absolute(to)?,
                remote: path.clone(),
                into: false,
            },
        ),
        _ => {
            return Err(CopyError::Usage(
                "one side of a copy is a lease's workspace (LEASE:/workspace/PATH), the other a local path".into(),
            ));
        }
    };
    use base64::Engine;
    let json = serde_json::to_vec(&order).map_err(|e| CopyError::Usage(e.to_string()))?;
    let request = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
    let mut socket = connect(api, &format!("/v1/leases/{lease}/copy?request={request}")).await?;
    let (mut told_total, mut shown) = (None, 0);
    while let Some(message) = socket.next().await {
        let text = match message {
            Ok(tungstenite::Message::Text(text)) => text,
            Ok(tungstenite::Message::Close(_)) => break,
            Ok(_) => continue,
            Err(e) => return Err(CopyError::Link(format!("the node: {e}"))),
        };
        let event: CopyEvent = serde_json::from_str(&text)
            .map_err(|e| CopyError::Link(format!("the node's report: {e}")))?;
        match event {
            CopyEvent::Progress { total, done } => {
                if told_total != Some(total) {
                    progress.total(total);
                    told_total = Some(total);
                }
                progress.advance(done.saturating_sub(shown));
                shown = shown.max(done);
            }
            CopyEvent::Done(report) => {
                progress.total(report.bytes);
                progress.advance(report.bytes.saturating_sub(shown));
                let _ = socket.close(None).await;
                return Ok(report);
            }
            CopyEvent::Failed(why) => return Err(CopyError::ByNode(why)),
        }
    }
    Err(CopyError::Link(
        "the node closed the copy before it ended".into(),
    ))
}
