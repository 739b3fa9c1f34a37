//! A real image registry on loopback for the testnet and the tests: Debian's
//! `docker-registry` (the CNCF distribution registry), optionally with TLS (a certificate
//! made for 127.0.0.1) and basic auth (an htpasswd file), as a private registry on the
//! internet would be; never a mock. Docker trusts registries on 127.0.0.0/8 without a
//! certificate chain, so its pulls and pushes need no set-up. Images are pushed with a
//! Docker client configuration of the registry's own, so no login lands in the user's.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Where Debian's package installs the registry.
pub const REGISTRY_BIN: &str = "docker-registry";

/// A registry process, stopped when dropped.
pub struct Registry {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Its user and password, when it wants a login.
    pub login: Option<(String, String)>,
    dir: PathBuf,
    child: Child,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn run(what: &str, command: &mut Command) -> anyhow::Result<Vec<u8>> {
    let out = command
        .output()
        .with_context(|| format!("{what}: cannot start it"))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

impl Registry {
    /// Starts a registry with its storage under `dir`: with TLS and basic auth for `login`
    /// (a private registry), or plain HTTP without one (a public one).
    pub fn start(dir: &Path, login: Option<(&str, &str)>) -> anyhow::Result<Registry> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.join("data").display()
        );
        if let Some((user, password)) = login {
            let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
            run(
                "openssl (a certificate for the test registry)",
                Command::new("openssl").args([
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=127.0.0.1",
                    "-addext",
                    "subjectAltName=IP:127.0.0.1",
                    "-keyout",
                    &key.display().to_string(),
                    "-out",
                    &cert.display().to_string(),
                ]),
            )?;
            let htpasswd = run(
                "htpasswd (Debian's apache2-utils)",
                Command::new("htpasswd").args(["-Bbn", user, password]),
            )?;
            std::fs::write(dir.join("htpasswd"), htpasswd)?;
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\nauth:\n  htpasswd:\n    realm: gpux-test\n    path: {}\n",
                cert.display(),
                key.display(),
                dir.join("htpasswd").display()
            ));
        }
        let config_path = dir.join("config.yml");
        std::fs::write(&config_path, config)?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context(
                "starting docker-registry (Debian's docker-registry package; scripts/test installs it)",
            )?;
        let registry = Registry {
            addr,
            login: login.map(|(u, p)| (u.to_string(), p.to_string())),
            dir: dir.to_path_buf(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(&registry.addr).is_err() {
            if Instant::now() > deadline {
                bail!("the registry did not listen on {} in 15 s", registry.addr);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(registry)
    }

    /// Pushes the local image `image` (an id or a name) as `repo:tag` here, then removes the
    /// tag from the local Docker; returns the reference (`127.0.0.1:PORT/repo:tag`).
    pub fn push(&self, image: &str, repo_tag: &str) -> anyhow::Result<String> {
        let reference = format!("{}/{repo_tag}", self.addr);
        let client = self.dir.join("docker-client");
        std::fs::create_dir_all(&client)?;
        let docker = || {
            let mut c = Command::new("docker");
            c.env("DOCKER_CONFIG", &client);
            c
        };
        if let Some((user, password)) = &self.login {
            let mut login = docker()
                .args(["login", "--username", user, "--password-stdin", &self.addr])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .context("docker login")?;
            login
                .stdin
                .take()
                .context("docker login's input")?
                .write_all(password.as_bytes())?;
            let out = login.wait_with_output()?;
            if !out.status.success() {
                bail!(
                    "docker login {}: {}",
                    self.addr,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        run("docker tag", docker().args(["tag", image, &reference]))?;
        let pushed = run("docker push", docker().args(["push", &reference]));
        if self.login.is_some() {
            let _ = docker().args(["logout", &self.addr]).output();
        }
        run("docker rmi", docker().args(["rmi", &reference]))?;
        pushed?;
        Ok(reference)
    }
}
