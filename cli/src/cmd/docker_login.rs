//! The credentials `docker login` stored for a registry, read as Docker's own client reads
//! them: `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`), its `auths` entry for
//! the registry, or the credential helper it names (`credHelpers`, `credsStore`), asked with
//! `docker-credential-<helper> get`.

use std::io::Write;
use std::process::{Command, Stdio};

use base64::Engine;
use gpux_api::RegistryCredentials;

/// The stored credentials for `server` (`127.0.0.1:5000`, or Docker Hub's
/// `https://index.docker.io/v1/`), if `docker login` left any.
pub(crate) fn stored(server: &str) -> Option<RegistryCredentials> {
    let dir = std::env::var_os("DOCKER_CONFIG")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".docker")))?;
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    from_config(&text, server, helper)
}

/// The credentials for `server` in a Docker client config, asking `ask` for a helper's.
fn from_config(
    text: &str,
    server: &str,
    ask: impl Fn(&str, &str) -> Option<RegistryCredentials>,
) -> Option<RegistryCredentials> {
    let config: serde_json::Value = serde_json::from_str(text).ok()?;
    let bare = |key: &str| -> String {
        let key = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        key.split('/').next().unwrap_or(key).to_string()
    };
    let wanted = bare(server);
    if let Some(name) = config["credHelpers"]
        .as_object()
        .and_then(|h| h.iter().find(|(k, _)| bare(k) == wanted))
        .and_then(|(_, v)| v.as_str())
    {
        return ask(name, server);
    }
    let entry = config["auths"]
        .as_object()
        .and_then(|a| a.iter().find(|(k, _)| bare(k) == wanted))
        .map(|(_, v)| v);
    if let Some(auth) = entry.and_then(|e| e["auth"].as_str()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth)
            .ok()?;
        let (username, password) = String::from_utf8(decoded)
            .ok()?
            .split_once(':')
            .map(|(u, p)| (u.to_string(), p.to_string()))?;
        return Some(RegistryCredentials { username, password });
    }
    config["credsStore"]
        .as_str()
        .and_then(|store| ask(store, server))
}

/// Asks `docker-credential-NAME get` for `server`'s credentials.
fn helper(name: &str, server: &str) -> Option<RegistryCredentials> {
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return None;
    }
    let mut child = Command::new(format!("docker-credential-{name}"))
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(server.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    if !out.status.success() {
        return None;
    }
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(RegistryCredentials {
        username: answer["Username"].as_str()?.to_string(),
        password: answer["Secret"].as_str()?.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_found_as_docker_stores_them() {
        let none = |_: &str, _: &str| None;
        // "team:s3cret"
        let config = r#"{"auths": {"127.0.0.1:5055": {"auth": "dGVhbTpzM2NyZXQ="},
            "https://index.docker.io/v1/": {"auth": "aHViOnRva2Vu"}}}"#;
        let found = from_config(config, "127.0.0.1:5055", none).unwrap();
        assert_eq!(
            (found.username.as_str(), found.password.as_str()),
            ("team", "s3cret")
        );
        let hub = from_config(config, "https://index.docker.io/v1/", none).unwrap();
        assert_eq!(hub.username, "hub");
        assert!(from_config(config, "ghcr.io", none).is_none());
        // A helper for one registry, a store for the rest.
        let helped = r#"{"auths": {}, "credHelpers": {"ghcr.io": "gh"}, "credsStore": "pass"}"#;
        let ask = |name: &str, server: &str| {
            Some(RegistryCredentials {
                username: format!("{name}@{server}"),
                password: "x".into(),
            })
        };
        assert_eq!(
            from_config(helped, "ghcr.io", ask).unwrap().username,
            "gh@ghcr.io"
        );
        assert_eq!(
            from_config(helped, "quay.io", ask).unwrap().username,
            "pass@quay.io"
        );
        assert!(from_config("not json", "quay.io", ask).is_none());
    }
}
