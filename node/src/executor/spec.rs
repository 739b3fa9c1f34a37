//! What a lease's container is made of: the spec the daemon fills in from a lease, and the
//! pure translation of it into Docker's create body with every hardening option set.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, HostConfigLogConfig, Mount, MountBindOptions,
    MountBindOptionsPropagationEnum, MountType,
};
use gpux_protocol::ImageDigest;

use super::ExecError;

/// Label naming the lease a container runs (its hex id).
pub const LEASE_LABEL: &str = "gpux.lease";
/// Label naming the node (peer id) that started a container.
pub const NODE_LABEL: &str = "gpux.node";
/// Where the writable tmpfs scratch is mounted in every container.
pub const SCRATCH_DIR: &str = "/scratch";
/// The user every workload runs as: `nobody:nogroup`, numeric so the image needs no
/// `/etc/passwd`.
pub const WORKLOAD_USER: &str = "65534:65534";
/// The workload user's uid (and gid), as in [`WORKLOAD_USER`].
const WORKLOAD_UID: u32 = 65534;
/// The CFS period CPU limits are stated in, microseconds (Docker's default).
const CPU_PERIOD_US: i64 = 100_000;
/// Each log file's size before Docker rotates it, and how many it keeps: a workload that
/// floods stdout cannot fill the host's disk.
const LOG_MAX_SIZE: &str = "16m";
const LOG_MAX_FILES: &str = "3";

/// Which GPUs a container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuBinding {
    /// Simulated GPUs (testnet): no device request, no NVIDIA environment; the leased
    /// devices' names (`GPU-...`, `MIG-...`) in `GPUX_DEVICES`, so a workload (and a test)
    /// sees which it was given.
    Fake(Vec<String>),
    /// Real GPUs, by UUID as NVML prints them (`GPU-xxxxxxxx-...`): only these are passed in.
    Real(Vec<String>),
}

/// Everything the executor needs to start a lease's container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The lease id (hex), stored in the `gpux.lease` label.
    pub lease: String,
    /// The image, by content digest (its image id): never a tag, so the host cannot swap it.
    pub image: ImageDigest,
    /// Command and arguments; empty runs the image's default.
    pub command: Vec<String>,
    /// The renter's environment. `NVIDIA_*` names are refused: the host sets those.
    pub env: Vec<(String, String)>,
    /// Memory limit, bytes; swap is not allowed on top of it.
    pub memory_bytes: u64,
    /// CPU limit in thousandths of a core.
    pub cpu_millis: u32,
    /// Most processes (and threads).
    pub pids: u32,
    /// Size of each writable tmpfs (`/scratch` and `/tmp`), bytes.
    pub scratch_bytes: u64,
    /// Size of `/dev/shm`, bytes.
    pub shm_bytes: u64,
    /// Whether the container gets a network (Docker's bridge) or none at all.
    pub network: bool,
    /// The GPUs passed in.
    pub gpus: GpuBinding,
    /// The lease's workspace on the host (a mounted filesystem of the lease's size), bound
    /// at `/workspace`; `None` for a lease without one.
    pub workspace: Option<std::path::PathBuf>,
    /// A directory the host writes for the workload (a spot lease's preemption notice),
    /// bound read-only at [`RELAY_DIR`](super::RELAY_DIR); `None` for a lease without one.
    pub run_dir: Option<std::path::PathBuf>,
}

/// Whether an environment variable name is reserved for the host (`NVIDIA_*`, any case: the
/// NVIDIA container toolkit reads these to decide which devices to mount).
/// The variable naming a fake-GPU lease's devices.
pub const FAKE_DEVICES_ENV: &str = "GPUX_DEVICES";

pub(crate) fn reserved_env(name: &str) -> bool {
    name.get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("NVIDIA_"))
        || name.eq_ignore_ascii_case(FAKE_DEVICES_ENV)
}

