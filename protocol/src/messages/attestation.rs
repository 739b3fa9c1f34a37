//! `Attestation`: what each of a host's GPUs is, as the NVIDIA driver reported it, signed by
//! the host.

use crate::codec::{BoundedString, BoundedVec, Ext};
use crate::envelope::Message;
use crate::messages::{
    InvalidMessage, MessageKind, ensure_nonempty, ensure_nonzero, ensure_unique,
};
use crate::types::{ComputeCapability, GpuUuid, Timestamp};

/// The most GPUs one attestation may describe.
pub const MAX_ATTESTED_GPUS: usize = 64;
/// The most MIG instances listed per GPU (an H100 or A100 has at most 7).
pub const MAX_MIG_INSTANCES: usize = 8;

/// A host's signed statement of its GPUs, read through NVML. Fields a GPU or driver does not
/// support are `None`, never guessed.
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
pub struct Attestation {
    /// When the GPUs were probed.
    pub created_at: Timestamp,
    /// The driver version string (`nvmlSystemGetDriverVersion`), e.g. `550.54.15`.
    pub driver_version: BoundedString<32>,
    /// The CUDA version the driver supports (`nvmlSystemGetCudaDriverVersion_v2`), e.g. 12.4.
    pub cuda_driver_version: Option<crate::types::Version>,
    /// The NVML library version string, e.g. `12.550.54.15`.
    pub nvml_version: BoundedString<32>,
    /// One entry per GPU, by NVML index.
    pub gpus: BoundedVec<GpuFacts, MAX_ATTESTED_GPUS>,
    /// Extension fields.
    pub ext: Ext,
}

/// NVML facts about one GPU.
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
pub struct GpuFacts {
    /// NVML device index.
    pub index: u32,
    /// Model name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: BoundedString<96>,
    /// The GPU's UUID.
    pub uuid: GpuUuid,
    /// Board serial number, where the board reports one.
    pub serial: Option<BoundedString<64>>,
    /// Board part number, where reported.
    pub board_part_number: Option<BoundedString<64>>,
    /// Total memory in bytes (`nvmlDeviceGetMemoryInfo_v2`).
    pub memory_total_bytes: u64,
    /// CUDA compute capability.
    pub compute_capability: ComputeCapability,
    /// PCIe link facts.
    pub pcie: PcieFacts,
    /// Enforced power limit in milliwatts.
    pub power_limit_mw: Option<u32>,
    /// Maximum SM clock in MHz.
    pub max_sm_clock_mhz: Option<u32>,
    /// Maximum memory clock in MHz.
    pub max_memory_clock_mhz: Option<u32>,
    /// ECC state, where ECC is supported.
    pub ecc: Option<EccFacts>,
    /// MIG state, where MIG is supported.
    pub mig: Option<MigFacts>,
    /// Confidential-computing mode, where the driver reports it.
    pub confidential_compute: Option<bool>,
}

/// PCIe generation and width, maximum and current.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    bincode::Encode,
    bincode::Decode,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct PcieFacts {
    /// Maximum link generation.
    pub max_gen: Option<u8>,
    /// Maximum link width (lanes).
    pub max_width: Option<u8>,
    /// Current link generation.
    pub current_gen: Option<u8>,
    /// Current link width.
    pub current_width: Option<u8>,
}

/// ECC mode and aggregate error counts.
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
pub struct EccFacts {
    /// ECC currently enabled.
    pub enabled: bool,
    /// Aggregate corrected errors over the GPU's life.
    pub corrected_total: Option<u64>,
    /// Aggregate uncorrected errors over the GPU's life.
    pub uncorrected_total: Option<u64>,
}

/// MIG mode and instances.
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
pub struct MigFacts {
    /// MIG mode currently enabled.
    pub enabled: bool,
    /// The MIG devices, when enabled.
    pub instances: BoundedVec<MigInstance, MAX_MIG_INSTANCES>,
}

/// One MIG device.
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
pub struct MigInstance {
    /// Its UUID as NVML gives it (`MIG-...`).
    pub uuid: GpuUuid,
    /// Its profile as the driver names it (`1g.10gb`, `3g.40gb`, `1c.3g.40gb`), the part of
    /// the MIG device's name after `MIG `.
    pub profile: BoundedString<MAX_MIG_PROFILE>,
    /// Its memory in bytes.
    pub memory_total_bytes: u64,
}

