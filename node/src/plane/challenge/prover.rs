//! The host's provers behind one face ([`Prover`]): the CPU provers for fake GPUs, paced to
//! the fake GPU's model, and the CUDA prover for real GPUs, on a thread of its own that
//! holds the device, the fill and the product's tree for the whole challenge.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpux_attestation::Disguise;
use gpux_attestation::challenge::fill::{self, FillShape, Opening};
use gpux_attestation::challenge::gpu::{Device, GpuFill, GpuProduct};
use gpux_attestation::challenge::merkle::Hash;
use gpux_attestation::challenge::{self, Opened, Shape};
use gpux_protocol::{ChallengeRequest, GpuUuid};

/// The most operations the CPU prover computes (tens of seconds on two cores): a renter,
/// who pays for the lease, makes its host work at most this long per challenge, one at a
/// time. A fake GPU claiming a faster model than its CPU answers late and fails.
pub(crate) const MAX_CPU_OPS: f64 = 1e11;
/// The most memory the CPU provers hold: `B` and the product, and the fill.
const MAX_CPU_BYTES: u64 = 512 << 20;

/// Whether the CPU prover computes a product of `shape`.
fn cpu_proves(shape: Shape) -> Result<(), String> {
    let bytes =
        u64::from(shape.k) * u64::from(shape.n) + 4 * u64::from(shape.m) * u64::from(shape.n);
    if shape.operations() > MAX_CPU_OPS || bytes > MAX_CPU_BYTES {
        return Err(format!(
            "{shape} is more than this host's CPU prover computes ({MAX_CPU_OPS:.0} operations, {} MiB)",
            MAX_CPU_BYTES >> 20
        ));
    }
    Ok(())
}

/// The fill a request asks for (`None`: none), if the CPU prover holds it.
fn cpu_fills(request: &ChallengeRequest) -> Result<Option<FillShape>, String> {
    if request.fill_lanes == 0 {
        return Ok(None);
    }
    FillShape::new(request.fill_lanes, request.fill_blocks, MAX_CPU_BYTES)
        .map(Some)
        .ok_or_else(|| {
            format!(
                "a fill of {} lanes of {} blocks is not one this host's CPU prover holds (whole slices, at most {} MiB)",
                request.fill_lanes,
                request.fill_blocks,
                MAX_CPU_BYTES >> 20
            )
        })
}

/// The longest a renter waits for a product (`super::ANSWER_WITHIN`): a GPU computes no
/// product longer than this at its model's INT8 peak, so a renter cannot hold a host's GPU
/// for hours with one challenge of a held lease it never commits.
const MAX_GPU_SECONDS: f64 = 60.0;
/// The INT8 rate assumed for a GPU the spec table does not know, Gop/s (an H100's peak).
const UNKNOWN_PEAK_GOPS: f64 = 1_979_000.0;

/// Whether the CUDA prover computes a product of `shape` on GPU `name`: at most
/// [`MAX_GPU_SECONDS`] at its model's dense INT8 peak.
fn gpu_proves(shape: Shape, name: &str) -> Result<(), String> {
    let peak = gpux_attestation::spec_for_name(name).map_or(UNKNOWN_PEAK_GOPS, |s| {
        f64::from(s.int8_tensor_tops) * 1000.0
    });
    if shape.operations() > peak * 1e9 * MAX_GPU_SECONDS {
        return Err(format!(
            "{shape} is more than {name} computes in {MAX_GPU_SECONDS:.0} s at its INT8 peak"
        ));
    }
    Ok(())
}

/// A fake GPU, as the fake driver describes it: the model it claims, and what it really
/// is when that is a disguise.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FakeGpu {
    claimed: &'static gpux_attestation::GpuSpec,
    disguise: Option<Disguise>,
}

impl FakeGpu {
    /// How long this fake GPU takes for a fill of `shape`: its claimed model's reference
    /// bandwidth, scaled ([`gpux_attestation::spec::FAKE_BANDWIDTH_SCALE`]), at its real
    /// model's share.
    fn fill_time(&self, shape: FillShape) -> Duration {
        let gbs = self.claimed.fill_gbs()
            * gpux_attestation::spec::FAKE_BANDWIDTH_SCALE
            * self.disguise.map_or(1.0, |d| d.bandwidth);
        Duration::from_secs_f64(shape.traffic() / (gbs * 1e9))
    }

    /// How long this fake GPU takes for a product of `shape`, likewise.
    fn product_time(&self, shape: Shape) -> Duration {
        let gops = self.claimed.challenge_gops
            * gpux_attestation::spec::FAKE_TENSOR_SCALE
            * self.disguise.map_or(1.0, |d| d.tensor);
        Duration::from_secs_f64(shape.operations() / (gops * 1e9))
    }

    /// What it holds of a fill of `bytes`.
    fn holds(&self, bytes: u64) -> u64 {
        self.disguise
            .map_or(u64::MAX, |d| (bytes as f64 * d.memory) as u64)
    }
}

