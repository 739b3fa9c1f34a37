//! `gpux estimate`: renting a model's GPUs against buying them, from the running node's
//! live book and the purchase table (`gpux_market::estimate`; docs/estimate.md).

use std::path::Path;

use gpux_client::ApiClient;
use gpux_market::estimate::{BookOffer, estimate};
use gpux_protocol::GpuFamily;

use super::{out, print_json};

/// The most offers read from the book for one estimate (the API's own limit).
const MAX_OFFERS: usize = 1000;

fn credits(micro: u64) -> f64 {
    micro as f64 / 1e6
}

/// Prints the estimate for `gpus` GPUs of `gpu` used `hours` a month.
pub(crate) fn run(dir: &Path, gpu: &str, gpus: u32, hours: f64, json: bool) -> anyhow::Result<()> {
    let family: GpuFamily = gpu
        .parse()
        .map_err(|e| anyhow::anyhow!("--gpu {gpu}: {e}"))?;
    let hits =
        ApiClient::for_data_dir(dir)?.offers(&format!("gpu={}", family.key()), MAX_OFFERS)?;
    let offers: Vec<BookOffer> = hits
        .iter()
        // Whole GPUs only: a MIG slice is a fraction of one.
        .filter(|h| h.mig_profile.is_none())
        .map(|h| BookOffer {
            price: credits(h.price_per_gpu_hour.0),
            spot_floor: h.spot_floor_per_gpu_hour.map(|f| credits(f.0)),
            free: u32::from(h.free),
        })
        .collect();
    let e = estimate(family, gpus, hours, &offers)?;
    if json {
        return print_json(&e);
    }
    let m = &e.market;
    out!(
        "{} x {} GPUs, {} hours a month (credits counted as dollars)\n\
         book: {} offers, {} free GPUs{}{}; price per GPU-hour p10 {:.2}, p50 {:.2}, p90 {:.2}\n",
        e.gpu,
        e.gpus,
        e.hours_per_month,
        m.offers,
        m.free_gpus,
        if m.depth_covers_n {
            ""
        } else {
            " (fewer than asked)"
        },
        match m.outliers {
            0 => String::new(),
            n => format!(" ({n} offers priced over 10x from the median left out)"),
        },
        m.price_p10,
        m.price_p50,
        m.price_p90
    )?;
    out!("{:<14} {:>14} {:>14}", "", "per GPU-hour", "per month")?;
    let mut rows = vec![("on-demand", &e.on_demand)];
    if let Some(spot) = &e.spot {
        rows.push(("spot (floor)", spot));
    }
    rows.push(("reserved", &e.reserved));
    rows.push(("buy and run", &e.buy));
    for (name, f) in rows {
        out!("{name:<14} {:>14.4} {:>14.2}", f.per_gpu_hour, f.monthly)?;
    }
    match e.break_even_hours_per_month {
        Some(h) if h <= 744.0 => {
            out!("\nbuying costs less than renting on-demand above {h:.0} hours a month")?
        }
        Some(_) | None => out!(
            "\nrenting on-demand costs less than buying at any use (under {} hours a month)",
            744
        )?,
    }
    Ok(())
}
