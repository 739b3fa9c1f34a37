//! The one task that owns the `Swarm`.

use std::collections::HashMap;

use futures::StreamExt;
use libp2p::core::transport::ListenerId;
use libp2p::gossipsub::{self, IdentTopic, TopicHash};
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId, ResponseChannel};
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{DialError, SwarmEvent};
use libp2p::{Multiaddr, PeerId, Swarm, autonat, dcutr, identify, kad, mdns, ping, relay};
use tokio::sync::{mpsc, oneshot};

use super::behaviour::{Behaviour, BehaviourEvent};
use super::client::{Command, InboundId, Link, NetError, NetworkEvent, Proto, Reachability};

type ReplyTx = oneshot::Sender<Result<Vec<u8>, NetError>>;

pub(crate) struct EventLoop {
    swarm: Swarm<Behaviour>,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<NetworkEvent>,
    pending_dials: HashMap<PeerId, Vec<oneshot::Sender<Result<(), NetError>>>>,
    /// Peers disconnected for their score, and until when they stay out: not dialled
    /// (kademlia would otherwise find them again at once), and cut off if they connect.
    banned: HashMap<PeerId, std::time::Instant>,
    pending_requests: HashMap<(Proto, OutboundRequestId), ReplyTx>,
    pending_responses: HashMap<InboundId, ResponseChannel<Vec<u8>>>,
    bootstrapped: bool,
    /// Gossip messages ignored because the node was behind.
    gossip_shed: u64,
    /// Peers that may relay for this node, and through which it dials a peer it cannot
    /// reach directly (its bootstrap peers).
    relays: Vec<(PeerId, Multiaddr)>,
    /// The bootstrap addresses, dialled again while the node has no peer at all.
    bootstrap: Vec<Multiaddr>,
    /// Whether others can dial this node, as AutoNAT last found.
    reachability: Reachability,
    /// Relay slots this node listens through (behind NAT), by listener.
    circuits: HashMap<ListenerId, Multiaddr>,
    /// Peers being dialled through the relays after a direct dial failed.
    relay_dials: std::collections::HashSet<PeerId>,
    /// Peers found through kademlia and being dialled: they count towards
    /// `MAX_DISCOVERED_PEERS` (kademlia reports a burst of peers at once; counting only
    /// connections, a node at 100 nodes dialled nearly all of them before the first
    /// connected).
    discovery_dials: std::collections::HashSet<PeerId>,
    /// libp2p's own counts from the swarm's events (`libp2p_swarm_...`, `libp2p_kad_...`,
    /// `libp2p_identify_...`, `libp2p_ping_...`, `libp2p_relay_...`, `libp2p_dcutr_...`).
    metrics: libp2p::metrics::Metrics,
}

/// How often a node behind NAT without its relay slots asks for them again.
const RESERVE_AGAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Relays a node behind NAT holds a slot at, at most.
const MAX_RELAY_SLOTS: usize = 2;

/// A peer whose gossip score falls below this after an invalid message is disconnected: it
/// is gossipsub's graylist threshold, below which everything the peer sends is ignored
/// anyway (one invalid message costs -100 and keeps it there for about 4.6 minutes), so
/// keeping the connection open would only cost us.
const DISCONNECT_SCORE: f64 = -80.0;
/// How long a peer disconnected for its score stays out.
const BAN: std::time::Duration = std::time::Duration::from_secs(600);
/// Banned peers remembered, at most (the ban list is not itself a way to use memory).
const MAX_BANNED: usize = 4096;

/// How often a node with fewer than `ENOUGH_PEERS` walks the DHT for more.
const EAGER_WALK: std::time::Duration = std::time::Duration::from_secs(30);
/// How soon a node with no peer at all dials its bootstrap peers again, at first: a node
/// started just before them (both started at once, or its bootstrap peer restarting)
/// joins within seconds, not at the next walk. The wait doubles up to `EAGER_WALK`, and
/// starts over once a peer connects.
const LONELY_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The wait before the next redial of a node that found itself with no peer after waiting
/// `waited` (none: it had peers then).
fn lonely_retry(waited: Option<std::time::Duration>) -> std::time::Duration {
    waited.map_or(LONELY_RETRY, |w| (w * 2).clamp(LONELY_RETRY, EAGER_WALK))
}

