//! `/metrics` with real processes: a host exports its fake GPU under DCGM's names and labels
//! (read through the real NVML path, the lease that holds it named while it runs), every
//! node exports gpux's own series, and `promtool check metrics` parses all of it with lint
//! findings only from the documented allow-list (DCGM's own names). The shipped alert rules
//! pass `promtool check rules` and their unit tests (`promtool test rules`: the idle-GPU
//! alert fires after 30 minutes of low utilisation, not before), and every metric the rules
//! and the Grafana dashboard name is one a node exports. From another network namespace
//! (over a veth pair the test makes) neither `/metrics` nor the API is reachable.

use std::collections::BTreeSet;
use std::path::PathBuf;

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
    // Only dcgm-exporter's own camelCase label names (`modelName`), which dashboards written
    // for DCGM expect.
    for f in &findings {
        assert!(
            f.starts_with("DCGM_") && f.contains("camelCase"),
            "a lint finding outside the allow-list: {f}\n{report}"
        );
    }
    findings
}

/// The repository's `deploy/` directory.
fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The metric families a scrape declares (`# TYPE name ...`).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// gpux's and DCGM's metric names in a PromQL text (histogram series by their family).
fn names_in(promql: &str) -> BTreeSet<String> {
    promql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("DCGM_") || t.starts_with("gpux_"))
        .map(|t| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| t.strip_suffix(s).filter(|b| b.ends_with("_seconds")))
                .unwrap_or(t)
                .to_string()
        })
        .collect()
}

/// Every metric the shipped rules and dashboard name.
fn named_by_rules_and_dashboard() -> BTreeSet<String> {
    let rules = std::fs::read_to_string(deploy().join("prometheus/gpux-alerts.yml")).unwrap();
    let mut names = names_in(&rules);
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy().join("grafana/gpux-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            names.extend(names_in(target["expr"].as_str().expect("an expr")));
        }
    }
    names
}

/// A network namespace joined to this one by a veth pair (`10.213.N.1` here, `.2` there),
/// removed on drop.
struct OtherNamespace {
    name: String,
    link: String,
    here: String,
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl OtherNamespace {
    fn new() -> Self {
        let n = std::process::id() % 250 + 1;
        let (name, link) = (format!("gpuxm{n}"), format!("vgm{n}a"));
        let peer = format!("vgm{n}b");
        let (here, there) = (format!("10.213.{n}.1"), format!("10.213.{n}.2"));
        ip(&["netns", "add", &name]);
        let ns = Self {
            name: name.clone(),
            link: link.clone(),
            here: here.clone(),
        };
        ip(&["link", "add", &link, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &peer, "netns", &name]);
        ip(&["addr", "add", &format!("{here}/30"), "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        let cidr = format!("{there}/30");
        for args in [
            ["addr", "add", cidr.as_str(), "dev", peer.as_str()],
            ["link", "set", peer.as_str(), "up", ""],
            ["link", "set", "lo", "up", ""],
        ] {
            let mut full = vec!["netns", "exec", name.as_str(), "ip"];
            full.extend(args.iter().copied().filter(|a| !a.is_empty()));
            ip(&full);
        }
        ns
    }

    /// Whether a TCP connection from the other namespace to `host:port` succeeds.
    fn connects(&self, host: &str, port: u16) -> bool {
        std::process::Command::new("ip")
            .args(["netns", "exec", &self.name, "timeout", "5", "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{host}/{port}"))
            .status()
            .expect("ip netns exec")
            .success()
    }
}

impl Drop for OtherNamespace {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.link])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_the_idle_alert_fires_after_30_minutes() {
    for args in [
        vec!["check", "rules", "prometheus/gpux-alerts.yml"],
        vec!["test", "rules", "prometheus/gpux-alerts.test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(&args)
            .current_dir(deploy())
            .output()
            .expect("promtool (Debian's prometheus package; scripts/test installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
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
            "device=\"nvidia0\"",
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
    let energy = |t: &str| value(t, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total{").unwrap();
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
    let mut exported = families(&text);
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
    exported.extend(families(&text));
    exported.extend(families(&scrape(host)));

    // From another network namespace neither /metrics nor the API can be reached (they
    // listen on loopback), while a port listening on the shared link can: the check can
    // tell the two apart.
    let other = OtherNamespace::new();
    let control = std::net::TcpListener::bind((other.here.as_str(), 0)).unwrap();
    let control_port = control.local_addr().unwrap().port();
    assert!(
        other.connects(&other.here, control_port),
        "the control port"
    );
    let metrics = gpux_node::metrics::read_addr(&host.dir).unwrap().port();
    let api: std::net::SocketAddr = std::fs::read_to_string(host.dir.join("api.addr"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for port in [metrics, api.port()] {
        // (The web console is served on the API's port.)
        assert!(!other.connects(&other.here, port), "port {port} reached");
        assert!(!other.connects("127.0.0.1", port), "port {port} reached");
    }
    drop(other);

    // Whatever the alert rules and the dashboard read, some node exports.
    let named = named_by_rules_and_dashboard();
    assert!(named.len() >= 10, "{named:?}");
    let missing: Vec<_> = named.difference(&exported).collect();
    assert!(missing.is_empty(), "named but not exported: {missing:?}");
}
