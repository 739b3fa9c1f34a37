//! Spot leases that resume after a preemption (`gpux rent --spot --resume`).
//!
//! When such a lease ends preempted, this node (the renter's) copies the checkpoint
//! directory out of the old lease's workspace (kept after the lease for its retention),
//! rents the same work again (the best fitting offer, trying for up to the resume timeout),
//! held for its commit; copies the checkpoint into the new workspace; and commits, so the
//! workload starts again with its checkpoint in place. Every hop is recorded
//! ([`ResumeRecord`]: `gpux leases` shows the chain); the new lease resumes in turn.

use std::path::PathBuf;
use std::time::Duration;

use gpux_api::{ApiError, Committed, RentRequest, Rented};
use gpux_protocol::ContentId;
use tokio::sync::{mpsc, oneshot};

use super::{Daemon, Event, report};
use crate::plane::bridge::Bridge;
use crate::plane::copy::{CopyError, download_over, upload_over};
use crate::store::{ResumeRecord, ResumeStatus};

/// How long a resume looks for a new lease when the rent does not say, seconds.
pub(crate) const DEFAULT_RESUME_TIMEOUT_S: u64 = 600;
/// How long a resumed lease holds its GPUs for its checkpoint to go in, seconds.
const RESUME_HOLD_S: u64 = 120;
/// Between attempts to rent again, or to reach the old workspace.
const RETRY: Duration = Duration::from_secs(3);
/// Attempts to fetch the checkpoint (the host keeps the workspace a moment after the end).
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
    /// Commit the held lease `lease` (its checkpoint is in).
    Commit {
        lease: ContentId,
        reply: oneshot::Sender<Result<Committed, ApiError>>,
    },
    /// The resume of `lease` gave up.
    Failed { lease: ContentId, why: String },
}

/// One resume, run outside the loop.
struct ResumeTask {
    bridge: Bridge,
    events: mpsc::Sender<Event>,
    rent: super::rent::RentContext,
    previous: ContentId,
    request: RentRequest,
    /// Where the checkpoint waits between the leases.
    local: PathBuf,
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
        }
        let _ = tokio::fs::remove_dir_all(&self.local).await;
    }

    async fn resume(&self) -> Result<(), String> {
        let dir = super::rent::checkpoint_dir(&self.request).map_err(|e| e.message)?;
        let fetched = self.fetch(&dir).await?;
        let next = self.rent_again().await?;
        let next_id: ContentId = next.lease.parse().map_err(|e| format!("{e}"))?;
        report(
            &self.events,
            Event::Resume(ResumeEvent::Rented {
                previous: self.previous,
                next: next_id,
            }),
        )
        .await;
        if let Some(from) = fetched {
            self.put(&next.lease, &from, &dir).await?;
        }
        let (reply, answer) = oneshot::channel();
        report(
            &self.events,
            Event::Resume(ResumeEvent::Commit {
                lease: next_id,
                reply,
            }),
        )
        .await;
        let committed = answer
            .await
            .map_err(|_| "the node stopped".to_string())?
            .map_err(|e| format!("committing {}: {}", next.lease, e.message))?;
        tracing::info!(
            "lease {}: resumed as {} on {} (committed at {})",
            self.previous.short(),
            next_id.short(),
            next.host,
            committed.committed_at_ms
        );
        Ok(())
    }

    /// Copies the checkpoint directory out of the old workspace; `None` when there is
    /// none (the work starts from scratch).
    async fn fetch(&self, dir: &str) -> Result<Option<PathBuf>, String> {
        let lease = self.previous.to_string();
        tokio::fs::create_dir_all(&self.local)
            .await
            .map_err(|e| format!("{}: {e}", self.local.display()))?;
        let mut last = String::new();
        for _ in 0..FETCH_ATTEMPTS {
            match self.bridge.open_files(&lease).await {
                Ok(stream) => match download_over(stream, dir, &self.local, &()).await {
                    Ok(report) => {
                        tracing::info!(
                            "lease {}: its checkpoint came out ({} files, {} bytes)",
                            self.previous.short(),
                            report.files,
                            report.bytes
                        );
                        let name = dir.rsplit('/').next().unwrap_or(dir);
                        return Ok(Some(self.local.join(name)));
                    }
                    Err(CopyError::Remote {
                        code: gpux_protocol::plane_wire::FilesError::NotFound,
                        ..
                    }) => return Ok(None),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.message,
            }
            tokio::time::sleep(RETRY).await;
        }
        Err(format!("fetching its checkpoint: {last}"))
    }

    /// Rents the same work again, held for its commit, until one is found or the timeout.
    async fn rent_again(&self) -> Result<Rented, String> {
        let timeout = self
            .request
            .resume_timeout_s
            .unwrap_or(DEFAULT_RESUME_TIMEOUT_S);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let mut request = self.request.clone();
        request.hold_s = Some(RESUME_HOLD_S);
        loop {
            let why = match self.rent.run(&request).await {
                Ok(rented) => return Ok(rented),
                Err(e) => e.message,
            };
            if tokio::time::Instant::now() + RETRY >= deadline {
                return Err(format!("no lease within {timeout} s: {why}"));
            }
            tracing::info!(
                "lease {}: no new lease yet ({why}); trying again",
                self.previous.short()
            );
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Copies the checkpoint into the new lease's workspace.
    ///
    /// `from` is named as `dir`'s last part, so it is copied into `dir`'s parent: an
    /// attempt after one that made `dir` goes on in it, where a copy onto `dir` would copy
    /// into it, nested.
    async fn put(&self, lease: &str, from: &std::path::Path, dir: &str) -> Result<(), String> {
        let parent = dir.rsplit_once('/').map_or("", |(parent, _)| parent);
        let mut last = String::new();
        for _ in 0..FETCH_ATTEMPTS {
            match self.bridge.open_files(lease).await {
                Ok(stream) => match upload_over(stream, from, parent, true, &()).await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.message,
            }
            tokio::time::sleep(RETRY).await;
        }
        Err(format!("copying the checkpoint into {lease}: {last}"))
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
                };
                self.save_resume(next, record);
                self.save_resume(previous, old);
            }
            ResumeEvent::Commit { lease, reply } => {
                let committed = self.renter.commit(lease);
                if committed.is_ok()
                    && let Ok(Some(record)) = self.state.resume(&lease)
                    && let Some(previous) = record.resumed_from
                    && let Ok(Some(mut old)) = self.state.resume(&previous)
                {
                    old.status = ResumeStatus::Resumed;
                    self.save_resume(previous, old);
                }
                let _ = reply.send(committed);
            }
            ResumeEvent::Failed { lease, why } => {
                if let Ok(Some(mut record)) = self.state.resume(&lease) {
                    record.status = ResumeStatus::Failed(why);
                    self.save_resume(lease, record);
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
            request,
            local: self
                .data_dir
                .join("resume")
                .join(gpux_protocol::hex(&lease.0)),
        };
        tokio::spawn(task.run());
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
