//! The ledger killed at random moments, over many rounds, on a real sled on disk.
//!
//! A child process (this binary, with `GPUX_CRASH_CHILD` set) applies a deterministic
//! stream of operations (mints, escrow locks, redeemed receipts, releases) and prints
//! `ack N` after each answer; the parent kills it (SIGKILL) at a random moment, then, in
//! about half the rounds, damages the database's files at random offsets, and reopens:
//! - an undamaged round must open with exactly the state after the acknowledged operations
//!   (or one more: the operation in flight when the kill came may have landed);
//! - a damaged round must refuse to open, and `gpux ledger restore`'s code must then bring
//!   back exactly that state.
//!
//! `GPUX_CRASH_ROUNDS` (default 200) and `GPUX_CRASH_SEED` (default: from the clock,
//! printed) reproduce a run. A plain `harness = false` binary: the parent is `main`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpux_node::ledger::{LedgerConfig, LedgerService, restore};
use gpux_node::store::{NodeState, SledStore, Store};
use gpux_protocol::ledger_wire::{self, LedgerRequest, LedgerResponse};
use gpux_protocol::{
    BoundedBytes, ContentId, EscrowId, EscrowLock, Ext, Keypair, MicroCredits, Redeem, Release,
    Signed, Timestamp,
};
use gpux_testkit as kit;

const PRICE: MicroCredits = MicroCredits(3_600_000);

fn ledger_key() -> Keypair {
    Keypair::from_seed(&[7; 32])
}

fn config() -> LedgerConfig {
    LedgerConfig::default()
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn key_of(role: u8, k: u64) -> Keypair {
    let mut seed = [role; 32];
    seed[..8].copy_from_slice(&k.to_be_bytes());
    Keypair::from_seed(&seed)
}

/// Operation `i` of the stream (0-based), as the ledger would receive it at time `now(i)`.
enum Op {
    Mint(gpux_protocol::PublicKey, MicroCredits),
    Submit(Vec<u8>),
}

fn now(i: u64) -> Timestamp {
    Timestamp(1_000_000 + i * 1000)
}

fn op(i: u64) -> Op {
    let k = i / 4;
    let renter = key_of(1, k);
    let host = key_of(2, k % 3);
    let lease = ContentId(blake3::hash(&k.to_be_bytes()).into());
    let mut escrow = [0; 16];
    escrow[..8].copy_from_slice(&k.to_be_bytes());
    let escrow = EscrowId(escrow);
    let at = now(i);
    let signed = |bytes: &[u8]| Op::Submit(bytes.to_vec());
    match i % 4 {
        0 => Op::Mint(renter.public(), MicroCredits(1_000_000 + k)),
        1 => signed(
            Signed::sign(
                &renter,
                EscrowLock {
                    escrow,
                    lease,
                    payer: renter.public(),
                    payee: host.public(),
                    amount: MicroCredits(300_000),
                    price_per_gpu_hour: PRICE,
                    created_at: at,
                    ext: Ext::new(),
                },
            )
            .unwrap()
            .as_bytes(),
        ),
        2 => {
            let gpu_seconds = 10 + k % 50;
            let receipt = kit::sign(
                &host,
                kit::receipt(lease, escrow, PRICE, 1, gpu_seconds, at),
            );
            let ack = Signed::sign(
                &renter,
                gpux_protocol::ReceiptAck {
                    receipt: receipt.id(),
                    lease,
                    seq: 1,
                    amount_due: receipt.amount_due,
                    created_at: at,
                    ext: Ext::new(),
                },
            )
            .unwrap();
            signed(
                Signed::sign(
                    &host,
                    Redeem {
                        escrow,
                        lease,
                        receipt: BoundedBytes::new(receipt.as_bytes().to_vec()).unwrap(),
                        ack: BoundedBytes::new(ack.as_bytes().to_vec()).unwrap(),
                        created_at: at,
                        ext: Ext::new(),
                    },
                )
                .unwrap()
                .as_bytes(),
            )
        }
        _ => signed(
            Signed::sign(
                &host,
                Release {
                    escrow,
                    lease,
                    created_at: at,
                    ext: Ext::new(),
                },
            )
            .unwrap()
            .as_bytes(),
        ),
    }
}

/// Applies operation `i`; panics unless the ledger applied it.
fn apply<S: Store>(ledger: &mut LedgerService<S>, i: u64) {
    match op(i) {
        Op::Mint(account, amount) => {
            ledger.mint(account, amount, now(i)).unwrap();
        }
        Op::Submit(envelope) => {
            let frame = ledger_wire::encode(&LedgerRequest::Submit(envelope));
            match ledger.handle(&frame, now(i)) {
                LedgerResponse::Record(_) => {}
                other => panic!("operation {i} was not applied: {other:?}"),
            }
        }
    }
}

fn open(dir: &Path) -> Result<LedgerService<SledStore>, String> {
    let state = NodeState::open(dir).map_err(|e| e.to_string())?;
    LedgerService::open(ledger_key(), state, config()).map_err(|e| e.to_string())
}

/// The child: apply operations from where the log stands, saying `ack N` after each.
fn child(dir: &Path) {
    use std::io::Write;
    let mut ledger = open(dir).expect("the child opens the ledger");
    let mut out = std::io::stdout().lock();
    let start = ledger.applied();
    writeln!(out, "ready {start}").unwrap();
    out.flush().unwrap();
    for i in start..start + 100_000 {
        apply(&mut ledger, i);
        writeln!(out, "ack {}", i + 1).unwrap();
        out.flush().unwrap();
    }
}

/// The expected state after `n` operations, as text (every balance and escrow).
struct Expected {
    ledger: LedgerService<gpux_node::store::MemStore>,
}
impl Expected {
    fn at(&mut self, n: u64) -> String {
        while self.ledger.applied() < n {
            let i = self.ledger.applied();
            apply(&mut self.ledger, i);
        }
        assert_eq!(
            self.ledger.applied(),
            n,
            "the expected ledger only moves forward"
        );
        format!("{:?}", self.ledger.ledger())
    }
}

/// Where `needle` occurs in `hay`.
fn occurrences(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return Vec::new();
    }
    (0..=hay.len() - needle.len())
        .filter(|&i| hay[i] == needle[0] && &hay[i..i + needle.len()] == needle)
        .collect()
}

