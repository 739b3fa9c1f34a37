//! The probe reads every GPU through nvml-wrapper from the fake driver.

use gpux_attestation::{Plausibility, Probe, ProbeError, check_gpu};
use gpux_protocol::{Keypair, Signed, Timestamp};

use crate::fake;

const TWO: &str = r#"
driver_version = "550.54.15"
cuda_driver_version = 12040

[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-11111111-2222-3333-4444-555555555555"
memory_total_bytes = 85520809984
compute_capability = [9, 0]
pcie_max_gen = 5
power_limit_mw = 700000

[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
memory_total_bytes = 85520809984
compute_capability = [9, 0]
serial = "1654922000777"
mig_enabled = true
mig = [
  { uuid = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", profile = "1g.10gb", memory_total_bytes = 10737418240 },
  { uuid = "MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee", profile = "2g.20gb", memory_total_bytes = 21474836480 },
]
unsupported = ["serial", "ecc"]
"#;

#[test]
fn the_probe_reads_every_gpu_and_records_unsupported_fields_as_absent() {
    let (_lock, _dir) = fake::configure(TWO);
    let probe = Probe::open(Some(fake::lib())).unwrap();
    let att = probe.attestation(Timestamp(1_000)).unwrap();
    assert_eq!(att.driver_version.as_str(), "550.54.15");
    assert_eq!(
        att.cuda_driver_version.map(|v| v.to_string()),
        Some("12.4".into())
    );
    assert_eq!(att.gpus.len(), 2);
    let (a, b) = (&att.gpus[0], &att.gpus[1]);
    assert_eq!(
        a.uuid.to_string(),
        "GPU-11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(
        b.uuid.to_string(),
        "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
    );
    assert_eq!((a.index, b.index), (0, 1));
    assert_eq!(a.memory_total_bytes, 85_520_809_984);
    assert_eq!(a.compute_capability.to_string(), "9.0");
    assert_eq!((a.pcie.max_gen, a.power_limit_mw), (Some(5), Some(700_000)));
    assert!(a.serial.is_some() && a.ecc.is_some_and(|e| e.enabled));
    // Marked unsupported in the fake: absent, not an error.
    assert_eq!((b.serial.as_ref(), b.ecc), (None, None));
    let mig = b.mig.as_ref().unwrap();
    assert!(mig.enabled);
    assert_eq!(mig.instances.len(), 2);
    // Each MIG device by its own UUID (a MIG device, not a GPU), its profile read from the
    // name the driver gives it, and its own memory.
    assert_eq!(
        mig.instances[0].uuid.to_string(),
        "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    );
    assert!(mig.instances[0].uuid.is_mig());
    assert_eq!(
        mig.instances
            .iter()
            .map(|i| (i.profile.as_str(), i.memory_total_bytes))
            .collect::<Vec<_>>(),
        [("1g.10gb", 10 << 30), ("2g.20gb", 20 << 30)]
    );
    assert_eq!(check_gpu(a), Plausibility::Plausible);
    // The probed body signs and verifies like any message.
    let signed = Signed::sign(&Keypair::from_seed(&[1; 32]), att).unwrap();
    Signed::<gpux_protocol::Attestation>::from_bytes(signed.as_bytes().to_vec())
        .unwrap()
        .verify()
        .unwrap();
}

#[test]
fn telemetry_reads_what_dcgm_exports_and_it_moves_over_time() {
    let config = r#"
[[gpu]]
name = "NVIDIA L4"
uuid = "GPU-11111111-2222-3333-4444-555555555555"
memory_total_bytes = 24000000000
compute_capability = [8, 9]
utilization_gpu = 35
memory_used_bytes = 4000000000
temperature_c = 60
power_usage_mw = 50000
vary_percent = 20

[[gpu]]
name = "NVIDIA L4"
uuid = "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
memory_total_bytes = 24000000000
compute_capability = [8, 9]
unsupported = ["temperature", "power", "energy", "pcie_throughput"]
"#;
    let (_lock, _dir) = fake::configure(config);
    let probe = Probe::open(Some(fake::lib())).unwrap();
    let first = probe.telemetry().unwrap();
    assert_eq!(first.len(), 2);
    let (a, b) = (&first[0], &first[1]);
    assert_eq!(a.uuid, "GPU-11111111-2222-3333-4444-555555555555");
    assert_eq!((a.name.as_str(), a.util_percent), ("NVIDIA L4", Some(35)));
    assert_eq!(a.memory_used_bytes, 4_000_000_000);
    assert_eq!(
        a.memory_used_bytes + a.memory_free_bytes,
        24_000_000_000 - 240_000_000 // (1% reserved for the driver)
    );
    // Within the configured swing of 20%.
    let t = a.temperature_c.unwrap();
    assert!((48..=72).contains(&t), "{t}");
    let p = a.power_mw.unwrap();
    assert!((40_000..=60_000).contains(&p), "{p}");
    assert!(a.pcie_tx_kbps.is_some() && a.pcie_rx_kbps.is_some());
    // Unsupported readings are absent, not errors.
    assert_eq!(
        (b.temperature_c, b.power_mw, b.energy_mj, b.pcie_tx_kbps),
        (None, None, None, None)
    );
    // The energy counter only grows.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let later = probe.telemetry().unwrap();
    assert!(later[0].energy_mj.unwrap() > a.energy_mj.unwrap());
}

#[test]
fn a_driver_error_mid_probe_stops_it_with_the_gpu_and_field() {
    let (_lock, _dir) = fake::configure(&TWO.replace(
        r#"unsupported = ["serial", "ecc"]"#,
        r#"failing = ["power_limit"]"#,
    ));
    let probe = Probe::open(Some(fake::lib())).unwrap();
    let err = probe.attestation(Timestamp(1_000)).unwrap_err();
    assert!(
        matches!(
            err,
            ProbeError::Gpu {
                index: 1,
                field: "power limit",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("power limit of GPU 1"), "{err}");
}

#[test]
fn a_missing_library_is_a_clear_error() {
    let err =
        Probe::open(Some(std::path::Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
    assert!(matches!(err, ProbeError::NoDriver { .. }));
    assert!(
        err.to_string()
            .starts_with("no NVIDIA driver found (/nonexistent/libnvidia-ml.so.1)"),
        "{err}"
    );
}

#[test]
fn a_broken_configuration_fails_init_cleanly() {
    let (_lock, _dir) = fake::configure("this is not toml [[[");
    let err = Probe::open(Some(fake::lib())).unwrap_err();
    assert!(matches!(err, ProbeError::Init { .. }), "{err}");
}

#[test]
fn an_a40_named_a100_is_flagged() {
    let (_lock, _dir) = fake::configure(
        r#"
[[gpu]]
name = "NVIDIA A100-SXM4-80GB"
uuid = "GPU-a40a40a4-0a40-a40a-40a4-0a40a40a40a4"
memory_total_bytes = 48305799168
compute_capability = [8, 6]
"#,
    );
    let att = Probe::open(Some(fake::lib()))
        .unwrap()
        .attestation(Timestamp(0))
        .unwrap();
    let Plausibility::Implausible(why) = check_gpu(&att.gpus[0]) else {
        panic!("not flagged")
    };
    assert_eq!(why.looks_like, Some("NVIDIA A40"));
    assert!(
        why.to_string()
            .contains("compute capability 8.6 where the a100 has 8.0"),
        "{why}"
    );
}

#[test]
fn tampering_with_a_signed_report_is_detected() {
    let (_lock, _dir) = fake::configure(TWO);
    let att = Probe::open(Some(fake::lib()))
        .unwrap()
        .attestation(Timestamp(5))
        .unwrap();
    let signed = Signed::sign(&Keypair::from_seed(&[2; 32]), att).unwrap();
    let mut bytes = signed.as_bytes().to_vec();
    // Change one byte of the first GPU's name.
    let at = bytes.windows(4).position(|w| w == b"H100").unwrap();
    bytes[at + 1] = b'2';
    let err = Signed::<gpux_protocol::Attestation>::from_bytes(bytes)
        .unwrap()
        .verify()
        .unwrap_err();
    assert!(
        matches!(err, gpux_protocol::VerifyError::BadSignature),
        "{err}"
    );
}

#[test]
fn injected_faults_reach_the_xid_watch_and_a_gpu_off_the_bus_reads_as_lost() {
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults.toml");
    let config = format!(
        r#"
faults = "{}"

[[gpu]]
name = "NVIDIA L4"
uuid = "GPU-11111111-2222-3333-4444-555555555555"
memory_total_bytes = 24000000000
compute_capability = [8, 9]

[[gpu]]
name = "NVIDIA L4"
uuid = "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
memory_total_bytes = 24000000000
compute_capability = [8, 9]
"#,
        faults.display()
    );
    let (_lock, _dir) = fake::configure(&config);
    let probe = std::sync::Arc::new(Probe::open(Some(fake::lib())).unwrap());
    let before = probe.telemetry().unwrap();
    assert!(before.iter().all(|t| !t.lost && t.last_xid == 0));
    assert_eq!(before[1].ecc_uncorrected, Some(0));
    assert!(before[0].sm_clock_mhz.is_some_and(|c| c > 0 && c <= 1980));

    let (tx, rx) = std::sync::mpsc::channel();
    let watcher = {
        let probe = probe.clone();
        std::thread::spawn(move || {
            probe.watch_xids(|event| match event {
                Some(e) => {
                    tx.send(e).unwrap();
                    std::ops::ControlFlow::Break(())
                }
                None => std::ops::ControlFlow::Continue(()),
            })
        })
    };
    // Registered before the fault: give the watch a moment to register.
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::write(
        &faults,
        "[[fault]]\nuuid = \"GPU-66666666-7777-8888-9999-aaaaaaaaaaaa\"\nxid = 79\necc_uncorrected = 2\n",
    )
    .unwrap();
    let event = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the Xid reaches the watch");
    assert_eq!(
        event,
        gpux_attestation::XidEvent {
            uuid: "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa".into(),
            xid: 79
        }
    );
    assert!(gpux_attestation::fatal_xid(event.xid));
    assert!(
        !gpux_attestation::fatal_xid(13),
        "an application's own fault"
    );
    assert_eq!(
        watcher.join().unwrap().unwrap(),
        gpux_attestation::WatchEnd::Stopped
    );

    // The GPU off the bus: no readings but its name and UUID, and the Xid it raised; the
    // other GPU reads as before. Metering it fails.
    let after = probe.telemetry().unwrap();
    assert!(!after[0].lost && after[0].util_percent.is_some());
    assert!(after[1].lost, "{:?}", after[1]);
    assert_eq!(after[1].uuid, "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa");
    assert_eq!((after[1].last_xid, after[1].energy_mj), (79, None));
    assert!(
        probe
            .usage(&["GPU-66666666-7777-8888-9999-aaaaaaaaaaaa".to_string()])
            .is_err()
    );
}

#[test]
fn a_driver_without_events_is_said_and_not_watched() {
    let (_lock, _dir) = fake::configure(
        r#"
[[gpu]]
name = "NVIDIA L4"
uuid = "GPU-11111111-2222-3333-4444-555555555555"
memory_total_bytes = 24000000000
compute_capability = [8, 9]
unsupported = ["events"]
"#,
    );
    let probe = Probe::open(Some(fake::lib())).unwrap();
    let end = probe
        .watch_xids(|_| std::ops::ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(end, gpux_attestation::WatchEnd::Unsupported);
}
