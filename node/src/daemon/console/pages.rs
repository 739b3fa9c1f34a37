//! The console's pages, rendered on the server (maud escapes every value: offer fields come
//! from the network and must never become markup).

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::Html;
use gpux_api::{ApiError, LeaseView, OfferHit, Receipts, Role};
use gpux_protocol::MicroCredits;
use maud::{DOCTYPE, Markup, html};

use super::chart;
use super::layout::{Page, layout, now_ms, utc};
use super::{EstimateParams, MarketParams, Overview};

/// What a host shows of its GPUs.
pub(crate) struct HostView {
    pub(crate) gpus: Vec<gpux_attestation::GpuTelemetry>,
    /// The lease holding each GPU, by UUID.
    pub(crate) leases: BTreeMap<String, String>,
    pub(crate) earned_micro: u64,
    /// Each GPU's utilisation samples over the last hour, by UUID.
    pub(crate) history: BTreeMap<String, Vec<(u64, u32)>>,
}

fn credits(micro: u64) -> String {
    MicroCredits(micro).amount_text()
}

/// `1h 02m 03s`.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s:02}s"),
        (h, m, s) => format!("{h}h {m:02}m {s:02}s"),
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

fn kebab<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// How long a lease's work has run (or ran).
fn runtime(lease: &LeaseView) -> String {
    match (lease.started_at, lease.finished_at) {
        (Some(start), Some(end)) => span(end.saturating_sub(start)),
        (Some(start), None) if lease.phase == "running" => span(now_ms().saturating_sub(start)),
        (None, None) if lease.phase == "running" => {
            span(now_ms().saturating_sub(lease.since.max(lease.starts_at)))
        }
        _ => "—".into(),
    }
}

/// A refusal (401, 403, ...): self-contained, it loads nothing.
pub(crate) fn refusal(status: StatusCode, why: &str) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head { meta charset="utf-8"; title { "gpux console: " (status.as_u16()) } }
                body { h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) } p #why { (why) } }
            }
        }
        .into_string(),
    )
}

pub(crate) fn signed_out() -> Html<String> {
    refusal(
        StatusCode::OK,
        "signed out: run `gpux console` to sign in again",
    )
}

/// The rows of the leases table (also what the live view sends).
pub(crate) fn lease_rows(leases: &[LeaseView], _csrf: &str) -> Page {
    let mut leases: Vec<&LeaseView> = leases.iter().collect();
    leases.sort_by_key(|l| std::cmp::Reverse(l.since));
    Page(html! {
        @if leases.is_empty() {
            tr.empty { td colspan="9" { "No leases yet. Rent with " code { "gpux rent" } "." } }
        }
        @for l in leases {
            tr id={ "lease-" (l.lease) } data-phase=(l.phase) {
                td { a href={ "/console/leases/" (l.lease) } { code { (short(&l.lease)) } } }
                td { (kebab(&l.role)) }
                td { (l.kind) }
                td.phase { (l.phase) @if let Some(end) = &l.end { " (" (end) ")" } }
                td.num { (l.gpus.len()) }
                td.num { (runtime(l)) }
                td.num { (credits(l.price_per_gpu_hour_micro)) }
                td.num { (credits(l.acked_amount)) }
                td { (utc(l.since)) }
            }
        }
    })
}

