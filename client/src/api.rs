//! A client of a running node's local API, typed by `gpux-api`: finds the node through
//! `<data-dir>/api.addr` and authenticates with `<data-dir>/api.token`. The CLI and the
//! testnet use it; neither builds nor reads JSON by hand.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpux_api::{ADDR_FILE, ApiError, ErrorCode, TOKEN_FILE};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a call to the API gave no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No node runs on that data directory (its address or token file is missing).
    #[error("no node is running on {} (start one with `gpux node run --data-dir {}`)", .0.display(), .0.display())]
    NotRunning(PathBuf),
    /// The node did not answer.
    #[error("cannot reach the node's API at {base} (is it running?): {why}")]
    Unreachable {
        /// The API's address.
        base: String,
        /// Why.
        why: String,
    },
    /// The node answered with an error.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The answer is not what the API promises (a node of another version?).
    #[error("the answer to {path} does not read: {why}")]
    Decode {
        /// The API path.
        path: String,
        /// Why.
        why: String,
    },
}

impl ClientError {
    /// The API error code, when the node answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api(e) => Some(e.code),
            _ => None,
        }
    }
}

/// A client of one node's API.
#[derive(Debug, Clone)]
pub struct ApiClient {
    base: String,
    token: String,
    agent: ureq::Agent,
}

/// The longest a rent is waited for (staging a large image takes a while).
pub const RENT_WAIT: Duration = Duration::from_secs(60 * 60);

impl ApiClient {
    /// The client of the node running on `data_dir`.
    pub fn for_data_dir(data_dir: &Path) -> Result<Self, ClientError> {
        let not_running = |_| ClientError::NotRunning(data_dir.to_path_buf());
        let addr = std::fs::read_to_string(data_dir.join(ADDR_FILE)).map_err(not_running)?;
        let token = std::fs::read_to_string(data_dir.join(TOKEN_FILE)).map_err(not_running)?;
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

    /// The same client, each call given at most `timeout` (60 s unless set).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        self
    }

    /// The API's base URL (`http://127.0.0.1:PORT`).
    pub fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    fn finish<T: DeserializeOwned>(
        &self,
        path: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<T, ClientError> {
        let mut response = response.map_err(|e| ClientError::Unreachable {
            base: self.base.clone(),
            why: e.to_string(),
        })?;
        let status = response.status();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Decode {
                path: path.into(),
                why: e.to_string(),
            })?;
        if !status.is_success() {
            let error = serde_json::from_str::<ApiError>(&text).unwrap_or_else(|_| {
                ApiError::new(
                    ErrorCode::Internal,
                    format!(
                        "HTTP {status}: {}",
                        text.chars().take(200).collect::<String>()
                    ),
                )
            });
            return Err(ClientError::Api(error));
        }
        serde_json::from_str(&text).map_err(|e| ClientError::Decode {
            path: path.into(),
            why: e.to_string(),
        })
    }

