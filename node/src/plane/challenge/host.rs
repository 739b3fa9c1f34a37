//! The host's side of a challenge: admit the lease's renter, pause the workload, prove
//! (the fill, then the product), open what the renter picks.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gpux_attestation::Disguise;
use gpux_attestation::challenge::fill::{self, FillShape};
use gpux_attestation::challenge::{self, Shape};
use gpux_lease::HostPhase;
use gpux_protocol::plane_wire::{
    BlockAt, ChallengeAnswer, ChallengeOpen, ChallengePick, Opened, PlaneRefusal,
};
use gpux_protocol::{
    BoundedBytes, BoundedString, BoundedVec, ChallengeRequest, ChallengeResponse, ContentId, Ext,
    GpuUuid, Keypair, Signed,
};
use libp2p::PeerId;

use super::CHALLENGE;
use crate::attest::now;
use crate::executor::Executor;
use crate::p2p::Client;
use crate::plane::{FramedStream, OPEN_WITHIN, framed, recv, send};
use crate::store::{NodeState, SledStore};

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

/// The host's side: serves challenges of its held leases with the CPU prover (fake GPUs
/// only).
#[derive(Clone)]
pub(crate) struct ChallengeHost {
    pub(crate) key: Keypair,
    pub(crate) state: NodeState<SledStore>,
    /// Pauses a running lease's container while its challenge proves.
    pub(crate) exec: Executor,
    pub(crate) fake_gpus: bool,
    /// Fake GPUs by device: their provers answer at their model's rates, scaled, and a
    /// disguised one with its real model's memory and rates.
    pub(crate) fakes: std::sync::Arc<BTreeMap<GpuUuid, FakeGpu>>,
    /// One challenge at a time per host: the prover has the machine's cores.
    pub(crate) busy: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Lets a paused container run again when dropped, on every way out of a challenge.
struct Unpause {
    exec: Executor,
    container: String,
}

impl Drop for Unpause {
    fn drop(&mut self) {
        let exec = self.exec.clone();
        let container = std::mem::take(&mut self.container);
        tokio::spawn(async move {
            if let Err(e) = exec.unpause(&container).await {
                tracing::warn!("unpausing {container} after a challenge: {e}");
            }
        });
    }
}

async fn refuse(framed: &mut FramedStream, code: PlaneRefusal, detail: &str) {
    let _ = send(framed, &Opened::refused(code, detail)).await;
}

impl ChallengeHost {
    /// Takes `/gpux/challenge/1` on `net`.
    pub(crate) fn spawn(self, net: &Client) -> anyhow::Result<()> {
        let mut streams = net.accept_streams(CHALLENGE)?;
        tokio::spawn(async move {
            while let Some((peer, stream)) = streams.next().await {
                let h = self.clone();
                tokio::spawn(async move { h.serve(peer, framed(stream)).await });
            }
        });
        Ok(())
    }

    /// Whether `peer` may challenge `lease` now: its renter, while it is held or running.
    /// `Ok(true)`: it runs, and its container is paused while the host proves.
    fn admit(&self, peer: PeerId, lease: ContentId) -> Result<bool, (PlaneRefusal, String)> {
        let (record, request) = crate::plane::renters_lease(&self.state, peer, lease)?;
        let held = record.phase == HostPhase::Starting
            && record.committed_at.is_none()
            && matches!(request.commit_wait_ms(), Ok(Some(_)));
        let running = record.phase == HostPhase::Running;
        if !held && !running {
            return Err((
                PlaneRefusal::NotRunning,
                "a challenge runs on a held lease, before its commit, or on a running one".into(),
            ));
        }
        if !self.fake_gpus {
            return Err((
                PlaneRefusal::Unavailable,
                "this host has no GPU prover yet (the CUDA prover is pending)".into(),
            ));
        }
        Ok(running)
    }

    /// The container of a running lease, paused: `None` when it could not be found or
    /// frozen (the challenge is then refused rather than measured against the workload).
    async fn pause(&self, lease: ContentId) -> Option<String> {
        let hex = gpux_protocol::hex(&lease.0);
        let container = self
            .exec
            .containers()
            .await
            .ok()?
            .into_iter()
            .find(|(l, _)| *l == hex)
            .map(|(_, c)| c)?;
        match self.exec.pause(&container).await {
            Ok(()) => Some(container),
            Err(e) => {
                tracing::warn!("lease {}: pausing for a challenge: {e}", lease.short());
                None
            }
        }
    }

