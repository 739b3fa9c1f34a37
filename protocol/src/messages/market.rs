//! Gossiped market messages: `Offer`, `OfferWithdrawal` and `Bid`.

use crate::codec::{BoundedString, BoundedVec, Ext};
use crate::envelope::Message;
use crate::messages::{
    InvalidMessage, LeaseKind, MessageKind, ensure_after, ensure_at_most, ensure_nonempty,
    ensure_nonzero, ensure_sane_terms, ensure_token, ensure_unique,
};
use crate::money::{MAX_DURATION_S, MAX_PRICE_PER_GPU_HOUR, MicroCredits};
use crate::types::{
    ComputeCapability, ContentId, EvidenceTier, GpuUuid, ImageDigest, Timestamp, Version,
};

/// The most GPUs one offer may list (a machine's GPUs; larger hosts publish several offers).
pub const MAX_OFFER_GPUS: usize = 16;
/// The most images one offer may list.
pub const MAX_OFFER_IMAGES: usize = 8;
/// The longest query text of a bid.
pub const MAX_QUERY_BYTES: usize = 1024;
/// The most GPUs one bid may ask for.
pub const MAX_BID_GPUS: u64 = 64;
/// The most standing bids one renter has at once: its slots are `0..MAX_BID_SLOTS`.
pub const MAX_BID_SLOTS: u16 = 64;

/// GPUs for rent. Published on `gpux/offers/1/<family>` (the family of its first GPU).
///
/// A host may have several offers at once, one per `slot` (a machine with more than
/// [`MAX_OFFER_GPUS`] GPUs, or GPUs at different prices). An offer replaces the host's
/// previous offer in the same slot when its `seq` is higher; an equal or lower `seq` for that
/// slot is a replay.
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
pub struct Offer {
    /// The host's sequence number. Readers require it to grow within a slot; hosts keep one
    /// counter for all their offers and withdrawals, so it grows across slots too.
    pub seq: u64,
    /// Which of the host's offers this is (see above).
    pub slot: u16,
    /// When the offer was made.
    pub created_at: Timestamp,
    /// When it lapses unless re-published.
    pub expires_at: Timestamp,
    /// Id of the host's [`Attestation`](crate::messages::Attestation) that these GPUs appear in.
    pub attestation: ContentId,
    /// The GPUs offered.
    pub gpus: BoundedVec<OfferGpu, MAX_OFFER_GPUS>,
    /// On-demand price per GPU-hour.
    pub price_per_gpu_hour: MicroCredits,
    /// The lowest spot bid accepted per GPU-hour; `None` when the host takes no spot leases.
    pub spot_floor_per_gpu_hour: Option<MicroCredits>,
    /// Shortest lease accepted, seconds.
    pub min_duration_s: u32,
    /// Longest lease accepted, seconds.
    pub max_duration_s: u32,
    /// Where the host is (`eu`, `us-east`): lower-case token.
    pub region: BoundedString<32>,
    /// Evidence tier backing the GPU claims.
    pub tier: EvidenceTier,
    /// NVIDIA driver version.
    pub driver: Version,
    /// CUDA version the driver supports.
    pub cuda: Version,
    /// Images the host has locally, by digest; a lease must name one of them.
    pub images: BoundedVec<ImageDigest, MAX_OFFER_IMAGES>,
    /// The machine the GPUs are in, and what of it goes with each GPU.
    pub machine: Machine,
    /// Which images the host pulls from registries for a lease, and which it has cached.
    pub pulls: Pulls,
    /// The host's terms beyond price and duration: workspaces and what keeping one costs,
    /// renters' images it stages, its images' tags, windows booked ahead, the MIG profile
    /// of the instances it lists, and a reserved window's cancellation fees.
    pub terms: OfferTerms,
    /// Extension fields: optional extras only.
    pub ext: Ext,
}

/// The most tags an offer lists for one image.
pub const MAX_IMAGE_TAGS: usize = 16;

/// One window booked ahead on an offer's GPU (a reserved lease that has not begun).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct BookedWindow {
    /// The GPU's index in the offer's `gpus`.
    pub gpu: u8,
    /// When the window starts.
    pub start: Timestamp,
    /// When it ends (after its start).
    pub end: Timestamp,
}

