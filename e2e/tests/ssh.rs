//! SSH into a lease whose image has no sshd, with this machine's real OpenSSH client: the
//! host's node is the server, reached over the P2P link. A login shell's command and its
//! exit code, `scp` both ways (blake3 the same), `ssh -L` to a server in the container; the
//! host's key pinned from the lease; a key the lease does not name refused, and another
//! renter's node refused before SSH begins. `gpux rent --jupyter` runs the image's
//! JupyterLab with a random token and forwards it (a stand-in `jupyter` in the image: no
//! real JupyterLab offline), and says so when the image has none.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::market::{Market, wait_for};

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen (openssh-client)");
    assert!(out.status.success(), "{:?}", text(&out));
}

fn hash(path: &Path) -> blake3::Hash {
    blake3::hash(&std::fs::read(path).unwrap())
}

#[test]
fn openssh_logs_in_copies_and_forwards_into_an_image_without_sshd() {
    let market = Market::start_with(1, 2, 2, 30);
    let (renter, stranger) = (&market.renters[0], &market.renters[1]);
    let scratch = tempfile::tempdir().unwrap();
    // No keys of the user's: `--ssh` makes the node's own, and `gpux ssh` uses it.
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = renter
        .gpux_command(&[
            "rent", "gpu=l4", "--max-price", "5", "--duration", "300", "--image",
            &market.image, "--disk", "256MiB", "--ssh", "--json", "--",
            "sh", "-c",
            "mkdir -p /tmp/www && echo forwarded-over-ssh > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www",
        ])
        .env("HOME", &home)
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let lease = serde_json::from_slice::<gpux_api::Rented>(&out.stdout)
        .unwrap()
        .lease;
    wait_for("the lease to run", 30, || {
        renter.lease(&lease).phase == "running"
    });
    assert!(renter.dir.join("ssh/id_ed25519").exists());
    let ssh = |args: &[&str]| {
        let mut all = vec!["ssh", &lease, "--"];
        all.extend_from_slice(args);
        renter
            .gpux_command(&all)
            .env("HOME", &home)
            .output()
            .unwrap()
    };

    // A command in the container, as its unprivileged user, HOME writable; its exit code.
    let out = ssh(&["id -u; cd && pwd && touch .x && cat /etc/hostname >/dev/null; echo ok"]);
    assert_eq!(text(&out).0, "65534\n/scratch\nok\n", "{:?}", text(&out));
    let out = ssh(&["exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));

    // scp both ways through the entry `gpux ssh-config` prints (the host's key pinned).
    let out = renter.gpux(&["ssh-config", &lease]);
    assert!(out.status.success(), "{:?}", text(&out));
    let config = scratch.path().join("ssh_config");
    std::fs::write(&config, &out.stdout).unwrap();
    let alias = format!("gpux-{}", &lease[..12]);
    let big = scratch.path().join("big.bin");
    {
        let mut f = std::fs::File::create(&big).unwrap();
        let mut block = vec![0u8; 1 << 20];
        for i in 0..100u32 {
            block
                .iter_mut()
                .enumerate()
                .for_each(|(j, b)| *b = (j as u32 ^ i) as u8);
            f.write_all(&block).unwrap();
        }
    }
    let scp = |from: &str, to: &str| {
        let out = Command::new("scp")
            .arg("-F")
            .arg(&config)
            .args(["-q", from, to])
            .env("HOME", &home)
            .output()
            .expect("scp (openssh-client)");
        assert!(out.status.success(), "scp {from} {to}: {:?}", text(&out));
    };
    scp(
        big.to_str().unwrap(),
        &format!("{alias}:/workspace/big.bin"),
    );
    let back = scratch.path().join("back.bin");
    scp(
        &format!("{alias}:/workspace/big.bin"),
        back.to_str().unwrap(),
    );
    assert_eq!(hash(&back), hash(&big));
    // It is in the workspace, as the workload sees it.
    let out = ssh(&["wc -c < /workspace/big.bin"]);
    assert_eq!(text(&out).0.trim(), (100u64 << 20).to_string());

    // A terminal when asked for (a login shell gets one too).
    let out = Command::new("ssh")
        .arg("-F")
        .arg(&config)
        .args(["-tt", &alias, "tty; echo $TERM"])
        .env("HOME", &home)
        .env("TERM", "xterm-256color")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = text(&out).0;
    assert!(said.starts_with("/dev/pts/"), "{said:?}");
    assert!(said.contains("xterm-256color"), "{said:?}");

    // ssh -L to the container's own loopback.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut tunnel = Command::new("ssh")
        .arg("-F")
        .arg(&config)
        .args(["-N", "-L", &format!("{port}:127.0.0.1:8080"), &alias])
        .env("HOME", &home)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut page = String::new();
    wait_for("the page through ssh -L", 30, || {
        let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = conn.write_all(b"GET / HTTP/1.0\r\n\r\n");
        page.clear();
        let _ = conn.read_to_string(&mut page);
        page.contains("forwarded-over-ssh")
    });
    let _ = tunnel.kill();
    let _ = tunnel.wait();

    // A key the lease does not name is refused (the entry, less its identity).
    let other = scratch.path().join("other");
    keygen(&other);
    let bare = scratch.path().join("ssh_config_bare");
    let text_of = std::fs::read_to_string(&config).unwrap();
    assert!(text_of.contains("IdentityFile"), "{text_of}");
    let without: String = text_of
        .lines()
        .filter(|l| !l.trim_start().starts_with("IdentityFile"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&bare, without).unwrap();
    let out = Command::new("ssh")
        .arg("-F")
        .arg(&bare)
        .args(["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-i"])
        .arg(&other)
        .args([&alias, "true"])
        .env("HOME", &home)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("Permission denied"),
        "{:?}",
        text(&out)
    );
    // Another renter's node has no such lease: nothing reaches the host's SSH at all.
    let out = stranger
        .gpux_command(&["ssh", &lease, "--", "true"])
        .env("HOME", &home)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).1.contains("no lease"), "{:?}", text(&out));

    // --jupyter, on an image without JupyterLab: refused, saying why.
    let free_gpu = || {
        wait_for("a free GPU in the stranger's book", 30, || {
            stranger
                .api()
                .offers("gpu=l4", 10)
                .is_ok_and(|o| o.iter().any(|h| h.free >= 1))
        })
    };
    let rent = [
        "rent",
        "gpu=l4",
        "--max-price",
        "5",
        "--duration",
        "120",
        "--image",
    ];
    free_gpu();
    let out = stranger
        .gpux_command(&[&rent[..], &[market.image.as_str(), "--jupyter"]].concat())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("does the image have `jupyter`"),
        "{:?}",
        text(&out)
    );
    // On one with it: started with a token, forwarded, and the address printed answers.
    let image = image_with_jupyter(&market.image, scratch.path());
    free_gpu();
    let mut child = stranger
        .gpux_command(&[&rent[..], &[image.as_str(), "--jupyter"]].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let url = loop {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("gpux rent --jupyter printed no address: {err}");
        };
        if let Some(url) = line.strip_prefix("JupyterLab: ") {
            break url.to_string();
        }
    };
    let token = url.split("token=").nth(1).unwrap().to_string();
    assert_eq!(token.len(), 48, "{url}");
    let mut answer = String::new();
    wait_for("JupyterLab to answer through the forward", 30, || {
        answer = ureq::get(&url)
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        !answer.is_empty()
    });
    assert!(answer.contains(&format!("token={token}")), "{answer}");
    assert!(
        answer.contains("args=lab --no-browser --ip=127.0.0.1 --port=8888"),
        "{answer}"
    );
    // Ending the command ends the forward, not the lease.
    let _ = child.kill();
    let _ = child.wait();
    let jupyter_lease = stranger
        .leases()
        .into_iter()
        .find(|l| l.phase == "running")
        .expect("the JupyterLab lease runs on");
    assert!(
        stranger
            .gpux(&["stop", &jupyter_lease.lease])
            .status
            .success()
    );
    assert!(renter.gpux(&["stop", &lease]).status.success());
}