pub(crate) fn overview(view: &Overview, csrf: &str) -> Page {
    // What this node's renter leases have cost so far (acknowledged receipts).
    let spent: u64 = view
        .leases
        .iter()
        .filter(|l| l.role == Role::Renter)
        .map(|l| l.acked_amount)
        .fold(0, u64::saturating_add);
    let body = html! {
        section.cards {
            div.card #balance {
                h2 { "Balance" }
                @match &view.balance {
                    Ok(b) => { p.big { (b.balance) " credits" } p.small { "account " code { (b.account) } } }
                    Err(e) => { p.small { (e.to_string()) } }
                }
            }
            div.card #spend-cap {
                h2 { "Spend cap" }
                @match &view.settings {
                    Some(s) => {
                        @match s.spend_cap_micro {
                            Some(cap) => p.big { (credits(cap)) " credits" },
                            None => p.big { "none" },
                        }
                        p.small #spent { "spent so far " (credits(spent)) " credits (acknowledged); open leases commit "
                            (credits(s.committed_micro)) " credits" }
                        p.small { "change it with " code { "gpux config set spend-cap CREDITS" } }
                    }
                    None => p.small { "unavailable" },
                }
            }
            @if let Some(host) = &view.host {
                div.card #earnings {
                    h2 { "Earned" }
                    p.big { (credits(host.earned_micro)) " credits" }
                    p.small { "paid by the ledger for this host's leases" }
                }
            }
            @if let Some(live) = view.settings.as_ref().and_then(|s| s.host.as_ref()) {
                (super::host::controls(live, csrf))
            }
        }
        h2 { "Leases" }
        table #leases {
            thead { tr {
                th { "Lease" } th { "Role" } th { "Kind" } th { "State" } th { "GPUs" }
                th { "Runtime" } th { "Price (credits/GPU-h)" } th { "Cost so far (credits)" }
                th { "Since (UTC)" }
            } }
            tbody #lease-rows data-live="/console/live" { (lease_rows(&view.leases, csrf).0) }
        }
        @if let Some(host) = &view.host {
            h2 { "This host's GPUs" }
            table #host-gpus {
                thead { tr {
                    th { "#" } th { "Model" } th { "UUID" } th { "Utilisation (%)" }
                    th { "Memory used (MiB)" } th { "Memory free (MiB)" } th { "Temperature (°C)" }
                    th { "Power (W)" } th { "Utilisation, last hour" } th { "Lease" }
                } }
                tbody {
                    @for g in &host.gpus {
                        tr {
                            td.num { (g.index) }
                            td { (g.name) }
                            td { code title=(g.uuid) { (short(&g.uuid)) "…" } }
                            td.num { @if let Some(u) = g.util_percent { (u) } @else { "—" } }
                            td.num { (g.memory_used_bytes / 1_048_576) }
                            td.num { (g.memory_free_bytes / 1_048_576) }
                            td.num { @if let Some(t) = g.temperature_c { (t) } @else { "—" } }
                            td.num { @if let Some(p) = g.power_mw { (format!("{:.1}", f64::from(p) / 1000.0)) } @else { "—" } }
                            td { (chart::utilisation(host.history.get(&g.uuid).map_or(&[][..], Vec::as_slice), now_ms())) }
                            td { @match host.leases.get(&g.uuid) {
                                Some(l) => a href={ "/console/leases/" (l) } { code { (short(l)) } },
                                None => "idle",
                            } }
                        }
                    }
                }
            }
        }
        @if view.host.is_some() {
            h2 { "Earnings" }
            (super::host::earnings_chart(&super::host::earnings_by_day(&view.leases, now_ms())))
        }
    };
    layout("Overview", Some(csrf), body)
}

/// The sort keys of the market's table.
const SORTS: [(&str, &str); 6] = [
    ("model", "Model"),
    ("free", "Free GPUs"),
    ("price", "Price (credits/GPU-h)"),
    ("region", "Region"),
    ("reliability", "Reliability (%)"),
    ("expires", "Expires (UTC)"),
];

fn sort_hits(hits: &mut [OfferHit], key: &str, desc: bool) {
    hits.sort_by(|a, b| {
        let order = match key {
            "model" => a.family.cmp(&b.family).then(a.vram_gb.cmp(&b.vram_gb)),
            "free" => a.free.cmp(&b.free),
            "region" => a.region.cmp(&b.region),
            "reliability" => a.reliability_permille.cmp(&b.reliability_permille),
            "expires" => a.expires_at.0.cmp(&b.expires_at.0),
            _ => a.price_per_gpu_hour.0.cmp(&b.price_per_gpu_hour.0),
        };
        if desc { order.reverse() } else { order }
    });
}

/// A measured rate, or a dash where none was measured.
fn mbps(rate: u32) -> String {
    if rate == 0 {
        "—".into()
    } else {
        rate.to_string()
    }
}

fn sort_link(p: &MarketParams, key: &str) -> String {
    let current = p.sort.as_deref().unwrap_or("price");
    let desc = current == key && !p.desc;
    let mut url = url_query(&[("q", &p.q), ("sort", key)]);
    if desc {
        url.push_str("&desc=true");
    }
    format!("/console/market?{url}")
}

