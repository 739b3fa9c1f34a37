//! The transports under the workload plane, measured raw for `gpux testnet plane-bench`: a
//! libp2p stream on the node's own network stack (TCP, noise, yamux) between two peers in
//! this process, or between this process and another (`gpux testnet stream-sink`), as a
//! copy runs between two node processes; and loopback TCP.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use gpux_node::p2p::{self, Client, Multiaddr, NetConfig, PeerId, StreamProtocol, multiaddr};
use tokio::io::AsyncBufReadExt;

const PROTOCOL: &str = "/gpux-bench/1";
/// How long a peer may take to listen, connect, or open the stream.
const SETUP: Duration = Duration::from_secs(10);

/// A peer on loopback, without Kademlia, keyed by `seed`.
async fn peer(seed: u8) -> anyhow::Result<Client> {
    let config = NetConfig {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("a multiaddr")],
        kademlia: false,
        ..NetConfig::default()
    };
    let (client, _events) =
        p2p::spawn(&gpux_protocol::Keypair::from_seed(&[seed; 32]), config).await?;
    Ok(client)
}

/// `node`'s first listen address, with its peer id.
async fn address(node: &Client) -> anyhow::Result<Multiaddr> {
    let started = Instant::now();
    loop {
        if let Some(addr) = node.listen_addrs().await?.into_iter().next() {
            return Ok(addr.with(multiaddr::Protocol::P2p(node.local_peer_id())));
        }
        anyhow::ensure!(started.elapsed() < SETUP, "no listen address");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Dials `addr` (which ends in `peer`'s id) from `from` and opens the benchmark's stream.
async fn open(from: &Client, peer: PeerId, addr: Multiaddr) -> anyhow::Result<p2p::Stream> {
    from.dial(addr).await?;
    let started = Instant::now();
    while !from.peers().await?.contains(&peer) {
        anyhow::ensure!(started.elapsed() < SETUP, "the peers did not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(from
        .open_stream(peer, StreamProtocol::new(PROTOCOL), SETUP)
        .await?)
}

/// Writes `bytes` to `stream` and closes it: one repeated 64 KiB block, or the first
/// `bytes` of the file `from`, read in 256 KiB pieces (as a copy reads its file).
async fn fill(stream: &mut p2p::Stream, bytes: u64, from: Option<&Path>) -> anyhow::Result<()> {
    let mut file = from.map(std::fs::File::open).transpose()?;
    let mut buf = vec![7u8; if file.is_some() { 256 } else { 64 } * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if let Some(file) = &mut file {
            // A blocking read, in the benchmark's own sending task: from the page cache, a
            // piece takes tens of microseconds, and nothing else waits on this peer.
            std::io::Read::read_exact(file, &mut buf[..n])?;
        }
        stream.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    stream.close().await?;
    Ok(())
}

/// Reads `stream` to its end, writing it into a new file `into` when given; the bytes read.
async fn drain(mut stream: p2p::Stream, into: Option<&Path>) -> anyhow::Result<u64> {
    let mut file = match into {
        Some(path) => Some(tokio::io::BufWriter::with_capacity(
            1 << 20,
            tokio::fs::File::create(path).await?,
        )),
        None => None,
    };
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0u64;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            if let Some(file) = &mut file {
                tokio::io::AsyncWriteExt::flush(file).await?;
            }
            return Ok(got);
        }
        if let Some(file) = &mut file {
            tokio::io::AsyncWriteExt::write_all(file, &buf[..n]).await?;
        }
        got += n as u64;
    }
}

/// `bytes` through a raw libp2p stream between two fresh peers in this process; the
/// receiver writes them into a new file `into` when given (as a copy down must).
pub(crate) async fn libp2p_stream(bytes: u64, into: Option<PathBuf>) -> anyhow::Result<Duration> {
    let (a, b) = (peer(1).await?, peer(2).await?);
    let mut incoming = b.accept_streams(StreamProtocol::new(PROTOCOL))?;
    let reader = tokio::spawn(async move {
        let (_, stream) = incoming.next().await.context("no stream")?;
        drain(stream, into.as_deref()).await
    });
    let mut stream = open(&a, b.local_peer_id(), address(&b).await?).await?;
    let start = Instant::now();
    fill(&mut stream, bytes, None).await?;
    let got = reader.await??;
    anyhow::ensure!(got == bytes, "the stream carried {got} of {bytes} bytes");
    Ok(start.elapsed())
}

/// `bytes` through a raw libp2p stream from a peer in this process to one in a process of
/// its own (`gpux testnet stream-sink`, run from `gpux`), as a copy runs between two nodes;
/// the sender reads them from the file `from` when given, the receiver writes them into a
/// new file `into` when given.
pub async fn libp2p_stream_two_processes(
    gpux: &Path,
    bytes: u64,
    from: Option<&Path>,
    into: Option<PathBuf>,
) -> anyhow::Result<Duration> {
    let mut command = tokio::process::Command::new(gpux);
    command.args(["testnet", "stream-sink"]);
    if let Some(path) = &into {
        command.arg("--into").arg(path);
    }
    let mut sink = command
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting gpux testnet stream-sink")?;
    let mut said =
        tokio::io::BufReader::new(sink.stdout.take().context("the sink's stdout")?).lines();
    let line = tokio::time::timeout(SETUP, said.next_line())
        .await
        .context("the sink did not say its address")??
        .context("the sink ended before saying its address")?;
    let addr: Multiaddr = line.parse().context("the sink's address")?;
    let Some(multiaddr::Protocol::P2p(sink_id)) = addr.iter().last() else {
        anyhow::bail!("the sink's address {addr} names no peer");
    };
    let a = peer(3).await?;
    let mut stream = open(&a, sink_id, addr).await?;
    let start = Instant::now();
    fill(&mut stream, bytes, from).await?;
    let got = said
        .next_line()
        .await?
        .context("the sink ended without saying what it got")?;
    let took = start.elapsed();
    anyhow::ensure!(
        got == bytes.to_string(),
        "the stream carried {got} of {bytes} bytes"
    );
    sink.wait().await?;
    Ok(took)
}

/// `gpux testnet stream-sink`: prints its address, takes one stream on the benchmark's
/// protocol, reads it to its end (into a new file `into` when given) and prints how many
/// bytes came.
pub async fn stream_sink(into: Option<PathBuf>) -> anyhow::Result<()> {
    let node = peer(2).await?;
    let mut incoming = node.accept_streams(StreamProtocol::new(PROTOCOL))?;
    println!("{}", address(&node).await?);
    let (_, stream) = incoming.next().await.context("no stream")?;
    let got = drain(stream, into.as_deref()).await?;
    println!("{got}");
    Ok(())
}

/// `bytes` through raw loopback TCP.
pub(crate) async fn tcp(bytes: u64) -> anyhow::Result<Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0u64;
        loop {
            let n = conn.read(&mut buf).await?;
            if n == 0 {
                return Ok::<u64, std::io::Error>(got);
            }
            got += n as u64;
        }
    });
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let buf = vec![7u8; 64 * 1024];
    let start = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        conn.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    conn.shutdown().await?;
    reader.await??;
    Ok(start.elapsed())
}

