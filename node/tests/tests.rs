//! gpux-node integration tests: the key file on a real filesystem.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

mod executor;
mod lease;
mod p2p;
mod renter;
mod store;
mod validation;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use gpux_node::{KeyFileError, create_key, init_key, key_path, load_key};

fn mode(path: &std::path::Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_new_key_is_private_and_loads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let key = create_key(&dir).unwrap();
    assert_eq!(mode(&key_path(&dir)), 0o600);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(load_key(&dir).unwrap().public(), key.public());
    assert!(!dir.join("node.key.tmp").exists());
}

#[test]
fn a_key_readable_by_others_is_refused_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    create_key(tmp.path()).unwrap();
    let path = key_path(tmp.path());
    for bad in [0o644, 0o640, 0o604, 0o660, 0o610] {
        fs::set_permissions(&path, fs::Permissions::from_mode(bad)).unwrap();
        let err = load_key(tmp.path()).unwrap_err();
        assert!(
            matches!(err, KeyFileError::Permissions { mode, .. } if mode == bad),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("chmod 600 {}", path.display())),
            "{text}"
        );
    }
    // Owner-only modes are fine.
    for good in [0o600, 0o400] {
        fs::set_permissions(&path, fs::Permissions::from_mode(good)).unwrap();
        load_key(tmp.path()).unwrap();
    }
}

#[test]
fn an_existing_key_is_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let first = create_key(tmp.path()).unwrap();
    assert!(matches!(
        create_key(tmp.path()),
        Err(KeyFileError::AlreadyExists { .. })
    ));
    let (again, created) = init_key(tmp.path()).unwrap();
    assert!(!created);
    assert_eq!(again.public(), first.public());
}

#[test]
fn init_creates_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, created) = init_key(tmp.path()).unwrap();
    assert!(created);
    let (second, created) = init_key(tmp.path()).unwrap();
    assert!(!created);
    assert_eq!(first.peer_id(), second.peer_id());
}

#[test]
fn missing_corrupt_and_odd_key_files_get_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let err = load_key(tmp.path()).unwrap_err();
    assert!(matches!(err, KeyFileError::Missing { .. }));
    assert!(err.to_string().contains("gpux init"), "{err}");

    let path = key_path(tmp.path());
    for content in [
        "",
        "hello\n",
        "gpux node key v1\nnot-hex\n",
        "gpux node key v1\nabcd\n",
    ] {
        fs::write(&path, content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let err = load_key(tmp.path()).unwrap_err();
        assert!(
            matches!(err, KeyFileError::Malformed { .. }),
            "{content:?}: {err}"
        );
        assert!(err.to_string().contains(&path.display().to_string()));
    }
    fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
    assert!(matches!(
        load_key(tmp.path()).unwrap_err(),
        KeyFileError::Malformed { .. }
    ));
    fs::write(&path, vec![b'a'; 10_000]).unwrap();
    assert!(matches!(
        load_key(tmp.path()).unwrap_err(),
        KeyFileError::Malformed { .. }
    ));

    fs::remove_file(&path).unwrap();
    fs::create_dir(&path).unwrap();
    assert!(matches!(
        load_key(tmp.path()).unwrap_err(),
        KeyFileError::NotAFile { .. }
    ));
}

#[test]
fn a_symlinked_key_is_refused() {
    // A symlink could point at a file with other permissions or owner; refuse it outright.
    let tmp = tempfile::tempdir().unwrap();
    let real = tempfile::tempdir().unwrap();
    create_key(real.path()).unwrap();
    std::os::unix::fs::symlink(key_path(real.path()), key_path(tmp.path())).unwrap();
    assert!(matches!(
        load_key(tmp.path()).unwrap_err(),
        KeyFileError::NotAFile { .. }
    ));
}

#[test]
fn r010_concurrent_inits_never_hand_out_an_unsaved_key() {
    for _ in 0..30 {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4).map(|_| s.spawn(|| create_key(&dir))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        assert_eq!(load_key(&dir).unwrap().public(), winners[0].public());
        // No temporary file is left behind.
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("node.key")]);
    }
}

#[test]
fn a_data_dir_others_can_write_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    create_key(tmp.path()).unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let err = load_key(tmp.path()).unwrap_err();
    assert!(matches!(err, KeyFileError::DirPermissions { .. }), "{err}");
    assert!(err.to_string().contains("chmod 700"), "{err}");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    load_key(tmp.path()).unwrap();
}

#[test]
fn times_beyond_year_9999_print_without_panicking() {
    use gpux_node::attest::format_time;
    use gpux_protocol::Timestamp;
    assert_eq!(format_time(Timestamp(0)), "1970-01-01T00:00:00.000Z");
    assert!(format_time(Timestamp(253_402_300_800_000)).contains("ms after 1970"));
    assert!(format_time(Timestamp(u64::MAX)).contains("ms after 1970"));
}
