//! A deterministic simulator of one lease: the host and renter machines, the ledger machine
//! over the market's `Ledger` in memory, a fake Docker, a fake clock, and a bus that delays,
//! drops, duplicates and reorders. Either side can be killed and restarted from its last
//! persisted record; the ledger can be unreachable for longer than its release grace;
//! metering samples can be slower than the receipt interval.
//!
//! Every schedule is checked for the rules of a lease (see [`check`]). A failing schedule
//! prints its seed: `GPUX_SIM_SEED=<seed> cargo test -p gpux-lease sim -- --nocapture`
//! replays exactly it. `GPUX_SIM_SCHEDULES` sets how many schedules run (10,000 by default).

use std::collections::BTreeMap;

use gpux_lease::{
    ContainerState, HostEffect, HostInput, HostLease, HostPhase, LedgerCall, LedgerMachine,
    LedgerVerdict, LockOutcome, RentReport, RenterAnswer, RenterEffect, RenterInput, RenterLease,
    RenterPhase, StartFailure, Timing, UsageSample,
};
use gpux_market::LedgerConfig;
use gpux_protocol::ledger_wire::LedgerResponse;
use gpux_protocol::{
    AnySigned, AnyVerified, ContentId, GpuUuid, Keypair, LeaseKind, LeaseRequest, MicroCredits,
    Signed, Timestamp,
};
use gpux_testkit as kit;

/// SplitMix64: small, fast, and the same everywhere (the crowd simulator draws from it too).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `p` percent.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Most time Docker takes to kill a container, ms.
const KILL_MAX_MS: u64 = 400;
/// A request to a peer that gets no answer in this time counts as unanswered.
const PEER_TIMEOUT_MS: u64 = 5_000;
/// The renter's escrow-lock request times out after this.
const LOCK_TIMEOUT_MS: u64 = 15_000;
/// A ledger call times out after this.
const LEDGER_TIMEOUT_MS: u64 = 10_000;
/// A schedule that has not ended by then has a lease that never ends.
const HORIZON_MS: u64 = 4 * 3600 * 1000;
/// Price: 3.6 credits per GPU-hour is exactly 1000 micro-credits per GPU-second.
const PER_GPU_SECOND: u64 = 1000;
/// A kept workspace's price, micro-credits per GiB-hour, and what 1 GiB kept 600 s costs.
const RETENTION_PRICE: u64 = 36_000;
const RETENTION: u64 = 6_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Party {
    Host,
    Renter,
}

#[derive(Debug)]
enum Ev {
    HostIn {
        epoch: u64,
        input: HostInput,
    },
    RenterIn {
        epoch: u64,
        input: RenterInput,
    },
    /// A receipt reaches the renter; its answer goes back to host epoch `epoch`.
    ReceiptAtRenter {
        epoch: u64,
        seq: u64,
        envelope: Vec<u8>,
        answer_by: u64,
    },
    /// The renter's lock reaches the host.
    LockAtHost {
        renter_epoch: u64,
        envelope: Vec<u8>,
    },
    /// A one-way `LeaseEnd`.
    EndAt {
        to: Party,
        envelope: Vec<u8>,
    },
    /// A ledger call reaches the ledger.
    LedgerAt {
        from: Party,
        epoch: u64,
        call: LedgerCall,
        envelope: Vec<u8>,
        sent: u64,
    },
    /// A lock-request timeout on the renter.
    LockTimeout {
        epoch: u64,
    },
    /// Docker: the container has started.
    ContainerUp {
        epoch: u64,
    },
    /// Docker: the container has stopped.
    ContainerDown {
        epoch: u64,
        code: i64,
    },
    /// The workload exits by itself.
    SelfExit,
    Sample {
        epoch: u64,
    },
    Kill(Party),
    Restart(Party),
    RenterStop,
    /// An on-demand request needs a spot lease's GPUs: the host preempts it.
    Preempt,
    /// The renter commits its held lease (its files are in).
    RenterCommit {
        epoch: u64,
    },
    /// A party's store stops taking receipts (its lease records still go in): a receipt it
    /// would keep cannot be kept from now on.
    StoreBreaks(Party),
    /// The host ends the lease itself (`gpux node stop --end-leases`).
    HostEnds,
    /// One of the lease's GPUs fails on the host.
    GpuFault,
}

#[derive(Debug, Default, Clone)]
struct Container {
    started_at: Option<u64>,
    finished_at: Option<u64>,
    exit_code: Option<i64>,
    removed: bool,
    /// When the workload would exit by itself, from its start (ms).
    self_exit_after: Option<u64>,
}

/// Faults drawn for one schedule.
#[derive(Debug, Clone)]
struct Faults {
    drop_pct: u64,
    dup_pct: u64,
    delay_max: u64,
    sample_max: u64,
    outages: Vec<(u64, u64)>,
}

struct World {
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    faults: Faults,
    timing: Timing,
    host_key: Keypair,
    renter_key: Keypair,
    ledger: LedgerMachine,
    ledger_key: gpux_protocol::PublicKey,
    host: Option<HostLease>,
    host_saved: Option<gpux_lease::HostRecord>,
    host_epoch: u64,
    host_down_since: Option<u64>,
    host_down_ms: u64,
    host_restarts: u64,
    renter: Option<RenterLease>,
    renter_saved: Option<gpux_lease::RenterRecord>,
    renter_epoch: u64,
    lock_answered: bool,
    container: Option<Container>,
    report: Option<RentReport>,
    /// The largest amount the renter ever acknowledged, micro-credits.
    max_acked: u64,
    released_records: u32,
    pub trace: Vec<String>,
    request: gpux_protocol::Verified<LeaseRequest>,
    /// For a spot lease: the on-demand request that preempts it.
    preemptor: Option<gpux_protocol::Verified<LeaseRequest>>,
    /// For a lease that waits for its commit: when the renter commits once held (ms after
    /// it learns the lease is held; `None`: never).
    commit_after: Option<u64>,
    minted: u64,
    /// Whose receipt store is broken.
    store_broken: Option<Party>,
    /// The store failures a machine was told of while its lease had not ended: its lease
    /// must end `StoreFailed`.
    store_failed: Vec<Party>,
}

