//! `gpux logs` and `gpux receipts`: printing what the renter's node holds about a lease.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use gpux_node::api_client::ApiClient;

/// Prints a lease's output; with `follow`, keeps polling until the lease has ended.
pub(crate) fn logs(dir: &Path, lease: &str, follow: bool) -> anyhow::Result<ExitCode> {
    let client = ApiClient::for_data_dir(dir)?;
    let path = format!("/v1/leases/{lease}/logs");
    let mut from = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        let page = client.get(&path, &[("from", &from.to_string())])?;
        if let Some(text) = page["text"].as_str() {
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
        from = page["next"].as_u64().unwrap_or(from);
        let ended = page["ended"].as_bool().unwrap_or(true);
        if !follow || (ended && page["text"].as_str().is_none_or(str::is_empty)) {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Prints a lease's receipts, acknowledged or not, and its settlement.
pub(crate) fn receipts(dir: &Path, lease: &str, json: bool) -> anyhow::Result<ExitCode> {
    let client = ApiClient::for_data_dir(dir)?;
    let doc = client.get(&format!("/v1/leases/{lease}/receipts"), &[])?;
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>4}  {:>11}  {:>14}  {:>5}",
        "seq", "gpu-seconds", "amount due", "acked"
    );
    for r in doc["receipts"].as_array().into_iter().flatten() {
        println!(
            "{:>4}  {:>11}  {:>14}  {:>5}",
            r["seq"],
            r["gpu_seconds"],
            r["amount_due"].as_str().unwrap_or("?"),
            if r["acked"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
        );
    }
    let run = &doc["run"];
    if !run.is_null() {
        println!(
            "ended: {}; exit code: {}; acknowledged: {} micro-credits; settled: {}",
            run["end_reason"].as_str().unwrap_or("not yet"),
            run["exit_code"],
            run["acked_amount"],
            run["released"]
        );
    }
    Ok(ExitCode::SUCCESS)
}
