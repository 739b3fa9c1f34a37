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

/// Version 4 of [`LeaseRequest`], still read (the lease records hold the request as
/// signed): its terms were ext keys 1 to 8.
#[derive(bincode::Encode, bincode::Decode)]
struct LeaseRequestV4 {
    created_at: Timestamp,
    expires_at: Timestamp,
    offer: ContentId,
    host: PublicKey,
    gpus: BoundedVec<GpuUuid, MAX_OFFER_GPUS>,
    price_per_gpu_hour: MicroCredits,
    duration_s: u32,
    kind: LeaseKind,
    image: ImageDigest,
    command: BoundedVec<BoundedString<1024>, MAX_LEASE_ARGS>,
    env: BoundedVec<EnvVar, MAX_LEASE_ENV>,
    limits: ResourceLimits,
    network: bool,
    escrow: EscrowId,
    escrow_amount: MicroCredits,
    bid: Option<ContentId>,
    ssh_keys: BoundedVec<BoundedString<MAX_SSH_KEY_BYTES>, MAX_SSH_KEYS>,
    ext: Ext,
}

/// Version 4's ext keys of the terms, in [`LeaseTerms`]' order of meaning: the workspace
/// size (u64 LE), the retention (u64 LE s), the cached image (the one byte 1), the
/// retention's price (u64 LE), the commit wait (u64 LE ms), the group (16 bytes), the
/// committed minimum (u64 LE s), the cancellation fees (their bytes).
mod v4 {
    pub(super) const WORKSPACE_BYTES: u16 = 1;
    pub(super) const RETAIN_S: u16 = 2;
    pub(super) const CACHE_IMAGE: u16 = 3;
    pub(super) const WORKSPACE_PRICE: u16 = 4;
    pub(super) const COMMIT_WAIT_MS: u16 = 5;
    pub(super) const GROUP: u16 = 6;
    pub(super) const COMMITTED_S: u16 = 7;
    pub(super) const CANCEL_FEES: u16 = 8;
}

fn v4_term(why: &'static str) -> crate::codec::BodyError {
    crate::codec::BodyError::Decode(bincode::error::DecodeError::Other(why))
}

impl TryFrom<LeaseRequestV4> for LeaseRequest {
    type Error = crate::codec::BodyError;

    fn try_from(v4: LeaseRequestV4) -> Result<Self, Self::Error> {
        let mut ext = v4.ext;
        let mut u64_of = |key: u16| -> Result<Option<u64>, Self::Error> {
            ext.remove(key)
                .map(|v| {
                    <[u8; 8]>::try_from(v)
                        .map(u64::from_le_bytes)
                        .map_err(|_| v4_term("a version 4 lease term is 8 bytes, little-endian"))
                })
                .transpose()
        };
        let workspace_bytes = u64_of(v4::WORKSPACE_BYTES)?;
        let retain_s = u64_of(v4::RETAIN_S)?;
        let workspace_price = MicroCredits(u64_of(v4::WORKSPACE_PRICE)?.unwrap_or(0));
        let commit_wait_ms = u64_of(v4::COMMIT_WAIT_MS)?;
        let committed_s = u64_of(v4::COMMITTED_S)?.unwrap_or(0);
        let cache_image = match ext.remove(v4::CACHE_IMAGE).as_deref() {
            None => false,
            Some([1]) => true,
            Some(_) => return Err(v4_term("the cache-image term is the one byte 1")),
        };
        let group = ext
            .remove(v4::GROUP)
            .map(|v| <[u8; 16]>::try_from(v).map_err(|_| v4_term("a group id is 16 bytes")))
            .transpose()?;
        let cancel_fees = ext
            .remove(v4::CANCEL_FEES)
            .map(|v| {
                crate::CancelFees::from_bytes(&v)
                    .map_err(|_| v4_term("a cancellation fee schedule that breaks its rules"))
            })
            .transpose()?
            .unwrap_or_default();
        Ok(Self {
            created_at: v4.created_at,
            expires_at: v4.expires_at,
            offer: v4.offer,
            host: v4.host,
            gpus: v4.gpus,
            price_per_gpu_hour: v4.price_per_gpu_hour,
            duration_s: v4.duration_s,
            kind: v4.kind,
            image: v4.image,
            command: v4.command,
            env: v4.env,
            limits: v4.limits,
            network: v4.network,
            escrow: v4.escrow,
            escrow_amount: v4.escrow_amount,
            bid: v4.bid,
            ssh_keys: v4.ssh_keys,
            terms: LeaseTerms {
                workspace_bytes,
                retain_s,
                cache_image,
                workspace_price,
                commit_wait_ms,
                group,
                committed_s,
                cancel_fees,
            },
            ext,
        })
    }
}

