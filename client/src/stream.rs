//! The CLI's side of the workload plane: `gpux exec` and `gpux forward` (and `forward
//! --stdio`, the `ProxyCommand` of `gpux ssh-config`) talk to their own
//! node's local API over WebSockets (with its token), and the node bridges each to a stream
//! to the lease's host.

use std::net::SocketAddr;

use base64::Engine;
use futures::{SinkExt, StreamExt};
use gpux_api::{ApiError, ErrorCode, ExecRequest, ForwardEvent};
use gpux_protocol::BoundedBytes;
use gpux_protocol::plane_wire::{self, ExecInput, ExecOutput, MAX_EXEC_DATA};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::api::{ApiClient, ClientError};

pub(crate) type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Opens the API's WebSocket at `path_and_query`; an API refusal comes back as its error.
pub(crate) async fn connect(api: &ApiClient, path_and_query: &str) -> Result<Socket, ClientError> {
    let buffer = 128 << 10;
    let url = format!(
        "{}{path_and_query}",
        api.base().replacen("http://", "ws://", 1)
    );
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| ClientError::Unreachable {
            base: api.base().to_string(),
            why: e.to_string(),
        })?;
    let bearer = format!("Bearer {}", api.token())
        .parse()
        .map_err(|_| ClientError::NotRunning(std::path::PathBuf::from("(bad token)")))?;
    request.headers_mut().insert("Authorization", bearer);
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(plane_wire::MAX_PLANE_FRAME + 1024))
        .read_buffer_size(buffer)
        .write_buffer_size(buffer);
    match tokio_tungstenite::connect_async_with_config(request, Some(config), true).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status();
            let body = response.into_body().unwrap_or_default();
            Err(ClientError::Api(
                serde_json::from_slice::<ApiError>(&body).unwrap_or_else(|_| {
                    ApiError::new(ErrorCode::Internal, format!("HTTP {status}"))
                }),
            ))
        }
        Err(e) => Err(ClientError::Unreachable {
            base: api.base().to_string(),
            why: e.to_string(),
        }),
    }
}

/// Runs `request` in `lease`'s container: `stdin` goes in (until it ends), the command's
/// stdout and stderr come out, `resizes` carry terminal sizes (with a tty). Returns the
/// command's exit code (`None` when the host could not say, or the link broke).
pub async fn exec(
    api: &ApiClient,
    lease: &str,
    request: &ExecRequest,
    mut stdin: Option<impl AsyncRead + Unpin>,
    mut stdout: impl AsyncWrite + Unpin,
    mut stderr: impl AsyncWrite + Unpin,
    mut resizes: mpsc::Receiver<(u16, u16)>,
) -> Result<Option<i64>, ClientError> {
    let json = serde_json::to_vec(request).unwrap_or_default();
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
    let socket = connect(api, &format!("/v1/leases/{lease}/exec?request={encoded}")).await?;
    let (mut tx, mut rx) = socket.split();
    let up = async {
        let mut buf = vec![0u8; MAX_EXEC_DATA];
        let mut reading = stdin.is_some();
        // Without a terminal no sizes come: the channel is closed from the start.
        let mut resizing = true;
        if !reading {
            // No stdin: the command reads end-of-file at once, as with `docker exec`
            // without `-i`.
            let end = plane_wire::encode(&ExecInput::StdinEnd);
            if tx.send(Message::Binary(end.into())).await.is_err() {
                return;
            }
        }
        loop {
            let read = async {
                match stdin.as_mut() {
                    Some(s) => s.read(&mut buf).await,
                    None => std::future::pending().await,
                }
            };
            let frame = tokio::select! {
                read = read, if reading => {
                    match read {
                        Ok(0) | Err(_) => {
                            reading = false;
                            ExecInput::StdinEnd
                        }
                        Ok(n) => match BoundedBytes::new(buf[..n].to_vec()) {
                            Ok(data) => ExecInput::Stdin(data),
                            Err(_) => continue,
                        },
                    }
                }
                size = resizes.recv(), if resizing => match size {
                    Some((rows, cols)) => ExecInput::Resize { rows, cols },
                    None => {
                        resizing = false;
                        continue;
                    }
                },
                else => std::future::pending().await,
            };
            let bytes = plane_wire::encode(&frame);
            if tx.send(Message::Binary(bytes.into())).await.is_err() {
                break;
            }
        }
    };
    let down = async {
        while let Some(Ok(message)) = rx.next().await {
            let Message::Binary(bytes) = message else {
                continue;
            };
            match plane_wire::decode::<ExecOutput>(&bytes) {
                // Where this side's own output is gone (a closed pipe), nothing more can be
                // shown: the command's session ends here, as a local program's would.
                Ok(ExecOutput::Stdout(data)) => {
                    if stdout.write_all(&data).await.is_err() || stdout.flush().await.is_err() {
                        return None;
                    }
                }
                Ok(ExecOutput::Stderr(data)) => {
                    if stderr.write_all(&data).await.is_err() || stderr.flush().await.is_err() {
                        return None;
                    }
                }
                Ok(ExecOutput::Exit(code)) => return code,
                Err(_) => return None,
            }
        }
        None
    };
    tokio::pin!(down);
    let code = tokio::select! {
        code = &mut down => code,
        () = up => down.await,
    };
    Ok(code)
}

