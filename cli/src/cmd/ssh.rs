//! `gpux ssh`, `gpux ssh-config` and the hidden `gpux ssh-proxy`: OpenSSH into a lease whose
//! image has no sshd. The host's node is the SSH server; this machine's `ssh` reaches it
//! through this node (`ssh-proxy` is its `ProxyCommand`), with the host's key pinned from
//! the lease (the node key that signed its acceptance), and logs in with a key the lease's
//! terms name (`gpux rent --ssh`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use base64::Engine;
use gpux_client::ApiClient;
use gpux_client::stream as client;

use super::out;

/// The public keys looked for in `~/.ssh`, in order.
const DEFAULT_KEYS: [&str; 3] = ["id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub"];

/// The key `gpux rent --ssh` binds: the file given, else the first of `~/.ssh`'s default
/// keys, else this data directory's own (`ssh/id_ed25519`, made with `ssh-keygen` the
/// first time). Its one-line public form.
pub(crate) fn rent_key(dir: &Path, given: Option<&Path>) -> anyhow::Result<String> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => match home_keys().into_iter().find(|p| p.exists()) {
            Some(path) => path,
            None => own_key(dir)?.with_extension("pub"),
        },
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("--ssh: reading {}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if !gpux_protocol::is_ssh_public_key(&line) {
        anyhow::bail!(
            "--ssh: {} holds no OpenSSH public key (TYPE BASE64 [COMMENT])",
            path.display()
        );
    }
    Ok(line)
}

fn home_keys() -> Vec<PathBuf> {
    let Some(home) = std::env::var_os("HOME") else {
        return Vec::new();
    };
    DEFAULT_KEYS
        .iter()
        .map(|k| Path::new(&home).join(".ssh").join(k))
        .collect()
}

/// This data directory's own SSH key (its private half's path), made when missing.
fn own_key(dir: &Path) -> anyhow::Result<PathBuf> {
    let keys = dir.join("ssh");
    let key = keys.join("id_ed25519");
    if key.exists() {
        return Ok(key);
    }
    std::fs::create_dir_all(&keys).with_context(|| format!("creating {}", keys.display()))?;
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "gpux", "-f"])
        .arg(&key)
        .output()
        .context("ssh-keygen (OpenSSH's client tools) makes this node's SSH key")?;
    if !made.status.success() {
        anyhow::bail!(
            "ssh-keygen: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        );
    }
    Ok(key)
}

/// The identity `ssh` should use for `lease`: this data directory's own key when that is
/// the key the lease names (`ssh` finds the user's own keys itself).
fn identity_for(dir: &Path, lease_keys: &[String]) -> Option<PathBuf> {
    let key = dir.join("ssh").join("id_ed25519");
    let public = std::fs::read_to_string(key.with_extension("pub")).ok()?;
    let body = |line: &str| line.split(' ').take(2).collect::<Vec<_>>().join(" ");
    let mine = body(public.trim());
    lease_keys.iter().any(|k| body(k) == mine).then_some(key)
}

/// What `ssh` needs to know of a lease of this node's: its host's key as a known-hosts
/// line for the alias `gpux-<lease>`, written to `<data-dir>/ssh_known_hosts`, and the
/// identity to use.
struct Target {
    alias: String,
    known_hosts: PathBuf,
    identity: Option<PathBuf>,
    proxy: String,
}

fn target(dir: &Path, lease: &str) -> anyhow::Result<Target> {
    let api = ApiClient::for_data_dir(dir)?;
    let view = api
        .leases()?
        .into_iter()
        .find(|l| l.lease == lease && l.role == gpux_api::Role::Renter)
        .with_context(|| {
            format!("no lease {lease} rented by this node (`gpux leases` lists them)")
        })?;
    let host: gpux_protocol::PeerId = view
        .host
        .parse()
        .map_err(|e| anyhow::anyhow!("the lease's host {}: {e}", view.host))?;
    let alias = format!("gpux-{lease}");
    let dir = std::fs::canonicalize(dir).context("the data directory")?;
    let known_hosts = dir.join("ssh_known_hosts");
    let line = format!("{alias} {}\n", host_key(&host.public_key()));
    let mut known = std::fs::read_to_string(&known_hosts).unwrap_or_default();
    if !known.lines().any(|l| format!("{l}\n") == line) {
        known.retain(|_| true);
        known = known
            .lines()
            .filter(|l| !l.starts_with(&format!("{alias} ")))
            .map(|l| format!("{l}\n"))
            .collect();
        known.push_str(&line);
        std::fs::write(&known_hosts, known)
            .with_context(|| format!("writing {}", known_hosts.display()))?;
    }
    let gpux = std::env::current_exe().context("finding the gpux binary")?;
    Ok(Target {
        alias,
        known_hosts,
        identity: identity_for(&dir, &view.ssh_keys),
        // Paths with spaces would split the command: both quoted.
        proxy: format!(
            "\"{}\" --data-dir \"{}\" ssh-proxy {lease}",
            gpux.display(),
            dir.display()
        ),
    })
}

