//! Host reputation, as each node computes it from what it has observed.
//!
//! Evidence is weighted and decays exponentially (half-life 30 days by default), so recent
//! behaviour counts most and old failures are forgiven slowly:
//!
//! | event | good | bad |
//! |---|---|---|
//! | lease settled | +3 | |
//! | receipt acknowledged | +0.2 | |
//! | host-caused failure (stopped early, container failed, vanished) | | +6 |
//! | uptime probe answered / missed | +0.05 | +0.05 |
//!
//! The score is the mean of a Beta(1 + good, 1 + bad) distribution:
//! `(1 + good) / (2 + good + bad)`, reported in thousandths (0..=1000). A host nobody has
//! seen scores 500, the book's default. Deterministic: the same events at the same times give
//! the same score.
//!
//! Apart from the score, each host's **interruption rate**: of the spot leases with it that
//! ended, the share it preempted (decayed the same way). A preemption is within the spot
//! contract, so it does not lower the score; spot buyers weigh the rate themselves.
//!
//! **What others paid for.** Besides what this node saw, the ledger's record of who paid a
//! host (`/gpux/ledger/2` `History`, records anyone can ask for) counts as good evidence:
//! each paid, closed escrow is worth a settled lease, but only from a payer that is not the
//! host itself and that has paid someone else too (a witness with a history of its own),
//! and at most [`ReputationConfig::ledger_cap`] escrows per payer, so a host that leases to
//! itself, or to identities made for it, gains nothing, and one generous renter cannot
//! make a reputation alone. This evidence is replaced at each fetch (the ledger holds the
//! whole history), not decayed.
//!
//! **How others' leases ended.** The ledger also keeps, with each closed escrow, the
//! outcome its closing release stated (`Ends`): the end reason, whether the lease was spot,
//! and whether the host or the renter stated it. From the same witnesses, with the same cap
//! per payer and per kind of outcome, an end the host caused counts as a host-caused
//! failure ([`host_at_fault`]), and spot leases that ended, and those the host preempted,
//! join the interruption rate.
//!
//! **Challenges passed.** Each of the host's devices with a passed performance challenge
//! this node holds (a published `ChallengeResult`, which shows the challenger paid the host
//! for a lease) counts as a settled lease, at most [`ReputationConfig::ledger_cap`] of
//! them.

use std::collections::BTreeMap;

use gpux_protocol::ledger_wire::{HostEnds, HostHistory};
use gpux_protocol::{EndReason, LeaseOutcome, PublicKey, Timestamp};

/// Something observed about a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEvent {
    /// A lease with the host settled.
    LeaseSettled,
    /// A receipt from the host was acknowledged.
    ReceiptAcked,
    /// The host ended a lease early, its container failed, or it vanished.
    HostFailure,
    /// An uptime probe: answered or not.
    Uptime {
        /// Whether the host answered.
        online: bool,
    },
    /// A spot lease with the host ended: preempted or not.
    SpotEnded {
        /// Whether the host preempted it.
        preempted: bool,
    },
}

/// Weights and decay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReputationConfig {
    /// Half-life of evidence, ms.
    pub half_life_ms: u64,
    /// Weight of a settled lease.
    pub settled: f64,
    /// Weight of an acknowledged receipt.
    pub acked: f64,
    /// Weight of a host-caused failure.
    pub failure: f64,
    /// Weight of one uptime probe.
    pub uptime: f64,
    /// The most paid escrows one payer's record counts for, in the ledger's history.
    pub ledger_cap: u32,
}

