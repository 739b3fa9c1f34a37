//! `/metrics` with real processes: a host exports its fake GPU under DCGM's names and labels
//! (read through the real NVML path, the lease that holds it named while it runs), every
//! node exports gpux's own series, and `promtool check metrics` parses all of it with lint
//! findings only from the documented allow-list (DCGM's own names).

use super::market::{Market, Node, wait_for};

fn scrape(node: &Node) -> String {
    let addr = gpux_node::metrics::read_addr(&node.dir).expect("the node's metrics address");
    assert!(
        addr.ip().is_loopback(),
        "{addr}: /metrics on loopback by default"
    );
    ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .expect("scraping /metrics")
        .body_mut()
        .read_to_string()
        .unwrap()
}

/// The value of the first sample whose line starts with `prefix`.
fn value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `promtool check metrics`: the parse must succeed, and every lint finding must be about
/// DCGM's own names (the allow-list in docs/metrics.md). Returns the findings.
fn promtool(text: &str) -> Vec<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !report.contains("error while linting") && !report.contains("parse error"),
        "{report}\n{text}"
    );
    let findings: Vec<String> = report
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    for f in &findings {
        assert!(
            f.starts_with("DCGM_"),
            "a lint finding outside the allow-list: {f}\n{report}"
        );
    }
    findings
}

#[test]
fn every_node_exports_dcgm_and_gpux_series_that_promtool_parses() {
    let market = Market::start(1, 1, 10);
    let (host, renter) = (&market.hosts[0], &market.renters[0]);
    let text = scrape(host);
    for name in gpux_node::metrics::dcgm_names() {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        for label in [
            "gpu=\"0\"",
            "UUID=\"GPU-",
            "modelName=\"NVIDIA L4\"",
            "Hostname=\"",
            "lease=\"\"",
        ] {
            assert!(line.contains(label), "{label} not in {line}");
        }
    }
    assert!(value(&text, "gpux_book_offers{family=\"l4\"}").is_some_and(|n| n >= 1.0));
    assert!(value(&text, "gpux_peers ").is_some_and(|n| n >= 1.0));
    promtool(&text);

    // A lease holds the GPU: its series name it; receipts are counted.
    let lease = market.rent(renter, 30, "echo metered; sleep 25");
    wait_for("the GPU's series to name its lease", 20, || {
        scrape(host).lines().any(|l| {
            l.starts_with("DCGM_FI_DEV_GPU_UTIL{") && l.contains(&format!("lease=\"{lease}\""))
        })
    });
    wait_for("a receipt sent and acknowledged", 30, || {
        value(&scrape(host), "gpux_receipts_total{event=\"acked\"}").is_some_and(|n| n >= 1.0)
    });
    let text = scrape(host);
    assert!(
        value(
            &text,
            "gpux_leases{role=\"host\",state=\"running\",kind=\"on-demand\"}"
        ) == Some(1.0),
        "{text}"
    );
    // The energy counter grows between scrapes.
    let energy = |t: &str| value(t, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(energy(&scrape(host)) > energy(&text));
    promtool(&text);

    // The renter timed its rent; the ledger counted the lock it applied.
    let text = scrape(renter);
    assert_eq!(
        value(&text, "gpux_rent_to_running_seconds_count"),
        Some(1.0)
    );
    assert!(
        value(
            &text,
            "gpux_leases{role=\"renter\",state=\"running\",kind=\"on-demand\"}"
        ) == Some(1.0),
        "{text}"
    );
    assert!(!text.contains("DCGM_"), "a renter shares no GPU");
    promtool(&text);
    let text = scrape(&market.ledger);
    assert!(
        value(
            &text,
            "gpux_ledger_operations_total{op=\"lock\",outcome=\"applied\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    promtool(&text);
}
