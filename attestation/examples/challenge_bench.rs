//! The challenge's costs at the shapes a renter asks: the CPU provers' time, the renter's
//! verification time (one core) and what it downloads, for the product and for the memory
//! fill.
//!
//! `cargo run --release -p gpux-attestation --example challenge_bench`
//!
//! For a GPU's shape the CPU cannot compute all `m` rows in a benchmark's time, so the
//! prover computes the first 256 rows of the same `k × n` (the verifier's work depends on
//! `k`, `n` and the rows it picks, not on `m`, except for the Merkle paths: 32 bytes and one
//! hash per level, counted for the full `m` in the bytes printed).

use std::time::{Duration, Instant};

use gpux_attestation::challenge::{Policy, Shape, Timed, pick_rows, prove_cpu, shape_for, verify};
use gpux_attestation::spec_for_name;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let policy = Policy::default();
    let h100 = spec_for_name("NVIDIA H100 80GB HBM3").expect("the H100 is in the table");
    let l4 = spec_for_name("NVIDIA L4").expect("the L4 is in the table");
    let cases = [
        (
            "fake GPU (CPU prover, 0.5 Gop/s reference, 40 ms)",
            shape_for(0.5, Duration::from_millis(40)),
        ),
        (
            "fake GPU (CPU prover, 50 Gop/s reference, 0.1 s)",
            shape_for(50.0, Duration::from_millis(100)),
        ),
        (
            "an L4 for 1 s",
            shape_for(l4.challenge_gops, Duration::from_secs(1)),
        ),
        (
            "an H100 SXM for 1 s",
            shape_for(h100.challenge_gops, Duration::from_secs(1)),
        ),
    ];
    println!(
        "| challenge | shape | prover rows | CPU prover | CPU Gop/s | verify (median of 5) | downloaded |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (what, shape) in cases {
        let rows = shape.m.min(256);
        let proved = Shape::new(rows, shape.k, shape.n).expect("a valid shape");
        let seed = [3u8; 32];
        let committed = prove_cpu(&seed, proved);
        let gops = proved.operations() / committed.elapsed.as_secs_f64() / 1e9;
        let times: Vec<Duration> = (0..5u8)
            .map(|i| {
                let coins = [i; 32];
                let opened = committed.open(&pick_rows(&coins, proved.m, &policy));
                let started = Instant::now();
                verify(
                    &seed,
                    proved,
                    &committed.root,
                    &opened,
                    Timed {
                        observed: Duration::from_secs(1),
                        reference: 1e-9,
                    },
                    &policy,
                    &coins,
                )
                .expect("the honest prover passes");
                started.elapsed()
            })
            .collect();
        let bytes = shape.opened_bytes(policy.rows);
        println!(
            "| {what} | {shape} | {rows} | {:.2} s | {gops:.1} | {:.1} ms | {:.1} KiB |",
            committed.elapsed.as_secs_f64(),
            median(times).as_secs_f64() * 1000.0,
            bytes as f64 / 1024.0
        );
    }
    fill_bench();
}

/// The fill: an H100 80GB's (72 GB) cannot be filled by a CPU in a benchmark's time, so the
/// CPU fills 256 MiB with the same lane layout; the renter's check (64 blocks, each with its
/// two inputs and three paths) does not depend on the size but for the paths' length, which
/// the bytes count for the full fill.
fn fill_bench() {
    use gpux_attestation::challenge::fill::{
        FillPolicy, FillShape, fill_cpu, pick_blocks, verify_fill,
    };
    let policy = FillPolicy::default();
    println!();
    println!(
        "| fill | CPU fill | CPU GB/s (traffic) | renter's check (median of 5) | downloaded for the full fill |"
    );
    println!("|---|---|---|---|---|");
    let full = FillShape::for_bytes((80e9 * 0.9) as u64);
    let proved = FillShape::for_bytes(256 << 20);
    let seed = [5u8; 32];
    let filled = fill_cpu(&seed, proved, u64::MAX);
    let times: Vec<Duration> = (0..5u8)
        .map(|i| {
            let coins = [i; 32];
            let openings = filled.open(&pick_blocks(&coins, proved, &policy));
            let started = Instant::now();
            verify_fill(
                &seed,
                proved,
                &filled.root,
                &openings,
                Timed {
                    observed: Duration::from_secs(1),
                    reference: 1e-9,
                },
                &policy,
                &coins,
            )
            .expect("the honest fill passes");
            started.elapsed()
        })
        .collect();
    let leaves = u64::from(full.lanes) * u64::from(full.blocks);
    let depth = u64::from(leaves.next_power_of_two().trailing_zeros());
    let bytes = policy.blocks as u64 * 3 * (1024 + 32 * depth);
    println!(
        "| an H100 80GB's 90% ({} lanes x {} blocks; CPU: {} x {}) | {:.2} s | {:.2} | {:.2} ms | {:.1} KiB |",
        full.lanes,
        full.blocks,
        proved.lanes,
        proved.blocks,
        filled.elapsed.as_secs_f64(),
        proved.traffic() / filled.elapsed.as_secs_f64() / 1e9,
        median(times).as_secs_f64() * 1000.0,
        bytes as f64 / 1024.0
    );
}
