//! The Docker executor against the real local daemon. These tests fail (they do not skip)
//! when no daemon runs or busybox-static is missing: `scripts/test` installs busybox.

use std::path::Path;
use std::time::{Duration, Instant};

use gpux_node::executor::{
    BUSYBOX_PATH, ContainerSpec, ExecError, Executor, GpuBinding, LogCursor, WORKLOAD_TAG,
    build_workload_image,
};
use gpux_protocol::ImageDigest;

/// A node label of its own for each test, so tests running at once never see (or clean up)
/// each other's containers.
fn node_label(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test-{test}-{}-{nanos}", std::process::id())
}

/// Removes every container of its node label when dropped, even when the test panicked.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let node = self.0.clone();
        // Drop cannot await, and the test's runtime may be shutting down: use a fresh one.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let executor = Executor::connect(&node).await.unwrap();
                for (_, id) in executor.containers().await.unwrap() {
                    let _ = executor.remove(&id).await;
                }
            });
        })
        .join();
    }
}

async fn setup(test: &str) -> (Executor, ImageDigest, Cleanup) {
    let node = node_label(test);
    let executor = Executor::connect(&node)
        .await
        .unwrap_or_else(|e| panic!("the executor tests need a running Docker daemon: {e}"));
    let image = *IMAGE
        .get_or_init(|| async {
            let image = build_workload_image(&executor, Path::new(BUSYBOX_PATH))
                .await
                .unwrap();
            // Building again finds the cached image.
            let again = build_workload_image(&executor, Path::new(BUSYBOX_PATH))
                .await
                .unwrap();
            assert_eq!(again, image);
            image
        })
        .await;
    (executor, image, Cleanup(node))
}

/// The workload image, built once per test run: builds running at once, with nothing
/// cached yet, would each make an image of their own.
static IMAGE: tokio::sync::OnceCell<ImageDigest> = tokio::sync::OnceCell::const_new();

fn spec(image: ImageDigest, lease: &str, script: &str) -> ContainerSpec {
    ContainerSpec {
        lease: lease.into(),
        image,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("GREETING".into(), "hello".into())],
        memory_bytes: 64 << 20,
        cpu_millis: 500,
        pids: 32,
        scratch_bytes: 8 << 20,
        shm_bytes: 8 << 20,
        network: false,
        gpus: GpuBinding::Fake(Vec::new()),
        workspace: None,
        run_dir: None,
    }
}

