//! The host's part of the console: its controls (price, spot floor, pause and resume, a
//! drain) posted as `gpux host set|pause|resume|drain` post them, through the same settings
//! command and checks, and what it earned per day over the last two weeks, drawn as SVG on
//! the server from its lease records (the same rule as `gpux host earnings --by day`).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use gpux_api::{ApiError, HostLive, LeaseView, Role, SettingChange};
use gpux_protocol::MicroCredits;
use maud::{Markup, html};

use super::{ApiCommand, AppState, Signed, call};

/// Days the earnings chart shows, today included.
const DAYS: u64 = 14;
const DAY_MS: u64 = 86_400_000;

/// What a control posts: the setting and its value as typed.
#[derive(serde::Deserialize, Default)]
pub(super) struct HostForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

/// The settings change a control's form asks for (a drain's value is a span from now, as
/// `gpux host drain --until` takes one).
fn change(form: &HostForm, now_ms: u64) -> Result<SettingChange, ApiError> {
    let value = form.value.trim();
    match form.name.as_str() {
        "price" | "spot-floor" | "region" | "paused" => Ok(SettingChange {
            name: form.name.clone(),
            value: value.to_string(),
        }),
        "drain" => {
            let secs = gpux_api::text::duration_s(value)
                .map_err(|e| ApiError::bad_input(format!("drain: {e}")))?;
            Ok(SettingChange {
                name: "drain-until".into(),
                value: (now_ms + u64::from(secs) * 1000).to_string(),
            })
        }
        "resume" => Ok(SettingChange {
            name: "drain-until".into(),
            value: "off".into(),
        }),
        other => Err(ApiError::bad_input(format!(
            "'{other}' is not a control of the console"
        ))),
    }
}

/// `POST /console/host`: one control.
pub(super) async fn post(
    signed: Signed,
    State(state): State<AppState>,
    headers: HeaderMap,
    posted: Result<axum::Form<HostForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let form = posted.map(|f| f.0).unwrap_or_default();
    if let Err(refused) = signed.check_post(&headers, &form.csrf) {
        return refused.into_response();
    }
    let mut changes = vec![change(&form, super::layout::now_ms())];
    // Resuming ends a pause and a drain, as `gpux host resume` does.
    if form.name == "resume" {
        changes.push(Ok(SettingChange {
            name: "paused".into(),
            value: "false".into(),
        }));
    }
    for c in changes {
        let done = match c {
            Ok(c) => {
                call(&state, |reply| ApiCommand::Settings {
                    change: Some(c),
                    reply,
                })
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            let status = StatusCode::from_u16(e.code.status()).unwrap_or(StatusCode::BAD_REQUEST);
            return super::refuse(status, &e.to_string());
        }
    }
    Redirect::to("/console/").into_response()
}

fn when(ms: u64) -> String {
    super::layout::utc(ms)
}

/// The controls and the state they set.
pub(super) fn controls(live: &HostLive, csrf: &str) -> Markup {
    html! {
        div.card #host-controls {
            h2 { "Hosting" }
            p.small #host-state {
                @if live.paused { "paused: no offers, new leases refused; running leases go on" }
                @else if let Some(until) = live.drain_until { "draining: only leases that end by " (when(until)) }
                @else { "offered at " (live.price) " credits per GPU-hour" }
                @if let Some(free) = live.free_at { "; free at " (when(free)) } @else { "; no lease running" }
            }
            @if !live.failed_gpus.is_empty() {
                p.small #failed-gpus { "withheld after a fault: " (live.failed_gpus.join(", "))
                    " (" code { "gpux host check" } " offers them again once they read well)" }
            }
            form method="post" action="/console/host" #set-price {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="name" value="price";
                label { "Price (credits/GPU-h) " input name="value" value=(live.price) size="8"; }
                button type="submit" { "Set" }
            }
            form method="post" action="/console/host" #set-spot-floor {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="name" value="spot-floor";
                label { "Spot floor " input name="value" value=(live.spot_floor.as_deref().unwrap_or("off")) size="8"; }
                button type="submit" { "Set" }
            }
            form method="post" action="/console/host" #drain {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="name" value="drain";
                label { "Free the machine in " input name="value" placeholder="6h" size="6"; }
                button type="submit" { "Drain" }
            }
            @if live.paused || live.drain_until.is_some() {
                form method="post" action="/console/host" #resume {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="name" value="resume";
                    button type="submit" { "Resume" }
                }
            } @else {
                form method="post" action="/console/host" #pause {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="name" value="paused";
                    input type="hidden" name="value" value="true";
                    button type="submit" { "Pause" }
                }
            }
        }
    }
}