/// A plain TCP relay on loopback: each connection to the returned port is carried, both
/// ways, to `to` on loopback, through a 256 KiB buffer as a forward's splice does, without
/// encryption or framing. Two chained in front of a server make the three loopback hops
/// any forward's bytes take (client, renter node, host node, server), at their least cost.
/// The listener's thread lives as long as the process; each connection gets its own two.
pub(crate) fn tcp_relay(to: u16) -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(down) = conn else { continue };
            let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let (Ok(down2), Ok(up2)) = (down.try_clone(), up.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || relay_one_way(down, up));
            std::thread::spawn(move || relay_one_way(up2, down2));
        }
    });
    Ok(port)
}

/// Copies `from` into `to` until `from` ends, then shuts `to`'s writing half.
fn relay_one_way(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 256 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::tcp_relay;

    /// A request goes up through two chained relays and its answer comes back whole, ended
    /// when the server closes: what the plane bench's HTTP bound measures.
    #[test]
    fn two_relays_carry_a_request_and_its_answer() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        let answer: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = answer.clone();
        let served = std::thread::spawn(move || {
            let (mut conn, _) = server.accept().unwrap();
            let mut request = [0u8; 5];
            conn.read_exact(&mut request).unwrap();
            conn.write_all(&sent).unwrap();
            request
        });
        let front = tcp_relay(tcp_relay(port).unwrap()).unwrap();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", front)).unwrap();
        client.write_all(b"hello").unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        assert_eq!(&served.join().unwrap(), b"hello");
        assert_eq!(got.len(), answer.len());
        assert!(got == answer, "the answer changed on its way");
    }
}