/// An offer's terms beyond price and duration (`Offer` version 5; version 4 carried them in
/// ext keys 1 to 8). The default is an offer with none of them.
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
pub struct OfferTerms {
    /// The largest workspace (`/workspace`) the host gives a lease now, bytes (0: none).
    pub workspace_bytes: u64,
    /// The longest the host keeps a workspace after its lease, seconds (none: not said).
    pub max_retain_s: Option<u64>,
    /// The largest renter image the host stages over `/gpux/stage/1`, bytes (0: it runs
    /// only the images it lists, or pulls).
    pub max_image_bytes: u64,
    /// What keeping a workspace after its workload costs, per GiB-hour (zero: free).
    pub workspace_price: MicroCredits,
    /// The tags of the images the offer lists, in `images`' order (`pytorch:2.4`; see
    /// [`is_image_tag`]); fewer entries than images leave the rest untagged. A lease still
    /// names the digest.
    pub image_tags: BoundedVec<
        BoundedVec<BoundedString<MAX_IMAGE_TAG_BYTES>, MAX_IMAGE_TAGS>,
        MAX_OFFER_IMAGES,
    >,
    /// Windows already booked ahead on the offer's GPUs, so renters do not ask for them (a
    /// lease that would overlap one is refused anyway).
    pub booked: BoundedVec<BookedWindow, MAX_OFFER_BOOKED>,
    /// The MIG profile of every device the offer lists (`1g.10gb`), when they are MIG
    /// instances: required then, absent for whole GPUs.
    pub mig_profile: Option<BoundedString<{ crate::MAX_MIG_PROFILE }>>,
    /// The host's cancellation fee schedule for reserved windows (empty: cancelling a window
    /// before its start is free); a reserved request with a committed minimum carries it
    /// unchanged ([`LeaseTerms::cancel_fees`](crate::LeaseTerms::cancel_fees)).
    pub cancel_fees: crate::CancelFees,
}

/// The most registries a host's pull policy names.
pub const MAX_PULL_REGISTRIES: usize = 8;
/// The most cached images an offer lists.
pub const MAX_CACHED_IMAGES: usize = 16;

/// What a host pulls from registries before a lease (`/gpux/pull/1`), and what it has
/// pulled already: a renter that names a cached image gets a warm start.
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
pub struct Pulls {
    /// The largest image it pulls, bytes as Docker stores it (0: it pulls none).
    pub max_bytes: u64,
    /// The longest a pull may take, seconds.
    pub timeout_s: u32,
    /// Registries it pulls from (`docker.io`, `ghcr.io`, `127.0.0.1:5000`; `*.example.com`
    /// for a domain's hosts); `!name` refuses one. Without an allowing entry, any registry
    /// not refused.
    pub registries: BoundedVec<BoundedString<64>, MAX_PULL_REGISTRIES>,
    /// Images in its cache, pulled with no credentials, most recently used first, in
    /// Docker's short form (`pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime`, `ubuntu:22.04`;
    /// other registries by name: `ghcr.io/org/app:1`).
    pub cached: BoundedVec<BoundedString<128>, MAX_CACHED_IMAGES>,
}

impl Pulls {
    /// Whether the host pulls from `registry` (`docker.io`, `host:port`): the policy's
    /// refusals first, then its allowing entries (none: every registry).
    pub fn allows(&self, registry: &str) -> bool {
        let registry = registry.to_ascii_lowercase();
        if self.max_bytes == 0 {
            return false;
        }
        let matches = |pattern: &str| match pattern.strip_prefix("*.") {
            Some(domain) => registry
                .split(':')
                .next()
                .is_some_and(|h| h.ends_with(&format!(".{domain}"))),
            None => pattern == registry,
        };
        if self
            .registries
            .iter()
            .filter_map(|p| p.strip_prefix('!'))
            .any(matches)
        {
            return false;
        }
        let allowing: Vec<&str> = self
            .registries
            .iter()
            .map(|p| p.as_str())
            .filter(|p| !p.starts_with('!'))
            .collect();
        allowing.is_empty() || allowing.into_iter().any(matches)
    }

