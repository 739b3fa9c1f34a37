//! The composed network behaviour.

use std::time::Duration;

use libp2p::gossipsub::{self, MessageAuthenticity, ValidationMode};
use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::{StreamProtocol, autonat, dcutr, identify, kad, mdns, ping, relay, request_response};

use super::codec::EnvelopeCodec;
use super::{NetConfig, topics};

/// The lease negotiation protocol.
pub(crate) const LEASE_PROTOCOL: StreamProtocol = StreamProtocol::new("/gpux/lease/1");
/// Usage receipts, their acknowledgements, container logs and lease ends while a lease runs.
pub(crate) const RECEIPT_PROTOCOL: StreamProtocol = StreamProtocol::new("/gpux/receipt/1");
/// The settlement ledger: escrow locks, redemptions, releases and balance queries.
pub(crate) const LEDGER_PROTOCOL: StreamProtocol =
    StreamProtocol::new(gpux_protocol::ledger_wire::LEDGER_PROTOCOL);
/// The replicated ledger's consensus messages between its members (openraft's RPCs).
pub(crate) const RAFT_PROTOCOL: StreamProtocol = StreamProtocol::new("/gpux/raft/1");
/// The largest `/gpux/raft/1` frame: a batch of log entries or a snapshot chunk.
pub(crate) const MAX_RAFT_FRAME: usize = 4 * 1024 * 1024;
/// Kademlia's protocol name for the gpux network (kept apart from the public IPFS DHT).
pub(crate) const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/gpux/kad/1");

#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    pub(crate) gossipsub: gossipsub::Behaviour,
    pub(crate) identify: identify::Behaviour,
    pub(crate) ping: ping::Behaviour,
    pub(crate) kad: Toggle<kad::Behaviour<kad::store::MemoryStore>>,
    pub(crate) mdns: Toggle<mdns::tokio::Behaviour>,
    pub(crate) lease: request_response::Behaviour<EnvelopeCodec>,
    pub(crate) receipt: request_response::Behaviour<EnvelopeCodec>,
    pub(crate) ledger: request_response::Behaviour<EnvelopeCodec>,
    pub(crate) raft: request_response::Behaviour<EnvelopeCodec>,
    /// Raw streams: the workload plane (`crate::plane`).
    pub(crate) stream: libp2p_stream::Behaviour,
    /// Whether others can dial this node (AutoNAT: connected peers dial it back).
    pub(crate) autonat: autonat::Behaviour,
    /// Circuit relay v2, serving: once AutoNAT confirms this node reachable, it relays for
    /// nodes behind NAT, within [`relay_limits`].
    pub(crate) relay: super::relay_server::RelayServer,
    /// Circuit relay v2, using: a node behind NAT reserves a slot at a relay and is dialled
    /// through it.
    pub(crate) relay_client: relay::client::Behaviour,
    /// Hole punching (DCUtR): a relayed connection is replaced by a direct one where the
    /// NATs allow.
    pub(crate) dcutr: dcutr::Behaviour,
}

/// What a gpux node gives the nodes it relays for (docs/network.md, "Hosts behind NAT"). A
/// circuit carries a lease's receipts, logs, files and shell until hole punching replaces
/// it, so the limits are far above libp2p's defaults (2 minutes and 128 KiB a circuit, made
/// for the hole punch alone); past them the relay closes the circuit, and the next request
/// opens a new one.
pub(crate) fn relay_limits() -> relay::Config {
    relay::Config {
        max_reservations: 128,
        max_reservations_per_peer: 4,
        reservation_duration: Duration::from_secs(3600),
        max_circuits: 64,
        max_circuits_per_peer: 8,
        max_circuit_duration: Duration::from_secs(2 * 3600),
        max_circuit_bytes: 1 << 30,
        ..relay::Config::default()
    }
}

/// AutoNAT as gpux runs it: the first probe soon after start (a host behind NAT needs its
/// relay slot before renters look for it), private addresses allowed (testnets and LANs
/// use them), and the status settled by up to three agreeing probes.
fn autonat_config(probe_delay: Duration) -> autonat::Config {
    autonat::Config {
        boot_delay: probe_delay,
        retry_interval: Duration::from_secs(30),
        refresh_interval: Duration::from_secs(300),
        throttle_server_period: Duration::from_secs(15),
        timeout: Duration::from_secs(10),
        only_global_ips: false,
        ..autonat::Config::default()
    }
}

fn request_response(protocol: StreamProtocol) -> request_response::Behaviour<EnvelopeCodec> {
    request_response::Behaviour::new(
        [(protocol, request_response::ProtocolSupport::Full)],
        request_response::Config::default().with_request_timeout(Duration::from_secs(15)),
    )
}