impl Default for ReputationConfig {
    fn default() -> Self {
        Self {
            half_life_ms: 30 * 24 * 3_600_000,
            settled: 3.0,
            acked: 0.2,
            failure: 6.0,
            uptime: 0.05,
            ledger_cap: 3,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Record {
    good: f64,
    bad: f64,
    /// Spot leases ended, and of those preempted.
    spot: f64,
    preempted: f64,
    at: u64,
}

/// Reputation of every host observed. See the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct Reputation {
    config: ReputationConfig,
    hosts: BTreeMap<PublicKey, Record>,
    /// Good evidence from the ledger's history of each host (see the module docs).
    ledger: BTreeMap<PublicKey, f64>,
    /// Evidence from how the host's leases with others ended, by the ledger's records.
    ledger_ends: BTreeMap<PublicKey, EndEvidence>,
    /// Good evidence from the host's devices with a passed challenge.
    challenged: BTreeMap<PublicKey, f64>,
}

/// What the ledger's `Ends` of a host weigh (see [`ledger_end_evidence`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EndEvidence {
    /// Host-caused failures, weighted as [`ReputationConfig::failure`] each.
    pub bad: f64,
    /// Spot leases that ended.
    pub spot: f64,
    /// Of those, the ones the host preempted.
    pub preempted: f64,
}

/// Whether a lease's end, as stated by the host (`by_host`) or its renter, was the host's
/// doing: it shut down, its container or GPU failed, it failed the renter's challenge, or (by the
/// renter's word) it fell silent or billed more than ran. A preemption is within the spot
/// contract and is not a fault.
pub fn host_at_fault(outcome: &LeaseOutcome, by_host: bool) -> bool {
    match outcome.reason {
        EndReason::HostShutdown
        | EndReason::ContainerFailed
        | EndReason::GpuFailed
        | EndReason::ChallengeFailed => true,
        EndReason::ReceiptNotAcknowledged | EndReason::ReceiptDisputed => !by_host,
        _ => false,
    }
}

/// The evidence the ledger's `Ends` of `host` gives: from the same witnesses as
/// [`ledger_evidence`] (not the host, and a payer that has paid someone else), each payer
/// counting for at most `config.ledger_cap` escrows of each kind (faults, spot leases
/// ended, preemptions).
pub fn ledger_end_evidence(
    host: &PublicKey,
    ends: &HostEnds,
    config: &ReputationConfig,
) -> EndEvidence {
    let cap = |n: u32| f64::from(n.min(config.ledger_cap));
    let mut total = EndEvidence::default();
    for p in ends
        .payers
        .iter()
        .filter(|p| p.payer != *host && p.other_payees > 0)
    {
        let count = |f: &dyn Fn(&gpux_protocol::ledger_wire::EndCount) -> bool| {
            p.ends
                .iter()
                .filter(|c| f(c))
                .map(|c| c.count)
                .fold(0u32, u32::saturating_add)
        };
        total.bad += cap(count(&|c| host_at_fault(&c.outcome, c.by_host))) * config.failure;
        total.spot += cap(count(&|c| c.outcome.spot));
        total.preempted += cap(count(&|c| {
            c.outcome.spot && c.outcome.reason == EndReason::Preempted
        }));
    }
    total.preempted = total.preempted.min(total.spot);
    total
}

/// The good evidence the ledger's `history` of `host` gives (see the [module docs](self)):
/// each payer other than the host that has paid someone else counts for its paid escrows,
/// at most `config.ledger_cap` of them, each worth a settled lease.
pub fn ledger_evidence(host: &PublicKey, history: &HostHistory, config: &ReputationConfig) -> f64 {
    history
        .payers
        .iter()
        .filter(|p| p.payer != *host && p.other_payees > 0)
        .map(|p| f64::from(p.paid.min(config.ledger_cap)) * config.settled)
        .sum()
}

impl Reputation {
    /// No evidence yet.
    pub fn new(config: ReputationConfig) -> Self {
        Self {
            config,
            hosts: BTreeMap::new(),
            ledger: BTreeMap::new(),
            ledger_ends: BTreeMap::new(),
            challenged: BTreeMap::new(),
        }
    }

    /// Takes the ledger's history of `host` as its evidence from others (replacing the one
    /// held). Returns that evidence's weight.
    pub fn set_ledger_history(&mut self, host: PublicKey, history: &HostHistory) -> f64 {
        let good = ledger_evidence(&host, history, &self.config);
        if good > 0.0 {
            self.ledger.insert(host, good);
        } else {
            self.ledger.remove(&host);
        }
        good
    }

    /// Takes the ledger's `Ends` of `host` as its evidence from others (replacing the one
    /// held).
    pub fn set_ledger_ends(&mut self, host: PublicKey, ends: &HostEnds) -> EndEvidence {
        let evidence = ledger_end_evidence(&host, ends, &self.config);
        if evidence == EndEvidence::default() {
            self.ledger_ends.remove(&host);
        } else {
            self.ledger_ends.insert(host, evidence);
        }
        evidence
    }

