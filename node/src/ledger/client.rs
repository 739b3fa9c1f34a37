//! A party's connection to the ledger it trusts: one ledger node, or the members of a
//! replicated ledger (tried in turn, the last one that answered first, `NotLeader`
//! redirects followed). A record counts only when it is signed by one of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use gpux_lease::LedgerVerdict;
use gpux_protocol::ledger_wire::{self, EscrowView, LedgerRequest, LedgerResponse, RefusalCode};
use gpux_protocol::{EscrowId, MicroCredits, PublicKey};
use libp2p::{Multiaddr, PeerId};

use crate::p2p::{Client, Proto};

/// How long a party waits for the ledger to answer (over all its members, asked again and
/// again while an election is under way).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one member may take to answer, in round trips measured to it: a request on a
/// new substream is two, and the member's own work (an append replicated to a majority,
/// the co-signatures) a few more; the rest is room for a loaded member.
const ATTEMPT_RTTS: u32 = 12;
/// The least time one member is given (its work on a quiet link: a flushed write, the
/// co-signatures), and the most (so that a silent member leaves time for the others).
const ATTEMPT_MIN: Duration = Duration::from_millis(1_500);
const ATTEMPT_MAX: Duration = Duration::from_secs(4);
/// What a member is given before any round trip to it was measured.
const ATTEMPT_UNMEASURED: Duration = Duration::from_secs(3);
/// A member that failed to answer is asked last for this long.
const DOWN_FOR: Duration = Duration::from_secs(10);
/// The pause after a pass over every member found no answer (no leader yet), doubling
/// up to [`PASS_PAUSE_MAX`].
const PASS_PAUSE: Duration = Duration::from_millis(100);
const PASS_PAUSE_MAX: Duration = Duration::from_secs(1);

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

/// What this party measured of one member: the round trip (ms, a moving average; 0 for
/// none yet), and when it last failed to answer (ms since the client was made; 0 never).
#[derive(Debug, Default)]
struct Measured {
    rtt_ms: AtomicU64,
    failed_at_ms: AtomicU64,
}

/// A party's connection to the ledger it trusts.
#[derive(Debug, Clone)]
pub struct LedgerClient {
    net: Client,
    members: Arc<Vec<Member>>,
    measured: Arc<Vec<Measured>>,
    /// The member that answered last: asked first.
    preferred: Arc<AtomicUsize>,
    /// What `failed_at_ms` counts from.
    made: std::time::Instant,
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
            measured: Arc::new(members.iter().map(|_| Measured::default()).collect()),
            members: Arc::new(members),
            preferred: Arc::new(AtomicUsize::new(0)),
            made: std::time::Instant::now(),
        })
    }

    /// A round trip measured to `peer` (libp2p's ping); kept when it is a member, as a
    /// moving average that one slow ping moves by a quarter.
    pub fn note_rtt(&self, peer: &PeerId, rtt: Duration) {
        let Some(i) = self.members.iter().position(|m| m.peer == *peer) else {
            return;
        };
        let rtt = u64::try_from(rtt.as_millis()).unwrap_or(u64::MAX).max(1);
        let cell = &self.measured[i].rtt_ms;
        let old = cell.load(Ordering::Relaxed);
        let new = if old == 0 {
            rtt
        } else {
            old.saturating_mul(3).saturating_add(rtt) / 4
        };
        cell.store(new.max(1), Ordering::Relaxed);
    }

    /// How long member `i` is given to answer one request: [`ATTEMPT_RTTS`] round trips
    /// measured to it, within [`ATTEMPT_MIN`]..[`ATTEMPT_MAX`].
    fn attempt_time(&self, i: usize) -> Duration {
        match self.measured[i].rtt_ms.load(Ordering::Relaxed) {
            0 => ATTEMPT_UNMEASURED,
            rtt => (Duration::from_millis(rtt) * ATTEMPT_RTTS).clamp(ATTEMPT_MIN, ATTEMPT_MAX),
        }
    }

    fn since_made_ms(&self) -> u64 {
        u64::try_from(self.made.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Whether member `i` failed to answer within the last [`DOWN_FOR`].
    fn down(&self, i: usize) -> bool {
        match self.measured[i].failed_at_ms.load(Ordering::Relaxed) {
            0 => false,
            at => self.since_made_ms().saturating_sub(at) < DOWN_FOR.as_millis() as u64,
        }
    }

    /// The members in the order one pass asks them: the one that answered last first,
    /// then around the list; those that failed lately last.
    fn pass_order(&self) -> Vec<usize> {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut order: Vec<usize> = (0..n).map(|k| (first + k) % n).collect();
        order.sort_by_key(|&i| self.down(i));
        order
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
    /// that answered first and those that failed lately last, following `NotLeader`
    /// redirects; while no member answers (a leader lost, an election under way) it asks
    /// again after a pause, until 10 s have passed.
    pub async fn call(&self, request: &LedgerRequest) -> Result<LedgerResponse, LedgerCallError> {
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        let frame = ledger_wire::encode(request);
        let mut pause = PASS_PAUSE;
        loop {
            let why = match self.pass(&frame, deadline).await {
                Ok(response) => return Ok(response),
                Err(why) => why,
            };
            let now = tokio::time::Instant::now();
            if now + pause >= deadline {
                return Err(self.unreachable(why));
            }
            tracing::debug!(
                "the ledger: {why}; asking again in {} ms",
                pause.as_millis()
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(PASS_PAUSE_MAX);
        }
    }

    /// One pass over the members: the answer, or why there is none.
    async fn pass(
        &self,
        frame: &[u8],
        deadline: tokio::time::Instant,
    ) -> Result<LedgerResponse, String> {
        let mut last_error = String::from("no member answered");
        for i in self.pass_order() {
            let member = &self.members[i];
            let time = self
                .attempt_time(i)
                .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            if time.is_zero() {
                break;
            }
            let answer = tokio::time::timeout(
                time,
                self.call_once(member.peer, Some(&member.addr), frame.to_vec()),
            )
            .await;
            let response = match answer {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    self.failed(i);
                    last_error = e.to_string();
                    continue;
                }
                Err(_) => {
                    self.failed(i);
                    last_error =
                        format!("{} gave no answer in {} ms", member.addr, time.as_millis());
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
                .map_err(|e| format!("a redirect to a bad peer id: {e}"))?;
            let known = self.members.iter().position(|m| m.peer == leader);
            if let Some(k) = known {
                self.preferred.store(k, Ordering::Relaxed);
            }
            for addr in addrs.iter().filter_map(|a| a.parse::<Multiaddr>().ok()) {
                if let Err(e) = self.net.dial(addr).await {
                    tracing::debug!("dialling the ledger's leader {leader}: {e}");
                }
            }
            let time = known
                .map_or(ATTEMPT_UNMEASURED, |k| self.attempt_time(k))
                .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            match tokio::time::timeout(time, self.call_once(leader, None, frame.to_vec())).await {
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(e)) => last_error = e.to_string(),
                Err(_) => last_error = "the leader gave no answer in time".into(),
            }
            if let Some(k) = known {
                self.failed(k);
            }
        }
        Err(last_error)
    }

    fn failed(&self, i: usize) {
        self.measured[i]
            .failed_at_ms
            .store(self.since_made_ms(), Ordering::Relaxed);
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
