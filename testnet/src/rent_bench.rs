//! Renting at scale (`gpux testnet rent-bench`), as a benchmark and as a CI check: hosts with
//! many free fake GPUs, a ledger of one or three members, renters that fire rents at once.
//! Real `gpux node run` processes on loopback, real libp2p, real Docker containers.
//!
//! Two parts, each optional:
//! - **a burst**: `burst` rents fired at once, spread over every renter; it reports how many
//!   got a lease and checks that no GPU went to two of them;
//! - **levels**: from the first renter alone, `c` rents at once for each level `c`, batch
//!   after batch until a level has its samples: rents per second, and p50/p95 from the call
//!   to the lease running, against `docker create` + `docker start` of the same image at the
//!   same concurrency in the same run.
//!
//! - **a restart** (with the burst): the first host is stopped with SIGTERM while the burst's
//!   leases run on it and started again; the time from the SIGTERM to each lease's next
//!   acknowledged receipt, and the longest pause between acknowledged receipts its renter
//!   saw, against the same pause measured over the receipts before the restart.
//!
//! Every lease is stopped, and has ended, before the next batch.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::harness::{Node, stop_all};

/// What to run.
#[derive(Debug, Clone)]
pub struct RentBenchConfig {
    /// The `gpux` binary.
    pub gpux: PathBuf,
    /// Host nodes.
    pub hosts: usize,
    /// Fake L4s on each host.
    pub gpus_per_host: usize,
    /// Renter nodes.
    pub renters: usize,
    /// Ledger members (1 or 3).
    pub ledgers: usize,
    /// Rents fired at once over all renters (0: no burst).
    pub burst: usize,
    /// Concurrency levels from the first renter alone (empty: none).
    pub levels: Vec<usize>,
    /// Samples each level gathers, at least.
    pub samples: usize,
    /// Restart the first host while the burst's leases run on it (receipts every
    /// [`RESTART_RECEIPT_S`] seconds then).
    pub restart: bool,
    /// Where the nodes' data dirs go (a temporary directory when None).
    pub base_dir: Option<PathBuf>,
}

/// The receipt interval of a restart run, seconds (the ack grace is the default 30 s).
pub const RESTART_RECEIPT_S: u64 = 5;

/// The restart's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RestartReport {
    /// The burst's leases running on the restarted host.
    pub leases: usize,
    /// From the SIGTERM to the node's exit, ms.
    pub stop_ms: u64,
    /// From the SIGTERM to the node answering its API again, ms.
    pub back_ms: u64,
    /// From the SIGTERM to each lease's next acknowledged receipt: median and longest, ms.
    pub next_ack_ms_p50: u64,
    /// See `next_ack_ms_p50`.
    pub next_ack_ms_max: u64,
    /// The longest pause between two acknowledged receipts of a lease that its renter saw
    /// across the restart, ms.
    pub gap_ms_max: u64,
    /// The baseline: the longest pause between acknowledged receipts over the two
    /// intervals before the restart, ms.
    pub gap_ms_max_before: u64,
    /// The renters' ack grace, ms: the goal is `next_ack_ms_max` under it.
    pub ack_grace_ms: u64,
    /// Leases that ended across the restart (must be 0).
    pub ended: usize,
}

/// The burst's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BurstReport {
    /// Rents fired.
    pub fired: usize,
    /// Leases got.
    pub leased: usize,
    /// GPUs that went to more than one lease (must be 0).
    pub gpus_twice: usize,
    /// From the first rent fired to the last answer, ms.
    pub wall_ms: u64,
    /// The failed rents' errors (the first few).
    pub errors: Vec<String>,
}

/// One concurrency level.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LevelReport {
    /// Rents at once.
    pub concurrency: usize,
    /// Rents timed (and leases got).
    pub samples: usize,
    /// Failed rents.
    pub failed: usize,
    /// Leases completed per second of batch wall time.
    pub rents_per_s: f64,
    /// From `gpux rent` to the lease running, ms.
    pub rent_p50_ms: u64,
    /// See `rent_p50_ms`.
    pub rent_p95_ms: u64,
    /// The baseline: containers created and started per second at the same concurrency.
    pub docker_per_s: f64,
    /// `docker create` + `docker start` of the workload image, ms.
    pub docker_p50_ms: u64,
    /// See `docker_p50_ms`.
    pub docker_p95_ms: u64,
    /// rent p50 / docker p50.
    pub p50_ratio: f64,
}

