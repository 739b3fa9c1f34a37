//! `gpux rent`: a lease from the market, with the renter's image (staged from its Docker,
//! pulled by the host from a registry, or the host's own) and workload; the rent's progress
//! (a pull's bytes, rate and time left) on standard error while it runs.

use std::io::Read;
use std::path::Path;

use gpux_api::{RegistryCredentials, RentRequest};
use gpux_client::ApiClient;

use super::{out, print_json};

/// What a renter wants, shared by `rent` and `bid`.
#[derive(Debug, clap::Args)]
pub(crate) struct Want {
    /// Constraints, e.g. 'gpu=H100 region=eu'.
    pub(crate) query: String,
    /// GPUs wanted (from one machine, or over several with --spread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) gpus: u16,
    /// Most paid per GPU-hour, credits.
    #[arg(long, value_name = "CREDITS")]
    pub(crate) max_price: String,
    /// Lease length: seconds, or a duration like 30m or 2h.
    #[arg(long, default_value = "1h", value_parser = super::parse_duration)]
    pub(crate) duration: u32,
}

/// The kind of lease, for `rent`.
#[derive(Debug, clap::Args)]
pub(crate) struct Kind {
    /// A spot lease: pays --max-price (at least the offer's spot floor) per second with no
    /// minimum, and the host may preempt it for an on-demand lease or a bid a tenth higher,
    /// after the notice the host states (30 s by default; the workload finds it in
    /// /run/gpux/preemption.json, then gets SIGTERM).
    #[arg(long, conflicts_with_all = ["start", "end"])]
    spot: bool,
    /// A reserved window's start: an RFC 3339 time (`2026-12-24T18:00:00Z`) or a delay
    /// from now (`+20s`, `+2h`). The lease is agreed and its escrow locked now; its
    /// container runs from the start to --end (--duration is ignored).
    #[arg(long, value_name = "TIME", requires = "end", value_parser = parse_time)]
    start: Option<u64>,
    /// The reserved window's end (as --start).
    #[arg(long, value_name = "TIME", requires = "start", value_parser = parse_time)]
    end: Option<u64>,
    /// A reserved window's committed minimum (`30m`): paid at the least if you stop the
    /// window early (the host turned others away for it); a window the host ends early pays
    /// only what ran.
    #[arg(long, value_name = "DURATION", requires = "start", value_parser = parse_hold)]
    committed: Option<u64>,
    /// Hold the GPUs this long (`90s`, `5m` at most) before the work starts: copy files
    /// into the workspace meanwhile (`gpux cp`), then `gpux commit LEASE` starts it. Not
    /// committed in time, the lease ends and nothing is paid.
    #[arg(long, value_name = "DURATION", value_parser = parse_hold)]
    hold: Option<u64>,
    /// A group order: --gpus over as many hosts as it takes, one lease per host (the
    /// largest share first), started all together or not at all; `gpux group scale` adds
    /// or removes GPUs later. Members have no network between them.
    #[arg(long, conflicts_with_all = ["spot", "start", "hold"])]
    spread: bool,
    /// With --spread: start whatever members could be placed (at least one) instead of
    /// nothing.
    #[arg(long, requires = "spread")]
    best_effort: bool,
    /// Challenge the GPUs before the work starts (a seeded INT8 matrix product, rows of it
    /// checked, timed by this node): a host that answers wrong, or slower than 90% of its
    /// model's reference rate, is paid nothing and the next offer is tried.
    #[arg(long, conflicts_with = "spread")]
    challenge: bool,
    /// Challenge the GPUs again while the work runs, at random times about this far apart
    /// (`6h`): each re-challenge pauses the work for at most 1% of the time it covers (a
    /// shorter interval is widened), and a host that fails one ends the lease, paid for
    /// what ran.
    #[arg(long, value_name = "SPAN", value_parser = super::parse_duration, conflicts_with = "spread")]
    challenge_every: Option<u32>,
    /// With --spot (and --disk): when preempted, this node copies the workspace out (only
    /// what changed since the last move), rents the best fitting offer again, copies it in
    /// (held: not billed) and starts the same workload; `gpux leases` shows the chain. The
    /// workload reads its checkpoint at start and writes it as it goes (and on SIGTERM).
    #[arg(long, requires = "spot")]
    resume: bool,
    /// A directory under /workspace that a resume moves (repeat for more) [default: the
    /// whole workspace].
    #[arg(long, value_name = "DIR", requires = "resume")]
    carry: Vec<String>,
    /// How long a resume looks for a new lease (`10m`) [default: 10m].
    #[arg(long, value_name = "DURATION", requires = "resume", value_parser = parse_hold)]
    resume_timeout: Option<u64>,
}

