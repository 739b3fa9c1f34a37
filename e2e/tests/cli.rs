//! The `gpux` binaries as users and hosts run them.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn gpux(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(gpux_e2e::gpux());
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
    let mut cmd = Command::new(gpux_e2e::gpux());
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

mod attest {
    //! `gpux attest` and `gpux attest verify` through the real NVML code path, with the fake
    //! driver (`$GPUX_FAKE_NVML_LIB`, or built here with cargo).

    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};
    use std::sync::OnceLock;

    pub(super) fn lib_path() -> PathBuf {
        fake_lib().to_path_buf()
    }

    fn fake_lib() -> &'static Path {
        static LIB: OnceLock<PathBuf> = OnceLock::new();
        LIB.get_or_init(|| {
            if let Some(p) = std::env::var_os("GPUX_FAKE_NVML_LIB") {
                return PathBuf::from(p);
            }
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let ok = Command::new(cargo)
                .args(["build", "-p", "gpux-fake-nvml"])
                .current_dir(&root)
                .status()
                .unwrap();
            assert!(ok.success());
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| root.join("target"), PathBuf::from);
            target.join("debug/libgpux_fake_nvml.so")
        })
    }

    fn run(dir: &Path, config: Option<&str>, args: &[&str]) -> Output {
        let mut cmd = Command::new(gpux_e2e::gpux());
        cmd.args(args)
            .arg("--data-dir")
            .arg(dir.join("node"))
            .env_remove("GPUX_FAKE_NVML_CONFIG");
        if let Some(toml) = config {
            let path = dir.join("gpus.toml");
            std::fs::write(&path, toml).unwrap();
            cmd.env("GPUX_FAKE_NVML_CONFIG", path);
        }
        cmd.output().unwrap()
    }

    const TWO: &str = r#"
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-11111111-2222-3333-4444-555555555555"
memory_total_bytes = 85520809984
compute_capability = [9, 0]

[[gpu]]
name = "NVIDIA L4"
uuid = "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
memory_total_bytes = 24152899584
compute_capability = [8, 9]
unsupported = ["ecc", "serial"]
"#;

    const DISGUISED: &str = r#"
