//! A group order's placement, as its renter coordinates it: every member lease is agreed
//! and held for its commit (phase one), and only once every member holds does any start
//! (phase two: the commits). When a member cannot be placed, or the wait runs out, every
//! member is stopped instead: its host ends it unpaid and releases its escrow, and a member
//! whose host fell silent is released by the renter itself, so no partial group holds
//! money or GPUs. Best-effort placement commits whatever holds.
//!
//! Members are added as the renter places them ([`GroupPlacement::add`]); the renter says
//! when no more are coming ([`GroupPlacement::placed`]). Like the lease machines, this
//! never reads a clock: the shell reports [`GroupInput::Timer`] at
//! [`GroupPlacement::deadline`].

use gpux_protocol::Timestamp;

/// How a group is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every member starts, or none does.
    AllOrNothing,
    /// Whatever holds by the end starts (at least one member).
    BestEffort,
}

/// Where one member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Being rented.
    Placing,
    /// Agreed, its escrow locked, held for the commit.
    Held,
    /// Could not be placed (refused, or its host fell silent).
    Failed,
    /// Committed: its work starts.
    Committed,
    /// Stopped: the group did not start with it.
    Stopped,
}

/// What happens to a group's placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupInput {
    /// Member `i` is held.
    Held(usize),
    /// Member `i` could not be placed.
    Failed(usize),
    /// The wait is over ([`GroupPlacement::deadline`]).
    Timer,
}

/// How a group's placement came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOutcome {
    /// These many members were committed.
    Started {
        /// Members committed.
        members: usize,
    },
    /// Nothing started; every member that held was stopped.
    Aborted,
}

/// What the shell must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEffect {
    /// Commit member `i` (its work starts).
    Commit(usize),
    /// Stop member `i` (it ends unpaid, its escrow released).
    Stop(usize),
    /// The placement is decided.
    Decided(GroupOutcome),
}

/// A group order's placement.
#[derive(Debug, Clone)]
pub struct GroupPlacement {
    placement: Placement,
    members: Vec<MemberState>,
    deadline: Timestamp,
    all_placed: bool,
    outcome: Option<GroupOutcome>,
}

impl GroupPlacement {
    /// A placement that must be decided by `deadline` (members not held by then count as
    /// failed).
    pub fn new(placement: Placement, deadline: Timestamp) -> Self {
        Self {
            placement,
            members: Vec::new(),
            deadline,
            all_placed: false,
            outcome: None,
        }
    }

    /// When the placement is decided at the latest.
    pub fn deadline(&self) -> Timestamp {
        self.deadline
    }

    /// A member being placed; returns its index.
    pub fn add(&mut self) -> usize {
        self.members.push(MemberState::Placing);
        self.members.len() - 1
    }

    /// Where each member stands.
    pub fn members(&self) -> &[MemberState] {
        &self.members
    }

    /// How it came out, once decided.
    pub fn outcome(&self) -> Option<GroupOutcome> {
        self.outcome
    }

    /// No more members are coming: the placement decides once they have all answered.
    pub fn placed(&mut self, now: Timestamp) -> Vec<GroupEffect> {
        self.all_placed = true;
        let mut out = Vec::new();
        self.decide(now, &mut out);
        out
    }

    /// Handles one input at `now`.
    pub fn handle(&mut self, now: Timestamp, input: GroupInput) -> Vec<GroupEffect> {
        let mut out = Vec::new();
        match input {
            GroupInput::Held(i) => match (self.members.get(i), self.outcome) {
                (Some(MemberState::Placing), None) => self.members[i] = MemberState::Held,
                // Held after the group was decided without it: it must not run.
                (Some(MemberState::Placing), Some(_)) => {
                    self.members[i] = MemberState::Stopped;
                    out.push(GroupEffect::Stop(i));
                }
                _ => {}
            },
            GroupInput::Failed(i) => {
                if let Some(m @ (MemberState::Placing | MemberState::Held)) =
                    self.members.get_mut(i)
                {
                    // A held member that fails (its host ended it) is stopped all the same.
                    if *m == MemberState::Held {
                        out.push(GroupEffect::Stop(i));
                    }
                    *m = MemberState::Failed;
                }
            }
            GroupInput::Timer => {}
        }
        self.decide(now, &mut out);
        out
    }

    fn decide(&mut self, now: Timestamp, out: &mut Vec<GroupEffect>) {
        if self.outcome.is_some() {
            return;
        }
        let late = now >= self.deadline;
        let any_failed = self.members.contains(&MemberState::Failed);
        let placing = self.members.contains(&MemberState::Placing);
        let held = self
            .members
            .iter()
            .filter(|m| **m == MemberState::Held)
            .count();
        let start = match self.placement {
            Placement::AllOrNothing => {
                if any_failed || late {
                    false
                } else if self.all_placed && !placing && held > 0 {
                    true
                } else {
                    return;
                }
            }
            Placement::BestEffort => {
                if (self.all_placed && !placing) || late {
                    held > 0
                } else {
                    return;
                }
            }
        };
        for (i, m) in self.members.iter_mut().enumerate() {
            match (*m, start) {
                (MemberState::Held, true) => {
                    *m = MemberState::Committed;
                    out.push(GroupEffect::Commit(i));
                }
                (MemberState::Held, false) => {
                    *m = MemberState::Stopped;
                    out.push(GroupEffect::Stop(i));
                }
                _ => {}
            }
        }
        let outcome = if start {
            GroupOutcome::Started { members: held }
        } else {
            GroupOutcome::Aborted
        };
        self.outcome = Some(outcome);
        out.push(GroupEffect::Decided(outcome));
    }
}
