//! The trees of `gpux cp`: what a copy of a file or a directory does on its one files
//! stream, either way, as `cp -r` would.

use std::collections::BTreeSet;
use std::path::Path;

use gpux_api::CopyReport;
use gpux_protocol::plane_wire::{EntryKind, FilesError};

use super::error::{CopyError, Progress, base_name, join, local};
use super::local::{LocalDir, LocalTree, walk_local};
use super::session::Session;
use crate::plane::confined::is_part_name;

/// Copies local `from` into the workspace at `to`: into `to` when it is a directory (or
/// `into`, written with a trailing `/`), as `to` otherwise.
pub(super) async fn upload(
    session: &mut Session,
    from: &Path,
    to: &str,
    into: bool,
    progress: &dyn Progress,
) -> Result<CopyReport, CopyError> {
    let meta = tokio::fs::symlink_metadata(from)
        .await
        .map_err(local(from))?;
    let at = session.stat(to).await?;
    let target = match at {
        Some(EntryKind::Dir) => join(to, &base_name(from)?),
        None if into && !to.is_empty() => {
            session.mkdir(to).await?;
            join(to, &base_name(from)?)
        }
        Some(EntryKind::File(_)) if meta.is_dir() => {
            return Err(CopyError::Usage(format!(
                "/workspace/{to} is a file; a directory cannot be copied onto it"
            )));
        }
        _ => to.to_string(),
    };
    let mut report = CopyReport::default();
    if meta.is_file() {
        progress.total(meta.len());
        report.bytes_sent += session.put(from, &target, meta.len(), progress).await?;
        report.files = 1;
        report.bytes = meta.len();
        return Ok(report);
    }
    if !meta.is_dir() {
        return Err(CopyError::Usage(format!(
            "{} is neither a file nor a directory",
            from.display()
        )));
    }
    // A directory copied onto a name not there yet is made under that name: the same copy
    // again would find it there and copy into it, nested. Once it is made, whatever stops
    // the copy says how to go on instead.
    let made_here = at.is_none() && !into;
    let from_dir = from.to_path_buf();
    let tree = tokio::task::spawn_blocking(move || walk_local(&from_dir))
        .await
        .map_err(|e| CopyError::Link(e.to_string()))??;
    session.mkdir(&target).await?;
    put_tree(session, from, tree, &target, progress)
        .await
        .map_err(|e| {
            if !made_here {
                return e;
            }
            let why = match e {
                CopyError::Link(why) => format!("the link to the host broke ({why})"),
                e => e.to_string(),
            };
            CopyError::Made {
                why,
                made: to.to_string(),
                again: go_on_with(to, &base_name(from).unwrap_or_default()),
            }
        })
}

/// How to go on with a directory copy named `name` here that made `to` and stopped: copy it
/// into `to`'s parent, which takes it to `to` when the names agree.
fn go_on_with(to: &str, name: &str) -> String {
    let (parent, made_name) = to.rsplit_once('/').unwrap_or(("", to));
    let parent = if parent.is_empty() {
        String::new()
    } else {
        format!("{parent}/")
    };
    if made_name == name {
        format!(
            "to go on from where it stopped, copy it into the parent: `gpux cp SRC LEASE:/workspace/{parent}`"
        )
    } else {
        format!(
            "to go on from where it stopped, copy it from a local directory named {made_name:?} into the parent (`gpux cp .../{made_name} LEASE:/workspace/{parent}`), or remove /workspace/{to} and copy again"
        )
    }
}

/// Copies `tree`, walked from the local directory `from`, into the workspace's directory
/// `target`, made already.
async fn put_tree(
    session: &mut Session,
    from: &Path,
    tree: LocalTree,
    target: &str,
    progress: &dyn Progress,
) -> Result<CopyReport, CopyError> {
    let mut report = CopyReport::default();
    let LocalTree {
        files,
        dirs,
        skipped,
    } = tree;
    progress.total(files.iter().map(|(_, n)| n).sum());
    report.dirs += 1;
    for dir in &dirs {
        session.mkdir(&join(target, dir)).await?;
        report.dirs += 1;
    }
    for (file, size) in &files {
        let remote = join(target, file);
        report.bytes_sent += session
            .put(&from.join(file), &remote, *size, progress)
            .await?;
        report.files += 1;
        report.bytes += size;
    }
    report.skipped = skipped;
    Ok(report)
}

/// Copies `/workspace/{from}` to local `to`: into `to` when it is a directory (or written
/// with a trailing `/`, made then), as `to` otherwise.
pub(super) async fn download(
    session: &mut Session,
    from: &str,
    to: &Path,
    progress: &dyn Progress,
) -> Result<CopyReport, CopyError> {
    let kind = session.stat(from).await?.ok_or_else(|| CopyError::Remote {
        path: from.to_string(),
        code: FilesError::NotFound,
        detail: format!("nothing at /workspace/{from}"),
    })?;
    let name = from
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("workspace");
    // Written with a trailing `/`: a directory to copy into, made when it is not there.
    if to.as_os_str().as_encoded_bytes().ends_with(b"/") {
        tokio::fs::create_dir_all(to).await.map_err(local(to))?;
    }
    let local_is_dir = tokio::fs::metadata(to).await.is_ok_and(|m| m.is_dir());
    let target = if local_is_dir {
        to.join(name)
    } else {
        to.to_path_buf()
    };
    let mut report = CopyReport::default();
    match kind {
        EntryKind::File(size) => {
            progress.total(size);
            let name = base_name(&target)?;
            let parent = match target.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            let dir = LocalDir::open(parent)?;
            let (size, got) = session.get(from, &dir, &name, size, progress).await?;
            report.files = 1;
            report.bytes = size;
            report.bytes_sent = got;
            Ok(report)
        }
        EntryKind::Dir => Ok(get_tree(session, from, &target, progress).await?.0),
        EntryKind::Symlink | EntryKind::Other => Err(CopyError::Remote {
            path: from.to_string(),
            code: FilesError::WrongKind,
            detail: format!("/workspace/{from} is a link or a special file: never copied"),
        }),
    }
}

