//! The GPU family table: one short key per family of GPU models (`h100`, `a100`, `rtx4090`,
//! ..., `other`). The same keys name offer topics (`gpux/offers/1/<family>`), serve as query
//! aliases (`gpu=H100`) and key the attestation spec table.
//!
//! It also fixes what `vram` means in queries: the GB figure makers print. An H100 80GB has
//! `vram=80` although NVML reports 79.6 GiB. For a known family the nominal size is the one of
//! the family's sizes nearest to the reported GiB (within 10%); otherwise it is
//! bytes / 10^9, rounded.

use std::fmt;
use std::str::FromStr;

use crate::types::{ComputeCapability, ParseError, serde_via_str};

/// One row of the family table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyInfo {
    /// The family.
    pub family: GpuFamily,
    /// Its key (`h100`), lower case.
    pub key: &'static str,
    /// Other names a query may use for it (`a10g` for `a10`).
    pub aliases: &'static [&'static str],
    /// NVML name patterns: after lower-casing, splitting on spaces, dashes and underscores,
    /// and dropping vendor words (`nvidia`, `geforce`, `tesla`, `quadro`), the name starts
    /// with one of these token sequences (the longest match wins).
    pub patterns: &'static [&'static [&'static str]],
    /// The memory sizes the family is sold with, in GB as printed by the maker.
    pub nominal_vram_gb: &'static [u16],
    /// The compute capability of the family.
    pub compute_capability: ComputeCapability,
}

macro_rules! families {
    ($( $variant:ident => $key:literal, aliases [$($alias:literal),*], patterns [$([$($tok:literal),+]),+], vram [$($gb:literal),+], cc ($maj:literal, $min:literal); )+) => {
        /// A family of GPU models. See the [module docs](self).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[non_exhaustive]
        pub enum GpuFamily {
            $(
                #[doc = concat!("`", $key, "`")]
                $variant,
            )+
            /// Any model not in the table.
            Other,
        }

        /// The family table, most specific patterns first within each row.
        pub const FAMILIES: &[FamilyInfo] = &[
            $(FamilyInfo {
                family: GpuFamily::$variant,
                key: $key,
                aliases: &[$($alias),*],
                patterns: &[$(&[$($tok),+]),+],
                nominal_vram_gb: &[$($gb),+],
                compute_capability: ComputeCapability::new($maj, $min),
            },)+
        ];
    };
}

families! {
    B200 => "b200", aliases [], patterns [["b200"]], vram [180, 192], cc (10, 0);
    Gh200 => "gh200", aliases [], patterns [["gh200"]], vram [96, 144], cc (9, 0);
    H200 => "h200", aliases [], patterns [["h200"]], vram [141], cc (9, 0);
    H100 => "h100", aliases [], patterns [["h100"]], vram [80, 94, 96], cc (9, 0);
    H800 => "h800", aliases [], patterns [["h800"]], vram [80], cc (9, 0);
    A100 => "a100", aliases [], patterns [["a100"]], vram [40, 80], cc (8, 0);
    A800 => "a800", aliases [], patterns [["a800"]], vram [40, 80], cc (8, 0);
    A40 => "a40", aliases [], patterns [["a40"]], vram [48], cc (8, 6);
    A30 => "a30", aliases [], patterns [["a30"]], vram [24], cc (8, 0);
    A10 => "a10", aliases ["a10g"], patterns [["a10"], ["a10g"]], vram [24], cc (8, 6);
    L40s => "l40s", aliases [], patterns [["l40s"]], vram [48], cc (8, 9);
    L40 => "l40", aliases [], patterns [["l40"]], vram [48], cc (8, 9);
    L4 => "l4", aliases [], patterns [["l4"]], vram [24], cc (8, 9);
    T4 => "t4", aliases [], patterns [["t4"]], vram [16], cc (7, 5);
    V100 => "v100", aliases [], patterns [["v100"], ["v100s"]], vram [16, 32], cc (7, 0);
    RtxA6000 => "rtxa6000", aliases ["a6000"], patterns [["rtx", "a6000"]], vram [48], cc (8, 6);
    Rtx6000Ada => "rtx6000ada", aliases ["rtx6000"], patterns [["rtx", "6000", "ada"]], vram [48], cc (8, 9);
    Rtx5090 => "rtx5090", aliases ["5090"], patterns [["rtx", "5090"]], vram [32], cc (12, 0);
    Rtx4090 => "rtx4090", aliases ["4090"], patterns [["rtx", "4090"]], vram [24], cc (8, 9);
    Rtx4080 => "rtx4080", aliases ["4080"], patterns [["rtx", "4080"], ["rtx", "4080", "super"]], vram [16], cc (8, 9);
    Rtx3090 => "rtx3090", aliases ["3090"], patterns [["rtx", "3090"], ["rtx", "3090", "ti"]], vram [24], cc (8, 6);
    Rtx3080 => "rtx3080", aliases ["3080"], patterns [["rtx", "3080"]], vram [10, 12], cc (8, 6);
}

