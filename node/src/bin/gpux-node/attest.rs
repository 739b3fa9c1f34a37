//! `gpux attest`, `gpux attest verify` and `gpux attest challenge`.

use std::path::Path;

use anyhow::Context;
use gpux_node::attest;

use gpux_client::out;
use gpux_client::print::print_json;

fn print_attestation(
    att: &gpux_protocol::Verified<gpux_protocol::Attestation>,
) -> anyhow::Result<()> {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    out!(
        "attestation {} by {}, driver {}, CUDA {}, {}",
        att.id().short(),
        att.signer().peer_id(),
        att.driver_version,
        or_dash(att.cuda_driver_version.map(|v| v.to_string())),
        attest::format_time(att.created_at)
    )?;
    out!(
        "{:<3} {:<32} {:<41} {:>9} {:>4} {:>6} {:>7} {:>5} {:>4}  verdict",
        "#",
        "name",
        "uuid",
        "memory",
        "cc",
        "pcie",
        "power",
        "ecc",
        "mig"
    )?;
    for g in att.gpus.iter() {
        let pcie = match (g.pcie.max_gen, g.pcie.max_width) {
            (Some(gen_), Some(w)) => format!("{gen_}x{w}"),
            _ => "-".into(),
        };
        let verdict = match gpux_attestation::check_gpu(g) {
            gpux_attestation::Plausibility::Plausible => "plausible".to_string(),
            gpux_attestation::Plausibility::UnknownModel => "unknown model".to_string(),
            gpux_attestation::Plausibility::Implausible(why) => {
                format!("IMPLAUSIBLE: {}", why.reasons.join("; "))
            }
        };
        out!(
            "{:<3} {:<32} {:<41} {:>7.1}Gi {:>4} {:>6} {:>7} {:>5} {:>4}  {}",
            g.index,
            g.name.as_str(),
            g.uuid.to_string(),
            g.memory_total_bytes as f64 / (1u64 << 30) as f64,
            g.compute_capability.to_string(),
            pcie,
            or_dash(g.power_limit_mw.map(|p| format!("{}W", p / 1000))),
            or_dash(
                g.ecc
                    .map(|e| if e.enabled { "on".into() } else { "off".into() })
            ),
            or_dash(g.mig.as_ref().map(|m| if m.enabled {
                format!("{}", m.instances.len())
            } else {
                "off".into()
            })),
            verdict
        )?;
    }
    Ok(())
}

/// Checks a report; true when every check passed.
pub(crate) fn verify(file: &Path, at: Option<&str>) -> anyhow::Result<bool> {
    let text = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin())
            .context("reading the report from standard input")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let at = match at {
        Some(t) => attest::parse_time(t).map_err(anyhow::Error::msg)?,
        None => attest::now(),
    };
    let verdict = attest::verify_report(&text, at, &gpux_protocol::validate::Rules::default());
    for check in &verdict.checks {
        out!(
            "{:<4} {:<13} {}",
            if check.ok { "ok" } else { "FAIL" },
            check.name,
            check.detail
        )?;
    }
    if verdict.passed() {
        out!("report verified")?;
    } else {
        out!("report NOT verified")?;
    }
    Ok(verdict.passed())
}

/// Reads the GPUs, signs what was read and prints it.
pub(crate) fn attest(dir: &Path, nvml_lib: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let (key, created) = gpux_node::init_key(dir)?;
    if created {
        eprintln!("created node key {}", gpux_node::key_path(dir).display());
    }
    let report = attest::attest(&key, nvml_lib, attest::now())?;
    if json {
        print_json(&attest::report_json(&report)).context("printing the report")
    } else {
        print_attestation(&report)
    }
}

/// One GPU's local challenge, for `gpux attest challenge --json`.
#[derive(serde::Serialize)]
struct Challenged {
    uuid: String,
    name: String,
    compute_capability: String,
    memory_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<gpux_attestation::challenge::local::LocalChallenge>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `gpux attest challenge`: the CUDA prover on this machine's GPUs (those in `only`, or
/// all), each product lasting at least `seconds` at its model's reference. `Ok(false)`
/// when any GPU fails.
pub(crate) fn challenge(only: &[String], seconds: f64, json: bool) -> anyhow::Result<bool> {
    use gpux_attestation::challenge::{gpu, local};
    if !(seconds.is_finite() && (0.01..=60.0).contains(&seconds)) {
        anyhow::bail!("--seconds {seconds}: from 0.01 to 60");
    }
    let devices = gpu::devices()?;
    let chosen: Vec<_> = devices
        .into_iter()
        .filter(|d| only.is_empty() || only.iter().any(|u| u.eq_ignore_ascii_case(&d.uuid)))
        .collect();
    if chosen.is_empty() {
        anyhow::bail!("no CUDA device here is among {}", only.join(", "));
    }
    let mut all = Vec::new();
    for info in chosen {
        let spec = gpux_attestation::spec_for_name(&info.name);
        let outcome = gpu::Device::open(&info.uuid).and_then(|device| {
            local::run(&device, spec, std::time::Duration::from_secs_f64(seconds))
        });
        let (result, error) = match outcome {
            Ok(result) => (Some(result), None),
            Err(e) => (None, Some(e.to_string())),
        };
        all.push(Challenged {
            uuid: info.uuid,
            name: info.name,
            compute_capability: format!("{}.{}", info.cc.0, info.cc.1),
            memory_bytes: info.memory_bytes,
            result,
            error,
        });
    }
    let passed = all
        .iter()
        .all(|c| c.result.as_ref().is_some_and(|r| r.passed));
    if json {
        /// `gpux attest challenge --json`.
        #[derive(serde::Serialize)]
        struct Report {
            passed: bool,
            gpus: Vec<Challenged>,
        }
        print_json(&Report { passed, gpus: all })?;
        return Ok(passed);
    }
    for c in &all {
        out!(
            "{} {} (compute capability {})",
            c.uuid,
            c.name,
            c.compute_capability
        )?;
        if let Some(e) = &c.error {
            out!("  failed: {e}")?;
        }
        if let Some(r) = &c.result {
            let line = |what: &str, unit: &str, m: &local::Measured| {
                let against = match (m.reference, m.share) {
                    (Some(r), Some(s)) => {
                        format!(" = {:.0}% of the reference {r:.0} {unit}", s * 100.0)
                    }
                    _ => " (no reference: the model is not in the spec table)".into(),
                };
                let verdict = m
                    .failed
                    .as_deref()
                    .map_or("passed".to_string(), |f| format!("FAILED: {f}"));
                format!(
                    "  {what}: {} in {:.3} s, {:.0} {unit}{against}; {verdict}",
                    m.work, m.seconds, m.rate
                )
            };
            out!("{}", line("memory fill", "GB/s", &r.fill))?;
            out!("{}", line("INT8 product", "Gop/s", &r.product))?;
            out!("  {}", if r.passed { "passed" } else { "FAILED" })?;
        }
    }
    Ok(passed)
}
