//! The workload plane: what a lease's renter does in its container besides running the
//! workload, over libp2p streams to the host (`gpux exec`, `gpux forward`, `gpux cp`).
//!
//! - `host` serves the streams: only to the peer that signed the lease, only while its
//!   container runs, bounded in number, idle time and the lease's end.
//! - `bridge` is the renter node's side: the local API's WebSocket endpoints that the CLI
//!   talks to, each bridged to one stream to the host.
//! - `copy` is the renter node's side of a copy (a session on one files stream, trees as
//!   `cp -r`); `delegate` runs it for `gpux cp`, the CLI (in `gpux-client`) only showing
//!   progress.
//! - `files` serves a lease's workspace from its filesystem on the host, through `confined`
//!   (every path resolved by `openat2` beneath the workspace, through no link).
//!
//! - `stage` and `stage_host` stage a renter's own image on a host before its lease: the
//!   renter's side and the host's; `staged` records which renter holds which image.
//!
//! Frames are [`gpux_protocol::plane_wire`]'s, length-prefixed on the stream.

pub(crate) mod bridge;
pub(crate) mod challenge;
mod chunks;
mod confined;
pub(crate) mod copy;
pub(crate) mod delegate;
mod files;
pub(crate) mod host;
pub mod pull;
pub(crate) mod pull_host;
pub(crate) mod pulled;
mod put;
mod sftp;
mod splice;
mod ssh_host;
pub(crate) mod stage;
pub(crate) mod stage_host;
mod stage_pace;
pub(crate) mod staged;
pub(crate) mod turns;

pub(crate) use stage::chain_ids;

use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use gpux_protocol::FrameError;
use gpux_protocol::plane_wire::{self, MAX_PLANE_FRAME};
use libp2p::StreamProtocol;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};

/// `/gpux/exec/1`.
pub(crate) const EXEC: StreamProtocol = StreamProtocol::new(plane_wire::EXEC_PROTOCOL);
/// `/gpux/forward/1`.
pub(crate) const FORWARD: StreamProtocol = StreamProtocol::new(plane_wire::FORWARD_PROTOCOL);
/// `/gpux/files/1`.
pub(crate) const FILES: StreamProtocol = StreamProtocol::new(plane_wire::FILES_PROTOCOL);
/// `/gpux/ssh/1`.
pub(crate) const SSH: StreamProtocol = StreamProtocol::new(plane_wire::SSH_PROTOCOL);

/// How long the opening exchange of a stream may take, either side.
pub(crate) const OPEN_WITHIN: Duration = Duration::from_secs(10);
/// A stream with no bytes either way for this long is closed (and every stream closes when
/// its lease ends).
pub(crate) const IDLE: Duration = Duration::from_secs(15 * 60);

/// A plane stream, framed.
pub(crate) type FramedStream = Framed<Compat<libp2p::Stream>, LengthDelimitedCodec>;

/// Frames `stream` with 4-byte big-endian lengths, at most [`MAX_PLANE_FRAME`] each.
pub(crate) fn framed(stream: libp2p::Stream) -> FramedStream {
    LengthDelimitedCodec::builder()
        .big_endian()
        .length_field_length(4)
        .max_frame_length(MAX_PLANE_FRAME)
        .new_framed(stream.compat())
}

/// The host's record of `lease` and its signed request, when `peer` (proven by the
/// connection's handshake) is the renter who signed it; a refusal that names no more
/// otherwise (another peer learns nothing of whose leases this host runs).
pub(crate) fn renters_lease(
    state: &crate::store::NodeState<crate::store::SledStore>,
    peer: libp2p::PeerId,
    lease: gpux_protocol::ContentId,
) -> Result<
    (
        gpux_lease::HostRecord,
        gpux_protocol::Verified<gpux_protocol::LeaseRequest>,
    ),
    (plane_wire::PlaneRefusal, String),
