//! Renting from the console: a form with `gpux rent`'s fields, read as `gpux rent` reads
//! them (the same text forms, `gpux_api::text`) and then rented exactly as the API rents (the
//! node's own checks, the spend cap); and, on a lease's page, how to reach it.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use gpux_api::{ApiError, LeaseView, RentRequest, Role};
use maud::{Markup, html};

use super::layout::{Page, layout};
use super::{ApiCommand, AppState, Signed, call};

/// What the form sends (text as typed; an unreadable post reads as an empty one).
#[derive(serde::Deserialize, Default, Clone)]
pub(crate) struct RentForm {
    #[serde(default)]
    pub(crate) csrf: String,
    #[serde(default)]
    q: String,
    #[serde(default)]
    gpus: String,
    #[serde(default)]
    duration: String,
    #[serde(default)]
    max_price: String,
    #[serde(default)]
    image: String,
    #[serde(default)]
    disk: String,
    #[serde(default)]
    command: String,
    #[serde(default)]
    ssh_key: String,
    #[serde(default)]
    spot: Option<String>,
}

impl RentForm {
    /// The rent this form asks for, or what is wrong with it (named as `gpux rent` names
    /// its flags).
    fn request(&self) -> Result<RentRequest, ApiError> {
        let bad = |flag: &str, e: String| ApiError::bad_input(format!("{flag}: {e}"));
        let gpus = match self.gpus.trim() {
            "" => 1,
            text => text
                .parse::<u16>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad("--gpus", format!("'{text}': a whole number from 1")))?,
        };
        let duration_s = match self.duration.trim() {
            "" => 3600,
            text => gpux_api::text::duration_s(text).map_err(|e| bad("--duration", e))?,
        };
        if self.max_price.trim().is_empty() {
            return Err(bad(
                "--max-price",
                "the most you pay per GPU-hour, e.g. 2.50".into(),
            ));
        }
        let disk_bytes = match self.disk.trim() {
            "" => None,
            text => Some(gpux_api::text::size_bytes(text).map_err(|e| bad("--disk", e))?),
        };
        let ssh_keys = match self.ssh_key.trim() {
            "" => Vec::new(),
            key if gpux_protocol::is_ssh_public_key(key) => vec![key.to_string()],
            _ => {
                return Err(bad(
                    "--ssh",
                    "not an OpenSSH public key (one line, e.g. ssh-ed25519 AAAA... you@host)"
                        .into(),
                ));
            }
        };
        let command = match self.command.trim() {
            "" => Vec::new(),
            line => vec!["sh".into(), "-c".into(), line.into()],
        };
        Ok(RentRequest {
            query: self.q.trim().to_string(),
            gpus,
            max_price: self.max_price.trim().to_string(),
            duration_s,
            image: Some(self.image.trim().to_string()).filter(|i| !i.is_empty()),
            command,
            disk_bytes,
            ssh_keys,
            spot: self.spot.is_some(),
            ..RentRequest::default()
        })
    }
}

/// `GET /console/rent`: the form, filled from the address (the market's "rent" links).
pub(super) async fn form(
    signed: Signed,
    State(state): State<AppState>,
    Query(filled): Query<RentForm>,
) -> Response {
    page(&state, &filled, None, &signed.csrf)
        .await
        .into_response()
}

/// `POST /console/rent`: rents, then shows the lease; a refusal shows on the form, with
/// what was typed.
pub(super) async fn rent(
    signed: Signed,
    State(state): State<AppState>,
    headers: HeaderMap,
    posted: Result<axum::Form<RentForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let form = posted.map(|f| f.0).unwrap_or_default();
    if let Err(refused) = signed.check_post(&headers, &form.csrf) {
        return refused.into_response();
    }
    let rented = match form.request() {
        Ok(request) => {
            call(&state, |reply| ApiCommand::Rent {
                request: Box::new(request),
                reply,
            })
            .await
        }
        Err(e) => Err(e),
    };
    match rented {
        Ok(rented) => Redirect::to(&format!("/console/leases/{}", rented.lease)).into_response(),
        Err(e) => {
            let status = StatusCode::from_u16(e.code.status()).unwrap_or(StatusCode::BAD_REQUEST);
            (status, page(&state, &form, Some(&e), &signed.csrf).await).into_response()
        }
    }
}

