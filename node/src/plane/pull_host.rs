//! The host's side of `/gpux/pull/1`: it pulls an image a renter names from its registry,
//! with the renter's credentials when it gave some, reports the progress twice a second,
//! and holds the image for that renter (`super::staged`) so its lease request may name it.
//! The pull happens before any lease: no GPU is booked or billed while it runs.
//!
//! Bounds: the host's policy (the largest image, the registries, the longest pull), two
//! pulls at once, one per renter, a burst of starts per renter and then one a minute, and
//! the staged-image hold table. An image pulled without credentials joins the host's cache
//! (`super::pulled`), listed in its offers; one pulled with credentials is the renter's
//! alone, erased after its lease as a staged image is. Credentials are used for the one
//! pull: never written, logged or kept.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use gpux_protocol::plane_wire::{Opened, PlaneRefusal, PullFailure, PullOpen, PullStatus};
use gpux_protocol::{PublicKey, Pulls};
use libp2p::PeerId;

use super::pull::{ImageRef, PULL};
use super::pulled::PullCache;
use super::staged::{Hold, StagedImages, UNUSED_TTL_MS};
use super::turns::Turns;
use super::{FramedStream, OPEN_WITHIN, framed, recv, send};
use crate::attest::now;
use crate::executor::{Executor, PullProgress};
use crate::p2p::Client;

/// Pulls served at once, all renters together.
pub(crate) const MAX_PULLS: usize = 2;
/// How often progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// How often the cache is brought within its quota (images held when it was over it may
/// be free to go since).
const EVICT_EVERY: Duration = Duration::from_secs(60);

/// The host's pull service.
#[derive(Clone)]
pub(crate) struct PullHost {
    pub(crate) exec: Executor,
    pub(crate) staged: StagedImages,
    pub(crate) cache: PullCache,
    /// What the host pulls (its `cached` list is the offers' business).
    pub(crate) policy: Pulls,
    pub(crate) turns: Turns,
}

