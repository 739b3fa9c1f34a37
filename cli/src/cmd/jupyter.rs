//! `gpux rent --jupyter`: the lease runs JupyterLab (the image's own) on the container's
//! loopback with a random token, and this command forwards it to this machine and prints the
//! address to open.

use std::path::Path;
use std::time::{Duration, Instant};

use gpux_api::{RentRequest, Rented};
use gpux_client::ApiClient;

use super::out;

/// The port JupyterLab listens on in the container.
const PORT: u16 = 8888;
/// How long a lease that cannot run `jupyter` takes to show it, at most.
const EARLY_EXIT: Duration = Duration::from_secs(4);

/// Makes `request` run JupyterLab with a fresh token (in its environment, not its
/// command line); returns the token.
pub(crate) fn prepare(request: &mut RentRequest) -> anyhow::Result<String> {
    if !request.command.is_empty() {
        anyhow::bail!("--jupyter runs `jupyter lab` itself: give no command after `--`");
    }
    if request.spread {
        anyhow::bail!("--jupyter serves one lease: it cannot go with --spread");
    }
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("randomness: {e}"))?;
    let token = gpux_protocol::hex(&bytes);
    let mut command: Vec<String> = ["jupyter", "lab", "--no-browser", "--ip=127.0.0.1"]
        .map(String::from)
        .into();
    command.push(format!("--port={PORT}"));
    if request.disk_bytes.is_some() {
        command.push("--ServerApp.root_dir=/workspace".into());
    }
    request.command = command;
    request.env.insert("JUPYTER_TOKEN".into(), token.clone());
    Ok(token)
}

/// Forwards the lease's JupyterLab to this machine and prints where to open it; returns
/// on Ctrl-C (the lease runs on) or when the lease ends.
pub(crate) fn serve(dir: &Path, lease: &Rented, token: &str) -> anyhow::Result<()> {
    let id = &lease.lease;
    if lease.commit_by_ms.is_some() {
        out!(
            "JupyterLab starts with the work: after `gpux commit {id}`, run `gpux forward {id} {PORT}` and open http://127.0.0.1:{PORT}/lab?token={token}"
        )?;
        return Ok(());
    }
    // An image without JupyterLab ends the lease at once: say so, not "forwarding".
    let api = ApiClient::for_data_dir(dir)?;
    let since = Instant::now();
    while since.elapsed() < EARLY_EXIT {
        let view = api.leases()?.into_iter().find(|l| l.lease == *id);
        if let Some(view) = view.filter(|v| v.end.is_some() || v.exit_code.is_some()) {
            let output = api.logs(id, 0).map(|p| p.text).unwrap_or_default();
            let tail: Vec<&str> = output.lines().rev().take(5).collect();
            anyhow::bail!(
                "lease {id} ended as JupyterLab started (exit code {}): does the image have `jupyter`? (e.g. quay.io/jupyter/pytorch-notebook){}",
                view.exit_code
                    .map_or("unknown".to_string(), |c| c.to_string()),
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(
                        "\nits last output:\n{}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    )
                }
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // This machine's 8888 when it is free, else any.
    let local = std::net::TcpListener::bind(("127.0.0.1", PORT))
        .or_else(|_| std::net::TcpListener::bind(("127.0.0.1", 0)))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())?;
    out!("JupyterLab: http://127.0.0.1:{local}/lab?token={token}")?;
    super::plane::forward(dir, id, (local, PORT))
}