    /// `GET path`.
    pub fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<T, ClientError> {
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
    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let request = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token));
        self.finish(path, request.send_json(body))
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> Result<gpux_api::Status, ClientError> {
        self.get("/v1/status", &[])
    }

    /// `GET /v1/leases`.
    pub fn leases(&self) -> Result<Vec<gpux_api::LeaseView>, ClientError> {
        self.get("/v1/leases", &[])
    }

    /// `POST /v1/rent`. It may stage the renter's image first, so it waits up to
    /// [`RENT_WAIT`].
    pub fn rent(&self, request: &gpux_api::RentRequest) -> Result<gpux_api::Rented, ClientError> {
        self.post_waiting("/v1/rent", request)
    }

    /// `GET /v1/bids`: this node's bids.
    pub fn bids(&self) -> Result<Vec<gpux_api::BidView>, ClientError> {
        self.get("/v1/bids", &[])
    }

    /// `POST /v1/bids/{bid}/cancel`.
    pub fn cancel_bid(&self, bid: &str) -> Result<gpux_api::BidView, ClientError> {
        self.post(&format!("/v1/bids/{bid}/cancel"), &())
    }

    /// `GET /v1/rent/progress/{name}`: where the rent called `name` stands.
    pub fn rent_progress(&self, name: &str) -> Result<gpux_api::RentProgress, ClientError> {
        self.get(&format!("/v1/rent/progress/{name}"), &[])
    }

    /// `POST /v1/groups`: a group order over several hosts (waits as a rent does).
    pub fn rent_group(
        &self,
        request: &gpux_api::RentRequest,
    ) -> Result<gpux_api::GroupPlaced, ClientError> {
        self.post_waiting("/v1/groups", request)
    }

    /// `POST /v1/groups/{group}/scale`.
    pub fn scale_group(
        &self,
        group: &str,
        delta: i32,
    ) -> Result<gpux_api::GroupScaled, ClientError> {
        self.post_waiting(
            &format!("/v1/groups/{group}/scale"),
            &gpux_api::GroupScale { delta },
        )
    }

    /// A `POST` that may take as long as a rent.
    fn post_waiting<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let call = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token))
            .config()
            .timeout_global(Some(RENT_WAIT))
            .build();
        self.finish(path, call.send_json(body))
    }

    /// `GET /v1/balance`.
    pub fn balance(&self) -> Result<gpux_api::Balance, ClientError> {
        self.get("/v1/balance", &[])
    }

    /// `POST /v1/ledger/mint`.
    pub fn mint(&self, request: &gpux_api::MintRequest) -> Result<gpux_api::Minted, ClientError> {
        self.post("/v1/ledger/mint", request)
    }

    /// `POST /v1/block`.
    pub fn block(
        &self,
        request: &gpux_api::BlockRequest,
    ) -> Result<gpux_api::Blocked, ClientError> {
        self.post("/v1/block", request)
    }

    /// `POST /v1/ledger/readd`.
    pub fn ledger_readd(&self, peer: &str) -> Result<gpux_api::Readded, ClientError> {
        self.post(
            "/v1/ledger/readd",
            &gpux_api::ReaddRequest {
                peer: peer.to_string(),
            },
        )
    }

    /// `GET /v1/ledger`.
    pub fn ledger(&self) -> Result<gpux_api::LedgerTotals, ClientError> {
        self.get("/v1/ledger", &[])
    }

    /// `POST /v1/leases/{lease}/stop`.
    pub fn stop(&self, lease: &str) -> Result<gpux_api::Stopping, ClientError> {
        self.post(&format!("/v1/leases/{lease}/stop"), &())
    }

    /// `POST /v1/leases/{lease}/commit`.
    pub fn commit(&self, lease: &str) -> Result<gpux_api::Committed, ClientError> {
        self.post(&format!("/v1/leases/{lease}/commit"), &())
    }

    /// `POST /v1/leases/{lease}/challenge`: the performance challenge of a running lease.
    pub fn challenge(&self, lease: &str) -> Result<gpux_api::ChallengePassed, ClientError> {
        self.post(&format!("/v1/leases/{lease}/challenge"), &())
    }

    /// `POST /v1/console/login`: a one-time link into the web console.
    pub fn console_login(&self) -> Result<gpux_api::ConsoleLogin, ClientError> {
        self.post("/v1/console/login", &())
    }

    /// `GET /v1/settings`.
    pub fn settings(&self) -> Result<gpux_api::Settings, ClientError> {
        self.get("/v1/settings", &[])
    }

    /// `POST /v1/settings`: sets `name` to `value`.
    pub fn set_setting(&self, name: &str, value: &str) -> Result<gpux_api::Settings, ClientError> {
        let change = gpux_api::SettingChange {
            name: name.into(),
            value: value.into(),
        };
        self.post("/v1/settings", &change)
    }

    /// `GET /v1/leases/{lease}/receipts`.
    pub fn receipts(&self, lease: &str) -> Result<gpux_api::Receipts, ClientError> {
        self.get(&format!("/v1/leases/{lease}/receipts"), &[])
    }

    /// `GET /v1/leases/{lease}/logs?from=N`.
    pub fn logs(&self, lease: &str, from: u64) -> Result<gpux_api::LogsPage, ClientError> {
        self.get(
            &format!("/v1/leases/{lease}/logs"),
            &[("from", &from.to_string())],
        )
    }

    /// `GET /v1/offers`.
    pub fn offers(
        &self,
        query: &str,
        limit: usize,
    ) -> Result<Vec<gpux_api::OfferHit>, ClientError> {
        self.get("/v1/offers", &[("q", query), ("limit", &limit.to_string())])
    }

    /// `POST /v1/market/follow`.
    pub fn follow(
        &self,
        request: &gpux_api::FollowRequest,
    ) -> Result<gpux_api::Following, ClientError> {
        self.post("/v1/market/follow", request)
    }

    /// `POST /v1/bid`.
    pub fn bid(&self, request: &gpux_api::BidRequest) -> Result<gpux_api::BidPlaced, ClientError> {
        self.post("/v1/bid", request)
    }

    /// `POST /v1/shutdown`: with `end_leases`, every hosted lease ends and settles first;
    /// without, the leases' containers keep running for the node's next start.
    pub fn shutdown(&self, end_leases: bool) -> Result<gpux_api::ShuttingDown, ClientError> {
        self.post("/v1/shutdown", &gpux_api::ShutdownRequest { end_leases })
    }
}
