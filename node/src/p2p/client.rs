//! The cloneable handle to the event loop.

use libp2p::gossipsub::{MessageAcceptance, MessageId};
use libp2p::request_response::InboundRequestId;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use tokio::sync::{mpsc, oneshot};

/// A network operation that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The event loop has stopped.
    #[error("the network task has stopped")]
    Stopped,
    /// Building the swarm failed.
    #[error("cannot start networking: {0}")]
    Setup(String),
    /// Listening failed.
    #[error("cannot listen on {0}")]
    Listen(String),
    /// Dialing failed.
    #[error("cannot dial {0}")]
    Dial(String),
    /// Publishing failed.
    #[error("cannot publish: {0}")]
    Publish(String),
    /// A request failed.
    #[error("request failed: {0}")]
    Request(String),
}

/// The request-response protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// `/gpux/lease/1`: lease requests, escrow locks, lease ends.
    Lease,
    /// `/gpux/receipt/1`: receipts, log chunks and lease ends while a lease runs.
    Receipt,
    /// `/gpux/ledger/2`: the settlement ledger.
    Ledger,
    /// `/gpux/raft/1`: consensus between the members of a replicated ledger.
    Raft,
}

/// An inbound request's handle, unique across protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InboundId {
    pub(crate) proto: Proto,
    pub(crate) id: InboundRequestId,
}

/// What the network reports to the node.
#[derive(Debug)]
#[non_exhaustive]
pub enum NetworkEvent {
    /// A gossip message awaiting validation: report it with [`Client::report`].
    Gossip {
        /// Its id (blake3 of the data).
        id: MessageId,
        /// The peer that forwarded it.
        source: PeerId,
        /// Its topic.
        topic: String,
        /// The data: a signed envelope, unverified.
        data: Vec<u8>,
    },
    /// A request on one of the request-response protocols: answer with [`Client::respond`].
    Request {
        /// Its id (answer with it).
        id: InboundId,
        /// The protocol it came on.
        proto: Proto,
        /// Who sent it.
        peer: PeerId,
        /// The data: a signed envelope, unverified.
        data: Vec<u8>,
    },
    /// Listening on a new address.
    Listening(Multiaddr),
    /// A connection to a peer opened.
    Connected(PeerId),
    /// The last connection to a peer closed.
    Disconnected(PeerId),
    /// A ping to a peer came back after this round trip.
    Rtt {
        /// The peer.
        peer: PeerId,
        /// The round trip.
        rtt: std::time::Duration,
    },
    /// The IP address a peer's new connection comes from (before its `Connected`).
    PeerIp {
        /// The peer.
        peer: PeerId,
        /// Its address.
        ip: std::net::IpAddr,
    },
    /// A connection to a peer opened, this way.
    Link {
        /// The peer.
        peer: PeerId,
        /// How.
        link: Link,
    },
    /// What AutoNAT found of this node's reachability, and the relay addresses it listens
    /// through (behind NAT).
    Reachability {
        /// Whether others can dial it.
        reachability: Reachability,
        /// `<relay>/p2p-circuit` addresses with a slot held.
        relayed_at: Vec<Multiaddr>,
    },
    /// A peer subscribed to a topic (a good moment to publish what it has missed).
    Subscribed {
        /// The peer.
        peer: PeerId,
        /// The topic.
        topic: String,
    },
}

/// How a connection to a peer was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Link {
    /// Through a relay (the peer, or this node, is behind NAT).
    Relayed,
    /// Dialled directly.
    Direct,
    /// Directly, after hole punching (DCUtR) replaced a relayed connection.
    Punched,
}

impl Link {
    /// Its name in the API (`relayed`, `direct`, `punched`).
    pub fn as_str(self) -> &'static str {
        match self {
            Link::Relayed => "relayed",
            Link::Direct => "direct",
            Link::Punched => "punched",
        }
    }
}

/// Whether other nodes can dial this one (AutoNAT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reachability {
    /// Not yet known.
    Unknown,
    /// Peers dialled it back.
    Public,
    /// Peers could not: behind NAT or a firewall; reached through relays.
    Private,
}

impl Reachability {
    /// Its name in the API (`unknown`, `public`, `private`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reachability::Unknown => "unknown",
            Reachability::Public => "public",
            Reachability::Private => "private",
        }
    }
}

