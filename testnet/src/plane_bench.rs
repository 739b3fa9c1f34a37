//! The workload plane, as a benchmark (`gpux testnet plane-bench`): what `gpux cp`, `gpux
//! exec` and `gpux forward` cost against the transport under them, measured in one run on
//! real processes (a ledger, a host with a fake GPU, a renter) and the real Docker daemon.
//!
//! - staging a renter image of `bytes` (one layer above the host's image) through `gpux
//!   rent --image-archive`, against `docker save` plus `docker load` of the same image into
//!   a daemon that lacks it (the same daemon, the image removed in between);
//! - `gpux cp` of `bytes` up and down, against a raw libp2p stream (the same TCP, noise and
//!   yamux) between two in-process peers and between two processes
//!   ([`crate::plane_baselines`]), and raw loopback TCP;
//! - exec echo latency: a line through `gpux exec -i LEASE -- cat` and back;
//! - HTTP through `gpux forward` (busybox httpd in the container) against the same httpd run
//!   on this machine's loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::harness::{Node, free_port};
use crate::plane_baselines::{libp2p_stream, libp2p_stream_two_processes, tcp, tcp_relay};

/// What to run.
#[derive(Debug, Clone)]
pub struct PlaneBenchConfig {
    /// The `gpux` binary.
    pub gpux: PathBuf,
    /// Bytes each copy moves.
    pub bytes: u64,
    /// Exec echo samples.
    pub echo_samples: usize,
    /// How often each copy and the raw streams run: their medians are reported (one run
    /// of the raw stream varied from 296 to 448 MiB/s on one machine in one afternoon).
    pub rounds: usize,
}

/// What came out (rates in MiB/s, times in ms).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PlaneBenchReport {
    /// Bytes each copy moved.
    pub bytes: u64,
    /// Runs of each copy and raw stream; the rates below are their medians.
    pub rounds: usize,
    /// Every round's `gpux cp` up, MiB/s, in the order they ran.
    pub cp_up_runs: Vec<f64>,
    /// See `cp_up_runs`.
    pub cp_down_runs: Vec<f64>,
    /// See `cp_up_runs`.
    pub libp2p_stream_runs: Vec<f64>,
    /// `gpux cp` up (renter to workspace), MiB/s.
    pub cp_up_mib_s: f64,
    /// `gpux cp` down, MiB/s.
    pub cp_down_mib_s: f64,
    /// A raw libp2p stream between two in-process peers on loopback, MiB/s.
    pub libp2p_stream_mib_s: f64,
    /// See `cp_up_runs`: the raw stream between this process and another.
    pub libp2p_two_processes_runs: Vec<f64>,
    /// The raw libp2p stream from a peer in this process to one in a process of its own,
    /// as a copy runs between two nodes, MiB/s.
    pub libp2p_two_processes_mib_s: f64,
    /// The same with the receiver writing into a new file, MiB/s.
    pub libp2p_two_processes_to_file_mib_s: f64,
    /// See `cp_up_runs`: the raw stream between two processes from a file into a new file.
    pub libp2p_file_to_file_runs: Vec<f64>,
    /// The raw stream between two processes with the sender reading the copy's file and
    /// the receiver writing a new one: a copy's work without gpux's protocol on top (its
    /// frames, blake3, resuming), MiB/s.
    pub libp2p_file_to_file_mib_s: f64,
    /// Raw loopback TCP, MiB/s.
    pub tcp_mib_s: f64,
    /// The same stream with the receiver writing into a new file, as a copy does, MiB/s.
    pub libp2p_to_file_mib_s: f64,
    /// The slower cp direction over the raw libp2p stream (goal ≥ 0.8).
    pub cp_over_libp2p: f64,
    /// The slower cp direction over the stream into a file (reported).
    pub cp_over_libp2p_to_file: f64,
    /// The slower cp direction over the stream between two processes (reported).
    pub cp_over_libp2p_two_processes: f64,
    /// The slower cp direction over the stream between two processes into a file
    /// (reported).
    pub cp_over_libp2p_two_processes_to_file: f64,
    /// The slower cp direction over the stream between two processes from a file into a
    /// file: what gpux's protocol costs a copy over the transport doing the same file work.
    pub cp_over_libp2p_file_to_file: f64,
    /// Exec echo round trips, ms.
    pub exec_echo_ms_p50: f64,
    /// See `exec_echo_ms_p50`.
    pub exec_echo_ms_p95: f64,
    /// A 256 MiB HTTP download through `gpux forward`, MiB/s (best of 3).
    pub forward_http_mib_s: f64,
    /// The same through `gpux forward --stdio`: every byte over the CLI's WebSocket to its
    /// node, as every forward went before the node listened itself (reported), MiB/s.
    pub forward_via_cli_socket_http_mib_s: f64,
    /// The same from the same httpd on this machine's loopback, MiB/s (best of 3).
    pub direct_http_mib_s: f64,
    /// Forward over direct (goal ≥ 0.5).
    pub forward_over_direct: f64,
    /// The same download from this machine's httpd through two plain TCP relays on loopback
    /// (`plane_baselines::tcp_relay`): the three loopback hops of any forward, without
    /// encryption or framing: the most a forward could carry on this machine, MiB/s (best
    /// of 3).
    pub two_tcp_relays_http_mib_s: f64,
    /// Two plain relays over direct: the bound of `forward_over_direct` (reported).
    pub two_tcp_relays_over_direct: f64,
    /// The same download from the httpd in the container, made from inside its network
    /// namespace (the server the forward reaches, under the lease's CPU and memory limits,
    /// without the forward), MiB/s (best of 3).
    pub in_container_http_mib_s: f64,
    /// Forward over the download inside the container's namespace (reported).
    pub forward_over_in_container: f64,
    /// Forward over the raw libp2p stream, the transport under it (reported).
    pub forward_over_libp2p: f64,
    /// Forward over the raw libp2p stream between two processes, as a forward's bytes go
    /// between two nodes (goal ≥ 0.8).
    pub forward_over_libp2p_two_processes: f64,
    /// Staging against `docker save` + `docker load` (flattened into the same object).
    #[serde(flatten)]
    pub staging: StageReport,
}

