//! The Docker executor: runs a lease's container on this host, hardened, and removes it.
//!
//! It talks to the local Docker daemon through bollard. Images are never pulled (these
//! machines reach no registry): a lease names an image by content digest, and a digest that
//! is not on the host is refused with [`ExecError::ImageMissing`]. Every container is built by
//! [`container_config`] (labels, no capabilities, `no-new-privileges`, read-only root with a
//! tmpfs scratch, limits, no network unless allowed, GPUs only by device request). At lease
//! end [`Executor::remove`] deletes the container with its volumes and checks they are gone.
//!
//! ```no_run
//! # async fn demo() -> Result<(), gpux_node::executor::ExecError> {
//! use gpux_node::executor::{ContainerSpec, Executor, GpuBinding, LogCursor};
//!
//! let executor = Executor::connect("12D3KooW...").await?;
//! let image = gpux_node::executor::build_workload_image(&executor, "/bin/busybox".as_ref()).await?;
//! let id = executor
//!     .start(&ContainerSpec {
//!         lease: "00ff".into(),
//!         image,
//!         command: vec!["sh".into(), "-c".into(), "echo hi".into()],
//!         env: vec![],
//!         memory_bytes: 256 << 20,
//!         cpu_millis: 1000,
//!         pids: 64,
//!         scratch_bytes: 64 << 20,
//!         shm_bytes: 64 << 20,
//!         network: false,
//!         gpus: GpuBinding::Fake(Vec::new()),
//!         workspace: None,
//!         run_dir: None,
//!     })
//!     .await?;
//! let (output, _next) = executor.logs_since(&id, LogCursor::START, 1 << 20).await?;
//! executor.remove(&id).await?;
//! # Ok(())
//! # }
//! ```

mod exec;
mod image;
mod images;
mod logs;
mod pull;
mod spec;
mod workspace;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListImagesOptions, ListVolumesOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, StatsOptionsBuilder, StopContainerOptionsBuilder,
    WaitContainerOptions,
};
use futures::StreamExt;
use gpux_protocol::ImageDigest;

pub use exec::{ExecProcess, ExecSession, RELAY_BIN, RELAY_DIR, check_env};
pub use image::{BUSYBOX_PATH, WORKLOAD_TAG, build_workload_image};
pub use logs::LogCursor;
pub use pull::{PullError, PullProgress, Pulled};
pub use spec::{
    ContainerSpec, FAKE_DEVICES_ENV, GpuBinding, LEASE_LABEL, NODE_LABEL, SCRATCH_DIR,
    WORKLOAD_USER, container_config,
};
pub use workspace::{DEFAULT_RETAIN_S, MIN_WORKSPACE_BYTES, WORKSPACE_DIR, Workspaces};

/// How long [`Executor::remove`] waits for Docker to finish a removal already under way.
const REMOVAL_WAIT: Duration = Duration::from_secs(10);

/// What went wrong talking to Docker or building a container.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The daemon did not answer.
    #[error("cannot reach the Docker daemon at {socket}: {source}")]
    Connect {
        /// The socket tried.
        socket: String,
        /// Why.
        #[source]
        source: DockerError,
    },
    /// The lease's image is not on this host (and cannot be pulled).
    #[error(
        "image {image} is not on this host (hosts pull nothing: the image must be loaded first)"
    )]
    ImageMissing {
        /// The image asked for.
        image: ImageDigest,
    },
    /// The renter tried to set an `NVIDIA_*` variable.
    #[error("the renter may not set {name}: NVIDIA_* variables are set by the host")]
    ReservedEnv {
        /// The variable.
        name: String,
    },
    /// A spec the executor will not run.
    #[error("invalid container spec: {reason}")]
    InvalidSpec {
        /// Why.
        reason: String,
    },
    /// The container does not exist (any more).
    #[error("container {id} is not on this host")]
    NoSuchContainer {
        /// The container id.
        id: String,
    },
    /// A container was removed but is still listed.
    #[error("container {id} is still present after it was removed")]
    NotRemoved {
        /// The container id.
        id: String,
    },
    /// A volume of a removed container is still there.
    #[error("volume {volume} of container {id} is still present after the container was removed")]
    VolumeLeft {
        /// The container id.
        id: String,
        /// The volume name.
        volume: String,
    },
    /// No busybox to build the workload image from.
    #[error("{path} is missing: install Debian's busybox-static (apt-get install busybox-static)")]
    BusyboxMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A busybox that would not run in a `FROM scratch` image.
    #[error(
        "{path} is not a statically linked 64-bit executable, so it cannot run in a FROM scratch image: install Debian's busybox-static (apt-get install busybox-static)"
    )]
    BusyboxNotStatic {
        /// The file.
        path: PathBuf,
    },
    /// A local file could not be read or run.
    #[error("cannot use {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A lease's workspace could not be made or removed.
    #[error("the lease's workspace: {reason}")]
    Workspace {
        /// What failed.
        reason: String,
    },
    /// Docker failed to build the workload image.
    #[error("building the workload image failed: {message}")]
    Build {
        /// The builder's words.
        message: String,
    },
    /// Any other failed Docker call.
    #[error("Docker {op} failed: {source}")]
    Docker {
        /// The operation (`create container`, `stats`, ...).
        op: &'static str,
        /// The daemon's or the transport's error.
        #[source]
        source: DockerError,
    },
    /// The daemon answered something the executor cannot use.
    #[error("unexpected answer from the Docker daemon to {op}: {detail}")]
    Unexpected {
        /// The operation.
        op: &'static str,
        /// What was wrong with it.
        detail: String,
    },
}