impl PullHost {
    /// Takes `/gpux/pull/1` on `net` and keeps the cache within its quota (as holds on its
    /// images lapse) until the network stops.
    pub(crate) fn spawn(self, net: &Client) -> anyhow::Result<()> {
        let mut streams = net.accept_streams(PULL)?;
        let sweeper = self.clone();
        tokio::spawn(async move {
            while let Some((peer, stream)) = streams.next().await {
                let host = self.clone();
                tokio::spawn(async move { host.serve(peer, framed(stream)).await });
            }
        });
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVICT_EVERY);
            loop {
                tick.tick().await;
                sweeper.evict().await;
            }
        });
        Ok(())
    }

    async fn serve(self, peer: PeerId, mut framed: FramedStream) {
        let refuse = |code, detail: String| Opened::refused(code, &detail);
        let open: PullOpen = match recv(&mut framed, OPEN_WITHIN).await {
            Ok(open) => open,
            Err(e) => {
                let no = refuse(PlaneRefusal::Malformed, format!("the open frame: {e}"));
                let _ = send(&mut framed, &no).await;
                return;
            }
        };
        let renter = peer
            .to_string()
            .parse::<gpux_protocol::PeerId>()
            .map(|p| p.public_key());
        let admitted = match renter {
            Err(_) => Err((
                PlaneRefusal::Malformed,
                "only ed25519 peers rent here".to_string(),
            )),
            Ok(renter) => self.admit(renter, &open).map(|(r, turn)| (renter, r, turn)),
        };
        let (renter, reference, _turn) = match admitted {
            Ok(admitted) => admitted,
            Err((code, detail)) => {
                tracing::debug!("pull refused: {detail}");
                let _ = send(&mut framed, &refuse(code, detail)).await;
                let _ = SinkExt::<Bytes>::close(&mut framed).await;
                return;
            }
        };
        if send(&mut framed, &Opened::Yes).await.is_err() {
            return;
        }
        let last = match self.pull(&mut framed, renter, &reference, open).await {
            Ok(done) => done,
            Err(failed) => failed,
        };
        let _ = send(&mut framed, &last).await;
        let _ = SinkExt::<Bytes>::close(&mut framed).await;
    }

    /// Checks the open frame against the host's policy and takes a pull turn.
    fn admit(
        &self,
        renter: PublicKey,
        open: &PullOpen,
    ) -> Result<(ImageRef, super::turns::Turn), (PlaneRefusal, String)> {
        let reference: ImageRef = open
            .reference
            .parse()
            .map_err(|e| (PlaneRefusal::Malformed, e))?;
        if self.policy.max_bytes == 0 {
            return Err((
                PlaneRefusal::Unavailable,
                "this host pulls no images: it runs the images it lists, or ones you stage".into(),
            ));
        }
        if !self.policy.allows(reference.registry()) {
            return Err((
                PlaneRefusal::Unavailable,
                format!(
                    "this host does not pull from {} (its offers list the registries it does)",
                    reference.registry()
                ),
            ));
        }
        if !self.staged.make_room(super::stage_host::MAX_HOLDS) {
            return Err((
                PlaneRefusal::Busy,
                "this host holds as many renters' images as it keeps, all in use; try later".into(),
            ));
        }
        let turn = self.turns.take(renter, "pull")?;
        Ok((reference, turn))
    }

    /// Pulls, reporting progress; the last frame to send (done or failed).
    async fn pull(
        &self,
        framed: &mut FramedStream,
        renter: PublicKey,
        reference: &ImageRef,
        open: PullOpen,
    ) -> Result<PullStatus, PullStatus> {
        let registry = reference.registry().to_string();
        let failed = |code: PullFailure, why: &str| {
            tracing::info!(
                "pull of {} for {} failed: {why}",
                reference.short(),
                renter.peer_id()
            );
            PullStatus::failed(code, &format!("registry {registry}: {why}"))
        };
        let before = self
            .exec
            .list_images()
            .await
            .map_err(|e| failed(PullFailure::Failed, &e.to_string()))?;
        let public = open.auth.is_none();
        // The credentials leave the open frame here and go to Docker; nothing else sees them.
        let credentials = open.auth.map(|a| {
            (
                reference.auth_server(),
                a.username.to_string(),
                a.password.to_string(),
            )
        });
        let (progress_tx, mut progress_rx) = tokio::sync::watch::channel(PullProgress::default());
        let full = reference.full();
        let pulling = self
            .exec
            .pull_image(&full, credentials, self.policy.max_bytes, move |p| {
                let _ = progress_tx.send(p);
            });
        let timeout = Duration::from_secs(u64::from(self.policy.timeout_s.max(1)));
        let deadline = tokio::time::sleep(timeout);
        let mut pulling = std::pin::pin!(pulling);
        let mut deadline = std::pin::pin!(deadline);
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        let pulled = loop {
            tokio::select! {
                pulled = &mut pulling => break pulled,
                () = &mut deadline => {
                    return Err(failed(
                        PullFailure::TimedOut,
                        &format!("the pull took longer than this host allows ({} s)", timeout.as_secs()),
                    ));
                }
                _ = tick.tick() => {
                    let p = *progress_rx.borrow_and_update();
                    let status = PullStatus::Progress {
                        done: p.done,
                        total: p.total,
                        layers_done: p.layers_done,
                        layers: p.layers,
                    };
                    // A renter that stops reading stops the pull.
                    if send(framed, &status).await.is_err() {
                        return Err(failed(PullFailure::Failed, "the renter went away"));
                    }
                }
            }
        };
        let pulled = pulled.map_err(|e| failed(e.kind, &e.message))?;
        let existed = before.contains(&pulled.image);
        if pulled.bytes > self.policy.max_bytes {
            if !existed && !self.staged.any_hold(&pulled.image) && !self.cache.has(&pulled.image) {
                let _ = self.exec.remove_image(&pulled.image).await;
            }
            return Err(failed(
                PullFailure::TooLarge,
                &format!(
                    "{} has {} MB; this host pulls images up to {} MB",
                    reference.short(),
                    pulled.bytes / 1_000_000,
                    self.policy.max_bytes / 1_000_000
                ),
            ));
        }
        // A public image joins the cache, which decides when it goes; a private one is the
        // renter's, erased after its lease unless the host had it before.
        let in_cache = public || self.cache.has(&pulled.image);
        self.staged.add(Hold {
            image: pulled.image,
            renter,
            bytes: pulled.bytes,
            leases: BTreeMap::new(),
            until_ms: now().0 + UNUSED_TTL_MS,
            host_image: in_cache || (existed && !self.staged.any_hold(&pulled.image)),
        });
        if public {
            self.cache
                .touch(&reference.short(), pulled.image, pulled.bytes, now().0);
            self.evict().await;
        }
        tracing::info!(
            "pulled {} ({}, {} MB{}) for {}",
            reference.short(),
            pulled.image,
            pulled.bytes / 1_000_000,
            if pulled.warm { ", warm" } else { "" },
            renter.peer_id()
        );
        Ok(PullStatus::Done {
            image: pulled.image,
            bytes: pulled.bytes,
            warm: pulled.warm,
        })
    }

    /// Erases the least recently used cached images past the cache's quota, leaving those
    /// a renter holds (a lease runs them, or is about to).
    pub(crate) async fn evict(&self) {
        for image in self.cache.evict(|i| self.staged.any_hold(i)) {
            match self.exec.remove_image(&image).await {
                Ok(()) => {
                    self.cache.forget(&image);
                    tracing::info!("evicted cached image {image}");
                }
                Err(e) => tracing::warn!("cannot evict cached image {image} yet: {e}"),
            }
        }
    }
}
