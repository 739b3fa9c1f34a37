//! The local HTTP JSON API, on 127.0.0.1 only, behind a bearer token.
//!
//! The token is 32 random bytes (hex) in `<data-dir>/api.token`, mode 0600; the address the
//! API listens on is written to `<data-dir>/api.addr` (0600). Only the user who can read the
//! data directory can use the API. Every request without the token gets 401. The web
//! console (`/console/`, `console/`) is served here too, behind sessions of its own.

use std::net::SocketAddr;
use std::path::Path;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use gpux_api::{
    ADDR_FILE, ApiError, BidRequest, BlockRequest, ErrorCode, ExecRequest, MintRequest,
    RentRequest, TOKEN_FILE,
};
use tokio::sync::mpsc;

use super::command::{ApiCommand, AppState, Reply, call};
use super::http::same;
use crate::data_dir::write_private;
use crate::plane::bridge::{self, Bridge};

/// A request that carried the right token.
struct Authorized;

impl FromRequestParts<AppState> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        if bearer_token(&parts.headers).is_some_and(|t| same(t.as_bytes(), state.token.as_bytes()))
        {
            Ok(Authorized)
        } else {
            Err(unauthorized())
        }
    }
}

/// The token of an `Authorization: Bearer TOKEN` header; the scheme's case does not matter
/// (RFC 9110 section 11.1), nor the spaces after it.
fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

fn unauthorized() -> Response {
    error(
        ApiError::new(ErrorCode::Unauthorized, "missing or wrong API token")
            .with_hint("the token is in <data-dir>/api.token"),
    )
}

/// An error as its status and `{code, message, hint}` body.
fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e)).into_response()
}

async fn ask<T: serde::Serialize>(
    state: &AppState,
    make: impl FnOnce(Reply<T>) -> ApiCommand,
) -> Response {
    match call(state, make).await {
        Ok(value) => Json(value).into_response(),
        Err(e) => error(e),
    }
}

/// [`ask`] with a JSON body; a body that does not read is a bad-input error naming what is
/// wrong with it.
async fn ask_body<B, T: serde::Serialize>(
    state: &AppState,
    body: Result<Json<B>, JsonRejection>,
    make: impl FnOnce(B, Reply<T>) -> ApiCommand,
) -> Response {
    match body {
        Ok(Json(body)) => ask(state, |reply| make(body, reply)).await,
        Err(e) => error(ApiError::bad_input(format!(
            "the request body: {}",
            e.body_text()
        ))),
    }
}

#[derive(serde::Deserialize)]
struct SearchParams {
    q: Option<String>,
    limit: Option<usize>,
}

async fn status(_: Authorized, State(state): State<AppState>) -> Response {
    ask(&state, |reply| ApiCommand::Status { reply }).await
}

async fn offers(
    _: Authorized,
    State(state): State<AppState>,
    Query(p): Query<SearchParams>,
) -> Response {
    let query = p.q.unwrap_or_default();
    let limit = p.limit.unwrap_or(20).min(1000);
    ask(&state, |reply| ApiCommand::Search {
        query,
        limit,
        reply,
    })
    .await
}

async fn leases(_: Authorized, State(state): State<AppState>) -> Response {
    ask(&state, |reply| ApiCommand::Leases { reply }).await
}

async fn rent(
    _: Authorized,
    State(state): State<AppState>,
    request: Result<Json<RentRequest>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |request, reply| ApiCommand::Rent {
        request: Box::new(request),
        reply,
    })
    .await
}

async fn rent_progress(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(name): UrlPath<String>,
) -> Response {
    ask(&state, |reply| ApiCommand::RentProgress { name, reply }).await
}

async fn bids(_: Authorized, State(state): State<AppState>) -> Response {
    ask(&state, |reply| ApiCommand::Bids { reply }).await
}

