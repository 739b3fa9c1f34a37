//! Images from registries (`/gpux/pull/1`): how a reference reads, and the renter's side of
//! a pull (it asks the chosen host to pull an image and hold it, follows the progress, and
//! learns the image id its lease request then names). The host's side is `pull_host`.
//!
//! The registry's credentials, when the renter gives some, go only on this stream: noise
//! encrypted, to the one host chosen, used for that pull and kept nowhere.

use std::time::Duration;

pub(crate) use gpux_api::ImageRef;
use gpux_protocol::plane_wire::{Opened, PullFailure, PullOpen, PullStatus, RegistryAuth};
use gpux_protocol::{BoundedString, ImageDigest};
use libp2p::{PeerId, StreamProtocol};

use super::{OPEN_WITHIN, framed, recv, send};
use crate::p2p::Client;

/// `/gpux/pull/1`.
pub(crate) const PULL: StreamProtocol =
    StreamProtocol::new(gpux_protocol::plane_wire::PULL_PROTOCOL);
/// The longest the host may stay silent during a pull (it sends progress twice a second).
pub(crate) const SILENT_AT_MOST: Duration = Duration::from_secs(60);

/// An image the host pulled and holds for this renter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PulledImage {
    pub(crate) image: ImageDigest,
    pub(crate) bytes: u64,
    pub(crate) warm: bool,
}

/// A pull that did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PullRefusal {
    /// The host answered why (its code and words).
    Refused(PullFailure, String),
    /// The stream broke, or the host went silent.
    Broken(String),
}

impl std::fmt::Display for PullRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PullRefusal::Refused(_, why) | PullRefusal::Broken(why) => f.write_str(why),
        }
    }
}

/// Has `host` pull `reference` (with `auth`) and hold it for this node, calling `progress`
/// with each report of the host's.
pub(crate) async fn pull_on(
    net: &Client,
    host: PeerId,
    reference: &ImageRef,
    auth: Option<RegistryAuth>,
    mut progress: impl FnMut(&PullStatus),
) -> Result<PulledImage, PullRefusal> {
    let broken = |e: String| PullRefusal::Broken(e);
    let stream = net
        .open_stream(host, PULL, OPEN_WITHIN)
        .await
        .map_err(|e| broken(e.to_string()))?;
    let mut framed = framed(stream);
    let open = PullOpen {
        reference: BoundedString::new(reference.full()).map_err(|e| broken(e.to_string()))?,
        auth,
    };
    send(&mut framed, &open)
        .await
        .map_err(|e| broken(e.to_string()))?;
    match recv::<Opened>(&mut framed, OPEN_WITHIN).await {
        Ok(Opened::Yes) => {}
        Ok(Opened::No { detail, .. }) => {
            return Err(PullRefusal::Refused(PullFailure::Busy, detail.to_string()));
        }
        Err(e) => return Err(broken(format!("the host's answer: {e}"))),
    }
    loop {
        match recv::<PullStatus>(&mut framed, SILENT_AT_MOST).await {
            Ok(PullStatus::Done { image, bytes, warm }) => {
                return Ok(PulledImage { image, bytes, warm });
            }
            Ok(PullStatus::Failed { code, detail }) => {
                return Err(PullRefusal::Refused(code, detail.to_string()));
            }
            Ok(status) => progress(&status),
            Err(e) => return Err(broken(format!("the pull's progress: {e}"))),
        }
    }
}
