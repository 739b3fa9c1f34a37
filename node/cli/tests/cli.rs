//! The `gpux` binary as a user runs it.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn gpux(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpux"));
    cmd.args(args).env_remove("GPUX_DATA_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[test]
fn help_lists_the_commands() {
    let out = gpux(&["--help"], &[]);
    assert!(out.status.success());
    let text = stdout(&out);
    for word in ["init", "id", "--data-dir"] {
        assert!(text.contains(word), "{text}");
    }
}

#[test]
fn init_then_id_print_the_same_peer_id() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node");
    let dir_s = dir.to_str().unwrap();
    let init = gpux(&["init", "--data-dir", dir_s], &[]);
    assert!(init.status.success(), "{}", stderr(&init));
    let text = stdout(&init);
    let peer = text
        .lines()
        .find_map(|l| l.strip_prefix("peer id: "))
        .unwrap()
        .to_string();
    assert!(peer.starts_with("12D3KooW"), "{text}");
    assert_eq!(
        fs::metadata(dir.join("node.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );

    let id = gpux(&["id", "--data-dir", dir_s], &[]);
    assert!(id.status.success(), "{}", stderr(&id));
    assert_eq!(stdout(&id).trim(), peer);

    let json = gpux(&["--data-dir", dir_s, "id", "--json"], &[]);
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["peer_id"], peer.as_str());
    assert_eq!(doc["public_key"].as_str().unwrap().len(), 64);

    // init again keeps the key.
    let again = gpux(&["init", "--data-dir", dir_s], &[]);
    assert!(again.status.success());
    assert!(stdout(&again).contains("already exists"));
    assert!(stdout(&again).contains(&peer));
}

#[test]
fn id_refuses_a_key_others_can_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    assert!(gpux(&["init", "--data-dir", dir], &[]).status.success());
    let key = tmp.path().join("node.key");
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let out = gpux(&["id", "--data-dir", dir], &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains(&key.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("chmod 600 {}", key.display())),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn id_without_init_says_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let out = gpux(&["id", "--data-dir", tmp.path().to_str().unwrap()], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("gpux init"), "{}", stderr(&out));
}

#[test]
fn the_default_data_dir_follows_xdg() {
    let tmp = tempfile::tempdir().unwrap();
    let out = gpux(&["init"], &[("XDG_DATA_HOME", tmp.path())]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(tmp.path().join("gpux/node.key").is_file());
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpux"));
    let out = cmd
        .arg("init")
        .env_remove("XDG_DATA_HOME")
        .env_remove("GPUX_DATA_DIR")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(home.path().join(".local/share/gpux/node.key").is_file());
}
