//! The run's figures: what the report reads from the nodes' APIs (leases, charges, double
//! bookings, the isolated network's links) and from `/proc` (CPU, memory).

use std::time::Instant;

use anyhow::Context;
use gpux_client::ApiClient;

use crate::{Isolation, LeaseReport, Report, harness, netns};

/// The Docker daemon's pid, when it runs on this machine (found by name in `/proc`).
pub(crate) fn dockerd_pid() -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "dockerd").then_some(pid)
    })
}

/// CPU time a process has used, seconds (Linux: utime + stime in `/proc/<pid>/stat`).
pub(crate) fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at state, field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(ticks as f64 / 100.0)
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The isolated network's figures: addresses, shaping, and the links' round trips the
/// nodes' pings measured.
pub(crate) fn isolation(
    net: &netns::Network,
    preflight: &str,
    nodes: &[harness::Node],
) -> Isolation {
    let mut rtts: Vec<u64> = nodes
        .iter()
        .filter_map(|n| n.api().ok()?.status().ok())
        .flat_map(|s| s.peer_rtt_ms.into_values())
        .collect();
    rtts.sort_unstable();
    let shaping = net.shaping();
    Isolation {
        addresses: net.addresses(),
        behind_nat: net.behind_nat(),
        subnet: net.subnet(),
        preflight: preflight.to_string(),
        delay_ms: shaping.delay_ms,
        jitter_ms: shaping.jitter_ms,
        loss_pct: shaping.loss_pct,
        rate: shaping.rate.clone(),
        link_rtt_ms_p50: percentile(&rtts, 0.5),
        link_rtt_ms_p95: percentile(&rtts, 0.95),
        link_delay_ms_measured: percentile(&rtts, 0.5) / 2,
        link_rtt_samples: rtts.len(),
        network_left: Vec::new(),
    }
}

/// Per-lease figures from the hosts' records, and receipts acknowledged by the renters.
pub(crate) fn collect_leases(hosts: &[ApiClient], renters: &[ApiClient], report: &mut Report) {
    // How each renter is connected to each host, by renter peer id.
    let links: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> =
        renters
            .iter()
            .filter_map(|r| r.status().ok())
            .map(|s| (s.peer_id, s.peer_links))
            .collect();
    for host in hosts {
        let Ok(leases) = host.leases() else {
            continue;
        };
        let host_peer = host.status().map(|s| s.peer_id).unwrap_or_default();
        for l in leases.iter().filter(|l| l.role == gpux_api::Role::Host) {
            let (Some(start), Some(end)) = (l.started_at, l.finished_at) else {
                continue;
            };
            report.containers_started += 1;
            let connection = links
                .get(&l.renter)
                .and_then(|to| to.get(&host_peer))
                .cloned()
                .unwrap_or_default();
            let across_cut = report.partitions.iter().any(|p| {
                let until = if p.until_ms == 0 {
                    u64::MAX
                } else {
                    p.until_ms
                };
                start < until && end > p.from_ms
            });
            let price = l.price_per_gpu_hour_micro;
            let gpus = l.gpus.len() as u64;
            // A lease its host ended (a stop that ends leases, a failed container or GPU)
            // is billed up to the moment it did, without the minimum (docs/settlement.md).
            let host_ended = matches!(
                l.end.as_deref(),
                Some("host-shutdown" | "container-failed" | "gpu-failed" | "store-failed")
            );
            let billed_end = match l.ended_at {
                Some(ended) if host_ended => end.min(ended),
                _ => end,
            };
            let runtime_s = end.saturating_sub(start) as f64 / 1000.0;
            let billed_run_s = billed_end.saturating_sub(start) as f64 / 1000.0;
            // Spot leases bill no minimum.
            let billed_s = if l.kind == "spot" || host_ended {
                billed_run_s
            } else {
                billed_run_s.max(60.0)
            };
            report.leases_settled += usize::from(l.settled);
            report.leases.push(LeaseReport {
                lease: l.lease.clone(),
                price_per_gpu_hour: price,
                gpus,
                runtime_s,
                charged: l.redeemed,
                expected: price as f64 * gpus as f64 * billed_s / 3600.0
                    + l.retention_charge_micro as f64,
                retention_charge: l.retention_charge_micro,
                kind: l.kind.clone(),
                end_reason: l.end.clone().unwrap_or_default(),
                exit_code: l.exit_code,
                settled: l.settled,
                indirect_across_cut: across_cut && connection != "direct",
                connection,
            });
        }
    }
    for renter in renters {
        let Ok(leases) = renter.leases() else {
            continue;
        };
        report.receipts_acked += leases.iter().map(|l| l.acked_seq).sum::<u64>();
    }
}

