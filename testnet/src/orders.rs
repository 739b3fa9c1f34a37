//! The testnet's order-kinds round: a spot lease preempted by an on-demand rent of the
//! same GPU, then a reserved window on it. The spot workload watches for the host's notice
//! in `/run/gpux` and exits on the SIGTERM that follows; the round checks it saw both, that
//! its container was gone by the notice's end, and that the on-demand lease started after
//! it; then that the window, booked ahead, started within 2 s of its start.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gpux_client::ApiClient;

use crate::harness;

/// What the round did, for the report (flattened into it).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct OrderFigures {
    /// Spot leases preempted (their notice checked by the renter, the workload gone by its
    /// end).
    pub spot_preemptions: usize,
    /// Of those, the workloads that saw the notice file before their SIGTERM.
    pub spot_notices_seen: usize,
    /// Reserved windows booked ahead whose container started within 2 s of the window's
    /// start and stopped by its end.
    pub reserved_started_on_time: usize,
    /// Spot leases rented with `--resume` whose work was rented again, and ran, after their
    /// preemption.
    pub resumed_leases: usize,
    /// Group orders placed over several hosts and started together.
    pub groups: usize,
    /// Leases of a MIG slice whose container was given exactly that slice.
    pub mig_leases: usize,
    /// Performance challenges passed before the work (the honest host's).
    pub challenges_passed: usize,
    /// Challenges passed again while the lease ran (`gpux challenge`, the workload paused).
    pub challenges_in_lease_passed: usize,
    /// Performance challenges failed: hosts caught claiming a faster model than their
    /// prover sustains (and paid nothing).
    pub challenges_failed: usize,
}

/// The CPU prover's rate on this machine, Gop/s: the best of five products of the shape
/// the testnet's challenges use. The fake GPUs' challenge references are calibrated against it
/// in the same run; the best, not the median, because a busy machine (CI runs tests side by
/// side) only ever slows a sample, and a rate measured low would let a host whose claim is a
/// fixed multiple of it pass.
pub fn cpu_prover_gops() -> f64 {
    use gpux_attestation::challenge;
    // A quarter of a second's work or so, like the challenges renters size.
    let Ok(shape) = challenge::Shape::new(1024, 1024, 256) else {
        return 0.0;
    };
    (0..5u8)
        .map(|i| {
            let proof = challenge::prove_cpu(&[i; 32], shape);
            shape.operations() / proof.elapsed.as_secs_f64().max(1e-9) / 1e9
        })
        .fold(0.0, f64::max)
}

/// The CPU fill's bandwidth on this machine, GB/s (the fill's traffic over its time): the
/// best of three fills of 16 MiB, for the same reason as [`cpu_prover_gops`].
pub fn cpu_fill_gbs() -> f64 {
    use gpux_attestation::challenge::fill;
    let shape = fill::FillShape::for_bytes(16 << 20);
    (0..3u8)
        .map(|i| {
            let filled = fill::fill_cpu(&[i; 32], shape, u64::MAX);
            shape.traffic() / filled.elapsed.as_secs_f64().max(1e-9) / 1e9
        })
        .fold(0.0, f64::max)
}

/// A renter's references for fake GPUs, as a share of their models' scaled rates: each
/// family's slowest variant's product rate and fill bandwidth
/// (`gpux_attestation::spec::references`) times the fake GPUs' scales (`gpux_attestation::spec::FAKE_TENSOR_SCALE` ...) times this, so that a genuine
/// fake GPU passes with room for a busy machine's delays, and an A40 sold as an A100 (48%
/// of the product's rate, 34% of the bandwidth) or an L40S as an H100 does not.
pub const FAKE_REFERENCE_SHARE: f64 = 0.8;

/// A renter's `--challenge-reference` arguments for fake GPUs of `families` (keys such as
/// `a100`): each family's reference rates, scaled as fake GPUs run, and the share of the
/// claimed memory they fill.
pub fn fake_references(families: &[&str]) -> Vec<String> {
    use gpux_attestation::spec;
    families
        .iter()
        .filter_map(|key| {
            let family: gpux_protocol::GpuFamily = key.parse().ok()?;
            let (gops, gbs) = spec::references(family, None)?;
            Some([
                "--challenge-reference".to_string(),
                format!(
                    "{key}={},{},{}",
                    gops * spec::FAKE_TENSOR_SCALE * FAKE_REFERENCE_SHARE,
                    gbs * spec::FAKE_BANDWIDTH_SCALE * FAKE_REFERENCE_SHARE,
                    spec::FAKE_MEMORY_SCALE
                ),
            ])
        })
        .flatten()
        .collect()
}

