//! Pulling an image from its registry for a lease (`/gpux/pull/1` on the host): Docker's own
//! pull through bollard, with the registry's credentials when the renter gave some, its
//! progress summed over the layers, and the failure told apart by kind.

use std::collections::BTreeMap;

use bollard::auth::DockerCredentials;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures::StreamExt;
use gpux_protocol::ImageDigest;
use gpux_protocol::plane_wire::PullFailure;

use super::{Executor, is_status};

/// How far a pull is, over the layers Docker has announced so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullProgress {
    /// Bytes downloaded (layers already here count whole).
    pub done: u64,
    /// Bytes announced.
    pub total: u64,
    /// Layers done (downloaded and extracted, or here already).
    pub layers_done: u16,
    /// Layers announced.
    pub layers: u16,
}

/// A pulled image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// Its id.
    pub image: ImageDigest,
    /// Its size in Docker, bytes.
    pub bytes: u64,
    /// Every layer was here before the pull.
    pub warm: bool,
}

/// A pull that did not come to an image, by kind, with Docker's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PullError {
    /// What kind of failure.
    pub kind: PullFailure,
    /// In words.
    pub message: String,
}

/// One layer as the pull's messages describe it.
#[derive(Debug, Clone, Copy, Default)]
struct Layer {
    done: u64,
    total: u64,
    finished: bool,
    present: bool,
}

impl Executor {
    /// Pulls `reference` (with `credentials` for `registry` when given), calling `progress`
    /// as the layers move; the caller bounds the time (dropping the future stops the pull).
    /// A pull whose announced layers pass `max_bytes` is stopped as too large.
    pub async fn pull_image(
        &self,
        reference: &str,
        credentials: Option<(String, String, String)>,
        max_bytes: u64,
        mut progress: impl FnMut(PullProgress),
    ) -> Result<Pulled, PullError> {
        let options = CreateImageOptionsBuilder::default()
            .from_image(reference)
            .build();
        let credentials =
            credentials.map(|(serveraddress, username, password)| DockerCredentials {
                username: Some(username),
                password: Some(password),
                serveraddress: Some(serveraddress),
                ..Default::default()
            });
        let mut stream = std::pin::pin!(self.docker.create_image(Some(options), None, credentials));
        let mut layers: BTreeMap<String, Layer> = BTreeMap::new();
        let mut up_to_date = false;
        while let Some(item) = stream.next().await {
            let info = item.map_err(classify)?;
            let status = info.status.unwrap_or_default();
            if status.starts_with("Status: Image is up to date") {
                up_to_date = true;
            }
            let Some(id) = info
                .id
                .filter(|id| id.len() >= 12 && !status.starts_with("Pulling from"))
            else {
                continue;
            };
            let layer = layers.entry(id).or_default();
            let detail = info.progress_detail.unwrap_or_default();
            let (current, total) = (
                u64::try_from(detail.current.unwrap_or(0)).unwrap_or(0),
                u64::try_from(detail.total.unwrap_or(0)).unwrap_or(0),
            );
            match status.as_str() {
                "Downloading" => {
                    layer.total = layer.total.max(total);
                    layer.done = current.min(layer.total);
                }
                "Verifying Checksum" | "Download complete" | "Extracting" => {
                    layer.done = layer.total;
                }
                "Pull complete" => {
                    layer.done = layer.total;
                    layer.finished = true;
                }
                "Already exists" => {
                    layer.finished = true;
                    layer.present = true;
                }
                _ => {}
            }
            let now = summary(&layers);
            if now.total > max_bytes {
                return Err(PullError {
                    kind: PullFailure::TooLarge,
                    message: format!(
                        "{reference} is larger than this host pulls ({} MB at least, at most {} MB)",
                        now.total / 1_000_000,
                        max_bytes / 1_000_000
                    ),
                });
            }
            progress(now);
        }
        let inspect = self
            .docker
            .inspect_image(reference)
            .await
            .map_err(|e| PullError {
                kind: PullFailure::Failed,
                message: format!("{reference} was pulled but Docker cannot find it: {e}"),
            })?;
        let image = inspect
            .id
            .and_then(|id| id.parse::<ImageDigest>().ok())
            .ok_or_else(|| PullError {
                kind: PullFailure::Failed,
                message: format!("{reference}: Docker gave no image id"),
            })?;
        let warm = up_to_date || layers.values().all(|l| l.present);
        Ok(Pulled {
            image,
            bytes: u64::try_from(inspect.size.unwrap_or(0)).unwrap_or(0),
            warm,
        })
    }
}

fn summary(layers: &BTreeMap<String, Layer>) -> PullProgress {
    let count = |f: &dyn Fn(&Layer) -> bool| {
        u16::try_from(layers.values().filter(|l| f(l)).count()).unwrap_or(u16::MAX)
    };
    PullProgress {
        done: layers.values().map(|l| l.done).sum(),
        total: layers.values().map(|l| l.total).sum(),
        layers_done: count(&|l| l.finished),
        layers: count(&|_| true),
    }
}

/// What kind of failure Docker's answer is. Registries and Docker word them variously; an
/// anonymous pull from a registry that wants a login can even end in a reset connection, as
/// Docker falls back from HTTPS to plain HTTP for a registry it trusts without TLS.
fn classify(e: bollard::errors::Error) -> PullError {
    let message = match &e {
        bollard::errors::Error::DockerStreamError { error } => error.clone(),
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    };
    let lower = message.to_ascii_lowercase();
    let kind = if lower.contains("unauthorized")
        || lower.contains("authentication required")
        || lower.contains("no basic auth")
        || lower.contains("incorrect username or password")
        || lower.contains("denied")
        || lower.contains("connection reset by peer")
    {
        PullFailure::Unauthorized
    } else if is_status(&e, 404)
        || lower.contains("not found")
        || lower.contains("manifest unknown")
    {
        PullFailure::NotFound
    } else if lower.contains("invalid reference format") {
        PullFailure::Malformed
    } else {
        PullFailure::Failed
    };
    PullError { kind, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_sums_the_layers_as_docker_reports_them() {
        let mut layers = BTreeMap::new();
        layers.insert(
            "a".to_string(),
            Layer {
                done: 50,
                total: 100,
                ..Layer::default()
            },
        );
        layers.insert(
            "b".to_string(),
            Layer {
                finished: true,
                present: true,
                ..Layer::default()
            },
        );
        layers.insert(
            "c".to_string(),
            Layer {
                done: 30,
                total: 30,
                finished: true,
                ..Layer::default()
            },
        );
        assert_eq!(
            summary(&layers),
            PullProgress {
                done: 80,
                total: 130,
                layers_done: 2,
                layers: 3
            }
        );
    }

    #[test]
    fn failures_are_told_apart() {
        let stream = |error: &str| {
            classify(bollard::errors::Error::DockerStreamError {
                error: error.into(),
            })
            .kind
        };
        assert_eq!(
            stream(
                "Head \"https://127.0.0.1:5000/v2/team/train/manifests/1\": unauthorized: authentication required"
            ),
            PullFailure::Unauthorized
        );
        assert_eq!(
            stream("read tcp 127.0.0.1:50682->127.0.0.1:5055: read: connection reset by peer"),
            PullFailure::Unauthorized
        );
        assert_eq!(
            stream("manifest for team/train:9 not found: manifest unknown"),
            PullFailure::NotFound
        );
        assert_eq!(stream("no space left on device"), PullFailure::Failed);
    }
}
