//! `gpux exec` and `gpux forward`: working in a rented container over the P2P link.

use std::os::fd::AsFd;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use gpux_api::ExecRequest;
use gpux_client::ApiClient;
use gpux_client::stream as client;

use super::out;
use rustix::termios::{self, OptionalActions, Termios};

/// What `gpux exec` was asked.
pub(crate) struct ExecArgs {
    pub(crate) lease: String,
    pub(crate) interactive: bool,
    pub(crate) tty: bool,
    pub(crate) env: Vec<String>,
    pub(crate) command: Vec<String>,
}

/// Puts the terminal in raw mode; restores it when dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<Self> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).context("reading the terminal's mode")?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw)
            .context("setting the terminal to raw mode")?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &self.saved);
    }
}

/// The terminal's size (rows, columns), if stdout is one.
fn terminal_size() -> Option<(u16, u16)> {
    termios::tcgetwinsize(std::io::stdout().as_fd())
        .ok()
        .map(|w| (w.ws_row, w.ws_col))
        .filter(|&(r, c)| r > 0 && c > 0)
}

/// Runs a command in a lease's container; exits with the command's exit code.
pub(crate) fn exec(dir: &Path, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let api = ApiClient::for_data_dir(dir)?;
    let env = super::parse_env(&args.env)?;
    let tty = if args.tty {
        if !termios::isatty(std::io::stdin().as_fd()) {
            anyhow::bail!("-t needs a terminal on standard input (drop -t to pipe input)");
        }
        Some(terminal_size().unwrap_or((24, 80)))
    } else {
        None
    };
    let request = ExecRequest {
        command: args.command,
        env,
        tty,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let raw = if tty.is_some() {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let (resize_tx, resizes) = tokio::sync::mpsc::channel(8);
    let code = runtime.block_on(async {
        if tty.is_some() {
            let mut changes =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
            tokio::spawn(async move {
                while changes.recv().await.is_some() {
                    if let Some(size) = terminal_size()
                        && resize_tx.send(size).await.is_err()
                    {
                        break;
                    }
                }
            });
        } else {
            drop(resize_tx);
        }
        let stdin = args.interactive.then(tokio::io::stdin);
        client::exec(
            &api,
            &args.lease,
            &request,
            stdin,
            tokio::io::stdout(),
            tokio::io::stderr(),
            resizes,
        )
        .await
        .map_err(anyhow::Error::from)
    });
    drop(raw);
    // Standard input is read on a blocking thread that never returns: do not wait for it.
    runtime.shutdown_background();
    match code? {
        Some(code) => Ok(ExitCode::from(
            u8::try_from(code.clamp(0, 255)).unwrap_or(255),
        )),
        None => anyhow::bail!(
            "the command's exit code is unknown (the link to the host broke, or the lease ended)"
        ),
    }
}

/// `[LOCAL:]REMOTE`: the local port defaults to the remote one.
pub(crate) fn parse_ports(text: &str) -> Result<(u16, u16), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("'{p}' is not a port (1 to 65535)"))
    };
    match text.split_once(':') {
        Some((local, remote)) => Ok((port(local)?, port(remote)?)),
        None => {
            let remote = port(text)?;
            Ok((remote, remote))
        }
    }
}

/// Forwards a local port to a port on a lease container's loopback until Ctrl-C or the
/// lease's end (the node listens and carries the bytes; this process holds the forward).
pub(crate) fn forward(dir: &Path, lease: &str, ports: (u16, u16)) -> anyhow::Result<()> {
    let api = ApiClient::for_data_dir(dir)?;
    let (local, remote) = ports;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let result = runtime.block_on(async {
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        client::forward(
            &api,
            lease,
            local,
            remote,
            |bound| {
                eprintln!("forwarding {bound} to port {remote} in lease {lease}; Ctrl-C stops");
            },
            |e| eprintln!("a forwarded connection failed: {e}"),
            stop,
        )
        .await
    });
    runtime.shutdown_background();
    if result? == client::ForwardEnd::LeaseEnded {
        eprintln!("lease {lease} has ended; forwarding stopped");
    }
    Ok(())
}

/// Carries one connection to `remote` in the lease's container over stdin and stdout.
pub(crate) fn forward_stdio(dir: &Path, lease: &str, remote: u16) -> anyhow::Result<()> {
    let api = ApiClient::for_data_dir(dir)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let result = runtime.block_on(client::forward_stdio(&api, lease, remote));
    runtime.shutdown_background();
    Ok(result?)
}

/// Prints an OpenSSH `Host` entry for a sshd in the lease's container.
pub(crate) fn ssh_config(
    dir: &Path,
    lease: &str,
    port: u16,
    user: Option<&str>,
) -> anyhow::Result<()> {
    // Said now rather than when ssh runs the proxy.
    let api = ApiClient::for_data_dir(dir)?;
    let leases = api.leases()?;
    if !leases
        .iter()
        .any(|l| l.lease == lease && l.role == gpux_api::Role::Renter)
    {
        anyhow::bail!("no lease {lease} rented by this node (`gpux leases` lists them)");
    }
    let gpux = std::env::current_exe().context("finding the gpux binary")?;
    let dir = std::fs::canonicalize(dir).context("the data directory")?;
    let short = &lease[..12.min(lease.len())];
    // A path with spaces would split the ProxyCommand: quote both paths.
    out!("Host gpux-{short}")?;
    out!("    HostName {short}.gpux")?;
    if let Some(user) = user {
        out!("    User {user}")?;
    }
    out!(
        "    ProxyCommand \"{}\" --data-dir \"{}\" forward --stdio {lease} {port}",
        gpux.display(),
        dir.display()
    )?;
    out!("    StrictHostKeyChecking accept-new")?;
    out!(
        "    UserKnownHostsFile \"{}\"",
        dir.join("ssh_known_hosts").display()
    )?;
    Ok(())
}

/// Copies files and directories in or out of a lease's workspace.
pub(crate) fn cp(dir: &Path, src: &str, dst: &str, json: bool) -> anyhow::Result<()> {
    use gpux_client::copy::Place;
    let api = ApiClient::for_data_dir(dir)?;
    let src = Place::parse(src).map_err(anyhow::Error::msg)?;
    let dst = Place::parse(dst).map_err(anyhow::Error::msg)?;
    // An indicatif bar on standard error (hidden when it is not a terminal).
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    // The node reads and writes the local side itself; only progress crosses to here.
    let show = |total, done| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = runtime.block_on(gpux_client::copy::copy(&api, &src, &dst, show));
    bar.finish_and_clear();
    let report = report?;
    if json {
        return super::print_json(&report);
    }
    for skipped in &report.skipped {
        eprintln!(
            "skipped {skipped}: links, special files, names that are not UTF-8 and copies' part files are never copied"
        );
    }
    super::out!(
        "{} file(s), {} director(ies), {} bytes ({} sent) in {:.1} s",
        report.files,
        report.dirs,
        report.bytes,
        report.bytes_sent,
        report.elapsed_ms as f64 / 1000.0
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_read_as_local_and_remote() {
        assert_eq!(parse_ports("8080"), Ok((8080, 8080)));
        assert_eq!(parse_ports("18080:8080"), Ok((18080, 8080)));
        for bad in ["0", "x", "1:0", "70000", ":80", "80:"] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
    }
}
