//! Where a node keeps its state when `--data-dir` is not given (shared by the node and its
//! clients, which find the node's API address and token there).

use std::path::PathBuf;

/// No default data directory can be worked out.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot find a data directory: neither $XDG_DATA_HOME nor $HOME is set; pass --data-dir DIR"
)]
pub struct DataDirError;

/// The platform convention: `$XDG_DATA_HOME/gpux` when `XDG_DATA_HOME` is set to an
/// absolute path, else `$HOME/.local/share/gpux`.
pub fn default_data_dir() -> Result<PathBuf, DataDirError> {
    default_from(std::env::var_os("XDG_DATA_HOME"), std::env::var_os("HOME"))
}

fn default_from(
    xdg_data_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Result<PathBuf, DataDirError> {
    // The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    if let Some(xdg) = xdg_data_home.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Ok(xdg.join("gpux"));
    }
    match home.map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(home) => Ok(home.join(".local/share/gpux")),
        None => Err(DataDirError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_xdg_then_home() {
        let p = |s: &str| Some(std::ffi::OsString::from(s));
        assert_eq!(
            default_from(p("/xdg"), p("/home/a")).unwrap(),
            PathBuf::from("/xdg/gpux")
        );
        assert_eq!(
            default_from(None, p("/home/a")).unwrap(),
            PathBuf::from("/home/a/.local/share/gpux")
        );
        assert_eq!(
            default_from(p("relative"), p("/home/a")).unwrap(),
            PathBuf::from("/home/a/.local/share/gpux")
        );
        assert!(default_from(None, None).is_err());
    }
}
