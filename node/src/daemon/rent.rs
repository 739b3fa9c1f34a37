//! Getting a lease, renter side: match locally, skipping hosts this node has backed off or
//! blocked; probe a round of the best candidates' reachability at once (a dial by peer id,
//! at the addresses identify and kademlia learned, never at an address an offer names;
//! hosts that served this renter or passed a challenge always in the round, fresh keys from
//! a burst last: [`rank`]); send the lease request to the reachable ones one at a time, in
//! the round's order, so two hosts' GPUs are never held; and once a host accepts, hand the lease to its machine
//! ([`gpux_lease::RenterLease`]), which locks the escrow through the host and says how the
//! start came out. A host that cannot be dialled, times out or refuses without a typed reason
//! is backed off ([`super::reach`]).
//!
//! Which host is asked next, what is claimed and released, and how the rent comes out are
//! the pure [`gpux_lease::RentSearch`]'s rules (a rent never holds two hosts' GPUs);
//! `search.rs` does what it says.

use std::collections::BTreeSet;

use gpux_api::{ApiError, ErrorCode, RentRequest, Rented};
use gpux_lease::RentReport;
use gpux_market::{Allocation, BidSpec};
use gpux_protocol::{
    BoundedString, EnvVar, ImageDigest, Keypair, LeaseAccept, LeaseRequest, MicroCredits,
    RejectReason, Verified,
};
use tokio::sync::{mpsc, oneshot};

use super::Event;
use crate::p2p::Client;

/// Candidates probed at once in one round (see [`rank`] for which).
const CANDIDATES: usize = 8;
/// Rounds before a rent gives up.
const MAX_ROUNDS: usize = 5;
/// How long a candidate has to be reached.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// Offers looked at to find one round's candidates, at most.
const MAX_SCAN: usize = 256;

/// One candidate offer.
pub(crate) struct Candidate {
    /// What the lease would take.
    pub(crate) allocation: Allocation,
    /// The image its offer lists under the tag asked for, else its first.
    pub(crate) image: Option<ImageDigest>,
    /// Its price of a kept workspace per GiB-hour, and the longest it keeps one.
    pub(crate) retention: (MicroCredits, Option<u64>),
    /// Its cancellation fees for a reserved window (a committed window signs them).
    pub(crate) cancel_fees: gpux_protocol::CancelFees,
    /// The performance challenge's reference rate of its model, Gop/s (none known: the
    /// offer cannot be challenged).
    pub(crate) reference: Option<crate::plane::challenge::Reference>,
    /// What of the host's machine goes with each GPU.
    pub(crate) share: gpux_protocol::Share,
    /// What the host pulls from registries, and has cached.
    pub(crate) pulls: gpux_protocol::Pulls,
}

mod ask;
mod challenge;
mod image;
mod in_loop;
mod progress;
mod rank;
pub(crate) mod rechallenge;
mod request;
mod search;
mod terms;
pub(crate) use progress::{ProgressBoard, ProgressSlot, valid_name};
pub(crate) use request::{Resources, carried, parse};

/// Times a broken staging is tried again on the same host (it goes on from what arrived).
const STAGE_ATTEMPTS: usize = 3;

/// Which image a rent runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum ImageChoice {
    /// The first image the offer lists.
    #[default]
    Any,
    /// One the host lists, by digest.
    Host(ImageDigest),
    /// An image in this node's Docker, by reference: staged on the host.
    Local(String),
    /// A `docker save` archive: staged on the host.
    Archive(std::path::PathBuf),
    /// An image in a registry: the host pulls it (with the registry's credentials when
    /// given), unless it lists an image under that name itself.
    Registry {
        /// As Docker reads it.
        reference: crate::plane::pull::ImageRef,
        /// As the renter named it (hosts list their own images under such names).
        named: String,
    },
}

/// A renter's image ready to stage: its archive, indexed.
struct Staging {
    archive: crate::plane::stage::Archive,
    /// The archive was saved from Docker for this rent: removed after it.
    saved: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.saved {
            let _ = std::fs::remove_file(&self.archive.path);
        }
    }
}

