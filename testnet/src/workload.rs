//! The testnet's workload-plane round: a renter builds an image of its own, hands it over
//! as a `docker save` archive (removed from Docker first, so no host has it), rents with it
//! and a workspace, pushes an input file, lets the workload turn it into a result, fetches
//! the result after the workload exits, and checks it; then nothing may be left: no
//! workspace, no renter image.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use bollard::body_full;
use bollard::query_parameters::BuildImageOptionsBuilder;
use futures::StreamExt;
use gpux_client::ApiClient;
use gpux_node::executor::Executor;
use gpux_protocol::ImageDigest;

use crate::harness::{self, wait};

/// What the round did, for the report (flattened into it).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct PlaneFigures {
    /// Renter images staged on a host that lacked them.
    pub images_pushed: usize,
    /// Bytes those stagings sent.
    pub image_bytes_sent: u64,
    /// Files `gpux cp` moved in and out of workspaces.
    pub files_copied: u64,
    /// Bytes those files held.
    pub bytes_copied: u64,
    /// Lease workspaces still on a host after the run and its retention (must be 0).
    pub workspaces_left: usize,
    /// Renter images still in Docker after their leases (must be 0).
    pub renter_images_left: usize,
}

/// The job the renter's image runs: it waits for its input, writes the result, exits.
const JOB: &str = "#!/bin/sh\n\
i=0\n\
while [ ! -f /workspace/input.txt ]; do i=$((i+1)); [ $i -gt 600 ] && exit 2; sleep 0.1; done\n\
tr a-z A-Z < /workspace/input.txt > /workspace/result.txt\n";

/// Input lines for the job.
const INPUT_LINES: usize = 20_000;

/// The plane's rounds with `renter`: its own image and files ([`round`]), then an image from
/// a registry and OpenSSH ([`crate::access::round`]); figures and errors into `report`.
pub(crate) fn rounds(
    renter: &harness::Node,
    host_dirs: &[std::path::PathBuf],
    (image, work): (&str, &Path),
    report: &mut crate::Report,
    progress: &dyn Fn(&str),
) {
    progress("workload plane: renter-0 brings its own image and data");
    match round(renter, host_dirs, image, work, progress) {
        Ok(f) => {
            report.plane = f;
            if f.workspaces_left > 0 || f.renter_images_left > 0 {
                report.errors.push(format!(
                    "left behind: {} workspaces, {} renter images",
                    f.workspaces_left, f.renter_images_left
                ));
            }
        }
        Err(e) => report.errors.push(format!("workload plane: {e:#}")),
    }
    progress("access: an image from a registry, and OpenSSH into its lease");
    match crate::access::round(renter, image, work, progress) {
        Ok(f) => report.access = f,
        Err(e) => report.errors.push(format!("access: {e:#}")),
    }
}

