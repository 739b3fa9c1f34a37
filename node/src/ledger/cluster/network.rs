//! openraft's RPCs on `/gpux/raft/1`: one request-response exchange per call, each a bincode
//! frame of openraft's serde types (at most `MAX_RAFT_FRAME` bytes, every byte consumed).
//! Only the cluster's configured members are answered.

use openraft::Raft;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use super::{LedgerRaft, Member, NodeId, decode, encode};
use crate::p2p::{Client, Multiaddr, PeerId, Proto};

/// A request between members, to the node id the sender believes it reaches (a member that
/// lost its store and came back under a new id must not answer for its old one).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Addressed {
    /// The node id meant (none for `Hello`).
    pub to: Option<NodeId>,
    /// The request.
    pub rpc: RaftRpc,
}

/// A request between members.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum RaftRpc {
    /// Who are you: the member's node id in its current store (a member that lost its
    /// store comes back under a new one).
    Hello,
    /// Log replication and heartbeats.
    Append(AppendEntriesRequest<LedgerRaft>),
    /// An election.
    Vote(VoteRequest<NodeId>),
    /// A snapshot chunk.
    Snapshot(InstallSnapshotRequest<LedgerRaft>),
    /// The member's own signed record of the entry at this log index (the leader collects a
    /// majority's before it answers).
    Cosign(u64),
}

/// The answer to a [`RaftRpc`].
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum RaftReply {
    /// The member's node id.
    Hello(NodeId),
    /// To `Append`.
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// To `Vote`.
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// To `Snapshot`.
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    /// To `Cosign`: the record, once the member has applied the entry (none when it was
    /// not a record, or not applied in time).
    Cosigned(Option<Vec<u8>>),
    /// Not answered (the sender is not a configured member, or the frame is bad).
    Refused(String),
}

/// How long a member waits to have applied an entry the leader asks it to cosign.
const COSIGN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A call that failed before any answer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct CallError(String);

/// Sends one request to `peer` (dialing `addr` when not connected) and decodes the answer.
pub(super) async fn call(
    net: &Client,
    peer: PeerId,
    addr: Option<&Multiaddr>,
    rpc: &Addressed,
    timeout: std::time::Duration,
) -> Result<RaftReply, CallError> {
    let frame = encode(rpc);
    let ask = async {
        match net.request_on(Proto::Raft, peer, frame.clone()).await {
            Ok(answer) => Ok(answer),
            Err(first) => {
                let Some(addr) = addr else {
                    return Err(CallError(first.to_string()));
                };
                let _ = net.dial(addr.clone()).await;
                net.request_on(Proto::Raft, peer, frame)
                    .await
                    .map_err(|e| CallError(e.to_string()))
            }
        }
    };
    let answer = tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| CallError(format!("no answer from {peer} in {timeout:?}")))??;
    decode(&answer).map_err(|e| CallError(format!("a bad answer from {peer}: {e}")))
}

/// Answers a request from `peer` (a configured member) with this member's raft.
pub(super) async fn serve<S: crate::store::Store + 'static>(
    raft: &Raft<LedgerRaft>,
    state: &super::LedgerState<S>,
    id: NodeId,
    data: &[u8],
) -> Vec<u8> {
    let reply = match decode::<Addressed>(data) {
        Ok(Addressed { to: Some(to), .. }) if to != id => {
            RaftReply::Refused(format!("this member is node {id}, not {to}"))
        }
        Ok(Addressed { rpc, .. }) => match rpc {
            RaftRpc::Hello => RaftReply::Hello(id),
            RaftRpc::Append(rpc) => RaftReply::Append(raft.append_entries(rpc).await),
            RaftRpc::Vote(rpc) => RaftReply::Vote(raft.vote(rpc).await),
            RaftRpc::Snapshot(rpc) => RaftReply::Snapshot(raft.install_snapshot(rpc).await),
            RaftRpc::Cosign(index) => {
                // Committed on the leader; applied here as soon as the commit reaches us.
                let deadline = tokio::time::Instant::now() + COSIGN_WAIT;
                while state.applied_index() < index && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                RaftReply::Cosigned(state.record_at(index))
            }
        },
        Err(e) => RaftReply::Refused(format!("an undecodable request: {e}")),
    };
    encode(&reply)
}

/// Makes a [`Link`] to each member openraft replicates to.
#[derive(Clone)]
pub(super) struct Links {
    pub(super) net: Client,
}

/// The connection to one member.
pub(super) struct Link {
    net: Client,
    target: NodeId,
    member: Member,
}

impl RaftNetworkFactory<LedgerRaft> for Links {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Link {
        Link {
            net: self.net.clone(),
            target,
            member: node.clone(),
        }
    }
}

type Rpc<T, E = RaftError<NodeId>> = Result<T, RPCError<NodeId, Member, E>>;

impl Link {
    async fn send<E: std::error::Error>(
        &self,
        rpc: RaftRpc,
        option: &RPCOption,
    ) -> Result<RaftReply, RPCError<NodeId, Member, E>> {
        let (peer, addr) = self
            .member
            .peer_and_addr()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&CallError(e))))?;
        let rpc = Addressed {
            to: Some(self.target),
            rpc,
        };
        let reply = call(&self.net, peer, Some(&addr), &rpc, option.hard_ttl())
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        if let RaftReply::Refused(why) = reply {
            return Err(RPCError::Network(NetworkError::new(&CallError(why))));
        }
        Ok(reply)
    }

    fn unexpected<E: std::error::Error>() -> RPCError<NodeId, Member, E> {
        RPCError::Network(NetworkError::new(&CallError("an unexpected answer".into())))
    }

    fn remote<T, E: std::error::Error>(
        &self,
        result: Result<T, RaftError<NodeId, E>>,
    ) -> Rpc<T, RaftError<NodeId, E>> {
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<LedgerRaft> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<LedgerRaft>,
        option: RPCOption,
    ) -> Rpc<AppendEntriesResponse<NodeId>> {
        match self.send(RaftRpc::Append(rpc), &option).await? {
            RaftReply::Append(result) => self.remote(result),
            _ => Err(Self::unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<LedgerRaft>,
        option: RPCOption,
    ) -> Rpc<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        match self.send(RaftRpc::Snapshot(rpc), &option).await? {
            RaftReply::Snapshot(result) => self.remote(result),
            _ => Err(Self::unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Rpc<VoteResponse<NodeId>> {
        match self.send(RaftRpc::Vote(rpc), &option).await? {
            RaftReply::Vote(result) => self.remote(result),
            _ => Err(Self::unexpected()),
        }
    }
}
