//! Spot leases that resume after a preemption (`gpux rent --spot --resume`).
//!
//! When such a lease ends preempted, this node (the renter's) copies its workspace (or the
//! directories the rent names, `--carry`) out of the old lease (which keeps it for its
//! retention) into the chain's mirror on this machine, fetching only what changed since the
//! last move; rents the same work again (the best fitting offer, trying for up to the resume
//! timeout), held for its commit so its clock does not run; copies the mirror into the new
//! workspace; and commits, so the workload starts again with its data and checkpoint in
//! place. Every hop is recorded ([`ResumeRecord`]: `gpux leases` shows the chain and what
//! moved); the new lease resumes in turn. The mirror goes when the chain ends.
//!
//! The hop's rules are the pure [`gpux_lease::ResumeHop`]'s (a chain never runs two leases
//! at once; a hop that gives up stops the lease it rented; one restarted after a stop of
//! this node looks at the lease it had rented before renting another); this does what it
//! says.

use std::path::PathBuf;
use std::time::Duration;

use gpux_api::{ApiError, Committed, RentRequest};
use gpux_lease::{NextLease, RenterPhase, ResumeHop, ResumeInput, ResumeNext, ResumeOutcome};
use gpux_lease::{ResumePlan, ResumeSide};
use gpux_protocol::ContentId;
use tokio::sync::{mpsc, oneshot};

use super::{Daemon, Event, LeaseAct, act, report};
use crate::attest::now;
use crate::plane::bridge::Bridge;
use crate::plane::copy::{CopyError, mirror_over, upload_tree_over};
use crate::store::{Moved, ResumeRecord, ResumeStatus};

/// How long a resume looks for a new lease when the rent does not say, seconds.
pub(crate) const DEFAULT_RESUME_TIMEOUT_S: u64 = 600;
/// How long a resumed lease holds its GPUs for its workspace to go in, seconds: the longest
/// hold a lease may sign.
const RESUME_HOLD_S: u64 = 300;
/// Between attempts to rent again, or to reach a workspace.
const RETRY: Duration = Duration::from_secs(3);
/// Attempts to reach a workspace (the host keeps the old one a moment after the end).
const FETCH_ATTEMPTS: u32 = 10;

/// A step of a resume, for the loop.
pub(crate) enum ResumeEvent {
    /// A rent with `--resume` started lease `lease`.
    Started {
        lease: ContentId,
        request: Box<RentRequest>,
    },
    /// One of this node's leases ended preempted (the renter's role noticed).
    Preempted(ContentId),
    /// The work was rented again as `next` (held for its commit).
    Rented {
        previous: ContentId,
        next: ContentId,
    },
    /// Commit the held lease `lease` (its workspace is in).
    Commit {
        lease: ContentId,
        moved: Moved,
        reply: oneshot::Sender<Result<Committed, ApiError>>,
    },
    /// Where this node's lease `lease` stands (none: ended, or not here).
    Look {
        lease: ContentId,
        reply: oneshot::Sender<Option<RenterPhase>>,
    },
    /// The chain runs on from `previous` as the lease its record names.
    Resumed { previous: ContentId },
    /// The resume of `lease` gave up.
    Failed { lease: ContentId, why: String },
    /// One of this node's spot leases ended without a preemption: a chain it ends lets its
    /// mirror go.
    Ended(ContentId),
}

/// One resume, run outside the loop.
struct ResumeTask {
    bridge: Bridge,
    events: mpsc::Sender<Event>,
    rent: super::rent::RentContext,
    previous: ContentId,
    /// The next lease, when the resume was under way before a stop of this node and had
    /// rented it.
    rented: Option<ContentId>,
    request: RentRequest,
    /// The chain's copy of what it carries, kept between moves.
    mirror: PathBuf,
}

/// What one move copied.
#[derive(Default)]
struct Copied {
    files: u64,
    bytes: u64,
    /// Bytes that crossed the link.
    transferred: u64,
}

impl ResumeTask {
    async fn run(self) {
        if let Err(why) = self.resume().await {
            tracing::warn!("lease {}: not resumed: {why}", self.previous.short());
            let lease = self.previous;
            report(
                &self.events,
                Event::Resume(ResumeEvent::Failed { lease, why }),
            )
            .await;
            // The chain ends here.
            let _ = tokio::fs::remove_dir_all(&self.mirror).await;
        }
    }

