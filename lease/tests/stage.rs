//! The staging simulator: random images staged on a host by [`StageCheck`], with layers in
//! the host's store (its own, or only through another renter's image), bytes an earlier
//! staging left on disk, configs that are not the image's, bytes damaged on the way, and
//! renters that claim a layer they do not have. A model of `docker load` loads what the
//! tar holds (it checks the layers it lacks, and skips unread those it has). Checked:
//! nothing damaged is kept or loaded, the tar is only completed when every layer in it
//! verified, and an image held for a renter is made only of bytes it sent or the host had.

use gpux_lease::{
    LayerOnDisk, LayerStored, StageCheck, StageInput, StageLayerSpec, StageNext, StageSide,
};

use crate::sim::Rng;

/// A layer's content, abstractly; its digests follow from it.
type Content = u64;

fn sha(c: Content) -> [u8; 32] {
    let mut d = [1u8; 32];
    d[..8].copy_from_slice(&c.to_le_bytes());
    d
}

fn blake(c: Content) -> [u8; 32] {
    let mut d = [2u8; 32];
    d[..8].copy_from_slice(&c.to_le_bytes());
    d
}

struct Layer {
    /// What the renter says it is (its diff id names this).
    claimed: Content,
    /// What the renter sends.
    sent: Content,
    stored: LayerStored,
    on_disk: LayerOnDisk,
}

#[derive(Debug, Default)]
struct Counts {
    held: usize,
    refused: usize,
    lies_caught: usize,
    damage_caught: usize,
}

fn run(seed: u64, counts: &mut Counts) -> Result<(), (String, Vec<String>)> {
    let mut rng = Rng::new(seed);
    let mut next_content = 1000;
    let layers: Vec<Layer> = (0..rng.range(1, 6))
        .map(|_| {
            next_content += 1;
            let claimed = next_content;
            // A renter that claims a layer it does not have sends other bytes under its id.
            let lie = rng.chance(10);
            let stored = match rng.range(0, 2) {
                0 => LayerStored::Yes,
                1 => LayerStored::Foreign,
                _ => LayerStored::No,
            };
            let on_disk = match rng.range(0, 3) {
                0 => LayerOnDisk::Whole,
                1 => LayerOnDisk::Part(rng.range(0, 1200)),
                _ => LayerOnDisk::Nothing,
            };
            Layer {
                claimed,
                sent: if lie { claimed + 500_000 } else { claimed },
                stored,
                on_disk,
            }
        })
        .collect();
    let image = [9u8; 32];
    let specs: Vec<StageLayerSpec> = layers
        .iter()
        .map(|l| StageLayerSpec {
            diff_id: sha(l.claimed),
            blake3: blake(l.sent),
            bytes: 1000,
        })
        .collect();
    let found: Vec<_> = layers.iter().map(|l| (l.stored, l.on_disk)).collect();
    let (mut check, mut step) = StageCheck::new(image, specs.clone(), &found);
    let mut trace = vec![format!("{found:?}")];
    // What the tar holds, by layer: the content written, and whether it arrived damaged.
    let mut tar: Vec<(usize, Content, bool)> = Vec::new();
    let mut last_arrived: Option<(usize, bool)> = None;
    let result = (|| {
        for _ in 0..100 {
            trace.push(format!("{step:?}"));
            for side in &step.side {
                match *side {
                    StageSide::Keep(i) => {
                        if last_arrived == Some((i, true)) {
                            return Err(format!("kept layer {i}'s damaged bytes"));
                        }
                    }
                    StageSide::Drop(_) => {}
                }
            }
            let input = match step.next.clone() {
                StageNext::Config => {
                    let id = if rng.chance(95) { image } else { [8u8; 32] };
                    let mut diff_ids: Vec<[u8; 32]> = specs.iter().map(|s| s.diff_id).collect();
                    if rng.chance(5) {
                        diff_ids.reverse();
                        diff_ids.push([7u8; 32]);
                    }
                    StageInput::Config { id, diff_ids }
                }
                StageNext::Layer {
                    index,
                    from,
                    sha256,
                } => {
                    let layer = &layers[index];
                    let damaged = from.is_some() && rng.chance(10);
                    let content = if damaged { layer.sent + 1 } else { layer.sent };
                    last_arrived = Some((index, damaged));
                    tar.push((index, content, damaged));
                    StageInput::Layer {
                        blake3: from.map(|_| blake(content)),
                        sha256: sha256.then(|| sha(content)),
                    }
                }
                StageNext::Finish => {
                    // The tar is complete: everything in it must have verified.
                    if let Some((i, _, _)) = tar.iter().find(|(_, _, damaged)| *damaged) {
                        return Err(format!("completed a tar with layer {i}'s damaged bytes"));
                    }
                    // Docker checks the layers it lacks and skips those it has.
                    let present = layers.iter().enumerate().all(|(i, l)| match l.stored {
                        LayerStored::Yes | LayerStored::Foreign => true,
                        LayerStored::No => tar
                            .iter()
                            .any(|(t, content, _)| *t == i && sha(*content) == sha(l.claimed)),
                    });
                    StageInput::Loaded(present)
                }
                StageNext::Done(Ok(())) => {
                    counts.held += 1;
                    // Held: every layer is what its id names, and a layer the store had only
                    // through another renter's image was sent whole by this one.
                    for (i, l) in layers.iter().enumerate() {
                        if l.stored == LayerStored::Foreign && l.sent != l.claimed {
                            return Err(format!(
                                "a renter was given layer {i}, which it does not have"
                            ));
                        }
                    }
                    return Ok(());
                }
                StageNext::Done(Err(why)) => {
                    counts.refused += 1;
                    if why.contains("damaged") {
                        counts.damage_caught += 1;
                    }
                    if why.contains("is not the layer its diff id names") {
                        counts.lies_caught += 1;
                    }
                    return Ok(());
                }
            };
            trace.push(format!("  <- {input:?}"));
            step = check.handle(input);
        }
        Err("the staging never ended".to_string())
    })();
    result.map_err(|why| (why, trace))
}