/// Resident memory of a process, KiB (Linux: `VmRSS` in `/proc/<pid>/status`).
pub(crate) fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A rent that failed only because every matching GPU is taken: hosts refused because other
/// renters got there first (renters race from the first round on), or, once some leases
/// exist, the renter's view holds nothing free.
pub(crate) fn is_busy_market(code: Option<gpux_api::ErrorCode>, leases_exist: bool) -> bool {
    use gpux_api::ErrorCode;
    matches!(code, Some(ErrorCode::AllTaken))
        || (leases_exist && matches!(code, Some(ErrorCode::NoOffer)))
}

/// The market's figures from every node's status: offers published, gossip judged,
/// propagation delays at the renters.
pub(crate) fn market_figures(hosts: &[ApiClient], renters: &[ApiClient], report: &mut Report) {
    report.offers_published = hosts
        .iter()
        .map(|h| h.status().ok().and_then(|s| s.own_offers).unwrap_or(0))
        .sum();
    let mut delays = Vec::new();
    for c in hosts.iter().chain(renters) {
        if let Ok(status) = c.status() {
            report.rejected_messages += status.gossip_rejected;
            report.over_budget_messages += status.gossip_over_budget;
        }
    }
    for r in renters {
        if let Ok(status) = r.status() {
            delays.extend(status.arrivals_ms);
        }
    }
    delays.sort_unstable();
    report.propagation_samples = delays.len();
    report.propagation_ms_p50 = percentile(&delays, 0.50);
    report.propagation_ms_p95 = percentile(&delays, 0.95);
}