    async fn resume(&self) -> Result<(), String> {
        let dirs = super::rent::carried(&self.request).map_err(|e| e.message)?;
        let timeout_s = self
            .request
            .resume_timeout_s
            .unwrap_or(DEFAULT_RESUME_TIMEOUT_S);
        let plan = ResumePlan {
            timeout_ms: timeout_s.saturating_mul(1000),
            retry_ms: RETRY.as_millis() as u64,
        };
        let (mut hop, mut step) = ResumeHop::new(now(), plan, self.rented);
        let mut request = self.request.clone();
        request.hold_s = Some(RESUME_HOLD_S);
        let (mut fetched, mut sent) = (Copied::default(), Copied::default());
        loop {
            for side in step.side {
                match side {
                    ResumeSide::Record(next) => {
                        let previous = self.previous;
                        let rented = ResumeEvent::Rented { previous, next };
                        report(&self.events, Event::Resume(rented)).await;
                    }
                    ResumeSide::Stop(lease) => {
                        if let Err(e) = act(&self.events, lease, LeaseAct::Stop).await {
                            tracing::info!("lease {}: not stopped: {}", lease.short(), e.message);
                        }
                    }
                }
            }
            let input = match step.next {
                ResumeNext::Look(lease) => {
                    let (reply, answer) = oneshot::channel();
                    report(
                        &self.events,
                        Event::Resume(ResumeEvent::Look { lease, reply }),
                    )
                    .await;
                    let phase = answer.await.map_err(|_| "the node stopped".to_string())?;
                    ResumeInput::Found(match phase {
                        Some(RenterPhase::Starting | RenterPhase::Held) => NextLease::Held,
                        Some(RenterPhase::Running) => NextLease::Running,
                        Some(RenterPhase::Ended | RenterPhase::Settled) | None => NextLease::Gone,
                    })
                }
                ResumeNext::Fetch => {
                    ResumeInput::Fetched(self.fetch(&dirs).await.map(|c| fetched = c))
                }
                ResumeNext::Rent => ResumeInput::Rented(match self.rent.run(&request).await {
                    Ok(rented) => rented.lease.parse().map_err(|e| format!("{e}")),
                    Err(e) => {
                        tracing::info!(
                            "lease {}: no new lease yet ({})",
                            self.previous.short(),
                            e.message
                        );
                        Err(e.message)
                    }
                }),
                ResumeNext::Wait(at) => {
                    tokio::time::sleep(Duration::from_millis(at.ms_since(now()))).await;
                    ResumeInput::Timer
                }
                ResumeNext::Put(lease) => {
                    let put = self.put(&lease.to_string(), &dirs).await;
                    ResumeInput::Put(put.map(|c| sent = c))
                }
                ResumeNext::Commit(lease) => {
                    let moved = Moved {
                        files: fetched.files,
                        bytes: fetched.bytes,
                        fetched: fetched.transferred,
                        sent: sent.transferred,
                        done_at_ms: 0,
                    };
                    let (reply, answer) = oneshot::channel();
                    let commit = ResumeEvent::Commit {
                        lease,
                        moved,
                        reply,
                    };
                    report(&self.events, Event::Resume(commit)).await;
                    let committed = answer.await.map_err(|_| "the node stopped".to_string())?;
                    ResumeInput::Committed(match committed {
                        Ok(committed) => {
                            tracing::info!(
                                "lease {}: resumed as {} ({} files, {} bytes moved: {} fetched, {} sent; committed at {})",
                                self.previous.short(),
                                lease.short(),
                                moved.files,
                                moved.bytes,
                                moved.fetched,
                                moved.sent,
                                committed.committed_at_ms
                            );
                            Ok(())
                        }
                        Err(e) => Err(format!("committing {lease}: {}", e.message)),
                    })
                }
                ResumeNext::Done(ResumeOutcome::Resumed(_)) => {
                    let previous = self.previous;
                    report(
                        &self.events,
                        Event::Resume(ResumeEvent::Resumed { previous }),
                    )
                    .await;
                    return Ok(());
                }
                ResumeNext::Done(ResumeOutcome::Failed(why)) => return Err(why),
            };
            step = hop.handle(now(), input);
        }
    }