/// Copies the workspace's directory `from` to the local directory `target` (made), file by
/// file as [`Session::get`] does (a file already there, the same, is not sent). Returns
/// what it copied, and every path the host listed.
async fn get_tree(
    session: &mut Session,
    from: &str,
    target: &Path,
    progress: &dyn Progress,
) -> Result<(CopyReport, BTreeSet<String>), CopyError> {
    let mut report = CopyReport::default();
    let mut listed = BTreeSet::new();
    let entries = session.list(from).await?;
    let total = entries
        .iter()
        .map(|e| match e.kind {
            EntryKind::File(n) => n,
            _ => 0,
        })
        .fold(0u64, u64::saturating_add);
    progress.total(total);
    tokio::fs::create_dir_all(target)
        .await
        .map_err(local(target))?;
    let dir = LocalDir::open(target)?;
    report.dirs += 1;
    for entry in entries {
        // The host names what it lists: nothing may lead out of the target.
        if crate::plane::confined::check(&entry.path).is_err() {
            return Err(CopyError::Link(format!(
                "the host listed {:?}, a path that leaves the directory",
                entry.path.as_str()
            )));
        }
        let path = entry.path.to_string();
        listed.insert(path.clone());
        let remote = join(from, &path);
        // An interrupted put's part is the host's to go on from, not a file (and a
        // directory under such a name is skipped with all it holds, as an upload
        // skips one).
        let (above, name) = path.rsplit_once('/').unwrap_or(("", &path));
        if above.split('/').any(is_part_name) {
            continue;
        }
        if is_part_name(name) {
            report.skipped.push(path);
            continue;
        }
        match entry.kind {
            EntryKind::Dir => {
                let at = path.clone();
                dir.with(&path, move |root| root.mkdir_all(&at)).await?;
                report.dirs += 1;
            }
            EntryKind::File(listed) => {
                let (size, got) = session.get(&remote, &dir, &path, listed, progress).await?;
                report.files += 1;
                report.bytes = report.bytes.saturating_add(size);
                report.bytes_sent = report.bytes_sent.saturating_add(got);
            }
            EntryKind::Symlink | EntryKind::Other => report.skipped.push(entry.path.to_string()),
        }
    }
    Ok((report, listed))
}

/// Makes the local directory `to` a copy of the workspace's directory `from` (`""`: the
/// whole workspace): what is there already and the same is not sent again, and what the
/// workspace no longer has goes. A resume's mirror between moves.
pub(super) async fn mirror(
    session: &mut Session,
    from: &str,
    to: &Path,
    progress: &dyn Progress,
) -> Result<CopyReport, CopyError> {
    match session.stat(from).await? {
        Some(EntryKind::Dir) => {}
        None => {
            return Err(CopyError::Remote {
                path: from.to_string(),
                code: FilesError::NotFound,
                detail: format!("nothing at /workspace/{from}"),
            });
        }
        Some(_) => {
            return Err(CopyError::Remote {
                path: from.to_string(),
                code: FilesError::WrongKind,
                detail: format!("/workspace/{from} is not a directory"),
            });
        }
    }
    let (report, listed) = get_tree(session, from, to, progress).await?;
    let here = to.to_path_buf();
    let tree = tokio::task::spawn_blocking(move || walk_local(&here))
        .await
        .map_err(|e| CopyError::Link(e.to_string()))??;
    for (file, _) in tree.files.iter().filter(|(f, _)| !listed.contains(f)) {
        let path = to.join(file);
        tokio::fs::remove_file(&path).await.map_err(local(&path))?;
    }
    // The deepest first: a directory that goes takes what is under it.
    for dir in tree.dirs.iter().rev().filter(|d| !listed.contains(*d)) {
        let path = to.join(dir);
        match tokio::fs::remove_dir_all(&path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(local(&path)(e)),
            _ => {}
        }
    }
    Ok(report)
}

/// Copies the contents of the local directory `from` into the workspace's directory `to`
/// (`""`: the workspace itself), made when it is not there: a resume's move into the new
/// lease. A file the host holds already, the same, is not sent again.
pub(super) async fn upload_tree(
    session: &mut Session,
    from: &Path,
    to: &str,
    progress: &dyn Progress,
) -> Result<CopyReport, CopyError> {
    let from_dir = from.to_path_buf();
    let tree = tokio::task::spawn_blocking(move || walk_local(&from_dir))
        .await
        .map_err(|e| CopyError::Link(e.to_string()))??;
    if !to.is_empty() {
        session.mkdir(to).await?;
    }
    put_tree(session, from, tree, to, progress).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_directory_copy_says_how_to_go_on_without_nesting() {
        assert!(
            go_on_with("tree", "tree").ends_with("`gpux cp SRC LEASE:/workspace/`"),
            "{}",
            go_on_with("tree", "tree")
        );
        assert!(go_on_with("in/tree", "tree").ends_with("`gpux cp SRC LEASE:/workspace/in/`"));
        let renamed = go_on_with("in/out", "tree");
        assert!(
            renamed.contains("named \"out\"") && renamed.contains("LEASE:/workspace/in/`"),
            "{renamed}"
        );
    }
}
