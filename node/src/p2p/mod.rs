//! The node's libp2p networking: TCP + noise + yamux, identify, ping, gossipsub (signed,
//! strict, blake3 message ids, application validation, peer scoring), kademlia with bootstrap
//! addresses, mDNS on LANs (off in tests), and request-response `/gpux/lease/1`,
//! `/gpux/receipt/1` and `/gpux/ledger/1`, and raw streams (libp2p-stream) for the workload
//! plane.
//!
//! One task owns the `Swarm` (the event loop); the rest of the node holds a cloneable
//! [`Client`] that sends commands over a bounded channel, and receives [`NetworkEvent`]s.
//! Gossip validation happens outside the behaviour (see `crate::validation`): the event loop
//! hands every gossip message out, and nothing is forwarded until the node reports Accept.

mod behaviour;
mod client;
mod codec;
mod event_loop;
pub mod perf;
mod relay_server;
pub mod shaping;
pub mod topics;

use std::time::Duration;

use gpux_protocol::Keypair;
use libp2p::{noise, tcp, yamux};
use tokio::sync::mpsc;

pub use client::{Client, InboundId, Link, NetError, NetworkEvent, Proto, Reachability};
pub use libp2p::gossipsub::{MessageAcceptance, MessageId};
pub use libp2p::{Multiaddr, PeerId, Stream, StreamProtocol, multiaddr};

/// Capacity of the command channel into the event loop.
pub const COMMAND_CAPACITY: usize = 256;
/// Capacity of the event channel out of the event loop.
pub const EVENT_CAPACITY: usize = 1024;

/// Network settings.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Addresses to listen on (`/ip4/127.0.0.1/tcp/0` picks a free port).
    pub listen: Vec<Multiaddr>,
    /// Peers to dial at start (with `/p2p/<peer id>` for kademlia).
    pub bootstrap: Vec<Multiaddr>,
    /// Kademlia peer discovery.
    pub kademlia: bool,
    /// mDNS discovery on the local network.
    pub mdns: bool,
    /// Largest gossip message (oversized frames are dropped by the transport).
    pub max_transmit_size: usize,
    /// Gossipsub heartbeat.
    pub heartbeat: Duration,
    /// The GPU families whose offer and attestation topics to subscribe to (None: all).
    pub families: Option<std::collections::BTreeSet<gpux_protocol::GpuFamily>>,
    /// A delay added to everything this node sends (the isolated testnet's links; None:
    /// none).
    pub link_delay: Option<shaping::LinkDelay>,
    /// How long after start AutoNAT first asks peers to dial this node back.
    pub nat_probe_delay: Duration,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            listen: Vec::new(),
            bootstrap: Vec::new(),
            kademlia: true,
            mdns: false,
            // The largest gossiped envelope is an attestation (64 KiB); gossipsub's own
            // framing needs a little more.
            max_transmit_size: 80 * 1024,
            heartbeat: Duration::from_millis(700),
            families: None,
            link_delay: None,
            nat_probe_delay: Duration::from_secs(3),
        }
    }
}

/// Refuses a TCP listen address (with a fixed port) that something already listens on.
/// libp2p's TCP transport binds with port reuse, so a second node on the same port would
/// otherwise start without error and the kernel would split connections between the two; a
/// plain bind, without reuse, tells.
fn ensure_free(addr: &Multiaddr) -> Result<(), NetError> {
    use libp2p::multiaddr::Protocol;
    let mut ip = None;
    let mut port = None;
    for p in addr.iter() {
        match p {
            Protocol::Ip4(a) => ip = Some(std::net::IpAddr::V4(a)),
            Protocol::Ip6(a) => ip = Some(std::net::IpAddr::V6(a)),
            Protocol::Tcp(p) => port = Some(p),
            _ => {}
        }
    }
    let (Some(ip), Some(port)) = (ip, port) else {
        return Ok(());
    };
    if port == 0 {
        return Ok(());
    }
    match std::net::TcpListener::bind((ip, port)) {
        Ok(probe) => {
            drop(probe);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(NetError::Listen(format!(
            "{addr}: the address is already in use (another node, or another program, listens there)"
        ))),
        Err(e) => Err(NetError::Listen(format!("{addr}: {e}"))),
    }
}

/// Starts the network: builds the swarm with the node key, starts listening, spawns the
/// event loop on the current tokio runtime. Returns the client handle and the event stream.
pub async fn spawn(
    key: &Keypair,
    config: NetConfig,
) -> Result<(Client, mpsc::Receiver<NetworkEvent>), NetError> {
    let mut seed = key.seed();
    let identity = libp2p::identity::Keypair::ed25519_from_bytes(&mut seed)
        .map_err(|e| NetError::Setup(e.to_string()))?;
    let behaviour_config = config.clone();
    // Every byte through the transport, by direction (`libp2p_bandwidth_bytes_total`), and
    // gossipsub's own counts (`gossipsub_...`).
    let mut bandwidth = prometheus_client::registry::Registry::default();
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(identity)
        .with_tokio()
        .with_other_transport(|key| {
            use libp2p::Transport;
            let link_delay = config.link_delay;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
                    .map(move |stream, _| shaping::Shaped::new(stream, link_delay))
                    .upgrade(libp2p::core::upgrade::Version::V1Lazy)
                    .authenticate(noise::Config::new(key)?)
                    .multiplex(yamux::Config::default()),
            )
        })
        .map_err(|e| NetError::Setup(e.to_string()))?
        // Dialling and being dialled through a relay (`/p2p-circuit`): the relayed
        // connection runs noise and yamux inside the relay's stream.
        .with_relay_client(noise::Config::new, yamux::Config::default)
        .map_err(|e| NetError::Setup(e.to_string()))?
        .with_bandwidth_metrics(&mut bandwidth)
        .with_behaviour(|key, relay_client| {
            behaviour::build(key, relay_client, &behaviour_config, &mut bandwidth)
                .map_err(|e| e.into())
        })
        .map_err(|e| NetError::Setup(e.to_string()))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
        .build();
    for addr in &config.listen {
        ensure_free(addr)?;
        swarm
            .listen_on(addr.clone())
            .map_err(|e| NetError::Listen(format!("{addr}: {e}")))?;
    }
    for topic in topics::subscribed(config.families.as_ref()) {
        swarm
            .behaviour_mut()
            .gossipsub
            .subscribe(&topic)
            .map_err(|e| NetError::Setup(e.to_string()))?;
    }
    for addr in &config.bootstrap {
        event_loop::add_bootstrap(&mut swarm, addr);
    }
    let (command_tx, command_rx) = mpsc::channel(COMMAND_CAPACITY);
    let (event_tx, event_rx) = mpsc::channel(EVENT_CAPACITY);
    let local = *swarm.local_peer_id();
    let streams = swarm.behaviour().stream.new_control();
    let metrics = libp2p::metrics::Metrics::new(&mut bandwidth);
    tokio::spawn(
        event_loop::EventLoop::new(swarm, command_rx, event_tx, &config.bootstrap, metrics).run(),
    );
    let client = Client::new(command_tx, local, streams, std::sync::Arc::new(bandwidth));
    Ok((client, event_rx))
}