/// Peers enough that a node no longer walks the DHT on its own timer: twice gossipsub's
/// mesh degree (6), so every topic's mesh can fill.
const ENOUGH_PEERS: usize = 12;

/// Peers this node dials on its own (found through kademlia), at most: twice what every
/// topic's gossip mesh can use (12). Each connection costs its pings, yamux windows and a
/// share of every gossipsub heartbeat; at 100 isolated nodes, with up to 50 each, the idle
/// nodes alone kept this machine's two cores busy.
const MAX_DISCOVERED_PEERS: usize = 24;

/// Adds a bootstrap address to kademlia (when it names its peer) and dials it.
pub(crate) fn add_bootstrap(swarm: &mut Swarm<Behaviour>, addr: &Multiaddr) {
    if let Some(Protocol::P2p(peer)) = addr.iter().last()
        && let Some(kad) = swarm.behaviour_mut().kad.as_mut()
    {
        kad.add_address(&peer, addr.clone());
    }
    if let Err(e) = swarm.dial(addr.clone()) {
        tracing::warn!("cannot dial bootstrap address {addr}: {e}");
    }
}

impl EventLoop {
    pub(crate) fn new(
        swarm: Swarm<Behaviour>,
        commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<NetworkEvent>,
        bootstrap: &[Multiaddr],
        metrics: libp2p::metrics::Metrics,
    ) -> Self {
        let local = *swarm.local_peer_id();
        let relays = bootstrap
            .iter()
            .filter_map(|addr| match addr.iter().last() {
                Some(Protocol::P2p(peer)) if peer != local => Some((peer, addr.clone())),
                _ => None,
            })
            .collect();
        Self {
            metrics,
            relays,
            bootstrap: bootstrap.to_vec(),
            reachability: Reachability::Unknown,
            circuits: HashMap::new(),
            relay_dials: Default::default(),
            discovery_dials: Default::default(),
            swarm,
            commands,
            events,
            pending_dials: HashMap::new(),
            banned: HashMap::new(),
            pending_requests: HashMap::new(),
            pending_responses: HashMap::new(),
            bootstrapped: false,
            gossip_shed: 0,
        }
    }

    pub(crate) async fn run(mut self) {
        // Kademlia random walks find peers beyond the bootstrap nodes, so the gossip mesh is
        // not a star around them: often while the node has few peers, and from then on only
        // as kademlia itself refreshes its table (every 5 minutes, and when a new peer fills
        // a bucket). A walk costs about a hundred requests, each answered with twenty peers'
        // addresses: at 100 nodes walking every 30 s, these answers were nineteen twentieths
        // of the bytes a node received (docs/benchmarks.md).
        let mut walk = tokio::time::interval(EAGER_WALK);
        // A relay that restarted, or was cut off, dropped this node's slot: take one again.
        let mut slots = tokio::time::interval(RESERVE_AGAIN);
        let mut lonely_wait = LONELY_RETRY;
        let lonely = tokio::time::sleep(lonely_wait);
        tokio::pin!(lonely);
        loop {
            tokio::select! {
                () = &mut lonely => {
                    let alone = self.swarm.connected_peers().next().is_none();
                    lonely_wait = lonely_retry(alone.then_some(lonely_wait));
                    if alone {
                        self.dial_bootstrap();
                    }
                    lonely.as_mut().reset(tokio::time::Instant::now() + lonely_wait);
                }
                _ = walk.tick() => {
                    if self.swarm.connected_peers().count() < ENOUGH_PEERS {
                        self.bootstrap_kad();
                    }
                }
                _ = slots.tick() => self.reserve_relay_slots(),
                event = self.swarm.select_next_some() => self.on_swarm_event(event).await,
                command = self.commands.recv() => match command {
                    Some(Command::Shutdown { reply }) => {
                        let _ = reply.send(());
                        return;
                    }
                    Some(command) => self.on_command(command),
                    // Every client is gone.
                    None => return,
                },
            }
        }
    }

    async fn emit(&mut self, event: NetworkEvent) {
        // A node that stopped reading events is shutting down; nothing to do.
        let _ = self.events.send(event).await;
    }

