//! What `gpux host check` measures beyond the checks: the machine as the offer will give it
//! to leases (CPU, memory, the workspace disk's write speed), the performance challenge run
//! against itself, and the first offer the node would publish (docs/host.md).

use std::path::Path;

use gpux_protocol::Attestation;

/// Challenge shape for the self-test: the product a renter's challenge of a fake GPU uses.
const SELF_TEST: gpux_attestation::challenge::Shape = gpux_attestation::challenge::Shape {
    m: 256,
    k: 1024,
    n: 256,
};
/// Below this, renters' datasets and checkpoints load slowly.
const SLOW_DISK_MBPS: u32 = 200;

/// One measured line: what, what it found, and whether it is only a warning.
pub(crate) struct Measure {
    pub(crate) what: &'static str,
    pub(crate) found: String,
    pub(crate) warn: Option<&'static str>,
}

/// The node's settings for this data directory, when it is set up to host.
fn host_options(dir: &Path) -> Result<gpux_node::daemon::HostOptions, String> {
    let config = gpux_node::config::resolve(dir, &gpux_node::config::Options::default())
        .map_err(|e| e.to_string())?;
    config
        .host
        .ok_or_else(|| "config.toml does not make this node a host (host = true)".to_string())
}

/// The machine, the workspace disk, the challenge self-test and the first offer, for a
/// host whose GPUs read as `attestation` (none: the driver did not read them).
pub(crate) fn measure(dir: &Path, attestation: Option<&Attestation>) -> Vec<Measure> {
    let options = host_options(dir);
    let (cpus, memory) = options
        .as_ref()
        .map_or((None, None), |o| (o.cpus, o.memory_bytes));
    let machine = gpux_node::machine::MachineFacts::read(cpus, memory).snapshot();
    let mut out = vec![Measure {
        what: "machine",
        found: format!(
            "{} threads ({}), {} of memory for leases",
            machine.cpu_threads,
            machine.cpu_model,
            bytesize::ByteSize(machine.memory_bytes)
        ),
        warn: None,
    }];
    let workspaces = options
        .as_ref()
        .map_or_else(|_| dir.join("workspaces"), |o| o.workspace_root.clone());
    out.push(match gpux_node::machine::measure_disk_write(&workspaces) {
        Ok(mbps) => Measure {
            what: "workspace disk",
            found: format!("writes {mbps} MB/s at {}", workspaces.display()),
            warn: (mbps < SLOW_DISK_MBPS).then_some(
                "a faster disk for the data directory (an NVMe SSD writes over 1,000 MB/s)",
            ),
        },
        Err(e) => Measure {
            what: "workspace disk",
            found: format!("cannot write at {}: {e}", workspaces.display()),
            warn: Some("make the data directory writable by the node's user"),
        },
    });
    out.push(Measure {
        what: "bandwidth",
        found: "measured by the running node against its bootstrap peers (perf protocol; \
                its log says 'bandwidth to peers') and published in its offers"
            .into(),
        warn: None,
    });
    out.push(self_test(options.as_ref().is_ok_and(|o| o.fake_gpus)));
    out.push(first_offer(&options, attestation, &machine));
    out
}

/// The performance challenge run against this machine: the CPU prover a fake GPU answers
/// with, its product checked as a renter checks it.
fn self_test(fake_gpus: bool) -> Measure {
    use gpux_attestation::challenge;
    let (seed, coins) = ([0x5e; 32], [0x11; 32]);
    let shape = SELF_TEST;
    let mut proof = challenge::prove_cpu(&seed, shape);
    for _ in 0..2 {
        let again = challenge::prove_cpu(&seed, shape);
        if again.elapsed < proof.elapsed {
            proof = again;
        }
    }
    let gops = shape.operations() / proof.elapsed.as_secs_f64().max(1e-9) / 1e9;
    // Checked with a reference it meets: the point is the product, not the rate.
    let policy = challenge::Policy::default();
    let opened = proof.open(&challenge::pick_rows(&coins, shape.m, &policy));
    let verdict = challenge::verify(
        &seed,
        shape,
        &proof.root,
        &opened,
        challenge::Timed {
            observed: proof.elapsed,
            reference: gops * 0.5,
        },
        &policy,
        &coins,
    );
    let prover = if fake_gpus {
        "the CPU prover that answers for fake GPUs"
    } else {
        "the CPU prover (real GPUs have no prover yet: their offers stay self-reported until \
         the CUDA prover lands)"
    };
    match verdict {
        Ok(_) => Measure {
            what: "challenge self-test",
            found: format!("{prover}: {gops:.2} Gop/s ({shape} INT8 product), rows checked"),
            warn: None,
        },
        Err(e) => Measure {
            what: "challenge self-test",
            found: format!("{prover}: its own product did not check: {e}"),
            warn: Some("report this: the challenge code is broken on this machine"),
        },
    }
}

/// The offer the node would publish first, from its settings and the GPUs the driver read.
fn first_offer(
    options: &Result<gpux_node::daemon::HostOptions, String>,
    attestation: Option<&Attestation>,
    machine: &gpux_protocol::Machine,
) -> Measure {
    let what = "first offer";
    let o = match options {
        Ok(o) => o,
        Err(e) => {
            return Measure {
                what,
                found: format!("none: {e}"),
                warn: Some("run `gpux host install` (or write config.toml) to set a price"),
            };
        }
    };
    let Some(att) = attestation else {
        return Measure {
            what,
            found: "none: the driver read no GPU".into(),
            warn: Some("fix the NVIDIA driver check above"),
        };
    };
    let mut models: Vec<(String, usize)> = Vec::new();
    for g in att.gpus.iter() {
        match models.iter_mut().find(|(name, _)| *name == g.name.as_str()) {
            Some((_, n)) => *n += 1,
            None => models.push((g.name.to_string(), 1)),
        }
    }
    let gpus = models
        .iter()
        .map(|(name, n)| format!("{n} x {name}"))
        .collect::<Vec<_>>()
        .join(", ");
    let per_gpu = att.gpus.len().max(1) as u64;
    Measure {
        what,
        found: format!(
            "{gpus} at {} credits per GPU-hour{}, region {}, leases of {} s to {} s; each GPU \
             with {} CPU threads and {} of memory",
            o.price.amount_text(),
            o.spot_floor
                .map(|f| format!(" (spot from {})", f.amount_text()))
                .unwrap_or_default(),
            if o.region.is_empty() {
                "unset"
            } else {
                &o.region
            },
            o.min_duration_s,
            o.max_duration_s,
            (u64::from(machine.cpu_threads) / per_gpu).max(1),
            bytesize::ByteSize(machine.memory_bytes / per_gpu),
        ),
        warn: None,
    }
}