/// A rent's request to the loop.
pub(crate) enum RentEvent {
    /// Up to `n` best offers for `spec` outside `excluded`, of distinct hosts that are not
    /// backed off or blocked.
    Candidates {
        spec: BidSpec,
        excluded: BTreeSet<gpux_protocol::ContentId>,
        n: usize,
        /// Each candidate's image is the one its offer lists under this tag (else its first).
        tag: Option<String>,
        /// Hosts left out (a group's members go to hosts of their own).
        avoid: BTreeSet<gpux_protocol::PublicKey>,
        reply: oneshot::Sender<Vec<Candidate>>,
    },
    /// A host was reached (or answered).
    Reached(gpux_protocol::PublicKey),
    /// A host could not be dialled, timed out, or refused without a typed reason.
    Unreachable(gpux_protocol::PublicKey),
    /// A host accepted: the lease's machine takes over; `reply` hears how the start went.
    /// `hold` (the rent's claim on the GPUs) gives way to the lease's booking.
    Accepted {
        request: Box<Verified<LeaseRequest>>,
        accept: Box<Verified<LeaseAccept>>,
        allocation: Allocation,
        hold: Option<gpux_protocol::ContentId>,
        reply: oneshot::Sender<RentReport>,
    },
    /// Claims GPUs of `allocation`'s offer for one request, booking them in this node's
    /// book under a hold of their own, so that this node's concurrent rents ask for other
    /// GPUs: those in `prefer` first, none in `avoid`. `None`: too few are free.
    Claim {
        allocation: Allocation,
        spec: BidSpec,
        /// The rent's previous hold, released first (in the same step, so that no other
        /// rent of this node takes the GPUs a refusal named in between).
        release: Option<gpux_protocol::ContentId>,
        prefer: Vec<gpux_protocol::GpuUuid>,
        avoid: Vec<gpux_protocol::GpuUuid>,
        reply: oneshot::Sender<Option<(Allocation, gpux_protocol::ContentId)>>,
    },
    /// A claim that did not become a lease.
    Release(gpux_protocol::ContentId),
}

/// How many times one host is asked again, for the GPUs it names as free, after it
/// refused GPUs that another renter had just taken.
const RETRIES_ON_HOST: usize = 3;

/// What a rented container runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Workload {
    command: Vec<BoundedString<1024>>,
    /// The SSH keys that may log in (a signed term).
    ssh_keys: Vec<BoundedString<{ gpux_protocol::MAX_SSH_KEY_BYTES }>>,
    env: Vec<EnvVar>,
    network: bool,
    /// The lease terms the renter asked for (the workspace's size, its retention, the
    /// hold, the group, a window's committed minimum): each offer's own are added to them.
    terms: gpux_protocol::LeaseTerms,
    /// Challenge the GPUs before the work starts (the lease is held for it).
    challenge: bool,
    /// Challenge them again while the work runs, about this often.
    challenge_every: Option<std::time::Duration>,
    /// The renter asked for a hold of its own (`--hold`): it commits, not the challenge.
    own_hold: bool,
    /// The CPU, memory and `/dev/shm` asked for.
    resources: Resources,
}

impl Workload {
    /// Whether the renter commits the lease itself (it asked for a hold).
    pub(crate) fn held_by_renter(&self) -> bool {
        self.own_hold
    }
}

/// One rent, run outside the loop.
pub(crate) struct RentTask {
    key: Keypair,
    net: Client,
    events: mpsc::Sender<Event>,
    spec: BidSpec,
    image: ImageChoice,
    workload: Workload,
    /// Where an image from Docker is saved for staging.
    outbox: std::path::PathBuf,
    /// Hosts not to rent from.
    avoid: BTreeSet<gpux_protocol::PublicKey>,
    /// The registry's credentials, for an image the host pulls (in memory only).
    auth: Option<gpux_protocol::plane_wire::RegistryAuth>,
    /// Where the rent's progress is shown (`GET /v1/rent/progress/{name}`).
    progress: ProgressSlot,
}

/// Why one host did not give a lease.
enum Refusal {
    /// Refused before anything was agreed (with the host's typed reason, when it gave one):
    /// try another offer.
    Refused(String, Option<RejectReason>),
    /// The GPUs asked for were taken; the host named these of the same offer as free.
    Taken(String, Vec<gpux_protocol::GpuUuid>),
    /// Agreed, but it did not start (the machine reported why; nothing is paid).
    NotStarted(String),
}

impl RentTask {
    pub(crate) fn new(
        key: Keypair,
        net: Client,
        events: mpsc::Sender<Event>,
        spec: BidSpec,
        image: ImageChoice,
        workload: Workload,
        outbox: std::path::PathBuf,
    ) -> Self {
        Self {
            key,
            net,
            events,
            spec,
            image,
            workload,
            outbox,
            avoid: BTreeSet::new(),
            auth: None,
            progress: ProgressSlot::default(),
        }
    }

