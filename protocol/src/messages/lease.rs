//! Lease negotiation on `/gpux/lease/1`: `LeaseRequest`, `LeaseAccept`, `LeaseReject`,
//! `LeaseEnd` and `PreemptionNotice`.

use std::fmt;

use crate::codec::{BoundedBytes, BoundedString, BoundedVec, Ext};
use crate::envelope::Message;
use crate::key::PublicKey;
use crate::messages::{
    InvalidMessage, MAX_OFFER_GPUS, MessageKind, ensure_after, ensure_at_most, ensure_nonempty,
    ensure_nonzero, ensure_sane_terms, ensure_unique,
};
use crate::money::{MIN_BILLED_SECONDS, MicroCredits, cost, storage_cost};
use crate::types::{ContentId, EscrowId, GpuUuid, ImageDigest, Timestamp};

/// The most arguments a lease's command may have.
pub const MAX_LEASE_ARGS: usize = 64;
/// The most environment variables a lease may set.
pub const MAX_LEASE_ENV: usize = 64;

/// What kind of capacity a bid or lease is for.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseKind {
    /// Runs until its duration ends or the renter stops it; never preempted.
    OnDemand,
    /// Interruptible: may be preempted, after a notice, by a higher spot bid or an on-demand
    /// lease. Priced at or above the host's spot floor.
    Spot,
    /// A future window `[start, end)`; overlapping windows on one GPU never both match.
    Reserved {
        /// Window start.
        start: Timestamp,
        /// Window end.
        end: Timestamp,
    },
}

impl LeaseKind {
    /// A reserved window must be ordered and last exactly `duration_s`.
    pub(crate) fn check(&self, duration_s: u32) -> Result<(), InvalidMessage> {
        if let LeaseKind::Reserved { start, end } = *self {
            ensure_after("kind.start", start, "kind.end", end)?;
            if end.ms_since(start) != u64::from(duration_s) * 1000 {
                return Err(InvalidMessage::Inconsistent {
                    field: "duration_s",
                    reason: "a reserved window must last exactly duration_s",
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for LeaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OnDemand => f.write_str("on-demand"),
            Self::Spot => f.write_str("spot"),
            Self::Reserved { start, end } => write!(f, "reserved[{start}..{end})"),
        }
    }
}

/// Resource limits the host enforces on the container.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct ResourceLimits {
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// CPU limit in thousandths of a core.
    pub cpu_millis: u32,
    /// Most processes.
    pub pids: u32,
    /// Size of each writable tmpfs (`/scratch`, `/tmp`), bytes.
    pub scratch_bytes: u64,
    /// Size of `/dev/shm`, bytes (PyTorch's data loaders pass batches through it).
    pub shm_bytes: u64,
}

/// The most processes (and threads) a lease may ask for.
pub const MAX_LEASE_PIDS: u32 = 1 << 20;

impl ResourceLimits {
    /// The limits a lease gets by default from `cpu_millis` and `memory_bytes`: half the
    /// memory for `/dev/shm` and a quarter for each scratch tmpfs (all of them count against
    /// the memory limit, so together they can never take more than it), and 1,024 processes
    /// per core (data loaders and compilers start many), at least 1,024.
    pub fn sized(cpu_millis: u32, memory_bytes: u64) -> ResourceLimits {
        let pids = (u64::from(cpu_millis.div_ceil(1000)) * 1024).clamp(1024, MAX_LEASE_PIDS.into());
        ResourceLimits {
            memory_bytes,
            cpu_millis,
            pids: pids as u32,
            scratch_bytes: memory_bytes / 4,
            shm_bytes: memory_bytes / 2,
        }
    }

    /// The structural rules: something of each, tmpfs sizes within the memory limit, and a
    /// bounded process count.
    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonzero("limits.memory_bytes", self.memory_bytes)?;
        ensure_nonzero("limits.cpu_millis", self.cpu_millis.into())?;
        ensure_nonzero("limits.pids", self.pids.into())?;
        ensure_at_most("limits.pids", self.pids.into(), MAX_LEASE_PIDS.into())?;
        ensure_at_most("limits.shm_bytes", self.shm_bytes, self.memory_bytes)?;
        ensure_at_most(
            "limits.scratch_bytes",
            self.scratch_bytes,
            self.memory_bytes,
        )?;
        Ok(())
    }
}

/// One environment variable for the workload.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct EnvVar {
    /// Name: `[A-Za-z_][A-Za-z0-9_]*`, never `NVIDIA_*` (the host sets those).
    pub name: BoundedString<128>,
    /// Value.
    pub value: BoundedString<4096>,
}

