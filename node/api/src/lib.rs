//! The gpux local API's contract: every request and response body the daemon serves on
//! `127.0.0.1` (behind its bearer token), shared by the daemon, the `gpux` CLI and the
//! testnet, so none of them builds or reads JSON by hand.
//!
//! Errors travel as an [`ApiError`] body, `{code, message, hint}`, with one HTTP status per
//! [`ErrorCode`].
//!
//! ```
//! use gpux_api::{ApiError, ErrorCode};
//!
//! let e = ApiError::new(ErrorCode::UnknownLease, "no lease 9c14… here")
//!     .with_hint("`gpux leases` lists this node's leases");
//! assert_eq!(e.code.status(), 404);
//! let json = serde_json::to_string(&e).unwrap();
//! assert!(json.contains("\"code\":\"unknown-lease\""));
//! ```

use std::collections::BTreeMap;

use gpux_protocol::{
    ComputeCapability, ContentId, EvidenceTier, MicroCredits, PublicKey, Timestamp,
};
use serde::{Deserialize, Serialize};
mod copy;
mod data_dir;
mod image_ref;
mod key_file;
mod ledger;
mod rent;
pub mod text;
pub use copy::{CopyEvent, CopyOrder, CopyReport};
pub use data_dir::{DataDirError, default_data_dir};
pub use image_ref::ImageRef;
pub use key_file::{KEY_FILE_NAME, KeyFileError, create_key, init_key, key_path, load_key};
pub use ledger::{
    Balance, ClusterView, LedgerTotals, MintRequest, Minted, ReaddRequest, Readded, faucet_grant,
};
pub use rent::{
    BidPlaced, BidRequest, BidView, ChallengePassed, GroupPlaced, GroupScale, GroupScaled,
    PulledImage, RegistryCredentials, RentProgress, RentRequest, Rented, Retention, StagedImage,
};

/// The file in a node's data directory that holds its API's bearer token (mode 0600).
pub const TOKEN_FILE: &str = "api.token";
/// The file in a node's data directory that holds its API's address (`127.0.0.1:PORT`).
pub const ADDR_FILE: &str = "api.addr";

/// What kind of failure an API error is: one HTTP status each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request is malformed or a value is invalid (400).
    BadInput,
    /// No token, or the wrong one (401).
    Unauthorized,
    /// The lease is not known to this node (404).
    UnknownLease,
    /// The request conflicts with the state (409): a lease already ended, a node without
    /// the role asked for, nothing in the market that fits.
    Conflict,
    /// Nothing in this node's view of the market satisfies the request (409).
    NoOffer,
    /// Every host asked had the GPUs leased to someone else by then (409): a busy market.
    AllTaken,
    /// Something the node depends on did not answer (503): Docker, the ledger, a host.
    Unavailable,
    /// The node failed (500).
    Internal,
    /// The image cannot be had (422): its registry refused the credentials, or has no
    /// such image. Nothing was charged.
    ImageRefused,
}

impl ErrorCode {
    /// The HTTP status.
    pub const fn status(self) -> u16 {
        match self {
            ErrorCode::BadInput => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::UnknownLease => 404,
            ErrorCode::Conflict | ErrorCode::NoOffer | ErrorCode::AllTaken => 409,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
            ErrorCode::ImageRefused => 422,
        }
    }
}

/// An error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// The kind.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
    /// What to do about it, when there is something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl ApiError {
    /// An error without a hint.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            hint: None,
        }
    }

    /// With a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// A bad value.
    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadInput, message)
    }

    /// A failure of the node itself.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, " ({hint})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// This node's peer id.
    pub peer_id: String,
    /// Offers in this node's view of the market.
    pub offers_in_book: usize,
    /// This host's own current offers (None: not a host).
    pub own_offers: Option<usize>,
    /// Gossip messages accepted.
    pub gossip_accepted: u64,
    /// Gossip messages rejected.
    pub gossip_rejected: u64,
    /// Gossip messages ignored because their relaying peer was over its budget.
    #[serde(default)]
    pub gossip_over_budget: u64,
    /// Delays from an offer's signing to its arrival here, ms (the latest ones).
    pub arrivals_ms: Vec<u64>,
    /// Seconds since the node started.
    pub uptime_s: u64,
    /// Peers connected now (peer ids, sorted).
    #[serde(default)]
    pub peers: Vec<String>,
    /// The last ping round trip to each connected peer, ms, by peer id.
    #[serde(default)]
    pub peer_rtt_ms: std::collections::BTreeMap<String, u64>,
    /// How this node is connected to each connected peer, by peer id: `direct`, `relayed`
    /// (through a relay: one of the two is behind NAT) or `punched` (directly, after hole
    /// punching replaced a relayed connection).
    #[serde(default)]
    pub peer_links: std::collections::BTreeMap<String, String>,
    /// Whether other nodes can dial this one, as AutoNAT found: `public`, `private` (behind
    /// NAT: reached through relays) or `unknown`.
    #[serde(default)]
    pub reachability: String,
    /// The relay addresses this node is reached through when it is behind NAT.
    #[serde(default)]
    pub relayed_at: Vec<String>,
    /// Where `/metrics` listens (`127.0.0.1:PORT`), when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

