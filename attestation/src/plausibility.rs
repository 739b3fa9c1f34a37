//! Plausibility: does what NVML reported match what the model physically is?
//!
//! A host could pass an A40 off as an A100 by renaming it (a patched driver or a forged
//! attestation). The name alone proves nothing, but a model's memory size and compute
//! capability are physical: an "A100" with 48 GB and compute capability 8.6 is an A40.

use std::fmt;

use gpux_protocol::{ComputeCapability, GpuFacts, GpuFamily};

use crate::spec::{SPECS, spec_for_name, specs_of};

/// A contradiction between a GPU's reported facts and its claimed model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Implausible {
    /// The GPU's UUID, as text.
    pub uuid: String,
    /// The name it reported.
    pub name: String,
    /// What is wrong.
    pub reasons: Vec<String>,
    /// The model its memory and compute capability do fit, if one does.
    pub looks_like: Option<&'static str>,
}

impl fmt::Display for Implausible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} claims to be '{}' but {}",
            self.uuid,
            self.name,
            self.reasons.join(" and ")
        )?;
        if let Some(model) = self.looks_like {
            write!(f, "; its memory and compute capability match {model}")?;
        }
        Ok(())
    }
}

/// The verdict on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plausibility {
    /// The facts fit the claimed model.
    Plausible,
    /// The model is not in the spec table: nothing to check against.
    UnknownModel,
    /// The facts contradict the claimed model.
    Implausible(Implausible),
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Whether `bytes` of memory as NVML reports it fits a maker's `gb` figure: NVML shows a
/// little less than nominal (reserved memory, GiB vs GB); allow 88% to 102% of `gb` GiB.
fn memory_fits(bytes: u64, gb: u16) -> bool {
    let g = gib(bytes);
    g >= f64::from(gb) * 0.88 && g <= f64::from(gb) * 1.02
}

/// Checks one GPU's facts against the family and spec tables.
pub fn check_gpu(gpu: &GpuFacts) -> Plausibility {
    let family = GpuFamily::classify(&gpu.name);
    // Every family in the family table has a compute capability and the sizes it is sold
    // with, so even a family without spec rows (H800, A800) is checked.
    let Some(info) = family.info() else {
        return Plausibility::UnknownModel;
    };
    let expected_cc: ComputeCapability = info.compute_capability;
    let mut reasons = Vec::new();
    if gpu.compute_capability != expected_cc {
        reasons.push(format!(
            "reports compute capability {} where the {} has {}",
            gpu.compute_capability,
            family.key(),
            expected_cc
        ));
    }
    // Memory must fit the size the name states (`A100-SXM4-80GB`), else the named variant's,
    // else any size of the family. A stated size the family is not sold with (the GH200's
    // "480GB" counts CPU memory) is ignored.
    let mut family_sizes: Vec<u16> = info
        .nominal_vram_gb
        .iter()
        .copied()
        .chain(specs_of(family).map(|s| s.vram_gb))
        .collect();
    family_sizes.sort_unstable();
    family_sizes.dedup();
    let lower = gpu.name.to_ascii_lowercase();
    let stated = lower
        .split([' ', '-', '_'])
        .filter_map(|t| t.strip_suffix("gb")?.parse::<u16>().ok())
        .find(|gb| family_sizes.contains(gb));
    let sizes: Vec<u16> = match (stated, spec_for_name(&gpu.name)) {
        (Some(gb), _) => vec![gb],
        (None, Some(spec)) if !spec.variant.is_empty() => vec![spec.vram_gb],
        _ => family_sizes,
    };
    if !sizes
        .iter()
        .any(|&gb| memory_fits(gpu.memory_total_bytes, gb))
    {
        let sizes_text: Vec<String> = sizes.iter().map(|gb| format!("{gb} GB")).collect();
        reasons.push(format!(
            "has {:.1} GiB of memory where the model has {}",
            gib(gpu.memory_total_bytes),
            sizes_text.join(" or ")
        ));
    }
    if reasons.is_empty() {
        return Plausibility::Plausible;
    }
    let looks_like = SPECS
        .iter()
        .find(|s| {
            s.compute_capability == gpu.compute_capability
                && memory_fits(gpu.memory_total_bytes, s.vram_gb)
        })
        .map(|s| s.model);
    Plausibility::Implausible(Implausible {
        uuid: gpu.uuid.to_string(),
        name: gpu.name.to_string(),
        reasons,
        looks_like,
    })
}