/// Gossipsub as the design says: signed, strict, content-addressed ids (blake3 of the data),
/// nothing forwarded before the application accepts it, bounded frames, and v1.1 peer
/// scoring tuned for low-rate topics (mesh-delivery penalties off; invalid messages weigh
/// heavily).
pub(crate) fn gossipsub(
    key: &libp2p::identity::Keypair,
    config: &NetConfig,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<gossipsub::Behaviour, String> {
    let gs_config = gossipsub::ConfigBuilder::default()
        .validation_mode(ValidationMode::Strict)
        .validate_messages()
        .message_id_fn(|m: &gossipsub::Message| {
            gossipsub::MessageId::from(blake3::hash(&m.data).as_bytes().to_vec())
        })
        .max_transmit_size(config.max_transmit_size)
        .heartbeat_interval(config.heartbeat)
        .duplicate_cache_time(Duration::from_secs(120))
        // Peers pruned from a mesh learn others to connect to (peer exchange).
        .do_px()
        .build()
        .map_err(|e| e.to_string())?;
    // Its own metrics (messages and bytes per topic, duplicates included) go to `/metrics`
    // under `gossipsub_`.
    let mut behaviour =
        gossipsub::Behaviour::new(MessageAuthenticity::Signed(key.clone()), gs_config)?
            .with_metrics(
                registry.sub_registry_with_prefix("gossipsub"),
                gossipsub::MetricsConfig::default(),
            );
    let mut params = gossipsub::PeerScoreParams::default();
    // The IP-colocation penalty (many peers behind one address) protects against Sybils on
    // the internet; loopback peers cannot come from elsewhere, and a local testnet runs every
    // node on 127.0.0.1 (without this, more than 10 of them graylist each other).
    params
        .ip_colocation_factor_whitelist
        .insert(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    params
        .ip_colocation_factor_whitelist
        .insert(std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST));
    // The application score is this node's budgets' verdict on a peer, minus its excess
    // over them (`crate::budget`), counted one for one.
    params.app_specific_weight = 1.0;
    for topic in topics::all() {
        params.topics.insert(topic.hash(), topic_score());
    }
    behaviour.with_peer_score(params, gossipsub::PeerScoreThresholds::default())?;
    Ok(behaviour)
}

/// How an invalid message's count decays, per second (see `topic_score`).
pub(crate) const INVALID_MESSAGE_DECAY: f64 = 0.9996;

fn topic_score() -> gossipsub::TopicScoreParams {
    gossipsub::TopicScoreParams {
        topic_weight: 1.0,
        // Time in mesh earns little (at most 3 after 5 minutes): staying connected must not
        // buy the right to send garbage.
        time_in_mesh_weight: 0.01,
        time_in_mesh_quantum: Duration::from_secs(1),
        time_in_mesh_cap: 300.0,
        // Offers are low-rate: a quiet mesh peer is not a bad one.
        mesh_message_deliveries_weight: 0.0,
        mesh_failure_penalty_weight: 0.0,
        first_message_deliveries_weight: 0.5,
        first_message_deliveries_cap: 20.0,
        // A forged or malformed message costs a peer dearly, and for long: the penalty is
        // weight × count², the count decaying by this factor a second, so one invalid
        // message keeps its sender below the graylist threshold (-80) for about 4.6 minutes
        // and below the gossip threshold (-10) for about 48 (docs/network.md).
        invalid_message_deliveries_weight: -100.0,
        invalid_message_deliveries_decay: INVALID_MESSAGE_DECAY,
        ..gossipsub::TopicScoreParams::default()
    }
}

pub(crate) fn build(
    key: &libp2p::identity::Keypair,
    relay_client: relay::client::Behaviour,
    config: &NetConfig,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<Behaviour, String> {
    let peer_id = key.public().to_peer_id();
    let kad = config.kademlia.then(|| {
        let mut cfg = kad::Config::new(KAD_PROTOCOL);
        cfg.set_query_timeout(Duration::from_secs(30));
        let mut k =
            kad::Behaviour::with_config(peer_id, kad::store::MemoryStore::new(peer_id), cfg);
        k.set_mode(Some(kad::Mode::Server));
        k
    });
    let mdns = if config.mdns {
        Some(
            mdns::tokio::Behaviour::new(mdns::Config::default(), peer_id)
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    Ok(Behaviour {
        gossipsub: gossipsub(key, config, registry)?,
        // A new listen address (a relay slot) reaches connected peers at once.
        identify: identify::Behaviour::new(
            identify::Config::new("/gpux/1".into(), key.public())
                .with_push_listen_addr_updates(true),
        ),
        ping: ping::Behaviour::new(ping::Config::new()),
        kad: Toggle::from(kad),
        mdns: Toggle::from(mdns),
        lease: request_response(LEASE_PROTOCOL),
        receipt: request_response(RECEIPT_PROTOCOL),
        ledger: request_response(LEDGER_PROTOCOL),
        raft: request_response::Behaviour::with_codec(
            EnvelopeCodec::with_max(MAX_RAFT_FRAME),
            [(RAFT_PROTOCOL, request_response::ProtocolSupport::Full)],
            request_response::Config::default().with_request_timeout(Duration::from_secs(15)),
        ),
        stream: libp2p_stream::Behaviour::new(),
        autonat: autonat::Behaviour::new(peer_id, autonat_config(config.nat_probe_delay)),
        relay: super::relay_server::RelayServer(relay::Behaviour::new(peer_id, relay_limits())),
        relay_client,
        dcutr: dcutr::Behaviour::new(peer_id),
    })
}
