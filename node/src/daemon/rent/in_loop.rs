//! A rent's steps inside the daemon's loop: finding candidates in the book, the reach of
//! hosts, an accepted lease handed to the renter's machine; and starting rents (for the API
//! and for standing bids), within the spend cap.

use std::collections::BTreeSet;

use gpux_api::{ApiError, ErrorCode, RentRequest, Rented};
use gpux_lease::RentReport;
use gpux_protocol::MicroCredits;
use tokio::sync::oneshot;

use super::rank::{self, Standing};
use super::{Candidate, MAX_SCAN, RentContext, RentEvent};
use crate::attest::now;
use crate::daemon::{Daemon, Event, report};

impl Daemon {
    pub(in crate::daemon) fn rent_context(&self) -> RentContext {
        RentContext {
            key: self.key.clone(),
            net: self.net.clone(),
            events: self.events_tx.clone(),
            outbox: self.data_dir.join("outbox"),
            progress: self.rent_progress.clone(),
        }
    }

    pub(in crate::daemon) fn on_rent_event(&mut self, step: RentEvent) {
        match step {
            RentEvent::Candidates {
                spec,
                mut excluded,
                n,
                tag,
                avoid,
                reply,
            } => {
                let t = now();
                // (Measured for /metrics, never asserted.)
                #[allow(clippy::disallowed_methods)]
                let matching = std::time::Instant::now();
                let mut hosts = BTreeSet::new();
                let mut found = Vec::new();
                let mut served_unfound = self.reach.served_count();
                for _ in 0..MAX_SCAN {
                    let Some((allocation, image)) =
                        self.market.best_match(&spec, &excluded, t, tag.as_deref())
                    else {
                        break;
                    };
                    excluded.insert(allocation.offer);
                    if self.reach.skip(&allocation.host, t)
                        || avoid.contains(&allocation.host)
                        || !hosts.insert(allocation.host)
                    {
                        continue;
                    }
                    let served = self.reach.has_served(&allocation.host);
                    served_unfound = served_unfound.saturating_sub(usize::from(served));
                    let standing = if served || self.market.book.offer_challenged(&allocation.offer)
                    {
                        Standing::Proven
                    } else if self.market.came_in_burst(&allocation.host, t) {
                        Standing::Burst
                    } else {
                        Standing::Known
                    };
                    found.push((standing, self.candidate(allocation, image)));
                    if rank::enough(&found, n, served_unfound) {
                        break;
                    }
                }
                self.recorder
                    .match_latency
                    .observe(matching.elapsed().as_secs_f64());
                let count = |s: Standing| found.iter().filter(|(f, _)| *f == s).count();
                tracing::debug!(
                    "a rent's round from {} offers looked at: {} proven, {} known, {} from a burst",
                    found.len(),
                    count(Standing::Proven),
                    count(Standing::Known),
                    count(Standing::Burst)
                );
                let _ = reply.send(rank::round(found, n));
            }
            RentEvent::Reached(host) => {
                let score = self.reach.reached(host, now());
                self.market.book.set_reliability(host, score);
            }
            RentEvent::Unreachable(host) => {
                let score = self.reach.failed(host, now());
                self.market.book.set_reliability(host, score);
                tracing::info!(
                    "host {} backed off: unreachable or no answer",
                    host.peer_id()
                );
            }
            RentEvent::Claim {
                allocation,
                spec,
                release,
                prefer,
                avoid,
                reply,
            } => {
                if let Some(previous) = release {
                    self.market.book.release(&previous);
                }
                let mut hold = gpux_protocol::ContentId([0; 32]);
                let _ = getrandom::fill(&mut hold.0);
                // An offer replaced since the match (its host republished it): asked for as
                // matched, with nothing to hold here.
                if !self.market.book.contains(&allocation.offer) {
                    let mut allocation = allocation;
                    // The GPUs the host named as free, when it named enough.
                    if prefer.len() == allocation.gpus.len() {
                        allocation.gpus = prefer;
                    }
                    let _ = reply.send(Some((allocation, hold)));
                    return;
                }
                let claimed = self
                    .market
                    .book
                    .allocate_on(&allocation.offer, &spec, now(), (&prefer, &avoid))
                    .filter(|claim| self.market.book.reserve(claim, hold).is_ok())
                    .map(|claim| (claim, hold));
                let _ = reply.send(claimed);
            }
            RentEvent::Release(hold) => {
                self.market.book.release(&hold);
            }
            RentEvent::Accepted {
                request,
                accept,
                allocation,
                hold,
                reply,
            } => {
                if let Some(hold) = hold {
                    self.market.book.release(&hold);
                }
                let _ = self.market.book.reserve(&allocation, request.id());
                let ledger = self.ledger.as_ref().map(crate::ledger::LedgerClient::keys);
                match ledger {
                    Some(ledger) => self.renter.start_lease(*request, &accept, &ledger, reply),
                    None => {
                        let _ = reply.send(RentReport::Failed {
                            end: gpux_lease::End::NotStarted,
                            detail: "this node has no ledger to lock an escrow with".into(),
                        });
                    }
                }
            }
        }
    }

    /// What a rent needs to know of a matched offer.
    fn candidate(
        &self,
        allocation: gpux_market::Allocation,
        image: Option<gpux_protocol::ImageDigest>,
    ) -> Candidate {
        let book = &self.market.book;
        let offer = allocation.offer;
        Candidate {
            retention: book
                .offer_retention(&offer)
                .unwrap_or((MicroCredits::ZERO, None)),
            reference: self.challenge_reference(&offer),
            cancel_fees: book.offer_cancel_fees(&offer).unwrap_or_default(),
            share: book.offer_share(&offer).unwrap_or_default(),
            pulls: book.offer_pulls(&offer).unwrap_or_default(),
            allocation,
            image,
        }
    }

    /// A rent for the API.
    pub(in crate::daemon) fn start_rent(
        &mut self,
        request: RentRequest,
        reply: oneshot::Sender<Result<Rented, ApiError>>,
    ) {
        if self.ledger.is_none() {
            let _ = reply.send(Err(ApiError::new(
                ErrorCode::Conflict,
                "this node has no ledger to lock an escrow with",
            )
            .with_hint("start it with --ledger, or set `ledger` in config.toml")));
            return;
        }
        match self.followed(&request.query) {
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
            Ok(true) => {
                return self.after_following(crate::daemon::ApiCommand::Rent {
                    request: Box::new(request),
                    reply,
                });
            }
            Ok(false) => {}
        }
        let worst = match crate::daemon::spend::worst_of(&request).and_then(|w| {
            self.within_cap(w)?;
            Ok(w)
        }) {
            Ok(worst) => worst.0,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        self.spend_pending = self.spend_pending.saturating_add(worst);
        let rent = self.rent_context();
        let events = self.events_tx.clone();
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            // (Measured for /metrics, never asserted.)
            #[allow(clippy::disallowed_methods)]
            let asked = std::time::Instant::now();
            let result = rent.run(&request).await;
            if result.is_ok() {
                recorder
                    .rent_to_running
                    .observe(asked.elapsed().as_secs_f64());
            }
            // A resumable lease is watched from now: its record is stored before the
            // renter hears it runs.
            if let (Ok(rented), true) = (&result, request.resume)
                && let Ok(lease) = rented.lease.parse()
            {
                // (The registry's credentials go with it in memory; its record has none.)
                let request = Box::new(request.clone());
                let started = crate::daemon::resume::ResumeEvent::Started { lease, request };
                report(&events, Event::Resume(started)).await;
            }
            report(&events, Event::SpendDone(worst)).await;
            let _ = reply.send(result);
        });
    }
}
