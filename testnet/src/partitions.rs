//! Partitions in an isolated testnet (`--partition`): links cut during the renting rounds
//! and healed later, one scenario at a time, each checked.
//!
//! - `host-renter`: a host is cut from the renter of a lease it runs, for longer than the
//!   acknowledgement grace. The host stops the lease when acknowledgements stop coming. Once
//!   the link heals the lease settles, and the host's unpaid work stays within one receipt
//!   interval plus the grace (plus 2 s), as on loopback.
//! - `ledger-minority`: one ledger member that does not lead is cut from every other node.
//!   The majority goes on applying writes, and once the link heals the member catches up:
//!   the members agree at the end.
//! - `renter-ledger`: a renter is cut from every ledger member. It rents on: its hosts
//!   relay its signed escrow locks to the ledger, so a renter need not reach the ledger to
//!   start a lease. Its leases settle like every other (what it sends the ledger itself,
//!   a release, waits for the heal), and it rents again after the heal.
//!
//! Scenarios start in that order, each once the one before has healed, and never while a
//! killed ledger leader is down (a cut member then would leave no majority).

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::harness::Node;
use crate::netns::Network;

/// A partition scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// A host cut from the renter of one of its leases.
    HostRenter,
    /// A ledger member that does not lead cut from everyone else.
    LedgerMinority,
    /// A renter cut from every ledger member.
    RenterLedger,
}

impl std::str::FromStr for Scenario {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host-renter" => Ok(Scenario::HostRenter),
            "ledger-minority" => Ok(Scenario::LedgerMinority),
            "renter-ledger" => Ok(Scenario::RenterLedger),
            other => Err(format!(
                "'{other}': the partitions are host-renter, ledger-minority and renter-ledger (or all)"
            )),
        }
    }
}

impl Scenario {
    /// Every scenario, in the order they run.
    pub const ALL: [Scenario; 3] = [
        Scenario::HostRenter,
        Scenario::LedgerMinority,
        Scenario::RenterLedger,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::HostRenter => "host-renter",
            Scenario::LedgerMinority => "ledger-minority",
            Scenario::RenterLedger => "renter-ledger",
        }
    }
}

/// One partition, as the report gives it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PartitionReport {
    /// Its scenario.
    pub scenario: String,
    /// The nodes cut from each other, `a|b` per link.
    pub cut: Vec<String>,
    /// When the cut began, seconds into the renting rounds.
    pub at_s: f64,
    /// How long the links stayed cut, seconds.
    pub held_s: f64,
    /// When the cut began and when it healed, UTC milliseconds (to tell which leases ran
    /// across it; `until_ms` 0 while it holds).
    pub from_ms: u64,
    /// See `from_ms`.
    pub until_ms: u64,
    /// host-renter: the lease running across the cut.
    pub lease: Option<String>,
    /// host-renter: how the host ended it.
    pub lease_end: Option<String>,
    /// host-renter: seconds of the lease's work the host was not paid for (bound: one
    /// receipt interval plus the acknowledgement grace, plus 2 s).
    pub unpaid_s: Option<u64>,
    /// ledger-minority: how long after the cut the majority applied a write (a probe
    /// credit), ms; none when it applied none.
    pub majority_write_ms: Option<u64>,
    /// ledger-minority: leases started while the links were cut; renter-ledger: leases the
    /// cut renter started meanwhile.
    pub leases_during: usize,
    /// renter-ledger: the cut renter's rents refused while cut (its hosts relay its locks:
    /// none is expected).
    pub rents_refused_during: usize,
    /// renter-ledger: whether the cut renter rented again after the heal.
    pub rented_after_heal: bool,
}

struct Active {
    scenario: Scenario,
    links: Vec<(String, String)>,
    since: Instant,
    until: Instant,
    index: usize,
    /// The renter cut off, when one is.
    renter: Option<String>,
    /// ledger-minority: whether the majority was probed with a write yet.
    probed: bool,
}