    /// The renter's own image, saved (from Docker) and indexed for staging; `None` when
    /// the rent runs a host's image.
    async fn prepare(&self) -> Result<Option<Staging>, ApiError> {
        let (path, saved) = match &self.image {
            ImageChoice::Any | ImageChoice::Host(_) | ImageChoice::Registry { .. } => {
                return Ok(None);
            }
            ImageChoice::Archive(path) => (path.clone(), false),
            ImageChoice::Local(reference) => {
                let docker = crate::executor::Executor::connect(&self.key.peer_id().to_string())
                    .await
                    .map_err(|e| {
                        ApiError::bad_input(format!("--image {reference}: {e}")).with_hint(
                            "a local image is read from this node's Docker; --image-archive                              takes a `docker save` file instead",
                        )
                    })?;
                let id = docker
                    .resolve_image(reference)
                    .await
                    .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?
                    .ok_or_else(|| {
                        ApiError::bad_input(format!(
                            "--image {reference}: this node's Docker has no such image"
                        ))
                        .with_hint("build or load it first, or name a host's image by digest")
                    })?;
                tokio::fs::create_dir_all(&self.outbox)
                    .await
                    .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?;
                let path = self
                    .outbox
                    .join(format!("{}.tar", gpux_protocol::hex(&id.0)));
                tracing::info!("saving image {reference} ({id}) for staging");
                if let Err(e) = docker.save_image(&id, &path).await {
                    let _ = tokio::fs::remove_file(&path).await;
                    return Err(ApiError::new(ErrorCode::Unavailable, e.to_string()));
                }
                (path, true)
            }
        };
        let read = path.clone();
        let archive =
            tokio::task::spawn_blocking(move || crate::plane::stage::Archive::open(&read))
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r);
        let archive = match archive {
            Ok(archive) => archive,
            Err(e) => {
                if saved {
                    let _ = std::fs::remove_file(&path);
                }
                return Err(ApiError::bad_input(format!("the image archive: {e:#}")));
            }
        };
        Ok(Some(Staging { archive, saved }))
    }

    /// Stages the renter's image on `host`, trying again (from what arrived) when the stream
    /// breaks.
    async fn stage(
        &self,
        staging: &Staging,
        host: gpux_protocol::PublicKey,
    ) -> Result<crate::plane::stage::Sent, String> {
        let peer =
            libp2p::PeerId::from_bytes(&host.peer_id().to_bytes()).map_err(|e| e.to_string())?;
        let mut total = crate::plane::stage::Sent::default();
        let mut last = String::new();
        for attempt in 1..=STAGE_ATTEMPTS {
            match crate::plane::stage::stage_image(&self.net, peer, &staging.archive).await {
                Ok(sent) => {
                    total.layers = total.layers.max(sent.layers);
                    total.bytes += sent.bytes;
                    return Ok(total);
                }
                Err(crate::plane::stage::StageError::Refused(why)) => return Err(why),
                Err(crate::plane::stage::StageError::Broken(why)) => {
                    tracing::info!("staging on {} broke (try {attempt}): {why}", host.peer_id());
                    last = why;
                }
            }
        }
        Err(last)
    }

    pub(crate) async fn run(mut self) -> Result<Rented, ApiError> {
        self.resolve_image().await?;
        let prepared = std::time::Instant::now();
        let staging = self.prepare().await?;
        let prepare_ms = prepared.elapsed().as_millis() as u64;
        if let Some(staging) = &staging {
            // Only hosts that stage an image this large.
            let gb = staging.archive.total_bytes().div_ceil(1_000_000_000);
            let stage = gpux_market::query::Query::parse(&format!("stage>={gb}"))
                .map_err(|e| ApiError::bad_input(e.to_string()))?;
            self.spec.query.clauses.extend(stage.clauses);
        }
        self.search(staging.as_ref(), prepare_ms).await
    }

    /// A rent that no host accepted: why, by what it was refused (none refused: no offer
    /// fit).
    fn refused(&self, refusals: &[String], all_taken: bool) -> ApiError {
        if refusals.is_empty()
            && let ImageChoice::Host(digest) = &self.image
        {
            ApiError::new(
                ErrorCode::NoOffer,
                format!("--image {digest}: no offer that satisfies the request lists this image"),
            )
            .with_hint(
                "hosts run the images their offers list, or one you stage: --image NAME, \
                     --image-archive FILE",
            )
        } else if refusals.is_empty()
            && let ImageChoice::Registry { reference, named } = &self.image
        {
            ApiError::new(
                ErrorCode::NoOffer,
                format!(
                    "--image {named}: this node's Docker has no such image, and no offer that \
                         satisfies the request lists it, has it cached or pulls from {}",
                    reference.registry()
                ),
            )
            .with_hint(
                "build it here to stage it, or `gpux offers search 'pull>0'` for hosts that \
                     pull (their offers name the registries)",
            )
        } else if refusals.is_empty() {
            ApiError::new(
                ErrorCode::NoOffer,
                "no offer in this node's view of the market satisfies the request",
            )
            .with_hint(
                "`gpux offers search` shows what the market offers; hosts shown unreachable \
                 or blocked are skipped",
            )
        } else {
            let code = if all_taken {
                ErrorCode::AllTaken
            } else {
                ErrorCode::Conflict
            };
            ApiError::new(code, format!("no host accepted: {}", summary(refusals)))
        }
    }
}