/// One offer found by `GET /v1/offers?q=QUERY&limit=N`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferHit {
    /// The offer id.
    pub offer: ContentId,
    /// The host.
    pub host: PublicKey,
    /// GPU family key (`h100`, ...).
    pub family: String,
    /// Memory per GPU, nominal GB.
    pub vram_gb: u16,
    /// The MIG profile (`1g.10gb`) when the offer lists slices of GPUs, not whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// What cancelling a reserved window before its start costs, as shares of its committed
    /// minimum (`1h:50%,10m:100%`); absent: free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_fees: Option<String>,
    /// Compute capability.
    pub compute_capability: ComputeCapability,
    /// GPUs in the offer.
    pub gpus: u16,
    /// GPUs free now.
    pub free: u16,
    /// Price per GPU-hour, micro-credits.
    pub price_per_gpu_hour: MicroCredits,
    /// Spot floor per GPU-hour.
    pub spot_floor_per_gpu_hour: Option<MicroCredits>,
    /// Region.
    pub region: String,
    /// Evidence tier.
    pub tier: EvidenceTier,
    /// This node's reliability score of the host, thousandths.
    pub reliability_permille: u16,
    /// When the offer was made.
    pub created_at: Timestamp,
    /// When it lapses.
    pub expires_at: Timestamp,
    /// Whether this node has reached the host.
    #[serde(default)]
    pub reach: Reachability,
    /// Of this node's spot leases with the host that ended, the share the host preempted,
    /// thousandths (recent ones weigh most); `None` before any ended.
    #[serde(default)]
    pub interruption_permille: Option<u16>,
    /// The machine, and what of it goes with each GPU (a lease gets its GPUs' shares).
    pub machine: gpux_protocol::Machine,
    /// The largest workspace the host gives a lease now, bytes (0: none).
    pub disk_bytes: u64,
    /// What the host pulls from registries, and the images it has cached.
    pub pulls: gpux_protocol::Pulls,
}

/// What a renter has learned about reaching a host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reachability {
    /// Not tried yet.
    #[default]
    Unknown,
    /// Reached (a probe connected, or it answered).
    Reachable,
    /// Could not be dialled, timed out, or refused without a reason: backed off for now.
    Unreachable,
    /// Blocked by hand (`gpux block`).
    Blocked,
}

impl Reachability {
    /// The word the CLI shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Reachable => "reachable",
            Self::Unreachable => "unreachable",
            Self::Blocked => "blocked",
        }
    }
}

/// `POST /v1/block`: block a host from this node's rents (or lift the block).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRequest {
    /// The host's peer id.
    pub host: String,
    /// True to block, false to lift the block.
    pub blocked: bool,
}

/// `POST /v1/block`'s answer: the hosts blocked now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    /// Peer ids, sorted.
    pub hosts: Vec<String>,
    /// Whether the request changed anything.
    pub changed: bool,
}

/// A command to run in a lease's container (`GET /v1/leases/{lease}/exec`, a WebSocket; the
/// request is base64url JSON in the `request` query parameter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The command and its arguments.
    pub command: Vec<String>,
    /// Extra environment (`NVIDIA_*` is refused).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A pseudo-terminal of this size (rows, columns).
    #[serde(default)]
    pub tty: Option<(u16, u16)>,
}

/// What `GET /v1/leases/{lease}/listen?local=PORT&port=REMOTE` (a WebSocket: `gpux
/// forward`) tells its client, one JSON text message each. The node itself listens on
/// `127.0.0.1:PORT` and carries each connection to `REMOTE` on the lease container's
/// loopback, for as long as the WebSocket stays open and the lease runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ForwardEvent {
    /// The node listens on `addr` (always the first message).
    Listening {
        /// `127.0.0.1:PORT`.
        addr: String,
    },
    /// A connection could not be carried: the host refused it or did not answer.
    Failed {
        /// Why.
        error: ApiError,
    },
    /// The lease ended: the node stopped listening (the last message).
    Ended,
}

/// `POST /v1/leases/{lease}/commit`: a held lease's work starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    /// The lease id.
    pub lease: String,
    /// When this node committed it, unix ms.
    pub committed_at_ms: u64,
}

