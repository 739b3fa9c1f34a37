//! The GPU spec table: what each model physically is, from NVIDIA's datasheets (see
//! `docs/gpu-specs.md` for sources), and the reference throughput of the performance
//! challenge on it.

use gpux_protocol::{ComputeCapability, GpuFamily};

/// One model's datasheet figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSpec {
    /// The model, as NVML names it (one representative name).
    pub model: &'static str,
    /// Its family (the key shared with topics and queries).
    pub family: GpuFamily,
    /// Extra name tokens that tell this variant from others of the family (`pcie`, `sxm`,
    /// `nvl`); empty for the default variant.
    pub variant: &'static [&'static str],
    /// Memory, GB as printed by the maker.
    pub vram_gb: u16,
    /// Memory bandwidth, GB/s.
    pub bandwidth_gbs: u32,
    /// Peak FP64 (non-tensor), TFLOPS.
    pub fp64_tflops: f32,
    /// Peak FP32 (non-tensor), TFLOPS.
    pub fp32_tflops: f32,
    /// Peak FP16 tensor, dense (no sparsity), TFLOPS.
    pub fp16_tensor_tflops: f32,
    /// Peak INT8 tensor, dense (no sparsity), TOPS: what the challenge's product runs on.
    /// Volta has no INT8 tensor cores: its figure is four times its FP32 rate (DP4A).
    pub int8_tensor_tops: f32,
    /// Compute capability.
    pub compute_capability: ComputeCapability,
    /// What genuine hardware sustains on the gpux challenge (an INT8 matrix product),
    /// in giga-operations per second (`2mkn` operations per product). Estimated until
    /// measured on real hardware; see `docs/gpu-specs.md`.
    pub challenge_gops: f64,
}

const fn cc(major: u8, minor: u8) -> ComputeCapability {
    ComputeCapability::new(major, minor)
}

/// Share of the dense INT8 tensor peak the challenge is expected to sustain on a GPU: a
/// plain tensor-core kernel (not a vendor library's tuned one), with the row hashing after
/// each tile. Replaced by measurements as real hardware becomes available.
pub const CHALLENGE_SHARE_OF_INT8: f64 = 0.5;

/// Share of the memory bandwidth the challenge's memory fill is expected to sustain (it
/// reads one random block and writes one per step, and hashes every block). An estimate
/// until measured on real hardware.
pub const FILL_SHARE_OF_BANDWIDTH: f64 = 0.5;
/// Share of the claimed memory the challenge fills (the rest is the prover's own: the
/// product, the driver's context).
pub const FILL_SHARE_OF_MEMORY: f64 = 0.9;

impl GpuSpec {
    /// The reference bandwidth of the challenge's memory fill, GB/s.
    pub fn fill_gbs(&self) -> f64 {
        f64::from(self.bandwidth_gbs) * FILL_SHARE_OF_BANDWIDTH
    }
}

/// Fake GPUs (the fake NVML driver's, for tests and the testnet) prove on the CPU and answer
/// at their model's rates scaled down by these: the product at `challenge_gops` times
/// [`FAKE_TENSOR_SCALE`] (an A100: 0.62 Gop/s, within any CPU's reach), the fill at
/// `fill_gbs` times [`FAKE_BANDWIDTH_SCALE`] (an A100: 0.1 GB/s) over [`FAKE_MEMORY_SCALE`]
/// of the claimed memory (an A100 80GB: 36 MB). A fake GPU is then as fast as its model,
/// scaled, however busy the machine is (unless the CPU cannot keep up at all), so a renter
/// can judge it as it judges real GPUs.
pub const FAKE_TENSOR_SCALE: f64 = 2e-6;
/// See [`FAKE_TENSOR_SCALE`].
pub const FAKE_BANDWIDTH_SCALE: f64 = 1e-4;
/// See [`FAKE_TENSOR_SCALE`].
pub const FAKE_MEMORY_SCALE: f64 = 5e-4;

/// What a GPU really is against what it claims to be: the ratio of each measure the
/// challenge takes (the fake driver's disguises answer with these).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Disguise {
    /// Real memory over claimed.
    pub memory: f64,
    /// Real INT8 tensor throughput over claimed.
    pub tensor: f64,
    /// Real memory bandwidth over claimed.
    pub bandwidth: f64,
}

