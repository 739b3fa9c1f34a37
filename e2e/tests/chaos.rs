//! Chaos over real processes and Docker: one market (a ledger, three hosts with four fake GPUs
//! each, three renters), a dozen leases of 70-90 s running at once, and kill -9 of hosts,
//! renters and the ledger at random moments (the ledger kept down longer than its release
//! grace). Every lease is one round; each round's figures are printed. The rules checked:
//! no charge exceeds Docker's runtime (with the 60 s minimum) at the agreed price, rounded
//! down; a host's unpaid runtime never exceeds interval + grace + 2 s; a rent reported as
//! failed is never billed; the ledger's outage costs the host nothing acknowledged; credits
//! are conserved. `GPUX_CHAOS_SEED=N` replays a schedule.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub, dead_code)]

#[path = "market.rs"]
mod market;

use std::time::{Duration, Instant};

use gpux_api::{LeaseView, Role};
use market::{LEDGER_GRACE_S, Market, RECEIPT_INTERVAL_S, wait_for};

fn attest_lib() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("GPUX_FAKE_NVML_LIB") {
        return p.into();
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let ok = std::process::Command::new(cargo)
        .args(["build", "-p", "gpux-fake-nvml"])
        .current_dir(&root)
        .status()
        .unwrap();
    assert!(ok.success());
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), std::path::PathBuf::from)
        .join("debug/libgpux_fake_nvml.so")
}

/// SplitMix64, seeded: the schedule is printed and can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

const ACK_GRACE_S: u64 = 5;
const LEASES_PER_RENTER: usize = 4;
/// A workload that prints a line every second until stopped.
const TICKER: &str = "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done";

#[derive(Debug, Clone, Copy)]
enum Victim {
    Host(usize),
    Renter(usize),
    Ledger,
}

/// Rents one GPU through the renter's CLI, retrying while the market is momentarily full
/// (or the renter's node is down); the lease id, or the last error.
fn rent(dir: &std::path::Path, image: &str, duration_s: u64) -> Result<String, String> {
    let mut last = String::new();
    for _ in 0..10 {
        let out = std::process::Command::new(gpux_e2e::gpux())
            .arg("--data-dir")
            .arg(dir)
            .args([
                "rent",
                "gpu=l4",
                "--max-price",
                "5",
                "--duration",
                &duration_s.to_string(),
            ])
            .args(["--image", image, "--json", "--", "sh", "-c", TICKER])
            .output()
            .unwrap();
        if out.status.success() {
            let rented: gpux_api::Rented = serde_json::from_slice(&out.stdout).unwrap();
            return Ok(rented.lease);
        }
        last = String::from_utf8_lossy(&out.stderr).trim().to_string();
        std::thread::sleep(Duration::from_millis(700));
    }
    Err(last)
}

