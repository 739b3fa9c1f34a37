//! The isolated testnet's hosts behind NAT: each is rented on purpose (`host=<peer id>`),
//! and every stream a lease uses is tried over the connection the renter got, relayed or
//! punched: the host's logs, a file copied in and out, a command run in the container. The
//! lease then ends and settles with the others.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::harness::Node;
use crate::harness::wait;
use crate::workload::cp;

/// A host behind NAT, as the report gives it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NatHost {
    /// The host's name.
    pub name: String,
    /// The renter's name (itself behind NAT, or not).
    pub renter: String,
    /// The address others see its connections come from (its NAT's).
    pub public_address: String,
    /// What AutoNAT told the host: `private` when it learned it cannot be dialled.
    pub reachability: String,
    /// The relay addresses it was reachable through.
    pub relayed_at: Vec<String>,
    /// The lease rented on it.
    pub lease: String,
    /// How the renter was connected to it when the lease ran: `relayed`, `punched` or
    /// `direct` (the host dialled the renter itself).
    pub connection: String,
    /// From the rent to the container running, ms.
    pub rent_ms: u64,
    /// Bytes of the file copied in (and back out, compared).
    pub bytes_copied: u64,
    /// The command run in the container answered.
    pub exec_answered: bool,
    /// Log lines the renter read from the running container.
    pub log_lines: usize,
}

/// Every host behind NAT (`nat`: name → its NAT's address, renters' included), rented by
/// renter-0 and by each renter behind NAT; the figures or the errors go into `report`.
pub(crate) fn rounds(
    nodes: &[Node],
    nat: &std::collections::BTreeMap<String, String>,
    image: &str,
    base: &std::path::Path,
    report: &mut crate::Report,
    progress: &impl Fn(&str),
) {
    let nat_renters = nat.keys().filter(|n| n.starts_with("renter-"));
    for renter in std::iter::once(&"renter-0".to_string())
        .chain(nat_renters)
        .filter_map(|name| nodes.iter().find(|n| &n.name == name))
    {
        for (name, public) in nat.iter().filter(|(n, _)| n.starts_with("host-")) {
            let Some(host) = nodes.iter().find(|n| &n.name == name) else {
                continue;
            };
            let work = base.join("nat").join(&renter.name);
            match round(renter, host, public, image, &work, progress) {
                Ok(f) => report.nat.push(f),
                Err(e) => report.errors.push(format!("behind NAT: {e:#}")),
            }
        }
    }
}

/// How long a lease on a host behind NAT runs, seconds.
const LEASE_S: u32 = 12;

/// Rents `host` (behind NAT) from `renter` and uses the lease's streams; `work` is a
/// scratch directory.
fn round(
    renter: &Node,
    host: &Node,
    public_address: &str,
    image: &str,
    work: &std::path::Path,
    progress: &impl Fn(&str),
) -> anyhow::Result<NatHost> {
    let host_api = host.api()?;
    let renter_api = renter.api()?;
    let mut figures = NatHost {
        name: host.name.clone(),
        renter: renter.name.clone(),
        public_address: public_address.to_string(),
        ..NatHost::default()
    };
    // AutoNAT's first probe comes a few seconds after start; the slot at a relay follows.
    let found = wait(Duration::from_secs(30), || {
        host_api
            .status()
            .is_ok_and(|s| s.reachability == "private" && !s.relayed_at.is_empty())
    });
    let status = host_api.status()?;
    figures.reachability = status.reachability.clone();
    figures.relayed_at = status.relayed_at.clone();
    if !found {
        bail!(
            "{}: AutoNAT found it {:?}, reachable through {:?}, 30 s after the market spread (expected private, through a relay)",
            host.name,
            status.reachability,
            status.relayed_at
        );
    }
    progress(&format!(
        "{} is behind NAT ({}): reachable through {}",
        host.name,
        public_address,
        status.relayed_at.join(", ")
    ));
    let request = gpux_api::RentRequest {
        query: format!("host={}", host.peer),
        gpus: 1,
        max_price: "10".into(),
        duration_s: LEASE_S,
        image: Some(image.to_string()),
        command: vec![
            "sh".into(),
            "-c".into(),
            "i=0; while true; do echo nat tick $i; i=$((i+1)); sleep 1; done".into(),
        ],
        disk_bytes: Some(16 << 20),
        // Nothing to fetch after the lease: the workspace goes with it.
        retain_s: Some(0),
        ..Default::default()
    };
    // The host may still run a lease of the renting rounds (its offer is back once it
    // ends).
    let free_by = Instant::now() + Duration::from_secs(30);
    let (rented, asked) = loop {
        let asked = Instant::now();
        match renter_api.rent(&request) {
            Ok(rented) => break (rented, asked),
            Err(e)
                if crate::figures::is_busy_market(e.code(), true) && Instant::now() < free_by =>
            {
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context(format!("renting {} behind NAT", host.name))
                );
            }
        }
    };
    figures.rent_ms = asked.elapsed().as_millis() as u64;
    figures.lease = rented.lease.clone();
    figures.connection = renter_api
        .status()?
        .peer_links
        .get(&host.peer)
        .cloned()
        .unwrap_or_default();
    progress(&format!(
        "{} on {}: lease {} running {} ms after rent, over a {} connection",
        renter.name,
        host.name,
        &rented.lease[..12.min(rented.lease.len())],
        figures.rent_ms,
        figures.connection
    ));

    // A command in the container.
    let out = renter
        .gpux_command(&["exec", &rented.lease, "--", "echo", "behind-nat-ok"])
        .output()
        .context("running gpux exec")?;
    figures.exec_answered =
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("behind-nat-ok");
    if !figures.exec_answered {
        bail!(
            "gpux exec on {} behind NAT: {}",
            host.name,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // A file in and back out.
    std::fs::create_dir_all(work)?;
    let input = work.join("nat-in.txt");
    let text: String = (0..2000)
        .map(|i| format!("line {i} through the NAT\n"))
        .collect();
    std::fs::write(&input, &text)?;
    let remote = format!("{}:/workspace/nat-in.txt", rented.lease);
    let (_, sent) = cp(renter, &input.display().to_string(), &remote)?;
    let back = work.join("nat-back.txt");
    cp(renter, &remote, &back.display().to_string())?;
    if std::fs::read_to_string(&back)? != text {
        bail!(
            "the file copied through {}'s NAT came back changed",
            host.name
        );
    }
    figures.bytes_copied = sent;
    // The container's output.
    let logged = wait(Duration::from_secs(10), || {
        renter_api
            .logs(&rented.lease, 0)
            .is_ok_and(|page| page.text.lines().filter(|l| l.contains("nat tick")).count() >= 2)
    });
    figures.log_lines = renter_api
        .logs(&rented.lease, 0)
        .map(|page| page.text.lines().filter(|l| l.contains("nat tick")).count())
        .unwrap_or(0);
    if !logged {
        bail!(
            "no output of the lease on {} came through its NAT",
            host.name
        );
    }
    // The host's GPU is free again before the next round books it.
    let ended = wait(Duration::from_secs(u64::from(LEASE_S) + 20), || {
        renter_api.leases().is_ok_and(|ls| {
            ls.iter()
                .any(|l| l.lease == rented.lease && matches!(&*l.phase, "ended" | "settled"))
        })
    });
    if !ended {
        bail!("the lease on {} behind NAT did not end in time", host.name);
    }
    Ok(figures)
}
