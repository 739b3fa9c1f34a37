//! Leases sized from the host's machine: a lease gets its GPUs' share of the CPU and memory
//! the host publishes (or less, when its renter asks), Docker enforces exactly that, and the
//! container's `/tmp`, `/scratch` and `HOME` are writable and run what is written there,
//! whatever the image ships at those paths.

use std::io::Write;
use std::process::{Command, Stdio};

use super::market::{Market, docker_containers, docker_inspect, wait_for};

/// The workload image with `/scratch` and `/tmp` of its own, root's, mode 0755.
fn image_with_its_own_scratch(base: &str) -> String {
    let dockerfile = format!(
        "FROM {base}\nUSER 0\nRUN [\"/bin/busybox\", \"mkdir\", \"-p\", \"/scratch\", \"/tmp\"]\nRUN [\"/bin/busybox\", \"chmod\", \"0755\", \"/scratch\", \"/tmp\"]\nUSER 65534:65534\n"
    );
    let mut child = Command::new("docker")
        .args(["build", "-q", "-t", "gpux-test-own-scratch:latest", "-"])
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

/// The one container of `lease`, inspected.
fn container_of(lease: &str) -> serde_json::Value {
    let ids = docker_containers(lease);
    assert_eq!(ids.len(), 1, "{ids:?}");
    docker_inspect(&ids[0])
}

/// CPUs, memory and `/dev/shm` that Docker holds the container to.
fn limits(c: &serde_json::Value) -> (f64, u64, u64) {
    let h = &c["HostConfig"];
    let cpus = h["CpuQuota"].as_f64().unwrap() / h["CpuPeriod"].as_f64().unwrap();
    (
        cpus,
        h["Memory"].as_u64().unwrap(),
        h["ShmSize"].as_u64().unwrap(),
    )
}

#[test]
fn a_lease_gets_its_gpus_share_of_the_machine_and_a_writable_exec_scratch_and_home() {
    let base = gpux_testnet::build_image().expect("building the workload image (Docker)");
    let own = image_with_its_own_scratch(&base);
    // One host of 8 GPUs that gives leases 32 threads and 256 GiB: 4 and 32 GiB per GPU.
    let mut market = Market::start_image(0, 8, 1, 30, base);
    market.host_extra = ["--cpus", "32", "--memory", "256GiB", "--image", &own]
        .map(String::from)
        .to_vec();
    market.add_host();
    let renter = &market.renters[0];
    wait_for("the host's offer", 30, || {
        renter.api().status().is_ok_and(|s| s.offers_in_book >= 1)
    });
    let out = renter.gpux(&["offers", "search", "cpu>=4 ram>=34"]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listing}");
    // cpu/GPU, ram/GPU: 4 cores, 34 GB (32 GiB).
    assert!(
        listing
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains(" 4 ") && l.contains(" 34 GB ")),
        "{listing}"
    );
    assert!(
        renter
            .gpux(&["offers", "search", "cpu>=4.001"])
            .stdout
            .starts_with(b"no offer"),
        "an offer above the share matched"
    );
    // The host measured its workspace disk and its bandwidth to peers, and says so.
    wait_for("the measured machine facts in the offer", 30, || {
        let out = renter.gpux(&["offers", "search", "", "--json"]);
        let hits: Vec<gpux_api::OfferHit> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        hits.first().is_some_and(|h| {
            h.machine.disk_write_mbps > 0
                && h.machine.net_up_mbps > 0
                && h.machine.net_down_mbps > 0
                && h.machine.cpu_threads == 32
                && h.machine.memory_bytes == 256 << 30
        })
    });
    let rent = |more: &[&str], script: &str| {
        let mut args = vec![
            "rent",
            "gpu=l4",
            "--max-price",
            "5",
            "--duration",
            "300",
            "--image",
            &own,
            "--json",
        ];
        args.extend_from_slice(more);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        renter.gpux(&args)
    };
    let lease_of = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "rent failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<gpux_api::Rented>(&out.stdout)
            .unwrap()
            .lease
    };

    // Two GPUs take two shares: 8 CPUs and 64 GiB, half of it for /dev/shm.
    let two = lease_of(rent(&["--gpus", "2"], "sleep 300"));
    assert_eq!(limits(&container_of(&two)), (8.0, 64 << 30, 32 << 30));

    // Asking for less gets exactly that.
    let small = lease_of(rent(
        &[
            "--gpus", "1", "--cpus", "2", "--memory", "8GiB", "--shm", "1GiB",
        ],
        "sleep 300",
    ));
    assert_eq!(limits(&container_of(&small)), (2.0, 8 << 30, 1 << 30));

    // More than a GPU's share finds no host.
    let out = rent(&["--gpus", "1", "--cpus", "8"], "true");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no offer"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The image ships /scratch and /tmp as root's 0755: both are the workload's, writable,
    // and run what is written there (a tmpfs is `noexec` unless told otherwise); HOME too.
    let out = renter.gpux(&[
        "exec",
        &two,
        "--",
        "sh",
        "-c",
        "printf '#!/bin/sh\\necho ran-from-tmp\\n' > /tmp/s && chmod +x /tmp/s && /tmp/s \
         && cp /tmp/s /scratch/s && /scratch/s && touch \"$HOME/.cache\" && echo home=$HOME",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ran-from-tmp\nran-from-tmp\nhome=/scratch\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success());
    for lease in [&two, &small] {
        assert!(renter.gpux(&["stop", lease]).status.success());
    }
}
