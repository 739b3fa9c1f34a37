//! Which image a rent runs, and how it gets to the host: the renter's own, staged from its
//! Docker; one in a registry, pulled by the host (pinned to the digest the renter's Docker
//! knows it by, when it has it from that registry); or one the host lists itself.

use gpux_api::{ApiError, ErrorCode, PulledImage, RentProgress};
use gpux_market::BidSpec;
use gpux_market::query::Query;
use gpux_protocol::plane_wire::{PullFailure, PullStatus};
use gpux_protocol::{ImageDigest, PublicKey, Pulls};

use super::{ImageChoice, RentTask};
use crate::plane::pull::{ImageRef, PullRefusal, pull_on};

/// An image the host pulled for this rent.
pub(super) struct Pulled {
    pub(super) image: ImageDigest,
    pub(super) view: PulledImage,
}

/// Why a pull on one host gave no image.
pub(super) enum PullOutcome {
    /// Try the next host (this one is busy, refuses the registry, timed out...).
    Next(String),
    /// No host will do better: the registry refused the credentials, or has no such image.
    Stop(ApiError),
}

impl RentTask {
    /// Settles what `--image NAME` means: an image this node's Docker has is the renter's
    /// own, staged (or, when Docker has it from a registry, pulled by the host at that exact
    /// digest: the host's link is usually the faster); a name it lacks is an image in a
    /// registry (or one a host lists under that name).
    pub(super) async fn resolve_image(&mut self) -> Result<(), ApiError> {
        let ImageChoice::Local(named) = &self.image else {
            return Ok(());
        };
        let named = named.clone();
        let local = match crate::executor::Executor::connect(&self.key.peer_id().to_string()).await
        {
            Ok(docker) => docker.image_origin(&named).await.ok().flatten(),
            Err(_) => None,
        };
        let bad = |e: String| ApiError::bad_input(format!("--image {named}: {e}"));
        match local {
            Some((_, repo_digests)) => {
                let Ok(reference) = named.parse::<ImageRef>() else {
                    // An id or a name Docker has that is no registry reference: staged.
                    return Ok(());
                };
                let pinned = repo_digests.iter().find_map(|d| {
                    let from: ImageRef = d.parse().ok()?;
                    let digest = d.split_once('@')?.1;
                    from.same_repository(&reference)
                        .then(|| reference.at_digest(digest).ok())
                        .flatten()
                });
                if let Some(pinned) = pinned {
                    self.image = ImageChoice::Registry {
                        reference: pinned,
                        named,
                    };
                }
            }
            None => {
                let reference: ImageRef = named.parse().map_err(bad)?;
                self.image = ImageChoice::Registry { reference, named };
            }
        }
        Ok(())
    }

    /// The markets a rent looks in, in turn: for a registry's image, the hosts that list it
    /// or have it cached, then any host that pulls; otherwise the one asked for.
    pub(super) fn phases(&self) -> Result<Vec<BidSpec>, ApiError> {
        let ImageChoice::Registry { reference, named } = &self.image else {
            return Ok(vec![self.spec.clone()]);
        };
        let with = |text: String| -> Result<BidSpec, ApiError> {
            let extra = Query::parse(&text).map_err(|e| ApiError::bad_input(e.to_string()))?;
            let mut spec = self.spec.clone();
            spec.query.clauses.extend(extra.clauses);
            Ok(spec)
        };
        let mut names = vec![named.clone(), reference.short()];
        names.retain(|n| gpux_protocol::is_image_tag(n));
        names.dedup();
        let mut phases = Vec::new();
        if !names.is_empty() {
            phases.push(with(format!("image in [{}]", names.join(",")))?);
        }
        phases.push(with("pull>0".into())?);
        Ok(phases)
    }

    /// Has `host` pull `reference` and hold it for this node, showing the progress.
    pub(super) async fn pull(
        &self,
        host: PublicKey,
        reference: &ImageRef,
        pulls: &Pulls,
    ) -> Result<Pulled, PullOutcome> {
        if !pulls.allows(reference.registry()) {
            return Err(PullOutcome::Next(format!(
                "it does not pull from {}",
                reference.registry()
            )));
        }
        let peer = libp2p::PeerId::from_bytes(&host.peer_id().to_bytes())
            .map_err(|e| PullOutcome::Next(e.to_string()))?;
        let shown = reference.short();
        let progress = |status: &PullStatus| {
            if let PullStatus::Progress {
                done,
                total,
                layers_done,
                layers,
            } = *status
            {
                self.progress.set(RentProgress {
                    phase: "pulling".into(),
                    host: Some(host.peer_id().to_string()),
                    image: Some(shown.clone()),
                    done,
                    total,
                    layers_done,
                    layers,
                });
            }
        };
        progress(&PullStatus::Progress {
            done: 0,
            total: 0,
            layers_done: 0,
            layers: 0,
        });
        #[allow(clippy::disallowed_methods)] // (shown to the renter, never asserted)
        let started = std::time::Instant::now();
        match pull_on(&self.net, peer, reference, self.auth.clone(), progress).await {
            Ok(p) => Ok(Pulled {
                image: p.image,
                view: PulledImage {
                    reference: shown,
                    bytes: p.bytes,
                    warm: p.warm,
                    pull_ms: started.elapsed().as_millis() as u64,
                },
            }),
            Err(PullRefusal::Refused(PullFailure::Unauthorized, why)) => Err(PullOutcome::Stop(
                ApiError::new(ErrorCode::ImageRefused, why).with_hint(
                    "give the registry's user and password: --registry-user USER with \
                         GPUX_REGISTRY_PASSWORD or --registry-password-stdin (or `docker login` \
                         on this machine); nothing was charged",
                ),
            )),
            Err(PullRefusal::Refused(PullFailure::NotFound | PullFailure::Malformed, why)) => {
                Err(PullOutcome::Stop(
                    ApiError::new(ErrorCode::ImageRefused, why)
                        .with_hint("check the image's name and tag; nothing was charged"),
                ))
            }
            Err(refusal) => Err(PullOutcome::Next(format!("pulling {shown}: {refusal}"))),
        }
    }
}
