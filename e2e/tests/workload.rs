//! The workload plane over real libp2p, real Docker and the real CLI: `gpux exec` and
//! `gpux forward` into a rented container, and nobody else's way in.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// The bytes of the host's disk that `path` holds (its allocated blocks).
fn allocated(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
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
        &["--disk", "32MiB", "--retain", "2s"],
    );
    wait_for("the lease to run", 30, || {
        renter.lease(&lease).phase == "running"
    });

    // A workspace of exactly the signed size, the workload's own, and its working directory.
    let workspace = host.dir.join("workspaces").join(&lease);
    let image_bytes = || std::fs::metadata(workspace.join("disk.img")).unwrap().len();
    assert_eq!(image_bytes(), 32 << 20);
    // ... and all of it on the host's disk, not a sparse file that could fail to grow.
    assert!(allocated(&workspace.join("disk.img")) >= 32 << 20);
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
    let gpux = gpux_e2e::gpux();
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
    // A terminal without -i: no input goes in, and the output and exit code come out whole
    // (the end of input must not close the terminal).
    let inner = format!(
        "{gpux} --data-dir {} exec -t {lease} -- sh -c \"sleep 1; echo late-out; exit 4\"",
        renter.dir.display()
    );
    let shell = format!("sleep 4 | script -qfec '{inner}' /dev/null");
    let out = Command::new("sh").args(["-c", &shell]).output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("late-out"), "{stdout:?} {stderr:?}");
    assert_eq!(out.status.code(), Some(4), "{stdout:?} {stderr:?}");
    // A command whose renter goes away ends with it, however quiet it was.
    let quiet_err = tempfile::NamedTempFile::new().unwrap();
    let mut quiet = KillOnDrop(
        renter
            .gpux_command(&["exec", &lease, "--", "sleep", "4321"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(quiet_err.reopen().unwrap()))
            .spawn()
            .unwrap(),
    );
    let sleeping = || {
        let ps = "ps | grep -q '[s]leep 4321'";
        renter
            .gpux(&["exec", &lease, "--", "sh", "-c", ps])
            .status
            .success()
    };
    // Each look is an exec of its own: on a loaded machine (CI runs a testnet beside this)
    // they take seconds, so the wait is long, and a quiet command that failed says why.
    let said = || std::fs::read_to_string(quiet_err.path()).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sleeping() {
        if let Some(status) = quiet.0.try_wait().unwrap() {
            panic!(
                "the quiet command ended ({status}) before it was seen: {}",
                said()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the quiet command was not seen running within 60 s: {}",
            said()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(quiet);
    wait_for("the quiet command to end with its renter's CLI", 30, || {
        !sleeping()
    });

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
    // The node listens, not the CLI: the port is taken while the forward runs, and a
    // second forward onto it is refused plainly...
    let out = renter.gpux(&["forward", &lease, &format!("{port}:8080")]);
    assert!(!out.status.success(), "{:?}", text(&out));
    assert!(
        text(&out).1.contains("cannot listen on"),
        "{:?}",
        text(&out)
    );
    // ...and when the forward stops, the node stops listening and ends what it carried.
    let mut held = TcpStream::connect(("127.0.0.1", port)).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(forward);
    let waited = std::time::Instant::now();
    let _ = held.read_to_end(&mut Vec::new());
    assert!(
        waited.elapsed() < Duration::from_secs(15),
        "a carried connection outlived its forward"
    );
    wait_for("the forward's port to close", 10, || {
        TcpStream::connect(("127.0.0.1", port)).is_err()
    });
    // One connection over standard input and output: what `gpux ssh-config` gives OpenSSH
    // as its ProxyCommand.
    let mut stdio = renter
        .gpux_command(&["forward", "--stdio", &lease, "8080"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    stdio
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
        .unwrap();
    let out = stdio.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(text(&out).0.ends_with("forwarded-ok\n"), "{:?}", text(&out));
    // (An entry for an sshd of the renter's own, on its port.)
    let out = renter.gpux(&["ssh-config", &lease, "--port", "2222", "--user", "me"]);
    let (config, _) = text(&out);
    assert!(out.status.success(), "{config}");
    assert!(
        config.starts_with(&format!("Host gpux-{}\n", &lease[..12])),
        "{config}"
    );
    assert!(config.contains("    User me\n"), "{config}");
    assert!(
        config.contains(&format!("forward --stdio {lease} 2222\n")),
        "{config}"
    );
    assert!(
        !other
            .gpux(&["ssh-config", &lease, "--port", "2222"])
            .status
            .success()
    );
    // The relay a host that is not root forwards through: its own busybox, mounted
    // read-only in the container, reaches the port from inside.
    let mut relay = renter
        .gpux_command(&[
            "exec",
            "-i",
            &lease,
            "--",
            "/run/gpux/busybox",
            "nc",
            "127.0.0.1",
            "8080",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    relay
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
        .unwrap();
    let out = relay.wait_with_output().unwrap();
    assert!(text(&out).0.ends_with("forwarded-ok\n"), "{:?}", text(&out));

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

    // Once the lease has ended, its container takes no more commands, and a forward into
    // it stops by itself.
    let end_port = free_port();
    let mut ending = KillOnDrop(
        renter
            .gpux_command(&["forward", &lease, &format!("{end_port}:8080")])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut ending_said = std::io::BufReader::new(ending.0.stderr.take().unwrap());
    let mut said = String::new();
    ending_said.read_line(&mut said).unwrap();
    assert!(
        said.contains(&format!("forwarding 127.0.0.1:{end_port}")),
        "{said}"
    );
    assert!(renter.gpux(&["stop", &lease]).status.success());
    wait_for("the lease to end", 30, || {
        matches!(renter.lease(&lease).phase.as_str(), "ended" | "settled")
    });
    wait_for("the forward to stop with the lease", 15, || {
        ending.0.try_wait().unwrap().is_some()
    });
    assert!(ending.0.wait().unwrap().success());
    ending_said.read_to_string(&mut said).unwrap();
    assert!(said.contains("has ended; forwarding stopped"), "{said}");
    let out = renter.gpux(&["exec", &lease, "--", "true"]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("ended"), "{:?}", text(&out));
    // The kept workspace was paid for as the host's offer priced it: 32 MiB for 2 s at 36
    // credits per GiB-hour, 625 µcr, in every receipt and in what the host was paid.
    wait_for("the lease to settle", 30, || {
        host.phase(&lease) == "settled"
    });
    let out = renter.gpux(&["receipts", &lease, "--json"]);
    let receipts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let receipts = receipts["receipts"].as_array().unwrap();
    assert!(!receipts.is_empty());
    for r in receipts {
        assert_eq!(r["workspace_charge_micro"], 625, "{r}");
        let gpu = r["gpu_seconds"].as_u64().unwrap() * 1000;
        assert_eq!(r["amount_due_micro"].as_u64().unwrap(), gpu + 625, "{r}");
    }
    let hosted = host.lease(&lease);
    let paid = receipts.iter().rev().find(|r| r["acked"] == true).unwrap();
    assert_eq!(hosted.redeemed, paid["amount_due_micro"].as_u64().unwrap());
    // Its workspace is gone, unmounted and deleted.
    wait_for("the workspace to be erased", 30, || !workspace.exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&lease), "{mounts}");

    // Hosts say in their offers how large a workspace they give now (64 GiB of quota by
    // default, less what is held): `disk` finds them, and a rent that asks for more than any
    // host gives finds no offer.
    wait_for("the GPU to be offered again", 30, || {
        other
            .api()
            .offers("gpu=l4 disk>=60", 10)
            .is_ok_and(|hits| !hits.is_empty())
    });
    assert!(
        other
            .api()
            .offers("gpu=l4 disk>=69", 10)
            .unwrap()
            .is_empty()
    );
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
    assert!(text(&out).1.contains("no offer"), "{:?}", text(&out));
}

/// `len` bytes that compress to nothing useful (blake3's output stream).
fn noise(path: &std::path::Path, len: u64, seed: &str) {
    let mut xof = blake3::Hasher::new().update(seed.as_bytes()).finalize_xof();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = buf.len().min(left as usize);
        xof.fill(&mut buf[..n]);
        out.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    out.flush().unwrap();
}

fn hash_of(path: &std::path::Path) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    hasher
        .update_reader(std::fs::File::open(path).unwrap())
        .unwrap();
    hasher.finalize()
}

fn copy_report(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{:?}", text(out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn gpux_cp_round_trips_a_gibibyte_and_a_tree_resumes_and_never_leaves_the_workspace() {
    // Receipts every second, acknowledgements due within 3 s: bulk bytes must not delay them.
    let market = Market::start(1, 1, 3);
    let renter = &market.renters[0];
    let host = &market.hosts[0];
    let lease = market.rent_with(
        renter,
        600,
        "sleep 600",
        &["--disk", "1200MiB", "--retain", "15s"],
    );
    wait_for("the lease to run", 30, || {
        renter.lease(&lease).phase == "running"
    });
    // The workspace holds its whole size on the host's disk before anything is written.
    let image = host.dir.join(format!("workspaces/{lease}/disk.img"));
    assert!(allocated(&image) >= 1200 << 20, "{}", allocated(&image));
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big.bin");
    const GIB: u64 = 1 << 30;
    noise(&big, GIB, "big");
    let remote = |p: &str| format!("{lease}:/workspace/{p}");

    // Up, killed half-way, and again: only what had not arrived is sent.
    let part = host
        .dir
        .join(format!("workspaces/{lease}/mnt/.big.bin.gpux-part"));
    let mut first = KillOnDrop(
        renter
            .gpux_command(&["cp", big.to_str().unwrap(), &remote("")])
            .spawn()
            .unwrap(),
    );
    wait_for("half the file to arrive", 120, || {
        std::fs::metadata(&part).is_ok_and(|m| m.len() >= GIB / 2)
    });
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let arrived = std::fs::metadata(&part).unwrap().len();
    let again = copy_report(&renter.gpux(&["cp", big.to_str().unwrap(), &remote(""), "--json"]));
    eprintln!("resumed after {arrived} bytes: {again}");
    let sent = again["bytes_sent"].as_u64().unwrap();
    assert_eq!(again["bytes"].as_u64(), Some(GIB));
    assert!(
        sent <= GIB - arrived + (16 << 20),
        "{sent} sent, {arrived} had arrived"
    );
    assert!(!part.exists());

    // Down again, identical; a second download of it into the same place meanwhile is
    // refused, and the first goes on.
    let back = tmp.path().join("back.bin");
    let back_s = back.to_str().unwrap();
    let mut first = KillOnDrop(
        renter
            .gpux_command(&["cp", &remote("big.bin"), back_s, "--json"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let local_part = tmp.path().join(".back.bin.gpux-part");
    wait_for("a quarter of the file to come", 120, || {
        std::fs::metadata(&local_part).is_ok_and(|m| m.len() >= GIB / 4)
    });
    let second = renter.gpux(&["cp", &remote("big.bin"), back_s]);
    assert!(!second.status.success());
    let (_, said) = text(&second);
    // (Or, should the first have ended meanwhile, the part it compared is gone.)
    assert!(
        said.contains("under way") || said.contains("changed while it was compared"),
        "{said}"
    );
    let mut printed = String::new();
    first
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut printed)
        .unwrap();
    assert!(first.0.wait().unwrap().success(), "{printed}");
    let down: serde_json::Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(down["bytes_sent"].as_u64(), Some(GIB));
    assert_eq!(hash_of(&back), hash_of(&big));
    assert!(!local_part.exists());
    std::fs::remove_file(&back).unwrap();

    // A second copy of a file while one is under way takes over: the first ends, saying
    // so, and the second goes on from its part. (The workspace holds one GiB at a time.)
    std::fs::remove_file(host.dir.join(format!("workspaces/{lease}/mnt/big.bin"))).unwrap();
    let part = host
        .dir
        .join(format!("workspaces/{lease}/mnt/.big2.bin.gpux-part"));
    let mut first = KillOnDrop(
        renter
            .gpux_command(&["cp", big.to_str().unwrap(), &remote("big2.bin")])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_for("a quarter of the file to arrive", 120, || {
        std::fs::metadata(&part).is_ok_and(|m| m.len() >= GIB / 4)
    });
    let second =
        copy_report(&renter.gpux(&["cp", big.to_str().unwrap(), &remote("big2.bin"), "--json"]));
    assert!(second["bytes_sent"].as_u64().unwrap() < GIB, "{second}");
    let mut said = String::new();
    first
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert!(!first.0.wait().unwrap().success());
    assert!(
        said.contains("another copy of this file took over"),
        "{said}"
    );
    let copied = host.dir.join(format!("workspaces/{lease}/mnt/big2.bin"));
    assert_eq!(hash_of(&copied), hash_of(&big));
    std::fs::remove_file(&copied).unwrap();

    std::fs::remove_file(&big).unwrap();

    // A tree, up and down; links are left out and said so.
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::create_dir_all(tree.join("empty")).unwrap();
    noise(&tree.join("a/b/deep.bin"), 3 << 20, "deep");
    std::fs::write(tree.join("top.txt"), b"top\n").unwrap();
    std::fs::write(tree.join("a/zero"), b"").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", tree.join("link")).unwrap();
    let bad = std::ffi::OsStr::from_bytes(b"bad\xff");
    std::fs::write(tree.join(bad), b"x").unwrap();
    // What an interrupted download left is this side's own, not a file to copy.
    std::fs::write(tree.join(".stale.gpux-part"), b"x").unwrap();
    let up = copy_report(&renter.gpux(&["cp", tree.to_str().unwrap(), &remote(""), "--json"]));
    assert_eq!(up["files"].as_u64(), Some(3), "{up}");
    assert_eq!(
        up["skipped"],
        serde_json::json!([".stale.gpux-part", "bad\u{fffd}", "link"]),
        "{up}"
    );
    // A name that is not UTF-8 (no path on the wire is) is reported, never copied.
    let odd = renter.gpux(&[
        "exec",
        &lease,
        "--",
        "sh",
        "-c",
        "printf x > \"/workspace/tree/odd$(printf '\\377')\"",
    ]);
    assert!(odd.status.success(), "{:?}", text(&odd));
    // And what an interrupted put left is the host's, as is a directory under such a name.
    let host_tree = host.dir.join(format!("workspaces/{lease}/mnt/tree"));
    std::fs::write(host_tree.join(".half.gpux-part"), b"x").unwrap();
    std::fs::create_dir(host_tree.join(".dir.gpux-part")).unwrap();
    std::fs::write(host_tree.join(".dir.gpux-part/inner"), b"x").unwrap();
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let down =
        copy_report(&renter.gpux(&["cp", &remote("tree"), out_dir.to_str().unwrap(), "--json"]));
    assert_eq!(down["files"].as_u64(), Some(3), "{down}");
    assert_eq!(
        down["skipped"],
        serde_json::json!([".dir.gpux-part", ".half.gpux-part", "odd\u{fffd}"]),
        "{down}"
    );
    for f in ["a/b/deep.bin", "top.txt", "a/zero"] {
        assert_eq!(
            hash_of(&out_dir.join("tree").join(f)),
            hash_of(&tree.join(f)),
            "{f}"
        );
    }
    assert!(out_dir.join("tree/empty").is_dir());
    assert!(!out_dir.join("tree/link").exists());
    // Again: every file is there already, the same, so nothing crosses.
    let again =
        copy_report(&renter.gpux(&["cp", &remote("tree"), out_dir.to_str().unwrap(), "--json"]));
    assert_eq!(again["files"].as_u64(), Some(3), "{again}");
    assert_eq!(again["bytes_sent"].as_u64(), Some(0), "{again}");
    // A destination written with a trailing `/` is a directory to copy into, made for it.
    let fresh = format!("{}/fresh/", tmp.path().display());
    let down = copy_report(&renter.gpux(&["cp", &remote("tree/top.txt"), &fresh, "--json"]));
    assert_eq!(down["files"].as_u64(), Some(1), "{down}");
    assert_eq!(
        std::fs::read(tmp.path().join("fresh/top.txt")).unwrap(),
        b"top\n"
    );
    // A link already in the destination is never followed out of it: the host names the
    // paths, and `a` here leads elsewhere.
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let linked = tmp.path().join("linked");
    std::fs::create_dir_all(linked.join("tree")).unwrap();
    std::os::unix::fs::symlink(&outside, linked.join("tree/a")).unwrap();
    let out = renter.gpux(&["cp", &remote("tree"), linked.to_str().unwrap()]);
    let (_, err) = text(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);

    // A part is gone on from only when it is the start of the file (compared by blake3):
    // a stale one is started over, on either side, and the file comes out whole.
    const MIB: u64 = 1 << 20;
    let small = tmp.path().join("small.bin");
    noise(&small, 4 * MIB, "small");
    let small_s = small.to_str().unwrap();
    let host_part = host
        .dir
        .join(format!("workspaces/{lease}/mnt/.small.bin.gpux-part"));
    std::fs::write(&host_part, vec![0u8; MIB as usize]).unwrap();
    let up = copy_report(&renter.gpux(&["cp", small_s, &remote(""), "--json"]));
    assert_eq!(up["bytes_sent"].as_u64(), Some(4 * MIB), "{up}");
    assert!(!host_part.exists());
    // There already, the same: nothing crosses.
    let again = copy_report(&renter.gpux(&["cp", small_s, &remote(""), "--json"]));
    assert_eq!(again["bytes_sent"].as_u64(), Some(0), "{again}");
    let back = tmp.path().join("small-back.bin");
    let local_part = tmp.path().join(".small-back.bin.gpux-part");
    std::fs::write(&local_part, vec![1u8; MIB as usize]).unwrap();
    let get = |to: &std::path::Path| {
        copy_report(&renter.gpux(&["cp", &remote("small.bin"), to.to_str().unwrap(), "--json"]))
    };
    assert_eq!(get(&back)["bytes_sent"].as_u64(), Some(4 * MIB));
    assert_eq!(hash_of(&back), hash_of(&small));
    // A part that is the file's first mebibyte: only the rest comes.
    std::fs::remove_file(&back).unwrap();
    let head = std::fs::read(&small).unwrap()[..MIB as usize].to_vec();
    std::fs::write(&local_part, head).unwrap();
    assert_eq!(get(&back)["bytes_sent"].as_u64(), Some(3 * MIB));
    assert_eq!(hash_of(&back), hash_of(&small));
    assert!(!local_part.exists());
    // The file there already: nothing crosses; at its size with other bytes: all of it.
    assert_eq!(get(&back)["bytes_sent"].as_u64(), Some(0));
    noise(&back, 4 * MIB, "other");
    assert_eq!(get(&back)["bytes_sent"].as_u64(), Some(4 * MIB));
    assert_eq!(hash_of(&back), hash_of(&small));

    // Nothing outside the workspace: `..`, a link the workload made, and a directory the
    // workload keeps flipping to a link.
    let probe = tmp.path().join("probe.txt");
    std::fs::write(&probe, b"probe\n").unwrap();
    let out = renter.gpux(&[
        "cp",
        probe.to_str().unwrap(),
        &format!("{lease}:/workspace/../etc"),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("inside /workspace"),
        "{:?}",
        text(&out)
    );
    // A part is no put's target: it would take the name of another put's part.
    let out = renter.gpux(&[
        "cp",
        probe.to_str().unwrap(),
        &remote("tree/.top.txt.gpux-part"),
    ]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("a copy's part"), "{:?}", text(&out));
    // Nor is a name longer than a filesystem takes: refused before a byte is sent.
    let out = renter.gpux(&["cp", probe.to_str().unwrap(), &remote(&"n".repeat(300))]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("too long"), "{:?}", text(&out));
    let made = renter.gpux(&[
        "exec",
        &lease,
        "--",
        "ln",
        "-s",
        "/etc",
        "/workspace/etc-link",
    ]);
    assert!(made.status.success(), "{:?}", text(&made));
    let out = renter.gpux(&[
        "cp",
        probe.to_str().unwrap(),
        &remote("etc-link/gpux-probe"),
    ]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("symbolic link"), "{:?}", text(&out));
    let out = renter.gpux(&[
        "cp",
        &remote("etc-link/hostname"),
        tmp.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{:?}", text(&out));
    let flip = "while true; do mkdir /workspace/flip 2>/dev/null; rmdir /workspace/flip 2>/dev/null; ln -s /etc /workspace/flip 2>/dev/null; rm -f /workspace/flip; done";
    let started = renter.gpux(&[
        "exec",
        &lease,
        "--",
        "sh",
        "-c",
        &format!("nohup sh -c '{flip}' >/dev/null 2>&1 &"),
    ]);
    assert!(started.status.success(), "{:?}", text(&started));
    for i in 0..40 {
        let _ = renter.gpux(&[
            "cp",
            probe.to_str().unwrap(),
            &remote(&format!("flip/gpux-probe-{i}")),
        ]);
    }
    let escaped: Vec<_> = std::fs::read_dir("/etc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("gpux-probe"))
        .map(|e| e.path())
        .collect();
    assert!(
        escaped.is_empty(),
        "written outside the workspace: {escaped:?}"
    );

    // All that copying ended no lease: it runs until its renter stops it.
    assert_eq!(renter.lease(&lease).phase, "running");
    assert!(renter.gpux(&["stop", &lease]).status.success());
    wait_for("the lease to end", 30, || {
        matches!(renter.lease(&lease).phase.as_str(), "ended" | "settled")
    });
    assert_eq!(
        renter.lease(&lease).end.as_deref(),
        Some("renter-stopped"),
        "{:?}",
        renter.lease(&lease)
    );
    // The workspace outlives the lease for its retention: results can still be fetched
    // (but the container is gone: no more commands).
    let late = tmp.path().join("late.txt");
    let fetched = renter.gpux(&["cp", &remote("tree/top.txt"), late.to_str().unwrap()]);
    assert!(fetched.status.success(), "{:?}", text(&fetched));
    assert_eq!(std::fs::read(&late).unwrap(), b"top\n");
    let out = renter.gpux(&["exec", &lease, "--", "true"]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("has ended"), "{:?}", text(&out));
    wait_for("the workspace to be erased after its retention", 60, || {
        !host.dir.join("workspaces").join(&lease).exists()
    });
    let out = renter.gpux(&["cp", &remote("tree/top.txt"), late.to_str().unwrap()]);
    assert!(!out.status.success(), "{:?}", text(&out));
    assert!(
        text(&out)
            .1
            .contains("its workspace, if it had one, is erased"),
        "{:?}",
        text(&out)
    );
}

/// `docker build` of `dockerfile` with `files` in its context; returns the image id.
fn build_with(dockerfile: &str, files: &[(&str, &std::path::Path)]) -> String {
    let context = tempfile::tempdir().unwrap();
    std::fs::write(context.path().join("Dockerfile"), dockerfile).unwrap();
    for (name, from) in files {
        std::fs::copy(from, context.path().join(name)).unwrap();
    }
    let out = Command::new("docker")
        .args(["build", "-q"])
        .arg(context.path())
        .output()
        .expect("the docker CLI");
    assert!(out.status.success(), "docker build: {:?}", text(&out));
    text(&out).0.trim().to_string()
}

fn docker_has(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .unwrap()
        .status
        .success()
}

/// Images removed when the test ends, passed or not.
struct RemoveImages(Vec<String>);

impl Drop for RemoveImages {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = Command::new("docker").args(["rmi", "-f", image]).output();
        }
    }
}

/// `gpux rent` of one GPU for 60 s with `image` given as `--image` or `--image-archive`
/// (`flag`), `more` options, running `command`.
fn rent_image(
    renter: &super::market::Node,
    flag: &str,
    image: &str,
    more: &[&str],
    command: &[&str],
) -> std::process::Output {
    let mut args = vec![
        "rent",
        "gpu=l4",
        "--max-price",
        "5",
        "--duration",
        "60",
        flag,
        image,
        "--json",
    ];
    args.extend_from_slice(more);
    args.push("--");
    args.extend_from_slice(command);
    renter.gpux(&args)
}

/// Rents one GPU running the image in `archive`; returns what the rent said.
fn rent_archive(
    renter: &super::market::Node,
    archive: &std::path::Path,
    more: &[&str],
) -> gpux_api::Rented {
    let out = rent_image(
        renter,
        "--image-archive",
        archive.to_str().unwrap(),
        more,
        &["sleep", "60"],
    );
    assert!(out.status.success(), "rent failed: {:?}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn renters_stage_their_own_images_by_chain_and_nothing_is_left_but_what_they_cache() {
    let base = gpux_testnet::build_image().expect("building the workload image (Docker)");
    let dir = tempfile::tempdir().unwrap();
    let (data, top1, top2) = (
        dir.path().join("data"),
        dir.path().join("top1"),
        dir.path().join("top2"),
    );
    noise(&data, 4 << 20, "data");
    noise(&top1, 2 << 20, "top, version 1");
    noise(&top2, 2 << 20, "top, version 2");
    // Two versions of one image: the same data layer on the host's base, another top layer.
    let dockerfile =
        |top: &str| format!("FROM {base}\nCOPY data /data/data\nCOPY {top} /data/top\n");
    let v1 = build_with(&dockerfile("top1"), &[("data", &data), ("top1", &top1)]);
    let v2 = build_with(&dockerfile("top2"), &[("data", &data), ("top2", &top2)]);
    let _cleanup = RemoveImages(vec![v1.clone(), v2.clone()]);
    let save = |image: &str, name: &str| {
        let path = dir.path().join(name);
        let out = Command::new("docker")
            .args(["save", "-o", path.to_str().unwrap(), image])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker save: {:?}", text(&out));
        path
    };
    let (a1, a2) = (save(&v1, "v1.tar"), save(&v2, "v2.tar"));
    for image in [&v1, &v2] {
        let out = Command::new("docker")
            .args(["rmi", image])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker rmi: {:?}", text(&out));
    }
    // The host (it shares this Docker daemon) lacks both before any staging.
    assert!(!docker_has(&v1) && !docker_has(&v2));

    // A tag only the host knows: it lists its images' tags when it starts, and the tag is
    // gone from this (shared) Docker by the time the renter asks for it.
    let out = Command::new("docker")
        .args(["tag", &base, "gpux-host-only:1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker tag: {:?}", text(&out));
    // Two GPUs: a lease that ended never stands in the next one's way.
    let market = Market::start_image(1, 2, 2, 30, base.clone());
    let out = Command::new("docker")
        .args(["rmi", "gpux-host-only:1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker rmi: {:?}", text(&out));
    let (renter, other) = (&market.renters[0], &market.renters[1]);
    let hits = |query: &str| {
        let out = renter.gpux(&["offers", "search", query, "--json"]);
        assert!(out.status.success(), "{:?}", text(&out));
        serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
            .unwrap()
            .len()
    };
    assert_eq!(hits("image=gpux-host-only*"), 1);
    assert_eq!(hits("image=gpux-host-only:1"), 1);
    assert_eq!(hits("image=gpux-host-only:2"), 0);
    // Renting by the host's tag runs the host's image: the lease binds its digest.
    let out = rent_image(renter, "--image", "gpux-host-only:1", &[], &["true"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let rented: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rented.image, base);
    assert!(rented.staged.is_none());
    // A name neither this Docker nor any host has is an image in a registry: Docker Hub,
    // which this machine cannot reach, as the host that tried to pull it says.
    let out = rent_image(renter, "--image", "no-such:1", &[], &["true"]);
    assert!(!out.status.success());
    let said = text(&out).1;
    assert!(
        said.contains("pulling no-such:1") && said.contains("registry docker.io"),
        "{said}"
    );
    let ended = |r: &super::market::Node, lease: &str| {
        wait_for("the lease to end", 60, || {
            let phase = r.lease(lease).phase;
            (phase == "settled" || phase == "ended")
                && super::market::docker_containers(lease).is_empty()
        });
    };
    let stop = |r: &super::market::Node, lease: &str| {
        let out = r.gpux(&["stop", lease]);
        assert!(out.status.success(), "stop: {:?}", text(&out));
        ended(r, lease);
    };

    // A renter image, not cached: staged (the base's layers are on the host already: only
    // the data and top layers travel), run, and erased when the lease ends.
    let rented = rent_archive(other, &a1, &[]);
    assert_eq!(rented.image, v1);
    let staged = rented.staged.clone().expect("a staged image");
    assert_eq!(staged.layers_sent, 2, "{staged:?}");
    assert!(staged.bytes_sent >= 6 << 20 && staged.bytes_sent < staged.image_bytes + 1);
    let out = other.gpux(&["exec", &rented.lease, "--", "sh", "-c", "wc -c < /data/top"]);
    assert_eq!(
        text(&out).0.trim(),
        (2 << 20).to_string(),
        "{:?}",
        text(&out)
    );
    assert!(docker_has(&v1));
    stop(other, &rented.lease);
    wait_for("the staged image to be erased", 30, || !docker_has(&v1));

    // Cached: kept after the lease, for this renter.
    let rented = rent_archive(renter, &a1, &["--cache-image"]);
    assert_eq!(rented.staged.as_ref().map(|s| s.layers_sent), Some(2));
    stop(renter, &rented.lease);
    assert!(docker_has(&v1), "a cached image is kept");

    // The second version sends only its top layer: the chain below it is cached.
    let rented = rent_archive(renter, &a2, &["--cache-image"]);
    let staged = rented.staged.clone().unwrap();
    assert_eq!(staged.layers_sent, 1, "{staged:?}");
    let top = (2u64 << 20) as f64;
    let ratio = staged.bytes_sent as f64 / top;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "sent {} for a 2 MiB top layer",
        staged.bytes_sent
    );
    let out = renter.gpux(&[
        "exec",
        &rented.lease,
        "--",
        "sh",
        "-c",
        "wc -c < /data/data",
    ]);
    assert_eq!(
        text(&out).0.trim(),
        (4 << 20).to_string(),
        "{:?}",
        text(&out)
    );
    stop(renter, &rented.lease);

    // Another renter gets nothing from that cache: it sends the whole chain above the
    // host's own image again, and its lease cannot name an image it did not stage.
    let rented = rent_archive(other, &a2, &[]);
    assert_eq!(rented.staged.as_ref().map(|s| s.layers_sent), Some(2));
    stop(other, &rented.lease);
    assert!(docker_has(&v2), "the first renter's cache holds it still");
    let out = rent_image(other, "--image", &v1, &[], &["true"]);
    assert!(!out.status.success(), "{:?}", text(&out));

    // A peer staging by hand: a staging cut off half-way goes on from what had arrived, and
    // a layer that arrives damaged is dropped before anything loads.
    rogue_stagings_resume_and_damage_is_refused(&market.hosts[0]);
    // Nor can a peer that knows a cached image's config and layer ids, but not its bytes,
    // claim it: `docker load` would skip those layers unread, so the host checks them.
    nobody_claims_a_cached_image_without_its_bytes(&market.hosts[0], &a2);
}

/// Stages the image in `archive` (already cached on `host` for another renter) with the
/// right config and garbage layers: refused.
fn nobody_claims_a_cached_image_without_its_bytes(
    host: &super::market::Node,
    archive: &std::path::Path,
) {
    use gpux_protocol::plane_wire::{
        STAGE_PROTOCOL, StageData, StageDone, StageLayer, StageOpen, StagePlan,
    };
    use sha2::Digest;
    let mut files = std::collections::BTreeMap::new();
    let mut tar = tar::Archive::new(std::fs::File::open(archive).unwrap());
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        let mut bytes = Vec::new();
        if entry.header().entry_type().is_file() {
            entry.read_to_end(&mut bytes).unwrap();
            files.insert(path, bytes);
        }
    }
    let manifest: serde_json::Value = serde_json::from_slice(&files["manifest.json"]).unwrap();
    let config = files[manifest[0]["Config"].as_str().unwrap()].clone();
    let layers: Vec<Vec<u8>> = manifest[0]["Layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| files[l.as_str().unwrap()].clone())
        .collect();
    // Garbage of each layer's size, with its own blake3, under the real diff ids.
    let garbage: Vec<Vec<u8>> = layers.iter().map(|l| vec![0x5a; l.len()]).collect();
    let open = StageOpen {
        image: gpux_protocol::ImageDigest(sha2::Sha256::digest(&config).into()),
        config_bytes: config.len() as u32,
        layers: BoundedVec::new(
            layers
                .iter()
                .zip(&garbage)
                .map(|(l, g)| StageLayer {
                    diff_id: sha2::Sha256::digest(l).into(),
                    bytes: g.len() as u64,
                    blake3: *blake3::hash(g).as_bytes(),
                })
                .collect(),
        )
        .unwrap(),
    };
    assert!(docker_has(&open.image.to_string()), "the image is cached");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rogue = rt
        .block_on(Rogue::start(&format!("{}/p2p/{}", host.addr, host.peer)))
        .unwrap();
    let mut stream = rt
        .block_on(rogue.plane_stream(&host.peer, STAGE_PROTOCOL))
        .unwrap();
    rt.block_on(stream.send(&plane_wire::encode(&open)))
        .unwrap();
    let opened: Opened = plane_wire::decode(&rt.block_on(stream.recv()).unwrap()).unwrap();
    assert_eq!(opened, Opened::Yes);
    let plan: StagePlan = plane_wire::decode(&rt.block_on(stream.recv()).unwrap()).unwrap();
    // The layers above the host's own image are asked for: the cache is not its.
    assert!(plan.config && !plan.layers.is_empty(), "{plan:?}");
    let send = |stream: &mut gpux_testnet::rogue::PlaneStream, bytes: &[u8]| {
        for chunk in bytes.chunks(plane_wire::MAX_FILE_DATA) {
            let frame = plane_wire::encode(&StageData(
                gpux_protocol::BoundedBytes::new(chunk.to_vec()).unwrap(),
            ));
            rt.block_on(stream.send(&frame)).unwrap();
        }
    };
    // The first layer asked for is enough: the host answers as soon as it fails to check
    // (and stops reading).
    send(&mut stream, &config);
    let first = plan.layers[0];
    send(
        &mut stream,
        &garbage[usize::from(first.index)][first.from as usize..],
    );
    let done: StageDone = plane_wire::decode(&rt.block_on(stream.recv()).unwrap()).unwrap();
    match done {
        StageDone::Failed { detail } => assert!(detail.contains("sha256 differs"), "{detail}"),
        StageDone::Loaded => panic!("garbage layers claimed a cached image"),
    }
}

fn rogue_stagings_resume_and_damage_is_refused(host: &super::market::Node) {
    use gpux_protocol::plane_wire::{
        STAGE_PROTOCOL, StageData, StageDone, StageLayer, StageOpen, StagePlan,
    };
    use sha2::Digest;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rogue = rt
        .block_on(Rogue::start(&format!("{}/p2p/{}", host.addr, host.peer)))
        .unwrap();
    let layer: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let diff: [u8; 32] = sha2::Sha256::digest(&layer).into();
    let config = format!(
        r#"{{"rootfs":{{"type":"layers","diff_ids":["sha256:{}"]}}}}"#,
        gpux_protocol::hex(&diff)
    )
    .into_bytes();
    let open = StageOpen {
        image: gpux_protocol::ImageDigest(sha2::Sha256::digest(&config).into()),
        config_bytes: config.len() as u32,
        layers: BoundedVec::new(vec![StageLayer {
            diff_id: diff,
            bytes: layer.len() as u64,
            blake3: *blake3::hash(&layer).as_bytes(),
        }])
        .unwrap(),
    };
    let data = |bytes: &[u8]| {
        plane_wire::encode(&StageData(
            gpux_protocol::BoundedBytes::new(bytes.to_vec()).unwrap(),
        ))
    };
    // Opens a staging and reads the plan (waiting out the previous one's turn).
    let start = || {
        for _ in 0..50 {
            let mut stream = rt
                .block_on(rogue.plane_stream(&host.peer, STAGE_PROTOCOL))
                .unwrap();
            rt.block_on(stream.send(&plane_wire::encode(&open)))
                .unwrap();
            let opened: Opened = plane_wire::decode(&rt.block_on(stream.recv()).unwrap()).unwrap();
            match opened {
                Opened::Yes => {
                    let plan: StagePlan =
                        plane_wire::decode(&rt.block_on(stream.recv()).unwrap()).unwrap();
                    return (stream, plan);
                }
                Opened::No {
                    code: PlaneRefusal::Busy,
                    ..
                } => std::thread::sleep(Duration::from_millis(100)),
                other => panic!("staging refused: {other:?}"),
            }
        }
        panic!("the host stayed busy");
    };
    let (mut stream, plan) = start();
    assert!(plan.config);
    assert_eq!(plan.layers.len(), 1);
    assert_eq!(plan.layers[0].from, 0);
    rt.block_on(stream.send(&data(&config))).unwrap();
    let half = layer.len() / 2;
    for chunk in layer[..half].chunks(plane_wire::MAX_FILE_DATA) {
        rt.block_on(stream.send(&data(chunk))).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    drop(stream);
    // Again: the host goes on from what arrived.
    let (mut stream, plan) = start();
    let from = plan.layers[0].from as usize;
    assert!(
        from > 0 && from <= half,
        "went on from {from} of {half} sent"
    );
    rt.block_on(stream.send(&data(&config))).unwrap();
    let mut rest = layer[from..].to_vec();
    rest[100] ^= 0xff;
    for chunk in rest.chunks(plane_wire::MAX_FILE_DATA) {
        rt.block_on(stream.send(&data(chunk))).unwrap();
    }
    let done: StageDone = plane_wire::decode(&rt.block_on(stream.recv()).unwrap()).unwrap();
    match done {
        StageDone::Failed { detail } => assert!(detail.contains("damaged"), "{detail}"),
        StageDone::Loaded => panic!("a damaged layer loaded"),
    }
    assert!(!docker_has(&open.image.to_string()));
    // The damaged bytes were dropped: the next staging starts the layer over.
    let (_stream, plan) = start();
    assert_eq!(plan.layers[0].from, 0);
}
