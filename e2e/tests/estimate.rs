//! `gpux estimate` against a live book: two H100 hosts at 3.60 credits per GPU-hour (spot
//! from 1.00) answer for eight GPUs at 300 hours a month, each figure with its inputs.

use super::market::{Market, wait_for};

#[test]
fn the_estimate_answers_from_the_live_book_with_each_figures_inputs() {
    let mut market = Market::start(0, 1, 10);
    for _ in 0..2 {
        market.add_host_of("NVIDIA H100 80GB HBM3", 85_899_345_920, (9, 0));
    }
    let renter = &market.renters[0];
    wait_for("both H100 offers in the book", 30, || {
        renter
            .api()
            .offers("gpu=h100", 10)
            .is_ok_and(|hits| hits.len() == 2)
    });
    let out = renter.gpux(&[
        "estimate",
        "--gpu",
        "h100",
        "--gpus",
        "8",
        "--hours-per-month",
        "300",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let num = |v: &serde_json::Value| v.as_f64().unwrap();
    // From the book: two offers, two free GPUs (fewer than the eight asked).
    assert_eq!(e["market"]["offers"], 2, "{e}");
    assert_eq!(e["market"]["free_gpus"], 2);
    assert_eq!(e["market"]["depth_covers_n"], false);
    assert_eq!(num(&e["market"]["price_for_n"]), 3.6);
    assert_eq!(num(&e["market"]["spot_floor_p50"]), 1.0);
    assert!((num(&e["on_demand"]["monthly"]) - 3.6 * 8.0 * 300.0).abs() < 1e-6);
    assert!((num(&e["spot"]["monthly"]) - 1.0 * 8.0 * 300.0).abs() < 1e-6);
    // Buying: the table's 30,000 over 36 months and 700 W at PUE 1.5 and 0.15 per kWh.
    let buy = 8.0 * 30_000.0 / 36.0 + 0.7 * 1.5 * 0.15 * 2400.0;
    assert!((num(&e["buy"]["monthly"]) - buy).abs() < 1e-6, "{e}");
    let even = num(&e["break_even_hours_per_month"]);
    assert!((even - 30_000.0 / 36.0 / (3.6 - 0.1575)).abs() < 1e-6);
    // Every figure names how it was computed.
    for figure in ["on_demand", "spot", "reserved", "buy"] {
        let how = e[figure]["how"].as_str().unwrap();
        assert!(
            how.contains("8 GPUs") && how.contains("300 hours"),
            "{figure}: {how}"
        );
    }
    assert!(e["on_demand"]["how"].as_str().unwrap().contains("book"));

    // The human form: a table with units, and the break-even.
    let out = renter.gpux(&[
        "estimate",
        "--gpu",
        "h100",
        "--gpus",
        "8",
        "--hours-per-month",
        "300",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "per GPU-hour",
        "per month",
        "on-demand",
        "buy and run",
        "fewer than asked",
    ] {
        assert!(text.contains(want), "{want} not in\n{text}");
    }
    assert!(
        text.contains("buying costs less than renting on-demand above 242 hours a month"),
        "{text}"
    );

    // A model nobody offers: a clear refusal.
    let out = renter.gpux(&["estimate", "--gpu", "a100", "--hours-per-month", "300"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no free a100 GPU"), "{err}");
}