fn request(
    renter: &Keypair,
    host: &Keypair,
    gpus: u8,
    duration_s: u32,
    t: u64,
    kept_workspace: bool,
    kind: LeaseKind,
) -> gpux_protocol::Verified<LeaseRequest> {
    let price = MicroCredits(PER_GPU_SECOND * 3600);
    // 1 GiB kept 600 s at 0.036 credits per GiB-hour: 6,000 micro-credits.
    let kept = gpux_protocol::LeaseTerms {
        workspace_bytes: Some(1 << 30),
        retain_s: Some(600),
        workspace_price: MicroCredits(RETENTION_PRICE),
        ..gpux_protocol::LeaseTerms::default()
    };
    let escrow_amount =
        gpux_protocol::money::cost(u64::from(gpus) * u64::from(duration_s).max(60), price)
            .unwrap()
            .checked_add(MicroCredits(if kept_workspace { RETENTION } else { 0 }))
            .unwrap();
    kit::sign(
        renter,
        LeaseRequest {
            duration_s,
            kind,
            escrow_amount,
            terms: if kept_workspace {
                kept
            } else {
                gpux_protocol::LeaseTerms::default()
            },
            ..kit::request_to(
                host.public(),
                ContentId([3; 32]),
                (0..gpus).map(|g| GpuUuid::Gpu([g + 1; 16])),
                price,
                Timestamp(t),
            )
        },
    )
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng::new(seed);
        let timing = Timing {
            receipt_interval_ms: rng.range(1, 5) * 1000,
            ack_grace_ms: rng.range(1, 4) * 1000,
            spot_notice_ms: rng.range(2, 20) * 1000,
        };
        let release_grace_ms = rng.range(10, 30) * 1000;
        let duration_s = rng.range(20, 80) as u32;
        let gpus = rng.range(1, 3) as u8;
        let mut outages = Vec::new();
        for _ in 0..rng.range(0, 2) {
            let start = rng.range(0, u64::from(duration_s) * 1000 + 20_000);
            // Some outages outlast the release grace.
            let len = rng.range(1_000, 50_000);
            outages.push((start, start + len));
        }
        let faults = Faults {
            drop_pct: rng.range(0, 25),
            dup_pct: rng.range(0, 15),
            delay_max: rng.range(5, 1500),
            sample_max: rng.range(800, 7000),
            outages,
        };
        let host_key = Keypair::from_seed(&[1; 32]);
        let renter_key = Keypair::from_seed(&[2; 32]);
        let ledger_keypair = Keypair::from_seed(&[9; 32]);
        let ledger_key = ledger_keypair.public();
        let mut ledger = LedgerMachine::new(
            ledger_keypair,
            LedgerConfig {
                release_grace_ms,
                ..LedgerConfig::default()
            },
        );
        let t0 = 1_000_000;
        let minted = 1_000_000_000;
        ledger
            .mint(Timestamp(t0), renter_key.public(), MicroCredits(minted))
            .unwrap();
        // Half the leases keep a priced workspace after the work.
        let kept_workspace = rng.chance(50);
        // A third of the leases are spot, and preempted at some point.
        let spot = rng.chance(33);
        // Of the others, a quarter reserve a window starting up to 20 s ahead.
        let kind = if spot {
            LeaseKind::Spot
        } else if rng.chance(25) {
            let start = Timestamp(t0 + rng.range(0, 20_000));
            LeaseKind::Reserved {
                start,
                end: start.plus_secs(u64::from(duration_s)),
            }
        } else {
            LeaseKind::OnDemand
        };
        // Of the on-demand leases, a third wait for the renter's commit (as a resumed lease
        // or a group member does), which comes late or never in some schedules.
        let commit_wait_ms =
            (kind == LeaseKind::OnDemand && rng.chance(33)).then(|| rng.range(5, 30) * 1000);
        let commit_after = commit_wait_ms.and_then(|w| {
            let never = rng.chance(10);
            (!never).then(|| rng.range(0, w * 13 / 10))
        });
        let request = request(
            &renter_key,
            &host_key,
            gpus,
            duration_s,
            t0,
            kept_workspace,
            kind,
        );
        // Half the reserved windows commit their renter to a minimum (paid when it stops
        // the window early).
        let committed_s = (matches!(kind, LeaseKind::Reserved { .. }) && rng.chance(50))
            .then(|| rng.range(1, u64::from(duration_s)));
        // Half of those publish a cancellation fee schedule (steps within the 20 s ahead).
        let fees = (committed_s.is_some() && rng.chance(50)).then(|| {
            gpux_protocol::CancelFees::new(vec![
                gpux_protocol::FeeTier {
                    within_s: rng.range(9, 16) as u32,
                    percent: rng.range(10, 60) as u8,
                },
                gpux_protocol::FeeTier {
                    within_s: rng.range(1, 7) as u32,
                    percent: 100,
                },
            ])
            .unwrap()
        });
        // (Signed again with the terms: the helper's arguments are enough already.)
        let request = match (commit_wait_ms, committed_s) {
            (None, None) => request,
            (wait, committed) => {
                let mut body = request.body().clone();
                body.terms.commit_wait_ms = wait;
                body.terms.committed_s = committed.unwrap_or(0);
                if let Some(fees) = &fees {
                    body.terms.cancel_fees = fees.clone();
                }
                Signed::sign(&renter_key, body).unwrap()
            }
        };
        assert_eq!(
            gpux_lease::bill::retention(&request).0,
            if kept_workspace { RETENTION } else { 0 }
        );
        let mut world = World {
            rng,
            now: t0,
            seq: 0,
            queue: BTreeMap::new(),
            faults,
            timing,
            host_key,
            renter_key,
            ledger,
            ledger_key,
            host: None,
            host_saved: None,
            host_epoch: 0,
            host_down_since: None,
            host_down_ms: 0,
            host_restarts: 0,
            renter: None,
            renter_saved: None,
            renter_epoch: 0,
            lock_answered: false,
            container: None,
            report: None,
            max_acked: 0,
            store_broken: None,
            store_failed: Vec::new(),
            released_records: 0,
            trace: Vec::new(),
            request,
            preemptor: None,
            commit_after,
            minted,
        };
        world.trace.push(format!(
            "timing {:?}, duration {duration_s} s, {gpus} GPU(s), release grace {release_grace_ms} ms, faults {:?}",
            world.timing, world.faults
        ));
        // The host accepts (a window ahead is booked from its start); the renter sends its
        // lock.
        let starts_at = match kind {
            LeaseKind::Reserved { start, .. } if start.0 > t0 => Some(start),
            _ => None,
        };
        let accept = Signed::sign(
            &world.host_key,
            timing.accept(world.request.id(), Timestamp(t0), starts_at),
        )
        .unwrap();
        let (host, effects) = HostLease::accepted(
            world.host_key.clone(),
            world.request.clone(),
            &accept,
            timing,
            Vec::new(),
        );
        world.host = Some(host);
        world.host_effects(effects);
        let (renter, effects) = RenterLease::accepted(
            world.renter_key.clone(),
            world.request.clone(),
            &accept,
            world.ledger_key,
            Timestamp(t0 + world.rng.range(1, 300)),
        )
        .unwrap();
        world.renter = Some(renter);
        world.renter_effects(effects);
        // Faults on the parties.
        let span = u64::from(duration_s) * 1000 + 10_000;
        for _ in 0..world.rng.range(0, 2) {
            let party = if world.rng.chance(50) {
                Party::Host
            } else {
                Party::Renter
            };
            let at = world.rng.range(0, span);
            world.at(at, Ev::Kill(party));
        }
        if world.rng.chance(30) {
            let at = world.rng.range(1_000, span);
            world.at(at, Ev::RenterStop);
        } else if let (Some(_), LeaseKind::Reserved { start, .. }) = (&fees, kind)
            && start.0 > t0 + 1_000
            && world.rng.chance(60)
        {
            // A window with a fee schedule is often cancelled before its start.
            let at = world.rng.range(1_000, start.0 - t0);
            world.at(at, Ev::RenterStop);
        }
        if world.rng.chance(20) {
            let after = world.rng.range(0, u64::from(duration_s) * 1000);
            world.container_template().self_exit_after = Some(after);
        }
        if world.rng.chance(15) {
            let party = if world.rng.chance(50) {
                Party::Host
            } else {
                Party::Renter
            };
            let at = world.rng.range(0, span);
            world.at(at, Ev::StoreBreaks(party));
        }
        if spot {
            let at = world.rng.range(0, span);
            let other = Keypair::from_seed(&[3; 32]);
            let preemptor = self::request(
                &other,
                &world.host_key,
                gpus,
                duration_s,
                t0 + at,
                false,
                LeaseKind::OnDemand,
            );
            world.preemptor = Some(preemptor);
            world.at(at, Ev::Preempt);
        }
        // The host ends some leases itself: a stop that ends its leases, a GPU that fails.
        if world.rng.chance(15) {
            let at = world.rng.range(0, span);
            let ev = if world.rng.chance(50) {
                Ev::HostEnds
            } else {
                Ev::GpuFault
            };
            world.at(at, ev);
        }
        world
    }

    fn container_template(&mut self) -> &mut Container {
        self.container.get_or_insert_with(Container::default)
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn delay(&mut self) -> u64 {
        self.rng.range(1, self.faults.delay_max)
    }

    fn dropped(&mut self) -> bool {
        let p = self.faults.drop_pct;
        self.rng.chance(p)
    }

    fn ledger_down(&self, t: u64) -> bool {
        self.faults
            .outages
            .iter()
            .any(|&(a, b)| (a..b).contains(&(t - 1_000_000)))
    }

    fn host_effects(&mut self, effects: Vec<HostEffect>) {
        let epoch = self.host_epoch;
        for effect in effects {
            match effect {
                HostEffect::Persist => {
                    self.host_saved = self.host.as_ref().map(|h| h.record().clone());
                }
                HostEffect::Ledger { call, envelope } => {
                    let d = self.delay();
                    let sent = self.now;
                    self.at(
                        d,
                        Ev::LedgerAt {
                            from: Party::Host,
                            epoch,
                            call,
                            envelope,
                            sent,
                        },
                    );
                }
                HostEffect::AnswerLock { envelope, .. } => {
                    if !self.dropped() {
                        let d = self.delay();
                        let outcome = lock_outcome(&envelope);
                        let epoch = self.renter_epoch;
                        self.at(
                            d,
                            Ev::RenterIn {
                                epoch,
                                input: RenterInput::Lock(outcome),
                            },
                        );
                    }
                }
                HostEffect::StartContainer => {
                    let c = self.container_template();
                    c.removed = false;
                    let d = self.rng.range(50, 800);
                    if self.rng.chance(3) {
                        let why = if self.rng.chance(50) {
                            StartFailure::ImageMissing
                        } else {
                            StartFailure::Failed
                        };
                        self.at(
                            d,
                            Ev::HostIn {
                                epoch,
                                input: HostInput::ContainerNotStarted(why),
                            },
                        );
                    } else {
                        self.at(d, Ev::ContainerUp { epoch });
                    }
                }
                HostEffect::StopContainer { grace_s } => {
                    let running = self
                        .container
                        .as_ref()
                        .is_some_and(|c| c.started_at.is_some() && c.finished_at.is_none());
                    if running {
                        let d = self
                            .rng
                            .range(20, KILL_MAX_MS.min(u64::from(grace_s) * 1000 + KILL_MAX_MS));
                        self.at(d, Ev::ContainerDown { epoch, code: 137 });
                    } else {
                        let (finished, code) = self.container.as_ref().map_or((None, None), |c| {
                            (c.finished_at.map(Timestamp), c.exit_code)
                        });
                        let d = self.rng.range(1, 50);
                        self.at(
                            d,
                            Ev::HostIn {
                                epoch,
                                input: HostInput::ContainerExited {
                                    finished_at: finished,
                                    exit_code: code,
                                },
                            },
                        );
                    }
                }
                HostEffect::EraseContainer => {
                    if let Some(c) = self.container.as_mut() {
                        if c.finished_at.is_none() && c.started_at.is_some() {
                            c.finished_at = Some(self.now);
                        }
                        c.removed = true;
                    }
                    let d = self.rng.range(10, 200);
                    self.at(
                        d,
                        Ev::HostIn {
                            epoch,
                            input: HostInput::ContainerErased,
                        },
                    );
                }
                HostEffect::SendReceipt { seq, envelope } => {
                    // A receipt the host cannot keep is not sent, and ends the lease.
                    if self.store_broken == Some(Party::Host) {
                        self.at(
                            0,
                            Ev::HostIn {
                                epoch,
                                input: HostInput::StoreFailed,
                            },
                        );
                        continue;
                    }
                    if self.dropped() {
                        self.at(
                            PEER_TIMEOUT_MS,
                            Ev::HostIn {
                                epoch,
                                input: HostInput::ReceiptAnswer {
                                    seq,
                                    answer: RenterAnswer::Nothing,
                                },
                            },
                        );
                        continue;
                    }
                    let d = self.delay();
                    let answer_by = self.now + PEER_TIMEOUT_MS;
                    self.at(
                        d,
                        Ev::ReceiptAtRenter {
                            epoch,
                            seq,
                            envelope: envelope.clone(),
                            answer_by,
                        },
                    );
                    if self.rng.chance(self.faults.dup_pct) {
                        let d = self.delay();
                        self.at(
                            d,
                            Ev::ReceiptAtRenter {
                                epoch: u64::MAX,
                                seq,
                                envelope,
                                answer_by,
                            },
                        );
                    }
                }
                HostEffect::SendEnd { envelope } | HostEffect::Notify { envelope, .. } => {
                    self.one_way(Party::Renter, envelope)
                }
                HostEffect::Schedule { at, timer } => {
                    let d = at.0.saturating_sub(self.now);
                    self.at(
                        d,
                        Ev::HostIn {
                            epoch,
                            input: HostInput::Timer(timer),
                        },
                    );
                }
                // The one lease here preempts nobody; its own preemption comes as an event.
                // A workspace made for the commit is erased with the container.
                HostEffect::FreeGpus
                | HostEffect::PreemptSpot { .. }
                | HostEffect::PrepareWorkspace => {}
            }
        }
    }

    fn one_way(&mut self, to: Party, envelope: Vec<u8>) {
        if !self.dropped() {
            let d = self.delay();
            self.at(
                d,
                Ev::EndAt {
                    to,
                    envelope: envelope.clone(),
                },
            );
        }
        if self.rng.chance(self.faults.dup_pct) {
            let d = self.delay();
            self.at(d, Ev::EndAt { to, envelope });
        }
    }

    fn renter_effects(&mut self, effects: Vec<RenterEffect>) {
        let epoch = self.renter_epoch;
        for effect in effects {
            match effect {
                RenterEffect::Persist => {
                    self.renter_saved = self.renter.as_ref().map(|r| r.record().clone());
                }
                RenterEffect::SendLock { envelope } => {
                    self.lock_answered = false;
                    self.at(LOCK_TIMEOUT_MS, Ev::LockTimeout { epoch });
                    if !self.dropped() {
                        let d = self.delay();
                        self.at(
                            d,
                            Ev::LockAtHost {
                                renter_epoch: epoch,
                                envelope,
                            },
                        );
                    }
                }
                RenterEffect::Respond { .. } => {
                    // Answers are taken by the caller of the receipt handler.
                }
                RenterEffect::SendEnd { envelope } | RenterEffect::SendCommit { envelope } => {
                    self.one_way(Party::Host, envelope)
                }
                RenterEffect::Ledger { call, envelope } => {
                    let d = self.delay();
                    let sent = self.now;
                    self.at(
                        d,
                        Ev::LedgerAt {
                            from: Party::Renter,
                            epoch,
                            call,
                            envelope,
                            sent,
                        },
                    );
                }
                RenterEffect::Schedule { at, timer } => {
                    let d = at.0.saturating_sub(self.now);
                    self.at(
                        d,
                        Ev::RenterIn {
                            epoch,
                            input: RenterInput::Timer(timer),
                        },
                    );
                }
                RenterEffect::Report(report) => {
                    self.trace
                        .push(format!("{} rent report {report:?}", self.now));
                    if report == RentReport::Held
                        && let Some(after) = self.commit_after
                    {
                        self.at(after, Ev::RenterCommit { epoch });
                    }
                    self.report.get_or_insert(report);
                }
            }
        }
    }

    fn host_in(&mut self, input: HostInput) {
        let now = Timestamp(self.now);
        if let Some(host) = self.host.as_mut() {
            let before = host.phase();
            let label = format!("{input:?}").chars().take(60).collect::<String>();
            let effects = host.handle(now, input);
            if host.phase() != before {
                let line = format!(
                    "{} host {before:?} -> {:?} on {label}",
                    self.now,
                    host.phase()
                );
                self.trace.push(line);
            }
            self.host_effects(effects);
        }
    }

    fn renter_in(&mut self, input: RenterInput) -> Vec<RenterEffect> {
        let now = Timestamp(self.now);
        match self.renter.as_mut() {
            Some(renter) => renter.handle(now, input),
            None => Vec::new(),
        }
    }

    fn container_state(&self) -> ContainerState {
        match &self.container {
            Some(c) if !c.removed => match (c.started_at, c.finished_at) {
                (Some(s), None) => ContainerState::Running {
                    started_at: Timestamp(s),
                },
                (Some(s), Some(f)) => ContainerState::Exited {
                    started_at: Some(Timestamp(s)),
                    finished_at: Some(Timestamp(f)),
                    exit_code: c.exit_code,
                },
                _ => ContainerState::Absent,
            },
            _ => ContainerState::Absent,
        }
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::HostIn { epoch, input } => {
                if epoch == self.host_epoch {
                    if matches!(input, HostInput::StoreFailed)
                        && self.host.as_ref().is_some_and(|h| h.record().end.is_none())
                    {
                        self.store_failed.push(Party::Host);
                    }
                    self.host_in(input);
                }
            }
            Ev::RenterIn { epoch, input } => {
                if epoch != self.renter_epoch {
                    return;
                }
                if matches!(input, RenterInput::StoreFailed)
                    && self.renter.as_ref().is_some_and(|r| {
                        !matches!(r.phase(), RenterPhase::Ended | RenterPhase::Settled)
                    })
                {
                    self.store_failed.push(Party::Renter);
                }
                if matches!(input, RenterInput::Lock(_)) {
                    if self.lock_answered {
                        return;
                    }
                    self.lock_answered = true;
                }
                let effects = self.renter_in(input);
                self.renter_effects(effects);
            }
            Ev::LockTimeout { epoch } => {
                if epoch == self.renter_epoch && !self.lock_answered {
                    self.lock_answered = true;
                    let effects = self.renter_in(RenterInput::Lock(LockOutcome::Unanswered));
                    self.renter_effects(effects);
                }
            }
            Ev::ReceiptAtRenter {
                epoch,
                seq,
                envelope,
                answer_by,
            } => {
                let Ok(AnyVerified::UsageReceipt(receipt)) =
                    AnySigned::from_bytes(envelope).and_then(AnySigned::verify)
                else {
                    return;
                };
                let effects = self.renter_in(RenterInput::Receipt(receipt));
                let mut answer = None;
                for e in &effects {
                    if let RenterEffect::Respond { envelope } = e {
                        answer = Some(envelope.clone());
                    }
                }
                self.renter_effects(effects);
                let mut answer =
                    answer.map_or(RenterAnswer::Nothing, |bytes| renter_answer(&bytes));
                if let RenterAnswer::Ack(ack) = &answer {
                    self.max_acked = self.max_acked.max(ack.amount_due.0);
                    // Its record holds the acknowledgement; a receipt it cannot keep is not
                    // answered, and ends the lease.
                    if self.store_broken == Some(Party::Renter) && epoch != u64::MAX {
                        answer = RenterAnswer::Nothing;
                        let renter_epoch = self.renter_epoch;
                        self.at(
                            0,
                            Ev::RenterIn {
                                epoch: renter_epoch,
                                input: RenterInput::StoreFailed,
                            },
                        );
                    }
                }
                self.trace.push(format!(
                    "{} receipt {seq} at the renter: {}",
                    self.now,
                    match &answer {
                        RenterAnswer::Ack(a) => format!("acked {}", a.amount_due.0),
                        RenterAnswer::Dispute(_) => "disputed".into(),
                        RenterAnswer::Nothing => "no answer".into(),
                    }
                ));
                if epoch == u64::MAX {
                    return; // a duplicate: its answer goes nowhere
                }
                let back = self.delay();
                if self.dropped() || self.now + back > answer_by {
                    let d = answer_by.saturating_sub(self.now);
                    self.at(
                        d,
                        Ev::HostIn {
                            epoch,
                            input: HostInput::ReceiptAnswer {
                                seq,
                                answer: RenterAnswer::Nothing,
                            },
                        },
                    );
                } else {
                    self.at(
                        back,
                        Ev::HostIn {
                            epoch,
                            input: HostInput::ReceiptAnswer { seq, answer },
                        },
                    );
                }
            }
            Ev::LockAtHost {
                renter_epoch,
                envelope,
            } => {
                if renter_epoch != self.renter_epoch {
                    // The renter that sent it is gone; the host may still run it.
                }
                if let Ok(AnyVerified::EscrowLock(lock)) =
                    AnySigned::from_bytes(envelope).and_then(AnySigned::verify)
                {
                    self.host_in(HostInput::Lock(lock));
                }
            }
            Ev::EndAt { to, envelope } => {
                let end = match AnySigned::from_bytes(envelope).and_then(AnySigned::verify) {
                    Ok(AnyVerified::LeaseEnd(end)) => end,
                    Ok(AnyVerified::PreemptionNotice(notice)) => {
                        let effects = self.renter_in(RenterInput::Notice(notice));
                        self.renter_effects(effects);
                        return;
                    }
                    Ok(AnyVerified::LeaseCommit(commit)) => {
                        return self.host_in(HostInput::Commit(commit));
                    }
                    _ => return,
                };
                match to {
                    Party::Host => self.host_in(HostInput::RenterEnd(end)),
                    Party::Renter => {
                        let effects = self.renter_in(RenterInput::HostEnd(end));
                        self.renter_effects(effects);
                    }
                }
            }
            Ev::LedgerAt {
                from,
                epoch,
                call,
                envelope,
                sent,
            } => {
                let down = self.ledger_down(self.now);
                let verdict_at;
                let verdict = if down {
                    verdict_at = sent
                        + if self.rng.chance(50) {
                            LEDGER_TIMEOUT_MS
                        } else {
                            self.rng.range(1, 300)
                        };
                    LedgerVerdict::Unreachable
                } else {
                    let out = self.ledger.submit(Timestamp(self.now), envelope);
                    if let LedgerResponse::Record(bytes) = &out.response
                        && let Ok(r) =
                            Signed::<gpux_protocol::LedgerRecord>::from_bytes(bytes.clone())
                                .and_then(Signed::verify)
                        && matches!(r.entry, gpux_protocol::LedgerEntry::Released { .. })
                    {
                        self.released_records += 1;
                    }
                    let back = self.delay();
                    if self.dropped() {
                        // Applied, but the answer is lost.
                        verdict_at = sent + LEDGER_TIMEOUT_MS;
                        LedgerVerdict::Unreachable
                    } else {
                        verdict_at = self.now + back;
                        LedgerVerdict::from_response(out.response, &[self.ledger_key])
                    }
                };
                let d = verdict_at.saturating_sub(self.now);
                match from {
                    Party::Host => self.at(
                        d,
                        Ev::HostIn {
                            epoch,
                            input: HostInput::Ledger { call, verdict },
                        },
                    ),
                    Party::Renter => self.at(
                        d,
                        Ev::RenterIn {
                            epoch,
                            input: RenterInput::Ledger { call, verdict },
                        },
                    ),
                }
            }
            Ev::ContainerUp { epoch } => {
                let now = self.now;
                let c = self.container_template();
                c.started_at = Some(now);
                c.finished_at = None;
                let after = c.self_exit_after;
                if let Some(after) = after {
                    self.at(after, Ev::SelfExit);
                }
                if epoch == self.host_epoch && self.host.is_some() {
                    self.host_in(HostInput::ContainerStarted {
                        started_at: Timestamp(now),
                    });
                    let d = self.rng.range(500, self.faults.sample_max);
                    self.at(d, Ev::Sample { epoch });
                } else {
                    // Started for a host process that is gone: its successor's sweep erases
                    // containers of no running lease.
                    let c = self.container_template();
                    c.finished_at = Some(now);
                    c.removed = true;
                }
            }
            Ev::ContainerDown { epoch, code } => {
                let now = self.now;
                let mut finished = None;
                if let Some(c) = self.container.as_mut() {
                    if c.finished_at.is_none() && c.started_at.is_some() {
                        c.finished_at = Some(now);
                        c.exit_code = Some(code);
                    }
                    finished = c.finished_at;
                }
                if epoch == self.host_epoch {
                    self.host_in(HostInput::ContainerExited {
                        finished_at: finished.map(Timestamp),
                        exit_code: Some(code),
                    });
                }
            }
            Ev::SelfExit => {
                let now = self.now;
                if let Some(c) = self.container.as_mut()
                    && c.started_at.is_some()
                    && c.finished_at.is_none()
                {
                    c.finished_at = Some(now);
                    c.exit_code = Some(0);
                    // The shell notices within a second.
                    let d = self.rng.range(1, 1000);
                    let epoch = self.host_epoch;
                    self.at(d, Ev::ContainerDown { epoch, code: 0 });
                }
            }
            Ev::Sample { epoch } => {
                if epoch != self.host_epoch || self.host.is_none() {
                    return;
                }
                let running = self
                    .container
                    .as_ref()
                    .is_some_and(|c| c.finished_at.is_none());
                if running {
                    let sample = UsageSample {
                        memory_bytes: self.rng.range(1, 1 << 20),
                        cpu_total_ns: self.now * 1000,
                        gpu_util_permille: Some(self.rng.range(0, 1000) as u16),
                        gpu_memory_bytes: Some(1 << 20),
                    };
                    self.host_in(HostInput::Sample(sample));
                    let d = self.rng.range(500, self.faults.sample_max);
                    self.at(d, Ev::Sample { epoch });
                }
            }
            Ev::Kill(party) => {
                self.trace.push(format!("{} kill {party:?}", self.now));
                let down_for = self.rng.range(500, 20_000);
                match party {
                    Party::Host => {
                        if self.host.take().is_some() {
                            self.host_epoch += 1;
                            self.host_down_since = Some(self.now);
                            self.at(down_for, Ev::Restart(Party::Host));
                        }
                    }
                    Party::Renter => {
                        if self.renter.take().is_some() {
                            self.renter_epoch += 1;
                            self.at(down_for, Ev::Restart(Party::Renter));
                        }
                    }
                }
            }
            Ev::Restart(party) => {
                self.trace.push(format!("{} restart {party:?}", self.now));
                let now = Timestamp(self.now);
                match party {
                    Party::Host => {
                        if let Some(since) = self.host_down_since.take() {
                            self.host_down_ms += self.now - since;
                            self.host_restarts += 1;
                        }
                        let Some(rec) = self.host_saved.clone() else {
                            return;
                        };
                        let container = self.container_state();
                        let (host, effects) =
                            HostLease::restore(self.host_key.clone(), rec, container, now).unwrap();
                        self.host = Some(host);
                        self.host_effects(effects);
                        if matches!(container, ContainerState::Running { .. }) {
                            let epoch = self.host_epoch;
                            self.at(1000, Ev::Sample { epoch });
                        }
                    }
                    Party::Renter => {
                        let Some(rec) = self.renter_saved.clone() else {
                            return;
                        };
                        let (renter, effects) =
                            RenterLease::restore(self.renter_key.clone(), rec, now).unwrap();
                        self.renter = Some(renter);
                        self.renter_effects(effects);
                    }
                }
            }
            Ev::Preempt => {
                if let Some(preemptor) = self.preemptor.clone() {
                    self.trace.push(format!("{} preempted", self.now));
                    self.host_in(HostInput::Preempt(Box::new(preemptor)));
                }
            }
            Ev::RenterCommit { epoch } => {
                let now = Timestamp(self.now);
                if epoch == self.renter_epoch
                    && let Some(renter) = self.renter.as_mut()
                    && let Ok(effects) = renter.commit(now)
                {
                    self.trace.push(format!("{} renter commits", self.now));
                    self.renter_effects(effects);
                }
            }
            Ev::StoreBreaks(party) => {
                self.trace
                    .push(format!("{} {party:?}'s receipt store breaks", self.now));
                self.store_broken = Some(party);
            }
            Ev::HostEnds => {
                self.trace
                    .push(format!("{} the host ends the lease", self.now));
                self.host_in(HostInput::Shutdown);
            }
            Ev::GpuFault => {
                // Seen up to a second after it happened.
                let at = Timestamp(self.now.saturating_sub(self.rng.range(0, 1_000)));
                self.trace
                    .push(format!("{} a GPU failed at {}", self.now, at.0));
                self.host_in(HostInput::GpuFailed { at });
            }
            Ev::RenterStop => {
                let now = Timestamp(self.now);
                if let Some(renter) = self.renter.as_mut()
                    && let Ok(effects) = renter.stop(now)
                {
                    self.trace.push(format!("{} renter stops", self.now));
                    self.renter_effects(effects);
                }
            }
        }
    }

    fn done(&self) -> bool {
        let host_done = self
            .host
            .as_ref()
            .is_some_and(|h| h.phase() == HostPhase::Settled);
        let renter_done = self
            .renter
            .as_ref()
            .is_some_and(|r| r.phase() == RenterPhase::Settled);
        host_done && renter_done
    }

    /// Runs the schedule to its end; returns the violations found.
    fn run(mut self) -> Result<Summary, (String, Vec<String>)> {
        while let Some(((t, _), ev)) = self.queue.pop_first() {
            if t > 1_000_000 + HORIZON_MS {
                break;
            }
            self.now = t;
            self.step(ev);
            if self.done() && self.settled_quietly() {
                break;
            }
        }
        match check(&self) {
            Ok(summary) => Ok(summary),
            Err(why) => Err((why, self.trace)),
        }
    }

    /// Nothing but stale timers and answers remains.
    fn settled_quietly(&self) -> bool {
        self.queue.values().all(|ev| {
            matches!(
                ev,
                Ev::HostIn { .. }
                    | Ev::RenterIn { .. }
                    | Ev::LockTimeout { .. }
                    | Ev::Sample { .. }
                    | Ev::EndAt { .. }
                    | Ev::ReceiptAtRenter { .. }
                    | Ev::Kill(_)
                    | Ev::RenterStop
                    | Ev::Preempt
                    | Ev::StoreBreaks(_)
            )
        })
    }
}

