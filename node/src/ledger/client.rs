//! A party's connection to the ledger it trusts: one ledger node, or the members of a
//! replicated ledger (tried in turn, the last one that answered first, `NotLeader`
//! redirects followed). A record counts only when it is signed by one of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gpux_lease::LedgerVerdict;
use gpux_protocol::ledger_wire::{self, EscrowView, LedgerRequest, LedgerResponse, RefusalCode};
use gpux_protocol::{EscrowId, MicroCredits, PublicKey};
use libp2p::{Multiaddr, PeerId};

use crate::p2p::{Client, Proto};

/// How long a party waits for the ledger to answer (over all its members).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call to the ledger gave no answer to act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerCallError {
    /// The ledger did not answer (in time), or answered nonsense.
    #[error("the ledger at {addr} did not answer: {why}")]
    Unreachable {
        /// Where.
        addr: String,
        /// Why.
        why: String,
    },
    /// The ledger refused.
    #[error("the ledger refused ({code:?}): {detail}")]
    Refused {
        /// The rule.
        code: RefusalCode,
        /// For people.
        detail: String,
    },
}

/// One member of the ledger.
#[derive(Debug, Clone)]
struct Member {
    addr: Multiaddr,
    peer: PeerId,
    key: PublicKey,
}

/// A party's connection to the ledger it trusts.
#[derive(Debug, Clone)]
pub struct LedgerClient {
    net: Client,
    members: Arc<Vec<Member>>,
    /// The member that answered last: asked first.
    preferred: Arc<AtomicUsize>,
}

/// A ledger address that does not name the ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the ledger address {0} must end with /p2p/<the ledger's peer id>")]
pub struct LedgerAddrError(pub String);

fn member(addr: Multiaddr) -> Result<Member, LedgerAddrError> {
    let Some(libp2p::multiaddr::Protocol::P2p(peer)) = addr.iter().last() else {
        return Err(LedgerAddrError(addr.to_string()));
    };
    let key = peer
        .to_base58()
        .parse::<gpux_protocol::PeerId>()
        .map_err(|_| LedgerAddrError(addr.to_string()))?
        .public_key();
    Ok(Member { addr, peer, key })
}

impl LedgerClient {
    /// The ledger at `addr`, which must end with `/p2p/<peer id>` (the ledger's key).
    pub fn new(net: Client, addr: Multiaddr) -> Result<Self, LedgerAddrError> {
        Self::cluster(net, vec![addr])
    }

    /// The members of a replicated ledger (or one ledger node), each address ending with
    /// `/p2p/<peer id>`.
    pub fn cluster(net: Client, addrs: Vec<Multiaddr>) -> Result<Self, LedgerAddrError> {
        if addrs.is_empty() {
            return Err(LedgerAddrError("(none)".into()));
        }
        let members = addrs
            .into_iter()
            .map(member)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            net,
            members: Arc::new(members),
            preferred: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The ledger's key: its first member's (what a lease record names).
    pub fn key(&self) -> PublicKey {
        self.members[0].key
    }

    /// Every member's key: a record signed by any of them counts.
    pub fn keys(&self) -> Vec<PublicKey> {
        self.members.iter().map(|m| m.key).collect()
    }

    fn unreachable(&self, why: impl std::fmt::Display) -> LedgerCallError {
        LedgerCallError::Unreachable {
            addr: self
                .members
                .iter()
                .map(|m| m.addr.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            why: why.to_string(),
        }
    }

    /// Sends a request (dialing when not connected) to the members in turn, the last one
    /// that answered first, following `NotLeader` redirects; gives up after 10 s.
    pub async fn call(&self, request: &LedgerRequest) -> Result<LedgerResponse, LedgerCallError> {
        tokio::time::timeout(
            CALL_TIMEOUT,
            self.call_members(ledger_wire::encode(request)),
        )
        .await
        .map_err(|_| self.unreachable("no answer in time"))?
    }

    async fn call_members(&self, frame: Vec<u8>) -> Result<LedgerResponse, LedgerCallError> {
        let n = self.members.len();
        // Each member gets its share of the time; a lone ledger all of it.
        let each = CALL_TIMEOUT / u32::try_from(n).unwrap_or(1).max(1);
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut last_error = String::from("no member answered");
        for i in (0..n).map(|k| (first + k) % n) {
            let member = &self.members[i];
            let answer = tokio::time::timeout(
                each,
                self.call_once(member.peer, Some(&member.addr), frame.clone()),
            )
            .await;
            let response = match answer {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    last_error = e.to_string();
                    continue;
                }
                Err(_) => {
                    last_error = format!("{} gave no answer in time", member.addr);
                    continue;
                }
            };
            let LedgerResponse::NotLeader { leader, addrs } = &response else {
                self.preferred.store(i, Ordering::Relaxed);
                return Ok(response);
            };
            let Some(leader) = leader else {
                // An election is under way: another member may know more.
                last_error = "no leader yet (an election is under way)".into();
                continue;
            };
            let leader = PeerId::from_bytes(leader)
                .map_err(|e| self.unreachable(format!("a redirect to a bad peer id: {e}")))?;
            if let Some(k) = self.members.iter().position(|m| m.peer == leader) {
                self.preferred.store(k, Ordering::Relaxed);
            }
            for addr in addrs.iter().filter_map(|a| a.parse::<Multiaddr>().ok()) {
                let _ = self.net.dial(addr).await;
            }
            match tokio::time::timeout(each, self.call_once(leader, None, frame.clone())).await {
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(e)) => last_error = e.to_string(),
                Err(_) => last_error = "the leader gave no answer in time".into(),
            }
        }
        Err(self.unreachable(last_error))
    }

