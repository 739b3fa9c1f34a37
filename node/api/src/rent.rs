//! Renting's API bodies: a rent and what it gives back (the lease, the image pulled or
//! staged, the workspace's retention, the challenge passed), its progress, group orders and
//! standing bids.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /v1/rent`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentRequest {
    /// Constraints (the query language).
    pub query: String,
    /// GPUs wanted (at least 1).
    pub gpus: u16,
    /// Most paid per GPU-hour, credits (`2.50`).
    pub max_price: String,
    /// Lease length, seconds (at least 1).
    pub duration_s: u32,
    /// Image to run: a digest (`sha256:...`) the host lists, or a reference (`name:tag`,
    /// an id) to an image in this node's Docker, staged on the host before the lease; the
    /// first image the host lists when absent.
    #[serde(default)]
    pub image: Option<String>,
    /// A `docker save` archive on this node's machine: its image is staged on the host
    /// before the lease and run.
    #[serde(default)]
    pub image_archive: Option<String>,
    /// Keep the staged image on the host for this renter's later leases, up to 24 h after
    /// this one (a signed lease term).
    #[serde(default)]
    pub cache_image: bool,
    /// The command to run (empty: the image's default).
    #[serde(default)]
    pub command: Vec<String>,
    /// Environment for the workload (`NVIDIA_*` is the host's to set).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Whether the container may use the network.
    #[serde(default)]
    pub network: bool,
    /// A `/workspace` of this many bytes (a signed lease term); none when absent.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
    /// How long the host keeps the workspace after the lease, seconds (a signed lease
    /// term; the host's default, 10 minutes, when absent; capped by the host).
    #[serde(default)]
    pub retain_s: Option<u64>,
    /// A spot lease: pays `max_price` (at least the offer's spot floor), per second with no
    /// minimum, and may be preempted after the notice period the host states.
    #[serde(default)]
    pub spot: bool,
    /// A reserved window, unix ms `[start, end)`: booked now, run from `start` to `end`
    /// (`duration_s` is ignored; the window sets it).
    #[serde(default)]
    pub window: Option<(u64, u64)>,
    /// Hold the GPUs this many seconds (at most 300) without starting the work: copy files
    /// into the workspace first, then commit (`POST /v1/leases/{lease}/commit`). A lease
    /// not committed in time ends unpaid (a signed lease term).
    #[serde(default)]
    pub hold_s: Option<u64>,
    /// A spot lease that resumes after a preemption: this node copies the workspace out
    /// (only what changed since the last move), rents the best fitting offer again (trying
    /// for up to `resume_timeout_s`), copies it into the new workspace, held, and starts the
    /// same workload once it is there.
    #[serde(default)]
    pub resume: bool,
    /// The directories under `/workspace` a resume moves (empty: the whole workspace).
    #[serde(default)]
    pub carry: Vec<String>,
    /// How long a resume looks for a new lease, seconds (600 when absent).
    #[serde(default)]
    pub resume_timeout_s: Option<u64>,
    /// A group order (`POST /v1/groups`): place the request's GPUs over as many hosts as
    /// it takes, one lease per host, and start them all or none.
    #[serde(default)]
    pub spread: bool,
    /// A group order that starts whatever members it could place (at least one).
    #[serde(default)]
    pub best_effort: bool,
    /// The group the lease belongs to (32 hex digits; a signed lease term). Set by this
    /// node for a group's members.
    #[serde(default)]
    pub group: Option<String>,
    /// A reserved window's committed minimum, seconds (a signed term, at most the window):
    /// paid at the least when the renter stops the window early.
    #[serde(default)]
    pub committed_s: Option<u64>,
    /// Challenge the leased GPUs before the work starts: a host that answers wrong, or
    /// slower than 90% of its model's reference rate, is refused (it is paid nothing) and
    /// the next offer is tried.
    #[serde(default)]
    pub challenge: bool,
    /// Challenge the lease's GPUs again while it runs, at random, about this often
    /// (seconds): each re-challenge costs at most 1% of the time it covers (a shorter
    /// interval is widened), and a host that fails one ends the lease.
    #[serde(default)]
    pub challenge_every_s: Option<u64>,
    /// CPU for the lease, thousandths of a core (at most its GPUs' share of the host;
    /// that share when absent).
    #[serde(default)]
    pub cpu_millis: Option<u32>,
    /// Memory for the lease, bytes (at most its GPUs' share; that share when absent).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// `/dev/shm` for the lease, bytes (at most its memory; half of it when absent).
    #[serde(default)]
    pub shm_bytes: Option<u64>,
    /// The registry's credentials for an image the host pulls (`image` names a private
    /// registry's image). They go to the chosen host only, for that pull; this node keeps
    /// them in memory, never on disk ([`RentRequest::without_secrets`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryCredentials>,
    /// SSH public keys (OpenSSH's one-line form) that may log in to the lease (`gpux ssh`,
    /// `ssh`, `scp`): a signed term; none, no SSH.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_keys: Vec<String>,
    /// A name the caller picks (16 to 64 letters and digits) to follow the rent's progress
    /// while it runs: `GET /v1/rent/progress/{name}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

