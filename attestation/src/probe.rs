//! Reading every GPU through NVML (nvml-wrapper), into an [`Attestation`] body.
//!
//! Fields a GPU or driver does not support (NVML answers `NotSupported`) are recorded as
//! absent. Any other driver error stops the probe with an error that names the GPU and the
//! field: a half-read attestation is never signed. Keep one [`Probe`] per process (the NVML
//! library is initialised once, when it opens, and shut down when it drops).

use std::path::{Path, PathBuf};

use gpux_protocol::{
    Attestation, BoundedString, BoundedVec, ComputeCapability, EccFacts, Ext, GpuFacts, GpuUuid,
    MAX_ATTESTED_GPUS, MAX_MIG_INSTANCES, MigFacts, MigInstance, PcieFacts, Timestamp, Version,
    mig_compute_slices,
};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError};
use nvml_wrapper::error::NvmlError;

/// The NVML library name the driver installs.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// Why probing failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The NVML library could not be loaded: no NVIDIA driver.
    #[error("no NVIDIA driver found ({}): {reason}", .path.display())]
    NoDriver {
        /// The library tried.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library loaded but NVML did not initialise.
    #[error("the NVIDIA driver ({}) did not initialise: {source}", .path.display())]
    Init {
        /// The library.
        path: PathBuf,
        /// NVML's error.
        source: NvmlError,
    },
    /// A system-wide query failed.
    #[error("NVML could not read the {field}: {source}")]
    System {
        /// What was being read.
        field: &'static str,
        /// NVML's error.
        source: NvmlError,
    },
    /// A per-GPU query failed.
    #[error("NVML could not read the {field} of GPU {index}: {source}")]
    Gpu {
        /// The GPU's NVML index.
        index: u32,
        /// What was being read.
        field: &'static str,
        /// NVML's error.
        source: NvmlError,
    },
    /// NVML returned something that is not what it documents.
    #[error("GPU {index} reported an invalid {field}: {value}")]
    Invalid {
        /// The GPU's NVML index.
        index: u32,
        /// The field.
        field: &'static str,
        /// What it said.
        value: String,
    },
    /// NVML returned a system-wide value that is not what it documents.
    #[error("the driver reported an invalid {field}: {value}")]
    SystemInvalid {
        /// The field.
        field: &'static str,
        /// What it said.
        value: String,
    },
    /// No GPU at all.
    #[error("the NVIDIA driver reports no GPU")]
    NoGpu,
    /// More GPUs than one attestation may list.
    #[error("{0} GPUs; one attestation lists at most {MAX_ATTESTED_GPUS}")]
    TooManyGpus(u32),
}

/// A reading of leased GPUs for metering.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// Mean utilisation over the GPUs, permille.
    pub util_permille: u16,
    /// Memory in use on them together, bytes.
    pub memory_used_bytes: u64,
}

/// One GPU's telemetry now, what NVIDIA's DCGM exporter reports of it. A reading the
/// driver does not support is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTelemetry {
    /// NVML's index.
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// The model's name.
    pub name: String,
    /// Utilisation, percent.
    pub util_percent: Option<u32>,
    /// Memory in use, bytes.
    pub memory_used_bytes: u64,
    /// Memory free, bytes.
    pub memory_free_bytes: u64,
    /// Temperature, °C.
    pub temperature_c: Option<u32>,
    /// Power draw, mW.
    pub power_mw: Option<u32>,
    /// Energy since the driver loaded, mJ.
    pub energy_mj: Option<u64>,
    /// PCIe throughput transmitted, KB/s.
    pub pcie_tx_kbps: Option<u32>,
    /// PCIe throughput received, KB/s.
    pub pcie_rx_kbps: Option<u32>,
    /// SM clock now, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock now, MHz.
    pub memory_clock_mhz: Option<u32>,
    /// Corrected (single-bit) ECC errors over the GPU's life.
    pub ecc_corrected: Option<u64>,
    /// Uncorrected (double-bit) ECC errors over the GPU's life.
    pub ecc_uncorrected: Option<u64>,
    /// The last Xid error a [watch](Probe::watch_xids) saw on it (0: none).
    pub last_xid: u64,
    /// The driver answered that the GPU is lost (fallen off the bus): no reading but the
    /// name and UUID read before.
    pub lost: bool,
}

/// An open NVML library.
pub struct Probe {
    nvml: Nvml,
    path: PathBuf,
    /// The last Xid seen on each GPU (by UUID) by [`Probe::watch_xids`].
    last_xid: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    /// Each GPU's UUID and name by NVML index, as first read (a lost GPU answers neither).
    names: std::sync::Mutex<std::collections::BTreeMap<u32, (String, String)>>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").field("path", &self.path).finish()
    }
}

