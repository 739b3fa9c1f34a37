//! Images from a registry, pulled by the host before the lease: a private registry (TLS and
//! basic auth: Debian's docker-registry, never a mock) whose credentials reach the host
//! alone and land in no file or log of either node; a wrong password refused with the
//! registry named and nothing charged; a public image cached by the host, listed in its
//! offers, and warm for the next renter.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use gpux_testnet::registry::Registry;

use super::market::{Market, wait_for};

const USER: &str = "team";
/// A password no log or file of a node may hold.
const PASSWORD: &str = "pw-8d1f0c7e55a94b1e";

/// An image of the workload image plus a file saying `marker`; its id.
fn image_saying(base: &str, marker: &str) -> String {
    let dockerfile = format!(
        "FROM {base}\nUSER 0\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"echo {marker} > /hello.txt\"]\nUSER 65534:65534\n"
    );
    let mut child = Command::new("docker")
        .args(["build", "-q", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the docker CLI");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(dockerfile.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "docker build: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file()
                && std::fs::read(&path)
                    .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[test]
fn a_host_pulls_private_and_public_images_before_the_lease_and_keeps_only_the_public_ones() {
    // One host of three GPUs: three leases at once.
    let market = Market::start_with(1, 3, 2, 30);
    let (renter, stranger, host) = (&market.renters[0], &market.renters[1], &market.hosts[0]);
    let scratch = tempfile::tempdir().unwrap();
    let private = Registry::start(&scratch.path().join("private"), Some((USER, PASSWORD)))
        .expect("the private registry");
    let public = Registry::start(&scratch.path().join("public"), None).expect("the public one");
    let train = image_saying(&market.image, "from-the-private-registry");
    let train_ref = private.push(&train, "team/train:1").unwrap();
    let tool = image_saying(&market.image, "from-the-public-registry");
    let tool_ref = public.push(&tool, "tools/tool:1").unwrap();
    // Neither is in the renters' Docker any more (it is the host's Docker too, here): the
    // host must pull them.
    for id in [&train, &tool] {
        let _ = Command::new("docker").args(["rmi", "-f", id]).output();
    }
    let rent = |who: &super::market::Node, image: &str, password: Option<&str>| {
        let mut command = who.gpux_command(&[
            "rent",
            "gpu=l4",
            "--max-price",
            "5",
            "--duration",
            "120",
            "--image",
            image,
            "--json",
        ]);
        if let Some(password) = password {
            command
                .args(["--registry-user", USER])
                .env("GPUX_REGISTRY_PASSWORD", password);
        }
        command.args(["--", "sleep", "120"]).output().unwrap()
    };
    let before = market.balance(renter);

    // A wrong password: refused, naming the registry; no lease, nothing charged.
    let out = rent(renter, &train_ref, Some("not-the-password"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&private.addr), "{stderr}");
    assert!(stderr.contains("nothing was charged"), "{stderr}");
    // No credentials at all (a stranger to the registry): refused too.
    let out = rent(stranger, &train_ref, None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&private.addr),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(renter.leases().is_empty() && stranger.leases().is_empty());
    assert_eq!(market.balance(renter), before);

    // The right one: pulled, then run.
    let out = rent(renter, &train_ref, Some(PASSWORD));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rented: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    let pulled = rented.pulled.expect("pulled by the host");
    assert_eq!(pulled.reference, train_ref);
    assert!(!pulled.warm && pulled.bytes > 0);
    assert_eq!(rented.image, train);
    let said = renter.gpux(&["exec", &rented.lease, "--", "cat", "/hello.txt"]);
    assert_eq!(
        String::from_utf8_lossy(&said.stdout),
        "from-the-private-registry\n"
    );

    // The public image: pulled and cached, and the offer lists it for later renters. (The
    // stranger waits until its book shows the leased GPU taken: a request for it would be
    // refused, and this test is not about that.)
    let free = |who: &super::market::Node, n: u16| {
        let out = who.gpux(&["offers", "search", "", "--json"]);
        let hits: Vec<gpux_api::OfferHit> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        hits.first().is_some_and(|h| h.free == n)
    };
    wait_for("the stranger's book to show one GPU leased", 30, || {
        free(stranger, 2)
    });
    let out = rent(stranger, &tool_ref, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!first.pulled.unwrap().warm);
    let pattern = format!("image={}/tools/*", public.addr);
    wait_for("the host's offer to list the cached image", 30, || {
        let out = renter.gpux(&["offers", "search", &pattern, "--json"]);
        let hits: Vec<gpux_api::OfferHit> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        hits.iter()
            .any(|h| h.pulls.cached.iter().any(|c| c.as_str() == tool_ref))
    });
    // The private image is never listed: it is its renter's alone.
    let out = renter.gpux(&["offers", "search", "", "--json"]);
    let hits: Vec<gpux_api::OfferHit> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        hits.iter()
            .all(|h| !h.pulls.cached.iter().any(|c| c.contains("team/train"))),
        "{hits:?}"
    );
    for lease in [&rented.lease, &first.lease] {
        assert!(
            renter_or(renter, stranger, lease)
                .gpux(&["stop", lease])
                .status
                .success()
        );
    }
    // The next renter of the public image starts warm.
    wait_for("the renter's book to show every GPU free", 30, || {
        free(renter, 3)
    });
    let out = rent(renter, &tool_ref, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    assert!(again.pulled.unwrap().warm);
    assert!(renter.gpux(&["stop", &again.lease]).status.success());

    // The password is in no file of either node: stores, records, logs.
    for dir in [&renter.dir, &stranger.dir, &host.dir] {
        let found = files_holding(dir, PASSWORD.as_bytes());
        assert!(found.is_empty(), "the registry password is in {found:?}");
    }
    market.assert_conserved();
}

fn renter_or<'a>(
    a: &'a super::market::Node,
    b: &'a super::market::Node,
    lease: &str,
) -> &'a super::market::Node {
    if a.leases().iter().any(|l| l.lease == lease) {
        a
    } else {
        b
    }
}