/// The envelope operation `i` stored, if it is one.
fn envelope(i: u64) -> Option<Vec<u8>> {
    match op(i) {
        Op::Submit(bytes) => Some(bytes),
        Op::Mint(..) => None,
    }
}

/// How a round damaged the files.
struct Harm {
    what: String,
    /// The damage hit stored data: the ledger must refuse. Otherwise (stray bit rot in
    /// sled's metadata or free space) it may open, but only with exactly the acknowledged
    /// state.
    hits_data: bool,
}

/// Damages the database at random, in the ways a disk and an operator do: bits flipped
/// inside stored entries (every place sled keeps them), the log file cut short below its
/// data, a file or the whole database removed, or stray bits flipped anywhere sled wrote.
fn damage(dir: &Path, acked: u64, rng: &mut Rng) -> Harm {
    let db = dir.join("db");
    let log = db.join("db");
    let kind = rng.below(10);
    let stored: Vec<u64> = (0..acked).filter(|&i| envelope(i).is_some()).collect();
    let data = |what: String| Harm {
        what,
        hits_data: true,
    };
    if stored.is_empty() || kind == 0 {
        // sled writes `conf` again from its settings: losing it loses no data.
        let victim = [db.join("db"), db.join("conf"), db.clone()][rng.below(3) as usize].clone();
        if victim.is_dir() {
            std::fs::remove_dir_all(&victim).unwrap();
        } else {
            std::fs::remove_file(&victim).unwrap();
        }
        return Harm {
            what: format!("removed {}", victim.strip_prefix(dir).unwrap().display()),
            hits_data: !victim.ends_with("conf"),
        };
    }
    let mut bytes = std::fs::read(&log).unwrap();
    match kind {
        1 | 2 => {
            // Cut below the end of the latest entry's last copy.
            let last = envelope(*stored.last().unwrap()).unwrap();
            let end = occurrences(&bytes, &last)
                .last()
                .map_or(bytes.len(), |&at| at + last.len());
            let at = rng.below(end as u64);
            bytes.truncate(at as usize);
            std::fs::write(&log, &bytes).unwrap();
            data(format!(
                "cut db/db to {at} bytes (the latest entry ended at {end})"
            ))
        }
        3 => {
            let used: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] != 0).collect();
            let mut at = Vec::new();
            for _ in 0..1 + rng.below(4) {
                let i = used[rng.below(used.len() as u64) as usize];
                bytes[i] ^= 1 << rng.below(8);
                at.push(i);
            }
            std::fs::write(&log, &bytes).unwrap();
            Harm {
                what: format!("flipped stray bits in db/db at {at:?}"),
                hits_data: false,
            }
        }
        _ => {
            let i = stored[rng.below(stored.len() as u64) as usize];
            let entry = envelope(i).unwrap();
            let offset = rng.below(entry.len() as u64) as usize;
            let bit = 1 << rng.below(8);
            let places = occurrences(&bytes, &entry);
            assert!(!places.is_empty(), "entry {i} is stored in db/db");
            for at in &places {
                bytes[at + offset] ^= bit;
            }
            std::fs::write(&log, &bytes).unwrap();
            data(format!(
                "flipped a bit at byte {offset} of entry {i} in its {} places in db/db",
                places.len()
            ))
        }
    }
}