/// Which side of a lease this node is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// This node runs the work.
    Host,
    /// This node pays for it.
    Renter,
}

/// One lease, in `GET /v1/leases` and with its receipts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// The lease id (hex).
    pub lease: String,
    /// This node's side.
    pub role: Role,
    /// Where the lease is (`awaiting-lock`, `running`, `ended`, `settled`, ...).
    pub phase: String,
    /// Why it ended (`duration-reached`, `renter-stopped`, ...), once it has.
    pub end: Option<String>,
    /// Renter: what the host said ended it.
    pub host_end: Option<String>,
    /// The host's peer id.
    pub host: String,
    /// The renter's peer id.
    pub renter: String,
    /// The GPUs (UUIDs).
    pub gpus: Vec<String>,
    /// Lease length, seconds.
    pub duration_s: u32,
    /// Price per GPU-hour, micro-credits.
    pub price_per_gpu_hour_micro: u64,
    /// What the workspace kept after the workload costs, a fixed sum owed from the first
    /// receipt on, micro-credits (0: no workspace, or kept free).
    #[serde(default)]
    pub retention_charge_micro: u64,
    /// The image (`sha256:...`).
    pub image: String,
    /// When the host accepted (host) or the renter sent its lock (renter), unix ms.
    pub since: u64,
    /// Host: the container's start and end (Docker's clock), unix ms.
    pub started_at: Option<u64>,
    /// See `started_at`.
    pub finished_at: Option<u64>,
    /// Host: when the lease ended (a lease the host ended is billed up to then), unix ms.
    #[serde(default)]
    pub ended_at: Option<u64>,
    /// The workload's exit code.
    pub exit_code: Option<i64>,
    /// The receipt timing of the lease (the host's, announced in its acceptance), ms.
    pub receipt_interval_ms: u64,
    /// See `receipt_interval_ms`.
    pub ack_grace_ms: u64,
    /// The last receipt seq signed (host) or seen (renter).
    pub last_seq: u64,
    /// The latest acknowledged receipt's seq and amount (micro-credits).
    pub acked_seq: u64,
    /// See `acked_seq`.
    pub acked_amount: u64,
    /// Host: what the ledger has paid so far.
    pub redeemed: u64,
    /// Whether the escrow is closed.
    pub settled: bool,
    /// Log bytes shipped (host) or received (renter).
    pub log_bytes: u64,
    /// `on-demand`, `spot` or `reserved`.
    #[serde(default)]
    pub kind: String,
    /// When the GPUs are booked from, unix ms: the acceptance, or later for a lease that
    /// preempts spot leases (the container starts no sooner).
    #[serde(default)]
    pub starts_at: u64,
    /// A spot lease's preemption: when its notice ends it, unix ms (the renter's once it
    /// checked the notice).
    #[serde(default)]
    pub preempted_until: Option<u64>,
    /// Renter: a preemption notice came that did not hold (refused).
    #[serde(default)]
    pub notice_refused: bool,
    /// A lease rented with `--resume`: its place in the chain of leases.
    #[serde(default)]
    pub resume: Option<ResumeView>,
    /// The SSH keys that may log in to it (`gpux ssh`; none: rented without `--ssh`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_keys: Vec<String>,
    /// The group order the lease belongs to (32 hex digits).
    #[serde(default)]
    pub group: Option<String>,
}

/// A resumable lease's place in its chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeView {
    /// `watching` (resumes if preempted), `resuming`, `resumed`, or `failed: WHY`.
    pub status: String,
    /// How many times the work moved before this lease.
    pub hop: u32,
    /// The lease this one resumed.
    pub resumed_from: Option<String>,
    /// The lease that resumed this one.
    pub resumed_by: Option<String>,
    /// The workspace moved into this lease before its work started (a resumed lease).
    #[serde(default)]
    pub moved: Option<MoveView>,
}

/// A workspace moved from a preempted lease into the one that resumed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveView {
    /// Files in what moved.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes fetched from the preempted workspace: only what changed since the last move.
    pub fetched: u64,
    /// Bytes sent into the new workspace.
    pub sent: u64,
    /// When the move was done, unix ms: the lease was committed then, and its clock runs
    /// from its start after it.
    pub done_at_ms: u64,
}

/// `GET /v1/leases/{lease}/logs?from=N`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsPage {
    /// The output from chunk `from` on.
    pub text: String,
    /// The chunk to ask from next.
    pub next: u64,
    /// Whether the lease is over (no more output will come).
    pub ended: bool,
}

