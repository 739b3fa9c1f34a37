//! Commands in a running lease container (`docker exec`), for `gpux exec` and the relay that
//! carries `gpux forward`'s connections to the container's loopback.
//!
//! Every command runs as the workload's user ([`WORKLOAD_USER`]), never privileged; its
//! environment follows the lease's rules (no `NVIDIA_*`). Docker has no call to kill an exec:
//! it ends with its own process, or with the container.

use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use futures::Stream;
use tokio::io::AsyncWrite;

use super::spec::{WORKLOAD_USER, reserved_env};
use super::{ExecError, Executor, docker_err};

/// Where the host's relay (its static busybox, read-only) appears in every container.
pub const RELAY_DIR: &str = "/run/gpux";
/// The relay binary inside the container.
pub const RELAY_BIN: &str = "/run/gpux/busybox";

/// How often the exit of a finished command is polled for (Docker reports it a moment after
/// the output ends), and for how long.
const EXIT_POLL: Duration = Duration::from_millis(20);
const EXIT_WAIT: Duration = Duration::from_secs(5);
/// How long a forward's connection to the container's port may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// A running command: its output, its stdin, and its id for resizing and the exit code.
pub struct ExecSession {
    /// Docker's exec id.
    pub id: String,
    /// What it writes: stdout and stderr apart, or the terminal's bytes with a tty.
    pub output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    /// Its stdin; shutting it down ends stdin.
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
}

/// A started command's process, held by a pidfd (a recycled pid is never signalled), to end
/// it when nobody waits for it any more: Docker has no call to kill an exec.
#[derive(Debug)]
pub struct ExecProcess(Option<std::os::fd::OwnedFd>);

impl ExecProcess {
    /// Kills the process (not what it started in the background); nothing when it has
    /// ended, or when this host may not signal it (it is not root).
    pub fn kill(&self) {
        if let Some(fd) = &self.0 {
            let _ = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
        }
    }
}

impl std::fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecSession").field("id", &self.id).finish()
    }
}

/// Checks a command's environment as a lease's is checked: names neither empty, nor with
/// `=`, nor `NVIDIA_*`.
pub fn check_env(env: &[(String, String)]) -> Result<(), ExecError> {
    for (name, _) in env {
        if reserved_env(name) {
            return Err(ExecError::ReservedEnv { name: name.clone() });
        }
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(ExecError::InvalidSpec {
                reason: format!("environment variable name {name:?} is not valid"),
            });
        }
    }
    Ok(())
}

