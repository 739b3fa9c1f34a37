//! Getting a lease, renter side, as a pure machine: which host is asked next, what is
//! claimed and released, and how the rent comes out. The node's shell finds candidates,
//! dials hosts, stages images, sends requests and runs challenges, and reports each result
//! back as an input; the machine says what to do next.
//!
//! The rule it keeps: **a rent never holds two hosts' GPUs.** A host is asked only once
//! everything asked of the one before is let go: the claim in this node's book released,
//! or a lease that failed its challenge ended. A rent that ends without a lease holds
//! nothing; one that ends with a lease holds that lease only (`lease/tests/rent.rs` checks
//! both over random schedules).
//!
//! The flow: rounds of candidates (up to [`RentPlan::max_rounds`], moving to the next phase
//! of the search when one finds none); in a round the candidates are probed all at once by
//! the shell and asked one at a time in the round's order. Asking one: await its probe,
//! prepare its image, claim GPUs of its offer in this node's book (a claim that another of
//! this node's rents cannot take), send the request, and, when asked for, challenge the
//! lease before it counts. A host that refuses GPUs another renter had just taken is asked
//! again, up to [`RentPlan::retries_on_host`] times, for the GPUs it names as free; the
//! previous claim is released in the same step as the next one is made.

use gpux_protocol::RejectReason;

/// How a rent searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RentPlan {
    /// Phases of the search (each a narrower or wider bid), asked for in order.
    pub phases: usize,
    /// Rounds of candidates before the rent gives up (a round that found none counts).
    pub max_rounds: usize,
    /// Times one host is asked again after it refused GPUs that were just taken.
    pub retries_on_host: usize,
    /// Challenge the GPUs of an accepted lease before it counts.
    pub challenge: bool,
}

/// One candidate of a round, as the machine needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RentCandidate<G> {
    /// The host, as refusals name it.
    pub name: String,
    /// The GPUs the match found.
    pub gpus: Vec<G>,
    /// The match preempts spot leases: it books what it found, as it is, without a claim.
    pub preempts: bool,
    /// Whether the rent's terms fit the offer (its retention, fees, share); `Err` says why
    /// not, and the host is not asked.
    pub fits: Result<(), String>,
}

/// What the shell reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RentInput<G, C> {
    /// The round's candidates, best first (none: the phase found nothing more).
    Candidates(Vec<RentCandidate<G>>),
    /// The awaited candidate's probe: reached, or why not (a refusal's text).
    Probed(Result<(), String>),
    /// The candidate's image is ready on the host, or why not.
    Prepared(Result<(), String>),
    /// The claim in this node's book: the GPUs claimed and the claim's handle, or none
    /// free.
    Claimed(Option<(Vec<G>, C)>),
    /// The host's answer to the request.
    Answered(RentAnswer<G>),
    /// How the challenge of the accepted lease came out.
    Challenged(ChallengeResult),
}

/// A host's answer to a lease request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RentAnswer<G> {
    /// Accepted, and the lease started (or is held for its commit): the claim became the
    /// lease's booking.
    Accepted,
    /// The GPUs asked for were taken; the host names these of the same offer as free.
    Taken {
        /// The refusal's text.
        why: String,
        /// The GPUs it names as free.
        free: Vec<G>,
    },
    /// Refused before anything was agreed, with the host's typed reason when it gave one
    /// (none: it could not be reached or answered nonsense).
    Refused {
        /// The refusal's text.
        why: String,
        /// The host's typed reason.
        reason: Option<RejectReason>,
    },
    /// Agreed, but it did not start: the lease's own machine made sure nothing is paid
    /// and nothing held.
    NotStarted(String),
}

/// How a challenge of an accepted lease came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChallengeResult {
    /// Passed (and committed, unless the renter commits it itself).
    Passed,
    /// Failed, or could not run: the lease must end.
    Failed {
        /// The refusal's text.
        why: String,
        /// The GPUs failed it (the host is paid nothing), rather than it not running.
        failed: bool,
    },
    /// Passed, but the commit did not go through.
    NotCommitted(String),
}

