//! The fake GPUs the testnet's hosts pretend to have (the fake NVML driver's
//! configuration, one file per host).

use std::path::Path;

/// GPU models the fake hosts pretend to have: (NVML name, memory bytes, cc, base price).
pub(crate) const MODELS: [(&str, u64, (u8, u8), &str); 5] = [
    ("NVIDIA H100 80GB HBM3", 85_520_809_984, (9, 0), "2.40"),
    ("NVIDIA A100-SXM4-40GB", 42_505_273_344, (8, 0), "1.30"),
    ("NVIDIA L4", 24_152_899_584, (8, 9), "0.45"),
    ("NVIDIA GeForce RTX 4090", 25_757_220_864, (8, 9), "0.40"),
    ("NVIDIA A40", 48_305_799_168, (8, 6), "0.70"),
];

/// The family key of one of the [`MODELS`].
pub(crate) fn family_of(model: &str) -> &'static str {
    gpux_protocol::GpuFamily::classify(model).key()
}

/// The fake driver's configuration of host `h`: `1 + h % 4` GPUs of `MODELS[h % 5]`
/// (an A100 host's first with MIG on, two 1g.5gb slices; the H100s disguised L40S), its
/// faults read from `faults`.
pub(crate) fn host_gpus(h: usize, faults: &Path) -> String {
    let (model, memory, cc, _) = MODELS[h % MODELS.len()];
    let count = 1 + h % 4;
    let mut toml = format!("faults = \"{}\"\n\n", faults.display());
    for g in 0..count {
        toml.push_str(&format!(
            "[[gpu]]\nname = \"{model}\"\nuuid = \"GPU-{h:08x}-0000-4000-8000-{g:012x}\"\nmemory_total_bytes = {memory}\ncompute_capability = [{}, {}]\nutilization_gpu = 87\n",
            cc.0, cc.1
        ));
        // The H100s are disguised L40S (48 GB): their challenge fills only what an
        // L40S holds, and fails on memory however busy the machine is.
        if model.contains("H100") {
            toml.push_str("really = \"NVIDIA L40S\"\n");
        }
        // An A100 host's first GPU runs MIG: two 1g.5gb slices, offered apart.
        if g == 0 && model.contains("A100") {
            toml.push_str("mig_enabled = true\nmig = [\n");
            for s in 1..=2 {
                toml.push_str(&format!(
                    "  {{ uuid = \"MIG-{h:08x}-0001-4000-8000-{s:012x}\", profile = \"1g.5gb\", memory_total_bytes = 5100273664 }},\n"
                ));
            }
            toml.push_str("]\n");
        }
        toml.push('\n');
    }
    toml
}
