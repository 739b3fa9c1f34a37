//! How the market's events move the machines: each event is an input to a host's or a
//! renter's lease or to the ledger, and each machine's effects become later events.

use std::time::Instant;

use gpux_lease::{
    Answer, HostEffect, HostInput, HostPhase, LedgerCall, LedgerVerdict, LockOutcome, RentReport,
    RenterAnswer, RenterEffect, RenterInput, RenterLease, RenterPhase, UsageSample,
};
use gpux_protocol::{AnySigned, AnyVerified, LeaseAccept, Signed, Timestamp};
use rand::Rng;

use super::{Container, ERASE_MS, Ev, Lease, Market, SAMPLE_MS, START_MS, STOP_MS, T0};

impl Market {
    pub(super) fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Look {
                renter,
                attempt,
                since,
            } => self.look(renter, attempt, since),
            Ev::RequestAtHost {
                renter,
                host,
                request,
                attempt,
                since,
            } => {
                let now = Timestamp(self.now);
                let answer =
                    self.hosts[host as usize]
                        .book
                        .handle_request(*request.clone(), now, false);
                match answer {
                    Answer::Accepted {
                        lease,
                        effects,
                        envelope,
                        ..
                    } => {
                        if attempt == 0 {
                            self.figures.found_first += 1;
                        }
                        self.figures.found += 1;
                        let index = self.leases.len() as u32;
                        self.leases.push(Lease {
                            host,
                            renter,
                            id: request.id(),
                            h: Some(*lease),
                            r: None,
                            container: Container::default(),
                            first_try_at: since,
                            renter_done: false,
                        });
                        self.booking_changed(host as usize);
                        self.host_effects(index, effects);
                        let d = self.link();
                        self.at(
                            d,
                            Ev::AcceptAtRenter {
                                lease: index,
                                request,
                                envelope,
                            },
                        );
                    }
                    Answer::Rejected { .. } => {
                        self.figures.refused += 1;
                        // The refusal comes back; the renter asks another host.
                        let d = 2 * self.link();
                        if attempt + 1 < self.params.attempts {
                            self.at(
                                d,
                                Ev::Look {
                                    renter,
                                    attempt: attempt + 1,
                                    since,
                                },
                            );
                        } else {
                            let think = self.think();
                            self.at(
                                d + think,
                                Ev::Look {
                                    renter,
                                    attempt: 0,
                                    since: self.now + d + think,
                                },
                            );
                        }
                    }
                }
            }
            Ev::AcceptAtRenter {
                lease,
                request,
                envelope,
            } => {
                let Ok(accept) =
                    Signed::<LeaseAccept>::from_bytes(envelope).and_then(Signed::verify)
                else {
                    return;
                };
                let r = self.leases[lease as usize].renter as usize;
                let key = self.renters[r].key.clone();
                let now = Timestamp(self.now);
                if let Ok((renter, effects)) =
                    RenterLease::accepted(key, *request, &accept, self.ledger_key, now)
                {
                    self.leases[lease as usize].r = Some(renter);
                    self.renter_effects(lease, effects);
                }
            }
            Ev::HostIn { lease, input } => self.host_in(lease, input),
            Ev::RenterIn { lease, input } => self.renter_in(lease, input),
            Ev::ReceiptAtRenter {
                lease,
                seq,
                envelope,
            } => {
                let Ok(AnyVerified::UsageReceipt(receipt)) =
                    AnySigned::from_bytes(envelope).and_then(AnySigned::verify)
                else {
                    return;
                };
                let effects = self.renter_handle(lease, RenterInput::Receipt(receipt));
                let answer = effects
                    .iter()
                    .find_map(|e| match e {
                        RenterEffect::Respond { envelope } => Some(renter_answer(envelope)),
                        _ => None,
                    })
                    .unwrap_or(RenterAnswer::Nothing);
                self.renter_effects(lease, effects);
                let d = self.link();
                self.at(
                    d,
                    Ev::HostIn {
                        lease,
                        input: HostInput::ReceiptAnswer { seq, answer },
                    },
                );
            }
            Ev::LockAtHost { lease, envelope } => {
                if let Ok(AnyVerified::EscrowLock(lock)) =
                    AnySigned::from_bytes(envelope).and_then(AnySigned::verify)
                {
                    self.host_in(lease, HostInput::Lock(lock));
                }
            }
            Ev::EndAt {
                lease,
                to_host,
                envelope,
            } => match AnySigned::from_bytes(envelope).and_then(AnySigned::verify) {
                Ok(AnyVerified::LeaseEnd(end)) if to_host => {
                    self.host_in(lease, HostInput::RenterEnd(end))
                }
                Ok(AnyVerified::LeaseEnd(end)) => self.renter_in(lease, RenterInput::HostEnd(end)),
                Ok(AnyVerified::PreemptionNotice(n)) => {
                    self.renter_in(lease, RenterInput::Notice(n))
                }
                Ok(AnyVerified::LeaseCommit(c)) => self.host_in(lease, HostInput::Commit(c)),
                _ => {}
            },
            Ev::LedgerAt {
                lease,
                from_host,
                call,
                envelope,
            } => {
                let started = Instant::now();
                let out = self.ledger.submit(Timestamp(self.now), envelope);
                self.ledger_time += started.elapsed();
                if let gpux_protocol::ledger_wire::LedgerResponse::Record(_) = &out.response {
                    let kind = match call {
                        LedgerCall::Lock => "lock",
                        LedgerCall::Redeem { .. } => "redeem",
                        LedgerCall::Release => "release",
                    };
                    *self.figures.ledger_ops.entry(kind.to_string()).or_default() += 1;
                    *self
                        .ops_per_minute
                        .entry((self.now - T0) / 60_000)
                        .or_default() += 1;
                }
                let verdict = LedgerVerdict::from_response(out.response, &[self.ledger_key]);
                let d = self.link();
                if from_host {
                    self.at(
                        d,
                        Ev::HostIn {
                            lease,
                            input: HostInput::Ledger { call, verdict },
                        },
                    );
                } else {
                    self.at(
                        d,
                        Ev::RenterIn {
                            lease,
                            input: RenterInput::Ledger { call, verdict },
                        },
                    );
                }
            }
            Ev::ContainerUp { lease } => {
                let now = self.now;
                let l = &mut self.leases[lease as usize];
                if l.container.started_at.is_some() {
                    return;
                }
                l.container.started_at = Some(now);
                self.host_in(
                    lease,
                    HostInput::ContainerStarted {
                        started_at: Timestamp(now),
                    },
                );
                self.at(SAMPLE_MS, Ev::Sample { lease });
            }
            Ev::Sample { lease } => {
                let l = &self.leases[lease as usize];
                if l.h.is_none() || l.container.finished_at.is_some() {
                    return;
                }
                let sample = UsageSample {
                    memory_bytes: 1 << 28,
                    cpu_total_ns: (self.now - T0) * 1_000_000,
                    gpu_util_permille: Some(900),
                    gpu_memory_bytes: Some(1 << 30),
                };
                self.host_in(lease, HostInput::Sample(sample));
                self.at(SAMPLE_MS, Ev::Sample { lease });
            }
        }
    }

    fn think(&mut self) -> u64 {
        // Exponential, by inversion.
        let u: f64 = self.rng.random_range(1e-9..1.0);
        (-u.ln() * self.params.think_mean_s as f64 * 1000.0) as u64
    }

    fn host_in(&mut self, lease: u32, input: HostInput) {
        let now = Timestamp(self.now);
        let Some(h) = self.leases[lease as usize].h.as_mut() else {
            return;
        };
        let effects = h.handle(now, input);
        let settled = h.phase() == HostPhase::Settled;
        self.host_effects(lease, effects);
        if settled {
            self.leases[lease as usize].h = None;
            self.figures.settled += 1;
        }
    }

    fn renter_handle(&mut self, lease: u32, input: RenterInput) -> Vec<RenterEffect> {
        let now = Timestamp(self.now);
        match self.leases[lease as usize].r.as_mut() {
            Some(r) => r.handle(now, input),
            None => Vec::new(),
        }
    }

    fn renter_in(&mut self, lease: u32, input: RenterInput) {
        let effects = self.renter_handle(lease, input);
        self.renter_effects(lease, effects);
    }

    fn host_effects(&mut self, lease: u32, effects: Vec<HostEffect>) {
        for effect in effects {
            match effect {
                HostEffect::Ledger { call, envelope } => {
                    let d = self.link();
                    self.at(
                        d,
                        Ev::LedgerAt {
                            lease,
                            from_host: true,
                            call,
                            envelope,
                        },
                    );
                }
                HostEffect::AnswerLock { envelope, .. } => {
                    let outcome = match AnySigned::from_bytes(envelope).and_then(AnySigned::verify)
                    {
                        Ok(AnyVerified::LedgerRecord(r)) => LockOutcome::Record(Box::new(r)),
                        Ok(AnyVerified::LeaseReject(r)) => LockOutcome::Rejected(Box::new(r)),
                        _ => LockOutcome::Unanswered,
                    };
                    let d = self.link();
                    self.at(
                        d,
                        Ev::RenterIn {
                            lease,
                            input: RenterInput::Lock(outcome),
                        },
                    );
                }
                HostEffect::StartContainer => self.at(START_MS, Ev::ContainerUp { lease }),
                HostEffect::StopContainer { .. } => {
                    let now = self.now;
                    let c = &mut self.leases[lease as usize].container;
                    let was_running = c.started_at.is_some() && c.finished_at.is_none();
                    if was_running {
                        c.finished_at = Some(now + STOP_MS);
                    }
                    let input = HostInput::ContainerExited {
                        finished_at: c.finished_at.map(Timestamp),
                        exit_code: was_running.then_some(137),
                    };
                    self.at(STOP_MS, Ev::HostIn { lease, input });
                }
                HostEffect::EraseContainer => self.at(
                    ERASE_MS,
                    Ev::HostIn {
                        lease,
                        input: HostInput::ContainerErased,
                    },
                ),
                HostEffect::SendReceipt { seq, envelope } => {
                    self.figures.receipts += 1;
                    let d = self.link();
                    self.at(
                        d,
                        Ev::ReceiptAtRenter {
                            lease,
                            seq,
                            envelope,
                        },
                    );
                }
                HostEffect::SendEnd { envelope } | HostEffect::Notify { envelope, .. } => {
                    let d = self.link();
                    self.at(
                        d,
                        Ev::EndAt {
                            lease,
                            to_host: false,
                            envelope,
                        },
                    );
                }
                HostEffect::Schedule { at, timer } => {
                    let d = at.0.saturating_sub(self.now);
                    self.at(
                        d,
                        Ev::HostIn {
                            lease,
                            input: HostInput::Timer(timer),
                        },
                    );
                }
                HostEffect::FreeGpus => {
                    let (h, id) = {
                        let l = &self.leases[lease as usize];
                        (l.host as usize, l.id)
                    };
                    self.hosts[h].book.release(&id);
                    self.booking_changed(h);
                }
                HostEffect::Persist
                | HostEffect::PrepareWorkspace
                | HostEffect::PreemptSpot { .. } => {}
            }
        }
    }

    fn renter_effects(&mut self, lease: u32, effects: Vec<RenterEffect>) {
        for effect in effects {
            match effect {
                RenterEffect::SendLock { envelope } => {
                    let d = self.link();
                    self.at(d, Ev::LockAtHost { lease, envelope });
                }
                RenterEffect::SendEnd { envelope } | RenterEffect::SendCommit { envelope } => {
                    let d = self.link();
                    self.at(
                        d,
                        Ev::EndAt {
                            lease,
                            to_host: true,
                            envelope,
                        },
                    );
                }
                RenterEffect::Ledger { call, envelope } => {
                    let d = self.link();
                    self.at(
                        d,
                        Ev::LedgerAt {
                            lease,
                            from_host: false,
                            call,
                            envelope,
                        },
                    );
                }
                RenterEffect::Schedule { at, timer } => {
                    let d = at.0.saturating_sub(self.now);
                    self.at(
                        d,
                        Ev::RenterIn {
                            lease,
                            input: RenterInput::Timer(timer),
                        },
                    );
                }
                RenterEffect::Report(RentReport::Running) => {
                    self.figures.running += 1;
                    let since = self.leases[lease as usize].first_try_at;
                    self.to_running.push(self.now - since);
                }
                RenterEffect::Report(RentReport::Failed { .. }) => self.renter_moves_on(lease),
                RenterEffect::Persist | RenterEffect::Respond { .. } | RenterEffect::Report(_) => {}
            }
        }
        let phase = self.leases[lease as usize]
            .r
            .as_ref()
            .map(RenterLease::phase);
        if matches!(phase, Some(RenterPhase::Ended | RenterPhase::Settled)) {
            self.renter_moves_on(lease);
        }
        if phase == Some(RenterPhase::Settled) {
            self.leases[lease as usize].r = None;
        }
    }

    /// The renter's lease is over (or failed): it rents again after a pause.
    fn renter_moves_on(&mut self, lease: u32) {
        let l = &mut self.leases[lease as usize];
        if l.renter_done {
            return;
        }
        l.renter_done = true;
        let renter = l.renter;
        self.figures.ended += 1;
        let think = self.think();
        let since = self.now + think;
        self.at(
            think,
            Ev::Look {
                renter,
                attempt: 0,
                since,
            },
        );
    }
}

fn renter_answer(envelope: &[u8]) -> RenterAnswer {
    match AnySigned::from_bytes(envelope.to_vec()).and_then(AnySigned::verify) {
        Ok(AnyVerified::ReceiptAck(a)) => RenterAnswer::Ack(a),
        Ok(AnyVerified::LeaseEnd(e)) => RenterAnswer::Dispute(e),
        _ => RenterAnswer::Nothing,
    }
}