/// What the shell does, without an answer, before the next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RentSide<C> {
    /// Candidate `i` of the round was reached.
    Reached(usize),
    /// Candidate `i` could not be reached (or refused without a typed reason): back it off.
    Unreachable(usize),
    /// Release a claim in this node's book.
    Release(C),
    /// End the accepted lease of candidate `i` (`failed`: it failed its challenge).
    End {
        /// The candidate.
        candidate: usize,
        /// It failed its challenge (else it is stopped).
        failed: bool,
    },
}

/// What the machine waits for next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RentNext<G, C> {
    /// A round's candidates for phase `phase` ([`RentInput::Candidates`]).
    Candidates {
        /// The search's phase.
        phase: usize,
    },
    /// Candidate `i`'s probe ([`RentInput::Probed`]).
    Probe(usize),
    /// Candidate `i`'s image, ready on its host ([`RentInput::Prepared`]).
    Prepare(usize),
    /// A claim of candidate `candidate`'s GPUs ([`RentInput::Claimed`]): those in `prefer`
    /// first, none in `avoid`, `release` let go in the same step.
    Claim {
        /// The candidate.
        candidate: usize,
        /// The previous claim on this host, released as this one is made.
        release: Option<C>,
        /// GPUs to claim first.
        prefer: Vec<G>,
        /// GPUs not to claim.
        avoid: Vec<G>,
    },
    /// The request to candidate `candidate`, under `hold` (none: a preempting match)
    /// ([`RentInput::Answered`]).
    Request {
        /// The candidate.
        candidate: usize,
        /// The claim the request is made under.
        hold: Option<C>,
    },
    /// The challenge of candidate `i`'s accepted lease ([`RentInput::Challenged`]).
    Challenge(usize),
    /// The rent is over.
    Done(RentOutcome),
}

/// How a rent came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RentOutcome {
    /// Candidate `candidate` of the last round holds the lease.
    Rented {
        /// The candidate.
        candidate: usize,
    },
    /// A host agreed but the lease did not start (nothing was charged); no other host is
    /// asked.
    NotStarted(String),
    /// No host gave a lease.
    Refused {
        /// Why each host asked did not, in the order asked (empty: no offer fit).
        refusals: Vec<String>,
        /// Every host asked refused because the GPUs were taken.
        all_taken: bool,
    },
}

/// One step: what to do now, then what to wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RentStep<G, C> {
    /// Done first, in order.
    pub side: Vec<RentSide<C>>,
    /// Then waited for.
    pub next: RentNext<G, C>,
}

/// What this rent holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Held<C> {
    Nothing,
    /// A claim in this node's book on candidate `candidate`'s GPUs.
    Claim {
        candidate: usize,
        hold: C,
    },
    /// Candidate `candidate`'s accepted lease.
    Lease {
        candidate: usize,
    },
}

/// Where asking the current candidate stands.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Asking<G> {
    candidate: usize,
    /// Claims made on this host.
    claims: usize,
    prefer: Vec<G>,
    avoid: Vec<G>,
    /// The last `Taken` refusal's text.
    last: Option<String>,
}

/// One rent's search for a lease.
#[derive(Debug, Clone)]
pub struct RentSearch<G, C> {
    plan: RentPlan,
    phase: usize,
    rounds: usize,
    round: Vec<RentCandidate<G>>,
    asking: Option<Asking<G>>,
    held: Held<C>,
    refusals: Vec<(String, Option<RejectReason>)>,
    next: RentNext<G, C>,
}