    /// The rules an offer's pull policy keeps (checked with the offer): registries and a
    /// cache only for a host that pulls, registry patterns well formed, cached references
    /// valid and unique.
    pub fn check(&self) -> Result<(), InvalidMessage> {
        if self.max_bytes == 0 && !(self.registries.is_empty() && self.cached.is_empty()) {
            return Err(InvalidMessage::Inconsistent {
                field: "pulls",
                reason: "a host that pulls no images lists no registries and no cache",
            });
        }
        for pattern in self.registries.iter() {
            let body = pattern.strip_prefix('!').unwrap_or(pattern);
            let body = body.strip_prefix("*.").unwrap_or(body);
            if body.is_empty()
                || !body.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b':')
                })
            {
                return Err(InvalidMessage::Malformed {
                    field: "pulls.registries",
                    reason: "a registry: [!][*.]host[:port], lower case",
                });
            }
        }
        if !self.cached.iter().all(|r| is_image_tag(r)) {
            return Err(InvalidMessage::Malformed {
                field: "pulls.cached",
                reason: "an image reference: letters, digits and ._-/:@",
            });
        }
        ensure_unique("pulls.cached", self.cached.iter().map(|r| r.as_str()))
    }
}

/// The machine an offer's GPUs are in, as its host measured it (or set it: a host may give
/// leases less than the machine has), and the share of it that goes with each GPU. A lease
/// of `n` GPUs gets `n` shares unless its renter asks for less; the host enforces what the
/// lease names.
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
pub struct Machine {
    /// The CPU's model, as the kernel names it (printable ASCII).
    pub cpu_model: BoundedString<64>,
    /// Logical CPUs the host gives its leases.
    pub cpu_threads: u16,
    /// Memory the host gives its leases, bytes.
    pub memory_bytes: u64,
    /// Sequential write speed of the disk workspaces live on, MB/s (10^6 bytes; 0: not
    /// measured).
    pub disk_write_mbps: u32,
    /// Upload bandwidth measured to peers, Mbit/s (0: not measured).
    pub net_up_mbps: u32,
    /// Download bandwidth measured from peers, Mbit/s (0: not measured).
    pub net_down_mbps: u32,
    /// What goes with each GPU (or MIG instance) of the offer.
    pub share: Share,
}

/// The part of a machine that goes with one GPU of an offer.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Share {
    /// CPU, thousandths of a core.
    pub cpu_millis: u32,
    /// Memory, bytes.
    pub memory_bytes: u64,
}

impl Share {
    /// `n` shares: what a lease of `n` GPUs gets (saturating).
    pub fn times(self, n: usize) -> Share {
        let n32 = u32::try_from(n).unwrap_or(u32::MAX);
        Share {
            cpu_millis: self.cpu_millis.saturating_mul(n32),
            memory_bytes: self.memory_bytes.saturating_mul(n as u64),
        }
    }
}

impl Machine {
    /// A machine of `cpu_threads` threads and `memory_bytes` (given to leases) split evenly
    /// over its `gpus` GPUs, nothing measured yet. A model name that does not fit is cut.
    pub fn split_evenly(
        cpu_model: &str,
        cpu_threads: u16,
        memory_bytes: u64,
        gpus: usize,
    ) -> Machine {
        let n = gpus.max(1) as u64;
        let cut = cpu_model
            .char_indices()
            .map(|(i, c)| i + c.len_utf8())
            .take_while(|&end| end <= 64)
            .last()
            .unwrap_or(0);
        Machine {
            cpu_model: BoundedString::new(&cpu_model[..cut]).unwrap_or_default(),
            cpu_threads,
            memory_bytes,
            share: Share {
                cpu_millis: u32::try_from((u64::from(cpu_threads) * 1000 / n).max(1))
                    .unwrap_or(u32::MAX),
                memory_bytes: (memory_bytes / n).max(1),
            },
            ..Machine::default()
        }
    }

