//! `gpux status`, `offers search`, `rent`, `bid`, `leases`, `balance`, `mint`: the market and
//! this node's part in it, through its API.

use std::path::Path;

use anyhow::Context;

use gpux_api::{BidRequest, MintRequest, OfferHit, RentRequest};
use gpux_node::api_client::ApiClient;

use super::{out, print_json};

/// What a renter wants, shared by `rent` and `bid`.
#[derive(Debug, clap::Args)]
pub(crate) struct Want {
    /// Constraints, e.g. 'gpu=H100 region=eu'.
    query: String,
    /// GPUs wanted (from one machine, or over several with --spread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    gpus: u16,
    /// Most paid per GPU-hour, credits.
    #[arg(long, value_name = "CREDITS")]
    max_price: String,
    /// Lease length: seconds, or a duration like 30m or 2h.
    #[arg(long, default_value = "1h", value_parser = super::parse_duration)]
    duration: u32,
}

/// The kind of lease, for `rent`.
#[derive(Debug, clap::Args)]
pub(crate) struct Kind {
    /// A spot lease: pays --max-price (at least the offer's spot floor) per second with no
    /// minimum, and the host may preempt it for an on-demand lease or a bid a tenth higher,
    /// after the notice the host states (30 s by default; the workload finds it in
    /// /run/gpux/preemption.json, then gets SIGTERM).
    #[arg(long, conflicts_with_all = ["start", "end"])]
    spot: bool,
    /// A reserved window's start: an RFC 3339 time (`2026-12-24T18:00:00Z`) or a delay
    /// from now (`+20s`, `+2h`). The lease is agreed and its escrow locked now; its
    /// container runs from the start to --end (--duration is ignored).
    #[arg(long, value_name = "TIME", requires = "end", value_parser = parse_time)]
    start: Option<u64>,
    /// The reserved window's end (as --start).
    #[arg(long, value_name = "TIME", requires = "start", value_parser = parse_time)]
    end: Option<u64>,
    /// A reserved window's committed minimum (`30m`): paid at the least if you stop the
    /// window early (the host turned others away for it); a window the host ends early pays
    /// only what ran.
    #[arg(long, value_name = "DURATION", requires = "start", value_parser = parse_hold)]
    committed: Option<u64>,
    /// Hold the GPUs this long (`90s`, `5m` at most) before the work starts: copy files
    /// into the workspace meanwhile (`gpux cp`), then `gpux commit LEASE` starts it. Not
    /// committed in time, the lease ends and nothing is paid.
    #[arg(long, value_name = "DURATION", value_parser = parse_hold)]
    hold: Option<u64>,
    /// A group order: --gpus over as many hosts as it takes, one lease per host (the
    /// largest share first), started all together or not at all; `gpux group scale` adds
    /// or removes GPUs later. Members have no network between them.
    #[arg(long, conflicts_with_all = ["spot", "start", "hold"])]
    spread: bool,
    /// With --spread: start whatever members could be placed (at least one) instead of
    /// nothing.
    #[arg(long, requires = "spread")]
    best_effort: bool,
    /// Challenge the GPUs before the work starts (a seeded matrix product checked with
    /// Freivalds, timed by this node): a host that answers wrong, or slower than 90% of its
    /// model's reference rate, is paid nothing and the next offer is tried.
    #[arg(long, conflicts_with = "spread")]
    challenge: bool,
    /// With --spot (and --disk): when preempted, this node copies the workspace's
    /// checkpoint directory out, rents the best fitting offer again, copies it in and starts
    /// the same workload; `gpux leases` shows the chain. The workload reads its checkpoint
    /// at start and writes it as it goes (and on SIGTERM).
    #[arg(long, requires = "spot")]
    resume: bool,
    /// The checkpoint directory under /workspace [default: checkpoint].
    #[arg(long, value_name = "DIR", requires = "resume")]
    checkpoint_dir: Option<String>,
    /// How long a resume looks for a new lease (`10m`) [default: 10m].
    #[arg(long, value_name = "DURATION", requires = "resume", value_parser = parse_hold)]
    resume_timeout: Option<u64>,
}

