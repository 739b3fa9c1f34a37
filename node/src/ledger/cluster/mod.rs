//! A replicated ledger: the same pure [`gpux_lease::LedgerMachine`] on every member of a
//! cluster of 3 or 5, its operations ordered by openraft (docs/settlement.md, "A ledger
//! cluster").
//!
//! The leader stamps each operation with its own clock and proposes it; once a majority has
//! it on disk (flushed), every member applies it at that stamped time, verifying the
//! envelope again, so time-dependent rules (stale locks, the release grace) cannot diverge
//! between members. Followers answer `NotLeader` with the leader's address.
//!
//! Members are configured by address and peer id. Each member's raft store has a node id
//! drawn when the store is created: a member that lost its disk comes back under a new id,
//! which is not a voter; the leader does not take it back on its own (it could have acked
//! entries it no longer has), so the operator removes the old id and adds the new one as a
//! learner first ([`LedgerCluster::readd`]).

// openraft's traits fix their error types (`StorageError`, `RPCError`), which are large;
// the helpers here return them as they are.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use gpux_lease::{LogEntry, LogOp};
use gpux_market::LedgerConfig;
use gpux_protocol::ledger_wire::{self, LedgerRequest, LedgerResponse, RefusalCode};
use gpux_protocol::{AnySigned, Keypair, MicroCredits, PublicKey, Timestamp};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, Raft};

use crate::p2p::{Client, Multiaddr, PeerId, multiaddr::Protocol};
use crate::store::{Durability, Store, Tree};

mod log_store;
mod network;
mod state;
mod timing;

pub use log_store::LogStore;
pub use network::{Addressed, RaftReply, RaftRpc};
pub use state::LedgerState;
pub use timing::Timings;

/// A member's id in its current raft store.
pub type NodeId = u64;

/// A log entry's payload: the ledger's [`LogEntry`] (the leader's time and the operation),
/// bincode-encoded as a single-member ledger logs it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Command(pub Vec<u8>);

/// What applying a [`Command`] answered: an encoded `LedgerResponse` (empty for raft's own
/// entries).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Answer(pub Vec<u8>);

/// A member as the cluster's membership holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Its peer id (base58).
    pub peer: String,
    /// An address to dial it at (without `/p2p`).
    pub addr: String,
}

impl Member {
    fn new(peer: PeerId, addr: &Multiaddr) -> Self {
        let addr: Multiaddr = addr
            .iter()
            .filter(|p| !matches!(p, Protocol::P2p(_)))
            .collect();
        Self {
            peer: peer.to_base58(),
            addr: addr.to_string(),
        }
    }

    pub(crate) fn peer_and_addr(&self) -> Result<(PeerId, Multiaddr), String> {
        let peer = self
            .peer
            .parse::<PeerId>()
            .map_err(|e| format!("member {}: {e}", self.peer))?;
        let addr = self
            .addr
            .parse::<Multiaddr>()
            .map_err(|e| format!("member {}: {e}", self.peer))?;
        Ok((peer, addr.with(Protocol::P2p(peer))))
    }
}

openraft::declare_raft_types!(
    /// The ledger cluster's raft types.
    pub LedgerRaft:
        D = Command,
        R = Answer,
        NodeId = NodeId,
        Node = Member,
        Entry = openraft::Entry<LedgerRaft>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The largest raft frame or stored raft value decoded.
const MAX_RAFT_BYTES: usize = 4 * 1024 * 1024;

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_RAFT_BYTES>()
}

pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode_config()).unwrap_or_default()
}

/// Decodes `bytes`, refusing anything left over.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, bincode_config()).map_err(|e| e.to_string())?;
    if used != bytes.len() {
        return Err(format!("{} trailing bytes", bytes.len() - used));
    }
    Ok(value)
}

/// The cluster a ledger member belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Every member's address, ending with `/p2p/<its peer id>` (this member's own among
    /// them).
    pub members: Vec<Multiaddr>,
    /// Form a new cluster from this member when its store is new (one member of a new
    /// cluster only; the others join it).
    pub bootstrap: bool,
}

