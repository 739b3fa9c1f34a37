//! The host's side of the workload plane: it takes `/gpux/exec/1`, `/gpux/forward/1`,
//! `/gpux/files/1` and `/gpux/ssh/1` streams and serves each in its own task.
//!
//! A stream is served only when its peer (proven by the connection's noise handshake) signed
//! the lease it names, the lease runs, and its container runs. At most
//! [`MAX_STREAMS_PER_LEASE`] streams per lease and [`MAX_STREAMS`] in all run at once; each
//! closes after [`super::IDLE`] without traffic, and at the lease's end at the latest.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use gpux_lease::HostPhase;
use gpux_protocol::plane_wire::{
    ExecInput, ExecOpen, ExecOutput, FilesOpen, ForwardOpen, MAX_EXEC_DATA, Opened, PlaneRefusal,
    SshOpen,
};
use gpux_protocol::{BoundedBytes, ContentId};
use libp2p::PeerId;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

use super::splice::{Activity, AppSide, both_ways, carry, splice};
use super::{FramedStream, OPEN_WITHIN, PlaneError, framed, recv, send};
use crate::attest::now;
use crate::executor::{ExecSession, Executor, RELAY_BIN, Workspaces};
use crate::p2p::Client;
use crate::store::{NodeState, SledStore};

/// Plane streams served at once, all leases together.
pub(crate) const MAX_STREAMS: usize = 256;
/// Plane streams served at once for one lease.
pub(crate) const MAX_STREAMS_PER_LEASE: usize = 32;
/// Plane streams being opened at once (their open frame read, their lease checked), before
/// any is admitted: what a peer without a lease can make the host do is bounded by this.
const MAX_OPENING: usize = 64;
/// How long a files stream waits for a held lease's workspace to be mounted.
const WORKSPACE_WAIT: Duration = Duration::from_secs(30);

/// What the plane's tasks share.
#[derive(Clone)]
pub(crate) struct PlaneHost {
    state: NodeState<SledStore>,
    exec: Executor,
    workspaces: Workspaces,
    all: Arc<Semaphore>,
    per_lease: Arc<Mutex<BTreeMap<ContentId, usize>>>,
    opening: Arc<Semaphore>,
    /// The SSH server's settings (the node's key is its host key).
    ssh: Arc<russh::server::Config>,
}

/// A lease the plane may serve: its container, and when the lease ends.
struct Served {
    /// `None` after the lease (a retained workspace).
    container: Option<String>,
    /// How long until the lease's end (or its workspace's erasure).
    left: Duration,
    /// The lease has a workspace by its terms (it may still be being made).
    workspace: bool,
}

impl Served {
    fn container(&self) -> Result<&str, Refusal> {
        self.container
            .as_deref()
            .ok_or((PlaneRefusal::NotRunning, "the lease has ended".to_string()))
    }
}

/// Holds one of a lease's stream slots; gives it back when dropped.
struct Slot {
    lease: ContentId,
    per_lease: Arc<Mutex<BTreeMap<ContentId, usize>>>,
    _all: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut counts) = self.per_lease.lock()
            && let Some(n) = counts.get_mut(&self.lease)
        {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.lease);
            }
        }
    }
}

type Refusal = (PlaneRefusal, String);

impl PlaneHost {
    /// Takes the plane's protocols on `net` and serves them until the network stops.
    pub(crate) fn spawn(
        net: &Client,
        key: &gpux_protocol::Keypair,
        state: NodeState<SledStore>,
        exec: Executor,
        workspaces: Workspaces,
    ) -> anyhow::Result<()> {
        let host = PlaneHost {
            state,
            exec,
            workspaces,
            all: Arc::new(Semaphore::new(MAX_STREAMS)),
            per_lease: Arc::new(Mutex::new(BTreeMap::new())),
            opening: Arc::new(Semaphore::new(MAX_OPENING)),
            ssh: super::ssh_host::config(key),
        };
        let mut ssh_streams = net.accept_streams(super::SSH)?;
        let h = host.clone();
        tokio::spawn(async move {
            while let Some((peer, stream)) = ssh_streams.next().await {
                let h = h.clone();
                tokio::spawn(async move { h.ssh(peer, framed(stream)).await });
            }
        });
        let mut exec_streams = net.accept_streams(super::EXEC)?;
        let mut forward_streams = net.accept_streams(super::FORWARD)?;
        let mut files_streams = net.accept_streams(super::FILES)?;
        let h = host.clone();
        tokio::spawn(async move {
            while let Some((peer, stream)) = files_streams.next().await {
                let h = h.clone();
                tokio::spawn(async move { h.files(peer, framed(stream)).await });
            }
        });
        let h = host.clone();
        tokio::spawn(async move {
            // Stay ready: a stream that arrives while nobody polls is dropped.
            while let Some((peer, stream)) = exec_streams.next().await {
                let h = h.clone();
                tokio::spawn(async move { h.exec(peer, framed(stream)).await });
            }
        });
        tokio::spawn(async move {
            while let Some((peer, stream)) = forward_streams.next().await {
                let h = host.clone();
                tokio::spawn(async move { h.forward(peer, framed(stream)).await });
            }
        });
        Ok(())
    }

