//! `gpux logs`, `gpux receipts`, `gpux stop`: what the node holds about one lease.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use gpux_client::ApiClient;

use super::{out, print_json};

/// Prints a lease's output; with `follow`, keeps polling until the lease has ended.
pub(crate) fn logs(dir: &Path, lease: &str, follow: bool, json: bool) -> anyhow::Result<()> {
    let client = ApiClient::for_data_dir(dir)?;
    let mut from = 0u64;
    let mut stdout = std::io::stdout().lock();
    loop {
        let page = client.logs(lease, from)?;
        if json {
            // One object per line (JSON Lines), so a follower reads each as it comes.
            serde_json::to_writer(&mut stdout, &page)?;
            stdout.write_all(b"\n")?;
        } else {
            stdout.write_all(page.text.as_bytes())?;
        }
        stdout.flush()?;
        from = page.next;
        if !follow || (page.ended && page.text.is_empty()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Prints a lease's receipts, acknowledged or not, and its settlement.
pub(crate) fn receipts(dir: &Path, lease: &str, json: bool) -> anyhow::Result<()> {
    let doc = ApiClient::for_data_dir(dir)?.receipts(lease)?;
    if json {
        return print_json(&doc);
    }
    out!(
        "{:>4}  {:>11}  {:>16}  {:>5}",
        "seq",
        "gpu-seconds",
        "due (credits)",
        "acked"
    )?;
    for r in &doc.receipts {
        out!(
            "{:>4}  {:>11}  {:>16}  {:>5}",
            r.seq,
            r.gpu_seconds,
            r.amount_due,
            if r.acked { "yes" } else { "no" }
        )?;
    }
    let l = &doc.lease;
    out!(
        "{}: {}; exit code: {}; acknowledged: {} micro-credits; settled: {}",
        l.phase,
        l.end.as_deref().unwrap_or("not ended"),
        l.exit_code.map_or("-".to_string(), |c| c.to_string()),
        l.acked_amount,
        l.settled
    )?;
    Ok(())
}

/// Asks the host to stop a lease this node rents.
pub(crate) fn commit(dir: &Path, lease: &str, json: bool) -> anyhow::Result<()> {
    let client = ApiClient::for_data_dir(dir)?;
    let committed = super::waiting("committing: the host starts the work", || {
        client.commit(lease)
    })?;
    if json {
        return super::print_json(&committed);
    }
    out!("lease {lease}: committed; the host starts the work now")?;
    Ok(())
}

pub(crate) fn challenge(dir: &Path, lease: &str, json: bool) -> anyhow::Result<()> {
    let client = ApiClient::for_data_dir(dir)?;
    let passed = super::waiting(
        "challenging the lease's GPUs (the host pauses the workload meanwhile)",
        || client.challenge(lease),
    )?;
    if json {
        return super::print_json(&passed);
    }
    out!(
        "lease {lease}: passed at {:.2} Gop/s ({:.0}% of the reference {:.2}; {} INT8 product, round trip {:.1} ms; {} rows checked, {:.0} KiB downloaded, {:.0} ms to check)",
        passed.achieved_gops,
        passed.achieved_gops / passed.reference_gops * 100.0,
        passed.reference_gops,
        passed.shape,
        passed.round_trip_ms,
        passed.rows_checked,
        passed.opened_bytes as f64 / 1024.0,
        passed.verify_ms
    )?;
    Ok(())
}

pub(crate) fn stop(dir: &Path, lease: &str, json: bool) -> anyhow::Result<()> {
    let stopping = ApiClient::for_data_dir(dir)?.stop(lease)?;
    if json {
        return print_json(&stopping);
    }
    out!("lease {lease}: the host is stopping it; `gpux receipts {lease}` shows the bill")?;
    Ok(())
}