/// `request`'s body as version 4 encoded it (for [`crate::older`]).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn lease_request_v4_body(request: &LeaseRequest) -> Vec<u8> {
    let t = &request.terms;
    let mut ext = request.ext.clone();
    let u64s = [
        (v4::WORKSPACE_BYTES, t.workspace_bytes),
        (v4::RETAIN_S, t.retain_s),
        (
            v4::WORKSPACE_PRICE,
            Some(t.workspace_price.0).filter(|p| *p > 0),
        ),
        (v4::COMMIT_WAIT_MS, t.commit_wait_ms),
        (v4::COMMITTED_S, Some(t.committed_s).filter(|c| *c > 0)),
    ];
    // At most eight short values: a test's request is within the ext map's limits.
    for (key, value) in u64s {
        if let Some(value) = value {
            let _ = ext.insert(key, value.to_le_bytes().to_vec());
        }
    }
    if t.cache_image {
        let _ = ext.insert(v4::CACHE_IMAGE, vec![1]);
    }
    if let Some(group) = t.group {
        let _ = ext.insert(v4::GROUP, group.to_vec());
    }
    if !t.cancel_fees.tiers().is_empty() {
        let _ = ext.insert(v4::CANCEL_FEES, t.cancel_fees.to_bytes());
    }
    let r = request.clone();
    let v4 = LeaseRequestV4 {
        created_at: r.created_at,
        expires_at: r.expires_at,
        offer: r.offer,
        host: r.host,
        gpus: r.gpus,
        price_per_gpu_hour: r.price_per_gpu_hour,
        duration_s: r.duration_s,
        kind: r.kind,
        image: r.image,
        command: r.command,
        env: r.env,
        limits: r.limits,
        network: r.network,
        escrow: r.escrow,
        escrow_amount: r.escrow_amount,
        bid: r.bid,
        ssh_keys: r.ssh_keys,
        ext,
    };
    // Plain data: encoding cannot fail.
    crate::codec::encode(&v4).unwrap_or_default()
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
        match version {
            4 => crate::codec::decode_exact::<LeaseRequestV4>(body)?.try_into(),
            _ => Err(v4_term("no such version of LeaseRequest")),
        }
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

/// Version 1 of [`LeaseAccept`], still read (the lease records hold the acceptance as
/// signed): its terms were ext keys 1 to 4, each u64 LE.
#[derive(bincode::Encode, bincode::Decode)]
struct LeaseAcceptV1 {
    request: ContentId,
    created_at: Timestamp,
    ext: Ext,
}

/// Version 1's ext keys: the receipt interval, the ack grace, the spot notice (ms) and the
/// booking's start (unix ms).
const V1_RECEIPT_INTERVAL_MS: u16 = 1;
const V1_ACK_GRACE_MS: u16 = 2;
const V1_SPOT_NOTICE_MS: u16 = 3;
const V1_STARTS_AT: u16 = 4;
/// What version 1 meant by a term it left out: a receipt a minute, 30 s of grace, 30 s of
/// notice.
const V1_DEFAULTS: [u64; 3] = [60_000, 30_000, 30_000];

impl TryFrom<LeaseAcceptV1> for LeaseAccept {
    type Error = crate::codec::BodyError;