    /// Where the mirror keeps the workspace's directory `dir` (`""`: the whole workspace).
    fn local_of(&self, dir: &str) -> PathBuf {
        let root = self.mirror.join("workspace");
        if dir.is_empty() { root } else { root.join(dir) }
    }

    /// Brings the mirror up to the old workspace's `dirs`: only what changed since the last
    /// move is fetched; what it no longer has goes (a directory it lacks, whole).
    async fn fetch(&self, dirs: &[String]) -> Result<Copied, String> {
        let lease = self.previous.to_string();
        let mut copied = Copied::default();
        for dir in dirs {
            let local = self.local_of(dir);
            let mut last = None;
            for _ in 0..FETCH_ATTEMPTS {
                let error = match self.bridge.open_files(&lease).await {
                    Ok(stream) => match mirror_over(stream, dir, &local).await {
                        Ok(report) => {
                            copied.files += report.files;
                            copied.bytes = copied.bytes.saturating_add(report.bytes);
                            copied.transferred =
                                copied.transferred.saturating_add(report.bytes_sent);
                            last = None;
                            break;
                        }
                        Err(CopyError::Remote {
                            code: gpux_protocol::plane_wire::FilesError::NotFound,
                            ..
                        }) => {
                            // Not there (the work had not made it): nothing of it moves.
                            let _ = tokio::fs::remove_dir_all(&local).await;
                            last = None;
                            break;
                        }
                        Err(e) => e.to_string(),
                    },
                    Err(e) => e.message,
                };
                last = Some(error);
                tokio::time::sleep(RETRY).await;
            }
            if let Some(why) = last {
                return Err(format!("fetching /workspace/{dir}: {why}"));
            }
        }
        Ok(copied)
    }

    /// Copies the mirror into the new lease's workspace, at the same paths.
    async fn put(&self, lease: &str, dirs: &[String]) -> Result<Copied, String> {
        let mut copied = Copied::default();
        for dir in dirs {
            let local = self.local_of(dir);
            if !tokio::fs::try_exists(&local).await.unwrap_or(false) {
                continue;
            }
            let mut last = None;
            for _ in 0..FETCH_ATTEMPTS {
                let error = match self.bridge.open_files(lease).await {
                    Ok(stream) => match upload_tree_over(stream, &local, dir).await {
                        Ok(report) => {
                            copied.files += report.files;
                            copied.bytes = copied.bytes.saturating_add(report.bytes);
                            copied.transferred =
                                copied.transferred.saturating_add(report.bytes_sent);
                            last = None;
                            break;
                        }
                        Err(e) => e.to_string(),
                    },
                    Err(e) => e.message,
                };
                last = Some(error);
                tokio::time::sleep(RETRY).await;
            }
            if let Some(why) = last {
                return Err(format!("copying /workspace/{dir} into {lease}: {why}"));
            }
        }
        Ok(copied)
    }
}

