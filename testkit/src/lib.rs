//! Builders for the messages gpux's tests sign.
//!
//! Each builder returns one plain, valid body. A test changes the fields it is about with
//! struct update syntax and signs the result:
//!
//! ```
//! use gpux_protocol::{MicroCredits, Timestamp};
//! use gpux_testkit as kit;
//!
//! let host = kit::key(1);
//! let offer = kit::sign(
//!     &host,
//!     gpux_protocol::Offer {
//!         price_per_gpu_hour: MicroCredits(1_000_000),
//!         ..kit::offer(Timestamp(1_000), [kit::l4(kit::gpu(3))])
//!     },
//! );
//! let request = kit::sign(&kit::key(2), kit::request(&offer, Timestamp(2_000)));
//! assert_eq!(request.price_per_gpu_hour, MicroCredits(1_000_000));
//! assert_eq!(request.escrow_amount, MicroCredits(1_000_000 * 120 / 3600));
//! ```
//!
//! What every test shares (limits, images, the machine, the defaults of new fields) is written
//! here once, so a change to a message touches one place instead of every test file.

use gpux_protocol::*;

/// The key made from 32 copies of `seed` (tests pick seeds to tell parties apart).
pub fn key(seed: u8) -> Keypair {
    Keypair::from_seed(&[seed; 32])
}

/// `body` signed by `key`. Panics when the body breaks a rule: a test's fixture must be valid.
pub fn sign<T: Message>(key: &Keypair, body: T) -> Verified<T> {
    match Signed::sign(key, body) {
        Ok(signed) => signed,
        Err(e) => panic!("a test fixture that cannot be signed: {e}"),
    }
}

/// A bounded string from `text`; panics when it is too long.
pub fn text<const N: usize>(text: &str) -> BoundedString<N> {
    match BoundedString::new(text) {
        Ok(s) => s,
        Err(e) => panic!("a test string that does not fit: {e}"),
    }
}

/// A bounded list from `items`; panics when there are too many.
pub fn list<T, const N: usize>(items: impl IntoIterator<Item = T>) -> BoundedVec<T, N> {
    match BoundedVec::new(items.into_iter().collect()) {
        Ok(v) => v,
        Err(e) => panic!("a test list that does not fit: {e}"),
    }
}

/// The whole GPU whose UUID is 16 copies of `n`.
pub fn gpu(n: u8) -> GpuUuid {
    GpuUuid::Gpu([n; 16])
}

/// The image every default offer and request names.
pub const IMAGE: ImageDigest = ImageDigest([4; 32]);

/// An offered GPU of `family` with `memory_bytes` and compute capability `cc`, on PCIe 4.
pub fn offer_gpu(uuid: GpuUuid, family: &str, memory_bytes: u64, cc: (u8, u8)) -> OfferGpu {
    OfferGpu {
        uuid,
        family: text(family),
        memory_bytes,
        compute_capability: ComputeCapability::new(cc.0, cc.1),
        pcie_gen: 4,
    }
}

/// An L4 (24 GB, compute capability 8.9).
pub fn l4(uuid: GpuUuid) -> OfferGpu {
    offer_gpu(uuid, "l4", 24_000_000_000, (8, 9))
}

/// An A100 80GB (compute capability 8.0); a MIG slice gets 10 GiB.
pub fn a100(uuid: GpuUuid) -> OfferGpu {
    let memory = if uuid.is_mig() { 10 << 30 } else { 80 << 30 };
    offer_gpu(uuid, "a100", memory, (8, 0))
}

/// An offer of `gpus` made at `created_at`: slot 0, seq 1, ten minutes long, 3.60 credits per
/// GPU-hour on demand and no spot, 1 s to a day, region "eu", self-reported, the [`IMAGE`],
/// 16 threads and 64 GiB split over 16 GPUs, no extras.
pub fn offer(created_at: Timestamp, gpus: impl IntoIterator<Item = OfferGpu>) -> Offer {
    Offer {
        seq: 1,
        slot: 0,
        created_at,
        expires_at: created_at.plus_secs(600),
        attestation: ContentId([7; 32]),
        gpus: list(gpus),
        price_per_gpu_hour: MicroCredits(3_600_000),
        spot_floor_per_gpu_hour: None,
        min_duration_s: 1,
        max_duration_s: 86_400,
        region: text("eu"),
        tier: EvidenceTier::SelfReported,
        driver: Version::default(),
        cuda: Version::default(),
        images: list([IMAGE]),
        machine: Machine::split_evenly("test CPU", 16, 64 << 30, 16),
        pulls: Pulls::default(),
        terms: OfferTerms::default(),
        ext: Ext::new(),
    }
}

/// The limits every default request asks for: 1 GiB of memory, one core, 64 processes,
/// 1 MiB of scratch and of shared memory.
pub fn limits() -> ResourceLimits {
    ResourceLimits {
        memory_bytes: 1 << 30,
        cpu_millis: 1000,
        pids: 64,
        scratch_bytes: 1 << 20,
        shm_bytes: 1 << 20,
    }
}