/// Whether an error means "this driver or GPU does not have it": the GPU says so, or the
/// driver predates the function (drivers before R535 lack the confidential-computing call).
fn absent(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound
    )
}

/// `Ok(Some)`, `Ok(None)` when absent, `Err` otherwise.
fn optional<T>(
    r: Result<T, NvmlError>,
    index: u32,
    field: &'static str,
) -> Result<Option<T>, ProbeError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if absent(&e) => Ok(None),
        Err(source) => Err(ProbeError::Gpu {
            index,
            field,
            source,
        }),
    }
}

fn required<T>(r: Result<T, NvmlError>, index: u32, field: &'static str) -> Result<T, ProbeError> {
    r.map_err(|source| ProbeError::Gpu {
        index,
        field,
        source,
    })
}

fn bounded<const N: usize>(
    text: String,
    index: u32,
    field: &'static str,
) -> Result<BoundedString<N>, ProbeError> {
    BoundedString::new(text.clone()).map_err(|_| ProbeError::Invalid {
        index,
        field,
        value: text,
    })
}

fn small(v: u32) -> Option<u8> {
    u8::try_from(v).ok()
}

impl Probe {
    /// Loads and initialises NVML from `lib` (default: the driver's `libnvidia-ml.so.1`).
    pub fn open(lib: Option<&Path>) -> Result<Probe, ProbeError> {
        let path = lib.map_or_else(|| PathBuf::from(DEFAULT_NVML_LIB), Path::to_path_buf);
        let nvml = Nvml::builder()
            .lib_path(path.as_os_str())
            .init()
            .map_err(|e| match e {
                NvmlError::LibloadingError(err) => ProbeError::NoDriver {
                    path: path.clone(),
                    reason: err.to_string(),
                },
                NvmlError::FailedToLoadSymbol(symbol) => ProbeError::NoDriver {
                    path: path.clone(),
                    reason: format!("it lacks {symbol}"),
                },
                source => ProbeError::Init {
                    path: path.clone(),
                    source,
                },
            })?;
        Ok(Probe {
            nvml,
            path,
            last_xid: Default::default(),
            names: Default::default(),
        })
    }

    /// What the GPUs named by `uuids` are doing now, for metering: utilisation averaged over
    /// them (permille) and the memory they use together. A GPU not found is an error.
    pub fn usage(&self, uuids: &[String]) -> Result<GpuUsage, ProbeError> {
        let sys = |field, source| ProbeError::System { field, source };
        let count = self.nvml.device_count().map_err(|e| sys("GPU count", e))?;
        let mut found = 0u64;
        let mut util_sum = 0u64;
        let mut memory_used = 0u64;
        for index in 0..count {
            let device = required(self.nvml.device_by_index(index), index, "handle")?;
            let uuid = required(device.uuid(), index, "UUID")?;
            if !uuids.contains(&uuid) {
                continue;
            }
            found += 1;
            if let Some(u) = optional(device.utilization_rates(), index, "utilization")? {
                util_sum += u64::from(u.gpu.min(100));
            }
            memory_used += required(device.memory_info(), index, "memory")?.used;
        }
        if found != uuids.len() as u64 {
            return Err(ProbeError::NoGpu);
        }
        Ok(GpuUsage {
            util_permille: u16::try_from(util_sum * 10 / found.max(1)).unwrap_or(1000),
            memory_used_bytes: memory_used,
        })
    }

    /// Every GPU's telemetry now (for `/metrics`). A reading the driver does not support is
    /// `None`; a GPU the driver says is lost is marked [`lost`](GpuTelemetry::lost); any
    /// other failure is an error.
    pub fn telemetry(&self) -> Result<Vec<GpuTelemetry>, ProbeError> {
        let sys = |field, source| ProbeError::System { field, source };
        let count = self.nvml.device_count().map_err(|e| sys("GPU count", e))?;
        (0..count)
            .map(|index| match self.read_telemetry(index) {
                Err(ProbeError::Gpu {
                    source: NvmlError::GpuLost,
                    ..
                }) => {
                    let (uuid, name) = self
                        .names
                        .lock()
                        .ok()
                        .and_then(|n| n.get(&index).cloned())
                        .unwrap_or_default();
                    Ok(GpuTelemetry {
                        index,
                        last_xid: self.last_xid(&uuid),
                        uuid,
                        name,
                        util_percent: None,
                        memory_used_bytes: 0,
                        memory_free_bytes: 0,
                        temperature_c: None,
                        power_mw: None,
                        energy_mj: None,
                        pcie_tx_kbps: None,
                        pcie_rx_kbps: None,
                        sm_clock_mhz: None,
                        memory_clock_mhz: None,
                        ecc_corrected: None,
                        ecc_uncorrected: None,
                        lost: true,
                    })
                }
                other => other,
            })
            .collect()
    }