/// The second half of the round, with two hosts or more: `renter` challenges host-1's A100
/// (honest) and host-0's claimed H100 (caught), places a group over both hosts, and
/// rents a MIG slice of host-1's first A100.
pub(crate) fn challenge_and_group_round(
    renter: &harness::Node,
    progress: &dyn Fn(&str),
) -> anyhow::Result<OrderFigures> {
    let mut figures = OrderFigures::default();
    let api = ApiClient::for_data_dir(&renter.dir)?;
    let challenged = |family: &str| {
        api.rent(&gpux_api::RentRequest {
            query: format!("gpu={family} mig=false"),
            gpus: 1,
            max_price: "10".into(),
            duration_s: 8,
            command: vec!["sh".into(), "-c".into(), "echo challenged; sleep 4".into()],
            challenge: true,
            ..Default::default()
        })
    };
    wait("host-0's GPU to be offered", 30, || {
        api.offers("gpu=h100 mig=false", 5)
            .is_ok_and(|hits| hits.iter().any(|h| h.free >= 1))
    })?;
    let honest = challenged("a100").context("the honest host's challenge")?;
    let passed = honest.challenge.context("no challenge recorded")?;
    figures.challenges_passed = 1;
    progress(&format!(
        "orders: host-1 passed the challenge at {:.2} Gop/s ({:.0}% of its reference, {}, {} rows checked)",
        passed.achieved_gops,
        passed.achieved_gops / passed.reference_gops * 100.0,
        passed.shape,
        passed.rows_checked
    ));
    // Challenged again while it runs: the host pauses the workload while it proves.
    wait("the challenged work to run", 20, || {
        api.logs(&honest.lease, 0)
            .is_ok_and(|p| p.text.contains("challenged"))
    })?;
    let again = api
        .challenge(&honest.lease)
        .context("the honest host's challenge while its lease runs")?;
    figures.challenges_in_lease_passed = 1;
    progress(&format!(
        "orders: host-1 passed again while its lease ran, at {:.2} Gop/s",
        again.achieved_gops
    ));
    match challenged("h100") {
        Ok(_) => bail!("host-0, L40S disguised as H100s, passed the challenge"),
        Err(e) if e.to_string().contains("failed the performance challenge") => {
            let why = e.to_string();
            if !why.contains("memory:") {
                bail!("host-0, L40S disguised as H100s, was not caught on memory: {why}");
            }
            figures.challenges_failed = 1;
            progress(
                "orders: host-0, L40S disguised as H100s, failed the challenge on memory and was paid nothing",
            );
        }
        Err(e) => bail!("the H100 challenge did not run: {e}"),
    }
    // A group of 3 GPUs: 2 on host-1, 1 on host-0, started together (host-2's three L4s,
    // when there is a host-2, would hold the whole group on one host).
    const GROUP_QUERY: &str = "mig=false gpu in [h100,a100]";
    wait("every GPU to be offered again", 30, || {
        api.offers(GROUP_QUERY, 10)
            .is_ok_and(|hits| hits.iter().map(|h| u64::from(h.free)).sum::<u64>() >= 3)
    })?;
    let placed = api
        .rent_group(&gpux_api::RentRequest {
            query: GROUP_QUERY.into(),
            gpus: 3,
            max_price: "10".into(),
            duration_s: 4,
            command: vec!["sh".into(), "-c".into(), "echo member; sleep 2".into()],
            spread: true,
            ..Default::default()
        })
        .context("the group order")?;
    if placed.leases.len() < 2 || placed.gpus != 3 {
        bail!(
            "the group placed {} GPUs on {} hosts",
            placed.gpus,
            placed.leases.len()
        );
    }
    figures.groups = 1;
    progress(&format!(
        "orders: group {} placed 3 GPUs over {} hosts, started together",
        placed.group,
        placed.leases.len()
    ));
    // A MIG slice of host-1's A100: its container is given that slice and no other. The
    // group may still hold the slice's GPU, whose slices stay listed until the host's next
    // publication: its refusal is the book working, so the rent is tried again.
    let mut rented = None;
    wait("a MIG slice to be rented", 30, || {
        rented = api
            .rent(&gpux_api::RentRequest {
                query: "mig=true".into(),
                gpus: 1,
                max_price: "10".into(),
                duration_s: 3,
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo devices=$GPUX_DEVICES; sleep 1".into(),
                ],
                ..Default::default()
            })
            .ok();
        rented.is_some()
    })?;
    let slice = rented.context("renting a MIG slice")?;
    let [device] = &slice.gpus[..] else {
        bail!("a slice lease was given {:?}", slice.gpus);
    };
    if !device.starts_with("MIG-") {
        bail!("a slice lease was given {device}, not a MIG device");
    }
    let wanted = format!("devices={device}\n");
    wait("the slice's container to name its device", 20, || {
        api.logs(&slice.lease, 0)
            .is_ok_and(|p| p.text.contains(&wanted))
    })?;
    figures.mig_leases = 1;
    progress(&format!(
        "orders: a MIG slice lease ran on exactly {device}"
    ));
    Ok(figures)
}