impl ClusterConfig {
    /// The members by peer id; an address without a peer id is an error.
    pub fn peers(&self) -> Result<BTreeMap<PeerId, Multiaddr>, ClusterError> {
        self.members
            .iter()
            .map(|addr| match addr.iter().last() {
                Some(Protocol::P2p(peer)) => Ok((peer, addr.clone())),
                _ => Err(ClusterError::Config(format!(
                    "the member address {addr} must end with /p2p/<its peer id>"
                ))),
            })
            .collect()
    }
}

/// Why a ledger member cannot start or do something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The cluster configuration is wrong.
    #[error("ledger cluster: {0}")]
    Config(String),
    /// The raft store cannot be read or written.
    #[error("ledger cluster store: {0}")]
    Store(String),
    /// openraft failed.
    #[error("ledger cluster: {0}")]
    Raft(String),
    /// Not the leader (ask the leader).
    #[error("this member is not the leader")]
    NotLeader,
}

/// How often the leader looks for configured members missing from the cluster.
const FORM_EVERY: Duration = Duration::from_secs(1);
/// How long a call to another member may take.
const MEMBER_CALL: Duration = Duration::from_secs(3);
/// The key of this member's node id in `Tree::RaftMeta`.
const NODE_ID: &[u8] = b"node-id";

/// This member of a ledger cluster.
pub struct LedgerCluster<S> {
    id: NodeId,
    raft: Raft<LedgerRaft>,
    state: LedgerState<S>,
    net: Client,
    members: BTreeMap<PeerId, Multiaddr>,
    timings: Timings,
    forming: tokio::task::JoinHandle<()>,
}

impl<S> std::fmt::Debug for LedgerCluster<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerCluster")
            .field("id", &self.id)
            .finish()
    }
}

impl<S> Drop for LedgerCluster<S> {
    fn drop(&mut self) {
        self.forming.abort();
    }
}

/// This store's node id, drawn when the store is new (then `true`).
fn node_id<S: Store>(store: &S) -> Result<(NodeId, bool), ClusterError> {
    let io = |e: crate::store::StoreError| ClusterError::Store(e.to_string());
    if let Some(bytes) = store.get(Tree::RaftMeta, NODE_ID).map_err(io)? {
        let id = bytes
            .as_slice()
            .try_into()
            .map(u64::from_be_bytes)
            .map_err(|_| ClusterError::Store("the stored node id is damaged".into()))?;
        return Ok((id, false));
    }
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| ClusterError::Store(e.to_string()))?;
    // Never 0 (openraft's ids are plain numbers; 0 reads as unset to people).
    let id = u64::from_be_bytes(bytes).max(1);
    store
        .put(
            Tree::RaftMeta,
            NODE_ID,
            &id.to_be_bytes(),
            Durability::Flush,
        )
        .map_err(io)?;
    Ok((id, true))
}