impl Disguise {
    /// `real` sold as `claimed`.
    pub fn of(real: &GpuSpec, claimed: &GpuSpec) -> Disguise {
        Disguise {
            memory: f64::from(real.vram_gb) / f64::from(claimed.vram_gb),
            tensor: real.challenge_gops / claimed.challenge_gops,
            bandwidth: f64::from(real.bandwidth_gbs) / f64::from(claimed.bandwidth_gbs),
        }
    }
}

macro_rules! specs {
    ($( $model:literal, $family:ident, [$($v:literal),*], $gb:literal, $bw:literal, $fp64:literal, $fp32:literal, $fp16:literal, $int8:literal, ($maj:literal, $min:literal); )+) => {
        /// The spec table (more specific variants of a family first).
        pub const SPECS: &[GpuSpec] = &[
            $(GpuSpec {
                model: $model,
                family: GpuFamily::$family,
                variant: &[$($v),*],
                vram_gb: $gb,
                bandwidth_gbs: $bw,
                fp64_tflops: $fp64,
                fp32_tflops: $fp32,
                fp16_tensor_tflops: $fp16,
                int8_tensor_tops: $int8,
                compute_capability: cc($maj, $min),
                challenge_gops: $int8 * 1000.0 * CHALLENGE_SHARE_OF_INT8,
            },)+
        ];
    };
}

specs! {
    "NVIDIA B200", B200, [], 180, 8000, 37.0, 75.0, 2250.0, 4500.0, (10, 0);
    "NVIDIA GH200 480GB", Gh200, [], 96, 4000, 34.0, 67.0, 989.0, 1979.0, (9, 0);
    "NVIDIA H200", H200, [], 141, 4800, 34.0, 67.0, 989.0, 1979.0, (9, 0);
    "NVIDIA H100 NVL", H100, ["nvl"], 94, 3900, 30.0, 60.0, 835.0, 1671.0, (9, 0);
    "NVIDIA H100 PCIe", H100, ["pcie"], 80, 2000, 26.0, 51.0, 756.0, 1513.0, (9, 0);
    "NVIDIA H100 80GB HBM3", H100, [], 80, 3350, 34.0, 67.0, 989.0, 1979.0, (9, 0);
    "NVIDIA A100-PCIE-40GB", A100, ["pcie", "40gb"], 40, 1555, 9.7, 19.5, 312.0, 624.0, (8, 0);
    "NVIDIA A100 80GB PCIe", A100, ["pcie"], 80, 1935, 9.7, 19.5, 312.0, 624.0, (8, 0);
    "NVIDIA A100-SXM4-40GB", A100, ["40gb"], 40, 1555, 9.7, 19.5, 312.0, 624.0, (8, 0);
    "NVIDIA A100-SXM4-80GB", A100, [], 80, 2039, 9.7, 19.5, 312.0, 624.0, (8, 0);
    "NVIDIA A40", A40, [], 48, 696, 0.58, 37.4, 149.7, 299.3, (8, 6);
    "NVIDIA A30", A30, [], 24, 933, 5.2, 10.3, 165.0, 330.0, (8, 0);
    "NVIDIA A10", A10, [], 24, 600, 0.98, 31.2, 125.0, 250.0, (8, 6);
    "NVIDIA L40S", L40s, [], 48, 864, 1.4, 91.6, 362.0, 733.0, (8, 9);
    "NVIDIA L40", L40, [], 48, 864, 1.4, 90.5, 181.0, 362.0, (8, 9);
    "NVIDIA L4", L4, [], 24, 300, 0.47, 30.3, 121.0, 242.5, (8, 9);
    "Tesla T4", T4, [], 16, 320, 0.25, 8.1, 65.0, 130.0, (7, 5);
    "Tesla V100-PCIE-16GB", V100, ["pcie"], 16, 900, 7.0, 14.0, 112.0, 56.0, (7, 0);
    "Tesla V100-SXM2-32GB", V100, [], 32, 900, 7.8, 15.7, 125.0, 62.8, (7, 0);
    "NVIDIA RTX A6000", RtxA6000, [], 48, 768, 1.2, 38.7, 154.8, 309.7, (8, 6);
    "NVIDIA RTX 6000 Ada Generation", Rtx6000Ada, [], 48, 960, 1.4, 91.1, 364.2, 728.5, (8, 9);
    "NVIDIA GeForce RTX 5090", Rtx5090, [], 32, 1792, 1.6, 104.8, 209.5, 838.0, (12, 0);
    "NVIDIA GeForce RTX 4090", Rtx4090, [], 24, 1008, 1.3, 82.6, 165.2, 660.6, (8, 9);
    "NVIDIA GeForce RTX 4080", Rtx4080, [], 16, 717, 0.76, 48.7, 97.5, 389.9, (8, 9);
    "NVIDIA GeForce RTX 3090", Rtx3090, [], 24, 936, 0.56, 35.6, 71.0, 284.0, (8, 6);
    "NVIDIA GeForce RTX 3080", Rtx3080, [], 10, 760, 0.47, 29.8, 59.5, 238.0, (8, 6);
}