/// The host's ed25519 key as OpenSSH writes it: `ssh-ed25519 BASE64`.
fn host_key(key: &gpux_protocol::PublicKey) -> String {
    let mut wire = Vec::with_capacity(51);
    for part in [&b"ssh-ed25519"[..], &key.0[..]] {
        wire.extend((part.len() as u32).to_be_bytes());
        wire.extend(part);
    }
    format!(
        "ssh-ed25519 {}",
        base64::engine::general_purpose::STANDARD.encode(wire)
    )
}

/// `gpux ssh LEASE [-- COMMAND]`: runs this machine's `ssh` into the lease.
pub(crate) fn ssh(dir: &Path, lease: &str, command: &[String]) -> anyhow::Result<i32> {
    let t = target(dir, lease)?;
    let mut ssh = Command::new("ssh");
    ssh.args(["-o", &format!("ProxyCommand={}", t.proxy)])
        .args(["-o", &format!("HostKeyAlias={}", t.alias)])
        .args([
            "-o",
            &format!("UserKnownHostsFile={}", t.known_hosts.display()),
        ])
        .args(["-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR"]);
    if let Some(identity) = &t.identity {
        ssh.arg("-i").arg(identity);
    }
    ssh.arg(format!("gpux@{}", t.alias));
    if !command.is_empty() {
        ssh.arg("--").args(command);
    }
    let status = ssh
        .status()
        .context("running ssh (OpenSSH's client: apt-get install openssh-client)")?;
    Ok(status.code().unwrap_or(255))
}

/// `gpux ssh-proxy LEASE`: one SSH connection over standard input and output.
pub(crate) fn proxy(dir: &Path, lease: &str) -> anyhow::Result<()> {
    let api = ApiClient::for_data_dir(dir)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let result = runtime.block_on(client::ssh_stdio(&api, lease));
    runtime.shutdown_background();
    Ok(result?)
}

/// `gpux ssh-config LEASE`: an OpenSSH `Host` entry for the lease (`ssh gpux-<short>`,
/// `scp`, VS Code's Remote-SSH), the host's key pinned.
pub(crate) fn config(dir: &Path, lease: &str) -> anyhow::Result<()> {
    let t = target(dir, lease)?;
    let short = &lease[..12.min(lease.len())];
    out!("Host gpux-{short}")?;
    out!("    HostName {short}.gpux")?;
    out!("    User gpux")?;
    out!("    ProxyCommand {}", t.proxy)?;
    out!("    HostKeyAlias {}", t.alias)?;
    out!("    UserKnownHostsFile \"{}\"", t.known_hosts.display())?;
    out!("    StrictHostKeyChecking yes")?;
    if let Some(identity) = &t.identity {
        out!("    IdentityFile \"{}\"", identity.display())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_key_is_written_as_openssh_writes_ed25519_keys() {
        // RFC 8709's wire form: the name and the key, each length-prefixed.
        let line = host_key(&gpux_protocol::PublicKey([7; 32]));
        let b64 = line.strip_prefix("ssh-ed25519 ").unwrap();
        let wire = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        assert_eq!(&wire[..4], &11u32.to_be_bytes());
        assert_eq!(&wire[4..15], b"ssh-ed25519");
        assert_eq!(&wire[15..19], &32u32.to_be_bytes());
        assert_eq!(&wire[19..], &[7; 32]);
    }
}
