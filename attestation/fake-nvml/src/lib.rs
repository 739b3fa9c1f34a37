//! A fake `libnvidia-ml.so` for machines without NVIDIA GPUs.
//!
//! It exports the NVML functions gpux's probe calls (through nvml-wrapper), including
//! `nvmlShutdown` (nvml-wrapper's `Drop` panics without it) and the `_v2` memory-info
//! struct, and answers them from the TOML file named by `GPUX_FAKE_NVML_CONFIG`, read at
//! every `nvmlInit_v2`, so each process (each testnet host) can pretend to have different
//! GPUs. A field listed in a GPU's `unsupported` answers `NVML_ERROR_NOT_SUPPORTED`; one in
//! `failing` answers `NVML_ERROR_UNKNOWN`. Faults (Xid errors, a GPU fallen off the bus,
//! uncorrected ECC errors) are injected at run time through the file the config's `faults`
//! names ([`faults`]). See `docs/attestation.md`.
//!
//! This is test support. gpux uses it only when pointed at it with `--nvml-lib`.
// Exporting a C ABI that fills caller-provided buffers is unsafe by nature; every pointer is
// checked for null and every string write for length before use.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
// The exports are NVML's own API, documented by NVIDIA (nvml.h); the module docs say what
// this fake answers.
#![allow(missing_docs)]

pub mod config;
pub mod faults;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};
use std::io::Write;
use std::sync::Mutex;

use nvml_wrapper_sys::bindings::{
    nvmlClockType_t, nvmlDevice_t, nvmlEccCounterType_t, nvmlEnableState_t, nvmlEventData_t,
    nvmlEventSet_t, nvmlMemory_v2_t, nvmlMemoryErrorType_t, nvmlReturn_t,
    nvmlSystemConfComputeSettings_t, nvmlUtilization_t,
};

use config::{Config, Gpu};

const SUCCESS: nvmlReturn_t = 0;
const UNINITIALIZED: nvmlReturn_t = 1;
const INVALID_ARGUMENT: nvmlReturn_t = 2;
const NOT_SUPPORTED: nvmlReturn_t = 3;
const NOT_FOUND: nvmlReturn_t = 6;
const INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const TIMEOUT: nvmlReturn_t = 10;
const GPU_IS_LOST: nvmlReturn_t = 15;
const UNKNOWN: nvmlReturn_t = 999;

/// The configuration loaded by the last successful `nvmlInit_v2`, and how many inits are
/// outstanding.
static STATE: Mutex<(Option<Config>, u32)> = Mutex::new((None, 0));

fn with_config<T>(f: impl FnOnce(&Config) -> Result<T, nvmlReturn_t>) -> Result<T, nvmlReturn_t> {
    let state = STATE.lock().map_err(|_| UNKNOWN)?;
    match &state.0 {
        Some(config) if state.1 > 0 => f(config),
        _ => Err(UNINITIALIZED),
    }
}

/// Device handles are small integers cast to pointers: GPU `i` is `i + 1`; its MIG device
/// `m` is `(i + 1) << 16 | (m + 1)`. They are never dereferenced.
fn gpu_index(device: nvmlDevice_t) -> Option<(usize, Option<usize>)> {
    let v = device as usize;
    match (v >> 16, v & 0xffff) {
        (0, 0) => None,
        (0, g) => Some((g - 1, None)),
        (g, m) if m > 0 => Some((g - 1, Some(m - 1))),
        _ => None,
    }
}

fn with_gpu<T>(
    device: nvmlDevice_t,
    field: &str,
    f: impl FnOnce(&Gpu) -> Result<T, nvmlReturn_t>,
) -> Result<T, nvmlReturn_t> {
    with_config(|config| {
        let (g, _) = gpu_index(device).ok_or(INVALID_ARGUMENT)?;
        let gpu = config.gpu.get(g).ok_or(INVALID_ARGUMENT)?;
        if gpu.failing.contains(field) {
            return Err(UNKNOWN);
        }
        if gpu.unsupported.contains(field) {
            return Err(NOT_SUPPORTED);
        }
        // A GPU fallen off the bus still has the name and UUID read before.
        if !matches!(field, "name" | "uuid")
            && let Some(path) = &config.faults
            && faults::lost(&faults::current(path), &gpu.uuid)
        {
            return Err(GPU_IS_LOST);
        }
        f(gpu)
    })
}