/// The staging part of [`PlaneBenchReport`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageReport {
    /// The staged image's bytes (config and layers).
    pub image_bytes: u64,
    /// `docker save` of it to a file, ms.
    pub docker_save_ms: u64,
    /// `docker load` of that file into a daemon that lacks the image, ms.
    pub docker_load_ms: u64,
    /// `docker save` + `docker load`, MiB/s.
    pub save_load_mib_s: f64,
    /// The renter node's preparation of the archive (index, sha256 and blake3 of each
    /// layer), ms.
    pub stage_prepare_ms: u64,
    /// Staging itself: the layers sent and the host's load, ms.
    pub stage_ms: u64,
    /// Bytes sent to stage it.
    pub stage_bytes_sent: u64,
    /// `docker save` + preparation + staging, MiB/s: moving the image with gpux.
    pub stage_mib_s: f64,
    /// Staging over save + load (goal ≥ 0.7).
    pub stage_over_save_load: f64,
}

/// `docker` with `args`; fails with its stderr.
pub(crate) fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .context("the docker CLI")?;
    anyhow::ensure!(
        out.status.success(),
        "docker {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Staging against `docker save` + `docker load`: an image of one `bytes` layer above the
/// host's `base`, saved, removed, loaded back (the baseline), removed again, and staged.
fn stage_bench(
    config: &PlaneBenchConfig,
    renter: &Node,
    host: &Node,
    base_image: &str,
    dir: &Path,
    report: &mut StageReport,
    progress: &impl Fn(&str),
) -> anyhow::Result<()> {
    let context = dir.join("stage-context");
    std::fs::create_dir_all(&context)?;
    noise(&context.join("blob"), config.bytes)?;
    std::fs::write(
        context.join("Dockerfile"),
        format!("FROM {base_image}\nCOPY blob /blob\n"),
    )?;
    let image = docker(&["build", "-q", &context.display().to_string()])?;
    std::fs::remove_dir_all(&context)?;
    let archive = dir.join("stage.tar");
    let archive_s = archive.display().to_string();
    settle();
    let t = Instant::now();
    docker(&["save", "-o", &archive_s, &image])?;
    report.docker_save_ms = t.elapsed().as_millis() as u64;
    docker(&["rmi", &image])?;
    settle();
    let t = Instant::now();
    docker(&["load", "-q", "-i", &archive_s])?;
    report.docker_load_ms = t.elapsed().as_millis() as u64;
    docker(&["rmi", &image])?;
    progress(&format!(
        "docker save {} ms, docker load {} ms",
        report.docker_save_ms, report.docker_load_ms
    ));
    settle();
    let rented = run_ok(
        renter,
        &[
            "rent",
            "gpu=l4",
            "--max-price",
            "5",
            "--duration",
            "60",
            "--image-archive",
            &archive_s,
            "--json",
            "--",
            "true",
        ],
    )?;
    let rented: gpux_api::Rented = serde_json::from_slice(&rented.stdout)?;
    let staged = rented.staged.context("the rent staged nothing")?;
    report.image_bytes = staged.image_bytes;
    report.stage_prepare_ms = staged.prepare_ms;
    report.stage_ms = staged.stage_ms;
    report.stage_bytes_sent = staged.bytes_sent;
    let ms = |ms: u64| Duration::from_millis(ms.max(1));
    report.save_load_mib_s = mib_s(
        staged.image_bytes,
        ms(report.docker_save_ms + report.docker_load_ms),
    );
    report.stage_mib_s = mib_s(
        staged.image_bytes,
        ms(report.docker_save_ms + staged.prepare_ms + staged.stage_ms),
    );
    report.stage_over_save_load = report.stage_mib_s / report.save_load_mib_s.max(1e-9);
    progress(&format!(
        "staging: prepare {} ms, stage {} ms ({} bytes sent): {:.0} MiB/s against save+load {:.0} MiB/s",
        staged.prepare_ms,
        staged.stage_ms,
        staged.bytes_sent,
        report.stage_mib_s,
        report.save_load_mib_s
    ));
    std::fs::remove_file(&archive)?;
    // The workload exits at once: the lease ends, the image is erased, the GPU is free.
    let deadline = Instant::now() + Duration::from_secs(60);
    while host.phase(&rented.lease) != "settled" {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the staging lease did not settle"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The host offers its GPU again; the next rent needs the renter to have heard.
    while !renter
        .api()?
        .offers("gpu=l4", 10)
        .is_ok_and(|hits| hits.iter().any(|h| h.free > 0))
    {
        anyhow::ensure!(Instant::now() < deadline, "the GPU was not offered again");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

pub(crate) fn mib_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / took.as_secs_f64().max(1e-9)
}

pub(crate) fn noise(path: &Path, len: u64) -> anyhow::Result<()> {
    let mut xof = blake3::Hasher::new().update(b"plane-bench").finalize_xof();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        xof.fill(&mut buf[..n]);
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    out.flush()?;
    Ok(())
}

pub(crate) fn run_ok(node: &Node, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let out = node.gpux(args)?;
    anyhow::ensure!(
        out.status.success(),
        "gpux {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(out)
}

/// The HTTP download's size (or the copies' when smaller).
const HTTP_BYTES: u64 = 256 << 20;

/// The best of three HTTP/1.0 downloads of `/blob` from `port`, MiB/s.
fn http_best(port: u16) -> anyhow::Result<f64> {
    let mut best = 0.0f64;
    for _ in 0..3 {
        best = best.max(http_once(port)?);
    }
    Ok(best)
}

/// One HTTP/1.0 download of `/blob` from `port` on this thread's loopback, MiB/s.
fn http_once(port: u16) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    conn.write_all(b"GET /blob HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let got = drain_response(conn)?;
    Ok(mib_s(got, start.elapsed()))
}

/// Reads an HTTP response to its end into one buffer and counts it, as `curl -o /dev/null`
/// does (a client that kept the download in memory would spend more CPU touching fresh
/// pages than reading); fails unless it is a 200. Returns the bytes read.
fn drain_response(mut from: impl Read) -> anyhow::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut head = Vec::new();
    let mut got = 0u64;
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if head.len() < 16 {
            head.extend_from_slice(&buf[..n.min(16)]);
        }
        got += n as u64;
    }
    anyhow::ensure!(head.starts_with(b"HTTP/1.1 200"), "the download failed");
    Ok(got)
}

/// The best of three downloads as [`http_best`], made from a thread inside `lease`'s
/// container's network namespace: the same server the forward reaches, with the forward
/// taken out of the way, MiB/s.
fn http_in_container_best(lease: &str, port: u16) -> anyhow::Result<f64> {
    let label = format!("label={}={lease}", gpux_node::executor::LEASE_LABEL);
    let id = docker(&["ps", "-q", "--filter", &label])?;
    let id = id.trim();
    anyhow::ensure!(!id.is_empty(), "no running container for lease {lease}");
    let pid = docker(&["inspect", "-f", "{{.State.Pid}}", id])?;
    let ns = std::fs::File::open(format!("/proc/{}/ns/net", pid.trim()))
        .context("the container's network namespace (needs root)")?;
    // A thread of its own: the namespace change ends with it.
    std::thread::spawn(move || -> anyhow::Result<f64> {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .context("joining the container's network namespace")?;
        http_best(port)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the download thread panicked"))?
}

/// The best of three HTTP/1.0 downloads of `/blob` from port 8080 in `lease`'s container
/// through `gpux forward --stdio` (every byte over the CLI's WebSocket to its node, as
/// every forward went before the node listened itself), MiB/s.
fn http_via_cli_best(renter: &Node, lease: &str) -> anyhow::Result<f64> {
    let mut best = 0.0f64;
    for _ in 0..3 {
        let start = Instant::now();
        let mut child = renter
            .gpux_command(&["forward", "--stdio", lease, "8080"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("forward's stdin")?
            .write_all(b"GET /blob HTTP/1.0\r\nHost: x\r\n\r\n")?;
        let got = drain_response(child.stdout.take().context("forward's stdout")?)
            .context("the download through forward --stdio")?;
        child.wait()?;
        best = best.max(mib_s(got, start.elapsed()));
    }
    Ok(best)
}

/// Writes out every dirty page before a timed run, so that no run pays for the writeback of
/// the files an earlier one wrote (a failed `sync` only makes the run noisier).
pub(crate) fn settle() {
    let _ = std::process::Command::new("sync").status();
}

/// The median of `runs`.
fn median(runs: &[f64]) -> f64 {
    let mut sorted = runs.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 0.5)
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs the benchmark; `progress` hears what it is doing.
pub fn run(config: &PlaneBenchConfig, progress: impl Fn(&str)) -> anyhow::Result<PlaneBenchReport> {
    let image = crate::build_image()?;
    let temp = tempfile::tempdir().context("creating a temporary directory")?;
    let base = temp.path();
    let crate::harness::BenchNodes {
        mut ledger,
        mut host,
        mut renter,
    } = crate::harness::bench_nodes(&config.gpux, base, &image)?;
    let mut staged = StageReport::default();
    if let Err(e) = stage_bench(config, &renter, &host, &image, base, &mut staged, &progress) {
        crate::harness::stop_all([&mut host, &mut renter, &mut ledger], 20);
        return Err(e.context("the staging benchmark"));
    }
    let disk = format!("{}MiB", (config.bytes >> 20) * 11 / 10 + 200);
    let rented = run_ok(
        &renter,
        &[
            "rent",
            "gpu=l4",
            "--max-price",
            "5",
            "--duration",
            "3600",
            "--image",
            &image,
            "--disk",
            &disk,
            "--retain",
            "0",
            "--json",
            "--",
            "sleep",
            "3600",
        ],
    )?;
    let lease = serde_json::from_slice::<gpux_api::Rented>(&rented.stdout)?.lease;
    progress(&format!("lease {lease} runs with a {disk} workspace"));

    let measured = measure(config, &renter, &lease, base, &progress);
    // Whatever happened: the lease ends, its container and workspace go, the nodes stop.
    let _ = renter.gpux(&["stop", &lease]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && host.phase(&lease) != "settled" {
        std::thread::sleep(Duration::from_millis(200));
    }
    crate::harness::stop_all([&mut host, &mut renter, &mut ledger], 20);
    let mut report = measured?;
    report.staging = staged;
    Ok(report)
}

/// The measurements, on a running lease with a workspace.
fn measure(
    config: &PlaneBenchConfig,
    renter: &Node,
    lease: &str,
    base: &Path,
    progress: &impl Fn(&str),
) -> anyhow::Result<PlaneBenchReport> {
    let mut report = PlaneBenchReport {
        bytes: config.bytes,
        ..PlaneBenchReport::default()
    };
    let file = base.join("blob.bin");
    noise(&file, config.bytes)?;
    let remote = format!("{lease}:/workspace/");
    let back = base.join("back.bin");
    let rounds = config.rounds.max(1);
    report.rounds = rounds;
    // Each round copies up and down and then runs every baseline, so that a copy and its
    // baselines are measured within the same minute (these VMs drift from one minute to
    // the next).
    let runtime = tokio::runtime::Runtime::new()?;
    let sink = base.join("libp2p-sink.bin");
    let (mut to_file, mut apart_to_file) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Nothing in place: a copy finds what is there and sends only the rest.
        if round > 0 {
            run_ok(
                renter,
                &["exec", lease, "--", "rm", "-f", "/workspace/blob.bin"],
            )?;
        }
        settle();
        let t = Instant::now();
        run_ok(renter, &["cp", &file.display().to_string(), &remote])?;
        report.cp_up_runs.push(mib_s(config.bytes, t.elapsed()));
        settle();
        let t = Instant::now();
        run_ok(
            renter,
            &[
                "cp",
                &format!("{lease}:/workspace/blob.bin"),
                &back.display().to_string(),
            ],
        )?;
        report.cp_down_runs.push(mib_s(config.bytes, t.elapsed()));
        std::fs::remove_file(&back)?;
        progress(&format!(
            "cp (round {} of {rounds}): up {:.0} MiB/s, down {:.0} MiB/s",
            round + 1,
            report.cp_up_runs[round],
            report.cp_down_runs[round]
        ));
        let gpux = &config.gpux;
        let bytes = config.bytes;
        settle();
        report
            .libp2p_stream_runs
            .push(mib_s(bytes, runtime.block_on(libp2p_stream(bytes, None))?));
        settle();
        to_file.push(mib_s(
            bytes,
            runtime.block_on(libp2p_stream(bytes, Some(sink.clone())))?,
        ));
        std::fs::remove_file(&sink)?;
        settle();
        report.libp2p_two_processes_runs.push(mib_s(
            bytes,
            runtime.block_on(libp2p_stream_two_processes(gpux, bytes, None, None))?,
        ));
        settle();
        apart_to_file.push(mib_s(
            bytes,
            runtime.block_on(libp2p_stream_two_processes(
                gpux,
                bytes,
                None,
                Some(sink.clone()),
            ))?,
        ));
        std::fs::remove_file(&sink)?;
        settle();
        report.libp2p_file_to_file_runs.push(mib_s(
            bytes,
            runtime.block_on(libp2p_stream_two_processes(
                gpux,
                bytes,
                Some(&file),
                Some(sink.clone()),
            ))?,
        ));
        std::fs::remove_file(&sink)?;
    }
    report.cp_up_mib_s = median(&report.cp_up_runs);
    report.cp_down_mib_s = median(&report.cp_down_runs);

    report.libp2p_stream_mib_s = median(&report.libp2p_stream_runs);
    report.libp2p_to_file_mib_s = median(&to_file);
    report.libp2p_two_processes_mib_s = median(&report.libp2p_two_processes_runs);
    report.libp2p_two_processes_to_file_mib_s = median(&apart_to_file);
    report.libp2p_file_to_file_mib_s = median(&report.libp2p_file_to_file_runs);
    // The slower copy direction against each baseline.
    let slower_cp = report.cp_up_mib_s.min(report.cp_down_mib_s);
    let cp_over = |baseline: f64| slower_cp / baseline.max(1e-9);
    report.cp_over_libp2p_to_file = cp_over(report.libp2p_to_file_mib_s);
    report.cp_over_libp2p = cp_over(report.libp2p_stream_mib_s);
    report.cp_over_libp2p_two_processes = cp_over(report.libp2p_two_processes_mib_s);
    report.cp_over_libp2p_two_processes_to_file =
        cp_over(report.libp2p_two_processes_to_file_mib_s);
    report.cp_over_libp2p_file_to_file = cp_over(report.libp2p_file_to_file_mib_s);
    report.tcp_mib_s = mib_s(config.bytes, runtime.block_on(tcp(config.bytes))?);
    progress(&format!(
        "raw libp2p stream {:.0} MiB/s ({:.0} into a new file); between two processes {:.0} MiB/s ({:.0} into a new file, {:.0} from a file into a new one); raw TCP {:.0} MiB/s",
        report.libp2p_stream_mib_s,
        report.libp2p_to_file_mib_s,
        report.libp2p_two_processes_mib_s,
        report.libp2p_two_processes_to_file_mib_s,
        report.libp2p_file_to_file_mib_s,
        report.tcp_mib_s
    ));

    // Exec echo: one line to `cat` and back, many times.
    let mut cat = renter
        .gpux_command(&["exec", "-i", lease, "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdin = cat.stdin.take().context("cat's stdin")?;
    let mut stdout = BufReader::new(cat.stdout.take().context("cat's stdout")?);
    let mut samples = Vec::with_capacity(config.echo_samples);
    let mut line = String::new();
    for i in 0..config.echo_samples + 5 {
        let t = Instant::now();
        writeln!(stdin, "echo {i}")?;
        stdin.flush()?;
        line.clear();
        stdout.read_line(&mut line)?;
        anyhow::ensure!(line == format!("echo {i}\n"), "cat answered {line:?}");
        // The first few warm the path up.
        if i >= 5 {
            samples.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    drop(stdin);
    let _ = cat.wait();
    samples.sort_by(f64::total_cmp);
    report.exec_echo_ms_p50 = percentile(&samples, 0.5);
    report.exec_echo_ms_p95 = percentile(&samples, 0.95);
    progress(&format!(
        "exec echo p50 {:.1} ms, p95 {:.1} ms",
        report.exec_echo_ms_p50, report.exec_echo_ms_p95
    ));

    // HTTP: the same busybox httpd and the same file, in the container and here.
    // 256 MiB: a 64 MiB download measured the stream's start more than its rate.
    let http_bytes = config.bytes.min(HTTP_BYTES);
    run_ok(
        renter,
        &[
            "exec",
            lease,
            "--",
            "sh",
            "-c",
            &format!(
                "mkdir -p /workspace/www && mv /workspace/blob.bin /workspace/www/blob && truncate -s {http_bytes} /workspace/www/blob && httpd -p 127.0.0.1:8080 -h /workspace/www"
            ),
        ],
    )?;
    let www = base.join("www");
    std::fs::create_dir_all(&www)?;
    let mut blob = std::fs::File::open(&file)?.take(http_bytes);
    std::io::copy(&mut blob, &mut std::fs::File::create(www.join("blob"))?)?;
    let direct_port = free_port()?;
    let mut direct = std::process::Command::new(gpux_node::executor::BUSYBOX_PATH)
        .args([
            "httpd",
            "-f",
            "-p",
            &format!("127.0.0.1:{direct_port}"),
            "-h",
        ])
        .arg(&www)
        .spawn()
        .context("busybox httpd on this machine")?;
    let forward_port = free_port()?;
    let mut forward = renter
        .gpux_command(&["forward", lease, &format!("{forward_port}:8080")])
        .stderr(Stdio::piped())
        .spawn()?;
    let mut said = String::new();
    BufReader::new(forward.stderr.take().context("forward's stderr")?).read_line(&mut said)?;
    std::thread::sleep(Duration::from_millis(300));
    let relayed_port = tcp_relay(tcp_relay(direct_port)?)?;
    let measured = (|| -> anyhow::Result<(f64, f64, f64, f64, f64)> {
        Ok((
            http_best(direct_port)?,
            http_best(relayed_port)?,
            http_in_container_best(lease, 8080)?,
            http_best(forward_port)?,
            http_via_cli_best(renter, lease)?,
        ))
    })();
    let _ = forward.kill();
    let _ = direct.kill();
    let _ = forward.wait();
    let _ = direct.wait();
    let (direct_rate, relayed_rate, in_container_rate, forward_rate, via_cli_rate) = measured?;
    report.two_tcp_relays_http_mib_s = relayed_rate;
    report.two_tcp_relays_over_direct = relayed_rate / direct_rate.max(1e-9);
    report.forward_via_cli_socket_http_mib_s = via_cli_rate;
    report.direct_http_mib_s = direct_rate;
    report.in_container_http_mib_s = in_container_rate;
    report.forward_over_in_container = forward_rate / in_container_rate.max(1e-9);
    report.forward_http_mib_s = forward_rate;
    report.forward_over_direct = forward_rate / direct_rate.max(1e-9);
    report.forward_over_libp2p = forward_rate / report.libp2p_stream_mib_s.max(1e-9);
    report.forward_over_libp2p_two_processes =
        forward_rate / report.libp2p_two_processes_mib_s.max(1e-9);
    progress(&format!(
        "HTTP: forward {forward_rate:.0} MiB/s (over the CLI's socket {:.0}), direct {direct_rate:.0} MiB/s, through two plain TCP relays {relayed_rate:.0} MiB/s, direct to the container's own server {in_container_rate:.0} MiB/s",
        report.forward_via_cli_socket_http_mib_s
    ));

    Ok(report)
}
