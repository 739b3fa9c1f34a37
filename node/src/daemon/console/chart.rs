//! The console's charts: SVG drawn on the server (no script, nothing fetched).

use std::collections::BTreeMap;

use gpux_api::OfferHit;
use maud::{Markup, html};

const WIDTH: f64 = 720.0;
/// Room for the labels on the left.
const LEFT: f64 = 190.0;
const ROW: f64 = 26.0;

fn x_of(value: f64, max: f64) -> f64 {
    LEFT + (WIDTH - LEFT - 20.0) * if max > 0.0 { value / max } else { 0.0 }
}

/// The price of every offer, one row per model: a dot per offer, a bar from the lowest to the
/// highest, a tick at the median (credits per GPU-hour).
pub(crate) fn prices(hits: &[OfferHit]) -> Markup {
    let depth = depth(hits);
    let max = depth
        .values()
        .filter_map(|d| d.prices.last())
        .max()
        .copied()
        .unwrap_or(0) as f64
        / 1e6;
    let height = ROW * depth.len() as f64 + 36.0;
    html! {
        figure {
            svg #price-chart xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(height)
                viewBox={ "0 0 " (WIDTH) " " (height) } role="img"
                aria-label="Price per GPU-hour of every offer, by model" {
                @for (row, (name, d)) in depth.iter().enumerate() {
                    @let y = ROW * row as f64 + 18.0;
                    @let lo = d.prices.first().copied().unwrap_or(0) as f64 / 1e6;
                    @let hi = d.prices.last().copied().unwrap_or(0) as f64 / 1e6;
                    @let median = d.prices.get(d.prices.len() / 2).copied().unwrap_or(0) as f64 / 1e6;
                    text x="4" y=(y + 4.0) class="label" { (name) }
                    line x1=(x_of(lo, max)) x2=(x_of(hi, max)) y1=(y) y2=(y) class="range" {}
                    line x1=(x_of(median, max)) x2=(x_of(median, max)) y1=(y - 8.0) y2=(y + 8.0) class="median" {}
                    @for price in &d.prices {
                        circle class="offer" cx=(x_of(*price as f64 / 1e6, max)) cy=(y) r="4" {
                            title { (format!("{:.4}", *price as f64 / 1e6)) " credits/GPU-h" }
                        }
                    }
                }
                @let axis = ROW * depth.len() as f64 + 10.0;
                line x1=(LEFT) x2=(WIDTH - 20.0) y1=(axis) y2=(axis) class="axis" {}
                text x=(LEFT) y=(axis + 16.0) class="tick" { "0" }
                text x=(WIDTH - 20.0) y=(axis + 16.0) class="tick" text-anchor="end" {
                    (format!("{max:.2}")) " credits/GPU-h"
                }
            }
            figcaption { "Price per GPU-hour of each offer by model: the bar spans lowest to highest, the tick is the median." }
        }
    }
}

/// A GPU's utilisation over the last hour (0-100 %, newest on the right).
pub(crate) fn utilisation(samples: &[(u64, u32)], now_ms: u64) -> Markup {
    const W: f64 = 180.0;
    const H: f64 = 30.0;
    let hour = 3_600_000.0;
    let points: Vec<String> = samples
        .iter()
        .map(|(at, util)| {
            let age = now_ms.saturating_sub(*at) as f64;
            let x = (W * (1.0 - age / hour)).clamp(0.0, W);
            let y = H - 2.0 - (H - 4.0) * f64::from(*util) / 100.0;
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let last = samples
        .last()
        .map_or(String::new(), |(_, u)| format!("{u}% now"));
    html! {
        svg.util xmlns="http://www.w3.org/2000/svg" width=(W) height=(H)
            viewBox={ "0 0 " (W) " " (H) } role="img"
            aria-label={ "utilisation over the last hour, " (samples.len()) " samples" }
            data-samples=(samples.len()) {
            line x1="0" x2=(W) y1=(H - 2.0) y2=(H - 2.0) class="axis" {}
            @if points.len() == 1 {
                @let (x, y) = points[0].split_once(',').unwrap_or(("0", "0"));
                circle class="offer" cx=(x) cy=(y) r="2" {}
            } @else {
                polyline class="util" points=(points.join(" ")) {}
            }
            title { (last) }
        }
    }
}

/// The estimate's monthly costs side by side.
pub(crate) fn estimate(e: &gpux_market::estimate::Estimate) -> Markup {
    let mut bars = vec![("on-demand", e.on_demand.monthly)];
    if let Some(spot) = &e.spot {
        bars.push(("spot (floor)", spot.monthly));
    }
    bars.push(("reserved", e.reserved.monthly));
    bars.push(("buy and run", e.buy.monthly));
    let max = bars.iter().map(|(_, v)| *v).fold(0.0, f64::max);
    let height = ROW * bars.len() as f64 + 10.0;
    html! {
        figure {
            svg #estimate-chart xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(height)
                viewBox={ "0 0 " (WIDTH) " " (height) } role="img" aria-label="Cost a month" {
                @for (row, (name, value)) in bars.iter().enumerate() {
                    @let y = ROW * row as f64 + 4.0;
                    text x="4" y=(y + 14.0) class="label" { (name) }
                    rect class={ "bar " @if *name == "buy and run" { "buy" } } x=(LEFT) y=(y)
                        width=(x_of(*value, max) - LEFT) height=(ROW - 8.0) {}
                    text x=(x_of(*value, max) + 4.0) y=(y + 14.0) class="value" { (format!("{value:.2}")) }
                }
            }
            figcaption { "Cost a month (credits), renting against buying." }
        }
    }
}

/// Per model: offers, GPUs, free GPUs and the prices of the free ones.
pub(crate) struct Depth {
    pub(crate) offers: usize,
    pub(crate) gpus: u64,
    pub(crate) free: u64,
    /// Each offer's price per GPU-hour, micro-credits (sorted).
    pub(crate) prices: Vec<u64>,
}

pub(crate) fn depth(hits: &[OfferHit]) -> BTreeMap<String, Depth> {
    let mut by_model: BTreeMap<String, Depth> = BTreeMap::new();
    for h in hits {
        let d = by_model.entry(model(h)).or_insert(Depth {
            offers: 0,
            gpus: 0,
            free: 0,
            prices: Vec::new(),
        });
        d.offers += 1;
        d.gpus += u64::from(h.gpus);
        d.free += u64::from(h.free);
        d.prices.push(h.price_per_gpu_hour.0);
    }
    for d in by_model.values_mut() {
        d.prices.sort_unstable();
    }
    by_model
}

/// An offer's model as the console names it: family, memory and MIG profile.
pub(crate) fn model(hit: &OfferHit) -> String {
    match &hit.mig_profile {
        Some(p) => format!("{} {}GB MIG {p}", hit.family, hit.vram_gb),
        None => format!("{} {}GB", hit.family, hit.vram_gb),
    }
}
