//! The shell of a rent's search: [`gpux_lease::RentSearch`] decides which host is asked
//! next, what is claimed and released, and how the rent comes out; this does what it says
//! (asks the loop for candidates and claims, dials, stages or pulls the image, sends the
//! request, challenges the lease) and reports each result back.

use std::collections::BTreeSet;

use gpux_api::{ApiError, ErrorCode, Rented, StagedImage};
use gpux_lease::{
    ChallengeResult, RentAnswer, RentCandidate, RentInput, RentNext, RentOutcome, RentPlan,
    RentSearch, RentSide,
};
use gpux_market::Allocation;
use gpux_protocol::{ContentId, GpuUuid, ImageDigest, ResourceLimits};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::image::PullOutcome;
use super::terms::Terms;
use super::{
    CANDIDATES, Candidate, ImageChoice, MAX_ROUNDS, PROBE_TIMEOUT, RETRIES_ON_HOST, Refusal,
    RentEvent, RentTask, Staging, reach,
};
use crate::daemon::{Event, LeaseAct, act, report};

type Probe = JoinHandle<Result<Result<(), String>, tokio::time::error::Elapsed>>;

/// The round being asked, as the shell keeps it.
#[derive(Default)]
struct Round {
    candidates: Vec<Candidate>,
    /// Each candidate's terms and limits (none: its offer does not fit them).
    terms: Vec<Option<(Terms, ResourceLimits)>>,
    /// Each candidate's probe, started when the round was found.
    probes: Vec<Option<Probe>>,
}

impl Drop for Round {
    fn drop(&mut self) {
        for probe in self.probes.iter().flatten() {
            probe.abort();
        }
    }
}

