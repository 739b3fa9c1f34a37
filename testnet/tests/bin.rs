//! `gpux-testnet` runs its nodes through the `gpux` beside it, and says so when there is
//! none.

#[test]
fn a_testnet_without_gpux_beside_it_names_the_missing_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("gpux-testnet");
    std::fs::copy(env!("CARGO_BIN_EXE_gpux-testnet"), &copy).unwrap();
    let out = std::process::Command::new(&copy)
        .args(["testnet", "up", "--duration", "1s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let gpux = tmp.path().join("gpux");
    assert!(
        err.contains("the testnet runs its nodes with the gpux binary")
            && err.contains(&gpux.display().to_string()),
        "{err}"
    );
}