    /// The rules of an offer's machine facts for an offer of `gpus` devices: something to
    /// share, shares that fit in the machine, a printable model name.
    fn check(&self, gpus: usize) -> Result<(), InvalidMessage> {
        ensure_nonzero("machine.cpu_threads", self.cpu_threads.into())?;
        ensure_nonzero("machine.memory_bytes", self.memory_bytes)?;
        ensure_nonzero("machine.share.cpu_millis", self.share.cpu_millis.into())?;
        ensure_nonzero("machine.share.memory_bytes", self.share.memory_bytes)?;
        let all = self.share.times(gpus);
        ensure_at_most(
            "machine.share.cpu_millis",
            all.cpu_millis.into(),
            u64::from(self.cpu_threads) * 1000,
        )?;
        ensure_at_most(
            "machine.share.memory_bytes",
            all.memory_bytes,
            self.memory_bytes,
        )?;
        if !self.cpu_model.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            return Err(InvalidMessage::Malformed {
                field: "machine.cpu_model",
                reason: "printable ASCII only",
            });
        }
        Ok(())
    }
}

/// The summary of one offered GPU, enough to match without the attestation.
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
pub struct OfferGpu {
    /// The GPU's UUID (it must appear in the attestation).
    pub uuid: GpuUuid,
    /// Family key from the [family table](crate::family).
    pub family: BoundedString<24>,
    /// Total memory in bytes, as attested.
    pub memory_bytes: u64,
    /// Compute capability, as attested.
    pub compute_capability: ComputeCapability,
    /// Maximum PCIe generation, as attested (0 when unknown).
    pub pcie_gen: u8,
}

impl Message for Offer {
    const KIND: MessageKind = MessageKind::Offer;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_after("created_at", self.created_at, "expires_at", self.expires_at)?;
        ensure_nonempty("gpus", &self.gpus)?;
        ensure_unique("gpus.uuid", self.gpus.iter().map(|g| g.uuid))?;
        let slices = self.gpus.iter().filter(|g| g.uuid.is_mig()).count();
        if slices != 0 && slices != self.gpus.len() {
            return Err(InvalidMessage::Inconsistent {
                field: "gpus",
                reason: "an offer lists whole GPUs or MIG instances, not both",
            });
        }
        match (slices != 0, &self.terms.mig_profile) {
            (true, Some(profile)) => {
                if crate::mig_compute_slices(profile).is_none() {
                    return Err(InvalidMessage::Malformed {
                        field: "terms.mig_profile",
                        reason: "expected a profile such as 1g.10gb",
                    });
                }
            }
            (true, None) => {
                return Err(InvalidMessage::Inconsistent {
                    field: "terms.mig_profile",
                    reason: "an offer of MIG instances names their profile",
                });
            }
            (false, Some(_)) => {
                return Err(InvalidMessage::Inconsistent {
                    field: "terms.mig_profile",
                    reason: "a MIG profile on an offer of whole GPUs",
                });
            }
            (false, None) => {}
        }
        for gpu in self.gpus.iter() {
            ensure_token("gpus.family", &gpu.family)?;
            ensure_nonzero("gpus.memory_bytes", gpu.memory_bytes)?;
        }
        ensure_nonzero("price_per_gpu_hour", self.price_per_gpu_hour.0)?;
        if let Some(floor) = self.spot_floor_per_gpu_hour {
            ensure_nonzero("spot_floor_per_gpu_hour", floor.0)?;
            ensure_at_most(
                "spot_floor_per_gpu_hour",
                floor.0,
                self.price_per_gpu_hour.0,
            )?;
        }
        ensure_nonzero("min_duration_s", self.min_duration_s.into())?;
        ensure_at_most(
            "price_per_gpu_hour",
            self.price_per_gpu_hour.0,
            MAX_PRICE_PER_GPU_HOUR.0,
        )?;
        ensure_at_most(
            "max_duration_s",
            self.max_duration_s.into(),
            MAX_DURATION_S.into(),
        )?;
        if self.min_duration_s > self.max_duration_s {
            return Err(InvalidMessage::Inconsistent {
                field: "min_duration_s",
                reason: "longer than max_duration_s",
            });
        }
        ensure_token("region", &self.region)?;
        if self.terms.image_tags.len() > self.images.len()
            || !self
                .terms
                .image_tags
                .iter()
                .flat_map(|tags| tags.iter())
                .all(|t| is_image_tag(t))
        {
            return Err(InvalidMessage::Malformed {
                field: "terms.image_tags",
                reason: "valid tags, for the listed images only",
            });
        }
        if self
            .terms
            .booked
            .iter()
            .any(|w| usize::from(w.gpu) >= self.gpus.len() || w.start >= w.end)
        {
            return Err(InvalidMessage::Malformed {
                field: "terms.booked",
                reason: "booked windows: a GPU of the offer, start before end",
            });
        }
        // An offer without images can be leased only with an image the renter stages, or
        // one the host pulls.
        if self.max_image_bytes() == 0 && self.pulls.max_bytes == 0 {
            ensure_nonempty("images", &self.images)?;
        }
        self.pulls.check()?;
        ensure_unique("images", self.images.iter().copied())?;
        self.machine.check(self.gpus.len())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }

    fn expires_at(&self) -> Option<Timestamp> {
        Some(self.expires_at)
    }

    fn seq(&self) -> Option<u64> {
        Some(self.seq)
    }

    fn decode_older(version: u8, body: &[u8]) -> Result<Self, crate::codec::BodyError> {
        super::older::market::decode_offer(version, body)
    }
}