/// The fake driver's GPUs (the file `GPUX_FAKE_NVML_CONFIG` names) whose model the spec
/// table knows, by device.
pub(crate) fn fake_gpus() -> BTreeMap<GpuUuid, FakeGpu> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        gpu: Vec<Gpu>,
    }
    #[derive(serde::Deserialize)]
    struct Gpu {
        name: String,
        uuid: String,
        really: Option<String>,
    }
    let Some(path) = std::env::var_os("GPUX_FAKE_NVML_CONFIG") else {
        return BTreeMap::new();
    };
    let file: File = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|text| toml::from_str(&text).map_err(|e| e.to_string()))
    {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!("reading the fake GPUs from {}: {e}", path.display());
            return BTreeMap::new();
        }
    };
    file.gpu
        .into_iter()
        .filter_map(|g| {
            let claimed = gpux_attestation::spec_for_name(&g.name)?;
            let disguise = match g.really.as_deref() {
                Some(real) => Some(Disguise::of(
                    gpux_attestation::spec_for_name(real)?,
                    claimed,
                )),
                None => None,
            };
            Some((g.uuid.parse().ok()?, FakeGpu { claimed, disguise }))
        })
        .collect()
}

/// Waits until `took` since `started`: a fake GPU answers when its model would have.
async fn pace(started: Instant, took: Option<Duration>) {
    if let Some(rest) = took.and_then(|t| t.checked_sub(started.elapsed())) {
        tokio::time::sleep(rest).await;
    }
}

/// A challenge's prover, for the challenge's length.
pub(crate) enum Prover {
    /// The CPU provers (a fake GPU, or none named): what they committed to.
    Cpu {
        /// The fake GPU challenged, when the fake driver describes it.
        fake: Option<FakeGpu>,
        /// The fill, once filled.
        filled: Option<Box<fill::Filled>>,
        /// The product, once proved.
        proof: Option<Box<challenge::Committed>>,
    },
    /// The CUDA prover on a real GPU.
    Gpu(GpuSession),
}

impl Prover {
    /// Checks the work fits this prover before any clock starts.
    pub(crate) fn admits(
        &self,
        shape: Shape,
        request: &ChallengeRequest,
    ) -> Result<Option<FillShape>, String> {
        match self {
            Prover::Cpu { .. } => {
                cpu_proves(shape)?;
                cpu_fills(request)
            }
            Prover::Gpu(session) => {
                gpu_proves(shape, &session.name)?;
                if request.fill_lanes == 0 {
                    return Ok(None);
                }
                FillShape::new(request.fill_lanes, request.fill_blocks, u64::MAX)
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "a fill of {} lanes of {} blocks is not a fill (whole slices, at least two)",
                        request.fill_lanes, request.fill_blocks
                    )
                })
            }
        }
    }

    /// Fills the memory; the fill's root.
    pub(crate) async fn fill(&mut self, seed: [u8; 32], shape: FillShape) -> Result<Hash, String> {
        match self {
            Prover::Cpu { fake, filled, .. } => {
                let fake = *fake;
                let holds = fake.map_or(u64::MAX, |g| g.holds(shape.bytes()));
                let started = Instant::now();
                let done = tokio::task::spawn_blocking(move || fill::fill_cpu(&seed, shape, holds))
                    .await
                    .map_err(|e| format!("the CPU prover stopped: {e}"))?;
                pace(started, fake.map(|g| g.fill_time(shape))).await;
                let root = done.root;
                *filled = Some(Box::new(done));
                Ok(root)
            }
            Prover::Gpu(session) => session.root(Command::Fill(seed, shape)).await,
        }
    }

    /// Proves the product; its root.
    pub(crate) async fn prove(&mut self, seed: [u8; 32], shape: Shape) -> Result<Hash, String> {
        match self {
            Prover::Cpu { fake, proof, .. } => {
                let fake = *fake;
                let started = Instant::now();
                let done = tokio::task::spawn_blocking(move || challenge::prove_cpu(&seed, shape))
                    .await
                    .map_err(|e| format!("the CPU prover stopped: {e}"))?;
                pace(started, fake.map(|g| g.product_time(shape))).await;
                let root = done.root;
                *proof = Some(Box::new(done));
                Ok(root)
            }
            Prover::Gpu(session) => session.root(Command::Prove(seed, shape)).await,
        }
    }

    /// Opens the picked rows and fill blocks.
    pub(crate) async fn open(
        &mut self,
        rows: Vec<u32>,
        blocks: Vec<(u32, u32)>,
    ) -> Result<(Vec<Opened>, Vec<Opening>), String> {
        match self {
            Prover::Cpu { filled, proof, .. } => {
                let rows = proof.as_ref().map(|p| p.open(&rows)).unwrap_or_default();
                let blocks = filled.as_ref().map(|f| f.open(&blocks)).unwrap_or_default();
                Ok((rows, blocks))
            }
            Prover::Gpu(session) => match session.ask(Command::Open(rows, blocks)).await? {
                Answer::Opened(rows, blocks) => Ok((rows, blocks)),
                _ => Err("the CUDA prover answered out of turn".into()),
            },
        }
    }
}

enum Command {
    Fill([u8; 32], FillShape),
    Prove([u8; 32], Shape),
    Open(Vec<u32>, Vec<(u32, u32)>),
}

