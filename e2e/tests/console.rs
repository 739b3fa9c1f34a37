//! The web console in a real browser: Debian's chromium, headless, driven over WebDriver
//! (chromedriver) by fantoccini, against real nodes. A one-time link from `gpux console`
//! signs the browser in (and cannot be used twice); the market page filters by a query and
//! sorts; a lease rented from the command line appears on the overview by itself (live
//! updates, no reload); the lease's page stops it. Without a session the console answers
//! 401; a foreign `Host` or `Origin`, or a stop without the anti-forgery token, is refused;
//! the receipts export as CSV; the spend cap refuses a rent beyond it; the rent form refuses
//! what `gpux rent` refuses, applies the spend cap, and rents (the lease runs the image and
//! command asked, and its page says how to connect). Screenshots of each
//! page are written to `target/console-screenshots/` (docs/testing.md).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

use super::market::{Market, Node, wait_for};

/// chromedriver on a free loopback port, stopped on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/test installs it)");
        let url = format!("http://127.0.0.1:{port}");
        wait_for("chromedriver to answer", 30, || {
            ureq::get(&format!("{url}/status")).call().is_ok()
        });
        Driver { child, url }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn api_addr(node: &Node) -> SocketAddr {
    std::fs::read_to_string(node.dir.join("api.addr"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// One HTTP/1.1 exchange with headers of the test's choosing (`Host` included): the
/// status and the whole answer.
fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        request.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shoot(browser: &Client, name: &str) {
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

/// The `data-*` attribute of every element `css` selects, read in one script (the live
/// updates replace rows: element by element, a row could go stale between two reads).
async fn attrs(browser: &Client, css: &str, attr: &str) -> Vec<String> {
    let values = browser
        .execute(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.getAttribute(arguments[1]) || '');",
            vec![serde_json::json!(css), serde_json::json!(attr)],
        )
        .await
        .unwrap();
    serde_json::from_value(values).unwrap()
}

/// How long a page may take to draw what a check expects of it (scripts run after the
/// load; on a loaded machine they run late). The wait ends as soon as it is there.
const SHOWN: u64 = 10;

/// Waits (without reloading) until `css` selects something.
async fn appears(browser: &Client, css: &str, secs: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if !browser
            .find_all(Locator::Css(css))
            .await
            .unwrap()
            .is_empty()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Clicks `css`, a link or a form's button, and waits until the page it leads to has
/// loaded: WebDriver's click may return before the navigation starts, and a check made
/// then would read the page left behind.
/// The `value` of the form field `css`.
async fn value(browser: &Client, css: &str) -> String {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap()
        .unwrap_or_default()
}

/// The text of the element `css`.
async fn text_of(browser: &Client, css: &str) -> String {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap()
}

async fn click_and_load(browser: &Client, css: &str) {
    browser
        .execute("window.gpuxLeft = true;", vec![])
        .await
        .unwrap();
    browser
        .find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(SHOWN);
    loop {
        let loaded = browser
            .execute(
                "return window.gpuxLeft === undefined && document.readyState === 'complete';",
                vec![],
            )
            .await
            .unwrap();
        if loaded == serde_json::json!(true) {
            return;
        }
        assert!(Instant::now() < deadline, "{css} led to no new page");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn the_console_signs_in_once_shows_the_market_and_live_leases_and_refuses_forgeries() {
    let mut market = Market::start(1, 1, 10);
    market.add_host_of("NVIDIA A100-SXM4-80GB", 85_899_345_920, (8, 0));
    let renter = &market.renters[0];
    wait_for("both hosts' offers at the renter", 30, || {
        renter.api().status().is_ok_and(|s| s.offers_in_book >= 2)
    });
    let addr = api_addr(renter);
    let host = addr.to_string();

    // No session: 401. A foreign Host (a re-pointed name): 403, session or not.
    let (status, _) = raw(addr, "GET", "/console/", &[("Host", &host)], "");
    assert_eq!(status, 401);
    let (status, _) = raw(
        addr,
        "GET",
        "/console/",
        &[("Host", &format!("attacker.example:{}", addr.port()))],
        "",
    );
    assert_eq!(status, 403);

    let out = renter.gpux(&["console", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let login: gpux_api::ConsoleLogin = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        login
            .url
            .starts_with(&format!("http://{host}/console/login?once=")),
        "{}",
        login.url
    );
    let login_path = login
        .url
        .trim_start_matches(&format!("http://{host}"))
        .to_string();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let driver = Driver::start();
    rt.block_on(async {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"]
            }),
        );
        let browser = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&driver.url)
            .await
            .expect("a headless chromium session");

        // The link signs in and lands on the overview; the cookie is HttpOnly and strict.
        browser.goto(&login.url).await.unwrap();
        assert_eq!(browser.current_url().await.unwrap().path(), "/console/");
        let balance = browser
            .find(Locator::Css("#balance"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(balance.contains("credits"), "{balance}");
        // Named by port: cookies are kept by host name, and each node has its own.
        let cookie_name = format!("gpux_console_{}", addr.port());
        let cookie = browser.get_named_cookie(&cookie_name).await.unwrap();
        assert_eq!(cookie.http_only(), Some(true));
        assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
        let session = format!("{cookie_name}={}", cookie.value());
        shoot(&browser, "overview").await;

        // The link is spent.
        let (status, _) = raw(addr, "GET", &login_path, &[("Host", &host)], "");
        assert_eq!(status, 401);

        // The market: every offer, then only the A100s for a query; depth and chart drawn.
        let all = renter.api().offers("", 100).unwrap();
        let a100 = renter.api().offers("gpu=a100", 100).unwrap();
        assert!(!a100.is_empty() && a100.len() < all.len(), "{all:?}");
        browser
            .goto(&format!("http://{host}/console/market"))
            .await
            .unwrap();
        assert_eq!(
            attrs(&browser, "tr.offer", "data-price").await.len(),
            all.len()
        );
        assert!(appears(&browser, "#price-chart circle.offer", SHOWN).await);
        // Each offer shows what of the host's machine goes with a GPU, the CPU model on it.
        let models = attrs(&browser, "td.cpu", "title").await;
        assert_eq!(models.len(), all.len());
        assert!(
            models
                .iter()
                .zip(&all)
                .all(|(m, h)| *m == h.machine.cpu_model.as_str()),
            "{models:?}"
        );
        let query = browser.find(Locator::Css("#q")).await.unwrap();
        query.send_keys("gpu=a100").await.unwrap();
        click_and_load(&browser, "#search").await;
        let families = attrs(&browser, "tr.offer", "data-family").await;
        assert_eq!(families.len(), a100.len(), "{families:?}");
        assert!(families.iter().all(|f| f == "a100"), "{families:?}");
        shoot(&browser, "market-query").await;
        // Sorting by price, then the other way.
        browser
            .goto(&format!("http://{host}/console/market"))
            .await
            .unwrap();
        for descending in [true, false] {
            click_and_load(&browser, "#sort-price").await;
            let prices: Vec<u64> = attrs(&browser, "tr.offer", "data-price")
                .await
                .iter()
                .map(|p| p.parse().unwrap())
                .collect();
            let mut sorted = prices.clone();
            sorted.sort_unstable();
            if descending {
                sorted.reverse();
            }
            assert_eq!(prices, sorted, "descending: {descending}");
        }
        shoot(&browser, "market-sorted").await;

        // A lease rented from the command line appears on the open overview by itself.
        browser
            .goto(&format!("http://{host}/console/"))
            .await
            .unwrap();
        let lease = market.rent(renter, 120, "echo console; sleep 110");
        assert!(
            appears(&browser, &format!("#lease-{lease}"), 20).await,
            "the lease never appeared on the overview"
        );
        let updates = browser
            .execute("return document.body.dataset.liveUpdates || '0';", vec![])
            .await
            .unwrap();
        assert_ne!(
            updates,
            serde_json::json!("0"),
            "it came without a live update"
        );
        shoot(&browser, "overview-live-lease").await;
        let spent = browser
            .find(Locator::Css("#spent"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(spent.contains("spent so far"), "{spent}");

        // Forgeries: another origin, or no anti-forgery token, stop nothing.
        let stop = format!("/console/leases/{lease}/stop");
        let (status, _) = raw(
            addr,
            "POST",
            &stop,
            &[
                ("Host", &host),
                ("Cookie", &session),
                ("Origin", "http://attacker.example"),
            ],
            "csrf=",
        );
        assert_eq!(status, 403);
        let (status, answer) = raw(
            addr,
            "POST",
            &stop,
            &[
                ("Host", &host),
                ("Cookie", &session),
                ("Origin", &format!("http://{host}")),
            ],
            "csrf=0000",
        );
        assert_eq!(status, 403, "{answer}");
        let (status, _) = raw(
            addr,
            "GET",
            "/console/",
            &[
                ("Host", &format!("attacker.example:{}", addr.port())),
                ("Cookie", &session),
            ],
            "",
        );
        assert_eq!(status, 403);
        assert_eq!(renter.lease(&lease).phase, "running");

        // Receipts, as CSV once the first came.
        wait_for("a receipt", 20, || {
            renter
                .api()
                .receipts(&lease)
                .is_ok_and(|r| !r.receipts.is_empty())
        });
        let (status, csv) = raw(
            addr,
            "GET",
            &format!("/console/leases/{lease}/receipts.csv"),
            &[("Host", &host), ("Cookie", &session)],
            "",
        );
        assert_eq!(status, 200);
        assert!(csv.contains("content-type: text/csv"), "{csv}");
        let body = csv.split("\r\n\r\n").nth(1).unwrap();
        let mut lines = body.lines();
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with("lease,seq,signed_utc,gpu_seconds")
        );
        let first = lines.next().expect("a receipt row");
        assert!(first.starts_with(&format!("{lease},1,")), "{first}");

        // The host's console: its GPUs read now, the lease holding one, what it earned;
        // no stop button on its renter's lease, and a stop posted anyway is refused.
        let hosting = &market.hosts[0];
        let out = hosting.gpux(&["console", "--json"]);
        let host_login: gpux_api::ConsoleLogin = serde_json::from_slice(&out.stdout).unwrap();
        browser.goto(&host_login.url).await.unwrap();
        let rows = browser
            .find_all(Locator::Css("#host-gpus tbody tr"))
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        let row = rows[0].text().await.unwrap();
        assert!(
            row.contains("NVIDIA L4") && row.contains(&lease[..12]),
            "{row}"
        );
        assert!(appears(&browser, "#earnings", SHOWN).await);
        // Utilisation over the last hour: sampled since the host started (every 15 s).
        let samples = attrs(&browser, "#host-gpus svg.util", "data-samples").await;
        assert_eq!(samples.len(), 1);
        assert!(samples[0].parse::<u32>().unwrap() >= 1, "{samples:?}");
        shoot(&browser, "host-overview").await;
        // The host's controls post what `gpux host set|pause|resume` post; its earnings are
        // charted per day over two weeks.
        let days = attrs(&browser, "#earnings-chart rect.bar", "data-day").await;
        assert_eq!(days.len(), 14, "{days:?}");
        let price = browser
            .find(Locator::Css("#set-price input[name=value]"))
            .await
            .unwrap();
        price.clear().await.unwrap();
        price.send_keys("3.10").await.unwrap();
        click_and_load(&browser, "#set-price button").await;
        let state = text_of(&browser, "#host-state").await;
        assert!(state.contains("offered at 3.10"), "{state}");
        let live = || hosting.api().settings().unwrap().host.unwrap();
        assert_eq!(live().price, "3.10");
        click_and_load(&browser, "#pause button").await;
        let state = text_of(&browser, "#host-state").await;
        assert!(state.starts_with("paused"), "{state}");
        assert!(live().paused);
        shoot(&browser, "host-paused").await;
        click_and_load(&browser, "#resume button").await;
        assert!(!live().paused && live().drain_until.is_none());
        let host_addr = api_addr(hosting);
        browser
            .goto(&format!("http://{host_addr}/console/leases/{lease}"))
            .await
            .unwrap();
        assert!(
            !appears(&browser, "#stop", 1).await,
            "a host may not stop its renter's lease"
        );
        let csrf = browser
            .find(Locator::Css("form.signout input[name=csrf]"))
            .await
            .unwrap()
            .attr("value")
            .await
            .unwrap()
            .unwrap();
        let host_cookie = browser
            .get_named_cookie(&format!("gpux_console_{}", host_addr.port()))
            .await
            .unwrap();
        let (status, answer) = raw(
            host_addr,
            "POST",
            &stop,
            &[
                ("Host", &host_addr.to_string()),
                (
                    "Cookie",
                    &format!("{}={}", host_cookie.name(), host_cookie.value()),
                ),
                ("Origin", &format!("http://{host_addr}")),
            ],
            &format!("csrf={csrf}"),
        );
        assert_eq!(status, 403, "{answer}");
        assert!(answer.contains("only leases this node rents"), "{answer}");
        assert_eq!(renter.lease(&lease).phase, "running");

        // The lease's page stops it.
        browser
            .goto(&format!("http://{host}/console/leases/{lease}"))
            .await
            .unwrap();
        shoot(&browser, "lease").await;
        browser
            .find(Locator::Css("#stop"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_for("the stop to end the lease", 30, || {
            renter.lease(&lease).end.as_deref() == Some("renter-stopped")
        });
        browser.refresh().await.unwrap();
        assert!(appears(&browser, "#receipts", SHOWN).await);
        assert!(
            !appears(&browser, "#stop", 1).await,
            "a stop button on an ended lease"
        );
        shoot(&browser, "lease-stopped").await;

        // The estimate page draws its chart from the live book.
        browser
            .goto(&format!(
                "http://{host}/console/estimate?gpu=a100&gpus=2&hours=300"
            ))
            .await
            .unwrap();
        assert!(appears(&browser, "#estimate-chart rect.bar", SHOWN).await);
        shoot(&browser, "estimate").await;

        // Renting from the console: an offer's link fills the form; what `gpux rent` refuses
        // the form refuses, keeping what was typed; the spend cap applies; then the lease
        // runs the image and command asked and its page says how to connect.
        browser
            .goto(&format!("http://{host}/console/market"))
            .await
            .unwrap();
        click_and_load(&browser, "tr.offer[data-family=a100] a.rent").await;
        assert_eq!(browser.current_url().await.unwrap().path(), "/console/rent");
        let q = value(&browser, "#q").await;
        assert!(q.contains("gpu=a100") && q.contains("host="), "{q}");
        let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNvbnNvbGUtdGVzdC1rZXktMDEyMzQ1Njc4OWFi console@test";
        for (field, text) in [
            ("#duration", "soon"),
            ("#image", market.image.as_str()),
            ("#command", "echo from-the-console; sleep 100"),
            ("#ssh_key", key),
        ] {
            let input = browser.find(Locator::Css(field)).await.unwrap();
            input.clear().await.unwrap();
            input.send_keys(text).await.unwrap();
        }
        click_and_load(&browser, "#rent").await;
        let error = text_of(&browser, "#rent-error").await;
        assert!(error.contains("--duration"), "{error}");
        assert_eq!(value(&browser, "#image").await, market.image);
        shoot(&browser, "rent-refused").await;
        let duration = browser.find(Locator::Css("#duration")).await.unwrap();
        duration.clear().await.unwrap();
        duration.send_keys("2m").await.unwrap();
        assert!(renter.gpux(&["config", "set", "spend-cap", "0.01"]).status.success());
        click_and_load(&browser, "#rent").await;
        let error = text_of(&browser, "#rent-error").await;
        assert!(error.contains("spend cap"), "{error}");
        assert!(renter.gpux(&["config", "set", "spend-cap", "off"]).status.success());
        click_and_load(&browser, "#rent").await;
        let path = browser.current_url().await.unwrap().path().to_string();
        let rented = path
            .strip_prefix("/console/leases/")
            .unwrap_or_else(|| panic!("the rent led to {path}"))
            .to_string();
        let view = renter.lease(&rented);
        assert_eq!(view.image, market.image);
        assert_eq!(view.ssh_keys, [key]);
        wait_for("the console's lease to run its command", 30, || {
            renter
                .api()
                .logs(&rented, 0)
                .is_ok_and(|p| p.text.contains("from-the-console"))
        });
        let ssh = text_of(&browser, "#connect-ssh").await;
        assert_eq!(ssh, format!("gpux ssh {rented}"));
        assert!(text_of(&browser, "#connect-forward").await.contains(&rented));
        shoot(&browser, "rented-from-the-console").await;
        assert!(renter.gpux(&["stop", &rented]).status.success());
        browser.close().await.unwrap();
    });

    // The spend cap refuses a rent beyond it, and shows on the console.
    let out = renter.gpux(&["config", "set", "spend-cap", "0.01"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = market.rent_output(
        renter,
        "gpu=l4",
        &["--max-price", "5", "--duration", "60"],
        "true",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spend cap"), "{err}");
    let settings = renter.api().settings().unwrap();
    assert_eq!(settings.spend_cap_micro, Some(10_000));
    let out = renter.gpux(&["config", "set", "spend-cap", "off"]);
    assert!(out.status.success());
    assert_eq!(renter.api().settings().unwrap().spend_cap_micro, None);
    let out = renter.gpux(&["config", "set", "spend-cap", "lots"]);
    assert!(!out.status.success());

    // The command line's conventions: the commands that answer something answer JSON with
    // --json, human tables name their units, and a wait draws no spinner when piped.
    for args in [
        &["status", "--json"][..],
        &["init", "--json"],
        &["config", "get", "--json"],
        &["leases", "--json"],
        &["balance", "--json"],
        &["block", &market.hosts[1].peer, "--json"],
        &["block", &market.hosts[1].peer, "--undo", "--json"],
    ] {
        let out = renter.gpux(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let _: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    }
    let status = String::from_utf8(renter.gpux(&["status"]).stdout).unwrap();
    assert!(
        status.contains("peer id") && status.contains(" offers"),
        "{status}"
    );
    let table = String::from_utf8(renter.gpux(&["leases"]).stdout).unwrap();
    assert!(
        table.contains("cr per GPU-h") && table.contains("acked (cr)"),
        "{table}"
    );
    let offers = String::from_utf8(renter.gpux(&["offers", "search", ""]).stdout).unwrap();
    assert!(
        offers.contains("vram GB") && offers.contains("cr per GPU-h"),
        "{offers}"
    );
    // (On the A100 host: the L4's offer may not be back yet after the stop above.) The
    // console's lease on it was stopped a moment ago: its host republishes its offer (paced),
    // so the renter may not hold it yet.
    wait_for("the A100 host's offer back at the renter", 30, || {
        renter
            .api()
            .offers("gpu=a100", 10)
            .is_ok_and(|o| !o.is_empty())
    });
    let out = market.rent_output(
        renter,
        "gpu=a100",
        &["--max-price", "5", "--duration", "60"],
        // Still running when it is stopped below.
        "sleep 50",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rented: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("renting:"),
        "a spinner drawn into a pipe"
    );
    let out = renter.gpux(&["stop", &rented.lease, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stopping: gpux_api::Stopping = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stopping.lease, rented.lease);
    let out = renter.gpux(&["logs", &rented.lease, "--json"]);
    let page: gpux_api::LogsPage =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert!(page.next <= 1, "{page:?}");
}