    /// Takes the number of `host`'s devices with a passed challenge held here as evidence
    /// (replacing the one held): each worth a settled lease, at most
    /// [`ReputationConfig::ledger_cap`].
    pub fn set_challenged(&mut self, host: PublicKey, devices: usize) -> f64 {
        let cap = usize::try_from(self.config.ledger_cap).unwrap_or(usize::MAX);
        let good = devices.min(cap) as f64 * self.config.settled;
        if good > 0.0 {
            self.challenged.insert(host, good);
        } else {
            self.challenged.remove(&host);
        }
        good
    }

    fn decay(&self, record: Record, now: u64) -> Record {
        let elapsed = now.saturating_sub(record.at) as f64;
        let factor = 0.5f64.powf(elapsed / self.config.half_life_ms.max(1) as f64);
        Record {
            good: record.good * factor,
            bad: record.bad * factor,
            spot: record.spot * factor,
            preempted: record.preempted * factor,
            at: now.max(record.at),
        }
    }

    /// Records an event that happened at `at`. Events may arrive in any order: one older than
    /// the host's record is decayed to the record's time before it is added, so the score
    /// depends only on the events and their times.
    pub fn record(&mut self, host: PublicKey, event: HostEvent, at: Timestamp) {
        let start = Record {
            good: 0.0,
            bad: 0.0,
            spot: 0.0,
            preempted: 0.0,
            at: at.0,
        };
        let mut r = self.decay(self.hosts.get(&host).copied().unwrap_or(start), at.0);
        let lag = r.at.saturating_sub(at.0) as f64;
        let weight = 0.5f64.powf(lag / self.config.half_life_ms.max(1) as f64);
        let c = &self.config;
        match event {
            HostEvent::LeaseSettled => r.good += c.settled * weight,
            HostEvent::ReceiptAcked => r.good += c.acked * weight,
            HostEvent::HostFailure => r.bad += c.failure * weight,
            HostEvent::Uptime { online: true } => r.good += c.uptime * weight,
            HostEvent::Uptime { online: false } => r.bad += c.uptime * weight,
            HostEvent::SpotEnded { preempted } => {
                r.spot += weight;
                if preempted {
                    r.preempted += weight;
                }
            }
        }
        self.hosts.insert(host, r);
    }

    /// The host's interruption rate at `now`, thousandths: of the spot leases with it that
    /// ended (this node's, decayed, and others' by the ledger's records), the share it
    /// preempted; `None` before any ended.
    pub fn interruption(&self, host: &PublicKey, now: Timestamp) -> Option<u16> {
        let own = self
            .hosts
            .get(host)
            .map(|r| self.decay(*r, now.0))
            .map_or((0.0, 0.0), |r| (r.spot, r.preempted));
        let others = self.ledger_ends.get(host).copied().unwrap_or_default();
        let (spot, preempted) = (own.0 + others.spot, own.1 + others.preempted);
        (spot > 0.0).then(|| ((preempted / spot) * 1000.0).round().clamp(0.0, 1000.0) as u16)
    }