#[derive(Debug)]
pub(crate) enum Command {
    Dial {
        addr: Multiaddr,
        reply: oneshot::Sender<Result<(), NetError>>,
    },
    Reach {
        peer: PeerId,
        reply: oneshot::Sender<Result<(), NetError>>,
    },
    Publish {
        topic: String,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<MessageId, NetError>>,
    },
    Report {
        id: MessageId,
        source: PeerId,
        acceptance: MessageAcceptance,
    },
    Request {
        proto: Proto,
        peer: PeerId,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<Vec<u8>, NetError>>,
    },
    Respond {
        id: InboundId,
        data: Vec<u8>,
    },
    ListenAddrs {
        reply: oneshot::Sender<Vec<Multiaddr>>,
    },
    Peers {
        reply: oneshot::Sender<Vec<PeerId>>,
    },
    MeshPeers {
        topic: String,
        reply: oneshot::Sender<Vec<PeerId>>,
    },
    Follow {
        families: Option<std::collections::BTreeSet<gpux_protocol::GpuFamily>>,
        reply: oneshot::Sender<Result<(), NetError>>,
    },
    Score {
        peer: PeerId,
        reply: oneshot::Sender<Option<f64>>,
    },
    AppScore {
        peer: PeerId,
        score: f64,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// A handle to the network task. Cheap to clone; the task stops when every handle is dropped
/// or on [`Client::shutdown`].
#[derive(Clone)]
pub struct Client {
    tx: mpsc::Sender<Command>,
    local: PeerId,
    streams: libp2p_stream::Control,
    /// Bytes through the transport, by direction (libp2p's bandwidth metrics).
    bandwidth: std::sync::Arc<prometheus_client::registry::Registry>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("local", &self.local)
            .finish()
    }
}

impl Client {
    pub(crate) fn new(
        tx: mpsc::Sender<Command>,
        local: PeerId,
        streams: libp2p_stream::Control,
        bandwidth: std::sync::Arc<prometheus_client::registry::Registry>,
    ) -> Self {
        Self {
            tx,
            local,
            streams,
            bandwidth,
        }
    }

    /// libp2p's bandwidth metrics of this node's connections (for `/metrics`).
    pub fn bandwidth(&self) -> std::sync::Arc<prometheus_client::registry::Registry> {
        self.bandwidth.clone()
    }

