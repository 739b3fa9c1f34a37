//! The workload plane over real libp2p, real Docker and the real CLI: `gpux exec` and
//! `gpux forward` into a rented container, and nobody else's way in.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpux_protocol::plane_wire::{self, ExecOpen, ForwardOpen, Opened, PlaneRefusal};
use gpux_protocol::{BoundedString, BoundedVec, ContentId};
use gpux_testnet::rogue::Rogue;

use super::market::{Market, wait_for};

/// The workload image less its `nc` applet: forwards must not need one in the image.
fn image_without_nc() -> String {
    let base = gpux_testnet::build_image().expect("building the workload image (Docker)");
    let dockerfile = format!(
        "FROM {base}\nUSER 0\nRUN [\"/bin/busybox\", \"rm\", \"/bin/nc\"]\nUSER 65534:65534\n"
    );
    let mut child = Command::new("docker")
        .args(["build", "-q", "-t", "gpux-test-no-nc:latest", "-"])
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

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A child process killed when the test ends, passed or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_renter_execs_and_forwards_into_its_container_and_nobody_else_gets_in() {
    let image = image_without_nc();
    let market = Market::start_image(1, 1, 2, 30, image);
    let renter = &market.renters[0];
    let other = &market.renters[1];
    let host = &market.hosts[0];
    let lease = market.rent_with(
        renter,
        120,
        "mkdir -p /tmp/www && echo forwarded-ok > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www",
        &["--disk", "32MiB"],
    );
    wait_for("the lease to run", 30, || {
        renter.lease(&lease).phase == "running"
    });

    // A workspace of exactly the signed size, the workload's own, and its working directory.
    let workspace = host.dir.join("workspaces").join(&lease);
    let image_bytes = || std::fs::metadata(workspace.join("disk.img")).unwrap().len();
    assert_eq!(image_bytes(), 32 << 20);
    let out = renter.gpux(&[
        "exec",
        &lease,
        "--",
        "sh",
        "-c",
        "pwd; stat -c %u:%g /workspace; dd if=/dev/zero of=/workspace/fill bs=1M count=64",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout} {stderr}");
    assert!(stdout.starts_with("/workspace\n65534:65534\n"), "{stdout}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    // The host's disk outside it is untouched: the image did not grow.
    assert_eq!(image_bytes(), 32 << 20);

    // Exit codes come back as the command's own.
    let out = renter.gpux(&["exec", &lease, "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{:?}", text(&out));
    // The workload's unprivileged user, and no `nc` in this image.
    let out = renter.gpux(&["exec", &lease, "--", "id", "-u"]);
    assert_eq!(text(&out).0, "65534\n", "{:?}", text(&out));
    let out = renter.gpux(&[
        "exec",
        &lease,
        "--",
        "sh",
        "-c",
        "[ -e /bin/nc ] || echo no-nc; echo to-stderr >&2",
    ]);
    assert_eq!(text(&out), ("no-nc\n".into(), "to-stderr\n".into()));
    // Standard input with -i; without it the command reads end-of-file at once.
    let mut child = renter
        .gpux_command(&["exec", "-i", &lease, "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"piped input\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out).0, "piped input\n");
    assert!(out.status.success());
    let out = renter.gpux(&["exec", &lease, "--", "cat"]);
    assert!(out.status.success(), "{:?}", text(&out));
    // Renters never set NVIDIA_* variables.
    let out = renter.gpux(&[
        "exec",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=all",
        &lease,
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("NVIDIA_"), "{:?}", text(&out));

    // A terminal: under `script`, typed lines reach a shell on a pseudo-terminal.
    let gpux = env!("CARGO_BIN_EXE_gpux");
    let inner = format!(
        "{gpux} --data-dir {} exec -it {lease} -- sh",
        renter.dir.display()
    );
    let shell = format!(
        "(sleep 2; printf 'tty\\necho typed-$((6*7))\\nexit 3\\n'; sleep 10) | script -qfec '{inner}' /dev/null"
    );
    let out = Command::new("sh").args(["-c", &shell]).output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("/dev/pts/"), "{stdout:?} {stderr:?}");
    assert!(stdout.contains("typed-42"), "{stdout:?} {stderr:?}");
    assert_eq!(out.status.code(), Some(3), "{stdout:?} {stderr:?}");

    // A port on the container's loopback, on the renter's.
    let port = free_port();
    let mut forward = KillOnDrop(
        renter
            .gpux_command(&["forward", &lease, &format!("{port}:8080")])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut said = String::new();
    std::io::BufReader::new(forward.0.stderr.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert!(said.contains("forwarding"), "{said}");
    for _ in 0..3 {
        let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        conn.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("forwarded-ok\n"), "{answer}");
    }
    drop(forward);

    // Nobody else gets in: another renter's node knows no such lease, and a peer that
    // goes to the host directly is refused.
    let out = other.gpux(&["exec", &lease, "--", "true"]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("no lease"), "{:?}", text(&out));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rogue = runtime
        .block_on(Rogue::start(&format!("{}/p2p/{}", host.addr, host.peer)))
        .unwrap();
    let id: ContentId = lease.parse().unwrap();
    let exec = plane_wire::encode(&ExecOpen {
        lease: id,
        command: BoundedVec::new(vec![BoundedString::new("true").unwrap()]).unwrap(),
        env: BoundedVec::new(vec![]).unwrap(),
        tty: None,
    });
    let forward = plane_wire::encode(&ForwardOpen {
        lease: id,
        port: 8080,
    });
    for (protocol, open) in [
        (plane_wire::EXEC_PROTOCOL, exec),
        (plane_wire::FORWARD_PROTOCOL, forward),
        (plane_wire::EXEC_PROTOCOL, b"garbage".to_vec()),
    ] {
        let answer = runtime
            .block_on(rogue.plane_open(&host.peer, protocol, open))
            .unwrap();
        let Opened::No { code, .. } = answer else {
            panic!("{protocol}: served to a stranger");
        };
        assert!(
            matches!(code, PlaneRefusal::NotYourLease | PlaneRefusal::Malformed),
            "{protocol}: {code:?}"
        );
    }

    // Once the lease has ended, its container takes no more commands.
    assert!(renter.gpux(&["stop", &lease]).status.success());
    wait_for("the lease to end", 30, || {
        matches!(renter.lease(&lease).phase.as_str(), "ended" | "settled")
    });
    let out = renter.gpux(&["exec", &lease, "--", "true"]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("ended"), "{:?}", text(&out));
    // Its workspace is gone, unmounted and deleted.
    wait_for("the workspace to be erased", 30, || !workspace.exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&lease), "{mounts}");

    // A workspace above the host's disk quota (64 GiB by default) is refused, and says why.
    wait_for("the GPU to be offered again", 30, || {
        other
            .api()
            .offers("gpu=l4", 10)
            .is_ok_and(|hits| !hits.is_empty())
    });
    let out = other.gpux(&[
        "rent",
        "gpu=l4",
        "--max-price",
        "5",
        "--duration",
        "60",
        "--image",
        &market.image,
        "--disk",
        "100GiB",
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("does not fit"), "{:?}", text(&out));
}
