//! The ledger's API bodies: balances, minting (the faucet), the ledger's totals and a
//! replicated ledger's membership.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET /v1/balance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balance {
    /// The account (peer id).
    pub account: String,
    /// Credits.
    pub balance: String,
    /// Micro-credits.
    pub balance_micro: u64,
}

/// `POST /v1/ledger/mint` (a ledger node's faucet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MintRequest {
    /// The account: a peer id (`12D3KooW...`).
    pub account: String,
    /// Credits (`100.0`, more than zero).
    pub amount: String,
    /// A `FaucetGrant` of this account and amount signed by the ledger's faucet, hex: this
    /// node sends it to its ledger (`--ledger`), whose members check the faucet's signature.
    /// Without it, the node must serve a ledger without a faucet, and its operator mints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
}

/// The answer to a mint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Minted {
    /// The account.
    pub account: String,
    /// Its balance now, micro-credits.
    pub balance_micro: u64,
}

/// `GET /v1/ledger` (a ledger node's totals).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerTotals {
    /// Everything ever minted, micro-credits.
    pub minted_micro: u64,
    /// Balances plus what open escrows hold (equal to `minted_micro`).
    pub total_micro: u64,
    /// Every account's balance, micro-credits.
    pub balances: BTreeMap<String, u64>,
    /// Escrows ever opened.
    pub escrows: usize,
    /// Escrows still open.
    pub open_escrows: usize,
    /// A member of a replicated ledger: the cluster as this member sees it (absent for a
    /// single ledger node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterView>,
}

/// `POST /v1/ledger/readd`: take a member back that lost its store (on the leader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaddRequest {
    /// The member's peer id.
    pub peer: String,
}

/// The answer to [`ReaddRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readded {
    /// The member's peer id.
    pub peer: String,
    /// Its node id now (a voter again, caught up).
    pub node_id: u64,
}

/// A replicated ledger, as one member sees it (in [`LedgerTotals`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// This member's node id (drawn when its store was created).
    pub node_id: u64,
    /// Whether this member leads.
    pub leader: bool,
    /// The leader's node id, when one is known.
    pub leader_id: Option<u64>,
    /// The voters' node ids.
    pub voters: Vec<u64>,
    /// Members that replicate without voting yet (learners).
    pub learners: Vec<u64>,
    /// The raft term.
    pub term: u64,
    /// The last log index applied to this member's ledger.
    pub applied: u64,
}

/// A `FaucetGrant` of `amount` to `account`, signed by the faucet's key, as an envelope (a
/// random nonce makes each grant its own, however alike).
pub fn faucet_grant(
    faucet: &gpux_protocol::Keypair,
    account: gpux_protocol::PublicKey,
    amount: gpux_protocol::MicroCredits,
    now: gpux_protocol::Timestamp,
) -> Result<Vec<u8>, String> {
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| format!("random: {e}"))?;
    let grant = gpux_protocol::FaucetGrant {
        account,
        amount,
        nonce: u64::from_le_bytes(nonce),
        created_at: now,
        ext: gpux_protocol::Ext::new(),
    };
    gpux_protocol::Signed::sign(faucet, grant)
        .map(|signed| signed.as_bytes().to_vec())
        .map_err(|e| e.to_string())
}