/// The renter's exact terms for a lease. Its envelope id is the lease id.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LeaseRequest {
    /// When the request was made.
    pub created_at: Timestamp,
    /// The host must answer before this.
    pub expires_at: Timestamp,
    /// The offer matched.
    pub offer: ContentId,
    /// The host (signer of the offer).
    pub host: PublicKey,
    /// The GPUs wanted, from the offer.
    pub gpus: BoundedVec<GpuUuid, MAX_OFFER_GPUS>,
    /// Agreed price per GPU-hour.
    pub price_per_gpu_hour: MicroCredits,
    /// Lease length, seconds.
    pub duration_s: u32,
    /// On-demand, spot or reserved.
    pub kind: LeaseKind,
    /// The image to run, by digest (one the offer lists).
    pub image: ImageDigest,
    /// Command and arguments; empty runs the image's default.
    pub command: BoundedVec<BoundedString<1024>, MAX_LEASE_ARGS>,
    /// Environment for the workload.
    pub env: BoundedVec<EnvVar, MAX_LEASE_ENV>,
    /// Resource limits.
    pub limits: ResourceLimits,
    /// Whether the container may use the network.
    pub network: bool,
    /// The escrow that pays for the lease.
    pub escrow: EscrowId,
    /// How much the escrow holds: at least one minute of the lease.
    pub escrow_amount: MicroCredits,
    /// The standing bid this request answers, if any.
    pub bid: Option<ContentId>,
    /// The renter's SSH public keys, OpenSSH's one-line form (`ssh-ed25519 AAAA... me@laptop`):
    /// the keys that may log in to the lease over `/gpux/ssh/1` (none: no SSH).
    pub ssh_keys: BoundedVec<BoundedString<MAX_SSH_KEY_BYTES>, MAX_SSH_KEYS>,
    /// The lease's terms beyond its GPUs, price and time: its workspace and what keeping it
    /// costs, its commit wait, its group, a reserved window's committed minimum and
    /// cancellation fees.
    pub terms: LeaseTerms,
    /// Extension fields: optional extras only.
    pub ext: Ext,
}

/// A lease's terms beyond its GPUs, price and time (`LeaseRequest` version 5; version 4
/// carried them in ext keys 1 to 8). The default is a lease with none of them.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LeaseTerms {
    /// The lease's `/workspace` size, bytes (none: no workspace).
    pub workspace_bytes: Option<u64>,
    /// How long the host keeps the workspace after the workload ends, seconds (none: the
    /// host's default, [`DEFAULT_RETAIN_S`]).
    pub retain_s: Option<u64>,
    /// The host keeps the renter's staged image for the same renter's later leases, up to
    /// 24 h after this one ends, instead of erasing it.
    pub cache_image: bool,
    /// What the renter pays for the workspace's retention, per GiB-hour (at least the
    /// offer's price; zero: free).
    pub workspace_price: MicroCredits,
    /// The work starts only on the renter's signed [`LeaseCommit`], which must come within
    /// this many ms of the booking's start (at most [`MAX_COMMIT_WAIT_MS`]); the GPUs are
    /// booked for the wait and the duration, and a lease not committed in time ends unpaid
    /// (none: the work starts once the escrow is locked).
    pub commit_wait_ms: Option<u64>,
    /// The group order the lease belongs to: the leases of one group share it (the host
    /// only shows it).
    pub group: Option<[u8; 16]>,
    /// A reserved window's committed minimum, seconds of each GPU (at most the window; 0:
    /// none): what the renter pays, at the least, when it stops the window early.
    pub committed_s: u64,
    /// A reserved window's cancellation fees, copied from the offer: a renter that stops
    /// the window before its start pays that share of the committed minimum (only with a
    /// committed minimum; empty: cancelling is free).
    pub cancel_fees: crate::CancelFees,
}

