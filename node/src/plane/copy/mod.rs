//! The renter node's side of `gpux cp` (see `delegate`) and of a resume's mirror: files and
//! directories in and out of a lease's workspace, over a `/gpux/files/1` stream to the host.
//!
//! Every file is verified end to end: the whole file's blake3 is compared on the far side
//! before it takes its name. An interrupted copy leaves a `.<name>.gpux-part` beside the
//! target (on the host for a put, here for a get); running the same copy again sends only
//! what the part lacks. Names are checked on both sides: a listing from the host with a path
//! that leaves the directory is refused.

mod error;
mod local;
mod session;
mod tree;

use std::path::Path;

use gpux_api::CopyReport;

pub(crate) use error::{CopyError, Progress};
use session::Session;
use tree::{download, mirror, upload, upload_tree};

/// Copies local `from` into a lease's workspace at `to` over `stream` (a `/gpux/files/1`
/// stream this node opened to the host).
pub(crate) async fn upload_over(
    stream: crate::plane::FramedStream,
    from: &Path,
    to: &str,
    into: bool,
    progress: &dyn Progress,
) -> Result<CopyReport, CopyError> {
    upload(&mut Session::over(stream), from, to, into, progress).await
}

/// Copies `/workspace/{from}` to local `to` over `stream`.
pub(crate) async fn download_over(
    stream: crate::plane::FramedStream,
    from: &str,
    to: &Path,
    progress: &dyn Progress,
) -> Result<CopyReport, CopyError> {
    download(&mut Session::over(stream), from, to, progress).await
}

/// Makes local `to` a copy of the workspace's directory `from` over `stream`, sending only
/// what differs and removing what the workspace no longer has (a resume's mirror).
pub(crate) async fn mirror_over(
    stream: crate::plane::FramedStream,
    from: &str,
    to: &Path,
) -> Result<CopyReport, CopyError> {
    mirror(&mut Session::over(stream), from, to, &()).await
}

/// Copies the contents of local `from` into the workspace's directory `to` (`""`: the
/// workspace itself) over `stream`.
pub(crate) async fn upload_tree_over(
    stream: crate::plane::FramedStream,
    from: &Path,
    to: &str,
) -> Result<CopyReport, CopyError> {
    upload_tree(&mut Session::over(stream), from, to, &()).await
}