/// The run's partitions.
pub struct Partitions {
    queue: Vec<Scenario>,
    active: Option<Active>,
    /// Not before this: the first partition waits for the market to run.
    next_at: Instant,
    started: Instant,
    hold: Duration,
    /// What happened, in order.
    pub reports: Vec<PartitionReport>,
    /// The renter cut from the ledger, while it is and after (until it rents again).
    cut_renter: Option<(String, usize)>,
    /// A renter whose link healed a moment ago, and until when its rents may still fail.
    healing: Option<(String, Instant)>,
    /// Nodes no partition cuts (those behind NAT: their relay would carry a lease around
    /// the cut).
    exempt: std::collections::BTreeSet<String>,
}

impl Partitions {
    /// `scenarios` to run during renting rounds that started now; each link stays cut for
    /// `hold` (longer than the acknowledgement grace).
    pub fn new(mut scenarios: Vec<Scenario>, hold: Duration) -> Self {
        scenarios.sort();
        scenarios.dedup();
        scenarios.reverse();
        let now = Instant::now();
        Partitions {
            queue: scenarios,
            active: None,
            next_at: now + Duration::from_secs(2),
            started: now,
            hold,
            reports: Vec::new(),
            cut_renter: None,
            healing: None,
            exempt: Default::default(),
        }
    }

    /// Nodes the partitions leave alone.
    pub fn exempt(&mut self, hosts: impl IntoIterator<Item = String>) {
        self.exempt.extend(hosts);
    }

    /// Whether `renter`'s rents may fail now because it is cut from the ledger (or was,
    /// and has not rented since: its first rent after the heal may still meet a link that
    /// is coming back).
    pub fn excuses(&self, renter: &str) -> bool {
        let named = |r: &Option<String>| r.as_deref() == Some(renter);
        self.cut_renter.as_ref().is_some_and(|(r, _)| r == renter)
            || self.active.as_ref().is_some_and(|a| named(&a.renter))
            || self
                .healing
                .as_ref()
                .is_some_and(|(r, until)| r == renter && Instant::now() < *until)
    }

    /// Whether the renting rounds should go on past their time: a partition is running, or
    /// the renter cut from the ledger has not rented again yet.
    pub fn pending(&self) -> bool {
        self.active.is_some() || self.cut_renter.is_some() || !self.queue.is_empty()
    }

    /// A rent by `renter` came back (`ok`).
    pub fn rented(&mut self, renter: &str, ok: bool) {
        let Some((cut, index)) = self.cut_renter.clone() else {
            return;
        };
        let cutting = self
            .active
            .as_ref()
            .is_some_and(|a| a.scenario == Scenario::RenterLedger);
        let report = &mut self.reports[index];
        if ok {
            if cutting && cut == renter {
                report.leases_during += 1;
            } else if !cutting && cut == renter {
                report.rented_after_heal = true;
                self.cut_renter = None;
            }
        } else if cutting && cut == renter {
            report.rents_refused_during += 1;
        }
    }

    /// A lease started (for the scenarios that count them).
    pub fn lease_started(&mut self) {
        if let Some(a) = &self.active
            && a.scenario == Scenario::LedgerMinority
        {
            self.reports[a.index].leases_during += 1;
        }
    }

    /// Whether a partition is running now.
    pub fn busy(&self) -> bool {
        self.active.is_some()
    }

