//! The request-response codec of `/gpux/lease/1` (and the other request-response protocols):
//! one signed envelope per message, preceded by its length as a big-endian u32. Frames
//! larger than the largest envelope are refused before anything is allocated.

use std::io;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use gpux_protocol::MAX_ENVELOPE_BYTES;
use libp2p::StreamProtocol;

/// Raw envelope bytes; the node verifies them before use. Frames are at most `max` bytes
/// (the largest envelope, unless built with [`EnvelopeCodec::with_max`]).
#[derive(Debug, Clone)]
pub(crate) struct EnvelopeCodec {
    max: usize,
}

impl Default for EnvelopeCodec {
    fn default() -> Self {
        Self {
            max: MAX_ENVELOPE_BYTES,
        }
    }
}

impl EnvelopeCodec {
    /// Frames of at most `max` bytes.
    pub(crate) fn with_max(max: usize) -> Self {
        Self { max }
    }
}

async fn read_frame<T: AsyncRead + Unpin + Send>(io: &mut T, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {max}"),
        ));
    }
    let mut buf = vec![0u8; len];
    io.read_exact(&mut buf).await?;
    Ok(buf)
}

async fn write_frame<T: AsyncWrite + Unpin + Send>(
    io: &mut T,
    data: &[u8],
    max: usize,
) -> io::Result<()> {
    let len = u32::try_from(data.len())
        .ok()
        .filter(|&l| l as usize <= max)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    io.write_all(&len.to_be_bytes()).await?;
    io.write_all(data).await?;
    io.close().await
}

impl libp2p::request_response::Codec for EnvelopeCodec {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Vec<u8>> {
        read_frame(io, self.max).await
    }

    async fn read_response<T: AsyncRead + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
    ) -> io::Result<Vec<u8>> {
        read_frame(io, self.max).await
    }

    async fn write_request<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> io::Result<()> {
        write_frame(io, &req, self.max).await
    }

    async fn write_response<T: AsyncWrite + Unpin + Send>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: Vec<u8>,
    ) -> io::Result<()> {
        write_frame(io, &res, self.max).await
    }
}
