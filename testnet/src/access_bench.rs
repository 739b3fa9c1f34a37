//! Reaching a lease, as a benchmark (`gpux testnet access-bench`): images from a registry
//! and OpenSSH, against what Docker and `gpux`'s own commands take for the same work, in
//! one run on real processes (a ledger, a host with a fake GPU, a renter), the real Docker
//! daemon, a real registry (Debian's `docker-registry` on loopback) and this machine's
//! OpenSSH client.
//!
//! - a cold pull: an image of `layers` layers of incompressible bytes (`image_bytes` in
//!   all) pushed to the registry and removed from Docker; `docker pull` + `docker create`
//!   + `docker start` of it, then (removed again) `gpux rent --image REF` until it runs;
//! - warm: `gpux rent` of it again (the host has it cached), against `docker create` +
//!   `docker start`;
//! - `gpux ssh LEASE -- true`, a whole command from a new process, against `gpux exec
//!   LEASE -- echo`, the same;
//! - `scp` of `copy_bytes` into the workspace and back, against `gpux cp` of the same file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::harness::{BenchNodes, Node, bench_nodes, stop_all};
use crate::plane_bench::{docker, mib_s, noise, percentile, run_ok, settle};
use crate::registry::Registry;

/// What to run.
#[derive(Debug, Clone)]
pub struct AccessBenchConfig {
    /// The `gpux` binary.
    pub gpux: PathBuf,
    /// The pulled image's size, bytes (its layers above the workload image).
    pub image_bytes: u64,
    /// Its layers.
    pub layers: u32,
    /// `ssh` and `exec` samples each.
    pub samples: usize,
    /// Bytes `scp` and `gpux cp` copy.
    pub copy_bytes: u64,
}

/// What came out (times in ms, rates in MiB/s).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AccessBenchReport {
    /// The pulled image's bytes above the workload image.
    pub image_bytes: u64,
    /// Its layers.
    pub layers: u32,
    /// `docker push` of it to the registry (setting up), ms.
    pub push_ms: u64,
    /// `docker pull` + `docker create` + `docker start`, the image in no daemon, ms.
    pub docker_cold_ms: u64,
    /// `gpux rent --image REF` until the container runs, the image in no daemon, ms.
    pub gpux_cold_ms: u64,
    /// Of that, the host's pull, as the host timed it, ms.
    pub gpux_cold_pull_ms: u64,
    /// gpux cold over Docker cold (goal ≤ 1.15).
    pub cold_ratio: f64,
    /// `docker create` + `docker start`, the image present, ms.
    pub docker_warm_ms: u64,
    /// `gpux rent --image REF` with the image cached on the host, ms.
    pub gpux_warm_ms: u64,
    /// gpux warm over Docker warm (goal ≤ 1.3).
    pub warm_ratio: f64,
    /// `gpux ssh LEASE -- true`, each from a new process, ms.
    pub ssh_true_ms_p50: f64,
    /// See `ssh_true_ms_p50`.
    pub ssh_true_ms_p95: f64,
    /// `gpux exec LEASE -- echo x`, each from a new process, ms.
    pub exec_echo_ms_p50: f64,
    /// See `exec_echo_ms_p50`.
    pub exec_echo_ms_p95: f64,
    /// ssh p50 over exec p50 (goal ≤ 2).
    pub ssh_over_exec: f64,
    /// Bytes each copy moved.
    pub copy_bytes: u64,
    /// `scp` into the workspace, MiB/s.
    pub scp_up_mib_s: f64,
    /// `scp` out of it, MiB/s.
    pub scp_down_mib_s: f64,
    /// `gpux cp` into the workspace, MiB/s.
    pub cp_up_mib_s: f64,
    /// `gpux cp` out of it, MiB/s.
    pub cp_down_mib_s: f64,
    /// The slower scp direction over the slower cp direction (goal ≥ 0.7).
    pub scp_over_cp: f64,
}

/// The image's repository in the registry.
const REPO: &str = "gpux-bench/big:1";