    /// Cuts or heals when it is time. `ledger_settled`: no killed ledger member is down.
    pub fn step(
        &mut self,
        net: &mut Network,
        nodes: &[Node],
        ledger_settled: bool,
        progress: &dyn Fn(&str),
    ) -> Vec<String> {
        let mut errors = Vec::new();
        if let Some(active) = &self.active
            && Instant::now() >= active.until
        {
            let active = self.active.take().expect("checked");
            for (a, b) in &active.links {
                if let Err(e) = net.heal(a, b) {
                    errors.push(format!("healing {a}|{b}: {e:#}"));
                }
            }
            self.reports[active.index].held_s = active.since.elapsed().as_secs_f64();
            self.reports[active.index].until_ms = utc_ms();
            if let Some(renter) = &active.renter {
                self.healing = Some((renter.clone(), Instant::now() + Duration::from_secs(10)));
            }
            progress(&format!(
                "partition {}: healed after {:.1} s",
                active.scenario.name(),
                active.since.elapsed().as_secs_f64()
            ));
            self.next_at = Instant::now() + Duration::from_secs(2);
        }
        // The majority applies writes while a member is cut off.
        if let Some(active) = self.active.as_mut()
            && active.scenario == Scenario::LedgerMinority
            && !active.probed
            && active.since.elapsed() >= Duration::from_secs(1)
        {
            active.probed = true;
            let n = nodes
                .iter()
                .take_while(|n| n.name.starts_with("ledger"))
                .count();
            match crate::ledgers::probe(&nodes[..n])
                .and_then(|p| crate::ledgers::mint(&nodes[..n], &p))
            {
                Ok(()) => {
                    let ms = active.since.elapsed().as_millis() as u64;
                    self.reports[active.index].majority_write_ms = Some(ms);
                }
                Err(e) => errors.push(format!(
                    "partition ledger-minority: the majority applied no write: {e:#}"
                )),
            }
        }
        if self.active.is_some() || Instant::now() < self.next_at {
            return errors;
        }
        let Some(&scenario) = self.queue.last() else {
            return errors;
        };
        // A member cut while another is down would leave no majority.
        if scenario == Scenario::LedgerMinority && !ledger_settled {
            return errors;
        }
        match self.start(scenario, net, nodes) {
            Ok(Some(started)) => {
                self.queue.pop();
                progress(&format!(
                    "partition {}: cut {}",
                    scenario.name(),
                    started.join(", ")
                ));
            }
            // Not possible yet (no lease running): tried again next round.
            Ok(None) => {}
            Err(e) => {
                self.queue.pop();
                errors.push(format!("partition {}: {e:#}", scenario.name()));
            }
        }
        errors
    }

    fn start(
        &mut self,
        scenario: Scenario,
        net: &mut Network,
        nodes: &[Node],
    ) -> anyhow::Result<Option<Vec<String>>> {
        let named = |prefix: &'static str| nodes.iter().filter(move |n| n.name.starts_with(prefix));
        let mut report = PartitionReport {
            scenario: scenario.name().into(),
            at_s: self.started.elapsed().as_secs_f64(),
            from_ms: utc_ms(),
            ..PartitionReport::default()
        };
        let mut renter_cut = None;
        let links: Vec<(String, String)> = match scenario {
            Scenario::HostRenter => {
                // A lease that started a moment ago: the cut outlasts the acknowledgement
                // grace before the lease's own end.
                let now_ms = utc_ms();
                let exempt = &self.exempt;
                let Some((host, renter, lease)) = named("host-")
                    .filter(|h| !exempt.contains(&h.name))
                    .find_map(|h| {
                        let lease = h.leases().into_iter().find(|l| {
                            l.role == gpux_api::Role::Host
                                && l.kind != "spot"
                                && l.finished_at.is_none()
                                && l.started_at
                                    .is_some_and(|s| now_ms.saturating_sub(s) <= 1500)
                        })?;
                        let renter = nodes
                            .iter()
                            .find(|n| n.peer == lease.renter && !exempt.contains(&n.name))?;
                        Some((h.name.clone(), renter.name.clone(), lease.lease))
                    })
                else {
                    return Ok(None);
                };
                report.lease = Some(lease);
                renter_cut = Some(renter.clone());
                vec![(host, renter)]
            }
            Scenario::LedgerMinority => {
                let members: Vec<&Node> = named("ledger-").collect();
                if members.len() < 3 {
                    bail!("needs a replicated ledger (--ledgers 3 or 5)");
                }
                let Some(leader) = crate::ledgers::leader(nodes) else {
                    return Ok(None);
                };
                // The last members first: the first is everyone's bootstrap and relay.
                let Some(member) = members.iter().rev().find(|m| m.name != nodes[leader].name)
                else {
                    return Ok(None);
                };
                nodes
                    .iter()
                    .filter(|n| n.name != member.name)
                    .map(|n| (member.name.clone(), n.name.clone()))
                    .collect()
            }
            Scenario::RenterLedger => {
                let renters: Vec<&Node> = named("renter-")
                    .filter(|n| !self.exempt.contains(&n.name))
                    .collect();
                let Some(renter) = renters.get(1).or(renters.first()) else {
                    bail!("needs a renter");
                };
                self.cut_renter = Some((renter.name.clone(), self.reports.len()));
                renter_cut = Some(renter.name.clone());
                named("ledger")
                    .map(|m| (renter.name.clone(), m.name.clone()))
                    .collect()
            }
        };
        let mut done: Vec<(String, String)> = Vec::new();
        for (a, b) in &links {
            if let Err(e) = net.cut(a, b) {
                for (x, y) in &done {
                    let _ = net.heal(x, y);
                }
                return Err(e);
            }
            done.push((a.clone(), b.clone()));
        }
        report.cut = links.iter().map(|(a, b)| format!("{a}|{b}")).collect();
        let names = report.cut.clone();
        self.active = Some(Active {
            scenario,
            links,
            since: Instant::now(),
            until: Instant::now() + self.hold,
            index: self.reports.len(),
            renter: renter_cut,
            probed: false,
        });
        self.reports.push(report);
        Ok(Some(names))
    }