async fn cancel_bid(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(bid): UrlPath<String>,
) -> Response {
    ask(&state, |reply| ApiCommand::CancelBid { bid, reply }).await
}

async fn group(
    _: Authorized,
    State(state): State<AppState>,
    request: Result<Json<RentRequest>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |request, reply| ApiCommand::Group {
        request: Box::new(request),
        reply,
    })
    .await
}

async fn scale_group(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(group): UrlPath<String>,
    request: Result<Json<gpux_api::GroupScale>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |scale: gpux_api::GroupScale, reply| {
        ApiCommand::ScaleGroup {
            group,
            delta: scale.delta,
            reply,
        }
    })
    .await
}

async fn bid(
    _: Authorized,
    State(state): State<AppState>,
    request: Result<Json<BidRequest>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |request, reply| ApiCommand::Bid {
        request: Box::new(request),
        reply,
    })
    .await
}

#[derive(serde::Deserialize)]
struct LogParams {
    from: Option<u64>,
}

async fn logs(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
    Query(p): Query<LogParams>,
) -> Response {
    let from = p.from.unwrap_or(0);
    ask(&state, |reply| ApiCommand::Logs { lease, from, reply }).await
}

async fn receipts(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
) -> Response {
    ask(&state, |reply| ApiCommand::Receipts { lease, reply }).await
}

async fn stop(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
) -> Response {
    ask(&state, |reply| ApiCommand::Stop { lease, reply }).await
}

async fn commit(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
) -> Response {
    ask(&state, |reply| ApiCommand::Commit { lease, reply }).await
}

async fn challenge(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
) -> Response {
    ask(&state, |reply| ApiCommand::Challenge { lease, reply }).await
}

async fn balance(_: Authorized, State(state): State<AppState>) -> Response {
    ask(&state, |reply| ApiCommand::Balance { reply }).await
}

async fn mint(
    _: Authorized,
    State(state): State<AppState>,
    request: Result<Json<MintRequest>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |request, reply| ApiCommand::Mint {
        request,
        reply,
    })
    .await
}

async fn block(
    _: Authorized,
    State(state): State<AppState>,
    request: Result<Json<BlockRequest>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |request, reply| ApiCommand::Block {
        request,
        reply,
    })
    .await
}

async fn ledger(_: Authorized, State(state): State<AppState>) -> Response {
    ask(&state, |reply| ApiCommand::Ledger { reply }).await
}

async fn ledger_readd(
    _: Authorized,
    State(state): State<AppState>,
    request: Result<Json<gpux_api::ReaddRequest>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |request, reply| ApiCommand::LedgerReadd {
        request,
        reply,
    })
    .await
}

async fn follow(
    _: Authorized,
    State(state): State<AppState>,
    request: Result<Json<gpux_api::FollowRequest>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |request, reply| ApiCommand::Follow {
        request,
        reply,
    })
    .await
}

async fn settings(_: Authorized, State(state): State<AppState>) -> Response {
    ask(&state, |reply| ApiCommand::Settings {
        change: None,
        reply,
    })
    .await
}

async fn change_setting(
    _: Authorized,
    State(state): State<AppState>,
    request: Result<Json<gpux_api::SettingChange>, JsonRejection>,
) -> Response {
    ask_body(&state, request, |change, reply| ApiCommand::Settings {
        change: Some(change),
        reply,
    })
    .await
}

/// `gpux console`: a one-time link that signs a browser into the console.
async fn console_login(_: Authorized, State(state): State<AppState>) -> Response {
    match state.console.issue_login() {
        Ok(login) => Json(login).into_response(),
        Err(e) => error(e),
    }
}

/// `POST /v1/shutdown`, its body optional (none, empty or `null`: the defaults).
async fn shutdown_node(
    _: Authorized,
    State(state): State<AppState>,
    body: axum::body::Bytes,
) -> Response {
    let request = match body.trim_ascii() {
        b"" | b"null" => gpux_api::ShutdownRequest::default(),
        bytes => match serde_json::from_slice(bytes) {
            Ok(request) => request,
            Err(e) => return error(ApiError::bad_input(format!("the request body: {e}"))),
        },
    };
    ask(&state, |reply| ApiCommand::Shutdown {
        end_leases: request.end_leases,
        reply,
    })
    .await
}

