//! GPU faults on a host: NVML's Xid errors, watched on a thread of their own. A fatal one
//! (see [`gpux_attestation::fatal_xid`]) ends every lease on that GPU (`gpu-failed`, billed
//! up to the fault), and the GPU is withheld from offers and new leases until
//! `gpux host check` reads it well again. The failed set is stored (flushed), so a restart
//! does not offer a broken GPU.

use std::ops::ControlFlow;
use std::sync::Arc;

use gpux_api::{ApiError, ErrorCode};
use gpux_lease::HostInput;
use gpux_protocol::{GpuUuid, Timestamp};
use tokio::sync::mpsc;

use super::HostRole;
use crate::daemon::Event;

/// Where the failed GPUs are stored: their UUIDs, one per line.
const FAILED_KEY: &str = "host-live/failed-gpus";

/// Watches `probe`'s GPUs for Xid errors on a thread of its own, sending each to the
/// daemon's loop, until the loop is gone. A driver that cannot watch is said in the log.
pub(crate) fn spawn_xid_watch(probe: Arc<gpux_attestation::Probe>, events: mpsc::Sender<Event>) {
    let spawned = std::thread::Builder::new()
        .name("gpux-xid-watch".into())
        .spawn(move || {
            let watched = probe.watch_xids(|event| {
                if events.is_closed() {
                    return ControlFlow::Break(());
                }
                if let Some(e) = event {
                    let fault = Event::GpuFault {
                        uuid: e.uuid,
                        xid: e.xid,
                        at: crate::attest::now(),
                    };
                    if events.blocking_send(fault).is_err() {
                        return ControlFlow::Break(());
                    }
                }
                ControlFlow::Continue(())
            });
            match watched {
                Ok(gpux_attestation::WatchEnd::Stopped) => {}
                Ok(gpux_attestation::WatchEnd::Unsupported) => tracing::warn!(
                    "GPU faults (Xid errors) are not watched: the driver has no NVML events; a failed GPU shows only as its lease's container failing"
                ),
                Err(e) => tracing::warn!("GPU faults (Xid errors) are not watched: {e}"),
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("GPU faults (Xid errors) are not watched: {e}");
    }
}

impl HostRole {
    /// At start: the GPUs an earlier run found failed.
    pub(crate) fn load_failed_gpus(&mut self) {
        match self.state.config(FAILED_KEY) {
            Ok(Some(bytes)) => {
                let mut withheld = self.book.withheld().clone();
                withheld.failed = String::from_utf8_lossy(&bytes)
                    .lines()
                    .filter_map(|l| l.trim().parse::<GpuUuid>().ok())
                    .collect();
                for uuid in &withheld.failed {
                    tracing::warn!(
                        "GPU {uuid} failed before this start: not offered until `gpux host check` reads it well"
                    );
                }
                self.book.set_withheld(withheld);
            }
            Ok(None) => {}
            Err(e) => tracing::error!("cannot read the failed GPUs: {e}"),
        }
    }

    fn store_failed_gpus(&self) -> Result<(), String> {
        let text: String = self
            .book
            .withheld()
            .failed
            .iter()
            .map(|u| format!("{u}\n"))
            .collect();
        self.state
            .set_config(FAILED_KEY, text.as_bytes())
            .map_err(|e| e.to_string())
    }

    /// Xid `xid` on `uuid` at `at`: a fatal one fails the GPU and ends its leases. Returns
    /// whether the offers should be published again.
    pub(crate) fn on_gpu_fault(&mut self, uuid: &str, xid: u64, at: Timestamp) -> bool {
        if !gpux_attestation::fatal_xid(xid) {
            tracing::info!("GPU {uuid}: Xid {xid} (the workload's own fault; the GPU is fine)");
            return false;
        }
        let Ok(gpu) = uuid.parse::<GpuUuid>() else {
            tracing::warn!("Xid {xid} on a GPU whose UUID does not read ({uuid})");
            return false;
        };
        tracing::error!(
            "GPU {gpu}: Xid {xid}; its leases end (gpu-failed) and it is not offered until `gpux host check` reads it well"
        );
        let mut withheld = self.book.withheld().clone();
        let new = withheld.failed.insert(gpu);
        self.book.set_withheld(withheld);
        if new && let Err(e) = self.store_failed_gpus() {
            tracing::error!("cannot store the failed GPU {gpu}: {e}");
        }
        let hit: Vec<_> = self
            .leases
            .iter()
            .filter(|(_, l)| l.request().gpus.iter().any(|d| self.book.on_failed_gpu(d)))
            .map(|(id, _)| *id)
            .collect();
        for lease in hit {
            self.on_input(lease, HostInput::GpuFailed { at });
        }
        true
    }

    /// `gpux host check` read every GPU well: the failed ones are offered again.
    pub(crate) fn clear_failed_gpus(&mut self) -> Result<Vec<String>, ApiError> {
        let mut withheld = self.book.withheld().clone();
        let cleared: Vec<String> = withheld.failed.iter().map(ToString::to_string).collect();
        withheld.failed.clear();
        self.book.set_withheld(withheld);
        self.store_failed_gpus().map_err(|e| {
            ApiError::new(ErrorCode::Internal, format!("storing the failed GPUs: {e}"))
        })?;
        for uuid in &cleared {
            tracing::info!("GPU {uuid} reads well again: offered again");
        }
        self.publish_pending = true;
        Ok(cleared)
    }
}
