//! Finding (or building) the fake NVML driver, and pointing it at a configuration.
//!
//! The tests use `$GPUX_FAKE_NVML_LIB` when it is set (scripts/test sets it after building
//! the fake); otherwise they build `gpux-fake-nvml` themselves with cargo.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

pub fn lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(path) = std::env::var_os("GPUX_FAKE_NVML_LIB") {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "GPUX_FAKE_NVML_LIB={} does not exist",
                path.display()
            );
            return path;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "-p", "gpux-fake-nvml"])
            .current_dir(root)
            .status()
            .unwrap();
        assert!(status.success(), "building gpux-fake-nvml failed");
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        let path = target.join("debug/libgpux_fake_nvml.so");
        assert!(path.is_file(), "{} was not built", path.display());
        path
    })
}

/// The fake reads `GPUX_FAKE_NVML_CONFIG` at every `nvmlInit`; tests that set it hold this
/// lock so they do not see each other's configurations.
pub fn configure(toml: &str) -> (MutexGuard<'static, ()>, tempfile::TempDir) {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpus.toml");
    std::fs::write(&path, toml).unwrap();
    // SAFETY: tests that read or write this variable hold LOCK, so no other thread of this
    // process touches the environment meanwhile.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("GPUX_FAKE_NVML_CONFIG", &path)
    };
    (guard, dir)
}