impl<S: Store + 'static> LedgerCluster<S> {
    /// Starts this member: its raft over `store`, talking to the others through `net`.
    pub async fn start(
        key: Keypair,
        ledger: LedgerConfig,
        store: Arc<S>,
        net: Client,
        cluster: &ClusterConfig,
    ) -> Result<Self, ClusterError> {
        let members = cluster.peers()?;
        let me = net.local_peer_id();
        let my_addr = members.get(&me).cloned().ok_or_else(|| {
            ClusterError::Config(format!(
                "this node ({me}) is not among the configured members"
            ))
        })?;
        if !(1..=7).contains(&members.len()) {
            return Err(ClusterError::Config(format!(
                "{} members; a cluster has 1 to 7 (3 or 5 survive the loss of 1 or 2)",
                members.len()
            )));
        }
        let (id, new_store) = node_id(store.as_ref())?;
        let log = LogStore::new(store.clone());
        let state = LedgerState::open(key, ledger, store).map_err(ClusterError::Store)?;
        let timings = Timings::for_round_trip(timing::measure(&net, &members).await);
        tracing::info!("ledger member {id}: raft timings {timings}");
        let raft = Raft::new(
            id,
            Arc::new(timings.config()?),
            network::Links { net: net.clone() },
            log,
            state.clone(),
        )
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
        if cluster.bootstrap && new_store {
            let mut first = BTreeMap::new();
            first.insert(id, Member::new(me, &my_addr));
            raft.initialize(first)
                .await
                .map_err(|e| ClusterError::Raft(e.to_string()))?;
            tracing::info!("formed a new ledger cluster as member {id}");
        } else if new_store {
            tracing::info!(
                "ledger member {id} waits to be added to the cluster (a new store: it will not \
                 vote until the leader has made it a learner and then a voter)"
            );
        }
        let forming = tokio::spawn(form(raft.clone(), net.clone(), members.clone()));
        Ok(Self {
            id,
            raft,
            state,
            net,
            members,
            timings,
            forming,
        })
    }

    /// This member's node id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The raft timings this member started with (scaled to the round trip it measured).
    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// The raft handle (metrics, membership changes).
    pub fn raft(&self) -> &Raft<LedgerRaft> {
        &self.raft
    }

    /// The replicated state (read-only use).
    pub fn state(&self) -> &LedgerState<S> {
        &self.state
    }

    /// The cluster as this member sees it.
    pub fn view(&self) -> gpux_api::ClusterView {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        gpux_api::ClusterView {
            node_id: self.id,
            leader: metrics.current_leader == Some(self.id),
            leader_id: metrics.current_leader,
            learners: membership
                .nodes()
                .map(|(id, _)| *id)
                .filter(|id| !voters.contains(id))
                .collect(),
            voters: voters.into_iter().collect(),
            term: metrics.current_term,
            applied: self.state.applied_index(),
        }
    }

    /// Every configured member's key (a record signed by any of them is the ledger's).
    pub fn member_keys(&self) -> Vec<PublicKey> {
        self.members
            .keys()
            .filter_map(|p| p.to_base58().parse::<gpux_protocol::PeerId>().ok())
            .map(|p| p.public_key())
            .collect()
    }

    /// Whether `peer` is a configured member (only they are answered on `/gpux/raft/1`).
    pub fn is_member(&self, peer: &PeerId) -> bool {
        self.members.contains_key(peer)
    }

    /// Answers a `/gpux/raft/1` request from `peer`.
    pub fn serve_raft(
        &self,
        peer: PeerId,
        data: Vec<u8>,
    ) -> impl std::future::Future<Output = Vec<u8>> + Send + 'static {
        let (raft, id, member) = (self.raft.clone(), self.id, self.is_member(&peer));
        let state = self.state.clone();
        async move {
            if !member {
                return encode(&RaftReply::Refused(format!(
                    "{peer} is not a member of this ledger cluster"
                )));
            }
            network::serve(&raft, &state, id, &data).await
        }
    }

    /// Answers a `/gpux/ledger/2` frame at `now`.
    pub fn handle(
        &self,
        frame: &[u8],
        now: Timestamp,
    ) -> impl std::future::Future<Output = LedgerResponse> + Send + 'static {
        let request = ledger_wire::decode::<LedgerRequest>(frame);
        let (raft, state, id) = (self.raft.clone(), self.state.clone(), self.id);
        let net = self.net.clone();
        async move {
            let request = match request {
                Ok(r) => r,
                Err(e) => return LedgerResponse::refused(RefusalCode::Malformed, e.to_string()),
            };
            match request {
                LedgerRequest::Submit(envelope) => {
                    // Checked before it takes a place in everyone's log (a signed message of
                    // another kind would only fill it); every member checks it again when it
                    // applies it.
                    match AnySigned::from_bytes(envelope.clone()).and_then(AnySigned::verify) {
                        Err(e) => {
                            return LedgerResponse::refused(RefusalCode::Invalid, e.to_string());
                        }
                        Ok(
                            gpux_protocol::AnyVerified::EscrowLock(_)
                            | gpux_protocol::AnyVerified::Redeem(_)
                            | gpux_protocol::AnyVerified::Release(_)
                            | gpux_protocol::AnyVerified::FaucetGrant(_),
                        ) => {}
                        Ok(other) => {
                            return LedgerResponse::refused(
                                RefusalCode::Invalid,
                                format!("{} is not a ledger operation", other.kind()),
                            );
                        }
                    }
                    let entry = LogEntry {
                        at: now,
                        op: LogOp::Envelope(envelope),
                    };
                    match propose_at(&raft, &entry).await {
                        (LedgerResponse::Record(own), Some(index)) => {
                            cosigned(&raft, &net, id, index, own).await
                        }
                        (response, _) => response,
                    }
                }
                read => match raft.current_leader().await {
                    Some(leader) if leader == id => state.query(read),
                    _ => not_leader(&raft).await,
                },
            }
        }
    }

    /// Mints credits (the testnet faucet, from this node's operator), through the log.
    pub async fn mint(
        &self,
        account: PublicKey,
        amount: MicroCredits,
        now: Timestamp,
    ) -> Result<LedgerResponse, ClusterError> {
        let entry = LogEntry {
            at: now,
            op: LogOp::Mint { account, amount },
        };
        match propose(&self.raft, &entry).await {
            LedgerResponse::NotLeader { .. } => Err(ClusterError::NotLeader),
            other => Ok(other),
        }
    }

    /// Takes back a member that lost its store and came back under a new node id: its old
    /// id leaves the voters, its new one joins as a learner, catches up, then votes.
    pub async fn readd(&self, peer: PeerId) -> Result<NodeId, ClusterError> {
        let addr = self
            .members
            .get(&peer)
            .ok_or_else(|| ClusterError::Config(format!("{peer} is not a configured member")))?;
        let new_id = hello(&self.net, peer, addr, MEMBER_CALL).await?;
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let old: BTreeSet<NodeId> = membership
            .nodes()
            .filter(|(id, m)| m.peer == peer.to_base58() && **id != new_id)
            .map(|(id, _)| *id)
            .collect();
        let raft_err = |e: RaftError<NodeId, ClientWriteError<NodeId, Member>>| match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => ClusterError::NotLeader,
            e => ClusterError::Raft(e.to_string()),
        };
        if !old.is_empty() {
            self.raft
                .change_membership(ChangeMembers::RemoveVoters(old.clone()), false)
                .await
                .map_err(raft_err)?;
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(old), false)
                .await
                .map_err(raft_err)?;
        }
        join(&self.raft, new_id, Member::new(peer, addr))
            .await
            .map_err(raft_err)?;
        Ok(new_id)
    }

    /// Stops this member's raft.
    pub async fn shutdown(&self) {
        self.forming.abort();
        let _ = self.raft.shutdown().await;
    }
}

