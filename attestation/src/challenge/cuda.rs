//! The challenge's CUDA kernels (`attestation/cuda/challenge.cu`), compiled to PTX ahead of
//! time by `scripts/ptx` (NVRTC from NVIDIA's PyPI wheels, pinned) and embedded here: what a
//! CUDA prover loads through the driver, which JIT-compiles it for the GPU it runs on, so a
//! host needs no CUDA toolkit. CI compiles the source again and checks the PTX is the same.
//!
//! The kernels generate `A` and `B` (transposed), compute the product on the tensor cores
//! (WMMA, `i8` summed in `i32`), fill memory a slice at a time, and hash rows, blocks and
//! Merkle levels (BLAKE3, `attestation/cuda/blake3.cuh`), each as the CPU code of
//! [`super::tensor`], [`super::fill`] and [`super::merkle`] defines them. [`super::gpu`]
//! launches them. The hashing is checked here on the CPU (compiled as C++); the kernels
//! have not yet run on a GPU (`scripts/gpu-check` is where they first will).

/// The CUDA C source.
pub const SOURCE: &str = include_str!("../../cuda/challenge.cu");

/// PTX by the compute capability it targets (a GPU of that capability or later loads it).
pub const PTX: [((u8, u8), &str); 3] = [
    ((7, 5), include_str!("../../cuda/challenge.sm_75.ptx")),
    ((8, 0), include_str!("../../cuda/challenge.sm_80.ptx")),
    ((9, 0), include_str!("../../cuda/challenge.sm_90.ptx")),
];

/// The kernels' BLAKE3 (`attestation/cuda/blake3.cuh`), included by [`SOURCE`].
pub const BLAKE3_SOURCE: &str = include_str!("../../cuda/blake3.cuh");

/// The kernels every PTX defines.
pub const KERNELS: [&str; 8] = [
    "gen_a",
    "gen_bt",
    "product",
    "fill_slice",
    "hash_row_chunks",
    "hash_rows",
    "hash_blocks",
    "merkle_level",
];

/// The derive-key context key of `context` as the kernels take it: eight little-endian
/// words.
pub fn context_key(context: &str) -> [u32; 8] {
    let key = blake3::hazmat::hash_derive_key_context(context);
    std::array::from_fn(|i| {
        u32::from_le_bytes([key[4 * i], key[4 * i + 1], key[4 * i + 2], key[4 * i + 3]])
    })
}

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

    /// The kernels' BLAKE3, compiled as C++ on this machine (`c++`) and run as the kernels
    /// run it (a chaining value per chunk, then the merge), hashes every length the
    /// challenge hashes (a 64-byte Merkle node, a 1 KiB fill block, rows of 256 bytes to
    /// 64 KiB, whole chunks or not) as the blake3 crate does, in each of its contexts.
    #[test]
    fn the_kernels_blake3_hashes_as_the_crate_does() {
        use super::super::{fill::BLOCK_CONTEXT, merkle::NODE_CONTEXT, tensor::ROW_CONTEXT};
        use std::io::Write;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cuda = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");
        let program = dir.path().join("blake3_check");
        let built = std::process::Command::new("c++")
            .args(["-O1", "-Wall", "-Werror", "-I", cuda])
            .arg(format!("{cuda}/blake3_check.cpp"))
            .arg("-o")
            .arg(&program)
            .status()
            .expect("c++ runs (scripts/test installs g++)");
        assert!(built.success(), "blake3_check.cpp compiles");
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let mut cases = Vec::new();
        let mut rng = 0x1234_5678_9abc_def0u64;
        for (i, len) in [
            64usize, 128, 256, 512, 1024, 1280, 2048, 3072, 8192, 32_768, 33_024, 65_536,
        ]
        .into_iter()
        .enumerate()
        {
            let context = [ROW_CONTEXT, BLOCK_CONTEXT, NODE_CONTEXT][i % 3];
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    rng = super::super::tensor::mix(rng.wrapping_add(0x9E37_79B9_7F4A_7C15));
                    rng as u8
                })
                .collect();
            let key: Vec<u8> = context_key(context)
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            let mut h = blake3::Hasher::new_derive_key(context);
            h.update(&data);
            cases.push((hex(&key), hex(&data), h.finalize().to_hex().to_string()));
        }
        let mut child = std::process::Command::new(&program)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("blake3_check runs");
        let mut input = String::new();
        for (key, data, _) in &cases {
            input.push_str(&format!("{key} {data}\n"));
        }
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("writes");
        let out = child.wait_with_output().expect("blake3_check ends");
        assert!(out.status.success());
        let answers: Vec<&str> = std::str::from_utf8(&out.stdout)
            .expect("hex")
            .lines()
            .collect();
        assert_eq!(answers.len(), cases.len());
        for ((_, data, want), got) in cases.iter().zip(answers) {
            assert_eq!(got, want, "{} bytes", data.len() / 2);
        }
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
