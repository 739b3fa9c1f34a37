//! An image reference as Docker reads it: the renter's CLI finds its stored registry
//! credentials by it, the renter's node asks a host to pull it, the host pulls it.

use gpux_protocol::plane_wire::MAX_REFERENCE_BYTES;

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
