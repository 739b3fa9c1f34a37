//! Signed offers and bids for tests.

use gpux_protocol::*;

pub const T0: Timestamp = Timestamp(1_764_460_800_000);
pub const GIB: u64 = 1 << 30;

pub fn key(n: u64) -> Keypair {
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&n.to_le_bytes());
    seed[8] = 0x6d;
    Keypair::from_seed(&seed)
}

pub fn image() -> ImageDigest {
    ImageDigest([0xd1; 32])
}

#[derive(Debug, Clone)]
pub struct O {
    pub host: u64,
    pub slot: u16,
    pub seq: u64,
    pub family: &'static str,
    pub vram_gb: u64,
    pub cc: (u8, u8),
    pub gpus: u8,
    pub price: u64,
    pub spot_floor: Option<u64>,
    pub region: &'static str,
    pub tier: EvidenceTier,
    pub created_at: u64,
    pub max_duration_s: u32,
    /// The workspace the host says it gives, bytes (0: it says nothing).
    pub disk_bytes: u64,
    /// What a kept workspace costs, micro-credits per GiB-hour (0: it says nothing).
    pub disk_price: u64,
    /// The offer lists MIG instances of this profile (`vram_gb` their memory).
    pub mig_profile: Option<&'static str>,
    /// The machine's threads and memory, split evenly over the offer's GPUs.
    pub machine: (u16, u64),
    /// The measured download and upload bandwidth, Mbit/s.
    pub net: (u32, u32),
    /// What the host pulls, and what it has cached.
    pub pulls: Pulls,
}

impl Default for O {
    fn default() -> Self {
        O {
            host: 1,
            slot: 0,
            seq: 1,
            family: "h100",
            vram_gb: 80,
            cc: (9, 0),
            gpus: 8,
            price: 2_000_000,
            spot_floor: Some(800_000),
            region: "eu-west",
            tier: EvidenceTier::SelfReported,
            created_at: T0.0,
            max_duration_s: 86_400,
            disk_bytes: 0,
            disk_price: 0,
            mig_profile: None,
            machine: (64, 512 * GIB),
            net: (0, 0),
            pulls: Pulls::default(),
        }
    }
}

impl O {
    /// Memory that the family table maps back to `vram_gb` (NVML reports a little less).
    pub fn memory_bytes(&self) -> u64 {
        self.vram_gb * GIB - 300 * (1 << 20)
    }

    pub fn uuid(&self, i: u8) -> GpuUuid {
        let mut u = [0u8; 16];
        u[..8].copy_from_slice(&self.host.to_le_bytes());
        u[8..10].copy_from_slice(&self.slot.to_le_bytes());
        u[15] = i;
        if self.mig_profile.is_some() {
            GpuUuid::Mig(u)
        } else {
            GpuUuid::Gpu(u)
        }
    }

    pub fn sign(&self) -> Verified<Offer> {
        let gpus = (0..self.gpus)
            .map(|i| OfferGpu {
                uuid: self.uuid(i),
                family: BoundedString::new(self.family).unwrap(),
                memory_bytes: self.memory_bytes(),
                compute_capability: ComputeCapability::new(self.cc.0, self.cc.1),
                pcie_gen: 5,
            })
            .collect();
        let offer = Offer {
            seq: self.seq,
            slot: self.slot,
            created_at: Timestamp(self.created_at),
            expires_at: Timestamp(self.created_at + 600_000),
            attestation: ContentId([7; 32]),
            gpus: BoundedVec::new(gpus).unwrap(),
            price_per_gpu_hour: MicroCredits(self.price),
            spot_floor_per_gpu_hour: self.spot_floor.map(MicroCredits),
            min_duration_s: 60,
            max_duration_s: self.max_duration_s,
            region: BoundedString::new(self.region).unwrap(),
            tier: self.tier,
            driver: Version::new(550, 54, 15),
            cuda: Version::new(12, 4, 0),
            images: BoundedVec::new(vec![image()]).unwrap(),
            machine: Machine {
                net_down_mbps: self.net.0,
                net_up_mbps: self.net.1,
                ..Machine::split_evenly(
                    "test CPU",
                    self.machine.0,
                    self.machine.1,
                    self.gpus.into(),
                )
            },
            pulls: self.pulls.clone(),
            terms: gpux_protocol::OfferTerms {
                workspace_bytes: self.disk_bytes,
                mig_profile: self.mig_profile.map(|p| BoundedString::new(p).unwrap()),
                workspace_price: MicroCredits(self.disk_price),
                ..gpux_protocol::OfferTerms::default()
            },
            ext: Ext::new(),
        };
        Signed::sign(&key(self.host), offer).unwrap()
    }
}

pub fn bid(
    renter: u64,
    seq: u64,
    query: &str,
    gpus: u16,
    max_price: u64,
    kind: LeaseKind,
) -> Verified<Bid> {
    let duration_s = match kind {
        LeaseKind::Reserved { start, end } => ((end.0 - start.0) / 1000) as u32,
        _ => 3600,
    };
    Signed::sign(
        &key(1000 + renter),
        Bid {
            seq,
            slot: 0,
            created_at: T0,
            expires_at: T0.plus_secs(600),
            query: BoundedString::new(query).unwrap(),
            gpus,
            max_price_per_gpu_hour: MicroCredits(max_price),
            duration_s,
            kind,
            allow_spread: false,
            ext: Ext::new(),
        },
    )
    .unwrap()
}