/// The spec of a model as NVML names it: the family's row whose variant tokens all appear in
/// the name (the most specific such row), or `None` for a model the table does not know.
pub fn spec_for_name(nvml_name: &str) -> Option<&'static GpuSpec> {
    let family = GpuFamily::classify(nvml_name);
    let lower = nvml_name.to_ascii_lowercase();
    let tokens: Vec<&str> = lower
        .split([' ', '-', '_'])
        .filter(|t| !t.is_empty())
        .collect();
    SPECS
        .iter()
        .filter(|s| s.family == family && s.variant.iter().all(|v| tokens.contains(v)))
        .max_by_key(|s| s.variant.len())
}

/// Every row of a family.
pub fn specs_of(family: GpuFamily) -> impl Iterator<Item = &'static GpuSpec> {
    SPECS.iter().filter(move |s| s.family == family)
}

/// The challenge references (product Gop/s, fill GB/s) a GPU of `family` with `vram_gb`
/// of memory is held to: an offer names its family and memory, not its variant (an H100
/// 80GB may be the SXM or the PCIe card), so the slowest variant with that memory sets each
/// (an honest PCIe card passes; a card of another memory size is not judged by it). `None`
/// memory, or none matching: the family's slowest variant.
pub fn references(family: GpuFamily, vram_gb: Option<u16>) -> Option<(f64, f64)> {
    let matching = |s: &&GpuSpec| vram_gb.is_none_or(|gb| s.vram_gb == gb);
    let rows: Vec<&GpuSpec> = match specs_of(family).filter(matching).count() {
        0 => specs_of(family).collect(),
        _ => specs_of(family).filter(matching).collect(),
    };
    let gops = rows.iter().map(|s| s.challenge_gops).reduce(f64::min)?;
    let gbs = rows.iter().map(|s| s.fill_gbs()).reduce(f64::min)?;
    Some((gops, gbs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_covers_the_required_models() {
        assert!(SPECS.len() >= 20);
        for name in [
            "NVIDIA H200",
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 PCIe",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100-PCIE-40GB",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA A40",
            "NVIDIA A10",
            "NVIDIA L40S",
            "NVIDIA L4",
            "Tesla T4",
            "Tesla V100-SXM2-32GB",
            "NVIDIA GeForce RTX 4090",
            "NVIDIA GeForce RTX 3090",
            "NVIDIA RTX 6000 Ada Generation",
            "NVIDIA B200",
        ] {
            let spec = spec_for_name(name).unwrap_or_else(|| panic!("{name} not in the table"));
            assert_eq!(spec.family, GpuFamily::classify(name), "{name}");
        }
    }

    /// An offer says family and memory: the references are the slowest variant's with that
    /// memory, never another memory size's (an 80GB A100 is not held to the 40GB card's
    /// bandwidth, nor an H100 80GB to the 94 GB NVL's).
    #[test]
    fn references_follow_the_offer_s_memory() {
        let (gops, gbs) = references(GpuFamily::A100, Some(80)).unwrap();
        assert_eq!(gbs, 1935.0 * FILL_SHARE_OF_BANDWIDTH);
        assert_eq!(gops, 624.0 * 1000.0 * CHALLENGE_SHARE_OF_INT8);
        let (_, gbs) = references(GpuFamily::A100, Some(40)).unwrap();
        assert_eq!(gbs, 1555.0 * FILL_SHARE_OF_BANDWIDTH);
        let (gops, gbs) = references(GpuFamily::H100, Some(80)).unwrap();
        assert_eq!(gbs, 2000.0 * FILL_SHARE_OF_BANDWIDTH);
        assert_eq!(gops, 1513.0 * 1000.0 * CHALLENGE_SHARE_OF_INT8);
        let (_, gbs) = references(GpuFamily::H100, Some(94)).unwrap();
        assert_eq!(gbs, 3900.0 * FILL_SHARE_OF_BANDWIDTH);
        // The L40S sold as an H100 80GB still falls short on both rates.
        let l40s = spec_for_name("NVIDIA L40S").unwrap();
        assert!(l40s.challenge_gops < 0.9 * references(GpuFamily::H100, Some(80)).unwrap().0);
        assert!(l40s.fill_gbs() < 0.9 * gbs);
        assert!(references(GpuFamily::A100, Some(12)).is_some());
    }

    #[test]
    fn variants_are_told_apart() {
        assert_eq!(
            spec_for_name("NVIDIA H100 PCIe").unwrap().bandwidth_gbs,
            2000
        );
        assert_eq!(
            spec_for_name("NVIDIA H100 80GB HBM3")
                .unwrap()
                .bandwidth_gbs,
            3350
        );
        assert_eq!(spec_for_name("NVIDIA A100-PCIE-40GB").unwrap().vram_gb, 40);
        assert_eq!(spec_for_name("NVIDIA A100-SXM4-80GB").unwrap().vram_gb, 80);
        assert!(spec_for_name("NVIDIA GeForce GTX 1080").is_none());
    }

    #[test]
    fn family_table_and_spec_table_agree() {
        for s in SPECS {
            let info = s.family.info().unwrap();
            assert_eq!(info.compute_capability, s.compute_capability, "{}", s.model);
            assert!(
                info.nominal_vram_gb.contains(&s.vram_gb),
                "{}: {} GB",
                s.model,
                s.vram_gb
            );
            assert!(s.challenge_gops > 0.0);
            assert!(
                f64::from(s.int8_tensor_tops) > 2.0 * f64::from(s.fp32_tflops),
                "{}",
                s.model
            );
        }
    }

    /// What docs/gpu-specs.md shows from the table: the measures of a disguised GPU
    /// against the model it claims, each below the 90% a challenge passes at.
    #[test]
    fn a_disguise_falls_short_on_the_measures_that_tell_models_apart() {
        let shares = |real: &str, claimed: &str| {
            let (r, c) = (
                spec_for_name(real).unwrap(),
                spec_for_name(claimed).unwrap(),
            );
            [
                r.challenge_gops / c.challenge_gops,
                f64::from(r.bandwidth_gbs) / f64::from(c.bandwidth_gbs),
                f64::from(r.vram_gb) / f64::from(c.vram_gb),
            ]
        };
        let short = |s: [f64; 3]| s.iter().filter(|&&x| x < 0.9).count();
        let a40 = shares("NVIDIA A40", "NVIDIA A100-SXM4-80GB");
        assert_eq!(short(a40), 3, "{a40:?}");
        assert_eq!(short(shares("NVIDIA A40", "NVIDIA A100 80GB PCIe")), 3);
        for h100 in ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"] {
            assert!(short(shares("NVIDIA L40S", h100)) >= 2, "{h100}");
        }
        // The old reference (from FP32 peaks) put an A40 above an A100; INT8 does not.
        let (a40, a100) = (
            spec_for_name("NVIDIA A40").unwrap(),
            spec_for_name("NVIDIA A100-SXM4-80GB").unwrap(),
        );
        assert!(
            a40.fp32_tflops > a100.fp32_tflops && a40.challenge_gops < 0.5 * a100.challenge_gops
        );
    }
}