/// The workload image with a stand-in `jupyter`: `jupyter lab ...` serves a page on
/// 127.0.0.1:8888 that shows its arguments and `JUPYTER_TOKEN`.
fn image_with_jupyter(base: &str, scratch: &Path) -> String {
    let context = scratch.join("jupyter-image");
    std::fs::create_dir_all(&context).unwrap();
    std::fs::write(
        context.join("jupyter"),
        "#!/bin/sh\n\
         [ \"$1\" = lab ] || { echo \"not jupyter lab: $*\"; exit 2; }\n\
         mkdir -p /tmp/www && echo \"stand-in jupyterlab token=$JUPYTER_TOKEN args=$*\" > /tmp/www/lab\n\
         exec httpd -f -p 127.0.0.1:8888 -h /tmp/www\n",
    )
    .unwrap();
    std::fs::write(
        context.join("Dockerfile"),
        format!(
            "FROM {base}\nUSER 0\nCOPY jupyter /bin/jupyter\nRUN [\"/bin/busybox\", \"chmod\", \"0755\", \"/bin/jupyter\"]\nUSER 65534:65534\n"
        ),
    )
    .unwrap();
    let out = Command::new("docker")
        .args(["build", "-q", "-t", "gpux-test-jupyter:latest"])
        .arg(&context)
        .output()
        .expect("the docker CLI");
    assert!(out.status.success(), "docker build: {:?}", text(&out));
    "gpux-test-jupyter:latest".into()
}