fn url_query(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes a query value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn market(p: &MarketParams, hits: Result<Vec<OfferHit>, ApiError>, csrf: &str) -> Page {
    let sort = p.sort.as_deref().unwrap_or("price");
    let hits = hits.map(|mut hits| {
        sort_hits(&mut hits, sort, p.desc);
        hits
    });
    let body = html! {
        form #query-form method="get" action="/console/market" {
            label for="q" { "Query " }
            input #q type="text" name="q" value=(p.q) placeholder="gpu=h100 vram>=80 region=eu price<=3";
            @if let Some(sort) = &p.sort { input type="hidden" name="sort" value=(sort); }
            button #search type="submit" { "Search" }
            " " a href="/console/market" { "clear" }
        }
        @match hits {
            Err(e) => p.error #query-error { (e.to_string()) },
            Ok(hits) => {
                section #depth {
                    h2 { "Depth and prices by model" }
                    (depth_table(&hits))
                    (chart::prices(&hits))
                }
                h2 { "Offers " span.small #offer-count { "(" (hits.len()) ")" } }
                table #offers {
                    thead { tr {
                        th { "Host" }
                        @for (key, name) in SORTS {
                            th { a id={ "sort-" (key) } href=(sort_link(p, key)) {
                                (name)
                                @if key == sort { @if p.desc { " ▼" } @else { " ▲" } }
                            } }
                        }
                        th { "Spot floor" } th { "Tier" } th { "Cancel fees" }
                        th { "CPU per GPU (cores)" } th { "RAM per GPU (GB)" }
                        th { "Workspace (GB)" } th { "Network down/up (Mbit/s)" } th {}
                    } }
                    tbody {
                        @for h in &hits {
                            tr.offer data-price=(h.price_per_gpu_hour.0) data-free=(h.free) data-family=(h.family) {
                                td { code { (short(&h.host.peer_id().to_string())) } }
                                td { (chart::model(h)) }
                                td.num { (h.free) "/" (h.gpus) }
                                td.num { (credits(h.price_per_gpu_hour.0)) }
                                td { (h.region) }
                                td.num { (format!("{:.1}", f64::from(h.reliability_permille) / 10.0)) }
                                td { (utc(h.expires_at.0)) }
                                td.num { @match h.spot_floor_per_gpu_hour { Some(f) => (credits(f.0)), None => "—" } }
                                td { (kebab(&h.tier)) }
                                td { (h.cancel_fees.as_deref().unwrap_or("free")) }
                                td.num.cpu title=(h.machine.cpu_model) {
                                    (format!("{:.1}", f64::from(h.machine.share.cpu_millis) / 1000.0))
                                }
                                td.num.ram { (h.machine.share.memory_bytes / 1_000_000_000) }
                                td.num { (h.disk_bytes / 1_000_000_000) }
                                td.num { (mbps(h.machine.net_down_mbps)) "/" (mbps(h.machine.net_up_mbps)) }
                                td { a.rent href={ "/console/rent?" (url_query(&[
                                    ("q", &format!("host={} gpu={}", h.host.peer_id(), h.family)),
                                    ("max_price", &credits(h.price_per_gpu_hour.0)),
                                ])) } { "Rent" } }
                            }
                        }
                    }
                }
            }
        }
    };
    layout("Market", Some(csrf), body)
}

fn depth_table(hits: &[OfferHit]) -> Markup {
    html! {
        table #depth-table {
            thead { tr {
                th { "Model" } th { "Offers" } th { "GPUs" } th { "Free GPUs" }
                th { "Lowest (credits/GPU-h)" } th { "Median" } th { "Highest" }
            } }
            tbody {
                @for (name, d) in chart::depth(hits) {
                    tr {
                        td { (name) }
                        td.num { (d.offers) }
                        td.num { (d.gpus) }
                        td.num { (d.free) }
                        td.num { (credits(d.prices.first().copied().unwrap_or(0))) }
                        td.num { (credits(d.prices.get(d.prices.len() / 2).copied().unwrap_or(0))) }
                        td.num { (credits(d.prices.last().copied().unwrap_or(0))) }
                    }
                }
            }
        }
    }
}

pub(crate) fn lease(r: &Receipts, logs: &str, csrf: &str) -> Page {
    let l = &r.lease;
    let over = l.settled || l.end.is_some();
    let metered = r.receipts.last().map_or(0, |x| x.gpu_seconds);
    let tail: Vec<&str> = logs.lines().rev().take(64).collect();
    let body = html! {
        dl.facts {
            dt { "Lease" } dd { code { (l.lease) } }
            dt { "Role" } dd { (kebab(&l.role)) }
            dt { "Kind" } dd { (l.kind) }
            dt { "State" } dd #lease-phase { (l.phase) }
            dt { "Ended by" } dd #lease-end { (l.end.as_deref().unwrap_or("—")) }
            dt { "Host" } dd { code { (l.host) } }
            dt { "Renter" } dd { code { (l.renter) } }
            dt { "GPUs" } dd { @for g in &l.gpus { code { (g) } " " } }
            dt { "Image" } dd { code { (l.image) } }
            dt { "Price" } dd { (credits(l.price_per_gpu_hour_micro)) " credits/GPU-h" }
            dt { "Duration" } dd { (span(u64::from(l.duration_s) * 1000)) }
            dt { "Runtime" } dd { (runtime(l)) }
            dt { "Metered" } dd { (metered) " GPU-seconds" }
            dt { "Cost so far" } dd #lease-cost { (credits(l.acked_amount)) " credits (acknowledged)" }
            dt { "Settled" } dd { @if l.settled { "yes" } @else { "no" } }
        }
        @if l.role == Role::Renter && !over {
            form #stop-form method="post" action={ "/console/leases/" (l.lease) "/stop" } {
                input type="hidden" name="csrf" value=(csrf);
                button #stop type="submit" { "Stop this lease" }
                span.small { " The host stops the container, bills the time used and returns the rest." }
            }
        }
        (super::rent::connect(l))
        h2 { "Output " span.small { "(last 64 lines)" } }
        pre #logs { @for line in tail.iter().rev() { (line) "\n" } }
        h2 { "Receipts " a #csv href={ "/console/leases/" (l.lease) "/receipts.csv" } { "CSV" } }
        table #receipts {
            thead { tr {
                th { "Seq" } th { "Signed (UTC)" } th { "GPU-seconds" } th { "Due (credits)" }
                th { "GPU utilisation (%)" } th { "GPU memory peak (MiB)" } th { "Acknowledged" }
            } }
            tbody {
                @for x in &r.receipts {
                    tr {
                        td.num { (x.seq) }
                        td { (utc(x.created_at)) }
                        td.num { (x.gpu_seconds) }
                        td.num { (credits(x.amount_due_micro)) }
                        td.num { (format!("{:.1}", f64::from(x.gpu_util_permille) / 10.0)) }
                        td.num { (x.gpu_memory_peak_bytes / 1_048_576) }
                        td { @if x.acked { "yes" } @else { "no" } }
                    }
                }
            }
        }
    };
    layout(&format!("Lease {}", short(&l.lease)), Some(csrf), body)
}

