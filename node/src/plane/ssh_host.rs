//! SSH into any lease, with no sshd in its image: the host's node is the SSH server, on the
//! lease's `/gpux/ssh/1` stream (`super::host` admits it as it admits exec: the lease's
//! renter only, while its container runs), so no port opens on the host and the container
//! keeps no network.
//!
//! - The host key is the node's own ed25519 key: renters know it from the lease (the host
//!   signed its acceptance with it), so `gpux ssh` pins it and nothing is trusted on first
//!   use. SSH signs a 32-byte exchange hash; gpux signs envelopes that start with `GPUX` and
//!   are longer: neither signature can pass for the other.
//! - Only public-key logins, with a key the lease's signed terms name (`gpux rent --ssh`).
//! - A session's shell or command runs in the lease's container as its unprivileged user,
//!   with a pseudo-terminal when asked (`docker exec`, as `gpux exec`); the `sftp`
//!   subsystem serves `/workspace` through the confined paths of `gpux cp`
//!   (`super::sftp`); `direct-tcpip` channels (`ssh -L`, editors' port forwards) reach the
//!   container's own loopback, as `gpux forward` does.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpux_protocol::Keypair;
use russh::keys::PrivateKey;
use russh::server::{Auth, ChannelOpenHandle, Msg, PublicKeyOffer, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, ChannelOpenFailure};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::confined::Root;
use super::sftp::Sftp;
use crate::executor::{ExecSession, Executor, RELAY_BIN};

/// A byte stream both ways (a TCP connection, or a relay's pipe).
pub(crate) trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}

/// What a lease's SSH server may reach.
pub(crate) struct SshLease {
    pub(crate) exec: Executor,
    /// The lease's container.
    pub(crate) container: String,
    /// The keys its terms let in.
    pub(crate) keys: Vec<russh::keys::PublicKey>,
    /// Its workspace's mount point, when it has one (the `sftp` subsystem).
    pub(crate) workspace: Option<std::path::PathBuf>,
}

/// The server's settings: the node's key as the host key, public keys only, a keepalive
/// (a dead link is noticed), no idle limit of its own (the lease's end closes the stream).
pub(crate) fn config(node: &Keypair) -> Arc<russh::server::Config> {
    let host_key = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&node.seed());
    Arc::new(russh::server::Config {
        server_id: russh::SshId::Standard("SSH-2.0-gpux".into()),
        methods: russh::MethodSet::from(&[russh::MethodKind::PublicKey][..]),
        keys: vec![PrivateKey::from(host_key)],
        // A key the lease does not name is refused after this long (its owner learns only
        // that it is not let in).
        auth_rejection_time: Duration::from_millis(200),
        // OpenSSH asks with `none` first: answered at once.
        auth_rejection_time_initial: Some(Duration::ZERO),
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        keepalive_max: 4,
        nodelay: true,
        ..Default::default()
    })
}

/// The keys in a lease's terms, parsed (a line that does not parse lets nobody in).
pub(crate) fn lease_keys<'a>(
    lines: impl IntoIterator<Item = &'a str>,
) -> Vec<russh::keys::PublicKey> {
    lines
        .into_iter()
        .filter_map(|l| russh::keys::PublicKey::from_openssh(l).ok())
        .collect()
}

/// Serves one SSH connection on `stream` for the lease, until either side closes it.
pub(crate) async fn serve(
    config: Arc<russh::server::Config>,
    lease: SshLease,
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
) {
    let handler = Connection {
        lease: Arc::new(lease),
        channels: BTreeMap::new(),
        ptys: BTreeMap::new(),
        envs: BTreeMap::new(),
        resizers: BTreeMap::new(),
    };
    match russh::server::run_stream(config, stream, handler).await {
        Ok(running) => {
            if let Err(e) = running.await {
                tracing::debug!("ssh session: {e}");
            }
        }
        Err(e) => tracing::debug!("ssh session: {e}"),
    }
}

/// One SSH connection's state.
struct Connection {
    lease: Arc<SshLease>,
    /// Session channels opened, not yet given a shell, command or subsystem.
    channels: BTreeMap<ChannelId, Channel<Msg>>,
    /// Terminals asked for: (TERM, rows, columns).
    ptys: BTreeMap<ChannelId, (String, u16, u16)>,
    /// Environment asked for.
    envs: BTreeMap<ChannelId, Vec<(String, String)>>,
    /// Where a running command's window changes go.
    resizers: BTreeMap<ChannelId, mpsc::UnboundedSender<(u16, u16)>>,
}

/// The most channels one connection opens at once (sessions and forwards).
const MAX_CHANNELS: usize = 64;
/// The most environment variables one session sets.
const MAX_ENV: usize = 64;

fn clamp(v: u32) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX).max(1)
}