impl RentTask {
    /// Searches the market for a lease, as [`RentSearch`] says.
    pub(super) async fn search(
        &self,
        staging: Option<&Staging>,
        prepare_ms: u64,
    ) -> Result<Rented, ApiError> {
        let stopping = || ApiError::new(ErrorCode::Unavailable, "the node is shutting down");
        // A registry's image: first the hosts that list it or have it cached (a warm
        // start), then any host that pulls.
        let phases = self.phases()?;
        let (mut search, mut step) = RentSearch::<GpuUuid, ContentId>::new(RentPlan {
            phases: phases.len(),
            max_rounds: MAX_ROUNDS,
            retries_on_host: RETRIES_ON_HOST,
            challenge: self.workload.challenge,
        });
        let mut excluded = BTreeSet::new();
        let mut round = Round::default();
        // The current candidate's image, ready on its host.
        let mut ready: Option<(
            ImageDigest,
            Option<StagedImage>,
            Option<gpux_api::PulledImage>,
        )> = None;
        // The GPUs claimed for the current request.
        let mut claimed: Option<Allocation> = None;
        // The accepted lease.
        let mut rented: Option<Rented> = None;
        loop {
            for side in step.side {
                match side {
                    RentSide::Reached(i) => {
                        let host = round.candidates[i].allocation.host;
                        report(&self.events, Event::Rent(RentEvent::Reached(host))).await;
                    }
                    RentSide::Unreachable(i) => {
                        let host = round.candidates[i].allocation.host;
                        report(&self.events, Event::Rent(RentEvent::Unreachable(host))).await;
                    }
                    RentSide::Release(hold) => {
                        report(&self.events, Event::Rent(RentEvent::Release(hold))).await;
                    }
                    RentSide::End { failed, .. } => {
                        let lease = rented.take().and_then(|r| r.lease.parse().ok());
                        if let Some(lease) = lease {
                            let how = if failed {
                                LeaseAct::FailChallenge
                            } else {
                                LeaseAct::Stop
                            };
                            let _ = act(&self.events, lease, how).await;
                        }
                    }
                }
            }
            let input = match step.next {
                RentNext::Candidates { phase } => {
                    let (tx, rx) = oneshot::channel();
                    let ask = RentEvent::Candidates {
                        spec: phases[phase].clone(),
                        excluded: excluded.clone(),
                        n: CANDIDATES,
                        tag: match &self.image {
                            ImageChoice::Registry { named, .. } => Some(named.clone()),
                            _ => None,
                        },
                        avoid: self.avoid.clone(),
                        reply: tx,
                    };
                    report(&self.events, Event::Rent(ask)).await;
                    let candidates = rx.await.map_err(|_| stopping())?;
                    excluded.extend(candidates.iter().map(|c| c.allocation.offer));
                    round = self.round(candidates);
                    RentInput::Candidates(
                        round
                            .candidates
                            .iter()
                            .zip(&round.terms)
                            .map(|(c, terms)| RentCandidate {
                                name: c.allocation.host.peer_id().to_string(),
                                gpus: c.allocation.gpus.clone(),
                                preempts: !c.allocation.preempts.is_empty(),
                                fits: match terms {
                                    Some(_) => Ok(()),
                                    None => Err(self.misfit(c)),
                                },
                            })
                            .collect(),
                    )
                }
                RentNext::Probe(i) => {
                    let host = round.candidates[i].allocation.host.peer_id();
                    let probe = match round.probes[i].take() {
                        Some(probe) => probe.await.unwrap_or_else(|e| Ok(Err(e.to_string()))),
                        None => Ok(Err("not probed".into())),
                    };
                    RentInput::Probed(match probe {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(format!("{host}: unreachable ({e})")),
                        Err(_) => Err(format!(
                            "{host}: unreachable (no connection in {} s)",
                            PROBE_TIMEOUT.as_secs()
                        )),
                    })
                }
                RentNext::Prepare(i) => {
                    ready = None;
                    let prepared = self.image_on(&round.candidates[i], staging, prepare_ms);
                    match prepared.await {
                        Ok(image) => {
                            ready = Some(image);
                            RentInput::Prepared(Ok(()))
                        }
                        Err(PullOutcome::Next(why)) => RentInput::Prepared(Err(why)),
                        // Nothing is held while an image is prepared.
                        Err(PullOutcome::Stop(e)) => return Err(e),
                    }
                }
                RentNext::Claim {
                    candidate,
                    release,
                    prefer,
                    avoid,
                } => {
                    let (tx, rx) = oneshot::channel();
                    let claim = RentEvent::Claim {
                        allocation: round.candidates[candidate].allocation.clone(),
                        spec: self.spec.clone(),
                        release,
                        prefer,
                        avoid,
                        reply: tx,
                    };
                    report(&self.events, Event::Rent(claim)).await;
                    let got = rx.await.ok().flatten();
                    let input = got.as_ref().map(|(a, hold)| (a.gpus.clone(), *hold));
                    claimed = got.map(|(allocation, _)| allocation);
                    RentInput::Claimed(input)
                }
                RentNext::Request { candidate, hold } => {
                    let c = &round.candidates[candidate];
                    self.progress.set(gpux_api::RentProgress {
                        phase: "requesting".into(),
                        host: Some(c.allocation.host.peer_id().to_string()),
                        ..gpux_api::RentProgress::default()
                    });
                    let allocation = match (&hold, &claimed) {
                        (Some(_), Some(claimed)) => claimed,
                        _ => &c.allocation,
                    };
                    let (Some((image, staged, pulled)), Some((terms, limits))) =
                        (ready.clone(), round.terms[candidate].clone())
                    else {
                        return Err(ApiError::new(
                            ErrorCode::Internal,
                            "a rent asked a host before its image and terms were ready",
                        ));
                    };
                    let answer = self
                        .request(allocation, image, (staged, pulled), (terms, limits), hold)
                        .await;
                    RentInput::Answered(match answer {
                        Ok(r) => {
                            rented = Some(r);
                            RentAnswer::Accepted
                        }
                        Err(Refusal::Taken(why, free)) => RentAnswer::Taken { why, free },
                        Err(Refusal::Refused(why, reason)) => RentAnswer::Refused { why, reason },
                        Err(Refusal::NotStarted(why)) => RentAnswer::NotStarted(why),
                    })
                }
                RentNext::Challenge(i) => {
                    let c = &round.candidates[i];
                    let Some(held) = rented.clone() else {
                        return Err(ApiError::new(
                            ErrorCode::Internal,
                            "a rent challenged a lease it does not hold",
                        ));
                    };
                    match self
                        .challenge_held(held, c.allocation.host, c.reference)
                        .await
                    {
                        Ok(passed) => {
                            rented = Some(passed);
                            RentInput::Challenged(ChallengeResult::Passed)
                        }
                        Err(result) => RentInput::Challenged(result),
                    }
                }
                RentNext::Done(RentOutcome::Rented { candidate }) => {
                    let reference = round.candidates[candidate].reference;
                    let Some(rented) = rented else {
                        return Err(ApiError::new(
                            ErrorCode::Internal,
                            "a rent ended rented without a lease",
                        ));
                    };
                    return Ok(self.rechallenged(rented, reference).await);
                }
                // Agreed but not started: no other host is asked (the machine has made sure
                // this one is not paid, so the renter may simply try again).
                RentNext::Done(RentOutcome::NotStarted(why)) => {
                    return Err(ApiError::new(ErrorCode::Unavailable, why)
                        .with_hint("nothing was charged; try again"));
                }
                RentNext::Done(RentOutcome::Refused {
                    refusals,
                    all_taken,
                }) => return Err(self.refused(&refusals, all_taken)),
            };
            step = search.handle(input);
        }
    }