/// A hold on the command line, whole seconds.
fn parse_hold(text: &str) -> Result<u64, String> {
    humantime::parse_duration(text)
        .map(|d| d.as_secs())
        .map_err(|_| format!("'{text}': use 90s, 5m"))
}

/// A time on the command line, unix ms: RFC 3339, or `+DURATION` from now (whole seconds).
fn parse_time(text: &str) -> Result<u64, String> {
    let now = std::time::SystemTime::now();
    let at = match text.strip_prefix('+') {
        Some(delay) => humantime::parse_duration(delay)
            .map(|d| now + d)
            .map_err(|_| format!("'{text}': use +30s, +2h or an RFC 3339 time"))?,
        None => humantime::parse_rfc3339_weak(text).map_err(|_| {
            format!("'{text}': use an RFC 3339 time (2026-12-24T18:00:00Z) or +30s")
        })?,
    };
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("'{text}' is before 1970"))?
        .as_millis();
    // Whole seconds, so that the window lasts a whole number of them.
    u64::try_from(ms / 1000 * 1000).map_err(|_| format!("'{text}' is too far ahead"))
}

/// How a container is to run, for `rent`.
#[derive(Debug, clap::Args)]
pub(crate) struct Run {
    /// The image to run: an image in this node's Docker (`name:tag`), staged on the host
    /// before the lease; an image in a registry (`REGISTRY/NAME:TAG`, `NAME@sha256:...`,
    /// Docker Hub when no registry is named), pulled by the host before the lease (hosts
    /// that have it cached first); or a digest (`sha256:...`) the host lists [default: the
    /// host's first image].
    #[arg(long, value_name = "REF")]
    image: Option<String>,
    /// The registry's user, for a private image the host pulls; the password comes from
    /// GPUX_REGISTRY_PASSWORD or --registry-password-stdin. Without it, the credentials
    /// `docker login` stored for that registry are used, if any. They go to the chosen
    /// host only, for that pull.
    #[arg(long, value_name = "USER", requires = "image")]
    registry_user: Option<String>,
    /// Read the registry's password (or token) from standard input.
    #[arg(long, requires = "registry_user")]
    registry_password_stdin: bool,
    /// Let this SSH public key log in to the lease (`gpux ssh`, `ssh`, `scp`; no sshd
    /// needed in the image) [default: ~/.ssh/id_ed25519.pub, id_ecdsa.pub or id_rsa.pub,
    /// else a key of this node's own, made once].
    #[arg(long, value_name = "PUBKEY_FILE", num_args = 0..=1)]
    #[allow(clippy::option_option)] // absent, `--ssh`, `--ssh FILE`: clap's way to say it
    ssh: Option<Option<std::path::PathBuf>>,
    /// A `docker save` archive whose image is staged on the host and run.
    #[arg(long, value_name = "FILE", conflicts_with = "image")]
    image_archive: Option<std::path::PathBuf>,
    /// Keep the staged image on the host for your later leases, up to 24 h after this one
    /// (a new version then sends only the layers that changed).
    #[arg(long)]
    cache_image: bool,
    /// An environment variable for the workload, NAME=VALUE (repeatable).
    #[arg(long, value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Give the container a network (none by default).
    #[arg(long)]
    network: bool,
    /// A `/workspace` of this size for the lease's files (`10GiB`, `512MiB`): enforced,
    /// erased when the lease ends.
    #[arg(long, value_name = "SIZE", value_parser = gpux_api::text::size_bytes)]
    disk: Option<u64>,
    /// Keep the workspace this long after the lease, for `gpux cp` to fetch results
    /// (`30m`; the host's default, 10 minutes, otherwise; 0: erase at once).
    #[arg(long, value_name = "DURATION", value_parser = parse_retain)]
    retain: Option<u64>,
    /// CPU cores for the container (`2`, `0.5`) [default: the GPUs' share of the host, as
    /// `gpux offers search` shows it].
    #[arg(long, value_name = "CORES", value_parser = parse_cores)]
    cpus: Option<u32>,
    /// Memory for the container (`8GiB`) [default: the GPUs' share of the host].
    #[arg(long, value_name = "SIZE", value_parser = gpux_api::text::size_bytes)]
    memory: Option<u64>,
    /// Size of `/dev/shm`, part of the memory (`16GiB`) [default: half the memory].
    #[arg(long, value_name = "SIZE", value_parser = gpux_api::text::size_bytes)]
    shm: Option<u64>,
    /// The command to run in the container, after `--` [default: the image's].
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// CPU cores on the command line (`2`, `0.5`), thousandths of a core.
fn parse_cores(text: &str) -> Result<u32, String> {
    let bad = || format!("'{text}': CPU cores like 2 or 0.5 (at most 3 decimals)");
    let m = text
        .parse::<gpux_protocol::MicroCredits>()
        .map_err(|_| bad())?;
    if m.0 == 0 || m.0 % 1000 != 0 {
        return Err(bad());
    }
    u32::try_from(m.0 / 1000).map_err(|_| bad())
}

/// A retention on the command line: seconds or a duration (`30m`); 0 is allowed.
fn parse_retain(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(s) => Ok(s),
        Err(_) => humantime::parse_duration(text)
            .map(|d| d.as_secs())
            .map_err(|_| format!("'{text}': use seconds or a duration like 30m")),
    }
}