impl Daemon {
    pub(super) fn on_resume_event(&mut self, event: ResumeEvent) {
        match event {
            ResumeEvent::Started { lease, request } => {
                // The registry's credentials stay in memory, with the chain; the record on
                // disk has none.
                if let Some(auth) = request.registry_auth.clone() {
                    self.registry_secrets.insert(lease, auth);
                }
                let Ok(json) = serde_json::to_vec(&request.without_secrets()) else {
                    return;
                };
                self.save_resume(
                    lease,
                    ResumeRecord {
                        request: json,
                        hop: 0,
                        resumed_from: None,
                        resumed_by: None,
                        status: ResumeStatus::Watching,
                        moved: None,
                    },
                );
            }
            ResumeEvent::Preempted(lease) => self.start_resume(lease),
            ResumeEvent::Rented { previous, next } => {
                if let Some(auth) = self.registry_secrets.remove(&previous) {
                    self.registry_secrets.insert(next, auth);
                }
                let Ok(Some(mut old)) = self.state.resume(&previous) else {
                    return;
                };
                old.resumed_by = Some(next);
                let record = ResumeRecord {
                    request: old.request.clone(),
                    hop: old.hop + 1,
                    resumed_from: Some(previous),
                    resumed_by: None,
                    status: ResumeStatus::Watching,
                    moved: None,
                };
                self.save_resume(next, record);
                self.save_resume(previous, old);
            }
            ResumeEvent::Commit {
                lease,
                mut moved,
                reply,
            } => {
                // Its clock starts from the commit, after the move.
                moved.done_at_ms = now().0;
                if let Ok(Some(mut record)) = self.state.resume(&lease) {
                    record.moved = Some(moved);
                    self.save_resume(lease, record);
                }
                let _ = reply.send(self.renter.commit(lease));
            }
            ResumeEvent::Look { lease, reply } => {
                let _ = reply.send(self.renter.phase(&lease));
            }
            ResumeEvent::Resumed { previous } => {
                if let Ok(Some(mut old)) = self.state.resume(&previous) {
                    old.status = ResumeStatus::Resumed;
                    self.save_resume(previous, old);
                }
            }
            ResumeEvent::Failed { lease, why } => {
                if let Ok(Some(mut record)) = self.state.resume(&lease) {
                    record.status = ResumeStatus::Failed(why);
                    self.save_resume(lease, record);
                }
            }
            ResumeEvent::Ended(lease) => {
                if let Ok(Some(record)) = self.state.resume(&lease)
                    && record.status == ResumeStatus::Watching
                {
                    let mirror = self.mirror_of(lease);
                    tokio::spawn(async move {
                        let _ = tokio::fs::remove_dir_all(mirror).await;
                    });
                }
            }
        }
    }

    fn save_resume(&self, lease: ContentId, record: ResumeRecord) {
        if let Err(e) = self.state.save_resume(&lease, &record) {
            tracing::error!("lease {}: cannot store its resume: {e}", lease.short());
        }
    }

    /// A resumable lease ended preempted: its resume starts (once).
    fn start_resume(&mut self, lease: ContentId) {
        let Ok(Some(mut record)) = self.state.resume(&lease) else {
            return;
        };
        if record.status != ResumeStatus::Watching {
            return;
        }
        let Ok(mut request) = serde_json::from_slice::<RentRequest>(&record.request) else {
            record.status = ResumeStatus::Failed("its stored rent does not read".into());
            return self.save_resume(lease, record);
        };
        // (None after a restart of this node: a private registry's image then fails to pull,
        // saying so.)
        request.registry_auth = self.registry_secrets.get(&lease).cloned();
        // A resume under way before a stop of this node goes on with the lease it rented.
        let rented = record.resumed_by;
        record.status = ResumeStatus::Resuming;
        self.save_resume(lease, record);
        tracing::info!("lease {}: preempted; resuming it", lease.short());
        let task = ResumeTask {
            bridge: Bridge {
                net: self.net.clone(),
                state: self.state.clone(),
            },
            events: self.events_tx.clone(),
            rent: self.rent_context(),
            previous: lease,
            rented,
            request,
            mirror: self.mirror_of(lease),
        };
        tokio::spawn(task.run());
    }

    /// Where the chain of `lease` keeps its mirror: named by the chain's first lease.
    fn mirror_of(&self, lease: ContentId) -> PathBuf {
        let mut first = lease;
        // (A chain is as long as its hops; the bound only guards a damaged store.)
        for _ in 0..10_000 {
            match self.state.resume(&first) {
                Ok(Some(ResumeRecord {
                    resumed_from: Some(previous),
                    ..
                })) => first = previous,
                _ => break,
            }
        }
        self.data_dir
            .join("resume")
            .join(gpux_protocol::hex(&first.0))
    }

    /// Leases whose resume was under way when this node stopped start it again.
    pub(super) fn restart_resumes(&mut self) {
        let Ok(all) = self.state.resumes() else {
            return;
        };
        for (lease, mut record) in all {
            if record.status == ResumeStatus::Resuming {
                record.status = ResumeStatus::Watching;
                self.save_resume(lease, record);
                self.start_resume(lease);
            }
        }
    }
}