/// A hold on the command line, whole seconds.
fn parse_hold(text: &str) -> Result<u64, String> {
    humantime::parse_duration(text)
        .map(|d| d.as_secs())
        .map_err(|_| format!("'{text}': use 90s, 5m"))
}

/// A time on the command line, unix ms: RFC 3339, or `+DURATION` from now (whole seconds).
fn parse_time(text: &str) -> Result<u64, String> {
    let now = std::time::SystemTime::now();
    let at = match text.strip_prefix('+') {
        Some(delay) => humantime::parse_duration(delay)
            .map(|d| now + d)
            .map_err(|_| format!("'{text}': use +30s, +2h or an RFC 3339 time"))?,
        None => humantime::parse_rfc3339_weak(text).map_err(|_| {
            format!("'{text}': use an RFC 3339 time (2026-12-24T18:00:00Z) or +30s")
        })?,
    };
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("'{text}' is before 1970"))?
        .as_millis();
    // Whole seconds, so that the window lasts a whole number of them.
    u64::try_from(ms / 1000 * 1000).map_err(|_| format!("'{text}' is too far ahead"))
}

/// How a container is to run, for `rent`.
#[derive(Debug, clap::Args)]
pub(crate) struct Run {
    /// The image to run: a digest (`sha256:...`) the host lists, or an image in this
    /// node's Docker (`name:tag`), staged on the host before the lease [default: the
    /// host's first image].
    #[arg(long, value_name = "REF")]
    image: Option<String>,
    /// A `docker save` archive whose image is staged on the host and run.
    #[arg(long, value_name = "FILE", conflicts_with = "image")]
    image_archive: Option<std::path::PathBuf>,
    /// Keep the staged image on the host for your later leases, up to 24 h after this one
    /// (a new version then sends only the layers that changed).
    #[arg(long)]
    cache_image: bool,
    /// An environment variable for the workload, NAME=VALUE (repeatable).
    #[arg(long, value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Give the container a network (none by default).
    #[arg(long)]
    network: bool,
    /// A `/workspace` of this size for the lease's files (`10GiB`, `512MiB`): enforced,
    /// erased when the lease ends.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    disk: Option<u64>,
    /// Keep the workspace this long after the lease, for `gpux cp` to fetch results
    /// (`30m`; the host's default, 10 minutes, otherwise; 0: erase at once).
    #[arg(long, value_name = "DURATION", value_parser = parse_retain)]
    retain: Option<u64>,
    /// CPU cores for the container (`2`, `0.5`) [default: the GPUs' share of the host, as
    /// `gpux offers search` shows it].
    #[arg(long, value_name = "CORES", value_parser = parse_cores)]
    cpus: Option<u32>,
    /// Memory for the container (`8GiB`) [default: the GPUs' share of the host].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory: Option<u64>,
    /// Size of `/dev/shm`, part of the memory (`16GiB`) [default: half the memory].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    shm: Option<u64>,
    /// The command to run in the container, after `--` [default: the image's].
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// CPU cores on the command line (`2`, `0.5`), thousandths of a core.
fn parse_cores(text: &str) -> Result<u32, String> {
    let bad = || format!("'{text}': CPU cores like 2 or 0.5 (at most 3 decimals)");
    let m = text
        .parse::<gpux_protocol::MicroCredits>()
        .map_err(|_| bad())?;
    if m.0 == 0 || m.0 % 1000 != 0 {
        return Err(bad());
    }
    u32::try_from(m.0 / 1000).map_err(|_| bad())
}

/// A retention on the command line: seconds or a duration (`30m`); 0 is allowed.
fn parse_retain(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(s) => Ok(s),
        Err(_) => humantime::parse_duration(text)
            .map(|d| d.as_secs())
            .map_err(|_| format!("'{text}': use seconds or a duration like 30m")),
    }
}

/// A size on the command line: `10GiB`, `512MiB`, `1.5GB`, or bytes.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    text.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("'{text}': {e} (e.g. 10GiB)"))
}