    /// The last Xid a watch saw on `uuid` (0: none).
    fn last_xid(&self, uuid: &str) -> u64 {
        self.last_xid
            .lock()
            .ok()
            .and_then(|m| m.get(uuid).copied())
            .unwrap_or(0)
    }

    /// Records the Xid a watch saw on `uuid`.
    pub(crate) fn saw_xid(&self, uuid: &str, xid: u64) {
        if let Ok(mut m) = self.last_xid.lock() {
            m.insert(uuid.to_string(), xid);
        }
    }

    fn read_telemetry(&self, index: u32) -> Result<GpuTelemetry, ProbeError> {
        use nvml_wrapper::enum_wrappers::device::{PcieUtilCounter, TemperatureSensor};
        let device = required(self.nvml.device_by_index(index), index, "handle")?;
        let uuid = required(device.uuid(), index, "UUID")?;
        let name = required(device.name(), index, "name")?;
        if let Ok(mut names) = self.names.lock() {
            names.entry(index).or_insert((uuid.clone(), name.clone()));
        }
        let memory = required(device.memory_info(), index, "memory")?;
        let ecc = |kind| {
            optional(
                device.total_ecc_errors(kind, EccCounter::Aggregate),
                index,
                "ECC errors",
            )
        };
        Ok(GpuTelemetry {
            index,
            last_xid: self.last_xid(&uuid),
            uuid,
            name,
            util_percent: optional(device.utilization_rates(), index, "utilization")?
                .map(|u| u.gpu.min(100)),
            memory_used_bytes: memory.used,
            memory_free_bytes: memory.free,
            temperature_c: optional(
                device.temperature(TemperatureSensor::Gpu),
                index,
                "temperature",
            )?,
            power_mw: optional(device.power_usage(), index, "power")?,
            energy_mj: optional(device.total_energy_consumption(), index, "energy")?,
            pcie_tx_kbps: optional(
                device.pcie_throughput(PcieUtilCounter::Send),
                index,
                "PCIe throughput",
            )?,
            pcie_rx_kbps: optional(
                device.pcie_throughput(PcieUtilCounter::Receive),
                index,
                "PCIe throughput",
            )?,
            sm_clock_mhz: optional(device.clock_info(Clock::SM), index, "SM clock")?,
            memory_clock_mhz: optional(device.clock_info(Clock::Memory), index, "memory clock")?,
            ecc_corrected: ecc(MemoryError::Corrected)?,
            ecc_uncorrected: ecc(MemoryError::Uncorrected)?,
            lost: false,
        })
    }

    /// The open NVML library.
    pub(crate) fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// The library this probe opened.
    pub fn library(&self) -> &Path {
        &self.path
    }

    /// Reads every GPU. `now` becomes the attestation's `created_at`.
    pub fn attestation(&self, now: Timestamp) -> Result<Attestation, ProbeError> {
        let sys = |field, source| ProbeError::System { field, source };
        let driver = self
            .nvml
            .sys_driver_version()
            .map_err(|e| sys("driver version", e))?;
        let nvml_version = self
            .nvml
            .sys_nvml_version()
            .map_err(|e| sys("NVML version", e))?;
        let cuda = match self.nvml.sys_cuda_driver_version() {
            Ok(v) if v > 0 => Some(Version::new((v / 1000) as u16, ((v % 1000) / 10) as u16, 0)),
            Ok(_) => None,
            Err(e) if absent(&e) => None,
            Err(e) => return Err(sys("CUDA driver version", e)),
        };
        let count = self.nvml.device_count().map_err(|e| sys("GPU count", e))?;
        if count == 0 {
            return Err(ProbeError::NoGpu);
        }
        if count as usize > MAX_ATTESTED_GPUS {
            return Err(ProbeError::TooManyGpus(count));
        }
        // Confidential computing is a system-wide setting: read it once.
        let first = self
            .nvml
            .device_by_index(0)
            .map_err(|source| ProbeError::Gpu {
                index: 0,
                field: "handle",
                source,
            })?;
        let cc = optional(first.is_cc_enabled(), 0, "confidential computing")?;
        let gpus = (0..count)
            .map(|i| self.gpu(i, cc))
            .collect::<Result<Vec<_>, _>>()?;
        let invalid = |field, value: String| ProbeError::SystemInvalid { field, value };
        Ok(Attestation {
            created_at: now,
            driver_version: BoundedString::new(driver.clone())
                .map_err(|_| invalid("driver version", driver))?,
            cuda_driver_version: cuda,
            nvml_version: BoundedString::new(nvml_version.clone())
                .map_err(|_| invalid("NVML version", nvml_version))?,
            gpus: BoundedVec::new(gpus).map_err(|_| ProbeError::TooManyGpus(count))?,
            ext: Ext::new(),
        })
    }