/// The key of [`GpuFamily::Other`].
pub const OTHER_KEY: &str = "other";

/// Words that carry no model information in NVML names.
const VENDOR_WORDS: &[&str] = &["nvidia", "geforce", "tesla", "quadro"];

impl GpuFamily {
    /// The table row, or `None` for [`GpuFamily::Other`].
    pub fn info(self) -> Option<&'static FamilyInfo> {
        FAMILIES.iter().find(|f| f.family == self)
    }

    /// The family's key (`h100`; `other` for unknown models).
    pub fn key(self) -> &'static str {
        self.info().map_or(OTHER_KEY, |i| i.key)
    }

    /// Every family with a table row, then `Other`.
    pub fn all() -> impl Iterator<Item = GpuFamily> {
        FAMILIES
            .iter()
            .map(|f| f.family)
            .chain(std::iter::once(GpuFamily::Other))
    }

    /// Looks a family up by key or alias, case-insensitively (`H100`, `a10g`, `RTX4090`).
    /// Also accepts a full NVML model name (`NVIDIA H100 80GB HBM3`).
    pub fn lookup(name: &str) -> Option<GpuFamily> {
        let lower = name.trim().to_ascii_lowercase();
        if lower == OTHER_KEY {
            return Some(GpuFamily::Other);
        }
        let compact: String = lower
            .chars()
            .filter(|c| !matches!(c, ' ' | '-' | '_'))
            .collect();
        FAMILIES
            .iter()
            .find(|f| f.key == compact || f.aliases.contains(&compact.as_str()))
            .map(|f| f.family)
            .or_else(|| match Self::classify(name) {
                GpuFamily::Other => None,
                family => Some(family),
            })
    }

    /// The family of a model as NVML names it (`NVIDIA A100-SXM4-80GB` is `a100`,
    /// `NVIDIA GeForce RTX 4090` is `rtx4090`); `Other` when no pattern matches.
    pub fn classify(nvml_name: &str) -> GpuFamily {
        let lower = nvml_name.to_ascii_lowercase();
        let tokens: Vec<&str> = lower
            .split([' ', '-', '_'])
            .filter(|t| !t.is_empty() && !VENDOR_WORDS.contains(t))
            .collect();
        let mut best: Option<(usize, GpuFamily)> = None;
        for info in FAMILIES {
            for pattern in info.patterns {
                let matches = tokens.len() >= pattern.len()
                    && pattern.iter().zip(&tokens).all(|(p, t)| p == t);
                if matches && best.is_none_or(|(len, _)| pattern.len() > len) {
                    best = Some((pattern.len(), info.family));
                }
            }
        }
        best.map_or(GpuFamily::Other, |(_, f)| f)
    }

    /// How many compute slices a GPU of this family cuts into under MIG (7 for A100 and
    /// the Hopper and Blackwell data-centre parts, 4 for the A30); `None` for families
    /// without MIG. A MIG instance's share of the GPU is its profile's slices over this.
    pub fn mig_compute_slices(self) -> Option<u32> {
        match self {
            GpuFamily::B200
            | GpuFamily::Gh200
            | GpuFamily::H200
            | GpuFamily::H100
            | GpuFamily::H800
            | GpuFamily::A100
            | GpuFamily::A800 => Some(7),
            GpuFamily::A30 => Some(4),
            _ => None,
        }
    }

    /// A MIG instance's share of a GPU of this family, as (its compute slices, the GPU's):
    /// `1g.10gb` on an A100 is (1, 7). A family the table gives no MIG slices counts 7
    /// (every MIG part so far has 7 or 4). `None` when the profile names no slices.
    pub fn mig_share(self, profile: &str) -> Option<(u32, u32)> {
        let of = self.mig_compute_slices().unwrap_or(7);
        let n = crate::mig_compute_slices(profile)?.min(of);
        Some((n, of))
    }

    /// The GB figure a maker prints for a GPU of this family reporting `memory_bytes`
    /// (see the [module docs](self)).
    pub fn nominal_vram_gb(self, memory_bytes: u64) -> u16 {
        let gib = memory_bytes as f64 / (1u64 << 30) as f64;
        let nearest = self.info().and_then(|info| {
            info.nominal_vram_gb
                .iter()
                .copied()
                .map(|gb| (gb, (f64::from(gb) - gib).abs() / f64::from(gb)))
                .filter(|&(_, rel)| rel <= 0.10)
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(gb, _)| gb)
        });
        nearest.unwrap_or_else(|| {
            let gb = (memory_bytes + 500_000_000) / 1_000_000_000;
            u16::try_from(gb).unwrap_or(u16::MAX)
        })
    }

    /// The offer topic of this family.
    pub fn offer_topic(self) -> String {
        format!("gpux/offers/1/{}", self.key())
    }
}