#[cfg(not(feature = "broken-rule"))]
#[test]
fn a_staged_image_is_never_used_before_it_is_verified() {
    let (failures, counts) = crate::schedules::run_all(0..20_000, run);
    crate::schedules::none_failed("staging", 20000, &failures, &counts);
    assert!(
        counts.held > 0 && counts.lies_caught > 0 && counts.damage_caught > 0,
        "{counts:?}"
    );
}

/// With the `broken-rule` feature a layer known only through another renter's image is not
/// checked; the simulator must catch it.
#[cfg(feature = "broken-rule")]
#[test]
fn the_simulator_catches_a_host_that_takes_a_foreign_layer_unchecked() {
    let (failures, _) = crate::schedules::run_all(0..2000, run);
    assert!(
        failures
            .iter()
            .any(|(_, why, _)| why.starts_with("a renter was given layer")),
        "the unchecked layer went unnoticed in 2000 stagings"
    );
    println!(
        "the broken staging rule was caught in {} of 2000 stagings",
        failures.len()
    );
}

#[test]
fn a_staging_takes_only_the_layers_the_store_lacks_from_where_the_disk_left_off() {
    let spec = |n: u8| StageLayerSpec {
        diff_id: [n; 32],
        blake3: [n + 100; 32],
        bytes: 1000,
    };
    let (check, step) = StageCheck::new(
        [9; 32],
        vec![spec(1), spec(2), spec(3), spec(4)],
        &[
            (LayerStored::Yes, LayerOnDisk::Nothing),
            (LayerStored::Foreign, LayerOnDisk::Whole),
            (LayerStored::No, LayerOnDisk::Part(400)),
            (LayerStored::No, LayerOnDisk::Part(5000)),
        ],
    );
    assert_eq!(step.next, StageNext::Config);
    assert_eq!(check.loaded(), vec![1, 2, 3]);
    assert_eq!(check.needs(), vec![(2, 400), (3, 0)]);
    assert_eq!(check.incoming_bytes(), 600 + 1000);
}