/// A spot workload that saves its work when told: it watches for the notice file, and on
/// SIGTERM prints the notice and exits.
pub const PATIENT: &str = "trap 'echo got TERM; cat /run/gpux/preemption.json; exit 0' TERM; \
     echo started; seen=; \
     while true; do \
       if [ -z \"$seen\" ] && [ -f /run/gpux/preemption.json ]; then echo notice seen; seen=1; fi; \
       sleep 1 & wait $!; \
     done";

/// A resumable workload: it counts seconds into `/workspace/checkpoint/count` (written
/// atomically after each), starts from what the file holds, saves on SIGTERM, and stops at
/// `COUNTER_TARGET`, printing `count=N`.
pub const COUNTER: &str = "d=/workspace/checkpoint; mkdir -p $d; \
     if [ -f /workspace/data/set.bin ]; then echo \"data set: $(wc -c < /workspace/data/set.bin) bytes\"; fi; \
     c=$(cat $d/count 2>/dev/null || echo 0); echo \"resumed at $c\"; \
     save() { echo $c > $d/.count && mv $d/.count $d/count; }; \
     trap 'save; echo \"saved $c\"; exit 0' TERM; \
     while [ $c -lt 40 ]; do sleep 1 & wait $!; c=$((c+1)); save; done; \
     echo \"count=$c\"";
/// Where [`COUNTER`] stops, seconds of work.
pub const COUNTER_TARGET: u64 = 40;

/// Waits up to `secs` for `done`, polling every 200 ms.
pub(crate) fn wait(what: &str, secs: u64, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        if done() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("timed out after {secs} s waiting for {what}")
}

/// Lease `id` as `api`'s node sees it.
pub(crate) fn lease(api: &ApiClient, id: &str) -> Option<gpux_api::LeaseView> {
    api.leases().ok()?.into_iter().find(|l| l.lease == id)
}

fn rent(
    api: &ApiClient,
    host: &str,
    spot: bool,
    price: &str,
    script: &str,
) -> anyhow::Result<String> {
    Ok(rent_request(api, host, spot, None, price, script)?.lease)
}

/// A resumable spot lease (with a small workspace for its checkpoint).
fn rent_resumable(api: &ApiClient, host: &str, script: &str) -> anyhow::Result<String> {
    Ok(api
        .rent(&gpux_api::RentRequest {
            query: format!("host={host}"),
            gpus: 1,
            max_price: "10".into(),
            duration_s: 120,
            command: vec!["sh".into(), "-c".into(), script.into()],
            spot: true,
            resume: true,
            disk_bytes: Some(32 << 20),
            retain_s: Some(60),
            ..Default::default()
        })?
        .lease)
}

fn rent_request(
    api: &ApiClient,
    host: &str,
    spot: bool,
    window: Option<(u64, u64)>,
    price: &str,
    script: &str,
) -> anyhow::Result<gpux_api::Rented> {
    Ok(api.rent(&gpux_api::RentRequest {
        query: format!("host={host}"),
        gpus: 1,
        max_price: price.into(),
        duration_s: if spot { 120 } else { 5 },
        image: None,
        image_archive: None,
        cache_image: false,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        network: false,
        disk_bytes: None,
        retain_s: None,
        spot,
        window,
        ..Default::default()
    })?)
}