enum Answer {
    Ready(String),
    Root(Hash),
    Opened(Vec<Opened>, Vec<Opening>),
}

/// The CUDA prover on one GPU, on a thread of its own: commands in, answers out.
pub(crate) struct GpuSession {
    /// The device's name, as the driver gives it.
    name: String,
    commands: std::sync::mpsc::Sender<Command>,
    answers: tokio::sync::mpsc::Receiver<Result<Answer, String>>,
}

impl GpuSession {
    /// Opens GPU `uuid` (the driver compiles the kernels for it here, before any clock
    /// starts) on a thread that holds it until the session is dropped.
    pub(crate) async fn open(uuid: GpuUuid) -> Result<GpuSession, String> {
        if uuid.is_mig() {
            return Err(format!(
                "{uuid} is a MIG slice: the CUDA prover challenges whole GPUs"
            ));
        }
        let (commands, inbox) = std::sync::mpsc::channel();
        let (outbox, answers) = tokio::sync::mpsc::channel(1);
        let name = uuid.to_string();
        std::thread::Builder::new()
            .name("gpux-challenge-gpu".into())
            .spawn(move || gpu_worker(&name, &inbox, &outbox))
            .map_err(|e| format!("starting the CUDA prover: {e}"))?;
        let mut session = GpuSession {
            name: String::new(),
            commands,
            answers,
        };
        match session.next().await? {
            Answer::Ready(name) => {
                session.name = name;
                Ok(session)
            }
            _ => Err("the CUDA prover answered out of turn".into()),
        }
    }

    async fn next(&mut self) -> Result<Answer, String> {
        self.answers
            .recv()
            .await
            .unwrap_or_else(|| Err("the CUDA prover stopped".into()))
    }

    async fn ask(&mut self, command: Command) -> Result<Answer, String> {
        self.commands
            .send(command)
            .map_err(|_| "the CUDA prover stopped".to_string())?;
        self.next().await
    }

    async fn root(&mut self, command: Command) -> Result<Hash, String> {
        match self.ask(command).await? {
            Answer::Root(root) => Ok(root),
            _ => Err("the CUDA prover answered out of turn".into()),
        }
    }
}

/// The CUDA prover's thread: opens the GPU, then fills, proves and opens as told, holding
/// the fill and the product's tree on the GPU until the session ends.
fn gpu_worker(
    uuid: &str,
    inbox: &std::sync::mpsc::Receiver<Command>,
    outbox: &tokio::sync::mpsc::Sender<Result<Answer, String>>,
) {
    let device = match Device::open(uuid) {
        Ok(device) => device,
        Err(e) => {
            let _ = outbox.blocking_send(Err(e.to_string()));
            return;
        }
    };
    if outbox
        .blocking_send(Ok(Answer::Ready(device.info.name.clone())))
        .is_err()
    {
        return;
    }
    let mut filled: Option<GpuFill<'_>> = None;
    let mut proved: Option<GpuProduct<'_>> = None;
    while let Ok(command) = inbox.recv() {
        let answer = match command {
            Command::Fill(seed, shape) => device.fill(&seed, shape).map(|f| {
                let root = f.root;
                filled = Some(f);
                Answer::Root(root)
            }),
            Command::Prove(seed, shape) => device.prove(&seed, shape).map(|p| {
                let root = p.root;
                proved = Some(p);
                Answer::Root(root)
            }),
            Command::Open(rows, blocks) => (|| {
                let rows = match &proved {
                    Some(p) => p.open(&rows)?,
                    None => Vec::new(),
                };
                let blocks = match &filled {
                    Some(f) => f.open(&blocks)?,
                    None => Vec::new(),
                };
                Ok(Answer::Opened(rows, blocks))
            })(),
        };
        let answer = answer.map_err(|e: gpux_attestation::challenge::gpu::GpuError| e.to_string());
        if outbox.blocking_send(answer).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renter cannot make a GPU compute for more than a minute: the bound follows the
    /// model's INT8 peak (an L4's minute is a fifth of an H100's).
    #[test]
    fn a_gpu_computes_at_most_a_minute_at_its_peak() {
        let one_second_h100 = Shape::new(1_843_136, 32_768, 8_192).unwrap();
        assert!(gpu_proves(one_second_h100, "NVIDIA H100 80GB HBM3").is_ok());
        assert!(gpu_proves(one_second_h100, "NVIDIA L4").is_ok());
        // The protocol's largest product (2^55 operations) is 18 s of an H100's peak,
        // 149 s of an L4's: refused there.
        let largest = Shape::new(
            gpux_protocol::MAX_CHALLENGE_M,
            gpux_protocol::MAX_CHALLENGE_K,
            gpux_protocol::MAX_CHALLENGE_N,
        )
        .unwrap();
        assert!(gpu_proves(largest, "NVIDIA H100 80GB HBM3").is_ok());
        let why = gpu_proves(largest, "NVIDIA L4").unwrap_err();
        assert!(why.contains("60 s at its INT8 peak"), "{why}");
        assert!(gpu_proves(largest, "NVIDIA Tesla T4").is_err());
    }
}