/// A WebSocket endpoint's request, in its query string: `?request=` base64url of JSON.
#[derive(serde::Deserialize)]
struct RequestParams {
    request: String,
}

/// Decodes a [`RequestParams`] into `T`, or says why it could not.
fn decode_request<T: serde::de::DeserializeOwned>(
    params: Result<Query<RequestParams>, QueryRejection>,
) -> Result<T, String> {
    use base64::Engine;
    let Query(p) = params.map_err(|e| e.body_text())?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(p.request)
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&json).map_err(|e| e.to_string())
}

/// The largest WebSocket message the plane endpoints take: one plane frame.
const MAX_WS_MESSAGE: usize = gpux_protocol::plane_wire::MAX_PLANE_FRAME + 1024;

async fn exec(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
    params: Result<Query<RequestParams>, QueryRejection>,
    ws: WebSocketUpgrade,
) -> Response {
    let request = match decode_request::<ExecRequest>(params) {
        Ok(r) => r,
        Err(e) => return error(ApiError::bad_input(format!("the exec request: {e}"))),
    };
    match state.bridge.open_exec(&lease, &request).await {
        Ok(stream) => ws
            .max_message_size(MAX_WS_MESSAGE)
            .on_upgrade(move |socket| bridge::pump_frames(socket, stream)),
        Err(e) => error(e),
    }
}

/// `gpux cp`: this node copies between its own filesystem and the lease's workspace, and
/// tells the CLI how far it got (see `plane::delegate`).
async fn copy(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
    params: Result<Query<RequestParams>, QueryRejection>,
    ws: WebSocketUpgrade,
) -> Response {
    let order = decode_request::<gpux_api::CopyOrder>(params);
    let order = match order {
        Ok(o) if o.local.is_absolute() => o,
        Ok(o) => {
            return error(ApiError::bad_input(format!(
                "the copy's local path {} is not absolute",
                o.local.display()
            )));
        }
        Err(e) => return error(ApiError::bad_input(format!("the copy request: {e}"))),
    };
    match state.bridge.open_files(&lease).await {
        Ok(stream) => {
            ws.on_upgrade(move |socket| crate::plane::delegate::serve(socket, stream, order))
        }
        Err(e) => error(e),
    }
}

#[derive(serde::Deserialize)]
struct ForwardParams {
    port: u16,
}

async fn forward(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
    params: Result<Query<ForwardParams>, QueryRejection>,
    ws: WebSocketUpgrade,
) -> Response {
    let port = match params {
        Ok(Query(p)) => p.port,
        Err(e) => return error(ApiError::bad_input(format!("port: {}", e.body_text()))),
    };
    match state.bridge.open_forward(&lease, port).await {
        Ok(stream) => ws
            .max_message_size(MAX_WS_MESSAGE)
            .on_upgrade(move |socket| bridge::pump_forward(socket, stream)),
        Err(e) => error(e),
    }
}

/// `gpux ssh`: an SSH connection's bytes to the lease's host (its node is the server).
async fn ssh(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
    ws: WebSocketUpgrade,
) -> Response {
    match state.bridge.open_ssh(&lease).await {
        Ok(stream) => ws
            .max_message_size(MAX_WS_MESSAGE)
            .on_upgrade(move |socket| bridge::pump_forward(socket, stream)),
        Err(e) => error(e),
    }
}

#[derive(serde::Deserialize)]
struct ListenParams {
    #[serde(default)]
    local: u16,
    port: u16,
}

