//! The host's machine: what it has (CPU, memory, the workspace disk's speed, its bandwidth),
//! measured rather than typed in, and the share of it that goes with each GPU it offers
//! (docs/host.md, "What an offer says of the machine").
//!
//! CPU and memory are read from the kernel (`/proc/cpuinfo`, `/proc/meminfo`, the threads
//! this process may run on); the disk's write speed by writing and syncing a file where the
//! workspaces live; the bandwidth by the perf protocol to peers ([`crate::p2p::perf`]). A
//! host may give its leases less than the machine has (`cpus`, `memory` in its settings), or
//! more where a test machine stands in for a bigger one.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpux_protocol::{BoundedString, GpuFamily, Machine, Share};

/// Memory the host keeps for itself unless told otherwise: a tenth of the machine, at least
/// this much.
const HOST_RESERVE_BYTES: u64 = 2 << 30;
/// Bytes written to measure the workspace disk.
const DISK_PROBE_BYTES: usize = 32 << 20;

/// The machine as its host gives it to leases; shared between the host role (which signs
/// offers from it) and the tasks that measure it.
#[derive(Debug, Clone, Default)]
pub struct MachineFacts(Arc<Mutex<Machine>>);

impl MachineFacts {
    /// The machine read from the kernel, with `cpus` threads and `memory_bytes` given to
    /// leases where the host says (by default every thread, and the memory less what the
    /// host keeps: a tenth, at least 2 GiB).
    pub fn read(cpus: Option<u32>, memory_bytes: Option<u64>) -> MachineFacts {
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| cpu_model(&t))
            .unwrap_or_else(|| "unknown".into());
        let (cpu_threads, memory_bytes) = given(cpus, memory_bytes);
        MachineFacts(Arc::new(Mutex::new(Machine {
            cpu_model: BoundedString::new(model).unwrap_or_default(),
            cpu_threads,
            memory_bytes,
            ..Machine::default()
        })))
    }

    /// Gives leases `cpus` threads and `memory_bytes` from now on (`None`: the defaults
    /// [`Self::read`] takes), keeping what was measured (`gpux host set cpus|memory`).
    pub fn set_given(&self, cpus: Option<u32>, memory_bytes: Option<u64>) {
        let (threads, memory) = given(cpus, memory_bytes);
        if let Ok(mut m) = self.0.lock() {
            m.cpu_threads = threads;
            m.memory_bytes = memory;
        }
    }

    /// What is known now (the share is left for [`Self::for_offer`]).
    pub fn snapshot(&self) -> Machine {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Records the workspace disk's measured write speed.
    pub fn set_disk_write_mbps(&self, mbps: u32) {
        if let Ok(mut m) = self.0.lock() {
            m.disk_write_mbps = mbps;
        }
    }

    /// Records the measured bandwidth (Mbit/s up and down).
    pub fn set_bandwidth(&self, up_mbps: u32, down_mbps: u32) {
        if let Ok(mut m) = self.0.lock() {
            m.net_up_mbps = up_mbps;
            m.net_down_mbps = down_mbps;
        }
    }

    /// The machine facts of an offer of `family` devices, each a whole GPU or, with
    /// `profile`, a MIG instance of one, on a machine whose attestation lists `gpus` whole
    /// GPUs: the machine split evenly over the GPUs, a slice taking its profile's share of
    /// its GPU's (as its price does).
    pub fn for_offer(&self, gpus: usize, family: GpuFamily, profile: Option<&str>) -> Machine {
        let m = self.snapshot();
        let mut split = Machine::split_evenly(&m.cpu_model, m.cpu_threads, m.memory_bytes, gpus);
        if let Some((part, of)) = profile.and_then(|p| family.mig_share(p)) {
            let (part, of) = (u64::from(part), u64::from(of.max(1)));
            let cpu = u64::from(split.share.cpu_millis) * part / of;
            split.share = Share {
                cpu_millis: u32::try_from(cpu.max(1)).unwrap_or(u32::MAX),
                memory_bytes: (split.share.memory_bytes * part / of).max(1),
            };
        }
        Machine {
            share: split.share,
            ..m
        }
    }
}

