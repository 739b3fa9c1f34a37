//! `gpux host earnings`: what a host earned, from its leases' records, by day, lease or
//! renter: paid (redeemed at the ledger) and pending (acknowledged by the renter, not yet
//! redeemed), and the leases whose receipts a renter disputed.

use std::collections::BTreeMap;
use std::path::Path;

use gpux_api::{LeaseView, Role};
use gpux_client::ApiClient;
use gpux_protocol::MicroCredits;

use super::{out, print_json};

/// How earnings are summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum By {
    /// One row per UTC day (the day each lease ended, or began while it runs).
    #[default]
    Day,
    /// One row per lease.
    Lease,
    /// One row per renter.
    Renter,
}

/// One row of earnings.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Row {
    /// The day (`2026-12-07`), the lease id or the renter's peer id.
    pub(crate) key: String,
    /// Leases summed.
    pub(crate) leases: usize,
    /// Redeemed at the ledger, micro-credits.
    pub(crate) paid_micro: u64,
    /// Acknowledged by the renter and not yet redeemed, micro-credits.
    pub(crate) pending_micro: u64,
    /// Leases that ended with a disputed receipt.
    pub(crate) disputed: usize,
}

/// The rows for `leases` (only those this node hosted, and only from `since`, unix ms).
pub(crate) fn rows(leases: &[LeaseView], by: By, since: u64) -> Vec<Row> {
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for l in leases.iter().filter(|l| l.role == Role::Host) {
        let at = l.finished_at.or(l.started_at).unwrap_or(l.since);
        if at < since {
            continue;
        }
        let key = match by {
            By::Day => super::utc_time(at).chars().take(10).collect(),
            By::Lease => l.lease.clone(),
            By::Renter => l.renter.clone(),
        };
        let row = rows.entry(key.clone()).or_insert_with(|| Row {
            key,
            ..Row::default()
        });
        row.leases += 1;
        row.paid_micro += l.redeemed;
        if !l.settled {
            row.pending_micro += l.acked_amount.saturating_sub(l.redeemed);
        }
        if l.end.as_deref() == Some("receipt-disputed") {
            row.disputed += 1;
        }
    }
    rows.into_values().collect()
}

/// `--since`: a UTC date (`2026-12-01`) or an RFC 3339 time.
fn parse_since(since: &str) -> anyhow::Result<u64> {
    let text = if since.len() == 10 {
        format!("{since}T00:00:00Z")
    } else {
        since.to_string()
    };
    let at = humantime::parse_rfc3339(&text).map_err(|e| {
        anyhow::anyhow!(
            "--since {since}: {e} (a date, 2026-12-01, or a time, 2026-12-01T08:00:00Z)"
        )
    })?;
    Ok(at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64))
}

/// Prints the host's earnings.
pub(crate) fn earnings(
    dir: &Path,
    by: By,
    since: Option<&str>,
    (csv, json): (bool, bool),
) -> anyhow::Result<()> {
    let since = since.map(parse_since).transpose()?.unwrap_or(0);
    let rows = rows(&ApiClient::for_data_dir(dir)?.leases()?, by, since);
    if json {
        return print_json(&rows);
    }
    let credits = |m: u64| MicroCredits(m).amount_text();
    if csv {
        out!("key,leases,paid,pending,disputed")?;
        for r in &rows {
            let (paid, pending) = (credits(r.paid_micro), credits(r.pending_micro));
            out!("{},{},{paid},{pending},{}", r.key, r.leases, r.disputed)?;
        }
        return Ok(());
    }
    if rows.is_empty() {
        out!("no hosted leases yet")?;
        return Ok(());
    }
    let width = rows.iter().map(|r| r.key.len()).max().unwrap_or(3).max(3);
    out!(
        "{:<width$}  {:>6}  {:>14}  {:>14}  disputed",
        "key",
        "leases",
        "paid (cr)",
        "pending (cr)"
    )?;
    let mut total = Row::default();
    for r in &rows {
        out!(
            "{:<width$}  {:>6}  {:>14}  {:>14}  {}",
            r.key,
            r.leases,
            credits(r.paid_micro),
            credits(r.pending_micro),
            r.disputed
        )?;
        total.leases += r.leases;
        total.paid_micro += r.paid_micro;
        total.pending_micro += r.pending_micro;
        total.disputed += r.disputed;
    }
    out!(
        "{:<width$}  {:>6}  {:>14}  {:>14}  {}",
        "total",
        total.leases,
        credits(total.paid_micro),
        credits(total.pending_micro),
        total.disputed
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(
        id: &str,
        renter: &str,
        at: u64,
        (redeemed, acked): (u64, u64),
        settled: bool,
    ) -> LeaseView {
        let mut v: LeaseView = serde_json::from_value(serde_json::json!({
            "lease": id, "role": "host", "phase": "settled", "end": null, "host_end": null,
            "host": "H", "renter": renter, "gpus": [], "duration_s": 60,
            "price_per_gpu_hour_micro": 3600000, "retention_charge_micro": 0, "image": "",
            "since": at, "started_at": at, "finished_at": at, "exit_code": null,
            "receipt_interval_ms": 1000, "ack_grace_ms": 1000, "last_seq": 1, "acked_seq": 1,
            "acked_amount": acked, "redeemed": redeemed, "settled": settled, "log_bytes": 0,
            "kind": "on-demand", "starts_at": at, "preempted_until": null,
            "notice_refused": false, "resume": null, "ssh_keys": [], "group": null
        }))
        .unwrap();
        v.settled = settled;
        v
    }

    #[test]
    fn earnings_sum_by_day_lease_and_renter_and_count_only_hosted_leases_since() {
        let day = 1_796_601_600_000; // 2026-12-07T00:00:00Z
        let mut leases = vec![
            lease("a", "R1", day + 1000, (60_000, 60_000), true),
            lease("b", "R2", day + 2000, (0, 5_000), false),
            lease("c", "R1", day - 1000, (7_000, 7_000), true),
        ];
        let mut rented = lease("d", "R9", day, (1_000, 1_000), true);
        rented.role = Role::Renter;
        leases.push(rented);
        let by_day = rows(&leases, By::Day, 0);
        assert_eq!(by_day.len(), 2);
        assert_eq!(by_day[1].key, "2026-12-07");
        assert_eq!(
            (
                by_day[1].leases,
                by_day[1].paid_micro,
                by_day[1].pending_micro
            ),
            (2, 60_000, 5_000)
        );
        let by_renter = rows(&leases, By::Renter, 0);
        assert_eq!(
            by_renter
                .iter()
                .map(|r| (r.key.as_str(), r.paid_micro))
                .collect::<Vec<_>>(),
            [("R1", 67_000), ("R2", 0)]
        );
        let since = rows(&leases, By::Lease, parse_since("2026-12-07").unwrap());
        assert_eq!(
            since.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(parse_since("yesterday").is_err());
    }
}
