//! Link delay for the testnet: a wrapper around each TCP connection that holds every byte
//! written for a fixed delay plus jitter before it reaches the socket (`--link-delay-ms`,
//! `--link-jitter-ms`, hidden flags only `gpux testnet up --isolated --delay` sets).
//!
//! The kernel here has no netem, so the isolated testnet delays links in the nodes
//! themselves (loss and rate it shapes in the kernel: docs/testnet.md). Every node delays
//! what it sends, so each direction of a link is delayed once. Bytes keep their order, as on
//! a TCP link: a write whose jittered time falls before the previous one's waits for it.
//! Without a delay the wrapper passes every call straight through.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::channel::mpsc;
use futures::io::{ReadHalf, WriteHalf};
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, SinkExt, StreamExt};
use tokio::time::Instant;

/// The delay added to every byte a node sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkDelay {
    /// The mean delay.
    pub base: Duration,
    /// Each write's delay is drawn evenly from `base ± jitter`.
    pub jitter: Duration,
}

/// Writes held in the delay line at most, per connection: a writer that gets ahead waits.
const IN_FLIGHT: usize = 256;

/// A connection, delayed or not.
pub enum Shaped<S> {
    /// No delay: every call goes straight to the socket.
    Plain(S),
    /// Delayed writes.
    Delayed(Delayed<S>),
}

impl<S> Shaped<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Wraps a fresh connection (inside the tokio runtime when `delay` is set).
    pub fn new(stream: S, delay: Option<LinkDelay>) -> Self {
        match delay {
            None => Shaped::Plain(stream),
            Some(delay) => Shaped::Delayed(Delayed::new(stream, delay)),
        }
    }
}

/// A connection whose writes reach the socket after the link's delay.
pub struct Delayed<S> {
    reader: ReadHalf<S>,
    line: mpsc::Sender<(Instant, Vec<u8>)>,
    delay: LinkDelay,
    /// When the last write leaves: no write leaves before it.
    last: Instant,
}

impl<S> Delayed<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fn new(stream: S, delay: LinkDelay) -> Self {
        let (reader, writer) = stream.split();
        let (line, held) = mpsc::channel(IN_FLIGHT);
        tokio::spawn(deliver(writer, held));
        Delayed {
            reader,
            line,
            delay,
            last: Instant::now(),
        }
    }

    fn due(&mut self) -> Instant {
        let jitter = self.delay.jitter.as_micros() as u64;
        let base = self.delay.base.as_micros() as u64;
        let micros = if jitter == 0 {
            base
        } else {
            // Evenly in base ± jitter (randomness here only spreads timing).
            let draw = getrandom::u64().unwrap_or(0) % (2 * jitter + 1);
            (base + draw).saturating_sub(jitter)
        };
        let due = (Instant::now() + Duration::from_micros(micros)).max(self.last);
        self.last = due;
        due
    }
}

/// The delay line's far end: each write reaches the socket when it is due; the socket is
/// closed once the connection's side has closed and everything held was written.
async fn deliver<S: AsyncWrite + Unpin>(
    mut writer: WriteHalf<S>,
    mut held: mpsc::Receiver<(Instant, Vec<u8>)>,
) {
    while let Some((due, bytes)) = held.next().await {
        tokio::time::sleep_until(due).await;
        if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.close().await;
}

fn broken() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the delayed link closed")
}

impl<S> AsyncRead for Shaped<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Shaped::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Shaped::Delayed(d) => Pin::new(&mut d.reader).poll_read(cx, buf),
        }
    }
}

impl<S> AsyncWrite for Shaped<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Shaped::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Shaped::Delayed(d) => {
                ready!(d.line.poll_ready(cx)).map_err(|_| broken())?;
                let due = d.due();
                d.line
                    .start_send((due, buf.to_vec()))
                    .map_err(|_| broken())?;
                Poll::Ready(Ok(buf.len()))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Shaped::Plain(s) => Pin::new(s).poll_flush(cx),
            // Held bytes are on the link: the delay line flushes each write as it leaves.
            Shaped::Delayed(d) => {
                if d.line.is_closed() {
                    Poll::Ready(Err(broken()))
                } else {
                    Poll::Ready(Ok(()))
                }
            }
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Shaped::Plain(s) => Pin::new(s).poll_close(cx),
            Shaped::Delayed(d) => {
                // What is held still leaves, then the socket closes.
                let _ = ready!(d.line.poll_close_unpin(cx));
                Poll::Ready(Ok(()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends of a real TCP connection on loopback, the writer's delayed.
    async fn pair(
        delay: LinkDelay,
    ) -> (
        Shaped<tokio_util::compat::Compat<tokio::net::TcpStream>>,
        tokio_util::compat::Compat<tokio::net::TcpStream>,
    ) {
        use tokio_util::compat::TokioAsyncReadCompatExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        (
            Shaped::new(client.unwrap().compat(), Some(delay)),
            server.unwrap().0.compat(),
        )
    }

    #[tokio::test]
    async fn writes_arrive_after_the_delay_in_order_and_the_close_follows() {
        let delay = LinkDelay {
            base: Duration::from_millis(80),
            jitter: Duration::from_millis(20),
        };
        let (mut a, mut b) = pair(delay).await;
        let sent = std::time::Instant::now();
        for i in 0..100u8 {
            a.write_all(&[i; 10]).await.unwrap();
        }
        a.close().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        let took = sent.elapsed();
        let want: Vec<u8> = (0..100u8).flat_map(|i| [i; 10]).collect();
        assert_eq!(
            got, want,
            "every byte, in order, then the end of the stream"
        );
        assert!(
            took >= Duration::from_millis(60),
            "arrived after {took:?}, before the least delay"
        );
    }

    #[tokio::test]
    async fn without_a_delay_bytes_pass_straight_through() {
        use tokio_util::compat::TokioAsyncReadCompatExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let mut a = Shaped::new(client.unwrap().compat(), None);
        assert!(matches!(a, Shaped::Plain(_)));
        let mut b = server.unwrap().0.compat();
        a.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
    }

    #[tokio::test]
    async fn a_write_after_the_peer_is_gone_fails() {
        let delay = LinkDelay {
            base: Duration::from_millis(1),
            jitter: Duration::ZERO,
        };
        let (mut a, b) = pair(delay).await;
        drop(b);
        let mut failed = false;
        for _ in 0..200 {
            if a.write_all(&[0; 1024]).await.is_err() || a.flush().await.is_err() {
                failed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(failed, "writes into a closed connection kept succeeding");
    }
}
