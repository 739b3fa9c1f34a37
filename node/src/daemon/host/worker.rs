//! A lease's container, as the host's shell handles it: one worker task per lease carries
//! out the machine's container effects in order (start, stop, erase), and while the
//! container runs a watcher reports its exit the moment Docker does (`wait`), and a sampler
//! reports usage and ships the output to the renter every second. Slow Docker calls only
//! slow these tasks; the lease's timers (receipts, deadlines) run in the loop and never
//! wait on them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpux_lease::{HostInput, StartFailure, UsageSample};
use gpux_protocol::{
    BoundedBytes, ContentId, Ext, Keypair, LeaseRequest, LogChunk, LogStream, Signed, Timestamp,
    Verified,
};
use tokio::sync::{mpsc, watch};

use crate::daemon::{Event, report};
use crate::executor::{ContainerSpec, ExecError, Executor, GpuBinding, LogCursor, Workspaces};
use crate::p2p::{Client, Proto};

/// The preemption notice's file, in the lease's `/run/gpux`.
pub(crate) const PREEMPTION_FILE: &str = "preemption.json";
/// Most container output shipped per chunk.
const LOG_CHUNK_BYTES: usize = 32 * 1024;
/// How long a request to the renter may take.
pub(crate) const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a running container is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the worker is asked to do.
#[derive(Debug)]
pub(crate) enum ExecOp {
    /// Make the lease's workspace before its start (the work waits for the renter's
    /// commit; the renter may copy files in first).
    Prepare,
    Start,
    /// Watch a container found running after a restart.
    Watch,
    Stop {
        grace_s: u32,
    },
    /// A spot lease is preempted: the notice for the workload, ending it at `ends_at`.
    Notify {
        ends_at: Timestamp,
    },
    Erase,
}

/// Where the shipping of a lease's output stands.
#[derive(Debug, Clone)]
struct LogState {
    cursor: LogCursor,
    seq: u64,
}