/// A lease's receipts as CSV (RFC 4180; every field is a number, a time or a word).
pub(crate) fn receipts_csv(r: &Receipts) -> String {
    let mut out = String::from(
        "lease,seq,signed_utc,gpu_seconds,amount_due_credits,workspace_charge_credits,\
         gpu_util_percent,gpu_memory_peak_bytes,memory_peak_bytes,cpu_millicores_avg,acked\r\n",
    );
    for x in &r.receipts {
        out.push_str(&format!(
            "{},{},{},{},{},{},{:.1},{},{},{},{}\r\n",
            r.lease.lease,
            x.seq,
            utc(x.created_at),
            x.gpu_seconds,
            credits(x.amount_due_micro),
            credits(x.workspace_charge_micro),
            f64::from(x.gpu_util_permille) / 10.0,
            x.gpu_memory_peak_bytes,
            x.memory_peak_bytes,
            x.cpu_millis_avg,
            x.acked
        ));
    }
    out
}

pub(crate) fn estimate(
    p: &EstimateParams,
    result: Option<Result<gpux_market::estimate::Estimate, String>>,
    csrf: &str,
) -> Page {
    let body = html! {
        form #estimate-form method="get" action="/console/estimate" {
            label { "GPU model " input #gpu type="text" name="gpu" value=(p.gpu.as_deref().unwrap_or("")) placeholder="h100"; }
            label { " GPUs " input #gpus type="number" min="1" name="gpus" value=(p.gpus.unwrap_or(1)); }
            label { " hours a month " input #hours type="number" min="1" max="744" step="any" name="hours" value=(p.hours.unwrap_or(200.0)); }
            " " button #estimate type="submit" { "Estimate" }
        }
        @match result {
            None => p.small { "Renting on-demand, spot or reserved from the live book against buying and running the GPUs (docs/estimate.md)." },
            Some(Err(e)) => p.error #estimate-error { (e) },
            Some(Ok(e)) => {
                p { (e.gpus) " × " (e.gpu) ", " (e.hours_per_month) " hours a month; the book has "
                    (e.market.offers) " offers with " (e.market.free_gpus) " free GPUs (credits counted as dollars)."
                    @if e.market.outliers > 0 { " " (e.market.outliers) " offers priced over 10× from the median are left out." } }
                (chart::estimate(&e))
                table #estimate-table {
                    thead { tr { th { "" } th { "Per GPU-hour" } th { "Per month" } } }
                    tbody {
                        tr { td { "on-demand" } td.num { (format!("{:.4}", e.on_demand.per_gpu_hour)) } td.num { (format!("{:.2}", e.on_demand.monthly)) } }
                        @if let Some(s) = &e.spot {
                            tr { td { "spot (floor)" } td.num { (format!("{:.4}", s.per_gpu_hour)) } td.num { (format!("{:.2}", s.monthly)) } }
                        }
                        tr { td { "reserved" } td.num { (format!("{:.4}", e.reserved.per_gpu_hour)) } td.num { (format!("{:.2}", e.reserved.monthly)) } }
                        tr { td { "buy and run" } td.num { (format!("{:.4}", e.buy.per_gpu_hour)) } td.num { (format!("{:.2}", e.buy.monthly)) } }
                    }
                }
                p #break-even { @match e.break_even_hours_per_month {
                    Some(h) if h <= 744.0 => { "Buying costs less than renting on-demand above " (format!("{h:.0}")) " hours a month." }
                    _ => { "Renting on-demand costs less than buying at any use." }
                } }
            }
        }
    };
    layout("Estimate", Some(csrf), body)
}