impl ContainerSpec {
    /// Checks what [`container_config`] cannot express: no renter `NVIDIA_*` variable, a
    /// lease label, and real GPUs named plainly.
    pub fn check(&self) -> Result<(), ExecError> {
        if let Some((name, _)) = self.env.iter().find(|(name, _)| reserved_env(name)) {
            return Err(ExecError::ReservedEnv { name: name.clone() });
        }
        if let Some((name, _)) = self
            .env
            .iter()
            .find(|(name, _)| name.is_empty() || name.contains('='))
        {
            return Err(ExecError::InvalidSpec {
                reason: format!("environment variable name {name:?} is empty or contains '='"),
            });
        }
        if self.lease.is_empty() {
            return Err(ExecError::InvalidSpec {
                reason: "the lease label is empty".into(),
            });
        }
        if let GpuBinding::Real(uuids) = &self.gpus {
            if uuids.is_empty() {
                return Err(ExecError::InvalidSpec {
                    reason: "no GPU UUID given for a real GPU binding".into(),
                });
            }
            if let Some(bad) = uuids
                .iter()
                .find(|u| u.is_empty() || u.contains([',', ' ', '=']))
            {
                return Err(ExecError::InvalidSpec {
                    reason: format!("invalid GPU UUID {bad:?}"),
                });
            }
        }
        Ok(())
    }
}

