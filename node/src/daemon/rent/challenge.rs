//! A rent with `--challenge`: the lease is agreed held, the renter's node challenges the
//! leased GPUs (`crate::plane::challenge`), and only a host that passes gets the commit; one
//! that fails is told so and paid nothing, and the next offer is tried.

use gpux_api::{ChallengePassed, Rented};
use gpux_protocol::{ContentId, PublicKey, RejectReason};

use super::{Refusal, RentTask};
use crate::daemon::{LeaseAct, act};
use crate::plane::challenge::{self, ChallengeFailure};

impl RentTask {
    /// Challenges the held lease `rented` on `host` against `reference_gops`: committed
    /// when it passes (and the renter asked for no hold of its own), ended otherwise.
    pub(super) async fn challenge_held(
        &self,
        rented: Rented,
        host: PublicKey,
        reference_gops: Option<f64>,
    ) -> Result<Rented, Refusal> {
        let lease: ContentId = rented
            .lease
            .parse()
            .map_err(|e| Refusal::Refused(format!("{e}"), None))?;
        let peer = host.peer_id();
        let refused = |why: String| Refusal::Refused(why, Some(RejectReason::Invalid));
        let Some(reference) = reference_gops else {
            let _ = act(&self.events, lease, LeaseAct::Stop).await;
            return Err(refused(format!(
                "{peer}: no challenge reference rate is known for its GPU model"
            )));
        };
        match challenge::run(&self.net, &self.key, host, lease, reference).await {
            Ok(measured) => {
                let passed = ChallengePassed {
                    n: measured.n,
                    achieved_gops: measured.achieved_gops,
                    reference_gops: measured.reference_gops,
                    round_trip_ms: measured.round_trip.as_secs_f64() * 1000.0,
                };
                tracing::info!(
                    "lease {}: {peer} passed the challenge ({:.2} of {:.2} Gop/s, n = {})",
                    lease.short(),
                    passed.achieved_gops,
                    passed.reference_gops,
                    passed.n
                );
                // A hold the renter asked for itself stays its to commit.
                if !self.workload.held_by_renter() {
                    act(&self.events, lease, LeaseAct::Commit)
                        .await
                        .map_err(|e| Refusal::NotStarted(e.message))?;
                }
                Ok(Rented {
                    commit_by_ms: rented
                        .commit_by_ms
                        .filter(|_| self.workload.held_by_renter()),
                    challenge: Some(passed),
                    ..rented
                })
            }
            Err(ChallengeFailure::Failed(why)) => {
                tracing::warn!(
                    "lease {}: {peer} failed the challenge: {why}",
                    lease.short()
                );
                let _ = act(&self.events, lease, LeaseAct::FailChallenge).await;
                Err(refused(format!(
                    "{peer} failed the performance challenge ({why}); it is paid nothing"
                )))
            }
            Err(ChallengeFailure::NotRun(why)) => {
                let _ = act(&self.events, lease, LeaseAct::Stop).await;
                Err(refused(format!(
                    "{peer}: the challenge did not run ({why})"
                )))
            }
        }
    }
}