impl RentRequest {
    /// The request without the registry's credentials: the form that may be kept on disk
    /// (a resumable lease's record, a group's).
    pub fn without_secrets(&self) -> RentRequest {
        RentRequest {
            registry_auth: None,
            ..self.clone()
        }
    }
}

/// A registry's user name and password (or token). Its `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryCredentials {
    /// The user name.
    pub username: String,
    /// The password or access token.
    pub password: String,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredentials")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// `GET /v1/rent/progress/{name}`: where a rent is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentProgress {
    /// `pulling` (the host pulls the image), `staging` (this node sends it), `requesting`
    /// (the lease is asked for and its container started), `done`.
    pub phase: String,
    /// The host it is with (peer id), once one is chosen.
    #[serde(default)]
    pub host: Option<String>,
    /// The image, as named.
    #[serde(default)]
    pub image: Option<String>,
    /// Bytes moved, of `total` announced so far.
    #[serde(default)]
    pub done: u64,
    /// Bytes announced so far (more layers may be announced).
    #[serde(default)]
    pub total: u64,
    /// Layers done, of `layers` announced.
    #[serde(default)]
    pub layers_done: u16,
    /// Layers announced.
    #[serde(default)]
    pub layers: u16,
}

/// A passed performance challenge, as the renter's node measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChallengePassed {
    /// The product's shape, `m x k x n` (`A` is `m × k`, `B` is `k × n`).
    pub shape: String,
    /// Rows of the product the node picked and checked.
    pub rows_checked: u32,
    /// What the node downloaded of the product: the picked rows and their Merkle paths.
    pub opened_bytes: u64,
    /// The node's own time checking them, ms.
    pub verify_ms: f64,
    /// The rate achieved, Gop/s, by this node's clock.
    pub achieved_gops: f64,
    /// The claimed model's reference rate, Gop/s.
    pub reference_gops: f64,
    /// The memory fill's size, bytes (0: none asked).
    #[serde(default)]
    pub fill_bytes: u64,
    /// The fill's bandwidth achieved, GB/s, by this node's clock.
    #[serde(default)]
    pub achieved_gbs: f64,
    /// The claimed model's reference bandwidth, GB/s (`None`: not judged).
    #[serde(default)]
    pub reference_gbs: Option<f64>,
    /// The round trip the size was chosen against, ms.
    pub round_trip_ms: f64,
}

/// `POST /v1/groups`: a group order placed (all its members run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupPlaced {
    /// The group id (32 hex digits).
    pub group: String,
    /// Its leases, one per host.
    pub leases: Vec<Rented>,
    /// GPUs in all.
    pub gpus: u32,
}

/// `POST /v1/groups/{group}/scale`: GPUs to add (positive) or remove (negative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupScale {
    /// GPUs to add or remove; removing stops whole leases, the latest first.
    pub delta: i32,
}

/// What a scale did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupScaled {
    /// The group id.
    pub group: String,
    /// Leases added (all started, or none).
    pub added: Vec<Rented>,
    /// Leases stopped.
    pub stopped: Vec<String>,
    /// The group's GPUs now.
    pub gpus: u32,
}