/// The injected faults now (none without a faults file).
fn injected(config: &Config) -> Vec<faults::Fault> {
    config
        .faults
        .as_deref()
        .map(faults::current)
        .unwrap_or_default()
}

/// Writes `value` through `out`, or answers INVALID_ARGUMENT for a null pointer.
unsafe fn put<T>(out: *mut T, value: T) -> nvmlReturn_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null; the caller provides a valid, aligned pointer as NVML requires.
    unsafe { out.write(value) };
    SUCCESS
}

/// Copies `text` and a NUL into a caller buffer of `length` bytes.
unsafe fn put_str(out: *mut c_char, length: c_uint, text: &str) -> nvmlReturn_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > length as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the buffer holds `length` bytes, and we write `bytes.len() + 1 <= length`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), out, bytes.len());
        out.add(bytes.len()).write(0);
    }
    SUCCESS
}

fn code(r: Result<nvmlReturn_t, nvmlReturn_t>) -> nvmlReturn_t {
    r.unwrap_or_else(|e| e)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    LOADED.get_or_init(std::time::Instant::now);
    match config::load() {
        Ok(config) => match STATE.lock() {
            Ok(mut state) => {
                state.0 = Some(config);
                state.1 += 1;
                SUCCESS
            }
            Err(_) => UNKNOWN,
        },
        Err(message) => {
            // Never panic across the C boundary: a failed write to stderr is ignored.
            let _ = writeln!(std::io::stderr(), "gpux-fake-nvml: {message}");
            UNKNOWN
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    match STATE.lock() {
        Ok(mut state) if state.1 > 0 => {
            state.1 -= 1;
            SUCCESS
        }
        Ok(_) => UNINITIALIZED,
        Err(_) => UNKNOWN,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let text: &'static [u8] = match result {
        SUCCESS => b"Success\0",
        UNINITIALIZED => b"Uninitialized\0",
        INVALID_ARGUMENT => b"Invalid Argument\0",
        NOT_SUPPORTED => b"Not Supported\0",
        NOT_FOUND => b"Not Found\0",
        INSUFFICIENT_SIZE => b"Insufficient Size\0",
        _ => b"Unknown Error\0",
    };
    text.as_ptr().cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller buffer.
    code(with_config(|c| {
        Ok(unsafe { put_str(version, length, &c.driver_version) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller buffer.
    code(with_config(|c| {
        Ok(unsafe { put_str(version, length, &c.nvml_version) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointer.
    code(with_config(|c| {
        Ok(unsafe { put(version, c.cuda_driver_version) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetConfComputeSettings(
    settings: *mut nvmlSystemConfComputeSettings_t,
) -> nvmlReturn_t {
    code(with_config(|c| {
        let enabled = c.confidential_compute.ok_or(NOT_SUPPORTED)?;
        if settings.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null caller struct; only plain integer fields are written.
        unsafe {
            (*settings).environment = 0;
            (*settings).ccFeature = u32::from(enabled);
            (*settings).devToolsMode = 0;
            (*settings).multiGpuMode = 0;
        }
        Ok(SUCCESS)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded caller pointer.
    code(with_config(|c| {
        Ok(unsafe { put(count, c.gpu.len() as c_uint) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    code(with_config(|c| {
        if index as usize >= c.gpu.len() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: forwarded caller pointer; the handle is an opaque integer.
        Ok(unsafe { put(device, (index as usize + 1) as nvmlDevice_t) })
    }))
}

macro_rules! string_field {
    ($fn:ident, $field:literal, |$g:ident| $value:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $fn(
            device: nvmlDevice_t,
            out: *mut c_char,
            length: c_uint,
        ) -> nvmlReturn_t {
            // SAFETY: forwarded caller buffer.
            code(with_gpu(device, $field, |$g| {
                Ok(unsafe { put_str(out, length, $value) })
            }))
        }
    };
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    out: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    code(with_gpu(device, "name", |g| {
        let (_, mig) = gpu_index(device).ok_or(INVALID_ARGUMENT)?;
        // A MIG device is named as the driver names it: the GPU's name, `MIG`, the profile.
        let name = match mig {
            Some(m) => format!(
                "{} MIG {}",
                g.name,
                g.mig.get(m).ok_or(INVALID_ARGUMENT)?.profile
            ),
            None => g.name.clone(),
        };
        // SAFETY: forwarded caller buffer.
        Ok(unsafe { put_str(out, length, &name) })
    }))
}
string_field!(nvmlDeviceGetSerial, "serial", |g| &g.serial);
string_field!(nvmlDeviceGetBoardPartNumber, "board_part_number", |g| &g
    .board_part_number);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    out: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    code(with_gpu(device, "uuid", |g| {
        let (_, mig) = gpu_index(device).ok_or(INVALID_ARGUMENT)?;
        let uuid = match mig {
            Some(m) => &g.mig.get(m).ok_or(INVALID_ARGUMENT)?.uuid,
            None => &g.uuid,
        };
        // SAFETY: forwarded caller buffer.
        Ok(unsafe { put_str(out, length, uuid) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    code(with_gpu(device, "memory", |g| {
        if memory.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let (_, mig) = gpu_index(device).ok_or(INVALID_ARGUMENT)?;
        let total = match mig {
            Some(m) => g.mig.get(m).ok_or(INVALID_ARGUMENT)?.memory_total_bytes,
            None => g.memory_total_bytes,
        };
        // NVML reserves some memory for the driver; report 1% (at most 512 MiB) as such.
        let reserved = (total / 100).min(512 << 20);
        // SAFETY: non-null caller struct; the caller set `version`, which we keep.
        unsafe {
            (*memory).total = total;
            (*memory).reserved = reserved;
            let used = g.memory_used_bytes.min(total - reserved);
            (*memory).used = used;
            (*memory).free = total - reserved - used;
        }
        Ok(SUCCESS)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    code(with_gpu(device, "compute_capability", |g| {
        if major.is_null() || minor.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: both non-null caller pointers.
        unsafe {
            major.write(g.compute_capability[0]);
            minor.write(g.compute_capability[1]);
        }
        Ok(SUCCESS)
    }))
}

macro_rules! uint_field {
    ($fn:ident, $field:literal, |$g:ident| $value:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $fn(device: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
            // SAFETY: forwarded caller pointer.
            code(with_gpu(device, $field, |$g| {
                Ok(unsafe { put(out, $value) })
            }))
        }
    };
}

uint_field!(nvmlDeviceGetMaxPcieLinkGeneration, "pcie", |g| g
    .pcie_max_gen);
uint_field!(nvmlDeviceGetMaxPcieLinkWidth, "pcie", |g| g.pcie_max_width);
uint_field!(nvmlDeviceGetCurrPcieLinkGeneration, "pcie", |g| g.pcie_gen);
uint_field!(nvmlDeviceGetCurrPcieLinkWidth, "pcie", |g| g.pcie_width);
uint_field!(nvmlDeviceGetEnforcedPowerLimit, "power_limit", |g| g
    .power_limit_mw);
uint_field!(nvmlDeviceGetMaxMigDeviceCount, "mig", |g| g.mig.len()
    as c_uint);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    clock: nvmlClockType_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    code(with_gpu(device, "clocks", |g| {
        let value = max_clock(g, clock)?;
        // SAFETY: forwarded caller pointer.
        Ok(unsafe { put(out, value) })
    }))
}

/// A GPU's highest clock of a kind, MHz (kinds: 0 graphics, 1 SM, 2 memory, 3 video).
fn max_clock(g: &Gpu, clock: nvmlClockType_t) -> Result<c_uint, nvmlReturn_t> {
    match clock {
        0 | 1 => Ok(g.max_sm_clock_mhz),
        2 => Ok(g.max_memory_clock_mhz),
        3 => Ok(g.max_sm_clock_mhz / 2),
        _ => Err(INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock: nvmlClockType_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    // The current clocks: the maximum, swung by `vary_percent` below it as a boosting GPU's.
    code(with_gpu(device, "clocks", |g| {
        let max = max_clock(g, clock)?;
        let value = swing(max, g.vary_percent / 2, phase(device)).min(max);
        // SAFETY: forwarded caller pointer.
        Ok(unsafe { put(out, value) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut nvmlEnableState_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    code(with_gpu(device, "ecc", |g| {
        let state = nvmlEnableState_t::from(g.ecc_enabled);
        // SAFETY: forwarded caller pointers.
        match unsafe { put(current, state) } {
            SUCCESS => Ok(unsafe { put(pending, state) }),
            other => Ok(other),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    _counter: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    // Read before `with_gpu`, which holds the state's lock.
    let faults = with_config(|c| Ok(injected(c))).unwrap_or_default();
    code(with_gpu(device, "ecc", |g| {
        let extra = faults::ecc_uncorrected(&faults, &g.uuid);
        let value = match error_type {
            0 => g.ecc_corrected,
            1 => g.ecc_uncorrected + extra,
            _ => return Err(INVALID_ARGUMENT),
        };
        // SAFETY: forwarded caller pointer.
        Ok(unsafe { put(count, value) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    code(with_gpu(device, "mig", |g| {
        let mode = c_uint::from(g.mig_enabled);
        // SAFETY: forwarded caller pointers.
        match unsafe { put(current, mode) } {
            SUCCESS => Ok(unsafe { put(pending, mode) }),
            other => Ok(other),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    code(with_gpu(device, "mig", |g| {
        let (gi, _) = gpu_index(device).ok_or(INVALID_ARGUMENT)?;
        if !g.mig_enabled || index as usize >= g.mig.len() {
            return Err(NOT_FOUND);
        }
        let handle = ((gi + 1) << 16) | (index as usize + 1);
        // SAFETY: forwarded caller pointer; the handle is an opaque integer.
        Ok(unsafe { put(mig, handle as nvmlDevice_t) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    code(with_gpu(device, "utilization", |g| {
        // SAFETY: forwarded caller pointer.
        Ok(unsafe {
            put(
                utilization,
                nvmlUtilization_t {
                    gpu: g.utilization_gpu,
                    memory: g.utilization_gpu / 2,
                },
            )
        })
    }))
}

/// When this library was loaded (the energy counter counts from here, as NVML's from the
/// driver's load).
static LOADED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// `base` swung by `vary` percent around itself over a 60 s period, each GPU in its own
/// phase, so scraped values move as a real GPU's do.
fn swing(base: u32, vary: u32, phase: usize) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let angle = t / 60.0 * std::f64::consts::TAU + phase as f64;
    let factor = 1.0 + f64::from(vary.min(100)) / 100.0 * angle.sin();
    (f64::from(base) * factor).round().max(0.0) as u32
}

fn phase(device: nvmlDevice_t) -> usize {
    gpu_index(device).map_or(0, |(g, _)| g)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvml_wrapper_sys::bindings::nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    code(with_gpu(device, "temperature", |g| {
        // Only the GPU die's sensor (NVML_TEMPERATURE_GPU = 0) exists.
        if sensor != 0 {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: forwarded caller pointer.
        Ok(unsafe { put(temp, swing(g.temperature_c, g.vary_percent, phase(device))) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    code(with_gpu(device, "power", |g| {
        // SAFETY: forwarded caller pointer.
        Ok(unsafe {
            put(
                power,
                swing(g.power_usage_mw, g.vary_percent, phase(device)),
            )
        })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    code(with_gpu(device, "energy", |g| {
        // The base power over the time since the library loaded, mJ: always increasing.
        let since = LOADED.get_or_init(std::time::Instant::now).elapsed();
        let mj = u64::from(g.power_usage_mw) * since.as_millis() as u64 / 1000;
        // SAFETY: forwarded caller pointer.
        Ok(unsafe { put(energy, mj) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: nvml_wrapper_sys::bindings::nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    code(with_gpu(device, "pcie_throughput", |g| {
        // NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1.
        let base = match counter {
            0 => g.pcie_tx_kbps,
            1 => g.pcie_rx_kbps,
            _ => return Err(INVALID_ARGUMENT),
        };
        // SAFETY: forwarded caller pointer.
        Ok(unsafe { put(value, swing(base, g.vary_percent, phase(device))) })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    code(with_config(|_| {
        let mut sets = faults::EVENT_SETS.lock().map_err(|_| UNKNOWN)?;
        sets.push(Some(faults::EventSet::default()));
        // SAFETY: forwarded caller pointer; the handle is an opaque integer.
        Ok(unsafe { put(set, sets.len() as nvmlEventSet_t) })
    }))
}

fn event_set<T>(
    set: nvmlEventSet_t,
    f: impl FnOnce(&mut faults::EventSet) -> Result<T, nvmlReturn_t>,
) -> Result<T, nvmlReturn_t> {
    let mut sets = faults::EVENT_SETS.lock().map_err(|_| UNKNOWN)?;
    let slot = (set as usize).checked_sub(1).ok_or(INVALID_ARGUMENT)?;
    match sets.get_mut(slot) {
        Some(Some(s)) => f(s),
        _ => Err(INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    code(with_gpu(device, "events", |_| {
        let xid = c_ulonglong::from(nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError);
        // SAFETY: forwarded caller pointer.
        Ok(unsafe { put(types, xid) })
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    // Read before `with_gpu`, which holds the state's lock.
    let before = with_config(|c| Ok(injected(c).len())).unwrap_or(0);
    code(with_gpu(device, "events", |_| {
        let (g, _) = gpu_index(device).ok_or(INVALID_ARGUMENT)?;
        let xid = c_ulonglong::from(nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError);
        if types & !xid != 0 {
            return Err(NOT_SUPPORTED);
        }
        event_set(set, |s| {
            s.xid_gpus.insert(g);
            // No event from before the registration is recorded.
            s.seen.extend(0..before);
            Ok(SUCCESS)
        })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    if data.is_null() {
        return INVALID_ARGUMENT;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.into());
    loop {
        let next = with_config(|c| {
            let faults = injected(c);
            event_set(set, |s| {
                for (i, fault) in faults.iter().enumerate() {
                    let Some(xid) = fault.xid else { continue };
                    let Some(g) = c.gpu.iter().position(|g| g.uuid == fault.uuid) else {
                        continue;
                    };
                    if s.xid_gpus.contains(&g) && s.seen.insert(i) {
                        return Ok(Some((g, xid)));
                    }
                }
                Ok(None)
            })
        });
        match next {
            Ok(Some((g, xid))) => {
                let event = nvmlEventData_t {
                    device: (g + 1) as nvmlDevice_t,
                    eventType: nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError.into(),
                    eventData: xid,
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                };
                // SAFETY: non-null; the caller provides a valid, aligned pointer.
                return unsafe { put(data, event) };
            }
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Ok(None) => return TIMEOUT,
            Err(e) => return e,
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    let Ok(mut sets) = faults::EVENT_SETS.lock() else {
        return UNKNOWN;
    };
    match (set as usize)
        .checked_sub(1)
        .and_then(|slot| sets.get_mut(slot))
    {
        Some(slot @ Some(_)) => {
            *slot = None;
            SUCCESS
        }
        _ => INVALID_ARGUMENT,
    }
}
