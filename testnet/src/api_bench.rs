//! The local API under a flood of half-open connections (`gpux testnet api-bench`): one real
//! `gpux node run` process; `/v1/status` timed over fresh connections on a quiet API, then
//! again while `connections` clients each hold a connection whose headers never end (the
//! attack a local user or a page in a browser can mount without the token).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::harness::Node;

/// What to run.
#[derive(Debug, Clone)]
pub struct ApiBenchConfig {
    /// The `gpux` binary.
    pub gpux: PathBuf,
    /// Half-open connections opened.
    pub connections: usize,
    /// `/v1/status` calls timed in each phase.
    pub samples: usize,
}

/// Latencies of one phase, ms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// Calls timed.
    pub samples: usize,
    /// Median.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Latency {
    fn of(mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        Latency {
            samples: ms.len(),
            p50_ms: at(0.5),
            p95_ms: at(0.95),
            max_ms: at(1.0),
        }
    }
}

/// What the run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ApiBenchReport {
    /// `/v1/status` on a quiet API.
    pub quiet: Latency,
    /// `/v1/status` while the half-open connections are opened and held (one call after
    /// every `connections / samples` of them, then the rest while all are held).
    pub flooded: Latency,
    /// Half-open connections opened.
    pub connections: usize,
    /// The node's descriptors before, and at most while flooded.
    pub descriptors_before: usize,
    /// The most seen while flooded.
    pub descriptors_max: usize,
    /// From the last half-open connection opened to the node holding none of them, ms.
    pub all_closed_ms: u64,
}

/// One `GET /v1/status` on a fresh connection: how long until the whole answer came.
fn status(addr: &str, token: &str) -> anyhow::Result<f64> {
    let asked = Instant::now();
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(
        format!(
            "GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let ms = asked.elapsed().as_secs_f64() * 1000.0;
    if !answer.starts_with(b"HTTP/1.1 200") {
        bail!(
            "/v1/status answered: {}",
            String::from_utf8_lossy(&answer[..answer.len().min(200)])
        );
    }
    Ok(ms)
}

/// Runs it; `progress` hears each step.
pub fn run(config: &ApiBenchConfig, progress: impl Fn(&str)) -> anyhow::Result<ApiBenchReport> {
    let base = tempfile::tempdir().context("a temporary directory")?;
    let mut node = Node::new(
        &config.gpux,
        base.path(),
        "node",
        vec!["--api".into(), "127.0.0.1:0".into()],
        Vec::new(),
    )?;
    node.spawn()?;
    let addr = std::fs::read_to_string(node.dir.join("api.addr"))
        .context("reading the node's API address")?
        .trim()
        .to_string();
    let token = std::fs::read_to_string(node.dir.join("api.token"))?
        .trim()
        .to_string();
    let pid = node.pid().context("the node's pid")?;
    let descriptors = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let samples = config.samples.max(2);
    let quiet: Vec<f64> = (0..samples)
        .map(|_| status(&addr, &token))
        .collect::<anyhow::Result<_>>()?;
    let mut report = ApiBenchReport {
        quiet: Latency::of(quiet),
        connections: config.connections,
        descriptors_before: descriptors(),
        ..ApiBenchReport::default()
    };
    progress(&format!(
        "quiet: /v1/status p50 {:.1} ms; opening {} half-open connections",
        report.quiet.p50_ms, config.connections
    ));
    let every = (config.connections / samples).max(1);
    let mut flooded = Vec::new();
    let mut held = Vec::with_capacity(config.connections);
    for i in 0..config.connections {
        let mut stream = TcpStream::connect(&addr).context("opening a half-open connection")?;
        // Headers begun, never finished. (One the node closed already, as it should once
        // over its cap, is not held.)
        if stream
            .write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
            .is_ok()
        {
            held.push(stream);
        }
        if i % every == every - 1 {
            flooded.push(status(&addr, &token)?);
            report.descriptors_max = report.descriptors_max.max(descriptors());
        }
    }
    let opened = Instant::now();
    while flooded.len() < 2 * samples {
        flooded.push(status(&addr, &token)?);
    }
    report.descriptors_max = report.descriptors_max.max(descriptors());
    report.flooded = Latency::of(flooded);
    while descriptors() > report.descriptors_before + 4 {
        if opened.elapsed() > Duration::from_secs(60) {
            bail!(
                "the node still holds {} descriptors 60 s after the flood ({} before)",
                descriptors(),
                report.descriptors_before
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    report.all_closed_ms = opened.elapsed().as_millis() as u64;
    drop(held);
    node.stop(5);
    Ok(report)
}