impl<G: Clone + PartialEq, C: Clone> RentSearch<G, C> {
    /// A rent's search, and its first step.
    pub fn new(plan: RentPlan) -> (Self, RentStep<G, C>) {
        let mut search = Self {
            plan,
            phase: 0,
            rounds: 0,
            round: Vec::new(),
            asking: None,
            held: Held::Nothing,
            refusals: Vec::new(),
            next: RentNext::Done(RentOutcome::Refused {
                refusals: Vec::new(),
                all_taken: false,
            }),
        };
        let next = search.next_round();
        let step = search.step(Vec::new(), next);
        (search, step)
    }

    /// What the machine waits for.
    pub fn waiting(&self) -> &RentNext<G, C> {
        &self.next
    }

    /// Whether the rent holds anything: a claim or a lease.
    pub fn holds(&self) -> bool {
        !matches!(self.held, Held::Nothing)
    }

    /// Handles the input the machine waits for. An input it is not waiting for changes
    /// nothing: the step returned is the one it waits on still.
    pub fn handle(&mut self, input: RentInput<G, C>) -> RentStep<G, C> {
        let mut side = Vec::new();
        let next = match (self.next.clone(), input) {
            (RentNext::Candidates { .. }, RentInput::Candidates(candidates)) => {
                self.rounds += 1;
                if candidates.is_empty() {
                    self.phase += 1;
                    self.next_round()
                } else {
                    self.round = candidates;
                    self.ask(0)
                }
            }
            (RentNext::Probe(i), RentInput::Probed(probe)) => match probe {
                Ok(()) => {
                    side.push(RentSide::Reached(i));
                    RentNext::Prepare(i)
                }
                Err(why) => {
                    side.push(RentSide::Unreachable(i));
                    self.refusals.push((why, None));
                    self.ask(i + 1)
                }
            },
            (RentNext::Prepare(i), RentInput::Prepared(prepared)) => match prepared {
                Ok(()) => self.claim(i),
                Err(why) => {
                    self.refusals.push((why, None));
                    self.ask(i + 1)
                }
            },
            (RentNext::Claim { candidate, .. }, RentInput::Claimed(claimed)) => match claimed {
                Some((gpus, hold)) => {
                    if let Some(asking) = &mut self.asking {
                        asking.claims += 1;
                        asking.avoid.extend(gpus);
                    }
                    self.held = Held::Claim {
                        candidate,
                        hold: hold.clone(),
                    };
                    RentNext::Request {
                        candidate,
                        hold: Some(hold),
                    }
                }
                None => {
                    // The previous claim, if any, went with the claim's step.
                    self.held = Held::Nothing;
                    let last = self.asking.as_ref().and_then(|a| a.last.clone());
                    let why = last.unwrap_or_else(|| {
                        format!(
                            "{}: its free GPUs are being asked for by this node's other rents",
                            self.round[candidate].name
                        )
                    });
                    self.refusals
                        .push((why, Some(RejectReason::GpusUnavailable)));
                    self.ask(candidate + 1)
                }
            },
            (RentNext::Request { candidate, hold }, RentInput::Answered(answer)) => {
                self.answered(candidate, hold, answer, &mut side)
            }
            (RentNext::Challenge(i), RentInput::Challenged(result)) => match result {
                ChallengeResult::Passed => RentNext::Done(RentOutcome::Rented { candidate: i }),
                ChallengeResult::Failed { why, failed } => {
                    self.held = Held::Nothing;
                    side.push(RentSide::End {
                        candidate: i,
                        failed,
                    });
                    self.refusals.push((why, Some(RejectReason::Invalid)));
                    self.ask(i + 1)
                }
                ChallengeResult::NotCommitted(why) => {
                    self.held = Held::Nothing;
                    side.push(RentSide::End {
                        candidate: i,
                        failed: false,
                    });
                    RentNext::Done(RentOutcome::NotStarted(why))
                }
            },
            (waiting, _) => waiting,
        };
        self.step(side, next)
    }

    fn step(&mut self, side: Vec<RentSide<C>>, next: RentNext<G, C>) -> RentStep<G, C> {
        self.next = next.clone();
        RentStep { side, next }
    }

