//! Injected GPU faults: the TOML file a config's `faults` names, read again whenever it
//! changes, so a test (or `gpux testnet fault`) can break a GPU of a running node.
//!
//! ```toml
//! [[fault]]
//! uuid = "GPU-..."
//! xid = 79               # delivered once to every event set registered for Xid errors
//! ecc_uncorrected = 2    # added to the GPU's aggregate uncorrected ECC count
//! ```
//!
//! An Xid 79 ("GPU has fallen off the bus") also loses the GPU: from then on every call on
//! it but the handle, the name and the UUID answers `NVML_ERROR_GPU_IS_LOST`. (A real driver
//! may refuse those too; gpux names GPUs by the UUIDs it read before.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// One `[[fault]]` table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// The GPU it strikes.
    pub uuid: String,
    /// An Xid error it raises.
    #[serde(default)]
    pub xid: Option<u64>,
    /// Uncorrected ECC errors it adds.
    #[serde(default)]
    pub ecc_uncorrected: u64,
}

/// The Xid of a GPU fallen off the bus.
pub const XID_FALLEN_OFF_THE_BUS: u64 = 79;

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    fault: Vec<Fault>,
}

/// A faults file as last read: its path, the time it was changed then, its faults.
type Read = (PathBuf, Option<SystemTime>, Vec<Fault>);

/// The file's faults as last read.
static CACHE: Mutex<Option<Read>> = Mutex::new(None);

/// The faults in `path` now (none while it does not exist or does not parse: a file being
/// written is read again at the next call).
pub fn current(path: &Path) -> Vec<Fault> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let Ok(mut cache) = CACHE.lock() else {
        return Vec::new();
    };
    if let Some((p, m, faults)) = cache.as_ref()
        && p == path
        && *m == modified
    {
        return faults.clone();
    }
    let faults = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| toml::from_str::<File>(&text).ok())
        .map(|f| f.fault)
        .unwrap_or_default();
    *cache = Some((path.to_path_buf(), modified, faults.clone()));
    faults
}

/// Whether `uuid` has fallen off the bus.
pub fn lost(faults: &[Fault], uuid: &str) -> bool {
    faults
        .iter()
        .any(|f| f.uuid == uuid && f.xid == Some(XID_FALLEN_OFF_THE_BUS))
}

/// The uncorrected ECC errors injected into `uuid`.
pub fn ecc_uncorrected(faults: &[Fault], uuid: &str) -> u64 {
    faults
        .iter()
        .filter(|f| f.uuid == uuid)
        .map(|f| f.ecc_uncorrected)
        .sum()
}

/// One event set: the GPUs registered for Xid errors, and the faults it has delivered (or
/// that were there when they were registered: NVML records no event from before).
#[derive(Debug, Default)]
pub struct EventSet {
    /// GPU indices registered for Xid critical errors.
    pub xid_gpus: BTreeSet<usize>,
    /// Indices into the faults file already delivered or older than the registration.
    pub seen: BTreeSet<usize>,
}

/// Event sets by handle (`index + 1`); a freed set is `None`.
pub static EVENT_SETS: Mutex<Vec<Option<EventSet>>> = Mutex::new(Vec::new());
