//! gpux's system tests (`tests/`) run the binaries a user runs: `gpux`, and beside it
//! `gpux-node` and `gpux-testnet`, to which `gpux` hands the node's and the testnet's
//! commands. Cargo gives a test the path of its own package's binaries only, so these are
//! found where Cargo builds every binary of the workspace: the directory above the test's
//! own executable (`target/debug/deps/..`). `cargo test --workspace` (and `scripts/test`)
//! builds them first; to run only some system tests, build them too:
//! `cargo build -p gpux -p gpux-node -p gpux-testnet && cargo test -p gpux-e2e --test cli -- ssh::`.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The binaries the system tests run, all in one directory, as they are installed.
pub const BINARIES: [&str; 3] = ["gpux", "gpux-node", "gpux-testnet"];

/// The directory that holds the built binaries (and the fake NVML driver).
///
/// # Panics
/// When a binary is not there: the tests would otherwise fail later, and less clearly.
pub fn bin_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test's own path: {e}"));
        let dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .unwrap_or_else(|| panic!("{} has no directory above its own", exe.display()))
            .to_path_buf();
        for name in BINARIES {
            let path = dir.join(name);
            assert!(
                path.is_file(),
                "{} is missing: the system tests run the built binaries; build them with \
                 `cargo build -p gpux -p gpux-node -p gpux-testnet` (`cargo test --workspace` \
                 builds them too)",
                path.display()
            );
        }
        dir
    })
}

/// The built `gpux`, as a path string (it hands the node's and testnet's commands to the
/// binaries beside it).
pub fn gpux() -> &'static str {
    static GPUX: OnceLock<String> = OnceLock::new();
    GPUX.get_or_init(|| {
        let path = bin_dir().join("gpux");
        path.to_str()
            .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()))
            .to_string()
    })
}

/// Puts the built binaries in `dir`, as a user installs them elsewhere: hard links where
/// the file system allows, else copies. (A copy is open for writing a moment, and a
/// process another test forks meanwhile holds it open until it execs: running the copy
/// can then fail with "text file busy", which [`output`] waits out.)
///
/// # Panics
/// When a binary can be neither linked nor copied there.
pub fn place_binaries(dir: &std::path::Path) {
    for name in BINARIES {
        let (from, to) = (bin_dir().join(name), dir.join(name));
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to)
                .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
        }
    }
}

/// Runs `command` to its end, trying again for up to two seconds while its file is still
/// open for writing in a process another test forked (`ETXTBSY`).
///
/// # Panics
/// When it cannot be run for another reason.
pub fn output(command: &mut std::process::Command) -> std::process::Output {
    let mut tries = 0;
    loop {
        match command.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 200 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("running {command:?}: {e}"),
            Ok(out) => return out,
        }
    }
}