/// `gpux forward`: this node listens on its loopback and carries each connection to the
/// lease's container (see `bridge::serve_forward`).
async fn listen(
    _: Authorized,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
    params: Result<Query<ListenParams>, QueryRejection>,
    ws: WebSocketUpgrade,
) -> Response {
    let (local, port) = match params {
        Ok(Query(p)) => (p.local, p.port),
        Err(e) => return error(ApiError::bad_input(format!("ports: {}", e.body_text()))),
    };
    match state.bridge.listen(&lease, local, port).await {
        Ok(listener) => {
            let bridge = state.bridge.clone();
            ws.on_upgrade(move |socket| bridge::serve_forward(socket, bridge, listener))
        }
        Err(e) => error(e),
    }
}

/// A path the API does not have: 401 without the token, as every other path (nothing about
/// the API is told to a caller without it), 400 with it.
async fn not_found(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    if !bearer_token(&headers).is_some_and(|t| same(t.as_bytes(), state.token.as_bytes())) {
        return unauthorized();
    }
    error(ApiError::new(ErrorCode::BadInput, "no such API path"))
}

/// The API token of a data dir, created (0600) when missing.
pub fn ensure_token(data_dir: &Path) -> std::io::Result<String> {
    let path = data_dir.join(TOKEN_FILE);
    if let Ok(token) = std::fs::read_to_string(&path) {
        let token = token.trim().to_string();
        if token.len() == 64 {
            return Ok(token);
        }
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let token = gpux_protocol::hex(&bytes);
    write_private(&path, token.as_bytes())?;
    Ok(token)
}

/// Binds the API and serves it until `shutdown` resolves. Returns the bound address once
/// listening (through `bound`).
pub(crate) async fn serve(
    addr: SocketAddr,
    token: String,
    commands: mpsc::Sender<ApiCommand>,
    bridge: Bridge,
    feeds: super::console::Feeds,
    data_dir: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    if !addr.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("the API listens on loopback only, not {addr}"),
        ));
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    write_private(&data_dir.join(ADDR_FILE), bound.to_string().as_bytes())?;
    let app = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/offers", get(offers))
        .route("/v1/leases", get(leases))
        .route("/v1/leases/{lease}/logs", get(logs))
        .route("/v1/leases/{lease}/receipts", get(receipts))
        .route("/v1/leases/{lease}/stop", post(stop))
        .route("/v1/leases/{lease}/commit", post(commit))
        .route("/v1/leases/{lease}/challenge", post(challenge))
        .route("/v1/groups", post(group))
        .route("/v1/groups/{group}/scale", post(scale_group))
        .route("/v1/leases/{lease}/exec", get(exec))
        .route("/v1/leases/{lease}/forward", get(forward))
        .route("/v1/leases/{lease}/ssh", get(ssh))
        .route("/v1/leases/{lease}/listen", get(listen))
        .route("/v1/leases/{lease}/copy", get(copy))
        .route("/v1/balance", get(balance))
        .route("/v1/ledger", get(ledger))
        .route("/v1/ledger/mint", post(mint))
        .route("/v1/ledger/readd", post(ledger_readd))
        .route("/v1/rent", post(rent))
        .route("/v1/rent/progress/{name}", get(rent_progress))
        .route("/v1/bid", post(bid))
        .route("/v1/bids", get(bids))
        .route("/v1/bids/{bid}/cancel", post(cancel_bid))
        .route("/v1/block", post(block))
        .route("/v1/shutdown", post(shutdown_node))
        .route("/v1/settings", get(settings).post(change_setting))
        .route("/v1/market/follow", post(follow))
        .route("/v1/console/login", post(console_login))
        .merge(super::console::routes())
        .fallback(not_found)
        .with_state(AppState {
            token,
            commands,
            bridge,
            console: super::console::Console::new(bound, feeds.history),
            snapshots: feeds.snapshots,
        });
    let task = tokio::spawn(super::http::serve(listener, app, shutdown));
    Ok((bound, task))
}