pub(crate) fn status(dir: &Path, json: bool) -> anyhow::Result<()> {
    let status = ApiClient::for_data_dir(dir)?.status()?;
    if json {
        return print_json(&status);
    }
    out!("peer id        {}", status.peer_id)?;
    out!("up             {} s", status.uptime_s)?;
    let relayed = status
        .peer_links
        .values()
        .filter(|l| l.as_str() == "relayed")
        .count();
    out!(
        "peers          {} connected{}",
        status.peers.len(),
        if relayed > 0 {
            format!(" ({relayed} through a relay)")
        } else {
            String::new()
        }
    )?;
    match (status.reachability.as_str(), status.relayed_at.as_slice()) {
        ("private", []) => out!("reachable      no: behind NAT, looking for a relay slot")?,
        ("private", slots) => out!("reachable      through {}", slots.join(", "))?,
        ("public", _) => out!("reachable      yes (peers dialled it back)")?,
        _ => out!("reachable      not known yet")?,
    }
    out!("book           {} offers", status.offers_in_book)?;
    if let Some(own) = status.own_offers {
        out!("own offers     {own}")?;
    }
    out!(
        "gossip         {} accepted, {} rejected, {} over a relay's budget",
        status.gossip_accepted,
        status.gossip_rejected,
        status.gossip_over_budget
    )?;
    if let Some(metrics) = &status.metrics {
        out!("metrics        http://{metrics}/metrics")?;
    }
    Ok(())
}

pub(crate) fn search(dir: &Path, query: &str, limit: usize, json: bool) -> anyhow::Result<()> {
    let hits = ApiClient::for_data_dir(dir)?.offers(query, limit)?;
    if json {
        return print_json(&hits);
    }
    print_hits(&hits)
}

/// `gpux offers follow FAMILY... | --all`.
pub(crate) fn follow(dir: &Path, add: Vec<String>, all: bool, json: bool) -> anyhow::Result<()> {
    let following = ApiClient::for_data_dir(dir)?.follow(&gpux_api::FollowRequest { add, all })?;
    if json {
        return print_json(&following);
    }
    match following.families {
        None => out!("following every family's offers")?,
        Some(families) => out!(
            "following the offers of {} (hosts republish for a new follower within seconds)",
            families.join(", ")
        )?,
    }
    Ok(())
}

fn print_hits(hits: &[OfferHit]) -> anyhow::Result<()> {
    if hits.is_empty() {
        out!("no offer matches")?;
        return Ok(());
    }
    out!(
        "{:<16} {:<14} {:>7} {:>5} {:>14} {:>7} {:>8} {:>7} {:>11} {:<12} {:<14} {:>6} {:>5} {:<11}  host",
        "offer",
        "gpu",
        "vram GB",
        "free",
        "cr per GPU-h",
        "cpu/GPU",
        "ram/GPU",
        "disk GB",
        "net Mbit/s",
        "region",
        "tier",
        "rel 0-1",
        "intr",
        "reach"
    )?;
    for h in hits {
        let offer = h.offer.to_string();
        let m = &h.machine;
        out!(
            "{:<16} {:<14} {:>7} {:>2}/{:<2} {:>14} {:>7} {:>8} {:>7} {:>11} {:<12} {:<14} {:>7.2} {:>5} {:<11}  {}",
            &offer[..16.min(offer.len())],
            // A slice shows its profile: `a100 1g.10gb`.
            match &h.mig_profile {
                Some(p) => format!("{} {p}", h.family),
                None => h.family.clone(),
            },
            h.vram_gb,
            h.free,
            h.gpus,
            h.price_per_gpu_hour.amount_text(),
            cores_text(m.share.cpu_millis),
            format!("{} GB", m.share.memory_bytes / 1_000_000_000),
            h.disk_bytes / 1_000_000_000,
            bandwidth_text(m.net_down_mbps, m.net_up_mbps),
            h.region,
            h.tier.to_string(),
            f64::from(h.reliability_permille) / 1000.0,
            // The share of this node's spot leases the host preempted.
            h.interruption_permille
                .map_or("-".to_string(), |p| format!("{}%", (u32::from(p) + 5) / 10)),
            h.reach.as_str(),
            h.host.peer_id(),
        )?;
    }
    Ok(())
}

