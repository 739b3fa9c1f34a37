//! The CLI's client of the local API: finds the running node through `<data-dir>/api.addr`
//! and authenticates with `<data-dir>/api.token`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::daemon::api::{ADDR_FILE, TOKEN_FILE};

/// A client of one node's API.
#[derive(Debug)]
pub struct ApiClient {
    base: String,
    token: String,
    agent: ureq::Agent,
}

impl ApiClient {
    /// The client of the node running on `data_dir`.
    pub fn for_data_dir(data_dir: &Path) -> anyhow::Result<Self> {
        let not_running = || {
            format!(
                "no node is running on {} (start one with `gpux node run --data-dir {}`)",
                data_dir.display(),
                data_dir.display()
            )
        };
        let addr = std::fs::read_to_string(data_dir.join(ADDR_FILE)).with_context(not_running)?;
        let token = std::fs::read_to_string(data_dir.join(TOKEN_FILE)).with_context(not_running)?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Ok(Self {
            base: format!("http://{}", addr.trim()),
            token: token.trim().to_string(),
            agent,
        })
    }

    fn finish(
        &self,
        path: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<serde_json::Value> {
        let mut response = response.with_context(|| {
            format!(
                "cannot reach the node's API at {} (is it running?)",
                self.base
            )
        })?;
        let status = response.status();
        let body: serde_json::Value = response
            .body_mut()
            .read_json()
            .with_context(|| format!("reading the answer to {path}"))?;
        if !status.is_success() {
            let message = body["error"].as_str().unwrap_or("unknown error");
            bail!("{message}");
        }
        Ok(body)
    }

    /// `GET path`.
    pub fn get(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<serde_json::Value> {
        let mut request = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token));
        for (k, v) in query {
            request = request.query(*k, *v);
        }
        self.finish(path, request.call())
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let request = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token));
        self.finish(path, request.send_json(body))
    }
}