    /// Asks for the next round's candidates, or gives up.
    fn next_round(&mut self) -> RentNext<G, C> {
        self.round.clear();
        if self.phase < self.plan.phases && self.rounds < self.plan.max_rounds {
            return RentNext::Candidates { phase: self.phase };
        }
        let all_taken = self
            .refusals
            .iter()
            .all(|(_, reason)| *reason == Some(RejectReason::GpusUnavailable));
        RentNext::Done(RentOutcome::Refused {
            refusals: self.refusals.iter().map(|(why, _)| why.clone()).collect(),
            all_taken: all_taken && !self.refusals.is_empty(),
        })
    }

    /// Asks candidate `i` of the round, or the first after it that fits; the next round
    /// once the round is through.
    fn ask(&mut self, mut i: usize) -> RentNext<G, C> {
        self.asking = None;
        while let Some(candidate) = self.round.get(i) {
            match &candidate.fits {
                Ok(()) => return RentNext::Probe(i),
                Err(why) => {
                    self.refusals
                        .push((format!("{}: {why}", candidate.name), None));
                    i += 1;
                }
            }
        }
        self.next_round()
    }

    /// Claims candidate `i`'s GPUs (a preempting match asks without a claim).
    fn claim(&mut self, i: usize) -> RentNext<G, C> {
        let candidate = &self.round[i];
        if candidate.preempts {
            return RentNext::Request {
                candidate: i,
                hold: None,
            };
        }
        self.asking = Some(Asking {
            candidate: i,
            claims: 0,
            prefer: candidate.gpus.clone(),
            avoid: Vec::new(),
            last: None,
        });
        RentNext::Claim {
            candidate: i,
            release: None,
            prefer: candidate.gpus.clone(),
            avoid: Vec::new(),
        }
    }

    fn answered(
        &mut self,
        i: usize,
        hold: Option<C>,
        answer: RentAnswer<G>,
        side: &mut Vec<RentSide<C>>,
    ) -> RentNext<G, C> {
        match answer {
            RentAnswer::Accepted => {
                // The claim became the lease's booking.
                self.held = Held::Lease { candidate: i };
                if self.plan.challenge {
                    RentNext::Challenge(i)
                } else {
                    RentNext::Done(RentOutcome::Rented { candidate: i })
                }
            }
            RentAnswer::Taken { why, free } => {
                let retries = self.plan.retries_on_host;
                match (hold, &mut self.asking) {
                    (Some(hold), Some(asking)) if asking.claims <= retries => {
                        // Asked again for the GPUs it names; the claim is released as
                        // the next is made.
                        asking.prefer = free;
                        asking.last = Some(why);
                        RentNext::Claim {
                            candidate: i,
                            release: Some(hold),
                            prefer: asking.prefer.clone(),
                            avoid: asking.avoid.clone(),
                        }
                    }
                    (hold, _) => {
                        self.let_go(hold, side);
                        self.refusals
                            .push((why, Some(RejectReason::GpusUnavailable)));
                        self.ask(i + 1)
                    }
                }
            }
            RentAnswer::Refused { why, reason } => {
                self.let_go(hold, side);
                if reason.is_none() {
                    side.push(RentSide::Unreachable(i));
                }
                self.refusals.push((why, reason));
                self.ask(i + 1)
            }
            RentAnswer::NotStarted(why) => {
                self.held = Held::Nothing;
                RentNext::Done(RentOutcome::NotStarted(why))
            }
        }
    }

    /// Releases the claim a refused request was made under.
    fn let_go(&mut self, hold: Option<C>, side: &mut Vec<RentSide<C>>) {
        self.held = Held::Nothing;
        // With the `broken-rule` feature a refused host's claim is kept: the simulator's
        // check must see two hosts' GPUs held (`lease/tests/rent.rs`).
        #[cfg(feature = "broken-rule")]
        let hold: Option<C> = {
            let _ = hold;
            None
        };
        if let Some(hold) = hold {
            side.push(RentSide::Release(hold));
        }
    }
}