/// Runs the benchmark; `progress` hears what it is doing.
pub fn run(
    config: &AccessBenchConfig,
    progress: impl Fn(&str),
) -> anyhow::Result<AccessBenchReport> {
    let image = crate::build_image()?;
    let temp = tempfile::tempdir().context("creating a temporary directory")?;
    let base = temp.path();
    let registry = Registry::start(&base.join("registry"), None)?;
    let mut report = AccessBenchReport {
        image_bytes: config.image_bytes,
        layers: config.layers,
        copy_bytes: config.copy_bytes,
        ..AccessBenchReport::default()
    };
    progress(&format!(
        "building an image of {} layers, {} MiB of random bytes",
        config.layers,
        config.image_bytes >> 20
    ));
    let big = build_big(&image, config, base)?;
    let start = Instant::now();
    let reference = registry.push(&big, REPO)?;
    report.push_ms = ms(start);
    docker(&["rmi", "-f", &big])?;
    progress(&format!(
        "pushed as {reference} in {} ms; removed from Docker",
        report.push_ms
    ));
    let BenchNodes {
        mut ledger,
        mut host,
        mut renter,
    } = bench_nodes(&config.gpux, base, &image)?;
    let measured = measure(config, &renter, &reference, base, &mut report, &progress);
    stop_all([&mut host, &mut renter, &mut ledger], 20);
    let _ = docker(&["rmi", "-f", &reference]);
    measured?;
    Ok(report)
}

fn measure(
    config: &AccessBenchConfig,
    renter: &Node,
    reference: &str,
    base: &Path,
    report: &mut AccessBenchReport,
    progress: &impl Fn(&str),
) -> anyhow::Result<()> {
    // Cold: Docker first, then gpux, each with the image in no daemon.
    let start = Instant::now();
    docker(&["pull", "-q", reference])?;
    let id = docker(&["create", reference, "sleep", "600"])?;
    docker(&["start", &id])?;
    report.docker_cold_ms = ms(start);
    docker(&["rm", "-f", &id])?;
    docker(&["rmi", "-f", reference])?;
    progress(&format!(
        "docker pull + create + start: {} ms",
        report.docker_cold_ms
    ));
    let (lease, took, pulled) = rent(renter, reference, &[])?;
    report.gpux_cold_ms = took;
    report.gpux_cold_pull_ms = pulled.map_or(0, |p| p.pull_ms);
    report.cold_ratio = took as f64 / report.docker_cold_ms.max(1) as f64;
    stop(renter, &lease)?;
    progress(&format!(
        "gpux rent, cold: {took} ms (the host's pull {} ms): {:.2} x Docker",
        report.gpux_cold_pull_ms, report.cold_ratio
    ));
    // Warm: the host has it.
    let (lease, took, _) = rent(renter, reference, &[])?;
    report.gpux_warm_ms = took;
    stop(renter, &lease)?;
    let start = Instant::now();
    let id = docker(&["create", reference, "sleep", "600"])?;
    docker(&["start", &id])?;
    report.docker_warm_ms = ms(start);
    docker(&["rm", "-f", &id])?;
    report.warm_ratio = report.gpux_warm_ms as f64 / report.docker_warm_ms.max(1) as f64;
    progress(&format!(
        "warm: gpux rent {} ms, docker create + start {} ms: {:.2} x",
        report.gpux_warm_ms, report.docker_warm_ms, report.warm_ratio
    ));

    // A lease to reach, with an SSH key and a workspace for the copies.
    let key = crate::access::ssh_key(&renter.dir)?;
    let key_file = base.join("bench_key.pub");
    std::fs::write(&key_file, format!("{key}\n"))?;
    let disk = format!("{}MiB", (config.copy_bytes >> 20) * 22 / 10 + 256);
    let (lease, _, _) = rent(
        renter,
        reference,
        &["--disk", &disk, "--ssh", &key_file.display().to_string()],
    )?;
    let result = reach(config, renter, &lease, base, report, progress);
    stop(renter, &lease)?;
    result
}

