//! `gpux host check`: what sharing real GPUs needs on this machine, each missing piece
//! named with its fix (docs/host.md). It changes nothing.

use std::path::Path;

use anyhow::bail;
use gpux_node::executor::Executor;

use gpux_client::out;
use gpux_client::print::print_json;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    /// As it should be.
    Ok,
    /// Works, but not as well as it could.
    Warn,
    /// Sharing GPUs needs this fixed.
    Fail,
}

/// One check: what it looked at, what it found, and the fix when it is not ok.
#[derive(Debug, serde::Serialize)]
struct Check {
    check: &'static str,
    status: Status,
    found: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

impl Check {
    fn ok(check: &'static str, found: String) -> Self {
        Self {
            check,
            status: Status::Ok,
            found,
            fix: None,
        }
    }

    fn not(check: &'static str, status: Status, found: String, fix: &str) -> Self {
        Self {
            check,
            status,
            found,
            fix: Some(fix.to_string()),
        }
    }
}

/// The free space a host wants where Docker keeps images and where workspaces go.
const MIN_FREE_BYTES: u64 = 50 << 30;

/// Runs every check; prints them (a table, or JSON with `json`). Fails when any check does.
pub(crate) fn check(dir: &Path, nvml_lib: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let (gpus, attestation) = nvml(nvml_lib);
    let gpus_read_well = gpus.status == Status::Ok;
    let mut checks = vec![gpus];
    let runtime = tokio::runtime::Runtime::new()?;
    let docker_root = runtime.block_on(docker(&mut checks));
    checks.push(disk("free disk (data directory)", dir));
    if let Some(root) = docker_root {
        checks.push(disk("free disk (Docker's images)", &root));
    }
    checks.push(clock());
    // What the offer will say, measured.
    for m in crate::host_measure::measure(dir, attestation.as_ref()) {
        checks.push(match m.warn {
            None => Check::ok(m.what, m.found),
            Some(fix) => Check::not(m.what, Status::Warn, m.found, fix),
        });
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let took_s = started.elapsed().as_secs_f64();
    if json {
        print_json(&serde_json::json!({ "checks": checks, "failed": failed, "took_s": took_s }))?;
    } else {
        for c in &checks {
            let mark = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            out!("{mark}  {:<30} {}", c.check, c.found)?;
            if let Some(fix) = &c.fix {
                out!("      {:<30} fix: {fix}", "")?;
            }
        }
        out!("checked in {took_s:.1} s")?;
    }
    if gpus_read_well {
        offer_again(dir, json)?;
    }
    if failed > 0 {
        bail!(
            "{failed} check(s) failed: this machine cannot share GPUs yet (each FAIL line says what to do)"
        );
    }
    Ok(())
}

/// Every GPU reads well through the driver: a running node offers again the GPUs it
/// withheld after a fault.
fn offer_again(dir: &Path, json: bool) -> anyhow::Result<()> {
    if !gpux_node::node_runs_on(dir).unwrap_or(false) {
        return Ok(());
    }
    let api = gpux_client::ApiClient::for_data_dir(dir)?;
    let failed = api
        .settings()?
        .host
        .map(|h| h.failed_gpus)
        .unwrap_or_default();
    if failed.is_empty() {
        return Ok(());
    }
    api.set_setting("failed-gpus", "")?;
    if !json {
        out!(
            "ok    {:<30} offered again: {}",
            "GPUs withheld after a fault",
            failed.join(", ")
        )?;
    }
    Ok(())
}

/// The driver's check, with the GPUs it read.
fn nvml(lib: Option<&Path>) -> (Check, Option<gpux_protocol::Attestation>) {
    const NAME: &str = "NVIDIA driver (NVML)";
    let probed = gpux_attestation::Probe::open(lib)
        .and_then(|probe| probe.attestation(gpux_node::attest::now()));
    match probed {
        Ok(att) => {
            let gpus: Vec<String> = att
                .gpus
                .iter()
                .map(|g| format!("{} ({})", g.name, g.uuid))
                .collect();
            let check = Check::ok(
                NAME,
                format!(
                    "driver {}, {} GPU(s): {}",
                    att.driver_version,
                    gpus.len(),
                    gpus.join(", ")
                ),
            );
            (check, Some(att))
        }
        Err(e) => (
            Check::not(
                NAME,
                Status::Fail,
                e.to_string(),
                "install the NVIDIA driver (Debian: apt-get install nvidia-driver; `nvidia-smi` \
                 must list the GPUs), or name the library with --nvml-lib",
            ),
            None,
        ),
    }
}

/// The NVIDIA container runtime is registered: does the toolkit reach the driver? Its CLI
/// (`nvidia-container-cli info`, what the runtime runs for each container) lists the GPUs
/// it would hand a container.
fn toolkit_works(runtimes: &str) -> Check {
    const NAME: &str = "NVIDIA container runtime";
    match std::process::Command::new("nvidia-container-cli")
        .arg("info")
        .output()
    {
        Ok(out) if out.status.success() => {
            let gpus = toolkit_gpus(&String::from_utf8_lossy(&out.stdout));
            Check::ok(
                NAME,
                format!(
                    "runtimes: {runtimes}; nvidia-container-cli reaches the driver and would give containers {gpus} GPU(s)"
                ),
            )
        }
        Ok(out) => Check::not(
            NAME,
            Status::Fail,
            format!(
                "registered, but `nvidia-container-cli info` fails: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .next()
                    .unwrap_or("(no message)")
            ),
            "check the NVIDIA driver and the toolkit's configuration (nvidia-ctk), then restart Docker",
        ),
        Err(e) => Check::not(
            NAME,
            Status::Warn,
            format!("registered (runtimes: {runtimes}), but nvidia-container-cli cannot run: {e}"),
            "install the NVIDIA Container Toolkit (nvidia-container-toolkit) in full",
        ),
    }
}

/// How many GPUs `nvidia-container-cli info` lists (a `Device Index:` line each).
fn toolkit_gpus(info: &str) -> usize {
    info.lines()
        .filter(|l| l.trim_start().starts_with("Device Index:"))
        .count()
}

/// The Docker checks; returns where Docker keeps its data, when it says.
async fn docker(checks: &mut Vec<Check>) -> Option<std::path::PathBuf> {
    const NAME: &str = "Docker";
    let exec = match Executor::connect("gpux-host-check").await {
        Ok(exec) => exec,
        Err(e) => {
            checks.push(Check::not(
                NAME,
                Status::Fail,
                e.to_string(),
                "install Docker and start its daemon (apt-get install docker.io), and let \
                 this user reach its socket (the docker group)",
            ));
            return None;
        }
    };
    let facts = match exec.facts().await {
        Ok(facts) => facts,
        Err(e) => {
            checks.push(Check::not(
                NAME,
                Status::Fail,
                e.to_string(),
                "check that the Docker daemon answers (`docker info`)",
            ));
            return None;
        }
    };
    checks.push(Check::ok(
        NAME,
        format!("Docker {} (API {})", facts.version, facts.api_version),
    ));
    let runtimes = facts.runtimes.join(", ");
    checks.push(if facts.runtimes.iter().any(|r| r == "nvidia") {
        toolkit_works(&runtimes)
    } else {
        Check::not(
            "NVIDIA container runtime",
            Status::Fail,
            format!("not registered in Docker (runtimes: {runtimes})"),
            "install the NVIDIA Container Toolkit (nvidia-container-toolkit), run \
             `nvidia-ctk runtime configure --runtime=docker`, then restart Docker",
        )
    });
    checks.push(match facts.cgroup_version {
        Some(2) => Check::ok("cgroups", "v2".into()),
        version => Check::not(
            "cgroups",
            Status::Warn,
            match version {
                Some(v) => format!("v{v}: gpux works (memory, CPU and process limits hold), but cgroup v2 is what current Docker and the NVIDIA toolkit expect"),
                None => "Docker does not say".into(),
            },
            "boot with systemd.unified_cgroup_hierarchy=1 (the default since Debian 11 \
             and Ubuntu 21.10)",
        ),
    });
    checks.push(if exec.relay().is_some() {
        Check::ok("forward relay", "static busybox found".into())
    } else {
        Check::not(
            "forward relay",
            Status::Warn,
            "no static busybox: renters' `gpux forward` into this host is refused".into(),
            "apt-get install busybox-static",
        )
    });
    facts.root_dir
}

fn disk(check: &'static str, path: &Path) -> Check {
    // The nearest directory that exists (a data directory not made yet counts its parent).
    let existing = path.ancestors().find(|p| p.exists()).unwrap_or(path);
    match rustix::fs::statvfs(existing) {
        Ok(st) => {
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            let found = format!(
                "{} free at {}",
                bytesize::ByteSize(free),
                existing.display()
            );
            if free >= MIN_FREE_BYTES {
                Check::ok(check, found)
            } else {
                Check::not(
                    check,
                    Status::Fail,
                    found,
                    "free space, or move it to a larger disk: images and workspaces want at \
                     least 50 GiB",
                )
            }
        }
        Err(e) => Check::not(
            check,
            Status::Fail,
            format!("{}: {e}", existing.display()),
            "check the path",
        ),
    }
}

fn clock() -> Check {
    const NAME: &str = "clock in sync";
    match clock_synchronized() {
        Some(true) => Check::ok(NAME, "the kernel says it is synchronized".into()),
        Some(false) => Check::not(
            NAME,
            Status::Fail,
            "not synchronized: leases, receipts and offers carry times that peers check \
             (30 s of skew is tolerated)"
                .into(),
            "run an NTP client (apt-get install chrony, or systemd-timesyncd)",
        ),
        None => Check::not(
            NAME,
            Status::Warn,
            "the kernel does not say".into(),
            "run an NTP client (apt-get install chrony)",
        ),
    }
}

/// Whether the kernel's clock discipline is synchronized (an NTP client keeps it so):
/// `adjtimex` read-only, which answers `TIME_ERROR` while it is not.
#[allow(unsafe_code)]
fn clock_synchronized() -> Option<bool> {
    // SAFETY: `adjtimex` with `modes` 0 only reads; `buf` is a zeroed, properly aligned
    // `timex` that lives across the call, and the kernel writes only within it.
    let state = unsafe {
        let mut buf: libc::timex = std::mem::zeroed();
        libc::adjtimex(&mut buf)
    };
    match state {
        -1 => None,
        libc::TIME_ERROR => Some(false),
        _ => Some(true),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_toolkit_s_gpus_are_counted_from_its_info() {
        let info = "NVRM version:   550.54.15\nCUDA version:   12.4\n\nDevice Index:   0\nDevice Minor:   0\nModel:          NVIDIA H100 80GB HBM3\n\nDevice Index:   1\nDevice Minor:   1\nModel:          NVIDIA H100 80GB HBM3\n";
        assert_eq!(super::toolkit_gpus(info), 2);
        assert_eq!(super::toolkit_gpus("NVRM version: 550\n"), 0);
    }
}
