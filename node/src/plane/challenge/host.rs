//! The host's side of a challenge: admit the lease's renter, pause the workload, prove
//! (the fill, then the product), open what the renter picks.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::StreamExt;
use gpux_attestation::challenge::Shape;
use gpux_attestation::challenge::fill::FillShape;
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
use super::prover::{FakeGpu, GpuSession, Prover};
use crate::attest::now;
use crate::executor::Executor;
use crate::p2p::Client;
use crate::plane::{FramedStream, OPEN_WITHIN, framed, recv, send};
use crate::store::{NodeState, SledStore};

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
    /// `Ok((true, _))`: it runs, and its container is paused while the host proves; the
    /// lease's GPUs.
    fn admit(
        &self,
        peer: PeerId,
        lease: ContentId,
    ) -> Result<(bool, Vec<GpuUuid>), (PlaneRefusal, String)> {
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
        Ok((running, request.gpus.to_vec()))
    }

    /// The CUDA prover on each of the lease's GPUs, opened before the renter's clock starts
    /// (the driver compiles the kernels as it opens each).
    async fn open_gpus(gpus: &[GpuUuid]) -> Result<Vec<(GpuUuid, GpuSession)>, String> {
        let opened = futures::future::join_all(gpus.iter().map(|&g| GpuSession::open(g))).await;
        gpus.iter()
            .zip(opened)
            .map(|(&g, session)| Ok((g, session.map_err(|e| format!("{g}: {e}"))?)))
            .collect()
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
        let (running, gpus) = match self.admit(peer, open.lease) {
            Ok(admitted) => admitted,
            Err((code, detail)) => return refuse(&mut framed, code, &detail).await,
        };
        let Ok(_permit) = self.busy.clone().try_acquire_owned() else {
            return refuse(&mut framed, PlaneRefusal::Busy, "another challenge runs").await;
        };
        let mut sessions = Vec::new();
        if !self.fake_gpus {
            match Self::open_gpus(&gpus).await {
                Ok(opened) => sessions = opened,
                Err(why) => {
                    let why = format!("the CUDA prover cannot run: {why}");
                    return refuse(&mut framed, PlaneRefusal::Unavailable, &why).await;
                }
            }
        }
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
        let mut prover = if self.fake_gpus {
            Prover::Cpu {
                fake: request.gpu.and_then(|g| self.fakes.get(&g).copied()),
                filled: None,
                proof: None,
            }
        } else {
            let named = request
                .gpu
                .and_then(|g| sessions.into_iter().find(|(s, _)| *s == g));
            match named {
                Some((_, session)) => Prover::Gpu(session),
                None => {
                    let why = "the challenge names none of the lease's GPUs";
                    let _ = send(&mut framed, &fail(why)).await;
                    return;
                }
            }
        };
        let work = Shape::new(request.m, request.k, request.n)
            .map_err(|e| e.to_string())
            .and_then(|shape| Ok((shape, prover.admits(shape, &request)?)));
        let (shape, fill_shape) = match work {
            Ok(work) => work,
            Err(why) => {
                let _ = send(&mut framed, &fail(&why)).await;
                return;
            }
        };
        let seed = request.seed;
        // The fill first: its root stops the renter's first clock.
        let fill_root = match fill_shape {
            Some(f) => match prover.fill(seed, f).await {
                Ok(root) => {
                    let filled = ChallengeAnswer::Filled(ContentId(root));
                    if send(&mut framed, &filled).await.is_err() {
                        return;
                    }
                    Some(root)
                }
                Err(why) => {
                    let _ = send(&mut framed, &fail(&format!("the fill: {why}"))).await;
                    return;
                }
            },
            None => None,
        };
        let started = Instant::now();
        let rows_root = match prover.prove(seed, shape).await {
            Ok(root) => root,
            Err(why) => {
                let _ = send(&mut framed, &fail(&format!("the product: {why}"))).await;
                return;
            }
        };
        let body = ChallengeResponse {
            request: request.id(),
            created_at: now(),
            rows_root: ContentId(rows_root),
            fill_root: fill_root.map(ContentId),
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
        let picks = pick.blocks.iter().map(|b| (b.lane, b.index)).collect();
        let (rows, blocks) = match prover.open(pick.rows.to_vec(), picks).await {
            Ok(opened) => opened,
            Err(why) => {
                let _ = send(&mut framed, &fail(&format!("opening: {why}"))).await;
                return;
            }
        };
        for row in rows {
            let values: Vec<u8> = row.row.iter().flat_map(|v| v.to_le_bytes()).collect();
            let Some(answer) =
                opened_answer(values, row.path, |values, path| ChallengeAnswer::Row {
                    index: row.index,
                    values,
                    path,
                })
            else {
                return;
            };
            if send(&mut framed, &answer).await.is_err() {
                return;
            }
        }
        for block in blocks.into_iter().flatten() {
            let words: Vec<u8> = block.block.iter().flat_map(|w| w.to_le_bytes()).collect();
            let at = BlockAt {
                lane: block.lane,
                index: block.index,
            };
            let Some(answer) = opened_answer(words, block.path, |words, path| {
                ChallengeAnswer::Block { at, words, path }
            }) else {
                return;
            };
            if send(&mut framed, &answer).await.is_err() {
                return;
            }
        }
        let _ = send(&mut framed, &ChallengeAnswer::Done).await;
    }
}

/// An opened row or block as a frame: its bytes and path within the wire's bounds.
fn opened_answer<const B: usize, const P: usize>(
    bytes: Vec<u8>,
    path: Vec<[u8; 32]>,
    frame: impl FnOnce(BoundedBytes<B>, BoundedVec<ContentId, P>) -> ChallengeAnswer,
) -> Option<ChallengeAnswer> {
    let bytes = BoundedBytes::new(bytes).ok()?;
    let path = BoundedVec::new(path.into_iter().map(ContentId).collect()).ok()?;
    Some(frame(bytes, path))
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