async fn wait_exit(executor: &Executor, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while executor.inspect(id).await.unwrap().unwrap().running {
        assert!(Instant::now() < deadline, "container {id} did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// All output from the start, read in pieces of at most `max` bytes.
async fn all_logs(executor: &Executor, id: &str, max: usize) -> String {
    let mut cursor = LogCursor::START;
    let mut all = Vec::new();
    loop {
        let (bytes, next) = executor.logs_since(id, cursor, max).await.unwrap();
        if bytes.is_empty() {
            return String::from_utf8(all).unwrap();
        }
        all.extend(bytes);
        cursor = next;
    }
}

const TICKS: &str =
    "echo hello; echo err >&2; i=0; while [ $i -lt 3 ]; do echo tick $i; i=$((i+1)); sleep 1; done";

/// Each stream's lines in order, each once. Docker copies stdout and stderr in separate
/// goroutines, so lines written to the two within a few milliseconds may come either way.
fn assert_in_order(output: &str) {
    let stdout: Vec<&str> = output.lines().filter(|l| *l != "err").collect();
    assert_eq!(
        stdout,
        ["hello", "tick 0", "tick 1", "tick 2"],
        "{output:?}"
    );
    assert_eq!(
        output.lines().filter(|l| *l == "err").count(),
        1,
        "{output:?}"
    );
    assert!(output.ends_with('\n'), "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_container_runs_hardened_logs_and_is_removed() {
    let (executor, image, _cleanup) = setup("run").await;
    assert!(executor.has_image(&image).await.unwrap());
    assert!(executor.list_images().await.unwrap().contains(&image));
    let tagged = executor.docker().inspect_image(WORKLOAD_TAG).await.unwrap();
    assert_eq!(tagged.id.unwrap(), image.to_string());

    let lease = "0a".repeat(32);
    let spec = spec(image, &lease, TICKS);
    let id = executor.start(&spec).await.unwrap();
    assert_eq!(
        executor.containers().await.unwrap(),
        [(lease.clone(), id.clone())]
    );

    // The hardening, as Docker reports it.
    let inspected = executor
        .docker()
        .inspect_container(&id, None)
        .await
        .unwrap();
    let host = inspected.host_config.unwrap();
    assert_eq!(host.cap_drop.unwrap(), ["ALL"]);
    assert!(host.cap_add.unwrap_or_default().is_empty());
    let security = host.security_opt.unwrap();
    assert!(
        security.iter().any(|o| o.starts_with("no-new-privileges")),
        "{security:?}"
    );
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.privileged, Some(false));
    assert_eq!(host.memory, Some(64 << 20));
    assert_eq!(host.memory_swap, Some(64 << 20));
    assert_eq!(
        (host.cpu_quota, host.cpu_period),
        (Some(50_000), Some(100_000))
    );
    assert_eq!(host.shm_size, Some(8 << 20));
    assert_eq!(host.pids_limit, Some(32));
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert!(host.binds.unwrap_or_default().is_empty());
    assert!(host.device_requests.unwrap_or_default().is_empty());
    // The one host path inside: the relay (static busybox) for forwards, read-only.
    let mounts = inspected.mounts.unwrap_or_default();
    assert!(
        mounts.iter().all(
            |m| m.destination.as_deref() == Some(gpux_node::executor::RELAY_BIN)
                && m.rw == Some(false)
        ),
        "{mounts:?}"
    );
    assert_eq!(mounts.len(), usize::from(executor.relay().is_some()));
    let config = inspected.config.unwrap();
    assert_eq!(config.user.as_deref(), Some("65534:65534"));
    let labels = config.labels.unwrap();
    assert_eq!(labels["gpux.lease"], lease);
    assert_eq!(labels["gpux.node"], executor.node());
    let env = config.env.unwrap();
    assert!(env.contains(&"GREETING=hello".to_string()), "{env:?}");
    assert!(!env.iter().any(|e| e.starts_with("NVIDIA_")), "{env:?}");

    // Output so far, then only what is new.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (first, cursor) = loop {
        let (bytes, cursor) = executor
            .logs_since(&id, LogCursor::START, 1 << 20)
            .await
            .unwrap();
        if String::from_utf8_lossy(&bytes).contains("tick 0") {
            break (String::from_utf8(bytes).unwrap(), cursor);
        }
        assert!(Instant::now() < deadline, "no output: {bytes:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        first.contains("hello\n") && first.contains("tick 0\n"),
        "{first:?}"
    );

    let sample = executor.sample(&id).await.unwrap();
    assert!(sample.pids >= 1, "{sample:?}");
    assert!(sample.cpu_total_ns > 0, "{sample:?}");
    assert!(
        sample.memory_bytes > 0 && sample.memory_bytes <= 64 << 20,
        "{sample:?}"
    );

    wait_exit(&executor, &id).await;
    let (rest, end) = executor.logs_since(&id, cursor, 1 << 20).await.unwrap();
    let whole = format!("{first}{}", String::from_utf8(rest).unwrap());
    assert_in_order(&whole);
    assert_eq!(
        executor.logs_since(&id, end, 1 << 20).await.unwrap(),
        (Vec::new(), end)
    );
    // Read in tiny pieces, the output is the same.
    assert_eq!(all_logs(&executor, &id, 1).await, whole);

    let info = executor.inspect(&id).await.unwrap().unwrap();
    assert!(!info.running);
    assert_eq!(info.exit_code, Some(0));
    assert!(!info.oom_killed);
    let started = info.started_at_ms.unwrap();
    let finished = info.finished_at_ms.unwrap();
    assert!(finished >= started + 2_000, "{info:?}");

    // Stopping a stopped container is fine.
    executor.stop(&id, 1).await.unwrap();
    executor.remove(&id).await.unwrap();
    assert_eq!(executor.inspect(&id).await.unwrap(), None);
    assert!(executor.containers().await.unwrap().is_empty());
    // Removing again is fine too.
    executor.remove(&id).await.unwrap();
    assert!(matches!(
        executor.sample(&id).await,
        Err(ExecError::NoSuchContainer { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_is_read_only_the_scratch_is_not() {
    let (executor, image, _cleanup) = setup("fs").await;
    let script = "if (echo x > /x) 2>/dev/null; then echo root-writable; else echo root-readonly; fi; \
                  echo data > /scratch/f && cat /scratch/f; echo tmp > /tmp/f && cat /tmp/f; \
                  echo home=$HOME; id -u; id -g";
    let id = executor.start(&spec(image, "0b", script)).await.unwrap();
    wait_exit(&executor, &id).await;
    assert_eq!(
        all_logs(&executor, &id, 1 << 20).await,
        "root-readonly\ndata\ntmp\nhome=/scratch\n65534\n65534\n"
    );
    assert_eq!(
        executor.inspect(&id).await.unwrap().unwrap().exit_code,
        Some(0)
    );
    executor.remove(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_container_stops_on_request() {
    let (executor, image, _cleanup) = setup("stop").await;
    let id = executor
        .start(&spec(image, "0c", "exec sleep 60"))
        .await
        .unwrap();
    let begun = Instant::now();
    executor.stop(&id, 5).await.unwrap();
    // The init process passes SIGTERM on, so the grace period is not waited out.
    assert!(
        begun.elapsed() < Duration::from_secs(4),
        "{:?}",
        begun.elapsed()
    );
    let info = executor.inspect(&id).await.unwrap().unwrap();
    assert!(!info.running);
    assert!(info.exit_code.is_some(), "{info:?}");
    executor.remove(&id).await.unwrap();
    assert!(executor.containers().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_refused_clearly() {
    let (executor, _image, _cleanup) = setup("missing").await;
    let missing = ImageDigest([0x5a; 32]);
    assert!(!executor.has_image(&missing).await.unwrap());
    let err = executor
        .start(&spec(missing, "0d", "true"))
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::ImageMissing { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("image {missing} is not on this host")),
        "{err}"
    );
    assert!(executor.containers().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renter_nvidia_variables_are_refused() {
    let (executor, image, _cleanup) = setup("nvidia").await;
    let mut spec = spec(image, "0e", "true");
    spec.env
        .push(("NVIDIA_VISIBLE_DEVICES".into(), "all".into()));
    let err = executor.start(&spec).await.unwrap_err();
    assert!(matches!(err, ExecError::ReservedEnv { .. }), "{err}");
    assert!(executor.containers().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_with_network_gets_the_bridge() {
    let (executor, image, _cleanup) = setup("net").await;
    let mut spec = spec(image, "0f", "true");
    spec.network = true;
    let id = executor.start(&spec).await.unwrap();
    let inspected = executor
        .docker()
        .inspect_container(&id, None)
        .await
        .unwrap();
    assert_eq!(
        inspected.host_config.unwrap().network_mode.as_deref(),
        Some("bridge")
    );
    executor.remove(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_busybox_names_the_package() {
    let executor = Executor::connect("test-busybox").await.unwrap();
    let err = build_workload_image(&executor, Path::new("/nonexistent/busybox"))
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::BusyboxMissing { .. }), "{err}");
    assert!(
        err.to_string().contains("apt-get install busybox-static"),
        "{err}"
    );
    // A dynamically linked executable would not run in a FROM scratch image.
    let err = build_workload_image(&executor, &std::env::current_exe().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::BusyboxNotStatic { .. }), "{err}");
}