/// What came out.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RentBenchReport {
    /// Hosts, GPUs each, renters and ledger members.
    pub hosts: usize,
    /// See `hosts`.
    pub gpus_per_host: usize,
    /// See `hosts`.
    pub renters: usize,
    /// See `hosts`.
    pub ledgers: usize,
    /// The burst, when one ran.
    pub burst: Option<BurstReport>,
    /// The restart, when one ran.
    pub restart: Option<RestartReport>,
    /// The levels.
    pub levels: Vec<LevelReport>,
}

/// Runs it.
pub fn run(config: &RentBenchConfig, progress: impl Fn(&str)) -> anyhow::Result<RentBenchReport> {
    if config.hosts == 0 || config.renters == 0 || config.gpus_per_host == 0 {
        bail!("rent-bench needs at least one host with a GPU and one renter");
    }
    if config
        .levels
        .iter()
        .any(|&c| c == 0 || c > config.gpus_per_host * config.hosts)
    {
        bail!("each concurrency level must be between 1 and the GPUs of all hosts");
    }
    let fake = crate::fake_nvml_beside(&config.gpux)?;
    let image = crate::build_image()?;
    let temp;
    let base = match &config.base_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    let ledgers =
        crate::ledgers::start(&config.gpux, &base, config.ledgers, "30", None, &progress)?;
    let mut nodes: Vec<Node> = Vec::new();
    let result = (|| {
        let joined = || {
            let mut args = vec!["--api".to_string(), "127.0.0.1:0".to_string()];
            for b in &ledgers.bootstrap {
                args.extend(["--bootstrap".to_string(), b.clone()]);
            }
            args.extend(["--ledger".to_string(), ledgers.list.clone()]);
            args
        };
        for h in 0..config.hosts {
            let dir = base.join(format!("host-{h}"));
            std::fs::create_dir_all(&dir)?;
            let toml: String = (0..config.gpus_per_host)
                .map(|g| {
                    format!(
                        "[[gpu]]\nname = \"NVIDIA L4\"\nuuid = \"GPU-{h:08x}-0000-4000-8000-{g:012x}\"\nmemory_total_bytes = 24152899584\ncompute_capability = [8, 9]\n\n"
                    )
                })
                .collect();
            let gpus = dir.join("gpus.toml");
            std::fs::write(&gpus, toml)?;
            let mut args = joined();
            args.extend(
                [
                    "--host",
                    "--fake-gpus",
                    "--nvml-lib",
                    &fake.display().to_string(),
                    "--image",
                    &image,
                    "--price",
                    "0.50",
                    "--republish",
                    "2",
                ]
                .map(String::from),
            );
            if config.restart {
                args.extend(["--receipt-interval".into(), RESTART_RECEIPT_S.to_string()]);
            }
            let mut host = Node::new(
                &config.gpux,
                &base,
                &format!("host-{h}"),
                args,
                vec![("GPUX_FAKE_NVML_CONFIG".into(), gpus)],
            )?;
            host.spawn()?;
            nodes.push(host);
        }
        for r in 0..config.renters {
            let mut renter = Node::new(
                &config.gpux,
                &base,
                &format!("renter-{r}"),
                joined(),
                vec![],
            )?;
            renter.spawn()?;
            nodes.push(renter);
        }
        let accounts: Vec<String> = nodes.iter().map(|n| n.peer.clone()).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        crate::ledgers::fund(&ledgers.nodes, &accounts, "1000", &stop)?;
        let started = Instant::now();
        for renter in &nodes[config.hosts..] {
            while renter.api()?.status().map_or(0, |s| s.offers_in_book) < config.hosts {
                if started.elapsed() > Duration::from_secs(60) {
                    bail!("{}: not every host's offer arrived in 60 s", renter.name);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        progress(&format!(
            "{} hosts x {} GPUs, {} renters, {} ledger member(s) up",
            config.hosts, config.gpus_per_host, config.renters, config.ledgers
        ));
        let mut report = RentBenchReport {
            hosts: config.hosts,
            gpus_per_host: config.gpus_per_host,
            renters: config.renters,
            ledgers: config.ledgers,
            ..RentBenchReport::default()
        };
        if config.burst > 0 {
            let who_of = |renters: &'_ [Node]| -> Vec<usize> {
                (0..config.burst).map(|i| i % renters.len()).collect()
            };
            let picks = who_of(&nodes[config.hosts..]);
            let batch = {
                let who: Vec<&Node> = picks.iter().map(|&i| &nodes[config.hosts + i]).collect();
                fire(&who, &image)
            };
            let mut gpus = std::collections::BTreeMap::new();
            for rented in batch.outcomes.iter().flatten() {
                for gpu in &rented.0.gpus {
                    *gpus
                        .entry((rented.0.host.clone(), gpu.clone()))
                        .or_insert(0) += 1;
                }
            }
            let burst = BurstReport {
                fired: config.burst,
                leased: batch.outcomes.iter().filter(|o| o.is_ok()).count(),
                gpus_twice: gpus.values().filter(|&&n| n > 1).count(),
                wall_ms: batch.wall.as_millis() as u64,
                errors: batch
                    .outcomes
                    .iter()
                    .filter_map(|o| o.as_ref().err().cloned())
                    .take(5)
                    .collect(),
            };
            progress(&format!(
                "burst: {} of {} rents got a lease in {} ms; GPUs given twice: {}",
                burst.leased, burst.fired, burst.wall_ms, burst.gpus_twice
            ));
            let (hosts, renters) = nodes.split_at_mut(config.hosts);
            let who: Vec<&Node> = picks.iter().map(|&i| &renters[i]).collect();
            if config.restart {
                let restart = restart(&mut hosts[0], &who, &batch)?;
                progress(&format!(
                    "restart: {} leases on host-0; SIGTERM to exit {} ms, to its API {} ms; next acknowledged receipt p50 {} ms, max {} ms (ack grace {} ms); longest pause between receipts {} ms (before: {} ms); {} ended",
                    restart.leases,
                    restart.stop_ms,
                    restart.back_ms,
                    restart.next_ack_ms_p50,
                    restart.next_ack_ms_max,
                    restart.ack_grace_ms,
                    restart.gap_ms_max,
                    restart.gap_ms_max_before,
                    restart.ended
                ));
                report.restart = Some(restart);
            }
            end_all(&who, &batch)?;
            report.burst = Some(burst);
        }
        for &c in &config.levels {
            let level = level(&nodes[config.hosts], &image, c, config.samples.max(1))?;
            progress(&format!(
                "{c} at once: {:.1} rents/s, p50 {} ms, p95 {} ms; docker create+start {:.1}/s, p50 {} ms ({:.2}x)",
                level.rents_per_s,
                level.rent_p50_ms,
                level.rent_p95_ms,
                level.docker_per_s,
                level.docker_p50_ms,
                level.p50_ratio
            ));
            report.levels.push(level);
        }
        Ok(report)
    })();
    let mut ledger_nodes = ledgers.nodes;
    stop_all(nodes.iter_mut().chain(ledger_nodes.iter_mut()), 15);
    result
}

/// One rent's lease (with its renter's index in the batch) or error.
type Outcome = Result<(gpux_api::Rented, usize), String>;

/// A batch of rents fired at once.
struct Batch {
    outcomes: Vec<Outcome>,
    /// Each rent's time from its call to its answer.
    took: Vec<Duration>,
    wall: Duration,
}

/// Fires one rent per entry of `who` at once (a `gpux rent` process each).
fn fire(who: &[&Node], image: &str) -> Batch {
    let started = Instant::now();
    let outcomes: Vec<(Outcome, Duration)> = std::thread::scope(|scope| {
        let handles: Vec<_> = who
            .iter()
            .enumerate()
            .map(|(i, renter)| {
                scope.spawn(move || {
                    let asked = Instant::now();
                    let out = renter
                        .gpux(&[
                            "rent",
                            "gpu=l4",
                            "--max-price",
                            "1",
                            "--duration",
                            "600",
                            "--image",
                            image,
                            "--json",
                            "--",
                            "sleep",
                            "600",
                        ])
                        .map_err(|e| e.to_string());
                    let took = asked.elapsed();
                    let outcome = out.and_then(|out| {
                        if out.status.success() {
                            serde_json::from_slice::<gpux_api::Rented>(&out.stdout)
                                .map(|r| (r, i))
                                .map_err(|e| e.to_string())
                        } else {
                            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
                        }
                    });
                    (outcome, took)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| (Err("a rent thread panicked".into()), Duration::ZERO))
            })
            .collect()
    });
    let wall = started.elapsed();
    let (outcomes, took) = outcomes.into_iter().unzip();
    Batch {
        outcomes,
        took,
        wall,
    }
}

/// Stops every lease of `batch` and waits until each has ended on its renter.
fn end_all(who: &[&Node], batch: &Batch) -> anyhow::Result<()> {
    let leases: Vec<(&Node, &str)> = batch
        .outcomes
        .iter()
        .flatten()
        .map(|(rented, i)| (who[*i], rented.lease.as_str()))
        .collect();
    std::thread::scope(|scope| {
        for (renter, lease) in &leases {
            scope.spawn(move || renter.gpux(&["stop", lease]));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    for (renter, lease) in leases {
        while !matches!(renter.phase(lease).as_str(), "ended" | "settled") {
            if Instant::now() > deadline {
                bail!("lease {lease} did not end within 60 s of its stop");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// One concurrency level from one renter, and Docker's baseline at the same concurrency.
fn level(renter: &Node, image: &str, c: usize, samples: usize) -> anyhow::Result<LevelReport> {
    let who = vec![renter; c];
    let mut took = Vec::new();
    let mut failed = 0;
    let mut last_error = String::new();
    let mut wall = Duration::ZERO;
    while took.len() < samples {
        // The hosts publish at most every few seconds: the batch goes once the renter's
        // book shows the GPUs free again (the last batch's, or a restart's, leases over).
        let deadline = Instant::now() + Duration::from_secs(15);
        while renter.api()?.offers("gpu=l4", 100).map_or(0, |hits| {
            hits.iter().map(|h| usize::from(h.free)).sum::<usize>()
        }) < c
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let batch = fire(&who, image);
        for (outcome, t) in batch.outcomes.iter().zip(&batch.took) {
            match outcome {
                Ok(_) => took.push(*t),
                Err(e) => {
                    failed += 1;
                    last_error.clone_from(e);
                }
            }
        }
        wall += batch.wall;
        end_all(&who, &batch)?;
        if failed > samples {
            bail!("{c} rents at once: {failed} failed (the last: {last_error})");
        }
    }
    let (docker, docker_wall) = docker_baseline(image, c, samples)?;
    let ms = |mut v: Vec<Duration>, p: f64| {
        v.sort_unstable();
        let rank = ((v.len() as f64 - 1.0) * p).round() as usize;
        v.get(rank).map_or(0, |d| d.as_millis() as u64)
    };
    let rent_p50 = ms(took.clone(), 0.5);
    let docker_p50 = ms(docker.clone(), 0.5);
    Ok(LevelReport {
        concurrency: c,
        samples: took.len(),
        failed,
        rents_per_s: took.len() as f64 / wall.as_secs_f64().max(1e-9),
        rent_p50_ms: rent_p50,
        rent_p95_ms: ms(took, 0.95),
        docker_per_s: docker.len() as f64 / docker_wall.as_secs_f64().max(1e-9),
        docker_p50_ms: docker_p50,
        docker_p95_ms: ms(docker, 0.95),
        p50_ratio: rent_p50 as f64 / docker_p50.max(1) as f64,
    })
}

/// `docker create` + `docker start` of `image` running `sleep`, `c` at once, until
/// `samples`; every container removed after its batch. Returns each one's time and the
/// batches' wall time.
fn docker_baseline(
    image: &str,
    c: usize,
    samples: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let run = |args: &[&str]| -> anyhow::Result<String> {
        let out = std::process::Command::new("docker")
            .args(args)
            .output()
            .context("running docker")?;
        if !out.status.success() {
            bail!(
                "docker {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let mut took = Vec::new();
    let mut wall = Duration::ZERO;
    while took.len() < samples {
        let started = Instant::now();
        let batch: Vec<anyhow::Result<(String, Duration)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..c)
                .map(|_| {
                    scope.spawn(|| {
                        let asked = Instant::now();
                        let id = run(&[
                            "create",
                            "--label",
                            "gpux-rent-bench=1",
                            image,
                            "sleep",
                            "600",
                        ])?;
                        run(&["start", &id])?;
                        Ok((id, asked.elapsed()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| bail!("a docker thread panicked"))
                })
                .collect()
        });
        wall += started.elapsed();
        let mut ids = Vec::new();
        for result in batch {
            let (id, t) = result?;
            took.push(t);
            ids.push(id);
        }
        let mut args = vec!["rm", "-f"];
        args.extend(ids.iter().map(String::as_str));
        run(&args)?;
    }
    Ok((took, wall))
}

/// Each lease's acknowledged receipts and end, as its renter sees them.
fn acks(who: &[&Node], leases: &[(usize, String)]) -> Vec<Option<(u64, bool)>> {
    let mut views = std::collections::BTreeMap::new();
    for (i, _) in leases {
        let dir = &who[*i].dir;
        if !views.contains_key(dir)
            && let Ok(list) = who[*i].api().and_then(|a| Ok(a.leases()?))
        {
            views.insert(dir.clone(), list);
        }
    }
    leases
        .iter()
        .map(|(i, id)| {
            views
                .get(&who[*i].dir)?
                .iter()
                .find(|l| &l.lease == id)
                .map(|l| (l.acked_seq, l.end.is_some()))
        })
        .collect()
}

/// SIGTERMs `host` while the burst's leases run on it and starts it again; times the
/// leases' acknowledged receipts around it.
fn restart(host: &mut Node, who: &[&Node], batch: &Batch) -> anyhow::Result<RestartReport> {
    let leases: Vec<(usize, String)> = batch
        .outcomes
        .iter()
        .flatten()
        .filter(|(r, _)| r.host == host.peer)
        .map(|(r, i)| (*i, r.lease.clone()))
        .collect();
    if leases.is_empty() {
        bail!("no lease of the burst runs on {}", host.name);
    }
    let interval = Duration::from_secs(RESTART_RECEIPT_S);
    // Watches the acks for `span` (or until `done`); returns, per lease, when each new ack
    // was seen.
    let watch = |span: Duration,
                 seen: &mut Vec<Vec<Instant>>,
                 last: &mut Vec<u64>,
                 done: &dyn Fn(&[Vec<Instant>]) -> bool| {
        let from = Instant::now();
        while from.elapsed() < span && !done(seen) {
            for (k, a) in acks(who, &leases).into_iter().enumerate() {
                if let Some((seq, _)) = a
                    && seq > last[k]
                {
                    last[k] = seq;
                    seen[k].push(Instant::now());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut seen = vec![Vec::new(); leases.len()];
    let mut last = vec![0u64; leases.len()];
    // Every lease acknowledged once, then two intervals of receipts: the baseline.
    watch(interval * 4, &mut seen, &mut last, &|s| {
        s.iter().all(|v| !v.is_empty())
    });
    if seen.iter().any(Vec::is_empty) {
        bail!(
            "not every lease had a receipt acknowledged in {} s",
            4 * RESTART_RECEIPT_S
        );
    }
    let mut before = vec![Vec::new(); leases.len()];
    watch(
        interval * 2 + Duration::from_millis(500),
        &mut before,
        &mut last,
        &|_| false,
    );
    let gap = |times: &[Instant]| {
        times
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_millis() as u64)
            .max()
            .unwrap_or(0)
    };
    let gap_ms_max_before = before.iter().map(|t| gap(t)).max().unwrap_or(0);
    let last_before: Vec<Instant> = before
        .iter()
        .zip(&seen)
        .map(|(b, s)| b.last().or(s.last()).copied().unwrap_or_else(Instant::now))
        .collect();
    let sigterm = Instant::now();
    host.terminate();
    if !host.reap(Instant::now() + Duration::from_secs(30)) {
        bail!("{} did not stop within 30 s of SIGTERM", host.name);
    }
    let stop_ms = sigterm.elapsed().as_millis() as u64;
    host.spawn()?;
    let back_ms = sigterm.elapsed().as_millis() as u64;
    let mut after = vec![Vec::new(); leases.len()];
    watch(Duration::from_secs(60), &mut after, &mut last, &|s| {
        s.iter().all(|v| !v.is_empty())
    });
    let mut next: Vec<u64> = after
        .iter()
        .map(|t| {
            t.first()
                .map_or(u64::MAX, |at| at.duration_since(sigterm).as_millis() as u64)
        })
        .collect();
    next.sort_unstable();
    let gap_ms_max = after
        .iter()
        .zip(&last_before)
        .map(|(t, b)| {
            t.first()
                .map_or(u64::MAX, |at| at.duration_since(*b).as_millis() as u64)
        })
        .max()
        .unwrap_or(0);
    let ended = acks(who, &leases)
        .iter()
        .filter(|a| a.is_some_and(|(_, ended)| ended))
        .count();
    Ok(RestartReport {
        leases: leases.len(),
        stop_ms,
        back_ms,
        next_ack_ms_p50: next[next.len() / 2],
        next_ack_ms_max: next.last().copied().unwrap_or(0),
        gap_ms_max,
        gap_ms_max_before,
        ack_grace_ms: 30_000,
        ended,
    })
}