    async fn call_once(
        &self,
        peer: PeerId,
        addr: Option<&Multiaddr>,
        frame: Vec<u8>,
    ) -> Result<LedgerResponse, LedgerCallError> {
        let answer = match self
            .net
            .request_on(Proto::Ledger, peer, frame.clone())
            .await
        {
            Ok(answer) => answer,
            Err(first) => {
                let Some(addr) = addr else {
                    return Err(self.unreachable(first));
                };
                let _ = self.net.dial(addr.clone()).await;
                self.net
                    .request_on(Proto::Ledger, peer, frame)
                    .await
                    .map_err(|e| self.unreachable(e))?
            }
        };
        ledger_wire::decode(&answer).map_err(|e| self.unreachable(e))
    }

    /// Submits a signed operation; the verdict, typed.
    pub async fn submit(&self, envelope: Vec<u8>) -> LedgerVerdict {
        match self.call(&LedgerRequest::Submit(envelope)).await {
            Ok(response) => LedgerVerdict::from_response(response, &self.keys()),
            Err(e) => {
                tracing::debug!("{e}");
                LedgerVerdict::Unreachable
            }
        }
    }

    /// An account's balance.
    pub async fn balance(&self, account: PublicKey) -> Result<MicroCredits, LedgerCallError> {
        match self.call(&LedgerRequest::Balance(account)).await? {
            LedgerResponse::Balance(b) => Ok(MicroCredits(b)),
            LedgerResponse::Refused { code, detail, .. } => {
                Err(LedgerCallError::Refused { code, detail })
            }
            _ => Err(self.unreachable("an unexpected answer")),
        }
    }

    /// Who has paid `host`, as the ledger holds it.
    pub async fn history(
        &self,
        host: PublicKey,
    ) -> Result<gpux_protocol::ledger_wire::HostHistory, LedgerCallError> {
        match self.call(&LedgerRequest::History(host)).await? {
            LedgerResponse::History(h) => Ok(h),
            LedgerResponse::Refused { code, detail, .. } => {
                Err(LedgerCallError::Refused { code, detail })
            }
            _ => Err(self.unreachable("an unexpected answer")),
        }
    }

    /// How a host's leases ended, per payer, as the closing releases stated it.
    pub async fn ends(
        &self,
        host: PublicKey,
    ) -> Result<gpux_protocol::ledger_wire::HostEnds, LedgerCallError> {
        match self.call(&LedgerRequest::Ends(host)).await? {
            LedgerResponse::Ends(e) => Ok(e),
            LedgerResponse::Refused { code, detail, .. } => {
                Err(LedgerCallError::Refused { code, detail })
            }
            _ => Err(self.unreachable("an unexpected answer")),
        }
    }

    /// An escrow's signed records: its lock's, and its newest redemption's when the payee
    /// has redeemed anything.
    pub async fn proof(&self, id: EscrowId) -> Result<(Vec<u8>, Option<Vec<u8>>), LedgerCallError> {
        match self.call(&LedgerRequest::Proof(id)).await? {
            LedgerResponse::Proof { locked, paid } => Ok((locked, paid)),
            LedgerResponse::Refused { code, detail, .. } => {
                Err(LedgerCallError::Refused { code, detail })
            }
            _ => Err(self.unreachable("an unexpected answer")),
        }
    }

    /// An escrow's state.
    pub async fn escrow(&self, id: EscrowId) -> Result<Option<EscrowView>, LedgerCallError> {
        match self.call(&LedgerRequest::Escrow(id)).await? {
            LedgerResponse::Escrow(e) => Ok(e),
            LedgerResponse::Refused { code, detail, .. } => {
                Err(LedgerCallError::Refused { code, detail })
            }
            _ => Err(self.unreachable("an unexpected answer")),
        }
    }
}