#[cfg(test)]
mod tests {
    use gpux_protocol::BoundedVec;

    use super::*;

    fn gpu(name: &str, mib: u64, cc: (u8, u8)) -> GpuFacts {
        GpuFacts {
            mig: Some(gpux_protocol::MigFacts {
                enabled: false,
                instances: BoundedVec::empty(),
            }),
            ..gpux_testkit::gpu_facts(0, name, mib << 20, cc)
        }
    }

    #[test]
    fn genuine_gpus_are_plausible() {
        for (name, mib, cc) in [
            ("NVIDIA H100 80GB HBM3", 81_559, (9, 0)),
            ("NVIDIA H200", 143_771, (9, 0)),
            ("NVIDIA A100-SXM4-80GB", 81_920, (8, 0)),
            ("NVIDIA A100-SXM4-40GB", 40_960, (8, 0)),
            ("NVIDIA A40", 46_068, (8, 6)),
            ("NVIDIA A10G", 23_028, (8, 6)),
            ("NVIDIA L4", 23_034, (8, 9)),
            ("Tesla T4", 15_360, (7, 5)),
            ("NVIDIA GeForce RTX 4090", 24_564, (8, 9)),
        ] {
            assert_eq!(
                check_gpu(&gpu(name, mib, cc)),
                Plausibility::Plausible,
                "{name}"
            );
        }
        assert_eq!(
            check_gpu(&gpu("Mystery GPU", 1000, (1, 0))),
            Plausibility::UnknownModel
        );
    }

    #[test]
    fn an_a40_named_a100_is_caught() {
        let Plausibility::Implausible(why) =
            check_gpu(&gpu("NVIDIA A100-SXM4-80GB", 46_068, (8, 6)))
        else {
            panic!("not flagged");
        };
        let text = why.to_string();
        assert!(
            text.contains("compute capability 8.6 where the a100 has 8.0"),
            "{text}"
        );
        assert!(
            text.contains("45.0 GiB of memory where the model has 80 GB"),
            "{text}"
        );
        assert_eq!(why.looks_like, Some("NVIDIA A40"));
    }

    #[test]
    fn r009_family_sizes_and_families_without_spec_rows_are_checked() {
        // Sizes the family is sold with but the spec table does not list are plausible.
        for (name, mib, cc) in [
            ("NVIDIA GeForce RTX 3080", 12_288, (8, 6)),
            ("NVIDIA GeForce RTX 3080 Ti", 12_288, (8, 6)),
            ("NVIDIA GH200 144G HBM3e", 146_000, (9, 0)),
            ("NVIDIA B200", 196_608, (10, 0)),
            ("NVIDIA B200", 183_359, (10, 0)),
            ("NVIDIA H800", 81_559, (9, 0)),
        ] {
            assert_eq!(
                check_gpu(&gpu(name, mib, cc)),
                Plausibility::Plausible,
                "{name}"
            );
        }
        // An RTX 4090 calling itself an H800 (no spec row) is still caught.
        assert!(matches!(
            check_gpu(&gpu("NVIDIA H800", 24_564, (8, 9))),
            Plausibility::Implausible(_)
        ));
    }

    #[test]
    fn a_40gb_card_named_80gb_is_caught() {
        assert!(matches!(
            check_gpu(&gpu("NVIDIA A100-SXM4-80GB", 40_960, (8, 0))),
            Plausibility::Implausible(_)
        ));
        // The family default name with a 40 GB card is fine (it does not say 80 GB).
        assert_eq!(
            check_gpu(&gpu("NVIDIA A100-SXM4", 40_960, (8, 0))),
            Plausibility::Plausible
        );
    }
}