    /// Whether `peer` may work in `lease`'s container now (or, `retained`, in its workspace
    /// kept after the lease); takes a stream slot if so.
    async fn authorize(
        &self,
        peer: PeerId,
        lease: ContentId,
        retained: bool,
    ) -> Result<(Served, Slot), Refusal> {
        let (record, request) = super::renters_lease(&self.state, peer, lease)?;
        let hex = gpux_protocol::hex(&lease.0);
        let (container, ends) = if record.phase == HostPhase::Running {
            let ends = record
                .started_at
                .map_or(now().0, |s| s.0)
                .saturating_add(u64::from(request.duration_s) * 1000);
            let container = self
                .exec
                .containers()
                .await
                .ok()
                .and_then(|all| all.into_iter().find(|(l, _)| *l == hex).map(|(_, c)| c))
                .ok_or((
                    PlaneRefusal::NotRunning,
                    format!("lease {lease} has no container now"),
                ))?;
            (Some(container), ends)
        } else if let (HostPhase::Starting, Ok(Some(wait)), Ok(Some(1..))) = (
            record.phase,
            request.commit_wait_ms(),
            request.workspace_bytes(),
        ) {
            // Held for the renter's commit: its files go in before the work starts (the
            // workspace only; nothing with GPU access runs yet).
            let ends = record
                .starts_at
                .0
                .saturating_add(wait)
                .saturating_add(u64::from(request.duration_s) * 1000);
            (None, ends)
        } else {
            match self.workspaces.retained_until(&hex) {
                Some(until) if retained && until > now().0 => (None, until),
                _ if record.phase == HostPhase::Starting
                    && matches!(request.commit_wait_ms(), Ok(Some(_))) =>
                {
                    return Err((
                        PlaneRefusal::NotRunning,
                        format!(
                            "lease {lease} waits for its commit (`gpux commit`): nothing runs \
                             yet, and it has no workspace to copy into first (rent with --disk)"
                        ),
                    ));
                }
                _ => {
                    let now_is = match record.phase {
                        HostPhase::AwaitingLock | HostPhase::Locking | HostPhase::Starting => {
                            "it is starting"
                        }
                        _ if retained => {
                            "it has ended, and its workspace, if it had one, is erased (kept only for the lease's --retain)"
                        }
                        _ => "it has ended",
                    };
                    return Err((
                        PlaneRefusal::NotRunning,
                        format!("lease {lease} is not running: {now_is}"),
                    ));
                }
            }
        };
        let left = Duration::from_millis(ends.saturating_sub(now().0));
        let all = self.all.clone().try_acquire_owned().map_err(|_| {
            (
                PlaneRefusal::Busy,
                "this host serves too many streams now".to_string(),
            )
        })?;
        {
            let mut counts = self
                .per_lease
                .lock()
                .map_err(|_| (PlaneRefusal::Unavailable, "the plane is broken".to_string()))?;
            let n = counts.entry(lease).or_insert(0);
            if *n >= MAX_STREAMS_PER_LEASE {
                return Err((
                    PlaneRefusal::Busy,
                    format!("lease {lease} has {MAX_STREAMS_PER_LEASE} streams open already"),
                ));
            }
            *n += 1;
        }
        let slot = Slot {
            lease,
            per_lease: self.per_lease.clone(),
            _all: all,
        };
        let workspace = matches!(request.workspace_bytes(), Ok(Some(1..)));
        Ok((
            Served {
                container,
                left,
                workspace,
            },
            slot,
        ))
    }