/// GPUs a host booked for two leases at once, over all hosts (from their lease records:
/// leases that held GPUs, each from its booking's start, the acceptance or the end of the
/// notice of the spot leases it preempted, to the end of its work).
pub(crate) fn double_allocations(hosts: &[ApiClient]) -> usize {
    let mut doubles = 0;
    for host in hosts {
        let Ok(leases) = host.leases() else {
            continue;
        };
        let mut windows: Vec<(String, u64, u64)> = Vec::new();
        for l in leases.iter().filter(|l| l.role == gpux_api::Role::Host) {
            // Work that never started held its GPUs only until it was refused.
            let Some(end) = l
                .finished_at
                .or(l.started_at.map(|s| s + u64::from(l.duration_s) * 1000))
            else {
                continue;
            };
            for g in &l.gpus {
                windows.push((g.clone(), l.since.max(l.starts_at), end));
            }
        }
        windows.sort();
        doubles += windows
            .windows(2)
            .filter(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
            .count();
    }
    doubles
}

/// Docker's own time to create and start a container of the workload image (the same
/// hardened spec a lease gets), ms, for `samples` containers, each removed after; the
/// baseline beside `rent_to_running_ms_p50`, measured in the same run.
pub(crate) fn docker_start_ms(image: &str, samples: usize) -> anyhow::Result<Vec<u64>> {
    use gpux_node::executor::{ContainerSpec, Executor, GpuBinding};
    crate::block_on(async {
        let exec = Executor::connect("testnet-baseline").await?;
        let mut times = Vec::new();
        for i in 0..samples {
            let spec = ContainerSpec {
                lease: format!("baseline-{}-{i}", std::process::id()),
                image: image.parse().context("the workload image id")?,
                command: vec!["sh".into(), "-c".into(), "sleep 5".into()],
                env: Vec::new(),
                memory_bytes: 1 << 30,
                cpu_millis: 1000,
                pids: 256,
                scratch_bytes: 1 << 28,
                shm_bytes: 1 << 28,
                network: false,
                gpus: GpuBinding::Fake(Vec::new()),
                workspace: None,
                run_dir: None,
            };
            let started = Instant::now();
            let id = exec.start(&spec).await?;
            times.push(started.elapsed().as_millis() as u64);
            exec.remove(&id).await?;
        }
        times.sort_unstable();
        Ok(times)
    })
}

/// The most work a host may go unpaid for when its renter is cut off, seconds: one receipt
/// interval plus the acknowledgement grace, plus 2 s (the same bound as on loopback).
pub(crate) fn unpaid_bound_s() -> u64 {
    crate::RECEIPT_INTERVAL_S.parse::<u64>().unwrap_or(2)
        + crate::ACK_GRACE_S.parse::<u64>().unwrap_or(5)
        + 2
}

/// Every settled lease charged what its runtime costs (within a second's worth), and a paid
/// lease its kept workspace in full: an error for each that did not. A lease a partition cut
/// from its renter is left to the partition's own check; one that ran over an indirect
/// connection while a partition held is held to `bound_s` of unpaid work.
pub(crate) fn check_charges(report: &mut Report, bound_s: u64) {
    // A lease a partition cut from its renter is paid what the renter acknowledged: its
    // bound is the partition's check.
    let cut: std::collections::BTreeSet<&str> = report
        .partitions
        .iter()
        .filter_map(|p| p.lease.as_deref())
        .collect();
    for l in &report.leases {
        let second = l.price_per_gpu_hour as f64 * l.gpus as f64 / 3600.0;
        if l.settled && l.indirect_across_cut && !cut.contains(l.lease.as_str()) {
            // Paid at least for its runtime less the bound, and never more than its price.
            let unpaid_s = l.runtime_s - l.charged as f64 / second.max(1e-9);
            if unpaid_s > bound_s as f64 || l.charged as f64 > l.expected + second + 1.0 {
                report.errors.push(format!(
                    "lease {} (over a {} connection while a partition held): charged {} for \
                     {:.1} s, {unpaid_s:.1} s unpaid (bound {bound_s} s), {:.0} at most",
                    l.lease,
                    if l.connection.is_empty() {
                        "lost"
                    } else {
                        &l.connection
                    },
                    l.charged,
                    l.runtime_s,
                    l.expected
                ));
            }
        } else if l.settled
            && !cut.contains(l.lease.as_str())
            && (l.charged as f64 - l.expected).abs() > second + 1.0
        {
            report.errors.push(format!(
                "lease {}: charged {} but {:.0} expected",
                l.lease, l.charged, l.expected
            ));
        }
        // A paid lease paid its kept workspace in full (every receipt carries it).
        if l.charged > 0 && l.charged < l.retention_charge {
            report.errors.push(format!(
                "lease {}: charged {}, less than its workspace's retention {}",
                l.lease, l.charged, l.retention_charge
            ));
        }
    }
}

/// Lease containers of the given nodes that still exist.
pub(crate) fn containers_of(peers: &[String]) -> anyhow::Result<usize> {
    crate::block_on(async {
        let mut n = 0;
        for peer in peers {
            let exec = gpux_node::executor::Executor::connect(peer).await?;
            n += exec.containers().await?.len();
        }
        Ok(n)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::LeaseReport;

    /// A settled 1-GPU lease at 3.6 credits per hour (1000 µcr a second) that ran 7 s.
    fn lease(charged: u64, connection: &str, indirect_across_cut: bool) -> LeaseReport {
        LeaseReport {
            lease: "l".into(),
            price_per_gpu_hour: 3_600_000,
            gpus: 1,
            runtime_s: 7.0,
            charged,
            expected: 60_000.0,
            settled: true,
            connection: connection.into(),
            indirect_across_cut,
            ..LeaseReport::default()
        }
    }

    fn errors(l: LeaseReport) -> Vec<String> {
        let mut report = Report {
            leases: vec![l],
            ..Report::default()
        };
        check_charges(&mut report, 9);
        report.errors
    }

    #[test]
    fn a_relayed_lease_across_a_cut_is_held_to_the_bound_and_others_to_the_charge() {
        // Cut off its relay: unpaid for its 7 s, within the 9 s bound.
        assert_eq!(errors(lease(0, "relayed", true)), Vec::<String>::new());
        // Charged more than its price: an error all the same.
        assert_eq!(errors(lease(62_000, "relayed", true)).len(), 1);
        // A direct lease, or one that ran through no partition: the exact charge.
        assert_eq!(errors(lease(0, "direct", false)).len(), 1);
        assert_eq!(
            errors(lease(60_000, "relayed", false)),
            Vec::<String>::new()
        );
        // Longer unpaid than the bound.
        let mut long = lease(0, "relayed", true);
        long.runtime_s = 20.0;
        assert_eq!(errors(long).len(), 1);
    }
}
