//! Each shared GPU's utilisation over the last hour, for the host's console: sampled every
//! 15 s through NVML (the reading `/metrics` serves), kept in memory (an hour of it).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::metrics::SnapshotRequest;

/// How often the GPUs are read.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(15);
/// Samples kept per GPU: an hour.
const KEEP: usize = 240;

/// (unix ms, utilisation %) samples by GPU UUID.
type Samples = BTreeMap<String, VecDeque<(u64, u32)>>;

/// The samples, shared. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct History(Arc<Mutex<Samples>>);

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, Samples> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn record(&self, at_ms: u64, readings: &[gpux_attestation::GpuTelemetry]) {
        let mut all = self.lock();
        // GPUs no longer read (none, unless the driver changed) go.
        all.retain(|uuid, _| readings.iter().any(|r| &r.uuid == uuid));
        for r in readings {
            let Some(util) = r.util_percent else { continue };
            let samples = all.entry(r.uuid.clone()).or_default();
            if samples.len() == KEEP {
                samples.pop_front();
            }
            samples.push_back((at_ms, util.min(100)));
        }
    }

    /// A GPU's samples, oldest first.
    pub(crate) fn of(&self, uuid: &str) -> Vec<(u64, u32)> {
        self.lock()
            .get(uuid)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Samples a host's GPUs until the node's loop is gone.
    pub(crate) async fn sample(self, snapshots: mpsc::Sender<SnapshotRequest>) {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        loop {
            tick.tick().await;
            let Some((_, readings)) = crate::metrics::take(&snapshots).await else {
                return;
            };
            if let Some((_, readings)) = readings {
                self.record(super::layout::now_ms(), &readings);
            }
        }
    }
}