/// Runs the round with `renter`, on hosts whose data directories are `host_dirs`.
pub(crate) fn round(
    renter: &harness::Node,
    host_dirs: &[std::path::PathBuf],
    base_image: &str,
    work: &Path,
    progress: &dyn Fn(&str),
) -> anyhow::Result<PlaneFigures> {
    let mut figures = PlaneFigures::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting an async runtime")?;
    let exec = rt.block_on(Executor::connect("gpux-testnet"))?;
    let archive = work.join("renter-image.tar");
    let image = rt.block_on(async {
        let image = build(&exec, base_image).await?;
        exec.save_image(&image, &archive).await?;
        exec.remove_image(&image).await?;
        anyhow::Ok(image)
    })?;
    if rt.block_on(exec.diff_ids(&image))?.is_some() {
        bail!("the renter's image {image} is still in Docker after its removal");
    }
    progress(&format!(
        "renter image {image} built, saved to an archive and removed from Docker: no host has it"
    ));

    let api = ApiClient::for_data_dir(&renter.dir)?;
    let rented = api.rent(&gpux_api::RentRequest {
        query: String::new(),
        gpus: 1,
        max_price: "10".into(),
        duration_s: 120,
        image: None,
        image_archive: Some(archive.display().to_string()),
        cache_image: false,
        command: Vec::new(),
        env: Default::default(),
        network: false,
        disk_bytes: Some(64 << 20),
        retain_s: Some(20),
        spot: false,
        window: None,
        ..Default::default()
    })?;
    let staged = rented.staged.clone().context("the rent staged no image")?;
    figures.images_pushed = 1;
    figures.image_bytes_sent = staged.bytes_sent;
    progress(&format!(
        "staged on {}: {} of {} layers, {} bytes sent; lease {}{}",
        rented.host,
        staged.layers_sent,
        staged.layers,
        staged.bytes_sent,
        rented.lease,
        rented
            .retention
            .as_ref()
            .map_or(String::new(), |kept| format!(
                "; its workspace kept {} s for {} credits",
                kept.retain_s, kept.charge
            ))
    ));

    let input = work.join("input.txt");
    let text: String = (0..INPUT_LINES)
        .map(|i| format!("line {i} of the renter's input\n"))
        .collect();
    std::fs::write(&input, &text)?;
    let remote = |name: &str| format!("{}:/workspace/{name}", rented.lease);
    let copied = cp(renter, &input.display().to_string(), &remote("input.txt"))?;
    figures.files_copied += copied.0;
    figures.bytes_copied += copied.1;

    let ended = wait(Duration::from_secs(60), || {
        api.leases().is_ok_and(|ls| {
            ls.iter()
                .any(|l| l.lease == rented.lease && matches!(&*l.phase, "ended" | "settled"))
        })
    });
    if !ended {
        bail!("the workload did not exit within 60 s");
    }
    let result = work.join("result.txt");
    let copied = cp(renter, &remote("result.txt"), &result.display().to_string())?;
    figures.files_copied += copied.0;
    figures.bytes_copied += copied.1;
    if std::fs::read_to_string(&result)? != text.to_uppercase() {
        bail!("the result fetched is not the workload's output for the input pushed");
    }
    progress("input pushed, result fetched after the workload exited, and checked");

    let lease = rented.lease.clone();
    let workspaces = || {
        host_dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d.join("workspaces")).ok())
            .flat_map(|entries| entries.flatten())
            .filter(|e| e.file_name().to_string_lossy() == lease)
            .count()
    };
    wait(Duration::from_secs(40), || workspaces() == 0);
    figures.workspaces_left = workspaces();
    let image_left = || {
        rt.block_on(exec.diff_ids(&image))
            .is_ok_and(|d| d.is_some())
    };
    wait(Duration::from_secs(30), || !image_left());
    figures.renter_images_left = usize::from(image_left());
    Ok(figures)
}

/// `gpux cp` as the renter; (files, bytes) from its summary.
pub(crate) fn cp(renter: &harness::Node, from: &str, to: &str) -> anyhow::Result<(u64, u64)> {
    let out = renter
        .gpux_command(&["cp", from, to, "--json"])
        .output()
        .context("running gpux cp")?;
    if !out.status.success() {
        bail!(
            "gpux cp {from} {to}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let n = |k: &str| {
        report
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    Ok((n("files"), n("bytes")))
}

/// Builds the renter's image: the workload image plus the job, as its command.
async fn build(exec: &Executor, base: &str) -> anyhow::Result<ImageDigest> {
    let dockerfile = format!("FROM {base}\nCOPY job.sh /job.sh\nCMD [\"sh\", \"/job.sh\"]\n");
    let mut context = tar::Builder::new(Vec::new());
    for (name, body) in [
        ("Dockerfile", dockerfile.as_bytes()),
        ("job.sh", JOB.as_bytes()),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o755);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        context.append_data(&mut header, name, body)?;
    }
    let context = context.into_inner()?;
    let options = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .rm(true)
        .forcerm(true)
        .build();
    let mut stream = exec
        .docker()
        .build_image(options, None, Some(body_full(context.into())));
    let mut id = None;
    while let Some(item) = stream.next().await {
        let info = item.context("building the renter's image")?;
        if let Some(found) = info.aux.and_then(|aux| aux.id) {
            id = Some(found);
        }
    }
    id.context("the build reported no image id")?
        .parse()
        .map_err(|e| anyhow::anyhow!("the build's image id: {e}"))
}

/// Erases the workspaces the hosts still keep when the run stops them (a lease's workspace
/// outlives its work for its retention window, and a stopped host keeps it mounted for its
/// restart); the run owns those hosts and its data dirs go. Returns how many there were.
pub(crate) fn erase_retained(host_dirs: &[std::path::PathBuf]) -> anyhow::Result<usize> {
    crate::block_on(async {
        let mut n = 0;
        for dir in host_dirs {
            let root = dir.join("workspaces");
            let Ok(entries) = std::fs::read_dir(&root) else {
                continue;
            };
            let workspaces = gpux_node::executor::Workspaces::new(root);
            for entry in entries.flatten() {
                let lease = entry.file_name().to_string_lossy().into_owned();
                workspaces
                    .remove(&lease)
                    .await
                    .with_context(|| format!("erasing the workspace of lease {lease}"))?;
                n += 1;
            }
        }
        Ok(n)
    })
}