/// Proposes `entry` and returns what applying it answered (or where the leader is).
async fn propose(raft: &Raft<LedgerRaft>, entry: &LogEntry) -> LedgerResponse {
    propose_at(raft, entry).await.0
}

/// [`propose`], with the entry's log index when it was applied.
async fn propose_at(raft: &Raft<LedgerRaft>, entry: &LogEntry) -> (LedgerResponse, Option<u64>) {
    let bytes = bincode::encode_to_vec(entry, bincode::config::standard()).unwrap_or_default();
    match raft.client_write(Command(bytes)).await {
        Ok(written) => (
            ledger_wire::decode(&written.data.0).unwrap_or_else(|e| {
                LedgerResponse::refused(RefusalCode::Invalid, format!("an undecodable answer: {e}"))
            }),
            Some(written.log_id.index),
        ),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
            (not_leader(raft).await, None)
        }
        Err(e) => (
            LedgerResponse::refused(RefusalCode::Invalid, e.to_string()),
            None,
        ),
    }
}

/// The leader's record of the entry at `index` with the other voters' signed copies of it,
/// once a majority of the voters have signed (each member signs what it applied itself).
/// Without a majority in time the answer is the leader's record alone, which a party
/// configured with the members does not act on (it asks again: a retry is answered again).
async fn cosigned(
    raft: &Raft<LedgerRaft>,
    net: &Client,
    me: NodeId,
    index: u64,
    own: Vec<u8>,
) -> LedgerResponse {
    let membership = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .clone();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let quorum = voters.len() / 2 + 1;
    let mut copies = vec![own];
    let mut asks = futures::stream::FuturesUnordered::new();
    for id in voters.iter().filter(|&&id| id != me) {
        let Some((peer, addr)) = membership.get_node(id).and_then(|m| m.peer_and_addr().ok())
        else {
            continue;
        };
        let rpc = Addressed {
            to: Some(*id),
            rpc: RaftRpc::Cosign(index),
        };
        asks.push(async move { network::call(net, peer, Some(&addr), &rpc, MEMBER_CALL).await });
    }
    while copies.len() < quorum {
        use futures::StreamExt;
        match asks.next().await {
            Some(Ok(RaftReply::Cosigned(Some(record)))) => copies.push(record),
            Some(_) => {}
            None => break,
        }
    }
    if copies.len() < quorum {
        tracing::warn!(
            "ledger entry {index}: {} of the {quorum} signatures needed",
            copies.len()
        );
    }
    LedgerResponse::Cosigned(copies)
}