    /// The host's score at `now`, thousandths (500 for a host never observed, here or in
    /// the ledger's history).
    pub fn score(&self, host: &PublicKey, now: Timestamp) -> u16 {
        let paid = self.ledger.get(host).copied().unwrap_or(0.0);
        let (good, bad) = match self.hosts.get(host) {
            Some(&r) => {
                let r = self.decay(r, now.0);
                (r.good, r.bad)
            }
            None => (0.0, 0.0),
        };
        let good = good + paid + self.challenged.get(host).copied().unwrap_or(0.0);
        let bad = bad + self.ledger_ends.get(host).map_or(0.0, |e| e.bad);
        let score = (1.0 + good) / (2.0 + good + bad);
        (score * 1000.0).round().clamp(0.0, 1000.0) as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpux_protocol::ledger_wire::PayerRecord;

    fn payer(n: u8, paid: u32, other_payees: u32) -> PayerRecord {
        PayerRecord {
            payer: PublicKey([n; 32]),
            paid,
            unpaid: 0,
            other_payees,
        }
    }

    #[test]
    fn how_others_leases_ended_counts_faults_and_preemptions_from_witnesses_capped() {
        use gpux_protocol::ledger_wire::{EndCount, PayerEnds};
        let config = ReputationConfig::default();
        let h = host();
        let end = |reason, spot, by_host, count| EndCount {
            outcome: LeaseOutcome { reason, spot },
            by_host,
            count,
        };
        let ends = HostEnds {
            payers: vec![
                // A witness: two spot leases preempted of five, one shutdown, and one
                // silence by its own word.
                PayerEnds {
                    payer: PublicKey([4; 32]),
                    other_payees: 2,
                    ends: vec![
                        end(EndReason::Preempted, true, true, 2),
                        end(EndReason::DurationReached, true, true, 3),
                        end(EndReason::HostShutdown, false, true, 1),
                        end(EndReason::ReceiptNotAcknowledged, false, false, 1),
                        // The host saying its renter did not acknowledge: not its fault.
                        end(EndReason::ReceiptNotAcknowledged, false, true, 9),
                    ],
                },
                // No history of its own, or the host itself: nothing.
                PayerEnds {
                    payer: PublicKey([5; 32]),
                    other_payees: 0,
                    ends: vec![end(EndReason::HostShutdown, false, false, 50)],
                },
                PayerEnds {
                    payer: h,
                    other_payees: 7,
                    ends: vec![end(EndReason::DurationReached, true, true, 50)],
                },
            ],
        };
        let e = ledger_end_evidence(&h, &ends, &config);
        // Capped at 3 per payer and kind: 5 spot leases count 3, 2 faults count 2.
        assert_eq!(e.spot, 3.0);
        assert_eq!(e.preempted, 2.0);
        assert_eq!(e.bad, 2.0 * config.failure);
        let mut rep = Reputation::new(config);
        assert_eq!(rep.interruption(&h, Timestamp(0)), None);
        rep.set_ledger_ends(h, &ends);
        assert_eq!(rep.interruption(&h, Timestamp(0)), Some(667));
        assert!(rep.score(&h, Timestamp(0)) < 500);
        // Added to what this node saw itself: one spot lease, not preempted.
        rep.record(h, HostEvent::SpotEnded { preempted: false }, Timestamp(0));
        assert_eq!(rep.interruption(&h, Timestamp(0)), Some(500));
        // Replaced by the next fetch.
        rep.set_ledger_ends(h, &HostEnds { payers: vec![] });
        assert_eq!(rep.interruption(&h, Timestamp(0)), Some(0));
        assert_eq!(rep.score(&h, Timestamp(0)), 500);
        // Passed challenges of its devices count as settled leases, capped.
        assert_eq!(rep.set_challenged(h, 8), 3.0 * config.settled);
        assert_eq!(
            rep.score(&h, Timestamp(0)),
            ((1.0 + 9.0) / (2.0 + 9.0) * 1000.0_f64).round() as u16
        );
        rep.set_challenged(h, 0);
        assert_eq!(rep.score(&h, Timestamp(0)), 500);
    }

    #[test]
    fn the_ledgers_history_counts_witnesses_with_histories_capped_and_never_the_host() {
        let config = ReputationConfig::default();
        let h = host();
        let history = |payers: Vec<PayerRecord>| HostHistory {
            payers_total: payers.len() as u32,
            payers,
        };
        // The host paying itself, and payers that paid nobody else, count for nothing.
        let selfish = history(vec![
            PayerRecord {
                payer: h,
                ..payer(0, 50, 9)
            },
            payer(2, 40, 0),
            payer(3, 40, 0),
        ]);
        assert_eq!(ledger_evidence(&h, &selfish, &config), 0.0);
        let mut rep = Reputation::new(config);
        rep.set_ledger_history(h, &selfish);
        assert_eq!(rep.score(&h, Timestamp(0)), 500);
        // Two witnesses with histories: one capped at 3 escrows, one with 1.
        let witnessed = history(vec![payer(4, 100, 2), payer(5, 1, 1), payer(6, 0, 5)]);
        assert_eq!(
            ledger_evidence(&h, &witnessed, &config),
            (3.0 + 1.0) * config.settled
        );
        rep.set_ledger_history(h, &witnessed);
        let vouched = rep.score(&h, Timestamp(0));
        assert_eq!(
            vouched,
            ((1.0 + 12.0) / (2.0 + 12.0) * 1000.0_f64).round() as u16
        );
        // It adds to what this node saw, and a new history replaces the old one.
        rep.record(h, HostEvent::HostFailure, Timestamp(0));
        assert!(rep.score(&h, Timestamp(0)) < vouched);
        rep.set_ledger_history(h, &selfish);
        assert!(rep.score(&h, Timestamp(0)) < 500);
    }

    fn host() -> PublicKey {
        PublicKey([1; 32])
    }

    #[test]
    fn good_hosts_rise_failures_fall_and_evidence_decays() {
        let day = 86_400_000;
        let mut rep = Reputation::new(ReputationConfig::default());
        assert_eq!(rep.score(&host(), Timestamp(0)), 500);
        for i in 0..10 {
            rep.record(host(), HostEvent::LeaseSettled, Timestamp(i * 1000));
        }
        let good = rep.score(&host(), Timestamp(10_000));
        assert!(good > 950, "{good}");
        rep.record(host(), HostEvent::HostFailure, Timestamp(10_000));
        let after_failure = rep.score(&host(), Timestamp(10_000));
        assert!(after_failure < good);
        // Evidence fades towards the prior: after a year the score is near 500 again.
        let later = rep.score(&host(), Timestamp(10_000 + 365 * day));
        assert!((480..=520).contains(&later), "{later}");
        // Deterministic.
        let mut again = Reputation::new(ReputationConfig::default());
        for i in 0..10 {
            again.record(host(), HostEvent::LeaseSettled, Timestamp(i * 1000));
        }
        again.record(host(), HostEvent::HostFailure, Timestamp(10_000));
        assert_eq!(again.score(&host(), Timestamp(10_000)), after_failure);
    }

    #[test]
    fn the_order_events_arrive_in_does_not_matter() {
        let day = 86_400_000;
        let events = [
            (HostEvent::HostFailure, 0),
            (HostEvent::LeaseSettled, 60 * day),
            (HostEvent::ReceiptAcked, 30 * day),
        ];
        let mut forward = Reputation::new(ReputationConfig::default());
        let mut backward = Reputation::new(ReputationConfig::default());
        for (e, t) in events {
            forward.record(host(), e, Timestamp(t));
        }
        for (e, t) in events.iter().rev() {
            backward.record(host(), *e, Timestamp(*t));
        }
        let now = Timestamp(61 * day);
        assert_eq!(forward.score(&host(), now), backward.score(&host(), now));
    }

    #[test]
    fn a_failing_host_scores_low() {
        let mut rep = Reputation::new(ReputationConfig::default());
        for i in 0..5 {
            rep.record(host(), HostEvent::HostFailure, Timestamp(i));
            rep.record(host(), HostEvent::Uptime { online: false }, Timestamp(i));
        }
        assert!(rep.score(&host(), Timestamp(5)) < 50);
    }

    #[test]
    fn spot_buyers_see_the_share_of_spot_leases_a_host_preempted() {
        let mut rep = Reputation::new(ReputationConfig::default());
        assert_eq!(rep.interruption(&host(), Timestamp(0)), None);
        rep.record(host(), HostEvent::LeaseSettled, Timestamp(0));
        assert_eq!(rep.interruption(&host(), Timestamp(0)), None);
        for (i, preempted) in [true, false, false, true].into_iter().enumerate() {
            rep.record(
                host(),
                HostEvent::SpotEnded { preempted },
                Timestamp(i as u64),
            );
        }
        assert_eq!(rep.interruption(&host(), Timestamp(10)), Some(500));
        // A preemption is within the contract: the score does not fall for it.
        let before = rep.score(&host(), Timestamp(10));
        rep.record(
            host(),
            HostEvent::SpotEnded { preempted: true },
            Timestamp(10),
        );
        assert_eq!(rep.score(&host(), Timestamp(10)), before);
        assert_eq!(rep.interruption(&host(), Timestamp(10)), Some(600));
    }
}