/// One receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptView {
    /// Its seq.
    pub seq: u64,
    /// When the host signed it (unix ms).
    pub created_at: u64,
    /// Cumulative GPU-seconds.
    pub gpu_seconds: u64,
    /// Cumulative amount due, credits.
    pub amount_due: String,
    /// Same, micro-credits.
    pub amount_due_micro: u64,
    /// The part of it that pays for the workspace kept after the workload, micro-credits.
    #[serde(default)]
    pub workspace_charge_micro: u64,
    /// Peak container memory, bytes.
    pub memory_peak_bytes: u64,
    /// Mean GPU utilisation, ‰.
    pub gpu_util_permille: u16,
    /// Peak GPU memory, bytes.
    pub gpu_memory_peak_bytes: u64,
    /// Mean CPU use, millicores.
    pub cpu_millis_avg: u32,
    /// Whether the renter acknowledged it.
    pub acked: bool,
}

/// `GET /v1/leases/{lease}/receipts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipts {
    /// The receipts, by seq.
    pub receipts: Vec<ReceiptView>,
    /// The lease.
    pub lease: LeaseView,
}

/// `POST /v1/leases/{lease}/stop`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopping {
    /// The lease id.
    pub lease: String,
}

/// `POST /v1/shutdown`'s body (none: the defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownRequest {
    /// End every hosted lease (each settles, billed what ran) before stopping. Without it
    /// the node stops and leaves its leases' containers running: the node that starts next
    /// on the same data directory takes them up again.
    pub end_leases: bool,
}

/// `POST /v1/shutdown`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuttingDown {
    /// Always true.
    pub stopping: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip_and_hints_are_optional() {
        let e = ApiError::new(ErrorCode::Unavailable, "the ledger did not answer");
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(
            json,
            r#"{"code":"unavailable","message":"the ledger did not answer"}"#
        );
        let back: ApiError = serde_json::from_str(&json).unwrap();
        assert_eq!(back, e);
        assert_eq!(
            [
                ErrorCode::BadInput,
                ErrorCode::Unauthorized,
                ErrorCode::UnknownLease,
                ErrorCode::Conflict,
                ErrorCode::Unavailable,
                ErrorCode::Internal
            ]
            .map(ErrorCode::status),
            [400, 401, 404, 409, 503, 500]
        );
    }
}

/// `POST /v1/console/login`: a one-time link into the web console.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsoleLogin {
    /// Open it in a browser on this machine: it signs the browser in once and lapses.
    pub url: String,
    /// Seconds the link stays usable.
    pub expires_in_s: u64,
}

/// `GET /v1/settings`: this node's settings that the API changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// The most credits this node's open leases (as a renter) may commit at once, micro-
    /// credits; `None`: no cap.
    pub spend_cap_micro: Option<u64>,
    /// What its open leases commit now (their escrows), micro-credits.
    pub committed_micro: u64,
    /// A host's settings that change while it runs (none on a node that does not host).
    #[serde(default)]
    pub host: Option<HostLive>,
}

/// A host's settings that change while it runs (`gpux host set`, `pause`, `resume`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLive {
    /// Price per GPU-hour, credits (`3.60`).
    pub price: String,
    /// Spot floor per GPU-hour, credits (none: no spot leases).
    pub spot_floor: Option<String>,
    /// Region token.
    pub region: String,
    /// What cancelling a reserved window before its start costs (`24h:10%,1h:50%`;
    /// `none`: free).
    #[serde(default)]
    pub cancel_fees: String,
    /// Threads given to leases (none: every thread).
    #[serde(default)]
    pub cpus: Option<u32>,
    /// Memory given to leases, bytes (none: all but what the host keeps).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// Paused: no offers, no new leases; running leases go on.
    pub paused: bool,
    /// GPUs withheld after a fault (a fatal Xid) until `gpux host check` reads them well.
    #[serde(default)]
    pub failed_gpus: Vec<String>,
    /// Draining: only leases that end by then (unix ms) are offered and taken.
    #[serde(default)]
    pub drain_until: Option<u64>,
    /// When the last lease the host holds ends by its terms (unix ms; none: it holds none).
    #[serde(default)]
    pub free_at: Option<u64>,
}

/// `POST /v1/settings`: change one setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingChange {
    /// The setting's name (`spend-cap`).
    pub name: String,
    /// Its new value (`spend-cap`: credits, or `off`).
    pub value: String,
}

/// `POST /v1/market/follow`: follow more GPU families' offers (or every family), now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowRequest {
    /// Family keys to add (`h100`).
    #[serde(default)]
    pub add: Vec<String>,
    /// Follow every family.
    #[serde(default)]
    pub all: bool,
}

/// The families a node follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Following {
    /// Family keys, sorted; `None`: every family.
    pub families: Option<Vec<String>>,
}