[[gpu]]
name = "NVIDIA A100-SXM4-80GB"
uuid = "GPU-a40a40a4-0a40-a40a-40a4-0a40a40a40a4"
memory_total_bytes = 48305799168
compute_capability = [8, 6]
"#;

    /// `gpux host check --json` as (exit ok, check name -> (status, found, fix)).
    fn host_check(
        dir: &Path,
        config: Option<&str>,
        lib: &str,
    ) -> (
        bool,
        std::collections::BTreeMap<String, (String, String, String)>,
    ) {
        let out = run(dir, config, &["host", "check", "--json", "--nvml-lib", lib]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        let field = |c: &serde_json::Value, f: &str| c[f].as_str().unwrap_or("").to_string();
        let checks = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    field(c, "check"),
                    (field(c, "status"), field(c, "found"), field(c, "fix")),
                )
            })
            .collect();
        (out.status.success(), checks)
    }

    #[test]
    fn host_check_names_each_missing_piece_with_its_fix_and_the_gpus_it_finds() {
        let dir = tempfile::tempdir().unwrap();
        // What this machine's Docker has: the NVIDIA runtime's check must say the same.
        let runtimes = Command::new("docker")
            .args(["info", "--format", "{{json .Runtimes}}"])
            .output()
            .expect("docker info (the tests need a Docker daemon)");
        assert!(runtimes.status.success(), "no Docker daemon answers");
        let has_nvidia = String::from_utf8_lossy(&runtimes.stdout).contains("\"nvidia\"");

        // No NVIDIA driver: a failure, with its fix; Docker answers.
        let (ok, checks) = host_check(dir.path(), None, "/nonexistent/libnvidia-ml.so.1");
        assert!(!ok, "{checks:?}");
        let (status, _, fix) = &checks["NVIDIA driver (NVML)"];
        assert_eq!(status, "fail");
        assert!(fix.contains("nvidia-driver"), "{fix}");
        assert_eq!(checks["Docker"].0, "ok", "{checks:?}");
        let (status, found, fix) = &checks["NVIDIA container runtime"];
        if has_nvidia {
            assert_eq!(status, "ok");
        } else {
            assert_eq!(status, "fail", "{found}");
            assert!(fix.contains("nvidia-ctk runtime configure"), "{fix}");
        }
        // cgroup v1 (this machine's Docker 20.10) is said, as a warning: gpux works there.
        let (status, found, _) = &checks["cgroups"];
        assert!(
            status == "ok" || (status == "warn" && found.contains("gpux works")),
            "{found}"
        );
        for name in ["free disk (data directory)", "clock in sync"] {
            assert!(checks.contains_key(name), "{name}: {checks:?}");
        }

        // With the fake driver, the GPUs are read and named.
        let lib = fake_lib().to_str().unwrap().to_string();
        let (_, checks) = host_check(dir.path(), Some(TWO), &lib);
        let (status, found, _) = &checks["NVIDIA driver (NVML)"];
        assert_eq!(status, "ok", "{found}");
        assert!(
            found.contains("2 GPU(s)") && found.contains("NVIDIA L4"),
            "{found}"
        );
        // Measured: the machine, the workspace disk, the challenge against itself; without a
        // host's config.toml there is no first offer, and it says how to make one.
        assert!(checks["machine"].1.contains("threads"), "{checks:?}");
        assert!(checks["workspace disk"].1.contains("MB/s"), "{checks:?}");
        let (status, found, _) = &checks["challenge self-test"];
        assert!(
            status == "ok" && found.contains("INT8 product), rows checked"),
            "{found}"
        );
        let (status, found, fix) = &checks["first offer"];
        assert!(
            status == "warn" && found.starts_with("none") && fix.contains("host install"),
            "{found}"
        );
        // With one, the offer it would publish.
        std::fs::create_dir_all(dir.path().join("node")).unwrap();
        std::fs::write(
            dir.path().join("node/config.toml"),
            "host = true\nprice = \"2.50\"\nregion = \"eu-west\"\nfake_gpus = true\n",
        )
        .unwrap();
        let (_, checks) = host_check(dir.path(), Some(TWO), &lib);
        let (status, found, _) = &checks["first offer"];
        assert!(
            status == "ok"
                && found.contains("1 x NVIDIA H100 80GB HBM3, 1 x NVIDIA L4 at 2.50 credits")
                && found.contains("region eu-west"),
            "{found}"
        );
        assert!(checks["challenge self-test"].1.contains("fake GPUs"));
        std::fs::remove_file(dir.path().join("node/config.toml")).unwrap();

        // The human form: each failure with its fix, and the exit status says so.
        let out = run(
            dir.path(),
            None,
            &["host", "check", "--nvml-lib", "/nonexistent"],
        );
        assert!(!out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("FAIL") && text.contains("fix: "), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("check(s) failed"), "{err}");
    }

    #[test]
    fn host_install_writes_a_config_the_node_reads_and_a_unit_systemd_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let units = dir.path().join("units");
        let ledger =
            "/ip4/127.0.0.1/tcp/4000/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN";
        let install = |extra: &[&str]| {
            let mut args = vec![
                "host",
                "install",
                "--json",
                "--unit-dir",
                units.to_str().unwrap(),
                "--price",
                "2.10",
                "--region",
                "eu-west",
            ];
            args.extend_from_slice(extra);
            run(dir.path(), None, &args)
        };
        // A ledger that is no multiaddr: refused, nothing written.
        let out = install(&["--ledger", "not-an-address"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("ledger") && err.contains("multiaddr"), "{err}");
        assert!(!dir.path().join("node/config.toml").exists());
        assert!(!units.join("gpux-node.service").exists());

        let out = install(&["--ledger", ledger, "--spot-floor", "0.90"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let installed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let unit = PathBuf::from(installed["unit"].as_str().unwrap());
        // The node reads the configuration back as a host with those settings.
        let printed = run(dir.path(), None, &["node", "run", "--print-config"]);
        let text = String::from_utf8_lossy(&printed.stdout);
        for want in [
            "host = true",
            "price = \"2.10\"",
            "region = \"eu-west\"",
            "spot_floor = \"0.90\"",
            ledger,
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        // The unit runs the node's binary, the one beside gpux, for this data directory,
        // and systemd accepts it (nothing is started: systemd is not PID 1 here).
        let unit_text = std::fs::read_to_string(&unit).unwrap();
        let binary = std::fs::canonicalize(gpux_e2e::bin_dir().join("gpux-node")).unwrap();
        assert!(
            unit_text.contains(&format!(
                "ExecStart={} node run --data-dir ",
                binary.display()
            )),
            "{unit_text}"
        );
        let verify = Command::new("systemd-analyze")
            .args(["verify"])
            .arg(&unit)
            .output()
            .expect("systemd-analyze (Debian's systemd package)");
        assert!(
            verify.status.success(),
            "{}",
            String::from_utf8_lossy(&verify.stderr)
        );
        // Run again, nothing is replaced without --force.
        let out = install(&["--ledger", ledger]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
        assert!(install(&["--ledger", ledger, "--force"]).status.success());
    }

    fn report(dir: &Path, config: &str) -> String {
        let lib = fake_lib().to_str().unwrap().to_string();
        let out = run(dir, Some(config), &["attest", "--json", "--nvml-lib", &lib]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn verify(dir: &Path, text: &str, extra: &[&str]) -> (bool, String) {
        let file = dir.join("report.json");
        std::fs::write(&file, text).unwrap();
        let mut args = vec!["attest", "verify", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = run(dir, None, &args);
        let text = String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap();
        assert!(!text.contains("panicked"), "{text}");
        (out.status.success(), text)
    }

    #[test]
    fn a_two_gpu_report_lists_both_and_verifies() {
        let tmp = tempfile::tempdir().unwrap();
        let text = report(tmp.path(), TWO);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let uuids: Vec<&str> = doc["attestation"]["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["uuid"].as_str().unwrap())
            .collect();
        assert_eq!(
            uuids,
            [
                "GPU-11111111-2222-3333-4444-555555555555",
                "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
            ]
        );
        assert!(doc["attestation"]["gpus"][1]["ecc"].is_null());
        assert!(doc["peer_id"].as_str().unwrap().starts_with("12D3KooW"));
        let (ok, out) = verify(tmp.path(), &text, &[]);
        assert!(ok, "{out}");
        assert!(out.contains("report verified"));
    }

    #[test]
    fn a_disguised_a40_names_the_contradiction_and_fails() {
        let tmp = tempfile::tempdir().unwrap();
        let text = report(tmp.path(), DISGUISED);
        let (ok, out) = verify(tmp.path(), &text, &[]);
        assert!(!ok, "{out}");
        assert!(
            out.contains("compute capability 8.6 where the a100 has 8.0"),
            "{out}"
        );
        assert!(out.contains("match NVIDIA A40"), "{out}");
    }

    #[test]
    fn tampered_and_stale_reports_fail() {
        let tmp = tempfile::tempdir().unwrap();
        let text = report(tmp.path(), TWO);
        // The readable part no longer matches what was signed.
        let (ok, out) = verify(tmp.path(), &text.replace("NVIDIA L4", "NVIDIA L40S"), &[]);
        assert!(!ok && out.contains("FAIL content"), "{out}");
        // The envelope itself altered.
        let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let env = doc["envelope"].as_str().unwrap().to_string();
        let flipped = if env.as_bytes()[100] == b'A' {
            "B"
        } else {
            "A"
        };
        doc["envelope"] =
            serde_json::Value::String(format!("{}{}{}", &env[..100], flipped, &env[101..]));
        let (ok, out) = verify(tmp.path(), &doc.to_string(), &[]);
        assert!(!ok && out.contains("FAIL signature"), "{out}");
        // Too old at a later date, fine as of its own time.
        let created =
            serde_json::from_str::<serde_json::Value>(&text).unwrap()["attestation"]["created_at"]
                .as_u64()
                .unwrap();
        let later = (created + 2 * 86_400_000).to_string();
        let (ok, out) = verify(tmp.path(), &text, &["--at", &later]);
        assert!(!ok && out.contains("FAIL freshness"), "{out}");
        let (ok, out) = verify(tmp.path(), &text, &["--at", &created.to_string()]);
        assert!(ok, "{out}");
        let (ok, out) = verify(tmp.path(), "not json", &[]);
        assert!(!ok && out.contains("FAIL format"), "{out}");
        // r011: the shown identity must be the signer's, and no key may appear twice.
        let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        doc["peer_id"] = serde_json::Value::String(
            "12D3KooWM9pG83CZcGAKjT1BczjPTVecZtfTFxaiAhwQbfVXEMEv".into(),
        );
        let (ok, out) = verify(tmp.path(), &doc.to_string(), &[]);
        assert!(!ok && out.contains("FAIL content"), "{out}");
        let duplicated = text.replacen("{", r#"{"attestation": {"created_at": 1},"#, 1);
        let (ok, out) = verify(tmp.path(), &duplicated, &[]);
        assert!(!ok && out.contains("FAIL format"), "{out}");
        let (ok, out) = verify(tmp.path(), &text, &["--at", "20261130"]);
        assert!(!ok && out.contains("12 or more digits"), "{out}");
    }

    /// `scripts/gpu-check`, the ready check for a GPU machine, run here on the fake driver:
    /// one JSON document with the attestation (verified) and the CUDA prover's answer
    /// (this machine has no CUDA driver: it says so, and the check fails).
    #[test]
    fn gpu_check_prints_one_json_document_of_every_step() {
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("gpus.toml");
        std::fs::write(&config, TWO).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/gpu-check");
        let out = Command::new(script)
            .env("GPUX", gpux_e2e::gpux())
            .env("GPUX_NVML_LIB", fake_lib())
            .env("GPUX_FAKE_NVML_CONFIG", &config)
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let gpus = report["attest"]["attestation"]["gpus"]
            .as_array()
            .unwrap_or_else(|| panic!("{report}"));
        assert_eq!(gpus.len(), 2, "{report}");
        assert_eq!(report["attest_verify"]["passed"], true, "{report}");
        let verified = report["attest_verify"]["output"].as_str().unwrap();
        assert!(verified.contains("report verified"), "{verified}");
        let cuda = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1").exists();
        if !cuda {
            let error = report["challenge"]["error"].as_str().unwrap_or_default();
            assert!(error.contains("libcuda.so"), "{report}");
            assert_eq!(report["passed"], false);
            assert!(!out.status.success());
        }
    }

    #[test]
    fn without_a_driver_attest_fails_clearly() {
        let tmp = tempfile::tempdir().unwrap();
        let out = run(
            tmp.path(),
            None,
            &["attest", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
        );
        assert!(!out.status.success());
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            err.contains("no NVIDIA driver found (/nonexistent/libnvidia-ml.so.1)"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

mod attack;
mod challenge;
mod console;
mod estimate;
mod group;
mod hosting;
mod leases;
mod ledger;
mod ledger_cluster;
mod market;
mod metrics;
mod mig;
mod orders;
mod registry;
mod reputation;
mod resume;
mod shard;
mod sizing;
mod ssh;
mod workload;

fn attest_lib() -> std::path::PathBuf {
    attest::lib_path()
}

mod testnet {
    //! `gpux testnet up`: real processes, a report, nothing left running.

    use std::process::Command;

    /// Processes whose command line mentions `needle`.
    fn processes_mentioning(needle: &str) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
                let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                if text.contains(needle) {
                    found.push(text);
                }
            }
        }
        found
    }

    /// plane-bench's raw stream between two processes: the sink (`gpux testnet
    /// stream-sink`, a process of its own) takes every byte, into a new file when asked,
    /// and from a file the sender reads when given one.
    #[test]
    fn the_benchmark_stream_between_two_processes_carries_every_byte() {
        use gpux_testnet::plane_baselines::libp2p_stream_two_processes;
        let dir = tempfile::tempdir().unwrap();
        let into = dir.path().join("sink.bin");
        let gpux = std::path::Path::new(gpux_e2e::gpux());
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let bytes = (8 << 20) + 5;
        let took = runtime
            .block_on(libp2p_stream_two_processes(
                gpux,
                bytes,
                None,
                Some(into.clone()),
            ))
            .unwrap();
        assert!(!took.is_zero());
        assert_eq!(std::fs::metadata(&into).unwrap().len(), bytes);
        runtime
            .block_on(libp2p_stream_two_processes(gpux, 3 << 20, None, None))
            .unwrap();

        // From a file into a file: the sink's file holds the source's first bytes.
        let from = dir.path().join("source.bin");
        let source: Vec<u8> = (0..(5u32 << 20)).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&from, &source).unwrap();
        let part = (4 << 20) + 3;
        let into = dir.path().join("copied.bin");
        runtime
            .block_on(libp2p_stream_two_processes(
                gpux,
                part as u64,
                Some(&from),
                Some(into.clone()),
            ))
            .unwrap();
        assert!(std::fs::read(&into).unwrap() == source[..part]);
    }

    #[test]
    fn a_testnet_runs_reports_and_leaves_nothing_behind() {
        // The fake driver must sit next to gpux, as `cargo build --workspace` leaves it.
        let lib = super::attest_lib();
        let gpux = std::path::Path::new(gpux_e2e::gpux());
        let canon = |p: &std::path::Path| std::fs::canonicalize(p).unwrap();
        assert_eq!(
            canon(lib.parent().unwrap()),
            canon(gpux.parent().unwrap()),
            "the fake driver is not beside gpux"
        );
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("net");
        let report_path = tmp.path().join("r.json");
        // Every node in a namespace of its own, each link delayed 20 ms ± 5 ms each way and
        // losing 1% of its packets, a host and a renter behind NATs of their own; links cut
        // and healed one after another: a host from its renter mid-lease, a ledger member
        // from everyone, a renter from the ledger.
        let child = Command::new(gpux)
            .args([
                "testnet",
                "up",
                "--hosts",
                "2",
                "--renters",
                "2",
                "--duration",
                "30s",
                "--ledgers",
                "3",
                "--isolated",
                "--partition",
                "all",
                "--delay",
                "20ms",
                "--jitter",
                "5ms",
                "--loss",
                "1%",
                "--report",
            ])
            .arg(&report_path)
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let run_pid = child.id();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
        // A replicated ledger of 3 members, 2 hosts and 2 renters; host-1 offers its A100s
        // whole and, apart, the MIG slices of its first one.
        assert_eq!(report["nodes"], 7);
        // Seven addresses of their own, in the run's subnet; the links' round trips measured
        // by the nodes' pings hold both directions' delay; nothing of the network is left.
        let isolated = &report["isolated"];
        let addresses: std::collections::BTreeSet<&str> = isolated["addresses"]
            .as_object()
            .unwrap()
            .values()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(addresses.len(), 7, "{report}");
        // host-0 and renter-1 sit behind NATs of their own (the defaults): private
        // addresses, their NATs' on the bridge; everyone else on the bridge itself.
        let behind: std::collections::BTreeMap<&str, &str> = isolated["behind_nat"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(n, a)| (n.as_str(), a.as_str().unwrap()))
            .collect();
        assert_eq!(
            behind.keys().copied().collect::<Vec<_>>(),
            ["host-0", "renter-1"],
            "{report}"
        );
        let subnet = isolated["subnet"].as_str().unwrap();
        let prefix = subnet.trim_end_matches(".0.0/16");
        for (name, addr) in isolated["addresses"].as_object().unwrap() {
            let addr = addr.as_str().unwrap();
            if behind.contains_key(name.as_str()) {
                assert!(addr.starts_with("192.168."), "{report}");
            } else {
                assert!(addr.starts_with(prefix), "{report}");
            }
        }
        assert!(behind.values().all(|a| a.starts_with(prefix)), "{report}");
        // host-0 behind NAT learned it (AutoNAT), took a slot at a relay, and was rented
        // by a reachable renter and by the renter behind its own NAT, which could reach it
        // only through the relay (or a punched hole); a command, a file in and out and the
        // logs all went over that connection.
        let nat = report["nat"].as_array().unwrap();
        assert_eq!(nat.len(), 2, "{report}");
        for n in nat {
            assert_eq!(n["name"], "host-0", "{report}");
            assert_eq!(n["reachability"], "private", "{report}");
            assert!(!n["relayed_at"].as_array().unwrap().is_empty(), "{report}");
            assert_eq!(n["exec_answered"], true, "{report}");
            assert!(n["bytes_copied"].as_u64().unwrap() > 0, "{report}");
            assert!(n["log_lines"].as_u64().unwrap() >= 2, "{report}");
        }
        assert_eq!(nat[1]["renter"], "renter-1", "{report}");
        assert!(
            ["relayed", "punched"].contains(&nat[1]["connection"].as_str().unwrap()),
            "{report}"
        );
        // Every lease says how its renter reached its host.
        assert!(
            report["leases"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l["connection"] == nat[1]["connection"]),
            "{report}"
        );
        let rtt = isolated["link_rtt_ms_p50"].as_u64().unwrap();
        eprintln!("isolated links: round trip p50 {rtt} ms over 20 ms ± 5 ms each way");
        assert!((30..=200).contains(&rtt), "{report}");
        assert!(
            isolated["link_rtt_samples"].as_u64().unwrap() >= 7,
            "{report}"
        );
        assert_eq!(isolated["network_left"], serde_json::json!([]), "{report}");
        let left = gpux_testnet::netns::leftovers(run_pid);
        assert!(left.is_empty(), "left behind: {left:?}");
        let partitions = report["partitions"].as_array().unwrap();
        let scenarios: Vec<&str> = partitions
            .iter()
            .map(|p| p["scenario"].as_str().unwrap())
            .collect();
        assert_eq!(
            scenarios,
            ["host-renter", "ledger-minority", "renter-ledger"],
            "{report}"
        );
        // The host cut from its renter mid-lease lost at most a receipt interval plus the
        // grace (2 s + 5 s, + 2 s), and the lease settled (errors, checked below, say if not).
        assert!(partitions[0]["lease"].is_string(), "{report}");
        assert!(partitions[0]["unpaid_s"].as_u64().unwrap() <= 9, "{report}");
        // The majority applied a write while one member was cut off; the member caught up
        // (the members agree, below).
        assert!(
            partitions[1]["majority_write_ms"].as_u64().unwrap() <= 5000,
            "{report}"
        );
        // The renter cut from the ledger was never refused (hosts relay its escrow locks)
        // and rented again once the link healed.
        assert_eq!(partitions[2]["rents_refused_during"], 0, "{report}");
        assert_eq!(partitions[2]["rented_after_heal"], true, "{report}");
        // A host running a business (host-1, public): repriced live and seen at the new
        // price within a gossip round; stopped with SIGTERM mid-lease and started from a
        // copy of its binaries, its lease's container untouched and the lease ending by its
        // time; an Xid 79 on a leased GPU ended that lease gpu-failed within two receipt
        // intervals (2 s each), paid at most the time up to the fault, no minimum.
        let hosting = &report["hosting"];
        assert_eq!(hosting["host"], "host-1", "{report}");
        assert!(
            hosting["live_price_ms"].as_u64().unwrap() <= 15_000,
            "{report}"
        );
        assert_eq!(hosting["container_kept"], true, "{report}");
        eprintln!(
            "hosting: price seen {} ms after the change; receipts {} ms after the SIGTERM; lease ended {} ms after the fault",
            hosting["live_price_ms"], hosting["restart_gap_ms"], hosting["gpu_fault_end_ms"]
        );
        assert!(
            hosting["gpu_fault_end_ms"].as_u64().unwrap() <= 4_000,
            "{report}"
        );
        let (charged, worth) = (
            hosting["gpu_failed_charged"].as_u64().unwrap(),
            hosting["gpu_fault_worth"].as_u64().unwrap(),
        );
        let end_of = |id: &serde_json::Value| {
            report["leases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["lease"] == *id)
                .map(|l| l["end_reason"].as_str().unwrap_or("").to_string())
        };
        assert_eq!(
            end_of(&hosting["restarted_lease"]).as_deref(),
            Some("duration-reached"),
            "{report}"
        );
        assert_eq!(
            end_of(&hosting["gpu_failed_lease"]).as_deref(),
            Some("gpu-failed"),
            "{report}"
        );
        assert!(
            charged > 0 && charged <= worth + worth / 2 + 2_000,
            "{report}"
        );
        // The ledger's leader was killed mid-run: leases went on starting (and, below, all
        // settled with credits conserved), and the members agree at the end.
        assert_eq!(report["ledger_members"], 3, "{report}");
        assert!(report["ledger_leader_killed"].is_string(), "{report}");
        let failover = report["ledger_failover_ms"].as_u64().unwrap();
        eprintln!("ledger failover: writes applied again {failover} ms after the leader's loss");
        assert!(failover <= 5000, "{report}");
        let applied = report["ledger_applied"].as_array().unwrap();
        assert_eq!(applied.len(), 3, "{report}");
        assert!(applied.windows(2).all(|w| w[0] == w[1]), "{report}");
        // Every node's /metrics, on loopback, listed for Prometheus.
        let targets = report["scrape_targets"].as_object().unwrap();
        assert_eq!(targets.len(), 7, "{report}");
        assert!(
            targets
                .values()
                .all(|a| a.as_str().is_some_and(|a| a.starts_with("127.0.0.1:"))),
            "{report}"
        );
        assert!(
            report["offers_published"].as_u64().unwrap() <= 3,
            "{report}"
        );
        assert_eq!(report["offers_before_renting"], 3, "{report}");
        assert_eq!(report["offers_seen_min_before_renting"], 3, "{report}");
        assert_eq!(report["double_allocations"], 0);
        // The gossip budgets never throttle an honest market.
        assert_eq!(report["over_budget_messages"], 0, "{report}");
        assert_eq!(report["errors"], serde_json::json!([]));
        assert!(
            report["propagation_samples"].as_u64().unwrap() >= 4,
            "{report}"
        );
        // Real containers ran, were erased, and every lease settled with credits conserved.
        let started = report["containers_started"].as_u64().unwrap();
        assert!(started >= 2, "{report}");
        assert_eq!(
            report["leases_settled"].as_u64().unwrap(),
            started,
            "{report}"
        );
        assert_eq!(report["containers_left"], 0, "{report}");
        // The workload plane: a renter image no host had, its input pushed and its result
        // fetched (and checked by the run), and nothing of it left.
        assert_eq!(report["images_pushed"], 1, "{report}");
        assert!(report["image_bytes_sent"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(report["files_copied"], 2, "{report}");
        assert!(report["bytes_copied"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(report["workspaces_left"], 0, "{report}");
        assert_eq!(report["renter_images_left"], 0, "{report}");
        // An image from a registry the run started, pulled by the host; OpenSSH into its
        // lease with no sshd in the image: a command, scp in, scp out.
        assert_eq!(report["images_pulled"], 1, "{report}");
        assert!(report["pull_bytes"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(report["ssh_sessions"], 3, "{report}");
        // A spot lease was preempted by an on-demand rent: its workload saw the notice, it
        // ended preempted and paid the seconds it ran (no minimum: checked below).
        assert_eq!(report["spot_preemptions"], 1, "{report}");
        assert_eq!(report["spot_notices_seen"], 1, "{report}");
        // A reserved window on the same GPU, booked ahead, started within 2 s of its start.
        assert_eq!(report["reserved_started_on_time"], 1, "{report}");
        // The honest host passed the challenge; host-0, claiming H100s its CPU prover cannot
        // match, was caught; a group of 3 GPUs started over both hosts.
        assert_eq!(report["challenges_passed"], 1, "{report}");
        assert_eq!(report["challenges_failed"], 1, "{report}");
        assert_eq!(report["challenges_in_lease_passed"], 1, "{report}");
        assert_eq!(report["groups"], 1, "{report}");
        assert_eq!(report["mig_leases"], 1, "{report}");
        // The spot lease was rented with --resume: its work ran again after the preemption.
        assert_eq!(report["resumed_leases"], 1, "{report}");
        let preempted: Vec<_> = report["leases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["end_reason"] == "preempted")
            .collect();
        assert_eq!(preempted.len(), 1, "{report}");
        assert_eq!(preempted[0]["kind"], "spot", "{report}");
        assert!(
            preempted[0]["runtime_s"].as_f64().unwrap() < 60.0,
            "{report}"
        );
        assert!(report["receipts_acked"].as_u64().unwrap() >= 2, "{report}");
        assert!(report["credits_before"].as_u64().unwrap() > 0);
        assert_eq!(
            report["credits_before"], report["credits_after"],
            "{report}"
        );
        // Renter-0's lease kept its 64 MiB workspace 20 s at the hosts' 0.05 credits per
        // GiB-hour: 17 µcr, within what it was charged; its registry image's lease kept
        // 16 MiB 10 s: 2 µcr (the resumable spot leases keep 32 MiB for their checkpoint
        // too).
        let mut kept: Vec<u64> = report["leases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["retention_charge"].as_u64().unwrap() > 0 && l["kind"] != "spot")
            .map(|l| l["retention_charge"].as_u64().unwrap())
            .collect();
        kept.sort_unstable();
        assert_eq!(kept, [2, 17], "{report}");
        // The lease the partition cut from its renter is paid what the renter acknowledged
        // (bounded above); so is one that ran over a relay while a partition held (the cut
        // may have taken its relay): unpaid work within a receipt interval plus the grace,
        // plus 2 s. Every other is charged as expected.
        let cut_lease = &partitions[0]["lease"];
        for lease in report["leases"].as_array().unwrap() {
            if &lease["lease"] == cut_lease {
                continue;
            }
            let price = lease["price_per_gpu_hour"].as_f64().unwrap();
            let second = price * lease["gpus"].as_f64().unwrap() / 3600.0;
            let (charged, expected) = (
                lease["charged"].as_f64().unwrap(),
                lease["expected"].as_f64().unwrap(),
            );
            let runtime_s = lease["runtime_s"].as_f64().unwrap();
            assert!(runtime_s > 0.0, "{lease}");
            if lease["indirect_across_cut"] == true {
                assert_ne!(lease["connection"], "direct", "{lease}");
                assert!(runtime_s - charged / second <= 9.0, "{lease}");
                assert!(charged <= expected + second, "{lease}");
            } else {
                assert!((charged - expected).abs() <= second, "{lease}");
            }
        }
        assert!(report["rent_to_running_ms_p50"].as_u64().unwrap() > 0);
        // Docker's own create+start of the same container, measured in the same run (a
        // figure beside rent_to_running_ms_p50, compared in benchmarks, not here).
        assert!(
            report["docker_start_ms_p50"].as_u64().unwrap() > 0,
            "{report}"
        );
        let left = processes_mentioning(dir.to_str().unwrap());
        assert!(left.is_empty(), "processes left running: {left:?}");
        // No workspace stays mounted: those the hosts still kept when they were stopped
        // (within their retention) are erased by the run.
        assert!(report["workspaces_retained_at_stop"].is_u64(), "{report}");
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        let under: Vec<&str> = mounts
            .lines()
            .filter(|l| l.contains(dir.to_str().unwrap()))
            .collect();
        assert!(under.is_empty(), "mounts left: {under:?}");
    }

    #[test]
    fn a_missing_fake_driver_is_named() {
        // A copy of the binaries in a directory without the fake driver.
        let tmp = tempfile::tempdir().unwrap();
        gpux_e2e::place_binaries(tmp.path());
        let copy = tmp.path().join("gpux");
        let out = gpux_e2e::output(Command::new(&copy).args(["testnet", "up", "--duration", "1s"]));
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("the fake NVML driver is missing")
                && err.contains("cargo build --release --workspace"),
            "{err}"
        );
    }
}

/// The command line's conventions: invalid values are usage errors (exit 2), a closed
/// standard output ends a command quietly, never with a panic.
mod conventions {
    use super::*;

    #[test]
    fn shaping_and_partitions_need_an_isolated_testnet_and_sane_values() {
        for (args, says) in [
            (&["testnet", "up", "--partition", "all"][..], "--isolated"),
            (&["testnet", "up", "--loss", "1%"], "--isolated"),
            (
                &["testnet", "up", "--isolated", "--loss", "150%"],
                "from 0 to 100",
            ),
            (
                &["testnet", "up", "--isolated", "--delay", "1h"],
                "at most 10s",
            ),
            (
                &["testnet", "up", "--isolated", "--partition", "everything"],
                "host-renter, ledger-minority and renter-ledger",
            ),
        ] {
            let out = gpux(args, &[]);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
            assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        }
    }

    #[test]
    fn zero_gpus_durations_and_amounts_are_invalid_values() {
        for args in [
            &["rent", "gpu=l4", "--gpus", "0", "--max-price", "1"][..],
            &["rent", "gpu=l4", "--duration", "0", "--max-price", "1"],
            &["bid", "gpu=l4", "--duration", "0s", "--max-price", "1"],
            &[
                "mint",
                "12D3KooWSrKnMZUcSxK8G7wmBbXdU8nFEfWGhLu6H8xjn8LmCSJb",
                "0",
            ],
        ] {
            let out = gpux(args, &[]);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
            assert!(
                stderr(&out).contains("invalid value"),
                "{args:?}: {}",
                stderr(&out)
            );
            assert!(!stderr(&out).contains("no offer"), "{}", stderr(&out));
        }
    }

    #[test]
    fn a_closed_stdout_ends_the_command_quietly() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("node");
        let dir_s = dir.to_str().unwrap();
        assert!(gpux(&["init", "--data-dir", dir_s], &[]).status.success());
        // Like `gpux id | head -0`: the reader is gone before anything is written.
        let mut child = Command::new(gpux_e2e::gpux())
            .args(["id", "--json", "--data-dir", dir_s])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }

    #[test]
    fn print_config_shows_each_setting_and_where_it_came_from() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::write(
            dir.join("config.toml"),
            "listen = [\"/ip4/127.0.0.1/tcp/4555\"]\nmdns = true\n",
        )
        .unwrap();
        let d = dir.to_str().unwrap();
        let out = gpux(
            &[
                "node",
                "run",
                "--data-dir",
                d,
                "--print-config",
                "--price",
                "2.5",
                "--host",
            ],
            &[],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        for line in [
            "listen = [\"/ip4/127.0.0.1/tcp/4555\"]  # config.toml",
            "mdns = true  # config.toml",
            "price = \"2.5\"  # flag",
            "republish_s = 120  # default",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // A bad value in the file names the key and the line, and nothing starts.
        fs::write(
            dir.join("config.toml"),
            "mdns = true\nreceipt_interval_s = 0\n",
        )
        .unwrap();
        let out = gpux(&["node", "run", "--data-dir", d], &[]);
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert!(
            err.contains("config.toml line 2") && err.contains("receipt_interval_s"),
            "{err}"
        );
        assert!(!dir.join("api.addr").exists());
    }
}
