//! The challenge's CUDA kernels (`attestation/cuda/challenge.cu`), compiled to PTX ahead of
//! time by `scripts/ptx` (NVRTC from NVIDIA's PyPI wheels, pinned) and embedded here: what a
//! CUDA prover loads through the driver, which JIT-compiles it for the GPU it runs on, so a
//! host needs no CUDA toolkit. CI compiles the source again and checks the PTX is the same.
//!
//! The kernels generate `A` and `B` (transposed), compute the product on the tensor cores
//! (WMMA, `i8` summed in `i32`) and fill memory a slice at a time, each as the CPU code of
//! [`super::tensor`] and [`super::fill`] defines them. The prover that launches them (the
//! driver API through a crate such as cudarc, the rows and blocks hashed and committed as
//! the CPU prover does) is not built yet, and the kernels have not run on a GPU.

/// The CUDA C source.
pub const SOURCE: &str = include_str!("../../cuda/challenge.cu");

/// PTX by the compute capability it targets (a GPU of that capability or later loads it).
pub const PTX: [((u8, u8), &str); 3] = [
    ((7, 5), include_str!("../../cuda/challenge.sm_75.ptx")),
    ((8, 0), include_str!("../../cuda/challenge.sm_80.ptx")),
    ((9, 0), include_str!("../../cuda/challenge.sm_90.ptx")),
];

/// The kernels every PTX defines.
pub const KERNELS: [&str; 4] = ["gen_a", "gen_bt", "product", "fill_slice"];

/// The PTX for a GPU of compute capability `cc`: the newest target at or below it (`None`
/// below 7.5: Volta and older have no INT8 tensor cores).
pub fn ptx_for(cc: (u8, u8)) -> Option<&'static str> {
    PTX.iter()
        .filter(|(target, _)| *target <= cc)
        .max_by_key(|(target, _)| *target)
        .map(|(_, ptx)| *ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ptx_targets_its_capability_and_defines_every_kernel() {
        for ((major, minor), ptx) in PTX {
            assert!(
                ptx.contains(&format!(".target sm_{major}{minor}")),
                "sm_{major}{minor}"
            );
            assert!(
                ptx.contains(".version 8.2"),
                "PTX ISA 8.2 loads on drivers from R535"
            );
            for kernel in KERNELS {
                assert!(
                    ptx.contains(&format!(".entry {kernel}(")),
                    "sm_{major}{minor}: {kernel}"
                );
            }
        }
        assert!(
            PTX[1]
                .1
                .contains("wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.s8.s32")
        );
        assert_eq!(ptx_for((7, 0)), None);
        assert_eq!(ptx_for((8, 6)), Some(PTX[1].1));
        assert_eq!(ptx_for((10, 0)), Some(PTX[2].1));
    }

    /// The CUDA source states the same constants as the CPU code (a change to one without
    /// the other fails here; the kernels' logic is checked on a GPU by scripts/gpu-check).
    #[test]
    fn the_source_uses_the_cpu_definitions_constants() {
        let hex = |x: u64| format!("0x{x:X}ULL");
        for constant in [
            hex(0x9E37_79B9_7F4A_7C15),
            hex(0xBF58_476D_1CE4_E5B9),
            hex(0x94D0_49BB_1331_11EB),
        ] {
            assert!(SOURCE.contains(&constant), "{constant}");
        }
        assert!(SOURCE.contains(&format!("#define SLICES {}", super::super::fill::SLICES)));
        assert!(SOURCE.contains(&format!(
            "#define BLOCK_WORDS {}",
            super::super::fill::BLOCK_WORDS
        )));
        assert!(SOURCE.contains("rotl(partner[s], 7 + 8 * round)"));
    }
}