/// The answer to a rent: the lease runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rented {
    /// The lease id.
    pub lease: String,
    /// The host's peer id.
    pub host: String,
    /// The offer rented.
    pub offer: String,
    /// The GPUs (UUIDs).
    pub gpus: Vec<String>,
    /// Price per GPU-hour, credits.
    pub price_per_gpu_hour: String,
    /// Lease length, seconds.
    pub duration_s: u32,
    /// Amount locked in escrow, credits.
    pub escrow_amount: String,
    /// The image the lease runs (`sha256:...`).
    #[serde(default)]
    pub image: String,
    /// How the renter's own image was staged, when it was.
    #[serde(default)]
    pub staged: Option<StagedImage>,
    /// How the host pulled the image from its registry, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled: Option<PulledImage>,
    /// The workspace kept after the workload, when the lease has one.
    #[serde(default)]
    pub retention: Option<Retention>,
    /// When the lease's container starts, unix ms, when later than now: the host preempts
    /// spot leases on its GPUs first (their notice runs out).
    #[serde(default)]
    pub starts_at_ms: Option<u64>,
    /// For a held lease (`hold_s`): the work waits for the renter's commit until then, unix
    /// ms; not committed by then, the lease ends unpaid.
    #[serde(default)]
    pub commit_by_ms: Option<u64>,
    /// The performance challenge it passed before its work started (`challenge`).
    #[serde(default)]
    pub challenge: Option<ChallengePassed>,
    /// How often, on average, it is challenged again while it runs (seconds;
    /// `challenge_every_s`, widened to the 1% rule), when a reference rate is known for its
    /// model.
    #[serde(default)]
    pub challenge_every_s: Option<u64>,
}

/// A lease's workspace, kept after its workload for the renter to fetch results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// How long it is kept after the workload ends, seconds (a signed lease term).
    pub retain_s: u64,
    /// Its price, credits per GiB-hour (a signed lease term; "0" when free).
    pub price_per_gib_hour: String,
    /// What the retention costs, credits: owed in full from the first receipt.
    pub charge: String,
}

/// An image the host pulled from its registry before the lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PulledImage {
    /// The reference, in Docker's short form (`ubuntu:24.04`, `127.0.0.1:5000/team/train:1`).
    pub reference: String,
    /// Its size on the host, bytes.
    pub bytes: u64,
    /// Every layer was on the host already (it had the image cached).
    pub warm: bool,
    /// From asking the host to its "done", ms.
    pub pull_ms: u64,
}

/// A renter's image staged on the host before its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedImage {
    /// The image's layers.
    pub layers: usize,
    /// The image's config and layers, bytes.
    pub image_bytes: u64,
    /// Layers sent (the host had the others, with their chains).
    pub layers_sent: usize,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Time this node took to get the archive ready (saved from Docker, indexed and
    /// hashed), ms.
    #[serde(default)]
    pub prepare_ms: u64,
    /// Time from opening the stage stream to the host's "loaded", ms.
    #[serde(default)]
    pub stage_ms: u64,
}

/// `POST /v1/bid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BidRequest {
    /// Constraints (query language).
    pub query: String,
    /// GPUs wanted (at least 1).
    pub gpus: u16,
    /// Most paid per GPU-hour, credits.
    pub max_price: String,
    /// Lease length, seconds (at least 1).
    pub duration_s: u32,
    /// How long the bid stands, seconds (at most an hour).
    pub ttl_s: u64,
    /// What the bid runs when it is filled: everything `POST /v1/rent` takes (image,
    /// command, environment, workspace, network, SSH keys, spot and resume...). Its query,
    /// GPUs, price and duration are the bid's. Absent: the host's first image, its default
    /// command. Kept on this node only (the gossiped bid carries none of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rent: Option<RentRequest>,
}

/// `GET /v1/bids`: one of this node's bids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BidView {
    /// The bid's id.
    pub bid: String,
    /// Its query.
    pub query: String,
    /// GPUs wanted.
    pub gpus: u16,
    /// Most paid per GPU-hour, credits.
    pub max_price: String,
    /// Lease length, seconds.
    pub duration_s: u32,
    /// `on-demand`, `spot` or `reserved`.
    pub kind: String,
    /// The image the fill runs, as named (absent: the host's first).
    #[serde(default)]
    pub image: Option<String>,
    /// When it lapses, unix ms.
    pub expires_at: u64,
    /// `standing`, `filling` (a rent for it is under way), `filled`, `cancelled` or
    /// `expired`.
    pub state: String,
    /// The lease that filled it.
    #[serde(default)]
    pub lease: Option<String>,
    /// Why its last fill did not happen (the spend cap, no host accepted, ...): it stands
    /// again meanwhile.
    #[serde(default)]
    pub refused: Option<String>,
}

/// The answer to a bid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BidPlaced {
    /// The bid's id.
    pub bid: String,
    /// When it lapses (unix ms).
    pub expires_at: u64,
}
