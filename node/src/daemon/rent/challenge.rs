//! A rent with `--challenge`: the lease is agreed held, the renter's node challenges the
//! leased GPUs (`crate::plane::challenge`), and only a host that passes gets the commit; one
//! that fails is told so and paid nothing, and the next offer is tried.
//!
//! `gpux challenge LEASE` challenges a running lease the same way (the host pauses its
//! container while it proves); a host that fails ends the lease at once
//! (`challenge-failed`), paid for what ran. A passed challenge is published once the lease
//! has paid the host (`super::super::proof`).

use gpux_api::{ApiError, ChallengePassed, ErrorCode, Rented};
use gpux_lease::ChallengeResult;
use gpux_protocol::{ContentId, PublicKey};

use super::RentTask;
use crate::daemon::{Daemon, Event, LeaseAct, act, report};
use crate::plane::challenge::{self, ChallengeFailure, Measured, Reference};

fn passed(measured: Measured) -> ChallengePassed {
    ChallengePassed {
        shape: measured.shape.to_string(),
        rows_checked: measured.rows_checked,
        opened_bytes: measured.opened_bytes,
        verify_ms: measured.verify.as_secs_f64() * 1000.0,
        achieved_gops: measured.achieved_gops,
        reference_gops: measured.reference_gops,
        fill_bytes: measured.fill.map_or(0, |f| f.0),
        achieved_gbs: measured.fill.map_or(0.0, |f| f.1),
        reference_gbs: measured.fill.and_then(|f| f.2),
        round_trip_ms: measured.round_trip.as_secs_f64() * 1000.0,
    }
}

impl Daemon {
    /// The challenge reference of `offer`'s GPUs: this node's own for the family
    /// (`--challenge-reference`), else the spec table's; a MIG slice's is its share of the
    /// GPU's. `None` when the offer is not in the book or no rate is known.
    pub(crate) fn challenge_reference(&self, offer: &ContentId) -> Option<Reference> {
        let book = &self.market.book;
        self.reference_of(
            book.offer_family(offer)?,
            book.offer_mig_profile(offer),
            book.offer_vram_gb(offer),
        )
    }

    /// The challenge reference of a GPU of `family` with `vram_gb` of memory (`None`: the
    /// spec table's), or of a MIG slice of one with `profile` (its share of the rates).
    pub(crate) fn reference_of(
        &self,
        family: gpux_protocol::GpuFamily,
        profile: Option<&str>,
        vram_gb: Option<u16>,
    ) -> Option<Reference> {
        let spec = gpux_attestation::spec::specs_of(family).next();
        let table = gpux_attestation::spec::references(family, vram_gb);
        let own = self.challenge_references.get(&family);
        let gops = own.map(|o| o.gops).or(table.map(|t| t.0))?;
        let gbs = match own {
            Some(o) => o.gbs,
            None => table.map(|t| t.1),
        };
        let share = match profile {
            Some(profile) => {
                let (n, of) = family.mig_share(profile)?;
                f64::from(n) / f64::from(of)
            }
            None => 1.0,
        };
        let memory_gb = vram_gb.or(spec.map(|s| s.vram_gb)).unwrap_or(0);
        let fill = f64::from(memory_gb)
            * 1e9
            * gpux_attestation::spec::FILL_SHARE_OF_MEMORY
            * own.map_or(1.0, |o| o.memory_scale);
        Some(Reference {
            gops: gops * share,
            gbs: gbs.map(|g| g * share),
            fill_bytes: fill as u64,
        })
    }