    async fn serve(self, peer: PeerId, mut framed: FramedStream) {
        let open: ChallengeOpen = match recv(&mut framed, OPEN_WITHIN).await {
            Ok(open) => open,
            Err(e) => {
                return refuse(&mut framed, PlaneRefusal::Malformed, &e.to_string()).await;
            }
        };
        let running = match self.admit(peer, open.lease) {
            Ok(running) => running,
            Err((code, detail)) => return refuse(&mut framed, code, &detail).await,
        };
        let Ok(_permit) = self.busy.clone().try_acquire_owned() else {
            return refuse(&mut framed, PlaneRefusal::Busy, "another challenge runs").await;
        };
        // A running lease's workload is frozen from before the renter's clock starts until
        // the host's answer is sent (when it stops): Docker's latency is never timed.
        let paused = if running {
            match self.pause(open.lease).await {
                Some(container) => Some(Unpause {
                    exec: self.exec.clone(),
                    container,
                }),
                None => {
                    let why = "the workload could not be paused for the challenge";
                    return refuse(&mut framed, PlaneRefusal::Unavailable, why).await;
                }
            }
        } else {
            None
        };
        if send(&mut framed, &Opened::Yes).await.is_err() {
            return;
        }
        let fail = |why: &str| ChallengeAnswer::Failed(BoundedString::new(why).unwrap_or_default());
        let request = match recv::<BoundedBytes<512>>(&mut framed, OPEN_WITHIN).await {
            Ok(bytes) => Signed::<ChallengeRequest>::from_bytes(bytes.into_inner())
                .and_then(Signed::verify)
                .ok()
                .filter(|r| {
                    r.host == self.key.public()
                        && PeerId::from_bytes(&r.signer().peer_id().to_bytes()).ok() == Some(peer)
                }),
            Err(_) => return,
        };
        let Some(request) = request else {
            let _ = send(&mut framed, &fail("not a challenge this host answers")).await;
            return;
        };
        let work = Shape::new(request.m, request.k, request.n)
            .map_err(|e| e.to_string())
            .and_then(|shape| cpu_proves(shape).map(|()| shape))
            .and_then(|shape| Ok((shape, cpu_fills(&request)?)));
        let (shape, fill_shape) = match work {
            Ok(work) => work,
            Err(why) => {
                let _ = send(&mut framed, &fail(&why)).await;
                return;
            }
        };
        let fake = request.gpu.and_then(|g| self.fakes.get(&g).copied());
        let seed = request.seed;
        // The fill first: its root stops the renter's first clock.
        let filled = match fill_shape {
            Some(f) => {
                let holds = fake.map_or(u64::MAX, |g| g.holds(f.bytes()));
                let started = Instant::now();
                let Ok(filled) =
                    tokio::task::spawn_blocking(move || fill::fill_cpu(&seed, f, holds)).await
                else {
                    return;
                };
                pace(started, fake.map(|g| g.fill_time(f))).await;
                if send(
                    &mut framed,
                    &ChallengeAnswer::Filled(ContentId(filled.root)),
                )
                .await
                .is_err()
                {
                    return;
                }
                Some(filled)
            }
            None => None,
        };
        let started = Instant::now();
        let Ok(proof) =
            tokio::task::spawn_blocking(move || challenge::prove_cpu(&seed, shape)).await
        else {
            return;
        };
        pace(started, fake.map(|g| g.product_time(shape))).await;
        let body = ChallengeResponse {
            request: request.id(),
            created_at: now(),
            rows_root: ContentId(proof.root),
            fill_root: filled.as_ref().map(|f| ContentId(f.root)),
            elapsed_ns: u64::try_from(started.elapsed().as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
            ext: Ext::new(),
        };
        let Ok(signed) = Signed::sign(&self.key, body) else {
            return;
        };
        let Ok(bytes) = BoundedBytes::new(signed.as_bytes().to_vec()) else {
            return;
        };
        if send(&mut framed, &ChallengeAnswer::Response(bytes))
            .await
            .is_err()
        {
            return;
        }
        drop(paused);
        let Ok(pick) = recv::<ChallengePick>(&mut framed, OPEN_WITHIN).await else {
            return;
        };
        if let Err(why) = pick_holds(&pick, shape, fill_shape) {
            let _ = send(&mut framed, &fail(why)).await;
            return;
        }
        for row in proof.open(&pick.rows) {
            let values: Vec<u8> = row.row.iter().flat_map(|v| v.to_le_bytes()).collect();
            let (Ok(values), Ok(path)) = (
                BoundedBytes::new(values),
                BoundedVec::new(row.path.into_iter().map(ContentId).collect()),
            ) else {
                return;
            };
            let answer = ChallengeAnswer::Row {
                index: row.index,
                values,
                path,
            };
            if send(&mut framed, &answer).await.is_err() {
                return;
            }
        }
        if let Some(filled) = &filled {
            let picks: Vec<(u32, u32)> = pick.blocks.iter().map(|b| (b.lane, b.index)).collect();
            for block in filled.open(&picks).into_iter().flatten() {
                let words: Vec<u8> = block.block.iter().flat_map(|w| w.to_le_bytes()).collect();
                let (Ok(words), Ok(path)) = (
                    BoundedBytes::new(words),
                    BoundedVec::new(block.path.into_iter().map(ContentId).collect()),
                ) else {
                    return;
                };
                let at = BlockAt {
                    lane: block.lane,
                    index: block.index,
                };
                if send(&mut framed, &ChallengeAnswer::Block { at, words, path })
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        let _ = send(&mut framed, &ChallengeAnswer::Done).await;
    }
}

/// Whether the renter's pick names distinct rows of the product and blocks of the fill
/// (past each lane's first two), ascending.
fn pick_holds(
    pick: &ChallengePick,
    shape: Shape,
    fill: Option<FillShape>,
) -> Result<(), &'static str> {
    let rows_ok =
        pick.rows.windows(2).all(|w| w[0] < w[1]) && pick.rows.iter().all(|&i| i < shape.m);
    let blocks_ok = pick.blocks.windows(2).all(|w| w[0] < w[1])
        && match fill {
            Some(f) => pick
                .blocks
                .iter()
                .all(|b| b.lane < f.lanes && (2..f.blocks).contains(&b.index)),
            None => pick.blocks.is_empty(),
        };
    if rows_ok && blocks_ok {
        Ok(())
    } else {
        Err("the pick is not distinct rows of the product and blocks of the fill, ascending")
    }
}