fn lock_outcome(envelope: &[u8]) -> LockOutcome {
    match AnySigned::from_bytes(envelope.to_vec()).and_then(AnySigned::verify) {
        Ok(AnyVerified::LedgerRecord(r)) => LockOutcome::Record(Box::new(r)),
        Ok(AnyVerified::LeaseReject(r)) => LockOutcome::Rejected(Box::new(r)),
        _ => LockOutcome::Unanswered,
    }
}

fn renter_answer(envelope: &[u8]) -> RenterAnswer {
    match AnySigned::from_bytes(envelope.to_vec()).and_then(AnySigned::verify) {
        Ok(AnyVerified::ReceiptAck(a)) => RenterAnswer::Ack(a),
        Ok(AnyVerified::LeaseEnd(e)) => RenterAnswer::Dispute(e),
        _ => RenterAnswer::Nothing,
    }
}

/// What one schedule came to.
#[derive(Debug, Default, Clone, Copy)]
struct Summary {
    receipts: u64,
    ran: bool,
    outage_over_grace: bool,
    /// A window cancelled before its start paid a fee.
    cancel_fee: bool,
    /// A side's store failure ended the lease.
    store_failed: bool,
    /// The host ended a lease that ran, and was paid for it.
    host_ended: bool,
}

/// The rules every schedule must keep.
fn check(w: &World) -> Result<Summary, String> {
    let ledger = w.ledger.ledger();
    if ledger.total() != u128::from(ledger.minted().0) || ledger.minted().0 != w.minted {
        return Err(format!(
            "credits not conserved: total {} minted {}",
            ledger.total(),
            ledger.minted().0
        ));
    }
    let host_paid = ledger.balance(&w.host_key.public()).0;
    let gpus = w.request.gpus.len() as u64;
    let (runtime_ms, ran) = match &w.container {
        Some(Container {
            started_at: Some(s),
            finished_at: Some(f),
            ..
        }) => (f - s, true),
        Some(Container {
            started_at: Some(_),
            finished_at: None,
            ..
        }) => {
            return Err("the container was never stopped".into());
        }
        _ => (0, false),
    };
    if w.container
        .as_ref()
        .is_some_and(|c| c.started_at.is_some() && !c.removed)
    {
        return Err("the container was never erased".into());
    }
    // The host is never paid for time beyond what ran (plus the minimum) at the agreed price,
    // and the kept workspace's fixed sum.
    let retention = gpux_lease::bill::retention(&w.request).0;
    // A reserved window its renter stopped early pays its committed minimum (and only then:
    // a window the host ends early pays its runtime).
    let renter_stopped = w
        .renter
        .as_ref()
        .is_some_and(|r| r.record().stop_requested_at.is_some());
    let committed = if renter_stopped {
        gpux_lease::bill::committed_gpu_seconds(&w.request)
    } else {
        0
    };
    // A window that never ran is paid for only when its renter cancelled it before its
    // start, and then at most its fee schedule's share of the committed minimum for the
    // time the stop was due at the host (with the grace), or just before the start.
    let cancelled_by = match (w.renter.as_ref(), w.request.kind) {
        (Some(r), LeaseKind::Reserved { start, .. }) => r
            .record()
            .stop_requested_at
            .filter(|stop| *stop < start)
            .map(|stop| {
                stop.plus_ms(w.timing.ack_grace_ms)
                    .min(Timestamp(start.0 - 1))
            }),
        _ => None,
    };
    // Who ended it pays for the end: a lease the host ended (its stop, a failed GPU or
    // container, a store it could not keep) pays the seconds that ran until it did, no
    // minimum (for a failed GPU, nothing after the fault).
    let host_end = w
        .host
        .as_ref()
        .and_then(|h| h.record().end.zip(h.record().ended_at));
    let host_ended = host_end.is_some_and(|(end, _)| !end.owes_minimum());
    if ran && host_ended {
        // Billed up to the moment the host ended it (a failed GPU: the fault).
        let mut billed_ms = runtime_ms;
        if let (Some((_, ended)), Some(started)) =
            (host_end, w.container.as_ref().and_then(|c| c.started_at))
        {
            billed_ms = billed_ms.min(ended.0.saturating_sub(started));
        }
        let most =
            gpux_lease::bill::run_gpu_seconds(&w.request, billed_ms) * PER_GPU_SECOND + retention;
        if host_paid > most {
            return Err(format!(
                "the host ended the lease ({host_end:?}) and was paid {host_paid} for {billed_ms} ms of work; at most {most}"
            ));
        }
    }
    let most = if ran {
        gpux_lease::bill::request_gpu_seconds(&w.request, runtime_ms).max(committed)
            * PER_GPU_SECOND
            + retention
    } else if let Some(late) = cancelled_by {
        gpux_lease::bill::cancel_gpu_seconds(&w.request, late) * PER_GPU_SECOND + retention
    } else {
        0
    };
    if host_paid > most {
        return Err(format!(
            "host paid {host_paid} for {runtime_ms} ms of work; at most {most}"
        ));
    }
    // A reserved window's work runs within the window (a kill takes a moment).
    if let (LeaseKind::Reserved { start, end }, Some(c)) = (w.request.kind, &w.container)
        && let Some(started) = c.started_at
    {
        let finished = c.finished_at.unwrap_or(u64::MAX);
        let late = end.0 + KILL_MAX_MS + w.host_down_ms + gpux_lease::EXIT_NOTICE_MS;
        if started < start.0 || finished > late {
            return Err(format!(
                "a window [{}, {}) ran from {started} to {finished}",
                start.0, end.0
            ));
        }
    }
    // A preempted lease pays nothing past its notice's end, and no minimum.
    let preempted = w
        .host
        .as_ref()
        .and_then(|h| h.preemption().map(|p| p.ends_at.0));
    if let (Some(ends_at), Some(started)) =
        (preempted, w.container.as_ref().and_then(|c| c.started_at))
    {
        let until_s = ends_at.saturating_sub(started) / 1000;
        let cap = gpus * until_s.min(u64::from(w.request.duration_s)) * PER_GPU_SECOND + retention;
        if host_paid > cap {
            return Err(format!(
                "a lease preempted at {ends_at} paid {host_paid}; at most {cap}"
            ));
        }
    }
    // A lease that waits for its commit runs only once committed, on both sides, and one
    // never committed costs nothing.
    let host_rec = w.host.as_ref().map(|h| h.record());
    if w.request.commit_wait_ms().unwrap().is_some() {
        let started = w.container.as_ref().and_then(|c| c.started_at);
        let host_commit = host_rec.and_then(|r| r.committed_at);
        let renter_commit = w.renter.as_ref().and_then(|r| r.record().committed_at);
        match (started, host_commit, renter_commit) {
            (Some(s), Some(h), Some(r)) if s >= h.0 && h.0 >= r.0 => {}
            (Some(s), h, r) => {
                return Err(format!(
                    "work started at {s}; committed at the host {h:?}, by the renter {r:?}"
                ));
            }
            (None, ..) => {}
        }
        if renter_commit.is_none() && host_paid > 0 {
            return Err(format!("a lease never committed paid {host_paid}"));
        }
    }
    // A paid lease pays its kept workspace in full: every receipt carries the sum.
    if host_paid > 0 && host_paid < retention {
        return Err(format!(
            "host paid {host_paid}, less than the workspace's retention {retention}"
        ));
    }
    // A store failure a side was told of while its lease ran ends it so, and the host's
    // end reaches the renter's record unless the renter had ended it first.
    for party in &w.store_failed {
        let end = match party {
            Party::Host => w.host.as_ref().and_then(|h| h.record().end),
            Party::Renter => w.renter.as_ref().and_then(|r| r.record().end),
        };
        if end != Some(gpux_lease::End::StoreFailed) {
            return Err(format!(
                "{party:?} told its store failed, but its lease ended {end:?}"
            ));
        }
    }
    // The renter is never charged for what it did not acknowledge.
    if host_paid > w.max_acked {
        return Err(format!(
            "host paid {host_paid}; the renter acknowledged at most {}",
            w.max_acked
        ));
    }
    // A rent reported as failed is never paid.
    if matches!(w.report, Some(RentReport::Failed { .. })) && host_paid > 0 {
        return Err(format!("a rent reported as failed was billed {host_paid}"));
    }
    // The one loss bound, for the time the host's node was up: one interval plus the grace
    // (and the moment a kill takes, and the second periodic receipts lag so as never to
    // bill past an exit not yet noticed). A host restart adds its downtime (the work ran on
    // unmetered) and one grace (the renter's chance to acknowledge the receipt sent at the
    // restart).
    if ran {
        let paid_s = host_paid.saturating_sub(retention) / PER_GPU_SECOND / gpus;
        let ran_s = (runtime_ms / 1000).min(u64::from(w.request.duration_s));
        let allowance_ms = w.timing.loss_bound_ms()
            + gpux_lease::EXIT_NOTICE_MS
            + KILL_MAX_MS
            + w.host_down_ms
            + w.host_restarts * w.timing.ack_grace_ms;
        let allowance_s = allowance_ms.div_ceil(1000);
        if ran_s > paid_s + allowance_s {
            return Err(format!(
                "host unpaid for {} s of {ran_s} s run; the bound is {allowance_s} s",
                ran_s - paid_s
            ));
        }
    }
    // Every lease ends and settles, once.
    let host = w.host.as_ref().ok_or("the host never came back")?;
    let renter = w.renter.as_ref().ok_or("the renter never came back")?;
    if host.phase() != HostPhase::Settled || renter.phase() != RenterPhase::Settled {
        return Err(format!(
            "not settled: host {:?}, renter {:?}",
            host.phase(),
            renter.phase()
        ));
    }
    if let Some(escrow) = ledger.escrow(&w.request.escrow)
        && !escrow.released
    {
        return Err("the escrow was never released".into());
    }
    // The host's record of what it was paid (its redemptions, the voucher its release
    // carried, one already redeemed when an answer was lost) never says more than the
    // ledger paid it.
    let recorded = host.record().redeemed.0;
    if recorded > host_paid {
        return Err(format!(
            "the host records {recorded} µcr paid, the ledger paid it {host_paid}"
        ));
    }
    if w.released_records > 1 {
        return Err(format!(
            "the escrow was released {} times",
            w.released_records
        ));
    }
    // Both sides name the same end, when the host's word reached the renter first.
    if let (Some(host_end), Some(said)) = (host.record().end, renter.record().host_end)
        && host_end.wire() != said.wire()
    {
        return Err(format!("host ended {host_end:?}, told the renter {said:?}"));
    }
    let grace = w.ledger.ledger().config().release_grace_ms;
    Ok(Summary {
        receipts: host.record().last_seq,
        ran,
        outage_over_grace: w.faults.outages.iter().any(|&(a, b)| b - a > grace),
        cancel_fee: !ran && host_paid > 0,
        store_failed: !w.store_failed.is_empty(),
        host_ended: ran && host_ended && host_paid > 0,
    })
}

