//! The resume simulator: a chain of spot leases preempted again and again, each hop driven
//! by [`ResumeHop`] through random copies that fail, rents that find nothing, held leases
//! that expire, commits that fail, and stops of the renter's node at any moment (its hop
//! restarted from its record, as the node does). Checked after every step: a chain never
//! runs two leases at once; a hop that resumed left its lease running; one that gave up
//! left no lease of its own held.

use std::collections::BTreeMap;

use gpux_lease::{
    NextLease, ResumeHop, ResumeInput, ResumeNext, ResumeOutcome, ResumePlan, ResumeSide,
    ResumeStep,
};
use gpux_protocol::Timestamp;

use crate::sim::Rng;

type Lease = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Held,
    Running,
    Ended,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Watching,
    Resuming,
    Resumed,
    Failed,
}

/// The node's resume record of a lease.
#[derive(Debug, Clone, Copy)]
struct Record {
    status: Status,
    resumed_by: Option<Lease>,
}

#[derive(Debug, Default)]
struct Counts {
    hops: usize,
    resumed: usize,
    failed: usize,
    restarts: usize,
    /// Restarted hops that found their lease running (the commit went through before the
    /// stop).
    found_running: usize,
}

struct World {
    rng: Rng,
    now: Timestamp,
    plan: ResumePlan,
    leases: BTreeMap<Lease, State>,
    records: BTreeMap<Lease, Record>,
    found_running: usize,
    trace: Vec<String>,
}

impl World {
    fn check(&self) -> Result<(), String> {
        let running: Vec<_> = self
            .leases
            .iter()
            .filter(|(_, s)| **s == State::Running)
            .map(|(l, _)| *l)
            .collect();
        if running.len() > 1 {
            return Err(format!("two leases of the chain run at once: {running:?}"));
        }
        Ok(())
    }

    fn new_lease(&mut self, state: State) -> Lease {
        let lease = self.leases.len() as Lease;
        self.leases.insert(lease, state);
        lease
    }

    /// The hop from `previous`, started fresh or from its record after a restart.
    fn start(&mut self, previous: Lease) -> (ResumeHop<Lease>, ResumeStep<Lease>) {
        let rented = self.records[&previous].resumed_by;
        ResumeHop::new(self.now, self.plan, rented)
    }

    fn side(&mut self, previous: Lease, side: ResumeSide<Lease>) -> Result<(), String> {
        match side {
            ResumeSide::Record(next) => {
                self.records.insert(
                    next,
                    Record {
                        status: Status::Watching,
                        resumed_by: None,
                    },
                );
                if let Some(record) = self.records.get_mut(&previous) {
                    record.resumed_by = Some(next);
                }
            }
            ResumeSide::Stop(lease) => match self.leases.get_mut(&lease) {
                Some(state) => {
                    if *state == State::Running {
                        return Err(format!("stopped lease {lease}, which runs"));
                    }
                    *state = State::Ended;
                }
                None => return Err(format!("stopped lease {lease}, which was never rented")),
            },
        }
        Ok(())
    }

    /// The shell's answer to what the hop waits for.
    fn answer(&mut self, next: &ResumeNext<Lease>) -> ResumeInput<Lease> {
        // A held lease expires now and then (its host ends it unpaid after the hold).
        for state in self.leases.values_mut() {
            if *state == State::Held && self.rng.chance(3) {
                *state = State::Ended;
            }
        }
        let fail = |rng: &mut Rng, p| {
            if rng.chance(p) {
                Err("broke".to_string())
            } else {
                Ok(())
            }
        };
        match next {
            ResumeNext::Look(lease) => ResumeInput::Found(match self.leases.get(lease) {
                Some(State::Held) => NextLease::Held,
                Some(State::Running) => {
                    self.found_running += 1;
                    NextLease::Running
                }
                _ => NextLease::Gone,
            }),
            ResumeNext::Fetch => ResumeInput::Fetched(fail(&mut self.rng, 8)),
            ResumeNext::Rent => ResumeInput::Rented(if self.rng.chance(60) {
                Ok(self.new_lease(State::Held))
            } else {
                Err("no offer".into())
            }),
            ResumeNext::Wait(at) => {
                self.now = *at;
                ResumeInput::Timer
            }
            ResumeNext::Put(lease) => ResumeInput::Put(match self.leases.get(lease) {
                Some(State::Held) => fail(&mut self.rng, 8),
                _ => Err("the lease is gone".into()),
            }),
            ResumeNext::Commit(lease) => ResumeInput::Committed(match self.leases.get_mut(lease) {
                Some(state @ State::Held) if !self.rng.chance(5) => {
                    *state = State::Running;
                    Ok(())
                }
                _ => Err("the commit did not go through".into()),
            }),
            ResumeNext::Done(_) => unreachable!("a finished hop is not asked"),
        }
    }
}

