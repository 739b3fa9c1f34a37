//! Renting against buying: what `n` GPUs of a model cost a month at `h` hours a month,
//! rented on-demand, spot or reserved from the live book, against buying and running them,
//! and the hours a month above which buying is cheaper (`gpux estimate`; docs/estimate.md).
//!
//! Pure: the book's offers and the purchase table come in, figures come out, each with the
//! inputs it was computed from. Credits are counted as US dollars here (the purchase table
//! is in dollars; a market that prices credits otherwise converts first).

use gpux_protocol::GpuFamily;

/// An offer priced more than this many times above or below the median offer's price is
/// an outlier, left out of an estimate.
pub const OUTLIER_FACTOR: f64 = 10.0;

/// What buying and running one GPU of a family costs (street prices, late 2026).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Ownership {
    /// The GPU's purchase price with its share of a server, dollars.
    pub purchase_usd: f64,
    /// Its board power under load, watts (the maker's TDP).
    pub power_w: f64,
}

/// Months a bought GPU is written off over.
pub const LIFETIME_MONTHS: f64 = 36.0;
/// Electricity, dollars per kWh.
pub const POWER_USD_PER_KWH: f64 = 0.15;
/// Power usage effectiveness: cooling and the rest of the server per watt of GPU.
pub const PUE: f64 = 1.5;

/// The purchase and power table (`None` for a family it does not price). Prices are one
/// GPU's street price plus a share of its server (a quarter to an eighth of an 8-GPU
/// node's other parts); see docs/estimate.md for the sources' kind and how to change them.
pub fn ownership(family: GpuFamily) -> Option<Ownership> {
    let (purchase_usd, power_w) = match family {
        GpuFamily::B200 => (45_000.0, 1000.0),
        GpuFamily::Gh200 => (40_000.0, 900.0),
        GpuFamily::H200 => (35_000.0, 700.0),
        GpuFamily::H100 | GpuFamily::H800 => (30_000.0, 700.0),
        GpuFamily::A100 | GpuFamily::A800 => (15_000.0, 400.0),
        GpuFamily::L40s => (10_000.0, 350.0),
        GpuFamily::L40 => (9_000.0, 300.0),
        GpuFamily::A40 => (6_500.0, 300.0),
        GpuFamily::A30 => (5_500.0, 165.0),
        GpuFamily::A10 => (3_500.0, 150.0),
        GpuFamily::L4 => (3_000.0, 72.0),
        GpuFamily::T4 => (1_500.0, 70.0),
        GpuFamily::V100 => (2_500.0, 300.0),
        GpuFamily::RtxA6000 => (5_000.0, 300.0),
        GpuFamily::Rtx6000Ada => (7_500.0, 300.0),
        GpuFamily::Rtx5090 => (2_500.0, 575.0),
        GpuFamily::Rtx4090 => (2_000.0, 450.0),
        GpuFamily::Rtx4080 => (1_200.0, 320.0),
        GpuFamily::Rtx3090 => (1_000.0, 350.0),
        GpuFamily::Rtx3080 => (700.0, 320.0),
        _ => return None,
    };
    Some(Ownership {
        purchase_usd,
        power_w,
    })
}

/// One offer of the family, as the book has it: its price per GPU-hour, its spot floor
/// (if it takes spot leases) and its free GPUs, all in credits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BookOffer {
    /// On-demand (and reserved) price per GPU-hour.
    pub price: f64,
    /// The least a spot lease pays per GPU-hour.
    pub spot_floor: Option<f64>,
    /// GPUs free now.
    pub free: u32,
}

/// A figure and what it was computed from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Figure {
    /// Dollars (credits) a month.
    pub monthly: f64,
    /// Per GPU-hour, for comparison.
    pub per_gpu_hour: f64,
    /// How: the formula in words, with its inputs named.
    pub how: String,
}

/// The market's prices for the family.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MarketPrices {
    /// Offers of the family in the book, and their free GPUs together (the depth).
    pub offers: usize,
    /// Offers left out of the figures: priced more than [`OUTLIER_FACTOR`] times above or
    /// below the median offer's price.
    pub outliers: usize,
    /// Free GPUs in the book (the outliers' not counted).
    pub free_gpus: u32,
    /// Percentiles of the on-demand price over the free GPUs (each GPU counted once).
    pub price_p10: f64,
    /// Median.
    pub price_p50: f64,
    /// 90th percentile.
    pub price_p90: f64,
    /// The mean price of the `n` cheapest free GPUs: what renting them all now costs.
    pub price_for_n: f64,
    /// Whether the book holds `n` free GPUs now (else `price_for_n` is over the ones there).
    pub depth_covers_n: bool,
    /// The median spot floor over the free GPUs of offers taking spot leases.
    pub spot_floor_p50: Option<f64>,
}

