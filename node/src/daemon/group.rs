//! Group orders (`gpux rent --gpus N --spread`, `gpux group scale`): N GPUs over as many
//! hosts as it takes, one lease per host, started all or nothing.
//!
//! Phase one places the members one by one, each held for its commit (the largest share a
//! host not used yet can give first); phase two is [`GroupPlacement`]'s decision: every
//! member committed once all hold, or every held member stopped (its host ends it unpaid and
//! releases its escrow; a host that fell silent is released by the renter's own lease), so
//! no partial group holds money or GPUs. The group's leases carry its id as a signed term
//! (`LeaseRequest` ext key 6) and its record lists them; a scale adds a batch the same way or
//! stops whole leases, the latest first.

use std::collections::BTreeSet;
use std::time::Duration;

use gpux_api::{ApiError, ErrorCode, GroupPlaced, GroupScaled, RentRequest, Rented};
use gpux_lease::{GroupEffect, GroupInput, GroupOutcome, GroupPlacement, Placement};
use gpux_protocol::{ContentId, PublicKey};
use tokio::sync::{mpsc, oneshot};

use super::rent::RentContext;
use super::{Daemon, Event, report};
use crate::attest::now;
use crate::store::GroupRecord;

/// How long a group's members hold their GPUs for the commit, seconds.
const GROUP_HOLD_S: u64 = 60;
/// How long the placement may take before it is decided (members not held count as failed).
const GROUP_WAIT: Duration = Duration::from_secs(50);

/// A step of a group order, for the loop.
pub(crate) enum GroupEvent {
    /// Leases joined the group (created with its first); stored before the answer.
    Joined {
        group: [u8; 16],
        request: Box<RentRequest>,
        members: Vec<ContentId>,
        stored: oneshot::Sender<()>,
    },
}

type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// Places groups, outside the loop.
#[derive(Clone)]
struct Placer {
    rent: RentContext,
    events: mpsc::Sender<Event>,
}

fn host_key(rented: &Rented) -> Option<PublicKey> {
    rented
        .host
        .parse::<gpux_protocol::PeerId>()
        .ok()
        .map(|p| p.public_key())
}

impl Placer {
    async fn act(&self, lease: &str, commit: bool) -> Result<(), ApiError> {
        let lease: ContentId = lease
            .parse()
            .map_err(|e| ApiError::internal(format!("{e}")))?;
        let what = if commit {
            super::LeaseAct::Commit
        } else {
            super::LeaseAct::Stop
        };
        super::act(&self.events, lease, what).await
    }