    /// Reads a stream's open frame and admits its lease (see [`Self::authorize`]); on any
    /// failure the stream is refused with the reason and `None` comes back.
    async fn admit<T: bincode::Decode<()> + bincode::Encode>(
        &self,
        peer: PeerId,
        framed: &mut FramedStream,
        lease_of: fn(&T) -> ContentId,
        retained: bool,
    ) -> Option<(T, Served, Slot)> {
        let Ok(_opening) = self.opening.clone().try_acquire_owned() else {
            let busy = (
                PlaneRefusal::Busy,
                "this host is opening too many streams now",
            );
            let refused = Self::refuse(framed, (busy.0, busy.1.to_string()));
            let _ = tokio::time::timeout(OPEN_WITHIN, refused).await;
            return None;
        };
        let open: T = match recv(framed, OPEN_WITHIN).await {
            Ok(open) => open,
            Err(e) => {
                let detail = format!("the open frame: {e}");
                Self::refuse(framed, (PlaneRefusal::Malformed, detail)).await;
                return None;
            }
        };
        match self.authorize(peer, lease_of(&open), retained).await {
            Ok((served, slot)) => Some((open, served, slot)),
            Err(refusal) => {
                Self::refuse(framed, refusal).await;
                None
            }
        }
    }

    async fn refuse(framed: &mut FramedStream, (code, detail): Refusal) {
        tracing::debug!("plane stream refused: {detail}");
        let _ = send(framed, &Opened::refused(code, &detail)).await;
        let _ = SinkExt::<Bytes>::close(framed).await;
    }

    async fn exec(self, peer: PeerId, mut framed: FramedStream) {
        let lease_of: fn(&ExecOpen) -> ContentId = |o| o.lease;
        let Some((open, served, _slot)) = self.admit(peer, &mut framed, lease_of, false).await
        else {
            return;
        };
        let container = match served.container() {
            Ok(c) if !served.left.is_zero() => c.to_string(),
            Ok(_) => {
                let ended = (PlaneRefusal::NotRunning, "the lease has ended".to_string());
                return Self::refuse(&mut framed, ended).await;
            }
            Err(refusal) => return Self::refuse(&mut framed, refusal).await,
        };
        let command: Vec<String> = open.command.iter().map(|a| a.to_string()).collect();
        let env: Vec<(String, String)> = open
            .env
            .iter()
            .map(|v| (v.name.to_string(), v.value.to_string()))
            .collect();
        let session = match self.exec.exec(&container, command, &env, open.tty).await {
            Ok(session) => session,
            Err(e @ crate::executor::ExecError::NoSuchContainer { .. }) => {
                return Self::refuse(&mut framed, (PlaneRefusal::NotRunning, e.to_string())).await;
            }
            Err(e @ crate::executor::ExecError::Docker { .. }) => {
                return Self::refuse(&mut framed, (PlaneRefusal::Unavailable, e.to_string())).await;
            }
            Err(e) => {
                return Self::refuse(&mut framed, (PlaneRefusal::Malformed, e.to_string())).await;
            }
        };
        // Whatever ends the session (the command, the renter going away, the lease's end),
        // the command ends with it.
        let process = self.exec.exec_process(&session.id).await;
        let tty = open.tty.is_some();
        let limit = served.left.min(Duration::from_secs(7 * 24 * 3600));
        let id = session.id.clone();
        if send(&mut framed, &Opened::Yes).await.is_ok() {
            match tokio::time::timeout(limit, run_exec(&self.exec, session, framed, tty)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("exec {id}: {e}"),
                Err(_) => tracing::debug!("exec {id}: the lease ended"),
            }
        }
        process.kill();
    }