/// Refusals shown in full in a rent's error, at most; the rest are counted.
const REFUSALS_SHOWN: usize = 4;

/// A rent's refusals for its error: the first few in full, then how many more and how
/// many of those were unreachable (a flood can put dozens in one rent).
fn summary(refusals: &[String]) -> String {
    let mut text = refusals
        .iter()
        .take(REFUSALS_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    let rest = &refusals[refusals.len().min(REFUSALS_SHOWN)..];
    if !rest.is_empty() {
        let unreachable = rest.iter().filter(|r| r.contains(": unreachable")).count();
        text.push_str(&format!(
            "; and {} more ({unreachable} of them unreachable)",
            rest.len()
        ));
    }
    text
}

/// Connects to a host by its peer id.
async fn reach(net: Client, host: gpux_protocol::PublicKey) -> Result<(), String> {
    let peer = libp2p::PeerId::from_bytes(&host.peer_id().to_bytes()).map_err(|e| e.to_string())?;
    net.reach(peer).await.map_err(|e| e.to_string())
}

/// What a rent needs of the node, to run one outside the loop (a resume rents again).
#[derive(Clone)]
pub(crate) struct RentContext {
    key: Keypair,
    net: Client,
    events: mpsc::Sender<Event>,
    outbox: std::path::PathBuf,
    progress: ProgressBoard,
}

impl RentContext {
    /// Checks `request` and rents for it.
    pub(crate) async fn run(&self, request: &RentRequest) -> Result<Rented, ApiError> {
        self.run_avoiding(request, &BTreeSet::new()).await
    }

    /// The same, from none of the hosts in `avoid`.
    pub(crate) async fn run_avoiding(
        &self,
        request: &RentRequest,
        avoid: &BTreeSet<gpux_protocol::PublicKey>,
    ) -> Result<Rented, ApiError> {
        let (spec, image, workload) = parse(request)?;
        let mut task = RentTask::new(
            self.key.clone(),
            self.net.clone(),
            self.events.clone(),
            spec,
            image,
            workload,
            self.outbox.clone(),
        );
        task.avoid = avoid.clone();
        task.auth = request
            .registry_auth
            .as_ref()
            .map(|a| {
                Ok::<_, ApiError>(gpux_protocol::plane_wire::RegistryAuth {
                    username: BoundedString::new(a.username.clone())
                        .map_err(|e| ApiError::bad_input(format!("--registry-user: {e}")))?,
                    password: BoundedString::new(a.password.clone())
                        .map_err(|e| ApiError::bad_input(format!("the registry password: {e}")))?,
                })
            })
            .transpose()?;
        if let Some(name) = &request.progress
            && !valid_name(name)
        {
            return Err(ApiError::bad_input(
                "progress: a name of 16 to 64 letters and digits",
            ));
        }
        task.progress = self.progress.slot(request.progress.as_deref());
        let result = task.run().await;
        // The caller hears the end from the result itself; the board only says it is over.
        self.progress
            .slot(request.progress.as_deref())
            .set(gpux_api::RentProgress {
                phase: "done".into(),
                ..gpux_api::RentProgress::default()
            });
        result
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_rent_error_shows_a_few_refusals_and_counts_the_rest() {
        let refusals: Vec<String> = (0..40)
            .map(|i| format!("host-{i}: unreachable (no connection in 3 s)"))
            .chain(["host-40: the GPUs are taken".to_string()])
            .collect();
        let text = super::summary(&refusals);
        assert!(text.starts_with("host-0: unreachable"), "{text}");
        assert!(
            text.contains("host-3:") && !text.contains("host-4:"),
            "{text}"
        );
        assert!(
            text.ends_with("; and 37 more (36 of them unreachable)"),
            "{text}"
        );
        assert_eq!(super::summary(&refusals[..2]), refusals[..2].join("; "));
    }
}