> {
    let not_yours = || {
        (
            plane_wire::PlaneRefusal::NotYourLease,
            format!("this host has no lease {lease} of yours"),
        )
    };
    let record = state
        .host_lease(&lease)
        .ok()
        .flatten()
        .ok_or_else(not_yours)?;
    let request =
        gpux_protocol::Signed::<gpux_protocol::LeaseRequest>::from_bytes(record.request.clone())
            .and_then(gpux_protocol::Signed::verify)
            .map_err(|_| not_yours())?;
    let renter = libp2p::PeerId::from_bytes(&request.signer().peer_id().to_bytes()).ok();
    if renter != Some(peer) {
        return Err(not_yours());
    }
    Ok((record, request))
}

/// What broke a plane stream.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlaneError {
    #[error("the stream failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the peer sent a bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("the peer closed the stream")]
    Closed,
    #[error("no frame within {0:?}")]
    Timeout(Duration),
    #[error("the peer read nothing for {0:?}")]
    Stalled(Duration),
}

/// Sends one frame; fails when the peer reads nothing for [`IDLE`].
pub(crate) async fn send<T: bincode::Encode>(
    framed: &mut FramedStream,
    value: &T,
) -> Result<(), PlaneError> {
    match tokio::time::timeout(IDLE, framed.send(Bytes::from(plane_wire::encode(value)))).await {
        Ok(sent) => sent.map_err(PlaneError::Io),
        Err(_) => Err(PlaneError::Stalled(IDLE)),
    }
}

/// Queues one encoded frame without flushing it; fails when the peer reads nothing for
/// [`IDLE`].
pub(crate) async fn feed(framed: &mut FramedStream, frame: Bytes) -> Result<(), PlaneError> {
    match tokio::time::timeout(IDLE, framed.feed(frame)).await {
        Ok(fed) => fed.map_err(PlaneError::Io),
        Err(_) => Err(PlaneError::Stalled(IDLE)),
    }
}

/// A frame received where a file's bytes may come: a data frame's bytes, taken where they
/// lie in the frame received (no copy), or any other frame, decoded.
pub(crate) enum Incoming<T> {
    /// The bytes of a data frame.
    Data(Bytes),
    /// Any other frame.
    Frame(T),
}

impl<T: plane_wire::DataFrame + bincode::Decode<()>> Incoming<T> {
    /// Takes `frame` apart: in place when it is a data frame, else decoded as any frame.
    pub(crate) fn of(frame: Bytes) -> Result<Incoming<T>, FrameError> {
        match plane_wire::data_in::<T>(&frame) {
            Some(at) => Ok(Incoming::Data(frame.slice(at))),
            None => plane_wire::decode(&frame).map(Incoming::Frame),
        }
    }
}

/// Receives one frame within `within`, a data frame's bytes in place.
pub(crate) async fn recv_data<T: plane_wire::DataFrame + bincode::Decode<()>>(
    framed: &mut FramedStream,
    within: Duration,
) -> Result<Incoming<T>, PlaneError> {
    Ok(Incoming::of(next_frame(framed, within).await?.freeze())?)
}

/// The next frame's bytes, within `within`.
async fn next_frame(
    framed: &mut FramedStream,
    within: Duration,
) -> Result<bytes::BytesMut, PlaneError> {
    match tokio::time::timeout(within, framed.next()).await {
        Err(_) => Err(PlaneError::Timeout(within)),
        Ok(None) => Err(PlaneError::Closed),
        Ok(Some(Err(e))) => Err(PlaneError::Io(e)),
        Ok(Some(Ok(bytes))) => Ok(bytes),
    }
}

/// Receives one frame within `within`.
pub(crate) async fn recv<T: bincode::Decode<()> + bincode::Encode>(
    framed: &mut FramedStream,
    within: Duration,
) -> Result<T, PlaneError> {
    Ok(plane_wire::decode(&next_frame(framed, within).await?)?)
}

/// Runs blocking filesystem work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PlaneError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PlaneError::Io(std::io::Error::other(e.to_string())))
}