/// Bytes moved each way to measure the bandwidth to one peer.
const BANDWIDTH_PROBE_BYTES: u64 = 4 << 20;
/// Peers the bandwidth is measured to (the best rate each way counts).
const BANDWIDTH_PEERS: usize = 3;
/// How often the bandwidth is measured again.
const BANDWIDTH_EVERY: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// Measures the host's bandwidth with the perf protocol to up to three of `bootstrap` (the
/// network's well-known nodes; any connected peers when it has none), once they are
/// connected and then every six hours, and records the best rate each way in `facts` (the
/// next publication says it). Runs until the node stops.
pub async fn measure_bandwidth(
    net: crate::p2p::Client,
    facts: MachineFacts,
    bootstrap: Vec<libp2p::PeerId>,
) {
    let mut wait = std::time::Duration::from_secs(1);
    loop {
        tokio::time::sleep(wait).await;
        let connected = match net.peers().await {
            Ok(peers) => peers,
            Err(_) => return,
        };
        let peers: Vec<libp2p::PeerId> = if bootstrap.is_empty() {
            connected
        } else {
            connected
                .into_iter()
                .filter(|p| bootstrap.contains(p))
                .collect()
        };
        if peers.is_empty() {
            wait = (wait * 2).min(std::time::Duration::from_secs(60));
            continue;
        }
        let (mut up, mut down) = (0f64, 0f64);
        for peer in peers.into_iter().take(BANDWIDTH_PEERS) {
            match crate::p2p::perf::measure(&net, peer, BANDWIDTH_PROBE_BYTES).await {
                Ok(rates) => {
                    up = up.max(rates.up_bps);
                    down = down.max(rates.down_bps);
                }
                Err(e) => tracing::debug!("measuring the bandwidth: {e}"),
            }
        }
        if up > 0.0 && down > 0.0 {
            let mbps = |bps: f64| (bps / 1e6).round().clamp(1.0, f64::from(u32::MAX)) as u32;
            facts.set_bandwidth(mbps(up), mbps(down));
            tracing::info!(
                "bandwidth to peers: {} Mbit/s up, {} down",
                mbps(up),
                mbps(down)
            );
            wait = BANDWIDTH_EVERY;
        } else {
            wait = std::time::Duration::from_secs(60);
        }
    }
}

/// Measures the write speed of the disk under `dir` (where workspaces live), MB/s: a file of
/// 32 MiB written and synced, then removed. Blocking.
pub fn measure_disk_write(dir: &Path) -> std::io::Result<u32> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(".gpux-disk-probe");
    let block = vec![0x5au8; 1 << 20];
    let started = Instant::now();
    let result = (|| {
        let mut file = std::fs::File::create(&path)?;
        for _ in 0..DISK_PROBE_BYTES / block.len() {
            file.write_all(&block)?;
        }
        file.sync_all()
    })();
    let elapsed = started.elapsed().as_secs_f64().max(1e-6);
    let _ = std::fs::remove_file(&path);
    result?;
    Ok((DISK_PROBE_BYTES as f64 / 1e6 / elapsed)
        .round()
        .min(f64::from(u32::MAX)) as u32)
}

/// The threads and memory leases get: `cpus` and `memory_bytes` where the host says, by
/// default every thread, and the memory less what the host keeps (a tenth, at least 2 GiB).
fn given(cpus: Option<u32>, memory_bytes: Option<u64>) -> (u16, u64) {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_total(&t))
        .unwrap_or(0);
    let memory = memory_bytes.unwrap_or_else(|| {
        total.saturating_sub((total / 10).max(HOST_RESERVE_BYTES).min(total / 2))
    });
    (
        u16::try_from(cpus.unwrap_or(threads).max(1)).unwrap_or(u16::MAX),
        memory.max(1 << 30),
    )
}

/// `MemTotal` of `/proc/meminfo`, bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The first `model name` of `/proc/cpuinfo` (x86), else its `Model` or `CPU part` line
/// (arm), made printable and at most 64 bytes.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    let value = ["model name", "Model", "Hardware"].iter().find_map(|key| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == *key).then(|| v.trim().to_string())
        })
    })?;
    let clean: String = value
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let cut = clean.char_indices().nth(64).map_or(clean.len(), |(i, _)| i);
    (!clean.is_empty()).then(|| clean[..cut].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_s_figures_are_read() {
        let meminfo = "MemTotal:       24578908 kB\nMemFree:        1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_578_908 * 1024));
        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R)   Xeon(R) \u{1b}[31mGold\n";
        assert_eq!(
            cpu_model(cpuinfo).as_deref(),
            Some("Intel(R) Xeon(R) ?[31mGold")
        );
        assert_eq!(
            cpu_model("Model\t: Raspberry Pi 5\n").as_deref(),
            Some("Raspberry Pi 5")
        );
        assert_eq!(cpu_model("processor: 0\n"), None);
    }

    #[test]
    fn the_machine_is_split_evenly_and_a_slice_takes_its_profile_s_part() {
        let facts = MachineFacts::read(Some(32), Some(256 << 30));
        let m = facts.for_offer(8, GpuFamily::classify("NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(m.cpu_threads, 32);
        assert_eq!(m.share.cpu_millis, 4_000);
        assert_eq!(m.share.memory_bytes, 32 << 30);
        // A 3g.40gb slice of an A100 (7 compute slices) takes 3/7 of its GPU's share.
        let slice = facts.for_offer(
            8,
            GpuFamily::classify("NVIDIA A100-SXM4-80GB"),
            Some("3g.40gb"),
        );
        assert_eq!(slice.share.cpu_millis, 4_000 * 3 / 7);
        assert_eq!(slice.share.memory_bytes, (32u64 << 30) * 3 / 7);
        // Defaults: every thread, the memory less the host's reserve.
        let here = MachineFacts::read(None, None).snapshot();
        assert!(here.cpu_threads >= 1);
        assert!(here.memory_bytes >= 1 << 30);
        assert!(!here.cpu_model.is_empty());
    }

    #[test]
    fn the_disk_s_write_speed_is_measured_and_its_file_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mbps = measure_disk_write(dir.path()).unwrap();
        assert!(mbps > 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
