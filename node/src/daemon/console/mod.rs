//! The web console: the node's state in a browser, served on the API's own loopback address
//! under `/console/`.
//!
//! Nobody gets in without a session. `gpux console` (with the API token) asks for a one-time
//! link; opening it, within two minutes and once, sets a session cookie (`HttpOnly`,
//! `SameSite=Strict`, path `/console`) and the link is spent. Every console request must
//! name this node's loopback address as its `Host` (a page from elsewhere that re-points a
//! name at 127.0.0.1 is refused), and an `Origin`, when there is one, must be that address
//! too. The console reads, and changes two things: it rents (`rent.rs`, as `gpux rent`
//! does) and stops one of this node's own leases; those forms post the session's
//! anti-forgery token, and a post without it, or without this origin, is refused. Pages carry a strict content security policy (scripts and styles from the
//! console only), are never framed and never cached.

mod chart;
mod history;
mod host;
mod layout;
mod pages;
mod rent;
pub(crate) mod sessions;

pub(crate) use history::History;
use sessions::SESSION_TTL;
pub(crate) use sessions::{Console, Feeds};

use std::time::Duration;

use axum::Router;
use axum::extract::{FromRequestParts, Path as UrlPath, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use gpux_api::ApiError;

use super::command::{ApiCommand, AppState, call};
use super::http::same;

/// How often the live view is re-read.
const LIVE_EVERY: Duration = Duration::from_secs(2);

/// A refusal page with its status.
fn refuse(status: StatusCode, why: &str) -> Response {
    (status, pages::refusal(status, why)).into_response()
}

/// A request refused before it was read: its status and why.
struct Refused(StatusCode, &'static str);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        refuse(self.0, self.1)
    }
}

/// The request's `Host` and `Origin` are this console's (or there is no `Origin`).
fn check_origin(console: &Console, headers: &HeaderMap) -> Result<(), Refused> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !console.is_own_host(host) {
        return Err(Refused(
            StatusCode::FORBIDDEN,
            "this console answers only at its own loopback address",
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN)
        && !origin.to_str().is_ok_and(|o| console.is_own_origin(o))
    {
        return Err(Refused(
            StatusCode::FORBIDDEN,
            "a request from another site is refused",
        ));
    }
    Ok(())
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A signed-in browser, from its own origin.
pub(crate) struct Signed {
    session: String,
    csrf: String,
}

impl FromRequestParts<AppState> for Signed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        check_origin(&state.console, &parts.headers).map_err(IntoResponse::into_response)?;
        let name = state.console.cookie_name();
        let session = cookie(&parts.headers, &name).unwrap_or("").to_string();
        match state.console.session(&session) {
            Some(csrf) => Ok(Signed { session, csrf }),
            None => Err(refuse(
                StatusCode::UNAUTHORIZED,
                "not signed in: run `gpux console` on this machine and open the link it prints",
            )),
        }
    }
}

impl Signed {
    /// A state change: it must come from this console's own page (an `Origin` naming it)
    /// with the session's anti-forgery token.
    fn check_post(&self, headers: &HeaderMap, csrf: &str) -> Result<(), Refused> {
        let own_page = headers.get(header::ORIGIN).is_some();
        if !own_page || !same(csrf.as_bytes(), self.csrf.as_bytes()) {
            return Err(Refused(
                StatusCode::FORBIDDEN,
                "a change without the console's anti-forgery token is refused",
            ));
        }
        Ok(())
    }
}

/// A console form's fields.
#[derive(serde::Deserialize, Default)]
struct Form {
    #[serde(default)]
    csrf: String,
}

/// The form of a post (an unreadable one is an empty one, refused for its missing token).
type Posted = Result<axum::Form<Form>, axum::extract::rejection::FormRejection>;

fn form_of(posted: Posted) -> Form {
    posted.map(|f| f.0).unwrap_or_default()
}

/// The console's routes, on the API's router.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/console/login", get(login))
        .route("/console/logout", post(logout))
        .route("/console/", get(overview))
        .route("/console", get(|| async { Redirect::to("/console/") }))
        .route("/console/market", get(market))
        .route("/console/estimate", get(estimate))
        .route("/console/rent", get(rent::form).post(rent::rent))
        .route("/console/leases/{lease}", get(lease))
        .route("/console/leases/{lease}/stop", post(stop))
        .route("/console/host", post(host::post))
        .route("/console/leases/{lease}/receipts.csv", get(receipts_csv))
        .route("/console/live", get(live))
        .route("/console/app.js", get(script))
        .route("/console/style.css", get(style))
        .layer(axum::middleware::map_response(hardened))
}

