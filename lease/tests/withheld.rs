//! What a running host withholds (`gpux host pause`, `drain --until`, a failed GPU), as a
//! rule of the pure `HostBook`: a deterministic simulator sends requests for random GPUs
//! and kinds while the host pauses, resumes, drains, fails GPUs and has them checked again,
//! in a random order. The property: no lease is accepted while the host is paused, on a
//! failed GPU or a MIG slice of one, or ending after the drain time; and once nothing is
//! withheld, a request for a free GPU is accepted. A failing schedule prints its seed;
//! `GPUX_SIM_SEED=<seed>` replays it.

use gpux_lease::{Answer, HostBook, Timing, Withheld};
use gpux_protocol::*;

use crate::rules::{T0, host, offer, request_by};
use crate::sim::Rng;

/// GPUs the host offers: 0..6 whole, 6 and 7 MIG slices of GPU 0.
fn gpu(i: u8) -> GpuUuid {
    GpuUuid::Gpu([i + 40; 16])
}

fn slice(i: u8) -> GpuUuid {
    GpuUuid::Mig([i + 90; 16])
}

fn run(seed: u64) -> Result<usize, String> {
    let mut rng = Rng::new(seed);
    let mut body = offer(T0).body().clone();
    body.gpus = BoundedVec::new(
        (0..6)
            .map(|i| OfferGpu {
                uuid: gpu(i),
                ..body.gpus[0].clone()
            })
            .collect(),
    )
    .unwrap();
    let offered = Signed::sign(&host(), body.clone()).unwrap();
    // GPU 0's two MIG slices, offered apart.
    body.slot = 1;
    body.seq = 2;
    body.gpus = BoundedVec::new(
        (0..2)
            .map(|i| OfferGpu {
                uuid: slice(i),
                memory_bytes: 10 << 30,
                ..body.gpus[0].clone()
            })
            .collect(),
    )
    .unwrap();
    body.terms.mig_profile = Some(BoundedString::new("1g.10gb").unwrap());
    let slices = Signed::sign(&host(), body).unwrap();
    let mut book = HostBook::new(host(), Timing::default());
    book.set_mig_layout([(gpu(0), slice(0)), (gpu(0), slice(1))]);
    book.add_offer(offered.clone(), Timestamp(T0));
    book.add_offer(slices.clone(), Timestamp(T0));
    let mut withheld = Withheld::default();
    let mut accepted = 0;
    for step in 0..200u64 {
        let t = T0 + 1 + step * 100;
        match rng.range(0, 9) {
            0 => withheld.paused = !withheld.paused,
            1 => {
                let g = gpu(rng.range(0, 5) as u8);
                if !withheld.failed.insert(g) {
                    withheld.failed.remove(&g);
                }
            }
            2 => {
                withheld.drain_until = if withheld.drain_until.is_some() {
                    None
                } else {
                    Some(Timestamp(t + rng.range(0, 240) * 1000))
                }
            }
            _ => {}
        }
        book.set_withheld(withheld.clone());
        let renter = Keypair::from_seed(&[(step % 200) as u8 + 1; 32]);
        let (device, of) = if rng.chance(20) {
            (slice(rng.range(0, 1) as u8), &slices)
        } else {
            (gpu(rng.range(0, 5) as u8), &offered)
        };
        let request = request_by(&renter, of, device, t, LeaseKind::OnDemand);
        let end = Timestamp(t + u64::from(request.duration_s) * 1000);
        let on_failed = withheld.failed.contains(&device)
            || (device == slice(0) || device == slice(1)) && withheld.failed.contains(&gpu(0));
        let barred =
            withheld.paused || on_failed || withheld.drain_until.is_some_and(|until| end > until);
        match book.handle_request(request, Timestamp(t), false) {
            Answer::Accepted { lease, .. } => {
                if barred {
                    return Err(format!(
                        "step {step}: accepted {device} at {t} while withheld: {withheld:?}"
                    ));
                }
                accepted += 1;
                // It ends at once: its GPU is free for the next request.
                book.release(&lease.id());
            }
            Answer::Rejected { .. } if !barred && withheld == Withheld::default() => {
                // Nothing withheld, every GPU free: a refusal is the rule failing the
                // other way. (A slice refused with its GPU leased cannot happen: every lease
                // is released at once.)
                return Err(format!(
                    "step {step}: {device} refused with nothing withheld"
                ));
            }
            _ => {}
        }
    }
    Ok(accepted)
}

#[test]
fn a_host_never_leases_what_it_withholds() {
    let seeds: Vec<u64> = match std::env::var("GPUX_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => (0..300).collect(),
    };
    let mut accepted = 0;
    for seed in seeds {
        match run(seed) {
            Ok(n) => accepted += n,
            Err(why) => panic!("schedule {seed}: {why} (rerun with GPUX_SIM_SEED={seed})"),
        }
    }
    assert!(accepted > 1000, "only {accepted} leases accepted in all");
}
