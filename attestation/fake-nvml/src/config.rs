//! The fake's configuration: the GPUs it pretends to have.

use std::collections::BTreeSet;

/// The whole file named by `GPUX_FAKE_NVML_CONFIG`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `nvmlSystemGetDriverVersion`.
    #[serde(default = "default_driver")]
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion_v2` (e.g. 12040 for 12.4).
    #[serde(default = "default_cuda")]
    pub cuda_driver_version: i32,
    /// `nvmlSystemGetNVMLVersion`.
    #[serde(default = "default_nvml")]
    pub nvml_version: String,
    /// Confidential computing enabled; absent means the driver does not report it.
    pub confidential_compute: Option<bool>,
    /// The GPUs.
    #[serde(default)]
    pub gpu: Vec<Gpu>,
    /// A TOML file of injected faults, read again whenever it changes (see
    /// [`faults`](crate::faults)); absent: none.
    #[serde(default)]
    pub faults: Option<std::path::PathBuf>,
}

fn default_driver() -> String {
    "550.54.15".into()
}
fn default_cuda() -> i32 {
    12040
}
fn default_nvml() -> String {
    "12.550.54.15".into()
}

/// One `[[gpu]]` table.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Model name.
    pub name: String,
    /// `GPU-...`.
    pub uuid: String,
    /// Total memory, bytes.
    pub memory_total_bytes: u64,
    /// `[major, minor]`.
    pub compute_capability: [i32; 2],
    /// Board serial.
    #[serde(default = "default_serial")]
    pub serial: String,
    /// Board part number.
    #[serde(default = "default_part")]
    pub board_part_number: String,
    /// Maximum PCIe generation.
    #[serde(default = "default_gen")]
    pub pcie_max_gen: u32,
    /// Maximum PCIe width.
    #[serde(default = "default_width")]
    pub pcie_max_width: u32,
    /// Current PCIe generation.
    #[serde(default = "default_gen")]
    pub pcie_gen: u32,
    /// Current PCIe width.
    #[serde(default = "default_width")]
    pub pcie_width: u32,
    /// Enforced power limit, mW.
    #[serde(default = "default_power")]
    pub power_limit_mw: u32,
    /// Maximum SM clock, MHz.
    #[serde(default = "default_sm")]
    pub max_sm_clock_mhz: u32,
    /// Maximum memory clock, MHz.
    #[serde(default = "default_mem")]
    pub max_memory_clock_mhz: u32,
    /// ECC enabled.
    #[serde(default = "yes")]
    pub ecc_enabled: bool,
    /// Aggregate corrected ECC errors.
    #[serde(default)]
    pub ecc_corrected: u64,
    /// Aggregate uncorrected ECC errors.
    #[serde(default)]
    pub ecc_uncorrected: u64,
    /// MIG mode enabled.
    #[serde(default)]
    pub mig_enabled: bool,
    /// MIG devices.
    #[serde(default)]
    pub mig: Vec<Mig>,
    /// The model this fake GPU really is, when `name` is a disguise (an A40 sold as an
    /// A100): the driver answers with `name`, and a host's challenge prover answers with
    /// this model's memory and rates (`gpux_attestation::spec::Disguise`).
    #[serde(default)]
    pub really: Option<String>,
    /// GPU utilisation, percent.
    #[serde(default)]
    pub utilization_gpu: u32,
    /// Memory in use, bytes (at most what is not reserved).
    #[serde(default)]
    pub memory_used_bytes: u64,
    /// GPU temperature, °C (varies by `vary_percent`).
    #[serde(default = "default_temperature")]
    pub temperature_c: u32,
    /// Power draw, mW (varies by `vary_percent`; the energy counter integrates it).
    #[serde(default = "default_power_usage")]
    pub power_usage_mw: u32,
    /// PCIe transmit throughput, KB/s (varies by `vary_percent`).
    #[serde(default = "default_pcie_tx")]
    pub pcie_tx_kbps: u32,
    /// PCIe receive throughput, KB/s (varies by `vary_percent`).
    #[serde(default = "default_pcie_rx")]
    pub pcie_rx_kbps: u32,
    /// How far temperature, power and PCIe throughput swing around their values, percent,
    /// over a 60 s period (0: constant).
    #[serde(default = "default_vary")]
    pub vary_percent: u32,
    /// Fields that answer NOT_SUPPORTED: any of `serial`, `board_part_number`, `pcie`,
    /// `power_limit`, `clocks`, `ecc`, `mig`, `utilization`, `temperature`, `power`,
    /// `energy`, `pcie_throughput`.
    #[serde(default)]
    pub unsupported: BTreeSet<String>,
    /// Fields that answer UNKNOWN (a driver error), same names plus `name`, `uuid`, `memory`,
    /// `compute_capability`.
    #[serde(default)]
    pub failing: BTreeSet<String>,
}

fn default_serial() -> String {
    "1650000000000".into()
}
fn default_part() -> String {
    "900-2G000-0000-000".into()
}
fn default_gen() -> u32 {
    4
}
fn default_width() -> u32 {
    16
}
fn default_power() -> u32 {
    300_000
}
fn default_sm() -> u32 {
    1980
}
fn default_mem() -> u32 {
    1593
}
fn yes() -> bool {
    true
}
fn default_temperature() -> u32 {
    45
}
fn default_power_usage() -> u32 {
    70_000
}
fn default_pcie_tx() -> u32 {
    2_000
}
fn default_pcie_rx() -> u32 {
    8_000
}
fn default_vary() -> u32 {
    10
}

/// One MIG device.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mig {
    /// `MIG-...`.
    pub uuid: String,
    /// The profile (`1g.10gb`): the MIG device's name is the GPU's, then ` MIG ` and this.
    pub profile: String,
    /// Memory, bytes.
    pub memory_total_bytes: u64,
}

/// Reads and parses the file named by `GPUX_FAKE_NVML_CONFIG`.
pub fn load() -> Result<Config, String> {
    let path = std::env::var_os("GPUX_FAKE_NVML_CONFIG")
        .ok_or("GPUX_FAKE_NVML_CONFIG is not set; it must name a TOML file of [[gpu]] tables")?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.to_string_lossy()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.to_string_lossy()))
}