/// The rent `gpux rent` (and a standing bid's fill) asks for, from its flags.
pub(crate) fn request_of(
    dir: &Path,
    want: Want,
    kind: Kind,
    run: Run,
) -> anyhow::Result<RentRequest> {
    let env = super::parse_env(&run.env)?;
    let registry_auth = credentials(&run)?;
    let ssh_keys = match &run.ssh {
        None => Vec::new(),
        Some(file) => vec![super::ssh::rent_key(dir, file.as_deref())?],
    };
    // The node reads the archive: give it a path that does not depend on this directory.
    let image_archive = run
        .image_archive
        .map(|p| {
            std::fs::canonicalize(&p)
                .map_err(|e| anyhow::anyhow!("--image-archive {}: {e}", p.display()))
        })
        .transpose()?
        .map(|p| p.display().to_string());
    Ok(RentRequest {
        query: want.query,
        gpus: want.gpus,
        max_price: want.max_price,
        duration_s: want.duration,
        image: run.image,
        image_archive,
        cache_image: run.cache_image,
        command: run.command,
        env,
        network: run.network,
        disk_bytes: run.disk,
        retain_s: run.retain,
        cpu_millis: run.cpus,
        memory_bytes: run.memory,
        shm_bytes: run.shm,
        registry_auth,
        ssh_keys,
        progress: Some(progress_name()?),
        spot: kind.spot,
        window: kind.start.zip(kind.end),
        hold_s: kind.hold,
        resume: kind.resume,
        carry: kind.carry,
        resume_timeout_s: kind.resume_timeout,
        spread: kind.spread,
        best_effort: kind.best_effort,
        group: None,
        challenge: kind.challenge,
        challenge_every_s: kind.challenge_every.map(u64::from),
        committed_s: kind.committed,
    })
}

pub(crate) fn rent(
    dir: &Path,
    want: Want,
    kind: Kind,
    run: Run,
    (jupyter, json): (bool, bool),
) -> anyhow::Result<()> {
    let mut request = request_of(dir, want, kind, run)?;
    let token = jupyter
        .then(|| super::jupyter::prepare(&mut request))
        .transpose()?;
    if request.spread {
        let client = ApiClient::for_data_dir(dir)?;
        let placed = super::waiting("placing the group: matching, agreeing, starting", || {
            client.rent_group(&request)
        })?;
        if json {
            return print_json(&placed);
        }
        out!(
            "group {}: {} GPU(s) on {} host(s), all running",
            placed.group,
            placed.gpus,
            placed.leases.len()
        )?;
        for lease in &placed.leases {
            out!(
                "  lease {} with {}: {} GPU(s) at {} credits per GPU-hour",
                lease.lease,
                lease.host,
                lease.gpus.len(),
                lease.price_per_gpu_hour
            )?;
        }
        return Ok(());
    }
    let client = ApiClient::for_data_dir(dir)?;
    let lease = with_progress(&client, &request)?;
    if json {
        return print_json(&lease);
    }
    out!(
        "lease {} {} with {}: {} GPU(s) at {} credits per GPU-hour for {} s (escrow {} credits)",
        lease.lease,
        if lease.commit_by_ms.is_some() {
            "held"
        } else {
            "running"
        },
        lease.host,
        lease.gpus.len(),
        lease.price_per_gpu_hour,
        lease.duration_s,
        lease.escrow_amount,
    )?;
    if let Some(at) = lease.starts_at_ms {
        out!(
            "it starts at {} (UTC), once the spot lease on its GPUs has run out its notice",
            super::utc_time(at)
        )?;
    }
    if let Some(c) = &lease.challenge {
        out!(
            "challenge passed: {:.2} Gop/s, {:.0}% of the model's {:.2} ({} INT8 product, {} rows checked, round trip {:.1} ms)",
            c.achieved_gops,
            c.achieved_gops / c.reference_gops * 100.0,
            c.reference_gops,
            c.shape,
            c.rows_checked,
            c.round_trip_ms
        )?;
    }
    if let Some(every) = lease.challenge_every_s {
        out!(
            "challenged again while it runs, at random, about every {} (a host that fails ends it)",
            humantime::format_duration(std::time::Duration::from_secs(every))
        )?;
    }
    if let Some(by) = lease.commit_by_ms {
        out!(
            "its GPUs are held until {} (UTC): copy files in (`gpux cp`), then `gpux commit {}` starts the work",
            super::utc_time(by),
            lease.lease
        )?;
    }
    if let Some(pulled) = &lease.pulled {
        out!(
            "image {} pulled by the host: {} in {:.1} s{}",
            pulled.reference,
            bytesize::ByteSize(pulled.bytes),
            pulled.pull_ms as f64 / 1000.0,
            if pulled.warm {
                " (it had it cached)"
            } else {
                ""
            },
        )?;
    }
    if let Some(staged) = &lease.staged {
        out!(
            "image {} staged: {} of {} layers sent, {} of {}",
            lease.image,
            staged.layers_sent,
            staged.layers,
            bytesize::ByteSize(staged.bytes_sent),
            bytesize::ByteSize(staged.image_bytes),
        )?;
    }
    if let Some(kept) = &lease.retention {
        out!(
            "workspace kept {} s after the workload at {} credits per GiB-hour: {} credits, in the escrow",
            kept.retain_s,
            kept.price_per_gib_hour,
            kept.charge,
        )?;
    }
    if let Some(token) = token {
        super::jupyter::serve(dir, &lease, &token)?;
    }
    Ok(())
}