/// The most SSH keys a lease names.
pub const MAX_SSH_KEYS: usize = 4;
/// The longest SSH public key line, bytes (a 4096-bit RSA key with a comment fits).
pub const MAX_SSH_KEY_BYTES: usize = 2048;
/// The key types a lease's SSH keys may have (OpenSSH's names).
pub const SSH_KEY_TYPES: [&str; 7] = [
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// Whether `line` has the form of an OpenSSH public key: a known type, base64 key data
/// and an optional comment, printable ASCII. (The host parses it fully before it trusts
/// it.)
pub fn is_ssh_public_key(line: &str) -> bool {
    let mut words = line.split(' ');
    let (Some(kind), Some(data)) = (words.next(), words.next()) else {
        return false;
    };
    SSH_KEY_TYPES.contains(&kind)
        && !data.is_empty()
        && data
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        && line.bytes().all(|b| (b' '..=b'~').contains(&b))
}

/// `LeaseReject` ext key: GPUs of the same offer's slot, as many as the request asked for,
/// that are free for its window (each a kind byte, 0 GPU or 1 MIG, and its 16 bytes; see
/// [`encode_gpus`]): a host refusing GPUs that are taken names these so that the renter asks
/// again for them rather than going to another host. An offer lists at most
/// [`MAX_OFFER_GPUS`], so the value stays within an ext value's limit.
pub const EXT_REJECT_FREE_GPUS: u16 = 1;

/// GPUs as [`EXT_REJECT_FREE_GPUS`] carries them.
pub fn encode_gpus(gpus: &[GpuUuid]) -> Vec<u8> {
    let mut out = Vec::with_capacity(gpus.len() * 17);
    for g in gpus {
        out.push(u8::from(g.is_mig()));
        out.extend_from_slice(g.bytes());
    }
    out
}

/// GPUs read back from [`encode_gpus`]'s bytes; `None` when they are not such (a length not
/// a multiple of 17, a kind byte other than 0 or 1, more than [`MAX_OFFER_GPUS`]).
pub fn decode_gpus(bytes: &[u8]) -> Option<Vec<GpuUuid>> {
    if !bytes.len().is_multiple_of(17) || bytes.len() / 17 > MAX_OFFER_GPUS {
        return None;
    }
    bytes
        .chunks_exact(17)
        .map(|c| {
            let uuid: [u8; 16] = c[1..].try_into().ok()?;
            match c[0] {
                0 => Some(GpuUuid::Gpu(uuid)),
                1 => Some(GpuUuid::Mig(uuid)),
                _ => None,
            }
        })
        .collect()
}

/// The free GPUs a refusal names ([`EXT_REJECT_FREE_GPUS`]), if it names any that read.
pub fn reject_free_gpus(reject: &LeaseReject) -> Option<Vec<GpuUuid>> {
    decode_gpus(reject.ext.get(EXT_REJECT_FREE_GPUS)?).filter(|g| !g.is_empty())
}

/// The longest a lease may wait for its commit, ms (its GPUs are held, unpaid, meanwhile).
pub const MAX_COMMIT_WAIT_MS: u64 = 300_000;
/// How long a workspace outlives its workload when the request does not say, seconds.
pub const DEFAULT_RETAIN_S: u64 = 600;

impl LeaseRequest {
    /// The workspace size the renter asked for, bytes (`None`: no workspace).
    pub fn workspace_bytes(&self) -> Result<Option<u64>, InvalidMessage> {
        Ok(self.terms.workspace_bytes)
    }

    /// How long the workspace outlives the workload, seconds (`None`: the host's default).
    pub fn retain_s(&self) -> Result<Option<u64>, InvalidMessage> {
        Ok(self.terms.retain_s)
    }

    /// The agreed price of the workspace's retention per GiB-hour (zero: free).
    pub fn workspace_price(&self) -> Result<MicroCredits, InvalidMessage> {
        Ok(self.terms.workspace_price)
    }

    /// How long the host keeps the workspace after the workload ends, seconds: the term, or
    /// [`DEFAULT_RETAIN_S`] without one; 0 for a lease without a workspace.
    pub fn retention_s(&self) -> Result<u64, InvalidMessage> {
        if self.terms.workspace_bytes.is_none() {
            return Ok(0);
        }
        Ok(self.terms.retain_s.unwrap_or(DEFAULT_RETAIN_S))
    }

    /// What the retention costs: the workspace's size for [`Self::retention_s`] at
    /// [`Self::workspace_price`], a fixed sum the renter owes from the first receipt on (the
    /// host sets the disk aside from the acceptance, like the 60-second minimum).
    pub fn retention_charge(&self) -> Result<MicroCredits, InvalidMessage> {
        let Some(bytes) = self.terms.workspace_bytes else {
            return Ok(MicroCredits::ZERO);
        };
        Ok(storage_cost(
            bytes,
            self.retention_s()?,
            self.terms.workspace_price,
        )?)
    }

    /// How long the lease waits for the renter's [`LeaseCommit`] before its work starts, ms
    /// (`None`: it starts once the escrow is locked).
    pub fn commit_wait_ms(&self) -> Result<Option<u64>, InvalidMessage> {
        Ok(self.terms.commit_wait_ms)
    }

    /// A reserved window's committed minimum, seconds of each GPU (0: none).
    pub fn committed_s(&self) -> Result<u64, InvalidMessage> {
        Ok(self.terms.committed_s)
    }

    /// The reserved window's cancellation fee schedule (empty: cancelling is free).
    pub fn cancel_fees(&self) -> Result<crate::CancelFees, InvalidMessage> {
        Ok(self.terms.cancel_fees.clone())
    }

    /// The group order the lease belongs to (`None`: none).
    pub fn group(&self) -> Result<Option<[u8; 16]>, InvalidMessage> {
        Ok(self.terms.group)
    }

    /// Whether the renter asked the host to keep its staged image after the lease.
    pub fn cache_image(&self) -> Result<bool, InvalidMessage> {
        Ok(self.terms.cache_image)
    }
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl Message for LeaseRequest {
    const KIND: MessageKind = MessageKind::LeaseRequest;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_after("created_at", self.created_at, "expires_at", self.expires_at)?;
        ensure_nonempty("gpus", &self.gpus)?;
        ensure_unique("gpus", self.gpus.iter().copied())?;
        ensure_nonzero("price_per_gpu_hour", self.price_per_gpu_hour.0)?;
        ensure_nonzero("duration_s", self.duration_s.into())?;
        ensure_sane_terms(
            "price_per_gpu_hour",
            self.price_per_gpu_hour,
            self.duration_s,
            self.gpus.len() as u64,
        )?;
        self.kind.check(self.duration_s)?;
        self.limits.check()?;
        if !self.ssh_keys.iter().all(|k| is_ssh_public_key(k)) {
            return Err(InvalidMessage::Malformed {
                field: "ssh_keys",
                reason: "an OpenSSH public key: TYPE BASE64 [COMMENT]",
            });
        }
        ensure_unique("env", self.env.iter().map(|v| v.name.as_str()))?;
        for var in self.env.iter() {
            if !is_env_name(&var.name) {
                return Err(InvalidMessage::Malformed {
                    field: "env.name",
                    reason: "expected [A-Za-z_][A-Za-z0-9_]*",
                });
            }
            if var.name.to_ascii_uppercase().starts_with("NVIDIA_") {
                return Err(InvalidMessage::Malformed {
                    field: "env.name",
                    reason: "NVIDIA_* variables are set by the host, not the renter",
                });
            }
        }
        let committed = self.terms.committed_s;
        if committed > 0 {
            if !matches!(self.kind, LeaseKind::Reserved { .. }) {
                return Err(InvalidMessage::Inconsistent {
                    field: "terms.committed_s",
                    reason: "only a reserved window has a committed minimum",
                });
            }
            ensure_at_most("committed minimum", committed, self.duration_s.into())?;
        }
        if !self.terms.cancel_fees.tiers().is_empty() && committed == 0 {
            return Err(InvalidMessage::Inconsistent {
                field: "terms.cancel_fees",
                reason: "a cancellation fee is a share of a reserved window's committed minimum",
            });
        }
        if let Some(wait) = self.terms.commit_wait_ms {
            ensure_nonzero("commit wait", wait)?;
            if wait > MAX_COMMIT_WAIT_MS {
                return Err(InvalidMessage::AboveLimit {
                    field: "commit wait",
                    value: wait,
                    max: MAX_COMMIT_WAIT_MS,
                });
            }
        }
        let gpu_seconds = (self.gpus.len() as u64) * MIN_BILLED_SECONDS.max(committed);
        let minimum =
            cost(gpu_seconds, self.price_per_gpu_hour)?.checked_add(self.retention_charge()?)?;
        if self.escrow_amount < minimum {
            return Err(InvalidMessage::BelowMinimum {
                field: "escrow_amount",
                value: self.escrow_amount.0,
                min: minimum.0,
            });
        }
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }

    fn expires_at(&self) -> Option<Timestamp> {
        Some(self.expires_at)
    }

    fn decode_older(version: u8, body: &[u8]) -> Result<Self, crate::codec::BodyError> {
        super::older::lease::decode_request(version, body)
    }
}

/// The host accepts: it signs the blake3 hash of the exact `LeaseRequest` envelope. Both
/// signatures over one set of terms make the lease.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LeaseAccept {
    /// Id of the `LeaseRequest` accepted (the lease id).
    pub request: ContentId,
    /// When.
    pub created_at: Timestamp,
    /// How often the host signs a cumulative receipt, ms (a renter holds it to between a
    /// second and an hour).
    pub receipt_interval_ms: u64,
    /// How long past an interval the host waits for an acknowledgement before it stops the
    /// work, ms (likewise held to between a second and an hour).
    pub ack_grace_ms: u64,
    /// A spot lease's notice period, ms: a preemption ends it no sooner than this after its
    /// notice.
    pub spot_notice_ms: u64,
    /// When the lease's GPUs are booked from, when later than the acceptance (the spot
    /// leases it preempts run out their notice first, or a reserved window starts later).
    pub starts_at: Option<Timestamp>,
    /// Extension fields: optional extras only.
    pub ext: Ext,
}

