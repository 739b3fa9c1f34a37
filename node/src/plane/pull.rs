//! Images from registries (`/gpux/pull/1`): how a reference reads, and the renter's side of
//! a pull (it asks the chosen host to pull an image and hold it, follows the progress, and
//! learns the image id its lease request then names). The host's side is `pull_host`.
//!
//! The registry's credentials, when the renter gives some, go only on this stream: noise
//! encrypted, to the one host chosen, used for that pull and kept nowhere.

use std::time::Duration;

use gpux_protocol::plane_wire::{
    MAX_REFERENCE_BYTES, Opened, PullFailure, PullOpen, PullStatus, RegistryAuth,
};
use gpux_protocol::{BoundedString, ImageDigest};
use libp2p::{PeerId, StreamProtocol};

use super::{OPEN_WITHIN, framed, recv, send};
use crate::p2p::Client;

/// `/gpux/pull/1`.
pub(crate) const PULL: StreamProtocol =
    StreamProtocol::new(gpux_protocol::plane_wire::PULL_PROTOCOL);
/// The longest the host may stay silent during a pull (it sends progress twice a second).
pub(crate) const SILENT_AT_MOST: Duration = Duration::from_secs(60);

/// An image reference as Docker reads it: Docker Hub when no registry is named, its
/// `library/` for one-word names, `latest` when no tag is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef(oci_spec::distribution::Reference);

impl std::str::FromStr for ImageRef {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.len() > MAX_REFERENCE_BYTES {
            return Err(format!(
                "an image reference has at most {MAX_REFERENCE_BYTES} bytes"
            ));
        }
        text.parse()
            .map(ImageRef)
            .map_err(|e| format!("'{text}' is not an image reference ({e}): use [REGISTRY/]NAME[:TAG][@sha256:DIGEST]"))
    }
}

impl ImageRef {
    /// The registry (`docker.io`, `ghcr.io`, `127.0.0.1:5000`).
    pub fn registry(&self) -> &str {
        self.0.registry()
    }

    /// The whole reference, registry and all (`docker.io/library/ubuntu:24.04`): what the
    /// host asks Docker for.
    pub fn full(&self) -> String {
        self.0.whole()
    }

    /// Docker's short form (`ubuntu:24.04`, `pytorch/pytorch:2.5.1`, `ghcr.io/org/app:1`):
    /// how offers list cached images and queries name them.
    pub fn short(&self) -> String {
        let repo = self.0.repository();
        let name = if self.registry() == "docker.io" {
            repo.strip_prefix("library/").unwrap_or(repo).to_string()
        } else {
            format!("{}/{repo}", self.registry())
        };
        match (self.0.tag(), self.0.digest()) {
            (_, Some(digest)) => format!("{name}@{digest}"),
            (Some(tag), None) => format!("{name}:{tag}"),
            (None, None) => format!("{name}:latest"),
        }
    }

    /// The same repository at `digest` (`sha256:...`): a pull pinned to exactly one image.
    pub fn at_digest(&self, digest: &str) -> Result<ImageRef, String> {
        format!("{}/{}@{digest}", self.registry(), self.0.repository()).parse()
    }

    /// Whether `repo_digest` (`repo@sha256:...`, as `docker image inspect` lists them) names
    /// this reference's repository.
    pub fn same_repository(&self, other: &ImageRef) -> bool {
        self.registry() == other.registry() && self.0.repository() == other.0.repository()
    }

    /// The address Docker's credentials name for this registry.
    pub fn auth_server(&self) -> String {
        if self.registry() == "docker.io" {
            "https://index.docker.io/v1/".into()
        } else {
            self.registry().to_string()
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_read_as_docker_reads_them() {
        let r: ImageRef = "ubuntu".parse().unwrap();
        assert_eq!(r.registry(), "docker.io");
        assert_eq!(r.full(), "docker.io/library/ubuntu:latest");
        assert_eq!(r.short(), "ubuntu:latest");
        assert_eq!(r.auth_server(), "https://index.docker.io/v1/");
        let r: ImageRef = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
            .parse()
            .unwrap();
        assert_eq!(r.short(), "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime");
        let r: ImageRef = "127.0.0.1:5000/team/train:1".parse().unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.short(), "127.0.0.1:5000/team/train:1");
        assert_eq!(r.auth_server(), "127.0.0.1:5000");
        let digest = format!("sha256:{}", "ab".repeat(32));
        let pinned = r.at_digest(&digest).unwrap();
        assert_eq!(
            pinned.short(),
            format!("127.0.0.1:5000/team/train@{digest}")
        );
        assert!(pinned.same_repository(&r));
        assert!(!pinned.same_repository(&"127.0.0.1:5000/team/eval:1".parse().unwrap()));
        for bad in ["Upper/Case", "a:b:c", "", "with space"] {
            assert!(bad.parse::<ImageRef>().is_err(), "{bad}");
        }
        assert!("a".repeat(600).parse::<ImageRef>().is_err());
    }
}