/// The longest MIG profile name.
pub const MAX_MIG_PROFILE: usize = 24;

/// How many of the GPU's compute slices a MIG profile gets: the `N` of `Nc.` when the
/// profile names a compute instance, else of `Ng.` (`3g.40gb` has 3, `1c.3g.40gb` 1). `None`
/// when the profile does not start that way.
pub fn mig_compute_slices(profile: &str) -> Option<u32> {
    let (count, rest) = profile.split_once('.')?;
    let n = count
        .strip_suffix('c')
        .or_else(|| count.strip_suffix('g'))?;
    if rest.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok().filter(|&n| n > 0)
}

/// The memory a MIG profile names, GB as the maker prints it (`1g.10gb` has 10,
/// `1g.10gb+me` 10, `1c.3g.40gb` 40). `None` when the profile does not end that way.
pub fn mig_profile_gb(profile: &str) -> Option<u16> {
    let base = profile.split('+').next()?;
    let (_, last) = base.rsplit_once('.')?;
    last.strip_suffix("gb")?.parse().ok()
}

fn ensure_profile(profile: &str) -> Result<(), InvalidMessage> {
    let charset = profile
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'+');
    if !charset || mig_compute_slices(profile).is_none() {
        return Err(InvalidMessage::Malformed {
            field: "gpus.mig.instances.profile",
            reason: "expected a MIG profile such as 1g.10gb or 1c.3g.40gb",
        });
    }
    Ok(())
}

impl Message for Attestation {
    const KIND: MessageKind = MessageKind::Attestation;

    fn check(&self) -> Result<(), InvalidMessage> {
        ensure_nonempty("gpus", &self.gpus)?;
        ensure_unique("gpus.uuid", self.gpus.iter().map(|g| g.uuid))?;
        ensure_unique("gpus.index", self.gpus.iter().map(|g| g.index))?;
        // Every device once: whole GPUs and MIG instances together.
        ensure_unique(
            "gpus.mig.instances.uuid",
            self.gpus.iter().flat_map(|g| {
                std::iter::once(g.uuid).chain(
                    g.mig
                        .iter()
                        .flat_map(|m| m.instances.iter().map(|i| i.uuid)),
                )
            }),
        )?;
        for gpu in self.gpus.iter() {
            if gpu.uuid.is_mig() {
                return Err(InvalidMessage::Malformed {
                    field: "gpus.uuid",
                    reason: "a GPU is named GPU-..., not MIG-...",
                });
            }
            if gpu.name.is_empty() {
                return Err(InvalidMessage::Empty { field: "gpus.name" });
            }
            ensure_nonzero("gpus.memory_total_bytes", gpu.memory_total_bytes)?;
            if let Some(mig) = &gpu.mig {
                if !mig.enabled && !mig.instances.is_empty() {
                    return Err(InvalidMessage::Inconsistent {
                        field: "gpus.mig.instances",
                        reason: "MIG instances listed while MIG mode is disabled",
                    });
                }
                for instance in mig.instances.iter() {
                    if !instance.uuid.is_mig() {
                        return Err(InvalidMessage::Malformed {
                            field: "gpus.mig.instances.uuid",
                            reason: "a MIG instance is named MIG-...",
                        });
                    }
                    ensure_profile(&instance.profile)?;
                    ensure_nonzero(
                        "gpus.mig.instances.memory_total_bytes",
                        instance.memory_total_bytes,
                    )?;
                }
                let total: u64 = mig
                    .instances
                    .iter()
                    .map(|i| i.memory_total_bytes)
                    .fold(0, u64::saturating_add);
                if total > gpu.memory_total_bytes {
                    return Err(InvalidMessage::Inconsistent {
                        field: "gpus.mig.instances",
                        reason: "MIG instances hold more memory than the GPU",
                    });
                }
            }
        }
        Ok(())
    }

    fn created_at(&self) -> Timestamp {
        self.created_at
    }
}