impl Message for LeaseAccept {
    const KIND: MessageKind = MessageKind::LeaseAccept;

    fn check(&self) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }

    fn decode_older(version: u8, body: &[u8]) -> Result<Self, crate::codec::BodyError> {
        super::older::lease::decode_accept(version, body)
    }
}

/// Why a host refused a lease request.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RejectReason {
    /// One of the GPUs is leased or reserved for an overlapping window.
    GpusUnavailable,
    /// The host does not know the offer, or it was replaced.
    OfferUnknown,
    /// The offer has expired.
    OfferExpired,
    /// The price is below the offer's (or the spot floor).
    PriceTooLow,
    /// The duration is outside the offer's bounds.
    DurationOutOfRange,
    /// The image is not on the host.
    ImageMissing,
    /// The resource limits exceed what the host allows.
    LimitsTooHigh,
    /// The lease asks for network access the host does not give.
    NetworkNotAllowed,
    /// The escrow is missing or too small.
    EscrowInsufficient,
    /// The request arrived after its `expires_at`.
    RequestExpired,
    /// The request breaks a rule (see the detail).
    Invalid,
}

/// The host refuses a lease request.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LeaseReject {
    /// Id of the `LeaseRequest` refused.
    pub request: ContentId,
    /// When.
    pub created_at: Timestamp,
    /// Why.
    pub reason: RejectReason,
    /// A human-readable detail.
    pub detail: BoundedString<256>,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for LeaseReject {
    const KIND: MessageKind = MessageKind::LeaseReject;

    fn check(&self) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// Why a lease ended.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum EndReason {
    /// The renter stopped it.
    RenterStopped,
    /// Its duration was reached.
    DurationReached,
    /// The renter did not acknowledge a receipt within the grace period.
    ReceiptNotAcknowledged,
    /// The renter disputed a receipt.
    ReceiptDisputed,
    /// The escrow could not pay for more time.
    EscrowExhausted,
    /// A spot lease was preempted after its notice.
    Preempted,
    /// The host shut down.
    HostShutdown,
    /// The workload exited by itself.
    ContainerExited,
    /// The container could not start or failed.
    ContainerFailed,
    /// A lease waiting for the renter's commit was not committed in time: nothing ran.
    NotCommitted,
    /// The renter's performance challenge of the leased GPUs failed (a wrong product, or
    /// slower than the claimed model allows): the lease ends before its work.
    ChallengeFailed,
    /// The sender could not store a record of the lease (a receipt, an acknowledgement):
    /// it ends the lease rather than go on with what it cannot keep.
    StoreFailed,
    /// A leased GPU failed on the host (an Xid error such as 79, uncorrectable memory
    /// errors, or the GPU vanished from the driver): billed up to the fault.
    GpuFailed,
}