impl Connection {
    fn allowed(&self, key: &russh::keys::PublicKey) -> bool {
        self.lease
            .keys
            .iter()
            .any(|k| k.key_data() == key.key_data())
    }

    /// Starts `command` (a shell when `None`) for the session channel `id`.
    fn start(&mut self, id: ChannelId, command: Option<String>, session: &mut Session) {
        let Some(channel) = self.channels.remove(&id) else {
            let _ = session.channel_failure(id);
            return;
        };
        let _ = session.channel_success(id);
        let pty = self.ptys.remove(&id);
        let mut env = self.envs.remove(&id).unwrap_or_default();
        if let Some((term, _, _)) = &pty {
            env.push(("TERM".into(), term.clone()));
        }
        let argv = match command {
            Some(command) => vec!["sh".to_string(), "-c".into(), command],
            // A login shell: bash where the image has it.
            None => vec![
                "sh".to_string(),
                "-c".into(),
                "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi".into(),
            ],
        };
        let (resize_tx, resize_rx) = mpsc::unbounded_channel();
        self.resizers.insert(id, resize_tx);
        let lease = self.lease.clone();
        tokio::spawn(async move {
            run_command(
                lease,
                channel,
                argv,
                env,
                pty.map(|(_, r, c)| (r, c)),
                resize_rx,
            )
            .await;
        });
    }
}

