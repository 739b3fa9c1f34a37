//! The renter node's side of the workload plane: the local API's WebSocket endpoints
//! (`GET /v1/leases/{lease}/exec`, `GET /v1/leases/{lease}/forward`), each bridged to one
//! stream to the lease's host.
//!
//! The stream is opened and its open frame answered before the WebSocket upgrade, so every
//! refusal (no such lease, not running, the host's own refusal) is a plain API error. After
//! the upgrade, exec carries one plane frame per binary WebSocket message, both ways; forward
//! carries raw bytes.
//!
//! `gpux forward` does not carry bytes through the CLI: the node listens on the renter's
//! loopback itself (`GET /v1/leases/{lease}/listen`) and splices each connection it accepts
//! onto its own forward stream, for as long as the CLI's WebSocket stays open.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures::future::ready;
use futures::{SinkExt, StreamExt};
use gpux_api::{ApiError, ErrorCode, ExecRequest, ForwardEvent};
use gpux_lease::{RenterPhase, RenterRecord};
use gpux_protocol::plane_wire::{
    ExecOpen, FilesOpen, ForwardOpen, MAX_PLANE_FRAME, Opened, PlaneRefusal, SshOpen,
};
use gpux_protocol::{BoundedString, BoundedVec, ContentId, EnvVar, LeaseAccept, Signed};
use libp2p::{PeerId, StreamProtocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::splice::{AppSide, splice};
use super::{FramedStream, OPEN_WITHIN, framed, recv, send};
use crate::p2p::Client;
use crate::store::{NodeState, SledStore};

/// What the bridge needs: the network and the renter's leases.
#[derive(Clone)]
pub(crate) struct Bridge {
    pub(crate) net: Client,
    pub(crate) state: NodeState<SledStore>,
}

fn unknown(lease: &ContentId) -> ApiError {
    ApiError::new(
        ErrorCode::UnknownLease,
        format!("no lease {lease} rented by this node"),
    )
    .with_hint("`gpux leases` lists this node's leases")
}

impl Bridge {
    /// The host of a lease this node rents that still runs (or, `ended_too`, that ran: its
    /// workspace may be kept for a while after).
    fn host_of(&self, lease: &str, ended_too: bool) -> Result<(ContentId, PeerId), ApiError> {
        let id: ContentId = lease
            .parse()
            .map_err(|e| ApiError::bad_input(format!("lease id: {e}")))?;
        let record: RenterRecord = self
            .state
            .renter_lease(&id)
            .ok()
            .flatten()
            .ok_or_else(|| unknown(&id))?;
        if !ended_too && !matches!(record.phase, RenterPhase::Starting | RenterPhase::Running) {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("lease {id} has ended"),
            ));
        }
        let accept = Signed::<LeaseAccept>::from_bytes(record.accept)
            .and_then(Signed::verify)
            .map_err(|e| {
                ApiError::new(ErrorCode::Internal, format!("the stored acceptance: {e}"))
            })?;
        let host = PeerId::from_bytes(&accept.signer().peer_id().to_bytes())
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
        Ok((id, host))
    }

    /// Opens `protocol` to the lease's host and sends `open`; returns the stream once the
    /// host said yes.
    async fn open<T: bincode::Encode>(
        &self,
        host: PeerId,
        protocol: StreamProtocol,
        open: &T,
    ) -> Result<FramedStream, ApiError> {
        let unavailable = |e: String| {
            ApiError::new(ErrorCode::Unavailable, format!("the host: {e}"))
                .with_hint("the host may be offline; try again")
        };
        let stream = self
            .net
            .open_stream(host, protocol, OPEN_WITHIN)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let mut framed = framed(stream);
        send(&mut framed, open)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        match recv::<Opened>(&mut framed, OPEN_WITHIN).await {
            Ok(Opened::Yes) => Ok(framed),
            Ok(Opened::No { code, detail }) => Err(refusal(code, &detail)),
            Err(e) => Err(unavailable(e.to_string())),
        }
    }

    /// Opens an exec stream for `request` in `lease`'s container.
    pub(crate) async fn open_exec(
        &self,
        lease: &str,
        request: &ExecRequest,
    ) -> Result<FramedStream, ApiError> {
        let (id, host) = self.host_of(lease, false)?;
        let open = exec_open(id, request)?;
        self.open(host, super::EXEC, &open).await
    }

    /// Opens a files stream to `lease`'s workspace.
    pub(crate) async fn open_files(&self, lease: &str) -> Result<FramedStream, ApiError> {
        let (id, host) = self.host_of(lease, true)?;
        self.open(host, super::FILES, &FilesOpen { lease: id })
            .await
    }

    /// Opens an SSH stream into `lease` (the host's node is the server).
    pub(crate) async fn open_ssh(&self, lease: &str) -> Result<FramedStream, ApiError> {
        let (id, host) = self.host_of(lease, false)?;
        self.open(host, super::SSH, &SshOpen { lease: id }).await
    }

    /// Opens a forward stream to `port` on `lease`'s container loopback.
    pub(crate) async fn open_forward(
        &self,
        lease: &str,
        port: u16,
    ) -> Result<FramedStream, ApiError> {
        if port == 0 {
            return Err(ApiError::bad_input("port: must be 1 to 65535"));
        }
        let (id, host) = self.host_of(lease, false)?;
        self.open(host, super::FORWARD, &ForwardOpen { lease: id, port })
            .await
    }
}