/// Options for a tmpfs of `bytes`, owned by the workload's user. Exec is allowed (named:
/// Docker adds `noexec` to a tmpfs otherwise): JIT compilers (Triton, torch inductor) write
/// code to the cache under `$HOME` or `/tmp` and load it; with all capabilities dropped and
/// `no-new-privileges`, code run from there has no more power than the image's own.
/// `nosuid,nodev` keep set-uid files and device nodes meaningless. The owner matters because
/// runc gives a tmpfs the mode of the directory it covers: an image that ships `/scratch`
/// as root's 0755 would otherwise leave it (and `HOME`) unwritable. Every tmpfs counts
/// against the container's memory limit. Linux reads `size=0` as "unlimited", hence at
/// least one page.
fn tmpfs_options(bytes: u64) -> String {
    format!(
        "rw,exec,nosuid,nodev,size={},mode=1777,uid={WORKLOAD_UID},gid={WORKLOAD_UID}",
        bytes.max(4096)
    )
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Docker's create body for `spec` on `node`: pure, so the hardening is unit-tested.
///
/// Every container gets the `gpux.lease` and `gpux.node` labels, all capabilities dropped,
/// `no-new-privileges`, a read-only root with tmpfs at `/scratch` and `/tmp`, memory (no
/// swap), CPU and pids limits, no network unless `spec.network` (then Docker's bridge), no
/// bind mounts, an init process (signals reach the workload, zombies are reaped), and runs as
/// uid 65534. Renter `NVIDIA_*` variables are never emitted ([`ContainerSpec::check`] refuses
/// them before this is called). Real GPUs get a `DeviceRequest` (driver `nvidia`, capability
/// `gpu`) for exactly the leased UUIDs, and the host sets `NVIDIA_VISIBLE_DEVICES` to them.
pub fn container_config(spec: &ContainerSpec, node: &str) -> ContainerCreateBody {
    let mut env: Vec<String> = spec
        .env
        .iter()
        .filter(|(name, _)| !reserved_env(name))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    // The root is read-only and uid 65534 has no home: caches (pip, torch, triton) go to the
    // scratch unless the renter says otherwise.
    if !spec.env.iter().any(|(name, _)| name == "HOME") {
        env.push(format!("HOME={SCRATCH_DIR}"));
    }
    let device_requests = match &spec.gpus {
        GpuBinding::Fake(devices) => {
            // No device to pass in; the names the lease was given, for the workload to see.
            if !devices.is_empty() {
                env.push(format!("{FAKE_DEVICES_ENV}={}", devices.join(",")));
            }
            None
        }
        GpuBinding::Real(uuids) => {
            env.push(format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(",")));
            // Overrides whatever the image asks for (graphics, display): this is compute.
            env.push("NVIDIA_DRIVER_CAPABILITIES=compute,utility".into());
            Some(vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(uuids.clone()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }])
        }
    };
    let labels = HashMap::from([
        (LEASE_LABEL.to_string(), spec.lease.clone()),
        (NODE_LABEL.to_string(), node.to_string()),
    ]);
    let tmpfs = HashMap::from([
        (SCRATCH_DIR.to_string(), tmpfs_options(spec.scratch_bytes)),
        ("/tmp".to_string(), tmpfs_options(spec.scratch_bytes)),
    ]);
    let memory = clamp_i64(spec.memory_bytes);
    let host_config = HostConfig {
        memory: Some(memory),
        // Equal to `memory`: no swap on top of it.
        memory_swap: Some(memory),
        // A quota per period rather than `NanoCpus`: Docker refuses more `NanoCpus` than
        // the machine has, and a host may give its leases more than it measured.
        cpu_period: Some(CPU_PERIOD_US),
        cpu_quota: Some((i64::from(spec.cpu_millis) * CPU_PERIOD_US / 1000).max(1000)),
        shm_size: Some(clamp_i64(spec.shm_bytes.max(4096))),
        pids_limit: Some(i64::from(spec.pids)),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        readonly_rootfs: Some(true),
        tmpfs: Some(tmpfs),
        network_mode: Some(if spec.network { "bridge" } else { "none" }.into()),
        privileged: Some(false),
        init: Some(true),
        ipc_mode: Some("private".into()),
        // Never the nvidia runtime, even where it is the daemon's default: that runtime hands
        // out GPUs to any container whose environment (the image's included) names them.
        // Leased GPUs come only through the device request below.
        runtime: Some("runc".into()),
        log_config: Some(HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(HashMap::from([
                ("max-size".to_string(), LOG_MAX_SIZE.to_string()),
                ("max-file".to_string(), LOG_MAX_FILES.to_string()),
            ])),
        }),
        device_requests,
        ..Default::default()
    };
    let mut body = ContainerCreateBody {
        image: Some(spec.image.to_string()),
        cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
        env: Some(env),
        user: Some(WORKLOAD_USER.into()),
        labels: Some(labels),
        tty: Some(false),
        attach_stdin: Some(false),
        open_stdin: Some(false),
        host_config: Some(host_config),
        working_dir: spec
            .workspace
            .as_ref()
            .map(|_| super::WORKSPACE_DIR.to_string()),
        ..Default::default()
    };
    if let (Some(dir), Some(host)) = (&spec.run_dir, body.host_config.as_mut()) {
        host.mounts.get_or_insert_with(Vec::new).push(Mount {
            typ: Some(MountType::BIND),
            source: Some(dir.display().to_string()),
            target: Some(super::RELAY_DIR.into()),
            read_only: Some(true),
            bind_options: Some(MountBindOptions {
                propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    if let (Some(dir), Some(host)) = (&spec.workspace, body.host_config.as_mut()) {
        host.mounts.get_or_insert_with(Vec::new).push(Mount {
            typ: Some(MountType::BIND),
            source: Some(dir.display().to_string()),
            target: Some(super::WORKSPACE_DIR.into()),
            read_only: Some(false),
            bind_options: Some(MountBindOptions {
                propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    body
}

/// Covers each volume the image declares (`VOLUME` in its Dockerfile) with a scratch-sized
/// tmpfs: otherwise Docker would create an anonymous volume on the host's disk, writable,
/// unbounded and outliving the lease until removed.
pub(crate) fn shadow_image_volumes(
    body: &mut ContainerCreateBody,
    volumes: impl IntoIterator<Item = String>,
    scratch_bytes: u64,
) {
    if let Some(tmpfs) = body.host_config.as_mut().and_then(|h| h.tmpfs.as_mut()) {
        for path in volumes {
            tmpfs
                .entry(path)
                .or_insert_with(|| tmpfs_options(scratch_bytes));
        }
    }
}

/// Mounts the host's static busybox, read-only, at [`super::RELAY_BIN`]: the relay a forward
/// runs inside the container (`busybox nc` to its loopback), so forwards work with images
/// that have no `nc`. It is the only host path a container sees, and it cannot write there.
pub(crate) fn mount_relay(body: &mut ContainerCreateBody, busybox: &std::path::Path) {
    if let Some(host) = body.host_config.as_mut() {
        host.mounts.get_or_insert_with(Vec::new).push(Mount {
            typ: Some(MountType::BIND),
            source: Some(busybox.display().to_string()),
            target: Some(super::RELAY_BIN.into()),
            read_only: Some(true),
            ..Default::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(gpus: GpuBinding) -> ContainerSpec {
        ContainerSpec {
            lease: "ab".repeat(32),
            image: ImageDigest([7; 32]),
            command: vec!["sh".into(), "-c".into(), "true".into()],
            env: vec![("FOO".into(), "bar=baz".into())],
            memory_bytes: 512 << 20,
            cpu_millis: 1500,
            pids: 64,
            scratch_bytes: 100 << 20,
            shm_bytes: 100 << 20,
            network: false,
            gpus,
            workspace: None,
            run_dir: None,
        }
    }

    fn host(body: &ContainerCreateBody) -> &HostConfig {
        body.host_config.as_ref().unwrap()
    }

    #[test]
    fn every_container_is_hardened_and_labelled() {
        let s = spec(GpuBinding::Fake(Vec::new()));
        let body = container_config(&s, "node-1");
        assert_eq!(body.image.as_deref(), Some(&*s.image.to_string()));
        assert_eq!(body.cmd.as_ref(), Some(&s.command));
        assert_eq!(body.user.as_deref(), Some("65534:65534"));
        let labels = body.labels.as_ref().unwrap();
        assert_eq!(labels.len(), 2);
        assert_eq!(labels[LEASE_LABEL], s.lease);
        assert_eq!(labels[NODE_LABEL], "node-1");

        let h = host(&body);
        assert_eq!(h.cap_drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert_eq!(h.cap_add, None);
        assert_eq!(
            h.security_opt.as_deref(),
            Some(&["no-new-privileges".to_string()][..])
        );
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.privileged, Some(false));
        let tmpfs = h.tmpfs.as_ref().unwrap();
        for dir in ["/scratch", "/tmp"] {
            assert_eq!(
                tmpfs[dir],
                format!(
                    "rw,exec,nosuid,nodev,size={},mode=1777,uid=65534,gid=65534",
                    100 << 20
                )
            );
        }
        assert_eq!(h.memory, Some(512 << 20));
        assert_eq!(h.memory_swap, Some(512 << 20));
        // 1.5 cores as a quota per 100 ms period (not NanoCpus, which Docker caps at the
        // machine's count).
        assert_eq!((h.cpu_quota, h.cpu_period), (Some(150_000), Some(100_000)));
        assert_eq!(h.nano_cpus, None);
        assert_eq!(h.shm_size, Some(100 << 20));
        assert_eq!(h.pids_limit, Some(64));
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.runtime.as_deref(), Some("runc"));
        // Nothing from the host's filesystem, least of all the Docker socket.
        assert_eq!(h.binds, None);
        assert_eq!(h.mounts, None);
        assert_eq!(h.volumes_from, None);
        assert_eq!(body.volumes, None);
        assert_eq!(h.device_requests, None);
        assert_eq!(h.devices, None);
    }

    #[test]
    fn fake_gpus_get_no_device_and_no_nvidia_environment() {
        let body = container_config(&spec(GpuBinding::Fake(Vec::new())), "n");
        let env = body.env.unwrap();
        assert_eq!(env, ["FOO=bar=baz", "HOME=/scratch"]);
        assert!(host_is_gpu_free(body.host_config.as_ref().unwrap()));
    }

    fn host_is_gpu_free(h: &HostConfig) -> bool {
        h.device_requests.is_none() && h.devices.is_none()
    }

    #[test]
    fn real_gpus_are_requested_by_uuid_and_named_by_the_host() {
        let uuids = vec![
            "GPU-11111111-2222-3333-4444-555555555555".to_string(),
            "GPU-66666666-7777-8888-9999-000000000000".to_string(),
        ];
        let body = container_config(&spec(GpuBinding::Real(uuids.clone())), "n");
        let requests = host(&body).device_requests.clone().unwrap();
        assert_eq!(
            requests,
            [DeviceRequest {
                driver: Some("nvidia".into()),
                count: None,
                device_ids: Some(uuids.clone()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                options: None,
            }]
        );
        let env = body.env.unwrap();
        assert_eq!(
            env,
            [
                "FOO=bar=baz".to_string(),
                "HOME=/scratch".into(),
                format!("NVIDIA_VISIBLE_DEVICES={},{}", uuids[0], uuids[1]),
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility".into(),
            ]
        );
    }

    #[test]
    fn a_mig_slice_is_requested_alone_by_its_own_uuid() {
        let slice = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".to_string();
        let body = container_config(&spec(GpuBinding::Real(vec![slice.clone()])), "n");
        let requests = host(&body).device_requests.clone().unwrap();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].device_ids, Some(vec![slice.clone()]));
        let env = body.env.unwrap();
        assert!(
            env.contains(&format!("NVIDIA_VISIBLE_DEVICES={slice}")),
            "{env:?}"
        );
        // A fake GPU host passes no device, and names the slice for the workload.
        let body = container_config(&spec(GpuBinding::Fake(vec![slice.clone()])), "n");
        assert!(host_is_gpu_free(body.host_config.as_ref().unwrap()));
        let env = body.env.unwrap();
        assert!(env.contains(&format!("GPUX_DEVICES={slice}")), "{env:?}");
        assert!(!env.iter().any(|e| e.starts_with("NVIDIA_")), "{env:?}");
        // The renter cannot name devices itself.
        let mut s = spec(GpuBinding::Fake(vec![slice]));
        s.env.push(("GPUX_DEVICES".into(), "GPU-all".into()));
        assert!(matches!(s.check(), Err(ExecError::ReservedEnv { .. })));
    }

    #[test]
    fn renter_nvidia_variables_are_refused_and_never_emitted() {
        for name in [
            "NVIDIA_VISIBLE_DEVICES",
            "nvidia_driver_capabilities",
            "Nvidia_x",
        ] {
            let mut s = spec(GpuBinding::Real(vec!["GPU-1".into()]));
            s.env.push((name.into(), "all".into()));
            let err = s.check().unwrap_err();
            assert!(matches!(err, ExecError::ReservedEnv { .. }), "{err}");
            assert!(err.to_string().contains(name), "{err}");
            let env = container_config(&s, "n").env.unwrap();
            assert!(!env.iter().any(|e| e.contains("=all")), "{env:?}");
            assert_eq!(
                env.iter()
                    .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
                    .collect::<Vec<_>>(),
                ["NVIDIA_VISIBLE_DEVICES=GPU-1"]
            );
        }
        // Names that merely contain NVIDIA are the renter's.
        let mut s = spec(GpuBinding::Fake(Vec::new()));
        s.env.push(("MY_NVIDIA_THING".into(), "1".into()));
        s.check().unwrap();
    }

    #[test]
    fn odd_specs_are_refused() {
        let mut s = spec(GpuBinding::Real(vec![]));
        assert!(matches!(s.check(), Err(ExecError::InvalidSpec { .. })));
        s.gpus = GpuBinding::Real(vec!["GPU-1,GPU-2".into()]);
        assert!(matches!(s.check(), Err(ExecError::InvalidSpec { .. })));
        s.gpus = GpuBinding::Fake(Vec::new());
        s.check().unwrap();
        s.lease.clear();
        assert!(matches!(s.check(), Err(ExecError::InvalidSpec { .. })));
        let mut s = spec(GpuBinding::Fake(Vec::new()));
        s.env.push(("A=B".into(), "c".into()));
        assert!(matches!(s.check(), Err(ExecError::InvalidSpec { .. })));
    }

    #[test]
    fn network_zero_scratch_default_command_and_home() {
        let mut s = spec(GpuBinding::Fake(Vec::new()));
        s.network = true;
        s.scratch_bytes = 0;
        s.command.clear();
        s.env.push(("HOME".into(), "/work".into()));
        let body = container_config(&s, "n");
        assert_eq!(host(&body).network_mode.as_deref(), Some("bridge"));
        assert!(host(&body).tmpfs.as_ref().unwrap()["/scratch"].contains("size=4096,"));
        assert_eq!(body.cmd, None);
        assert_eq!(body.env.unwrap(), ["FOO=bar=baz", "HOME=/work"]);
    }

    #[test]
    fn a_workspace_is_bound_read_write_at_slash_workspace() {
        let mut s = spec(GpuBinding::Fake(Vec::new()));
        s.workspace = Some("/data/workspaces/ab/mnt".into());
        let body = container_config(&s, "n");
        let mounts = host(&body).mounts.clone().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].source.as_deref(), Some("/data/workspaces/ab/mnt"));
        assert_eq!(mounts[0].target.as_deref(), Some("/workspace"));
        assert_eq!(mounts[0].read_only, Some(false));
        assert_eq!(body.working_dir.as_deref(), Some("/workspace"));
        assert_eq!(
            container_config(&spec(GpuBinding::Fake(Vec::new())), "n").working_dir,
            None
        );
    }

    #[test]
    fn the_relay_is_mounted_read_only_and_alone() {
        let mut body = container_config(&spec(GpuBinding::Fake(Vec::new())), "n");
        mount_relay(&mut body, std::path::Path::new("/bin/busybox"));
        let mounts = host(&body).mounts.clone().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].typ, Some(MountType::BIND));
        assert_eq!(mounts[0].source.as_deref(), Some("/bin/busybox"));
        assert_eq!(mounts[0].target.as_deref(), Some("/run/gpux/busybox"));
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(host(&body).binds, None);
    }

    #[test]
    fn a_spot_lease_sees_its_run_directory_read_only_with_the_relay_inside() {
        let mut spot = spec(GpuBinding::Fake(Vec::new()));
        spot.run_dir = Some("/data/run/ab".into());
        let mut body = container_config(&spot, "n");
        mount_relay(&mut body, std::path::Path::new("/bin/busybox"));
        let mounts = host(&body).mounts.clone().unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].source.as_deref(), Some("/data/run/ab"));
        assert_eq!(mounts[0].target.as_deref(), Some("/run/gpux"));
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(mounts[1].target.as_deref(), Some("/run/gpux/busybox"));
        assert_eq!(mounts[1].read_only, Some(true));
    }

    #[test]
    fn image_volumes_are_covered_by_tmpfs() {
        let mut body = container_config(&spec(GpuBinding::Fake(Vec::new())), "n");
        shadow_image_volumes(&mut body, ["/data".to_string(), "/tmp".into()], 1 << 20);
        let tmpfs = host(&body).tmpfs.clone().unwrap();
        assert_eq!(tmpfs.len(), 3);
        assert!(tmpfs["/data"].contains(&format!("size={}", 1 << 20)));
        // An existing mount keeps its options.
        assert!(tmpfs["/tmp"].contains(&format!("size={}", 100 << 20)));
    }
}