/// The most booked windows an offer lists.
pub const MAX_OFFER_BOOKED: usize = 8;
/// The longest image tag an offer lists, bytes.
pub const MAX_IMAGE_TAG_BYTES: usize = 128;

/// Whether `region` may be an offer's region: 1 to 32 bytes of a-z, 0-9 and inner `-`
/// (`eu-west`), as an offer's check requires.
pub fn is_region(region: &str) -> bool {
    region.len() <= 32 && super::ensure_token("region", region).is_ok()
}

/// Whether `tag` may be listed in an offer: 1 to [`MAX_IMAGE_TAG_BYTES`] bytes of ASCII
/// letters, digits and `._-/:@`, as Docker references are written (`repo/name:tag`).
pub fn is_image_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= MAX_IMAGE_TAG_BYTES
        && tag.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/' | b':' | b'@')
        })
}

impl Offer {
    /// The largest workspace the host gives a lease now, bytes (0: none).
    pub fn workspace_bytes(&self) -> u64 {
        self.terms.workspace_bytes
    }

    /// The longest the host keeps a workspace after its lease, seconds, if it says.
    pub fn max_retain_s(&self) -> Option<u64> {
        self.terms.max_retain_s
    }

    /// What keeping a workspace after its workload costs per GiB-hour (zero: free).
    pub fn workspace_price(&self) -> MicroCredits {
        self.terms.workspace_price
    }

    /// The tags the host lists for its images, each with the image's digest.
    pub fn image_tags(&self) -> Vec<(ImageDigest, String)> {
        self.terms
            .image_tags
            .iter()
            .zip(self.images.iter())
            .flat_map(|(tags, image)| tags.iter().map(|t| (*image, t.to_string())))
            .collect()
    }

    /// The MIG profile of the instances this offer lists (`None` for whole GPUs); checked
    /// with the offer.
    pub fn mig_profile(&self) -> Option<&str> {
        self.terms.mig_profile.as_deref()
    }

    /// The host's cancellation fee schedule for reserved windows (empty: free).
    pub fn cancel_fees(&self) -> Result<crate::CancelFees, InvalidMessage> {
        Ok(self.terms.cancel_fees.clone())
    }

    /// The windows booked ahead on the offer's GPUs: (index in `gpus`, start, end); checked
    /// with the offer.
    pub fn booked(&self) -> Result<Vec<(u8, Timestamp, Timestamp)>, InvalidMessage> {
        Ok(self
            .terms
            .booked
            .iter()
            .map(|w| (w.gpu, w.start, w.end))
            .collect())
    }