/// A name for the rent's progress on the node: 32 random hex digits.
fn progress_name() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("randomness: {e}"))?;
    Ok(gpux_protocol::hex(&bytes))
}

/// Waits for the rent, showing where it is: a pull's bytes, rate and time left as the host
/// reports them, else a spinner (on a terminal only).
fn with_progress(client: &ApiClient, request: &RentRequest) -> anyhow::Result<gpux_api::Rented> {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    let spinner = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner());
    let bytes = indicatif::ProgressStyle::with_template(
        "{msg} {bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(spinner);
    bar.set_message("renting: matching offers, getting the image, starting the container");
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let done = std::sync::atomic::AtomicBool::new(false);
    let name = request.progress.clone().unwrap_or_default();
    let result = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut pulling = false;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(300));
                let Ok(p) = client.rent_progress(&name) else {
                    continue;
                };
                if p.phase == "pulling" {
                    if !pulling {
                        bar.set_style(bytes.clone());
                        pulling = true;
                    }
                    bar.set_message(format!(
                        "pulling {} on {} (layers {}/{})",
                        p.image.as_deref().unwrap_or("the image"),
                        p.host
                            .as_deref()
                            .map_or("the host", |h| &h[h.len().saturating_sub(8)..]),
                        p.layers_done,
                        p.layers
                    ));
                    bar.set_length(p.total.max(p.done));
                    bar.set_position(p.done);
                } else if pulling && p.phase != "done" {
                    bar.set_style(
                        indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
                    );
                    bar.set_message("starting the container");
                    pulling = false;
                }
            }
        });
        let result = client.rent(request);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        result
    });
    bar.finish_and_clear();
    Ok(result?)
}

/// The registry's credentials for `--image`: `--registry-user` with the password from
/// standard input or GPUX_REGISTRY_PASSWORD; else what `docker login` stored for that
/// registry (`~/.docker/config.json`, or its credential helper); else none.
fn credentials(run: &Run) -> anyhow::Result<Option<RegistryCredentials>> {
    let Some(image) = &run.image else {
        return Ok(None);
    };
    if let Some(username) = &run.registry_user {
        let password = if run.registry_password_stdin {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| anyhow::anyhow!("reading the registry password: {e}"))?;
            text.trim_end_matches(['\r', '\n']).to_string()
        } else {
            std::env::var("GPUX_REGISTRY_PASSWORD").map_err(|_| {
                anyhow::anyhow!(
                    "--registry-user needs a password: set GPUX_REGISTRY_PASSWORD or give --registry-password-stdin"
                )
            })?
        };
        if password.is_empty() {
            anyhow::bail!("the registry password is empty");
        }
        return Ok(Some(RegistryCredentials {
            username: username.clone(),
            password,
        }));
    }
    let Ok(reference) = image.parse::<gpux_api::ImageRef>() else {
        return Ok(None);
    };
    Ok(super::docker_login::stored(&reference.auth_server()))
}