    /// Heals whatever is still cut (the run is ending) and names the scenarios that never
    /// ran.
    pub fn finish(&mut self, net: &mut Network) -> Vec<String> {
        let mut errors = Vec::new();
        if let Some(active) = self.active.take() {
            for (a, b) in &active.links {
                let _ = net.heal(a, b);
            }
            self.reports[active.index].held_s = active.since.elapsed().as_secs_f64();
            self.reports[active.index].until_ms = utc_ms();
        }
        for scenario in self.queue.drain(..) {
            errors.push(format!(
                "partition {} never ran: the renting rounds were too short (a longer --duration)",
                scenario.name()
            ));
        }
        errors
    }

    /// The checks once every lease has settled: the host-renter lease's end and unpaid
    /// work (bound: `bound_s`), the cut renter renting again.
    pub fn check(&mut self, hosts: &[&Node], bound_s: u64) -> Vec<String> {
        let mut errors = Vec::new();
        for report in &mut self.reports {
            match report.scenario.as_str() {
                "host-renter" => {
                    let Some(id) = &report.lease else { continue };
                    let Some(l) = hosts
                        .iter()
                        .flat_map(|h| h.leases())
                        .find(|l| &l.lease == id && l.role == gpux_api::Role::Host)
                    else {
                        errors.push(format!("partition host-renter: no host knows lease {id}"));
                        continue;
                    };
                    report.lease_end = l.end.clone();
                    let ran_s = match (l.started_at, l.finished_at) {
                        (Some(s), Some(f)) => f.saturating_sub(s) / 1000,
                        _ => 0,
                    };
                    let per_second =
                        (l.price_per_gpu_hour_micro * l.gpus.len() as u64 / 3600).max(1);
                    let unpaid = ran_s.saturating_sub(l.redeemed / per_second);
                    report.unpaid_s = Some(unpaid);
                    if !l.settled {
                        errors.push(format!("partition host-renter: lease {id} did not settle"));
                    }
                    if unpaid > bound_s {
                        errors.push(format!(
                            "partition host-renter: lease {id} left {unpaid} s of {ran_s} s unpaid (bound {bound_s} s)"
                        ));
                    }
                }
                "renter-ledger" if !report.rented_after_heal => errors.push(
                    "partition renter-ledger: the renter did not rent again after the heal".into(),
                ),
                _ => {}
            }
        }
        errors
    }
}

/// Now, UTC milliseconds (as the nodes' lease records give times).
fn utc_ms() -> u64 {
    gpux_node::attest::now().0
}