/// Runs one session's command in the container: the channel's data is its stdin, its
/// output the channel's data (stderr as extended data), its exit status sent at the end. The
/// command ends when the channel does.
async fn run_command(
    lease: Arc<SshLease>,
    channel: Channel<Msg>,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    tty: Option<(u16, u16)>,
    mut resizes: mpsc::UnboundedReceiver<(u16, u16)>,
) {
    let (mut read_half, write_half) = channel.split();
    let ExecSession {
        id,
        mut output,
        mut input,
    } = match lease.exec.exec(&lease.container, argv, &env, tty).await {
        Ok(session) => session,
        Err(e) => {
            let mut err = write_half.make_writer_ext(Some(1));
            if let Err(gone) = err.write_all(format!("gpux: {e}\r\n").as_bytes()).await {
                tracing::debug!("an SSH exec that did not start: telling its client: {gone}");
            }
            let _ = write_half.exit_status(127).await;
            let _ = write_half.eof().await;
            let _ = write_half.close().await;
            return;
        }
    };
    let process = lease.exec.exec_process(&id).await;
    let mut stdout = write_half.make_writer();
    let mut stderr = write_half.make_writer_ext(Some(1));
    let inbound = async {
        let mut reader = read_half.make_reader();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match tokio::io::AsyncReadExt::read(&mut reader, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if input.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        // The client's end of input; with a terminal, Docker would close the terminal's
        // output on it, so it is not passed on.
        if tty.is_none() {
            let _ = input.shutdown().await;
        }
        // Wait for the output to end the session.
        std::future::pending::<()>().await;
    };
    let resize = async {
        while let Some((rows, cols)) = resizes.recv().await {
            let _ = lease.exec.resize_exec(&id, rows, cols).await;
        }
        std::future::pending::<()>().await;
    };
    let outbound = async {
        while let Some(item) = output.next().await {
            let written = match item {
                Ok(bollard::container::LogOutput::StdErr { message }) => {
                    stderr.write_all(&message).await
                }
                Ok(other) => stdout.write_all(&other.into_bytes()).await,
                Err(_) => break,
            };
            if written.is_err() {
                break;
            }
        }
        // The last output to an SSH client (no record rides on it): a client already gone
        // cannot take it, which is worth a line in the log, not more.
        for (name, flushed) in [
            ("stdout", stdout.flush().await),
            ("stderr", stderr.flush().await),
        ] {
            if let Err(e) = flushed {
                tracing::debug!("an SSH exec's {name} could not be flushed: {e}");
            }
        }
        let code = lease.exec.exec_exit(&id).await.ok().flatten();
        let _ = write_half
            .exit_status(code.and_then(|c| u32::try_from(c).ok()).unwrap_or(255))
            .await;
        let _ = write_half.eof().await;
        let _ = write_half.close().await;
    };
    tokio::select! {
        () = outbound => {}
        () = inbound => {}
        () = resize => {}
    }
    process.kill();
}

/// Serves SFTP on a session channel, and ends the channel as a subsystem's end does (an
/// exit status of 0, then EOF and close: `scp` takes a channel that ends without one as a
/// failure) once the client has closed its side and the server has answered everything.
async fn serve_sftp(channel: Channel<Msg>, root: Root) {
    let (mut read_half, write_half) = channel.split();
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    russh_sftp::server::run(theirs, Sftp::new(root)).await;
    tokio::spawn(async move {
        let (mut from_sftp, mut to_sftp) = tokio::io::split(ours);
        let mut writer = write_half.make_writer();
        let up = async {
            let mut reader = read_half.make_reader();
            let _ = tokio::io::copy(&mut reader, &mut to_sftp).await;
            let _ = to_sftp.shutdown().await;
        };
        let down = async {
            let _ = tokio::io::copy(&mut from_sftp, &mut writer).await;
            if let Err(e) = writer.flush().await {
                tracing::debug!("an SFTP session's last bytes could not be flushed: {e}");
            }
        };
        tokio::join!(up, down);
        let _ = write_half.exit_status(0).await;
        let _ = write_half.eof().await;
        let _ = write_half.close().await;
    });
}

/// A connection to `port` on the container's loopback: made inside its network namespace
/// when this host is root, else through the relay (`busybox nc`) run in the container.
pub(crate) async fn connect_port(
    exec: &Executor,
    container: &str,
    port: u16,
) -> Result<Pin<Box<dyn Duplex>>, String> {
    if rustix::process::geteuid().is_root() {
        let conn = exec
            .connect_in(container, port)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(Box::pin(conn));
    }
    if exec.relay().is_none() {
        return Err("this host has no relay (a static busybox) for forwards".into());
    }
    let relay = vec![
        RELAY_BIN.to_string(),
        "nc".into(),
        "127.0.0.1".into(),
        port.to_string(),
    ];
    let ExecSession {
        mut output,
        mut input,
        ..
    } = exec
        .exec(container, relay, &[], None)
        .await
        .map_err(|e| e.to_string())?;
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut from, mut to) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let up = async {
            let _ = tokio::io::copy(&mut from, &mut input).await;
            let _ = input.shutdown().await;
        };
        let down = async {
            while let Some(Ok(item)) = output.next().await {
                if let bollard::container::LogOutput::StdOut { message } = item
                    && to.write_all(&message).await.is_err()
                {
                    break;
                }
            }
            let _ = to.shutdown().await;
        };
        tokio::join!(up, down);
    });
    Ok(Box::pin(ours))
}

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        _user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(if self.allowed(offer.public_key) {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn auth_publickey(
        &mut self,
        _user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(if self.allowed(key.public_key) {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.channels.len() + self.resizers.len() >= MAX_CHANNELS {
            reply.reject(ChannelOpenFailure::ResourceShortage).await;
            return Ok(());
        }
        self.channels.insert(channel.id(), channel);
        reply.accept().await;
        Ok(())
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.channels.remove(&channel);
        self.ptys.remove(&channel);
        self.envs.remove(&channel);
        self.resizers.remove(&channel);
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        term: &str,
        col_width: u32,
        row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let term: String = term
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect();
        self.ptys
            .insert(channel, (term, clamp(row_height), clamp(col_width)));
        session.channel_success(channel)
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        variable_name: &str,
        variable_value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let pair = (variable_name.to_string(), variable_value.to_string());
        let env = self.envs.entry(channel).or_default();
        if env.len() < MAX_ENV && crate::executor::check_env(std::slice::from_ref(&pair)).is_ok() {
            env.push(pair);
            session.channel_success(channel)
        } else {
            session.channel_failure(channel)
        }
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.start(channel, None, session);
        Ok(())
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match std::str::from_utf8(data) {
            Ok(command) if !command.contains('\0') => {
                self.start(channel, Some(command.to_string()), session);
            }
            _ => session.channel_failure(channel)?,
        }
        Ok(())
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let root = match (&self.lease.workspace, name) {
            (Some(dir), "sftp") => Root::open(dir).ok(),
            _ => None,
        };
        match (root, self.channels.remove(&channel)) {
            (Some(root), Some(open)) => {
                session.channel_success(channel)?;
                serve_sftp(open, root).await;
            }
            (_, open) => {
                if let Some(open) = open {
                    self.channels.insert(channel, open);
                }
                session.channel_failure(channel)?;
            }
        }
        Ok(())
    }

    async fn window_change_request(
        &mut self,
        channel: ChannelId,
        col_width: u32,
        row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(resize) = self.resizers.get(&channel) {
            let _ = resize.send((clamp(row_height), clamp(col_width)));
        }
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        // The container's own loopback only: it has no other network.
        let local = matches!(host_to_connect, "localhost" | "127.0.0.1" | "::1");
        let port = u16::try_from(port_to_connect).ok().filter(|p| *p > 0);
        let (Some(port), true) = (port, local) else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        match connect_port(&self.lease.exec, &self.lease.container, port).await {
            Ok(mut conn) => {
                reply.accept().await;
                tokio::spawn(async move {
                    let mut stream = channel.into_stream();
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut conn).await;
                });
            }
            Err(e) => {
                tracing::debug!("ssh -L to port {port}: {e}");
                reply.reject(ChannelOpenFailure::ConnectFailed).await;
            }
        }
        Ok(())
    }
}