async fn page(state: &AppState, form: &RentForm, error: Option<&ApiError>, csrf: &str) -> Page {
    let settings = call(state, |reply| ApiCommand::Settings {
        change: None,
        reply,
    })
    .await
    .ok();
    let cap = settings.as_ref().map(|s| match s.spend_cap_micro {
        Some(cap) => format!(
            "Your spend cap is {} credits; open leases commit {}. A rent that could pass it is refused.",
            gpux_protocol::MicroCredits(cap).amount_text(),
            gpux_protocol::MicroCredits(s.committed_micro).amount_text()
        ),
        None => "No spend cap is set (`gpux config set spend-cap CREDITS` sets one).".into(),
    });
    let body = html! {
        @if let Some(e) = error {
            p.error #rent-error { (e.message) @if let Some(hint) = &e.hint { " (" (hint) ")" } }
        }
        form #rent-form.rent method="post" action="/console/rent" {
            input type="hidden" name="csrf" value=(csrf);
            label { "Query" input #q type="text" name="q" value=(form.q) placeholder="gpu=l4 vram>=24 region=eu"; }
            label { "GPUs" input #gpus type="number" min="1" max="64" name="gpus"
                value=(if form.gpus.is_empty() { "1" } else { &form.gpus }); }
            label { "Duration" input #duration type="text" name="duration"
                value=(if form.duration.is_empty() { "1h" } else { &form.duration })
                placeholder="90, 30m, 8h"; }
            label { "Max price (credits per GPU-hour)" input #max_price type="text" name="max_price" value=(form.max_price) placeholder="2.50"; }
            label { "Image" input #image type="text" name="image" value=(form.image)
                placeholder="registry.example.org/team/train:3, an image of yours, or one the host lists"; }
            label { "Workspace" input #disk type="text" name="disk" value=(form.disk) placeholder="20GiB (empty: none)"; }
            label { "Command" input #command type="text" name="command" value=(form.command) placeholder="python train.py (run by sh -c; empty: the image's own)"; }
            label { "SSH public key" textarea #ssh_key name="ssh_key" rows="2" placeholder="ssh-ed25519 AAAA... you@laptop (empty: no SSH)" { (form.ssh_key) } }
            label.check { input #spot type="checkbox" name="spot" checked[form.spot.is_some()]; " Spot (cheaper, interruptible)" }
            button #rent type="submit" { "Rent" }
        }
        @if let Some(cap) = cap { p.small #rent-cap { (cap) } }
        p.small {
            "The same as " code { "gpux rent" } ": the image is pulled or staged before the lease's clock starts; "
            "a private registry's credentials and the other flags are on the command line."
        }
    };
    layout("Rent", Some(csrf), body)
}

/// How to reach a running lease this node rents, from this machine.
pub(super) fn connect(l: &LeaseView) -> Markup {
    if l.role != Role::Renter || l.settled || l.end.is_some() {
        return html! {};
    }
    let id = &l.lease;
    let short = id.get(..12).unwrap_or(id);
    html! {
        h2 { "Connect " span.small { "(from this machine)" } }
        dl.facts #connect {
            @if l.ssh_keys.is_empty() {
                dt { "Shell" } dd { code { "gpux exec -it " (id) " -- sh" } }
            } @else {
                dt { "SSH" } dd { code #connect-ssh { "gpux ssh " (id) } }
                dt { "SSH config" } dd {
                    code { "gpux ssh-config " (id) " >> ~/.ssh/config" }
                    span.small { " then " code { "ssh gpux-" (short) } ", " code { "scp" } " or VS Code's Remote-SSH" }
                }
            }
            dt { "Files" } dd {
                code { "gpux cp ./data " (id) ":/workspace/" } br;
                code { "gpux cp " (id) ":/workspace/out ./" }
            }
            dt { "A port" } dd { code #connect-forward { "gpux forward " (id) " 8888" } }
            dt { "Output" } dd { code { "gpux logs -f " (id) } }
        }
    }
}