/// Local connections one forward carries at once; more are closed as they come.
const MAX_FORWARDED: usize = 64;
/// How often a forward's listener checks that its lease still runs.
const LEASE_CHECK: Duration = Duration::from_secs(2);

/// A forward's listener on the renter's loopback, bound before the CLI's WebSocket is
/// upgraded (a port in use is a plain API error).
pub(crate) struct ForwardListener {
    listener: tokio::net::TcpListener,
    lease: String,
    port: u16,
}

impl Bridge {
    /// Listens on `127.0.0.1:local` (0: any free port) for connections to carry to `port`
    /// on the loopback of `lease`'s container.
    pub(crate) async fn listen(
        &self,
        lease: &str,
        local: u16,
        port: u16,
    ) -> Result<ForwardListener, ApiError> {
        if port == 0 {
            return Err(ApiError::bad_input("port: must be 1 to 65535"));
        }
        self.host_of(lease, false)?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, local));
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ApiError::bad_input(format!("cannot listen on {addr}: {e}")))?;
        Ok(ForwardListener {
            listener,
            lease: lease.to_string(),
            port,
        })
    }
}

/// Serves a forward: each connection to the listener is carried over its own stream to the
/// host, until the CLI's WebSocket closes (every connection then ends with it) or the lease
/// ends. The WebSocket carries only [`ForwardEvent`]s.
pub(crate) async fn serve_forward(ws: WebSocket, bridge: Bridge, forward: ForwardListener) {
    let (mut ws_tx, mut ws_rx) = ws.split();
    let event =
        |e: &ForwardEvent| Message::Text(serde_json::to_string(e).unwrap_or_default().into());
    let addr = forward
        .listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    if ws_tx
        .send(event(&ForwardEvent::Listening { addr }))
        .await
        .is_err()
    {
        return;
    }
    let (failed_tx, mut failed) = tokio::sync::mpsc::channel::<ApiError>(16);
    // Dropped at the end: every connection still carried is aborted with it.
    let mut conns = tokio::task::JoinSet::new();
    let mut check = tokio::time::interval(LEASE_CHECK);
    loop {
        tokio::select! {
            accepted = forward.listener.accept() => {
                let conn = match accepted {
                    Ok((conn, _)) => conn,
                    Err(e) => {
                        // Out of descriptors, say: wait instead of spinning.
                        tracing::debug!("forward listener: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if conns.len() >= MAX_FORWARDED {
                    let _ = failed_tx.try_send(ApiError::new(
                        ErrorCode::Unavailable,
                        format!("{MAX_FORWARDED} connections are forwarded already; one more was closed"),
                    ));
                    continue;
                }
                let _ = conn.set_nodelay(true);
                let (bridge, failed_tx) = (bridge.clone(), failed_tx.clone());
                let (lease, port) = (forward.lease.clone(), forward.port);
                conns.spawn(async move {
                    match bridge.open_forward(&lease, port).await {
                        Ok(stream) => {
                            if let Err(e) = splice(conn, stream, AppSide::Stream).await {
                                tracing::debug!("forward to port {port}: {e}");
                            }
                        }
                        Err(e) => {
                            let _ = failed_tx.try_send(e);
                        }
                    }
                });
            }
            Some(error) = failed.recv() => {
                if ws_tx.send(event(&ForwardEvent::Failed { error })).await.is_err() {
                    break;
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = check.tick() => {
                if bridge.host_of(&forward.lease, false).is_err() {
                    let _ = ws_tx.send(event(&ForwardEvent::Ended)).await;
                    break;
                }
            }
            message = ws_rx.next() => {
                if !matches!(message, Some(Ok(m)) if !matches!(m, Message::Close(_))) {
                    break;
                }
            }
        }
    }
    let _ = ws_tx.close().await;
}

fn refusal(code: PlaneRefusal, detail: &str) -> ApiError {
    let code = match code {
        PlaneRefusal::Malformed => ErrorCode::BadInput,
        PlaneRefusal::NotYourLease => ErrorCode::UnknownLease,
        PlaneRefusal::NotRunning => ErrorCode::Conflict,
        PlaneRefusal::Busy | PlaneRefusal::Unavailable => ErrorCode::Unavailable,
        _ => ErrorCode::Unavailable,
    };
    ApiError::new(code, format!("the host refused: {detail}"))
}

/// The open frame of an exec request, with its bounds checked.
fn exec_open(lease: ContentId, request: &ExecRequest) -> Result<ExecOpen, ApiError> {
    if request.command.is_empty() {
        return Err(ApiError::bad_input("command: give the command to run"));
    }
    let command = request
        .command
        .iter()
        .map(|a| BoundedString::new(a.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .and_then(BoundedVec::new)
        .map_err(|e| ApiError::bad_input(format!("command: {e}")))?;
    let env = request
        .env
        .iter()
        .map(|(name, value)| {
            if name
                .get(..7)
                .is_some_and(|p| p.eq_ignore_ascii_case("NVIDIA_"))
            {
                return Err(ApiError::bad_input(format!(
                    "env: {name} may not be set: NVIDIA_* variables are set by the host"
                )));
            }
            Ok(EnvVar {
                name: BoundedString::new(name.as_str())
                    .map_err(|e| ApiError::bad_input(format!("env name: {e}")))?,
                value: BoundedString::new(value.as_str())
                    .map_err(|e| ApiError::bad_input(format!("env value: {e}")))?,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let env = BoundedVec::new(env).map_err(|e| ApiError::bad_input(format!("env: {e}")))?;
    Ok(ExecOpen {
        lease,
        command,
        env,
        tty: request.tty,
    })
}

/// Carries plane frames (exec, files) between the CLI's WebSocket and the host's stream,
/// one frame per message, until either ends.
pub(crate) async fn pump_frames(ws: WebSocket, stream: FramedStream) {
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut tx, mut rx) = stream.split();
    // Frames are passed on as they come and flushed only when no more are waiting, so a
    // copy's data moves in large writes while a lone exec frame still goes at once.
    let up = async {
        let mut frames = (&mut ws_rx)
            .take_while(|m| ready(matches!(m, Ok(m) if !matches!(m, Message::Close(_)))))
            .filter_map(|m| {
                ready(match m {
                    Ok(Message::Binary(bytes)) if bytes.len() <= MAX_PLANE_FRAME => {
                        Some(Ok::<_, std::io::Error>(bytes))
                    }
                    _ => None,
                })
            });
        let _ = tx.send_all(&mut frames).await;
        let _ = tx.close().await;
    };
    let down = async {
        let mut messages = (&mut rx)
            .take_while(|f| ready(f.is_ok()))
            .filter_map(|f| ready(f.ok().map(|f| Ok(Message::Binary(f.freeze())))));
        let _ = ws_tx.send_all(&mut messages).await;
        let _ = ws_tx.close().await;
    };
    // The host's side decides the end (it sends the exit code last).
    tokio::pin!(down);
    tokio::select! {
        () = &mut down => {}
        () = up => {
            let _ = tokio::time::timeout(Duration::from_secs(24 * 3600), down).await;
        }
    }
}

/// Carries a forwarded connection's bytes between the CLI's WebSocket and the host's stream.
/// An empty binary message from the CLI is its end of data (the stream is half-closed and
/// the host's bytes still come back); a close ends both ways.
pub(crate) async fn pump_forward(ws: WebSocket, stream: FramedStream) {
    let parts = stream.into_parts();
    let (mut from_host, mut to_host) = tokio::io::split(parts.io);
    let (mut ws_tx, mut ws_rx) = ws.split();
    let leftover = parts.read_buf.freeze();
    let up = async {
        while let Some(Ok(message)) = ws_rx.next().await {
            let bytes = match message {
                // An empty message is the client's end of data: a half-close.
                Message::Binary(bytes) if bytes.is_empty() => break,
                Message::Binary(bytes) => bytes,
                Message::Close(_) => break,
                _ => continue,
            };
            if to_host.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to_host.shutdown().await;
    };
    let down = async {
        if !leftover.is_empty() && ws_tx.send(Message::Binary(leftover)).await.is_err() {
            return;
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from_host.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    if ws_tx.send(Message::Binary(chunk)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = ws_tx.close().await;
    };
    tokio::pin!(down);
    tokio::select! {
        () = &mut down => {}
        () = up => {
            let _ = tokio::time::timeout(Duration::from_secs(24 * 3600), down).await;
        }
    }
}