/// What a worker needs.
#[derive(Clone)]
pub(crate) struct WorkerCtx {
    pub(crate) key: Keypair,
    pub(crate) net: Client,
    pub(crate) exec: Executor,
    pub(crate) events: mpsc::Sender<Event>,
    pub(crate) fake_gpus: bool,
    pub(crate) nvml: Option<Arc<gpux_attestation::Probe>>,
    pub(crate) workspaces: Workspaces,
    /// The longest the host keeps a workspace after its lease, seconds.
    pub(crate) max_retain_s: u64,
    /// Renters' staged images, released when their lease ends.
    pub(crate) staged: crate::plane::staged::StagedImages,
    /// Where each spot lease's `/run/gpux` is written (`<data-dir>/run/<lease>`).
    pub(crate) run_root: std::path::PathBuf,
    /// Workers still running: a lease settles before its worker has always finished
    /// erasing its container, so a stopping host waits for them too.
    pub(crate) live: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts a worker as live until it ends.
struct Live(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The container spec of a lease.
pub(crate) fn spec(request: &LeaseRequest, lease: ContentId, fake: bool) -> ContainerSpec {
    ContainerSpec {
        lease: gpux_protocol::hex(&lease.0),
        image: request.image,
        command: request.command.iter().map(|s| s.to_string()).collect(),
        env: request
            .env
            .iter()
            .map(|v| (v.name.to_string(), v.value.to_string()))
            .collect(),
        memory_bytes: request.limits.memory_bytes,
        cpu_millis: request.limits.cpu_millis,
        pids: request.limits.pids,
        scratch_bytes: request.limits.scratch_bytes,
        shm_bytes: request.limits.shm_bytes,
        network: request.network,
        gpus: {
            let devices = request.gpus.iter().map(ToString::to_string).collect();
            if fake {
                GpuBinding::Fake(devices)
            } else {
                GpuBinding::Real(devices)
            }
        },
        workspace: None,
        run_dir: None,
    }
}

/// Starts a lease's worker; returns the queue of its operations.
pub(crate) fn spawn(
    ctx: WorkerCtx,
    request: Verified<LeaseRequest>,
    container: Option<String>,
    log_cursor: Option<&str>,
    log_chunks: u64,
) -> mpsc::UnboundedSender<ExecOp> {
    let (tx, rx) = mpsc::unbounded_channel();
    let logs = LogState {
        cursor: log_cursor
            .and_then(|c| serde_json::from_str(c).ok())
            .unwrap_or(LogCursor::START),
        seq: log_chunks,
    };
    let worker = Worker {
        ctx,
        lease: request.id(),
        request,
        container,
        logs: Arc::new(Mutex::new(logs)),
        stop_watch: None,
    };
    worker
        .ctx
        .live
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let live = Live(worker.ctx.live.clone());
    tokio::spawn(async move {
        let _live = live;
        worker.run(rx).await;
    });
    tx
}

struct Worker {
    ctx: WorkerCtx,
    lease: ContentId,
    request: Verified<LeaseRequest>,
    container: Option<String>,
    logs: Arc<Mutex<LogState>>,
    /// Set when the watcher and sampler should stop.
    stop_watch: Option<watch::Sender<bool>>,
}

impl Worker {
    async fn tell(&self, input: HostInput) {
        report(
            &self.ctx.events,
            Event::Host {
                lease: self.lease,
                input,
            },
        )
        .await;
    }

    async fn run(mut self, mut ops: mpsc::UnboundedReceiver<ExecOp>) {
        while let Some(op) = ops.recv().await {
            match op {
                ExecOp::Prepare => self.prepare().await,
                ExecOp::Start => self.start().await,
                ExecOp::Watch => self.watch(),
                ExecOp::Stop { grace_s } => self.stop(grace_s).await,
                ExecOp::Notify { ends_at } => self.notify(ends_at).await,
                ExecOp::Erase => {
                    self.erase().await;
                    // Nothing follows an erasure.
                    return;
                }
            }
        }
    }

    /// The lease's directory for the workload, `/run/gpux` inside (spot leases only).
    fn run_dir(&self) -> Option<std::path::PathBuf> {
        matches!(self.request.kind, gpux_protocol::LeaseKind::Spot)
            .then(|| self.ctx.run_root.join(gpux_protocol::hex(&self.lease.0)))
    }

    /// Writes the preemption notice where the workload reads it, as AWS's instance-action
    /// (`/run/gpux/preemption.json`: action, time, the lease), atomically.
    async fn notify(&mut self, ends_at: Timestamp) {
        let Some(dir) = self.run_dir() else {
            return;
        };
        let text = serde_json::json!({
            "action": "terminate",
            "lease": gpux_protocol::hex(&self.lease.0),
            "notice_at_ms": crate::attest::now().0,
            "ends_at_ms": ends_at.0,
            "ends_in_s": ends_at.0.saturating_sub(crate::attest::now().0) / 1000,
        })
        .to_string();
        let written = async {
            tokio::fs::create_dir_all(&dir).await?;
            let part = dir.join(".preemption.json.part");
            tokio::fs::write(&part, format!("{text}\n")).await?;
            tokio::fs::rename(&part, dir.join(PREEMPTION_FILE)).await
        };
        if let Err(e) = written.await {
            tracing::warn!(
                "lease {}: cannot write its preemption notice: {e}",
                self.lease.short()
            );
        }
    }

    async fn prepare(&mut self) {
        if let Ok(Some(bytes)) = self.request.workspace_bytes() {
            let hex = gpux_protocol::hex(&self.lease.0);
            // A failure here fails the start, which makes it again.
            if let Err(e) = self.ctx.workspaces.create(&hex, bytes).await {
                tracing::warn!("lease {}: no workspace yet: {e}", self.lease.short());
            }
        }
    }

    async fn start(&mut self) {
        let mut spec = spec(&self.request, self.lease, self.ctx.fake_gpus);
        if let Some(dir) = self.run_dir() {
            match tokio::fs::create_dir_all(&dir).await {
                Ok(()) => spec.run_dir = Some(dir),
                Err(e) => {
                    tracing::warn!("lease {}: no /run/gpux: {e}", self.lease.short());
                    self.tell(HostInput::ContainerNotStarted(StartFailure::Failed))
                        .await;
                    return;
                }
            }
        }
        if let Ok(Some(bytes)) = self.request.workspace_bytes() {
            match self.ctx.workspaces.create(&spec.lease, bytes).await {
                Ok(dir) => spec.workspace = Some(dir),
                Err(e) => {
                    tracing::warn!("lease {}: no workspace: {e}", self.lease.short());
                    self.tell(HostInput::ContainerNotStarted(StartFailure::Failed))
                        .await;
                    return;
                }
            }
        }
        let started = match self.ctx.exec.start(&spec).await {
            Ok(id) => {
                self.container = Some(id.clone());
                match self.ctx.exec.inspect(&id).await {
                    Ok(Some(info)) => info.started_at_ms.ok_or(StartFailure::Failed),
                    // The container vanished as it started.
                    _ => Err(StartFailure::Failed),
                }
            }
            Err(ExecError::ImageMissing { .. }) => Err(StartFailure::ImageMissing),
            Err(e) => {
                tracing::warn!(
                    "lease {}: the container did not start: {e}",
                    self.lease.short()
                );
                Err(StartFailure::Failed)
            }
        };
        match started {
            Ok(at) => {
                self.tell(HostInput::ContainerStarted {
                    started_at: Timestamp(at),
                })
                .await;
                self.watch();
            }
            Err(why) => self.tell(HostInput::ContainerNotStarted(why)).await,
        }
    }

    /// Starts the watcher (exit) and the sampler (usage, output) of the running container.
    fn watch(&mut self) {
        let Some(container) = self.container.clone() else {
            return;
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        self.stop_watch = Some(stop_tx);
        let ctx = self.ctx.clone();
        let lease = self.lease;
        {
            let (ctx, container) = (ctx.clone(), container.clone());
            tokio::spawn(async move {
                ctx.exec.wait(&container).await;
                let info = ctx.exec.inspect(&container).await.ok().flatten();
                let input = HostInput::ContainerExited {
                    finished_at: info.as_ref().and_then(|i| i.finished_at_ms).map(Timestamp),
                    exit_code: info.as_ref().and_then(|i| i.exit_code),
                };
                report(&ctx.events, Event::Host { lease, input }).await;
            });
        }
        let sampler = Sampler {
            ctx,
            lease,
            container,
            uuids: self.request.gpus.iter().map(ToString::to_string).collect(),
            renter: renter_peer(&self.request),
            logs: self.logs.clone(),
        };
        tokio::spawn(sampler.run(stop_rx));
    }

    async fn stop(&mut self, grace_s: u32) {
        let mut input = HostInput::ContainerExited {
            finished_at: None,
            exit_code: None,
        };
        if let Some(container) = self.container.clone() {
            if let Err(e) = self.ctx.exec.stop(&container, grace_s).await {
                tracing::warn!("lease {}: stopping the container: {e}", self.lease.short());
            }
            if let Ok(Some(info)) = self.ctx.exec.inspect(&container).await {
                input = HostInput::ContainerExited {
                    finished_at: info.finished_at_ms.map(Timestamp),
                    exit_code: info.exit_code,
                };
            }
        }
        self.tell(input).await;
    }

    async fn erase(&mut self) {
        if let Some(stop) = self.stop_watch.take() {
            let _ = stop.send(true);
        }
        let Some(container) = self.container.clone() else {
            // Never started (not committed, say): nothing was paid for, so nothing is kept.
            self.erase_workspace(false).await;
            self.release_image().await;
            self.tell(HostInput::ContainerErased).await;
            return;
        };
        // The last of its output, while it still exists.
        let sampler = Sampler {
            ctx: self.ctx.clone(),
            lease: self.lease,
            container: container.clone(),
            uuids: Vec::new(),
            renter: renter_peer(&self.request),
            logs: self.logs.clone(),
        };
        sampler.ship_logs().await;
        match self.ctx.exec.remove(&container).await {
            Ok(()) => {
                self.erase_workspace(true).await;
                self.release_image().await;
                self.tell(HostInput::ContainerErased).await;
            }
            Err(e) => tracing::error!("lease {}: erasing the container: {e}", self.lease.short()),
        }
    }

    /// After its container is gone: a staged image the lease ran is erased (or kept for the
    /// renter, when the lease asked to cache it).
    async fn release_image(&self) {
        let lease = self.lease;
        self.ctx
            .staged
            .release(|l| *l != lease, crate::attest::now().0);
        self.ctx.staged.erase_expired(&self.ctx.exec).await;
    }

    /// After its container is gone: keeps the lease's workspace (if it has one) for its
    /// retention, for `gpux cp` to fetch results from, and erases it then; at once when the
    /// retention is 0 or `keep` is false.
    async fn erase_workspace(&self, keep: bool) {
        // The lease's /run/gpux goes with its container.
        if let Some(dir) = self.run_dir()
            && let Err(e) = tokio::fs::remove_dir_all(&dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(
                "lease {}: cannot remove {}: {e}",
                self.lease.short(),
                dir.display()
            );
        }
        let hex = gpux_protocol::hex(&self.lease.0);
        // What the lease agreed (and paid, when priced): the offer's longest at most, so the
        // cap only binds a request that somehow got past it.
        let retain_s = self
            .request
            .retention_s()
            .unwrap_or(0)
            .min(self.ctx.max_retain_s);
        if keep && retain_s > 0 && self.ctx.workspaces.bytes(&hex) > 0 {
            let until = crate::attest::now().0.saturating_add(retain_s * 1000);
            match self.ctx.workspaces.retain(&hex, until).await {
                Ok(()) => {
                    tracing::info!(
                        "lease {}: its workspace is kept {retain_s} s for the renter",
                        self.lease.short()
                    );
                    self.ctx.workspaces.erase_at(&hex, until);
                    return;
                }
                Err(e) => tracing::error!(
                    "lease {}: cannot keep the workspace ({e}); erasing it",
                    self.lease.short()
                ),
            }
        }
        if let Err(e) = self.ctx.workspaces.remove(&hex).await {
            tracing::error!("lease {}: erasing the workspace: {e}", self.lease.short());
        }
    }
}

fn renter_peer(request: &Verified<LeaseRequest>) -> Option<libp2p::PeerId> {
    libp2p::PeerId::from_bytes(&request.signer().peer_id().to_bytes()).ok()
}

/// Samples a running container and ships its output, every second.
struct Sampler {
    ctx: WorkerCtx,
    lease: ContentId,
    container: String,
    uuids: Vec<String>,
    renter: Option<libp2p::PeerId>,
    logs: Arc<Mutex<LogState>>,
}

impl Sampler {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tick.tick() => {}
            }
            let Ok(sample) = self.ctx.exec.sample(&self.container).await else {
                // Gone or stopped: the watcher reports it.
                return;
            };
            let gpu = self
                .ctx
                .nvml
                .as_ref()
                .and_then(|n| n.usage(&self.uuids).ok());
            let input = HostInput::Sample(UsageSample {
                memory_bytes: sample.memory_bytes,
                cpu_total_ns: sample.cpu_total_ns,
                gpu_util_permille: gpu.map(|g| g.util_permille),
                gpu_memory_bytes: gpu.map(|g| g.memory_used_bytes),
            });
            report(
                &self.ctx.events,
                Event::Host {
                    lease: self.lease,
                    input,
                },
            )
            .await;
            self.ship_logs().await;
        }
    }