fn main() {
    if let Some(dir) = std::env::var_os("GPUX_CRASH_CHILD") {
        child(Path::new(&dir));
        return;
    }
    // `cargo test` passes harness flags (`--nocapture`, a filter, `--list`): a listing
    // names the one test; a filter that is not ours runs nothing.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("ledger_crash: test");
        return;
    }
    if let Some(filter) = args.iter().find(|a| !a.starts_with('-'))
        && !"ledger_crash".contains(filter.as_str())
    {
        return;
    }
    let rounds: u64 = std::env::var("GPUX_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed: u64 = std::env::var("GPUX_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("ledger crash test: {rounds} rounds, GPUX_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut expected = Expected {
        ledger: LedgerService::open(ledger_key(), NodeState::in_memory(), config()).unwrap(),
    };
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let (mut acked, mut undamaged, mut damaged, mut in_flight_landed) = (0u64, 0, 0, 0);
    let (mut refused, mut stray, mut stray_harmless) = (0, 0, 0);
    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .env("GPUX_CRASH_CHILD", dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut last = None;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line
                    .strip_prefix("ack ")
                    .or_else(|| line.strip_prefix("ready "))
                {
                    last = n.parse::<u64>().ok();
                }
            }
            last
        });
        // Open takes a few ms, each operation a few more: kills land in both.
        std::thread::sleep(Duration::from_micros(2_000 + rng.below(60_000)));
        child.kill().unwrap();
        child.wait().unwrap();
        if let Some(n) = reader.join().unwrap() {
            assert!(
                n >= acked,
                "round {round}: the child started below what was acked"
            );
            acked = n;
        }
        let want = expected.at(acked);
        let harm = (acked > 0 && rng.below(2) == 1).then(|| damage(dir, acked, &mut rng));
        let ledger = match &harm {
            None => open(dir).unwrap_or_else(|e| {
                panic!("round {round} (seed {seed}): an undamaged ledger refused to open: {e}")
            }),
            Some(Harm { what, hits_data }) => match open(dir) {
                Ok(ledger) if !hits_data => {
                    stray_harmless += 1;
                    ledger
                }
                Ok(ledger) => panic!(
                    "round {round} (seed {seed}): the ledger opened after the damage ({what}) with {} entries (acked {acked})",
                    ledger.applied()
                ),
                Err(_) => {
                    let restored =
                        restore(dir, None, &ledger_key(), config()).unwrap_or_else(|e| {
                            panic!("round {round} (seed {seed}): restore after {what} failed: {e}")
                        });
                    assert!(restored.entries >= acked);
                    refused += 1;
                    open(dir).unwrap_or_else(|e| {
                        panic!(
                            "round {round} (seed {seed}): the restored ledger refused to open: {e}"
                        )
                    })
                }
            },
        };
        let applied = ledger.applied();
        let state = format!("{:?}", ledger.ledger());
        drop(ledger);
        if applied == acked + 1 {
            // The operation in flight at the kill was flushed before its answer went out.
            in_flight_landed += 1;
            acked += 1;
            assert_eq!(state, expected.at(acked), "round {round} (seed {seed})");
        } else {
            assert_eq!(
                applied,
                acked,
                "round {round} (seed {seed}): {applied} entries after {acked} were acknowledged ({:?})",
                harm.as_ref().map(|h| &h.what)
            );
            assert_eq!(state, want, "round {round} (seed {seed})");
        }
        match &harm {
            Some(h) if h.hits_data => damaged += 1,
            Some(_) => stray += 1,
            None => undamaged += 1,
        }
        // Old damaged databases would fill the disk over many rounds.
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("db.damaged-")
            {
                std::fs::remove_dir_all(entry.path()).unwrap();
            }
        }
    }
    println!(
        "ledger crash test: {rounds} rounds in {:.1} s: {undamaged} undamaged rounds restarted exactly; \
         {damaged} rounds with stored data damaged all refused; {stray} with stray bits flipped \
         ({stray_harmless} opened exactly, the rest refused); {refused} refusals all restored exactly; \
         {acked} operations acknowledged, {in_flight_landed} kills after a flush and before the answer; \
         0 rounds with less than acknowledged",
        started.elapsed().as_secs_f64()
    );
}
