//! The testnet's access round: a renter rents an image from a registry the run starts (the
//! host pulls it before the lease's clock), then reaches the lease with this machine's
//! OpenSSH client, though the image has no sshd: `ssh` runs a command, `scp` copies a file
//! in and back out.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use gpux_client::ApiClient;

use crate::harness;
use crate::harness::wait;
use crate::registry::Registry;

/// What the round did, for the report (flattened into it).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct AccessFigures {
    /// Images hosts pulled from a registry for leases.
    pub images_pulled: usize,
    /// Their size on the host, bytes.
    pub pull_bytes: u64,
    /// OpenSSH sessions into leases that did what they were asked (`ssh` ran a command,
    /// `scp` copied in, `scp` copied out).
    pub ssh_sessions: usize,
}

/// Runs the round with `renter`; the registry lives (and its storage) under `work`.
pub(crate) fn round(
    renter: &harness::Node,
    base_image: &str,
    work: &Path,
    progress: &dyn Fn(&str),
) -> anyhow::Result<AccessFigures> {
    let mut figures = AccessFigures::default();
    let registry = Registry::start(&work.join("registry"), None)?;
    let reference = registry.push(base_image, "gpux/testnet-job:1")?;
    progress(&format!(
        "registry at {}: the workload image pushed as {reference}",
        registry.addr
    ));
    let key = ssh_key(&renter.dir)?;
    let api = ApiClient::for_data_dir(&renter.dir)?;
    let rented = api.rent(&gpux_api::RentRequest {
        gpus: 1,
        max_price: "10".into(),
        duration_s: 90,
        image: Some(reference.clone()),
        command: vec!["sh".into(), "-c".into(), "sleep 80".into()],
        disk_bytes: Some(16 << 20),
        retain_s: Some(10),
        ssh_keys: vec![key],
        ..Default::default()
    })?;
    let pulled = rented
        .pulled
        .clone()
        .context("the rent pulled no image from the registry")?;
    figures.images_pulled = 1;
    figures.pull_bytes = pulled.bytes;
    progress(&format!(
        "lease {} on {}: {reference} pulled by the host ({} bytes, {} ms{})",
        rented.lease,
        rented.host,
        pulled.bytes,
        pulled.pull_ms,
        if pulled.warm { ", warm" } else { "" }
    ));

    // `ssh` runs a command there (one string: the server's shell reads it, as sshd's does).
    let said = run(renter.gpux_command(&[
        "ssh",
        &rented.lease,
        "--",
        "echo hello from $(hostname) over ssh",
    ]))?;
    if !said.contains("hello from") {
        bail!("gpux ssh printed {said:?}");
    }
    figures.ssh_sessions += 1;
    // `scp` in and out, through the entry `gpux ssh-config` prints.
    let config = work.join("ssh_config");
    std::fs::write(
        &config,
        run(renter.gpux_command(&["ssh-config", &rented.lease]))?,
    )?;
    let alias = format!("gpux-{}", &rented.lease[..12]);
    let sent = work.join("over-ssh.txt");
    let text: String = (0..2000).map(|i| format!("line {i} over scp\n")).collect();
    std::fs::write(&sent, &text)?;
    let back = work.join("over-ssh-back.txt");
    let scp = |from: &str, to: &str| {
        let mut command = Command::new("scp");
        command.arg("-q").arg("-F").arg(&config).args([from, to]);
        run(command)
    };
    scp(
        &sent.display().to_string(),
        &format!("{alias}:/workspace/in.txt"),
    )?;
    figures.ssh_sessions += 1;
    scp(
        &format!("{alias}:/workspace/in.txt"),
        &back.display().to_string(),
    )?;
    figures.ssh_sessions += 1;
    if std::fs::read_to_string(&back)? != text {
        bail!("the file scp brought back is not the one it sent");
    }
    progress("OpenSSH into the lease (no sshd in the image): a command ran, scp in and out");

    api.stop(&rented.lease)?;
    let ended = wait(Duration::from_secs(30), || {
        api.leases().is_ok_and(|ls| {
            ls.iter()
                .any(|l| l.lease == rented.lease && l.end.is_some())
        })
    });
    if !ended {
        bail!("the registry lease did not end within 30 s of its stop");
    }
    Ok(figures)
}

/// The renter's own SSH key (`<data-dir>/ssh/id_ed25519`, where `gpux rent --ssh` makes
/// it, so `gpux ssh` and `gpux ssh-config` use it), made here: its public line.
pub(crate) fn ssh_key(dir: &Path) -> anyhow::Result<String> {
    let key = dir.join("ssh").join("id_ed25519");
    if !key.exists() {
        std::fs::create_dir_all(dir.join("ssh"))?;
        let mut keygen = Command::new("ssh-keygen");
        keygen
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "gpux-testnet", "-f"])
            .arg(&key);
        run(keygen)?;
    }
    let public = std::fs::read_to_string(key.with_extension("pub"))?;
    Ok(public.trim().to_string())
}

/// Runs `command`; its standard output, or why it failed.
fn run(mut command: Command) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