    fn gpu(&self, index: u32, confidential_compute: Option<bool>) -> Result<GpuFacts, ProbeError> {
        let device = required(self.nvml.device_by_index(index), index, "handle")?;
        let name = required(device.name(), index, "name")?;
        let uuid_text = required(device.uuid(), index, "UUID")?;
        let uuid: GpuUuid = uuid_text.parse().map_err(|_| ProbeError::Invalid {
            index,
            field: "UUID",
            value: uuid_text.clone(),
        })?;
        let memory = required(device.memory_info(), index, "memory")?;
        let cc = required(
            device.cuda_compute_capability(),
            index,
            "compute capability",
        )?;
        let compute_capability = match (u8::try_from(cc.major), u8::try_from(cc.minor)) {
            (Ok(major), Ok(minor)) => ComputeCapability::new(major, minor),
            _ => {
                return Err(ProbeError::Invalid {
                    index,
                    field: "compute capability",
                    value: format!("{}.{}", cc.major, cc.minor),
                });
            }
        };
        let serial = optional(device.serial(), index, "serial")?
            .map(|s| bounded(s, index, "serial"))
            .transpose()?;
        let part = optional(device.board_part_number(), index, "board part number")?
            .map(|s| bounded(s, index, "board part number"))
            .transpose()?;
        let pcie = PcieFacts {
            max_gen: optional(device.max_pcie_link_gen(), index, "max PCIe generation")?
                .and_then(small),
            max_width: optional(device.max_pcie_link_width(), index, "max PCIe width")?
                .and_then(small),
            current_gen: optional(device.current_pcie_link_gen(), index, "PCIe generation")?
                .and_then(small),
            current_width: optional(device.current_pcie_link_width(), index, "PCIe width")?
                .and_then(small),
        };
        let ecc = match optional(device.is_ecc_enabled(), index, "ECC mode")? {
            Some(state) => Some(EccFacts {
                enabled: state.currently_enabled,
                corrected_total: optional(
                    device.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate),
                    index,
                    "ECC errors",
                )?,
                uncorrected_total: optional(
                    device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate),
                    index,
                    "ECC errors",
                )?,
            }),
            None => None,
        };
        let mig = match optional(device.mig_mode(), index, "MIG mode")? {
            Some(mode) => {
                let enabled = mode.current == 1;
                let mut instances = Vec::new();
                if enabled {
                    let max = optional(device.mig_device_count(), index, "MIG device count")?
                        .unwrap_or(0);
                    for m in 0..max.min(MAX_MIG_INSTANCES as u32) {
                        let mig = match device.mig_device_by_index(m) {
                            Ok(d) => d,
                            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                            Err(source) => {
                                return Err(ProbeError::Gpu {
                                    index,
                                    field: "MIG device",
                                    source,
                                });
                            }
                        };
                        let text = required(mig.uuid(), index, "MIG UUID")?;
                        let uuid = text
                            .parse::<GpuUuid>()
                            .ok()
                            .filter(GpuUuid::is_mig)
                            .ok_or_else(|| ProbeError::Invalid {
                                index,
                                field: "MIG UUID",
                                value: text.clone(),
                            })?;
                        // The driver names a MIG device `<GPU name> MIG <profile>`.
                        let name = required(mig.name(), index, "MIG name")?;
                        let profile = name
                            .rsplit_once(" MIG ")
                            .map(|(_, p)| p.trim().to_string())
                            .filter(|p| mig_compute_slices(p).is_some())
                            .ok_or_else(|| ProbeError::Invalid {
                                index,
                                field: "MIG profile",
                                value: name.clone(),
                            })?;
                        instances.push(MigInstance {
                            uuid,
                            profile: bounded(profile, index, "MIG profile")?,
                            memory_total_bytes: required(mig.memory_info(), index, "MIG memory")?
                                .total,
                        });
                    }
                }
                Some(MigFacts {
                    enabled,
                    instances: BoundedVec::new(instances).map_err(|_| ProbeError::Invalid {
                        index,
                        field: "MIG devices",
                        value: "too many".into(),
                    })?,
                })
            }
            None => None,
        };
        Ok(GpuFacts {
            index,
            name: bounded(name, index, "name")?,
            uuid,
            serial,
            board_part_number: part,
            memory_total_bytes: memory.total,
            compute_capability,
            pcie,
            power_limit_mw: optional(device.enforced_power_limit(), index, "power limit")?,
            max_sm_clock_mhz: optional(device.max_clock_info(Clock::SM), index, "max SM clock")?,
            max_memory_clock_mhz: optional(
                device.max_clock_info(Clock::Memory),
                index,
                "max memory clock",
            )?,
            ecc,
            mig,
            confidential_compute,
        })
    }
}