    fn try_from(v1: LeaseAcceptV1) -> Result<Self, Self::Error> {
        let mut ext = v1.ext;
        let mut take = |key: u16| -> Result<Option<u64>, Self::Error> {
            ext.remove(key)
                .map(|v| {
                    <[u8; 8]>::try_from(v).map(u64::from_le_bytes).map_err(|_| {
                        crate::codec::BodyError::Decode(bincode::error::DecodeError::Other(
                            "a version 1 LeaseAccept term (ext keys 1 to 4) is 8 bytes, little-endian",
                        ))
                    })
                })
                .transpose()
        };
        let receipt_interval_ms = take(V1_RECEIPT_INTERVAL_MS)?.unwrap_or(V1_DEFAULTS[0]);
        let ack_grace_ms = take(V1_ACK_GRACE_MS)?.unwrap_or(V1_DEFAULTS[1]);
        let spot_notice_ms = take(V1_SPOT_NOTICE_MS)?.unwrap_or(V1_DEFAULTS[2]);
        let starts_at = take(V1_STARTS_AT)?.map(Timestamp);
        Ok(Self {
            request: v1.request,
            created_at: v1.created_at,
            receipt_interval_ms,
            ack_grace_ms,
            spot_notice_ms,
            starts_at,
            ext,
        })
    }
}

/// `accept`'s body as version 1 encoded it (for [`crate::older`]).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn lease_accept_v1_body(accept: &LeaseAccept) -> Vec<u8> {
    let mut ext = accept.ext.clone();
    // Four 8-byte values: a test's accept is within the ext map's limits.
    let terms = [
        (V1_RECEIPT_INTERVAL_MS, Some(accept.receipt_interval_ms)),
        (V1_ACK_GRACE_MS, Some(accept.ack_grace_ms)),
        (V1_SPOT_NOTICE_MS, Some(accept.spot_notice_ms)),
        (V1_STARTS_AT, accept.starts_at.map(|t| t.0)),
    ];
    for (key, value) in terms {
        if let Some(value) = value {
            let _ = ext.insert(key, value.to_le_bytes().to_vec());
        }
    }
    let v1 = LeaseAcceptV1 {
        request: accept.request,
        created_at: accept.created_at,
        ext,
    };
    // Plain data: encoding cannot fail.
    crate::codec::encode(&v1).unwrap_or_default()
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
        match version {
            1 => crate::codec::decode_exact::<LeaseAcceptV1>(body)?.try_into(),
            _ => Err(crate::codec::BodyError::Decode(
                bincode::error::DecodeError::Other("no such version of LeaseAccept"),
            )),
        }
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

#[cfg(test)]
mod accept_tests {
    use super::*;
    use crate::envelope::Signed;

    fn accept(starts_at: Option<Timestamp>) -> LeaseAccept {
        LeaseAccept {
            request: ContentId([4; 32]),
            created_at: Timestamp(1_000),
            receipt_interval_ms: 5_000,
            ack_grace_ms: 2_000,
            spot_notice_ms: 10_000,
            starts_at,
            ext: Ext::new(),
        }
    }

    #[test]
    fn a_version_1_acceptance_reads_its_terms_from_ext_keys_1_to_4() {
        let key = crate::Keypair::from_seed(&[7; 32]);
        for starts_at in [None, Some(Timestamp(9_000))] {
            let bytes = crate::older::lease_accept_v1(&key, &accept(starts_at));
            assert_eq!(bytes[5], 1);
            let read = Signed::<LeaseAccept>::from_bytes(bytes.clone())
                .unwrap()
                .verify()
                .unwrap();
            assert_eq!(read.body(), &accept(starts_at));
            assert_eq!(read.id(), ContentId::of(&bytes));
        }
        // The terms version 1 left out are what it meant by leaving them out.
        let mut bare = LeaseAcceptV1 {
            request: ContentId([4; 32]),
            created_at: Timestamp(1_000),
            ext: Ext::new(),
        };
        bare.ext.insert(99, vec![1]).unwrap();
        let read = LeaseAccept::try_from(bare).unwrap();
        assert_eq!(
            (
                read.receipt_interval_ms,
                read.ack_grace_ms,
                read.spot_notice_ms
            ),
            (60_000, 30_000, 30_000)
        );
        assert_eq!(read.starts_at, None);
        // An extra it does not know stays in ext, as signed.
        assert_eq!(read.ext.get(99), Some(&[1u8][..]));
    }