/// ssh against exec, scp against cp, on `lease`.
fn reach(
    config: &AccessBenchConfig,
    renter: &Node,
    lease: &str,
    base: &Path,
    report: &mut AccessBenchReport,
    progress: &impl Fn(&str),
) -> anyhow::Result<()> {
    let time = |args: &[&str]| -> anyhow::Result<Duration> {
        let start = Instant::now();
        run_ok(renter, args)?;
        Ok(start.elapsed())
    };
    let millis = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut ssh = Vec::new();
    let mut exec = Vec::new();
    // Alternating, after three of each to warm up.
    for i in 0..config.samples + 3 {
        let s = millis(time(&["ssh", lease, "--", "true"])?);
        let e = millis(time(&["exec", lease, "--", "echo", "x"])?);
        if i >= 3 {
            ssh.push(s);
            exec.push(e);
        }
    }
    ssh.sort_by(f64::total_cmp);
    exec.sort_by(f64::total_cmp);
    report.ssh_true_ms_p50 = percentile(&ssh, 0.5);
    report.ssh_true_ms_p95 = percentile(&ssh, 0.95);
    report.exec_echo_ms_p50 = percentile(&exec, 0.5);
    report.exec_echo_ms_p95 = percentile(&exec, 0.95);
    report.ssh_over_exec = report.ssh_true_ms_p50 / report.exec_echo_ms_p50.max(1e-9);
    progress(&format!(
        "ssh LEASE true p50 {:.1} ms, exec echo p50 {:.1} ms: {:.2} x",
        report.ssh_true_ms_p50, report.exec_echo_ms_p50, report.ssh_over_exec
    ));

    let source = base.join("copy.bin");
    noise(&source, config.copy_bytes)?;
    let config_file = base.join("ssh_config");
    let printed = renter.gpux(&["ssh-config", lease])?;
    std::fs::write(&config_file, &printed.stdout)?;
    let alias = format!("gpux-{}", &lease[..12]);
    let rate = |took: Duration| mib_s(config.copy_bytes, took);
    let scp = |from: &str, to: &str| -> anyhow::Result<Duration> {
        let start = Instant::now();
        let out = Command::new("scp")
            .arg("-q")
            .arg("-F")
            .arg(&config_file)
            .args([from, to])
            .output()
            .context("running scp")?;
        if !out.status.success() {
            bail!("scp: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(start.elapsed())
    };
    let src = source.display().to_string();
    settle();
    report.cp_up_mib_s = rate(time(&["cp", &src, &format!("{lease}:/workspace/cp.bin")])?);
    settle();
    report.scp_up_mib_s = rate(scp(&src, &format!("{alias}:/workspace/scp.bin"))?);
    let (cp_back, scp_back) = (base.join("cp-back.bin"), base.join("scp-back.bin"));
    settle();
    report.cp_down_mib_s = rate(time(&[
        "cp",
        &format!("{lease}:/workspace/cp.bin"),
        &cp_back.display().to_string(),
    ])?);
    settle();
    report.scp_down_mib_s = rate(scp(
        &format!("{alias}:/workspace/scp.bin"),
        &scp_back.display().to_string(),
    )?);
    for back in [&cp_back, &scp_back] {
        if std::fs::metadata(back)?.len() != config.copy_bytes {
            bail!("{} came back short", back.display());
        }
    }
    report.scp_over_cp = report.scp_up_mib_s.min(report.scp_down_mib_s)
        / report.cp_up_mib_s.min(report.cp_down_mib_s).max(1e-9);
    progress(&format!(
        "scp up / down {:.0} / {:.0} MiB/s, gpux cp up / down {:.0} / {:.0} MiB/s: {:.2} x",
        report.scp_up_mib_s,
        report.scp_down_mib_s,
        report.cp_up_mib_s,
        report.cp_down_mib_s,
        report.scp_over_cp
    ));
    Ok(())
}

/// Builds the big image: `layers` layers of random bytes above `base`; its id.
fn build_big(base: &str, config: &AccessBenchConfig, dir: &Path) -> anyhow::Result<String> {
    let context = dir.join("big-image");
    std::fs::create_dir_all(&context)?;
    let per_layer = config.image_bytes / u64::from(config.layers.max(1));
    let mut dockerfile = format!("FROM {base}\nUSER 0\n");
    for i in 0..config.layers {
        dockerfile.push_str(&format!(
            "RUN [\"/bin/busybox\", \"sh\", \"-c\", \"head -c {per_layer} /dev/urandom > /blob{i}\"]\n"
        ));
    }
    dockerfile.push_str("USER 65534:65534\n");
    std::fs::write(context.join("Dockerfile"), dockerfile)?;
    docker(&["build", "-q", &context.display().to_string()])
}

/// `gpux rent` of `reference` (the lease runs `sleep`): the lease, the time until it runs,
/// and what the host pulled.
fn rent(
    renter: &Node,
    reference: &str,
    more: &[&str],
) -> anyhow::Result<(String, u64, Option<gpux_api::PulledImage>)> {
    let mut args = vec![
        "rent",
        "gpu=l4",
        "--max-price",
        "5",
        "--duration",
        "3600",
        "--image",
        reference,
        "--json",
    ];
    args.extend_from_slice(more);
    args.extend_from_slice(&["--", "sleep", "3600"]);
    let start = Instant::now();
    let out = run_ok(renter, &args)?;
    let took = ms(start);
    let rented: gpux_api::Rented = serde_json::from_slice(&out.stdout)?;
    Ok((rented.lease, took, rented.pulled))
}

/// Stops `lease` and waits until its GPU is free again (its offer back in the book).
fn stop(renter: &Node, lease: &str) -> anyhow::Result<()> {
    renter.gpux(&["stop", lease])?;
    let api = renter.api()?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let ended = renter.phase(lease);
        let free = api
            .offers("gpu=l4", 10)
            .is_ok_and(|o| o.iter().any(|h| h.free >= 1));
        if matches!(&*ended, "ended" | "settled") && free {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("lease {lease} did not end, or its GPU did not come back, within 60 s")
}

fn ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}