/// Cores as `8`, `2.5`, `0.125`.
fn cores_text(millis: u32) -> String {
    let text = format!("{}.{:03}", millis / 1000, millis % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Measured bandwidth as `down/up` Mbit/s, `-` where not measured.
fn bandwidth_text(down: u32, up: u32) -> String {
    let one = |v: u32| {
        if v == 0 {
            "-".to_string()
        } else {
            v.to_string()
        }
    };
    format!("{}/{}", one(down), one(up))
}

pub(crate) fn rent(dir: &Path, want: Want, kind: Kind, run: Run, json: bool) -> anyhow::Result<()> {
    let env = super::parse_env(&run.env)?;
    // The node reads the archive: give it a path that does not depend on this directory.
    let image_archive = run
        .image_archive
        .map(|p| {
            std::fs::canonicalize(&p)
                .map_err(|e| anyhow::anyhow!("--image-archive {}: {e}", p.display()))
        })
        .transpose()?
        .map(|p| p.display().to_string());
    let request = RentRequest {
        query: want.query,
        gpus: want.gpus,
        max_price: want.max_price,
        duration_s: want.duration,
        image: run.image,
        image_archive,
        cache_image: run.cache_image,
        command: run.command,
        env,
        network: run.network,
        disk_bytes: run.disk,
        retain_s: run.retain,
        cpu_millis: run.cpus,
        memory_bytes: run.memory,
        shm_bytes: run.shm,
        spot: kind.spot,
        window: kind.start.zip(kind.end),
        hold_s: kind.hold,
        resume: kind.resume,
        checkpoint_dir: kind.checkpoint_dir,
        resume_timeout_s: kind.resume_timeout,
        spread: kind.spread,
        best_effort: kind.best_effort,
        group: None,
        challenge: kind.challenge,
        committed_s: kind.committed,
    };
    if request.spread {
        let client = ApiClient::for_data_dir(dir)?;
        let placed = super::waiting("placing the group: matching, agreeing, starting", || {
            client.rent_group(&request)
        })?;
        if json {
            return print_json(&placed);
        }
        out!(
            "group {}: {} GPU(s) on {} host(s), all running",
            placed.group,
            placed.gpus,
            placed.leases.len()
        )?;
        for lease in &placed.leases {
            out!(
                "  lease {} with {}: {} GPU(s) at {} credits per GPU-hour",
                lease.lease,
                lease.host,
                lease.gpus.len(),
                lease.price_per_gpu_hour
            )?;
        }
        return Ok(());
    }
    let client = ApiClient::for_data_dir(dir)?;
    let lease = super::waiting(
        "renting: matching offers, staging the image, starting the container",
        || client.rent(&request),
    )?;
    if json {
        return print_json(&lease);
    }
    out!(
        "lease {} {} with {}: {} GPU(s) at {} credits per GPU-hour for {} s (escrow {} credits)",
        lease.lease,
        if lease.commit_by_ms.is_some() {
            "held"
        } else {
            "running"
        },
        lease.host,
        lease.gpus.len(),
        lease.price_per_gpu_hour,
        lease.duration_s,
        lease.escrow_amount,
    )?;
    if let Some(at) = lease.starts_at_ms {
        out!(
            "it starts at {} (UTC), once the spot lease on its GPUs has run out its notice",
            super::utc_time(at)
        )?;
    }
    if let Some(c) = &lease.challenge {
        out!(
            "challenge passed: {:.2} Gop/s, {:.0}% of the model's {:.2} (n = {}, round trip {:.1} ms)",
            c.achieved_gops,
            c.achieved_gops / c.reference_gops * 100.0,
            c.reference_gops,
            c.n,
            c.round_trip_ms
        )?;
    }
    if let Some(by) = lease.commit_by_ms {
        out!(
            "its GPUs are held until {} (UTC): copy files in (`gpux cp`), then `gpux commit {}` starts the work",
            super::utc_time(by),
            lease.lease
        )?;
    }
    if let Some(staged) = &lease.staged {
        out!(
            "image {} staged: {} of {} layers sent, {} of {}",
            lease.image,
            staged.layers_sent,
            staged.layers,
            bytesize::ByteSize(staged.bytes_sent),
            bytesize::ByteSize(staged.image_bytes),
        )?;
    }
    if let Some(kept) = &lease.retention {
        out!(
            "workspace kept {} s after the workload at {} credits per GiB-hour: {} credits, in the escrow",
            kept.retain_s,
            kept.price_per_gib_hour,
            kept.charge,
        )?;
    }
    Ok(())
}

/// `gpux group scale GROUP +K|-K`.
pub(crate) fn scale_group(dir: &Path, group: &str, delta: i32, json: bool) -> anyhow::Result<()> {
    let client = ApiClient::for_data_dir(dir)?;
    let scaled = super::waiting("scaling the group", || client.scale_group(group, delta))?;
    if json {
        return print_json(&scaled);
    }
    for lease in &scaled.added {
        out!(
            "added lease {} with {}: {} GPU(s)",
            lease.lease,
            lease.host,
            lease.gpus.len()
        )?;
    }
    for lease in &scaled.stopped {
        out!("stopping lease {lease}")?;
    }
    out!("group {}: {} GPU(s) now", scaled.group, scaled.gpus)?;
    Ok(())
}

pub(crate) fn bid(dir: &Path, want: Want, ttl_s: u32, json: bool) -> anyhow::Result<()> {
    let request = BidRequest {
        query: want.query,
        gpus: want.gpus,
        max_price: want.max_price,
        duration_s: want.duration,
        ttl_s: u64::from(ttl_s),
    };
    let bid = ApiClient::for_data_dir(dir)?.bid(&request)?;
    if json {
        return print_json(&bid);
    }
    out!(
        "standing bid {} placed; see `gpux leases` once it is filled",
        bid.bid
    )?;
    Ok(())
}

pub(crate) fn leases(dir: &Path, json: bool) -> anyhow::Result<()> {
    let leases = ApiClient::for_data_dir(dir)?.leases()?;
    if json {
        return print_json(&leases);
    }
    if leases.is_empty() {
        out!("no leases yet")?;
    } else {
        out!(
            "{:<64}  {:<6}  {:<9}  {:<14}  {:>4}  {:>12}  {:>12}  end",
            "lease",
            "role",
            "kind",
            "state",
            "GPUs",
            "cr per GPU-h",
            "acked (cr)"
        )?;
    }
    for l in &leases {
        let role = serde_json::to_value(l.role)?;
        // A preemption under way or past: when its notice ends the lease.
        let note = match (l.preempted_until, l.notice_refused) {
            (Some(at), _) => format!("  (preempted: notice ends at {})", super::utc_time(at)),
            (None, true) => "  (a preemption notice that did not hold was refused)".into(),
            (None, false) => String::new(),
        };
        // A resumable lease's place in its chain.
        let chain = l.resume.as_ref().map_or(String::new(), |r| {
            let from = r
                .resumed_from
                .as_deref()
                .map_or(String::new(), |f| format!(" from {}", short(f)));
            let by = r
                .resumed_by
                .as_deref()
                .map_or(String::new(), |b| format!(" -> {}", short(b)));
            format!("  [resume hop {}{from}{by}: {}]", r.hop, r.status)
        });
        let group = l
            .group
            .as_deref()
            .map_or(String::new(), |g| format!("  (group {})", short(g)));
        let note = note + &chain + &group;
        out!(
            "{:<64}  {:<6}  {:<9}  {:<14}  {:>4}  {:>12}  {:>12}  {}{note}",
            l.lease,
            role.as_str().unwrap_or("?"),
            l.kind,
            l.phase,
            l.gpus.len(),
            gpux_protocol::MicroCredits(l.price_per_gpu_hour_micro).amount_text(),
            gpux_protocol::MicroCredits(l.acked_amount).amount_text(),
            l.end.as_deref().unwrap_or("")
        )?;
    }
    // One line per group order: its leases, GPUs and hosts, and how many run.
    type Tally<'a> = (usize, usize, usize, std::collections::BTreeSet<&'a str>);
    let mut groups: std::collections::BTreeMap<&str, Tally> = Default::default();
    for l in &leases {
        if let Some(g) = l.group.as_deref() {
            let entry = groups.entry(g).or_default();
            entry.0 += 1;
            if l.phase == "running" {
                entry.1 += 1;
                entry.2 += l.gpus.len();
            }
            entry.3.insert(l.host.as_str());
        }
    }
    for (group, (leases, running, gpus, hosts)) in groups {
        out!(
            "group {group}: {running} of {leases} leases running, {gpus} GPU(s), over {} host(s)",
            hosts.len()
        )?;
    }
    Ok(())
}

/// A lease id's first 12 hex digits, for a table.
fn short(lease: &str) -> &str {
    lease.get(..12).unwrap_or(lease)
}

pub(crate) fn balance(dir: &Path, json: bool) -> anyhow::Result<()> {
    let balance = ApiClient::for_data_dir(dir)?.balance()?;
    if json {
        return print_json(&balance);
    }
    out!("{} credits ({})", balance.balance, balance.account)?;
    Ok(())
}

pub(crate) fn mint(
    dir: &Path,
    account: String,
    amount: String,
    faucet: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    let grant = match faucet {
        None => None,
        Some(faucet) => Some(gpux_protocol::hex(&grant(faucet, &account, &amount)?)),
    };
    let minted = ApiClient::for_data_dir(dir)?.mint(&MintRequest {
        account,
        amount: amount.clone(),
        grant,
    })?;
    if json {
        return print_json(&minted);
    }
    out!(
        "minted {amount} credits to {}; its balance is {} credits",
        minted.account,
        gpux_protocol::MicroCredits(minted.balance_micro).amount_text()
    )?;
    Ok(())
}

/// A `FaucetGrant` of `amount` credits to `account`, signed by the key in `faucet` (a data
/// directory), as an envelope.
fn grant(faucet: &Path, account: &str, amount: &str) -> anyhow::Result<Vec<u8>> {
    let key = gpux_node::load_key(faucet)
        .with_context(|| format!("the faucet's key in {}", faucet.display()))?;
    let account = account
        .parse::<gpux_protocol::PeerId>()
        .map_err(|e| anyhow::anyhow!("{account:?}: {e}"))?
        .public_key();
    let amount = amount
        .parse::<gpux_protocol::MicroCredits>()
        .map_err(|e| anyhow::anyhow!("{amount:?}: {e}"))?;
    gpux_node::ledger::faucet_grant(&key, account, amount, gpux_node::attest::now())
        .map_err(|e| anyhow::anyhow!("signing the grant: {e}"))
}

/// `gpux ledger status`.
pub(crate) fn ledger_status(dir: &Path, json: bool) -> anyhow::Result<()> {
    let totals = ApiClient::for_data_dir(dir)?.ledger()?;
    if json {
        return print_json(&totals);
    }
    let credits = |micro: u64| gpux_protocol::MicroCredits(micro).amount_text();
    out!(
        "minted {} credits; {} credits in balances and open escrows; {} accounts; {} escrows ({} open)",
        credits(totals.minted_micro),
        credits(totals.total_micro),
        totals.balances.len(),
        totals.escrows,
        totals.open_escrows
    )?;
    if let Some(c) = &totals.cluster {
        let ids = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        out!(
            "replicated ledger: this member is node {} ({}); leader {}; voters [{}]; learners [{}]; term {}; applied through entry {}",
            c.node_id,
            if c.leader { "the leader" } else { "a follower" },
            c.leader_id
                .map_or("unknown (an election)".into(), |l| l.to_string()),
            ids(&c.voters),
            ids(&c.learners),
            c.term,
            c.applied
        )?;
    }
    Ok(())
}

/// `gpux ledger readd PEER`.
pub(crate) fn ledger_readd(dir: &Path, peer: &str, json: bool) -> anyhow::Result<()> {
    let readded = ApiClient::for_data_dir(dir)?.ledger_readd(peer)?;
    if json {
        return print_json(&readded);
    }
    out!(
        "{} is a voter again as node {}, caught up",
        readded.peer,
        readded.node_id
    )?;
    Ok(())
}

/// `gpux block HOST` (and `--undo`).
pub(crate) fn block(dir: &Path, host: String, undo: bool, json: bool) -> anyhow::Result<()> {
    let blocked = ApiClient::for_data_dir(dir)?.block(&gpux_api::BlockRequest {
        host: host.clone(),
        blocked: !undo,
    })?;
    if json {
        return print_json(&blocked);
    }
    match (undo, blocked.changed) {
        (false, true) => out!("blocked {host}: this node's rents and bids skip it")?,
        (false, false) => out!("{host} was already blocked")?,
        (true, true) => out!("unblocked {host}")?,
        (true, false) => out!("{host} was not blocked")?,
    }
    Ok(())
}