/// The whole estimate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Estimate {
    /// The family key.
    pub gpu: String,
    /// GPUs.
    pub gpus: u32,
    /// Hours a month they are used.
    pub hours_per_month: f64,
    /// What the book says.
    pub market: MarketPrices,
    /// Renting on-demand.
    pub on_demand: Figure,
    /// Renting spot (at the floor: it may be preempted).
    pub spot: Option<Figure>,
    /// Renting reserved windows.
    pub reserved: Figure,
    /// Buying and running them.
    pub buy: Figure,
    /// The purchase table's row.
    pub ownership: Ownership,
    /// Hours a month above which buying costs less than renting on-demand (`None`: never,
    /// the market's price is under the power cost alone).
    pub break_even_hours_per_month: Option<f64>,
}

/// Why there is no estimate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EstimateError {
    /// The table does not price the family.
    #[error("no purchase price is known for {0} GPUs (docs/estimate.md lists the table)")]
    Unpriced(String),
    /// Nobody offers the family now.
    #[error("the book holds no free {0} GPU now: nothing to compare with")]
    NoOffers(String),
    /// Bad arguments.
    #[error("{0}")]
    Invalid(&'static str),
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The estimate for `n` GPUs of `family` used `hours` a month, from `offers` (the book's
/// offers of that family).
pub fn estimate(
    family: GpuFamily,
    n: u32,
    hours: f64,
    offers: &[BookOffer],
) -> Result<Estimate, EstimateError> {
    if n == 0 {
        return Err(EstimateError::Invalid("--gpus must be at least 1"));
    }
    if !(hours > 0.0 && hours <= 744.0) {
        return Err(EstimateError::Invalid(
            "--hours-per-month must be above 0 and at most 744 (a 31-day month)",
        ));
    }
    let key = family.key().to_string();
    let own = ownership(family).ok_or_else(|| EstimateError::Unpriced(key.clone()))?;
    // Offers priced far from the rest are left out: the median offer's price (each offer
    // counted once, however many GPUs it has) sets the range, so one host cannot move the
    // figures by pricing absurdly or listing many GPUs.
    let free: Vec<&BookOffer> = offers.iter().filter(|o| o.free > 0).collect();
    let mut by_offer: Vec<f64> = free.iter().map(|o| o.price).collect();
    by_offer.sort_by(f64::total_cmp);
    let Some(&typical) = by_offer.get(by_offer.len().saturating_sub(1) / 2) else {
        return Err(EstimateError::NoOffers(key));
    };
    let plausible =
        |price: f64| price >= typical / OUTLIER_FACTOR && price <= typical * OUTLIER_FACTOR;
    let kept: Vec<&BookOffer> = free.into_iter().filter(|o| plausible(o.price)).collect();
    // Each free GPU counted once, at its offer's price.
    let mut prices: Vec<f64> = kept
        .iter()
        .flat_map(|o| std::iter::repeat_n(o.price, o.free as usize))
        .collect();
    prices.sort_by(f64::total_cmp);
    let mut floors: Vec<f64> = kept
        .iter()
        .filter_map(|o| {
            o.spot_floor
                .map(|f| std::iter::repeat_n(f, o.free as usize))
        })
        .flatten()
        .collect();
    floors.sort_by(f64::total_cmp);
    let cheapest = &prices[..prices.len().min(n as usize)];
    let price_for_n = cheapest.iter().sum::<f64>() / cheapest.len() as f64;
    let market = MarketPrices {
        offers: offers.len(),
        outliers: offers.iter().filter(|o| o.free > 0).count() - kept.len(),
        free_gpus: prices.len() as u32,
        price_p10: percentile(&prices, 0.10),
        price_p50: percentile(&prices, 0.50),
        price_p90: percentile(&prices, 0.90),
        price_for_n,
        depth_covers_n: prices.len() >= n as usize,
        spot_floor_p50: (!floors.is_empty()).then(|| percentile(&floors, 0.50)),
    };
    let gpu_hours = f64::from(n) * hours;
    let rented = |price: f64, what: &str| Figure {
        monthly: price * gpu_hours,
        per_gpu_hour: price,
        how: format!("{price:.4} per GPU-hour ({what}) x {n} GPUs x {hours} hours a month"),
    };
    let on_demand = rented(
        price_for_n,
        &format!(
            "the mean price of the {} cheapest free {key} GPUs in the book",
            cheapest.len()
        ),
    );
    let reserved = rented(
        price_for_n,
        "reserved windows are booked at the offers' on-demand price; no discount in this market",
    );
    let spot = market.spot_floor_p50.map(|floor| {
        rented(
            floor,
            &format!("the median spot floor of the free {key} GPUs; preemptible"),
        )
    });
    let power_per_gpu_hour = own.power_w / 1000.0 * PUE * POWER_USD_PER_KWH;
    let write_off = own.purchase_usd / LIFETIME_MONTHS;
    let buy_monthly = f64::from(n) * write_off + power_per_gpu_hour * gpu_hours;
    let buy = Figure {
        monthly: buy_monthly,
        per_gpu_hour: buy_monthly / gpu_hours,
        how: format!(
            "{n} GPUs x ({:.0} purchase / {LIFETIME_MONTHS} months) + {} W x PUE {PUE} x {POWER_USD_PER_KWH} per kWh x {n} GPUs x {hours} hours a month",
            own.purchase_usd, own.power_w
        ),
    };
    // Renting costs price x n x h; owning n x write-off + power x n x h.
    let margin = price_for_n - power_per_gpu_hour;
    let break_even_hours_per_month = (margin > 0.0).then(|| write_off / margin);
    Ok(Estimate {
        gpu: key,
        gpus: n,
        hours_per_month: hours,
        market,
        on_demand,
        spot,
        reserved,
        buy,
        ownership: own,
        break_even_hours_per_month,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(price: f64, free: u32, spot_floor: Option<f64>) -> BookOffer {
        BookOffer {
            price,
            spot_floor,
            free,
        }
    }

    #[test]
    fn renting_is_compared_with_buying_from_the_books_prices() {
        let book = [
            offer(2.0, 4, Some(0.8)),
            offer(2.5, 4, None),
            offer(4.0, 2, Some(1.5)),
        ];
        let e = estimate(GpuFamily::H100, 8, 300.0, &book).unwrap();
        // Ten free GPUs; the 8 cheapest: four at 2.0, four at 2.5.
        assert_eq!(e.market.free_gpus, 10);
        assert!(e.market.depth_covers_n);
        assert_eq!(e.market.price_for_n, 2.25);
        assert_eq!(
            (e.market.price_p10, e.market.price_p50, e.market.price_p90),
            (2.0, 2.5, 4.0)
        );
        assert_eq!(e.market.spot_floor_p50, Some(0.8));
        assert_eq!(e.on_demand.monthly, 2.25 * 8.0 * 300.0);
        assert_eq!(e.spot.as_ref().unwrap().monthly, 0.8 * 8.0 * 300.0);
        // 8 x 30,000 / 36 + 0.7 kW x 1.5 x 0.15 x 2,400 GPU-hours.
        let buy = 8.0 * 30_000.0 / 36.0 + 0.7 * 1.5 * 0.15 * 2400.0;
        assert!((e.buy.monthly - buy).abs() < 1e-6);
        // Break-even: 833.33 / (2.25 - 0.1575) hours a month; renting 300 h is cheaper.
        let even = e.break_even_hours_per_month.unwrap();
        assert!((even - 30_000.0 / 36.0 / (2.25 - 0.1575)).abs() < 1e-6);
        assert!(even > 300.0 && e.on_demand.monthly < e.buy.monthly);
        assert!(e.on_demand.how.contains("8 cheapest free h100 GPUs"));
    }

    #[test]
    fn one_absurd_offer_moves_no_figure() {
        let book = vec![
            offer(2.0, 4, Some(0.8)),
            offer(2.5, 4, None),
            offer(4.0, 2, Some(1.5)),
        ];
        let honest = estimate(GpuFamily::H100, 8, 300.0, &book).unwrap();
        // The protocol's highest price, with many GPUs and a high spot floor; and one at
        // a hundredth of the market.
        for outlier in [
            offer(10_000.0, 64, Some(9_000.0)),
            offer(0.01, 64, Some(0.01)),
        ] {
            let mut flooded = book.clone();
            flooded.push(outlier);
            let e = estimate(GpuFamily::H100, 8, 300.0, &flooded).unwrap();
            assert_eq!(e.market.outliers, 1);
            assert_eq!(
                (e.market, e.on_demand, e.spot, e.break_even_hours_per_month),
                (
                    MarketPrices {
                        offers: 4,
                        outliers: 1,
                        ..honest.market.clone()
                    },
                    honest.on_demand.clone(),
                    honest.spot.clone(),
                    honest.break_even_hours_per_month
                )
            );
        }
    }

    #[test]
    fn a_thin_book_says_so_and_bad_asks_are_refused() {
        let e = estimate(GpuFamily::L4, 4, 100.0, &[offer(0.5, 1, None)]).unwrap();
        assert!(!e.market.depth_covers_n);
        assert_eq!(e.spot, None);
        // Under the power cost nothing breaks even.
        let cheap = estimate(GpuFamily::H100, 1, 100.0, &[offer(0.1, 1, None)]).unwrap();
        assert_eq!(cheap.break_even_hours_per_month, None);
        assert!(matches!(
            estimate(GpuFamily::H100, 1, 100.0, &[offer(2.0, 0, None)]),
            Err(EstimateError::NoOffers(_))
        ));
        assert!(estimate(GpuFamily::H100, 0, 100.0, &[]).is_err());
        assert!(estimate(GpuFamily::H100, 1, 800.0, &[]).is_err());
        assert!(matches!(
            estimate(GpuFamily::Other, 1, 100.0, &[offer(1.0, 1, None)]),
            Err(EstimateError::Unpriced(_))
        ));
    }
}