/// A request to `host` for `gpus` of the offer `offer` at `price`, made at `created_at`:
/// 120 s on demand of the [`IMAGE`] with the default [`limits`], no network, escrow
/// `[5; 16]` holding exactly the 120 s, answered within 30 s.
pub fn request_to(
    host: PublicKey,
    offer: ContentId,
    gpus: impl IntoIterator<Item = GpuUuid>,
    price: MicroCredits,
    created_at: Timestamp,
) -> LeaseRequest {
    let gpus: BoundedVec<GpuUuid, MAX_OFFER_GPUS> = list(gpus);
    let duration_s = 120;
    let gpu_seconds = gpus.len() as u64 * duration_s;
    LeaseRequest {
        created_at,
        expires_at: created_at.plus_secs(30),
        offer,
        host,
        price_per_gpu_hour: price,
        duration_s: duration_s as u32,
        kind: LeaseKind::OnDemand,
        image: IMAGE,
        command: BoundedVec::empty(),
        env: BoundedVec::empty(),
        limits: limits(),
        network: false,
        escrow: EscrowId([5; 16]),
        escrow_amount: cost(gpu_seconds, price),
        gpus,
        bid: None,
        ssh_keys: BoundedVec::empty(),
        terms: LeaseTerms::default(),
        ext: Ext::new(),
    }
}

/// A request for every GPU of `offer` at its price, made at `created_at` (see [`request_to`]).
pub fn request(offer: &Verified<Offer>, created_at: Timestamp) -> LeaseRequest {
    request_to(
        offer.signer(),
        offer.id(),
        offer.gpus.iter().map(|g| g.uuid),
        offer.price_per_gpu_hour,
        created_at,
    )
}

/// The host's acceptance of `request` at `created_at`.
pub fn accept(request: ContentId, created_at: Timestamp) -> LeaseAccept {
    LeaseAccept {
        request,
        created_at,
        receipt_interval_ms: 60_000,
        ack_grace_ms: 30_000,
        spot_notice_ms: 30_000,
        starts_at: None,
        ext: Ext::new(),
    }
}

/// The cumulative receipt number `seq` for `gpu_seconds` of one GPU of lease `lease` paid
/// from `escrow` at `price`, made at `created_at`.
pub fn receipt(
    lease: ContentId,
    escrow: EscrowId,
    price: MicroCredits,
    seq: u64,
    gpu_seconds: u64,
    created_at: Timestamp,
) -> UsageReceipt {
    UsageReceipt {
        lease,
        escrow,
        price_per_gpu_hour: price,
        gpus: 1,
        seq,
        created_at,
        gpu_seconds,
        amount_due: cost(gpu_seconds, price),
        workspace_charge: MicroCredits::ZERO,
        usage: UsageSummary::default(),
        ext: Ext::new(),
    }
}

/// What `gpu_seconds` cost at `price`; panics on an overflow (a fixture's mistake).
fn cost(gpu_seconds: u64, price: MicroCredits) -> MicroCredits {
    match money::cost(gpu_seconds, price) {
        Ok(amount) => amount,
        Err(e) => panic!("a test fixture's cost overflows: {e}"),
    }
}

/// A GPU as the probe reports it: `name`, `memory` bytes, compute capability `cc`, UUID
/// `[index + 1; 16]`, and nothing optional.
pub fn gpu_facts(index: u32, name: &str, memory: u64, cc: (u8, u8)) -> GpuFacts {
    GpuFacts {
        index,
        name: text(name),
        uuid: gpu(index as u8 + 1),
        serial: None,
        board_part_number: None,
        memory_total_bytes: memory,
        compute_capability: ComputeCapability::new(cc.0, cc.1),
        pcie: PcieFacts::default(),
        power_limit_mw: None,
        max_sm_clock_mhz: None,
        max_memory_clock_mhz: None,
        ecc: None,
        mig: None,
        confidential_compute: None,
    }
}

/// An attestation of `gpus` made at `created_at` by driver 550 (NVML 12).
pub fn attestation(created_at: Timestamp, gpus: impl IntoIterator<Item = GpuFacts>) -> Attestation {
    Attestation {
        created_at,
        driver_version: text("550"),
        cuda_driver_version: None,
        nvml_version: text("12"),
        gpus: list(gpus),
        ext: Ext::new(),
    }
}

/// Extension fields holding each `(key, value)` as a little-endian `u64`.
pub fn ext_u64(fields: impl IntoIterator<Item = (u16, u64)>) -> Ext {
    let mut ext = Ext::new();
    for (key, value) in fields {
        if let Err(e) = ext.insert(key, value.to_le_bytes().to_vec()) {
            panic!("a test extension that does not fit: {e}");
        }
    }
    ext
}
