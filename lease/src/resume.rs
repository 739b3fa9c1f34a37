//! Resuming a preempted spot lease (`gpux rent --spot --resume`), renter side, as a pure
//! machine: one hop of a chain, from the preempted lease to the next one running. The
//! node's shell copies workspaces, rents and commits, and reports each result back; the
//! machine says what to do next and when to try again.
//!
//! The rule it keeps: **a chain never runs two leases at once.** A hop rents one new
//! lease, held for its commit (its clock and work do not start), and only a commit starts
//! it. A hop whose new lease does not get its workspace or its commit stops that lease, so
//! no held lease of the chain is left behind by a hop that gave up. And a hop that was
//! under way when the node stopped starts again from what its record says: when it had
//! already rented its next lease, it looks at that lease first, and goes on with it (still
//! held: its workspace and commit) or ends the hop (already running: the commit went
//! through before the stop), rather than renting a second one (`lease/tests/resume.rs`).
//!
//! Like the lease machines it never reads a clock: `now` comes with each input, and a
//! wait goes out as [`ResumeNext::Wait`].

use gpux_protocol::Timestamp;

/// How a hop resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePlan {
    /// How long it tries to rent again, ms.
    pub timeout_ms: u64,
    /// Between attempts to rent, ms.
    pub retry_ms: u64,
}

/// Where the next lease rented before a stop of the node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextLease {
    /// Held for its commit.
    Held,
    /// Committed: its work runs (or has run).
    Running,
    /// Ended, or unknown to this node.
    Gone,
}

/// What the shell reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeInput<L> {
    /// How the next lease rented before a stop stands.
    Found(NextLease),
    /// The old workspace is in the chain's mirror, or why not.
    Fetched(Result<(), String>),
    /// The work was rented again, held for its commit, or why not.
    Rented(Result<L, String>),
    /// The wait is over.
    Timer,
    /// The mirror is in the new workspace, or why not.
    Put(Result<(), String>),
    /// The new lease is committed, or why not.
    Committed(Result<(), String>),
}

/// What the shell does, without an answer, before the next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeSide<L> {
    /// Record the hop: the chain's next lease is `L` (before anything else is done with it,
    /// so that a stop of the node finds it).
    Record(L),
    /// Stop the held lease `L` (it ends unpaid).
    Stop(L),
}

/// What the machine waits for next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeNext<L> {
    /// How `L`, rented before a stop, stands ([`ResumeInput::Found`]).
    Look(L),
    /// The old workspace fetched into the mirror ([`ResumeInput::Fetched`]).
    Fetch,
    /// The work rented again, held ([`ResumeInput::Rented`]).
    Rent,
    /// [`ResumeInput::Timer`] at this time.
    Wait(Timestamp),
    /// The mirror put into `L`'s workspace ([`ResumeInput::Put`]).
    Put(L),
    /// `L` committed ([`ResumeInput::Committed`]).
    Commit(L),
    /// The hop is over.
    Done(ResumeOutcome<L>),
}

/// How a hop came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeOutcome<L> {
    /// The chain runs on as `L`.
    Resumed(L),
    /// The chain ends here.
    Failed(String),
}

/// One step: what to do now, then what to wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeStep<L> {
    /// Done first, in order.
    pub side: Vec<ResumeSide<L>>,
    /// Then waited for.
    pub next: ResumeNext<L>,
}

/// One hop of a resumable lease's chain.
#[derive(Debug, Clone)]
pub struct ResumeHop<L> {
    plan: ResumePlan,
    deadline: Timestamp,
    /// The next lease, once rented.
    next_lease: Option<L>,
    waiting: ResumeNext<L>,
}

impl<L: Clone> ResumeHop<L> {
    /// A hop starting at `now`; `rented` is the next lease its record names, when the hop
    /// was under way before a stop of the node.
    pub fn new(now: Timestamp, plan: ResumePlan, rented: Option<L>) -> (Self, ResumeStep<L>) {
        // With the `broken-rule` feature a restarted hop forgets the lease it had rented:
        // the simulator's check must see two leases of a chain run (`lease/tests/resume.rs`).
        #[cfg(feature = "broken-rule")]
        let rented: Option<L> = {
            let _ = rented;
            None
        };
        let next = match &rented {
            Some(lease) => ResumeNext::Look(lease.clone()),
            None => ResumeNext::Fetch,
        };
        let mut hop = Self {
            plan,
            deadline: now.plus_ms(plan.timeout_ms),
            next_lease: rented,
            waiting: ResumeNext::Fetch,
        };
        let step = hop.step(Vec::new(), next);
        (hop, step)
    }

    /// What the machine waits for.
    pub fn waiting(&self) -> &ResumeNext<L> {
        &self.waiting
    }

    /// Handles the input the machine waits for, at `now`. An input it is not waiting for
    /// changes nothing: the step returned is the one it waits on still.
    pub fn handle(&mut self, now: Timestamp, input: ResumeInput<L>) -> ResumeStep<L> {
        let mut side = Vec::new();
        let next = match (self.waiting.clone(), input) {
            (ResumeNext::Look(lease), ResumeInput::Found(found)) => match found {
                // The commit went through before the stop: the chain runs on as it.
                NextLease::Running => ResumeNext::Done(ResumeOutcome::Resumed(lease)),
                // Still held: its workspace goes in, then the commit (the mirror brought up
                // to the old workspace first: the copy is incremental).
                NextLease::Held => ResumeNext::Fetch,
                NextLease::Gone => {
                    self.next_lease = None;
                    ResumeNext::Fetch
                }
            },
            (ResumeNext::Fetch, ResumeInput::Fetched(fetched)) => match fetched {
                Ok(()) => match &self.next_lease {
                    Some(lease) => ResumeNext::Put(lease.clone()),
                    None => ResumeNext::Rent,
                },
                Err(why) => self.fail(why, &mut side),
            },
            (ResumeNext::Rent, ResumeInput::Rented(rented)) => match rented {
                Ok(lease) => {
                    side.push(ResumeSide::Record(lease.clone()));
                    self.next_lease = Some(lease.clone());
                    ResumeNext::Put(lease)
                }
                Err(why) => {
                    let at = now.plus_ms(self.plan.retry_ms);
                    if at >= self.deadline {
                        self.fail(
                            format!("no lease within {} s: {why}", self.plan.timeout_ms / 1000),
                            &mut side,
                        )
                    } else {
                        ResumeNext::Wait(at)
                    }
                }
            },
            (ResumeNext::Wait(at), ResumeInput::Timer) if now >= at => ResumeNext::Rent,
            (ResumeNext::Put(lease), ResumeInput::Put(put)) => match put {
                Ok(()) => ResumeNext::Commit(lease),
                Err(why) => self.fail(why, &mut side),
            },
            (ResumeNext::Commit(lease), ResumeInput::Committed(committed)) => match committed {
                Ok(()) => ResumeNext::Done(ResumeOutcome::Resumed(lease)),
                Err(why) => self.fail(why, &mut side),
            },
            (waiting, _) => waiting,
        };
        self.step(side, next)
    }

    fn step(&mut self, side: Vec<ResumeSide<L>>, next: ResumeNext<L>) -> ResumeStep<L> {
        self.waiting = next.clone();
        ResumeStep { side, next }
    }

    /// The hop gives up: a next lease it holds is stopped.
    fn fail(&mut self, why: String, side: &mut Vec<ResumeSide<L>>) -> ResumeNext<L> {
        if let Some(lease) = self.next_lease.take() {
            side.push(ResumeSide::Stop(lease));
        }
        ResumeNext::Done(ResumeOutcome::Failed(why))
    }
}