    /// Challenges this node's running lease `id` (`POST /v1/leases/{id}/challenge`): the
    /// answer is what it measured, or why it did not pass (the lease then ends).
    pub(crate) fn challenge_running(
        &self,
        id: ContentId,
        reply: tokio::sync::oneshot::Sender<Result<ChallengePassed, ApiError>>,
    ) {
        let Some((host, offer, device)) = self
            .renter
            .running_lease(&id)
            .map(|r| (r.host, r.offer, r.gpus.first().copied()))
        else {
            let _ = reply.send(Err(ApiError::new(
                ErrorCode::Conflict,
                format!("lease {id} is not running here"),
            )
            .with_hint("`gpux leases` lists this node's leases; a held lease is challenged with `gpux rent --challenge`")));
            return;
        };
        // The offer the lease was agreed on, while the book has it; else what the host's
        // attestation says the leased device is.
        let reference = self.challenge_reference(&offer).or_else(|| {
            let (name, profile) = self.market.validator.attested_device(&host, &device?)?;
            let memory = profile
                .as_deref()
                .and_then(gpux_protocol::mig_profile_gb)
                .or_else(|| gpux_attestation::spec_for_name(&name).map(|s| s.vram_gb));
            self.reference_of(
                gpux_protocol::GpuFamily::classify(&name),
                profile.as_deref(),
                memory,
            )
        });
        let Some(reference) = reference else {
            let _ = reply.send(Err(ApiError::new(
                ErrorCode::Unavailable,
                format!("no challenge reference rate is known for lease {id}'s GPU model"),
            )));
            return;
        };
        // The product alone: the paused workload keeps its memory on the GPU, so a fill of
        // the claimed memory would fail an honest host for the renter's own allocations.
        // The memory was proved before the work (`--challenge`); a GPU cannot shrink since.
        let reference = Reference {
            fill_bytes: 0,
            ..reference
        };
        let (net, key, events) = (self.net.clone(), self.key.clone(), self.events_tx.clone());
        tokio::spawn(async move {
            let peer = host.peer_id();
            let answer = match challenge::run(&net, &key, (host, device), id, reference).await {
                Ok(measured) => {
                    report(
                        &events,
                        Event::ChallengePassed {
                            lease: id,
                            measured: Box::new(measured.clone()),
                        },
                    )
                    .await;
                    tracing::info!(
                        "lease {}: {peer} passed a challenge while running ({:.2} of {:.2} Gop/s)",
                        id.short(),
                        measured.achieved_gops,
                        measured.reference_gops
                    );
                    Ok(passed(measured))
                }
                Err(ChallengeFailure::Failed(why)) => {
                    tracing::warn!("lease {}: {peer} failed the challenge: {why}", id.short());
                    let ended = act(&events, id, LeaseAct::FailChallenge).await;
                    Err(ApiError::new(
                        ErrorCode::Conflict,
                        format!(
                            "{peer} failed the performance challenge ({why}); the lease ends{}",
                            if ended.is_ok() {
                                ""
                            } else {
                                " (could not be ended now)"
                            }
                        ),
                    ))
                }
                Err(ChallengeFailure::NotRun(why)) => Err(ApiError::new(
                    ErrorCode::Unavailable,
                    format!("{peer}: the challenge did not run ({why})"),
                )),
            };
            let _ = reply.send(answer);
        });
    }
}

impl RentTask {
    /// Challenges the held lease `rented` on `host` against `reference`: committed when it
    /// passes (and the renter asked for no hold of its own). One that fails or cannot be
    /// challenged says so; the rent's search ends it.
    pub(super) async fn challenge_held(
        &self,
        rented: Rented,
        host: PublicKey,
        reference: Option<Reference>,
    ) -> Result<Rented, ChallengeResult> {
        let peer = host.peer_id();
        let not_run = |why: String| ChallengeResult::Failed { why, failed: false };
        let lease: ContentId = rented.lease.parse().map_err(|e| not_run(format!("{e}")))?;
        let Some(reference) = reference else {
            return Err(not_run(format!(
                "{peer}: no challenge reference rate is known for its GPU model"
            )));
        };
        let device = rented.gpus.first().and_then(|g| g.parse().ok());
        match challenge::run(&self.net, &self.key, (host, device), lease, reference).await {
            Ok(measured) => {
                report(
                    &self.events,
                    Event::ChallengePassed {
                        lease,
                        measured: Box::new(measured.clone()),
                    },
                )
                .await;
                let passed = passed(measured);
                tracing::info!(
                    "lease {}: {peer} passed the challenge ({:.2} of {:.2} Gop/s, {})",
                    lease.short(),
                    passed.achieved_gops,
                    passed.reference_gops,
                    passed.shape
                );
                // A hold the renter asked for itself stays its to commit.
                if !self.workload.held_by_renter() {
                    act(&self.events, lease, LeaseAct::Commit)
                        .await
                        .map_err(|e| ChallengeResult::NotCommitted(e.message))?;
                }
                Ok(Rented {
                    commit_by_ms: rented
                        .commit_by_ms
                        .filter(|_| self.workload.held_by_renter()),
                    challenge: Some(passed),
                    ..rented
                })
            }
            Err(ChallengeFailure::Failed(why)) => {
                tracing::warn!(
                    "lease {}: {peer} failed the challenge: {why}",
                    lease.short()
                );
                Err(ChallengeResult::Failed {
                    why: format!(
                        "{peer} failed the performance challenge ({why}); it is paid nothing"
                    ),
                    failed: true,
                })
            }
            Err(ChallengeFailure::NotRun(why)) => Err(not_run(format!(
                "{peer}: the challenge did not run ({why})"
            ))),
        }
    }
}