fn docker_err(op: &'static str) -> impl FnOnce(DockerError) -> ExecError {
    move |source| ExecError::Docker { op, source }
}

/// Whether `e` is the daemon answering with HTTP `status`.
fn is_status(e: &DockerError, status: u16) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if *status_code == status)
}

/// A container's state, from Docker's inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Whether it is running now.
    pub running: bool,
    /// When it started, unix ms; `None` before it ever started.
    pub started_at_ms: Option<u64>,
    /// When it stopped, unix ms; `None` while it has not.
    pub finished_at_ms: Option<u64>,
    /// Its exit code once it has stopped (Docker reports 0 before it runs).
    pub exit_code: Option<i64>,
    /// Whether the kernel's OOM killer ended it.
    pub oom_killed: bool,
}

/// One reading of a container's resource use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// Memory in use, bytes, less the inactive page cache (as `docker stats` counts it).
    pub memory_bytes: u64,
    /// CPU time used since the container started, nanoseconds, all cores together.
    pub cpu_total_ns: u64,
    /// Processes (and threads) now.
    pub pids: u64,
}

/// What a Docker daemon says about itself (see [`Executor::facts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerFacts {
    /// The daemon's version (`20.10.24`).
    pub version: String,
    /// The API version agreed with it (`1.41`).
    pub api_version: String,
    /// The container runtimes it has (`runc`, `nvidia`).
    pub runtimes: Vec<String>,
    /// The cgroup version it runs containers under (1 or 2), when it says.
    pub cgroup_version: Option<u8>,
    /// Where it keeps images and containers.
    pub root_dir: Option<PathBuf>,
}

/// Runs leases' containers on the local Docker daemon. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Executor {
    docker: Docker,
    node: Arc<str>,
    /// The host's static busybox, mounted read-only into every container as the forward
    /// relay; `None` when the host has none (forwards are then refused).
    relay: Option<Arc<std::path::Path>>,
}

/// Where bollard's local connection goes: `DOCKER_HOST` when it names a unix socket,
/// otherwise Docker's default socket.
fn local_socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| h.starts_with("unix://"))
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into())
}

/// Parses Docker's RFC 3339 times; its zero time (`0001-01-01T00:00:00Z`) is `None`.
fn unix_ms(text: Option<&str>) -> Option<u64> {
    let time = humantime::parse_rfc3339(text?).ok()?;
    let ms = time.duration_since(UNIX_EPOCH).ok()?.as_millis();
    u64::try_from(ms).ok().filter(|&ms| ms > 0)
}

impl Executor {
    /// Connects to the local Docker daemon and agrees on an API version with it (Docker 20.10
    /// speaks at most 1.41, older than bollard's default). `node` is this host's peer id,
    /// written to every container's `gpux.node` label.
    pub async fn connect(node: &str) -> Result<Self, ExecError> {
        let socket = local_socket();
        let connect_err = |source| ExecError::Connect {
            socket: socket.clone(),
            source,
        };
        let docker = Docker::connect_with_local_defaults()
            .map_err(connect_err)?
            .negotiate_version()
            .await
            .map_err(connect_err)?;
        let relay = image::static_busybox(std::path::Path::new(BUSYBOX_PATH))
            .await
            .then(|| Arc::from(std::path::Path::new(BUSYBOX_PATH)));
        if relay.is_none() {
            tracing::warn!(
                "no static busybox at {BUSYBOX_PATH}: `gpux forward` into this host's leases is refused (apt-get install busybox-static)"
            );
        }
        Ok(Self {
            docker,
            node: node.into(),
            relay,
        })
    }