/// How a forward ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardEnd {
    /// `stop` resolved.
    Stopped,
    /// The lease ended.
    LeaseEnded,
}

/// Forwards `127.0.0.1:local` (0: a free port) on the renter's machine to `remote` on
/// `lease`'s container loopback until `stop` resolves or the lease ends. The node listens
/// and carries the bytes itself; this only holds its WebSocket open. Calls `ready` once the
/// node listens, and `on_error` for each connection that could not be carried.
pub async fn forward(
    api: &ApiClient,
    lease: &str,
    local: u16,
    remote: u16,
    ready: impl FnOnce(SocketAddr),
    on_error: impl Fn(&ClientError),
    stop: impl std::future::Future<Output = ()>,
) -> Result<ForwardEnd, ClientError> {
    let path = format!("/v1/leases/{lease}/listen?local={local}&port={remote}");
    let mut socket = connect(api, &path).await?;
    let broke = |why: String| ClientError::Unreachable {
        base: api.base().to_string(),
        why,
    };
    let mut next_event = async || loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => {
                return serde_json::from_str::<ForwardEvent>(&text)
                    .map_err(|e| broke(format!("the node sent a bad forward event: {e}")));
            }
            Some(Ok(Message::Close(_))) | None => {
                return Err(broke("the node stopped the forward".into()));
            }
            Some(Err(e)) => return Err(broke(e.to_string())),
            Some(Ok(_)) => {}
        }
    };
    match next_event().await? {
        ForwardEvent::Listening { addr } => {
            let addr = addr
                .parse()
                .map_err(|e| broke(format!("the node listens on {addr:?}: {e}")))?;
            ready(addr);
        }
        other => return Err(broke(format!("the node answered {other:?}, not listening"))),
    }
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return Ok(ForwardEnd::Stopped),
            event = next_event() => match event? {
                ForwardEvent::Failed { error } => on_error(&ClientError::Api(error)),
                ForwardEvent::Ended => return Ok(ForwardEnd::LeaseEnded),
                ForwardEvent::Listening { .. } => {}
            },
        }
    }
}

/// Fails unless `lease` is one this node rents and it has not ended.
async fn running_lease(api: &ApiClient, lease: &str) -> Result<(), ClientError> {
    let api_ = api.clone();
    let lease_ = lease.to_string();
    let views = tokio::task::spawn_blocking(move || api_.leases())
        .await
        .map_err(|e| ClientError::Unreachable {
            base: api.base().to_string(),
            why: e.to_string(),
        })??;
    let view = views
        .into_iter()
        .find(|v| v.lease == lease_ && v.role == gpux_api::Role::Renter)
        .ok_or_else(|| {
            ClientError::Api(
                ApiError::new(
                    ErrorCode::UnknownLease,
                    format!("no lease {lease} rented by this node"),
                )
                .with_hint("`gpux leases` lists this node's leases"),
            )
        })?;
    if matches!(view.phase.as_str(), "ended" | "settled") {
        return Err(ClientError::Api(ApiError::new(
            ErrorCode::Conflict,
            format!("lease {lease} has ended"),
        )));
    }
    Ok(())
}

/// Carries one connection to `remote` on `lease`'s container loopback over this process's
/// standard input and output, until the container's side closes: what OpenSSH's
/// `ProxyCommand` wants (`gpux ssh-config`).
pub async fn forward_stdio(api: &ApiClient, lease: &str, remote: u16) -> Result<(), ClientError> {
    running_lease(api, lease).await?;
    let socket = connect(api, &format!("/v1/leases/{lease}/forward?port={remote}")).await?;
    carry(tokio::io::stdin(), tokio::io::stdout(), socket).await;
    Ok(())
}

/// Carries one SSH connection into the lease over stdin and stdout (`gpux ssh`'s
/// `ProxyCommand`): the lease's host is the SSH server.
pub async fn ssh_stdio(api: &ApiClient, lease: &str) -> Result<(), ClientError> {
    running_lease(api, lease).await?;
    let socket = connect(api, &format!("/v1/leases/{lease}/ssh")).await?;
    carry(tokio::io::stdin(), tokio::io::stdout(), socket).await;
    Ok(())
}

/// Carries bytes from `read` up the WebSocket and from it down to `write`, until the far
/// side is done.
async fn carry(
    mut read: impl AsyncRead + Unpin,
    mut write: impl AsyncWrite + Unpin,
    socket: Socket,
) {
    let (mut tx, mut rx) = socket.split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
                    if tx.send(Message::Binary(chunk)).await.is_err() {
                        break;
                    }
                }
            }
        }
        // The end of this side's data, as an empty message: the connection stays open
        // for the other side's (a WebSocket close would end both).
        let _ = tx.send(Message::Binary(bytes::Bytes::new())).await;
    };
    let down = async {
        while let Some(Ok(message)) = rx.next().await {
            let bytes = match message {
                Message::Binary(bytes) => bytes,
                Message::Close(_) => break,
                _ => continue,
            };
            if write.write_all(&bytes).await.is_err() || write.flush().await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    };
    tokio::pin!(down);
    tokio::select! {
        () = &mut down => {}
        () = up => down.await,
    }
}