impl fmt::Display for GpuFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

impl FromStr for GpuFamily {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        Self::lookup(s)
            .ok_or_else(|| ParseError::new("GPU family", s, "not in the GPU family table"))
    }
}
serde_via_str!(GpuFamily);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_real_nvml_names() {
        let cases = [
            ("NVIDIA H100 80GB HBM3", GpuFamily::H100),
            ("NVIDIA H100 PCIe", GpuFamily::H100),
            ("NVIDIA H100 NVL", GpuFamily::H100),
            ("NVIDIA H200", GpuFamily::H200),
            ("NVIDIA GH200 480GB", GpuFamily::Gh200),
            ("NVIDIA A100-SXM4-80GB", GpuFamily::A100),
            ("NVIDIA A100-PCIE-40GB", GpuFamily::A100),
            ("NVIDIA A40", GpuFamily::A40),
            ("NVIDIA A10", GpuFamily::A10),
            ("NVIDIA A10G", GpuFamily::A10),
            ("NVIDIA L40S", GpuFamily::L40s),
            ("NVIDIA L40", GpuFamily::L40),
            ("NVIDIA L4", GpuFamily::L4),
            ("Tesla T4", GpuFamily::T4),
            ("Tesla V100-SXM2-32GB", GpuFamily::V100),
            ("NVIDIA GeForce RTX 4090", GpuFamily::Rtx4090),
            ("NVIDIA GeForce RTX 3090", GpuFamily::Rtx3090),
            ("NVIDIA RTX 6000 Ada Generation", GpuFamily::Rtx6000Ada),
            ("NVIDIA RTX A6000", GpuFamily::RtxA6000),
            ("NVIDIA B200", GpuFamily::B200),
            ("NVIDIA GeForce GTX 1080", GpuFamily::Other),
            ("", GpuFamily::Other),
        ];
        for (name, family) in cases {
            assert_eq!(GpuFamily::classify(name), family, "{name}");
        }
    }

    #[test]
    fn looks_up_keys_aliases_and_names() {
        assert_eq!(GpuFamily::lookup("H100"), Some(GpuFamily::H100));
        assert_eq!(GpuFamily::lookup("a10g"), Some(GpuFamily::A10));
        assert_eq!(GpuFamily::lookup("RTX 4090"), Some(GpuFamily::Rtx4090));
        assert_eq!(
            GpuFamily::lookup("NVIDIA H100 80GB HBM3"),
            Some(GpuFamily::H100)
        );
        assert_eq!(GpuFamily::lookup("other"), Some(GpuFamily::Other));
        assert_eq!(GpuFamily::lookup("h1000"), None);
        for f in GpuFamily::all() {
            assert_eq!(GpuFamily::lookup(f.key()), Some(f));
        }
    }

    #[test]
    fn keys_are_unique_topic_safe_and_few() {
        let keys: Vec<&str> = GpuFamily::all().map(GpuFamily::key).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len());
        assert!(keys.iter().all(|k| {
            k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        }));
        // A renter subscribing to every family stays under gossipsub's default of 100 topics.
        assert!(keys.len() < 60);
    }

    #[test]
    fn nominal_vram_is_the_makers_figure() {
        const MIB: u64 = 1 << 20;
        assert_eq!(GpuFamily::H100.nominal_vram_gb(81_559 * MIB), 80);
        assert_eq!(GpuFamily::H200.nominal_vram_gb(143_771 * MIB), 141);
        assert_eq!(GpuFamily::A100.nominal_vram_gb(40_960 * MIB), 40);
        assert_eq!(GpuFamily::A100.nominal_vram_gb(81_920 * MIB), 80);
        assert_eq!(GpuFamily::A40.nominal_vram_gb(46_068 * MIB), 48);
        assert_eq!(GpuFamily::A10.nominal_vram_gb(23_028 * MIB), 24);
        assert_eq!(GpuFamily::T4.nominal_vram_gb(15_360 * MIB), 16);
        // An "A100" with 48 GB is not a size the family comes in: the raw figure is kept.
        assert_eq!(GpuFamily::A100.nominal_vram_gb(46_068 * MIB), 48);
        assert_eq!(GpuFamily::Other.nominal_vram_gb(12_000_000_000), 12);
    }
}