/// Runs the round: `spot_renter` rents host-0's GPU spot, `od_renter` then rents it
/// on-demand.
pub(crate) fn round(
    host: &harness::Node,
    spot_renter: &harness::Node,
    od_renter: &harness::Node,
    progress: &dyn Fn(&str),
) -> anyhow::Result<OrderFigures> {
    let mut figures = OrderFigures::default();
    let host_api = ApiClient::for_data_dir(&host.dir)?;
    let spot_api = ApiClient::for_data_dir(&spot_renter.dir)?;
    let od_api = ApiClient::for_data_dir(&od_renter.dir)?;
    // The host's GPU is free once the renting rounds' leases are over.
    wait("host-0's GPU to be offered", 30, || {
        spot_api
            .offers(&format!("host={}", host.peer), 5)
            .is_ok_and(|hits| hits.iter().any(|h| h.free >= 1))
    })?;
    let mut spot = None;
    wait("a spot lease on host-0", 30, || {
        spot = rent_resumable(&spot_api, &host.peer, PATIENT).ok();
        spot.is_some()
    })?;
    let spot = spot.context("no spot lease")?;
    progress(&format!(
        "orders: {} runs spot lease {spot} on {}",
        spot_renter.name, host.name
    ));
    wait("the spot workload to start", 20, || {
        spot_api
            .logs(&spot, 0)
            .is_ok_and(|p| p.text.contains("started"))
    })?;
    let od = rent(&od_api, &host.peer, false, "10", "echo on-demand; sleep 3")
        .context("the on-demand rent over the spot lease")?;
    progress(&format!(
        "orders: {} rents the same GPU on-demand: lease {od}",
        od_renter.name
    ));
    wait("the spot lease to be preempted", 40, || {
        lease(&host_api, &spot)
            .is_some_and(|l| l.end.as_deref() == Some("preempted") && l.finished_at.is_some())
    })?;
    let ended = lease(&host_api, &spot).context("the spot lease")?;
    let until = ended.preempted_until.context("no notice recorded")?;
    let finished = ended.finished_at.context("no end recorded")?;
    if finished > until + 1_500 {
        bail!("the spot container ran until {finished}, past its notice's end {until}");
    }
    wait("the renter to check the notice", 10, || {
        lease(&spot_api, &spot).is_some_and(|l| l.preempted_until == Some(until))
    })?;
    figures.spot_preemptions = 1;
    let saw = wait("the spot workload's last words", 10, || {
        spot_api.logs(&spot, 0).is_ok_and(|p| {
            let notice = p.text.find("notice seen");
            let term = p.text.find("got TERM");
            matches!((notice, term), (Some(n), Some(t)) if n < t)
        })
    });
    figures.spot_notices_seen = usize::from(saw.is_ok());
    wait("the on-demand lease to start", 40, || {
        lease(&host_api, &od).is_some_and(|l| l.started_at.is_some())
    })?;
    let started = lease(&host_api, &od)
        .and_then(|l| l.started_at)
        .unwrap_or(0);
    if started < finished {
        bail!(
            "the on-demand lease started at {started}, before the spot lease ended at {finished}"
        );
    }
    progress(&format!(
        "orders: spot lease preempted (notice seen by the workload: {}); the on-demand lease started {} ms after it ended",
        if figures.spot_notices_seen > 0 {
            "yes"
        } else {
            "no"
        },
        started - finished
    ));
    // Rented with --resume: once the on-demand lease has the GPU no more, the work is
    // rented again (held, its checkpoint copied in, committed) and runs; then it is stopped.
    let mut resumed = None;
    wait("the spot lease's work to resume", 60, || {
        resumed = spot_api.leases().ok().and_then(|all| {
            all.into_iter().find(|l| {
                l.phase == "running"
                    && l.resume
                        .as_ref()
                        .is_some_and(|r| r.resumed_from.as_deref() == Some(spot.as_str()))
            })
        });
        resumed.is_some()
    })?;
    let resumed = resumed.context("no resumed lease")?;
    wait("the resumed workload to start", 20, || {
        spot_api
            .logs(&resumed.lease, 0)
            .is_ok_and(|p| p.text.contains("started"))
    })?;
    figures.resumed_leases = 1;
    progress(&format!(
        "orders: the preempted spot lease resumed as {} (hop {})",
        resumed.lease,
        resumed.resume.as_ref().map_or(0, |r| r.hop)
    ));
    spot_api
        .stop(&resumed.lease)
        .context("stopping the resumed lease")?;

    // A window on the same GPU, booked 8 s ahead for 6 s, once the on-demand lease is over
    // and the GPU is offered again.
    wait("host-0's GPU to be offered again", 30, || {
        spot_api
            .offers(&format!("host={}", host.peer), 5)
            .is_ok_and(|hits| hits.iter().any(|h| h.free >= 1))
    })?;
    let now_s = gpux_node::attest::now().0 / 1000;
    let (start, end) = ((now_s + 8) * 1000, (now_s + 14) * 1000);
    let reserved = rent_request(
        &spot_api,
        &host.peer,
        false,
        Some((start, end)),
        "10",
        "echo reserved; while true; do sleep 1; done",
    )
    .context("booking a reserved window")?;
    progress(&format!(
        "orders: {} booked a window [{start}, {end}) on {}: lease {}",
        spot_renter.name, host.name, reserved.lease
    ));
    wait("the reserved window to run", 30, || {
        lease(&host_api, &reserved.lease).is_some_and(|l| l.finished_at.is_some())
    })?;
    let window = lease(&host_api, &reserved.lease).context("the reserved lease")?;
    let (ran_from, ran_to) = (
        window.started_at.unwrap_or(0),
        window.finished_at.unwrap_or(u64::MAX),
    );
    if !(start..=start + 2_000).contains(&ran_from) || ran_to > end + 2_000 {
        bail!("the window [{start}, {end}) ran from {ran_from} to {ran_to}");
    }
    figures.reserved_started_on_time = 1;
    progress(&format!(
        "orders: the window started {} ms after its start and ended {} ms after its end",
        ran_from - start,
        ran_to.saturating_sub(end)
    ));
    Ok(figures)
}
