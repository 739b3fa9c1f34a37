//! `gpux cp`: the node copies between a local path and a lease's workspace and reports how
//! far it got (`GET /v1/leases/{lease}/copy?request=...`, a WebSocket of JSON
//! [`CopyEvent`]s). No file byte crosses the CLI: the node reads or writes the local file
//! itself, with its own user's rights (docs/execution.md, "Files in and out").

use std::path::PathBuf;

use base64::Engine;
use futures::StreamExt;
use gpux_api::{CopyEvent, CopyOrder, CopyReport};
use gpux_protocol::plane_wire::is_workspace_path;
use tokio_tungstenite::tungstenite::Message;

use crate::api::{ApiClient, ClientError};
use crate::stream::connect;

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A path on this machine.
    Local(PathBuf),
    /// A path in a lease's workspace, relative to `/workspace` (`""`: the workspace).
    Remote {
        /// The lease id.
        lease: String,
        /// The path under `/workspace`.
        path: String,
        /// Written with a trailing `/`: a directory to copy into.
        into: bool,
    },
}

impl Place {
    /// `LEASE:/workspace/PATH` (or `LEASE:PATH`, relative to `/workspace`) is in a lease's
    /// workspace, where `LEASE` is a lease id (64 hex digits); anything else is local.
    pub fn parse(text: &str) -> Result<Place, String> {
        let Some((lease, path)) = text.split_once(':') else {
            return Ok(Place::Local(PathBuf::from(text)));
        };
        if lease.len() != 64 || !lease.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(Place::Local(PathBuf::from(text)));
        }
        let rest = if path == "/workspace" {
            ""
        } else if let Some(rest) = path.strip_prefix("/workspace/") {
            rest
        } else if path.starts_with('/') {
            return Err(format!("{text}: a lease's files are under /workspace"));
        } else {
            path
        };
        let into = rest.ends_with('/') || rest.is_empty();
        let rest = rest.trim_end_matches('/');
        if !rest.is_empty() && !is_workspace_path(rest) {
            return Err(format!(
                "{text}: the path must stay inside /workspace (no '..', no '//')"
            ));
        }
        Ok(Place::Remote {
            lease: lease.to_ascii_lowercase(),
            path: rest.to_string(),
            into,
        })
    }
}

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// The node refused, or is not running.
    #[error(transparent)]
    Api(#[from] ClientError),
    /// A local path that cannot be made absolute.
    #[error("{}: {source}", path.display())]
    Local {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A copy that cannot be done as asked.
    #[error("{0}")]
    Usage(String),
    /// The link to the node broke, or it said something this client does not read.
    #[error("{0}")]
    Link(String),
    /// The node, copying, failed (its own words).
    #[error("{0}")]
    ByNode(String),
}

/// Has the node copy `src` to `dst` (one side `LEASE:/workspace/PATH`, the other a local
/// path, made absolute here against this process's working directory), as `cp -r` would.
/// `progress` is told the total bytes and how many are done, as the node reports them.
pub async fn copy(
    api: &ApiClient,
    src: &Place,
    dst: &Place,
    mut progress: impl FnMut(u64, u64),
) -> Result<CopyReport, CopyError> {
    let absolute = |p: &PathBuf| {
        std::path::absolute(p).map_err(|source| CopyError::Local {
            path: p.clone(),
            source,
        })
    };
    let (lease, order) = match (src, dst) {
        (Place::Local(from), Place::Remote { lease, path, into }) => (
            lease,
            CopyOrder {
                upload: true,
                local: absolute(from)?,
                remote: path.clone(),
                into: *into,
            },
        ),
        (Place::Remote { lease, path, .. }, Place::Local(to)) => (
            lease,
            CopyOrder {
                upload: false,
                local: absolute(to)?,
                remote: path.clone(),
                into: false,
            },
        ),
        _ => {
            return Err(CopyError::Usage(
                "one side of a copy is a lease's workspace (LEASE:/workspace/PATH), the other a local path".into(),
            ));
        }
    };
    let json = serde_json::to_vec(&order).map_err(|e| CopyError::Usage(e.to_string()))?;
    let request = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
    let mut socket = connect(api, &format!("/v1/leases/{lease}/copy?request={request}")).await?;
    while let Some(message) = socket.next().await {
        let text = match message {
            Ok(Message::Text(text)) => text,
            Ok(Message::Close(_)) => break,
            Ok(_) => continue,
            Err(e) => return Err(CopyError::Link(format!("the node: {e}"))),
        };
        let event: CopyEvent = serde_json::from_str(&text)
            .map_err(|e| CopyError::Link(format!("the node's report: {e}")))?;
        match event {
            CopyEvent::Progress { total, done } => progress(total, done),
            CopyEvent::Done(report) => {
                progress(report.bytes, report.bytes);
                let _ = socket.close(None).await;
                return Ok(report);
            }
            CopyEvent::Failed(why) => return Err(CopyError::ByNode(why)),
        }
    }
    Err(CopyError::Link(
        "the node closed the copy before it ended".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_read_as_local_or_a_lease_workspace() {
        let lease = "ab".repeat(32);
        let remote = |path: &str, into| Place::Remote {
            lease: lease.clone(),
            path: path.into(),
            into,
        };
        assert_eq!(
            Place::parse("data.bin").unwrap(),
            Place::Local("data.bin".into())
        );
        assert_eq!(Place::parse("./a:b").unwrap(), Place::Local("./a:b".into()));
        assert_eq!(
            Place::parse(&format!("{lease}:/workspace/out/r.txt")).unwrap(),
            remote("out/r.txt", false)
        );
        assert_eq!(
            Place::parse(&format!("{lease}:/workspace/out/")).unwrap(),
            remote("out", true)
        );
        assert_eq!(
            Place::parse(&format!("{lease}:/workspace")).unwrap(),
            remote("", true)
        );
        assert_eq!(
            Place::parse(&format!("{lease}:in.csv")).unwrap(),
            remote("in.csv", false)
        );
        for bad in [
            "/workspace/../etc",
            "/etc/passwd",
            "/workspace/a/../../x",
            "/workspacex",
        ] {
            assert!(Place::parse(&format!("{lease}:{bad}")).is_err(), "{bad}");
        }
    }
}