    /// Sends the container's new output to the renter (best effort: output the renter did
    /// not take is sent again next time).
    async fn ship_logs(&self) {
        let Some(renter) = self.renter else {
            return;
        };
        let state = self
            .logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Ok((data, next)) = self
            .ctx
            .exec
            .logs_since(&self.container, state.cursor, LOG_CHUNK_BYTES)
            .await
        else {
            return;
        };
        if data.is_empty() {
            return;
        }
        let Ok(bytes) = BoundedBytes::new(data) else {
            return;
        };
        let len = bytes.len() as u64;
        let chunk = LogChunk {
            lease: self.lease,
            seq: state.seq,
            created_at: crate::attest::now(),
            stream: LogStream::Stdout,
            data: bytes,
            ext: Ext::new(),
        };
        let Ok(chunk) = Signed::sign(&self.ctx.key, chunk) else {
            return;
        };
        let sent = tokio::time::timeout(
            PEER_TIMEOUT,
            self.ctx
                .net
                .request_on(Proto::Receipt, renter, chunk.as_bytes().to_vec()),
        )
        .await;
        if !matches!(sent, Ok(Ok(_))) {
            return;
        }
        let cursor = serde_json::to_string(&next).unwrap_or_default();
        {
            let mut state = self
                .logs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state.cursor = next;
            state.seq += 1;
        }
        report(
            &self.ctx.events,
            Event::Host {
                lease: self.lease,
                input: HostInput::LogsShipped {
                    cursor,
                    chunks: 1,
                    bytes: len,
                },
            },
        )
        .await;
    }
}
