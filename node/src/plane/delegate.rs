//! `gpux cp` done by the node: the CLI names the local path and the workspace path, and the
//! renter's node reads or writes the local file itself over its `/gpux/files/1` stream to the
//! host, sending the CLI only its progress and the report (`GET
//! /v1/leases/{lease}/copy?request=...`, a WebSocket of JSON [`CopyEvent`]s; the CLI's side
//! is `gpux_client::copy`).
//!
//! Before, every byte of a copy crossed the CLI's WebSocket to its node and was framed once
//! more; on two cores that hop cost about half of the copy's throughput (docs/benchmarks.md).
//! That transport is gone; its figures stay in docs/benchmarks.md.
//!
//! The node does the I/O with its own user's rights. That gives the caller nothing it lacks:
//! the local API takes only the token in the node's data directory, which is readable by the
//! node's user alone (0600), so whoever holds it can read and write what that user can.
//! The path must be absolute (the CLI resolves it against its own working directory).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use futures::SinkExt;
use gpux_api::{CopyEvent, CopyOrder};

use super::FramedStream;
use super::copy::{Progress, download_over, upload_over};

/// How often the node reports progress to the CLI.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

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
