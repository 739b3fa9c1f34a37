//! `gpux status`, `offers search`, `bid`, `leases`, `balance`, `mint`: the market and this
//! node's part in it, through its API (`gpux rent` has a file of its own).

use std::path::Path;

use anyhow::Context;

use gpux_api::{BidRequest, MintRequest, OfferHit};
use gpux_client::ApiClient;

use super::rent::Want;
use super::{out, print_json};

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

/// `gpux bid QUERY ...`: a standing bid that runs what `gpux rent` would when an offer fills
/// it.
pub(crate) fn bid(dir: &Path, place: BidPlace) -> anyhow::Result<()> {
    let BidPlace {
        query,
        gpus,
        max_price,
        duration,
        kind,
        run,
        ttl,
        json,
    } = place;
    let (Some(query), Some(max_price)) = (query, max_price) else {
        anyhow::bail!(
            "gpux bid QUERY --max-price CREDITS [...] places a bid (`gpux bid list`, `gpux bid cancel ID`)"
        );
    };
    let want = Want {
        query,
        gpus,
        max_price,
        duration,
    };
    let mut rent = super::rent::request_of(dir, want, kind, run)?;
    rent.progress = None;
    let request = BidRequest {
        query: rent.query.clone(),
        gpus: rent.gpus,
        max_price: rent.max_price.clone(),
        duration_s: rent.duration_s,
        ttl_s: u64::from(ttl),
        rent: Some(rent),
    };
    let bid = ApiClient::for_data_dir(dir)?.bid(&request)?;
    if json {
        return print_json(&bid);
    }
    out!(
        "standing bid {} placed until {} (UTC); `gpux bid list` shows it, `gpux leases` once it is filled",
        bid.bid,
        super::utc_time(bid.expires_at)
    )?;
    Ok(())
}

/// `gpux bid list`.
pub(crate) fn bid_list(dir: &Path, json: bool) -> anyhow::Result<()> {
    let bids = ApiClient::for_data_dir(dir)?.bids()?;
    if json {
        return print_json(&bids);
    }
    if bids.is_empty() {
        out!("no bids")?;
        return Ok(());
    }
    out!(
        "{:<16}  {:<9}  {:>4}  {:>12}  {:<9}  {:<20}  query / image / why not filled",
        "bid",
        "state",
        "GPUs",
        "max cr/GPU-h",
        "kind",
        "until (UTC)"
    )?;
    for b in &bids {
        let state = match (&b.state[..], &b.lease) {
            ("filled", Some(lease)) => format!("filled {}", short(lease)),
            (s, _) => s.to_string(),
        };
        out!(
            "{:<16}  {:<9}  {:>4}  {:>12}  {:<9}  {:<20}  {}{}{}",
            &b.bid[..16.min(b.bid.len())],
            state,
            b.gpus,
            b.max_price,
            b.kind,
            super::utc_time(b.expires_at),
            b.query,
            b.image
                .as_deref()
                .map_or(String::new(), |i| format!(" / {i}")),
            b.refused
                .as_deref()
                .map_or(String::new(), |r| format!(" / not filled: {r}")),
        )?;
    }
    Ok(())
}

/// `gpux bid cancel ID`.
pub(crate) fn bid_cancel(dir: &Path, bid: &str, json: bool) -> anyhow::Result<()> {
    let view = ApiClient::for_data_dir(dir)?.cancel_bid(bid)?;
    if json {
        return print_json(&view);
    }
    out!("bid {} cancelled: withdrawn from the market", view.bid)?;
    Ok(())
}

/// What `gpux bid QUERY ...` places: what a renter wants and runs, as for `gpux rent`, and how
/// long the bid stands. (The query and price are checked here rather than by clap: the
/// same command also takes `list` and `cancel`.)
#[derive(Debug, clap::Args)]
pub(crate) struct BidPlace {
    /// Constraints, e.g. 'gpu=H100 region=eu'.
    pub(crate) query: Option<String>,
    /// GPUs wanted.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) gpus: u16,
    /// Most paid per GPU-hour, credits.
    #[arg(long, value_name = "CREDITS")]
    pub(crate) max_price: Option<String>,
    /// Lease length: seconds, or a duration like 30m or 2h.
    #[arg(long, default_value = "1h", value_parser = super::parse_duration)]
    pub(crate) duration: u32,
    #[command(flatten)]
    pub(crate) kind: super::rent::Kind,
    #[command(flatten)]
    pub(crate) run: super::rent::Run,
    /// How long the bid stands (at most 1h).
    #[arg(long, default_value = "10m", value_parser = super::parse_duration)]
    pub(crate) ttl: u32,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `gpux bid list`, `gpux bid cancel ID`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum BidAction {
    /// This node's bids: standing, filled (by which lease), cancelled or expired, and why
    /// a fill did not happen.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Withdraw a standing bid (a signed withdrawal, gossiped).
    Cancel {
        /// The bid id (as `gpux bid` and `gpux bid list` print it).
        bid: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
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
            "{:<64}  {:<6}  {:<12}  {:<9}  {:<14}  {:>4}  {:>12}  {:>12}  end",
            "lease",
            "role",
            "with",
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
            // What moved in before its work started.
            let moved = r.moved.map_or(String::new(), |m| {
                format!(
                    ", moved {} files, {} ({} fetched, {} sent)",
                    m.files,
                    bytesize::ByteSize(m.bytes),
                    bytesize::ByteSize(m.fetched),
                    bytesize::ByteSize(m.sent)
                )
            });
            format!("  [resume hop {}{from}{by}: {}{moved}]", r.hop, r.status)
        });
        let group = l
            .group
            .as_deref()
            .map_or(String::new(), |g| format!("  (group {})", short(g)));
        let note = note + &chain + &group;
        // The other party: the renter on a host, the host on a renter.
        let with = match l.role {
            gpux_api::Role::Host => &l.renter,
            _ => &l.host,
        };
        out!(
            "{:<64}  {:<6}  {:<12}  {:<9}  {:<14}  {:>4}  {:>12}  {:>12}  {}{note}",
            l.lease,
            role.as_str().unwrap_or("?"),
            peer_short(with),
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
/// A peer id as people compare them: its last 12 characters (the first few are the same
/// for every ed25519 peer id).
pub(crate) fn peer_short(peer: &str) -> &str {
    peer.get(peer.len().saturating_sub(12)..).unwrap_or(peer)
}

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
    let key = gpux_api::load_key(faucet)
        .with_context(|| format!("the faucet's key in {}", faucet.display()))?;
    let account = account
        .parse::<gpux_protocol::PeerId>()
        .map_err(|e| anyhow::anyhow!("{account:?}: {e}"))?
        .public_key();
    let amount = amount
        .parse::<gpux_protocol::MicroCredits>()
        .map_err(|e| anyhow::anyhow!("{amount:?}: {e}"))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?;
    let now = gpux_protocol::Timestamp(u64::try_from(now.as_millis()).unwrap_or(u64::MAX));
    gpux_api::faucet_grant(&key, account, amount, now)
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
