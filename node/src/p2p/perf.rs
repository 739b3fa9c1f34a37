//! Bandwidth to peers, measured with libp2p's perf protocol (`/perf/1.0.0`, the libp2p
//! specs' `perf` document): the client sends the number of bytes it wants back (u64, big
//! endian), then its upload, then closes its side; the server reads to the end, then sends
//! that many bytes and closes. Every node serves it, bounded so that nobody can make a node
//! move more than a little: [`MAX_BYTES`] each way, two at once, one measurement
//! per peer every 30 s. A host measures its bandwidth to a few peers this way and
//! publishes the best rate each way in its offers (docs/host.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::{PeerId, StreamProtocol};

use super::{Client, NetError};

/// The perf protocol's name.
pub(crate) const PERF: StreamProtocol = StreamProtocol::new("/perf/1.0.0");
/// The most a served measurement moves each way.
pub const MAX_BYTES: u64 = 32 << 20;
/// Measurements served at once; more are closed at once.
const MAX_SERVED: usize = 2;
/// How often one peer may be served a measurement.
const PER_PEER_EVERY: Duration = Duration::from_secs(30);
/// Peers remembered for [`PER_PEER_EVERY`] (beyond it, the oldest are forgotten).
const MAX_REMEMBERED: usize = 1024;
/// A measurement's whole exchange, either side, at most.
const WITHIN: Duration = Duration::from_secs(30);

/// What one measurement found, bits per second each way (0 where nothing moved).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// From this node to the peer.
    pub up_bps: f64,
    /// From the peer to this node.
    pub down_bps: f64,
}

/// Serves the perf protocol to every peer, within the bounds above, until the node stops.
pub fn serve(net: &Client) -> Result<(), NetError> {
    let mut incoming = net.accept_streams(PERF)?;
    let busy = Arc::new(tokio::sync::Semaphore::new(MAX_SERVED));
    let recent: Arc<Mutex<HashMap<PeerId, Instant>>> = Arc::default();
    tokio::spawn(async move {
        while let Some((peer, stream)) = incoming.next().await {
            let Ok(permit) = busy.clone().try_acquire_owned() else {
                continue;
            };
            if !allowed(&recent, peer) {
                continue;
            }
            tokio::spawn(async move {
                let _permit = permit;
                if let Err(e) = tokio::time::timeout(WITHIN, answer(stream)).await {
                    tracing::debug!("perf for {peer}: {e}");
                }
            });
        }
    });
    Ok(())
}

/// Whether `peer` may be served now (and notes that it is).
fn allowed(recent: &Mutex<HashMap<PeerId, Instant>>, peer: PeerId) -> bool {
    let Ok(mut recent) = recent.lock() else {
        return false;
    };
    let now = Instant::now();
    recent.retain(|_, at| now.duration_since(*at) < PER_PEER_EVERY);
    if recent.contains_key(&peer) || recent.len() >= MAX_REMEMBERED {
        return false;
    }
    recent.insert(peer, now);
    true
}

/// The server's side of one measurement.
async fn answer(mut stream: libp2p::Stream) -> std::io::Result<()> {
    let mut wanted = [0u8; 8];
    stream.read_exact(&mut wanted).await?;
    let wanted = u64::from_be_bytes(wanted).min(MAX_BYTES);
    let mut buf = vec![0u8; 64 << 10];
    let mut received = 0u64;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        received += n as u64;
        if received > MAX_BYTES {
            return Err(std::io::Error::other("more than a measurement sends"));
        }
    }
    let block = vec![0u8; 64 << 10];
    let mut sent = 0u64;
    while sent < wanted {
        let n = (wanted - sent).min(block.len() as u64) as usize;
        stream.write_all(&block[..n]).await?;
        sent += n as u64;
    }
    stream.close().await
}

/// Measures the bandwidth to `peer`: `bytes` up, then `bytes` down (at most [`MAX_BYTES`]).
/// The upload is timed to the first byte of the answer, which the server sends only once it
/// has read everything; the download from there to the last byte.
pub async fn measure(net: &Client, peer: PeerId, bytes: u64) -> Result<Rates, NetError> {
    let bytes = bytes.min(MAX_BYTES);
    let failed = |e: std::io::Error| NetError::Request(format!("perf with {peer}: {e}"));
    let mut stream = net.open_stream(peer, PERF, Duration::from_secs(10)).await?;
    let exchange = async {
        let started = Instant::now();
        stream.write_all(&bytes.to_be_bytes()).await?;
        let block = vec![0x5au8; 64 << 10];
        let mut sent = 0u64;
        while sent < bytes {
            let n = (bytes - sent).min(block.len() as u64) as usize;
            stream.write_all(&block[..n]).await?;
            sent += n as u64;
        }
        stream.close().await?;
        let mut buf = vec![0u8; 64 << 10];
        let mut first = stream.read(&mut buf).await?;
        let up = started.elapsed();
        let down_started = Instant::now();
        let mut received = first as u64;
        while first > 0 {
            first = stream.read(&mut buf).await?;
            received += first as u64;
        }
        let down = down_started.elapsed();
        if received != bytes {
            return Err(std::io::Error::other(format!(
                "{received} bytes came back of {bytes}"
            )));
        }
        Ok(Rates {
            up_bps: bits_per_second(bytes, up),
            down_bps: bits_per_second(bytes, down),
        })
    };
    match tokio::time::timeout(WITHIN, exchange).await {
        Ok(result) => result.map_err(failed),
        Err(_) => Err(NetError::Request(format!(
            "perf with {peer}: no answer in {WITHIN:?}"
        ))),
    }
}

fn bits_per_second(bytes: u64, took: Duration) -> f64 {
    bytes as f64 * 8.0 / took.as_secs_f64().max(1e-6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_served_once_per_period() {
        let recent = Mutex::new(HashMap::new());
        let (a, b) = (PeerId::random(), PeerId::random());
        assert!(allowed(&recent, a));
        assert!(!allowed(&recent, a));
        assert!(allowed(&recent, b));
    }

    #[test]
    fn rates_are_bits_per_second() {
        let r = bits_per_second(1_000_000, Duration::from_millis(100));
        assert!((r - 80_000_000.0).abs() < 1.0, "{r}");
    }
}
