//! A deterministic simulator of group orders: a renter places 2 to 4 member leases on as
//! many hosts, each held for its commit, and [`GroupPlacement`] commits them all or stops
//! them all. Hosts refuse, or accept and then fall silent (some after locking the escrow at
//! the ledger); messages are delayed and reordered. Over many schedules:
//!
//! - all or nothing: an aborted group runs no container; a started all-or-nothing group
//!   committed every member only after every member held;
//! - no partial group holds money: every escrow locked is released, credits are conserved,
//!   and an aborted group costs its renter nothing;
//! - every lease the renter agreed settles, as does every host lease that did not go silent.
//!
//! `GPUX_GROUP_SCHEDULES` sets how many schedules run (2,000 by default).

use std::collections::BTreeMap;

use gpux_lease::{
    GroupEffect, GroupInput, GroupOutcome, GroupPlacement, HostEffect, HostInput, HostLease,
    LedgerCall, LedgerMachine, LedgerVerdict, LockOutcome, MemberState, Placement, RentReport,
    RenterAnswer, RenterEffect, RenterInput, RenterLease, RenterPhase, Timing,
};
use gpux_market::LedgerConfig;
use gpux_protocol::*;
use gpux_testkit as kit;

const T0: u64 = 1_000_000;
const HORIZON_MS: u64 = 30 * 60 * 1000;
/// A renter gives up on an unanswered lock after this long (as the node's request times out).
const LOCK_TIMEOUT_MS: u64 = 15_000;
const WAIT_MS: u64 = 60_000;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    Honest,
    /// Refuses the request.
    Refuses,
    /// Accepts, then is never heard from again.
    SilentAfterAccept,
    /// Locks the escrow at the ledger, then is never heard from again.
    SilentAfterLock,
}

#[derive(Debug)]
enum Ev {
    Host(usize, HostInput),
    Renter(usize, RenterInput),
    /// A ledger submission (from the host when `by_host`).
    Ledger {
        member: usize,
        by_host: bool,
        call: LedgerCall,
        envelope: Vec<u8>,
    },
    /// An envelope from the renter reaches the member's host.
    ToHost(usize, Vec<u8>),
    LockTimeout(usize),
    ContainerUp(usize),
    ContainerDown(usize),
    Group(GroupInput),
    /// The renter places member `i`.
    Place(usize),
}

struct Member {
    behaviour: Behaviour,
    host_key: Keypair,
    host: Option<HostLease>,
    renter: Option<RenterLease>,
    lock_answered: bool,
    started: Option<u64>,
    finished: Option<u64>,
    /// Its index in the placement, once placed.
    slot: Option<usize>,
}

struct World {
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    renter_key: Keypair,
    ledger: LedgerMachine,
    ledger_key: PublicKey,
    members: Vec<Member>,
    group: GroupPlacement,
    placement: Placement,
    /// When each member was held and committed, by slot.
    held_at: BTreeMap<usize, u64>,
    committed_at: BTreeMap<usize, u64>,
    minted: u64,
}