    /// A round of candidates: each one's terms, and a probe of each that fits, all started
    /// at once (asked one at a time in the round's order, each as soon as it is reached, so
    /// a slow probe further down holds nobody up).
    fn round(&self, candidates: Vec<Candidate>) -> Round {
        let terms: Vec<_> = candidates
            .iter()
            .map(|c| {
                let terms = self.workload.terms_for(c.retention, &c.cancel_fees).ok()?;
                let limits = self
                    .workload
                    .resources
                    .limits(c.share, c.allocation.gpus.len())
                    .ok()?;
                Some((terms, limits))
            })
            .collect();
        let probes = candidates
            .iter()
            .zip(&terms)
            .map(|(c, terms)| {
                let (net, host) = (self.net.clone(), c.allocation.host);
                terms
                    .as_ref()
                    .map(|_| tokio::spawn(tokio::time::timeout(PROBE_TIMEOUT, reach(net, host))))
            })
            .collect();
        Round {
            candidates,
            terms,
            probes,
        }
    }

    /// Why a candidate's offer does not fit the rent's terms.
    fn misfit(&self, c: &Candidate) -> String {
        match self.workload.terms_for(c.retention, &c.cancel_fees) {
            Err(why) => why,
            Ok(_) => self
                .workload
                .resources
                .limits(c.share, c.allocation.gpus.len())
                .err()
                .unwrap_or_default(),
        }
    }

    /// The image the rent runs on `candidate`'s host: one it lists, pulls, or that is
    /// staged to it.
    async fn image_on(
        &self,
        candidate: &Candidate,
        staging: Option<&Staging>,
        prepare_ms: u64,
    ) -> Result<
        (
            ImageDigest,
            Option<StagedImage>,
            Option<gpux_api::PulledImage>,
        ),
        PullOutcome,
    > {
        let host = candidate.allocation.host;
        let next = |why: String| PullOutcome::Next(format!("{}: {why}", host.peer_id()));
        let staged_at = std::time::Instant::now();
        let (image, staged, pulled) = match (&self.image, staging) {
            // The host lists an image under the name: it runs that one.
            (ImageChoice::Registry { .. }, _) if candidate.image.is_some() => {
                (candidate.image, None, None)
            }
            (ImageChoice::Registry { reference, .. }, _) => {
                match self.pull(host, reference, &candidate.pulls).await {
                    Ok(p) => (Some(p.image), None, Some(p.view)),
                    Err(PullOutcome::Next(why)) => return Err(next(why)),
                    Err(stop) => return Err(stop),
                }
            }
            (_, Some(staging)) => {
                let sent = self.stage(staging, host).await.map_err(next)?;
                let staged = StagedImage {
                    layers: staging.archive.layers.len(),
                    image_bytes: staging.archive.total_bytes(),
                    layers_sent: sent.layers,
                    bytes_sent: sent.bytes,
                    prepare_ms,
                    stage_ms: staged_at.elapsed().as_millis() as u64,
                };
                (Some(staging.archive.image), Some(staged), None)
            }
            (ImageChoice::Host(digest), None) => (Some(*digest), None, None),
            // Without an image named, run the first one the offer lists.
            _ => (candidate.image, None, None),
        };
        match image {
            Some(image) => Ok((image, staged, pulled)),
            None => Err(PullOutcome::Next(format!(
                "{} lists no image",
                host.peer_id()
            ))),
        }
    }
}