/// Either side ends a lease.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LeaseEnd {
    /// The lease id.
    pub lease: ContentId,
    /// When it ended.
    pub created_at: Timestamp,
    /// Why.
    pub reason: EndReason,
    /// The workload's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for LeaseEnd {
    const KIND: MessageKind = MessageKind::LeaseEnd;

    fn check(&self) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// The renter's go-ahead for a lease whose request asks for one
/// ([`LeaseTerms::commit_wait_ms`]): the escrow is locked and the GPUs held, and the work starts now.
/// Until it comes the host runs nothing and serves only the lease's workspace (so files go
/// in before the GPU clock runs); a group's renter commits every member once all hold.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LeaseCommit {
    /// The lease id.
    pub lease: ContentId,
    /// When the renter committed.
    pub created_at: Timestamp,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for LeaseCommit {
    const KIND: MessageKind = MessageKind::LeaseCommit;

    fn check(&self) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}

/// The largest preempting request a [`PreemptionNotice`] carries: a whole signed
/// `LeaseRequest` (whose own limit is 32 KiB).
pub const MAX_PREEMPTOR_BYTES: usize = 32 * 1024;

/// The host will preempt a spot lease at `ends_at` (the notice period), for the signed
/// request that needs its GPUs.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct PreemptionNotice {
    /// The lease id.
    pub lease: ContentId,
    /// When the notice was given.
    pub created_at: Timestamp,
    /// When the lease will end.
    pub ends_at: Timestamp,
    /// The signed `LeaseRequest` that preempts the lease, as the host received it: the
    /// renter checks it names this host and some of the lease's GPUs, and outbids it.
    pub preemptor: BoundedBytes<MAX_PREEMPTOR_BYTES>,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for PreemptionNotice {
    const KIND: MessageKind = MessageKind::PreemptionNotice;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_after("created_at", self.created_at, "ends_at", self.ends_at)?;
        ensure_nonempty("preemptor", &self.preemptor[..])
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}
