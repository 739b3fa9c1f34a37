//! A challenge a machine runs on its own GPU with the CUDA prover (`gpux attest challenge`,
//! `scripts/gpu-check`): the same fill, product, picks and checks a renter runs, timed by
//! the machine's own clock, against the reference of the model the driver names. It shows
//! a host (and the project) what its GPUs sustain, and checks the kernels against the CPU:
//! every picked row and block is verified by the CPU code a renter runs.
//!
//! Timed here, the figures are the prover's alone (no network, no renter); a renter's
//! clock adds a round trip.

use std::time::{Duration, Instant};

use super::fill::{self, FillPolicy, FillShape};
use super::gpu::{Device, GpuError};
use super::{Policy, Timed, shape_for};
use crate::spec::{FILL_SHARE_OF_MEMORY, GpuSpec};

/// One measure of a local challenge.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measured {
    /// What was computed (`m x k x n`, or `LANES lanes x BLOCKS blocks`).
    pub work: String,
    /// Bytes (the fill) or operations (the product).
    pub amount: f64,
    /// Seconds, from the first launch to the root back on the host.
    pub seconds: f64,
    /// Gop/s (the product) or GB/s of traffic (the fill).
    pub rate: f64,
    /// The model's reference rate (`None`: the driver's name is not in the spec table).
    pub reference: Option<f64>,
    /// `rate / reference`.
    pub share: Option<f64>,
    /// `None`: checked and fast enough; otherwise why not (the check's own words).
    pub failed: Option<String>,
}

/// A local challenge of one GPU.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LocalChallenge {
    /// The model the driver names, when the spec table knows it.
    pub model: Option<String>,
    /// The memory fill (failed on memory when the device had no room for it).
    pub fill: Measured,
    /// The INT8 product.
    pub product: Measured,
    /// Whether every measure was checked and reached 90% of its reference.
    pub passed: bool,
}

/// The product's rate assumed to size the work when the model is unknown (Gop/s).
const UNKNOWN_GOPS: f64 = 100_000.0;

/// Runs the challenge on `device` as a renter of `spec` would (the claimed memory filled,
/// a product lasting at least `at_least` at the reference), with fresh randomness. A fill
/// that does not fit the device fails the memory measure; the product still runs.
pub fn run(
    device: &Device,
    spec: Option<&GpuSpec>,
    at_least: Duration,
) -> Result<LocalChallenge, GpuError> {
    let seed: [u8; 32] = *blake3::hash(&nanos().to_le_bytes()).as_bytes();
    let coins: [u8; 32] = *blake3::keyed_hash(&seed, b"coins").as_bytes();
    let memory = spec.map_or(device.info.memory_bytes as f64, |s| {
        f64::from(s.vram_gb) * 1e9
    });
    let fill_shape = FillShape::for_bytes((memory * FILL_SHARE_OF_MEMORY) as u64);
    let filled = match timed(|| device.fill(&seed, fill_shape)) {
        Ok(filled) => Ok(filled),
        Err(GpuError::Memory(why)) => Err(why),
        Err(e) => return Err(e),
    };
    // The fill stays on the device while the product runs, as in a renter's challenge.
    let product = product(device, spec, at_least, &seed, &coins);
    let fill = match filled {
        Ok((filled, seconds)) => {
            let picks = fill::pick_blocks(&coins, fill_shape, &FillPolicy::default());
            let openings = filled.open(&picks)?;
            let reference = spec.map(GpuSpec::fill_gbs);
            let failed = fill::verify_fill(
                &seed,
                fill_shape,
                &filled.root,
                &openings,
                Timed {
                    observed: Duration::from_secs_f64(seconds),
                    reference: reference.unwrap_or(1.0),
                },
                &FillPolicy {
                    min_share: judged(spec, FillPolicy::default().min_share),
                    ..FillPolicy::default()
                },
                &coins,
            )
            .err()
            .map(|e| e.to_string());
            let rate = fill_shape.traffic() / seconds / 1e9;
            Measured {
                work: format!("{} lanes x {} blocks", fill_shape.lanes, fill_shape.blocks),
                amount: fill_shape.bytes() as f64,
                seconds,
                rate,
                reference,
                share: reference.map(|r| rate / r),
                failed,
            }
        }
        Err(why) => Measured {
            work: "none".into(),
            amount: 0.0,
            seconds: 0.0,
            rate: 0.0,
            reference: spec.map(GpuSpec::fill_gbs),
            share: None,
            failed: Some(format!("memory: {why}")),
        },
    };
    let passed = spec.is_some() && product.failed.is_none() && fill.failed.is_none();
    Ok(LocalChallenge {
        model: spec.map(|s| s.model.to_string()),
        fill,
        product,
        passed,
    })
}

/// The policy's least share when the model is known; nothing is judged (0) without a
/// reference.
fn judged(spec: Option<&GpuSpec>, min_share: f64) -> f64 {
    if spec.is_some() { min_share } else { 0.0 }
}

/// The product measured: proved, its picked rows opened and checked by the CPU, its rate
/// against the reference (a GPU error is the measure's failure).
fn product(
    device: &Device,
    spec: Option<&GpuSpec>,
    at_least: Duration,
    seed: &[u8; 32],
    coins: &[u8; 32],
) -> Measured {
    let gops = spec.map_or(UNKNOWN_GOPS, |s| s.challenge_gops);
    let shape = shape_for(gops, at_least);
    let policy = Policy {
        min_share: judged(spec, Policy::default().min_share),
        ..Policy::default()
    };
    let (seconds, failed) = match timed(|| device.prove(seed, shape)) {
        Ok((proved, seconds)) => {
            let checked = proved
                .open(&super::pick_rows(coins, shape.m, &policy))
                .map_err(|e| e.to_string())
                .and_then(|opened| {
                    let timed = Timed {
                        observed: Duration::from_secs_f64(seconds),
                        reference: gops,
                    };
                    super::verify(seed, shape, &proved.root, &opened, timed, &policy, coins)
                        .map_err(|e| e.to_string())
                });
            (seconds, checked.err())
        }
        Err(e) => (0.0, Some(e.to_string())),
    };
    let rate = if seconds > 0.0 {
        shape.operations() / seconds / 1e9
    } else {
        0.0
    };
    let reference = spec.map(|s| s.challenge_gops);
    Measured {
        work: shape.to_string(),
        amount: shape.operations(),
        seconds,
        rate,
        reference,
        share: reference.map(|r| rate / r),
        failed,
    }
}

fn timed<T>(work: impl FnOnce() -> Result<T, GpuError>) -> Result<(T, f64), GpuError> {
    let started = Instant::now();
    let done = work()?;
    Ok((done, started.elapsed().as_secs_f64().max(1e-9)))
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