    /// Opens a stream to `peer` on `protocol` (dialling it when not connected), within
    /// `timeout`.
    pub async fn open_stream(
        &self,
        peer: PeerId,
        protocol: StreamProtocol,
        timeout: std::time::Duration,
    ) -> Result<libp2p::Stream, NetError> {
        let mut control = self.streams.clone();
        match tokio::time::timeout(timeout, control.open_stream(peer, protocol.clone())).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(libp2p_stream::OpenStreamError::UnsupportedProtocol(p))) => Err(
                NetError::Request(format!("{peer} does not speak {p} (an older node?)")),
            ),
            Ok(Err(e)) => Err(NetError::Request(format!("{protocol} to {peer}: {e}"))),
            Err(_) => Err(NetError::Request(format!(
                "{protocol} to {peer}: no stream within {timeout:?}"
            ))),
        }
    }

    /// The streams other peers open on `protocol`. Only one taker per protocol: a second
    /// call fails until the first's [`libp2p_stream::IncomingStreams`] is dropped. Keep
    /// polling it: a stream that arrives while nobody waits is dropped.
    pub fn accept_streams(
        &self,
        protocol: StreamProtocol,
    ) -> Result<libp2p_stream::IncomingStreams, NetError> {
        self.streams
            .clone()
            .accept(protocol.clone())
            .map_err(|_| NetError::Setup(format!("{protocol} is already taken")))
    }

    /// This node's peer id.
    pub fn local_peer_id(&self) -> PeerId {
        self.local
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, NetError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| NetError::Stopped)?;
        rx.await.map_err(|_| NetError::Stopped)
    }

    /// Dials an address (with `/p2p/<peer id>` when known).
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), NetError> {
        self.ask(|reply| Command::Dial { addr, reply }).await?
    }

    /// Connects to a peer by its id, at the addresses the swarm learned for it (identify and
    /// kademlia); done at once when already connected. The caller bounds the wait.
    pub async fn reach(&self, peer: PeerId) -> Result<(), NetError> {
        self.ask(|reply| Command::Reach { peer, reply }).await?
    }

    /// Publishes data on a topic.
    pub async fn publish(
        &self,
        topic: impl Into<String>,
        data: Vec<u8>,
    ) -> Result<MessageId, NetError> {
        let topic = topic.into();
        self.ask(|reply| Command::Publish { topic, data, reply })
            .await?
    }

    /// Reports a gossip message's validation result: Accept forwards it, Reject penalises
    /// the peer that sent it, Ignore drops it.
    pub async fn report(
        &self,
        id: MessageId,
        source: PeerId,
        acceptance: MessageAcceptance,
    ) -> Result<(), NetError> {
        self.tx
            .send(Command::Report {
                id,
                source,
                acceptance,
            })
            .await
            .map_err(|_| NetError::Stopped)
    }

    /// Reports a validation result without waiting: the node's loop must never wait on the
    /// network task (which may itself be waiting to hand the node an event). When the
    /// command channel is full the report goes from a task of its own.
    pub fn report_nowait(&self, id: MessageId, source: PeerId, acceptance: MessageAcceptance) {
        let command = Command::Report {
            id,
            source,
            acceptance,
        };
        if let Err(mpsc::error::TrySendError::Full(command)) = self.tx.try_send(command) {
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(command).await;
            });
        }
    }

    /// Sets a peer's gossipsub application score (this node's budgets' verdict), without
    /// waiting; a peer that sinks below the graylist threshold is disconnected.
    pub fn set_app_score_nowait(&self, peer: PeerId, score: f64) {
        let command = Command::AppScore { peer, score };
        if let Err(mpsc::error::TrySendError::Full(command)) = self.tx.try_send(command) {
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(command).await;
            });
        }
    }

    /// Sends a request on `/gpux/lease/1` and waits for the answer.
    pub async fn request(&self, peer: PeerId, data: Vec<u8>) -> Result<Vec<u8>, NetError> {
        self.request_on(Proto::Lease, peer, data).await
    }

    /// Sends a request on `proto` and waits for the answer.
    pub async fn request_on(
        &self,
        proto: Proto,
        peer: PeerId,
        data: Vec<u8>,
    ) -> Result<Vec<u8>, NetError> {
        self.ask(|reply| Command::Request {
            proto,
            peer,
            data,
            reply,
        })
        .await?
    }

    /// Answers an inbound request.
    pub async fn respond(&self, id: InboundId, data: Vec<u8>) -> Result<(), NetError> {
        self.tx
            .send(Command::Respond { id, data })
            .await
            .map_err(|_| NetError::Stopped)
    }

    /// The addresses the node listens on.
    pub async fn listen_addrs(&self) -> Result<Vec<Multiaddr>, NetError> {
        self.ask(|reply| Command::ListenAddrs { reply }).await
    }

    /// Connected peers.
    pub async fn peers(&self) -> Result<Vec<PeerId>, NetError> {
        self.ask(|reply| Command::Peers { reply }).await
    }

    /// Peers in this node's gossip mesh for a topic.
    pub async fn mesh_peers(&self, topic: impl Into<String>) -> Result<Vec<PeerId>, NetError> {
        let topic = topic.into();
        self.ask(|reply| Command::MeshPeers { topic, reply }).await
    }

    /// Subscribes to the offer and attestation topics of `families` (None: every family)
    /// and leaves the others'.
    pub async fn follow(
        &self,
        families: Option<std::collections::BTreeSet<gpux_protocol::GpuFamily>>,
    ) -> Result<(), NetError> {
        self.ask(|reply| Command::Follow { families, reply })
            .await?
    }

    /// This node's gossipsub score of a peer.
    pub async fn score(&self, peer: PeerId) -> Result<Option<f64>, NetError> {
        self.ask(|reply| Command::Score { peer, reply }).await
    }

    /// Stops the network task.
    pub async fn shutdown(&self) -> Result<(), NetError> {
        self.ask(|reply| Command::Shutdown { reply }).await
    }
}