fn schedules() -> u64 {
    std::env::var("GPUX_SIM_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Runs schedules `seeds` on two threads; returns the failures (seed, why, trace).
/// A failed schedule: its seed, the rule it broke, its trace.
type Failure = (u64, String, Vec<String>);

fn run_all(seeds: Vec<u64>) -> (Vec<Failure>, Vec<Summary>) {
    let threads = 2;
    let chunks: Vec<Vec<u64>> = (0..threads)
        .map(|i| seeds.iter().copied().skip(i).step_by(threads).collect())
        .collect();
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                let mut summaries = Vec::new();
                for seed in chunk {
                    match World::new(seed).run() {
                        Ok(s) => summaries.push(s),
                        Err((why, trace)) => failures.push((seed, why, trace)),
                    }
                }
                (failures, summaries)
            })
        })
        .collect();
    let mut failures = Vec::new();
    let mut summaries = Vec::new();
    for h in handles {
        let (f, s) = h.join().unwrap();
        failures.extend(f);
        summaries.extend(s);
    }
    failures.sort_by_key(|f| f.0);
    (failures, summaries)
}

#[cfg(not(feature = "broken-rule"))]
#[test]
fn every_schedule_keeps_the_rules_of_a_lease() {
    let seeds: Vec<u64> = match std::env::var("GPUX_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => (0..schedules()).collect(),
    };
    let n = seeds.len();
    // The duration is printed, never asserted.
    #[allow(clippy::disallowed_methods)]
    let started = std::time::Instant::now();
    let (failures, summaries) = run_all(seeds);
    #[allow(clippy::disallowed_methods)]
    let took = started.elapsed();
    let receipts: u64 = summaries.iter().map(|s| s.receipts).sum();
    let ran = summaries.iter().filter(|s| s.ran).count();
    let long_outages = summaries.iter().filter(|s| s.outage_over_grace).count();
    let fees = summaries.iter().filter(|s| s.cancel_fee).count();
    let store_failed = summaries.iter().filter(|s| s.store_failed).count();
    let host_ended = summaries.iter().filter(|s| s.host_ended).count();
    println!(
        "lease simulator: {n} schedules in {:.1} s ({receipts} receipts; {ran} ran a container; {long_outages} with a ledger outage longer than the release grace; {fees} windows cancelled for a fee; {store_failed} ended by a store failure; {host_ended} paid leases the host ended); {} failed",
        took.as_secs_f64(),
        failures.len()
    );
    if let Some((seed, why, trace)) = failures.first() {
        for line in trace {
            println!("  {line}");
        }
        panic!(
            "schedule {seed} broke a rule: {why} ({} schedules failed; rerun with GPUX_SIM_SEED={seed})",
            failures.len()
        );
    }
    assert!(
        n < 100 || long_outages > 0,
        "no schedule had a long ledger outage"
    );
    assert!(
        n < 1000 || store_failed > 0,
        "no schedule ended by a store failure"
    );
    assert!(
        n < 1000 || fees > 0,
        "no schedule cancelled a window for a fee"
    );
    assert!(
        n < 1000 || host_ended > 0,
        "no paid lease was ended by its host"
    );
}

/// With the `broken-rule` feature the host bills a second more than ran; the simulator must
/// catch it.
#[cfg(feature = "broken-rule")]
#[test]
fn the_simulator_catches_a_host_that_bills_a_second_too_many() {
    let (failures, _) = run_all((0..2000).collect());
    assert!(
        failures
            .iter()
            .any(|(_, why, _)| why.starts_with("host paid")),
        "the broken billing rule went unnoticed in 2000 schedules"
    );
    println!(
        "the broken rule was caught in {} of 2000 schedules",
        failures.len()
    );
}
