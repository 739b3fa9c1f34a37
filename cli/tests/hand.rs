//! `gpux` hands the node's and the testnet's commands to the binaries beside it, and says
//! which one is missing when it is not there.

#![allow(clippy::unwrap_used, reason = "a test fails loudly")]

use std::process::Command;

/// `gpux` alone in a directory: a hard link where the file system allows one, else a
/// copy. (A copy is open for writing a moment, and a process the other test forks then
/// holds it open until that process execs, so running the copy can fail with "text file
/// busy": see [`output`].)
fn lone_gpux() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("gpux");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_gpux"), &copy).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_gpux"), &copy).unwrap();
    }
    (tmp, copy)
}

/// Runs `command`, trying again for a while when its file is still open for writing in a
/// process another test forked (`ETXTBSY`).
fn output(command: &mut Command) -> std::process::Output {
    let mut tries = 0;
    loop {
        match command.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 200 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
}

#[test]
fn each_handed_command_names_the_binary_it_needs_and_where() {
    let (tmp, gpux) = lone_gpux();
    for (args, binary) in [
        (&["node", "run"][..], "gpux-node"),
        (&["node", "--help"][..], "gpux-node"),
        (&["attest", "verify", "report.json"][..], "gpux-node"),
        (&["host", "check"][..], "gpux-node"),
        (
            &["host", "install", "--ledger", "x", "--price", "1"][..],
            "gpux-node",
        ),
        (&["ledger", "restore"][..], "gpux-node"),
        (&["testnet", "up"][..], "gpux-testnet"),
    ] {
        let out = output(
            Command::new(&gpux)
                .args(args)
                .env("GPUX_DATA_DIR", tmp.path()),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        let at = tmp.path().join(binary);
        assert!(
            err.contains(&format!("run by {binary}")) && err.contains(&at.display().to_string()),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_clients_own_commands_need_no_other_binary() {
    let (tmp, gpux) = lone_gpux();
    let dir = tmp.path().join("node");
    let out = output(
        Command::new(&gpux)
            .args(["init", "--json", "--data-dir"])
            .arg(&dir),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = output(Command::new(&gpux).args(["id", "--data-dir"]).arg(&dir));
    let id = String::from_utf8_lossy(&id.stdout);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(id.trim()) && id.starts_with("12D3KooW"),
        "{id}"
    );
    // Without a node, an API command says so (and not that a binary is missing).
    let out = output(Command::new(&gpux).args(["status", "--data-dir"]).arg(&dir));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("run by"), "{err}");
}
