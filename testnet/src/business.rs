//! The testnet's hosting round: what a host running a business does while renters' work
//! goes on. One public host changes its price live (the renter's book shows the new price
//! within a gossip round), is stopped with SIGTERM mid-lease and started again from a copy
//! of its binary (an upgrade: the lease's container runs on, receipts resume, the renter
//! sees only a pause), and has an Xid 79 injected on a leased GPU (the lease ends
//! `gpu-failed`, billed up to the fault; the GPU is withheld until it reads well again).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gpux_client::ApiClient;

use crate::harness;
use crate::orders::{lease, wait};

/// What the round measured, for the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HostingFigures {
    /// The host the round ran on.
    pub host: String,
    /// From `gpux host set price` to the renter's book showing the new price, ms.
    pub live_price_ms: u64,
    /// The lease that ran across the host's stop and upgraded start.
    pub restarted_lease: String,
    /// From the SIGTERM to the renter's first acknowledged receipt after the restart, ms.
    pub restart_gap_ms: u64,
    /// The container's start time was the same after the restart (never restarted).
    pub container_kept: bool,
    /// The lease on the GPU that failed, and how it ended.
    pub gpu_failed_lease: String,
    /// From the injected fault to the host's record of the lease's end, ms.
    pub gpu_fault_end_ms: u64,
    /// What that lease paid, micro-credits, and what the time up to the fault was worth.
    pub gpu_failed_charged: u64,
    /// See `gpu_failed_charged`.
    pub gpu_fault_worth: u64,
}

fn now_ms() -> u64 {
    gpux_node::attest::now().0
}

/// A ticking lease of `duration_s` on `host`'s GPUs.
fn rent(api: &ApiClient, host: &str, duration_s: u32) -> anyhow::Result<gpux_api::Rented> {
    Ok(api.rent(&gpux_api::RentRequest {
        query: format!("host={host}"),
        gpus: 1,
        max_price: "10".into(),
        duration_s,
        command: vec![
            "sh".into(),
            "-c".into(),
            "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done".into(),
        ],
        ..Default::default()
    })?)
}

/// The whole GPU a leased device is on: a MIG instance's parent, by the testnet's naming
/// (`MIG-hhhhhhhh-0001-...` is a slice of `GPU-hhhhhhhh-0000-4000-8000-000000000000`).
fn whole_gpu(device: &str) -> String {
    match device.strip_prefix("MIG-") {
        Some(rest) => format!(
            "GPU-{}-0000-4000-8000-000000000000",
            &rest[..8.min(rest.len())]
        ),
        None => device.to_string(),
    }
}