/// Headers every console answer carries.
async fn hardened(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        // Not `no-referrer`: that makes a browser send `Origin: null` with its own posts.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[derive(serde::Deserialize)]
struct LoginParams {
    #[serde(default)]
    once: String,
}

async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(p): Query<LoginParams>,
) -> Response {
    if let Err(refused) = check_origin(&state.console, &headers) {
        return refused.into_response();
    }
    let Some((session, _)) = state.console.open_session(&p.once) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "this login link was used already or has lapsed: run `gpux console` again",
        );
    };
    let cookie = format!(
        "{}={session}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
        state.console.cookie_name(),
        SESSION_TTL.as_secs()
    );
    let mut response = Redirect::to("/console/").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn logout(
    signed: Signed,
    State(state): State<AppState>,
    headers: HeaderMap,
    posted: Posted,
) -> Response {
    if let Err(refused) = signed.check_post(&headers, &form_of(posted).csrf) {
        return refused.into_response();
    }
    state.console.end_session(&signed.session);
    let mut response = (StatusCode::OK, pages::signed_out()).into_response();
    // The cookie goes with the session.
    let gone = format!(
        "{}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        state.console.cookie_name()
    );
    if let Ok(value) = HeaderValue::from_str(&gone) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// What the overview shows, read from the node.
pub(crate) struct Overview {
    leases: Vec<gpux_api::LeaseView>,
    balance: Result<gpux_api::Balance, ApiError>,
    settings: Option<gpux_api::Settings>,
    host: Option<pages::HostView>,
}

async fn read_overview(state: &AppState) -> Result<Overview, ApiError> {
    let leases = call(state, |reply| ApiCommand::Leases { reply }).await?;
    let balance = call(state, |reply| ApiCommand::Balance { reply }).await;
    let settings = call(state, |reply| ApiCommand::Settings {
        change: None,
        reply,
    })
    .await
    .ok();
    let host = crate::metrics::take(&state.snapshots)
        .await
        .and_then(|(snapshot, gpus)| {
            gpus.map(|(host, readings)| pages::HostView {
                history: readings
                    .iter()
                    .map(|r| (r.uuid.clone(), state.console.history.of(&r.uuid)))
                    .collect(),
                gpus: readings,
                leases: host.leases,
                earned_micro: snapshot.earned_micro,
            })
        });
    Ok(Overview {
        leases,
        balance,
        settings,
        host,
    })
}

fn failed(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.code.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    refuse(status, &e.to_string())
}

async fn overview(signed: Signed, State(state): State<AppState>) -> Response {
    match read_overview(&state).await {
        Ok(view) => pages::overview(&view, &signed.csrf).into_response(),
        Err(e) => failed(&e),
    }
}

/// How the market page sorts and filters.
#[derive(serde::Deserialize, Default)]
pub(crate) struct MarketParams {
    #[serde(default)]
    pub(crate) q: String,
    #[serde(default)]
    pub(crate) sort: Option<String>,
    #[serde(default)]
    pub(crate) desc: bool,
}

/// Offers read for one market page, at most.
const MARKET_LIMIT: usize = 500;

async fn market(
    signed: Signed,
    State(state): State<AppState>,
    Query(p): Query<MarketParams>,
) -> Response {
    let query = p.q.clone();
    let hits = call(&state, |reply| ApiCommand::Search {
        query,
        limit: MARKET_LIMIT,
        reply,
    })
    .await;
    pages::market(&p, hits, &signed.csrf).into_response()
}

#[derive(serde::Deserialize)]
pub(crate) struct EstimateParams {
    pub(crate) gpu: Option<String>,
    pub(crate) gpus: Option<u32>,
    pub(crate) hours: Option<f64>,
}

async fn estimate(
    signed: Signed,
    State(state): State<AppState>,
    Query(p): Query<EstimateParams>,
) -> Response {
    let result = match p.gpu.as_deref().filter(|g| !g.is_empty()) {
        None => None,
        Some(gpu) => Some(match gpu.parse::<gpux_protocol::GpuFamily>() {
            Err(e) => Err(format!("{gpu}: {e}")),
            Ok(family) => {
                let query = format!("gpu={}", family.key());
                match call(&state, |reply| ApiCommand::Search {
                    query,
                    limit: 1000,
                    reply,
                })
                .await
                {
                    Err(e) => Err(e.to_string()),
                    Ok(hits) => {
                        let offers: Vec<_> = hits
                            .iter()
                            .filter(|h| h.mig_profile.is_none())
                            .map(|h| gpux_market::estimate::BookOffer {
                                price: h.price_per_gpu_hour.0 as f64 / 1e6,
                                spot_floor: h.spot_floor_per_gpu_hour.map(|f| f.0 as f64 / 1e6),
                                free: u32::from(h.free),
                            })
                            .collect();
                        gpux_market::estimate::estimate(
                            family,
                            p.gpus.unwrap_or(1),
                            p.hours.unwrap_or(200.0),
                            &offers,
                        )
                        .map_err(|e| e.to_string())
                    }
                }
            }
        }),
    };
    pages::estimate(&p, result, &signed.csrf).into_response()
}

async fn lease(
    signed: Signed,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
) -> Response {
    let id = lease.clone();
    let receipts = match call(&state, |reply| ApiCommand::Receipts { lease: id, reply }).await {
        Ok(r) => r,
        Err(e) => return failed(&e),
    };
    let logs = call(&state, |reply| ApiCommand::Logs {
        lease,
        from: 0,
        reply,
    })
    .await
    .map(|page| page.text)
    .unwrap_or_default();
    pages::lease(&receipts, &logs, &signed.csrf).into_response()
}

async fn stop(
    signed: Signed,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
    headers: HeaderMap,
    posted: Posted,
) -> Response {
    if let Err(refused) = signed.check_post(&headers, &form_of(posted).csrf) {
        return refused.into_response();
    }
    // Only a lease this node rents: a host's console never stops its renters' work.
    let id = lease.clone();
    match call(&state, |reply| ApiCommand::Receipts { lease: id, reply }).await {
        Ok(r) if r.lease.role == gpux_api::Role::Renter => {}
        Ok(_) => {
            return refuse(
                StatusCode::FORBIDDEN,
                "the console stops only leases this node rents",
            );
        }
        Err(e) => return failed(&e),
    }
    let id = lease.clone();
    match call(&state, |reply| ApiCommand::Stop { lease: id, reply }).await {
        Ok(_) => Redirect::to(&format!("/console/leases/{lease}")).into_response(),
        Err(e) => failed(&e),
    }
}

async fn receipts_csv(
    _: Signed,
    State(state): State<AppState>,
    UrlPath(lease): UrlPath<String>,
) -> Response {
    let id = lease.clone();
    match call(&state, |reply| ApiCommand::Receipts { lease: id, reply }).await {
        Ok(r) => {
            let name = format!("attachment; filename=\"gpux-receipts-{lease}.csv\"");
            let mut response = pages::receipts_csv(&r).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/csv; charset=utf-8"),
            );
            if let Ok(value) = HeaderValue::from_str(&name) {
                headers.insert(header::CONTENT_DISPOSITION, value);
            }
            response
        }
        Err(e) => failed(&e),
    }
}

/// Server-sent events: the leases table, whenever it changes (read every two seconds).
async fn live(signed: Signed, State(state): State<AppState>) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let csrf = signed.csrf;
    let stream =
        futures::stream::unfold((state, String::new(), true), move |(state, last, first)| {
            let csrf = csrf.clone();
            async move {
                let mut last = last;
                if !first {
                    tokio::time::sleep(LIVE_EVERY).await;
                }
                loop {
                    let leases = call(&state, |reply| ApiCommand::Leases { reply })
                        .await
                        .ok()?;
                    let fragment = pages::lease_rows(&leases, &csrf).into_string();
                    if fragment != last {
                        let event = Event::default().event("leases").data(fragment.clone());
                        return Some((
                            Ok::<_, std::convert::Infallible>(event),
                            (state, fragment, false),
                        ));
                    }
                    last = fragment;
                    tokio::time::sleep(LIVE_EVERY).await;
                }
            }
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn script(_: Signed) -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("app.js"),
    )
        .into_response()
}

async fn style(_: Signed) -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("style.css"),
    )
        .into_response()
}