fn request(renter: &Keypair, host: &Keypair, n: u8) -> Verified<LeaseRequest> {
    kit::sign(
        renter,
        LeaseRequest {
            duration_s: 30,
            escrow: EscrowId([n; 16]),
            escrow_amount: MicroCredits(60_000),
            terms: LeaseTerms {
                commit_wait_ms: Some(WAIT_MS),
                ..LeaseTerms::default()
            },
            ..kit::request_to(
                host.public(),
                ContentId([n; 32]),
                [GpuUuid::Gpu([n; 16])],
                MicroCredits(3_600_000),
                Timestamp(T0),
            )
        },
    )
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng(seed ^ 0x5555);
        let n = rng.range(2, 5) as usize;
        let placement = if rng.chance(80) {
            Placement::AllOrNothing
        } else {
            Placement::BestEffort
        };
        let ledger_keypair = Keypair::from_seed(&[9; 32]);
        let ledger_key = ledger_keypair.public();
        let mut ledger = LedgerMachine::new(
            ledger_keypair,
            LedgerConfig {
                release_grace_ms: 10_000,
                ..LedgerConfig::default()
            },
        );
        let renter_key = Keypair::from_seed(&[2; 32]);
        let minted = 10_000_000;
        ledger
            .mint(Timestamp(T0), renter_key.public(), MicroCredits(minted))
            .unwrap();
        let members = (0..n)
            .map(|i| {
                let behaviour = match rng.range(0, 100) {
                    0..75 => Behaviour::Honest,
                    75..83 => Behaviour::Refuses,
                    83..91 => Behaviour::SilentAfterAccept,
                    _ => Behaviour::SilentAfterLock,
                };
                Member {
                    behaviour,
                    host_key: Keypair::from_seed(&[10 + i as u8; 32]),
                    host: None,
                    renter: None,
                    lock_answered: false,
                    started: None,
                    finished: None,
                    slot: None,
                }
            })
            .collect();
        let deadline = Timestamp(T0 + WAIT_MS);
        let mut w = World {
            rng,
            now: T0,
            seq: 0,
            queue: BTreeMap::new(),
            renter_key,
            ledger,
            ledger_key,
            members,
            group: GroupPlacement::new(placement, deadline),
            placement,
            held_at: BTreeMap::new(),
            committed_at: BTreeMap::new(),
            minted,
        };
        // The renter places the members one after another.
        w.at(0, Ev::Place(0));
        w.at(WAIT_MS, Ev::Group(GroupInput::Timer));
        w
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn delay(&mut self) -> u64 {
        self.rng.range(1, 800)
    }

    fn silent(&self, i: usize) -> bool {
        let m = &self.members[i];
        match m.behaviour {
            Behaviour::SilentAfterAccept => true,
            Behaviour::SilentAfterLock => m.host.as_ref().is_some_and(|h| {
                h.record().lock_record.is_some()
                    || h.phase() != gpux_lease::HostPhase::Locking
                        && h.phase() != gpux_lease::HostPhase::AwaitingLock
            }),
            _ => false,
        }
    }

    fn place(&mut self, i: usize) {
        let now = Timestamp(self.now);
        let slot = self.group.add();
        self.members[i].slot = Some(slot);
        let r = request(&self.renter_key, &self.members[i].host_key, i as u8 + 1);
        if self.members[i].behaviour == Behaviour::Refuses {
            let d = self.delay();
            self.at(d, Ev::Group(GroupInput::Failed(slot)));
        } else {
            let accept = Signed::sign(
                &self.members[i].host_key,
                Timing::default().accept(r.id(), now, None),
            )
            .unwrap();
            let (host, effects) = HostLease::accepted(
                self.members[i].host_key.clone(),
                r.clone(),
                &accept,
                Timing::default(),
                Vec::new(),
            );
            self.members[i].host = Some(host);
            self.host_effects(i, effects);
            let (renter, effects) =
                RenterLease::accepted(self.renter_key.clone(), r, &accept, self.ledger_key, now)
                    .unwrap();
            self.members[i].renter = Some(renter);
            self.renter_effects(i, effects);
        }
        if i + 1 < self.members.len() {
            let d = self.delay();
            self.at(d, Ev::Place(i + 1));
        } else {
            let effects = self.group.placed(now);
            self.group_effects(effects);
        }
    }

    fn host_effects(&mut self, i: usize, effects: Vec<HostEffect>) {
        for effect in effects {
            // A silent host does nothing more.
            if self.silent(i) && !matches!(effect, HostEffect::Persist) {
                continue;
            }
            let d = self.delay();
            match effect {
                HostEffect::Ledger { call, envelope } => self.at(
                    d,
                    Ev::Ledger {
                        member: i,
                        by_host: true,
                        call,
                        envelope,
                    },
                ),
                HostEffect::AnswerLock { envelope, .. } => {
                    let outcome = match AnySigned::from_bytes(envelope).and_then(AnySigned::verify)
                    {
                        Ok(AnyVerified::LedgerRecord(r)) => LockOutcome::Record(Box::new(r)),
                        Ok(AnyVerified::LeaseReject(r)) => LockOutcome::Rejected(Box::new(r)),
                        _ => LockOutcome::Unanswered,
                    };
                    self.at(d, Ev::Renter(i, RenterInput::Lock(outcome)));
                }
                HostEffect::StartContainer => self.at(d, Ev::ContainerUp(i)),
                HostEffect::StopContainer { .. } => self.at(d, Ev::ContainerDown(i)),
                HostEffect::EraseContainer => self.at(d, Ev::Host(i, HostInput::ContainerErased)),
                HostEffect::SendReceipt { seq, envelope } => {
                    let Ok(AnyVerified::UsageReceipt(receipt)) =
                        AnySigned::from_bytes(envelope).and_then(AnySigned::verify)
                    else {
                        continue;
                    };
                    let now = Timestamp(self.now + d);
                    let answer = match self.members[i].renter.as_mut() {
                        Some(r) => r.handle(now, RenterInput::Receipt(receipt)),
                        None => Vec::new(),
                    };
                    let ack = answer.iter().find_map(|e| match e {
                        RenterEffect::Respond { envelope } => Some(envelope.clone()),
                        _ => None,
                    });
                    let answer =
                        match ack.map(|a| AnySigned::from_bytes(a).and_then(AnySigned::verify)) {
                            Some(Ok(AnyVerified::ReceiptAck(a))) => RenterAnswer::Ack(a),
                            Some(Ok(AnyVerified::LeaseEnd(e))) => RenterAnswer::Dispute(e),
                            _ => RenterAnswer::Nothing,
                        };
                    self.at(
                        d + 10,
                        Ev::Host(i, HostInput::ReceiptAnswer { seq, answer }),
                    );
                }
                HostEffect::SendEnd { envelope } | HostEffect::Notify { envelope, .. } => {
                    if let Ok(AnyVerified::LeaseEnd(end)) =
                        AnySigned::from_bytes(envelope).and_then(AnySigned::verify)
                    {
                        self.at(d, Ev::Renter(i, RenterInput::HostEnd(end)));
                    }
                }
                HostEffect::Schedule { at, timer } => {
                    let wait = at.0.saturating_sub(self.now);
                    self.at(wait, Ev::Host(i, HostInput::Timer(timer)));
                }
                HostEffect::Persist
                | HostEffect::FreeGpus
                | HostEffect::PreemptSpot { .. }
                | HostEffect::PrepareWorkspace => {}
            }
        }
    }

    fn renter_effects(&mut self, i: usize, effects: Vec<RenterEffect>) {
        for effect in effects {
            let d = self.delay();
            match effect {
                RenterEffect::SendLock { envelope } => {
                    self.at(LOCK_TIMEOUT_MS, Ev::LockTimeout(i));
                    self.at(d, Ev::ToHost(i, envelope));
                }
                RenterEffect::SendCommit { envelope } | RenterEffect::SendEnd { envelope } => {
                    self.at(d, Ev::ToHost(i, envelope))
                }
                RenterEffect::Ledger { call, envelope } => self.at(
                    d,
                    Ev::Ledger {
                        member: i,
                        by_host: false,
                        call,
                        envelope,
                    },
                ),
                RenterEffect::Schedule { at, timer } => {
                    let wait = at.0.saturating_sub(self.now);
                    self.at(wait, Ev::Renter(i, RenterInput::Timer(timer)));
                }
                RenterEffect::Report(report) => {
                    let slot = self.members[i].slot.unwrap();
                    let input = match report {
                        RentReport::Held => {
                            self.held_at.insert(slot, self.now);
                            GroupInput::Held(slot)
                        }
                        RentReport::Running | RentReport::Failed { .. } => GroupInput::Failed(slot),
                    };
                    self.at(0, Ev::Group(input));
                }
                RenterEffect::Persist | RenterEffect::Respond { .. } => {}
            }
        }
    }

    fn group_effects(&mut self, effects: Vec<GroupEffect>) {
        let now = Timestamp(self.now);
        for effect in effects {
            let (slot, commit) = match effect {
                GroupEffect::Commit(s) => (s, true),
                GroupEffect::Stop(s) => (s, false),
                GroupEffect::Decided(_) => continue,
            };
            let i = self
                .members
                .iter()
                .position(|m| m.slot == Some(slot))
                .unwrap();
            let Some(renter) = self.members[i].renter.as_mut() else {
                continue;
            };
            let effects = if commit {
                self.committed_at.insert(slot, self.now);
                renter.commit(now).unwrap_or_default()
            } else {
                renter.stop(now).unwrap_or_default()
            };
            self.renter_effects(i, effects);
        }
    }

    fn host_in(&mut self, i: usize, input: HostInput) {
        if self.silent(i) {
            return;
        }
        let now = Timestamp(self.now);
        if let Some(host) = self.members[i].host.as_mut() {
            let effects = host.handle(now, input);
            self.host_effects(i, effects);
        }
    }

    fn step(&mut self, ev: Ev) {
        let now = Timestamp(self.now);
        match ev {
            Ev::Place(i) => self.place(i),
            Ev::Host(i, input) => self.host_in(i, input),
            Ev::Renter(i, input) => {
                if matches!(input, RenterInput::Lock(_)) {
                    if self.members[i].lock_answered {
                        return;
                    }
                    self.members[i].lock_answered = true;
                }
                if let Some(r) = self.members[i].renter.as_mut() {
                    let effects = r.handle(now, input);
                    self.renter_effects(i, effects);
                }
            }
            Ev::LockTimeout(i) => {
                if !self.members[i].lock_answered {
                    self.step(Ev::Renter(i, RenterInput::Lock(LockOutcome::Unanswered)));
                }
            }
            Ev::ToHost(i, envelope) => {
                let input = match AnySigned::from_bytes(envelope).and_then(AnySigned::verify) {
                    Ok(AnyVerified::EscrowLock(l)) => HostInput::Lock(l),
                    Ok(AnyVerified::LeaseCommit(c)) => HostInput::Commit(c),
                    Ok(AnyVerified::LeaseEnd(e)) => HostInput::RenterEnd(e),
                    _ => return,
                };
                self.host_in(i, input);
            }
            Ev::Ledger {
                member,
                by_host,
                call,
                envelope,
            } => {
                let response = self.ledger.submit(now, envelope).response;
                let verdict = LedgerVerdict::from_response(response, &[self.ledger_key]);
                if by_host {
                    self.host_in(member, HostInput::Ledger { call, verdict });
                } else {
                    self.step(Ev::Renter(member, RenterInput::Ledger { call, verdict }));
                }
            }
            Ev::ContainerUp(i) => {
                self.members[i].started = Some(self.now);
                self.host_in(i, HostInput::ContainerStarted { started_at: now });
            }
            Ev::ContainerDown(i) => {
                if self.members[i].started.is_some() {
                    self.members[i].finished.get_or_insert(self.now);
                }
                let finished = self.members[i].finished.map(Timestamp);
                self.host_in(
                    i,
                    HostInput::ContainerExited {
                        finished_at: finished,
                        exit_code: Some(137),
                    },
                );
            }
            Ev::Group(input) => {
                let effects = self.group.handle(now, input);
                self.group_effects(effects);
            }
        }
    }

    fn run(mut self, seed: u64) -> Result<GroupOutcome, String> {
        while let Some(((t, _), ev)) = self.queue.pop_first() {
            if t > T0 + HORIZON_MS {
                return Err(format!("seed {seed}: still busy at the horizon"));
            }
            self.now = t;
            self.step(ev);
        }
        self.check()
            .map_err(|why| format!("seed {seed}: {why}; members {:?}", self.summary()))?;
        self.group
            .outcome()
            .ok_or_else(|| format!("seed {seed}: undecided"))
    }

    fn summary(&self) -> Vec<(Behaviour, Option<MemberState>, Option<u64>)> {
        self.members
            .iter()
            .map(|m| {
                (
                    m.behaviour,
                    m.slot.map(|s| self.group.members()[s]),
                    m.started,
                )
            })
            .collect()
    }

    fn check(&self) -> Result<(), String> {
        let ledger = self.ledger.ledger();
        if ledger.total() != u128::from(self.minted) {
            return Err("credits not conserved".into());
        }
        let outcome = self.group.outcome().ok_or("the group was never decided")?;
        let ran = self.members.iter().filter(|m| m.started.is_some()).count();
        match outcome {
            GroupOutcome::Aborted => {
                if ran > 0 {
                    return Err(format!("an aborted group ran {ran} containers"));
                }
                if ledger.balance(&self.renter_key.public()).0 != self.minted {
                    return Err("an aborted group cost its renter something".into());
                }
            }
            GroupOutcome::Started { members } => {
                // Every commit came after every member it started with held.
                let last_held = self.held_at.values().max().copied().unwrap_or(0);
                let first_commit = self.committed_at.values().min().copied().unwrap_or(0);
                if self.placement == Placement::AllOrNothing
                    && (first_commit < last_held || members != self.members.len())
                {
                    return Err(format!(
                        "committed {members} of {} at {first_commit}, the last held at {last_held}",
                        self.members.len()
                    ));
                }
                if ran > members {
                    return Err(format!("{ran} ran, {members} committed"));
                }
            }
        }
        // No partial group holds money: every escrow locked is released, every renter
        // lease settles, and every host lease that did not go silent.
        for (i, m) in self.members.iter().enumerate() {
            let escrow = EscrowId([i as u8 + 1; 16]);
            if ledger.escrow(&escrow).is_some_and(|e| !e.released) {
                return Err(format!("member {i}'s escrow is still locked"));
            }
            if let Some(r) = &m.renter
                && r.phase() != RenterPhase::Settled
            {
                return Err(format!("member {i}'s renter lease is {:?}", r.phase()));
            }
            if let Some(h) = &m.host
                && !self.silent(i)
                && h.phase() != gpux_lease::HostPhase::Settled
            {
                return Err(format!("member {i}'s host lease is {:?}", h.phase()));
            }
        }
        Ok(())
    }
}

#[test]
fn a_group_starts_all_or_nothing_and_no_partial_group_holds_money() {
    let schedules = std::env::var("GPUX_GROUP_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000u64);
    let mut failures = Vec::new();
    let (mut started, mut aborted) = (0, 0);
    for seed in 0..schedules {
        match World::new(seed).run(seed) {
            Ok(GroupOutcome::Started { .. }) => started += 1,
            Ok(GroupOutcome::Aborted) => aborted += 1,
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {schedules} schedules failed; first: {}",
        failures.len(),
        failures[0]
    );
    // Both outcomes happen, often.
    assert!(
        started > schedules / 10 && aborted > schedules / 10,
        "{started} started, {aborted} aborted"
    );
}