/// Runs the round on `host` (public, its fake driver reading `faults.toml` in its data
/// directory) with the renter whose data directory is `renter`; `gpux` is the binary,
/// copied into the run's directory for the upgrade.
pub(crate) fn round(
    host: &mut harness::Node,
    renter: &Path,
    gpux: &Path,
    progress: &dyn Fn(&str),
) -> anyhow::Result<HostingFigures> {
    let mut f = HostingFigures {
        host: host.name.clone(),
        ..HostingFigures::default()
    };
    let renter_api = ApiClient::for_data_dir(renter)?;
    let host_api = ApiClient::for_data_dir(&host.dir)?;
    // The prices of the host's offers in a book (a MIG slice's is its share of the GPU's).
    let offered = |api: &ApiClient| -> Vec<u64> {
        api.offers(&format!("host={}", host.peer), 5)
            .map(|hits| hits.iter().map(|h| h.price_per_gpu_hour.0).collect())
            .unwrap_or_default()
    };
    wait("the host's offer in the renter's book", 30, || {
        !offered(&renter_api).is_empty()
    })?;

    // A live price change.
    let before = host_api
        .settings()?
        .host
        .context("the host's settings")?
        .price;
    let lowered = format!(
        "{:.2}",
        before.parse::<f64>().context("the host's price")? * 0.9
    );
    let asked = Instant::now();
    host_api.set_setting("price", &lowered)?;
    let want = (lowered.parse::<f64>()? * 1e6).round() as u64;
    wait("the new price in the renter's book", 30, || {
        offered(&renter_api).contains(&want)
    })?;
    f.live_price_ms = asked.elapsed().as_millis() as u64;
    progress(&format!(
        "hosting: {} repriced {before} -> {lowered} credits/h; in the renter's book {} ms later",
        host.name, f.live_price_ms
    ));

    // A restart and an upgrade mid-lease.
    let rented = rent(&renter_api, &host.peer, 20)?;
    f.restarted_lease = rented.lease.clone();
    wait("a receipt acknowledged", 20, || {
        lease(&renter_api, &rented.lease).is_some_and(|l| l.acked_seq >= 1)
    })?;
    let started = lease(&host_api, &rented.lease).and_then(|l| l.started_at);
    // The new binaries (`gpux` and the `gpux-node` it hands `node run` to) sit in the
    // run's directory (removed with it), not beside the old.
    let upgraded = host.dir.with_file_name("upgraded");
    std::fs::create_dir_all(&upgraded).context("a directory for the upgrade")?;
    for name in ["gpux", "gpux-node"] {
        std::fs::copy(gpux.with_file_name(name), upgraded.join(name))
            .with_context(|| format!("copying {name} for the upgrade"))?;
    }
    let acked = lease(&renter_api, &rented.lease).map_or(0, |l| l.acked_seq);
    let stopped = Instant::now();
    host.terminate();
    if !host.reap(Instant::now() + Duration::from_secs(20)) {
        bail!("{} did not stop within 20 s of SIGTERM", host.name);
    }
    host.set_binary(upgraded.join("gpux"));
    host.spawn()?;
    wait("a receipt after the restart", 30, || {
        lease(&renter_api, &rented.lease).is_some_and(|l| l.acked_seq > acked)
    })?;
    f.restart_gap_ms = stopped.elapsed().as_millis() as u64;
    let host_api = ApiClient::for_data_dir(&host.dir)?;
    f.container_kept =
        started.is_some() && lease(&host_api, &rented.lease).and_then(|l| l.started_at) == started;
    progress(&format!(
        "hosting: {} stopped mid-lease and started again from a copy of its binaries; receipts \
         resumed {} ms after the SIGTERM, the container {}",
        host.name,
        f.restart_gap_ms,
        if f.container_kept {
            "never restarted"
        } else {
            "RESTARTED"
        }
    ));

    // It runs to its end (a fault on its GPU would end it too: a MIG slice's GPU is the
    // whole GPU's).
    wait("the restarted lease to end", 40, || {
        lease(&host_api, &f.restarted_lease).is_some_and(|l| l.end.is_some())
    })?;

    // A GPU that falls off the bus under a lease.
    let rented = rent(&renter_api, &host.peer, 60)?;
    f.gpu_failed_lease = rented.lease.clone();
    let device = rented.gpus.first().context("the lease's GPU")?.clone();
    let gpu = whole_gpu(&device);
    wait("the lease running", 20, || {
        lease(&host_api, &rented.lease).is_some_and(|l| l.started_at.is_some())
    })?;
    std::thread::sleep(Duration::from_secs(3));
    let faults = host.dir.join("faults.toml");
    let fault_at = now_ms();
    std::fs::write(&faults, format!("[[fault]]\nuuid = \"{gpu}\"\nxid = 79\n"))?;
    wait("the lease to end gpu-failed", 20, || {
        lease(&host_api, &rented.lease).is_some_and(|l| l.end.as_deref() == Some("gpu-failed"))
    })?;
    f.gpu_fault_end_ms = now_ms().saturating_sub(fault_at);
    wait("the failed lease to settle", 30, || {
        lease(&host_api, &rented.lease).is_some_and(|l| l.settled)
    })?;
    let hosted = lease(&host_api, &rented.lease).context("the failed lease")?;
    f.gpu_failed_charged = hosted.redeemed;
    let ran_ms = fault_at.saturating_sub(hosted.started_at.unwrap_or(fault_at));
    f.gpu_fault_worth = ran_ms / 1000 * hosted.price_per_gpu_hour_micro / 3600;
    let withheld = host_api
        .settings()?
        .host
        .is_some_and(|h| h.failed_gpus.contains(&gpu));
    if !withheld {
        bail!("{gpu} failed and is not withheld");
    }
    progress(&format!(
        "hosting: Xid 79 on {gpu}: lease {} ended gpu-failed {} ms later, paid {} µcr for the \
         time up to the fault (worth {}); the GPU is withheld",
        &rented.lease[..12.min(rented.lease.len())],
        f.gpu_fault_end_ms,
        f.gpu_failed_charged,
        f.gpu_fault_worth
    ));
    // Repaired: the fault gone, the GPU reads well and is offered again (what `gpux host
    // check` tells the node), at the old price.
    std::fs::remove_file(&faults)?;
    host_api.set_setting("failed-gpus", "")?;
    host_api.set_setting("price", &before)?;
    Ok(f)
}