impl Executor {
    /// Starts `command` in the running container `container` as the workload's user, with
    /// stdin, stdout and stderr attached, and a terminal of `tty` (rows, columns) if given.
    pub async fn exec(
        &self,
        container: &str,
        command: Vec<String>,
        env: &[(String, String)],
        tty: Option<(u16, u16)>,
    ) -> Result<ExecSession, ExecError> {
        check_env(env)?;
        if command.is_empty() || command.iter().any(|a| a.contains('\0')) {
            return Err(ExecError::InvalidSpec {
                reason: "a command is a non-empty list of arguments without NUL".into(),
            });
        }
        let options = CreateExecOptions {
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(tty.is_some()),
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            cmd: Some(command),
            privileged: Some(false),
            user: Some(WORKLOAD_USER.to_string()),
            ..Default::default()
        };
        let created = self
            .docker
            .create_exec(container, options)
            .await
            .map_err(|e| {
                if super::is_status(&e, 404) || super::is_status(&e, 409) {
                    ExecError::NoSuchContainer {
                        id: container.to_string(),
                    }
                } else {
                    docker_err("create exec")(e)
                }
            })?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: tty.is_some(),
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(docker_err("start exec"))?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(ExecError::Unexpected {
                op: "start exec",
                detail: "the exec started detached".into(),
            });
        };
        if let Some((rows, cols)) = tty {
            // Docker 20.10 takes no size at creation (API 1.41): resize once it runs.
            let _ = self.resize_exec(&created.id, rows, cols).await;
        }
        Ok(ExecSession {
            id: created.id,
            output,
            input,
        })
    }

    /// A TCP connection to `port` on the running container's own loopback, made from this
    /// host: a fresh thread enters the container's network namespace (and nothing else),
    /// connects, and ends; the socket stays in the container's namespace. Needs root; the
    /// container keeps no network of its own, and nothing runs inside it.
    pub async fn connect_in(
        &self,
        container: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, ExecError> {
        let missing = || ExecError::NoSuchContainer {
            id: container.to_string(),
        };
        let inspected = self
            .docker
            .inspect_container(container, None)
            .await
            .map_err(|e| {
                if super::is_status(&e, 404) {
                    missing()
                } else {
                    docker_err("inspect container")(e)
                }
            })?;
        let state = inspected.state.unwrap_or_default();
        let pid = state
            .pid
            .filter(|&p| p > 0 && state.running == Some(true))
            .ok_or_else(missing)?;
        let ns = std::path::PathBuf::from(format!("/proc/{pid}/ns/net"));
        let joined = tokio::task::spawn_blocking(move || {
            // Never a pooled thread: the namespace change must die with this one.
            std::thread::spawn(move || -> std::io::Result<std::net::TcpStream> {
                let ns = std::fs::File::open(&ns)?;
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&ns),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )?;
                let to = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
                let stream = std::net::TcpStream::connect_timeout(&to, CONNECT_WITHIN)?;
                stream.set_nodelay(true)?;
                stream.set_nonblocking(true)?;
                Ok(stream)
            })
            .join()
        })
        .await;
        let connected = match joined {
            Ok(Ok(result)) => result,
            _ => Err(std::io::Error::other("the connecting thread failed")),
        };
        let stream = connected.map_err(|source| ExecError::Io {
            path: format!("127.0.0.1:{port} in container {container}").into(),
            source,
        })?;
        tokio::net::TcpStream::from_std(stream).map_err(|source| ExecError::Io {
            path: "a socket".into(),
            source,
        })
    }

    /// The process of the command `id` (Docker reports its pid in the host's namespace a
    /// moment after the start, so it is polled for, as the exit is).
    pub async fn exec_process(&self, id: &str) -> ExecProcess {
        let deadline = tokio::time::Instant::now() + EXIT_WAIT;
        let pid = loop {
            match self.docker.inspect_exec(id).await {
                Ok(inspected) => match inspected.pid.and_then(|p| i32::try_from(p).ok()) {
                    Some(pid) if pid > 0 => break Some(pid),
                    // Ended already, or not started yet.
                    _ if inspected.exit_code.is_some() => break None,
                    _ => {}
                },
                Err(_) => break None,
            }
            if tokio::time::Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(EXIT_POLL).await;
        };
        ExecProcess(
            pid.and_then(rustix::process::Pid::from_raw)
                .and_then(|pid| {
                    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
                }),
        )
    }

    /// Resizes a command's terminal.
    pub async fn resize_exec(&self, id: &str, rows: u16, cols: u16) -> Result<(), ExecError> {
        self.docker
            .resize_exec(
                id,
                ResizeExecOptions {
                    height: rows,
                    width: cols,
                },
            )
            .await
            .map_err(docker_err("resize exec"))
    }

    /// A command's exit code once it has ended (its output has closed); `None` when Docker
    /// still reports it running after a few seconds.
    pub async fn exec_exit(&self, id: &str) -> Result<Option<i64>, ExecError> {
        let deadline = tokio::time::Instant::now() + EXIT_WAIT;
        loop {
            let inspected = self
                .docker
                .inspect_exec(id)
                .await
                .map_err(docker_err("inspect exec"))?;
            if inspected.running != Some(true) {
                return Ok(inspected.exit_code);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_environment_follows_the_lease_rules() {
        check_env(&[("FOO".into(), "1".into())]).unwrap();
        for bad in ["NVIDIA_VISIBLE_DEVICES", "nvidia_x", "", "A=B", "A\0"] {
            assert!(check_env(&[(bad.into(), "all".into())]).is_err(), "{bad:?}");
        }
    }
}