    /// What the Docker daemon says about itself, for `gpux host check`.
    pub async fn facts(&self) -> Result<DockerFacts, ExecError> {
        use bollard::models::SystemInfoCgroupVersionEnum as Cgroup;
        let info = self
            .docker
            .info()
            .await
            .map_err(docker_err("read the daemon's info"))?;
        let mut runtimes: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        runtimes.sort();
        Ok(DockerFacts {
            version: info.server_version.unwrap_or_default(),
            api_version: self.docker.client_version().to_string(),
            runtimes,
            cgroup_version: match info.cgroup_version {
                Some(Cgroup::_1) => Some(1),
                Some(Cgroup::_2) => Some(2),
                _ => None,
            },
            root_dir: info.docker_root_dir.map(PathBuf::from),
        })
    }

    /// The relay mounted into containers, if this host has one.
    pub fn relay(&self) -> Option<&std::path::Path> {
        self.relay.as_deref()
    }

    /// The bollard client, for what this type does not wrap.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// The node label this executor writes and lists by.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Whether the image with this id is on the host.
    pub async fn has_image(&self, image: &ImageDigest) -> Result<bool, ExecError> {
        match self.docker.inspect_image(&image.to_string()).await {
            Ok(found) => Ok(found.id.as_deref() == Some(&*image.to_string())),
            Err(e) if is_status(&e, 404) => Ok(false),
            Err(e) => Err(docker_err("inspect image")(e)),
        }
    }