fn run(seed: u64, counts: &mut Counts) -> Result<(), (String, Vec<String>)> {
    let mut rng = Rng::new(seed);
    let plan = ResumePlan {
        timeout_ms: rng.range(1, 60) * 1000,
        retry_ms: 3000,
    };
    let mut world = World {
        rng,
        now: Timestamp(1_000_000),
        plan,
        leases: BTreeMap::new(),
        records: BTreeMap::new(),
        found_running: 0,
        trace: vec![format!("{plan:?}")],
    };
    let first = world.new_lease(State::Running);
    world.records.insert(
        first,
        Record {
            status: Status::Watching,
            resumed_by: None,
        },
    );
    let result = (|| {
        let mut current = first;
        for _hop in 0..6 {
            // The running lease is preempted; its resume starts once (a repeated notice
            // finds it resuming already).
            if world.leases[&current] != State::Running {
                break;
            }
            world.leases.insert(current, State::Ended);
            world.trace.push(format!("lease {current} preempted"));
            let record = world.records.get_mut(&current).ok_or("no record")?;
            if record.status != Status::Watching {
                return Err(format!("lease {current} was preempted twice"));
            }
            record.status = Status::Resuming;
            counts.hops += 1;
            let previous = current;
            let (mut hop, mut step) = world.start(previous);
            let mut steps = 0;
            let outcome = loop {
                steps += 1;
                if steps > 10_000 {
                    return Err("a hop never ended".to_string());
                }
                world.trace.push(format!("{step:?}"));
                for side in std::mem::take(&mut step.side) {
                    world.side(previous, side)?;
                }
                world.check()?;
                if let ResumeNext::Done(outcome) = &step.next {
                    break outcome.clone();
                }
                let input = world.answer(&step.next);
                world.check()?;
                world.trace.push(format!("  <- {input:?}"));
                // The node stops now and then, between the shell's act and the machine
                // hearing of it; it restarts the hops its records show under way.
                if world.rng.chance(4) {
                    counts.restarts += 1;
                    world.trace.push("  node restarted".into());
                    (hop, step) = world.start(previous);
                    continue;
                }
                world.now = world.now.plus_ms(world.rng.range(10, 2000));
                step = hop.handle(world.now, input);
            };
            match outcome {
                ResumeOutcome::Resumed(next) => {
                    counts.resumed += 1;
                    if world.leases.get(&next) != Some(&State::Running) {
                        return Err(format!("resumed as lease {next}, which does not run"));
                    }
                    if world.records[&previous].resumed_by != Some(next) {
                        return Err(format!(
                            "resumed as lease {next}, which its record does not name"
                        ));
                    }
                    world.records.get_mut(&previous).ok_or("no record")?.status = Status::Resumed;
                    current = next;
                }
                ResumeOutcome::Failed(_) => {
                    counts.failed += 1;
                    world.records.get_mut(&previous).ok_or("no record")?.status = Status::Failed;
                    if let Some(next) = world.records[&previous].resumed_by
                        && world.leases.get(&next) == Some(&State::Held)
                    {
                        return Err(format!("gave up, leaving its lease {next} held"));
                    }
                    break;
                }
            }
        }
        Ok(())
    })();
    counts.found_running += world.found_running;
    result.map_err(|why| (why, world.trace))
}

#[cfg(not(feature = "broken-rule"))]
#[test]
fn a_chain_never_runs_two_leases_at_once() {
    let (failures, counts) = crate::schedules::run_all(0..10_000, run);
    crate::schedules::none_failed("resume", 10000, &failures, &counts);
    assert!(
        counts.resumed > 0 && counts.failed > 0 && counts.restarts > 0,
        "{counts:?}"
    );
    assert!(
        counts.found_running > 0,
        "no restart came after a commit: {counts:?}"
    );
}

/// With the `broken-rule` feature a restarted hop forgets the lease it had rented; the
/// simulator must catch it.
#[cfg(feature = "broken-rule")]
#[test]
fn the_simulator_catches_a_restarted_resume_that_rents_a_second_lease() {
    let (failures, _) = crate::schedules::run_all(0..2000, run);
    assert!(
        failures
            .iter()
            .any(|(_, why, _)| why.starts_with("two leases of the chain run")),
        "the forgotten lease went unnoticed in 2000 chains"
    );
    println!(
        "the broken resume rule was caught in {} of 2000 chains",
        failures.len()
    );
}