    /// `windows` as an offer lists them: the first [`MAX_OFFER_BOOKED`].
    pub fn booked_windows(
        windows: &[(u8, Timestamp, Timestamp)],
    ) -> BoundedVec<BookedWindow, MAX_OFFER_BOOKED> {
        let windows = windows
            .iter()
            .take(MAX_OFFER_BOOKED)
            .map(|&(gpu, start, end)| BookedWindow { gpu, start, end })
            .collect();
        BoundedVec::new(windows).unwrap_or_default()
    }

    /// The largest renter image the host stages, bytes (0: it stages none).
    pub fn max_image_bytes(&self) -> u64 {
        self.terms.max_image_bytes
    }

    /// The family key the offer is published under: that of its first GPU.
    pub fn topic_family(&self) -> &str {
        self.gpus
            .first()
            .map_or(crate::family::OTHER_KEY, |g| &g.family)
    }
}

/// The host withdraws an offer (it is leaving, or the GPUs are no longer for rent).
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
pub struct OfferWithdrawal {
    /// The host's sequence number, higher than the withdrawn offer's (checked against the
    /// withdrawn offer's slot).
    pub seq: u64,
    /// When.
    pub created_at: Timestamp,
    /// The offer withdrawn.
    pub offer: ContentId,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for OfferWithdrawal {
    const KIND: MessageKind = MessageKind::OfferWithdrawal;

    fn check(&self) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }

    fn seq(&self) -> Option<u64> {
        Some(self.seq)
    }
}

/// A renter's standing request for capacity, gossiped on `gpux/bids/1`; hosts that can
/// satisfy it may propose terms.
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
pub struct Bid {
    /// The renter's sequence number; a newer bid in the same slot replaces an older one.
    pub seq: u64,
    /// Which of the renter's standing bids this is: a renter has at most one per slot.
    pub slot: u16,
    /// When the bid was made.
    pub created_at: Timestamp,
    /// When it lapses.
    pub expires_at: Timestamp,
    /// Constraints in the market query language (`gpu=H100 vram>=80 region=eu`).
    pub query: BoundedString<MAX_QUERY_BYTES>,
    /// GPUs wanted.
    pub gpus: u16,
    /// The most the renter pays per GPU-hour.
    pub max_price_per_gpu_hour: MicroCredits,
    /// Lease length wanted, seconds.
    pub duration_s: u32,
    /// On-demand, spot or reserved.
    pub kind: LeaseKind,
    /// Whether the GPUs may come from several hosts (default: one machine).
    pub allow_spread: bool,
    /// Extension fields.
    pub ext: Ext,
}

/// The renter withdraws a standing bid (cancelled, or filled). Published on `gpux/bids/1`.
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
pub struct BidWithdrawal {
    /// The renter's sequence number, higher than the withdrawn bid's.
    pub seq: u64,
    /// When.
    pub created_at: Timestamp,
    /// The bid withdrawn.
    pub bid: ContentId,
    /// Its slot.
    pub slot: u16,
    /// Extension fields.
    pub ext: Ext,
}

impl Message for BidWithdrawal {
    const KIND: MessageKind = MessageKind::BidWithdrawal;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_at_most("slot", self.slot.into(), u64::from(MAX_BID_SLOTS - 1))
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }

    fn seq(&self) -> Option<u64> {
        Some(self.seq)
    }
}

impl Message for Bid {
    const KIND: MessageKind = MessageKind::Bid;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_after("created_at", self.created_at, "expires_at", self.expires_at)?;
        ensure_nonzero("gpus", self.gpus.into())?;
        ensure_at_most("gpus", self.gpus.into(), MAX_BID_GPUS)?;
        ensure_at_most("slot", self.slot.into(), u64::from(MAX_BID_SLOTS - 1))?;
        ensure_nonzero("max_price_per_gpu_hour", self.max_price_per_gpu_hour.0)?;
        ensure_nonzero("duration_s", self.duration_s.into())?;
        ensure_sane_terms(
            "max_price_per_gpu_hour",
            self.max_price_per_gpu_hour,
            self.duration_s,
            self.gpus.into(),
        )?;
        self.kind.check(self.duration_s)
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }

    fn expires_at(&self) -> Option<Timestamp> {
        Some(self.expires_at)
    }

    fn seq(&self) -> Option<u64> {
        Some(self.seq)
    }
}
