//! GPU faults as NVML reports them: Xid critical errors, read from an NVML event set.
//!
//! NVIDIA's Xid catalogue names the errors after which a GPU (or the work on it) cannot be
//! trusted: [`fatal_xid`] is that list. A host ends the leases on a GPU that reports one
//! and stops offering the GPU until `gpux host check` passes again (docs/host.md).

use std::ops::ControlFlow;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

use crate::{Probe, ProbeError};

/// One Xid error on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// The GPU's UUID (as read when the watch began).
    pub uuid: String,
    /// The Xid (999: the driver did not say which).
    pub xid: u64,
}

/// How a watch of Xid errors ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// Its caller said break.
    Stopped,
    /// The driver has no NVML events (WSL's, for one): nothing was watched.
    Unsupported,
}

/// Whether Xid `xid` leaves the GPU unfit for the lease it ran: 48 (double-bit ECC error),
/// 62 and 119/120 (the GPU's own processor failed or timed out), 64 (a row remapping
/// failed), 74 (an NVLink error), 79 (the GPU fell off the bus), 92 (a high single-bit ECC
/// rate), 94 and 95 (contained and uncontained ECC errors: the work was hit), and 999 (the
/// driver did not say). Others (13, 31, 43, 45: the application's own faults, or a process
/// killed) are the workload's business.
pub const fn fatal_xid(xid: u64) -> bool {
    matches!(xid, 48 | 62 | 64 | 74 | 79 | 92 | 94 | 95 | 119 | 120 | 999)
}

impl Probe {
    /// Watches every GPU for Xid critical errors, calling `on_event` with each (and with
    /// `None` about once a second while none comes) until it says break. Blocking: run it
    /// on a thread of its own. A driver without events (NVML answers not supported) returns
    /// at once with [`WatchEnd::Unsupported`]; one that cannot register a GPU is an error.
    pub fn watch_xids(
        &self,
        mut on_event: impl FnMut(Option<XidEvent>) -> ControlFlow<()>,
    ) -> Result<WatchEnd, ProbeError> {
        let sys = |field, source| ProbeError::System { field, source };
        let nvml = self.nvml();
        let count = nvml.device_count().map_err(|e| sys("GPU count", e))?;
        let mut set = nvml.create_event_set().map_err(|e| sys("event set", e))?;
        let mut uuids = Vec::new();
        for index in 0..count {
            let device = nvml
                .device_by_index(index)
                .map_err(|source| ProbeError::Gpu {
                    index,
                    field: "handle",
                    source,
                })?;
            let uuid = device.uuid().map_err(|source| ProbeError::Gpu {
                index,
                field: "UUID",
                source,
            })?;
            // A raw handle, compared and never used: it names the GPU an event came from.
            #[allow(unsafe_code)]
            // SAFETY: the handle is only compared with the handles of later events.
            let handle = unsafe { device.handle() } as usize;
            set = match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(set) => set,
                Err(e) if matches!(e.error, NvmlError::NotSupported) => {
                    return Ok(WatchEnd::Unsupported);
                }
                Err(e) => {
                    return Err(ProbeError::Gpu {
                        index,
                        field: "Xid events",
                        source: e.error,
                    });
                }
            };
            uuids.push((handle, uuid));
        }
        loop {
            let event = match set.wait(1000) {
                Ok(data) => {
                    #[allow(unsafe_code)]
                    // SAFETY: as above, only compared.
                    let handle = unsafe { data.device.handle() } as usize;
                    let uuid = uuids
                        .iter()
                        .find(|(h, _)| *h == handle)
                        .map(|(_, u)| u.clone());
                    let xid = match data.event_data {
                        Some(XidError::Value(v)) => Some(v),
                        Some(XidError::Unknown) => Some(999),
                        None => None,
                    };
                    let event = uuid.zip(xid).map(|(uuid, xid)| XidEvent { uuid, xid });
                    if let Some(e) = &event {
                        self.saw_xid(&e.uuid, e.xid);
                    }
                    event
                }
                Err(NvmlError::Timeout) => None,
                Err(e) => return Err(sys("Xid events", e)),
            };
            if on_event(event).is_break() {
                return Ok(WatchEnd::Stopped);
            }
        }
    }
}