    /// Places `gpus` GPUs of `request` in `group`, on hosts not in `avoid`, then starts them
    /// all (or what holds, best effort) or none.
    async fn place(
        &self,
        request: &RentRequest,
        group: [u8; 16],
        gpus: u16,
        mut avoid: BTreeSet<PublicKey>,
    ) -> Result<Vec<Rented>, ApiError> {
        let placement = if request.best_effort {
            Placement::BestEffort
        } else {
            Placement::AllOrNothing
        };
        let started = tokio::time::Instant::now();
        let deadline = now().plus_ms(GROUP_WAIT.as_millis() as u64);
        let mut coordinator = GroupPlacement::new(placement, deadline);
        // By slot; `None` for a member that could not be placed.
        let mut members: Vec<Option<Rented>> = Vec::new();
        let mut left = gpus;
        let mut why = String::new();
        let mut effects = Vec::new();
        'placing: while left > 0 {
            // The largest share a host not used yet can give.
            for k in (1..=left).rev() {
                if started.elapsed() >= GROUP_WAIT {
                    break 'placing;
                }
                let mut member = request.clone();
                member.gpus = k;
                member.hold_s = Some(GROUP_HOLD_S);
                member.spread = false;
                member.best_effort = false;
                member.group = Some(gpux_protocol::hex(&group));
                match self.rent.run_avoiding(&member, &avoid).await {
                    Ok(rented) => {
                        let slot = coordinator.add();
                        effects.extend(coordinator.handle(now(), GroupInput::Held(slot)));
                        if let Some(host) = host_key(&rented) {
                            avoid.insert(host);
                        }
                        left -= k;
                        members.push(Some(rented));
                        continue 'placing;
                    }
                    Err(e) => why = e.message,
                }
            }
            // Not even one GPU more: this member fails.
            let slot = coordinator.add();
            effects.extend(coordinator.handle(now(), GroupInput::Failed(slot)));
            members.push(None);
            break;
        }
        effects.extend(coordinator.placed(now()));
        if coordinator.outcome().is_none() {
            effects.extend(coordinator.handle(deadline, GroupInput::Timer));
        }
        let mut outcome = GroupOutcome::Aborted;
        for effect in effects {
            let (i, commit) = match effect {
                GroupEffect::Commit(i) => (i, true),
                GroupEffect::Stop(i) => (i, false),
                GroupEffect::Decided(o) => {
                    outcome = o;
                    continue;
                }
            };
            if let Some(Some(member)) = members.get(i)
                && let Err(e) = self.act(&member.lease, commit).await
            {
                tracing::warn!("group member {}: {}", member.lease, e.message);
            }
        }
        let states = coordinator.members().to_vec();
        match outcome {
            GroupOutcome::Started { .. } => Ok(members
                .into_iter()
                .zip(states)
                .filter(|(_, s)| *s == gpux_lease::MemberState::Committed)
                .filter_map(|(m, _)| m)
                .collect()),
            GroupOutcome::Aborted => Err(ApiError::new(
                ErrorCode::NoOffer,
                format!(
                    "could not place all {gpus} GPUs ({} short: {why}); every member that held was stopped and nothing is charged",
                    left
                ),
            )
            .with_hint("fewer GPUs, a wider query, or --best-effort")),
        }
    }
}

fn group_id(text: &str) -> Result<[u8; 16], ApiError> {
    gpux_protocol::unhex(text)
        .ok()
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .ok_or_else(|| ApiError::bad_input(format!("group: '{text}' is not 32 hex digits")))
}

fn gpus_of(leases: &[Rented]) -> u32 {
    leases.iter().map(|r| r.gpus.len() as u32).sum()
}

impl Daemon {
    fn placer(&self) -> Placer {
        Placer {
            rent: self.rent_context(),
            events: self.events_tx.clone(),
        }
    }

    /// `POST /v1/groups`.
    pub(super) fn start_group(&mut self, request: RentRequest, reply: Reply<GroupPlaced>) {
        match self.followed(&request.query) {
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
            Ok(true) => {
                return self.after_following(super::ApiCommand::Group {
                    request: Box::new(request),
                    reply,
                });
            }
            Ok(false) => {}
        }
        if !request.spread {
            let _ = reply.send(Err(ApiError::bad_input(
                "a group order spreads over hosts: set spread",
            )));
            return;
        }
        if request.resume
            || request.hold_s.is_some()
            || request.group.is_some()
            || request.challenge
        {
            let _ = reply.send(Err(ApiError::bad_input(
                "a group order takes no --resume, --hold, --challenge or group of its own",
            )));
            return;
        }
        if let Err(e) = super::spend::worst_of(&request).and_then(|w| self.within_cap(w)) {
            let _ = reply.send(Err(e));
            return;
        }
        let mut group = [0u8; 16];
        if let Err(e) = getrandom::fill(&mut group) {
            let _ = reply.send(Err(ApiError::internal(e.to_string())));
            return;
        }
        let placer = self.placer();
        tokio::spawn(async move {
            let result = placer
                .place(&request, group, request.gpus, BTreeSet::new())
                .await;
            let result = match result {
                Ok(leases) => {
                    placer.joined(group, &request, &leases).await;
                    Ok(GroupPlaced {
                        group: gpux_protocol::hex(&group),
                        gpus: gpus_of(&leases),
                        leases,
                    })
                }
                Err(e) => Err(e),
            };
            let _ = reply.send(result);
        });
    }