/// The redirect to the current leader (without one while an election runs).
async fn not_leader(raft: &Raft<LedgerRaft>) -> LedgerResponse {
    let metrics = raft.metrics().borrow().clone();
    let leader = metrics
        .current_leader
        .and_then(|l| metrics.membership_config.membership().get_node(&l).cloned())
        .and_then(|m| m.peer_and_addr().ok());
    LedgerResponse::NotLeader {
        leader: leader.as_ref().map(|(peer, _)| peer.to_bytes()),
        addrs: leader.map(|(_, a)| vec![a.to_string()]).unwrap_or_default(),
    }
}

/// Asks `peer` for its node id.
pub(super) async fn hello(
    net: &Client,
    peer: PeerId,
    addr: &Multiaddr,
    within: std::time::Duration,
) -> Result<NodeId, ClusterError> {
    let hello = Addressed {
        to: None,
        rpc: RaftRpc::Hello,
    };
    match network::call(net, peer, Some(addr), &hello, within).await {
        Ok(RaftReply::Hello(id)) => Ok(id),
        Ok(other) => Err(ClusterError::Raft(format!("{peer} answered {other:?}"))),
        Err(e) => Err(ClusterError::Raft(e.to_string())),
    }
}

/// Adds `id` as a learner (waiting until it has caught up), then makes it a voter.
async fn join(
    raft: &Raft<LedgerRaft>,
    id: NodeId,
    member: Member,
) -> Result<(), RaftError<NodeId, ClientWriteError<NodeId, Member>>> {
    raft.add_learner(id, member, true).await?;
    let mut voters = BTreeSet::new();
    voters.insert(id);
    raft.change_membership(ChangeMembers::AddVoterIds(voters), false)
        .await?;
    Ok(())
}

/// The leader's loop: configured members that were never part of the cluster join it (as
/// learners, then voters). A member whose peer is in the membership under another node id
/// lost its store; it is left for the operator ([`LedgerCluster::readd`]).
async fn form(raft: Raft<LedgerRaft>, net: Client, members: BTreeMap<PeerId, Multiaddr>) {
    let mut warned = BTreeSet::new();
    let me = net.local_peer_id();
    loop {
        tokio::time::sleep(FORM_EVERY).await;
        let metrics = raft.metrics().borrow().clone();
        if metrics.current_leader != Some(metrics.id) {
            continue;
        }
        let membership = metrics.membership_config.membership().clone();
        for (peer, addr) in members.iter().filter(|(p, _)| **p != me) {
            let known: Vec<NodeId> = membership
                .nodes()
                .filter(|(_, m)| m.peer == peer.to_base58())
                .map(|(id, _)| *id)
                .collect();
            let Ok(id) = hello(&net, *peer, addr, MEMBER_CALL).await else {
                continue;
            };
            if known.contains(&id) {
                continue;
            }
            if !known.is_empty() {
                if warned.insert(id) {
                    tracing::warn!(
                        "ledger member {peer} came back with a new store (node id {id}, was {known:?}): \
                         it lost what it had and does not vote; re-add it with `gpux ledger readd {peer}`"
                    );
                }
                continue;
            }
            match join(&raft, id, Member::new(*peer, addr)).await {
                Ok(()) => tracing::info!("ledger member {peer} (node id {id}) joined the cluster"),
                Err(e) => tracing::debug!("ledger member {peer} could not join yet: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
