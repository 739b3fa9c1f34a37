//! The local API's HTTP server (the API and the console share it): hyper's HTTP/1 with a
//! header timeout, and bounded connections, so that connections that never finish a request
//! cannot use up the node's descriptors or keep others out.
//!
//! - A request's headers must arrive within [`HEADER_TIMEOUT`] of the connection opening or
//!   going idle after a response (hyper's `header_read_timeout`, which also closes idle
//!   keep-alive connections); the connection is closed otherwise.
//! - At most [`MAX_CONNECTIONS`] connections at once. A connection that has not yet sent a
//!   whole request is *unproven*; a client address holds at most [`MAX_UNPROVEN_PER_CLIENT`]
//!   of them. A new connection over either bound closes the oldest unproven one (of that
//!   client, or of anyone when the whole cap is reached) rather than being refused, so a
//!   flood of half-open connections cannot keep a real client out; when every connection is
//!   proven (busy streams), the new one is closed at once.
//!
//! On loopback every local user's connections come from 127.0.0.1, so "a client" is an
//! address, not a user; the token, not the address, is what admits a request.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

/// How long a client has to send a request's headers, from its connection's opening or
/// from its last response.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections the server holds at once, from everyone.
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// Connections one client address holds at once that have not sent a whole request.
pub(crate) const MAX_UNPROVEN_PER_CLIENT: usize = 128;

struct Open {
    client: IpAddr,
    /// Set once the connection has sent a whole request.
    proven: Arc<AtomicBool>,
    close: watch::Sender<bool>,
}

/// The open connections, in the order they were accepted.
#[derive(Default)]
struct Connections {
    next: u64,
    open: BTreeMap<u64, Open>,
}

impl Connections {
    /// Admits a connection from `client`, closing the oldest unproven one where a bound is
    /// reached; `None` when it cannot be admitted.
    fn admit(&mut self, client: IpAddr) -> Option<(u64, Arc<AtomicBool>, watch::Receiver<bool>)> {
        let unproven = |open: &BTreeMap<u64, Open>, of: Option<IpAddr>| {
            open.iter()
                .filter(|(_, o)| !o.proven.load(Ordering::Relaxed))
                .filter(|(_, o)| of.is_none_or(|ip| o.client == ip))
                .map(|(id, _)| *id)
                .collect::<Vec<u64>>()
        };
        let mine = unproven(&self.open, Some(client));
        if mine.len() >= MAX_UNPROVEN_PER_CLIENT {
            self.close(mine[0]);
        }
        if self.open.len() >= MAX_CONNECTIONS {
            let oldest = *unproven(&self.open, None).first()?;
            self.close(oldest);
        }
        let id = self.next;
        self.next += 1;
        let proven = Arc::new(AtomicBool::new(false));
        let (close, closed) = watch::channel(false);
        self.open.insert(
            id,
            Open {
                client,
                proven: proven.clone(),
                close,
            },
        );
        Some((id, proven, closed))
    }

    fn close(&mut self, id: u64) {
        if let Some(open) = self.open.remove(&id) {
            let _ = open.close.send(true);
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let connections = Arc::new(Mutex::new(Connections::default()));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer): (_, SocketAddr) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted:
                    // wait a moment rather than spin.
                    tracing::debug!("the API's accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let admitted = connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(peer.ip());
        let Some((id, proven, mut closed)) = admitted else {
            continue; // dropping `tcp` closes it
        };
        // Interactive streams (exec, forwards) go through here: no Nagle delay on replies.
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let connections = connections.clone();
        tokio::spawn(async move {
            let service = TowerToHyperService::new(app.map_request(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    proven.store(true, Ordering::Relaxed);
                    request.map(axum::body::Body::new)
                },
            ));
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let connection = builder
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades();
            tokio::select! {
                result = connection => {
                    if let Err(e) = result {
                        tracing::trace!("an API connection: {e}");
                    }
                }
                _ = closed.wait_for(|c| *c) => {}
            }
            connections
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .close(id);
        });
    }
}

/// Whether `a` and `b` are equal, in time that depends on their length only (tokens and
/// secrets are compared with it).
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    // Constant time in the token's length: no early exit on the first differing byte.
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_unproven_connections_makes_room_for_new_ones() {
        let mut c = Connections::default();
        let one: IpAddr = [127, 0, 0, 1].into();
        let two: IpAddr = [127, 0, 0, 2].into();
        let mut admitted = Vec::new();
        for _ in 0..MAX_UNPROVEN_PER_CLIENT {
            admitted.push(c.admit(one).unwrap());
        }
        // One more from the same client closes its oldest unproven connection.
        let (first_proven, first_closed) = (admitted[0].1.clone(), admitted[0].2.clone());
        assert!(!*first_closed.borrow());
        admitted.push(c.admit(one).unwrap());
        assert!(*first_closed.borrow());
        assert_eq!(c.open.len(), MAX_UNPROVEN_PER_CLIENT);
        assert!(!first_proven.load(Ordering::Relaxed));
        // Proven connections stay; the whole cap is reached with another client's.
        for (_, proven, _) in &admitted[1..] {
            proven.store(true, Ordering::Relaxed);
        }
        // The other client's first stays unproven, the rest send requests.
        let (oldest_two, _, _) = c.admit(two).unwrap();
        while c.open.len() < MAX_CONNECTIONS {
            let (_, proven, _) = c.admit(two).unwrap();
            proven.store(true, Ordering::Relaxed);
        }
        // Full: the oldest unproven (the other client's first) makes room.
        c.admit(one).unwrap();
        assert!(!c.open.contains_key(&oldest_two));
        assert_eq!(c.open.len(), MAX_CONNECTIONS);
        // Every connection proven (busy streams): a new one is not admitted.
        for open in c.open.values() {
            open.proven.store(true, Ordering::Relaxed);
        }
        assert!(c.admit(two).is_none());
        assert_eq!(c.open.len(), MAX_CONNECTIONS);
    }
}