    /// Disconnects a peer whose gossip score is below the graylist threshold.
    fn disconnect_if_sunk(&mut self, peer: PeerId) {
        if self
            .swarm
            .behaviour()
            .gossipsub
            .peer_score(&peer)
            .is_some_and(|score| score < DISCONNECT_SCORE)
        {
            tracing::info!(
                "disconnecting {peer} for {} s: its gossip score fell below {DISCONNECT_SCORE}",
                BAN.as_secs()
            );
            let now = std::time::Instant::now();
            self.banned.retain(|_, until| *until > now);
            if self.banned.len() < MAX_BANNED {
                self.banned.insert(peer, now + BAN);
            }
            if let Some(kad) = self.swarm.behaviour_mut().kad.as_mut() {
                kad.remove_peer(&peer);
            }
            let _ = self.swarm.disconnect_peer_id(peer);
        }
    }

    fn is_banned(&self, peer: &PeerId) -> bool {
        self.banned
            .get(peer)
            .is_some_and(|until| *until > std::time::Instant::now())
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Dial { addr, reply } => {
                let peer = addr.iter().find_map(|p| {
                    if let Protocol::P2p(peer) = p {
                        Some(peer)
                    } else {
                        None
                    }
                });
                match self.swarm.dial(addr.clone()) {
                    Ok(()) => match peer {
                        Some(peer) if !self.swarm.is_connected(&peer) => {
                            self.pending_dials.entry(peer).or_default().push(reply)
                        }
                        _ => {
                            let _ = reply.send(Ok(()));
                        }
                    },
                    Err(e) => {
                        let _ = reply.send(Err(NetError::Dial(format!("{addr}: {e}"))));
                    }
                }
            }
            Command::Reach { peer, reply } => {
                if self.swarm.is_connected(&peer) {
                    let _ = reply.send(Ok(()));
                } else {
                    match self.swarm.dial(peer) {
                        // Already being dialled: the same outcome answers this one.
                        Ok(()) | Err(DialError::DialPeerConditionFalse(_)) => {
                            self.pending_dials.entry(peer).or_default().push(reply)
                        }
                        // Nothing known of it: perhaps it is behind NAT, with a slot at a
                        // relay this node knows.
                        Err(DialError::NoAddresses) if self.dial_through_relays(peer) => {
                            self.pending_dials.entry(peer).or_default().push(reply)
                        }
                        Err(e) => {
                            let _ = reply.send(Err(NetError::Dial(format!("{peer}: {e}"))));
                        }
                    }
                }
            }
            Command::Publish { topic, data, reply } => {
                let result = self
                    .swarm
                    .behaviour_mut()
                    .gossipsub
                    .publish(IdentTopic::new(topic), data)
                    .map_err(|e| NetError::Publish(e.to_string()));
                let _ = reply.send(result);
            }
            Command::Report {
                id,
                source,
                acceptance,
            } => {
                let rejected = matches!(acceptance, gossipsub::MessageAcceptance::Reject);
                self.swarm
                    .behaviour_mut()
                    .gossipsub
                    .report_message_validation_result(&id, &source, acceptance);
                // A peer whose invalid messages have sunk it below the graylist threshold is
                // disconnected: it would only be ignored otherwise, and keeps costing us.
                if rejected {
                    self.disconnect_if_sunk(source);
                }
            }
            Command::AppScore { peer, score } => {
                self.swarm
                    .behaviour_mut()
                    .gossipsub
                    .set_application_score(&peer, score);
                self.disconnect_if_sunk(peer);
            }
            Command::Request {
                proto,
                peer,
                data,
                reply,
            } => {
                let id = self.behaviour(proto).send_request(&peer, data);
                self.pending_requests.insert((proto, id), reply);
            }
            Command::Respond { id, data } => {
                if let Some(channel) = self.pending_responses.remove(&id) {
                    // The requester may have gone; then there is nobody to answer.
                    let _ = self.behaviour(id.proto).send_response(channel, data);
                }
            }
            Command::ListenAddrs { reply } => {
                let _ = reply.send(self.swarm.listeners().cloned().collect());
            }
            Command::Peers { reply } => {
                let _ = reply.send(self.swarm.connected_peers().copied().collect());
            }
            Command::Follow { families, reply } => {
                let wanted: std::collections::BTreeSet<String> =
                    super::topics::subscribed(families.as_ref())
                        .iter()
                        .map(ToString::to_string)
                        .collect();
                let gossipsub = &mut self.swarm.behaviour_mut().gossipsub;
                let mut result = Ok(());
                for topic in super::topics::all() {
                    if wanted.contains(&topic.to_string()) {
                        if let Err(e) = gossipsub.subscribe(&topic) {
                            result = Err(NetError::Setup(e.to_string()));
                        }
                    } else {
                        gossipsub.unsubscribe(&topic);
                    }
                }
                let _ = reply.send(result);
            }
            Command::MeshPeers { topic, reply } => {
                let hash = TopicHash::from_raw(topic);
                let _ = reply.send(
                    self.swarm
                        .behaviour()
                        .gossipsub
                        .mesh_peers(&hash)
                        .copied()
                        .collect(),
                );
            }
            Command::Score { peer, reply } => {
                let _ = reply.send(self.swarm.behaviour().gossipsub.peer_score(&peer));
            }
            Command::Shutdown { .. } => {}
        }
    }

    fn record(&self, event: &SwarmEvent<BehaviourEvent>) {
        use libp2p::metrics::Recorder;
        self.metrics.record(event);
        match event {
            SwarmEvent::Behaviour(BehaviourEvent::Kad(e)) => self.metrics.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::Identify(e)) => self.metrics.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::Ping(e)) => self.metrics.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::Relay(e)) => self.metrics.record(e),
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(e)) => self.metrics.record(e),
            _ => {}
        }
    }

    async fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        self.record(&event);
        if let SwarmEvent::ConnectionEstablished { peer_id, .. }
        | SwarmEvent::OutgoingConnectionError {
            peer_id: Some(peer_id),
            ..
        } = &event
        {
            self.discovery_dials.remove(peer_id);
        }
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                let relayed = address.iter().any(|p| p == Protocol::P2pCircuit);
                self.emit(NetworkEvent::Listening(address)).await;
                if relayed {
                    self.emit_reachability().await;
                }
            }
            SwarmEvent::ConnectionEstablished { peer_id, .. } if self.is_banned(&peer_id) => {
                let _ = self.swarm.disconnect_peer_id(peer_id);
            }
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } => {
                // A relayed connection's address is the relay's: it says nothing of where
                // the peer is.
                let relayed = endpoint.is_relayed();
                let ip = endpoint.get_remote_address().iter().find_map(|p| match p {
                    Protocol::Ip4(ip) => Some(std::net::IpAddr::V4(ip)),
                    Protocol::Ip6(ip) => Some(std::net::IpAddr::V6(ip)),
                    _ => None,
                });
                if let Some(ip) = ip.filter(|_| !relayed) {
                    self.emit(NetworkEvent::PeerIp { peer: peer_id, ip }).await;
                }
                self.relay_dials.remove(&peer_id);
                if !self.bootstrapped {
                    self.bootstrapped = true;
                    self.bootstrap_kad();
                }
                for reply in self.pending_dials.remove(&peer_id).unwrap_or_default() {
                    let _ = reply.send(Ok(()));
                }
                self.emit(NetworkEvent::Connected(peer_id)).await;
                let link = if relayed { Link::Relayed } else { Link::Direct };
                self.emit(NetworkEvent::Link {
                    peer: peer_id,
                    link,
                })
                .await;
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => self.emit(NetworkEvent::Disconnected(peer_id)).await,
            SwarmEvent::OutgoingConnectionError {
                peer_id: Some(peer),
                error,
                ..
            } if !matches!(error, DialError::DialPeerConditionFalse(_)) => {
                // A peer this node cannot dial directly may be behind NAT: try once more
                // through the relays before giving up.
                if self.pending_dials.contains_key(&peer)
                    && !self.swarm.is_connected(&peer)
                    && !self.relay_dials.contains(&peer)
                    && self.dial_through_relays(peer)
                {
                    return;
                }
                self.relay_dials.remove(&peer);
                for reply in self.pending_dials.remove(&peer).unwrap_or_default() {
                    let _ = reply.send(Err(NetError::Dial(format!("{peer}: {error}"))));
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            })) => {
                // Gossip never blocks the swarm: when the node is behind (a flood), the
                // message is ignored here (not forwarded, no penalty) rather than waiting,
                // so the node and this loop can never wait on each other.
                let event = NetworkEvent::Gossip {
                    id: message_id.clone(),
                    source: propagation_source,
                    topic: message.topic.into_string(),
                    data: message.data,
                };
                if let Err(tokio::sync::mpsc::error::TrySendError::Full(_)) =
                    self.events.try_send(event)
                {
                    self.gossip_shed += 1;
                    if self.gossip_shed % 1000 == 1 {
                        tracing::warn!(
                            "the node is behind on gossip: {} messages ignored so far",
                            self.gossip_shed
                        );
                    }
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .gossipsub
                        .report_message_validation_result(
                            &message_id,
                            &propagation_source,
                            gossipsub::MessageAcceptance::Ignore,
                        );
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(gossipsub::Event::Subscribed {
                peer_id,
                topic,
            })) => {
                self.emit(NetworkEvent::Subscribed {
                    peer: peer_id,
                    topic: topic.into_string(),
                })
                .await;
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                if let Some(kad) = self.swarm.behaviour_mut().kad.as_mut() {
                    for addr in info.listen_addrs {
                        kad.add_address(&peer_id, addr);
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Discovered(found))) => {
                for (peer, addr) in found {
                    if let Some(kad) = self.swarm.behaviour_mut().kad.as_mut() {
                        kad.add_address(&peer, addr.clone());
                    }
                    if let Err(e) = self.swarm.dial(addr) {
                        tracing::debug!("mDNS peer {peer}: {e}");
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(kad::Event::RoutingUpdated {
                peer, ..
            })) if !self.swarm.is_connected(&peer)
                && !self.is_banned(&peer)
                && !self.discovery_dials.contains(&peer)
                && self.swarm.connected_peers().count() + self.discovery_dials.len()
                    < MAX_DISCOVERED_PEERS =>
            {
                // Dialing by peer id uses the addresses kademlia learned.
                match self.swarm.dial(peer) {
                    Ok(()) => {
                        self.discovery_dials.insert(peer);
                    }
                    Err(e) => tracing::debug!("cannot dial discovered peer {peer}: {e}"),
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Lease(event)) => {
                self.on_request_event(Proto::Lease, event).await
            }
            SwarmEvent::Behaviour(BehaviourEvent::Receipt(event)) => {
                self.on_request_event(Proto::Receipt, event).await
            }
            SwarmEvent::Behaviour(BehaviourEvent::Ledger(event)) => {
                self.on_request_event(Proto::Ledger, event).await
            }
            SwarmEvent::Behaviour(BehaviourEvent::Raft(event)) => {
                self.on_request_event(Proto::Raft, event).await
            }
            SwarmEvent::Behaviour(BehaviourEvent::Autonat(autonat::Event::StatusChanged {
                new,
                ..
            })) => {
                self.reachability = match new {
                    autonat::NatStatus::Public(_) => Reachability::Public,
                    autonat::NatStatus::Private => Reachability::Private,
                    autonat::NatStatus::Unknown => Reachability::Unknown,
                };
                tracing::info!("reachability (AutoNAT): {new:?}");
                match self.reachability {
                    Reachability::Private => self.reserve_relay_slots(),
                    // Reachable again: the slots are no longer needed.
                    Reachability::Public => {
                        for id in self.circuits.keys().copied().collect::<Vec<_>>() {
                            self.swarm.remove_listener(id);
                        }
                    }
                    Reachability::Unknown => {}
                }
                self.emit_reachability().await;
            }
            SwarmEvent::Behaviour(BehaviourEvent::RelayClient(
                relay::client::Event::ReservationReqAccepted {
                    relay_peer_id,
                    renewal: false,
                    ..
                },
            )) => {
                tracing::info!("behind NAT: reachable through the relay {relay_peer_id}");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(dcutr::Event {
                remote_peer_id,
                result,
            })) => match result {
                Ok(_) => {
                    self.emit(NetworkEvent::Link {
                        peer: remote_peer_id,
                        link: Link::Punched,
                    })
                    .await
                }
                Err(e) => tracing::debug!("hole punch to {remote_peer_id}: {e}"),
            },
            SwarmEvent::ListenerClosed { listener_id, .. }
                if self.circuits.remove(&listener_id).is_some() =>
            {
                self.emit_reachability().await;
            }
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event {
                peer,
                result: Ok(rtt),
                ..
            })) => {
                self.emit(NetworkEvent::Rtt { peer, rtt }).await;
            }
            _ => {}
        }
    }

    /// Behind NAT: takes a slot at up to [`MAX_RELAY_SLOTS`] relays (listening on
    /// `<relay>/p2p-circuit`); identify tells connected peers the new address.
    fn reserve_relay_slots(&mut self) {
        if self.reachability != Reachability::Private {
            return;
        }
        let held: Vec<Multiaddr> = self.circuits.values().cloned().collect();
        for (_, relay) in &self.relays {
            if self.circuits.len() >= MAX_RELAY_SLOTS {
                break;
            }
            let circuit = relay.clone().with(Protocol::P2pCircuit);
            if held.contains(&circuit) {
                continue;
            }
            match self.swarm.listen_on(circuit.clone()) {
                Ok(id) => {
                    self.circuits.insert(id, circuit);
                }
                Err(e) => tracing::warn!("cannot take a relay slot at {relay}: {e}"),
            }
        }
    }

    /// Dials `peer` through every relay this node knows; false when it knows none.
    fn dial_through_relays(&mut self, peer: PeerId) -> bool {
        let through: Vec<Multiaddr> = self
            .relays
            .iter()
            .filter(|(relay, _)| *relay != peer)
            .map(|(_, addr)| addr.clone().with(Protocol::P2pCircuit))
            .collect();
        if through.is_empty() {
            return false;
        }
        let opts = DialOpts::peer_id(peer)
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .addresses(through)
            .build();
        match self.swarm.dial(opts) {
            Ok(()) => {
                self.relay_dials.insert(peer);
                true
            }
            Err(e) => {
                tracing::debug!("cannot dial {peer} through a relay: {e}");
                false
            }
        }
    }

    async fn emit_reachability(&mut self) {
        let relayed_at = self
            .swarm
            .listeners()
            .filter(|a| a.iter().any(|p| p == Protocol::P2pCircuit))
            .cloned()
            .collect();
        self.emit(NetworkEvent::Reachability {
            reachability: self.reachability,
            relayed_at,
        })
        .await;
    }

    /// Dials every bootstrap address again (a node with no peer).
    fn dial_bootstrap(&mut self) {
        for addr in self.bootstrap.clone() {
            if let Err(e) = self.swarm.dial(addr.clone()) {
                tracing::debug!("dialling bootstrap address {addr} again: {e}");
            }
        }
    }

    fn bootstrap_kad(&mut self) {
        if let Some(kad) = self.swarm.behaviour_mut().kad.as_mut() {
            // Fails only when the routing table is empty: nothing to walk yet.
            let _ = kad.bootstrap();
        }
    }

    fn behaviour(
        &mut self,
        proto: Proto,
    ) -> &mut request_response::Behaviour<super::codec::EnvelopeCodec> {
        let behaviour = self.swarm.behaviour_mut();
        match proto {
            Proto::Lease => &mut behaviour.lease,
            Proto::Receipt => &mut behaviour.receipt,
            Proto::Ledger => &mut behaviour.ledger,
            Proto::Raft => &mut behaviour.raft,
        }
    }

    async fn on_request_event(
        &mut self,
        proto: Proto,
        event: request_response::Event<Vec<u8>, Vec<u8>>,
    ) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request_id,
                    request,
                    channel,
                } => {
                    let id = InboundId {
                        proto,
                        id: request_id,
                    };
                    self.pending_responses.insert(id, channel);
                    self.emit(NetworkEvent::Request {
                        id,
                        proto,
                        peer,
                        data: request,
                    })
                    .await;
                }
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some(reply) = self.pending_requests.remove(&(proto, request_id)) {
                        let _ = reply.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure {
                request_id,
                error,
                peer,
                ..
            } => {
                if let Some(reply) = self.pending_requests.remove(&(proto, request_id)) {
                    let _ = reply.send(Err(NetError::Request(format!("{peer}: {error}"))));
                }
            }
            request_response::Event::InboundFailure { request_id, .. } => {
                self.pending_responses.remove(&InboundId {
                    proto,
                    id: request_id,
                });
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_alone_dials_its_bootstrap_peers_sooner_then_backs_off() {
        let s = std::time::Duration::from_secs;
        // Alone: 1, 2, 4, 8, 16 s, then at most every walk.
        let mut waits = vec![];
        let mut wait = LONELY_RETRY;
        for _ in 0..8 {
            wait = lonely_retry(Some(wait));
            waits.push(wait.as_secs());
        }
        assert_eq!(waits, [2, 4, 8, 16, 30, 30, 30, 30]);
        assert_eq!(LONELY_RETRY, s(1));
        // With a peer, the next time it is alone starts over.
        assert_eq!(lonely_retry(None), s(1));
    }
}