#[test]
fn kill_rounds_over_real_processes_keep_every_loss_rule() {
    let seed = std::env::var("GPUX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
    println!("chaos seed {seed} (GPUX_CHAOS_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let mut market = Market::start_with(3, 4, 3, ACK_GRACE_S);
    let started = Instant::now();

    // The kill schedule, in seconds from now: the ledger once (down longer than its release
    // grace), each host and each renter once (down 2 s: back before the other side gives up).
    let mut kills: Vec<(u64, Victim, u64)> =
        vec![(rng.range(4, 25), Victim::Ledger, LEDGER_GRACE_S + 3)];
    for h in 0..3 {
        kills.push((rng.range(15, 60), Victim::Host(h), 2));
    }
    for r in 0..3 {
        kills.push((rng.range(15, 60), Victim::Renter(r), 2));
    }
    kills.sort_by_key(|k| k.0);
    println!("kills (at s, victim, down s): {kills:?}");

    let durations: Vec<Vec<u64>> = (0..3)
        .map(|_| (0..LEASES_PER_RENTER).map(|_| rng.range(70, 90)).collect())
        .collect();
    // Renters rent while the kills go on: the renting threads use only the renters' data
    // dirs (through the CLI), the main thread kills and restarts nodes.
    let dirs: Vec<std::path::PathBuf> = market.renters.iter().map(|r| r.dir.clone()).collect();
    let image = market.image.clone();
    let mut outcomes: Vec<(usize, u64, Result<String, String>)> = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|r| {
                let (dir, image, durations) =
                    (dirs[r].clone(), image.clone(), durations[r].clone());
                s.spawn(move || {
                    durations
                        .into_iter()
                        .map(|d| (r, d, rent(&dir, &image, d)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (at, victim, down) in &kills {
            let wait = Duration::from_secs(*at).saturating_sub(started.elapsed());
            std::thread::sleep(wait);
            println!(
                "[{:>5.1}s] kill -9 {victim:?} for {down} s",
                started.elapsed().as_secs_f64()
            );
            let node = match victim {
                Victim::Host(h) => &mut market.hosts[*h],
                Victim::Renter(r) => &mut market.renters[*r],
                Victim::Ledger => &mut market.ledger,
            };
            node.kill9();
            std::thread::sleep(Duration::from_secs(*down));
            node.restart();
        }
        for h in handles {
            outcomes.extend(h.join().unwrap());
        }
    });
    println!("kills done after {:.1} s", started.elapsed().as_secs_f64());

    // Every lease ends and settles on both sides.
    let leases: Vec<&String> = outcomes.iter().filter_map(|o| o.2.as_ref().ok()).collect();
    assert!(
        leases.len() >= 10,
        "only {} leases were rented: {outcomes:?}",
        leases.len()
    );
    let host_view = |m: &Market, id: &str| -> Option<LeaseView> {
        m.hosts
            .iter()
            .flat_map(|h| h.leases())
            .find(|l| l.lease == id && l.role == Role::Host)
    };
    wait_for("every lease to settle on both sides", 150, || {
        market
            .renters
            .iter()
            .all(|r| r.leases().iter().all(|l| l.settled))
            && market
                .hosts
                .iter()
                .all(|h| h.leases().iter().all(|l| l.settled))
    });
    // Rents reported as failed (whatever their lease id, even those whose answer never came
    // back to the CLI) are never billed.
    for renter in &market.renters {
        for l in renter.leases() {
            let failed = matches!(l.end.as_deref(), Some("start-unconfirmed" | "not-started"));
            let paid = host_view(&market, &l.lease).map_or(0, |h| h.redeemed);
            println!(
                "renter lease {}: {} (paid {paid})",
                &l.lease[..12],
                l.end.as_deref().unwrap_or("-")
            );
            assert!(
                !failed || paid == 0,
                "a failed rent was billed {paid}: {l:?}"
            );
        }
    }

    // Each round's figures, and the rules.
    let per_second = 1000u64; // 3.60 credits per GPU-hour
    let bound_s = RECEIPT_INTERVAL_S + ACK_GRACE_S + 2;
    println!(
        "{:<14} {:>4} {:>8} {:>8} {:>8} {:>8} {:>7}  end (host / renter)",
        "lease", "dur", "ran ms", "paid", "acked", "max", "unpaid"
    );
    let mut failures = Vec::new();
    for (r, duration, outcome) in &outcomes {
        let id = match outcome {
            Ok(id) => id,
            Err(e) => {
                println!("{:<14} {duration:>4}  rent failed: {e}", "-");
                continue;
            }
        };
        let rented = market.renters[*r].lease(id);
        let Some(hosted) = host_view(&market, id) else {
            failures.push(format!("{id}: no host knows it"));
            continue;
        };
        let paid = hosted.redeemed;
        let acked = rented.acked_amount.max(hosted.acked_amount);
        let ran_ms = match (hosted.started_at, hosted.finished_at) {
            (Some(s), Some(f)) => f.saturating_sub(s),
            _ => 0,
        };
        let ran_s = (ran_ms / 1000).min(*duration);
        let max = if ran_ms > 0 {
            per_second * ran_s.max(60)
        } else {
            0
        };
        let unpaid_s = ran_s.saturating_sub(paid / per_second);
        println!(
            "{:<14} {duration:>4} {ran_ms:>8} {paid:>8} {acked:>8} {max:>8} {unpaid_s:>6}s  {} / {}",
            &id[..12],
            hosted.end.as_deref().unwrap_or("-"),
            rented.end.as_deref().unwrap_or("-")
        );
        if paid > max {
            failures.push(format!("{id}: paid {paid} for {ran_ms} ms (at most {max})"));
        }
        if paid > acked {
            failures.push(format!("{id}: paid {paid}, acknowledged {acked}"));
        }
        // The ledger's outage costs nothing acknowledged: what the renter acknowledged is paid.
        if paid < rented.acked_amount {
            failures.push(format!(
                "{id}: the renter acknowledged {} but the host got {paid}",
                rented.acked_amount
            ));
        }
        if unpaid_s > bound_s {
            failures.push(format!(
                "{id}: {unpaid_s} s of {ran_s} s unpaid (bound {bound_s} s)"
            ));
        }
        let failed = matches!(
            rented.end.as_deref(),
            Some("start-unconfirmed" | "not-started")
        );
        if failed && paid > 0 {
            failures.push(format!("{id}: a rent reported as failed was billed {paid}"));
        }
    }
    market.assert_conserved();
    assert_eq!(market.ledger_state().open_escrows, 0);
    println!(
        "chaos: {} rounds in {:.1} s",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
}
