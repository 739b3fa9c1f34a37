//! Re-challenges (`gpux rent --challenge-every 6h`): the renter's node challenges a running
//! lease's GPUs again at random times, about that far apart, as `gpux challenge LEASE`
//! does (the host pauses the work while it proves; a host that fails ends the lease). A
//! host cannot tell when the next one comes, so it cannot keep a fast GPU in reserve for
//! the challenges. Each costs at most 1% of the time it covers: the interval is widened to
//! a hundred times what a challenge of the model takes at its reference.

use std::time::{Duration, Instant};

use gpux_api::Rented;
use gpux_protocol::ContentId;

use super::RentTask;
use crate::daemon::{Daemon, Event, report};
use crate::plane::challenge::{Reference, expected_time};

/// A re-challenge costs at most this share of the time it covers.
const MAX_SHARE: f64 = 0.01;

/// How often a lease of `reference`'s model is challenged again when the renter asked for
/// `every`: at least a hundred times what one challenge takes at the reference.
pub(crate) fn widened(every: Duration, reference: &Reference) -> Duration {
    every.max(expected_time(reference).div_f64(MAX_SHARE))
}

/// The wait before the next re-challenge: uniform in `[every / 2, 3 every / 2)`, drawn from
/// `coin` (a uniform `u64`), so that the average is `every` and the time unpredictable.
pub(crate) fn next_wait(every: Duration, coin: u64) -> Duration {
    let unit = coin as f64 / u64::MAX as f64;
    every.mul_f64(0.5 + unit.min(0.999_999))
}

fn coin() -> u64 {
    let mut b = [0u8; 8];
    // Without randomness the waits are still spread (the middle): a re-challenge still comes.
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

/// Leases to challenge again: how often, and when next.
#[derive(Debug, Default)]
pub(crate) struct Rechallenges {
    due: std::collections::BTreeMap<ContentId, (Duration, Instant)>,
}

impl Rechallenges {
    /// Challenges `lease` again about every `every`, from now.
    pub(crate) fn add(&mut self, lease: ContentId, every: Duration) {
        let next = Instant::now() + next_wait(every, coin());
        self.due.insert(lease, (every, next));
    }

    /// The leases due now, each given its next time.
    fn take_due(&mut self, now: Instant) -> Vec<ContentId> {
        let mut due = Vec::new();
        for (lease, (every, next)) in &mut self.due {
            if *next <= now {
                due.push(*lease);
                *next = now + next_wait(*every, coin());
            }
        }
        due
    }

    fn forget(&mut self, lease: &ContentId) {
        self.due.remove(lease);
    }
}

impl RentTask {
    /// `rented`, with re-challenges scheduled when the renter asked for them and a reference
    /// is known for the model.
    pub(super) async fn rechallenged(
        &self,
        mut rented: Rented,
        reference: Option<Reference>,
    ) -> Rented {
        let (Some(every), Some(reference)) = (self.workload.challenge_every, reference) else {
            if self.workload.challenge_every.is_some() {
                tracing::warn!(
                    "lease {}: no challenge reference is known for its model: it is not challenged again",
                    rented.lease
                );
            }
            return rented;
        };
        let Ok(lease) = rented.lease.parse::<ContentId>() else {
            return rented;
        };
        let every = widened(every, &reference);
        report(&self.events, Event::Rechallenge { lease, every }).await;
        rented.challenge_every_s = Some(every.as_secs().max(1));
        rented
    }
}

impl Daemon {
    /// Challenges again each lease whose time has come (a lease no longer running here is
    /// forgotten); a failure ends the lease as `gpux challenge` does.
    pub(crate) fn rechallenge_if_due(&mut self) {
        for lease in self.rechallenges.take_due(Instant::now()) {
            if self.renter.running_lease(&lease).is_none() {
                self.rechallenges.forget(&lease);
                continue;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.challenge_running(lease, tx);
            tokio::spawn(async move {
                match rx.await {
                    Ok(Ok(passed)) => tracing::info!(
                        "lease {}: passed a re-challenge ({:.2} of {:.2} Gop/s)",
                        lease.short(),
                        passed.achieved_gops,
                        passed.reference_gops
                    ),
                    Ok(Err(e)) => {
                        tracing::warn!("lease {}: re-challenge: {}", lease.short(), e.message)
                    }
                    Err(_) => {}
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn re_challenges_cost_at_most_a_hundredth_and_come_unpredictably() {
        let reference = Reference {
            gops: 1.0,
            gbs: Some(0.1),
            fill_bytes: 36_000_000,
        };
        let one = expected_time(&reference);
        assert!(one > Duration::from_millis(250), "{one:?}");
        // Too often is widened to a hundred challenges' time; seldom enough is kept.
        assert_eq!(
            widened(Duration::from_secs(1), &reference),
            one.mul_f64(100.0)
        );
        assert_eq!(
            widened(Duration::from_secs(21_600), &reference),
            Duration::from_secs(21_600)
        );
        // Waits spread over [every/2, 3 every/2), the middle on average.
        let every = Duration::from_secs(100);
        assert_eq!(next_wait(every, 0), Duration::from_secs(50));
        assert!(next_wait(every, u64::MAX) < Duration::from_secs(150));
        assert!(next_wait(every, u64::MAX) > Duration::from_secs(149));
        let mean = (0..1000u64)
            .map(|i| next_wait(every, i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).as_secs_f64())
            .sum::<f64>()
            / 1000.0;
        assert!((mean - 100.0).abs() < 3.0, "{mean}");
        // Due leases are taken once and rescheduled.
        let mut r = Rechallenges::default();
        let lease = ContentId([1; 32]);
        r.add(lease, Duration::ZERO);
        let now = Instant::now();
        assert_eq!(r.take_due(now), vec![lease]);
        r.due.insert(lease, (every, now + every));
        assert!(r.take_due(now).is_empty());
    }
}