    /// `POST /v1/groups/{group}/scale`.
    pub(super) fn scale_group(&mut self, group: &str, delta: i32, reply: Reply<GroupScaled>) {
        let id = match group_id(group) {
            Ok(id) => id,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let Ok(Some(record)) = self.state.group(&id) else {
            let _ = reply.send(Err(ApiError::new(
                ErrorCode::UnknownLease,
                format!("no group {group} here"),
            )));
            return;
        };
        let Ok(request) = serde_json::from_slice::<RentRequest>(&record.request) else {
            let _ = reply.send(Err(ApiError::internal(
                "the group's stored rent does not read",
            )));
            return;
        };
        // Its leases that still run, in order, with their GPUs.
        let running: Vec<(ContentId, u32)> = record
            .members
            .iter()
            .filter_map(|id| {
                let rec = self.state.renter_lease(id).ok().flatten()?;
                let running = matches!(
                    rec.phase,
                    gpux_lease::RenterPhase::Running | gpux_lease::RenterPhase::Held
                );
                let gpus = super::views::renter_view(*id, &rec)?.gpus.len() as u32;
                running.then_some((*id, gpus))
            })
            .collect();
        let now_gpus: u32 = running.iter().map(|(_, g)| g).sum();
        match delta {
            0 => {
                let _ = reply.send(Err(ApiError::bad_input("scale by +K or -K, not 0")));
            }
            d if d > 0 => {
                let placer = self.placer();
                let gpus = u16::try_from(d).unwrap_or(u16::MAX);
                tokio::spawn(async move {
                    let result = match placer.place(&request, id, gpus, BTreeSet::new()).await {
                        Ok(added) => {
                            placer.joined(id, &request, &added).await;
                            Ok(GroupScaled {
                                group: gpux_protocol::hex(&id),
                                gpus: now_gpus + gpus_of(&added),
                                added,
                                stopped: Vec::new(),
                            })
                        }
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(result);
                });
            }
            d => {
                // Whole leases, the latest first, adding up to exactly the GPUs asked.
                let mut left = d.unsigned_abs();
                let mut stop = Vec::new();
                for (id, gpus) in running.iter().rev() {
                    if *gpus <= left {
                        stop.push(*id);
                        left -= gpus;
                    }
                    if left == 0 {
                        break;
                    }
                }
                if left > 0 {
                    let sizes: Vec<String> = running.iter().map(|(_, g)| g.to_string()).collect();
                    let _ = reply.send(Err(ApiError::bad_input(format!(
                        "the group's running leases hold {} GPUs: {d} is not a sum of whole leases",
                        sizes.join(" + ")
                    ))));
                    return;
                }
                let mut stopped = Vec::new();
                for lease in stop {
                    match self.renter.stop(lease) {
                        Ok(_) => stopped.push(lease.to_string()),
                        Err(e) => {
                            let _ = reply.send(Err(e));
                            return;
                        }
                    }
                }
                let _ = reply.send(Ok(GroupScaled {
                    group: gpux_protocol::hex(&id),
                    added: Vec::new(),
                    gpus: now_gpus - d.unsigned_abs(),
                    stopped,
                }));
            }
        }
    }

    pub(super) fn on_group_event(&mut self, event: GroupEvent) {
        match event {
            GroupEvent::Joined {
                group,
                request,
                members,
                stored,
            } => {
                let mut record = match self.state.group(&group) {
                    Ok(Some(record)) => record,
                    _ => GroupRecord {
                        request: serde_json::to_vec(&*request).unwrap_or_default(),
                        members: Vec::new(),
                    },
                };
                record.members.extend(members);
                if let Err(e) = self.state.save_group(&group, &record) {
                    tracing::error!("group {}: cannot store it: {e}", gpux_protocol::hex(&group));
                }
                let _ = stored.send(());
            }
        }
    }
}

impl Placer {
    async fn joined(&self, group: [u8; 16], request: &RentRequest, leases: &[Rented]) {
        let members = leases
            .iter()
            .filter_map(|r| r.lease.parse::<ContentId>().ok())
            .collect();
        let (stored, done) = oneshot::channel();
        report(
            &self.events,
            Event::Group(GroupEvent::Joined {
                group,
                // (Kept on disk: without the registry's credentials.)
                request: Box::new(request.without_secrets()),
                members,
                stored,
            }),
        )
        .await;
        let _ = done.await;
    }
}