    /// The ids of every image on the host (the sha256 of each image's config), sorted.
    pub async fn list_images(&self) -> Result<Vec<ImageDigest>, ExecError> {
        let images = self
            .docker
            .list_images(None::<ListImagesOptions>)
            .await
            .map_err(docker_err("list images"))?;
        let mut ids: Vec<ImageDigest> = images.iter().filter_map(|i| i.id.parse().ok()).collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// Creates and starts the container for `spec`; returns its id. Refuses a spec that
    /// fails [`ContainerSpec::check`] and an image that is not on the host.
    pub async fn start(&self, spec: &ContainerSpec) -> Result<String, ExecError> {
        spec.check()?;
        let image = match self.docker.inspect_image(&spec.image.to_string()).await {
            Ok(image) if image.id.as_deref() == Some(&*spec.image.to_string()) => image,
            Ok(_) => return Err(ExecError::ImageMissing { image: spec.image }),
            Err(e) if is_status(&e, 404) => {
                return Err(ExecError::ImageMissing { image: spec.image });
            }
            Err(e) => return Err(docker_err("inspect image")(e)),
        };
        let mut body = container_config(spec, &self.node);
        let volumes = image.config.and_then(|c| c.volumes).unwrap_or_default();
        spec::shadow_image_volumes(&mut body, volumes, spec.scratch_bytes);
        if let Some(relay) = &self.relay {
            if let Some(dir) = &spec.run_dir {
                // The relay is bound over a file of the lease's directory, which the
                // container sees read-only: the mount point must exist there first.
                let point = dir.join("busybox");
                if !point.exists() {
                    tokio::fs::write(&point, b"")
                        .await
                        .map_err(|source| ExecError::Io {
                            path: point.clone(),
                            source,
                        })?;
                }
            }
            spec::mount_relay(&mut body, relay);
        }
        let created = match self.docker.create_container(None, body).await {
            Ok(created) => created,
            Err(e) if is_status(&e, 404) => {
                return Err(ExecError::ImageMissing { image: spec.image });
            }
            Err(e) => return Err(docker_err("create container")(e)),
        };
        if let Err(e) = self.docker.start_container(&created.id, None).await {
            // Leave nothing behind; the start error is the one worth reporting.
            let _ = self.remove(&created.id).await;
            return Err(docker_err("start container")(e));
        }
        Ok(created.id)
    }

    /// The container's state; `None` when it does not exist.
    pub async fn inspect(&self, id: &str) -> Result<Option<ContainerInfo>, ExecError> {
        let inspected = match self.docker.inspect_container(id, None).await {
            Ok(found) => found,
            Err(e) if is_status(&e, 404) => return Ok(None),
            Err(e) => return Err(docker_err("inspect container")(e)),
        };
        let state = inspected.state.unwrap_or_default();
        let running = state.running.unwrap_or(false);
        let started_at_ms = unix_ms(state.started_at.as_deref());
        let finished_at_ms = unix_ms(state.finished_at.as_deref());
        Ok(Some(ContainerInfo {
            running,
            started_at_ms,
            finished_at_ms,
            exit_code: (!running && finished_at_ms.is_some())
                .then_some(state.exit_code)
                .flatten(),
            oom_killed: state.oom_killed.unwrap_or(false),
        }))
    }

    /// One reading of the container's memory, CPU and process count.
    pub async fn sample(&self, id: &str) -> Result<Sample, ExecError> {
        let options = StatsOptionsBuilder::default()
            .stream(false)
            .one_shot(true)
            .build();
        let stats = match self.docker.stats(id, Some(options)).next().await {
            Some(Ok(stats)) => stats,
            Some(Err(e)) if is_status(&e, 404) => {
                return Err(ExecError::NoSuchContainer { id: id.into() });
            }
            Some(Err(e)) => return Err(docker_err("stats")(e)),
            None => {
                return Err(ExecError::Unexpected {
                    op: "stats",
                    detail: "no reading".into(),
                });
            }
        };
        let memory = stats.memory_stats.unwrap_or_default();
        let inactive = memory
            .stats
            .as_ref()
            .and_then(|s| {
                s.get("total_inactive_file")
                    .or_else(|| s.get("inactive_file"))
            })
            .copied()
            .unwrap_or(0);
        Ok(Sample {
            memory_bytes: memory.usage.unwrap_or(0).saturating_sub(inactive),
            cpu_total_ns: stats
                .cpu_stats
                .and_then(|c| c.cpu_usage)
                .and_then(|u| u.total_usage)
                .unwrap_or(0),
            pids: stats.pids_stats.and_then(|p| p.current).unwrap_or(0),
        })
    }

    /// The container's output (stdout and stderr together) after `cursor`, at most
    /// `max_bytes` of it (but at least one log entry, ≤ 16 KiB, when there is one), and the
    /// cursor to pass next time. Nothing is returned twice and nothing is skipped; empty
    /// output means nothing new yet. Works after the container has exited, until it is
    /// removed.
    ///
    /// Each stream's lines come in the order written. Docker copies stdout and stderr in
    /// separate goroutines, so lines written to the two within milliseconds of each other
    /// may be logged either way round (`echo a; echo b >&2` can log `b` first).
    pub async fn logs_since(
        &self,
        id: &str,
        cursor: LogCursor,
        max_bytes: usize,
    ) -> Result<(Vec<u8>, LogCursor), ExecError> {
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .timestamps(true)
            .since(cursor.since_arg())
            .build();
        let mut stream = self.docker.logs(id, Some(options));
        let mut reader = logs::LogReader::new(cursor, max_bytes);
        while let Some(item) = stream.next().await {
            let frame = match item {
                Ok(LogOutput::StdOut { message } | LogOutput::StdErr { message }) => message,
                Ok(_) => continue,
                Err(e) if is_status(&e, 404) => {
                    return Err(ExecError::NoSuchContainer { id: id.into() });
                }
                Err(e) => return Err(docker_err("logs")(e)),
            };
            let Some((second, payload)) = logs::split_entry(&frame) else {
                return Err(ExecError::Unexpected {
                    op: "logs",
                    detail: format!(
                        "an entry without a timestamp: {:?}",
                        String::from_utf8_lossy(&frame[..frame.len().min(80)])
                    ),
                });
            };
            if !reader.push(second, payload) {
                break;
            }
        }
        Ok(reader.finish())
    }

    /// Returns once the container is not running (it exited, was killed, or is gone): Docker
    /// tells at once, so an exit is noticed within moments, not at the next poll.
    pub async fn wait(&self, id: &str) {
        let mut stream = self.docker.wait_container(id, None::<WaitContainerOptions>);
        // Docker answers with the exit status (bollard reports a non-zero one as an error);
        // either way the container has stopped, or the daemon went away.
        let _ = stream.next().await;
    }

    /// Stops the container: SIGTERM, then SIGKILL after `grace_s` seconds. Fine when it has
    /// already stopped or is gone.
    pub async fn stop(&self, id: &str, grace_s: u32) -> Result<(), ExecError> {
        let options = StopContainerOptionsBuilder::default()
            .t(i32::try_from(grace_s).unwrap_or(i32::MAX))
            .build();
        match self.docker.stop_container(id, Some(options)).await {
            // 304 (already stopped) counts as success in bollard.
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(docker_err("stop container")(e)),
        }
    }

    /// Freezes every process of the container (cgroup freezer), so that a performance
    /// challenge measures the GPU without the workload on it.
    pub async fn pause(&self, id: &str) -> Result<(), ExecError> {
        self.docker
            .pause_container(id)
            .await
            .map_err(docker_err("pause container"))
    }

    /// Lets a paused container's processes run again. Fine when it is not paused.
    pub async fn unpause(&self, id: &str) -> Result<(), ExecError> {
        match self.docker.unpause_container(id).await {
            Ok(()) => Ok(()),
            // 409: not paused; 404: gone. Docker 20.10 says "is not paused" with a 500.
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(()),
            Err(e) if e.to_string().contains("is not paused") => Ok(()),
            Err(e) => Err(docker_err("unpause container")(e)),
        }
    }

    /// Removes the container (killing it if needed) with its volumes, then checks that the
    /// container and every volume it had are really gone, and that no volume labelled with
    /// its lease remains. Fine when the container was already gone.
    pub async fn remove(&self, id: &str) -> Result<(), ExecError> {
        let (lease, volumes) = match self.docker.inspect_container(id, None).await {
            Ok(found) => {
                let lease = found
                    .config
                    .and_then(|c| c.labels)
                    .and_then(|mut l| l.remove(LEASE_LABEL));
                let volumes: Vec<String> = found
                    .mounts
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|m| m.typ.as_deref() == Some("volume"))
                    .filter_map(|m| m.name)
                    .collect();
                (lease, volumes)
            }
            Err(e) if is_status(&e, 404) => (None, Vec::new()),
            Err(e) => return Err(docker_err("inspect container")(e)),
        };
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => {}
            Err(e) if is_status(&e, 404) => {}
            // "removal already in progress": wait for it below.
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(docker_err("remove container")(e)),
        }
        self.wait_gone(id).await?;
        for volume in volumes {
            match self.docker.inspect_volume(&volume).await {
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(docker_err("inspect volume")(e)),
                Ok(_) => {
                    return Err(ExecError::VolumeLeft {
                        id: id.into(),
                        volume,
                    });
                }
            }
        }
        if let Some(lease) = lease {
            let filters = HashMap::from([("label", vec![format!("{LEASE_LABEL}={lease}")])]);
            let options = ListVolumesOptionsBuilder::default()
                .filters(&filters)
                .build();
            let left = self
                .docker
                .list_volumes(Some(options))
                .await
                .map_err(docker_err("list volumes"))?;
            if let Some(volume) = left.volumes.into_iter().flatten().next() {
                return Err(ExecError::VolumeLeft {
                    id: id.into(),
                    volume: volume.name,
                });
            }
        }
        Ok(())
    }

    async fn wait_gone(&self, id: &str) -> Result<(), ExecError> {
        let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
        loop {
            match self.docker.inspect_container(id, None).await {
                Err(e) if is_status(&e, 404) => return Ok(()),
                Err(e) => return Err(docker_err("inspect container")(e)),
                Ok(_) if tokio::time::Instant::now() >= deadline => {
                    return Err(ExecError::NotRemoved { id: id.into() });
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Every container this node started that still exists, running or not, as
    /// `(lease label, container id)`.
    pub async fn containers(&self) -> Result<Vec<(String, String)>, ExecError> {
        let filters = HashMap::from([("label", vec![format!("{NODE_LABEL}={}", self.node)])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let listed = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(docker_err("list containers"))?;
        Ok(listed
            .into_iter()
            .filter_map(|c| {
                let lease = c
                    .labels
                    .and_then(|mut l| l.remove(LEASE_LABEL))
                    .unwrap_or_default();
                Some((lease, c.id?))
            })
            .collect())
    }
}