    /// An SSH connection into the lease (`super::ssh_host`), when its terms name SSH keys.
    async fn ssh(self, peer: PeerId, mut framed: FramedStream) {
        let lease_of: fn(&SshOpen) -> ContentId = |o| o.lease;
        let Some((open, served, _slot)) = self.admit(peer, &mut framed, lease_of, false).await
        else {
            return;
        };
        let container = match served.container() {
            Ok(c) => c.to_string(),
            Err(refusal) => return Self::refuse(&mut framed, refusal).await,
        };
        let keys = match super::renters_lease(&self.state, peer, open.lease) {
            Ok((_, request)) => {
                super::ssh_host::lease_keys(request.ssh_keys.iter().map(|k| k.as_str()))
            }
            Err(refusal) => return Self::refuse(&mut framed, refusal).await,
        };
        if keys.is_empty() {
            let detail = "the lease names no SSH key: rent with --ssh".to_string();
            return Self::refuse(&mut framed, (PlaneRefusal::Unavailable, detail)).await;
        }
        let dir = self
            .workspaces
            .mount_point(&gpux_protocol::hex(&open.lease.0));
        let workspace = (served.workspace && self.workspaces.is_mounted(&dir)).then_some(dir);
        if send(&mut framed, &Opened::Yes).await.is_err() {
            return;
        }
        // The SSH connection's bytes: what followed the open frame, then the stream's.
        let parts = framed.into_parts();
        let (read, write) = tokio::io::split(parts.io);
        let read = tokio::io::AsyncReadExt::chain(std::io::Cursor::new(parts.read_buf), read);
        let stream = tokio::io::join(read, write);
        let lease = super::ssh_host::SshLease {
            exec: self.exec.clone(),
            container,
            keys,
            workspace,
        };
        let limit = served.left.min(Duration::from_secs(7 * 24 * 3600));
        let served_ssh = super::ssh_host::serve(self.ssh.clone(), lease, stream);
        if tokio::time::timeout(limit, served_ssh).await.is_err() {
            tracing::debug!("ssh into lease {}: the lease ended", open.lease.short());
        }
    }