/// Paid (redeemed) per UTC day over the last [`DAYS`], from the host's leases: a lease
/// falls on the day it ended (or began, while it runs). Oldest first.
pub(super) fn earnings_by_day(leases: &[LeaseView], now_ms: u64) -> Vec<(u64, u64)> {
    let today = now_ms / DAY_MS;
    let first = today.saturating_sub(DAYS - 1);
    let mut days: Vec<(u64, u64)> = (first..=today).map(|d| (d * DAY_MS, 0)).collect();
    for l in leases.iter().filter(|l| l.role == Role::Host) {
        let day = l.finished_at.or(l.started_at).unwrap_or(l.since) / DAY_MS;
        if let Some(slot) = day
            .checked_sub(first)
            .and_then(|i| days.get_mut(usize::try_from(i).ok()?))
        {
            slot.1 = slot.1.saturating_add(l.redeemed);
        }
    }
    days
}

/// The earnings chart: a bar per day (credits paid), the day's date under every other one.
pub(super) fn earnings_chart(days: &[(u64, u64)]) -> Markup {
    const WIDTH: f64 = 720.0;
    const HEIGHT: f64 = 160.0;
    const BOTTOM: f64 = 24.0;
    let max = days.iter().map(|d| d.1).max().unwrap_or(0).max(1) as f64;
    let step = WIDTH / days.len().max(1) as f64;
    html! {
        figure {
            svg #earnings-chart xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(HEIGHT)
                viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img"
                aria-label="Credits this host was paid, per day, over the last two weeks" {
                @for (i, (day, paid)) in days.iter().enumerate() {
                    @let h = (HEIGHT - BOTTOM - 14.0) * (*paid as f64) / max;
                    @let x = step * i as f64;
                    rect x=(x + 4.0) y=(HEIGHT - BOTTOM - h) width=(step - 8.0) height=(h)
                        class="bar" data-day=(when(*day).get(..10).unwrap_or("")) data-paid=(paid) {
                        title { (when(*day).get(..10).unwrap_or("")) ": " (MicroCredits(*paid).amount_text()) " credits" }
                    }
                    @if i % 2 == days.len() % 2 {
                        text x=(x + step / 2.0) y=(HEIGHT - 6.0) text-anchor="middle" class="label" {
                            (when(*day).get(5..10).unwrap_or(""))
                        }
                    }
                }
            }
            figcaption { "Paid per day (UTC), last " (DAYS) " days: "
                (MicroCredits(days.iter().map(|d| d.1).fold(0, u64::saturating_add)).amount_text()) " credits" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(name: &str, value: &str) -> HostForm {
        HostForm {
            csrf: String::new(),
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn controls_post_the_settings_gpux_host_sets() {
        let now = 1_796_601_600_000;
        let c = change(&form("price", " 1.75 "), now).unwrap();
        assert_eq!((c.name.as_str(), c.value.as_str()), ("price", "1.75"));
        let c = change(&form("drain", "2h"), now).unwrap();
        assert_eq!(c.name, "drain-until");
        assert_eq!(c.value, (now + 7_200_000).to_string());
        assert!(change(&form("drain", "soon"), now).is_err());
        assert!(change(&form("failed-gpus", ""), now).is_err());
        assert_eq!(change(&form("resume", ""), now).unwrap().value, "off");
    }
}