    #[test]
    fn a_version_1_term_that_is_not_8_bytes_is_refused() {
        let mut v1 = LeaseAcceptV1 {
            request: ContentId([4; 32]),
            created_at: Timestamp(1_000),
            ext: Ext::new(),
        };
        v1.ext.insert(V1_ACK_GRACE_MS, vec![0; 4]).unwrap();
        let body = crate::codec::encode(&v1).unwrap();
        assert!(LeaseAccept::decode_older(1, &body).is_err());
        // Nor is a version this build never spoke.
        assert!(LeaseAccept::decode_older(3, &body).is_err());
    }
}

#[cfg(test)]
mod request_tests {
    use super::*;
    use crate::envelope::Signed;

    fn request() -> LeaseRequest {
        let price = MicroCredits(3_600_000);
        LeaseRequest {
            created_at: Timestamp(1_000),
            expires_at: Timestamp(31_000),
            offer: ContentId([1; 32]),
            host: crate::Keypair::from_seed(&[7; 32]).public(),
            gpus: BoundedVec::new(vec![GpuUuid::Gpu([2; 16])]).unwrap(),
            price_per_gpu_hour: price,
            duration_s: 600,
            kind: LeaseKind::Reserved {
                start: Timestamp(100_000),
                end: Timestamp(700_000),
            },
            image: ImageDigest([3; 32]),
            command: BoundedVec::empty(),
            env: BoundedVec::empty(),
            limits: ResourceLimits {
                memory_bytes: 1 << 30,
                cpu_millis: 1000,
                pids: 64,
                scratch_bytes: 1 << 20,
                shm_bytes: 1 << 20,
            },
            network: false,
            escrow: EscrowId([4; 16]),
            escrow_amount: MicroCredits(2_000_000),
            bid: None,
            ssh_keys: BoundedVec::empty(),
            terms: LeaseTerms {
                workspace_bytes: Some(4 << 30),
                retain_s: Some(1800),
                cache_image: true,
                workspace_price: MicroCredits(100_000),
                commit_wait_ms: Some(60_000),
                group: Some([9; 16]),
                committed_s: 300,
                cancel_fees: "1h:50%,10m:100%".parse().unwrap(),
            },
            ext: Ext::new(),
        }
    }

    #[test]
    fn a_version_4_request_reads_its_eight_terms_from_ext_into_the_typed_terms() {
        let key = crate::Keypair::from_seed(&[8; 32]);
        let bytes = crate::older::lease_request_v4(&key, &request());
        assert_eq!(bytes[5], 4);
        let read = Signed::<LeaseRequest>::from_bytes(bytes.clone())
            .unwrap()
            .verify()
            .unwrap();
        assert_eq!(read.body(), &request());
        assert!(read.ext.is_empty());
        assert_eq!(read.id(), ContentId::of(&bytes));
        assert_eq!(read.retention_charge(), Ok(MicroCredits(200_000)));
        // Today's version of the same request is another envelope, another lease id.
        let v5 = Signed::sign(&key, request()).unwrap();
        assert_eq!(v5.as_bytes()[5], 5);
        assert_ne!(v5.id(), read.id());
    }

    #[test]
    fn a_version_4_term_of_the_wrong_shape_is_refused() {
        let key = crate::Keypair::from_seed(&[8; 32]);
        for (term, value) in [
            (v4::WORKSPACE_BYTES, vec![1, 2, 3]),
            (v4::CACHE_IMAGE, vec![2]),
            (v4::GROUP, vec![1; 15]),
            (v4::CANCEL_FEES, vec![1, 2, 3, 4]),
        ] {
            let mut odd = request();
            odd.terms = LeaseTerms::default();
            odd.kind = LeaseKind::OnDemand;
            odd.ext.insert(term, value).unwrap();
            let bytes = crate::older::lease_request_v4(&key, &odd);
            let refused = Signed::<LeaseRequest>::from_bytes(bytes).unwrap().verify();
            assert!(
                matches!(refused, Err(crate::VerifyError::Body { .. })),
                "key {term}: {refused:?}"
            );
        }
    }
}