    async fn files(self, peer: PeerId, mut framed: FramedStream) {
        let lease_of: fn(&FilesOpen) -> ContentId = |o| o.lease;
        let Some((open, served, _slot)) = self.admit(peer, &mut framed, lease_of, true).await
        else {
            return;
        };
        let dir = self
            .workspaces
            .mount_point(&gpux_protocol::hex(&open.lease.0));
        // A held lease's workspace is made just after its lock (its disk formatted, then
        // mounted): a copy that comes first waits for it, briefly.
        let deadline = tokio::time::Instant::now() + WORKSPACE_WAIT;
        while !self.workspaces.is_mounted(&dir) {
            if !served.workspace || tokio::time::Instant::now() >= deadline {
                let detail = "this lease has no workspace (rent with --disk)".to_string();
                return Self::refuse(&mut framed, (PlaneRefusal::Unavailable, detail)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if send(&mut framed, &Opened::Yes).await.is_err() {
            return;
        }
        let limit = served.left.min(Duration::from_secs(7 * 24 * 3600));
        match tokio::time::timeout(limit, super::files::serve(dir, framed)).await {
            Ok(Err(e)) => tracing::debug!("files for lease {}: {e}", open.lease.short()),
            Err(_) => tracing::debug!("files for lease {}: the lease ended", open.lease.short()),
            Ok(Ok(())) => {}
        }
    }

    async fn forward(self, peer: PeerId, mut framed: FramedStream) {
        let lease_of: fn(&ForwardOpen) -> ContentId = |o| o.lease;
        let Some((open, served, _slot)) = self.admit(peer, &mut framed, lease_of, false).await
        else {
            return;
        };
        if open.port == 0 {
            let detail = "port 0 is not a port to forward".to_string();
            return Self::refuse(&mut framed, (PlaneRefusal::Malformed, detail)).await;
        }
        let container = match served.container() {
            Ok(c) => c.to_string(),
            Err(refusal) => return Self::refuse(&mut framed, refusal).await,
        };
        let limit = served.left.min(Duration::from_secs(7 * 24 * 3600));
        // As root, the host connects inside the container's network namespace itself.
        if rustix::process::geteuid().is_root() {
            let conn = match self.exec.connect_in(&container, open.port).await {
                Ok(conn) => conn,
                Err(e) => {
                    let detail = format!(
                        "nothing answers on port {} in the container: {e}",
                        open.port
                    );
                    return Self::refuse(&mut framed, (PlaneRefusal::Unavailable, detail)).await;
                }
            };
            if send(&mut framed, &Opened::Yes).await.is_err() {
                return;
            }
            if let Ok(Err(e)) =
                tokio::time::timeout(limit, splice(conn, framed, AppSide::Conn)).await
            {
                tracing::debug!("forward to port {}: {e}", open.port);
            }
            return;
        }
        if self.exec.relay().is_none() {
            let detail = "this host has no relay (a static busybox) for forwards".to_string();
            return Self::refuse(&mut framed, (PlaneRefusal::Unavailable, detail)).await;
        }
        let relay = vec![
            RELAY_BIN.to_string(),
            "nc".into(),
            "127.0.0.1".into(),
            open.port.to_string(),
        ];
        let session = match self.exec.exec(&container, relay, &[], None).await {
            Ok(session) => session,
            Err(e) => {
                return Self::refuse(&mut framed, (PlaneRefusal::NotRunning, e.to_string())).await;
            }
        };
        if send(&mut framed, &Opened::Yes).await.is_err() {
            return;
        }
        if let Ok(Err(e)) = tokio::time::timeout(limit, relay_bytes(session, framed)).await {
            tracing::debug!("forward to port {}: {e}", open.port);
        }
    }
}

/// Carries an exec's stdin in and its output out until the command ends, then sends its
/// exit code. The command may be silent as long as it likes; the renter closing its side
/// (its CLI stopped, its node or the link went away) ends the session, and the caller ends
/// the command (the renter ends its input with `StdinEnd`, never by closing).
///
/// With a terminal, the end of the renter's input is not passed on: Docker answers it by
/// closing the terminal's output, which would cut the command off from its renter (as
/// `gpux exec -t` without `-i` sends it at once).
async fn run_exec(
    exec: &Executor,
    session: ExecSession,
    framed: FramedStream,
    tty: bool,
) -> Result<(), PlaneError> {
    let ExecSession {
        id,
        mut output,
        mut input,
    } = session;
    let (mut sink, mut frames) = framed.split();
    let inbound = async {
        // A command that closed its input (`head -1`) takes no more; its output still comes.
        let mut taking = true;
        while let Some(bytes) = frames.next().await {
            let Ok(bytes) = bytes else { break };
            match gpux_protocol::plane_wire::decode::<ExecInput>(&bytes)? {
                ExecInput::Stdin(data) if taking => {
                    taking = input.write_all(&data).await.is_ok();
                }
                ExecInput::Stdin(_) => {}
                ExecInput::StdinEnd if tty || !taking => {}
                ExecInput::StdinEnd => {
                    taking = false;
                    let _ = input.shutdown().await;
                }
                ExecInput::Resize { rows, cols } => {
                    let _ = exec.resize_exec(&id, rows, cols).await;
                }
            }
        }
        Ok(())
    };
    let outbound = async {
        while let Some(item) = output.next().await {
            let frames = match item {
                Ok(bollard::container::LogOutput::StdErr { message }) => {
                    chunks(message, ExecOutput::Stderr)
                }
                Ok(other) => chunks(other.into_bytes(), ExecOutput::Stdout),
                Err(_) => break,
            };
            for f in frames {
                sink.send(Bytes::from(gpux_protocol::plane_wire::encode(&f)))
                    .await?;
            }
        }
        let code = exec.exec_exit(&id).await.ok().flatten();
        let exit = gpux_protocol::plane_wire::encode(&ExecOutput::Exit(code));
        sink.send(Bytes::from(exit)).await?;
        let _ = sink.close().await;
        Ok(())
    };
    tokio::select! {
        done = outbound => done,
        gone = inbound => gone,
    }
}

fn chunks(bytes: Bytes, make: fn(BoundedBytes<MAX_EXEC_DATA>) -> ExecOutput) -> Vec<ExecOutput> {
    bytes
        .chunks(MAX_EXEC_DATA)
        .filter_map(|p| BoundedBytes::new(p.to_vec()).ok().map(make))
        .collect()
}

/// Carries a forwarded connection's bytes both ways between the stream and the relay.
async fn relay_bytes(session: ExecSession, framed: FramedStream) -> Result<(), PlaneError> {
    let ExecSession {
        mut output,
        mut input,
        ..
    } = session;
    let parts = framed.into_parts();
    let (mut from_renter, mut to_renter) = tokio::io::split(parts.io);
    // Bytes the renter sent right after its open frame.
    if !parts.read_buf.is_empty() {
        input.write_all(&parts.read_buf).await?;
    }
    let activity = Activity::new();
    let inbound = carry(&mut from_renter, &mut input, &activity);
    let outbound = async {
        while let Some(item) = output.next().await {
            activity.touch();
            match item {
                Ok(bollard::container::LogOutput::StdOut { message }) => {
                    to_renter.write_all(&message).await?;
                }
                Ok(bollard::container::LogOutput::StdErr { message }) => {
                    tracing::debug!(
                        "forward relay: {}",
                        String::from_utf8_lossy(&message).trim()
                    );
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let _ = to_renter.shutdown().await;
        Ok(())
    };
    both_ways(&activity, outbound, inbound).await
}
